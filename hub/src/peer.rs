//! Who is on the other end of a connection ([`Peer`]), from its verified certificate: a
//! value the server makes at the handshake and the sessions, the registry and
//! housekeeping (which closes revoked and expired peers) share.

use std::sync::Arc;

/// Who is on the other end of a connection, from its certificate.
#[derive(Debug, Clone)]
pub(crate) struct Peer {
    /// The SPIFFE id.
    pub(crate) identity: String,
    /// The certificate serial, lower-case hex.
    pub(crate) serial: String,
    /// When the certificate expires: the session ends then.
    pub(crate) not_after: jiff::Timestamp,
    /// The presented chain, re-verified when the CA bundles change.
    pub(crate) chain: Arc<Vec<rustls::pki_types::CertificateDer<'static>>>,
    /// Why the hub ended the session (set before its token is cancelled).
    pub(crate) ended: Arc<std::sync::OnceLock<String>>,
}

impl Peer {
    /// The peer as its verified certificate says.
    pub(crate) fn new(cert: fleetwatch_certs::PeerCert) -> Self {
        Self {
            identity: cert.identity.to_string(),
            serial: cert.serial,
            not_after: cert.not_after,
            chain: Arc::new(cert.chain),
            ended: Arc::default(),
        }
    }
}
