//! The Kubernetes source: one watcher per configured watch (started and stopped as the hub
//! pushes configuration), a digest per object so only changes of the configured fields
//! become events, synthetic deletes after a relist, and the module inventory.
//!
//! Read-only: list and watch, nothing else.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{Hash, Hasher};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_protocol::ObjectKey;
use fleetwatch_protocol::message::{ModuleInventory, WatchPhase, WatchSpec, WatchState};
use fleetwatch_protocol::watch::{DEFAULT_FIELDS, MAX_PROJECTION_BYTES, field_pointer};
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::{ApiResource, Scope};
use kube::runtime::{WatchStreamExt, watcher};
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

use crate::source::{Change, ChangeKind};

/// Label that marks a module's manager Deployment; its value is the module name.
pub const MODULE_LABEL: &str = "operator.fleetwatch.dev/module";
/// Label carrying the module's running version.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// Shared table of watch states, published on every change.
#[derive(Clone)]
struct States {
    map: Arc<Mutex<BTreeMap<String, WatchState>>>,
    publish: watch::Sender<Vec<WatchState>>,
}

impl States {
    fn set(&self, name: &str, phase: WatchPhase, message: String, objects: u64) {
        let Ok(mut map) = self.map.lock() else { return };
        let next = WatchState { name: name.into(), phase, message, objects };
        if map.get(name) == Some(&next) {
            return;
        }
        match phase {
            WatchPhase::Running => tracing::info!(watch = name, objects, "watch running"),
            WatchPhase::Starting => tracing::debug!(watch = name, "watch starting"),
            // Normal while a module's CRD is not installed yet; retried.
            WatchPhase::KindNotFound => tracing::info!(watch = name, message = %next.message, "kind not served (yet)"),
            _ => tracing::warn!(watch = name, %phase, message = %next.message, "watch not running"),
        }
        map.insert(name.into(), next);
        self.publish.send_replace(map.values().cloned().collect());
    }

    fn remove(&self, name: &str) {
        let Ok(mut map) = self.map.lock() else { return };
        if map.remove(name).is_some() {
            self.publish.send_replace(map.values().cloned().collect());
        }
    }
}

/// Runs until `shutdown`: follows the pushed watch configuration and the module inventory.
pub async fn run(
    client: kube::Client,
    mut specs: watch::Receiver<Vec<WatchSpec>>,
    changes: mpsc::Sender<Change>,
    status: watch::Sender<Vec<WatchState>>,
    shutdown: CancellationToken,
) {
    let states = States { map: Arc::default(), publish: status };
    tokio::spawn(inventory(client.clone(), changes.clone(), shutdown.child_token()));
    let mut running: HashMap<String, (WatchSpec, CancellationToken)> = HashMap::new();
    loop {
        let wanted: HashMap<String, WatchSpec> =
            specs.borrow_and_update().iter().map(|s| (s.name.clone(), s.clone())).collect();
        // Stop what is gone or changed; start what is new or changed.
        running.retain(|name, (spec, cancel)| {
            let keep = wanted.get(name) == Some(spec);
            if !keep {
                tracing::info!(watch = %name, "stopping watch");
                cancel.cancel();
                states.remove(name);
            }
            keep
        });
        for (name, spec) in wanted {
            if running.contains_key(&name) {
                continue;
            }
            tracing::info!(watch = %name, kind = %spec.kind, "starting watch");
            let cancel = shutdown.child_token();
            tokio::spawn(run_watch(client.clone(), spec.clone(), changes.clone(), states.clone(), cancel.clone()));
            running.insert(name, (spec, cancel));
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            changed = specs.changed() => if changed.is_err() { return },
        }
    }
}

/// The pointers whose values make an object's digest.
fn change_pointers(spec: &WatchSpec) -> Vec<String> {
    let fields: Vec<&str> =
        if spec.fields.is_empty() { DEFAULT_FIELDS.to_vec() } else { spec.fields.iter().map(String::as_str).collect() };
    fields.into_iter().filter_map(|f| field_pointer(f).ok()).collect()
}

/// A digest of the configured fields of an object.
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

/// What an event carries about an object: identity, and the projected fields.
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

fn object_key(ar: &ApiResource, obj: &DynamicObject) -> ObjectKey {
    ObjectKey::new(
        &ar.api_version,
        &ar.kind,
        obj.metadata.namespace.as_deref(),
        obj.metadata.name.as_deref().unwrap_or(""),
    )
}

/// How a Kubernetes error shows in the watch status.
fn classify(e: &kube::Error) -> (WatchPhase, String) {
    match e {
        kube::Error::Api(s) if s.code == 403 => (WatchPhase::Forbidden, s.message.clone()),
        kube::Error::Api(s) if s.code == 404 => (WatchPhase::KindNotFound, s.message.clone()),
        kube::Error::Discovery(d) => (WatchPhase::KindNotFound, d.to_string()),
        other => (WatchPhase::Error, other.to_string()),
    }
}

fn classify_watcher(e: &watcher::Error) -> (WatchPhase, String) {
    match e {
        watcher::Error::InitialListFailed(e) | watcher::Error::WatchStartFailed(e) | watcher::Error::WatchFailed(e) => {
            classify(e)
        }
        watcher::Error::WatchError(s) if s.code == 403 => (WatchPhase::Forbidden, s.message.clone()),
        other => (WatchPhase::Error, other.to_string()),
    }
}

async fn run_watch(
    client: kube::Client,
    spec: WatchSpec,
    changes: mpsc::Sender<Change>,
    states: States,
    cancel: CancellationToken,
) {
    let name = spec.name.clone();
    states.set(&name, WatchPhase::Starting, String::new(), 0);
    // Resolve the kind; a kind that does not exist yet is retried until its CRD appears.
    let gvk = GroupVersionKind::gvk(&spec.group, &spec.version, &spec.kind);
    let mut wait = Duration::from_millis(250);
    let (ar, caps) = loop {
        let found = tokio::select! {
            r = kube::discovery::pinned_kind(&client, &gvk) => r,
            _ = cancel.cancelled() => return,
        };
        match found {
            Ok(v) => break v,
            Err(e) => {
                let (phase, msg) = classify(&e);
                states.set(&name, phase, format!("{}/{} {}: {msg}", spec.group, spec.version, spec.kind), 0);
                tokio::select! {
                    _ = tokio::time::sleep(wait) => {}
                    _ = cancel.cancelled() => return,
                }
                wait = (wait * 2).min(Duration::from_secs(5));
            }
        }
    };
    let api: Api<DynamicObject> = match (&spec.namespace, caps.scope) {
        (Some(ns), Scope::Namespaced) => Api::namespaced_with(client, ns, &ar),
        _ => Api::all_with(client, &ar),
    };
    let mut cfg = watcher::Config::default();
    if let Some(sel) = &spec.label_selector {
        cfg = cfg.labels(sel);
    }
    let pointers = change_pointers(&spec);
    // One watch covers one kind: namespace and name identify an object, and keeping only
    // those (not whole objects, not full keys) is what keeps the agent small.
    let mut digests: HashMap<Box<str>, u64> = HashMap::new();
    let mut relisting: Option<HashSet<Box<str>>> = None;
    let stream = watcher(api, cfg).default_backoff();
    futures_util::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = cancel.cancelled() => return,
        };
        let Some(ev) = ev else { return };
        let mut out = Vec::new();
        match ev {
            Ok(watcher::Event::Init) => relisting = Some(HashSet::new()),
            Ok(watcher::Event::InitApply(obj)) => {
                if let Some(seen) = relisting.as_mut() {
                    seen.insert(short_key(&obj));
                }
                out.extend(applied(&spec, &pointers, &mut digests, object_key(&ar, &obj), obj));
            }
            Ok(watcher::Event::InitDone) => {
                // Whatever we knew that the fresh list lacks was deleted while we were not
                // watching: say so.
                if let Some(seen) = relisting.take() {
                    let gone: Vec<Box<str>> = digests.keys().filter(|k| !seen.contains(*k)).cloned().collect();
                    for short in gone {
                        digests.remove(&short);
                        let (ns, obj_name) = short.split_once('/').unwrap_or(("", &short));
                        let key = ObjectKey::new(&ar.api_version, &ar.kind, (!ns.is_empty()).then_some(ns), obj_name);
                        tracing::debug!(watch = %name, object = %key, "vanished during relist");
                        out.push(Change {
                            data: json!({"apiVersion": key.api_version, "kind": key.kind,
                                "metadata": {"name": key.name, "namespace": key.namespace}, "vanished": true}),
                            key,
                            kind: ChangeKind::Deleted,
                            watch: Some(name.clone()),
                        });
                    }
                }
                states.set(&name, WatchPhase::Running, String::new(), digests.len() as u64);
            }
            Ok(watcher::Event::Apply(obj)) => {
                let key = object_key(&ar, &obj);
                out.extend(applied(&spec, &pointers, &mut digests, key, obj));
            }
            Ok(watcher::Event::Delete(obj)) => {
                let key = object_key(&ar, &obj);
                if digests.remove(&short_key(&obj)).is_some() {
                    let v = serde_json::to_value(&obj).unwrap_or_default();
                    out.push(Change {
                        key,
                        kind: ChangeKind::Deleted,
                        data: event_data(&v, &spec.project),
                        watch: Some(name.clone()),
                    });
                }
            }
            Err(e) => {
                let (phase, msg) = classify_watcher(&e);
                states.set(&name, phase, msg, digests.len() as u64);
            }
        }
        for ch in out {
            if changes.send(ch).await.is_err() {
                return;
            }
        }
    }
}

/// `namespace/name` (empty namespace for cluster-scoped objects).
fn short_key(obj: &DynamicObject) -> Box<str> {
    format!("{}/{}", obj.metadata.namespace.as_deref().unwrap_or(""), obj.metadata.name.as_deref().unwrap_or("")).into()
}

fn applied(
    spec: &WatchSpec,
    pointers: &[String],
    digests: &mut HashMap<Box<str>, u64>,
    key: ObjectKey,
    obj: DynamicObject,
) -> Option<Change> {
    let short = short_key(&obj);
    let v = serde_json::to_value(&obj).ok()?;
    let d = digest(&v, pointers);
    if digests.insert(short, d) == Some(d) {
        return None; // nothing we watch changed
    }
    Some(Change { key, kind: ChangeKind::Applied, data: event_data(&v, &spec.project), watch: Some(spec.name.clone()) })
}

/// Follows module manager Deployments and emits the inventory whenever it changes.
async fn inventory(client: kube::Client, changes: mpsc::Sender<Change>, cancel: CancellationToken) {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(client);
    let stream = watcher(api, watcher::Config::default().labels(MODULE_LABEL)).default_backoff();
    futures_util::pin_mut!(stream);
    let mut current: BTreeMap<(String, String), ModuleInventory> = BTreeMap::new();
    let mut building: Option<BTreeMap<(String, String), ModuleInventory>> = None;
    let mut last_sent: Option<Vec<ModuleInventory>> = None;
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = cancel.cancelled() => return,
        };
        let Some(ev) = ev else { return };
        let module_of = |d: &k8s_openapi::api::apps::v1::Deployment| {
            let labels = d.metadata.labels.clone().unwrap_or_default();
            let name = labels.get(MODULE_LABEL)?.clone();
            let version = labels.get(VERSION_LABEL).cloned().unwrap_or_default();
            let want = d.spec.replicas.unwrap_or(1);
            let ready = d.status.as_ref().and_then(|s| s.ready_replicas).unwrap_or(0) >= want;
            let key = (d.metadata.namespace.clone().unwrap_or_default(), d.metadata.name.clone().unwrap_or_default());
            Some((key, ModuleInventory { name, version, ready }))
        };
        let settled = match ev {
            Ok(watcher::Event::Init) => {
                building = Some(BTreeMap::new());
                false
            }
            Ok(watcher::Event::InitApply(d)) => {
                if let (Some(b), Some((k, m))) = (building.as_mut(), module_of(&d)) {
                    b.insert(k, m);
                }
                false
            }
            Ok(watcher::Event::InitDone) => {
                current = building.take().unwrap_or_default();
                true
            }
            Ok(watcher::Event::Apply(d)) => {
                if let Some((k, m)) = module_of(&d) {
                    current.insert(k, m);
                }
                true
            }
            Ok(watcher::Event::Delete(d)) => {
                if let Some((k, _)) = module_of(&d) {
                    current.remove(&k);
                }
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching module deployments failed; retrying");
                false
            }
        };
        if !settled {
            continue;
        }
        let mut modules: Vec<ModuleInventory> = current.values().cloned().collect();
        modules.sort_by(|a, b| (&a.name, &a.version).cmp(&(&b.name, &b.version)));
        if last_sent.as_ref() == Some(&modules) {
            continue;
        }
        last_sent = Some(modules.clone());
        let change = Change {
            key: inventory_key(),
            kind: ChangeKind::Inventory,
            data: json!({ "modules": modules }),
            watch: None,
        };
        if changes.send(change).await.is_err() {
            return;
        }
    }
}

/// The object key of inventory changes (their events carry the subject
/// `fleetwatch_protocol::event::INVENTORY_SUBJECT`).
pub fn inventory_key() -> ObjectKey {
    ObjectKey::new("fleetwatch.dev/v1", "Inventory", None, "modules")
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn event_data_projects_and_limits() {
        let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a", "namespace": "ns"},
            "data": {"k": "v", "big": "x".repeat(MAX_PROJECTION_BYTES)}});
        let d = event_data(&obj, &["/data/k".into(), "metadata.name".into()]);
        assert_eq!(d["projected"]["/data/k"], "v");
        assert_eq!(d["projected"]["metadata.name"], "a");
        let d = event_data(&obj, &["/data/big".into(), "/data/k".into()]);
        assert_eq!(d["projectionTruncated"], true);
    }
}
