//! The delivery guarantee, checked per object with real processes: nothing lost through a
//! hub crash and restart, a network partition, an in-memory hub restart, fail-over to
//! another hub and an outbox overflow.

use std::time::Duration;

use fleetwatch_agent::source::SyntheticSource;

use crate::support::*;
use fleetwatch_test_support::DEADLINE;

/// What an agent logs when its connection to the hub ends.
const LOST: &str = "connection to hub lost";
/// What an agent logs when it is connected (again).
const CONNECTED: &str = "connected to hub";

/// How many lines of `p`'s log contain `what`.
fn said(p: &Proc, what: &str) -> usize {
    p.stderr().lines().filter(|l| l.contains(what)).count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_hub_loses_nothing_through_crash_restart_and_partition() {
    let pki = Pki::new();
    let data = pki.path("hub-data");
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, Some(&data), &[]);
    let proxy = Proxy::start(port).await;
    let spec = "synthetic:objects=40,rate=250,total=3000";
    let source: SyntheticSource = spec.parse().unwrap();
    let clusters = ["c1", "c2", "c3"];
    let agents: Vec<_> = clusters.iter().map(|c| agent(&pki, c, &proxy.url(), spec, &[])).collect();
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    // How many times every agent has said `what` (the fewest of them).
    let all_said = |what: &str| agents.iter().map(|a| said(a, what)).min().unwrap_or(0);
    let streaming = |above: u64| {
        let seen = collector.seen.lock().unwrap();
        clusters.iter().all(|c| seen.max_seq.get(*c).is_some_and(|s| *s > above))
    };

    // Crash the hub (SIGKILL: no graceful anything) while agents produce, restart it once
    // every agent noticed.
    assert!(holds_within(DEADLINE, || streaming(100)).await, "agents do not stream:\n{}", hub.proc.stderr());
    hub.proc.signal("KILL");
    assert!(hub.proc.wait_exit(Duration::from_secs(5)).is_some());
    assert!(holds_within(DEADLINE, || all_said(LOST) >= 1).await, "an agent did not notice the crash");
    hub = HubProc::start(&pki, port, Some(&data), &[]);

    // Partition the agents from the restarted hub once they stream to it again, until both
    // sides noticed (the hub closed every session, each agent lost its connection again).
    let before = collector.seen.lock().unwrap().max_seq.values().copied().max().unwrap_or(0);
    let back = holds_within(DEADLINE, || all_said(CONNECTED) >= 2 && streaming(before)).await;
    assert!(back, "agents did not come back to the restarted hub:\n{}", hub.proc.stderr());
    proxy.cut();
    eventually("the hub and every agent to notice the partition")
        .until(
            async || (hub.clusters().await, all_said(LOST)),
            |(doc, lost)| {
                *lost >= 2 && doc["clusters"].as_array().is_some_and(|cs| cs.iter().all(|c| c["connected"] == false))
            },
        )
        .await;
    proxy.restore();

    let done = holds_within(Duration::from_secs(60), || {
        missing(&collector.seen.lock().unwrap(), &clusters, &source).is_empty()
    })
    .await;
    {
        let seen = collector.seen.lock().unwrap();
        assert!(
            done,
            "objects not delivered: {:?}\nhub log:\n{}",
            &missing(&seen, &clusters, &source)[..5.min(missing(&seen, &clusters, &source).len())],
            hub.proc.stderr()
        );
        // With a durable bus nothing needed a resync beyond each agent's own start marker.
        for c in clusters {
            let r = seen.resyncs.get(c).cloned().unwrap_or_default();
            assert_eq!(r.len(), 1, "cluster {c} resyncs: {r:?}");
            assert_eq!(r[0].1, "agent started");
        }
        assert!(!seen.resyncs.contains_key("*"), "{:?}", seen.resyncs);
    }
    // The restarted hub resumed each agent's stream rather than starting over.
    let clusters_json = hub.clusters().await;
    for c in clusters_json["clusters"].as_array().unwrap() {
        assert_eq!(c["ackedSeq"].as_u64().unwrap(), 3001, "{c}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_hub_restart_tells_subscribers_to_resync() {
    let pki = Pki::new();
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, None, &[]);
    let spec = "synthetic:objects=20,rate=200,total=1600";
    let source: SyntheticSource = spec.parse().unwrap();
    let _a = agent(&pki, "m1", &hub.url(), spec, &[]);
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    assert!(holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().events > 100).await);

    hub.proc.signal("KILL");
    hub.proc.wait_exit(Duration::from_secs(5));
    hub = HubProc::start(&pki, port, None, &[]);

    let done =
        holds_within(Duration::from_secs(40), || missing(&collector.seen.lock().unwrap(), &["m1"], &source).is_empty())
            .await;
    let seen = collector.seen.lock().unwrap();
    assert!(done, "{:?}\n{}", missing(&seen, &["m1"], &source), hub.proc.stderr());
    // The history between the crash and the reconnect is gone: the subscriber must have
    // been told, for all clusters (new stream) and for m1 (the hub lost acked events).
    assert!(seen.resyncs.contains_key("*"), "{:?}", seen.resyncs);
    let m1 = &seen.resyncs["m1"];
    assert!(m1.iter().any(|(_, why)| why.contains("hub lost acked events")), "{m1:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_and_subscriber_fail_over_to_the_next_hub() {
    let pki = Pki::new();
    let mut first = HubProc::start(&pki, free_port(), None, &[]);
    let second = HubProc::start(&pki, free_port(), None, &[]);
    let hubs = format!("{},{}", first.url(), second.url());
    let spec = "synthetic:objects=20,rate=200,total=1600";
    let source: SyntheticSource = spec.parse().unwrap();
    let agent = agent(&pki, "f1", &hubs, spec, &[]);
    let collector = Collector::start(&pki, &hubs, "checker").await;
    assert!(holds_within(Duration::from_secs(10), || collector.seen.lock().unwrap().events > 100).await);
    // Both reached the first hub (the order is the order given).
    let listed = first.clusters().await;
    assert!(listed.to_string().contains("\"f1\""), "{listed}");

    first.proc.signal("KILL");
    first.proc.wait_exit(Duration::from_secs(5));

    // Both move to the second hub: every object reaches its final state there.
    let done =
        holds_within(Duration::from_secs(40), || missing(&collector.seen.lock().unwrap(), &["f1"], &source).is_empty())
            .await;
    assert!(second.clusters().await.to_string().contains("\"f1\""));
    let seen = collector.seen.lock().unwrap();
    assert!(done, "{:?}\n{}", missing(&seen, &["f1"], &source), agent.stderr());
    // Two independent in-memory hubs are two streams: the subscriber was told to resync.
    // (Replicas on one JetStream stream share it, and resume where they were.)
    assert!(seen.resyncs.contains_key("*"), "{:?}", seen.resyncs);
    let log = agent.stderr();
    let line = log.lines().find(|l| l.contains("failed over to another hub")).unwrap_or_default();
    assert!(line.contains(&format!(":{}", second.port)), "{log}");
}

/// A hub with no room refuses an agent after the TLS handshake; the agent then starts its
/// next attempt at the next hub. Before, it asked the full hub again and again (the hub
/// answered, so it never counted as unreachable) and never reached the one with room.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_a_full_hub_refuses_moves_to_the_next_hub() {
    let pki = Pki::new();
    let full = HubProc::start(&pki, free_port(), None, &["--max-connections", "1"]);
    let other = HubProc::start(&pki, free_port(), None, &[]);
    let spec = "synthetic:objects=5,rate=20";
    // The one place of the first hub is taken.
    let holder = agent(&pki, "holder", &full.url(), spec, &[]);
    let held = holds_within(DEADLINE, || full.proc.stderr().contains("agent connected")).await;
    assert!(held, "{}\n{}", full.proc.stderr(), holder.stderr());
    // An agent given the full hub first.
    let hubs = format!("{},{}", full.url(), other.url());
    let mover = agent(&pki, "mover", &hubs, spec, &[]);
    let moved = holds_within(DEADLINE, || other.proc.stderr().contains("agent connected")).await;
    assert!(moved, "the agent did not reach the hub with room:\n{}", mover.stderr());
    let log = mover.stderr();
    assert!(log.contains("hub is full"), "the first hub refused it for want of room:\n{log}");
    assert!(other.clusters().await.to_string().contains("\"mover\""));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn outbox_overflow_during_an_outage_becomes_one_resync() {
    let pki = Pki::new();
    let port = free_port();
    // The agent starts while no hub is there and changes 200 objects with room for 50.
    let spec = "synthetic:objects=200,rate=400,total=2000";
    let source: SyntheticSource = spec.parse().unwrap();
    let a = agent(&pki, "o1", &format!("wss://127.0.0.1:{port}"), spec, &["--outbox-capacity", "50"]);
    let overflowed = holds_within(DEADLINE, || a.stderr().contains("collapsing outbox into a resync marker")).await;
    assert!(overflowed, "the outbox did not overflow:\n{}", a.stderr());
    let hub = HubProc::start(&pki, port, None, &[]);
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    // Objects changed after the reconnect arrive as events; all earlier ones are covered by
    // the resync marker.
    let covered = |seen: &Seen| {
        let overflow = seen.resyncs.get("o1").is_some_and(|r| r.iter().any(|(_, why)| why.contains("overflowed")));
        overflow
            && seen.max_seq.get("o1").copied().unwrap_or(0) >= 2001
            && (0..source.objects).all(|n| {
                let g = seen.generation.get(&("o1".to_string(), synthetic_subject(n))).copied().unwrap_or(0);
                g == source.final_generation(n).unwrap() || g == 0
            })
    };
    let ok = holds_within(Duration::from_secs(30), || covered(&collector.seen.lock().unwrap())).await;
    let seen = collector.seen.lock().unwrap();
    assert!(ok, "resyncs {:?} max seq {:?}\nagent log:\n{}", seen.resyncs, seen.max_seq, a.stderr());
}

/// Waits until process `p` has used `secs` of CPU: progress measured in work done, not in
/// wall-clock time, so a busy machine only makes a test slower.
async fn until_cpu(p: &Proc, secs: f64) {
    let cpu = || -> f64 {
        let s = std::fs::read_to_string(format!("/proc/{}/stat", p.child.id())).unwrap_or_default();
        // utime and stime, the 14th and 15th fields, counted after the parenthesised name.
        let fields: Vec<&str> = s.rsplit_once(')').map(|(_, r)| r.split_whitespace().collect()).unwrap_or_default();
        let ticks: u64 = fields.get(11..13).map_or(0, |f| f.iter().filter_map(|t| t.parse::<u64>().ok()).sum());
        ticks as f64 / 100.0
    };
    eventually(format!("the process to use {secs} s of CPU"))
        .within(Duration::from_secs(180))
        .context(|| p.stderr())
        .until(async || cpu(), |used| *used >= secs)
        .await;
}

/// The agent's memory stays flat while the hub is unreachable: the outbox coalesces per
/// object, so a long outage costs no more than a short one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_memory_stays_flat_through_an_outage() {
    let pki = Pki::new();
    let port = free_port(); // nothing listens here
    let a = agent(&pki, "flat", &format!("wss://127.0.0.1:{port}"), "synthetic:objects=5000,rate=20000", &[]);
    let rss = |pid: u32| -> u64 {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        s.lines().find(|l| l.starts_with("VmRSS:")).and_then(|l| l.split_whitespace().nth(1)?.parse().ok()).unwrap_or(0)
    };
    let pid = a.child.id();
    // After two CPU seconds every object has been changed many times: the outbox is at its size.
    until_cpu(&a, 2.0).await;
    let early = rss(pid);
    // Three times the work, so three times as many changes; memory must not follow.
    until_cpu(&a, 6.0).await;
    let late = rss(pid);
    assert!(early > 0, "agent not running:\n{}", a.stderr());
    // Allow allocator noise.
    assert!(late < early + 6 * 1024, "agent RSS grew from {early} KiB to {late} KiB during the outage");
}
