//! `fleetwatch hub`.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_bus::{DEFAULT_AGE_DISK, DEFAULT_AGE_MEMORY, DEFAULT_BYTES_DISK, DEFAULT_BYTES_MEMORY, Retention};
use fleetwatch_hub::{Hub, HubConfig};

#[derive(Args)]
pub struct HubArgs {
    /// Address agents and subscribers connect to (wss, mutual TLS).
    #[arg(long, env = "FLEETWATCH_LISTEN", default_value = "0.0.0.0:7443")]
    listen: SocketAddr,
    /// The hub's certificate (PEM).
    #[arg(long, env = "FLEETWATCH_CERT")]
    cert: PathBuf,
    /// The hub's private key (PEM).
    #[arg(long, env = "FLEETWATCH_KEY")]
    key: PathBuf,
    /// CA bundle(s) whose client certificates are trusted; repeat during a CA rotation.
    /// Reloaded from disk when they change.
    #[arg(long = "client-ca", env = "FLEETWATCH_CLIENT_CA", required = true)]
    client_ca: Vec<PathBuf>,
    /// Admin endpoint: /healthz, /readyz, /metrics, the admin API (/api/v1/...) and the web
    /// view (/). On an address other than loopback it needs --admin-token-file or
    /// --admin-client-ca (the hub refuses to start otherwise).
    #[arg(long, env = "FLEETWATCH_ADMIN_LISTEN")]
    admin_listen: Option<SocketAddr>,
    /// File with the bearer token the admin endpoint requires (`Authorization: Bearer
    /// TOKEN`, or the web view's sign-in); everything but /healthz and /readyz needs it.
    #[arg(long, env = "FLEETWATCH_ADMIN_TOKEN_FILE")]
    admin_token_file: Option<PathBuf>,
    /// CA bundle of the client certificates the admin endpoint requires: it then speaks
    /// TLS with the hub's certificate (--cert) and every connection needs such a
    /// certificate.
    #[arg(long, env = "FLEETWATCH_ADMIN_CLIENT_CA")]
    admin_client_ca: Option<PathBuf>,
    /// Keep the event log and subscriber cursors here, so acked events survive a restart.
    /// Without it events live in memory only and a restart makes subscribers resync.
    #[arg(long, env = "FLEETWATCH_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// NATS JetStream bus settings (boxed: most hubs run without them).
    #[command(flatten)]
    bus: Box<BusArgs>,
    /// Events the bus retains; subscribers further behind get resync-required.
    #[arg(long, env = "FLEETWATCH_RETENTION", default_value_t = 200_000)]
    retention: usize,
    /// Bytes of events the bus retains (e.g. 256MiB, 1GiB, or a number of bytes); older
    /// events are evicted and lagging subscribers get resync-required. Retained events are
    /// held in memory in both modes. Default: 256MiB in memory, 512MiB with --data-dir or --bus.
    #[arg(long, env = "FLEETWATCH_RETENTION_BYTES", value_parser = crate::size::parse)]
    retention_bytes: Option<u64>,
    /// Oldest event the bus retains (e.g. 90s, 24h, 7d, or a number of seconds; 0 keeps
    /// events regardless of age). Default: 24h in memory, 7d with --data-dir or --bus.
    #[arg(long, env = "FLEETWATCH_RETENTION_AGE", value_parser = parse_age)]
    retention_age: Option<Duration>,
    /// Test hook: enables `POST /debug/faults/storage?fail_for_ms=N` on the admin endpoint,
    /// which makes every bus disk write fail with ENOSPC for N ms. Never in production.
    #[arg(long, env = "FLEETWATCH_FAULT_INJECTION", hide = true)]
    fault_injection: bool,
    /// Bytes per bus segment file (e.g. 64MiB); smaller segments are closed sooner (tests).
    #[arg(long, env = "FLEETWATCH_SEGMENT_BYTES", value_parser = crate::size::parse, default_value = "64MiB", hide = true)]
    segment_bytes: u64,
    /// Events per second accepted from one agent; beyond it acks are delayed (never dropped).
    #[arg(long, env = "FLEETWATCH_MAX_EVENTS_PER_SEC", default_value_t = 20_000)]
    max_events_per_sec: u32,
    /// Largest WebSocket message in bytes.
    #[arg(long, env = "FLEETWATCH_MAX_MESSAGE_BYTES", default_value_t = 1 << 20)]
    max_message_bytes: usize,
    /// Most events in one batch.
    #[arg(long, env = "FLEETWATCH_MAX_BATCH_EVENTS", default_value_t = 1000)]
    max_batch_events: usize,
    /// Largest single event in bytes of JSON; agents learn it at welcome and cut larger
    /// events down (`data.truncated`) instead of sending them.
    #[arg(long, env = "FLEETWATCH_MAX_EVENT_BYTES", default_value_t = 64 << 10)]
    max_event_bytes: usize,
    /// Seconds allowed for the TLS + WebSocket handshake and the first message. Shortened
    /// to 2 s for connections accepted while idle sockets (connected, nothing sent) hold
    /// over half of --max-handshakes; when that budget is used up the oldest idle socket
    /// is closed to admit the next connection.
    #[arg(long, env = "FLEETWATCH_HANDSHAKE_TIMEOUT", default_value_t = 10.0)]
    handshake_timeout: f64,
    /// Seconds of silence after which a session is closed (the hub pings at a third of it).
    #[arg(long, env = "FLEETWATCH_IDLE_TIMEOUT", default_value_t = 30.0)]
    idle_timeout: f64,
    /// Seconds between checks of the certificate, key and CA files; changed files are
    /// loaded without a restart (certificate renewal, CA rotation).
    #[arg(long, env = "FLEETWATCH_TLS_RELOAD_INTERVAL", default_value_t = 5.0)]
    tls_reload_interval: f64,
    /// Directory of WatchConfig manifests (YAML or JSON) pushed to agents; edits are picked
    /// up while running.
    #[arg(long, env = "FLEETWATCH_WATCH_CONFIG", conflicts_with = "control_plane_kubeconfig")]
    watch_config: Option<PathBuf>,
    /// Read WatchConfig resources from the control-plane cluster this kubeconfig reaches,
    /// and push every change to connected agents. Without this flag and without
    /// --watch-config, a hub running in a pod (or with $KUBECONFIG set) reads them from that
    /// cluster; `--no-control-plane` turns this off.
    #[arg(long, env = "FLEETWATCH_CONTROL_PLANE_KUBECONFIG")]
    control_plane_kubeconfig: Option<PathBuf>,
    /// Do not read WatchConfigs from any cluster (no in-cluster or $KUBECONFIG fallback).
    #[arg(long, env = "FLEETWATCH_NO_CONTROL_PLANE", conflicts_with_all = ["control_plane_kubeconfig", "watch_config"])]
    no_control_plane: bool,
    /// Deny list: one certificate serial (hex) or SPIFFE id per line. Reloaded with the
    /// certificates; a denied peer is refused and its open session closed.
    #[arg(long, env = "FLEETWATCH_DENY_LIST")]
    deny_list: Option<PathBuf>,
    /// Subscriber access policy (YAML): per subscriber name, the cluster id globs, optional
    /// CloudEvents type globs and JSON pointers redacted from event data. A subscriber it
    /// does not name is refused, one asking for clusters outside its grant too; without a
    /// cluster filter it gets exactly its granted clusters. Re-read when its content
    /// changes; a file that breaks later keeps the last good policy and makes the hub not
    /// ready. Without it every subscriber certificate reads every cluster (said at start).
    /// Format: docs/deploy.md, "Subscriber access policy".
    #[arg(long, env = "FLEETWATCH_ACCESS_POLICY", value_name = "FILE")]
    access_policy: Option<PathBuf>,
    /// Also grant by the accepted SubscriberAccessPolicy objects (cluster-scoped, checked
    /// like the file) of the control plane the hub reads: the policy is the file's grants
    /// (if --access-policy is given) and theirs; a subscriber is granted in one place only.
    /// Until they are listed every subscriber is refused; with none and no file, nobody is
    /// granted. Needs a control plane (--control-plane-kubeconfig, or in a pod its cluster).
    #[arg(long, env = "FLEETWATCH_ACCESS_POLICY_FROM_CONTROL_PLANE")]
    access_policy_from_control_plane: bool,
    /// Most live sessions of one subscriber identity. A session past it closes one of the
    /// identity's older sessions: the oldest that is not reading (events sent, none acked)
    /// first, else the oldest, so a reconnecting client always gets back in and one
    /// certificate cannot hold unbounded hub memory.
    #[arg(long, env = "FLEETWATCH_MAX_SESSIONS_PER_SUBSCRIBER", default_value_t = 8)]
    max_sessions_per_subscriber: usize,
    /// Most sessions: connections that completed the TLS and WebSocket handshakes (default
    /// 50000). Lowered at start to what the open-file limit allows (the hub raises its soft
    /// limit to the hard one); a WARN says so when the value was given, an INFO for the
    /// default.
    #[arg(long, env = "FLEETWATCH_MAX_CONNECTIONS")]
    max_connections: Option<usize>,
    /// Most connections still in the TLS or WebSocket handshake (unauthenticated), from all
    /// addresses together (default 1024). While they are all taken the hub accepts nothing:
    /// new connections wait in the kernel's accept queue (4,096 deep) until a slot frees.
    #[arg(long, env = "FLEETWATCH_MAX_HANDSHAKES")]
    max_handshakes: Option<usize>,
    /// Most connections still in the handshake from one source address: idle sockets from
    /// one address cannot keep others out.
    #[arg(long, env = "FLEETWATCH_MAX_HANDSHAKES_PER_IP", default_value_t = 64)]
    max_handshakes_per_ip: usize,
    /// Seconds a subscriber may leave a send blocked (it stopped reading), or its window
    /// of unacked events full without acking, before it is disconnected; its durable
    /// cursor is kept, so it resumes where it acked when it reconnects.
    #[arg(long, env = "FLEETWATCH_SUBSCRIBER_STALL_TIMEOUT", default_value_t = 30.0)]
    subscriber_stall_timeout: f64,
    /// Seconds to keep trying --listen / --admin-listen while the address is in use (a hub
    /// restarted on its port while the previous process is still exiting). Without it an
    /// address in use stops the hub at once.
    #[arg(long, env = "FLEETWATCH_BIND_RETRY", value_name = "SECS")]
    bind_retry: Option<f64>,
}

/// `--bus*`: the hub's bus on NATS JetStream.
#[derive(Args)]
pub struct BusArgs {
    /// Run the bus on NATS JetStream instead of the embedded one: comma-separated server
    /// URLs (nats://HOST:PORT, tls://HOST:PORT), tried in turn. Several hub replicas on the
    /// same stream share the history, agent resume points and durable cursors, so agents
    /// and subscribers may reach any of them. Retention (--retention*) becomes the stream's
    /// limits. Without --bus the embedded bus (memory or --data-dir) is used.
    #[arg(long, env = "FLEETWATCH_BUS", value_delimiter = ',', value_name = "URLS")]
    bus: Vec<String>,
    /// Client certificate (PEM) for mutual TLS to NATS (with --bus-tls-key).
    #[arg(long, env = "FLEETWATCH_BUS_TLS_CERT", requires = "bus_tls_key")]
    bus_tls_cert: Option<PathBuf>,
    /// Key (PEM) of --bus-tls-cert.
    #[arg(long, env = "FLEETWATCH_BUS_TLS_KEY", requires = "bus_tls_cert")]
    bus_tls_key: Option<PathBuf>,
    /// CA bundle (PEM) that signed the NATS servers' certificates (implies TLS).
    #[arg(long, env = "FLEETWATCH_BUS_TLS_CA")]
    bus_tls_ca: Option<PathBuf>,
    /// NATS credentials file (.creds: user JWT and nkey seed).
    #[arg(long, env = "FLEETWATCH_BUS_CREDS")]
    bus_creds: Option<PathBuf>,
    /// JetStream stream holding the events (also the subject prefix, and the prefix of the
    /// `<stream>_heads` and `<stream>_cursors` key-value buckets). Created when missing; an
    /// existing one must have the settings this hub would give it.
    #[arg(long, env = "FLEETWATCH_BUS_STREAM", default_value = "fleetwatch")]
    bus_stream: String,
    /// Replicas of the stream and buckets in a JetStream cluster (1-5; 3 survives the loss
    /// of one NATS server).
    #[arg(long, env = "FLEETWATCH_BUS_REPLICAS", default_value_t = 1)]
    bus_replicas: usize,
}

fn secs(name: &str, v: f64) -> anyhow::Result<Duration> {
    Duration::try_from_secs_f64(v)
        .ok()
        .filter(|d| !d.is_zero())
        .with_context(|| format!("--{name} must be a positive number of seconds"))
}

/// An age: seconds, or a duration such as `90s`, `30m`, `24h`, `7d`.
fn parse_age(s: &str) -> Result<Duration, String> {
    let s = s.trim();
    if let Ok(secs) = s.parse::<u64>() {
        return Ok(Duration::from_secs(secs));
    }
    let bad = |e: jiff::Error| format!("{s:?} is not a duration such as 24h or 7d: {e}");
    let span: jiff::Span = s.parse().map_err(bad)?;
    // Days count as 24 hours: an age, not a calendar date.
    let secs = span.total((jiff::Unit::Second, jiff::SpanRelativeTo::days_are_24_hours())).map_err(bad)?;
    Duration::try_from_secs_f64(secs).map_err(|_| format!("{s:?} must not be negative"))
}

pub async fn run(args: HubArgs) -> anyhow::Result<()> {
    let tls = crate::tls_files(&args.cert, &args.key, &args.client_ca);
    let mut config = HubConfig::new(args.listen, tls);
    config.admin_listen = args.admin_listen;
    config.admin_auth = fleetwatch_hub::admin::auth::AdminAuthConfig {
        token_file: args.admin_token_file.clone(),
        client_ca: args.admin_client_ca.clone(),
    };
    config.data_dir = args.data_dir.clone();
    let bus_flags = [&args.bus.bus_tls_cert, &args.bus.bus_tls_ca, &args.bus.bus_creds].iter().any(|f| f.is_some());
    if !args.bus.bus.is_empty() && args.data_dir.is_some() {
        anyhow::bail!("--bus and --data-dir exclude each other: with --bus the history is kept in JetStream");
    }
    if args.bus.bus.is_empty() && bus_flags {
        anyhow::bail!("--bus-tls-*, --bus-creds need --bus nats://HOST:PORT");
    }
    if !args.bus.bus.is_empty() {
        config.nats = Some(fleetwatch_bus::NatsOptions {
            tls_cert: args.bus.bus_tls_cert.clone(),
            tls_key: args.bus.bus_tls_key.clone(),
            tls_ca: args.bus.bus_tls_ca.clone(),
            creds: args.bus.bus_creds.clone(),
            stream: args.bus.bus_stream.clone(),
            replicas: args.bus.bus_replicas,
            ..fleetwatch_bus::NatsOptions::new(args.bus.bus.clone(), Retention::default())
        });
    }
    // JetStream keeps the history on disk like --data-dir: the same retention defaults.
    let durable = args.data_dir.is_some() || !args.bus.bus.is_empty();
    config.retention = Retention {
        records: args.retention.max(1),
        bytes: args.retention_bytes.unwrap_or(if durable { DEFAULT_BYTES_DISK } else { DEFAULT_BYTES_MEMORY }).max(1),
        age: match args.retention_age {
            Some(d) if d.is_zero() => None,
            Some(d) => Some(d),
            None => Some(if durable { DEFAULT_AGE_DISK } else { DEFAULT_AGE_MEMORY }),
        },
    };
    config.fault_injection = args.fault_injection;
    config.segment_bytes = args.segment_bytes.max(4096);
    if args.fault_injection {
        tracing::warn!("--fault-injection: POST /debug/faults/storage can make bus writes fail");
    }
    config.max_events_per_sec = args.max_events_per_sec.max(1);
    config.limits.max_message_bytes = args.max_message_bytes;
    config.limits.max_batch_events = args.max_batch_events;
    config.limits.max_event_bytes = args.max_event_bytes.max(1024);
    config.handshake_timeout = secs("handshake-timeout", args.handshake_timeout)?;
    config.idle_timeout = secs("idle-timeout", args.idle_timeout)?;
    config.connection_budgets_given = args.max_connections.is_some() || args.max_handshakes.is_some();
    config.max_connections = args.max_connections.unwrap_or(config.max_connections).max(1);
    config.max_handshakes = args.max_handshakes.unwrap_or(config.max_handshakes).max(1);
    config.max_handshakes_per_ip = args.max_handshakes_per_ip.max(1);
    config.subscriber_stall_timeout = secs("subscriber-stall-timeout", args.subscriber_stall_timeout)?;
    config.deny_list = args.deny_list;
    config.access_policy = args.access_policy;
    config.access_policy_from_control_plane = args.access_policy_from_control_plane;
    if args.max_sessions_per_subscriber == 0 {
        anyhow::bail!("--max-sessions-per-subscriber must be at least 1");
    }
    config.max_sessions_per_subscriber = args.max_sessions_per_subscriber;
    config.tls_reload_interval = secs("tls-reload-interval", args.tls_reload_interval)?;
    config.bind_retry = args.bind_retry.map(|s| secs("bind-retry", s)).transpose()?;
    use fleetwatch_hub::watch_source::WatchSource;
    let in_cluster = std::env::var_os("KUBERNETES_SERVICE_HOST").is_some();
    let kubeconfig_env = std::env::var_os("KUBECONFIG").is_some_and(|v| !v.is_empty());
    config.watch_source = match (args.watch_config, args.control_plane_kubeconfig) {
        (Some(dir), _) => WatchSource::Dir(dir),
        (None, Some(kc)) => WatchSource::ControlPlane(Some(kc)),
        // As the agent does: in a pod its own cluster, in a shell $KUBECONFIG's.
        (None, None) if !args.no_control_plane && (in_cluster || kubeconfig_env) => {
            tracing::info!(
                source = if in_cluster { "in-cluster configuration" } else { "$KUBECONFIG" },
                "reading WatchConfigs from the control plane"
            );
            WatchSource::ControlPlane(None)
        }
        (None, None) => WatchSource::None,
    };
    let hub = Hub::bind(config).await.context("cannot start hub")?;
    let scheme = if args.admin_client_ca.is_some() { "https" } else { "http" };
    let admin = hub.admin_addr().map(|a| format!(" admin={scheme}://{a}")).unwrap_or_default();
    // One machine-readable line on stdout: scripts and tests wait for it.
    println!("hub listening wss=wss://{}{admin}", hub.local_addr());
    let shutdown = crate::shutdown_on_signals();
    hub.run(shutdown).await.context("hub failed")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_parse() {
        assert_eq!(parse_age("24h"), Ok(Duration::from_secs(86_400)));
        assert_eq!(parse_age("7d"), Ok(Duration::from_secs(7 * 86_400)));
        assert_eq!(parse_age("90"), Ok(Duration::from_secs(90)));
        assert!(parse_age("soon").is_err());
    }
}
