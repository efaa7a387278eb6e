//! The HTTP client relays share, and how a target's answer is classified.
//!
//! reqwest over rustls with the ring provider (the binary installs it as the process
//! default). With `--target-ca` the target's certificate must chain to those CAs only; with
//! `--target-cert/--target-key` the relay presents a client certificate (mutual TLS).
//! Without either, the platform's roots are used. Redirects are not followed (a relay posts
//! to exactly the configured target), and every request has a timeout.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use rustls::RootCertStore;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How to reach a target.
#[derive(Debug, Clone)]
pub struct HttpOptions {
    /// CA bundles the target's certificate must chain to (none: the platform's roots).
    pub target_ca: Vec<PathBuf>,
    /// A client certificate (and its key) to present to the target.
    pub client_cert: Option<(PathBuf, PathBuf)>,
    /// Time allowed for one request, answer included.
    pub timeout: Duration,
}

impl Default for HttpOptions {
    fn default() -> Self {
        Self { target_ca: Vec::new(), client_cert: None, timeout: Duration::from_secs(10) }
    }
}

/// Why the HTTP client cannot be built.
#[derive(Debug, thiserror::Error)]
pub enum HttpError {
    /// A file cannot be read or parsed.
    #[error("{path}: {what}")]
    File {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// The TLS configuration or the client is invalid.
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

fn read(path: &PathBuf) -> Result<Vec<u8>, HttpError> {
    std::fs::read(path).map_err(|e| HttpError::File { path: path.display().to_string(), what: e.to_string() })
}

fn certs(path: &PathBuf) -> Result<Vec<CertificateDer<'static>>, HttpError> {
    let bytes = read(path)?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| HttpError::File { path: path.display().to_string(), what: format!("bad PEM: {e}") })?;
    if certs.is_empty() {
        return Err(HttpError::File { path: path.display().to_string(), what: "no certificate in file".into() });
    }
    Ok(certs)
}

/// The client for `opts`.
pub fn client(opts: &HttpOptions) -> Result<reqwest::Client, HttpError> {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        return Err(HttpError::Client("no rustls crypto provider installed (install ring's at start-up)".into()));
    }
    let mut builder = reqwest::Client::builder()
        .timeout(opts.timeout)
        .connect_timeout(opts.timeout)
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .pool_max_idle_per_host(4)
        .user_agent(concat!("fleetwatch-relay/", env!("CARGO_PKG_VERSION")));
    if !opts.target_ca.is_empty() || opts.client_cert.is_some() {
        if opts.target_ca.is_empty() {
            return Err(HttpError::Client("a client certificate for the target needs --target-ca".into()));
        }
        let mut roots = RootCertStore::empty();
        for p in &opts.target_ca {
            for c in certs(p)? {
                roots.add(c).map_err(|e| HttpError::File {
                    path: p.display().to_string(),
                    what: format!("unusable CA certificate: {e}"),
                })?;
            }
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| HttpError::Client(e.to_string()))?
            .with_root_certificates(roots);
        let config = match &opts.client_cert {
            Some((cert, key)) => {
                let key_bytes = read(key)?;
                let key_der = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| HttpError::File {
                    path: key.display().to_string(),
                    what: format!("no private key: {e}"),
                })?;
                config.with_client_auth_cert(certs(cert)?, key_der).map_err(|e| HttpError::File {
                    path: cert.display().to_string(),
                    what: format!("unusable client certificate: {e}"),
                })?
            }
            None => config.with_no_client_auth(),
        };
        builder = builder.tls_backend_preconfigured(config);
    }
    builder.build().map_err(|e| HttpError::Client(e.to_string()))
}

/// What became of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// 2xx: the target has it.
    Accepted,
    /// A passing failure (5xx, a 4xx other than 400/413/422 — auth, routing, 408, 429 —, a
    /// 1xx or 3xx, timeout, connection): try again later, with backoff. A 401, 403, 404 or
    /// 405 is most often a missing ingress route or a rotated credential, fixed by people
    /// while the relay waits: skipping would lose the events for good.
    Retry(String),
    /// The target refused it for good (400, 413, 422: the request itself is wrong): the
    /// status and the start of the body.
    Rejected {
        /// The HTTP status.
        status: u16,
        /// The first bytes of the answer, for the log.
        body: String,
    },
}

/// Most bytes of an answer's body kept for a log line.
const ANSWER_SNIPPET: usize = 256;

/// Sends `request` and classifies the answer. Never panics on what the target sends.
pub async fn send(request: reqwest::RequestBuilder) -> Outcome {
    let response = match request.send().await {
        Ok(r) => r,
        Err(e) => {
            let why = if e.is_timeout() {
                "timed out".to_string()
            } else if e.is_connect() {
                format!("cannot connect: {}", chain(&e))
            } else {
                chain(&e)
            };
            return Outcome::Retry(why);
        }
    };
    let status = response.status();
    if status.is_success() {
        return Outcome::Accepted;
    }
    // Only the first bytes: a target answering with a huge body costs nothing.
    let mut body = Vec::new();
    let mut response = response;
    while body.len() < ANSWER_SNIPPET {
        match tokio::time::timeout(Duration::from_secs(2), response.chunk()).await {
            Ok(Ok(Some(chunk))) => body.extend_from_slice(&chunk),
            _ => break,
        }
    }
    body.truncate(ANSWER_SNIPPET);
    let body = String::from_utf8_lossy(&body).trim().to_string();
    classify(status.as_u16(), body)
}

/// The outcome of an answer with `status`.
pub fn classify(status: u16, body: String) -> Outcome {
    match status {
        200..=299 => Outcome::Accepted,
        400 | 413 | 422 => Outcome::Rejected { status, body },
        _ => Outcome::Retry(format!("{status} {body}")),
    }
}

/// An error and its causes on one line.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let t = c.to_string();
        if !out.contains(&t) {
            out.push_str(": ");
            out.push_str(&t);
        }
        cur = c.source();
    }
    out
}

/// Lowercase hex of `bytes`.
pub(crate) fn hex(bytes: &[u8]) -> String {
    hex::encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_are_classified() {
        assert_eq!(classify(204, String::new()), Outcome::Accepted);
        assert!(matches!(classify(503, "busy".into()), Outcome::Retry(w) if w == "503 busy"));
        assert!(matches!(classify(429, String::new()), Outcome::Retry(_)));
        assert!(matches!(classify(408, String::new()), Outcome::Retry(_)));
        assert!(matches!(classify(302, String::new()), Outcome::Retry(_)));
        assert_eq!(classify(413, "big".into()), Outcome::Rejected { status: 413, body: "big".into() });
        assert_eq!(classify(400, String::new()), Outcome::Rejected { status: 400, body: String::new() });
        assert_eq!(classify(422, String::new()), Outcome::Rejected { status: 422, body: String::new() });
        for routing_or_auth in [401, 403, 404, 405, 409, 451] {
            assert!(
                matches!(classify(routing_or_auth, "no route".into()), Outcome::Retry(w) if w.starts_with(&routing_or_auth.to_string())),
                "{routing_or_auth}"
            );
        }
    }

    #[test]
    fn hex_is_lowercase() {
        assert_eq!(hex(&[0, 0xab, 0x10]), "00ab10");
    }
}
