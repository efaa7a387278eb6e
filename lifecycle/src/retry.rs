//! Retrying failed modules: every failed step of a module's reconcile (apply, delete, pull,
//! migration, reading what runs) is tried again with capped exponential backoff with
//! jitter, from about 1 s to at most 5 minutes, and the module's status says which step
//! failed, how many times in a row, and when the next try is ([`ModuleRetry`]).
//!
//! Event-driven first: a reconcile triggered by the runtime cluster (the hub's events for
//! it: a Namespace or CRD created, a module's manager becoming Ready) tries again at once,
//! whatever the backoff says; the backoff is only when to look again when nothing happens.
//! The count lives in the status, so an operator restart does not start it from one.
//!
//! The core is pure ([`schedule`]): statuses in, statuses with their retries and the delay
//! of the earliest one out.

use std::time::Duration;

use fleetwatch_api::{FailedStep, ModuleRetry, ModuleStatus, State};
use jiff::Timestamp;

/// The first retry comes after about this long.
pub const FIRST: Duration = Duration::from_secs(1);
/// No retry is further away than this.
pub const MAX: Duration = Duration::from_secs(300);

/// The delay after `failures` failures in a row (1 for the first): `FIRST` doubled per
/// failure, capped at [`MAX`], times a jitter factor between 0.8 and 1.2 (`jitter` in
/// `[0, 1)`), so a fleet of runtimes failing together does not retry in step.
pub fn delay(failures: u32, jitter: f64) -> Duration {
    let doublings = failures.saturating_sub(1).min(16);
    let base = FIRST.saturating_mul(1u32 << doublings).min(MAX);
    let factor = 0.8 + 0.4 * jitter.clamp(0.0, 1.0);
    base.mul_f64(factor).min(MAX)
}

/// A module's status as a failure of `step`: `Error`, the message, and a retry to be
/// scheduled by [`schedule`].
pub fn failed(mut st: ModuleStatus, step: FailedStep, message: String) -> ModuleStatus {
    st.state = State::Error;
    st.message = message;
    st.retry = Some(ModuleRetry { step, failures: 0, next_attempt: String::new() });
    st
}

/// What [`schedule`] decided.
#[derive(Debug, Default, PartialEq)]
pub struct Scheduled {
    /// The earliest retry, from now.
    pub next: Option<Duration>,
    /// The steps tried again in this reconcile after failing before (for the metric).
    pub retried: Vec<FailedStep>,
}

/// Fills in the retries of this reconcile's module statuses (`next`) against the previous
/// ones (`previous`): a module in `Error` counts one more failure in a row than before and
/// gets its next attempt; any other module has none. `jitter` gives each module's jitter
/// factor (in `[0, 1)`) from its name and failure count.
pub fn schedule(
    previous: &[ModuleStatus],
    next: &mut [ModuleStatus],
    now: Timestamp,
    jitter: impl Fn(&str, u32) -> f64,
) -> Scheduled {
    let mut out = Scheduled::default();
    for st in next.iter_mut() {
        if st.state != State::Error {
            st.retry = None;
            continue;
        }
        // Held back (not tried in this reconcile): as it was; due when it said.
        if let Some(r) = st.retry.as_ref().filter(|r| !r.next_attempt.is_empty()) {
            let due = r.next_attempt.parse::<Timestamp>().ok().map(|at| at.duration_since(now));
            // Past due (negative): at once, after a breath.
            let wait =
                due.map_or(FIRST, |d| Duration::try_from(d).unwrap_or(Duration::ZERO)).max(Duration::from_millis(100));
            out.next = Some(out.next.map_or(wait, |n: Duration| n.min(wait)));
            continue;
        }
        let before = previous.iter().find(|p| p.name == st.name).and_then(|p| p.retry.as_ref());
        if let Some(b) = before {
            out.retried.push(b.step);
        }
        let failures = before.map_or(0, |b| b.failures).saturating_add(1);
        // An error without a step (none should be) still comes back: as a failed read.
        let step = st.retry.as_ref().map_or(FailedStep::Read, |r| r.step);
        let wait = delay(failures, jitter(&st.name, failures));
        let at = now
            .checked_add(jiff::SignedDuration::try_from(wait).unwrap_or(jiff::SignedDuration::from_secs(300)))
            .unwrap_or(now);
        st.retry = Some(ModuleRetry { step, failures, next_attempt: seconds(at) });
        out.next = Some(out.next.map_or(wait, |n: Duration| n.min(wait)));
    }
    out
}

/// Per runtime cluster, a count of the changes that can unblock a failed step: Namespaces and
/// CRDs created or deleted, the module inventory changing (a manager Ready), a resync. Bumped
/// by the hub trigger ([`crate::triggers`]); a failed module is tried again before its next
/// attempt is due only when its cluster's count moved since it failed ([`ClusterChanges::moved`]),
/// so unrelated events (a busy cluster's ConfigMaps) or a sibling in progress do not defeat its
/// backoff, and what it waits for still starts it at once.
#[derive(Debug, Default)]
pub struct ClusterChanges {
    counts: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// Per `runtime/module`: the count of its cluster when it last failed.
    failed_at: std::sync::Mutex<std::collections::HashMap<String, u64>>,
}

impl ClusterChanges {
    /// A change in `cluster` that can unblock something (`*`: every cluster).
    pub fn bump(&self, cluster: &str) {
        // `*` counts toward every cluster ([`ClusterChanges::count`]).
        if let Ok(mut c) = self.counts.lock() {
            *c.entry(cluster.to_string()).or_insert(0) += 1;
        }
    }

    fn count(&self, cluster: &str) -> u64 {
        self.counts.lock().map(|c| c.get(cluster).copied().unwrap_or(0) + c.get("*").copied().unwrap_or(0)).unwrap_or(0)
    }

    /// Records that `module` of `runtime` (in `cluster`) failed now.
    pub fn failed(&self, runtime: &str, cluster: &str, module: &str) {
        let n = self.count(cluster);
        if let Ok(mut f) = self.failed_at.lock() {
            f.insert(format!("{runtime}/{module}"), n);
        }
    }

    /// Forgets `module` of `runtime` (it reconciled, or went).
    pub fn recovered(&self, runtime: &str, module: &str) {
        if let Ok(mut f) = self.failed_at.lock() {
            f.remove(&format!("{runtime}/{module}"));
        }
    }

    /// Whether something changed in `cluster` since `module` failed (also when this process
    /// never saw it fail: after a restart everything is tried).
    pub fn moved(&self, runtime: &str, cluster: &str, module: &str) -> bool {
        let at = self.failed_at.lock().ok().and_then(|f| f.get(&format!("{runtime}/{module}")).copied());
        at.is_none_or(|at| self.count(cluster) != at)
    }
}

/// Whether a failed step is held back until its next attempt (steps that write to or read
/// from the runtime cluster); choosing the version only reads the operator's stores, so it is
/// done again at every reconcile.
pub fn held_back(step: FailedStep) -> bool {
    matches!(
        step,
        FailedStep::Apply | FailedStep::DefaultConfig | FailedStep::Delete | FailedStep::Migration | FailedStep::Read
    )
}

/// A timestamp to the second (what people read; the requeue itself is exact).
fn seconds(t: Timestamp) -> String {
    t.round(jiff::Unit::Second).unwrap_or(t).to_string()
}

/// A jitter factor in `[0, 1)` from a key, the failure count and a seed (the clock's
/// nanoseconds): spread over a fleet, repeatable in a test.
pub fn jitter_of(key: &str, failures: u32, seed: i128) -> f64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (key, failures, seed).hash(&mut h);
    (h.finish() >> 11) as f64 / (1u64 << 53) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_delay_doubles_per_failure_up_to_the_cap_with_jitter() {
        use super::{MAX, delay};
        use std::time::Duration;
        assert_eq!(delay(1, 0.5), Duration::from_secs(1));
        assert_eq!(delay(4, 0.5), Duration::from_secs(8));
        assert_eq!(delay(40, 0.99), MAX);
        assert!(delay(1, 0.0) >= Duration::from_millis(800) && delay(1, 0.999) <= Duration::from_millis(1200));
    }

    #[test]
    fn schedule_counts_failures_in_a_row_and_the_retried_steps() {
        use super::{failed, schedule};
        use fleetwatch_api::{FailedStep, ModuleStatus};
        let now: jiff::Timestamp = "2026-11-27T22:00:00Z".parse().unwrap();
        let first =
            vec![failed(ModuleStatus { name: "ghost".into(), ..Default::default() }, FailedStep::Apply, "boom".into())];
        let mut next = first.clone();
        let s = schedule(&[], &mut next, now, |_, _| 0.5);
        assert_eq!(next[0].retry.as_ref().unwrap().failures, 1);
        assert_eq!(next[0].retry.as_ref().unwrap().next_attempt, "2026-11-27T22:00:01Z");
        assert_eq!(s.next, Some(std::time::Duration::from_secs(1)));
        let mut again = first.clone();
        let s = schedule(&next, &mut again, now, |_, _| 0.5);
        assert_eq!(again[0].retry.as_ref().unwrap().failures, 2);
        assert_eq!(s.retried, [FailedStep::Apply]);
    }

    fn module(name: &str, state: State) -> ModuleStatus {
        ModuleStatus { name: name.into(), state, ..Default::default() }
    }

    #[test]
    fn delays_double_from_about_a_second_and_stop_at_five_minutes() {
        let mid: Vec<u64> = (1..=11).map(|n| delay(n, 0.5).as_secs()).collect();
        assert_eq!(mid, [1, 2, 4, 8, 16, 32, 64, 128, 256, 300, 300]);
        for n in [1, 5, 9, 10, 1000, u32::MAX] {
            assert!(delay(n, 0.999_999) <= MAX, "{n}");
            assert!(delay(n, 0.0) >= FIRST.mul_f64(0.8), "{n}");
        }
        // Jitter spreads a fleet: distinct keys give distinct factors.
        let f: std::collections::BTreeSet<u64> =
            (0..50).map(|i| (jitter_of(&format!("rt-{i}/m"), 3, 7) * 1e9) as u64).collect();
        assert!(f.len() > 45, "{f:?}");
        assert!((0..1000).all(|i| (0.0..1.0).contains(&jitter_of(&i.to_string(), 1, 1))));
    }

    #[test]
    fn a_held_back_module_keeps_its_count_and_is_due_when_it_said() {
        let now: Timestamp = "2026-11-27T22:00:00Z".parse().unwrap();
        let mut prev = vec![failed(module("a", State::Processing), FailedStep::Apply, "x".into())];
        schedule(&[], &mut prev, "2026-11-27T21:59:58Z".parse().unwrap(), |_, _| 0.5);
        // Not tried: the status carried over as it was (its retry filled in).
        let mut next = prev.clone();
        let s = schedule(&prev, &mut next, now, |_, _| 0.5);
        assert_eq!(next, prev);
        assert_eq!(s.next, Some(Duration::from_millis(100))); // due 1 s after 21:59:58: now
        assert!(s.retried.is_empty());
    }

    #[test]
    fn changes_since_a_failure_let_it_be_tried_early() {
        let c = ClusterChanges::default();
        assert!(c.moved("kcp/rt", "rt", "m"), "never seen failing: tried");
        c.failed("kcp/rt", "rt", "m");
        assert!(!c.moved("kcp/rt", "rt", "m"));
        c.bump("other");
        assert!(!c.moved("kcp/rt", "rt", "m"));
        c.bump("rt");
        assert!(c.moved("kcp/rt", "rt", "m"));
        c.failed("kcp/rt", "rt", "m");
        c.bump("*");
        assert!(c.moved("kcp/rt", "rt", "m"));
        c.recovered("kcp/rt", "m");
        assert!(c.moved("kcp/rt", "rt", "m"));
        assert!(held_back(FailedStep::Apply) && !held_back(FailedStep::Resolve) && !held_back(FailedStep::Pull));
    }

    #[test]
    fn a_module_that_recovers_loses_its_retry_and_another_keeps_counting() {
        let now: Timestamp = "2026-11-27T22:00:00Z".parse().unwrap();
        let mut prev = vec![
            failed(module("a", State::Processing), FailedStep::Apply, "x".into()),
            failed(module("b", State::Processing), FailedStep::Delete, "y".into()),
        ];
        schedule(&[], &mut prev, now, |_, _| 0.5);
        let mut next = vec![
            module("a", State::Ready),
            failed(module("b", State::Processing), FailedStep::Delete, "y".into()),
            failed(module("c", State::Processing), FailedStep::Pull, "z".into()),
        ];
        let s = schedule(&prev, &mut next, now, |_, _| 0.5);
        assert_eq!(next[0].retry, None);
        assert_eq!(next[1].retry.as_ref().map(|r| (r.step, r.failures)), Some((FailedStep::Delete, 2)));
        assert_eq!(next[2].retry.as_ref().map(|r| (r.step, r.failures)), Some((FailedStep::Pull, 1)));
        assert_eq!(s.retried, [FailedStep::Delete]);
        // The earliest retry wins: c's first (1 s), not b's second (2 s).
        assert_eq!(s.next, Some(Duration::from_secs(1)));
        assert_eq!(next[1].retry.as_ref().unwrap().next_attempt, "2026-11-27T22:00:02Z");
        // Nothing failing: nothing scheduled.
        let mut fine = vec![module("a", State::Ready)];
        assert_eq!(schedule(&next, &mut fine, now, |_, _| 0.5), Scheduled::default());
    }
}
