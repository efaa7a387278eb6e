//! Identity and limits, with raw protocol clients over real mTLS against a hub process.

use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetwatch_certs::{LeafSpec, TlsFiles};
use fleetwatch_client::transport::{ClientWs, connect};
use fleetwatch_protocol::codec::{Limits, decode_hub_to_agent, decode_hub_to_subscriber};
use fleetwatch_protocol::message::{ErrorCode, HubToAgent, HubToSubscriber};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

pub(crate) async fn raw(files: &TlsFiles, port: u16) -> Result<ClientWs, String> {
    let tls = Arc::new(fleetwatch_certs::client_config(files).map_err(|e| e.to_string())?);
    let url = format!("wss://127.0.0.1:{port}").parse().unwrap();
    connect(&url, tls, &Limits { max_message_bytes: 64 << 20, ..Limits::default() }, Duration::from_secs(5))
        .await
        .map_err(|e| e.to_string())
}

/// What the hub sent: text messages, then the close code (if any).
enum Got {
    Text(String),
    Close(u16, String),
    Gone(String),
}

async fn next(ws: &mut ClientWs) -> Got {
    loop {
        match tokio::time::timeout(Duration::from_secs(10), ws.next()).await {
            Err(_) => return Got::Gone("timeout".into()),
            Ok(Some(Ok(Message::Text(t)))) => return Got::Text(t.to_string()),
            Ok(Some(Ok(Message::Close(Some(f))))) => return Got::Close(f.code.into(), f.reason.to_string()),
            Ok(Some(Ok(Message::Close(None)))) => return Got::Close(1005, String::new()),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Got::Gone(e.to_string()),
            Ok(None) => return Got::Gone("eof".into()),
        }
    }
}

pub(crate) async fn expect_agent_error(ws: &mut ClientWs) -> (ErrorCode, String, bool) {
    match next(ws).await {
        Got::Text(t) => match decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap() {
            HubToAgent::Error(e) => (e.code, e.message, e.fatal),
            other => panic!("expected an error, got {other:?}"),
        },
        Got::Close(c, r) => panic!("expected an error frame, got close {c} {r}"),
        Got::Gone(why) => panic!("expected an error frame, connection gone: {why}"),
    }
}

async fn expect_close(ws: &mut ClientWs) -> u16 {
    loop {
        match next(ws).await {
            Got::Text(_) => continue,
            Got::Close(c, _) => return c,
            Got::Gone(why) => panic!("expected a close frame: {why}"),
        }
    }
}

fn hello(cluster: &str, epoch: u64) -> String {
    format!(
        r#"{{"type":"hello","protocol":1,"agentVersion":"t","cluster":"{cluster}","epoch":{epoch},"last_acked_seq":0}}"#
    )
}

fn event(cluster: &str, epoch: u64, seq: u64) -> String {
    format!(
        r#"{{"specversion":"1.0","id":"x","source":"x","type":"dev.fleetwatch.object.applied","subject":"v1/ConfigMap/ns/a","time":"2026-01-01T00:00:00Z","cluster":"{cluster}","epoch":{epoch},"seq":{seq},"data":{{"generation":{seq}}}}}"#
    )
}

pub(crate) async fn welcome(ws: &mut ClientWs, cluster: &str) {
    ws.send(Message::text(hello(cluster, 7))).await.unwrap();
    match next(ws).await {
        Got::Text(t) => assert!(
            matches!(decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap(), HubToAgent::Welcome(_)),
            "{t}"
        ),
        _ => panic!("no welcome"),
    }
}

async fn ack_of(ws: &mut ClientWs) -> u64 {
    loop {
        match next(ws).await {
            Got::Text(t) => match decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap() {
                HubToAgent::Ack(a) => return a.seq,
                _ => continue,
            },
            other => panic!(
                "no ack: {}",
                match other {
                    Got::Close(c, r) => format!("close {c} {r}"),
                    Got::Gone(w) => w,
                    _ => String::new(),
                }
            ),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn identity_comes_from_the_certificate_only() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);

    // An agent certificate cannot subscribe.
    let mut ws = raw(&pki.agent("a1"), hub.port).await.unwrap();
    ws.send(Message::text(r#"{"type":"subscribe","from":"earliest"}"#)).await.unwrap();
    let (code, msg, fatal) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::Forbidden, "{msg}");
    assert!(msg.contains("cannot subscribe"), "{msg}");
    assert!(fatal);
    assert_eq!(expect_close(&mut ws).await, 1008);

    // A subscriber certificate cannot publish.
    let mut ws = raw(&pki.subscriber("s1"), hub.port).await.unwrap();
    ws.send(Message::text(hello("a1", 1))).await.unwrap();
    match next(&mut ws).await {
        Got::Text(t) => match decode_hub_to_subscriber(t.as_bytes(), &Limits::default()).unwrap() {
            HubToSubscriber::Error(e) => {
                assert_eq!(e.code, ErrorCode::Forbidden);
                assert!(e.message.contains("cannot publish"), "{}", e.message);
            }
            other => panic!("{other:?}"),
        },
        _ => panic!("expected an error frame"),
    }

    // A hello claiming another cluster is rejected.
    let mut ws = raw(&pki.agent("a2"), hub.port).await.unwrap();
    ws.send(Message::text(hello("someone-else", 1))).await.unwrap();
    let (code, msg, _) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::IdentityMismatch, "{msg}");
    assert_eq!(expect_close(&mut ws).await, 1008);

    // So is an event claiming another cluster.
    let mut ws = raw(&pki.agent("a3"), hub.port).await.unwrap();
    welcome(&mut ws, "a3").await;
    ws.send(Message::text(format!(r#"{{"type":"events","events":[{}]}}"#, event("a4", 7, 1)))).await.unwrap();
    let (code, _, _) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::IdentityMismatch);

    // A certificate from another CA fails the TLS handshake.
    let other = Pki::new();
    let mut foreign = other.agent("a1");
    foreign.ca = vec![pki.path("ca.crt")]; // it trusts our hub, we don't trust it
    let result = match raw(&foreign, hub.port).await {
        Err(e) => Err(e),
        Ok(mut ws) => {
            // TLS 1.3: the client may finish first; the hub's alert arrives on first read.
            let _ = ws.send(Message::text(hello("a1", 1))).await;
            match next(&mut ws).await {
                Got::Text(t) => Ok(t),
                Got::Close(c, r) => Err(format!("{c} {r}")),
                Got::Gone(e) => Err(e),
            }
        }
    };
    let err = result.expect_err("a foreign certificate must not get through");
    assert!(err.to_lowercase().contains("certificate") || err.to_lowercase().contains("alert"), "{err}");

    // A certificate of our CA without a fleetwatch identity is refused.
    let (cert, key) = plain_cert(&pki);
    let files = TlsFiles { cert, key, ca: vec![pki.path("ca.crt")] };
    let mut ws = raw(&files, hub.port).await.unwrap();
    let (code, msg, _) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::Forbidden);
    assert!(msg.contains("SPIFFE"), "{msg}");

    // The hub survived all of that and still serves a good agent.
    let mut ws = raw(&pki.agent("good"), hub.port).await.unwrap();
    welcome(&mut ws, "good").await;
    ws.send(Message::text(format!(r#"{{"type":"events","events":[{}]}}"#, event("good", 7, 1)))).await.unwrap();
    assert_eq!(ack_of(&mut ws).await, 1);
}

/// A client certificate signed by the CA but carrying no SPIFFE id.
fn plain_cert(pki: &Pki) -> (std::path::PathBuf, std::path::PathBuf) {
    let key_pem = std::fs::read_to_string(pki.path("ca.key")).unwrap();
    let ca_key = rcgen::KeyPair::from_pem(&key_pem).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.path("ca.crt")).unwrap(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["plain.example".to_string()]).unwrap();
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k) = (pki.path("plain.crt"), pki.path("plain.key"));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    let _ = LeafSpec::Hub { dns: vec![], ips: vec![] };
    (c, k)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gets_clear_errors_and_never_stalls_the_hub() {
    let pki = Pki::new();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--max-message-bytes", "65536", "--handshake-timeout", "1", "--max-events-per-sec", "200"],
    );
    // A well-behaved agent streams throughout.
    let good = agent(&pki, "steady", &hub.url(), "synthetic:objects=10,rate=50", &[]);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;

    // Slow handshake: a TCP connection that never starts TLS is closed after the timeout.
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(("127.0.0.1", hub.port)).await.unwrap();
    let mut buf = [0u8; 16];
    let n = tokio::time::timeout(Duration::from_secs(10), tokio::io::AsyncReadExt::read(&mut tcp, &mut buf)).await;
    assert!(matches!(n, Ok(Ok(0)) | Ok(Err(_))), "expected the hub to close a silent connection");
    assert!(started.elapsed() >= Duration::from_millis(900));

    // Oversized frame: close code 1009.
    let mut ws = raw(&pki.agent("big"), hub.port).await.unwrap();
    welcome(&mut ws, "big").await;
    let _ = ws.send(Message::text("x".repeat(200_000))).await;
    assert_eq!(expect_close(&mut ws).await, 1009);

    // Malformed JSON: an error frame, then close code 1007.
    let mut ws = raw(&pki.agent("junk"), hub.port).await.unwrap();
    welcome(&mut ws, "junk").await;
    ws.send(Message::text("{\"type\":\"events\",\"events\":[")).await.unwrap();
    let (code, _, fatal) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::Malformed);
    assert!(fatal);
    assert_eq!(expect_close(&mut ws).await, 1007);

    // Unknown type: an error frame, and the session goes on.
    let mut ws = raw(&pki.agent("future"), hub.port).await.unwrap();
    welcome(&mut ws, "future").await;
    ws.send(Message::text(r#"{"type":"teleport","to":"mars"}"#)).await.unwrap();
    let (code, msg, fatal) = expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::UnknownType, "{msg}");
    assert!(!fatal);

    // Too many events per second: acks are delayed, with a notice; nothing is dropped.
    let started = Instant::now();
    let mut seq = 0;
    for _ in 0..4 {
        let events: Vec<String> = (0..150)
            .map(|_| {
                seq += 1;
                event("future", 7, seq)
            })
            .collect();
        ws.send(Message::text(format!(r#"{{"type":"events","events":[{}]}}"#, events.join(",")))).await.unwrap();
    }
    let mut notice = false;
    let mut acked = 0;
    while acked < 600 {
        match next(&mut ws).await {
            Got::Text(t) => match decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap() {
                HubToAgent::Ack(a) => acked = a.seq,
                HubToAgent::Error(e) if e.code == ErrorCode::RateLimited => notice = true,
                other => panic!("{other:?}"),
            },
            _ => panic!("connection lost while throttled"),
        }
    }
    assert!(notice, "no rate-limited notice");
    // 600 events at 200/s with a 200-event burst take at least 2 s.
    assert!(started.elapsed() >= Duration::from_millis(1900), "{:?}", started.elapsed());

    // Meanwhile the steady agent kept flowing.
    let before = collector.seen.lock().unwrap().max_seq.get("steady").copied().unwrap_or(0);
    assert!(
        holds_within(Duration::from_secs(10), || collector
            .seen
            .lock()
            .unwrap()
            .max_seq
            .get("steady")
            .copied()
            .unwrap_or(0)
            > before + 20)
        .await,
        "steady agent stalled\n{}",
        good.stderr()
    );
    let metrics = http_get(hub.admin_port, "/metrics").await;
    for reason in ["handshake-timeout", "too-large", "malformed", "unknown-type"] {
        assert!(metrics.contains(&format!("reason=\"{reason}\"")), "metric for {reason} missing:\n{metrics}");
    }
}

/// CA rotation without a restart: the hub reloads its client CA bundle from disk.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_reloads_its_client_ca_bundle_without_a_restart() {
    let pki = Pki::new();
    let next_ca = Pki::new(); // the CA we rotate to
    let bundle = pki.path("bundle.crt");
    std::fs::copy(pki.path("ca.crt"), &bundle).unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--client-ca", bundle.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let mut rotated = next_ca.agent("r1");
    rotated.ca = vec![pki.path("ca.crt")];
    let refused = match raw(&rotated, hub.port).await {
        Err(_) => true,
        Ok(mut ws) => {
            let _ = ws.send(Message::text(hello("r1", 7))).await;
            !matches!(next(&mut ws).await, Got::Text(_))
        }
    };
    assert!(refused, "an agent of the new CA got in before the bundle changed");
    // The bundle gains the new CA: both CAs are trusted during the rotation.
    let both = std::fs::read_to_string(pki.path("ca.crt")).unwrap()
        + &std::fs::read_to_string(next_ca.path("ca.crt")).unwrap();
    std::fs::write(&bundle, both).unwrap();
    eventually("the hub to pick up the new CA bundle (an agent of the new CA welcomed)")
        .context(|| hub.proc.stderr())
        .until(
            async || {
                let Ok(mut ws) = raw(&rotated, hub.port).await else { return false };
                let _ = ws.send(Message::text(hello("r1", 7))).await;
                matches!(next(&mut ws).await, Got::Text(t) if t.contains("welcome"))
            },
            |welcomed| *welcomed,
        )
        .await;
    assert!(hub.proc.stderr().contains("reloaded TLS certificates"));
}

/// Revocation: a deny list entry refuses the certificate and closes its live session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn revoked_certificates_are_refused_and_their_sessions_closed() {
    let pki = Pki::new();
    let deny = pki.path("deny-list");
    // An empty list is fine; a missing one is a start-up error (fail closed).
    std::fs::write(&deny, "").unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--deny-list", deny.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let mut a = crate::support::agent(&pki, "rev", &hub.url(), "synthetic:objects=5,rate=50", &[]);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    assert!(
        holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().events > 20).await,
        "{}",
        a.stderr()
    );

    // Revoke the agent's certificate by serial, as `certs inspect` prints it.
    let serial = fleetwatch_certs::inspect_file(&pki.issued("agent-rev.crt")).unwrap().serial;
    std::fs::write(&deny, format!("# revoked today\n{serial}\n")).unwrap();
    let closed = holds_within(Duration::from_secs(5), || {
        let v = futures_block(hub.clusters());
        v["clusters"]
            .as_array()
            .and_then(|c| c.iter().find(|c| c["cluster"] == "rev"))
            .is_some_and(|c| c["connected"] == false)
    })
    .await;
    assert!(closed, "revoked agent still connected: {}", hub.clusters().await);
    assert!(holds_within(Duration::from_secs(5), || a.stderr().contains("revoked")).await, "{}", a.stderr());
    // It stays out (the agent keeps running and retrying; the hub keeps refusing): once the
    // hub has refused a connection made after the close, the agent is still not connected.
    const REFUSED: &str = "fleetwatch_hub_handshake_failures_total{reason=\"revoked\"}";
    let refused_before = sample(&http_get(hub.admin_port, "/metrics").await, REFUSED).unwrap_or(0.0);
    eventually("the hub to refuse the revoked agent's next attempt")
        .context(|| a.stderr())
        .until(
            async || sample(&http_get(hub.admin_port, "/metrics").await, REFUSED),
            |n| n.is_some_and(|n| n > refused_before),
        )
        .await;
    let v = hub.clusters().await;
    assert_eq!(v["clusters"][0]["connected"], false, "{v}");
    assert_eq!(a.wait_exit(Duration::from_millis(50)), None);

    // Revoke the subscriber by identity: its session is closed too.
    std::fs::write(&deny, format!("{serial}\nspiffe://test.local/subscriber/watch\n")).unwrap();
    let gone = holds_within(Duration::from_secs(5), || {
        futures_block(http_get(hub.admin_port, "/metrics")).contains("fleetwatch_hub_subscriber_sessions 0")
    })
    .await;
    assert!(gone, "{}", http_get(hub.admin_port, "/metrics").await);
    // Its reconnects are refused at the door.
    let refused = holds_within(Duration::from_secs(5), || {
        futures_block(http_get(hub.admin_port, "/metrics")).contains("reason=\"revoked\"")
    })
    .await;
    assert!(refused, "{}", http_get(hub.admin_port, "/metrics").await);
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}
