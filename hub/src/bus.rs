//! The embedded bus: an ordered log of records with per-cluster heads, optional on-disk
//! durability, bounded retention and durable subscriber cursors.
//!
//! One writer task owns appends. It takes every request that is waiting, writes them
//! with one `fdatasync` (group commit), then makes them visible and answers. The hub
//! acks an agent only after that answer, so an acked event survives a hub crash when the
//! bus has a data directory.

use std::collections::{HashMap, VecDeque};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};

use bytes::Bytes;
use serde::Deserialize;
use tokio::sync::{mpsc, oneshot, watch};

/// One record of the log.
#[derive(Debug)]
pub struct Record {
    /// Position in the log, from 1.
    pub offset: u64,
    /// The cluster it belongs to.
    pub cluster: Arc<str>,
    /// The agent epoch and seq it carries.
    pub epoch: u64,
    /// The seq.
    pub seq: u64,
    /// What it is.
    pub body: RecordBody,
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
#[derive(Debug, thiserror::Error)]
pub enum BusError {
    /// Disk I/O failed.
    #[error("bus storage {path}: {source}")]
    Io {
        /// Which file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The bus is shut down.
    #[error("bus is closed")]
    Closed,
}

/// Bus settings.
#[derive(Debug, Clone)]
pub struct BusOptions {
    /// Where to keep the log and cursors; `None` keeps everything in memory only.
    pub dir: Option<PathBuf>,
    /// Records kept (in memory and on disk); older ones are evicted and their clusters
    /// marked so lagging subscribers get `resync-required`.
    pub retention: usize,
    /// Records per segment file.
    pub segment_records: u64,
}

impl Default for BusOptions {
    fn default() -> Self {
        Self { dir: None, retention: 200_000, segment_records: 50_000 }
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
    /// The offset to read next.
    pub next: u64,
}

struct Log {
    records: VecDeque<Arc<Record>>,
    /// Offset of `records[0]` (or the next offset when empty).
    base: u64,
    /// Next offset to assign.
    end: u64,
    /// Per cluster: the highest evicted offset.
    evicted: HashMap<Arc<str>, u64>,
    /// Per cluster: the (epoch, seq) of its latest record.
    heads: HashMap<Arc<str>, (u64, u64)>,
}

struct Request {
    cluster: Arc<str>,
    items: Vec<Append>,
    reply: oneshot::Sender<Result<u64, BusError>>,
}

/// The embedded bus. Cheap to share: `Arc<Bus>`.
pub struct Bus {
    stream_id: String,
    log: RwLock<Log>,
    tx: mpsc::Sender<Request>,
    end_tx: watch::Sender<u64>,
    cursors: Mutex<HashMap<String, u64>>,
    cursors_dirty: std::sync::atomic::AtomicBool,
    dir: Option<PathBuf>,
}

#[derive(Deserialize)]
struct DiskRecord<'a> {
    o: u64,
    c: &'a str,
    ep: u64,
    s: u64,
    #[serde(borrow, default)]
    e: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    r: Option<String>,
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BusError + '_ {
    move |source| BusError::Io { path: path.to_path_buf(), source }
}

impl Bus {
    /// Opens the bus (reading the log from disk when there is a directory) and starts its
    /// writer task. Needs a tokio runtime.
    pub fn open(opts: BusOptions) -> Result<Arc<Self>, BusError> {
        let mut log = Log { records: VecDeque::new(), base: 1, end: 1, evicted: HashMap::new(), heads: HashMap::new() };
        let mut cursors = HashMap::new();
        let mut stream_id = format!("{:016x}", rand::random::<u64>());
        let mut segments = Vec::new();
        if let Some(dir) = &opts.dir {
            let seg_dir = dir.join("segments");
            std::fs::create_dir_all(&seg_dir).map_err(io(&seg_dir))?;
            let id_path = dir.join("stream-id");
            match std::fs::read_to_string(&id_path) {
                Ok(s) if !s.trim().is_empty() => stream_id = s.trim().to_string(),
                _ => std::fs::write(&id_path, &stream_id).map_err(io(&id_path))?,
            }
            let cursors_path = dir.join("cursors.json");
            if let Ok(text) = std::fs::read_to_string(&cursors_path) {
                cursors = serde_json::from_str(&text).unwrap_or_default();
            }
            segments = load_segments(&seg_dir, &mut log)?;
            evict(&mut log, opts.retention);
        }
        let (tx, rx) = mpsc::channel(4096);
        let (end_tx, _) = watch::channel(log.end);
        let bus = Arc::new(Self {
            stream_id,
            log: RwLock::new(log),
            tx,
            end_tx,
            cursors: Mutex::new(cursors),
            cursors_dirty: false.into(),
            dir: opts.dir.clone(),
        });
        let writer = Writer::new(&bus, opts, segments)?;
        std::thread::Builder::new()
            .name("bus-writer".into())
            .spawn(move || writer.run(rx))
            .map_err(io(Path::new("bus-writer thread")))?;
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
    pub async fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> Result<u64, BusError> {
        let (reply, rx) = oneshot::channel();
        self.tx.send(Request { cluster, items, reply }).await.map_err(|_| BusError::Closed)?;
        rx.await.map_err(|_| BusError::Closed)?
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

    /// Reads up to `max` records from offset `from` on.
    pub fn read(&self, from: u64, max: usize) -> Read {
        let Ok(log) = self.log.read() else { return Read { next: from, ..Read::default() } };
        let mut out = Read { next: from, ..Read::default() };
        if from < log.base {
            out.evicted =
                log.evicted.iter().filter(|(_, off)| **off >= from).map(|(c, off)| (c.clone(), *off)).collect();
            out.next = log.base;
        }
        let start = (out.next - log.base) as usize;
        out.records.extend(log.records.iter().skip(start).take(max).cloned());
        out.next += out.records.len() as u64;
        out
    }

    /// The stored cursor of a durable subscriber.
    pub fn durable_cursor(&self, name: &str) -> Option<u64> {
        self.cursors.lock().ok()?.get(name).copied()
    }

    /// Stores a durable subscriber's cursor (written to disk by [`Bus::flush_cursors`]).
    pub fn set_durable_cursor(&self, name: &str, cursor: u64) {
        if let Ok(mut c) = self.cursors.lock() {
            let e = c.entry(name.to_string()).or_insert(0);
            if cursor > *e {
                *e = cursor;
                self.cursors_dirty.store(true, std::sync::atomic::Ordering::Relaxed);
            }
        }
    }

    /// Writes durable cursors to disk when they changed.
    pub fn flush_cursors(&self) -> Result<(), BusError> {
        let Some(dir) = &self.dir else { return Ok(()) };
        if !self.cursors_dirty.swap(false, std::sync::atomic::Ordering::Relaxed) {
            return Ok(());
        }
        let text = match self.cursors.lock() {
            Ok(c) => serde_json::to_string(&*c).unwrap_or_default(),
            Err(_) => return Ok(()),
        };
        let tmp = dir.join("cursors.json.tmp");
        let path = dir.join("cursors.json");
        std::fs::write(&tmp, text).map_err(io(&tmp))?;
        std::fs::rename(&tmp, &path).map_err(io(&path))
    }

    /// Number of records retained.
    pub fn retained(&self) -> usize {
        self.log.read().map(|l| l.records.len()).unwrap_or(0)
    }
}

fn evict(log: &mut Log, retention: usize) {
    while log.records.len() > retention {
        if let Some(r) = log.records.pop_front() {
            log.evicted.insert(r.cluster.clone(), r.offset);
            log.base = r.offset + 1;
        }
    }
}

fn segment_path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.log"))
}

/// Reads all segments into `log`; returns (first offset, path) of each, oldest first.
/// A torn last line (crash mid-write) is cut off.
fn load_segments(dir: &Path, log: &mut Log) -> Result<Vec<(u64, PathBuf)>, BusError> {
    let mut segs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(io(dir))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            let first = p.file_stem()?.to_str()?.parse().ok()?;
            (p.extension()? == "log").then_some((first, p))
        })
        .collect();
    segs.sort();
    let mut clusters: HashMap<String, Arc<str>> = HashMap::new();
    for (_, path) in &segs {
        let file = std::fs::File::open(path).map_err(io(path))?;
        let mut reader = std::io::BufReader::new(file);
        let mut good_len = 0u64;
        let mut line = String::new();
        loop {
            line.clear();
            let n = reader.read_line(&mut line).map_err(io(path))?;
            if n == 0 || !line.ends_with('\n') {
                break;
            }
            let Ok(rec) = serde_json::from_str::<DiskRecord>(&line) else { break };
            good_len += n as u64;
            let cluster = clusters.entry(rec.c.to_string()).or_insert_with(|| Arc::from(rec.c)).clone();
            let body = match (rec.e, rec.r) {
                (Some(raw), _) => RecordBody::Event(Bytes::copy_from_slice(raw.get().as_bytes())),
                (None, reason) => RecordBody::ResyncRequired(reason.unwrap_or_default()),
            };
            if log.records.is_empty() {
                log.base = rec.o;
            }
            log.end = rec.o + 1;
            log.heads.insert(cluster.clone(), (rec.ep, rec.s));
            log.records.push_back(Arc::new(Record { offset: rec.o, cluster, epoch: rec.ep, seq: rec.s, body }));
        }
        let len = std::fs::metadata(path).map_err(io(path))?.len();
        if good_len < len {
            tracing::warn!(path = %path.display(), good_len, len, "cutting torn tail of bus segment");
            let f = std::fs::OpenOptions::new().write(true).open(path).map_err(io(path))?;
            f.set_len(good_len).map_err(io(path))?;
        }
    }
    Ok(segs)
}

struct Writer {
    /// Weak: when the last `Bus` handle goes, its sender goes and the writer stops.
    bus: std::sync::Weak<Bus>,
    opts: BusOptions,
    /// Segments on disk, oldest first, with their first offset.
    segments: VecDeque<(u64, PathBuf)>,
    file: Option<std::fs::File>,
    in_segment: u64,
    seg_dir: Option<PathBuf>,
}

impl Writer {
    fn new(bus: &Arc<Bus>, opts: BusOptions, segments: Vec<(u64, PathBuf)>) -> Result<Self, BusError> {
        let seg_dir = opts.dir.as_ref().map(|d| d.join("segments"));
        let mut w =
            Self { bus: Arc::downgrade(bus), opts, segments: segments.into(), file: None, in_segment: 0, seg_dir };
        if let Some((first, path)) = w.segments.back().cloned() {
            let end = bus.log.read().map(|l| l.end).unwrap_or(1);
            w.in_segment = end.saturating_sub(first);
            w.file = Some(std::fs::OpenOptions::new().append(true).open(&path).map_err(io(&path))?);
        }
        Ok(w)
    }

    /// Runs on its own thread: disk writes and fsync block, and must not stall the async
    /// workers that serve sessions.
    fn run(mut self, mut rx: mpsc::Receiver<Request>) {
        let mut batch = Vec::new();
        while let Some(first) = rx.blocking_recv() {
            batch.push(first);
            while batch.len() < 1024 {
                match rx.try_recv() {
                    Ok(req) => batch.push(req),
                    Err(_) => break,
                }
            }
            if let Err(e) = self.commit(&mut batch) {
                tracing::error!(error = %e, "bus append failed");
                for req in batch.drain(..) {
                    let _ = req.reply.send(Err(BusError::Io {
                        path: self.seg_dir.clone().unwrap_or_default(),
                        source: std::io::Error::other(e.to_string()),
                    }));
                }
            }
            if let Some(bus) = self.bus.upgrade() {
                let _ = bus.flush_cursors();
            }
        }
    }

    fn commit(&mut self, batch: &mut Vec<Request>) -> Result<(), BusError> {
        let bus = self.bus.upgrade().ok_or(BusError::Closed)?;
        let mut end = bus.log.read().map_err(|_| BusError::Closed)?.end;
        let mut new_records: Vec<Arc<Record>> = Vec::new();
        let mut replies: Vec<(oneshot::Sender<Result<u64, BusError>>, u64)> = Vec::new();
        let mut heads: HashMap<Arc<str>, (u64, u64)> = HashMap::new();
        let mut buf = Vec::new();
        for req in batch.drain(..) {
            let mut head = heads.get(&req.cluster).copied().or_else(|| bus.head(&req.cluster));
            let mut last = end.saturating_sub(1);
            for item in req.items {
                if let Some((ep, seq)) = head
                    && ep == item.epoch
                    && item.seq <= seq
                {
                    continue; // duplicate from a resend
                }
                let rec = Record {
                    offset: end,
                    cluster: req.cluster.clone(),
                    epoch: item.epoch,
                    seq: item.seq,
                    body: item.body,
                };
                if self.seg_dir.is_some() {
                    encode_disk(&rec, &mut buf);
                }
                head = Some((item.epoch, item.seq));
                last = end;
                end += 1;
                new_records.push(Arc::new(rec));
            }
            if let Some(h) = head {
                heads.insert(req.cluster.clone(), h);
            }
            replies.push((req.reply, last));
        }
        if self.seg_dir.is_some() && !new_records.is_empty() {
            self.write_durably(&buf, &new_records)?;
        }
        {
            let mut log = bus.log.write().map_err(|_| BusError::Closed)?;
            log.records.extend(new_records);
            log.end = end;
            if log.records.is_empty() {
                log.base = end;
            }
            log.heads.extend(heads);
            evict(&mut log, self.opts.retention);
            let base = log.base;
            drop(log);
            self.drop_old_segments(base);
        }
        bus.end_tx.send_replace(end);
        for (reply, last) in replies {
            let _ = reply.send(Ok(last));
        }
        Ok(())
    }

    fn write_durably(&mut self, buf: &[u8], records: &[Arc<Record>]) -> Result<(), BusError> {
        let Some(dir) = self.seg_dir.clone() else { return Ok(()) };
        if self.file.is_none() || self.in_segment >= self.opts.segment_records {
            let first = records[0].offset;
            let path = segment_path(&dir, first);
            self.file = Some(std::fs::OpenOptions::new().create(true).append(true).open(&path).map_err(io(&path))?);
            self.segments.push_back((first, path));
            self.in_segment = 0;
        }
        let Some(file) = self.file.as_mut() else { return Ok(()) };
        file.write_all(buf).map_err(io(&dir))?;
        file.sync_data().map_err(io(&dir))?;
        self.in_segment += records.len() as u64;
        Ok(())
    }

    /// Deletes segment files all of whose records are evicted.
    fn drop_old_segments(&mut self, base: u64) {
        while self.segments.len() > 1 {
            let next_first = self.segments[1].0;
            if next_first > base {
                break;
            }
            if let Some((_, path)) = self.segments.pop_front()
                && let Err(e) = std::fs::remove_file(&path)
            {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove old bus segment");
            }
        }
    }
}

fn encode_disk(rec: &Record, buf: &mut Vec<u8>) {
    let cluster = serde_json::to_string(&*rec.cluster).unwrap_or_default();
    let _ = write!(buf, r#"{{"o":{},"c":{},"ep":{},"s":{},"#, rec.offset, cluster, rec.epoch, rec.seq);
    match &rec.body {
        RecordBody::Event(json) => {
            buf.extend_from_slice(br#""e":"#);
            buf.extend_from_slice(json);
        }
        RecordBody::ResyncRequired(reason) => {
            let _ = write!(buf, r#""r":{}"#, serde_json::to_string(reason).unwrap_or_default());
        }
    }
    buf.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(epoch: u64, seq: u64) -> Append {
        Append { epoch, seq, body: RecordBody::Event(Bytes::from(format!(r#"{{"seq":{seq}}}"#))) }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn appends_dedupes_and_reads() {
        let bus = Bus::open(BusOptions::default()).unwrap();
        let c: Arc<str> = "c1".into();
        assert_eq!(bus.append(c.clone(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(), 2);
        // A resend of seq 2 plus a new seq 3: only 3 is appended.
        assert_eq!(bus.append(c.clone(), vec![ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
        assert_eq!(bus.head("c1"), Some((1, 3)));
        let r = bus.read(1, 10);
        assert_eq!(r.records.iter().map(|r| r.seq).collect::<Vec<_>>(), vec![1, 2, 3]);
        assert_eq!(r.next, 4);
        // A new epoch starts over.
        bus.append(c.clone(), vec![ev(2, 1)]).await.unwrap();
        assert_eq!(bus.head("c1"), Some((2, 1)));
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn eviction_reports_affected_clusters() {
        let bus = Bus::open(BusOptions { retention: 3, ..BusOptions::default() }).unwrap();
        bus.append("a".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
        bus.append("b".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap();
        let r = bus.read(1, 10);
        assert_eq!(r.records.len(), 3);
        let mut ev: Vec<_> = r.evicted.iter().map(|(c, _)| c.to_string()).collect();
        ev.sort();
        assert_eq!(ev, vec!["a"]);
        assert!(bus.read(3, 10).evicted.is_empty());
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn survives_restart_with_a_directory() {
        let dir = tempfile::tempdir().unwrap();
        let opts = BusOptions { dir: Some(dir.path().into()), retention: 100, segment_records: 4 };
        let stream;
        {
            let bus = Bus::open(opts.clone()).unwrap();
            stream = bus.stream_id().to_string();
            for i in 1..=10 {
                bus.append("c".into(), vec![ev(7, i)]).await.unwrap();
            }
            bus.append("c".into(), vec![Append { epoch: 7, seq: 11, body: RecordBody::ResyncRequired("x".into()) }])
                .await
                .unwrap();
            bus.set_durable_cursor("sub", 5);
            bus.flush_cursors().unwrap();
        }
        // A torn write at the end of the last segment is cut off.
        let mut segs: Vec<_> =
            std::fs::read_dir(dir.path().join("segments")).unwrap().map(|e| e.unwrap().path()).collect();
        segs.sort();
        std::fs::OpenOptions::new().append(true).open(segs.last().unwrap()).unwrap().write_all(b"{\"o\":12,").unwrap();
        let bus = Bus::open(opts).unwrap();
        assert_eq!(bus.stream_id(), stream);
        assert_eq!(bus.head("c"), Some((7, 11)));
        assert_eq!(bus.last_offset(), 11);
        assert_eq!(bus.durable_cursor("sub"), Some(5));
        let r = bus.read(1, 100);
        assert_eq!(r.records.len(), 11);
        assert!(matches!(r.records[10].body, RecordBody::ResyncRequired(_)));
        assert_eq!(bus.append("c".into(), vec![ev(7, 12)]).await.unwrap(), 12);
    }
}
