//! The fleet's state across hub replicas on a shared bus ([`ReplicaShare`]): which
//! clusters exist, which replica each agent is connected to, and what each shows.
//!
//! Each replica writes one entry per cluster whose agent is (or was last) connected to it
//! ([`crate::fleet::entry`]), on change only, and follows every entry into memory
//! ([`FleetState`]), so a list request merges this replica's registry with that map and
//! makes no round trip to the bus. The tasks that do it are in `crate::fleet::writer`:
//! - **Changes**: the registry marks a cluster in [`Changes`] when something an entry shows
//!   changed (connect, disconnect, watch and inventory reports, certificate, conflicts);
//!   the writer drains the set, writes each cluster at most once per
//!   `crate::fleet::writer::COALESCE`, and skips a write whose content (`crate::fleet::entry::digest`) is
//!   what it wrote last. The set holds each cluster once and at most [`MAX_PENDING`] of
//!   them; past that it is dropped for one full pass over the registry.
//! - **Ownership**: an entry is the replica's whose agent is connected there. A replica
//!   writes `connected: false` only with compare-and-set on the revision it wrote last
//!   (or, after its restart, the revision of its earlier life's entry): a mismatch means
//!   another replica has the agent now, and the entry is left alone. A replica that finds
//!   another's `connected: false` over a cluster connected to itself writes its own again.
//! - **Liveness**: each replica writes a small [`Heartbeat`] every few seconds into the
//!   replicas' bucket (expiring after `REPLICA_TTL`); an entry of a replica without one is
//!   shown as not connected (the replica died; its agents are moving).
//! - **Expiry**: entries expire from the bus after `ReplicaShare::entry_max_age` without a
//!   write (7 days on NATS); the owning replica rewrites the entries of its connected
//!   clusters every 12 to 24 hours (spread by cluster), so only clusters that have not
//!   connected for that long go. The map here ages them out by their write time too (the
//!   bus does not announce an expiry).
//!
//! So after every replica restarted, clusters whose agents have not come back are listed
//! as not connected (from the bus) instead of vanishing.

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, RwLock};

use fleetwatch_bus::ReplicaShare;
use serde_json::Value;

use crate::cluster::ClusterStatus;
use crate::fleet::entry::{Beat, FleetEntry, Heartbeat};
use crate::fleet::rows::{Health, Row};

/// Most clusters waiting to be written; past it the set is dropped for one full pass.
pub(crate) const MAX_PENDING: usize = 65_536;

/// Clusters whose entry may need a write, each once (see the module docs).
#[derive(Default)]
pub(crate) struct Changes {
    set: Mutex<ChangeSet>,
    wake: tokio::sync::Notify,
    /// Marks are kept only while a writer drains them (a shared bus).
    enabled: AtomicBool,
}

#[derive(Default)]
struct ChangeSet {
    clusters: HashSet<String>,
    /// More than [`MAX_PENDING`] were marked: every cluster is looked at.
    everything: bool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Changes {
    /// Starts keeping marks (a writer drains them from now on).
    pub(crate) fn enable(&self) {
        self.enabled.store(true, Ordering::SeqCst);
    }

    /// Notes that `cluster`'s entry may need a write.
    pub(crate) fn mark(&self, cluster: &str) {
        if !self.enabled.load(Ordering::Relaxed) {
            return;
        }
        let mut set = lock(&self.set);
        if set.everything || set.clusters.contains(cluster) {
            return;
        }
        if set.clusters.len() >= MAX_PENDING {
            set.everything = true;
            set.clusters = HashSet::new();
        } else {
            set.clusters.insert(cluster.to_string());
        }
        drop(set);
        self.wake.notify_one();
    }

    /// Asks for a look at every cluster (the entries were lost, or too many changed).
    pub(crate) fn mark_everything(&self) {
        let mut set = lock(&self.set);
        set.everything = true;
        set.clusters = HashSet::new();
        drop(set);
        self.wake.notify_one();
    }

    /// Takes the marked clusters, and whether every cluster is to be looked at.
    pub(crate) fn take(&self) -> (HashSet<String>, bool) {
        let mut set = lock(&self.set);
        let everything = std::mem::take(&mut set.everything);
        (std::mem::take(&mut set.clusters), everything)
    }

    /// Resolves once something was marked since the last call.
    pub(crate) async fn wait(&self) {
        self.wake.notified().await
    }
}

/// A cluster's entry as followed from the bus: kept as its replica wrote it (about a
/// kilobyte of JSON; a decoded [`FleetEntry`] took 2.5 times that, some twenty allocations
/// each) with what merging needs decoded.
#[derive(Debug, Clone)]
pub(crate) struct Cached {
    /// The entry's JSON (a [`FleetEntry`]), decoded when listed.
    pub(crate) raw: bytes::Bytes,
    /// The replica that wrote it (shared by the rows listing it).
    pub(crate) hub: std::sync::Arc<str>,
    /// Whether that replica said the agent is connected.
    pub(crate) connected: bool,
    /// Its watches and modules, as the lists count them.
    pub(crate) health: Health,
    /// Its watches' names (the WatchConfigs its agent runs).
    pub(crate) watches: crate::fleet::rows::WatchNames,
    /// Its revision (for compare-and-set).
    pub(crate) revision: u64,
    /// When it was written (Unix ms, the bus's clock), when known.
    pub(crate) written_ms: Option<u64>,
}

/// The replicas with a live heartbeat, as last read.
#[derive(Default)]
struct Live {
    /// Read at least once.
    known: bool,
    beats: HashMap<String, Beat>,
}

/// Every cluster's entry as the replicas wrote it, and which replicas are alive: what a
/// list request merges with this replica's registry.
pub(crate) struct FleetState {
    /// This replica's name.
    me: String,
    entries: RwLock<HashMap<String, Cached>>,
    live: RwLock<Live>,
    /// Entries older than this (by write time) are gone from the bus.
    max_age_ms: AtomicU64,
}

fn now_ms() -> u64 {
    u64::try_from(jiff::Timestamp::now().as_millisecond()).unwrap_or(0)
}

impl FleetState {
    /// The state of replica `me`, empty until [`set_share`](Self::set_share) (and for a
    /// bus of one hub).
    pub(crate) fn new(me: &str) -> Self {
        Self { me: me.into(), entries: RwLock::default(), live: RwLock::default(), max_age_ms: AtomicU64::new(0) }
    }

    /// Takes on the bus's sharing once the bus is open (`None`: a bus of one hub).
    pub(crate) fn set_share(&self, share: Option<&dyn ReplicaShare>) {
        let max_age = share.map_or(std::time::Duration::ZERO, |s| s.entry_max_age());
        self.max_age_ms.store(u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// This replica's name.
    pub(crate) fn me(&self) -> &str {
        &self.me
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.entries.read().map(|e| e.len()).unwrap_or(0)
    }

    /// Replaces every entry (a follow that caught up).
    pub(crate) fn replace(&self, entries: HashMap<String, Cached>) {
        if let Ok(mut e) = self.entries.write() {
            *e = entries;
        }
    }

    /// Takes in one entry's change (`None`: deleted).
    pub(crate) fn apply(&self, cluster: String, cached: Option<Cached>) {
        let Ok(mut e) = self.entries.write() else { return };
        match cached {
            Some(c) => e.insert(cluster, c),
            None => e.remove(&cluster),
        };
    }

    /// One cluster's entry.
    pub(crate) fn cached(&self, cluster: &str) -> Option<Cached> {
        self.entries.read().ok()?.get(cluster).cloned()
    }

    /// Clusters whose entry this replica wrote (its own, or its earlier life's).
    pub(crate) fn own_clusters(&self) -> Vec<String> {
        let Ok(e) = self.entries.read() else { return Vec::new() };
        e.iter().filter(|(_, c)| *c.hub == *self.me).map(|(k, _)| k.clone()).collect()
    }

    /// Drops entries the bus has expired (it does not announce them).
    pub(crate) fn age_out(&self) {
        let now = now_ms();
        if let Ok(mut e) = self.entries.write() {
            e.retain(|_, c| !self.expired(c, now));
        }
    }

    fn expired(&self, c: &Cached, now: u64) -> bool {
        c.written_ms.is_some_and(|w| now.saturating_sub(w) > self.max_age_ms.load(Ordering::Relaxed))
    }

    /// Takes in the replicas' bucket as just read (every live replica and its value).
    pub(crate) fn set_live(&self, beats: Vec<(String, bytes::Bytes)>) {
        let beats = beats.into_iter().map(|(name, v)| (name, Beat::decode(&v))).collect();
        if let Ok(mut live) = self.live.write() {
            *live = Live { known: true, beats };
        }
    }

    /// Every live replica with its incarnation (0 when its heartbeat does not say).
    pub(crate) fn incarnations(&self) -> std::collections::BTreeMap<String, u64> {
        let Ok(live) = self.live.read() else { return Default::default() };
        live.beats
            .iter()
            .map(|(name, b)| {
                let inc = match b {
                    Beat::Alive(h) => h.incarnation,
                    _ => 0,
                };
                (name.to_string(), inc)
            })
            .collect()
    }

    /// Events accepted so far by the other live replicas (their heartbeats).
    pub(crate) fn others_events(&self) -> u64 {
        let Ok(live) = self.live.read() else { return 0 };
        live.beats
            .iter()
            .filter(|(name, _)| **name != self.me)
            .map(|(_, b)| match b {
                Beat::Alive(Heartbeat { events_total, .. }) => *events_total,
                _ => 0,
            })
            .sum()
    }

    /// Whether the agent of an entry is shown as connected: its replica said so and is
    /// alive. This replica's own entries are not (its registry says what is connected here;
    /// an entry of its own that the registry does not have is from before a restart).
    fn shows_connected(&self, c: &Cached, live: &Live) -> bool {
        c.connected && *c.hub != *self.me && live.known && live.beats.contains_key(&*c.hub)
    }

    /// This replica's clusters (`local`, from its registry) merged with every other entry
    /// (in no order), each with `hub`: an entry connected elsewhere replaces a
    /// disconnected one here; an entry of a replica without a heartbeat shows not connected.
    pub(crate) fn rows(&self, local: Vec<ClusterStatus>) -> Vec<Row> {
        // Not sorted here: a list sorts (or selects) what it answers.
        let mut out: HashMap<String, Row> = HashMap::with_capacity(self.len());
        for status in local {
            out.insert(status.cluster.clone(), Row::local(status, Some(&self.me)));
        }
        let (Ok(live), Ok(entries)) = (self.live.read(), self.entries.read()) else {
            return out.into_values().collect();
        };
        let now = now_ms();
        let mut consider = |name: &str, connected: bool, row: &dyn Fn() -> Row| match out.get(name) {
            Some(have) if have.connected || !connected => {}
            _ => {
                out.insert(name.to_string(), row());
            }
        };
        for (name, c) in entries.iter().filter(|(_, c)| !self.expired(c, now)) {
            let connected = self.shows_connected(c, &live);
            consider(name, connected, &|| Row::entry(name, c, connected));
        }
        for (hub, list) in legacy_lists(&live, &self.me) {
            for c in list {
                let Some(name) = c["cluster"].as_str() else { continue };
                consider(name, c["connected"] == true, &|| Row::legacy(name, hub, c.clone()));
            }
        }
        out.into_values().collect()
    }

    /// One cluster as the other replicas show it (without this replica's registry): whether
    /// it is connected there, and its entry with `hub`.
    pub(crate) fn elsewhere(&self, cluster: &str) -> Option<(bool, Value)> {
        let live = self.live.read().ok()?;
        let mut best: Option<Row> = None;
        if let Some(c) = self.entries.read().ok()?.get(cluster).filter(|c| !self.expired(c, now_ms())) {
            best = Some(Row::entry(cluster, c, self.shows_connected(c, &live)));
        }
        for (hub, list) in legacy_lists(&live, &self.me) {
            if let Some(c) = list.iter().find(|c| c["cluster"] == cluster)
                && best.as_ref().is_none_or(|have| !have.connected && c["connected"] == true)
            {
                best = Some(Row::legacy(cluster, hub, c.clone()));
            }
        }
        best.map(|r| (r.connected, r.value()))
    }
}

/// The whole cluster lists of live replicas of a release before per-cluster entries.
fn legacy_lists<'a>(live: &'a Live, me: &'a str) -> impl Iterator<Item = (&'a str, &'a Vec<Value>)> + 'a {
    live.beats.iter().filter(move |(name, _)| name.as_str() != me).filter_map(|(name, b)| match b {
        Beat::Legacy(list) => Some((name.as_str(), list)),
        _ => None,
    })
}

impl Cached {
    /// The entry decoded (`None`: unreadable).
    pub(crate) fn entry(&self) -> Option<FleetEntry> {
        FleetEntry::decode(&self.raw)
    }
}

/// An entry read from the bus, as [`FleetState`] keeps it (`None`: deleted or unreadable);
/// its replica's name and its watches' names shared with the entries before it through
/// `shared` (50,000 entries name the same few replicas and lists of watches).
pub(crate) fn cached_of(value: &[u8], revision: u64, written_ms: Option<u64>, shared: &mut Interner) -> Option<Cached> {
    if value.is_empty() {
        return None;
    }
    let (hub, connected, health, watches) = Health::of_entry(value)?;
    // A copy of its own: the payload may share a read buffer far larger than itself.
    let raw = bytes::Bytes::copy_from_slice(value);
    let (hub, watches) = shared.intern(hub, watches);
    Some(Cached { raw, hub, connected, health, watches, revision, written_ms })
}

/// Shares equal replica names and watch lists between entries. Bounded: past
/// [`Interner::MAX`] distinct values it starts afresh (later entries then get their own
/// copies until the values repeat again; nothing is wrong, only less is shared).
#[derive(Debug, Default)]
pub(crate) struct Interner {
    hubs: HashSet<std::sync::Arc<str>>,
    watches: HashSet<crate::fleet::rows::WatchNames>,
}

impl Interner {
    /// Distinct values kept of each kind.
    const MAX: usize = 4096;

    fn intern(
        &mut self,
        hub: String,
        watches: crate::fleet::rows::WatchNames,
    ) -> (std::sync::Arc<str>, crate::fleet::rows::WatchNames) {
        (share(&mut self.hubs, hub.into()), share(&mut self.watches, watches))
    }
}

/// The value of `set` equal to `v`, or `v` kept in it (the set emptied first when full).
fn share<T: ?Sized + std::hash::Hash + Eq>(
    set: &mut HashSet<std::sync::Arc<T>>,
    v: std::sync::Arc<T>,
) -> std::sync::Arc<T> {
    if let Some(have) = set.get(&v) {
        return have.clone();
    }
    if set.len() >= Interner::MAX {
        set.clear();
    }
    set.insert(v.clone());
    v
}

/// What a heartbeat of this replica says now.
pub(crate) fn heartbeat(me: &str, events_total: u64, connected: u64, incarnation: u64) -> bytes::Bytes {
    let beat = Heartbeat { replica: me.into(), events_total, connected, incarnation };
    serde_json::to_vec(&beat).unwrap_or_default().into()
}

#[cfg(test)]
mod tests;
