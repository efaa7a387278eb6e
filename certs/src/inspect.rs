//! Reading what a certificate says: identity, serial, validity.

use std::path::Path;

use fleetwatch_protocol::identity::Identity;
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

use crate::error::{CertError, io_err};

/// What a certificate says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertInfo {
    /// The SPIFFE identity, when the certificate's only URI SAN is a valid SPIFFE id.
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
    /// The extended key usages it names (`serverAuth`, `clientAuth`, other OIDs dotted);
    /// `None` when it has no extended key usage extension at all.
    pub extended_key_usage: Option<Vec<String>>,
    /// The issuer's distinguished name, DER: compared with CA subjects.
    pub issuer_der: Vec<u8>,
}

/// The extended key usage a certificate needs for its side of a TLS connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A hub (TLS server).
    ServerAuth,
    /// An agent or subscriber (TLS client).
    ClientAuth,
}

impl Purpose {
    /// The name in the extension, as `openssl x509 -text` shows it (without "TLS Web").
    pub fn name(self) -> &'static str {
        match self {
            Purpose::ServerAuth => "serverAuth",
            Purpose::ClientAuth => "clientAuth",
        }
    }

    /// The command that issues a certificate with this usage.
    fn issue_with(self) -> &'static str {
        match self {
            Purpose::ServerAuth => "`fleetwatch certs issue hub`",
            Purpose::ClientAuth => "`fleetwatch certs issue agent` or `fleetwatch certs issue subscriber`",
        }
    }
}

impl CertInfo {
    /// Checks the certificate names `purpose` among its extended key usages. A certificate
    /// without the extension is refused too: fleetwatch issues it on every leaf, and a
    /// certificate made for something else must not pass as one of ours.
    pub fn check_purpose(&self, purpose: Purpose) -> Result<(), String> {
        match &self.extended_key_usage {
            Some(ekus) if ekus.iter().any(|e| e == purpose.name()) => Ok(()),
            Some(ekus) => Err(format!(
                "certificate's extended key usage is {} but it needs {}; issue it with {}",
                if ekus.is_empty() { "empty".to_string() } else { ekus.join(", ") },
                purpose.name(),
                purpose.issue_with()
            )),
            None => Err(format!(
                "certificate has no extended key usage but needs {}; issue it with {}",
                purpose.name(),
                purpose.issue_with()
            )),
        }
    }

    /// The identity, or why the certificate carries none fleetwatch accepts: exactly one
    /// URI SAN, and it must be a SPIFFE id of a known role.
    pub fn require_identity(&self) -> Result<Identity, String> {
        match self.uris.as_slice() {
            [] => Err("certificate has no URI SAN; it needs exactly one, a SPIFFE id (spiffe://...)".into()),
            [one] => one.parse::<Identity>().map_err(|e| format!("certificate's URI SAN: {e}")),
            many => Err(format!(
                "certificate has {} URI SANs ({}); it needs exactly one, a SPIFFE id (spiffe://...)",
                many.len(),
                many.join(", ")
            )),
        }
    }
}

/// A duration for people, coarse: `40 s`, `12 min`, `5 h`, `3 days`.
fn coarse(seconds: i64) -> String {
    match seconds {
        ..120 => format!("{seconds} s"),
        120..7200 => format!("{} min", seconds / 60),
        7200..172_800 => format!("{} h", seconds / 3600),
        _ => format!("{} days", seconds / 86_400),
    }
}

impl CertInfo {
    /// Whether it is valid at `now`, for people: `valid, 29 days left`, `EXPIRED 3 min ago`
    /// or `NOT YET VALID, starts in 2 h` (the marks are capitals so they stand out).
    pub fn validity_at(&self, now: jiff::Timestamp) -> String {
        if now > self.not_after {
            format!("EXPIRED {} ago", coarse(now.as_second() - self.not_after.as_second()))
        } else if now < self.not_before {
            format!("NOT YET VALID, starts in {}", coarse(self.not_before.as_second() - now.as_second()))
        } else {
            format!("valid, {} left", coarse(self.not_after.as_second() - now.as_second()))
        }
    }
}

impl std::fmt::Display for CertInfo {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let id = self.identity.as_ref().map(ToString::to_string).unwrap_or_else(|| "(none)".into());
        writeln!(f, "identity:   {id}")?;
        writeln!(f, "serial:     {}", self.serial)?;
        writeln!(f, "not before: {}", self.not_before)?;
        writeln!(f, "not after:  {}", self.not_after)?;
        writeln!(f, "validity:   {}", self.validity_at(jiff::Timestamp::now()))?;
        writeln!(f, "subject:    {}", self.subject)?;
        writeln!(f, "issuer:     {}", self.issuer)?;
        writeln!(f, "ca:         {}", self.is_ca)?;
        if let Some(eku) = &self.extended_key_usage {
            writeln!(f, "usage:      {}", eku.join(", "))?;
        }
        if self.uris.len() > 1 {
            writeln!(f, "uris:       {}", self.uris.join(", "))?;
        }
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

/// Reads every certificate of a PEM file (a CA bundle), in file order.
pub fn inspect_bundle(path: &Path) -> Result<Vec<CertInfo>, CertError> {
    let bytes = std::fs::read(path).map_err(io_err(path))?;
    let pem_err = |what: String| CertError::Pem { path: path.to_path_buf(), what };
    let ders: Vec<CertificateDer<'_>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| pem_err(format!("bad PEM: {e}")))?;
    if ders.is_empty() {
        return Err(pem_err("no certificate in file".into()));
    }
    ders.iter().map(|d| inspect_der(d).map_err(pem_err)).collect()
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
    // SPIFFE X.509-SVID: exactly one URI SAN, the SPIFFE id. A second URI (even an
    // https one) makes the identity ambiguous to other verifiers, so it is not accepted.
    let identity = match uris.as_slice() {
        [one] => one.parse().ok(),
        _ => None,
    };
    let extended_key_usage = match cert.extended_key_usage() {
        Ok(Some(eku)) => {
            let eku = &eku.value;
            let mut names = Vec::new();
            if eku.any {
                names.push("anyExtendedKeyUsage".to_string());
            }
            if eku.server_auth {
                names.push("serverAuth".to_string());
            }
            if eku.client_auth {
                names.push("clientAuth".to_string());
            }
            if eku.code_signing {
                names.push("codeSigning".to_string());
            }
            if eku.email_protection {
                names.push("emailProtection".to_string());
            }
            if eku.time_stamping {
                names.push("timeStamping".to_string());
            }
            if eku.ocsp_signing {
                names.push("OCSPSigning".to_string());
            }
            names.extend(eku.other.iter().map(|oid| oid.to_id_string()));
            Some(names)
        }
        Ok(None) => None,
        Err(e) => return Err(format!("unreadable extended key usage: {e}")),
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
        extended_key_usage,
        issuer_der: cert.issuer().as_raw().to_vec(),
        uris,
        dns,
        ips,
    })
}
