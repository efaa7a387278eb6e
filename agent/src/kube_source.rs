//! The Kubernetes source: one watcher per configured watch, started and stopped as the hub
//! pushes configuration, plus a watcher of module manager Deployments for the module
//! inventory.
//!
//! This module only watches: deciding which observed objects become events (digests, relist
//! diff, synthetic deletes) is the pure [`crate::filter`], so it can be tested without a
//! cluster. Read-only: list and watch, nothing else.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_protocol::ObjectKey;
use fleetwatch_protocol::message::{ModuleInventory, WatchPhase, WatchSpec, WatchState};
use futures_util::StreamExt;
use kube::api::{Api, DynamicObject, GroupVersionKind};
use kube::discovery::{ApiResource, Scope};
use kube::runtime::watcher;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::filter::WatchFilter;
use crate::providers::{PROVIDES_ANNOTATION, Providers};
use crate::source::{Change, ChangeKind, Source, SourceIo};

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
            WatchPhase::WaitingForKind => {
                tracing::info!(watch = name, message = %next.message, "kind not served (yet); waiting for it")
            }
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

/// The Kubernetes source: watches what the hub configures in the cluster `client` reaches.
#[derive(Clone)]
pub struct KubeSource {
    client: kube::Client,
    origin: String,
}

impl KubeSource {
    /// A source over `client`; `origin` says where its configuration came from (a kubeconfig
    /// path, `in-cluster`), for logs.
    pub fn new(client: kube::Client, origin: impl Into<String>) -> Self {
        Self { client, origin: origin.into() }
    }
}

impl Source for KubeSource {
    fn describe(&self) -> String {
        format!("kubernetes ({})", self.origin)
    }

    fn reports_watch_status(&self) -> bool {
        true
    }

    fn run(self, io: SourceIo) -> impl Future<Output = ()> + Send {
        run(self.client, io.watches, io.changes, io.status, io.shutdown)
    }
}

/// Runs until `shutdown`: follows the pushed watch configuration and the module inventory.
/// Returns once every watcher it started has stopped.
async fn run(
    client: kube::Client,
    mut specs: watch::Receiver<Vec<WatchSpec>>,
    changes: mpsc::Sender<Change>,
    status: watch::Sender<Vec<WatchState>>,
    shutdown: CancellationToken,
) {
    let states = States { map: Arc::default(), publish: status };
    // The watchers' own token: cancelled when this function stops, for whatever reason.
    let watchers = shutdown.child_token();
    let tasks = TaskTracker::new();
    // The installed modules' declared kinds, from the inventory, for the watches' phases.
    let (providers_tx, providers) = watch::channel(Providers::default());
    tasks.spawn(inventory(client.clone(), changes.clone(), providers_tx, watchers.child_token()));
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
            let cancel = watchers.child_token();
            let watch = run_watch(
                client.clone(),
                spec.clone(),
                changes.clone(),
                states.clone(),
                providers.clone(),
                cancel.clone(),
            );
            tasks.spawn(watch);
            running.insert(name, (spec, cancel));
        }
        let stop = tokio::select! {
            _ = shutdown.cancelled() => true,
            changed = specs.changed() => changed.is_err(),
        };
        if stop {
            break;
        }
    }
    // Without a configuration to follow (its sender gone), the watchers stop too.
    watchers.cancel();
    tasks.close();
    tasks.wait().await;
}

/// How a Kubernetes error shows in the watch status.
fn classify(e: &kube::Error) -> (WatchPhase, String) {
    match e {
        kube::Error::Api(s) if s.code == 403 => (WatchPhase::Forbidden, s.message.clone()),
        // Absent kinds are told apart (waiting or failing) by who should provide them.
        kube::Error::Api(s) if s.code == 404 => (WatchPhase::WaitingForKind, s.message.clone()),
        kube::Error::Discovery(d) => (WatchPhase::WaitingForKind, d.to_string()),
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
    mut providers: watch::Receiver<Providers>,
    cancel: CancellationToken,
) {
    let name = spec.name.clone();
    states.set(&name, WatchPhase::Starting, String::new(), 0);
    let gvk = GroupVersionKind::gvk(&spec.group, &spec.version, &spec.kind);
    let what = format!("{}/{} {}", spec.group, spec.version, spec.kind);
    // Kept across the kind's absences: a relist after the CRD came back diffs against what
    // was watched before it went (synthetic deletes for objects gone meanwhile).
    let mut filter: Option<WatchFilter> = None;
    loop {
        // Resolve the kind; a kind that does not exist (yet, or any more) is looked up again
        // until its CRD appears, at most 5 s apart.
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
                    let (phase, msg) = if phase == WatchPhase::WaitingForKind {
                        providers.borrow_and_update().absent_kind(&spec.group, &spec.kind, &format!("{what}: {msg}"))
                    } else {
                        (phase, format!("{what}: {msg}"))
                    };
                    states.set(&name, phase, msg, 0);
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        // A module installed or removed: the phase may change at once. (A
                        // closed channel disables this branch instead of spinning.)
                        Ok(()) = providers.changed() => {}
                        _ = cancel.cancelled() => return,
                    }
                    wait = (wait * 2).min(Duration::from_secs(5));
                }
            }
        };
        let api: Api<DynamicObject> = match (&spec.namespace, caps.scope) {
            (Some(ns), Scope::Namespaced) => Api::namespaced_with(client.clone(), ns, &ar),
            _ => Api::all_with(client.clone(), &ar),
        };
        let filter = filter.get_or_insert_with(|| WatchFilter::new(&spec, &ar.api_version, &ar.kind));
        match follow(&name, &spec, api, &ar, filter, &changes, &states, &cancel).await {
            Followed::Stop => return,
            Followed::KindGone(msg) => {
                let (phase, msg) =
                    providers.borrow_and_update().absent_kind(&spec.group, &spec.kind, &format!("{what}: {msg}"));
                states.set(&name, phase, msg, filter.len() as u64);
            }
        }
    }
}

/// How following a resolved kind ended.
enum Followed {
    /// Cancelled, or nobody takes changes any more.
    Stop,
    /// The API server answers 404 for the kind (its CRD was deleted): resolve it again.
    KindGone(String),
}

/// Lists and watches one resolved kind, feeding the filter, until cancelled or the kind
/// goes away. Other errors are reported and retried by the watcher's backoff.
#[allow(clippy::too_many_arguments)]
async fn follow(
    name: &str,
    spec: &WatchSpec,
    api: Api<DynamicObject>,
    ar: &ApiResource,
    filter: &mut WatchFilter,
    changes: &mpsc::Sender<Change>,
    states: &States,
    cancel: &CancellationToken,
) -> Followed {
    let mut cfg = watcher::Config::default();
    if let Some(sel) = &spec.label_selector {
        cfg = cfg.labels(sel);
    }
    let stream = fleetwatch_client::kube_watch::relisting_watcher(api, cfg);
    futures_util::pin_mut!(stream);
    loop {
        let ev = tokio::select! {
            ev = stream.next() => ev,
            _ = cancel.cancelled() => return Followed::Stop,
        };
        let Some(ev) = ev else { return Followed::Stop };
        let mut out = Vec::new();
        match ev {
            Ok(watcher::Event::Init) => filter.relist_started(),
            Ok(watcher::Event::InitApply(obj)) => {
                if let Some(v) = to_json(name, ar, &obj) {
                    out.extend(filter.listed(&v));
                }
            }
            Ok(watcher::Event::InitDone) => {
                out.extend(filter.relist_done());
                states.set(name, WatchPhase::Running, String::new(), filter.len() as u64);
            }
            Ok(watcher::Event::Apply(obj)) => {
                if let Some(v) = to_json(name, ar, &obj) {
                    out.extend(filter.applied(&v));
                }
            }
            Ok(watcher::Event::Delete(obj)) => {
                // A delete must not be lost: without the whole object, its identity still
                // says which object went.
                let v = to_json(name, ar, &obj).unwrap_or_else(|| identity_json(ar, &obj));
                out.extend(filter.deleted(&v));
            }
            Err(e) => {
                let (phase, msg) = classify_watcher(&e);
                if phase == WatchPhase::WaitingForKind {
                    return Followed::KindGone(msg);
                }
                states.set(name, phase, msg, filter.len() as u64);
            }
        }
        for ch in out {
            if changes.send(ch).await.is_err() {
                return Followed::Stop;
            }
        }
    }
}

/// The object as JSON for the filter. A failure is logged with the object's identity and
/// gives `None`: the caller skips the change (or, for a delete, falls back to the identity)
/// rather than emitting an empty object.
fn to_json(watch: &str, ar: &ApiResource, obj: &DynamicObject) -> Option<Value> {
    match serde_json::to_value(obj) {
        Ok(v) => Some(v),
        Err(e) => {
            tracing::error!(
                watch,
                api_version = %ar.api_version,
                kind = %ar.kind,
                namespace = obj.metadata.namespace.as_deref().unwrap_or(""),
                name = obj.metadata.name.as_deref().unwrap_or(""),
                error = %e,
                "cannot serialise a watched object; its change is skipped"
            );
            None
        }
    }
}

/// An object's identity as JSON, from its typed metadata (which cannot fail to serialise).
fn identity_json(ar: &ApiResource, obj: &DynamicObject) -> Value {
    let md = &obj.metadata;
    json!({
        "apiVersion": ar.api_version, "kind": ar.kind,
        "metadata": {"name": md.name, "namespace": md.namespace, "uid": md.uid,
                     "resourceVersion": md.resource_version, "generation": md.generation},
    })
}

/// Follows module manager Deployments and emits the inventory whenever it changes.
///
/// Also publishes the kinds the installed modules declare (their manager Deployment's
/// [`PROVIDES_ANNOTATION`]) to `providers`, so an absent kind's phase says whether a
/// module that should provide it is installed.
async fn inventory(
    client: kube::Client,
    changes: mpsc::Sender<Change>,
    providers: watch::Sender<Providers>,
    cancel: CancellationToken,
) {
    let api: Api<k8s_openapi::api::apps::v1::Deployment> = Api::all(client);
    let stream = fleetwatch_client::kube_watch::relisting_watcher(api, watcher::Config::default().labels(MODULE_LABEL));
    futures_util::pin_mut!(stream);
    let mut current: BTreeMap<(String, String), (ModuleInventory, String)> = BTreeMap::new();
    let mut building: Option<BTreeMap<(String, String), (ModuleInventory, String)>> = None;
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
            let ready = manager_ready(d, want);
            let key = (d.metadata.namespace.clone().unwrap_or_default(), d.metadata.name.clone().unwrap_or_default());
            let provides =
                d.metadata.annotations.as_ref().and_then(|a| a.get(PROVIDES_ANNOTATION)).cloned().unwrap_or_default();
            Some((key, (ModuleInventory { name, version, ready }, provides)))
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
        let declared =
            Providers::from_modules(current.values().map(|(m, p)| (m.name.as_str(), m.version.as_str(), p.as_str())));
        providers.send_if_modified(|p| {
            let changed = *p != declared;
            *p = declared;
            changed
        });
        let mut modules: Vec<ModuleInventory> = current.values().map(|(m, _)| m.clone()).collect();
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

/// Whether a module's manager has rolled out its current spec, as `kubectl rollout status`
/// and the lifecycle operator judge it: the controller observed the latest generation, and the
/// updated and ready replicas reach the desired count. Counting ready replicas alone made a
/// Deployment of 0 replicas ready before its rollout, and an upgrade's end no inventory change
/// (the operator then noticed it only by polling).
fn manager_ready(d: &k8s_openapi::api::apps::v1::Deployment, want: i32) -> bool {
    let status = d.status.as_ref();
    let observed = status.and_then(|s| s.observed_generation).unwrap_or(0);
    let generation_seen = d.metadata.generation.is_none_or(|g| observed >= g);
    let updated = status.and_then(|s| s.updated_replicas).unwrap_or(0);
    let ready = status.and_then(|s| s.ready_replicas).unwrap_or(0);
    generation_seen && updated >= want && ready >= want
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
    fn a_manager_is_ready_once_its_current_spec_rolled_out() {
        use k8s_openapi::api::apps::v1::{Deployment, DeploymentStatus};
        let d = |generation: i64, observed: i64, updated: i32, ready: i32| {
            let mut d = Deployment::default();
            d.metadata.generation = Some(generation);
            d.status = Some(DeploymentStatus {
                observed_generation: Some(observed),
                updated_replicas: Some(updated),
                ready_replicas: Some(ready),
                ..Default::default()
            });
            d
        };
        assert!(manager_ready(&d(2, 2, 1, 1), 1));
        assert!(!manager_ready(&d(2, 1, 1, 1), 1), "the new spec not observed yet");
        assert!(!manager_ready(&d(2, 2, 0, 1), 1), "an old replica still ready");
        assert!(!manager_ready(&d(2, 2, 1, 0), 1));
        // Zero replicas: ready once observed, not before.
        assert!(!manager_ready(&Deployment { metadata: d(1, 0, 0, 0).metadata, ..Default::default() }, 0));
        assert!(manager_ready(&d(1, 1, 0, 0), 0));
    }

    #[test]
    fn identity_survives_without_the_object() {
        let ar = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        let mut obj = DynamicObject::new("a", &ar).within("ns");
        obj.metadata.uid = Some("u-1".into());
        let v = identity_json(&ar, &obj);
        assert_eq!(v["apiVersion"], "v1");
        assert_eq!(v["kind"], "ConfigMap");
        assert_eq!(v["metadata"]["name"], "a");
        assert_eq!(v["metadata"]["namespace"], "ns");
        assert_eq!(v["metadata"]["uid"], "u-1");
        assert_eq!(to_json("w", &ar, &obj).unwrap()["metadata"]["name"], "a");
    }

    #[test]
    fn kube_errors_map_to_watch_phases() {
        let status = |code: u16| {
            kube::Error::Api(kube::core::Status { code, message: format!("m{code}"), ..Default::default() }.boxed())
        };
        assert_eq!(classify(&status(403)), (WatchPhase::Forbidden, "m403".into()));
        assert_eq!(classify(&status(404)), (WatchPhase::WaitingForKind, "m404".into()));
        assert_eq!(classify(&status(500)).0, WatchPhase::Error);
    }
}
