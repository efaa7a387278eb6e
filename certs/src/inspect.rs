//! Reading what a certificate says: identity, serial, validity.

use std::path::Path;

use fleetwatch_shared::identity::Identity;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{CertError, io_err};

/// What a certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The SPIFFE identity, when the certificate has exactly one valid one.
    pub identity: Option<Identity>,
    /// All URI SANs.
    pub uris: Vec<String>,
    /// DNS SANs.
    pub dns: Vec<String>,
    /// IP SANs.
    pub ips: Vec<String>,
    /// Serial number, lower-case hex.
    pub serial: String,
    /// Subject distinguished name.
    pub subject: String,
    /// Issuer distinguished name.
    pub issuer: String,
    /// Start of validity.
    pub not_before: jiff::Timestamp,
    /// End of validity.
    pub not_after: jiff::Timestamp,
    /// Whether it is a CA certificate.
    pub is_ca: bool,
}

impl std::fmt::Display for CertInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.identity.as_ref().map(ToString::to_string).unwrap_or_else(|| "(none)".into());
        writeln!(f, "identity:   {id}")?;
        writeln!(f, "serial:     {}", self.serial)?;
        writeln!(f, "not before: {}", self.not_before)?;
        writeln!(f, "not after:  {}", self.not_after)?;
        writeln!(f, "subject:    {}", self.subject)?;
        writeln!(f, "issuer:     {}", self.issuer)?;
        writeln!(f, "ca:         {}", self.is_ca)?;
        if !self.dns.is_empty() {
            writeln!(f, "dns:        {}", self.dns.join(", "))?;
        }
        if !self.ips.is_empty() {
            writeln!(f, "ip:         {}", self.ips.join(", "))?;
        }
        Ok(())
    }
}

/// Reads the first certificate of a PEM file.
pub fn inspect_file(path: &Path) -> Result<CertInfo, CertError> {
    let pem = std::fs::read_to_string(path).map_err(io_err(path))?;
    inspect_pem(&pem, path)
}

/// Reads the first certificate of PEM text; `path` is only for error messages.
pub fn inspect_pem(pem: &str, path: &Path) -> Result<CertInfo, CertError> {
    let der = CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|e| CertError::Pem { path: path.to_path_buf(), what: format!("no PEM certificate: {e}") })?;
    inspect_der(&der).map_err(|what| CertError::Pem { path: path.to_path_buf(), what })
}

/// Reads a DER certificate.
pub(crate) fn inspect_der(der: &[u8]) -> Result<CertInfo, String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("not an X.509 certificate: {e}"))?;
    let mut uris = Vec::new();
    let mut dns = Vec::new();
    let mut ips = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for name in &san.value.general_names {
            match name {
                GeneralName::URI(u) => uris.push((*u).to_string()),
                GeneralName::DNSName(d) => dns.push((*d).to_string()),
                GeneralName::IPAddress(b) => ips.push(match b.len() {
                    4 => std::net::Ipv4Addr::new(b[0], b[1], b[2], b[3]).to_string(),
                    16 => {
                        let mut a = [0u8; 16];
                        a.copy_from_slice(b);
                        std::net::Ipv6Addr::from(a).to_string()
                    }
                    _ => format!("{b:?}"),
                }),
                _ => {}
            }
        }
    }
    let spiffe: Vec<_> = uris.iter().filter(|u| u.starts_with("spiffe://")).collect();
    // SPIFFE: exactly one SPIFFE id per certificate.
    let identity = match spiffe.as_slice() {
        [one] => one.parse().ok(),
        _ => None,
    };
    let ts = |t: x509_parser::time::ASN1Time| jiff::Timestamp::from_second(t.timestamp()).unwrap_or_default();
    Ok(CertInfo {
        identity,
        serial: cert.raw_serial_as_string().replace(':', ""),
        subject: cert.subject().to_string(),
        issuer: cert.issuer().to_string(),
        not_before: ts(cert.validity().not_before),
        not_after: ts(cert.validity().not_after),
        is_ca: cert.is_ca(),
        uris,
        dns,
        ips,
    })
}
