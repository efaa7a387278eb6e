//! Retention: what the bus keeps, by record count, bytes and age. Older records are
//! evicted; their clusters are remembered so lagging subscribers get `resync-required`.

use std::time::Duration;

use super::log::Log;

/// Retention limits; a record is evicted when any of them is exceeded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Most records.
    pub records: usize,
    /// Most record bytes (payload plus per-record overhead).
    pub bytes: u64,
    /// Oldest record age; `None` keeps records regardless of age.
    pub age: Option<Duration>,
}

/// Default byte retention of an in-memory bus.
pub const DEFAULT_BYTES_MEMORY: u64 = 256 << 20;
/// Default byte retention of a bus with a data directory. Retained records are also held
/// in memory for reads, so this bounds the hub's memory too.
pub const DEFAULT_BYTES_DISK: u64 = 512 << 20;
/// Default age retention of an in-memory bus.
pub const DEFAULT_AGE_MEMORY: Duration = Duration::from_secs(24 * 3600);
/// Default age retention of a bus with a data directory.
pub const DEFAULT_AGE_DISK: Duration = Duration::from_secs(7 * 24 * 3600);

impl Default for Retention {
    fn default() -> Self {
        Self { records: 200_000, bytes: DEFAULT_BYTES_MEMORY, age: Some(DEFAULT_AGE_MEMORY) }
    }
}

/// Milliseconds since the Unix epoch.
pub(super) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

/// Evicts from the front of `log` until it is within `r` at time `now_ms`.
pub(super) fn evict(log: &mut Log, r: &Retention, now_ms: u64) {
    let oldest_kept = r.age.map(|a| now_ms.saturating_sub(a.as_millis() as u64));
    while let Some(front) = log.records.front() {
        let too_old = oldest_kept.is_some_and(|t| front.time_ms < t);
        if log.records.len() <= r.records && log.bytes <= r.bytes && !too_old {
            break;
        }
        let Some(rec) = log.records.pop_front() else { break };
        log.bytes = log.bytes.saturating_sub(rec.size());
        log.evicted.insert(rec.cluster.clone(), rec.offset);
    }
    log.base = log.records.front().map(|r| r.offset).unwrap_or(log.end);
}
