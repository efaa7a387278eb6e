//! A client's failed TLS handshake, as one line for the hub's log that says whose
//! certificate or which flag is wrong (the client's own hints are in
//! `fleetwatch_client::tls_hint`).

use fleetwatch_certs::tls_error::{alert_name, find_rustls, when};
use rustls::{AlertDescription, CertificateError, Error};

/// What is wrong when a client's TLS handshake with the hub failed, for the hub's log;
/// `None` for failures without a known cause.
pub(crate) fn server_side(err: &(dyn std::error::Error + 'static)) -> Option<String> {
    Some(match find_rustls(err)? {
        Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                "client certificate is not signed by a CA in --client-ca".into()
            }
            CertificateError::ExpiredContext { not_after, .. } => {
                format!("client certificate expired at {}", when(not_after))
            }
            CertificateError::Expired => "client certificate has expired".into(),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "client certificate is not valid yet: are the clocks in step?".into()
            }
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                "client certificate lacks the clientAuth extended key usage".into()
            }
            other => format!("client certificate is not acceptable: {other}"),
        },
        Error::NoCertificatesPresented => "client presented no certificate (mutual TLS is required)".into(),
        Error::AlertReceived(a) => match a {
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::DecryptError => "the client does not accept the hub's certificate: is it signed \
                by the client's --ca, and valid for the name in its --hub?"
                .into(),
            AlertDescription::CertificateExpired => {
                "the client says the hub's certificate expired or is not yet valid".into()
            }
            AlertDescription::UnsupportedCertificate => {
                "the client refused the hub's certificate: it lacks the serverAuth extended key usage".into()
            }
            other => format!("the client ended the TLS handshake: {}", alert_name(other)),
        },
        Error::InvalidMessage(_) => "not a TLS client (plain HTTP or a port scan?)".into(),
        Error::PeerIncompatible(_) => "the client does not support TLS 1.3".into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn io(e: Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn hub_hints_say_whose_certificate_is_wrong() {
        let e = io(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        assert_eq!(server_side(&e).unwrap(), "client certificate is not signed by a CA in --client-ca");
        assert!(server_side(&io(Error::NoCertificatesPresented)).unwrap().contains("no certificate"));
        let other = io(Error::AlertReceived(AlertDescription::AccessDenied));
        assert_eq!(server_side(&other).unwrap(), "the client ended the TLS handshake: access denied");
    }
}
