//! The agent's Prometheus metrics, served as OpenMetrics with [`prometheus_client`] on the
//! health listener's `/metrics` (`--health-listen`, a [`fleetwatch_telemetry::Health`]), read
//! at scrape time from the [`AgentStats`] the agent publishes anyway: nothing is counted
//! twice, the pipeline pays nothing for them.

use fleetwatch_telemetry::collect::{counter, gauge};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::DescriptorEncoder;
use prometheus_client::registry::Registry;

use crate::AgentStats;

/// One snapshot of the stats, encoded as metric families.
#[derive(Debug)]
struct Snapshot(AgentStats);

impl Collector for Snapshot {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        gauge(
            &mut e,
            "connected",
            "Whether a session with the hub is open (1) or not (0)",
            f64::from(u8::from(s.connected)),
        )?;
        counter(&mut e, "changes", "Changes taken from the source", s.changes)?;
        gauge(&mut e, "last_seq", "Highest seq assigned to an event", s.last_seq as f64)?;
        gauge(&mut e, "acked_seq", "Highest seq the hub acknowledged", s.acked_seq as f64)?;
        gauge(&mut e, "outbox_events", "Events waiting in the outbox for the hub's ack", s.outbox_len as f64)?;
        gauge(&mut e, "outbox_bytes", "Bytes of the events waiting in the outbox", s.outbox_bytes as f64)?;
        counter(&mut e, "truncated_events", "Events larger than the per-event limit, sent cut down", s.truncated)?;
        counter(
            &mut e,
            "outbox_overflows",
            "Times the outbox overflowed and collapsed into a resync marker",
            s.overflows,
        )?;
        counter(&mut e, "sessions", "Sessions opened with the hub", s.sessions)?;
        counter(&mut e, "cert_renewals", "Reconnects made to put a renewed client certificate in use", s.renewals)?;
        if let Some(t) = s.cert_not_after {
            gauge(
                &mut e,
                "cert_expiry_timestamp_seconds",
                "When the client certificate in use expires (Unix seconds)",
                t.as_second() as f64,
            )?;
        }
        Ok(())
    }
}

/// The OpenMetrics text exposition of `stats`, closed with `# EOF`.
pub fn encode(stats: &AgentStats) -> String {
    let mut registry = Registry::with_prefix("fleetwatch_agent");
    registry.register_collector(Box::new(Snapshot(stats.clone())));
    fleetwatch_telemetry::exposition::encode(&[&registry])
}

/// The health listener (`--health-listen`): `/metrics` from the stats; `/readyz` ready
/// while a session with the hub is open (a pod that cannot reach its hub shows `0/1 READY`
/// instead of looking healthy); `/healthz` while the process answers. Liveness must not
/// depend on the hub: a restart would only throw away the outbox.
pub fn health(stats: tokio::sync::watch::Receiver<AgentStats>) -> fleetwatch_telemetry::Health {
    let session = stats.clone();
    fleetwatch_telemetry::Health::new(move || encode(&stats.borrow())).ready(move || {
        let connected = session.borrow().connected;
        std::future::ready(if connected {
            Ok("connected to the hub".to_string())
        } else {
            Err("no session with the hub".to_string())
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stats_are_served_as_openmetrics() {
        let stats = AgentStats {
            connected: true,
            changes: 7,
            acked_seq: 5,
            last_seq: 6,
            outbox_len: 1,
            outbox_bytes: 300,
            cert_not_after: Some(jiff::Timestamp::from_second(2_000_000_000).unwrap()),
            ..AgentStats::default()
        };
        let text = encode(&stats);
        for line in [
            "# TYPE fleetwatch_agent_connected gauge",
            "fleetwatch_agent_connected 1.0",
            "# TYPE fleetwatch_agent_changes counter",
            "fleetwatch_agent_changes_total 7",
            "fleetwatch_agent_acked_seq 5.0",
            "fleetwatch_agent_outbox_events 1.0",
            "fleetwatch_agent_outbox_bytes 300.0",
            "fleetwatch_agent_sessions_total 0",
            "fleetwatch_agent_cert_expiry_timestamp_seconds 2000000000.0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        let idle = encode(&AgentStats::default());
        assert!(idle.contains("fleetwatch_agent_connected 0.0\n"), "{idle}");
        assert!(!idle.contains("cert_expiry"), "no certificate, no expiry: {idle}");
    }
}
