//! The admin endpoint (plain HTTP): `/healthz`, `/readyz`, `/metrics`, `/api/v1/clusters`.

use std::sync::Arc;

use axum::Router;
use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Context;

pub(crate) async fn serve(listener: TcpListener, ctx: Arc<Context>, shutdown: CancellationToken) {
    let app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/v1/clusters", get(clusters))
        .with_state(ctx);
    let result = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
    if let Err(e) = result {
        tracing::error!(error = %e, "admin endpoint failed");
    }
}

async fn ready(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let failing: Vec<String> =
        ctx.readiness().into_iter().filter_map(|(name, r)| r.err().map(|e| format!("{name}: {e}\n"))).collect();
    if failing.is_empty() {
        (StatusCode::OK, "ready\n".to_string())
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready\n{}", failing.concat()))
    }
}

async fn metrics(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let mut body = ctx.metrics.encode();
    // Gauges read at scrape time rather than kept up to date on every append.
    body = body.replace("# EOF\n", "");
    body.push_str(&format!(
        "# HELP fleetwatch_hub_bus_records Records retained in the bus.\n# TYPE fleetwatch_hub_bus_records gauge\nfleetwatch_hub_bus_records {}\n# HELP fleetwatch_hub_bus_last_offset Offset of the newest record.\n# TYPE fleetwatch_hub_bus_last_offset gauge\nfleetwatch_hub_bus_last_offset {}\n# EOF\n",
        ctx.bus.retained(),
        ctx.bus.last_offset()
    ));
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

async fn clusters(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    axum::Json(serde_json::json!({ "clusters": ctx.registry.list() }))
}
