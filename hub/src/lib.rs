//! The fleetwatch hub: authenticates agents and subscribers by their certificates, takes
//! events from agents into the bus (acking only what the bus accepted), and fans them out
//! to subscribers.
//!
//! One module per arrow of the data path, so each rule has one home:
//! `server` (accept, TLS, identity, admission budgets) → `agent_session` (a connection:
//! carries decisions out) → `ingest` (pure: what to do with each frame) → the bus
//! (crate `fleetwatch_bus`: the log behind the [`Bus`] trait, in memory, as a segment log
//! on disk, or on NATS JetStream shared by several hub replicas) → `subscriber_session`
//! (fan-out from a cursor; frames built once by the protocol's `EventsFrame`). Around
//! them: [`registry`] (the one registry of connections and clusters), `conn` (reading,
//! closing and how a session ends, shared by both kinds of session), [`admin`],
//! [`metrics`] (with `scrape`, the state read at scrape time), [`revocation`],
//! [`watch_source`]. Shared state is split by who needs it:
//! `Sessions` for sessions, `Context` for the hub around them.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fleetwatch_hub::HubError> {
//! use fleetwatch_hub::{Hub, HubConfig};
//! use fleetwatch_certs::TlsFiles;
//! let tls = TlsFiles { cert: "hub.crt".into(), key: "hub.key".into(), ca: vec!["ca.crt".into()] };
//! let hub = Hub::bind(HubConfig::new("127.0.0.1:7443".parse().unwrap(), tls)).await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! hub.run(shutdown).await
//! # }
//! ```
#![warn(missing_docs)]

pub mod access;
mod access_objects;
pub mod admin;
mod admission;
mod agent_session;
mod conn;
mod delivery;
pub mod fanout;
pub mod fleet;
mod in_flight;
mod ingest;
pub mod metrics;
pub mod opening;
mod preflight;
mod rate;
pub mod registry;
pub mod revocation;
mod scrape;
mod server;
mod subscriber_session;
mod subscriber_slots;
mod tls_hint;
pub mod watch_source;
mod watch_status;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_bus::{Bus, BusOptions, Flush};
use fleetwatch_certs::{CertError, ReloadingServerConfig, TlsFiles};
use fleetwatch_protocol::Limits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use metrics::Metrics;
pub use registry::{ClusterStatus, SessionRegistry};

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where agents and subscribers connect (wss).
    pub listen: SocketAddr,
    /// Admin endpoint (health, metrics, the admin API, the web view); plain HTTP unless
    /// `admin_auth.client_ca` is set.
    pub admin_listen: Option<SocketAddr>,
    /// Who may use the admin endpoint (required beyond loopback, see [`admin::auth`]).
    pub admin_auth: admin::auth::AdminAuthConfig,
    /// Server certificate, key and the client CA bundles.
    pub tls: TlsFiles,
    /// Bus storage: `None` keeps events in memory only.
    pub data_dir: Option<PathBuf>,
    /// Run the bus on NATS JetStream instead (shared by hub replicas); `data_dir` is then
    /// unused and the retention becomes the stream's limits.
    pub nats: Option<fleetwatch_bus::NatsOptions>,
    /// What the bus retains (records, bytes, age); see [`fleetwatch_bus::Retention`] for the
    /// defaults in memory and on disk.
    pub retention: fleetwatch_bus::Retention,
    /// Enables `POST /debug/faults/storage?fail_for_ms=N` on the admin endpoint, which
    /// makes bus disk writes fail with ENOSPC for N ms (tests and the chaos soak).
    pub fault_injection: bool,
    /// Bytes per bus segment file before a new one starts (smaller in tests and the soak,
    /// so closed segments exist to damage).
    pub segment_bytes: u64,
    /// Where the segment log's writer runs: its own thread, except under the deterministic
    /// simulation (see [`fleetwatch_bus::WriterPlacement`]).
    pub bus_writer: fleetwatch_bus::WriterPlacement,
    /// Message limits.
    pub limits: Limits,
    /// Events per second accepted from one agent; beyond it acks are delayed.
    pub max_events_per_sec: u32,
    /// Time allowed for the TLS and WebSocket handshakes plus the first message.
    pub handshake_timeout: Duration,
    /// A session silent for this long is closed (the hub pings at a third of it).
    pub idle_timeout: Duration,
    /// Most sessions (connections that completed the TLS and WebSocket handshakes).
    /// Lowered at start when the open-file limit does not allow it.
    pub max_connections: usize,
    /// Most connections still in the TLS or WebSocket handshake, from all addresses.
    pub max_handshakes: usize,
    /// Most connections still in the handshake from one source address.
    pub max_handshakes_per_ip: usize,
    /// Whether `max_connections` / `max_handshakes` were asked for (flags, environment):
    /// lowering them to fit the open-file limit is then a WARN; lowering the defaults is
    /// expected on small machines and only an INFO (it was start-up noise in every sandbox).
    pub connection_budgets_given: bool,
    /// A subscriber whose send does not complete, or whose unacked window stays full with
    /// no ack, for this long is disconnected (its durable cursor is kept).
    pub subscriber_stall_timeout: Duration,
    /// How often certificate and CA files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Where WatchConfigs come from.
    pub watch_source: watch_source::WatchSource,
    /// Deny list of certificate serials and identities (reloaded with the certificates).
    pub deny_list: Option<PathBuf>,
    /// Subscriber access policy (see [`access`]); `None`: every subscriber reads every
    /// cluster. Reloaded with the certificates.
    pub access_policy: Option<PathBuf>,
    /// Whether accepted SubscriberAccessPolicy objects of the control plane grant too
    /// (needs `watch_source` to be the control plane).
    pub access_policy_from_control_plane: bool,
    /// Most live sessions of one subscriber identity.
    pub max_sessions_per_subscriber: usize,
    /// How long to keep trying a listen address that is in use (`None`: refuse at once).
    /// For a hub restarted on its port while the previous process is still exiting.
    pub bind_retry: Option<Duration>,
}

impl HubConfig {
    /// Settings with defaults.
    pub fn new(listen: SocketAddr, tls: TlsFiles) -> Self {
        Self {
            listen,
            admin_listen: None,
            admin_auth: admin::auth::AdminAuthConfig::default(),
            tls,
            data_dir: None,
            nats: None,
            retention: fleetwatch_bus::Retention::default(),
            fault_injection: false,
            segment_bytes: BusOptions::default().segment_bytes,
            bus_writer: fleetwatch_bus::WriterPlacement::Thread,
            limits: Limits::default(),
            max_events_per_sec: 20_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: 50_000,
            max_handshakes: 1024,
            max_handshakes_per_ip: 64,
            connection_budgets_given: false,
            subscriber_stall_timeout: Duration::from_secs(30),
            tls_reload_interval: Duration::from_secs(5),
            watch_source: watch_source::WatchSource::None,
            deny_list: None,
            access_policy: None,
            access_policy_from_control_plane: false,
            max_sessions_per_subscriber: 8,
            bind_retry: None,
        }
    }
}

/// Why the hub could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Certificates or keys are unusable.
    #[error(transparent)]
    Tls(#[from] CertError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
        /// What to do about it (empty, or starting with `; `).
        hint: String,
    },
    /// A start-up check refused the configuration: it cannot work (see `preflight`).
    #[error("{0}")]
    Refused(String),
    /// The bus could not open its storage.
    #[error(transparent)]
    Bus(#[from] fleetwatch_bus::BusError),
    /// The bus can never work again in this process (see `Bus::fatal`): the hub stopped,
    /// for its supervisor to start it again.
    #[error("the bus cannot work again in this process: {0}")]
    BusUnusable(String),
    /// The deny list cannot be read.
    #[error(transparent)]
    DenyList(#[from] revocation::DenyListError),
    /// The access policy cannot be read or is invalid.
    #[error(transparent)]
    AccessPolicy(#[from] access::AccessPolicyError),
    /// The watch configuration cannot be loaded.
    #[error("watch configuration: {0}")]
    WatchConfig(String),
    /// The admin endpoint cannot be protected as configured.
    #[error(transparent)]
    AdminAuth(#[from] admin::auth::AdminAuthError),
}

/// What agent and subscriber sessions need, and nothing else: their settings, the bus,
/// the registry, the metrics, the watch configuration pushed to agents, the deny list.
pub(crate) struct Sessions {
    pub settings: SessionSettings,
    pub bus: Arc<dyn Bus>,
    pub registry: SessionRegistry,
    pub metrics: Metrics,
    /// Where each subscriber session is: fan-out progress, which ingest waits on.
    pub fanout: fanout::FanOut,
    /// The watch configuration pushed to agents.
    pub watches: tokio::sync::watch::Sender<Arc<Vec<fleetwatch_protocol::message::WatchSpec>>>,
    /// The deny list in force.
    pub revocation: revocation::Revocation,
    /// The subscriber access policy in force.
    pub access: access::AccessControl,
    /// Live subscriber sessions per identity (`--max-sessions-per-subscriber`).
    pub subscriber_slots: subscriber_slots::SubscriberSlots,
    /// The Runtimes read from the control plane (the access policy's `clusterSelector`
    /// looks up their labels); the same view as [`Context::runtimes`].
    pub runtimes: fleet::SharedRuntimes,
}

/// The limits and timeouts sessions apply (from [`HubConfig`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionSettings {
    pub limits: Limits,
    pub handshake_timeout: Duration,
    pub idle_timeout: Duration,
    pub max_events_per_sec: u32,
    pub subscriber_stall_timeout: Duration,
    pub max_sessions_per_subscriber: usize,
}

impl SessionSettings {
    fn from_config(c: &HubConfig) -> Self {
        Self {
            limits: c.limits,
            handshake_timeout: c.handshake_timeout,
            idle_timeout: c.idle_timeout,
            max_events_per_sec: c.max_events_per_sec,
            subscriber_stall_timeout: c.subscriber_stall_timeout,
            max_sessions_per_subscriber: c.max_sessions_per_subscriber.max(1),
        }
    }
}

/// What the hub itself needs around the sessions: accepting connections (TLS, admission
/// budgets, trust domain), the admin endpoint (readiness) and housekeeping (reloads).
pub(crate) struct Context {
    pub config: HubConfig,
    pub sessions: Arc<Sessions>,
    pub tls: ReloadingServerConfig,
    /// The trust domain of the hub's own certificate; clients must share it.
    pub trust_domain: String,
    /// Handshake and session budgets, refusal counts.
    pub admission: admission::ConnectionBudget,
    /// Whether the control-plane WatchConfig watch has listed everything (always true for
    /// other sources).
    pub watch_synced: Arc<watch_source::WatchSync>,
    /// This replica's name among hubs sharing a bus: its wss address.
    pub replica: String,
    /// The admin endpoint's bearer token, when one is configured.
    pub admin_token: Option<admin::auth::Token>,
    /// The admin endpoint's TLS (client certificates required), when configured.
    pub admin_tls: Option<Arc<rustls::ServerConfig>>,
    /// Runtime statuses from the control plane (modules by state), when the hub reads it.
    pub runtimes: fleet::SharedRuntimes,
    /// Bumped whenever [`Self::runtimes`] changes (the live overview is rebuilt at once).
    pub runtimes_changed: tokio::sync::watch::Sender<u64>,
    /// What the hub made of each WatchConfig (accepted or why not).
    pub watch_verdicts: watch_source::Verdicts,
    /// The fleet's state across replicas on a shared bus (empty otherwise).
    pub fleet: fleet::state::FleetState,
    /// The bus as opened (`sessions.bus` is the same object): empty until it could be.
    pub storage: Arc<fleetwatch_bus::DeferredBus>,
}

/// Who is on the other end of a connection, from its certificate.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The SPIFFE id.
    pub identity: String,
    /// The certificate serial, lower-case hex.
    pub serial: String,
    /// When the certificate expires: the session ends then.
    pub not_after: jiff::Timestamp,
    /// The presented chain, re-verified when the CA bundles change.
    pub chain: Arc<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// Why the hub ended the session (set before its token is cancelled).
    pub ended: Arc<std::sync::OnceLock<String>>,
}

impl Peer {
    /// The peer as its verified certificate says.
    pub(crate) fn new(cert: fleetwatch_certs::PeerCert) -> Self {
        Self {
            identity: cert.identity.to_string(),
            serial: cert.serial,
            not_after: cert.not_after,
            chain: Arc::new(cert.chain),
            ended: Arc::default(),
        }
    }
}

impl Sessions {
    /// Whether the peer's certificate is denied now.
    pub(crate) fn revoked(&self, peer: &Peer) -> bool {
        self.revocation.current().denies(&peer.identity, &peer.serial)
    }

    /// Why the hub ends this peer's session, if it does: revoked, expired, CA gone.
    pub(crate) fn end_reason(&self, peer: &Peer) -> Option<String> {
        peer.ended.get().cloned().or_else(|| self.revoked(peer).then(|| "certificate revoked".to_string()))
    }
}

impl Context {
    /// Closes every open connection whose certificate the deny list now denies, that has
    /// expired, or (when `recheck_chains`, after the CA bundles changed) no longer verifies.
    fn close_revoked(&self, recheck_chains: bool) {
        let list = self.sessions.revocation.current();
        let now = jiff::Timestamp::now();
        // Copied out: chain verification is too slow to run under the lock new
        // connections take.
        let peers = self.sessions.registry.open_connections();
        for (peer, token) in peers {
            let (label, why) = if list.denies(&peer.identity, &peer.serial) {
                ("revoked", "certificate revoked".to_string())
            } else if peer.not_after <= now {
                ("expired", format!("certificate expired at {}", peer.not_after))
            } else if recheck_chains && let Err(why) = self.tls.verify_peer(&peer.chain) {
                ("untrusted", why)
            } else {
                continue;
            };
            tracing::warn!(identity = %peer.identity, serial = %peer.serial, reason = %why, "closing session");
            self.sessions.metrics.sessions_expired.get_or_create(&metrics::ReasonLabel { reason: label.into() }).inc();
            let _ = peer.ended.set(why);
            token.cancel();
        }
    }

    /// Closes the session of every subscriber the access policy no longer names (one whose
    /// filter now reaches outside its grant is ended by its session at its next read).
    fn close_ungranted(&self) {
        for (peer, token) in self.sessions.registry.open_connections() {
            let Ok(identity) = peer.identity.parse::<fleetwatch_protocol::Identity>() else { continue };
            let fleetwatch_protocol::identity::Role::Subscriber(name) = &identity.role else { continue };
            if let access::Decision::Refused(why) = self.sessions.access.decide(name) {
                tracing::warn!(identity = %peer.identity, reason = %why, "closing session");
                let _ = peer.ended.set(why);
                token.cancel();
            }
        }
    }

    /// Named readiness checks beyond the bus: certificates in force and loadable, deny list
    /// readable, control-plane watch synced (when configured). `Err` says what is wrong.
    pub(crate) fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let not_after = self.tls.not_after();
        let certificates = if not_after <= jiff::Timestamp::now() {
            Err(format!("hub certificate {} expired at {not_after}", self.config.tls.cert.display()))
        } else if let Some(e) = self.tls.load_error() {
            Err(format!("changed certificate files cannot be loaded (the previous ones are in force): {e}"))
        } else {
            Ok(())
        };
        let mut checks = vec![("certificates", certificates)];
        if self.config.deny_list.is_some() {
            let stale = self.sessions.revocation.stale().map(|e| format!("stale, the last good list is in force: {e}"));
            checks.push(("deny-list", stale.map_or(Ok(()), Err)));
        }
        if self.config.access_policy.is_some() {
            let stale = self.sessions.access.stale().map(|e| format!("stale, the last good policy is in force: {e}"));
            checks.push(("access-policy", stale.map_or(Ok(()), Err)));
        }
        if self.config.access_policy_from_control_plane {
            checks.push(("access-policy-objects", self.sessions.access.objects_problem().map_or(Ok(()), Err)));
        }
        if matches!(self.config.watch_source, watch_source::WatchSource::ControlPlane(_)) {
            let synced = self.watch_synced.synced();
            let from = match &self.config.watch_source {
                watch_source::WatchSource::ControlPlane(Some(path)) => format!("kubeconfig {}", path.display()),
                _ => "in-cluster or $KUBECONFIG".into(),
            };
            checks.push((
                "control-plane",
                if synced {
                    Ok(())
                } else {
                    // The watch's last error says why (unreachable, refused credentials, no CRD).
                    let why = self.watch_synced.last_error().map(|e| format!(": {e}")).unwrap_or_default();
                    Err(format!("WatchConfig watch has not synced with the control plane ({from}){why}"))
                },
            ));
        }
        checks
    }
}

/// Where the hub accepts agents and subscribers: a TCP listener, or another source of
/// connections (the deterministic simulation's network, `fleetwatch-dst`).
pub enum Listener {
    /// A TCP listener (every program).
    Tcp(TcpListener),
    /// Any other source of connections.
    Other(Box<dyn Accept>),
}

/// What [`Accept::accept`] answers: a connection and its peer's address.
pub type Accepted<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::io::Result<(fleetwatch_client::transport::Stream, SocketAddr)>>
            + Send
            + 'a,
    >,
>;

/// A source of connections other than TCP.
pub trait Accept: Send + 'static {
    /// The next connection. Cancel-safe.
    fn accept(&mut self) -> Accepted<'_>;
    /// The address it listens on.
    fn local_addr(&self) -> std::io::Result<SocketAddr>;
}

impl Listener {
    /// The next connection. Cancel-safe.
    pub(crate) async fn accept(&mut self) -> std::io::Result<(fleetwatch_client::transport::Stream, SocketAddr)> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| (fleetwatch_client::transport::Stream::Tcp(s), a)),
            Listener::Other(l) => l.accept().await,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Other(l) => l.local_addr(),
        }
    }
}

/// A bound, not yet running hub.
pub struct Hub {
    ctx: Arc<Context>,
    listener: Listener,
    admin: Option<TcpListener>,
    /// How to open the bus, while it could not be opened yet (see [`opening`]).
    open: Option<opening::OpenBus>,
}

impl Hub {
    /// Loads certificates, opens the bus and binds the listeners.
    pub async fn bind(config: HubConfig) -> Result<Self, HubError> {
        Self::bind_on(config, None).await
    }

    /// Like [`bind`](Self::bind), but accepts agents and subscribers from `listener`
    /// instead of binding `config.listen` (the simulation's network); `None` binds it.
    pub async fn bind_on(config: HubConfig, listener: Option<Listener>) -> Result<Self, HubError> {
        Self::bind_with(config, listener, None).await
    }

    /// Like [`bind_on`](Self::bind_on), opening the bus with `open` (the simulation's NATS
    /// bus on an in-memory JetStream); `None` opens the one `config` says. A bus that
    /// cannot be opened for a while does not stop the start: see [`opening`].
    pub async fn bind_with(
        mut config: HubConfig,
        listener: Option<Listener>,
        open: Option<opening::OpenBus>,
    ) -> Result<Self, HubError> {
        fleetwatch_certs::install_crypto_provider();
        // What cannot work is refused before anything is opened, one line each.
        preflight::check(&config).await?;
        fit_open_file_limit(&mut config);
        // The admin endpoint's protection is checked before anything listens or is opened: fail closed.
        let (admin_token, admin_tls) = match config.admin_listen {
            Some(addr) => {
                let token = admin::auth::check(addr, &config.admin_auth)?;
                let tls = match &config.admin_auth.client_ca {
                    // A client certificate is checked per request, so probes need none.
                    Some(ca) => Some(Arc::new(fleetwatch_certs::server_config_optional_client(&TlsFiles {
                        cert: config.tls.cert.clone(),
                        key: config.tls.key.clone(),
                        ca: vec![ca.clone()],
                    })?)),
                    None => None,
                };
                (token, tls)
            }
            None => (None, None),
        };
        let tls = ReloadingServerConfig::new(config.tls.clone())?;
        let open = open.unwrap_or_else(|| opening::from_config(&config));
        let storage = fleetwatch_bus::DeferredBus::new(opening::durable(&config));
        let bus: Arc<dyn Bus> = storage.clone();
        let listener = match listener {
            Some(l) => l,
            None => Listener::Tcp(bind_retrying(config.listen, config.bind_retry).await?),
        };
        let admin = match config.admin_listen {
            Some(addr) => Some(bind_retrying(addr, config.bind_retry).await?),
            None => None,
        };
        // Clients must share the trust domain of the hub's own SPIFFE id.
        let trust_domain = fleetwatch_certs::inspect_file(&config.tls.cert)?
            .require_identity()
            .map_err(|what| CertError::Pem { path: config.tls.cert.clone(), what })?
            .trust_domain;
        // A broken WatchConfig directory is a start-up error; later edits are reloaded.
        let watch_verdicts = watch_source::Verdicts::default();
        let initial_watches = config.watch_source.initial(&watch_verdicts)?;
        let revocation = revocation::Revocation::load(config.deny_list.clone())?;
        // Runtime labels exist only when the hub reads the control plane (fleet::follow_runtimes).
        let reads_runtimes = matches!(config.watch_source, watch_source::WatchSource::ControlPlane(_));
        if config.access_policy_from_control_plane && !reads_runtimes {
            return Err(HubError::Refused(
                "--access-policy-from-control-plane needs a control plane (--control-plane-kubeconfig, or in a pod its \
                 own cluster)"
                    .into(),
            ));
        }
        let access = access::AccessControl::load_with_objects(
            config.access_policy.clone(),
            reads_runtimes,
            config.access_policy_from_control_plane,
        )?;
        let runtimes = fleet::SharedRuntimes::default();
        match access.current() {
            Some(_) if config.access_policy_from_control_plane => tracing::warn!(
                policy = %access.describe(),
                "subscriber access policy from the control plane's SubscriberAccessPolicy objects{}: until they are \
                 listed every subscriber is refused, and with no accepted object only the file grants (none: nobody)",
                if config.access_policy.is_some() { " and the file" } else { "" }
            ),
            Some(policy) => tracing::info!(
                policy = %config.access_policy.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                subscribers = policy.len(),
                "subscriber access policy in force: subscribers it does not name are refused"
            ),
            None => tracing::warn!(
                "no subscriber access policy (--access-policy): every subscriber certificate reads every cluster"
            ),
        }
        let watch_synced = !matches!(config.watch_source, watch_source::WatchSource::ControlPlane(_));
        // Set from the bus once it is open (`opening::adopt`).
        let registry = SessionRegistry::default();
        let sessions = Arc::new(Sessions {
            settings: SessionSettings::from_config(&config),
            bus,
            registry,
            metrics: Metrics::default(),
            fanout: fanout::FanOut::default(),
            watches: tokio::sync::watch::channel(Arc::new(initial_watches)).0,
            revocation,
            access,
            subscriber_slots: Default::default(),
            runtimes: runtimes.clone(),
        });
        let replica = listener.local_addr().unwrap_or(config.listen).to_string();
        let fleet = fleet::state::FleetState::new(&replica);
        let ctx = Arc::new(Context {
            admission: admission::ConnectionBudget::new(
                config.max_connections,
                config.max_handshakes,
                config.max_handshakes_per_ip,
            ),
            watch_synced: Arc::new(watch_source::WatchSync::new(watch_synced)),
            replica,
            fleet,
            admin_token,
            admin_tls,
            runtimes,
            runtimes_changed: tokio::sync::watch::channel(0).0,
            watch_verdicts,
            config,
            sessions,
            tls,
            trust_domain,
            storage,
        });
        let open = match opening::first(&ctx, &open).await? {
            true => None,
            false => Some(open),
        };
        Ok(Self { ctx, listener, admin, open })
    }

    /// The address agents connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.ctx.config.listen)
    }

    /// The admin address, when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Whether the bus is open (`false`: the hub serves unready and keeps trying, see
    /// [`opening`]).
    pub fn bus_open(&self) -> bool {
        self.ctx.storage.get().is_some()
    }

    /// Serves until `shutdown` is cancelled, then closes every session after its current
    /// batch is acked, and flushes the bus.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), HubError> {
        // The hub also stops by itself when its bus can never work again in this process
        // (`Bus::fatal`): serving on would keep it unready and its agents refused until
        // someone restarts it, while an exit lets its supervisor do that at once.
        let outer = shutdown;
        let shutdown = outer.child_token();
        let fatal = Arc::new(std::sync::Mutex::new(None::<String>));
        tokio::spawn(watch_fatal(self.ctx.sessions.bus.clone(), fatal.clone(), shutdown.clone()));
        let tracker = tokio_util::task::TaskTracker::new();
        if let Some(open) = self.open {
            tracker.spawn(opening::keep_opening(self.ctx.clone(), open, shutdown.clone()));
        }
        if let Some(admin) = self.admin {
            tracker.spawn(admin::serve(admin, self.ctx.clone(), shutdown.clone()));
        }
        tracker.spawn(housekeeping(self.ctx.clone(), shutdown.clone()));
        tracker.spawn(fleet::writer::run(self.ctx.clone(), shutdown.clone()));
        // Reading WatchConfigs from the control plane, the hub shows its Runtimes too.
        if let watch_source::WatchSource::ControlPlane(kubeconfig) = &self.ctx.config.watch_source {
            tracker.spawn(fleet::follow_runtimes(
                kubeconfig.clone(),
                self.ctx.runtimes.clone(),
                self.ctx.runtimes_changed.clone(),
                shutdown.clone(),
            ));
            // ... and writes what it made of each WatchConfig into its status.
            tracker.spawn(watch_status::run(self.ctx.clone(), kubeconfig.clone(), shutdown.clone()));
            if self.ctx.config.access_policy_from_control_plane {
                tracker.spawn(access_objects::run(self.ctx.clone(), kubeconfig.clone(), shutdown.clone()));
            }
        }
        tracker.spawn(watch_source::run(
            self.ctx.config.watch_source.clone(),
            self.ctx.sessions.watches.clone(),
            self.ctx.watch_verdicts.clone(),
            self.ctx.watch_synced.clone(),
            shutdown.clone(),
        ));
        server::accept_loop(self.listener, self.ctx.clone(), shutdown.clone(), &tracker).await;
        tracker.close();
        tracker.wait().await;
        let fatal = fatal.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(cause) = fatal {
            return Err(HubError::BusUnusable(cause));
        }
        self.ctx.sessions.bus.flush(Flush::All).await?;
        tracing::info!("hub stopped");
        Ok(())
    }
}

/// Stops the hub (cancels `stop`) once its bus says it can never work again, keeping why.
async fn watch_fatal(bus: Arc<dyn Bus>, fatal: Arc<std::sync::Mutex<Option<String>>>, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Some(cause) = bus.fatal() {
            tracing::error!(%cause, "the bus cannot work again in this process: stopping so that the supervisor starts this hub replica again");
            *fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
            stop.cancel();
            return;
        }
    }
}

/// Raises the open-file limit and fits the connection budgets under it, in one log line.
fn fit_open_file_limit(config: &mut HubConfig) {
    let Some(limit) = admission::raise_open_file_limit() else { return };
    let (sessions, handshakes) = admission::fit_to_fd_limit(config.max_connections, config.max_handshakes, limit);
    if (sessions, handshakes) == (config.max_connections, config.max_handshakes) {
        tracing::info!(
            open_files = limit,
            max_connections = sessions,
            max_handshakes = handshakes,
            "open-file limit allows the connection budgets"
        );
    } else {
        let mut lowered = vec![format!("--max-connections from {} to {sessions}", config.max_connections)];
        if handshakes != config.max_handshakes {
            lowered.push(format!("--max-handshakes from {} to {handshakes}", config.max_handshakes));
        }
        let lowered = lowered.join(" and ");
        if config.connection_budgets_given {
            tracing::warn!(
                open_files = limit,
                "open-file limit {limit} is too low: lowering {lowered} (raise the hard limit, e.g. LimitNOFILE, to allow more)"
            );
        } else {
            tracing::info!(
                open_files = limit,
                "open-file limit {limit}: lowering the default {lowered} (raise the hard limit, e.g. LimitNOFILE, to allow more)"
            );
        }
        config.max_connections = sessions;
        config.max_handshakes = handshakes;
    }
}

/// Periodic chores: certificate and deny-list reload, closing sessions whose certificate
/// is no longer good, cursor flush, the refusal summary.
async fn housekeeping(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut flush = tokio::time::interval(Duration::from_secs(1));
    let mut reload = tokio::time::interval(ctx.config.tls_reload_interval);
    let mut summary = tokio::time::interval(admission::SUMMARY_INTERVAL);
    summary.tick().await; // the first tick is immediate; summaries cover a whole interval
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = flush.tick() => {
                if let Err(e) = ctx.sessions.bus.flush(Flush::Cursors).await {
                    tracing::warn!(error = %e, "cannot store subscriber cursors");
                }
            }
            _ = summary.tick() => {
                if let Some(line) = ctx.admission.take_summary() {
                    tracing::warn!("{line}");
                }
                if let Some(line) = conn::FAILURE_LOG.take_summary() {
                    tracing::warn!("{line}");
                }
            }
            _ = reload.tick() => {
                let bundles_changed = match ctx.tls.reload_if_changed() {
                    Ok(true) => {
                        tracing::info!("reloaded TLS certificates and CA bundles");
                        true
                    }
                    Ok(false) => false,
                    Err(e) => {
                        tracing::error!(error = %e, "certificate files changed but cannot be loaded; keeping the old ones");
                        false
                    }
                };
                let sessions = &ctx.sessions;
                match sessions.revocation.reload_if_changed() {
                    revocation::Reload::Replaced => {
                        tracing::info!(entries = sessions.revocation.current().len(), "reloaded the deny list");
                        sessions.metrics.deny_list_stale.set(0);
                    }
                    revocation::Reload::Unchanged => {}
                    revocation::Reload::Failed(e) => {
                        tracing::error!(
                            error = %e,
                            entries = sessions.revocation.current().len(),
                            "deny list cannot be used; the last good list stays in force"
                        );
                        sessions.metrics.deny_list_errors.inc();
                        sessions.metrics.deny_list_stale.set(1);
                    }
                }
                match sessions.access.reload_if_changed() {
                    access::Reload::Replaced => {
                        let subscribers = sessions.access.current().map(|p| p.len()).unwrap_or_default();
                        sessions.metrics.access_policy_stale.set(0);
                        tracing::info!(subscribers, "reloaded the subscriber access policy");
                        ctx.close_ungranted();
                    }
                    access::Reload::Unchanged => {}
                    access::Reload::Failed(e) => {
                        // Before the log line: whoever reads the line finds the metric set.
                        sessions.metrics.access_policy_stale.set(1);
                        tracing::error!(
                            error = %e,
                            "subscriber access policy cannot be used; the last good policy stays in force (not ready)"
                        );
                    }
                }
                ctx.close_revoked(bundles_changed);
            }
        }
    }
}

/// Connections the kernel queues before the hub accepts them (capped by
/// `net.core.somaxconn`). tokio's default of 1,024 overflows when a fleet reconnects at
/// once after a restart, and every dropped SYN costs its agent a second or more.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener with `SO_REUSEADDR` (connections of a previous process in `TIME_WAIT` do not
/// block it) and a [`LISTEN_BACKLOG`] deep accept queue.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds a listener (see [`listen`]). An address in use is refused at once, unless `retry`
/// is given: a hub restarted on its port while the previous one is still exiting (closing
/// ten thousand sockets after a SIGKILL takes a moment; `bench storm`, the soak) then
/// retries with backoff for that long before it is refused with the address named.
pub async fn bind_retrying(addr: SocketAddr, retry: Option<Duration>) -> Result<TcpListener, HubError> {
    use backon::{ExponentialBuilder, Retryable};
    let in_use = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
    let Some(retry) = retry.filter(|d| !d.is_zero()) else {
        return listen(addr).map_err(|source| {
            let hint = if in_use(&source) {
                "; another process listens there (give --bind-retry SECS to wait for it to go)".to_string()
            } else {
                String::new()
            };
            HubError::Bind { addr, source, hint }
        });
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(500))
        .with_total_delay(Some(retry))
        .without_max_times();
    let mut warned = false;
    (|| async move { listen(addr) })
        .retry(backoff)
        .when(in_use)
        .notify(|_, _| {
            if !warned {
                warned = true;
                tracing::warn!(%addr, "address in use (a previous hub still exiting?): retrying for up to {:.0}s (--bind-retry)", retry.as_secs_f64());
            }
        })
        .await
        .map_err(|source| {
            let hint = if in_use(&source) { format!("; still after {:.0}s of --bind-retry", retry.as_secs_f64()) } else { String::new() };
            HubError::Bind { addr, source, hint }
        })
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    #[tokio::test]
    async fn an_address_in_use_is_refused_at_once_without_bind_retry() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let bind = bind_retrying(addr, None);
        tokio::pin!(bind);
        // Answered on the first poll: no waiting.
        let std::task::Poll::Ready(Err(e)) = futures_util::poll!(&mut bind) else { panic!("not refused at once") };
        let e = e.to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("--bind-retry"), "{e}");
    }

    #[tokio::test]
    async fn an_address_in_use_is_retried_until_it_is_free() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let bind = bind_retrying(addr, Some(Duration::from_secs(60)));
        tokio::pin!(bind);
        // The first attempt finds the address taken and waits to try again, instead of
        // failing as a plain bind does.
        assert!(futures_util::poll!(&mut bind).is_pending());
        drop(holder);
        let listener = bind.await.expect("bound once the address was free");
        assert_eq!(listener.local_addr().unwrap(), addr);
    }
}
