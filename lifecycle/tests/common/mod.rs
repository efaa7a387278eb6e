//! Set-up shared by the lifecycle tests: a simulated control plane serving every CRD the
//! operator needs (it waits for all of them before it starts).

use fleetwatch_api::maintenance::MaintenancePolicy;
use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate, Runtime};
use fleetwatch_lifecycle::applier::Applier;
use kube::CustomResourceExt;

/// A sim control plane with the CRDs installed: the cluster, a client and an applier.
pub async fn control_plane() -> (fleetwatch_sim::SimCluster, kube::Client, Applier) {
    let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
    let client = sim.client().await.unwrap();
    let cp = Applier::new(client.clone());
    // The tests' runtime clusters are this one too; its Deployments roll out as a cluster's would.
    tokio::spawn(fleetwatch_sim::roll_out_deployments(
        client.clone(),
        std::time::Duration::ZERO,
        tokio_util::sync::CancellationToken::new(),
    ));
    for crd in [Runtime::crd(), ModuleTemplate::crd(), ModuleReleaseMeta::crd(), MaintenancePolicy::crd()] {
        // The sim establishes a CRD as it stores it: its kinds are served at once.
        cp.apply(&serde_json::to_value(&crd).unwrap()).await.unwrap();
    }
    (sim, client, cp)
}

/// The ModuleReleaseMeta of the tests' module `m`: its `regular` channel at `version`.
// Each test binary compiles this module; not all of them use every helper.
#[allow(dead_code)]
pub fn release_meta(version: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
        "metadata": {"name": "m", "namespace": "default"},
        "spec": {"moduleName": "m", "channels": [{"channel": "regular", "version": version}]}})
}

/// Makes the operator reconcile every Runtime in `default` once more and waits until, for
/// each, a reconcile that saw the change has written its status (`observedGeneration`):
/// what a check that something does *not* happen waits for instead of a fixed time. The
/// change is `channel: regular`, the default, so nothing that matters changes; only spec
/// changes start a reconcile (the operator filters metadata and status changes).
// Each test binary compiles this module; not all of them use every helper.
#[allow(dead_code)]
pub async fn reconciled_again(client: &kube::Client) {
    let runtimes: kube::Api<Runtime> = kube::Api::namespaced(client.clone(), "default");
    for rt in runtimes.list(&Default::default()).await.unwrap().items {
        let channel = if rt.spec.channel.is_some() { serde_json::Value::Null } else { "regular".into() };
        let patch = serde_json::json!({"spec": {"channel": channel}});
        let name = kube::ResourceExt::name_any(&rt);
        runtimes.patch(&name, &Default::default(), &kube::api::Patch::Merge(&patch)).await.unwrap();
    }
    fleetwatch_test_support::eventually("every Runtime reconciled at its new generation")
        .until(
            async || {
                let list = runtimes.list(&Default::default()).await.unwrap().items;
                list.iter()
                    .filter(|r| r.status.as_ref().and_then(|s| s.observed_generation) < r.metadata.generation)
                    .map(kube::ResourceExt::name_any)
                    .collect::<Vec<_>>()
            },
            |behind| behind.is_empty(),
        )
        .await;
}

/// How many Runtimes in `default` run module `m` (their first) at `version`, Ready.
// Each test binary compiles this module; not all of them use every helper.
#[allow(dead_code)]
pub async fn ready_on(client: &kube::Client, version: &str) -> usize {
    let runtimes: kube::Api<Runtime> = kube::Api::namespaced(client.clone(), "default");
    runtimes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .iter()
        .filter(|r| {
            r.status.as_ref().and_then(|s| s.modules.first()).is_some_and(|m| {
                m.state == fleetwatch_api::State::Ready && m.installed_version.as_deref() == Some(version)
            })
        })
        .count()
}
