//! The admin endpoint (plain HTTP): `/healthz`, `/readyz`, `/metrics`, `/api/v1/clusters`,
//! and with `fault_injection` the test hook `POST /debug/faults/storage?fail_for_ms=N`.
//!
//! `/readyz` aggregates named checks ([`checks`]): `200 ready: bus ok` when all pass,
//! otherwise `503 not ready: bus: no space left on device (…)` listing each failing check
//! as `name: reason`, separated by `; `.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Query, State};
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::{get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::Context;

pub(crate) async fn serve(listener: TcpListener, ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut app = Router::new()
        .route("/healthz", get(|| async { "ok\n" }))
        .route("/readyz", get(ready))
        .route("/metrics", get(metrics))
        .route("/api/v1/clusters", get(clusters));
    if ctx.config.fault_injection {
        // Only with --fault-injection: otherwise the route does not exist (404).
        app = app.route("/debug/faults/storage", post(storage_fault));
    }
    let app = app.with_state(ctx);
    let result = axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await;
    if let Err(e) = result {
        tracing::error!(error = %e, "admin endpoint failed");
    }
}

/// One readiness check: its name and `Err(reason)` when failing.
pub(crate) struct Check {
    /// Short name shown in the answer, e.g. `bus`.
    pub name: &'static str,
    /// `Err(why)` when not ready.
    pub state: Result<(), String>,
}

/// Every readiness check. Add a check here to make `/readyz` depend on it.
pub(crate) fn checks(ctx: &Context) -> Vec<Check> {
    let mut checks = vec![Check { name: "bus", state: ctx.sessions.bus.health() }];
    checks.extend(ctx.readiness().into_iter().map(|(name, state)| Check { name, state }));
    checks
}

async fn ready(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let checks = checks(&ctx);
    let failing: Vec<String> =
        checks.iter().filter_map(|c| c.state.as_ref().err().map(|e| format!("{}: {e}", c.name))).collect();
    if failing.is_empty() {
        let ok: Vec<String> = checks.iter().map(|c| format!("{} ok", c.name)).collect();
        (StatusCode::OK, format!("ready: {}\n", ok.join(", ")))
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {}\n", failing.join("; ")))
    }
}

#[derive(serde::Deserialize)]
struct FaultQuery {
    fail_for_ms: u64,
}

/// Makes every bus disk write fail with ENOSPC for `fail_for_ms` milliseconds.
async fn storage_fault(State(ctx): State<Arc<Context>>, Query(q): Query<FaultQuery>) -> impl IntoResponse {
    if !ctx.sessions.bus.is_durable() {
        return (StatusCode::CONFLICT, "the bus has no data directory: nothing to fail\n".to_string());
    }
    match ctx.sessions.bus.inject_storage_fault(std::time::Duration::from_millis(q.fail_for_ms)) {
        Ok(()) => (StatusCode::OK, format!("storage writes fail for {} ms\n", q.fail_for_ms)),
        Err(e) => (StatusCode::CONFLICT, format!("{e}\n")),
    }
}

async fn metrics(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let mut body = ctx.sessions.metrics.encode();
    // Gauges read at scrape time rather than kept up to date on every append.
    body = body.replace("# EOF\n", "");
    body.push_str(&format!(
        "# HELP fleetwatch_hub_bus_records Records retained in the bus.\n# TYPE fleetwatch_hub_bus_records gauge\nfleetwatch_hub_bus_records {}\n# HELP fleetwatch_hub_bus_last_offset Offset of the newest record.\n# TYPE fleetwatch_hub_bus_last_offset gauge\nfleetwatch_hub_bus_last_offset {}\n# HELP fleetwatch_hub_bus_bytes Bytes of records retained in the bus.\n# TYPE fleetwatch_hub_bus_bytes gauge\nfleetwatch_hub_bus_bytes {}\n# HELP fleetwatch_hub_bus_writable Whether the bus can store records (0 while disk writes fail).\n# TYPE fleetwatch_hub_bus_writable gauge\nfleetwatch_hub_bus_writable {}\n# HELP fleetwatch_hub_bus_write_failures Batches refused because a disk write failed.\n# TYPE fleetwatch_hub_bus_write_failures counter\nfleetwatch_hub_bus_write_failures_total {}\n# EOF\n",
        ctx.sessions.bus.retained(),
        ctx.sessions.bus.last_offset(),
        ctx.sessions.bus.retained_bytes(),
        u8::from(ctx.sessions.bus.health().is_ok()),
        ctx.sessions.bus.write_failures()
    ));
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

/// This replica's clusters, plus, on a shared bus, those of the other replicas (`hub` says
/// which replica an entry comes from; a cluster connected elsewhere replaces a
/// disconnected entry here).
async fn clusters(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let local = serde_json::to_value(ctx.sessions.registry.list()).unwrap_or_default();
    if !ctx.sessions.bus.is_shared() {
        return axum::Json(serde_json::json!({ "clusters": local }));
    }
    let others = match ctx.sessions.bus.shared_clusters(&ctx.replica).await {
        Ok(o) => o,
        Err(e) => {
            tracing::debug!(error = %e, "cannot read the other replicas' clusters");
            Vec::new()
        }
    };
    axum::Json(serde_json::json!({ "clusters": merge_replicas(&ctx.replica, local, others) }))
}

/// Merges cluster lists of several replicas (see [`clusters`]).
fn merge_replicas(
    me: &str,
    local: serde_json::Value,
    others: Vec<(String, serde_json::Value)>,
) -> Vec<serde_json::Value> {
    let mut by_cluster: std::collections::BTreeMap<String, serde_json::Value> = std::collections::BTreeMap::new();
    let tagged = |hub: &str, list: serde_json::Value| {
        let hub = hub.to_string();
        list.as_array().cloned().unwrap_or_default().into_iter().filter_map(move |mut c| {
            let name = c["cluster"].as_str()?.to_string();
            c["hub"] = hub.clone().into();
            Some((name, c))
        })
    };
    for (name, c) in tagged(me, local) {
        by_cluster.insert(name, c);
    }
    for (hub, list) in others {
        for (name, c) in tagged(&hub, list) {
            let replace = match by_cluster.get(&name) {
                None => true,
                Some(have) => have["connected"] != true && c["connected"] == true,
            };
            if replace {
                by_cluster.insert(name, c);
            }
        }
    }
    by_cluster.into_values().collect()
}

#[cfg(test)]
mod merge_tests {
    use serde_json::json;

    #[test]
    fn a_cluster_connected_elsewhere_wins_over_a_disconnected_entry_here() {
        let local = json!([{"cluster": "a", "connected": false}, {"cluster": "b", "connected": true}]);
        let others = vec![(
            "hub-2".to_string(),
            json!([{"cluster": "a", "connected": true}, {"cluster": "b", "connected": false}, {"cluster": "c", "connected": true}]),
        )];
        let merged = super::merge_replicas("hub-1", local, others);
        let view: Vec<(String, String, bool)> = merged
            .iter()
            .map(|c| (c["cluster"].as_str().unwrap().into(), c["hub"].as_str().unwrap().into(), c["connected"] == true))
            .collect();
        assert_eq!(
            view,
            vec![
                ("a".into(), "hub-2".into(), true),
                ("b".into(), "hub-1".into(), true),
                ("c".into(), "hub-2".into(), true)
            ]
        );
    }
}
