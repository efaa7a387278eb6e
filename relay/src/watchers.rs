//! `--from-watchers`: lifecycle-manager's `Watcher` resources (`operator.kyma-project.io/v1beta2`)
//! in the control plane become WatchConfigs the hub pushes to agents, and routes to each
//! component's listener, so switching a KLM landscape needs no change to KLM.
//!
//! A Watcher maps to a WatchConfig `klm-<namespace>-<name>` (labelled
//! [`RELAY_LABEL`]`=<relay name>`, its `subscriber` the relay):
//! - `resourceToWatch {group, version, resource}` → `resource {group, version, kind}`, the kind
//!   resolved through the control plane's discovery (a resource it does not serve fails
//!   closed: no WatchConfig, a warning);
//! - `labelsToWatch` → `labelSelector` (`k=v,…`, sorted);
//! - `field: spec | status` → `fields: [spec]` or `[status]` (spec when absent);
//! - `manager` (else the label `operator.kyma-project.io/managed-by`) → the component, i.e.
//!   the route `{target}/v2/<manager>/event`; the target is `--target` when given, else the
//!   Watcher's `serviceInfo` (`http://<name>.<namespace>.svc:<port>`).
//!
//! The relay publishes a route before it applies the WatchConfig (no event of a watch can
//! arrive before its route), deletes the WatchConfigs it labelled whose Watcher is gone,
//! and follows Watcher changes with a watch.

use std::collections::BTreeMap;
use std::sync::Arc;

use fleetwatch_api::watchconfig::{ResourceRef, WatchConfig, WatchConfigSpec};
use futures_util::StreamExt;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::runtime::watcher;
use serde::Deserialize;
use tokio_util::sync::CancellationToken;

use crate::klm::{Route, Routes};

/// The label on WatchConfigs a relay made: its durable name.
pub const RELAY_LABEL: &str = "relay.fleetwatch.dev/name";
/// The label lifecycle-manager puts on a Watcher naming its module (component fallback).
pub const MANAGED_BY_LABEL: &str = "operator.kyma-project.io/managed-by";

/// The Watcher resource.
pub fn watcher_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.kyma-project.io", "v1beta2", "Watcher"),
        "watchers",
    )
}

/// `spec` of a Watcher (the fields fleetwatch reads; others are ignored).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatcherSpec {
    /// The component whose listener receives the events.
    #[serde(default)]
    pub manager: String,
    /// The listener's service.
    #[serde(default)]
    pub service_info: Option<ServiceInfo>,
    /// Labels the watched objects must have.
    #[serde(default)]
    pub labels_to_watch: BTreeMap<String, String>,
    /// What to watch.
    pub resource_to_watch: Gvr,
    /// `spec` or `status`.
    #[serde(default)]
    pub field: String,
}

/// Group, version, resource (plural).
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
pub struct Gvr {
    /// The group (empty: core).
    #[serde(default)]
    pub group: String,
    /// The version.
    pub version: String,
    /// The resource (plural name).
    pub resource: String,
}

/// The listener's service.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct ServiceInfo {
    /// The port.
    #[serde(default)]
    pub port: i64,
    /// The service name.
    #[serde(default)]
    pub name: String,
    /// The service namespace.
    #[serde(default)]
    pub namespace: String,
}

/// Why a Watcher cannot be followed.
#[derive(Debug, Clone, thiserror::Error, PartialEq, Eq)]
#[error("Watcher {watcher}: {why}")]
pub struct WatcherError {
    /// `namespace/name`.
    pub watcher: String,
    /// What is wrong.
    pub why: String,
}

/// A Watcher turned into what fleetwatch needs.
#[derive(Debug, Clone)]
pub struct Mapped {
    /// The WatchConfig to apply.
    pub watch_config: WatchConfig,
    /// Where its events go.
    pub route: Route,
}

/// Maps one Watcher. `resolve` turns a resource into its kind (discovery); `target`
/// overrides `serviceInfo`; `relay` is the relay's durable name.
pub fn map_watcher(
    obj: &DynamicObject,
    resolve: impl Fn(&Gvr) -> Option<String>,
    target: Option<&str>,
    relay: &str,
) -> Result<Mapped, WatcherError> {
    let ns = obj.metadata.namespace.clone().unwrap_or_default();
    let name = obj.metadata.name.clone().unwrap_or_default();
    let id = format!("{ns}/{name}");
    let err = |why: String| WatcherError { watcher: id.clone(), why };
    let spec: WatcherSpec = serde_json::from_value(obj.data.get("spec").cloned().unwrap_or_default())
        .map_err(|e| err(format!("unreadable spec: {e}")))?;
    let gvr = &spec.resource_to_watch;
    if gvr.version.is_empty() || gvr.resource.is_empty() {
        return Err(err("resourceToWatch.version and resourceToWatch.resource are required".into()));
    }
    let kind = resolve(gvr).ok_or_else(|| {
        err(format!(
            "the control plane's discovery has no resource {:?} in {}/{}",
            gvr.resource, gvr.group, gvr.version
        ))
    })?;
    let fields = match spec.field.as_str() {
        "" | "spec" => vec!["spec".to_string()],
        "status" => vec!["status".to_string()],
        other => return Err(err(format!("field {other:?} is neither spec nor status"))),
    };
    let component = if !spec.manager.is_empty() {
        spec.manager.clone()
    } else {
        obj.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY_LABEL)).cloned().unwrap_or_default()
    };
    if component.is_empty() || !component.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    {
        return Err(err(format!("no usable component (spec.manager or label {MANAGED_BY_LABEL}): {component:?}")));
    }
    let target = match (target, &spec.service_info) {
        (Some(t), _) => t.to_string(),
        (None, Some(s)) if !s.name.is_empty() && !s.namespace.is_empty() && (1..=65535).contains(&s.port) => {
            format!("http://{}.{}.svc:{}", s.name, s.namespace, s.port)
        }
        _ => return Err(err("no --target and no complete serviceInfo".into())),
    };
    let selector = (!spec.labels_to_watch.is_empty())
        .then(|| spec.labels_to_watch.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join(","));
    let wc_name = format!("klm-{ns}-{name}");
    if wc_name.len() > 253 {
        return Err(err("namespace and name too long for a WatchConfig name".into()));
    }
    let mut wc = WatchConfig::new(
        &wc_name,
        WatchConfigSpec {
            resource: ResourceRef { group: gvr.group.clone(), version: gvr.version.clone(), kind },
            namespace: None,
            label_selector: selector,
            fields,
            project: Vec::new(),
            subscriber: Some(relay.to_string()),
        },
    );
    wc.metadata.labels = Some([(RELAY_LABEL.to_string(), relay.to_string())].into_iter().collect());
    wc.to_watch_spec().map_err(|e| err(e.why))?;
    Ok(Mapped { watch_config: wc, route: Route { target, component } })
}

/// The kind of a resource, through discovery of the cluster `client` reaches.
pub async fn resolve_kind(client: &kube::Client, gvr: &Gvr) -> Option<String> {
    let gv = if gvr.group.is_empty() { gvr.version.clone() } else { format!("{}/{}", gvr.group, gvr.version) };
    let gv: kube::core::GroupVersion = gv.parse().ok()?;
    let group = kube::discovery::pinned_group(client, &gv).await.ok()?;
    group.versioned_resources(&gvr.version).into_iter().find(|(ar, _)| ar.plural == gvr.resource).map(|(ar, _)| ar.kind)
}

/// Why following Watchers stopped.
#[derive(Debug, thiserror::Error)]
pub enum FollowError {
    /// The control plane refused or failed.
    #[error("control plane: {0}")]
    Kube(#[from] kube::Error),
}

/// Follows the Watchers of the control plane `client` reaches until `shutdown`: applies
/// WatchConfigs and publishes routes (`default` stays in every published set). `synced`
/// fires after the first complete pass (routes published, WatchConfigs applied).
pub async fn follow(
    client: kube::Client,
    target: Option<String>,
    relay: String,
    default: Option<Route>,
    routes: tokio::sync::watch::Sender<Arc<Routes>>,
    synced: tokio::sync::oneshot::Sender<()>,
    shutdown: CancellationToken,
) {
    let mut synced = Some(synced);
    let api: Api<DynamicObject> = Api::all_with(client.clone(), &watcher_resource());
    let mut stream = watcher(api, watcher::Config::default()).boxed();
    let mut watchers: BTreeMap<String, DynamicObject> = BTreeMap::new();
    let mut init: Option<BTreeMap<String, DynamicObject>> = None;
    let mut said = crate::SaidOnce::new(256);
    let mut backoff = fleetwatch_client::backoff::Reconnect::default().delays();
    loop {
        let ev = tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = stream.next() => ev,
        };
        let key = |o: &DynamicObject| {
            format!("{}/{}", o.metadata.namespace.as_deref().unwrap_or(""), o.metadata.name.as_deref().unwrap_or(""))
        };
        match ev {
            None => return,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "watching Watchers in the control plane failed; retrying");
                let wait = backoff.next().unwrap_or(std::time::Duration::from_secs(5));
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(wait) => {}
                }
                continue;
            }
            Some(Ok(watcher::Event::Init)) => {
                init = Some(BTreeMap::new());
                continue;
            }
            Some(Ok(watcher::Event::InitApply(o))) => {
                if let Some(i) = init.as_mut() {
                    i.insert(key(&o), o);
                }
                continue;
            }
            Some(Ok(watcher::Event::InitDone)) => {
                watchers = init.take().unwrap_or_default();
            }
            Some(Ok(watcher::Event::Apply(o))) => {
                watchers.insert(key(&o), o);
            }
            Some(Ok(watcher::Event::Delete(o))) => {
                watchers.remove(&key(&o));
            }
        }
        backoff = fleetwatch_client::backoff::Reconnect::default().delays();
        // Until it worked (or a newer change comes, which reconciles everything anyway).
        let mut retry = fleetwatch_client::backoff::Reconnect::default().delays();
        loop {
            match reconcile(&client, &watchers, target.as_deref(), &relay, &default, &routes, &mut said).await {
                Ok(()) => {
                    if let Some(s) = synced.take() {
                        let _ = s.send(());
                    }
                    break;
                }
                Err(e) => {
                    let wait = retry.next().unwrap_or(std::time::Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot apply the WatchConfigs of the Watchers");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(wait) => {}
                    }
                }
            }
        }
    }
}

/// Makes the WatchConfigs and routes match `watchers`.
async fn reconcile(
    client: &kube::Client,
    watchers: &BTreeMap<String, DynamicObject>,
    target: Option<&str>,
    relay: &str,
    default: &Option<Route>,
    routes: &tokio::sync::watch::Sender<Arc<Routes>>,
    said: &mut crate::SaidOnce,
) -> Result<(), FollowError> {
    let mut kinds: BTreeMap<Gvr, Option<String>> = BTreeMap::new();
    for o in watchers.values() {
        if let Some(gvr) = o.data.get("spec").and_then(|s| s.get("resourceToWatch")).cloned()
            && let Ok(gvr) = serde_json::from_value::<Gvr>(gvr)
            && !kinds.contains_key(&gvr)
        {
            let kind = resolve_kind(client, &gvr).await;
            kinds.insert(gvr, kind);
        }
    }
    let mut desired: Vec<Mapped> = Vec::new();
    for o in watchers.values() {
        match map_watcher(o, |g| kinds.get(g).cloned().flatten(), target, relay) {
            Ok(m) => desired.push(m),
            Err(e) => {
                if said.first(&e.to_string()) {
                    tracing::warn!(error = %e, "not following this Watcher");
                }
            }
        }
    }
    // Routes first: no event of a new watch can arrive before its route.
    let next = Routes {
        by_watch: desired
            .iter()
            .map(|m| (m.watch_config.metadata.name.clone().unwrap_or_default(), m.route.clone()))
            .collect(),
        default: default.clone(),
    };
    routes.send_if_modified(|cur| {
        if **cur == next {
            return false;
        }
        tracing::info!(routes = next.by_watch.len(), "listener routes from Watchers changed");
        *cur = Arc::new(next);
        true
    });
    let wcs: Api<WatchConfig> = Api::all(client.clone());
    let pp = PatchParams::apply("fleetwatch-relay").force();
    for m in &desired {
        let name = m.watch_config.metadata.name.clone().unwrap_or_default();
        let mut wc = m.watch_config.clone();
        wc.metadata.managed_fields = None;
        let mut body = serde_json::to_value(&wc).unwrap_or_default();
        body["apiVersion"] = "operator.fleetwatch.dev/v1alpha1".into();
        body["kind"] = "WatchConfig".into();
        wcs.patch(&name, &pp, &Patch::Apply(body)).await?;
    }
    let mine = wcs.list(&ListParams::default().labels(&format!("{RELAY_LABEL}={relay}"))).await?;
    for wc in mine.items {
        let name = wc.metadata.name.clone().unwrap_or_default();
        if !desired.iter().any(|m| m.watch_config.metadata.name.as_deref() == Some(name.as_str())) {
            tracing::info!(watch_config = %name, "deleting the WatchConfig of a Watcher that is gone");
            match wcs.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn watcher(spec: serde_json::Value, labels: serde_json::Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Watcher",
            "metadata": {"name": "klm-watcher", "namespace": "kcp-system", "labels": labels},
            "spec": spec,
        }))
        .unwrap()
    }

    fn kyma_kind(g: &Gvr) -> Option<String> {
        (g.group == "operator.kyma-project.io" && g.resource == "kymas").then(|| "Kyma".to_string())
    }

    #[test]
    fn a_watcher_becomes_a_watch_config_and_a_route() {
        let w = watcher(
            json!({"manager": "lifecycle-manager", "field": "spec",
                   "labelsToWatch": {"operator.kyma-project.io/watched-by": "lifecycle-manager", "a": "b"},
                   "resourceToWatch": {"group": "operator.kyma-project.io", "version": "v1beta2", "resource": "kymas"},
                   "serviceInfo": {"name": "klm-event-service", "namespace": "kcp-system", "port": 8082},
                   "gateway": {"selector": {"matchLabels": {"x": "y"}}}}),
            json!({}),
        );
        let m = map_watcher(&w, kyma_kind, None, "klm-relay").unwrap();
        let wc = &m.watch_config;
        assert_eq!(wc.metadata.name.as_deref(), Some("klm-kcp-system-klm-watcher"));
        assert_eq!(wc.metadata.labels.as_ref().unwrap()[RELAY_LABEL], "klm-relay");
        assert_eq!(
            wc.spec.resource,
            ResourceRef { group: "operator.kyma-project.io".into(), version: "v1beta2".into(), kind: "Kyma".into() }
        );
        assert_eq!(
            wc.spec.label_selector.as_deref(),
            Some("a=b,operator.kyma-project.io/watched-by=lifecycle-manager")
        );
        assert_eq!(wc.spec.fields, vec!["spec".to_string()]);
        assert_eq!(wc.spec.subscriber.as_deref(), Some("klm-relay"));
        assert_eq!(
            m.route,
            Route {
                target: "http://klm-event-service.kcp-system.svc:8082".into(),
                component: "lifecycle-manager".into()
            }
        );
        let m = map_watcher(&w, kyma_kind, Some("https://gw:443"), "r").unwrap();
        assert_eq!(m.route.url(), "https://gw:443/v2/lifecycle-manager/event");
    }

    #[test]
    fn status_field_managed_by_label_and_no_labels() {
        let w = watcher(
            json!({"field": "status", "resourceToWatch": {"group": "operator.kyma-project.io", "version": "v1beta2", "resource": "kymas"}}),
            json!({MANAGED_BY_LABEL: "telemetry"}),
        );
        let m = map_watcher(&w, kyma_kind, Some("http://t"), "r").unwrap();
        assert_eq!(m.watch_config.spec.fields, vec!["status".to_string()]);
        assert_eq!(m.watch_config.spec.label_selector, None);
        assert_eq!(m.route.component, "telemetry");
    }

    #[test]
    fn unusable_watchers_fail_closed_with_the_reason() {
        let gvr = json!({"group": "operator.kyma-project.io", "version": "v1beta2", "resource": "kymas"});
        let cases = [
            (
                json!({"manager": "m", "resourceToWatch": {"group": "x", "version": "v1", "resource": "things"}}),
                "discovery has no resource",
            ),
            (json!({"manager": "m", "field": "metadata", "resourceToWatch": gvr}), "neither spec nor status"),
            (json!({"resourceToWatch": gvr}), "no usable component"),
            (json!({"manager": "m/../x", "resourceToWatch": gvr}), "no usable component"),
            (json!({"manager": "m", "resourceToWatch": gvr, "labelsToWatch": {"bad key!": "v"}}), "labelSelector"),
            (json!({"manager": "m"}), "unreadable spec"),
        ];
        for (spec, want) in cases {
            let e = map_watcher(&watcher(spec.clone(), json!({})), kyma_kind, Some("http://t"), "r").unwrap_err();
            assert!(e.to_string().contains(want) && e.to_string().contains("kcp-system/klm-watcher"), "{spec}: {e}");
        }
        let no_target = watcher(json!({"manager": "m", "resourceToWatch": gvr}), json!({}));
        assert!(map_watcher(&no_target, kyma_kind, None, "r").unwrap_err().why.contains("serviceInfo"));
    }
}
