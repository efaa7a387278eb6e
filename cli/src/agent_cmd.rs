//! `fleetwatch agent`.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_agent::{Agent, AgentConfig};
use fleetwatch_shared::transport::HubUrl;
use tokio::sync::mpsc;

#[derive(Args)]
pub struct AgentArgs {
    /// The hub, as wss://HOST:PORT.
    #[arg(long)]
    hub: String,
    /// The agent's certificate (its cluster id is the one in it).
    #[arg(long)]
    cert: PathBuf,
    /// The agent's private key.
    #[arg(long)]
    key: PathBuf,
    /// CA bundle that signed the hub's certificate.
    #[arg(long)]
    ca: Vec<PathBuf>,
    /// Where changes come from: `synthetic:objects=N,rate=R[,total=T][,payload=BYTES]`
    /// changes N objects round-robin at R changes/s (stopping after T).
    #[arg(long)]
    source: String,
    /// Objects the outbox holds while the hub is unreachable before it collapses into one
    /// resync marker.
    #[arg(long, default_value_t = 100_000)]
    outbox_capacity: usize,
    /// Most events per frame.
    #[arg(long, default_value_t = 500)]
    batch_size: usize,
    /// Seconds to wait on shutdown for the hub to ack pending events.
    #[arg(long, default_value_t = 5.0)]
    drain_timeout: f64,
    /// Keep retrying when the first connection fails, instead of exiting with its error.
    #[arg(long)]
    retry_first_connect: bool,
}

pub async fn run(args: AgentArgs) -> anyhow::Result<()> {
    let hub: HubUrl = args.hub.parse()?;
    let source: SyntheticSource = args.source.parse()?;
    anyhow::ensure!(!args.ca.is_empty(), "--ca is required: the CA bundle that signed the hub's certificate");
    let mut config = AgentConfig::new(hub, crate::tls_files(&args.cert, &args.key, &args.ca));
    config.outbox_capacity = args.outbox_capacity.max(1);
    config.batch_size = args.batch_size.clamp(1, config.limits.max_batch_events);
    config.drain_timeout = std::time::Duration::try_from_secs_f64(args.drain_timeout).context("--drain-timeout")?;
    let agent = Agent::new(config).context("cannot start agent")?;
    let _span = tracing::info_span!("agent", cluster = %agent.cluster()).entered();
    tracing::info!(source = %args.source, "agent starting");
    let shutdown = crate::shutdown_on_signals();
    let (tx, rx) = mpsc::channel(4096);
    tokio::spawn(source.run(tx, shutdown.child_token()));
    let stats = agent.run(rx, shutdown, !args.retry_first_connect).await?;
    // One machine-readable line: what was produced and what the hub acked.
    println!(
        "agent stopped changes={} last_seq={} acked_seq={} pending={}",
        stats.changes, stats.last_seq, stats.acked_seq, stats.outbox_len
    );
    Ok(())
}
