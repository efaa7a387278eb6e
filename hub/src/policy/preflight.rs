//! Start-up checks: what cannot work is refused before the hub listens, with one line that
//! names the file and what to do, instead of a hub that runs and fails every peer (an
//! expired certificate, a leaf certificate given as a CA) or waits forever (a kubeconfig
//! that cannot be read).
//!
//! The decisions are pure functions of what the files say and the time ([`validity`],
//! [`not_a_ca`]); [`check`] reads the files.

use std::path::{Path, PathBuf};

use fleetwatch_certs::CertInfo;
use jiff::Timestamp;

use crate::config::HubConfig;
use crate::error::HubError;
use crate::watch_source::WatchSource;

/// Why the hub's own certificate cannot be served at `now`, if it cannot.
pub(crate) fn validity(path: &Path, cert: &CertInfo, now: Timestamp) -> Result<(), String> {
    if cert.not_after <= now {
        return Err(format!(
            "hub certificate {} expired at {} (it is now {now}): issue a new one",
            path.display(),
            cert.not_after
        ));
    }
    if cert.not_before > now {
        return Err(format!(
            "hub certificate {} is not valid before {} (it is now {now}): is this machine's clock right?",
            path.display(),
            cert.not_before
        ));
    }
    Ok(())
}

/// The first certificate of a CA bundle that is not a CA certificate: a leaf given where
/// the CA that issued it belongs. As a trust anchor it would verify no client at all.
pub(crate) fn not_a_ca(flag: &str, path: &Path, bundle: &[CertInfo]) -> Result<(), String> {
    match bundle.iter().find(|c| !c.is_ca) {
        None => Ok(()),
        Some(leaf) => {
            let id = leaf.identity.as_ref().map(|i| format!(" ({i})")).unwrap_or_default();
            Err(format!(
                "{flag} {}: certificate {:?}{id} is not a CA certificate (a leaf certificate?): give the CA that \
                 issued the client certificates (ca.crt)",
                path.display(),
                leaf.subject
            ))
        }
    }
}

fn ca_bundles(flag: &str, paths: &[PathBuf]) -> Result<(), HubError> {
    for path in paths {
        let bundle = fleetwatch_certs::inspect_bundle(path)?;
        not_a_ca(flag, path, &bundle).map_err(HubError::Refused)?;
    }
    Ok(())
}

/// Runs every start-up check of `config`; the first failure is the error.
pub(crate) async fn check(config: &HubConfig) -> Result<(), HubError> {
    let own = fleetwatch_certs::inspect_file(&config.tls.cert)?;
    validity(&config.tls.cert, &own, Timestamp::now()).map_err(HubError::Refused)?;
    ca_bundles("--client-ca", &config.tls.ca)?;
    if let Some(ca) = &config.admin_auth.client_ca {
        ca_bundles("--admin-client-ca", std::slice::from_ref(ca))?;
    }
    // Reading and parsing the file needs no network: a control plane that is down is waited
    // for (readiness says so), a file that cannot be used never gets better by waiting.
    if let WatchSource::ControlPlane(Some(path)) = &config.watch_source {
        fleetwatch_client::kubeconfig::client_from_kubeconfig(path)
            .await
            .map_err(|e| HubError::Refused(format!("--control-plane-kubeconfig {e}")))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cert(not_before: &str, not_after: &str, is_ca: bool) -> CertInfo {
        CertInfo {
            identity: None,
            uris: vec![],
            dns: vec![],
            ips: vec![],
            serial: "01".into(),
            subject: "CN=x".into(),
            issuer: "CN=ca".into(),
            not_before: not_before.parse().unwrap(),
            not_after: not_after.parse().unwrap(),
            is_ca,
            extended_key_usage: None,
            issuer_der: vec![],
        }
    }

    #[test]
    fn a_certificate_outside_its_validity_is_refused_naming_the_file_and_the_time() {
        let now: Timestamp = "2030-06-01T00:00:00Z".parse().unwrap();
        let p = Path::new("/etc/hub.crt");
        assert_eq!(validity(p, &cert("2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z", false), now), Ok(()));
        let e = validity(p, &cert("2029-01-01T00:00:00Z", "2030-05-31T00:00:00Z", false), now).unwrap_err();
        assert!(e.contains("/etc/hub.crt expired at 2030-05-31T00:00:00Z"), "{e}");
        let e = validity(p, &cert("2030-07-01T00:00:00Z", "2031-01-01T00:00:00Z", false), now).unwrap_err();
        assert!(e.contains("/etc/hub.crt is not valid before 2030-07-01T00:00:00Z"), "{e}");
        // The last instant counts as expired, as rustls and the session check treat it.
        assert!(validity(p, &cert("2029-01-01T00:00:00Z", "2030-06-01T00:00:00Z", false), now).is_err());
    }

    #[test]
    fn a_leaf_in_a_ca_bundle_is_refused() {
        let p = Path::new("ca.crt");
        let ca = cert("2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z", true);
        let leaf = cert("2030-01-01T00:00:00Z", "2031-01-01T00:00:00Z", false);
        assert_eq!(not_a_ca("--client-ca", p, std::slice::from_ref(&ca)), Ok(()));
        let e = not_a_ca("--client-ca", p, &[ca, leaf]).unwrap_err();
        assert!(e.starts_with("--client-ca ca.crt: certificate \"CN=x\" is not a CA certificate"), "{e}");
    }
}
