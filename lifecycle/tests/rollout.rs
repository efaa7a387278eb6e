//! Paced rollouts over ten simulated runtime clusters: waves within the limits, progress in
//! the ModuleReleaseMeta status, a halt when upgrades fail, and a new operator instance
//! continuing a rollout from that status.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use std::time::Duration;

use fleetwatch_test_support::eventually;

use fleetwatch_api::{ModuleReleaseMeta, Runtime};
use kube::Api;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::json;

const N: usize = 10;

fn template(version: &str, broken: bool) -> serde_json::Value {
    let mut manifest = vec![json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "m-manager", "namespace": "default", "labels": {"app.kubernetes.io/version": version}},
        "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "m"}}, "template": {"metadata": {"labels": {"app": "m", "app.kubernetes.io/version": version}}, "spec": {"containers": [{"name": "c", "image": "m"}]}}}})];
    if broken {
        manifest
            .insert(0, json!({"apiVersion": "nowhere.example.com/v1", "kind": "Missing", "metadata": {"name": "x"}}));
    }
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("m-{version}"), "namespace": "default"},
        "spec": {"moduleName": "m", "version": version, "manifest": manifest,
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "m-manager"}}})
}

fn meta(version: &str) -> serde_json::Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta", "metadata": {"name": "m", "namespace": "default"},
        "spec": {"moduleName": "m", "channels": [{"channel": "regular", "version": version}],
                 "rollout": {"maxInFlight": 2, "stepPercent": 30, "maxFailureRatio": 0.3}}})
}

/// A slow cluster: Deployments roll out `delay` after each change of their spec.
fn slow_kubelet(client: kube::Client, delay: Duration) -> impl std::future::Future<Output = ()> {
    fleetwatch_sim::roll_out_deployments(client, delay, tokio_util::sync::CancellationToken::new())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn channel_moves_roll_out_in_waves_and_halt_on_failures() {
    let (_cp_sim, cp_client, cp) = common::control_plane().await;
    for (v, broken) in [("1.0.0", false), ("2.0.0", false), ("3.0.0", true)] {
        cp.apply(&template(v, broken)).await.unwrap();
    }
    cp.apply(&meta("1.0.0")).await.unwrap();
    let mut sims = Vec::new();
    for i in 0..N {
        let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
        tokio::spawn(slow_kubelet(sim.client().await.unwrap(), Duration::from_millis(200)));
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "stringData": {"config": sim.kubeconfig_yaml()}}),
        )
        .await
        .unwrap();
        cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "spec": {"kubeconfigSecret": {"name": format!("r{i}")}, "modules": [{"name": "m"}]}})).await.unwrap();
        sims.push(sim);
    }
    let stop = tokio_util::sync::CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        client: cp_client.clone(),
        hub: None,
        resync: None,
        concurrency: 8,
        migrations: Default::default(),
        ..fleetwatch_lifecycle::LifecycleConfig::new(cp_client.clone())
    };
    tokio::spawn(fleetwatch_lifecycle::run(config, Default::default(), stop.clone()));
    let runtimes: Api<Runtime> = Api::namespaced(cp_client.clone(), "default");
    let metas: Api<ModuleReleaseMeta> = Api::namespaced(cp_client.clone(), "default");
    eventually("the initial install to converge")
        .until(async || common::ready_on(&cp_client, "1.0.0").await, |n| *n >= N)
        .await;

    // The channel moves to 2.0.0: waves of 3 (30 % of 10), at most 2 in flight (checked at
    // every look).
    cp.apply(&meta("2.0.0")).await.unwrap();
    let mut seen_partial = false;
    let rollout_of = async |version: &str| {
        let st = metas.get("m").await.unwrap().status.unwrap_or_default();
        st.rollouts.into_iter().find(|r| r.version == version)
    };
    let done = eventually("the rollout of 2.0.0 to complete")
        .every(Duration::from_millis(20))
        .until(
            async || rollout_of("2.0.0").await,
            |r| {
                let Some(r) = r else { return false };
                assert!(r.admitted - r.upgraded - r.failed <= 2, "more than maxInFlight at once: {r:?}");
                seen_partial |= r.upgraded > 0 && r.upgraded < N as u32;
                r.phase == "Complete"
            },
        )
        .await
        .expect("until returns only what satisfies the condition");
    assert_eq!((done.upgraded, done.failed, done.total), (N as u32, 0, N as u32));
    assert!(done.wave >= 4, "10 runtimes in waves of 3 take 4 waves: {done:?}");
    assert!(seen_partial, "the rollout went all at once");
    assert_eq!(common::ready_on(&cp_client, "2.0.0").await, N);

    // 3.0.0 is broken: the first upgrades fail and the rollout halts; the rest stay on 2.0.0.
    cp.apply(&meta("3.0.0")).await.unwrap();
    let halted = eventually("the rollout of a broken version to halt")
        .until(async || rollout_of("3.0.0").await, |r| r.as_ref().is_some_and(|r| r.phase == "Halted"))
        .await
        .expect("until returns only what satisfies the condition");
    assert!(halted.failed >= 1 && halted.admitted <= 3, "{halted:?}");
    // (runtimes on 2.0.0 saying the rollout halted, runtimes on 3.0.0, every message)
    let outcome = async || {
        let list = runtimes.list(&Default::default()).await.unwrap().items;
        let first = |r: &Runtime| r.status.as_ref().and_then(|s| s.modules.first()).cloned();
        let on = |v: &str| list.iter().filter_map(first).filter(|m| m.actual_version.as_deref() == Some(v)).count();
        let untouched = list
            .iter()
            .filter_map(first)
            .filter(|m| m.actual_version.as_deref() == Some("2.0.0") && m.message.contains("halted"))
            .count();
        (untouched, on("3.0.0"), list.iter().filter_map(first).map(|m| m.message).collect::<Vec<_>>())
    };
    // Every runtime not admitted is reconciled once more after the halt and then says so.
    let (_, upgraded, _) = eventually("runtimes not admitted to keep 2.0.0 and say the rollout halted")
        .until(outcome, |(untouched, _, _)| *untouched >= N - 3)
        .await;
    assert_eq!(upgraded, 0, "a broken version must never become the actual version");
    // And stay so: a later reconcile of every runtime (one that started after the halt was
    // reported) neither admits one more nor makes the broken version the actual one.
    common::reconciled_again(&cp_client).await;
    let (untouched, upgraded, messages) = outcome().await;
    assert_eq!(upgraded, 0, "a broken version became the actual version on a later reconcile: {messages:?}");
    assert!(untouched >= N - 3, "the halt was forgotten on a later reconcile: {untouched} of {N}: {messages:?}");
    stop.cancel();
    drop(sims);
}

/// Whether the runtime cluster runs `version` of the module's manager but not ready yet:
/// an upgrade in flight, as the cluster itself shows it.
async fn upgrading(client: &kube::Client, version: &str) -> bool {
    let ar = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let Ok(Some(d)) = api.get_opt("m-manager").await else { return false };
    let labelled = d.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/version")).map(String::as_str);
    labelled == Some(version) && d.data["status"]["observedGeneration"].as_i64() != d.metadata.generation
}

fn start_operator(client: &kube::Client) -> (tokio_util::sync::CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = tokio_util::sync::CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        resync: None,
        concurrency: 8,
        migrations: Default::default(),
        ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
    };
    (stop.clone(), tokio::spawn(fleetwatch_lifecycle::run(config, Default::default(), stop)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_instance_continues_a_rollout_where_the_last_one_stopped() {
    let (_cp_sim, cp_client, cp) = common::control_plane().await;
    for v in ["1.0.0", "2.0.0"] {
        cp.apply(&template(v, false)).await.unwrap();
    }
    cp.apply(&meta("1.0.0")).await.unwrap();
    let mut sims = Vec::new();
    let mut clients = Vec::new();
    for i in 0..N {
        let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
        let client = sim.client().await.unwrap();
        // Slow enough that the operator can be stopped with the rollout halfway.
        tokio::spawn(slow_kubelet(client.clone(), Duration::from_millis(800)));
        clients.push(client);
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "stringData": {"config": sim.kubeconfig_yaml()}}),
        )
        .await
        .unwrap();
        cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "spec": {"kubeconfigSecret": {"name": format!("r{i}")}, "modules": [{"name": "m"}]}})).await.unwrap();
        sims.push(sim);
    }
    let metas: Api<ModuleReleaseMeta> = Api::namespaced(cp_client.clone(), "default");
    let rollout = || {
        let metas = metas.clone();
        async move {
            metas.get("m").await.unwrap().status.unwrap_or_default().rollouts.into_iter().find(|r| r.version == "2.0.0")
        }
    };
    let (stop, first) = start_operator(&cp_client);
    eventually("the initial install to converge")
        .until(async || common::ready_on(&cp_client, "1.0.0").await, |n| *n >= N)
        .await;

    // The channel moves; the first instance stops once the second wave is under way.
    cp.apply(&meta("2.0.0")).await.unwrap();
    eventually("the rollout to reach its second wave")
        .every(Duration::from_millis(20))
        .until(rollout, |r| r.as_ref().is_some_and(|r| r.wave >= 2 && r.upgraded >= 3))
        .await;
    stop.cancel();
    first.await.unwrap();
    let before = rollout().await.expect("the rollout's status");
    assert!(before.upgraded < N as u32, "the rollout finished before the operator stopped: {before:?}");
    assert_eq!(before.admitted_runtimes.len() as u32, before.admitted, "{before:?}");

    // A new instance, with nothing in memory, continues from the status.
    let (stop, second) = start_operator(&cp_client);
    // Checked at every look: never more than maxInFlight upgrading, no progress lost.
    let r = eventually("the rollout to complete after the restart")
        .within(Duration::from_secs(90))
        .every(Duration::from_millis(20))
        .until(
            async || {
                let mut in_flight = 0;
                for c in &clients {
                    in_flight += usize::from(upgrading(c, "2.0.0").await);
                }
                (in_flight, rollout().await.expect("the rollout's status"))
            },
            |(in_flight, r)| {
                assert!(*in_flight <= 2, "{in_flight} runtimes upgrading at once, more than maxInFlight");
                assert!(r.wave >= before.wave, "the rollout went back to wave {} from {}: {r:?}", r.wave, before.wave);
                assert!(
                    r.upgraded >= before.upgraded && r.admitted >= before.admitted,
                    "progress lost: {before:?} -> {r:?}"
                );
                assert!(r.admitted - r.upgraded - r.failed <= 2, "more than maxInFlight admitted: {r:?}");
                r.phase == "Complete"
            },
        )
        .await
        .1;
    assert_eq!((r.upgraded, r.failed, r.total), (N as u32, 0, N as u32), "{r:?}");
    assert!(r.wave >= 4, "10 runtimes in waves of 3 take 4 waves: {r:?}");
    assert_eq!(common::ready_on(&cp_client, "2.0.0").await, N);
    stop.cancel();
    second.await.unwrap();
    drop(sims);
}
