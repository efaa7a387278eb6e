//! The in-memory bus: the log index alone, appended to in place under its lock.
//!
//! Nothing is written anywhere, so an append needs no writer thread or group commit: it
//! is answered as soon as the records are visible, which keeps the hot path to one lock.
//! A restart loses the history, and the new random stream id tells subscribers so.

use std::borrow::Cow;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::cursors::CursorStore;
use super::log::{self, Core, Log};
use super::retention::{self, Retention};
use super::{Append, Bus, BusError, BusFuture, BusStats, Flush, Gap, Lookup, Read, cap_reasons, ready};

/// The in-memory bus.
pub struct MemoryBus {
    core: Core,
    retention: Retention,
}

impl MemoryBus {
    /// An empty bus with a new stream id, evicting by `retention` (by age once a second).
    /// Needs a tokio runtime.
    pub fn open(retention: Retention) -> Arc<Self> {
        let stream_id = format!("{:016x}", rand::random::<u64>());
        let bus = Arc::new(Self { core: Core::new(Log::new(), CursorStore::memory(), stream_id), retention });
        spawn_age_retention(Arc::downgrade(&bus));
        bus
    }

    /// Appends at once (see [`Bus::append`]).
    pub fn append_now(&self, cluster: Arc<str>, mut items: Vec<Append>) -> Result<u64, BusError> {
        cap_reasons(&mut items);
        let now = retention::now_ms();
        let mut new_records = Vec::with_capacity(items.len());
        let end = {
            // A poisoned lock means a panic mid-append: refuse rather than guess.
            let mut log = self.core.log.write().map_err(|_| BusError::Closed)?;
            let mut head = log.heads.get(&cluster).copied();
            let mut end = log.end;
            let last = log::assign(&cluster, items, false, &mut head, &mut end, now, &mut new_records);
            log.publish(new_records, end, head.map(|h| (cluster, h)), &self.retention, now);
            (end, last)
        };
        self.core.announce(end.0);
        Ok(end.1)
    }

    /// The (epoch, seq) of a cluster's latest record.
    pub fn head_now(&self, cluster: &str) -> Option<(u64, u64)> {
        self.core.head(cluster)
    }

    /// Reads at once (see [`Bus::read`]).
    pub fn read_now(&self, from: u64, max: usize) -> Read {
        self.core.read(from, max)
    }

    fn evict_by_age(&self) {
        if let Ok(mut log) = self.core.log.write() {
            let end = log.end;
            log.publish(Vec::new(), end, None, &self.retention, retention::now_ms());
        }
    }
}

/// Evicts by age once a second, so old records go without new appends; stops with the bus.
fn spawn_age_retention(bus: Weak<MemoryBus>) {
    tokio::spawn(async move {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            every.tick().await;
            let Some(bus) = bus.upgrade() else { return };
            if bus.retention.age.is_some() {
                bus.evict_by_age();
            }
        }
    });
}

impl Bus for MemoryBus {
    log::forward_to_core!();

    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64> {
        ready(self.append_now(cluster, items))
    }

    /// A name this bus does not know is [`Lookup::Lost`], never [`Lookup::New`]: cursors
    /// live in memory only, so the name may have been read on this hub before it restarted
    /// and nothing can tell. The cost is one `resync-required *` at a name's first
    /// subscription to each hub process, where a new subscriber re-lists anyway.
    fn durable_lookup<'a>(&'a self, identity: &'a str, name: &'a str) -> BusFuture<'a, Lookup> {
        ready(
            self.core
                .cursors
                .lookup(identity, name)
                .map(|l| if l == Lookup::New { Lookup::Lost } else { l })
                .map_err(BusError::from),
        )
    }

    /// A lost cursor is one this bus never knew (see [`Bus::durable_lookup`] above).
    fn resync_reason(&self, gap: Gap<'_>) -> Cow<'static, str> {
        match gap {
            Gap::LostCursor { name } => Cow::Owned(format!(
                "the hub keeps durable cursors in memory only (no data directory) and does not know durable subscription {name:?}: it may have been read before the hub restarted"
            )),
            other => other.default_reason(),
        }
    }

    fn register_durable<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        ready(self.core.cursors.set(identity, name, cursor, true).map_err(BusError::from))
    }

    /// Nothing to write: everything is in memory.
    fn flush(&self, _: Flush) -> BusFuture<'_, ()> {
        ready(Ok(()))
    }

    fn stats(&self) -> BusStats {
        self.core.stats(false, 0)
    }

    fn health(&self) -> Result<(), String> {
        match self.core.log.read() {
            Ok(_) => Ok(()),
            Err(_) => Err("bus state is poisoned".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A memory bus cannot tell a new name from one it knew before a restart: both are
    /// lost, so the subscriber is told to re-list (seed 5059 of the simulation with
    /// `--durable-crashes` lost a deletion when they were new).
    #[tokio::test]
    async fn an_unknown_durable_name_is_lost_not_new() {
        let bus = MemoryBus::open(crate::Retention::default());
        assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Lost);
        assert!(bus.resync_reason(Gap::LostCursor { name: "sub" }).contains("memory only"));
        bus.register_durable("id", "sub", 4).await.unwrap();
        assert_eq!(bus.durable_lookup("id", "sub").await.unwrap(), Lookup::Known(4));
    }
}
