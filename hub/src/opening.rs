//! Opening the bus while the hub serves.
//!
//! A hub started while its storage fails for a while (a full disk with a damaged segment
//! whose resync marker must be written first, JetStream answering 503 right after it came
//! back, a frozen NATS node, NATS not up yet) does not exit: under a supervisor that is a
//! crash-loop whose growing backoff keeps the replica down long after the fault passed. It
//! serves on a [`DeferredBus`] instead — `/healthz` alive, `/readyz` 503 naming the cause,
//! agents and subscribers refused as `unavailable` (they retry) — and tries again with
//! backoff until the bus opens; then it is ready without a restart. Only what lasts until
//! someone acts ([`BusError::lasts`]: a setting, data of a newer format) ends the start.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_bus::{Bus, BusError, BusOptions, DeferredBus};
use futures_util::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::config::HubConfig;
use crate::context::Context;
use crate::error::HubError;

/// One attempt to open the hub's bus. Called again after each failure that passes, so it
/// must start from scratch each time (the simulation passes its own, over its JetStream).
pub type OpenBus = Arc<dyn Fn() -> BoxFuture<'static, Result<Arc<dyn Bus>, BusError>> + Send + Sync>;

/// The first wait between attempts; it doubles up to [`MAX_WAIT`].
const FIRST_WAIT: Duration = Duration::from_millis(250);
/// The longest wait between attempts: a passing fault costs at most this much readiness.
pub(crate) const MAX_WAIT: Duration = Duration::from_secs(5);

/// The bus `config` names: JetStream with `--bus`, the segment log with `--data-dir`,
/// memory otherwise.
pub(crate) fn from_config(config: &HubConfig) -> OpenBus {
    let nats = config.nats.clone().map(|n| fleetwatch_bus::NatsOptions { retention: config.retention, ..n });
    let local = BusOptions {
        dir: config.data_dir.clone(),
        retention: config.retention,
        segment_bytes: config.segment_bytes,
        writer: config.bus_writer,
        ..BusOptions::default()
    };
    match nats {
        Some(nats) => Arc::new(move || {
            let nats = nats.clone();
            Box::pin(async move {
                let bus: Arc<dyn Bus> = fleetwatch_bus::NatsBus::open(nats).await?;
                Ok(bus)
            })
        }),
        None => embedded(local),
    }
}

/// Opens the embedded bus `opts` names (the segment log with a directory, memory
/// otherwise), the same way at every attempt.
pub fn embedded(opts: BusOptions) -> OpenBus {
    Arc::new(move || {
        let opts = opts.clone();
        Box::pin(async move { fleetwatch_bus::open(opts) })
    })
}

/// Whether the bus `config` names keeps records across restarts (what the hub says about
/// its history before the bus is open).
pub(crate) fn durable(config: &HubConfig) -> bool {
    config.nats.is_some() || config.data_dir.is_some()
}

/// The first attempt, at start: `Ok(true)` open, `Ok(false)` failed for a while (the hub
/// starts anyway and [`keep_opening`] goes on), `Err` when the failure lasts.
pub(crate) async fn first(ctx: &Context, open: &OpenBus) -> Result<bool, HubError> {
    match open().await {
        Ok(bus) => {
            adopt(ctx, bus);
            Ok(true)
        }
        Err(e) if e.lasts() => Err(e.into()),
        Err(e) => {
            tracing::warn!(
                error = %e,
                "cannot open the bus yet: serving unready (agents and subscribers are told to retry) and trying again"
            );
            ctx.storage.waiting(e.to_string());
            Ok(false)
        }
    }
}

/// Tries again with backoff until the bus opens or `shutdown`. A failure that lasts is
/// kept as the cause and retried all the same: the process already serves, and an
/// operator may fix the setting (a credentials file, permissions) in place.
pub(crate) async fn keep_opening(ctx: Arc<Context>, open: OpenBus, shutdown: CancellationToken) {
    let started = tokio::time::Instant::now();
    let mut wait = FIRST_WAIT;
    let mut attempts = 1u64;
    // The cause said last at WARN: a repeat of it is said at DEBUG only.
    let mut said = ctx.storage.health().err();
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        wait = (wait * 2).min(MAX_WAIT);
        attempts += 1;
        let attempt = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = open() => r,
        };
        match attempt {
            Ok(bus) => {
                tracing::info!(
                    attempts,
                    after = ?started.elapsed(),
                    "opened the bus: agents and subscribers are served"
                );
                adopt(&ctx, bus);
                return;
            }
            Err(e) => {
                let cause = e.to_string();
                if said.as_deref().is_some_and(|was| was.ends_with(&cause)) {
                    tracing::debug!(error = %cause, attempts, "cannot open the bus yet; trying again");
                } else {
                    tracing::warn!(error = %cause, attempts, "cannot open the bus yet; trying again");
                    said = Some(cause.clone());
                }
                ctx.storage.waiting(cause);
            }
        }
    }
}

/// Takes the opened bus on: what the hub sets from the bus before any session uses it,
/// then the bus itself.
fn adopt(ctx: &Context, bus: Arc<dyn Bus>) {
    // Subscribers of an earlier run may have read up to the log's end: markers already
    // there are never coalesced into (see `SessionRegistry::resync_pending`).
    ctx.sessions.registry.read_past(bus.last_offset());
    ctx.fleet.set_share(bus.replica_share());
    ctx.storage.open(bus);
}

/// Waits until the bus is open (`None`: `shutdown` came first).
pub(crate) async fn opened(storage: &DeferredBus, shutdown: &CancellationToken) -> Option<Arc<dyn Bus>> {
    tokio::select! {
        _ = shutdown.cancelled() => None,
        bus = storage.opened() => Some(bus),
    }
}
