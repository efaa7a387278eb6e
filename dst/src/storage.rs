//! Damage to the segment log's directory while the hub is down: the last records cut at
//! a record boundary (what a crash right after an ack can leave when the file system
//! loses the last write), and a lost cursor store.
//!
//! The hub's segment log writes real files, but its writer runs as a task on the
//! simulation's runtime ([`fleetwatch_bus::WriterPlacement::Runtime`]): every write
//! happens inside a step of the seeded scheduler, so a crash stops it between two steps
//! and the driver may touch the files at once.

use std::path::{Path, PathBuf};

/// Bytes before a record's payload: magic, length, checksum (see the hub's `bus::record`).
const HEADER: usize = 12;
const MAGIC: &[u8; 4] = b"FWR2";

/// A fresh data directory for seed `seed`.
pub fn temp_dir(seed: u64) -> PathBuf {
    let dir = crate::sim::scratch("data", seed);
    let _ = std::fs::remove_dir_all(&dir);
    dir
}

/// Cuts the last `n` records of the newest segment at a record boundary; answers how many
/// were cut.
pub fn cut_last_records(dir: &Path, n: usize) -> usize {
    let Some(path) = newest_segment(&dir.join("segments")) else { return 0 };
    let Ok(bytes) = std::fs::read(&path) else { return 0 };
    let starts = record_starts(&bytes);
    let cut = n.min(starts.len());
    if cut == 0 {
        return 0;
    }
    let at = starts[starts.len() - cut] as u64;
    match std::fs::OpenOptions::new().write(true).open(&path).and_then(|f| f.set_len(at)) {
        Ok(()) => {
            tracing::info!(path = %path.display(), records = cut, "simulation cut the log's last records");
            cut
        }
        Err(_) => 0,
    }
}

/// Deletes the cursor store; answers whether there was one.
pub fn lose_cursors(dir: &Path) -> bool {
    std::fs::remove_file(dir.join("cursors.json")).is_ok()
}

fn newest_segment(seg_dir: &Path) -> Option<PathBuf> {
    std::fs::read_dir(seg_dir)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "log"))
        .filter_map(|p| Some((p.file_stem()?.to_str()?.parse::<u64>().ok()?, p)))
        .max_by_key(|(first, _)| *first)
        .map(|(_, p)| p)
}

/// Where each complete record of a segment starts.
fn record_starts(bytes: &[u8]) -> Vec<usize> {
    let mut starts = Vec::new();
    let mut pos = 0;
    while pos + HEADER <= bytes.len() && &bytes[pos..pos + 4] == MAGIC {
        let len = u32::from_le_bytes([bytes[pos + 4], bytes[pos + 5], bytes[pos + 6], bytes[pos + 7]]) as usize;
        let next = pos + HEADER + len;
        if next > bytes.len() {
            break;
        }
        starts.push(pos);
        pos = next;
    }
    starts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: &[u8]) -> Vec<u8> {
        let mut v = MAGIC.to_vec();
        v.extend_from_slice(&(payload.len() as u32).to_le_bytes());
        v.extend_from_slice(&[0; 4]);
        v.extend_from_slice(payload);
        v
    }

    #[test]
    fn finds_record_boundaries_and_ignores_a_torn_tail() {
        let mut bytes = frame(b"one");
        bytes.extend(frame(b"three"));
        assert_eq!(record_starts(&bytes), vec![0, 15]);
        bytes.extend_from_slice(&frame(b"torn")[..10]);
        assert_eq!(record_starts(&bytes), vec![0, 15]);
    }

    #[test]
    fn cuts_the_newest_segment_only() {
        let dir = crate::sim::scratch("storage-test", 0);
        let seg = dir.join("segments");
        std::fs::create_dir_all(&seg).unwrap();
        let mut old = frame(b"a");
        old.extend(frame(b"b"));
        std::fs::write(seg.join("1.log"), &old).unwrap();
        let mut new = frame(b"c");
        new.extend(frame(b"dd"));
        std::fs::write(seg.join("3.log"), &new).unwrap();
        assert_eq!(cut_last_records(&dir, 1), 1);
        assert_eq!(std::fs::read(seg.join("3.log")).unwrap(), frame(b"c"));
        assert_eq!(cut_last_records(&dir, 5), 1, "only what the newest segment holds");
        assert_eq!(std::fs::read(seg.join("1.log")).unwrap(), old);
        std::fs::remove_dir_all(dir).unwrap();
    }
}
