//! The operator's health and metrics endpoint (`--metrics-listen`, and `fleetwatch up`'s
//! operator): `/metrics` ([`crate::Metrics`]), `/healthz` while the process answers, and
//! `/readyz` while the control plane's API server answers, the one thing the operator
//! cannot act without.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::Runtime;
use fleetwatch_telemetry::{Health, Readiness};

use crate::Metrics;

/// How long `/readyz` waits for the API server (the chart's probe gives up after 3 s).
pub(crate) const READY_TIMEOUT: Duration = Duration::from_secs(2);

/// The endpoint: `metrics` on `/metrics`, readiness asked of the control plane `client`.
pub fn health(metrics: Arc<Metrics>, client: kube::Client) -> Health {
    let runtimes: kube::Api<Runtime> = kube::Api::all(client);
    Health::new(move || metrics.encode()).ready(move || readiness(runtimes.clone()))
}

/// Ready while the API server answers one cheap list (a single Runtime's metadata) within
/// [`READY_TIMEOUT`].
pub(crate) async fn readiness(runtimes: kube::Api<Runtime>) -> Readiness {
    let one = kube::api::ListParams::default().limit(1);
    match tokio::time::timeout(READY_TIMEOUT, runtimes.list_metadata(&one)).await {
        Ok(Ok(_)) => Ok(String::new()),
        Ok(Err(e)) => Err(format!("cannot list Runtimes: {}", crate::error::plain(&e))),
        Err(_) => Err(format!("the API server did not answer within {} s", READY_TIMEOUT.as_secs())),
    }
}
