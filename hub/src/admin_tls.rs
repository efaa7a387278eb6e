//! The admin endpoint over TLS with client certificates (`--admin-client-ca`): a listener
//! for `axum::serve` whose connections have completed the TLS handshake. Handshakes run
//! in their own tasks (bounded in number and time), so a slow client cannot hold up
//! others.

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

/// Connections that completed the TLS handshake with a trusted client certificate.
pub(crate) struct TlsListener {
    rx: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local: std::io::Result<SocketAddr>,
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
    tx: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
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
                    let _ = tx.send((tls, peer)).await;
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
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.rx.recv().await {
            Some(c) => c,
            // The accept task ended (shutdown): wait for the graceful shutdown to finish.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        match &self.local {
            Ok(a) => Ok(*a),
            Err(e) => Err(std::io::Error::new(e.kind(), e.to_string())),
        }
    }
}
