//! Prometheus metrics of the hub.
//!
//! Two kinds, both with [`prometheus_client`]: instruments kept up to date where things
//! happen (counters, gauges, the append histogram; [`Metrics`]), and state read at scrape
//! time (bus size, per-cluster liveness, certificate expiry, subscriber lag from
//! [`crate::fanout`]; the collector in `scrape.rs`), because keeping those current on every event would cost the hot path
//! for a number read every few seconds. The admin endpoint answers `/metrics` with both
//! through [`fleetwatch_telemetry`]. The names are a contract with
//! `deploy/observability/` (dashboard and alert rules), checked by a test against a
//! running hub.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Label: a rejection or error reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ReasonLabel {
    /// The reason.
    pub reason: String,
}

/// Label: the role of a session (`agent` or `subscriber`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RoleLabel {
    /// `agent` or `subscriber`.
    pub role: String,
}

/// Labels: the role of a session and why it ended.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DisconnectLabel {
    /// `agent` or `subscriber`.
    pub role: String,
    /// Why: the error code sent (`replaced`, `shutting-down`, `forbidden`, ...), the close's
    /// label (`idle-timeout`, `too-large`, `stalled`) or `peer-closed`.
    pub reason: String,
}

/// Why a connection fails before its session begins: the `reason` labels of
/// `handshake_failures`.
pub const HANDSHAKE_FAILURES: &[&str] =
    &["tls-handshake", "ws-handshake", "handshake-timeout", "no-identity", "trust-domain", "revoked", "wrong-role"];

fleetwatch_telemetry::instruments! {
    /// All hub metrics: the instruments, one entry each (name and HELP text beside the
    /// field; registered in this order, the exposition's), and their registry.
    pub struct Metrics {
        /// Agent sessions open now.
        pub agent_sessions: Gauge = Gauge::default() => "agent_sessions", "Agent sessions open";
        /// Subscriber sessions open now.
        pub subscriber_sessions: Gauge = Gauge::default() => "subscriber_sessions", "Subscriber sessions open";
        /// Events accepted into the bus.
        pub events_received: Counter = Counter::default() => "events_received", "Events accepted into the bus";
        /// Events delivered to subscribers.
        pub events_delivered: Counter = Counter::default() => "events_delivered", "Events sent to subscribers";
        /// Resync-required markers recorded.
        pub resyncs: Counter = Counter::default() => "resyncs", "Resync-required markers recorded";
        /// Connections refused or closed for a reason.
        pub rejected: Family<ReasonLabel, Counter> = Family::default()
            => "rejected", "Connections or messages rejected, by reason";
        /// Seconds a bus append took (includes fsync with a data directory).
        pub append_seconds: Histogram = Histogram::new(exponential_buckets(0.0001, 2.0, 16))
            => "bus_append_seconds", "Time to append a batch to the bus";
        /// Seconds acks were delayed by rate limiting.
        pub throttled_seconds: Counter<f64, AtomicU64> = Counter::default()
            => "throttled_seconds", "Time acks were delayed by rate limits";
        /// 1 while the deny list file cannot be used and the last good list is in force.
        pub deny_list_stale: Gauge = Gauge::default()
            => "deny_list_stale", "Whether the deny list file is unusable and the last good list is in force (1) or not (0)";
        /// Times the deny list file was found unusable.
        pub deny_list_errors: Counter = Counter::default()
            => "deny_list_errors", "Times the deny list file was unusable";
        /// 1 while the access policy file cannot be used and the last good policy is in force.
        pub access_policy_stale: Gauge = Gauge::default()
            => "access_policy_stale", "Whether the access policy file is unusable and the last good policy is in force (1) or not (0)";
        /// Live sessions closed because their certificate expired or its CA left the bundle.
        pub sessions_expired: Family<ReasonLabel, Counter> = Family::default()
            => "sessions_ended", "Live sessions closed because their certificate is no longer valid, by reason";
        /// Agents refused because their cluster id was already connected from elsewhere.
        pub cluster_conflicts: Counter = Counter::default()
            => "cluster_conflicts", "Agents refused because their cluster id was already connected";
        /// Resync markers acked without storing: one was already pending for the cluster.
        pub resyncs_coalesced: Counter = Counter::default()
            => "resyncs_coalesced", "Resync markers acked without storing (one already pending)";
        /// Keep-alive pings sent to agents.
        pub pings_sent: Counter = Counter::default() => "agent_pings", "Keep-alive pings sent to agents";
        /// Subscribers disconnected because they did not drain within the stall timeout.
        pub subscriber_stalls: Counter = Counter::default()
            => "subscriber_stalls", "Subscribers disconnected for not draining within the stall timeout";
        /// Sessions that completed their opening (agent welcomed, subscriber subscribed), by role.
        pub connects: Family<RoleLabel, Counter> = Family::default()
            => "connects", "Sessions opened (agent welcomed, subscriber subscribed), by role";
        /// Sessions that ended, by role and reason.
        pub disconnects: Family<DisconnectLabel, Counter> = Family::default()
            => "disconnects", "Sessions ended, by role and reason";
        /// Connections that failed before a session began (TLS, WebSocket, identity), by reason.
        pub handshake_failures: Family<ReasonLabel, Counter> = Family::default()
            => "handshake_failures", "Connections that failed before a session began (TLS, WebSocket, identity, revoked), by reason";
        /// Acks delayed by the per-cluster rate limits.
        pub throttled_acks: Counter = Counter::default()
            => "throttled_acks", "Acks delayed by the per-cluster rate limits";
        /// Hellos that asked the bus again for their cluster's head after it timed out.
        pub hello_head_retries: Counter = Counter::default()
            => "hello_head_retries", "Hellos that asked the bus again for their cluster's head after it did not answer in time";
        /// Head reads of agent sessions poked to look for another agent process's records.
        pub interleave_peeks: Counter = Counter::default()
            => "interleave_peeks", "Agent sessions on a shared bus that read their cluster's head because a head of another agent process was recorded, a hub replica went away, or a deferred check came due (never while idle otherwise)";
        /// Clusters' entries of the shared fleet state held (a bus of several replicas).
        pub fleet_entries: Gauge = Gauge::default()
            => "fleet_entries", "Clusters' entries of the shared fleet state held";
        /// Seconds the last load of the fleet state took (from following to caught up).
        pub fleet_load_seconds: Gauge<f64, AtomicU64> = Gauge::default()
            => "fleet_load_seconds", "Seconds the last load of the shared fleet state took";
        /// Entries this replica wrote into the fleet state.
        pub fleet_writes: Counter = Counter::default()
            => "fleet_writes", "Entries written into the shared fleet state";
        /// Entries written trimmed to fit the bound.
        pub fleet_trimmed: Counter = Counter::default()
            => "fleet_trimmed", "Fleet state entries written trimmed to fit";
        /// Writes not made because another replica had written the entry since (its agent
        /// moved there).
        pub fleet_moved: Counter = Counter::default()
            => "fleet_moved", "Fleet state entries left alone because another replica wrote them since";
        /// Entry writes that failed (retried).
        pub fleet_write_failures: Counter = Counter::default()
            => "fleet_write_failures", "Fleet state entry writes that failed (retried)";
        /// Where the instruments are registered, under the prefix `fleetwatch_hub`.
        registry: Registry = Registry::default();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fleetwatch_hub");
        let m = Self::unregistered();
        m.register(&mut registry);
        // The usual label values start at 0, so every family is served from the start
        // (dashboards and alerts see a series before the first event, rate() works at once).
        for reason in HANDSHAKE_FAILURES {
            let _ = m.handshake_failures.get_or_create(&ReasonLabel { reason: (*reason).into() });
            let _ = m.rejected.get_or_create(&ReasonLabel { reason: (*reason).into() });
        }
        // Agents and subscribers with no protocol version in common (the skew alert).
        let _ = m.rejected.get_or_create(&ReasonLabel { reason: "protocol-version".into() });
        for reason in ["revoked", "expired", "untrusted"] {
            let _ = m.sessions_expired.get_or_create(&ReasonLabel { reason: reason.into() });
        }
        for role in ["agent", "subscriber"] {
            let _ = m.connects.get_or_create(&RoleLabel { role: role.into() });
            for reason in ["peer-closed", "idle-timeout", "replaced", "shutting-down", "forbidden"] {
                let _ = m.disconnects.get_or_create(&DisconnectLabel { role: role.into(), reason: reason.into() });
            }
        }
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Counts a rejection.
    pub fn reject(&self, reason: &str) {
        self.rejected.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }

    /// Counts a connection that failed before its session began: `handshake_failures` by
    /// `reason`, and the same reason in `rejected` (kept for existing dashboards).
    pub fn handshake_failed(&self, reason: &str) {
        self.handshake_failures.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
        self.reject(reason);
    }

    /// Counts a session that opened.
    pub fn connected(&self, role: &str) {
        self.connects.get_or_create(&RoleLabel { role: role.into() }).inc();
    }

    /// Counts a session that ended, and why.
    pub fn disconnected(&self, role: &str, reason: &str) {
        self.disconnects.get_or_create(&DisconnectLabel { role: role.into(), reason: reason.into() }).inc();
    }

    /// The OpenMetrics exposition of the instruments followed by `scrape`'s families (the
    /// state read at scrape time), closed with `# EOF`.
    pub fn encode(&self, scrape: &Registry) -> String {
        fleetwatch_telemetry::exposition::encode_component(&[&self.registry, scrape])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counter_families_are_named_by_their_samples_in_the_text_format() {
        let m = Metrics::default();
        let text = fleetwatch_telemetry::exposition::to_text_format(&m.encode(&Registry::default()));
        assert!(text.contains("# TYPE fleetwatch_hub_events_received_total counter\n"), "{text}");
        assert!(!text.contains("# EOF"), "{text}");
    }

    #[test]
    fn instruments_are_encoded_then_the_scrape_then_one_eof() {
        let m = Metrics::default();
        m.connected("agent");
        m.disconnected("agent", "peer-closed");
        m.handshake_failed("tls-handshake");
        let mut scrape = Registry::with_prefix("fleetwatch_hub");
        scrape.register("scraped", "Read at scrape time", Gauge::<i64>::default());
        let out = m.encode(&scrape);
        // The instruments, the scrape, then what every component serves, and one EOF.
        let scraped = out.find("fleetwatch_hub_scraped 0\n").expect("the scrape's families");
        let build = out.find("# TYPE fleetwatch_build_info gauge").expect("the standard families");
        assert!(out.find("fleetwatch_hub_connects_total").is_some_and(|i| i < scraped) && scraped < build, "{out}");
        assert!(out.ends_with("\n# EOF\n"), "{out}");
        assert_eq!(out.matches("# EOF").count(), 1, "{out}");
        assert!(out.contains("fleetwatch_hub_connects_total{role=\"agent\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_disconnects_total{role=\"agent\",reason=\"peer-closed\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_handshake_failures_total{reason=\"tls-handshake\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_rejected_total{reason=\"tls-handshake\"} 1"), "{out}");
    }
}
