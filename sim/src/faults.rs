//! Fault injection a test switches on while the cluster runs.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Duration;

use crate::cluster::Core;
use crate::error::ApiError;

/// Counters read by every request.
#[derive(Debug)]
pub struct FaultState {
    delay_ms: AtomicU64,
    fail_next: AtomicU32,
    fail_code: AtomicU32,
    hold_watches: tokio::sync::watch::Sender<bool>,
}

impl Default for FaultState {
    fn default() -> Self {
        FaultState {
            delay_ms: AtomicU64::new(0),
            fail_next: AtomicU32::new(0),
            fail_code: AtomicU32::new(0),
            hold_watches: tokio::sync::watch::Sender::new(false),
        }
    }
}

impl FaultState {
    /// Waits while new watches are held back (see [`Faults::hold_watches`]).
    pub async fn watch_gate(&self) {
        let mut rx = self.hold_watches.subscribe();
        let _ = rx.wait_for(|held| !*held).await;
    }

    /// The delay to add to a response (zero when off).
    pub fn delay(&self) -> Duration {
        Duration::from_millis(self.delay_ms.load(Ordering::Relaxed))
    }

    /// Takes one pending failure, if any.
    pub fn take_failure(&self) -> Option<ApiError> {
        let taken = self.fail_next.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1)).is_ok();
        if !taken {
            return None;
        }
        Some(match self.fail_code.load(Ordering::SeqCst) {
            429 => ApiError::too_many_requests(),
            403 => ApiError::forbidden("injected fault: access denied (as RBAC would)"),
            _ => ApiError::internal("injected fault"),
        })
    }
}

/// The fault-injection handle of a [`SimCluster`](crate::SimCluster); cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), fleetwatch_sim::SimError> {
/// use fleetwatch_sim::{SimCluster, SimOptions};
/// let sim = SimCluster::start(SimOptions::default()).await?;
/// let faults = sim.faults();
/// faults.fail_next(2, 429);    // the next two requests get 429 TooManyRequests
/// faults.compact_history();    // every resourceVersion seen so far is now too old: 410
/// faults.drop_watches();       // open watches end, clients re-watch and get 410
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Faults {
    pub(crate) core: Arc<Core>,
}

impl Faults {
    /// Ends every open watch stream now (as an apiserver restart or a load balancer would).
    /// Returns how many were open.
    pub fn drop_watches(&self) -> usize {
        self.core.lock().drop_watches(None)
    }

    /// Forgets the retained watch history so that every resourceVersion handed out so far
    /// is too old: a watch from it gets an ERROR event with 410 Expired, forcing a relist.
    pub fn compact_history(&self) {
        self.core.lock().compact();
    }

    /// Delays every response by `delay` (zero switches it off).
    pub fn set_delay(&self, delay: Duration) {
        self.core.faults.delay_ms.store(delay.as_millis() as u64, Ordering::Relaxed);
    }

    /// Fails the next `n` requests with `code`: 429 (TooManyRequests, retry-after 1 s),
    /// 403 (Forbidden, as an RBAC denial) or anything else for 500 (InternalError).
    pub fn fail_next(&self, n: u32, code: u16) {
        self.core.faults.fail_code.store(u32::from(code), Ordering::SeqCst);
        self.core.faults.fail_next.store(n, Ordering::SeqCst);
    }

    /// While `true`, new watch requests wait before they start (and so see nothing written
    /// meanwhile until released). With [`drop_watches`](Self::drop_watches) and
    /// [`compact_history`](Self::compact_history) this makes a test's writes happen while a
    /// client is disconnected, so its re-watch gets 410 and it must relist to see them.
    pub fn hold_watches(&self, hold: bool) {
        self.core.faults.hold_watches.send_replace(hold);
    }

    /// Failures still to be served from the last [`fail_next`](Self::fail_next).
    pub fn pending_failures(&self) -> u32 {
        self.core.faults.fail_next.load(Ordering::SeqCst)
    }

    /// Number of watches currently open.
    pub fn open_watches(&self) -> usize {
        self.core.lock().watch_count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fail_next_counts_down() {
        let f = FaultState::default();
        f.fail_next.store(2, Ordering::SeqCst);
        f.fail_code.store(429, Ordering::SeqCst);
        assert_eq!(f.take_failure().map(|e| e.code), Some(429));
        assert!(f.take_failure().is_some());
        assert!(f.take_failure().is_none());
    }
}
