//! The reconnect backoff of everything that keeps a connection to the hub open: the
//! subscriber client and the agent's uplink.
//!
//! Both reconnect forever. Exponential delays keep a dead hub from being hammered, and
//! jitter spreads a fleet's reconnects after a hub restart instead of having every agent
//! and subscriber come back in the same instant. Each connection owns its own iterator
//! (restarted after a successful session), built from [`Reconnect`] settings.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBuilder};

/// Settings of a reconnect backoff: exponential from `min` to `max`, with jitter, forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reconnect {
    /// The first delay (before jitter).
    pub min: Duration,
    /// The largest delay (before jitter).
    pub max: Duration,
}

impl Default for Reconnect {
    /// From 100 ms to 5 s.
    fn default() -> Self {
        Self { min: Duration::from_millis(100), max: Duration::from_secs(5) }
    }
}

impl Reconnect {
    /// The delays, fresh from the first. Jitter adds up to the delay itself, so each is
    /// between the exponential step and twice it.
    pub fn delays(&self) -> impl Iterator<Item = Duration> + Send + use<> {
        ExponentialBuilder::default()
            .with_min_delay(self.min)
            .with_max_delay(self.max)
            .with_jitter()
            .without_max_times()
            .build()
    }
}

/// The time one connect attempt may take, longer after each attempt that timed out.
///
/// In a reconnect storm the hub leaves connections it has no handshake place for in its
/// listen backlog, served in order as places free. A client that gives up after a fixed
/// timeout and tries again joins the end of the queue, and the hub may already have done the
/// work of the attempt it gave up on: with 50,000 agents on the 10 s default, most of the
/// hubs' work went to attempts abandoned that way. Doubling the wait after each timed-out
/// attempt (up to `max`, back to the configured one after a connection) lets a client that
/// was queued keep its place, while a dead address still fails fast (refused, reset).
///
/// ```
/// use std::time::Duration;
/// use fleetwatch_client::backoff::ConnectWait;
/// let mut w = ConnectWait::new(Duration::from_secs(10));
/// w.timed_out();
/// assert_eq!(w.current(), Duration::from_secs(20));
/// w.connected();
/// assert_eq!(w.current(), Duration::from_secs(10));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectWait {
    base: Duration,
    max: Duration,
    current: Duration,
}

/// The longest a connect attempt waits after repeated timeouts (unless the configured
/// timeout is longer).
pub const CONNECT_WAIT_MAX: Duration = Duration::from_secs(80);

impl ConnectWait {
    /// Starting at `base`, doubling up to [`CONNECT_WAIT_MAX`] (or `base` when longer).
    pub fn new(base: Duration) -> Self {
        Self { base, max: base.max(CONNECT_WAIT_MAX), current: base }
    }

    /// The time the next attempt may take.
    pub fn current(&self) -> Duration {
        self.current
    }

    /// The last attempt timed out: wait longer next time.
    pub fn timed_out(&mut self) {
        self.current = self.current.saturating_mul(2).min(self.max);
    }

    /// A connection was made: back to the configured time.
    pub fn connected(&mut self) {
        self.current = self.base;
    }
}

/// The default reconnect delays: exponential from 100 ms to 5 s, with jitter, forever.
pub fn reconnect() -> impl Iterator<Item = Duration> + Send {
    Reconnect::default().delays()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grows_to_the_bound_and_never_ends() {
        let r = Reconnect { min: Duration::from_millis(10), max: Duration::from_millis(80) };
        let delays: Vec<Duration> = r.delays().take(50).collect();
        assert_eq!(delays.len(), 50, "a reconnect backoff never gives up");
        assert!(delays[0] >= r.min && delays[0] <= 2 * r.min, "{:?}", delays[0]);
        assert!(delays.iter().all(|d| *d <= 2 * r.max), "{delays:?}");
        // Late delays sit at the bound (jitter only adds).
        assert!(delays[40..].iter().all(|d| *d >= r.max), "{delays:?}");
    }

    #[test]
    fn a_connect_wait_doubles_after_timeouts_up_to_the_bound_and_resets() {
        let mut w = ConnectWait::new(Duration::from_secs(10));
        let seen: Vec<u64> = (0..5)
            .map(|_| {
                w.timed_out();
                w.current().as_secs()
            })
            .collect();
        assert_eq!(seen, vec![20, 40, 80, 80, 80]);
        w.connected();
        assert_eq!(w.current(), Duration::from_secs(10));
        // A configured timeout above the bound is kept, never shortened.
        let mut long = ConnectWait::new(Duration::from_secs(120));
        long.timed_out();
        assert_eq!(long.current(), Duration::from_secs(120));
    }

    #[test]
    fn default_is_100ms_to_5s() {
        let d: Vec<Duration> = reconnect().take(30).collect();
        assert!(d[0] >= Duration::from_millis(100) && d[0] <= Duration::from_millis(200), "{:?}", d[0]);
        assert!(d.iter().all(|x| *x <= Duration::from_secs(10)));
    }
}
