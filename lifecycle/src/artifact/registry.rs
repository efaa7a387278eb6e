//! Pushing and pulling module artifacts ([`super::ModuleArtifact`]) with ORAS' OCI client.
//!
//! TLS is rustls with the process's crypto provider (the binary installs ring); extra CAs
//! come from [`RegistryOptions::ca_pem`]. Plain HTTP is used only for registries listed in
//! [`RegistryOptions::insecure`] and for loopback registries that do not speak TLS (as
//! Docker does). Credentials come from a Docker config (`~/.docker/config.json`, or the
//! `.dockerconfigjson` key of a `kubernetes.io/dockerconfigjson` Secret).

use std::collections::BTreeMap;

use base64::Engine;
use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::errors::OciDistributionError;
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use serde::Deserialize;

use super::{ArtifactError, DEFAULT_CONFIG_MEDIA_TYPE, EMPTY_CONFIG, MANIFEST_MEDIA_TYPE};
use super::{ModuleArtifact, sha256};

/// Largest layer [`Registry::pull`] reads (the objects of a module, as JSON).
pub const MAX_LAYER_BYTES: i64 = 64 << 20;
/// Most layers of a module artifact: its objects and a default configuration.
pub const MAX_LAYERS: usize = 2;

/// A blob's bytes, refused past `limit` (an I/O error that ends the download at once).
struct Bounded {
    bytes: Vec<u8>,
    limit: u64,
    /// Set when the limit was hit, so the error can say so.
    over: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

impl Bounded {
    fn new(limit: u64) -> Self {
        Self { bytes: Vec::new(), limit, over: Default::default() }
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
        /// host[:port].
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
    /// A Docker config (`{"auths": {"HOST[:PORT]": {"auth": base64(user:password)}}}`).
    pub docker_config: Option<Vec<u8>>,
}

/// A client for one registry operation at a time.
pub struct Registry {
    options: RegistryOptions,
}

#[derive(Deserialize)]
struct DockerConfig {
    #[serde(default)]
    auths: BTreeMap<String, DockerAuth>,
}

#[derive(Deserialize)]
struct DockerAuth {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default, rename = "identitytoken")]
    identity_token: Option<String>,
}

/// The credentials a Docker config holds for `registry` (`host[:port]`); entries may be
/// written as a bare host or as a URL (`https://host/v1/`). Anonymous when none matches.
pub fn credentials(docker_config: &[u8], registry: &str) -> Result<RegistryAuth, RegistryError> {
    let cfg: DockerConfig = serde_json::from_slice(docker_config)
        .map_err(|e| RegistryError::Config(format!("the Docker config is not valid: {e}")))?;
    let host_of = |k: &str| {
        let k = k.strip_prefix("https://").or_else(|| k.strip_prefix("http://")).unwrap_or(k);
        k.split('/').next().unwrap_or(k).to_string()
    };
    let Some((_, a)) = cfg.auths.iter().find(|(k, _)| host_of(k) == registry) else {
        return Ok(RegistryAuth::Anonymous);
    };
    if let (Some(u), Some(p)) = (&a.username, &a.password) {
        return Ok(RegistryAuth::Basic(u.clone(), p.clone()));
    }
    if let Some(t) = &a.identity_token {
        return Ok(RegistryAuth::Bearer(t.clone()));
    }
    if let Some(auth) = &a.auth {
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(auth.trim())
            .ok()
            .and_then(|b| String::from_utf8(b).ok())
            .ok_or_else(|| RegistryError::Config(format!("the Docker config's auth for {registry} is not base64")))?;
        let (u, p) = decoded.split_once(':').ok_or_else(|| {
            RegistryError::Config(format!("the Docker config's auth for {registry} is not base64(USER:PASSWORD)"))
        })?;
        return Ok(RegistryAuth::Basic(u.into(), p.into()));
    }
    Ok(RegistryAuth::Anonymous)
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

    fn auth(&self, reference: &Reference) -> Result<RegistryAuth, RegistryError> {
        match &self.options.docker_config {
            Some(c) => credentials(c, reference.registry()),
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
        let registry = reference.registry().to_string();
        let plain = self.options.insecure.contains(&registry)
            || (is_loopback(&registry) && !self.speaks_tls(&registry).await?);
        let config = ClientConfig {
            protocol: if plain { ClientProtocol::Http } else { ClientProtocol::Https },
            extra_root_certificates: self.roots(),
            connect_timeout: Some(std::time::Duration::from_secs(10)),
            read_timeout: Some(std::time::Duration::from_secs(60)),
            ..ClientConfig::default()
        };
        Client::try_from(config).map_err(|e| RegistryError::Config(format!("cannot build the registry client: {e}")))
    }

    /// Whether a loopback registry answers TLS: a TLS handshake the server answers in
    /// plain HTTP says no; any other outcome (even a certificate error) says yes, so that
    /// the real error shows.
    async fn speaks_tls(&self, registry: &str) -> Result<bool, RegistryError> {
        let mut builder = reqwest::Client::builder().connect_timeout(std::time::Duration::from_secs(10));
        for pem in &self.options.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| RegistryError::Config(format!("a registry CA is not PEM: {e}")))?;
            builder = builder.tls_certs_merge(certs);
        }
        let client = builder.build().map_err(|e| RegistryError::Config(format!("cannot build an HTTP client: {e}")))?;
        match client.get(format!("https://{registry}/v2/")).send().await {
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
        let auth = self.auth(&r)?;
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
    /// Returns it with its manifest's digest.
    pub async fn pull(&self, reference: &str) -> Result<(ModuleArtifact, String), RegistryError> {
        let r = parse_reference(reference)?;
        let client = self.client(&r).await?;
        let auth = self.auth(&r)?;
        let (manifest, digest) = client
            .pull_image_manifest(&r, &auth)
            .await
            .map_err(|e| self.classify(e, "cannot pull", reference, &r, &auth))?;
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
        let mut layers = Vec::new();
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
            // Read at most the bytes the descriptor says: a registry streaming more is cut off
            // there (the digest is checked as the bytes arrive, by the client), not buffered
            // to the end first.
            let mut data = Bounded::new(l.size as u64);
            let over = data.over.clone();
            client.pull_blob(&r, l, &mut data).await.map_err(|e| match e {
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
                e => self.classify(e, "cannot pull a layer of", reference, &r, &auth),
            })?;
            layers.push(oci_client::client::ImageLayer::new(data.bytes, l.media_type.clone(), None));
        }
        let artifact = ModuleArtifact::from_oci(&manifest, &layers)
            .map_err(|source| RegistryError::Artifact { reference: reference.into(), source })?;
        Ok((artifact, digest))
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
    /// blob, whatever its descriptor says, counting what it managed to send.
    async fn hostile_registry(
        manifest: Vec<u8>,
        blob_bytes: u64,
    ) -> (u16, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let sent = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let counted = sent.clone();
        let digest = super::super::sha256(&manifest);
        tokio::spawn(async move {
            while let Ok((mut conn, _)) = listener.accept().await {
                let (manifest, digest, sent) = (manifest.clone(), digest.clone(), counted.clone());
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
                        let h = head(Some(manifest.len()), oci_client::manifest::OCI_IMAGE_MEDIA_TYPE);
                        let _ = conn.write_all(h.as_bytes()).await;
                        let _ = conn.write_all(&manifest).await;
                    } else if line.contains("/blobs/") {
                        // No Content-Length: a stream that does not end where the descriptor says.
                        let _ = conn.write_all(head(None, "application/octet-stream").as_bytes()).await;
                        let chunk = vec![0u8; 64 << 10];
                        let mut left = blob_bytes;
                        while left > 0 {
                            let n = left.min(chunk.len() as u64) as usize;
                            if conn.write_all(&chunk[..n]).await.is_err() {
                                return;
                            }
                            sent.fetch_add(n as u64, std::sync::atomic::Ordering::Relaxed);
                            left -= n as u64;
                        }
                    } else {
                        let _ = conn.write_all(head(Some(2), "application/json").as_bytes()).await;
                        let _ = conn.write_all(b"{}").await;
                    }
                });
            }
        });
        (port, sent)
    }

    #[tokio::test]
    async fn a_blob_streamed_past_its_descriptor_is_cut_off_there() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let layer = |size: i64| {
            serde_json::json!({"mediaType": MANIFEST_MEDIA_TYPE, "size": size,
                "digest": format!("sha256:{}", "c".repeat(64))})
        };
        let manifest = |layers: Vec<serde_json::Value>| {
            serde_json::to_vec(&serde_json::json!({
                "schemaVersion": 2, "mediaType": oci_client::manifest::OCI_IMAGE_MEDIA_TYPE,
                "artifactType": "application/vnd.fleetwatch.module.v1",
                "config": {"mediaType": "application/vnd.oci.empty.v1+json", "size": 2,
                           "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"},
                "layers": layers}))
            .unwrap()
        };
        // A ~700-byte layer served as 256 MiB: refused having read no more than it says.
        let body = manifest(vec![layer(700)]);
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
        let body = manifest(vec![layer(1), layer(1), layer(1)]);
        let digest = super::super::sha256(&body);
        let (port, sent) = hostile_registry(body, 1 << 20).await;
        let options = RegistryOptions { insecure: vec![format!("127.0.0.1:{port}")], ..Default::default() };
        let e = Registry::new(options).pull(&format!("127.0.0.1:{port}/modules/w@{digest}")).await.unwrap_err();
        assert!(e.to_string().contains("3 layers, a module artifact has at most 2"), "{e}");
        assert_eq!(sent.load(std::sync::atomic::Ordering::Relaxed), 0);
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
    fn docker_config_credentials() {
        let cfg = br#"{"auths": {"https://reg.example:5000/v1/": {"auth": "dXNlcjpwYXNz"},
            "other": {"username": "u", "password": "p"}}}"#;
        assert_eq!(credentials(cfg, "reg.example:5000").unwrap(), RegistryAuth::Basic("user".into(), "pass".into()));
        assert_eq!(credentials(cfg, "other").unwrap(), RegistryAuth::Basic("u".into(), "p".into()));
        assert_eq!(credentials(cfg, "none").unwrap(), RegistryAuth::Anonymous);
        assert!(credentials(b"{", "x").is_err());
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
