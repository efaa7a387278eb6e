//! Rule 3 with a test-controlled clock: a downtime upgrade waits for its runtime's
//! maintenance window (lifecycle-manager policy format), the current version's drift is
//! repaired meanwhile, and the upgrade happens once the clock is inside a window with
//! enough time left.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use fleetwatch_test_support::eventually;
use std::sync::Arc;

use fleetwatch_api::{ModuleStatus, Runtime, State};
use fleetwatch_lifecycle::maintenance::ManualClock;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::json;

fn template(version: &str) -> serde_json::Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("m-{version}"), "namespace": "default"},
        "spec": {"moduleName": "m", "version": version, "requiresDowntime": version != "1.0.0",
            "manifest": [{"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "m-manager", "namespace": "default", "labels": {"app.kubernetes.io/version": version}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "m"}},
                         "template": {"metadata": {"labels": {"app": "m"}}, "spec": {"containers": [{"name": "c", "image": format!("m:{version}")}]}}}}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "m-manager"}}})
}

/// A running operator and what the tests drive it with.
struct Started {
    _sim: fleetwatch_sim::SimCluster,
    client: kube::Client,
    cp: fleetwatch_lifecycle::applier::Applier,
    clock: Arc<ManualClock>,
    stop: tokio_util::sync::CancellationToken,
}

/// A control plane with `m` 1.0.0 and 2.0.0 (2.0.0 needs downtime), its regular channel at
/// 1.0.0, `objects` applied, and the operator running on a manual clock set to a Friday.
async fn start(objects: &[serde_json::Value]) -> Started {
    let (_sim, client, cp) = common::control_plane().await;
    cp.apply(&template("1.0.0")).await.unwrap();
    cp.apply(&template("2.0.0")).await.unwrap();
    cp.apply(&common::release_meta("1.0.0")).await.unwrap();
    for o in objects {
        cp.apply(o).await.unwrap();
    }
    let clock = Arc::new(ManualClock::new("2026-11-20T10:00:00Z".parse().unwrap())); // a Friday
    let stop = tokio_util::sync::CancellationToken::new();
    let mut config = fleetwatch_lifecycle::LifecycleConfig::new(client.clone());
    config.clock = clock.clone();
    config.resync = None;
    tokio::spawn(fleetwatch_lifecycle::run(config, Default::default(), stop.clone()));
    Started { _sim, client, cp, clock, stop }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downtime_upgrade_waits_for_the_window_and_repairs_drift_meanwhile() {
    // A lifecycle-manager format policy: trial runtimes on Saturday night, others Sunday.
    let policy = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "default", "namespace": "default"},
        "spec": {"rules": [{"match": {"plan": "trial"}, "windows": [{"days": ["Sat"], "begin": "02:00:00+00:00", "end": "04:00:00+00:00"}]}],
                 "default": {"days": ["Sun"], "begin": "01:00:00+00:00", "end": "05:00:00+00:00"}}});
    let Started { _sim, client, cp, clock, stop } = start(&[policy]).await;
    let meta = common::release_meta;
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "r", "namespace": "default", "labels": {"operator.fleetwatch.dev/plan": "trial"}},
        "spec": {"modules": [{"name": "m"}]}}))
        .await
        .unwrap();

    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), "default");
    let module = |rt: &Runtime| rt.status.as_ref().and_then(|s| s.modules.first().cloned());
    let wait = |what: &'static str, cond: Box<dyn Fn(&ModuleStatus) -> bool + Send>| {
        let runtimes = runtimes.clone();
        async move {
            let status = eventually(what)
                .until(
                    async || runtimes.get("r").await.ok().and_then(|r| r.status),
                    |st| st.as_ref().and_then(|s| s.modules.first()).is_some_and(&cond),
                )
                .await;
            status.and_then(|s| s.modules.into_iter().next()).expect("until returns only what satisfies the condition")
        }
    };
    // The install itself is not gated.
    wait("1.0.0", Box::new(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))).await;

    // 2.0.0 needs downtime: it waits for Saturday 02:00.
    cp.apply(&meta("2.0.0")).await.unwrap();
    let m = wait("waiting", Box::new(|m| m.message.contains("waits for the maintenance window"))).await;
    assert_eq!(m.next_maintenance_window.as_deref(), Some("2026-11-21T02:00:00Z/2026-11-21T04:00:00Z"), "{m:#?}");
    assert_eq!(m.actual_version.as_deref(), Some("1.0.0"));

    // Drift of the current version is repaired while waiting.
    let deps: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "default",
        &ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&()),
    );
    deps.patch("m-manager", &PatchParams::apply("intruder").force(), &Patch::Apply(&json!({"apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "m-manager"}, "spec": {"template": {"spec": {"containers": [{"name": "c", "image": "evil:latest"}]}}}}))).await.unwrap();
    eventually("the drift to be repaired")
        .until(
            async || deps.get("m-manager").await.unwrap().data["spec"].clone(),
            |spec| spec["template"]["spec"]["containers"][0]["image"] == "m:1.0.0",
        )
        .await;

    // Inside the window but with only 10 minutes left (< 20): still waiting, for next week.
    clock.set("2026-11-21T03:50:00Z".parse().unwrap());
    wait(
        "next week's window",
        Box::new(|m| m.next_maintenance_window.as_deref() == Some("2026-11-28T02:00:00Z/2026-11-28T04:00:00Z")),
    )
    .await;
    assert_eq!(module(&runtimes.get("r").await.unwrap()).unwrap().installed_version.as_deref(), Some("1.0.0"));

    // The clock enters next week's window: the upgrade happens.
    clock.set("2026-11-28T02:30:00Z".parse().unwrap());
    let m = wait(
        "upgrade in the window",
        Box::new(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("2.0.0")),
    )
    .await;
    assert_eq!(m.next_maintenance_window, None);
    stop.cancel();
}

/// Rule 5's "fails closed": a runtime naming a maintenance policy that does not exist, or
/// one that is invalid, gets no downtime upgrade; the module says why as a Warning, the
/// Runtime's Ready condition names it, and fixing the policy lets the rule work again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_invalid_policy_holds_downtime_upgrades() {
    let Started { _sim, client, cp, clock, stop } = start(&[]).await;
    let meta = common::release_meta;
    // The runtime names a policy that does not exist (a typo of "nightly").
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "r", "namespace": "default"},
        "spec": {"maintenancePolicy": "nightyl", "modules": [{"name": "m"}]}}))
        .await
        .unwrap();
    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), "default");
    let wait = |what: &'static str, cond: Box<dyn Fn(&Runtime) -> bool + Send>| {
        let runtimes = runtimes.clone();
        async move {
            eventually(what)
                .until(async || runtimes.get("r").await.ok(), |rt| rt.as_ref().is_some_and(&cond))
                .await
                .expect("until returns only what satisfies the condition")
        }
    };
    let module = |rt: &Runtime| rt.status.as_ref().and_then(|s| s.modules.first().cloned());
    wait("1.0.0 installed", Box::new(move |rt| module(rt).is_some_and(|m| m.state == State::Ready))).await;

    cp.apply(&meta("2.0.0")).await.unwrap();
    let rt = wait(
        "held by the missing policy",
        Box::new(move |rt| {
            module(rt).is_some_and(|m| {
                m.state == State::Warning && m.message.contains("maintenance policy default/nightyl not found")
            })
        }),
    )
    .await;
    let m = module(&rt).unwrap();
    assert_eq!(m.installed_version.as_deref(), Some("1.0.0"), "{m:#?}");
    let ready = rt.status.as_ref().unwrap().conditions.iter().find(|c| c.type_ == "Ready").unwrap().clone();
    assert_eq!(ready.status, "False");
    assert!(ready.message.contains("nightyl not found"), "{ready:?}");

    // The policy exists but is invalid: still held, with what is wrong.
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "nightyl", "namespace": "default"},
        "spec": {"default": {"days": ["Sat"], "begin": "25:00:00+00:00", "end": "04:00:00+00:00"}}})).await.unwrap();
    wait(
        "held by the invalid policy",
        Box::new(move |rt| {
            module(rt).is_some_and(|m| {
                m.state == State::Warning && m.message.contains("maintenance policy default/nightyl is invalid")
            })
        }),
    )
    .await;
    // Fixed: the module waits for the window like any other, and upgrades inside it.
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy", "metadata": {"name": "nightyl", "namespace": "default"},
        "spec": {"default": {"days": ["Sat"], "begin": "02:00:00+00:00", "end": "04:00:00+00:00"}}})).await.unwrap();
    wait(
        "waiting for the window",
        Box::new(move |rt| {
            module(rt)
                .is_some_and(|m| m.state == State::Ready && m.message.contains("waits for the maintenance window"))
        }),
    )
    .await;
    clock.set("2026-11-21T02:30:00Z".parse().unwrap());
    wait(
        "upgraded in the window",
        Box::new(move |rt| module(rt).is_some_and(|m| m.installed_version.as_deref() == Some("2.0.0"))),
    )
    .await;
    stop.cancel();
}

/// Without any maintenance policy (none named, no `default`) a downtime upgrade is held:
/// no window known never means "upgrade now".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_policy_at_all_holds_downtime_upgrades() {
    let Started { _sim, client, cp, clock: _clock, stop } = start(&[]).await;
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "r", "namespace": "default"}, "spec": {"modules": [{"name": "m"}]}}))
        .await
        .unwrap();
    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), "default");
    let wait = |what: &'static str, cond: Box<dyn Fn(&ModuleStatus) -> bool + Send>| {
        let runtimes = runtimes.clone();
        async move {
            let status = eventually(what)
                .until(
                    async || runtimes.get("r").await.ok().and_then(|r| r.status),
                    |st| st.as_ref().and_then(|s| s.modules.first()).is_some_and(&cond),
                )
                .await;
            status.and_then(|s| s.modules.into_iter().next()).expect("until returns only what satisfies the condition")
        }
    };
    wait("1.0.0", Box::new(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))).await;
    cp.apply(&common::release_meta("2.0.0")).await.unwrap();
    let m = wait(
        "held",
        Box::new(|m| m.state == State::Warning && m.message.contains("no maintenance window is configured")),
    )
    .await;
    assert_eq!(m.installed_version.as_deref(), Some("1.0.0"), "{m:#?}");
    stop.cancel();
}
