//! A listener implementing runtime-watcher's documented v2 contract, as lifecycle-manager
//! embeds it: `POST /v2/{component}/event` only (405 for other methods), bodies over
//! 16 KiB refused with 413, the runtime id taken from the Subject CN of the first
//! `Cert="…"` element of `X-Forwarded-Client-Cert` (401 without one, 400 for an empty
//! CN), the body a `{watched, watchedGvk}` document. It records what it accepted, and can
//! be told to answer 503 (an outage behind a gateway) or be stopped and started again on
//! the same port (the process gone).
//!
//! Shared by the relay crate's tests and the end-to-end tests (`#[path]`).

#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::IntoResponse;

/// The contract's body limit.
pub const LIMIT: usize = 16 * 1024;

/// One accepted request.
#[derive(Debug, Clone, PartialEq)]
pub struct Received {
    /// The component in the path.
    pub component: String,
    /// The runtime id (CN from XFCC).
    pub runtime: String,
    /// The body.
    pub body: serde_json::Value,
    /// The Content-Type header.
    pub content_type: String,
}

#[derive(Default)]
struct Shared {
    received: Mutex<Vec<Received>>,
    /// Refusals: (status, why), in order.
    refused: Mutex<Vec<(u16, String)>>,
    down: AtomicBool,
    /// Answer this status to everything (0: serve).
    status: std::sync::atomic::AtomicU16,
}

/// The running listener.
pub struct KlmListener {
    pub addr: SocketAddr,
    shared: Arc<Shared>,
    stop: tokio_util::sync::CancellationToken,
    tls: Option<Arc<rustls::ServerConfig>>,
}

fn runtime_from_xfcc(headers: &HeaderMap) -> Result<String, (StatusCode, String)> {
    let Some(v) = headers.get("X-Forwarded-Client-Cert") else {
        return Err((StatusCode::UNAUTHORIZED, "request does not contain 'X-Forwarded-Client-Cert' header".into()));
    };
    let v = v.to_str().map_err(|_| (StatusCode::UNAUTHORIZED, "XFCC not text".into()))?;
    if v.len() > 32 * 1024 {
        return Err((StatusCode::UNAUTHORIZED, "XFCC too long".into()));
    }
    let Some(start) = v.find("Cert=") else { return Err((StatusCode::UNAUTHORIZED, "empty certificate".into())) };
    let rest = &v[start + 5..];
    let token = &rest[..rest.find([';', ',']).unwrap_or(rest.len())];
    // Go's url.QueryUnescape: '+' is a space.
    let token = token.replace('+', " ");
    let pem = percent_encoding::percent_decode_str(&token)
        .decode_utf8()
        .map_err(|_| (StatusCode::UNAUTHORIZED, "could not decode certificate URL format".into()))?;
    let pem = pem.trim_matches('"');
    let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes())
        .map_err(|_| (StatusCode::UNAUTHORIZED, "failed to decode PEM block".into()))?;
    let cert = p.parse_x509().map_err(|e| (StatusCode::UNAUTHORIZED, format!("bad certificate: {e}")))?;
    let cn = cert.subject().iter_common_name().next().and_then(|c| c.as_str().ok()).unwrap_or("").to_string();
    if cn.is_empty() {
        return Err((StatusCode::BAD_REQUEST, "client certificate common name is empty".into()));
    }
    Ok(cn)
}

async fn handle(
    State(shared): State<Arc<Shared>>,
    Path(component): Path<String>,
    method: Method,
    headers: HeaderMap,
    body: Body,
) -> impl IntoResponse {
    let refuse = |status: StatusCode, why: String| {
        shared.refused.lock().unwrap().push((status.as_u16(), why.clone()));
        (status, why)
    };
    if shared.down.load(Ordering::SeqCst) {
        return refuse(StatusCode::SERVICE_UNAVAILABLE, "no healthy upstream".into());
    }
    if let Ok(status) = StatusCode::from_u16(shared.status.load(Ordering::SeqCst)) {
        return refuse(status, "answered as told (set_status)".into());
    }
    if method != Method::POST {
        return refuse(StatusCode::METHOD_NOT_ALLOWED, format!("{method} method is not allowed on this path"));
    }
    let declared = headers.get("content-length").and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > LIMIT) {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("Body size greater than {LIMIT} bytes is not allowed"));
    }
    let Ok(bytes) = axum::body::to_bytes(body, LIMIT).await else {
        return refuse(StatusCode::PAYLOAD_TOO_LARGE, format!("Body size greater than {LIMIT} bytes is not allowed"));
    };
    let Ok(body) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return refuse(StatusCode::INTERNAL_SERVER_ERROR, "could not unmarshal watcher event".into());
    };
    let runtime = match runtime_from_xfcc(&headers) {
        Ok(r) => r,
        Err((s, why)) => return refuse(s, why),
    };
    let content_type = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    shared.received.lock().unwrap().push(Received { component, runtime, body, content_type });
    (StatusCode::OK, String::new())
}

impl KlmListener {
    /// Starts on a free loopback port (plain HTTP, or HTTPS with `tls`).
    pub async fn start(tls: Option<Arc<rustls::ServerConfig>>) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut me = Self { addr, shared: Arc::default(), stop: Default::default(), tls };
        me.serve(listener);
        me
    }

    fn serve(&mut self, listener: tokio::net::TcpListener) {
        let app = axum::Router::new()
            .route("/v2/{component}/event", axum::routing::any(handle))
            .with_state(self.shared.clone());
        self.stop = tokio_util::sync::CancellationToken::new();
        let stop = self.stop.clone();
        match self.tls.clone() {
            None => {
                tokio::spawn(async move {
                    let _ = axum::serve(listener, app).with_graceful_shutdown(stop.cancelled_owned()).await;
                });
            }
            Some(tls) => {
                let acceptor = tokio_rustls::TlsAcceptor::from(tls);
                tokio::spawn(async move {
                    loop {
                        let (tcp, _) = tokio::select! {
                            _ = stop.cancelled() => return,
                            a = listener.accept() => match a { Ok(a) => a, Err(_) => continue },
                        };
                        let (acceptor, app, stop) = (acceptor.clone(), app.clone(), stop.clone());
                        tokio::spawn(async move {
                            let Ok(tls) = acceptor.accept(tcp).await else { return };
                            let io = hyper_util::rt::TokioIo::new(tls);
                            let svc = hyper_util::service::TowerToHyperService::new(app);
                            let builder =
                                hyper_util::server::conn::auto::Builder::new(hyper_util::rt::TokioExecutor::new());
                            let conn = builder.serve_connection(io, svc);
                            tokio::select! {
                                _ = conn => {}
                                _ = stop.cancelled() => {}
                            }
                        });
                    }
                });
            }
        }
    }

    /// Base URL for `--target`.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.addr.port())
    }

    /// Answer `status` to everything (a missing route: 404), or serve again (`None`).
    pub fn set_status(&self, status: Option<u16>) {
        self.shared.status.store(status.unwrap_or(0), Ordering::SeqCst);
    }

    /// Answer 503 to everything (true) or serve again (false).
    pub fn set_down(&self, down: bool) {
        self.shared.down.store(down, Ordering::SeqCst);
    }

    /// Stops serving: the port refuses connections.
    pub fn stop(&self) {
        self.stop.cancel();
    }

    /// Serves again on the same port.
    pub async fn restart(&mut self) {
        let addr = self.addr;
        let listener = fleetwatch_test_support::eventually(format!("listening on {addr} again"))
            .until(async || tokio::net::TcpListener::bind(addr).await.map_err(|e| e.to_string()), Result::is_ok)
            .await
            .expect("until returns only what satisfies the condition");
        self.serve(listener);
    }

    /// What was accepted, in order.
    pub fn received(&self) -> Vec<Received> {
        self.shared.received.lock().unwrap().clone()
    }

    /// What was refused: (status, why), in order.
    pub fn refused(&self) -> Vec<(u16, String)> {
        self.shared.refused.lock().unwrap().clone()
    }
}

impl Drop for KlmListener {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}
