//! SIGTERM: hub and agent stop gracefully, in-flight batches acked or kept.

use std::time::Duration;

use crate::support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_sigterm_flushes_everything_it_accepted() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    let mut a = agent(&pki, "t1", &hub.url(), "synthetic:objects=500,rate=5000", &[]);
    assert!(
        holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().events > 1000).await,
        "{}",
        a.stderr()
    );
    a.signal("TERM");
    assert_eq!(a.wait_exit(Duration::from_secs(10)), Some(0), "{}", a.stderr());
    let line = a.wait_stdout("agent stopped", Duration::from_secs(1));
    let field = |k: &str| -> u64 {
        line.split_whitespace().find_map(|p| p.strip_prefix(&format!("{k}="))).unwrap().parse().unwrap()
    };
    let (last, acked) = (field("last_seq"), field("acked_seq"));
    assert_eq!(last, acked, "agent exited with unacked events: {line}");
    // And the subscriber got the last one.
    assert!(
        holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().max_seq.get("t1").copied()
            == Some(last))
        .await,
        "subscriber saw {:?}, agent's last seq {last}",
        collector.seen.lock().unwrap().max_seq.get("t1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_sigterm_keeps_every_acked_event() {
    let pki = Pki::new();
    let data = pki.path("data");
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, Some(&data), &[]);
    let spec = "synthetic:objects=30,rate=300,total=2400";
    let source: fleetwatch_agent::source::SyntheticSource = spec.parse().unwrap();
    let _a = agent(&pki, "g1", &hub.url(), spec, &[]);
    let collector = Collector::start(&pki, &hub.url(), "watch").await;
    assert!(holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().events > 300).await);
    hub.proc.signal("TERM");
    assert_eq!(hub.proc.wait_exit(Duration::from_secs(10)), Some(0), "{}", hub.proc.stderr());
    assert!(hub.proc.stderr().contains("hub stopped"), "{}", hub.proc.stderr());
    hub = HubProc::start(&pki, port, Some(&data), &[]);
    let complete = |seen: &Seen| {
        (0..source.objects).all(|n| {
            seen.generation.get(&("g1".to_string(), synthetic_subject(n))).copied() == source.final_generation(n)
        })
    };
    assert!(
        holds_within(Duration::from_secs(30), || complete(&collector.seen.lock().unwrap())).await,
        "{}",
        hub.proc.stderr()
    );
    let seen = collector.seen.lock().unwrap();
    assert_eq!(seen.resyncs.get("g1").map(Vec::len), Some(1), "{:?}", seen.resyncs);
}
