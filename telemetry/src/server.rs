//! The one health and metrics endpoint: `/healthz` (200 while the process answers),
//! `/readyz` (200 `ready…` or 503 `not ready: why`, from the component's check) and
//! `/metrics` (OpenMetrics, or the text format 0.0.4 on request, see
//! [`crate::exposition`]), plain HTTP, for the kubelet's probes and Prometheus.
//!
//! The lifecycle operator (`--metrics-listen`), the relays (`--metrics-listen`) and the
//! agent (`--health-listen`) serve a [`Health`]; the hub answers the same three paths on
//! its admin endpoint (with its authentication and TLS) through [`healthz`], [`readyz`]
//! and [`metrics`].

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::http::header::{ACCEPT, CONTENT_TYPE};
use axum::http::{HeaderMap, StatusCode};
use axum::response::IntoResponse;
use tokio_util::sync::CancellationToken;

/// What a readiness check says: `Ok(detail)` answers `200 ready` (followed by `: detail`
/// unless it is empty), `Err(why)` answers `503 not ready: why`.
pub type Readiness = Result<String, String>;

type ReadyCheck = Arc<dyn Fn() -> Pin<Box<dyn Future<Output = Readiness> + Send>> + Send + Sync>;
type Encode = Arc<dyn Fn() -> String + Send + Sync>;

/// A component's health and metrics endpoint: what `/metrics` encodes and what `/readyz`
/// checks.
#[derive(Clone)]
pub struct Health {
    metrics: Encode,
    ready: ReadyCheck,
}

impl std::fmt::Debug for Health {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Health").finish_non_exhaustive()
    }
}

impl Health {
    /// An endpoint whose `/metrics` answers `encode()` (a complete OpenMetrics exposition,
    /// closed with `# EOF`) and whose `/readyz` answers `ready` until [`Health::ready`]
    /// gives it a check.
    pub fn new(encode: impl Fn() -> String + Send + Sync + 'static) -> Self {
        Self { metrics: Arc::new(encode), ready: Arc::new(|| Box::pin(async { Ok(String::new()) })) }
    }

    /// Makes `/readyz` answer what `check` says, asked anew at every probe.
    pub fn ready<F, Fut>(mut self, check: F) -> Self
    where
        F: Fn() -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Readiness> + Send + 'static,
    {
        self.ready = Arc::new(move || Box::pin(check()));
        self
    }

    /// The three routes.
    pub fn router(self) -> axum::Router {
        let Health { metrics: encode, ready } = self;
        axum::Router::new()
            .route("/healthz", axum::routing::get(healthz))
            .route("/readyz", axum::routing::get(move || ready_answer(ready.clone())))
            .route(
                "/metrics",
                axum::routing::get(move |headers: HeaderMap| std::future::ready(metrics(&headers, encode()))),
            )
    }

    /// Serves on `listener` until `shutdown`; a failure of the endpoint is logged (the
    /// component goes on: its probes will say so).
    pub async fn serve(self, listener: tokio::net::TcpListener, shutdown: CancellationToken) {
        if let Err(e) = axum::serve(listener, self.router()).with_graceful_shutdown(shutdown.cancelled_owned()).await {
            tracing::error!(error = %e, "health and metrics endpoint failed");
        }
    }
}

async fn ready_answer(check: ReadyCheck) -> (StatusCode, String) {
    readyz(check().await)
}

/// `/healthz`: the process answers.
pub async fn healthz() -> &'static str {
    "ok\n"
}

/// `/readyz`'s answer to what a check says.
pub fn readyz(state: Readiness) -> (StatusCode, String) {
    match state {
        Ok(detail) if detail.is_empty() => (StatusCode::OK, "ready\n".into()),
        Ok(detail) => (StatusCode::OK, format!("ready: {detail}\n")),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("not ready: {why}\n")),
    }
}

/// `/metrics`' answer to a scrape with `headers`, from the OpenMetrics exposition
/// `openmetrics`: in the format its `Accept` header asks for, with its content type.
pub fn metrics(headers: &HeaderMap, openmetrics: String) -> impl IntoResponse + use<> {
    let accept = headers.get(ACCEPT).and_then(|v| v.to_str().ok());
    let (content_type, body) = crate::exposition::exposition(accept, openmetrics);
    ([(CONTENT_TYPE, content_type)], body)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// `GET path` with an optional `Accept`: (status, content type, body).
    async fn get(addr: std::net::SocketAddr, path: &str, accept: Option<&str>) -> (u16, String, String) {
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n{accept}\r\n").as_bytes()).await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        let status = head.split_whitespace().nth(1).unwrap().parse().unwrap();
        let ct = head
            .lines()
            .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v))
            .unwrap_or_default()
            .trim()
            .to_string();
        (status, ct, body.to_string())
    }

    #[tokio::test]
    async fn health_ready_and_metrics_are_served_until_shutdown() {
        let up = Arc::new(AtomicBool::new(false));
        let check = up.clone();
        let health =
            Health::new(|| "# HELP x_events Events.\n# TYPE x_events counter\nx_events_total 2\n# EOF\n".into()).ready(
                move || {
                    let up = check.load(Ordering::Relaxed);
                    async move { if up { Ok("connected".into()) } else { Err("no session".into()) } }
                },
            );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = CancellationToken::new();
        let served = tokio::spawn(health.serve(listener, shutdown.clone()));

        assert_eq!(get(addr, "/healthz", None).await.2, "ok\n");
        assert_eq!(
            get(addr, "/readyz", None).await,
            (503, "text/plain; charset=utf-8".into(), "not ready: no session\n".into())
        );
        up.store(true, Ordering::Relaxed);
        assert_eq!(get(addr, "/readyz", None).await.2, "ready: connected\n");
        let (status, ct, body) = get(addr, "/metrics", None).await;
        assert_eq!((status, ct.as_str()), (200, crate::exposition::OPENMETRICS_CONTENT_TYPE));
        assert!(body.ends_with("x_events_total 2\n# EOF\n"), "{body}");
        let (_, ct, body) = get(addr, "/metrics", Some("text/plain;version=0.0.4")).await;
        assert_eq!(ct, crate::exposition::TEXT_CONTENT_TYPE);
        assert!(body.starts_with("# HELP x_events_total Events.\n") && !body.contains("# EOF"), "{body}");
        assert_eq!(get(addr, "/nothing", None).await.0, 404);

        shutdown.cancel();
        served.await.unwrap();
        assert!(tokio::net::TcpStream::connect(addr).await.is_err(), "still listening after shutdown");
    }

    #[test]
    fn readiness_answers() {
        assert_eq!(readyz(Ok(String::new())), (StatusCode::OK, "ready\n".into()));
        assert_eq!(readyz(Ok("bus ok".into())), (StatusCode::OK, "ready: bus ok\n".into()));
        assert_eq!(readyz(Err("bus: full".into())), (StatusCode::SERVICE_UNAVAILABLE, "not ready: bus: full\n".into()));
    }
}
