//! The fleetwatch hub: authenticates agents and subscribers by their certificates, takes
//! events from agents into the bus (acking only what the bus accepted), and fans them out
//! to subscribers.
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

pub mod admin;
mod agent_session;
pub mod bus;
mod conn;
pub mod metrics;
mod rate;
pub mod registry;
pub mod revocation;
mod server;
mod subscriber_session;
pub mod watch_source;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_certs::{CertError, ReloadingServerConfig, TlsFiles};
use fleetwatch_shared::Limits;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

pub use bus::{Bus, BusOptions};
pub use metrics::Metrics;
pub use registry::{ClusterStatus, SessionRegistry};

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where agents and subscribers connect (wss).
    pub listen: SocketAddr,
    /// Plain-HTTP admin endpoint (health, metrics, clusters).
    pub admin_listen: Option<SocketAddr>,
    /// Server certificate, key and the client CA bundles.
    pub tls: TlsFiles,
    /// Bus storage: `None` keeps events in memory only.
    pub data_dir: Option<PathBuf>,
    /// Records the bus retains.
    pub retention: usize,
    /// Message limits.
    pub limits: Limits,
    /// Events per second accepted from one agent; beyond it acks are delayed.
    pub max_events_per_sec: u32,
    /// Time allowed for the TLS and WebSocket handshakes plus the first message.
    pub handshake_timeout: Duration,
    /// A session silent for this long is closed (the hub pings at a third of it).
    pub idle_timeout: Duration,
    /// Most open connections.
    pub max_connections: usize,
    /// A subscriber whose send does not complete, or whose unacked window stays full with
    /// no ack, for this long is disconnected (its durable cursor is kept).
    pub subscriber_stall_timeout: Duration,
    /// How often certificate and CA files are checked for changes.
    pub tls_reload_interval: Duration,
    /// Where WatchConfigs come from.
    pub watch_source: watch_source::WatchSource,
    /// Deny list of certificate serials and identities (reloaded with the certificates).
    pub deny_list: Option<PathBuf>,
}

impl HubConfig {
    /// Settings with defaults.
    pub fn new(listen: SocketAddr, tls: TlsFiles) -> Self {
        Self {
            listen,
            admin_listen: None,
            tls,
            data_dir: None,
            retention: BusOptions::default().retention,
            limits: Limits::default(),
            max_events_per_sec: 20_000,
            handshake_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            max_connections: 50_000,
            subscriber_stall_timeout: Duration::from_secs(30),
            tls_reload_interval: Duration::from_secs(5),
            watch_source: watch_source::WatchSource::None,
            deny_list: None,
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
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// The bus could not open its storage.
    #[error(transparent)]
    Bus(#[from] bus::BusError),
    /// The deny list cannot be read.
    #[error(transparent)]
    DenyList(#[from] revocation::DenyListError),
    /// The watch configuration cannot be loaded.
    #[error("watch configuration: {0}")]
    WatchConfig(String),
}

/// State shared by all sessions.
pub(crate) struct Context {
    pub config: HubConfig,
    pub bus: Arc<Bus>,
    pub registry: SessionRegistry,
    pub metrics: Metrics,
    pub tls: ReloadingServerConfig,
    /// The trust domain of the hub's own certificate; clients must share it.
    pub trust_domain: Option<String>,
    /// The watch configuration pushed to agents.
    pub watches: tokio::sync::watch::Sender<Arc<Vec<fleetwatch_shared::protocol::WatchSpec>>>,
    /// The deny list in force.
    pub revocation: revocation::Revocation,
    /// Open connections by id: who they are, and how to close them.
    pub live: std::sync::Mutex<std::collections::HashMap<u64, (Peer, CancellationToken)>>,
}

/// Who is on the other end of a connection, from its certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Peer {
    /// The SPIFFE id.
    pub identity: String,
    /// The certificate serial, lower-case hex.
    pub serial: String,
}

impl Context {
    /// Whether the peer's certificate is denied now.
    pub(crate) fn revoked(&self, peer: &Peer) -> bool {
        self.revocation.current().denies(&peer.identity, &peer.serial)
    }

    /// Closes every open connection whose certificate the deny list now denies.
    fn close_revoked(&self) {
        let list = self.revocation.current();
        if let Ok(live) = self.live.lock() {
            for (peer, token) in live.values() {
                if list.denies(&peer.identity, &peer.serial) {
                    tracing::warn!(identity = %peer.identity, serial = %peer.serial, "certificate revoked: closing its session");
                    token.cancel();
                }
            }
        }
    }
}

/// A bound, not yet running hub.
pub struct Hub {
    ctx: Arc<Context>,
    listener: TcpListener,
    admin: Option<TcpListener>,
}

impl Hub {
    /// Loads certificates, opens the bus and binds the listeners.
    pub async fn bind(config: HubConfig) -> Result<Self, HubError> {
        fleetwatch_certs::install_crypto_provider();
        let tls = ReloadingServerConfig::new(config.tls.clone())?;
        let bus = Bus::open(BusOptions {
            dir: config.data_dir.clone(),
            retention: config.retention,
            ..BusOptions::default()
        })?;
        let listener =
            TcpListener::bind(config.listen).await.map_err(|source| HubError::Bind { addr: config.listen, source })?;
        let admin = match config.admin_listen {
            Some(addr) => Some(TcpListener::bind(addr).await.map_err(|source| HubError::Bind { addr, source })?),
            None => None,
        };
        let trust_domain = fleetwatch_certs::inspect_file(&config.tls.cert)?.identity.map(|id| id.trust_domain);
        // A broken WatchConfig directory is a start-up error; later edits are reloaded.
        let initial_watches = config.watch_source.initial()?;
        let revocation = revocation::Revocation::load(config.deny_list.clone())?;
        let ctx = Arc::new(Context {
            config,
            bus,
            registry: SessionRegistry::default(),
            metrics: Metrics::default(),
            tls,
            trust_domain,
            watches: tokio::sync::watch::channel(Arc::new(initial_watches)).0,
            revocation,
            live: Default::default(),
        });
        Ok(Self { ctx, listener, admin })
    }

    /// The address agents connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.ctx.config.listen)
    }

    /// The admin address, when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// The bus (for embedding and tests).
    pub fn bus(&self) -> Arc<Bus> {
        self.ctx.bus.clone()
    }

    /// Serves until `shutdown` is cancelled, then closes every session after its current
    /// batch is acked, and flushes the bus.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), HubError> {
        let tracker = tokio_util::task::TaskTracker::new();
        if let Some(admin) = self.admin {
            tracker.spawn(admin::serve(admin, self.ctx.clone(), shutdown.clone()));
        }
        tracker.spawn(housekeeping(self.ctx.clone(), shutdown.clone()));
        tracker.spawn(watch_source::run(
            self.ctx.config.watch_source.clone(),
            self.ctx.watches.clone(),
            shutdown.clone(),
        ));
        server::accept_loop(self.listener, self.ctx.clone(), shutdown.clone(), &tracker).await;
        tracker.close();
        tracker.wait().await;
        self.ctx.bus.flush_cursors()?;
        tracing::info!("hub stopped");
        Ok(())
    }
}

/// Periodic chores: certificate reload, cursor flush.
async fn housekeeping(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut flush = tokio::time::interval(Duration::from_secs(1));
    let mut reload = tokio::time::interval(ctx.config.tls_reload_interval);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = flush.tick() => {
                if let Err(e) = ctx.bus.flush_cursors() {
                    tracing::warn!(error = %e, "cannot store subscriber cursors");
                }
            }
            _ = reload.tick() => {
                match ctx.tls.reload_if_changed() {
                    Ok(true) => tracing::info!("reloaded TLS certificates and CA bundles"),
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "certificate files changed but cannot be loaded; keeping the old ones"),
                }
                match ctx.revocation.reload_if_changed() {
                    Ok(true) => {
                        tracing::info!(entries = ctx.revocation.current().len(), "reloaded the deny list");
                        ctx.close_revoked();
                    }
                    Ok(false) => {}
                    Err(e) => tracing::warn!(error = %e, "deny list changed but cannot be read; keeping the old one"),
                }
            }
        }
    }
}
