//! `fleetwatch relay klm|webhook`: durable subscribers that hand each event to another
//! system and acknowledge the hub only after it answered 2xx. Wiring only: the relays are
//! [`Sink`](fleetwatch_client::sink::Sink)s in `fleetwatch-relay`; see docs/relays.md.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, Subcommand, ValueEnum};
use fleetwatch_client::sink::{Sink, pump};
use fleetwatch_client::subscriber::{SubscriberOptions, Subscription};
use fleetwatch_protocol::message::StartFrom;
use fleetwatch_relay::http::HttpOptions;
use fleetwatch_relay::identity::{IdentityMinter, IdentityOptions};
use fleetwatch_relay::klm::{KlmConfig, KlmSink, Route, Routes};
use fleetwatch_relay::metrics::Metrics;
use fleetwatch_relay::webhook::{WebhookConfig, WebhookSink};
use tracing::Instrument;

#[derive(Args)]
pub struct RelayArgs {
    #[command(subcommand)]
    relay: RelayCommand,
}

#[derive(Subcommand)]
enum RelayCommand {
    /// Relay events to Kyma lifecycle-manager's listener (runtime-watcher's v2 contract):
    /// `POST {target}/v2/{component}/event` with the watched object and its kind, the
    /// runtime id as the CN of a certificate in X-Forwarded-Client-Cert.
    Klm(KlmArgs),
    /// Relay events as CloudEvents (structured mode, or batches) to an HTTP endpoint.
    Webhook(WebhookArgs),
}

/// What both relays share: the hub, the durable subscription, the target, metrics.
#[derive(Args)]
struct CommonArgs {
    /// The hub and the relay's subscriber certificate.
    #[command(flatten)]
    conn: crate::HubClientArgs,
    /// Durable subscription name: the hub keeps the relay's position under it, so a
    /// restarted relay resumes after the last event its target accepted.
    #[arg(long, env = "FLEETWATCH_NAME")]
    name: String,
    /// Only events of these clusters (repeatable); all when absent.
    #[arg(long = "cluster", env = "FLEETWATCH_CLUSTER", value_delimiter = ',')]
    clusters: Vec<String>,
    /// Where to start when the hub has no stored position for --name.
    #[arg(long, env = "FLEETWATCH_FROM", value_enum, default_value_t = From::Earliest)]
    from: From,
    /// CA bundle the target's certificate must chain to (repeatable); without it an https
    /// target is checked against the platform's roots.
    #[arg(long, env = "FLEETWATCH_TARGET_CA")]
    target_ca: Vec<PathBuf>,
    /// Client certificate presented to the target (mutual TLS; needs --target-key and
    /// --target-ca).
    #[arg(long, env = "FLEETWATCH_TARGET_CERT", requires = "target_key")]
    target_cert: Option<PathBuf>,
    /// Private key of --target-cert.
    #[arg(long, env = "FLEETWATCH_TARGET_KEY", requires = "target_cert")]
    target_key: Option<PathBuf>,
    /// Seconds one request to the target may take (connect and answer); past it the
    /// request counts as failed and is retried.
    #[arg(long, env = "FLEETWATCH_TARGET_TIMEOUT", default_value_t = 10.0)]
    target_timeout: f64,
    /// Serve `/metrics` (Prometheus text: delivered, retried, skipped-4xx, refused events
    /// by target), `/healthz` and `/readyz` on this plain-HTTP address. `/readyz` answers
    /// 503 with the cause until the relay has subscribed to the hub, and while a target
    /// failed 3 requests in a row (retried, nothing delivered meanwhile).
    #[arg(long, env = "FLEETWATCH_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Keep what the target refuses for good (400, 413, 422) in DIR/<relay>.jsonl (one JSON
    /// line per request: target, status, answer, request) and acknowledge it only then.
    /// Without it such events are skipped and counted (fleetwatch_relay_skipped_4xx_total).
    #[arg(long, env = "FLEETWATCH_DEAD_LETTER", value_name = "DIR")]
    dead_letter: Option<std::path::PathBuf>,
    /// Most bytes of the dead-letter file. When the next line would pass it, the relay stops
    /// acknowledging and retries (the events wait at the hub) until the file is moved away.
    /// A size: bytes, or e.g. 64Mi, 1G.
    #[arg(long, env = "FLEETWATCH_DEAD_LETTER_MAX_BYTES", default_value = "64Mi", value_parser = crate::size::parse)]
    dead_letter_max_bytes: u64,
}

/// The dead-letter file of `relay`, when --dead-letter is given.
fn dead_letter(c: &CommonArgs, relay: &str) -> anyhow::Result<Option<Arc<fleetwatch_relay::dead_letter::DeadLetter>>> {
    let Some(dir) = &c.dead_letter else { return Ok(None) };
    let dl = fleetwatch_relay::dead_letter::DeadLetter::open(dir, relay, c.dead_letter_max_bytes)?;
    Ok(Some(Arc::new(dl)))
}

#[derive(Clone, Copy, ValueEnum)]
enum From {
    /// The oldest event the hub still has.
    Earliest,
    /// Only new events.
    Latest,
}

#[derive(Args)]
struct WebhookArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The URL every event (or batch) is posted to.
    #[arg(long, env = "FLEETWATCH_TARGET")]
    target: String,
    /// Only events whose CloudEvents type starts with this (repeatable), e.g.
    /// `dev.fleetwatch.object`; resync-required markers are always sent.
    #[arg(long = "type", env = "FLEETWATCH_TYPE", value_delimiter = ',')]
    types: Vec<String>,
    /// Events per request: 1 posts each as `application/cloudevents+json`, more posts
    /// JSON arrays as `application/cloudevents-batch+json` (at most 1000).
    #[arg(long, env = "FLEETWATCH_BATCH", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=1000))]
    batch: u16,
    /// Most bytes of one batch body (a single larger event still goes, alone). A size:
    /// bytes, or e.g. 1Mi.
    #[arg(long, env = "FLEETWATCH_BATCH_MAX_BYTES", default_value = "1Mi", value_parser = crate::size::parse)]
    batch_max_bytes: u64,
    /// File with a secret: every request then carries `X-Fleetwatch-Signature:
    /// sha256=<hex HMAC-SHA256 of the body>` (a trailing newline in the file is ignored).
    #[arg(long, env = "FLEETWATCH_HMAC_SECRET_FILE")]
    hmac_secret_file: Option<PathBuf>,
}

#[derive(Args)]
struct KlmArgs {
    #[command(flatten)]
    common: CommonArgs,
    /// The listener's base URL (behind which `/v2/{component}/event` is served). Required
    /// unless --from-watchers, where each Watcher's serviceInfo is used without it.
    #[arg(long, env = "FLEETWATCH_TARGET", required_unless_present = "from_watchers")]
    target: Option<String>,
    /// The component whose listener receives the events (KLM: `lifecycle-manager`).
    /// Required unless --from-watchers, where each Watcher's manager names it.
    #[arg(long, env = "FLEETWATCH_COMPONENT", required_unless_present = "from_watchers", requires = "target")]
    component: Option<String>,
    /// Only events of these watches (WatchConfig names, repeatable); all when absent.
    #[arg(long = "watch", env = "FLEETWATCH_WATCH", value_delimiter = ',')]
    watches: Vec<String>,
    /// CA certificate the per-cluster identity certificates (X-Forwarded-Client-Cert) are
    /// signed with; with --xfcc-ca-key. Without both, an ephemeral CA made at start.
    #[arg(long, env = "FLEETWATCH_XFCC_CA_CERT", requires = "xfcc_ca_key")]
    xfcc_ca_cert: Option<PathBuf>,
    /// Private key of --xfcc-ca-cert.
    #[arg(long, env = "FLEETWATCH_XFCC_CA_KEY", requires = "xfcc_ca_cert")]
    xfcc_ca_key: Option<PathBuf>,
    /// Seconds a minted identity certificate is valid (renewed after two thirds).
    #[arg(long, env = "FLEETWATCH_XFCC_LIFETIME", default_value_t = 3600)]
    xfcc_lifetime: u64,
    /// Most objects remembered (all clusters) to answer resync-required with one event per
    /// object; a cluster past it also gets the fallback (its Kyma object).
    #[arg(long, env = "FLEETWATCH_MAX_KNOWN_OBJECTS", default_value_t = 100_000)]
    max_known_objects: usize,
    /// Read KLM's Watcher resources (operator.kyma-project.io/v1beta2) from the control
    /// plane this kubeconfig reaches, create the equivalent WatchConfigs there (the hub
    /// must read WatchConfigs from the same control plane) and route each Watcher's events
    /// to its manager's listener.
    #[arg(long, env = "FLEETWATCH_FROM_WATCHERS")]
    from_watchers: Option<PathBuf>,
}

pub async fn run(args: RelayArgs) -> anyhow::Result<()> {
    match args.relay {
        RelayCommand::Webhook(a) => run_webhook(a).await,
        RelayCommand::Klm(a) => run_klm(a).await,
    }
}

fn http_client(c: &CommonArgs) -> anyhow::Result<reqwest::Client> {
    let timeout = Duration::try_from_secs_f64(c.target_timeout)
        .ok()
        .filter(|d| !d.is_zero())
        .context("--target-timeout must be a positive number of seconds")?;
    let opts = HttpOptions {
        target_ca: c.target_ca.clone(),
        client_cert: c.target_cert.clone().zip(c.target_key.clone()),
        timeout,
    };
    Ok(fleetwatch_relay::http::client(&opts)?)
}

fn check_url(url: &str, flag: &str) -> anyhow::Result<()> {
    let parsed = reqwest::Url::parse(url).with_context(|| format!("{flag} {url:?} is not a URL"))?;
    anyhow::ensure!(matches!(parsed.scheme(), "http" | "https"), "{flag} {url:?} must be http:// or https://");
    Ok(())
}

async fn serve_metrics(
    addr: Option<std::net::SocketAddr>,
    metrics: Arc<Metrics>,
    shutdown: tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let Some(addr) = addr else { return Ok(()) };
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    tokio::spawn(metrics.health().serve(listener, shutdown));
    Ok(())
}

/// Subscribes and pumps deliveries into `sink` until a signal.
async fn pump_into<S: Sink>(
    c: &CommonArgs,
    metrics: &Metrics,
    sink: &mut S,
    shutdown: &tokio_util::sync::CancellationToken,
) -> anyhow::Result<()> {
    let (hub, files) = c.conn.resolve()?;
    // Followed by content: a renewed certificate is used without a restart.
    let tls = fleetwatch_client::client_tls::ClientTls::from_files(files)?;
    metrics.set_client_tls(tls.clone());
    let mut opts = SubscriberOptions::new(hub, tls);
    opts.tls_reload_interval = c.conn.tls_reload_interval()?;
    opts.tls_watch = c.conn.tls_watch();
    opts.durable = Some(c.name.clone());
    opts.clusters = c.clusters.clone();
    opts.from = match c.from {
        From::Earliest => StartFrom::Earliest,
        From::Latest => StartFrom::Latest,
    };
    // A relay sends one event (or batch) at a time: a small window keeps redelivery after
    // a restart short.
    opts.max_in_flight = 1_000;
    let mut sub = Subscription::connect(opts).await.context("cannot subscribe")?;
    metrics.set_subscribed();
    println!("relay {} running", sink.name());
    let result = pump(&mut sub, sink, shutdown).await;
    sub.close().await;
    result?;
    Ok(())
}

async fn run_webhook(a: WebhookArgs) -> anyhow::Result<()> {
    check_url(&a.target, "--target")?;
    let client = http_client(&a.common)?;
    let mut cfg = WebhookConfig::new(a.target.clone());
    cfg.batch = usize::from(a.batch);
    cfg.max_batch_bytes = usize::try_from(a.batch_max_bytes).unwrap_or(usize::MAX).max(1024);
    cfg.types = a.types;
    cfg.dead_letter = dead_letter(&a.common, "webhook")?;
    if let Some(path) = &a.hmac_secret_file {
        let secret =
            std::fs::read(path).with_context(|| format!("cannot read --hmac-secret-file {}", path.display()))?;
        let secret = secret.strip_suffix(b"\n").unwrap_or(&secret);
        let secret = secret.strip_suffix(b"\r").unwrap_or(secret);
        anyhow::ensure!(!secret.is_empty(), "--hmac-secret-file {} is empty", path.display());
        cfg = cfg.with_secret(secret);
    }
    let metrics = Arc::new(Metrics::new("webhook"));
    let shutdown = crate::shutdown_on_signals();
    serve_metrics(a.common.metrics_listen, metrics.clone(), shutdown.clone()).await?;
    let mut sink = WebhookSink::new(cfg, client, metrics.clone());
    let span = tracing::info_span!("relay", relay = "webhook", target = %a.target);
    pump_into(&a.common, &metrics, &mut sink, &shutdown).instrument(span).await
}

async fn run_klm(a: KlmArgs) -> anyhow::Result<()> {
    if let Some(t) = &a.target {
        check_url(t, "--target")?;
    }
    let client = http_client(&a.common)?;
    let id_opts = IdentityOptions { lifetime: Duration::from_secs(a.xfcc_lifetime.max(60)), ..Default::default() };
    let identity = match (&a.xfcc_ca_cert, &a.xfcc_ca_key) {
        (Some(cert), Some(key)) => IdentityMinter::from_files(cert, key, id_opts)?,
        _ => {
            tracing::info!("no --xfcc-ca-cert/--xfcc-ca-key: identity certificates are signed by an ephemeral CA");
            IdentityMinter::ephemeral(id_opts)?
        }
    };
    let default = a.target.clone().zip(a.component.clone()).map(|(target, component)| Route { target, component });
    let metrics = Arc::new(Metrics::new("klm"));
    if let Some(r) = &default {
        metrics.register_target(&r.url());
    }
    let (routes_tx, routes_rx) =
        tokio::sync::watch::channel(Arc::new(Routes { by_watch: Default::default(), default: default.clone() }));
    let shutdown = crate::shutdown_on_signals();
    serve_metrics(a.common.metrics_listen, metrics.clone(), shutdown.clone()).await?;
    if let Some(kubeconfig) = &a.from_watchers {
        let kube = fleetwatch_client::kubeconfig::client_from_kubeconfig(kubeconfig)
            .await
            .with_context(|| format!("--from-watchers {}", kubeconfig.display()))?;
        let (synced_tx, synced_rx) = tokio::sync::oneshot::channel();
        tokio::spawn(fleetwatch_relay::watchers::follow(
            kube,
            a.target.clone(),
            a.common.name.clone(),
            default.clone(),
            routes_tx,
            synced_tx,
            shutdown.clone(),
        ));
        // Events are consumed only once the routes of every Watcher are known.
        tokio::select! {
            r = synced_rx => r.context("following Watchers stopped before the first pass")?,
            _ = shutdown.cancelled() => return Ok(()),
        }
        tracing::info!(routes = routes_rx.borrow().by_watch.len(), "routes from Watchers ready");
    }
    let cfg = KlmConfig {
        watches: a.watches,
        max_known: a.max_known_objects,
        dead_letter: dead_letter(&a.common, "klm")?,
        ..KlmConfig::default()
    };
    let mut sink = KlmSink::new(cfg, client, Arc::new(identity), routes_rx, metrics.clone());
    let span = tracing::info_span!("relay", relay = "klm");
    pump_into(&a.common, &metrics, &mut sink, &shutdown).instrument(span).await
}
