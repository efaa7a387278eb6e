//! The TLS settings a client connects with: fixed for its life, or following its
//! certificate, key and CA files by content (`fleetwatch_certs::ReloadingClientConfig`, the
//! agent's mechanism), so a renewed certificate is used without a restart.
//!
//! A subscriber that runs longer than its certificate's life (cert-manager's 90 days) would
//! otherwise reconnect after any cut with an expired certificate and be refused for good.

use std::sync::Arc;

use fleetwatch_certs::{CertError, CertInfo, ClientReload, ReloadingClientConfig, TlsFiles};
use rustls::ClientConfig;

/// How long before its expiry a certificate that has not been renewed is warned about.
pub const WARN_BEFORE_EXPIRY: jiff::SignedDuration = jiff::SignedDuration::from_hours(7 * 24);

/// How often the same certificate is warned about again while it nears its expiry.
pub const WARN_AGAIN_AFTER: jiff::SignedDuration = jiff::SignedDuration::from_hours(24);

/// The client's TLS configuration.
#[derive(Clone)]
pub enum ClientTls {
    /// One configuration for the client's life (tests, benchmarks, the simulation).
    Fixed(Arc<ClientConfig>),
    /// Follows its files: re-read by content before every connection and while connected.
    Files(Arc<ReloadingClientConfig>),
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ClientTls::Fixed(_) => f.write_str("ClientTls::Fixed"),
            ClientTls::Files(r) => write!(f, "ClientTls::Files({})", r.certificate().serial),
        }
    }
}

impl From<Arc<ClientConfig>> for ClientTls {
    fn from(config: Arc<ClientConfig>) -> Self {
        ClientTls::Fixed(config)
    }
}

impl From<Arc<ReloadingClientConfig>> for ClientTls {
    fn from(config: Arc<ReloadingClientConfig>) -> Self {
        ClientTls::Files(config)
    }
}

/// What [`ClientTls::reload`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reloaded {
    /// Nothing to act on (unchanged, fixed, only the CA bundles, or unusable files).
    Nothing,
    /// The client's own certificate was renewed: a session should be reopened with it.
    Certificate {
        /// The new certificate's serial.
        serial: String,
    },
}

impl ClientTls {
    /// Loads `files` and follows them; fails when they are unusable now.
    pub fn from_files(files: TlsFiles) -> Result<Self, CertError> {
        Ok(ClientTls::Files(Arc::new(ReloadingClientConfig::new(files)?)))
    }

    /// The configuration for the next connection.
    pub fn current(&self) -> Arc<ClientConfig> {
        match self {
            ClientTls::Fixed(c) => c.clone(),
            ClientTls::Files(r) => r.current(),
        }
    }

    /// Whether it follows files (and so is worth checking).
    pub fn follows_files(&self) -> bool {
        matches!(self, ClientTls::Files(_))
    }

    /// What the certificate in force says (unknown for a fixed configuration).
    pub fn certificate(&self) -> Option<CertInfo> {
        match self {
            ClientTls::Fixed(_) => None,
            ClientTls::Files(r) => Some(r.certificate()),
        }
    }

    /// Reads the files again and logs what changed. Files that cannot be used (a
    /// half-written pair during a rotation) keep the configuration in force: one WARN per
    /// content, retried at the next call.
    pub fn reload(&self) -> Reloaded {
        let ClientTls::Files(r) = self else { return Reloaded::Nothing };
        match r.reload_if_changed() {
            Ok(ClientReload::Unchanged) => Reloaded::Nothing,
            Ok(ClientReload::Bundles) => {
                tracing::info!("reloaded the CA bundle; the next connection uses it");
                Reloaded::Nothing
            }
            Ok(ClientReload::Certificate { serial, not_after }) => {
                tracing::info!(%serial, %not_after, "client certificate renewed on disk");
                Reloaded::Certificate { serial }
            }
            Err(e) => {
                let serial = r.certificate().serial;
                tracing::warn!(error = %e, in_force = %serial, "certificate files changed but cannot be used; keeping the certificate in force and retrying");
                Reloaded::Nothing
            }
        }
    }
}

/// Says when a certificate that has not been renewed nears its expiry: once per
/// certificate, then again once a day, from [`WARN_BEFORE_EXPIRY`] before it.
#[derive(Debug, Default)]
pub struct ExpiryWarning {
    /// The serial warned about last, and when.
    said: Option<(String, jiff::Timestamp)>,
}

impl ExpiryWarning {
    /// Whether to warn now about the certificate `serial` that expires at `not_after`.
    pub fn due(&mut self, serial: &str, not_after: jiff::Timestamp, now: jiff::Timestamp) -> bool {
        if not_after.duration_since(now) > WARN_BEFORE_EXPIRY {
            return false;
        }
        let again = match &self.said {
            Some((s, at)) if s == serial => now.duration_since(*at) >= WARN_AGAIN_AFTER,
            _ => true,
        };
        if again {
            self.said = Some((serial.to_string(), now));
        }
        again
    }

    /// Logs the warning for `tls`'s certificate when it is due.
    pub fn check(&mut self, tls: &ClientTls, who: &str) {
        let Some(info) = tls.certificate() else { return };
        let now = jiff::Timestamp::now();
        if !self.due(&info.serial, info.not_after, now) {
            return;
        }
        let identity = info.identity.as_ref().map(|i| i.to_string()).unwrap_or_default();
        let (serial, not_after) = (info.serial.as_str(), info.not_after);
        if info.not_after <= now {
            tracing::error!(%serial, %not_after, %identity, "the {who} certificate has expired and has not been renewed: the hub refuses it; renew the certificate files (they are followed, no restart needed)");
        } else {
            let left = format!("{:.1} days", not_after.duration_since(now).as_secs_f64() / 86_400.0);
            tracing::warn!(%serial, %not_after, %identity, %left, "the {who} certificate expires soon and has not been renewed: renew the certificate files (they are followed, no restart needed)");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_written_pair_keeps_the_certificate_in_force_until_the_pair_matches() {
        use fleetwatch_certs::{Authority, LeafSpec};
        fleetwatch_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        Authority::init(dir.path(), "td").unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        let spec = LeafSpec::Subscriber { name: "s".into() };
        let issued = ca.issue(dir.path(), &spec, 1).unwrap();
        let files = TlsFiles { cert: issued.cert, key: issued.key, ca: vec![dir.path().join("ca.crt")] };
        let tls = ClientTls::from_files(files.clone()).unwrap();
        let first = tls.certificate().unwrap().serial;
        let config = tls.current();
        assert_eq!(tls.reload(), Reloaded::Nothing);

        let (cert, key, _) = ca.issue_pem(&spec, 1).unwrap();
        std::fs::write(&files.cert, &cert).unwrap();
        // New certificate, old key: refused, the last good configuration stays in force.
        assert_eq!(tls.reload(), Reloaded::Nothing);
        assert_eq!(tls.certificate().unwrap().serial, first);
        assert!(Arc::ptr_eq(&tls.current(), &config), "the configuration in force is kept");
        // Half of a key: still refused.
        std::fs::write(&files.key, &key[..key.len() / 2]).unwrap();
        assert_eq!(tls.reload(), Reloaded::Nothing);
        assert_eq!(tls.certificate().unwrap().serial, first);
        // The pair matches: the renewed certificate is in force and said so once.
        std::fs::write(&files.key, &key).unwrap();
        let Reloaded::Certificate { serial } = tls.reload() else { panic!("the renewal was not noticed") };
        assert_ne!(serial, first);
        assert_eq!(tls.certificate().unwrap().serial, serial);
        assert!(!Arc::ptr_eq(&tls.current(), &config));
        assert_eq!(tls.reload(), Reloaded::Nothing);
        // A fixed configuration has nothing to follow.
        let fixed = ClientTls::from(config);
        assert_eq!(fixed.reload(), Reloaded::Nothing);
        assert!(fixed.certificate().is_none() && !fixed.follows_files());
    }

    #[test]
    fn expiry_is_warned_once_per_certificate_and_day() {
        let now: jiff::Timestamp = "2026-01-10T00:00:00Z".parse().unwrap();
        let far = now + jiff::SignedDuration::from_hours(30 * 24);
        let near = now + jiff::SignedDuration::from_hours(3 * 24);
        let mut w = ExpiryWarning::default();
        assert!(!w.due("01", far, now), "30 days left: nothing to say");
        assert!(w.due("01", near, now));
        assert!(!w.due("01", near, now + jiff::SignedDuration::from_hours(23)), "once a day");
        assert!(w.due("01", near, now + jiff::SignedDuration::from_hours(24)));
        // Another certificate (renewed, but also near its end) is said at once.
        assert!(w.due("02", near, now + jiff::SignedDuration::from_hours(25)));
        // Expired: still said, once a day.
        let later = near + jiff::SignedDuration::from_hours(1);
        assert!(w.due("02", near, later));
        assert!(!w.due("02", near, later + jiff::SignedDuration::from_hours(1)));
    }
}
