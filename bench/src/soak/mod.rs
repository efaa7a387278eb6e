//! `fleetwatch bench soak`: a chaos soak. A durable hub (a child process), one real agent
//! process per simulated cluster with Kubernetes-like churn, and a durable subscriber,
//! while faults are injected: hub SIGKILL, TCP cuts, agent restarts (with deletes and
//! recreates meanwhile), disk-full, a damaged log segment, deny-list flips. With
//! `--bus nats` the hubs are several replicas on a 3-node JetStream cluster on loopback,
//! and the faults include JetStream node kills, JetStream restarted empty and cuts between
//! the hubs and NATS. At the end every object's final state, or a `resync-required` for its
//! cluster delivered after it (see [`check`]), must have reached the subscriber.

pub mod check;
pub mod churn;
pub mod faults;
pub mod jetstream;
pub mod procs;
pub mod proxy;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_protocol::event::ObjectKey;
use fleetwatch_protocol::message::StartFrom;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio_util::sync::CancellationToken;

use check::{Observed, Verdict};
use churn::Churn;
use faults::{AgentProc, FaultKind, Fleet, HubProc, Plan};
use jetstream::JetStream;
use procs::Restartable;
use proxy::CutProxy;

/// The WatchConfig the soak's agents follow.
const WATCH: &str = "soak-cms";
/// Writes each sim cluster keeps for watches resuming from an older resourceVersion.
const SIM_HISTORY: usize = 2_000;
/// Most lost objects listed one by one.
const LIST_LOST: usize = 20;

/// `fleetwatch bench soak` flags.
#[derive(Args)]
pub struct SoakBench {
    /// Seconds of churn and faults (then it settles and checks).
    #[arg(long, default_value_t = 120.0)]
    duration: f64,
    /// Simulated clusters, each watched by its own agent process.
    #[arg(long, default_value_t = 6)]
    clusters: usize,
    /// ConfigMaps per cluster the churn creates, changes and deletes.
    #[arg(long, default_value_t = 100)]
    objects: usize,
    /// Writes per second over all clusters.
    #[arg(long, default_value_t = 200.0)]
    rate: f64,
    /// The hubs' bus: `embedded` (one hub with a data directory) or `nats` (`--hub-replicas`
    /// hubs on a 3-node JetStream cluster the soak starts on loopback).
    #[arg(long, value_enum, default_value = "embedded")]
    bus: SoakBus,
    /// Hub replicas on the stream with `--bus nats` (default 3); agents and the subscriber
    /// are given all of them.
    #[arg(long)]
    hub_replicas: Option<usize>,
    /// Fault kinds to inject, comma-separated; each round injects each once, the first
    /// round in this order, later ones shuffled. Default on the embedded bus:
    /// kill,cut,agent-restart,disk-full,corrupt,deny,freeze; with `--bus nats`:
    /// js-empty,node-kill,bus-cut,restart-into-outage,node-freeze,kill,agent-restart,cut,
    /// deny,freeze.
    #[arg(long, value_enum, value_delimiter = ',')]
    faults: Vec<FaultKind>,
    /// Mean seconds between faults (jittered ±50 %).
    #[arg(long, default_value_t = 4.0)]
    fault_interval: f64,
    /// Seconds a cut, a deny or a disk-full lasts.
    #[arg(long, default_value_t = 3.0)]
    fault_hold: f64,
    /// Most seconds to wait after the churn stopped for every object to reach the subscriber.
    #[arg(long, default_value_t = 90.0)]
    settle: f64,
    /// Extra argument for the hub process (repeatable), e.g. `--hub-arg=--retention=50000`.
    #[arg(long, allow_hyphen_values = true)]
    hub_arg: Vec<String>,
    /// Keep certificates, the hub's data and all process logs here (kept afterwards).
    /// Without it a temporary directory is used, removed unless something was lost.
    #[arg(long)]
    dir: Option<PathBuf>,
}

impl SoakBench {
    /// Hub processes: the replicas on NATS, one on the embedded bus.
    fn replicas(&self) -> usize {
        match self.bus {
            SoakBus::Nats => self.hub_replicas.unwrap_or(3),
            SoakBus::Embedded => 1,
        }
    }
}

/// The bus of `bench soak --bus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SoakBus {
    /// One hub on its embedded segment log (`--data-dir`).
    Embedded,
    /// Hub replicas on NATS JetStream (a 3-node cluster started by the soak).
    Nats,
}

/// Runs the soak; fails when an object was lost or a process crashed.
pub async fn run(mut b: SoakBench) -> anyhow::Result<()> {
    if b.clusters == 0 || b.objects == 0 || b.rate <= 0.0 || b.hub_replicas == Some(0) {
        bail!("--clusters, --objects, --rate and --hub-replicas must be positive");
    }
    let nats = b.bus == SoakBus::Nats;
    if !nats && b.hub_replicas.is_some() {
        bail!("--hub-replicas needs --bus nats: the embedded bus runs one hub");
    }
    if b.faults.is_empty() {
        b.faults = if nats { FaultKind::NATS.to_vec() } else { FaultKind::EMBEDDED.to_vec() };
    }
    let misfits: Vec<&str> = b.faults.iter().filter(|k| !k.fits(nats)).map(|k| k.name()).collect();
    if !misfits.is_empty() {
        bail!(
            "--faults {} cannot be injected with --bus {}",
            misfits.join(","),
            if nats { "nats" } else { "embedded" }
        );
    }
    let secs = |name: &str, v: f64| {
        Duration::try_from_secs_f64(v)
            .ok()
            .filter(|d| !d.is_zero())
            .with_context(|| format!("--{name} must be positive"))
    };
    let duration = secs("duration", b.duration)?;
    let settle = secs("settle", b.settle)?;
    let fault_interval = secs("fault-interval", b.fault_interval)?;
    let hold = secs("fault-hold", b.fault_hold)?;
    let (dir, keep) = match &b.dir {
        Some(d) => (d.clone(), true),
        None => (std::env::temp_dir().join(format!("fleetwatch-soak-{}", std::process::id())), false),
    };
    std::fs::create_dir_all(&dir).with_context(|| format!("cannot create {}", dir.display()))?;
    eprintln!("soak: working in {}", dir.display());
    let outcome = soak(&b, &dir, duration, settle, fault_interval, hold).await;
    match &outcome {
        Ok(true) if !keep => {
            let _ = std::fs::remove_dir_all(&dir);
        }
        _ => eprintln!("soak: certificates, hub data and logs kept in {}", dir.display()),
    }
    if outcome? {
        Ok(())
    } else {
        bail!("the soak failed: objects were lost, a process crashed or a fault could not be undone (see above)")
    }
}

/// Counts from the run, for the summary.
struct Outcome {
    elapsed: Duration,
    settled: Duration,
    counts: faults::FaultCounts,
    verdicts: BTreeMap<&'static str, u64>,
    lost: Vec<String>,
    stats: churn::ChurnStats,
    crashes: Vec<String>,
    notes: Vec<String>,
    /// Restarts that failed and were retried, with how long each process was down.
    outages: Vec<String>,
}

async fn soak(
    b: &SoakBench,
    dir: &Path,
    duration: Duration,
    settle: Duration,
    fault_interval: Duration,
    hold: Duration,
) -> anyhow::Result<bool> {
    let nats = b.bus == SoakBus::Nats;
    let stop = CancellationToken::new();
    let _stop_on_exit = stop.clone().drop_guard();
    let clusters: Vec<String> = (0..b.clusters).map(|i| format!("soak-{i}")).collect();
    let pki = pki(dir, &clusters)?;

    // The runtime clusters, half their objects in place before the agents start.
    let mut sims = Vec::with_capacity(clusters.len());
    let mut churns = Vec::with_capacity(clusters.len());
    for c in &clusters {
        // A bounded watch history: the default (10,000 writes per cluster) grew the soak's
        // memory for its first five minutes; 2,000 is a minute of churn, far longer than an
        // agent is down (beyond it a watch resumes with 410 Gone and the agent re-lists,
        // which is a path worth exercising too).
        let options = fleetwatch_sim::SimOptions { name: c.clone(), history: SIM_HISTORY, ..Default::default() };
        let sim = fleetwatch_sim::SimCluster::start(options).await?;
        sim.write_kubeconfig(&dir.join(format!("{c}.kubeconfig")))?;
        let client = sim.client().await?;
        let churn = Churn::new(c, client.clone(), b.objects);
        churn.populate(client).await.with_context(|| format!("cannot create the objects of {c}"))?;
        churns.push(Arc::new(churn));
        sims.push(sim);
    }

    // The bus: the embedded one in the hub's data directory, or a JetStream cluster.
    let jetstream = if nats {
        eprintln!("soak: starting a {}-node JetStream cluster", jetstream::NODES);
        Some(JetStream::start(dir, &stop).await.context("JetStream cluster")?)
    } else {
        None
    };
    let data_dir = (!nats).then(|| dir.join("hub-data"));

    // The hubs, each behind two cut-able paths: one for the agents, one for the subscriber.
    let deny_list = dir.join("deny-list");
    std::fs::write(&deny_list, "# fleetwatch bench soak: nothing denied\n")?;
    let wc_dir = dir.join("watch-configs");
    std::fs::create_dir_all(&wc_dir)?;
    std::fs::write(
        wc_dir.join("soak.json"),
        serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": WATCH},
            "spec": {"resource": {"version": "v1", "kind": "ConfigMap"}, "namespace": churn::NAMESPACE,
                "fields": ["data"], "project": [check::VERSION_FIELD]}})
        .to_string(),
    )?;
    let replicas = b.replicas();
    let mut hubs = Vec::with_capacity(replicas);
    let mut agent_proxies = Vec::with_capacity(replicas);
    let mut subscriber_proxies = Vec::with_capacity(replicas);
    for i in 0..replicas {
        let hub_addr = procs::free_port()?;
        let admin = procs::free_port()?;
        let mut hub_args: Vec<String> = vec!["--log".into(), "info".into(), "hub".into()];
        for (flag, value) in [
            ("--listen", hub_addr.to_string()),
            ("--admin-listen", admin.to_string()),
            ("--cert", pki.join("hub.crt").display().to_string()),
            ("--key", pki.join("hub.key").display().to_string()),
            ("--client-ca", pki.join("ca.crt").display().to_string()),
            ("--watch-config", wc_dir.display().to_string()),
            ("--deny-list", deny_list.display().to_string()),
            ("--tls-reload-interval", "1".into()),
            ("--idle-timeout", "10".into()),
            // Restarted on its ports after a SIGKILL, possibly before the old sockets closed.
            ("--bind-retry", "30".into()),
        ] {
            hub_args.push(flag.into());
            hub_args.push(value);
        }
        match (&jetstream, &data_dir) {
            (Some(js), _) => {
                let replicas = jetstream::NODES.to_string();
                hub_args.extend(["--bus".into(), js.urls(), "--bus-replicas".into(), replicas]);
                hub_args.extend(["--bus-stream".into(), "soak".into()]);
            }
            (None, Some(data_dir)) => {
                hub_args.extend(["--data-dir".into(), data_dir.display().to_string()]);
                // Small segments, so there are closed (indexed) segments for `corrupt` to damage.
                hub_args.extend(["--segment-bytes".into(), "1MiB".into()]);
            }
            (None, None) => bail!("neither a data directory nor a JetStream cluster"),
        }
        if b.faults.contains(&FaultKind::DiskFull) {
            hub_args.push("--fault-injection".into());
        }
        hub_args.extend(b.hub_arg.iter().cloned());
        // One hub keeps the name its log always had.
        let log = if nats { dir.join(format!("hub-{i}.log")) } else { dir.join("hub.log") };
        let mut proc = Restartable::new(format!("hub {i}"), hub_args, log);
        proc.start(Some("hub listening"), Duration::from_secs(60)).await?;
        agent_proxies.push(CutProxy::start(hub_addr, stop.child_token()).await?);
        subscriber_proxies.push(CutProxy::start(hub_addr, stop.child_token()).await?);
        hubs.push(HubProc { proc, admin });
    }
    let hub_urls = |proxies: &[CutProxy], first: usize| -> String {
        (0..proxies.len())
            .map(|k| format!("wss://{}", proxies[(first + k) % proxies.len()].addr()))
            .collect::<Vec<_>>()
            .join(",")
    };

    let mut agents = Vec::with_capacity(clusters.len());
    for (n, (c, churn)) in clusters.iter().zip(&churns).enumerate() {
        let cert = pki.join(format!("agent-{c}.crt"));
        let info = fleetwatch_certs::inspect_file(&cert)?;
        let identity = info.identity.map(|i| i.to_string()).context("agent certificate without identity")?;
        let args: Vec<String> = [
            "--log",
            "info",
            "agent",
            "--hub",
            // Every hub, a different one first per agent: the replicas share the load.
            &hub_urls(&agent_proxies, n),
            "--cert",
            &cert.display().to_string(),
            "--key",
            &pki.join(format!("agent-{c}.key")).display().to_string(),
            "--ca",
            &pki.join("ca.crt").display().to_string(),
            "--kubeconfig",
            &dir.join(format!("{c}.kubeconfig")).display().to_string(),
            "--retry-first-connect",
            "--refused-retry",
            "2",
            "--drain-timeout",
            "2",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut proc = Restartable::new(format!("agent {c}"), args, dir.join(format!("agent-{c}.log")));
        proc.start(None, Duration::ZERO).await?;
        agents.push(AgentProc { cluster: c.clone(), proc, identity, serial: info.serial, churn: churn.clone() });
    }

    // The durable subscriber.
    let observed = Arc::new(Mutex::new(Observed::default()));
    let tls = Arc::new(fleetwatch_certs::client_config(&TlsFiles {
        cert: pki.join("subscriber-soak.crt"),
        key: pki.join("subscriber-soak.key"),
        ca: vec![pki.join("ca.crt")],
    })?);
    let mut opts =
        SubscriberOptions::new(hub_urls(&subscriber_proxies, 0).parse::<fleetwatch_client::transport::HubUrls>()?, tls);
    opts.durable = Some("soak".into());
    opts.from = StartFrom::Earliest;
    opts.connect_timeout = Duration::from_secs(5);
    opts.idle_timeout = Duration::from_secs(15);
    let sub = Subscription::connect(opts).await.context("subscriber")?;
    let subscriber_stop = stop.child_token();
    let subscriber = tokio::spawn(subscribe(sub, observed.clone(), subscriber_stop.clone()));

    let admins: Vec<SocketAddr> = hubs.iter().map(|h| h.admin).collect();
    wait_connected(&admins, clusters.len(), Duration::from_secs(60)).await?;
    eprintln!("soak: {} agents watching; churn and faults for {:.0} s", clusters.len(), duration.as_secs_f64());

    // Churn and faults.
    let t0 = Instant::now();
    let churn_stop = stop.child_token();
    let per_cluster = b.rate / clusters.len() as f64;
    let churn_tasks: Vec<_> =
        churns.iter().map(|c| tokio::spawn(c.clone().run(per_cluster, churn_stop.clone()))).collect();
    let fleet = Fleet {
        hubs,
        data_dir,
        deny_list,
        agents,
        agent_proxies,
        subscriber_proxies,
        jetstream,
        crashes: Vec::new(),
        notes: Vec::new(),
        outages: Vec::new(),
    };
    // Faults start after a tenth of the run and end before its last sixth, so the
    // churn's final writes happen on a healthy fleet as well as during faults.
    let plan = Plan {
        kinds: b.faults.clone(),
        interval: fault_interval,
        from: t0 + duration / 10,
        until: t0 + duration.mul_f64(5.0 / 6.0),
        hold,
    };
    let fault_task = tokio::spawn(faults::run(fleet, plan, stop.child_token()));
    tokio::time::sleep_until((t0 + duration).into()).await;
    churn_stop.cancel();
    for t in churn_tasks {
        let _ = t.await;
    }
    let elapsed = t0.elapsed();
    // A fault still in progress (no new one starts this late) is finished and undone.
    let (mut fleet, counts, fault_error) = fault_task.await.context("fault task")?;
    // A fault that could not be injected or undone fails the soak, but never its verdict:
    // what was delivered is judged and printed all the same.
    let fault_failed = fault_error.is_some();
    if let Some(e) = fault_error {
        fleet.notes.push(format!("fault injection stopped early: {e}"));
    }
    eprintln!("soak: churn stopped after {:.1} s; settling", elapsed.as_secs_f64());

    // Settle: until every object is accounted for, or the settle time is up.
    let settle_start = Instant::now();
    let (verdicts, lost) = loop {
        let (verdicts, lost) = judge_all(&churns, &observed).await?;
        if lost.is_empty() || settle_start.elapsed() > settle {
            break (verdicts, lost);
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let settled = settle_start.elapsed();
    // The processes stop first, the proxies (`stop`) last: a hub cut off from NATS would
    // not finish its shutdown.
    subscriber_stop.cancel();
    let _ = subscriber.await;
    for a in &mut fleet.agents {
        if a.proc.exited().is_some() {
            fleet.crashes.push(format!("agent {}", a.cluster));
        }
        a.proc.stop(procs::Stop::Kill, Duration::ZERO).await;
    }
    for (i, h) in fleet.hubs.iter_mut().enumerate() {
        if h.proc.exited().is_some() {
            fleet.crashes.push(format!("hub {i}"));
        }
        h.proc.stop(procs::Stop::Term, Duration::from_secs(10)).await;
    }
    stop.cancel();
    let stats = churns.iter().map(|c| c.stats()).fold(churn::ChurnStats::default(), |t, s| churn::ChurnStats {
        writes: t.writes + s.writes,
        errors: t.errors + s.errors,
        deletes_while_down: t.deletes_while_down + s.deletes_while_down,
        creates_while_down: t.creates_while_down + s.creates_while_down,
    });
    let outcome = Outcome {
        elapsed,
        settled,
        counts,
        verdicts,
        lost,
        stats,
        crashes: fleet.crashes.clone(),
        notes: fleet.notes.clone(),
        outages: fleet.outages.clone(),
    };
    let ok = outcome.lost.is_empty() && outcome.crashes.is_empty() && !fault_failed;
    let obs = observed.lock().map_err(|_| anyhow::anyhow!("observer poisoned"))?;
    print_summary(b, &outcome, &obs);
    drop(sims);
    Ok(ok)
}

/// Judges every object of every cluster; returns counts by verdict and one line per lost
/// object.
async fn judge_all(
    churns: &[Arc<Churn>],
    observed: &Mutex<Observed>,
) -> anyhow::Result<(BTreeMap<&'static str, u64>, Vec<String>)> {
    let mut verdicts: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut lost = Vec::new();
    for churn in churns {
        let truth = churn.truth().await.with_context(|| format!("cannot list the objects of {}", churn.cluster()))?;
        let obs = observed.lock().map_err(|_| anyhow::anyhow!("observer poisoned"))?;
        let last_resync = obs.last_resync(churn.cluster());
        for (name, truth, last_write) in truth {
            let subject = ObjectKey::new("v1", "ConfigMap", Some(churn::NAMESPACE), &name).to_string();
            let view = obs.view(churn.cluster(), &subject);
            let verdict = check::judge(&truth, view, last_write, last_resync);
            *verdicts
                .entry(match verdict {
                    Verdict::Final => "final",
                    Verdict::Resync => "resync",
                    Verdict::Lost => "lost",
                })
                .or_default() += 1;
            if verdict == Verdict::Lost {
                let seen = view.map_or("nothing".to_string(), |(v, _)| v.to_string());
                let resync = match (last_resync, view) {
                    (None, _) => "none",
                    (Some(r), Some((_, seen_at))) if r < seen_at => "before the last event for it",
                    (Some(_), _) => "before its last write",
                };
                lost.push(format!(
                    "{}/{name}: the cluster has it {truth}; the subscriber saw {seen}; last resync for the cluster: {resync}",
                    churn.cluster(),
                ));
            }
        }
    }
    Ok((verdicts, lost))
}

/// Receives until `stop`, recording what arrives and acknowledging it.
async fn subscribe(mut sub: Subscription, observed: Arc<Mutex<Observed>>, stop: CancellationToken) {
    loop {
        let d = tokio::select! {
            d = sub.next() => d,
            _ = stop.cancelled() => return,
        };
        let d = match d {
            Ok(d) => d,
            Err(e) => {
                // Only a refusal ends `next` (it reconnects otherwise): try again shortly.
                tracing::warn!(error = %e, "subscriber refused; retrying");
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                    _ = stop.cancelled() => return,
                }
            }
        };
        let now = Instant::now();
        if let Ok(mut o) = observed.lock() {
            match &d {
                Delivery::Events(evs) => o.events(evs, WATCH, now),
                Delivery::ResyncRequired(r) => o.resync(r, now),
            }
        }
        if let Some(c) = d.last_cursor() {
            let _ = sub.ack(c).await;
        }
    }
}

/// Waits until the hubs report `n` connected agents (replicas on one stream each list
/// every agent: the first that answers is asked).
async fn wait_connected(admins: &[SocketAddr], n: usize, timeout: Duration) -> anyhow::Result<()> {
    let start = Instant::now();
    loop {
        let mut connected = 0;
        for admin in admins {
            let addr = admin.to_string();
            let answer = fleetwatch_client::admin_http::get(&addr, "/api/v1/clusters");
            let Ok(Ok(body)) = tokio::time::timeout(Duration::from_secs(5), answer).await else { continue };
            let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
            connected = connected
                .max(v["clusters"].as_array().map_or(0, |a| a.iter().filter(|c| c["connected"] == true).count()));
        }
        if connected >= n {
            return Ok(());
        }
        if start.elapsed() > timeout {
            bail!("only {connected} of {n} agents connected within {} s", timeout.as_secs());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A CA with a hub certificate, the `soak` subscriber and one agent per cluster.
fn pki(dir: &Path, clusters: &[String]) -> anyhow::Result<PathBuf> {
    let pki = dir.join("pki");
    std::fs::create_dir_all(&pki)?;
    Authority::init(&pki, "soak.local")?;
    let ca = Authority::load(&pki)?;
    ca.issue(&pki, &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec!["127.0.0.1".parse()?] }, 1)?;
    ca.issue(&pki, &LeafSpec::Subscriber { name: "soak".into() }, 1)?;
    for c in clusters {
        ca.issue(&pki, &LeafSpec::Agent { cluster: c.clone() }, 1)?;
    }
    Ok(pki)
}

/// A plain-HTTP POST without a body; returns the status code and the body.
pub(crate) async fn http_post(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr)).await??;
    s.write_all(format!("POST {path} HTTP/1.0\r\nHost: {addr}\r\nContent-Length: 0\r\n\r\n").as_bytes()).await?;
    let mut buf = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.take(64 * 1024).read_to_string(&mut buf)).await??;
    let status = buf.split_whitespace().nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    Ok((status, buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()))
}

fn print_summary(b: &SoakBench, o: &Outcome, obs: &Observed) {
    let faults: Vec<String> = FaultKind::ALL
        .iter()
        .filter(|k| k.fits(b.bus == SoakBus::Nats))
        .map(|k| {
            let n = o.counts.injected.get(k).copied().unwrap_or(0);
            let skipped = o.counts.skipped.get(k).copied().unwrap_or(0);
            if !b.faults.contains(k) {
                format!("{} {n} (off)", k.name())
            } else if skipped > 0 {
                format!("{} {n} ({skipped} not possible)", k.name())
            } else {
                format!("{} {n}", k.name())
            }
        })
        .collect();
    let v = |k: &str| o.verdicts.get(k).copied().unwrap_or(0);
    let objects: u64 = o.verdicts.values().sum();
    for line in o.lost.iter().take(LIST_LOST) {
        println!("LOST {line}");
    }
    if o.lost.len() > LIST_LOST {
        println!("LOST … and {} more", o.lost.len() - LIST_LOST);
    }
    for c in &o.crashes {
        println!("CRASH {c}");
    }
    for n in &o.notes {
        println!("NOTE {n}");
    }
    for n in &o.outages {
        println!("OUTAGE {n}");
    }
    let bus = match b.bus {
        SoakBus::Embedded => "embedded bus".to_string(),
        SoakBus::Nats => format!("{} hub replicas on {}-node JetStream", b.replicas(), jetstream::NODES),
    };
    println!(
        "soak: {:.0} s (+{:.1} s to settle), {bus}, {} clusters, {} writes ({} failed)",
        o.elapsed.as_secs_f64(),
        o.settled.as_secs_f64(),
        b.clusters,
        o.stats.writes,
        o.stats.errors
    );
    println!(
        "while agents were down: {} deletes, {} recreates",
        o.stats.deletes_while_down, o.stats.creates_while_down
    );
    println!("faults: {}", faults.join(", "));
    println!("objects {objects} (final {}, resync {}, lost {})", v("final"), v("resync"), v("lost"));
    println!("events {} delivered; resyncs {} received", obs.events, obs.resync_count);
    let mut reasons: Vec<_> = obs.resync_reasons.iter().collect();
    reasons.sort_by(|a, b| b.1.cmp(a.1));
    for (reason, n) in reasons {
        println!("  resync {n}× {reason}");
    }
    println!(
        "{}",
        serde_json::json!({"bench": "soak", "bus": format!("{:?}", b.bus).to_lowercase(), "hub_replicas": b.replicas(),
            "duration_s": o.elapsed.as_secs_f64().round(), "clusters": b.clusters,
            "deletes_while_down": o.stats.deletes_while_down, "creates_while_down": o.stats.creates_while_down,
            "faults": o.counts.injected.iter().map(|(k, n)| (k.name(), *n)).collect::<BTreeMap<_, _>>(),
            "objects": objects, "final": v("final"), "resync": v("resync"), "lost": v("lost"),
            "events": obs.events, "resyncs": obs.resync_count, "writes": o.stats.writes, "crashes": o.crashes.len(), "notes": o.notes.len(), "outages": o.outages.len()})
    );
}
