//! The hub's admin API as `fleetwatch status` reads it: plain HTTP or HTTPS (with a client
//! certificate when the hub was started with `--admin-client-ca`), a bearer token, a
//! timeout on every request and answers bounded by the bytes read.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Largest answer read: the admin API pages its lists (at most 1,000 items a page), so a
/// larger answer is not the hub's.
const MAX_BODY: usize = 64 << 20;

/// How `status` reaches the admin endpoint.
#[derive(clap::Args, Debug, Clone)]
pub struct AdminArgs {
    /// The hub's admin endpoint: http://HOST:PORT, or https://HOST:PORT when the hub serves
    /// it with TLS (`--admin-client-ca`; then give --admin-ca and a client certificate).
    #[arg(long, env = "FLEETWATCH_ADMIN", default_value = "http://127.0.0.1:9090")]
    pub admin: String,
    /// File with the admin endpoint's bearer token (the hub's --admin-token-file).
    #[arg(long, env = "FLEETWATCH_ADMIN_TOKEN_FILE")]
    pub admin_token_file: Option<PathBuf>,
    /// CA bundle that signed the admin endpoint's server certificate (https only; the hub's
    /// CA for its own certificate).
    #[arg(long, env = "FLEETWATCH_ADMIN_CA")]
    pub admin_ca: Option<PathBuf>,
    /// Client certificate for an admin endpoint that requires one (`--admin-client-ca` on the
    /// hub), with --admin-key.
    #[arg(long, env = "FLEETWATCH_ADMIN_CERT", requires = "admin_key")]
    pub admin_cert: Option<PathBuf>,
    /// The client certificate's private key.
    #[arg(long, env = "FLEETWATCH_ADMIN_KEY", requires = "admin_cert")]
    pub admin_key: Option<PathBuf>,
    /// Seconds each request to the admin endpoint may take.
    #[arg(long, default_value_t = 30.0)]
    pub admin_timeout: f64,
}

/// A client of one admin endpoint.
pub struct Admin {
    base: reqwest::Url,
    client: reqwest::Client,
    token: Option<String>,
}

impl Admin {
    /// The client `args` describe; refuses what cannot work (an https endpoint without its
    /// CA, a certificate for plain HTTP) with the reason.
    pub fn new(args: &AdminArgs) -> anyhow::Result<Self> {
        let base = reqwest::Url::parse(&args.admin)
            .with_context(|| format!("--admin {:?}: expected http://HOST:PORT or https://HOST:PORT", args.admin))?;
        let https = match base.scheme() {
            "http" => false,
            "https" => true,
            other => bail!("--admin {}: scheme {other:?}: use http:// or https://", args.admin),
        };
        if base.host_str().is_none_or(str::is_empty) {
            bail!("--admin {:?}: no host", args.admin);
        }
        let token = match &args.admin_token_file {
            Some(f) => Some(
                std::fs::read_to_string(f)
                    .with_context(|| format!("cannot read --admin-token-file {}", f.display()))?
                    .trim()
                    .to_string(),
            ),
            None => None,
        };
        let timeout = Duration::try_from_secs_f64(args.admin_timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .context("--admin-timeout must be a positive number of seconds")?;
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(concat!("fleetwatch-status/", env!("CARGO_PKG_VERSION")));
        if https {
            builder = builder.tls_backend_preconfigured(tls_config(args)?);
        } else if args.admin_ca.is_some() || args.admin_cert.is_some() {
            bail!("--admin {}: --admin-ca and --admin-cert are for an https:// endpoint", args.admin);
        }
        let client = builder.build().context("cannot build the HTTP client")?;
        Ok(Self { base, client, token })
    }

    /// `GET path` (with `query`) as JSON; a status other than 200 is an error naming the URL.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<T> {
        let mut url = self.base.join(path).with_context(|| format!("{}{path}: not a URL", self.base))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut req = self.client.get(url.clone()).header(reqwest::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.bearer_auth(t);
        }
        let mut resp = req.send().await.with_context(|| format!("cannot reach {url}"))?;
        let status = resp.status();
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.with_context(|| format!("cannot read the answer of {url}"))? {
            if body.len() + chunk.len() > MAX_BODY {
                bail!("{url}: the answer is larger than {} MiB", MAX_BODY >> 20);
            }
            body.extend_from_slice(&chunk);
        }
        match status.as_u16() {
            200 => serde_json::from_slice(&body).with_context(|| format!("{url}: unexpected answer")),
            401 => bail!(
                "{url}: 401 unauthorized: give the hub's token with --admin-token-file{}",
                if url.scheme() == "https" {
                    ", or a client certificate of its --admin-client-ca with --admin-cert"
                } else {
                    ""
                }
            ),
            other => bail!("{url}: HTTP {other}: {}", String::from_utf8_lossy(&body).trim()),
        }
    }
}

/// The TLS configuration of an https endpoint: its CA, and the client certificate if given.
fn tls_config(args: &AdminArgs) -> anyhow::Result<rustls::ClientConfig> {
    let Some(ca) = &args.admin_ca else {
        bail!("--admin {}: an https endpoint needs --admin-ca (the CA of its server certificate)", args.admin);
    };
    let mut roots = RootCertStore::empty();
    let pem = std::fs::read(ca).with_context(|| format!("cannot read --admin-ca {}", ca.display()))?;
    let mut found = 0;
    for cert in CertificateDer::pem_slice_iter(&pem) {
        let cert = cert.with_context(|| format!("--admin-ca {}: not PEM certificates", ca.display()))?;
        roots.add(cert).with_context(|| format!("--admin-ca {}: unusable CA certificate", ca.display()))?;
        found += 1;
    }
    if found == 0 {
        bail!("--admin-ca {}: no certificate in the file", ca.display());
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .with_root_certificates(roots);
    Ok(match (&args.admin_cert, &args.admin_key) {
        (Some(cert), Some(key)) => {
            let pem = std::fs::read(cert).with_context(|| format!("cannot read --admin-cert {}", cert.display()))?;
            let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&pem)
                .collect::<Result<_, _>>()
                .with_context(|| format!("--admin-cert {}: not PEM certificates", cert.display()))?;
            if chain.is_empty() {
                bail!("--admin-cert {}: no certificate in the file", cert.display());
            }
            let key_pem = std::fs::read(key).with_context(|| format!("cannot read --admin-key {}", key.display()))?;
            let key_der = PrivateKeyDer::from_pem_slice(&key_pem)
                .with_context(|| format!("--admin-key {}: no private key", key.display()))?;
            config
                .with_client_auth_cert(chain, key_der)
                .with_context(|| format!("--admin-cert {}: unusable with its key", cert.display()))?
        }
        _ => config.with_no_client_auth(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(admin: &str) -> AdminArgs {
        AdminArgs {
            admin: admin.into(),
            admin_token_file: None,
            admin_ca: None,
            admin_cert: None,
            admin_key: None,
            admin_timeout: 30.0,
        }
    }

    #[test]
    fn endpoints_that_cannot_work_are_refused_with_the_reason() {
        fleetwatch_certs::install_crypto_provider();
        assert!(Admin::new(&args("http://127.0.0.1:9090")).is_ok());
        assert!(Admin::new(&args("http://hub/")).is_ok());
        let e = Admin::new(&args("https://hub:9090")).err().unwrap();
        assert!(format!("{e:#}").contains("needs --admin-ca"), "{e:#}");
        let e = Admin::new(&args("ftp://hub")).err().unwrap();
        assert!(format!("{e:#}").contains("use http:// or https://"), "{e:#}");
        let e = Admin::new(&args("127.0.0.1:9090")).err().unwrap();
        assert!(format!("{e:#}").contains("--admin"), "{e:#}");
        let mut a = args("http://hub:9090");
        a.admin_ca = Some("/etc/hostname".into());
        let e = Admin::new(&a).err().unwrap();
        assert!(format!("{e:#}").contains("for an https:// endpoint"), "{e:#}");
        let mut a = args("http://hub:9090");
        a.admin_timeout = 0.0;
        assert!(Admin::new(&a).is_err());
    }
}
