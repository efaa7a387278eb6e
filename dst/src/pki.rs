//! Certificates for the simulation: a CA, the hub's server certificate (for the host name
//! `hub`), one agent certificate per cluster and the subscribers' certificates.
//!
//! Real TLS runs over the simulated network, so the certificates are real too. Issuing them
//! (key generation) costs far more than a simulated second, so they are made once and kept
//! in one directory shared by every simulation process (created under a temporary name and
//! renamed into place, so concurrent test processes never see a half-written set), and made
//! again only when they near their expiry.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

use anyhow::Context as _;
use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};

/// Clusters that have an agent certificate (`c1` … `c{MAX_CLUSTERS}`).
pub const MAX_CLUSTERS: usize = 4;
/// The hub's host name in the simulated network (and its certificate's DNS name).
pub const HUB_HOST: &str = "hub";
/// The trust domain of every identity in the simulation.
pub const TRUST_DOMAIN: &str = "dst.fleetwatch.local";
/// Subscriber names with a certificate.
pub const SUBSCRIBERS: [&str; 2] = ["durable", "live"];
/// Bump when the set of files changes.
const LAYOUT: &str = "fleetwatch-dst-pki-1";
/// Days the certificates are valid.
const DAYS: u32 = 365;

/// The simulation's certificate directory.
#[derive(Debug)]
pub struct Pki {
    dir: PathBuf,
}

impl Pki {
    /// The certificates, made on first use in this process (or found from an earlier one).
    pub fn get() -> anyhow::Result<&'static Pki> {
        static PKI: OnceLock<Result<Pki, String>> = OnceLock::new();
        PKI.get_or_init(|| create().map(|dir| Pki { dir }).map_err(|e| format!("{e:#}")))
            .as_ref()
            .map_err(|e| anyhow::anyhow!("simulation certificates: {e}"))
    }

    /// The files of `stem` (`hub`, `agent-c1`, `subscriber-durable`).
    pub fn files(&self, stem: &str) -> TlsFiles {
        TlsFiles {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
            ca: vec![self.dir.join("ca.crt")],
        }
    }

    /// The agent certificate files of cluster `c`.
    pub fn agent(&self, cluster: &str) -> TlsFiles {
        self.files(&format!("agent-{cluster}"))
    }

    /// The subscriber certificate files of `name`.
    pub fn subscriber(&self, name: &str) -> TlsFiles {
        self.files(&format!("subscriber-{name}"))
    }
}

/// The cluster id of cluster number `i` (from 0).
pub fn cluster_id(i: usize) -> String {
    format!("c{}", i + 1)
}

fn create() -> anyhow::Result<PathBuf> {
    let base = std::env::temp_dir();
    let dir = base.join(LAYOUT);
    if usable(&dir) {
        return Ok(dir);
    }
    let tmp = base.join(format!("{LAYOUT}.{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    issue_all(&tmp).with_context(|| format!("issuing certificates in {}", tmp.display()))?;
    if dir.exists() && !usable(&dir) {
        // Expired (or damaged): every process sees that alike, so replacing it is safe.
        let _ = std::fs::remove_dir_all(&dir);
    }
    if std::fs::rename(&tmp, &dir).is_err() {
        // Another process won the race: use its set.
        let _ = std::fs::remove_dir_all(&tmp);
    }
    anyhow::ensure!(usable(&dir), "certificates in {} are not usable", dir.display());
    Ok(dir)
}

fn issue_all(dir: &Path) -> anyhow::Result<()> {
    Authority::init(dir, TRUST_DOMAIN)?;
    let ca = Authority::load(dir)?;
    ca.issue(dir, &LeafSpec::Hub { dns: vec![HUB_HOST.into()], ips: Vec::new() }, DAYS)?;
    for i in 0..MAX_CLUSTERS {
        ca.issue(dir, &LeafSpec::Agent { cluster: cluster_id(i) }, DAYS)?;
    }
    for name in SUBSCRIBERS {
        ca.issue(dir, &LeafSpec::Subscriber { name: name.into() }, DAYS)?;
    }
    Ok(())
}

/// Whether every file is there and the hub certificate is good for a week more.
fn usable(dir: &Path) -> bool {
    let week_ahead = jiff_now_plus_week();
    let stems = ["hub".to_string()]
        .into_iter()
        .chain((0..MAX_CLUSTERS).map(|i| format!("agent-{}", cluster_id(i))))
        .chain(SUBSCRIBERS.iter().map(|n| format!("subscriber-{n}")));
    for stem in stems {
        match fleetwatch_certs::inspect_file(&dir.join(format!("{stem}.crt"))) {
            Ok(info) if info.not_after > week_ahead && dir.join(format!("{stem}.key")).exists() => {}
            _ => return false,
        }
    }
    dir.join("ca.crt").exists()
}

fn jiff_now_plus_week() -> jiff::Timestamp {
    jiff::Timestamp::now() + std::time::Duration::from_secs(7 * 24 * 3600)
}
