//! TLS failures as one line that says what a client (agent, subscriber) should fix.
//!
//! rustls reports what failed ("UnknownIssuer", "received fatal alert: UnknownCA"); an
//! operator needs to know which file or flag is wrong. With TLS 1.3 a client learns that
//! the hub refused its certificate only from an alert after its own handshake finished,
//! so this also looks for alerts in WebSocket errors. The hub's side of the same failures
//! is the hub's own (`fleetwatch-hub`); both read errors with `fleetwatch_certs::tls_error`.

use fleetwatch_certs::tls_error::{alert_name, find_rustls, when};
use rustls::{AlertDescription, CertificateError, Error};

/// What a client (agent, subscriber) should fix when its TLS connection to the hub at
/// `host` failed; `None` for failures without a known cause.
pub fn client_side(err: &(dyn std::error::Error + 'static), host: &str) -> Option<String> {
    Some(match find_rustls(err)? {
        Error::InvalidCertificate(c) => match c {
            CertificateError::UnknownIssuer | CertificateError::BadSignature => {
                "the hub's certificate is not signed by a CA in --ca".into()
            }
            CertificateError::ExpiredContext { not_after, .. } => {
                format!("the hub's certificate expired at {}", when(not_after))
            }
            CertificateError::Expired => "the hub's certificate has expired".into(),
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. } => {
                "the hub's certificate is not valid yet: are the clocks in step?".into()
            }
            CertificateError::NotValidForNameContext { presented, .. } => format!(
                "the hub's certificate is not valid for {host}: its names are {}; use one of them in --hub",
                if presented.is_empty() { "none".to_string() } else { presented.join(", ") }
            ),
            CertificateError::NotValidForName => format!("the hub's certificate is not valid for {host}"),
            CertificateError::InvalidPurpose | CertificateError::InvalidPurposeContext { .. } => {
                "the hub's certificate lacks the serverAuth extended key usage: issue it with `fleetwatch certs issue hub`"
                    .into()
            }
            other => format!("the hub's certificate is not acceptable: {other}"),
        },
        Error::AlertReceived(a) => match a {
            AlertDescription::UnknownCA
            | AlertDescription::BadCertificate
            | AlertDescription::CertificateUnknown
            | AlertDescription::DecryptError => {
                "the hub does not trust this client certificate: is it signed by a CA in the hub's --client-ca?".into()
            }
            AlertDescription::CertificateExpired => {
                "the hub refused this client certificate as expired or not yet valid: renew it".into()
            }
            AlertDescription::UnsupportedCertificate => "the hub refused this client certificate: it lacks the \
                clientAuth extended key usage; issue it with `fleetwatch certs issue`"
                .into(),
            AlertDescription::CertificateRevoked => "the hub refused this client certificate as revoked".into(),
            AlertDescription::CertificateRequired => {
                "the hub requires a client certificate (--cert and --key)".into()
            }
            AlertDescription::ProtocolVersion | AlertDescription::HandshakeFailure => {
                "no TLS version or cipher in common with the hub (fleetwatch uses TLS 1.3)".into()
            }
            other => format!("the hub ended the TLS handshake: {}", alert_name(other)),
        },
        Error::InvalidMessage(_) => {
            format!("{host} does not speak TLS: is --hub the hub's wss address?")
        }
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::UnixTime;

    fn io(e: Error) -> std::io::Error {
        std::io::Error::new(std::io::ErrorKind::InvalidData, e)
    }

    #[test]
    fn client_hints_name_the_flag_to_fix() {
        let unknown = io(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        assert_eq!(client_side(&unknown, "h").unwrap(), "the hub's certificate is not signed by a CA in --ca");
        let alert = tokio_tungstenite::tungstenite::Error::Io(io(Error::AlertReceived(AlertDescription::UnknownCA)));
        assert!(client_side(&alert, "h").unwrap().contains("hub's --client-ca"));
        let name = io(Error::InvalidCertificate(CertificateError::NotValidForNameContext {
            expected: rustls::pki_types::ServerName::try_from("h").unwrap().to_owned(),
            presented: vec!["DnsName(\"a\")".into()],
        }));
        assert!(
            client_side(&name, "h").unwrap().starts_with("the hub's certificate is not valid for h: its names are")
        );
        let expired = io(Error::InvalidCertificate(CertificateError::ExpiredContext {
            time: UnixTime::since_unix_epoch(std::time::Duration::from_secs(2_000_000_000)),
            not_after: UnixTime::since_unix_epoch(std::time::Duration::from_secs(1_900_000_000)),
        }));
        assert_eq!(client_side(&expired, "h").unwrap(), "the hub's certificate expired at 2030-03-17T17:46:40Z");
        assert_eq!(client_side(&std::io::Error::other("x"), "h"), None);
    }
}
