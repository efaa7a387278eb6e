//! The software each simulated host runs: the real hub, the real agent runtime with a
//! [`SimSource`], and the real subscriber client feeding a [`SubscriberModel`].
//!
//! turmoil calls a host's software again on every restart (`bounce`): whatever a process
//! would lose on a crash is made fresh there; whatever outlives it (the clusters, a durable
//! subscriber's store, the hub's data directory) is shared state passed in.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_agent::{AgentConfig, AgentRuntime};
use fleetwatch_bus::nats::DEFAULT_MISSING_STREAM_WAIT;
use fleetwatch_bus::nats::jetstream::JetStream;
use fleetwatch_bus::{Bus, NatsBus, NatsOptions};
use fleetwatch_client::backoff::Reconnect;
use fleetwatch_client::subscriber::{Delivery, SubscribeError, SubscriberOptions, Subscription};
use fleetwatch_client::transport::{Dialer, HubUrls};
use fleetwatch_hub::{Hub, HubConfig, Listener};
use fleetwatch_protocol::message::{ErrorCode, StartFrom};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterModel;
use crate::jetstream::SimJetStream;
use crate::net::{CutSwitch, SimDial, SimListener};
use crate::oracle::{States, SubscriberModel};
use crate::pki::{HUB_HOST, Pki};
use crate::source::SimSource;

/// The hub's port in the simulated network.
pub const HUB_PORT: u16 = 7443;
/// The NATS bus's stream.
pub const NATS_STREAM: &str = "fw";
/// The durable subscription's name.
pub const DURABLE_NAME: &str = "d";
/// Idle timeout of every connection (simulated; short so a dead one is noticed soon).
pub const IDLE: Duration = Duration::from_secs(3);
/// The hub's subscriber stall timeout.
pub const STALL: Duration = Duration::from_secs(2);

/// The simulated clusters, shared by the driver (which writes), the agents' sources and
/// the subscribers (which re-list on a resync).
#[derive(Debug, Default)]
pub struct Clusters {
    /// Ids, `c1` ….
    pub ids: Vec<String>,
    /// Their models, in the order of `ids`.
    pub models: Vec<Arc<Mutex<ClusterModel>>>,
}

impl Clusters {
    /// Every cluster's objects and values now.
    pub fn states(&self) -> States {
        self.ids.iter().zip(&self.models).map(|(id, m)| (id.clone(), lock(m).state())).collect()
    }
}

/// Locks, ignoring poisoning (a panic elsewhere fails the run anyway).
pub fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

fn hub_urls() -> HubUrls {
    format!("wss://{HUB_HOST}:{HUB_PORT}").parse().expect("a valid hub address")
}

fn sim_now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

/// A hub: memory bus, the segment log in `data_dir`, or one replica of several on the
/// NATS bus over the simulation's in-memory JetStream.
#[derive(Clone)]
pub struct HubHost {
    /// The segment log's directory; `None`: the memory bus.
    pub data_dir: Option<PathBuf>,
    /// Fills the segment log's disk while on (the driver turns it on and off).
    pub disk_full: fleetwatch_bus::DiskFull,
    /// Records the bus retains.
    pub retention_records: usize,
    /// The NATS bus on this JetStream, as this replica (its host name).
    pub nats: Option<(SimJetStream, String)>,
}

impl HubHost {
    /// Runs the hub until the host crashes. A hub that stops because its bus can never
    /// work again in its process is started again, as its supervisor would.
    pub async fn run(self) -> turmoil::Result {
        // The fleet's first deployment: the hub processes started with the simulation, not
        // one started again after a crash (a crash comes a tick later at the earliest).
        let mut first_deployment = sim_now().is_zero();
        loop {
            let first = std::mem::take(&mut first_deployment);
            match self.run_once(first).await {
                Err(HubRun::BusUnusable(cause)) => {
                    tracing::warn!(%cause, "the hub stopped: started again, as its supervisor would");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
                Err(HubRun::Other(e)) => return Err(e),
                Ok(()) => return Ok(()),
            }
        }
    }

    async fn run_once(&self, first_deployment: bool) -> Result<(), HubRun> {
        let pki = Pki::get().map_err(|e| other(e.to_string()))?;
        let mut config = HubConfig::new(([0, 0, 0, 0], HUB_PORT).into(), pki.files("hub"));
        config.data_dir = self.data_dir.clone();
        config.retention.records = self.retention_records;
        config.segment_bytes = 16 << 10;
        // The writer on the simulation's runtime: its commits are ordered by the seed.
        config.bus_writer = fleetwatch_bus::WriterPlacement::Runtime;
        config.idle_timeout = IDLE;
        config.handshake_timeout = IDLE;
        config.subscriber_stall_timeout = STALL;
        config.tls_reload_interval = Duration::from_secs(3600);
        // The hub opens its bus itself, again and again while it cannot (JetStream away,
        // its store lost, this replica's link cut): the real code's `opening`, serving
        // unready meanwhile, as every production hub does.
        let segment_log = self.data_dir.clone().map(|dir| {
            fleetwatch_hub::opening::embedded(fleetwatch_bus::BusOptions {
                dir: Some(dir),
                retention: config.retention,
                segment_bytes: config.segment_bytes,
                writer: config.bus_writer,
                disk_full: self.disk_full.clone(),
                ..fleetwatch_bus::BusOptions::default()
            })
        });
        let open: Option<fleetwatch_hub::opening::OpenBus> = segment_log.or_else(|| {
            self.nats.as_ref().map(|(js, replica)| {
                let mut opts = NatsOptions::new(vec![js.link(replica).servers().to_string()], config.retention);
                opts.stream = NATS_STREAM.into();
                let (js, replica) = (js.clone(), replica.clone());
                let open: fleetwatch_hub::opening::OpenBus = Arc::new(move || {
                    let mut opts = opts.clone();
                    // The replicas of the fleet's first deployment create the bus together (an
                    // identical stream is created once) without waiting: no bus exists yet. Any
                    // other start waits for a running replica to recreate a stream JetStream
                    // lost, as every production hub does (the wait is not a setting). Decided
                    // per attempt and only for a process started with the simulation: a replica
                    // restarted after a crash within the first second kept the zero wait
                    // through its failing attempts, created a new bus at once when JetStream
                    // came back having lost its store (seed 15240), and its cursor store said no
                    // durable names were lost, which no hub of a real fleet would do then.
                    opts.missing_stream_wait = if first_deployment && sim_now() < Duration::from_secs(1) {
                        Duration::ZERO
                    } else {
                        DEFAULT_MISSING_STREAM_WAIT
                    };
                    let link = js.link(&replica);
                    Box::pin(async move {
                        let bus: Arc<dyn Bus> = NatsBus::open_on(link, opts).await?;
                        Ok(bus)
                    })
                });
                open
            })
        });
        let listener = SimListener::bind(HUB_PORT).await.map_err(other)?;
        let hub = Hub::bind_with(config, Some(Listener::Other(Box::new(listener))), open).await.map_err(other)?;
        match hub.run(CancellationToken::new()).await {
            Err(fleetwatch_hub::HubError::BusUnusable(cause)) => Err(HubRun::BusUnusable(cause)),
            r => r.map_err(other),
        }
    }
}

/// How one run of a hub process ended badly.
enum HubRun {
    /// Its bus can never work again in the process: started again.
    BusUnusable(String),
    /// Anything else fails the simulation.
    Other(Box<dyn std::error::Error>),
}

fn other(e: impl Into<Box<dyn std::error::Error>>) -> HubRun {
    HubRun::Other(e.into())
}

/// What the driver tells an agent host: stop gracefully (the cluster is decommissioned),
/// and whether that stop had every event acked.
#[derive(Debug, Default)]
pub struct AgentControl {
    /// Cancelled to stop the running process gracefully (it drains its outbox first).
    pub stop: Mutex<CancellationToken>,
    /// After a graceful stop: whether the hub had acked every event.
    pub drained: Mutex<Option<bool>>,
}

/// One agent process of one cluster.
#[derive(Debug, Clone)]
pub struct AgentHost {
    /// The cluster id.
    pub cluster: String,
    /// Its model.
    pub model: Arc<Mutex<ClusterModel>>,
    /// Distinguishes the epochs of processes started in the same instant.
    pub index: u64,
    /// Cuts this host's connections.
    pub cuts: CutSwitch,
    /// The driver's instructions.
    pub control: Arc<AgentControl>,
    /// The hub replicas it reaches, in turn.
    pub hubs: Arc<Vec<String>>,
}

impl AgentHost {
    /// Runs a fresh agent process (empty outbox, new epoch) until the host crashes.
    pub async fn run(self) -> turmoil::Result {
        let pki = Pki::get()?;
        let mut config = AgentConfig::new(hub_urls(), pki.agent(&self.cluster));
        let dial = SimDial::new(self.cuts.clone()).balanced(self.hubs.clone(), self.index as usize);
        config.dialer = Dialer::custom(Arc::new(dial));
        // A new epoch per start, from the simulated clock: a run replays.
        config.epoch = Some(1_000_000_000 + sim_now().as_micros() as u64 * 16 + self.index);
        config.idle_timeout = IDLE;
        config.connect_timeout = IDLE;
        config.drain_timeout = Duration::from_secs(1);
        config.refused_retry = Duration::from_secs(2);
        config.reconnect = Reconnect { min: Duration::from_millis(50), max: Duration::from_secs(1) };
        config.tls_reload_interval = Duration::from_secs(3600);
        // No inotify thread: what happens is the seed's alone.
        config.tls_watch = false;
        config.batch_size = 20;
        let agent =
            AgentRuntime::new(config)?.start(SimSource { cluster: self.model.clone() }, CancellationToken::new());
        agent.wait().await?;
        Ok(())
    }
}

/// What the driver tells a subscriber host about its next start and its behaviour.
#[derive(Debug)]
pub struct SubscriberControl {
    /// Where the next process starts without a cursor.
    pub from: StartFrom,
    /// Until when (simulated time) the subscriber stops reading.
    pub stalled_until: Option<Duration>,
}

/// A subscriber process: durable (its knowledge and the hub's cursor outlive it) or live
/// (a new process re-lists the clusters, then reads from `latest` or replays the retained
/// history from `earliest` on top).
#[derive(Debug, Clone)]
pub struct SubscriberHost {
    /// Certificate name (`durable`, `live`).
    pub name: &'static str,
    /// Whether it subscribes under [`DURABLE_NAME`].
    pub durable: bool,
    /// What it knows.
    pub model: Arc<Mutex<SubscriberModel>>,
    /// The driver's instructions.
    pub control: Arc<Mutex<SubscriberControl>>,
    /// The clusters (to re-list on a resync).
    pub clusters: Arc<Clusters>,
    /// Cuts this host's connections.
    pub cuts: CutSwitch,
    /// Seeds this host's own choices (how slow it is).
    pub seed: u64,
    /// Starts so far.
    pub starts: Arc<AtomicU64>,
    /// The hub replicas it reaches, in turn.
    pub hubs: Arc<Vec<String>>,
    /// Whether a subscription the hub refused as `internal` (its bus failing for a while,
    /// as a NATS bus does while JetStream is away) ends the process, which its supervisor
    /// starts again, instead of counting as a violation.
    pub restart_on_internal: bool,
    /// Processes that exited so.
    pub restarts: Arc<AtomicU64>,
}

impl SubscriberHost {
    /// Runs a fresh subscriber process until the host crashes; one that exits after an
    /// `internal` refusal (see [`SubscriberHost::restart_on_internal`]) is started again
    /// a second later.
    pub async fn run(self) -> turmoil::Result {
        while self.run_process().await? {
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        Ok(())
    }

    /// One process; answers whether it exited to be started again.
    async fn run_process(&self) -> turmoil::Result<bool> {
        let start = self.starts.fetch_add(1, Ordering::Relaxed);
        let mut rng = StdRng::seed_from_u64(self.seed ^ (start << 32) ^ u64::from(self.durable));
        let from = lock(&self.control).from;
        {
            let mut m = lock(&self.model);
            m.restarted();
            if !self.durable {
                m.forget();
            }
        }
        let pki = Pki::get()?;
        let tls = Arc::new(fleetwatch_certs::client_config(&pki.subscriber(self.name))?);
        let mut opts = SubscriberOptions::new(hub_urls(), tls);
        opts.durable = self.durable.then(|| DURABLE_NAME.to_string());
        opts.from = from;
        let dial =
            SimDial::new(self.cuts.clone()).balanced(self.hubs.clone(), start as usize + usize::from(self.durable));
        opts.dialer = Dialer::custom(Arc::new(dial));
        opts.connect_timeout = IDLE;
        opts.idle_timeout = IDLE + Duration::from_secs(1);
        opts.max_in_flight = rng.random_range(1..=64);
        let mut sub = loop {
            match Subscription::connect(opts.clone()).await {
                Ok(s) => break s,
                Err(e) => {
                    tracing::debug!(error = %e, "subscriber cannot connect yet");
                    tokio::time::sleep(Duration::from_millis(200)).await;
                }
            }
        };
        let listed = lock(&self.model).relists > 0;
        if !self.durable || !listed {
            // A process without state reads the clusters first, from `latest` or from
            // `earliest` alike: the retained history is bounded (and a restarted hub
            // without a data directory has none), so replaying it cannot rebuild objects
            // whose last change was evicted. So does a durable subscriber until one of its
            // processes has listed (its state outlives the process, so it knows): its name
            // may have no cursor yet, and it starts where a live one does (seed 100702
            // counted objects written before the first subscription as lost, and seed
            // 300804 those of a first process that crashed before its subscription
            // returned).
            let states = self.clusters.states();
            lock(&self.model).relist(&states);
        }
        loop {
            let stalled = lock(&self.control).stalled_until;
            if let Some(until) = stalled {
                let now = sim_now();
                if until > now {
                    tokio::time::sleep(until - now).await;
                }
            }
            let delivery = match sub.next().await {
                Ok(d) => d,
                Err(SubscribeError::Refused { code: ErrorCode::Internal, message }) if self.restart_on_internal => {
                    tracing::info!(sub = self.name, %message, "the hub failed the subscription; the process exits");
                    self.restarts.fetch_add(1, Ordering::Relaxed);
                    return Ok(true);
                }
                Err(e) => {
                    lock(&self.model).violations.push(format!("subscription {} failed: {e}", self.name));
                    return Ok(false);
                }
            };
            let stream = sub.stream().unwrap_or_default().to_string();
            match &delivery {
                Delivery::Events(events) => {
                    for ev in events {
                        tracing::debug!(sub = self.name, cursor = ?ev.cursor, cluster = %ev.cluster, id = %ev.id, data = %ev.data, "delivered");
                    }
                    lock(&self.model).deliver_events(&stream, events)
                }
                Delivery::ResyncRequired(r) => {
                    tracing::debug!(sub = self.name, cursor = r.cursor, cluster = %r.cluster, reason = %r.reason, "resync delivered");
                    let states = self.clusters.states();
                    lock(&self.model).deliver_resync(&stream, &r.cluster, r.cursor, &states);
                }
            }
            // Sometimes slow to handle what it got.
            if rng.random_bool(0.05) {
                tokio::time::sleep(Duration::from_millis(rng.random_range(1..400))).await;
            }
            if let Some(cursor) = delivery.last_cursor() {
                let _ = sub.ack(cursor).await;
                lock(&self.model).acknowledged(&stream, cursor);
            }
        }
    }
}
