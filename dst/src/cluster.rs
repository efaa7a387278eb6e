//! A simulated Kubernetes cluster: objects with resource versions, a watch history that
//! can be compacted (a watch from before it must relist, like a `410 Gone`), and what the
//! oracle compares: each object's watched value.
//!
//! Pure and synchronous: the driver mutates it between simulation steps, the agent's
//! [`crate::source::SimSource`] lists and watches it, the subscriber's model re-lists it
//! when told to resync.

use std::collections::{BTreeMap, VecDeque};

use serde_json::{Value, json};

/// The namespace every simulated object lives in.
pub const NAMESPACE: &str = "w";
/// What one object looks like to a subscriber: its watched value (`spec.v`). Every write
/// sets a value no write ever set before, so a delete and recreate differs too.
pub type Value64 = u64;

/// One write as a watch reports it.
#[derive(Debug, Clone, PartialEq)]
pub enum WatchEvent {
    /// Created or updated: the whole object.
    Applied(Value),
    /// Deleted: the object as it was.
    Deleted(Value),
}

/// A watch asked for history that was compacted away: list again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gone;

#[derive(Debug, Clone)]
struct Object {
    uid: u64,
    rv: u64,
    value: Value64,
}

/// One cluster's objects and their watch history.
#[derive(Debug, Clone, Default)]
pub struct ClusterModel {
    objects: BTreeMap<String, Object>,
    /// The resource version of the latest write.
    rv: u64,
    next_uid: u64,
    /// Writes after `compacted`, oldest first.
    history: VecDeque<(u64, WatchEvent)>,
    /// Watches from at or below this version must relist.
    compacted: u64,
}

impl ClusterModel {
    /// The object `name` as the API server returns it.
    fn render(&self, name: &str, o: &Object) -> Value {
        json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": format!("uid-{}", o.uid),
                "resourceVersion": o.rv.to_string()},
            "spec": {"v": o.value},
        })
    }

    /// Creates `name`, or updates it when it exists; its new value is the new version.
    pub fn apply(&mut self, name: &str) {
        self.rv += 1;
        let rv = self.rv;
        let uid = match self.objects.get(name) {
            Some(o) => o.uid,
            None => {
                self.next_uid += 1;
                self.next_uid
            }
        };
        let o = Object { uid, rv, value: rv };
        let rendered = self.render(name, &o);
        self.objects.insert(name.to_string(), o);
        tracing::debug!(name, value = rv, "cluster write");
        self.history.push_back((rv, WatchEvent::Applied(rendered)));
    }

    /// Deletes `name`; false when there is no such object.
    pub fn delete(&mut self, name: &str) -> bool {
        let Some(mut o) = self.objects.remove(name) else { return false };
        self.rv += 1;
        o.rv = self.rv;
        let rendered = self.render(name, &o);
        tracing::debug!(name, rv = self.rv, "cluster delete");
        self.history.push_back((self.rv, WatchEvent::Deleted(rendered)));
        true
    }

    /// Forgets the watch history: every watch relists.
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted = self.rv;
    }

    /// Keeps the history bounded like an API server's (the oldest writes are compacted).
    pub fn trim_history(&mut self, keep: usize) {
        while self.history.len() > keep {
            if let Some((rv, _)) = self.history.pop_front() {
                self.compacted = rv;
            }
        }
    }

    /// Every object, and the version the list is at.
    pub fn list(&self) -> (Vec<Value>, u64) {
        (self.objects.iter().map(|(n, o)| self.render(n, o)).collect(), self.rv)
    }

    /// The writes after `rv`, or [`Gone`] when they were compacted.
    pub fn watch_since(&self, rv: u64) -> Result<Vec<(u64, WatchEvent)>, Gone> {
        if rv < self.compacted {
            return Err(Gone);
        }
        Ok(self.history.iter().filter(|(v, _)| *v > rv).cloned().collect())
    }

    /// The names of the objects.
    pub fn names(&self) -> Vec<String> {
        self.objects.keys().cloned().collect()
    }

    /// What a subscriber should know: each object's value.
    pub fn state(&self) -> BTreeMap<String, Value64> {
        self.objects.iter().map(|(n, o)| (n.clone(), o.value)).collect()
    }

    /// The version of the latest write.
    pub fn rv(&self) -> u64 {
        self.rv
    }
}

/// The name an object has in an event (`data.metadata.name`).
pub fn event_name(data: &Value) -> Option<&str> {
    data.pointer("/metadata/name").and_then(Value::as_str)
}

/// The watched value an event carries (`data.projected.spec.v`), if any.
pub fn event_value(data: &Value) -> Option<Value64> {
    data.pointer("/projected/spec/v").and_then(Value::as_u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_get_new_versions_and_values() {
        let mut c = ClusterModel::default();
        c.apply("a");
        c.apply("b");
        c.apply("a");
        assert_eq!(c.state(), BTreeMap::from([("a".into(), 3), ("b".into(), 2)]));
        assert!(c.delete("b"));
        assert!(!c.delete("b"));
        c.apply("b"); // recreated: a value never seen before
        assert_eq!(c.state()["b"], 5);
        let (listed, rv) = c.list();
        assert_eq!((listed.len(), rv), (2, 5));
    }

    #[test]
    fn a_watch_from_before_a_compaction_is_gone() {
        let mut c = ClusterModel::default();
        c.apply("a");
        c.apply("b");
        assert_eq!(c.watch_since(1).unwrap().len(), 1);
        c.compact();
        assert_eq!(c.watch_since(1), Err(Gone));
        assert_eq!(c.watch_since(2), Ok(Vec::new()));
        c.delete("a");
        assert!(matches!(c.watch_since(2).unwrap()[..], [(3, WatchEvent::Deleted(_))]));
        c.apply("c");
        c.apply("d");
        c.trim_history(1);
        assert_eq!(c.watch_since(3), Err(Gone));
        assert_eq!(c.watch_since(4).unwrap().len(), 1);
    }
}
