//! Token buckets: how long to delay an ack so an agent stays within its rates.
//!
//! Each cluster has a [`Budget`]: events per second (`--max-events-per-sec`, bursts of one
//! second's worth), and resync markers, which make every subscriber reconcile a whole
//! cluster: at most [`RESYNCS_PER_SEC`] on average with bursts of [`RESYNC_BURST`], each
//! also counted as one event. A separate budget, rather than a resync costing many events,
//! keeps a legitimate resync (an outbox overflow) from stalling the event acks behind it,
//! which would overflow the outbox again.

use std::time::Duration;

// tokio's clock: the same as std's in programs, the simulated one in `fleetwatch-dst`.
use tokio::time::Instant;

/// Resync markers per second an agent may send on average.
pub(crate) const RESYNCS_PER_SEC: f64 = 1.0;
/// Resync markers an agent may send in a burst.
pub(crate) const RESYNC_BURST: f64 = 5.0;

/// Allows `rate` tokens per second on average, bursts up to `burst`.
pub(crate) struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    fn with_burst(rate: f64, burst: f64, now: Instant) -> Self {
        Self { rate, burst, tokens: burst, last: now }
    }

    fn take_at(&mut self, n: usize, now: Instant) -> Duration {
        self.tokens =
            (self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * self.rate).min(self.burst);
        self.last = now;
        self.tokens -= n as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

/// One cluster's rate budget, kept across its sessions.
pub(crate) struct Budget {
    events: TokenBucket,
    resyncs: TokenBucket,
}

impl Budget {
    /// A full budget of `events_per_sec`.
    pub(crate) fn new(events_per_sec: u32) -> Self {
        Self::new_at(events_per_sec, Instant::now())
    }

    fn new_at(events_per_sec: u32, now: Instant) -> Self {
        let rate = f64::from(events_per_sec.max(1));
        Self {
            events: TokenBucket::with_burst(rate, rate, now),
            resyncs: TokenBucket::with_burst(RESYNCS_PER_SEC, RESYNC_BURST, now),
        }
    }

    /// Takes `n` events; returns how long to delay their ack.
    pub(crate) fn take_events(&mut self, n: usize) -> Duration {
        self.events.take_at(n, Instant::now())
    }

    /// Takes one resync (and one event); returns how long to delay its ack.
    pub(crate) fn take_resync(&mut self) -> Duration {
        self.take_resync_at(Instant::now())
    }

    fn take_resync_at(&mut self, now: Instant) -> Duration {
        self.events.take_at(1, now).max(self.resyncs.take_at(1, now))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_beyond_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::with_burst(100.0, 100.0, t0);
        assert_eq!(b.take_at(100, t0), Duration::ZERO);
        assert_eq!(b.take_at(50, t0), Duration::from_millis(500));
        // Half a second later the debt is paid: the next token waits 10 ms.
        assert_eq!(b.take_at(1, t0 + Duration::from_millis(500)), Duration::from_millis(10));
    }

    #[test]
    fn a_flood_of_resyncs_is_held_to_about_one_per_second() {
        let t0 = Instant::now();
        let mut b = Budget::new_at(10, t0);
        // A burst of five passes; 100 more at once owe 100 seconds.
        for _ in 0..5 {
            assert_eq!(b.take_resync_at(t0), Duration::ZERO);
        }
        let mut wait = Duration::ZERO;
        for _ in 0..100 {
            wait = b.take_resync_at(t0);
        }
        assert_eq!(wait, Duration::from_secs(100));
    }

    #[test]
    fn a_few_resyncs_do_not_delay_events() {
        let t0 = Instant::now();
        let mut b = Budget::new_at(1000, t0);
        assert_eq!(b.take_resync_at(t0), Duration::ZERO);
        assert_eq!(b.take_resync_at(t0), Duration::ZERO);
        // Two events' worth taken of a thousand: events flow on.
        assert_eq!(b.events.take_at(998, t0), Duration::ZERO);
    }
}
