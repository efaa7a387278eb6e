//! rustls configurations for mutual TLS, the peer identity check, and hot reload.

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

use fleetwatch_shared::identity::Identity;
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::error::CertError;
use crate::inspect::inspect_der;

/// Installs the ring crypto provider as the process default. Call once at start-up, before
/// any TLS configuration is built: with two providers in the dependency tree rustls cannot
/// pick one by itself. Calling it again is harmless.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// The files one end of a mutual-TLS connection needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsFiles {
    /// Own certificate chain (PEM).
    pub cert: PathBuf,
    /// Own private key (PEM).
    pub key: PathBuf,
    /// CA bundles to trust for the peer (PEM; several files or certificates during a CA rotation).
    pub ca: Vec<PathBuf>,
}

fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, CertError> {
    let bytes = std::fs::read(path).map_err(|source| CertError::Io { path: path.into(), source })?;
    let certs: Vec<_> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| CertError::Pem { path: path.into(), what: format!("bad PEM: {e}") })?;
    if certs.is_empty() {
        return Err(CertError::Pem { path: path.into(), what: "no certificate in file".into() });
    }
    Ok(certs)
}

fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, CertError> {
    let bytes = std::fs::read(path).map_err(|source| CertError::Io { path: path.into(), source })?;
    PrivateKeyDer::from_pem_slice(&bytes)
        .map_err(|e| CertError::Pem { path: path.into(), what: format!("no private key: {e}") })
}

fn load_roots(paths: &[PathBuf]) -> Result<RootCertStore, CertError> {
    if paths.is_empty() {
        return Err(CertError::Invalid("no CA bundle given".into()));
    }
    let mut roots = RootCertStore::empty();
    for p in paths {
        for c in load_certs(p)? {
            roots
                .add(c)
                .map_err(|e| CertError::Pem { path: p.clone(), what: format!("unusable CA certificate: {e}") })?;
        }
    }
    Ok(roots)
}

/// Loads a certificate chain and its key, checking that they belong together.
fn load_certified_key(files: &TlsFiles) -> Result<Arc<CertifiedKey>, CertError> {
    let chain = load_certs(&files.cert)?;
    let key = load_key(&files.key)?;
    let provider = rustls::crypto::ring::default_provider();
    let ck = CertifiedKey::from_der(chain, key, &provider).map_err(|e| {
        CertError::Tls(format!("{} and {} do not match: {e}", files.cert.display(), files.key.display()))
    })?;
    Ok(Arc::new(ck))
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The hub's server configuration: TLS 1.3, client certificates required and verified
/// against the CA bundles.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, CertError> {
    let ck = load_certified_key(files)?;
    let roots = Arc::new(load_roots(&files.ca)?);
    let verifier = WebPkiClientVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| CertError::Tls(format!("client verifier: {e}")))?;
    ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CertError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(ck.cert.clone(), load_key(&files.key)?)
        .map_err(|e| CertError::Tls(e.to_string()))
}

/// A client configuration (agent or subscriber): trusts the CA bundles, presents the
/// client certificate.
pub fn client_config(files: &TlsFiles) -> Result<ClientConfig, CertError> {
    let roots = load_roots(&files.ca)?;
    let ck = load_certified_key(files)?;
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CertError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_client_auth_cert(ck.cert.clone(), load_key(&files.key)?)
        .map_err(|e| CertError::Tls(e.to_string()))
}

/// The identity in a verified peer's certificate (the first of its chain).
pub fn peer_identity(chain: &[CertificateDer<'_>]) -> Result<Identity, CertError> {
    peer_certificate(chain).map(|(id, _)| id)
}

/// The identity and serial (lower-case hex) of a verified peer's certificate.
pub fn peer_certificate(chain: &[CertificateDer<'_>]) -> Result<(Identity, String), CertError> {
    let leaf = chain.first().ok_or_else(|| CertError::PeerIdentity("no client certificate".into()))?;
    let info = inspect_der(leaf).map_err(CertError::PeerIdentity)?;
    let serial = info.serial.to_lowercase();
    let id = info
        .identity
        .ok_or_else(|| CertError::PeerIdentity(format!("no single valid SPIFFE id among URI SANs {:?}", info.uris)))?;
    Ok((id, serial))
}

/// A server configuration that follows its files: [`reload_if_changed`] rebuilds it when
/// the certificate, key or a CA bundle changed on disk, so CA rotation and certificate
/// renewal need no restart. New connections get the new configuration.
///
/// [`reload_if_changed`]: ReloadingServerConfig::reload_if_changed
pub struct ReloadingServerConfig {
    files: TlsFiles,
    state: RwLock<(Vec<Option<SystemTime>>, Arc<ServerConfig>)>,
}

impl ReloadingServerConfig {
    /// Loads the configuration once; fails when the files are unusable.
    pub fn new(files: TlsFiles) -> Result<Self, CertError> {
        let stamps = stamps(&files);
        let cfg = Arc::new(server_config(&files)?);
        Ok(Self { files, state: RwLock::new((stamps, cfg)) })
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.state.read().map(|s| s.1.clone()).unwrap_or_else(|p| p.into_inner().1.clone())
    }

    /// Reloads when a file changed. Returns whether it reloaded; on error the old
    /// configuration stays in force.
    pub fn reload_if_changed(&self) -> Result<bool, CertError> {
        let now = stamps(&self.files);
        let changed = self.state.read().map(|s| s.0 != now).unwrap_or(true);
        if !changed {
            return Ok(false);
        }
        let cfg = Arc::new(server_config(&self.files)?);
        if let Ok(mut s) = self.state.write() {
            *s = (now, cfg);
        }
        Ok(true)
    }
}

fn stamps(files: &TlsFiles) -> Vec<Option<SystemTime>> {
    std::iter::once(&files.cert)
        .chain(std::iter::once(&files.key))
        .chain(files.ca.iter())
        .map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
        .collect()
}
