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
    fn default_is_100ms_to_5s() {
        let d: Vec<Duration> = reconnect().take(30).collect();
        assert!(d[0] >= Duration::from_millis(100) && d[0] <= Duration::from_millis(200), "{:?}", d[0]);
        assert!(d.iter().all(|x| *x <= Duration::from_secs(10)));
    }
}
