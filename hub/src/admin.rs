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
    body.push_str(&scrape(&ctx).await);
    ([(header::CONTENT_TYPE, "application/openmetrics-text; version=1.0.0; charset=utf-8")], body)
}

/// The families read at scrape time (see [`crate::metrics`]): bus size and evictions,
/// readiness, per-cluster liveness, client certificate expiry, subscriber lag.
async fn scrape(ctx: &Context) -> String {
    use crate::metrics::Text;
    let bus = &ctx.sessions.bus;
    let now = jiff::Timestamp::now();
    let now_secs = now.as_millisecond() as f64 / 1000.0;
    let mut t = Text::default();
    let last = bus.last_offset();
    t.single("fleetwatch_hub_bus_records", "gauge", "Records retained in the bus", bus.retained() as f64);
    t.single("fleetwatch_hub_bus_last_offset", "gauge", "Offset of the newest record", last as f64);
    t.single(
        "fleetwatch_hub_bus_first_offset",
        "gauge",
        "Offset of the oldest retained record",
        bus.first_offset() as f64,
    );
    t.single(
        "fleetwatch_hub_bus_evicted_records",
        "counter",
        "Records evicted by retention since the log began (offsets below the oldest retained one)",
        bus.first_offset().saturating_sub(1) as f64,
    );
    t.single("fleetwatch_hub_bus_bytes", "gauge", "Bytes of records retained in the bus", bus.retained_bytes() as f64);
    t.single(
        "fleetwatch_hub_bus_writable",
        "gauge",
        "Whether the bus can store records (0 while writes fail)",
        f64::from(u8::from(bus.health().is_ok())),
    );
    t.single(
        "fleetwatch_hub_bus_write_failures",
        "counter",
        "Batches refused because a write failed",
        bus.write_failures() as f64,
    );
    let ready = checks(ctx).iter().all(|c| c.state.is_ok());
    t.single(
        "fleetwatch_hub_ready",
        "gauge",
        "Whether /readyz answers ready (1) or not (0)",
        f64::from(u8::from(ready)),
    );

    // Per cluster this replica knows: connected, last heard of, sessions opened.
    let clusters = ctx.sessions.registry.list();
    t.family("fleetwatch_hub_cluster_connected", "gauge", "Whether the cluster's agent is connected to this hub");
    for c in &clusters {
        t.sample("fleetwatch_hub_cluster_connected", &[("cluster", &c.cluster)], f64::from(u8::from(c.connected)));
    }
    t.family(
        "fleetwatch_hub_cluster_last_seen_timestamp_seconds",
        "gauge",
        "When this hub last heard from the cluster's agent (Unix seconds)",
    );
    for c in &clusters {
        if let Some(seen) = c.last_seen {
            let v = seen.as_millisecond() as f64 / 1000.0;
            t.sample("fleetwatch_hub_cluster_last_seen_timestamp_seconds", &[("cluster", &c.cluster)], v);
        }
    }
    t.family("fleetwatch_hub_cluster_sessions", "counter", "Agent sessions opened per cluster since the hub started");
    for c in &clusters {
        t.sample("fleetwatch_hub_cluster_sessions_total", &[("cluster", &c.cluster)], c.sessions as f64);
    }

    t.family(
        "fleetwatch_hub_cluster_watches",
        "gauge",
        "Watches of each connected cluster's agent, by phase (running, starting, kind-not-found, forbidden, error)",
    );
    for c in clusters.iter().filter(|c| c.connected) {
        let mut phases: std::collections::BTreeMap<String, u64> = Default::default();
        for w in &c.watches {
            *phases.entry(w.phase.to_string()).or_default() += 1;
        }
        for (phase, n) in phases {
            t.sample("fleetwatch_hub_cluster_watches", &[("cluster", &c.cluster), ("phase", &phase)], n as f64);
        }
    }

    // Certificates: the hub's own, and the client certificates of the open connections.
    t.single(
        "fleetwatch_hub_cert_expiry_timestamp_seconds",
        "gauge",
        "When the hub's own certificate in force expires (Unix seconds)",
        ctx.tls.not_after().as_millisecond() as f64 / 1000.0,
    );
    let mut earliest: Option<jiff::Timestamp> = None;
    let mut agents: std::collections::BTreeMap<String, jiff::Timestamp> = Default::default();
    for (peer, _) in ctx.sessions.registry.open_connections() {
        earliest = Some(earliest.map_or(peer.not_after, |e| e.min(peer.not_after)));
        let cluster = peer
            .identity
            .parse::<fleetwatch_protocol::identity::Identity>()
            .ok()
            .and_then(|id| id.cluster_id().map(str::to_string));
        if let Some(cluster) = cluster {
            let e = agents.entry(cluster).or_insert(peer.not_after);
            *e = (*e).min(peer.not_after);
        }
    }
    t.family(
        "fleetwatch_hub_agent_cert_expiry_timestamp_seconds",
        "gauge",
        "When the certificate of each connected agent expires (Unix seconds)",
    );
    for (cluster, not_after) in &agents {
        let v = not_after.as_millisecond() as f64 / 1000.0;
        t.sample("fleetwatch_hub_agent_cert_expiry_timestamp_seconds", &[("cluster", cluster)], v);
    }
    t.family(
        "fleetwatch_hub_client_cert_earliest_expiry_seconds",
        "gauge",
        "Seconds until the earliest expiry among the certificates of connected agents and subscribers",
    );
    if let Some(e) = earliest {
        let v = e.as_millisecond() as f64 / 1000.0 - now_secs;
        t.sample("fleetwatch_hub_client_cert_earliest_expiry_seconds", &[], v);
    }

    // Subscriber lag: records not acked yet, and the age of the oldest of them.
    let subs = ctx.sessions.metrics.subscribers.all();
    // Several sessions of one name (instances without a durable name): the worst one.
    let mut lags: std::collections::BTreeMap<(&str, &str), (u64, f64)> = Default::default();
    for p in &subs {
        let (records, oldest) = p.lag(last);
        let age = match oldest {
            Some(offset) => match bus.read(offset, 1).await {
                Ok(read) => read.records.first().map_or(0.0, |r| (now_secs - r.time_ms as f64 / 1000.0).max(0.0)),
                Err(_) => 0.0,
            },
            None => 0.0,
        };
        let e = lags.entry((p.name.as_str(), p.durable.as_str())).or_insert((0, 0.0));
        *e = (e.0.max(records), e.1.max(age));
    }
    t.family("fleetwatch_hub_subscriber_lag_records", "gauge", "Records a subscriber session has not acked yet");
    for ((name, durable), (records, _)) in &lags {
        t.sample(
            "fleetwatch_hub_subscriber_lag_records",
            &[("subscriber", name), ("durable", durable)],
            *records as f64,
        );
    }
    t.family(
        "fleetwatch_hub_subscriber_lag_seconds",
        "gauge",
        "Age of the oldest record a subscriber session has not acked yet",
    );
    for ((name, durable), (_, age)) in &lags {
        t.sample("fleetwatch_hub_subscriber_lag_seconds", &[("subscriber", name), ("durable", durable)], *age);
    }
    t.finish()
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
