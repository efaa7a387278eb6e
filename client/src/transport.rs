//! WebSocket over mutual TLS: the client side used by agents and subscribers.

use std::sync::Arc;
use std::time::Duration;

use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::net::TcpStream;
use tokio_rustls::TlsConnector;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::protocol::WebSocketConfig;

use fleetwatch_protocol::codec::Limits;
use fleetwatch_protocol::message::WS_PATH;

/// A client's WebSocket to the hub.
pub type ClientWs = WebSocketStream<tokio_rustls::client::TlsStream<TcpStream>>;

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

/// The WebSocket settings matching our limits. The write buffer is bounded too (tungstenite
/// leaves it unbounded by default): a peer that stops reading cannot make us buffer more
/// than about two messages; the send then waits (and a stall timeout ends it).
pub fn ws_config(limits: &Limits) -> WebSocketConfig {
    let base = WebSocketConfig::default();
    let max_write = base.write_buffer_size + 2 * limits.max_message_bytes + (64 << 10);
    base.max_message_size(Some(limits.max_message_bytes))
        .max_frame_size(Some(limits.max_message_bytes))
        .max_write_buffer_size(max_write)
}

/// Opens a WebSocket over mutual TLS to the hub.
pub async fn connect(
    url: &HubUrl,
    tls: Arc<ClientConfig>,
    limits: &Limits,
    timeout: Duration,
) -> Result<ClientWs, ConnectError> {
    let addr = url.authority();
    let fut = async {
        let tcp = TcpStream::connect(&addr).await.map_err(|source| ConnectError::Tcp { addr: addr.clone(), source })?;
        let _ = tcp.set_nodelay(true);
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
