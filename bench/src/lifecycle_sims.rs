//! The simulated runtime clusters of `bench lifecycle`, spread over child processes.
//!
//! Why children: each sim cluster holds its own TLS listener, its "kubelet"'s watch and
//! write connections (both ends, as the kubelet runs beside it) and the operator instances'
//! connections to it, about seven descriptors per cluster. One process with the
//! machine's open-file limit (20,000 here) stopped at about 2,500 clusters, so the bench
//! starts `fleetwatch bench lifecycle-sims --from A --to B` (hidden) per at most
//! [`DEFAULT_PER_PROCESS`] clusters: it starts runtime clusters `rtA`..`rtB` and their
//! kubelets, prints one JSON line per cluster (`{"runtime":i,"kubeconfig":"…"}`) and then
//! `{"ready":n}`, and serves until its standard input ends: when the bench stops, fails or
//! is killed its end of the pipe closes, so no sim process outlives it (the bench also
//! kills them on drop).
//!
//! For `bench self-service` each cluster also gets its agent (`--agents-pki DIR --hub URL`):
//! the real [`AgentRuntime`] with a Kubernetes source on the cluster, certificate
//! `agent-rt<i>` from the bench PKI, its own loopback source address, connected to the hub
//! over mTLS, as each runtime cluster of a fleet runs one.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_agent::kube_source::KubeSource;
use fleetwatch_agent::{AgentConfig, AgentRuntime};
use fleetwatch_certs::TlsFiles;
use fleetwatch_client::transport::{Dialer, HubUrl, HubUrls};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio_util::sync::CancellationToken;

/// Runtime clusters per sim process unless `--sims-per-process` says otherwise: about
/// seven descriptors each stays well below a 20,000 open-file limit.
pub(super) const DEFAULT_PER_PROCESS: usize = 1_500;

/// `fleetwatch bench lifecycle-sims` (hidden): one sim process of `bench lifecycle`.
#[derive(Args)]
pub(super) struct LifecycleSimsArgs {
    /// First runtime index (cluster `rt<from>`).
    #[arg(long)]
    from: usize,
    /// One past the last runtime index.
    #[arg(long)]
    to: usize,
    /// Run an agent per cluster with its certificate `agent-rt<i>` from this PKI directory.
    #[arg(long, requires = "hub")]
    agents_pki: Option<PathBuf>,
    /// The hub the agents connect to.
    #[arg(long, requires = "agents_pki")]
    hub: Option<HubUrl>,
}

/// Agents beside the sim clusters: where they connect and with which certificates.
#[derive(Clone)]
pub(super) struct AgentSpec {
    /// The bench PKI (`agent-rt<i>.crt` / `.key`, `ca.crt`).
    pub pki: PathBuf,
    /// The hub.
    pub hub: HubUrl,
}

/// One line a sim process prints.
#[derive(Serialize, Deserialize, Debug, PartialEq)]
#[serde(untagged)]
enum SimLine {
    /// Runtime cluster `rt<runtime>` serves; its kubeconfig (with its token and CA).
    Cluster { runtime: usize, kubeconfig: String },
    /// Every cluster of the range serves.
    Ready { ready: usize },
}

/// Runs one sim process: starts its clusters and kubelets, reports them, and serves until
/// its standard input ends.
pub(super) async fn run_child(args: LifecycleSimsArgs) -> anyhow::Result<()> {
    if args.from >= args.to {
        bail!("--from must be below --to");
    }
    raise_open_file_limit();
    // The parent's end of our stdin closes when it stops, fails or is killed.
    let parent_gone = CancellationToken::new();
    let watch_stdin = parent_gone.clone();
    tokio::spawn(async move {
        let mut sink = [0u8; 256];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut sink).await, Ok(n) if n > 0) {}
        watch_stdin.cancel();
    });
    let kubelets = CancellationToken::new();
    let _stop_kubelets = kubelets.clone().drop_guard();
    let agent_spec = match (args.agents_pki, args.hub) {
        (Some(pki), Some(hub)) => Some(AgentSpec { pki, hub }),
        _ => None,
    };
    let mut agents = Vec::new();
    let mut out = tokio::io::stdout();
    let mut sims = Vec::with_capacity(args.to - args.from);
    for i in args.from..args.to {
        if parent_gone.is_cancelled() {
            return Ok(());
        }
        let sim = fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions {
            name: format!("rt{i}"),
            ..Default::default()
        })
        .await
        .with_context(|| format!("cannot start sim cluster rt{i}"))?;
        // The cluster's Deployment controller: a manager counts as rolled out only once
        // its controller observed the new generation (what the operator waits for).
        tokio::spawn(kubelet(sim.client().await?, kubelets.clone()));
        if let Some(spec) = &agent_spec {
            let runtime = agent_runtime(spec, i).with_context(|| format!("agent of cluster rt{i}"))?;
            let source = KubeSource::new(sim.client().await?, format!("sim cluster rt{i}"));
            agents.push(runtime.start(source, kubelets.child_token()));
        }
        let line = serde_json::to_string(&SimLine::Cluster { runtime: i, kubeconfig: sim.kubeconfig_yaml() })? + "\n";
        out.write_all(line.as_bytes()).await.context("the bench stopped reading")?;
        sims.push(sim);
    }
    let line = serde_json::to_string(&SimLine::Ready { ready: sims.len() })? + "\n";
    out.write_all(line.as_bytes()).await.context("the bench stopped reading")?;
    out.flush().await?;
    parent_gone.cancelled().await;
    kubelets.cancel();
    // Let the agents close their sessions (briefly: the bench is gone).
    let stopped = futures_util::future::join_all(agents.into_iter().map(|a| a.wait()));
    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), stopped).await;
    Ok(())
}

/// Cluster `rt<i>`'s agent: its own certificate and, on loopback, its own source address
/// (the hub budgets handshakes per source address, as each cluster of a fleet has its own).
fn agent_runtime(spec: &AgentSpec, i: usize) -> anyhow::Result<AgentRuntime> {
    let mut cfg = AgentConfig::new(HubUrls::new(vec![spec.hub.clone()])?, agent_files(&spec.pki, i));
    if spec.hub.host.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback()) {
        cfg.dialer = Dialer::from_source(super::load::agent_source_address(i).into());
    }
    Ok(AgentRuntime::new(cfg)?)
}

/// Cluster `rt<i>`'s agent certificate files in the bench PKI.
fn agent_files(pki: &Path, i: usize) -> TlsFiles {
    TlsFiles {
        cert: pki.join(format!("agent-rt{i}.crt")),
        key: pki.join(format!("agent-rt{i}.key")),
        ca: vec![pki.join("ca.crt")],
    }
}

/// Raises the soft open-file limit to the hard one (a soft limit of 1,024 is common and
/// would hold about 140 clusters).
fn raise_open_file_limit() {
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
}

/// A sim child process of the bench (killed on drop; it also exits when its stdin closes).
pub(super) struct SimProcess {
    child: tokio::process::Child,
    /// Held open: closing it tells the process to stop.
    _stdin: tokio::process::ChildStdin,
}

impl SimProcess {
    /// Its process id (for its CPU time), while it runs.
    pub(super) fn pid(&self) -> Option<u32> {
        self.child.id()
    }
}

/// Starts the runtime clusters `0..runtimes` in processes of at most `per_process` each
/// (all starting at once), with an agent each when `agents` says where they connect, and
/// returns them with every cluster's kubeconfig, by index.
pub(super) async fn start(
    runtimes: usize,
    per_process: usize,
    agents: Option<&AgentSpec>,
) -> anyhow::Result<(Vec<SimProcess>, Vec<String>)> {
    let per_process = per_process.max(1);
    let ranges: Vec<Range<usize>> =
        (0..runtimes).step_by(per_process).map(|from| from..(from + per_process).min(runtimes)).collect();
    let mut starting = Vec::with_capacity(ranges.len());
    for range in ranges {
        starting.push(spawn(range, agents)?);
    }
    let mut procs = Vec::with_capacity(starting.len());
    let mut kubeconfigs = vec![String::new(); runtimes];
    // Read every process's lines at once: one that waits on a full pipe would stall.
    let results = futures_util::future::join_all(starting.into_iter().map(|(p, range, lines)| async move {
        let got = read_clusters(lines, range.clone()).await.with_context(|| {
            format!("sim process for runtimes {}..{} did not start its clusters", range.start, range.end)
        });
        got.map(|got| (p, got))
    }))
    .await;
    for result in results {
        let (p, got) = result?;
        for (i, kubeconfig) in got {
            kubeconfigs[i] = kubeconfig;
        }
        procs.push(p);
    }
    Ok((procs, kubeconfigs))
}

type Lines = tokio::io::Lines<BufReader<tokio::process::ChildStdout>>;

fn spawn(range: Range<usize>, agents: Option<&AgentSpec>) -> anyhow::Result<(SimProcess, Range<usize>, Lines)> {
    let exe = std::env::current_exe().context("cannot find own executable")?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(["--log", "warn", "bench", "lifecycle-sims"]).args([
        "--from",
        &range.start.to_string(),
        "--to",
        &range.end.to_string(),
    ]);
    if let Some(a) = agents {
        cmd.arg("--agents-pki").arg(&a.pki).args(["--hub", &a.hub.to_string()]);
    }
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .context("cannot start a sim process")?;
    let stdin = child.stdin.take().context("sim process stdin")?;
    let stdout = child.stdout.take().context("sim process stdout")?;
    Ok((SimProcess { child, _stdin: stdin }, range, BufReader::new(stdout).lines()))
}

/// Reads a sim process's cluster lines up to its ready line.
async fn read_clusters(mut lines: Lines, range: Range<usize>) -> anyhow::Result<Vec<(usize, String)>> {
    let mut got = Vec::with_capacity(range.len());
    loop {
        let Some(line) = lines.next_line().await? else { bail!("it exited after {} clusters", got.len()) };
        match serde_json::from_str::<SimLine>(&line).with_context(|| format!("unexpected line {line:?}"))? {
            SimLine::Cluster { runtime, kubeconfig } if range.contains(&runtime) => got.push((runtime, kubeconfig)),
            SimLine::Cluster { runtime, .. } => bail!("it reported runtime {runtime}, outside its range"),
            SimLine::Ready { ready } if ready == range.len() && got.len() == ready => return Ok(got),
            SimLine::Ready { ready } => {
                bail!("ready with {ready} of {} clusters ({} reported)", range.len(), got.len())
            }
        }
    }
}

/// Stands in for a runtime cluster's Deployment controller: on every change of a Deployment
/// that is not rolled out yet, reports its current generation observed and its replicas
/// updated and ready. Watch-driven (one idle watch per cluster), unlike the sim's polling
/// helper, so a thousand clusters cost nothing while nothing changes.
async fn kubelet(client: kube::Client, stop: CancellationToken) {
    use futures_util::StreamExt;
    use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
    use kube::runtime::{WatchStreamExt, watcher};
    let ar = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let all: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
    let changes = watcher(all, watcher::Config::default()).default_backoff().applied_objects();
    let mut changes = std::pin::pin!(changes);
    loop {
        let d = tokio::select! {
            _ = stop.cancelled() => return,
            next = changes.next() => match next {
                Some(Ok(d)) => d,
                Some(Err(_)) => continue,
                None => return,
            },
        };
        let generation = d.metadata.generation.unwrap_or(1);
        let want = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
        let status = &d.data["status"];
        let done = status["observedGeneration"].as_i64() == Some(generation)
            && status["updatedReplicas"].as_i64().unwrap_or(0) >= want
            && status["readyReplicas"].as_i64().unwrap_or(0) >= want;
        let (Some(ns), Some(name)) = (d.metadata.namespace.as_deref(), d.metadata.name.as_deref()) else { continue };
        if done {
            continue;
        }
        let patch = serde_json::json!({"status": {"observedGeneration": generation, "replicas": want,
            "updatedReplicas": want, "readyReplicas": want, "availableReplicas": want}});
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        // A failed write shows up again as the next change (or the operator's requeue).
        let _ = api.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_round_trip() {
        let c = SimLine::Cluster { runtime: 7, kubeconfig: "{\n  \"a\": 1\n}".into() };
        let line = serde_json::to_string(&c).unwrap();
        assert!(!line.contains('\n'), "one line per cluster: {line}");
        assert_eq!(serde_json::from_str::<SimLine>(&line).unwrap(), c);
        let r = SimLine::Ready { ready: 3 };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"ready":3}"#);
        assert_eq!(serde_json::from_str::<SimLine>(r#"{"ready":3}"#).unwrap(), r);
    }
}
