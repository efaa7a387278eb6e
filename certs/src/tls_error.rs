//! Reading TLS failures: the rustls error inside an I/O or WebSocket error, and the names
//! and times in it as people read them. Both ends of a connection build their hints on
//! these (`fleetwatch_client::tls_hint` for agents and subscribers, the hub's own for
//! the connections it accepts).

use rustls::AlertDescription;
use rustls::Error;
use rustls::pki_types::UnixTime;

/// The rustls error somewhere in `err`'s chain (inside `io::Error`s and tungstenite errors).
pub fn find_rustls<'a>(err: &'a (dyn std::error::Error + 'static)) -> Option<&'a Error> {
    let mut next: Option<&'a (dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = next {
        if let Some(r) = e.downcast_ref::<Error>() {
            return Some(r);
        }
        // (A WebSocket error's source is the io::Error it wraps: reached on the next turn.)
        let io = e.downcast_ref::<std::io::Error>();
        // An io::Error's source() skips the error it wraps: look at that one directly.
        if let Some(r) = io.and_then(|io| io.get_ref()).and_then(|inner| inner.downcast_ref::<Error>()) {
            return Some(r);
        }
        next = e.source();
    }
    None
}

/// A certificate time as people read it (RFC 3339), or the raw UNIX time out of range.
pub fn when(t: &UnixTime) -> String {
    i64::try_from(t.as_secs())
        .ok()
        .and_then(|s| jiff::Timestamp::from_second(s).ok())
        .map(|t| t.to_string())
        .unwrap_or_else(|| format!("{} (UNIX time)", t.as_secs()))
}

/// An alert's name as TLS specifications write it (`access denied`).
pub fn alert_name(a: &AlertDescription) -> String {
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

    #[test]
    fn finds_the_rustls_error_inside_io_and_websocket_errors() {
        let io = std::io::Error::new(std::io::ErrorKind::InvalidData, Error::NoCertificatesPresented);
        assert_eq!(find_rustls(&io), Some(&Error::NoCertificatesPresented));
        assert_eq!(find_rustls(&std::io::Error::other("x")), None);
        assert_eq!(alert_name(&AlertDescription::AccessDenied), "access denied");
    }
}
