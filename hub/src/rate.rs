//! A token bucket: how long to delay an ack so an agent stays within its event rate.

use std::time::{Duration, Instant};

/// Allows `rate` events per second on average, bursts up to one second's worth.
pub struct TokenBucket {
    rate: f64,
    tokens: f64,
    last: Instant,
}

impl TokenBucket {
    /// A full bucket.
    pub fn new(rate: u32) -> Self {
        let rate = f64::from(rate.max(1));
        Self { rate, tokens: rate, last: Instant::now() }
    }

    /// Takes `n` tokens; returns how long to wait before they are earned.
    pub fn take(&mut self, n: usize) -> Duration {
        let now = Instant::now();
        self.tokens = (self.tokens + now.duration_since(self.last).as_secs_f64() * self.rate).min(self.rate);
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
        let mut b = TokenBucket::new(100);
        assert_eq!(b.take(100), Duration::ZERO);
        let wait = b.take(50);
        assert!(wait >= Duration::from_millis(450) && wait <= Duration::from_millis(510), "{wait:?}");
    }
}
