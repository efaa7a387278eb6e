//! ModuleConfigPolicy end to end (issue 29): sim control plane and runtime cluster, real hub,
//! agent and lifecycle processes. Every wait is for a condition, never a fixed sleep.

use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use fleetwatch_api::{ModuleStatus, Runtime, RuntimeStatus};
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::support::*;

const NS: &str = "kcp";

struct Fleet {
    _pki: Pki,
    _cp_sim: fleetwatch_sim::SimCluster,
    cp_kc: PathBuf,
    cp: kube::Client,
    _rt_sim: fleetwatch_sim::SimCluster,
    rt: kube::Client,
    /// A second runtime (region `us`), which the selector of `central` leaves out.
    rt2_sim: fleetwatch_sim::SimCluster,
    rt2: kube::Client,
    _hub: HubProc,
    _agent: Proc,
    _agent2: Proc,
    lifecycle: Proc,
    metrics_port: u16,
    kubelet: tokio_util::sync::CancellationToken,
}

impl Drop for Fleet {
    fn drop(&mut self) {
        self.kubelet.cancel();
    }
}

fn dyn_api(client: &kube::Client, api_version: &str, kind: &str, plural: &str, ns: &str) -> Api<DynamicObject> {
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let ar = ApiResource {
        group: group.into(),
        version: version.into(),
        api_version: api_version.into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), ns, &ar)
}

fn policy(name: &str, spec: Value) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleConfigPolicy",
           "metadata": {"name": name, "namespace": NS}, "spec": spec})
}

fn central(on_invalid: &str) -> Value {
    policy(
        "central",
        json!({"module": "redis",
               "runtimeSelector": {"matchLabels": {"operator.fleetwatch.dev/region": "eu"}},
               "enforce": {"spec": {"tls": true}},
               "schema": {"type": "object", "properties": {"spec": {"type": "object",
                          "properties": {"replicas": {"type": "integer", "maximum": 5}}}}},
               "onInvalid": on_invalid}),
    )
}

impl Fleet {
    async fn start() -> Self {
        let pki = Pki::new();
        let (cp_sim, cp_kc) = sim_cluster(&pki, "control-plane").await;
        let (rt_sim, rt_kc) = sim_cluster(&pki, "rt1").await;
        let (rt2_sim, rt2_kc) = sim_cluster(&pki, "rt2").await;
        let cp = cp_sim.client().await.unwrap();
        let rt = rt_sim.client().await.unwrap();
        let rt2 = rt2_sim.client().await.unwrap();
        let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
        apply_json(&cp_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
        for (name, kc) in [("rt1", &rt_kc), ("rt2", &rt2_kc)] {
            apply_json(
                &cp_kc,
                &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{name}-kubeconfig"), "namespace": NS},
                        "stringData": {"config": std::fs::read_to_string(kc).unwrap()}}),
            );
        }
        apply_json(&cp_kc, &redis_template(NS, "1.0.0"));
        apply_json(
            &cp_kc,
            &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
                    "metadata": {"name": "redis", "namespace": NS},
                    "spec": {"moduleName": "redis", "channels": [{"channel": "regular", "version": "1.0.0"}]}}),
        );
        // The hub pushes a watch on the module's configuration: a user's edit reaches the
        // operator as an event.
        let wc = pki.path("wc");
        std::fs::create_dir_all(&wc).unwrap();
        std::fs::write(wc.join("redis.json"), json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig",
            "metadata": {"name": "redis-config"}, "spec": {"resource": {"group": "example.com", "version": "v1", "kind": "RedisConfig"},
            "fields": ["spec"], "subscriber": "lifecycle"}}).to_string()).unwrap();
        let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc.to_str().unwrap()]);
        let agent = kube_agent(&pki, "rt1", &hub.url(), &rt_kc);
        let agent2 = kube_agent(&pki, "rt2", &hub.url(), &rt2_kc);
        let sub = pki.subscriber("lifecycle");
        let metrics_port = free_port();
        let mut args: Vec<String> =
            ["lifecycle", "--control-plane-kubeconfig", cp_kc.to_str().unwrap(), "--hub", &hub.url()]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(client_args(&sub));
        // No periodic resync: only events (Runtime, policy, hub) can trigger.
        args.extend(["--resync".into(), "0".into(), "--metrics-listen".into(), format!("127.0.0.1:{metrics_port}")]);
        let lifecycle = Proc::spawn(&args, pki.path("lifecycle.log"));
        lifecycle.wait_stdout("lifecycle operator running", Duration::from_secs(10));
        let kubelet = tokio_util::sync::CancellationToken::new();
        tokio::spawn(fleetwatch_sim::roll_out_deployments(rt.clone(), Duration::ZERO, kubelet.clone()));
        tokio::spawn(fleetwatch_sim::roll_out_deployments(rt2.clone(), Duration::ZERO, kubelet.clone()));
        Fleet {
            _pki: pki,
            _cp_sim: cp_sim,
            cp_kc,
            cp,
            _rt_sim: rt_sim,
            rt,
            rt2_sim,
            rt2,
            _hub: hub,
            _agent: agent,
            _agent2: agent2,
            lifecycle,
            metrics_port,
            kubelet,
        }
    }

    fn configs(&self) -> Api<DynamicObject> {
        dyn_api(&self.rt, "example.com/v1", "RedisConfig", "redisconfigs", "redis-system")
    }

    fn policies(&self) -> Api<DynamicObject> {
        dyn_api(&self.cp, "operator.fleetwatch.dev/v1alpha1", "ModuleConfigPolicy", "moduleconfigpolicies", NS)
    }

    async fn config(&self) -> Value {
        self.configs().get_opt("default").await.unwrap().map(|o| o.data["spec"].clone()).unwrap_or(Value::Null)
    }

    /// The second runtime's configuration.
    async fn config2(&self) -> Value {
        dyn_api(&self.rt2, "example.com/v1", "RedisConfig", "redisconfigs", "redis-system")
            .get_opt("default")
            .await
            .unwrap()
            .map(|o| o.data["spec"].clone())
            .unwrap_or(Value::Null)
    }

    async fn status(&self) -> Option<RuntimeStatus> {
        Api::<Runtime>::namespaced(self.cp.clone(), NS).get_opt("rt1").await.ok().flatten().and_then(|r| r.status)
    }

    async fn user_edit(&self, spec: Value) {
        let pp = PatchParams { field_manager: Some("a-user".into()), ..Default::default() };
        self.configs().patch("default", &pp, &Patch::Merge(&json!({ "spec": spec }))).await.unwrap();
    }

    /// Waits until `cond` holds for what `probe` returns; fails with the lifecycle log.
    async fn until<T: std::fmt::Debug, F: Future<Output = T>>(
        &self,
        what: &str,
        probe: impl Fn() -> F,
        cond: impl Fn(&T) -> bool,
    ) -> T {
        let start = Instant::now();
        let v = eventually(what)
            .context(|| format!("lifecycle log:\n{}", self.lifecycle.stderr()))
            .until(async || probe().await, cond)
            .await;
        eprintln!("{what}: {:?}", start.elapsed());
        v
    }

    async fn module_status(&self) -> Option<ModuleStatus> {
        self.status().await.and_then(|s| s.modules.into_iter().find(|m| m.name == "redis"))
    }

    async fn module_status_of(&self, runtime: &str) -> Option<ModuleStatus> {
        let rt = Api::<Runtime>::namespaced(self.cp.clone(), NS).get_opt(runtime).await.ok().flatten()?;
        rt.status?.modules.into_iter().find(|m| m.name == "redis")
    }

    async fn policy_condition(&self, name: &str) -> (String, String, Value) {
        let p = self.policies().get_opt(name).await.unwrap();
        let status = p.map(|p| p.data["status"].clone()).unwrap_or(Value::Null);
        let ready = status["conditions"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["type"] == "Ready"))
            .cloned()
            .unwrap_or(Value::Null);
        (ready["reason"].as_str().unwrap_or("").into(), ready["message"].as_str().unwrap_or("").into(), status)
    }

    async fn event_reasons(&self) -> Vec<String> {
        let api = dyn_api(&self.cp, "events.k8s.io/v1", "Event", "events", NS);
        api.list(&Default::default())
            .await
            .map(|l| l.items.iter().filter_map(|e| e.data["reason"].as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    }
}

fn condition<'a>(m: &'a ModuleStatus, type_: &str) -> Option<&'a fleetwatch_api::Condition> {
    m.config.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

fn runtime(annotations: Value) -> Value {
    runtime_in("rt1", "eu", annotations)
}

fn runtime_in(name: &str, region: &str, annotations: Value) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
           "metadata": {"name": name, "namespace": NS, "labels": {"operator.fleetwatch.dev/region": region},
                        "annotations": annotations},
           "spec": {"clusterId": name, "kubeconfigSecret": {"name": format!("{name}-kubeconfig")}, "modules": [{"name": "redis"}]}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_configuration_takes_precedence() {
    let f = Fleet::start().await;
    apply_json(&f.cp_kc, &runtime(json!({})));
    apply_json(&f.cp_kc, &runtime_in("rt2", "us", json!({})));
    f.until("the default configuration", || f.config(), |c| c["size"] == 1).await;
    f.until("rt2's default configuration", || f.config2(), |c| c["size"] == 1).await;

    // 1. Enforced field applied, listed in the module status; the policy counts the runtime.
    apply_json(&f.cp_kc, &central("Report"));
    f.until("tls enforced", || f.config(), |c| c["tls"] == true).await;
    let m = f
        .until(
            "the enforced pointers in status",
            || f.module_status(),
            |m| m.as_ref().and_then(|m| m.config.as_ref()).is_some_and(|c| c.enforced == ["/spec/tls"]),
        )
        .await
        .unwrap();
    assert_eq!(condition(&m, "ConfigValid").unwrap().status, "True");
    f.until(
        "the policy's counts",
        || f.policy_condition("central"),
        |(reason, _, s)| reason == "Valid" && s["runtimesMatched"] == 1 && s["valid"] == 1,
    )
    .await;
    assert!(f.config2().await.get("tls").is_none(), "rt2 is not selected");

    // 2. A user edit of another field is kept; 3. an edit of the enforced field is reverted.
    f.user_edit(json!({"size": 3})).await;
    f.until("the user's size", || f.config(), |c| c["size"] == 3).await;
    f.user_edit(json!({"tls": false})).await;
    f.until("tls reverted", || f.config(), |c| c["tls"] == true).await;
    assert_eq!(f.config().await["size"], 3, "the user's own field stays");
    f.until("a ConfigEnforced Event", || f.event_reasons(), |r| r.iter().any(|r| r == "ConfigEnforced")).await;

    // 4. A schema violation is reported with its pointer, as an Event and a metric.
    f.user_edit(json!({"replicas": 9})).await;
    let m = f
        .until(
            "ConfigValid=False",
            || f.module_status(),
            |m| m.as_ref().and_then(|m| condition(m, "ConfigValid")).is_some_and(|c| c.status == "False"),
        )
        .await
        .unwrap();
    let errors = &m.config.as_ref().unwrap().errors;
    assert_eq!(errors[0].pointer, "/spec/replicas", "{errors:?}");
    assert_eq!(errors[0].policy, "central");
    assert!(errors[0].message.contains('5'), "{errors:?}");
    f.until("a ConfigInvalid Event", || f.event_reasons(), |r| r.iter().any(|r| r == "ConfigInvalid")).await;
    let metrics = http_get(f.metrics_port, "/metrics").await;
    assert!(metrics.contains("fleetwatch_lifecycle_module_config_invalid{module=\"redis\"} 1"), "{metrics}");
    f.until("the policy counts it invalid", || f.policy_condition("central"), |(_, _, s)| s["invalid"] == 1).await;

    // 5. Restore puts back the last valid configuration (size 3, tls on, no replicas).
    apply_json(&f.cp_kc, &central("Restore"));
    f.until("the last valid configuration", || f.config(), |c| c.get("replicas").is_none() && c["size"] == 3).await;
    f.until(
        "ConfigValid=True again",
        || f.module_status(),
        |m| m.as_ref().and_then(|m| condition(m, "ConfigValid")).is_some_and(|c| c.status == "True"),
    )
    .await;

    // Bad input: a clear condition, nothing applied.
    for (name, spec, says) in [
        ("bad-enforce", json!({"module": "redis", "enforce": "tls"}), "enforce must be an object"),
        ("bad-module", json!({"module": "nope", "enforce": {"spec": {"x": 1}}}), "unknown module"),
        (
            "bad-schema",
            json!({"module": "redis", "enforce": {}, "schema": {"type": "nonsense"}}),
            "not a valid JSON Schema",
        ),
    ] {
        apply_json(&f.cp_kc, &policy(name, spec));
        let (_, message, _) =
            f.until("InvalidSpec", || f.policy_condition(name), |(reason, _, _)| reason == "InvalidSpec").await;
        assert!(message.contains(says), "{name}: {message}");
    }
    // A policy selecting the other region: enforced there only.
    apply_json(
        &f.cp_kc,
        &policy(
            "us-only",
            json!({"module": "redis", "runtimeSelector": {"matchLabels": {"operator.fleetwatch.dev/region": "us"}},
                   "enforce": {"spec": {"zone": "us"}}}),
        ),
    );
    f.until("zone enforced in rt2", || f.config2(), |c| c["zone"] == "us").await;
    f.until(
        "us-only matches rt2",
        || f.policy_condition("us-only"),
        |(reason, _, s)| reason == "Valid" && s["runtimesMatched"] == 1,
    )
    .await;
    let m = f.module_status().await.unwrap();
    assert_eq!(
        m.config.unwrap().policies,
        vec!["central".to_string()],
        "unusable or unmatched policies are not in force"
    );
    assert!(f.config().await.get("zone").is_none());
    for name in ["bad-enforce", "bad-module", "bad-schema", "us-only"] {
        f.policies().delete(name, &DeleteParams::default()).await.unwrap();
    }

    // 6. Conflicting policies: an error in each, the conflicting field enforced by neither;
    // the other field of the second policy is enforced.
    apply_json(
        &f.cp_kc,
        &policy("other", json!({"module": "redis", "enforce": {"spec": {"tls": false, "mode": "fast"}}})),
    );
    f.until("mode enforced", || f.config(), |c| c["mode"] == "fast").await;
    for name in ["central", "other"] {
        let (_, message, _) =
            f.until("a Conflict condition", || f.policy_condition(name), |(reason, _, _)| reason == "Conflict").await;
        assert!(message.contains("/spec/tls"), "{message}");
    }
    let m = f.module_status().await.unwrap();
    assert_eq!(condition(&m, "ConfigEnforced").unwrap().reason, "Conflict");
    assert_eq!(f.config().await["tls"], true, "a conflicting field is released as it is, not flipped");

    // 7. Removing the policies releases their fields: they stay, and the user owns them.
    // `other` first: `central` alone then enforces tls on again, until it goes too.
    for name in ["other", "central"] {
        f.policies().delete(name, &DeleteParams::default()).await.unwrap();
    }
    f.until(
        "nothing enforced",
        || f.module_status(),
        |m| m.as_ref().is_some_and(|m| m.config.as_ref().is_none_or(|c| c.enforced.is_empty())),
    )
    .await;
    let c = f.config().await;
    assert_eq!((c["tls"].clone(), c["mode"].clone()), (json!(true), json!("fast")), "released fields stay: {c}");
    let before = f.status().await.unwrap().last_reconcile;
    f.user_edit(json!({"mode": "slow"})).await;
    // The edit's hub event reconciles the runtime; nothing puts the field back.
    f.until("a reconcile after the edit", || f.status(), |s| s.as_ref().unwrap().last_reconcile != before).await;
    assert_eq!(f.config().await["mode"], "slow");

    // 8. Reset: default + enforced, once; the annotation is removed; an Event says so.
    apply_json(&f.cp_kc, &central("Report"));
    f.until(
        "central in force again",
        || f.module_status(),
        |m| m.as_ref().and_then(|m| m.config.as_ref()).is_some_and(|c| c.enforced == ["/spec/tls"]),
    )
    .await;
    apply_json(&f.cp_kc, &runtime(json!({"operator.fleetwatch.dev/reset-config": "redis"})));
    f.until("default + enforced", || f.config(), |c| *c == json!({"size": 1, "tls": true})).await;
    f.until(
        "the annotation removed",
        || async {
            let rt = Api::<Runtime>::namespaced(f.cp.clone(), NS).get("rt1").await.unwrap();
            rt.metadata.annotations.unwrap_or_default().contains_key("operator.fleetwatch.dev/reset-config")
        },
        |has| !has,
    )
    .await;
    f.until("a ConfigReset Event", || f.event_reasons(), |r| r.iter().any(|r| r == "ConfigReset")).await;

    // 8b. `applyTo: ManagedResources`: every instance of the managed kinds, not only the
    // configuration object; a user's change of another instance is put back too.
    apply_json(
        &f.cp_kc,
        &policy(
            "all-configs",
            json!({"module": "redis", "applyTo": "ManagedResources", "enforce": {"spec": {"audit": true}}}),
        ),
    );
    f.until("audit on the configuration object", || f.config(), |c| c["audit"] == true).await;
    let extra: DynamicObject = serde_json::from_value(json!({"apiVersion": "example.com/v1", "kind": "RedisConfig",
        "metadata": {"name": "extra", "namespace": "redis-system"}, "spec": {"size": 2}}))
    .unwrap();
    f.configs().create(&Default::default(), &extra).await.unwrap();
    let extra_spec =
        || async { f.configs().get_opt("extra").await.unwrap().map(|o| o.data["spec"].clone()).unwrap_or(Value::Null) };
    f.until("audit on another instance", extra_spec, |c| c["audit"] == true && c["size"] == 2).await;
    let pp = PatchParams { field_manager: Some("a-user".into()), ..Default::default() };
    f.configs().patch("extra", &pp, &Patch::Merge(&json!({"spec": {"audit": false}}))).await.unwrap();
    f.until("audit put back on the other instance", extra_spec, |c| c["audit"] == true).await;
    f.policies().delete("all-configs", &DeleteParams::default()).await.unwrap();

    // 9. A runtime whose cluster cannot be reached is not reported valid.
    let us = |zone: &str| {
        policy(
            "us-only",
            json!({"module": "redis", "runtimeSelector": {"matchLabels": {"operator.fleetwatch.dev/region": "us"}},
                   "enforce": {"spec": {"zone": zone}}}),
        )
    };
    apply_json(&f.cp_kc, &us("us"));
    f.until("us-only valid in rt2", || f.policy_condition("us-only"), |(_, _, s)| s["valid"] == 1).await;
    f.rt2_sim.shutdown();
    apply_json(&f.cp_kc, &us("us-east"));
    f.until(
        "rt2 no longer valid",
        || f.module_status_of("rt2"),
        |m| m.as_ref().is_some_and(|m| condition(m, "ConfigValid").is_none_or(|c| c.status != "True")),
    )
    .await;
    f.until(
        "us-only counts rt2 neither valid nor gone",
        || f.policy_condition("us-only"),
        |(_, _, s)| s["valid"] == 0 && s["runtimesMatched"] == 1,
    )
    .await;
}

/// Revert latency (user write → enforced value back) over 100 edits: median and p99.
/// `cargo nextest run -p fleetwatch --test e2e config_policy::revert_latency --run-ignored only --no-capture`
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a measurement, not a check"]
async fn revert_latency() {
    let f = Fleet::start().await;
    apply_json(&f.cp_kc, &runtime(json!({})));
    apply_json(&f.cp_kc, &central("Report"));
    f.until("tls enforced", || f.config(), |c| c["tls"] == true).await;
    let mut took = Vec::new();
    for _ in 0..100 {
        let t0 = Instant::now();
        f.user_edit(json!({"tls": false})).await;
        eventually("the edit to be reverted")
            .every(Duration::from_millis(2))
            .until(async || f.config().await, |c| c["tls"] == true)
            .await;
        took.push(t0.elapsed());
    }
    took.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    eprintln!(
        "revert latency over {} edits: median {:.1} ms, p99 {:.1} ms, max {:.1} ms",
        took.len(),
        ms(took[took.len() / 2]),
        ms(took[took.len() * 99 / 100 - 1]),
        ms(took[took.len() - 1])
    );
}
