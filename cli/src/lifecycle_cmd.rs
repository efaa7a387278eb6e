//! `fleetwatch lifecycle`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_shared::protocol::StartFrom;
use fleetwatch_shared::subscriber::SubscriberOptions;
use fleetwatch_shared::transport::HubUrl;

#[derive(Args)]
pub struct LifecycleArgs {
    /// The control plane holding Runtimes, ModuleTemplates and ModuleReleaseMetas (and the
    /// kubeconfig Secrets of runtime clusters).
    #[arg(long)]
    control_plane_kubeconfig: PathBuf,
    /// The hub to subscribe to, as wss://HOST:PORT: its events make reconciles event-driven.
    /// Without it only changes in the control plane and the resync trigger reconciles.
    #[arg(long, requires_all = ["cert", "key", "ca"])]
    hub: Option<String>,
    /// Subscriber certificate for the hub.
    #[arg(long)]
    cert: Option<PathBuf>,
    /// Subscriber key.
    #[arg(long)]
    key: Option<PathBuf>,
    /// CA bundle that signed the hub's certificate.
    #[arg(long)]
    ca: Vec<PathBuf>,
    /// Seconds between safety resyncs of every Runtime; 0 switches them off.
    #[arg(long, default_value_t = 3600.0)]
    resync: f64,
    /// Reconciles running at once.
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Serve `/metrics` (Prometheus text: reconciles, failures, migrations and their time)
    /// and `/healthz` on this address.
    #[arg(long)]
    metrics_listen: Option<std::net::SocketAddr>,
    /// How much of a maintenance window must be left for an upgrade that needs downtime to
    /// start (e.g. `20m`, `1h`).
    #[arg(long, default_value = "20m")]
    min_window_remaining: String,
}

pub async fn run(args: LifecycleArgs) -> anyhow::Result<()> {
    let client = fleetwatch_shared::kubeconfig::client_from_kubeconfig(&args.control_plane_kubeconfig)
        .await
        .map_err(anyhow::Error::msg)
        .context("cannot reach the control plane")?;
    let hub = match &args.hub {
        Some(url) => {
            let url: HubUrl = url.parse()?;
            let (Some(cert), Some(key)) = (&args.cert, &args.key) else {
                anyhow::bail!("--hub needs --cert and --key")
            };
            let tls = Arc::new(fleetwatch_certs::client_config(&crate::tls_files(cert, key, &args.ca))?);
            let mut opts = SubscriberOptions::new(url, tls);
            opts.durable = Some("lifecycle".into());
            opts.from = StartFrom::Latest;
            Some(opts)
        }
        None => None,
    };
    let resync =
        if args.resync > 0.0 { Some(Duration::try_from_secs_f64(args.resync).context("--resync")?) } else { None };
    let min_window_remaining: jiff::SignedDuration = args
        .min_window_remaining
        .parse()
        .with_context(|| format!("--min-window-remaining {:?}", args.min_window_remaining))?;
    let config = fleetwatch_lifecycle::LifecycleConfig {
        min_window_remaining,
        client: client.clone(),
        hub,
        resync,
        concurrency: args.concurrency.max(1),
        migrations: fleetwatch_lifecycle::migration::Registry::builtin(),
        ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
    };
    tracing::info!(resync_secs = resync.map_or(0.0, |d| d.as_secs_f64()), "lifecycle operator starting");
    println!("lifecycle operator running");
    let shutdown = crate::shutdown_on_signals();
    let metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let m = metrics.clone();
        let app = axum::Router::new().route("/healthz", axum::routing::get(|| async { "ok\n" })).route(
            "/metrics",
            axum::routing::get(move || {
                let m = m.clone();
                async move { m.encode() }
            }),
        );
        let sd = shutdown.clone();
        tokio::spawn(async move { axum::serve(listener, app).with_graceful_shutdown(sd.cancelled_owned()).await });
    }
    fleetwatch_lifecycle::run(config, metrics, shutdown).await;
    Ok(())
}
