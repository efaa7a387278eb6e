//! Kubernetes Events (`events.k8s.io/v1`) on a Runtime for what happened to its modules:
//! install, upgrade, downgrade refused, waiting for a window, upgrade held, deletion
//! blocked, deletion done, errors. One Event per transition (a state or message change),
//! never one per reconcile; repeats become an Event series.
//!
//! A series is one (Runtime, reason, module): kube-runtime's `Recorder` keys series by
//! (object, reason, action) only, so "installed nats" was counted into the series of
//! "installed redis" and never shown. [`Recorder`] keys by module too, and a repeat
//! carries the latest note (its versions) with the series count, as client-go's
//! events.k8s.io recorder does for a repeat within the same 6 minutes.

use std::collections::HashMap;
use std::sync::Mutex;

use fleetwatch_api::{ModuleReason, ModuleStatus, State};
use jiff::{SignedDuration, Timestamp};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

/// Label on each Event naming the module it is about (`kubectl get events -l`).
pub const MODULE_LABEL: &str = "operator.fleetwatch.dev/module";

/// Normal or Warning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventType {
    /// Something expected happened.
    Normal,
    /// Something that may need attention.
    Warning,
}

/// One module's Event, before it is recorded on an object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModuleEvent {
    /// Normal or Warning.
    pub type_: EventType,
    /// Why (`Installed`, `Upgraded`, ...): part of the series key.
    pub reason: String,
    /// What was done (`Install`, `Upgrade`, ...).
    pub action: String,
    /// The module it is about: part of the series key.
    pub module: String,
    /// What happened, naming the module and its versions (at most 1 KiB).
    pub note: String,
}

/// The Events that the change from `prev` to `next` module statuses deserves.
pub fn transitions(prev: &[ModuleStatus], next: &[ModuleStatus]) -> Vec<ModuleEvent> {
    let mut out = Vec::new();
    for n in next {
        let p = prev.iter().find(|p| p.name == n.name);
        let changed = p.is_none_or(|p| p.state != n.state || p.message != n.message);
        let before = p.and_then(|p| p.installed_version.as_deref());
        let module = n.name.as_str();
        match (before, n.installed_version.as_deref()) {
            (None, Some(v)) => out.push(normal("Installed", "Install", module, format!("installed {module} {v}"))),
            (Some(a), Some(b)) if a != b => {
                out.push(normal("Upgraded", "Upgrade", module, format!("upgraded {module} from {a} to {b}")))
            }
            _ => {}
        }
        if !changed {
            continue;
        }
        let msg = format!("{}: {}", versions(n), n.message);
        match n.state {
            _ if n.reason == Some(ModuleReason::WaitingForDependency) => {
                out.push(normal("WaitingForDependency", "Install", module, msg))
            }
            State::Warning if n.reason == Some(ModuleReason::DowngradeRefused) => {
                out.push(warning("DowngradeRefused", "Upgrade", module, msg))
            }
            State::Warning => out.push(warning("UpgradeHeld", "Upgrade", module, msg)),
            State::Ready if n.reason == Some(ModuleReason::WaitingForMaintenanceWindow) => {
                out.push(normal("WaitingForMaintenanceWindow", "Upgrade", module, msg))
            }
            State::Deleting => out.push(warning("DeletionBlocked", "Delete", module, msg)),
            State::Error => out.push(warning("Failed", "Reconcile", module, msg)),
            State::Unmanaged if p.is_none_or(|p| p.state != State::Unmanaged) => {
                out.push(normal("Unmanaged", "Unmanage", module, msg))
            }
            _ => {}
        }
    }
    for p in prev {
        if !next.iter().any(|n| n.name == p.name) && p.state != State::Unmanaged {
            let what = match p.installed_version.as_deref() {
                Some(v) => format!("{} {v}", p.name),
                None => p.name.clone(),
            };
            out.push(normal("Deleted", "Delete", &p.name, format!("removed {what}")));
        }
    }
    out
}

/// The module with its versions, for a note: `redis 1.0.0`, `redis 1.0.0 (desired 2.0.0)`,
/// `redis (desired 2.0.0)`, or just `redis`.
fn versions(m: &ModuleStatus) -> String {
    match (m.installed_version.as_deref(), m.desired_version.as_deref()) {
        (Some(i), Some(d)) if i != d => format!("{} {i} (desired {d})", m.name),
        (Some(i), _) => format!("{} {i}", m.name),
        (None, Some(d)) => format!("{} (desired {d})", m.name),
        (None, None) => m.name.clone(),
    }
}

fn normal(reason: &str, action: &str, module: &str, note: String) -> ModuleEvent {
    event(EventType::Normal, reason, action, module, note)
}

fn warning(reason: &str, action: &str, module: &str, note: String) -> ModuleEvent {
    event(EventType::Warning, reason, action, module, note)
}

/// A module Event (also for notes outside [`transitions`], e.g. the agent's certificate).
pub fn event(type_: EventType, reason: &str, action: &str, module: &str, note: String) -> ModuleEvent {
    ModuleEvent { type_, reason: reason.into(), action: action.into(), module: module.into(), note: cut(note, 1000) }
}

/// The API server limits an Event's note to 1 KiB.
fn cut(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// Repeats within this time of a series' last occurrence extend it (client-go's window).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);
/// Series remembered at most, in count and in bytes of their keys and names; past either
/// the least recently seen are forgotten (a later repeat starts a new Event).
const MAX_SERIES: usize = 4096;
const MAX_SERIES_BYTES: usize = 2 << 20;

/// A series' identity: the object, the reason, the module.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SeriesKey {
    /// apiVersion, kind, namespace, name, uid of the object.
    regarding: [String; 5],
    reason: String,
    module: String,
}

impl SeriesKey {
    fn bytes(&self) -> usize {
        self.regarding.iter().map(String::len).sum::<usize>() + self.reason.len() + self.module.len()
    }
}

/// What is remembered of a series: its Event's name and namespace, how often it occurred.
#[derive(Clone, Debug)]
struct Series {
    name: String,
    namespace: String,
    count: i32,
    last: Timestamp,
}

/// What to write for an occurrence.
#[derive(Debug, PartialEq)]
enum Step {
    /// A new Event (first occurrence, or the series is older than the window).
    Create,
    /// The series' Event gets `series.count = count` and the latest note.
    Extend { name: String, namespace: String, count: i32 },
}

/// The series bookkeeping, without I/O.
#[derive(Default)]
struct SeriesTable {
    map: HashMap<SeriesKey, Series>,
    bytes: usize,
}

impl SeriesTable {
    /// What an occurrence of `key` at `now` must write.
    fn step(&mut self, key: &SeriesKey, now: Timestamp) -> Step {
        match self.map.get(key) {
            Some(s) if s.last + SERIES_WINDOW > now => {
                Step::Extend { name: s.name.clone(), namespace: s.namespace.clone(), count: s.count + 1 }
            }
            _ => Step::Create,
        }
    }

    /// Records that `key`'s Event `name` now stands at `count` occurrences.
    fn record(&mut self, key: SeriesKey, name: String, namespace: String, count: i32, now: Timestamp) {
        let series = Series { name, namespace, count, last: now };
        self.bytes += entry_bytes(&key, &series);
        if let Some(old) = self.map.insert(key.clone(), series) {
            self.bytes -= entry_bytes(&key, &old);
        }
        while self.map.len() > MAX_SERIES || self.bytes > MAX_SERIES_BYTES {
            let Some(oldest) = self.map.iter().min_by_key(|(_, s)| s.last).map(|(k, _)| k.clone()) else { break };
            self.forget(&oldest);
        }
    }

    /// Forgets `key` (its Event is gone from the API server, or it is the oldest).
    fn forget(&mut self, key: &SeriesKey) {
        if let Some(old) = self.map.remove(key) {
            self.bytes -= entry_bytes(key, &old);
        }
    }
}

fn entry_bytes(k: &SeriesKey, s: &Series) -> usize {
    k.bytes() + s.name.len() + s.namespace.len()
}

/// Who reports the Events.
#[derive(Clone, Debug)]
pub struct Reporter {
    /// `reportingController`.
    pub controller: String,
    /// `reportingInstance` (the pod name; the controller's name when unknown).
    pub instance: Option<String>,
}

/// Records module Events on objects as events.k8s.io/v1 Events, one series per
/// (object, reason, module).
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
    series: Mutex<SeriesTable>,
}

impl Recorder {
    /// A recorder writing through `client` as `reporter`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self { client, reporter, series: Mutex::default() }
    }

    /// Records `ev` on the object `regarding`: a new Event, or the next occurrence of its
    /// series (`series.count`, `series.lastObservedTime`, the latest note).
    pub async fn publish(&self, ev: &ModuleEvent, regarding: &ObjectReference) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        let key = series_key(ev, regarding);
        let step = match self.series.lock() {
            Ok(mut t) => t.step(&key, now),
            Err(_) => Step::Create,
        };
        let ns = regarding.namespace.clone().unwrap_or_else(|| "default".into());
        if let Step::Extend { name, namespace, count } = step {
            let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
            let patch = json!({
                "note": ev.note,
                "series": EventSeries { count, last_observed_time: MicroTime(now) },
            });
            match events.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    if let Ok(mut t) = self.series.lock() {
                        t.record(key, name, namespace, count, now);
                    }
                    return Ok(());
                }
                // The Event expired or was deleted: start a new one.
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    if let Ok(mut t) = self.series.lock() {
                        t.forget(&key);
                    }
                }
                Err(e) => return Err(e),
            }
        }
        let event = self.new_event(ev, regarding, &ns, now);
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &ns);
        let created = events.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.unwrap_or_default();
        if let Ok(mut t) = self.series.lock() {
            t.record(key, name, ns, 1, now);
        }
        Ok(())
    }

    fn new_event(&self, ev: &ModuleEvent, regarding: &ObjectReference, ns: &str, now: Timestamp) -> K8sEvent {
        let base = regarding.name.as_deref().unwrap_or(&self.reporter.controller);
        K8sEvent {
            metadata: ObjectMeta {
                name: Some(format!("{base}.{:x}", now.as_nanosecond())),
                namespace: Some(ns.to_string()),
                labels: Some([(MODULE_LABEL.to_string(), ev.module.clone())].into()),
                ..Default::default()
            },
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            note: Some(ev.note.clone()),
            type_: Some(match ev.type_ {
                EventType::Normal => "Normal".into(),
                EventType::Warning => "Warning".into(),
            }),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding.clone()),
            reporting_controller: Some(self.reporter.controller.clone()),
            reporting_instance: Some(
                self.reporter.instance.clone().unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            ..Default::default()
        }
    }
}

fn series_key(ev: &ModuleEvent, r: &ObjectReference) -> SeriesKey {
    let s = |v: &Option<String>| v.clone().unwrap_or_default();
    SeriesKey {
        regarding: [s(&r.api_version), s(&r.kind), s(&r.namespace), s(&r.name), s(&r.uid)],
        reason: ev.reason.clone(),
        module: ev.module.clone(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_install_is_one_installed_event_and_no_change_is_none() {
        use super::transitions;
        use fleetwatch_api::{ModuleStatus, State};
        let next = vec![ModuleStatus {
            name: "redis".into(),
            state: State::Ready,
            installed_version: Some("1.0.0".into()),
            ..Default::default()
        }];
        let evs = transitions(&[], &next);
        assert_eq!(evs[0].reason, "Installed");
        assert_eq!(evs[0].note, "installed redis 1.0.0");
        assert!(transitions(&next, &next).is_empty());
    }

    fn m(state: State, installed: Option<&str>, message: &str) -> ModuleStatus {
        ModuleStatus {
            name: "redis".into(),
            state,
            installed_version: installed.map(str::to_string),
            message: message.into(),
            ..Default::default()
        }
    }

    fn reasons(prev: &[ModuleStatus], next: &[ModuleStatus]) -> Vec<String> {
        transitions(prev, next).into_iter().map(|e| e.reason).collect()
    }

    #[test]
    fn one_event_per_transition() {
        let ready1 = m(State::Ready, Some("1.0.0"), "");
        assert_eq!(reasons(&[], std::slice::from_ref(&ready1)), ["Installed"]);
        assert!(reasons(std::slice::from_ref(&ready1), std::slice::from_ref(&ready1)).is_empty());
        let ready2 = m(State::Ready, Some("2.0.0"), "");
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[ready2]), ["Upgraded"]);
        let down = ModuleStatus {
            reason: Some(ModuleReason::DowngradeRefused),
            ..m(State::Warning, Some("1.0.0"), "downgrade from 2.0.0 to 1.0.0 not applied")
        };
        assert_eq!(reasons(std::slice::from_ref(&ready1), std::slice::from_ref(&down)), ["DowngradeRefused"]);
        assert!(reasons(std::slice::from_ref(&down), std::slice::from_ref(&down)).is_empty());
        // The typed reason decides, not the message's words.
        let held = ModuleStatus {
            reason: Some(ModuleReason::UpgradeHeld),
            ..m(State::Warning, Some("1.0.0"), "a downgrade of a dependency is held")
        };
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[held]), ["UpgradeHeld"]);
        let waits = ModuleStatus {
            reason: Some(ModuleReason::WaitingForMaintenanceWindow),
            ..m(State::Ready, Some("1.0.0"), "upgrade to 2.0.0 waits for the maintenance window a – b")
        };
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[waits]), ["WaitingForMaintenanceWindow"]);
        let blocked = m(State::Deleting, Some("1.0.0"), "waiting for managed resources to be deleted: 1 X");
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[blocked]), ["DeletionBlocked"]);
        assert_eq!(reasons(std::slice::from_ref(&ready1), &[]), ["Deleted"]);
        let err = m(State::Error, Some("1.0.0"), "boom");
        let evs = transitions(std::slice::from_ref(&ready1), &[err]);
        assert_eq!(evs[0].reason, "Failed");
        assert_eq!(evs[0].type_, EventType::Warning);
        assert_eq!(evs[0].note, "redis 1.0.0: boom");
    }

    #[test]
    fn each_module_has_its_own_event_naming_it_and_its_versions() {
        let mut nats = m(State::Ready, Some("1.0.0"), "");
        nats.name = "nats".into();
        let redis = m(State::Ready, Some("1.0.0"), "");
        let evs = transitions(&[], &[redis.clone(), nats.clone()]);
        let got: Vec<(&str, &str, &str)> =
            evs.iter().map(|e| (e.reason.as_str(), e.module.as_str(), e.note.as_str())).collect();
        assert_eq!(
            got,
            [("Installed", "redis", "installed redis 1.0.0"), ("Installed", "nats", "installed nats 1.0.0")]
        );
        let evs = transitions(&[redis, nats], &[]);
        assert_eq!(evs[1].note, "removed nats 1.0.0");
        let mut held = m(State::Warning, Some("1.0.0"), "no maintenance window");
        held.desired_version = Some("2.0.0".into());
        assert_eq!(transitions(&[], &[held])[1].note, "redis 1.0.0 (desired 2.0.0): no maintenance window");
    }

    fn key(reason: &str, module: &str) -> SeriesKey {
        let r = |s: &str| s.to_string();
        SeriesKey {
            regarding: [r("operator.fleetwatch.dev/v1alpha1"), r("Runtime"), r("kcp"), r("rt-1"), r("u1")],
            reason: reason.into(),
            module: module.into(),
        }
    }

    #[test]
    fn a_series_is_one_object_reason_and_module_and_counts_its_occurrences() {
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let mut t = SeriesTable::default();
        let redis = key("Installed", "redis");
        let nats = key("Installed", "nats");
        assert_eq!(t.step(&redis, t0), Step::Create);
        t.record(redis.clone(), "rt-1.a".into(), "kcp".into(), 1, t0);
        // Another module's install is its own Event, not a repeat of redis's.
        assert_eq!(t.step(&nats, t0), Step::Create);
        t.record(nats.clone(), "rt-1.b".into(), "kcp".into(), 1, t0);
        let t1 = t0 + SignedDuration::from_secs(60);
        let want = Step::Extend { name: "rt-1.a".into(), namespace: "kcp".into(), count: 2 };
        assert_eq!(t.step(&redis, t1), want);
        t.record(redis.clone(), "rt-1.a".into(), "kcp".into(), 2, t1);
        assert_eq!(t.step(&redis, t1), Step::Extend { name: "rt-1.a".into(), namespace: "kcp".into(), count: 3 });
        // Past the window a repeat starts a new Event.
        assert_eq!(t.step(&redis, t1 + SERIES_WINDOW), Step::Create);
        // Another reason of the same module is another series.
        assert_eq!(t.step(&key("Upgraded", "redis"), t1), Step::Create);
    }

    #[test]
    fn the_series_table_is_bounded() {
        let t0: Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let mut t = SeriesTable::default();
        for i in 0..MAX_SERIES + 10 {
            let at = t0 + SignedDuration::from_secs(i as i64);
            t.record(key("Installed", &format!("m{i}")), format!("e{i}"), "kcp".into(), 1, at);
        }
        assert_eq!(t.map.len(), MAX_SERIES);
        assert!(!t.map.contains_key(&key("Installed", "m0")), "the oldest is forgotten");
        assert_eq!(t.bytes, t.map.iter().map(|(k, s)| entry_bytes(k, s)).sum::<usize>());
        let big = "x".repeat(MAX_SERIES_BYTES / 2);
        t.record(key("Installed", &big), "a".into(), "kcp".into(), 1, t0 + SignedDuration::from_hours(10));
        t.record(key("Failed", &big), "b".into(), "kcp".into(), 1, t0 + SignedDuration::from_hours(11));
        assert!(t.bytes <= MAX_SERIES_BYTES, "{}", t.bytes);
    }
}
