//! Migrations against a simulated cluster: order, cost when not needed, the built-in
//! rename (idempotent), and a failing migration stopping an upgrade until it succeeds.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use fleetwatch_test_support::eventually;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use fleetwatch_api::{ResourceRef, Runtime, State};
use fleetwatch_lifecycle::applier::Applier;
use fleetwatch_lifecycle::migration::{
    BoxFuture, Migration, MigrationContext, MigrationError, Phase, Registry, RenameResource, Scope,
};
use kube::Api;
use semver::Version;
use serde_json::json;

struct Recorder {
    name: &'static str,
    scope: Scope,
    phase: Phase,
    needed: bool,
    log: Arc<Mutex<Vec<String>>>,
    fail_times: Arc<AtomicU32>,
}

impl Migration for Recorder {
    fn name(&self) -> &str {
        self.name
    }
    fn scope(&self) -> Scope {
        self.scope.clone()
    }
    fn phase(&self) -> Phase {
        self.phase
    }
    fn removable_after(&self) -> Version {
        Version::new(9, 0, 0)
    }
    fn needed<'a>(&'a self, _cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<bool, MigrationError>> {
        Box::pin(async move { Ok(self.needed) })
    }
    fn run<'a>(&'a self, _cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<(), MigrationError>> {
        Box::pin(async move {
            if self.fail_times.load(Ordering::SeqCst) > 0 {
                self.fail_times.fetch_sub(1, Ordering::SeqCst);
                return Err(MigrationError::NotPossible(format!("{} is not possible yet", self.name)));
            }
            self.log.lock().unwrap().push(self.name.to_string());
            Ok(())
        })
    }
}

fn rec(name: &'static str, scope: Scope, phase: Phase, log: &Arc<Mutex<Vec<String>>>) -> Recorder {
    Recorder { name, scope, phase, needed: true, log: log.clone(), fail_times: Arc::new(AtomicU32::new(0)) }
}

async fn cluster() -> (fleetwatch_sim::SimCluster, Applier) {
    let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
    let client = sim.client().await.unwrap();
    (sim, Applier::new(client))
}

#[tokio::test]
async fn order_is_generic_pre_module_pre_then_module_post_generic_post() {
    let (_sim, applier) = cluster().await;
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut skipped = rec("not-needed", Scope::Generic, Phase::Pre, &log);
    skipped.needed = false;
    let registry = Registry::new()
        .register(rec("m-post", Scope::Module("m".into()), Phase::Post, &log))
        .register(rec("m-pre", Scope::Module("m".into()), Phase::Pre, &log))
        .register(rec("generic-post", Scope::Generic, Phase::Post, &log))
        .register(rec("other-pre", Scope::Module("other".into()), Phase::Pre, &log))
        .register(skipped)
        .register(rec("generic-pre", Scope::Generic, Phase::Pre, &log));
    let to = Version::new(2, 0, 0);
    let cx = MigrationContext { cluster: &applier, module: "m", from: None, to: &to, metrics: None };
    let pre = registry.pre(&cx).await.unwrap();
    log.lock().unwrap().push("apply".into());
    registry.post(&cx).await.unwrap();
    assert_eq!(*log.lock().unwrap(), ["generic-pre", "m-pre", "apply", "m-post", "generic-post"]);
    assert!(pre.iter().any(|r| r.name == "not-needed" && !r.ran));
}

#[tokio::test]
async fn rename_copies_then_deletes_and_is_idempotent() {
    let (_sim, applier) = cluster().await;
    applier
        .apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "redis-system"}}))
        .await
        .unwrap();
    applier
        .apply(&json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "redis-settings", "namespace": "redis-system"}, "data": {"maxmemory": "2gb"}}))
        .await
        .unwrap();
    let registry = Registry::builtin();
    let old = Version::new(1, 0, 0);
    let to = Version::new(1, 5, 0);
    let cx = MigrationContext { cluster: &applier, module: "redis", from: Some(&old), to: &to, metrics: None };
    let ran = registry.pre(&cx).await.unwrap();
    assert!(ran.iter().all(|r| !r.ran), "an upgrade below 2.0.0 must not rename: {ran:?}");
    let to = Version::new(2, 0, 0);
    let cx = MigrationContext { cluster: &applier, module: "redis", from: Some(&old), to: &to, metrics: None };
    let ran = registry.pre(&cx).await.unwrap();
    assert!(ran.iter().any(|r| r.name == "redis-settings-renamed" && r.ran));
    let cm = |name: &str| ResourceRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some("redis-system".into()),
        name: name.into(),
    };
    let new = applier.get(&cm("redis-config")).await.unwrap().expect("copied");
    assert_eq!(new.data["data"]["maxmemory"], "2gb");
    assert!(applier.get(&cm("redis-settings")).await.unwrap().is_none(), "old name deleted");
    // Twice: nothing left to do.
    let again = registry.pre(&cx).await.unwrap();
    assert!(again.iter().all(|r| !r.ran), "{again:?}");
    // A module with a different name is untouched by the redis rename.
    let cx = MigrationContext { cluster: &applier, module: "nats", from: None, to: &to, metrics: None };
    assert!(registry.pre(&cx).await.unwrap().is_empty());
    let _ = RenameResource {
        name: String::new(),
        module: String::new(),
        since: to.clone(),
        removable_after: to.clone(),
        from: cm("x"),
        to_name: String::new(),
    };
}

fn template(version: &str) -> serde_json::Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("m-{version}"), "namespace": "default"},
        "spec": {"moduleName": "m", "version": version,
            "manifest": [{"apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {"name": "m-manager", "namespace": "default", "labels": {"app.kubernetes.io/version": version}},
                "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "m"}}, "template": {"metadata": {"labels": {"app": "m"}}, "spec": {"containers": [{"name": "c", "image": "m"}]}}}}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "m-manager"}}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_migration_stops_the_upgrade_and_is_retried_with_backoff() {
    let (_sim, client, cp) = common::control_plane().await;
    cp.apply(&template("1.0.0")).await.unwrap();
    cp.apply(&template("2.0.0")).await.unwrap();
    let meta = common::release_meta;
    cp.apply(&meta("1.0.0")).await.unwrap();
    let log = Arc::new(Mutex::new(Vec::new()));
    let mut flaky = rec("flaky", Scope::Module("m".into()), Phase::Pre, &log);
    let fails = flaky.fail_times.clone();
    flaky.needed = true;
    let metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        client: client.clone(),
        hub: None,
        resync: None,
        concurrency: 2,
        migrations: Registry::new().register(flaky),
        ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
    };
    tokio::spawn(fleetwatch_lifecycle::run(config, metrics.clone(), stop.clone()));
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime", "metadata": {"name": "r", "namespace": "default"},
        "spec": {"modules": [{"name": "m"}]}})).await.unwrap();
    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), "default");
    let module = |rt: &Runtime| rt.status.as_ref().and_then(|s| s.modules.first().cloned());
    let wait = |what: &'static str, cond: Box<dyn Fn(&Runtime) -> bool + Send>| {
        let runtimes = runtimes.clone();
        async move {
            eventually(what)
                .until(async || runtimes.get("r").await.ok(), |rt| rt.as_ref().is_some_and(&cond))
                .await
                .expect("until returns only what satisfies the condition")
        }
    };
    wait(
        "1.0.0 Ready",
        Box::new(move |rt| {
            module(rt).is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))
        }),
    )
    .await;
    // Now the migration fails twice: the upgrade stops with a clear status, then goes through.
    fails.store(2, Ordering::SeqCst);
    cp.apply(&meta("2.0.0")).await.unwrap();
    let stuck = wait("stopped upgrade", Box::new(move |rt| module(rt).is_some_and(|m| m.state == State::Error))).await;
    let m = module(&stuck).unwrap();
    assert!(
        m.message.contains("upgrade of m to 2.0.0 stopped") && m.message.contains("flaky is not possible yet"),
        "{}",
        m.message
    );
    assert_eq!(m.actual_version.as_deref(), Some("1.0.0"), "nothing applied while the migration fails");
    wait(
        "upgrade after retries",
        Box::new(move |rt| {
            module(rt).is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("2.0.0"))
        }),
    )
    .await;
    assert_eq!(fails.load(Ordering::SeqCst), 0);
    // Each run is counted and timed.
    assert!(metrics.migrations_failed.get() >= 2, "{}", metrics.encode());
    assert!(metrics.migrations_run.get() >= 2, "{}", metrics.encode());
    assert!(metrics.encode().contains("fleetwatch_lifecycle_migration_failures_total"));
    assert!(log.lock().unwrap().contains(&"flaky".to_string()));
    stop.cancel();
}
