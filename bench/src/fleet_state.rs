//! `fleetwatch bench fleet-state`: the start-up of a hub replica on NATS whose fleet state
//! holds many known clusters (issue 34: 50,000).
//!
//! A local `nats-server -js` is started and the bucket `<stream>_fleet` filled with one
//! entry per cluster, as hub replicas write them (the hub's own entry format, a few watches
//! and modules each, written by three replicas that are gone: so every cluster lists as
//! not connected, as after a restart of every replica). Then, `--runs` times, a hub replica
//! (a child process, `--bus` on that server) is started and the bench measures how long
//! until its fleet state has loaded every entry (from the start of the process, and as
//! the hub measured it itself: `fleetwatch_hub_fleet_load_seconds`, from following the
//! bucket to caught up), its memory once loaded (RSS, and the same against a replica on an
//! empty bucket of another stream), and a few admin requests answered from that state.
//! Medians are printed.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_bus::{Bus, DEFAULT_AGE_DISK, DEFAULT_BYTES_DISK, Expect, NatsBus, NatsOptions, Retention};
use fleetwatch_hub::ClusterStatus;
use fleetwatch_hub::fleet::entry::{FleetEntry, encode};
use fleetwatch_protocol::message::{ModuleInventory, WatchPhase, WatchState};
use futures_util::StreamExt;

use super::{HubProcess, bench_pki, hub_counter, rss_kib, start_hub_at};

#[derive(Args)]
pub(super) struct FleetStateBench {
    /// Clusters known in the fleet state.
    #[arg(long, default_value_t = 50_000)]
    clusters: usize,
    /// Hub replicas started one after another on the filled bucket (medians of them).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Give up waiting for a replica to load after this many seconds.
    #[arg(long, default_value_t = 300.0)]
    timeout: f64,
    /// Print one JSON object with every figure as the last line.
    #[arg(long)]
    json: bool,
}

/// The stream the filled bucket belongs to (`<STREAM>_fleet`).
const STREAM: &str = "fleetbench";
/// Writes in flight while filling.
const FILL_IN_FLIGHT: usize = 256;
/// Replica names the entries are written by (none of them runs).
const WRITERS: [&str; 3] = ["10.0.0.1:7443", "10.0.0.2:7443", "10.0.0.3:7443"];

/// A cluster's status as a replica would show it: three watches, five modules.
fn status(i: usize) -> ClusterStatus {
    let now = jiff::Timestamp::now();
    let watch =
        |n: &str| WatchState { name: n.into(), phase: WatchPhase::Running, message: String::new(), objects: 40 };
    let module = |n: &str| ModuleInventory { name: n.into(), version: "1.4.2".into(), ready: true };
    ClusterStatus {
        cluster: format!("bench-{i:06}"),
        connected: true,
        session: Some(format!("{:016x}", i as u64 * 0x9e37_79b9)),
        remote: Some(format!("10.{}.{}.{}:41234", i >> 16 & 255, i >> 8 & 255, i & 255)),
        agent_version: Some("0.1.0".into()),
        protocol: Some(2),
        agent_protocols: Some("1..2".into()),
        agent_protocol: Some(2),
        last_seen: Some(now),
        connected_since: Some(now),
        epoch: 1_764_000_000_000 + i as u64,
        acked_seq: 1200,
        events_received: 1200,
        sessions: 1,
        inventory: ["redis", "postgres", "ingress", "cert-manager", "monitoring"].map(module).to_vec(),
        watches: ["configmaps", "deployments", "runtimes"].map(watch).to_vec(),
        cert_serial: Some(format!("{:032x}", i as u128 * 0x9e37_79b9_7f4a_7c15)),
        cert_not_after: Some(now),
        ..ClusterStatus::default()
    }
}

/// Fills the fleet bucket of [`STREAM`] on `url` with `n` entries; answers (seconds, bytes).
async fn fill(url: &str, n: usize) -> anyhow::Result<(f64, u64)> {
    // The stream as a hub with the default flags creates it (a hub refuses other settings).
    let retention = Retention { records: 200_000, bytes: DEFAULT_BYTES_DISK, age: Some(DEFAULT_AGE_DISK) };
    let mut opts = NatsOptions::new(vec![url.to_string()], retention);
    opts.stream = STREAM.into();
    opts.missing_stream_wait = Duration::ZERO;
    let bus = NatsBus::open(opts).await.context("cannot open the bus to fill the fleet state")?;
    let share = bus.replica_share().context("a NATS bus shares")?;
    let max = share.max_entry_bytes();
    let started = Instant::now();
    let writes = futures_util::stream::iter(0..n).map(|i| {
        let value = encode(FleetEntry::new(status(i), WRITERS[i % WRITERS.len()]), max);
        async move {
            let bytes = value.len() as u64;
            share.write_entry(&format!("bench-{i:06}"), value, Expect::Any).await.map(|_| bytes)
        }
    });
    let mut writes = writes.buffer_unordered(FILL_IN_FLIGHT);
    let mut bytes = 0u64;
    while let Some(w) = writes.next().await {
        bytes += w.context("a fill write failed")?;
    }
    Ok((started.elapsed().as_secs_f64(), bytes))
}

/// A GET of the admin endpoint: (seconds, body bytes), `None` when it failed.
async fn get(admin: &str, path: &str) -> Option<(f64, usize)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let started = Instant::now();
    let mut tcp = tokio::net::TcpStream::connect(admin).await.ok()?;
    tcp.write_all(format!("GET {path} HTTP/1.0\r\nHost: {admin}\r\n\r\n").as_bytes()).await.ok()?;
    let mut body = Vec::new();
    tcp.read_to_end(&mut body).await.ok()?;
    let ok = body.starts_with(b"HTTP/1.0 200") || body.starts_with(b"HTTP/1.1 200");
    ok.then(|| (started.elapsed().as_secs_f64(), body.len()))
}

/// One replica started on the filled bucket.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
#[serde(rename_all = "camelCase")]
struct Run {
    /// From starting the process until every entry was loaded.
    to_loaded_s: f64,
    /// The hub's own figure: following the bucket until caught up.
    load_s: f64,
    /// RSS once loaded, MiB.
    rss_mib: f64,
    /// Peak RSS, MiB.
    peak_mib: f64,
    /// RSS of a replica on an empty bucket, MiB.
    empty_rss_mib: f64,
    /// `/api/v1/summary` at this size.
    summary_s: f64,
    /// `/api/v1/clusters?limit=100` (the first page).
    page_s: f64,
    /// `/api/v1/overview` (the one-document overview, at most 2,000 clusters shown).
    overview_s: f64,
    /// `/api/v1/watchconfigs` (clusters per watch counted over the fleet).
    watchconfigs_s: f64,
}

async fn one_run(dir: &std::path::Path, url: &str, n: usize, timeout: f64) -> anyhow::Result<Run> {
    let mut run = Run::default();
    // The same replica on an empty bucket: what the entries add to its memory.
    let empty = start_hub_at(dir, false, 0, "warn", &["--bus", url, "--bus-stream", "fleetbench-empty"]).await?;
    wait_loaded(&empty, 0, timeout).await?;
    run.empty_rss_mib = mib(empty.child.id().and_then(|p| rss_kib(p, "VmRSS:")));
    drop(empty);
    let started = Instant::now();
    let hub = start_hub_at(dir, false, 0, "warn", &["--bus", url, "--bus-stream", STREAM]).await?;
    run.load_s = wait_loaded(&hub, n, timeout).await?;
    run.to_loaded_s = started.elapsed().as_secs_f64();
    let pid = hub.child.id();
    run.rss_mib = mib(pid.and_then(|p| rss_kib(p, "VmRSS:")));
    run.peak_mib = mib(pid.and_then(|p| rss_kib(p, "VmHWM:")));
    run.summary_s = median_of(&hub.admin, "/api/v1/summary").await?;
    run.page_s = median_of(&hub.admin, "/api/v1/clusters?limit=100&order=problems").await?;
    run.overview_s = median_of(&hub.admin, "/api/v1/overview").await?;
    run.watchconfigs_s = median_of(&hub.admin, "/api/v1/watchconfigs").await?;
    Ok(run)
}

/// Waits until the hub holds `n` entries and has loaded; answers its load seconds.
async fn wait_loaded(hub: &HubProcess, n: usize, timeout: f64) -> anyhow::Result<f64> {
    let deadline = Instant::now() + Duration::from_secs_f64(timeout);
    loop {
        let entries = hub_counter(&hub.admin, "fleetwatch_hub_fleet_entries").await.unwrap_or(0.0);
        let load = hub_counter(&hub.admin, "fleetwatch_hub_fleet_load_seconds").await.unwrap_or(0.0);
        if entries as usize >= n && load > 0.0 {
            return Ok(load);
        }
        if Instant::now() > deadline {
            bail!("the replica loaded {entries} of {n} entries in {timeout} s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The median of three GETs of `path`, seconds.
async fn median_of(admin: &str, path: &str) -> anyhow::Result<f64> {
    let mut times = Vec::new();
    for _ in 0..3 {
        times.push(get(admin, path).await.with_context(|| format!("GET {path} failed"))?.0);
    }
    Ok(median(times))
}

fn mib(kib: Option<u64>) -> f64 {
    kib.map_or(f64::NAN, |k| k as f64 / 1024.0)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

pub(super) async fn run(b: FleetStateBench) -> anyhow::Result<()> {
    if b.runs == 0 || b.timeout <= 0.0 {
        bail!("--runs and --timeout must be positive");
    }
    let (tmp, dir) = bench_pki(&[])?;
    let store = tmp.path().join("jetstream");
    let server = tokio::task::spawn_blocking(move || fleetwatch_bus::nats::server::LocalNatsServer::start(&store))
        .await?
        .context("cannot start a local nats-server")?;
    let url = server.url();
    println!("filling the fleet state with {} clusters on {url} ...", b.clusters);
    let (fill_s, bytes) = fill(&url, b.clusters).await?;
    println!(
        "filled in {fill_s:.1} s ({:.0} writes/s), {:.1} MB of entries ({:.0} bytes each)",
        b.clusters as f64 / fill_s,
        bytes as f64 / 1e6,
        bytes as f64 / b.clusters.max(1) as f64
    );
    let mut runs = Vec::new();
    for i in 0..b.runs {
        let r = one_run(&dir, &url, b.clusters, b.timeout).await?;
        println!(
            "run {}: loaded in {:.2} s from process start (hub: {:.2} s), RSS {:.0} MiB (peak {:.0}; empty bucket {:.0}), summary {:.0} ms, first page {:.0} ms, overview {:.0} ms, watchconfigs {:.0} ms",
            i + 1,
            r.to_loaded_s,
            r.load_s,
            r.rss_mib,
            r.peak_mib,
            r.empty_rss_mib,
            r.summary_s * 1000.0,
            r.page_s * 1000.0,
            r.overview_s * 1000.0,
            r.watchconfigs_s * 1000.0
        );
        runs.push(r);
    }
    let med = |f: fn(&Run) -> f64| median(runs.iter().map(f).collect());
    let summary = serde_json::json!({
        "bench": "fleet-state",
        "clusters": b.clusters,
        "runs": b.runs,
        "fillSeconds": fill_s,
        "entryBytes": bytes as f64 / b.clusters.max(1) as f64,
        "toLoadedSeconds": med(|r| r.to_loaded_s),
        "loadSeconds": med(|r| r.load_s),
        "rssMiB": med(|r| r.rss_mib),
        "peakMiB": med(|r| r.peak_mib),
        "emptyRssMiB": med(|r| r.empty_rss_mib),
        "summaryMs": med(|r| r.summary_s) * 1000.0,
        "firstPageMs": med(|r| r.page_s) * 1000.0,
        "overviewMs": med(|r| r.overview_s) * 1000.0,
        "watchConfigsMs": med(|r| r.watchconfigs_s) * 1000.0,
        "each": runs,
    });
    println!(
        "median of {}: loaded {:.2} s after start (hub {:.2} s), RSS {:.0} MiB vs {:.0} MiB on an empty bucket",
        b.runs,
        med(|r| r.to_loaded_s),
        med(|r| r.load_s),
        med(|r| r.rss_mib),
        med(|r| r.empty_rss_mib)
    );
    if b.json {
        println!("{summary}");
    }
    drop(server);
    Ok(())
}
