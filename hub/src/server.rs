//! The accept loop: connection limit, TLS and WebSocket handshakes under one deadline,
//! identity from the client certificate, and dispatch by role.

use std::net::SocketAddr;
use std::sync::Arc;

use fleetwatch_shared::identity::Role;
use fleetwatch_shared::protocol::{ErrorCode, WS_PATH};
use fleetwatch_shared::transport::ws_config;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::conn::Conn;
use crate::{Context, Peer};

pub(crate) async fn accept_loop(
    listener: TcpListener,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) {
    let permits = Arc::new(Semaphore::new(ctx.config.max_connections));
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                let Ok(permit) = permits.clone().try_acquire_owned() else {
                    ctx.metrics.reject("max-connections");
                    tracing::warn!(%peer, limit = ctx.config.max_connections, "connection limit reached; refusing");
                    drop(tcp);
                    continue;
                };
                let span = tracing::info_span!("conn", %peer);
                tracker.spawn(handle(tcp, peer, ctx.clone(), shutdown.clone(), permit).instrument(span));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

async fn handle(
    tcp: TcpStream,
    peer: SocketAddr,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    _permit: OwnedSemaphorePermit,
) {
    let _ = tcp.set_nodelay(true);
    let acceptor = TlsAcceptor::from(ctx.tls.current());
    let limits = ctx.config.limits;
    let handshake = async {
        let tls = acceptor.accept(tcp).await.map_err(|e| ("tls-handshake", e.to_string()))?;
        let identity = tls
            .get_ref()
            .1
            .peer_certificates()
            .map(fleetwatch_certs::peer_certificate)
            .unwrap_or_else(|| Err(fleetwatch_certs::CertError::PeerIdentity("no client certificate".into())));
        // The signature is tungstenite's callback type; its error is large by design.
        #[allow(clippy::result_large_err)]
        let check_path = |req: &Request, resp: Response| -> Result<Response, ErrorResponse> {
            if req.uri().path() == WS_PATH {
                Ok(resp)
            } else {
                let mut err = ErrorResponse::new(Some(format!("unknown path; connect to {WS_PATH}")));
                *err.status_mut() = StatusCode::NOT_FOUND;
                Err(err)
            }
        };
        let ws = tokio_tungstenite::accept_hdr_async_with_config(tls, check_path, Some(ws_config(&limits)))
            .await
            .map_err(|e| ("ws-handshake", e.to_string()))?;
        Ok::<_, (&str, String)>((ws, identity))
    };
    let (ws, identity) = match tokio::time::timeout(ctx.config.handshake_timeout, handshake).await {
        Err(_) => {
            ctx.metrics.reject("handshake-timeout");
            tracing::info!(timeout = ?ctx.config.handshake_timeout, "handshake too slow; closed");
            return;
        }
        Ok(Err((reason, message))) => {
            ctx.metrics.reject(reason);
            tracing::info!(reason, %message, "handshake failed");
            return;
        }
        Ok(Ok(v)) => v,
    };
    let conn = Conn::new(ws, peer, ctx.config.idle_timeout);
    let (identity, serial) = match identity {
        Ok(id) => id,
        Err(e) => {
            ctx.metrics.reject("no-identity");
            tracing::info!(error = %e, "client certificate has no fleetwatch identity");
            conn.fail(ErrorCode::Forbidden, e.to_string(), CloseCode::Policy).await;
            return;
        }
    };
    if let Some(td) = &ctx.trust_domain
        && &identity.trust_domain != td
    {
        ctx.metrics.reject("trust-domain");
        let msg = format!("identity {identity} is not in trust domain {td}");
        tracing::info!(%msg, "rejected");
        conn.fail(ErrorCode::Forbidden, msg, CloseCode::Policy).await;
        return;
    }
    let peer = Peer { identity: identity.to_string(), serial };
    if ctx.revoked(&peer) {
        ctx.metrics.reject("revoked");
        tracing::warn!(identity = %peer.identity, serial = %peer.serial, "revoked certificate refused");
        let msg = format!("certificate {} of {} is revoked", peer.serial, peer.identity);
        conn.fail(ErrorCode::Forbidden, msg, CloseCode::Policy).await;
        return;
    }
    // The connection's own token: cancelled by hub shutdown or by a revocation.
    let lifeline = shutdown.child_token();
    let conn_id = rand::random::<u64>();
    if let Ok(mut live) = ctx.live.lock() {
        live.insert(conn_id, (peer.clone(), lifeline.clone()));
    }
    match identity.role {
        Role::Cluster(cluster) => {
            let span = tracing::info_span!("agent", %cluster);
            crate::agent_session::run(conn, cluster, peer, ctx.clone(), lifeline).instrument(span).await;
        }
        Role::Subscriber(name) => {
            let span = tracing::info_span!("subscriber", %name);
            crate::subscriber_session::run(conn, name, peer, ctx.clone(), lifeline).instrument(span).await;
        }
        Role::Hub | Role::TrustDomain => {
            ctx.metrics.reject("wrong-role");
            conn.fail(ErrorCode::Forbidden, format!("{identity} may not connect as a client"), CloseCode::Policy).await;
        }
    }
    if let Ok(mut live) = ctx.live.lock() {
        live.remove(&conn_id);
    }
}
