//! `fleetwatch hub`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_hub::{Hub, HubConfig};

#[derive(Args)]
pub struct HubArgs {
    /// Address agents and subscribers connect to (wss, mutual TLS).
    #[arg(long, default_value = "0.0.0.0:7443")]
    listen: SocketAddr,
    /// The hub's certificate (PEM).
    #[arg(long)]
    cert: PathBuf,
    /// The hub's private key (PEM).
    #[arg(long)]
    key: PathBuf,
    /// CA bundle(s) whose client certificates are trusted; repeat during a CA rotation.
    /// Reloaded from disk when they change.
    #[arg(long = "client-ca", required = true)]
    client_ca: Vec<PathBuf>,
    /// Plain-HTTP admin endpoint: /healthz, /readyz, /metrics, /api/v1/clusters.
    #[arg(long)]
    admin_listen: Option<SocketAddr>,
    /// Keep the event log and subscriber cursors here, so acked events survive a restart.
    /// Without it events live in memory only and a restart makes subscribers resync.
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Events the bus retains; subscribers further behind get resync-required.
    #[arg(long, default_value_t = 200_000)]
    retention: usize,
    /// Events per second accepted from one agent; beyond it acks are delayed (never dropped).
    #[arg(long, default_value_t = 20_000)]
    max_events_per_sec: u32,
    /// Largest WebSocket message in bytes.
    #[arg(long, default_value_t = 1 << 20)]
    max_message_bytes: usize,
    /// Most events in one batch.
    #[arg(long, default_value_t = 1000)]
    max_batch_events: usize,
    /// Largest single event in bytes of JSON; agents learn it at welcome and cut larger
    /// events down (`data.truncated`) instead of sending them.
    #[arg(long, default_value_t = 64 << 10)]
    max_event_bytes: usize,
    /// Seconds allowed for the TLS + WebSocket handshake and the first message.
    #[arg(long, default_value_t = 10.0)]
    handshake_timeout: f64,
    /// Seconds of silence after which a session is closed (the hub pings at a third of it).
    #[arg(long, default_value_t = 30.0)]
    idle_timeout: f64,
    /// Seconds between checks of the certificate, key and CA files; changed files are
    /// loaded without a restart (certificate renewal, CA rotation).
    #[arg(long, default_value_t = 5.0)]
    tls_reload_interval: f64,
    /// Directory of WatchConfig manifests (YAML or JSON) pushed to agents; edits are picked
    /// up while running.
    #[arg(long, conflicts_with = "control_plane_kubeconfig")]
    watch_config: Option<PathBuf>,
    /// Read WatchConfig resources from the control-plane cluster this kubeconfig reaches,
    /// and push every change to connected agents.
    #[arg(long)]
    control_plane_kubeconfig: Option<PathBuf>,
    /// Deny list: one certificate serial (hex) or SPIFFE id per line. Reloaded with the
    /// certificates; a denied peer is refused and its open session closed.
    #[arg(long)]
    deny_list: Option<PathBuf>,
    /// Most open connections.
    #[arg(long, default_value_t = 50_000)]
    max_connections: usize,
    /// Seconds a subscriber may leave a send blocked (it stopped reading), or its window
    /// of unacked events full without acking, before it is disconnected; its durable
    /// cursor is kept, so it resumes where it acked when it reconnects.
    #[arg(long, default_value_t = 30.0)]
    subscriber_stall_timeout: f64,
}

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{name} must be a positive number of seconds"))
}

pub async fn run(args: HubArgs) -> anyhow::Result<()> {
    let tls = crate::tls_files(&args.cert, &args.key, &args.client_ca);
    let mut config = HubConfig::new(args.listen, tls);
    config.admin_listen = args.admin_listen;
    config.data_dir = args.data_dir;
    config.retention = args.retention.max(1);
    config.max_events_per_sec = args.max_events_per_sec.max(1);
    config.limits.max_message_bytes = args.max_message_bytes;
    config.limits.max_batch_events = args.max_batch_events;
    config.limits.max_event_bytes = args.max_event_bytes.max(1024);
    config.handshake_timeout = secs("handshake-timeout", args.handshake_timeout)?;
    config.idle_timeout = secs("idle-timeout", args.idle_timeout)?;
    config.max_connections = args.max_connections;
    config.subscriber_stall_timeout = secs("subscriber-stall-timeout", args.subscriber_stall_timeout)?;
    config.deny_list = args.deny_list;
    config.tls_reload_interval = secs("tls-reload-interval", args.tls_reload_interval)?;
    config.watch_source = match (args.watch_config, args.control_plane_kubeconfig) {
        (Some(dir), _) => fleetwatch_hub::watch_source::WatchSource::Dir(dir),
        (None, Some(kc)) => fleetwatch_hub::watch_source::WatchSource::ControlPlane(kc),
        (None, None) => fleetwatch_hub::watch_source::WatchSource::None,
    };
    let hub = Hub::bind(config).await.context("cannot start hub")?;
    let admin = hub.admin_addr().map(|a| format!(" admin=http://{a}")).unwrap_or_default();
    // One machine-readable line on stdout: scripts and tests wait for it.
    println!("hub listening wss=wss://{}{admin}", hub.local_addr());
    let shutdown = crate::shutdown_on_signals();
    hub.run(shutdown).await.context("hub failed")
}
