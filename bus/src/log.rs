//! The in-memory index of the log that both embedded implementations read from: retained
//! records in offset order, per-cluster heads, and what retention evicted per cluster.
//!
//! It is kept apart from how records reach it (directly for [`super::MemoryBus`], after
//! a group-committed disk write for [`super::SegmentBus`]) so the rules that must be the
//! same everywhere (duplicate detection by (epoch, seq), reads that always make progress,
//! eviction reporting) are written once. The NATS backend keeps these rules too; the
//! conformance suite ([`super::conformance`]) checks them for every backend.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, RwLock};

use tokio::sync::watch;

use super::cursors::CursorStore;
use super::retention::{self, Retention};
use super::{ALL_CLUSTERS, Append, BusStats, Read, Record};

pub(crate) struct Log {
    pub(crate) records: VecDeque<Arc<Record>>,
    /// Offset of `records[0]` (or the next offset when empty).
    pub(crate) base: u64,
    /// Next offset to assign.
    pub(crate) end: u64,
    /// Sum of [`Record::size`] of `records`.
    pub(crate) bytes: u64,
    /// Per cluster: the highest evicted offset.
    pub(crate) evicted: HashMap<Arc<str>, u64>,
    /// Per cluster: the (epoch, seq) of its latest record.
    pub(crate) heads: HashMap<Arc<str>, (u64, u64)>,
}

impl Log {
    /// An empty log whose first offset is 1.
    pub(crate) fn new() -> Self {
        Self { records: VecDeque::new(), base: 1, end: 1, bytes: 0, evicted: HashMap::new(), heads: HashMap::new() }
    }

    /// Fills a fresh log with loaded records.
    pub(crate) fn load(&mut self, records: Vec<Record>) {
        for rec in records {
            if rec.cluster.as_ref() != ALL_CLUSTERS {
                self.heads.insert(rec.cluster.clone(), (rec.epoch, rec.seq));
            }
            self.end = rec.offset + 1;
            self.bytes += rec.size();
            self.records.push_back(Arc::new(rec));
        }
    }

    /// Reads up to `max` records from offset `from` on (see [`Read`]).
    pub(crate) fn read(&self, from: u64, max: usize) -> Read {
        let mut out = Read { next: from, ..Read::default() };
        if from < self.base {
            out.evicted =
                self.evicted.iter().filter(|(_, off)| **off >= from).map(|(c, off)| (c.clone(), *off)).collect();
            // Lowest offset first (see [`Read::evicted`]).
            out.evicted.sort_unstable_by(|(a, x), (b, y)| x.cmp(y).then_with(|| a.cmp(b)));
        }
        let start = self.records.partition_point(|r| r.offset < from);
        out.records.extend(self.records.iter().skip(start).take(max).cloned());
        out.next = match out.records.last() {
            Some(last) => last.offset + 1,
            None => from.max(self.end),
        };
        out
    }

    /// Makes `new_records` (offsets below `end`) visible with their clusters' new
    /// `heads`, then applies retention at `now_ms`.
    pub(crate) fn publish(
        &mut self,
        new_records: Vec<Arc<Record>>,
        end: u64,
        heads: impl IntoIterator<Item = (Arc<str>, (u64, u64))>,
        retention: &Retention,
        now_ms: u64,
    ) {
        self.bytes += new_records.iter().map(|r| r.size()).sum::<u64>();
        self.records.extend(new_records);
        self.end = end;
        self.heads.extend(heads);
        retention::evict(self, retention, now_ms);
    }
}

/// Turns one append request into records at offsets from `*end` on, skipping duplicates:
/// records whose seq is not above the cluster's head in the same epoch (`head`, updated).
/// `system` records (markers the bus writes itself) are written as they are and move no
/// head. Returns the offset of the last record (or of the log's last record when every
/// item was a duplicate).
pub(crate) fn assign(
    cluster: &Arc<str>,
    items: Vec<Append>,
    system: bool,
    head: &mut Option<(u64, u64)>,
    end: &mut u64,
    now_ms: u64,
    out: &mut Vec<Arc<Record>>,
) -> u64 {
    let mut last = end.saturating_sub(1);
    for item in items {
        if !system
            && let Some((ep, seq)) = *head
            && ep == item.epoch
            && item.seq <= seq
        {
            continue; // duplicate from a resend
        }
        let rec = Record {
            offset: *end,
            cluster: cluster.clone(),
            epoch: item.epoch,
            seq: item.seq,
            time_ms: now_ms,
            body: item.body,
        };
        if !system {
            *head = Some((item.epoch, item.seq));
        }
        last = *end;
        *end += 1;
        out.push(Arc::new(rec));
    }
    last
}

/// What both embedded implementations share: the log index, the end signal, the durable
/// cursors. Its methods are the synchronous halves of the [`super::Bus`] reads.
pub(crate) struct Core {
    pub(crate) log: RwLock<Log>,
    pub(crate) end_tx: watch::Sender<u64>,
    pub(crate) cursors: CursorStore,
    pub(crate) stream_id: String,
}

impl Core {
    pub(crate) fn new(log: Log, cursors: CursorStore, stream_id: String) -> Self {
        let (end_tx, _) = watch::channel(log.end);
        Self { log: RwLock::new(log), end_tx, cursors, stream_id }
    }

    pub(crate) fn head(&self, cluster: &str) -> Option<(u64, u64)> {
        self.log.read().ok()?.heads.get(cluster).copied()
    }

    pub(crate) fn last_offset(&self) -> u64 {
        *self.end_tx.borrow() - 1
    }

    pub(crate) fn first_offset(&self) -> u64 {
        self.log.read().map(|l| l.base).unwrap_or(1)
    }

    pub(crate) fn read(&self, from: u64, max: usize) -> Read {
        match self.log.read() {
            Ok(log) => log.read(from, max),
            Err(_) => Read { next: from, ..Read::default() },
        }
    }

    /// The [`BusStats`] of records held here (one read of the index), for a backend that
    /// is `durable` and counted `write_failures`.
    pub(crate) fn stats(&self, durable: bool, write_failures: u64) -> BusStats {
        let (first_offset, retained, retained_bytes) = match self.log.read() {
            Ok(l) => (l.base, l.records.len(), l.bytes),
            Err(_) => (1, 0, 0),
        };
        let last_offset = self.last_offset();
        BusStats { durable, first_offset, last_offset, retained, retained_bytes, holds_records: true, write_failures }
    }

    /// Tells readers that offsets below `end` exist now. Appenders announce after they
    /// let go of the log, possibly out of order: the value only ever grows.
    pub(crate) fn announce(&self, end: u64) {
        self.end_tx.send_if_modified(|e| {
            let grows = end > *e;
            if grows {
                *e = end;
            }
            grows
        });
    }
}

/// The [`super::Bus`] methods both embedded backends ([`super::MemoryBus`],
/// [`super::SegmentLogBus`]) answer from their `core: Core` field alike, written once:
/// expanded inside each `impl Bus`. (A blanket `impl<T: Embedded> Bus for T` would need
/// every other `Bus` method declared a second time on the helper trait.)
macro_rules! forward_to_core {
    () => {
        fn stream_id(&self) -> &str {
            &self.core.stream_id
        }

        fn head<'a>(&'a self, cluster: &'a str) -> $crate::BusFuture<'a, Option<(u64, u64)>> {
            $crate::ready(Ok(self.core.head(cluster)))
        }

        fn read(&self, from: u64, max: usize) -> $crate::BusFuture<'_, $crate::Read> {
            $crate::ready(Ok(self.core.read(from, max)))
        }

        fn last_offset(&self) -> u64 {
            self.core.last_offset()
        }

        fn watch_end(&self) -> tokio::sync::watch::Receiver<u64> {
            self.core.end_tx.subscribe()
        }

        /// Kept in memory; the segment log writes it with the next
        /// [`Bus::flush`](crate::Bus::flush) (once a second), not at once.
        fn set_durable_cursor<'a>(
            &'a self,
            identity: &'a str,
            name: &'a str,
            cursor: u64,
        ) -> $crate::BusFuture<'a, ()> {
            $crate::ready(self.core.cursors.set(identity, name, cursor, false).map_err($crate::BusError::from))
        }
    };
}
pub(crate) use forward_to_core;

#[cfg(test)]
mod tests {
    use super::*;

    /// Evicted clusters come lowest offset first whatever the map's order, so a subscriber
    /// acking one resync never passes an eviction it has not been told of.
    #[test]
    fn evictions_are_read_lowest_offset_first() {
        let mut log = Log::new();
        log.base = 200;
        log.end = 200;
        for (c, off) in [("c1", 102), ("c3", 101), ("c2", 94), ("c4", 50), ("c5", 150), ("c6", 101)] {
            log.evicted.insert(Arc::from(c), off);
        }
        let r = log.read(70, 10);
        let got: Vec<(&str, u64)> = r.evicted.iter().map(|(c, o)| (&**c, *o)).collect();
        assert_eq!(got, vec![("c2", 94), ("c3", 101), ("c6", 101), ("c1", 102), ("c5", 150)]);
    }
}
