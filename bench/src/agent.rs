//! `fleetwatch bench agent`: one agent process watching a simulated cluster with many
//! ConfigMaps: the initial list's time to the subscriber, the agent's CPU and RSS idle and
//! under load, and the latency from an API write to the subscriber (each write carries its
//! own timestamp, read back from the event's projection).

use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_certs::TlsFiles;
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_protocol::message::StartFrom;
use futures_util::StreamExt;
use tokio_util::sync::CancellationToken;

use super::{bench_pki, cpu_seconds, percentile, rss_kib, start_hub};

#[derive(Args)]
pub(super) struct AgentBench {
    /// ConfigMaps in the watched cluster.
    #[arg(long, default_value_t = 10_000)]
    objects: usize,
    /// Changes per second during the load phase.
    #[arg(long, default_value_t = 100.0)]
    rate: f64,
    /// Seconds of the idle phase (no changes).
    #[arg(long, default_value_t = 5.0)]
    idle: f64,
    /// Seconds of the load phase.
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
}

pub(super) async fn run(b: AgentBench) -> anyhow::Result<()> {
    use kube::api::{Api, DynamicObject, Patch, PatchParams};
    use kube::discovery::ApiResource;
    if b.objects == 0 || b.rate <= 0.0 {
        bail!("--objects and --rate must be positive");
    }
    let (_tmp, dir) = bench_pki(&["bench".to_string()])?;

    // The runtime cluster, with the objects in place before the agent starts.
    let sim =
        fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions { name: "bench".into(), ..Default::default() })
            .await?;
    let kubeconfig = dir.join("bench.kubeconfig");
    sim.write_kubeconfig(&kubeconfig)?;
    let client = sim.client().await?;
    let ns: Api<DynamicObject> =
        Api::all_with(client.clone(), &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()));
    let ssa = PatchParams::apply("bench").force();
    ns.patch(
        "bench",
        &ssa,
        &Patch::Apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "bench"}})),
    )
    .await?;
    let cms: Api<DynamicObject> = Api::namespaced_with(
        client.clone(),
        "bench",
        &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
    );
    let created = Instant::now();
    let names: Vec<String> = (0..b.objects).map(|i| format!("cm-{i}")).collect();
    futures_util::stream::iter(names.iter().cloned())
        .map(|name| {
            let (cms, ssa) = (cms.clone(), ssa.clone());
            async move {
                let obj = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"t": "0"}});
                cms.patch(&name, &ssa, &Patch::Apply(obj)).await
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    eprintln!("created {} ConfigMaps in {:.1} s", b.objects, created.elapsed().as_secs_f64());

    let wc_dir = dir.join("watch-configs");
    std::fs::create_dir_all(&wc_dir)?;
    std::fs::write(
        wc_dir.join("cms.json"),
        serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": "cms"},
            "spec": {"resource": {"version": "v1", "kind": "ConfigMap"}, "namespace": "bench", "fields": ["data"], "project": ["/data/t"]}})
        .to_string(),
    )?;
    let wc_arg = wc_dir.display().to_string();
    let mut hub = start_hub(&dir, false, &["--watch-config", &wc_arg]).await?;
    let tls = Arc::new(fleetwatch_certs::client_config(&TlsFiles {
        cert: dir.join("subscriber-bench.crt"),
        key: dir.join("subscriber-bench.key"),
        ca: vec![dir.join("ca.crt")],
    })?);
    let mut opts = SubscriberOptions::new(hub.wss.clone(), tls);
    opts.from = StartFrom::Earliest;
    opts.max_in_flight = 100_000;
    let mut sub = Subscription::connect(opts).await?;

    let exe = std::env::current_exe()?;
    let mut agent = tokio::process::Command::new(exe)
        .args(["--log", "warn", "agent", "--hub", &hub.wss.to_string()])
        .arg("--cert")
        .arg(dir.join("agent-bench.crt"))
        .arg("--key")
        .arg(dir.join("agent-bench.key"))
        .arg("--ca")
        .arg(dir.join("ca.crt"))
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()?;
    let agent_pid = agent.id().context("agent pid")?;

    // Phase 1: the initial list arrives as one event per object.
    let started = Instant::now();
    let mut initial = 0usize;
    while initial < b.objects {
        match tokio::time::timeout(Duration::from_secs(60), sub.next()).await {
            Ok(d) => {
                let d = d?;
                if let Delivery::Events(evs) = &d {
                    initial += evs.iter().filter(|e| e.watch.as_deref() == Some("cms")).count();
                }
                if let Some(c) = d.last_cursor() {
                    sub.ack(c).await?;
                }
            }
            Err(_) => bail!("only {initial} of {} initial events arrived in 60 s", b.objects),
        }
    }
    let list_secs = started.elapsed().as_secs_f64();

    // Phase 2: idle.
    let cpu0 = cpu_seconds(agent_pid).unwrap_or(0.0);
    tokio::time::sleep(Duration::from_secs_f64(b.idle)).await;
    let idle_cpu = (cpu_seconds(agent_pid).unwrap_or(0.0) - cpu0) / b.idle * 100.0;
    let idle_rss = rss_kib(agent_pid, "VmRSS:").unwrap_or(0);

    // Phase 3: load; each write carries its own timestamp, read back from the projection.
    let stop = CancellationToken::new();
    let writer = {
        let (cms, stop, rate, objects) = (cms.clone(), stop.clone(), b.rate, b.objects);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / rate));
            let mut i = 0usize;
            while !stop.is_cancelled() {
                tick.tick().await;
                let name = format!("cm-{}", (i * 7919) % objects);
                let t = jiff::Timestamp::now().as_microsecond().to_string();
                let patch = serde_json::json!({"data": {"t": t}});
                let cms = cms.clone();
                tokio::spawn(async move { cms.patch(&name, &PatchParams::default(), &Patch::Merge(patch)).await });
                i += 1;
            }
            i
        })
    };
    let cpu1 = cpu_seconds(agent_pid).unwrap_or(0.0);
    let load_end = Instant::now() + Duration::from_secs_f64(b.duration);
    let mut lat_us: Vec<u64> = Vec::new();
    while Instant::now() < load_end {
        let Ok(d) = tokio::time::timeout_at(load_end.into(), sub.next()).await else { break };
        let d = d?;
        let now = jiff::Timestamp::now().as_microsecond();
        if let Delivery::Events(evs) = &d {
            for e in evs {
                if let Some(t) = e.data["projected"]["/data/t"].as_str().and_then(|t| t.parse::<i64>().ok())
                    && t > 0
                {
                    lat_us.push((now - t).max(0) as u64);
                }
            }
        }
        if let Some(c) = d.last_cursor() {
            sub.ack(c).await?;
        }
    }
    stop.cancel();
    let writes = writer.await.unwrap_or(0);
    let load_cpu = (cpu_seconds(agent_pid).unwrap_or(0.0) - cpu1) / b.duration * 100.0;
    let peak_rss = rss_kib(agent_pid, "VmHWM:").unwrap_or(0);
    lat_us.sort_unstable();
    let (p50, p99) = (percentile(&lat_us, 0.5), percentile(&lat_us, 0.99));
    println!("objects watched:      {}", b.objects);
    println!("initial list:         {:.2} s until all {} objects reached the subscriber", list_secs, b.objects);
    println!("agent idle:           {idle_cpu:.1} % CPU, RSS {:.1} MiB", idle_rss as f64 / 1024.0);
    println!(
        "agent under load:     {load_cpu:.1} % CPU at {:.0} changes/s, peak RSS {:.1} MiB",
        b.rate,
        peak_rss as f64 / 1024.0
    );
    println!("write → subscriber:   p50 {p50:.2} ms, p99 {p99:.2} ms ({} of {writes} writes seen)", lat_us.len());
    println!(
        "{}",
        serde_json::json!({"bench": "agent", "objects": b.objects, "rate": b.rate, "initial_list_s": list_secs,
            "idle_cpu_pct": idle_cpu, "idle_rss_mib": idle_rss as f64 / 1024.0, "load_cpu_pct": load_cpu,
            "peak_rss_mib": peak_rss as f64 / 1024.0, "latency_ms_p50": p50, "latency_ms_p99": p99})
    );
    let _ = agent.start_kill();
    let _ = hub.child.start_kill();
    let _ = agent.wait().await;
    let _ = hub.child.wait().await;
    Ok(())
}
