//! Deployment: the plain manifests rendered from the Helm charts (`deploy/manifests/`, kept
//! current by `scripts/manifests.sh --check`) against sim clusters.
//!
//! - They apply cleanly with `kubectl apply --server-side`, twice, and every pod they define
//!   is restricted (non-root, read-only root, no escalation, no capabilities, seccomp),
//!   memory-limited and probed on an endpoint the binary serves.
//! - Every workload runs with its rendered args and environment: the files its volumes
//!   would hold are written to temporary directories (paths remapped), listen addresses move
//!   to free loopback ports, and each process talks to a sim cluster **with its own
//!   ServiceAccount's token under the sim's RBAC**, so the charts' Roles are proven
//!   sufficient: the hub reads WatchConfigs, the lifecycle operator takes its Lease and
//!   brings a Runtime to Ready, the agent watches what a WatchConfig names. The agent's
//!   read-only ClusterRole is proven narrow: a kind outside it is reported `forbidden` with
//!   the API server's 403, and a write with its token is refused with 403.
//! - The cert-manager mode renders Certificates with the SPIFFE URI SAN, the right usages
//!   and renewal well before expiry, wired to the Secrets and trust bundle the pods mount.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use fleetwatch_protocol::identity::Identity;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

use crate::support::*;

/// The repository root.
fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn manifest_path(name: &str) -> PathBuf {
    repo().join("deploy/manifests").join(name)
}

/// The documents of a multi-document YAML stream (empty documents left out).
fn documents(yaml: &str) -> Vec<Value> {
    serde_saphyr::from_multiple::<Value>(yaml)
        .expect("rendered YAML parses (no duplicate keys)")
        .into_iter()
        .filter(|d| !d.is_null())
        .collect()
}

fn manifest(name: &str) -> Vec<Value> {
    let path = manifest_path(name);
    documents(&std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
}

/// `kind/namespace/name` of a document.
fn key(d: &Value) -> String {
    format!(
        "{}/{}/{}",
        d["kind"].as_str().unwrap_or("?"),
        d["metadata"]["namespace"].as_str().unwrap_or("_"),
        d["metadata"]["name"].as_str().unwrap_or("?")
    )
}

fn find<'a>(docs: &'a [Value], kind: &str, name: &str) -> &'a Value {
    docs.iter()
        .find(|d| d["kind"] == kind && d["metadata"]["name"] == name)
        .unwrap_or_else(|| panic!("no {kind} {name} in {:?}", docs.iter().map(key).collect::<Vec<_>>()))
}

/// Runs helm (installed by scripts/test.sh, see scripts/helm.sh); `Err(stderr)` on failure.
fn helm_template(chart: &str, namespace: &str, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = std::process::Command::new("helm");
    cmd.args(["template", chart]).arg(repo().join("deploy/helm").join(chart)).args(["--namespace", namespace]);
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm on PATH (bash scripts/helm.sh installs it)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into());
    }
    Ok(documents(&String::from_utf8_lossy(&out.stdout)))
}

/// kubectl that may fail: (success, stdout, stderr).
fn kubectl_try(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("kubectl on PATH");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

async fn sim(name: &str, rbac: bool) -> fleetwatch_sim::SimCluster {
    fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions { name: name.into(), rbac, ..Default::default() })
        .await
        .unwrap()
}

/// The pod template of a workload document.
fn pod_spec(d: &Value) -> &Value {
    &d["spec"]["template"]["spec"]
}

fn workloads(docs: &[Value]) -> Vec<&Value> {
    docs.iter().filter(|d| matches!(d["kind"].as_str(), Some("Deployment" | "StatefulSet" | "DaemonSet"))).collect()
}

/// A pod is restricted (non-root 65532, read-only root, no escalation, no capabilities,
/// seccomp), memory-limited and probed on ports its container declares.
fn assert_restricted_and_probed(w: &Value) {
    let spec = pod_spec(w);
    let k = key(w);
    assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{k}");
    assert_eq!(spec["securityContext"]["runAsUser"], 65532, "{k}");
    assert_eq!(spec["securityContext"]["seccompProfile"]["type"], "RuntimeDefault", "{k}");
    for c in spec["containers"].as_array().unwrap() {
        let sc = &c["securityContext"];
        assert_eq!(sc["readOnlyRootFilesystem"], true, "{k}");
        assert_eq!(sc["allowPrivilegeEscalation"], false, "{k}");
        assert_eq!(sc["runAsNonRoot"], true, "{k}");
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]), "{k}");
        assert_eq!(sc["seccompProfile"]["type"], "RuntimeDefault", "{k}");
        assert!(c["resources"]["limits"]["memory"].is_string(), "{k}: no memory limit");
        for probe in ["livenessProbe", "readinessProbe"] {
            let port = &c[probe]["httpGet"]["port"];
            assert!(
                c["ports"].as_array().unwrap().iter().any(|p| &p["name"] == port),
                "{k}: {probe} on a port the container does not declare"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_manifests_apply_server_side_and_every_pod_is_restricted_and_probed() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = sim("deploy", false).await;
    let kc = dir.path().join("sim.kubeconfig");
    cluster.write_kubeconfig(&kc).unwrap();
    for name in ["control-plane.yaml", "agent.yaml"] {
        let docs = manifest(name);
        let path = manifest_path(name);
        let file = path.to_str().unwrap();
        let first = kubectl(&kc, &["apply", "--server-side", "--field-manager=fleetwatch-test", "-f", file], None);
        assert_eq!(
            first.lines().filter(|l| l.ends_with("serverside-applied")).count(),
            docs.len(),
            "{name}: one applied line per document:\n{first}"
        );
        // CRDs become Established in the background; wait, so that only the apply can change things.
        if docs.iter().any(|d| d["kind"] == "CustomResourceDefinition") {
            kubectl(&kc, &["wait", "--for=condition=Established", "--all", "crd", "--timeout=60s"], None);
        }
        // Every document is there, as written, and a second apply changes none of them.
        let state = || {
            let got: Value = serde_json::from_str(&kubectl(&kc, &["get", "-f", file, "-o", "json"], None)).unwrap();
            got["items"]
                .as_array()
                .unwrap()
                .iter()
                .map(|o| (key(o), o["metadata"]["resourceVersion"].as_str().unwrap().to_string()))
                .collect::<Vec<_>>()
        };
        let before = state();
        let want: Vec<String> = docs.iter().map(key).collect();
        assert_eq!(before.iter().map(|(k, _)| k.clone()).collect::<Vec<_>>(), want, "{name}");
        kubectl(&kc, &["apply", "--server-side", "--field-manager=fleetwatch-test", "-f", file], None);
        assert_eq!(state(), before, "{name}: a second apply changed objects");

        let pods = workloads(&docs);
        assert!(!pods.is_empty(), "{name} has no workload");
        for w in pods {
            assert_restricted_and_probed(w);
        }
    }
    // The agent's ClusterRole reads, and only reads.
    let agent = manifest("agent.yaml");
    let role = find(&agent, "ClusterRole", "fleetwatch-agent");
    for rule in role["rules"].as_array().unwrap() {
        assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{rule}");
        assert!(!rule["resources"].as_array().unwrap().contains(&json!("secrets")), "{rule}");
    }
}

/// The files a pod's volumes would hold, by volume source name (Secret or ConfigMap).
type VolumeFiles = BTreeMap<String, Vec<(&'static str, PathBuf)>>;

/// A rendered container started as a local process.
struct Workload {
    proc: Proc,
    /// containerPort → the loopback port it listens on here.
    ports: BTreeMap<u64, u16>,
    container: Value,
}

impl Workload {
    /// Starts the first container of workload `name` (kind `kind`) in `docs` with its args
    /// and environment. Volumes become directories filled from `files`; `0.0.0.0:PORT`
    /// listen addresses become free loopback ports; `--hub` URLs point at `hub_url`; the
    /// in-cluster configuration is `kubeconfig` (what the pod's ServiceAccount token gives).
    fn start(
        docs: &[Value],
        kind: &str,
        name: &str,
        files: &VolumeFiles,
        hub_url: Option<&str>,
        kubeconfig: &Path,
        dir: &Path,
    ) -> Self {
        let w = find(docs, kind, name);
        let ns = w["metadata"]["namespace"].as_str().unwrap().to_string();
        let spec = pod_spec(w);
        let container = spec["containers"][0].clone();
        // Volumes → local directories with the files they would hold.
        let mut mounts: Vec<(String, PathBuf)> = Vec::new();
        for m in container["volumeMounts"].as_array().into_iter().flatten() {
            let vname = m["name"].as_str().unwrap();
            let local = dir.join(format!("{name}-{vname}"));
            std::fs::create_dir_all(&local).unwrap();
            let volume = spec["volumes"].as_array().into_iter().flatten().find(|v| v["name"] == vname);
            let source = volume.and_then(|v| {
                v["secret"]["secretName"].as_str().or_else(|| v["configMap"]["name"].as_str()).map(str::to_string)
            });
            match source {
                Some(src) => {
                    let content =
                        files.get(&src).unwrap_or_else(|| panic!("{name}: no files given for volume source {src}"));
                    for (file, from) in content {
                        std::fs::copy(from, local.join(file)).unwrap();
                    }
                }
                // An emptyDir (the operator's artifact cache) or a claim (a relay's dead
                // letters): an empty directory.
                None if volume.is_some_and(|v| v["emptyDir"].is_object() || v["persistentVolumeClaim"].is_object()) => {
                }
                // A claim template (the hub's data): an empty directory.
                None => assert!(
                    w["spec"]["volumeClaimTemplates"]
                        .as_array()
                        .into_iter()
                        .flatten()
                        .any(|t| t["metadata"]["name"] == vname),
                    "{name}: volume {vname} has no source"
                ),
            }
            mounts.push((m["mountPath"].as_str().unwrap().to_string(), local));
        }
        let mut ports = BTreeMap::new();
        let mut args = Vec::new();
        for a in container["args"].as_array().unwrap() {
            let a = a.as_str().unwrap();
            let Some((flag, value)) = a.split_once('=') else {
                args.push(a.to_string());
                continue;
            };
            let value = if let Some(port) = value.strip_prefix("0.0.0.0:") {
                let local = free_port();
                ports.insert(port.parse::<u64>().unwrap(), local);
                format!("127.0.0.1:{local}")
            } else if flag == "--hub" {
                hub_url.unwrap_or_else(|| panic!("{name} dials a hub")).to_string()
            } else if let Some((mount, local)) =
                mounts.iter().find(|(m, _)| value.starts_with(&format!("{m}/")) || value == m)
            {
                format!("{}{}", local.display(), &value[mount.len()..])
            } else {
                value.to_string()
            };
            args.push(format!("{flag}={value}"));
        }
        let mut env: Vec<(String, String)> = vec![("KUBECONFIG".into(), kubeconfig.display().to_string())];
        for e in container["env"].as_array().into_iter().flatten() {
            let value = match (&e["value"], e["valueFrom"]["fieldRef"]["fieldPath"].as_str()) {
                (Value::String(v), _) => v.clone(),
                (_, Some("metadata.namespace")) => ns.clone(),
                (_, Some("metadata.name")) => format!("{name}-0"),
                other => panic!("{name}: env {e} not understood: {other:?}"),
            };
            env.push((e["name"].as_str().unwrap().into(), value));
        }
        let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        let proc = Proc::spawn_with_env(&args, dir.join(format!("{name}.log")), &env_refs);
        Self { proc, ports, container }
    }

    /// The loopback port of the named container port.
    fn port(&self, name: &str) -> u16 {
        let p = self.container["ports"].as_array().unwrap().iter().find(|p| p["name"] == name).unwrap();
        self.ports[&p["containerPort"].as_u64().unwrap()]
    }

    /// Waits until the readiness probe's endpoint answers 200 (liveness too); `Err` with the
    /// log when the process exited first or did not get ready within 60 s.
    async fn ready(&mut self, what: &str) -> Result<(), String> {
        let probe = |p: &str| {
            let get = &self.container[p]["httpGet"];
            (get["path"].as_str().unwrap().to_string(), self.port(get["port"].as_str().unwrap()))
        };
        let (ready_path, ready_port) = probe("readinessProbe");
        let (live_path, live_port) = probe("livenessProbe");
        // (exit status, readiness answer, liveness answer)
        let child = &mut self.proc.child;
        let log = &self.proc.log;
        let (exited, _, _) = eventually(format!("{what}: {ready_path} and {live_path} to answer 200"))
            .context(|| std::fs::read_to_string(log).unwrap_or_default())
            .until(
                async || match child.try_wait().unwrap() {
                    Some(code) => (Some(code), None, None),
                    None => {
                        let ready = http_status(ready_port, &ready_path).await;
                        let live = if ready == Some(200) { http_status(live_port, &live_path).await } else { None };
                        (None, ready, live)
                    }
                },
                |(exited, ready, live)| exited.is_some() || (*ready == Some(200) && *live == Some(200)),
            )
            .await;
        match exited {
            Some(code) => Err(format!("{what} exited ({code}) before it was ready:\n{}", self.proc.stderr())),
            None => Ok(()),
        }
    }
}

/// [`Workload::start`], then waits until it is ready. The free ports it picks can be taken
/// by another process before it binds them: then it starts again on new ones.
#[allow(clippy::too_many_arguments)]
async fn start_ready(
    docs: &[Value],
    kind: &str,
    name: &str,
    files: &VolumeFiles,
    hub_url: Option<&str>,
    kubeconfig: &Path,
    dir: &Path,
) -> Workload {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let mut w = Workload::start(docs, kind, name, files, hub_url, kubeconfig, dir);
        match w.ready(name).await {
            Ok(()) => return w,
            Err(e) if attempt < 3 && e.contains("Address already in use") => continue,
            Err(e) => panic!("{}", tail(&e)),
        }
    }
}

/// The last lines of a process log, for failure messages.
fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(30)..].join("\n")
}

/// The status code of `GET path` on a loopback port, `None` when nothing answers.
async fn http_status(port: u16, path: &str) -> Option<u16> {
    http_status_with(port, path, "").await
}

/// The access policy the rendered hub reads (the chart's ConfigMap, as the kubelet mounts it).
fn access_policy_file(docs: &[Value], dir: &Path) -> PathBuf {
    let cm = find(docs, "ConfigMap", "fleetwatch-hub-access-policy");
    let path = dir.join("access-policy.yaml");
    std::fs::write(&path, cm["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    path
}

/// The admin token the rendered hub reads (the Secret `fleetwatch-hub-admin-token` holds).
const ADMIN_TOKEN: &str = "test-admin-token-0123456789";

fn admin_token_file(pki: &Pki) -> PathBuf {
    let path = pki.path("admin-token");
    std::fs::write(&path, format!("{ADMIN_TOKEN}\n")).unwrap();
    path
}

/// The body of `GET path` on the hub's admin port, with the admin token.
async fn admin_get(port: u16, path: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return String::new() };
    let req = format!("GET {path} HTTP/1.0\r\nHost: x\r\nAuthorization: Bearer {ADMIN_TOKEN}\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// The status code of `GET path` with extra header lines (each ending in CRLF).
async fn http_status_with(port: u16, path: &str, headers: &str) -> Option<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.ok()?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{headers}\r\n").as_bytes()).await.ok()?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.ok()?;
    buf.split_whitespace().nth(1)?.parse().ok()
}

async fn wait_until<F: std::future::Future<Output = bool>>(
    what: &str,
    mut cond: impl FnMut() -> F,
    log: &dyn Fn() -> String,
) {
    eventually(what).context(log).until(async || cond().await, |held| *held).await;
}

fn watch_config(name: &str, resource: Value, extra: Value) -> Value {
    let mut spec = json!({"resource": resource});
    for (k, v) in extra.as_object().unwrap() {
        spec[k] = v.clone();
    }
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": name}, "spec": spec})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rendered_workloads_run_with_their_args_and_service_account_rbac() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let cp_docs = manifest("control-plane.yaml");
    let agent_docs = manifest("agent.yaml");

    // A control plane and a runtime cluster, both enforcing RBAC for ServiceAccounts.
    let cp = sim("control-plane", true).await;
    let rt = sim("eu-1", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    let rt_kc = dir.join("rt.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    rt.write_kubeconfig(&rt_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    kubectl(&rt_kc, &["apply", "--server-side", "-f", manifest_path("agent.yaml").to_str().unwrap()], None);
    let ns =
        find(&cp_docs, "Deployment", "fleetwatch-lifecycle")["metadata"]["namespace"].as_str().unwrap().to_string();
    let agent_ns =
        find(&agent_docs, "Deployment", "fleetwatch-agent")["metadata"]["namespace"].as_str().unwrap().to_string();
    // Each process gets its own ServiceAccount's token, as in its pod.
    let sa_kubeconfig = |sim: &fleetwatch_sim::SimCluster, ns: &str, docs: &[Value], workload: (&str, &str)| {
        let sa = pod_spec(find(docs, workload.0, workload.1))["serviceAccountName"].as_str().unwrap().to_string();
        let path = dir.join(format!("{sa}.kubeconfig"));
        sim.write_kubeconfig_for(&path, ns, &sa).unwrap();
        path
    };
    let hub_kc = sa_kubeconfig(&cp, &ns, &cp_docs, ("StatefulSet", "fleetwatch-hub"));
    let lifecycle_kc = sa_kubeconfig(&cp, &ns, &cp_docs, ("Deployment", "fleetwatch-lifecycle"));
    let agent_kc = sa_kubeconfig(&rt, &agent_ns, &agent_docs, ("Deployment", "fleetwatch-agent"));

    // What the Secrets and the trust bundle ConfigMap would hold (cert-manager's key names).
    let agent_files = pki.agent("eu-1");
    let lifecycle_files = pki.subscriber("lifecycle");
    let ca = pki.path("ca.crt");
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&cp_docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", ca.clone())]);
    files.insert(
        "fleetwatch-lifecycle-tls".into(),
        vec![("tls.crt", lifecycle_files.cert.clone()), ("tls.key", lifecycle_files.key.clone())],
    );
    files.insert(
        "fleetwatch-agent-tls".into(),
        vec![("tls.crt", agent_files.cert.clone()), ("tls.key", agent_files.key.clone()), ("ca.crt", ca.clone())],
    );

    // WatchConfigs in the control plane: one within the agent's ClusterRole, one outside it.
    kubectl(&rt_kc, &["create", "namespace", "apps"], None);
    apply_json(
        &cp_kc,
        &watch_config(
            "app-config",
            json!({"version": "v1", "kind": "ConfigMap"}),
            json!({"namespace": "apps", "fields": ["data"]}),
        ),
    );
    apply_json(
        &cp_kc,
        &watch_config("app-secrets", json!({"version": "v1", "kind": "Secret"}), json!({"namespace": "apps"})),
    );

    // The hub, reading WatchConfigs with its own token.
    let hub = start_ready(&cp_docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, &dir).await;
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));
    let admin = hub.port("admin");
    // The admin port needs the token from the Secret (the ServiceMonitor sends it); probes do not.
    let bearer = format!("Authorization: Bearer {ADMIN_TOKEN}\r\n");
    assert_eq!(http_status_with(admin, "/metrics", &bearer).await, Some(200), "the ServiceMonitor's hub endpoint");
    assert_eq!(http_status(admin, "/metrics").await, Some(401), "the admin API without the token");
    assert_eq!(http_status(admin, "/api/v1/clusters").await, Some(401), "the admin API without the token");
    // The hub follows Runtimes (for the web view) under its ClusterRole: a watch the RBAC
    // allows, so the view is up to date and names no error.
    eventually("the hub to follow Runtimes under its RBAC")
        .context(|| format!("hub log:\n{}", tail(&hub.proc.stderr())))
        .until(
            async || -> Value { serde_json::from_str(&admin_get(admin, "/api/v1/runtimes").await).unwrap_or_default() },
            |view| view["updated"].is_string() && view["error"].is_null(),
        )
        .await;

    // The agent with the agent chart's ServiceAccount.
    let agent =
        start_ready(&agent_docs, "Deployment", "fleetwatch-agent", &files, Some(&hub_url), &agent_kc, &dir).await;
    let collector = Collector::start(&pki, &hub_url, "ops").await;

    // It watches what the WatchConfig names…
    apply_json(
        &rt_kc,
        &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "color", "namespace": "apps"}, "data": {"color": "blue"}}),
    );
    let seen = holds_within(Duration::from_secs(30), || {
        collector.seen.lock().unwrap().all.iter().any(|e| {
            e.cluster == "eu-1" && e.watch.as_deref() == Some("app-config") && e.subject == "v1/ConfigMap/apps/color"
        })
    })
    .await;
    assert!(seen, "no event for apps/color; agent log:\n{}", tail(&agent.proc.stderr()));

    // …and is refused a kind outside its ClusterRole, with the API server's 403.
    let forbidden = format!(
        "secrets is forbidden: User \"system:serviceaccount:{agent_ns}:fleetwatch-agent\" cannot list resource \"secrets\" in API group \"\" in the namespace \"apps\""
    );
    let last = eventually("the Secret watch to be reported forbidden")
        .context(|| format!("agent log:\n{}", tail(&agent.proc.stderr())))
        .until(
            async || {
                let body = admin_get(admin, "/api/v1/clusters").await;
                let clusters: Value = serde_json::from_str(&body).unwrap_or_default();
                clusters["clusters"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|c| c["cluster"] == "eu-1")
                    .flat_map(|c| c["watches"].as_array().cloned().unwrap_or_default())
                    .find(|w| w["name"] == "app-secrets")
            },
            |watch| watch.as_ref().is_some_and(|w| w["phase"] == "forbidden"),
        )
        .await
        .expect("until returns only what satisfies the condition");
    assert_eq!(last["message"].as_str(), Some(forbidden.as_str()), "{last}");

    // A write with the agent's token is refused too.
    let agent_client = kube::Client::try_from(
        kube::Config::from_custom_kubeconfig(
            kube::config::Kubeconfig::read_from(&agent_kc).unwrap(),
            &kube::config::KubeConfigOptions::default(),
        )
        .await
        .unwrap(),
    )
    .unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(agent_client, "apps");
    let write = cms
        .create(&PostParams::default(), &serde_json::from_value(json!({"metadata": {"name": "evil"}})).unwrap())
        .await;
    match write {
        Err(kube::Error::Api(s)) => {
            assert_eq!(s.code, 403);
            assert_eq!(
                s.message,
                format!(
                    "configmaps is forbidden: User \"system:serviceaccount:{agent_ns}:fleetwatch-agent\" cannot create resource \"configmaps\" in API group \"\" in the namespace \"apps\""
                )
            );
        }
        other => panic!("a write with the agent's token was not refused: {other:?}"),
    }

    // The lifecycle operator with its own token: takes its Lease and brings a Runtime to Ready.
    let (ok, _, _) = kubectl_try(&cp_kc, &["get", "lease", "fleetwatch-lifecycle", "-n", &ns]);
    assert!(!ok, "no Lease before the operator runs");
    let lifecycle =
        start_ready(&cp_docs, "Deployment", "fleetwatch-lifecycle", &files, Some(&hub_url), &lifecycle_kc, &dir).await;
    assert_eq!(
        http_status(lifecycle.port("metrics"), "/metrics").await,
        Some(200),
        "the ServiceMonitor's operator endpoint"
    );
    let holder = |kc: PathBuf, ns: String| async move {
        let (ok, out, _) = kubectl_try(
            &kc,
            &["get", "lease", "fleetwatch-lifecycle", "-n", &ns, "-o", "jsonpath={.spec.holderIdentity}"],
        );
        ok && out.starts_with("fleetwatch-lifecycle-0")
    };
    wait_until("the lifecycle Lease to be held", || holder(cp_kc.clone(), ns.clone()), &|| {
        tail(&lifecycle.proc.stderr())
    })
    .await;

    let kubelet = tokio_util::sync::CancellationToken::new();
    let _stop = kubelet.clone().drop_guard();
    tokio::spawn(fleetwatch_sim::roll_out_deployments(rt.client().await.unwrap(), Duration::ZERO, kubelet));
    let runtime_kubeconfig = std::fs::read_to_string(&rt_kc).unwrap();
    // The kubeconfig goes where the operator reads kubeconfigs: their own namespace.
    let kubeconfig_ns = arg(find(&cp_docs, "Deployment", "fleetwatch-lifecycle"), "--kubeconfig-namespace").to_string();
    assert_ne!(kubeconfig_ns, ns, "kubeconfigs are kept apart from the hub's Secrets");
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "eu-1-kubeconfig", "namespace": kubeconfig_ns}, "stringData": {"config": runtime_kubeconfig}}),
    );
    apply_json(
        &cp_kc,
        &json!({
            "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
            "metadata": {"name": "hello-1.0.0", "namespace": ns},
            "spec": {"moduleName": "hello", "version": "1.0.0",
                     "manifest": [
                         {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hello-system"}},
                         {"apiVersion": "apps/v1", "kind": "Deployment",
                          "metadata": {"name": "hello-manager", "namespace": "hello-system",
                                       "labels": {"operator.fleetwatch.dev/module": "hello", "app.kubernetes.io/version": "1.0.0"}},
                          "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "hello"}},
                                   "template": {"metadata": {"labels": {"app": "hello"}},
                                                "spec": {"containers": [{"name": "manager", "image": "hello:1.0.0"}]}}}}],
                     "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "hello-system", "name": "hello-manager"}}
        }),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
        "metadata": {"name": "hello", "namespace": ns},
        "spec": {"moduleName": "hello", "channels": [{"channel": "regular", "version": "1.0.0"}]}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "eu-1", "namespace": ns},
        "spec": {"clusterId": "eu-1", "kubeconfigSecret": {"name": "eu-1-kubeconfig"}, "modules": [{"name": "hello"}]}}),
    );
    let state = |kc: PathBuf, ns: String| async move {
        let (ok, out, _) = kubectl_try(&kc, &["get", "runtime", "eu-1", "-n", &ns, "-o", "jsonpath={.status.state}"]);
        ok && out == "Ready"
    };
    wait_until("Runtime eu-1 to be Ready", || state(cp_kc.clone(), ns.clone()), &|| tail(&lifecycle.proc.stderr()))
        .await;
    // A Runtime naming a Secret of the release namespace (here the admin token) is refused
    // before any read, and its status says why.
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "eu-2", "namespace": ns},
        "spec": {"clusterId": "eu-2", "kubeconfigSecret": {"name": "fleetwatch-hub-admin-token", "namespace": ns, "key": "token"},
                 "modules": [{"name": "hello"}]}}),
    );
    let refusal = format!(
        "Secret {ns}/fleetwatch-hub-admin-token: kubeconfig Secrets are read from namespace {kubeconfig_ns} only (--kubeconfig-namespace)"
    );
    let refused = |kc: PathBuf, ns: String, want: String| async move {
        let (ok, out, _) =
            kubectl_try(&kc, &["get", "runtime", "eu-2", "-n", &ns, "-o", "jsonpath={.status.modules[0].message}"]);
        ok && out.contains(&want)
    };
    wait_until(
        "Runtime eu-2 refused for its Secret's namespace",
        || refused(cp_kc.clone(), ns.clone(), refusal.clone()),
        &|| tail(&lifecycle.proc.stderr()),
    )
    .await;
    // The operator records Events with its token (events.k8s.io, in the Runtimes' namespace).
    let event_about_runtime = |kc: PathBuf, ns: String| async move {
        let (ok, out, _) = kubectl_try(&kc, &["get", "events.events.k8s.io", "-n", &ns, "-o", "json"]);
        let events: Value = if ok { serde_json::from_str(&out).unwrap_or_default() } else { Value::Null };
        events["items"].as_array().is_some_and(|items| items.iter().any(|e| e["regarding"]["name"] == "eu-1"))
    };
    wait_until("an Event about Runtime eu-1", || event_about_runtime(cp_kc.clone(), ns.clone()), &|| {
        tail(&lifecycle.proc.stderr())
    })
    .await;
    // Nothing in the operator's log says it was forbidden anything.
    assert!(!lifecycle.proc.stderr().contains("is forbidden"), "lifecycle log:\n{}", tail(&lifecycle.proc.stderr()));
}

/// The rendered RBAC, applied to a sim that enforces it and checked with `kubectl auth can-i
/// --as=<ServiceAccount>`: the lifecycle operator reads Secrets in the kubeconfig namespace
/// only (by name: get, no list), never the hub's TLS key, admin token or a CA in its own
/// namespace; the hub reads no Secret; the agent chart without `watch.allowSecrets` grants
/// no Secret read. The chart refuses the release namespace as the kubeconfig namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_keeps_secrets_from_the_operator_hub_and_agent() {
    let dir = tempfile::tempdir().unwrap();
    let cp_docs = manifest("control-plane.yaml");
    let agent_docs = manifest("agent.yaml");
    let cp = sim("control-plane", true).await;
    let rt = sim("eu-1", true).await;
    let (cp_kc, rt_kc) = (dir.path().join("cp.kubeconfig"), dir.path().join("rt.kubeconfig"));
    cp.write_kubeconfig(&cp_kc).unwrap();
    rt.write_kubeconfig(&rt_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    kubectl(&rt_kc, &["apply", "--server-side", "-f", manifest_path("agent.yaml").to_str().unwrap()], None);

    let lifecycle = find(&cp_docs, "Deployment", "fleetwatch-lifecycle");
    let ns = lifecycle["metadata"]["namespace"].as_str().unwrap().to_string();
    let kubeconfig_ns = arg(lifecycle, "--kubeconfig-namespace").to_string();
    assert_eq!(kubeconfig_ns, "fleetwatch-runtimes");
    let sa = |docs: &[Value], kind: &str, name: &str| {
        let w = find(docs, kind, name);
        format!(
            "system:serviceaccount:{}:{}",
            w["metadata"]["namespace"].as_str().unwrap(),
            pod_spec(w)["serviceAccountName"].as_str().unwrap()
        )
    };
    let operator = sa(&cp_docs, "Deployment", "fleetwatch-lifecycle");
    let hub = sa(&cp_docs, "StatefulSet", "fleetwatch-hub");
    let agent = sa(&agent_docs, "Deployment", "fleetwatch-agent");
    // `kubectl auth can-i` prints yes/no (and exits 1 for no).
    let can_i = |kc: &Path, who: &str, args: &[&str]| -> String {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let who = format!("--as={who}");
        all.push(&who);
        let (_, out, err) = kubectl_try(kc, &all);
        let answer = out.trim().to_string();
        assert!(answer == "yes" || answer == "no", "kubectl {all:?}: {out} {err}");
        answer
    };
    // The caller is who we think: whoami through impersonation.
    let (ok, out, err) = kubectl_try(&cp_kc, &["auth", "whoami", "-o", "json", &format!("--as={operator}")]);
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], operator.as_str());

    // The operator: a kubeconfig Secret in its namespace, by name…
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secret/eu-1-kubeconfig", "-n", &kubeconfig_ns]), "yes");
    // …but it cannot list them, nor read any Secret elsewhere.
    assert_eq!(can_i(&cp_kc, &operator, &["list", "secrets", "-n", &kubeconfig_ns]), "no");
    let hub_tls = mounted_source(find(&cp_docs, "StatefulSet", "fleetwatch-hub"), "/etc/fleetwatch/tls");
    let admin_token = "fleetwatch-hub-admin-token";
    for secret in [hub_tls.as_str(), admin_token, "fleetwatch-ca", "fleetwatch-lifecycle-tls"] {
        assert_eq!(
            can_i(&cp_kc, &operator, &["get", &format!("secret/{secret}"), "-n", &ns]),
            "no",
            "the operator may read Secret {ns}/{secret}"
        );
    }
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secrets", "-n", &ns]), "no");
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secrets", "-n", "default"]), "no");
    assert_eq!(can_i(&cp_kc, &operator, &["list", "secrets", "--all-namespaces"]), "no");
    // What it does need still works (a positive control for the identity): Runtimes, Leases.
    assert_eq!(can_i(&cp_kc, &operator, &["watch", "runtimes.operator.fleetwatch.dev", "--all-namespaces"]), "yes");
    assert_eq!(can_i(&cp_kc, &operator, &["update", "leases", "-n", &ns]), "yes");

    // The hub reads no Secret at all.
    for (verb, where_) in [("get", ns.as_str()), ("get", kubeconfig_ns.as_str()), ("list", ns.as_str())] {
        assert_eq!(can_i(&cp_kc, &hub, &[verb, "secrets", "-n", where_]), "no", "hub {verb} secrets in {where_}");
    }
    assert_eq!(can_i(&cp_kc, &hub, &["watch", "watchconfigs.operator.fleetwatch.dev"]), "yes");

    // The agent (watch.allowSecrets unset): ConfigMaps yes, Secrets nowhere.
    assert_eq!(can_i(&rt_kc, &agent, &["list", "configmaps", "--all-namespaces"]), "yes");
    for args in [
        &["get", "secrets", "-n", "apps"][..],
        &["list", "secrets", "--all-namespaces"],
        &["watch", "secrets", "--all-namespaces"],
        &["get", "secrets", "-n", "fleetwatch-agent"],
    ] {
        assert_eq!(can_i(&rt_kc, &agent, args), "no", "agent {args:?}");
    }

    // The kubeconfig namespace cannot be the release namespace.
    let err =
        helm_template("fleetwatch", "fleetwatch-system", &["lifecycle.runtimeKubeconfigs.namespace=fleetwatch-system"])
            .unwrap_err();
    assert!(err.contains("is the release namespace"), "{err}");
}

/// A Go duration of whole hours, minutes and seconds (`2160h`, `720h0m0s`) in seconds.
fn go_duration(s: &str) -> u64 {
    let mut total = 0;
    let mut num = String::new();
    for c in s.chars() {
        match c {
            '0'..='9' => num.push(c),
            'h' | 'm' | 's' => {
                let n: u64 = num.parse().unwrap_or_else(|_| panic!("bad duration {s:?}"));
                total += n * match c {
                    'h' => 3600,
                    'm' => 60,
                    _ => 1,
                };
                num.clear();
            }
            _ => panic!("bad duration {s:?}"),
        }
    }
    assert!(num.is_empty(), "bad duration {s:?}");
    total
}

/// Checks what every fleetwatch Certificate needs: exactly one URI SAN, the SPIFFE id;
/// renewal at two thirds of the lifetime at the latest; the usage its side checks.
fn check_certificate(cert: &Value, identity: &str, usage: &str) {
    let spec = &cert["spec"];
    assert_eq!(spec["uris"], json!([identity]), "{cert}");
    let parsed: Identity = identity.parse().unwrap();
    assert_eq!(parsed.to_string(), identity);
    let usages: Vec<&str> = spec["usages"].as_array().unwrap().iter().map(|u| u.as_str().unwrap()).collect();
    assert!(usages.contains(&usage) && usages.contains(&"digital signature"), "{cert}");
    let (duration, renew) =
        (go_duration(spec["duration"].as_str().unwrap()), go_duration(spec["renewBefore"].as_str().unwrap()));
    assert!(renew * 3 >= duration && renew < duration, "renewBefore {renew}s of {duration}s is not well before expiry");
    assert_eq!(spec["privateKey"]["rotationPolicy"], "Always", "{cert}");
    assert!(spec["issuerRef"]["name"].is_string(), "{cert}");
}

/// The secret a workload mounts at `mount`.
fn mounted_source(w: &Value, mount: &str) -> String {
    let spec = pod_spec(w);
    let c = &spec["containers"][0];
    let vname = c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == mount).unwrap()["name"].clone();
    let v = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == vname).unwrap();
    v["secret"]["secretName"].as_str().or_else(|| v["configMap"]["name"].as_str()).unwrap().to_string()
}

fn arg<'a>(w: &'a Value, flag: &str) -> &'a str {
    pod_spec(w)["containers"][0]["args"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str()?.strip_prefix(&format!("{flag}=")))
        .next()
        .unwrap_or_else(|| panic!("no {flag} in {}", key(w)))
}

#[test]
fn cert_manager_certificates_carry_the_spiffe_identity_and_renew_early() {
    // Runtime cluster: the agent's Certificate.
    let agent = helm_template(
        "fleetwatch-agent",
        "fleetwatch-agent",
        &["certificate.mode=cert-manager", "clusterId=eu-1", "trustDomain=fleet.example.org"],
    )
    .unwrap();
    let cert = find(&agent, "Certificate", "fleetwatch-agent");
    check_certificate(cert, "spiffe://fleet.example.org/cluster/eu-1", "client auth");
    let identity: Identity = "spiffe://fleet.example.org/cluster/eu-1".parse().unwrap();
    assert_eq!(identity.cluster_id(), Some("eu-1"));
    let deployment = find(&agent, "Deployment", "fleetwatch-agent");
    assert_eq!(cert["spec"]["secretName"].as_str().unwrap(), mounted_source(deployment, "/etc/fleetwatch/tls"));
    assert!(arg(deployment, "--cert").starts_with("/etc/fleetwatch/tls/"));
    assert!(!agent.iter().any(|d| d["kind"] == "Secret"), "cert-manager mode renders no Secret of its own");

    // Without a cluster id, or with one SPIFFE forbids, nothing is rendered.
    let err = helm_template("fleetwatch-agent", "fleetwatch-agent", &["certificate.mode=cert-manager"]).unwrap_err();
    assert!(err.contains("clusterId: the cluster id"), "{err}");
    let err =
        helm_template("fleetwatch-agent", "fleetwatch-agent", &["certificate.mode=cert-manager", "clusterId=a/b"])
            .unwrap_err();
    assert!(err.contains("clusterId \"a/b\""), "{err}");

    // Control plane: the hub's serving certificate, the operator's subscriber certificate and
    // the trust-manager Bundle the hub trusts.
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "certificates.mode=cert-manager",
            "trustDomain=fleet.example.org",
            "certificates.certManager.hubDnsNames[0]=hub.fleet.example.org",
            "certificates.certManager.trustManager.enabled=true",
            "certificates.certManager.trustManager.sources[0].secret.name=fleetwatch-ca",
            "certificates.certManager.trustManager.sources[0].secret.key=ca.crt",
        ],
    )
    .unwrap();
    let hub_cert = find(&cp, "Certificate", "fleetwatch-hub");
    check_certificate(hub_cert, "spiffe://fleet.example.org/hub", "server auth");
    let hub = find(&cp, "StatefulSet", "fleetwatch-hub");
    assert_eq!(hub_cert["spec"]["secretName"].as_str().unwrap(), mounted_source(hub, "/etc/fleetwatch/tls"));
    let lifecycle = find(&cp, "Deployment", "fleetwatch-lifecycle");
    // The name the operator dials is in the hub's certificate, and so is the public one.
    let dialed = arg(lifecycle, "--hub").trim_start_matches("wss://").rsplit_once(':').unwrap().0.to_string();
    let names = hub_cert["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.contains(&json!(dialed)), "{dialed} not in {names:?}");
    assert!(names.contains(&json!("hub.fleet.example.org")), "{names:?}");
    let lc_cert = find(&cp, "Certificate", "fleetwatch-lifecycle");
    check_certificate(lc_cert, "spiffe://fleet.example.org/subscriber/lifecycle", "client auth");
    assert_eq!(lc_cert["spec"]["secretName"].as_str().unwrap(), mounted_source(lifecycle, "/etc/fleetwatch/tls"));
    // The Bundle writes the ConfigMap and key the hub's --client-ca reads.
    let bundle = cp.iter().find(|d| d["kind"] == "Bundle").expect("a trust-manager Bundle");
    assert_eq!(bundle["metadata"]["name"].as_str().unwrap(), mounted_source(hub, "/etc/fleetwatch/trust"));
    let client_ca = arg(hub, "--client-ca");
    assert_eq!(
        client_ca,
        format!("/etc/fleetwatch/trust/{}", bundle["spec"]["target"]["configMap"]["key"].as_str().unwrap())
    );
    assert_eq!(bundle["spec"]["sources"], json!([{"secret": {"name": "fleetwatch-ca", "key": "ca.crt"}}]));
}

#[test]
fn chart_values_that_cannot_work_are_refused() {
    let err = helm_template("fleetwatch", "fleetwatch-system", &["hub.replicas=3"]).unwrap_err();
    assert!(err.contains("hub.replicas > 1 needs hub.bus=nats"), "{err}");
    // The agent chart refuses watch.rules granting Secrets (core group, or *), and says why,
    // unless watch.allowSecrets is set.
    for (groups, resources) in [("", "secrets"), ("*", "secrets"), ("", "*")] {
        let g = format!("watch.rules[0].apiGroups[0]={groups}");
        let r = format!("watch.rules[0].resources[0]={resources}");
        let err = helm_template("fleetwatch-agent", "fleetwatch-agent", &[&g, &r]).unwrap_err();
        assert!(err.contains("grants reading Secrets") && err.contains("watch.allowSecrets: true"), "{err}");
        let ok = helm_template("fleetwatch-agent", "fleetwatch-agent", &[&g, &r, "watch.allowSecrets=true"]).unwrap();
        let role = find(&ok, "ClusterRole", "fleetwatch-agent");
        assert!(role["rules"].as_array().unwrap().iter().any(|r| r["resources"] == json!([resources])), "{role}");
    }
    // Another group's "secrets" (not core Secrets) and the default are fine.
    helm_template(
        "fleetwatch-agent",
        "fleetwatch-agent",
        &["watch.rules[0].apiGroups[0]=example.com", "watch.rules[0].resources[0]=secrets"],
    )
    .unwrap();
    // Several hubs on JetStream: a Deployment with the bus flags and a disruption budget.
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "hub.bus=nats",
            "hub.replicas=3",
            "hub.nats.urls={nats://n1:4222,nats://n2:4222}",
            "hub.nats.streamReplicas=3",
        ],
    )
    .unwrap();
    let hub = find(&cp, "Deployment", "fleetwatch-hub");
    assert_eq!(hub["spec"]["replicas"], 3);
    assert_eq!(arg(hub, "--bus"), "nats://n1:4222,nats://n2:4222");
    assert_eq!(arg(hub, "--bus-replicas"), "3");
    assert!(
        !pod_spec(hub)["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap().starts_with("--data-dir"))
    );
    assert_eq!(find(&cp, "PodDisruptionBudget", "fleetwatch-hub")["spec"]["minAvailable"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nats_mode_hub_replicas_run_with_their_rendered_args_and_share_the_stream() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let js =
        fleetwatch_bus::nats::server::LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["hub.bus=nats", "hub.replicas=2", &format!("hub.nats.urls={{{}}}", js.url())],
    )
    .unwrap();
    let hub = find(&docs, "Deployment", "fleetwatch-hub");
    assert_eq!(hub["spec"]["replicas"], 2);
    // The control plane the hubs read WatchConfigs from (their ServiceAccount's view).
    let cp = sim("control-plane", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    let hub_kc = dir.join("hub.kubeconfig");
    cp.write_kubeconfig_for(&hub_kc, "fleetwatch-system", "fleetwatch-hub").unwrap();
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);

    // Two replicas, each from the rendered Deployment (own ports, same stream).
    let (dir_a, dir_b) = (dir.join("replica-0"), dir.join("replica-1"));
    std::fs::create_dir_all(&dir_a).unwrap();
    std::fs::create_dir_all(&dir_b).unwrap();
    let a = start_ready(&docs, "Deployment", "fleetwatch-hub", &files, None, &hub_kc, &dir_a).await;
    let b = start_ready(&docs, "Deployment", "fleetwatch-hub", &files, None, &hub_kc, &dir_b).await;
    let (url_a, url_b) = (format!("wss://localhost:{}", a.port("wss")), format!("wss://localhost:{}", b.port("wss")));

    // An agent on replica 0, a subscriber on replica 1: the stream is shared.
    let _agent = agent(&pki, "eu-1", &url_a, "synthetic:objects=5,rate=50,total=5", &[]);
    let collector = Collector::start(&pki, &url_b, "ops").await;
    let all = holds_within(Duration::from_secs(30), || {
        let seen = collector.seen.lock().unwrap();
        (0..5).all(|n| seen.generation.contains_key(&("eu-1".to_string(), synthetic_subject(n))))
    })
    .await;
    assert!(
        all,
        "replica 1 did not deliver what replica 0 took:\n{}\n{}",
        tail(&a.proc.stderr()),
        tail(&b.proc.stderr())
    );
}

#[test]
fn the_service_monitor_scrapes_the_ports_that_serve_metrics() {
    let cp = helm_template("fleetwatch", "fleetwatch-system", &["monitoring.serviceMonitor.enabled=true"]).unwrap();
    let sm = cp.iter().find(|d| d["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
    let selector = &sm["spec"]["selector"];
    let wanted: Vec<&Value> = selector["matchExpressions"][0]["values"].as_array().unwrap().iter().collect();
    // The Services it selects, and on them the ports its endpoints name.
    let selected: Vec<&Value> = cp
        .iter()
        .filter(|d| d["kind"] == "Service")
        .filter(|s| {
            let labels = &s["metadata"]["labels"];
            wanted.contains(&&labels["app.kubernetes.io/component"])
                && selector["matchLabels"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v)
        })
        .collect();
    assert_eq!(selected.len(), 2, "hub admin and lifecycle metrics Services");
    for endpoint in sm["spec"]["endpoints"].as_array().unwrap() {
        assert_eq!(endpoint["path"], "/metrics");
        let service = selected
            .iter()
            .find(|s| s["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == endpoint["port"]))
            .unwrap_or_else(|| panic!("no selected Service has port {}", endpoint["port"]));
        // …and that port leads to a container port of a workload whose binary serves /metrics there.
        let port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == endpoint["port"]).unwrap();
        let target = &port["targetPort"];
        let serving = workloads(&cp)
            .into_iter()
            .find(|w| pod_spec(w)["containers"][0]["ports"].as_array().unwrap().iter().any(|p| &p["name"] == target));
        let w = serving.unwrap_or_else(|| panic!("no container port {target}"));
        let flag = if w["kind"] == "StatefulSet" { "--admin-listen" } else { "--metrics-listen" };
        let container_port = pod_spec(w)["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| &p["name"] == target)
            .unwrap()["containerPort"]
            .clone();
        assert_eq!(arg(w, flag), format!("0.0.0.0:{container_port}"), "{}", key(w));
    }
    // The hub's endpoint sends the token the hub requires: the Secret it mounts for
    // --admin-token-file, which the chart creates (random) with default values.
    let hub = find(&cp, "StatefulSet", "fleetwatch-hub");
    let endpoint = sm["spec"]["endpoints"].as_array().unwrap().iter().find(|e| e["port"] == "admin").unwrap();
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    let secret = endpoint["authorization"]["credentials"]["name"].as_str().unwrap();
    let token_file = arg(hub, "--admin-token-file");
    let (dir, file) = token_file.rsplit_once('/').unwrap();
    assert_eq!(mounted_source(hub, dir), secret);
    assert_eq!(endpoint["authorization"]["credentials"]["key"], file);
    let token = find(&cp, "Secret", secret)["data"][file].as_str().unwrap_or_default().to_string();
    assert!(token.len() >= 32, "the chart's admin token Secret holds a long token: {token:?}");
}

#[test]
fn monitoring_objects_carry_the_observability_files_unchanged() {
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true"],
    )
    .unwrap();
    let rules: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join("deploy/observability/alerts.yaml")).unwrap())
            .unwrap();
    let rule = cp.iter().find(|d| d["kind"] == "PrometheusRule").expect("a PrometheusRule");
    assert_eq!(rule["spec"], rules);
    assert!(!rules["groups"].as_array().unwrap().is_empty());
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/observability/dashboard.json")).unwrap())
            .unwrap();
    let cm = find(&cp, "ConfigMap", "fleetwatch-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(cm["data"]["fleetwatch.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, dashboard);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_agent_certificates_work_under_the_chart_rbac() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let ns = "fleetwatch-system";
    let docs =
        helm_template("fleetwatch", ns, &["createNamespace=true", &format!("lifecycle.agentCASecret={ns}/fleet-ca")])
            .unwrap();
    // Only the CA Secret, by name, read only.
    let role = find(&docs, "Role", "fleetwatch-lifecycle-agent-ca");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["fleet-ca"], "verbs": ["get"]}])
    );
    let err = helm_template("fleetwatch", ns, &["lifecycle.agentCASecret=fleet-ca"]).unwrap_err();
    assert!(err.contains("NAMESPACE/NAME"), "{err}");

    let cp = sim("control-plane", true).await;
    let rt = sim("eu-1", false).await;
    let (cp_kc, rt_kc) = (dir.join("cp.kubeconfig"), dir.join("rt.kubeconfig"));
    cp.write_kubeconfig(&cp_kc).unwrap();
    rt.write_kubeconfig(&rt_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", repo().join("deploy/crds").to_str().unwrap()], None);
    for d in &docs {
        apply_json(&cp_kc, d);
    }
    let (hub_kc, lifecycle_kc) = (dir.join("hub.kubeconfig"), dir.join("lifecycle.kubeconfig"));
    cp.write_kubeconfig_for(&hub_kc, ns, "fleetwatch-hub").unwrap();
    cp.write_kubeconfig_for(&lifecycle_kc, ns, "fleetwatch-lifecycle").unwrap();
    let lifecycle_files = pki.subscriber("lifecycle");
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    files.insert(
        "fleetwatch-lifecycle-tls".into(),
        vec![("tls.crt", lifecycle_files.cert.clone()), ("tls.key", lifecycle_files.key.clone())],
    );
    let hub = start_ready(&docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, &dir).await;
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));

    // The CA Secret, the agent module's template, a runtime cluster's kubeconfig and its Runtime.
    let ca = |f: &str| std::fs::read_to_string(pki.path(f)).unwrap();
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fleet-ca", "namespace": ns},
                          "stringData": {"ca.crt": ca("ca.crt"), "ca.key": ca("ca.key")}}),
    );
    let out =
        std::process::Command::new(BIN).args(["agent-module", "--hub", &hub_url, "--namespace", ns]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for d in documents(&String::from_utf8_lossy(&out.stdout)) {
        apply_json(&cp_kc, &d);
    }
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "eu-1-kubeconfig", "namespace": "fleetwatch-runtimes"},
                          "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "eu-1", "namespace": ns},
        "spec": {"clusterId": "eu-1", "kubeconfigSecret": {"name": "eu-1-kubeconfig"}, "modules": []}}),
    );

    // The operator, with its own token, reads the CA and writes the agent's certificate.
    let lifecycle =
        start_ready(&docs, "Deployment", "fleetwatch-lifecycle", &files, Some(&hub_url), &lifecycle_kc, &dir).await;
    // Where the agent module (the agent chart rendered) mounts its certificate from.
    let layout = fleetwatch_lifecycle::agent_module::layout().unwrap();
    let issued = |kc: PathBuf| {
        let (secret, agent_ns) = (layout.secret.clone(), layout.namespace.clone());
        async move {
            let (ok, out, _) =
                kubectl_try(&kc, &["get", "secret", &secret, "-n", &agent_ns, "-o", "jsonpath={.data.tls\\.crt}"]);
            ok && !out.is_empty()
        }
    };
    wait_until("the agent certificate in the runtime cluster", || issued(rt_kc.clone()), &|| {
        tail(&lifecycle.proc.stderr())
    })
    .await;
    let pem = kubectl(
        &rt_kc,
        &[
            "get",
            "secret",
            &layout.secret,
            "-n",
            &layout.namespace,
            "-o",
            "go-template={{index .data \"tls.crt\" | base64decode}}",
        ],
        None,
    );
    let info = fleetwatch_certs::inspect_pem(&pem, Path::new("tls.crt")).unwrap();
    assert_eq!(info.identity.unwrap().to_string(), "spiffe://test.local/cluster/eu-1");
    assert!(!lifecycle.proc.stderr().contains("is forbidden"), "lifecycle log:\n{}", tail(&lifecycle.proc.stderr()));
}

/// `crds.install=true` renders the CRDs as templates (so `helm upgrade` upgrades them), the
/// same as deploy/crds, kept on uninstall unless `crds.keep=false`; applied over a cluster
/// installed with the default values (CRDs from the chart's crds/), as an upgrade would, it
/// takes them over and the CRDs stay Established.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crds_install_renders_the_crds_as_kept_templates_that_upgrade_a_default_install() {
    let crds = |docs: &[Value]| -> Vec<Value> {
        let mut v: Vec<Value> = docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").cloned().collect();
        v.sort_by_key(|d| d["metadata"]["name"].as_str().unwrap_or_default().to_string());
        v
    };
    let default = helm_template("fleetwatch", "fleetwatch-system", &[]).unwrap();
    assert!(crds(&default).is_empty(), "templates render no CRD by default (crds/ holds them)");
    let templated = crds(&helm_template("fleetwatch", "fleetwatch-system", &["crds.install=true"]).unwrap());
    let files: Vec<Value> = {
        let mut v: Vec<Value> = std::fs::read_dir(repo().join("deploy/crds"))
            .unwrap()
            .flat_map(|e| documents(&std::fs::read_to_string(e.unwrap().path()).unwrap()))
            .collect();
        v.sort_by_key(|d| d["metadata"]["name"].as_str().unwrap_or_default().to_string());
        v
    };
    assert_eq!(templated.len(), files.len());
    for (t, f) in templated.iter().zip(&files) {
        assert_eq!(t["metadata"]["name"], f["metadata"]["name"]);
        // Helm's toYaml writes the float 0.0 as 0: compare numbers by value.
        fn numbers_as_f64(v: &Value) -> Value {
            match v {
                Value::Number(n) => n.as_f64().map_or(v.clone(), Value::from),
                Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
                Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), numbers_as_f64(x))).collect()),
                other => other.clone(),
            }
        }
        let name = &f["metadata"]["name"];
        assert_eq!(
            numbers_as_f64(&t["spec"]),
            numbers_as_f64(&f["spec"]),
            "{name}: the template differs from deploy/crds"
        );
        assert_eq!(t["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    }
    let unkept =
        crds(&helm_template("fleetwatch", "fleetwatch-system", &["crds.install=true", "crds.keep=false"]).unwrap());
    assert!(unkept.iter().all(|d| d["metadata"]["annotations"].get("helm.sh/resource-policy").is_none()));

    // The upgrade: a cluster with the CRDs a default install put there, then the templates.
    let dir = tempfile::tempdir().unwrap();
    let cluster = sim("crds-upgrade", false).await;
    let kc = dir.path().join("sim.kubeconfig");
    cluster.write_kubeconfig(&kc).unwrap();
    kubectl(&kc, &["apply", "-f", repo().join("deploy/crds").to_str().unwrap()], None);
    let rendered = dir.path().join("crds.yaml");
    let text: String = templated.iter().map(|d| format!("---\n{}\n", serde_json::to_string(d).unwrap())).collect();
    std::fs::write(&rendered, text).unwrap();
    let (ok, out, err) =
        kubectl_try(&kc, &["apply", "--server-side", "--force-conflicts", "-f", rendered.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    kubectl(&kc, &["wait", "--for=condition=Established", "--all", "crd", "--timeout=60s"], None);
    let got: Value = serde_json::from_str(&kubectl(&kc, &["get", "crd", "-o", "json"], None)).unwrap();
    let items = got["items"].as_array().unwrap();
    assert_eq!(items.len(), files.len());
    assert!(items.iter().all(|c| c["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"), "{got}");
}

/// values.schema.json refuses values that cannot work at render time, naming the value.
#[test]
fn chart_schemas_refuse_bad_values_naming_them() {
    let refused = |chart: &str, set: &[&str], says: &[&str]| {
        let err = helm_template(chart, "ns", set).expect_err(&format!("{chart} rendered with {set:?}"));
        for s in says {
            assert!(err.contains(s), "{chart} {set:?}: {s:?} not in {err}");
        }
    };
    refused("fleetwatch", &["hub.replicas=foo"], &["hub.replicas", "Expected: integer"]);
    refused("fleetwatch", &["hub.replicas=0"], &["hub.replicas"]);
    refused("fleetwatch", &["hub.bus=redis"], &["hub.bus", "embedded", "nats"]);
    refused("fleetwatch", &["certificates.mode=vault"], &["certificates.mode"]);
    // trust-manager on with no source would render an empty Bundle.
    refused(
        "fleetwatch",
        &["certificates.mode=cert-manager", "certificates.certManager.trustManager.enabled=true"],
        &["certificates.certManager.trustManager.sources", "at least 1"],
    );
    refused("fleetwatch", &["image.digest=latest"], &["image.digest"]);
    refused("fleetwatch", &["hub.serviceAccount.create=false"], &["hub.serviceAccount.name"]);
    refused("fleetwatch", &["hubs.replicas=3"], &["hubs"]);
    refused("fleetwatch", &["hub.extraEnv[0].value=x"], &["hub.extraEnv.0", "name"]);
    refused(
        "fleetwatch",
        &["lifecycle.extraEnv[0].name=N", "lifecycle.extraEnv[0].value=1"],
        &["lifecycle.extraEnv.0.value", "string"],
    );
    refused("fleetwatch-agent", &["hub.urls={https://hub:443}"], &["hub.urls.0"]);
    refused("fleetwatch-agent", &["outbox.capacity=many"], &["outbox.capacity"]);
    // What the schema lets through still renders.
    helm_template("fleetwatch", "ns", &["certificates.mode=cert-manager"]).unwrap();
    helm_template("fleetwatch-agent", "ns", &["certificate.mode=cert-manager", "clusterId=c1"]).unwrap();
}

/// The options platform teams expect of a chart: ServiceAccounts of their own (workload
/// identity), extra env / volumes / labels, priority class, digest-pinned image; replicated
/// workloads spread over nodes and zones by default; the hub StatefulSet governed by a
/// headless Service; `helm test` Jobs.
#[test]
fn chart_pod_options_render_into_every_workload() {
    let default = helm_template("fleetwatch", "ns", &[]).unwrap();
    // The StatefulSet's serviceName is a headless Service selecting the hub pods.
    let sts = find(&default, "StatefulSet", "fleetwatch-hub");
    let governing = sts["spec"]["serviceName"].as_str().unwrap();
    let svc = find(&default, "Service", governing);
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["selector"], sts["spec"]["selector"]["matchLabels"]);
    // Two operator replicas: soft anti-affinity and zone spread on their own labels; one hub: none.
    let lc = pod_spec(find(&default, "Deployment", "fleetwatch-lifecycle"));
    let term =
        &lc["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["labelSelector"]["matchLabels"]["app.kubernetes.io/name"], "fleetwatch-lifecycle");
    assert_eq!(lc["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(lc["topologySpreadConstraints"][0]["whenUnsatisfiable"], "ScheduleAnyway");
    assert!(pod_spec(sts)["affinity"].is_null() && pod_spec(sts)["topologySpreadConstraints"].is_null());
    // Three NATS hubs spread too; an affinity of one's own replaces the default.
    let nats =
        helm_template("fleetwatch", "ns", &["hub.bus=nats", "hub.replicas=3", "lifecycle.affinity.nodeAffinity.x=y"])
            .unwrap();
    assert!(!pod_spec(find(&nats, "Deployment", "fleetwatch-hub"))["affinity"]["podAntiAffinity"].is_null());
    assert_eq!(
        pod_spec(find(&nats, "Deployment", "fleetwatch-lifecycle"))["affinity"],
        json!({"nodeAffinity": {"x": "y"}})
    );

    // Every option, on both workloads of the control-plane chart and the agent's.
    let digest = format!("sha256:{}", "a".repeat(64));
    for (chart, workloads) in [
        (
            "fleetwatch",
            vec![("hub", "StatefulSet", "fleetwatch-hub"), ("lifecycle", "Deployment", "fleetwatch-lifecycle")],
        ),
        ("fleetwatch-agent", vec![("", "Deployment", "fleetwatch-agent")]),
    ] {
        let mut set = vec![format!("image.digest={digest}")];
        for (prefix, _, _) in &workloads {
            let p = if prefix.is_empty() { String::new() } else { format!("{prefix}.") };
            set.extend([
                format!("{p}serviceAccount.create=false"),
                format!("{p}serviceAccount.name=wi-{}", if prefix.is_empty() { "agent" } else { prefix }),
                format!("{p}extraEnv[0].name=EXTRA"),
                format!("{p}extraEnv[0].value=on"),
                format!("{p}extraVolumes[0].name=extra"),
                format!("{p}extraVolumes[0].emptyDir.medium=Memory"),
                format!("{p}extraVolumeMounts[0].name=extra"),
                format!("{p}extraVolumeMounts[0].mountPath=/extra"),
                format!("{p}podLabels.team=platform"),
                format!("{p}podAnnotations.note=x"),
                format!("{p}priorityClassName=critical"),
            ]);
        }
        let set: Vec<&str> = set.iter().map(String::as_str).collect();
        let docs = helm_template(chart, "ns", &set).unwrap();
        assert!(
            !docs.iter().any(|d| d["kind"] == "ServiceAccount"),
            "{chart}: serviceAccount.create=false still renders one"
        );
        for (prefix, kind, name) in workloads {
            let w = find(&docs, kind, name);
            let spec = pod_spec(w);
            let sa = format!("wi-{}", if prefix.is_empty() { "agent" } else { prefix });
            assert_eq!(spec["serviceAccountName"], sa.as_str(), "{name}");
            // RBAC is bound to the ServiceAccount in use.
            assert!(
                docs.iter()
                    .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
                    .any(|b| b["subjects"][0]["name"] == sa.as_str()),
                "{name}: no binding for {sa}"
            );
            let c = &spec["containers"][0];
            assert_eq!(c["image"], format!("ghcr.io/fleetwatch/fleetwatch@{digest}"), "{name}");
            assert!(
                c["env"].as_array().unwrap().iter().any(|e| e["name"] == "EXTRA" && e["value"] == "on"),
                "{name}: {}",
                c["env"]
            );
            assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/extra"), "{name}");
            assert!(
                spec["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == "extra" && v["emptyDir"]["medium"] == "Memory"),
                "{name}"
            );
            assert_eq!(w["spec"]["template"]["metadata"]["labels"]["team"], "platform", "{name}");
            assert_eq!(w["spec"]["template"]["metadata"]["annotations"]["note"], "x", "{name}");
            assert_eq!(spec["priorityClassName"], "critical", "{name}");
            // The selector is untouched by podLabels (a Deployment's selector is immutable).
            assert!(w["spec"]["selector"]["matchLabels"]["team"].is_null());
        }
    }
    let wi = helm_template(
        "fleetwatch",
        "ns",
        &["hub.serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=hub@p.iam"],
    )
    .unwrap();
    assert_eq!(
        find(&wi, "ServiceAccount", "fleetwatch-hub")["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
        "hub@p.iam"
    );
}

/// `helm test` Jobs (hooks, not in the plain manifests) ask /readyz of what the release runs,
/// through Services that exist, and the NetworkPolicies let them in.
#[test]
fn helm_test_jobs_ask_readyz_through_rendered_services() {
    for (chart, ports) in [("fleetwatch", vec![9090, 9091]), ("fleetwatch-agent", vec![9091])] {
        let docs = helm_template(chart, "ns", &[]).unwrap();
        let job = docs.iter().find(|d| d["kind"] == "Job").unwrap_or_else(|| panic!("{chart}: no test Job"));
        assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "test");
        let args: Vec<&str> =
            pod_spec(job)["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.contains(&"--fail"), "{args:?}");
        let urls: Vec<&&str> = args.iter().filter(|a| a.starts_with("http://")).collect();
        assert_eq!(urls.len(), ports.len(), "{chart}: {urls:?}");
        for (url, port) in urls.iter().zip(&ports) {
            let host = url.trim_start_matches("http://").split(['.', ':']).next().unwrap();
            let svc = find(&docs, "Service", host);
            assert!(svc["spec"]["ports"].as_array().unwrap().iter().any(|p| p["port"] == *port), "{chart}: {url}");
            assert!(url.ends_with(&format!(":{port}/readyz")), "{url}");
        }
        let labels = &job["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/component"], "helm-test");
        // Each port the Job asks is open to it in the target's NetworkPolicy.
        for port in &ports {
            let open = docs.iter().filter(|d| d["kind"] == "NetworkPolicy").any(|np| {
                np["spec"]["ingress"].as_array().into_iter().flatten().any(|rule| {
                    rule["ports"].as_array().into_iter().flatten().any(|p| p["port"] == *port)
                        && rule["from"].as_array().into_iter().flatten().any(|f| {
                            f["podSelector"] == json!({})
                                || f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test"
                        })
                })
            });
            assert!(open, "{chart}: no NetworkPolicy lets the test Job reach port {port}");
        }
        // The Job's own pod is under a NetworkPolicy (a test hook like it): no ingress, out
        // only DNS and the ports it asks.
        let own = docs
            .iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .find(|np| np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test")
            .unwrap_or_else(|| panic!("{chart}: no NetworkPolicy selects the test Job's pod"));
        assert_eq!(own["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(own["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(own["spec"]["ingress"].is_null(), "{chart}: ingress to the test Job");
        let egress_ports: Vec<u64> = own["spec"]["egress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_array().unwrap().iter().map(|p| p["port"].as_u64().unwrap()))
            .collect();
        for port in ports.iter().chain(&[53]) {
            assert!(egress_ports.contains(&(*port as u64)), "{chart}: the test Job may not reach port {port}");
        }
        assert!(job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"].is_string());
        // The plain manifests leave the Jobs out.
        let plain = manifest(if chart == "fleetwatch" { "control-plane.yaml" } else { "agent.yaml" });
        assert!(!plain.iter().any(|d| d["kind"] == "Job"), "{chart}: a test Job in deploy/manifests");
    }
}

/// The values that turn both relays on (targets, a scoped grant, TLS to the target, HMAC,
/// an XFCC CA), with cert-manager certificates and the ServiceMonitor.
const RELAYS_ON: &[&str] = &[
    "relays.webhook.enabled=true",
    "relays.webhook.target=https://receiver.example/events",
    "relays.webhook.clusters={eu-*,us-1}",
    "relays.webhook.hmacSecret.secretName=webhook-hmac",
    "relays.webhook.targetTLS.caSecretName=receiver-ca",
    "relays.webhook.types={dev.fleetwatch.object}",
    "relays.klm.enabled=true",
    "relays.klm.target=http://klm-listener.kcp-system.svc:8082",
    "relays.klm.xfccCASecretName=klm-xfcc",
    "relays.klm.deadLetter.persistence.enabled=false",
    "certificates.mode=cert-manager",
    "trustDomain=fleet.example.org",
    "monitoring.serviceMonitor.enabled=true",
];

/// Whether a NetworkPolicy rule's peers and ports admit `port` from/to `peer`.
fn rule_admits(rule: &Value, peers: &str, port: u64, peer: &dyn Fn(&Value) -> bool) -> bool {
    rule["ports"].as_array().into_iter().flatten().any(|p| p["port"] == port)
        && rule[peers].as_array().into_iter().flatten().any(peer)
}

/// Each relay the chart renders is a restricted, probed Deployment of one pod with its own
/// ServiceAccount (no token), its subscriber certificate, its dead letters on a claim (or
/// an emptyDir when asked), a NetworkPolicy (in: the metrics port only; out: DNS, the hub,
/// the target's port), a metrics Service the ServiceMonitor selects, a `helm test` URL, and
/// the access-policy grant for its subscriber name, scoped to `clusters`.
#[test]
fn relays_render_with_their_certificate_probes_policy_and_grant() {
    let docs = helm_template("fleetwatch", "fleetwatch-system", RELAYS_ON).unwrap();
    let lifecycle = find(&docs, "Deployment", "fleetwatch-lifecycle");
    let sm = docs.iter().find(|d| d["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
    let np_of = |labels: &Value| {
        docs.iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .find(|np| {
                np["spec"]["podSelector"]["matchLabels"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v)
            })
            .unwrap_or_else(|| panic!("no NetworkPolicy selects {labels}"))
    };
    for (kind, name, target_port, claim) in [("webhook", "webhook", 443, true), ("klm", "klm", 8082, false)] {
        let wname = format!("fleetwatch-relay-{kind}");
        let w = find(&docs, "Deployment", &wname);
        assert_restricted_and_probed(w);
        let spec = pod_spec(w);
        let c = &spec["containers"][0];
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(&args[..2], &["relay", kind], "{wname}");
        assert_eq!(w["spec"]["replicas"], 1);
        assert_eq!(w["spec"]["strategy"]["type"], "Recreate");
        // Probes on what the relay serves on --metrics-listen.
        assert_eq!(arg(w, "--metrics-listen"), "0.0.0.0:9091");
        assert_eq!(c["ports"][0], json!({"name": "metrics", "containerPort": 9091, "protocol": "TCP"}));
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));
        // Its own ServiceAccount, without a token (it calls no Kubernetes API).
        let sa = find(&docs, "ServiceAccount", &wname);
        assert_eq!(spec["serviceAccountName"], wname.as_str());
        assert_eq!(sa["automountServiceAccountToken"], false);
        assert_eq!(spec["automountServiceAccountToken"], false);
        // The hub the operator dials, the trust bundle, its durable name.
        assert_eq!(arg(w, "--hub"), arg(lifecycle, "--hub"));
        assert_eq!(mounted_source(w, "/etc/fleetwatch/trust"), mounted_source(lifecycle, "/etc/fleetwatch/trust"));
        assert_eq!(arg(w, "--name"), name);
        // The subscriber certificate: cert-manager's, for spiffe://<td>/subscriber/<name>.
        let cert = find(&docs, "Certificate", &wname);
        check_certificate(cert, &format!("spiffe://fleet.example.org/subscriber/{name}"), "client auth");
        assert_eq!(cert["spec"]["secretName"].as_str().unwrap(), mounted_source(w, "/etc/fleetwatch/tls"));
        assert_eq!(arg(w, "--cert"), "/etc/fleetwatch/tls/tls.crt");
        // Dead letters on a claim the chart makes (kept on uninstall), or an emptyDir.
        assert_eq!(arg(w, "--dead-letter"), "/var/lib/fleetwatch/dead-letter");
        let mount =
            c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == "/var/lib/fleetwatch/dead-letter");
        let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount.unwrap()["name"]).unwrap();
        if claim {
            let pvc =
                find(&docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"].as_str().unwrap());
            assert_eq!(pvc["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
        } else {
            assert!(volume["emptyDir"]["sizeLimit"].is_string(), "{volume}");
            assert!(!docs.iter().any(|d| d["kind"] == "PersistentVolumeClaim" && key(d).contains("relay-klm")));
        }
        // NetworkPolicy: in, only the metrics port (Prometheus' namespace, the helm test
        // Job); out, DNS, the hub's wss port and the target's port.
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        let np = np_of(labels);
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let ingress = np["spec"]["ingress"].as_array().unwrap();
        assert!(
            ingress.iter().all(|r| r["ports"] == json!([{"port": 9091, "protocol": "TCP"}]) && r["from"].is_array()),
            "{wname}: {ingress:?}"
        );
        let egress = np["spec"]["egress"].as_array().unwrap();
        let hub_labels = &find(&docs, "StatefulSet", "fleetwatch-hub")["spec"]["template"]["metadata"]["labels"];
        let to_hub = |p: &Value| {
            p["podSelector"]["matchLabels"].as_object().is_some_and(|m| m.iter().all(|(k, v)| &hub_labels[k] == v))
        };
        assert!(egress.iter().any(|r| rule_admits(r, "to", 7443, &to_hub)), "{wname}: no egress to the hub");
        assert!(
            egress.iter().any(|r| rule_admits(r, "to", target_port, &|p| p["ipBlock"]["cidr"] == "0.0.0.0/0")),
            "{wname}: no egress to the target's port {target_port}: {egress:?}"
        );
        assert_eq!(egress.len(), 3, "{wname}: DNS, hub, target and nothing else: {egress:?}");
        // The metrics Service the ServiceMonitor scrapes (also while not ready).
        let svc = find(&docs, "Service", &format!("{wname}-metrics"));
        let component = &svc["metadata"]["labels"]["app.kubernetes.io/component"];
        assert!(sm["spec"]["selector"]["matchExpressions"][0]["values"].as_array().unwrap().contains(component));
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
        assert!(svc["spec"]["selector"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v));
        assert!(
            sm["spec"]["endpoints"].as_array().unwrap().iter().any(|e| e["port"] == svc["spec"]["ports"][0]["name"])
        );
        // `helm test` asks its /readyz.
        let job = docs.iter().find(|d| d["kind"] == "Job").unwrap();
        let url = format!("http://{wname}-metrics.fleetwatch-system.svc:9091/readyz");
        assert!(pod_spec(job)["containers"][0]["args"].as_array().unwrap().contains(&json!(url)), "{url}");
    }
    // Per-relay options.
    let hook = find(&docs, "Deployment", "fleetwatch-relay-webhook");
    assert_eq!(arg(hook, "--target"), "https://receiver.example/events");
    assert_eq!(arg(hook, "--type"), "dev.fleetwatch.object");
    assert_eq!(mounted_source(hook, "/etc/fleetwatch/hmac"), "webhook-hmac");
    assert_eq!(arg(hook, "--hmac-secret-file"), "/etc/fleetwatch/hmac/secret");
    assert_eq!(mounted_source(hook, "/etc/fleetwatch/target-ca"), "receiver-ca");
    assert_eq!(arg(hook, "--target-ca"), "/etc/fleetwatch/target-ca/ca.crt");
    let klm = find(&docs, "Deployment", "fleetwatch-relay-klm");
    assert_eq!(arg(klm, "--component"), "lifecycle-manager");
    assert_eq!(mounted_source(klm, "/etc/fleetwatch/xfcc-ca"), "klm-xfcc");
    assert_eq!(arg(klm, "--xfcc-ca-key"), "/etc/fleetwatch/xfcc-ca/tls.key");
    // The access policy grants each relay's subscriber name, scoped as asked, besides the
    // chart's own entries.
    let cm = find(&docs, "ConfigMap", "fleetwatch-hub-access-policy");
    let policy: Value = serde_saphyr::from_str(cm["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    let grant = |n: &str| policy["subscribers"].as_array().unwrap().iter().find(|s| s["name"] == n).cloned();
    assert_eq!(grant("webhook").unwrap()["clusters"], json!(["eu-*", "us-1"]));
    assert_eq!(grant("klm").unwrap()["clusters"], json!(["*"]));
    assert!(grant("lifecycle").is_some() && grant("ops").is_some());
    // Secret mode: the relay mounts the Secret named in values (no Certificate).
    let secret_mode = helm_template(
        "fleetwatch",
        "ns",
        &["relays.klm.enabled=true", "relays.klm.target=http://l:8082", "relays.klm.certificateSecretName=my-klm-tls"],
    )
    .unwrap();
    assert_eq!(
        mounted_source(find(&secret_mode, "Deployment", "fleetwatch-relay-klm"), "/etc/fleetwatch/tls"),
        "my-klm-tls"
    );
    assert!(!secret_mode.iter().any(|d| d["kind"] == "Certificate"));
    // The pod options of the other workloads, on a relay too.
    let digest = format!("sha256:{}", "b".repeat(64));
    let options = helm_template(
        "fleetwatch",
        "ns",
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            &format!("image.digest={digest}"),
            "relays.webhook.serviceAccount.create=false",
            "relays.webhook.serviceAccount.name=wi-relay",
            "relays.webhook.extraEnv[0].name=HTTPS_PROXY",
            "relays.webhook.extraEnv[0].value=http://proxy:3128",
            "relays.webhook.extraVolumes[0].name=extra",
            "relays.webhook.extraVolumes[0].emptyDir.medium=Memory",
            "relays.webhook.extraVolumeMounts[0].name=extra",
            "relays.webhook.extraVolumeMounts[0].mountPath=/extra",
            "relays.webhook.podLabels.team=platform",
            "relays.webhook.podAnnotations.note=x",
            "relays.webhook.priorityClassName=critical",
            "relays.webhook.extraArgs={--batch-max-bytes=65536}",
        ],
    )
    .unwrap();
    let w = find(&options, "Deployment", "fleetwatch-relay-webhook");
    let spec = pod_spec(w);
    let c = &spec["containers"][0];
    assert_eq!(spec["serviceAccountName"], "wi-relay");
    assert!(!options.iter().any(|d| d["kind"] == "ServiceAccount" && key(d).contains("relay")));
    assert_eq!(c["image"], format!("ghcr.io/fleetwatch/fleetwatch@{digest}"));
    assert_eq!(c["env"], json!([{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]));
    assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/extra"));
    assert!(spec["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "extra"));
    assert_eq!(w["spec"]["template"]["metadata"]["labels"]["team"], "platform");
    assert!(w["spec"]["selector"]["matchLabels"]["team"].is_null());
    assert_eq!(w["spec"]["template"]["metadata"]["annotations"]["note"], "x");
    assert_eq!(spec["priorityClassName"], "critical");
    assert_eq!(arg(w, "--batch-max-bytes"), "65536");
    // Off by default: nothing of the relays, and the policy has only the chart's entries.
    let default = helm_template("fleetwatch", "ns", &[]).unwrap();
    assert!(!default.iter().any(|d| key(d).contains("relay")), "a relay object with default values");
    let policy = find(&default, "ConfigMap", "fleetwatch-hub-access-policy")["data"]["policy.yaml"].as_str().unwrap();
    let policy: Value = serde_saphyr::from_str(policy).unwrap();
    let names: Vec<&str> =
        policy["subscribers"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lifecycle", "ops"]);
}

/// A relay enabled without what it needs is refused, saying what to set; never rendered
/// half-working (no target, no grant, a grant the policy would reject).
#[test]
fn relays_without_what_they_need_are_refused() {
    let refused = |set: &[&str], says: &[&str]| {
        let err = helm_template("fleetwatch", "ns", set).expect_err(&format!("rendered with {set:?}"));
        for s in says {
            assert!(err.contains(s), "{set:?}: {s:?} not in {err}");
        }
    };
    refused(&["relays.webhook.enabled=true"], &["relays.webhook.target", "required when relays.webhook.enabled=true"]);
    refused(&["relays.klm.enabled=true"], &["relays.klm.target", "required when relays.klm.enabled=true"]);
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=ftp://x/"],
        &["must be an http:// or https:// URL"],
    );
    // No cluster in the grant: the relay would receive nothing.
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=https://r/", "relays.webhook.clusters=null"],
        &["relays.webhook.clusters", "at least one cluster"],
    );
    // A name the policy already grants (or the other relay's) would make the policy invalid.
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=https://r/", "relays.webhook.name=ops"],
        &["relays.webhook.name \"ops\" is already granted in hub.accessPolicy.subscribers"],
    );
    refused(
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            "relays.klm.enabled=true",
            "relays.klm.target=https://l/",
            "relays.klm.name=webhook",
        ],
        &["each relay needs its own subscriber name"],
    );
    refused(
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            "relays.webhook.targetTLS.clientSecretName=c",
        ],
        &["relays.webhook.targetTLS.caSecretName"],
    );
    // The schema is closed and typed for the relays too.
    refused(&["relays.webhook.targett=https://r/"], &["relays.webhook", "targett"]);
    refused(&["relays.webhook.batch=0"], &["relays.webhook.batch"]);
    refused(&["relays.klm.from=middle"], &["relays.klm.from"]);
}

/// A control plane (sim, CRDs) and the hub run from `docs` (the chart rendered with a
/// relay), with the files of every volume the hub and relay `kind` mount (the relay's
/// subscriber certificate for its default name).
async fn rendered_hub_for_relay(
    pki: &Pki,
    dir: &Path,
    docs: &[Value],
    kind: &str,
) -> (fleetwatch_sim::SimCluster, PathBuf, Workload, VolumeFiles) {
    let cp = sim("control-plane", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    let hub_kc = dir.join("hub.kubeconfig");
    cp.write_kubeconfig_for(&hub_kc, "fleetwatch-system", "fleetwatch-hub").unwrap();
    let relay_files = pki.subscriber(kind);
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(docs, dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    files.insert(
        format!("fleetwatch-relay-{kind}-tls"),
        vec![("tls.crt", relay_files.cert.clone()), ("tls.key", relay_files.key.clone())],
    );
    let hub = start_ready(docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, dir).await;
    (cp, cp_kc, hub, files)
}

/// What the relay test's target received: the signature header and the body.
type Request = (String, Vec<u8>);

/// A relay enabled in the chart runs from its rendered Deployment (args, mounts, probes)
/// against a hub run from the same render: it subscribes under the access-policy grant the
/// chart added (scoped to one cluster: another cluster's events, earlier in the log, never
/// reach it), becomes ready, and posts signed CloudEvents to its target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_runs_from_its_rendered_deployment_under_the_grant_the_chart_adds() {
    use std::sync::{Arc, Mutex};
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    // The target: records each request's signature header and body, answers 200.
    let got: Arc<Mutex<Vec<Request>>> = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://127.0.0.1:{}/events", listener.local_addr().unwrap().port());
    let store = got.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let sig = headers.get("x-fleetwatch-signature").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                store.lock().unwrap().push((sig, body.to_vec()));
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let target_value = format!("relays.webhook.target={target}");
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "relays.webhook.enabled=true",
            &target_value,
            "relays.webhook.clusters={eu-1}",
            "relays.webhook.hmacSecret.secretName=webhook-hmac",
        ],
    )
    .unwrap();
    let hmac = pki.path("hmac-secret");
    std::fs::write(&hmac, "s3cret\n").unwrap();
    let (_cp, cp_kc, hub, mut files) = rendered_hub_for_relay(&pki, &dir, &docs, "webhook").await;
    files.insert("webhook-hmac".into(), vec![("secret", hmac)]);
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));

    // eu-2's events first, all in the hub's log (ops reads every cluster)…
    let collector = Collector::start(&pki, &hub_url, "ops").await;
    let all_of = |cluster: &str| {
        let seen = collector.seen.lock().unwrap();
        (0..5).all(|n| seen.generation.contains_key(&(cluster.to_string(), synthetic_subject(n))))
    };
    let _eu2 = agent(&pki, "eu-2", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    assert!(holds_within(Duration::from_secs(30), || all_of("eu-2")).await, "ops did not get eu-2's events");
    // …then the relay, from its rendered Deployment (its claim an empty directory here).
    let relay =
        start_ready(&docs, "Deployment", "fleetwatch-relay-webhook", &files, Some(&hub_url), &cp_kc, &dir).await;
    let _eu1 = agent(&pki, "eu-1", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    let subjects = |got: &[Request]| {
        got.iter()
            .filter_map(|(_, b)| serde_json::from_slice::<Value>(b).ok())
            .filter(|e| e["source"] == "/clusters/eu-1")
            .filter_map(|e| e["subject"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let want: std::collections::BTreeSet<String> = (0..5).map(synthetic_subject).collect();
    let delivered = holds_within(Duration::from_secs(30), || subjects(&got.lock().unwrap()).is_superset(&want)).await;
    assert!(delivered, "the relay did not post eu-1's 5 objects; relay log:\n{}", tail(&relay.proc.stderr()));
    // Signed with the mounted secret; nothing of eu-2, whose events came before in the log.
    let key = fleetwatch_relay::webhook::hmac_key(b"s3cret");
    for (sig, body) in got.lock().unwrap().iter() {
        assert!(fleetwatch_relay::webhook::verify_signature(&key, body, sig), "bad signature {sig:?}");
        let text = String::from_utf8_lossy(body);
        assert!(!text.contains("eu-2"), "the relay's grant is eu-1 only, it posted: {text}");
    }
    // Its metrics endpoint (the ServiceMonitor's) counts the deliveries.
    let metrics = http_get(relay.port("metrics"), "/metrics").await;
    let delivered: u64 = metrics
        .lines()
        .find(|l| l.starts_with("fleetwatch_relay_delivered_total{") && l.contains(&target))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no delivered count for {target} in:\n{metrics}"));
    assert!(delivered >= 5, "{metrics}");
}

/// The KLM relay from its rendered Deployment: the listener (runtime-watcher's v2 contract)
/// gets a request per object of the granted cluster, with that cluster as the runtime id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_klm_relay_runs_from_its_rendered_deployment() {
    use crate::relay::klm_listener::KlmListener;
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let listener = KlmListener::start(None).await;
    let target = format!("relays.klm.target={}", listener.url());
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["relays.klm.enabled=true", &target, "relays.klm.clusters={rt-*}"],
    )
    .unwrap();
    let (_cp, cp_kc, hub, files) = rendered_hub_for_relay(&pki, &dir, &docs, "klm").await;
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));
    let relay = start_ready(&docs, "Deployment", "fleetwatch-relay-klm", &files, Some(&hub_url), &cp_kc, &dir).await;
    let _agent = agent(&pki, "rt-1", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    let names = || {
        listener
            .received()
            .iter()
            .filter(|r| r.runtime == "rt-1" && r.component == "lifecycle-manager")
            .filter_map(|r| r.body["watched"]["name"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    // The five objects (and the agent start's resync fallback, the runtime's Kyma object).
    let want: std::collections::BTreeSet<String> = (0..5).map(|n| format!("obj-{n}")).collect();
    let all = holds_within(Duration::from_secs(30), || names().is_superset(&want)).await;
    assert!(
        all,
        "the listener got {:?} (refused {:?}); relay log:\n{}",
        names(),
        listener.refused(),
        tail(&relay.proc.stderr())
    );
    let received = listener.received();
    let r = received.iter().find(|r| r.body["watched"]["name"] == "obj-0").unwrap();
    assert_eq!(r.body["watchedGvk"], json!({"group": "synthetic.fleetwatch.dev", "version": "v1", "kind": "Object"}));
    assert_eq!(r.body["watched"]["namespace"], "default");
}

/// With `hub.accessPolicy.fromControlPlane`, the hub under the chart's ClusterRole lists and
/// watches SubscriberAccessPolicy objects (it is ready only once it has) and writes their
/// status: accepted, or refused for naming a subscriber the chart's file already grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_reads_subscriber_access_policies_under_the_chart_rbac() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["createNamespace=true", "hub.adminToken.createSecret=false", "hub.accessPolicy.fromControlPlane=true"],
    )
    .unwrap();
    let hub_w = find(&docs, "StatefulSet", "fleetwatch-hub");
    assert!(
        hub_w["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--access-policy-from-control-plane"),
        "{hub_w}"
    );
    let cp = sim("control-plane", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", repo().join("deploy/crds").to_str().unwrap()], None);
    let rendered = dir.join("control-plane.yaml");
    std::fs::write(&rendered, docs.iter().map(|d| format!("---\n{d}\n")).collect::<String>()).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", rendered.to_str().unwrap()], None);
    let ns = hub_w["metadata"]["namespace"].as_str().unwrap();
    let sa = pod_spec(hub_w)["serviceAccountName"].as_str().unwrap();
    let hub_kc = dir.join("hub.kubeconfig");
    cp.write_kubeconfig_for(&hub_kc, ns, sa).unwrap();

    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    // Ready only once it has listed the objects with its own token.
    let hub = start_ready(&docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, &dir).await;

    for (name, subscriber) in [("team-x", "team-x"), ("dup", "ops")] {
        apply_json(
            &cp_kc,
            &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "SubscriberAccessPolicy",
                "metadata": {"name": name}, "spec": {"subscribers": [{"name": subscriber, "clusters": ["*"]}]}}),
        );
    }
    let status = |name: &str| {
        kubectl(
            &cp_kc,
            &[
                "get",
                "subscriberaccesspolicies",
                name,
                "-o",
                r#"jsonpath={.status.conditions[0].status}/{.status.conditions[0].reason}/{.status.observedGeneration}"#,
            ],
            None,
        )
    };
    let written = holds_within(Duration::from_secs(30), || {
        status("team-x") == "True/Accepted/1" && status("dup") == "False/DuplicateSubscriber/1"
    })
    .await;
    assert!(written, "{} {}\nhub log:\n{}", status("team-x"), status("dup"), tail(&hub.proc.stderr()));
    assert!(!hub.proc.stderr().contains("cannot write"), "{}", tail(&hub.proc.stderr()));
}
