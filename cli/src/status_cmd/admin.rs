//! The hub's admin API as `fleetwatch status` reads it: plain HTTP or HTTPS (with a client
//! certificate when the hub was started with `--admin-client-ca`), or through the
//! Kubernetes API server's service proxy with a kubeconfig (`--kubeconfig`, `--context`,
//! `--service`: no port-forward); a timeout on every request and answers bounded by the
//! bytes read.
//!
//! Through the proxy, the API server authenticates the kubeconfig's user with
//! `Authorization` and does not forward that header, so the admin token travels in
//! `X-Fleetwatch-Admin-Token` (decision 0040); the user needs `get` on `services/proxy` in
//! the hub's namespace.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use http_body_util::BodyExt;
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
    #[arg(long, env = "FLEETWATCH_ADMIN", default_value = DEFAULT_ADMIN)]
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
    /// Reach the admin API through the Kubernetes API server's service proxy with this
    /// kubeconfig (its current context, or --context), instead of --admin. Its user needs
    /// `get` on `services/proxy` in the hub's namespace.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["admin_ca", "admin_cert"])]
    pub kubeconfig: Option<PathBuf>,
    /// The kubeconfig context for the service proxy (implies the proxy; without --kubeconfig,
    /// the kubeconfig kubectl would use: KUBECONFIG or ~/.kube/config).
    #[arg(long, value_name = "NAME", conflicts_with_all = ["admin_ca", "admin_cert"])]
    pub context: Option<String>,
    /// The hub's admin Service for the service proxy, NAMESPACE/NAME:PORT (PORT its name or
    /// number; implies the proxy). Default: the chart's, installed as documented
    /// (fleetwatch-system/fleetwatch-hub-admin:admin).
    #[arg(long, value_name = "NS/NAME:PORT", conflicts_with_all = ["admin_ca", "admin_cert"])]
    pub service: Option<String>,
}

/// `--admin`'s default: the hub's admin port on this host.
const DEFAULT_ADMIN: &str = "http://127.0.0.1:9090";

/// The admin Service the chart renders for a release `fleetwatch` in `fleetwatch-system`
/// (docs/deploy.md): `--service`'s default.
pub const DEFAULT_SERVICE: &str = "fleetwatch-system/fleetwatch-hub-admin:admin";

/// The header carrying the admin token through the service proxy (the hub's
/// `X-Fleetwatch-Admin-Token`).
const TOKEN_HEADER: &str = "x-fleetwatch-admin-token";

impl AdminArgs {
    /// Whether the admin API is reached through the Kubernetes API server.
    fn via_proxy(&self) -> bool {
        self.kubeconfig.is_some() || self.context.is_some() || self.service.is_some()
    }

    /// Whether `--admin` was given on the command line (not its default, not
    /// `FLEETWATCH_ADMIN`, which a shell may export for every use: the proxy flags win
    /// over it rather than conflict with it).
    fn admin_given(&self) -> bool {
        self.admin != DEFAULT_ADMIN && std::env::var("FLEETWATCH_ADMIN").ok().as_deref() != Some(self.admin.as_str())
    }
}

/// A client of one admin endpoint.
pub struct Admin {
    transport: Transport,
    token: Option<String>,
    timeout: Duration,
}

/// How requests reach the hub.
enum Transport {
    /// Straight to `--admin`.
    Direct { base: reqwest::Url, client: reqwest::Client },
    /// Through the API server's service proxy: `prefix` is
    /// `/api/v1/namespaces/NS/services/NAME:PORT/proxy`.
    Proxy { client: kube::Client, prefix: String, namespace: String, service: String, server: String },
}

/// `NS/NAME:PORT` → (NS, NAME:PORT); NAME and PORT as the API server takes them.
fn parse_service(s: &str) -> anyhow::Result<(String, String)> {
    let bad = || format!("--service {s:?}: expected NAMESPACE/NAME:PORT, e.g. {DEFAULT_SERVICE}");
    let (ns, svc) = s.split_once('/').with_context(bad)?;
    let (name, port) = svc.split_once(':').with_context(bad)?;
    let dns_label = |x: &str| {
        !x.is_empty()
            && x.len() <= 63
            && x.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
            && !x.starts_with('-')
            && !x.ends_with('-')
    };
    if !dns_label(ns) || !dns_label(name) || !dns_label(port) {
        bail!("{}: namespace, name and port must be DNS labels (a-z, 0-9, '-')", bad());
    }
    Ok((ns.to_string(), format!("{name}:{port}")))
}

impl Admin {
    /// The client `args` describe; refuses what cannot work (an https endpoint without its
    /// CA, a certificate for plain HTTP, a kubeconfig that gives no client) with the reason.
    pub async fn new(args: &AdminArgs) -> anyhow::Result<Self> {
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
        if args.via_proxy() && args.admin_given() {
            bail!(
                "--admin {} and --kubeconfig/--context/--service are two ways to reach the hub: give one",
                args.admin
            );
        }
        let transport = if args.via_proxy() { proxy(args, timeout).await? } else { direct(args, timeout)? };
        Ok(Self { transport, token, timeout })
    }

    /// `GET path` (with `query`) as JSON; a status other than 200 is an error naming the URL.
    pub async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<T> {
        match &self.transport {
            Transport::Direct { base, client } => self.get_direct(base, client, path, query).await,
            Transport::Proxy { client, prefix, namespace, service, server } => {
                let what = Proxied { namespace, service, server };
                tokio::time::timeout(self.timeout, self.get_proxied(client, prefix, &what, path, query))
                    .await
                    .unwrap_or_else(|_| {
                        bail!("{}: no answer within {} s (--admin-timeout)", what.url(path), self.timeout.as_secs_f64())
                    })
            }
        }
    }

    async fn get_direct<T: serde::de::DeserializeOwned>(
        &self,
        base: &reqwest::Url,
        client: &reqwest::Client,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<T> {
        let mut url = base.join(path).with_context(|| format!("{base}{path}: not a URL"))?;
        if !query.is_empty() {
            url.query_pairs_mut().extend_pairs(query);
        }
        let mut req = client.get(url.clone()).header(reqwest::header::ACCEPT, "application/json");
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

    async fn get_proxied<T: serde::de::DeserializeOwned>(
        &self,
        client: &kube::Client,
        prefix: &str,
        what: &Proxied<'_>,
        path: &str,
        query: &[(&str, &str)],
    ) -> anyhow::Result<T> {
        let mut target = format!("{prefix}{path}");
        if !query.is_empty() {
            // Encoded as the direct path encodes it (url's form encoding).
            let encoded = reqwest::Url::parse_with_params("http://x/", query).context("query")?;
            target.push('?');
            target.push_str(encoded.query().unwrap_or(""));
        }
        let mut req = http::Request::get(&target).header(http::header::ACCEPT, "application/json");
        if let Some(t) = &self.token {
            req = req.header(TOKEN_HEADER, t);
        }
        let req = req.body(kube::client::Body::from(Vec::new())).with_context(|| format!("{target}: not a request"))?;
        let url = what.url(path);
        let resp = client.send(req).await.with_context(|| format!("cannot reach {url}"))?;
        let status = resp.status().as_u16();
        let body = match http_body_util::Limited::new(resp.into_body(), MAX_BODY).collect().await {
            Ok(b) => b.to_bytes(),
            Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => {
                bail!("{url}: the answer is larger than {} MiB", MAX_BODY >> 20)
            }
            Err(e) => return Err(anyhow::anyhow!(e)).with_context(|| format!("cannot read the answer of {url}")),
        };
        if status == 200 {
            return serde_json::from_slice(&body).with_context(|| format!("{url}: unexpected answer"));
        }
        // A Status object is the API server's own answer; anything else is the hub's.
        let api_status = serde_json::from_slice::<serde_json::Value>(&body)
            .ok()
            .filter(|v| v["kind"] == "Status")
            .map(|v| v["message"].as_str().unwrap_or_default().to_string());
        let (ns, svc) = (what.namespace, what.service);
        match (status, api_status) {
            (403, Some(m)) => bail!(
                "{url}: the Kubernetes API server refused: {m}: the kubeconfig's user needs verb get on services/proxy \
                 in namespace {ns} (e.g. the ClusterRole edit bound there, or a Role with resources [services/proxy], verbs [get])"
            ),
            (401, Some(m)) => {
                bail!("{url}: the Kubernetes API server did not accept the kubeconfig's credentials ({m})")
            }
            (404, Some(m)) => bail!(
                "{url}: {m}: no Service {ns}/{} (--service NAMESPACE/NAME:PORT; the chart's is \
                 NAMESPACE/RELEASE-fleetwatch-hub-admin:admin, or RELEASE-hub-admin when the release name \
                 contains fleetwatch)",
                svc.split(':').next().unwrap_or_default()
            ),
            (503, Some(m)) => bail!("{url}: {m} (is the hub running and ready behind Service {ns}/{svc}?)"),
            (code, Some(m)) => bail!("{url}: the Kubernetes API server answered {code}: {m}"),
            (401, None) => bail!(
                "{url}: 401 unauthorized by the hub: give its admin token with --admin-token-file (sent through the \
                 proxy as X-Fleetwatch-Admin-Token, which needs a hub of this version)"
            ),
            (code, None) => bail!("{url}: HTTP {code}: {}", String::from_utf8_lossy(&body).trim()),
        }
    }
}

/// What a proxied request names in its messages.
struct Proxied<'a> {
    namespace: &'a str,
    service: &'a str,
    server: &'a str,
}

impl Proxied<'_> {
    /// The URL as the API server is asked it (for messages).
    fn url(&self, path: &str) -> String {
        format!("{}/api/v1/namespaces/{}/services/{}/proxy{path}", self.server, self.namespace, self.service)
    }
}

/// Straight to `--admin`.
fn direct(args: &AdminArgs, timeout: Duration) -> anyhow::Result<Transport> {
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
    Ok(Transport::Direct { base, client })
}

/// Through the API server's service proxy, with kube's own client: whatever the
/// kubeconfig authenticates with (tokens, client certificates, exec plugins) works.
async fn proxy(args: &AdminArgs, timeout: Duration) -> anyhow::Result<Transport> {
    let (namespace, service) = parse_service(args.service.as_deref().unwrap_or(DEFAULT_SERVICE))?;
    let opts = kube::config::KubeConfigOptions { context: args.context.clone(), ..Default::default() };
    let mut config = match &args.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .with_context(|| format!("cannot read --kubeconfig {}", path.display()))?;
            kube::Config::from_custom_kubeconfig(kc, &opts)
                .await
                .with_context(|| format!("--kubeconfig {}: no usable context", path.display()))?
        }
        None => kube::Config::from_kubeconfig(&opts)
            .await
            .context("cannot load the kubeconfig (KUBECONFIG or ~/.kube/config; or give --kubeconfig)")?,
    };
    // One answer per request: kube's retries of 503 would turn "no endpoints available"
    // (no ready hub behind the Service) into a wait until --admin-timeout.
    config.default_retry = false;
    config.connect_timeout = Some(timeout);
    config.read_timeout = Some(timeout);
    config.write_timeout = Some(timeout);
    let server = config.cluster_url.to_string().trim_end_matches('/').to_string();
    let client = kube::Client::try_from(config).context("cannot build a client from the kubeconfig")?;
    let prefix = format!("/api/v1/namespaces/{namespace}/services/{service}/proxy");
    Ok(Transport::Proxy { client, prefix, namespace, service, server })
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
            kubeconfig: None,
            context: None,
            service: None,
        }
    }

    #[tokio::test]
    async fn endpoints_that_cannot_work_are_refused_with_the_reason() {
        fleetwatch_certs::install_crypto_provider();
        assert!(Admin::new(&args("http://127.0.0.1:9090")).await.is_ok());
        assert!(Admin::new(&args("http://hub/")).await.is_ok());
        let e = Admin::new(&args("https://hub:9090")).await.err().unwrap();
        assert!(format!("{e:#}").contains("needs --admin-ca"), "{e:#}");
        let e = Admin::new(&args("ftp://hub")).await.err().unwrap();
        assert!(format!("{e:#}").contains("use http:// or https://"), "{e:#}");
        let e = Admin::new(&args("127.0.0.1:9090")).await.err().unwrap();
        assert!(format!("{e:#}").contains("--admin"), "{e:#}");
        let mut a = args("http://hub:9090");
        a.admin_ca = Some("/etc/hostname".into());
        let e = Admin::new(&a).await.err().unwrap();
        assert!(format!("{e:#}").contains("for an https:// endpoint"), "{e:#}");
        let mut a = args("http://hub:9090");
        a.admin_timeout = 0.0;
        assert!(Admin::new(&a).await.is_err());
        let mut a = args("http://hub:9090");
        a.service = Some(DEFAULT_SERVICE.into());
        let e = Admin::new(&a).await.err().unwrap();
        assert!(format!("{e:#}").contains("two ways to reach the hub"), "{e:#}");
        let mut a = args(DEFAULT_ADMIN);
        a.kubeconfig = Some("/nonexistent/kubeconfig".into());
        let e = Admin::new(&a).await.err().unwrap();
        assert!(format!("{e:#}").contains("cannot read --kubeconfig /nonexistent/kubeconfig"), "{e:#}");
    }

    #[test]
    fn services_are_namespace_name_and_port() {
        assert_eq!(
            parse_service(DEFAULT_SERVICE).unwrap(),
            ("fleetwatch-system".to_string(), "fleetwatch-hub-admin:admin".to_string())
        );
        assert_eq!(parse_service("fw/hub:9090").unwrap().1, "hub:9090");
        for bad in ["hub:admin", "fw/hub", "fw/hub:", "fw/Hub:admin", "fw/hub:admin/x", "/hub:admin", "fw/hub:a:b"] {
            let e = parse_service(bad).unwrap_err();
            assert!(format!("{e:#}").contains("NAMESPACE/NAME:PORT"), "{bad}: {e:#}");
        }
    }
}
