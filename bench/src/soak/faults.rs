//! The faults the soak injects, one at a time, each undone before the next. Some need the
//! embedded bus (its disk: `disk-full`, `corrupt`), some the JetStream cluster of
//! `--bus nats` (`node-kill`, `js-empty`, `bus-cut`); the others work on both.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;

use super::churn::Churn;
use super::jetstream::{JetStream, JetStreamError, RECOVER_TIMEOUT};
use super::procs::{ProcError, Restartable, Stop};
use super::proxy::CutProxy;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum FaultKind {
    /// SIGKILL the hub, start it again on the same data directory and port. With
    /// `--bus nats`: one hub replica, started again after a few seconds.
    Kill,
    /// Cut the TCP path of all agents, or of the subscriber, for a few seconds.
    Cut,
    /// Stop one agent (SIGKILL or SIGTERM) for a few seconds, while its cluster's churn
    /// deletes and recreates objects, and start it again.
    AgentRestart,
    /// Make the hub's storage fail with ENOSPC for a few seconds (needs the hub's
    /// `--fault-injection` admin hook).
    DiskFull,
    /// SIGKILL the hub, damage a closed segment of its log, start it again.
    Corrupt,
    /// Put one agent's certificate (its serial or SPIFFE id) on the deny list, then take
    /// it off again.
    Deny,
    /// SIGKILL one JetStream node for a few seconds, start it again on its store.
    NodeKill,
    /// JetStream restarted empty: SIGKILL every node, wipe every store, start them again.
    JsEmpty,
    /// Cut the TCP path between the hubs and one JetStream node, or all of them, for a few
    /// seconds.
    BusCut,
    /// Freeze one hub (SIGSTOP) for a few seconds and thaw it: its connections stay open
    /// and nothing answers.
    Freeze,
    /// Freeze one JetStream node (SIGSTOP) for a few seconds while the other two keep
    /// quorum, and thaw it.
    NodeFreeze,
    /// SIGKILL one hub replica and every JetStream node (stores kept), start the hub again
    /// while JetStream is down (it must start unready, not exit), then JetStream.
    RestartIntoOutage,
}

impl FaultKind {
    /// Every kind, in the order the summary prints them.
    pub const ALL: [FaultKind; 12] = [
        FaultKind::Kill,
        FaultKind::Cut,
        FaultKind::AgentRestart,
        FaultKind::DiskFull,
        FaultKind::Corrupt,
        FaultKind::Deny,
        FaultKind::NodeKill,
        FaultKind::JsEmpty,
        FaultKind::BusCut,
        FaultKind::Freeze,
        FaultKind::NodeFreeze,
        FaultKind::RestartIntoOutage,
    ];

    /// The kinds on by default on the embedded bus.
    pub const EMBEDDED: [FaultKind; 7] = [
        FaultKind::Kill,
        FaultKind::Cut,
        FaultKind::AgentRestart,
        FaultKind::DiskFull,
        FaultKind::Corrupt,
        FaultKind::Deny,
        FaultKind::Freeze,
    ];

    /// The kinds on by default with `--bus nats` (the JetStream ones first: the first
    /// round goes in this order).
    pub const NATS: [FaultKind; 10] = [
        FaultKind::JsEmpty,
        FaultKind::NodeKill,
        FaultKind::BusCut,
        FaultKind::RestartIntoOutage,
        FaultKind::NodeFreeze,
        FaultKind::Kill,
        FaultKind::AgentRestart,
        FaultKind::Cut,
        FaultKind::Deny,
        FaultKind::Freeze,
    ];

    /// The name used in `--faults` and the summary.
    pub fn name(self) -> &'static str {
        match self {
            FaultKind::Kill => "kill",
            FaultKind::Cut => "cut",
            FaultKind::AgentRestart => "agent-restart",
            FaultKind::DiskFull => "disk-full",
            FaultKind::Corrupt => "corrupt",
            FaultKind::Deny => "deny",
            FaultKind::NodeKill => "node-kill",
            FaultKind::JsEmpty => "js-empty",
            FaultKind::BusCut => "bus-cut",
            FaultKind::Freeze => "freeze",
            FaultKind::NodeFreeze => "node-freeze",
            FaultKind::RestartIntoOutage => "restart-into-outage",
        }
    }

    /// Whether the kind can be injected on this bus.
    pub fn fits(self, nats: bool) -> bool {
        if nats { FaultKind::NATS.contains(&self) } else { FaultKind::EMBEDDED.contains(&self) }
    }
}

/// Why a fault could not be injected or undone.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// A process could not be started again.
    #[error(transparent)]
    Proc(#[from] ProcError),
    /// The JetStream cluster could not be started again.
    #[error(transparent)]
    JetStream(#[from] JetStreamError),
    /// A file could not be changed.
    #[error("{what} {path}: {source}")]
    File {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// One agent: its process, and what names its certificate on a deny list.
pub struct AgentProc {
    /// The cluster id.
    pub cluster: String,
    /// The process.
    pub proc: Restartable,
    /// SPIFFE id of its certificate.
    pub identity: String,
    /// Serial of its certificate (hex).
    pub serial: String,
    /// Its cluster's churn (told while the agent is down).
    pub churn: Arc<Churn>,
}

/// One hub process.
pub struct HubProc {
    /// The process.
    pub proc: Restartable,
    /// Its admin address.
    pub admin: SocketAddr,
}

/// Everything the faults act on; handed back when the run is over.
pub struct Fleet {
    /// The hub processes: one on the embedded bus, the replicas with `--bus nats`.
    pub hubs: Vec<HubProc>,
    /// The embedded hub's data directory.
    pub data_dir: Option<PathBuf>,
    /// The hubs' deny-list file.
    pub deny_list: PathBuf,
    /// The agents.
    pub agents: Vec<AgentProc>,
    /// The paths between agents and hubs, one per hub.
    pub agent_proxies: Vec<CutProxy>,
    /// The paths between the subscriber and the hubs, one per hub.
    pub subscriber_proxies: Vec<CutProxy>,
    /// The JetStream cluster, with `--bus nats`.
    pub jetstream: Option<JetStream>,
    /// Processes that exited by themselves, by name.
    pub crashes: Vec<String>,
    /// Things that went wrong without losing anything yet, e.g. hubs not ready long after
    /// JetStream came back (printed in the summary).
    pub notes: Vec<String>,
    /// Restarts that failed and were tried again, each with its duration (printed).
    pub outages: Vec<String>,
}

/// Fault counts.
#[derive(Debug, Default, Clone)]
pub struct FaultCounts {
    /// Injected, by kind.
    pub injected: BTreeMap<FaultKind, u64>,
    /// Attempted but not possible (e.g. no segment to corrupt yet, hook missing), by kind.
    pub skipped: BTreeMap<FaultKind, u64>,
}

/// When and which faults to inject.
pub struct Plan {
    /// Kinds enabled.
    pub kinds: Vec<FaultKind>,
    /// Mean pause between faults.
    pub interval: Duration,
    /// Faults start at this time.
    pub from: Instant,
    /// No fault starts after this time.
    pub until: Instant,
    /// How long a cut, a deny or a disk-full lasts.
    pub hold: Duration,
}

const HUB_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long a process that fails to start again is retried before the soak gives up on it.
const GIVE_UP: Duration = Duration::from_secs(300);

/// Starts `proc` again until it is up (see [`Restartable::start_until_up`]), noting an
/// outage in `outages`.
async fn start_again(
    proc: &mut super::procs::Restartable,
    wait_for: Option<&str>,
    timeout: Duration,
    outages: &mut Vec<String>,
) -> Result<(), ProcError> {
    if let Some(outage) = proc.start_until_up(wait_for, timeout, GIVE_UP).await? {
        outages.push(outage);
    }
    Ok(())
}

/// Injects faults by `plan` until its end (or `stop`), then makes sure everything is
/// running and restored, and hands the fleet back with the counts.
pub async fn run(mut fleet: Fleet, plan: Plan, stop: CancellationToken) -> (Fleet, FaultCounts, Option<FaultError>) {
    let mut counts = FaultCounts::default();
    let mut error = None;
    let mut order: Vec<FaultKind> = Vec::new();
    let mut attempts: BTreeMap<FaultKind, u64> = BTreeMap::new();
    tokio::select! {
        _ = tokio::time::sleep_until(plan.from.into()) => {}
        _ = stop.cancelled() => {}
    }
    let mut n = 0u64;
    let mut rounds = 0u64;
    while !stop.is_cancelled() && Instant::now() < plan.until && !plan.kinds.is_empty() {
        watch_crashes(&mut fleet).await;
        // Every kind once per round: short runs still see them all. The first round in
        // the order given (a short run sees those first for sure), later ones shuffled.
        if order.is_empty() {
            order = plan.kinds.clone();
            if rounds > 0 {
                order.shuffle(&mut rand::rng());
            }
            order.reverse(); // popped from the end
            rounds += 1;
        }
        let Some(kind) = order.pop() else { break };
        n += 1;
        tracing::info!(fault = kind.name(), n, "injecting fault");
        let k = attempts.entry(kind).or_insert(0u64);
        *k += 1;
        match inject(&mut fleet, kind, &plan, *k).await {
            Ok(true) => *counts.injected.entry(kind).or_default() += 1,
            Ok(false) => *counts.skipped.entry(kind).or_default() += 1,
            Err(e) => {
                tracing::error!(fault = kind.name(), error = %e, "fault could not be injected or undone");
                error = Some(e);
                break;
            }
        }
        // The pause ends with the plan: the churn must not wait for the next fault.
        let pause = plan.interval.mul_f64(rand::rng().random_range(0.5..1.5));
        tokio::select! {
            _ = tokio::time::sleep_until((Instant::now() + pause).min(plan.until).into()) => {}
            _ = stop.cancelled() => {}
        }
    }
    watch_crashes(&mut fleet).await;
    (fleet, counts, error)
}

/// Starts again any process that exited by itself, and remembers it.
async fn watch_crashes(fleet: &mut Fleet) {
    for (i, hub) in fleet.hubs.iter_mut().enumerate() {
        if let Some(status) = hub.proc.exited() {
            tracing::error!(hub = i, %status, "a hub exited by itself: starting it again");
            fleet.crashes.push(format!("hub {i} ({status}; log {})", hub.proc.log().display()));
            if let Err(e) =
                start_again(&mut hub.proc, Some("hub listening"), HUB_START_TIMEOUT, &mut fleet.outages).await
            {
                tracing::error!(hub = i, error = %e, "cannot start the hub again");
            }
        }
    }
    for a in &mut fleet.agents {
        if let Some(status) = a.proc.exited() {
            tracing::error!(cluster = %a.cluster, %status, "an agent exited by itself: starting it again");
            fleet.crashes.push(format!("agent {} ({status}; log {})", a.cluster, a.proc.log().display()));
            if let Err(e) = start_again(&mut a.proc, None, Duration::ZERO, &mut fleet.outages).await {
                tracing::error!(error = %e, "cannot start the agent again");
            }
        }
    }
}

/// After every JetStream node was started again: waits for a meta leader and for every
/// hub to be ready by itself, noting what did not happen within [`RECOVER_TIMEOUT`].
async fn note_recovery(fleet: &mut Fleet, after: &str) {
    if let Some(js) = fleet.jetstream.as_ref()
        && !js.wait_meta_leader(RECOVER_TIMEOUT).await
    {
        fleet.notes.push(format!("no JetStream meta leader after it {after}"));
    }
    let unready = wait_hubs_ready(&fleet.hubs, RECOVER_TIMEOUT).await;
    for (i, why) in unready {
        fleet.notes.push(format!("hub {i} not ready {} s after JetStream {after}: {why}", RECOVER_TIMEOUT.as_secs()));
    }
}

/// Injects one fault and undoes it; `Ok(false)` when it was not possible this time. `k`
/// counts the attempts of this kind, to alternate its variants (which signal, which path).
async fn inject(fleet: &mut Fleet, kind: FaultKind, plan: &Plan, k: u64) -> Result<bool, FaultError> {
    match kind {
        FaultKind::Kill => {
            let i = rand::rng().random_range(0..fleet.hubs.len().max(1));
            let replicas = fleet.hubs.len();
            let Some(hub) = fleet.hubs.get_mut(i) else { return Ok(false) };
            hub.proc.stop(Stop::Kill, Duration::ZERO).await;
            if replicas > 1 {
                // Replicas: the others carry the load meanwhile.
                tracing::info!(hub = i, "hub replica killed");
                tokio::time::sleep(plan.hold).await;
            }
            start_again(&mut hub.proc, Some("hub listening"), HUB_START_TIMEOUT, &mut fleet.outages).await?;
            Ok(true)
        }
        FaultKind::Corrupt => {
            let (Some(hub), Some(data_dir)) = (fleet.hubs.first_mut(), &fleet.data_dir) else { return Ok(false) };
            hub.proc.stop(Stop::Kill, Duration::ZERO).await;
            // First a zeroed block (a lost page), then flipped bytes, alternating.
            let damaged = corrupt_closed_segment(data_dir, !k.is_multiple_of(2));
            start_again(&mut hub.proc, Some("hub listening"), HUB_START_TIMEOUT, &mut fleet.outages).await?;
            match damaged? {
                Some((path, offset, len)) => {
                    tracing::info!(path = %path.display(), offset, len, "damaged a closed bus segment");
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        FaultKind::Cut => {
            let (proxies, what) = if k.is_multiple_of(2) {
                (&fleet.subscriber_proxies, "subscriber")
            } else {
                (&fleet.agent_proxies, "agents")
            };
            tracing::info!(path = what, "cutting the TCP path");
            proxies.iter().for_each(CutProxy::cut);
            tokio::time::sleep(plan.hold).await;
            proxies.iter().for_each(CutProxy::restore);
            Ok(true)
        }
        FaultKind::AgentRestart => {
            let i = rand::rng().random_range(0..fleet.agents.len().max(1));
            let Some(a) = fleet.agents.get_mut(i) else { return Ok(false) };
            let how = if k.is_multiple_of(2) { Stop::Kill } else { Stop::Term };
            tracing::info!(cluster = %a.cluster, signal = %how, "stopping agent; its churn deletes and recreates");
            a.proc.stop(how, Duration::from_secs(10)).await;
            a.churn.set_agent_down(true);
            tokio::time::sleep(plan.hold).await;
            a.churn.set_agent_down(false);
            start_again(&mut a.proc, None, Duration::ZERO, &mut fleet.outages).await?;
            Ok(true)
        }
        FaultKind::Deny => {
            let i = rand::rng().random_range(0..fleet.agents.len().max(1));
            let Some(a) = fleet.agents.get(i) else { return Ok(false) };
            let entry = if k.is_multiple_of(2) { a.identity.clone() } else { a.serial.clone() };
            tracing::info!(cluster = %a.cluster, %entry, "denying agent");
            write_file(&fleet.deny_list, &format!("# fleetwatch bench soak\n{entry}\n"))?;
            tokio::time::sleep(plan.hold).await;
            write_file(&fleet.deny_list, "# fleetwatch bench soak: nothing denied\n")?;
            Ok(true)
        }
        FaultKind::DiskFull => {
            let Some(hub) = fleet.hubs.first() else { return Ok(false) };
            let ms = plan.hold.as_millis();
            match super::http_post(hub.admin, &format!("/debug/faults/storage?fail_for_ms={ms}")).await {
                Ok((status, _)) if (200..300).contains(&status) => {
                    tokio::time::sleep(plan.hold).await;
                    Ok(true)
                }
                Ok((status, body)) => {
                    tracing::warn!(status, body = %body.trim(), "the hub refused the storage fault (is --fault-injection supported?)");
                    Ok(false)
                }
                Err(e) => {
                    tracing::warn!(error = %e, "cannot reach the hub's admin endpoint for the storage fault");
                    Ok(false)
                }
            }
        }
        FaultKind::NodeKill => {
            let Some(js) = fleet.jetstream.as_mut() else { return Ok(false) };
            let i = rand::rng().random_range(0..js.node_count().max(1));
            tracing::info!(node = i, "killing a JetStream node");
            js.kill(i).await;
            tokio::time::sleep(plan.hold).await;
            js.start_nodes(&[i]).await?;
            // The next fault may take another node: this one must have caught up first,
            // or two of three would be behind (no quorum: a stall, not a fault to test).
            if !js.wait_healthy(i, RECOVER_TIMEOUT).await {
                fleet
                    .notes
                    .push(format!("JetStream node {i} not healthy {} s after its restart", RECOVER_TIMEOUT.as_secs()));
            }
            Ok(true)
        }
        FaultKind::Freeze => {
            let i = rand::rng().random_range(0..fleet.hubs.len().max(1));
            let Some(hub) = fleet.hubs.get(i) else { return Ok(false) };
            tracing::info!(hub = i, "freezing a hub (SIGSTOP)");
            hub.proc.freeze(true);
            tokio::time::sleep(plan.hold).await;
            hub.proc.freeze(false);
            Ok(true)
        }
        FaultKind::NodeFreeze => {
            let Some(js) = fleet.jetstream.as_ref() else { return Ok(false) };
            let i = rand::rng().random_range(0..js.node_count().max(1));
            tracing::info!(node = i, "freezing a JetStream node (SIGSTOP)");
            if !js.freeze(i, true) {
                return Ok(false);
            }
            tokio::time::sleep(plan.hold).await;
            js.freeze(i, false);
            if !js.wait_healthy(i, RECOVER_TIMEOUT).await {
                fleet
                    .notes
                    .push(format!("JetStream node {i} not healthy {} s after a freeze", RECOVER_TIMEOUT.as_secs()));
            }
            Ok(true)
        }
        FaultKind::RestartIntoOutage => {
            let i = rand::rng().random_range(0..fleet.hubs.len().max(1));
            let (Some(js), Some(hub)) = (fleet.jetstream.as_mut(), fleet.hubs.get_mut(i)) else { return Ok(false) };
            tracing::info!(hub = i, "killing a hub replica and every JetStream node; the hub starts again first");
            hub.proc.stop(Stop::Kill, Duration::ZERO).await;
            for n in 0..js.node_count() {
                js.kill(n).await;
            }
            // Started into the outage, the hub must come up (unready), not exit.
            start_again(&mut hub.proc, Some("hub listening"), HUB_START_TIMEOUT, &mut fleet.outages).await?;
            tokio::time::sleep(plan.hold).await;
            js.start_nodes(&(0..js.node_count()).collect::<Vec<_>>()).await?;
            note_recovery(fleet, "came back after the restart into an outage").await;
            Ok(true)
        }
        FaultKind::JsEmpty => {
            let Some(js) = fleet.jetstream.as_mut() else { return Ok(false) };
            tracing::info!("restarting JetStream empty: every node killed, every store wiped");
            js.restart_empty().await?;
            // The hubs must recover by themselves (recreate the stream, tell subscribers).
            note_recovery(fleet, "restarted empty").await;
            Ok(true)
        }
        FaultKind::BusCut => {
            let Some(js) = fleet.jetstream.as_ref() else { return Ok(false) };
            // One node's path (the hubs fail over), then every path (the hubs lose NATS).
            let node = (!k.is_multiple_of(2)).then(|| rand::rng().random_range(0..js.node_count().max(1)));
            tracing::info!(node = ?node, "cutting the TCP path between the hubs and JetStream");
            js.cut(node);
            tokio::time::sleep(plan.hold).await;
            js.restore();
            Ok(true)
        }
    }
}

/// Waits until every hub's `/readyz` answers 200; returns the ones that did not within
/// `timeout`, with their last answer.
async fn wait_hubs_ready(hubs: &[HubProc], timeout: Duration) -> Vec<(usize, String)> {
    let start = Instant::now();
    loop {
        let mut unready = Vec::new();
        for (i, h) in hubs.iter().enumerate() {
            let addr = h.admin.to_string();
            let answer = tokio::time::timeout(
                Duration::from_secs(5),
                fleetwatch_client::admin_http::request(&addr, "/readyz", None),
            )
            .await;
            match answer {
                Ok(Ok((200, _))) => {}
                Ok(Ok((status, body))) => unready.push((i, format!("{status} {}", body.trim()))),
                Ok(Err(e)) => unready.push((i, format!("{e:#}"))),
                Err(_) => unready.push((i, "no answer within 5 s".into())),
            }
        }
        if unready.is_empty() || start.elapsed() > timeout {
            return unready;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn write_file(path: &Path, text: &str) -> Result<(), FaultError> {
    std::fs::write(path, text).map_err(|source| FaultError::File { what: "cannot write", path: path.into(), source })
}

/// Damages a closed segment (not the newest, which the hub appends to; the newest only when
/// it is the only one) of a stopped hub's log: zeroes a 4 KiB block, or flips bytes, at a
/// random place in its first 80 %. Returns (file, offset, length), or `None` when there is
/// no segment big enough.
pub fn corrupt_closed_segment(data_dir: &Path, zero: bool) -> Result<Option<(PathBuf, u64, u64)>, FaultError> {
    let dir = data_dir.join("segments");
    let mut segs: Vec<PathBuf> = match std::fs::read_dir(&dir) {
        Ok(rd) => {
            rd.filter_map(|e| e.ok().map(|e| e.path())).filter(|p| p.extension().is_some_and(|x| x == "log")).collect()
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(source) => return Err(FaultError::File { what: "cannot list", path: dir, source }),
    };
    segs.sort();
    let closed = if segs.len() > 1 { &segs[..segs.len() - 1] } else { &segs[..] };
    let Some(path) = closed.get(rand::rng().random_range(0..closed.len().max(1))).cloned() else {
        return Ok(None);
    };
    let err = |what, source| FaultError::File { what, path: path.clone(), source };
    let mut bytes = std::fs::read(&path).map_err(|e| err("cannot read", e))?;
    let size = bytes.len() as u64;
    if size < 1024 {
        return Ok(None);
    }
    let offset = rand::rng().random_range(0..size * 8 / 10);
    let len = if zero { 4096.min(size - offset) } else { 16.min(size - offset) };
    let range = offset as usize..(offset + len) as usize;
    if zero {
        bytes[range].fill(0);
    } else {
        let mut rng = rand::rng();
        for b in &mut bytes[range] {
            // Never a no-op flip.
            *b ^= rng.random_range(1..=255u8);
        }
    }
    std::fs::write(&path, &bytes).map_err(|e| err("cannot write", e))?;
    Ok(Some((path, offset, len)))
}
