//! The cluster's own self-signed CA and a serving certificate for `127.0.0.1` and
//! `localhost`, and the rustls server configuration (HTTP/2 and HTTP/1.1 by ALPN, as
//! kubectl prefers HTTP/2 and kube-rs speaks HTTP/1.1).

use std::sync::Arc;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
};
use rustls_pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

use crate::error::SimError;

/// What TLS needs: the CA that clients trust and the server configuration.
pub struct Tls {
    /// PEM of the self-signed CA (goes into the kubeconfig).
    pub ca_pem: String,
    pub server_config: Arc<rustls::ServerConfig>,
}

/// Creates a fresh CA and serving certificate.
pub fn generate(extra_sans: &[String]) -> Result<Tls, SimError> {
    // Two crypto providers may be compiled in (ring here, aws-lc-rs via other crates);
    // rustls then refuses to pick one, so pick ring explicitly. Losing the race to another
    // installer is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();

    let mut ca_params = CertificateParams::new(Vec::<String>::new())?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "fleetwatch-sim-ca");
    ca_params.key_usages =
        vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    let ca_key = KeyPair::generate()?;
    let ca_cert = ca_params.self_signed(&ca_key)?;
    let issuer = Issuer::from_params(&ca_params, &ca_key);

    let mut sans = vec!["127.0.0.1".to_string(), "localhost".to_string(), "::1".to_string()];
    sans.extend(extra_sans.iter().cloned());
    let mut params = CertificateParams::new(sans)?;
    params.distinguished_name.push(DnType::CommonName, "fleetwatch-sim");
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    let chain: Vec<CertificateDer<'static>> = vec![cert.der().clone(), ca_cert.der().clone()];
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    let mut cfg = rustls::ServerConfig::builder().with_no_client_auth().with_single_cert(chain, key_der)?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(Tls { ca_pem: ca_cert.pem(), server_config: Arc::new(cfg) })
}

#[cfg(test)]
mod tests {
    #[test]
    fn generates_a_ca_and_config() {
        let t = super::generate(&[]).unwrap();
        assert!(t.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(t.server_config.alpn_protocols.len(), 2);
    }
}
