//! `fleetwatch bench lifecycle`: the lifecycle operator over many simulated runtime
//! clusters: time to converge at first install and after one module's channel moves, and
//! reconciles per second. No hub: the operator's own resync and watches drive it.
//!
//! `--shards N` (N > 1) runs N operator instances in this process, sharing the Runtimes by
//! shard Leases as `fleetwatch lifecycle --shards N` does; the channel move is measured once
//! every instance holds its share. `--processes` runs each instance as its own `fleetwatch
//! lifecycle` process instead, and reports each one's peak RSS, the Runtimes it caches and
//! its open files.
//!
//! The simulated runtime clusters and their kubelets run in child processes
//! (`lifecycle_sims`), at most 1,500 per process, so 10,000 fit under the open-file limit.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub(super) struct LifecycleBench {
    /// Runtimes, each its own simulated cluster.
    #[arg(long, default_value_t = 100)]
    runtimes: usize,
    /// Modules per runtime.
    #[arg(long, default_value_t = 5)]
    modules: usize,
    /// Reconciles running at once (per instance).
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Shards, and as many operator instances sharing them; 1: one instance, unsharded.
    #[arg(long, default_value_t = 1)]
    shards: u32,
    /// Run each instance as its own `fleetwatch lifecycle` process (with Leases also for one
    /// shard) and report each one's peak RSS.
    #[arg(long)]
    processes: bool,
    /// Simulated runtime clusters per sim child process (tests force several processes
    /// with a small value).
    #[arg(long, default_value_t = super::lifecycle_sims::DEFAULT_PER_PROCESS, hide = true)]
    sims_per_process: usize,
}

/// One `fleetwatch lifecycle` process of the bench.
struct Instance {
    child: tokio::process::Child,
    metrics: String,
}

impl Instance {
    fn spawn(b: &LifecycleBench, kubeconfig: &std::path::Path, ns: &str, log: std::fs::File) -> anyhow::Result<Self> {
        use anyhow::Context;
        // A free port for /metrics (reconciles, Runtimes cached).
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let metrics = format!("127.0.0.1:{port}");
        let exe = std::env::current_exe().context("cannot find own executable")?;
        let child = tokio::process::Command::new(exe)
            .args(["lifecycle", "--control-plane-kubeconfig"])
            .arg(kubeconfig)
            .args(["--shards", &b.shards.to_string(), "--leader-elect-namespace", ns])
            .args(["--leader-elect-lease", "bench-lifecycle", "--resync", "0"])
            .args(["--concurrency", &b.concurrency.to_string(), "--metrics-listen", &metrics])
            .env("RUST_LOG", "warn")
            .stdout(std::process::Stdio::null())
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start a lifecycle process")?;
        Ok(Self { child, metrics })
    }

    async fn gauge(&self, name: &str) -> f64 {
        super::hub_counter(&self.metrics, name).await.unwrap_or(0.0)
    }
}

/// Module `module`'s ModuleTemplate at `version` in namespace `ns`: its namespace
/// `<module>-system` and its manager Deployment there (no replicas; the sims' kubelet stand-in
/// reports it rolled out).
pub(super) fn module_template(ns: &str, module: &str, version: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("{module}-{version}"), "namespace": ns},
        "spec": {"moduleName": module, "version": version,
            "manifest": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("{module}-system")}},
                {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "manager", "namespace": format!("{module}-system"),
                    "labels": {"operator.fleetwatch.dev/module": module, "app.kubernetes.io/version": version}},
                 "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "m"}}, "template": {"metadata": {"labels": {"app": "m"}},
                    "spec": {"containers": [{"name": "c", "image": format!("{module}:{version}")}]}}}}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": format!("{module}-system"), "name": "manager"}}})
}

/// Module `module`'s ModuleReleaseMeta in `ns`: channel `regular` at `version`.
pub(super) fn release_meta(ns: &str, module: &str, version: &str) -> serde_json::Value {
    serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
        "metadata": {"name": module, "namespace": ns},
        "spec": {"moduleName": module, "channels": [{"channel": "regular", "version": version}]}})
}

pub(super) async fn run(b: LifecycleBench, crds: &[serde_json::Value]) -> anyhow::Result<()> {
    use fleetwatch_api::{Runtime, State};
    use kube::api::Api;
    if b.runtimes == 0 || b.modules == 0 || b.shards == 0 {
        bail!("--runtimes, --modules and --shards must be positive");
    }
    let ns = "kcp";
    let cp = fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions {
        name: "control-plane".into(),
        ..Default::default()
    })
    .await?;
    let client = cp.client().await?;
    let apply = |v: serde_json::Value| {
        let client = client.clone();
        async move { fleetwatch_client::kube_apply::apply(&client, "bench", &v).await }
    };
    fleetwatch_client::kube_apply::install_crds(&client, crds).await?;
    apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    let template = |m: usize, version: &str| module_template(ns, &format!("m{m}"), version);
    let meta = |m: usize, version: &str| release_meta(ns, &format!("m{m}"), version);
    for m in 0..b.modules {
        apply(template(m, "1.0.0")).await?;
        apply(template(m, "2.0.0")).await?;
        apply(meta(m, "1.0.0")).await?;
    }
    // The runtime clusters (in child processes: one process's open files hold about
    // 2,500), their kubeconfig Secrets and Runtimes.
    let started = Instant::now();
    let (sims, kubeconfigs) = super::lifecycle_sims::start(b.runtimes, b.sims_per_process, None).await?;
    let secrets = kubeconfigs.into_iter().enumerate().map(|(i, kubeconfig)| {
        apply(serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("rt{i}-kubeconfig"), "namespace": ns}, "stringData": {"config": kubeconfig}}))
    });
    // A few at once: ten thousand one by one take a while, and this is not measured.
    let mut secrets = std::pin::pin!(futures_util::stream::iter(secrets).buffer_unordered(16));
    while let Some(done) = secrets.next().await {
        done?;
    }
    eprintln!(
        "started {} sim runtime clusters in {} processes in {:.1} s",
        b.runtimes,
        sims.len(),
        started.elapsed().as_secs_f64()
    );
    let mut all_metrics: Vec<Arc<fleetwatch_lifecycle::Metrics>> = Vec::new();
    let stop = CancellationToken::new();
    let mut instances = Vec::new();
    let mut procs: Vec<Instance> = Vec::new();
    let dir = super::tempdir()?;
    let kubeconfig = dir.path().join("control-plane.kubeconfig");
    std::fs::write(&kubeconfig, cp.kubeconfig_yaml())?;
    for k in 0..b.shards {
        if b.processes {
            let log = std::fs::File::create(dir.path().join(format!("lifecycle-{k}.log")))?;
            procs.push(Instance::spawn(&b, &kubeconfig, ns, log)?);
            continue;
        }
        let metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
        let shards = (b.shards > 1).then(|| {
            fleetwatch_lifecycle::shards::ShardConfig::new(ns, "bench-lifecycle", &format!("bench-{k}"), b.shards)
        });
        let config = fleetwatch_lifecycle::LifecycleConfig {
            client: client.clone(),
            hub: None,
            resync: None,
            concurrency: b.concurrency,
            migrations: fleetwatch_lifecycle::migration::Registry::builtin(),
            shards,
            ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
        };
        instances.push(tokio::spawn(fleetwatch_lifecycle::run(config, metrics.clone(), stop.clone())));
        all_metrics.push(metrics);
    }
    let reconciles = || {
        let in_process = all_metrics.iter().map(|m| m.reconciles.get()).sum::<u64>();
        let procs = &procs;
        async move {
            let mut n = in_process;
            for p in procs {
                n += p.gauge("fleetwatch_lifecycle_reconciles_total").await as u64;
            }
            n
        }
    };
    if b.shards > 1 {
        // Measure the sharded steady state: every instance holds its shard before the
        // Runtimes are created. (Runtimes created while the first instance gave shards back
        // to the later ones were once never reconciled: 122 of one shard's 329 at 1,000;
        // fixed in `buckets::watch_held`, see docs/performance.md.)
        let leases: Api<k8s_openapi::api::coordination::v1::Lease> = Api::namespaced(client.clone(), ns);
        let since = Instant::now();
        loop {
            let mut holders = std::collections::BTreeSet::new();
            for i in 0..b.shards {
                if let Some(l) = leases.get_opt(&format!("bench-lifecycle-shard-{i}")).await? {
                    holders.extend(l.spec.and_then(|s| s.holder_identity));
                }
            }
            if holders.len() == b.shards as usize {
                break;
            }
            if since.elapsed() > Duration::from_secs(120) {
                bail!("the {} instances did not share the shards within 120 s: holders {holders:?}", b.shards);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    let t0 = Instant::now();
    let r0 = reconciles().await;
    for i in 0..b.runtimes {
        let modules: Vec<_> = (0..b.modules).map(|m| serde_json::json!({"name": format!("m{m}")})).collect();
        apply(serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": format!("rt{i}"), "namespace": ns},
            "spec": {"kubeconfigSecret": {"name": format!("rt{i}-kubeconfig")}, "modules": modules}}))
        .await?;
    }
    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), ns);
    // Until every runtime is Ready with all modules and m0 installed at `want`.
    let converge = |want: &'static str, since: Instant| {
        let runtimes = runtimes.clone();
        async move {
            let limit = Duration::from_secs(600);
            loop {
                let asked = Instant::now();
                let list = runtimes.list(&Default::default()).await?;
                let took = asked.elapsed();
                let n = list
                    .items
                    .iter()
                    .filter(|r| {
                        r.status.as_ref().is_some_and(|s| {
                            s.state == Some(State::Ready)
                                && s.modules.len() == b.modules
                                && s.modules
                                    .iter()
                                    .any(|m| m.name == "m0" && m.installed_version.as_deref() == Some(want))
                        })
                    })
                    .count();
                if n == b.runtimes {
                    return Ok::<f64, anyhow::Error>(since.elapsed().as_secs_f64());
                }
                if since.elapsed() > limit {
                    bail!("only {n} of {} runtimes reached m0 {want} in {} s", b.runtimes, limit.as_secs());
                }
                // Listing 10,000 Runtimes with their status takes a while and competes with
                // the operators for the CPU: poll at most a third of the time.
                tokio::time::sleep(Duration::from_millis(100).max(took * 2)).await;
            }
        }
    };
    let install_secs = converge("1.0.0", t0).await?;
    let install_reconciles = reconciles().await - r0;
    tokio::time::sleep(Duration::from_secs(3)).await; // let busy requeues settle
    // One module's channel moves.
    let r1 = reconciles().await;
    let t1 = Instant::now();
    apply(meta(0, "2.0.0")).await?;
    let move_secs = converge("2.0.0", t1).await?;
    let move_reconciles = reconciles().await - r1;
    // Per process: the Runtimes it caches in full, and its peak RSS (before it stops).
    let mut per_process = Vec::new();
    for p in &procs {
        let cached = p.gauge("fleetwatch_lifecycle_runtimes_cached").await as u64;
        let pid = p.child.id();
        let peak = pid.and_then(|pid| super::rss_kib(pid, "VmHWM:")).unwrap_or(0);
        // Its descriptors (mostly one connection per runtime cluster it reached): what
        // bounds the Runtimes one instance can serve under the open-file limit.
        let fds = pid.and_then(|pid| std::fs::read_dir(format!("/proc/{pid}/fd")).ok()).map_or(0, |d| d.count());
        per_process.push((cached, peak, fds));
    }
    stop.cancel();
    for task in instances {
        let _ = task.await;
    }
    for mut p in procs {
        if let Some(pid) = p.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            // SIGTERM: a clean stop gives the Leases back.
            // SAFETY: kill(2) with a pid of our own child, which has not been reaped (we
            // still hold its handle), so the pid cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        let _ = tokio::time::timeout(Duration::from_secs(20), p.child.wait()).await;
    }
    println!("runtimes × modules:        {} × {}", b.runtimes, b.modules);
    println!("shards (instances):        {}", b.shards);
    println!(
        "initial install converged: {install_secs:.1} s, {install_reconciles} reconciles = {:.0} reconciles/s",
        install_reconciles as f64 / install_secs
    );
    println!(
        "channel move converged:    {move_secs:.2} s, {move_reconciles} reconciles = {:.0} reconciles/s",
        move_reconciles as f64 / move_secs
    );
    for (k, (cached, peak, fds)) in per_process.iter().enumerate() {
        println!(
            "process {k}:                 {cached} Runtimes cached, peak RSS {:.1} MiB, {fds} open files",
            *peak as f64 / 1024.0
        );
    }
    let processes: Vec<serde_json::Value> = per_process
        .iter()
        .map(|(cached, peak, fds)| serde_json::json!({"runtimes_cached": cached, "peak_rss_kib": peak, "open_files": fds}))
        .collect();
    println!(
        "{}",
        serde_json::json!({"bench": "lifecycle", "runtimes": b.runtimes, "modules": b.modules, "shards": b.shards, "install_s": install_secs,
            "install_reconciles": install_reconciles, "channel_move_s": move_secs, "channel_move_reconciles": move_reconciles,
            "processes": processes, "sim_processes": sims.len()})
    );
    drop(sims);
    Ok(())
}
