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

mod charts;
mod rbac;
mod relays;

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

/// The hub address the tests give the agent chart, which refuses to render without one
/// (`the_agent_chart_refuses_to_render_without_the_hub_url`); a `--set hub.urls=...` of a
/// test overrides it.
const TEST_HUB_URLS: &str = "hub.urls={wss://hub.test:443}";

/// Runs helm (installed by scripts/test.sh, see scripts/helm.sh); `Err(stderr)` on failure.
fn helm_template(chart: &str, namespace: &str, set: &[&str]) -> Result<Vec<Value>, String> {
    let mut cmd = std::process::Command::new("helm");
    cmd.args(["template", chart]).arg(repo().join("deploy/helm").join(chart)).args(["--namespace", namespace]);
    if chart == "fleetwatch-agent" {
        cmd.args(["--set", TEST_HUB_URLS]);
    }
    for s in set {
        cmd.args(["--set", s]);
    }
    let out = cmd.output().expect("helm on PATH (bash scripts/helm.sh installs it)");
    if !out.status.success() {
        return Err(String::from_utf8_lossy(&out.stderr).into());
    }
    Ok(documents(&String::from_utf8_lossy(&out.stdout)))
}

/// `helm template` with a values file (JSON is YAML) for what `--set` cannot spell (braces,
/// commas, multi-line strings); `Err(stderr)` on failure.
fn helm_template_values(chart: &str, namespace: &str, values: &Value) -> Result<Vec<Value>, String> {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("values.yaml");
    let mut values = values.clone();
    if chart == "fleetwatch-agent" && values["hub"]["urls"].is_null() {
        values["hub"]["urls"] = json!(["wss://hub.test:443"]);
    }
    std::fs::write(&file, values.to_string()).unwrap();
    let out = std::process::Command::new("helm")
        .args(["template", chart])
        .arg(repo().join("deploy/helm").join(chart))
        .args(["--namespace", namespace, "--values"])
        .arg(&file)
        .output()
        .expect("helm on PATH (bash scripts/helm.sh installs it)");
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

/// A log filter the binaries would refuse (`--log warning` was taken for a target and muted
/// almost every log) is refused by both charts' schemas at render, naming the value; a
/// level with targets renders as given.
#[test]
fn a_log_level_the_binaries_refuse_is_refused_at_render() {
    for chart in ["fleetwatch", "fleetwatch-agent"] {
        for bad in ["warning", "verbose", "info\\,fleetwatch_hub"] {
            let err = helm_template(chart, "fleetwatch-system", &[&format!("logLevel={bad}")])
                .err()
                .unwrap_or_else(|| panic!("{chart} rendered logLevel={bad}"));
            assert!(err.contains("logLevel") && err.contains("pattern"), "{chart} {bad}: {err}");
        }
        let docs = helm_template(chart, "fleetwatch-system", &["logLevel=info\\,fleetwatch_hub=debug"])
            .unwrap_or_else(|e| panic!("{chart}: {e}"));
        let text = serde_json::to_string(&docs).unwrap();
        assert!(text.contains("--log=info,fleetwatch_hub=debug"), "{chart}: {text}");
    }
}

/// The hub took `1Gi` from the chart and refused it at start (`unknown size unit "gi"`): now
/// every size flag takes Kubernetes quantities, and the chart refuses at render what the
/// binaries refuse (`1m` is milli, not mega).
#[test]
fn sizes_the_binaries_refuse_are_refused_at_render_and_quantities_render() {
    for (value, bad) in [
        ("hub.retention.bytes", "1m"),
        ("hub.retention.bytes", "2Gb"),
        ("lifecycle.artifactCache.maxBytes", "lots"),
        ("lifecycle.artifactCache.pullMaxBytes", "64 Mi"),
    ] {
        let err = helm_template("fleetwatch", "fleetwatch-system", &[&format!("{value}={bad}")])
            .err()
            .unwrap_or_else(|| panic!("rendered {value}={bad}"));
        assert!(err.contains("pattern"), "{value}={bad}: {err}");
    }
    let docs = helm_template("fleetwatch", "fleetwatch-system", &["hub.retention.bytes=1Gi"]).unwrap();
    let hub = find(&docs, "StatefulSet", "fleetwatch-hub");
    let args = serde_json::to_string(&pod_spec(hub)["containers"][0]["args"]).unwrap();
    assert!(args.contains("--retention-bytes=1Gi"), "{args}");
    // And the binary takes what rendered.
    let out = std::process::Command::new(BIN).args(["hub", "--retention-bytes", "1Gi", "--help"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = std::process::Command::new(BIN).args(["hub", "--retention-bytes", "1m"]).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("milli"), "{err}");
}
