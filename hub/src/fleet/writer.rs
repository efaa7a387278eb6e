//! The tasks that keep the fleet state shared on a bus of several replicas (see
//! `crate::fleet::state` for the rules): this replica's heartbeat and the live replicas
//! ([`heartbeats`]), following every entry into memory ([`follow`]), and writing this
//! replica's entries on change ([`write`], each decision made by [`plan`]).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use fleetwatch_bus::{EntryEvent, Expect, ReplicaShare, Written};
use futures_util::StreamExt;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterStatus;
use crate::context::Context;
use crate::fleet::entry::{self, FleetEntry};
use crate::fleet::state::{Cached, FleetState, cached_of, heartbeat};

/// How often the heartbeat is written and the live replicas read (well within the
/// bus's expiry of heartbeats, 15 s on NATS).
pub(crate) const HEARTBEAT_EVERY: Duration = Duration::from_secs(3);
/// The least time between two writes of one cluster's entry: changes in between are
/// coalesced into the next write.
pub(crate) const COALESCE: Duration = Duration::from_secs(1);
/// An entry of a connected cluster is rewritten this long after its last write at the
/// latest (between half of it and all of it, spread by cluster), so it does not expire.
pub(crate) const REFRESH: Duration = Duration::from_secs(24 * 3600);
/// Writes in flight at once.
const WRITES_IN_FLIGHT: usize = 64;
/// Most clusters written in one round (the rest wait for the next).
const MAX_ROUND: usize = 4096;
/// How often write failures are summed up in the log.
const FAILURE_LOG_EVERY: Duration = Duration::from_secs(60);
/// The longest wait before failed writes are tried again (the wait doubles from
/// [`COALESCE`] with each round in which every write failed: NATS down, the bucket full).
pub(crate) const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Runs the fleet state's tasks until `shutdown`, on a shared bus; returns at once on a bus
/// of one hub.
pub(crate) async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    // Whether the bus is shared is known once it is open (see `opening`).
    let Some(bus) = crate::opening::opened(&ctx.storage, &shutdown).await else { return };
    if bus.replica_share().is_none() {
        return;
    }
    ctx.sessions.registry.shared.enable();
    // Clusters that connected before the writer began.
    ctx.sessions.registry.shared.mark_everything();
    tokio::join!(
        heartbeats(ctx.clone(), shutdown.clone()),
        follow(ctx.clone(), shutdown.clone()),
        follow_heads(ctx.clone(), shutdown.clone()),
        write(ctx, shutdown)
    );
}

/// Writes this replica's heartbeat and reads the live replicas, every [`HEARTBEAT_EVERY`].
async fn heartbeats(ctx: Arc<Context>, shutdown: CancellationToken) {
    let bus = ctx.sessions.bus.clone();
    let Some(share) = bus.replica_share() else { return };
    let mut every = tokio::time::interval(HEARTBEAT_EVERY);
    // Never 0 (a release without incarnations says 0).
    let incarnation = rand::random::<u64>().max(1);
    let mut before: BTreeMap<String, u64> = BTreeMap::new();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = every.tick() => {}
        }
        let m = &ctx.sessions.metrics;
        let connected = u64::try_from(m.agent_sessions.get()).unwrap_or(0);
        let beat = heartbeat(&ctx.replica, m.events_received.get(), connected, incarnation);
        if let Err(e) = share.heartbeat(&ctx.replica, beat).await {
            tracing::debug!(error = %e, "cannot write this replica's heartbeat");
        }
        match share.replicas().await {
            Ok(live) => {
                ctx.fleet.set_live(live);
                let now = ctx.fleet.incarnations();
                let gone = crate::session::heads::replicas_gone(&before, &now, &ctx.replica);
                if !gone.is_empty() {
                    // They may have died before recording the heads of records they had
                    // stored: every agent session here looks at its cluster's head once.
                    tracing::info!(replicas = ?gone, "hub replicas went away or started again: agent sessions look at their clusters' heads");
                    let (heads, over) = (ctx.sessions.heads.clone(), ctx.sessions.settings.idle_timeout);
                    tokio::spawn(async move { heads.sweep(over).await });
                }
                before = now;
            }
            Err(e) => tracing::debug!(error = %e, "cannot read the replicas' heartbeats"),
        }
    }
}

/// Opens a follow of `what`, again after a growing pause (250 ms doubling to 30 s) while it
/// fails; `None` on shutdown.
async fn until_open<T, E: std::fmt::Display, F: std::future::Future<Output = Result<T, E>>>(
    what: &str,
    shutdown: &CancellationToken,
    mut open: impl FnMut() -> F,
) -> Option<T> {
    let mut backoff = Duration::from_millis(250);
    loop {
        match open().await {
            Ok(s) => return Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "cannot follow {what}; retrying in {backoff:?}");
                tokio::select! {
                    _ = shutdown.cancelled() => return None,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// Follows the cluster heads the replicas record and pokes this replica's agent sessions of
/// another agent process of the cluster (see [`crate::session::heads`]); again from the
/// start when the follow ends or the buckets were created again.
async fn follow_heads(ctx: Arc<Context>, shutdown: CancellationToken) {
    let bus = ctx.sessions.bus.clone();
    let Some(share) = bus.replica_share() else { return };
    loop {
        let generation = share.generation();
        let Some(mut heads) = until_open("the cluster heads", &shutdown, || share.follow_heads()).await else { return };
        let mut check = tokio::time::interval(Duration::from_secs(1));
        loop {
            let item = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = check.tick() => {
                    if share.generation() != generation {
                        tracing::info!("the heads bucket was created again (JetStream recreated): following afresh");
                        break;
                    }
                    continue;
                }
                item = heads.next() => item,
            };
            match item {
                None => break,
                // Transient (the follow's consumer is recreated by the client): go on.
                Some(Err(e)) => tracing::debug!(error = %e, "following the cluster heads"),
                Some(Ok(head)) => {
                    let poked = ctx.sessions.heads.head_written(&head.cluster, head.epoch);
                    if poked > 0 {
                        tracing::debug!(cluster = %head.cluster, epoch = head.epoch, seq = head.seq, poked, "a head of another agent process was recorded");
                    }
                }
            }
        }
    }
}

/// Follows every entry into [`FleetState`]: a fresh map until the follow caught up (then it
/// replaces the old one), each change after that; again from the start when the follow
/// ends or the entries were lost (the bus's generation changed).
async fn follow(ctx: Arc<Context>, shutdown: CancellationToken) {
    let bus = ctx.sessions.bus.clone();
    let Some(share) = bus.replica_share() else { return };
    let mut age_out = tokio::time::interval(Duration::from_secs(3600));
    loop {
        let generation = share.generation();
        let started = Instant::now();
        let Some(mut entries) = until_open("the fleet's entries", &shutdown, || share.follow_entries()).await else {
            return;
        };
        let mut fresh: Option<HashMap<String, Cached>> = Some(HashMap::new());
        let mut shared = crate::fleet::state::Interner::default();
        let mut check = tokio::time::interval(Duration::from_secs(1));
        loop {
            let item = tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = check.tick() => {
                    if share.generation() != generation {
                        tracing::info!("the fleet's entries were lost (JetStream recreated): following afresh");
                        break;
                    }
                    continue;
                }
                _ = age_out.tick() => {
                    ctx.fleet.age_out();
                    continue;
                }
                item = entries.next() => item,
            };
            match item {
                None => break,
                // Transient (the follow's consumer is recreated by the client): go on.
                Some(Err(e)) => tracing::debug!(error = %e, "following the fleet's entries"),
                Some(Ok(EntryEvent::CaughtUp)) => {
                    let Some(map) = fresh.take() else { continue };
                    let n = map.len();
                    ctx.fleet.replace(map);
                    let secs = started.elapsed().as_secs_f64();
                    ctx.sessions.metrics.fleet_load_seconds.set(secs);
                    ctx.sessions.metrics.fleet_entries.set(i64::try_from(n).unwrap_or(i64::MAX));
                    tracing::info!(clusters = n, seconds = format!("{secs:.3}"), "fleet state loaded");
                    // Entries of this replica's earlier life, and any another replica left
                    // wrong, are looked at by the writer.
                    for cluster in ctx.fleet.own_clusters() {
                        ctx.sessions.registry.shared.mark(&cluster);
                    }
                }
                Some(Ok(EntryEvent::Entry { cluster, value, revision, written_ms })) => {
                    let cached = cached_of(&value, revision, written_ms, &mut shared);
                    match fresh.as_mut() {
                        Some(map) => {
                            if let Some(c) = cached {
                                map.insert(cluster, c);
                            }
                        }
                        None => {
                            if cached.as_ref().is_some_and(|c| needs_look(&cluster, c, &ctx)) {
                                ctx.sessions.registry.shared.mark(&cluster);
                            }
                            ctx.fleet.apply(cluster, cached);
                            ctx.sessions.metrics.fleet_entries.set(i64::try_from(ctx.fleet.len()).unwrap_or(0));
                        }
                    }
                }
            }
        }
    }
}

/// Whether an entry just read may need a write by this replica: its own entry says
/// connected while the agent is not connected here (an echo of a write that a disconnect
/// overtook, or from before a restart), or another replica's says not connected while
/// the agent is connected here (that replica wrote after this one).
fn needs_look(cluster: &str, c: &Cached, ctx: &Context) -> bool {
    let registry = &ctx.sessions.registry;
    if *c.hub == *ctx.replica {
        c.connected && !registry.is_connected(cluster)
    } else {
        !c.connected && registry.is_connected(cluster)
    }
}

/// What this replica wrote last of a cluster's entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Owned {
    /// The revision it was stored at.
    pub(crate) revision: u64,
    /// [`entry::digest`] of what was written.
    pub(crate) digest: u64,
    /// When to rewrite it (a connected cluster) so it does not expire.
    pub(crate) refresh_at: Instant,
}

/// One write to make.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Job {
    /// The cluster.
    pub(crate) cluster: String,
    /// The entry's bytes.
    pub(crate) value: Bytes,
    /// When it may be written.
    pub(crate) expect: Expect,
    /// Its digest.
    pub(crate) digest: u64,
}

/// Decides whether and how this replica (`me`) writes `cluster`'s entry: `status` from its
/// registry, `cached` the entry as followed from the bus, `owned` what it wrote last;
/// `refresh` rewrites an unchanged entry of a connected cluster. The rules are in
/// `crate::fleet::state`.
pub(crate) fn plan(
    me: &str,
    cluster: &str,
    status: Option<ClusterStatus>,
    cached: Option<&Cached>,
    owned: Option<&Owned>,
    refresh: bool,
    max_bytes: usize,
) -> Option<Job> {
    // The bus holds what this replica wrote last (or the follow has not seen a newer one).
    let still_mine = cached.is_none_or(|c| owned.is_some_and(|o| c.revision <= o.revision));
    let job = |entry: FleetEntry, expect: Expect| {
        let digest = entry::digest(&entry.status);
        Job { cluster: cluster.into(), value: entry::encode(entry, max_bytes), expect, digest }
    };
    match status {
        Some(status) => {
            let digest = entry::digest(&status);
            let unchanged = owned.is_some_and(|o| o.digest == digest) && still_mine;
            if status.connected {
                // The agent is here: this replica's entry, whatever is there.
                return (!unchanged || refresh).then(|| job(FleetEntry::new(status, me), Expect::Any));
            }
            if unchanged {
                return None;
            }
            let expect = match (owned, cached) {
                (Some(o), _) => Expect::Revision(o.revision),
                (None, Some(c)) if &*c.hub == me => Expect::Revision(c.revision),
                (None, None) => Expect::Absent,
                // Another replica's entry: its agent is there (or was last).
                (None, Some(_)) => return None,
            };
            Some(job(FleetEntry::new(status, me), expect))
        }
        None => {
            // Unknown to this replica's registry: an entry of its earlier life that still
            // says connected is set to not connected, if nobody wrote it since.
            let c = cached?;
            if &*c.hub != me || !c.connected {
                return None;
            }
            let mut entry = c.entry()?;
            entry.status.connected = false;
            entry.status.session = None;
            entry.status.connected_since = None;
            Some(job(entry, Expect::Revision(c.revision)))
        }
    }
}

/// When an entry written at `now` is rewritten: between half of [`REFRESH`] and all of it,
/// by a hash of the cluster, so a fleet that connected at once is refreshed spread out.
pub(crate) fn refresh_at(cluster: &str, now: Instant) -> Instant {
    let h = fleetwatch_protocol::digest::fnv1a64(cluster.as_bytes());
    let half = REFRESH / 2;
    now + half + Duration::from_secs(h % half.as_secs().max(1))
}

/// The writer's memory: what it wrote, and when it last tried each cluster. Ordered by
/// cluster, so a round writes in the same order in every run of a simulation seed (a hash
/// map's order is random per process).
#[derive(Default)]
pub(crate) struct Writer {
    pub(crate) owned: BTreeMap<String, Owned>,
    /// Clusters to look at once their [`COALESCE`] is over.
    pub(crate) waiting: BTreeSet<String>,
    /// When each cluster was last written or tried (within [`COALESCE`]).
    pub(crate) tried: HashMap<String, Instant>,
    failures: u64,
    failure_logged: Option<Instant>,
    /// How much longer than [`COALESCE`] failed clusters wait now.
    pub(crate) backoff: Duration,
}

impl Writer {
    /// The clusters of this round: waiting ones whose [`COALESCE`] is over (at most
    /// [`MAX_ROUND`]).
    fn due(&mut self, now: Instant) -> Vec<String> {
        self.tried.retain(|_, at| now < *at + COALESCE);
        let tried = &self.tried;
        self.waiting.extract_if(.., |c| !tried.contains_key(c)).take(MAX_ROUND).collect()
    }

    /// When the first waiting cluster is due (`None`: nothing waits).
    fn due_after(&self, now: Instant) -> Option<Instant> {
        self.waiting.iter().map(|c| self.tried.get(c).map_or(now, |at| *at + COALESCE)).min()
    }

    /// Makes the jobs of one round and their outcomes known.
    pub(crate) async fn round(
        &mut self,
        share: &dyn ReplicaShare,
        fleet: &FleetState,
        status: impl Fn(&str) -> Option<ClusterStatus>,
        clusters: Vec<(String, bool)>,
        metrics: &crate::metrics::Metrics,
    ) {
        let now = Instant::now();
        let max = share.max_entry_bytes();
        let jobs: Vec<Job> = clusters
            .into_iter()
            .filter_map(|(c, refresh)| {
                let cached = fleet.cached(&c);
                plan(fleet.me(), &c, status(&c), cached.as_ref(), self.owned.get(&c), refresh, max)
            })
            .collect();
        let results: Vec<(Job, Result<Written, fleetwatch_bus::BusError>)> = futures_util::stream::iter(jobs)
            .map(|job| async move {
                let r = share.write_entry(&job.cluster, job.value.clone(), job.expect).await;
                (job, r)
            })
            .buffer_unordered(WRITES_IN_FLIGHT)
            .collect()
            .await;
        let (mut stored, mut failed) = (false, Vec::new());
        for (job, result) in results {
            self.tried.insert(job.cluster.clone(), now);
            stored |= result.is_ok();
            match result {
                Ok(Written::Stored(revision)) => {
                    metrics.fleet_writes.inc();
                    if job.value.len() >= max / 2 && FleetEntry::decode(&job.value).is_some_and(|e| e.trimmed) {
                        metrics.fleet_trimmed.inc();
                    }
                    let refresh_at = refresh_at(&job.cluster, now);
                    self.owned.insert(job.cluster, Owned { revision, digest: job.digest, refresh_at });
                }
                Ok(Written::Moved) => {
                    // Another replica wrote the entry since: its agent is there now.
                    metrics.fleet_moved.inc();
                    tracing::debug!(cluster = %job.cluster, "the cluster's entry is another replica's now; left alone");
                    self.owned.remove(&job.cluster);
                }
                Err(e) => {
                    metrics.fleet_write_failures.inc();
                    self.failures += 1;
                    if self.failure_logged.is_none_or(|at| now.duration_since(at) >= FAILURE_LOG_EVERY) {
                        tracing::warn!(error = %e, failures = self.failures, "cannot write clusters' entries of the fleet state; retrying");
                        self.failure_logged = Some(now);
                        self.failures = 0;
                    }
                    failed.push(job.cluster);
                }
            }
        }
        // Every write failing: wait longer each round rather than retry them all each second.
        self.backoff =
            if stored || failed.is_empty() { Duration::ZERO } else { (self.backoff * 2).clamp(COALESCE, MAX_BACKOFF) };
        for c in failed {
            self.tried.insert(c.clone(), now + self.backoff);
            self.waiting.insert(c);
        }
    }
}

/// Writes this replica's entries as clusters change (see [`plan`]), each at most once per
/// [`COALESCE`], and refreshes those of connected clusters (see [`refresh_at`]).
async fn write(ctx: Arc<Context>, shutdown: CancellationToken) {
    let bus = ctx.sessions.bus.clone();
    let Some(share) = bus.replica_share() else { return };
    let changes = &ctx.sessions.registry.shared;
    let mut w = Writer::default();
    let mut generation = share.generation();
    let mut refresh = tokio::time::interval(Duration::from_secs(60));
    let mut next: Option<Instant> = None;
    loop {
        let mut refreshing = false;
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changes.wait() => {}
            _ = tokio::time::sleep_until(next.unwrap_or_else(Instant::now)), if next.is_some() => {}
            _ = refresh.tick() => refreshing = true,
        }
        if share.generation() != generation {
            // The entries were lost: write every one again.
            generation = share.generation();
            w.owned.clear();
            changes.mark_everything();
        }
        let (marked, everything) = changes.take();
        w.waiting.extend(marked);
        if everything {
            w.waiting.extend(ctx.sessions.registry.list().into_iter().map(|s| s.cluster));
            w.waiting.extend(ctx.fleet.own_clusters());
        }
        let now = Instant::now();
        let mut clusters: Vec<(String, bool)> = Vec::new();
        if refreshing {
            let registry = &ctx.sessions.registry;
            clusters.extend(
                w.owned
                    .iter()
                    .filter(|(c, o)| o.refresh_at <= now && registry.is_connected(c))
                    .map(|(c, _)| (c.clone(), true))
                    .take(MAX_ROUND),
            );
        }
        clusters.extend(w.due(now).into_iter().map(|c| (c, false)));
        if !clusters.is_empty() {
            let registry = &ctx.sessions.registry;
            w.round(share, &ctx.fleet, |c| registry.status(c), clusters, &ctx.sessions.metrics).await;
        }
        // Those marked again within their coalescing time (and failed ones) wait for it.
        next = w.due_after(Instant::now());
    }
}

#[cfg(test)]
mod tests;
