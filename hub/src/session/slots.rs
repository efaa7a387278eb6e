//! Live sessions per subscriber identity (`--max-sessions-per-subscriber`).
//!
//! One identity may hold at most N subscriber sessions. When a new one subscribes past
//! that, the hub closes one of the identity's existing sessions instead of refusing the
//! new one: the oldest that is not reading (events sent and not acked) first, else the
//! oldest. A client that reconnects after a network cut thus always gets back in (its old,
//! half-open session is the oldest), and a leaked certificate opening sessions in a loop
//! cannot hold more than N sessions' memory (each bounded by its window and frame size).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::fanout::SubscriberProgress;

/// How the reason of a session closed to make room starts.
pub(crate) const EVICTED: &str = "closed to make room for a newer session";

/// One live subscriber session, as the slots see it.
struct Slot {
    id: u64,
    since: Instant,
    progress: Arc<SubscriberProgress>,
    ended: Arc<OnceLock<String>>,
    token: CancellationToken,
}

impl Slot {
    fn reading(&self) -> bool {
        let acked = self.progress.acked.load(Ordering::Relaxed);
        let delivered = self.progress.delivered.load(Ordering::Relaxed);
        delivered <= acked
    }
}

/// Live subscriber sessions by identity.
#[derive(Default)]
pub(crate) struct SubscriberSlots {
    by_identity: Mutex<HashMap<String, Vec<Slot>>>,
    next: AtomicU64,
}

/// A session's place; dropping it frees the place.
pub(crate) struct SlotGuard<'a> {
    slots: &'a SubscriberSlots,
    identity: String,
    id: u64,
}

/// A session closed to make room.
#[derive(Debug)]
pub(crate) struct Evicted {
    /// How old it was.
    pub(crate) age: std::time::Duration,
    /// Whether it was reading.
    pub(crate) was_reading: bool,
}

impl SubscriberSlots {
    /// Takes a place for a session of `identity`; when the identity holds `max` already,
    /// ends one of them (see the module docs) and says which.
    pub(crate) fn take(
        &self,
        identity: &str,
        max: usize,
        progress: Arc<SubscriberProgress>,
        ended: Arc<OnceLock<String>>,
        token: CancellationToken,
    ) -> (SlotGuard<'_>, Vec<Evicted>) {
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let mut evicted = Vec::new();
        let mut map = self.by_identity.lock().unwrap_or_else(|p| p.into_inner());
        let slots = map.entry(identity.to_string()).or_default();
        // Sessions already told to end are leaving: they do not count.
        slots.retain(|s| !s.token.is_cancelled());
        while slots.len() >= max.max(1) {
            let victim = slots
                .iter()
                .enumerate()
                .filter(|(_, s)| !s.reading())
                .min_by_key(|(_, s)| s.since)
                .or_else(|| slots.iter().enumerate().min_by_key(|(_, s)| s.since))
                .map(|(i, _)| i);
            let Some(i) = victim else { break };
            let s = slots.remove(i);
            evicted.push(Evicted { age: s.since.elapsed(), was_reading: s.reading() });
            let _ = s.ended.set(format!(
                "{EVICTED} of the same subscriber identity (--max-sessions-per-subscriber {max}; the oldest \
                 non-reading session goes first)"
            ));
            s.token.cancel();
        }
        slots.push(Slot { id, since: Instant::now(), progress, ended, token });
        (SlotGuard { slots: self, identity: identity.to_string(), id }, evicted)
    }

    /// Live sessions of `identity`.
    #[cfg(test)]
    pub(crate) fn count(&self, identity: &str) -> usize {
        let map = self.by_identity.lock().unwrap_or_else(|p| p.into_inner());
        map.get(identity).map_or(0, |v| v.iter().filter(|s| !s.token.is_cancelled()).count())
    }
}

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        let mut map = self.slots.by_identity.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(v) = map.get_mut(&self.identity) {
            v.retain(|s| s.id != self.id);
            if v.is_empty() {
                map.remove(&self.identity);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn progress(acked: u64, delivered: u64) -> Arc<SubscriberProgress> {
        let p = SubscriberProgress::default();
        p.acked.store(acked, Ordering::Relaxed);
        p.delivered.store(delivered, Ordering::Relaxed);
        Arc::new(p)
    }

    #[test]
    fn the_oldest_non_reading_session_goes_first_then_the_oldest() {
        let slots = SubscriberSlots::default();
        let tokens: Vec<CancellationToken> = (0..4).map(|_| CancellationToken::new()).collect();
        let ended: Vec<Arc<OnceLock<String>>> = (0..4).map(|_| Arc::default()).collect();
        // 0: reading, 1: not reading (5 unacked), 2: reading.
        let (g0, e) = slots.take("a", 3, progress(10, 10), ended[0].clone(), tokens[0].clone());
        assert!(e.is_empty());
        let (g1, _) = slots.take("a", 3, progress(10, 15), ended[1].clone(), tokens[1].clone());
        let (_g2, _) = slots.take("a", 3, progress(10, 10), ended[2].clone(), tokens[2].clone());
        // Another identity is not counted.
        let (_b, e) = slots.take("b", 3, progress(0, 0), Arc::default(), CancellationToken::new());
        assert!(e.is_empty());
        assert_eq!(slots.count("a"), 3);
        let (_g3, e) = slots.take("a", 3, progress(0, 0), ended[3].clone(), tokens[3].clone());
        assert_eq!(e.len(), 1);
        assert!(!e[0].was_reading);
        assert!(tokens[1].is_cancelled() && !tokens[0].is_cancelled());
        assert!(ended[1].get().unwrap().contains("--max-sessions-per-subscriber 3"));
        drop(g1);
        assert_eq!(slots.count("a"), 3);
        // All reading: the oldest goes.
        let (_g4, e) = slots.take("a", 3, progress(0, 0), Arc::default(), CancellationToken::new());
        assert!(e.len() == 1 && e[0].was_reading);
        assert!(tokens[0].is_cancelled());
        drop(g0);
        assert_eq!(slots.count("a"), 3);
    }
}
