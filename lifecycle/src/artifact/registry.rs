//! Pushing and pulling module artifacts ([`super::ModuleArtifact`]) with ORAS' OCI client.
//!
//! TLS is rustls with the process's crypto provider (the binary installs ring); extra CAs
//! come from [`RegistryOptions::ca_pem`]. Plain HTTP is used only for registries listed in
//! [`RegistryOptions::insecure`] and for loopback registries that do not speak TLS (as
//! Docker does). Credentials come from a Docker config (`~/.docker/config.json`, or the
//! `.dockerconfigjson` key of a `kubernetes.io/dockerconfigjson` Secret), read by
//! [`super::credentials`].

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::manifest::{IMAGE_MANIFEST_MEDIA_TYPE, OCI_IMAGE_MEDIA_TYPE, OciImageManifest};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference, RegistryOperation};

use super::credentials::{Helpers, credentials};
use super::{ArtifactError, DEFAULT_CONFIG_MEDIA_TYPE, EMPTY_CONFIG, MANIFEST_MEDIA_TYPE};
use super::{ModuleArtifact, sha256};

/// Largest layer [`Registry::pull`] reads (the objects of a module, as JSON).
pub const MAX_LAYER_BYTES: i64 = 64 << 20;
/// Most bytes of all an artifact's layers together, checked against their descriptors before
/// any is fetched.
pub const MAX_ARTIFACT_BYTES: u64 = 64 << 20;
/// Most layers of a module artifact: its objects and a default configuration.
pub const MAX_LAYERS: usize = 2;
/// Largest manifest [`Registry::pull`] reads, counted as its bytes arrive (a module's manifest
/// is a few hundred bytes of descriptors and annotations; the CNCF distribution registry
/// refuses to store manifests over 4 MiB too).
pub const MAX_MANIFEST_BYTES: u64 = 4 << 20;
/// Longest a pull waits for its share of a [`PullBudget`] before it is deferred.
pub const BUDGET_WAIT: std::time::Duration = std::time::Duration::from_secs(120);
/// Longest the manifest and layers of one pull take to arrive (a registry slower than that
/// is treated as unreachable; it would otherwise hold its share of the budget for good).
pub const PULL_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(600);

/// Bytes that pulls in flight may hold together: a pull reserves [`MAX_MANIFEST_BYTES`] while
/// it reads its manifest, then its layers' declared sizes before it fetches any, and keeps
/// them until its artifact is kept. Reservations are served in order (a semaphore of KiB
/// permits, first come first served), so a large pull is not starved by small ones.
#[derive(Clone, Debug)]
pub struct PullBudget {
    permits: std::sync::Arc<tokio::sync::Semaphore>,
    max_bytes: u64,
}

/// Bytes held from a [`PullBudget`]; given back when dropped.
#[derive(Debug)]
pub struct Reservation {
    _permit: Option<tokio::sync::OwnedSemaphorePermit>,
}

impl PullBudget {
    /// A budget of `max_bytes` (at least [`MAX_MANIFEST_BYTES`], so that a manifest fits).
    pub fn new(max_bytes: u64) -> Self {
        let max_bytes = max_bytes.max(MAX_MANIFEST_BYTES);
        let permits = (max_bytes >> 10).min(tokio::sync::Semaphore::MAX_PERMITS as u64).min(u32::MAX as u64);
        Self { permits: std::sync::Arc::new(tokio::sync::Semaphore::new(permits as usize)), max_bytes }
    }

    /// The bound, in bytes.
    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }

    /// Bytes not reserved now.
    pub fn available_bytes(&self) -> u64 {
        (self.permits.available_permits() as u64) << 10
    }

    /// Reserves `bytes` (at most the bound), waiting at most [`BUDGET_WAIT`]; `waiting` says
    /// how many bytes this pull waits for meanwhile (0 once it has them).
    async fn reserve(
        &self,
        bytes: u64,
        what: &str,
        waiting: &std::sync::atomic::AtomicU64,
    ) -> Result<Reservation, RegistryError> {
        let total = self.max_bytes >> 10;
        let kib = bytes.div_ceil(1024).min(total).min(u32::MAX as u64) as u32;
        let permits = self.permits.clone();
        waiting.store(bytes.max(1), std::sync::atomic::Ordering::Relaxed);
        let got = tokio::time::timeout(BUDGET_WAIT, permits.acquire_many_owned(kib)).await;
        waiting.store(0, std::sync::atomic::Ordering::Relaxed);
        match got {
            Ok(Ok(permit)) => Ok(Reservation { _permit: Some(permit) }),
            Ok(Err(closed)) => Err(RegistryError::Config(format!("the pull budget is closed: {closed}"))),
            Err(_) => Err(RegistryError::Deferred(format!(
                "{what} ({bytes} bytes) waited {} s for the pull budget ({} bytes for all pulls in flight, \
                 --artifact-pull-max-bytes), held by other pulls; deferred",
                BUDGET_WAIT.as_secs(),
                self.max_bytes
            ))),
        }
    }
}

/// A blob's bytes, refused past `limit` (an I/O error that ends the download at once).
struct Bounded {
    bytes: Vec<u8>,
    limit: u64,
    /// Set when the limit was hit, so the error can say so.
    over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Bounded {
    /// `limit` is a descriptor's size, already checked against [`MAX_LAYER_BYTES`] and reserved
    /// from the budget: the buffer takes it at once instead of growing by doubling.
    fn new(limit: u64) -> Self {
        Self { bytes: Vec::with_capacity(limit as usize), limit, over: Default::default() }
    }
}

impl tokio::io::AsyncWrite for Bounded {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        if self.bytes.len() as u64 + buf.len() as u64 > self.limit {
            self.over.store(true, std::sync::atomic::Ordering::Relaxed);
            return std::task::Poll::Ready(Err(std::io::Error::other("the registry sent more than the blob's size")));
        }
        self.bytes.extend_from_slice(buf);
        std::task::Poll::Ready(Ok(buf.len()))
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::task::Poll::Ready(Ok(()))
    }
}

/// Why a registry operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RegistryError {
    /// The reference does not parse.
    #[error("{reference:?} is not an OCI reference (REGISTRY/REPOSITORY:TAG or @sha256:…): {message}")]
    Reference {
        /// As given.
        reference: String,
        /// The parser's message.
        message: String,
    },
    /// A tag where only a digest is immutable.
    #[error("{0} has no digest: a module version must be immutable, give REGISTRY/REPOSITORY@sha256:…")]
    NotPinned(String),
    /// The Docker config or a CA is unusable.
    #[error("{0}")]
    Config(String),
    /// The registry refused the credentials (or asked for some).
    #[error("{registry} refused the credentials (401 Unauthorized){hint}")]
    Unauthorized {
        /// host\[:port\].
        registry: String,
        /// Whether credentials were sent.
        hint: &'static str,
    },
    /// The registry's TLS certificate is not signed by a trusted CA.
    #[error("{0}: its TLS certificate is not signed by a trusted CA (UnknownIssuer): give its CA with --registry-ca")]
    UntrustedCertificate(String),
    /// What the registry sent is not what the manifest says.
    #[error("{what} of {reference}: digest mismatch: expected {expected}, the registry sent {actual}")]
    DigestMismatch {
        /// The reference.
        reference: String,
        /// Manifest or layer.
        what: String,
        /// The digest the manifest names.
        expected: String,
        /// The digest of what came.
        actual: String,
    },
    /// More bytes than a module artifact may take (its manifest, a layer, all its layers):
    /// refused before or while they are read, never buffered whole.
    #[error("{0}")]
    TooLarge(String),
    /// The pull budget was held by other pulls for [`BUDGET_WAIT`]: tried again later.
    #[error("{0}")]
    Deferred(String),
    /// The registry did not send the manifest and layers within [`PULL_TIMEOUT`].
    #[error("cannot pull {reference}: not done after {} s", .after.as_secs())]
    TimedOut {
        /// The reference.
        reference: String,
        /// How long it ran.
        after: std::time::Duration,
    },
    /// Nothing under that reference.
    #[error("{0}: not found in the registry")]
    NotFound(String),
    /// Any other failure talking to the registry.
    #[error("{action} {reference}: {source}")]
    Oci {
        /// What was being done.
        action: &'static str,
        /// The reference.
        reference: String,
        /// The client's error.
        #[source]
        source: OciDistributionError,
    },
    /// The artifact is not a valid module.
    #[error("{reference}: {source}")]
    Artifact {
        /// The reference.
        reference: String,
        /// Why.
        #[source]
        source: ArtifactError,
    },
}

/// How to reach registries.
#[derive(Debug, Clone, Default)]
pub struct RegistryOptions {
    /// Extra CA certificates (PEM) trusted besides the system's.
    pub ca_pem: Vec<Vec<u8>>,
    /// Registries (`host[:port]`) reached over plain HTTP.
    pub insecure: Vec<String>,
    /// A Docker config (`{"auths": {"HOST[:PORT]": {"auth": base64(user:password)}}}`,
    /// `credHelpers`, `credsStore`).
    pub docker_config: Option<Vec<u8>>,
    /// Whether the config's credential helpers may be run ([`Helpers::Refuse`] unless set).
    pub helpers: Helpers,
}

/// A client for one registry operation at a time.
pub struct Registry {
    options: RegistryOptions,
}

/// Parses a reference (`REGISTRY/REPOSITORY:TAG`, `…@sha256:HEX`).
pub fn parse_reference(reference: &str) -> Result<Reference, RegistryError> {
    reference
        .parse::<Reference>()
        .map_err(|e| RegistryError::Reference { reference: reference.into(), message: e.to_string() })
}

/// Parses a reference that must name a digest (an immutable module version): a tag
/// alone is refused.
pub fn parse_pinned(reference: &str) -> Result<Reference, RegistryError> {
    let r = parse_reference(reference)?;
    if r.digest().is_none() {
        return Err(RegistryError::NotPinned(reference.into()));
    }
    Ok(r)
}

/// `REGISTRY/REPOSITORY@DIGEST`.
pub fn pinned(reference: &Reference, digest: &str) -> String {
    format!("{}/{}@{digest}", reference.registry(), reference.repository())
}

/// Whether a registry (`host[:port]`) is on the loopback interface.
pub fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        Some(rest) => rest.split(']').next().unwrap_or(rest),
        None => registry.rsplit_once(':').map(|(h, _)| h).unwrap_or(registry),
    };
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl Registry {
    /// A registry client with these options.
    pub fn new(options: RegistryOptions) -> Self {
        Self { options }
    }

    async fn auth(&self, reference: &Reference) -> Result<RegistryAuth, RegistryError> {
        match &self.options.docker_config {
            Some(c) => credentials(c, reference.registry(), self.options.helpers).await,
            None => Ok(RegistryAuth::Anonymous),
        }
    }

    fn roots(&self) -> Vec<oci_client::client::Certificate> {
        self.options
            .ca_pem
            .iter()
            .map(|pem| oci_client::client::Certificate {
                encoding: oci_client::client::CertificateEncoding::Pem,
                data: pem.clone(),
            })
            .collect()
    }

    /// The client for `reference`'s registry: plain HTTP when it is listed as insecure, or
    /// on loopback and not speaking TLS.
    async fn client(&self, reference: &Reference) -> Result<Client, RegistryError> {
        let plain = self.plain(reference).await?;
        self.client_with(plain)
    }

    /// Whether `reference`'s registry is reached over plain HTTP.
    async fn plain(&self, reference: &Reference) -> Result<bool, RegistryError> {
        let registry = reference.registry().to_string();
        Ok(self.options.insecure.contains(&registry) || (is_loopback(&registry) && !self.speaks_tls(&registry).await?))
    }

    fn client_with(&self, plain: bool) -> Result<Client, RegistryError> {
        let config = ClientConfig {
            protocol: if plain { ClientProtocol::Http } else { ClientProtocol::Https },
            extra_root_certificates: self.roots(),
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..ClientConfig::default()
        };
        Client::try_from(config).map_err(|e| RegistryError::Config(format!("cannot build the registry client: {e}")))
    }

    /// An HTTP client trusting the system's CAs and [`RegistryOptions::ca_pem`].
    fn http(&self) -> Result<reqwest::Client, RegistryError> {
        let mut builder = reqwest::Client::builder()
            .connect_timeout(std::time::Duration::from_secs(10))
            .read_timeout(std::time::Duration::from_secs(60));
        for pem in &self.options.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| RegistryError::Config(format!("a registry CA is not PEM: {e}")))?;
            builder = builder.tls_certs_merge(certs);
        }
        builder.build().map_err(|e| RegistryError::Config(format!("cannot build an HTTP client: {e}")))
    }

    /// Whether a loopback registry answers TLS: a TLS handshake the server answers in
    /// plain HTTP says no; any other outcome (even a certificate error) says yes, so that
    /// the real error shows.
    async fn speaks_tls(&self, registry: &str) -> Result<bool, RegistryError> {
        match self.http()?.get(format!("https://{registry}/v2/")).send().await {
            Ok(_) => Ok(true),
            Err(e) => Ok(!answered_in_plain_http(&e)),
        }
    }

    /// Pushes the artifact under `reference` (a tag, usually the version) and returns the
    /// manifest's digest.
    pub async fn push(&self, reference: &str, artifact: &ModuleArtifact) -> Result<String, RegistryError> {
        let r = parse_reference(reference)?;
        let (manifest, layers) =
            artifact.to_oci().map_err(|source| RegistryError::Artifact { reference: reference.into(), source })?;
        let client = self.client(&r).await?;
        let auth = self.auth(&r).await?;
        client.store_auth_if_needed(r.registry(), &auth).await;
        let fail = |e| self.classify(e, "cannot push to", reference, &r, &auth);
        client.push_blob(&r, EMPTY_CONFIG.to_vec(), &manifest.config.digest).await.map_err(fail)?;
        for (layer, d) in layers.iter().zip(&manifest.layers) {
            client.push_blob(&r, layer.data.clone(), &d.digest).await.map_err(fail)?;
        }
        // The manifest's bytes are ours, so its digest is known without asking the registry.
        let body = serde_json::to_vec(&manifest)
            .map_err(|e| RegistryError::Config(format!("cannot serialize the manifest: {e}")))?;
        let digest = sha256(&body);
        let content_type = http::HeaderValue::from_static(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE);
        client.push_manifest_raw(&r, body, content_type).await.map_err(fail)?;
        Ok(digest)
    }

    /// Pulls and validates the artifact at `reference`: every blob's digest is checked
    /// against the manifest (and the manifest against the reference's digest, if any).
    /// Returns it with its manifest's digest. Sizes are bounded as the bytes arrive
    /// ([`MAX_MANIFEST_BYTES`]; each layer at its descriptor's size) and declared sizes before
    /// any layer is fetched ([`MAX_LAYERS`], [`MAX_LAYER_BYTES`], [`MAX_ARTIFACT_BYTES`]).
    pub async fn pull(&self, reference: &str) -> Result<(ModuleArtifact, String), RegistryError> {
        let (artifact, digest, _) = self.pull_inner(reference, None).await?;
        Ok((artifact, digest))
    }

    /// [`Registry::pull`] within `budget`: the manifest's bound is reserved while it is read,
    /// then the layers' declared bytes before any is fetched (an artifact declaring more than
    /// the whole budget is refused). The returned reservation holds them until dropped.
    /// `waiting` says how many bytes the pull waits for meanwhile (0 when it waits for none).
    pub async fn pull_within(
        &self,
        reference: &str,
        budget: &PullBudget,
        waiting: &std::sync::atomic::AtomicU64,
    ) -> Result<(ModuleArtifact, String, Reservation), RegistryError> {
        self.pull_inner(reference, Some((budget, waiting))).await
    }

    async fn pull_inner(
        &self,
        reference: &str,
        budget: Option<(&PullBudget, &std::sync::atomic::AtomicU64)>,
    ) -> Result<(ModuleArtifact, String, Reservation), RegistryError> {
        let r = parse_reference(reference)?;
        let plain = self.plain(&r).await?;
        let client = self.client_with(plain)?;
        let auth = self.auth(&r).await?;
        let timed_out = |_| RegistryError::TimedOut { reference: reference.into(), after: PULL_TIMEOUT };
        let reserve = async |bytes: u64, what: &str| match budget {
            Some((b, waiting)) => b.reserve(bytes, what, waiting).await,
            None => Ok(Reservation { _permit: None }),
        };
        let held = reserve(MAX_MANIFEST_BYTES, "its manifest").await?;
        let (manifest, digest) =
            tokio::time::timeout(PULL_TIMEOUT, self.pull_manifest(&client, plain, &r, reference, &auth))
                .await
                .map_err(timed_out)??;
        drop(held);
        // A module artifact has its objects and at most a default configuration: anything
        // more is refused before a byte of it is fetched.
        if manifest.layers.len() > MAX_LAYERS {
            return Err(RegistryError::Artifact {
                reference: reference.into(),
                source: ArtifactError::NotModule(format!(
                    "{} layers, a module artifact has at most {MAX_LAYERS}",
                    manifest.layers.len()
                )),
            });
        }
        let mut total: u64 = 0;
        for l in &manifest.layers {
            if l.size < 0 || l.size > MAX_LAYER_BYTES {
                return Err(RegistryError::Artifact {
                    reference: reference.into(),
                    source: ArtifactError::NotModule(format!(
                        "layer {} is {} bytes, over {MAX_LAYER_BYTES}",
                        l.digest, l.size
                    )),
                });
            }
            if l.media_type != MANIFEST_MEDIA_TYPE && l.media_type != DEFAULT_CONFIG_MEDIA_TYPE {
                return Err(RegistryError::Artifact {
                    reference: reference.into(),
                    source: ArtifactError::NotModule(format!("unexpected layer of type {}", l.media_type)),
                });
            }
            total += l.size as u64;
        }
        if total > MAX_ARTIFACT_BYTES {
            return Err(RegistryError::TooLarge(format!(
                "layers of {total} bytes in all, over the {MAX_ARTIFACT_BYTES} bytes a module artifact may take"
            )));
        }
        if let Some((b, _)) = budget
            && total > b.max_bytes()
        {
            return Err(RegistryError::TooLarge(format!(
                "layers of {total} bytes in all, over the {} bytes all pulls in flight may hold \
                 (--artifact-pull-max-bytes)",
                b.max_bytes()
            )));
        }
        let reservation = reserve(total, "its layers").await?;
        let layers = tokio::time::timeout(PULL_TIMEOUT, self.pull_layers(&client, &r, reference, &auth, &manifest))
            .await
            .map_err(timed_out)??;
        let artifact = ModuleArtifact::from_oci(&manifest, &layers)
            .map_err(|source| RegistryError::Artifact { reference: reference.into(), source })?;
        Ok((artifact, digest, reservation))
    }

    /// The manifest at `r`, read as it arrives and refused past [`MAX_MANIFEST_BYTES`] (the
    /// OCI client would read a body of any size into memory first); checked against the
    /// reference's digest when it has one.
    async fn pull_manifest(
        &self,
        client: &Client,
        plain: bool,
        r: &Reference,
        reference: &str,
        auth: &RegistryAuth,
    ) -> Result<(OciImageManifest, String), RegistryError> {
        let fail = |e| self.classify(e, "cannot pull", reference, r, auth);
        // The OCI client authenticates (a bearer token from the registry's challenge, or
        // basic credentials it answers with) and keeps the token for the layers.
        let token = client.auth(r, auth, RegistryOperation::Pull).await.map_err(fail)?;
        let registry = r.resolve_registry();
        let url = format!(
            "{}://{registry}/v2/{}/manifests/{}",
            if plain { "http" } else { "https" },
            r.repository(),
            r.digest().or(r.tag()).unwrap_or("latest")
        );
        let mut request = self
            .http()?
            .get(&url)
            .header(http::header::ACCEPT, format!("{OCI_IMAGE_MEDIA_TYPE}, {IMAGE_MANIFEST_MEDIA_TYPE}"));
        request = match (token, auth) {
            (Some(token), _) => request.bearer_auth(token),
            (None, RegistryAuth::Basic(user, password)) => request.basic_auth(user, Some(password)),
            _ => request,
        };
        let mut response = request.send().await.map_err(|e| fail(OciDistributionError::RequestError(e)))?;
        let status = response.status();
        if status != reqwest::StatusCode::OK {
            // An error's body says why; a few KiB of it are enough.
            let mut body = Vec::new();
            while body.len() < 16 << 10
                && let Ok(Some(chunk)) = response.chunk().await
            {
                body.extend_from_slice(&chunk);
            }
            body.truncate(16 << 10);
            return Err(fail(status_error(status, &body, &url)));
        }
        let too_large = || RegistryError::TooLarge(format!("manifest larger than {MAX_MANIFEST_BYTES} bytes"));
        if response.content_length().is_some_and(|n| n > MAX_MANIFEST_BYTES) {
            return Err(too_large());
        }
        let mut body = Vec::new();
        while let Some(chunk) = response.chunk().await.map_err(|e| fail(OciDistributionError::RequestError(e)))? {
            if body.len() as u64 + chunk.len() as u64 > MAX_MANIFEST_BYTES {
                return Err(too_large());
            }
            body.extend_from_slice(&chunk);
        }
        let digest = sha256(&body);
        if let Some(want) = r.digest()
            && want != digest
        {
            return Err(RegistryError::DigestMismatch {
                reference: reference.into(),
                what: "manifest".into(),
                expected: want.into(),
                actual: digest,
            });
        }
        let not_module = |why: String| RegistryError::Artifact {
            reference: reference.into(),
            source: ArtifactError::NotModule(why),
        };
        let manifest: OciImageManifest = serde_json::from_slice(&body)
            .map_err(|e| not_module(format!("the manifest is not an OCI image manifest: {e}")))?;
        if manifest.schema_version != 2 {
            return Err(not_module(format!("the manifest's schemaVersion is {}, not 2", manifest.schema_version)));
        }
        if let Some(t) = &manifest.media_type
            && t != OCI_IMAGE_MEDIA_TYPE
            && t != IMAGE_MANIFEST_MEDIA_TYPE
        {
            return Err(not_module(format!("the manifest is of type {t}, not {OCI_IMAGE_MEDIA_TYPE}")));
        }
        Ok((manifest, digest))
    }

    /// The layers of `manifest`, each read only up to the size its descriptor gives (a
    /// registry streaming more is cut off there), its digest computed as the bytes arrive.
    async fn pull_layers(
        &self,
        client: &Client,
        r: &Reference,
        reference: &str,
        auth: &RegistryAuth,
        manifest: &OciImageManifest,
    ) -> Result<Vec<oci_client::client::ImageLayer>, RegistryError> {
        let mut layers = Vec::new();
        for l in &manifest.layers {
            let mut data = Bounded::new(l.size.max(0) as u64);
            let over = data.over.clone();
            client.pull_blob(r, l, &mut data).await.map_err(|e| match e {
                _ if over.load(std::sync::atomic::Ordering::Relaxed) => RegistryError::Artifact {
                    reference: reference.into(),
                    source: ArtifactError::NotModule(format!(
                        "layer {} sent more than the {} bytes its descriptor gives; refused",
                        l.digest, l.size
                    )),
                },
                OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
                    expected,
                    actual,
                }) => RegistryError::DigestMismatch {
                    reference: reference.into(),
                    what: format!("layer {}", l.media_type),
                    expected,
                    actual,
                },
                e => self.classify(e, "cannot pull a layer of", reference, r, auth),
            })?;
            layers.push(oci_client::client::ImageLayer::new(data.bytes, l.media_type.clone(), None));
        }
        Ok(layers)
    }

    fn classify(
        &self,
        e: OciDistributionError,
        action: &'static str,
        reference: &str,
        r: &Reference,
        auth: &RegistryAuth,
    ) -> RegistryError {
        // Integrity is a refusal, never an outage: other bytes than the digest names (the
        // manifest's, checked against the reference by the client) are not retried as if the
        // registry were down.
        if let OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
            expected,
            actual,
        }) = &e
        {
            return RegistryError::DigestMismatch {
                reference: reference.into(),
                what: if action == "cannot pull" { "manifest".into() } else { "layer".into() },
                expected: expected.clone(),
                actual: actual.clone(),
            };
        }
        let unauthorized = match &e {
            OciDistributionError::UnauthorizedError { .. } | OciDistributionError::AuthenticationFailure(_) => true,
            OciDistributionError::ServerError { code, .. } => *code == 401,
            OciDistributionError::RegistryError { envelope, .. } => {
                envelope.errors.iter().any(|x| matches!(x.code, oci_client::errors::OciErrorCode::Unauthorized))
            }
            _ => false,
        };
        if chain_mentions(&e, "UnknownIssuer") {
            return RegistryError::UntrustedCertificate(r.registry().into());
        }
        if unauthorized {
            let hint = match auth {
                RegistryAuth::Anonymous => " (no credentials for it were given: --registry-auth)",
                _ => "",
            };
            return RegistryError::Unauthorized { registry: r.registry().into(), hint };
        }
        let not_found = match &e {
            OciDistributionError::ImageManifestNotFoundError(_) => true,
            OciDistributionError::ServerError { code, .. } => *code == 404,
            OciDistributionError::RegistryError { envelope, .. } => envelope.errors.iter().any(|x| {
                matches!(
                    x.code,
                    oci_client::errors::OciErrorCode::ManifestUnknown
                        | oci_client::errors::OciErrorCode::NameUnknown
                        | oci_client::errors::OciErrorCode::BlobUnknown
                )
            }),
            _ => false,
        };
        if not_found && action != "cannot push to" {
            return RegistryError::NotFound(reference.into());
        }
        RegistryError::Oci { action, reference: reference.into(), source: e }
    }
}

/// The OCI client's error for a registry's answer other than 200 (as it reads one): 401,
/// the OCI error envelope of a 4xx, or the status and body.
fn status_error(status: reqwest::StatusCode, body: &[u8], url: &str) -> OciDistributionError {
    if status == reqwest::StatusCode::UNAUTHORIZED {
        return OciDistributionError::UnauthorizedError { url: url.into() };
    }
    if status.is_client_error()
        && let Ok(envelope) = serde_json::from_slice::<oci_client::errors::OciEnvelope>(body)
    {
        return OciDistributionError::RegistryError { envelope, url: url.into() };
    }
    OciDistributionError::ServerError {
        code: status.as_u16(),
        url: url.into(),
        message: String::from_utf8_lossy(body).into_owned(),
    }
}

/// Whether an error or one of its causes says `needle`.
fn chain_mentions(e: &(dyn std::error::Error + 'static), needle: &str) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if err.to_string().contains(needle) {
            return true;
        }
        cur = err.source();
    }
    false
}

/// Whether an HTTPS request failed because the server answered in plain HTTP: rustls
/// read an HTTP response where a TLS record should be (`InvalidContentType`).
fn answered_in_plain_http(e: &reqwest::Error) -> bool {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(|io| io.get_ref())
                .and_then(|i| i.downcast_ref::<rustls::Error>())
        });
        if let Some(tls) = tls {
            return matches!(tls, rustls::Error::InvalidMessage(rustls::InvalidMessage::InvalidContentType));
        }
        // The error may reach us through a wrapper that hides its type: its message is
        // rustls' own wording for that case.
        if err.to_string().ends_with("received corrupt message of type InvalidContentType") {
            return true;
        }
        cur = err.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A registry on loopback that serves one manifest and streams `blob_bytes` zeros for any
    /// blob, whatever its descriptor says, counting the blob bytes it managed to send.
    async fn hostile_registry(
        manifest: Vec<u8>,
        blob_bytes: u64,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        let (port, sent, _) = hostile_registry_with(manifest, Some(0), blob_bytes).await;
        (port, sent)
    }

    /// Writes `total` bytes of `fill` to `conn` in 64 KiB chunks, counting them in `sent`,
    /// until the peer stops reading.
    async fn stream(conn: &mut tokio::net::TcpStream, fill: u8, total: u64, sent: &std::sync::atomic::AtomicU64) {
        use tokio::io::AsyncWriteExt;
        let chunk = vec![fill; 64 << 10];
        let mut left = total;
        while left > 0 {
            let n = left.min(chunk.len() as u64) as usize;
            if conn.write_all(&chunk[..n]).await.is_err() {
                return;
            }
            sent.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
            left -= n as u64;
        }
    }

    /// [`hostile_registry`] whose manifest is followed by `manifest_pad` more bytes (spaces,
    /// so still JSON) sent without Content-Length (`None`: the manifest as it is, with it);
    /// the bytes of manifest sent are counted too.
    async fn hostile_registry_with(
        manifest: Vec<u8>,
        manifest_pad: Option<u64>,
        blob_bytes: u64,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = sent.clone();
        let manifest_sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let manifest_counted = manifest_sent.clone();
        let digest = super::super::sha256(&manifest);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (manifest, digest, sent) = (manifest.clone(), digest.clone(), counted.clone());
                let manifest_sent = manifest_counted.clone();
                tokio::spawn(async move {
                    let mut req = vec![0u8; 8192];
                    let Ok(n) = conn.read(&mut req).await else { return };
                    let line = String::from_utf8_lossy(&req[..n]).lines().next().unwrap_or_default().to_string();
                    let head = |len: Option<usize>, ctype: &str| {
                        let len = len.map(|l| format!("Content-Length: {l}\r\n")).unwrap_or_default();
                        format!(
                            "HTTP/1.1 200 OK\r\nContent-Type: {ctype}\r\nDocker-Content-Digest: {digest}\r\n{len}Connection: close\r\n\r\n"
                        )
                    };
                    if line.contains("/manifests/") {
                        let length = match manifest_pad {
                            Some(0) => Some(manifest.len()),
                            _ => None,
                        };
                        let h = head(length, oci_client::manifest::OCI_IMAGE_MEDIA_TYPE);
                        let _ = conn.write_all(h.as_bytes()).await;
                        let _ = conn.write_all(&manifest).await;
                        stream(&mut conn, b' ', manifest_pad.unwrap_or(0), &manifest_sent).await;
                    } else if line.contains("/blobs/") {
                        // No Content-Length: a stream that does not end where the descriptor says.
                        let _ = conn.write_all(head(None, "application/octet-stream").as_bytes()).await;
                        stream(&mut conn, 0, blob_bytes, &sent).await;
                    } else {
                        let _ = conn.write_all(head(Some(2), "application/json").as_bytes()).await;
                        let _ = conn.write_all(b"{}").await;
                    }
                });
            }
        });
        (port, sent, manifest_sent)
    }

    #[tokio::test]
    async fn a_blob_streamed_past_its_descriptor_is_cut_off_there() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        // A ~700-byte layer served as 256 MiB: refused having read no more than it says.
        let body = module_manifest(vec![(700, MANIFEST_MEDIA_TYPE)]);
        let digest = super::super::sha256(&body);
        let (port, sent) = hostile_registry(body, 256 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let reference = format!("127.0.0.1:{port}/modules/w@{digest}");
        let e = Registry::new(options.clone()).pull(&reference).await.unwrap_err();
        assert!(e.to_string().contains("sent more than the 700 bytes its descriptor gives"), "{e}");
        // The registry could not send much beyond what was read (socket buffers only).
        let sent = sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < 64 << 20, "the registry sent {sent} bytes to a reader that wanted 700");
        // Through the operator's cache: refused content is not pulled again for an hour (its
        // digest names those bytes for good), not every minute.
        use crate::artifact::cache::{ArtifactConfig, Artifacts, MAX_RETRY, REFUSED_RETRY};
        let cache = Artifacts::new(ArtifactConfig { registry: options.clone(), ..Default::default() }).unwrap();
        let e = cache.get(&reference, None).await.unwrap_err();
        assert!(e.permanent && e.refused && e.retry_in == REFUSED_RETRY, "{e:?}");
        let again = cache.get(&reference, None).await.unwrap_err();
        assert!(again.retry_in > MAX_RETRY && again.message == e.message, "{again:?}");
        // More layers than a module artifact has: refused before any blob is fetched.
        let body = module_manifest(vec![(1, MANIFEST_MEDIA_TYPE); 3]);
        let digest = super::super::sha256(&body);
        let (port, sent) = hostile_registry(body, 1 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let e = Registry::new(options).pull(&format!("127.0.0.1:{port}/modules/w@{digest}")).await.unwrap_err();
        assert!(e.to_string().contains("3 layers, a module artifact has at most 2"), "{e}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 0);
    }

    fn module_manifest(layers: Vec<(i64, &str)>) -> Vec<u8> {
        let layers: Vec<serde_json::Value> = layers
            .into_iter()
            .map(|(size, media_type)| {
                serde_json::json!({"mediaType": media_type, "size": size,
                    "digest": format!("sha256:{}", "c".repeat(64))})
            })
            .collect();
        serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2, "mediaType": oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
            "artifactType": "application/vnd.fleetwatch.module.v1",
            "config": {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2,
                       "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
            "layers": layers}))
        .unwrap()
    }

    /// A manifest is bounded by the bytes read, not by what the registry says of them: 48 MiB
    /// sent without Content-Length are refused at 4 MiB (the digest pinned is theirs: only the
    /// size is wrong); with a Content-Length over the bound, before reading any.
    #[tokio::test]
    async fn a_manifest_is_cut_off_at_its_bound() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let body = module_manifest(vec![(700, MANIFEST_MEDIA_TYPE)]);
        let pad = 48u64 << 20;
        let mut whole = body.clone();
        whole.resize(body.len() + pad as usize, b' ');
        let digest = super::super::sha256(&whole);
        drop(whole);
        let (port, blobs, manifest_sent) = hostile_registry_with(body.clone(), Some(pad), 1 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let reference = format!("127.0.0.1:{port}/modules/w@{digest}");
        let e = Registry::new(options.clone()).pull(&reference).await.unwrap_err();
        assert!(matches!(e, RegistryError::TooLarge(_)), "{e:?}");
        assert_eq!(e.to_string(), "manifest larger than 4194304 bytes");
        // The registry could not send much beyond what was read (socket buffers only).
        let sent = manifest_sent.load(std::sync::atomic::Ordering::Relaxed);
        assert!(sent < pad / 2, "the registry sent {sent} bytes of manifest to a reader that wanted 4 MiB");
        // Through the operator's cache it is a refusal (Error, not pulled again for an hour).
        use crate::artifact::cache::{ArtifactConfig, Artifacts, REFUSED_RETRY};
        let cache = Artifacts::new(ArtifactConfig { registry: options, ..Default::default() }).unwrap();
        let e = cache.get(&reference, None).await.unwrap_err();
        assert!(e.permanent && e.refused && e.retry_in == REFUSED_RETRY, "{e:?}");
        assert_eq!(blobs.load(std::sync::atomic::Ordering::Relaxed), 0);

        // Said by Content-Length: refused before reading.
        let mut big = body.clone();
        big.resize(body.len() + (5 << 20), b' ');
        let digest = super::super::sha256(&big);
        let (port, _, _) = hostile_registry_with(big, Some(0), 0).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let e = Registry::new(options).pull(&format!("127.0.0.1:{port}/modules/w@{digest}")).await.unwrap_err();
        assert_eq!(e.to_string(), "manifest larger than 4194304 bytes");
    }

    /// Layers whose declared sizes add up to more than an artifact may take, or than the
    /// whole pull budget, are refused before any is fetched.
    #[tokio::test]
    async fn an_artifact_larger_than_its_bounds_is_refused_before_any_layer() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let body = module_manifest(vec![(40 << 20, MANIFEST_MEDIA_TYPE), (40 << 20, DEFAULT_CONFIG_MEDIA_TYPE)]);
        let digest = super::super::sha256(&body);
        let (port, sent) = hostile_registry(body, 1 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let reference = format!("127.0.0.1:{port}/modules/w@{digest}");
        let e = Registry::new(options.clone()).pull(&reference).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "layers of 83886080 bytes in all, over the 67108864 bytes a module artifact may take"
        );
        let budget = PullBudget::new(8 << 20);
        let waiting = std::sync::atomic::AtomicU64::new(0);
        let body = module_manifest(vec![(10 << 20, MANIFEST_MEDIA_TYPE)]);
        let digest = super::super::sha256(&body);
        let (port2, sent2) = hostile_registry(body, 1 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port2}")], ..Default::default() };
        let reference = format!("127.0.0.1:{port2}/modules/w@{digest}");
        let e = Registry::new(options).pull_within(&reference, &budget, &waiting).await.unwrap_err();
        assert_eq!(
            e.to_string(),
            "layers of 10485760 bytes in all, over the 8388608 bytes all pulls in flight may hold (--artifact-pull-max-bytes)"
        );
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(sent2.load(std::sync::atomic::Ordering::Relaxed), 0);
        assert_eq!(budget.available_bytes(), 8 << 20, "nothing stays reserved");
    }

    /// Reservations add up to the budget at most: one that does not fit waits (saying for how
    /// much), gets its bytes when others give theirs back, and is deferred after
    /// [`BUDGET_WAIT`].
    #[tokio::test(start_paused = true)]
    async fn pulls_in_flight_share_the_budget() {
        use std::sync::atomic::{AtomicU64, Ordering};
        let budget = PullBudget::new(8 << 20);
        let (w1, w2, w3) = (AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0));
        let first = budget.reserve(6 << 20, "its layers", &w1).await.unwrap();
        assert_eq!((budget.available_bytes(), w1.load(Ordering::Relaxed)), (2 << 20, 0));
        let second = budget.reserve(4 << 20, "its layers", &w2);
        tokio::pin!(second);
        assert!(futures_util::poll!(&mut second).is_pending());
        assert_eq!(w2.load(Ordering::Relaxed), 4 << 20, "it says what it waits for");
        // A later small one does not pass it (first come, first served).
        let third = budget.reserve(1 << 20, "its manifest", &w3);
        tokio::pin!(third);
        assert!(futures_util::poll!(&mut third).is_pending());
        drop(first);
        let second = second.await.unwrap();
        let third = third.await.unwrap();
        assert_eq!((w2.load(Ordering::Relaxed), budget.available_bytes()), (0, 3 << 20));
        drop((second, third));
        // Never fitting in time: deferred, a transient reason naming the flag.
        let hog = budget.reserve(8 << 20, "its layers", &w1).await.unwrap();
        let started = tokio::time::Instant::now();
        let e = budget.reserve(1, "its manifest", &w2).await.unwrap_err();
        assert!(matches!(e, RegistryError::Deferred(_)), "{e:?}");
        assert_eq!(started.elapsed(), BUDGET_WAIT);
        assert!(e.to_string().contains("waited 120 s for the pull budget"), "{e}");
        assert!(e.to_string().contains("--artifact-pull-max-bytes"), "{e}");
        drop(hog);
    }

    #[test]
    fn a_manifest_of_other_bytes_is_a_digest_mismatch_not_an_outage() {
        let registry = Registry::new(RegistryOptions::default());
        let reference =
            "127.0.0.1:5000/modules/w@sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
        let r = parse_reference(reference).unwrap();
        let e = OciDistributionError::DigestError(oci_client::errors::DigestError::VerificationError {
            expected: "sha256:aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".into(),
            actual: "sha256:bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb".into(),
        });
        let got = registry.classify(e, "cannot pull", reference, &r, &RegistryAuth::Anonymous);
        assert!(matches!(got, RegistryError::DigestMismatch { .. }), "{got:?}");
        assert_eq!(
            got.to_string(),
            format!(
                "manifest of {reference}: digest mismatch: expected sha256:{}, the registry sent sha256:{}",
                "a".repeat(64),
                "b".repeat(64)
            )
        );
    }

    #[test]
    fn loopback_and_pinning() {
        assert!(is_loopback("127.0.0.1:5000"));
        assert!(is_loopback("localhost:5000"));
        assert!(is_loopback("[::1]:5000"));
        assert!(!is_loopback("registry.example:5000"));
        let e = parse_pinned("127.0.0.1:5000/mods/w:1.0.0").unwrap_err();
        assert_eq!(
            e.to_string(),
            "127.0.0.1:5000/mods/w:1.0.0 has no digest: a module version must be immutable, give REGISTRY/REPOSITORY@sha256:…"
        );
        let d = format!("sha256:{}", "a".repeat(64));
        let r = parse_pinned(&format!("127.0.0.1:5000/mods/w@{d}")).unwrap();
        assert_eq!(pinned(&r, &d), format!("127.0.0.1:5000/mods/w@{d}"));
    }
}
