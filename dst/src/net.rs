//! The simulated network as the real code sees it: a [`Dial`] for the client transport
//! (agents, subscribers) and an [`Accept`] for the hub, both over turmoil's TCP, plus
//! connection cuts.
//!
//! turmoil drops what a partition sends and leaves both ends waiting (like a real network
//! without retransmission giving up), which exercises idle timeouts; a cut here is the
//! other kind of failure, a reset the client sees at once: every connection a host opened
//! before [`CutSwitch::cut`] fails its next read or write (and a pending one is woken), so
//! the client drops it and the hub sees the connection end.

use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use fleetwatch_client::transport::{ByteStream, Dial, DialFuture, Stream};
use fleetwatch_hub::{Accept, Accepted};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

/// Cuts every connection of one host at once.
#[derive(Debug, Default, Clone)]
pub struct CutSwitch {
    current: Arc<Mutex<CancellationToken>>,
}

impl CutSwitch {
    /// Resets every connection opened before now.
    pub fn cut(&self) {
        let mut current = self.current.lock().unwrap_or_else(|e| e.into_inner());
        current.cancel();
        *current = CancellationToken::new();
    }

    fn token(&self) -> CancellationToken {
        self.current.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// Connects over turmoil's TCP; connections can be cut by the host's [`CutSwitch`].
pub struct SimDial {
    cuts: CutSwitch,
    /// Hub replicas the hub's address leads to, in turn (a TCP load balancer); empty: the
    /// address as given.
    replicas: Arc<Vec<String>>,
    next: AtomicUsize,
}

impl SimDial {
    /// A dialer whose connections `cuts` resets.
    pub fn new(cuts: CutSwitch) -> Self {
        Self { cuts, replicas: Arc::new(Vec::new()), next: AtomicUsize::new(0) }
    }

    /// Dials `replicas` in turn instead of the host the address names, from the one at
    /// `first`.
    pub fn balanced(mut self, replicas: Arc<Vec<String>>, first: usize) -> Self {
        self.replicas = replicas;
        self.next = AtomicUsize::new(first);
        self
    }
}

impl Dial for SimDial {
    fn dial<'a>(&'a self, addr: &'a str) -> DialFuture<'a> {
        Box::pin(async move {
            let target = match (self.replicas.len(), addr.rsplit_once(':')) {
                (0 | 1, _) | (_, None) => addr.to_string(),
                (n, Some((_, port))) => {
                    let i = self.next.fetch_add(1, Ordering::Relaxed) % n;
                    format!("{}:{port}", self.replicas[i])
                }
            };
            let tcp = turmoil::net::TcpStream::connect(target.as_str()).await?;
            let cut = self.cuts.token().cancelled_owned();
            Ok(Box::new(Cuttable { inner: tcp, cut: Box::pin(cut), broken: false }) as Box<dyn ByteStream>)
        })
    }
}

/// A stream that fails from the moment its host's connections are cut.
struct Cuttable {
    inner: turmoil::net::TcpStream,
    cut: Pin<Box<WaitForCancellationFutureOwned>>,
    broken: bool,
}

impl Cuttable {
    fn check(&mut self, cx: &mut Context<'_>) -> io::Result<()> {
        if !self.broken && self.cut.as_mut().poll(cx).is_ready() {
            self.broken = true;
        }
        if self.broken {
            Err(io::Error::new(io::ErrorKind::ConnectionReset, "connection cut (simulated)"))
        } else {
            Ok(())
        }
    }
}

impl AsyncRead for Cuttable {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Cuttable {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.check(cx)?;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The hub's listener on turmoil's TCP.
pub struct SimListener {
    inner: turmoil::net::TcpListener,
}

impl SimListener {
    /// Listens on `port` of the current host.
    pub async fn bind(port: u16) -> io::Result<Self> {
        Ok(Self { inner: turmoil::net::TcpListener::bind(("0.0.0.0", port)).await? })
    }
}

impl Accept for SimListener {
    fn accept(&mut self) -> Accepted<'_> {
        Box::pin(async move {
            let (tcp, peer) = self.inner.accept().await?;
            Ok((Stream::Other(Box::new(tcp)), peer))
        })
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        self.inner.local_addr()
    }
}
