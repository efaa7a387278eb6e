//! Built-in agent certificates (`lifecycle --agent-ca-secret`): a Runtime added → the agent
//! module and its certificate Secret written into the runtime cluster → an agent started
//! from that Deployment with that Secret's files → connected to a real hub with the
//! Runtime's identity → the certificate rotated at two thirds of its lifetime → the agent
//! reconnects with the new one, nothing lost, nothing refused.
//!
//! The sim runs no pods, so this test is the kubelet: it starts the agent process with the
//! Deployment's args and environment, and keeps a directory in sync with the Secret the
//! way a kubelet updates a Secret volume (all files swapped at once through `..data`).

use std::collections::HashMap;
use std::path::Path;
use std::time::Duration;

use fleetwatch_protocol::Event;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use serde_json::{Value, json};

use crate::support::*;

const NS: &str = "kcp";
/// Where the Deployment mounts the Secret (the manifest's mountPath).
const MOUNT: &str = "/etc/fleetwatch/tls";

/// Writes a Secret's data into `dir` as a kubelet does: a fresh timestamped directory, then
/// the `..data` symlink swapped to it in one rename, with each key a symlink through it.
fn write_secret_volume(dir: &Path, secret: &Secret, generation: u64) {
    let fresh = dir.join(format!("..{generation}"));
    std::fs::create_dir_all(&fresh).unwrap();
    let data = secret.data.clone().unwrap_or_default();
    for (k, v) in &data {
        std::fs::write(fresh.join(k), &v.0).unwrap();
    }
    let tmp = dir.join("..data_tmp");
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(format!("..{generation}"), &tmp).unwrap();
    std::fs::rename(&tmp, dir.join("..data")).unwrap();
    for k in data.keys() {
        let link = dir.join(k);
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(format!("..data/{k}"), &link).unwrap();
        }
    }
}

/// Serial of the certificate in the Secret (as the hub shows serials: lower-case hex).
fn secret_serial(secret: &Secret) -> String {
    let pem = &secret.data.as_ref().unwrap()["tls.crt"].0;
    fleetwatch_certs::inspect_pem(std::str::from_utf8(pem).unwrap(), Path::new("tls.crt"))
        .unwrap()
        .serial
        .to_lowercase()
}

async fn wait_until<T: std::fmt::Debug>(what: &str, timeout: Duration, probe: impl AsyncFnMut() -> Option<T>) -> T {
    eventually(what).within(timeout).until(probe, Option::is_some).await.expect("until returns only what satisfies")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_runtime_gets_an_agent_whose_certificate_rotates_without_loss() {
    let pki = Pki::new();
    let (_cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let (rt_sim, rt_kc) = sim_cluster(&pki, "rt1").await;
    let rt = rt_sim.client().await.unwrap();
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    apply_json(&cp_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    // The CA, as `fleetwatch certs init` wrote it, in a control-plane Secret.
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "agent-ca", "namespace": NS},
                "stringData": {"ca.crt": std::fs::read_to_string(pki.path("ca.crt")).unwrap(),
                               "ca.key": std::fs::read_to_string(pki.path("ca.key")).unwrap()}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rt1-kubeconfig", "namespace": NS},
                "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}}),
    );
    // What the agent watches, and the hub.
    let wc = pki.path("wc");
    std::fs::create_dir_all(&wc).unwrap();
    std::fs::write(
        wc.join("cms.json"),
        json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": "cms"},
               "spec": {"resource": {"version": "v1", "kind": "ConfigMap"}, "namespace": "app",
                        "fields": ["data"], "project": ["/data/v"]}})
        .to_string(),
    )
    .unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc.to_str().unwrap()]);
    // The agent's ModuleTemplate, rendered by the binary from its one manifest source.
    let module = std::process::Command::new(BIN)
        .args(["agent-module", "--hub", &hub.url(), "--namespace", NS, "--module-version", "1.0.0"])
        .output()
        .unwrap();
    assert!(module.status.success(), "{}", String::from_utf8_lossy(&module.stderr));
    kubectl(&cp_kc, &["apply", "--server-side", "-f", "-"], Some(&String::from_utf8(module.stdout).unwrap()));

    // The operator, with a short certificate lifetime: renewal 30 s after issue.
    let mut args: Vec<String> = vec![
        "lifecycle".into(),
        "--control-plane-kubeconfig".into(),
        cp_kc.display().to_string(),
        "--leader-elect=false".into(),
        "--agent-ca-secret".into(),
        format!("{NS}/agent-ca"),
        "--agent-cert-lifetime".into(),
        "45s".into(),
    ];
    args.extend(["--hub".into(), hub.url()]);
    args.extend(client_args(&pki.subscriber("lifecycle")));
    let lifecycle = Proc::spawn(&args, pki.path("lifecycle.log"));
    lifecycle.wait_stdout("lifecycle operator running", Duration::from_secs(10));
    let kubelet = tokio_util::sync::CancellationToken::new();
    let _kubelet_guard = kubelet.clone().drop_guard();
    tokio::spawn(fleetwatch_sim::roll_out_deployments(rt.clone(), Duration::ZERO, kubelet.clone()));

    // Registering the cluster: one Runtime (and its kubeconfig Secret above).
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
                "metadata": {"name": "rt1", "namespace": NS},
                "spec": {"clusterId": "rt1", "kubeconfigSecret": {"name": "rt1-kubeconfig"}}}),
    );
    // Where the agent's manifest (the chart rendered) expects its certificate.
    let layout = fleetwatch_lifecycle::agent_module::layout().unwrap();
    let secret_name = layout.secret.clone();
    let secrets: Api<Secret> = Api::namespaced(rt.clone(), &layout.namespace);
    let deployments: Api<Deployment> = Api::namespaced(rt.clone(), &layout.namespace);
    let first = wait_until("the certificate Secret in the runtime cluster", Duration::from_secs(60), async || {
        secrets.get_opt(&secret_name).await.ok().flatten()
    })
    .await;
    // The right identity, for clients, from the Secret's CA; the hub's CA bundle with it.
    let cert_pem = String::from_utf8(first.data.as_ref().unwrap()["tls.crt"].0.clone()).unwrap();
    let info = fleetwatch_certs::inspect_pem(&cert_pem, Path::new("tls.crt")).unwrap();
    assert_eq!(info.identity.unwrap().to_string(), "spiffe://test.local/cluster/rt1");
    assert_eq!(info.extended_key_usage, Some(vec!["clientAuth".to_string()]));
    assert_eq!(
        first.data.as_ref().unwrap()["ca.crt"].0,
        std::fs::read(pki.path("ca.crt")).unwrap(),
        "the agent trusts the hub's CA"
    );
    let lifetime = info.not_after.as_second() - jiff::Timestamp::now().as_second();
    assert!(lifetime <= 45, "issued for the configured lifetime, {lifetime}s left");
    let deployment = wait_until("the agent Deployment", Duration::from_secs(60), async || {
        deployments.get_opt("fleetwatch-agent").await.ok().flatten()
    })
    .await;

    // The kubelet: the Secret's data in a directory, kept in sync.
    let volume = pki.path("agent-tls");
    std::fs::create_dir_all(&volume).unwrap();
    write_secret_volume(&volume, &first, 0);
    {
        let (secrets, volume, stop, name) = (secrets.clone(), volume.clone(), kubelet.clone(), secret_name.clone());
        let mut version = first.metadata.resource_version.clone();
        tokio::spawn(async move {
            let mut generation = 0;
            while !stop.is_cancelled() {
                if let Ok(Some(s)) = secrets.get_opt(&name).await
                    && s.metadata.resource_version != version
                {
                    generation += 1;
                    write_secret_volume(&volume, &s, generation);
                    version = s.metadata.resource_version.clone();
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        });
    }
    // The agent process, started with the Deployment's args and environment, its mount
    // path pointing at the synced directory, its health port on a free loopback port (and
    // the sim's kubeconfig: a sim gives no in-cluster configuration).
    let pod = deployment.spec.template.spec.expect("a pod template");
    let container = &pod.containers[0];
    let health_port = free_port();
    let local = |v: &str| -> String {
        let v = v.replace(MOUNT, volume.to_str().unwrap());
        match v.strip_prefix("--health-listen=") {
            Some(_) => format!("--health-listen=127.0.0.1:{health_port}"),
            None => v,
        }
    };
    let agent_args: Vec<String> = container.args.clone().unwrap().iter().map(|a| local(a)).collect();
    assert!(agent_args.contains(&format!("--hub={}", hub.url())), "{agent_args:?}");
    let mut env: Vec<(String, String)> = container
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name, local(&e.value.unwrap_or_default())))
        .collect();
    env.push(("FLEETWATCH_KUBECONFIG".into(), rt_kc.display().to_string()));
    env.push(("FLEETWATCH_TLS_RELOAD_INTERVAL".into(), "1".into()));
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let agent = Proc::spawn_with_env(&agent_args, pki.path("agent.log"), &env_refs);

    // A durable subscriber, and a writer changing ConfigMaps throughout.
    let collector = Collector::start(&pki, &hub.url(), "audit").await;
    kubectl(&rt_kc, &["apply", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"app"}}"#));
    let cms: Api<DynamicObject> =
        Api::namespaced_with(rt.clone(), "app", &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()));
    let stop = tokio_util::sync::CancellationToken::new();
    let writer = {
        let (cms, stop) = (cms.clone(), stop.clone());
        tokio::spawn(async move {
            let mut i: u64 = 0;
            while !stop.is_cancelled() {
                let name = format!("cm-{}", i % 20);
                let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": i.to_string()}});
                let _ = cms.patch(&name, &PatchParams::apply("writer").force(), &Patch::Apply(&obj)).await;
                i += 1;
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            i
        })
    };

    // Connected with the Runtime's identity and the first certificate.
    let first_serial = secret_serial(&first);
    let cluster = |c: &Value| c["clusters"].as_array().and_then(|a| a.iter().find(|c| c["cluster"] == "rt1").cloned());
    wait_until("rt1 connected with the first certificate", Duration::from_secs(30), async || {
        cluster(&hub.clusters().await).filter(|c| c["connected"] == true && c["certSerial"] == first_serial.as_str())
    })
    .await;

    // Rotated: a new certificate in the Secret before the old one expires, and the agent
    // reconnected with it.
    let second = wait_until("the certificate renewed", Duration::from_secs(60), async || {
        secrets.get_opt(&secret_name).await.ok().flatten().filter(|s| secret_serial(s) != first_serial)
    })
    .await;
    let second_serial = secret_serial(&second);
    let renewed_at = jiff::Timestamp::now();
    assert!(renewed_at < info.not_after, "renewed at {renewed_at}, after the old one expired at {}", info.not_after);
    let rt1 = wait_until("rt1 connected with the renewed certificate", Duration::from_secs(30), async || {
        cluster(&hub.clusters().await).filter(|c| c["connected"] == true && c["certSerial"] == second_serial.as_str())
    })
    .await;
    assert!(rt1["sessions"].as_u64().unwrap() >= 2, "{rt1}");

    // Nothing lost: the subscriber has every ConfigMap's final state.
    stop.cancel();
    let writes = writer.await.unwrap();
    assert!(writes > 100, "the writer made only {writes} changes");
    let finals = configmap_values(&cms, "app").await;
    let missing = |seen: &Seen| -> Vec<String> {
        let mut latest: HashMap<&str, &Event> = HashMap::new();
        for e in seen.all.iter().filter(|e| e.cluster == "rt1" && e.watch.as_deref() == Some("cms")) {
            latest.insert(&e.subject, e);
        }
        finals
            .iter()
            .filter(|(s, v)| latest.get(s.as_str()).is_none_or(|e| e.data["projected"]["/data/v"] != v.as_str()))
            .map(|(s, v)| format!("{s}: want v={v}, latest {:?}", latest.get(s.as_str()).map(|e| &e.data["projected"])))
            .collect()
    };
    let complete = holds_within(Duration::from_secs(30), || missing(&collector.seen.lock().unwrap()).is_empty()).await;
    assert!(complete, "lost: {:?}\nagent log:\n{}", missing(&collector.seen.lock().unwrap()), agent.stderr());
    // Same epoch across the renewal: no resync beyond the agent's start.
    let resyncs = collector.seen.lock().unwrap().resyncs.get("rt1").map_or(0, Vec::len);
    assert_eq!(resyncs, 1, "{:?}", collector.seen.lock().unwrap().resyncs);

    // Nothing refused or cut off: no failed handshake, no session ended for its certificate.
    let metrics = http_get(hub.admin_port, "/metrics").await;
    let sum = |family: &str| -> f64 {
        metrics
            .lines()
            .filter(|l| l.starts_with(family))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    };
    assert_eq!(sum("fleetwatch_hub_handshake_failures_total{"), 0.0, "{metrics}");
    assert_eq!(sum("fleetwatch_hub_sessions_ended_total{"), 0.0, "{metrics}");
    assert_eq!(sum("fleetwatch_hub_cluster_conflicts_total"), 0.0, "{metrics}");
    let log = agent.stderr();
    assert!(log.contains("reconnecting with the renewed certificate"), "{log}");
    assert!(!log.contains("refused"), "{log}");
    // The operator says when it renews, on the Runtime's Events and in its log.
    assert!(lifecycle.stderr().contains(&second_serial), "{}", lifecycle.stderr());
}
