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
use crate::hosts::{AgentControl, AgentHost, Clusters, HubHost, SubscriberControl, SubscriberHost, lock};
use crate::jetstream::SimJetStream;
use crate::net::CutSwitch;
use crate::oracle::SubscriberModel;
use crate::pki::{HUB_HOST, MAX_CLUSTERS, Pki, cluster_id};
use crate::storage;

/// Simulated time per step.
const TICK: Duration = Duration::from_millis(20);

/// Where the hub keeps its bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Storage {
    /// In memory: a hub crash loses the stream.
    Memory,
    /// The segment log in a temporary directory: a crash keeps what was synced.
    Disk,
    /// Chosen per seed (memory or disk).
    Mixed,
    /// The NATS bus: 2 or 3 hub replicas on one in-memory JetStream, with its faults.
    Nats,
}

impl std::str::FromStr for Storage {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "memory" => Ok(Storage::Memory),
            "disk" => Ok(Storage::Disk),
            "mixed" => Ok(Storage::Mixed),
            "nats" => Ok(Storage::Nats),
            other => Err(format!("unknown storage {other:?} (memory, disk, mixed or nats)")),
        }
    }
}

impl std::fmt::Display for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Storage::Memory => "memory",
            Storage::Disk => "disk",
            Storage::Mixed => "mixed",
            Storage::Nats => "nats",
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
    /// Whether the durable subscriber's process crashes too (its knowledge and the hub's
    /// cursor outliving it); the live subscriber crashes either way. On by default since a
    /// memory bus answers a name it does not know as lost (seed 5059 found that a durable
    /// subscriber restarting after an in-memory hub restart got no resync).
    pub durable_crashes: bool,
}

impl Default for Options {
    fn default() -> Self {
        Self {
            storage: Storage::Mixed,
            fault_time: Duration::from_secs(10),
            heal_time: Duration::from_secs(60),
            durable_crashes: true,
        }
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
    /// Reads of many heads at once by the NATS bus (its hellos sharing a sweep of the
    /// stream); 0 on the other buses.
    pub swept: u64,
}

impl Report {
    /// Whether every rule held.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// The command that replays `seed` with `opts`. Built with `--cfg tokio_unstable` (its own
/// target directory, so the workspace's build is untouched) turmoil seeds tokio's `select!`
/// too, and a memory-bus run replays exactly (the same fingerprint); without it the same
/// fault schedule runs with possibly other interleavings.
pub fn replay_command(seed: u64, opts: &Options) -> String {
    format!(
        "RUSTFLAGS='--cfg tokio_unstable' CARGO_TARGET_DIR=target/dst-replay DST_LOG=info cargo run -p fleetwatch-dst -- \
         --seed {seed} --storage {} --fault-secs {}{}",
        opts.storage,
        opts.fault_time.as_secs(),
        if opts.durable_crashes { "" } else { " --no-durable-crashes" }
    )
}

/// One scheduled action of the driver.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Action {
    /// (hub replica, other host).
    Repair(String, String),
    Release(String, String),
    /// The JetStream server comes back; with its store lost or not.
    JetStreamUp(bool),
    /// A hub replica's link to JetStream is restored.
    JetStreamLink(String),
    Bounce(String),
    Crash(String),
    Unstall(usize),
    /// The decommissioned cluster's agent stops (gracefully).
    StopAgent(String),
    /// The segment log's disk has room again.
    DiskFreed,
}

/// How often each thing happens in one run (per simulated second). Drawn per seed, with
/// some kinds switched off entirely ("swarm testing": a run without cuts reaches states a
/// run drowned in cuts never does, e.g. a resync marker staying a cluster's head).
#[derive(Debug, Clone)]
struct Profile {
    writes: f64,
    deletes: f64,
    watch_expiry: f64,
    cut: f64,
    partition: f64,
    hold: f64,
    hub_crash: f64,
    agent_crash: f64,
    second_agent: f64,
    subscriber_crash: f64,
    stall: f64,
    /// When (into the fault phase) a cluster is decommissioned: writes stop, its agent
    /// drains and stops for good.
    decommission_at: Option<Duration>,
    /// After the decommissioned agent drained, the hub crashes within this.
    crash_after_drain: Option<Duration>,
}

impl Profile {
    fn draw(rng: &mut StdRng, fault_time: Duration) -> Self {
        let mut rate = |base: f64| if rng.random_bool(0.25) { 0.0 } else { base * rng.random_range(0.3..3.0) };
        let mut p = Profile {
            writes: 0.0,
            deletes: 0.0,
            watch_expiry: rate(0.2),
            cut: rate(0.4),
            partition: rate(0.15),
            hold: rate(0.1),
            hub_crash: rate(0.15),
            agent_crash: rate(0.3),
            second_agent: rate(0.05),
            subscriber_crash: rate(0.1),
            stall: rate(0.06),
            decommission_at: None,
            crash_after_drain: None,
        };
        // Writes per second, from a quiet cluster to a busy one.
        p.writes = rng.random_range(0.2f64.ln()..20f64.ln()).exp();
        p.deletes = rng.random_range(0.1..0.5);
        if rng.random_bool(0.4) {
            p.decommission_at = Some(fault_time.mul_f64(rng.random_range(0.2..0.7)));
            if rng.random_bool(0.6) {
                p.crash_after_drain = Some(Duration::from_millis(rng.random_range(0..1_000)));
            }
        }
        p
    }

    fn describe(&self) -> String {
        let mut s = format!("writes/s {:.1} (deletes {:.0}%)", self.writes, self.deletes * 100.0);
        for (k, v) in [
            ("watch-expiry", self.watch_expiry),
            ("cut", self.cut),
            ("partition", self.partition),
            ("hold", self.hold),
            ("hub-crash", self.hub_crash),
            ("agent-crash", self.agent_crash),
            ("second-agent", self.second_agent),
            ("subscriber-crash", self.subscriber_crash),
            ("stall", self.stall),
        ] {
            s += &format!(", {k} {v:.2}/s");
        }
        if let Some(t) = self.decommission_at {
            s += &format!(", decommission at {:.1}s", t.as_secs_f64());
            if let Some(c) = self.crash_after_drain {
                s += &format!(" then hub crash {}ms after the drain", c.as_millis());
            }
        }
        s
    }
}

/// Runs seed `seed`. Logs only with `DST_LOG` set (see [`crate::init_logging`]): a
/// program's own log subscriber (the CLI's) is silenced on this thread meanwhile.
pub fn run(seed: u64, opts: &Options) -> anyhow::Result<Report> {
    if std::env::var_os("DST_LOG").is_some() {
        run_seed(seed, opts)
    } else {
        tracing::subscriber::with_default(tracing::subscriber::NoSubscriber::default(), || run_seed(seed, opts))
    }
}

fn run_seed(seed: u64, opts: &Options) -> anyhow::Result<Report> {
    let wall = Instant::now();
    Pki::get()?;
    crate::init_logging();
    // The reconnect backoff's jitter (backon) draws from fastrand's thread-local generator.
    fastrand::seed(seed);
    let mut rng = StdRng::seed_from_u64(seed);
    let n_clusters = rng.random_range(1..=MAX_CLUSTERS.min(3));
    let names_per_cluster = rng.random_range(2..=8);
    let disk = match opts.storage {
        Storage::Memory | Storage::Nats => false,
        Storage::Disk => true,
        Storage::Mixed => rng.random_bool(0.5),
    };
    // Mostly ample retention; sometimes so small that a slow subscriber loses history.
    let retention_records = if rng.random_bool(0.2) { rng.random_range(5..40) } else { 100_000 };
    let data_dir = disk.then(|| storage::temp_dir(seed));
    let profile = Profile::draw(&mut rng, opts.fault_time);
    // The NATS bus's own choices come from a generator of their own, so the other kinds of
    // runs draw what they always drew.
    let mut nrng = StdRng::seed_from_u64(seed ^ 0x6e61_7473_6a65_7473);
    let nats = (opts.storage == Storage::Nats).then(|| NatsProfile::draw(&mut nrng, seed));
    // A hub restarted into a full disk: drawn from a generator of its own too.
    let mut drng = StdRng::seed_from_u64(seed ^ 0x6469_736b_6675_6c6c);
    let disk_full = fleetwatch_bus::DiskFull::default();
    let hubs: Arc<Vec<String>> = Arc::new(match &nats {
        Some(n) => (1..=n.replicas).map(|i| format!("{HUB_HOST}-{i}")).collect(),
        None => vec![HUB_HOST.to_string()],
    });
    let bus = match &nats {
        Some(n) => n.describe(),
        None if disk => "segment log".to_string(),
        None => "memory".to_string(),
    };
    let scenario = format!(
        "{n_clusters} cluster(s), {names_per_cluster} names each, bus {bus}, retention {retention_records} records; {}",
        profile.describe()
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

    let tick = TICK;
    let mut sim = turmoil::Builder::new()
        .rng_seed(seed)
        .tick_duration(tick)
        .simulation_duration(Duration::from_secs(3600))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(20))
        .tcp_capacity(1024)
        .build();

    for h in hubs.iter() {
        let hub = HubHost {
            data_dir: data_dir.clone(),
            disk_full: disk_full.clone(),
            retention_records,
            nats: nats.as_ref().map(|n| (n.js.clone(), h.clone())),
        };
        sim.host(h.as_str(), move || hub.clone().run());
    }

    let mut cuts: BTreeMap<String, CutSwitch> = BTreeMap::new();
    // Agent hosts: (host, cluster index, control).
    let mut agents: Vec<(String, usize, Arc<AgentControl>)> = Vec::new();
    for (i, id) in clusters.ids.iter().enumerate() {
        // The agent of each cluster, and for the first one a second process.
        let copies: &[&str] = if i == 0 { &["", "-b"] } else { &[""] };
        for (k, suffix) in copies.iter().enumerate() {
            let host = format!("agent-{id}{suffix}");
            let cut = CutSwitch::default();
            cuts.insert(host.clone(), cut.clone());
            let control = Arc::new(AgentControl::default());
            let agent = AgentHost {
                cluster: id.clone(),
                model: clusters.models[i].clone(),
                index: (i * 2 + k) as u64,
                cuts: cut,
                control: control.clone(),
                hubs: hubs.clone(),
            };
            sim.host(host.as_str(), move || agent.clone().run());
            agents.push((host, i, control));
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
            hubs: hubs.clone(),
            restart_on_internal: nats.is_some(),
            restarts: Arc::new(AtomicU64::new(0)),
        };
        let runner = s.clone();
        sim.host(host.as_str(), move || runner.clone().run());
        subs.push((host, s));
    }
    // The second agent process only runs when a fault starts it.
    let second = format!("agent-{}-b", clusters.ids[0]);
    sim.crash(second.as_str());
    let mut down: BTreeSet<String> = BTreeSet::from([second.clone()]);

    // The decommissioned cluster (the last one), once decommissioning started.
    let decommission = n_clusters - 1;
    let mut decommissioned = false;
    let mut drain_seen = false;
    let is_retired =
        |decommissioned: bool, h: &str| decommissioned && agents.iter().any(|(a, i, _)| a == h && *i == decommission);

    let mut faults: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut writes = 0u64;
    let mut schedule: Vec<(Duration, Action)> = Vec::new();
    // Links of a hub replica to another host that are partitioned or held.
    let mut partitioned: BTreeSet<(String, String)> = BTreeSet::new();
    let mut held: BTreeSet<(String, String)> = BTreeSet::new();
    // JetStream: down (restarting) and the replicas whose link to it is cut.
    let mut js_down = false;
    let mut js_cut: BTreeSet<String> = BTreeSet::new();
    // One hub replica, drawn only when there are several (other runs draw as they did).
    let pick_hub = |rng: &mut StdRng| -> String {
        if hubs.len() > 1 { hubs[rng.random_range(0..hubs.len())].clone() } else { hubs[0].clone() }
    };
    let per_tick = |per_sec: f64| (per_sec * tick.as_secs_f64()).min(1.0);
    let agent_hosts: Vec<String> = agents.iter().map(|(h, _, _)| h.clone()).collect();
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
                Action::Repair(hub, h) => {
                    sim.repair(hub.as_str(), h.as_str());
                    partitioned.remove(&(hub, h));
                }
                Action::Release(hub, h) => {
                    sim.release(hub.as_str(), h.as_str());
                    held.remove(&(hub, h));
                }
                Action::JetStreamUp(lose) => {
                    if let Some(n) = &nats {
                        if lose {
                            n.js.lose_store();
                            count(&mut faults, "jetstream-store-lost");
                        }
                        n.js.set_down(false);
                        js_down = false;
                    }
                }
                Action::JetStreamLink(hub) => {
                    if let Some(n) = &nats {
                        n.js.set_cut(&hub, false);
                        js_cut.remove(&hub);
                    }
                }
                Action::Bounce(h) => {
                    if hubs.contains(&h)
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
                        // ... and it starts into a full disk that empties a while later:
                        // it must serve unready, refuse with a retryable reason and open
                        // its bus by itself (`fleetwatch_hub::opening`).
                        if !disk_full.is_full() && drng.random_bool(0.25) {
                            disk_full.set(true);
                            let until = now + Duration::from_millis(drng.random_range(100..4_000));
                            schedule.push((until, Action::DiskFreed));
                            count(&mut faults, "hub-started-into-full-disk");
                            tracing::info!(?until, "simulation: the disk is full while the hub starts");
                        }
                    }
                    // A replica restarted into a JetStream outage, or with its own link to
                    // JetStream cut (a frozen or unreachable node), for up to 9 s (past the
                    // 5 s a request waits for the link: the first attempt to open the bus
                    // may fail): it must serve unready
                    // and open its bus by itself (`fleetwatch_hub::opening`). Drawn from
                    // the generator of start faults (memory and segment-log seeds draw what
                    // they drew; a NATS seed's JetStream restarts follow its outages).
                    if hubs.contains(&h)
                        && down.contains(&h)
                        && let Some(n) = &nats
                    {
                        if !js_down && drng.random_bool(0.2) {
                            n.js.set_down(true);
                            js_down = true;
                            let until = now + Duration::from_millis(drng.random_range(200..9_000));
                            schedule.push((until, Action::JetStreamUp(false)));
                            count(&mut faults, "hub-started-into-jetstream-outage");
                            tracing::info!(hub = %h, ?until, "simulation: JetStream down while the hub starts");
                        } else if drng.random_bool(0.2) && js_cut.insert(h.clone()) {
                            n.js.set_cut(&h, true);
                            let until = now + Duration::from_millis(drng.random_range(200..9_000));
                            schedule.push((until, Action::JetStreamLink(h.clone())));
                            count(&mut faults, "hub-started-with-its-jetstream-link-cut");
                            tracing::info!(hub = %h, ?until, "simulation: the hub's link to JetStream cut while it starts");
                        }
                    }
                    if down.remove(&h) {
                        sim.bounce(h.as_str());
                    }
                }
                Action::Crash(h) => {
                    if !down.contains(&h) {
                        sim.crash(h.as_str());
                        down.insert(h);
                    }
                }
                Action::Unstall(k) => lock(&subs[k].1.control).stalled_until = None,
                Action::DiskFreed => disk_full.set(false),
                Action::StopAgent(h) => {
                    if let Some((_, _, control)) = agents.iter().find(|(a, _, _)| *a == h) {
                        lock(&control.stop).cancel();
                    }
                }
            }
        }
        // Decommissioning: writes stop now, the agent (running) stops gracefully later.
        if !decommissioned && profile.decommission_at.is_some_and(|t| now >= t) {
            decommissioned = true;
            count(&mut faults, "decommission");
            for (h, i, _) in &agents {
                if *i != decommission {
                    continue;
                }
                if *h == second {
                    if !down.contains(h) {
                        sim.crash(h.as_str());
                        down.insert(h.clone());
                    }
                    continue;
                }
                if down.remove(h) {
                    sim.bounce(h.as_str());
                }
                schedule.push((now + Duration::from_secs(2), Action::StopAgent(h.clone())));
            }
        }
        if decommissioned
            && !drain_seen
            && let Some((_, _, control)) = agents.iter().find(|(h, i, _)| *i == decommission && *h != second)
            && let Some(drained) = *lock(&control.drained)
        {
            drain_seen = true;
            let hub = pick_hub(&mut nrng);
            if drained
                && let Some(after) = profile.crash_after_drain
                && !down.contains(&hub)
            {
                // Right after the last ack: the records may not have reached the disk.
                sim.crash(hub.as_str());
                down.insert(hub.clone());
                schedule.push((now + after + Duration::from_millis(10), Action::Bounce(hub)));
                count(&mut faults, "hub-crash-after-drain");
            }
        }
        // Writes to the clusters, also while agents are down.
        if rng.random_bool(per_tick(profile.writes)) {
            let c = rng.random_range(0..clusters.models.len());
            if !(decommissioned && c == decommission) {
                let name = format!("o{}", rng.random_range(0..names_per_cluster));
                let mut m = lock(&clusters.models[c]);
                if m.names().contains(&name) && rng.random_bool(profile.deletes) {
                    m.delete(&name);
                } else {
                    m.apply(&name);
                }
                m.trim_history(200);
                writes += 1;
            }
        }
        if rng.random_bool(per_tick(profile.watch_expiry)) {
            let c = rng.random_range(0..clusters.models.len());
            lock(&clusters.models[c]).compact();
            count(&mut faults, "watch-expired");
        }
        // Connection cuts.
        if rng.random_bool(per_tick(profile.cut)) {
            let h = &others[rng.random_range(0..others.len())];
            cuts[h].cut();
            count(&mut faults, "cut");
        }
        // Partitions and held links between the hub and one host.
        if rng.random_bool(per_tick(profile.partition)) {
            let link = (pick_hub(&mut nrng), others[rng.random_range(0..others.len())].clone());
            if !partitioned.contains(&link) && !held.contains(&link) {
                sim.partition(link.0.as_str(), link.1.as_str());
                let until = now + Duration::from_millis(rng.random_range(100..6_000));
                schedule.push((until, Action::Repair(link.0.clone(), link.1.clone())));
                partitioned.insert(link);
                count(&mut faults, "partition");
            }
        }
        if rng.random_bool(per_tick(profile.hold)) {
            let link = (pick_hub(&mut nrng), others[rng.random_range(0..others.len())].clone());
            if !partitioned.contains(&link) && !held.contains(&link) {
                sim.hold(link.0.as_str(), link.1.as_str());
                let until = now + Duration::from_millis(rng.random_range(50..2_000));
                schedule.push((until, Action::Release(link.0.clone(), link.1.clone())));
                held.insert(link);
                count(&mut faults, "hold");
            }
        }
        // A hub (replica) crashes.
        let crashing = rng.random_bool(per_tick(profile.hub_crash));
        let hub = pick_hub(&mut nrng);
        if crashing && !down.contains(&hub) {
            sim.crash(hub.as_str());
            down.insert(hub.clone());
            let until = now + Duration::from_millis(rng.random_range(10..3_000));
            schedule.push((until, Action::Bounce(hub)));
            count(&mut faults, "hub-crash");
        }
        // JetStream restarts (its store lost or kept), or one replica's link to it is cut.
        if let Some(n) = &nats {
            if !js_down && nrng.random_bool(per_tick(n.restart)) {
                n.js.set_down(true);
                js_down = true;
                let until = now + Duration::from_millis(nrng.random_range(50..3_000));
                schedule.push((until, Action::JetStreamUp(nrng.random_bool(n.store_loss))));
                count(&mut faults, "jetstream-restart");
            }
            if nrng.random_bool(per_tick(n.link_cut)) {
                let hub = pick_hub(&mut nrng);
                if js_cut.insert(hub.clone()) {
                    n.js.set_cut(&hub, true);
                    let until = now + Duration::from_millis(nrng.random_range(100..8_000));
                    schedule.push((until, Action::JetStreamLink(hub)));
                    count(&mut faults, "jetstream-link-cut");
                }
            }
        }
        // An agent crashes (its cluster keeps changing meanwhile).
        if rng.random_bool(per_tick(profile.agent_crash)) {
            let h = agent_hosts[rng.random_range(0..agent_hosts.len())].clone();
            if h != second && !down.contains(&h) && !is_retired(decommissioned, &h) {
                sim.crash(h.as_str());
                down.insert(h.clone());
                let until = now + Duration::from_millis(rng.random_range(100..8_000));
                schedule.push((until, Action::Bounce(h)));
                count(&mut faults, "agent-crash");
            }
        }
        // A second agent process of the first cluster runs for a while.
        if rng.random_bool(per_tick(profile.second_agent))
            && down.contains(&second)
            && !is_retired(decommissioned, &second)
        {
            sim.bounce(second.as_str());
            down.remove(&second);
            let until = now + Duration::from_millis(rng.random_range(500..8_000));
            schedule.push((until, Action::Crash(second.clone())));
            count(&mut faults, "second-agent");
        }
        // A subscriber crashes and comes back from `earliest` or `latest`.
        if rng.random_bool(per_tick(profile.subscriber_crash)) {
            let k = rng.random_range(0..subs.len());
            let (h, s) = &subs[k];
            if !down.contains(h) && (opts.durable_crashes || !s.durable) {
                sim.crash(h.as_str());
                down.insert(h.clone());
                lock(&s.control).from = if rng.random_bool(0.5) { StartFrom::Earliest } else { StartFrom::Latest };
                let until = now + Duration::from_millis(rng.random_range(10..3_000));
                schedule.push((until, Action::Bounce(h.clone())));
                count(&mut faults, "subscriber-crash");
            }
        }
        // A subscriber stops reading for a while (past the hub's stall timeout or not).
        if rng.random_bool(per_tick(profile.stall)) {
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
    // process stopped, a decommissioned cluster's agent gone for good once it drained),
    // subscribers reading; then wait for them to converge.
    let heal_started = sim.elapsed();
    if failure.is_none() {
        for (hub, h) in &partitioned {
            sim.repair(hub.as_str(), h.as_str());
        }
        for (hub, h) in &held {
            sim.release(hub.as_str(), h.as_str());
        }
        if let Some(n) = &nats {
            for (_, action) in &schedule {
                if let Action::JetStreamUp(true) = action {
                    n.js.lose_store();
                    count(&mut faults, "jetstream-store-lost");
                }
            }
            n.js.set_down(false);
            for hub in &js_cut {
                n.js.set_cut(hub, false);
            }
        }
        for (_, s) in &subs {
            lock(&s.control).stalled_until = None;
        }
        disk_full.set(false);
        if !down.contains(&second) {
            sim.crash(second.as_str());
        }
        // A decommissioned agent that has not stopped yet stops now.
        for (_, action) in &schedule {
            if let Action::StopAgent(h) = action
                && let Some((_, _, control)) = agents.iter().find(|(a, _, _)| a == h)
            {
                lock(&control.stop).cancel();
            }
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
            // A subscriber that gave up (refused) is started again; so is an agent whose
            // stop did not get everything acked (its cluster is not done).
            for (h, _) in &subs {
                if !sim.is_host_running(h.as_str()) {
                    sim.bounce(h.as_str());
                }
            }
            for (h, _, control) in &agents {
                if *h != second && !sim.is_host_running(h.as_str()) && *lock(&control.drained) != Some(true) {
                    sim.bounce(h.as_str());
                }
            }
            if steps.is_multiple_of(10) {
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
    for (_, s) in &subs {
        let n = s.restarts.load(std::sync::atomic::Ordering::Relaxed);
        if n > 0 {
            *faults.entry("subscriber-refused-internal").or_default() += n;
        }
    }
    let mut swept = 0;
    if let Some(n) = &nats {
        for (kind, c) in n.js.counts() {
            *faults.entry(kind).or_default() += c;
        }
        swept = n.js.swept();
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
        swept,
    })
}

/// A NATS run's choices: replicas, and how often JetStream fails.
struct NatsProfile {
    js: SimJetStream,
    replicas: usize,
    ack_loss: f64,
    /// JetStream restarts per second, and the chance it comes back empty.
    restart: f64,
    store_loss: f64,
    /// Cuts of one replica's link to JetStream per second.
    link_cut: f64,
}

impl NatsProfile {
    fn draw(rng: &mut StdRng, seed: u64) -> Self {
        let mut rate = |base: f64| if rng.random_bool(0.3) { 0.0 } else { base * rng.random_range(0.3..3.0) };
        let (restart, link_cut, ack_loss) = (rate(0.08), rate(0.15), rate(0.01));
        let store_loss = rng.random_range(0.3..1.0);
        let replicas = rng.random_range(2..=3);
        Self { js: SimJetStream::new(seed ^ 0x6a73, ack_loss), replicas, ack_loss, restart, store_loss, link_cut }
    }

    fn describe(&self) -> String {
        format!(
            "nats ({} replicas; jetstream restart {:.2}/s, {:.0}% of them empty, link-cut {:.2}/s, ack loss {:.1}%)",
            self.replicas,
            self.restart,
            self.store_loss * 100.0,
            self.link_cut,
            self.ack_loss * 100.0
        )
    }
}

fn count(faults: &mut BTreeMap<&'static str, u64>, kind: &'static str) {
    *faults.entry(kind).or_default() += 1;
}

/// A scratch directory name under the system's temporary directory.
pub(crate) fn scratch(what: &str, seed: u64) -> PathBuf {
    std::env::temp_dir().join(format!("fleetwatch-dst-{what}-{}-{seed}", std::process::id()))
}
