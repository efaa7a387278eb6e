//! The runtime's identity as lifecycle-manager's listener expects it behind an Istio
//! gateway: `X-Forwarded-Client-Cert` whose first `Cert="…"` element is the URL-encoded PEM
//! of a certificate with Subject CN = the runtime id.
//!
//! The relay mints such a certificate per cluster from a CA of its own (`--xfcc-ca-cert`,
//! `--xfcc-ca-key`; without them an ephemeral CA made at start), short-lived, and caches
//! the header value: bounded in entries and bytes, least recently used first out, renewed
//! when a third of its lifetime is left. The listener parses the certificate but does not
//! verify it (the gateway did, in runtime-watcher's setup), so the hop from the relay to
//! the listener must itself be trusted: mutual TLS to the target, or a network path only
//! the relay can reach.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use percent_encoding::{NON_ALPHANUMERIC, utf8_percent_encode};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair, KeyUsagePurpose,
    PKCS_ECDSA_P256_SHA256, SerialNumber,
};

/// The header name.
pub const XFCC_HEADER: &str = "X-Forwarded-Client-Cert";

/// Why an identity cannot be made.
#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    /// The CA files cannot be used.
    #[error("{path}: {what}")]
    Ca {
        /// The file.
        path: String,
        /// What is wrong.
        what: String,
    },
    /// Minting failed.
    #[error("cannot mint a certificate for cluster {cluster:?}: {what}")]
    Mint {
        /// The cluster.
        cluster: String,
        /// What failed.
        what: String,
    },
}

/// Bounds and lifetime of the minted certificates.
#[derive(Debug, Clone, Copy)]
pub struct IdentityOptions {
    /// Validity of a minted certificate.
    pub lifetime: Duration,
    /// Most cached clusters.
    pub max_entries: usize,
    /// Most bytes of cached header values.
    pub max_bytes: usize,
}

impl Default for IdentityOptions {
    fn default() -> Self {
        Self { lifetime: Duration::from_secs(3600), max_entries: 10_000, max_bytes: 32 << 20 }
    }
}

struct Entry {
    header: Arc<str>,
    renew_at: Instant,
    last_used: u64,
}

struct Cache {
    entries: HashMap<String, Entry>,
    bytes: usize,
    clock: u64,
}

/// Mints and caches a per-cluster certificate and its XFCC header value.
pub struct IdentityMinter {
    issuer: Issuer<'static, KeyPair>,
    /// One key for every minted certificate: the listener reads only the subject.
    leaf_key: KeyPair,
    opts: IdentityOptions,
    cache: Mutex<Cache>,
}

fn random_serial() -> SerialNumber {
    let mut bytes: [u8; 16] = rand::random();
    bytes[0] &= 0x7f;
    bytes[0] |= 0x01;
    SerialNumber::from_slice(&bytes)
}

impl IdentityMinter {
    /// A minter over the CA in PEM (`origin` names the files in errors).
    pub fn from_pem(cert_pem: &str, key_pem: &str, origin: &str, opts: IdentityOptions) -> Result<Self, IdentityError> {
        let key = KeyPair::from_pem(key_pem)
            .map_err(|e| IdentityError::Ca { path: origin.into(), what: format!("not a private key: {e}") })?;
        let issuer = Issuer::from_ca_cert_pem(cert_pem, key)
            .map_err(|e| IdentityError::Ca { path: origin.into(), what: format!("cannot use as issuer: {e}") })?;
        Self::with_issuer(issuer, opts)
    }

    /// A minter over the CA in these files.
    pub fn from_files(
        cert: &std::path::Path,
        key: &std::path::Path,
        opts: IdentityOptions,
    ) -> Result<Self, IdentityError> {
        let read = |p: &std::path::Path| {
            std::fs::read_to_string(p)
                .map_err(|e| IdentityError::Ca { path: p.display().to_string(), what: e.to_string() })
        };
        Self::from_pem(&read(cert)?, &read(key)?, &format!("{} / {}", cert.display(), key.display()), opts)
    }

    /// A minter over a CA made now, held only in memory.
    pub fn ephemeral(opts: IdentityOptions) -> Result<Self, IdentityError> {
        let err = |e: rcgen::Error| IdentityError::Ca { path: "(ephemeral CA)".into(), what: e.to_string() };
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).map_err(err)?;
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, "fleetwatch relay identity CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(5);
        params.not_after = now + time::Duration::days(3650);
        params.serial_number = Some(random_serial());
        params.self_signed(&key).map_err(err)?;
        Self::with_issuer(Issuer::new(params, key), opts)
    }

    fn with_issuer(issuer: Issuer<'static, KeyPair>, opts: IdentityOptions) -> Result<Self, IdentityError> {
        let leaf_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256)
            .map_err(|e| IdentityError::Ca { path: "(leaf key)".into(), what: e.to_string() })?;
        Ok(Self { issuer, leaf_key, opts, cache: Mutex::new(Cache { entries: HashMap::new(), bytes: 0, clock: 0 }) })
    }

    /// A fresh certificate (PEM) with Subject CN = `cluster`.
    pub fn mint(&self, cluster: &str) -> Result<String, IdentityError> {
        let err = |e: rcgen::Error| IdentityError::Mint { cluster: cluster.into(), what: e.to_string() };
        if cluster.is_empty() || cluster.len() > 253 {
            return Err(IdentityError::Mint { cluster: cluster.into(), what: "a runtime id of 1 to 253 bytes".into() });
        }
        let mut params = CertificateParams::default();
        params.distinguished_name = rcgen::DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, cluster);
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.serial_number = Some(random_serial());
        params.use_authority_key_identifier_extension = true;
        let lifetime = time::Duration::try_from(self.opts.lifetime)
            .map_err(|_| IdentityError::Mint { cluster: cluster.into(), what: "lifetime too long".into() })?;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::minutes(5);
        params.not_after = now + lifetime;
        Ok(params.signed_by(&self.leaf_key, &self.issuer).map_err(err)?.pem())
    }

    /// The `X-Forwarded-Client-Cert` value for `cluster`, from the cache or minted now.
    pub fn xfcc(&self, cluster: &str) -> Result<Arc<str>, IdentityError> {
        let now = Instant::now();
        if let Ok(mut c) = self.cache.lock() {
            c.clock += 1;
            let tick = c.clock;
            if let Some(e) = c.entries.get_mut(cluster)
                && e.renew_at > now
            {
                e.last_used = tick;
                return Ok(e.header.clone());
            }
        }
        let header: Arc<str> = xfcc_value(&self.mint(cluster)?, cluster).into();
        let renew_at = now + self.opts.lifetime * 2 / 3;
        if let Ok(mut c) = self.cache.lock() {
            let tick = c.clock;
            let size = header.len() + cluster.len();
            if let Some(old) = c.entries.remove(cluster) {
                c.bytes -= old.header.len() + cluster.len();
            }
            while !c.entries.is_empty()
                && (c.entries.len() >= self.opts.max_entries || c.bytes + size > self.opts.max_bytes)
            {
                let Some(oldest) = c.entries.iter().min_by_key(|(_, e)| e.last_used).map(|(k, _)| k.clone()) else {
                    break;
                };
                if let Some(e) = c.entries.remove(&oldest) {
                    c.bytes -= e.header.len() + oldest.len();
                }
            }
            if size <= self.opts.max_bytes && self.opts.max_entries > 0 {
                c.bytes += size;
                c.entries.insert(cluster.to_string(), Entry { header: header.clone(), renew_at, last_used: tick });
            }
        }
        Ok(header)
    }

    /// (entries, bytes) in the cache.
    pub fn cached(&self) -> (usize, usize) {
        self.cache.lock().map(|c| (c.entries.len(), c.bytes)).unwrap_or_default()
    }
}

/// The XFCC value Envoy would forward for a client with certificate `pem`:
/// `Hash=<sha256 of DER>;Cert="<URL-encoded PEM>";Subject="CN=<cluster>"`. Everything but
/// letters and digits is percent-encoded (Go's `url.QueryUnescape` would read `+` as a space).
pub fn xfcc_value(pem: &str, cluster: &str) -> String {
    use rustls_pki_types::pem::PemObject;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes());
    let hash = der.map(|d| crate::http::hex(ring::digest::digest(&ring::digest::SHA256, d.as_ref()).as_ref()));
    let cert = utf8_percent_encode(pem, NON_ALPHANUMERIC);
    let subject = cluster.replace(['"', '\\', ',', ';', '='], "_");
    match hash {
        Ok(h) => format!("Hash={h};Cert=\"{cert}\";Subject=\"CN={subject}\""),
        Err(_) => format!("Cert=\"{cert}\";Subject=\"CN={subject}\""),
    }
}

/// The first `Cert="…"` of an XFCC value, URL-decoded: what the listener does with it.
pub fn cert_from_xfcc(value: &str) -> Option<String> {
    let start = value.find("Cert=")? + "Cert=".len();
    let rest = &value[start..];
    let end = rest.find([';', ',']).unwrap_or(rest.len());
    let decoded = percent_encoding::percent_decode_str(&rest[..end]).decode_utf8().ok()?;
    Some(decoded.trim_matches('"').to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cn_of(pem: &str) -> String {
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = p.parse_x509().unwrap();
        cert.subject().iter_common_name().next().unwrap().as_str().unwrap().to_string()
    }

    #[test]
    fn the_header_carries_a_certificate_with_the_runtime_id_as_cn() {
        let m = IdentityMinter::ephemeral(IdentityOptions::default()).unwrap();
        let h = m.xfcc("runtime-7f3a").unwrap();
        assert!(h.starts_with("Hash=") && h.contains(";Cert=\"") && h.ends_with(";Subject=\"CN=runtime-7f3a\""), "{h}");
        // What runtime-watcher's listener does: first Cert=, cut at ';' or ',', unescape, trim quotes.
        let cert_part = h.split("Cert=").nth(1).unwrap();
        let cert_part = &cert_part[..cert_part.find([';', ',']).unwrap()];
        assert!(!cert_part.contains('+') && !cert_part.contains('/') && !cert_part.contains(' '), "{cert_part}");
        let pem = cert_from_xfcc(&h).unwrap();
        assert!(pem.starts_with("-----BEGIN CERTIFICATE-----"), "{pem}");
        assert_eq!(cn_of(&pem), "runtime-7f3a");
    }

    #[test]
    fn a_ca_from_files_signs_and_bad_ones_are_refused() {
        let key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
        let mut params = CertificateParams::default();
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.distinguished_name.push(DnType::CommonName, "test CA");
        let ca = params.self_signed(&key).unwrap();
        let m = IdentityMinter::from_pem(&ca.pem(), &key.serialize_pem(), "test", IdentityOptions::default()).unwrap();
        let pem = m.mint("c1").unwrap();
        let (_, p) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).unwrap();
        let cert = p.parse_x509().unwrap();
        assert_eq!(cert.issuer().iter_common_name().next().unwrap().as_str().unwrap(), "test CA");
        let left = cert.validity().time_to_expiration().unwrap();
        assert!(left.whole_seconds() <= 3600 && left.whole_seconds() > 3000, "{left:?}");
        let e =
            IdentityMinter::from_pem("junk", &key.serialize_pem(), "ca.crt", IdentityOptions::default()).err().unwrap();
        assert!(e.to_string().contains("ca.crt"), "{e}");
        assert!(m.mint("").is_err());
    }

    #[test]
    fn the_cache_is_bounded_in_entries_and_bytes_and_reuses_values() {
        let m = IdentityMinter::ephemeral(IdentityOptions { max_entries: 3, ..Default::default() }).unwrap();
        let a = m.xfcc("a").unwrap();
        assert!(Arc::ptr_eq(&a, &m.xfcc("a").unwrap()), "cached");
        // Headers differ in length (the URL-encoded PEM escapes '+', '/' and '='): bound by
        // the longest one minted.
        let mut longest = a.len() + 1;
        for c in ["b", "c", "d", "e"] {
            longest = longest.max(m.xfcc(c).unwrap().len() + c.len());
        }
        let (n, bytes) = m.cached();
        assert_eq!(n, 3);
        assert!(bytes <= 3 * longest, "{bytes} bytes held, longest entry {longest}");
        let one = a.len() + 1;
        let small =
            IdentityMinter::ephemeral(IdentityOptions { max_bytes: one * 2 + 10, ..Default::default() }).unwrap();
        for c in ["a", "b", "c", "d"] {
            small.xfcc(c).unwrap();
        }
        let (n, bytes) = small.cached();
        assert!(n <= 2 && bytes <= one * 2 + 10, "{n} {bytes}");
        // Least recently used goes first.
        let lru = IdentityMinter::ephemeral(IdentityOptions { max_entries: 2, ..Default::default() }).unwrap();
        let x = lru.xfcc("x").unwrap();
        lru.xfcc("y").unwrap();
        lru.xfcc("x").unwrap();
        lru.xfcc("z").unwrap();
        assert!(Arc::ptr_eq(&x, &lru.xfcc("x").unwrap()), "x was used last, y was evicted");
    }
}
