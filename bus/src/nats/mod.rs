//! The NATS JetStream bus: hub replicas share one JetStream stream, so any replica can
//! take over an agent or a subscriber and the loss of one hub loses nothing that was acked.
//!
//! One module per job: `setup` (connecting, the stream and buckets, opening the bus),
//! `records` (a record as a message: subject, headers, payload), `append` (publishing a
//! batch and its acks), `heads` (each cluster's latest record), `tail` (the local tail
//! that reads are served from), `chain` (the tail's check that a record follows its
//! cluster's latest one), `cursors` (durable subscriptions), `share` (the fleet's
//! per-cluster entries and the replicas' heartbeats), `recreate` (a stream JetStream
//! lost), `probe` (health), `state` (what is kept besides records, as plain data), [`jetstream`] (the JetStream operations
//! as a trait, async-nats or the simulation's) on `io_thread`, and [`server`] (a local
//! `nats-server` for tests and benches).
//!
//! # Layout in JetStream
//! - One stream (`--bus-stream`, default `fleetwatch`) on subjects `<stream>.<cluster>`
//!   (a cluster name that is not a plain subject token is written `=<hex>`). A record is
//!   one message: the event JSON (or the resync reason) as payload, `Fw-Epoch`, `Fw-Seq`,
//!   `Fw-Kind` and `Fw-Format` headers (see *Formats* below). **Offset = stream
//!   sequence** (plus the base of a recreated stream, below), so every replica hands out
//!   the same offsets and a subscriber's cursor means the same thing on each of them.
//! - Retention is the stream's limits (`max_msgs`, `max_bytes`, `max_age`, discard old),
//!   set from the hub's retention flags.
//! - Key-value bucket `<stream>_heads`: per cluster the (epoch, seq, offset) of its latest
//!   acked record, so an agent resumes on any replica without a full resync even after its
//!   records were evicted. Written by the replica that appended, coalesced: once a second
//!   ([`Bus::flush`]), not per batch — a put per batch doubled JetStream's work on
//!   the hot path. While the cluster's records are retained the stream itself is the
//!   authority (below); the bucket only matters once they were evicted.
//! - Key-value bucket `<stream>_cursors`: per subscriber identity its durable names and
//!   cursors (offsets), each name with the id of its registration; and the entry
//!   `meta.bus` (below).
//! - Key-value bucket `<stream>_fleet`: per cluster its entry as the replica its agent is
//!   (or was last) connected to shows it, written on change only by that replica and
//!   followed by every replica (`share`), so `/api/v1/clusters` on any replica shows the
//!   whole fleet and where each agent is connected. History 1, values at most
//!   [`FLEET_ENTRY_BYTES`], the bucket at most [`FLEET_BUCKET_BYTES`], entries expiring
//!   [`FLEET_MAX_AGE`] after their last write.
//! - Key-value bucket `<stream>_replicas`: per hub replica a small heartbeat, rewritten every
//!   few seconds and expiring after [`REPLICA_TTL`]: the clusters of a replica without one
//!   show as not connected.
//!
//! # Formats
//! What the bus keeps names its format (`state::NATS_FORMAT`): the cursors bucket's `meta.bus`
//! (`format`) for the whole bus, checked at start; each record (`Fw-Format` header, one
//! header lookup per record, no payload parsing), each head in the bucket (`format`) and
//! each cursor entry (`format`, written from format 2 on only: the releases before refuse
//! unknown fields in it). What has no mark is format 1, as everything stored before the
//! marks. A newer mark is refused, never read as damage: at start (meta entry, heads) the
//! hub does not start; at run time (a record in the tail, a cluster's last record or head
//! read for a hello, a cursor entry) the replica refuses to go on, like a stream of another
//! bus below ([`Bus::fatal`]), the tail stops before the record and nothing is written over:
//! cursor entries are compare-and-set already, and heads are written with compare-and-set
//! on the revision this replica wrote last (a head written meanwhile is read first).

mod append;
mod chain;
mod cursors;
mod head_reads;
mod heads;
mod io_thread;
pub mod jetstream;
mod probe;
mod records;
mod recreate;
pub mod server;
mod setup;
mod share;
mod state;
mod tail;
#[cfg(test)]
mod tests;

pub use recreate::RECREATED;

use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::AbortHandle;

use crate::cursors::{DurableError, Lookup, MAX_NAMES_PER_IDENTITY};
use crate::log::Core;
use crate::retention::Retention;
use crate::{Append, Bus, BusError, BusFuture, BusStats, Flush, Gap, Read, ReplicaShare};

use append::Pending;
use chain::Chain;
use cursors::check_name;
use heads::Head;
use jetstream::{AsyncNats, JetStream};
use records::token;
use state::Move;
use tail::StreamState;

/// Default stream name.
pub const DEFAULT_STREAM: &str = "fleetwatch";

/// JetStream's duplicate window (capped by the age retention, which it may not exceed).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long an append waits for its records to reach the local tail.
const LOCAL_WAIT: Duration = Duration::from_secs(30);
/// Timeout of one JetStream request (publish ack, stream info, key-value operation).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replica's heartbeat in `<stream>_replicas` outlives its last write: a replica
/// silent for longer is taken for dead, and the clusters it showed for not connected.
pub const REPLICA_TTL: Duration = Duration::from_secs(15);
/// How long a cluster's entry in `<stream>_fleet` outlives its last write. The replica an
/// agent is connected to rewrites its entry at least daily, so only the entries of clusters
/// that have not connected for this long expire.
pub const FLEET_MAX_AGE: Duration = Duration::from_secs(7 * 24 * 3600);
/// The largest entry of `<stream>_fleet`, in bytes (the bucket's `max_value_size`): a hub
/// trims an entry to it before writing.
pub const FLEET_ENTRY_BYTES: usize = 16 << 10;
/// The most bytes `<stream>_fleet` holds (its `max_bytes`): a write past it is refused (and
/// logged by the hub) rather than an older entry dropped. 512 MiB: entries are about a
/// kilobyte (50,000 clusters take some 50 MB), so it is reached only when most entries are
/// near [`FLEET_ENTRY_BYTES`] (about 32,000 of them).
pub const FLEET_BUCKET_BYTES: i64 = 512 << 20;
/// Compare-and-set attempts on a cursor entry before giving up.
const CAS_ATTEMPTS: usize = 16;

/// Why the NATS bus failed; every variant names what it was doing.
#[derive(Debug, Clone, thiserror::Error)]
pub enum NatsError {
    /// A `--bus` address or setting is malformed.
    #[error("invalid --bus setting: {0}")]
    Settings(String),
    /// The credentials file could not be read.
    #[error("cannot read NATS credentials {path}: {cause}", path = path.display())]
    Credentials {
        /// The file.
        path: PathBuf,
        /// Why.
        cause: String,
    },
    /// No server could be reached or it refused us.
    #[error("cannot connect to NATS at {servers}: {cause}")]
    Connect {
        /// The servers tried.
        servers: String,
        /// Why (unreachable, authorization violation, TLS).
        cause: String,
        /// Whether it lasts until a setting changes (credentials or TLS refused, an
        /// address that does not parse), not passing by itself (unreachable, timed out).
        lasting: bool,
    },
    /// The stream could not be created, found or used.
    #[error("JetStream stream {stream}: {cause}")]
    Stream {
        /// The stream.
        stream: String,
        /// Why.
        cause: String,
    },
    /// The stream exists with settings this hub would not have given it.
    #[error(
        "JetStream stream {stream} exists with conflicting settings: {what} (start every hub replica with the same --bus-replicas and retention flags, or delete the stream)"
    )]
    Conflict {
        /// The stream.
        stream: String,
        /// What differs.
        what: String,
    },
    /// The bus is kept in a format newer than this hub's (a rolled-back hub).
    #[error("JetStream key-value bucket {bucket}: {cause}")]
    NewerFormat {
        /// The bucket whose meta entry says so.
        bucket: String,
        /// The formats and what to do.
        cause: String,
    },
    /// A key-value operation failed.
    #[error("JetStream key-value bucket {bucket}: {cause}")]
    KeyValue {
        /// The bucket.
        bucket: String,
        /// Why.
        cause: String,
    },
    /// A publish was not acked: the batch is not stored (or not completely).
    #[error("JetStream did not store the batch for cluster {cluster}: {cause}")]
    Publish {
        /// The cluster.
        cluster: String,
        /// Why.
        cause: String,
    },
    /// The local tail did not receive an acked record in time.
    #[error("the local tail of stream {stream} has not received offset {offset} within {LOCAL_WAIT:?}")]
    Lagging {
        /// The stream.
        stream: String,
        /// The offset waited for.
        offset: u64,
    },
}

impl NatsError {
    /// Whether the failure lasts until a setting changes (see [`crate::BusError::lasts`]).
    pub fn lasts(&self) -> bool {
        match self {
            NatsError::Settings(_) | NatsError::Credentials { .. } | NatsError::Conflict { .. } => true,
            NatsError::NewerFormat { .. } => true,
            NatsError::Connect { lasting, .. } => *lasting,
            _ => false,
        }
    }

    /// Whether JetStream did not answer in time (overloaded, or electing a leader): a read
    /// may be asked again. async-nats says so only in its message ("timed out").
    ///
    /// ```
    /// use fleetwatch_bus::nats::NatsError;
    /// let slow = NatsError::Stream { stream: "events".into(), cause: "timed out: request timed out".into() };
    /// assert!(slow.is_timeout());
    /// let refused = NatsError::Stream { stream: "events".into(), cause: "stream not found".into() };
    /// assert!(!refused.is_timeout());
    /// ```
    pub fn is_timeout(&self) -> bool {
        match self {
            NatsError::Stream { cause, .. } | NatsError::KeyValue { cause, .. } | NatsError::Publish { cause, .. } => {
                cause.contains("timed out")
            }
            _ => false,
        }
    }
}

/// Where and how to reach JetStream.
#[derive(Debug, Clone)]
pub struct NatsOptions {
    /// Server URLs (`nats://host:port`, `tls://host:port`); the client fails over between them.
    pub servers: Vec<String>,
    /// Client certificate and key (PEM) for mutual TLS.
    pub tls_cert: Option<PathBuf>,
    /// The client certificate's key.
    pub tls_key: Option<PathBuf>,
    /// CA bundle (PEM) that signed the servers' certificates.
    pub tls_ca: Option<PathBuf>,
    /// A NATS `.creds` file (user JWT and nkey seed).
    pub creds: Option<PathBuf>,
    /// The stream name (also the subject prefix); letters, digits, `-` and `_`.
    pub stream: String,
    /// Stream (and bucket) replicas in a JetStream cluster.
    pub replicas: usize,
    /// What the stream and the local tail retain.
    pub retention: Retention,
    /// How long a hub that finds no stream at start waits for one to appear before it
    /// creates a new bus: right after NATS restarted with an empty store, a running replica
    /// recreates the stream as the continuation of its bus within seconds (see
    /// [`DEFAULT_MISSING_STREAM_WAIT`]); a new bus created meanwhile would make it unusable.
    pub missing_stream_wait: Duration,
}

/// [`NatsOptions::missing_stream_wait`] by default: longer than a running replica takes to
/// reconnect (at most [`RECONNECT_DELAY_MAX`]) and to see the stream gone on two probes a
/// second apart.
pub const DEFAULT_MISSING_STREAM_WAIT: Duration = Duration::from_secs(5);

/// The longest pause between reconnection attempts to NATS (the client's default is 4 s).
const RECONNECT_DELAY_MAX: Duration = Duration::from_secs(1);

impl NatsOptions {
    /// Options for `servers` with the defaults (stream [`DEFAULT_STREAM`], one replica).
    pub fn new(servers: Vec<String>, retention: Retention) -> Self {
        Self {
            servers,
            tls_cert: None,
            tls_key: None,
            tls_ca: None,
            creds: None,
            stream: DEFAULT_STREAM.into(),
            replicas: 1,
            retention,
            missing_stream_wait: DEFAULT_MISSING_STREAM_WAIT,
        }
    }
}

/// The NATS JetStream bus (see the module docs), on async-nats ([`AsyncNats`]) or, in the
/// simulation, on an in-memory JetStream.
pub struct NatsBus<J: JetStream = AsyncNats> {
    stream: String,
    stream_id: String,
    durable: bool,
    core: Core,
    retention: Retention,
    heads: Mutex<HashMap<Arc<str>, Head>>,
    heads_kv: J::Kv,
    heads_bucket: String,
    cursors_kv: J::Kv,
    cursors_bucket: String,
    replicas_kv: J::Kv,
    replicas_bucket: String,
    /// One entry per cluster (see the module docs), read and written by the hub through
    /// [`ReplicaShare`].
    fleet_kv: J::Kv,
    fleet_bucket: String,
    /// Bumped whenever the buckets were created again (a recreated stream taken on).
    buckets_generation: AtomicU64,
    /// Cursor moves not yet written: identity → name → cursor and registration.
    dirty: Mutex<HashMap<String, BTreeMap<String, Move>>>,
    /// The registration this replica last wrote per (identity, name): its cursor moves
    /// belong to it (see `state::Cursors::current`).
    regs: Mutex<HashMap<(String, String), u64>>,
    /// What the stream and buckets are created with (again, after JetStream lost them).
    opts: NatsOptions,
    /// Offset = stream sequence + base: 0 for a stream created fresh, above every earlier
    /// offset for one recreated after JetStream lost its store (see `state`).
    base: AtomicU64,
    /// When the stream this replica uses was created (Unix nanoseconds): a different one
    /// means it was recreated.
    created: Mutex<i128>,
    /// The creation time of the recreated stream this replica began taking on last: a
    /// retry after a failure part way (its tail's consumer not created, say) goes on
    /// taking it on rather than taking its own marker for offsets handed out below it.
    taking_on: Mutex<Option<i128>>,
    /// Set while this replica takes a recreated stream on: appends are refused meanwhile,
    /// so none is acked with an offset of the old stream's numbering.
    adopting: AtomicBool,
    /// Set for good when the stream was recreated by a hub that did not know this bus (its
    /// offsets may repeat ones this replica handed out): every operation fails with it.
    poisoned: Mutex<Option<String>>,
    /// Wakes the probe at once (an ack showed the stream went backwards).
    recheck: Arc<tokio::sync::Notify>,
    /// Probes of the stream begun (see `probe`), numbered from 1.
    probes_begun: AtomicU64,
    /// The latest probe that read the stream: (its number, the stream's last offset it
    /// found). A probe numbered after a moment found the stream's end as of after it: the
    /// hello's head is read from the local tail once it has reached that end (see
    /// [`head_reads`]).
    probed: watch::Sender<(u64, u64)>,
    /// Which local tail ingests: a tail restarted on a recreated stream bumps it, so a batch
    /// of the old consumer still in flight is dropped.
    tail_generation: AtomicU64,
    /// The task feeding the local tail.
    tail_task: Mutex<Option<AbortHandle>>,
    /// Heads this replica appended and has not written to the bucket yet.
    dirty_heads: Mutex<HashMap<Arc<str>, Head>>,
    /// When moved heads are written (see [`heads::HeadPacing`]).
    head_pacing: Mutex<heads::HeadPacing>,
    /// Clusters whose records this replica published without learning whether they were
    /// stored (see [`heads::Uncertain`]).
    uncertain: Mutex<heads::Uncertain>,
    /// Clusters just found without any record (see [`heads::Absent`]).
    absent: Mutex<heads::Absent>,
    /// Heads asked for, read together (see [`head_reads`]).
    head_reads: head_reads::HeadReads,
    /// The bucket revision of each head this replica wrote last: the next write of the
    /// cluster's head is a compare-and-set on it, so a value written meanwhile (another
    /// replica's, maybe of a newer format) is read before it is written over.
    head_revisions: Mutex<HashMap<Arc<str>, u64>>,
    /// Clusters with appends of this replica in flight: the record published last (the
    /// predecessor the next publish names) and how many appends wait for their acks.
    pending: Mutex<HashMap<Arc<str>, Pending>>,
    /// Generations of [`Pending`] entries, so an append of an entry that was dropped after a
    /// failure does not count down a newer one.
    generation: AtomicU64,
    /// What the local tail knows of each cluster's chain of records, to check `Fw-Prev`.
    chain: Mutex<Chain>,
    /// Held while the local tail starts, so only the first reader starts it.
    tail_starting: tokio::sync::Mutex<()>,
    /// The tail was started (its consumer runs): appends wait for their records in it
    /// (read your writes). Changed only under `tail_starting`.
    tail_started: AtomicBool,
    /// The tail holds the retained records: offsets and counts come from it.
    tail_ready: AtomicBool,
    /// The cursor bucket's meta says names may be lost because a hub began this bus after
    /// waiting for a missing stream (read with it in `names_lost`; only the reason told
    /// differs).
    lost_names_begun: AtomicBool,
    /// The base of the recreated stream whose `resync-required` `*` this replica knows
    /// stored (it published it and had the ack); 0: none.
    marker_base: AtomicU64,
    /// The stream's state as last seen, for a replica without a local tail.
    stream_state: Mutex<StreamState>,
    /// Itself, for the tasks it starts later.
    me: Weak<NatsBus<J>>,
    /// Appends waiting for their last record in the local tail, by that record's offset.
    /// Keyed so that a tail advance wakes only the appends it completes: a watch channel
    /// woke every waiting append (a thousand sessions) at every advance.
    local_waiters: Mutex<BTreeMap<u64, Vec<tokio::sync::oneshot::Sender<()>>>>,
    unhealthy: Mutex<Option<String>>,
    /// The stream's last sequence as last seen (stream info, publish acks): the local tail
    /// is behind while its end is not above it.
    stream_last: AtomicU64,
    write_failures: AtomicU64,
    tasks: Mutex<Vec<AbortHandle>>,
    /// JetStream; dropped last (fields drop in order): with async-nats, it runs the
    /// connection.
    js: J,
}

impl<J: JetStream> Drop for NatsBus<J> {
    fn drop(&mut self) {
        for t in self.tasks.get_mut().map(std::mem::take).unwrap_or_default() {
            t.abort();
        }
        if let Some(t) = self.tail_task.get_mut().ok().and_then(Option::take) {
            t.abort();
        }
    }
}

impl<J: JetStream> NatsBus<J> {
    /// Writes the cluster heads that are due (all with `all`) and the cursor moves.
    async fn write_pending(&self, all: bool) -> Result<(), BusError> {
        self.flush_heads(all).await?;
        let pending = std::mem::take(&mut *lock(&self.dirty));
        for (identity, moved) in pending {
            let written = self
                .update_cursors(&identity, |c| {
                    for (name, m) in &moved {
                        if !c.apply(name, *m) {
                            tracing::debug!(
                                identity,
                                name,
                                cursor = m.cursor,
                                "a cursor move of an earlier registration of the name is dropped"
                            );
                        }
                    }
                    Ok(())
                })
                .await;
            if let Err(e) = written {
                // Keep them for the next flush (merged with newer moves of the same
                // registration; a newer registration's move replaces them).
                let mut dirty = lock(&self.dirty);
                let names = dirty.entry(identity).or_default();
                for (name, m) in moved {
                    let kept = names.entry(name).or_insert(m);
                    if kept.reg == m.reg {
                        kept.cursor = kept.cursor.max(m.cursor);
                    }
                }
                return Err(e);
            }
        }
        Ok(())
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere mid-update of a plain map.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl<J: JetStream> NatsBus<J> {
    /// Offset = stream sequence + this (above 0 once a recreated stream was taken on).
    pub(super) fn offset_base(&self) -> u64 {
        self.base.load(Ordering::SeqCst)
    }

    /// Whether `offset` is of the stream before it was recreated (at or below the offset
    /// base): gone with it, not aged out.
    fn recreated_over(&self, offset: u64) -> bool {
        let base = self.offset_base();
        base > 0 && offset <= base
    }

    /// Whether the local tail holds the retained records (see [`BusStats::holds_records`]).
    pub(super) fn holds_records(&self) -> bool {
        self.tail_ready.load(Ordering::Acquire)
    }

    /// `Err` for good once the stream was recreated by a hub that did not know this bus.
    pub(super) fn usable(&self) -> Result<(), BusError> {
        match &*lock(&self.poisoned) {
            None => Ok(()),
            Some(cause) => Err(BusError::Nats(self.stream_error(cause.clone()))),
        }
    }

    pub(super) fn stream_error(&self, cause: String) -> NatsError {
        NatsError::Stream { stream: self.stream.clone(), cause }
    }

    pub(super) fn subject(&self, cluster: &str) -> String {
        format!("{}.{}", self.stream, token(cluster))
    }

    /// Something of the bus is kept in a newer format than this build's: the replica
    /// refuses to go on, as for a stream of another bus (its hub exits through
    /// [`Bus::fatal`], naming both formats), and writes nothing more.
    pub(super) fn refuse_newer(&self, why: String) -> BusError {
        tracing::error!(stream = %self.stream, "{why}");
        lock(&self.poisoned).get_or_insert(why.clone());
        BusError::Nats(self.stream_error(why))
    }

    pub(super) fn fail(&self, e: NatsError) -> BusError {
        *lock(&self.unhealthy) = Some(e.to_string());
        BusError::Nats(e)
    }
}

impl<J: JetStream> Bus for NatsBus<J> {
    fn stream_id(&self) -> &str {
        &self.stream_id
    }

    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64> {
        Box::pin(async move { self.start_inner(cluster, items).await?.await })
    }

    fn start_append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, BusFuture<'_, u64>> {
        Box::pin(self.start_inner(cluster, items))
    }

    fn head<'a>(&'a self, cluster: &'a str) -> BusFuture<'a, Option<(u64, u64)>> {
        Box::pin(async move { Ok(self.shared_head(cluster).await?.map(|h| (h.epoch, h.seq))) })
    }

    fn prepare_reads(&self) -> BusFuture<'_, ()> {
        Box::pin(async move {
            self.usable()?;
            self.start_tail().await.map_err(|e| self.fail(e))?;
            self.catch_up().await.map_err(|e| self.fail(e))
        })
    }

    fn read(&self, from: u64, max: usize) -> BusFuture<'_, Read> {
        Box::pin(async move {
            self.usable()?;
            self.start_tail().await.map_err(|e| self.fail(e))?;
            Ok(self.core.read(from, max))
        })
    }

    fn last_offset(&self) -> u64 {
        if self.holds_records() { self.core.last_offset() } else { self.stream_last.load(Ordering::Relaxed) }
    }

    fn watch_end(&self) -> watch::Receiver<u64> {
        self.core.end_tx.subscribe()
    }

    fn durable_lookup<'a>(&'a self, identity: &'a str, name: &'a str) -> BusFuture<'a, Lookup> {
        Box::pin(async move {
            check_name(name)?;
            self.usable()?;
            let (entry, _) = self.cursor_entry(identity).await?;
            let pending = lock(&self.dirty).get(identity).and_then(|m| m.get(name)).copied();
            Ok(match entry.cursor(name, pending) {
                Some(c) => Lookup::Known(c),
                // A cursor store recreated under a bus with history may have lost it.
                None if self.names_lost().await? => Lookup::Lost,
                None => Lookup::New,
            })
        })
    }

    fn register_durable<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        Box::pin(async move {
            check_name(name)?;
            self.usable()?;
            // This registration's own id: moves made under an earlier one (on any replica,
            // maybe not written yet) no longer apply to the name.
            let reg = rand::random::<u64>();
            self.update_cursors(identity, |c| {
                if !c.names.contains_key(name) && c.names.len() >= MAX_NAMES_PER_IDENTITY {
                    return Err(DurableError::TooMany { identity: identity.into() });
                }
                c.register(name, cursor, reg);
                Ok(())
            })
            .await?;
            lock(&self.regs).insert((identity.into(), name.into()), reg);
            if let Some(m) = lock(&self.dirty).get_mut(identity) {
                m.remove(name);
            }
            Ok(())
        })
    }

    fn set_durable_cursor<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        Box::pin(async move {
            check_name(name)?;
            let reg = lock(&self.regs).get(&(identity.to_string(), name.to_string())).copied();
            let mut dirty = lock(&self.dirty);
            let names = dirty.entry(identity.into()).or_default();
            if !names.contains_key(name) && names.len() >= MAX_NAMES_PER_IDENTITY {
                return Err(DurableError::TooMany { identity: identity.into() }.into());
            }
            let m = names.entry(name.into()).or_insert(Move { cursor, reg });
            if m.reg == reg {
                m.cursor = m.cursor.max(cursor);
            } else {
                *m = Move { cursor, reg };
            }
            Ok(())
        })
    }

    fn flush(&self, what: Flush) -> BusFuture<'_, ()> {
        Box::pin(self.write_pending(what == Flush::All))
    }

    fn replica_share(&self) -> Option<&dyn ReplicaShare> {
        Some(self)
    }

    fn resync_reason(&self, gap: Gap<'_>) -> Cow<'static, str> {
        match gap {
            Gap::LostHistory => Cow::Borrowed(
                "the hub's event history was lost: the JetStream stream was recreated empty (this subscriber's cursor is \
                 of an earlier stream)",
            ),
            Gap::Evicted { offset } if self.recreated_over(offset) => Cow::Borrowed(
                "events were lost when the JetStream stream was recreated empty, before this subscriber read them",
            ),
            Gap::LostCursor { name } if self.lost_names_begun.load(Ordering::Relaxed) => Cow::Owned(format!(
                "durable subscription {name:?} is not known to this bus, which a hub began after JetStream had no stream for it (a first start, or JetStream lost its store while no hub replica ran): it may have been read before"
            )),
            other => other.default_reason(),
        }
    }

    fn fatal(&self) -> Option<String> {
        lock(&self.poisoned).clone()
    }

    fn health(&self) -> Result<(), String> {
        if let Some(cause) = &*lock(&self.poisoned) {
            return Err(cause.clone());
        }
        match &*lock(&self.unhealthy) {
            None => Ok(()),
            Some(cause) => Err(cause.clone()),
        }
    }

    /// From the local tail once it holds the records; until then from the stream's state
    /// as last seen (the last offset from its own counter, kept apart for
    /// [`Bus::last_offset`]).
    fn stats(&self) -> BusStats {
        let write_failures = self.write_failures.load(Ordering::Relaxed);
        if self.holds_records() {
            return self.core.stats(self.durable, write_failures);
        }
        let last_offset = self.stream_last.load(Ordering::Relaxed);
        let state = lock(&self.stream_state);
        BusStats {
            durable: self.durable,
            first_offset: state.first,
            last_offset,
            retained: usize::try_from(state.messages).unwrap_or(usize::MAX),
            retained_bytes: state.bytes,
            holds_records: false,
            write_failures,
        }
    }
}
