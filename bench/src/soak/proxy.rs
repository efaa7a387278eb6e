//! A TCP proxy on loopback whose path can be cut, as a network partition would: `cut`
//! drops every open connection and holds new ones without forwarding a byte until
//! `restore`.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio_util::sync::CancellationToken;

/// Most connections the proxy carries at once; more wait in the accept queue.
const MAX_CONNECTIONS: usize = 1024;

/// The proxy's state, shared with its connection tasks.
#[derive(Clone, Copy, PartialEq, Eq)]
struct PathState {
    /// Bumped by every cut: connections opened under an older one are dropped.
    generation: u64,
    /// New connections are held, not forwarded.
    cut: bool,
}

/// A cut-able TCP proxy to one target address.
pub struct CutProxy {
    addr: SocketAddr,
    state: watch::Sender<PathState>,
    stop: CancellationToken,
}

impl CutProxy {
    /// Listens on an ephemeral loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr, stop: CancellationToken) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let (state, _) = watch::channel(PathState { generation: 0, cut: false });
        let rx = state.subscribe();
        tokio::spawn(accept_loop(listener, target, rx, stop.clone()));
        Ok(Self { addr, state, stop })
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Drops every open connection and holds new ones until [`CutProxy::restore`].
    pub fn cut(&self) {
        self.state.send_modify(|s| {
            s.generation += 1;
            s.cut = true;
        });
    }

    /// Forwards again; connections held during the cut are closed so clients retry.
    pub fn restore(&self) {
        self.state.send_modify(|s| s.cut = false);
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

async fn accept_loop(
    listener: TcpListener,
    target: SocketAddr,
    state: watch::Receiver<PathState>,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let Ok(permit) = slots.clone().acquire_owned().await else { return };
        let accepted = tokio::select! {
            a = listener.accept() => a,
            _ = stop.cancelled() => return,
        };
        let inbound = match accepted {
            Ok((s, _)) => s,
            Err(e) => {
                tracing::debug!(error = %e, "proxy accept failed");
                continue;
            }
        };
        let (state, stop) = (state.clone(), stop.clone());
        tokio::spawn(async move {
            carry(inbound, target, state, stop).await;
            drop(permit);
        });
    }
}

/// Carries one connection until either side closes, a cut, or the proxy stops.
async fn carry(
    mut inbound: TcpStream,
    target: SocketAddr,
    mut state: watch::Receiver<PathState>,
    stop: CancellationToken,
) {
    let born = *state.borrow_and_update();
    if born.cut {
        // Blackhole: hold the socket open, forward nothing, until the path is restored.
        loop {
            tokio::select! {
                changed = state.changed() => {
                    if changed.is_err() || !state.borrow_and_update().cut {
                        return;
                    }
                }
                _ = stop.cancelled() => return,
            }
        }
    }
    let Ok(mut outbound) = TcpStream::connect(target).await else { return };
    let copy = tokio::io::copy_bidirectional(&mut inbound, &mut outbound);
    tokio::pin!(copy);
    loop {
        tokio::select! {
            _ = &mut copy => return,
            changed = state.changed() => {
                if changed.is_err() || state.borrow_and_update().generation != born.generation {
                    return; // cut: both sides are dropped
                }
            }
            _ = stop.cancelled() => return,
        }
    }
}
