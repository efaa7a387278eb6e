//! One simulation run: the hosts on turmoil's network, the driver that writes to the
//! clusters and injects faults from the seed, the heal phase, and the verdict.

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetwatch_protocol::message::StartFrom;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::cluster::ClusterModel;
use crate::hosts::{AgentHost, Clusters, HubHost, SubscriberControl, SubscriberHost, lock};
use crate::net::CutSwitch;
use crate::oracle::SubscriberModel;
use crate::pki::{HUB_HOST, MAX_CLUSTERS, Pki, cluster_id};
use crate::storage;

/// Where the hub keeps its bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// In memory: a hub crash loses the stream.
    Memory,
    /// The segment log in a temporary directory: a crash keeps what was synced.
    Disk,
    /// Chosen per seed.
    Mixed,
}

impl std::str::FromStr for Storage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Storage::Memory),
            "disk" => Ok(Storage::Disk),
            "mixed" => Ok(Storage::Mixed),
            other => Err(format!("unknown storage {other:?} (memory, disk or mixed)")),
        }
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Storage::Memory => "memory",
            Storage::Disk => "disk",
            Storage::Mixed => "mixed",
        })
    }
}

/// How runs are set up.
#[derive(Debug, Clone)]
pub struct Options {
    /// The hub's bus.
    pub storage: Storage,
    /// Simulated time with faults and writes.
    pub fault_time: Duration,
    /// Longest simulated time after the faults for everything to converge.
    pub heal_time: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Self { storage: Storage::Mixed, fault_time: Duration::from_secs(20), heal_time: Duration::from_secs(60) }
    }
}

/// The outcome of one seed.
#[derive(Debug, Clone)]
pub struct Report {
    /// The seed.
    pub seed: u64,
    /// What the seed chose (clusters, bus, retention).
    pub scenario: String,
    /// Every rule broken; empty when the run passed.
    pub violations: Vec<String>,
    /// Faults injected, by kind.
    pub faults: BTreeMap<&'static str, u64>,
    /// Writes to the clusters.
    pub writes: u64,
    /// Simulated time the run took.
    pub sim_time: Duration,
    /// Wall-clock time the run took.
    pub wall_time: Duration,
    /// Events and resyncs delivered to each subscriber.
    pub delivered: Vec<(String, u64, u64)>,
    /// A digest of every delivery in order: a replay of the seed gives the same one.
    pub fingerprint: u64,
}

impl Report {
    /// Whether every rule held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The command that replays `seed` with `opts`.
pub fn replay_command(seed: u64, opts: &Options) -> String {
    format!(
        "cargo run -p fleetwatch-dst -- --seed {seed} --storage {} --fault-secs {} --verbose",
        opts.storage,
        opts.fault_time.as_secs()
    )
}

/// One scheduled action of the driver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    Repair(String),
    Release(String),
    Bounce(String),
    Crash(String),
    Unstall(usize),
}

/// Runs seed `seed`.
pub fn run(seed: u64, opts: &Options) -> anyhow::Result<Report> {
    let wall = Instant::now();
    Pki::get()?;
    crate::init_logging();
    // The reconnect backoff's jitter (backon) draws from fastrand's thread-local generator.
    fastrand::seed(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let n_clusters = rng.random_range(1..=MAX_CLUSTERS.min(3));
    let names_per_cluster = rng.random_range(2..=8);
    let disk = match opts.storage {
        Storage::Memory => false,
        Storage::Disk => true,
        Storage::Mixed => rng.random_bool(0.5),
    };
    // Mostly ample retention; sometimes so small that a slow subscriber loses history.
    let retention_records = if rng.random_bool(0.2) { rng.random_range(5..40) } else { 100_000 };
    let data_dir = disk.then(|| storage::temp_dir(seed));
    let scenario = format!(
        "{n_clusters} cluster(s), {names_per_cluster} names each, bus {}, retention {retention_records} records",
        if disk { "segment log" } else { "memory" }
    );

    let clusters = Arc::new(Clusters {
        ids: (0..n_clusters).map(cluster_id).collect(),
        models: (0..n_clusters).map(|_| Arc::new(Mutex::new(ClusterModel::default()))).collect(),
    });
    // Objects exist before anything starts.
    for m in &clusters.models {
        let mut m = lock(m);
        for i in 0..rng.random_range(0..=names_per_cluster) {
            m.apply(&format!("o{i}"));
        }
    }

    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(Duration::from_millis(10))
        .simulation_duration(Duration::from_secs(3600))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(20))
        .tcp_capacity(1024)
        .build();

    let hub = HubHost { data_dir: data_dir.clone(), retention_records };
    sim.host(HUB_HOST, move || hub.clone().run());

    let mut cuts: BTreeMap<String, CutSwitch> = BTreeMap::new();
    let mut agent_hosts = Vec::new();
    for (i, id) in clusters.ids.iter().enumerate() {
        // The agent of each cluster, and for the first one a second process.
        let copies: &[&str] = if i == 0 { &["", "-b"] } else { &[""] };
        for (k, suffix) in copies.iter().enumerate() {
            let host = format!("agent-{id}{suffix}");
            let cut = CutSwitch::default();
            cuts.insert(host.clone(), cut.clone());
            let agent = AgentHost {
                cluster: id.clone(),
                model: clusters.models[i].clone(),
                index: (i * 2 + k) as u64,
                cuts: cut,
            };
            sim.host(host.as_str(), move || agent.clone().run());
            agent_hosts.push(host);
        }
    }
    let mut subs = Vec::new();
    for (k, (name, durable)) in [("durable", true), ("live", false)].into_iter().enumerate() {
        let host = format!("sub-{name}");
        let cut = CutSwitch::default();
        cuts.insert(host.clone(), cut.clone());
        let from = if rng.random_bool(0.5) { StartFrom::Earliest } else { StartFrom::Latest };
        let s = SubscriberHost {
            name,
            durable,
            model: Arc::new(Mutex::new(SubscriberModel::default())),
            control: Arc::new(Mutex::new(SubscriberControl { from, stalled_until: None })),
            clusters: clusters.clone(),
            cuts: cut,
            seed: seed ^ (k as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15),
            starts: Arc::new(AtomicU64::new(0)),
        };
        let runner = s.clone();
        sim.host(host.as_str(), move || runner.clone().run());
        subs.push((host, s));
    }
    // The second agent process only runs when a fault starts it.
    let second = format!("agent-{}-b", clusters.ids[0]);
    sim.crash(second.as_str());
    let mut down: BTreeSet<String> = BTreeSet::from([second.clone()]);

    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut writes = 0u64;
    let mut schedule: Vec<(Duration, Action)> = Vec::new();
    // Links of the hub to another host that are partitioned or held.
    let mut partitioned: BTreeSet<String> = BTreeSet::new();
    let mut held: BTreeSet<String> = BTreeSet::new();
    let tick = Duration::from_millis(10);
    let per_tick = |per_sec: f64| per_sec * tick.as_secs_f64();
    let mut others: Vec<String> = agent_hosts.clone();
    others.extend(subs.iter().map(|(h, _)| h.clone()));

    let mut failure: Option<String> = None;
    // Faults and writes.
    while sim.elapsed() < opts.fault_time {
        if let Err(e) = sim.step() {
            failure = Some(format!("a host failed: {e}"));
            break;
        }
        let now = sim.elapsed();
        // Scheduled actions that are due, in time order.
        schedule.sort();
        let due: Vec<Action> = {
            let (due, later): (Vec<_>, Vec<_>) = schedule.drain(..).partition(|(t, _)| *t <= now);
            schedule = later;
            due.into_iter().map(|(_, a)| a).collect()
        };
        for action in due {
            match action {
                Action::Repair(h) => {
                    sim.repair(HUB_HOST, h.as_str());
                    partitioned.remove(&h);
                }
                Action::Release(h) => {
                    sim.release(HUB_HOST, h.as_str());
                    held.remove(&h);
                }
                Action::Bounce(h) => {
                    if h == HUB_HOST
                        && let Some(dir) = &data_dir
                    {
                        // A crash may lose the log's last records (acked, then cut at a
                        // record boundary) or the cursor store.
                        if rng.random_bool(0.3) {
                            let n = rng.random_range(1..=3);
                            if storage::cut_last_records(dir, n) > 0 {
                                count(&mut faults, "log-truncated");
                            }
                        }
                        if rng.random_bool(0.15) && storage::lose_cursors(dir) {
                            count(&mut faults, "cursor-store-lost");
                        }
                    }
                    sim.bounce(h.as_str());
                    down.remove(&h);
                }
                Action::Crash(h) => {
                    if !down.contains(&h) {
                        sim.crash(h.as_str());
                        down.insert(h);
                    }
                }
                Action::Unstall(k) => lock(&subs[k].1.control).stalled_until = None,
            }
        }
        // Writes to the clusters, also while agents are down.
        if rng.random_bool(per_tick(20.0)) {
            let c = rng.random_range(0..clusters.models.len());
            let name = format!("o{}", rng.random_range(0..names_per_cluster));
            let mut m = lock(&clusters.models[c]);
            if m.names().contains(&name) && rng.random_bool(0.35) {
                m.delete(&name);
            } else {
                m.apply(&name);
            }
            m.trim_history(200);
            writes += 1;
        }
        if rng.random_bool(per_tick(0.2)) {
            let c = rng.random_range(0..clusters.models.len());
            lock(&clusters.models[c]).compact();
            count(&mut faults, "watch-expired");
        }
        // Connection cuts.
        if rng.random_bool(per_tick(0.4)) {
            let h = &others[rng.random_range(0..others.len())];
            cuts[h].cut();
            count(&mut faults, "cut");
        }
        // Partitions and held links between the hub and one host.
        if rng.random_bool(per_tick(0.15)) {
            let h = others[rng.random_range(0..others.len())].clone();
            if !partitioned.contains(&h) && !held.contains(&h) {
                sim.partition(HUB_HOST, h.as_str());
                let until = now + Duration::from_millis(rng.random_range(100..6_000));
                schedule.push((until, Action::Repair(h.clone())));
                partitioned.insert(h);
                count(&mut faults, "partition");
            }
        }
        if rng.random_bool(per_tick(0.1)) {
            let h = others[rng.random_range(0..others.len())].clone();
            if !partitioned.contains(&h) && !held.contains(&h) {
                sim.hold(HUB_HOST, h.as_str());
                let until = now + Duration::from_millis(rng.random_range(50..2_000));
                schedule.push((until, Action::Release(h.clone())));
                held.insert(h);
                count(&mut faults, "hold");
            }
        }
        // The hub crashes.
        if rng.random_bool(per_tick(0.06)) && !down.contains(HUB_HOST) {
            let writers = storage::writer_threads();
            sim.crash(HUB_HOST);
            if data_dir.is_some() {
                storage::wait_for_writer_exit(writers);
            }
            down.insert(HUB_HOST.to_string());
            let until = now + Duration::from_millis(rng.random_range(10..3_000));
            schedule.push((until, Action::Bounce(HUB_HOST.to_string())));
            count(&mut faults, "hub-crash");
        }
        // An agent crashes (its cluster keeps changing meanwhile).
        if rng.random_bool(per_tick(0.12)) {
            let h = agent_hosts[rng.random_range(0..agent_hosts.len())].clone();
            if h != second && !down.contains(&h) {
                sim.crash(h.as_str());
                down.insert(h.clone());
                let until = now + Duration::from_millis(rng.random_range(100..5_000));
                schedule.push((until, Action::Bounce(h)));
                count(&mut faults, "agent-crash");
            }
        }
        // A second agent process of the first cluster runs for a while.
        if rng.random_bool(per_tick(0.05)) && down.contains(&second) {
            sim.bounce(second.as_str());
            down.remove(&second);
            let until = now + Duration::from_millis(rng.random_range(500..8_000));
            schedule.push((until, Action::Crash(second.clone())));
            count(&mut faults, "second-agent");
        }
        // A subscriber crashes and comes back from `earliest` or `latest`.
        if rng.random_bool(per_tick(0.1)) {
            let k = rng.random_range(0..subs.len());
            let (h, s) = &subs[k];
            if !down.contains(h) {
                sim.crash(h.as_str());
                down.insert(h.clone());
                lock(&s.control).from = if rng.random_bool(0.5) { StartFrom::Earliest } else { StartFrom::Latest };
                let until = now + Duration::from_millis(rng.random_range(10..3_000));
                schedule.push((until, Action::Bounce(h.clone())));
                count(&mut faults, "subscriber-crash");
            }
        }
        // A subscriber stops reading for a while (past the hub's stall timeout or not).
        if rng.random_bool(per_tick(0.06)) {
            let k = rng.random_range(0..subs.len());
            let mut c = lock(&subs[k].1.control);
            if c.stalled_until.is_none() {
                let until = now + Duration::from_millis(rng.random_range(200..5_000));
                c.stalled_until = Some(until);
                schedule.push((until, Action::Unstall(k)));
                count(&mut faults, "subscriber-stall");
            }
        }
    }

    // Heal: every link repaired, every process of the fleet running (the second agent
    // process stopped), subscribers reading; then wait for them to converge.
    let heal_started = sim.elapsed();
    if failure.is_none() {
        for h in &partitioned {
            sim.repair(HUB_HOST, h.as_str());
        }
        for h in &held {
            sim.release(HUB_HOST, h.as_str());
        }
        for (_, s) in &subs {
            lock(&s.control).stalled_until = None;
        }
        if !down.contains(&second) {
            sim.crash(second.as_str());
        }
        for h in down.iter().filter(|h| **h != second) {
            sim.bounce(h.as_str());
        }
        let mut converged = false;
        let mut steps = 0u64;
        while sim.elapsed() < heal_started + opts.heal_time {
            if let Err(e) = sim.step() {
                failure = Some(format!("a host failed: {e}"));
                break;
            }
            steps += 1;
            // A subscriber that gave up (refused) is started again.
            for (h, _) in &subs {
                if !sim.is_host_running(h.as_str()) {
                    sim.bounce(h.as_str());
                }
            }
            if steps % 10 == 0 {
                let finals = clusters.states();
                if subs.iter().all(|(_, s)| lock(&s.model).differences(&finals).is_empty()) {
                    converged = true;
                    break;
                }
            }
        }
        if !converged && failure.is_none() {
            tracing::warn!("subscribers did not converge within the heal time");
        }
    }

    let finals = clusters.states();
    let mut violations = Vec::new();
    if let Some(f) = failure {
        violations.push(f);
    }
    let mut delivered = Vec::new();
    let mut fingerprint = 0u64;
    for (h, s) in &subs {
        let m = lock(&s.model);
        violations.extend(m.violations.iter().map(|v| format!("{h}: {v}")));
        violations.extend(m.differences(&finals).into_iter().map(|d| format!("{h}: silent loss: {d}")));
        delivered.push((h.clone(), m.events, m.resyncs));
        fingerprint = fingerprint.rotate_left(17) ^ m.fingerprint;
    }
    let sim_time = sim.elapsed();
    drop(sim);
    if let Some(dir) = data_dir {
        let _ = std::fs::remove_dir_all(dir);
    }
    Ok(Report {
        seed,
        scenario,
        violations,
        faults,
        writes,
        sim_time,
        wall_time: wall.elapsed(),
        delivered,
        fingerprint,
    })
}

fn count(faults: &mut BTreeMap<&'static str, u64>, kind: &'static str) {
    *faults.entry(kind).or_default() += 1;
}

/// A scratch directory name under the system's temporary directory.
pub(crate) fn scratch(what: &str, seed: u64) -> PathBuf {
    std::env::temp_dir().join(format!("fleetwatch-dst-{what}-{}-{seed}", std::process::id()))
}
