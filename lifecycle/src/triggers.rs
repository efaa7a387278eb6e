//! What starts a reconcile besides Runtime changes: release-meta and template changes (only
//! the runtimes they affect) and hub events for a runtime's cluster.

use fleetwatch_api::policy::{desired_version, parse};
use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate, Runtime};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runtimes whose desired version of the meta's module changes with this meta: they use
/// the module, are not pinned, and the version their channel now offers differs from the
/// one their status records.
pub fn affected_by_meta(runtimes: &Store<Runtime>, meta: &ModuleReleaseMeta) -> Vec<ObjectRef<Runtime>> {
    let module = &meta.spec.module_name;
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == meta.namespace())
        .filter(|rt| {
            rt.spec.modules.iter().any(|e| {
                if &e.name != module || e.version.is_some() {
                    return false;
                }
                let now =
                    desired_version(e, rt.spec.channel.as_deref(), Some(&meta.spec)).ok().map(|(v, _)| v.to_string());
                let recorded = rt
                    .status
                    .as_ref()
                    .and_then(|s| s.modules.iter().find(|m| &m.name == module))
                    .and_then(|m| m.desired_version.clone());
                now != recorded
            })
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// Runtimes that want exactly this template's module version.
pub fn affected_by_template(runtimes: &Store<Runtime>, tpl: &ModuleTemplate) -> Vec<ObjectRef<Runtime>> {
    let Ok(version) = parse(&tpl.spec.version) else { return Vec::new() };
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == tpl.namespace())
        .filter(|rt| {
            rt.status
                .as_ref()
                .and_then(|s| s.modules.iter().find(|m| m.name == tpl.spec.module_name))
                .is_some_and(|m| m.desired_version.as_deref().and_then(|v| parse(v).ok()).is_none_or(|v| v == version))
                || rt.spec.modules.iter().any(|e| e.name == tpl.spec.module_name) && rt.status.is_none()
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// Follows the hub: every event (or resync-required) for a cluster triggers the Runtimes
/// of that cluster.
pub async fn follow_hub(
    opts: SubscriberOptions,
    runtimes: Store<Runtime>,
    trigger: mpsc::Sender<ObjectRef<Runtime>>,
    cancel: CancellationToken,
) {
    let mut sub = loop {
        let connecting = Subscription::connect(opts.clone());
        tokio::select! {
            _ = cancel.cancelled() => return,
            res = connecting => match res {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to the hub; retrying (reconciles fall back to resyncs)");
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            }
        }
    };
    tracing::info!("subscribed to the hub");
    loop {
        let d = tokio::select! {
            _ = cancel.cancelled() => return,
            d = sub.next() => d,
        };
        let d = match d {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(error = %e, "hub subscription failed");
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
                continue;
            }
        };
        let mut clusters: Vec<String> = match &d {
            Delivery::Events(evs) => evs.iter().map(|e| e.cluster.clone()).collect(),
            Delivery::ResyncRequired(r) => vec![r.cluster.clone()],
        };
        clusters.sort();
        clusters.dedup();
        for rt in runtimes.state() {
            let id = rt.cluster_id();
            if clusters.iter().any(|c| c == "*" || *c == id) {
                tracing::debug!(runtime = %rt.name_any(), cluster = %id, "hub event triggers reconcile");
                if trigger.send(ObjectRef::from_obj(rt.as_ref())).await.is_err() {
                    return;
                }
            }
        }
        if let Some(c) = d.last_cursor() {
            let _ = sub.ack(c).await;
        }
    }
}
