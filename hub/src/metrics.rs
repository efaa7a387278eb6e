//! Prometheus metrics of the hub.

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

/// All hub metrics.
pub struct Metrics {
    registry: Registry,
    /// Agent sessions open now.
    pub agent_sessions: Gauge,
    /// Subscriber sessions open now.
    pub subscriber_sessions: Gauge,
    /// Events accepted into the bus.
    pub events_received: Counter,
    /// Events delivered to subscribers.
    pub events_delivered: Counter,
    /// Resync-required markers recorded.
    pub resyncs: Counter,
    /// Connections refused or closed for a reason.
    pub rejected: Family<ReasonLabel, Counter>,
    /// Seconds a bus append took (includes fsync with a data directory).
    pub append_seconds: Histogram,
    /// Seconds acks were delayed by rate limiting.
    pub throttled_seconds: Counter<f64, std::sync::atomic::AtomicU64>,
    /// 1 while the deny list file cannot be used and the last good list is in force.
    pub deny_list_stale: Gauge,
    /// Times the deny list file was found unusable.
    pub deny_list_errors: Counter,
    /// Live sessions closed because their certificate expired or its CA left the bundle.
    pub sessions_expired: Family<ReasonLabel, Counter>,
    /// Agents refused because their cluster id was already connected from elsewhere.
    pub cluster_conflicts: Counter,
    /// Resync markers acked without storing: one was already pending for the cluster.
    pub resyncs_coalesced: Counter,
    /// Keep-alive pings sent to agents.
    pub pings_sent: Counter,
    /// Subscribers disconnected because they did not drain within the stall timeout.
    pub subscriber_stalls: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fleetwatch_hub");
        let m = Self {
            agent_sessions: Gauge::default(),
            subscriber_sessions: Gauge::default(),
            events_received: Counter::default(),
            events_delivered: Counter::default(),
            resyncs: Counter::default(),
            rejected: Family::default(),
            append_seconds: Histogram::new(exponential_buckets(0.0001, 2.0, 16)),
            throttled_seconds: Counter::default(),
            deny_list_stale: Gauge::default(),
            deny_list_errors: Counter::default(),
            sessions_expired: Family::default(),
            cluster_conflicts: Counter::default(),
            resyncs_coalesced: Counter::default(),
            pings_sent: Counter::default(),
            subscriber_stalls: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("agent_sessions", "Agent sessions open", m.agent_sessions.clone());
        registry.register("subscriber_sessions", "Subscriber sessions open", m.subscriber_sessions.clone());
        registry.register("events_received", "Events accepted into the bus", m.events_received.clone());
        registry.register("events_delivered", "Events sent to subscribers", m.events_delivered.clone());
        registry.register("resyncs", "Resync-required markers recorded", m.resyncs.clone());
        registry.register("rejected", "Connections or messages rejected, by reason", m.rejected.clone());
        registry.register("bus_append_seconds", "Time to append a batch to the bus", m.append_seconds.clone());
        registry.register("throttled_seconds", "Time acks were delayed by rate limits", m.throttled_seconds.clone());
        registry.register(
            "deny_list_stale",
            "Whether the deny list file is unusable and the last good list is in force (1) or not (0)",
            m.deny_list_stale.clone(),
        );
        registry.register("deny_list_errors", "Times the deny list file was unusable", m.deny_list_errors.clone());
        registry.register(
            "sessions_ended",
            "Live sessions closed because their certificate is no longer valid, by reason",
            m.sessions_expired.clone(),
        );
        registry.register(
            "cluster_conflicts",
            "Agents refused because their cluster id was already connected",
            m.cluster_conflicts.clone(),
        );
        registry.register(
            "resyncs_coalesced",
            "Resync markers acked without storing (one already pending)",
            m.resyncs_coalesced.clone(),
        );
        registry.register("agent_pings", "Keep-alive pings sent to agents", m.pings_sent.clone());
        registry.register(
            "subscriber_stalls",
            "Subscribers disconnected for not draining within the stall timeout",
            m.subscriber_stalls.clone(),
        );
        Self { registry, ..m }
    }
}

impl Metrics {
    /// Counts a rejection.
    pub fn reject(&self, reason: &str) {
        self.rejected.get_or_create(&ReasonLabel { reason: reason.into() }).inc();
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        let _ = prometheus_client::encoding::text::encode(&mut out, &self.registry);
        out
    }
}
