//! Reading the log back at start: every segment is scanned, a torn tail (a write that did
//! not finish, never acked) is cut, damaged bytes anywhere are skipped with a WARN line
//! naming the file and byte offset, and every loss of records that may have been acked
//! becomes a [`Loss`]: the bus appends a `resync-required` for it before serving.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::record::FrameError;
use super::segment;
use crate::Record;
use crate::storage::StorageError;

/// Records that may have been acked and are gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Loss {
    /// The cluster affected, or `None` when unknown (every cluster: `*`).
    pub cluster: Option<Arc<str>>,
    /// Why, for subscribers and logs.
    pub reason: String,
}

/// What the segments hold.
pub(crate) struct Recovered {
    /// Valid records, in offset order.
    pub records: Vec<Record>,
    /// Segments, oldest first.
    pub segments: Vec<(u64, PathBuf)>,
    /// Losses to record.
    pub losses: Vec<Loss>,
    /// Whether records at the end of the log were lost (so offsets must continue above
    /// every offset ever handed out).
    pub tail_lost: bool,
    /// Damaged segments to rewrite without the damage, once the losses are recorded.
    pub rewrite: Vec<(PathBuf, Vec<u8>)>,
    /// Whether the last segment must not be appended to (it is damaged or rewritten).
    pub close_last: bool,
}

/// Reads every segment in `dir`.
pub(crate) fn recover(dir: &Path) -> Result<Recovered, StorageError> {
    let segments = segment::list(dir)?;
    let mut out = Recovered {
        records: Vec::new(),
        segments: segments.clone(),
        losses: Vec::new(),
        tail_lost: false,
        rewrite: Vec::new(),
        close_last: false,
    };
    let mut names: HashMap<String, Arc<str>> = HashMap::new();
    let mut intern = |c: &str| names.entry(c.to_string()).or_insert_with(|| Arc::from(c)).clone();
    let mut last_offset: Option<u64> = None;
    // Offsets up to here are accounted for (read, or reported lost with their segment).
    let mut covered: Option<u64> = None;
    for (i, (first, path)) in segments.iter().enumerate() {
        let is_last = i + 1 == segments.len();
        let next_first = segments.get(i + 1).map(|(f, _)| *f);
        let bytes = std::fs::read(path).map_err(|e| StorageError::new(path, e))?;
        let scan = segment::scan(&bytes, &mut intern);
        let file = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if let (Some(prev), Some(first_rec)) = (last_offset.max(covered), scan.records.first())
            && first_rec.offset > prev + 1
            && scan.damage.first().is_none_or(|d| d.at > 0)
        {
            let reason = format!("records {}..={} missing before segment {file}", prev + 1, first_rec.offset - 1);
            tracing::warn!(path = %path.display(), %reason, "bus log has a hole");
            out.losses.push(Loss { cluster: None, reason });
        }
        let mut rewrite = false;
        for d in &scan.damage {
            let torn_tail = is_last && d.next.is_none() && d.why == FrameError::Incomplete;
            if torn_tail {
                // A write cut short by a crash: it was never synced, so never acked.
                tracing::warn!(path = %path.display(), offset = d.at, bytes = d.len, "cutting torn record at the end of bus segment");
                let f = std::fs::OpenOptions::new().write(true).open(path).map_err(|e| StorageError::new(path, e))?;
                f.set_len(d.at).and_then(|()| f.sync_all()).map_err(|e| StorageError::new(path, e))?;
                continue;
            }
            rewrite = true;
            let prev = d.prev.or(last_offset).unwrap_or(first.saturating_sub(1));
            let lost = match (d.next, next_first) {
                (Some(next), _) | (None, Some(next)) => next.saturating_sub(prev + 1),
                // Damage at the end of the log: how much is unknown, assume some.
                (None, None) => u64::MAX,
            };
            tracing::warn!(
                path = %path.display(),
                offset = d.at,
                bytes = d.len,
                cause = %d.why,
                records_lost = lost.min(u64::from(u32::MAX)),
                "skipping damaged bytes in bus segment"
            );
            if lost == 0 {
                continue;
            }
            if d.next.is_none() && is_last {
                out.tail_lost = true;
            }
            if d.next.is_none()
                && let Some(next) = next_first
            {
                covered = Some(next.saturating_sub(1));
            }
            let reason = format!("records lost in segment {file} at offset {}: {}", d.at, d.why);
            let clusters = if is_last { None } else { segment::read_index(path) };
            match clusters {
                Some(cs) => {
                    out.losses.extend(cs.iter().map(|c| Loss { cluster: Some(intern(c)), reason: reason.clone() }))
                }
                None => out.losses.push(Loss { cluster: None, reason }),
            }
        }
        if rewrite {
            out.rewrite.push((path.clone(), scan.clean));
            out.close_last |= is_last;
        }
        for rec in scan.records {
            if last_offset.is_some_and(|l| rec.offset <= l) {
                tracing::warn!(path = %path.display(), offset = rec.offset, "skipping bus record out of order");
                continue;
            }
            last_offset = Some(rec.offset);
            out.records.push(rec);
        }
    }
    Ok(out)
}
