//! WebSocket over mutual TLS: the client side used by agents and subscribers.

use std::future::Future;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpSocket, TcpStream};
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use fleetwatch_protocol::codec::Limits;
use fleetwatch_protocol::message::WS_PATH;

/// A client's WebSocket to the hub.
pub type ClientWs = WebSocketStream<tokio_rustls::client::TlsStream<Stream>>;

/// A byte stream TLS can run over: anything that reads and writes asynchronously.
pub trait ByteStream: AsyncRead + AsyncWrite + Unpin + Send + 'static {}

impl<T: AsyncRead + AsyncWrite + Unpin + Send + 'static> ByteStream for T {}

/// The byte stream under a connection's TLS, on both ends: a TCP socket in every program,
/// or another stream (the deterministic simulation's network, `fleetwatch-dst`). An enum
/// rather than a boxed stream so the TCP path costs one branch, no allocation or vtable.
pub enum Stream {
    /// A TCP socket.
    Tcp(TcpStream),
    /// Any other byte stream.
    Other(Box<dyn ByteStream>),
}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Stream::Tcp(t) => t.fmt(f),
            Stream::Other(_) => f.write_str("Stream::Other"),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Other(s) => Pin::new(s).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Other(s) => Pin::new(s).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_flush(cx),
            Stream::Other(s) => Pin::new(s).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Other(s) => Pin::new(s).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Tcp(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Other(s) => Pin::new(s).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Tcp(s) => s.is_write_vectored(),
            Stream::Other(s) => s.is_write_vectored(),
        }
    }
}

/// What a [`Dialer`] answers: a connected stream, or why not.
pub type DialFuture<'a> = Pin<Box<dyn Future<Output = io::Result<Box<dyn ByteStream>>> + Send + 'a>>;

/// Opens byte streams to `host:port` addresses another way than TCP (the simulation).
pub trait Dial: Send + Sync + 'static {
    /// Connects to `addr` (`host:port`).
    fn dial<'a>(&'a self, addr: &'a str) -> DialFuture<'a>;
}

/// How clients reach the hub: TCP (the default, optionally from a chosen local address),
/// or a [`Dial`] implementation.
#[derive(Clone, Default)]
pub struct Dialer {
    custom: Option<Arc<dyn Dial>>,
    source: Option<IpAddr>,
}

impl Dialer {
    /// Dials with `dial` instead of TCP.
    pub fn custom(dial: Arc<dyn Dial>) -> Self {
        Self { custom: Some(dial), source: None }
    }

    /// Dials TCP from the local address `source` (port chosen by the system): a host with
    /// several addresses picks the one the hub sees, and the hub bench gives each synthetic
    /// agent its own loopback address, as each agent of a real fleet has its own, so the
    /// hub's per-address handshake budget is measured as a fleet meets it.
    ///
    /// ```
    /// use fleetwatch_client::transport::Dialer;
    /// let d = Dialer::from_source("127.0.0.7".parse().unwrap());
    /// assert_eq!(format!("{d:?}"), "Dialer(tcp from 127.0.0.7)");
    /// ```
    pub fn from_source(source: IpAddr) -> Self {
        Self { custom: None, source: Some(source) }
    }

    /// A connected stream to `addr`.
    async fn open(&self, addr: &str) -> io::Result<Stream> {
        if let Some(d) = &self.custom {
            return Ok(Stream::Other(d.dial(addr).await?));
        }
        let tcp = match self.source {
            None => TcpStream::connect(addr).await?,
            Some(source) => connect_from(source, addr).await?,
        };
        let _ = tcp.set_nodelay(true);
        Ok(Stream::Tcp(tcp))
    }
}

/// Connects to the first address `addr` resolves to (of `source`'s family) that answers,
/// from `source`: what [`TcpStream::connect`] does, with the local address bound first.
async fn connect_from(source: IpAddr, addr: &str) -> io::Result<TcpStream> {
    let mut last = None;
    for target in tokio::net::lookup_host(addr).await? {
        if target.is_ipv4() != source.is_ipv4() {
            continue;
        }
        let socket = if source.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
        socket.bind(SocketAddr::new(source, 0))?;
        match socket.connect(target).await {
            Ok(tcp) => return Ok(tcp),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{addr} has no address of the family of {source}"))
    }))
}

impl std::fmt::Debug for Dialer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match (&self.custom, self.source) {
            (Some(_), _) => f.write_str("Dialer(custom)"),
            (None, Some(source)) => write!(f, "Dialer(tcp from {source})"),
            (None, None) => f.write_str("Dialer(tcp)"),
        }
    }
}

/// A parsed `wss://host:port` hub address.
///
/// ```
/// use fleetwatch_client::transport::HubUrl;
/// let u: HubUrl = "wss://127.0.0.1:7443".parse().unwrap();
/// assert_eq!(u.authority(), "127.0.0.1:7443");
/// assert!("http://x:1".parse::<HubUrl>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubUrl {
    /// Host name or IP address (without brackets).
    pub host: String,
    /// Port.
    pub port: u16,
}

impl HubUrl {
    /// `host:port`, with brackets around an IPv6 address.
    pub fn authority(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl std::fmt::Display for HubUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "wss://{}", self.authority())
    }
}

impl std::str::FromStr for HubUrl {
    type Err = ConnectError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = |why: &str| ConnectError::BadUrl(format!("{s:?}: {why}"));
        let rest = s.strip_prefix("wss://").ok_or_else(|| bad("must start with wss://"))?;
        let rest = rest.split('/').next().unwrap_or_default();
        let (host, port) = if let Some(v6) = rest.strip_prefix('[') {
            let (h, p) = v6.split_once("]:").ok_or_else(|| bad("expected [ipv6]:port"))?;
            (h, p)
        } else {
            rest.rsplit_once(':').ok_or_else(|| bad("missing :port"))?
        };
        if host.is_empty() {
            return Err(bad("missing host"));
        }
        let port = port.parse().map_err(|_| bad("port is not a number from 1 to 65535"))?;
        Ok(Self { host: host.into(), port })
    }
}

/// The hub replicas a client may reach, in the order it tries them: several hubs on one
/// JetStream stream serve the same fleet, so a client fails over to the next when one is
/// unreachable. Never empty.
///
/// ```
/// use fleetwatch_client::transport::HubUrls;
/// let hubs: HubUrls = "wss://hub-0:7443,wss://hub-1:7443".parse().unwrap();
/// assert_eq!(hubs.len(), 2);
/// assert_eq!(hubs.to_string(), "wss://hub-0:7443,wss://hub-1:7443");
/// assert!("".parse::<HubUrls>().is_err());
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HubUrls(Vec<HubUrl>);

impl HubUrls {
    /// The list; refuses an empty one.
    pub fn new(urls: Vec<HubUrl>) -> Result<Self, ConnectError> {
        if urls.is_empty() {
            return Err(ConnectError::BadUrl("no hub address given".into()));
        }
        Ok(Self(urls))
    }

    /// Parses every address (each may itself be a comma-separated list).
    pub fn parse_all<S: AsRef<str>>(items: &[S]) -> Result<Self, ConnectError> {
        let mut urls = Vec::new();
        for item in items {
            for part in item.as_ref().split(',').map(str::trim).filter(|p| !p.is_empty()) {
                urls.push(part.parse()?);
            }
        }
        Self::new(urls)
    }

    /// How many hubs.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Always false: the list is never empty (for clippy's `len_without_is_empty`).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The hubs, in order.
    pub fn iter(&self) -> impl Iterator<Item = &HubUrl> {
        self.0.iter()
    }

    /// The hub at `i`, wrapping around.
    pub fn get(&self, i: usize) -> &HubUrl {
        &self.0[i % self.0.len()]
    }
}

impl From<HubUrl> for HubUrls {
    fn from(url: HubUrl) -> Self {
        Self(vec![url])
    }
}

impl std::fmt::Display for HubUrls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, u) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            write!(f, "{u}")?;
        }
        Ok(())
    }
}

impl std::str::FromStr for HubUrls {
    type Err = ConnectError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse_all(&[s])
    }
}

/// Why a connection to the hub failed.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The address is not `wss://host:port`.
    #[error("bad hub address {0}")]
    BadUrl(String),
    /// TCP connect failed.
    #[error("cannot reach hub at {addr}: {source}")]
    Tcp {
        /// Where.
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The TLS handshake failed (certificate not trusted, wrong CA, revoked, ...); with
    /// TLS 1.3 also the hub refusing our certificate, which shows after the handshake.
    #[error("TLS handshake with hub at {addr} failed: {why}")]
    Tls {
        /// Where.
        addr: String,
        /// What to fix when known (see [`crate::tls_hint`]), else the TLS error.
        why: String,
    },
    /// The WebSocket upgrade failed.
    #[error("WebSocket handshake with hub at {addr} failed: {source}")]
    WebSocket {
        /// Where.
        addr: String,
        /// Why.
        source: Box<tokio_tungstenite::tungstenite::Error>,
    },
    /// Connecting took too long.
    #[error("connecting to hub at {0} timed out")]
    Timeout(String),
}

/// Bytes tungstenite reads (and first zeroes) per read of a WebSocket.
///
/// Its default, 128 KiB, is allocated per connection and zeroed on *every* read, however
/// small the frame: with a thousand agents sending small batches that memset was a quarter
/// of the CPU of each side, and 128 KiB of every connection's memory. Our frames are
/// mostly a few KiB; a larger one is read in several reads into a buffer reserved for its
/// whole length once its header is known.
pub const READ_BUFFER_BYTES: usize = 8 << 10;

/// The WebSocket settings matching our limits. The write buffer is bounded too (tungstenite
/// leaves it unbounded by default): a peer that stops reading cannot make us buffer more
/// than about two messages; the send then waits (and a stall timeout ends it). Reads use
/// [`READ_BUFFER_BYTES`].
pub fn ws_config(limits: &Limits) -> WebSocketConfig {
    let base = WebSocketConfig::default().read_buffer_size(READ_BUFFER_BYTES);
    let max_write = base.write_buffer_size + 2 * limits.max_message_bytes + (64 << 10);
    base.max_message_size(Some(limits.max_message_bytes))
        .max_frame_size(Some(limits.max_message_bytes))
        .max_write_buffer_size(max_write)
}

/// Opens a WebSocket over mutual TLS over TCP to the hub.
pub async fn connect(
    url: &HubUrl,
    tls: Arc<ClientConfig>,
    limits: &Limits,
    timeout: Duration,
) -> Result<ClientWs, ConnectError> {
    connect_with(&Dialer::default(), url, tls, limits, timeout).await
}

/// Opens a WebSocket over mutual TLS to the hub, over a stream from `dialer`.
pub async fn connect_with(
    dialer: &Dialer,
    url: &HubUrl,
    tls: Arc<ClientConfig>,
    limits: &Limits,
    timeout: Duration,
) -> Result<ClientWs, ConnectError> {
    let addr = url.authority();
    let fut = async {
        let tcp = dialer.open(&addr).await.map_err(|source| ConnectError::Tcp { addr: addr.clone(), source })?;
        let name = ServerName::try_from(url.host.clone()).map_err(|e| ConnectError::BadUrl(format!("{url}: {e}")))?;
        let tls_stream = TlsConnector::from(tls).connect(name, tcp).await.map_err(|e| ConnectError::Tls {
            addr: addr.clone(),
            why: crate::tls_hint::client_side(&e, &url.host).unwrap_or_else(|| e.to_string()),
        })?;
        let request = format!("wss://{addr}{WS_PATH}");
        let (ws, _resp) = tokio_tungstenite::client_async_with_config(request, tls_stream, Some(ws_config(limits)))
            .await
            .map_err(|e| match crate::tls_hint::client_side(&e, &url.host) {
                // TLS 1.3: the hub's verdict on our certificate arrives as an alert here.
                Some(why) => ConnectError::Tls { addr: addr.clone(), why },
                None => ConnectError::WebSocket { addr: addr.clone(), source: Box::new(e) },
            })?;
        Ok(ws)
    };
    tokio::time::timeout(timeout, fut).await.map_err(|_| ConnectError::Timeout(addr.clone()))?
}

/// Connects to the first hub of `hubs` that answers, starting at index `start` and going
/// round once in order; answers the connection and the index of the hub it reached. When
/// none answers, the error of the last attempt says why (each attempt is logged).
///
/// A refusal after the WebSocket upgrade (revoked, identity in use) is the hub's verdict,
/// not a reachability problem, and is the caller's to handle: this only fails over on
/// errors where another replica may do better.
pub async fn connect_any(
    dialer: &Dialer,
    hubs: &HubUrls,
    start: usize,
    tls: Arc<ClientConfig>,
    limits: &Limits,
    timeout: Duration,
) -> Result<(ClientWs, usize), ConnectError> {
    let mut last = None;
    for k in 0..hubs.len() {
        let i = (start + k) % hubs.len();
        match connect_with(dialer, hubs.get(i), tls.clone(), limits, timeout).await {
            Ok(ws) => return Ok((ws, i)),
            Err(e) => {
                if hubs.len() > 1 {
                    tracing::warn!(hub = %hubs.get(i), error = %e, "hub unreachable; trying the next");
                }
                last = Some(e);
            }
        }
    }
    Err(last.unwrap_or_else(|| ConnectError::BadUrl("no hub address given".into())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_source_address_is_what_the_other_end_sees() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        let source: IpAddr = "127.3.2.1".parse().unwrap();
        let dialer = Dialer::from_source(source);
        let (dialed, accepted) = tokio::join!(dialer.open(&addr), listener.accept());
        assert!(matches!(dialed.unwrap(), Stream::Tcp(_)));
        assert_eq!(accepted.unwrap().1.ip(), source);
        // Without one, the system picks (127.0.0.1 on loopback).
        let dialer = Dialer::default();
        let (dialed, accepted) = tokio::join!(dialer.open(&addr), listener.accept());
        dialed.unwrap();
        assert_eq!(accepted.unwrap().1.ip(), "127.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[tokio::test]
    async fn a_source_of_the_other_family_says_so() {
        let dialer = Dialer::from_source("::1".parse().unwrap());
        let err = dialer.open("127.0.0.1:9").await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::AddrNotAvailable);
        assert!(err.to_string().contains("no address of the family of ::1"), "{err}");
    }
}
