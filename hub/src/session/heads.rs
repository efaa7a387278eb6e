//! Which agent sessions look at their cluster's head, and when (decision 0037).
//!
//! On a bus shared by hub replicas a second agent process of a cluster may append through
//! another replica while the first is connected here; its records may carry older states
//! than the first reported (seed 2928), and an idle first process never sends those objects
//! again. The session then stores a `resync-required` after them
//! (`agent::Session::check_interleaved`). It used to look at the head every idle timeout:
//! one request to the stream leader per session and idle timeout (1,000/s at 30,000
//! clusters) for what almost never happens. Now a session looks only when it is poked:
//! - a replica records the head of a cluster in the heads bucket after its records were
//!   stored (at once when the head is of another agent process than the one it knew, and
//!   for records whose fate it did not learn once its link works again); every replica
//!   follows the bucket ([`fleetwatch_bus::ReplicaShare::follow_heads`], one watch per
//!   replica) and pokes the sessions of the cluster of another agent process
//!   ([`HeadWatch::head_written`]);
//! - a replica that went away (its heartbeat expired) or started again may have died
//!   before it recorded heads: every session here is poked once, spread over an idle
//!   timeout ([`HeadWatch::sweep`]).
//!
//! A poke costs one head read; only a head of another process goes on to the check.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

/// The agent sessions of this replica that look at their cluster's head when poked.
#[derive(Default)]
pub(crate) struct HeadWatch {
    /// Per cluster its sessions (usually one), by id. Ordered maps: a sweep pokes in the
    /// same order on every run of a simulation seed.
    sessions: Mutex<BTreeMap<Arc<str>, BTreeMap<u64, Watcher>>>,
    next: AtomicU64,
    /// Pokes sent, for the metrics and tests.
    pokes: AtomicU64,
}

struct Watcher {
    epoch: u64,
    poke: Arc<Notify>,
}

/// One session's place in the [`HeadWatch`]; leaves it when dropped.
pub(crate) struct Watching {
    watch: Arc<HeadWatch>,
    cluster: Arc<str>,
    id: u64,
    /// Notified when the session should look at its cluster's head (a permit is kept while
    /// it is busy, so no poke is lost).
    pub(crate) poke: Arc<Notify>,
}

impl Drop for Watching {
    fn drop(&mut self) {
        let mut sessions = lock(&self.watch.sessions);
        if let Some(of) = sessions.get_mut(&self.cluster) {
            of.remove(&self.id);
            if of.is_empty() {
                sessions.remove(&self.cluster);
            }
        }
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A poisoned lock only means a panic elsewhere mid-update of a plain map.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl HeadWatch {
    /// Registers a session of agent process `epoch` of `cluster`: from now on a head of
    /// another process recorded for the cluster pokes it.
    pub(crate) fn watch(self: &Arc<Self>, cluster: &Arc<str>, epoch: u64) -> Watching {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let poke = Arc::new(Notify::new());
        lock(&self.sessions).entry(cluster.clone()).or_default().insert(id, Watcher { epoch, poke: poke.clone() });
        Watching { watch: self.clone(), cluster: cluster.clone(), id, poke }
    }

    /// A replica recorded `epoch` as the agent process of `cluster`'s head: its sessions of
    /// other processes look. Answers how many were poked.
    pub(crate) fn head_written(&self, cluster: &str, epoch: u64) -> usize {
        let sessions = lock(&self.sessions);
        let Some(of) = sessions.get(cluster) else { return 0 };
        let mut poked = 0;
        for w in of.values().filter(|w| w.epoch != epoch) {
            w.poke.notify_one();
            poked += 1;
        }
        self.pokes.fetch_add(poked as u64, Ordering::Relaxed);
        poked
    }

    /// Pokes every session, spread over `over` (a replica went away or started again: the
    /// heads it had not recorded yet are unknown). Runs until every session was poked.
    pub(crate) async fn sweep(&self, over: Duration) {
        let all: Vec<Arc<Notify>> =
            lock(&self.sessions).values().flat_map(|of| of.values().map(|w| w.poke.clone())).collect();
        if all.is_empty() {
            return;
        }
        // A hundred steps at most: a replica of 30,000 sessions asks JetStream at the rate
        // the idle-time check used to, for one idle timeout.
        let per_step = all.len().div_ceil(100);
        let steps = all.len().div_ceil(per_step);
        let pause = over / u32::try_from(steps).unwrap_or(100);
        for chunk in all.chunks(per_step) {
            for poke in chunk {
                poke.notify_one();
            }
            self.pokes.fetch_add(chunk.len() as u64, Ordering::Relaxed);
            tokio::time::sleep(pause).await;
        }
    }

    /// Pokes sent so far.
    #[cfg(test)]
    pub(crate) fn pokes(&self) -> u64 {
        self.pokes.load(Ordering::Relaxed)
    }
}

/// Which replicas of the live ones (name → incarnation, 0 when its release does not say)
/// went away or started again since `before`: the heads they had not recorded may be lost.
pub(crate) fn replicas_gone(before: &BTreeMap<String, u64>, now: &BTreeMap<String, u64>, me: &str) -> Vec<String> {
    before
        .iter()
        .filter(|(name, _)| name.as_str() != me)
        .filter(|(name, inc)| match now.get(name.as_str()) {
            None => true,
            Some(now) => **inc != 0 && *now != 0 && *now != **inc,
        })
        .map(|(name, _)| name.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A poke is kept while the session does not wait for it, and counted once.
    async fn poked(w: &Watching) -> bool {
        tokio::time::timeout(Duration::from_millis(1), w.poke.notified()).await.is_ok()
    }

    #[tokio::test(start_paused = true)]
    async fn only_sessions_of_another_agent_process_of_the_cluster_are_poked() {
        let watch = Arc::new(HeadWatch::default());
        let c1: Arc<str> = "c1".into();
        let a = watch.watch(&c1, 7);
        let other = watch.watch(&"c2".into(), 7);
        assert_eq!(watch.head_written("c1", 7), 0, "its own process's head");
        assert!(!poked(&a).await);
        assert_eq!(watch.head_written("c3", 9), 0, "a cluster without a session here");
        assert_eq!(watch.head_written("c1", 9), 1);
        assert_eq!(watch.head_written("c1", 9), 1, "twice while busy: one permit kept");
        assert!(poked(&a).await, "kept while the session was busy");
        assert!(!poked(&a).await, "one permit for both");
        assert!(!poked(&other).await);
        drop(a);
        assert_eq!(watch.head_written("c1", 9), 0, "a session that ended leaves");
        assert_eq!(watch.pokes(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_sweep_pokes_every_session_once_spread_over_the_time_given() {
        let watch = Arc::new(HeadWatch::default());
        let sessions: Vec<Watching> = (0..250).map(|i| watch.watch(&format!("c{i}").into(), 1)).collect();
        let started = tokio::time::Instant::now();
        watch.sweep(Duration::from_secs(30)).await;
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(29) && took <= Duration::from_secs(31), "{took:?}");
        for s in &sessions {
            assert!(poked(s).await);
        }
        assert_eq!(watch.pokes(), 250);
    }

    #[test]
    fn replicas_that_went_away_or_started_again_are_found() {
        let m = |v: &[(&str, u64)]| v.iter().map(|(n, i)| (n.to_string(), *i)).collect::<BTreeMap<_, _>>();
        let before = m(&[("me", 1), ("a", 5), ("b", 6), ("old", 0)]);
        assert!(replicas_gone(&before, &before, "me").is_empty());
        assert_eq!(replicas_gone(&before, &m(&[("a", 5), ("b", 7), ("old", 0)]), "me"), vec!["b"], "b started again");
        assert_eq!(replicas_gone(&before, &m(&[("me", 2), ("b", 6)]), "me"), vec!["a", "old"], "gone; not me");
        assert!(
            replicas_gone(&before, &m(&[("me", 1), ("a", 5), ("b", 6), ("old", 3)]), "me").is_empty(),
            "0: unknown"
        );
        assert!(replicas_gone(&before, &m(&[("me", 1), ("a", 5), ("b", 6), ("old", 0), ("new", 1)]), "me").is_empty());
    }
}
