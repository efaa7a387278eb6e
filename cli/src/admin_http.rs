//! A minimal HTTP/1.0 GET for the hub's admin API on loopback.
//!
//! The sandbox's table (`up`) and the benchmarks only read a small JSON document from a
//! local, plain-HTTP admin port; an HTTP client library would be a large dependency for
//! that, and living here (not in a benchmark) keeps `up` independent of the benchmarks.

use anyhow::Context;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The body of `GET path` at `addr` (`host:port`), whatever the status.
pub async fn get(addr: &str, path: &str) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await.with_context(|| format!("cannot connect to {addr}"))?;
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes()).await?;
    let mut buf = String::new();
    s.read_to_string(&mut buf).await?;
    Ok(buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}
