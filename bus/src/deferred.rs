//! A bus whose backend is opened after the hub started: [`DeferredBus`].
//!
//! A hub restarted while its storage is failing (a full disk with a damaged segment to
//! mark, JetStream answering 503 right after a restart, a frozen NATS node) cannot open
//! its bus yet, though the fault passes. Exiting then turns a passing fault into a
//! crash-loop with growing backoff under a supervisor; so the hub starts on a
//! `DeferredBus`, answers `/readyz` 503 with the cause, refuses agents and subscribers
//! with [`BusError::Opening`] (which they retry), and keeps trying to open the backend.
//! Once [`DeferredBus::open`] is given it, every call goes straight to it.
//!
//! Until then nothing can be appended or read: every operation that returns a future
//! answers [`BusError::Opening`], and the accessors answer as an empty bus would. No
//! session gets past its first bus call, so none acts on those neutral answers.

use std::borrow::Cow;
use std::sync::{Arc, Mutex, OnceLock};

use tokio::sync::watch;

use crate::{
    Append, Bus, BusError, BusFuture, BusStats, EVICTED, FaultInjection, Flush, Gap, Lookup, Read, ReplicaShare, ready,
};

/// A bus opened later (see the [module docs](self)).
///
/// ```
/// use std::sync::Arc;
/// use fleetwatch_bus::{Bus, BusError, DeferredBus, MemoryBus, Retention};
///
/// # tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(async {
/// let bus = DeferredBus::new(false);
/// bus.waiting("cannot connect to NATS: timed out".into());
/// assert_eq!(bus.health().unwrap_err(), "not open yet: cannot connect to NATS: timed out");
/// assert!(matches!(bus.head("c1").await, Err(BusError::Opening(_))));
///
/// bus.open(MemoryBus::open(Retention::default()));
/// assert_eq!(bus.head("c1").await.unwrap(), None);
/// assert!(bus.health().is_ok());
/// # });
/// ```
pub struct DeferredBus {
    inner: OnceLock<Arc<dyn Bus>>,
    /// Whether the backend, once open, keeps records across restarts (known beforehand).
    durable: bool,
    /// Why it is not open yet (the last attempt's error).
    cause: Mutex<String>,
    /// `true` once open.
    opened: watch::Sender<bool>,
    /// The end receivers hand out before the bus is open (never changes).
    end: watch::Sender<u64>,
}

impl DeferredBus {
    /// A bus not open yet; `durable` is what [`Bus::stats`] says of it meanwhile.
    pub fn new(durable: bool) -> Arc<Self> {
        Arc::new(Self {
            inner: OnceLock::new(),
            durable,
            cause: Mutex::new("the hub is opening it".into()),
            opened: watch::channel(false).0,
            end: watch::channel(1).0,
        })
    }

    /// Records why the last attempt to open the backend failed (shown by [`Bus::health`]).
    pub fn waiting(&self, cause: String) {
        *self.cause.lock().unwrap_or_else(|e| e.into_inner()) = cause;
    }

    /// Hands over the opened backend; every later call goes to it. A second call is ignored.
    pub fn open(&self, bus: Arc<dyn Bus>) {
        if self.inner.set(bus).is_ok() {
            self.opened.send_replace(true);
        }
    }

    /// The backend, once open.
    pub fn get(&self) -> Option<&Arc<dyn Bus>> {
        self.inner.get()
    }

    /// Waits until the backend is open, then answers it.
    pub async fn opened(&self) -> Arc<dyn Bus> {
        let mut rx = self.opened.subscribe();
        loop {
            if let Some(bus) = self.inner.get() {
                return bus.clone();
            }
            // The sender lives as long as `self`: `changed` fails only when it is dropped.
            if rx.changed().await.is_err() {
                std::future::pending::<()>().await;
            }
        }
    }

    fn cause(&self) -> String {
        self.cause.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn refused<'a, T: Send + 'a>(&self) -> BusFuture<'a, T> {
        ready(Err(BusError::Opening(self.cause())))
    }
}

impl Bus for DeferredBus {
    fn stream_id(&self) -> &str {
        self.inner.get().map_or("", |b| b.stream_id())
    }

    fn append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, u64> {
        match self.inner.get() {
            Some(b) => b.append(cluster, items),
            None => self.refused(),
        }
    }

    fn start_append(&self, cluster: Arc<str>, items: Vec<Append>) -> BusFuture<'_, BusFuture<'_, u64>> {
        match self.inner.get() {
            Some(b) => b.start_append(cluster, items),
            None => self.refused(),
        }
    }

    fn head<'a>(&'a self, cluster: &'a str) -> BusFuture<'a, Option<(u64, u64)>> {
        match self.inner.get() {
            Some(b) => b.head(cluster),
            None => self.refused(),
        }
    }

    fn prepare_reads(&self) -> BusFuture<'_, ()> {
        match self.inner.get() {
            Some(b) => b.prepare_reads(),
            None => self.refused(),
        }
    }

    fn read(&self, from: u64, max: usize) -> BusFuture<'_, Read> {
        match self.inner.get() {
            Some(b) => b.read(from, max),
            None => self.refused(),
        }
    }

    fn last_offset(&self) -> u64 {
        self.inner.get().map_or(0, |b| b.last_offset())
    }

    fn watch_end(&self) -> watch::Receiver<u64> {
        self.inner.get().map_or_else(|| self.end.subscribe(), |b| b.watch_end())
    }

    fn durable_lookup<'a>(&'a self, identity: &'a str, name: &'a str) -> BusFuture<'a, Lookup> {
        match self.inner.get() {
            Some(b) => b.durable_lookup(identity, name),
            None => self.refused(),
        }
    }

    fn register_durable<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        match self.inner.get() {
            Some(b) => b.register_durable(identity, name, cursor),
            None => self.refused(),
        }
    }

    fn set_durable_cursor<'a>(&'a self, identity: &'a str, name: &'a str, cursor: u64) -> BusFuture<'a, ()> {
        match self.inner.get() {
            Some(b) => b.set_durable_cursor(identity, name, cursor),
            None => self.refused(),
        }
    }

    /// Nothing to store before the bus is open: no subscriber has read.
    fn flush(&self, what: Flush) -> BusFuture<'_, ()> {
        match self.inner.get() {
            Some(b) => b.flush(what),
            None => ready(Ok(())),
        }
    }

    /// Before the bus is open: an empty bus that is [`DeferredBus::new`]'s `durable`.
    fn stats(&self) -> BusStats {
        self.inner.get().map_or(BusStats::empty(self.durable), |b| b.stats())
    }

    /// Before the bus is open, the backend's particulars are not known: plain texts.
    fn resync_reason(&self, gap: Gap<'_>) -> Cow<'static, str> {
        match (self.inner.get(), gap) {
            (Some(b), gap) => b.resync_reason(gap),
            (None, Gap::LostHistory) => Cow::Borrowed("the hub's event history was lost"),
            (None, Gap::Evicted { .. }) => Cow::Borrowed(EVICTED),
            (None, Gap::LostCursor { name }) => {
                Cow::Owned(format!("where durable subscription {name:?} stopped is unknown"))
            }
        }
    }

    fn health(&self) -> Result<(), String> {
        match self.inner.get() {
            Some(b) => b.health(),
            None => Err(format!("not open yet: {}", self.cause())),
        }
    }

    fn fatal(&self) -> Option<String> {
        self.inner.get().and_then(|b| b.fatal())
    }

    fn replica_share(&self) -> Option<&dyn ReplicaShare> {
        self.inner.get()?.replica_share()
    }

    fn fault_injection(&self) -> Option<&dyn FaultInjection> {
        self.inner.get()?.fault_injection()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{MemoryBus, Retention};

    #[tokio::test]
    async fn refuses_with_the_cause_until_open_then_forwards() {
        let bus = DeferredBus::new(true);
        bus.waiting("no space left on device (/data/marks)".into());
        assert!(bus.stats().durable, "said durable before the backend is there");
        let e = bus.append("c1".into(), Vec::new()).await.unwrap_err();
        assert_eq!(e.to_string(), "the hub's storage is not open yet: no space left on device (/data/marks)");
        assert!(matches!(bus.prepare_reads().await, Err(BusError::Opening(_))));
        assert!(matches!(bus.durable_lookup("id", "d").await, Err(BusError::Opening(_))));
        bus.flush(Flush::All).await.expect("nothing to flush before open");
        assert!(bus.replica_share().is_none());

        let waiter = tokio::spawn({
            let bus = bus.clone();
            async move { bus.opened().await.stream_id().to_string() }
        });
        let inner = MemoryBus::open(Retention::default());
        let stream = inner.stream_id().to_string();
        bus.open(inner);
        assert_eq!(waiter.await.unwrap(), stream);
        assert_eq!(bus.stream_id(), stream);
        assert!(!bus.stats().durable, "the backend answers once open");
        bus.prepare_reads().await.expect("open");
        assert_eq!(bus.health(), Ok(()));
    }
}
