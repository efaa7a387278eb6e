//! The admin endpoint (plain HTTP): `/healthz`, `/readyz`, `/metrics`, the admin API
//! (`/api/v1/...`; the fleet-sized lists, counts and live stream are in `overview`), the
//! web view, and with `fault_injection` the test hook `POST /debug/faults/storage?fail_for_ms=N`.
//!
//! `/readyz` aggregates named checks ([`Context::checks`]): `200 ready: bus ok` when all pass,
//! otherwise `503 not ready: bus: no space left on device (…)` listing each failing check
//! as `name: reason`, separated by `; `.

pub mod auth;
pub(crate) mod list;
mod login;
mod overview;
pub(crate) mod stream;
mod tls;

use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::{FromRef, Path, Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::Next;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::{MethodRouter, get, post};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::fleet::{self, Rates};

/// Most browsers following the live overview at once; more get 503.
pub(crate) const MAX_STREAMS: usize = 64;
/// How often the live overview's changes are computed while someone follows it (and at
/// once when a cluster connects or disconnects or a Runtime changes).
pub(crate) const OVERVIEW_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// The admin endpoint's state: the hub's context and the live overview.
#[derive(Clone)]
pub(crate) struct Admin {
    pub(crate) ctx: Arc<Context>,
    /// Event totals of the last overview, for rates.
    rates: Arc<Mutex<Rates>>,
    /// The live overview's deltas (see `stream`): followers coalesce what they have
    /// not sent, so a slow browser never queues without bound.
    pub(crate) deltas: overview::Deltas,
    /// Places for followers of the live overview.
    pub(crate) streams: Arc<tokio::sync::Semaphore>,
    /// Browser sessions and the login rate limit.
    logins: Arc<login::Logins>,
}

impl FromRef<Admin> for Arc<Context> {
    fn from_ref(admin: &Admin) -> Self {
        admin.ctx.clone()
    }
}

/// Every route of the admin endpoint: path, methods, handler. The OpenAPI document
/// (`/api/v1/openapi.json`) lists exactly these (a test checks both ways).
pub(crate) fn routes() -> Vec<(&'static str, &'static [&'static str], MethodRouter<Admin>)> {
    vec![
        ("/healthz", &["get"], get(fleetwatch_telemetry::server::healthz)),
        ("/readyz", &["get"], get(ready)),
        ("/metrics", &["get"], get(metrics)),
        ("/api/v1/clusters", &["get"], get(overview::clusters)),
        ("/api/v1/clusters/{id}", &["get"], get(cluster)),
        ("/api/v1/subscriptions", &["get"], get(subscriptions_handler)),
        ("/api/v1/runtimes", &["get"], get(overview::runtimes)),
        ("/api/v1/summary", &["get"], get(overview::summary)),
        ("/api/v1/watchconfigs", &["get"], get(watchconfigs)),
        ("/api/v1/overview", &["get"], get(overview_handler)),
        ("/api/v1/overview/stream", &["get"], get(overview::overview_stream)),
        ("/api/v1/openapi.json", &["get"], get(openapi)),
        ("/", &["get"], get(page)),
        ("/clusters/{id}", &["get"], get(page)),
        ("/assets/app.js", &["get"], get(app_js)),
        ("/assets/app.css", &["get"], get(app_css)),
        ("/login", &["get", "post"], get(login_form).post(login)),
        // Only with --fault-injection (see `router`).
        ("/debug/faults/storage", &["post"], post(storage_fault)),
    ]
}

/// The OpenAPI 3 document of the admin endpoint.
pub(crate) const OPENAPI: &str = include_str!("openapi.json");

fn router(admin: Admin) -> Router {
    let mut app = Router::new();
    for (path, _, handler) in routes() {
        // The fault hook exists only with --fault-injection: otherwise 404.
        if path.starts_with("/debug/") && !admin.ctx.config.fault_injection {
            continue;
        }
        app = app.route(path, handler);
    }
    app.layer(axum::middleware::from_fn_with_state(admin.clone(), authenticate))
        .layer(axum::middleware::map_response(nosniff))
        .with_state(admin)
}

/// Every answer, errors and redirects included, says `X-Content-Type-Options: nosniff`.
async fn nosniff(mut resp: Response) -> Response {
    resp.headers_mut().entry(header::X_CONTENT_TYPE_OPTIONS).or_insert(header::HeaderValue::from_static("nosniff"));
    resp
}

/// The client address of an admin request (plain or TLS listener).
fn client_ip(req: &Request) -> std::net::IpAddr {
    let ext = req.extensions();
    ext.get::<axum::extract::ConnectInfo<std::net::SocketAddr>>()
        .map(|c| c.0.ip())
        .or_else(|| ext.get::<axum::extract::ConnectInfo<tls::AdminPeer>>().map(|c| c.0.addr.ip()))
        // Unknown: one shared budget (never none).
        .unwrap_or(std::net::IpAddr::V4(std::net::Ipv4Addr::UNSPECIFIED))
}

/// Lets a request through when [`auth::allowed`] says so, else 401.
async fn authenticate(State(admin): State<Admin>, req: Request, next: Next) -> Response {
    let headers = req.headers();
    let text = |name| headers.get(name).and_then(|v: &header::HeaderValue| v.to_str().ok());
    // The bearer token, or a browser session's cookie (a random id, never the token).
    let token = admin.ctx.admin_token.as_ref();
    // Every authentication path is throttled as the login page is ([`crate::admin::login`]):
    // a client past its wrong credentials gets 429 before anything is compared.
    // The token in its own header (through the Kubernetes API server's service proxy,
    // which consumes `Authorization`), checked as a bearer token is.
    let header_token =
        headers.get(auth::TOKEN_HEADER).and_then(|v| v.to_str().ok()).map(|t| format!("Bearer {}", t.trim()));
    let guarded = token.is_some()
        && !auth::is_open(req.uri().path())
        && (header_token.is_some() || auth::presented(text(header::AUTHORIZATION), text(header::COOKIE)).is_some());
    let ip = client_ip(&req);
    if guarded && let login::Gate::Limited(wait) = admin.logins.gate(ip) {
        return too_many(ip, wait);
    }
    let ok = auth::allowed(req.uri().path(), token, text(header::AUTHORIZATION), None)
        || header_token.as_deref().is_some_and(|h| auth::allowed(req.uri().path(), token, Some(h), None))
        || token
            .is_some_and(|t| auth::presented(None, text(header::COOKIE)).is_some_and(|id| admin.logins.valid(id, t)));
    if guarded && !ok {
        // Counted and summarised once a minute, not logged one line each.
        admin.logins.failed(ip);
    }
    // With --admin-client-ca, the rest needs a verified client certificate as well; a
    // connection whose peer is unknown counts as without one.
    let peer = req.extensions().get::<axum::extract::ConnectInfo<tls::AdminPeer>>().map(|p| p.0);
    let certified =
        admin.ctx.admin_tls.is_none() || auth::is_open(req.uri().path()) || peer.is_some_and(|p| p.verified_client);
    if !certified {
        tracing::debug!(peer = ?peer.map(|p| p.addr), path = req.uri().path(), "admin request without a client certificate refused");
        return (
            StatusCode::UNAUTHORIZED,
            "unauthorized: connect with a client certificate signed by the hub's --admin-client-ca\n",
        )
            .into_response();
    }
    if ok {
        return next.run(req).await;
    }
    let browser = text(header::ACCEPT).is_some_and(|a| a.contains("text/html"));
    if browser {
        return Redirect::to("/login").into_response();
    }
    (
        StatusCode::UNAUTHORIZED,
        [(header::WWW_AUTHENTICATE, "Bearer realm=\"fleetwatch-admin\"")],
        "unauthorized: send Authorization: Bearer <the token in --admin-token-file> (or the token in X-Fleetwatch-Admin-Token)\n",
    )
        .into_response()
}

pub(crate) async fn serve(listener: TcpListener, ctx: Arc<Context>, shutdown: CancellationToken) {
    let admin = Admin {
        ctx: ctx.clone(),
        rates: Arc::new(Mutex::new(Rates::default())),
        deltas: overview::Deltas::new(),
        streams: Arc::new(tokio::sync::Semaphore::new(MAX_STREAMS)),
        logins: Arc::default(),
    };
    tokio::spawn(overview::follow_overview(ctx.clone(), admin.deltas.clone(), shutdown.clone()));
    // Wrong admin tokens: one summary line per window.
    let (logins, stop) = (admin.logins.clone(), shutdown.clone());
    tokio::spawn(async move {
        let mut every = tokio::time::interval(login::WINDOW);
        every.tick().await;
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = every.tick() => {
                    if let Some(line) = logins.take_summary() {
                        tracing::warn!("{line}");
                    }
                }
            }
        }
    });
    let app = router(admin);
    let result = match ctx.admin_tls.clone() {
        Some(tls) => {
            let listener = tls::TlsListener::new(listener, tls, shutdown.clone());
            let app = app.into_make_service_with_connect_info::<tls::AdminPeer>();
            axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
        }
        None => {
            let app = app.into_make_service_with_connect_info::<std::net::SocketAddr>();
            axum::serve(listener, app).with_graceful_shutdown(shutdown.cancelled_owned()).await
        }
    };
    if let Err(e) = result {
        tracing::error!(error = %e, "admin endpoint failed");
    }
}

/// `/readyz`, answered as every component answers it ([`fleetwatch_telemetry::server::readyz`]).
async fn ready(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let checks = ctx.checks();
    let failing: Vec<String> =
        checks.iter().filter_map(|c| c.state.as_ref().err().map(|e| format!("{}: {e}", c.name))).collect();
    let state = if failing.is_empty() {
        let ok: Vec<String> = checks.iter().map(|c| format!("{} ok", c.name)).collect();
        Ok(ok.join(", "))
    } else {
        Err(failing.join("; "))
    };
    fleetwatch_telemetry::server::readyz(state)
}

#[derive(serde::Deserialize)]
struct FaultQuery {
    fail_for_ms: u64,
}

/// Makes every bus disk write fail with ENOSPC for `fail_for_ms` milliseconds.
async fn storage_fault(State(ctx): State<Arc<Context>>, Query(q): Query<FaultQuery>) -> impl IntoResponse {
    if !ctx.sessions.bus.stats().durable {
        return (StatusCode::CONFLICT, "the bus has no data directory: nothing to fail\n".to_string());
    }
    let Some(faults) = ctx.sessions.bus.fault_injection() else {
        return (StatusCode::CONFLICT, "this bus has no storage to fail\n".to_string());
    };
    match faults.inject_storage_fault(std::time::Duration::from_millis(q.fail_for_ms)) {
        Ok(()) => (StatusCode::OK, format!("storage writes fail for {} ms\n", q.fail_for_ms)),
        Err(e) => (StatusCode::CONFLICT, format!("{e}\n")),
    }
}

/// The instruments and the state read now ([`crate::scrape`]), as OpenMetrics or the text
/// format 0.0.4 for a scraper that asks for that instead (see
/// [`fleetwatch_telemetry::exposition`]).
async fn metrics(State(ctx): State<Arc<Context>>, headers: axum::http::HeaderMap) -> impl IntoResponse {
    fleetwatch_telemetry::server::metrics(&headers, crate::scrape::encode(&ctx).await)
}

/// This replica's clusters, plus, on a shared bus, those of the other replicas from the
/// fleet state it follows (`hub` says which replica an entry comes from; a cluster
/// connected elsewhere replaces a disconnected entry here; see `crate::fleet::state`). No
/// round trip to the bus. As rows: what lists filter, order and count by, the JSON built
/// only for the items answered (see `crate::fleet::rows`).
pub(crate) fn cluster_rows(ctx: &Context) -> Vec<crate::fleet::rows::Row> {
    let local = ctx.sessions.registry.list();
    if ctx.sessions.bus.replica_share().is_none() {
        return local.into_iter().map(|s| crate::fleet::rows::Row::local(s, None)).collect();
    }
    ctx.fleet.rows(local)
}

fn not_found(what: String) -> Response {
    (StatusCode::NOT_FOUND, axum::Json(serde_json::json!({ "error": what }))).into_response()
}

/// One cluster: its status (watches, inventory, certificate, conflicts) and, when its
/// agent is connected to this replica or was, its recent events.
async fn cluster(State(ctx): State<Arc<Context>>, Path(id): Path<String>) -> Response {
    let shared = ctx.sessions.bus.replica_share().is_some();
    // As the other replicas show it (the fleet state in memory: no round trip).
    let elsewhere = if shared { ctx.fleet.elsewhere(&id) } else { None };
    if let Some((status, recent)) = ctx.sessions.registry.get(&id) {
        let mut doc = serde_json::to_value(status).unwrap_or_default();
        doc["recentEvents"] = serde_json::to_value(recent).unwrap_or_default();
        if shared {
            doc["hub"] = ctx.replica.clone().into();
        }
        // Connected to another replica: that one's entry (without recent events).
        if doc["connected"] != true
            && let Some((true, other)) = elsewhere
        {
            return axum::Json(other).into_response();
        }
        return axum::Json(doc).into_response();
    }
    match elsewhere {
        Some((_, other)) => axum::Json(other).into_response(),
        None => not_found(format!("no cluster {id:?} has connected to this hub since it started")),
    }
}

/// The age in seconds of the record at `offset` (0 when it is gone or unreadable).
async fn age_of(ctx: &Context, offset: Option<u64>, now_secs: f64) -> f64 {
    let Some(offset) = offset else { return 0.0 };
    match ctx.sessions.bus.read(offset, 1).await {
        Ok(read) => read.records.first().map_or(0.0, |r| (now_secs - r.time_ms as f64 / 1000.0).max(0.0)),
        Err(_) => 0.0,
    }
}

/// Open subscriber sessions and durable subscriptions seen since the start, with lag.
async fn subscriptions(ctx: &Context) -> Vec<crate::fanout::Subscription> {
    let now_secs = jiff::Timestamp::now().as_millisecond() as f64 / 1000.0;
    let mut subs = ctx.sessions.fanout.subscriptions(ctx.sessions.bus.last_offset());
    for s in &mut subs {
        s.lag_seconds = (age_of(ctx, s.oldest, now_secs).await * 1000.0).round() / 1000.0;
    }
    subs
}

async fn subscriptions_handler(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let subs = subscriptions(&ctx).await;
    let access = &ctx.sessions.access;
    let policy = access.current();
    // Each subscription with what the policy grants its subscriber (none: refused).
    let subs: Vec<serde_json::Value> = subs
        .iter()
        .map(|s| {
            let mut v = serde_json::to_value(s).unwrap_or_default();
            if let (Some(p), Some(obj)) = (&policy, v.as_object_mut()) {
                obj.insert("grant".into(), serde_json::to_value(p.grant(&s.subscriber).as_deref()).unwrap_or_default());
            }
            v
        })
        .collect();
    let access_policy = match &policy {
        Some(p) => {
            // Where each grant comes from: the file, or a SubscriberAccessPolicy object.
            let sources = access.sources();
            let grants: Vec<serde_json::Value> = p
                .grants()
                .map(|g| {
                    let mut v = serde_json::to_value(g).unwrap_or_default();
                    if let Some(obj) = v.as_object_mut() {
                        obj.insert("source".into(), sources.get(&g.name).cloned().into());
                    }
                    v
                })
                .collect();
            serde_json::json!({
                "file": access.path().map(|p| p.display().to_string()),
                "fromControlPlane": access.grants_from_control_plane(),
                "stale": access.stale().or_else(|| access.objects_problem()),
                "grantsNobody": p.is_empty(),
                "grants": grants,
            })
        }
        None => serde_json::Value::Null,
    };
    axum::Json(serde_json::json!({
        "lastOffset": ctx.sessions.bus.last_offset(),
        "accessPolicy": access_policy,
        "subscriptions": subs,
    }))
}

/// Every WatchConfig in force and what the hub made of it, with the clusters whose agent
/// runs it; refused ones first.
async fn watch_verdicts(ctx: &Context) -> Vec<crate::watch_source::Verdict> {
    let mut verdicts = ctx.watch_verdicts.read().map(|v| v.clone()).unwrap_or_default();
    let running = crate::fleet::rows::clusters_by_watch(&cluster_rows(ctx));
    for v in &mut verdicts {
        v.clusters = running.get(v.name.as_str()).copied().unwrap_or(0);
    }
    verdicts.sort_by(|a, b| (a.accepted, &a.name).cmp(&(b.accepted, &b.name)));
    verdicts
}

async fn watchconfigs(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let verdicts = watch_verdicts(&ctx).await;
    let refused = verdicts.iter().filter(|v| !v.accepted).count();
    axum::Json(serde_json::json!({ "refused": refused, "watchConfigs": verdicts }))
}

/// The overview document (see [`crate::fleet`]): what the web view showed in one
/// document. Counted and ranked from the fleet's rows; the JSON is built only for the
/// clusters shown (at most [`fleet::OVERVIEW_CLUSTERS`], disconnected first), so its cost
/// at 50,000 clusters is a pass over the rows, not 50,000 documents.
async fn overview(admin: &Admin) -> serde_json::Value {
    let ctx = &admin.ctx;
    let mut list = cluster_rows(ctx);
    list.sort_unstable_by(|a, b| a.cluster.cmp(&b.cluster));
    let connected = list.iter().filter(|r| r.connected).count();
    let clusters_total = list.len();
    // Other replicas' clusters count toward the fleet's rate through their heartbeats
    // (their entries hold the counters as of their last write only).
    let events_total = list.iter().map(|r| r.own_events).sum::<u64>() + ctx.fleet.others_events();
    let (rates, total_rate) = match admin.rates.lock() {
        Ok(mut rates) => rates.rates(list.iter().map(|r| (r.cluster.as_str(), r.own_events)), events_total),
        Err(_) => (vec![0.0; list.len()], 0.0),
    };
    let mut shown: Vec<(crate::fleet::rows::Row, f64)> = list.into_iter().zip(rates).collect();
    let clusters_omitted = fleet::bounded(&mut shown, fleet::OVERVIEW_CLUSTERS, |(r, _)| !r.connected);
    let rows: Vec<fleet::ClusterRow> = shown
        .into_iter()
        .filter_map(|(r, rate)| {
            let hub = r.hub.as_deref().map(str::to_string);
            let status: crate::cluster::ClusterStatus = serde_json::from_value(r.value()).ok()?;
            Some(fleet::ClusterRow::of(&status, rate, hub))
        })
        .collect();
    let mut subs = subscriptions(ctx).await;
    let subscriptions_omitted = fleet::bounded(&mut subs, fleet::OVERVIEW_CLUSTERS, |s| s.lag_records > 0);
    let mut runtimes = ctx.runtimes.read().map(|v| v.clone()).unwrap_or_default();
    let runtimes_omitted = fleet::bounded(&mut runtimes.items, fleet::OVERVIEW_RUNTIMES, |r| !r.healthy());
    let ready = ctx.checks().iter().all(|c| c.state.is_ok());
    let mut watch_configs = watch_verdicts(ctx).await;
    let watch_configs_total = watch_configs.len();
    let watch_configs_refused = watch_configs.iter().filter(|v| !v.accepted).count();
    let watch_configs_omitted = fleet::bounded(&mut watch_configs, fleet::OVERVIEW_RUNTIMES, |v| !v.accepted);
    let bus_stats = ctx.sessions.bus.stats();
    serde_json::json!({
        "time": jiff::Timestamp::now(),
        "hub": ctx.replica,
        "ready": ready,
        "bus": {
            "records": bus_stats.retained,
            "lastOffset": bus_stats.last_offset,
            "heldInMemory": bus_stats.holds_records,
        },
        "totals": {
            "clusters": clusters_total,
            "connected": connected,
            "disconnected": clusters_total - connected,
            "eventsPerSec": total_rate,
        },
        "clusters": rows,
        "clustersOmitted": clusters_omitted,
        "subscriptions": subs,
        "subscriptionsOmitted": subscriptions_omitted,
        "runtimes": runtimes,
        "runtimesOmitted": runtimes_omitted,
        "watchConfigs": {
            "total": watch_configs_total,
            "refused": watch_configs_refused,
            "items": watch_configs,
            "omitted": watch_configs_omitted,
        },
    })
}

async fn overview_handler(State(admin): State<Admin>) -> impl IntoResponse {
    axum::Json(overview(&admin).await)
}

async fn openapi() -> impl IntoResponse {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI)
}

const INDEX_HTML: &str = include_str!("web/index.html");
const APP_JS: &str = include_str!("web/app.js");
const APP_CSS: &str = include_str!("web/app.css");
const LOGIN_HTML: &str = include_str!("web/login.html");

/// Headers of every page: no framing, no scripts or styles from elsewhere.
fn page_headers() -> [(header::HeaderName, &'static str); 3] {
    [
        (
            header::CONTENT_SECURITY_POLICY,
            "default-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
        ),
        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        (header::CACHE_CONTROL, "no-store"),
    ]
}

/// The web view (the overview at `/`, a cluster at `/clusters/{id}`: one page, the script
/// reads the address).
async fn page() -> impl IntoResponse {
    (page_headers(), Html(INDEX_HTML))
}

async fn app_js() -> impl IntoResponse {
    (page_headers(), [(header::CONTENT_TYPE, "text/javascript; charset=utf-8")], APP_JS)
}

async fn app_css() -> impl IntoResponse {
    (page_headers(), [(header::CONTENT_TYPE, "text/css; charset=utf-8")], APP_CSS)
}

async fn login_form() -> impl IntoResponse {
    (page_headers(), Html(LOGIN_HTML))
}

#[derive(serde::Deserialize)]
struct LoginForm {
    token: String,
}

/// `429` with `Retry-After` for a client past its wrong credentials.
fn too_many(ip: std::net::IpAddr, wait: std::time::Duration) -> Response {
    let secs = wait.as_secs().max(1).to_string();
    let msg = format!(
        "too many wrong admin tokens from {ip}: at most {} a minute; retry in {secs}s\n",
        login::FAILURES_PER_WINDOW
    );
    (StatusCode::TOO_MANY_REQUESTS, [(header::RETRY_AFTER, secs)], msg).into_response()
}

/// Checks a token typed into the login page and opens a browser session: the HTTP-only
/// cookie carries a random session id, not the token. Wrong tokens are rate-limited per
/// client address (see `login`).
async fn login(State(admin): State<Admin>, req: Request) -> Response {
    use axum::extract::FromRequest;
    let ip = client_ip(&req);
    let Some(expected) = admin.ctx.admin_token.as_ref() else {
        return Redirect::to("/").into_response();
    };
    if let login::Gate::Limited(wait) = admin.logins.gate(ip) {
        return too_many(ip, wait);
    }
    let form = match axum::Form::<LoginForm>::from_request(req, &()).await {
        Ok(f) => f,
        Err(e) => return e.into_response(),
    };
    let token = form.token.trim();
    if !expected.matches(token) {
        // Counted and summarised once a minute, not logged one line each.
        admin.logins.failed(ip);
        return (StatusCode::UNAUTHORIZED, page_headers(), Html(LOGIN_HTML)).into_response();
    }
    let id = admin.logins.open(token);
    let secure = if admin.ctx.admin_tls.is_some() { "; Secure" } else { "" };
    let cookie = format!("{}={id}; HttpOnly; SameSite=Strict; Path=/{secure}", auth::COOKIE);
    ([(header::SET_COOKIE, cookie)], Redirect::to("/")).into_response()
}

#[cfg(test)]
mod openapi_tests {
    use std::collections::BTreeSet;

    #[test]
    fn the_openapi_document_lists_exactly_the_routes_served() {
        let doc: serde_json::Value = serde_json::from_str(super::OPENAPI).expect("openapi.json is JSON");
        assert_eq!(doc["openapi"].as_str().map(|v| v.starts_with("3.")), Some(true));
        let mut documented = BTreeSet::new();
        for (path, item) in doc["paths"].as_object().expect("paths") {
            for method in item.as_object().expect("path item").keys() {
                documented.insert((path.clone(), method.clone()));
            }
        }
        let served: BTreeSet<(String, String)> = super::routes()
            .into_iter()
            .flat_map(|(path, methods, _)| methods.iter().map(move |m| (path.to_string(), m.to_string())))
            .collect();
        assert_eq!(
            served.difference(&documented).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "served but not in openapi.json"
        );
        assert_eq!(
            documented.difference(&served).collect::<Vec<_>>(),
            Vec::<&(String, String)>::new(),
            "in openapi.json but not served"
        );
        // Every reference points at a component that exists.
        let text = super::OPENAPI;
        for r in text.split("\"$ref\": \"#/components/").skip(1) {
            let path: Vec<&str> = r.split('"').next().unwrap_or_default().split('/').collect();
            assert!(!doc["components"][path[0]][path[1]].is_null(), "dangling $ref {path:?}");
        }
    }
}
