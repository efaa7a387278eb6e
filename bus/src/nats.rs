//! The NATS JetStream bus: hub replicas share one JetStream stream, so any replica can
//! take over an agent or a subscriber and the loss of one hub loses nothing that was acked.
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
//!   ([`Bus::flush_cursors`]), not per batch — a put per batch doubled JetStream's work on
//!   the hot path. While the cluster's records are retained the stream itself is the
//!   authority (below); the bucket only matters once they were evicted.
//! - Key-value bucket `<stream>_cursors`: per subscriber identity its durable names and
//!   cursors (offsets), each name with the id of its registration; and the entry
//!   `meta.bus` (below).
//! - Key-value bucket `<stream>_replicas`: per hub replica the clusters it serves, rewritten
//!   every few seconds and expiring after [`REPLICA_TTL`], so `/api/v1/clusters` on any
//!   replica shows the whole fleet and where each agent is connected.
//!
//! # Appends
//! The records left after duplicate filtering (seq not above the cluster's head in the same
//! epoch, as every backend does) are published back to back and their acks awaited
//! together: one round trip per batch, not per record. Each publish carries
//! `Nats-Msg-Id = <cluster>/<epoch>/<seq>`, so a resend after a hub died between the
//! publish and the agent's ack (or two replicas racing) is dropped by JetStream's duplicate
//! window. The append answers only after every ack and, once this replica has readers, the
//! record's arrival in the local tail (below), so a reader here sees what was just acked.
//!
//! A session keeps several appends in flight ([`Bus::start_append`]: publishing is done
//! when the outer future resolves, in call order; the acks come with the inner one) and
//! acks its agent only up to the last batch whose predecessors were all stored. That is safe
//! only if a record stored after one that was lost cannot pass for a complete history: the
//! agent resends the lost records after reconnecting, and the head (from the later, stored
//! batch) calls them duplicates. So every record names its predecessor: `Fw-Prev =
//! <epoch>/<seq>` of the record this replica published just before it for the cluster (its
//! appends in flight chain up; with none in flight, the head it knows, then with
//! `@<offset>`), or `-` when it knew of none. Each replica's tail checks, in stream order, that a record's `Fw-Prev` is the
//! cluster's latest record it took in, and delivers one that is not as `resync-required`
//! (its change, and the lost ones before it, are then reconciled from the cluster). The
//! check needs only the stream, so every replica decides alike, the appending replica may
//! die right after, and a replica started later decides from the records it loads; where it
//! cannot see the predecessor (evicted before it started) it accepts one named with an
//! offset below what it loaded (stored, as its ack said) and otherwise delivers the marker
//! too: a resync more than needed, never one less. A record older than the cluster's
//! latest of the same agent process (a publish a client kept while its link was down and
//! sent late, after the agent resent it elsewhere) is delivered as `resync-required` as
//! well, and the latest stays the latest. So is one sent before a record of another agent
//! process of the cluster was stored, stored after it: every record names the stream's end
//! its publisher knew (`Fw-Known`: its acks and probes, its tail, the head it chained
//! onto), and a record of another epoch of the cluster beyond that end and before the
//! record may be newer than it (a second agent process appending through a replica whose
//! link was cut: its kept publishes followed the first late one, seed 172). A healthy
//! process is checked alike, but its replica knows the stream's end past the other
//! process's records once its first acks are in; the records after the hole of a partly
//! stored batch of one process stay events. Where part of what lies between is unseen
//! (evicted before the tail started) the record is delivered as the marker. JetStream's
//! own per-subject expectation (`Nats-Expected-Last-Subject-Sequence`) would refuse such a
//! record instead, but needs the previous record's stream sequence, known only from its ack:
//! it cannot chain publishes in flight. Two replicas appending for one cluster at once (a
//! session moving while the old one still publishes) also break the chain and cost a resync.
//!
//! # Heads
//! An agent that says hello gets its cluster's head from the stream's last message on the
//! cluster's subject (one request to the stream leader; the bucket is read only when the
//! stream holds nothing of the cluster), or the local tail's if later: right after another
//! replica acked a batch and died, this replica's tail may not have the batch yet and the
//! bucket may be a second old, but the stream has it. Appends filter resends by the head
//! this replica knows (its own appends in flight, its acks and its tail); a resend it does
//! not recognise is dropped by JetStream's duplicate window.
//!
//! # Reads: a local tail, started by the first reader
//! A replica with readers keeps the retained records in memory, fed by one ordered push
//! consumer over the whole stream, and applies the same retention to it ([`super::log::Log`], shared with
//! the embedded backends). So `first_offset`, `last_offset`, `watch_end` and `retained`
//! stay synchronous, reads and subscriber fan-out are local (no consumer per subscriber on
//! the server), and every replica reports the same evicted clusters: eviction is decided by
//! the same rule over the same sequence of records. Reading older offsets back from
//! JetStream would not help: the local tail holds everything the retention keeps, and what
//! it evicted the stream evicts too (same limits). History that was evicted before a
//! replica started is attributed to the clusters whose head offset (in the key-value
//! bucket) lies at or above the reader's cursor: a superset of the clusters concerned, so a
//! subscriber may resync a cluster more than needed, never less. A gap in the sequence
//! delivered while running (the replica fell behind the stream's eviction) evicts the local
//! tail and reports `*`.
//!
//! The tail starts with the replica's first reader ([`Bus::prepare_reads`], a read), not at
//! start: a replica that serves only agents never has the stream delivered to it (with one
//! subscriber on one of 3 replicas, the hubs' CPU fell by a sixth and p99 by a third), and
//! its appends answer on JetStream's ack alone. Once started, the tail stays. A subscriber
//! session waits until the tail holds the stream's end as JetStream reports it (and the
//! stream is the one this replica took on), so a cursor another replica handed out is
//! never beyond this replica's log. Until then
//! the offsets and counts it answers are the stream's as last seen (its acks, the probe).
//!
//! # Durable subscriptions: cursors in a key-value bucket
//! The issue suggested one JetStream durable consumer per durable name. That does not fit
//! the [`Bus`] contract: a registration may store a *lower* cursor, which a consumer's ack
//! floor cannot express without deleting and recreating it; moving a cursor would need every
//! record delivered through that consumer a second time (the fan-out is already local); and
//! a subscriber acks many times a second, which would be one consumer update per ack. So a
//! cursor is a stream sequence stored in the `<stream>_cursors` bucket, one entry per
//! identity (its names and cursors, bounded like the embedded store), updated with
//! compare-and-set. Registrations are written at once; cursor moves are kept in memory and
//! written every second by the hub's housekeeping ([`Bus::flush_cursors`]), as the segment
//! log does. A registration stores a random id with the name, and a move is written only
//! if the name still has the registration it was made under ([`Cursors::current`]): a
//! subscriber that moved to another replica and registered there (maybe lower, as the
//! contract allows) is not overtaken by what the old replica had not written yet.
//!
//! The bucket's entry `meta.bus` ([`Meta`]) is created with the bucket: `names_lost` when
//! the bus already had history then (the bucket was recreated), or when the stream was
//! created after a wait for a missing one (JetStream may have lost its store while no
//! replica that knew the bus ran; a new bus has no record of it). The creator says so in
//! the stream's description, so a replica that found the stream at once writes the same. A name not found while it
//! says so, or while it is missing (the bucket was lost after this replica opened it), is
//! [`Lookup::Lost`]: the subscriber gets `resync-required` `*` instead of being taken for a
//! new one and placed after the loss.
//!
//! # Formats
//! What the bus keeps names its format ([`NATS_FORMAT`]): the cursors bucket's `meta.bus`
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
//!
//! # JetStream restarted empty
//! The probe finds the stream missing (for a second: not a server still starting) and
//! recreates it as the continuation of this bus ([`NatsBus::recreate`]): the same bus id,
//! offsets = stream sequence + a base above every offset this replica knew
//! ([`nats_state::next_base`]), both in the stream's description, which is created with the
//! stream in one step, so whichever replica creates it decides for all ([`nats_state`]).
//! Every replica takes the new stream on ([`NatsBus::adopt`]; the others notice its new
//! creation time): buckets created again, the cursor store's meta entry (names lost),
//! `resync-required` `*` ("the JetStream stream was recreated empty") published with one
//! message id so JetStream keeps it once, the local tail restarted above the old offsets
//! (readers go on from their cursors into the marker), appends refused until then. An ack
//! numbered below what this replica knew fails its append (the stream was recreated
//! before this replica noticed). NATS 2.9 streams cannot start at a chosen sequence
//! (`first_seq` is 2.10), hence the base here. A stream recreated by a hub that did not
//! know the bus (a new bus id, offsets from 1) would repeat offsets: the replica refuses to
//! go on (health, appends, reads fail, "restart this hub replica") and [`Bus::fatal`] makes
//! the hub exit so its supervisor starts it again; a hub that finds no
//! stream at start waits [`NatsOptions::missing_stream_wait`] for a running replica to
//! recreate it first.
//!
//! # Health
//! [`Bus::health`] is `Err(cause)` while the NATS connection is down, the stream does not
//! answer (checked every second), or the last publish failed: the hub's `/readyz` turns 503
//! and agents are not acked (they keep their outboxes and resend).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use async_nats::ServerAddr;
use async_nats::jetstream;
use futures_util::{FutureExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio::task::AbortHandle;

use super::cursors::{DurableError, Lookup, MAX_NAME_BYTES, MAX_NAMES_PER_IDENTITY};
use super::jetstream::{
    AsyncNats, CreateError, Delivered, HeaderMap, IoThread, JetStream, JsError, KeyValue, StreamInfo, StreamSpec,
    StreamState as JsState,
};
use super::log::{Core, Log};
use super::nats_state::{self, Cursors, Lineage, META_KEY, Meta, Move, NATS_FORMAT, newer_format, readable_mark};
use super::retention::{self, Retention};
use super::{ALL_CLUSTERS, Append, Bus, BusError, BusFuture, Read, Record, RecordBody, cap_reasons};

/// Default stream name.
pub const DEFAULT_STREAM: &str = "fleetwatch";

/// JetStream's duplicate window (capped by the age retention, which it may not exceed).
const DUPLICATE_WINDOW: Duration = Duration::from_secs(120);
/// How long an append waits for its records to reach the local tail.
const LOCAL_WAIT: Duration = Duration::from_secs(30);
/// Timeout of one JetStream request (publish ack, stream info, key-value operation).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a replica's shared cluster list outlives its last write.
pub const REPLICA_TTL: Duration = Duration::from_secs(15);
/// Compare-and-set attempts on a cursor entry before giving up.
const CAS_ATTEMPTS: usize = 16;

const H_EPOCH: &str = "Fw-Epoch";
const H_SEQ: &str = "Fw-Seq";
const H_KIND: &str = "Fw-Kind";
/// The record's format ([`NATS_FORMAT`]); a record without it is format 1 (every record
/// before the header existed). Checked by one header lookup, no parsing of the payload.
const H_FORMAT: &str = "Fw-Format";
/// The (epoch, seq) of the record its publisher put on the cluster's subject just before
/// this one (`<epoch>/<seq>`, `@<offset>` added when its ack was in), or `-` when it knew
/// of none: lets every replica's tail see from the stream alone that a record follows one
/// that was never stored.
const H_PREV: &str = "Fw-Prev";
/// The stream's end as its publisher knew it when it sent this record (an offset: every
/// record at or below it was stored before this one was sent): lets every replica's tail
/// see from the stream alone that records of another agent process of the cluster were
/// stored between the two, so this one may be older than they are (a publish kept while
/// its replica's link to JetStream was cut and sent late).
const H_KNOWN: &str = "Fw-Known";
/// [`NATS_FORMAT`] as the header value.
const FORMAT_MARK: &str = "1";
const KIND_EVENT: &str = "event";
const KIND_RESYNC: &str = "resync-required";

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

/// Appends of one cluster in flight on this replica (see [`NatsBus::start_inner`]).
#[derive(Debug, Clone, Copy)]
struct Pending {
    /// (epoch, seq) of the record published last.
    tip: (u64, u64),
    /// Appends whose acks are outstanding.
    in_flight: usize,
    generation: u64,
    /// An append failed since `tip` was published: `tip` may be lost. The entry stays
    /// (also with nothing in flight), so the next records go on naming it.
    broken: bool,
}

/// The stream's first offset and size as last seen (start, probe), answered by a replica
/// without a local tail.
#[derive(Debug, Clone, Copy)]
struct StreamState {
    first: u64,
    messages: u64,
    bytes: u64,
}

impl StreamState {
    /// The state in offsets (stream sequence + `base`).
    fn of(s: &JsState, base: u64) -> Self {
        let first = if s.messages == 0 { s.last_sequence + 1 } else { s.first_sequence.max(1) };
        Self { first: first + base, messages: s.messages, bytes: s.bytes }
    }
}

/// The local tail's starting point: the stream's retained range, and what was evicted
/// before it (from the heads in the bucket). The tail checks each record's predecessor;
/// what it cannot see (records evicted before it started) it knows only from heads written
/// before them.
fn initial_log(state: &JsState, base: u64, heads: &HashMap<Arc<str>, Head>) -> (Log, Chain) {
    let mut log = Log::new();
    log.base = StreamState::of(state, base).first;
    log.end = log.base;
    let mut chain = Chain { last: HashMap::new(), seen_from: log.base };
    for (cluster, h) in heads {
        if h.offset < log.base {
            log.evicted.insert(cluster.clone(), h.offset);
            let latest = Latest::new((h.epoch, h.seq), h.offset);
            chain.last.insert(cluster.clone(), latest);
        } else if log.base > 1 {
            log.evicted.insert(cluster.clone(), log.base - 1);
        }
        log.heads.insert(cluster.clone(), (h.epoch, h.seq));
    }
    // Records of this stream were evicted before the tail started: the bucket names the
    // clusters whose heads were written before, but not one whose latest record was stored
    // after the last write of the heads (written once a second, and not at all by a replica
    // that crashed first). A reader from before the first retained record gets
    // `resync-required *` (seed 8146: a subscriber resuming on a replica whose tail had just
    // started skipped a cluster's evicted records without a word).
    let first_seq = if state.messages == 0 { state.last_sequence + 1 } else { state.first_sequence.max(1) };
    if first_seq > 1 {
        log.evicted.insert(Arc::from(ALL_CLUSTERS), log.base - 1);
    }
    (log, chain)
}

/// What the local tail knows of each cluster's records.
struct Chain {
    last: HashMap<Arc<str>, Latest>,
    /// The first offset the tail saw: a cluster missing from `last` has no record below it
    /// only when it is 1 (otherwise its latest may have been evicted unseen).
    seen_from: u64,
}

/// A cluster's latest records as the local tail took them in.
#[derive(Debug, Clone, Copy)]
struct Latest {
    /// (epoch, seq) of the latest record that was not stale: the one the next must name.
    key: (u64, u64),
    /// The epoch and offset of the latest record stored (a stale one too).
    epoch: u64,
    offset: u64,
    /// The offset of the latest record stored of another epoch than `epoch` (0: none seen).
    other: u64,
    /// The highest seq taken in of the last few agent processes (epoch, seq; epoch 0:
    /// none), newest first: `key` only knows the latest process's.
    seqs: [(u64, u64); 3],
}

impl Latest {
    fn new(key: (u64, u64), offset: u64) -> Self {
        Self { key, epoch: key.0, offset, other: 0, seqs: [key, (0, 0), (0, 0)] }
    }

    /// The highest seq taken in of agent process `epoch`, if it is one of the last few.
    fn highest(&self, epoch: u64) -> Option<u64> {
        self.seqs.iter().find(|(e, _)| *e == epoch && epoch != 0).map(|(_, s)| *s)
    }

    /// Takes in record `key` of its process.
    fn note(&mut self, key: (u64, u64)) {
        match self.seqs.iter().position(|(e, _)| *e == key.0) {
            Some(i) => {
                let seq = self.seqs[i].1.max(key.1);
                self.seqs[..=i].rotate_right(1);
                self.seqs[0] = (key.0, seq);
            }
            None => {
                self.seqs.rotate_right(1);
                self.seqs[0] = key;
            }
        }
    }
}

impl Chain {
    /// Whether a record of `cluster` stored at `offset`, naming `prev` as its predecessor
    /// and `known` as the stream's end its publisher knew, follows the cluster's latest
    /// record and is not older than a record of another agent process stored before it:
    /// `Err(why)` when it does not (or cannot be known to), and it takes the record's place
    /// as the latest either way (unless it is older than the latest of its own process).
    fn follow(
        &mut self,
        cluster: &Arc<str>,
        prev: Option<&str>,
        known: Option<&str>,
        now: (u64, u64),
        offset: u64,
    ) -> Result<(), &'static str> {
        // The cluster's latest key, and the offset of its latest record of another agent
        // process than this one's (0: none).
        let (last, other) = match self.last.get_mut(cluster) {
            Some(l) => {
                let other = if l.epoch == now.0 { l.other } else { l.offset };
                if l.epoch != now.0 {
                    l.other = l.offset;
                    l.epoch = now.0;
                }
                l.offset = offset;
                if (l.key.0 == now.0 && now.1 <= l.key.1) || l.highest(now.0).is_some_and(|seq| now.1 <= seq) {
                    // Older than a record of the same agent process stored before it: a
                    // publish a client kept while its link to JetStream was down and sent
                    // once it was back, after the agent had resent it and more through
                    // another replica; or one a session the agent had left took in late,
                    // after its records through another replica and another process's
                    // (seed 7056). Delivered as an event it would put an older state over a
                    // newer one; the latest stays the latest.
                    return Err(STALE);
                }
                l.note(now);
                (Some(std::mem::replace(&mut l.key, now)), other)
            }
            None => {
                self.last.insert(cluster.clone(), Latest::new(now, offset));
                (None, 0)
            }
        };
        self.follows(last, prev)?;
        // Whether a record of another agent process of the cluster was stored after this
        // one was sent: then it may be newer than this one (its process kept appending
        // while this one's publish waited on a cut link, and the records after this one
        // follow it). Records of a hub that did not say are not checked.
        let Some(known) = known else { return Ok(()) };
        match known.parse::<u64>() {
            Ok(known) if known < offset && known.saturating_add(1) >= self.seen_from => {
                if other > known {
                    Err(LATE)
                } else {
                    Ok(())
                }
            }
            // Part of what was stored after it was sent is unseen here (evicted before the
            // tail started), or it names an end beyond itself (a stream recreated under it).
            _ => Err(UNCHECKED),
        }
    }

    /// Whether a record naming `prev` follows `last`, the cluster's latest record.
    fn follows(&self, last: Option<(u64, u64)>, prev: Option<&str>) -> Result<(), &'static str> {
        let Some(prev) = prev else { return Ok(()) }; // written by a hub that did not say
        if prev == "-" {
            // Its publisher knew of no record of the cluster.
            return if last.is_none() { Ok(()) } else { Err(BROKEN) };
        }
        let (key, offset) = match prev.split_once('@') {
            Some((key, offset)) => (key, offset.parse::<u64>().ok()),
            None => (prev, None),
        };
        let named = key.split_once('/').and_then(|(e, s)| Some((e.parse::<u64>().ok()?, s.parse::<u64>().ok()?)));
        match (last, named, offset) {
            (Some(last), Some(named), _) if last == named => Ok(()),
            // A predecessor this tail never saw, but which was stored (its publisher knew its
            // offset from the ack) where the tail did not look: nothing of its publisher lies
            // between the two, and what other publishers lost is marked at their own records.
            (None, Some(_), Some(offset)) if offset < self.seen_from => Ok(()),
            (None, Some(_), _) if self.seen_from > 1 => Err(UNKNOWN),
            _ => Err(BROKEN),
        }
    }
}

const BROKEN: &str = "records of the cluster may be missing before this one (a JetStream publish failed or was \
                      overtaken while a later one of the cluster was stored)";
const STALE: &str = "this record is older than a record of the cluster stored before it (a JetStream publish sent \
                     late, after the agent's resend)";
const UNKNOWN: &str = "this hub replica cannot check that no record of the cluster is missing before this one (its \
                       predecessor was evicted before the replica started)";
const LATE: &str = "this record may be older than a record of another agent process of the cluster stored before it \
                    (a JetStream publish sent late, after its hub replica's link to JetStream was back)";
const UNCHECKED: &str = "this hub replica cannot check that this record is not older than a record of another agent \
                         process of the cluster stored before it (stored where the replica did not look)";

/// A cluster's latest record as far as this replica knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Head {
    epoch: u64,
    seq: u64,
    offset: u64,
}

/// A head as the heads bucket keeps it: with its format (releases before it wrote none and
/// ignore it when they read).
#[derive(Serialize)]
struct StoredHead<'a> {
    #[serde(flatten)]
    head: &'a Head,
    format: u32,
}

/// Why a head was not written.
enum HeadWrite {
    /// The bucket holds one of a newer format: not written over (the refusal).
    Newer(String),
    /// The bucket failed, or the value changed meanwhile: tried again at the next flush.
    Failed(String),
}

/// A value of the heads bucket: `Ok(None)` when it is not a head (damaged: as before, the
/// stream and the agents' resyncs stand in for it), `Err` with the format found when a
/// newer release wrote it.
fn parse_head(bytes: &[u8]) -> Result<Option<Head>, String> {
    nats_state::readable_value(bytes)?;
    Ok(serde_json::from_slice(bytes).ok())
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
    /// Cursor moves not yet written: identity → name → cursor and registration.
    dirty: Mutex<HashMap<String, BTreeMap<String, Move>>>,
    /// The registration this replica last wrote per (identity, name): its cursor moves
    /// belong to it (see [`Cursors::current`]).
    regs: Mutex<HashMap<(String, String), u64>>,
    /// What the stream and buckets are created with (again, after JetStream lost them).
    opts: NatsOptions,
    /// Offset = stream sequence + base: 0 for a stream created fresh, above every earlier
    /// offset for one recreated after JetStream lost its store (see [`nats_state`]).
    base: AtomicU64,
    /// When the stream this replica uses was created (Unix nanoseconds): a different one
    /// means it was recreated.
    created: Mutex<i128>,
    /// Set while this replica takes a recreated stream on: appends are refused meanwhile,
    /// so none is acked with an offset of the old stream's numbering.
    adopting: AtomicBool,
    /// Set for good when the stream was recreated by a hub that did not know this bus (its
    /// offsets may repeat ones this replica handed out): every operation fails with it.
    poisoned: Mutex<Option<String>>,
    /// Wakes the probe at once (an ack showed the stream went backwards).
    recheck: Arc<tokio::sync::Notify>,
    /// Which local tail ingests: a tail restarted on a recreated stream bumps it, so a batch
    /// of the old consumer still in flight is dropped.
    tail_generation: AtomicU64,
    /// The task feeding the local tail.
    tail_task: Mutex<Option<AbortHandle>>,
    /// Heads this replica appended and has not written to the bucket yet.
    dirty_heads: Mutex<HashMap<Arc<str>, Head>>,
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

/// One append of a cluster in flight: counts down its [`Pending`] entry when done, and drops
/// it when the append failed or was abandoned, so the next append starts from the heads
/// this replica knows (and names a predecessor the tails can check) instead of from a
/// record that may not have been stored.
struct InFlight<'a, J: JetStream> {
    bus: &'a NatsBus<J>,
    cluster: Arc<str>,
    /// `None` when the entry was already dropped.
    generation: Option<u64>,
    stored: bool,
}

impl<J: JetStream> Drop for InFlight<'_, J> {
    fn drop(&mut self) {
        let Some(generation) = self.generation else { return };
        let mut pending = lock(&self.bus.pending);
        let Some(p) = pending.get_mut(&self.cluster) else { return };
        if p.generation != generation {
            return;
        }
        p.in_flight -= 1;
        if !self.stored {
            // Its records may be lost: the entry stays, for the next records to name the
            // tip (see `NatsBus::start_inner`).
            p.broken = true;
        } else if p.in_flight == 0 && !p.broken {
            pending.remove(&self.cluster);
        }
    }
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere mid-update of a plain map.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> =
        (0..s.len()).step_by(2).map(|i| u8::from_str_radix(s.get(i..i + 2)?, 16).ok()).collect();
    String::from_utf8(bytes?).ok()
}

/// A name as a subject token / key-value key: itself when plain, `=<hex>` otherwise.
fn token(name: &str) -> String {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        name.to_string()
    } else {
        format!("={}", hex(name))
    }
}

fn untoken(t: &str) -> Option<String> {
    match t.strip_prefix('=') {
        Some(h) => unhex(h),
        None => Some(t.to_string()),
    }
}

fn valid_stream_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl NatsBus<AsyncNats> {
    /// Connects, creates (or checks) the stream and the buckets, loads the retained records
    /// into the local tail and starts following the stream. Fails with one error naming
    /// the cause when the servers are unreachable, refuse the credentials, or the stream
    /// exists with other settings.
    pub async fn open(opts: NatsOptions) -> Result<Arc<Self>, NatsError> {
        check_options(&opts)?;
        let io = IoThread::start()?;
        let connecting = opts.clone();
        let (client, servers) = io
            .handle
            .spawn(async move { connect(&connecting).await })
            .await
            .map_err(|e| NatsError::Settings(format!("the NATS connection thread failed: {e}")))??;
        let js = jetstream::ContextBuilder::new().timeout(REQUEST_TIMEOUT).build(client.clone());
        let js = AsyncNats::new(client, js, &opts.stream, servers, io)
            .await
            .map_err(|cause| NatsError::Stream { stream: opts.stream.clone(), cause })?;
        NatsBus::open_on(js, opts).await
    }
}

fn check_options(opts: &NatsOptions) -> Result<(), NatsError> {
    if !valid_stream_name(&opts.stream) {
        return Err(NatsError::Settings(format!(
            "stream name {:?}: use letters, digits, '-' and '_' (at most 200)",
            opts.stream
        )));
    }
    if opts.replicas == 0 || opts.replicas > 5 {
        return Err(NatsError::Settings(format!("--bus-replicas {}: JetStream allows 1 to 5", opts.replicas)));
    }
    Ok(())
}

impl<J: JetStream> NatsBus<J> {
    /// [`NatsBus::open`] on a JetStream given (the simulation's in-memory one), bound to
    /// `opts.stream`; `opts.servers` and the TLS settings are unused.
    pub async fn open_on(js: J, opts: NatsOptions) -> Result<Arc<Self>, NatsError> {
        check_options(&opts)?;
        let (info, created_after_wait) = ensure_stream(&js, &opts).await?;
        let lineage = lineage_of(&opts.stream, &info);
        let stream_id = lineage.id.clone();
        let durable = info.durable;
        let heads_bucket = format!("{}_heads", opts.stream);
        let cursors_bucket = format!("{}_cursors", opts.stream);
        let replicas_bucket = format!("{}_replicas", opts.stream);
        let heads_kv = ensure_bucket(&js, &heads_bucket, opts.replicas, Duration::ZERO).await?;
        let cursors_kv = ensure_bucket(&js, &cursors_bucket, opts.replicas, Duration::ZERO).await?;
        let replicas_kv = ensure_bucket(&js, &replicas_bucket, opts.replicas, REPLICA_TTL).await?;
        // A cursor store first written while the bus already has history was recreated (or
        // is from a release that did not write the entry): names not in it may have existed.
        // So may they in a bus this hub created after waiting for a missing stream: JetStream
        // may have lost its store while no replica that knew the bus ran (or it is the first
        // start; a durable subscriber's first subscription then costs one resync, as on a
        // memory bus). Seed 263 of the simulation's `--storage nats` lost a durable
        // subscriber's changes: placed at `latest` of the new bus as a new name.
        let had_history = info.state.last_sequence > 0 || lineage.base > 0;
        let meta = Meta {
            names_lost: had_history || created_after_wait,
            begun_after_wait: !had_history && created_after_wait,
            format: NATS_FORMAT,
        };
        ensure_meta(&cursors_kv, &cursors_bucket, meta).await?;
        check_format(&cursors_kv, &cursors_bucket).await?;

        // Heads of every cluster (the tail, once started, loads them again).
        let heads = load_heads(&heads_kv, &heads_bucket).await?;
        let bus = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            stream: opts.stream.clone(),
            stream_id: stream_id.clone(),
            durable,
            // Empty until the local tail starts (see [`NatsBus::start_tail`]).
            core: Core::new(Log::new(), super::cursors::CursorStore::memory(), stream_id),
            retention: opts.retention,
            heads: Mutex::new(heads),
            heads_kv,
            heads_bucket,
            cursors_kv,
            cursors_bucket,
            replicas_kv,
            replicas_bucket,
            dirty: Mutex::new(HashMap::new()),
            regs: Mutex::new(HashMap::new()),
            opts: opts.clone(),
            base: AtomicU64::new(lineage.base),
            created: Mutex::new(info.created_ns),
            adopting: AtomicBool::new(false),
            poisoned: Mutex::new(None),
            recheck: Arc::new(tokio::sync::Notify::new()),
            tail_generation: AtomicU64::new(0),
            tail_task: Mutex::new(None),
            dirty_heads: Mutex::new(HashMap::new()),
            head_revisions: Mutex::new(HashMap::new()),
            local_waiters: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            chain: Mutex::new(Chain { last: HashMap::new(), seen_from: 1 }),
            tail_starting: tokio::sync::Mutex::new(()),
            tail_started: AtomicBool::new(false),
            tail_ready: AtomicBool::new(false),
            lost_names_begun: AtomicBool::new(false),
            stream_state: Mutex::new(StreamState::of(&info.state, lineage.base)),
            unhealthy: Mutex::new(None),
            stream_last: AtomicU64::new(info.state.last_sequence + lineage.base),
            write_failures: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
            js,
        });

        let probe = tokio::spawn(probe(Arc::downgrade(&bus), bus.recheck.clone()));
        let age = tokio::spawn(age_retention(Arc::downgrade(&bus)));
        lock(&bus.tasks).extend([probe.abort_handle(), age.abort_handle()]);
        tracing::info!(stream = %opts.stream, servers = %bus.js.servers(), first = bus.first_offset(), last = bus.last_offset(), "bus on NATS JetStream");
        Ok(bus)
    }

    /// Starts the local tail, once: loads the retained records and follows the stream from
    /// then on; answers when what the stream held at the call is in it. Called by the first
    /// reader (a subscriber session, a read): until then this replica only appends, and
    /// neither it nor JetStream spends anything on delivering it the stream.
    pub(super) async fn start_tail(&self) -> Result<(), NatsError> {
        if self.tail_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        // On a task of its own: a reader that gives up (its connection closed) must not
        // leave the tail half set up while appends already wait for it.
        let Some(bus) = self.me.upgrade() else {
            return Err(self.stream_error("the bus is shutting down".into()));
        };
        tokio::spawn(async move { bus.start_tail_now().await })
            .await
            .map_err(|e| self.stream_error(format!("starting the local tail failed: {e}")))?
    }

    async fn start_tail_now(&self) -> Result<(), NatsError> {
        let _starting = self.tail_starting.lock().await;
        if self.tail_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        if !self.tail_started.load(Ordering::SeqCst) {
            // From here on, appends wait for their records in the tail: whatever is acked
            // before the stream's state is read below is loaded with the retained records.
            self.tail_started.store(true, Ordering::SeqCst);
            if let Err(e) = self.spawn_tail().await {
                self.tail_started.store(false, Ordering::SeqCst);
                // Appends that began waiting for the tail need not: nothing reads here yet.
                let waiting = std::mem::take(&mut *lock(&self.local_waiters));
                for tx in waiting.into_values().flatten() {
                    let _ = tx.send(());
                }
                return Err(e);
            }
        }
        // Loaded once it holds what the stream holds now (a retry after a timeout waits again).
        let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
        let last = info.state.last_sequence + self.base.load(Ordering::SeqCst);
        if last >= self.core.first_offset() {
            tracing::info!(stream = %self.stream, records = info.state.messages, "loading the retained records from JetStream into the local tail");
            self.wait_local(last).await?;
        }
        self.tail_ready.store(true, Ordering::Release);
        tracing::info!(stream = %self.stream, first = self.first_offset(), last = self.last_offset(), "local tail ready");
        Ok(())
    }

    /// Sets the local tail up from the stream's state and the heads in the bucket, and
    /// starts its consumer.
    async fn spawn_tail(&self) -> Result<(), NatsError> {
        let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
        // The bucket's heads are up to a second old (appending replicas write them once a
        // second): this replica's own acks and lookups may be newer.
        let mut heads = load_heads(&self.heads_kv, &self.heads_bucket).await?;
        for (cluster, h) in lock(&self.heads).iter() {
            keep_latest(&mut heads, cluster, *h);
        }
        let base = self.base.load(Ordering::SeqCst);
        let (log, chain) = initial_log(&info.state, base, &heads);
        let start = log.end;
        let generation = {
            let mut current =
                self.core.log.write().map_err(|_| self.stream_error("local tail lock poisoned".into()))?;
            *current = log;
            *lock(&self.chain) = chain;
            // Batches of a consumer started before are dropped from now on.
            self.tail_generation.fetch_add(1, Ordering::SeqCst) + 1
        };
        for (cluster, h) in heads {
            self.note_head(&cluster, h);
        }
        // A tail restarted on a recreated stream starts above the old end: readers and
        // appends waiting for old offsets go on.
        self.core.announce(start);
        self.release_local();
        let messages = self.js.ordered(start - base).await.map_err(|e| self.stream_error(e))?;
        let tail = tokio::spawn(follow(self.me.clone(), messages, generation));
        if let Some(old) = lock(&self.tail_task).replace(tail.abort_handle()) {
            old.abort();
        }
        Ok(())
    }

    /// Waits until the local tail holds what the stream holds now. A subscriber comes with
    /// a cursor another replica may have handed out, up to the stream's end; a tail behind
    /// it (lagging, or back from a cut link to JetStream) would take it for a cursor beyond
    /// the log, which means lost records: a `resync-required` `*` and offsets the
    /// subscriber had acknowledged delivered again (the simulation found it: seed 58 of
    /// `--storage nats`).
    async fn catch_up(&self) -> Result<(), NatsError> {
        let deadline = tokio::time::Instant::now() + LOCAL_WAIT;
        let info = loop {
            let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
            if info.created_ns == *lock(&self.created) && !self.adopting.load(Ordering::SeqCst) {
                break info;
            }
            // A stream recreated that this replica has not taken on yet: its offsets are
            // still the old stream's, below the cursors of replicas that took it on (the
            // simulation found a subscriber placed below what it had acknowledged, seeds
            // 273 and 376 of `--storage nats`). The probe takes it on now.
            if tokio::time::Instant::now() >= deadline {
                return Err(self.stream_error("the stream was recreated and is not taken on yet".into()));
            }
            self.recheck.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let last = info.state.last_sequence + self.base.load(Ordering::SeqCst);
        if last > self.core.last_offset() && last >= self.core.first_offset() {
            self.wait_local(last).await?;
        }
        Ok(())
    }

    /// Offset = stream sequence + this (above 0 once a recreated stream was taken on).
    pub(super) fn offset_base(&self) -> u64 {
        self.base.load(Ordering::SeqCst)
    }

    /// `Err` for good once the stream was recreated by a hub that did not know this bus.
    fn usable(&self) -> Result<(), BusError> {
        match &*lock(&self.poisoned) {
            None => Ok(()),
            Some(cause) => Err(BusError::Nats(self.stream_error(cause.clone()))),
        }
    }

    /// The highest offset this replica knows to exist (acks, probes, its tail, heads).
    fn known_last(&self) -> u64 {
        let heads = lock(&self.heads).values().map(|h| h.offset).max().unwrap_or(0);
        let tail = if self.tail_started.load(Ordering::SeqCst) { self.core.last_offset() } else { 0 };
        self.stream_last.load(Ordering::SeqCst).max(heads).max(tail)
    }

    /// JetStream lost the stream (NATS restarted with an empty store): creates it again as
    /// the continuation of this bus — the same bus id, offsets above every offset this
    /// replica knew (its description says so, see [`nats_state`]) — and takes it on. Another
    /// replica may have been first: then its stream is taken on.
    async fn recreate(&self) -> Result<(), NatsError> {
        if let Some(cause) = lock(&self.poisoned).clone() {
            // Its offsets are not to be trusted (its readers were released at the end of
            // all offsets): recreating from them would start at the end of the numbering
            // (the simulation found it: an overflow in a debug build).
            return Err(self.stream_error(cause));
        }
        let lineage = Lineage { id: self.stream_id.clone(), base: nats_state::next_base(self.known_last()) };
        let mut spec = wanted_spec(&self.opts);
        spec.description = nats_state::describe(Some(&lineage));
        tracing::warn!(stream = %self.stream, base = lineage.base, "the JetStream stream is gone (NATS lost its store?): recreating it");
        let refused = self.js.create_stream(&spec).await.err();
        let info = self.js.stream_info().await.map_err(|e| {
            self.stream_error(match refused {
                Some(c) => format!("cannot recreate the stream: {c}"),
                None => format!("stream info after recreating it: {e}"),
            })
        })?;
        if info.created_ns == *lock(&self.created) {
            // It was there after all (a server still starting up answered "not found").
            return Ok(());
        }
        self.adopt(info).await
    }

    /// Takes on a stream that was recreated (by this replica or another): the buckets are
    /// created again where they went with it, a cursor store found without its meta entry
    /// is marked as having lost names, the `resync-required` `*` is recorded once (every
    /// replica publishes it with the same message id, JetStream keeps one), and offsets
    /// continue above the old ones — a subscriber reading on from an old cursor reads the
    /// marker next. Until done, appends are refused.
    async fn adopt(&self, info: StreamInfo) -> Result<(), NatsError> {
        let lineage = lineage_of(&self.stream, &info);
        let known = self.known_last();
        if lineage.id == self.stream_id && lineage.base < known {
            return self.supersede(&info, &lineage, known).await;
        }
        if lineage.id != self.stream_id {
            let cause = format!(
                "the JetStream stream {} was recreated by a hub that did not know bus {} (bus {}, offsets from {}, while \
                 this replica handed out offsets up to {known}): restart this hub replica",
                self.stream,
                self.stream_id,
                lineage.id,
                lineage.base + 1
            );
            tracing::error!(%cause, "bus unusable");
            *lock(&self.poisoned) = Some(cause.clone());
            // Readers waiting for more read now and fail, so their sessions end and the
            // subscribers reconnect (to a replica that works, or to this one restarted).
            self.core.announce(u64::MAX);
            self.release_local();
            return Err(self.stream_error(cause));
        }
        self.adopting.store(true, Ordering::SeqCst);
        self.adopt_now(&info, &lineage).await?;
        *lock(&self.created) = info.created_ns;
        self.adopting.store(false, Ordering::SeqCst);
        tracing::warn!(stream = %self.stream, base = lineage.base, "taken on the recreated JetStream stream: offsets continue above {}; subscribers get resync-required *", lineage.base);
        Ok(())
    }

    /// The stream continues this bus but numbers its records from below offsets this
    /// replica handed out: another replica recreated it from what it knew before it had
    /// taken on an earlier recreation (JetStream lost its store twice in a short time, or
    /// lost a stream it had just recreated). Taking it on would repeat offsets, and readers
    /// going on from a cursor this replica gave them would skip its first records — its
    /// `resync-required *` among them — silently; refusing for good would keep this replica
    /// unready until restarted. So the replica that knows more recreates the stream once
    /// more, above every offset it knows (its own and the short-lived stream's): what was
    /// stored in the short-lived stream goes with it, and the new stream's `*`, which every
    /// reader reads next from any cursor it holds, tells them so. Only the stream this
    /// replica looked at is deleted: one superseded meanwhile by another replica is taken on
    /// (or superseded in turn) at the next probe.
    async fn supersede(&self, info: &StreamInfo, lineage: &Lineage, known: u64) -> Result<(), NatsError> {
        // Appends are refused until a stream is taken on (see `adopt`).
        self.adopting.store(true, Ordering::SeqCst);
        self.stream_last.fetch_max(info.state.last_sequence + lineage.base, Ordering::SeqCst);
        tracing::warn!(
            stream = %self.stream,
            base = lineage.base,
            known,
            "the JetStream stream was recreated below offsets this replica handed out (by a replica that had not taken on an earlier recreation): recreating it above them"
        );
        let created = info.created_ns;
        match self.js.stream_info().await {
            Ok(now) if now.created_ns != created => return Ok(()),
            Ok(now) => {
                self.stream_last.fetch_max(now.state.last_sequence + lineage.base, Ordering::SeqCst);
                match self.js.delete_stream().await {
                    Ok(()) | Err(JsError::NotFound) => {}
                    Err(e) => return Err(self.stream_error(format!("cannot delete the stream to recreate it: {e}"))),
                }
            }
            Err(JsError::NotFound) => {}
            Err(e) => return Err(self.stream_error(format!("stream info: {e}"))),
        }
        // Boxed: recreating takes the new stream on, which may supersede again.
        Box::pin(self.recreate()).await
    }

    async fn adopt_now(&self, info: &StreamInfo, lineage: &Lineage) -> Result<(), NatsError> {
        // Offsets up to the new stream's base count as handed out from here on, before
        // anything below can fail: a replica that lost the stream again before it finished
        // taking this one on must recreate it above this base, not at it (seed 9427: it
        // recreated at the same base, and its offsets repeated ones another replica had
        // handed out of the first recreation).
        self.stream_last.fetch_max(lineage.base, Ordering::SeqCst);
        // The key-value handles name their buckets: they work on buckets created again.
        ensure_bucket(&self.js, &self.heads_bucket, self.opts.replicas, Duration::ZERO).await?;
        ensure_bucket(&self.js, &self.cursors_bucket, self.opts.replicas, Duration::ZERO).await?;
        ensure_bucket(&self.js, &self.replicas_bucket, self.opts.replicas, REPLICA_TTL).await?;
        // Recreated under a bus with history: names not in it may have existed.
        ensure_meta(
            &self.cursors_kv,
            &self.cursors_bucket,
            Meta { names_lost: true, begun_after_wait: false, format: NATS_FORMAT },
        )
        .await?;
        self.publish_recreated_marker(lineage.base).await?;
        let _starting = self.tail_starting.lock().await;
        if let Ok(_log) = self.core.log.write() {
            // The old stream's consumer ingests nothing more.
            self.tail_generation.fetch_add(1, Ordering::SeqCst);
            self.base.store(lineage.base, Ordering::SeqCst);
        }
        self.stream_last.fetch_max(info.state.last_sequence + lineage.base, Ordering::SeqCst);
        *lock(&self.stream_state) = StreamState::of(&info.state, lineage.base);
        // Appends in flight chained onto records of the old stream.
        lock(&self.pending).clear();
        if self.tail_started.load(Ordering::SeqCst) {
            self.spawn_tail().await?;
        }
        Ok(())
    }

    /// Records `resync-required` `*` in a recreated stream, as its first record unless
    /// appends of replicas that had not noticed yet came first (then right after them).
    async fn publish_recreated_marker(&self, base: u64) -> Result<(), NatsError> {
        let mut headers = HeaderMap::new();
        headers.insert(H_EPOCH, "0");
        headers.insert(H_SEQ, base.to_string().as_str());
        headers.insert(H_KIND, KIND_RESYNC);
        headers.insert(H_PREV, "-");
        headers.insert(H_FORMAT, FORMAT_MARK);
        let reason = format!("{RECREATED}: the records before offset {} are lost", base + 1);
        let id = format!("{}/recreated/{base}", token(ALL_CLUSTERS));
        let failed = |e: String| NatsError::Publish { cluster: ALL_CLUSTERS.into(), cause: e };
        let ack = self.js.publish(self.subject(ALL_CLUSTERS), headers, reason.into(), id).await.map_err(failed)?;
        ack.await.map_err(failed)?;
        Ok(())
    }

    fn stream_error(&self, cause: String) -> NatsError {
        NatsError::Stream { stream: self.stream.clone(), cause }
    }

    fn subject(&self, cluster: &str) -> String {
        format!("{}.{}", self.stream, token(cluster))
    }

    /// Something of the bus is kept in a newer format than this build's: the replica
    /// refuses to go on, as for a stream of another bus (its hub exits through
    /// [`Bus::fatal`], naming both formats), and writes nothing more.
    fn refuse_newer(&self, why: String) -> BusError {
        tracing::error!(stream = %self.stream, "{why}");
        lock(&self.poisoned).get_or_insert(why.clone());
        BusError::Nats(self.stream_error(why))
    }

    fn fail(&self, e: NatsError) -> BusError {
        *lock(&self.unhealthy) = Some(e.to_string());
        BusError::Nats(e)
    }

    /// Waits until the local tail holds `offset` (at most [`LOCAL_WAIT`]).
    async fn wait_local(&self, offset: u64) -> Result<(), NatsError> {
        let arrived = {
            // The end is read under the waiters' lock and [`Self::release_local`] takes it
            // after every advance, so an advance is either seen here or releases us.
            let mut waiters = lock(&self.local_waiters);
            if *self.core.end_tx.borrow() > offset {
                return Ok(());
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            waiters.entry(offset).or_default().push(tx);
            rx
        };
        match tokio::time::timeout(LOCAL_WAIT, arrived).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(NatsError::Lagging { stream: self.stream.clone(), offset }),
        }
    }

    /// Wakes the appends whose records the local tail now holds (offsets below its end).
    /// Entries of appends that gave up are dropped here too, once the end passes them.
    fn release_local(&self) {
        let ready = {
            let mut waiters = lock(&self.local_waiters);
            let end = *self.core.end_tx.borrow();
            let later = waiters.split_off(&end);
            std::mem::replace(&mut *waiters, later)
        };
        for tx in ready.into_values().flatten() {
            let _ = tx.send(());
        }
    }

    /// The cluster's head: the later (by offset) of the stream's last message on the
    /// cluster's subject — or the key-value entry when the stream holds none of it — and
    /// what this replica saw.
    async fn head_of(&self, cluster: &str) -> Result<Option<Head>, BusError> {
        let subject = self.subject(cluster);
        let found = match self.js.last_by_subject(&subject).await {
            Ok(Some(msg)) => {
                let offset = msg.sequence + self.base.load(Ordering::SeqCst);
                if let Err(found) = readable_mark(msg.headers.get(H_FORMAT).map(|v| v.as_str())) {
                    let what = format!("the last record of cluster {cluster} (offset {offset})");
                    return Err(self.refuse_newer(newer_format(&what, &found)));
                }
                head_from_headers(&msg.headers, offset)
            }
            // The bucket only matters once the stream holds nothing of the cluster: while it
            // does, its last record is at least as new as anything the bucket was given.
            Ok(None) => {
                let stored = self.heads_kv.get(&token(cluster)).await.map_err(|e| {
                    self.fail(NatsError::KeyValue {
                        bucket: self.heads_bucket.clone(),
                        cause: format!("read head of {cluster}: {e}"),
                    })
                })?;
                match stored.map(|b| parse_head(&b)).transpose() {
                    Ok(h) => h.flatten(),
                    Err(found) => {
                        let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                        return Err(self.refuse_newer(newer_format(&what, &found)));
                    }
                }
            }
            Err(e) => {
                return Err(self.fail(NatsError::Stream {
                    stream: self.stream.clone(),
                    cause: format!("read the last record of {cluster}: {e}"),
                }));
            }
        };
        if let Some(h) = found {
            self.note_head(&cluster.into(), h);
        }
        Ok(lock(&self.heads).get(cluster).copied())
    }

    /// Writes the heads appended since the last call to the bucket; what fails is kept
    /// for the next call (unless a later head replaced it meanwhile).
    async fn flush_heads(&self) -> Result<(), BusError> {
        self.usable()?;
        let pending: Vec<(Arc<str>, Head)> = std::mem::take(&mut *lock(&self.dirty_heads)).into_iter().collect();
        if pending.is_empty() {
            return Ok(());
        }
        let puts = pending.iter().map(|(cluster, h)| async move {
            let value: bytes::Bytes =
                serde_json::to_vec(&StoredHead { head: h, format: NATS_FORMAT }).unwrap_or_default().into();
            self.write_head(cluster, value).await
        });
        let results = futures_util::future::join_all(puts).await;
        let mut failure = None;
        let mut dirty = lock(&self.dirty_heads);
        for ((cluster, h), r) in pending.into_iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(HeadWrite::Newer(why)) => {
                    drop(dirty);
                    return Err(self.refuse_newer(why));
                }
                Err(HeadWrite::Failed(e)) => {
                    failure.get_or_insert_with(|| format!("write head of {cluster}: {e}"));
                    dirty.entry(cluster).or_insert(h);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(cause) => Err(BusError::Nats(NatsError::KeyValue { bucket: self.heads_bucket.clone(), cause })),
        }
    }

    /// Writes one head: compare-and-set on the revision this replica wrote last; when the
    /// value changed since (or this replica has not written it), the value there is read
    /// first, and one of a newer format is not written over.
    async fn write_head(&self, cluster: &Arc<str>, value: bytes::Bytes) -> Result<(), HeadWrite> {
        let key = token(cluster);
        let known = lock(&self.head_revisions).get(cluster).copied();
        if let Some(rev) = known
            && let Ok(new) = self.heads_kv.update(&key, value.clone(), rev).await
        {
            lock(&self.head_revisions).insert(cluster.clone(), new);
            return Ok(());
        }
        let there = self.heads_kv.entry(&key).await.map_err(HeadWrite::Failed)?;
        let written = match there {
            Some(e) => {
                if e.is_put
                    && let Err(found) = parse_head(&e.value)
                {
                    let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                    return Err(HeadWrite::Newer(newer_format(&what, &found)));
                }
                self.heads_kv.update(&key, value, e.revision).await
            }
            None => self.heads_kv.create(&key, value).await.map_err(|e| e.to_string()),
        };
        let new = written.map_err(HeadWrite::Failed)?;
        lock(&self.head_revisions).insert(cluster.clone(), new);
        Ok(())
    }

    /// Publishes the records of one append and returns the future of their acks. Publishes
    /// of one cluster on this replica form a chain: each names the record published before
    /// it (`Fw-Prev`), so a record stored after one that was not is noticed by every
    /// replica's tail ([`Chain`]) and turned into a `resync-required`, which is what makes
    /// several appends of a session in flight safe: the agent is acked only up to the last
    /// batch whose predecessors were all stored, and its resend after a failure may be
    /// skipped as duplicates of a later stored batch, whose marker covers what was lost.
    async fn start_inner(&self, cluster: Arc<str>, mut items: Vec<Append>) -> Result<BusFuture<'_, u64>, BusError> {
        self.usable()?;
        if self.adopting.load(Ordering::SeqCst) {
            return Err(BusError::Nats(NatsError::Publish {
                cluster: cluster.to_string(),
                cause: format!("the JetStream stream {} is being recreated; resend", self.stream),
            }));
        }
        cap_reasons(&mut items);
        // Every record stored from here on gets a sequence above this: an ack below it
        // comes from a stream that was recreated under this replica.
        let known = self.stream_last.load(Ordering::SeqCst);
        let pending = lock(&self.pending).get(&cluster).copied();
        // After an append failed, records continuing past what was published go on naming
        // the last published record, which may be lost: a batch the session had already
        // taken in (or another session of the agent on this replica) is then marked by the
        // tail if it is. Chained onto the stored head instead, it would follow it and be
        // delivered as events, and the agent's resend of the lost records would be skipped
        // as duplicates of it (seed 4726: a replaced session's failing batch dropped the
        // chain of the new session's batch in flight). A resend (from at or below the tip)
        // starts again from the stored head.
        let resend = |p: &Pending| items.first().is_some_and(|first| first.epoch != p.tip.0 || first.seq <= p.tip.1);
        // A broken tip the stored head covers (the agent resent it through another replica)
        // is not named any more either: that would only cost a resync.
        let covered = |p: &Pending| {
            p.in_flight == 0 && lock(&self.heads).get(&cluster).is_some_and(|h| h.epoch == p.tip.0 && h.seq >= p.tip.1)
        };
        let pending = pending.filter(|p| !(p.broken && (resend(p) || covered(p))));
        // The predecessor of the first record, with its offset when it is known stored.
        let (mut tip, mut tip_offset) = match pending {
            Some(p) => (Some(p.tip), None),
            None => {
                let known = lock(&self.heads).get(&cluster).copied();
                let head = match known {
                    Some(h) => Some(h),
                    None => self.head_of(&cluster).await?,
                };
                (head.map(|h| (h.epoch, h.seq)), head.map(|h| h.offset))
            }
        };
        // The stream's end as this replica knows it (`Fw-Known`): its acks and probes, its
        // tail, the cluster's head. Every record at or below it is stored already.
        let tail_last = if self.tail_started.load(Ordering::SeqCst) { self.core.last_offset() } else { 0 };
        let seen = known.max(tail_last).max(tip_offset.unwrap_or(0)).to_string();
        // Resends are skipped only up to what is known stored: a record of an append still
        // in flight is published again (JetStream's duplicate window drops the copy if the
        // first was stored). Skipped and answered at once, it was acked to the agent while
        // the publish in flight could still fail (seed 10074: a replaced session's batch
        // lost after the new session's resend of it had been acked).
        let stored = match pending {
            Some(_) => lock(&self.heads).get(&cluster).map(|h| (h.epoch, h.seq)),
            None => tip,
        };
        let mut fresh = Vec::with_capacity(items.len());
        for item in items {
            if let Some((ep, seq)) = stored
                && ep == item.epoch
                && item.seq <= seq
            {
                continue; // duplicate from a resend
            }
            fresh.push((tip, tip_offset.take(), item));
            tip = fresh.last().map(|(_, _, i)| (i.epoch, i.seq));
        }
        if fresh.is_empty() {
            return Ok(super::ready(Ok(self.last_offset())));
        }

        // Publish back to back; the acks are awaited by the returned future.
        let subject = self.subject(&cluster);
        let mut acks = Vec::with_capacity(fresh.len());
        let mut keys = Vec::with_capacity(fresh.len());
        let mut refused = None;
        for (prev, prev_offset, item) in fresh {
            let mut headers = HeaderMap::new();
            headers.insert(H_EPOCH, item.epoch.to_string().as_str());
            headers.insert(H_SEQ, item.seq.to_string().as_str());
            let prev = match (prev, prev_offset) {
                (None, _) => "-".to_string(),
                (Some((e, s)), None) => format!("{e}/{s}"),
                (Some((e, s)), Some(offset)) => format!("{e}/{s}@{offset}"),
            };
            headers.insert(H_PREV, prev.as_str());
            headers.insert(H_KNOWN, seen.as_str());
            let (kind, payload, suffix) = match item.body {
                RecordBody::Event(b) => (KIND_EVENT, b, String::new()),
                // Markers of one (epoch, seq) differ by their reason: a hub stores one after
                // another process's records with the seq this process had reached, which an
                // earlier marker may have had too. A resend has the same reason.
                RecordBody::ResyncRequired(r) => {
                    let suffix = format!("/r{:016x}", fnv1a(r.as_bytes()));
                    (KIND_RESYNC, bytes::Bytes::from(r), suffix)
                }
            };
            headers.insert(H_KIND, kind);
            headers.insert(H_FORMAT, FORMAT_MARK);
            let id = format!("{}/{}/{}{suffix}", token(&cluster), item.epoch, item.seq);
            match self.js.publish(subject.clone(), headers, payload, id).await {
                Ok(ack) => {
                    acks.push(ack);
                    keys.push((item.epoch, item.seq));
                }
                Err(e) => {
                    // Nothing after a refused send was sent; earlier ones may be stored.
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        let generation = {
            let mut pending = lock(&self.pending);
            if refused.is_some() {
                // What was sent before the refusal may be lost: the next records name it.
                if let Some(&tip) = keys.last() {
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                    let p = pending.entry(cluster.clone()).or_insert(Pending {
                        tip,
                        in_flight: 0,
                        generation,
                        broken: true,
                    });
                    p.tip = tip;
                    p.broken = true;
                } else if let Some(p) = pending.get_mut(&cluster) {
                    p.broken = true;
                }
                None
            } else {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                let tip = keys.last().copied().unwrap_or_default();
                let p =
                    pending.entry(cluster.clone()).or_insert(Pending { tip, in_flight: 0, generation, broken: false });
                p.tip = tip;
                p.in_flight += 1;
                // Published after a failure and naming its tip (or a resend from the
                // stored head): the chain goes on from here.
                p.broken = false;
                Some(p.generation)
            }
        };
        let guard = InFlight { bus: self, cluster: cluster.clone(), generation, stored: false };
        Ok(Box::pin(self.finish(guard, acks, keys, refused, known)))
    }

    /// Awaits the acks of one append's publishes (see [`NatsBus::start_inner`]).
    async fn finish<F>(
        &self,
        mut guard: InFlight<'_, J>,
        acks: Vec<F>,
        keys: Vec<(u64, u64)>,
        refused: Option<String>,
        known: u64,
    ) -> Result<u64, BusError>
    where
        F: std::future::Future<Output = Result<super::jetstream::PublishAck, String>>,
    {
        let cluster = guard.cluster.clone();
        let results = futures_util::future::join_all(acks).await;
        let mut last_offset = 0;
        let mut last_stored = None;
        let mut failure = refused;
        let base = self.base.load(Ordering::SeqCst);
        for (r, key) in results.into_iter().zip(keys) {
            match r {
                Ok(ack) if !ack.duplicate && ack.sequence + base <= known => {
                    // Numbered as by a stream that started again: JetStream lost its store
                    // and another replica recreated the stream before this one noticed.
                    // Not acked; the probe takes the new stream on, the agent resends.
                    self.recheck.notify_one();
                    failure.get_or_insert_with(|| {
                        format!("stored at sequence {} of a stream that was recreated meanwhile; resend", ack.sequence)
                    });
                }
                Ok(ack) => {
                    let offset = ack.sequence + base;
                    if offset >= last_offset {
                        last_offset = offset;
                        last_stored = Some(key);
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        if let Some((epoch, seq)) = last_stored {
            // Stored, whatever else failed: resends of it are duplicates (a marker at the
            // first record stored after a lost one covers what was lost).
            self.stream_last.fetch_max(last_offset, Ordering::Relaxed);
            self.note_head(&cluster, Head { epoch, seq, offset: last_offset });
        }
        if let Some(cause) = failure {
            // The stream may be gone: the probe looks now rather than within a second.
            self.recheck.notify_one();
            self.write_failures.fetch_add(1, Ordering::Relaxed);
            return Err(self.fail(NatsError::Publish { cluster: cluster.to_string(), cause }));
        }
        guard.stored = true;
        drop(guard);
        if let Some((epoch, seq)) = last_stored {
            keep_latest(&mut lock(&self.dirty_heads), &cluster, Head { epoch, seq, offset: last_offset });
        }
        // A reader on this replica sees what was just acked; without one, nothing waits.
        if self.tail_started.load(Ordering::SeqCst) {
            self.wait_local(last_offset).await.map_err(|e| self.fail(e))?;
        }
        Ok(last_offset)
    }

    fn note_head(&self, cluster: &Arc<str>, h: Head) {
        keep_latest(&mut lock(&self.heads), cluster, h);
    }

    /// Takes delivered messages into the local tail (unless they come from the consumer of
    /// an earlier `generation` of it).
    fn ingest(&self, batch: Vec<Delivered>, generation: u64) {
        if lock(&self.poisoned).is_some() {
            // Refused to go on (a record of a newer format, another bus): what follows is
            // neither read nor taken for a gap.
            return;
        }
        let now = retention::now_ms();
        let Ok(mut log) = self.core.log.write() else { return };
        if self.tail_generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let base = self.base.load(Ordering::SeqCst);
        let mut chain = lock(&self.chain);
        let mut end = log.end;
        let mut records = Vec::with_capacity(batch.len());
        let mut new_heads = Vec::new();
        let mut refused = false;
        for msg in batch {
            let offset = msg.sequence + base;
            if offset < end {
                continue; // delivered again after the consumer was recreated
            }
            if offset > end {
                // JetStream evicted records this replica had not received yet: everything
                // older goes too, and every cluster may have lost something.
                tracing::warn!(stream = %self.stream, from = end, to = offset, "the local tail fell behind the stream's retention");
                let mut dropped = std::mem::take(&mut records);
                dropped.extend(log.records.drain(..));
                for r in dropped {
                    log.evicted.insert(r.cluster.clone(), r.offset);
                }
                log.bytes = 0;
                log.evicted.insert(ALL_CLUSTERS.into(), offset - 1);
                log.base = offset;
                // What the dropped records carried is unseen: predecessors are unknown now.
                chain.seen_from = offset;
                chain.last.clear();
            }
            // A record of a newer format is neither skipped nor taken for damage: the tail
            // stops before it and this replica refuses to go on (its hub exits, naming both
            // formats; the record stays in the stream for the release that reads it).
            if let Err(found) = readable_mark(msg.headers.as_ref().and_then(|h| h.get(H_FORMAT)).map(|v| v.as_str())) {
                let _ = self.refuse_newer(newer_format(&format!("the record at offset {offset}"), &found));
                refused = true;
                break;
            }
            end = offset + 1;
            let time_ms = msg.published_ms.unwrap_or(now);
            match decode(&self.stream, &msg, offset, time_ms) {
                Ok(mut rec) => {
                    let header = |name| msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str());
                    let (prev, known) = (header(H_PREV), header(H_KNOWN));
                    // A marker that does not follow already asks for what a replacement would.
                    if let Err(why) = chain.follow(&rec.cluster, prev, known, (rec.epoch, rec.seq), offset)
                        && matches!(rec.body, RecordBody::Event(_))
                    {
                        tracing::warn!(stream = %self.stream, cluster = %rec.cluster, offset, why, "a record does not follow its cluster's latest one: delivered as resync-required");
                        rec.body = RecordBody::ResyncRequired(format!("offset {offset}: {why}"));
                    }
                    new_heads.push((rec.cluster.clone(), Head { epoch: rec.epoch, seq: rec.seq, offset }));
                    records.push(Arc::new(rec));
                }
                Err(why) => {
                    tracing::warn!(stream = %self.stream, offset, "skipping a message that is not a fleetwatch record: {why}")
                }
            }
        }
        let log_heads: Vec<_> = new_heads.iter().map(|(c, h)| (c.clone(), (h.epoch, h.seq))).collect();
        log.publish(records, end, log_heads, &self.retention, now);
        drop(chain);
        drop(log);
        for (c, h) in new_heads {
            self.note_head(&c, h);
        }
        self.core.announce(end);
        self.release_local();
        if refused {
            // Readers waiting for more read now and fail (see `adopt`).
            self.core.announce(u64::MAX);
        }
    }

    /// One identity's cursors and the entry's revision. An entry written for another bus
    /// (by a replica of the bus this one replaced, or of a bus begun under this one) reads
    /// as empty: its offsets mean nothing here, and its names count as lost (seed 9866: a
    /// replica flushed a cursor of the old bus into the new bus's bucket, and the subscriber
    /// resumed at that offset of the new bus, past its first records).
    async fn cursor_entry(&self, identity: &str) -> Result<(Cursors, Option<u64>), BusError> {
        let entry = self.cursors_kv.entry(&token(identity)).await.map_err(|e| self.cursor_err(identity, e))?;
        Ok(match entry {
            Some(e) if e.is_put => {
                let cursors = Cursors::parse(&e.value).map_err(|found| {
                    let what = format!("the durable cursors of {identity} in bucket {}", self.cursors_bucket);
                    self.refuse_newer(newer_format(&what, &found))
                })?;
                if cursors.bus.as_deref().is_some_and(|bus| bus != self.stream_id) {
                    (Cursors::default(), Some(e.revision))
                } else {
                    (cursors, Some(e.revision))
                }
            }
            Some(e) => (Cursors::default(), Some(e.revision)),
            None => (Cursors::default(), None),
        })
    }

    /// Whether names not in the cursor store may have existed: its meta entry says so, or
    /// is missing (the bucket was lost after this replica opened it).
    async fn names_lost(&self) -> Result<bool, BusError> {
        let meta = self.cursors_kv.get(META_KEY).await.map_err(|e| {
            BusError::Nats(NatsError::KeyValue {
                bucket: self.cursors_bucket.clone(),
                cause: format!("read the meta entry: {e}"),
            })
        })?;
        let meta = meta.and_then(|m| serde_json::from_slice::<Meta>(&m).ok());
        self.lost_names_begun.store(meta.is_some_and(|m| m.begun_after_wait), Ordering::Relaxed);
        Ok(meta.is_none_or(|m| m.names_lost))
    }

    fn cursor_err(&self, identity: &str, e: impl std::fmt::Display) -> BusError {
        BusError::Nats(NatsError::KeyValue {
            bucket: self.cursors_bucket.clone(),
            cause: format!("cursors of {identity}: {e}"),
        })
    }

    /// Changes one identity's cursors with compare-and-set.
    async fn update_cursors(
        &self,
        identity: &str,
        change: impl Fn(&mut Cursors) -> Result<(), DurableError>,
    ) -> Result<(), BusError> {
        for _ in 0..CAS_ATTEMPTS {
            // An entry of another bus reads as empty (see `cursor_entry`) and is written
            // over with this bus's: whichever replica serves the bus that is gone stops once
            // its probe finds the other (a refusal here kept a replica of the new bus from
            // registering a durable name at all: seed 1593).
            let (mut names, revision) = self.cursor_entry(identity).await?;
            change(&mut names)?;
            names.bus = Some(self.stream_id.clone());
            let value: bytes::Bytes = serde_json::to_vec(&names).unwrap_or_default().into();
            let key = token(identity);
            let written = match revision {
                Some(rev) => self.cursors_kv.update(&key, value, rev).await.map(|_| ()).map_err(|e| e.to_string()),
                None => self.cursors_kv.create(&key, value).await.map(|_| ()).map_err(|e: CreateError| e.to_string()),
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!(identity, error = %e, "cursor entry changed meanwhile; retrying"),
            }
        }
        Err(self.cursor_err(identity, "kept changing on every attempt"))
    }
}

fn check_name(name: &str) -> Result<(), DurableError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(DurableError::NameTooLong { len: name.len() });
    }
    Ok(())
}

fn decode(stream: &str, msg: &Delivered, offset: u64, time_ms: u64) -> Result<Record, String> {
    let t = msg.subject.as_str().strip_prefix(stream).and_then(|s| s.strip_prefix('.')).ok_or("foreign subject")?;
    let cluster = untoken(t).ok_or("undecodable cluster token")?;
    let headers = msg.headers.as_ref().ok_or("no headers")?;
    let num = |h: &str| -> Result<u64, String> {
        headers.get(h).ok_or(format!("no {h}"))?.as_str().parse().map_err(|e| format!("{h}: {e}"))
    };
    let (epoch, seq) = (num(H_EPOCH)?, num(H_SEQ)?);
    let body = match headers.get(H_KIND).map(|v| v.as_str()) {
        Some(KIND_EVENT) => RecordBody::Event(msg.payload.clone()),
        Some(KIND_RESYNC) => RecordBody::ResyncRequired(String::from_utf8_lossy(&msg.payload).into_owned()),
        other => return Err(format!("unknown kind {other:?}")),
    };
    Ok(Record { offset, cluster: cluster.into(), epoch, seq, time_ms, body })
}

/// FNV-1a, 64 bits: a stable digest for message ids (the same in every replica and
/// release, unlike the standard library's hasher).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3))
}

/// Keeps the later (by offset) of `h` and what `heads` has for the cluster.
fn keep_latest(heads: &mut HashMap<Arc<str>, Head>, cluster: &Arc<str>, h: Head) {
    let entry = heads.entry(cluster.clone()).or_insert(h);
    if h.offset > entry.offset {
        *entry = h;
    }
}

/// The head a stored record stands for, from its `Fw-Epoch` and `Fw-Seq` headers.
fn head_from_headers(headers: &HeaderMap, offset: u64) -> Option<Head> {
    let num = |h: &str| headers.get(h)?.as_str().parse::<u64>().ok();
    Some(Head { epoch: num(H_EPOCH)?, seq: num(H_SEQ)?, offset })
}

async fn connect(opts: &NatsOptions) -> Result<(async_nats::Client, String), NatsError> {
    if opts.servers.is_empty() {
        return Err(NatsError::Settings("no NATS server given".into()));
    }
    let mut addrs = Vec::new();
    for s in &opts.servers {
        let addr: ServerAddr = s.parse().map_err(|e| NatsError::Settings(format!("server address {s:?}: {e}")))?;
        addrs.push(addr);
    }
    // Shown in errors and logs without a password.
    let servers =
        addrs.iter().map(|a| format!("{}://{}:{}", a.scheme(), a.host(), a.port())).collect::<Vec<_>>().join(",");
    let mut o = async_nats::ConnectOptions::new()
        .name("fleetwatch-hub")
        .connection_timeout(REQUEST_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(2u64.saturating_pow(u32::try_from(attempts).unwrap_or(u32::MAX)))
                .min(RECONNECT_DELAY_MAX)
        });
    // nats://USER:PASSWORD@HOST:PORT: the client library does not read them from the URL.
    if let Some(a) = addrs.iter().find(|a| a.has_user_pass()) {
        o = o.user_and_password(a.username().unwrap_or_default().into(), a.password().unwrap_or_default().into());
    }
    if let Some(path) = &opts.creds {
        o = o
            .credentials_file(path)
            .await
            .map_err(|e| NatsError::Credentials { path: path.clone(), cause: e.to_string() })?;
    }
    for p in [&opts.tls_cert, &opts.tls_key, &opts.tls_ca].into_iter().flatten() {
        std::fs::metadata(p).map_err(|e| NatsError::Settings(format!("cannot read {}: {e}", p.display())))?;
    }
    match (&opts.tls_cert, &opts.tls_key) {
        (Some(c), Some(k)) => o = o.add_client_certificate(c.clone(), k.clone()).require_tls(true),
        (None, None) => {}
        _ => return Err(NatsError::Settings("--bus-tls-cert and --bus-tls-key go together".into())),
    }
    if let Some(ca) = &opts.tls_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    let client =
        o.connect(addrs).await.map_err(|e| NatsError::Connect { servers: servers.clone(), cause: e.to_string() })?;
    Ok((client, servers))
}

/// The stream this hub wants (a fresh one's description; a recreated one states its
/// lineage instead).
pub(super) fn wanted_spec(opts: &NatsOptions) -> StreamSpec {
    let age = opts.retention.age.unwrap_or(Duration::ZERO);
    let window = if age.is_zero() { DUPLICATE_WINDOW } else { DUPLICATE_WINDOW.min(age) };
    StreamSpec {
        name: opts.stream.clone(),
        description: nats_state::describe(None),
        max_messages: i64::try_from(opts.retention.records).unwrap_or(i64::MAX),
        max_bytes: i64::try_from(opts.retention.bytes).unwrap_or(i64::MAX),
        max_age: age,
        replicas: opts.replicas,
        duplicate_window: window,
    }
}

/// The stream's configuration as async-nats takes it.
#[cfg(test)]
pub(super) fn wanted_config(opts: &NatsOptions) -> async_nats::jetstream::stream::Config {
    wanted_spec(opts).config()
}

/// Creates the stream, or checks that the existing one has our settings; answers with
/// whether the bus was begun after a wait for a missing stream: this hub waited (and
/// created the stream then, or found the one another replica created meanwhile), or the
/// stream's description says its creator did.
async fn ensure_stream<J: JetStream>(js: &J, opts: &NatsOptions) -> Result<(StreamInfo, bool), NatsError> {
    let want = wanted_spec(opts);
    let stream_err = |cause: String| NatsError::Stream { stream: opts.stream.clone(), cause };
    let deadline = tokio::time::Instant::now() + opts.missing_stream_wait;
    let mut found = js.stream_info().await;
    // Missing at first and waited for: a stream found afterwards may be a new bus another
    // replica began after waiting too, and answers as if this one had begun it (seed 10841:
    // two replicas started together after JetStream lost its store; the one that found the
    // other's new stream wrote the cursor store's meta entry first, saying no names were
    // lost, and a durable subscriber returning from `latest` was placed at the end).
    let waited = matches!(found, Err(JsError::NotFound)) && !opts.missing_stream_wait.is_zero();
    while matches!(found, Err(JsError::NotFound)) && tokio::time::Instant::now() < deadline {
        tracing::info!(stream = %opts.stream, wait = ?opts.missing_stream_wait, "no JetStream stream: waiting for a running hub replica to recreate it (NATS may have lost its store) before creating a new bus");
        tokio::time::sleep(Duration::from_millis(250)).await;
        found = js.stream_info().await;
    }
    match found {
        Ok(info) => {
            let diffs = info.settings.differences(&want.settings());
            if diffs.is_empty() {
                // A new bus its creator began after waiting for a missing stream answers so
                // here too, though this hub found it at once: the cursor store's meta entry
                // is written by whichever replica comes first (seed 15240: a replica
                // restarted while another waited found the stream the other had just
                // created, wrote the meta entry first saying no names were lost, and a
                // durable subscriber coming back from `latest` was placed at the new bus's
                // end as a new name, past the changes agents resent into it).
                let begun = info.description.as_deref().is_some_and(nats_state::begun_after_wait);
                Ok((info, waited || begun))
            } else {
                Err(NatsError::Conflict { stream: opts.stream.clone(), what: diffs.join("; ") })
            }
        }
        Err(JsError::NotFound) => {
            let after_wait = !opts.missing_stream_wait.is_zero();
            let mut spec = want;
            if after_wait {
                // Said in the description, created with the stream in one step, so every
                // replica that finds this bus knows it (see above).
                spec.description = nats_state::describe_begun_after_wait();
            }
            let info = js.create_stream(&spec).await.map_err(|e| stream_err(format!("cannot create: {e}")))?;
            Ok((info, after_wait))
        }
        Err(e) => Err(stream_err(format!("{e} (is JetStream enabled on the server?)"))),
    }
}

async fn ensure_bucket<J: JetStream>(
    js: &J,
    bucket: &str,
    replicas: usize,
    max_age: Duration,
) -> Result<J::Kv, NatsError> {
    let window = if max_age.is_zero() { DUPLICATE_WINDOW } else { DUPLICATE_WINDOW.min(max_age) };
    js.bucket(bucket, replicas, max_age, window)
        .await
        .map_err(|cause| NatsError::KeyValue { bucket: bucket.into(), cause })
}

async fn load_heads<K: KeyValue>(store: &K, bucket: &str) -> Result<HashMap<Arc<str>, Head>, NatsError> {
    let err = |cause: String| NatsError::KeyValue { bucket: bucket.into(), cause };
    let names = store.keys().await.map_err(|e| err(format!("cannot list heads: {e}")))?;
    let mut heads = HashMap::new();
    for key in names {
        let Some(cluster) = untoken(&key) else { continue };
        if let Some(v) = store.get(&key).await.map_err(|e| err(format!("cannot read head {key}: {e}")))? {
            match parse_head(&v) {
                Ok(Some(h)) => {
                    heads.insert(Arc::from(cluster), h);
                }
                Ok(None) => {}
                Err(found) => return Err(err(newer_format(&format!("the head of cluster {cluster}"), &found))),
            }
        }
    }
    Ok(heads)
}

/// How long the local tail may make no progress while the stream has more before its
/// consumer is recreated.
const TAIL_STALL: Duration = Duration::from_secs(5);

/// Feeds the local tail from the ordered consumer, in batches of what is already there.
/// The consumer recreates itself after most failures; as a backstop (a consumer lost with
/// a JetStream node, a recreation that hangs), one that makes no progress for
/// [`TAIL_STALL`] while the stream has more is replaced from the local end.
async fn follow<J: JetStream>(bus: Weak<NatsBus<J>>, mut messages: J::Messages, generation: u64) {
    let mut check = tokio::time::interval(Duration::from_secs(1));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled: Option<(tokio::time::Instant, u64)> = None;
    loop {
        let first = tokio::select! {
            next = messages.next() => next,
            _ = check.tick() => {
                let Some(bus) = bus.upgrade() else { return };
                let end = bus.core.log.read().map(|l| l.end).unwrap_or(0);
                if bus.stream_last.load(Ordering::Relaxed) < end {
                    stalled = None;
                    continue;
                }
                match stalled {
                    Some((since, at)) if at == end && since.elapsed() >= TAIL_STALL => {
                        tracing::warn!(stream = %bus.stream, end, "the local tail made no progress while the stream has more: recreating its consumer");
                        let from = end.saturating_sub(bus.base.load(Ordering::SeqCst)).max(1);
                        match bus.js.ordered(from).await {
                            Ok(m) => messages = m,
                            Err(e) => tracing::warn!(error = %e, "cannot recreate the local tail's consumer; retrying"),
                        }
                        stalled = None;
                    }
                    Some((_, at)) if at == end => {}
                    _ => stalled = Some((tokio::time::Instant::now(), end)),
                }
                continue;
            }
        };
        let mut batch = Vec::new();
        let mut next = first;
        let mut ended = false;
        loop {
            match next {
                Some(Ok(m)) => batch.push(m),
                Some(Err(e)) => tracing::warn!(error = %e, "local tail consumer interrupted; it resumes where it was"),
                None => {
                    ended = true;
                    break;
                }
            }
            if batch.len() >= 1024 {
                break;
            }
            match messages.next().now_or_never() {
                Some(n) => next = n,
                None => break,
            }
        }
        let Some(bus) = bus.upgrade() else { return };
        if !batch.is_empty() {
            bus.ingest(batch, generation);
        }
        if ended {
            // The subscription closed: start a new consumer from the local end.
            let end = bus.core.log.read().map(|l| l.end).unwrap_or(0);
            let from = end.saturating_sub(bus.base.load(Ordering::SeqCst)).max(1);
            match bus.js.ordered(from).await {
                Ok(m) => messages = m,
                Err(e) => {
                    *lock(&bus.unhealthy) = Some(format!("the local tail of stream {} stopped: {e}", bus.stream));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// Checks every second (and at once when an ack showed the stream went backwards) that
/// the connection is up and the stream answers; recreates the stream when JetStream lost
/// it, and takes on one another replica recreated (see [`NatsBus::recreate`]).
async fn probe<J: JetStream>(bus: Weak<NatsBus<J>>, recheck: Arc<tokio::sync::Notify>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when probes in a row found no stream: a moment alone may be a server still
    // starting up.
    let mut missing: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = recheck.notified() => {}
        }
        let Some(bus) = bus.upgrade() else { return };
        let verdict = if let Some(state) = bus.js.disconnected() {
            missing = None;
            Some(format!("not connected to NATS at {} ({state})", bus.js.servers()))
        } else {
            match tokio::time::timeout(REQUEST_TIMEOUT, bus.js.stream_info()).await {
                Ok(Ok(info)) => {
                    missing = None;
                    if info.created_ns != *lock(&bus.created) {
                        bus.adopt(info).await.err().map(|e| e.to_string())
                    } else {
                        let base = bus.base.load(Ordering::SeqCst);
                        bus.stream_last.fetch_max(info.state.last_sequence + base, Ordering::Relaxed);
                        *lock(&bus.stream_state) = StreamState::of(&info.state, base);
                        None
                    }
                }
                Ok(Err(JsError::NotFound)) => {
                    let since = *missing.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() < MISSING_CONFIRM {
                        Some(format!("JetStream stream {} does not exist (did NATS lose its store?)", bus.stream))
                    } else {
                        bus.recreate().await.err().map(|e| e.to_string())
                    }
                }
                Ok(Err(e)) => {
                    missing = None;
                    Some(format!("JetStream stream {} does not answer: {e}", bus.stream))
                }
                Err(_) => Some(format!("JetStream stream {} does not answer within {REQUEST_TIMEOUT:?}", bus.stream)),
            }
        };
        let mut unhealthy = lock(&bus.unhealthy);
        if *unhealthy != verdict {
            match &verdict {
                Some(cause) => tracing::warn!(%cause, "bus not ready"),
                None => tracing::info!(stream = %bus.stream, "JetStream reachable again"),
            }
            *unhealthy = verdict;
        }
    }
}

/// How long the stream must be found missing before it is recreated.
const MISSING_CONFIRM: Duration = Duration::from_secs(1);

/// The reason of the `resync-required` `*` recorded in a recreated stream.
pub const RECREATED: &str = "the JetStream stream was recreated empty";

/// Which bus the stream continues: its description's lineage, or (a stream created fresh)
/// a new bus id from its creation time with offsets equal to stream sequences.
fn lineage_of(stream: &str, info: &StreamInfo) -> Lineage {
    info.description
        .as_deref()
        .and_then(nats_state::parse_lineage)
        .unwrap_or_else(|| Lineage { id: format!("{stream}-{:x}", info.created_ns), base: 0 })
}

/// Writes the meta entry of a cursor bucket this hub just opened, unless it has one.
/// Refuses a bus a newer release keeps in another format (the cursors bucket's meta entry
/// says which): a rolled-back hub must not read it as its own. Reads only.
async fn check_format<K: KeyValue>(store: &K, bucket: &str) -> Result<(), NatsError> {
    let meta = store
        .get(META_KEY)
        .await
        .map_err(|e| NatsError::KeyValue { bucket: bucket.into(), cause: format!("read the meta entry: {e}") })?;
    let format = meta.and_then(|m| serde_json::from_slice::<Meta>(&m).ok()).map_or(NATS_FORMAT, |m| m.format);
    if format > NATS_FORMAT {
        let cause = format!(
            "the bus is kept in format {format}, newer than this hub's {NATS_FORMAT} (fleetwatch {}): run a release \
             that reads it (docs/upgrade.md); this hub does not use it",
            env!("CARGO_PKG_VERSION")
        );
        return Err(NatsError::KeyValue { bucket: bucket.into(), cause });
    }
    Ok(())
}

async fn ensure_meta<K: KeyValue>(store: &K, bucket: &str, meta: Meta) -> Result<(), NatsError> {
    let value = serde_json::to_vec(&meta).unwrap_or_default();
    match store.create(META_KEY, value.into()).await {
        Ok(_) => {
            // A store lost under a bus with history is news; a bus begun after the wait is
            // also every first start.
            if meta.begun_after_wait {
                tracing::info!(
                    bucket,
                    "this hub began the bus after waiting for a missing stream (a first start, or JetStream lost its store while no hub replica ran): a durable subscriber whose name is not found gets resync-required * at its first subscription"
                );
            } else if meta.names_lost {
                tracing::warn!(
                    bucket,
                    "the durable cursor store was recreated while the bus had history: a durable subscriber whose name is not found gets resync-required *"
                );
            }
            Ok(())
        }
        Err(CreateError::AlreadyExists) => Ok(()),
        Err(e) => Err(NatsError::KeyValue { bucket: bucket.into(), cause: format!("write the meta entry: {e}") }),
    }
}

/// Evicts by age once a second, so old records go without new appends.
async fn age_retention<J: JetStream>(bus: Weak<NatsBus<J>>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        let Some(bus) = bus.upgrade() else { return };
        if bus.retention.age.is_some()
            && let Ok(mut log) = bus.core.log.write()
        {
            let end = log.end;
            log.publish(Vec::new(), end, None, &bus.retention, retention::now_ms());
        }
    }
}

impl<J: JetStream> Bus for NatsBus<J> {
    fn stream_id(&self) -> &str {
        &self.stream_id
    }

    fn is_durable(&self) -> bool {
        self.durable
    }

    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64> {
        Box::pin(async move { self.start_inner(cluster, items).await?.await })
    }

    fn start_append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, BusFuture<'_, u64>> {
        Box::pin(self.start_inner(cluster, items))
    }

    fn head<'a>(&'a self, cluster: &'a str) -> BusFuture<'a, Option<(u64, u64)>> {
        Box::pin(async move { Ok(self.head_of(cluster).await?.map(|h| (h.epoch, h.seq))) })
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

    fn first_offset(&self) -> u64 {
        if self.holds_records() { self.core.first_offset() } else { lock(&self.stream_state).first }
    }

    fn last_offset(&self) -> u64 {
        if self.holds_records() { self.core.last_offset() } else { self.stream_last.load(Ordering::Relaxed) }
    }

    fn watch_end(&self) -> watch::Receiver<u64> {
        self.core.end_tx.subscribe()
    }

    fn lost_cursor_reason(&self, name: &str) -> String {
        if self.lost_names_begun.load(Ordering::Relaxed) {
            format!(
                "durable subscription {name:?} is not known to this bus, which a hub began after JetStream had no stream for it (a first start, or JetStream lost its store while no hub replica ran): it may have been read before"
            )
        } else {
            format!("the hub lost its durable cursor store: where durable subscription {name:?} stopped is unknown")
        }
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

    fn flush_cursors(&self) -> BusFuture<'_, ()> {
        Box::pin(async move {
            self.flush_heads().await?;
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
        })
    }

    fn is_shared(&self) -> bool {
        true
    }

    fn share_clusters<'a>(&'a self, replica: &'a str, clusters: serde_json::Value) -> BusFuture<'a, ()> {
        Box::pin(async move {
            let value = serde_json::to_vec(&clusters).unwrap_or_default();
            self.replicas_kv.put(&token(replica), value.into()).await.map(|_| ()).map_err(|e| {
                BusError::Nats(NatsError::KeyValue {
                    bucket: self.replicas_bucket.clone(),
                    cause: format!("share the clusters of {replica}: {e}"),
                })
            })
        })
    }

    fn shared_clusters<'a>(&'a self, replica: &'a str) -> BusFuture<'a, Vec<(String, serde_json::Value)>> {
        Box::pin(async move {
            let err =
                |e: String| BusError::Nats(NatsError::KeyValue { bucket: self.replicas_bucket.clone(), cause: e });
            let keys = self.replicas_kv.keys().await.map_err(err)?;
            let mut out = Vec::new();
            let own = token(replica);
            for key in keys {
                if key == own {
                    continue;
                }
                let Some(name) = untoken(&key) else { continue };
                if let Some(v) = self.replicas_kv.get(&key).await.map_err(err)?
                    && let Ok(clusters) = serde_json::from_slice(&v)
                {
                    out.push((name, clusters));
                }
            }
            Ok(out)
        })
    }

    fn eviction_reason(&self, offset: u64) -> &'static str {
        let base = self.offset_base();
        if base > 0 && offset <= base {
            // Offsets of the stream before it was recreated: gone with it, not aged out.
            "events were lost when the JetStream stream was recreated empty, before this subscriber read them"
        } else {
            "events were evicted from the hub before this subscriber read them"
        }
    }

    fn lost_history_reason(&self) -> &'static str {
        "the hub's event history was lost: the JetStream stream was recreated empty (this subscriber's cursor is \
         of an earlier stream)"
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

    fn write_failures(&self) -> u64 {
        self.write_failures.load(Ordering::Relaxed)
    }

    fn retained(&self) -> usize {
        match self.holds_records() {
            true => self.core.retained(),
            false => usize::try_from(lock(&self.stream_state).messages).unwrap_or(usize::MAX),
        }
    }

    fn holds_records(&self) -> bool {
        self.tail_ready.load(Ordering::Acquire)
    }

    fn retained_bytes(&self) -> u64 {
        if self.holds_records() { self.core.retained_bytes() } else { lock(&self.stream_state).bytes }
    }
}

#[cfg(test)]
mod unit {
    use super::*;

    #[test]
    fn tokens_round_trip_and_stay_subject_safe() {
        for name in ["prod-eu-1", "a.b", "*", "x y", "=plain", "é"] {
            let t = token(name);
            assert!(!t.contains('.') && !t.contains('*') && !t.contains('>') && !t.contains(' '), "{t}");
            assert_eq!(untoken(&t).as_deref(), Some(name));
        }
        assert_eq!(token("prod-eu-1"), "prod-eu-1");
    }

    #[test]
    fn a_record_follows_only_the_latest_one_its_tail_saw() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1 };
        assert_eq!(chain.follow(&c, Some("-"), None, (1, 1), 1), Ok(()), "the first record of a cluster");
        assert_eq!(chain.follow(&c, Some("1/1"), None, (1, 2), 2), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/3"), None, (1, 4), 3), Err(BROKEN), "3 is missing");
        assert_eq!(chain.follow(&c, Some("1/4"), None, (1, 5), 4), Ok(()), "it took 4's place");
        assert_eq!(chain.follow(&c, None, None, (1, 9), 5), Ok(()), "a record of a hub that did not say");
        assert_eq!(
            chain.follow(&c, Some("-"), None, (2, 1), 6),
            Err(BROKEN),
            "its publisher missed the cluster's records"
        );
        assert_eq!(chain.follow(&c, Some("2/1"), None, (3, 1), 7), Ok(()), "epochs change within a chain");
        assert_eq!(chain.follow(&c, Some("garbage"), None, (3, 2), 8), Err(BROKEN));
        let d: Arc<str> = "d".into();
        assert_eq!(chain.follow(&d, Some("1/1"), None, (1, 2), 9), Err(BROKEN), "a predecessor never seen");
        assert_eq!(
            chain.follow(&c, Some("3/1@7"), None, (3, 3), 10),
            Err(BROKEN),
            "an offset does not excuse a gap seen"
        );
        let mut partial = Chain { last: HashMap::new(), seen_from: 10 };
        assert_eq!(partial.follow(&d, Some("1/1"), None, (1, 2), 11), Err(UNKNOWN), "a predecessor evicted unseen");
        let e: Arc<str> = "e".into();
        assert_eq!(partial.follow(&e, Some("1/1@9"), None, (1, 2), 12), Ok(()), "stored below what the tail saw");
        let f: Arc<str> = "f".into();
        assert_eq!(partial.follow(&f, Some("1/1@10"), None, (1, 2), 13), Err(UNKNOWN), "where the tail looked");
        assert_eq!(partial.follow(&c, Some("-"), None, (1, 1), 14), Ok(()));
        // Records sent late: older than the latest of their agent process.
        let g: Arc<str> = "g".into();
        let mut late = Chain { last: HashMap::new(), seen_from: 1 };
        assert_eq!(late.follow(&g, Some("-"), None, (5, 1), 15), Ok(()));
        assert_eq!(late.follow(&g, Some("5/1"), None, (5, 2), 16), Ok(()));
        assert_eq!(late.follow(&g, Some("5/2"), None, (5, 3), 17), Ok(()));
        assert_eq!(late.follow(&g, Some("5/1"), None, (5, 2), 18), Err(STALE), "2 again, after 3");
        assert_eq!(late.follow(&g, Some("5/2"), None, (5, 3), 19), Err(STALE), "and what followed it");
        assert_eq!(late.follow(&g, Some("5/3"), None, (5, 4), 20), Ok(()), "3 is still the latest");
    }

    /// Seed 172 of the simulation: publishes of a second agent process kept while its
    /// replica's link to JetStream was cut, stored after newer records of the first.
    #[test]
    fn a_record_sent_before_another_agent_process_stored_newer_ones_is_late() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1 };
        assert_eq!(chain.follow(&c, Some("-"), Some("0"), (1, 1), 1), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/1"), Some("0"), (1, 2), 2), Ok(()), "in flight with the first");
        assert_eq!(chain.follow(&c, Some("1/2@2"), Some("2"), (2, 1), 3), Ok(()), "a second process after the first");
        assert_eq!(chain.follow(&c, Some("2/1"), Some("2"), (2, 2), 4), Ok(()), "its records in flight");
        // The second one's replica loses its link: 2/3 and 2/4 wait in its client, sent
        // when the stream's end it knew was 4; the first process appends meanwhile.
        assert_eq!(chain.follow(&c, Some("2/2@4"), Some("4"), (1, 3), 5), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/3"), Some("4"), (1, 4), 6), Ok(()));
        assert_eq!(chain.follow(&c, Some("2/2@4"), Some("4"), (2, 3), 7), Err(BROKEN), "the first late one");
        assert_eq!(chain.follow(&c, Some("2/3"), Some("4"), (2, 4), 8), Err(LATE), "follows it, sent before 5 and 6");
        assert_eq!(chain.follow(&c, Some("1/4@6"), Some("8"), (1, 5), 9), Err(BROKEN), "2/4 took the latest's place");
        assert_eq!(chain.follow(&c, Some("1/5"), Some("8"), (1, 6), 10), Ok(()), "sent after 2/4 was stored");
        // After the hole of a partly stored batch of one process the records stay events.
        assert_eq!(chain.follow(&c, Some("1/7"), Some("8"), (1, 8), 11), Err(BROKEN), "7 is missing");
        assert_eq!(chain.follow(&c, Some("1/8"), Some("8"), (1, 9), 12), Ok(()), "nothing of another process after 8");
        // A new process whose replica knew less than the last one stored: late only until
        // its acks are in.
        assert_eq!(chain.follow(&c, Some("1/6@10"), Some("10"), (3, 1), 13), Err(BROKEN), "1/8, 1/9 unseen");
        assert_eq!(chain.follow(&c, Some("3/1"), Some("10"), (3, 2), 14), Err(LATE), "in flight with it");
        assert_eq!(chain.follow(&c, Some("3/2@14"), Some("14"), (3, 3), 15), Ok(()), "once its acks were in");
        // Where the tail did not look, it cannot tell.
        let d: Arc<str> = "d".into();
        let mut partial = Chain { last: HashMap::new(), seen_from: 10 };
        assert_eq!(partial.follow(&d, Some("1/1@5"), Some("5"), (1, 2), 11), Err(UNCHECKED), "6 to 9 unseen");
        assert_eq!(partial.follow(&d, Some("1/2"), Some("9"), (1, 3), 12), Ok(()), "everything after 9 seen");
        assert_eq!(partial.follow(&d, Some("1/3"), Some("13"), (1, 4), 13), Err(UNCHECKED), "an end beyond itself");
        assert_eq!(partial.follow(&d, Some("1/4"), Some("x"), (1, 5), 14), Err(UNCHECKED));
    }

    /// Seed 7056 of the simulation: a session the second agent process had left took its
    /// record in late, after that process's newer records through another replica and the
    /// first process's after them; it named the latest (the first process's) and followed
    /// it, but is older than what its own process had stored.
    #[test]
    fn a_record_older_than_its_process_stored_behind_another_process_is_stale() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1 };
        assert_eq!(chain.follow(&c, Some("-"), Some("0"), (1, 1), 1), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/1@1"), Some("1"), (2, 1), 2), Ok(()));
        assert_eq!(chain.follow(&c, Some("2/1"), Some("2"), (2, 5), 3), Ok(()), "2/2..2/4 through another replica");
        assert_eq!(chain.follow(&c, Some("2/5@3"), Some("3"), (1, 2), 4), Ok(()), "the first process again");
        assert_eq!(chain.follow(&c, Some("1/2@4"), Some("4"), (2, 3), 5), Err(STALE), "older than 2/5");
        assert_eq!(chain.follow(&c, Some("1/2@4"), Some("5"), (1, 3), 6), Ok(()), "1/2 is still the latest");
        assert_eq!(chain.follow(&c, Some("1/3@6"), Some("6"), (2, 6), 7), Ok(()), "newer than 2/5");
    }
}
