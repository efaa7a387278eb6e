//! A minimal HTTP/1.0 GET for the hub's admin API: the client side of `/api/v1/…`.
//!
//! The sandbox's table (`up`), `status` and the benchmarks only read small JSON documents
//! from a plain-HTTP admin port; an HTTP client library would be a large dependency for
//! that, and living here keeps `up` and `status` independent of the benchmarks.

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest answer read (the admin API's documents are bounded well below it).
const MAX_BODY: u64 = 64 << 20;

/// Why a request to the admin API got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminHttpError {
    /// The TCP connection failed.
    #[error("cannot connect to {addr}")]
    Connect {
        /// `host:port`.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Writing the request failed.
    #[error("cannot send to {addr}")]
    Send {
        /// `host:port`.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Reading the answer failed.
    #[error("cannot read the answer of {addr}")]
    Read {
        /// `host:port`.
        addr: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The answer is no HTTP response.
    #[error("{addr}{path}: not an HTTP answer")]
    NotHttp {
        /// `host:port`.
        addr: String,
        /// The path asked for.
        path: String,
    },
    /// The answer's first line has no status code.
    #[error("{addr}{path}: no status in {line:?}")]
    NoStatus {
        /// `host:port`.
        addr: String,
        /// The path asked for.
        path: String,
        /// The answer's first line.
        line: String,
    },
}

/// The body of `GET path` at `addr` (`host:port`), whatever the status (the sandbox's table).
pub async fn get(addr: &str, path: &str) -> Result<String, AdminHttpError> {
    Ok(request(addr, path, None).await?.1)
}

/// `GET path` at `addr` with an optional bearer token: (status code, body).
pub async fn request(addr: &str, path: &str, token: Option<&str>) -> Result<(u16, String), AdminHttpError> {
    let mut s = tokio::net::TcpStream::connect(addr)
        .await
        .map_err(|source| AdminHttpError::Connect { addr: addr.into(), source })?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}\r\n").as_bytes())
        .await
        .map_err(|source| AdminHttpError::Send { addr: addr.into(), source })?;
    let mut buf = Vec::new();
    s.take(MAX_BODY)
        .read_to_end(&mut buf)
        .await
        .map_err(|source| AdminHttpError::Read { addr: addr.into(), source })?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) =
        text.split_once("\r\n\r\n").ok_or_else(|| AdminHttpError::NotHttp { addr: addr.into(), path: path.into() })?;
    let status =
        head.split_whitespace().nth(1).and_then(|c| c.parse().ok()).ok_or_else(|| AdminHttpError::NoStatus {
            addr: addr.into(),
            path: path.into(),
            line: head.lines().next().unwrap_or_default().into(),
        })?;
    Ok((status, body.to_string()))
}
