//! `fleetwatch bench`: measured, not asserted. Figures go to the README.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_agent::{Agent, AgentConfig};
use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_client::transport::HubUrl;
use fleetwatch_protocol::message::StartFrom;
use futures_util::StreamExt;
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Start a hub (a child process) and N synthetic agents over mTLS, and measure what one
    /// subscriber receives: events/s, delivery latency (agent to subscriber) and hub RSS.
    Hub(HubBench),
    /// An agent process watching a simulated cluster with many objects: its RSS and CPU
    /// idle and under load, and the latency from an API write to the subscriber.
    Agent(AgentBench),
    /// The lifecycle operator over many sim runtime clusters: time to converge at first
    /// and after one module's channel moves, and reconciles per second.
    Lifecycle(LifecycleBench),
    /// The simulated API server: LIST of many objects, and watch fan-out latency from a
    /// write to every watcher's event.
    Sim(SimBench),
    /// A chaos soak: a durable hub, agents under Kubernetes-like churn and a durable
    /// subscriber while hub kills, TCP cuts, agent restarts, disk-full, a damaged segment
    /// and deny-list flips are injected; checks per object that nothing was lost.
    Soak(crate::soak::SoakBench),
}

#[derive(Args)]
struct AgentBench {
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

#[derive(Args)]
struct LifecycleBench {
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

#[derive(Args)]
struct SimBench {
    /// Objects in the listed collection.
    #[arg(long, default_value_t = 10_000)]
    list_objects: usize,
    /// Concurrent watchers.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Writes per second during the fan-out phase.
    #[arg(long, default_value_t = 1_000)]
    writes_per_sec: u32,
    /// Seconds of the fan-out phase.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
}

#[derive(Args)]
struct HubBench {
    /// Number of agents (each its own certificate and connection).
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Total events per second offered by all agents together.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Seconds to measure (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up not counted.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Objects per agent.
    #[arg(long, default_value_t = 100)]
    objects: u64,
    /// Bytes of padding per event.
    #[arg(long, default_value_t = 0)]
    payload: usize,
    /// Give the hub a data directory (durable log with fsync) instead of memory only.
    #[arg(long)]
    durable: bool,
}

pub async fn run(args: BenchArgs) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Hub(b) => hub(b).await,
        BenchWhat::Agent(b) => agent(b).await,
        BenchWhat::Lifecycle(b) => lifecycle(b).await,
        BenchWhat::Soak(b) => crate::soak::run(b).await,
        BenchWhat::Sim(b) => {
            let opts = fleetwatch_sim::BenchOptions {
                list_objects: b.list_objects,
                watchers: b.watchers,
                writes_per_sec: b.writes_per_sec,
                duration: Duration::try_from_secs_f64(b.duration).context("--duration")?,
                ..fleetwatch_sim::BenchOptions::default()
            };
            let report = fleetwatch_sim::bench(opts).await?;
            println!("{report}");
            Ok(())
        }
    }
}

struct HubProcess {
    child: tokio::process::Child,
    wss: HubUrl,
    admin: String,
}

async fn start_hub(dir: &Path, durable: bool, extra: &[&str]) -> anyhow::Result<HubProcess> {
    let exe = std::env::current_exe().context("cannot find own executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--log", "warn", "hub", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"])
        .arg("--cert")
        .arg(dir.join("hub.crt"))
        .arg("--key")
        .arg(dir.join("hub.key"))
        .arg("--client-ca")
        .arg(dir.join("ca.crt"))
        .args(["--max-events-per-sec", "1000000"]);
    if durable {
        cmd.arg("--data-dir").arg(dir.join("hub-data"));
    }
    cmd.args(extra);
    cmd.stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
    let mut child = cmd.spawn().context("cannot start hub process")?;
    let stdout = child.stdout.take().context("hub stdout")?;
    let mut lines = BufReader::new(stdout).lines();
    let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .context("hub did not start in 20 s")??
        .context("hub exited before listening")?;
    let (wss, admin) = parse_listening(&line).with_context(|| format!("unexpected hub output {line:?}"))?;
    Ok(HubProcess { child, wss: wss.parse()?, admin })
}

/// Reads `hub listening wss=wss://A admin=http://B`.
fn parse_listening(line: &str) -> Option<(String, String)> {
    let mut wss = None;
    let mut admin = None;
    for part in line.split_whitespace() {
        if let Some(v) = part.strip_prefix("wss=") {
            wss = Some(v.to_string());
        }
        if let Some(v) = part.strip_prefix("admin=http://") {
            admin = Some(v.to_string());
        }
    }
    Some((wss?, admin?))
}

pub(crate) async fn http_get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

fn percentile(sorted: &[u64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let idx = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[idx] as f64 / 1000.0
}

/// A temporary CA with a hub certificate, a `bench` subscriber and one agent per cluster.
fn bench_pki(clusters: &[String]) -> anyhow::Result<(TempDir, PathBuf)> {
    let tmp = tempdir()?;
    let dir = tmp.path().to_path_buf();
    Authority::init(&dir, "bench.local")?;
    let ca = Authority::load(&dir)?;
    ca.issue(&dir, &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec!["127.0.0.1".parse()?] }, 1)?;
    ca.issue(&dir, &LeafSpec::Subscriber { name: "bench".into() }, 1)?;
    for c in clusters {
        ca.issue(&dir, &LeafSpec::Agent { cluster: c.clone() }, 1)?;
    }
    Ok((tmp, dir))
}

async fn hub(b: HubBench) -> anyhow::Result<()> {
    if b.agents == 0 || b.rate <= 0.0 || b.duration <= 0.0 {
        bail!("--agents, --rate and --duration must be positive");
    }
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;
    let mut hub = start_hub(&dir, b.durable, &[]).await?;
    let hub_pid = hub.child.id().context("hub pid")?;
    eprintln!("hub pid {hub_pid} at {} (admin {})", hub.wss, hub.admin);

    let files = |stem: &str| TlsFiles {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
        ca: vec![dir.join("ca.crt")],
    };
    let tls = Arc::new(fleetwatch_certs::client_config(&files("subscriber-bench"))?);
    let mut opts = SubscriberOptions::new(hub.wss.clone(), tls);
    opts.from = StartFrom::Latest;
    opts.max_in_flight = 100_000;
    let mut sub = Subscription::connect(opts).await.context("subscriber")?;

    let stop = CancellationToken::new();
    let per_agent = b.rate / b.agents as f64;
    for i in 0..b.agents {
        let mut cfg = AgentConfig::new(hub.wss.clone(), files(&format!("agent-bench-{i}")));
        cfg.outbox_capacity = 1_000_000;
        let agent = Agent::new(cfg)?;
        let (tx, rx) = mpsc::channel(1024);
        let source = SyntheticSource { objects: b.objects, rate: per_agent, total: None, payload: b.payload };
        tokio::spawn(source.run(tx, stop.child_token()));
        let s = stop.clone();
        tokio::spawn(async move { agent.run(rx, s, false).await });
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Wait until every agent is connected.
    let connect_started = Instant::now();
    loop {
        let body = http_get(&hub.admin, "/api/v1/clusters").await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let connected = v["clusters"].as_array().map_or(0, |a| a.iter().filter(|c| c["connected"] == true).count());
        if connected >= b.agents {
            eprintln!("{connected} agents connected in {:.1} s", connect_started.elapsed().as_secs_f64());
            break;
        }
        if connect_started.elapsed() > Duration::from_secs(120) {
            bail!("only {connected} of {} agents connected after 120 s", b.agents);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let warmup_end = Instant::now() + Duration::from_secs_f64(b.warmup);
    let end = warmup_end + Duration::from_secs_f64(b.duration);
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut counted = 0u64;
    let mut resyncs = 0u64;
    let mut peak_rss = 0u64;
    let mut last_sample = Instant::now();
    while Instant::now() < end {
        let d = match tokio::time::timeout_at(end.into(), sub.next()).await {
            Ok(d) => d?,
            Err(_) => break,
        };
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        match &d {
            Delivery::Events(evs) if now >= warmup_end => {
                for e in evs {
                    let lat = wall.as_microsecond() - e.time.as_microsecond();
                    latencies_us.push(lat.max(0) as u64);
                }
                counted += evs.len() as u64;
            }
            Delivery::ResyncRequired(_) => resyncs += 1,
            _ => {}
        }
        if let Some(c) = d.last_cursor() {
            sub.ack(c).await?;
        }
        if now.duration_since(last_sample) > Duration::from_millis(250) {
            last_sample = now;
            peak_rss = peak_rss.max(rss_kib(hub_pid, "VmRSS:").unwrap_or(0));
        }
    }
    let hwm = rss_kib(hub_pid, "VmHWM:").unwrap_or(peak_rss);
    stop.cancel();
    latencies_us.sort_unstable();
    let rate = counted as f64 / b.duration;
    let p50 = percentile(&latencies_us, 0.50);
    let p99 = percentile(&latencies_us, 0.99);
    let max = percentile(&latencies_us, 1.0);
    println!("agents:               {}", b.agents);
    println!("offered rate:         {:.0} events/s", b.rate);
    println!("delivered:            {counted} events in {:.1} s = {rate:.0} events/s", b.duration);
    println!("latency p50 / p99:    {p50:.2} ms / {p99:.2} ms (max {max:.2} ms)");
    println!("hub peak RSS:         {:.1} MiB", hwm as f64 / 1024.0);
    println!("resync-required seen: {resyncs}");
    println!(
        "{}",
        serde_json::json!({
            "bench": "hub", "agents": b.agents, "offered_rate": b.rate, "durable": b.durable,
            "delivered_per_sec": rate.round(), "latency_ms_p50": p50, "latency_ms_p99": p99,
            "latency_ms_max": max, "hub_peak_rss_mib": (hwm as f64 / 1024.0 * 10.0).round() / 10.0,
        })
    );
    let _ = hub.child.start_kill();
    let _ = hub.child.wait().await;
    Ok(())
}

/// A temporary directory removed on drop.
struct TempDir(PathBuf);

impl TempDir {
    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn tempdir() -> anyhow::Result<TempDir> {
    let p = std::env::temp_dir().join(format!(
        "fleetwatch-bench-{}-{}",
        std::process::id(),
        jiff::Timestamp::now().as_millisecond()
    ));
    std::fs::create_dir_all(&p)?;
    Ok(TempDir(p))
}

/// CPU seconds (user + system) a process used so far.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name (which is in parentheses and may hold spaces).
    let rest = stat.rsplit_once(')')?.1;
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: f64 = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    Some(ticks / 100.0) // USER_HZ is 100 on Linux
}

async fn agent(b: AgentBench) -> anyhow::Result<()> {
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

async fn lifecycle(b: LifecycleBench) -> anyhow::Result<()> {
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
