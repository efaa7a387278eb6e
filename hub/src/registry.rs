//! The hub's one session registry: every authenticated connection (agents and
//! subscribers, so a revoked or expired certificate can be closed wherever it is used),
//! and what the hub knows about each cluster, connected or not, and which session serves
//! it.
//!
//! One session per cluster id. When a hello arrives for a cluster that already has a live
//! session, the rule is:
//! - same agent epoch: it is the same agent process reconnecting (after a network cut the
//!   hub may still hold the dead connection): the new session replaces the old one;
//! - another epoch, and the live session heard from its peer (any frame, pongs included)
//!   within the stale window (two ping intervals): another agent process uses this
//!   cluster id. The live session wins; the newcomer is refused with
//!   `cluster-already-connected`, counted, and shown in `/api/v1/clusters`;
//! - another epoch, but the live session has been silent longer than the stale window: it
//!   missed at least one ping round, so it is presumed dead and replaced (an agent
//!   restarted elsewhere while its old connection was half-open).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_protocol::message::{ModuleInventory, WatchState};
use tokio_util::sync::CancellationToken;

use crate::cluster::{ClusterStatus, RECENT_EVENT_BYTES, RECENT_EVENTS, RecentEvent};
use crate::peer::Peer;
use crate::rate::Budget;

/// When a connection last received a frame (data, ping or pong), readable from other
/// tasks: the registry asks it whether a cluster's live session is really alive.
#[derive(Debug)]
pub(crate) struct Liveness {
    base: tokio::time::Instant,
    last_ms: AtomicU64,
}

impl Liveness {
    /// Heard from just now.
    pub(crate) fn new() -> Self {
        Self { base: tokio::time::Instant::now(), last_ms: AtomicU64::new(0) }
    }

    /// Records that a frame arrived.
    pub(crate) fn touch(&self) {
        self.last_ms.store(self.base.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// How long since the last frame arrived.
    pub(crate) fn silent_for(&self) -> Duration {
        let last = Duration::from_millis(self.last_ms.load(Ordering::Relaxed));
        self.base.elapsed().saturating_sub(last)
    }

    /// When the last frame arrived on the wall clock, `now` being the wall clock's now.
    pub(crate) fn last_heard(&self, now: jiff::Timestamp) -> jiff::Timestamp {
        let silent = jiff::SignedDuration::try_from(self.silent_for()).unwrap_or(jiff::SignedDuration::MAX);
        now.checked_sub(silent).unwrap_or(jiff::Timestamp::MIN)
    }
}

impl Default for Liveness {
    fn default() -> Self {
        Self::new()
    }
}

/// A cluster's recent events, newest last, bounded by [`RECENT_EVENTS`] and
/// [`RECENT_EVENT_BYTES`]: the oldest go first.
#[derive(Debug, Default)]
struct RecentRing {
    events: VecDeque<RecentEvent>,
    bytes: usize,
}

impl RecentRing {
    fn push(&mut self, e: RecentEvent) {
        self.bytes += e.bytes();
        if self.events.capacity() == 0 {
            // Room for one to start with (a `VecDeque` takes four): most clusters of an idle
            // fleet have one or two recent events, and every cluster keeps its ring.
            self.events.reserve_exact(1);
        }
        self.events.push_back(e);
        while self.events.len() > RECENT_EVENTS || self.bytes > RECENT_EVENT_BYTES {
            match self.events.pop_front() {
                Some(old) => self.bytes -= old.bytes(),
                None => break,
            }
        }
    }
}

/// The live session of a cluster.
struct Live {
    epoch: u64,
    cancel: CancellationToken,
    liveness: Arc<Liveness>,
}

impl Entry {
    /// When the hub last heard from the cluster's agent: what the registry recorded (the
    /// session's start, its last ack, the end of its last session) or, later, the live
    /// connection's last frame of any kind (pongs and pings included).
    ///
    /// Read from the connection's [`Liveness`] when asked (admin API, `/metrics`, the
    /// replica share) instead of written on every frame: an idle agent answering pings
    /// stays seen, and the hot path pays nothing for it (one relaxed atomic store per frame
    /// that the connection makes anyway; no registry lock, however many agents).
    fn last_seen(&self, now: jiff::Timestamp) -> Option<jiff::Timestamp> {
        let heard = self.live.as_ref().map(|l| l.liveness.last_heard(now));
        self.status.last_seen.max(heard)
    }

    /// The status as the admin API shows it (with the live [`Entry::last_seen`]).
    fn shown(&self, now: jiff::Timestamp) -> ClusterStatus {
        ClusterStatus { last_seen: self.last_seen(now), ..self.status.clone() }
    }
}

struct Entry {
    status: ClusterStatus,
    live: Option<Live>,
    /// The last resync marker this hub stored for the cluster: while it is the cluster's
    /// head in the bus and no subscriber was sent or placed past it, another one adds
    /// nothing (coalescing, see [`SessionRegistry::resync_pending`]).
    last_resync: Option<StoredMarker>,
    /// The cluster's rate budget, kept across its sessions.
    budget: Option<Arc<Mutex<Budget>>>,
    /// Its recent events.
    recent: RecentRing,
}

/// A `resync-required` marker this hub stored for a cluster: its (epoch, seq) and the
/// offset the bus answered for it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct StoredMarker {
    /// The epoch it carries.
    pub(crate) epoch: u64,
    /// The seq it carries.
    pub(crate) seq: u64,
    /// Its offset in the bus.
    pub(crate) offset: u64,
}

/// A new agent session as [`SessionRegistry::open`] sees it.
pub(crate) struct Opening<'a> {
    /// The session id.
    pub(crate) session: &'a str,
    /// The agent's address.
    pub(crate) remote: &'a str,
    /// The agent's version.
    pub(crate) agent_version: &'a str,
    /// The protocol version the session speaks.
    pub(crate) protocol: u32,
    /// The protocol versions the agent speaks.
    pub(crate) agent_protocols: fleetwatch_protocol::message::ProtocolRange,
    /// The agent's epoch.
    pub(crate) epoch: u64,
    /// Cancels the session (when replaced).
    pub(crate) cancel: CancellationToken,
    /// When the session's connection last heard from the agent.
    pub(crate) liveness: Arc<Liveness>,
}

/// The outcome of [`SessionRegistry::open`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum OpenOutcome {
    /// The session is the cluster's live one now.
    Opened {
        /// Why a previous session was replaced, if one was.
        replaced: Option<String>,
    },
    /// Another agent process is connected for this cluster and alive: refused.
    Conflict {
        /// The address of the live session.
        connected_from: String,
        /// Since when it is connected.
        since: Option<jiff::Timestamp>,
    },
}

/// Open connections, live sessions and per-cluster state. One session per cluster (see
/// the module doc).
#[derive(Default)]
pub(crate) struct SessionRegistry {
    /// Boxed: an entry is about 480 bytes, and a table keeps room for up to twice as many
    /// as it holds (and both tables while it grows); boxed, the spare room is 8 bytes each.
    clusters: Mutex<HashMap<String, Box<Entry>>>,
    /// Woken when a cluster connects or disconnects (the web view's live updates).
    changed: tokio::sync::Notify,
    /// Clusters whose shared entry changed (connect, disconnect, reports, conflicts): what
    /// the fleet state writes to a shared bus (`crate::fleet::state`).
    pub(crate) shared: crate::fleet::state::Changes,
    /// Every authenticated connection by id: who it is, and how to close it.
    connections: Mutex<HashMap<u64, (Peer, CancellationToken)>>,
    /// The highest bus offset any subscriber session of this hub was sent or placed at
    /// (only rises). A marker at or below it may have been consumed: never coalesced into.
    read_mark: AtomicU64,
}

/// An authenticated connection's place in the registry; leaving it removes the entry.
/// `R` reaches the registry: a reference, or an owner that a spawned session task keeps.
pub(crate) struct Connected<R: std::ops::Deref<Target = SessionRegistry>> {
    registry: R,
    id: u64,
}

impl<R: std::ops::Deref<Target = SessionRegistry>> Drop for Connected<R> {
    fn drop(&mut self) {
        if let Ok(mut map) = self.registry.connections.lock() {
            map.remove(&self.id);
        }
    }
}

impl SessionRegistry {
    /// Registers an authenticated connection of `peer`, closed through `token`, for as long
    /// as the returned guard lives.
    #[cfg(test)]
    pub(crate) fn connected(&self, peer: Peer, token: CancellationToken) -> Connected<&Self> {
        Self::connected_in(self, peer, token)
    }

    /// [`SessionRegistry::connected`] with the registry reached through `registry`, which the
    /// guard keeps (a session task's guard outlives the task that accepted it).
    pub(crate) fn connected_in<R: std::ops::Deref<Target = SessionRegistry>>(
        registry: R,
        peer: Peer,
        token: CancellationToken,
    ) -> Connected<R> {
        let id = rand::random::<u64>();
        if let Ok(mut map) = registry.connections.lock() {
            map.insert(id, (peer, token));
        }
        Connected { registry, id }
    }

    /// The open connections that are not being closed already.
    pub(crate) fn open_connections(&self) -> Vec<(Peer, CancellationToken)> {
        match self.connections.lock() {
            Ok(map) => map.values().filter(|(_, t)| !t.is_cancelled()).cloned().collect(),
            Err(_) => Vec::new(),
        }
    }

    /// Records the certificate the cluster's new session presented.
    pub(crate) fn certificate(&self, cluster: &str, serial: &str, not_after: jiff::Timestamp) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.cert_serial = Some(serial.into());
            e.status.cert_not_after = Some(not_after);
            self.shared.mark(cluster);
        }
    }

    /// Admits a new session for `cluster` by the rule in the module doc: replaces the live
    /// session of the same epoch or a stale one (silent for longer than `stale_after`),
    /// refuses it while another epoch's session is alive.
    pub(crate) fn open(&self, cluster: &str, new: Opening<'_>, stale_after: Duration) -> OpenOutcome {
        let Ok(mut map) = self.clusters.lock() else {
            // A poisoned registry cannot tell who is connected: refuse rather than guess.
            return OpenOutcome::Conflict { connected_from: "unknown (registry unavailable)".into(), since: None };
        };
        let e = map.entry(cluster.to_string()).or_insert_with(|| {
            Box::new(Entry {
                status: ClusterStatus { cluster: cluster.into(), ..ClusterStatus::default() },
                live: None,
                last_resync: None,
                budget: None,
                recent: RecentRing::default(),
            })
        });
        let mut replaced = None;
        if let Some(live) = &e.live {
            let silent = live.liveness.silent_for();
            let from = e.status.remote.clone().unwrap_or_default();
            if live.epoch == new.epoch {
                replaced = Some(format!(
                    "the same agent (epoch {}) reconnected; its old session from {from} is dropped",
                    new.epoch
                ));
            } else if silent > stale_after {
                replaced = Some(format!(
                    "the session of epoch {} from {from} was silent for {:.1}s (presumed dead)",
                    live.epoch,
                    silent.as_secs_f64()
                ));
            } else {
                e.status.conflicts += 1;
                e.status.last_conflict_from = Some(new.remote.into());
                e.status.last_conflict_at = Some(jiff::Timestamp::now());
                self.shared.mark(cluster);
                return OpenOutcome::Conflict { connected_from: from, since: e.status.connected_since };
            }
            live.cancel.cancel();
        }
        let now = jiff::Timestamp::now();
        e.live = Some(Live { epoch: new.epoch, cancel: new.cancel, liveness: new.liveness });
        e.status.connected = true;
        e.status.connected_since = Some(now);
        e.status.session = Some(new.session.into());
        e.status.remote = Some(new.remote.into());
        e.status.agent_version = Some(new.agent_version.into());
        e.status.protocol = Some(new.protocol);
        e.status.agent_protocols = Some(new.agent_protocols.to_string());
        e.status.agent_protocol = Some(new.agent_protocols.max);
        e.status.last_seen = Some(now);
        e.status.sessions += 1;
        drop(map);
        self.shared.mark(cluster);
        self.changed.notify_waiters();
        OpenOutcome::Opened { replaced }
    }

    /// Marks the session closed, unless a newer one already replaced it.
    pub(crate) fn close(&self, cluster: &str, session: &str) {
        let Ok(mut map) = self.clusters.lock() else { return };
        if let Some(e) = map.get_mut(cluster)
            && e.status.session.as_deref() == Some(session)
        {
            // The session's last frame stays its cluster's last-seen once it is gone.
            e.status.last_seen = e.last_seen(jiff::Timestamp::now());
            e.status.connected = false;
            e.status.connected_since = None;
            e.status.session = None;
            e.live = None;
            drop(map);
            self.shared.mark(cluster);
            self.changed.notify_waiters();
        }
    }

    /// Resolves at the next connect or disconnect of any cluster.
    pub(crate) async fn changed(&self) {
        self.changed.notified().await
    }

    /// Keeps `events` (oldest first) among the cluster's recent events.
    pub(crate) fn recent(&self, cluster: &str, events: impl IntoIterator<Item = RecentEvent>) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            for ev in events {
                e.recent.push(ev);
            }
        }
    }

    /// One cluster's status and its recent events (oldest first), if the hub knows it.
    pub(crate) fn get(&self, cluster: &str) -> Option<(ClusterStatus, Vec<RecentEvent>)> {
        let map = self.clusters.lock().ok()?;
        map.get(cluster).map(|e| (e.shown(jiff::Timestamp::now()), e.recent.events.iter().cloned().collect()))
    }

    /// The cluster's rate budget for `rate` events/s: one per cluster, so a reconnect
    /// does not start with a full budget again.
    pub(crate) fn budget(&self, cluster: &str, rate: u32) -> Arc<Mutex<Budget>> {
        let fresh = || Arc::new(Mutex::new(Budget::new(rate)));
        let Ok(mut map) = self.clusters.lock() else { return fresh() };
        match map.get_mut(cluster) {
            Some(e) => e.budget.get_or_insert_with(fresh).clone(),
            None => fresh(),
        }
    }

    /// Remembers the resync marker just stored for `cluster`.
    pub(crate) fn resync_stored(&self, cluster: &str, marker: StoredMarker) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.last_resync = Some(marker);
        }
    }

    /// Notes that a subscriber session was placed at, or is about to be sent records up
    /// to, `offset`. Called before the records are sent, so a marker coalesced into (see
    /// [`SessionRegistry::resync_pending`]) reaches its subscribers only after the request
    /// it absorbed: they reconcile after it.
    pub(crate) fn read_past(&self, offset: u64) {
        self.read_mark.fetch_max(offset, Ordering::SeqCst);
    }

    /// Whether a new resync for `cluster` can be absorbed by the marker this hub stored
    /// before: that marker is still the cluster's head in the bus (`head`, nothing stored
    /// after it), and no subscriber session has been sent it or placed past it (its offset
    /// is above the read mark). A subscriber that consumed the marker already reconciled
    /// from an older state, so only a new marker tells it about changes since. On a bus
    /// `shared` with other hub replicas, their readers are unknown: never.
    ///
    /// Subscribers that read before this hub started cannot have read the marker: this
    /// hub stored it, and the read mark starts at the log's end (see `opening`).
    pub(crate) fn resync_pending(&self, cluster: &str, head: Option<(u64, u64)>, shared: bool) -> bool {
        self.absorbing_marker(cluster, shared).is_some_and(|m| head == Some((m.epoch, m.seq)))
    }

    /// Whether [`SessionRegistry::resync_pending`] could answer yes, whatever the head: the
    /// bus is this hub's alone and a marker it stored is above the read mark. When not,
    /// the head need not be asked for (on JetStream a request or two to the stream leader).
    pub(crate) fn may_absorb_resync(&self, cluster: &str, shared: bool) -> bool {
        self.absorbing_marker(cluster, shared).is_some()
    }

    /// The marker this hub stored last for `cluster` while no subscriber can have read it
    /// (above the read mark), on a bus no other replica shares.
    fn absorbing_marker(&self, cluster: &str, shared: bool) -> Option<StoredMarker> {
        if shared {
            return None;
        }
        let map = self.clusters.lock().ok()?;
        map.get(cluster).and_then(|e| e.last_resync).filter(|m| m.offset > self.read_mark.load(Ordering::SeqCst))
    }

    /// Records accepted events.
    pub(crate) fn acked(&self, cluster: &str, epoch: u64, seq: u64, events: u64) {
        let Ok(mut map) = self.clusters.lock() else { return };
        if let Some(e) = map.get_mut(cluster) {
            e.status.epoch = epoch;
            e.status.acked_seq = seq;
            e.status.events_received += events;
            e.status.last_seen = Some(jiff::Timestamp::now());
        }
    }

    /// Records an inventory report.
    pub(crate) fn inventory(&self, cluster: &str, modules: Vec<ModuleInventory>) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.inventory = modules;
            self.shared.mark(cluster);
        }
    }

    /// Records a watch status report.
    pub(crate) fn watch_status(&self, cluster: &str, watches: Vec<WatchState>) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.watches = watches;
            self.shared.mark(cluster);
        }
    }

    /// Whether an agent of `cluster` ever opened a session since the hub started.
    pub(crate) fn knows(&self, cluster: &str) -> bool {
        self.clusters.lock().map(|m| m.contains_key(cluster)).unwrap_or(false)
    }

    /// One cluster's status, if the hub knows it.
    pub(crate) fn status(&self, cluster: &str) -> Option<ClusterStatus> {
        let map = self.clusters.lock().ok()?;
        map.get(cluster).map(|e| e.shown(jiff::Timestamp::now()))
    }

    /// Whether an agent session of `cluster` is open here.
    pub(crate) fn is_connected(&self, cluster: &str) -> bool {
        self.clusters.lock().is_ok_and(|m| m.get(cluster).is_some_and(|e| e.status.connected))
    }

    /// All clusters, sorted by id.
    pub(crate) fn list(&self) -> Vec<ClusterStatus> {
        let Ok(map) = self.clusters.lock() else { return Vec::new() };
        let now = jiff::Timestamp::now();
        let mut v: Vec<_> = map.values().map(|e| e.shown(now)).collect();
        v.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        v
    }
}

#[cfg(test)]
mod tests;
