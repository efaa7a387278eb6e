//! Nothing stuck (issue 43): a failed apply is retried with backoff and started again by the
//! runtime cluster's own events (a namespace appearing), declared dependencies between
//! modules are waited for and followed on removal, requirements that cannot be met make the
//! template unusable, and every message a person reads is one plain line. Real hub, agent
//! and lifecycle processes; the hub reads WatchConfigs from the control plane, where the
//! operator keeps the ones it relies on.

use std::time::{Duration, Instant};

use fleetwatch_api::{FailedStep, ModuleReason, ModuleStatus, Runtime, RuntimeStatus, State};
use kube::api::{Api, DynamicObject};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::lifecycle::{Fleet, Watches};
use crate::support::*;

const NS: &str = "kcp";

/// The lifecycle tests' fleet ([`crate::lifecycle::Fleet`]: control plane, runtime `rt1`,
/// hub, agent, operator), its hub reading WatchConfigs from the control plane, the operator's
/// periodic resync off (only events and retries reconcile).
async fn start() -> Fleet {
    Fleet::start_with("0", None, Watches::ControlPlane).await
}

impl Fleet {
    async fn rt1(&self) -> Option<RuntimeStatus> {
        let api: Api<Runtime> = Api::namespaced(self.cp.clone(), NS);
        api.get_opt("rt1").await.ok().flatten().and_then(|r| r.status)
    }

    async fn rt1_until(&self, what: &str, cond: impl Fn(&RuntimeStatus) -> bool) -> RuntimeStatus {
        eventually(format!("runtime rt1: {what}"))
            .context(|| format!("lifecycle log:\n{}", self.lifecycle.stderr()))
            .until(async || self.rt1().await, |st| st.as_ref().is_some_and(&cond))
            .await
            .unwrap()
    }

    fn rt1_modules(&self, modules: &[&str]) {
        let modules: Vec<Value> = modules.iter().map(|m| json!({"name": m})).collect();
        apply_json(
            &self.cp_kc,
            &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
                "metadata": {"name": "rt1", "namespace": NS},
                "spec": {"channel": "regular", "kubeconfigSecret": {"name": "rt1-kubeconfig"}, "modules": modules}}),
        );
    }

    fn deployments(&self, ns: &str) -> Api<DynamicObject> {
        let ar = ApiResource {
            group: "apps".into(),
            version: "v1".into(),
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            plural: "deployments".into(),
        };
        Api::namespaced_with(self.rt.clone(), ns, &ar)
    }

    async fn template_usable(&self, name: &str) -> Option<(String, String, String)> {
        let api: Api<fleetwatch_api::ModuleTemplate> = Api::namespaced(self.cp.clone(), NS);
        let t = api.get_opt(name).await.ok()??;
        let c = t.status?.conditions.into_iter().find(|c| c.type_ == "Usable")?;
        Some((c.status, c.reason, c.message))
    }
}

fn module<'a>(s: &'a RuntimeStatus, name: &str) -> Option<&'a ModuleStatus> {
    s.modules.iter().find(|m| m.name == name)
}

/// A module whose namespace is `ns-system`, its manager there, and `extra` objects after it.
fn template(module: &str, version: &str, extra: Vec<Value>, requires: Value) -> Value {
    let mut manifest = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("{module}-system")}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": format!("{module}-manager"), "namespace": format!("{module}-system"),
                         "labels": {"operator.fleetwatch.dev/module": module, "app.kubernetes.io/version": version}},
            "spec": {"replicas": 0, "selector": {"matchLabels": {"app": module}},
                     "template": {"metadata": {"labels": {"app": module}}, "spec": {"containers": [{"name": "m", "image": "example/m:1"}]}}}}),
    ];
    manifest.extend(extra);
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("{module}-{version}"), "namespace": NS},
        "spec": {"moduleName": module, "version": version, "manifest": manifest, "requires": requires,
                 "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": format!("{module}-system"), "name": format!("{module}-manager")}}})
}

fn meta(module: &str, version: &str) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
        "metadata": {"name": module, "namespace": NS},
        "spec": {"moduleName": module, "channels": [{"channel": "regular", "version": version}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_namespace_is_retried_and_its_creation_starts_the_install() {
    let f = start().await;
    let sa =
        json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ghost", "namespace": "ghost-ns"}});
    apply_json(&f.cp_kc, &template("ghost", "1.0.0", vec![sa], json!([])));
    apply_json(&f.cp_kc, &meta("ghost", "1.0.0"));
    f.rt1_modules(&["ghost"]);
    // Error, in one plain line naming the object, the cluster and why; retried by itself
    // (no resync, no spec change) with the count and the next try in the status.
    let st = f
        .rt1_until("ghost failing at apply, tried twice", |s| {
            module(s, "ghost").is_some_and(|m| m.retry.as_ref().is_some_and(|r| r.failures >= 2))
        })
        .await;
    let ghost = module(&st, "ghost").unwrap();
    assert_eq!(ghost.state, State::Error);
    assert_eq!(
        ghost.message,
        "installing ghost 1.0.0: apply ServiceAccount ghost-ns/ghost in rt1: namespace ghost-ns does not exist (404)"
    );
    let retry = ghost.retry.as_ref().unwrap();
    assert_eq!(retry.step, FailedStep::Apply);
    assert!(retry.next_attempt.parse::<jiff::Timestamp>().is_ok(), "{retry:?}");
    let metrics = http_get(f.metrics_port, "/metrics").await;
    assert!(
        sample(&metrics, r#"fleetwatch_lifecycle_retries_total{reason="apply"}"#).is_some_and(|n| n >= 1.0),
        "{metrics}"
    );
    // `fleetwatch status`-like readers see the same line: no Debug dump anywhere.
    let cond = &st.conditions[0].message;
    assert!(cond.contains("namespace ghost-ns does not exist (404)") && !cond.contains("Status {"), "{cond}");
    // The operator keeps the WatchConfigs it relies on; the hub accepts them.
    eventually("the operator's namespace WatchConfig, accepted by the hub")
        .until(
            async || kubectl(&f.cp_kc, &["get", "watchconfig", "fleetwatch-lifecycle.namespaces", "-o", "json"], None),
            |out| {
                serde_json::from_str::<Value>(out)
                    .ok()
                    .and_then(|v| v["status"]["conditions"][0]["status"].as_str().map(|s| s == "True"))
                    .unwrap_or(false)
            },
        )
        .await;
    // The namespace appears: the agent's event reconciles the Runtime, the module installs.
    let t0 = Instant::now();
    apply_json(&f.rt_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ghost-ns"}}));
    let st = f
        .rt1_until("ghost Ready after its namespace appeared", |s| {
            module(s, "ghost").is_some_and(|m| m.state == State::Ready && m.retry.is_none())
        })
        .await;
    eprintln!("namespace created → module Ready in {:?}", t0.elapsed());
    assert_eq!(module(&st, "ghost").unwrap().message, "");
    // It was the namespace's event that started it (the operator says what changed).
    let said = |log: &str| {
        log.lines().any(|l| {
            l.contains("reconciling after a change in the runtime cluster") && l.contains("v1/Namespace/_/ghost-ns")
        })
    };
    assert!(
        holds_within(Duration::from_secs(30), || said(&f.lifecycle.stderr())).await,
        "no reconcile named the namespace's event:\n{}",
        f.lifecycle.stderr()
    );

    // A kind no CRD provides yet: the same, started by the CRD's event.
    let widget = json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w", "namespace": "kindly-system"}});
    apply_json(&f.cp_kc, &template("kindly", "1.0.0", vec![widget], json!([])));
    apply_json(&f.cp_kc, &meta("kindly", "1.0.0"));
    f.rt1_modules(&["ghost", "kindly"]);
    let st = f
        .rt1_until("kindly failing, tried twice", |s| {
            module(s, "kindly").is_some_and(|m| m.retry.as_ref().is_some_and(|r| r.failures >= 2))
        })
        .await;
    assert_eq!(
        module(&st, "kindly").unwrap().message,
        "installing kindly 1.0.0: apply Widget kindly-system/w in rt1: kind example.com/v1 Widget is not served by the cluster (no CRD for it yet)"
    );
    let t0 = Instant::now();
    apply_json(
        &f.rt_kc,
        &json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                     "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                     "versions": [{"name": "v1", "served": true, "storage": true,
                                   "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}}),
    );
    f.rt1_until("kindly Ready after its CRD appeared", |s| {
        module(s, "kindly").is_some_and(|m| m.state == State::Ready)
    })
    .await;
    eprintln!("CRD created → module Ready in {:?}", t0.elapsed());
    let said = |log: &str| {
        log.lines().any(|l| {
            l.contains("reconciling after a change in the runtime cluster")
                && l.contains("apiextensions.k8s.io/v1/CustomResourceDefinition/_/widgets.example.com")
        })
    };
    assert!(
        holds_within(Duration::from_secs(30), || said(&f.lifecycle.stderr())).await,
        "no reconcile named the CRD's event:\n{}",
        f.lifecycle.stderr()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dependencies_are_waited_for_installed_first_and_removed_last() {
    let f = start().await;
    apply_json(&f.cp_kc, &template("base", "1.0.0", vec![], json!([])));
    apply_json(&f.cp_kc, &meta("base", "1.0.0"));
    apply_json(&f.cp_kc, &template("app", "1.0.0", vec![], json!([{"module": "base", "versions": ">=1.0, <2"}])));
    apply_json(&f.cp_kc, &meta("app", "1.0.0"));
    // app alone: it waits for base, named, and installs nothing.
    f.rt1_modules(&["app"]);
    let st = f
        .rt1_until("app waiting for base", |s| {
            module(s, "app").is_some_and(|m| m.reason == Some(ModuleReason::WaitingForDependency))
        })
        .await;
    let app = module(&st, "app").unwrap();
    assert_eq!(app.state, State::Warning);
    assert!(
        app.message.contains("waits for module base >=1.0, <2") && app.message.contains("not in this Runtime"),
        "{}",
        app.message
    );
    assert!(f.deployments("app-system").get_opt("app-manager").await.unwrap().is_none(), "app installed before base");
    let events = kubectl(&f.cp_kc, &["-n", NS, "get", "events.events.k8s.io", "-o", "json"], None);
    assert!(events.contains("WaitingForDependency"), "{events}");
    // base added (after app in the list): base first, then app, both Ready.
    f.rt1_modules(&["app", "base"]);
    f.rt1_until("both Ready", |s| {
        ["app", "base"].iter().all(|m| module(s, m).is_some_and(|m| m.state == State::Ready))
    })
    .await;
    let created = |d: Option<DynamicObject>| d.and_then(|d| d.metadata.creation_timestamp).map(|t| t.0);
    let base_at = created(f.deployments("base-system").get_opt("base-manager").await.unwrap()).unwrap();
    let app_at = created(f.deployments("app-system").get_opt("app-manager").await.unwrap()).unwrap();
    assert!(base_at <= app_at, "app ({app_at}) was installed before base ({base_at})");
    // base unmanaged while app needs it: it stays managed, saying why.
    apply_json(
        &f.cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "rt1", "namespace": NS},
            "spec": {"channel": "regular", "kubeconfigSecret": {"name": "rt1-kubeconfig"},
                     "modules": [{"name": "app"}, {"name": "base", "managed": false}]}}),
    );
    let st = f
        .rt1_until("base kept managed for app", |s| {
            module(s, "base").is_some_and(|m| m.reason == Some(ModuleReason::RequiredByOthers))
        })
        .await;
    let base = module(&st, "base").unwrap();
    assert_eq!(
        (base.state, base.message.as_str()),
        (State::Warning, "not unmanaged yet: required by app 1.0.0 (managed until none is)")
    );
    // base removed while app needs it: the removal waits, naming app; nothing is deleted.
    f.rt1_modules(&["app"]);
    let st = f
        .rt1_until("base's removal waiting for app", |s| module(s, "base").is_some_and(|m| m.state == State::Deleting))
        .await;
    let base = module(&st, "base").unwrap();
    assert_eq!(base.reason, Some(ModuleReason::RequiredByOthers));
    assert_eq!((base.state, base.message.as_str()), (State::Deleting, "removal waits: required by app 1.0.0"));
    assert!(f.deployments("base-system").get_opt("base-manager").await.unwrap().is_some());
    // Both removed: app goes first, then base, and nothing is left.
    f.rt1_modules(&[]);
    f.rt1_until("both removed", |s| s.modules.is_empty()).await;
    for m in ["app", "base"] {
        assert!(f.deployments(&format!("{m}-system")).get_opt(&format!("{m}-manager")).await.unwrap().is_none(), "{m}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unsatisfiable_and_cyclic_requirements_make_the_template_unusable() {
    let f = start().await;
    apply_json(&f.cp_kc, &template("base", "1.0.0", vec![], json!([])));
    apply_json(&f.cp_kc, &meta("base", "1.0.0"));
    // No channel of base offers 5.x.
    apply_json(&f.cp_kc, &template("app", "1.0.0", vec![], json!([{"module": "base", "versions": ">=5"}])));
    apply_json(&f.cp_kc, &meta("app", "1.0.0"));
    // x and y require each other.
    apply_json(&f.cp_kc, &template("x", "1.0.0", vec![], json!([{"module": "y"}])));
    apply_json(&f.cp_kc, &template("y", "1.0.0", vec![], json!([{"module": "x"}])));
    apply_json(&f.cp_kc, &meta("x", "1.0.0"));
    apply_json(&f.cp_kc, &meta("y", "1.0.0"));
    let unusable = async |name: &str, needle: &str| {
        eventually(format!("template {name} Usable=False: {needle}"))
            .context(|| f.lifecycle.stderr())
            .until(
                async || f.template_usable(name).await,
                |c| c.as_ref().is_some_and(|(s, r, m)| s == "False" && r == "UnmetRequirements" && m.contains(needle)),
            )
            .await;
    };
    unusable("app-1.0.0", "no channel of module base offers a version in >=5 (it offers regular=1.0.0)").await;
    unusable("x-1.0.0", "a cycle of requirements: x → y → x").await;
    unusable("y-1.0.0", "a cycle of requirements: y → x → y").await;
    // A Runtime wanting it shows the module in Error, retried, nothing applied.
    f.rt1_modules(&["app", "base"]);
    let st = f.rt1_until("app in Error", |s| module(s, "app").is_some_and(|m| m.state == State::Error)).await;
    assert!(module(&st, "app").unwrap().message.contains("is not usable: spec.requires"), "{st:?}");
    assert!(f.deployments("app-system").get_opt("app-manager").await.unwrap().is_none());
    // Fixed (base 5.0.0 offered): usable again, and app installs.
    apply_json(&f.cp_kc, &template("base", "5.0.0", vec![], json!([])));
    apply_json(&f.cp_kc, &meta("base", "5.0.0"));
    eventually("app-1.0.0 usable again")
        .until(async || f.template_usable("app-1.0.0").await, |c| c.as_ref().is_some_and(|(s, _, _)| s == "True"))
        .await;
    f.rt1_until("both Ready", |s| {
        ["app", "base"].iter().all(|m| module(s, m).is_some_and(|m| m.state == State::Ready))
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_policy_acts_without_a_hand_written_watchconfig() {
    let f = start().await;
    // A module whose configuration is a ConfigMap; no WatchConfig names that kind.
    let mut t = template("conf", "1.0.0", vec![], json!([]));
    t["spec"]["defaultConfig"] = json!({"apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "conf-config", "namespace": "conf-system"}, "data": {"tls": "on", "size": "1"}});
    apply_json(&f.cp_kc, &t);
    apply_json(&f.cp_kc, &meta("conf", "1.0.0"));
    apply_json(
        &f.cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleConfigPolicy",
            "metadata": {"name": "tls-on", "namespace": NS}, "spec": {"module": "conf", "enforce": {"data": {"tls": "on"}}}}),
    );
    f.rt1_modules(&["conf"]);
    f.rt1_until("conf Ready", |s| module(s, "conf").is_some_and(|m| m.state == State::Ready)).await;
    // The operator watches the configuration kind itself.
    eventually("the operator's ConfigMap WatchConfig")
        .until(
            async || kubectl(&f.cp_kc, &["get", "watchconfigs", "-o", "name"], None),
            |out| out.contains("fleetwatch-lifecycle.config.configmap"),
        )
        .await;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        f.rt.clone(),
        "conf-system",
        &ApiResource {
            group: "".into(),
            version: "v1".into(),
            api_version: "v1".into(),
            kind: "ConfigMap".into(),
            plural: "configmaps".into(),
        },
    );
    // The agent runs it before the user's edit, so the edit is an event.
    eventually("the agent running the ConfigMap watch")
        .until(
            async || f.hub.clusters().await["clusters"][0]["watches"].clone(),
            |ws| {
                ws.as_array().is_some_and(|ws| {
                    ws.iter().any(|w| w["name"] == "fleetwatch-lifecycle.config.configmap" && w["phase"] == "running")
                })
            },
        )
        .await;
    // A user turns TLS off in the runtime cluster: with the periodic resync off, only the
    // event of that edit can put it back.
    kubectl(
        &f.rt_kc,
        &[
            "-n",
            "conf-system",
            "patch",
            "configmap",
            "conf-config",
            "--type",
            "merge",
            "-p",
            r#"{"data":{"tls":"off","size":"3"}}"#,
        ],
        None,
    );
    eventually("tls back on, the user's size kept")
        .context(|| f.lifecycle.stderr())
        .until(
            async || cms.get("conf-config").await.ok().map(|c| c.data["data"].clone()),
            |d| d.as_ref().is_some_and(|d| d["tls"] == "on" && d["size"] == "3"),
        )
        .await;
}
