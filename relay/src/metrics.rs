//! What a relay counts, per target, served as Prometheus text on `/metrics`
//! (`--metrics-listen`).
//!
//! - `fleetwatch_relay_delivered_total{relay,target}`: events (or requests made of them) the
//!   target accepted with a 2xx, then acknowledged to the hub.
//! - `fleetwatch_relay_retries_total{relay,target}`: requests that failed for a passing
//!   reason (5xx, 408, 429, timeout, connection) and are retried with backoff.
//! - `fleetwatch_relay_skipped_4xx_total{relay,target}`: events the target refused for good
//!   (another 4xx): logged once per cause, skipped.
//! - `fleetwatch_relay_refused_total{relay,target,reason}`: events the relay did not send
//!   (`too-large` for the target's body limit, `no-identity` when no certificate could be minted).
//! - `fleetwatch_relay_filtered_total{relay}`: events not meant for this relay (type
//!   prefix, watch name), acknowledged without sending.
//! - `fleetwatch_relay_resyncs_total{relay,how}`: resync-required markers handled
//!   (`objects`: one request per known object, `fallback`: the documented fallback).
//!
//! Labels are bounded: targets come from the configuration (a fixed URL, or one per
//! component listener), reasons are a fixed set.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::sync::Mutex;

/// One counter family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// Accepted by the target.
    Delivered,
    /// Failed for a passing reason, retried.
    Retries,
    /// Refused for good by the target (4xx), skipped.
    Skipped4xx,
}

impl Counter {
    fn name(self) -> &'static str {
        match self {
            Counter::Delivered => "fleetwatch_relay_delivered",
            Counter::Retries => "fleetwatch_relay_retries",
            Counter::Skipped4xx => "fleetwatch_relay_skipped_4xx",
        }
    }

    fn help(self) -> &'static str {
        match self {
            Counter::Delivered => "Events the target accepted (2xx), then acknowledged to the hub",
            Counter::Retries => {
                "Requests that failed for a passing reason (5xx, 408, 429, timeout, connection), retried"
            }
            Counter::Skipped4xx => "Events the target refused for good (4xx), logged once per cause and skipped",
        }
    }
}

/// Why the relay did not send an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Refused {
    /// The request body would exceed the target's limit.
    TooLarge,
    /// No identity could be minted for the cluster.
    NoIdentity,
}

impl Refused {
    fn label(self) -> &'static str {
        match self {
            Refused::TooLarge => "too-large",
            Refused::NoIdentity => "no-identity",
        }
    }
}

/// The relay's counters.
#[derive(Debug)]
pub struct Metrics {
    relay: String,
    counters: Mutex<BTreeMap<(Counter, String), u64>>,
    refused: Mutex<BTreeMap<(Refused, String), u64>>,
    filtered: Mutex<u64>,
    resyncs: Mutex<BTreeMap<&'static str, u64>>,
}

fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Metrics {
    /// Counters of the relay `relay` (`webhook`, `klm`).
    pub fn new(relay: &str) -> Self {
        let resyncs = [("objects", 0), ("fallback", 0), ("unresolved", 0)].into_iter().collect();
        Self {
            relay: relay.into(),
            counters: Default::default(),
            refused: Default::default(),
            filtered: Mutex::new(0),
            resyncs: Mutex::new(resyncs),
        }
    }

    /// Makes `target`'s counters exist (at 0), so every family is served from the start.
    pub fn register_target(&self, target: &str) {
        if let Ok(mut c) = self.counters.lock() {
            for k in [Counter::Delivered, Counter::Retries, Counter::Skipped4xx] {
                c.entry((k, target.to_string())).or_insert(0);
            }
        }
        if let Ok(mut r) = self.refused.lock() {
            r.entry((Refused::TooLarge, target.to_string())).or_insert(0);
        }
    }

    /// Adds `n` to a counter of `target`.
    pub fn add(&self, counter: Counter, target: &str, n: u64) {
        if let Ok(mut c) = self.counters.lock() {
            *c.entry((counter, target.to_string())).or_insert(0) += n;
        }
    }

    /// Counts an event not sent to `target` (empty when there is none) for `why`.
    pub fn refused(&self, why: Refused, target: &str) {
        if let Ok(mut r) = self.refused.lock() {
            *r.entry((why, target.to_string())).or_insert(0) += 1;
        }
    }

    /// Counts events not meant for this relay.
    pub fn filtered(&self, n: u64) {
        if let Ok(mut f) = self.filtered.lock() {
            *f += n;
        }
    }

    /// Counts a resync-required marker handled `how` (`objects`, `fallback`, `unresolved`).
    pub fn resync(&self, how: &'static str) {
        if let Ok(mut r) = self.resyncs.lock() {
            *r.entry(how).or_insert(0) += 1;
        }
    }

    /// The value of a counter (tests, logs).
    pub fn get(&self, counter: Counter, target: &str) -> u64 {
        self.counters.lock().ok().and_then(|c| c.get(&(counter, target.to_string())).copied()).unwrap_or(0)
    }

    /// The value of a refusal counter (tests, logs).
    pub fn get_refused(&self, why: Refused, target: &str) -> u64 {
        self.refused.lock().ok().and_then(|c| c.get(&(why, target.to_string())).copied()).unwrap_or(0)
    }

    /// The Prometheus text exposition (OpenMetrics, closed with `# EOF`).
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let relay = escape(&self.relay);
        let family = |out: &mut String, name: &str, help: &str| {
            let _ = write!(out, "# HELP {name} {help}.\n# TYPE {name} counter\n");
        };
        let counters = self.counters.lock().map(|c| c.clone()).unwrap_or_default();
        for kind in [Counter::Delivered, Counter::Retries, Counter::Skipped4xx] {
            family(&mut out, kind.name(), kind.help());
            for ((k, target), v) in &counters {
                if *k == kind {
                    let _ =
                        writeln!(out, "{}_total{{relay=\"{relay}\",target=\"{}\"}} {v}", kind.name(), escape(target));
                }
            }
        }
        family(&mut out, "fleetwatch_relay_refused", "Events the relay did not send (too large, no identity)");
        for ((why, target), v) in self.refused.lock().map(|r| r.clone()).unwrap_or_default() {
            let _ = writeln!(
                out,
                "fleetwatch_relay_refused_total{{relay=\"{relay}\",target=\"{}\",reason=\"{}\"}} {v}",
                escape(&target),
                why.label()
            );
        }
        family(&mut out, "fleetwatch_relay_filtered", "Events not meant for this relay, acknowledged without sending");
        let filtered = self.filtered.lock().map(|f| *f).unwrap_or(0);
        let _ = writeln!(out, "fleetwatch_relay_filtered_total{{relay=\"{relay}\"}} {filtered}");
        family(&mut out, "fleetwatch_relay_resyncs", "Resync-required markers handled, by how");
        for (how, v) in self.resyncs.lock().map(|r| r.clone()).unwrap_or_default() {
            let _ = writeln!(out, "fleetwatch_relay_resyncs_total{{relay=\"{relay}\",how=\"{how}\"}} {v}");
        }
        out.push_str("# EOF\n");
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn families_are_served_from_the_start_and_count() {
        let m = Metrics::new("webhook");
        m.register_target("http://x/\"y");
        let text = m.encode();
        assert!(
            text.contains("fleetwatch_relay_delivered_total{relay=\"webhook\",target=\"http://x/\\\"y\"} 0"),
            "{text}"
        );
        assert!(text.contains("fleetwatch_relay_skipped_4xx_total"), "{text}");
        m.add(Counter::Delivered, "http://x/\"y", 3);
        m.refused(Refused::TooLarge, "t");
        m.filtered(2);
        let text = m.encode();
        assert!(text.contains("target=\"http://x/\\\"y\"} 3"), "{text}");
        assert!(text.contains("fleetwatch_relay_refused_total{relay=\"webhook\",target=\"t\",reason=\"too-large\"} 1"));
        assert!(text.contains("fleetwatch_relay_filtered_total{relay=\"webhook\"} 2"));
        assert!(text.ends_with("# EOF\n"));
    }
}
