//! What a relay counts, per target, served as OpenMetrics on `/metrics`
//! (`--metrics-listen`, [`Metrics::health`]), with [`prometheus_client`] as every component.
//!
//! - `fleetwatch_relay_delivered_total{relay,target}`: events (or requests made of them) the
//!   target accepted with a 2xx, then acknowledged to the hub.
//! - `fleetwatch_relay_retries_total{relay,target}`: requests that failed for a passing
//!   reason (5xx, a 4xx other than 400/413/422 — 401, 403, 404, 405, 408, 429 … —,
//!   timeout, connection) and are retried with backoff; alert `FleetwatchRelayNotDelivering`.
//! - `fleetwatch_relay_skipped_4xx_total{relay,target}`: events the target refused for good
//!   (400, 413, 422): logged once per cause, skipped.
//! - `fleetwatch_relay_refused_total{relay,target,reason}`: events the relay did not send
//!   (`too-large` for the target's body limit, `no-identity` when no certificate could be minted).
//! - `fleetwatch_relay_filtered_total{relay}`: events not meant for this relay (type
//!   prefix, watch name), acknowledged without sending.
//! - `fleetwatch_relay_resyncs_total{relay,how}`: resync-required markers handled
//!   (`objects`: one request per known object, `fallback`: the documented fallback).
//! - `fleetwatch_relay_ready{relay}`: 1 while `/readyz` answers 200 (subscribed, no target
//!   failing [`NOT_READY_AFTER_FAILURES`] requests in a row), else 0; read at each scrape.
//! - `fleetwatch_relay_dead_lettered_total{relay,target}`: requests kept in the
//!   `--dead-letter` file; alert `FleetwatchRelayDeadLettering`.
//! - `fleetwatch_relay_client_certificate_expiry_timestamp_seconds{relay}`: when the
//!   subscriber certificate in use expires (read at scrape time; the relay follows its
//!   certificate files, so a renewal moves it). Absent until the relay subscribed.
//!
//! Labels are bounded: targets come from the configuration (a fixed URL, or one per
//! component listener), reasons are a fixed set.

use fleetwatch_client::client_tls::ClientTls;
use fleetwatch_telemetry::collect::gauges;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter as PromCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// One counter family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Counter {
    /// Accepted by the target.
    Delivered,
    /// Failed for a passing reason, retried.
    Retries,
    /// Refused for good by the target (400, 413, 422), skipped.
    Skipped4xx,
    /// Refused for good by the target and kept in the dead-letter file.
    DeadLettered,
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

/// Labels: the relay and a target.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TargetLabels {
    relay: String,
    target: String,
}

/// Labels: the relay, a target and why an event was not sent to it.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    relay: String,
    target: String,
    reason: String,
}

/// Label: the relay.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RelayLabel {
    relay: String,
}

/// Labels: the relay and how a resync marker was handled.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ResyncLabels {
    relay: String,
    how: String,
}

/// The expiry of the subscriber certificate in use, read at scrape time.
#[derive(Debug, Default)]
struct ClientCertificate {
    relay: String,
    tls: std::sync::OnceLock<ClientTls>,
}

impl Collector for ClientCertificate {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(info) = self.tls.get().and_then(ClientTls::certificate) else { return Ok(()) };
        gauges(
            &mut encoder,
            "client_certificate_expiry_timestamp_seconds",
            "When the subscriber certificate in use expires (Unix time; renewed files are followed)",
            [(&RelayLabel { relay: self.relay.clone() }, info.not_after.as_second())],
        )
    }
}

fleetwatch_telemetry::instruments! {
    /// The relay's counters, with [`prometheus_client`]: one entry each, registered in this
    /// order (the exposition's), then the certificate expiry read at scrape time.
    #[derive(Debug)]
    pub struct Metrics {
        delivered: Family<TargetLabels, PromCounter> = Family::default()
            => "delivered", "Events the target accepted (2xx), then acknowledged to the hub";
        retries: Family<TargetLabels, PromCounter> = Family::default()
            => "retries", "Requests that failed for a passing reason (5xx, a 4xx other than 400/413/422, timeout, connection), retried";
        skipped_4xx: Family<TargetLabels, PromCounter> = Family::default()
            => "skipped_4xx", "Events the target refused for good (400, 413, 422), logged once per cause and skipped";
        dead_lettered: Family<TargetLabels, PromCounter> = Family::default()
            => "dead_lettered", "Requests the target refused for good (400, 413, 422), kept in the --dead-letter file, then acknowledged";
        refused: Family<RefusedLabels, PromCounter> = Family::default()
            => "refused", "Events the relay did not send (too large, no identity)";
        filtered: Family<RelayLabel, PromCounter> = Family::default()
            => "filtered", "Events not meant for this relay, acknowledged without sending";
        resyncs: Family<ResyncLabels, PromCounter> = Family::default()
            => "resyncs", "Resync-required markers handled, by how";
        /// 1 while ready, set at each encode from [`Metrics::readiness`].
        ready: Family<RelayLabel, Gauge> = Family::default()
            => "ready", "1 while /readyz answers 200 (subscribed to the hub, no target failing requests in a row), else 0";
        /// The relay's name (`webhook`, `klm`; given to [`Metrics::new`]): a label of every family.
        relay: String = String::new();
        /// Where they are registered, under the prefix `fleetwatch_relay`.
        registry: Registry = Registry::default();
        /// Per target: requests failed in a row since its last delivery (for `/readyz`).
        failing: std::sync::Mutex<std::collections::BTreeMap<String, u64>> = Default::default();
        /// Whether the relay has subscribed to the hub.
        subscribed: std::sync::atomic::AtomicBool = Default::default();
        /// The subscriber certificate's expiry (labelled with the relay by [`Metrics::new`]).
        client_certificate: std::sync::Arc<ClientCertificate> = std::sync::Arc::default();
    }
}

/// Requests in a row to one target that fail before `/readyz` says not ready.
pub const NOT_READY_AFTER_FAILURES: u64 = 3;

impl Metrics {
    /// Counters of the relay `relay` (`webhook`, `klm`).
    pub fn new(relay: &str) -> Self {
        let mut registry = Registry::with_prefix("fleetwatch_relay");
        let client_certificate =
            std::sync::Arc::new(ClientCertificate { relay: relay.into(), tls: std::sync::OnceLock::new() });
        let m = Self { relay: relay.into(), client_certificate, ..Self::unregistered() };
        m.register(&mut registry);
        registry.register_collector(Box::new(m.client_certificate.clone()));
        // Every family is served from the start (dashboards see a series before the first
        // event; rate() works at once).
        let _ = m.filtered.get_or_create(&RelayLabel { relay: relay.into() });
        for how in ["objects", "fallback", "unresolved"] {
            let _ = m.resyncs.get_or_create(&ResyncLabels { relay: relay.into(), how: how.into() });
        }
        Self { registry, ..m }
    }

    fn family(&self, counter: Counter) -> &Family<TargetLabels, PromCounter> {
        match counter {
            Counter::Delivered => &self.delivered,
            Counter::Retries => &self.retries,
            Counter::Skipped4xx => &self.skipped_4xx,
            Counter::DeadLettered => &self.dead_lettered,
        }
    }

    fn target(&self, target: &str) -> TargetLabels {
        TargetLabels { relay: self.relay.clone(), target: target.into() }
    }

    fn refusal(&self, why: Refused, target: &str) -> RefusedLabels {
        RefusedLabels { relay: self.relay.clone(), target: target.into(), reason: why.label().into() }
    }

    /// Makes `target`'s counters exist (at 0), so every family is served from the start.
    pub fn register_target(&self, target: &str) {
        for k in [Counter::Delivered, Counter::Retries, Counter::Skipped4xx, Counter::DeadLettered] {
            let _ = self.family(k).get_or_create(&self.target(target));
        }
        let _ = self.refused.get_or_create(&self.refusal(Refused::TooLarge, target));
    }

    /// Adds `n` to a counter of `target`.
    pub fn add(&self, counter: Counter, target: &str, n: u64) {
        self.family(counter).get_or_create(&self.target(target)).inc_by(n);
        if let Ok(mut f) = self.failing.lock() {
            match counter {
                Counter::Retries => *f.entry(target.to_string()).or_default() += n,
                Counter::Delivered | Counter::Skipped4xx | Counter::DeadLettered => {
                    f.remove(target);
                }
            }
        }
    }

    /// The TLS settings the relay subscribes with, for the certificate expiry gauge (the
    /// first one set stays).
    pub fn set_client_tls(&self, tls: ClientTls) {
        let _ = self.client_certificate.tls.set(tls);
    }

    /// Marks the relay subscribed to the hub.
    pub fn set_subscribed(&self) {
        self.subscribed.store(true, std::sync::atomic::Ordering::Relaxed);
    }

    /// `/readyz`: ready once subscribed, while no target failed
    /// [`NOT_READY_AFTER_FAILURES`] requests in a row (the relay retries them and delivers
    /// nothing meanwhile). `Err` says why not.
    pub fn readiness(&self) -> Result<(), String> {
        if !self.subscribed.load(std::sync::atomic::Ordering::Relaxed) {
            return Err("not subscribed to the hub yet".into());
        }
        let f = self.failing.lock().map_err(|_| "state poisoned".to_string())?;
        let failing: Vec<String> = f
            .iter()
            .filter(|(_, n)| **n >= NOT_READY_AFTER_FAILURES)
            .map(|(t, n)| format!("{t}: {n} requests failed in a row (retried; see the relay log)"))
            .collect();
        if failing.is_empty() { Ok(()) } else { Err(failing.join("; ")) }
    }

    /// Counts an event not sent to `target` (empty when there is none) for `why`.
    pub fn refused(&self, why: Refused, target: &str) {
        self.refused.get_or_create(&self.refusal(why, target)).inc();
    }

    /// Counts events not meant for this relay.
    pub fn filtered(&self, n: u64) {
        self.filtered.get_or_create(&RelayLabel { relay: self.relay.clone() }).inc_by(n);
    }

    /// Counts a resync-required marker handled `how` (`objects`, `fallback`, `unresolved`).
    pub fn resync(&self, how: &'static str) {
        self.resyncs.get_or_create(&ResyncLabels { relay: self.relay.clone(), how: how.into() }).inc();
    }

    /// The value of a counter (tests, logs).
    pub fn get(&self, counter: Counter, target: &str) -> u64 {
        self.family(counter).get(&self.target(target)).map_or(0, |c| c.get())
    }

    /// The value of a refusal counter (tests, logs).
    pub fn get_refused(&self, why: Refused, target: &str) -> u64 {
        self.refused.get(&self.refusal(why, target)).map_or(0, |c| c.get())
    }

    /// The OpenMetrics text exposition, closed with `# EOF`.
    pub fn encode(&self) -> String {
        self.ready.get_or_create(&RelayLabel { relay: self.relay.clone() }).set(i64::from(self.readiness().is_ok()));
        fleetwatch_telemetry::exposition::encode_component(&[&self.registry])
    }

    /// The relay's health and metrics endpoint (`--metrics-listen`): `/metrics` from these
    /// counters, `/readyz` from [`Metrics::readiness`], `/healthz` while the process answers.
    pub fn health(self: &std::sync::Arc<Self>) -> fleetwatch_telemetry::Health {
        let (encode, ready) = (self.clone(), self.clone());
        fleetwatch_telemetry::Health::new(move || encode.encode())
            .ready(move || std::future::ready(ready.readiness().map(|()| String::new())))
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

    #[test]
    fn ready_follows_readyz() {
        let m = Metrics::new("klm");
        m.register_target("t");
        let ready = |m: &Metrics| {
            m.encode()
                .lines()
                .find_map(|l| l.strip_prefix("fleetwatch_relay_ready{relay=\"klm\"} ").map(str::to_string))
        };
        assert_eq!(ready(&m).as_deref(), Some("0"), "not subscribed yet");
        m.set_subscribed();
        assert_eq!(ready(&m).as_deref(), Some("1"));
        m.add(Counter::Retries, "t", NOT_READY_AFTER_FAILURES);
        assert!(m.readiness().is_err());
        assert_eq!(ready(&m).as_deref(), Some("0"), "a target failing in a row");
        m.add(Counter::Delivered, "t", 1);
        assert_eq!(ready(&m).as_deref(), Some("1"));
    }
}
