//! Tests of the writer's decisions and its compare-and-set ownership (`super`), on an
//! in-memory [`ReplicaShare`].

use std::collections::HashSet;
use std::sync::Mutex;

use fleetwatch_bus::{BusError, BusFuture, EntryStream};

use super::*;

const MAX: usize = 15 << 10;

fn status(cluster: &str, connected: bool) -> ClusterStatus {
    ClusterStatus { cluster: cluster.into(), connected, ..ClusterStatus::default() }
}

fn cached(cluster: &str, hub: &str, connected: bool, revision: u64) -> Cached {
    let raw = crate::fleet::entry::encode(FleetEntry::new(status(cluster, connected), hub), MAX);
    cached_of(&raw, revision, None, &mut Default::default()).unwrap()
}

fn owned(s: &ClusterStatus, revision: u64) -> Owned {
    Owned { revision, digest: crate::fleet::entry::digest(s), refresh_at: Instant::now() }
}

fn expect_of(job: Option<Job>) -> Option<Expect> {
    job.map(|j| j.expect)
}

#[test]
fn a_cluster_connected_here_is_written_whatever_is_there_and_only_on_change() {
    let up = status("c", true);
    assert_eq!(expect_of(plan("a", "c", Some(up.clone()), None, None, false, MAX)), Some(Expect::Any));
    // Unchanged since this replica wrote it, and the bus still holds that write: nothing.
    let mine = owned(&up, 5);
    let there = cached("c", "a", true, 5);
    assert_eq!(plan("a", "c", Some(up.clone()), Some(&there), Some(&mine), false, MAX), None);
    // Counters and last-seen moving are no change.
    let busy = ClusterStatus { events_received: 900, acked_seq: 900, ..up.clone() };
    assert_eq!(plan("a", "c", Some(busy), Some(&there), Some(&mine), false, MAX), None);
    // ... but a refresh rewrites it (so it does not expire).
    assert_eq!(expect_of(plan("a", "c", Some(up.clone()), Some(&there), Some(&mine), true, MAX)), Some(Expect::Any));
    // Another replica wrote "not connected" over it since: written again.
    let over = cached("c", "b", false, 6);
    assert_eq!(expect_of(plan("a", "c", Some(up), Some(&over), Some(&mine), false, MAX)), Some(Expect::Any));
}

#[test]
fn a_disconnect_is_written_only_over_this_replicas_own_entry() {
    let down = status("c", false);
    let up = status("c", true);
    // Over what it wrote last: compare-and-set on that revision.
    let mine = owned(&up, 5);
    let job = plan("a", "c", Some(down.clone()), Some(&cached("c", "a", true, 5)), Some(&mine), false, MAX);
    assert_eq!(expect_of(job.clone()), Some(Expect::Revision(5)));
    let written = FleetEntry::decode(&job.unwrap().value).unwrap();
    assert_eq!((written.hub.as_str(), written.status.connected), ("a", false));
    // Its earlier life's entry (written before a restart): on that entry's revision.
    let before = cached("c", "a", true, 9);
    assert_eq!(
        expect_of(plan("a", "c", Some(down.clone()), Some(&before), None, false, MAX)),
        Some(Expect::Revision(9))
    );
    // Another replica's entry: its agent is there; left alone.
    let theirs = cached("c", "b", true, 9);
    assert_eq!(plan("a", "c", Some(down.clone()), Some(&theirs), None, false, MAX), None);
    // No entry at all: only if there is still none.
    assert_eq!(expect_of(plan("a", "c", Some(down), None, None, false, MAX)), Some(Expect::Absent));
}

#[test]
fn an_entry_of_an_earlier_life_unknown_to_the_registry_is_set_to_not_connected() {
    let job = plan("a", "c", None, Some(&cached("c", "a", true, 4)), None, false, MAX).unwrap();
    assert_eq!(job.expect, Expect::Revision(4));
    assert!(!FleetEntry::decode(&job.value).unwrap().status.connected);
    assert_eq!(plan("a", "c", None, Some(&cached("c", "a", false, 4)), None, false, MAX), None, "already says so");
    assert_eq!(plan("a", "c", None, Some(&cached("c", "b", true, 4)), None, false, MAX), None, "another's");
    assert_eq!(plan("a", "c", None, None, None, false, MAX), None);
}

#[test]
fn refreshes_are_spread_between_half_a_day_and_a_day() {
    let now = Instant::now();
    let times: Vec<Duration> = (0..200).map(|i| refresh_at(&format!("c-{i}"), now) - now).collect();
    assert!(times.iter().all(|t| *t >= REFRESH / 2 && *t <= REFRESH));
    let distinct: HashSet<u64> = times.iter().map(|t| t.as_secs() / 600).collect();
    assert!(distinct.len() > 40, "not a burst: {} ten-minute slots of 72", distinct.len());
}

/// One bucket of entries with revisions, as the bus keeps them (compare-and-set included).
#[derive(Default)]
struct MemShare {
    entries: Mutex<HashMap<String, (Bytes, u64)>>,
    revision: Mutex<u64>,
    /// Every write fails (NATS down, the bucket full).
    failing: std::sync::atomic::AtomicBool,
}

impl MemShare {
    fn entry(&self, cluster: &str) -> Option<FleetEntry> {
        self.entries.lock().unwrap().get(cluster).and_then(|(v, _)| FleetEntry::decode(v))
    }

    fn cached(&self, cluster: &str) -> Option<Cached> {
        let (v, r) = self.entries.lock().unwrap().get(cluster).cloned()?;
        cached_of(&v, r, None, &mut Default::default())
    }
}

impl ReplicaShare for MemShare {
    fn heartbeat<'a>(&'a self, _: &'a str, _: Bytes) -> BusFuture<'a, ()> {
        Box::pin(async { Ok(()) })
    }

    fn replicas(&self) -> BusFuture<'_, Vec<(String, Bytes)>> {
        Box::pin(async { Ok(Vec::new()) })
    }

    fn write_entry<'a>(&'a self, cluster: &'a str, value: Bytes, expect: Expect) -> BusFuture<'a, Written> {
        Box::pin(async move {
            if self.failing.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(BusError::Closed);
            }
            let mut entries = self.entries.lock().unwrap();
            let there = entries.get(cluster).map(|(_, r)| *r);
            let ok = match expect {
                Expect::Any => true,
                Expect::Absent => there.is_none(),
                Expect::Revision(r) => there == Some(r),
            };
            if !ok {
                return Ok(Written::Moved);
            }
            let mut rev = self.revision.lock().unwrap();
            *rev += 1;
            entries.insert(cluster.into(), (value, *rev));
            Ok(Written::Stored(*rev))
        })
    }

    fn follow_entries(&self) -> BusFuture<'_, EntryStream> {
        Box::pin(async { Err(BusError::Closed) })
    }

    fn max_entry_bytes(&self) -> usize {
        MAX
    }

    fn entry_max_age(&self) -> Duration {
        Duration::from_secs(7 * 24 * 3600)
    }

    fn generation(&self) -> u64 {
        0
    }

    fn follow_heads(&self) -> BusFuture<'_, fleetwatch_bus::HeadStream> {
        Box::pin(async { Ok(Box::pin(futures_util::stream::pending()) as fleetwatch_bus::HeadStream) })
    }
}

/// Replica `me`'s writer and what it follows of the bus.
struct Replica {
    fleet: FleetState,
    writer: Writer,
    metrics: crate::metrics::Metrics,
}

impl Replica {
    fn new(me: &str) -> Self {
        Self { fleet: FleetState::new(me), writer: Writer::default(), metrics: Default::default() }
    }

    /// One round for `cluster` with the registry showing `status`, after following the bus.
    async fn write(&mut self, share: &MemShare, cluster: &str, status: Option<ClusterStatus>) {
        self.fleet.apply(cluster.into(), share.cached(cluster));
        let registry = move |_: &str| status.clone();
        self.writer.round(share, &self.fleet, registry, vec![(cluster.into(), false)], &self.metrics).await;
    }
}

#[tokio::test]
async fn a_disconnect_on_the_replica_the_agent_left_does_not_overwrite_the_new_ones_entry() {
    let share = MemShare::default();
    let (mut a, mut b) = (Replica::new("a"), Replica::new("b"));
    a.write(&share, "c", Some(status("c", true))).await;
    assert_eq!(share.entry("c").map(|e| (e.hub, e.status.connected)), Some(("a".into(), true)));
    // The agent moved to b before a noticed it gone (a's follow has not seen b's write).
    b.write(&share, "c", Some(status("c", true))).await;
    let registry = |_: &str| Some(status("c", false));
    a.writer.round(&share, &a.fleet, registry, vec![("c".into(), false)], &a.metrics).await;
    assert_eq!(share.entry("c").map(|e| (e.hub, e.status.connected)), Some(("b".into(), true)), "b's entry stays");
    assert_eq!(a.metrics.fleet_moved.get(), 1);
    assert!(!a.writer.owned.contains_key("c"), "a no longer takes the entry for its own");
    // The agent leaves b too: b's compare-and-set on its own write succeeds.
    b.write(&share, "c", Some(status("c", false))).await;
    assert_eq!(share.entry("c").map(|e| (e.hub, e.status.connected)), Some(("b".into(), false)));
    assert_eq!(b.metrics.fleet_writes.get(), 2);
}

#[tokio::test]
async fn a_write_that_a_disconnect_overtook_is_healed_by_the_replica_that_has_the_agent() {
    let share = MemShare::default();
    let (mut a, mut b) = (Replica::new("a"), Replica::new("b"));
    b.write(&share, "c", Some(status("c", true))).await;
    // a's late write (a report queued before it saw the agent go), then a's disconnect over it.
    a.write(&share, "c", Some(status("c", true))).await;
    a.write(&share, "c", Some(status("c", false))).await;
    assert_eq!(share.entry("c").map(|e| (e.hub, e.status.connected)), Some(("a".into(), false)));
    // b follows that write, still has the agent, and writes its own entry again although
    // nothing changed in its registry.
    b.write(&share, "c", Some(status("c", true))).await;
    assert_eq!(share.entry("c").map(|e| (e.hub, e.status.connected)), Some(("b".into(), true)));
}

#[tokio::test]
async fn unchanged_entries_are_not_written_again_and_failed_ones_wait_their_turn() {
    let share = MemShare::default();
    let mut a = Replica::new("a");
    a.write(&share, "c", Some(status("c", true))).await;
    a.write(&share, "c", Some(ClusterStatus { events_received: 5, ..status("c", true) })).await;
    assert_eq!(a.metrics.fleet_writes.get(), 1, "counters alone are no change");
    // Coalescing: a cluster written just now is not due again within COALESCE.
    a.writer.waiting.insert("c".into());
    let now = Instant::now();
    assert!(a.writer.due(now).is_empty());
    assert_eq!(a.writer.due_after(now), Some(a.writer.tried["c"] + COALESCE));
    assert_eq!(a.writer.due(now + COALESCE), ["c"]);
    assert_eq!(a.writer.due_after(now + COALESCE), None);
}

#[tokio::test]
async fn writes_that_all_fail_are_retried_later_each_round_until_one_succeeds() {
    let share = MemShare::default();
    share.failing.store(true, std::sync::atomic::Ordering::SeqCst);
    let mut a = Replica::new("a");
    let mut waits = Vec::new();
    for _ in 0..7 {
        a.write(&share, "c", Some(status("c", true))).await;
        waits.push(a.writer.backoff);
    }
    let secs: Vec<u64> = waits.iter().map(Duration::as_secs).collect();
    assert_eq!(secs, [1, 2, 4, 8, 16, 30, 30]);
    assert_eq!(a.metrics.fleet_write_failures.get(), 7);
    // The failed cluster waits its backoff, then is due again.
    let now = Instant::now();
    assert!(a.writer.due(now).is_empty() && a.writer.waiting.contains("c"));
    assert!(a.writer.due_after(now).unwrap() >= now + MAX_BACKOFF);
    share.failing.store(false, std::sync::atomic::Ordering::SeqCst);
    a.write(&share, "c", Some(status("c", true))).await;
    assert_eq!((a.writer.backoff, a.metrics.fleet_writes.get()), (Duration::ZERO, 1));
}
