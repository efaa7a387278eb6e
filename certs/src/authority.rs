//! The certificate authority: `ca.crt` / `ca.key` in a directory, and the leaves it issues.

use std::net::IpAddr;
use std::path::{Path, PathBuf};

use fleetwatch_protocol::identity::{Identity, Role};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SanType, SerialNumber,
};

use crate::error::{CertError, io_err};
use crate::inspect::inspect_pem;

/// A loaded CA that can issue certificates.
pub struct Authority {
    issuer: Issuer<'static, KeyPair>,
    trust_domain: String,
}

/// What to issue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeafSpec {
    /// The hub's server certificate, valid for these DNS names and IP addresses.
    Hub {
        /// DNS names.
        dns: Vec<String>,
        /// IP addresses.
        ips: Vec<IpAddr>,
    },
    /// An agent's client certificate for one cluster.
    Agent {
        /// Cluster id.
        cluster: String,
    },
    /// A subscriber's client certificate.
    Subscriber {
        /// Subscriber name.
        name: String,
    },
}

impl LeafSpec {
    /// The file stem: `hub`, `agent-<id>`, `subscriber-<name>`.
    pub fn file_stem(&self) -> String {
        match self {
            LeafSpec::Hub { .. } => "hub".into(),
            LeafSpec::Agent { cluster } => format!("agent-{cluster}"),
            LeafSpec::Subscriber { name } => format!("subscriber-{name}"),
        }
    }
}

/// Paths of an issued certificate and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IssuedFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// The private key (PEM, mode 0600).
    pub key: PathBuf,
    /// The identity in the certificate.
    pub identity: Identity,
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f; // positive
    bytes[0] |= 0x01; // no leading zero byte
    SerialNumber::from_slice(&bytes)
}

fn validity(params: &mut CertificateParams, days: u32) -> Result<(), CertError> {
    if days == 0 {
        return Err(CertError::Invalid("--days must be at least 1".into()));
    }
    valid_for(params, std::time::Duration::from_secs(u64::from(days) * 86_400))
}

fn valid_for(params: &mut CertificateParams, lifetime: std::time::Duration) -> Result<(), CertError> {
    let lifetime = time::Duration::try_from(lifetime)
        .map_err(|_| CertError::Invalid("certificate lifetime is too long".into()))?;
    let now = time::OffsetDateTime::now_utc();
    // Five minutes back: clocks of the machines involved are rarely in step.
    params.not_before = now - time::Duration::minutes(5);
    params.not_after = now + lifetime;
    Ok(())
}

fn write_private(path: &Path, contents: &str) -> Result<(), CertError> {
    use std::io::Write;
    #[cfg(unix)]
    use std::os::unix::fs::OpenOptionsExt;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create(true).truncate(true);
    #[cfg(unix)]
    opts.mode(0o600);
    let mut f = opts.open(path).map_err(io_err(path))?;
    f.write_all(contents.as_bytes()).map_err(io_err(path))
}

impl Authority {
    /// Creates a new CA (ECDSA P-256, 10 years) in `dir` for `trust_domain`: `ca.crt`, `ca.key`.
    pub fn init(dir: &Path, trust_domain: &str) -> Result<IssuedFiles, CertError> {
        let identity = Identity::trust_domain(trust_domain)?;
        std::fs::create_dir_all(dir).map_err(io_err(dir))?;
        let cert_path = dir.join("ca.crt");
        if cert_path.exists() {
            return Err(CertError::AlreadyInitialised(dir.to_path_buf()));
        }
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, format!("fleetwatch CA {trust_domain}"));
        params.distinguished_name.push(DnType::OrganizationName, "fleetwatch");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages =
            vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
        params.subject_alt_names = vec![SanType::URI(identity.to_string().try_into()?)];
        params.serial_number = Some(random_serial());
        validity(&mut params, 3650)?;
        let cert = params.self_signed(&key)?;
        let key_path = dir.join("ca.key");
        write_private(&key_path, &key.serialize_pem())?;
        std::fs::write(&cert_path, cert.pem()).map_err(io_err(&cert_path))?;
        Ok(IssuedFiles { cert: cert_path, key: key_path, identity })
    }

    /// Loads the CA from `dir`.
    pub fn load(dir: &Path) -> Result<Self, CertError> {
        let cert_path = dir.join("ca.crt");
        let key_path = dir.join("ca.key");
        let cert_pem = std::fs::read_to_string(&cert_path).map_err(io_err(&cert_path))?;
        let key_pem = std::fs::read_to_string(&key_path).map_err(io_err(&key_path))?;
        Self::from_pem_named(&cert_pem, &key_pem, cert_path, key_path)
    }

    /// A CA from its certificate and key in PEM (e.g. the data of a Kubernetes Secret);
    /// `origin` names where they come from in errors (`namespace/secret`).
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &str) -> Result<Self, CertError> {
        Self::from_pem_named(
            cert_pem,
            key_pem,
            PathBuf::from(format!("{origin}: ca.crt")),
            PathBuf::from(format!("{origin}: ca.key")),
        )
    }

    fn from_pem_named(cert_pem: &str, key_pem: &str, cert_path: PathBuf, key_path: PathBuf) -> Result<Self, CertError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| CertError::Pem { path: key_path.clone(), what: format!("not a private key: {e}") })?;
        let info = inspect_pem(cert_pem, &cert_path)?;
        let trust_domain = match info.identity {
            Some(Identity { trust_domain, role: Role::TrustDomain }) => trust_domain,
            _ => {
                return Err(CertError::Pem {
                    path: cert_path,
                    what: "not a fleetwatch CA (no spiffe://<trust-domain> URI SAN)".into(),
                });
            }
        };
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| CertError::Pem { path: cert_path.clone(), what: format!("cannot use as issuer: {e}") })?;
        Ok(Self { issuer, trust_domain })
    }

    /// The CA's trust domain.
    pub fn trust_domain(&self) -> &str {
        &self.trust_domain
    }

    /// Issues a certificate and writes `<stem>.crt` / `<stem>.key` into `dir`.
    pub fn issue(&self, dir: &Path, spec: &LeafSpec, days: u32) -> Result<IssuedFiles, CertError> {
        let pem = self.issue_pem(spec, days)?;
        write_issued(dir, spec, pem)
    }

    /// Issues a certificate valid until `not_after` and writes it like [`Authority::issue`].
    /// For tests of expiry: `not_after` may be minutes away or already past (then the
    /// certificate's validity is the hour before it, so it is expired but well-formed).
    pub fn issue_until(
        &self,
        dir: &Path,
        spec: &LeafSpec,
        not_after: jiff::Timestamp,
    ) -> Result<IssuedFiles, CertError> {
        let pem = self.issue_pem_window(spec, window_until(jiff::Timestamp::now(), not_after)?)?;
        write_issued(dir, spec, pem)
    }
}

/// The validity (not before, not after) of a certificate that ends at `not_after`: from five
/// minutes before `now` (clock skew), or from an hour before `not_after` when that is earlier.
fn window_until(
    now: jiff::Timestamp,
    not_after: jiff::Timestamp,
) -> Result<(time::OffsetDateTime, time::OffsetDateTime), CertError> {
    let skewed = now - jiff::SignedDuration::from_mins(5);
    let hour_before = not_after - jiff::SignedDuration::from_hours(1);
    let not_before = if hour_before < skewed { hour_before } else { skewed };
    let conv = |t: jiff::Timestamp| {
        time::OffsetDateTime::from_unix_timestamp(t.as_second())
            .map_err(|_| CertError::Invalid(format!("certificate time {t} is out of range")))
    };
    Ok((conv(not_before)?, conv(not_after)?))
}

fn write_issued(dir: &Path, spec: &LeafSpec, pem: (String, String, Identity)) -> Result<IssuedFiles, CertError> {
    let (cert_pem, key_pem, identity) = pem;
    std::fs::create_dir_all(dir).map_err(io_err(dir))?;
    let stem = spec.file_stem();
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    write_private(&key, &key_pem)?;
    std::fs::write(&cert, cert_pem).map_err(io_err(&cert))?;
    Ok(IssuedFiles { cert, key, identity })
}

impl Authority {
    /// Issues a certificate in memory: (certificate PEM, key PEM, identity).
    pub fn issue_pem(&self, spec: &LeafSpec, days: u32) -> Result<(String, String, Identity), CertError> {
        if days == 0 {
            return Err(CertError::Invalid("--days must be at least 1".into()));
        }
        self.issue_pem_for(spec, std::time::Duration::from_secs(u64::from(days) * 86_400))
    }

    /// Issues a certificate valid from now for `lifetime` (short-lived certificates, tests of
    /// expiry): (certificate PEM, key PEM, identity).
    pub fn issue_pem_for(
        &self,
        spec: &LeafSpec,
        lifetime: std::time::Duration,
    ) -> Result<(String, String, Identity), CertError> {
        let mut params = CertificateParams::default();
        valid_for(&mut params, lifetime)?;
        self.issue_pem_window(spec, (params.not_before, params.not_after))
    }

    /// Issues a certificate valid from `window.0` to `window.1`.
    fn issue_pem_window(
        &self,
        spec: &LeafSpec,
        window: (time::OffsetDateTime, time::OffsetDateTime),
    ) -> Result<(String, String, Identity), CertError> {
        let td = &self.trust_domain;
        let (identity, mut sans, eku, cn) = match spec {
            LeafSpec::Hub { dns, ips } => {
                if dns.is_empty() && ips.is_empty() {
                    return Err(CertError::Invalid("a hub certificate needs at least one --dns or --ip".into()));
                }
                let mut sans = Vec::new();
                for d in dns {
                    sans.push(SanType::DnsName(
                        d.clone().try_into().map_err(|_| CertError::Invalid(format!("bad DNS name {d:?}")))?,
                    ));
                }
                sans.extend(ips.iter().map(|ip| SanType::IpAddress(*ip)));
                (Identity::hub(td)?, sans, ExtendedKeyUsagePurpose::ServerAuth, "fleetwatch hub".to_string())
            }
            LeafSpec::Agent { cluster } => (
                Identity::cluster(td, cluster)?,
                Vec::new(),
                ExtendedKeyUsagePurpose::ClientAuth,
                format!("fleetwatch agent {cluster}"),
            ),
            LeafSpec::Subscriber { name } => (
                Identity::subscriber(td, name)?,
                Vec::new(),
                ExtendedKeyUsagePurpose::ClientAuth,
                format!("fleetwatch subscriber {name}"),
            ),
        };
        sans.insert(0, SanType::URI(identity.to_string().try_into()?));
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cn);
        params.subject_alt_names = sans;
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![eku];
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        (params.not_before, params.not_after) = window;
        let cert = params.signed_by(&key, &self.issuer)?;
        Ok((cert.pem(), key.serialize_pem(), identity))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn certificates_can_end_soon_or_in_the_past() {
        let dir = tempfile::tempdir().unwrap();
        Authority::init(dir.path(), "example.org").unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        let now = jiff::Timestamp::now();
        let spec = LeafSpec::Agent { cluster: "eu-1".into() };
        let soon = ca.issue_until(dir.path(), &spec, now + jiff::SignedDuration::from_secs(90)).unwrap();
        let info = crate::inspect_file(&soon.cert).unwrap();
        assert_eq!(info.not_after.as_second(), (now + jiff::SignedDuration::from_secs(90)).as_second());
        assert!(info.not_before < now && info.validity_at(now).starts_with("valid, "), "{info}");
        let past: jiff::Timestamp = "2020-01-01T00:00:00Z".parse().unwrap();
        let old = ca.issue_until(dir.path(), &spec, past).unwrap();
        let info = crate::inspect_file(&old.cert).unwrap();
        assert_eq!(
            (info.not_before.to_string(), info.not_after.to_string()),
            ("2019-12-31T23:00:00Z".into(), past.to_string())
        );
        assert!(info.validity_at(now).starts_with("EXPIRED "), "{}", info.validity_at(now));
        assert!(info.validity_at("2019-01-01T00:00:00Z".parse().unwrap()).starts_with("NOT YET VALID"));
    }

    #[test]
    fn init_issue_and_inspect() {
        let dir = tempfile::tempdir().unwrap();
        let ca = Authority::init(dir.path(), "example.org").unwrap();
        assert_eq!(ca.identity.to_string(), "spiffe://example.org");
        assert!(matches!(Authority::init(dir.path(), "example.org"), Err(CertError::AlreadyInitialised(_))));
        let auth = Authority::load(dir.path()).unwrap();
        assert_eq!(auth.trust_domain(), "example.org");
        let files = auth.issue(dir.path(), &LeafSpec::Agent { cluster: "eu-1".into() }, 30).unwrap();
        assert!(files.cert.ends_with("agent-eu-1.crt"));
        let info = crate::inspect_file(&files.cert).unwrap();
        assert_eq!(info.identity.unwrap().to_string(), "spiffe://example.org/cluster/eu-1");
        let days = (info.not_after.as_second() - info.not_before.as_second()) / 86_400;
        assert!((29..=31).contains(&days), "validity {days} days");
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&files.key).unwrap().permissions().mode();
            assert_eq!(mode & 0o077, 0, "key must not be readable by others");
        }
    }

    #[test]
    fn refuses_bad_input() {
        let dir = tempfile::tempdir().unwrap();
        assert!(Authority::init(dir.path(), "Bad Domain").is_err());
        Authority::init(dir.path(), "td").unwrap();
        let auth = Authority::load(dir.path()).unwrap();
        assert!(auth.issue(dir.path(), &LeafSpec::Agent { cluster: "a/b".into() }, 1).is_err());
        assert!(auth.issue(dir.path(), &LeafSpec::Hub { dns: vec![], ips: vec![] }, 1).is_err());
        assert!(auth.issue(dir.path(), &LeafSpec::Subscriber { name: "x".into() }, 0).is_err());
    }
}
