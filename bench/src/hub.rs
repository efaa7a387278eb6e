//! `fleetwatch bench hub`: many synthetic agents into one hub or several hub replicas (child
//! processes), measured at one subscriber in the bench process: delivered events/s,
//! agent-to-subscriber latency, the hubs' peak RSS, and the CPU of the hubs and of the load
//! apart. The agents run in `--load-procs` child processes (see [`super::load`]), or in the
//! bench process with `--load-procs 0`.
//!
//! `--bus embedded,nats` runs the same load once per bus, one after the other, and prints
//! them side by side. On NATS JetStream the hubs are `--hub-replicas` processes on one
//! stream (a local `nats-server` the bench starts, unless `--nats-url` names one); agents
//! are spread over the replicas (each lists all of them, its own first) and
//! `--kill-replica-after S` SIGKILLs one replica S seconds into the measurement, then
//! reports how long its agents took to be connected again and, per object, whether the
//! final state (or a `resync-required` for its cluster) reached the subscriber.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_bus::nats::server::LocalNatsServer;
use fleetwatch_certs::TlsFiles;
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_client::transport::{HubUrl, HubUrls};
use fleetwatch_protocol::message::StartFrom;
use futures_util::StreamExt;

use super::load::{Load, LoadSpec};
use super::{HubProcess, bench_pki, percentile, rss_kib, start_hub};

#[derive(Args)]
pub(super) struct HubBench {
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
    /// Seconds the agents may take to connect before the bench gives up.
    #[arg(long, default_value_t = 120.0)]
    connect_wait: f64,
    /// Objects per agent.
    #[arg(long, default_value_t = 100)]
    objects: u64,
    /// Bytes of padding per event.
    #[arg(long, default_value_t = 0)]
    payload: usize,
    /// Give the embedded bus a data directory (durable log with fsync) instead of memory only.
    #[arg(long)]
    durable: bool,
    /// The buses to measure, one run each, printed side by side: `embedded` (memory, or
    /// the segment log with --durable) and `nats` (JetStream).
    #[arg(long, value_delimiter = ',', default_value = "embedded")]
    bus: Vec<BusKind>,
    /// A running NATS server (nats://HOST:PORT) for `--bus nats`; without it the bench
    /// starts a local `nats-server -js` (the Debian package) in a temporary directory.
    #[arg(long)]
    nats_url: Option<String>,
    /// Hub processes on the JetStream bus (the embedded bus runs one).
    #[arg(long, default_value_t = 1)]
    hub_replicas: usize,
    /// SIGKILL the last replica this many seconds into the measurement (needs
    /// --hub-replicas 2 or more); agents fail over and nothing may be lost.
    #[arg(long)]
    kill_replica_after: Option<f64>,
    /// Run the agents in this many child processes (0: in the bench process). Keeps the load
    /// generator's CPU apart from the measuring subscriber's, reports it separately from
    /// the hub's, and is needed past ~19,000 agents (a process's open-file limit).
    #[arg(long, default_value_t = 1)]
    load_procs: usize,
    /// Subscribers reading everything (one measured, the others only read and acknowledge):
    /// what each further subscriber costs the hub.
    #[arg(long, default_value_t = 1)]
    subscribers: usize,
    /// Also run the same load straight against nats-server JetStream (file storage, the
    /// same events and mutual TLS, one durable consumer; the bench starts the server),
    /// alternating with the hub for `--rounds` rounds, and print the ratios
    /// fleetwatch/JetStream of delivered/s, p99 and server RSS (medians over the rounds).
    #[arg(long)]
    vs_nats: bool,
    /// Rounds of each side with --vs-nats (the order alternates every round).
    #[arg(long, default_value_t = 3, requires = "vs_nats")]
    rounds: usize,
    /// Print one JSON object with every figure as the last line.
    #[arg(long)]
    json: bool,
    /// Measure the idle cost instead: the agents connect with no events to send (`--rate`
    /// is not used), and over `--duration` seconds after `--warmup` the bench reports the
    /// CPU of the load processes and of the hubs, per 1,000 agents, and the hubs' RSS per
    /// session (above their RSS before the agents came).
    #[arg(long, conflicts_with_all = ["vs_nats", "kill_replica_after"])]
    idle: bool,
    /// Run the hubs and load processes from this `fleetwatch` binary instead of this one
    /// (an older build measured by the same bench; it must know `bench hub-load`).
    #[arg(long)]
    child_exe: Option<std::path::PathBuf>,
}

/// A bus the bench can run on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum BusKind {
    /// The hub's own bus (memory, or the segment log with --durable).
    Embedded,
    /// NATS JetStream, shared by the hub replicas.
    Nats,
    /// No hub: the agents publish to JetStream directly (`--vs-nats`).
    #[value(skip)]
    JetStreamDirect,
}

/// What one run measured.
struct Report {
    bus: BusKind,
    replicas: usize,
    agents_connected: usize,
    connect_secs: f64,
    delivered_per_sec: f64,
    /// Events the hubs accepted per second (from their metrics; not with a replica kill).
    hub_received_per_sec: Option<f64>,
    p50: f64,
    p99: f64,
    p999: f64,
    max: f64,
    peak_rss_bytes: u64,
    /// CPU the hub replicas used during the measurement, in % of one core (summed).
    hub_cpu_percent: f64,
    /// CPU the load processes and the bench process used meanwhile, in % of one core.
    load_cpu_percent: f64,
    /// CPU the local nats-server used meanwhile, in % of one core (when the bench started it).
    nats_cpu_percent: Option<f64>,
    resyncs: u64,
    /// The resyncs by reason, numbers (offsets, counts) blanked to `N`.
    resync_reasons: std::collections::BTreeMap<String, u64>,
    kill: Option<KillReport>,
}

/// A resync's reason with its numbers blanked, so reasons of one kind count together.
fn reason_kind(reason: &str) -> String {
    let mut out = String::with_capacity(reason.len().min(200));
    let mut in_number = false;
    for c in reason.chars().take(200) {
        if c.is_ascii_digit() {
            if !in_number {
                out.push('N');
            }
            in_number = true;
        } else {
            in_number = false;
            out.push(c);
        }
    }
    out
}

/// What a replica kill did.
struct KillReport {
    agents_moved: usize,
    reconnected_secs: Option<f64>,
    objects: u64,
    lost: u64,
    resynced_clusters: usize,
}

pub(super) async fn run(b: HubBench) -> anyhow::Result<()> {
    if let Some(exe) = &b.child_exe {
        let exe = std::fs::canonicalize(exe).with_context(|| format!("--child-exe {}", exe.display()))?;
        let _ = super::CHILD_EXE.set(exe);
    }
    if b.idle {
        return idle(&b).await;
    }
    if b.agents == 0 || b.rate <= 0.0 || b.duration <= 0.0 || b.hub_replicas == 0 || b.subscribers == 0 {
        bail!("--agents, --rate, --duration, --hub-replicas and --subscribers must be positive");
    }
    if b.hub_replicas > 1 && !b.bus.contains(&BusKind::Nats) {
        bail!("--hub-replicas > 1 needs --bus nats: independent embedded hubs are independent streams");
    }
    if let Some(k) = b.kill_replica_after {
        if b.hub_replicas < 2 || b.bus != [BusKind::Nats] {
            bail!("--kill-replica-after needs --bus nats and --hub-replicas 2 or more");
        }
        if !(0.0..b.duration).contains(&k) {
            bail!("--kill-replica-after must fall within --duration");
        }
    }
    if b.vs_nats {
        return vs_nats(&b).await;
    }
    let mut reports = Vec::new();
    for &bus in &b.bus {
        let report = run_one(&b, bus).await.with_context(|| format!("bench on the {bus:?} bus"))?;
        print_report(&b, &report);
        reports.push(report);
    }
    if reports.len() > 1 {
        println!();
        println!(
            "{:<10} {:>8} {:>12} {:>9} {:>9} {:>12} {:>8} {:>8}",
            "bus", "replicas", "delivered/s", "p50 ms", "p99 ms", "peak RSS MiB", "hub CPU", "load CPU"
        );
        for r in &reports {
            println!(
                "{:<10} {:>8} {:>12.0} {:>9.2} {:>9.2} {:>12.1} {:>7.0}% {:>7.0}%",
                format!("{:?}", r.bus).to_lowercase(),
                r.replicas,
                r.delivered_per_sec,
                r.p50,
                r.p99,
                mib(r.peak_rss_bytes),
                r.hub_cpu_percent,
                r.load_cpu_percent,
            );
        }
    }
    if b.json {
        // The first run's figures at the top level, every run under "runs".
        let runs: Vec<serde_json::Value> = reports.iter().map(|r| report_json(&b, r)).collect();
        let mut json = runs.first().cloned().unwrap_or_default();
        json["runs"] = serde_json::Value::Array(runs);
        println!("{json}");
    }
    Ok(())
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1 << 20) as f64
}

/// The hubs of one run, and the nats-server the bench started for them (stopped on drop).
struct Hubs {
    nats: Option<LocalNatsServer>,
    replicas: usize,
    hubs: Vec<HubProcess>,
    pids: Vec<u32>,
}

/// Starts the bus (a local nats-server for `--bus nats` without `--nats-url`, with a fresh
/// stream per run: earlier runs' history must not count) and the hub replicas on it.
async fn start_hubs(b: &HubBench, bus: BusKind, dir: &std::path::Path) -> anyhow::Result<Hubs> {
    let mut nats = None;
    let replicas = if bus == BusKind::Nats { b.hub_replicas } else { 1 };
    let mut extra: Vec<String> = Vec::new();
    if bus == BusKind::Nats {
        let url = match &b.nats_url {
            Some(u) => u.clone(),
            None => {
                let store = dir.join("nats");
                let server = tokio::task::spawn_blocking(move || LocalNatsServer::start(&store))
                    .await?
                    .context("cannot start a local nats-server for --bus nats")?;
                let url = server.url();
                nats = Some(server);
                url
            }
        };
        let stream = format!("bench{}", jiff::Timestamp::now().as_millisecond());
        extra.extend(["--bus".into(), url, "--bus-stream".into(), stream]);
    }
    let extra_refs: Vec<&str> = extra.iter().map(String::as_str).collect();
    let mut hubs: Vec<HubProcess> = Vec::new();
    for _ in 0..replicas {
        hubs.push(start_hub(dir, b.durable && bus == BusKind::Embedded, &extra_refs).await?);
    }
    let pids: Vec<u32> = hubs.iter().map(|h| h.child.id().context("hub pid")).collect::<Result<_, _>>()?;
    for (h, pid) in hubs.iter().zip(&pids) {
        eprintln!("hub pid {pid} at {} (admin {})", h.wss, h.admin);
    }
    Ok(Hubs { nats, replicas, hubs, pids })
}

async fn run_one(b: &HubBench, bus: BusKind) -> anyhow::Result<Report> {
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;

    // The bus and the hubs.
    let Hubs { nats, replicas, mut hubs, pids } = start_hubs(b, bus, &dir).await?;
    let urls: Vec<HubUrl> = hubs.iter().map(|h| h.wss.clone()).collect();
    // Replica `first` first, then the others in order.
    let rotated = |first: usize| -> anyhow::Result<HubUrls> {
        Ok(HubUrls::new((0..urls.len()).map(|k| urls[(first + k) % urls.len()].clone()).collect())?)
    };

    let files = |stem: &str| TlsFiles {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
        ca: vec![dir.join("ca.crt")],
    };
    let tls = Arc::new(fleetwatch_certs::client_config(&files("subscriber-bench"))?);
    let mut opts = SubscriberOptions::new(rotated(0)?, tls);
    opts.from = StartFrom::Latest;
    opts.max_in_flight = 100_000;
    if b.kill_replica_after.is_some() {
        // Through the kill the subscriber must resume where it was: durable.
        opts.durable = Some("bench".into());
    }
    // Extra subscribers (`--subscribers`): they read and acknowledge everything, so the hub
    // fans every event out to all of them; only the first is measured.
    let stop_extra = tokio_util::sync::CancellationToken::new();
    for k in 1..b.subscribers {
        let mut o = opts.clone();
        o.durable = opts.durable.as_ref().map(|d| format!("{d}-{k}"));
        let mut extra = Subscription::connect(o).await.with_context(|| format!("subscriber {k}"))?;
        let stop = stop_extra.clone();
        tokio::spawn(async move {
            loop {
                let d = tokio::select! {
                    _ = stop.cancelled() => break,
                    d = extra.next() => d,
                };
                match d {
                    Ok(d) => {
                        if let Some(c) = d.last_cursor()
                            && extra.ack(c).await.is_err()
                        {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!("extra subscriber {k}: {e}");
                        break;
                    }
                }
            }
        });
    }
    let _stop_extra = stop_extra.drop_guard();
    let mut sub = Subscription::connect(opts).await.context("subscriber")?;

    // With a kill, every source stops after a known number of changes, so the final state of
    // every object is known and can be checked at the subscriber.
    let per_agent = b.rate / b.agents as f64;
    let total = b.kill_replica_after.map(|_| ((b.warmup + b.duration) * per_agent).ceil().max(b.objects as f64) as u64);
    let source = SyntheticSource { objects: b.objects, rate: per_agent, total, payload: b.payload };
    let spec =
        LoadSpec { pki: dir.clone(), hubs: urls.clone(), agents: b.agents, source: source.clone(), jetstream: None };
    let connect_started = Instant::now();
    let admins: Vec<String> = hubs.iter().map(|h| h.admin.clone()).collect();
    let mut curve = ConnectCurve::new(b.agents, &admins, &pids).await;
    let mut load = Load::start(&spec, b.load_procs).await?;
    loop {
        let connected = load.connected();
        curve.tick(connected, &load).await;
        if connected >= b.agents {
            eprintln!("{connected} agents connected in {:.1} s", connect_started.elapsed().as_secs_f64());
            break;
        }
        if connect_started.elapsed().as_secs_f64() > b.connect_wait {
            bail!("only {connected} of {} agents connected after {} s", b.agents, b.connect_wait);
        }
        // Keep reading meanwhile (not counted): a subscriber that stops reading is a stalled
        // one, and the hub disconnects it.
        if let Ok(d) = tokio::time::timeout(Duration::from_millis(100), sub.next()).await
            && let Some(c) = d?.last_cursor()
        {
            sub.ack(c).await?;
        }
    }
    let connect_secs = connect_started.elapsed().as_secs_f64();

    let agents_connected = load.connected();
    let warmup_end = Instant::now() + Duration::from_secs_f64(b.warmup);
    let end = warmup_end + Duration::from_secs_f64(b.duration);
    // CPU seconds at the start of the measurement: hubs, load processes, this process.
    let mut cpu_at_start: Option<(f64, f64, f64)> = None;
    let mut cpu_used = (0.0, 0.0, 0.0);
    // Events the hubs accepted (summed over replicas) at the start and end of the
    // measurement: beside what the subscriber got, it shows where a shortfall is.
    let received = || async {
        let mut total = 0.0;
        for a in &admins {
            total += super::hub_counter(a, "fleetwatch_hub_events_received_total").await.unwrap_or(0.0);
        }
        total
    };
    let mut received_at_start: Option<f64> = None;
    let mut received_during: Option<f64> = None;
    let nats_pid = nats.as_ref().and_then(LocalNatsServer::pid);
    let cpu_now = |load: &Load| {
        let hubs: f64 = pids.iter().filter_map(|p| super::cpu_seconds(*p)).sum();
        let nats = nats_pid.and_then(super::cpu_seconds).unwrap_or(0.0);
        (hubs, load.cpu_seconds() + super::cpu_seconds(std::process::id()).unwrap_or(0.0), nats)
    };
    let kill_at = b.kill_replica_after.map(|k| warmup_end + Duration::from_secs_f64(k));
    let mut killed: Option<Instant> = None;
    let mut reconnected: Option<f64> = None;
    let victim = replicas - 1;
    // Agents seen losing their session after the kill (those that were on the victim: its
    // sockets close at once). Which agent was on which replica is not known beforehand:
    // under a connection storm some fail over from their first choice at the start.
    let mut moved = 0usize;
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut counted = 0u64;
    let mut resyncs = 0u64;
    let mut resync_reasons: std::collections::BTreeMap<String, u64> = std::collections::BTreeMap::new();
    // For the kill check: (cluster, subject) -> highest generation, clusters resynced.
    let mut generations: HashMap<(String, String), u64> = HashMap::new();
    let mut resynced: HashSet<String> = HashSet::new();
    let mut peak_rss = vec![0u64; replicas];
    let mut last_sample = Instant::now();
    // With a kill, keep reading after the measurement until every object is final (or 60 s).
    let drain_end = end + if kill_at.is_some() { Duration::from_secs(60) } else { Duration::ZERO };
    loop {
        let now = Instant::now();
        if now >= warmup_end && cpu_at_start.is_none() {
            cpu_at_start = Some(cpu_now(&load));
            received_at_start = Some(received().await);
        }
        if now >= end && received_during.is_none() && kill_at.is_none() {
            received_during = Some(received().await - received_at_start.unwrap_or(0.0));
        }
        if now >= end && cpu_used == (0.0, 0.0, 0.0) {
            // The victim's CPU is gone with it after a kill: count the survivors only.
            let (h0, l0, n0) = cpu_at_start.unwrap_or_default();
            let (h1, l1, n1) = cpu_now(&load);
            cpu_used = ((h1 - h0).max(0.0), (l1 - l0).max(0.0), (n1 - n0).max(0.0));
        }
        if now >= drain_end || (now >= end && kill_at.is_none()) {
            break;
        }
        if let (Some(at), None) = (kill_at, killed)
            && now >= at
        {
            load.mark().await?;
            let _ = hubs[victim].child.start_kill();
            killed = Some(now);
            eprintln!("killed replica {victim} (pid {})", pids[victim]);
        }
        if let (Some(k), None) = (killed, reconnected) {
            moved = moved.max(load.moved());
            if load.connected() >= b.agents && moved > 0 {
                reconnected = Some(k.elapsed().as_secs_f64());
                eprintln!(
                    "the {moved} agents of the killed replica connected again in {:.2} s",
                    k.elapsed().as_secs_f64()
                );
            }
        }
        if now >= end
            && killed.is_some()
            && reconnected.is_some()
            && missing(&source, &clusters, &generations, &resynced) == 0
        {
            break;
        }
        let deadline = if now < end { end } else { drain_end };
        let d = match tokio::time::timeout_at((now + Duration::from_millis(100)).min(deadline).into(), sub.next()).await
        {
            Ok(d) => d?,
            Err(_) => continue,
        };
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        match &d {
            Delivery::Events(evs) => {
                if now >= warmup_end && now < end {
                    for e in evs {
                        let lat = wall.as_microsecond() - e.time.as_microsecond();
                        latencies_us.push(lat.max(0) as u64);
                    }
                    counted += evs.len() as u64;
                }
                if total.is_some() {
                    for e in evs {
                        let g = e.data["generation"].as_u64().unwrap_or(0);
                        let slot = generations.entry((e.cluster.clone(), e.subject.clone())).or_default();
                        *slot = (*slot).max(g);
                    }
                }
            }
            Delivery::ResyncRequired(r) => {
                resyncs += 1;
                *resync_reasons.entry(reason_kind(&r.reason)).or_default() += 1;
                if killed.is_some() {
                    resynced.insert(r.cluster.clone());
                }
            }
        }
        if let Some(c) = d.last_cursor() {
            sub.ack(c).await?;
        }
        if now.duration_since(last_sample) > Duration::from_millis(250) {
            last_sample = now;
            for (i, pid) in pids.iter().enumerate() {
                if killed.is_none() || i != victim {
                    peak_rss[i] = peak_rss[i].max(rss_kib(*pid, "VmRSS:").unwrap_or(0));
                }
            }
        }
    }
    for (i, pid) in pids.iter().enumerate() {
        if killed.is_none() || i != victim {
            peak_rss[i] = peak_rss[i].max(rss_kib(*pid, "VmHWM:").unwrap_or(0));
        }
    }
    if cpu_used == (0.0, 0.0, 0.0) {
        let (h0, l0, n0) = cpu_at_start.unwrap_or_default();
        let (h1, l1, n1) = cpu_now(&load);
        cpu_used = ((h1 - h0).max(0.0), (l1 - l0).max(0.0), (n1 - n0).max(0.0));
    }
    // Let the agents finish (they drain what is pending) before the hubs go away.
    load.stop().await;
    latencies_us.sort_unstable();
    let kill = killed.map(|_| {
        let lost = missing(&source, &clusters, &generations, &resynced);
        KillReport {
            agents_moved: moved,
            reconnected_secs: reconnected,
            objects: b.objects * b.agents as u64,
            lost,
            resynced_clusters: resynced.iter().filter(|c| c.as_str() != "*").count(),
        }
    });
    for h in &mut hubs {
        let _ = h.child.start_kill();
        let _ = h.child.wait().await;
    }
    drop(nats);
    Ok(Report {
        bus,
        replicas,
        agents_connected,
        connect_secs,
        delivered_per_sec: counted as f64 / b.duration,
        hub_received_per_sec: received_during.map(|r| r / b.duration),
        p50: percentile(&latencies_us, 0.50),
        p99: percentile(&latencies_us, 0.99),
        p999: percentile(&latencies_us, 0.999),
        max: percentile(&latencies_us, 1.0),
        peak_rss_bytes: peak_rss.iter().copied().max().unwrap_or(0) * 1024,
        hub_cpu_percent: cpu_used.0 / b.duration * 100.0,
        load_cpu_percent: cpu_used.1 / b.duration * 100.0,
        nats_cpu_percent: nats_pid.map(|_| cpu_used.2 / b.duration * 100.0),
        resyncs,
        resync_reasons,
        kill,
    })
}

/// The connect curve, printed every 10 s while the agents connect, with where the time
/// went in those 10 s: sessions the hubs opened, handshakes they failed (by reason: a
/// client that gave up while queued is `abandoned`, one too slow `handshake-timeout`, ...),
/// the agents' connect attempts that reached no hub (and of those, timed out), and the CPU
/// of the hubs and of the load. A storm that stalls shows which side runs out of what.
struct ConnectCurve<'a> {
    agents: usize,
    admins: &'a [String],
    pids: &'a [u32],
    started: Instant,
    next: Instant,
    last: CurvePoint,
}

#[derive(Default)]
struct CurvePoint {
    /// Per hub: sessions opened, and handshakes failed by reason (the hub's counters as they
    /// were last read: a hub too busy to answer within 5 s keeps its previous values).
    hubs: Vec<(f64, std::collections::BTreeMap<String, f64>)>,
    agent_failures: (u64, u64),
    hub_cpu: f64,
    load_cpu: f64,
}

impl CurvePoint {
    fn opened(&self) -> f64 {
        self.hubs.iter().map(|(o, _)| o).sum()
    }

    fn failures(&self) -> std::collections::BTreeMap<String, f64> {
        let mut all = std::collections::BTreeMap::new();
        for (reason, v) in self.hubs.iter().flat_map(|(_, f)| f) {
            *all.entry(reason.clone()).or_default() += v;
        }
        all
    }
}

impl<'a> ConnectCurve<'a> {
    const EVERY: Duration = Duration::from_secs(10);

    async fn new(agents: usize, admins: &'a [String], pids: &'a [u32]) -> Self {
        let now = Instant::now();
        let mut curve =
            Self { agents, admins, pids, started: now, next: now + Self::EVERY, last: CurvePoint::default() };
        curve.last = curve.point(None).await;
        curve
    }

    async fn point(&self, load: Option<&Load>) -> CurvePoint {
        let mut p = CurvePoint {
            hub_cpu: self.pids.iter().filter_map(|p| super::cpu_seconds(*p)).sum(),
            ..CurvePoint::default()
        };
        if let Some(load) = load {
            p.agent_failures = load.connect_failures();
            p.load_cpu = match load {
                Load::InProcess(_) => super::cpu_seconds(std::process::id()).unwrap_or(0.0),
                Load::Procs(_) => load.cpu_seconds(),
            };
        }
        for (i, admin) in self.admins.iter().enumerate() {
            let Some(body) = super::metrics_text(admin).await else {
                p.hubs.push(self.last.hubs.get(i).cloned().unwrap_or_default());
                continue;
            };
            let opened = super::metric_samples(&body, "fleetwatch_hub_connects_total").map(|(_, v)| v).sum::<f64>();
            let mut failures = std::collections::BTreeMap::new();
            for (labels, v) in super::metric_samples(&body, "fleetwatch_hub_handshake_failures_total") {
                let reason = labels.trim_start_matches("reason=\"").trim_end_matches('"').to_string();
                *failures.entry(reason).or_default() += v;
            }
            p.hubs.push((opened, failures));
        }
        p
    }

    /// Prints the curve's next point when it is due.
    async fn tick(&mut self, connected: usize, load: &Load) {
        if Instant::now() < self.next {
            return;
        }
        self.next += Self::EVERY;
        let p = self.point(Some(load)).await;
        let secs = Self::EVERY.as_secs_f64();
        let (failures, before) = (p.failures(), self.last.failures());
        let failed: Vec<(&String, f64)> = failures
            .iter()
            .map(|(r, v)| (r, v - before.get(r).copied().unwrap_or(0.0)))
            .filter(|(_, d)| *d > 0.0)
            .collect();
        let total: f64 = failed.iter().map(|(_, d)| d).sum::<f64>().max(0.0);
        let failed: Vec<String> = failed.iter().map(|(r, d)| format!("{r} {d:.0}")).collect();
        let (f, t) = (p.agent_failures.0 - self.last.agent_failures.0, p.agent_failures.1 - self.last.agent_failures.1);
        // Agents the load processes have not started yet (each loads its certificate first).
        let started = match load.started() {
            Some(s) if s < self.agents => format!(" ({s} of {} started)", self.agents),
            _ => String::new(),
        };
        eprintln!(
            "{connected} agents connected{started} after {:.0} s; in the last {secs:.0} s: hubs opened {:.0} sessions, failed {:.0} \
             handshakes{}, agents' attempts reaching no hub {f} ({t} timed out); CPU hubs {:.0} %, load {:.0} %",
            self.started.elapsed().as_secs_f64(),
            p.opened() - self.last.opened(),
            total,
            if failed.is_empty() { String::new() } else { format!(" ({})", failed.join(", ")) },
            (p.hub_cpu - self.last.hub_cpu) / secs * 100.0,
            (p.load_cpu - self.last.load_cpu) / secs * 100.0,
        );
        self.last = p;
    }
}

/// What `--idle` measured.
struct IdleReport {
    bus: BusKind,
    replicas: usize,
    agents_connected: usize,
    connect_secs: f64,
    /// CPU of the load processes over the window, in % of one core.
    load_cpu_percent: f64,
    /// CPU of the hubs (summed) over the window, in % of one core.
    hub_cpu_percent: f64,
    /// The hubs' RSS (summed) before the agents came, and at the end of the window, KiB.
    hub_rss_base_kib: u64,
    hub_rss_kib: u64,
    /// The local nats-server's CPU over the window (% of one core) and RSS at its end (KiB),
    /// when the bench started it (`--bus nats` without `--nats-url`).
    nats: Option<(f64, u64)>,
    /// The load processes' RSS at the end of the window, KiB (0 with the agents in process).
    load_rss_kib: u64,
}

impl IdleReport {
    fn per_thousand(&self, percent: f64) -> f64 {
        percent * 1000.0 / self.agents_connected.max(1) as f64
    }

    fn kib_per_session(&self) -> f64 {
        self.hub_rss_kib.saturating_sub(self.hub_rss_base_kib) as f64 / self.agents_connected.max(1) as f64
    }
}

/// A source with nothing to send, that even a build from before rate 0 meant idle accepts:
/// one change per agent every 30 years.
const IDLE_RATE: f64 = 1e-9;

/// `--idle`: the idle cost of agents and hubs, per bus.
async fn idle(b: &HubBench) -> anyhow::Result<()> {
    if b.agents == 0 || b.duration <= 0.0 || b.hub_replicas == 0 {
        bail!("--agents, --duration and --hub-replicas must be positive");
    }
    if b.hub_replicas > 1 && !b.bus.contains(&BusKind::Nats) {
        bail!("--hub-replicas > 1 needs --bus nats: independent embedded hubs are independent streams");
    }
    let mut runs = Vec::new();
    for &bus in &b.bus {
        let r = idle_one(b, bus).await.with_context(|| format!("idle bench on the {bus:?} bus"))?;
        print_idle(b, &r);
        runs.push(r);
    }
    if b.json {
        let runs: Vec<serde_json::Value> = runs.iter().map(|r| idle_json(b, r)).collect();
        let mut json = runs.first().cloned().unwrap_or_default();
        json["runs"] = serde_json::Value::Array(runs);
        println!("{json}");
    }
    Ok(())
}

async fn idle_one(b: &HubBench, bus: BusKind) -> anyhow::Result<IdleReport> {
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;
    let Hubs { nats, replicas, mut hubs, pids } = start_hubs(b, bus, &dir).await?;
    let rss = || pids.iter().map(|p| rss_kib(*p, "VmRSS:").unwrap_or(0)).sum::<u64>();
    // The hubs as they are with no agent: what the sessions add is measured above it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let hub_rss_base_kib = rss();

    let urls: Vec<HubUrl> = hubs.iter().map(|h| h.wss.clone()).collect();
    let source = SyntheticSource { objects: b.objects, rate: IDLE_RATE, total: None, payload: 0 };
    let spec = LoadSpec { pki: dir.clone(), hubs: urls, agents: b.agents, source, jetstream: None };
    let connect_started = Instant::now();
    let admins: Vec<String> = hubs.iter().map(|h| h.admin.clone()).collect();
    let mut curve = ConnectCurve::new(b.agents, &admins, &pids).await;
    let load = Load::start(&spec, b.load_procs).await?;
    loop {
        let connected = load.connected();
        curve.tick(connected, &load).await;
        if connected >= b.agents {
            eprintln!("{connected} agents connected in {:.1} s", connect_started.elapsed().as_secs_f64());
            break;
        }
        if connect_started.elapsed().as_secs_f64() > b.connect_wait {
            bail!("only {connected} of {} agents connected after {} s", b.agents, b.connect_wait);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let connect_secs = connect_started.elapsed().as_secs_f64();
    // The warm-up lets the start markers be acked and the handshakes' buffers go.
    tokio::time::sleep(Duration::from_secs_f64(b.warmup)).await;
    let agents_connected = load.connected();
    // The load's CPU: the load processes, or this process with the agents in it.
    let load_cpu = |load: &Load| match load {
        Load::InProcess(_) => super::cpu_seconds(std::process::id()).unwrap_or(0.0),
        Load::Procs(_) => load.cpu_seconds(),
    };
    let hub_cpu = || pids.iter().filter_map(|p| super::cpu_seconds(*p)).sum::<f64>();
    let nats_pid = nats.as_ref().and_then(LocalNatsServer::pid);
    let nats_cpu = || nats_pid.and_then(super::cpu_seconds);
    let (l0, h0, n0, t0) = (load_cpu(&load), hub_cpu(), nats_cpu(), Instant::now());
    tokio::time::sleep(Duration::from_secs_f64(b.duration)).await;
    let (l1, h1, n1, window) = (load_cpu(&load), hub_cpu(), nats_cpu(), t0.elapsed().as_secs_f64());
    let hub_rss_kib = rss();
    let load_rss_kib = load.rss_kib();
    let nats_cost = match (n0, n1, nats_pid.and_then(|p| rss_kib(p, "VmRSS:"))) {
        (Some(n0), Some(n1), Some(kib)) => Some(((n1 - n0).max(0.0) / window * 100.0, kib)),
        _ => None,
    };
    let still = load.connected();
    if still < agents_connected {
        eprintln!("warning: {} agents lost their session during the window", agents_connected - still);
    }
    load.stop().await;
    for h in &mut hubs {
        let _ = h.child.start_kill();
        let _ = h.child.wait().await;
    }
    drop(nats);
    Ok(IdleReport {
        bus,
        replicas,
        agents_connected,
        connect_secs,
        load_cpu_percent: (l1 - l0).max(0.0) / window * 100.0,
        hub_cpu_percent: (h1 - h0).max(0.0) / window * 100.0,
        hub_rss_base_kib,
        hub_rss_kib,
        nats: nats_cost,
        load_rss_kib,
    })
}

fn print_idle(b: &HubBench, r: &IdleReport) {
    let bus = format!("{:?}", r.bus).to_lowercase();
    println!("idle cost:            {bus} bus, {} hub replica{}", r.replicas, if r.replicas == 1 { "" } else { "s" });
    println!(
        "agents:               {} connected in {:.1} s ({} load process{}), no events, measured over {:.0} s",
        r.agents_connected,
        r.connect_secs,
        b.load_procs,
        if b.load_procs == 1 { "" } else { "es" },
        b.duration
    );
    println!(
        "load CPU:             {:.1} % of a core, {:.2} % per 1,000 agents",
        r.load_cpu_percent,
        r.per_thousand(r.load_cpu_percent)
    );
    println!(
        "hub CPU:              {:.1} % of a core, {:.2} % per 1,000 agents",
        r.hub_cpu_percent,
        r.per_thousand(r.hub_cpu_percent)
    );
    println!(
        "hub RSS:              {:.1} MiB ({:.1} MiB before the agents): {:.1} KiB per session",
        r.hub_rss_kib as f64 / 1024.0,
        r.hub_rss_base_kib as f64 / 1024.0,
        r.kib_per_session()
    );
    if r.load_rss_kib > 0 {
        println!(
            "load RSS:             {:.1} MiB: {:.1} KiB per agent",
            r.load_rss_kib as f64 / 1024.0,
            r.load_rss_kib as f64 / r.agents_connected.max(1) as f64
        );
    }
    if let Some((cpu, kib)) = r.nats {
        println!(
            "nats-server:          {cpu:.1} % of a core, {:.2} % per 1,000 agents; RSS {:.1} MiB",
            r.per_thousand(cpu),
            kib as f64 / 1024.0
        );
    }
}

fn idle_json(b: &HubBench, r: &IdleReport) -> serde_json::Value {
    let round2 = |x: f64| if x.is_finite() { (x * 100.0).round() / 100.0 } else { -1.0 };
    serde_json::json!({
        "bench": "hub-idle", "bus": format!("{:?}", r.bus).to_lowercase(), "hub_replicas": r.replicas,
        "agents": b.agents, "agents_connected": r.agents_connected, "load_procs": b.load_procs,
        "connect_seconds": round2(r.connect_secs), "window_seconds": b.duration,
        "load_cpu_percent": round2(r.load_cpu_percent), "hub_cpu_percent": round2(r.hub_cpu_percent),
        "load_cpu_percent_per_1000_agents": round2(r.per_thousand(r.load_cpu_percent)),
        "hub_cpu_percent_per_1000_agents": round2(r.per_thousand(r.hub_cpu_percent)),
        "hub_rss_base_kib": r.hub_rss_base_kib, "hub_rss_kib": r.hub_rss_kib,
        "hub_kib_per_session": round2(r.kib_per_session()),
        "load_rss_kib": r.load_rss_kib,
        "nats_cpu_percent": r.nats.map(|(cpu, _)| round2(cpu)),
        "nats_cpu_percent_per_1000_agents": r.nats.map(|(cpu, _)| round2(r.per_thousand(cpu))),
        "nats_rss_kib": r.nats.map(|(_, kib)| kib),
    })
}

/// Objects whose final generation did not reach the subscriber, not counting clusters it
/// was told to resync (whole-fleet `*` counts for all).
fn missing(
    source: &SyntheticSource,
    clusters: &[String],
    seen: &HashMap<(String, String), u64>,
    resynced: &HashSet<String>,
) -> u64 {
    if resynced.contains("*") {
        return 0;
    }
    let mut lost = 0;
    for c in clusters.iter().filter(|c| !resynced.contains(*c)) {
        for n in 0..source.objects {
            let Some(want) = source.final_generation(n) else { continue };
            let key = (c.clone(), SyntheticSource::key(n).to_string());
            if seen.get(&key).copied().unwrap_or(0) < want {
                lost += 1;
            }
        }
    }
    lost
}

fn print_report(b: &HubBench, r: &Report) {
    let bus = format!("{:?}", r.bus).to_lowercase();
    if r.bus == BusKind::JetStreamDirect {
        println!("server:               nats-server JetStream directly (no hub; file storage, one durable consumer)");
    } else {
        println!("bus:                  {bus} ({} hub replica{})", r.replicas, if r.replicas == 1 { "" } else { "s" });
    }
    println!(
        "agents:               {} (all connected in {:.1} s, {} load process{})",
        b.agents,
        r.connect_secs,
        b.load_procs,
        if b.load_procs == 1 { "" } else { "es" }
    );
    println!("offered rate:         {:.0} events/s", b.rate);
    if b.subscribers > 1 {
        println!("subscribers:          {} (each gets every event; the first is measured)", b.subscribers);
    }
    println!("delivered:            {:.0} events/s over {:.1} s", r.delivered_per_sec, b.duration);
    if let Some(h) = r.hub_received_per_sec {
        println!("hub accepted:         {h:.0} events/s (the rest of the offered changes coalesced in agents)");
    }
    println!("latency p50/p99/p999: {:.2} / {:.2} / {:.2} ms (max {:.2} ms)", r.p50, r.p99, r.p999, r.max);
    let server = if r.bus == BusKind::JetStreamDirect { "server" } else { "hub" };
    println!(
        "{server} peak RSS:{:>pad$}{:.1} MiB (largest replica)",
        "",
        mib(r.peak_rss_bytes),
        pad = 13 - server.len()
    );
    println!(
        "CPU (% of one core):  {server} {:.0} %, load {:.0} % (of {} % on this machine)",
        r.hub_cpu_percent,
        r.load_cpu_percent,
        100 * std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    if let Some(nats) = r.nats_cpu_percent {
        println!("nats-server CPU:      {nats:.0} % of one core");
    }
    println!("resync-required seen: {}", r.resyncs);
    let mut reasons: Vec<(&String, &u64)> = r.resync_reasons.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (reason, n) in reasons.iter().take(3) {
        println!("  {n} x {reason}");
    }
    if let Some(k) = &r.kill {
        match k.reconnected_secs {
            Some(s) => {
                println!("replica kill:         {} agents moved, all connected again in {s:.2} s", k.agents_moved)
            }
            None => println!("replica kill:         {} agents moved, NOT all connected again", k.agents_moved),
        }
        println!(
            "objects:              {} (lost {}, clusters told to resync {})",
            k.objects, k.lost, k.resynced_clusters
        );
    }
}

/// One run's figures as JSON (the names `--json` promises).
fn report_json(b: &HubBench, r: &Report) -> serde_json::Value {
    let round2 = |x: f64| if x.is_finite() { (x * 100.0).round() / 100.0 } else { -1.0 };
    let mut json = serde_json::json!({
        "bench": "hub", "bus": format!("{:?}", r.bus).to_lowercase(), "hub_replicas": r.replicas,
        "agents": b.agents, "agents_connected": r.agents_connected, "load_procs": b.load_procs,
        "durable": b.durable, "connect_seconds": round2(r.connect_secs),
        "offered_per_sec": b.rate, "delivered_per_sec": r.delivered_per_sec.round(),
        "hub_received_per_sec": r.hub_received_per_sec.map(f64::round),
        "p50_ms": round2(r.p50), "p99_ms": round2(r.p99), "p999_ms": round2(r.p999), "max_ms": round2(r.max),
        "hub_peak_rss_bytes": r.peak_rss_bytes, "hub_cpu_percent": round2(r.hub_cpu_percent), "subscribers": b.subscribers,
        "load_cpu_percent": round2(r.load_cpu_percent), "resyncs": r.resyncs, "resync_reasons": r.resync_reasons,
        "nats_cpu_percent": r.nats_cpu_percent.map(round2),
    });
    if let Some(k) = &r.kill {
        json["kill"] = serde_json::json!({
            "agents_moved": k.agents_moved, "reconnected_s": k.reconnected_secs, "objects": k.objects,
            "lost": k.lost, "resynced_clusters": k.resynced_clusters,
        });
    }
    json
}

/// One figure of a report.
type Figure = fn(&Report) -> f64;

/// `--vs-nats`: `--rounds` rounds of the hub (the embedded bus, `--durable` as given) and of
/// JetStream directly, alternating which goes first, then the medians and their ratios.
async fn vs_nats(b: &HubBench) -> anyhow::Result<()> {
    if b.bus != [BusKind::Embedded] || b.hub_replicas != 1 || b.kill_replica_after.is_some() {
        bail!(
            "--vs-nats compares one hub on the embedded bus with JetStream: leave out --bus, --hub-replicas and --kill-replica-after"
        );
    }
    if b.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    for round in 0..b.rounds {
        for side in if round % 2 == 0 { [false, true] } else { [true, false] } {
            if side {
                let r = run_jetstream(b).await.context("bench against JetStream")?;
                println!("round {}: JetStream", round + 1);
                print_report(b, &r);
                theirs.push(r);
            } else {
                let r = run_one(b, BusKind::Embedded).await.context("bench on the hub")?;
                println!("round {}: fleetwatch", round + 1);
                print_report(b, &r);
                ours.push(r);
            }
            println!();
        }
    }
    let median = |rs: &[Report], f: fn(&Report) -> f64| {
        let mut v: Vec<f64> = rs.iter().map(f).collect();
        v.sort_by(f64::total_cmp);
        v[v.len() / 2]
    };
    let figures: [(&str, Figure); 4] = [
        ("delivered_per_sec", |r| r.delivered_per_sec),
        ("p99_ms", |r| r.p99),
        ("server_rss_bytes", |r| r.peak_rss_bytes as f64),
        ("server_cpu_percent", |r| r.hub_cpu_percent),
    ];
    let fsync = if b.durable {
        "fleetwatch fsyncs every group commit of its log (--durable); nats-server syncs its files every 2 minutes"
    } else {
        "fleetwatch keeps memory only (no --durable); nats-server writes files and syncs them every 2 minutes"
    };
    println!(
        "fleetwatch vs JetStream, {} agents, {:.0} events/s offered, medians of {} rounds ({fsync}):",
        b.agents, b.rate, b.rounds
    );
    println!("{:<20} {:>14} {:>14} {:>8}", "", "fleetwatch", "JetStream", "ratio");
    let mut json = serde_json::Map::new();
    for (name, f) in figures {
        let (a, j) = (median(&ours, f), median(&theirs, f));
        let ratio = a / j;
        let (a_s, j_s) = if name == "server_rss_bytes" {
            (format!("{:.1} MiB", a / (1 << 20) as f64), format!("{:.1} MiB", j / (1 << 20) as f64))
        } else {
            (format!("{a:.1}"), format!("{j:.1}"))
        };
        println!("{name:<20} {a_s:>14} {j_s:>14} {ratio:>8.2}");
        json.insert(
            name.into(),
            serde_json::json!({ "fleetwatch": a, "jetstream": j, "ratio": if ratio.is_finite() { ratio } else { -1.0 } }),
        );
    }
    if b.json {
        let mut top = report_json(b, &ours[ours.len() / 2]);
        top["vs_nats"] = serde_json::Value::Object(json);
        top["vs_nats"]["rounds"] = b.rounds.into();
        top["vs_nats"]["fsync"] = fsync.into();
        top["runs"] = ours.iter().chain(&theirs).map(|r| report_json(b, r)).collect();
        println!("{top}");
    }
    Ok(())
}

/// The hub bench's load and measurement against nats-server JetStream with no hub: the
/// agents are publishers ([`super::jetstream`]), the subscriber a durable pull consumer.
async fn run_jetstream(b: &HubBench) -> anyhow::Result<Report> {
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;
    let server = super::jetstream::start_server(&dir, &dir.join("jetstream")).await?;
    let pid = server.pid().context("nats-server pid")?;
    eprintln!("nats-server pid {pid} at {}", server.url());
    let client = super::jetstream::connect(&dir, &server.url(), "subscriber-bench").await?;
    let mut messages = super::jetstream::subscribe(&client).await?;

    let source =
        SyntheticSource { objects: b.objects, rate: b.rate / b.agents as f64, total: None, payload: b.payload };
    let spec = LoadSpec { pki: dir.clone(), hubs: Vec::new(), agents: b.agents, source, jetstream: Some(server.url()) };
    let connect_started = Instant::now();
    let load = Load::start(&spec, b.load_procs).await?;
    let mut unacked: Option<async_nats::jetstream::Message> = None;
    // Takes what arrives within `wait`: the latency of each message, and an ack (cumulative)
    // every 64 messages and whenever the stream pauses.
    let mut taken = 0u64;
    let mut next = async |wait: Duration, latencies: Option<&mut Vec<u64>>| -> anyhow::Result<()> {
        match tokio::time::timeout(wait, messages.next()).await {
            Ok(Some(m)) => {
                let m = m.map_err(|e| anyhow::anyhow!("consumer: {e}"))?;
                if let Some(l) = latencies
                    && let Ok(e) = serde_json::from_slice::<fleetwatch_protocol::event::Event>(&m.payload)
                {
                    l.push((jiff::Timestamp::now().as_microsecond() - e.time.as_microsecond()).max(0) as u64);
                }
                taken += 1;
                if taken.is_multiple_of(64) {
                    m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                } else {
                    unacked = Some(m);
                }
            }
            Ok(None) => bail!("the consumer's stream ended"),
            Err(_) => {
                if let Some(m) = unacked.take() {
                    m.ack().await.map_err(|e| anyhow::anyhow!("ack: {e}"))?;
                }
            }
        }
        Ok(())
    };
    while load.connected() < b.agents {
        if connect_started.elapsed().as_secs_f64() > b.connect_wait {
            bail!("only {} of {} publishers connected after {} s", load.connected(), b.agents, b.connect_wait);
        }
        next(Duration::from_millis(50), None).await?;
    }
    let connect_secs = connect_started.elapsed().as_secs_f64();
    eprintln!("{} publishers connected in {connect_secs:.1} s", b.agents);
    let agents_connected = load.connected();
    let warmup_end = Instant::now() + Duration::from_secs_f64(b.warmup);
    let end = warmup_end + Duration::from_secs_f64(b.duration);
    while Instant::now() < warmup_end {
        next(Duration::from_millis(10), None).await?;
    }
    let cpu = |load: &Load| {
        (
            super::cpu_seconds(pid).unwrap_or(0.0),
            load.cpu_seconds() + super::cpu_seconds(std::process::id()).unwrap_or(0.0),
        )
    };
    let (h0, l0) = cpu(&load);
    let mut latencies_us = Vec::new();
    let mut peak_rss = 0u64;
    let mut last_sample = Instant::now();
    while Instant::now() < end {
        next(Duration::from_millis(10), Some(&mut latencies_us)).await?;
        if last_sample.elapsed() > Duration::from_millis(250) {
            last_sample = Instant::now();
            peak_rss = peak_rss.max(rss_kib(pid, "VmRSS:").unwrap_or(0));
        }
    }
    let (h1, l1) = cpu(&load);
    peak_rss = peak_rss.max(rss_kib(pid, "VmHWM:").unwrap_or(0));
    load.stop().await;
    drop(messages);
    let _ = client.drain().await;
    drop(server);
    latencies_us.sort_unstable();
    Ok(Report {
        bus: BusKind::JetStreamDirect,
        replicas: 1,
        agents_connected,
        connect_secs,
        delivered_per_sec: latencies_us.len() as f64 / b.duration,
        hub_received_per_sec: None,
        p50: percentile(&latencies_us, 0.50),
        p99: percentile(&latencies_us, 0.99),
        p999: percentile(&latencies_us, 0.999),
        max: percentile(&latencies_us, 1.0),
        peak_rss_bytes: peak_rss * 1024,
        hub_cpu_percent: (h1 - h0).max(0.0) / b.duration * 100.0,
        load_cpu_percent: (l1 - l0).max(0.0) / b.duration * 100.0,
        // The server is the "hub" of this run.
        nats_cpu_percent: None,
        resyncs: 0,
        resync_reasons: Default::default(),
        kill: None,
    })
}

#[cfg(test)]
mod reason_tests {
    use super::reason_kind;

    #[test]
    fn resync_reasons_of_one_kind_count_together() {
        assert_eq!(
            reason_kind("offset 12345: follows 3/7, not 3/6"),
            reason_kind("offset 9: follows 1/22, not 1/21"),
            "numbers blanked"
        );
        assert_eq!(reason_kind("offset 12345: x"), "offset N: x");
        assert_ne!(reason_kind("events were evicted"), reason_kind("offset 1: x"));
        assert_eq!(reason_kind(&"9".repeat(10_000)).len(), 1, "bounded, and one N for one number");
    }
}
