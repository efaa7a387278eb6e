//! The embedded bus: an ordered log of records with per-cluster heads, optional on-disk
//! durability, retention by count, bytes and age, and durable subscriber cursors.
//!
//! One writer thread owns appends ([`writer`]): it writes every waiting request with one
//! `fdatasync` (group commit), then makes them visible and answers. The hub acks an agent
//! only after that answer, so an acked event survives a hub crash when the bus has a data
//! directory.
//!
//! Data directory layout (format 2; see [`record`] for the framing):
//! - `format`: `fleetwatch-bus 2`. A directory with a `stream-id` but no `format` is from
//!   an older release: its `segments` and `cursors.json` are moved aside (`*-v1`) and a
//!   new stream starts, so subscribers get `resync-required` `*`.
//! - `stream-id`: a new one means the history was lost.
//! - `segments/<first offset>.log`: checksummed records; `.idx`: the clusters of a closed
//!   segment, to attribute damage found later.
//! - `cursors.json`: durable cursors and the offset high-water mark ([`cursors`]).

mod cursors;
mod record;
mod recovery;
mod retention;
mod segment;
mod storage;
mod writer;

use std::collections::{HashMap, VecDeque};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{mpsc, oneshot, watch};

pub use cursors::{DurableError, Lookup, MAX_NAME_BYTES, MAX_NAMES_PER_IDENTITY};
pub use retention::{DEFAULT_AGE_DISK, DEFAULT_AGE_MEMORY, DEFAULT_BYTES_DISK, DEFAULT_BYTES_MEMORY, Retention};
pub use storage::StorageError;

use cursors::CursorStore;
use storage::Storage;
use writer::{Disk, Request, Writer};

/// Longest `resync-required` reason stored, in bytes; longer ones are cut on a character
/// boundary.
pub const MAX_REASON_BYTES: usize = 1024;

/// The cluster name of a `resync-required` that concerns every cluster.
pub const ALL_CLUSTERS: &str = "*";

/// What the data directory's `format` file says.
const FORMAT: &str = "fleetwatch-bus 2\n";

/// One record of the log.
#[derive(Debug)]
pub struct Record {
    /// Position in the log, from 1. Offsets increase but may have gaps (after damage).
    pub offset: u64,
    /// The cluster it belongs to ([`ALL_CLUSTERS`] for a marker about every cluster).
    pub cluster: Arc<str>,
    /// The agent epoch and seq it carries.
    pub epoch: u64,
    /// The seq.
    pub seq: u64,
    /// When it was appended, milliseconds since the Unix epoch (for age retention).
    pub time_ms: u64,
    /// What it is.
    pub body: RecordBody,
}

impl Record {
    /// Bytes it counts for retention: content plus a fixed overhead.
    pub fn size(&self) -> u64 {
        let body = match &self.body {
            RecordBody::Event(b) => b.len(),
            RecordBody::ResyncRequired(r) => r.len(),
        };
        (body + self.cluster.len() + 64) as u64
    }
}

/// A record's content.
#[derive(Debug, Clone)]
pub enum RecordBody {
    /// An event, as JSON without a cursor.
    Event(Bytes),
    /// Subscribers must reconcile the cluster fully.
    ResyncRequired(String),
}

/// What a session asks to append for one cluster.
#[derive(Debug)]
pub struct Append {
    /// Epoch.
    pub epoch: u64,
    /// Seq (strictly increasing within the epoch).
    pub seq: u64,
    /// Content.
    pub body: RecordBody,
}

/// Bus failures.
#[derive(Debug, Clone, thiserror::Error)]
pub enum BusError {
    /// A disk operation failed; the batch was not stored.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// The bus is shut down.
    #[error("bus is closed")]
    Closed,
}

/// Bus settings.
#[derive(Debug, Clone)]
pub struct BusOptions {
    /// Where to keep the log and cursors; `None` keeps everything in memory only.
    pub dir: Option<PathBuf>,
    /// Records kept (in memory and on disk), by count, bytes and age; older ones are
    /// evicted and their clusters marked so lagging subscribers get `resync-required`.
    pub retention: Retention,
    /// Records per segment file.
    pub segment_records: u64,
    /// Bytes per segment file.
    pub segment_bytes: u64,
}

impl Default for BusOptions {
    fn default() -> Self {
        Self { dir: None, retention: Retention::default(), segment_records: 50_000, segment_bytes: 64 << 20 }
    }
}

/// The result of a read.
#[derive(Debug, Default)]
pub struct Read {
    /// Clusters whose records between the requested offset and the oldest retained one
    /// were evicted: the reader must be told to resync them.
    pub evicted: Vec<(Arc<str>, u64)>,
    /// Records, in order.
    pub records: Vec<Arc<Record>>,
    /// The offset to read next: above the requested one whenever it was below the end,
    /// so a reader always makes progress, across gaps too.
    pub next: u64,
}

pub(crate) struct Log {
    pub(crate) records: VecDeque<Arc<Record>>,
    /// Offset of `records[0]` (or the next offset when empty).
    pub(crate) base: u64,
    /// Next offset to assign.
    pub(crate) end: u64,
    /// Sum of [`Record::size`] of `records`.
    pub(crate) bytes: u64,
    /// Per cluster: the highest evicted offset.
    pub(crate) evicted: HashMap<Arc<str>, u64>,
    /// Per cluster: the (epoch, seq) of its latest record.
    pub(crate) heads: HashMap<Arc<str>, (u64, u64)>,
}

/// The embedded bus. Cheap to share: `Arc<Bus>`.
pub struct Bus {
    stream_id: String,
    log: RwLock<Log>,
    tx: mpsc::Sender<Request>,
    end_tx: watch::Sender<u64>,
    cursors: CursorStore,
    storage: Storage,
    /// Why the last write failed, while writes fail.
    health: Mutex<Option<String>>,
    /// Batches refused because a disk write failed.
    write_failures: std::sync::atomic::AtomicU64,
    dir: Option<PathBuf>,
}

impl Bus {
    /// Opens the bus (reading the log from disk when there is a directory, recording
    /// `resync-required` for records found lost) and starts its writer. Needs a tokio
    /// runtime.
    pub fn open(opts: BusOptions) -> Result<Arc<Self>, BusError> {
        let storage = Storage::default();
        let mut log =
            Log { records: VecDeque::new(), base: 1, end: 1, bytes: 0, evicted: HashMap::new(), heads: HashMap::new() };
        let mut stream_id = format!("{:016x}", rand::random::<u64>());
        let mut cursors = CursorStore::memory();
        let mut disk = None;
        let mut recovered = None;
        if let Some(dir) = &opts.dir {
            let had_state = prepare_dir(dir, &storage)?;
            // The cursor store is written before a new stream id: a directory with a
            // stream id and no cursor store has lost it.
            cursors = CursorStore::load(dir.join("cursors.json"), had_state);
            cursors.flush(&storage)?;
            let id_path = dir.join("stream-id");
            match std::fs::read_to_string(&id_path) {
                Ok(s) if !s.trim().is_empty() => stream_id = s.trim().to_string(),
                _ => storage.write_atomic(&id_path, stream_id.as_bytes())?,
            }
            let seg_dir = dir.join("segments");
            let mut rec = recovery::recover(&seg_dir)?;
            load(&mut log, std::mem::take(&mut rec.records));
            if let Some((first, _)) = rec.segments.last() {
                log.end = log.end.max(*first);
            }
            let (max_cursor, stored_end, reserved) = cursors.marks();
            // (A damaged tail was reported already, with its file and offset.)
            if !rec.tail_lost && (stored_end > log.end || (max_cursor > 0 && max_cursor >= log.end)) {
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
                log.end = log.end.max(reserved).max(stored_end).max(max_cursor + 1);
            }
            log.base = log.records.front().map(|r| r.offset).unwrap_or(log.end);
            let mut d = Disk::new(dir.clone(), seg_dir, opts.segment_bytes.max(1), opts.segment_records.max(1));
            d.segments = rec.segments.clone().into();
            disk = Some(d);
            recovered = Some(rec);
        }
        retention::evict(&mut log, &opts.retention, retention::now_ms());
        let (tx, rx) = mpsc::channel(4096);
        let (end_tx, _) = watch::channel(log.end);
        let bus = Arc::new(Self {
            stream_id,
            log: RwLock::new(log),
            tx,
            end_tx,
            cursors,
            storage,
            health: Mutex::new(None),
            write_failures: 0.into(),
            dir: opts.dir.clone(),
        });
        let mut writer = Writer::new(Arc::downgrade(&bus), opts.retention, disk);
        if let (Some(rec), Some(disk)) = (recovered, writer.disk.as_mut()) {
            if !rec.close_last {
                let records: Vec<_> = bus.log.read().map(|l| l.records.iter().cloned().collect()).unwrap_or_default();
                disk.resume(&records)?;
            }
            record_losses(&bus, &mut writer, rec)?;
        }
        std::thread::Builder::new().name("bus-writer".into()).spawn(move || writer.run(rx)).map_err(|e| {
            BusError::Storage(StorageError { path: "bus-writer thread".into(), cause: storage::cause(&e) })
        })?;
        spawn_ticker(&bus);
        Ok(bus)
    }

    /// The stream id: a new one means the history was lost (in-memory bus restarted).
    pub fn stream_id(&self) -> &str {
        &self.stream_id
    }

    /// Whether acked records survive a restart.
    pub fn is_durable(&self) -> bool {
        self.dir.is_some()
    }

    /// Appends records for one cluster; returns the offset of the last one. Records whose
    /// seq is not above the cluster's head in the same epoch are duplicates and skipped.
    /// Reasons longer than [`MAX_REASON_BYTES`] are cut.
    pub async fn append(&self, cluster: Arc<str>, mut items: Vec<Append>) -> Result<u64, BusError> {
        for item in &mut items {
            if let RecordBody::ResyncRequired(reason) = &mut item.body {
                cap_reason(reason);
            }
        }
        let (reply, rx) = oneshot::channel();
        let req = Request::Append { cluster, items, system: false, reply };
        self.tx.send(req).await.map_err(|_| BusError::Closed)?;
        rx.await.map_err(|_| BusError::Closed)?
    }

    /// Whether the bus can store records: `Err(cause)` while writes fail.
    pub fn health(&self) -> Result<(), String> {
        match self.health.lock().map(|h| h.clone()) {
            Ok(None) => Ok(()),
            Ok(Some(e)) => Err(e),
            Err(_) => Err("bus state is poisoned".into()),
        }
    }

    /// Batches refused so far because a disk write failed.
    pub fn write_failures(&self) -> u64 {
        self.write_failures.load(std::sync::atomic::Ordering::Relaxed)
    }

    fn set_health(&self, h: Option<String>) {
        if let Ok(mut g) = self.health.lock() {
            *g = h;
        }
    }

    /// Makes every disk write of the bus fail with ENOSPC for `d`, through the same path a
    /// real failed write takes (tests and the chaos soak). No effect without a data dir.
    pub fn inject_storage_fault(&self, d: Duration) {
        tracing::warn!(ms = d.as_millis() as u64, "injecting storage fault: bus writes fail with ENOSPC");
        self.storage.fail_for(d);
    }

    /// The (epoch, seq) of a cluster's latest record.
    pub fn head(&self, cluster: &str) -> Option<(u64, u64)> {
        self.log.read().ok()?.heads.get(cluster).copied()
    }

    /// The offset of the newest record (0 when empty).
    pub fn last_offset(&self) -> u64 {
        *self.end_tx.borrow() - 1
    }

    /// The offset of the oldest retained record.
    pub fn first_offset(&self) -> u64 {
        self.log.read().map(|l| l.base).unwrap_or(1)
    }

    /// A receiver that changes whenever records are appended (its value: the next offset).
    pub fn watch_end(&self) -> watch::Receiver<u64> {
        self.end_tx.subscribe()
    }

    /// Reads up to `max` records from offset `from` on. When `from` is below the end,
    /// `next` is above `from` (gaps in offsets are skipped).
    pub fn read(&self, from: u64, max: usize) -> Read {
        let Ok(log) = self.log.read() else { return Read { next: from, ..Read::default() } };
        let mut out = Read { next: from, ..Read::default() };
        if from < log.base {
            out.evicted =
                log.evicted.iter().filter(|(_, off)| **off >= from).map(|(c, off)| (c.clone(), *off)).collect();
        }
        let start = log.records.partition_point(|r| r.offset < from);
        out.records.extend(log.records.iter().skip(start).take(max).cloned());
        out.next = match out.records.last() {
            Some(last) => last.offset + 1,
            None => from.max(log.end),
        };
        out
    }

    /// What is stored for a durable subscription `name` of subscriber `identity`; refuses
    /// names over the bounds ([`MAX_NAME_BYTES`], [`MAX_NAMES_PER_IDENTITY`]).
    pub fn durable_lookup(&self, identity: &str, name: &str) -> Result<Lookup, DurableError> {
        self.cursors.lookup(identity, name)
    }

    /// Registers a durable subscription's start point (stored even when lower).
    pub fn register_durable(&self, identity: &str, name: &str, cursor: u64) -> Result<(), DurableError> {
        self.cursors.set(identity, name, cursor, true)
    }

    /// Moves a durable subscriber's cursor forward (written by [`Bus::flush_cursors`]).
    pub fn set_durable_cursor(&self, identity: &str, name: &str, cursor: u64) {
        if let Err(e) = self.cursors.set(identity, name, cursor, false) {
            tracing::warn!(error = %e, "durable cursor not stored");
        }
    }

    /// Writes durable cursors (and the log end) to disk when they changed.
    pub fn flush_cursors(&self) -> Result<(), BusError> {
        self.cursors.note_end(*self.end_tx.borrow());
        Ok(self.cursors.flush(&self.storage)?)
    }

    /// Number of records retained.
    pub fn retained(&self) -> usize {
        self.log.read().map(|l| l.records.len()).unwrap_or(0)
    }

    /// Bytes of records retained (as counted for retention).
    pub fn retained_bytes(&self) -> u64 {
        self.log.read().map(|l| l.bytes).unwrap_or(0)
    }
}

/// Cuts a reason to [`MAX_REASON_BYTES`] on a character boundary.
fn cap_reason(reason: &mut String) {
    if reason.len() > MAX_REASON_BYTES {
        let mut cut = MAX_REASON_BYTES;
        while !reason.is_char_boundary(cut) {
            cut -= 1;
        }
        reason.truncate(cut);
    }
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

/// Fills a fresh log with loaded records.
fn load(log: &mut Log, records: Vec<Record>) {
    for rec in records {
        if rec.cluster.as_ref() != ALL_CLUSTERS {
            log.heads.insert(rec.cluster.clone(), (rec.epoch, rec.seq));
        }
        log.end = rec.offset + 1;
        log.bytes += rec.size();
        log.records.push_back(Arc::new(rec));
    }
}

/// Appends a `resync-required` for every loss found at start, then rewrites damaged
/// segments without their damage (in that order: a crash between repeats the marker
/// rather than forgetting it).
fn record_losses(bus: &Arc<Bus>, writer: &mut Writer, rec: recovery::Recovered) -> Result<(), BusError> {
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
        let (epoch, seq) = bus.head(&cluster).unwrap_or((0, 0));
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
        let next = writer.disk.as_ref().and_then(|d| d.segments.iter().find(|(f, _)| f > first).map(|(f, _)| *f));
        let clusters: std::collections::HashSet<Arc<str>> = bus
            .read(*first, usize::MAX)
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
fn spawn_ticker(bus: &Arc<Bus>) {
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

#[cfg(test)]
mod tests;
