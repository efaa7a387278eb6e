//! fleetwatch's relays: durable hub subscribers that hand each event to another system and
//! acknowledge the hub only after that system accepted it (a 2xx).
//!
//! Each relay is a [`fleetwatch_client::sink::Sink`]; [`fleetwatch_client::sink::pump`]
//! does the acknowledging and the retrying (with backoff) of deliveries a sink refuses.
//!
//! - [`webhook`]: every event as a structured CloudEvent (or a batch of them) to any HTTP
//!   endpoint, optionally signed with HMAC-SHA256.
//! - [`klm`]: Kyma runtime-watcher's v2 listener contract, so lifecycle-manager runs
//!   unchanged with fleetwatch in place of its watcher; the runtime's identity travels in
//!   `X-Forwarded-Client-Cert` with a certificate minted per cluster ([`identity`]).
//! - [`watchers`]: lifecycle-manager's `Watcher` resources turned into WatchConfigs and
//!   routes to each component's listener.
//!
//! [`http`] is the one HTTP client and the classification of answers both relays share;
//! [`metrics`] counts what happened per target.

pub mod dead_letter;
pub mod http;
pub mod identity;
pub mod klm;
pub mod metrics;
pub mod watchers;
pub mod webhook;

/// A small set of causes already logged, so a repeated failure is logged once, not once
/// per event. Bounded: past `cap` entries the oldest cause is forgotten (and would be
/// logged again), which keeps memory fixed whatever the targets answer.
#[derive(Debug)]
pub(crate) struct SaidOnce {
    seen: std::collections::VecDeque<String>,
    cap: usize,
}

impl SaidOnce {
    pub(crate) fn new(cap: usize) -> Self {
        Self { seen: Default::default(), cap: cap.max(1) }
    }

    /// Whether `cause` is new (then it is remembered).
    pub(crate) fn first(&mut self, cause: &str) -> bool {
        if self.seen.iter().any(|c| c == cause) {
            return false;
        }
        if self.seen.len() >= self.cap {
            self.seen.pop_front();
        }
        self.seen.push_back(cause.to_string());
        true
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn said_once_is_bounded() {
        let mut s = super::SaidOnce::new(2);
        assert!(s.first("a"));
        assert!(!s.first("a"));
        assert!(s.first("b"));
        assert!(s.first("c"));
        assert!(s.first("a"), "the oldest was forgotten");
        assert_eq!(s.seen.len(), 2);
    }
}
