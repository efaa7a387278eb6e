//! The hub bench's load: synthetic agents, each with its own certificate and connection,
//! run in the bench process or spread over `--load-procs` child processes (`fleetwatch
//! bench hub-load`, hidden). Child processes keep the load generator's CPU out of the
//! measuring process and its figures, let the bench report hub CPU and load CPU apart,
//! and go past the per-process open-file limit (20,000 here) with more agents.
//!
//! A load process takes its agents as a range of indices into the bench PKI, reports
//! `{"connected":N,"moved":M,"back":B,"connect_failures":F,"connect_timeouts":T}` on stdout
//! every 100 ms, takes `mark` on stdin (remember
//! each agent's session count; `moved` counts agents that lost their session or opened a
//! new one since), and `stop` (or end of input) to stop its sources, let the agents drain
//! and exit.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_agent::source::{Source, SyntheticSource};
use fleetwatch_agent::{AgentConfig, AgentHandle, AgentRuntime};
use fleetwatch_certs::TlsFiles;
use fleetwatch_client::transport::{Dialer, HubUrl, HubUrls};
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use super::{cpu_seconds, rss_kib};

/// Connections one process may hold: the open-file hard limit here is 20,000, and each
/// agent is one socket (plus a few files of the process itself).
pub(super) const MAX_AGENTS_PER_PROCESS: usize = 19_000;

/// What the load is: which agents, where they connect, what they send.
#[derive(Clone)]
pub(super) struct LoadSpec {
    /// The bench PKI (`agent-bench-{i}.crt` / `.key`, `ca.crt`).
    pub pki: PathBuf,
    /// The hub replicas; agent `i` lists them starting at replica `i % len`.
    pub hubs: Vec<HubUrl>,
    /// Number of agents.
    pub agents: usize,
    /// What each agent's source produces.
    pub source: SyntheticSource,
    /// Publish straight to this NATS JetStream server instead (`bench hub --vs-nats`): each
    /// agent a JetStream publisher, see [`super::jetstream`].
    pub jetstream: Option<String>,
}

/// A load process's report line.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
struct LoadStatus {
    /// Agents with an open session.
    connected: usize,
    /// Agents that lost their session or opened a new one since the last `mark`.
    moved: usize,
    /// Agents back since the last `mark`: in a new session, and everything they had produced
    /// by the mark acked in it.
    #[serde(default)]
    back: usize,
    /// Connect attempts of all agents that reached no hub, and of those the ones that timed
    /// out (absent from older builds' load processes).
    #[serde(default)]
    connect_failures: u64,
    #[serde(default)]
    connect_timeouts: u64,
    /// Agents started so far (absent from older builds, whose load processes report only
    /// once all their agents are started).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    started: Option<usize>,
}

/// The running load.
pub(super) enum Load {
    /// Agents in the bench process itself.
    InProcess(Group),
    /// Agents in child processes.
    Procs(Vec<LoadProc>),
}

impl Load {
    /// Starts the agents: in this process when `procs` is 0, else spread evenly over
    /// `procs` child processes.
    pub async fn start(spec: &LoadSpec, procs: usize) -> anyhow::Result<Self> {
        if procs == 0 {
            if spec.agents > MAX_AGENTS_PER_PROCESS {
                bail!(
                    "{} agents do not fit in one process (open-file limit; at most {MAX_AGENTS_PER_PROCESS}): use \
                     --load-procs",
                    spec.agents
                );
            }
            return Ok(Load::InProcess(Group::start(spec, 0..spec.agents).await?));
        }
        let per = spec.agents.div_ceil(procs);
        if per > MAX_AGENTS_PER_PROCESS {
            bail!(
                "{per} agents per load process exceed the open-file limit (at most {MAX_AGENTS_PER_PROCESS}): raise \
                 --load-procs"
            );
        }
        let mut children = Vec::new();
        for k in 0..procs {
            let range = (k * per).min(spec.agents)..((k + 1) * per).min(spec.agents);
            if !range.is_empty() {
                children.push(LoadProc::spawn(spec, range).await?);
            }
        }
        Ok(Load::Procs(children))
    }

    /// Agents with an open session.
    pub fn connected(&self) -> usize {
        match self {
            Load::InProcess(g) => g.status().connected,
            Load::Procs(ps) => ps.iter().map(|p| p.status.borrow().connected).sum(),
        }
    }

    /// Agents that lost their session or opened a new one since [`mark`](Self::mark).
    pub fn moved(&self) -> usize {
        match self {
            Load::InProcess(g) => g.status().moved,
            Load::Procs(ps) => ps.iter().map(|p| p.status.borrow().moved).sum(),
        }
    }

    /// Agents back since [`mark`](Self::mark): connected in a new session that acked
    /// everything they had produced by the mark.
    pub fn back(&self) -> usize {
        match self {
            Load::InProcess(g) => g.status().back,
            Load::Procs(ps) => ps.iter().map(|p| p.status.borrow().back).sum(),
        }
    }

    /// Connect attempts of all agents that reached no hub so far, and of those the ones that
    /// timed out.
    pub fn connect_failures(&self) -> (u64, u64) {
        let of = |s: LoadStatus| (s.connect_failures, s.connect_timeouts);
        match self {
            Load::InProcess(g) => of(g.status()),
            Load::Procs(ps) => ps.iter().map(|p| of(*p.status.borrow())).fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1)),
        }
    }

    /// Agents started so far, when every load process says (older builds do not).
    pub fn started(&self) -> Option<usize> {
        match self {
            Load::InProcess(g) => g.status().started,
            Load::Procs(ps) => ps.iter().map(|p| p.status.borrow().started).sum(),
        }
    }

    /// Remembers every agent's session count and last seq now.
    pub async fn mark(&mut self) -> anyhow::Result<()> {
        match self {
            Load::InProcess(g) => g.mark(),
            Load::Procs(ps) => {
                for p in ps {
                    p.command("mark").await?;
                }
            }
        }
        Ok(())
    }

    /// CPU seconds the load processes used so far (0 in process: the caller counts its own
    /// process).
    pub fn cpu_seconds(&self) -> f64 {
        match self {
            Load::InProcess(_) => 0.0,
            Load::Procs(ps) => ps.iter().filter_map(|p| p.child.id().and_then(cpu_seconds)).sum(),
        }
    }

    /// The load processes' RSS, summed, in KiB (0 in process).
    pub fn rss_kib(&self) -> u64 {
        match self {
            Load::InProcess(_) => 0,
            Load::Procs(ps) => ps.iter().filter_map(|p| p.child.id().and_then(|id| rss_kib(id, "VmRSS:"))).sum(),
        }
    }

    /// Stops the sources and waits (up to 10 s) for the agents to drain what is pending.
    pub async fn stop(self) {
        match self {
            Load::InProcess(g) => g.stop().await,
            Load::Procs(ps) => {
                let waits = ps.into_iter().map(|mut p| async move {
                    let _ = p.command("stop").await;
                    if tokio::time::timeout(Duration::from_secs(15), p.child.wait()).await.is_err() {
                        let _ = p.child.start_kill();
                    }
                });
                futures_util::future::join_all(waits).await;
            }
        }
    }
}

/// The agents of one process: fleetwatch agents, or JetStream publishers with `--vs-nats`.
pub(super) enum Group {
    /// Agents connected to hubs.
    Agents(AgentGroup),
    /// Publishers connected to a JetStream server.
    Publishers(super::jetstream::PublisherGroup),
}

impl Group {
    async fn start(spec: &LoadSpec, range: Range<usize>) -> anyhow::Result<Self> {
        Ok(match &spec.jetstream {
            Some(url) => {
                Group::Publishers(super::jetstream::PublisherGroup::start(&spec.pki, url, range, &spec.source).await?)
            }
            None => Group::Agents(AgentGroup::start(spec, range).await?),
        })
    }

    fn status(&self) -> LoadStatus {
        match self {
            Group::Agents(g) => g.status(),
            Group::Publishers(p) => LoadStatus { connected: p.connected(), ..LoadStatus::default() },
        }
    }

    fn mark(&mut self) {
        if let Group::Agents(g) = self {
            g.mark();
        }
    }

    async fn stop(self) {
        match self {
            Group::Agents(g) => g.stop().await,
            Group::Publishers(p) => p.stop().await,
        }
    }
}

/// Agents running in this process.
pub(super) struct AgentGroup {
    agents: Vec<AgentHandle>,
    /// Per agent at the last mark: (sessions, last seq); sessions 0 before any mark.
    marks: Vec<(u64, u64)>,
    stop: CancellationToken,
}

impl AgentGroup {
    /// Agents started per step, and the pause between steps, so the handshakes do not all
    /// land in the same instant.
    const STEP: usize = 50;
    const PAUSE: Duration = Duration::from_millis(20);

    /// Starts agents `range` of `spec`, a few at a time.
    async fn start(spec: &LoadSpec, range: Range<usize>) -> anyhow::Result<Self> {
        let mut group = Self::empty(spec)?;
        let mut rest = range;
        while !rest.is_empty() {
            group.start_some(spec, &mut rest)?;
            if !rest.is_empty() {
                tokio::time::sleep(Self::PAUSE).await;
            }
        }
        Ok(group)
    }

    /// A group with no agent yet.
    fn empty(spec: &LoadSpec) -> anyhow::Result<Self> {
        if spec.hubs.is_empty() {
            bail!("no hub to connect to");
        }
        Ok(Self { agents: Vec::new(), marks: Vec::new(), stop: CancellationToken::new() })
    }

    /// Starts the next [`STEP`](Self::STEP) agents of `rest` (each loads its certificate:
    /// at 12,500 agents per process this takes tens of seconds on a busy machine, which is
    /// why a load process reports while it starts them).
    fn start_some(&mut self, spec: &LoadSpec, rest: &mut Range<usize>) -> anyhow::Result<()> {
        for i in rest.by_ref().take(Self::STEP) {
            let first = i % spec.hubs.len();
            let hubs =
                HubUrls::new((0..spec.hubs.len()).map(|k| spec.hubs[(first + k) % spec.hubs.len()].clone()).collect())?;
            let mut cfg = AgentConfig::new(hubs, agent_files(&spec.pki, i));
            cfg.outbox_capacity = 1_000_000;
            if spec.hubs.iter().all(|h| h.host.parse::<std::net::Ipv4Addr>().is_ok_and(|a| a.is_loopback())) {
                cfg.dialer = Dialer::from_source(agent_source_address(i).into());
            }
            let runtime = AgentRuntime::new(cfg).with_context(|| format!("agent {i}"))?;
            self.agents.push(runtime.changes_buffer(1024).start(spec.source.clone(), self.stop.clone()));
            self.marks.push((0, 0));
        }
        Ok(())
    }

    fn status(&self) -> LoadStatus {
        let mut s = LoadStatus { started: Some(self.agents.len()), ..LoadStatus::default() };
        for (a, &(sessions, last_seq)) in self.agents.iter().zip(&self.marks) {
            let st = a.stats();
            let st = st.borrow();
            s.connected += usize::from(st.connected);
            let marked = sessions > 0;
            s.moved += usize::from(marked && (!st.connected || st.sessions > sessions));
            s.back += usize::from(marked && st.connected && st.sessions > sessions && st.acked_seq >= last_seq);
            s.connect_failures += st.connect_failures;
            s.connect_timeouts += st.connect_timeouts;
        }
        s
    }

    fn mark(&mut self) {
        // An agent not yet connected has 0 sessions; count it from 1 so it is not "moved"
        // only because it connects late.
        self.marks = self
            .agents
            .iter()
            .map(|a| {
                let st = a.stats().borrow().clone();
                (st.sessions.max(1), st.last_seq)
            })
            .collect();
    }

    async fn stop(self) {
        self.stop.cancel();
        let finished = futures_util::future::join_all(self.agents.into_iter().map(|a| a.wait()));
        let _ = tokio::time::timeout(Duration::from_secs(10), finished).await;
    }
}

/// Agent `i`'s own loopback address, as each agent of a real fleet has its own: the hub
/// keeps its handshake budget per source address, and with every synthetic agent on
/// 127.0.0.1 that budget (64 by default), not the hub, would bound how fast a large fleet
/// connects. Linux routes all of 127.0.0.0/8 to the loopback device; the last octet avoids
/// 0 and 255, 127.0.0.1 is left to everything else.
pub(super) fn agent_source_address(i: usize) -> std::net::Ipv4Addr {
    let (net, host) = (i / 254, i % 254);
    let a = u8::try_from(1 + net / 256).unwrap_or(u8::MAX);
    std::net::Ipv4Addr::new(127, a, (net % 256) as u8, 1 + host as u8)
}

/// Agent `i`'s certificate files in the bench PKI.
fn agent_files(pki: &Path, i: usize) -> TlsFiles {
    TlsFiles {
        cert: pki.join(format!("agent-bench-{i}.crt")),
        key: pki.join(format!("agent-bench-{i}.key")),
        ca: vec![pki.join("ca.crt")],
    }
}

/// A load child process and its latest report.
pub(super) struct LoadProc {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    status: watch::Receiver<LoadStatus>,
}

impl LoadProc {
    async fn spawn(spec: &LoadSpec, range: Range<usize>) -> anyhow::Result<Self> {
        let exe = super::child_exe()?;
        let mut cmd = tokio::process::Command::new(exe);
        cmd.args(["--log", "warn", "bench", "hub-load", "--pki"])
            .arg(&spec.pki)
            .args(["--from", &range.start.to_string(), "--to", &range.end.to_string()])
            .args(["--source", &spec.source.describe()]);
        for h in &spec.hubs {
            cmd.args(["--hub", &h.to_string()]);
        }
        if let Some(url) = &spec.jetstream {
            cmd.args(["--jetstream", url]);
        }
        cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::inherit()).kill_on_drop(true);
        let mut child = cmd.spawn().context("cannot start a load process")?;
        let stdin = child.stdin.take().context("load process stdin")?;
        let stdout = child.stdout.take().context("load process stdout")?;
        let (tx, status) = watch::channel(LoadStatus::default());
        tokio::spawn(async move {
            let mut lines = BufReader::new(stdout).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                match serde_json::from_str::<LoadStatus>(&line) {
                    Ok(s) => {
                        tx.send_replace(s);
                    }
                    Err(e) => tracing::warn!(%line, "load process says something unexpected: {e}"),
                }
            }
        });
        Ok(Self { child, stdin, status })
    }

    async fn command(&mut self, what: &str) -> anyhow::Result<()> {
        self.stdin.write_all(format!("{what}\n").as_bytes()).await.context("load process gone")?;
        self.stdin.flush().await.context("load process gone")
    }
}

/// `fleetwatch bench hub-load` (hidden): one load process of `bench hub --load-procs`.
#[derive(Args)]
pub(super) struct HubLoadArgs {
    /// The bench PKI directory.
    #[arg(long)]
    pki: PathBuf,
    /// The hub replicas (repeat), in the order agent 0 lists them.
    #[arg(long, required_unless_present = "jetstream")]
    hub: Vec<HubUrl>,
    /// Publish to this JetStream server instead of connecting agents to hubs.
    #[arg(long, conflicts_with = "hub")]
    jetstream: Option<String>,
    /// First agent index.
    #[arg(long)]
    from: usize,
    /// One past the last agent index.
    #[arg(long)]
    to: usize,
    /// Each agent's source (`synthetic:objects=N,rate=R[,total=T][,payload=B]`).
    #[arg(long)]
    source: SyntheticSource,
}

/// Runs one load process until told to stop (or its input ends).
pub(super) async fn run_child(args: HubLoadArgs) -> anyhow::Result<()> {
    if args.from >= args.to || args.to - args.from > MAX_AGENTS_PER_PROCESS {
        bail!("--from..--to must hold 1 to {MAX_AGENTS_PER_PROCESS} agents");
    }
    let spec =
        LoadSpec { pki: args.pki, hubs: args.hub, agents: args.to, source: args.source, jetstream: args.jetstream };
    // Agents are started a few at a time while the process reports (what it reported
    // only once all were started, 30-40 s at 12,500 agents on a busy machine, looked like
    // a storm in which none connected); publishers all at once.
    let mut rest = args.from..args.to;
    let mut group = match &spec.jetstream {
        Some(_) => Group::start(&spec, std::mem::replace(&mut rest, 0..0)).await?,
        None => Group::Agents(AgentGroup::empty(&spec)?),
    };
    let mut pace = tokio::time::interval(AgentGroup::PAUSE);
    let mut commands = BufReader::new(tokio::io::stdin()).lines();
    let mut out = tokio::io::stdout();
    let mut tick = tokio::time::interval(Duration::from_millis(100));
    loop {
        tokio::select! {
            _ = pace.tick(), if !rest.is_empty() => {
                if let Group::Agents(g) = &mut group {
                    g.start_some(&spec, &mut rest)?;
                }
            }
            line = commands.next_line() => match line {
                Ok(Some(l)) if l.trim() == "mark" => group.mark(),
                Ok(Some(l)) if l.trim() != "stop" => tracing::warn!(command = %l, "unknown load command"),
                _ => break,
            },
            _ = tick.tick() => {
                let line = serde_json::to_string(&group.status())? + "\n";
                out.write_all(line.as_bytes()).await?;
                out.flush().await?;
            }
        }
    }
    group.stop().await;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_agent_has_its_own_loopback_address() {
        let addrs: std::collections::HashSet<_> = (0..100_000).map(agent_source_address).collect();
        assert_eq!(addrs.len(), 100_000);
        for a in &addrs {
            let [o0, o1, _, o3] = a.octets();
            assert!(o0 == 127 && o1 >= 1 && o3 != 0 && o3 != 255, "{a}");
        }
        assert_eq!(agent_source_address(0), std::net::Ipv4Addr::new(127, 1, 0, 1));
        assert_eq!(agent_source_address(254), std::net::Ipv4Addr::new(127, 1, 1, 1));
    }

    #[test]
    fn status_lines_round_trip() {
        let s =
            LoadStatus { connected: 7, moved: 2, back: 1, connect_failures: 5, connect_timeouts: 3, started: Some(9) };
        let line = serde_json::to_string(&s).unwrap();
        assert_eq!(line, r#"{"connected":7,"moved":2,"back":1,"connect_failures":5,"connect_timeouts":3,"started":9}"#);
        assert_eq!(serde_json::from_str::<LoadStatus>(&line).unwrap(), s);
        // An older build's load process says less.
        let old = serde_json::from_str::<LoadStatus>(r#"{"connected":7,"moved":2}"#).unwrap();
        assert_eq!((old.back, old.connect_failures, old.started), (0, 0, None));
    }

    #[tokio::test]
    async fn refuses_more_agents_than_a_process_can_hold() {
        let spec = LoadSpec {
            pki: PathBuf::from("/nonexistent"),
            hubs: vec!["wss://127.0.0.1:1".parse().unwrap()],
            agents: MAX_AGENTS_PER_PROCESS + 1,
            source: "synthetic:objects=1,rate=1".parse().unwrap(),
            jetstream: None,
        };
        let err = Load::start(&spec, 0).await.err().expect("refused").to_string();
        assert!(err.contains("--load-procs"), "{err}");
        let spec = LoadSpec { agents: 2 * MAX_AGENTS_PER_PROCESS + 2, ..spec };
        let err = Load::start(&spec, 2).await.err().expect("refused").to_string();
        assert!(err.contains("raise --load-procs"), "{err}");
    }
}
