//! Revocation: a deny list of certificate serials and identities, reloaded from disk when
//! it changes. A denied peer is refused at connect, and a live session whose certificate is
//! denied later is closed within one reload interval.
//!
//! The file is re-read when its content changes (compared in full, not by mtime: a
//! revocation written with the old mtime, as `cp -p` or a config-management tool may, is
//! still noticed).
//!
//! It fails closed: a deny list that disappears or cannot be read keeps the last good list
//! in force (and the hub reports it stale) rather than un-revoking everyone.
//!
//! The file has one entry per line: a certificate serial in hex (colons allowed, and the
//! `serial=` prefix `openssl x509 -noout -serial` prints, as `fleetwatch certs inspect`
//! or openssl print it) or a SPIFFE id; `#` starts a comment.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleetwatch_certs::{Compare, Contents, Reload as FileReload, ReloadingFile};

/// Parsed deny list.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct DenyList {
    serials: HashSet<String>,
    identities: HashSet<String>,
}

/// Why the deny list cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum DenyListError {
    /// The file cannot be read (missing, a directory, no permission).
    #[error("deny list {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// A line that is neither a serial nor a SPIFFE id.
    #[error("deny list {path}:{line}: {why}")]
    Parse {
        /// The file.
        path: String,
        /// The line number, from 1.
        line: usize,
        /// What is wrong with it.
        why: String,
    },
}

impl DenyList {
    /// Parses the text of a deny-list file (`path` for messages).
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Self, DenyListError> {
        let mut list = DenyList::default();
        for (i, raw) in text.lines().enumerate() {
            let entry = raw.split('#').next().unwrap_or_default().trim();
            if entry.is_empty() {
                continue;
            }
            if entry.starts_with("spiffe://") {
                entry.parse::<fleetwatch_protocol::Identity>().map_err(|e| DenyListError::Parse {
                    path: path.display().to_string(),
                    line: i + 1,
                    why: e.to_string(),
                })?;
                list.identities.insert(entry.to_string());
            } else {
                // `serial=01AB…` as `openssl x509 -noout -serial` prints it.
                let bare = match entry.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("serial") => v.trim(),
                    _ => entry,
                };
                let serial = bare.replace(':', "").to_lowercase();
                if serial.is_empty() || !serial.bytes().all(|b| b.is_ascii_hexdigit()) {
                    return Err(DenyListError::Parse {
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
    pub(crate) fn denies(&self, identity: &str, serial: &str) -> bool {
        self.identities.contains(identity) || self.serials.contains(serial.to_lowercase().trim_start_matches('0'))
    }

    /// Entries in the list.
    pub(crate) fn len(&self) -> usize {
        self.serials.len() + self.identities.len()
    }

    /// Whether the list is empty.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The deny list in force, following its file by content (see [`ReloadingFile`]).
pub(crate) struct Revocation {
    list: ReloadingFile<DenyList>,
}

/// What a reload check found.
#[derive(Debug)]
pub(crate) enum Reload {
    /// Nothing changed (or it is still broken in the same way, already reported).
    Unchanged,
    /// A new list is in force.
    Replaced,
    /// The file is broken now: the previous list stays in force. Reported once per change.
    Failed(DenyListError),
}

impl Revocation {
    /// Loads the file (none: nothing is denied). A missing, unreadable or broken file is a
    /// start-up error: starting with an empty list would un-revoke everyone. An empty file
    /// is fine.
    pub(crate) fn load(path: Option<PathBuf>) -> Result<Self, DenyListError> {
        let list = match path {
            Some(p) => ReloadingFile::load(vec![p.clone()], Compare::Content, |c| read(c, &p))?,
            None => ReloadingFile::fixed(DenyList::default()),
        };
        Ok(Self { list })
    }

    /// The list in force.
    pub(crate) fn current(&self) -> Arc<DenyList> {
        self.list.current()
    }

    /// Why the list in force is stale (its file cannot be used), if it is.
    pub(crate) fn stale(&self) -> Option<String> {
        self.list.failure()
    }

    /// Re-reads the file when it changed. On error the old list stays in force.
    pub(crate) fn reload_if_changed(&self) -> Reload {
        let Some(path) = self.list.paths().first() else { return Reload::Unchanged };
        match self.list.reload_if_changed(|c, _| read(c, path)) {
            FileReload::Unchanged => Reload::Unchanged,
            // The file is back as the list in force was read from: that list is in force
            // again, no longer stale (as a fresh read of the same content would make it).
            FileReload::Recovered | FileReload::Replaced => Reload::Replaced,
            FileReload::Failed(e) => Reload::Failed(e),
        }
    }
}

/// The list in the file as read.
fn read(mut contents: Contents, path: &Path) -> Result<DenyList, DenyListError> {
    let bytes = contents.take(0).map_err(|source| DenyListError::Read { path: path.display().to_string(), source })?;
    parse_bytes(&bytes, path)
}

fn parse_bytes(bytes: &[u8], path: &Path) -> Result<DenyList, DenyListError> {
    let text = std::str::from_utf8(bytes).map_err(|_| DenyListError::Parse {
        path: path.display().to_string(),
        line: 0,
        why: "not UTF-8".into(),
    })?;
    DenyList::parse(text, path)
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
        // As `openssl x509 -noout -serial` prints it.
        let l = DenyList::parse("serial=0A1B2C\nSERIAL = ff:ee\n", Path::new("d")).unwrap();
        assert!(l.denies("spiffe://td/subscriber/x", "a1b2c") && l.denies("spiffe://td/subscriber/x", "FFEE"));
        assert!(DenyList::parse("serial=", Path::new("d")).is_err());
        assert!(DenyList::parse("issuer=ab", Path::new("d")).is_err());
        assert!(DenyList::parse("spiffe://TD/x", Path::new("d")).is_err());
    }

    fn set_mtime(path: &Path, t: std::time::SystemTime) {
        std::fs::File::options().write(true).open(path).unwrap().set_modified(t).unwrap();
    }

    #[test]
    fn a_change_with_the_old_mtime_is_noticed() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deny");
        std::fs::write(&path, "aa\n").unwrap();
        let mtime = std::fs::metadata(&path).unwrap().modified().unwrap();
        let r = Revocation::load(Some(path.clone())).unwrap();
        std::fs::write(&path, "bb\n").unwrap();
        set_mtime(&path, mtime);
        assert!(matches!(r.reload_if_changed(), Reload::Replaced));
        assert!(
            r.current().denies("spiffe://td/cluster/x", "bb") && !r.current().denies("spiffe://td/cluster/x", "aa")
        );
        assert!(matches!(r.reload_if_changed(), Reload::Unchanged));
    }

    #[test]
    fn a_missing_file_at_start_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deny");
        let err = Revocation::load(Some(path.clone())).err().unwrap().to_string();
        assert!(err.contains(&path.display().to_string()) && err.contains("No such file"), "{err}");
        std::fs::write(&path, "").unwrap();
        assert!(Revocation::load(Some(path)).unwrap().current().is_empty());
    }

    #[test]
    fn fails_closed_when_the_file_goes_away_or_breaks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deny");
        std::fs::write(&path, "spiffe://td/cluster/bad\n").unwrap();
        let r = Revocation::load(Some(path.clone())).unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Unchanged));
        // Deleted: the list stays in force, reported once, and marked stale.
        std::fs::remove_file(&path).unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Failed(DenyListError::Read { .. })));
        assert!(matches!(r.reload_if_changed(), Reload::Unchanged));
        assert!(r.current().denies("spiffe://td/cluster/bad", "1"));
        assert!(r.stale().is_some());
        // Replaced by a directory: the same.
        std::fs::create_dir(&path).unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Failed(_)));
        assert!(matches!(r.reload_if_changed(), Reload::Unchanged));
        assert!(r.current().denies("spiffe://td/cluster/bad", "1"));
        // A bad line: the same.
        std::fs::remove_dir(&path).unwrap();
        std::fs::write(&path, "not hex!\n").unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Failed(DenyListError::Parse { line: 1, .. })));
        assert!(r.current().denies("spiffe://td/cluster/bad", "1"));
        // Fixed: the new list is in force and no longer stale.
        std::fs::write(&path, "ff\n").unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Replaced));
        assert!(r.stale().is_none());
        assert!(!r.current().denies("spiffe://td/cluster/bad", "1"));
        assert!(r.current().denies("spiffe://td/cluster/x", "ff"));
    }

    #[test]
    fn a_file_put_back_as_it_was_ends_the_staleness() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("deny");
        std::fs::write(&path, "aa\n").unwrap();
        let r = Revocation::load(Some(path.clone())).unwrap();
        std::fs::write(&path, "not hex!\n").unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Failed(_)));
        assert!(r.stale().is_some());
        // Back as the list in force was read: in force again and no longer stale, told as
        // a replacement so that the stale metric is cleared.
        std::fs::write(&path, "aa\n").unwrap();
        assert!(matches!(r.reload_if_changed(), Reload::Replaced));
        assert!(r.stale().is_none() && r.current().denies("spiffe://td/cluster/x", "aa"));
        assert!(matches!(r.reload_if_changed(), Reload::Unchanged));
    }
}
