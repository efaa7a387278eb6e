//! The accept loop: handshake budgets, TLS and WebSocket handshakes under one deadline,
//! identity from the client certificate, the session budget, and dispatch by role.

use std::net::SocketAddr;
use std::sync::Arc;

use crate::tls_hint;
use fleetwatch_client::transport::Stream;
use fleetwatch_client::transport::ws_config;
use fleetwatch_protocol::identity::Role;
use fleetwatch_protocol::message::{ErrorCode, WS_PATH};
use tokio_tungstenite::tungstenite::handshake::server::{ErrorResponse, Request, Response};
use tokio_tungstenite::tungstenite::http::StatusCode;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::admission::{Eviction, HandshakePermit, HandshakeSlot, IDLE_EVICTION_AGE};
use crate::context::Context;
use crate::listener::Listener;
use crate::peer::Peer;
use crate::registry::Connected;
use crate::session::Sessions;
use crate::session::conn::Conn;
use crate::session::lean_tls::LeanTls;
use tokio::sync::OwnedSemaphorePermit;

/// What the hub's WebSocket layer reads at a time, and so the read buffer every connection
/// keeps while idle (tungstenite allocates it whole for the connection's life and never gives
/// it back). The client's 8 KiB was 8 of an idle session's 26 KiB; the frames a hub reads
/// while idle are pongs, and a larger frame is read into room reserved for its whole length,
/// 512 bytes per read: a copy out of the plaintext `LeanTls` holds, not a system call (1 KiB
/// before decision 0041). See docs/performance.md, "What an idle session holds".
pub(crate) const READ_BUFFER_BYTES: usize = 512;

pub(crate) async fn accept_loop(
    mut listener: Listener,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    tracker: &TaskTracker,
) {
    loop {
        let accepted = tokio::select! {
            _ = shutdown.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        match accepted {
            Ok((tcp, peer)) => {
                // Unauthenticated connections have their own budget: they cannot take the
                // places of sessions. While it is used up this one waits for a place and
                // nothing more is accepted; connections wait in the listen backlog rather
                // than being reset (and backing off) by the thousand.
                let permit = match ctx.admission.try_handshake_permit() {
                    Some(p) => p,
                    None => match place_for_waiting(&ctx, &shutdown).await {
                        Some(p) => p,
                        None => break,
                    },
                };
                // One address cannot take the whole budget.
                let slot = match ctx.admission.begin_handshake(peer.ip(), permit) {
                    Ok(slot) => slot,
                    Err(why) => {
                        ctx.admission.refuse(why, &ctx.sessions.metrics);
                        drop(tcp);
                        continue;
                    }
                };
                let span = tracing::info_span!("conn", %peer);
                tracker.spawn(handle(tcp, peer, ctx.clone(), shutdown.clone(), slot, tracker.clone()).instrument(span));
            }
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning, and
                // log like failed handshakes (a few, then counted in the summary).
                if ctx.admission.log_failure() {
                    tracing::warn!(error = %e, "accept failed");
                }
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    }
}

/// A place in the handshake budget for an accepted connection while the budget is used
/// up: the oldest connection that has sent nothing for [`IDLE_EVICTION_AGE`] makes room
/// (see `admission`), and its place is taken as it closes. `None` at shutdown.
async fn place_for_waiting(ctx: &Context, shutdown: &CancellationToken) -> Option<HandshakePermit> {
    loop {
        // Look again later: connections accepted a moment ago may not have registered as
        // idle yet, and one told to close may have found its first bytes and gone on.
        let retry_at = match ctx.admission.evict_oldest_idle(IDLE_EVICTION_AGE) {
            Eviction::NotBefore(at) => at,
            Eviction::Evicted | Eviction::NoneIdle => tokio::time::Instant::now() + IDLE_EVICTION_AGE,
        };
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            permit = ctx.admission.handshake_permit() => return permit,
            _ = tokio::time::sleep_until(retry_at) => {}
        }
    }
}

/// Whether bytes from the peer wait in the socket's receive queue (without taking them).
fn has_bytes_waiting(tcp: &tokio::net::TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::<u8>::uninit(); 1];
    // The socket is non-blocking: nothing waiting is `WouldBlock`, not a wait.
    matches!(socket2::SockRef::from(tcp).peek(&mut byte), Ok(n) if n > 0)
}

/// Why a handshake failed: the metric label and the message for the log.
struct HandshakeFailure {
    reason: &'static str,
    message: String,
}

/// One connection, inside a span naming its peer address (so every line logged here does).
async fn handle(
    tcp: Stream,
    peer: SocketAddr,
    ctx: Arc<Context>,
    shutdown: CancellationToken,
    slot: HandshakeSlot,
    tracker: TaskTracker,
) {
    if let Stream::Tcp(tcp) = &tcp {
        let _ = tcp.set_nodelay(true);
    }
    // One deadline for the first byte and both handshakes; shorter under pressure.
    let handshake_timeout = ctx.admission.handshake_timeout(ctx.config.handshake_timeout);
    let deadline = tokio::time::Instant::now() + handshake_timeout;
    if let Stream::Tcp(tcp) = &tcp {
        // Until its first byte the connection is idle: the first to go when room is needed.
        let idle = ctx.admission.idle_begin();
        let mut byte = [0u8; 1];
        let first_byte = tokio::select! {
            r = tokio::time::timeout_at(deadline, tcp.peek(&mut byte)) => match r {
                Ok(_) => Ok(()),
                Err(_) => Err("idle-timeout"),
            },
            // Told to make room. A busy hub may not have looked since its first bytes
            // arrived: then it is not idle, and goes on.
            _ = idle.evicted.cancelled() => if has_bytes_waiting(tcp) { Ok(()) } else { Err("idle-evicted") },
        };
        drop(idle);
        if let Err(reason) = first_byte {
            ctx.sessions.metrics.handshake_failed(reason);
            if ctx.admission.log_failure() {
                let secs = handshake_timeout.as_secs_f64();
                tracing::warn!(reason, "connection sent nothing (handshake timeout {secs}s); closed");
            }
            return;
        }
        // A client that gave up while its connection waited in the listen backlog (its
        // connect timed out in a storm) has closed its side after its ClientHello. The
        // server's half of the handshake (key exchange, signature) would be work for no
        // one, and in a storm of 50,000 agents it was most of the hubs' work: retries
        // queued behind the abandoned attempts timed out in turn. So one whose peer has
        // closed is dropped before the TLS work.
        if let Ok(ready) = tcp.ready(tokio::io::Interest::READABLE).await
            && ready.is_read_closed()
        {
            ctx.sessions.metrics.handshake_failed("abandoned");
            if ctx.admission.log_failure() {
                tracing::warn!(
                    reason = "abandoned",
                    "client closed before the handshake (it gave up waiting); dropped"
                );
            }
            return;
        }
    }
    let config = ctx.tls.current();
    let limits = ctx.config.limits;
    let handshake = async {
        // rustls' unbuffered connection under a stream that gives its buffers back while
        // idle (`LeanTls`): an idle session holds no TLS buffer.
        let tls = LeanTls::accept(tcp, config).await.map_err(|e| HandshakeFailure {
            reason: "tls-handshake",
            message: tls_hint::server_side(&e).unwrap_or_else(|| e.to_string()),
        })?;
        // From the chain rustls verified against the configuration's client-CA verifier.
        let certificate = tls
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
        let config = ws_config(&limits).read_buffer_size(READ_BUFFER_BYTES);
        let ws = tokio_tungstenite::accept_hdr_async_with_config(tls, check_path, Some(config))
            .await
            .map_err(|e| HandshakeFailure { reason: "ws-handshake", message: format!("WebSocket handshake: {e}") })?;
        Ok::<_, HandshakeFailure>((ws, certificate))
    };
    // Boxed here and below: a task's future is as large as its largest state, and the
    // handshake's (TLS and HTTP buffers) and a session's states never coexist. Inline, every
    // connection would keep room for both for its whole life.
    let (ws, certificate) = match tokio::time::timeout_at(deadline, Box::pin(handshake)).await {
        Err(_) => {
            ctx.sessions.metrics.handshake_failed("handshake-timeout");
            if ctx.admission.log_failure() {
                let timeout = handshake_timeout.as_secs_f64();
                tracing::warn!("handshake not finished within --handshake-timeout {timeout}s; closed");
            }
            return;
        }
        Ok(Err(HandshakeFailure { reason, message })) => {
            ctx.sessions.metrics.handshake_failed(reason);
            if ctx.admission.log_failure() {
                tracing::warn!(reason, "handshake failed: {message}");
            }
            return;
        }
        Ok(Ok(v)) => v,
    };
    match admit(Conn::new(ws, peer, ctx.config.idle_timeout), certificate, &ctx, &shutdown, slot) {
        Admission::Refused(r) => Box::pin(refused(r)).await,
        Admission::Session(session) => serve(session, ctx.sessions.clone(), &tracker),
    }
}

/// What an authenticated connection becomes ([`admit`]).
enum Admission {
    /// Refused: told why, holding its place in a budget meanwhile (so refusals stay bounded too).
    Refused(Refusal),
    /// Served as its certificate's role, in a task of its own.
    Session(Session),
}

/// A refused connection and what it is told.
struct Refusal {
    conn: Conn,
    code: ErrorCode,
    message: String,
    close: CloseCode,
    /// The handshake slot or the session permit, held while the refusal is sent.
    _hold: (Option<HandshakeSlot>, Option<OwnedSemaphorePermit>),
}

/// An admitted connection, to be served as its role.
struct Session {
    conn: Conn,
    role: SessionRole,
    peer: Peer,
    lifeline: CancellationToken,
    /// Its place in the session budget and in the registry's open connections, for the
    /// session's life.
    guards: (OwnedSemaphorePermit, Connected<OwnedRegistry>),
}

enum SessionRole {
    Agent(String),
    Subscriber(String),
}

/// The registry, owned by a guard that outlives the accepting task.
struct OwnedRegistry(Arc<Sessions>);

impl std::ops::Deref for OwnedRegistry {
    type Target = crate::registry::SessionRegistry;

    fn deref(&self) -> &Self::Target {
        &self.0.registry
    }
}

/// An authenticated connection: admitted, or refused with the reason. Decided at once,
/// without waiting: the accepting task then spawns the session as a task of its own and
/// ends ([`serve`]), so no connection keeps the accepting task's state (its arguments, the
/// handshake's timeout) for the session's life.
fn admit(
    conn: Conn,
    certificate: Result<fleetwatch_certs::PeerCert, fleetwatch_certs::CertError>,
    ctx: &Arc<Context>,
    shutdown: &CancellationToken,
    slot: HandshakeSlot,
) -> Admission {
    let refuse =
        |conn, code, message, close, hold| Admission::Refused(Refusal { conn, code, message, close, _hold: hold });
    // The session budget is taken, then the handshake budget released (a refusal keeps it
    // while saying why, so refusals stay bounded too).
    let session_slot = match ctx.admission.begin_session() {
        Ok(permit) => permit,
        Err(why) => {
            ctx.admission.refuse(why, &ctx.sessions.metrics);
            let msg =
                format!("hub is full: {} sessions open (--max-connections); retry later", ctx.config.max_connections);
            return refuse(conn, ErrorCode::LimitExceeded, msg, CloseCode::Again, (Some(slot), None));
        }
    };
    drop(slot);
    let certificate = match certificate {
        Ok(c) => c,
        Err(e) => {
            ctx.sessions.metrics.handshake_failed("no-identity");
            tracing::warn!("refused: {e}");
            return refuse(conn, ErrorCode::Forbidden, e.to_string(), CloseCode::Policy, (None, Some(session_slot)));
        }
    };
    let identity = certificate.identity.clone();
    if identity.trust_domain != ctx.trust_domain {
        ctx.sessions.metrics.handshake_failed("trust-domain");
        let msg = format!("identity {identity} is not in the hub's trust domain {}", ctx.trust_domain);
        tracing::warn!("refused: {msg}");
        return refuse(conn, ErrorCode::Forbidden, msg, CloseCode::Policy, (None, Some(session_slot)));
    }
    let peer = Peer::new(certificate);
    if ctx.sessions.revoked(&peer) {
        ctx.sessions.metrics.handshake_failed("revoked");
        tracing::warn!(identity = %peer.identity, serial = %peer.serial, "revoked certificate refused");
        let msg = format!("certificate {} of {} is revoked", peer.serial, peer.identity);
        return refuse(conn, ErrorCode::Forbidden, msg, CloseCode::Policy, (None, Some(session_slot)));
    }
    let role = match identity.role {
        Role::Cluster(cluster) => SessionRole::Agent(cluster),
        Role::Subscriber(name) => SessionRole::Subscriber(name),
        Role::Hub | Role::TrustDomain => {
            ctx.sessions.metrics.handshake_failed("wrong-role");
            let msg = format!("{identity} may not connect as a client");
            return refuse(conn, ErrorCode::Forbidden, msg, CloseCode::Policy, (None, Some(session_slot)));
        }
    };
    // The connection's own token: cancelled by hub shutdown, a revocation, the certificate's
    // expiry or its CA leaving the bundle.
    let lifeline = shutdown.child_token();
    let registry = OwnedRegistry(ctx.sessions.clone());
    let connected = crate::registry::SessionRegistry::connected_in(registry, peer.clone(), lifeline.clone());
    let guards = (session_slot, connected);
    Admission::Session(Session { conn, role, peer, lifeline, guards })
}

/// Tells a refused connection why and closes it.
async fn refused(r: Refusal) {
    let Refusal { conn, code, message, close, _hold } = r;
    conn.fail(code, message, close).await;
}

/// Spawns an admitted session as a task of its own on `tracker`, inside the current span
/// (the connection's). The task holds the session's future and its guards, nothing else.
fn serve(session: Session, sessions: Arc<Sessions>, tracker: &TaskTracker) {
    use futures_util::FutureExt;
    let Session { conn, role, peer, lifeline, guards } = session;
    let release = move |()| drop(guards);
    let conn_span = tracing::Span::current();
    match role {
        SessionRole::Agent(cluster) => {
            let span = tracing::info_span!("agent", %cluster);
            let run = crate::session::agent::run(conn, cluster, peer, sessions, lifeline).instrument(span);
            tracker.spawn(run.map(release).instrument(conn_span));
        }
        SessionRole::Subscriber(name) => {
            let span = tracing::info_span!("subscriber", %name, serial = %peer.serial);
            let run = crate::session::subscriber::run(conn, name, peer, sessions, lifeline).instrument(span);
            tracker.spawn(run.map(release).instrument(conn_span));
        }
    }
}

#[cfg(test)]
mod size_tests {
    /// The size of the future `f` answers, without calling it.
    fn future_size<A, B, C, D, E, F, G>(_: &G) -> usize
    where
        G: FnOnce(A, B, C, D, E) -> F,
    {
        std::mem::size_of::<F>()
    }

    #[test]
    fn an_agent_sessions_future_stays_small() {
        // Held for every session's life, idle or not: 2,176 bytes before the rare paths were
        // boxed and the arguments kept once (1,688 since); about 1.5 KiB of an idle session's
        // memory in all (docs/performance.md, "Idle cost"). A larger one is a state that
        // should be boxed where it is awaited.
        let size = future_size(&crate::session::agent::run);
        assert!(size <= 1_800, "an agent session's future takes {size} bytes");
    }
}
