//! A minimal HTTP/1.0 GET for the hub's admin API.
//!
//! The sandbox's table (`up`), `status` and the benchmarks only read small JSON documents
//! from a plain-HTTP admin port; an HTTP client library would be a large dependency for
//! that, and living here (not in a benchmark) keeps `up` independent of the benchmarks.

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Largest answer read (the admin API's documents are bounded well below it).
const MAX_BODY: u64 = 64 << 20;

/// The body of `GET path` at `addr` (`host:port`), whatever the status (the sandbox's table).
#[cfg(feature = "sandbox")]
pub async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    Ok(request(addr, path, None).await?.1)
}

/// `GET path` at `addr` with an optional bearer token: (status code, body).
pub async fn request(addr: &str, path: &str, token: Option<&str>) -> anyhow::Result<(u16, String)> {
    let s = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("cannot connect to {addr}"))?;
    let auth = token.map(|t| format!("Authorization: Bearer {t}\r\n")).unwrap_or_default();
    let mut s = s;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\nAccept: application/json\r\n{auth}\r\n").as_bytes())
        .await
        .with_context(|| format!("cannot send to {addr}"))?;
    let mut buf = Vec::new();
    s.take(MAX_BODY).read_to_end(&mut buf).await.with_context(|| format!("cannot read the answer of {addr}"))?;
    let text = String::from_utf8_lossy(&buf);
    let (head, body) = text.split_once("\r\n\r\n").with_context(|| format!("{addr}{path}: not an HTTP answer"))?;
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .with_context(|| format!("{addr}{path}: no status in {:?}", head.lines().next().unwrap_or_default()))?;
    Ok((status, body.to_string()))
}
