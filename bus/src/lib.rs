//! The bus: the ordered log between agent sessions (which append and ack only what it
//! accepted) and subscriber sessions (which read from a cursor). Sessions see it only as
//! the [`Bus`] trait, so the backend is a deployment choice:
//!
//! - [`MemoryBus`] ([`memory`]): records in memory only; a restart starts a new stream
//!   (subscribers get `resync-required` `*`).
//! - [`SegmentLogBus`] ([`segment_log`]): the same index in memory, plus checksummed
//!   segment files written by one writer thread with group commit (`segment_log/writer.rs`), recovery
//!   of damaged files at start (`segment_log/recovery.rs`) and durable cursors on disk ([`cursors`]).
//! - [`NatsBus`] ([`nats`]): NATS JetStream, shared by several hub replicas; a backend
//!   over the network, which is why every operation that may need a round trip returns a
//!   future ([`BusFuture`]) and errors are typed ([`BusError`]).
//!
//! The [`Bus`] trait holds what every backend does: append, read, durable cursors, health.
//! What only some have is a trait of its own, reached through [`Bus::replica_share`] and
//! [`Bus::fault_injection`]: [`ReplicaShare`] (the NATS bus: the fleet's state, one entry
//! per cluster, and the replicas' heartbeats) and [`FaultInjection`] (the segment log: its storage made to fail, for
//! tests and the chaos soak). The two embedded backends answer the reads from one shared
//! core ([`log`]), forwarded to it in one place (`log::forward_to_core`).
//!
//! The crate depends on no other fleetwatch crate: the hub passes in what it needs
//! ([`BusOptions`], [`NatsOptions`]).
//!
//! What every backend must do is written down as the conformance suite ([`conformance`]),
//! run against each implementation: duplicates by (epoch, seq) skipped, reads that always
//! make progress, evicted history reported per cluster, durable cursors that only move
//! forward, reasons capped, stats that follow the log, a reason for every gap.
//!
//! Data directory layout of the segment log (format 2; see `segment_log/record.rs` for the framing):
//! - `format`: `fleetwatch-bus 2`. A directory with a `stream-id` but no `format` is from
//!   an older release: its `segments` and `cursors.json` are moved aside (`*-v1`) and a
//!   new stream starts, so subscribers get `resync-required` `*`.
//! - `stream-id`: a new one means the history was lost.
//! - `segments/<first offset>.log`: checksummed records; `.idx`: the clusters of a closed
//!   segment, to attribute damage found later.
//! - `cursors.json`: durable cursors and the offset high-water mark ([`cursors`]).
//! - `marks`: the log's end and each recent cluster's latest record, synced with every
//!   group commit, so a log cut at a record boundary is noticed at start (`segment_log/marks.rs`).

#[cfg(test)]
mod conformance;
mod cursors;
mod deferred;
mod log;
mod memory;
pub mod nats;
mod retention;
mod segment_log;
mod storage;

use std::borrow::Cow;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::watch;

pub use cursors::{DurableError, Lookup, MAX_NAME_BYTES, MAX_NAMES_PER_IDENTITY};
pub use deferred::DeferredBus;
pub use memory::MemoryBus;
pub use nats::{NatsBus, NatsError, NatsOptions};
pub use retention::{DEFAULT_AGE_DISK, DEFAULT_AGE_MEMORY, DEFAULT_BYTES_DISK, DEFAULT_BYTES_MEMORY, Retention};
pub use segment_log::SegmentLogBus;
pub use storage::{DiskFull, StorageError};

/// What a bus operation that may need a round trip returns. The embedded backends answer
/// at once (or after their group commit); one boxed future per call, never per event.
pub type BusFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, BusError>> + Send + 'a>>;

/// The event log as sessions see it. Cheap to share: `Arc<dyn Bus>`.
///
/// Offsets start at 1 and increase, possibly with gaps. An append is answered only once
/// the records are stored as durably as the backend stores anything: the hub acks agents
/// on that answer.
///
/// Its methods, by what they serve: identity ([`stream_id`](Self::stream_id)); writing
/// ([`append`](Self::append), [`start_append`](Self::start_append), [`head`](Self::head));
/// reading ([`prepare_reads`](Self::prepare_reads), [`read`](Self::read),
/// [`last_offset`](Self::last_offset), [`watch_end`](Self::watch_end)); durable cursors
/// ([`durable_lookup`](Self::durable_lookup), [`register_durable`](Self::register_durable),
/// [`set_durable_cursor`](Self::set_durable_cursor), [`flush`](Self::flush)); and what the
/// hub shows and tells ([`stats`](Self::stats), [`resync_reason`](Self::resync_reason),
/// [`health`](Self::health), [`fatal`](Self::fatal)), with the two ways to what only some
/// backends have ([`replica_share`](Self::replica_share),
/// [`fault_injection`](Self::fault_injection)).
pub trait Bus: Send + Sync + 'static {
    /// The stream id: a new one means the history was lost (subscribers resync).
    fn stream_id(&self) -> &str;

    /// Appends records for one cluster; answers the offset of the last one. Records whose
    /// seq is not above the cluster's head in the same epoch are duplicates and skipped
    /// (then the answer is the log's last offset). Reasons longer than
    /// [`MAX_REASON_BYTES`] are cut.
    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64>;

    /// Starts an append whose answer may come later, so a session can have several batches
    /// in flight. The outer future resolves once the records are handed to the backend:
    /// appends started one after another (each outer future awaited before the next call)
    /// are stored in that order or not at all past a failure — a later batch stored after
    /// an earlier one failed is turned into a `resync-required` for the cluster by the
    /// backend itself (see [`NatsBus`]). The inner future answers as [`Bus::append`] does.
    /// The default stores the whole batch in the outer future (backends that answer at
    /// once or after their own group commit gain nothing from more in flight).
    fn start_append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, BusFuture<'_, u64>> {
        Box::pin(async move {
            let offset = self.append(cluster, items).await?;
            Ok(ready(Ok(offset)))
        })
    }

    /// The (epoch, seq) of a cluster's latest record.
    fn head<'a>(&'a self, cluster: &'a str) -> BusFuture<'a, Option<(u64, u64)>>;

    /// Gets the bus ready for this hub's readers; called before a subscriber session reads.
    /// The NATS bus starts following the stream here (its local tail), so a replica that
    /// serves only agents never receives the stream. The embedded backends are always ready.
    fn prepare_reads(&self) -> BusFuture<'_, ()> {
        ready(Ok(()))
    }

    /// Reads up to `max` records from offset `from` on, with the clusters whose records
    /// below the oldest retained one were evicted (see [`Read`]).
    fn read(&self, from: u64, max: usize) -> BusFuture<'_, Read>;

    /// The offset of the newest record (0 when empty): [`BusStats::last_offset`] alone,
    /// kept a method of its own because the read and fan-out loops ask it at every turn
    /// and it costs one load, where the whole [`Bus::stats`] may take a lock.
    fn last_offset(&self) -> u64;

    /// A receiver that changes whenever records are appended (its value: the next offset);
    /// call [`Bus::prepare_reads`] first.
    fn watch_end(&self) -> watch::Receiver<u64>;

    /// What is stored for durable subscription `name` of subscriber `identity`; refuses
    /// names over the bounds ([`MAX_NAME_BYTES`], [`MAX_NAMES_PER_IDENTITY`]).
    fn durable_lookup<'a>(&'a self, identity: &'a str, name: &'a str) -> BusFuture<'a, Lookup>;

    /// Registers a durable subscription's start point (stored even when lower).
    fn register_durable<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()>;

    /// Moves a durable subscription's cursor forward (never back).
    fn set_durable_cursor<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()>;

    /// Stores what was kept to be written later: with [`Flush::Cursors`], durable cursors
    /// that changed (a no-op where they are stored at once) and whatever else a backend
    /// writes coalesced (the NATS bus: cluster heads that are due); with [`Flush::All`],
    /// also what a backend writes later than that (the NATS bus paces cluster heads), at
    /// shutdown.
    fn flush(&self, what: Flush) -> BusFuture<'_, ()>;

    /// What the bus holds and how its writes went, as one value (see [`BusStats`]): for
    /// metrics, the admin pages, and a session's start.
    fn stats(&self) -> BusStats;

    /// The reason a subscriber is given, in a `resync-required`, for a gap in what it can
    /// read (see [`Gap`]). The texts are the protocol's: clients and tests match them. The
    /// default answers [`Gap::default_reason`]; a backend that knows better says why.
    fn resync_reason(&self, gap: Gap<'_>) -> Cow<'static, str> {
        gap.default_reason()
    }

    /// Whether the bus can store records: `Err(cause)` while writes fail.
    fn health(&self) -> Result<(), String>;

    /// Why the bus can never work again in this process, if so: the hub then stops and
    /// exits with this cause, so its supervisor starts it again (the NATS bus, when the
    /// stream was recreated by a hub that did not know this bus). `None` for every failure
    /// that passes.
    fn fatal(&self) -> Option<String> {
        None
    }

    /// Sharing with other hub replicas, for a bus several replicas use ([`NatsBus`]);
    /// `None` for a bus of one hub.
    fn replica_share(&self) -> Option<&dyn ReplicaShare> {
        None
    }

    /// Storage fault injection, for a bus with storage to fail ([`SegmentLogBus`]); `None`
    /// otherwise.
    fn fault_injection(&self) -> Option<&dyn FaultInjection> {
        None
    }
}

/// A snapshot of what a bus holds and how its writes went ([`Bus::stats`]): plain numbers,
/// taken at once (the embedded backends read their index under one shared lock, the NATS
/// bus its counters or the stream's state as last seen).
///
/// ```
/// use fleetwatch_bus::{Bus, MemoryBus, Retention};
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let stats = MemoryBus::open(Retention::default()).stats();
/// assert_eq!((stats.first_offset, stats.last_offset, stats.retained), (1, 0, 0), "an empty bus");
/// assert!(!stats.durable && stats.holds_records);
/// # });
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BusStats {
    /// Whether acked records survive a restart (what the backend is, not how it is doing).
    pub durable: bool,
    /// The offset of the oldest retained record (the next offset when empty).
    pub first_offset: u64,
    /// The offset of the newest record (0 when empty); also [`Bus::last_offset`].
    pub last_offset: u64,
    /// Number of records retained.
    pub retained: usize,
    /// Bytes of records retained (as counted for retention).
    pub retained_bytes: u64,
    /// Whether this hub holds the retained records in its memory. The NATS bus does once
    /// its local tail started (with the replica's first reader); until then it answers
    /// the offsets and [`retained`](Self::retained) from the stream's state as last seen.
    pub holds_records: bool,
    /// Batches refused so far because a write failed.
    pub write_failures: u64,
}

impl BusStats {
    /// What a bus with nothing in it and no failed write shows (a [`DeferredBus`] not open
    /// yet): offsets 1 (first) and 0 (last), held in memory.
    pub fn empty(durable: bool) -> Self {
        Self {
            durable,
            first_offset: 1,
            last_offset: 0,
            retained: 0,
            retained_bytes: 0,
            holds_records: true,
            write_failures: 0,
        }
    }
}

/// A gap in what a subscriber can read, which it is told of with a `resync-required`;
/// [`Bus::resync_reason`] words why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Gap<'a> {
    /// The subscriber resumes with the cursor of another stream id: this bus's history
    /// before it is gone (a `resync-required` `*`).
    LostHistory,
    /// A read reported a cluster's records up to `offset` evicted ([`Read::evicted`]).
    Evicted {
        /// The offset of the cluster's last evicted record.
        offset: u64,
    },
    /// The bus answered [`Lookup::Lost`] for a durable subscription: where it stopped is
    /// unknown (a `resync-required` `*`).
    LostCursor {
        /// The durable subscription's name.
        name: &'a str,
    },
}

impl Gap<'_> {
    /// The reason a bus with nothing particular to say gives (the segment log's, and what
    /// the others fall back to).
    ///
    /// ```
    /// use fleetwatch_bus::Gap;
    /// assert_eq!(
    ///     Gap::LostCursor { name: "audit" }.default_reason(),
    ///     "the hub lost its durable cursor store: where durable subscription \"audit\" stopped is unknown"
    /// );
    /// ```
    pub fn default_reason(self) -> Cow<'static, str> {
        match self {
            Gap::LostHistory => Cow::Borrowed("the hub's event history was lost (restart without a data directory)"),
            Gap::Evicted { .. } => Cow::Borrowed(EVICTED),
            Gap::LostCursor { name } => Cow::Owned(format!(
                "the hub lost its durable cursor store: where durable subscription {name:?} stopped is unknown"
            )),
        }
    }
}

/// The reason of a [`Gap::Evicted`] wherever retention evicted the records.
pub(crate) const EVICTED: &str = "events were evicted from the hub before this subscriber read them";

/// What [`Bus::flush`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Flush {
    /// What is due: durable cursors that changed, and what a backend writes coalesced
    /// (the hub flushes once a second).
    Cursors,
    /// Everything kept to be written later, paced writes too: at shutdown.
    All,
}

/// What a bus shared by several hub replicas adds: the fleet's state, one entry per cluster
/// as the replica its agent is connected to shows it, and each replica's heartbeat, so
/// `/api/v1/clusters` on any replica shows the whole fleet. Obtained with
/// [`Bus::replica_share`]; its presence is what "shared" means. The bus stores bytes; what
/// an entry holds, and who writes it when, is the hub's (`fleetwatch_hub::fleet::state`).
pub trait ReplicaShare: Send + Sync {
    /// Writes this replica's heartbeat (a small value); it expires after
    /// [`nats::REPLICA_TTL`] without another.
    fn heartbeat<'a>(&'a self, replica: &'a str, value: Bytes) -> BusFuture<'a, ()>;

    /// Every replica whose heartbeat has not expired, with what it wrote (a release before
    /// the per-cluster entries wrote its whole cluster list there, as a JSON array).
    fn replicas(&self) -> BusFuture<'_, Vec<(String, Bytes)>>;

    /// Writes the entry of `cluster` if `expect` holds; [`Written::Moved`] when it does not
    /// (another replica wrote the entry since).
    fn write_entry<'a>(&'a self, cluster: &'a str, value: Bytes, expect: Expect) -> BusFuture<'a, Written>;

    /// Follows every cluster's entry: the latest of each, [`EntryEvent::CaughtUp`], then each
    /// change as it is written.
    fn follow_entries(&self) -> BusFuture<'_, EntryStream>;

    /// The largest entry the bus stores, in bytes (a larger write is refused).
    fn max_entry_bytes(&self) -> usize;

    /// How long an entry outlives its last write.
    fn entry_max_age(&self) -> Duration;

    /// Changes whenever the entries were lost (JetStream lost its store and the bucket was
    /// created again, empty): the hub then writes its clusters again and follows afresh.
    fn generation(&self) -> u64;

    /// Follows the cluster heads the replicas record: the latest of each, then each one
    /// written. A replica writes a cluster's head after its records were stored (paced, see
    /// `nats::heads`), never over a later one, and also for records whose fate it did not
    /// learn (an ack lost or timed out) once its link works again. Followed afresh when
    /// [`ReplicaShare::generation`] changes. What agent sessions on a shared bus learn of
    /// another agent process's records of their cluster (see the hub's `session::heads`).
    fn follow_heads(&self) -> BusFuture<'_, HeadStream>;
}

/// A cluster's head as a replica recorded it ([`ReplicaShare::follow_heads`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HeadEvent {
    /// The cluster id.
    pub cluster: String,
    /// The agent process (epoch) of the cluster's latest record.
    pub epoch: u64,
    /// Its seq.
    pub seq: u64,
}

/// The stream of [`ReplicaShare::follow_heads`].
pub type HeadStream = Pin<Box<dyn futures_util::Stream<Item = Result<HeadEvent, BusError>> + Send>>;

/// When [`ReplicaShare::write_entry`] writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expect {
    /// Whatever is there.
    Any,
    /// Only if the cluster has no entry.
    Absent,
    /// Only if the entry is still at this revision (compare-and-set).
    Revision(u64),
}

/// The outcome of [`ReplicaShare::write_entry`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Written {
    /// Stored at this revision.
    Stored(u64),
    /// Not written: the entry is not as expected (another replica wrote it since).
    Moved,
}

/// What following the entries delivers ([`ReplicaShare::follow_entries`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EntryEvent {
    /// A cluster's entry (initial or changed).
    Entry {
        /// The cluster id.
        cluster: String,
        /// The entry (empty: deleted).
        value: Bytes,
        /// Its revision (what [`Expect::Revision`] compares).
        revision: u64,
        /// When it was written, Unix milliseconds (the server's clock), when known.
        written_ms: Option<u64>,
    },
    /// Every entry there was when following began has been delivered.
    CaughtUp,
}

/// The stream of [`ReplicaShare::follow_entries`].
pub type EntryStream = Pin<Box<dyn futures_util::Stream<Item = Result<EntryEvent, BusError>> + Send>>;

/// Making a bus's storage fail on purpose (tests and the chaos soak), for a bus that has
/// storage. Obtained with [`Bus::fault_injection`].
pub trait FaultInjection: Send + Sync {
    /// Makes every storage write fail for `d` through the path a real failure takes.
    fn inject_storage_fault(&self, d: Duration) -> Result<(), BusError>;
}

/// The data directory's format, recorded in its `format` file as `fleetwatch-bus 2` and in
/// every record frame's magic (`FWR2`). A directory without the file and with a stream id
/// is format 1 (JSON lines, before the framing): moved aside, kept, and a new stream begins.
/// A newer format (a rolled-back hub) refuses the start and changes nothing.
pub const LOG_FORMAT: u32 = 2;

/// The durable cursor store's format (`version` in `cursors.json`).
pub const CURSOR_STORE_FORMAT: u32 = 2;

/// Opens the bus `opts` describe: the segment log when there is a data directory, memory
/// otherwise. Needs a tokio runtime.
pub fn open(opts: BusOptions) -> Result<Arc<dyn Bus>, BusError> {
    Ok(match opts.dir.clone() {
        Some(dir) => SegmentLogBus::open(dir, opts)?,
        None => MemoryBus::open(opts.retention),
    })
}

/// An answer that is ready now, as a [`BusFuture`].
fn ready<'a, T: Send + 'a>(value: Result<T, BusError>) -> BusFuture<'a, T> {
    Box::pin(std::future::ready(value))
}

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
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordBody {
    /// An event, as JSON without a cursor.
    Event(Bytes),
    /// Subscribers must reconcile the cluster fully.
    ResyncRequired(String),
}

/// What a session asks to append for one cluster.
#[derive(Debug, PartialEq, Eq)]
pub struct Append {
    /// Epoch.
    pub epoch: u64,
    /// Seq (strictly increasing within the epoch).
    pub seq: u64,
    /// Content.
    pub body: RecordBody,
}

/// Bus failures, typed so a session can answer each with the right code (a network
/// backend adds its own variants rather than strings).
#[derive(Debug, Clone, thiserror::Error)]
pub enum BusError {
    /// A disk operation failed; the batch was not stored.
    #[error(transparent)]
    Storage(#[from] StorageError),
    /// A durable subscription name the bus refuses (too long, too many).
    #[error(transparent)]
    Durable(#[from] DurableError),
    /// NATS JetStream failed (unreachable, refused, not acked).
    #[error(transparent)]
    Nats(#[from] NatsError),
    /// The data directory (or a file in it) was written in a format this build does not
    /// know, by a newer release: the hub refuses to start and changes nothing.
    #[error(
        "{}: {what} is {found}, newer than this hub's {ours} (fleetwatch {}): run a release that reads it, or restore the data directory the older release used (docs/upgrade.md); nothing was changed",
        .path.display(),
        env!("CARGO_PKG_VERSION")
    )]
    NewerFormat {
        /// The file.
        path: PathBuf,
        /// What it is (`the data directory`, `the cursor store`, `a segment`).
        what: &'static str,
        /// The format found.
        found: String,
        /// The format this build writes.
        ours: String,
    },
    /// The bus is shut down.
    #[error("bus is closed")]
    Closed,
    /// The hub started while its storage could not be opened (see [`DeferredBus`]); it
    /// keeps trying: a retryable refusal.
    #[error("the hub's storage is not open yet: {0}")]
    Opening(String),
}

impl BusError {
    /// Whether the bus did not answer in time (see [`NatsError::is_timeout`]): a read may be
    /// asked again. A write may not: whether it was stored is unknown (see [`Bus::start_append`]).
    pub fn is_timeout(&self) -> bool {
        matches!(self, BusError::Nats(e) if e.is_timeout())
    }

    /// Whether the failure lasts until someone acts, so a hub that meets it opening its
    /// bus refuses to start: a setting (a malformed `--bus`, a stream of other settings,
    /// credentials or TLS the server refuses, a data directory it may not write) or data
    /// of a newer format. Everything else passes by itself (a full disk, JetStream
    /// unavailable or slow, NATS unreachable) and the hub waits it out.
    ///
    /// ```
    /// use fleetwatch_bus::{BusError, NatsError};
    /// let slow = NatsError::Connect { servers: "nats://n1:4222".into(), cause: "timed out".into(), lasting: false };
    /// assert!(!BusError::Nats(slow).lasts());
    /// assert!(BusError::Nats(NatsError::Settings("no NATS server given".into())).lasts());
    /// ```
    pub fn lasts(&self) -> bool {
        match self {
            BusError::Storage(e) => e.lasting,
            BusError::Nats(e) => e.lasts(),
            BusError::NewerFormat { .. } => true,
            BusError::Durable(_) | BusError::Closed | BusError::Opening(_) => false,
        }
    }
}

/// Bus settings.
#[derive(Debug, Clone)]
pub struct BusOptions {
    /// Where to keep the log and cursors; `None` keeps everything in memory only
    /// ([`MemoryBus`]), a directory selects the segment log ([`SegmentLogBus`]).
    pub dir: Option<PathBuf>,
    /// Records kept (in memory and on disk), by count, bytes and age; older ones are
    /// evicted and their clusters marked so lagging subscribers get `resync-required`.
    pub retention: Retention,
    /// Records per segment file.
    pub segment_records: u64,
    /// Bytes per segment file.
    pub segment_bytes: u64,
    /// Where the segment log's writer runs (its own thread unless a deterministic
    /// simulation needs it on the runtime).
    pub writer: WriterPlacement,
    /// Fills the segment log's disk while on (the simulation; off by default).
    pub disk_full: DiskFull,
}

impl Default for BusOptions {
    fn default() -> Self {
        Self {
            dir: None,
            retention: Retention::default(),
            segment_records: 50_000,
            segment_bytes: 64 << 20,
            writer: WriterPlacement::Thread,
            disk_full: DiskFull::default(),
        }
    }
}

/// Where the segment log's writer runs.
///
/// ```
/// use fleetwatch_bus::{BusOptions, WriterPlacement};
/// let opts = BusOptions { writer: WriterPlacement::Runtime, ..BusOptions::default() };
/// assert_eq!(opts.writer, WriterPlacement::Runtime);
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum WriterPlacement {
    /// A thread of its own: disk writes and `fdatasync` block, and must not stall the
    /// workers that serve sessions. What a hub uses.
    #[default]
    Thread,
    /// A task on the caller's tokio runtime, writing inline (blocking that runtime while
    /// it writes). Only for the deterministic simulation: one seeded scheduler must order
    /// every commit against the network and the clock, so a seed replays exactly.
    Runtime,
}

/// The result of a read.
#[derive(Debug, Default)]
pub struct Read {
    /// Clusters whose records between the requested offset and the oldest retained one
    /// were evicted, with the offset of each one's last evicted record: the reader must be
    /// told to resync them. Lowest offset first (every backend reads through `Log::read`, which sorts): a subscriber acks a resync's offset, and
    /// an ack must not pass an eviction it has not been told of yet (dst seed 345219: a
    /// session ended after a resync at offset 102 was sent and acked, before the one at
    /// 101 of another cluster; the next session started above 101, and that cluster's
    /// changes were lost silently).
    pub evicted: Vec<(Arc<str>, u64)>,
    /// Records, in order.
    pub records: Vec<Arc<Record>>,
    /// The offset to read next: above the requested one whenever it was below the end,
    /// so a reader always makes progress, across gaps too.
    pub next: u64,
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

/// Cuts the reasons of every marker in `items`.
fn cap_reasons(items: &mut [Append]) {
    for item in items {
        if let RecordBody::ResyncRequired(reason) = &mut item.body {
            cap_reason(reason);
        }
    }
}

#[cfg(test)]
mod tests;
