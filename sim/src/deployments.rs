//! A stand-in for the Deployment controller and kubelets: no pods run in a simulated
//! cluster, so something must report Deployments as rolled out, as a cluster would.
//!
//! It writes what the real controller writes (`observedGeneration`, `replicas`,
//! `updatedReplicas`, `readyReplicas`, `availableReplicas`), `settle` after it first saw a
//! generation, so operators that wait for a rollout (like `kubectl rollout status`) can be
//! tested against a slow cluster too.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::json;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the controller looks at the Deployments.
const POLL: Duration = Duration::from_millis(50);

/// Marks every Deployment the client can list as rolled out `settle` after its current
/// generation first appeared, until `stop` is cancelled.
///
/// ```no_run
/// # async fn demo(sim: &fleetwatch_sim::SimCluster) -> Result<(), Box<dyn std::error::Error>> {
/// let stop = tokio_util::sync::CancellationToken::new();
/// let client = sim.client().await?;
/// tokio::spawn(fleetwatch_sim::roll_out_deployments(client, std::time::Duration::ZERO, stop.clone()));
/// # Ok(()) }
/// ```
pub async fn roll_out_deployments(client: kube::Client, settle: Duration, stop: CancellationToken) {
    let ar = ApiResource::erase::<Deployment>(&());
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    // (namespace, name, generation) -> when that generation was first seen.
    let mut seen: HashMap<(String, String, i64), Instant> = HashMap::new();
    while !stop.is_cancelled() {
        if let Ok(list) = all.list(&ListParams::default()).await {
            let mut current = HashMap::new();
            for d in list.items {
                let (Some(ns), Some(name)) = (d.metadata.namespace.clone(), d.metadata.name.clone()) else { continue };
                let generation = d.metadata.generation.unwrap_or(1);
                let key = (ns.clone(), name.clone(), generation);
                let first = *seen.entry(key.clone()).or_insert_with(Instant::now);
                current.insert(key, first);
                if rolled_out(&d, generation) || first.elapsed() < settle {
                    continue;
                }
                let want = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
                let status = json!({"status": {"observedGeneration": generation, "replicas": want,
                    "updatedReplicas": want, "readyReplicas": want, "availableReplicas": want}});
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
                // A failed write is retried on the next pass, as a controller would.
                let _ = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await;
            }
            seen = current;
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

fn rolled_out(d: &DynamicObject, generation: i64) -> bool {
    let want = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
    let s = &d.data["status"];
    s["observedGeneration"].as_i64() == Some(generation)
        && s["updatedReplicas"].as_i64() == Some(want)
        && s["readyReplicas"].as_i64() == Some(want)
}
