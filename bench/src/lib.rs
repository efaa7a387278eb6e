//! `fleetwatch bench`: measured, not asserted. Figures go to docs/performance.md.
//!
//! One file per benchmark (`hub`, `agent`, `lifecycle` with its sim processes in
//! `lifecycle_sims`, `self_service` (on the same sim processes, with an agent per
//! cluster), `sim`, `storm`, `dst`, `fleet_state`; the chaos
//! soak, `bench soak`, lives in `soak/`), so each reads top to bottom as the experiment it
//! is; this file holds the subcommand and what the benchmarks share: a throw-away PKI, a hub
//! child process, and reading a process's memory and CPU from `/proc`. The `fleetwatch`
//! binary only wires it in (`fleetwatch bench …`); the processes a benchmark starts are that
//! binary again (its `hub`, `agent`, … subcommands).

mod agent;
mod dst;
mod fleet_state;
mod hub;
mod jetstream;
mod lifecycle;
mod lifecycle_sims;
mod load;
mod self_service;
mod sim;
mod soak;
mod storm;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand};
use fleetwatch_certs::{Authority, LeafSpec};
use fleetwatch_client::transport::HubUrl;
use tokio::io::{AsyncBufReadExt, BufReader};

/// The arguments of `fleetwatch bench`: which benchmark, and its settings.
#[derive(Args)]
pub struct BenchArgs {
    #[command(subcommand)]
    what: BenchWhat,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// Start a hub (a child process) and N synthetic agents over mTLS, and measure what one
    /// subscriber receives: events/s, delivery latency (agent to subscriber) and hub RSS.
    Hub(hub::HubBench),
    /// An agent process watching a simulated cluster with many objects: its RSS and CPU
    /// idle and under load, and the latency from an API write to the subscriber.
    Agent(agent::AgentBench),
    /// The lifecycle operator over many sim runtime clusters: time to converge at first
    /// and after one module's channel moves, and reconciles per second.
    Lifecycle(lifecycle::LifecycleBench),
    /// The self-service flow at fleet scale: N sim runtime clusters, each with its agent, a
    /// hub and the lifecycle operator; users create `Module` objects in runtime clusters at a
    /// steady rate, and the latency from each create to its `status.state` is measured.
    SelfService(self_service::SelfServiceBench),
    /// The simulated API server: LIST of many objects, and watch fan-out latency from a
    /// write to every watcher's event.
    Sim(sim::SimBench),
    /// A chaos soak: a durable hub, agents under Kubernetes-like churn and a durable
    /// subscriber while hub kills, TCP cuts, agent restarts, disk-full, a damaged segment
    /// and deny-list flips are injected; checks per object that nothing was lost.
    Soak(crate::soak::SoakBench),
    /// A reconnect storm: N agents connected, the hub SIGKILLed and restarted on its port at
    /// once; how long until 50/90/99/100 % of the agents are back and resynced.
    Storm(storm::StormBench),
    /// The deterministic simulation of the delivery path: many seeds of the real agent, hub
    /// and subscriber client under faults on a simulated network, each checked by the
    /// oracle; prints failing seeds and how to replay them.
    Dst(dst::DstBench),
    /// Hub replica start-up with many clusters known in the shared fleet state: a local
    /// nats-server's fleet bucket filled, then replicas started on it; how long until each
    /// loaded every entry, and its memory.
    FleetState(fleet_state::FleetStateBench),
    /// One load process of `bench hub --load-procs` (started by it, not by hand).
    #[command(hide = true)]
    HubLoad(load::HubLoadArgs),
    /// One sim process of `bench lifecycle`: runtime clusters and their kubelets (started
    /// by it, not by hand).
    #[command(hide = true)]
    LifecycleSims(lifecycle_sims::LifecycleSimsArgs),
}

/// Runs the benchmark `args` names; `crds` are fleetwatch's CRDs (what `fleetwatch crds`
/// writes, as JSON) for the benchmarks that install them into a simulated control plane.
pub async fn run(args: BenchArgs, crds: Vec<serde_json::Value>) -> anyhow::Result<()> {
    match args.what {
        BenchWhat::Hub(b) => hub::run(b).await,
        BenchWhat::Agent(b) => agent::run(b).await,
        BenchWhat::Lifecycle(b) => lifecycle::run(b, &crds).await,
        BenchWhat::SelfService(b) => self_service::run(b, &crds).await,
        BenchWhat::Sim(b) => sim::run(b).await,
        BenchWhat::Soak(b) => crate::soak::run(b).await,
        BenchWhat::Storm(b) => storm::run(b).await,
        BenchWhat::Dst(b) => dst::run(b).await,
        BenchWhat::FleetState(b) => fleet_state::run(b).await,
        BenchWhat::HubLoad(a) => load::run_child(a).await,
        BenchWhat::LifecycleSims(a) => lifecycle_sims::run_child(a).await,
    }
}

/// The `fleetwatch` binary the hub and load child processes run: this one, unless
/// `bench hub --child-exe` named another (an older build measured the same way).
static CHILD_EXE: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();

fn child_exe() -> anyhow::Result<PathBuf> {
    match CHILD_EXE.get() {
        Some(exe) => Ok(exe.clone()),
        None => std::env::current_exe().context("cannot find own executable"),
    }
}

/// A hub running as a child process of the benchmark.
struct HubProcess {
    /// The process (killed on drop).
    child: tokio::process::Child,
    /// Its WebSocket address.
    wss: HubUrl,
    /// Its admin address (`host:port`).
    admin: String,
}

/// Starts a hub child process with the certificates in `dir` (memory only, or with a data
/// directory when `durable`) and waits until it listens.
async fn start_hub(dir: &Path, durable: bool, extra: &[&str]) -> anyhow::Result<HubProcess> {
    start_hub_at(dir, durable, 0, "warn", extra).await
}

/// [`start_hub`] on a given WebSocket port (0: any free one), logging at `log` (a storm
/// would print one warning per agent).
async fn start_hub_at(dir: &Path, durable: bool, port: u16, log: &str, extra: &[&str]) -> anyhow::Result<HubProcess> {
    let exe = child_exe()?;
    // A profiler to run the hub under (e.g. `heaptrack`, `valgrind --tool=massif`).
    let mut cmd = match std::env::var("FLEETWATCH_BENCH_HUB_WRAPPER") {
        Ok(w) if !w.trim().is_empty() => {
            let mut parts = w.split_whitespace();
            let mut c = tokio::process::Command::new(parts.next().unwrap_or_default());
            c.args(parts).arg(exe);
            c
        }
        _ => tokio::process::Command::new(exe),
    };
    let listen = format!("127.0.0.1:{port}");
    // `FLEETWATCH_BENCH_HUB_LOG` overrides the hubs' log filter (e.g.
    // `warn,fleetwatch_bus=debug` to see how their head reads went).
    let log = std::env::var("FLEETWATCH_BENCH_HUB_LOG").ok().filter(|l| !l.trim().is_empty()).unwrap_or(log.into());
    cmd.args(["--log", &log, "hub", "--listen", &listen, "--admin-listen", "127.0.0.1:0"])
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
    let listening = async {
        // A wrapper may print lines of its own first.
        let mut other = Vec::new();
        loop {
            let Some(line) = lines.next_line().await? else {
                anyhow::bail!("hub exited before listening (it printed {other:?})");
            };
            match parse_listening(&line) {
                Some(found) => return Ok(found),
                None if other.len() < 10 => other.push(line),
                None => anyhow::bail!("unexpected hub output {other:?}"),
            }
        }
    };
    let (wss, admin) =
        tokio::time::timeout(Duration::from_secs(60), listening).await.context("hub did not start in 60 s")??;
    // Keep draining its stdout, so a chatty wrapper never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
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

/// A counter from a hub's `/metrics` (summed over its label sets), e.g.
/// `fleetwatch_hub_events_received_total`; `None` when the hub does not answer.
async fn hub_counter(admin: &str, name: &str) -> Option<f64> {
    metric_samples(&metrics_text(admin).await?, name).map(|(_, v)| v).reduce(|a, b| a + b)
}

/// The samples of metric `name` in an exposition: each one's labels (`{...}`, or empty)
/// and value.
fn metric_samples<'a>(body: &'a str, name: &'a str) -> impl Iterator<Item = (&'a str, f64)> + 'a {
    body.lines().filter_map(move |line| {
        let rest = line.strip_prefix(name)?;
        let (labels, value) = match rest.strip_prefix('{') {
            Some(r) => {
                let (labels, value) = r.split_once("} ")?;
                (labels, value)
            }
            None => ("", rest.strip_prefix(' ')?),
        };
        Some((labels, value.split_whitespace().next()?.parse().ok()?))
    })
}

/// The text a process serves at `http://<admin>/metrics`; `None` when it does not answer
/// within 5 s.
async fn metrics_text(admin: &str) -> Option<String> {
    http_get(admin, "/metrics").await
}

/// The response (headers and body) to `GET <path>` at `http://<admin>`; `None` when it does
/// not answer within 5 s.
async fn http_get(admin: &str, path: &str) -> Option<String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fetch = async {
        let mut tcp = tokio::net::TcpStream::connect(admin).await.ok()?;
        let req = format!("GET {path} HTTP/1.0\r\nHost: {admin}\r\n\r\n");
        tcp.write_all(req.as_bytes()).await.ok()?;
        let mut body = String::new();
        tcp.read_to_string(&mut body).await.ok()?;
        Some(body)
    };
    tokio::time::timeout(Duration::from_secs(5), fetch).await.ok()?
}

/// A `/proc/<pid>/status` memory field (`VmRSS:`, `VmHWM:`) in KiB.
fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find(|l| l.starts_with(field))?.split_whitespace().nth(1)?.parse().ok()
}

/// The `p` quantile of sorted microseconds, in milliseconds.
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

/// A fresh directory under the system temp directory.
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_hub_listening_line() {
        let line = "hub listening wss=wss://127.0.0.1:4431 admin=http://127.0.0.1:9191";
        assert_eq!(parse_listening(line), Some(("wss://127.0.0.1:4431".into(), "127.0.0.1:9191".into())));
        assert_eq!(parse_listening("hub listening wss=wss://127.0.0.1:4431"), None);
    }

    #[test]
    fn metric_samples_by_labels() {
        let body = "# TYPE x counter\nx_total{reason=\"a\"} 3\nx_total{reason=\"b\"} 4\nx_totally 9\ny 1.5\n";
        let got: Vec<_> = metric_samples(body, "x_total").collect();
        assert_eq!(got, vec![("reason=\"a\"", 3.0), ("reason=\"b\"", 4.0)]);
        assert_eq!(metric_samples(body, "y").collect::<Vec<_>>(), vec![("", 1.5)]);
    }

    #[test]
    fn percentiles_in_milliseconds() {
        let us = [1_000, 2_000, 3_000, 4_000, 5_000];
        assert_eq!(percentile(&us, 0.0), 1.0);
        assert_eq!(percentile(&us, 0.5), 3.0);
        assert_eq!(percentile(&us, 1.0), 5.0);
        assert!(percentile(&[], 0.5).is_nan());
    }
}
