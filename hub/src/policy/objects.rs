//! The subscriber access policy's SubscriberAccessPolicy objects in the control plane
//! (`--access-policy-from-control-plane`): watched, each checked with the file's check
//! ([`access::judge_objects`]), the accepted ones' grants put in force (sessions no longer
//! granted are closed) and what the hub made of each written into its status, only when
//! it differs from what the object says.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;

use fleetwatch_api::access_policy::{SubscriberAccessPolicy, SubscriberAccessPolicySpec, SubscriberAccessPolicyStatus};
use fleetwatch_api::module::Condition;
use futures_util::StreamExt;
use kube::api::{Patch, PatchParams};
use kube::runtime::watcher;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::policy::access::{self, ObjectVerdict};

/// The status a verdict makes for an object of `generation`, keeping the condition's
/// transition time when its status and reason did not change.
pub(crate) fn desired(
    v: &ObjectVerdict,
    generation: Option<i64>,
    observed: Option<&SubscriberAccessPolicyStatus>,
    now: jiff::Timestamp,
) -> SubscriberAccessPolicyStatus {
    let status = if v.accepted { "True" } else { "False" };
    let previous = observed.and_then(|o| o.conditions.iter().find(|c| c.type_ == "Accepted"));
    let since = match previous {
        Some(c) if c.status == status && c.reason == v.reason => c.last_transition_time.clone(),
        _ => None,
    };
    SubscriberAccessPolicyStatus {
        observed_generation: generation,
        conditions: vec![Condition {
            type_: "Accepted".into(),
            status: status.into(),
            reason: v.reason.clone(),
            message: v.message.clone(),
            last_transition_time: since.or_else(|| Some(now.to_string())),
        }],
    }
}

/// Whether `desired` must be written over what the object says.
pub(crate) fn needs_write(
    observed: Option<&SubscriberAccessPolicyStatus>,
    desired: &SubscriberAccessPolicyStatus,
) -> bool {
    let Some(o) = observed else { return true };
    o.observed_generation != desired.observed_generation
        || o.conditions.len() != desired.conditions.len()
        || o.conditions
            .iter()
            .zip(&desired.conditions)
            .any(|(x, y)| (&x.type_, &x.status, &x.reason, &x.message) != (&y.type_, &y.status, &y.reason, &y.message))
}

/// Follows the objects until shutdown.
pub(crate) async fn run(ctx: Arc<Context>, kubeconfig: Option<PathBuf>, shutdown: CancellationToken) {
    let client = tokio::select! {
        c = crate::watch_source::control_plane_client(kubeconfig) => c,
        _ = shutdown.cancelled() => return,
    };
    let api: kube::Api<SubscriberAccessPolicy> = kube::Api::all(client);
    let stream = fleetwatch_client::kube_watch::relisting_watcher(api.clone(), watcher::Config::default());
    futures_util::pin_mut!(stream);
    let mut current: BTreeMap<String, SubscriberAccessPolicy> = BTreeMap::new();
    let mut building: Option<BTreeMap<String, SubscriberAccessPolicy>> = None;
    let mut synced = false;
    let mut file_replaced = ctx.sessions.access.file_replaced();
    loop {
        let ev = tokio::select! {
            ev = stream.next() => match ev { Some(ev) => ev, None => return },
            // The file changed: the objects are judged again (duplicates with it), so no
            // object's status says Accepted while the file's grant is the one in force.
            Ok(()) = file_replaced.changed() => {
                if synced {
                    apply(&ctx, &api, &current).await;
                }
                continue;
            }
            _ = shutdown.cancelled() => return,
        };
        match ev {
            Ok(watcher::Event::Init) => {
                building = Some(BTreeMap::new());
                continue;
            }
            Ok(watcher::Event::InitApply(o)) => {
                if let Some(b) = building.as_mut() {
                    b.insert(o.metadata.name.clone().unwrap_or_default(), o);
                }
                continue;
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(b) = building.take() {
                    current = b;
                }
                synced = true;
            }
            Ok(watcher::Event::Apply(o)) => {
                current.insert(o.metadata.name.clone().unwrap_or_default(), o);
            }
            Ok(watcher::Event::Delete(o)) => {
                current.remove(&o.metadata.name.clone().unwrap_or_default());
            }
            Err(e) => {
                let e = format!("watching {} objects: {e}", access::KIND);
                tracing::warn!(error = %e, "cannot watch the subscriber access policy objects; the last good set stays in force (not ready; retrying)");
                ctx.sessions.access.objects_failed(e);
                continue;
            }
        }
        if !synced {
            continue;
        }
        apply(&ctx, &api, &current).await;
    }
}

async fn apply(
    ctx: &Context,
    api: &kube::Api<SubscriberAccessPolicy>,
    current: &BTreeMap<String, SubscriberAccessPolicy>,
) {
    let access = &ctx.sessions.access;
    let specs: BTreeMap<String, SubscriberAccessPolicySpec> =
        current.iter().map(|(n, o)| (n.clone(), o.spec.clone())).collect();
    let file = access.file_grants();
    let file_name = access.path().map(|p| p.display().to_string()).unwrap_or_default();
    let (accepted, verdicts) = access::judge_objects(file.as_deref(), &file_name, &specs, true);
    let refused = verdicts
        .iter()
        .filter(|(_, v)| !v.accepted)
        .map(|(name, v)| {
            let names =
                specs.get(name).map(|sp| sp.subscribers.iter().map(|g| g.name.clone()).collect()).unwrap_or_default();
            (name.clone(), (names, format!("{}: {}", v.reason, v.message)))
        })
        .collect();
    access.set_refused(refused);
    let count = accepted.len();
    if access.set_objects(accepted) {
        tracing::info!(accepted = count, objects = current.len(), "subscriber access policy objects in force");
        if count == 0 && access.path().is_none() {
            tracing::warn!(
                "no accepted {} object and no --access-policy file: every subscriber is refused",
                access::KIND
            );
        }
        ctx.close_ungranted();
    }
    let now = jiff::Timestamp::now();
    for (name, v) in &verdicts {
        let Some(obj) = current.get(name) else { continue };
        let want = desired(v, obj.metadata.generation, obj.status.as_ref(), now);
        if !needs_write(obj.status.as_ref(), &want) {
            continue;
        }
        // Once per verdict: with its status, not at every change of any object (every
        // object is judged again then).
        if !v.accepted {
            tracing::warn!(object = %name, reason = %v.reason, message = %v.message, "{} not used", access::KIND);
        }
        let patch = serde_json::json!({ "status": want });
        if let Err(e) = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(object = %name, error = %e, "cannot write the {}'s status (RBAC: subscriberaccesspolicies/status patch)", access::KIND);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_status_is_written_only_when_it_differs() {
        let now: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let bad = ObjectVerdict { accepted: false, reason: "Invalid".into(), message: "broken".into() };
        let want = desired(&bad, Some(2), None, now);
        assert!(needs_write(None, &want));
        assert!(!needs_write(Some(&want), &want));
        let c = &want.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str(), want.observed_generation), ("False", "Invalid", Some(2)));
        // A new generation is written even with the same verdict.
        let newer = desired(&bad, Some(3), Some(&want), "2030-01-02T00:00:00Z".parse().unwrap());
        assert!(needs_write(Some(&want), &newer));
        assert_eq!(newer.conditions[0].last_transition_time.as_deref(), Some("2030-01-01T00:00:00Z"));
        let ok = ObjectVerdict { accepted: true, reason: "Accepted".into(), message: "in force for: a".into() };
        assert!(needs_write(Some(&newer), &desired(&ok, Some(3), Some(&newer), now)));
    }
}
