//! The segment-log bus: the in-memory log index of [`crate::log`] backed by checksummed
//! segment files, so acked events survive a hub crash.
//!
//! One writer thread owns appends ([`self::writer`]): it writes every waiting request
//! with one `fdatasync` (group commit), then makes them visible and answers. The hub acks
//! an agent only after that answer. At start the segments are read back
//! ([`self::recovery`]); records found lost become `resync-required` markers before the
//! bus serves anything, and so do acked records cut from the end of the log, which the
//! log's mark tells ([`self::marks`]). Durable cursors live in `cursors.json`
//! ([`crate::cursors`]).

mod marks;
pub(crate) mod record;
mod recovery;
pub(crate) mod segment;
mod writer;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use crate::cursors::CursorStore;
use crate::log::{Core, Log};
use crate::storage::{self, Storage};
use crate::{
    ALL_CLUSTERS, Append, Bus, BusError, BusFuture, BusOptions, BusStats, CURSOR_STORE_FORMAT, FORMAT, FaultInjection,
    Flush, LOG_FORMAT, Lookup, Read, RecordBody, StorageError, WriterPlacement, cap_reason, cap_reasons, ready,
    retention,
};
use marks::Marks;
use writer::{Disk, MarkSyncer, Request, Writer};

/// The durable embedded bus.
pub struct SegmentLogBus {
    pub(super) core: Core,
    pub(super) tx: mpsc::Sender<Request>,
    pub(super) storage: Storage,
    /// Why the last write failed, while writes fail.
    health: Mutex<Option<String>>,
    /// Batches refused because a disk write failed.
    pub(super) write_failures: std::sync::atomic::AtomicU64,
    /// Readiness probes run while writes failed (tests wait for them).
    pub(super) probes: std::sync::atomic::AtomicU64,
}

impl SegmentLogBus {
    /// Opens the bus in `dir` (reading the log back, recording `resync-required` for
    /// records found lost) and starts its writer. `opts.dir` is ignored. Needs a tokio
    /// runtime.
    pub fn open(dir: PathBuf, opts: BusOptions) -> Result<Arc<Self>, BusError> {
        let storage = Storage::with_disk(opts.disk_full.clone());
        let mut log = Log::new();
        // Before anything is written: a newer release's directory is refused untouched.
        check_formats(&dir)?;
        let had_state = prepare_dir(&dir, &storage)?;
        // The cursor store is written before a new stream id: a directory with a
        // stream id and no cursor store has lost it.
        let cursors = CursorStore::load(dir.join("cursors.json"), had_state);
        cursors.flush(&storage)?;
        let id_path = dir.join("stream-id");
        let stream_id = match std::fs::read_to_string(&id_path) {
            Ok(s) if !s.trim().is_empty() => s.trim().to_string(),
            _ => {
                let id = format!("{:016x}", rand::random::<u64>());
                storage.write_atomic(&id_path, id.as_bytes())?;
                id
            }
        };
        let seg_dir = dir.join("segments");
        let mut rec = recovery::recover(&seg_dir)?;
        log.load(std::mem::take(&mut rec.records));
        if let Some((first, _)) = rec.segments.last() {
            log.end = log.end.max(*first);
        }
        let (max_cursor, stored_end, reserved) = cursors.marks();
        let marks_path = dir.join("marks");
        let mark = marks::load(&marks_path);
        // (A damaged tail was reported already, with its file and offset.)
        if !rec.tail_lost
            && let Some(mark) = &mark
        {
            let losses = marks::losses(mark, log.end);
            if !losses.is_empty() {
                for loss in &losses {
                    tracing::warn!(cluster = loss.cluster.as_deref().unwrap_or(ALL_CLUSTERS), reason = %loss.reason, "bus log lost acked records at its end");
                }
                rec.losses.extend(losses);
                rec.tail_lost = true;
            }
        }
        // Offsets the mark vouches for were checked above; the cursor store's marks catch
        // what lies beyond (a mark lost or older than the store).
        let checked = mark.as_ref().map(|m| m.end).unwrap_or(0).max(log.end);
        if !rec.tail_lost && (stored_end > checked || (max_cursor > 0 && max_cursor >= checked)) {
            let reason = format!(
                "records {}..={} are missing: the log ends at offset {} but later offsets were stored or delivered (log truncated or a segment deleted)",
                log.end,
                stored_end.saturating_sub(1).max(max_cursor),
                log.end - 1
            );
            tracing::warn!(%reason, "bus log lost its end");
            rec.losses.push(recovery::Loss { cluster: None, reason });
            rec.tail_lost = true;
        }
        if rec.tail_lost {
            // Continue above every offset ever handed out: no cursor can alias a new record.
            let marked = mark.as_ref().map(|m| m.end).unwrap_or(0);
            log.end = log.end.max(reserved).max(stored_end).max(max_cursor + 1).max(marked);
        }
        log.base = log.records.front().map(|r| r.offset).unwrap_or(log.end);
        // Records below the oldest segment were evicted in an earlier run and their segments
        // deleted: which clusters they held is known no more, so a reader that missed any of
        // them must reconcile every cluster. (Evictions of records still on disk are found
        // again, per cluster, when retention runs below.) Without this, a subscriber behind
        // the retention window across a restart was told to resync only the clusters whose
        // evicted records were still on disk.
        let oldest = rec.segments.first().map(|(first, _)| *first).unwrap_or(log.end).min(log.base);
        if oldest > 1 {
            log.evicted.insert(Arc::from(ALL_CLUSTERS), oldest - 1);
        }
        let marks = Marks::new(marks_path, mark.as_ref(), log.end, log.records.iter().map(|r| &**r));
        let mut disk = Disk::new(dir.clone(), seg_dir, opts.segment_bytes.max(1), opts.segment_records.max(1), marks);
        disk.segments = rec.segments.clone().into();
        retention::evict(&mut log, &opts.retention, retention::now_ms());
        let (tx, rx) = mpsc::channel(4096);
        let bus = Arc::new(Self {
            core: Core::new(log, cursors, stream_id),
            tx,
            storage,
            health: Mutex::new(None),
            write_failures: 0.into(),
            probes: 0.into(),
        });
        let mut writer = Writer::new(Arc::downgrade(&bus), opts.retention, disk);
        if !rec.close_last {
            let records: Vec<_> =
                bus.core.log.read().map(|l| l.records.iter().cloned().collect()).map_err(|_| BusError::Closed)?;
            writer.disk.resume(&records)?;
        }
        record_losses(&bus, &mut writer, rec)?;
        match opts.writer {
            WriterPlacement::Thread => {
                // Without the thread the mark is synced after the segment: slower, not wrong.
                match MarkSyncer::spawn() {
                    Ok(syncer) => writer.disk.syncer = Some(syncer),
                    Err(e) => tracing::warn!(error = %e, "cannot start the bus mark-sync thread; syncing in turn"),
                }
                std::thread::Builder::new().name("bus-writer".into()).spawn(move || writer.run(rx)).map_err(|e| {
                    BusError::Storage(StorageError {
                        path: "bus-writer thread".into(),
                        cause: storage::cause(&e),
                        lasting: false,
                    })
                })?;
            }
            WriterPlacement::Runtime => {
                tokio::spawn(writer.run_on_runtime(rx));
            }
        }
        spawn_ticker(&bus);
        Ok(bus)
    }

    /// Appends through the writer (see [`Bus::append`]).
    pub async fn append_now(&self, cluster: Arc<str>, mut items: Vec<Append>) -> Result<u64, BusError> {
        cap_reasons(&mut items);
        let (reply, rx) = oneshot::channel();
        let req = Request::Append { cluster, items, system: false, reply };
        self.tx.send(req).await.map_err(|_| BusError::Closed)?;
        rx.await.map_err(|_| BusError::Closed)?
    }

    pub(super) fn set_health(&self, h: Option<String>) {
        if let Ok(mut g) = self.health.lock() {
            *g = h;
        }
    }

    /// The (epoch, seq) of a cluster's latest record.
    pub fn head_now(&self, cluster: &str) -> Option<(u64, u64)> {
        self.core.head(cluster)
    }

    /// Reads at once (see [`Bus::read`]).
    pub fn read_now(&self, from: u64, max: usize) -> Read {
        self.core.read(from, max)
    }

    /// Writes durable cursors (and the log end) to disk when they changed.
    pub fn flush_cursors_now(&self) -> Result<(), BusError> {
        self.core.cursors.note_end(*self.core.end_tx.borrow());
        Ok(self.core.cursors.flush(&self.storage)?)
    }
}

impl Bus for SegmentLogBus {
    crate::log::forward_to_core!();

    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64> {
        Box::pin(self.append_now(cluster, items))
    }

    fn durable_lookup<'a>(&'a self, identity: &'a str, name: &'a str) -> BusFuture<'a, Lookup> {
        ready(self.core.cursors.lookup(identity, name).map_err(BusError::from))
    }

    /// Stored at once (through the writer, which owns the disk), unlike a cursor move: a
    /// registration not stored before a crash would place the name at `from` again after
    /// it, past records it never read (seed 303896 of the simulation).
    fn register_durable<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        Box::pin(async move {
            self.core.cursors.set(identity, name, cursor, true)?;
            let (reply, stored) = oneshot::channel();
            self.tx.send(Request::StoreCursors { reply }).await.map_err(|_| BusError::Closed)?;
            stored.await.map_err(|_| BusError::Closed)?
        })
    }

    /// Cursors are all there is to write later: both flushes store them.
    fn flush(&self, _: Flush) -> BusFuture<'_, ()> {
        ready(self.flush_cursors_now())
    }

    fn stats(&self) -> BusStats {
        self.core.stats(true, self.write_failures.load(std::sync::atomic::Ordering::Relaxed))
    }

    fn health(&self) -> Result<(), String> {
        match self.health.lock().map(|h| h.clone()) {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(_) => Err("bus state is poisoned".into()),
        }
    }

    fn fault_injection(&self) -> Option<&dyn FaultInjection> {
        Some(self)
    }
}

impl FaultInjection for SegmentLogBus {
    /// Disk writes fail with ENOSPC for `d`, through the same path a real failed write
    /// takes.
    fn inject_storage_fault(&self, d: Duration) -> Result<(), BusError> {
        tracing::warn!(ms = d.as_millis() as u64, "injecting storage fault: bus writes fail with ENOSPC");
        self.storage.fail_for(d);
        Ok(())
    }
}

/// Refuses a data directory a newer release wrote: its `format` file, the cursor store's
/// version, or a segment whose first record frame has a newer magic (`FWR3`…). Reads only.
/// An older format (no `format` file: format 1) is left to [`prepare_dir`]; only checksum
/// failures within format 2 count as damage.
pub(super) fn check_formats(dir: &Path) -> Result<(), BusError> {
    let newer = |path: PathBuf, what, found: String, ours: String| BusError::NewerFormat { path, what, found, ours };
    let format_path = dir.join("format");
    if let Ok(text) = std::fs::read_to_string(&format_path)
        && text != FORMAT
    {
        let version = text.trim().strip_prefix("fleetwatch-bus ").and_then(|v| v.parse::<u32>().ok());
        // Unknown text is refused as well: nothing here may be taken for damage and cut.
        if version.is_none_or(|v| v > LOG_FORMAT) {
            return Err(newer(format_path, "the data directory", format!("{:?}", text.trim()), FORMAT.trim().into()));
        }
    }
    let cursors_path = dir.join("cursors.json");
    if let Some(version) = crate::cursors::stored_version(&cursors_path)
        && version > CURSOR_STORE_FORMAT
    {
        let ours = format!("version {CURSOR_STORE_FORMAT}");
        return Err(newer(cursors_path, "the cursor store", format!("version {version}"), ours));
    }
    let seg_dir = dir.join("segments");
    if seg_dir.is_dir() {
        for (_, path) in segment::list(&seg_dir)? {
            let mut head = [0u8; 4];
            let read = std::fs::File::open(&path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut head));
            if read.is_ok() && head[..3] == record::MAGIC[..3] && head[3].is_ascii_digit() && head[3] > record::MAGIC[3]
            {
                let found = format!("record format {}", char::from(head[3]));
                return Err(newer(path, "a segment", found, format!("record format {}", char::from(record::MAGIC[3]))));
            }
        }
    }
    Ok(())
}

/// Creates the directory layout; moves an older format aside. Returns whether the
/// directory held bus state before (so a missing cursor store means it was lost).
fn prepare_dir(dir: &Path, storage: &Storage) -> Result<bool, StorageError> {
    let seg_dir = dir.join("segments");
    std::fs::create_dir_all(dir).map_err(|e| StorageError::new(dir, e))?;
    let had_stream = dir.join("stream-id").exists();
    let format_path = dir.join("format");
    let format = std::fs::read_to_string(&format_path).ok();
    if had_stream && format.as_deref() != Some(FORMAT) {
        tracing::warn!(dir = %dir.display(), "data directory is from an older release: moving it aside as segments-v1 and starting a new stream (subscribers will resync)");
        for name in ["segments", "cursors.json", "stream-id"] {
            let from = dir.join(name);
            if from.exists() {
                let to = dir.join(format!("{name}-v1"));
                std::fs::rename(&from, &to).map_err(|e| StorageError::new(&from, e))?;
            }
        }
    }
    if format.as_deref() != Some(FORMAT) {
        storage.write_atomic(&format_path, FORMAT.as_bytes())?;
    }
    std::fs::create_dir_all(&seg_dir).map_err(|e| StorageError::new(&seg_dir, e))?;
    Ok(had_stream)
}

/// Appends a `resync-required` for every loss found at start, then rewrites damaged
/// segments without their damage (in that order: a crash between repeats the marker
/// rather than forgetting it).
fn record_losses(bus: &Arc<SegmentLogBus>, writer: &mut Writer, rec: recovery::Recovered) -> Result<(), BusError> {
    let mut batch = Vec::new();
    let mut replies = Vec::new();
    let mut seen = std::collections::HashSet::new();
    for loss in rec.losses {
        let cluster: Arc<str> = loss.cluster.unwrap_or_else(|| Arc::from(ALL_CLUSTERS));
        if !seen.insert((cluster.clone(), loss.reason.clone())) {
            continue;
        }
        let mut reason = loss.reason;
        cap_reason(&mut reason);
        let (epoch, seq) = bus.head_now(&cluster).unwrap_or((0, 0));
        let (reply, rx) = oneshot::channel();
        let item = Append { epoch, seq, body: RecordBody::ResyncRequired(reason) };
        batch.push(Request::Append { cluster, items: vec![item], system: true, reply });
        replies.push(rx);
    }
    if !batch.is_empty() {
        writer.commit(&mut batch);
        for mut rx in replies {
            match rx.try_recv() {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(e),
                Err(_) => return Err(BusError::Closed),
            }
        }
        tracing::warn!(markers = seen.len(), "recorded resync-required for records lost on disk");
    }
    for (path, clean) in &rec.rewrite {
        bus.storage.write_atomic(path, clean)?;
    }
    if rec.close_last
        && let Some((first, path)) = rec.segments.last()
    {
        // The old last segment is closed now: index it like any closed segment.
        let next = writer.disk.segments.iter().find(|(f, _)| f > first).map(|(f, _)| *f);
        let clusters: std::collections::HashSet<Arc<str>> = bus
            .read_now(*first, usize::MAX)
            .records
            .iter()
            .filter(|r| next.is_none_or(|n| r.offset < n))
            .map(|r| r.cluster.clone())
            .collect();
        segment::write_index(&bus.storage, path, clusters.iter())?;
    }
    Ok(())
}

/// Sends the writer a tick every second (age retention, readiness probe, cursor flush);
/// holds the sender weakly so the writer still stops when the bus goes.
fn spawn_ticker(bus: &Arc<SegmentLogBus>) {
    let weak = bus.tx.downgrade();
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(tx) = weak.upgrade() else { return };
            let _ = tx.try_send(Request::Tick);
        }
    });
}
