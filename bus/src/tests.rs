//! Segment-log tests: the durable log across restarts, under damage and failed writes.
//! What every backend does is in [`super::conformance`].

use std::io::Write;
use std::time::{Duration, Instant};

use std::path::{Path, PathBuf};

use super::*;
use crate::segment_log::{record, segment};

fn ev(epoch: u64, seq: u64) -> Append {
    Append { epoch, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq}}}"#))) }
}

/// An event of about `size` bytes.
fn big(seq: u64, size: usize) -> Append {
    let pad = "x".repeat(size);
    Append { epoch: 1, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq},"pad":"{pad}"}}"#))) }
}

fn disk(dir: &Path, segment_records: u64) -> BusOptions {
    BusOptions {
        dir: Some(dir.into()),
        retention: Retention { records: 100_000, bytes: 1 << 30, age: None },
        segment_records,
        ..BusOptions::default()
    }
}

fn open_disk(opts: BusOptions) -> Arc<SegmentLogBus> {
    SegmentLogBus::open(opts.dir.clone().expect("a data directory"), opts).unwrap()
}

fn segments(dir: &Path) -> Vec<PathBuf> {
    segment::list(&dir.join("segments")).unwrap().into_iter().map(|(_, p)| p).collect()
}

/// `(cluster, reason)` of every resync-required record.
fn resyncs(bus: &SegmentLogBus) -> Vec<(String, String)> {
    bus.read_now(0, usize::MAX)
        .records
        .iter()
        .filter_map(|r| match &r.body {
            RecordBody::ResyncRequired(reason) => Some((r.cluster.to_string(), reason.clone())),
            RecordBody::Event(_) => None,
        })
        .collect()
}

fn events_of(bus: &SegmentLogBus, cluster: &str) -> Vec<u64> {
    bus.read_now(0, usize::MAX)
        .records
        .iter()
        .filter(|r| &*r.cluster == cluster && matches!(r.body, RecordBody::Event(_)))
        .map(|r| r.seq)
        .collect()
}

async fn wait_for(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn survives_restart_and_cuts_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 4);
    let stream;
    {
        let bus = open_disk(opts.clone());
        stream = bus.stream_id().to_string();
        for i in 1..=10 {
            bus.append("c".into(), vec![ev(7, i)]).await.unwrap();
        }
        bus.append("c".into(), vec![Append { epoch: 7, seq: 11, body: RecordBody::ResyncRequired("x".into()) }])
            .await
            .unwrap();
        bus.register_durable("id", "sub", 5).await.unwrap();
        bus.flush_cursors_now().unwrap();
    }
    // A write cut short at the end of the last segment (a crash, never acked).
    let last = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&last).unwrap().len();
    let mut frame = Vec::new();
    let rec = Record { offset: 12, cluster: "c".into(), epoch: 7, seq: 12, time_ms: 0, body: ev(7, 12).body };
    record::encode(&rec, &mut frame);
    std::fs::OpenOptions::new().append(true).open(&last).unwrap().write_all(&frame[..frame.len() - 5]).unwrap();
    let bus = open_disk(opts);
    assert_eq!(std::fs::metadata(&last).unwrap().len(), len, "torn tail cut");
    assert_eq!(bus.stream_id(), stream);
    assert_eq!(bus.head_now("c"), Some((7, 11)));
    assert_eq!(bus.last_offset(), 11);
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(5));
    assert_eq!(bus.durable_lookup("id", "other").await.unwrap(), Lookup::New, "an intact store knows new names");
    let r = bus.read_now(1, 100);
    assert_eq!(r.records.len(), 11);
    assert_eq!(resyncs(&bus), vec![("c".to_string(), "x".to_string())], "a torn tail is no loss");
    assert_eq!(bus.append("c".into(), vec![ev(7, 12)]).await.unwrap(), 12);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_digit_is_skipped_and_its_cluster_resynced() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 3);
    {
        let bus = open_disk(opts.clone());
        bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
        bus.append("b".into(), vec![ev(1, 1)]).await.unwrap(); // segment 1: a, a, b
        bus.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(); // segment 2
    }
    let first = &segments(dir.path())[0];
    let mut bytes = std::fs::read(first).unwrap();
    let at = bytes.windows(9).position(|w| w == br#"{"seq":2}"#).unwrap();
    bytes[at + 7] = b'3';
    std::fs::write(first, &bytes).unwrap();
    let bus = open_disk(opts.clone());
    // The changed record is not delivered; the rest of its segment is.
    assert_eq!(events_of(&bus, "a"), vec![1]);
    assert_eq!(events_of(&bus, "b"), vec![1]);
    assert_eq!(events_of(&bus, "c"), vec![1, 2]);
    let mut got = resyncs(&bus);
    got.sort();
    let file = first.file_name().unwrap().to_string_lossy().into_owned();
    let reason = format!("records lost in segment {file} at offset {}: checksum mismatch", {
        let mut f = Vec::new();
        record::encode(&bus.read_now(1, 1).records[0], &mut f);
        f.len()
    });
    assert_eq!(got, vec![("a".to_string(), reason.clone()), ("b".to_string(), reason)]);
    drop(bus);
    // The damage was removed: a second start records nothing new.
    let bus = open_disk(opts);
    assert_eq!(resyncs(&bus).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn zeroed_block_in_an_older_segment_is_skipped_and_later_records_kept() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 100);
    {
        let bus = open_disk(opts.clone());
        for seq in 1..=50 {
            bus.append("a".into(), vec![big(seq, 200)]).await.unwrap();
            bus.append("b".into(), vec![big(seq, 200)]).await.unwrap();
        }
        for seq in 1..=10 {
            bus.append("c".into(), vec![big(seq, 200)]).await.unwrap();
        }
    }
    let segs = segments(dir.path());
    assert_eq!(segs.len(), 2);
    let mut f = std::fs::OpenOptions::new().write(true).open(&segs[0]).unwrap();
    use std::io::Seek;
    f.seek(std::io::SeekFrom::Start(8192)).unwrap();
    f.write_all(&[0u8; 4096]).unwrap();
    drop(f);
    let bus = open_disk(opts);
    let a = events_of(&bus, "a");
    let b = events_of(&bus, "b");
    assert!(a.len() < 50 && a.len() > 30, "a kept {}", a.len());
    assert_eq!(a.last(), Some(&50), "records after the damage are kept");
    assert_eq!(b.last(), Some(&50));
    assert_eq!(events_of(&bus, "c").len(), 10);
    let mut got: Vec<_> = resyncs(&bus).into_iter().map(|(c, _)| c).collect();
    got.sort();
    assert_eq!(got, vec!["a", "b"], "every cluster of the damaged segment, and only those");
    // The damage starts at the record that holds byte 8192 (the frame header or payload).
    let reason = &resyncs(&bus)[0].1;
    let file = segs[0].file_name().unwrap().to_string_lossy().into_owned();
    let prefix = format!("records lost in segment {file} at offset ");
    assert!(reason.starts_with(&prefix), "{reason}");
    let (at, why) = reason[prefix.len()..].split_once(": ").unwrap();
    let at: u64 = at.parse().unwrap();
    assert!((8192 - 400..=8192).contains(&at), "{reason}");
    assert!(["checksum mismatch", "no record header (bad magic)"].contains(&why), "{reason}");
    // Reading across the gap in offsets always makes progress.
    let mut from = 1;
    let mut reads = 0;
    while from <= bus.last_offset() {
        let r = bus.read_now(from, 7);
        assert!(r.next > from);
        from = r.next;
        reads += 1;
        assert!(reads < 1000);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failed_write_is_cut_not_acked_and_appends_resume() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 1000);
    let bus = open_disk(opts.clone());
    bus.append("a".into(), vec![ev(1, 1)]).await.unwrap();
    let seg = segments(dir.path()).pop().unwrap();
    let len = std::fs::metadata(&seg).unwrap().len();
    bus.fault_injection()
        .expect("the segment log has storage")
        .inject_storage_fault(Duration::from_secs(3600))
        .unwrap();
    let err = bus.append("a".into(), vec![ev(1, 2), ev(1, 3)]).await.unwrap_err();
    let msg = err.to_string();
    assert!(msg.starts_with("no space left on device ("), "{msg}");
    assert!(msg.contains(".log)"), "{msg}");
    assert_eq!(msg.matches("no space").count(), 1);
    assert_eq!(bus.health().unwrap_err(), msg);
    assert_eq!(std::fs::metadata(&seg).unwrap().len(), len, "half-written batch cut");
    assert!(bus.append("a".into(), vec![ev(1, 2)]).await.is_err(), "no later append is acked while failing");
    assert_eq!(bus.last_offset(), 1);
    assert_eq!(bus.stats().write_failures, 2);
    bus.fault_injection().expect("the segment log has storage").inject_storage_fault(Duration::ZERO).unwrap();
    // The readiness probe clears the failure without any append.
    wait_for("readiness after the fault", || bus.health().is_ok()).await;
    assert_eq!(bus.append("a".into(), vec![ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    drop(bus);
    let bus = open_disk(opts);
    assert_eq!(events_of(&bus, "a"), vec![1, 2, 3]);
    assert!(resyncs(&bus).is_empty(), "a cut write is no damage: {:?}", resyncs(&bus));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursor_beyond_the_end_gets_resync_and_offsets_are_not_reused() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 5);
    {
        let bus = open_disk(opts.clone());
        for seq in 1..=12 {
            bus.append("a".into(), vec![ev(1, seq)]).await.unwrap();
        }
        bus.register_durable("id", "sub", 12).await.unwrap();
        bus.flush_cursors_now().unwrap();
    }
    // The log loses its end: the last segment (offsets 11, 12) is deleted.
    std::fs::remove_file(segments(dir.path()).pop().unwrap()).unwrap();
    let bus = open_disk(opts);
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(12));
    assert!(bus.last_offset() > 12, "the log continues above every offset handed out");
    let r = bus.read_now(13, 100);
    assert_eq!(r.records.len(), 1);
    // The log's mark names the cluster whose acked records went with the segment.
    assert_eq!(&*r.records[0].cluster, "a");
    assert!(matches!(&r.records[0].body, RecordBody::ResyncRequired(s) if s.contains("missing")));
    let next = bus.append("a".into(), vec![ev(2, 1)]).await.unwrap();
    assert!(next > 12);
    assert_eq!(bus.read_now(13, 100).records.len(), 2, "new records are readable after the cursor");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_cursor_store_makes_every_durable_name_unknown() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 100);
    {
        let bus = open_disk(opts.clone());
        bus.append("a".into(), vec![ev(1, 1)]).await.unwrap();
        bus.register_durable("id", "sub", 1).await.unwrap();
        bus.flush_cursors_now().unwrap();
    }
    std::fs::remove_file(dir.path().join("cursors.json")).unwrap();
    let bus = open_disk(opts.clone());
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Lost);
    assert_eq!(bus.durable_lookup("id", "new").await.unwrap(), Lookup::Lost);
    bus.register_durable("id", "sub", 1).await.unwrap();
    bus.flush_cursors_now().unwrap();
    drop(bus);
    let bus = open_disk(opts);
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(1));
    assert_eq!(bus.durable_lookup("id", "other").await.unwrap(), Lookup::Lost, "still unknown after a restart");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_format_is_moved_aside_and_a_new_stream_starts() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("segments")).unwrap();
    std::fs::write(dir.path().join("stream-id"), "abc").unwrap();
    std::fs::write(dir.path().join("segments/00000000000000000001.log"), "{\"o\":1}\n").unwrap();
    let bus = open_disk(disk(dir.path(), 100));
    assert_ne!(bus.stream_id(), "abc");
    assert_eq!(bus.last_offset(), 0);
    assert!(dir.path().join("segments-v1/00000000000000000001.log").exists());
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Lost);
}

/// Every file of a directory with its bytes, to show a refused start changed nothing.
fn snapshot(dir: &std::path::Path) -> Vec<(std::path::PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                todo.push(p);
            } else {
                out.push((p.clone(), std::fs::read(&p).unwrap()));
            }
        }
    }
    out.sort();
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_format_is_refused_and_left_untouched() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 100);
    {
        let bus = open_disk(opts.clone());
        bus.append("a".into(), vec![ev(1, 1)]).await.unwrap();
        bus.register_durable("id", "sub", 1).await.unwrap();
        bus.flush_cursors_now().unwrap();
    }
    assert_eq!(std::fs::read_to_string(dir.path().join("format")).unwrap(), "fleetwatch-bus 2\n");
    let refuse = |what: &str| {
        let before = snapshot(dir.path());
        let err = match SegmentLogBus::open(dir.path().to_path_buf(), opts.clone()) {
            Ok(_) => panic!("{what}: a newer format was opened"),
            Err(e) => e.to_string(),
        };
        assert_eq!(snapshot(dir.path()), before, "{what}: the refused start changed the directory");
        assert!(!err.contains('\n'), "one line: {err}");
        err
    };
    // A newer data directory format.
    std::fs::write(dir.path().join("format"), "fleetwatch-bus 3\n").unwrap();
    let err = refuse("format file");
    assert!(err.contains("\"fleetwatch-bus 3\"") && err.contains("newer than this hub's fleetwatch-bus 2"), "{err}");
    assert!(err.contains("nothing was changed"), "{err}");
    std::fs::write(dir.path().join("format"), "something else\n").unwrap();
    refuse("unknown format text");
    std::fs::write(dir.path().join("format"), "fleetwatch-bus 2\n").unwrap();
    // A newer cursor store.
    let cursors = std::fs::read_to_string(dir.path().join("cursors.json")).unwrap();
    std::fs::write(dir.path().join("cursors.json"), cursors.replace("\"version\":2", "\"version\":3")).unwrap();
    let err = refuse("cursor store");
    assert!(err.contains("the cursor store is version 3, newer than this hub's version 2"), "{err}");
    std::fs::write(dir.path().join("cursors.json"), &cursors).unwrap();
    // A segment whose records have a newer frame format (not damage to cut).
    let seg = dir.path().join("segments/00000000000000000001.log");
    let bytes = std::fs::read(&seg).unwrap();
    let mut newer = bytes.clone();
    newer[3] = b'3';
    std::fs::write(&seg, &newer).unwrap();
    let err = refuse("segment");
    assert!(err.contains("a segment is record format 3, newer than this hub's record format 2"), "{err}");
    std::fs::write(&seg, &bytes).unwrap();
    // Put back, the same directory opens with everything in it.
    let bus = open_disk(opts);
    assert_eq!(bus.last_offset(), 1);
    assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_last_record_is_a_loss_for_every_cluster_and_offsets_move_on() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 100);
    {
        let bus = open_disk(opts.clone());
        for seq in 1..=5 {
            bus.append("a".into(), vec![ev(1, seq)]).await.unwrap();
        }
        bus.flush_cursors_now().unwrap();
    }
    // The last record is complete but its content changed: acked, now unreadable.
    let seg = segments(dir.path()).pop().unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let n = bytes.len();
    bytes[n - 3] ^= 0x01;
    std::fs::write(&seg, &bytes).unwrap();
    let bus = open_disk(opts);
    assert_eq!(events_of(&bus, "a"), vec![1, 2, 3, 4]);
    let got = resyncs(&bus);
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].0, ALL_CLUSTERS, "the active segment has no index: every cluster");
    assert!(got[0].1.ends_with("checksum mismatch"), "{}", got[0].1);
    assert!(bus.append("a".into(), vec![ev(1, 6)]).await.unwrap() > 5, "offset 5 is never reused");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_middle_segment_is_reported() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 2);
    {
        let bus = open_disk(opts.clone());
        for seq in 1..=6 {
            bus.append("a".into(), vec![ev(1, seq)]).await.unwrap();
        }
    }
    std::fs::remove_file(&segments(dir.path())[1]).unwrap();
    let bus = open_disk(opts);
    assert_eq!(events_of(&bus, "a"), vec![1, 2, 5, 6]);
    let got = resyncs(&bus);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(got[0].0, ALL_CLUSTERS);
    assert!(got[0].1.starts_with("records 3..=4 missing before segment"), "{}", got[0].1);
}

/// Drops `bus` and waits until its writer let go of it too (a tick in progress holds it),
/// so a bus opened next on the directory does not race its last cursor flush.
async fn closed(bus: Arc<SegmentLogBus>) {
    let weak = Arc::downgrade(&bus);
    drop(bus);
    wait_for("the writer to let go of the bus", || weak.upgrade().is_none()).await;
}

/// Byte positions where each record of a segment starts (frames walked from the start).
fn frame_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = 0;
    while let Ok((_, len)) = record::frame_at(bytes, pos) {
        starts.push(pos);
        pos += len;
    }
    starts
}

/// Cuts the last `n` records of a segment at a record boundary: what a file system that
/// lost its last writes, or a restore, leaves behind. The rest reads back as valid.
fn cut_last_records(seg: &Path, n: usize) {
    let bytes = std::fs::read(seg).unwrap();
    let starts = frame_starts(&bytes);
    let at = starts[starts.len() - n];
    std::fs::OpenOptions::new().write(true).open(seg).unwrap().set_len(at as u64).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_cut_at_a_record_boundary_after_a_crash_resync_their_clusters() {
    let dir = tempfile::tempdir().unwrap();
    let opts = disk(dir.path(), 100);
    {
        // No cursor flush after the appends: the hub is killed within a second of its last
        // ack, so the cursor store's end is behind.
        let bus = open_disk(opts.clone());
        bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
        bus.append("b".into(), vec![ev(7, 1)]).await.unwrap();
        bus.append("a".into(), vec![ev(1, 3)]).await.unwrap();
        bus.append("b".into(), vec![ev(7, 2)]).await.unwrap();
        closed(bus).await;
    }
    // b's last record (offset 5) is cut.
    let seg = segments(dir.path()).pop().unwrap();
    cut_last_records(&seg, 1);
    {
        let bus = open_disk(opts.clone());
        assert_eq!(events_of(&bus, "b"), vec![1]);
        let got = resyncs(&bus);
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(got[0].0, "b", "only b lost acked records: {got:?}");
        assert!(got[0].1.contains("up to seq 2 of epoch 7 (offset 5) are missing"), "{}", got[0].1);
        assert!(got[0].1.contains("the log ends at offset 4"), "{}", got[0].1);
        // Offsets of the lost records are never handed out again.
        assert!(bus.append("c".into(), vec![ev(1, 1)]).await.unwrap() > 5);
        closed(bus).await;
    }
    // A restart after the markers were stored finds nothing more to report.
    let bus = open_disk(opts.clone());
    assert_eq!(resyncs(&bus).len(), 1, "{:?}", resyncs(&bus));
    closed(bus).await;
    // Cut deeper, through records of both clusters (and the marker): both, and the
    // marker's `b` again, are reported.
    let seg = segments(dir.path()).pop().unwrap();
    let starts = frame_starts(&std::fs::read(&seg).unwrap());
    cut_last_records(&seg, starts.len() - 2);
    let bus = open_disk(opts);
    assert_eq!(events_of(&bus, "a"), vec![1, 2]);
    let mut clusters: Vec<_> = resyncs(&bus).into_iter().map(|(c, _)| c).collect();
    clusters.sort();
    clusters.dedup();
    assert_eq!(clusters, ["a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nearly_full_disk_keeps_the_bus_unready_until_a_batch_fits() {
    let dir = tempfile::tempdir().unwrap();
    let bus = open_disk(disk(dir.path(), 1000));
    bus.append("a".into(), vec![ev(1, 1)]).await.unwrap();
    // 8 KiB left: more than the 4 KiB a fixed probe writes, less than a batch.
    bus.storage.set_free(Some(8 << 10));
    let err = bus.append("a".into(), vec![big(2, 32 << 10)]).await.unwrap_err();
    assert!(err.to_string().starts_with("no space left on device ("), "{err}");
    assert!(bus.health().is_err());
    // Readiness probes run (once a second) and must not clear it: a batch as large as
    // the refused one still does not fit.
    let probes = bus.probes.load(std::sync::atomic::Ordering::SeqCst);
    wait_for("two readiness probes", || {
        bus.health().is_ok() || bus.probes.load(std::sync::atomic::Ordering::SeqCst) >= probes + 2
    })
    .await;
    let why = bus.health().expect_err("ready while every batch is refused");
    assert!(why.starts_with("no space left on device ("), "{why}");
    // Space again: the probe clears it without an append, and the batch is stored.
    bus.storage.set_free(None);
    wait_for("readiness once space is back", || bus.health().is_ok()).await;
    assert_eq!(bus.append("a".into(), vec![big(2, 32 << 10)]).await.unwrap(), 2);
}

/// A durable registration is on disk when `register_durable` answers: a crash right after
/// it (the directory as it is at that moment, before any periodic flush) still knows the
/// name and its cursor, so the name is not placed at `from` again past records it never
/// read (seed 303896 of the simulation).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_registration_survives_a_crash_right_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let live = dir.path().join("live");
    let bus = open_disk(disk(&live, 1000));
    bus.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    bus.register_durable("op", "lifecycle", 1).await.unwrap();
    // The crash: copy what is on disk now, while the bus (and its ticker) still runs.
    let crashed = dir.path().join("crashed");
    copy_dir(&live, &crashed);
    let after = open_disk(disk(&crashed, 1000));
    assert_eq!(after.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(1));
    drop(bus);
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}

/// A subscriber behind the retention window across a restart: the clusters whose evicted
/// records went with deleted segments are known no more, so it must be told to resync
/// every cluster, not only those whose evicted records were still on disk (dst seed
/// 345219 lost cluster b's changes silently that way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_behind_segments_deleted_before_a_restart_resyncs_every_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let opts = BusOptions { retention: Retention { records: 4, bytes: 1 << 30, age: None }, ..disk(dir.path(), 3) };
    {
        let bus = open_disk(opts.clone());
        bus.append("b".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap();
        for seq in 1..=12 {
            bus.append("a".into(), vec![ev(1, seq)]).await.unwrap();
        }
        // Evicted while running: b is reported.
        let r = bus.read_now(3, 100);
        assert!(r.evicted.iter().any(|(c, _)| &**c == "b"), "{:?}", r.evicted);
        closed(bus).await;
    }
    assert!(segments(dir.path()).len() < 5, "fully evicted segments were deleted: {:?}", segments(dir.path()));
    let bus = open_disk(opts);
    let r = bus.read_now(3, 100);
    assert!(
        r.evicted.iter().any(|(c, off)| (&**c == "*" || &**c == "b") && *off >= 3),
        "a reader that missed b's record at offset 3 must learn it: {:?}",
        r.evicted
    );
    // A reader that missed nothing is not told to resync.
    let first = bus.stats().first_offset;
    assert!(bus.read_now(first, 100).evicted.is_empty(), "{:?}", bus.read_now(first, 100).evicted);
}

/// The reasons each embedded backend (and a [`DeferredBus`] before it is open) gives for
/// each gap, byte for byte: subscribers and tests match them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resync_reasons_are_the_texts_subscribers_match() {
    let texts = |bus: &dyn Bus| {
        [Gap::LostHistory, Gap::Evicted { offset: 5 }, Gap::LostCursor { name: "audit" }]
            .map(|gap| bus.resync_reason(gap).into_owned())
    };
    let evicted = "events were evicted from the hub before this subscriber read them";
    let memory = MemoryBus::open(Retention::default());
    let memory_texts = [
        "the hub's event history was lost (restart without a data directory)",
        evicted,
        "the hub keeps durable cursors in memory only (no data directory) and does not know durable subscription \"audit\": it may have been read before the hub restarted",
    ];
    assert_eq!(texts(&*memory), memory_texts);
    let dir = tempfile::tempdir().unwrap();
    let segment_log = open_disk(disk(dir.path(), 100));
    assert_eq!(
        texts(&*segment_log),
        [
            "the hub's event history was lost (restart without a data directory)",
            evicted,
            "the hub lost its durable cursor store: where durable subscription \"audit\" stopped is unknown",
        ]
    );
    let deferred = DeferredBus::new(true);
    assert_eq!(
        texts(&*deferred),
        ["the hub's event history was lost", evicted, "where durable subscription \"audit\" stopped is unknown"]
    );
    deferred.open(memory);
    assert_eq!(texts(&*deferred), memory_texts, "the backend's own, once open");
}

/// A [`DeferredBus`] shows an empty bus of the durability it was told until the backend
/// is open, then the backend's stats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deferred_bus_shows_empty_stats_until_open() {
    let deferred = DeferredBus::new(true);
    assert_eq!(deferred.stats(), BusStats::empty(true));
    assert_eq!(deferred.last_offset(), 0);
    let memory = MemoryBus::open(Retention::default());
    memory.append("a".into(), vec![ev(1, 1)]).await.unwrap();
    deferred.open(memory.clone());
    assert_eq!(deferred.stats(), memory.stats());
    assert_eq!((deferred.stats().last_offset, deferred.stats().durable), (1, false));
}
