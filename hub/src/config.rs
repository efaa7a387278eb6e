//! The hub's settings ([`HubConfig`]): what the command line and the tests set, with the
//! defaults a hub runs with when they do not.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use fleetwatch_bus::BusOptions;
use fleetwatch_certs::TlsFiles;
use fleetwatch_protocol::Limits;

use crate::admin::auth::AdminAuthConfig;
use crate::watch_source::WatchSource;

/// Hub settings.
#[derive(Debug, Clone)]
pub struct HubConfig {
    /// Where agents and subscribers connect (wss).
    pub listen: SocketAddr,
    /// Admin endpoint (health, metrics, the admin API, the web view); plain HTTP unless
    /// `admin_auth.client_ca` is set.
    pub admin_listen: Option<SocketAddr>,
    /// Who may use the admin endpoint (required beyond loopback, see [`crate::admin::auth`]).
    pub admin_auth: AdminAuthConfig,
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
    pub watch_source: WatchSource,
    /// Deny list of certificate serials and identities (reloaded with the certificates).
    pub deny_list: Option<PathBuf>,
    /// Subscriber access policy (see [`crate::policy::access`]); `None`: every subscriber reads every
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
            admin_auth: AdminAuthConfig::default(),
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
            watch_source: WatchSource::None,
            deny_list: None,
            access_policy: None,
            access_policy_from_control_plane: false,
            max_sessions_per_subscriber: 8,
            bind_retry: None,
        }
    }
}
