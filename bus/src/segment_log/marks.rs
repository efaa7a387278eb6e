//! The log's high-water mark (`marks`), written and synced with every group commit, so
//! the bus alone notices at start that acked records vanished from the end of the log.
//!
//! A segment cut at a record boundary (after a crash, by a file system that lost its last
//! writes, by a restore) reads back as a valid shorter log. Only an agent reconnecting with
//! its acked seq would reveal the loss, and one that never returns (cluster gone) never
//! does. The mark closes that: after each commit's records are synced, the writer stores
//! the log's end and, per cluster, the (epoch, seq, offset) of its latest record since the
//! mark's window began. At start a log ending below the mark lost acked records: each
//! cluster whose marked record is gone gets a `resync-required` with the true reason, or
//! `*` when the loss reaches below the window (the clusters there cannot be told).
//!
//! The mark is written after the records and synced beside them (two `fdatasync`s at
//! once, on two threads), so a commit costs one sync's time. A power loss between the two
//! can leave the mark ahead of records that were never acked: a resync more than needed at
//! start, never one less.
//!
//! The window holds at most [`MAX_CLUSTERS`] clusters; when a commit would go beyond, the
//! window restarts at that commit (with more clusters than that in one commit, it names
//! none: `*`). So the mark stays small (one write of at most [`SLOT`] bytes per commit,
//! whatever the fleet's size), and a small fleet is attributed exactly.
//!
//! Layout: two slots of [`SLOT`] bytes, written alternately in place, each one framed
//! record (magic, length, CRC32C, JSON: see [`super::record`]). A write torn by a crash
//! spoils only the older slot; the newer one still holds a valid, lower mark.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::record;
use super::recovery::Loss;
use crate::Record;
use crate::storage::{Storage, StorageError};

/// Bytes per slot (the file is two of them).
pub(crate) const SLOT: u64 = 16 << 10;
/// Most clusters one window names.
pub(crate) const MAX_CLUSTERS: usize = 128;

/// What one slot says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct Mark {
    /// Written by the `generation`th commit since the file was created (the newer slot wins).
    pub generation: u64,
    /// The log's next offset after that commit: every offset below it was stored (or
    /// evicted) and acked.
    pub end: u64,
    /// The window's first offset: every cluster with a record at or above it is named.
    pub since: u64,
    /// cluster → (epoch, seq, offset) of its latest record in the window; `None` when one
    /// commit held more clusters than a window names.
    pub clusters: Option<BTreeMap<String, (u64, u64, u64)>>,
}

/// Reads the newer valid slot of `path`; `None` when there is no mark (a directory from
/// before marks, or both slots unreadable).
pub(crate) fn load(path: &Path) -> Option<Mark> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(path = %path.display(), error = %e, "cannot read the bus log's mark: the end of the log is checked against the cursor store only");
            return None;
        }
    };
    let slot = |i: u64| -> Option<Mark> {
        let start = usize::try_from(i * SLOT).ok()?;
        let (payload, _) = record::frame_at(bytes.get(start..)?, 0).ok()?;
        serde_json::from_slice(payload).ok()
    };
    match (slot(0), slot(1)) {
        (Some(a), Some(b)) => Some(if a.generation >= b.generation { a } else { b }),
        (a, b) => {
            let m = a.or(b);
            if m.is_none() {
                tracing::warn!(path = %path.display(), "the bus log's mark is unreadable: the end of the log is checked against the cursor store only");
            }
            m
        }
    }
}

/// The acked records `mark` says the log had and a log ending at `log_end` (its next
/// offset) no longer has: one [`Loss`] per cluster whose marked record is gone, or one for
/// every cluster (`cluster: None`) when the loss reaches below the window.
pub(crate) fn losses(mark: &Mark, log_end: u64) -> Vec<Loss> {
    if mark.end <= log_end {
        return Vec::new();
    }
    let range = format!(
        "the log ends at offset {} but the hub had stored and acked records up to offset {} before it stopped (the end of the log was cut after it was written)",
        log_end.saturating_sub(1),
        mark.end - 1
    );
    let named = match &mark.clusters {
        Some(clusters) if log_end >= mark.since => clusters
            .iter()
            .filter(|(_, (_, _, offset))| *offset >= log_end)
            .map(|(c, (epoch, seq, offset))| Loss {
                cluster: Some(Arc::from(c.as_str())),
                reason: format!("acked records of this cluster up to seq {seq} of epoch {epoch} (offset {offset}) are missing: {range}"),
            })
            .collect(),
        _ => Vec::new(),
    };
    if named.is_empty() {
        vec![Loss { cluster: None, reason: format!("acked records {log_end}..={} are missing: {range}", mark.end - 1) }]
    } else {
        named
    }
}

/// The writer's side: the current window and the file.
pub(crate) struct Marks {
    path: PathBuf,
    /// Shared with the writer's mark-sync thread while it syncs.
    file: Option<Arc<File>>,
    mark: Mark,
}

impl Marks {
    /// Continues after `loaded` (the mark found at start, if any; its generations go on)
    /// at `end`, the log's next offset, with the window rebuilt from the records the log
    /// holds (`records`, in offset order): the latest record of each of the newest
    /// [`MAX_CLUSTERS`] clusters, so a later cut is attributed as well as before.
    pub(crate) fn new<'r>(
        path: PathBuf,
        loaded: Option<&Mark>,
        end: u64,
        records: impl DoubleEndedIterator<Item = &'r Record>,
    ) -> Self {
        let generation = loaded.map(|m| m.generation).unwrap_or(0);
        let end = loaded.map(|m| m.end).unwrap_or(0).max(end);
        let mut clusters = BTreeMap::new();
        // Every record is covered unless the walk stops early.
        let mut since = 0;
        for r in records.rev() {
            if !clusters.contains_key(&*r.cluster) {
                if clusters.len() == MAX_CLUSTERS {
                    since = r.offset + 1;
                    break;
                }
                clusters.insert(r.cluster.to_string(), (r.epoch, r.seq, r.offset));
            }
        }
        Self { path, file: None, mark: Mark { generation, end, since, clusters: Some(clusters) } }
    }

    /// Stores the mark after `records` (in offset order) durably: [`Marks::write`],
    /// `Marks::sync`, [`Marks::done`] in one. On an error the records must not be acked
    /// (the caller cuts them back).
    #[cfg(test)]
    pub(crate) fn commit(&mut self, records: &[Arc<Record>], storage: &Storage) -> Result<(), StorageError> {
        let next = self.write(records, storage)?;
        self.sync(storage)?;
        self.done(next);
        Ok(())
    }

    /// Makes the mark once the records it covers are stored: the mark written after them
    /// ([`Marks::write`]) is now synced with them ([`Marks::sync`]).
    pub(crate) fn done(&mut self, next: Mark) {
        self.mark = next;
    }

    /// Syncs the mark written last (`fdatasync`). The writer syncs [`Marks::to_sync`]'s file
    /// beside the segment instead, so a commit waits for one sync's time, not two.
    #[cfg(test)]
    pub(crate) fn sync(&self, storage: &Storage) -> Result<(), StorageError> {
        match &self.file {
            Some(f) => storage.sync(f).map_err(|e| StorageError::new(&self.path, e)),
            None => Ok(()),
        }
    }

    /// The file to sync for the mark written last, for a sync run elsewhere (the writer's
    /// [`super::writer::MarkSyncer`]); passes the storage fault gate first, as every sync
    /// does. `None`: nothing was written.
    pub(crate) fn to_sync(&self, storage: &Storage) -> Result<Option<Arc<File>>, StorageError> {
        storage.check().map_err(|e| StorageError::new(&self.path, e))?;
        Ok(self.file.clone())
    }

    /// Where the mark lives (for errors).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes the mark after `records` (in offset order) into the older slot, not synced;
    /// answers it for [`Marks::done`].
    pub(crate) fn write(&mut self, records: &[Arc<Record>], storage: &Storage) -> Result<Mark, StorageError> {
        let Some(last) = records.last() else { return Ok(self.mark.clone()) };
        let mut next = self.mark.clone();
        next.generation += 1;
        next.end = next.end.max(last.offset + 1);
        let fits = |clusters: &BTreeMap<String, (u64, u64, u64)>| clusters.len() <= MAX_CLUSTERS;
        let add = |clusters: &mut BTreeMap<String, (u64, u64, u64)>| {
            for r in records {
                clusters.insert(r.cluster.to_string(), (r.epoch, r.seq, r.offset));
            }
        };
        let mut payload = None;
        if let Some(clusters) = &mut next.clusters {
            add(clusters);
            if fits(clusters) {
                payload = encoded(&next);
            }
        }
        if payload.is_none() {
            // The window is full: it restarts at this commit.
            next.since = records[0].offset;
            let mut clusters = BTreeMap::new();
            add(&mut clusters);
            next.clusters = fits(&clusters).then_some(clusters);
            payload = encoded(&next);
            if payload.is_none() {
                next.clusters = None;
                payload = encoded(&next);
            }
        }
        let Some(buf) = payload else {
            return Err(StorageError {
                path: self.path.clone(),
                cause: "cannot encode the log's mark".into(),
                lasting: false,
            });
        };
        let slot = next.generation % 2;
        let file = match &mut self.file {
            Some(f) => f,
            None => {
                self.file.insert(Arc::new(storage.open_mark(&self.path).map_err(|e| StorageError::new(&self.path, e))?))
            }
        };
        if let Err(e) = storage.write_at(file, &buf, slot * SLOT) {
            // Reopened next time, in case the descriptor is what failed.
            self.file = None;
            return Err(StorageError::new(&self.path, e));
        }
        Ok(next)
    }
}

/// One slot's bytes, or `None` when the mark does not fit a slot.
fn encoded(mark: &Mark) -> Option<Vec<u8>> {
    let json = serde_json::to_vec(mark).ok()?;
    let mut buf = Vec::with_capacity(json.len() + record::HEADER);
    record::encode_raw(&json, &mut buf);
    (buf.len() as u64 <= SLOT).then_some(buf)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::RecordBody;

    fn rec(cluster: &str, epoch: u64, seq: u64, offset: u64) -> Arc<Record> {
        Arc::new(Record {
            offset,
            cluster: Arc::from(cluster),
            epoch,
            seq,
            time_ms: 0,
            body: RecordBody::ResyncRequired(String::new()),
        })
    }

    #[test]
    fn the_newer_slot_wins_and_a_torn_one_is_skipped() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks");
        let storage = Storage::default();
        let mut m = Marks::new(path.clone(), None, 1, std::iter::empty());
        m.commit(&[rec("a", 1, 1, 1), rec("b", 2, 1, 2)], &storage).unwrap();
        m.commit(&[rec("a", 1, 2, 3)], &storage).unwrap();
        let got = load(&path).unwrap();
        assert_eq!((got.generation, got.end, got.since), (2, 4, 0));
        let clusters = got.clusters.unwrap();
        assert_eq!(clusters["a"], (1, 2, 3));
        assert_eq!(clusters["b"], (2, 1, 2));
        // The newer slot (generation 2: slot 0) torn: the older one is still a valid, lower mark.
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 0xff;
        std::fs::write(&path, &bytes).unwrap();
        assert_eq!(load(&path).unwrap().end, 3);
        // A restart continues the generations, so its next write is the newer one, and
        // rebuilds the window from the log.
        let log = [rec("a", 1, 1, 1), rec("b", 2, 1, 2), rec("a", 1, 2, 3)];
        let mut m = Marks::new(path.clone(), load(&path).as_ref(), 4, log.iter().map(|r| &**r));
        m.commit(&[rec("c", 1, 1, 4)], &storage).unwrap();
        let got = load(&path).unwrap();
        assert_eq!((got.end, got.since), (5, 0));
        let clusters = got.clusters.unwrap();
        assert_eq!(clusters.keys().collect::<Vec<_>>(), ["a", "b", "c"]);
        assert_eq!(clusters["a"], (1, 2, 3));
        // A log with more clusters than a window names: the window starts after the
        // newest record it cannot name.
        let many: Vec<_> = (0..=MAX_CLUSTERS as u64).map(|i| rec(&format!("c{i}"), 1, 1, i + 1)).collect();
        let m = Marks::new(path.clone(), None, 200, many.iter().map(|r| &**r));
        assert_eq!(m.mark.since, 2);
        assert_eq!(m.mark.clusters.as_ref().unwrap().len(), MAX_CLUSTERS);
        assert!(load(&dir.path().join("none")).is_none());
    }

    #[test]
    fn a_cut_log_names_the_clusters_whose_acked_records_are_gone() {
        let mut clusters = BTreeMap::new();
        clusters.insert("a".to_string(), (1, 9, 9));
        clusters.insert("b".to_string(), (2, 4, 12));
        clusters.insert("c".to_string(), (3, 7, 14));
        let mark = Mark { generation: 5, end: 15, since: 3, clusters: Some(clusters) };
        // Nothing cut.
        assert!(losses(&mark, 15).is_empty());
        assert!(losses(&mark, 20).is_empty());
        // The last record (c's) cut.
        let l = losses(&mark, 14);
        assert_eq!(l.len(), 1);
        assert_eq!(l[0].cluster.as_deref(), Some("c"));
        assert!(l[0].reason.contains("seq 7 of epoch 3 (offset 14)"), "{}", l[0].reason);
        assert!(l[0].reason.contains("the log ends at offset 13"), "{}", l[0].reason);
        // Cut back to offset 10: b and c.
        let mut names: Vec<_> = losses(&mark, 10).into_iter().filter_map(|l| l.cluster).collect();
        names.sort();
        assert_eq!(names.iter().map(|c| &**c).collect::<Vec<_>>(), ["b", "c"]);
        // Below the window: who had records there is unknown.
        let l = losses(&mark, 2);
        assert_eq!(l.len(), 1);
        assert!(l[0].cluster.is_none());
        assert!(l[0].reason.contains("acked records 2..=14 are missing"), "{}", l[0].reason);
        // A window that names nobody.
        let all = Mark { clusters: None, ..mark };
        assert!(losses(&all, 14)[0].cluster.is_none());
    }

    #[test]
    fn the_window_restarts_when_it_would_name_too_many_clusters() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks");
        let storage = Storage::default();
        let mut m = Marks::new(path.clone(), None, 1, std::iter::empty());
        let first: Vec<_> = (0..MAX_CLUSTERS as u64).map(|i| rec(&format!("c{i}"), 1, 1, i + 1)).collect();
        m.commit(&first, &storage).unwrap();
        assert_eq!(load(&path).unwrap().clusters.unwrap().len(), MAX_CLUSTERS);
        let next = MAX_CLUSTERS as u64 + 1;
        m.commit(&[rec("new", 1, 1, next)], &storage).unwrap();
        let got = load(&path).unwrap();
        assert_eq!(got.since, next);
        assert_eq!(got.clusters.unwrap().keys().collect::<Vec<_>>(), ["new"]);
        // One commit with more clusters than a window names: none named.
        let many: Vec<_> = (0..=MAX_CLUSTERS as u64).map(|i| rec(&format!("d{i}"), 1, 1, next + 1 + i)).collect();
        m.commit(&many, &storage).unwrap();
        let got = load(&path).unwrap();
        assert!(got.clusters.is_none());
        assert_eq!(got.end, next + 2 + MAX_CLUSTERS as u64);
    }

    #[test]
    fn a_failed_write_keeps_the_last_mark() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("marks");
        let storage = Storage::default();
        let mut m = Marks::new(path.clone(), None, 1, std::iter::empty());
        m.commit(&[rec("a", 1, 1, 1)], &storage).unwrap();
        storage.fail_for(std::time::Duration::from_secs(3600));
        m.commit(&[rec("a", 1, 2, 2)], &storage).unwrap_err();
        assert_eq!(load(&path).unwrap().end, 2);
        storage.fail_for(std::time::Duration::ZERO);
        m.commit(&[rec("a", 1, 3, 3)], &storage).unwrap();
        let got = load(&path).unwrap();
        assert_eq!((got.end, got.clusters.unwrap()["a"]), (4, (1, 3, 3)));
    }
}
