//! Sessions under stress: idle agents keep their session, a second agent for a connected
//! cluster is refused, a subscriber that stops reading is disconnected and resumes from
//! its kept cursor, and bad frames (seq 0, non-UTF-8 text) get clear refusals.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_certs::TlsFiles;
use fleetwatch_client::transport::{ClientWs, connect};
use fleetwatch_protocol::codec::{Limits, decode_hub_to_agent, decode_hub_to_subscriber};
use fleetwatch_protocol::message::{ErrorCode, HubToAgent, HubToSubscriber};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::frame::Frame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::{Data, OpCode};

use crate::support::*;

async fn raw(files: &TlsFiles, port: u16) -> ClientWs {
    let tls = Arc::new(fleetwatch_certs::client_config(files).unwrap());
    let url = format!("wss://127.0.0.1:{port}").parse().unwrap();
    connect(&url, tls, &Limits { max_message_bytes: 64 << 20, ..Limits::default() }, Duration::from_secs(10))
        .await
        .unwrap()
}

/// The next text message, or the close code (`Err`) when the hub closed.
async fn next_text(ws: &mut ClientWs) -> Result<String, String> {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Err(_) => return Err("timeout".into()),
            Ok(Some(Ok(Message::Text(t)))) => return Ok(t.to_string()),
            Ok(Some(Ok(Message::Close(Some(f))))) => return Err(format!("close {}", u16::from(f.code))),
            Ok(Some(Ok(Message::Close(None)))) => return Err("close 1005".into()),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Err(format!("gone: {e}")),
            Ok(None) => return Err("gone: eof".into()),
        }
    }
}

async fn welcome(ws: &mut ClientWs, cluster: &str) {
    let hello = format!(r#"{{"type":"hello","protocol":1,"agentVersion":"t","cluster":"{cluster}","epoch":7}}"#);
    ws.send(Message::text(hello)).await.unwrap();
    let t = next_text(ws).await.unwrap();
    assert!(matches!(decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap(), HubToAgent::Welcome(_)), "{t}");
}

/// The hub's fatal error frame and then its close code.
async fn refusal(ws: &mut ClientWs) -> (ErrorCode, String, String) {
    let t = next_text(ws).await.expect("an error frame");
    let (code, msg) = match decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap() {
        HubToAgent::Error(e) if e.fatal => (e.code, e.message),
        other => panic!("expected a fatal error, got {other:?}"),
    };
    let close = loop {
        match next_text(ws).await {
            Ok(_) => continue,
            Err(c) => break c,
        }
    };
    (code, msg, close)
}

fn cluster(v: &serde_json::Value, id: &str) -> serde_json::Value {
    v["clusters"].as_array().and_then(|c| c.iter().find(|c| c["cluster"] == id)).cloned().unwrap_or_default()
}

/// The value of a metric line `name value` (0 when absent).
fn metric(text: &str, name: &str) -> f64 {
    text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok())).unwrap_or(0.0)
}

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_agent_keeps_one_session() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--idle-timeout", "3"]);
    // Four changes, then silence.
    let agent = agent(&pki, "quiet", &hub.url(), "synthetic:objects=2,rate=20,total=4", &["--idle-timeout", "3"]);
    let settled = holds_within(Duration::from_secs(30), || {
        let c = cluster(&block(hub.clusters()), "quiet");
        c["connected"] == true && c["ackedSeq"].as_u64() >= Some(5)
    })
    .await;
    assert!(settled, "{}\n{}", hub.clusters().await, agent.stderr());
    // The hub pings every second (a third of its idle timeout): wait, by the hub's own
    // count, for a dozen pings, i.e. at least three idle periods of both ends.
    let start = metric(&http_get(hub.admin_port, "/metrics").await, "fleetwatch_hub_agent_pings_total");
    let idle_periods_passed = holds_within(Duration::from_secs(120), || {
        metric(&block(http_get(hub.admin_port, "/metrics")), "fleetwatch_hub_agent_pings_total") >= start + 12.0
    })
    .await;
    assert!(idle_periods_passed, "{}", http_get(hub.admin_port, "/metrics").await);
    let c = cluster(&hub.clusters().await, "quiet");
    assert_eq!(c["connected"], true, "{c}");
    assert_eq!(c["sessions"], 1, "the idle agent reconnected: {c}\n{}", agent.stderr());
    assert!(!agent.stderr().contains("connection to hub lost"), "{}", agent.stderr());
}

/// The value of one sample line `series value` exactly (`None` when absent).
fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Issue 27: an idle cluster whose agent answers the hub's pings is seen, in
/// `/api/v1/clusters` (hence the web view and `fleetwatch status`) and in
/// `fleetwatch_hub_cluster_last_seen_timestamp_seconds` (hence `FleetwatchClusterNotSeen`):
/// its last-seen keeps moving with no event sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_clusters_last_seen_follows_its_pongs() {
    let pki = Pki::new();
    // Pings every second.
    let hub = HubProc::start(&pki, free_port(), None, &["--idle-timeout", "3"]);
    // Four changes, then silence.
    let agent = agent(&pki, "idle", &hub.url(), "synthetic:objects=2,rate=20,total=4", &["--idle-timeout", "3"]);
    let settled = holds_within(Duration::from_secs(30), || {
        let c = cluster(&block(hub.clusters()), "idle");
        c["connected"] == true && c["ackedSeq"].as_u64() >= Some(5)
    })
    .await;
    assert!(settled, "{}\n{}", hub.clusters().await, agent.stderr());
    let c = cluster(&hub.clusters().await, "idle");
    let at = |c: &serde_json::Value| c["lastSeen"].as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok());
    let first = at(&c).unwrap_or_else(|| panic!("no lastSeen: {c}"));
    let acked = c["ackedSeq"].clone();
    // Four ping rounds later, by the hub's own count, with no event: both views moved on
    // by more than three seconds (without pongs counting, they stay at the last event).
    let series = "fleetwatch_hub_cluster_last_seen_timestamp_seconds{runtime_cluster=\"idle\"}";
    let first_secs = first.as_millisecond() as f64 / 1000.0;
    let moved = holds_within(Duration::from_secs(90), || {
        let c = cluster(&block(hub.clusters()), "idle");
        let api = at(&c).is_some_and(|t| t.duration_since(first) > jiff::SignedDuration::from_secs(3));
        let metric = sample(&block(http_get(hub.admin_port, "/metrics")), series).is_some_and(|v| v > first_secs + 3.0);
        api && metric
    })
    .await;
    let c = cluster(&hub.clusters().await, "idle");
    let text = http_get(hub.admin_port, "/metrics").await;
    assert!(moved, "last-seen did not follow the pongs: first {first}, now {c}\n{:?}", sample(&text, series));
    assert_eq!(c["ackedSeq"], acked, "an event arrived meanwhile: the cluster was not idle: {c}");
    assert_eq!(c["sessions"], 1, "{c}\n{}", agent.stderr());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_agent_for_a_connected_cluster_is_refused() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    let first = agent(&pki, "dup", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let connected =
        holds_within(Duration::from_secs(20), || cluster(&block(hub.clusters()), "dup")["connected"] == true).await;
    assert!(connected, "{}", first.stderr());
    let session = cluster(&hub.clusters().await, "dup")["session"].clone();

    // The same cluster id from a second process (another epoch): refused, the first stays.
    let second = agent(&pki, "dup", &hub.url(), "synthetic:objects=5,rate=20", &[]);
    let refused = holds_within(Duration::from_secs(20), || second.stderr().contains("cluster-already-connected")).await;
    assert!(refused, "{}", second.stderr());
    let log = second.stderr();
    assert!(log.contains("\"dup\" is already connected from 127.0.0.1:"), "{log}");
    assert!(log.contains("30s"), "the refused agent must back off 30 s: {log}");

    // No ping-pong: the first agent keeps streaming in its one session while the second waits.
    let before = collector.seen.lock().unwrap().max_seq.get("dup").copied().unwrap_or(0);
    let flowing = holds_within(Duration::from_secs(20), || {
        collector.seen.lock().unwrap().max_seq.get("dup").copied().unwrap_or(0) > before + 40
    })
    .await;
    assert!(flowing, "{}", first.stderr());
    let c = cluster(&hub.clusters().await, "dup");
    assert_eq!(c["session"], session, "{c}");
    assert_eq!(c["sessions"], 1, "{c}");
    // At least the one refusal (a very slow machine may see its retry after 30 s too).
    assert!(c["conflicts"].as_u64() >= Some(1), "{c}");
    assert!(c["lastConflictFrom"].as_str().is_some_and(|a| a.starts_with("127.0.0.1:")), "{c}");
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(metric(&metrics, "fleetwatch_hub_cluster_conflicts_total") >= 1.0, "{metrics}");
    assert!(!first.stderr().contains("replaced"), "{}", first.stderr());
    // Only the first agent's start marker: the refused attempt recorded none.
    let resyncs = collector.seen.lock().unwrap().resyncs.get("dup").cloned().unwrap_or_default();
    assert_eq!(resyncs.len(), 1, "{resyncs:?}");
    assert!(resyncs[0].1.contains("agent started"), "{resyncs:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn seq_zero_and_non_utf8_text_are_refused_with_a_reason() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);

    // seq 0: refused (seqs start at 1), not acked and silently dropped.
    let mut ws = raw(&pki.agent("zero"), hub.port).await;
    welcome(&mut ws, "zero").await;
    let ev = r#"{"specversion":"1.0","id":"x","source":"x","type":"dev.fleetwatch.object.applied","subject":"v1/ConfigMap/ns/a","time":"2026-01-01T00:00:00Z","cluster":"zero","epoch":7,"seq":0,"data":{}}"#;
    ws.send(Message::text(format!(r#"{{"type":"events","events":[{ev}]}}"#))).await.unwrap();
    let (code, msg, close) = refusal(&mut ws).await;
    assert_eq!(code, ErrorCode::BadSequence, "{msg}");
    assert!(msg.contains("seq 0"), "{msg}");
    assert_eq!(close, "close 1008");

    // A text frame that is not UTF-8: an error frame and close 1007, not a reset.
    let mut ws = raw(&pki.agent("bytes"), hub.port).await;
    welcome(&mut ws, "bytes").await;
    let bad = Frame::message(vec![b'{', 0xff, 0xfe, b'}'], OpCode::Data(Data::Text), true);
    ws.send(Message::Frame(bad)).await.unwrap();
    let (code, msg, close) = refusal(&mut ws).await;
    assert_eq!(code, ErrorCode::Malformed, "{msg}");
    assert!(msg.contains("UTF-8"), "{msg}");
    assert_eq!(close, "close 1007");
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(metrics.contains("reason=\"invalid-frame\""), "{metrics}");
    assert!(metrics.contains("reason=\"seq-zero\""), "{metrics}");
}

/// Subscribes as `name`/collector from the earliest event, reads the first events frame,
/// acks it and returns the socket (not read any more) and the acked cursor.
async fn subscribe_and_ack_once(pki: &Pki, port: u16, name: &str, max_in_flight: u32) -> (ClientWs, u64) {
    let mut ws = raw(&pki.subscriber(name), port).await;
    let sub =
        format!(r#"{{"type":"subscribe","durable":"collector","from":"earliest","max_in_flight":{max_in_flight}}}"#);
    ws.send(Message::text(sub)).await.unwrap();
    loop {
        let t = next_text(&mut ws).await.unwrap();
        if let HubToSubscriber::Events(b) = decode_hub_to_subscriber(t.as_bytes(), &Limits::default()).unwrap()
            && let Some(cursor) = b.events.last().and_then(|e| e.cursor)
        {
            ws.send(Message::text(format!(r#"{{"type":"ack","cursor":{cursor}}}"#))).await.unwrap();
            return (ws, cursor);
        }
    }
}

/// After a stall the same durable name resumes right after the cursor it acked.
async fn resumes_after(pki: &Pki, hub: &HubProc, name: &str, acked: u64) {
    let collector = Collector::start(pki, &hub.url(), name).await;
    let got = holds_within(Duration::from_secs(30), || collector.seen.lock().unwrap().events > 10).await;
    assert!(got, "the reconnected subscriber got nothing\n{}", hub.proc.stderr());
    let first = collector.seen.lock().unwrap().all.iter().filter_map(|e| e.cursor).min().unwrap();
    assert_eq!(first, acked + 1, "did not resume from the kept cursor {acked}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_reading_is_disconnected_and_keeps_its_cursor() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--subscriber-stall-timeout", "2"]);
    let _agent = agent(&pki, "busy", &hub.url(), "synthetic:objects=200,rate=1000,payload=2000", &[]);
    // A window large enough that the socket, not the window, blocks the hub's sends.
    let (ws, acked) = subscribe_and_ack_once(&pki, hub.port, "stuck", 100_000).await;
    let stalled = holds_within(Duration::from_secs(90), || {
        metric(&block(http_get(hub.admin_port, "/metrics")), "fleetwatch_hub_subscriber_stalls_total") >= 1.0
    })
    .await;
    assert!(stalled, "a subscriber that stopped reading was not disconnected\n{}", hub.proc.stderr());
    let log = hub.proc.stderr();
    assert!(log.contains("subscriber stalled: a send did not complete") && log.contains("stuck"), "{log}");
    drop(ws);
    resumes_after(&pki, &hub, "stuck", acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_that_stops_acking_is_disconnected_and_keeps_its_cursor() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--subscriber-stall-timeout", "2"]);
    let _agent = agent(&pki, "steady", &hub.url(), "synthetic:objects=20,rate=100", &[]);
    // A small window: it fills at once and is never acked again.
    let (mut ws, acked) = subscribe_and_ack_once(&pki, hub.port, "lazy", 20).await;
    let reason = loop {
        match next_text(&mut ws).await {
            Ok(t) => {
                if let Ok(HubToSubscriber::Error(e)) = decode_hub_to_subscriber(t.as_bytes(), &Limits::default()) {
                    break e.message;
                }
            }
            Err(c) => panic!("closed without a reason ({c})\n{}", hub.proc.stderr()),
        }
    };
    assert!(reason.contains("stalled") && reason.contains(&format!("cursor {acked}")), "{reason}");
    drop(ws);
    resumes_after(&pki, &hub, "lazy", acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resyncs_are_rate_limited_coalesced_and_their_reasons_cut() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--max-events-per-sec", "10"]);
    let mut ws = raw(&pki.agent("flappy"), hub.port).await;
    welcome(&mut ws, "flappy").await;
    // Seven resyncs in a row with a 5,000-byte reason, nothing in between: two more than
    // the burst of five.
    let reason = "r".repeat(5000);
    for seq in 1..=7 {
        let msg = format!(r#"{{"type":"resync","epoch":7,"seq":{seq},"reason":"{reason}"}}"#);
        ws.send(Message::text(msg)).await.unwrap();
    }
    let mut acked = 0;
    while acked < 7 {
        let t = next_text(&mut ws).await.unwrap();
        if let HubToAgent::Ack(a) = decode_hub_to_agent(t.as_bytes(), &Limits::default()).unwrap() {
            acked = a.seq;
        }
    }
    let metrics = http_get(hub.admin_port, "/metrics").await;
    // Stored once; the six others acked without storing (no subscriber has read the first
    // yet: the subscriber starts only now), and the last ones throttled.
    assert_eq!(metric(&metrics, "fleetwatch_hub_resyncs_coalesced_total"), 6.0, "{metrics}");
    assert!(metric(&metrics, "fleetwatch_hub_throttled_seconds_total") > 0.0, "{metrics}");
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    // An event after them, then one more resync: that one is stored (the head moved on).
    let ev = r#"{"specversion":"1.0","id":"x","source":"x","type":"dev.fleetwatch.object.applied","subject":"v1/ConfigMap/ns/a","time":"2026-01-01T00:00:00Z","cluster":"flappy","epoch":7,"seq":8,"data":{"generation":1}}"#;
    ws.send(Message::text(format!(r#"{{"type":"events","events":[{ev}]}}"#))).await.unwrap();
    ws.send(Message::text(r#"{"type":"resync","epoch":7,"seq":9,"reason":"relist"}"#)).await.unwrap();
    let both = holds_within(Duration::from_secs(30), || {
        collector.seen.lock().unwrap().resyncs.get("flappy").is_some_and(|r| r.len() >= 2)
    })
    .await;
    let seen = collector.seen.lock().unwrap();
    assert!(both, "{:?}", seen.resyncs);
    let r = &seen.resyncs["flappy"];
    assert_eq!(r.len(), 2, "{r:?}");
    assert!(r[0].1.len() <= 1024 && r[0].1.starts_with("rrrr"), "reason of {} bytes", r[0].1.len());
    assert_eq!(r[1].1, "relist");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_cuts_events_over_the_size_limit_instead_of_losing_its_session() {
    // Every event carries a 70,000-byte payload: over the default 64 KiB per-event limit.
    cut_events(&[], 70_000).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_follows_a_lower_event_size_limit_of_the_hub() {
    // 20,000 bytes fit the agent's default limit, not this hub's: the agent learns the
    // hub's limit at welcome.
    cut_events(&["--max-event-bytes", "16384"], 20_000).await;
}

async fn cut_events(hub_args: &[&str], payload: usize) {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, hub_args);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    let source = format!("synthetic:objects=3,rate=20,total=30,payload={payload}");
    let agent = agent(&pki, "fat", &hub.url(), &source, &[]);
    let all = holds_within(Duration::from_secs(30), || {
        collector.seen.lock().unwrap().max_seq.get("fat").copied().unwrap_or(0) >= 31
    })
    .await;
    assert!(all, "{}\n{}", agent.stderr(), hub.proc.stderr());
    {
        let seen = collector.seen.lock().unwrap();
        for e in seen.all.iter().filter(|e| e.cluster == "fat") {
            assert_eq!(e.data["truncated"], true, "{}", e.data);
            assert!(e.data["generation"].as_u64().is_some(), "{}", e.data);
            assert!(e.data.get("payload").is_none());
        }
    }
    let c = cluster(&hub.clusters().await, "fat");
    assert_eq!(c["sessions"], 1, "{c}");
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(!metrics.contains("event-too-large"), "{metrics}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_filtering_subscriber_that_acks_what_it_gets_is_not_stalled() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--subscriber-stall-timeout", "2"]);
    let _busy = agent(&pki, "busy", &hub.url(), "synthetic:objects=50,rate=300", &[]);
    let _quiet = agent(&pki, "quiet", &hub.url(), "synthetic:objects=1,rate=3", &[]);
    // Only "quiet", with a window of 5: the busy cluster's records it never sees (and
    // cannot ack) must not count against it.
    let mut ws = raw(&pki.subscriber("picky"), hub.port).await;
    let sub = r#"{"type":"subscribe","durable":"d","clusters":["quiet"],"from":"earliest","max_in_flight":5}"#;
    ws.send(Message::text(sub)).await.unwrap();
    let mut quiet_events = 0;
    while quiet_events < 15 {
        let t = next_text(&mut ws).await.unwrap_or_else(|c| panic!("{c}\n{}", hub.proc.stderr()));
        let cursor = match decode_hub_to_subscriber(t.as_bytes(), &Limits::default()).unwrap() {
            HubToSubscriber::Events(b) => {
                assert!(b.events.iter().all(|e| e.cluster == "quiet"));
                quiet_events += b.events.len();
                b.events.last().and_then(|e| e.cursor)
            }
            HubToSubscriber::ResyncRequired(r) => Some(r.cursor),
            HubToSubscriber::Error(e) => panic!("{}", e.message),
            HubToSubscriber::Subscribed(_) => None,
        };
        if let Some(c) = cursor {
            ws.send(Message::text(format!(r#"{{"type":"ack","cursor":{c}}}"#))).await.unwrap();
        }
    }
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert_eq!(metric(&metrics, "fleetwatch_hub_subscriber_stalls_total"), 0.0, "{metrics}");
}
