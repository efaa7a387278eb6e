//! Hub replicas on NATS JetStream, with real processes: a real `nats-server -js` (the
//! Debian package), two `fleetwatch hub --bus` processes on one stream, agents producing and
//! a durable subscriber, each reaching the hubs through a TCP proxy that moves to the
//! surviving hub when the one behind it is killed (what a load balancer does).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_bus::nats::server::LocalNatsServer;
use serde_json::json;
use tokio::net::{TcpListener, TcpStream};

use crate::support::*;

mod agent_waves;
mod fleet_state;

/// A TCP proxy to whichever port `target` holds; `switch` moves it and drops the
/// connections to the old target.
struct Balancer {
    port: u16,
    /// (target port, switches so far): connections wait on changes instead of polling.
    state: tokio::sync::watch::Sender<(u16, u64)>,
}

impl Balancer {
    async fn start(target: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = tokio::sync::watch::Sender::new((target, 0u64));
        let watching = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let mut rx = watching.subscribe();
                let (to, my_gen) = *rx.borrow_and_update();
                tokio::spawn(async move {
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", to)).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        // Switched: drop both sides.
                        _ = rx.wait_for(|(_, g)| *g != my_gen) => {}
                    }
                });
            }
        });
        Self { port, state }
    }

    fn url(&self) -> String {
        format!("wss://127.0.0.1:{}", self.port)
    }

    fn switch(&self, to: u16) {
        self.state.send_modify(|(target, generation)| {
            *target = to;
            *generation += 1;
        });
    }
}

/// Like [`missing`], but a cluster the subscriber was told to resync (for another reason
/// than the agent's start marker) counts as reconciled in full.
fn missing_unless_resynced(seen: &Seen, clusters: &[&str], source: &SyntheticSource) -> Vec<String> {
    let told = |c: &&str| seen.resyncs.get(*c).is_some_and(|r| r.iter().any(|(_, why)| why != "agent started"));
    let checked: Vec<&str> = clusters.iter().copied().filter(|c| !told(c)).collect();
    missing(seen, &checked, source)
}

/// SIGKILL of the hub replica the agents and the subscriber are connected to, while they
/// produce: they continue on the other replica; per object the latest state reaches the
/// durable subscriber, nothing is lost and nothing needed a resync.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_hub_replica_loses_nothing() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url(), "--bus-stream", "fleet"];
    let (pa, pb) = (free_port(), free_port());
    let mut a = HubProc::start(&pki, pa, None, &bus);
    let b = HubProc::start(&pki, pb, None, &bus);
    let to_agents = Balancer::start(pa).await;
    let to_subscriber = Balancer::start(pa).await;
    let spec = "synthetic:objects=40,rate=250,total=3000";
    let source: SyntheticSource = spec.parse().unwrap();
    let clusters = ["c1", "c2", "c3"];
    let _agents: Vec<_> = clusters.iter().map(|c| agent(&pki, c, &to_agents.url(), spec, &[])).collect();
    let collector = Collector::start(&pki, &to_subscriber.url(), "checker").await;

    // Kill replica a once every agent streams through it.
    let all_flowing = holds_within(Duration::from_secs(60), || {
        let seen = collector.seen.lock().unwrap();
        clusters.iter().all(|c| seen.max_seq.get(*c).is_some_and(|s| *s > 200))
    })
    .await;
    assert!(all_flowing, "agents did not stream through replica a:\n{}", a.proc.stderr());
    // Replica b's /api/v1/clusters shows the agents connected to a.
    let on_a = format!("127.0.0.1:{pa}");
    eventually("b to show the fleet on a")
        .until(
            async || b.clusters().await["clusters"].as_array().cloned().unwrap_or_default(),
            |list| list.len() == 3 && list.iter().all(|c| c["connected"] == true && c["hub"] == on_a.as_str()),
        )
        .await;
    // b has had no reader: it holds none of the stream (its local tail starts with one).
    let held = |metrics: &str| {
        metrics.lines().find_map(|l| l.strip_prefix("fleetwatch_hub_bus_held_in_memory ")).map(str::to_string)
    };
    assert_eq!(held(&http_get(b.admin_port, "/metrics").await).as_deref(), Some("0"));
    a.proc.signal("KILL");
    assert!(a.proc.wait_exit(Duration::from_secs(5)).is_some());
    to_agents.switch(pb);
    to_subscriber.switch(pb);

    let done = holds_within(Duration::from_secs(90), || {
        missing_unless_resynced(&collector.seen.lock().unwrap(), &clusters, &source).is_empty()
    })
    .await;
    {
        let seen = collector.seen.lock().unwrap();
        let left = missing_unless_resynced(&seen, &clusters, &source);
        assert!(done, "objects not delivered: {:?}\nhub b log:\n{}", &left[..5.min(left.len())], b.proc.stderr());
        // JetStream kept everything: no cluster needed a resync beyond its agent's start.
        for c in clusters {
            let r = seen.resyncs.get(c).cloned().unwrap_or_default();
            assert!(r.iter().all(|(_, why)| why == "agent started"), "cluster {c} resyncs: {r:?}");
        }
        assert!(only_first_subscription_resyncs(&seen), "{:?}", seen.resyncs);
    }
    // The subscriber's move started b's tail, which loaded what a had stored.
    assert_eq!(held(&http_get(b.admin_port, "/metrics").await).as_deref(), Some("1"));
    // Replica b resumed each agent's stream from the heads a stored.
    let on_b = format!("127.0.0.1:{pb}");
    eventually("b to have acked every agent's 3001 events")
        .until(
            async || b.clusters().await["clusters"].as_array().cloned().unwrap_or_default(),
            |acked| {
                acked.len() == 3
                    && acked.iter().all(|c| c["ackedSeq"].as_u64() == Some(3001) && c["hub"] == on_b.as_str())
            },
        )
        .await;
}

/// Bad `--bus` settings: one error line naming the cause, non-zero exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_bus_settings_fail_with_one_line() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let first = HubProc::start(&pki, free_port(), None, &["--bus", &js.url()]);
    let run = |extra: &[&str]| {
        let mut args = hub_args(&pki, free_port(), free_port());
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut p = Proc::spawn(&args, pki.path(&format!("bad-hub-{}.log", free_port())));
        let code = p.wait_exit(Duration::from_secs(30));
        let errors: Vec<String> = p.stderr().lines().filter(|l| l.starts_with("error:")).map(String::from).collect();
        (code, errors)
    };
    let (code, errors) = run(&["--bus", &js.url(), "--bus-replicas", "3"]);
    assert_eq!(code, Some(1));
    assert_eq!(errors.len(), 1, "{errors:?}");
    assert!(
        errors[0].contains("stream fleetwatch exists with conflicting settings: replicas is 1, this hub wants 3"),
        "{errors:?}"
    );
    drop(first);
    // A server that wants a user and password, given none: the refusal is named.
    let auth = ["--user", "fleet", "--pass", "secret"].map(String::from);
    let secured = LocalNatsServer::start_with(&pki.path("jetstream-auth"), 0, &auth).unwrap_or_else(|e| panic!("{e}"));
    let (code, errors) = run(&["--bus", &secured.url()]);
    assert_eq!(code, Some(1));
    assert!(errors.len() == 1 && errors[0].contains("authorization violation"), "{errors:?}");
    let with_password = secured.url().replace("nats://", "nats://fleet:secret@");
    let hub = HubProc::start(&pki, free_port(), None, &["--bus", &with_password]);
    let ready = http_get(hub.admin_port, "/readyz").await;
    assert!(ready.starts_with("ready"), "{ready}");
}

/// A hub started before its NATS server (or with it frozen) does not exit: it serves
/// `/healthz`, answers `/readyz` 503 naming the cause, refuses agents as `unavailable`, and
/// once the server is up (or thawed) opens its bus by itself and stores the agent's events.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_started_before_its_nats_server_becomes_ready_by_itself() {
    let pki = Pki::new();
    let nats_port = free_port();
    let url = format!("nats://127.0.0.1:{nats_port}");
    let hub = HubProc::start(&pki, free_port(), None, &["--bus", &url]);
    let healthz = http_get(hub.admin_port, "/healthz").await;
    assert!(healthz.starts_with("ok"), "{healthz}");
    let waiting = eventually("/readyz to name the unreachable NATS server")
        .until(
            async || http_get(hub.admin_port, "/readyz").await,
            |r| r.starts_with("not ready") && r.contains(&format!("cannot connect to NATS at {url}")),
        )
        .await;
    assert!(waiting.contains("bus: not open yet"), "{waiting}");
    let agent = agent(&pki, "c1", &hub.url(), "synthetic:objects=5,rate=20,total=40", &[]);
    eventually("the agent to be told to retry").until(async || agent.stderr(), |e| e.contains("unavailable")).await;

    let js = LocalNatsServer::start_with(&pki.path("jetstream"), nats_port, &[]).unwrap_or_else(|e| panic!("{e}"));
    eventually("the hub to open its bus by itself")
        .context(|| hub.proc.stderr())
        .until(async || http_get(hub.admin_port, "/readyz").await, |r| r.starts_with("ready"))
        .await;
    eventually("the agent's 40 events to be stored")
        .until(
            async || hub.clusters().await["clusters"].as_array().cloned().unwrap_or_default(),
            |c| c.iter().any(|c| c["cluster"] == "c1" && c["ackedSeq"].as_u64() >= Some(41)),
        )
        .await;
    assert!(hub.proc.stderr().contains("opened the bus"), "{}", hub.proc.stderr());

    // Frozen (SIGSTOP) while a second hub starts: it waits, unready, and is ready once
    // the server is thawed.
    let pid = js.pid().expect("running").to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let second = HubProc::start(&pki, free_port(), None, &["--bus", &js.url()]);
    let frozen = eventually("the second hub to be unready while NATS is frozen")
        .until(async || http_get(second.admin_port, "/readyz").await, |r| r.starts_with("not ready"))
        .await;
    signal("-CONT");
    assert!(frozen.contains("bus: not open yet") && frozen.contains("timed out"), "{frozen}");
    eventually("the second hub to be ready once NATS is thawed")
        .context(|| second.proc.stderr())
        .until(async || http_get(second.admin_port, "/readyz").await, |r| r.starts_with("ready"))
        .await;
}

/// A 3-node JetStream cluster on loopback with a meta leader elected: the nodes and
/// their monitoring ports.
///
/// The route and monitoring ports are picked free and bound a moment later by the servers;
/// on a busy machine another process may take one in between, and a node that cannot bind
/// one exits after it reported ready. Such a start is tried again on fresh ports.
async fn jetstream_cluster_of_three(pki: &Pki) -> (Vec<Option<LocalNatsServer>>, [u16; 3]) {
    let mut failures = Vec::new();
    for attempt in 0..3 {
        match try_jetstream_cluster_of_three(pki, attempt).await {
            Ok(cluster) => return cluster,
            Err(why) => failures.push(why),
        }
    }
    panic!("no 3-node JetStream cluster in 3 attempts: {failures:#?}");
}

/// One attempt of [`jetstream_cluster_of_three`]: fails when a node exits or no meta leader
/// of 3 is elected in [`fleetwatch_test_support::DEADLINE`].
async fn try_jetstream_cluster_of_three(
    pki: &Pki,
    attempt: usize,
) -> Result<(Vec<Option<LocalNatsServer>>, [u16; 3]), String> {
    let route_ports = [free_port(), free_port(), free_port()];
    let monitor_ports = [free_port(), free_port(), free_port()];
    let routes = route_ports.iter().map(|p| format!("nats://127.0.0.1:{p}")).collect::<Vec<_>>().join(",");
    let mut nodes: Vec<Option<LocalNatsServer>> = Vec::new();
    for i in 0..3 {
        let extra: Vec<String> = [
            "-n",
            &format!("node-{i}"),
            "--cluster_name",
            "fw",
            "--cluster",
            &format!("nats://127.0.0.1:{}", route_ports[i]),
            "--routes",
            &routes,
            "-m",
            &monitor_ports[i].to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let node = LocalNatsServer::start_with(&pki.path(&format!("js-{attempt}-{i}")), 0, &extra)
            .map_err(|e| format!("node-{i}: {e}"))?;
        nodes.push(Some(node));
    }
    // JetStream serves replicated streams once the nodes elected a meta leader.
    let leader = |jsz: &str| {
        serde_json::from_str::<serde_json::Value>(jsz).ok().is_some_and(|v| {
            let m = &v["meta_cluster"];
            m["leader"].as_str().is_some_and(|l| !l.is_empty()) && m["cluster_size"].as_u64() == Some(3)
        })
    };
    let started = Instant::now();
    let mut last = String::new();
    while started.elapsed() < fleetwatch_test_support::DEADLINE {
        if let Some(i) = nodes.iter_mut().position(|n| n.as_mut().is_none_or(LocalNatsServer::has_exited)) {
            return Err(format!("node-{i} exited (ports {route_ports:?}, {monitor_ports:?})"));
        }
        last = http_get(monitor_ports[0], "/jsz").await;
        if leader(&last) {
            return Ok((nodes, monitor_ports));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Err(format!("no meta leader of 3; last /jsz of node-0: {last:?}"))
}

/// Issue 44, break 3: one node of three frozen (SIGSTOP) while quorum holds. The hub
/// connected to it notices that the server no longer answers though the connection looks
/// up, connects to another node, and keeps storing its agent's events while the node is
/// still frozen (before, it waited minutes for the client's pings, unready all along).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_jetstream_node_of_three_is_left_for_the_others() {
    let pki = Pki::new();
    let (nodes, monitor_ports) = jetstream_cluster_of_three(&pki).await;
    let urls = nodes.iter().map(|n| n.as_ref().unwrap().url()).collect::<Vec<_>>().join(",");
    let hub = HubProc::start(&pki, free_port(), None, &["--bus", &urls, "--bus-replicas", "3"]);
    let _agent = agent(&pki, "c1", &hub.url(), "synthetic:objects=20,rate=40,total=1000000", &[]);
    let acked = async || {
        let clusters = hub.clusters().await;
        let c1 = clusters["clusters"].as_array().and_then(|a| a.iter().find(|c| c["cluster"] == "c1").cloned());
        c1.and_then(|c| c["ackedSeq"].as_u64()).unwrap_or(0)
    };
    eventually("the agent's events to be stored").until(acked, |s| *s > 50).await;
    // The node the hub is connected to.
    let mut connected = None;
    for (i, port) in monitor_ports.iter().enumerate() {
        let connz = http_get(*port, "/connz").await;
        let v: serde_json::Value = serde_json::from_str(&connz).unwrap_or_default();
        let conns = v["connections"].as_array().cloned().unwrap_or_default();
        if conns.iter().any(|c| c["name"] == "fleetwatch-hub") {
            connected = Some(i);
        }
    }
    let node = connected.expect("the hub is connected to a node");
    let pid = nodes[node].as_ref().and_then(|n| n.pid()).expect("running").to_string();
    let signal = |sig: &str| {
        let ok = std::process::Command::new("kill").args([sig, &pid]).status().is_ok_and(|s| s.success());
        assert!(ok, "kill {sig} {pid}");
    };
    signal("-STOP");
    let at_freeze = acked().await;
    eventually("the hub to leave the frozen node")
        .context(|| hub.proc.stderr())
        .until(async || hub.proc.stderr(), |log| log.contains("does not answer: connecting again"))
        .await;
    let moved = eventually("events stored and the hub ready while the node is still frozen")
        .context(|| hub.proc.stderr())
        .until(
            async || (acked().await, http_get(hub.admin_port, "/readyz").await),
            |(seq, ready)| *seq > at_freeze + 40 && ready.starts_with("ready"),
        )
        .await;
    signal("-CONT");
    assert!(moved.0 > at_freeze, "{moved:?}");
}

/// A 3-node JetStream cluster on loopback; `--bus-replicas 3`; the node holding the most
/// client connections is killed (SIGKILL) while agents produce: per object the latest state
/// reaches the durable subscriber (or a `resync-required` for its cluster), nothing lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_jetstream_node_of_three_loses_nothing() {
    let pki = Pki::new();
    let (mut nodes, monitor_ports) = jetstream_cluster_of_three(&pki).await;
    let urls = nodes.iter().map(|n| n.as_ref().unwrap().url()).collect::<Vec<_>>().join(",");
    let bus = ["--bus", &urls, "--bus-replicas", "3"];
    let (pa, pb) = (free_port(), free_port());
    let a = HubProc::start(&pki, pa, None, &bus);
    let b = HubProc::start(&pki, pb, None, &bus);
    let spec = "synthetic:objects=40,rate=250,total=3000";
    let source: SyntheticSource = spec.parse().unwrap();
    let clusters = ["c1", "c2", "c3"];
    let _agents: Vec<_> = clusters.iter().map(|c| agent(&pki, c, &a.url(), spec, &[])).collect();
    let collector = Collector::start(&pki, &b.url(), "checker").await;
    let flowing = holds_within(Duration::from_secs(60), || {
        let seen = collector.seen.lock().unwrap();
        clusters.iter().all(|c| seen.max_seq.get(*c).is_some_and(|s| *s > 200))
    })
    .await;
    assert!(flowing, "agents did not stream:\n{}", a.proc.stderr());

    // Kill the node most clients are connected to.
    let mut busiest = (0, 0);
    for (i, port) in monitor_ports.iter().enumerate() {
        let varz = http_get(*port, "/varz").await;
        let conns = serde_json::from_str::<serde_json::Value>(&varz).ok().and_then(|v| v["connections"].as_u64());
        if conns.unwrap_or(0) >= busiest.1 {
            busiest = (i, conns.unwrap_or(0));
        }
    }
    nodes[busiest.0].take().expect("the node runs").stop();

    let done = holds_within(Duration::from_secs(120), || {
        missing_unless_resynced(&collector.seen.lock().unwrap(), &clusters, &source).is_empty()
    })
    .await;
    let seen = collector.seen.lock().unwrap();
    let left = missing_unless_resynced(&seen, &clusters, &source);
    assert!(
        done,
        "objects not delivered after node-{} died: {:?}\nresyncs: {:?}\nhub a log:\n{}\nhub b log:\n{}",
        busiest.0,
        &left[..5.min(left.len())],
        seen.resyncs,
        a.proc.stderr(),
        b.proc.stderr()
    );
    assert!(only_first_subscription_resyncs(&seen), "{:?}", seen.resyncs);
    eprintln!("node-{} killed; resyncs seen: {:?}", busiest.0, seen.resyncs);
}

/// A NATS server that requires mutual TLS: the hub connects with `--bus-tls-ca`,
/// `--bus-tls-cert` and `--bus-tls-key`; without a client certificate it stays unready,
/// `/readyz` naming the refused connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_to_nats() {
    let pki = Pki::new();
    let client = pki.subscriber("hub-to-nats");
    let tls: Vec<String> = [
        "--tls",
        "--tlscert",
        &pki.path("hub.crt").display().to_string(),
        "--tlskey",
        &pki.path("hub.key").display().to_string(),
        "--tlscacert",
        &pki.path("ca.crt").display().to_string(),
        "--tlsverify",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let js = LocalNatsServer::start_with(&pki.path("jetstream"), 0, &tls).unwrap_or_else(|e| panic!("{e}"));
    let url = js.url().replace("nats://", "tls://");
    let ca = pki.path("ca.crt").display().to_string();
    let (cert, key) = (client.cert.display().to_string(), client.key.display().to_string());
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--bus", &url, "--bus-tls-ca", &ca, "--bus-tls-cert", &cert, "--bus-tls-key", &key],
    );
    let ready = http_get(hub.admin_port, "/readyz").await;
    assert!(ready.starts_with("ready"), "{ready}");
    // Without a client certificate the server drops the connection: from the client that
    // looks like a connection lost, which may pass, so the hub serves unready naming it
    // rather than exiting (issue 44); it never reports ready.
    let refused = HubProc::start(&pki, free_port(), None, &["--bus", &url, "--bus-tls-ca", &ca]);
    let why = eventually("/readyz to name the refused connection")
        .context(|| refused.proc.stderr())
        .until(
            async || http_get(refused.admin_port, "/readyz").await,
            |r| r.contains("cannot connect to NATS at tls://127.0.0.1"),
        )
        .await;
    assert!(why.starts_with("not ready: bus: not open yet: "), "{why}");
}

/// What a durable name's first subscription to a bus a hub began (every first start) is
/// told: the bus cannot rule out that the name was read before JetStream lost its store.
const FIRST_SUBSCRIPTION: &str = "a hub began after JetStream had no stream for it";

/// Whether every `resync-required` `*` a subscriber saw is the one its durable name's first
/// subscription to a newly begun bus is told (at most one per subscription): nothing was
/// lost after it.
fn only_first_subscription_resyncs(seen: &Seen) -> bool {
    seen.resyncs.get("*").is_none_or(|r| r.iter().all(|(_, why)| why.contains(FIRST_SUBSCRIPTION)))
}

/// Waits (60 s at most) until the hub's `/readyz` says ready; fails with `what`, its last
/// answer and the hub's log otherwise.
async fn wait_ready(hub: &HubProc, what: &str) {
    eventually(format!("{what}: /readyz to say ready"))
        .context(|| hub.proc.stderr())
        .until(async || http_get(hub.admin_port, "/readyz").await, |ready| ready.starts_with("ready"))
        .await;
}

/// Lines `tail` printed that are a `resync-required` for every cluster (`*`), but for the
/// one its durable name's first subscription to a newly begun bus is told.
fn resync_all_lines(tail: &Proc) -> Vec<serde_json::Value> {
    tail.stdout_lines
        .lock()
        .unwrap()
        .iter()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|v| v["type"] == "resync-required" && v["cluster"] == "*")
        .filter(|v| !v["reason"].as_str().is_some_and(|r| r.contains(FIRST_SUBSCRIPTION)))
        .collect()
}

fn tail_proc(pki: &Pki, hub: &str, name: &str, log: &str) -> Proc {
    tail_of(pki, hub, name, log, &[])
}

fn tail_of(pki: &Pki, hub: &str, name: &str, log: &str, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = ["tail", "--hub", hub, "--name", name, "--from", "latest"].map(String::from).to_vec();
    args.extend(extra.iter().map(|s| s.to_string()));
    args.extend(client_args(&pki.subscriber("ops")));
    Proc::spawn(&args, pki.path(log))
}

/// NATS restarted with an empty store (its disk lost) under two running hub replicas, an
/// agent producing, a durable subscriber reading live and a durable `tail` that is away:
/// without restarting anything of fleetwatch, the hubs recreate the stream, become ready
/// again and agree; the live subscriber is told `resync-required` `*` with the true reason
/// and then receives the agent's new events (its session resumed); the `tail` returning
/// with `--from latest` (as the lifecycle operator subscribes) is told `*` too instead of
/// being placed silently after the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_restarted_empty_recovers_without_a_hub_restart() {
    let pki = Pki::new();
    let mut js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url()];
    let a = HubProc::start(&pki, free_port(), None, &bus);
    let b = HubProc::start(&pki, free_port(), None, &bus);
    let _agent = agent(&pki, "c1", &a.url(), "synthetic:objects=20,rate=40,total=1000000", &[]);
    let collector = Collector::start(&pki, &b.url(), "checker").await;
    let mut tail = tail_proc(&pki, &a.url(), "ops", "tail-1.log");
    tail.wait_stdout(r#""c1""#, Duration::from_secs(60));
    let flowing = holds_within(Duration::from_secs(60), || {
        collector.seen.lock().unwrap().max_seq.get("c1").is_some_and(|s| *s > 20)
    })
    .await;
    assert!(flowing, "the agent's events do not reach the subscriber:\n{}", a.proc.stderr());
    tail.signal("KILL");
    assert!(tail.wait_exit(Duration::from_secs(5)).is_some());
    // A durable subscriber of a quiet cluster: registered, never acked anything, so no hub
    // holds a cursor move of it: only the cursor store knew the name.
    let mut quiet = tail_of(&pki, &b.url(), "quiet", "quiet-1.log", &["--cluster", "c2"]);
    let registered = holds_within(Duration::from_secs(30), || {
        b.proc.stderr().lines().any(|l| l.contains("subscriber connected") && l.contains("quiet"))
    })
    .await;
    assert!(registered, "{}", b.proc.stderr());
    quiet.signal("KILL");
    assert!(quiet.wait_exit(Duration::from_secs(5)).is_some());

    js.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    let told = holds_within(Duration::from_secs(90), || {
        let seen = collector.seen.lock().unwrap();
        seen.resyncs
            .get("*")
            .is_some_and(|r| r.iter().any(|(_, why)| why.contains("the JetStream stream was recreated empty")))
    })
    .await;
    assert!(
        told,
        "no resync-required * for the recreated stream: {:?}\nhub a:\n{}\nhub b:\n{}",
        collector.seen.lock().unwrap().resyncs,
        a.proc.stderr(),
        b.proc.stderr()
    );
    let at_marker = collector.seen.lock().unwrap().max_seq.get("c1").copied().unwrap_or(0);
    for hub in [&a, &b] {
        wait_ready(hub, "hub not ready again").await;
    }
    // The agent's session resumed: new events reach the live subscriber after the marker.
    let resumed = holds_within(Duration::from_secs(90), || {
        collector.seen.lock().unwrap().max_seq.get("c1").is_some_and(|s| *s > at_marker + 20)
    })
    .await;
    assert!(resumed, "no events after the recreation (last seq {at_marker}):\nhub a:\n{}", a.proc.stderr());
    // The durable tail comes back from latest: its stored cursor went with JetStream's store.
    let tail = tail_proc(&pki, &a.url(), "ops", "tail-2.log");
    eventually("the returning tail to be told to resync")
        .context(|| tail.stderr())
        .until(async || resync_all_lines(&tail), |lines| !lines.is_empty())
        .await;
    // Its name is lost with the cursor store (`Lookup::Lost`), or — when hub a wrote the
    // killed tail's last acks into the recreated store — known at an old cursor, below
    // the marker, which it then reads: told either way.
    let quiet = tail_of(&pki, &a.url(), "quiet", "quiet-2.log", &["--cluster", "c2"]);
    eventually("the returning quiet tail to be told to resync")
        .context(|| quiet.stderr())
        .until(async || resync_all_lines(&quiet), |lines| !lines.is_empty())
        .await;
    // Its name is lost with the cursor store, or — when the store was recreated before the
    // replica took the new stream on — its first read is the recreation's marker: told
    // either way (the same race as the other tail's, below).
    let told = resync_all_lines(&quiet);
    assert!(
        told[0]["reason"].as_str().is_some_and(|r| {
            r.contains("lost its durable cursor store") || r.contains("the JetStream stream was recreated empty")
        }),
        "{told:?}"
    );
    let told = resync_all_lines(&tail);
    let why = told[0]["reason"].as_str().unwrap_or_default();
    assert!(
        why.contains("lost its durable cursor store") || why.contains("the JetStream stream was recreated empty"),
        "{told:?}"
    );
}

/// NATS lost its store while no hub ran: the hub started afterwards cannot continue the old
/// bus and creates a new one; a subscriber resuming with the old bus's cursor is told
/// `resync-required` `*` with the true reason (it said "restart without a data directory").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_resuming_after_nats_lost_its_store_under_a_stopped_hub_is_told_why() {
    let pki = Pki::new();
    let mut js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url()];
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, None, &bus);
    let _agent = agent(&pki, "c1", &hub.url(), "synthetic:objects=20,rate=40,total=1000000", &[]);
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    let flowing = holds_within(Duration::from_secs(60), || {
        collector.seen.lock().unwrap().max_seq.get("c1").is_some_and(|s| *s > 20)
    })
    .await;
    assert!(flowing, "the agent's events do not reach the subscriber:\n{}", hub.proc.stderr());
    hub.proc.signal("KILL");
    assert!(hub.proc.wait_exit(Duration::from_secs(5)).is_some());
    js.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    hub = HubProc::start(&pki, port, None, &bus);
    let told = holds_within(Duration::from_secs(90), || {
        let seen = collector.seen.lock().unwrap();
        seen.resyncs
            .get("*")
            .is_some_and(|r| r.iter().any(|(_, why)| why.contains("the JetStream stream was recreated empty")))
    })
    .await;
    let resyncs = collector.seen.lock().unwrap().resyncs.clone();
    assert!(told, "no resync-required * with the true reason: {resyncs:?}\nhub:\n{}", hub.proc.stderr());
    assert!(
        !resyncs.values().flatten().any(|(_, why)| why.contains("restart without a data directory")),
        "{resyncs:?}"
    );
}

/// The stream recreated as another bus under a running replica (a hub started in the few
/// seconds before a running replica recreated it, or the stream deleted and created by
/// hand): the replica cannot continue (its offsets could repeat), so it exits with why and
/// a non-zero status, for its supervisor to start it again; started again it serves the new
/// bus, and events flow.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_exits_when_the_stream_becomes_another_bus_and_serves_it_when_started_again() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url()];
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, None, &bus);
    let _agent = agent(&pki, "c1", &hub.url(), "synthetic:objects=5,rate=20,total=1000000", &[]);
    let flowing = |collector: &Collector, above: u64| {
        collector.seen.lock().unwrap().max_seq.get("c1").is_some_and(|s| *s > above)
    };
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    assert!(holds_within(Duration::from_secs(60), || flowing(&collector, 5)).await, "{}", hub.proc.stderr());

    // Another bus takes the stream's place: deleted and created again with a fresh
    // description (the one a hub writes for a bus it begins).
    let js_ctx = async_nats::jetstream::new(async_nats::connect(js.url()).await.unwrap());
    let mut config = js_ctx.get_stream("fleetwatch").await.unwrap().info().await.unwrap().config.clone();
    js_ctx.delete_stream("fleetwatch").await.unwrap();
    config.description = Some("fleetwatch hub bus: one message per record, subject <stream>.<cluster>".into());
    js_ctx.create_stream(config).await.unwrap();

    let status = hub.proc.wait_exit(Duration::from_secs(60));
    let log = hub.proc.stderr();
    assert!(status.is_some_and(|s| s != 0), "the replica did not exit with a failure ({status:?}):\n{log}");
    assert!(log.contains("recreated by a hub that did not know bus"), "{log}");
    assert!(log.contains("the bus cannot work again in this process"), "{log}");

    // Its supervisor starts it again: it takes the stream as it finds it and events flow.
    let hub = HubProc::start(&pki, port, None, &bus);
    wait_ready(&hub, "not ready on the new bus").await;
    let collector = Collector::start(&pki, &hub.url(), "checker-2").await;
    let above = collector.seen.lock().unwrap().max_seq.get("c1").copied().unwrap_or(0);
    assert!(
        holds_within(Duration::from_secs(90), || flowing(&collector, above + 5)).await,
        "no events on the new bus:\n{}",
        hub.proc.stderr()
    );
}

/// A rolling upgrade of the hubs: two replicas on one JetStream stream, agents streaming and
/// a durable subscriber reading, each replica stopped (SIGTERM, as a rollout does) and
/// started again in turn while the load balancer sends clients to the other. Nothing is
/// lost, no cluster needs a resync beyond its agent's start, and the agents stream again
/// after each step (the times are printed: `--no-capture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_replicas_restarted_one_by_one_lose_nothing() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url(), "--bus-stream", "fleet"];
    let (pa, pb) = (free_port(), free_port());
    let mut a = HubProc::start(&pki, pa, None, &bus);
    let mut b = HubProc::start(&pki, pb, None, &bus);
    let to_agents = Balancer::start(pa).await;
    let to_subscriber = Balancer::start(pa).await;
    let spec = "synthetic:objects=40,rate=200,total=6000";
    let source: SyntheticSource = spec.parse().unwrap();
    let clusters = ["c1", "c2", "c3"];
    let _agents: Vec<_> = clusters.iter().map(|c| agent(&pki, c, &to_agents.url(), spec, &[])).collect();
    let collector = Collector::start(&pki, &to_subscriber.url(), "checker").await;
    let progress = |c: &Collector| -> Vec<u64> {
        let seen = c.seen.lock().unwrap();
        clusters.iter().map(|k| seen.max_seq.get(*k).copied().unwrap_or(0)).collect()
    };
    let flowing = holds_within(Duration::from_secs(60), || progress(&collector).iter().all(|s| *s > 200)).await;
    assert!(flowing, "agents did not stream through replica a:\n{}", a.proc.stderr());

    let started = Instant::now();
    let mut steps = Vec::new();
    for step in 0..2 {
        let (stop_port, other_port) = if step == 0 { (pa, pb) } else { (pb, pa) };
        let before = progress(&collector);
        let t = std::time::Instant::now();
        to_agents.switch(other_port);
        to_subscriber.switch(other_port);
        let stopping = if step == 0 { &mut a } else { &mut b };
        stopping.proc.signal("TERM");
        assert!(stopping.proc.wait_exit(Duration::from_secs(30)).is_some(), "the replica did not stop on SIGTERM");
        *stopping = HubProc::start(&pki, stop_port, None, &bus);
        // Every agent streams again, through the other replica.
        let again = holds_within(Duration::from_secs(60), || {
            let now = progress(&collector);
            now.iter().zip(&before).all(|(n, b)| *n > *b || *n == 6001)
        })
        .await;
        assert!(again, "agents did not stream again after step {step}: {:?} → {:?}", before, progress(&collector));
        steps.push(t.elapsed());
    }
    let done = holds_within(Duration::from_secs(120), || {
        missing_unless_resynced(&collector.seen.lock().unwrap(), &clusters, &source).is_empty()
    })
    .await;
    let seen = collector.seen.lock().unwrap();
    let left = missing_unless_resynced(&seen, &clusters, &source);
    assert!(done, "objects not delivered: {:?}\nhub a log:\n{}", &left[..5.min(left.len())], a.proc.stderr());
    let resyncs: usize = seen.resyncs.values().map(Vec::len).sum();
    for c in clusters {
        let r = seen.resyncs.get(c).cloned().unwrap_or_default();
        assert!(r.iter().all(|(_, why)| why == "agent started"), "cluster {c} resyncs: {r:?}");
    }
    assert!(only_first_subscription_resyncs(&seen), "{:?}", seen.resyncs);
    println!(
        "rolling upgrade: steps took {:?} (SIGTERM to every agent streaming again), all delivered {:?} after the first \
         step began; {} events, {resyncs} resync markers at the subscriber: {:?}",
        steps,
        started.elapsed(),
        seen.events,
        seen.resyncs
    );
}

/// Seed 2928 with real processes: a second agent process of a cluster appends through
/// another hub replica while the first is connected, idle, to this one. The first
/// process's session reads nothing from JetStream while idle; it learns of the other
/// process's records from the heads bucket the replicas follow, and stores a
/// `resync-required` after them (decision 0037).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_session_answers_a_second_agent_process_on_another_replica() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url(), "--bus-stream", "fleet"];
    let (pa, pb) = (free_port(), free_port());
    let a = HubProc::start(&pki, pa, None, &bus);
    let b = HubProc::start(&pki, pb, None, &bus);
    let spec = "synthetic:objects=5,rate=50,total=20";
    let _first = agent(&pki, "c1", &a.url(), spec, &[]);
    let collector = Collector::start(&pki, &a.url(), "checker").await;
    let all_in = holds_within(Duration::from_secs(60), || {
        collector.seen.lock().unwrap().max_seq.get("c1").is_some_and(|s| *s >= 21)
    })
    .await;
    assert!(all_in, "the first agent's events did not arrive:\n{}", a.proc.stderr());
    let peeks = async |hub: &HubProc| {
        sample(&http_get(hub.admin_port, "/metrics").await, "fleetwatch_hub_interleave_peeks_total")
    };
    assert_eq!(peeks(&a).await, Some(0.0), "nothing told the idle session to look");

    let _second = agent(&pki, "c1", &b.url(), spec, &[]);
    let answered = holds_within(Duration::from_secs(60), || {
        let seen = collector.seen.lock().unwrap();
        seen.resyncs
            .get("c1")
            .is_some_and(|r| r.iter().any(|(_, why)| why.contains("is connected to another hub replica")))
    })
    .await;
    assert!(
        answered,
        "no resync-required after the second process's records: {:?}\nhub a:\n{}\nhub b:\n{}",
        collector.seen.lock().unwrap().resyncs,
        a.proc.stderr(),
        b.proc.stderr()
    );
    assert!(peeks(&a).await.is_some_and(|n| n >= 1.0), "the session looked because it was told");
}
