//! The change filter: which observed objects become events.
//!
//! A Kubernetes watch reports every write to an object, and after every relist (a watch that
//! expired, an agent restart) every object again. Most of those writes touch nothing a
//! subscriber cares about (status heartbeats, `resourceVersion`, managed fields), and a relist
//! repeats what was already sent. Forwarding them all would cost the hub and every subscriber
//! for nothing, so the agent keeps one digest per object over the configured fields and emits
//! an event only when that digest changes.
//!
//! A relist is also where deletes go missing: an object deleted while the watch was down
//! never produces a delete event. The filter notices that the fresh list lacks an object it
//! knew and emits a synthetic delete (`data.vanished: true`), so subscribers need not resync.
//!
//! Everything here is pure (JSON in, [`Change`]s out): the Kubernetes plumbing lives in
//! [`crate::kube_source`], and this module is unit-tested without a cluster.

use std::collections::{HashMap, HashSet};
use std::hash::{Hash, Hasher};

use fleetwatch_protocol::ObjectKey;
use fleetwatch_protocol::message::WatchSpec;
use fleetwatch_protocol::watch::{DEFAULT_FIELDS, MAX_PROJECTION_BYTES, field_pointer};
use serde_json::{Value, json};

use crate::source::{Change, ChangeKind};

/// The JSON pointers whose values make an object's digest: the watch's `fields`, or the
/// defaults when it names none. Fields that are not valid paths are skipped (the hub
/// validates them before it pushes a watch).
pub fn change_pointers(spec: &WatchSpec) -> Vec<String> {
    let fields: Vec<&str> =
        if spec.fields.is_empty() { DEFAULT_FIELDS.to_vec() } else { spec.fields.iter().map(String::as_str).collect() };
    fields.into_iter().filter_map(|f| field_pointer(f).ok()).collect()
}

/// A digest of the values at `pointers` in `obj` (a missing value hashes differently from
/// any present one).
pub fn digest(obj: &Value, pointers: &[String]) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in pointers {
        p.hash(&mut h);
        match obj.pointer(p) {
            Some(v) => v.to_string().hash(&mut h),
            None => 0u8.hash(&mut h),
        }
    }
    h.finish()
}

/// What an event carries about an object: its identity, and the projected fields (at most
/// [`MAX_PROJECTION_BYTES`] of them; past that `projectionTruncated: true`).
pub fn event_data(obj: &Value, project: &[String]) -> Value {
    let md = &obj["metadata"];
    let mut data = json!({
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {
            "name": md["name"], "namespace": md["namespace"], "uid": md["uid"],
            "resourceVersion": md["resourceVersion"], "generation": md["generation"],
        },
    });
    if !project.is_empty() {
        let mut projected = serde_json::Map::new();
        let mut size = 0;
        for p in project {
            let Ok(ptr) = field_pointer(p) else { continue };
            if let Some(v) = obj.pointer(&ptr) {
                size += v.to_string().len();
                if size > MAX_PROJECTION_BYTES {
                    data["projectionTruncated"] = Value::Bool(true);
                    break;
                }
                projected.insert(p.clone(), v.clone());
            }
        }
        data["projected"] = Value::Object(projected);
    }
    data
}

/// `namespace/name` of an object (empty namespace for cluster-scoped objects).
fn short_key(obj: &Value) -> Box<str> {
    let md = &obj["metadata"];
    format!("{}/{}", md["namespace"].as_str().unwrap_or(""), md["name"].as_str().unwrap_or("")).into()
}

/// The filter of one watch: one kind, so namespace and name identify an object, and keeping
/// only those with a digest (not whole objects, not full keys) is what keeps the agent small.
///
/// Feed it the watch's events in order: [`relist_started`](Self::relist_started), then
/// [`listed`](Self::listed) per object of the fresh list, then
/// [`relist_done`](Self::relist_done); [`applied`](Self::applied) and
/// [`deleted`](Self::deleted) for live changes.
///
/// ```
/// use fleetwatch_agent::filter::WatchFilter;
/// use fleetwatch_protocol::message::WatchSpec;
/// let spec: WatchSpec = serde_json::from_value(serde_json::json!(
///     {"name": "cms", "version": "v1", "kind": "ConfigMap", "fields": ["data"]})).unwrap();
/// let mut f = WatchFilter::new(&spec, "v1", "ConfigMap");
/// let cm = serde_json::json!({"metadata": {"name": "a", "namespace": "ns"}, "data": {"k": "1"}});
/// assert!(f.applied(&cm).is_some());
/// let mut touched = cm.clone();
/// touched["metadata"]["resourceVersion"] = "7".into();
/// assert!(f.applied(&touched).is_none()); // nothing watched changed
/// ```
#[derive(Debug)]
pub struct WatchFilter {
    watch: String,
    project: Vec<String>,
    pointers: Vec<String>,
    api_version: String,
    kind: String,
    digests: HashMap<Box<str>, u64>,
    relisting: Option<HashSet<Box<str>>>,
}

impl WatchFilter {
    /// A filter for `spec`, whose kind resolved to `api_version` / `kind`.
    pub fn new(spec: &WatchSpec, api_version: &str, kind: &str) -> Self {
        Self {
            watch: spec.name.clone(),
            project: spec.project.clone(),
            pointers: change_pointers(spec),
            api_version: api_version.into(),
            kind: kind.into(),
            digests: HashMap::new(),
            relisting: None,
        }
    }

    /// Objects known (with a digest).
    pub fn len(&self) -> usize {
        self.digests.len()
    }

    /// Whether no object is known.
    pub fn is_empty(&self) -> bool {
        self.digests.is_empty()
    }

    /// The key of an object of this watch's kind.
    fn key_of(&self, obj: &Value) -> ObjectKey {
        let md = &obj["metadata"];
        ObjectKey::new(&self.api_version, &self.kind, md["namespace"].as_str(), md["name"].as_str().unwrap_or(""))
    }

    /// A fresh list begins.
    pub fn relist_started(&mut self) {
        self.relisting = Some(HashSet::new());
    }

    /// An object of the fresh list: remembered as present, then filtered like
    /// [`applied`](Self::applied).
    pub fn listed(&mut self, obj: &Value) -> Option<Change> {
        if let Some(seen) = self.relisting.as_mut() {
            seen.insert(short_key(obj));
        }
        self.applied(obj)
    }

    /// The fresh list is complete: whatever was known that the list lacks was deleted while
    /// nobody watched, and comes back as a synthetic delete (`data.vanished: true`).
    pub fn relist_done(&mut self) -> Vec<Change> {
        let Some(seen) = self.relisting.take() else { return Vec::new() };
        let mut gone: Vec<Box<str>> = self.digests.keys().filter(|k| !seen.contains(*k)).cloned().collect();
        // In key order, not the map's (random per process): the deletes take seqs in this
        // order, and a run that differs from the last by it hides what a seed found
        // (the simulation replays a seed exactly only if its agents do the same).
        gone.sort_unstable();
        let mut out = Vec::with_capacity(gone.len());
        for short in gone {
            self.digests.remove(&short);
            let (ns, name) = short.split_once('/').unwrap_or(("", &short));
            let key = ObjectKey::new(&self.api_version, &self.kind, (!ns.is_empty()).then_some(ns), name);
            tracing::debug!(watch = %self.watch, object = %key, "vanished during relist");
            out.push(Change {
                data: json!({"apiVersion": key.api_version, "kind": key.kind,
                    "metadata": {"name": key.name, "namespace": key.namespace}, "vanished": true}),
                key,
                kind: ChangeKind::Deleted,
                watch: Some(self.watch.clone()),
            });
        }
        out
    }

    /// An object was created or changed: a change when its watched fields differ from what
    /// was last seen (or it is new), `None` otherwise.
    pub fn applied(&mut self, obj: &Value) -> Option<Change> {
        let d = digest(obj, &self.pointers);
        if self.digests.insert(short_key(obj), d) == Some(d) {
            return None; // nothing we watch changed
        }
        Some(Change {
            key: self.key_of(obj),
            kind: ChangeKind::Applied,
            data: event_data(obj, &self.project),
            watch: Some(self.watch.clone()),
        })
    }

    /// An object was deleted: a change when it was known (a delete of an object never
    /// reported is not news), `None` otherwise.
    pub fn deleted(&mut self, obj: &Value) -> Option<Change> {
        self.digests.remove(&short_key(obj))?;
        Some(Change {
            key: self.key_of(obj),
            kind: ChangeKind::Deleted,
            data: event_data(obj, &self.project),
            watch: Some(self.watch.clone()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(fields: &[&str], project: &[&str]) -> WatchSpec {
        serde_json::from_value(json!({"name": "w", "version": "v1", "kind": "ConfigMap",
            "fields": fields, "project": project}))
        .unwrap()
    }

    fn cm(ns: Option<&str>, name: &str, v: &str) -> Value {
        json!({"apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": name, "namespace": ns, "resourceVersion": v}, "data": {"k": v}})
    }

    #[test]
    fn digest_follows_only_configured_fields() {
        let spec_only = vec![field_pointer("spec").unwrap()];
        let a = json!({"spec": {"x": 1}, "status": {"ready": false}, "metadata": {"resourceVersion": "1"}});
        let mut b = a.clone();
        b["status"]["ready"] = json!(true);
        b["metadata"]["resourceVersion"] = json!("2");
        assert_eq!(digest(&a, &spec_only), digest(&b, &spec_only));
        let with_status = vec![field_pointer("spec").unwrap(), field_pointer("status").unwrap()];
        assert_ne!(digest(&a, &with_status), digest(&b, &with_status));
        b["spec"]["x"] = json!(2);
        assert_ne!(digest(&a, &spec_only), digest(&b, &spec_only));
    }

    #[test]
    fn missing_field_differs_from_null() {
        let p = vec![field_pointer("spec").unwrap()];
        assert_ne!(digest(&json!({}), &p), digest(&json!({"spec": null}), &p));
    }

    #[test]
    fn default_fields_when_none_configured() {
        let defaults: Vec<String> = DEFAULT_FIELDS.iter().map(|f| field_pointer(f).unwrap()).collect();
        assert_eq!(change_pointers(&spec(&[], &[])), defaults);
        assert_eq!(change_pointers(&spec(&["data"], &[])), vec![field_pointer("data").unwrap()]);
    }

    #[test]
    fn event_data_projects_and_limits() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"},
            "data": {"k": "v", "big": "x".repeat(MAX_PROJECTION_BYTES)}});
        let d = event_data(&obj, &["/data/k".into(), "metadata.name".into()]);
        assert_eq!(d["projected"]["/data/k"], "v");
        assert_eq!(d["projected"]["metadata.name"], "a");
        let d = event_data(&obj, &["/data/big".into(), "/data/k".into()]);
        assert_eq!(d["projectionTruncated"], true);
        assert!(event_data(&obj, &[]).get("projected").is_none());
    }

    #[test]
    fn only_changes_of_watched_fields_pass() {
        let mut f = WatchFilter::new(&spec(&["data"], &["/data/k"]), "v1", "ConfigMap");
        let first = f.applied(&cm(Some("ns"), "a", "1")).expect("new object");
        assert_eq!(first.kind, ChangeKind::Applied);
        assert_eq!(first.key, ObjectKey::new("v1", "ConfigMap", Some("ns"), "a"));
        assert_eq!(first.watch.as_deref(), Some("w"));
        assert_eq!(first.data["projected"]["/data/k"], "1");
        let mut same_data = cm(Some("ns"), "a", "1");
        same_data["metadata"]["resourceVersion"] = json!("99");
        assert_eq!(f.applied(&same_data), None);
        assert!(f.applied(&cm(Some("ns"), "a", "2")).is_some());
        // The same name in another namespace is another object.
        assert!(f.applied(&cm(Some("other"), "a", "2")).is_some());
        assert_eq!(f.len(), 2);
    }

    #[test]
    fn deletes_only_of_known_objects() {
        let mut f = WatchFilter::new(&spec(&["data"], &[]), "v1", "ConfigMap");
        assert_eq!(f.deleted(&cm(Some("ns"), "never-seen", "1")), None);
        f.applied(&cm(Some("ns"), "a", "1"));
        let del = f.deleted(&cm(Some("ns"), "a", "1")).expect("known object");
        assert_eq!(del.kind, ChangeKind::Deleted);
        assert_eq!(del.data["metadata"]["name"], "a");
        assert!(f.is_empty());
        // Forgotten: seen again, it is news again.
        assert!(f.applied(&cm(Some("ns"), "a", "1")).is_some());
    }

    #[test]
    fn relist_repeats_nothing_and_reports_what_vanished() {
        let mut f = WatchFilter::new(&spec(&["data"], &[]), "v1", "ConfigMap");
        for name in ["a", "b", "c"] {
            f.applied(&cm(Some("ns"), name, "1"));
        }
        f.applied(&cm(None, "cluster-wide", "1"));
        f.relist_started();
        // a unchanged, b changed, d new; c and the cluster-scoped one gone.
        assert_eq!(f.listed(&cm(Some("ns"), "a", "1")), None);
        assert!(f.listed(&cm(Some("ns"), "b", "2")).is_some());
        assert!(f.listed(&cm(Some("ns"), "d", "1")).is_some());
        let mut gone = f.relist_done();
        gone.sort_by(|x, y| x.key.name.cmp(&y.key.name));
        assert_eq!(gone.len(), 2);
        assert_eq!(gone[0].key, ObjectKey::new("v1", "ConfigMap", Some("ns"), "c"));
        assert_eq!(gone[1].key, ObjectKey::new("v1", "ConfigMap", None, "cluster-wide"));
        for g in &gone {
            assert_eq!(g.kind, ChangeKind::Deleted);
            assert_eq!(g.data["vanished"], true);
            assert_eq!(g.data["metadata"]["name"], g.key.name.as_str());
        }
        assert_eq!(f.len(), 3);
        // Without a relist in progress there is nothing to diff.
        assert!(f.relist_done().is_empty());
    }
}
