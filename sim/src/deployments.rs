//! A stand-in for the Deployment and StatefulSet controllers and kubelets: no pods run in a
//! simulated cluster, so something must report them as rolled out, as a cluster would.
//!
//! It writes what the real controllers write, `settle` after it first saw a generation, so
//! operators that wait for a rollout (like `kubectl rollout status`) can be tested against a
//! slow cluster too: for a Deployment `observedGeneration`, `replicas`, `updatedReplicas`,
//! `readyReplicas`, `availableReplicas`; for a StatefulSet also `currentReplicas`,
//! `updateRevision` and `currentRevision` (named `NAME-HASH` after the pod template as the
//! StatefulSet controller names its ControllerRevisions; equal once rolled out) and
//! `collisionCount`.

use std::collections::HashMap;
use std::time::Duration;

use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use kube::api::{Api, DynamicObject, ListParams, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often the controller looks at the Deployments.
const POLL: Duration = Duration::from_millis(50);

/// Marks every Deployment and StatefulSet the client can list as rolled out `settle` after
/// its current generation first appeared, until `stop` is cancelled.
///
/// ```no_run
/// # async fn demo(sim: &fleetwatch_sim::SimCluster) -> Result<(), Box<dyn std::error::Error>> {
/// let stop = tokio_util::sync::CancellationToken::new();
/// let client = sim.client().await?;
/// tokio::spawn(fleetwatch_sim::roll_out_deployments(client, std::time::Duration::ZERO, stop.clone()));
/// # Ok(()) }
/// ```
pub async fn roll_out_deployments(client: kube::Client, settle: Duration, stop: CancellationToken) {
    let kinds = [
        (Kind::Deployment, ApiResource::erase::<Deployment>(&())),
        (Kind::StatefulSet, ApiResource::erase::<StatefulSet>(&())),
    ];
    // (kind, namespace, name, generation) -> when that generation was first seen.
    let mut seen: HashMap<(Kind, String, String, i64), Instant> = HashMap::new();
    while !stop.is_cancelled() {
        let mut current = HashMap::new();
        for (kind, ar) in &kinds {
            let all: Api<DynamicObject> = Api::all_with(client.clone(), ar);
            let Ok(list) = all.list(&ListParams::default()).await else {
                // Unreadable this pass: keep what was seen, so settling does not restart.
                current.extend(seen.iter().filter(|(k, _)| k.0 == *kind).map(|(k, v)| (k.clone(), *v)));
                continue;
            };
            for d in list.items {
                let (Some(ns), Some(name)) = (d.metadata.namespace.clone(), d.metadata.name.clone()) else { continue };
                let generation = d.metadata.generation.unwrap_or(1);
                let key = (*kind, ns.clone(), name.clone(), generation);
                let first = *seen.entry(key.clone()).or_insert_with(Instant::now);
                current.insert(key, first);
                let status = kind.status(&name, &d, generation);
                if rolled_out(&d, &status) || first.elapsed() < settle {
                    continue;
                }
                let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, ar);
                // A failed write is retried on the next pass, as a controller would.
                let _ =
                    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&json!({"status": status}))).await;
            }
        }
        seen = current;
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(POLL) => {}
        }
    }
}

/// The kinds rolled out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Kind {
    Deployment,
    StatefulSet,
}

impl Kind {
    /// The status the controller writes once `generation` is rolled out.
    fn status(self, name: &str, d: &DynamicObject, generation: i64) -> Value {
        let want = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
        match self {
            Kind::Deployment => json!({"observedGeneration": generation, "replicas": want,
                "updatedReplicas": want, "readyReplicas": want, "availableReplicas": want}),
            Kind::StatefulSet => {
                let revision = revision_name(name, &d.data["spec"]["template"]);
                json!({"observedGeneration": generation, "replicas": want, "readyReplicas": want,
                    "currentReplicas": want, "updatedReplicas": want, "availableReplicas": want,
                    "currentRevision": revision, "updateRevision": revision, "collisionCount": 0})
            }
        }
    }
}

/// `NAME-HASH`, shaped like the StatefulSet controller's ControllerRevision name: HASH is a
/// 32-bit hash of the pod template (the low half of its FNV-1a; the controller hashes its
/// Go rendering, which nothing outside can reproduce anyway), its decimal digits spelled in
/// the alphabet of `k8s.io/apimachinery/pkg/util/rand.SafeEncodeString`. A changed template
/// is a new revision.
fn revision_name(name: &str, template: &Value) -> String {
    use std::hash::Hasher;
    const ALPHANUMS: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    let mut h = fnv::FnvHasher::default();
    h.write(serde_json::to_string(template).unwrap_or_default().as_bytes());
    let hash = (h.finish() as u32).to_string();
    let encoded: String = hash.bytes().map(|b| ALPHANUMS[usize::from(b) % ALPHANUMS.len()] as char).collect();
    format!("{name}-{encoded}")
}

/// Whether `d`'s status already says what `want` says.
fn rolled_out(d: &DynamicObject, want: &Value) -> bool {
    let s = &d.data["status"];
    want.as_object().is_some_and(|w| w.iter().all(|(k, v)| &s[k] == v))
}
