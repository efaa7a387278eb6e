//! Durable subscriber cursors and the offset high-water mark, in one small file
//! (`cursors.json`) rewritten atomically.
//!
//! Bounds: a durable name is at most [`MAX_NAME_BYTES`] long and one subscriber identity
//! has at most [`MAX_NAMES_PER_IDENTITY`] of them, so the file stays small.
//!
//! The file also keeps `reserved`: an offset no record has reached yet. The writer moves
//! it ahead (durably) before handing out offsets past it, so after the log lost its tail
//! the bus can continue above every offset it ever handed out, and a cursor can never
//! alias a new record.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::{Deserialize, Serialize};

use super::storage::{Storage, StorageError};

/// Longest durable name, in bytes.
pub const MAX_NAME_BYTES: usize = 256;
/// Most durable names one subscriber identity may hold.
pub const MAX_NAMES_PER_IDENTITY: usize = 16;
/// How far `reserved` is moved ahead at a time.
pub(super) const RESERVE_STEP: u64 = 1 << 20;

/// A durable name the hub refuses.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurableError {
    /// The name is too long.
    #[error("durable name of {len} bytes exceeds the limit of {MAX_NAME_BYTES} bytes")]
    NameTooLong {
        /// Its length.
        len: usize,
    },
    /// The identity already holds the most names.
    #[error(
        "subscriber {identity} already has {MAX_NAMES_PER_IDENTITY} durable names (the limit per subscriber); reuse one of them"
    )]
    TooMany {
        /// The subscriber identity.
        identity: String,
    },
}

/// What the store knows of a durable name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// Its stored cursor.
    Known(u64),
    /// A name never seen.
    New,
    /// Unknown because the cursor store was lost: the name may have existed.
    Lost,
}

#[derive(Default, Serialize, Deserialize)]
struct FileV2 {
    version: u32,
    /// Next offset when the file was written.
    #[serde(default)]
    end: u64,
    /// No offset at or above this was handed out.
    #[serde(default)]
    reserved: u64,
    /// The store was lost once: a name not in it may have existed.
    #[serde(default)]
    names_lost: bool,
    /// identity → durable name → cursor.
    #[serde(default)]
    cursors: BTreeMap<String, BTreeMap<String, u64>>,
}

pub(super) struct CursorStore {
    path: Option<PathBuf>,
    state: Mutex<FileV2>,
    dirty: AtomicBool,
    /// One writer of the file at a time (the writer thread and housekeeping both flush).
    flushing: Mutex<()>,
}

/// The `version` a cursor store file says it is, when it can be read as one at all.
pub(super) fn stored_version(path: &std::path::Path) -> Option<u32> {
    #[derive(serde::Deserialize)]
    struct Versioned {
        version: u32,
    }
    let bytes = std::fs::read(path).ok()?;
    serde_json::from_slice::<Versioned>(&bytes).ok().map(|v| v.version)
}

impl CursorStore {
    /// An in-memory store.
    pub(super) fn memory() -> Self {
        Self {
            path: None,
            state: Mutex::new(FileV2 { version: 2, ..FileV2::default() }),
            dirty: false.into(),
            flushing: Mutex::new(()),
        }
    }

    /// Loads the store; `had_state` says the data directory was used before, so a missing
    /// or unreadable file means the store was lost.
    pub(super) fn load(path: PathBuf, had_state: bool) -> Self {
        let loaded = match std::fs::read(&path) {
            Ok(bytes) => match serde_json::from_slice::<FileV2>(&bytes) {
                Ok(f) if f.version == 2 => Some(f),
                Ok(f) => {
                    tracing::warn!(path = %path.display(), version = f.version, "unknown cursor store version: treating it as lost");
                    None
                }
                Err(e) => {
                    tracing::warn!(path = %path.display(), error = %e, "cursor store is unreadable: treating it as lost");
                    None
                }
            },
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !had_state => None,
            Err(e) => {
                tracing::warn!(path = %path.display(), error = %e, "cursor store is missing: every durable subscriber that reconnects gets resync-required *");
                None
            }
        };
        let fresh = !had_state && !path.exists();
        let (state, dirty) = match loaded {
            Some(f) => (f, false),
            // A new directory: the store starts empty and is written at once, so a later
            // missing file always means it was lost.
            None if fresh => (FileV2 { version: 2, ..FileV2::default() }, true),
            None => (FileV2 { version: 2, names_lost: true, ..FileV2::default() }, true),
        };
        Self { path: Some(path), state: Mutex::new(state), dirty: dirty.into(), flushing: Mutex::new(()) }
    }

    /// The highest stored cursor, the stored end, and the reserved offset.
    pub(super) fn marks(&self) -> (u64, u64, u64) {
        let Ok(s) = self.state.lock() else { return (0, 0, 0) };
        let max = s.cursors.values().flat_map(|m| m.values()).copied().max().unwrap_or(0);
        (max, s.end, s.reserved)
    }

    pub(super) fn reserved(&self) -> u64 {
        self.state.lock().map(|s| s.reserved).unwrap_or(0)
    }

    /// Moves `reserved` to at least `to` and writes the file now.
    pub(super) fn reserve(&self, to: u64, end: u64, storage: &Storage) -> Result<(), StorageError> {
        if let Ok(mut s) = self.state.lock() {
            s.reserved = s.reserved.max(to);
            s.end = s.end.max(end);
        }
        self.dirty.store(true, Ordering::Relaxed);
        self.flush(storage)
    }

    /// Notes the log end (written with the next flush).
    pub(super) fn note_end(&self, end: u64) {
        if let Ok(mut s) = self.state.lock()
            && end > s.end
        {
            s.end = end;
            self.dirty.store(true, Ordering::Relaxed);
        }
    }

    /// Checks the name's bounds and says what is stored for it.
    pub(super) fn lookup(&self, identity: &str, name: &str) -> Result<Lookup, DurableError> {
        if name.len() > MAX_NAME_BYTES {
            return Err(DurableError::NameTooLong { len: name.len() });
        }
        let Ok(s) = self.state.lock() else { return Ok(Lookup::New) };
        let names = s.cursors.get(identity);
        if let Some(c) = names.and_then(|n| n.get(name)) {
            return Ok(Lookup::Known(*c));
        }
        if names.is_some_and(|n| n.len() >= MAX_NAMES_PER_IDENTITY) {
            return Err(DurableError::TooMany { identity: identity.to_string() });
        }
        Ok(if s.names_lost { Lookup::Lost } else { Lookup::New })
    }

    /// Stores a cursor (`force`: even when lower, used to register a start point).
    pub(super) fn set(&self, identity: &str, name: &str, cursor: u64, force: bool) -> Result<(), DurableError> {
        if name.len() > MAX_NAME_BYTES {
            return Err(DurableError::NameTooLong { len: name.len() });
        }
        let Ok(mut s) = self.state.lock() else { return Ok(()) };
        let names = s.cursors.entry(identity.to_string()).or_default();
        if !names.contains_key(name) && names.len() >= MAX_NAMES_PER_IDENTITY {
            return Err(DurableError::TooMany { identity: identity.to_string() });
        }
        let known = names.contains_key(name);
        let e = names.entry(name.to_string()).or_insert(cursor);
        if force || cursor > *e || !known {
            *e = cursor;
            self.dirty.store(true, Ordering::Relaxed);
        }
        Ok(())
    }

    /// Writes the file when something changed.
    pub(super) fn flush(&self, storage: &Storage) -> Result<(), StorageError> {
        let Some(path) = &self.path else { return Ok(()) };
        let _one_at_a_time = self.flushing.lock();
        if !self.dirty.swap(false, Ordering::Relaxed) {
            return Ok(());
        }
        let text = match self.state.lock() {
            Ok(s) => serde_json::to_vec(&*s).map_err(|e| StorageError {
                path: path.clone(),
                cause: format!("cannot serialise the cursor store: {e}"),
                lasting: false,
            }),
            Err(_) => return Ok(()),
        };
        text.and_then(|text| storage.write_atomic(path, &text))
            .inspect_err(|_| self.dirty.store(true, Ordering::Relaxed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_bounded_in_length_and_number() {
        let s = CursorStore::memory();
        let long = "x".repeat(MAX_NAME_BYTES + 1);
        assert_eq!(s.lookup("id", &long).unwrap_err(), DurableError::NameTooLong { len: MAX_NAME_BYTES + 1 });
        for i in 0..MAX_NAMES_PER_IDENTITY {
            assert_eq!(s.lookup("id", &format!("n{i}")).unwrap(), Lookup::New);
            s.set("id", &format!("n{i}"), 1, true).unwrap();
        }
        let err = s.lookup("id", "one-more").unwrap_err();
        assert!(err.to_string().contains("already has 16 durable names"), "{err}");
        assert_eq!(s.lookup("id", "n3").unwrap(), Lookup::Known(1));
        assert_eq!(s.lookup("other", "n1").unwrap(), Lookup::New);
    }

    #[test]
    fn a_lost_store_is_remembered_across_writes() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cursors.json");
        let storage = Storage::default();
        let s = CursorStore::load(path.clone(), true);
        assert_eq!(s.lookup("id", "a").unwrap(), Lookup::Lost);
        s.set("id", "a", 7, true).unwrap();
        s.flush(&storage).unwrap();
        let s = CursorStore::load(path, true);
        assert_eq!(s.lookup("id", "a").unwrap(), Lookup::Known(7));
        assert_eq!(s.lookup("id", "b").unwrap(), Lookup::Lost);
    }
}
