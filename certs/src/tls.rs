//! rustls configurations for mutual TLS, the peer identity check, and hot reload.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleetwatch_protocol::identity::Identity;
use rustls::client::WebPkiServerVerifier;
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, ClientConfig, Error, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, UnixTime};

use crate::error::CertError;
use crate::inspect::{Purpose, inspect_der};
use crate::reloading::{Compare, Reload, ReloadingFile};
use crate::verify::{ClientAuthVerifier, ServerAuthVerifier};

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

/// Checks that our own certificate (first of `files.cert`) carries the usage its side needs,
/// so a wrong certificate fails at start-up with a message naming the file, not at every peer.
fn check_own_purpose(files: &TlsFiles, chain: &[CertificateDer<'_>], purpose: Purpose) -> Result<(), CertError> {
    let Some(leaf) = chain.first() else {
        return Err(CertError::Pem { path: files.cert.clone(), what: "no certificate in file".into() });
    };
    let info = inspect_der(leaf).map_err(|what| CertError::Pem { path: files.cert.clone(), what })?;
    info.check_purpose(purpose).map_err(|what| CertError::Pem { path: files.cert.clone(), what })
}

/// The client verifier over the CA bundles, with the clientAuth check.
fn client_verifier(files: &TlsFiles) -> Result<Arc<dyn ClientCertVerifier>, CertError> {
    client_verifier_with(files, false)
}

/// Verifies client certificates against the CA bundles; with `optional`, a client may also
/// present none (a certificate it presents must still verify).
fn client_verifier_with(files: &TlsFiles, optional: bool) -> Result<Arc<dyn ClientCertVerifier>, CertError> {
    let roots = Arc::new(load_roots(&files.ca)?);
    let mut builder = WebPkiClientVerifier::builder_with_provider(roots, provider());
    if optional {
        builder = builder.allow_unauthenticated();
    }
    let inner = builder.build().map_err(|e| CertError::Tls(format!("client verifier: {e}")))?;
    Ok(Arc::new(ClientAuthVerifier { inner }))
}

fn build_server_config(
    files: &TlsFiles,
    verifier: Arc<dyn ClientCertVerifier>,
) -> Result<(ServerConfig, jiff::Timestamp), CertError> {
    let ck = load_certified_key(files)?;
    check_own_purpose(files, &ck.cert, Purpose::ServerAuth)?;
    let not_after =
        ck.cert.first().and_then(|c| inspect_der(c).ok()).map(|i| i.not_after).unwrap_or(jiff::Timestamp::MAX);
    let cfg = ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CertError::Tls(e.to_string()))?
        .with_client_cert_verifier(verifier)
        .with_single_cert(ck.cert.clone(), load_key(&files.key)?)
        .map_err(|e| CertError::Tls(e.to_string()))?;
    Ok((cfg, not_after))
}

/// The hub's server configuration: TLS 1.3, client certificates required and verified
/// against the CA bundles, and they must name the clientAuth usage. The hub's own
/// certificate must name serverAuth.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, CertError> {
    build_server_config(files, client_verifier(files)?).map(|(cfg, _)| cfg)
}

/// Like [`server_config`], but a client may connect without a certificate; one it presents
/// must verify. The connection's `peer_certificates()` then say whether it was given, so
/// the server decides per request (the hub's admin endpoint: open probes, the rest needs
/// a certificate).
///
/// ```no_run
/// # use fleetwatch_certs::{TlsFiles, server_config_optional_client};
/// let files = TlsFiles { cert: "hub.crt".into(), key: "hub.key".into(), ca: vec!["admin-ca.crt".into()] };
/// let config = server_config_optional_client(&files)?;
/// # Ok::<(), fleetwatch_certs::CertError>(())
/// ```
pub fn server_config_optional_client(files: &TlsFiles) -> Result<ServerConfig, CertError> {
    build_server_config(files, client_verifier_with(files, true)?).map(|(cfg, _)| cfg)
}

/// A client configuration (agent or subscriber): trusts the CA bundles, presents the
/// client certificate (which must name the clientAuth usage) and requires the hub's to
/// name serverAuth.
pub fn client_config(files: &TlsFiles) -> Result<ClientConfig, CertError> {
    let roots = Arc::new(load_roots(&files.ca)?);
    let ck = load_certified_key(files)?;
    check_own_purpose(files, &ck.cert, Purpose::ClientAuth)?;
    let inner = WebPkiServerVerifier::builder_with_provider(roots, provider())
        .build()
        .map_err(|e| CertError::Tls(format!("server verifier: {e}")))?;
    ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .map_err(|e| CertError::Tls(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ServerAuthVerifier { inner }))
        .with_client_auth_cert(ck.cert.clone(), load_key(&files.key)?)
        .map_err(|e| CertError::Tls(e.to_string()))
}

/// What the hub keeps of a verified client's certificate for the session's lifetime.
#[derive(Debug, Clone)]
pub struct PeerCert {
    /// The SPIFFE id (the certificate's only URI SAN).
    pub identity: Identity,
    /// Serial, lower-case hex.
    pub serial: String,
    /// End of validity: the session ends then.
    pub not_after: jiff::Timestamp,
    /// The chain as presented, to re-verify it when the CA bundles change.
    pub chain: Vec<CertificateDer<'static>>,
}

/// The identity in a verified peer's certificate (the first of its chain).
pub fn peer_identity(chain: &[CertificateDer<'_>]) -> Result<Identity, CertError> {
    peer_certificate(chain).map(|p| p.identity)
}

/// A verified peer's certificate: exactly one URI SAN, a SPIFFE id, and the clientAuth usage.
pub fn peer_certificate(chain: &[CertificateDer<'_>]) -> Result<PeerCert, CertError> {
    let leaf = chain.first().ok_or_else(|| CertError::PeerIdentity("no client certificate".into()))?;
    let info = inspect_der(leaf).map_err(CertError::PeerIdentity)?;
    let identity = info.require_identity().map_err(CertError::PeerIdentity)?;
    info.check_purpose(Purpose::ClientAuth).map_err(CertError::PeerIdentity)?;
    Ok(PeerCert {
        identity,
        serial: info.serial.to_lowercase(),
        not_after: info.not_after,
        chain: chain.iter().map(|c| c.clone().into_owned()).collect(),
    })
}

/// A configuration in force.
struct Loaded {
    config: Arc<ServerConfig>,
    verifier: Arc<dyn ClientCertVerifier>,
    not_after: jiff::Timestamp,
}

/// A server configuration that follows its files: [`reload_if_changed`] rebuilds it when
/// the certificate, key or a CA bundle changed on disk (by modification time), so CA
/// rotation and certificate renewal need no restart. New connections get the new
/// configuration. Broken files keep the configuration in force (see [`ReloadingFile`]).
///
/// [`reload_if_changed`]: ReloadingServerConfig::reload_if_changed
pub struct ReloadingServerConfig {
    files: TlsFiles,
    loaded: ReloadingFile<Loaded>,
}

impl ReloadingServerConfig {
    /// Loads the configuration once; fails when the files are unusable.
    pub fn new(files: TlsFiles) -> Result<Self, CertError> {
        let loaded = ReloadingFile::load(paths(&files), Compare::Modified, |_| load(&files))?;
        Ok(Self { files, loaded })
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ServerConfig> {
        self.loaded.current().config.clone()
    }

    /// When the hub's certificate in force expires.
    pub fn not_after(&self) -> jiff::Timestamp {
        self.loaded.current().not_after
    }

    /// Why the files on disk cannot be loaded (the previous configuration is in force), if so.
    pub fn load_error(&self) -> Option<String> {
        self.loaded.failure()
    }

    /// When to call [`reload_if_changed`](Self::reload_if_changed): at once when the
    /// directory of a file reports a change (with `watch`), else every `fallback`.
    pub fn checks(&self, fallback: std::time::Duration, watch: bool) -> crate::FileChecks {
        crate::FileChecks::new(self.loaded.paths(), fallback, watch)
    }

    /// Reloads when a file changed. Returns whether it reloaded; on error the old
    /// configuration stays in force, and the same broken files are reported only once.
    pub fn reload_if_changed(&self) -> Result<bool, CertError> {
        match self.loaded.reload_if_changed(|_, _| load(&self.files)) {
            Reload::Replaced => Ok(true),
            Reload::Unchanged | Reload::Recovered => Ok(false),
            Reload::Failed(e) => Err(e),
        }
    }

    /// Checks a live peer's chain against the CA bundles in force now: `Err` says why the
    /// session must end ("its CA is no longer trusted", "certificate expired at ...").
    pub fn verify_peer(&self, chain: &[CertificateDer<'static>]) -> Result<(), String> {
        let Some((leaf, intermediates)) = chain.split_first() else {
            return Err("no certificate".into());
        };
        let verifier = self.loaded.current().verifier.clone();
        match verifier.verify_client_cert(leaf, intermediates, UnixTime::now()) {
            Ok(_) => Ok(()),
            // A new CA often has the old one's name: then the chain is found but its
            // signature does not verify, which means the same.
            Err(Error::InvalidCertificate(CertificateError::UnknownIssuer | CertificateError::BadSignature)) => {
                Err("its CA is no longer trusted".into())
            }
            Err(Error::InvalidCertificate(CertificateError::Expired | CertificateError::ExpiredContext { .. })) => {
                let when = inspect_der(leaf).map(|i| i.not_after.to_string()).unwrap_or_else(|_| "?".into());
                Err(format!("certificate expired at {when}"))
            }
            Err(e) => Err(format!("certificate no longer verifies: {e}")),
        }
    }
}

/// A client configuration in force, and what its certificate says.
struct ClientLoaded {
    config: Arc<ClientConfig>,
    info: crate::CertInfo,
}

/// What [`ReloadingClientConfig::reload_if_changed`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClientReload {
    /// The files are as they were.
    Unchanged,
    /// Only the CA bundles changed: the next connection uses them.
    Bundles,
    /// The client's own certificate changed (renewed): a connection should be reopened
    /// with it before the old one expires.
    Certificate {
        /// The serial of the certificate now in force.
        serial: String,
        /// When it expires.
        not_after: jiff::Timestamp,
    },
}

/// A client configuration (agent, subscriber) that follows its files, as
/// [`ReloadingServerConfig`] does for the hub: renewed certificates (a cert-manager
/// Secret, the lifecycle operator's rotation, a kubelet updating a mounted Secret) and
/// CA bundle changes take effect without a restart.
///
/// Files are compared by content, not modification time: a kubelet swaps a Secret volume
/// through a symlink, and a renewal may keep the time stamp. A half-written pair (a new
/// certificate with the old key) does not load; the previous configuration stays in force
/// and the next check tries again. The new certificate must carry the same SPIFFE identity.
pub struct ReloadingClientConfig {
    files: TlsFiles,
    loaded: ReloadingFile<ClientLoaded>,
}

impl ReloadingClientConfig {
    /// Loads the configuration once (see [`client_config`]); fails when the files are
    /// unusable.
    pub fn new(files: TlsFiles) -> Result<Self, CertError> {
        let loaded = ReloadingFile::load(paths(&files), Compare::Content, |_| load_client(&files))?;
        Ok(Self { files, loaded })
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ClientConfig> {
        self.loaded.current().config.clone()
    }

    /// What the certificate in force says (identity, serial, validity).
    pub fn certificate(&self) -> crate::CertInfo {
        self.loaded.current().info.clone()
    }

    /// Why the files on disk cannot be loaded (the previous configuration is in force), if so.
    pub fn load_error(&self) -> Option<String> {
        self.loaded.failure()
    }

    /// When to call [`reload_if_changed`](Self::reload_if_changed): at once when the
    /// directory of a file reports a change (with `watch`), else every `fallback`.
    pub fn checks(&self, fallback: std::time::Duration, watch: bool) -> crate::FileChecks {
        crate::FileChecks::new(self.loaded.paths(), fallback, watch)
    }

    /// Reloads when a file's content changed. On error the old configuration stays in
    /// force; the same broken contents are reported only once (then `Ok(Unchanged)`).
    pub fn reload_if_changed(&self) -> Result<ClientReload, CertError> {
        // The serial the new configuration replaced, to tell a renewal from a bundle change.
        let mut replaced_serial = None;
        let reload = self.loaded.reload_if_changed(|_, old| {
            replaced_serial = Some(old.info.serial.clone());
            let l = load_client(&self.files)?;
            if l.info.identity != old.info.identity {
                let show = |i: &Option<Identity>| i.as_ref().map_or("none".to_string(), |i| i.to_string());
                return Err(CertError::Pem {
                    path: self.files.cert.clone(),
                    what: format!(
                        "the new certificate's identity {} differs from the one in use ({}); keeping the old one",
                        show(&l.info.identity),
                        show(&old.info.identity)
                    ),
                });
            }
            Ok(l)
        });
        match reload {
            Reload::Unchanged | Reload::Recovered => Ok(ClientReload::Unchanged),
            Reload::Replaced => {
                let now = self.loaded.current();
                Ok(if replaced_serial.as_ref() != Some(&now.info.serial) {
                    ClientReload::Certificate { serial: now.info.serial.clone(), not_after: now.info.not_after }
                } else {
                    ClientReload::Bundles
                })
            }
            Reload::Failed(e) => Err(e),
        }
    }
}

/// The certificate, the key and the CA bundles, in that order.
fn paths(files: &TlsFiles) -> Vec<PathBuf> {
    [files.cert.clone(), files.key.clone()].into_iter().chain(files.ca.iter().cloned()).collect()
}

fn load_client(files: &TlsFiles) -> Result<ClientLoaded, CertError> {
    let config = client_config(files)?;
    let info = crate::inspect_file(&files.cert)?;
    Ok(ClientLoaded { config: Arc::new(config), info })
}

fn load(files: &TlsFiles) -> Result<Loaded, CertError> {
    let verifier = client_verifier(files)?;
    let (config, not_after) = build_server_config(files, verifier.clone())?;
    Ok(Loaded { config: Arc::new(config), verifier, not_after })
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;
    use crate::{Authority, LeafSpec};
    use rcgen::{CertificateParams, ExtendedKeyUsagePurpose, Issuer, KeyPair, PKCS_ECDSA_P256_SHA256, SanType};

    /// A CA in a temporary directory and a way to sign arbitrary leaves with it.
    struct Ca {
        dir: tempfile::TempDir,
        issuer: Issuer<'static, KeyPair>,
    }

    impl Ca {
        fn new() -> Self {
            crate::install_crypto_provider();
            let dir = tempfile::tempdir().unwrap();
            Authority::init(dir.path(), "td").unwrap();
            let key = KeyPair::from_pem(&std::fs::read_to_string(dir.path().join("ca.key")).unwrap()).unwrap();
            let issuer =
                Issuer::from_ca_cert_pem(&std::fs::read_to_string(dir.path().join("ca.crt")).unwrap(), key).unwrap();
            Self { dir, issuer }
        }

        /// Signs a leaf with these URI SANs and extended key usages; returns its TLS files.
        fn leaf(&self, name: &str, uris: &[&str], eku: Vec<ExtendedKeyUsagePurpose>) -> TlsFiles {
            let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
            let mut params = CertificateParams::new(vec!["localhost".to_string()]).unwrap();
            params.subject_alt_names.extend(uris.iter().map(|u| SanType::URI((*u).try_into().unwrap())));
            params.extended_key_usages = eku;
            let cert = params.signed_by(&key, &self.issuer).unwrap();
            let (c, k) = (self.dir.path().join(format!("{name}.crt")), self.dir.path().join(format!("{name}.key")));
            std::fs::write(&c, cert.pem()).unwrap();
            std::fs::write(&k, key.serialize_pem()).unwrap();
            TlsFiles { cert: c, key: k, ca: vec![self.dir.path().join("ca.crt")] }
        }

        fn der(files: &TlsFiles) -> Vec<CertificateDer<'static>> {
            load_certs(&files.cert).unwrap()
        }
    }

    const AGENT: &str = "spiffe://td/cluster/a";

    #[test]
    fn a_client_configuration_follows_its_files() {
        let ca = Ca::new();
        let auth = Authority::load(ca.dir.path()).unwrap();
        let issued = auth.issue(ca.dir.path(), &LeafSpec::Agent { cluster: "x".into() }, 1).unwrap();
        let files =
            TlsFiles { cert: issued.cert.clone(), key: issued.key.clone(), ca: vec![ca.dir.path().join("ca.crt")] };
        let reloading = ReloadingClientConfig::new(files.clone()).unwrap();
        let first = reloading.certificate().serial;
        assert_eq!(reloading.reload_if_changed().unwrap(), ClientReload::Unchanged);

        // Renewed: a new certificate and key, same identity.
        let (cert, key, _) = auth.issue_pem(&LeafSpec::Agent { cluster: "x".into() }, 1).unwrap();
        // Half-written (the new certificate with the old key): refused once, old in force.
        std::fs::write(&files.cert, &cert).unwrap();
        let err = reloading.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("do not match"), "{err}");
        assert!(reloading.load_error().is_some());
        assert_eq!(reloading.reload_if_changed().unwrap(), ClientReload::Unchanged, "reported once");
        assert_eq!(reloading.certificate().serial, first);
        std::fs::write(&files.key, &key).unwrap();
        match reloading.reload_if_changed().unwrap() {
            ClientReload::Certificate { serial, .. } => {
                assert_ne!(serial, first);
                assert_eq!(reloading.certificate().serial, serial);
            }
            other => panic!("expected a new certificate, got {other:?}"),
        }
        assert!(reloading.load_error().is_none());

        // Another identity is never taken over.
        let (cert, key, _) = auth.issue_pem(&LeafSpec::Agent { cluster: "y".into() }, 1).unwrap();
        std::fs::write(&files.cert, &cert).unwrap();
        std::fs::write(&files.key, &key).unwrap();
        let err = reloading.reload_if_changed().unwrap_err().to_string();
        assert!(err.contains("differs from the one in use"), "{err}");
        assert_eq!(reloading.certificate().identity.unwrap().to_string(), "spiffe://td/cluster/x");

        // Only the bundle changes: no new certificate.
        let (cert, key, _) = auth.issue_pem(&LeafSpec::Agent { cluster: "x".into() }, 1).unwrap();
        std::fs::write(&files.cert, &cert).unwrap();
        std::fs::write(&files.key, &key).unwrap();
        assert!(matches!(reloading.reload_if_changed().unwrap(), ClientReload::Certificate { .. }));
        let mut bundle = std::fs::read_to_string(&files.ca[0]).unwrap();
        bundle.push_str(&std::fs::read_to_string(&files.ca[0]).unwrap());
        std::fs::write(&files.ca[0], bundle).unwrap();
        assert_eq!(reloading.reload_if_changed().unwrap(), ClientReload::Bundles);
    }

    #[test]
    fn a_ca_loads_from_pem() {
        let ca = Ca::new();
        let cert = std::fs::read_to_string(ca.dir.path().join("ca.crt")).unwrap();
        let key = std::fs::read_to_string(ca.dir.path().join("ca.key")).unwrap();
        let auth = Authority::from_pem(&cert, &key, "ns/ca").unwrap();
        assert_eq!(auth.trust_domain(), "td");
        let err = Authority::from_pem(&key, &key, "ns/ca").err().unwrap().to_string();
        assert!(err.contains("ns/ca: ca.crt"), "{err}");
    }

    #[test]
    fn a_proper_client_certificate_passes() {
        let ca = Ca::new();
        let good = ca.leaf("good", &[AGENT], vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let peer = peer_certificate(&Ca::der(&good)).unwrap();
        assert_eq!(peer.identity.to_string(), AGENT);
        // And what `fleetwatch certs issue` makes passes every check on both sides.
        let auth = Authority::load(ca.dir.path()).unwrap();
        let issued = auth.issue(ca.dir.path(), &LeafSpec::Agent { cluster: "x".into() }, 1).unwrap();
        let files = TlsFiles { cert: issued.cert, key: issued.key, ca: good.ca.clone() };
        assert!(peer_certificate(&Ca::der(&files)).is_ok());
        assert!(client_config(&files).is_ok());
        let hub = auth.issue(ca.dir.path(), &LeafSpec::Hub { dns: vec!["h".into()], ips: vec![] }, 1).unwrap();
        let hub = TlsFiles { cert: hub.cert, key: hub.key, ca: good.ca };
        let reloading = ReloadingServerConfig::new(hub).unwrap();
        assert!(reloading.verify_peer(&Ca::der(&files)).is_ok());
    }

    #[test]
    fn a_second_uri_san_is_refused() {
        let ca = Ca::new();
        let two = ca.leaf("two", &[AGENT, "https://example.org/x"], vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let err = peer_certificate(&Ca::der(&two)).unwrap_err().to_string();
        assert!(err.contains("2 URI SANs") && err.contains("exactly one"), "{err}");
        let none = ca.leaf("none", &[], vec![ExtendedKeyUsagePurpose::ClientAuth]);
        assert!(peer_certificate(&Ca::der(&none)).unwrap_err().to_string().contains("no URI SAN"));
        let https = ca.leaf("https", &["https://example.org/x"], vec![ExtendedKeyUsagePurpose::ClientAuth]);
        assert!(peer_certificate(&Ca::der(&https)).unwrap_err().to_string().contains("not a SPIFFE id"));
    }

    #[test]
    fn client_certificates_need_client_auth() {
        let ca = Ca::new();
        let no_eku = ca.leaf("no-eku", &[AGENT], vec![]);
        let server_only = ca.leaf("server-only", &[AGENT], vec![ExtendedKeyUsagePurpose::ServerAuth]);
        for files in [&no_eku, &server_only] {
            let err = peer_certificate(&Ca::der(files)).unwrap_err().to_string();
            assert!(err.contains("needs clientAuth"), "{err}");
            // The hub's verifier refuses it during the handshake already.
            let verifier = client_verifier(files).unwrap();
            let chain = Ca::der(files);
            let got = verifier.verify_client_cert(&chain[0], &[], UnixTime::now()).unwrap_err();
            assert!(
                matches!(
                    got,
                    Error::InvalidCertificate(
                        CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. }
                    )
                ),
                "{got}"
            );
            // A client refuses to use it at all, naming the file.
            let err = client_config(files).unwrap_err().to_string();
            assert!(err.contains(&files.cert.display().to_string()) && err.contains("clientAuth"), "{err}");
        }
    }

    #[test]
    fn the_hub_certificate_needs_server_auth() {
        let ca = Ca::new();
        for (name, eku) in [("h-none", vec![]), ("h-client", vec![ExtendedKeyUsagePurpose::ClientAuth])] {
            let files = ca.leaf(name, &["spiffe://td/hub"], eku);
            let err = ReloadingServerConfig::new(files.clone()).err().expect("refused").to_string();
            assert!(err.contains(&files.cert.display().to_string()) && err.contains("needs serverAuth"), "{err}");
        }
        let ok = ca.leaf("h-ok", &["spiffe://td/hub"], vec![ExtendedKeyUsagePurpose::ServerAuth]);
        assert!(ReloadingServerConfig::new(ok).is_ok());
    }

    #[test]
    fn live_peers_are_reverified_against_the_bundle_in_force() {
        let ca = Ca::new();
        let other = Ca::new();
        let agent = other.leaf("agent", &[AGENT], vec![ExtendedKeyUsagePurpose::ClientAuth]);
        let hub = ca.leaf("hub", &["spiffe://td/hub"], vec![ExtendedKeyUsagePurpose::ServerAuth]);
        let bundle = ca.dir.path().join("bundle.crt");
        std::fs::copy(other.dir.path().join("ca.crt"), &bundle).unwrap();
        let files = TlsFiles { ca: vec![hub.ca[0].clone(), bundle.clone()], ..hub };
        let cfg = ReloadingServerConfig::new(files).unwrap();
        assert!(cfg.verify_peer(&Ca::der(&agent)).is_ok());
        // The other CA leaves the bundle: the peer no longer verifies.
        std::fs::copy(ca.dir.path().join("ca.crt"), &bundle).unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&bundle).unwrap().set_modified(later).unwrap();
        assert!(cfg.reload_if_changed().unwrap());
        assert_eq!(cfg.verify_peer(&Ca::der(&agent)).unwrap_err(), "its CA is no longer trusted");
    }

    #[test]
    fn a_broken_reload_is_reported_once() {
        let ca = Ca::new();
        let hub = ca.leaf("hub", &["spiffe://td/hub"], vec![ExtendedKeyUsagePurpose::ServerAuth]);
        let cfg = ReloadingServerConfig::new(hub.clone()).unwrap();
        std::fs::write(&hub.cert, "garbage").unwrap();
        let later = SystemTime::now() + std::time::Duration::from_secs(5);
        std::fs::File::options().write(true).open(&hub.cert).unwrap().set_modified(later).unwrap();
        assert!(cfg.reload_if_changed().is_err());
        assert!(cfg.load_error().is_some());
        assert!(!cfg.reload_if_changed().unwrap(), "the same broken files are reported once");
    }
}
