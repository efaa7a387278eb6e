//! The hub's metrics read at scrape time: bus size and evictions, readiness, per-cluster
//! liveness, sessions, protocol versions and watch phases, certificate expiry, subscriber
//! lag. Keeping those current on every event would cost the hot path for a number read
//! every few seconds, so [`Scrape::read`] takes one snapshot of the hub when `/metrics` is
//! asked (reading the bus for the age of each subscriber's oldest unacked record), and the
//! snapshot is a prometheus-client [`Collector`] that writes the families after the
//! instruments of [`crate::metrics::Metrics`].
//!
//! The names, types, labels and HELP texts are a contract with `deploy/observability/` and
//! the README (checked by e2e `observability` against a running hub); the HELP texts end
//! with a full stop, as prometheus-client writes those of registered instruments.

use std::collections::BTreeMap;

use fleetwatch_telemetry::collect::{counter, counters, gauge, gauges, maybe_gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::registry::Registry;

use crate::context::Context;

/// Label: a runtime cluster's id. Named `runtime_cluster`, not `cluster`: multi-cluster
/// Prometheus setups (Thanos, Mimir) put an external label `cluster` on every series, naming
/// the cluster Prometheus runs in (decision 0039).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct ClusterLabel {
    pub(crate) runtime_cluster: String,
}

/// Labels of `fleetwatch_hub_cluster_agent_protocol`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct AgentProtocolLabels {
    /// The runtime cluster's id ([`ClusterLabel`]).
    pub(crate) runtime_cluster: String,
    /// The agent's build version (empty when it did not say).
    pub(crate) agent_version: String,
    /// The protocol version its session speaks.
    pub(crate) session_protocol: String,
}

/// Labels of `fleetwatch_hub_cluster_watches`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct WatchLabels {
    /// The runtime cluster's id ([`ClusterLabel`]).
    pub(crate) runtime_cluster: String,
    pub(crate) phase: String,
}

/// Labels of the subscriber lag families: the subscriber's name and its durable name (`-`
/// without one).
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
pub(crate) struct SubscriberLabels {
    pub(crate) subscriber: String,
    pub(crate) durable: String,
}

/// One snapshot of the state the scrape-time families show.
#[derive(Debug, Default)]
pub(crate) struct Scrape {
    pub(crate) bus_records: u64,
    pub(crate) bus_last_offset: u64,
    pub(crate) bus_first_offset: u64,
    pub(crate) bus_bytes: u64,
    pub(crate) bus_held_in_memory: bool,
    pub(crate) bus_writable: bool,
    pub(crate) bus_write_failures: u64,
    pub(crate) ready: bool,
    pub(crate) cluster_connected: Vec<(ClusterLabel, bool)>,
    /// Unix seconds.
    pub(crate) cluster_last_seen: Vec<(ClusterLabel, f64)>,
    pub(crate) agent_protocol: Vec<(AgentProtocolLabels, u32)>,
    pub(crate) cluster_sessions: Vec<(ClusterLabel, u64)>,
    pub(crate) cluster_watches: Vec<(WatchLabels, u64)>,
    /// Unix seconds.
    pub(crate) cert_expiry: f64,
    /// Unix seconds, per connected agent's cluster.
    pub(crate) agent_cert_expiry: Vec<(ClusterLabel, f64)>,
    /// Seconds from now, when some client is connected.
    pub(crate) client_cert_earliest_expiry: Option<f64>,
    /// Records not acked yet and the age in seconds of the oldest of them.
    pub(crate) subscriber_lag: Vec<(SubscriberLabels, u64, f64)>,
}

/// Seconds (with milliseconds) since the Unix epoch.
fn unix_secs(t: jiff::Timestamp) -> f64 {
    t.as_millisecond() as f64 / 1000.0
}

/// A count as a gauge value (the library's gauges are signed).
fn signed(n: u64) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

impl Scrape {
    /// Reads the snapshot from the hub.
    pub(crate) async fn read(ctx: &Context) -> Self {
        let bus = &ctx.sessions.bus;
        let now_secs = unix_secs(jiff::Timestamp::now());
        let stats = bus.stats();
        let last = stats.last_offset;
        let mut s = Scrape {
            bus_records: stats.retained as u64,
            bus_last_offset: last,
            bus_first_offset: stats.first_offset,
            bus_bytes: stats.retained_bytes,
            bus_held_in_memory: stats.holds_records,
            bus_writable: bus.health().is_ok(),
            bus_write_failures: stats.write_failures,
            ready: ctx.checks().iter().all(|c| c.state.is_ok()),
            cert_expiry: unix_secs(ctx.tls.not_after()),
            ..Scrape::default()
        };

        // Per cluster this replica knows: connected, last heard of, sessions opened, and
        // for the connected ones the protocol versions (the skew policy's alert compares
        // them with this hub's range; docs/upgrade.md) and the watches by phase.
        for c in ctx.sessions.registry.list() {
            let cluster = ClusterLabel { runtime_cluster: c.cluster.clone() };
            s.cluster_connected.push((cluster.clone(), c.connected));
            if let Some(seen) = c.last_seen {
                s.cluster_last_seen.push((cluster.clone(), unix_secs(seen)));
            }
            s.cluster_sessions.push((cluster, c.sessions));
            if !c.connected {
                continue;
            }
            if let (Some(newest), Some(session)) = (c.agent_protocol, c.protocol) {
                let labels = AgentProtocolLabels {
                    runtime_cluster: c.cluster.clone(),
                    agent_version: c.agent_version.clone().unwrap_or_default(),
                    session_protocol: session.to_string(),
                };
                s.agent_protocol.push((labels, newest));
            }
            let mut phases: BTreeMap<String, u64> = BTreeMap::new();
            for w in &c.watches {
                *phases.entry(w.phase.to_string()).or_default() += 1;
            }
            for (phase, n) in phases {
                s.cluster_watches.push((WatchLabels { runtime_cluster: c.cluster.clone(), phase }, n));
            }
        }

        // Client certificates of the open connections: the earliest, and per agent.
        let mut earliest: Option<jiff::Timestamp> = None;
        let mut agents: BTreeMap<String, jiff::Timestamp> = BTreeMap::new();
        for (peer, _) in ctx.sessions.registry.open_connections() {
            earliest = Some(earliest.map_or(peer.not_after, |e| e.min(peer.not_after)));
            let cluster = peer
                .identity
                .parse::<fleetwatch_protocol::identity::Identity>()
                .ok()
                .and_then(|id| id.cluster_id().map(str::to_string));
            if let Some(cluster) = cluster {
                let e = agents.entry(cluster).or_insert(peer.not_after);
                *e = (*e).min(peer.not_after);
            }
        }
        s.agent_cert_expiry = agents
            .into_iter()
            .map(|(cluster, at)| (ClusterLabel { runtime_cluster: cluster }, unix_secs(at)))
            .collect();
        s.client_cert_earliest_expiry = earliest.map(|e| unix_secs(e) - now_secs);

        // Subscriber lag: records not acked yet, and the age of the oldest of them. Several
        // sessions of one name (instances without a durable name): the worst one.
        let mut lags: BTreeMap<SubscriberLabels, (u64, f64)> = BTreeMap::new();
        for p in ctx.sessions.fanout.all() {
            let (records, oldest) = p.lag(last);
            let age = match oldest {
                Some(offset) => match bus.read(offset, 1).await {
                    Ok(read) => read.records.first().map_or(0.0, |r| (now_secs - r.time_ms as f64 / 1000.0).max(0.0)),
                    Err(_) => 0.0,
                },
                None => 0.0,
            };
            let labels = SubscriberLabels { subscriber: p.name.clone(), durable: p.durable.clone() };
            let e = lags.entry(labels).or_insert((0, 0.0));
            *e = (e.0.max(records), e.1.max(age));
        }
        s.subscriber_lag = lags.into_iter().map(|(labels, (records, age))| (labels, records, age)).collect();
        s
    }

    /// The snapshot as a registry of its own, to encode after the instruments.
    pub(crate) fn into_registry(self) -> Registry {
        let mut registry = Registry::with_prefix("fleetwatch_hub");
        registry.register_collector(Box::new(self));
        registry
    }
}

/// The hub's `/metrics`: the instruments, then the state read now, closed with `# EOF`.
pub(crate) async fn encode(ctx: &Context) -> String {
    let scrape = Scrape::read(ctx).await.into_registry();
    ctx.sessions.metrics.encode(&scrape)
}

impl Collector for Scrape {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let e = &mut e;
        let flag = |b: bool| i64::from(b);
        gauge(e, "bus_records", "Records retained in the bus.", signed(self.bus_records))?;
        gauge(e, "bus_last_offset", "Offset of the newest record.", signed(self.bus_last_offset))?;
        gauge(e, "bus_first_offset", "Offset of the oldest retained record.", signed(self.bus_first_offset))?;
        counter(
            e,
            "bus_evicted_records",
            "Records evicted by retention since the log began (offsets below the oldest retained one).",
            self.bus_first_offset.saturating_sub(1),
        )?;
        gauge(e, "bus_bytes", "Bytes of records retained in the bus.", signed(self.bus_bytes))?;
        gauge(
            e,
            "bus_held_in_memory",
            "Whether this hub holds the retained records in memory (a replica on JetStream does once a subscriber connected to it).",
            flag(self.bus_held_in_memory),
        )?;
        gauge(e, "bus_writable", "Whether the bus can store records (0 while writes fail).", flag(self.bus_writable))?;
        counter(e, "bus_write_failures", "Batches refused because a write failed.", self.bus_write_failures)?;
        gauge(e, "ready", "Whether /readyz answers ready (1) or not (0).", flag(self.ready))?;

        gauges(
            e,
            "cluster_connected",
            "Whether the cluster's agent is connected to this hub.",
            self.cluster_connected.iter().map(|(l, c)| (l, flag(*c))),
        )?;
        gauges(
            e,
            "cluster_last_seen_timestamp_seconds",
            "When this hub last heard from the cluster's agent (Unix seconds).",
            self.cluster_last_seen.iter().map(|(l, t)| (l, *t)),
        )?;
        gauge(
            e,
            "protocol_newest",
            "The newest protocol version this hub speaks.",
            i64::from(fleetwatch_protocol::message::PROTOCOL_VERSION),
        )?;
        gauge(
            e,
            "protocol_oldest",
            "The oldest protocol version this hub still speaks.",
            i64::from(fleetwatch_protocol::message::MIN_PROTOCOL_VERSION),
        )?;
        gauges(
            e,
            "cluster_agent_protocol",
            "The newest protocol version the connected agent speaks, with its build version and the version its session speaks.",
            self.agent_protocol.iter().map(|(l, v)| (l, i64::from(*v))),
        )?;
        counters(
            e,
            "cluster_sessions",
            "Agent sessions opened per cluster since the hub started.",
            self.cluster_sessions.iter().map(|(l, n)| (l, *n)),
        )?;
        gauges(
            e,
            "cluster_watches",
            "Watches of each connected cluster's agent, by phase (running, starting, waiting-for-kind (healthy: nothing installed the kind), kind-not-found (its module is installed), forbidden, error).",
            self.cluster_watches.iter().map(|(l, n)| (l, signed(*n))),
        )?;

        gauge(
            e,
            "cert_expiry_timestamp_seconds",
            "When the hub's own certificate in force expires (Unix seconds).",
            self.cert_expiry,
        )?;
        gauges(
            e,
            "agent_cert_expiry_timestamp_seconds",
            "When the certificate of each connected agent expires (Unix seconds).",
            self.agent_cert_expiry.iter().map(|(l, t)| (l, *t)),
        )?;
        maybe_gauge(
            e,
            "client_cert_earliest_expiry_seconds",
            "Seconds until the earliest expiry among the certificates of connected agents and subscribers.",
            self.client_cert_earliest_expiry,
        )?;

        gauges(
            e,
            "subscriber_lag_records",
            "Records a subscriber session has not acked yet.",
            self.subscriber_lag.iter().map(|(l, records, _)| (l, signed(*records))),
        )?;
        gauges(
            e,
            "subscriber_lag_seconds",
            "Age of the oldest record a subscriber session has not acked yet.",
            self.subscriber_lag.iter().map(|(l, _, age)| (l, *age)),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cluster(c: &str) -> ClusterLabel {
        ClusterLabel { runtime_cluster: c.into() }
    }

    /// The families in scrape order: (name, type) from `# TYPE`.
    fn families(text: &str) -> Vec<(String, String)> {
        text.lines()
            .filter_map(|l| l.strip_prefix("# TYPE "))
            .filter_map(|r| r.split_once(' ').map(|(n, t)| (n.to_string(), t.to_string())))
            .collect()
    }

    #[test]
    fn a_scrape_writes_every_family_with_its_type_labels_and_value() {
        let scrape = Scrape {
            bus_records: 40,
            bus_last_offset: 50,
            bus_first_offset: 11,
            bus_bytes: 4096,
            bus_held_in_memory: true,
            bus_writable: true,
            bus_write_failures: 2,
            ready: true,
            cluster_connected: vec![(cluster("rt1"), true), (cluster("rt\"2"), false)],
            cluster_last_seen: vec![(cluster("rt1"), 1_700_000_000.25)],
            agent_protocol: vec![(
                AgentProtocolLabels {
                    runtime_cluster: "rt1".into(),
                    agent_version: "0.1.0".into(),
                    session_protocol: "1".into(),
                },
                1,
            )],
            cluster_sessions: vec![(cluster("rt1"), 3)],
            cluster_watches: vec![(WatchLabels { runtime_cluster: "rt1".into(), phase: "running".into() }, 2)],
            cert_expiry: 1_800_000_000.5,
            agent_cert_expiry: vec![(cluster("rt1"), 1_750_000_000.0)],
            client_cert_earliest_expiry: Some(86_000.5),
            subscriber_lag: vec![(SubscriberLabels { subscriber: "ops".into(), durable: "-".into() }, 7, 1.5)],
        };
        let text = fleetwatch_telemetry::exposition::encode(&[&scrape.into_registry()]);
        for line in [
            "# HELP fleetwatch_hub_bus_records Records retained in the bus.",
            "fleetwatch_hub_bus_records 40",
            "fleetwatch_hub_bus_last_offset 50",
            "fleetwatch_hub_bus_first_offset 11",
            "# TYPE fleetwatch_hub_bus_evicted_records counter",
            "fleetwatch_hub_bus_evicted_records_total 10",
            "fleetwatch_hub_bus_bytes 4096",
            "fleetwatch_hub_bus_held_in_memory 1",
            "fleetwatch_hub_bus_writable 1",
            "fleetwatch_hub_bus_write_failures_total 2",
            "# HELP fleetwatch_hub_ready Whether /readyz answers ready (1) or not (0).",
            "fleetwatch_hub_ready 1",
            "fleetwatch_hub_cluster_connected{runtime_cluster=\"rt1\"} 1",
            "fleetwatch_hub_cluster_connected{runtime_cluster=\"rt\\\"2\"} 0",
            "fleetwatch_hub_cluster_last_seen_timestamp_seconds{runtime_cluster=\"rt1\"} 1700000000.25",
            "fleetwatch_hub_protocol_newest 1",
            "fleetwatch_hub_protocol_oldest 1",
            "fleetwatch_hub_cluster_agent_protocol{runtime_cluster=\"rt1\",agent_version=\"0.1.0\",session_protocol=\"1\"} 1",
            "# TYPE fleetwatch_hub_cluster_sessions counter",
            "fleetwatch_hub_cluster_sessions_total{runtime_cluster=\"rt1\"} 3",
            "fleetwatch_hub_cluster_watches{runtime_cluster=\"rt1\",phase=\"running\"} 2",
            "fleetwatch_hub_cert_expiry_timestamp_seconds 1800000000.5",
            "fleetwatch_hub_agent_cert_expiry_timestamp_seconds{runtime_cluster=\"rt1\"} 1750000000.0",
            "fleetwatch_hub_client_cert_earliest_expiry_seconds 86000.5",
            "fleetwatch_hub_subscriber_lag_records{subscriber=\"ops\",durable=\"-\"} 7",
            "fleetwatch_hub_subscriber_lag_seconds{subscriber=\"ops\",durable=\"-\"} 1.5",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        let kinds = families(&text);
        assert_eq!(kinds.len(), 21, "{kinds:?}");
        let counters: Vec<&str> = kinds.iter().filter(|(_, t)| t == "counter").map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            counters,
            [
                "fleetwatch_hub_bus_evicted_records",
                "fleetwatch_hub_bus_write_failures",
                "fleetwatch_hub_cluster_sessions"
            ]
        );
        assert!(kinds.iter().all(|(_, t)| t == "counter" || t == "gauge"), "{kinds:?}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }

    #[test]
    fn families_without_samples_are_still_declared() {
        let text = fleetwatch_telemetry::exposition::encode(&[&Scrape::default().into_registry()]);
        assert_eq!(families(&text).len(), 21, "{text}");
        for family in [
            "fleetwatch_hub_cluster_connected",
            "fleetwatch_hub_subscriber_lag_records",
            "fleetwatch_hub_client_cert_earliest_expiry_seconds",
        ] {
            assert!(text.contains(&format!("# TYPE {family} gauge\n")), "{family}:\n{text}");
            assert!(!text.lines().any(|l| l.starts_with(family)), "{family} has no sample yet:\n{text}");
        }
    }
}
