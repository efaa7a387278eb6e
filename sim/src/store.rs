//! The object store: every object of every resource, one cluster-wide resourceVersion,
//! the retained event history and the registered watchers. All of it sits behind one
//! mutex (see `Cluster`), so a write, its history entry and its fan-out to watchers are
//! one atomic step and watchers see writes in resourceVersion order.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use serde_json::Value;
use tokio::sync::mpsc;

use crate::resources::{Registry, ResKey};
use crate::selector::{FieldSelector, LabelSelector};

/// Namespace ("" for cluster-scoped) and name.
pub type ObjKey = (String, String);

/// Watch event types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Added,
    Modified,
    Deleted,
}

impl EventType {
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One write, as kept in the history for watches that start from an older resourceVersion.
#[derive(Debug)]
pub struct Event {
    pub rv: u64,
    pub key: ResKey,
    pub ty: EventType,
    pub obj: Arc<Value>,
    /// The object before the write (to turn MODIFIED into ADDED/DELETED for selector watches).
    pub old: Option<Arc<Value>>,
    /// `obj` serialized once (reused for selector watchers that see another event type).
    pub json: Bytes,
    /// `{"type":…,"object":…}\n`, rendered once and shared by every watcher that gets it.
    pub line: Bytes,
}

/// Serializes an object (serializing a `serde_json::Value` cannot fail).
pub fn to_json(obj: &Value) -> Bytes {
    Bytes::from(serde_json::to_vec(obj).unwrap_or_default())
}

/// Renders a watch event line.
pub fn render_line(ty: &str, obj: &Value) -> Bytes {
    event_line(ty, &to_json(obj))
}

/// A watch event line around an already serialized object.
pub fn event_line(ty: &str, obj_json: &[u8]) -> Bytes {
    let mut s = Vec::with_capacity(obj_json.len() + ty.len() + 24);
    s.extend_from_slice(b"{\"type\":\"");
    s.extend_from_slice(ty.as_bytes());
    s.extend_from_slice(b"\",\"object\":");
    s.extend_from_slice(obj_json);
    s.extend_from_slice(b"}\n");
    Bytes::from(s)
}

/// A registered watch.
#[derive(Debug)]
pub struct WatcherReg {
    pub id: u64,
    pub namespace: Option<String>,
    pub labels: LabelSelector,
    pub fields: FieldSelector,
    /// apiVersion the watcher asked for (objects of other CRD versions are relabelled).
    pub api_version: String,
    pub tx: mpsc::Sender<Bytes>,
}

impl WatcherReg {
    pub fn matches(&self, obj: &Value) -> bool {
        if let Some(ns) = &self.namespace
            && obj["metadata"]["namespace"].as_str() != Some(ns.as_str())
        {
            return false;
        }
        self.labels.matches(obj) && self.fields.matches(obj)
    }

    /// The line this watcher should receive for an event, if any.
    pub fn line_for(&self, ev: &Event) -> Option<Bytes> {
        let now = self.matches(&ev.obj);
        let before = ev.old.as_deref().map(|o| self.matches(o));
        let ty = match (ev.ty, before, now) {
            (EventType::Modified, Some(true), true) => EventType::Modified,
            (EventType::Modified, Some(false), true) => EventType::Added,
            (EventType::Modified, Some(true), false) => EventType::Deleted,
            (EventType::Modified, _, _) => return None,
            (ty, _, true) => ty,
            (_, _, false) => return None,
        };
        let same_version = ev.obj["apiVersion"].as_str() == Some(self.api_version.as_str());
        if ty == ev.ty && same_version {
            return Some(ev.line.clone());
        }
        if same_version {
            return Some(event_line(ty.as_str(), &ev.json));
        }
        Some(render_line(ty.as_str(), &crate::convert::convert(&ev.obj, &self.api_version)))
    }
}

/// Everything a simulated cluster holds.
#[derive(Debug)]
pub struct State {
    /// The last resourceVersion handed out.
    pub rv: u64,
    /// Watches may start from this resourceVersion or later; older ones get 410.
    pub floor: u64,
    pub registry: Registry,
    pub objects: HashMap<ResKey, BTreeMap<ObjKey, Arc<Value>>>,
    /// Every stored object serialized once at write time (kept in step with `objects` by
    /// `commit`), so LIST and initial watch events copy bytes instead of re-serializing.
    serialized: HashMap<ResKey, HashMap<ObjKey, Bytes>>,
    pub history: VecDeque<Arc<Event>>,
    pub history_cap: usize,
    pub watchers: HashMap<ResKey, Vec<WatcherReg>>,
    pub next_watcher: u64,
    /// Set by a write the garbage collector may have to act on (a removal, an object with
    /// ownerReferences before or after, one being deleted); cleared by a GC pass. Other
    /// writes do not wake the collector, so a steady stream of plain updates does not make
    /// it scan every object each time.
    pub gc_pending: bool,
}

/// Whether a write from `old` to `new` (`None`: removed) can give the garbage collector
/// or the namespace controller something to do.
fn gc_relevant(old: Option<&Value>, new: Option<&Value>) -> bool {
    let Some(new) = new else { return true };
    let has_owners = |o: &Value| o["metadata"]["ownerReferences"].as_array().is_some_and(|a| !a.is_empty());
    has_owners(new) || old.is_some_and(has_owners) || !new["metadata"]["deletionTimestamp"].is_null()
}

impl State {
    /// An empty cluster serving the built-in kinds, keeping `history_cap` events.
    pub fn new(history_cap: usize) -> Self {
        State {
            rv: 1,
            floor: 1,
            registry: Registry::with_builtins(),
            objects: HashMap::new(),
            serialized: HashMap::new(),
            history: VecDeque::new(),
            history_cap: history_cap.max(1),
            watchers: HashMap::new(),
            next_watcher: 0,
            gc_pending: false,
        }
    }

    /// One object.
    pub fn get(&self, key: &str, ok: &ObjKey) -> Option<&Arc<Value>> {
        self.objects.get(key)?.get(ok)
    }

    /// The JSON of every object of a resource as stored (with the apiVersion of the
    /// version each was written through).
    pub fn serialized(&self, key: &str) -> Option<&HashMap<ObjKey, Bytes>> {
        self.serialized.get(key)
    }

    /// Forgets every object of a resource (after their removal was committed).
    pub fn drop_resource(&mut self, key: &str) {
        self.objects.remove(key);
        self.serialized.remove(key);
    }

    /// All objects of a resource, ordered by namespace then name.
    pub fn all(&self, key: &str) -> impl Iterator<Item = (&ObjKey, &Arc<Value>)> {
        self.objects.get(key).into_iter().flat_map(|m| m.iter())
    }

    /// Stores (or with `None` removes) an object as one write: a new resourceVersion,
    /// a history entry and the fan-out to watchers. Returns the stored object.
    pub fn commit(&mut self, key: &str, ok: ObjKey, new: Option<Value>, removed: Option<Arc<Value>>) -> Arc<Value> {
        self.rv += 1;
        let rv = self.rv;
        let map = self.objects.entry(key.to_string()).or_default();
        let old = map.get(&ok).cloned();
        self.gc_pending |= gc_relevant(old.as_deref(), new.as_ref());
        let (ty, obj, json) = match new {
            Some(mut o) => {
                o["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                let json = to_json(&o);
                let o = Arc::new(o);
                self.serialized.entry(key.to_string()).or_default().insert(ok.clone(), json.clone());
                map.insert(ok, o.clone());
                (if old.is_some() { EventType::Modified } else { EventType::Added }, o, json)
            }
            None => {
                map.remove(&ok);
                if let Some(m) = self.serialized.get_mut(key) {
                    m.remove(&ok);
                }
                // A deleted object is reported with the resourceVersion of its deletion.
                let mut o = (*removed.or_else(|| old.clone()).unwrap_or_default()).clone();
                if o.is_object() {
                    o["metadata"]["resourceVersion"] = Value::String(rv.to_string());
                }
                let json = to_json(&o);
                (EventType::Deleted, Arc::new(o), json)
            }
        };
        let line = event_line(ty.as_str(), &json);
        let ev = Arc::new(Event {
            rv,
            key: key.to_string(),
            ty,
            obj: obj.clone(),
            old: if ty == EventType::Modified { old } else { None },
            json,
            line,
        });
        self.history.push_back(ev.clone());
        while self.history.len() > self.history_cap {
            if let Some(e) = self.history.pop_front() {
                self.floor = e.rv;
            }
        }
        self.fan_out(&ev);
        obj
    }

    /// Sends an event to every matching watcher; a watcher whose buffer is full is
    /// dropped (its stream ends), as kube-apiserver closes slow watchers.
    fn fan_out(&mut self, ev: &Event) {
        let Some(list) = self.watchers.get_mut(&ev.key) else { return };
        list.retain(|w| match w.line_for(ev) {
            None => !w.tx.is_closed(),
            Some(line) => match w.tx.try_send(line) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    tracing::warn!(watcher = w.id, resource = %ev.key, "watcher too slow, closing its watch");
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
        });
    }

    /// Ends every open watch (fault injection, or a resource that stopped being served).
    pub fn drop_watches(&mut self, key: Option<&str>) -> usize {
        match key {
            Some(k) => self.watchers.remove(k).map(|v| v.len()).unwrap_or(0),
            None => self.watchers.drain().map(|(_, v)| v.len()).sum(),
        }
    }

    /// Forgets the event history so that every resourceVersion handed out so far is too old
    /// to watch from (410 Gone), like an etcd compaction; the resourceVersion moves on by one.
    pub fn compact(&mut self) {
        self.rv += 1;
        self.history.clear();
        self.floor = self.rv;
    }

    /// Number of open watches.
    pub fn watch_count(&self) -> usize {
        self.watchers.values().map(Vec::len).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn reg(labels: &str) -> (WatcherReg, mpsc::Receiver<Bytes>) {
        let (tx, rx) = mpsc::channel(2);
        (
            WatcherReg {
                id: 1,
                namespace: None,
                labels: LabelSelector::parse(labels).unwrap(),
                fields: FieldSelector::default(),
                api_version: "v1".into(),
                tx,
            },
            rx,
        )
    }

    fn cm(app: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "d", "labels": {"app": app}}})
    }

    #[test]
    fn commit_bumps_rv_and_records_history() {
        let mut s = State::new(2);
        let o = s.commit("/configmaps", ("d".into(), "a".into()), Some(cm("x")), None);
        assert_eq!(o["metadata"]["resourceVersion"], "2");
        s.commit("/configmaps", ("d".into(), "a".into()), Some(cm("y")), None);
        s.commit("/configmaps", ("d".into(), "a".into()), None, None);
        assert_eq!(s.history.len(), 2);
        assert_eq!(s.floor, 2, "oldest retained event is rv 3, so rv 2 is the floor");
        assert_eq!(s.history.back().map(|e| e.ty), Some(EventType::Deleted));
    }

    #[test]
    fn selector_watch_sees_leaving_object_as_deleted() {
        let mut s = State::new(10);
        let (w, mut rx) = reg("app=x");
        s.watchers.entry("/configmaps".into()).or_default().push(w);
        s.commit("/configmaps", ("d".into(), "a".into()), Some(cm("x")), None);
        s.commit("/configmaps", ("d".into(), "a".into()), Some(cm("y")), None);
        let first = rx.try_recv().unwrap();
        let second = rx.try_recv().unwrap();
        assert!(first.starts_with(b"{\"type\":\"ADDED\""));
        assert!(second.starts_with(b"{\"type\":\"DELETED\""));
    }

    /// What sharded lifecycle instances rely on: a set-based `in` watch sees an object that
    /// gets its label as ADDED and one whose label moves out as DELETED; a `!key` watch sees
    /// the object leave once it is labelled.
    #[test]
    fn set_based_and_not_exists_selectors_follow_label_changes() {
        let mut s = State::new(10);
        let (inside, mut in_rx) = reg("bucket in (1, 2)");
        let (unlabelled, mut none_rx) = reg("!bucket");
        s.watchers.entry("/configmaps".into()).or_default().extend([inside, unlabelled]);
        let obj = |bucket: Option<&str>| {
            let mut o = cm("x");
            if let Some(b) = bucket {
                o["metadata"]["labels"]["bucket"] = json!(b);
            }
            o
        };
        let k = || ("d".to_string(), "a".to_string());
        let ty = |b: Bytes| serde_json::from_slice::<Value>(&b).unwrap()["type"].as_str().unwrap().to_string();
        s.commit("/configmaps", k(), Some(obj(None)), None);
        assert_eq!(ty(none_rx.try_recv().unwrap()), "ADDED");
        assert!(in_rx.try_recv().is_err(), "not in the set yet");
        s.commit("/configmaps", k(), Some(obj(Some("2"))), None);
        assert_eq!(ty(in_rx.try_recv().unwrap()), "ADDED");
        assert_eq!(ty(none_rx.try_recv().unwrap()), "DELETED");
        s.commit("/configmaps", k(), Some(obj(Some("1"))), None);
        assert_eq!(ty(in_rx.try_recv().unwrap()), "MODIFIED");
        s.commit("/configmaps", k(), Some(obj(Some("7"))), None);
        assert_eq!(ty(in_rx.try_recv().unwrap()), "DELETED");
        assert!(none_rx.try_recv().is_err(), "labelled objects stay out of the !bucket watch");
    }

    #[test]
    fn slow_watcher_is_dropped() {
        let mut s = State::new(10);
        let (w, _rx) = reg("");
        s.watchers.entry("/configmaps".into()).or_default().push(w);
        for i in 0..3 {
            s.commit("/configmaps", ("d".into(), format!("n{i}")), Some(cm("x")), None);
        }
        assert_eq!(s.watch_count(), 0);
    }

    #[test]
    fn one_rendering_is_shared_and_each_selector_sees_its_own_event_types() {
        let mut s = State::new(10);
        let mut rxs = Vec::new();
        for (id, sel) in ["", "", "app=x", "app=y"].into_iter().enumerate() {
            let (tx, rx) = mpsc::channel(16);
            let w = WatcherReg {
                id: id as u64,
                namespace: Some("d".into()),
                labels: LabelSelector::parse(sel).unwrap(),
                fields: FieldSelector::default(),
                api_version: "v1".into(),
                tx,
            };
            s.watchers.entry("/configmaps".into()).or_default().push(w);
            rxs.push(rx);
        }
        let k = || ("d".to_string(), "a".to_string());
        s.commit("/configmaps", k(), Some(cm("x")), None);
        s.commit("/configmaps", k(), Some(cm("y")), None);
        s.commit("/configmaps", k(), None, None);
        let got: Vec<Vec<Bytes>> =
            rxs.iter_mut().map(|rx| std::iter::from_fn(|| rx.try_recv().ok()).collect()).collect();
        let types = |lines: &[Bytes]| -> Vec<(String, String)> {
            lines
                .iter()
                .map(|l| {
                    let v: Value = serde_json::from_slice(l).unwrap();
                    (
                        v["type"].as_str().unwrap().to_string(),
                        v["object"]["metadata"]["resourceVersion"].as_str().unwrap().to_string(),
                    )
                })
                .collect()
        };
        let rv = |n: u64| (s.rv - 3 + n).to_string();
        assert_eq!(types(&got[0]), [("ADDED".into(), rv(1)), ("MODIFIED".into(), rv(2)), ("DELETED".into(), rv(3))]);
        assert_eq!(types(&got[1]), types(&got[0]));
        assert_eq!(types(&got[2]), [("ADDED".into(), rv(1)), ("DELETED".into(), rv(2))]);
        assert_eq!(types(&got[3]), [("ADDED".into(), rv(2)), ("DELETED".into(), rv(3))]);
        // Watchers that get the event as written share one buffer.
        for (a, b) in got[0].iter().zip(&got[1]) {
            assert_eq!(a.as_ptr(), b.as_ptr());
        }
        assert_eq!(got[0][0].as_ptr(), got[2][0].as_ptr());
        // The selector watcher's re-typed events carry the same object bytes.
        let obj = |l: &Bytes| serde_json::from_slice::<Value>(l).unwrap()["object"].clone();
        assert_eq!(obj(&got[3][0]), obj(&got[0][1]));
        assert_eq!(obj(&got[2][1]), obj(&got[0][1]));
    }

    #[test]
    fn only_gc_relevant_writes_mark_gc_pending() {
        let mut s = State::new(10);
        let k = || ("d".to_string(), "a".to_string());
        s.commit("/configmaps", k(), Some(cm("x")), None);
        s.commit("/configmaps", k(), Some(cm("y")), None);
        assert!(!s.gc_pending, "plain creates and updates give the collector nothing to do");
        let mut owned = cm("y");
        owned["metadata"]["ownerReferences"] = json!([{"uid": "u1"}]);
        s.commit("/configmaps", k(), Some(owned), None);
        assert!(s.gc_pending);
        s.gc_pending = false;
        s.commit("/configmaps", k(), Some(cm("z")), None);
        assert!(s.gc_pending, "dropping an owner reference can finish a foreground deletion");
        s.gc_pending = false;
        let mut deleting = cm("z");
        deleting["metadata"]["deletionTimestamp"] = json!("2025-01-01T00:00:00Z");
        s.commit("/configmaps", k(), Some(deleting), None);
        assert!(s.gc_pending);
        s.gc_pending = false;
        s.commit("/configmaps", k(), None, None);
        assert!(s.gc_pending, "a removal can orphan dependents");
    }

    #[test]
    fn compaction_moves_floor_past_every_handed_out_rv() {
        let mut s = State::new(10);
        s.commit("/configmaps", ("d".into(), "a".into()), Some(cm("x")), None);
        let seen = s.rv;
        s.compact();
        assert!(s.floor > seen);
        assert!(s.history.is_empty());
    }
}
