//! `fleetwatch up`: the whole system on one machine — a simulated control plane and
//! runtime clusters, certificates, the hub, an agent per cluster, the lifecycle operator
//! and sample modules (two every Runtime lists, one offered to the runtime clusters' users,
//! who enable it with a `Module` object) — with a live table of every runtime.

use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_agent::kube_source::KubeSource;
use fleetwatch_agent::{AgentConfig, AgentRuntime};
use fleetwatch_api::Runtime;
use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
use fleetwatch_client::subscriber::SubscriberOptions;
use fleetwatch_hub::{Hub, HubConfig};
use fleetwatch_protocol::message::StartFrom;
use kube::Api;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use fleetwatch_client::kube_apply::{apply, install_crds};

/// Namespace of Runtimes, templates and release metas in the sandbox's control plane.
pub const NAMESPACE: &str = "kcp";
/// Namespace of the runtime clusters' kubeconfig Secrets (the operator's
/// `--kubeconfig-namespace`), apart from everything else as in the chart.
pub const KUBECONFIG_NAMESPACE: &str = "fleetwatch-runtimes";
/// The sample modules every Runtime lists (chosen centrally).
pub const MODULES: [&str; 2] = ["redis", "nats"];
/// The sample module no Runtime lists: offered to the runtime clusters' users, who enable it
/// in their own cluster with a `Module` object (`enable-keda.yaml` in the sandbox folder).
pub const OFFERED: &str = "keda";
/// The hub's admin Service (namespace, name, port name) as the chart renders it, the default
/// of `fleetwatch status --service`.
const ADMIN_SERVICE: (&str, &str, &str) = ("fleetwatch-system", "fleetwatch-hub-admin", "admin");
/// The runtime cluster whose user the intro shows enabling [`OFFERED`] (the first one when
/// there is only one).
const SELF_SERVICE_CLUSTER: usize = 1;

#[derive(Args)]
pub struct UpArgs {
    /// Number of simulated runtime clusters.
    #[arg(long, default_value_t = 3)]
    clusters: usize,
    /// Where certificates, kubeconfigs and the hub's data go (kept between runs).
    #[arg(long, default_value = "fleetwatch-sandbox")]
    dir: PathBuf,
    /// Port of the hub (wss); 0 picks a free one.
    #[arg(long, default_value_t = 7443)]
    hub_port: u16,
    /// Port of the hub's admin endpoint (HTTP); 0 picks a free one.
    #[arg(long, default_value_t = 9090)]
    admin_port: u16,
    /// First port of the simulated clusters (control plane, then each runtime); 0 picks
    /// free ones.
    #[arg(long, default_value_t = 0)]
    sim_port: u16,
    /// Port of the lifecycle operator's metrics and probes (HTTP /metrics, /healthz, /readyz);
    /// 0 picks a free one.
    #[arg(long, default_value_t = 9091)]
    lifecycle_metrics_port: u16,
    /// Print a line per change instead of redrawing a table (the default when stdout is not
    /// a terminal).
    #[arg(long)]
    plain: bool,
}

impl UpArgs {
    /// Where the sandbox's logs go.
    pub fn log_file(&self) -> PathBuf {
        self.dir.join("fleetwatch.log")
    }
}

/// A sample module version: a namespace, its configuration CRD and a manager Deployment.
pub fn module_template(module: &str, version: &str) -> Value {
    let kind = format!("{}Config", capitalise(module));
    let plural = format!("{module}configs");
    json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("{module}-{version}"), "namespace": NAMESPACE},
        "spec": {
            "moduleName": module, "version": version,
            // The sample `nats` 2.0.0 needs downtime: its upgrade waits for a maintenance window.
            "requiresDowntime": module == "nats" && version != "1.0.0",
            "manifest": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("{module}-system")}},
                {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "metadata": {"name": format!("{plural}.modules.example.com")},
                 "spec": {"group": "modules.example.com", "scope": "Namespaced",
                          "names": {"kind": kind, "plural": plural, "singular": format!("{module}config")},
                          "versions": [{"name": "v1", "served": true, "storage": true,
                                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}},
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": format!("{module}-manager"), "namespace": format!("{module}-system"),
                              "labels": {"operator.fleetwatch.dev/module": module, "app.kubernetes.io/version": version}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": format!("{module}-manager")}},
                          "template": {"metadata": {"labels": {"app": format!("{module}-manager")}},
                                       "spec": {"containers": [{"name": "manager", "image": format!("example/{module}-manager:{version}")}]}}}}
            ],
            "defaultConfig": {"apiVersion": "modules.example.com/v1", "kind": kind,
                              "metadata": {"name": "default", "namespace": format!("{module}-system")}, "spec": {"replicas": 1}},
            "managedResources": [{"group": "modules.example.com", "version": "v1", "kind": kind}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": format!("{module}-system"), "name": format!("{module}-manager")}
        }
    })
}

/// The sample ModuleConfigPolicy: redis keeps `spec.tls: true` in every runtime, and its
/// configuration must have at most 5 replicas (violations are reported).
pub fn sample_config_policy() -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleConfigPolicy",
           "metadata": {"name": "redis-central", "namespace": NAMESPACE},
           "spec": {"module": "redis", "enforce": {"spec": {"tls": true}},
                    "schema": {"type": "object", "properties": {"spec": {"type": "object",
                               "properties": {"replicas": {"type": "integer", "maximum": 5}}}}},
                    "onInvalid": "Report"}})
}

/// The `Module` a runtime cluster's user applies to enable `module` (the sandbox writes it as
/// `enable-<module>.yaml`): named after the module, with the defaults spelled out.
pub fn enable_manifest(module: &str) -> String {
    format!(
        "# Enables the module {module} in a runtime cluster, as the cluster's user would: the lifecycle
# operator installs it and writes what it did into this object's status.
#   kubectl --kubeconfig RUNTIME.kubeconfig apply -f enable-{module}.yaml
#   kubectl --kubeconfig RUNTIME.kubeconfig get modules  # every module the cluster runs, whoever chose it
#   kubectl --kubeconfig RUNTIME.kubeconfig describe module {module}
#   kubectl --kubeconfig RUNTIME.kubeconfig delete module {module}  # removes it again
apiVersion: operator.fleetwatch.dev/v1alpha1
kind: Module
metadata:
  name: {module}
spec:
  # channel: fast                        # {module} 2.0.0; absent: the cluster's channel (regular, 1.0.0)
  customResourcePolicy: CreateAndDelete  # deleting this object removes {module}; Ignore leaves it installed, unmanaged
"
    )
}

/// A module's channels: regular and fast.
pub fn release_meta(module: &str, regular: &str, fast: &str) -> Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
           "metadata": {"name": module, "namespace": NAMESPACE},
           "spec": {"moduleName": module, "channels": [{"channel": "regular", "version": regular}, {"channel": "fast", "version": fast}]}})
}

fn capitalise(s: &str) -> String {
    let mut c = s.chars();
    c.next().map(|f| f.to_uppercase().collect::<String>() + c.as_str()).unwrap_or_default()
}

fn port(base: u16, i: u16) -> u16 {
    if base == 0 { 0 } else { base + i }
}

/// Holds the sandbox folder for this process: a second `up` in the same folder is refused
/// before it writes anything (the OS releases the lock when the process ends, however).
fn lock_folder(dir: &Path) -> anyhow::Result<std::fs::File> {
    let path = dir.join(".lock");
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .with_context(|| format!("cannot open {}", path.display()))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(std::fs::TryLockError::WouldBlock) => {
            let pid = std::fs::read_to_string(&path).unwrap_or_default();
            let pid = pid.trim();
            anyhow::bail!(
                "a sandbox is already running in {} (pid {}); stop it first, or use another --dir",
                dir.display(),
                if pid.is_empty() { "unknown" } else { pid }
            );
        }
        Err(std::fs::TryLockError::Error(e)) => {
            return Err(e).with_context(|| format!("cannot lock {}", path.display()));
        }
    }
    file.set_len(0)?;
    write!(file, "{}", std::process::id())?;
    Ok(file)
}

/// Fails with a clear message when a fixed port is taken (0 = any port, never checked).
fn check_ports(ports: &[(u16, &str)]) -> anyhow::Result<()> {
    for (port, flag) in ports {
        if *port == 0 {
            continue;
        }
        if let Err(e) = std::net::TcpListener::bind(("127.0.0.1", *port)) {
            anyhow::bail!("port {port} is not free ({e}): is another sandbox running? choose another with {flag}");
        }
    }
    Ok(())
}

/// The sandbox's subscriber access policy: the lifecycle operator and `ops` (the `tail`
/// certificate it prints) read every cluster.
const SANDBOX_ACCESS_POLICY: &str =
    "subscribers:\n  - name: lifecycle\n    clusters: [\"*\"]\n  - name: ops\n    clusters: [\"*\"]\n";

const FOLDER_README: &str = "This folder belongs to `fleetwatch up` (the local sandbox).\n\n\
- The simulated clusters (control plane and runtimes) live in memory: they start empty and are\n  \
  set up afresh at every `fleetwatch up`; whatever you changed in them is gone after a restart.\n\
- pki/ (certificates), hub-data/ (the hub's event log and subscriber cursors) and the\n  \
  kubeconfigs are kept between runs; delete the folder for a completely fresh start.\n\
- enable-keda.yaml is the `Module` a runtime cluster's user applies to enable keda there\n  \
  (rewritten at every `up`).\n\
- fleetwatch.log has the logs; .lock holds the pid of the running sandbox.\n";

pub async fn run(args: UpArgs) -> anyhow::Result<()> {
    anyhow::ensure!((1..=50).contains(&args.clusters), "--clusters must be between 1 and 50");
    let dir = &args.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let dir = dir.canonicalize()?;
    // Nothing is written before the folder is ours and the ports are free.
    let _lock = lock_folder(&dir)?;
    let sim_ports: Vec<(u16, &str)> =
        (0..=args.clusters as u16).map(|i| (port(args.sim_port, i), "--sim-port")).collect();
    let mut ports = vec![
        (args.hub_port, "--hub-port"),
        (args.admin_port, "--admin-port"),
        (args.lifecycle_metrics_port, "--lifecycle-metrics-port"),
    ];
    ports.extend(sim_ports);
    check_ports(&ports)?;
    std::fs::write(dir.join("README.txt"), FOLDER_README)?;
    let shutdown = crate::shutdown_on_signals();
    let names: Vec<String> = (1..=args.clusters).map(|i| format!("rt-{i}")).collect();

    // Certificates (kept between runs).
    let pki = dir.join("pki");
    if !pki.join("ca.crt").exists() {
        Authority::init(&pki, "sandbox.local")?;
    }
    let ca = Authority::load(&pki)?;
    ca.issue(&pki, &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec!["127.0.0.1".parse()?] }, 30)?;
    ca.issue(&pki, &LeafSpec::Subscriber { name: "lifecycle".into() }, 30)?;
    ca.issue(&pki, &LeafSpec::Subscriber { name: "ops".into() }, 30)?;
    for n in &names {
        ca.issue(&pki, &LeafSpec::Agent { cluster: n.clone() }, 30)?;
    }
    let files = |stem: &str| TlsFiles {
        cert: pki.join(format!("{stem}.crt")),
        key: pki.join(format!("{stem}.key")),
        ca: vec![pki.join("ca.crt")],
    };

    // Simulated clusters.
    let sim = |name: &str, i: u16| {
        let listen = std::net::SocketAddr::from(([127, 0, 0, 1], port(args.sim_port, i)));
        fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions {
            name: name.into(),
            listen,
            ..Default::default()
        })
    };
    let cp = sim("control-plane", 0).await?;
    let cp_kc = dir.join("control-plane.kubeconfig");
    cp.write_kubeconfig(&cp_kc)?;
    let mut runtimes_sims = Vec::new();
    for (i, n) in names.iter().enumerate() {
        let s = sim(n, i as u16 + 1).await?;
        s.write_kubeconfig(&dir.join(format!("{n}.kubeconfig")))?;
        runtimes_sims.push(s);
    }
    let cp_client = cp.client().await?;

    // The control plane's content: CRDs, sample modules, watch configs, runtimes.
    install_crds(&cp_client, &crate::crds_cmd::values()?).await?;
    apply(&cp_client, "sandbox", &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}}))
        .await?;
    // Maintenance windows every night 02:00–04:00 UTC, lifecycle-manager's policy format.
    let policy = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy",
        "metadata": {"name": "default", "namespace": NAMESPACE},
        "spec": {"rules": [], "default": {"days": ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"], "begin": "02:00:00+00:00", "end": "04:00:00+00:00"}}});
    apply(&cp_client, "sandbox", &policy).await?;
    // Every module in the catalog, the offered one too; only the centrally listed ones are in
    // the Runtimes below.
    for m in MODULES.into_iter().chain([OFFERED]) {
        apply(&cp_client, "sandbox", &module_template(m, "1.0.0")).await?;
        apply(&cp_client, "sandbox", &module_template(m, "2.0.0")).await?;
        apply(&cp_client, "sandbox", &release_meta(m, "1.0.0", "2.0.0")).await?;
        let wc = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": format!("{m}-config")},
            "spec": {"resource": {"group": "modules.example.com", "version": "v1", "kind": format!("{}Config", capitalise(m))},
                     "fields": ["spec"], "project": ["/spec"], "subscriber": "lifecycle"}});
        apply(&cp_client, "sandbox", &wc).await?;
    }
    // Central configuration takes precedence: TLS stays on in every redis, replicas at most 5.
    apply(&cp_client, "sandbox", &sample_config_policy()).await?;
    // Kubeconfigs in a namespace of their own, as the chart keeps them: the operator reads
    // Secrets there only.
    apply(
        &cp_client,
        "sandbox",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": KUBECONFIG_NAMESPACE}}),
    )
    .await?;
    for (n, s) in names.iter().zip(&runtimes_sims) {
        let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("{n}-kubeconfig"), "namespace": KUBECONFIG_NAMESPACE},
                            "stringData": {"config": s.kubeconfig_yaml()}});
        apply(&cp_client, "sandbox", &secret).await?;
        let rt = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": n, "namespace": NAMESPACE},
            "spec": {"clusterId": n, "channel": "regular", "kubeconfigSecret": {"name": format!("{n}-kubeconfig")},
                     "modules": MODULES.iter().map(|m| json!({"name": m})).collect::<Vec<_>>()}});
        // Field manager `sandbox` only sets it up; users edit the Runtime freely afterwards.
        apply(&cp_client, "sandbox-setup", &rt).await?;
    }

    // What a runtime cluster's user applies to enable the offered module.
    let enable = dir.join(format!("enable-{OFFERED}.yaml"));
    std::fs::write(&enable, enable_manifest(OFFERED)).with_context(|| format!("cannot write {}", enable.display()))?;

    // The hub, reading WatchConfigs from the control plane.
    let mut hub_cfg = HubConfig::new(std::net::SocketAddr::from(([127, 0, 0, 1], args.hub_port)), files("hub"));
    hub_cfg.admin_listen = Some(std::net::SocketAddr::from(([127, 0, 0, 1], args.admin_port)));
    hub_cfg.data_dir = Some(dir.join("hub-data"));
    hub_cfg.watch_source = fleetwatch_hub::watch_source::WatchSource::ControlPlane(Some(cp_kc.clone()));
    // Least privilege as in the chart: the subscribers the sandbox issues certificates for
    // read everything, any other subscriber is refused (edit the file: it is re-read).
    let policy = dir.join("access-policy.yaml");
    std::fs::write(&policy, SANDBOX_ACCESS_POLICY)
        .with_context(|| format!("cannot write the access policy {}", policy.display()))?;
    hub_cfg.access_policy = Some(policy);
    let hub = Hub::bind(hub_cfg).await.context("cannot start the hub (is another sandbox running? see --hub-port)")?;
    let hub_url: fleetwatch_client::transport::HubUrl = format!("wss://{}", hub.local_addr()).parse()?;
    let admin = hub.admin_addr().context("admin address")?;
    // The admin API behind the control plane's service proxy, under the Service the chart
    // renders: `fleetwatch status --kubeconfig control-plane.kubeconfig` works as it would
    // against a real cluster (docs/operations.md).
    apply(
        &cp_client,
        "sandbox",
        &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ADMIN_SERVICE.0}}),
    )
    .await?;
    let service = json!({"apiVersion": "v1", "kind": "Service",
        "metadata": {"name": ADMIN_SERVICE.1, "namespace": ADMIN_SERVICE.0},
        "spec": {"ports": [{"name": ADMIN_SERVICE.2, "port": 9090, "targetPort": ADMIN_SERVICE.2}]}});
    apply(&cp_client, "sandbox", &service).await?;
    cp.expose_service(ADMIN_SERVICE.0, ADMIN_SERVICE.1, ADMIN_SERVICE.2, admin)
        .map_err(|e| anyhow::anyhow!("cannot expose the admin API behind the control plane's service proxy: {e}"))?;
    let tasks = tokio_util::task::TaskTracker::new();
    tasks.spawn(hub.run(shutdown.clone()));

    // An agent per runtime cluster.
    for (n, s) in names.iter().zip(&runtimes_sims) {
        let runtime = AgentRuntime::new(AgentConfig::new(hub_url.clone(), files(&format!("agent-{n}"))))?;
        let client = s.client().await?;
        let agent = runtime.start(KubeSource::new(client.clone(), format!("simulated cluster {n}")), shutdown.clone());
        tasks.spawn(async move {
            if let Err(e) = agent.wait().await {
                tracing::error!(error = %e, "agent stopped");
            }
        });
        // No kubelet runs in a simulated cluster: report Deployments rolled out, as one would.
        tasks.spawn(fleetwatch_sim::roll_out_deployments(client, Duration::ZERO, shutdown.child_token()));
    }

    // The lifecycle operator, subscribed to the hub.
    let mut sub = SubscriberOptions::new(
        hub_url.clone(),
        fleetwatch_client::client_tls::ClientTls::from_files(files("subscriber-lifecycle"))?,
    );
    sub.durable = Some("lifecycle".into());
    sub.from = StartFrom::Latest;
    let lc = fleetwatch_lifecycle::LifecycleConfig {
        client: cp_client.clone(),
        hub: Some(sub),
        resync: Some(Duration::from_secs(3600)),
        concurrency: 8,
        migrations: fleetwatch_lifecycle::migration::Registry::builtin(),
        kubeconfig_namespace: Some(KUBECONFIG_NAMESPACE.into()),
        ..fleetwatch_lifecycle::LifecycleConfig::new(cp_client.clone())
    };
    let lc_metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
    let metrics_listener = tokio::net::TcpListener::bind(("127.0.0.1", args.lifecycle_metrics_port))
        .await
        .with_context(|| format!("cannot listen on port {} (--lifecycle-metrics-port)", args.lifecycle_metrics_port))?;
    let metrics_addr = metrics_listener.local_addr()?;
    let health = fleetwatch_lifecycle::health::health(lc_metrics.clone(), cp_client.clone());
    tasks.spawn(health.serve(metrics_listener, shutdown.clone()));
    tasks.spawn(fleetwatch_lifecycle::run(lc, lc_metrics, shutdown.clone()));
    tasks.close();

    print_intro(&dir, &cp_kc, &names, &hub_url.to_string(), &admin.to_string());
    println!("  lifecycle:      http://{metrics_addr}/metrics");
    println!();
    let plain = args.plain || !std::io::stdout().is_terminal();
    table(&cp_client, &admin.to_string(), plain, shutdown.clone()).await;
    println!("stopping...");
    tasks.wait().await;
    drop(runtimes_sims);
    drop(cp);
    println!("stopped");
    Ok(())
}

fn print_intro(dir: &Path, cp_kc: &Path, names: &[String], hub: &str, admin: &str) {
    println!("fleetwatch sandbox up in {}", dir.display());
    println!("  control plane:  kubectl --kubeconfig {} -n {NAMESPACE} get runtimes", cp_kc.display());
    for n in names {
        println!("  runtime {n}:   kubectl --kubeconfig {}", dir.join(format!("{n}.kubeconfig")).display());
    }
    println!("  hub:            {hub}   admin: http://{admin}/api/v1/clusters");
    println!("  web view:       http://{admin}/");
    println!(
        "  status:         fleetwatch status --admin http://{admin} --control-plane-kubeconfig {}",
        cp_kc.display()
    );
    println!(
        "    or through the API server's service proxy: fleetwatch status --kubeconfig {0} --control-plane-kubeconfig {0}",
        cp_kc.display()
    );
    println!(
        "  tail events:    fleetwatch tail --hub {hub} --cert {0}/subscriber-ops.crt --key {0}/subscriber-ops.key --ca {0}/ca.crt",
        dir.join("pki").display()
    );
    println!(
        "  try:            kubectl --kubeconfig {} -n {NAMESPACE} edit runtime rt-1   (e.g. channel: fast)",
        cp_kc.display()
    );
    println!(
        "  policy:         redis-central keeps spec.tls on in every redis (kubectl -n {NAMESPACE} get mcp); try \
         kubectl --kubeconfig {} -n redis-system patch redisconfig default --type merge -p '{{\"spec\":{{\"tls\":false}}}}'",
        dir.join(format!("{}.kubeconfig", names.first().map(String::as_str).unwrap_or("rt-1"))).display()
    );
    let user_rt = names.get(SELF_SERVICE_CLUSTER).or(names.first()).map(String::as_str).unwrap_or("rt-1");
    let user_kc = dir.join(format!("{user_rt}.kubeconfig"));
    println!(
        "  self-service:   {OFFERED} is offered, listed by no Runtime: {user_rt}'s user enables it in their cluster \
         (then: describe module {OFFERED}; delete module {OFFERED})"
    );
    println!(
        "  enable {OFFERED}:    kubectl --kubeconfig {} apply -f {}",
        user_kc.display(),
        dir.join(format!("enable-{OFFERED}.yaml")).display()
    );
    println!("  modules:        kubectl --kubeconfig {} get modules", user_kc.display());
    println!("  logs:           {}", dir.join("fleetwatch.log").display());
    println!("  note:           the simulated clusters start afresh at every `up` (see README.txt there)");
    println!("Ctrl-C stops everything.");
}

/// The fleet's modules: those with a ModuleReleaseMeta, and any a runtime's status names.
async fn fleet_modules(cp: &kube::Client) -> Vec<String> {
    let metas: Api<fleetwatch_api::ModuleReleaseMeta> = Api::namespaced(cp.clone(), NAMESPACE);
    let mut names: Vec<String> = match metas.list(&Default::default()).await {
        Ok(list) => list.items.into_iter().map(|m| m.spec.module_name).collect(),
        Err(_) => MODULES.into_iter().chain([OFFERED]).map(String::from).collect(),
    };
    names.sort();
    names.dedup();
    names
}

/// A value of a `--plain` line as logfmt writes it: as it is when it has no space, quote or
/// `=`, else quoted (`nats="1.0.0 → 2.0.0 waits for 02:00Z"`), so a line splits into its
/// fields with any logfmt reader and still reads as the table does.
fn logfmt_value(v: &str) -> String {
    if v.is_empty() || v.contains([' ', '"', '=', '\\']) {
        format!("\"{}\"", v.replace('\\', "\\\\").replace('"', "\\\""))
    } else {
        v.to_string()
    }
}

/// A module's cell: its running version and state; an upgrade that waits shows where it is
/// going and when ("1.0.0 → 2.0.0 waits for 02:00Z"); a module the cluster's user chose (a
/// `Module` object there, the Runtime does not list it) says so ("1.0.0 Ready (user)").
fn module_cell(m: &fleetwatch_api::ModuleStatus) -> String {
    let cell = running_cell(m);
    match m.source {
        Some(fleetwatch_api::chosen::ChosenBy::User) => format!("{cell} (user)"),
        _ => cell,
    }
}

fn running_cell(m: &fleetwatch_api::ModuleStatus) -> String {
    let running = m.actual_version.clone().or(m.installed_version.clone()).unwrap_or_else(|| "-".into());
    match (&m.next_maintenance_window, &m.desired_version) {
        (Some(w), Some(desired)) if *desired != running => {
            let begin = w.split('/').next().unwrap_or_default();
            let at = begin.parse::<jiff::Timestamp>().map(|t| t.strftime("%H:%MZ").to_string()).unwrap_or(begin.into());
            format!("{running} → {desired} waits for {at}")
        }
        _ => format!("{running} {:?}", m.state),
    }
}

/// One row per runtime: agent connection, each module's version and state.
async fn rows(cp: &kube::Client, admin: &str, modules: &[String]) -> Vec<Vec<String>> {
    // Listed untyped and decoded one by one: a Runtime the types cannot read gets a row that
    // says so instead of emptying the table.
    let runtimes: Api<kube::api::DynamicObject> =
        Api::namespaced_with(cp.clone(), NAMESPACE, &kube::core::ApiResource::erase::<Runtime>(&()));
    let clusters: Value = fleetwatch_client::admin_http::get(admin, "/api/v1/clusters")
        .await
        .ok()
        .and_then(|b| serde_json::from_str(&b).ok())
        .unwrap_or_default();
    let connected = |id: &str| {
        clusters["clusters"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["cluster"] == id))
            .is_some_and(|c| c["connected"] == true)
    };
    let Ok(list) = runtimes.list(&Default::default()).await else { return Vec::new() };
    let mut out = Vec::new();
    for obj in list.items {
        let rt = match serde_json::to_value(&obj).and_then(serde_json::from_value::<Runtime>) {
            Ok(rt) => rt,
            Err(e) => {
                let mut row = vec![obj.metadata.name.clone().unwrap_or_default(), "-".into(), "Invalid".into()];
                row.extend(modules.iter().map(|_| "-".to_string()));
                row.push(format!("cannot read: {e}"));
                out.push(row);
                continue;
            }
        };
        let id = rt.cluster_id();
        // Deleted but its modules are still being removed (the finalizer holds it).
        let state = if rt.metadata.deletion_timestamp.is_some() {
            "Deleting".into()
        } else {
            rt.status.as_ref().and_then(|s| s.state).map(|s| format!("{s:?}")).unwrap_or_else(|| "-".into())
        };
        let mut row = vec![
            rt.metadata.name.clone().unwrap_or_default(),
            if connected(&id) { "connected".into() } else { "-".into() },
            state,
        ];
        for m in modules {
            let cell = rt
                .status
                .as_ref()
                .and_then(|s| s.modules.iter().find(|x| &x.name == m))
                .map(module_cell)
                .unwrap_or_else(|| "-".into());
            row.push(cell);
        }
        let window = rt
            .status
            .as_ref()
            .and_then(|s| s.modules.iter().find_map(|m| m.next_maintenance_window.clone()))
            .map(|w| w.split('/').next().unwrap_or_default().to_string())
            .unwrap_or_else(|| "-".into());
        row.push(window);
        out.push(row);
    }
    out
}

/// Runtimes (first cell) in `before` that are not in `now`.
fn removed<'a>(before: &'a [Vec<String>], now: &[Vec<String>]) -> Vec<&'a str> {
    before
        .iter()
        .filter_map(|r| r.first())
        .filter(|name| !now.iter().any(|n| n.first() == Some(*name)))
        .map(String::as_str)
        .collect()
}

/// How often the table is redrawn from a fresh read (agent connections come from the admin
/// API, which has no watch); a change to a Runtime redraws it at once.
const TABLE_POLL: Duration = Duration::from_millis(500);

/// Wakes `changed` on every change the API server reports for a Runtime of the sandbox's
/// namespace (a status write, a deletion), until `shutdown`.
async fn follow_runtime_changes(cp: kube::Client, changed: Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
    use futures_util::StreamExt as _;
    use kube::runtime::{WatchStreamExt as _, watcher};
    let runtimes: Api<kube::api::DynamicObject> =
        Api::namespaced_with(cp, NAMESPACE, &kube::core::ApiResource::erase::<Runtime>(&()));
    let events = watcher(runtimes, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            ev = events.next() => match ev {
                // The first list is the table's first draw: only what changes after counts.
                Some(Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_) | watcher::Event::InitDone)) => {
                    changed.notify_one()
                }
                Some(_) => {}
                None => return,
            },
        }
    }
}

async fn table(cp: &kube::Client, admin: &str, plain: bool, shutdown: CancellationToken) {
    // A deleted Runtime leaves the table within one watch event's time, not a poll's.
    let changed = Arc::new(tokio::sync::Notify::new());
    tokio::spawn(follow_runtime_changes(cp.clone(), changed.clone(), shutdown.child_token()));
    let mut last: Vec<Vec<String>> = Vec::new();
    let mut last_header: Vec<String> = Vec::new();
    let mut drawn = 0usize;
    loop {
        // Columns follow the fleet's modules: one appears when its ModuleReleaseMeta does.
        let modules = fleet_modules(cp).await;
        let mut header = vec!["RUNTIME".to_string(), "AGENT".into(), "STATE".into()];
        header.extend(modules.iter().map(|m| m.to_uppercase()));
        header.push("NEXT WINDOW".into());
        let now = rows(cp, admin, &modules).await;
        if header != last_header {
            last.clear();
            last_header = header.clone();
        }
        if now != last {
            let mut out = std::io::stdout().lock();
            if plain {
                // A Runtime gone since the last poll gets a line too (plain output only
                // prints changes, and a vanished row is one).
                for gone in removed(&last, &now) {
                    let _ = writeln!(out, "runtime={gone} removed");
                }
                for r in now.iter().filter(|r| !last.contains(r)) {
                    let _ = writeln!(
                        out,
                        "{}",
                        header
                            .iter()
                            .zip(r)
                            .map(|(h, v)| format!("{}={}", h.to_lowercase().replace(' ', "-"), logfmt_value(v)))
                            .collect::<Vec<_>>()
                            .join(" ")
                    );
                }
            } else {
                let widths: Vec<usize> = (0..header.len())
                    .map(|i| {
                        std::iter::once(&header)
                            .chain(now.iter())
                            .map(|r| r.get(i).map_or(0, String::len))
                            .max()
                            .unwrap_or(0)
                    })
                    .collect();
                let line = |r: &Vec<String>| {
                    r.iter().zip(&widths).map(|(v, w)| format!("{v:<w$}")).collect::<Vec<_>>().join("  ")
                };
                // Redraw in place: up over the previous table, clear, draw.
                if drawn > 0 {
                    let _ = write!(out, "\x1b[{drawn}A\x1b[J");
                }
                let _ = writeln!(out, "{}", line(&header));
                for r in &now {
                    let _ = writeln!(out, "{}", line(r));
                }
                drawn = now.len() + 1;
            }
            let _ = out.flush();
            last = now;
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = changed.notified() => {}
            _ = tokio::time::sleep(TABLE_POLL) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_values_are_logfmt_quoted_only_when_they_need_it() {
        assert_eq!(logfmt_value("connected"), "connected");
        assert_eq!(logfmt_value("1.0.0 → 2.0.0 waits for 02:00Z"), "\"1.0.0 → 2.0.0 waits for 02:00Z\"");
        assert_eq!(logfmt_value(""), "\"\"");
        assert_eq!(logfmt_value(r#"say "hi"=\"#), r#""say \"hi\"=\\""#);
    }

    #[test]
    fn the_enable_file_is_a_module_named_after_it() {
        let m: fleetwatch_api::chosen::Module = serde_saphyr::from_str(&enable_manifest(OFFERED)).unwrap();
        assert_eq!(m.metadata.name.as_deref(), Some(OFFERED));
        assert_eq!(m.spec, fleetwatch_api::chosen::ModuleSpec::default());
        assert!(!MODULES.contains(&OFFERED));
    }

    #[test]
    fn a_user_chosen_module_says_so() {
        let mut m: fleetwatch_api::ModuleStatus = serde_json::from_value(
            json!({"name": "keda", "actualVersion": "1.0.0", "state": "Ready", "customResourcePolicy": "CreateAndDelete"}),
        )
        .unwrap();
        assert_eq!(module_cell(&m), "1.0.0 Ready");
        m.source = Some(fleetwatch_api::chosen::ChosenBy::User);
        assert_eq!(module_cell(&m), "1.0.0 Ready (user)");
    }

    #[test]
    fn rows_that_vanish_are_named() {
        let row = |n: &str, state: &str| vec![n.to_string(), "connected".into(), state.into()];
        let before = vec![row("rt-1", "Ready"), row("rt-2", "Deleting")];
        assert_eq!(removed(&before, &[row("rt-1", "Warning")]), ["rt-2"]);
        assert!(removed(&before, &before).is_empty());
        assert_eq!(removed(&before, &[]), ["rt-1", "rt-2"]);
    }
}
