//! A token bucket: how long to delay an ack so an agent stays within its event rate.
//!
//! Resync markers are counted too, at [`resync_cost`]: each one makes every subscriber
//! reconcile a whole cluster, so a stream of them must not be cheaper than events.

use std::time::{Duration, Instant};

/// Allows `rate` events per second on average, bursts up to one second's worth.
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

/// What one resync marker costs in the bucket: a second's worth of events, about what a
/// full reconcile of a cluster costs its subscribers. An agent can thus record at most
/// one resync per second (fewer when it also sends events).
pub fn resync_cost(rate: u32) -> usize {
    rate.max(1) as usize
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: u32) -> Self {
        Self::new_at(rate, Instant::now())
    }

    fn new_at(rate: u32, now: Instant) -> Self {
        let rate = f64::from(rate.max(1));
        Self { rate, tokens: rate, last: now }
    }

    /// Takes `n` tokens; returns how long to wait before they are earned.
    pub fn take(&mut self, n: usize) -> Duration {
        self.take_at(n, Instant::now())
    }

    fn take_at(&mut self, n: usize, now: Instant) -> Duration {
        self.tokens = (self.tokens + now.saturating_duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
        self.last = now;
        self.tokens -= n as f64;
        if self.tokens >= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(-self.tokens / self.rate) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_beyond_the_rate() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new_at(100, t0);
        assert_eq!(b.take_at(100, t0), Duration::ZERO);
        assert_eq!(b.take_at(50, t0), Duration::from_millis(500));
        // Half a second later the debt is paid: the next token waits 10 ms.
        assert_eq!(b.take_at(1, t0 + Duration::from_millis(500)), Duration::from_millis(10));
    }

    #[test]
    fn resyncs_are_limited_to_about_one_per_second() {
        let t0 = Instant::now();
        let mut b = TokenBucket::new_at(10, t0);
        let cost = resync_cost(10);
        // The first resync uses the burst; 100 more in a burst owe 100 seconds.
        assert_eq!(b.take_at(cost, t0), Duration::ZERO);
        let mut wait = Duration::ZERO;
        for _ in 0..100 {
            wait = b.take_at(cost, t0);
        }
        assert_eq!(wait, Duration::from_secs(100));
    }
}
