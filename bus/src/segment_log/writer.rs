//! The writer thread: the only code that appends. It takes every request that is waiting,
//! writes them with one `fdatasync` (group commit), then makes them visible and answers.
//!
//! A failed write never lets a later append be acked: the half-written bytes are cut
//! back to the last good length before anything else is written (retried until it
//! works), the whole batch is answered with the cause, and the bus reports not ready
//! until a write succeeds again.

use std::collections::{HashMap, HashSet, VecDeque};
use std::fs::File;
use std::path::PathBuf;
use std::sync::{Arc, Weak};

use tokio::sync::{mpsc, oneshot};

use super::SegmentLogBus;
use super::marks::Marks;
use super::{record, segment};
use crate::cursors::RESERVE_STEP;
use crate::log;
use crate::retention::{self, Retention};
use crate::storage::StorageError;
use crate::{Append, BusError, Record};

/// A request to the writer.
pub(crate) enum Request {
    /// Append records for one cluster.
    Append {
        cluster: Arc<str>,
        items: Vec<Append>,
        /// Written as is: no duplicate check, no change of the cluster's head (markers the
        /// bus records itself, e.g. for records lost on disk).
        system: bool,
        reply: oneshot::Sender<Result<u64, BusError>>,
    },
    /// Periodic chores: age retention, readiness probe after a failure, cursor flush.
    Tick,
    /// Store the cursor store now, and answer (a durable registration is a promise the
    /// hub makes the subscriber: it must outlive a crash right after it).
    StoreCursors { reply: oneshot::Sender<Result<(), BusError>> },
}

/// The segment being appended to.
struct Active {
    first: u64,
    path: PathBuf,
    file: Option<File>,
    /// Bytes known to be complete records; a failed write is cut back to this.
    good_len: u64,
    /// Whether bytes past `good_len` may be on disk and must be cut before the next write.
    needs_cut: bool,
    records: u64,
    clusters: HashSet<Arc<str>>,
}

/// The on-disk side of the writer.
pub(crate) struct Disk {
    pub data_dir: PathBuf,
    pub seg_dir: PathBuf,
    pub segment_bytes: u64,
    pub segment_records: u64,
    /// All segments, oldest first; the last one is the active one when `active` is set.
    pub segments: VecDeque<(u64, PathBuf)>,
    active: Option<Active>,
    /// The log's high-water mark, stored after every commit (see [`super::marks`]).
    pub marks: Marks,
    /// Syncs the mark beside the segment; `None`: one after the other, on the writer.
    pub syncer: Option<MarkSyncer>,
}

/// Syncs the log's mark on a thread of its own while the writer syncs the segment, so a
/// commit waits for one `fdatasync`'s time, not two. One long-lived thread: a thread per
/// commit would cost its creation on every group commit. It stops when the writer does.
pub(crate) struct MarkSyncer {
    jobs: std::sync::mpsc::SyncSender<Arc<File>>,
    done: std::sync::mpsc::Receiver<std::io::Result<()>>,
}

impl MarkSyncer {
    /// Starts the thread.
    pub(crate) fn spawn() -> std::io::Result<Self> {
        let (jobs, queued) = std::sync::mpsc::sync_channel::<Arc<File>>(1);
        let (answer, done) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new().name("bus-mark-sync".into()).spawn(move || {
            while let Ok(file) = queued.recv() {
                if answer.send(file.sync_data()).is_err() {
                    break;
                }
            }
        })?;
        Ok(Self { jobs, done })
    }

    /// Starts syncing `file`; answers whether it started (then [`MarkSyncer::wait`] must
    /// follow).
    fn start(&self, file: Arc<File>) -> bool {
        self.jobs.send(file).is_ok()
    }

    /// The started sync's result.
    fn wait(&self) -> std::io::Result<()> {
        self.done.recv().unwrap_or_else(|_| Err(std::io::Error::other("the mark's sync thread stopped")))
    }
}

impl Disk {
    pub(crate) fn new(
        data_dir: PathBuf,
        seg_dir: PathBuf,
        segment_bytes: u64,
        segment_records: u64,
        marks: Marks,
    ) -> Self {
        Self {
            data_dir,
            seg_dir,
            segment_bytes,
            segment_records,
            segments: VecDeque::new(),
            active: None,
            marks,
            syncer: None,
        }
    }

    /// Continues appending to the last segment, which holds `records`.
    pub(crate) fn resume(&mut self, records: &[Arc<Record>]) -> Result<(), StorageError> {
        let Some((first, path)) = self.segments.back().cloned() else { return Ok(()) };
        let file = std::fs::OpenOptions::new().append(true).open(&path).map_err(|e| StorageError::new(&path, e))?;
        let good_len = file.metadata().map_err(|e| StorageError::new(&path, e))?.len();
        let mine: Vec<_> = records.iter().filter(|r| r.offset >= first).collect();
        self.active = Some(Active {
            first,
            path,
            file: Some(file),
            good_len,
            needs_cut: false,
            records: mine.len() as u64,
            clusters: mine.iter().map(|r| r.cluster.clone()).collect(),
        });
        Ok(())
    }
}

pub(crate) struct Writer {
    /// Weak: when the last bus handle goes, its sender goes and the writer stops.
    pub bus: Weak<SegmentLogBus>,
    pub retention: Retention,
    pub disk: Disk,
    /// Whether the last write failed (to log transitions once).
    failing: bool,
    /// The largest write refused since writes began to fail: the readiness probe must
    /// store as much before the bus reports ready again (a small probe fits into the last
    /// free bytes of a disk that refuses every real batch).
    refused_bytes: u64,
}

impl Writer {
    pub(crate) fn new(bus: Weak<SegmentLogBus>, retention: Retention, disk: Disk) -> Self {
        Self { bus, retention, disk, failing: false, refused_bytes: 0 }
    }

    /// Runs on its own thread: disk writes and fsync block, and must not stall the async
    /// workers that serve sessions.
    pub(crate) fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            self.step(first, &mut rx, &mut batch);
        }
    }

    /// Runs as a task on the caller's runtime, writing inline (see
    /// [`crate::WriterPlacement::Runtime`]): the same steps as [`Writer::run`].
    pub(crate) async fn run_on_runtime(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::new();
        while let Some(first) = rx.recv().await {
            self.step(first, &mut rx, &mut batch);
        }
    }

    /// Takes `first` and every request waiting behind it (at most 1024), commits them as
    /// one group, then runs the chores if a tick was among them.
    fn step(&mut self, first: Request, rx: &mut mpsc::Receiver<Request>, batch: &mut Vec<Request>) {
        let mut tick = false;
        let mut stores = Vec::new();
        let mut take = |req, batch: &mut Vec<Request>| match req {
            Request::Tick => tick = true,
            Request::StoreCursors { reply } => stores.push(reply),
            req => batch.push(req),
        };
        take(first, batch);
        while batch.len() < 1024 {
            match rx.try_recv() {
                Ok(req) => take(req, batch),
                Err(_) => break,
            }
        }
        if !batch.is_empty() {
            self.commit(batch);
        }
        if tick {
            self.tick();
        }
        if !stores.is_empty() {
            // One write answers every registration waiting.
            let stored = match self.bus.upgrade() {
                Some(bus) => bus.flush_cursors_now(),
                None => Err(BusError::Closed),
            };
            for reply in stores {
                let _ = reply.send(stored.clone());
            }
        }
    }

    /// Appends a batch and answers every request in it.
    pub(crate) fn commit(&mut self, batch: &mut Vec<Request>) {
        let Some(bus) = self.bus.upgrade() else { return };
        match self.try_commit(&bus, batch) {
            Ok((lasts, wrote)) => {
                // Only a real write proves the disk works again (a batch of duplicates
                // writes nothing).
                if wrote {
                    self.set_failing(&bus, None);
                }
                for (req, last) in batch.drain(..).zip(lasts) {
                    if let Request::Append { reply, .. } = req {
                        let _ = reply.send(Ok(last));
                    }
                }
            }
            Err(e) => {
                self.set_failing(&bus, Some(&e));
                bus.write_failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                for req in batch.drain(..) {
                    if let Request::Append { reply, .. } = req {
                        let _ = reply.send(Err(BusError::Storage(e.clone())));
                    }
                }
            }
        }
    }

    fn set_failing(&mut self, bus: &SegmentLogBus, error: Option<&StorageError>) {
        match error {
            Some(e) => {
                if !self.failing {
                    tracing::error!(error = %e, "bus cannot write: refusing appends until writes succeed again");
                }
                self.failing = true;
                bus.set_health(Some(e.to_string()));
            }
            None => {
                if self.failing {
                    tracing::info!("bus writes succeed again");
                }
                self.failing = false;
                self.refused_bytes = 0;
                bus.set_health(None);
            }
        }
    }

    fn try_commit(&mut self, bus: &SegmentLogBus, batch: &mut [Request]) -> Result<(Vec<u64>, bool), StorageError> {
        let now = retention::now_ms();
        let mut end = bus.core.log.read().map(|l| l.end).unwrap_or(1);
        let mut new_records: Vec<Arc<Record>> = Vec::new();
        let mut replies: Vec<u64> = Vec::new();
        let mut heads: HashMap<Arc<str>, (u64, u64)> = HashMap::new();
        for req in batch.iter_mut() {
            let Request::Append { cluster, items, system, .. } = req else {
                replies.push(0);
                continue;
            };
            let mut head = heads.get(&*cluster).copied().or_else(|| bus.head_now(cluster));
            let items = std::mem::take(items);
            replies.push(log::assign(cluster, items, *system, &mut head, &mut end, now, &mut new_records));
            if let Some(h) = head
                && !*system
            {
                heads.insert(cluster.clone(), h);
            }
        }
        if !new_records.is_empty() {
            let mut buf = Vec::new();
            for rec in &new_records {
                record::encode(rec, &mut buf);
            }
            // Offsets past `reserved` are handed out only once the new mark is stored.
            if end >= bus.core.cursors.reserved() {
                let first = new_records[0].offset;
                bus.core.cursors.reserve(end + RESERVE_STEP, first, &bus.storage)?;
            }
            if let Err(e) = write(&mut self.disk, bus, &buf, &new_records) {
                self.refused_bytes = self.refused_bytes.max(buf.len() as u64);
                return Err(e);
            }
        }
        let wrote = !new_records.is_empty();
        self.publish(bus, new_records, end, heads, now);
        Ok((replies, wrote))
    }

    /// Makes records visible, applies retention and deletes segments fully evicted.
    fn publish(
        &mut self,
        bus: &SegmentLogBus,
        new_records: Vec<Arc<Record>>,
        end: u64,
        heads: HashMap<Arc<str>, (u64, u64)>,
        now: u64,
    ) {
        let base = {
            let Ok(mut log) = bus.core.log.write() else { return };
            log.publish(new_records, end, heads, &self.retention, now);
            log.base
        };
        drop_old_segments(&mut self.disk, base);
        bus.core.announce(end);
    }

    /// Age retention, the readiness probe while writes fail, cursor flush.
    fn tick(&mut self) {
        let Some(bus) = self.bus.upgrade() else { return };
        let end = bus.core.log.read().map(|l| l.end).unwrap_or(1);
        self.publish(&bus, Vec::new(), end, HashMap::new(), retention::now_ms());
        if self.failing {
            // No append may come while the agents back off (or while not being ready keeps
            // them away): probe with a write as large as the largest one refused, so the
            // bus is ready again only once such a batch would be stored.
            let disk = &mut self.disk;
            let size = self.refused_bytes;
            let probed = cut_back(disk, &bus).and_then(|()| bus.storage.probe(&disk.data_dir, size));
            match probed {
                Ok(()) => self.set_failing(&bus, None),
                Err(e) => self.set_failing(&bus, Some(&e)),
            }
            bus.probes.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
        if let Err(e) = bus.flush_cursors_now()
            && !self.failing
        {
            // While writes fail the cause is reported once, not every second.
            tracing::warn!(error = %e, "cannot store subscriber cursors");
        }
    }
}

/// Cuts bytes a failed write left behind. Until this works nothing else is written.
fn cut_back(disk: &mut Disk, bus: &SegmentLogBus) -> Result<(), StorageError> {
    let Some(a) = &mut disk.active else { return Ok(()) };
    if !a.needs_cut {
        return Ok(());
    }
    if a.file.is_none() {
        let f = std::fs::OpenOptions::new().append(true).open(&a.path).map_err(|e| StorageError::new(&a.path, e))?;
        a.file = Some(f);
    }
    let Some(file) = &a.file else { return Ok(()) };
    let cut = file.set_len(a.good_len).and_then(|()| bus.storage.sync(file));
    if let Err(e) = cut {
        // A bad descriptor is reopened next time.
        a.file = None;
        return Err(StorageError::new(&a.path, e));
    }
    a.needs_cut = false;
    tracing::info!(path = %a.path.display(), len = a.good_len, "cut bus segment back to its last complete record");
    Ok(())
}

/// Writes one batch durably to the active segment (rolling to a new one when full), then
/// the log's mark. Either failing leaves nothing of the batch behind: it is refused, and
/// its offsets are handed out again.
fn write(disk: &mut Disk, bus: &SegmentLogBus, buf: &[u8], records: &[Arc<Record>]) -> Result<(), StorageError> {
    cut_back(disk, bus)?;
    let full =
        disk.active.as_ref().is_none_or(|a| a.good_len >= disk.segment_bytes || a.records >= disk.segment_records);
    if full {
        roll(disk, bus, records[0].offset)?;
    }
    let Some(a) = &mut disk.active else { return Ok(()) };
    let Some(file) = &mut a.file else { return Ok(()) };
    let (marks, storage, path) = (&mut disk.marks, &bus.storage, &a.path);
    // The records, then the mark after them; both synced at once (see `super::marks`).
    let written = storage.write_all(file, buf).map_err(|e| StorageError::new(path, e)).and_then(|()| {
        let next = marks.write(records, storage)?;
        let mark_file = marks.to_sync(storage)?;
        let syncing = match (&disk.syncer, &mark_file) {
            (Some(syncer), Some(f)) => syncer.start(f.clone()),
            _ => false,
        };
        let segment = storage.sync(file);
        let mark = match (&disk.syncer, mark_file) {
            (Some(syncer), _) if syncing => syncer.wait(),
            (_, Some(f)) => f.sync_data(),
            (_, None) => Ok(()),
        };
        segment.map_err(|e| StorageError::new(path, e))?;
        mark.map_err(|e| StorageError::new(marks.path(), e))?;
        marks.done(next);
        Ok(())
    });
    if let Err(err) = written {
        // Nothing of the batch is acked: cut it back, so its offsets are handed out again.
        a.needs_cut = true;
        if let Err(cut) = cut_back(disk, bus) {
            tracing::error!(error = %cut, "cannot cut a failed write back yet; will retry before the next write");
        }
        return Err(err);
    }
    a.good_len += buf.len() as u64;
    a.records += records.len() as u64;
    a.clusters.extend(records.iter().map(|r| r.cluster.clone()));
    Ok(())
}

/// Closes the active segment (writing its cluster index) and starts one at `first`.
fn roll(disk: &mut Disk, bus: &SegmentLogBus, first: u64) -> Result<(), StorageError> {
    if let Some(a) = &disk.active
        && a.records > 0
        && let Err(e) = segment::write_index(&bus.storage, &a.path, a.clusters.iter())
    {
        // Without an index, damage found later in this segment resyncs every cluster.
        tracing::warn!(error = %e, "cannot write bus segment index");
    }
    if disk.active.as_ref().is_some_and(|a| a.records == 0 && a.good_len == 0) {
        // An empty active segment (a failed first write) is reused under its new name.
        if let Some(a) = disk.active.take() {
            let _ = std::fs::remove_file(&a.path);
            disk.segments.retain(|(f, _)| *f != a.first);
        }
    }
    let path = segment::path(&disk.seg_dir, first);
    let file = bus.storage.open_segment(&path).map_err(|e| StorageError::new(&path, e))?;
    disk.segments.push_back((first, path.clone()));
    disk.active = Some(Active {
        first,
        path,
        file: Some(file),
        good_len: 0,
        needs_cut: false,
        records: 0,
        clusters: HashSet::new(),
    });
    Ok(())
}

/// Deletes segment files all of whose records are evicted (never the active one).
fn drop_old_segments(disk: &mut Disk, base: u64) {
    while disk.segments.len() > 1 {
        if disk.segments[1].0 > base {
            break;
        }
        if let Some((_, path)) = disk.segments.pop_front()
            && let Err(e) = segment::remove(&path)
        {
            tracing::warn!(path = %path.display(), error = %e, "cannot remove old bus segment");
        }
    }
}
