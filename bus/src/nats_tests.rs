//! Tests of what only the NATS backend does, against a real `nats-server`: several
//! replicas on one stream, heads kept in the key-value bucket, JetStream going away and
//! coming back. What every backend does is in [`super::conformance`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::nats_server::LocalNatsServer;
use super::{Append, Bus, BusError, Lookup, NatsBus, NatsOptions, RecordBody, Retention};

fn ev(epoch: u64, seq: u64) -> Append {
    Append { epoch, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq}}}"#))) }
}

fn keep_all() -> Retention {
    Retention { records: 1_000_000, bytes: 1 << 30, age: None }
}

async fn open(url: &str, stream: &str, retention: Retention) -> Arc<NatsBus> {
    let opts = NatsOptions {
        stream: stream.into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![url.into()], retention)
    };
    let bus = NatsBus::open(opts).await.unwrap_or_else(|e| panic!("NATS bus opens: {e}"));
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
    assert!(a.is_durable());
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
    a.flush_cursors().await.unwrap();
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
    assert_eq!(a.first_offset(), 3);
    // Heads reach the bucket with the next flush (the hub's housekeeping, every second).
    a.flush_cursors().await.unwrap();
    let b = open(&server.url(), "fw", retention).await;
    assert_eq!((b.first_offset(), b.last_offset()), (3, 4), "b loaded what the stream retains");
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
    assert!(bus.write_failures() >= 1);
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

/// The consumers feeding the local tails vanish on the server (as with the JetStream node
/// that held them): the tails recover and still receive every record, on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tails_recover_when_their_consumers_vanish() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(a.append("c".into(), vec![ev(1, 1)]).await.unwrap(), 1);
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("fw").await.unwrap();
    let names: Vec<String> = futures_util::StreamExt::collect::<Vec<_>>(stream.consumer_names())
        .await
        .into_iter()
        .map(|n| n.unwrap())
        .collect();
    assert_eq!(names.len(), 2, "one tail consumer per replica: {names:?}");
    for n in &names {
        stream.delete_consumer(n).await.unwrap();
    }
    // Appends go on (an append waits for its own tail, which recovers meanwhile).
    let mut last = 0;
    wait_for("an append after the consumers vanished", Duration::from_secs(90), async || {
        match a.append("c".into(), vec![ev(1, 2), ev(1, 3)]).await {
            Ok(off) => {
                last = off;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(last, 3);
    wait_for("b's tail to recover", Duration::from_secs(60), async || b.last_offset() == 3).await;
    let seqs: Vec<u64> = b.read(1, 10).await.unwrap().records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
}

/// Makes the stream refuse records over 300 bytes; `big` makes one.
async fn refuse_big_records(url: &str) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut stream = js.get_stream("fw").await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.max_message_size = 300;
    js.update_stream(config).await.unwrap();
}

fn big(seq: u64) -> Append {
    Append { epoch: 1, seq, body: RecordBody::Event(Bytes::from(format!("\"{}\"", "x".repeat(1000)))) }
}

/// (seq, is a resync marker) of every record.
async fn kinds(bus: &NatsBus) -> Vec<(u64, bool)> {
    let r = bus.read(1, 100).await.unwrap();
    r.records.iter().map(|r| (r.seq, matches!(r.body, RecordBody::ResyncRequired(_)))).collect()
}

/// A batch of which a middle record was refused but later ones stored leaves a hole in the
/// cluster's stream: the append fails, and the first record stored after the hole reaches
/// subscribers as a `resync-required`, so they reconcile the cluster instead of missing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_in_a_batch_is_followed_by_a_resync_marker() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    assert_eq!(bus.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
    refuse_big_records(&server.url()).await;
    // 3 and 5 are refused, 2 and 4 stored: the head is 4, not 5.
    let err = bus.append(c.clone(), vec![ev(1, 2), big(3), ev(1, 4), big(5)]).await.unwrap_err();
    assert!(err.to_string().contains("JetStream did not store the batch for cluster eu-1"), "{err}");
    // The agent resends from 2 on; 2 and 4 are stored, so only 5 is new.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    assert_eq!(kinds(&bus).await, vec![(1, false), (2, false), (4, true), (5, false)]);
    match &bus.read(3, 1).await.unwrap().records[0].body {
        RecordBody::ResyncRequired(reason) => {
            assert!(reason.contains("records of the cluster may be missing before this one"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Only once.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 6)]).await.unwrap(), 5);
    assert_eq!(kinds(&bus).await.last(), Some(&(6, false)));
}

/// Two appends of a session in flight (as a session pipelines them): the first is refused,
/// the second stored. The agent is never acked for either, but the second moved the head,
/// so its resend of the first is skipped as duplicates: the second's record must reach
/// subscribers as a `resync-required` — on the replica that appended, on one that only
/// follows the stream, and on one started afterwards (the appending one may die right
/// after; nothing it remembers may be needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stored_after_a_failed_one_is_a_resync_marker_on_every_replica() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    assert_eq!(a.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
    refuse_big_records(&server.url()).await;
    let first = a.start_append(c.clone(), vec![ev(1, 2), big(3)]).await.unwrap();
    let second = a.start_append(c.clone(), vec![ev(1, 4)]).await.unwrap();
    let err = first.await.unwrap_err();
    assert!(err.to_string().contains("JetStream did not store the batch for cluster eu-1"), "{err}");
    assert_eq!(second.await.unwrap(), 3, "the later batch was stored (and would not be acked)");
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&a, &b, &late] {
        wait_for("the tail at offset 3", Duration::from_secs(30), async || bus.last_offset() == 3).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true)], "3 was lost: 4 is a marker");
    }
    // The agent reconnects to b, which reads the head from the stream, and resends from 2.
    assert_eq!(b.head("eu-1").await.unwrap(), Some((1, 4)));
    assert_eq!(b.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    for bus in [&a, &b, &late] {
        wait_for("the tail at offset 4", Duration::from_secs(30), async || bus.last_offset() == 4).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true), (5, false)], "no second marker");
    }
}

/// Appends of a cluster in flight on one replica chain up: none of them is a marker when
/// all are stored, whichever order their acks are awaited in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_appends_that_all_succeed_need_no_marker() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    let mut started = Vec::new();
    for seq in 1..=20 {
        started.push(bus.start_append(c.clone(), vec![ev(1, seq)]).await.unwrap());
    }
    // Resends of what is in flight are skipped (the session's own filter already does so).
    let resend = bus.start_append(c.clone(), vec![ev(1, 19), ev(1, 20), ev(1, 21)]).await.unwrap();
    let mut offsets = Vec::new();
    for f in started.into_iter().rev() {
        offsets.push(f.await.unwrap());
    }
    assert_eq!(resend.await.unwrap(), 21);
    offsets.sort();
    assert_eq!(offsets, (1..=20).collect::<Vec<u64>>());
    let want: Vec<(u64, bool)> = (1..=21).map(|s| (s, false)).collect();
    assert_eq!(kinds(&bus).await, want);
    // Once nothing is in flight, the next append starts from the head (also from another
    // replica's appends, which its tail saw).
    let other = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(other.head("eu-1").await.unwrap(), Some((1, 21)));
    assert_eq!(other.append(c.clone(), vec![ev(1, 22)]).await.unwrap(), 22);
    wait_for("the tail at offset 22", Duration::from_secs(30), async || bus.last_offset() == 22).await;
    assert_eq!(bus.append(c.clone(), vec![ev(1, 22), ev(1, 23)]).await.unwrap(), 23);
    let want: Vec<(u64, bool)> = (1..=23).map(|s| (s, false)).collect();
    assert_eq!(kinds(&bus).await, want);
}

/// Consumers on the stream (the local tails following it).
async fn tail_consumers(url: &str) -> usize {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let stream = js.get_stream("fw").await.unwrap();
    futures_util::StreamExt::collect::<Vec<_>>(stream.consumer_names()).await.len()
}

/// A replica without readers only appends: nothing of the stream is delivered to it. Its
/// local tail starts with its first reader, loads what the stream holds (appended by any
/// replica, with their predecessors checked), and from then on an append answers only
/// once its records are in it; a replica still without readers does not wait for a tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_tails_start_with_the_first_reader() {
    let (server, _dir) = server();
    let opts = || NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let a = NatsBus::open(opts()).await.unwrap();
    let b = NatsBus::open(opts()).await.unwrap();
    assert_eq!(a.append("c".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    assert_eq!(b.append("d".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(), 5);
    assert_eq!(a.last_offset(), 3, "a replica without a tail knows the offsets of its own acks");
    assert_eq!(tail_consumers(&server.url()).await, 0, "no replica follows the stream without a reader");
    assert!(!a.holds_records() && !b.holds_records());
    // A reader on b starts its tail: everything, from both replicas, no marker.
    let got: Vec<(String, u64, bool)> = b
        .read(1, 10)
        .await
        .unwrap()
        .records
        .iter()
        .map(|r| (r.cluster.to_string(), r.seq, matches!(r.body, RecordBody::ResyncRequired(_))))
        .collect();
    let want: Vec<(String, u64, bool)> =
        [("c", 1), ("c", 2), ("c", 3), ("d", 1), ("d", 2)].iter().map(|(c, s)| (c.to_string(), *s, false)).collect();
    assert_eq!(got, want);
    assert_eq!(tail_consumers(&server.url()).await, 1, "only the replica with a reader follows the stream");
    assert!(b.holds_records() && !a.holds_records());
    assert_eq!((b.first_offset(), b.last_offset(), b.retained()), (1, 5, 5));
    // Read your writes on b; a's appends reach b's tail and follow their predecessors.
    assert_eq!(b.append("d".into(), vec![ev(1, 3)]).await.unwrap(), 6);
    assert_eq!(b.read(6, 10).await.unwrap().records.len(), 1, "b's own append is in its tail when acked");
    assert_eq!(a.append("c".into(), vec![ev(1, 4)]).await.unwrap(), 7);
    wait_for("b's tail at offset 7", Duration::from_secs(30), async || b.last_offset() == 7).await;
    assert_eq!(kinds(&b).await.iter().filter(|(_, marker)| *marker).count(), 0, "no record broke its chain");
    // a's first reader gets the same stream.
    a.prepare_reads().await.unwrap();
    assert_eq!(a.read(1, 10).await.unwrap().records.len(), 7);
    assert_eq!(tail_consumers(&server.url()).await, 2);
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

/// Whether the bus took a recreated stream on and is healthy.
fn recreated(bus: &NatsBus) -> bool {
    bus.offset_base() > 0 && bus.health().is_ok()
}

/// Appends until JetStream takes it (an agent resending after its session ended).
async fn append_eventually(bus: &NatsBus, cluster: &str, items: impl Fn() -> Vec<Append>) -> u64 {
    let mut last = 0;
    wait_for("an append to be stored", Duration::from_secs(60), async || {
        match bus.append(cluster.into(), items()).await {
            Ok(off) => {
                last = off;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    last
}

/// NATS restarted with an empty store (its disk lost): without a hub restart, the replicas
/// recreate the stream and its buckets and become healthy again; all of them agree on the
/// bus id and the offsets (one recreates, the other takes the new stream on, a replica
/// started later reads the same); offsets continue above the old ones, and the first
/// record of the new stream is one `resync-required` `*` with the true reason, so a
/// reader going on from an old cursor learns of the loss; appends go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_restarted_empty_is_recreated_and_every_replica_agrees() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    // b serves only agents (no local tail) until its first reader comes.
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let b = NatsBus::open(opts).await.unwrap();
    let id = a.stream_id().to_string();
    assert_eq!(a.append("c".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    assert_eq!(b.append("d".into(), vec![ev(1, 1)]).await.unwrap(), 4);
    wait_for("a's tail at offset 4", Duration::from_secs(30), async || a.last_offset() == 4).await;

    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let next_c = append_eventually(&a, "c", || vec![ev(1, 4)]).await;
    let next_d = append_eventually(&b, "d", || vec![ev(1, 2)]).await;
    assert!(next_c > 4 && next_d > 4, "offsets continue above the old ones: {next_c}, {next_d}");
    let late = open(&server.url(), "fw", keep_all()).await;
    b.prepare_reads().await.unwrap();
    for bus in [&a, &b, &late] {
        assert_eq!(bus.stream_id(), id, "the recreated stream continues the bus");
        wait_for("the tail holds both appends", Duration::from_secs(30), async || {
            bus.last_offset() == next_c.max(next_d)
        })
        .await;
        // A reader going on from its old cursor (4) reads the marker first.
        let read = bus.read(5, 100).await.unwrap();
        let first = read.records.first().expect("records after the recreation");
        assert_eq!(first.cluster.as_ref(), "*");
        match &first.body {
            RecordBody::ResyncRequired(why) => assert!(why.contains(super::nats::RECREATED), "{why}"),
            other => panic!("the first record of the recreated stream is {other:?}"),
        }
        // A cluster whose records went with the old stream is told why, truly (a replica
        // that still knew its head reports it evicted at its old offset, at most 4).
        let why = bus.eviction_reason(4);
        assert!(why.contains("recreated empty") && !why.contains("evicted"), "{why}");
        let aged = bus.eviction_reason(next_c.max(next_d));
        assert!(aged.contains("evicted"), "offsets of the new stream age out as usual: {aged}");
        for (cluster, offset) in &read.evicted {
            let why = bus.eviction_reason(*offset);
            assert!(why.contains("recreated empty") && !why.contains("evicted"), "{cluster}: {why}");
        }
        let all_markers = markers(bus, 1).await;
        assert_eq!(all_markers.len(), 1, "one marker, recorded once for all replicas: {all_markers:?}");
        assert_eq!(bus.first_offset(), first.offset, "the new stream holds no older offset");
    }
    assert_eq!(late.head("c").await.unwrap(), Some((1, 4)));
}

/// The durable cursor store went with JetStream's store: a durable subscriber returning
/// afterwards (e.g. the lifecycle operator, `from: latest` without a resume cursor) must
/// not be taken for a new one and placed after the loss — its name is `Lost`, on the
/// replica that recreated the stream, on one that took it on, and on one started later
/// (the flag lives in the bucket). A name stored since is known again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_name_lost_with_the_cursor_store_is_reported_lost() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(a.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::New, "a fresh bus has lost nothing");
    a.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    a.register_durable("op", "lifecycle", 2).await.unwrap();
    assert_eq!(b.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(2));

    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&a, &b, &late] {
        assert_eq!(bus.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Lost);
    }
    // Stored again at the subscriber's first ack after its resync (on a, which registered
    // the name before the loss): known from then on, everywhere.
    a.set_durable_cursor("op", "lifecycle", 9).await.unwrap();
    assert_eq!(a.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(9), "before the flush too");
    a.flush_cursors().await.unwrap();
    for bus in [&a, &b, &late] {
        assert_eq!(bus.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(9));
    }
}

/// A new bus begun by a hub that waited for a missing stream, found at once by another
/// replica that did not wait and writes the cursor store's meta entry before the creator
/// does (it is still making its buckets): that replica answers as the creator would, from
/// the stream's description, and an unknown durable name is `Lost` (seed 15240's
/// neighbour; before, it wrote "no names lost" and the name was taken for a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_finding_a_bus_begun_after_a_wait_writes_the_creators_meta_entry() {
    let (server, _dir) = server();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    // The creator's stream, created in one step with its description; its buckets not yet.
    let mut config = super::nats::wanted_config(&NatsOptions {
        stream: "fw".into(),
        ..NatsOptions::new(vec![server.url()], keep_all())
    });
    config.description = Some(super::nats_state::describe_begun_after_wait());
    js.create_stream(config).await.unwrap();
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(b.durable_lookup("op", "d").await.unwrap(), Lookup::Lost);
}

/// A replica restarted on a stream whose cursor store lost its meta entry (the bucket
/// deleted while the stream kept its history) reports unknown names as `Lost` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_store_recreated_under_a_stream_with_history_has_lost_names() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    a.register_durable("op", "d", 1).await.unwrap();
    drop(a);
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("KV_fw_cursors").await.unwrap();
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(b.durable_lookup("op", "d").await.unwrap(), Lookup::Lost);
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
    a.flush_cursors().await.unwrap();
    for bus in [&a, &b] {
        assert_eq!(bus.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(400));
    }
    // Moves of the current registration still go forward, from any replica.
    b.set_durable_cursor("sub", "d", 450).await.unwrap();
    b.flush_cursors().await.unwrap();
    assert_eq!(a.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(450));
    // And a's later moves of its old registration stay dropped.
    a.set_durable_cursor("sub", "d", 600).await.unwrap();
    a.flush_cursors().await.unwrap();
    assert_eq!(b.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(450));
}

/// A hub replica that crashes right after a batch was partly stored (a hole, then a stored
/// record) owes nothing: the record after the hole names its lost predecessor (`Fw-Prev`),
/// so every replica — one following the stream, one started after the crash — delivers it
/// as `resync-required` from the stream alone, and the agent's resend on another replica
/// is skipped up to the stored head without hiding the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_partly_stored_batch_still_marks_the_loss() {
    let (server, _dir) = server();
    let follower = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    {
        let crashing = open(&server.url(), "fw", keep_all()).await;
        assert_eq!(crashing.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
        refuse_big_records(&server.url()).await;
        // 3 refused, 4 stored: the batch fails and the replica dies before anything else
        // (no heads flushed, no marker appended, the agent never acked).
        assert!(crashing.append(c.clone(), vec![ev(1, 2), big(3), ev(1, 4)]).await.is_err());
    }
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&follower, &late] {
        wait_for("the tail at offset 3", Duration::from_secs(30), async || bus.last_offset() == 3).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true)], "3 was lost: 4 is a marker");
    }
    // The agent resends from 2 to the late replica: 2 and 4 are duplicates, 5 is new.
    assert_eq!(late.head("eu-1").await.unwrap(), Some((1, 4)));
    assert_eq!(late.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    for bus in [&follower, &late] {
        wait_for("the tail at offset 4", Duration::from_secs(30), async || bus.last_offset() == 4).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true), (5, false)]);
    }
}

/// A hub that starts while NATS has just come back empty waits for the running replica to
/// recreate the stream as the continuation of the bus, instead of creating a new bus of
/// its own (whose offsets would repeat the running replica's): both end up on one bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_starting_right_after_nats_lost_its_store_joins_the_recreated_stream() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    // Started at once, with a generous wait (the default is shorter) for a busy machine.
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::from_secs(60),
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let c = NatsBus::open(opts).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stream_id(), a.stream_id(), "one bus");
    wait_for("a took the stream on", Duration::from_secs(60), async || recreated(&a)).await;
    assert!(c.offset_base() > 1 && c.offset_base() == a.offset_base());
    c.prepare_reads().await.unwrap();
    assert!(c.append("c".into(), vec![ev(1, 2)]).await.unwrap() > c.offset_base());
}

/// A stream recreated by a hub that did not know this bus (a new bus, offsets from 1) is
/// not taken on as if it continued it: the replica says why it cannot go on, refuses
/// appends and reads (its subscribers reconnect elsewhere and resync), instead of handing
/// out offsets it already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_as_another_bus_makes_the_replica_refuse_to_go_on() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("fw").await.unwrap();
    // Another hub creates a new bus at once, before a notices the stream gone.
    let other = open(&server.url(), "fw", keep_all()).await;
    assert_ne!(other.stream_id(), a.stream_id());
    wait_for("a to refuse", Duration::from_secs(60), async || a.health().is_err_and(|e| e.contains("restart"))).await;
    let err = a.append("c".into(), vec![ev(1, 3)]).await.unwrap_err();
    assert!(err.to_string().contains("did not know bus"), "{err}");
    assert!(a.read(1, 10).await.is_err(), "a reader's session ends instead of waiting for offsets");
    assert!(other.health().is_ok());
}

/// JetStream lost its store twice in a short time, and the second stream was recreated by
/// a replica that had not taken on the first recreation: from what it knew, it chose the
/// same offset base, so the new stream's offsets repeat offsets a replica that did take
/// the first one on handed out. That replica must neither take it on (its readers would
/// skip the new stream's first records, its `*` among them) nor refuse for good (unready
/// until restarted, its agents' events refused: the NATS soak found this): it recreates the
/// stream above every offset it knows, and a reader going on from any cursor it was given
/// reads `resync-required *` next, on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_below_offsets_a_replica_handed_out_is_recreated_above_them() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let first_base = a.offset_base();
    assert_eq!(b.offset_base(), first_base);
    let mut handed_out = 0;
    for seq in 2..=6 {
        handed_out = append_eventually(&a, "c", || vec![ev(1, seq)]).await;
    }
    assert!(handed_out > first_base + 1, "{handed_out}");

    // A replica that never saw the first recreation recreates the stream at the same base,
    // with its own marker, and an agent of it appends one record.
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("fw").await.unwrap();
    let opts = NatsOptions::new(vec![server.url()], keep_all());
    let mut config = super::nats::wanted_config(&NatsOptions { stream: "fw".into(), ..opts });
    let stale = super::nats_state::Lineage { id: a.stream_id().to_string(), base: first_base };
    config.description = Some(super::nats_state::describe(Some(&stale)));
    js.create_stream(config).await.unwrap();
    js.publish("fw.stale", Bytes::from_static(b"{}")).await.unwrap().await.unwrap();

    for bus in [&a, &b] {
        wait_for("a stream above every offset handed out", Duration::from_secs(90), async || {
            bus.offset_base() > handed_out && bus.health().is_ok()
        })
        .await;
        assert_eq!(bus.stream_id(), a.stream_id(), "still one bus");
    }
    let next = append_eventually(&a, "c", || vec![ev(1, 7)]).await;
    assert!(next > handed_out, "offsets go on above the ones handed out: {next} after {handed_out}");
    b.prepare_reads().await.unwrap();
    for bus in [&a, &b] {
        wait_for("the tail holds the append", Duration::from_secs(30), async || bus.last_offset() >= next).await;
        // A reader going on from the last cursor a handed out reads the marker first.
        let read = bus.read(handed_out + 1, 100).await.unwrap();
        let first = read.records.first().expect("records after the cursor");
        assert_eq!(first.cluster.as_ref(), "*", "{:?}", read.records);
        match &first.body {
            RecordBody::ResyncRequired(why) => assert!(why.contains(super::nats::RECREATED), "{why}"),
            other => panic!("the first record after the cursor is {other:?}"),
        }
        assert!(!bus.health().is_err_and(|e| e.contains("restart")), "not refused for good");
    }
}

/// A rolled-back hub refuses a bus a newer release keeps in another format (the cursors
/// bucket's meta entry says so), in one line naming both formats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_of_a_newer_format_is_refused() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    drop(bus);
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let kv = js.get_key_value("fw_cursors").await.unwrap();
    let meta = kv.get("meta.bus").await.unwrap().unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    assert_eq!(value["format"], 1, "{value}");
    value["format"] = 2.into();
    kv.put("meta.bus", serde_json::to_vec(&value).unwrap().into()).await.unwrap();
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let err = match NatsBus::open(opts).await {
        Ok(_) => panic!("a bus of a newer format was opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("kept in format 2, newer than this hub's 1"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

/// Publishes a record as `headers` name it, straight to JetStream (a release before the
/// format marks, or a newer one); answers its stream sequence.
async fn publish_raw(
    js: &async_nats::jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    payload: &str,
) -> u64 {
    let mut map = async_nats::HeaderMap::new();
    for (k, v) in headers {
        map.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), map, Bytes::from(payload.to_string()))
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// What the releases before the format marks wrote — records without `Fw-Format`, heads and
/// cursor entries without `format` — is read as format 1; what this release writes carries
/// the marks (but for cursor entries of format 1, which the releases before read only
/// without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_heads_and_cursors_without_a_format_are_read_as_format_1() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let id = a.stream_id().to_string();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    // An agent's record and a head and cursor entry as the previous release wrote them.
    let old = [("Fw-Epoch", "7"), ("Fw-Seq", "1"), ("Fw-Kind", "event"), ("Fw-Prev", "-"), ("Fw-Known", "0")];
    let seq = publish_raw(&js, "fw.old", &old, r#"{"seq":1}"#).await;
    let heads = js.get_key_value("fw_heads").await.unwrap();
    heads.put("gone", Bytes::from_static(br#"{"epoch":3,"seq":40,"offset":1}"#)).await.unwrap();
    let cursors = js.get_key_value("fw_cursors").await.unwrap();
    let entry = format!(r#"{{"names":{{"d":{seq}}},"regs":{{"d":5}},"bus":"{id}"}}"#);
    cursors.put("sub", Bytes::from(entry)).await.unwrap();

    let b = open(&server.url(), "fw", keep_all()).await;
    assert!(b.health().is_ok(), "{:?}", b.health());
    assert_eq!(b.head("old").await.unwrap(), Some((7, 1)), "the head from the unmarked record");
    assert_eq!(b.head("gone").await.unwrap(), Some((3, 40)), "the head from the unmarked bucket value");
    assert_eq!(b.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(seq));
    wait_for("the unmarked record in the tail", Duration::from_secs(30), async || b.last_offset() >= seq).await;
    let read = b.read(seq, 10).await.unwrap();
    assert_eq!(read.records.first().map(|r| (r.cluster.as_ref(), r.epoch, r.seq)), Some(("old", 7, 1)));
    assert!(matches!(read.records[0].body, RecordBody::Event(_)), "{:?}", read.records[0]);
    // The agent goes on: its next record follows the unmarked one.
    let next = b.append("old".into(), vec![ev(7, 2)]).await.unwrap();
    b.register_durable("sub", "d", next).await.unwrap();
    wait_for("the head flushed", Duration::from_secs(30), async || {
        b.flush_cursors().await.is_ok() && heads.get("old").await.unwrap().is_some()
    })
    .await;
    let stream = js.get_stream("fw").await.unwrap();
    let written = stream.get_raw_message(next).await.unwrap();
    assert_eq!(written.headers.get("Fw-Format").map(|v| v.as_str()), Some("1"));
    assert!(matches!(b.read(next, 1).await.unwrap().records[0].body, RecordBody::Event(_)), "it follows");
    let head: serde_json::Value = serde_json::from_slice(&heads.get("old").await.unwrap().unwrap()).unwrap();
    assert_eq!(head["format"], 1, "{head}");
    let entry: serde_json::Value = serde_json::from_slice(&cursors.get("sub").await.unwrap().unwrap()).unwrap();
    assert_eq!(entry["names"]["d"], next, "{entry}");
    assert!(entry.get("format").is_none(), "format 1 cursor entries stay unmarked: {entry}");
}

/// A record, head or cursor entry a newer release wrote (a rolled-back replica next to a
/// newer one, or reading what it left) is refused with both formats named: the replica does
/// not go on (its hub exits), and nothing is skipped, cut or written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_head_or_cursor_entry_of_a_newer_format_is_refused_untouched() {
    let (server, _dir) = server();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let refused =
        |e: &str| e.contains("kept in format 2, newer than this hub's 1") && e.contains("leaves it untouched");

    // A record: the replica's tail stops before it and the replica refuses to go on.
    let a = open(&server.url(), "fw1", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    let newer = [("Fw-Epoch", "1"), ("Fw-Seq", "2"), ("Fw-Kind", "event"), ("Fw-Prev", "1/1"), ("Fw-Format", "2")];
    let seq = publish_raw(&js, "fw1.c", &newer, r#"{"a":"shape this release does not know"}"#).await;
    wait_for("the replica to refuse", Duration::from_secs(30), async || a.fatal().is_some()).await;
    let why = a.fatal().unwrap_or_default();
    assert!(refused(&why) && why.contains(&format!("offset {seq}")), "{why}");
    assert!(a.health().is_err_and(|e| refused(&e)));
    assert!(a.append("c".into(), vec![ev(1, 3)]).await.is_err(), "no appends after it");
    assert!(a.read(1, 10).await.is_err(), "no reads either");
    let kept = js.get_stream("fw1").await.unwrap().get_raw_message(seq).await.unwrap();
    assert_eq!(kept.headers.get("Fw-Format").map(|v| v.as_str()), Some("2"), "the record is still there");
    // A replica without a tail asked for the cluster's head (an agent's hello) refuses too.
    let opts = NatsOptions {
        stream: "fw1".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let b = NatsBus::open(opts).await.unwrap_or_else(|e| panic!("{e}"));
    let err = b.head("c").await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the last record of cluster c"), "{err}");
    assert!(b.fatal().is_some_and(|w| refused(&w)));

    // A cursor entry: the durable subscriber is refused, the entry left as it is.
    let c = open(&server.url(), "fw2", keep_all()).await;
    let cursors = js.get_key_value("fw2_cursors").await.unwrap();
    let entry = format!(r#"{{"format":2,"subscribers":[{{"name":"d","at":"4","bus":"{}"}}]}}"#, c.stream_id());
    let revision = cursors.put("sub", Bytes::from(entry.clone())).await.unwrap();
    let err = c.durable_lookup("sub", "d").await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the durable cursors of sub"), "{err}");
    assert!(c.register_durable("sub", "d", 1).await.is_err());
    assert!(c.set_durable_cursor("sub", "d", 1).await.is_err() || c.flush_cursors().await.is_err());
    let now = cursors.entry("sub").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, entry.as_bytes()), "written over");

    // A head in the bucket: a replica does not start on it.
    drop(open(&server.url(), "fw3", keep_all()).await);
    let heads = js.get_key_value("fw3_heads").await.unwrap();
    let head = br#"{"epoch":1,"seq":9,"offset":3,"format":2,"lineage":"x"}"#;
    let revision = heads.put("c", Bytes::from_static(head)).await.unwrap();
    let opts = NatsOptions {
        stream: "fw3".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let err = match NatsBus::open(opts).await {
        Ok(_) => panic!("a replica started on a head of a newer format"),
        Err(e) => e.to_string(),
    };
    assert!(refused(&err) && err.contains("the head of cluster c"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    let now = heads.entry("c").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, &head[..]));

    // A head a newer replica wrote while this one runs: its next head of the cluster does
    // not write over it (compare-and-set on what it wrote last).
    let d = open(&server.url(), "fw4", keep_all()).await;
    d.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    d.flush_cursors().await.unwrap();
    let heads = js.get_key_value("fw4_heads").await.unwrap();
    let newer = br#"{"epoch":1,"seq":1,"offset":1,"format":2}"#;
    let revision = heads.put("c", Bytes::from_static(newer)).await.unwrap();
    d.append("c".into(), vec![ev(1, 2)]).await.unwrap();
    let err = d.flush_cursors().await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the head of cluster c"), "{err}");
    assert!(d.fatal().is_some());
    let now = heads.entry("c").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, &newer[..]), "written over");
}
