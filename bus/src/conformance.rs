//! The conformance suite: what every [`Bus`] backend must do, written once as functions
//! that take a factory (retention in, fresh bus out) and run against each backend below.
//! A new backend adds a factory and one `mod` to `for_each_backend`, and must pass all of
//! it before sessions may use it. The NATS backend runs against a real `nats-server`
//! started per test (the Debian package; the test fails, saying so, when it is missing).
//!
//! Backend-specific behaviour (recovery of damaged segment files, failed disk writes)
//! stays in the backend's own tests ([`super::tests`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::{
    Append, Bus, BusError, BusOptions, DurableError, Flush, Gap, Lookup, MAX_NAMES_PER_IDENTITY, MAX_REASON_BYTES,
    MemoryBus, NatsBus, NatsOptions, RecordBody, Retention, SegmentLogBus,
};
use crate::nats::server::LocalNatsServer;

/// Opens a fresh, empty bus with the given retention.
pub(super) type Factory = Box<dyn Fn(Retention) -> Arc<dyn Bus> + Send + Sync>;

fn ev(epoch: u64, seq: u64) -> Append {
    Append { epoch, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq}}}"#))) }
}

fn marker(epoch: u64, seq: u64, reason: &str) -> Append {
    Append { epoch, seq, body: RecordBody::ResyncRequired(reason.into()) }
}

/// Retention that evicts nothing in a test.
fn keep_all() -> Retention {
    Retention { records: 1_000_000, bytes: 1 << 30, age: None }
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Duplicates by (epoch, seq) are skipped; reads return records in order with `next`.
pub(super) async fn appends_dedupe_and_read(open: Factory) {
    let bus = open(keep_all());
    assert!(!bus.stream_id().is_empty());
    assert_eq!((bus.stats().first_offset, bus.last_offset()), (1, 0), "an empty bus");
    let c: Arc<str> = "c1".into();
    assert_eq!(bus.append(c.clone(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(), 2);
    // A resend of seq 2 plus a new seq 3: only 3 is appended.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    // Only duplicates: nothing appended, the answer is the log's last offset.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 3);
    assert_eq!(bus.head("c1").await.unwrap(), Some((1, 3)));
    assert_eq!(bus.head("other").await.unwrap(), None);
    let r = bus.read(1, 10).await.unwrap();
    assert_eq!(r.records.iter().map(|r| (r.offset, r.seq)).collect::<Vec<_>>(), vec![(1, 1), (2, 2), (3, 3)]);
    assert!(r.records.iter().all(|r| &*r.cluster == "c1" && r.epoch == 1));
    assert!(matches!(&r.records[0].body, RecordBody::Event(b) if &b[..] == br#"{"seq":1}"#));
    assert_eq!(r.next, 4);
    assert!(r.evicted.is_empty());
    // A new epoch starts over, whatever its seqs. (It begins with its "agent started"
    // marker, as an agent does: a shared bus answers events of another process chained
    // onto this one's records with a marker of its own, see `interleave_marker` in `nats/append.rs`.)
    assert_eq!(bus.append(c.clone(), vec![marker(2, 1, "agent started")]).await.unwrap(), 4);
    assert_eq!(bus.head("c1").await.unwrap(), Some((2, 1)));
    let stats = bus.stats();
    assert_eq!((stats.first_offset, stats.last_offset, stats.retained), (1, 4, 4));
}

/// Reads honour `max`, always make progress, and stop at the end.
pub(super) async fn reads_page_and_stop_at_the_end(open: Factory) {
    let bus = open(keep_all());
    for seq in 1..=10 {
        bus.append("a".into(), vec![ev(1, seq)]).await.unwrap();
    }
    let mut from = 1;
    let mut seen = Vec::new();
    while from <= bus.last_offset() {
        let r = bus.read(from, 3).await.unwrap();
        assert!(r.records.len() <= 3);
        assert!(r.next > from, "a read below the end makes progress");
        seen.extend(r.records.iter().map(|r| r.offset));
        from = r.next;
    }
    assert_eq!(seen, (1..=10).collect::<Vec<_>>());
    let at_end = bus.read(11, 3).await.unwrap();
    assert!(at_end.records.is_empty());
    assert_eq!(at_end.next, 11);
    assert_eq!(bus.read(0, 1).await.unwrap().records[0].offset, 1, "offset 0 reads from the start");
}

/// Resync markers are records of their cluster; reasons are cut on a char boundary;
/// markers move the cluster's head like events.
pub(super) async fn markers_are_records_and_reasons_are_capped(open: Factory) {
    let bus = open(keep_all());
    let reason = "é".repeat(1000); // 2000 bytes
    bus.append("a".into(), vec![marker(1, 1, &reason)]).await.unwrap();
    bus.append("a".into(), vec![marker(1, 1, "again")]).await.unwrap(); // a duplicate
    assert_eq!(bus.head("a").await.unwrap(), Some((1, 1)));
    let r = bus.read(1, 10).await.unwrap();
    assert_eq!(r.records.len(), 1);
    match &r.records[0].body {
        RecordBody::ResyncRequired(stored) => {
            assert_eq!(stored.len(), MAX_REASON_BYTES);
            assert!(stored.chars().all(|c| c == 'é'));
        }
        other => panic!("{other:?}"),
    }
}

/// Evicted history is reported per cluster to a reader that starts below it.
pub(super) async fn eviction_reports_affected_clusters(open: Factory) {
    let bus = open(Retention { records: 3, ..keep_all() });
    bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    bus.append("b".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap();
    let r = bus.read(1, 10).await.unwrap();
    assert_eq!(r.records.iter().map(|r| r.offset).collect::<Vec<_>>(), vec![3, 4, 5]);
    assert_eq!(r.evicted.iter().map(|(c, o)| (c.to_string(), *o)).collect::<Vec<_>>(), vec![("a".into(), 2)]);
    assert_eq!(bus.stats().first_offset, 3);
    assert!(bus.read(3, 10).await.unwrap().evicted.is_empty(), "nothing evicted at or above the first offset");
    // The head survives its cluster's eviction: a resend is still a duplicate.
    assert_eq!(bus.head("a").await.unwrap(), Some((1, 2)));
    assert_eq!(bus.append("a".into(), vec![ev(1, 2)]).await.unwrap(), 5);
}

/// Retention by bytes bounds what is held.
pub(super) async fn retention_by_bytes_bounds_memory(open: Factory) {
    let bus = open(Retention { records: 1_000_000, bytes: 64 << 10, age: None });
    let pad = "x".repeat(4096);
    for seq in 1..=200 {
        let body = RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq},"pad":"{pad}"}}"#)));
        bus.append("a".into(), vec![Append { epoch: 1, seq, body }]).await.unwrap();
        // Never more than the limit plus one batch.
        let held = bus.stats().retained_bytes;
        assert!(held <= (64 << 10) + 4096 + 200, "{held} bytes held");
    }
    let held = bus.stats().retained;
    assert!(held < 20, "{held} records held");
    let evicted = bus.read(1, 10).await.unwrap().evicted;
    assert_eq!(evicted.iter().map(|(c, _)| c.to_string()).collect::<Vec<_>>(), vec!["a"]);
}

/// Retention by age evicts without new appends.
pub(super) async fn retention_by_age_evicts_without_appends(open: Factory) {
    let bus = open(Retention { records: 1_000_000, bytes: 1 << 30, age: Some(Duration::from_millis(200)) });
    bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    wait_for("age eviction", || bus.stats().retained == 0).await;
    assert_eq!(bus.read(1, 10).await.unwrap().evicted.len(), 1);
    assert_eq!(bus.append("a".into(), vec![ev(1, 3)]).await.unwrap(), 3);
}

/// The end signal follows appends, also from many appenders at once, and never goes back.
pub(super) async fn concurrent_appends_get_distinct_offsets_and_the_end_follows(open: Factory) {
    let bus = open(keep_all());
    bus.prepare_reads().await.unwrap();
    let mut end = bus.watch_end();
    assert_eq!(*end.borrow_and_update(), 1);
    bus.append("first".into(), vec![ev(1, 1)]).await.unwrap();
    tokio::time::timeout(Duration::from_secs(30), end.changed()).await.unwrap().unwrap();
    assert_eq!(*end.borrow_and_update(), 2);
    let tasks: Vec<_> = (0..8)
        .map(|t| {
            let bus = bus.clone();
            tokio::spawn(async move {
                let cluster: Arc<str> = format!("c{t}").into();
                for seq in 1..=50 {
                    bus.append(cluster.clone(), vec![ev(1, seq)]).await.unwrap();
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    assert_eq!(bus.last_offset(), 401);
    assert_eq!(*end.borrow_and_update(), 402, "the end never goes back");
    let offsets: Vec<u64> = bus.read(1, 1000).await.unwrap().records.iter().map(|r| r.offset).collect();
    assert_eq!(offsets, (1..=401).collect::<Vec<_>>());
    for t in 0..8 {
        assert_eq!(bus.head(&format!("c{t}")).await.unwrap(), Some((1, 50)));
    }
}

/// Durable cursors: unknown names are new (or lost, on a bus that keeps no cursors across
/// its restarts), registering stores even a lower cursor, moving only goes forward, and
/// names are bounded with a typed error.
pub(super) async fn durable_cursors_move_forward_and_are_bounded(open: Factory) {
    let bus = open(keep_all());
    let unknown = bus.durable_lookup("id", "sub").await.unwrap();
    assert!(matches!(unknown, Lookup::New | Lookup::Lost), "{unknown:?}");
    bus.register_durable("id", "sub", 5).await.unwrap();
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(5));
    bus.set_durable_cursor("id", "sub", 9).await.unwrap();
    bus.set_durable_cursor("id", "sub", 7).await.unwrap();
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(9), "never back");
    bus.register_durable("id", "sub", 3).await.unwrap();
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(3), "a registration is stored as is");
    assert_eq!(bus.durable_lookup("other", "sub").await.unwrap(), unknown, "names are per identity");
    bus.flush(Flush::Cursors).await.unwrap();
    let long = "x".repeat(super::MAX_NAME_BYTES + 1);
    assert!(matches!(bus.durable_lookup("id", &long).await, Err(BusError::Durable(DurableError::NameTooLong { .. }))));
    for i in 1..MAX_NAMES_PER_IDENTITY {
        bus.register_durable("id", &format!("n{i}"), 1).await.unwrap();
    }
    let err = bus.register_durable("id", "one-more", 1).await.unwrap_err();
    assert!(matches!(err, BusError::Durable(DurableError::TooMany { .. })), "{err}");
}

/// The stats follow what is appended and evicted, as one consistent value: offsets,
/// records and bytes held, no write failed, and the last offset the same as
/// [`Bus::last_offset`] alone.
pub(super) async fn stats_follow_appends_and_evictions(open: Factory) {
    let bus = open(Retention { records: 3, ..keep_all() });
    let empty = bus.stats();
    assert_eq!(
        (empty.first_offset, empty.last_offset, empty.retained, empty.retained_bytes, empty.write_failures),
        (1, 0, 0, 0, 0),
        "an empty bus"
    );
    assert!(empty.holds_records, "this hub holds the (no) records: a factory's bus is ready to read");
    bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    let two = bus.stats();
    assert_eq!((two.first_offset, two.last_offset, two.retained), (1, 2, 2));
    let read = bus.read(1, 10).await.unwrap();
    assert_eq!(
        two.retained_bytes,
        read.records.iter().map(|r| r.size()).sum::<u64>(),
        "bytes as retention counts them"
    );
    bus.append("b".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap();
    let after = bus.stats();
    assert_eq!((after.first_offset, after.last_offset, after.retained), (3, 5, 3), "two records evicted");
    assert_eq!(after.last_offset, bus.last_offset());
    assert_eq!(after.durable, empty.durable, "what the backend is does not change");
    assert_eq!(after.write_failures, 0);
}

/// Every gap a subscriber can be told of has a reason: not empty, within
/// [`MAX_REASON_BYTES`] (it goes into a `resync-required` as is), a lost cursor's naming
/// the subscription; and a bus with nothing particular to say about an eviction gives the
/// common text, whatever the offset.
pub(super) async fn resync_reasons_name_each_gap(open: Factory) {
    let bus = open(keep_all());
    bus.append("a".into(), vec![ev(1, 1)]).await.unwrap();
    let name = "audit-\"trail\"";
    for gap in [Gap::LostHistory, Gap::Evicted { offset: 1 }, Gap::Evicted { offset: 7 }, Gap::LostCursor { name }] {
        let reason = bus.resync_reason(gap);
        assert!(!reason.is_empty() && reason.len() <= MAX_REASON_BYTES, "{gap:?}: {reason:?}");
    }
    let lost = bus.resync_reason(Gap::LostCursor { name });
    assert!(lost.contains(&format!("{name:?}")), "names the subscription, quoted: {lost}");
    assert_eq!(
        bus.resync_reason(Gap::Evicted { offset: 1 }),
        "events were evicted from the hub before this subscriber read them"
    );
    assert_eq!(bus.resync_reason(Gap::Evicted { offset: 1 }), bus.resync_reason(Gap::Evicted { offset: 9 }));
}

/// A factory for the in-memory bus.
fn memory() -> Factory {
    Box::new(|retention| MemoryBus::open(retention))
}

/// A factory for the segment-log bus: each bus in its own directory under one temporary
/// directory that lives as long as the factory.
fn segment_log() -> Factory {
    let root = tempfile::tempdir().expect("a temporary directory");
    let n = AtomicU64::new(0);
    Box::new(move |retention| {
        let dir = root.path().join(n.fetch_add(1, Ordering::Relaxed).to_string());
        let opts = BusOptions { dir: Some(dir.clone()), retention, ..BusOptions::default() };
        SegmentLogBus::open(dir, opts).expect("segment log opens")
    })
}

/// A factory for the NATS bus: one `nats-server -js` for the factory, a new stream per bus
/// (so offsets start at 1 each time), its local tail started.
pub(super) fn nats() -> Factory {
    let dir = tempfile::tempdir().expect("a temporary directory");
    let server = LocalNatsServer::start(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let url = server.url();
    let n = AtomicU64::new(0);
    Box::new(move |retention| {
        let _alive = (&server, &dir);
        let opts = NatsOptions {
            stream: format!("t{}", n.fetch_add(1, Ordering::Relaxed)),
            missing_stream_wait: Duration::ZERO,
            ..NatsOptions::new(vec![url.clone()], retention)
        };
        // A replica with a reader from the start, as a hub with subscribers is (its local
        // tail follows every append; one started later is `nats_tests::lazy_tails_…`).
        let open = async move {
            let bus = NatsBus::open(opts).await?;
            bus.start_tail().await?;
            Ok::<_, super::NatsError>(bus)
        };
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(open))
            .unwrap_or_else(|e| panic!("NATS bus opens: {e}"))
    })
}

/// Runs one conformance function against every backend.
macro_rules! for_each_backend {
    ($($name:ident),* $(,)?) => {
        mod memory_bus {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::memory()).await
                }
            )*
        }
        mod nats_bus {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::nats()).await
                }
            )*
        }
        mod segment_log_bus {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name(super::segment_log()).await
                }
            )*
        }
    };
}

for_each_backend!(
    appends_dedupe_and_read,
    reads_page_and_stop_at_the_end,
    markers_are_records_and_reasons_are_capped,
    eviction_reports_affected_clusters,
    retention_by_bytes_bounds_memory,
    retention_by_age_evicts_without_appends,
    concurrent_appends_get_distinct_offsets_and_the_end_follows,
    durable_cursors_move_forward_and_are_bounded,
    stats_follow_appends_and_evictions,
    resync_reasons_name_each_gap,
);
