//! Sharded instances: several operator instances share the Runtimes, each shard guarded by
//! its own `coordination.k8s.io/v1` Lease, so a large fleet is reconciled by several
//! processes at once and the loss of one is taken over within the lease duration.
//!
//! This is the operator's one Lease mechanism: a single acting instance with standbys is a
//! shard of one (`count` 1), whose Lease keeps the name `<name>` that releases before used
//! for their leader election, so an old-release leader and a new instance in a rolling
//! upgrade contend for one Lease and never act at once. That Lease may lack the labels
//! below (an old release wrote it); it is read by name and labelled when taken.
//!
//! Why this shape:
//! - A Runtime belongs to shard `fnv1a64("<namespace>/<name>") % N` ([`shard_of`], by way of
//!   its bucket, see [`crate::buckets`]; N divides 60). FNV-1a is written down here (not
//!   std's randomised `DefaultHasher`), so every instance, of every build, puts a Runtime in
//!   the same shard.
//! - Shard `i` is the Lease `<name>-shard-<i>` (`<name>` for a shard of one). Holding,
//!   renewing and taking over follow client-go's leader election: a taker waits until the record it
//!   observed has not changed for a whole lease duration *by its own clock*, every write
//!   carries the resourceVersion it read, and a holder that could not renew within the
//!   renew deadline (shorter than the lease duration) stops acting on the shard first. So
//!   a shard is never reconciled by two instances at once.
//! - Balance: each instance announces itself with a member Lease `<name>-member-<hash>`
//!   that it renews like the shards. Live members are those whose record changed within
//!   the lease duration; an instance holds at most `ceil(N / live)` shards, gives back the
//!   extras (it stops acting on them, then clears the holder so another takes them at
//!   once) and takes free or expired shards while it holds fewer. Everyone aims at the
//!   same bound and `live × ceil(N / live) ≥ N`, so every shard ends up held and no one
//!   holds more than its share.
//! - Reconciles consult a `ShardMap`: a Runtime of a shard not held is skipped; a
//!   reconcile in flight when its shard is lost is cancelled, and the shard is given back
//!   only after every such reconcile has ended.
//!
//! Every Lease of a group carries the label [`GROUP_LABEL`] (the group's name) and
//! `ROLE_LABEL` (`shard` or `member`), so one list reads them all each round.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_api::Runtime;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams, Preconditions};
use tokio::sync::{OwnedRwLockReadGuard, RwLock, mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Label naming the group (the base Lease name) on every Lease of a sharded deployment.
pub const GROUP_LABEL: &str = "lifecycle.fleetwatch.dev/group";
/// Label saying whether a Lease guards a shard (`shard`) or announces an instance (`member`).
pub(crate) const ROLE_LABEL: &str = "lifecycle.fleetwatch.dev/role";

/// 64-bit FNV-1a of `bytes` (the project's one: [`fleetwatch_protocol::digest`]).
pub(crate) use fleetwatch_protocol::digest::fnv1a64;

/// The shard of the Runtime `namespace/name` among `count` shards (0 when `count` is 0 or
/// 1): its bucket ([`crate::buckets`]) modulo `count`, which for the counts allowed (the
/// divisors of [`crate::buckets::BUCKETS`]) is FNV-1a of `namespace/name` modulo `count`.
pub fn shard_of(namespace: &str, name: &str, count: u32) -> u32 {
    if count <= 1 {
        return 0;
    }
    crate::buckets::bucket_of(namespace, name) % count
}

/// The shard of a Runtime object (a Runtime without namespace counts as `default`).
pub(crate) fn shard_of_runtime(rt: &Runtime, count: u32) -> u32 {
    shard_of(rt.namespace().as_deref().unwrap_or("default"), &rt.name_any(), count)
}

/// Settings of a sharded deployment.
#[derive(Debug, Clone)]
pub struct ShardConfig {
    /// Namespace of the Leases.
    pub namespace: String,
    /// Base name: shards are `<name>-shard-<i>`, members `<name>-member-<hash>`.
    pub name: String,
    /// Who this instance is (shown as the holder; unique per process).
    pub identity: String,
    /// Number of shards (at least 1).
    pub count: u32,
    /// How long a Lease is valid without renewal.
    pub lease_duration: Duration,
    /// An instance that could not renew a shard for this long stops acting on it (less
    /// than the lease duration).
    pub renew_deadline: Duration,
    /// How often Leases are renewed and looked at.
    pub retry_period: Duration,
}

impl ShardConfig {
    /// Settings with client-go's defaults (15 s lease, 10 s renew deadline, 2 s retry).
    pub fn new(namespace: &str, name: &str, identity: &str, count: u32) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            count: count.max(1),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Scales the deadlines to a lease duration (renew deadline 2/3, retry 2/15 of it).
    /// Lease durations are whole seconds in the Lease; shorter ones are rounded up to 1 s.
    pub fn with_lease_duration(mut self, d: Duration) -> Self {
        let d = d.max(Duration::from_secs(1));
        self.lease_duration = d;
        self.renew_deadline = d * 2 / 3;
        self.retry_period = (d * 2 / 15).max(Duration::from_millis(100));
        self
    }

    /// The Lease of shard `i`: `<name>-shard-<i>`, and for a shard of one the Lease `<name>`
    /// itself, the one releases before the shards used for their single leader. Keeping
    /// that name is what makes a rolling upgrade safe: an old-release leader and a new
    /// instance contend for the same Lease, so they never act at once (docs/upgrade.md).
    pub fn shard_lease(&self, i: u32) -> String {
        if self.count == 1 { self.name.clone() } else { format!("{}-shard-{i}", self.name) }
    }

    /// This instance's member Lease (named by a hash: identities need not be valid names).
    pub fn member_lease(&self) -> String {
        format!("{}-member-{:016x}", self.name, fnv1a64(self.identity.as_bytes()))
    }
}

/// The most shards one instance holds while `live` instances are alive.
pub fn fair_share(count: u32, live: usize) -> usize {
    (count as usize).div_ceil(live.max(1))
}

struct Term {
    cancel: CancellationToken,
    gate: Arc<RwLock<()>>,
}

/// Held while one reconcile of a held shard runs: the shard is not given back before it
/// is dropped. `cancelled` fires when the shard is lost; the reconcile must end then.
pub(crate) struct Entered {
    /// Cancelled when this instance stops acting on the shard.
    pub cancelled: CancellationToken,
    _gate: OwnedRwLockReadGuard<()>,
}

/// Which shards this instance holds now; what reconciles and hub triggers consult.
pub(crate) struct ShardMap {
    count: u32,
    held: Mutex<HashMap<u32, Term>>,
    acquired: mpsc::UnboundedSender<u32>,
    /// The held set, for those who start or stop work with it (the hub follower).
    changed: watch::Sender<BTreeSet<u32>>,
}

impl ShardMap {
    /// A map of `count` shards, none held. Each shard taken later is sent to the receiver
    /// (so its Runtimes can be reconciled at once).
    pub fn new(count: u32) -> (Arc<Self>, mpsc::UnboundedReceiver<u32>) {
        let (tx, rx) = mpsc::unbounded_channel();
        let (changed, _) = watch::channel(BTreeSet::new());
        (Arc::new(Self { count: count.max(1), held: Mutex::new(HashMap::new()), acquired: tx, changed }), rx)
    }

    /// Follows the held set: the receiver sees every change (the latest value).
    pub fn subscribe(&self) -> watch::Receiver<BTreeSet<u32>> {
        self.changed.subscribe()
    }

    fn publish(&self) {
        let held = self.held();
        self.changed.send_if_modified(|h| {
            let differs = *h != held;
            *h = held;
            differs
        });
    }

    /// The number of shards.
    pub fn count(&self) -> u32 {
        self.count
    }

    /// The shard of a Runtime.
    pub fn shard(&self, rt: &Runtime) -> u32 {
        shard_of_runtime(rt, self.count)
    }

    /// The shards held now, in order.
    pub fn held(&self) -> BTreeSet<u32> {
        self.held.lock().map(|h| h.keys().copied().collect()).unwrap_or_default()
    }

    /// Whether this instance acts on the Runtime's shard now.
    pub fn owns(&self, rt: &Runtime) -> bool {
        let shard = self.shard(rt);
        self.held.lock().is_ok_and(|h| h.contains_key(&shard))
    }

    /// Enters a reconcile of `rt`: `None` when its shard is not held (or is being given back).
    pub fn enter(&self, rt: &Runtime) -> Option<Entered> {
        let shard = self.shard(rt);
        // Fail closed: a poisoned map acts on nothing.
        let held = self.held.lock().ok()?;
        let term = held.get(&shard)?;
        if term.cancel.is_cancelled() {
            return None;
        }
        let gate = term.gate.clone().try_read_owned().ok()?;
        Some(Entered { cancelled: term.cancel.clone(), _gate: gate })
    }

    /// Starts acting on `shard` (its Lease was just taken).
    pub(crate) fn start(&self, shard: u32) {
        if let Ok(mut held) = self.held.lock() {
            held.insert(shard, Term { cancel: CancellationToken::new(), gate: Arc::new(RwLock::new(())) });
        }
        self.publish();
        let _ = self.acquired.send(shard);
    }

    /// Stops acting on `shard`: no new reconcile enters, those in flight are cancelled, and
    /// this returns once they have all ended (`true`) or `wait` passed (`false`).
    pub(crate) async fn stop(&self, shard: u32, wait: Duration) -> bool {
        let term = self.held.lock().ok().and_then(|mut h| h.remove(&shard));
        let Some(term) = term else { return true };
        term.cancel.cancel();
        self.publish();
        tokio::time::timeout(wait, term.gate.write()).await.is_ok()
    }
}

/// What the instance saw of one Lease, and when (by its own clock) that record changed.
struct Seen {
    record: String,
    since: Instant,
}

/// Keeps this instance's member Lease and its share of shard Leases until `shutdown`,
/// then gives every shard back and removes the member Lease.
pub(crate) async fn maintain(
    client: kube::Client,
    config: ShardConfig,
    map: Arc<ShardMap>,
    shutdown: CancellationToken,
) {
    let mut keeper = Keeper {
        api: Api::namespaced(client, &config.namespace),
        config,
        map,
        seen: HashMap::new(),
        renewed: HashMap::new(),
        reported: None,
        waiting_on: None,
    };
    tracing::info!(
        identity = %keeper.config.identity,
        shards = keeper.config.count,
        leases = %format!("{}/{}-shard-*", keeper.config.namespace, keeper.config.name),
        "sharded: taking a share of the shards"
    );
    loop {
        let round = tokio::time::timeout(keeper.config.renew_deadline, keeper.round());
        tokio::select! {
            _ = shutdown.cancelled() => break,
            r = round => match r {
                Ok(Ok(())) => {}
                Ok(Err(e)) => tracing::warn!(error = %e, "shard lease round failed"),
                Err(_) => tracing::warn!("shard lease round timed out"),
            }
        }
        keeper.enforce_deadlines().await;
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = tokio::time::sleep(keeper.config.retry_period) => {}
        }
    }
    keeper.shut_down().await;
}

struct Keeper {
    api: Api<Lease>,
    config: ShardConfig,
    map: Arc<ShardMap>,
    seen: HashMap<String, Seen>,
    /// Per held shard: when the last successful renewal was sent.
    renewed: HashMap<u32, Instant>,
    /// The last (held, live) logged, to log changes only.
    reported: Option<(BTreeSet<u32>, usize)>,
    /// A shard of one: the other holder last logged as leading, to log changes only.
    waiting_on: Option<String>,
}

/// Adds the group and role labels to a Lease that may lack them (the single leader's Lease
/// written by a release before the shards), so the next round's list finds it.
fn ensure_labels(lease: &mut Lease, group: &str, role: &str) {
    let labels = lease.metadata.labels.get_or_insert_with(Default::default);
    labels.insert(GROUP_LABEL.to_string(), group.to_string());
    labels.insert(ROLE_LABEL.to_string(), role.to_string());
}

fn holder_of(lease: &Lease) -> String {
    lease.spec.as_ref().and_then(|s| s.holder_identity.clone()).unwrap_or_default()
}

impl Keeper {
    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    fn fresh(&self, name: &str, role: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(self.config.namespace.clone()),
                labels: Some(
                    [(GROUP_LABEL.to_string(), self.config.name.clone()), (ROLE_LABEL.to_string(), role.into())].into(),
                ),
                ..ObjectMeta::default()
            },
            spec: Some(self.spec(0, None)),
        }
    }

    /// Notes the record of `lease` and, when it changed, the time (by our own clock). Every
    /// Lease is observed every round, so an expiry counts from the last change we could see.
    fn observe(&mut self, lease: &Lease, now: Instant) {
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!("{holder}|{:?}|{:?}", spec.renew_time.as_ref().map(|t| t.0), spec.lease_transitions);
        let seen = self.seen.entry(lease.name_any()).or_insert_with(|| Seen { record: record.clone(), since: now });
        if seen.record != record {
            *seen = Seen { record, since: now };
        }
    }

    /// Whether `lease` is expired by our own clock: no holder, or a record unchanged for a
    /// whole lease duration since we saw it change (see [`Keeper::observe`]).
    fn expired(&mut self, lease: &Lease, now: Instant) -> bool {
        self.observe(lease, now);
        let spec = lease.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let since = self.seen.get(&lease.name_any()).map_or(now, |s| s.since);
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.config.lease_duration);
        holder.is_empty() || now.duration_since(since) >= duration
    }

    /// One round: renew what we hold, count the live instances, give back extras, take a
    /// share of what is free.
    async fn round(&mut self) -> Result<(), kube::Error> {
        let selector = format!("{GROUP_LABEL}={}", self.config.name);
        let list = self.api.list(&ListParams::default().labels(&selector)).await?;
        let now = Instant::now();
        let mut leases: HashMap<String, Lease> = list.items.into_iter().map(|l| (l.name_any(), l)).collect();
        if self.config.count == 1 {
            // The single leader's Lease of a release before the shards carries no labels:
            // read it by name, or we would create a second Lease beside a live leader's.
            let name = self.config.shard_lease(0);
            if !leases.contains_key(&name)
                && let Some(legacy) = self.api.get_opt(&name).await?
            {
                leases.insert(name, legacy);
            }
        }
        for lease in leases.values() {
            self.observe(lease, now);
        }
        self.seen.retain(|name, _| leases.contains_key(name));

        // Announce ourselves; count the others whose announcement is alive.
        let me = self.config.member_lease();
        self.renew_member(leases.remove(&me)).await?;
        let mut live = 1;
        let mut dead_members = Vec::new();
        let members: Vec<Lease> = leases
            .values()
            .filter(|l| l.labels().get(ROLE_LABEL).map(String::as_str) == Some("member"))
            .cloned()
            .collect();
        for lease in members {
            if self.expired(&lease, now) {
                dead_members.push(lease);
            } else {
                live += 1;
            }
        }
        // Renew held shards; a shard whose Lease is no longer ours is lost at once.
        for shard in self.map.held() {
            let name = self.config.shard_lease(shard);
            let lease = leases.get(&name).cloned();
            let ours = lease.as_ref().is_some_and(|l| holder_of(l) == self.config.identity);
            let Some(mut lease) = lease.filter(|_| ours) else {
                tracing::warn!(shard, "lost the shard's lease; stopped reconciling its runtimes");
                self.lose(shard).await;
                continue;
            };
            let spec = lease.spec.clone().unwrap_or_default();
            lease.spec = Some(self.spec(spec.lease_transitions.unwrap_or(0), spec.acquire_time.clone()));
            ensure_labels(&mut lease, &self.config.name, "shard");
            let sent = Instant::now();
            match self.api.replace(&name, &PostParams::default(), &lease).await {
                Ok(l) => {
                    self.renewed.insert(shard, sent);
                    leases.insert(name, l);
                }
                Err(kube::Error::Api(s)) if s.code == 409 || s.code == 404 => {
                    tracing::warn!(shard, "lost the shard's lease to a concurrent write; stopped reconciling");
                    self.lose(shard).await;
                }
                Err(e) => tracing::warn!(shard, error = %e, "cannot renew the shard's lease"),
            }
        }
        let share = fair_share(self.config.count, live);
        // Give back what is beyond our share, highest shards first.
        let mut held = self.map.held();
        while held.len() > share {
            let Some(shard) = held.pop_last() else { break };
            self.give_back(shard, leases.get(&self.config.shard_lease(shard)).cloned()).await;
        }
        // Take free or expired shards while below our share, starting at a place of our own
        // so that instances starting together do not all race for shard 0.
        let start = (fnv1a64(self.config.identity.as_bytes()) % u64::from(self.config.count)) as u32;
        for k in 0..self.config.count {
            if self.map.held().len() >= share {
                break;
            }
            let shard = (start + k) % self.config.count;
            if self.map.held().contains(&shard) {
                continue;
            }
            let name = self.config.shard_lease(shard);
            match leases.get(&name).cloned() {
                None => {
                    let sent = Instant::now();
                    match self.api.create(&PostParams::default(), &self.fresh(&name, "shard")).await {
                        Ok(_) => self.take(shard, sent),
                        Err(kube::Error::Api(s)) if s.code == 409 => {} // someone else was faster
                        Err(e) => tracing::warn!(shard, error = %e, "cannot create the shard's lease"),
                    }
                }
                Some(mut lease) => {
                    let holder = holder_of(&lease);
                    let mine = holder == self.config.identity;
                    if !mine && !self.expired(&lease, now) {
                        if self.config.count == 1 && self.waiting_on.as_ref() != Some(&holder) {
                            tracing::info!(lease = %name, leader = %holder, "another instance leads; waiting");
                            self.waiting_on = Some(holder);
                        }
                        continue;
                    }
                    let spec = lease.spec.clone().unwrap_or_default();
                    let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
                    lease.spec = Some(self.spec(transitions, None));
                    ensure_labels(&mut lease, &self.config.name, "shard");
                    let sent = Instant::now();
                    // The resourceVersion read guards the write: a concurrent taker makes it 409.
                    match self.api.replace(&name, &PostParams::default(), &lease).await {
                        Ok(_) => self.take(shard, sent),
                        Err(kube::Error::Api(s)) if s.code == 409 => {}
                        Err(e) => tracing::warn!(shard, error = %e, "cannot take the shard's lease"),
                    }
                }
            }
        }
        // Announcements of instances gone for good are removed (guarded by their version).
        for lease in dead_members {
            let expired_long = self
                .seen
                .get(&lease.name_any())
                .is_some_and(|s| now.duration_since(s.since) >= self.config.lease_duration * 4);
            if expired_long {
                let dp = DeleteParams {
                    preconditions: Some(Preconditions { resource_version: lease.resource_version(), uid: None }),
                    ..DeleteParams::default()
                };
                let _ = self.api.delete(&lease.name_any(), &dp).await;
            }
        }
        let state = (self.map.held(), live);
        if self.reported.as_ref() != Some(&state) {
            tracing::info!(held = ?state.0, live_instances = live, share, "shards held");
            self.reported = Some(state);
        }
        Ok(())
    }

    async fn renew_member(&mut self, current: Option<Lease>) -> Result<(), kube::Error> {
        let me = self.config.member_lease();
        match current {
            None => match self.api.create(&PostParams::default(), &self.fresh(&me, "member")).await {
                Ok(_) => Ok(()),
                Err(kube::Error::Api(s)) if s.code == 409 => Ok(()), // created meanwhile: next round
                Err(e) => Err(e),
            },
            Some(mut lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                lease.spec = Some(self.spec(spec.lease_transitions.unwrap_or(0), spec.acquire_time.clone()));
                match self.api.replace(&me, &PostParams::default(), &lease).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
                    Err(e) => Err(e),
                }
            }
        }
    }

    fn take(&mut self, shard: u32, sent: Instant) {
        if self.config.count == 1 {
            tracing::info!(lease = %self.config.shard_lease(shard), identity = %self.config.identity, "leading");
            self.waiting_on = None;
        }
        tracing::info!(shard, lease = %self.config.shard_lease(shard), "took the shard; reconciling its runtimes");
        self.renewed.insert(shard, sent);
        self.map.start(shard);
    }

    async fn lose(&mut self, shard: u32) {
        self.renewed.remove(&shard);
        self.map.stop(shard, self.config.renew_deadline).await;
    }

    /// Stops acting on `shard`, then clears its holder so another instance takes it at once.
    /// When reconciles did not end in time the Lease is left to expire instead.
    async fn give_back(&mut self, shard: u32, lease: Option<Lease>) {
        self.renewed.remove(&shard);
        if !self.map.stop(shard, self.config.renew_deadline).await {
            tracing::warn!(shard, "reconciles of the shard did not end in time; leaving its lease to expire");
            return;
        }
        let name = self.config.shard_lease(shard);
        let lease = match lease {
            Some(l) => Some(l),
            None => self.api.get_opt(&name).await.ok().flatten(),
        };
        let Some(mut lease) = lease.filter(|l| holder_of(l) == self.config.identity) else { return };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
            spec.renew_time = None;
            spec.acquire_time = None;
        }
        match self.api.replace(&name, &PostParams::default(), &lease).await {
            Ok(_) => tracing::info!(shard, "gave the shard back"),
            Err(e) => tracing::warn!(shard, error = %e, "cannot give the shard's lease back; it will expire"),
        }
    }

    /// A held shard not renewed within the renew deadline is no longer acted on: the Lease
    /// may expire for others soon after.
    async fn enforce_deadlines(&mut self) {
        for shard in self.map.held() {
            let overdue = self.renewed.get(&shard).is_none_or(|at| at.elapsed() >= self.config.renew_deadline);
            if overdue {
                tracing::warn!(shard, deadline = ?self.config.renew_deadline, "could not renew the shard's lease in time; stopped reconciling its runtimes");
                self.lose(shard).await;
            }
        }
    }

    async fn shut_down(&mut self) {
        for shard in self.map.held() {
            self.give_back(shard, None).await;
        }
        let _ = self.api.delete(&self.config.member_lease(), &DeleteParams::default()).await;
        tracing::info!("gave back every shard");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shards_are_stable_across_builds_and_processes() {
        // Fixed values: a change of the hash (or of what is hashed) would move Runtimes
        // between shards in a rolling upgrade, so it must show up here.
        assert_eq!(shard_of("default", "rt0", 1), 0);
        let fixed: Vec<u32> = (0..8).map(|i| shard_of("kcp", &format!("rt{i}"), 3)).collect();
        let again: Vec<u32> = (0..8).map(|i| shard_of("kcp", &format!("rt{i}"), 3)).collect();
        assert_eq!(fixed, again);
        let expected: Vec<u32> = (0..8).map(|i| (fnv1a64(format!("kcp/rt{i}").as_bytes()) % 3) as u32).collect();
        assert_eq!(fixed, expected);
        assert_eq!(shard_of("a", "b/c", 12), (fnv1a64(b"a/b/c") % 12) as u32);
    }

    #[test]
    fn runtimes_spread_over_the_shards() {
        let mut per = [0u32; 3];
        for i in 0..3000 {
            per[shard_of("kcp", &format!("rt{i}"), 3) as usize] += 1;
        }
        assert!(per.iter().all(|n| (800..1200).contains(n)), "{per:?}");
    }

    #[test]
    fn the_fair_share_covers_every_shard() {
        for count in 1..20u32 {
            for live in 1..10usize {
                let share = fair_share(count, live);
                assert!(share * live >= count as usize);
                assert!(share.saturating_sub(1) * live < count as usize, "share is the smallest that covers");
            }
        }
        assert_eq!(fair_share(3, 0), 3);
    }

    #[tokio::test]
    async fn a_lost_shard_waits_for_its_reconciles_and_refuses_new_ones() {
        let (map, mut acquired) = ShardMap::new(1);
        let mut rt = Runtime::new("rt", Default::default());
        rt.metadata.namespace = Some("ns".into());
        assert!(map.enter(&rt).is_none(), "no shard held, nothing entered");
        map.start(0);
        assert_eq!(acquired.recv().await, Some(0));
        let entered = map.enter(&rt).expect("held");
        let cancelled = entered.cancelled.clone();
        let map2 = map.clone();
        let stopping = tokio::spawn(async move { map2.stop(0, Duration::from_secs(60)).await });
        cancelled.cancelled().await;
        assert!(map.enter(&rt).is_none(), "a shard being given back admits no reconcile");
        assert!(!stopping.is_finished());
        drop(entered);
        assert!(stopping.await.unwrap(), "stop returns once the reconcile ended");
        assert!(map.held().is_empty());
    }
}
