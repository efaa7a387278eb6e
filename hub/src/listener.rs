//! Where the hub accepts agents and subscribers ([`Listener`]): a TCP listener bound with
//! a deep accept queue (and, for a restarted hub, retried while its port is still taken),
//! or another source of connections such as the deterministic simulation's network.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::error::HubError;

/// Where the hub accepts agents and subscribers: a TCP listener, or another source of
/// connections (the deterministic simulation's network, `fleetwatch-dst`).
pub enum Listener {
    /// A TCP listener (every program).
    Tcp(TcpListener),
    /// Any other source of connections.
    Other(Box<dyn Accept>),
}

/// What [`Accept::accept`] answers: a connection and its peer's address.
pub type Accepted<'a> = std::pin::Pin<
    Box<
        dyn std::future::Future<Output = std::io::Result<(fleetwatch_client::transport::Stream, SocketAddr)>>
            + Send
            + 'a,
    >,
>;

/// A source of connections other than TCP.
pub trait Accept: Send + 'static {
    /// The next connection. Cancel-safe.
    fn accept(&mut self) -> Accepted<'_>;
    /// The address it listens on.
    fn local_addr(&self) -> std::io::Result<SocketAddr>;
}

impl Listener {
    /// The next connection. Cancel-safe.
    pub(crate) async fn accept(&mut self) -> std::io::Result<(fleetwatch_client::transport::Stream, SocketAddr)> {
        match self {
            Listener::Tcp(l) => l.accept().await.map(|(s, a)| (fleetwatch_client::transport::Stream::Tcp(s), a)),
            Listener::Other(l) => l.accept().await,
        }
    }

    /// The address it listens on.
    pub fn local_addr(&self) -> std::io::Result<SocketAddr> {
        match self {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Other(l) => l.local_addr(),
        }
    }
}

/// Connections the kernel queues before the hub accepts them (capped by
/// `net.core.somaxconn`). tokio's default of 1,024 overflows when a fleet reconnects at
/// once after a restart, and every dropped SYN costs its agent a second or more.
const LISTEN_BACKLOG: u32 = 4096;

/// A listener with `SO_REUSEADDR` (connections of a previous process in `TIME_WAIT` do not
/// block it) and a [`LISTEN_BACKLOG`] deep accept queue.
fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = if addr.is_ipv4() { tokio::net::TcpSocket::new_v4()? } else { tokio::net::TcpSocket::new_v6()? };
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(LISTEN_BACKLOG)
}

/// Binds a listener (see [`listen`]). An address in use is refused at once, unless `retry`
/// is given: a hub restarted on its port while the previous one is still exiting (closing
/// ten thousand sockets after a SIGKILL takes a moment; `bench storm`, the soak) then
/// retries with backoff for that long before it is refused with the address named.
pub(crate) async fn bind_retrying(addr: SocketAddr, retry: Option<Duration>) -> Result<TcpListener, HubError> {
    use backon::{ExponentialBuilder, Retryable};
    let in_use = |e: &std::io::Error| e.kind() == std::io::ErrorKind::AddrInUse;
    let Some(retry) = retry.filter(|d| !d.is_zero()) else {
        return listen(addr).map_err(|source| {
            let hint = if in_use(&source) {
                "; another process listens there (give --bind-retry SECS to wait for it to go)".to_string()
            } else {
                String::new()
            };
            HubError::Bind { addr, source, hint }
        });
    };
    let backoff = ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(10))
        .with_max_delay(Duration::from_millis(500))
        .with_total_delay(Some(retry))
        .without_max_times();
    let mut warned = false;
    (|| async move { listen(addr) })
        .retry(backoff)
        .when(in_use)
        .notify(|_, _| {
            if !warned {
                warned = true;
                tracing::warn!(%addr, "address in use (a previous hub still exiting?): retrying for up to {:.0}s (--bind-retry)", retry.as_secs_f64());
            }
        })
        .await
        .map_err(|source| {
            let hint = if in_use(&source) { format!("; still after {:.0}s of --bind-retry", retry.as_secs_f64()) } else { String::new() };
            HubError::Bind { addr, source, hint }
        })
}

#[cfg(test)]
mod bind_tests {
    use super::*;

    #[tokio::test]
    async fn an_address_in_use_is_refused_at_once_without_bind_retry() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let bind = bind_retrying(addr, None);
        tokio::pin!(bind);
        // Answered on the first poll: no waiting.
        let std::task::Poll::Ready(Err(e)) = futures_util::poll!(&mut bind) else { panic!("not refused at once") };
        let e = e.to_string();
        assert!(e.contains(&addr.to_string()) && e.contains("--bind-retry"), "{e}");
    }

    #[tokio::test]
    async fn an_address_in_use_is_retried_until_it_is_free() {
        let holder = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = holder.local_addr().unwrap();
        let bind = bind_retrying(addr, Some(Duration::from_secs(60)));
        tokio::pin!(bind);
        // The first attempt finds the address taken and waits to try again, instead of
        // failing as a plain bind does.
        assert!(futures_util::poll!(&mut bind).is_pending());
        drop(holder);
        let listener = bind.await.expect("bound once the address was free");
        assert_eq!(listener.local_addr().unwrap(), addr);
    }
}
