//! Revocation: a deny list of certificate serials and identities, reloaded from disk when
//! it changes. A denied peer is refused at connect, and a live session whose certificate is
//! denied later is closed within one reload interval.
//!
//! The file has one entry per line: a certificate serial in hex (colons allowed, as
//! `openssl x509 -serial` or `fleetwatch certs inspect` print it) or a SPIFFE id; `#`
//! starts a comment.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::SystemTime;

/// Parsed deny list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DenyList {
    serials: HashSet<String>,
    identities: HashSet<String>,
}

/// A line that is neither a serial nor a SPIFFE id.
#[derive(Debug, thiserror::Error)]
#[error("{path}:{line}: {why}")]
pub struct DenyListError {
    path: String,
    line: usize,
    why: String,
}

impl DenyList {
    /// Parses the text of a deny-list file (`path` for messages).
    pub fn parse(text: &str, path: &Path) -> Result<Self, DenyListError> {
        let mut list = DenyList::default();
        for (i, raw) in text.lines().enumerate() {
            let entry = raw.split('#').next().unwrap_or_default().trim();
            if entry.is_empty() {
                continue;
            }
            if entry.starts_with("spiffe://") {
                entry.parse::<fleetwatch_shared::Identity>().map_err(|e| DenyListError {
                    path: path.display().to_string(),
                    line: i + 1,
                    why: e.to_string(),
                })?;
                list.identities.insert(entry.to_string());
            } else {
                let serial = entry.replace(':', "").to_lowercase();
                if serial.is_empty() || !serial.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(DenyListError {
                        path: path.display().to_string(),
                        line: i + 1,
                        why: format!("{entry:?} is neither a hex certificate serial nor a spiffe:// id"),
                    });
                }
                list.serials.insert(serial.trim_start_matches('0').to_string());
            }
        }
        Ok(list)
    }

    /// Whether a certificate with this identity and serial is denied.
    pub fn denies(&self, identity: &str, serial: &str) -> bool {
        self.identities.contains(identity) || self.serials.contains(serial.to_lowercase().trim_start_matches('0'))
    }

    /// Entries in the list.
    pub fn len(&self) -> usize {
        self.serials.len() + self.identities.len()
    }

    /// Whether the list is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The deny list in force, following its file.
pub struct Revocation {
    path: Option<PathBuf>,
    state: RwLock<(Option<SystemTime>, Arc<DenyList>)>,
}

impl Revocation {
    /// Loads the file (none: nothing is denied). A broken file is a start-up error.
    pub fn load(path: Option<PathBuf>) -> Result<Self, DenyListError> {
        let (stamp, list) = match &path {
            Some(p) => (stamp(p), read(p)?),
            None => (None, DenyList::default()),
        };
        Ok(Self { path, state: RwLock::new((stamp, Arc::new(list))) })
    }

    /// The list in force.
    pub fn current(&self) -> Arc<DenyList> {
        self.state.read().map(|s| s.1.clone()).unwrap_or_default()
    }

    /// Re-reads the file when it changed; `Ok(true)` when the list was replaced. On error the
    /// old list stays in force.
    pub fn reload_if_changed(&self) -> Result<bool, DenyListError> {
        let Some(path) = &self.path else { return Ok(false) };
        let now = stamp(path);
        if self.state.read().map(|s| s.0 == now).unwrap_or(false) {
            return Ok(false);
        }
        let list = read(path)?;
        if let Ok(mut s) = self.state.write() {
            *s = (now, Arc::new(list));
        }
        Ok(true)
    }
}

fn stamp(path: &Path) -> Option<SystemTime> {
    std::fs::metadata(path).and_then(|m| m.modified()).ok()
}

fn read(path: &Path) -> Result<DenyList, DenyListError> {
    // A missing file denies nothing: deny lists are often created only when needed.
    let text = std::fs::read_to_string(path).unwrap_or_default();
    DenyList::parse(&text, path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_serials_and_identities() {
        let l = DenyList::parse("# revoked\n01:FA:cf\nspiffe://td/cluster/eu-1  # stolen laptop\n\n", Path::new("d"))
            .unwrap();
        assert_eq!(l.len(), 2);
        assert!(l.denies("spiffe://td/subscriber/x", "01facf"));
        assert!(l.denies("spiffe://td/subscriber/x", "1FACF"));
        assert!(l.denies("spiffe://td/cluster/eu-1", "ff"));
        assert!(!l.denies("spiffe://td/cluster/eu-2", "ff"));
        assert!(DenyList::parse("not-hex!", Path::new("d")).is_err());
        assert!(DenyList::parse("spiffe://TD/x", Path::new("d")).is_err());
    }
}
