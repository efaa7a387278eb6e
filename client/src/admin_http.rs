//! A GET of the hub's admin API over plain HTTP, for the sandbox's table (`up`) and the
//! benchmarks, which reach a hub they started on loopback. `fleetwatch status`, which also
//! speaks HTTPS with client certificates, has its own client on the same library.
//!
//! Over reqwest: a timeout on every request, the answer bounded by the bytes read.

use std::sync::OnceLock;
use std::time::Duration;

/// Largest answer read (the admin API's documents are bounded well below it).
const MAX_BODY: usize = 64 << 20;

/// How long one request may take: the hubs asked are local, and a caller that polls asks
/// again.
const TIMEOUT: Duration = Duration::from_secs(10);

/// Why a request to the admin API got no answer.
#[derive(Debug, thiserror::Error)]
pub enum AdminHttpError {
    /// The request failed: no connection, a timeout, a broken answer.
    #[error("http://{addr}{path}: {source}")]
    Request {
        /// `host:port`.
        addr: String,
        /// The path asked for.
        path: String,
        /// The cause.
        #[source]
        source: reqwest::Error,
    },
    /// The answer is larger than this client reads.
    #[error("http://{addr}{path}: the answer is larger than {} MiB", MAX_BODY >> 20)]
    TooLarge {
        /// `host:port`.
        addr: String,
        /// The path asked for.
        path: String,
    },
}

/// One client for the process: connections to a hub are kept between polls.
fn client() -> &'static reqwest::Client {
    static CLIENT: OnceLock<reqwest::Client> = OnceLock::new();
    CLIENT.get_or_init(|| {
        // reqwest sets up rustls even for plain HTTP: the process's provider (ring) first.
        fleetwatch_certs::install_crypto_provider();
        reqwest::Client::builder()
            .timeout(TIMEOUT)
            .connect_timeout(TIMEOUT)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .build()
            // Without TLS options the builder has nothing that can fail but the system's
            // resolver set-up; the default client is the same without the limits.
            .unwrap_or_default()
    })
}

/// The body of `GET path` at `addr` (`host:port`), whatever the status (the sandbox's table).
///
/// ```no_run
/// # async fn f() -> Result<(), fleetwatch_client::admin_http::AdminHttpError> {
/// let clusters = fleetwatch_client::admin_http::get("127.0.0.1:9090", "/api/v1/clusters").await?;
/// # Ok(()) }
/// ```
pub async fn get(addr: &str, path: &str) -> Result<String, AdminHttpError> {
    Ok(request(addr, path, None).await?.1)
}

/// `GET path` at `addr` with an optional bearer token: (status code, body).
pub async fn request(addr: &str, path: &str, token: Option<&str>) -> Result<(u16, String), AdminHttpError> {
    let failed = |source| AdminHttpError::Request { addr: addr.into(), path: path.into(), source };
    let mut req = client().get(format!("http://{addr}{path}")).header(reqwest::header::ACCEPT, "application/json");
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    let mut resp = req.send().await.map_err(failed)?;
    let status = resp.status().as_u16();
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(failed)? {
        if body.len() + chunk.len() > MAX_BODY {
            return Err(AdminHttpError::TooLarge { addr: addr.into(), path: path.into() });
        }
        body.extend_from_slice(&chunk);
    }
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}
