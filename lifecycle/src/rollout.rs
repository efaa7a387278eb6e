//! Paced rollouts: when a channel moves, the runtimes it affects upgrade in waves — at most
//! `maxInFlight` at once, `stepPercent` of them per wave, and no new admissions once the
//! failure ratio passes `maxFailureRatio`.
//!
//! Progress lives in the ModuleReleaseMeta status, not in this process. Every decision first
//! folds in what the status records (the wave, which runtimes were admitted, upgraded or
//! failed), and an admission is written there before the runtime starts upgrading. So an
//! instance that takes over after a leader change (or a restart) continues a rollout where
//! the last one stopped — same wave, the runtimes in flight still counted against
//! `maxInFlight` — instead of starting again from wave 1. The state kept here is only what
//! this instance learnt since its last status write, and who waits to be woken.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;

use fleetwatch_api::{RolloutPolicy, RolloutStatus, Runtime};
use kube::runtime::reflector::ObjectRef;
use semver::Version;
use tokio::sync::mpsc;

/// Whether a runtime may upgrade now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpgradeGate {
    /// Upgrade.
    Go,
    /// Not yet (or not at all, when halted); the reason for its status.
    Wait(String),
}

#[derive(Default)]
struct Rollout {
    total: u32,
    wave: u32,
    admitted: BTreeSet<String>,
    done: BTreeSet<String>,
    failed: BTreeSet<String>,
    halted: Option<String>,
    waiting: BTreeMap<String, ObjectRef<Runtime>>,
    dirty: bool,
}

impl Rollout {
    /// Folds in what the status records (written by this or an earlier instance). Sets only
    /// grow; an upgrade that succeeded after failing counts as upgraded.
    fn merge(&mut self, recorded: &RolloutStatus) {
        if recorded.wave > self.wave {
            self.wave = recorded.wave;
        }
        if self.total == 0 {
            self.total = recorded.total;
        }
        for r in &recorded.admitted_runtimes {
            self.admitted.insert(r.clone());
        }
        for r in &recorded.upgraded_runtimes {
            self.admitted.insert(r.clone());
            self.failed.remove(r);
            self.done.insert(r.clone());
        }
        for r in &recorded.failed_runtimes {
            self.admitted.insert(r.clone());
            if !self.done.contains(r) {
                self.failed.insert(r.clone());
            }
        }
        if self.halted.is_none() && recorded.phase == "Halted" && !recorded.message.is_empty() {
            self.halted = Some(recorded.message.clone());
        }
    }

    fn in_flight(&self) -> usize {
        self.admitted.len() - self.done.len() - self.failed.len()
    }

    fn status(&self, version: &Version) -> RolloutStatus {
        let phase = if self.halted.is_some() {
            "Halted"
        } else if self.total > 0 && self.done.len() as u32 >= self.total {
            "Complete"
        } else {
            "Progressing"
        };
        RolloutStatus {
            version: version.to_string(),
            phase: phase.into(),
            total: self.total,
            admitted: self.admitted.len() as u32,
            upgraded: self.done.len() as u32,
            failed: self.failed.len() as u32,
            wave: self.wave,
            message: self.halted.clone().unwrap_or_default(),
            admitted_runtimes: self.admitted.iter().cloned().collect(),
            upgraded_runtimes: self.done.iter().cloned().collect(),
            failed_runtimes: self.failed.iter().cloned().collect(),
        }
    }
}

type Key = (String, String, Version);

/// Which rollout: of `version` of `module` in namespace `ns`.
#[derive(Clone, Copy, Debug)]
pub struct RolloutOf<'a> {
    /// The namespace of the release meta and the runtimes.
    pub ns: &'a str,
    /// The module.
    pub module: &'a str,
    /// The version rolled out.
    pub version: &'a Version,
}

impl RolloutOf<'_> {
    fn key(&self) -> Key {
        (self.ns.to_string(), self.module.to_string(), self.version.clone())
    }
}

/// All rollouts the operator runs.
pub struct Rollouts {
    inner: Mutex<BTreeMap<Key, Rollout>>,
    wake: mpsc::Sender<ObjectRef<Runtime>>,
    writer: tokio::sync::Mutex<()>,
}

/// The rollout of `version`, created at wave 1 if new, with what the status records folded in.
fn entry<'a>(
    map: &'a mut BTreeMap<Key, Rollout>,
    of: RolloutOf<'_>,
    recorded: Option<&RolloutStatus>,
) -> &'a mut Rollout {
    let r = map.entry(of.key()).or_insert_with(|| Rollout { wave: 1, dirty: true, ..Default::default() });
    if let Some(st) = recorded {
        r.merge(st);
    }
    r
}

impl Rollouts {
    /// Rollouts that wake waiting runtimes through `wake`.
    pub fn new(wake: mpsc::Sender<ObjectRef<Runtime>>) -> Self {
        Self { inner: Mutex::new(BTreeMap::new()), wake, writer: tokio::sync::Mutex::new(()) }
    }

    /// Asks whether `runtime` may upgrade to the rollout's version now. `total` is the number
    /// of runtimes the channel move affects; `recorded` is this version's rollout as the
    /// ModuleReleaseMeta status has it. An admission changes the status: write it (see
    /// [`Rollouts::take_changed_modules`]) before the upgrade starts.
    pub fn admit(
        &self,
        of: RolloutOf<'_>,
        policy: &RolloutPolicy,
        runtime: &Runtime,
        total: u32,
        recorded: Option<&RolloutStatus>,
    ) -> UpgradeGate {
        let RolloutOf { module, version, .. } = of;
        // Fail closed: without the bookkeeping no upgrade is paced, so none starts.
        let Ok(mut map) = self.inner.lock() else {
            return UpgradeGate::Wait(format!("rollout of {module} {version}: bookkeeping unavailable"));
        };
        let r = entry(&mut map, of, recorded);
        let id = runtime.metadata.name.clone().unwrap_or_default();
        if r.total != total {
            r.total = total;
            r.dirty = true;
        }
        if r.admitted.contains(&id) {
            return UpgradeGate::Go;
        }
        if let Some(why) = &r.halted {
            return UpgradeGate::Wait(format!("rollout of {module} {version} halted: {why}"));
        }
        let wave_size =
            ((u64::from(total) * u64::from(policy.step_percent.clamp(1, 100))).div_ceil(100)).max(1) as usize;
        // A wave opens when the previous one is through.
        if r.admitted.len() >= r.wave as usize * wave_size && r.in_flight() == 0 {
            r.wave += 1;
            r.dirty = true;
        }
        if r.admitted.len() < r.wave as usize * wave_size && r.in_flight() < policy.max_in_flight.max(1) as usize {
            r.admitted.insert(id.clone());
            r.waiting.remove(&id);
            r.dirty = true;
            return UpgradeGate::Go;
        }
        r.waiting.insert(id, ObjectRef::from_obj(runtime));
        UpgradeGate::Wait(format!(
            "waiting for rollout of {module} {version}: wave {}, {}/{} upgraded",
            r.wave,
            r.done.len(),
            r.total
        ))
    }

    /// Records how an admitted runtime's upgrade ended; wakes waiting runtimes when that
    /// frees a place.
    pub fn report(
        &self,
        of: RolloutOf<'_>,
        runtime: &str,
        ok: bool,
        policy: &RolloutPolicy,
        recorded: Option<&RolloutStatus>,
    ) {
        let RolloutOf { module, version, .. } = of;
        let Ok(mut map) = self.inner.lock() else { return };
        if !map.contains_key(&of.key()) && recorded.is_none() {
            return; // no rollout of this version (e.g. a pinned upgrade)
        }
        let r = entry(&mut map, of, recorded);
        if !r.admitted.contains(runtime) {
            // It got there without a wave (e.g. before an operator restart): count it.
            if ok && r.admitted.insert(runtime.into()) {
                r.done.insert(runtime.into());
                r.dirty = true;
            }
            return;
        }
        let changed = if ok {
            r.failed.remove(runtime);
            r.done.insert(runtime.into())
        } else {
            !r.done.contains(runtime) && r.failed.insert(runtime.into())
        };
        if !changed {
            return;
        }
        r.dirty = true;
        let ratio = r.failed.len() as f64 / r.admitted.len().max(1) as f64;
        if r.halted.is_none() && !r.failed.is_empty() && ratio > policy.max_failure_ratio {
            let why = format!(
                "{} of {} admitted upgrades failed (more than {:.0} %)",
                r.failed.len(),
                r.admitted.len(),
                policy.max_failure_ratio * 100.0
            );
            tracing::warn!(module, %version, %why, "rollout halted");
            r.halted = Some(why);
        }
        // Waiting runtimes look again: a place may be free, or they learn of the halt.
        for (_, obj) in std::mem::take(&mut r.waiting) {
            let _ = self.wake.try_send(obj);
        }
    }

    /// Takes back an admission of `runtime` that could not be recorded (another instance
    /// wrote the status first): it is decided again on the newer status.
    pub fn retract(&self, of: RolloutOf<'_>, runtime: &str) {
        let Ok(mut map) = self.inner.lock() else { return };
        if let Some(r) = map.get_mut(&of.key())
            && !r.done.contains(runtime)
            && !r.failed.contains(runtime)
        {
            r.admitted.remove(runtime);
        }
    }

    /// Folds every rollout the status of a module's ModuleReleaseMeta records into what this
    /// instance knows (sets only grow), and returns the module's rollouts as they must be
    /// written back: what the status had, plus what this instance learnt.
    pub fn merged(&self, ns: &str, module: &str, recorded: &[RolloutStatus]) -> Vec<RolloutStatus> {
        let Ok(mut map) = self.inner.lock() else { return recorded.to_vec() };
        for st in recorded {
            // A version that does not parse is kept as it was written.
            if let Ok(v) = Version::parse(&st.version) {
                let r = map
                    .entry((ns.into(), module.into(), v))
                    .or_insert_with(|| Rollout { wave: 1, ..Default::default() });
                r.merge(st);
            }
        }
        let mut out: Vec<RolloutStatus> =
            map.iter().filter(|((n, m, _), _)| n == ns && m == module).map(|((_, _, v), r)| r.status(v)).collect();
        for st in recorded {
            if Version::parse(&st.version).is_err() {
                out.push(st.clone());
            }
        }
        out
    }

    /// Modules whose rollouts changed since the last call; clears the mark.
    pub fn take_changed_modules(&self) -> Vec<(String, String)> {
        let Ok(mut map) = self.inner.lock() else { return Vec::new() };
        let changed: BTreeSet<(String, String)> =
            map.iter().filter(|(_, r)| r.dirty).map(|((ns, m, _), _)| (ns.clone(), m.clone())).collect();
        for r in map.values_mut() {
            r.dirty = false;
        }
        changed.into_iter().collect()
    }

    /// Marks the rollouts of a module changed again (their status write failed).
    pub fn mark_changed(&self, ns: &str, module: &str) {
        let Ok(mut map) = self.inner.lock() else { return };
        for ((n, m, _), r) in map.iter_mut() {
            if n == ns && m == module {
                r.dirty = true;
            }
        }
    }

    /// Serialises status writes, so an older snapshot never lands after a newer one.
    pub async fn writing(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.writer.lock().await
    }

    /// Rollout statuses changed since the last call, per (namespace, module).
    #[cfg(test)]
    pub fn take_changed(&self) -> Vec<(String, String, Vec<RolloutStatus>)> {
        let Ok(mut map) = self.inner.lock() else { return Vec::new() };
        let changed: BTreeSet<(String, String)> =
            map.iter().filter(|(_, r)| r.dirty).map(|((ns, m, _), _)| (ns.clone(), m.clone())).collect();
        for r in map.values_mut() {
            r.dirty = false;
        }
        changed
            .into_iter()
            .map(|(ns, m)| {
                let statuses = map
                    .iter()
                    .filter(|((n, mm, _), _)| *n == ns && *mm == m)
                    .map(|((_, _, v), r)| r.status(v))
                    .collect();
                (ns, m, statuses)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn of(version: &Version) -> RolloutOf<'_> {
        RolloutOf { ns: "ns", module: "m", version }
    }

    fn rt(name: &str) -> Runtime {
        let mut r = Runtime::new(name, Default::default());
        r.metadata.namespace = Some("ns".into());
        r
    }

    #[test]
    fn admits_in_waves_and_halts_on_failures() {
        let (tx, mut rx) = mpsc::channel(100);
        let ro = Rollouts::new(tx);
        let v = Version::new(2, 0, 0);
        let p = RolloutPolicy { max_in_flight: 2, step_percent: 30, max_failure_ratio: 0.3 };
        let names: Vec<String> = (0..10).map(|i| format!("r{i}")).collect();
        let admit = |n: &str| ro.admit(of(&v), &p, &rt(n), 10, None);
        // Wave 1 holds 3 runtimes, at most 2 in flight.
        assert_eq!(admit(&names[0]), UpgradeGate::Go);
        assert_eq!(admit(&names[1]), UpgradeGate::Go);
        assert!(matches!(admit(&names[2]), UpgradeGate::Wait(_)), "max in flight");
        ro.report(of(&v), &names[0], true, &p, None);
        assert!(rx.try_recv().is_ok(), "a waiting runtime is woken");
        assert_eq!(admit(&names[2]), UpgradeGate::Go);
        assert!(matches!(admit(&names[3]), UpgradeGate::Wait(_)), "wave 1 is full");
        ro.report(of(&v), &names[1], true, &p, None);
        assert!(matches!(admit(&names[3]), UpgradeGate::Wait(_)), "wave 1 not through yet");
        ro.report(of(&v), &names[2], true, &p, None);
        assert_eq!(admit(&names[3]), UpgradeGate::Go, "wave 2 opens");
        let st = ro.take_changed();
        assert_eq!(st[0].2[0].upgraded, 3);
        assert_eq!(st[0].2[0].wave, 2);
        // Failures beyond the ratio halt the rollout.
        assert_eq!(admit(&names[4]), UpgradeGate::Go);
        ro.report(of(&v), &names[3], false, &p, None);
        ro.report(of(&v), &names[4], false, &p, None);
        assert_eq!(
            admit(&names[5]),
            UpgradeGate::Wait("rollout of m 2.0.0 halted: 2 of 5 admitted upgrades failed (more than 30 %)".into())
        );
        let st = ro.take_changed();
        assert_eq!(st[0].2[0].phase, "Halted");
    }

    #[test]
    fn two_instances_admitting_on_one_status_stay_within_max_in_flight() {
        // What the reconciler does with the ModuleReleaseMeta status: read it, admit, write
        // it back with the resourceVersion read; the loser of a race retracts and decides
        // again on the winner's status.
        let (tx, _rx) = mpsc::channel(100);
        let v = Version::new(2, 0, 0);
        let p = RolloutPolicy { max_in_flight: 1, step_percent: 100, max_failure_ratio: 0.5 };
        let (a, b) = (Rollouts::new(tx.clone()), Rollouts::new(tx));
        let status0: Vec<RolloutStatus> = Vec::new();
        // Both read the same (empty) status; each alone would admit.
        assert_eq!(a.admit(of(&v), &p, &rt("r0"), 4, None), UpgradeGate::Go);
        assert_eq!(b.admit(of(&v), &p, &rt("r1"), 4, None), UpgradeGate::Go);
        // A writes first; B's write carries the old resourceVersion and is refused.
        let status1 = a.merged("ns", "m", &status0);
        b.retract(of(&v), "r1");
        let find = |st: &[RolloutStatus]| st.iter().find(|r| r.version == "2.0.0").cloned();
        let recorded = find(&status1);
        assert!(matches!(b.admit(of(&v), &p, &rt("r1"), 4, recorded.as_ref()), UpgradeGate::Wait(_)));
        // B's own status write keeps A's admission.
        let status2 = b.merged("ns", "m", &status1);
        assert_eq!(find(&status2).unwrap().admitted_runtimes, ["r0"]);
        // A's upgrade ends; B learns it from the status and admits r1.
        a.report(of(&v), "r0", true, &p, recorded.as_ref());
        let status3 = a.merged("ns", "m", &status2);
        let recorded = find(&status3);
        assert_eq!(b.admit(of(&v), &p, &rt("r1"), 4, recorded.as_ref()), UpgradeGate::Go);
        let status4 = find(&b.merged("ns", "m", &status3)).unwrap();
        assert_eq!(status4.admitted_runtimes, ["r0", "r1"]);
        assert_eq!(status4.upgraded_runtimes, ["r0"]);
        assert_eq!(status4.total, 4);
    }

    #[test]
    fn a_new_instance_continues_from_the_recorded_status() {
        let (tx, _rx) = mpsc::channel(100);
        let v = Version::new(2, 0, 0);
        let p = RolloutPolicy { max_in_flight: 2, step_percent: 30, max_failure_ratio: 0.3 };
        let first = Rollouts::new(tx.clone());
        for r in ["r0", "r1"] {
            assert_eq!(first.admit(of(&v), &p, &rt(r), 10, None), UpgradeGate::Go);
        }
        first.report(of(&v), "r0", true, &p, None);
        assert_eq!(first.admit(of(&v), &p, &rt("r2"), 10, None), UpgradeGate::Go);
        let recorded = first.take_changed().remove(0).2.remove(0);
        assert_eq!(recorded.admitted_runtimes, ["r0", "r1", "r2"]);
        assert_eq!(recorded.upgraded_runtimes, ["r0"]);

        // A new instance knows nothing but the status: r1 and r2 are still in flight.
        let second = Rollouts::new(tx);
        let admit = |r: &str| second.admit(of(&v), &p, &rt(r), 10, Some(&recorded));
        assert!(matches!(admit("r3"), UpgradeGate::Wait(_)), "maxInFlight counts the first instance's admissions");
        assert_eq!(admit("r1"), UpgradeGate::Go, "an admitted runtime goes on");
        second.report(of(&v), "r1", true, &p, Some(&recorded));
        second.report(of(&v), "r2", true, &p, Some(&recorded));
        assert_eq!(admit("r3"), UpgradeGate::Go, "wave 2 opens after the recorded wave 1");
        let now = second.take_changed().remove(0).2.remove(0);
        assert_eq!((now.wave, now.upgraded, now.admitted), (2, 3, 4));
    }
}
