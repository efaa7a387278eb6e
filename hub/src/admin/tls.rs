//! The admin endpoint over TLS with client certificates (`--admin-client-ca`): a listener
//! for `axum::serve` whose connections have completed the TLS handshake. Handshakes run
//! in their own tasks (bounded in number and time), so a slow client cannot hold up
//! others. A client may connect without a certificate (a certificate it presents must
//! verify): each connection carries whether it presented one ([`AdminPeer`]), and the
//! admin router lets such connections reach only the open paths (probes, login).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;
use tokio_util::sync::CancellationToken;

/// Most admin TLS handshakes in progress at once.
const MAX_HANDSHAKES: usize = 64;
/// Time allowed for one handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Connections that completed the TLS handshake, with or without a client certificate.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, AdminPeer)>,
    local: std::io::Result<SocketAddr>,
}

/// Who is at the other end of an admin connection.
#[derive(Debug, Clone, Copy)]
pub(crate) struct AdminPeer {
    /// The client's address.
    pub(crate) addr: SocketAddr,
    /// Whether it presented a client certificate that verified against `--admin-client-ca`.
    pub(crate) verified_client: bool,
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, TlsListener>> for AdminPeer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, TlsListener>) -> Self {
        *stream.remote_addr()
    }
}

impl TlsListener {
    pub(crate) fn new(listener: TcpListener, tls: Arc<rustls::ServerConfig>, shutdown: CancellationToken) -> Self {
        let local = listener.local_addr();
        let (tx, rx) = mpsc::channel(MAX_HANDSHAKES);
        tokio::spawn(accept(listener, TlsAcceptor::from(tls), tx, shutdown));
        Self { rx, local }
    }
}

async fn accept(
    listener: TcpListener,
    acceptor: TlsAcceptor,
    tx: mpsc::Sender<(TlsStream<TcpStream>, AdminPeer)>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(tokio::sync::Semaphore::new(MAX_HANDSHAKES));
    loop {
        let Ok(slot) = slots.clone().acquire_owned().await else { return };
        let (tcp, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(c) => c,
                Err(e) => {
                    tracing::warn!(error = %e, "admin endpoint: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let tx = tx.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(tls)) => {
                    // rustls reports peer certificates only once they verified.
                    let verified_client = tls.get_ref().1.peer_certificates().is_some_and(|c| !c.is_empty());
                    let _ = tx.send((tls, AdminPeer { addr: peer, verified_client })).await;
                }
                Ok(Err(e)) => {
                    tracing::info!(%peer, error = %e, "admin endpoint: TLS handshake failed (a client certificate signed by --admin-client-ca is required)")
                }
                Err(_) => tracing::info!(%peer, "admin endpoint: TLS handshake timed out"),
            }
        });
    }
}

impl axum::serve::Listener for TlsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = AdminPeer;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ended (shutdown): wait for the graceful shutdown to finish.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(AdminPeer { addr: *a, verified_client: false }),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}
