//! Segment files (`segments/<first offset, 20 digits>.log`), their cluster index files
//! (`<first>.idx`, written when a segment is closed) and the scan that reads a segment
//! back, skipping damage.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::{self, FrameError};
use crate::Record;
use crate::storage::{Storage, StorageError};

/// The path of the segment whose first record has offset `first`.
pub(crate) fn path(dir: &Path, first: u64) -> PathBuf {
    dir.join(format!("{first:020}.log"))
}

fn index_path(segment: &Path) -> PathBuf {
    segment.with_extension("idx")
}

/// The segments in `dir`, oldest first, with their first offsets.
pub(crate) fn list(dir: &Path) -> Result<Vec<(u64, PathBuf)>, StorageError> {
    let mut segs: Vec<(u64, PathBuf)> = std::fs::read_dir(dir)
        .map_err(|e| StorageError::new(dir, e))?
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let p = e.path();
            let first = p.file_stem()?.to_str()?.parse().ok()?;
            (p.extension()? == "log").then_some((first, p))
        })
        .collect();
    segs.sort();
    Ok(segs)
}

/// Records the clusters a closed segment holds, so damage found in it later can be
/// attributed to them rather than to every cluster.
pub(crate) fn write_index<'a>(
    storage: &Storage,
    segment: &Path,
    clusters: impl Iterator<Item = &'a Arc<str>>,
) -> Result<(), StorageError> {
    let names: BTreeSet<&str> = clusters.map(|c| &**c).collect();
    // `{"clusters":["a","b"]}`, written directly: nothing to fail.
    let mut payload = br#"{"clusters":["#.to_vec();
    for (i, name) in names.iter().enumerate() {
        if i > 0 {
            payload.push(b',');
        }
        record::push_json_str(&mut payload, name);
    }
    payload.extend_from_slice(b"]}");
    let mut buf = Vec::new();
    record::encode_raw(&payload, &mut buf);
    storage.write_atomic(&index_path(segment), &buf)
}

/// The clusters of a closed segment, when its index is present and intact.
pub(crate) fn read_index(segment: &Path) -> Option<Vec<String>> {
    #[derive(serde::Deserialize)]
    struct Index {
        clusters: Vec<String>,
    }
    let bytes = std::fs::read(index_path(segment)).ok()?;
    let (payload, _) = record::frame_at(&bytes, 0).ok()?;
    serde_json::from_slice::<Index>(payload).ok().map(|i| i.clusters)
}

/// Removes a segment and its index.
pub(crate) fn remove(segment: &Path) -> std::io::Result<()> {
    let _ = std::fs::remove_file(index_path(segment));
    std::fs::remove_file(segment)
}

/// Unreadable bytes found in a segment.
pub(crate) struct Damage {
    /// Byte offset in the file.
    pub at: u64,
    /// Bytes skipped.
    pub len: u64,
    /// Why the bytes at `at` are not a record.
    pub why: FrameError,
    /// Offset of the last good record before it.
    pub prev: Option<u64>,
    /// Offset of the first good record after it; `None` when nothing valid follows.
    pub next: Option<u64>,
}

/// What a segment holds.
pub(crate) struct Scan {
    /// Valid records, in file order.
    pub records: Vec<Record>,
    /// Damaged regions.
    pub damage: Vec<Damage>,
    /// The valid frames' bytes, for rewriting a damaged segment without the damage.
    pub clean: Vec<u8>,
}

/// Reads every valid record of a segment; damaged bytes are skipped by looking for the
/// next frame whose checksum verifies.
pub(crate) fn scan(bytes: &[u8], intern: &mut impl FnMut(&str) -> Arc<str>) -> Scan {
    let mut out = Scan { records: Vec::new(), damage: Vec::new(), clean: Vec::new() };
    let mut pos = 0;
    while pos < bytes.len() {
        let why = match record::frame_at(bytes, pos) {
            Ok((payload, size)) => match record::decode(payload, intern) {
                Ok(rec) => {
                    out.records.push(rec);
                    out.clean.extend_from_slice(&bytes[pos..pos + size]);
                    pos += size;
                    continue;
                }
                Err(e) => e,
            },
            Err(e) => e,
        };
        let next_pos = record::next_valid_frame(bytes, pos + 1);
        let resume = next_pos.unwrap_or(bytes.len());
        let next = next_pos.and_then(|p| {
            let (payload, _) = record::frame_at(bytes, p).ok()?;
            record::decode(payload, intern).ok().map(|r| r.offset)
        });
        out.damage.push(Damage {
            at: pos as u64,
            len: (resume - pos) as u64,
            why,
            prev: out.records.last().map(|r| r.offset),
            next,
        });
        pos = resume;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn index_round_trips_any_cluster_name() {
        let dir = tempfile::tempdir().unwrap();
        let seg = path(dir.path(), 1);
        let names: Vec<Arc<str>> = vec!["b".into(), "a\"\\\n".into(), "b".into()];
        write_index(&Storage::default(), &seg, names.iter()).unwrap();
        assert_eq!(read_index(&seg).unwrap(), vec!["a\"\\\n".to_string(), "b".to_string()]);
    }
}
