//! TLS failures as one line that says what to fix, for each end of a connection.
//!
//! rustls reports what failed ("UnknownIssuer", "received fatal alert: UnknownCA"); an
//! operator needs to know which file or flag is wrong. With TLS 1.3 a client learns that
//! the hub refused its certificate only from an alert after its own handshake finished,
//! so the client side also looks for alerts in WebSocket errors.

use rustls::pki_types::UnixTime;
use rustls::{AlertDescription, CertificateError, Error};

/// The rustls error somewhere in `err`'s chain (inside `io::Error`s and tungstenite errors).
pub fn find_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut next: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<Error>() {
            return Some(r);
        }
        let io = e.downcast_ref::<std::io::Error>().or_else(|| match e.downcast_ref() {
            Some(tokio_tungstenite::tungstenite::Error::Io(io)) => Some(io),
            _ => None,
        });
        // An io::Error's source() skips the error it wraps: look at that one directly.
        if let Some(r) = io.and_then(|io| io.get_ref()).and_then(|inner| inner.downcast_ref::<Error>()) {
            return Some(r);
        }
        next = e.source();
    }
    None
}

fn when(t: &UnixTime) -> String {
    i64::try_from(t.as_secs())
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| format!("{} (UNIX time)", t.as_secs()))
}

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

/// What is wrong when a client's TLS handshake with the hub failed, for the hub's log;
/// `None` for failures without a known cause.
pub fn server_side(err: &(dyn std::error::Error + 'static)) -> Option<String> {
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

fn alert_name(a: &AlertDescription) -> String {
    // AlertDescription has no Display; its variant names are what TLS specs call them.
    let mut name = String::new();
    for (i, ch) in format!("{a:?}").chars().enumerate() {
        if ch.is_ascii_uppercase() && i > 0 {
            name.push(' ');
        }
        name.push(ch.to_ascii_lowercase());
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

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

    #[test]
    fn hub_hints_say_whose_certificate_is_wrong() {
        let e = io(Error::InvalidCertificate(CertificateError::UnknownIssuer));
        assert_eq!(server_side(&e).unwrap(), "client certificate is not signed by a CA in --client-ca");
        assert!(server_side(&io(Error::NoCertificatesPresented)).unwrap().contains("no certificate"));
        let other = io(Error::AlertReceived(AlertDescription::AccessDenied));
        assert_eq!(server_side(&other).unwrap(), "the client ended the TLS handshake: access denied");
    }
}
