//! Certificate verifiers that add fleetwatch's rules to webpki's: a peer's certificate must
//! name the extended key usage of its side (webpki accepts a certificate without the
//! extension at all, which would let any CA-signed certificate act as client and server).

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, Error, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};

use crate::inspect::{Purpose, inspect_der};

/// Refuses a leaf that does not name `purpose`, with the error webpki uses for a wrong one
/// (so both ends see "unsupported certificate" and can say what to fix).
fn check_purpose(leaf: &CertificateDer<'_>, purpose: Purpose) -> Result<(), Error> {
    let info = inspect_der(leaf).map_err(|_| Error::InvalidCertificate(CertificateError::BadEncoding))?;
    info.check_purpose(purpose).map_err(|_| Error::InvalidCertificate(CertificateError::InvalidPurpose))
}

/// The hub's verifier of client certificates: webpki, then the clientAuth usage.
#[derive(Debug)]
pub(crate) struct ClientAuthVerifier {
    pub(crate) inner: Arc<dyn ClientCertVerifier>,
}

impl ClientCertVerifier for ClientAuthVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, Error> {
        let verified = self.inner.verify_client_cert(end_entity, intermediates, now)?;
        check_purpose(end_entity, Purpose::ClientAuth)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// A client's verifier of the hub's certificate: webpki, then the serverAuth usage.
#[derive(Debug)]
pub(crate) struct ServerAuthVerifier {
    pub(crate) inner: Arc<dyn ServerCertVerifier>,
}

impl ServerCertVerifier for ServerAuthVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, Error> {
        let verified = self.inner.verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)?;
        check_purpose(end_entity, Purpose::ServerAuth)?;
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}
