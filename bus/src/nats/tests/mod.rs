//! Tests of what only the NATS backend does, against a real `nats-server`: several
//! replicas on one stream, heads kept in the key-value bucket, JetStream going away and
//! coming back. What every backend does is in [`crate::conformance`].

mod chain;
mod formats;
mod recreate;
mod tail;

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::server::LocalNatsServer;
use super::{NatsBus, NatsOptions};
use crate::{Append, Bus, BusError, Flush, Gap, Lookup, RecordBody, Retention};

fn ev(epoch: u64, seq: u64) -> Append {
    Append { epoch, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq}}}"#))) }
}

fn keep_all() -> Retention {
    Retention { records: 1_000_000, bytes: 1 << 30, age: None }
}

/// A replica without a local tail (one serving only agents).
async fn open_without_tail(url: &str, stream: &str, retention: Retention) -> Arc<NatsBus> {
    let opts = NatsOptions {
        stream: stream.into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![url.into()], retention)
    };
    NatsBus::open(opts).await.unwrap_or_else(|e| panic!("NATS bus opens: {e}"))
}

async fn open(url: &str, stream: &str, retention: Retention) -> Arc<NatsBus> {
    let bus = open_without_tail(url, stream, retention).await;
    // A replica with a reader: its local tail follows the stream (see `lazy_tails`).
    bus.prepare_reads().await.unwrap_or_else(|e| panic!("local tail starts: {e}"));
    bus
}

async fn wait_for(what: &str, timeout: Duration, mut cond: impl AsyncFnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond().await {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn server() -> (LocalNatsServer, tempfile::TempDir) {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let s = LocalNatsServer::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (s, dir)
}

/// Two replicas on one stream: an agent that moves from one to the other resumes from the
/// head the first one stored, its resends are skipped, and both serve the same offsets.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_share_heads_and_skip_resends() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(a.stream_id(), b.stream_id(), "one stream, one id");
    assert!(a.stats().durable);
    // The reasons of a stream created fresh, byte for byte (subscribers match them).
    assert_eq!(
        a.resync_reason(Gap::LostHistory),
        "the hub's event history was lost: the JetStream stream was recreated empty (this subscriber's cursor is of an earlier stream)"
    );
    assert_eq!(
        a.resync_reason(Gap::Evicted { offset: 1 }),
        "events were evicted from the hub before this subscriber read them"
    );
    assert_eq!(
        a.resync_reason(Gap::LostCursor { name: "audit" }),
        "the hub lost its durable cursor store: where durable subscription \"audit\" stopped is unknown"
    );
    b.lost_names_begun.store(true, std::sync::atomic::Ordering::Relaxed);
    assert_eq!(
        b.resync_reason(Gap::LostCursor { name: "audit" }),
        "durable subscription \"audit\" is not known to this bus, which a hub began after JetStream had no stream for it (a first start, or JetStream lost its store while no hub replica ran): it may have been read before"
    );
    b.lost_names_begun.store(false, std::sync::atomic::Ordering::Relaxed);
    let c: Arc<str> = "eu-1".into();
    assert_eq!(a.append(c.clone(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    // The agent reconnects to b: b knows the head without having served it.
    assert_eq!(b.head("eu-1").await.unwrap(), Some((1, 3)));
    // Its resend of 2 and 3 with a new 4: only 4 is stored.
    assert_eq!(b.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4)]).await.unwrap(), 4);
    assert_eq!(b.append(c.clone(), vec![ev(1, 4)]).await.unwrap(), 4, "a resend alone stores nothing");
    for bus in [&a, &b] {
        wait_for("both tails at offset 4", Duration::from_secs(30), async || bus.last_offset() == 4).await;
        let r = bus.read(1, 10).await.unwrap();
        assert_eq!(
            r.records.iter().map(|r| (r.offset, r.seq)).collect::<Vec<_>>(),
            vec![(1, 1), (2, 2), (3, 3), (4, 4)]
        );
    }
    // Back on a: it saw b's append through its tail and skips it as well.
    assert_eq!(a.head("eu-1").await.unwrap(), Some((1, 4)));
    assert_eq!(a.append(c.clone(), vec![ev(1, 4), ev(1, 5)]).await.unwrap(), 5);
    // A durable cursor moved on one replica is found on the other once flushed.
    a.register_durable("sub", "d", 1).await.unwrap();
    a.set_durable_cursor("sub", "d", 4).await.unwrap();
    a.flush(Flush::Cursors).await.unwrap();
    assert_eq!(b.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(4));
}

/// A replica started after a cluster's records were evicted still knows its head (from the
/// key-value bucket), and tells a reader from below the stream's first offset to resync
/// every cluster that may have lost something.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_replica_resumes_heads_from_the_bucket_after_eviction() {
    let (server, _dir) = server();
    let retention = Retention { records: 2, ..keep_all() };
    let a = open(&server.url(), "fw", retention).await;
    a.append("old".into(), vec![ev(7, 1), ev(7, 2)]).await.unwrap();
    a.append("new".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    assert_eq!(a.stats().first_offset, 3);
    // Heads reach the bucket with the next flush (the hub's housekeeping, every second).
    a.flush(Flush::Cursors).await.unwrap();
    let b = open(&server.url(), "fw", retention).await;
    assert_eq!((b.stats().first_offset, b.last_offset()), (3, 4), "b loaded what the stream retains");
    assert_eq!(b.head("old").await.unwrap(), Some((7, 2)), "the head survives the eviction");
    assert_eq!(b.append("old".into(), vec![ev(7, 2)]).await.unwrap(), 4, "a resend is still a duplicate");
    let mut evicted: Vec<String> = b.read(1, 10).await.unwrap().evicted.iter().map(|(c, _)| c.to_string()).collect();
    evicted.sort();
    // The bucket named both, but one whose latest records were stored after its last write
    // would be missing: a tail started after evictions also says `*` (seed 8146).
    assert_eq!(evicted, vec!["*", "new", "old"], "every cluster that may have lost records below offset 3");
    assert!(b.read(3, 10).await.unwrap().evicted.is_empty());
    // The records b loaded and the next ones follow their predecessors as b sees them: an
    // evicted one (old 7/2) by the offset its publisher had from the ack.
    assert_eq!(a.append("old".into(), vec![ev(7, 3)]).await.unwrap(), 5);
    wait_for("b's tail at offset 5", Duration::from_secs(30), async || b.last_offset() == 5).await;
    assert_eq!(kinds(&b).await, vec![(2, false), (3, false)], "offsets 4 and 5 retained, no marker");
    // A replica started now cannot see new 1/1 (offset 3, evicted), and new 1/2 named it
    // without an offset (both were in one batch, not acked yet): it cannot tell that
    // nothing is missing before new 1/2, so it delivers a marker — one resync more than
    // needed, never one less.
    let c = open(&server.url(), "fw", retention).await;
    assert_eq!(kinds(&c).await, vec![(2, true), (3, false)]);
}

/// JetStream stopped: appends fail with an error naming JetStream, health turns `Err`;
/// restarted: health recovers, appends succeed, nothing acked before was lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_down_refuses_appends_and_recovers() {
    let (mut server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    assert_eq!(bus.append(c.clone(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(), 2);
    assert!(bus.health().is_ok());
    server.stop();
    let err = bus.append(c.clone(), vec![ev(1, 3)]).await.unwrap_err();
    assert!(matches!(err, BusError::Nats(_)), "{err}");
    assert!(err.to_string().contains("JetStream"), "the error names JetStream: {err}");
    wait_for("health to report the outage", Duration::from_secs(30), async || bus.health().is_err()).await;
    assert!(bus.stats().write_failures >= 1);
    server.restart().unwrap_or_else(|e| panic!("{e}"));
    wait_for("health to recover", Duration::from_secs(60), async || bus.health().is_ok()).await;
    // The agent resends what was not acked (3) plus more; nothing acked before is lost.
    let mut last = 0;
    wait_for("an append to succeed", Duration::from_secs(60), async || {
        match bus.append(c.clone(), vec![ev(1, 3), ev(1, 4)]).await {
            Ok(off) => {
                last = off;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    let seqs: Vec<u64> = bus.read(1, 100).await.unwrap().records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4], "each seq once, in order (last offset {last})");
    assert_eq!(bus.head("eu-1").await.unwrap(), Some((1, 4)));
}

/// Bad settings give one error naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_settings_name_the_cause() {
    let (server, _dir) = server();
    let _first = open(&server.url(), "fw", keep_all()).await;
    let conflicting = NatsOptions {
        stream: "fw".into(),
        replicas: 1,
        ..NatsOptions::new(vec![server.url()], Retention { records: 5, ..keep_all() })
    };
    let err = NatsBus::open(conflicting).await.err().expect("a conflicting stream is refused");
    assert!(err.to_string().contains("conflicting settings: max_msgs is 1000000, this hub wants 5"), "{err}");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed = format!("nats://{}", listener.local_addr().unwrap());
    drop(listener);
    let err = NatsBus::open(NatsOptions::new(vec![closed.clone()], keep_all())).await.err().expect("unreachable");
    assert!(err.to_string().starts_with(&format!("cannot connect to NATS at {closed}")), "{err}");
    let err = NatsBus::open(NatsOptions { stream: "a.b".into(), ..NatsOptions::new(vec![server.url()], keep_all()) })
        .await
        .err()
        .expect("a bad stream name");
    assert!(err.to_string().contains("stream name"), "{err}");
}

/// (offset, cluster, reason) of every `resync-required` record from `from` on.
async fn markers(bus: &NatsBus, from: u64) -> Vec<(u64, String, String)> {
    let r = bus.read(from, 1000).await.unwrap();
    r.records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::ResyncRequired(why) => Some((r.offset, r.cluster.to_string(), why.clone())),
            RecordBody::Event(_) => None,
        })
        .collect()
}

/// A durable registration on one replica is not overtaken by an older cursor move that
/// another replica had not written yet: registering stores the start point even when
/// lower (the `Bus` contract), and a move made under an earlier registration of the name
/// is dropped when flushed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_registration_is_not_overtaken_by_an_older_unflushed_cursor() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    a.register_durable("sub", "d", 1).await.unwrap();
    a.set_durable_cursor("sub", "d", 500).await.unwrap(); // acked on a, not flushed yet
    // The subscriber moved to b, which registers it lower (its cursor was beyond the log).
    b.register_durable("sub", "d", 400).await.unwrap();
    a.flush(Flush::Cursors).await.unwrap();
    for bus in [&a, &b] {
        assert_eq!(bus.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(400));
    }
    // Moves of the current registration still go forward, from any replica.
    b.set_durable_cursor("sub", "d", 450).await.unwrap();
    b.flush(Flush::Cursors).await.unwrap();
    assert_eq!(a.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(450));
    // And a's later moves of its old registration stay dropped.
    a.set_durable_cursor("sub", "d", 600).await.unwrap();
    a.flush(Flush::Cursors).await.unwrap();
    assert_eq!(b.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(450));
}

/// (seq, is a resync marker) of every record.
async fn kinds(bus: &NatsBus) -> Vec<(u64, bool)> {
    let r = bus.read(1, 100).await.unwrap();
    r.records.iter().map(|r| (r.seq, matches!(r.body, RecordBody::ResyncRequired(_)))).collect()
}

/// Acks nobody polls do not hold up other publishes: async-nats lets 5,000 acks be in
/// flight per context and a publish waits (with no timeout) for a place. A hub session that
/// waits for a place does not poll the acks of its own batches in flight; before the acks
/// were driven by tasks of their own, sessions holding every place that way stopped all
/// appends of the replica for good (0 events/s at 50,000 agents).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acks_nobody_polls_do_not_hold_up_later_publishes() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    // 6 clusters' batches of 1,000 records: 6,000 acks, none of them awaited yet.
    let mut held = Vec::new();
    for k in 0..6u64 {
        let c: Arc<str> = format!("c-{k}").into();
        let batch: Vec<Append> = (1..=1_000).map(|s| ev(1, s)).collect();
        let started = tokio::time::timeout(Duration::from_secs(60), bus.start_append(c, batch)).await;
        let storing = started
            .unwrap_or_else(|_| panic!("batch {k} could not be published in 60 s: earlier acks hold every place"))
            .unwrap_or_else(|e| panic!("batch {k}: {e}"));
        held.push(storing);
    }
    for (k, storing) in held.into_iter().enumerate() {
        let offset = storing.await.unwrap_or_else(|e| panic!("batch {k} stored: {e}"));
        assert_eq!(offset, 1_000 * (k as u64 + 1), "batch {k} ends where it was published");
    }
}

/// The heads bucket as the replicas' notice (`ReplicaShare::follow_heads`): a head of
/// another agent process is recorded at the next flush whatever the pacing, a follower
/// sees it, and a replica never writes its older head over a later one (a follower that
/// missed the later one would never see it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_of_another_agent_process_reach_followers_and_are_never_written_over() {
    use crate::ReplicaShare;
    use futures_util::StreamExt;
    let (server, _dir) = server();
    // A retention that paces heads at the maximum delay: only `hurry` writes them at once.
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    let mut heads = a.follow_heads().await.unwrap();
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    b.append("c".into(), vec![ev(2, 1), ev(2, 2)]).await.unwrap();
    b.flush(Flush::Cursors).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), heads.next()).await.expect("a head within 10 s");
    let seen = seen.expect("the follow goes on").unwrap();
    assert_eq!((seen.cluster.as_str(), seen.epoch, seen.seq), ("c", 2, 2), "b's head, written at once");
    // a's own head is older than b's: not written over it.
    a.flush(Flush::Cursors).await.unwrap();
    let stored = a.heads_kv.get(&super::records::token("c")).await.unwrap().expect("a head");
    let head = super::heads::parse_head(&stored).unwrap().expect("a head");
    assert_eq!((head.epoch, head.seq), (2, 2), "b's head stays");
    // A later head of a's (of the process a knew: paced, written by a flush of all) is
    // written over b's, and followed.
    a.append("c".into(), vec![ev(1, 2)]).await.unwrap();
    a.flush(Flush::All).await.unwrap();
    let seen = tokio::time::timeout(Duration::from_secs(10), heads.next()).await.expect("a head").unwrap().unwrap();
    assert_eq!((seen.cluster.as_str(), seen.epoch, seen.seq), ("c", 1, 2));
}

/// Hellos of a connect storm share their reads (see `head_reads`): heads asked for at once
/// are read through one sweep of the stream's last records and one of the bucket, and each
/// is the head one request each would have found — in the stream, only in the bucket (its
/// records evicted), or none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heads_asked_for_at_once_are_read_together_and_each_is_right() {
    let (server, _dir) = server();
    let retention = Retention { records: 10, ..keep_all() };
    let a = open(&server.url(), "fw", retention).await;
    a.append("gone".into(), vec![ev(5, 1), ev(5, 2)]).await.unwrap();
    a.flush(Flush::All).await.unwrap();
    let clusters: Vec<String> = (0..10).map(|i| format!("c{i}")).collect();
    for (i, c) in clusters.iter().enumerate() {
        a.append(c.as_str().into(), vec![ev(i as u64 + 1, 1)]).await.unwrap();
    }
    assert_eq!(a.stats().first_offset, 3, "gone's records are evicted: only the bucket has its head");
    // A replica without a local tail, started now: of these heads it knows only gone's
    // (from the bucket); the others only the stream has (a has not flushed them).
    let b = open_without_tail(&server.url(), "fw", retention).await;
    let mut asked: Vec<&str> = clusters.iter().map(String::as_str).collect();
    asked.extend(["gone", "never"]);
    let heads = futures_util::future::join_all(asked.iter().map(|c| b.head(c))).await;
    let heads: Vec<Option<(u64, u64)>> = heads.into_iter().map(|h| h.unwrap()).collect();
    let mut want: Vec<Option<(u64, u64)>> = (1..=10).map(|epoch| Some((epoch, 1))).collect();
    want.extend([Some((5, 2)), None]);
    assert_eq!(heads, want);
    // The reader took the first caller alone (or with a few); the others joined while it
    // read and were read by one sweep.
    let (reads, sweeps) = b.head_reads.counts();
    assert!(sweeps >= 1 && reads < asked.len() as u64, "{reads} reads, {sweeps} of them sweeps");
    // One at a time, each is still read alone, and the same.
    let before = b.head_reads.counts();
    for (c, h) in asked.iter().zip(&want) {
        assert_eq!(b.head(c).await.unwrap(), *h, "{c} alone");
    }
    let after = b.head_reads.counts();
    assert_eq!((after.0 - before.0, after.1 - before.1), (asked.len() as u64, 0), "one by one: no sweep");
}

/// A replica with a local tail answers the heads of clusters its tail has seen without
/// asking JetStream (issue 47): once a probe begun after the question found the stream's
/// end and the tail reached it, the tail holds every record stored before the question.
/// Clusters it cannot vouch for are read from JetStream as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_with_a_tail_answers_the_heads_it_has_seen_without_a_request() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap();
    wait_for("b's tail at offset 3", Duration::from_secs(30), async || b.last_offset() == 3).await;
    assert_eq!(b.head("c").await.unwrap(), Some((1, 3)));
    assert_eq!((b.head_reads.answered_from_tail(), b.head_reads.counts().0), (1, 0), "from the tail, no request");
    // Stored by another replica just before the question, maybe not in b's tail yet: the
    // answer waits for a probe begun after the question and the tail at its end.
    for seq in 4..=20 {
        a.append("c".into(), vec![ev(1, seq)]).await.unwrap();
        assert_eq!(b.head("c").await.unwrap(), Some((1, seq)), "the record stored before the question");
    }
    assert_eq!(b.head_reads.counts().0, 0, "still no request");
    // A cluster the tail has not seen: JetStream is asked.
    assert_eq!(b.head("new").await.unwrap(), None);
    assert_eq!(b.head_reads.counts().0, 1);
}
