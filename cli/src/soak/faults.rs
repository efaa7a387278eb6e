//! The faults the soak injects, one at a time, each undone before the next.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::seq::SliceRandom;
use tokio_util::sync::CancellationToken;

use super::procs::{ProcError, Restartable, Stop};
use super::proxy::CutProxy;

/// A kind of fault.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum)]
pub enum FaultKind {
    /// SIGKILL the hub, start it again on the same data directory and port.
    Kill,
    /// Cut the TCP path of all agents, or of the subscriber, for a few seconds.
    Cut,
    /// Stop one agent (SIGKILL or SIGTERM) and start it again.
    AgentRestart,
    /// Make the hub's storage fail with ENOSPC for a few seconds (needs the hub's
    /// `--fault-injection` admin hook).
    DiskFull,
    /// SIGKILL the hub, damage a closed segment of its log, start it again.
    Corrupt,
    /// Put one agent's certificate (its serial or SPIFFE id) on the deny list, then take
    /// it off again.
    Deny,
}

impl FaultKind {
    /// Every kind, in the order the summary prints them.
    pub const ALL: [FaultKind; 6] = [
        FaultKind::Kill,
        FaultKind::Cut,
        FaultKind::AgentRestart,
        FaultKind::DiskFull,
        FaultKind::Corrupt,
        FaultKind::Deny,
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
        }
    }
}

/// Why a fault could not be injected or undone.
#[derive(Debug, thiserror::Error)]
pub enum FaultError {
    /// A process could not be started again.
    #[error(transparent)]
    Proc(#[from] ProcError),
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
}

/// Everything the faults act on; handed back when the run is over.
pub struct Fleet {
    /// The hub process.
    pub hub: Restartable,
    /// Its admin address.
    pub admin: SocketAddr,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its deny-list file.
    pub deny_list: PathBuf,
    /// The agents.
    pub agents: Vec<AgentProc>,
    /// The path between agents and hub.
    pub agent_proxy: CutProxy,
    /// The path between the subscriber and the hub.
    pub subscriber_proxy: CutProxy,
    /// Processes that exited by themselves, by name.
    pub crashes: Vec<String>,
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
    while !stop.is_cancelled() && Instant::now() < plan.until && !plan.kinds.is_empty() {
        watch_crashes(&mut fleet).await;
        // Every kind once per round, in a shuffled order: short runs still see them all.
        if order.is_empty() {
            order = plan.kinds.clone();
            order.shuffle(&mut rand::rng());
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
    if let Some(status) = fleet.hub.exited() {
        tracing::error!(%status, "the hub exited by itself: starting it again");
        fleet.crashes.push(format!("hub ({status}; log {})", fleet.hub.log().display()));
        if let Err(e) = fleet.hub.start(Some("hub listening"), HUB_START_TIMEOUT).await {
            tracing::error!(error = %e, "cannot start the hub again");
        }
    }
    for a in &mut fleet.agents {
        if let Some(status) = a.proc.exited() {
            tracing::error!(cluster = %a.cluster, %status, "an agent exited by itself: starting it again");
            fleet.crashes.push(format!("agent {} ({status}; log {})", a.cluster, a.proc.log().display()));
            if let Err(e) = a.proc.start(None, Duration::ZERO).await {
                tracing::error!(error = %e, "cannot start the agent again");
            }
        }
    }
}

/// Injects one fault and undoes it; `Ok(false)` when it was not possible this time. `k`
/// counts the attempts of this kind, to alternate its variants (which signal, which path).
async fn inject(fleet: &mut Fleet, kind: FaultKind, plan: &Plan, k: u64) -> Result<bool, FaultError> {
    match kind {
        FaultKind::Kill => {
            fleet.hub.stop(Stop::Kill, Duration::ZERO).await;
            fleet.hub.start(Some("hub listening"), HUB_START_TIMEOUT).await?;
            Ok(true)
        }
        FaultKind::Corrupt => {
            fleet.hub.stop(Stop::Kill, Duration::ZERO).await;
            // First a zeroed block (a lost page), then flipped bytes, alternating.
            let damaged = corrupt_closed_segment(&fleet.data_dir, !k.is_multiple_of(2));
            fleet.hub.start(Some("hub listening"), HUB_START_TIMEOUT).await?;
            match damaged? {
                Some((path, offset, len)) => {
                    tracing::info!(path = %path.display(), offset, len, "damaged a closed bus segment");
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        FaultKind::Cut => {
            let (proxy, what) = if k.is_multiple_of(2) {
                (&fleet.subscriber_proxy, "subscriber")
            } else {
                (&fleet.agent_proxy, "agents")
            };
            tracing::info!(path = what, "cutting the TCP path");
            proxy.cut();
            tokio::time::sleep(plan.hold).await;
            proxy.restore();
            Ok(true)
        }
        FaultKind::AgentRestart => {
            let i = rand::rng().random_range(0..fleet.agents.len().max(1));
            let Some(a) = fleet.agents.get_mut(i) else { return Ok(false) };
            let how = if k.is_multiple_of(2) { Stop::Kill } else { Stop::Term };
            tracing::info!(cluster = %a.cluster, signal = %how, "restarting agent");
            a.proc.stop(how, Duration::from_secs(10)).await;
            a.proc.start(None, Duration::ZERO).await?;
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
            let ms = plan.hold.as_millis();
            match super::http_post(fleet.admin, &format!("/debug/faults/storage?fail_for_ms={ms}")).await {
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
