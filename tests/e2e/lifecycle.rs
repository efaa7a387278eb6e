//! The lifecycle operator end to end: sim control plane and runtime clusters, real hub,
//! agent and lifecycle processes.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use fleetwatch_api::{Runtime, State};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::support::*;
use fleetwatch_test_support::DEADLINE;

const NS: &str = "kcp";

/// A control plane, one runtime cluster, a hub, an agent and the lifecycle operator.
pub(crate) struct Fleet {
    pub(crate) pki: Pki,
    _cp: fleetwatch_sim::SimCluster,
    pub(crate) cp_kc: PathBuf,
    pub(crate) cp: kube::Client,
    _rt: fleetwatch_sim::SimCluster,
    pub(crate) rt_kc: PathBuf,
    pub(crate) rt: kube::Client,
    pub(crate) hub: HubProc,
    _agent: Proc,
    pub(crate) lifecycle: Proc,
    pub(crate) metrics_port: u16,
    kubelet: tokio_util::sync::CancellationToken,
}

/// Where the fleet's hub reads WatchConfigs.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Watches {
    /// A directory with one WatchConfig, the redis configuration's.
    File,
    /// The control plane (where the operator keeps the ones it relies on), with none
    /// written by hand.
    ControlPlane,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kubelet.cancel();
    }
}

pub(crate) fn apply_json(kc: &std::path::Path, v: &Value) {
    kubectl(kc, &["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(&v.to_string()));
}

pub(crate) fn release_meta(regular: &str, fast: &str) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
           "metadata": {"name": "redis", "namespace": NS},
           "spec": {"moduleName": "redis", "channels": [{"channel": "regular", "version": regular}, {"channel": "fast", "version": fast}]}})
}

pub(crate) fn runtime(name: &str, modules: Value) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"clusterId": "rt1", "kubeconfigSecret": {"name": "rt1-kubeconfig"}, "modules": modules}})
}

pub(crate) fn dyn_api(
    client: &kube::Client,
    api_version: &str,
    kind: &str,
    plural: &str,
    ns: Option<&str>,
) -> Api<DynamicObject> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    match ns {
        Some(ns) => Api::namespaced_with(client.clone(), ns, &ar),
        None => Api::all_with(client.clone(), &ar),
    }
}

impl Fleet {
    async fn start(resync: &str) -> Self {
        Self::start_upgraded_from(resync, None).await
    }

    /// Like [`Fleet::start`]; with `previous` (a directory with `crds/` and
    /// `objects.yaml`), the control plane first gets those CRDs and objects, then the CRD
    /// upgrade to `deploy/crds`, as a cluster upgraded from an older release.
    async fn start_upgraded_from(resync: &str, previous: Option<&std::path::Path>) -> Self {
        Self::start_with(resync, previous, Watches::File).await
    }

    /// The fleet with its hub reading WatchConfigs from `watches`.
    pub(crate) async fn start_with(resync: &str, previous: Option<&std::path::Path>, watches: Watches) -> Self {
        let pki = Pki::new();
        let (cp_sim, cp_kc) = sim_cluster(&pki, "control-plane").await;
        let (rt_sim, rt_kc) = sim_cluster(&pki, "rt1").await;
        let cp = cp_sim.client().await.unwrap();
        let rt = rt_sim.client().await.unwrap();
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        if let Some(previous) = previous {
            kubectl(&cp_kc, &["apply", "-f", previous.join("crds").to_str().unwrap()], None);
            apply_json(&cp_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
            kubectl(&cp_kc, &["apply", "-f", previous.join("objects.yaml").to_str().unwrap()], None);
        }
        kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
        apply_json(&cp_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
        // The runtime's kubeconfig, as the Secret the Runtime names.
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rt1-kubeconfig", "namespace": NS},
                            "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}});
        apply_json(&cp_kc, &secret);
        apply_json(&cp_kc, &redis_template(NS, "1.0.0"));
        apply_json(&cp_kc, &redis_template(NS, "2.0.0"));
        apply_json(&cp_kc, &release_meta("1.0.0", "2.0.0"));
        // The hub pushes a watch on module configurations, for the lifecycle operator.
        let wc = pki.path("wc");
        std::fs::create_dir_all(&wc).unwrap();
        std::fs::write(wc.join("redis.json"), json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig",
            "metadata": {"name": "redis-config"}, "spec": {"resource": {"group": "example.com", "version": "v1", "kind": "RedisConfig"},
            "fields": ["spec"], "subscriber": "lifecycle"}}).to_string()).unwrap();
        let hub = match watches {
            Watches::File => HubProc::start(&pki, free_port(), None, &["--watch-config", wc.to_str().unwrap()]),
            Watches::ControlPlane => {
                HubProc::start(&pki, free_port(), None, &["--control-plane-kubeconfig", cp_kc.to_str().unwrap()])
            }
        };
        let agent = kube_agent(&pki, "rt1", &hub.url(), &rt_kc);
        let sub = pki.subscriber("lifecycle");
        let metrics_port = free_port();
        let metrics_addr = format!("127.0.0.1:{metrics_port}");
        let mut args: Vec<String> =
            ["lifecycle", "--control-plane-kubeconfig", cp_kc.to_str().unwrap(), "--hub", &hub.url()]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(client_args(&sub));
        args.extend(["--resync".into(), resync.into(), "--metrics-listen".into(), metrics_addr]);
        let lifecycle = Proc::spawn(&args, pki.path("lifecycle.log"));
        lifecycle.wait_stdout("lifecycle operator running", Duration::from_secs(10));
        // No kubelet in a sim cluster: mark Deployments ready, as a cluster would.
        let kubelet = tokio_util::sync::CancellationToken::new();
        tokio::spawn(fleetwatch_sim::roll_out_deployments(rt.clone(), Duration::ZERO, kubelet.clone()));
        Fleet {
            pki,
            _cp: cp_sim,
            cp_kc,
            cp,
            _rt: rt_sim,
            rt_kc,
            rt,
            hub,
            _agent: agent,
            lifecycle,
            metrics_port,
            kubelet,
        }
    }

    pub(crate) fn runtimes(&self) -> Api<Runtime> {
        Api::namespaced(self.cp.clone(), NS)
    }

    pub(crate) async fn status(&self, name: &str) -> Option<fleetwatch_api::RuntimeStatus> {
        self.runtimes().get_opt(name).await.ok().flatten().and_then(|r| r.status)
    }

    /// Waits until the Runtime's status satisfies `cond`.
    pub(crate) async fn wait(&self, name: &str, what: &str, cond: impl Fn(&fleetwatch_api::RuntimeStatus) -> bool) {
        eventually(format!("runtime {name}: {what}"))
            .context(|| format!("lifecycle log:\n{}", self.lifecycle.stderr()))
            .until(async || self.status(name).await, |st| st.as_ref().is_some_and(&cond))
            .await;
    }

    /// Makes the operator reconcile `name` once more and waits until a reconcile that
    /// started after `changed` (applied here, with nothing in it that matters: `channel:
    /// regular` is the default) has written the status (`observedGeneration`): what a
    /// check that something does *not* happen waits for instead of a fixed time. Only a
    /// spec change starts a reconcile (the operator filters metadata and status changes),
    /// and status says which generation was reconciled, so no clock is involved.
    async fn reconciled_again(&self, name: &str, modules: Value) {
        let current = self.runtimes().get(name).await.unwrap();
        let mut changed = runtime(name, modules);
        if current.spec.channel.is_none() {
            changed["spec"]["channel"] = json!("regular");
        }
        apply_json(&self.cp_kc, &changed);
        let generation = self.runtimes().get(name).await.unwrap().metadata.generation;
        assert!(generation > current.metadata.generation, "the change did not make a new generation");
        self.wait(name, &format!("a reconcile of generation {generation:?}"), |s| s.observed_generation >= generation)
            .await;
    }

    /// The operator's count of failed reconciles (each one is retried with a backoff).
    async fn failed_reconciles(&self) -> f64 {
        let metrics = http_get(self.metrics_port, "/metrics").await;
        sample(&metrics, "fleetwatch_lifecycle_reconcile_failures_total").unwrap_or_else(|| panic!("{metrics}"))
    }

    pub(crate) async fn manager_version(&self) -> Option<String> {
        let d = dyn_api(&self.rt, "apps/v1", "Deployment", "deployments", Some("redis-system"))
            .get_opt("redis-manager")
            .await
            .ok()??;
        d.metadata.labels?.get("app.kubernetes.io/version").cloned()
    }

    pub(crate) fn redis_configs(&self) -> Api<DynamicObject> {
        dyn_api(&self.rt, "example.com/v1", "RedisConfig", "redisconfigs", Some("redis-system"))
    }
}

/// Waits until Runtime `name` says Ready.
async fn runtime_ready(runtimes: &Api<Runtime>, name: &str) {
    eventually(format!("{name} to be reconciled (Ready)"))
        .until(
            async || runtimes.get(name).await.ok().and_then(|r| r.status).and_then(|s| s.state),
            |state| *state == Some(State::Ready),
        )
        .await;
}

pub(crate) fn module<'a>(s: &'a fleetwatch_api::RuntimeStatus, name: &str) -> Option<&'a fleetwatch_api::ModuleStatus> {
    s.modules.iter().find(|m| m.name == name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn module_state_diagram_from_install_to_deletion() {
    let f = Fleet::start("3600").await;
    // Not installed → managed.
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis"}])));
    f.wait("rt1", "redis 1.0.0 Ready", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"));
    let cfg = f.redis_configs().get("default").await.unwrap();
    assert_eq!(cfg.data["spec"]["size"], 1);
    let st = f.status("rt1").await.unwrap();
    assert_eq!(st.state, Some(State::Ready));
    assert!(
        f.runtimes()
            .get("rt1")
            .await
            .unwrap()
            .metadata
            .finalizers
            .unwrap()
            .contains(&"operator.fleetwatch.dev/lifecycle".to_string())
    );

    // The catalog of available modules is kept in the runtime cluster.
    let catalog = |f: &Fleet| {
        let out =
            kubectl(&f.rt_kc, &["get", "configmap", "fleetwatch-catalog", "-n", "kube-public", "-o", "json"], None);
        let cm: Value = serde_json::from_str(&out).unwrap();
        serde_json::from_str::<Value>(cm["data"]["catalog.json"].as_str().unwrap()).unwrap()
    };
    let c = catalog(&f);
    assert_eq!(c["modules"][0]["name"], "redis", "{c}");
    assert_eq!(c["modules"][0]["channels"]["regular"], "1.0.0");
    assert_eq!(c["modules"][0]["versions"], json!(["1.0.0", "2.0.0"]));

    // The user edits the default configuration: it is never overwritten.
    f.redis_configs()
        .patch("default", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"size": 5}})))
        .await
        .unwrap();

    // Upgraded: the channel moves (only the release meta changes).
    apply_json(&f.cp_kc, &release_meta("2.0.0", "2.0.0"));
    f.wait("rt1", "upgrade to 2.0.0", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("2.0.0"))
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"));
    assert_eq!(
        f.redis_configs().get("default").await.unwrap().data["spec"]["size"],
        5,
        "default configuration overwritten"
    );

    // `managed: false` only unmanages, even under the default CreateAndDelete policy:
    // everything stays installed and status shows what is there.
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis", "managed": false}])));
    f.wait("rt1", "Unmanaged", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Unmanaged && m.message.contains("2.0.0 is installed"))
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"), "managed: false must leave the module installed");
    assert!(f.redis_configs().get_opt("default").await.unwrap().is_some(), "default configuration kept");

    // Managed again.
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis"}])));
    f.wait("rt1", "managed again", |s| module(s, "redis").is_some_and(|m| m.state == State::Ready)).await;
    assert_eq!(f.redis_configs().get("default").await.unwrap().data["spec"]["size"], 5);

    // Removed with CreateAndDelete, blocked while a managed resource instance exists.
    let extra = json!({"apiVersion": "example.com/v1", "kind": "RedisConfig", "metadata": {"name": "extra", "namespace": "redis-system"}, "spec": {"size": 2}});
    f.redis_configs().patch("extra", &PatchParams::apply("user"), &Patch::Apply(&extra)).await.unwrap();
    apply_json(&f.cp_kc, &runtime("rt1", json!([])));
    f.wait("rt1", "Deleting, blocked", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Deleting && m.message.contains("1 RedisConfig"))
    })
    .await;
    assert!(f.redis_configs().get_opt("default").await.unwrap().is_none(), "default configuration deleted first");
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"), "operator kept while managed resources exist");
    f.redis_configs().delete("extra", &DeleteParams::default()).await.unwrap();
    f.wait("rt1", "module removed", |s| module(s, "redis").is_none() && s.state == Some(State::Ready)).await;
    assert_eq!(f.manager_version().await, None, "module operator deleted");

    // It explains itself: an Event per transition on the Runtime, read with kubectl.
    let reasons = || {
        let out = kubectl(&f.cp_kc, &["get", "events.events.k8s.io", "-n", NS, "-o", "json"], None);
        let v: Value = serde_json::from_str(&out).unwrap();
        v["items"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|e| e["regarding"]["kind"] == "Runtime" && e["regarding"]["name"] == "rt1")
            .map(|e| e["reason"].as_str().unwrap_or_default().to_string())
            .collect::<Vec<_>>()
    };
    let want = ["Installed", "Upgraded", "Unmanaged", "DeletionBlocked", "Deleted"];
    assert!(
        holds_within(Duration::from_secs(30), || want.iter().all(|w| reasons().iter().any(|r| r == w))).await,
        "events: {:?}",
        reasons()
    );
    // The printer columns kubectl shows (the sim renders no Table yet: check the CRD).
    let columns = kubectl(
        &f.cp_kc,
        &[
            "get",
            "crd",
            "runtimes.operator.fleetwatch.dev",
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
        ],
        None,
    );
    assert_eq!(columns, "State Channel Modules Age");
    let rt = f.runtimes().get("rt1").await.unwrap();
    assert_eq!(rt.status.unwrap().modules_ready.as_deref(), Some("0/0"));

    // The operator's counters.
    let metrics = http_get(f.metrics_port, "/metrics").await;
    let reconciles: u64 = metrics
        .lines()
        .find_map(|l| l.strip_prefix("fleetwatch_lifecycle_reconciles_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    assert!(reconciles >= 5, "{metrics}");

    // Deleting the Runtime releases its finalizer.
    f.runtimes().delete("rt1", &DeleteParams::default()).await.unwrap();
    let gone =
        holds_within(Duration::from_secs(15), || futures_block(f.runtimes().get_opt("rt1")).ok().flatten().is_none())
            .await;
    assert!(gone, "{}", f.lifecycle.stderr());
    // The catalog went with it.
    let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(f.rt.clone(), "kube-public");
    assert!(cms.get_opt("fleetwatch-catalog").await.unwrap().is_none(), "catalog left behind");
    let _ = &f.pki;
    let _ = &f.rt_kc;
    let _ = &f.hub;
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downgrade_protection_pinning_and_create_once_configuration() {
    let f = Fleet::start("3600").await;
    // 2.0.0 installed by hand, then added to the Runtime while its channel offers 1.0.0.
    let by_hand = &redis_template(NS, "2.0.0")["spec"]["manifest"];
    for obj in by_hand.as_array().unwrap() {
        apply_json(&f.rt_kc, obj);
    }
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis", "channel": "regular"}])));
    f.wait("rt1", "downgrade warning", |s| {
        module(s, "redis")
            .is_some_and(|m| m.state == State::Warning && m.message == "downgrade from 2.0.0 to 1.0.0 not applied")
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"));
    // No error loop: a later reconcile keeps the state, re-applies nothing and is no failure
    // (a failure is retried, again and again).
    let failed = f.failed_reconciles().await;
    f.reconciled_again("rt1", json!([{"name": "redis", "channel": "regular"}])).await;
    assert_eq!(f.failed_reconciles().await, failed, "the refused downgrade counted as a failed reconcile");
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"), "downgraded on a later reconcile");
    let st = f.status("rt1").await.unwrap();
    assert_eq!(module(&st, "redis").unwrap().state, State::Warning);
    assert_eq!(st.state, Some(State::Warning));
    assert!(
        f.redis_configs().get_opt("default").await.unwrap().is_none(),
        "nothing applied while refusing a downgrade"
    );

    // Adopted as soon as the channel reaches 2.0.0.
    apply_json(&f.cp_kc, &release_meta("2.0.0", "2.0.0"));
    f.wait("rt1", "adopted", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("2.0.0"))
    })
    .await;
    assert!(f.redis_configs().get_opt("default").await.unwrap().is_some());

    // The user deletes the default configuration: it is not recreated.
    f.redis_configs().delete("default", &DeleteParams::default()).await.unwrap();
    // A pinned version ignores channel moves (a second module entry would clash on names,
    // so pin the same module: pinned 2.0.0 while the channel goes to 3.0.0 without a template).
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis", "version": "2.0.0"}])));
    apply_json(&f.cp_kc, &release_meta("3.0.0", "3.0.0"));
    // A reconcile that knew of the channel move: the operator has seen the meta (it wrote
    // the meta's channel summary from the same watch the reconciles read) before the
    // Runtime changes again.
    let metas = dyn_api(&f.cp, "operator.fleetwatch.dev/v1alpha1", "ModuleReleaseMeta", "modulereleasemetas", Some(NS));
    eventually("the operator to see the channel move to 3.0.0")
        .until(
            async || metas.get("redis").await.ok().map(|m| m.data["status"]["channels"].clone()),
            |c| c.as_ref().is_some_and(|c| c == "fast=3.0.0 regular=3.0.0"),
        )
        .await;
    f.reconciled_again("rt1", json!([{"name": "redis", "version": "2.0.0"}])).await;
    let st = f.status("rt1").await.unwrap();
    let m = module(&st, "redis").unwrap();
    assert_eq!((m.state, m.desired_version.as_deref()), (State::Ready, Some("2.0.0")), "{m:#?}");
    assert!(f.redis_configs().get_opt("default").await.unwrap().is_none(), "default configuration recreated");
    // Unpinned, the channel's 3.0.0 has no template: an error for this module only.
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis"}])));
    f.wait("rt1", "missing template", |s| {
        module(s, "redis")
            .is_some_and(|m| m.state == State::Error && m.message.contains("no ModuleTemplate for redis 3.0.0"))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_module_configuration_change_reconciles_its_runtime_by_event() {
    // Periodic resync off: only events can trigger.
    let f = Fleet::start("0").await;
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis"}])));
    f.wait("rt1", "Ready", |s| s.state == Some(State::Ready) && module(s, "redis").is_some()).await;
    // Settle: wait until the operator stops requeueing (no new reconcile for 1.5 s), so the
    // next reconcile can only come from the event.
    let mut before = f.status("rt1").await.unwrap().last_reconcile.unwrap();
    let mut quiet_since = Instant::now();
    let settle_deadline = Instant::now() + Duration::from_secs(60);
    while quiet_since.elapsed() < Duration::from_millis(1500) {
        assert!(Instant::now() < settle_deadline, "the operator keeps reconciling rt1 without a change");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let now = f.status("rt1").await.unwrap().last_reconcile.unwrap();
        if now != before {
            before = now;
            quiet_since = Instant::now();
        }
    }
    let t0 = Instant::now();
    f.redis_configs()
        .patch("default", &PatchParams::default(), &Patch::Merge(&json!({"spec": {"size": 9}})))
        .await
        .unwrap();
    f.wait("rt1", "a reconcile after the config change", |s| s.last_reconcile.as_deref() != Some(before.as_str()))
        .await;
    // With the periodic resync off only the hub event can have triggered it; how fast is
    // measured by `fleetwatch bench`, not asserted here.
    eprintln!("module configuration change → runtime reconciled in {:?}", t0.elapsed());
    // The operator says so at INFO, naming the runtime and what changed.
    let said = |log: &str| {
        log.lines().any(|l| {
            l.contains(" INFO ")
                && l.contains("reconciling after a change in the runtime cluster")
                && l.contains("kcp/rt1")
                && l.contains("applied example.com/v1/RedisConfig/redis-system/default")
        })
    };
    assert!(
        holds_within(DEADLINE, || said(&f.lifecycle.stderr())).await,
        "no INFO line about the config edit:\n{}",
        f.lifecycle.stderr()
    );
}

/// Without its CRDs the operator says which are missing, waits for them, starts when they
/// appear; SIGTERM stops it in either state.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_crds_are_named_waited_for_and_sigterm_always_works() {
    let pki = Pki::new();
    let (_cp_sim, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let spawn = |log: &str| {
        let args: Vec<String> = ["lifecycle", "--control-plane-kubeconfig", cp_kc.to_str().unwrap()]
            .iter()
            .map(|s| s.to_string())
            .collect();
        Proc::spawn(&args, pki.path(log))
    };
    // 1. No CRDs: named at the default log level; SIGTERM ends it.
    let mut op = spawn("lifecycle-1.log");
    assert!(
        holds_within(Duration::from_secs(30), || op.stderr().contains("runtimes.operator.fleetwatch.dev")).await,
        "{}",
        op.stderr()
    );
    assert!(op.stderr().contains("ERROR"), "{}", op.stderr());
    op.signal("TERM");
    assert_eq!(
        op.wait_exit(Duration::from_secs(30)),
        Some(0),
        "SIGTERM ignored while waiting for CRDs:\n{}",
        op.stderr()
    );

    // 2. The CRDs appear while it waits: it starts and reconciles.
    let mut op = spawn("lifecycle-2.log");
    assert!(holds_within(Duration::from_secs(30), || op.stderr().contains("lacks CRDs")).await, "{}", op.stderr());
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    assert!(
        holds_within(Duration::from_secs(30), || op.stderr().contains("serves every CRD")).await,
        "{}",
        op.stderr()
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "empty", "namespace": "default"}, "spec": {"modules": []}}),
    );
    let cp = _cp_sim.client().await.unwrap();
    let runtimes: Api<Runtime> = Api::namespaced(cp, "default");
    eventually("runtime empty to be reconciled after the CRDs appeared")
        .context(|| op.stderr())
        .until(
            async || runtimes.get("empty").await.ok().and_then(|r| r.status).and_then(|s| s.state),
            |state| *state == Some(State::Ready),
        )
        .await;
    op.signal("TERM");
    assert_eq!(op.wait_exit(Duration::from_secs(30)), Some(0), "{}", op.stderr());
}

/// Two instances: one leads (holds the Lease), the other waits naming the leader and takes
/// over when the leader dies; only the leader acts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_instance_leads_and_another_takes_over_when_it_dies() {
    let pki = Pki::new();
    let (cp_sim, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    // No flag for the control plane: $KUBECONFIG, as in a shell (in a pod: in-cluster).
    let spawn = |log: &str| {
        let args: Vec<String> =
            ["lifecycle", "--leader-elect-lease-duration", "3"].iter().map(|s| s.to_string()).collect();
        Proc::spawn_with_env(&args, pki.path(log), &[("KUBECONFIG", cp_kc.to_str().unwrap())])
    };
    let mut a = spawn("lifecycle-a.log");
    assert!(holds_within(Duration::from_secs(30), || a.stderr().contains("leading")).await, "{}", a.stderr());
    let mut b = spawn("lifecycle-b.log");
    assert!(
        holds_within(Duration::from_secs(30), || b.stderr().contains("another instance leads")).await,
        "{}",
        b.stderr()
    );
    let cp = cp_sim.client().await.unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(cp.clone(), "default");
    let holder =
        |l: k8s_openapi::api::coordination::v1::Lease| l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
    let first = holder(leases.get("fleetwatch-lifecycle").await.unwrap());
    assert!(a.stderr().contains(&first) && b.stderr().contains(&first), "leader {first}");

    let runtimes: Api<Runtime> = Api::namespaced(cp, "default");
    let ready = |name: &'static str| {
        let runtimes = runtimes.clone();
        async move { runtime_ready(&runtimes, name).await }
    };
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "one", "namespace": "default"}, "spec": {"modules": []}}),
    );
    ready("one").await;
    assert!(!b.stderr().contains("reconcile"), "the waiting instance acted:\n{}", b.stderr());

    // The leader dies without releasing the Lease: the other takes over once it expires.
    a.signal("KILL");
    a.wait_exit(Duration::from_secs(10));
    assert!(holds_within(Duration::from_secs(60), || b.stderr().contains("leading")).await, "{}", b.stderr());
    let second = holder(leases.get("fleetwatch-lifecycle").await.unwrap());
    assert_ne!(second, first);
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "two", "namespace": "default"}, "spec": {"modules": []}}),
    );
    ready("two").await;
    b.signal("TERM");
    assert_eq!(b.wait_exit(Duration::from_secs(30)), Some(0), "{}", b.stderr());
}

/// `fleetwatch lifecycle --shards 3`, two processes: the shards spread over both (each holds
/// at most two), every Runtime is reconciled, and when one process is killed the other takes
/// its shards over once their Leases expire and reconciles new Runtimes of those shards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sharded_instances_share_the_runtimes_and_take_over_a_killed_one() {
    let pki = Pki::new();
    let (cp_sim, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    let spawn = |log: &str, metrics_port: u16| {
        let metrics = format!("127.0.0.1:{metrics_port}");
        let args: Vec<String> =
            ["lifecycle", "--shards", "3", "--leader-elect-lease-duration", "3", "--metrics-listen", &metrics]
                .iter()
                .map(|s| s.to_string())
                .collect();
        Proc::spawn_with_env(&args, pki.path(log), &[("KUBECONFIG", cp_kc.to_str().unwrap())])
    };
    let (a_port, b_port) = (free_port(), free_port());
    let mut a = spawn("lifecycle-shard-a.log", a_port);
    let mut b = spawn("lifecycle-shard-b.log", b_port);
    // What the lost-shard alert reads: each instance's shard count and shards held.
    let shard_gauges = |port: u16| async move {
        let text = http_get(port, "/metrics").await;
        let value =
            |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
        (value("fleetwatch_lifecycle_shards"), value("fleetwatch_lifecycle_shards_held"))
    };
    let cp = cp_sim.client().await.unwrap();
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(cp.clone(), "default");
    let holders = || {
        let leases = leases.clone();
        async move {
            let mut out = Vec::new();
            for i in 0..3 {
                let h = leases
                    .get_opt(&format!("fleetwatch-lifecycle-shard-{i}"))
                    .await
                    .unwrap()
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .unwrap_or_default();
                out.push(h);
            }
            out
        }
    };
    // Both take part: three shards, two holders, nobody holds all three.
    let spread = eventually("the shards to be spread over both instances")
        .context(|| format!("{}\n{}", a.stderr(), b.stderr()))
        .until(
            async || holders().await,
            |h| {
                let distinct: std::collections::BTreeSet<&String> = h.iter().filter(|x| !x.is_empty()).collect();
                h.iter().all(|x| !x.is_empty()) && distinct.len() == 2
            },
        )
        .await;
    let runtimes: Api<Runtime> = Api::namespaced(cp, "default");
    let all_ready = |names: Vec<String>| {
        let runtimes = runtimes.clone();
        async move {
            for name in names {
                runtime_ready(&runtimes, &name).await;
            }
        }
    };
    // Two Runtimes in each shard, so each process (and the survivor, for the victim's shards)
    // has work.
    let create = |prefix: &str| {
        let mut names: Vec<String> = Vec::new();
        let mut per = [0; 3];
        for i in 0.. {
            let n = format!("{prefix}{i}");
            let shard = fleetwatch_lifecycle::shards::shard_of("default", &n, 3) as usize;
            if per[shard] < 2 {
                per[shard] += 1;
                names.push(n);
            }
            if per.iter().all(|c| *c == 2) {
                break;
            }
        }
        for n in &names {
            apply_json(
                &cp_kc,
                &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
                "metadata": {"name": n, "namespace": "default"}, "spec": {"modules": []}}),
            );
        }
        names
    };
    all_ready(create("one-")).await;
    // Both serve the shard count, and the shards they hold add up to it.
    eventually("the shards held to add up to the shard count")
        .until(
            async || (shard_gauges(a_port).await, shard_gauges(b_port).await),
            |((a_total, a_held), (b_total, b_held))| {
                *a_total == Some(3.0)
                    && *b_total == Some(3.0)
                    && a_held.zip(*b_held).is_some_and(|(a, b)| a + b == 3.0 && a >= 1.0 && b >= 1.0)
            },
        )
        .await;
    // Both processes reconciled: each logs the runtimes of its own shards.
    assert!(a.stderr().contains("took the shard") && b.stderr().contains("took the shard"));

    // The process holding shard 0 is killed without giving anything back.
    let a_holds_0 = a.stderr().contains(&spread[0]);
    let (victim, survivor, survivor_port) = if a_holds_0 { (&mut a, &mut b, b_port) } else { (&mut b, &mut a, a_port) };
    victim.signal("KILL");
    victim.wait_exit(Duration::from_secs(10));
    eventually("the survivor to take the shards over")
        .context(|| survivor.stderr())
        .until(async || holders().await, |h| h.iter().all(|x| !x.is_empty() && *x != spread[0]))
        .await;
    eventually("the survivor to report all three shards held")
        .until(async || shard_gauges(survivor_port).await, |g| *g == (Some(3.0), Some(3.0)))
        .await;
    all_ready(create("two-")).await;
    survivor.signal("TERM");
    assert_eq!(survivor.wait_exit(Duration::from_secs(30)), Some(0), "{}", survivor.stderr());
    let h = holders().await;
    assert!(h.iter().all(String::is_empty), "a clean stop gives the shards back: {h:?}");
}

/// With real processes: one undecodable Runtime is marked and the others reconcile; a
/// misspelt maintenance policy holds a downtime upgrade (fails closed) with a Warning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_objects_are_isolated_and_a_missing_policy_fails_closed() {
    let f = Fleet::start("3600").await;
    // The broken Runtime was stored while the CRD had no enum for that field (an API server,
    // the sim too, validates writes against the schema, not what it already stores).
    let enum_path = "/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/modules/items/properties/customResourcePolicy/enum";
    let crd_patch = |op: Value| {
        kubectl(
            &f.cp_kc,
            &["patch", "crd", "runtimes.operator.fleetwatch.dev", "--type=json", "-p", &json!([op]).to_string()],
            None,
        )
    };
    crd_patch(json!({"op": "remove", "path": enum_path}));
    apply_json(&f.cp_kc, &runtime("broken", json!([{"name": "redis", "customResourcePolicy": "DeleteEverything"}])));
    crd_patch(json!({"op": "add", "path": enum_path, "value": ["CreateAndDelete", "Ignore"]}));
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis"}])));
    f.wait("rt1", "redis 1.0.0 Ready", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))
    })
    .await;
    let reason = || {
        kubectl(
            &f.cp_kc,
            &["get", "runtime", "broken", "-n", NS, "-o", "jsonpath={.status.conditions[0].reason}"],
            None,
        )
    };
    assert!(holds_within(Duration::from_secs(30), || reason() == "InvalidSpec").await, "{}", reason());

    // rt1 names a policy that does not exist; then 3.0.0, which needs downtime, is released.
    let mut rt = runtime("rt1", json!([{"name": "redis"}]));
    rt["spec"]["maintenancePolicy"] = json!("nightyl");
    apply_json(&f.cp_kc, &rt);
    let generation = f.runtimes().get("rt1").await.unwrap().metadata.generation;
    f.wait("rt1", "the policy name seen", move |s| s.observed_generation == generation).await;
    let mut t3 = redis_template(NS, "3.0.0");
    t3["spec"]["requiresDowntime"] = json!(true);
    apply_json(&f.cp_kc, &t3);
    apply_json(&f.cp_kc, &release_meta("3.0.0", "3.0.0"));
    f.wait("rt1", "held by the missing policy", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Warning && m.message.contains("nightyl not found"))
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"), "a downtime upgrade happened without a window");
}

/// With kubectl against the sim: a MaintenancePolicy whose window does not parse, a
/// ModuleTemplate whose version is not semver and a ModuleReleaseMeta offering one say so in their status (`Usable` False,
/// reason `InvalidSpec`, the error), and `Usable` True (reason `Valid`) once fixed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unusable_policies_and_templates_say_so_in_their_status() {
    let f = Fleet::start("3600").await;
    let usable = |kind: &str, name: &str| -> Option<(String, String, String)> {
        let out = kubectl(&f.cp_kc, &["get", kind, name, "-n", NS, "-o", "jsonpath={.status.conditions}"], None);
        let conditions: Vec<Value> = serde_json::from_str(&out).ok()?;
        let c = conditions.into_iter().find(|c| c["type"] == "Usable")?;
        let field = |k: &str| c[k].as_str().unwrap_or_default().to_string();
        Some((field("status"), field("reason"), field("message")))
    };
    let wait_for = |kind: &'static str, name: &'static str, want: (&'static str, &'static str, &'static str)| {
        let usable = &usable;
        async move {
            let matches = || {
                usable(kind, name)
                    .is_some_and(|(s, r, m)| (s.as_str(), r.as_str()) == (want.0, want.1) && m.contains(want.2))
            };
            assert!(
                holds_within(Duration::from_secs(30), matches).await,
                "{kind} {name}: want {want:?}, have {:?}",
                usable(kind, name)
            );
        }
    };

    let policy = |begin: &str| {
        json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy",
               "metadata": {"name": "nightly", "namespace": NS},
               "spec": {"default": {"days": ["Sat"], "begin": begin, "end": "03:00:00Z"}}})
    };
    apply_json(&f.cp_kc, &policy("1am"));
    wait_for("maintenancepolicy", "nightly", ("False", "InvalidSpec", "\"1am\"")).await;
    apply_json(&f.cp_kc, &policy("01:00:00Z"));
    wait_for("maintenancepolicy", "nightly", ("True", "Valid", "")).await;

    let mut tpl = redis_template(NS, "3.0.0");
    tpl["metadata"]["name"] = json!("redis-next");
    tpl["spec"]["version"] = json!("next");
    apply_json(&f.cp_kc, &tpl);
    wait_for("moduletemplate", "redis-next", ("False", "InvalidSpec", "spec.version")).await;
    tpl["spec"]["version"] = json!("3.0.0");
    apply_json(&f.cp_kc, &tpl);
    wait_for("moduletemplate", "redis-next", ("True", "Valid", "")).await;
    let mut meta = release_meta("1.0.0", "latest");
    meta["metadata"]["name"] = json!("other");
    meta["spec"]["moduleName"] = json!("other");
    apply_json(&f.cp_kc, &meta);
    wait_for("modulereleasemeta", "other", ("False", "InvalidSpec", "spec.channels[1].version")).await;
    meta["spec"]["channels"][1]["version"] = json!("2.0.0");
    apply_json(&f.cp_kc, &meta);
    wait_for("modulereleasemeta", "other", ("True", "Valid", "")).await;
    // The valid ones shipped with the fleet were never marked.
    assert_eq!(usable("moduletemplate", "redis-1.0.0"), None);
}

/// CRD upgrades keep what users wrote: objects created under the previous release's CRDs
/// (`tests/fixtures/previous-release/`) are still read by the current operator after the CRDs
/// are upgraded, and reconciled (the Runtime's module installed and Ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_written_under_the_previous_crds_are_read_and_reconciled() {
    let previous = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/previous-release");
    let f = Fleet::start_upgraded_from("3600", Some(&previous)).await;
    // Read with today's types.
    let rt = f.runtimes().get("rt1").await.unwrap();
    assert_eq!(rt.spec.modules.len(), 1, "{:?}", rt.spec);
    let policies: Api<fleetwatch_api::maintenance::MaintenancePolicy> = Api::namespaced(f.cp.clone(), NS);
    assert!(policies.get("previous").await.is_ok());
    // Reconciled by today's operator.
    f.wait("rt1", "redis 1.0.0 Ready", |s| {
        module(s, "redis").is_some_and(|m| m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0"))
    })
    .await;
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"));
}
