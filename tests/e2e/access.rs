//! Least privilege: the subscriber access policy (clusters, types, redaction, refusals,
//! hot reload failing closed), sessions per subscriber identity, and deny-list entries
//! as openssl prints them, noticed by content.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_certs::TlsFiles;
use fleetwatch_client::transport::{ClientWs, connect};
use fleetwatch_protocol::codec::{Limits, decode_hub_to_subscriber};
use fleetwatch_protocol::message::{ErrorCode, HubToSubscriber};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

async fn raw(files: &TlsFiles, port: u16) -> ClientWs {
    let tls = Arc::new(fleetwatch_certs::client_config(files).unwrap());
    let url = format!("wss://127.0.0.1:{port}").parse().unwrap();
    connect(&url, tls, &Limits { max_message_bytes: 64 << 20, ..Limits::default() }, Duration::from_secs(10))
        .await
        .unwrap()
}

/// What the hub sent next to a subscriber.
#[derive(Debug)]
enum Got {
    Msg(Box<HubToSubscriber>),
    Closed(String),
}

async fn next(ws: &mut ClientWs, timeout: Duration) -> Got {
    loop {
        match tokio::time::timeout(timeout, ws.next()).await {
            Err(_) => return Got::Closed("timeout".into()),
            Ok(Some(Ok(Message::Text(t)))) => {
                return Got::Msg(Box::new(decode_hub_to_subscriber(t.as_bytes(), &Limits::default()).unwrap()));
            }
            Ok(Some(Ok(Message::Close(f)))) => return Got::Closed(format!("close {f:?}")),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Got::Closed(format!("gone: {e}")),
            Ok(None) => return Got::Closed("eof".into()),
        }
    }
}

async fn subscribe(pki: &Pki, port: u16, name: &str, body: &str) -> ClientWs {
    let mut ws = raw(&pki.subscriber(name), port).await;
    ws.send(Message::text(format!(r#"{{"type":"subscribe",{body}}}"#))).await.unwrap();
    ws
}

/// The fatal error a subscription was refused or ended with.
async fn refusal(ws: &mut ClientWs) -> (ErrorCode, String) {
    loop {
        match next(ws, Duration::from_secs(30)).await {
            Got::Msg(m) => match *m {
                HubToSubscriber::Error(e) => return (e.code, e.message),
                _ => continue,
            },
            Got::Closed(c) => panic!("closed without an error frame: {c}"),
        }
    }
}

/// Reads events (acking them) until `enough` says so; every event read.
async fn read_events(
    ws: &mut ClientWs,
    mut enough: impl FnMut(&[fleetwatch_protocol::Event]) -> bool,
) -> Vec<fleetwatch_protocol::Event> {
    let mut all = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while !enough(&all) {
        assert!(tokio::time::Instant::now() < deadline, "not enough events: {} read", all.len());
        match next(ws, Duration::from_secs(30)).await {
            Got::Msg(m) => match *m {
                HubToSubscriber::Events(b) => {
                    if let Some(c) = b.events.last().and_then(|e| e.cursor) {
                        ws.send(Message::text(format!(r#"{{"type":"ack","cursor":{c}}}"#))).await.unwrap();
                    }
                    all.extend(b.events);
                }
                HubToSubscriber::ResyncRequired(r) => {
                    ws.send(Message::text(format!(r#"{{"type":"ack","cursor":{}}}"#, r.cursor))).await.unwrap();
                }
                HubToSubscriber::Error(e) => panic!("{:?}: {}", e.code, e.message),
                HubToSubscriber::Subscribed(_) => {}
            },
            Got::Closed(c) => panic!("closed: {c}"),
        }
    }
    all
}

const POLICY: &str = "subscribers:
  - name: team-a
    clusters: [\"a-*\"]
    types: [\"dev.fleetwatch.object.*\"]
    redact: [/change]
  - name: ops
    clusters: [\"*\"]
";

/// A subscriber reads exactly its granted clusters with the redacted fields removed; an
/// unnamed one and one asking outside its grant are refused; the grant is on
/// `/api/v1/subscriptions`; a policy that breaks keeps the last good one (not ready), and
/// one that drops a subscriber closes its session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_access_policy_separates_subscribers() {
    let pki = Pki::new();
    let policy = pki.path("access.yaml");
    std::fs::write(&policy, POLICY).unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--access-policy", policy.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let _a = agent(&pki, "a-1", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let _b = agent(&pki, "b-1", &hub.url(), "synthetic:objects=5,rate=20", &[]);

    // ops sees both clusters, unredacted: the events team-a must not see exist.
    let mut ops = subscribe(&pki, hub.port, "ops", r#""from":"earliest""#).await;
    let seen = read_events(&mut ops, |e| {
        e.iter().any(|e| e.cluster == "b-1") && e.iter().any(|e| e.cluster == "a-1" && e.data.get("change").is_some())
    })
    .await;
    assert!(seen.iter().any(|e| e.cluster == "b-1"));

    // team-a, no cluster filter: only a-1, `change` removed, `generation` kept.
    let mut team_a = subscribe(&pki, hub.port, "team-a", r#""durable":"d","from":"earliest""#).await;
    let got = read_events(&mut team_a, |e| e.len() >= 20).await;
    let foreign: Vec<_> = got.iter().filter(|e| e.cluster != "a-1").map(|e| e.id.clone()).collect();
    assert!(foreign.is_empty(), "team-a got events of clusters outside its grant: {foreign:?}");
    let leaked: Vec<_> = got.iter().filter(|e| e.data.get("change").is_some()).map(|e| e.data.clone()).collect();
    assert!(leaked.is_empty(), "redacted field delivered: {leaked:?}");
    assert!(got.iter().all(|e| e.data.get("generation").is_some()), "{got:?}");

    // Asking for a cluster outside the grant: refused, naming it.
    let mut outside = subscribe(&pki, hub.port, "team-a", r#""clusters":["a-1","b-1"]"#).await;
    let (code, msg) = refusal(&mut outside).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("b-1") && !msg.contains("a-1,") && msg.contains("a-*"), "{msg}");

    // Not named: refused, naming the policy.
    let mut stranger = subscribe(&pki, hub.port, "stranger", r#""from":"earliest""#).await;
    let (code, msg) = refusal(&mut stranger).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("\"stranger\"") && msg.contains(policy.to_str().unwrap()), "{msg}");

    // The grants are shown.
    let subs: serde_json::Value =
        serde_json::from_str(&http_get(hub.admin_port, "/api/v1/subscriptions").await).unwrap();
    let grants = &subs["accessPolicy"]["grants"];
    assert_eq!(grants.as_array().map(Vec::len), Some(2), "{subs}");
    let team_a_sub = subs["subscriptions"].as_array().unwrap().iter().find(|s| s["subscriber"] == "team-a").cloned();
    assert_eq!(team_a_sub.map(|s| s["grant"]["clusters"].clone()), Some(serde_json::json!(["a-*"])), "{subs}");

    // Broken after start: the last good policy stays (ops still reads), not ready.
    std::fs::write(&policy, "subscribers: [").unwrap();
    let not_ready = holds_within(Duration::from_secs(20), || {
        block(http_get(hub.admin_port, "/readyz")).contains("access-policy: stale")
    })
    .await;
    assert!(not_ready, "{}\n{}", block(http_get(hub.admin_port, "/readyz")), hub.proc.stderr());
    assert!(hub.proc.stderr().lines().any(|l| l.contains("ERROR") && l.contains("access policy")));
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(metrics.contains("\nfleetwatch_hub_access_policy_stale 1\n"), "{metrics}");
    let mut ops2 = subscribe(&pki, hub.port, "ops", r#""from":"earliest""#).await;
    read_events(&mut ops2, |e| e.iter().any(|e| e.cluster == "b-1")).await;

    // team-a dropped from the policy: its live session is closed, forbidden.
    std::fs::write(&policy, "subscribers:\n  - name: ops\n    clusters: [\"*\"]\n").unwrap();
    let (code, msg) = refusal(&mut team_a).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("not named"), "{msg}");
    let ready =
        holds_within(Duration::from_secs(20), || block(http_get(hub.admin_port, "/readyz")).starts_with("ready")).await;
    assert!(ready, "{}", block(http_get(hub.admin_port, "/readyz")));
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(metrics.contains("\nfleetwatch_hub_access_policy_stale 0\n"), "{metrics}");
}

/// Without a policy the hub says at start that every subscriber reads every cluster; a
/// policy missing at start stops the hub naming the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_policy_the_hub_says_so_and_a_missing_one_stops_it() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let said = holds_within(Duration::from_secs(10), || {
        hub.proc.stderr().contains("every subscriber certificate reads every cluster")
    })
    .await;
    assert!(said, "{}", hub.proc.stderr());
    let missing = pki.path("no-such-policy.yaml");
    let mut args = hub_args(&pki, free_port(), free_port());
    args.extend(["--access-policy".into(), missing.display().to_string()]);
    let mut p = Proc::spawn(&args, pki.path("hub-missing-policy.log"));
    assert_eq!(p.wait_exit(Duration::from_secs(20)), Some(1), "{}", p.stderr());
    assert!(p.stderr().contains(&format!("access policy {}", missing.display())), "{}", p.stderr());
}

/// One identity holds at most --max-sessions-per-subscriber sessions: a new one closes
/// the oldest (with a reason), the others stay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_identity_holds_at_most_its_sessions() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--max-sessions-per-subscriber", "2"]);
    let connected = |name: &str| {
        let subs: serde_json::Value =
            serde_json::from_str(&block(http_get(hub.admin_port, "/api/v1/subscriptions"))).unwrap_or_default();
        subs["subscriptions"]
            .as_array()
            .map(|a| a.iter().filter(|s| s["subscriber"] == name && s["connected"] == true).count())
            .unwrap_or(0)
    };
    let mut first = subscribe(&pki, hub.port, "greedy", r#""from":"latest""#).await;
    assert!(
        matches!(next(&mut first, Duration::from_secs(20)).await, Got::Msg(m) if matches!(*m, HubToSubscriber::Subscribed(_)))
    );
    let mut second = subscribe(&pki, hub.port, "greedy", r#""from":"latest""#).await;
    assert!(
        matches!(next(&mut second, Duration::from_secs(20)).await, Got::Msg(m) if matches!(*m, HubToSubscriber::Subscribed(_)))
    );
    // Another identity does not count.
    let mut other = subscribe(&pki, hub.port, "modest", r#""from":"latest""#).await;
    assert!(
        matches!(next(&mut other, Duration::from_secs(20)).await, Got::Msg(m) if matches!(*m, HubToSubscriber::Subscribed(_)))
    );
    assert!(holds_within(Duration::from_secs(10), || connected("greedy") == 2).await);

    let mut third = subscribe(&pki, hub.port, "greedy", r#""from":"latest""#).await;
    assert!(
        matches!(next(&mut third, Duration::from_secs(20)).await, Got::Msg(m) if matches!(*m, HubToSubscriber::Subscribed(_)))
    );
    let (code, msg) = refusal(&mut first).await;
    assert_eq!(code, ErrorCode::LimitExceeded, "{msg}");
    assert!(msg.contains("--max-sessions-per-subscriber 2"), "{msg}");
    assert!(holds_within(Duration::from_secs(10), || connected("greedy") == 2).await, "{}", hub.proc.stderr());
    assert_eq!(connected("modest"), 1);
    // The survivors are still served: nothing arrives, and they are not closed.
    for ws in [&mut second, &mut third] {
        ws.send(Message::text(r#"{"type":"ack","cursor":0}"#)).await.unwrap();
    }
    assert!(hub.proc.stderr().contains("closed an older session of this subscriber identity"), "{}", hub.proc.stderr());
}

/// A deny-list entry as `openssl x509 -noout -serial` prints it, written with the file's
/// old mtime, still revokes: the hub compares content.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deny_list_change_is_noticed_by_content_in_openssl_form() {
    let pki = Pki::new();
    let deny = pki.path("deny-list");
    std::fs::write(&deny, "# nobody yet\n").unwrap();
    let mtime = std::fs::metadata(&deny).unwrap().modified().unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--deny-list", deny.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let files = pki.subscriber("leaked");
    let mut ws = raw(&files, hub.port).await;
    ws.send(Message::text(r#"{"type":"subscribe","from":"latest"}"#)).await.unwrap();
    assert!(
        matches!(next(&mut ws, Duration::from_secs(20)).await, Got::Msg(m) if matches!(*m, HubToSubscriber::Subscribed(_)))
    );
    let serial = fleetwatch_certs::inspect_file(&files.cert).unwrap().serial.replace(':', "").to_uppercase();
    std::fs::write(&deny, format!("serial={serial}\n")).unwrap();
    std::fs::File::options().write(true).open(&deny).unwrap().set_modified(mtime).unwrap();
    let (code, msg) = refusal(&mut ws).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("revoked"), "{msg}");
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Idle TCP sockets (sent nothing) from many loopback addresses, reopened as soon as the
/// hub closes them, do not starve a real client: when the handshake budget is used up
/// the oldest idle socket is closed to make room, and the timeout shrinks under pressure.
/// The agent's handshake must finish within its own connect timeout (10 s), which it never
/// did before (the issue measured 17 s). `FLEETWATCH_IDLE_SOCKETS` / `_ADDRS` scale it up
/// (the note's 5,000 from 100 addresses, with the default --max-handshakes 1024).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_do_not_starve_real_clients() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let env = |k: &str, d: usize| std::env::var(k).ok().and_then(|v| v.parse().ok()).unwrap_or(d);
    let sockets = env("FLEETWATCH_IDLE_SOCKETS", 600);
    let addrs = env("FLEETWATCH_IDLE_ADDRS", 20).clamp(1, 250);
    let per_addr = sockets.div_ceil(addrs);
    let pki = Pki::new();
    let scaled = std::env::var_os("FLEETWATCH_IDLE_SOCKETS").is_some();
    let extra: &[&str] = if scaled { &[] } else { &["--max-handshakes", "256"] };
    let hub = HubProc::start(&pki, free_port(), None, extra);
    let open = Arc::new(AtomicUsize::new(0));
    let stop = tokio_util::sync::CancellationToken::new();
    for a in 0..addrs {
        let ip = std::net::Ipv4Addr::new(127, 0, 0, 2 + a as u8);
        for _ in 0..per_addr {
            let (open, stop, port) = (open.clone(), stop.clone(), hub.port);
            tokio::spawn(async move {
                use tokio::io::AsyncReadExt;
                while !stop.is_cancelled() {
                    let Ok(sock) = tokio::net::TcpSocket::new_v4() else { return };
                    if sock.bind((ip, 0).into()).is_err() {
                        return;
                    }
                    let Ok(mut s) = sock.connect(([127, 0, 0, 1], port).into()).await else {
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    };
                    open.fetch_add(1, Ordering::Relaxed);
                    let mut buf = [0u8; 1];
                    tokio::select! {
                        _ = s.read(&mut buf) => {}
                        _ = stop.cancelled() => {}
                    }
                    open.fetch_sub(1, Ordering::Relaxed);
                }
            });
        }
    }
    let flooded = holds_within(Duration::from_secs(60), || open.load(Ordering::Relaxed) * 10 >= sockets * 9).await;
    assert!(flooded, "only {} of {sockets} idle sockets open", open.load(Ordering::Relaxed));
    // The flood is at work: the hub is closing idle sockets to make room.
    let evicting = holds_within(Duration::from_secs(30), || {
        block(http_get(hub.admin_port, "/metrics"))
            .contains(r#"fleetwatch_hub_handshake_failures_total{reason="idle-evicted"}"#)
    })
    .await;
    assert!(evicting, "{}", hub.proc.stderr());

    // A real agent: TLS, WebSocket, hello → welcome, with the agent's connect timeout.
    let files = pki.agent("real");
    let tls = Arc::new(fleetwatch_certs::client_config(&files).unwrap());
    let url = hub.url().parse().unwrap();
    let mut times = Vec::new();
    for _ in 0..3 {
        let t0 = std::time::Instant::now();
        let mut ws =
            connect(&url, tls.clone(), &Limits::default(), Duration::from_secs(10)).await.unwrap_or_else(|e| {
                let m = block(http_get(hub.admin_port, "/metrics"));
                let m: Vec<&str> = m.lines().filter(|l| l.contains("handshake") || l.contains("rejected")).collect();
                panic!(
                    "a real agent did not connect within its 10 s connect timeout: {e}\nopen idle sockets: {}\n{}\n{}",
                    open.load(Ordering::Relaxed),
                    m.join("\n"),
                    hub.proc.stderr().lines().rev().take(20).collect::<Vec<_>>().join("\n")
                )
            });
        let hello = r#"{"type":"hello","protocol":1,"agentVersion":"t","cluster":"real","epoch":7}"#;
        ws.send(Message::text(hello)).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
                Ok(Some(Ok(Message::Text(t)))) => {
                    assert!(t.contains("welcome"), "{t}");
                    break;
                }
                Ok(Some(Ok(_))) => continue,
                other => panic!("no welcome: {other:?}"),
            }
        }
        times.push(t0.elapsed());
        drop(ws);
    }
    stop.cancel();
    eprintln!(
        "connect times (TLS + WebSocket + welcome) with {sockets} idle sockets from {addrs} addresses: {:?}",
        times.iter().map(|t| format!("{} ms", t.as_millis())).collect::<Vec<_>>()
    );
}

const SELECTOR_POLICY: &str = "subscribers:
  - name: team-a
    clusters: []
    clusterSelector: \"team=a,env in (prod)\"
";

/// `clusterSelector`: a subscriber is granted the clusters whose Runtime labels match (and
/// no other, nor one without a Runtime); a filter outside that is refused naming the
/// selector; relabelling Runtimes moves clusters out of and into a live session; a hub that
/// reads no control plane refuses such a policy at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_selector_grants_by_runtime_labels_and_follows_them() {
    let pki = Pki::new();
    let policy = pki.path("selector.yaml");
    std::fs::write(&policy, SELECTOR_POLICY).unwrap();
    // No control plane: no labels to select by, so the policy is refused, not half applied.
    let mut args = hub_args(&pki, free_port(), free_port());
    args.extend(["--no-control-plane".into(), "--access-policy".into(), policy.display().to_string()]);
    let mut p = Proc::spawn(&args, pki.path("hub-no-control-plane.log"));
    assert_eq!(p.wait_exit(Duration::from_secs(20)), Some(1), "{}", p.stderr());
    assert!(p.stderr().contains("needs Runtime labels, and this hub reads no control plane"), "{}", p.stderr());

    // A control plane with Runtimes: s-1 matches, s-2 is team b, s-3 has no Runtime.
    let (_cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    kubectl(&cp_kc, &["create", "namespace", "kcp"], None);
    for (name, cluster, team) in [("rt-1", "s-1", "a"), ("rt-2", "s-2", "b")] {
        let rt = serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": name, "namespace": "kcp", "labels": {"team": team, "env": "prod"}},
            "spec": {"clusterId": cluster, "modules": []}});
        kubectl(&cp_kc, &["apply", "-f", "-"], Some(&rt.to_string()));
    }
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--control-plane-kubeconfig", cp_kc.to_str().unwrap(), "--access-policy", policy.to_str().unwrap()],
    );
    let _s1 = agent(&pki, "s-1", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let _s2 = agent(&pki, "s-2", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let _s3 = agent(&pki, "s-3", &hub.url(), "synthetic:objects=5,rate=20", &[]);

    // Only s-1 (the hub reads the labels within its Runtime poll; until then nothing).
    let mut team_a = subscribe(&pki, hub.port, "team-a", r#""durable":"d","from":"earliest""#).await;
    let got = read_events(&mut team_a, |e| e.iter().filter(|e| e.cluster == "s-1").count() >= 20).await;
    let foreign: Vec<_> = got.iter().filter(|e| e.cluster != "s-1").map(|e| e.cluster.clone()).collect();
    assert!(foreign.is_empty(), "team-a got clusters its selector does not match: {foreign:?}");

    // Asking for s-2 or s-3 is refused, naming the selector.
    for cluster in ["s-2", "s-3"] {
        let mut outside = subscribe(&pki, hub.port, "team-a", &format!(r#""clusters":["{cluster}"]"#)).await;
        let (code, message) = refusal(&mut outside).await;
        assert_eq!(code, ErrorCode::Forbidden);
        assert!(
            message.contains(&format!("may not read cluster(s) {cluster}")) && message.contains("team=a,env in (prod)"),
            "{message}"
        );
    }

    // Relabel: s-1 leaves team a, then s-2 joins. The hub sees the changes in that order,
    // so once s-2 arrives in the live session, nothing more of s-1 may.
    kubectl(&cp_kc, &["-n", "kcp", "label", "runtime", "rt-1", "team=c", "--overwrite"], None);
    kubectl(&cp_kc, &["-n", "kcp", "label", "runtime", "rt-2", "team=a", "--overwrite"], None);
    let got = read_events(&mut team_a, |e| {
        e.iter()
            .position(|e| e.cluster == "s-2")
            .is_some_and(|first| e[first..].iter().filter(|e| e.cluster == "s-2").count() >= 20)
    })
    .await;
    let first = got.iter().position(|e| e.cluster == "s-2").unwrap_or(0);
    let after: Vec<_> = got[first..].iter().filter(|e| e.cluster != "s-2").map(|e| e.cluster.clone()).collect();
    assert!(after.is_empty(), "after the relabel team-a still got: {after:?}");
}

/// `refusal`, bounded: a subscriber served instead of refused fails the test, not hangs it.
async fn refused_within(ws: &mut ClientWs) -> (ErrorCode, String) {
    tokio::time::timeout(Duration::from_secs(30), refusal(ws)).await.expect("served, not refused, within 30 s")
}

fn access_object(name: &str, subscribers: serde_json::Value) -> String {
    serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "SubscriberAccessPolicy",
        "metadata": {"name": name}, "spec": {"subscribers": subscribers}})
    .to_string()
}

/// The policy as SubscriberAccessPolicy objects in the control plane: with none, every
/// subscriber is refused; an accepted one grants (its status says so, the grant's source is
/// shown); an invalid one grants nothing and says why in its status; an edit that drops a
/// subscriber closes its live session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn subscriber_access_policy_objects_grant_and_fail_closed() {
    let pki = Pki::new();
    let (_cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--control-plane-kubeconfig", cp_kc.to_str().unwrap(), "--access-policy-from-control-plane"],
    );
    let _a = agent(&pki, "a-1", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let _b = agent(&pki, "b-1", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let ready =
        holds_within(Duration::from_secs(30), || block(http_get(hub.admin_port, "/readyz")).starts_with("ready")).await;
    assert!(ready, "{}\n{}", block(http_get(hub.admin_port, "/readyz")), hub.proc.stderr());

    // No object: nobody is granted, said at start and on /api/v1/subscriptions.
    let mut team_a = subscribe(&pki, hub.port, "team-a", r#""from":"earliest""#).await;
    let (code, msg) = refused_within(&mut team_a).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("0 accepted SubscriberAccessPolicy"), "{msg}");
    assert!(hub.proc.stderr().lines().any(|l| l.contains("WARN") && l.contains("every subscriber is refused")));
    let subs: serde_json::Value =
        serde_json::from_str(&http_get(hub.admin_port, "/api/v1/subscriptions").await).unwrap();
    assert_eq!(subs["accessPolicy"]["grantsNobody"], true, "{subs}");

    // An object grants team-a the a-* clusters: accepted, and team-a reads only those.
    let grant = serde_json::json!([{"name": "team-a", "clusters": ["a-*"]}]);
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&access_object("team-a", grant)));
    let status = |name: &str| {
        kubectl(
            &cp_kc,
            &[
                "get",
                "subscriberaccesspolicies",
                name,
                "-o",
                r#"jsonpath={.status.conditions[?(@.type=="Accepted")].status}/{.status.conditions[?(@.type=="Accepted")].reason}/{.status.conditions[?(@.type=="Accepted")].message}"#,
            ],
            None,
        )
    };
    assert!(
        holds_within(Duration::from_secs(20), || status("team-a").starts_with("True/Accepted")).await,
        "{}",
        status("team-a")
    );
    let mut team_a = subscribe(&pki, hub.port, "team-a", r#""durable":"d","from":"earliest""#).await;
    let got = read_events(&mut team_a, |e| e.len() >= 20).await;
    let foreign: Vec<_> = got.iter().filter(|e| e.cluster != "a-1").map(|e| e.cluster.clone()).collect();
    assert!(foreign.is_empty(), "team-a got clusters outside its grant: {foreign:?}");
    let subs: serde_json::Value =
        serde_json::from_str(&http_get(hub.admin_port, "/api/v1/subscriptions").await).unwrap();
    assert_eq!(subs["accessPolicy"]["grants"][0]["source"], "SubscriberAccessPolicy/team-a", "{subs}");

    // An invalid object: Accepted=False, Invalid, and it grants nothing.
    let bad = serde_json::json!([{"name": "team-b", "clusters": ["*"], "redact": ["data.password"]}]);
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&access_object("bad", bad)));
    assert!(
        holds_within(Duration::from_secs(20), || status("bad").starts_with("False/Invalid/")).await,
        "{}",
        status("bad")
    );
    assert!(status("bad").contains("not a JSON pointer"), "{}", status("bad"));
    // team-b, named only by that object, is told which object failed to grant it and why.
    let mut team_b = subscribe(&pki, hub.port, "team-b", r#""from":"earliest""#).await;
    let (code, msg) = refused_within(&mut team_b).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("SubscriberAccessPolicy/bad names it but is not used: Invalid: "), "{msg}");

    // The object edited to drop team-a: its live session is closed, forbidden.
    let ops = serde_json::json!([{"name": "ops", "clusters": ["*"]}]);
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&access_object("team-a", ops)));
    let (code, msg) = refused_within(&mut team_a).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("not named"), "{msg}");
    let listed = kubectl(&cp_kc, &["get", "subscriberaccesspolicies"], None);
    assert!(listed.contains("ACCEPTED") && listed.contains("SUBSCRIBERS") && listed.contains("ops"), "{listed}");
    // Every object was judged again at that edit; the invalid one's WARN came once, with its
    // status, not at every change of another object.
    let warned = hub
        .proc
        .stderr()
        .lines()
        .filter(|l| l.contains("WARN") && l.contains("SubscriberAccessPolicy not used object=bad"))
        .count();
    assert_eq!(warned, 1, "{}", hub.proc.stderr());
}
