//! `fleetwatch bench lifecycle`: the lifecycle operator over many simulated runtime
//! clusters: time to converge at first install and after one module's channel moves, and
//! reconciles per second. No hub: the operator's own resync and watches drive it.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::bail;
use clap::Args;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub(super) struct LifecycleBench {
    /// Runtimes, each its own simulated cluster.
    #[arg(long, default_value_t = 100)]
    runtimes: usize,
    /// Modules per runtime.
    #[arg(long, default_value_t = 5)]
    modules: usize,
    /// Reconciles running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
}

pub(super) async fn run(b: LifecycleBench) -> anyhow::Result<()> {
    use fleetwatch_api::{Runtime, State};
    use kube::api::Api;
    use std::sync::atomic::Ordering;
    if b.runtimes == 0 || b.modules == 0 {
        bail!("--runtimes and --modules must be positive");
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
        async move { crate::kube_apply::apply(&client, "bench", &v).await }
    };
    crate::kube_apply::install_crds(&client).await?;
    apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    let template = |m: usize, version: &str| {
        serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
            "metadata": {"name": format!("m{m}-{version}"), "namespace": ns},
            "spec": {"moduleName": format!("m{m}"), "version": version,
                "manifest": [
                    {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": format!("m{m}-system")}},
                    {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "manager", "namespace": format!("m{m}-system"),
                        "labels": {"operator.fleetwatch.dev/module": format!("m{m}"), "app.kubernetes.io/version": version}},
                     "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "m"}}, "template": {"metadata": {"labels": {"app": "m"}},
                        "spec": {"containers": [{"name": "c", "image": format!("m{m}:{version}")}]}}}}],
                "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": format!("m{m}-system"), "name": "manager"}}})
    };
    let meta = |m: usize, version: &str| {
        serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
            "metadata": {"name": format!("m{m}"), "namespace": ns},
            "spec": {"moduleName": format!("m{m}"), "channels": [{"channel": "regular", "version": version}]}})
    };
    for m in 0..b.modules {
        apply(template(m, "1.0.0")).await?;
        apply(template(m, "2.0.0")).await?;
        apply(meta(m, "1.0.0")).await?;
    }
    // The runtime clusters, their kubeconfig Secrets and Runtimes.
    let started = Instant::now();
    let mut sims = Vec::with_capacity(b.runtimes);
    for i in 0..b.runtimes {
        let sim = fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions {
            name: format!("rt{i}"),
            ..Default::default()
        })
        .await?;
        let secret = serde_json::json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("rt{i}-kubeconfig"), "namespace": ns},
            "stringData": {"config": sim.kubeconfig_yaml()}});
        apply(secret).await?;
        sims.push(sim);
    }
    eprintln!("started {} sim runtime clusters in {:.1} s", b.runtimes, started.elapsed().as_secs_f64());
    let metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
    let stop = CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        client: client.clone(),
        hub: None,
        resync: None,
        concurrency: b.concurrency,
        migrations: fleetwatch_lifecycle::migration::Registry::builtin(),
        ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
    };
    tokio::spawn(fleetwatch_lifecycle::run(config, metrics.clone(), stop.clone()));
    let t0 = Instant::now();
    let r0 = metrics.reconciles.load(Ordering::Relaxed);
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
            loop {
                let list = runtimes.list(&Default::default()).await?;
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
                if since.elapsed() > Duration::from_secs(600) {
                    bail!("only {n} of {} runtimes reached m0 {want} in 600 s", b.runtimes);
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    };
    let install_secs = converge("1.0.0", t0).await?;
    let install_reconciles = metrics.reconciles.load(Ordering::Relaxed) - r0;
    tokio::time::sleep(Duration::from_secs(3)).await; // let busy requeues settle
    // One module's channel moves.
    let r1 = metrics.reconciles.load(Ordering::Relaxed);
    let t1 = Instant::now();
    apply(meta(0, "2.0.0")).await?;
    let move_secs = converge("2.0.0", t1).await?;
    let move_reconciles = metrics.reconciles.load(Ordering::Relaxed) - r1;
    stop.cancel();
    println!("runtimes × modules:        {} × {}", b.runtimes, b.modules);
    println!(
        "initial install converged: {install_secs:.1} s, {install_reconciles} reconciles = {:.0} reconciles/s",
        install_reconciles as f64 / install_secs
    );
    println!(
        "channel move converged:    {move_secs:.2} s, {move_reconciles} reconciles = {:.0} reconciles/s",
        move_reconciles as f64 / move_secs
    );
    println!(
        "{}",
        serde_json::json!({"bench": "lifecycle", "runtimes": b.runtimes, "modules": b.modules, "install_s": install_secs,
            "install_reconciles": install_reconciles, "channel_move_s": move_secs, "channel_move_reconciles": move_reconciles})
    );
    drop(sims);
    Ok(())
}
