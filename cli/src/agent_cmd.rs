//! `fleetwatch agent`: flags to an [`AgentRuntime`] over the chosen source (a cluster, or a
//! synthetic source for tests and benchmarks). The wiring itself lives in the agent crate,
//! shared with `up` and `bench`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fleetwatch_agent::kube_source::KubeSource;
use fleetwatch_agent::source::{Source, SyntheticSource};
use fleetwatch_agent::{AgentConfig, AgentRuntime, AgentStats};
use tracing::Instrument;

#[derive(Args)]
pub struct AgentArgs {
    /// The hub and the agent's certificate (its cluster id is the one in it).
    #[command(flatten)]
    conn: crate::HubClientArgs,
    /// The runtime cluster to watch (read-only: list and watch). Without it and without
    /// --source, the in-cluster configuration (or $KUBECONFIG) is used.
    #[arg(long, env = "FLEETWATCH_KUBECONFIG", conflicts_with = "source")]
    kubeconfig: Option<PathBuf>,
    /// A synthetic source instead of a cluster, for tests and benchmarks:
    /// `synthetic:objects=N,rate=R[,total=T][,payload=BYTES]` changes N objects
    /// round-robin at R changes/s (stopping after T).
    #[arg(long, env = "FLEETWATCH_SOURCE")]
    source: Option<String>,
    /// Objects the outbox holds while the hub is unreachable before it collapses into one
    /// resync marker.
    #[arg(long, env = "FLEETWATCH_OUTBOX_CAPACITY", default_value_t = 100_000)]
    outbox_capacity: usize,
    /// Bytes of events the outbox holds while the hub is unreachable before it collapses
    /// into one resync marker (a size: bytes, or e.g. 64Mi, 1G).
    #[arg(long, env = "FLEETWATCH_OUTBOX_MAX_BYTES", default_value = "64Mi", value_parser = crate::size::parse)]
    outbox_max_bytes: u64,
    /// Seconds without any frame from the hub (data, ping or pong) after which the
    /// connection counts as dead and is reopened; the agent pings a hub silent for half of
    /// it (a hub pings its agents more often than that, so a healthy one is not pinged).
    #[arg(long, env = "FLEETWATCH_IDLE_TIMEOUT", default_value_t = 30.0)]
    idle_timeout: f64,
    /// Most events per frame.
    #[arg(long, env = "FLEETWATCH_BATCH_SIZE", default_value_t = 500)]
    batch_size: usize,
    /// Seconds to wait on shutdown for the hub to ack pending events.
    #[arg(long, env = "FLEETWATCH_DRAIN_TIMEOUT", default_value_t = 5.0)]
    drain_timeout: f64,
    /// Seconds to wait before reconnecting after the hub refused this agent (revoked or
    /// wrong identity).
    #[arg(long, env = "FLEETWATCH_REFUSED_RETRY", default_value_t = 30.0)]
    refused_retry: f64,
    /// Seconds to wait before reconnecting after the hub answered `unsupported-version`
    /// (no protocol version in common, see docs/upgrade.md): minutes, since only upgrading
    /// the agent or the hub fixes it. The log line says which side to upgrade.
    #[arg(long, env = "FLEETWATCH_VERSION_RETRY", default_value_t = 300.0)]
    version_retry: f64,
    /// Keep retrying when the first connection fails, instead of exiting with its error.
    #[arg(long, env = "FLEETWATCH_RETRY_FIRST_CONNECT")]
    retry_first_connect: bool,
    /// Serve `/healthz` (200 while the process runs), `/readyz` (200 while a session
    /// with the hub is open, 503 otherwise) and `/metrics` (OpenMetrics: connected, outbox,
    /// acked seq, certificate expiry) on this plain-HTTP address, for the kubelet's probes
    /// and Prometheus.
    #[arg(long, env = "FLEETWATCH_HEALTH_LISTEN")]
    health_listen: Option<std::net::SocketAddr>,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let (hub, tls) = args.conn.resolve()?;
    let synthetic: Option<SyntheticSource> = args.source.as_deref().map(str::parse).transpose()?;
    let mut config = AgentConfig::new(hub, tls);
    config.outbox_capacity = args.outbox_capacity.max(1);
    config.outbox_max_bytes = usize::try_from(args.outbox_max_bytes).unwrap_or(usize::MAX).max(1);
    config.idle_timeout = std::time::Duration::try_from_secs_f64(args.idle_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--idle-timeout must be a positive number of seconds")?;
    config.batch_size = args.batch_size.clamp(1, config.limits.max_batch_events);
    config.drain_timeout = std::time::Duration::try_from_secs_f64(args.drain_timeout).context("--drain-timeout")?;
    config.refused_retry = std::time::Duration::try_from_secs_f64(args.refused_retry)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--refused-retry must be a positive number of seconds")?;
    config.version_retry = std::time::Duration::try_from_secs_f64(args.version_retry)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--version-retry must be a positive number of seconds")?;
    config.tls_reload_interval = args.conn.tls_reload_interval()?;
    config.tls_watch = args.conn.tls_watch();
    let runtime = AgentRuntime::new(config).context("cannot start agent")?.fail_fast(!args.retry_first_connect);
    let shutdown = crate::shutdown_on_signals();
    let health = match args.health_listen {
        Some(addr) => Some(
            tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--health-listen)"))?,
        ),
        None => None,
    };
    let run = Run { runtime, shutdown, health };
    let stats = match synthetic {
        Some(source) => run_agent(run, source).await?,
        None => {
            let client = match &args.kubeconfig {
                Some(path) => fleetwatch_client::kubeconfig::client_from_kubeconfig(path).await?,
                None => kube::Client::try_default().await.context(
                    "no --kubeconfig or --source given and no in-cluster configuration or $KUBECONFIG found",
                )?,
            };
            let origin = args.kubeconfig.as_ref().map_or_else(|| "in-cluster".into(), |p| p.display().to_string());
            run_agent(run, KubeSource::new(client, origin)).await?
        }
    };
    // One machine-readable line: what was produced and what the hub acked.
    println!(
        "agent stopped changes={} last_seq={} acked_seq={} pending={}",
        stats.changes, stats.last_seq, stats.acked_seq, stats.outbox_len
    );
    Ok(())
}

/// What [`run_agent`] needs besides the source.
struct Run {
    runtime: AgentRuntime,
    shutdown: tokio_util::sync::CancellationToken,
    /// The bound `--health-listen` socket, if any.
    health: Option<tokio::net::TcpListener>,
}

/// Runs the agent over `source` until `shutdown` (then it drains) or, failing fast, its error.
async fn run_agent<S: Source>(run: Run, source: S) -> anyhow::Result<AgentStats> {
    let Run { runtime, shutdown, health } = run;
    let span = tracing::info_span!("agent", cluster = %runtime.cluster());
    let agent = runtime.start(source, shutdown.clone());
    if let Some(listener) = health {
        tokio::spawn(fleetwatch_agent::metrics::health(agent.stats()).serve(listener, shutdown));
    }
    Ok(agent.wait().instrument(span).await?)
}
