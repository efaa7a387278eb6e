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
        counter(&mut e, "connect_failures", "Connect attempts that reached no hub", s.connect_failures)?;
        counter(
            &mut e,
            "connect_timeouts",
            "Connect attempts that reached no hub because the hubs did not answer in time",
            s.connect_timeouts,
        )?;
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
    fleetwatch_telemetry::exposition::encode_component(&[&registry])
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

    /// `GET path` on `addr`: the answer's status line and body.
    async fn get(addr: std::net::SocketAddr, path: &str) -> (String, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await.unwrap();
        let mut buf = String::new();
        s.read_to_string(&mut buf).await.unwrap();
        let (head, body) = buf.split_once("\r\n\r\n").unwrap();
        (head.lines().next().unwrap_or_default().to_string(), body.to_string())
    }

    #[tokio::test]
    async fn the_health_listener_is_ready_while_a_session_is_open() {
        let (tx, rx) = tokio::sync::watch::channel(AgentStats::default());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let shutdown = tokio_util::sync::CancellationToken::new();
        let _stop = shutdown.clone().drop_guard();
        tokio::spawn(health(rx).serve(listener, shutdown));
        assert_eq!(get(addr, "/healthz").await.1, "ok\n");
        let (status, body) = get(addr, "/readyz").await;
        assert!(status.contains(" 503 "), "{status}");
        assert_eq!(body, "not ready: no session with the hub\n");
        tx.send_modify(|s| {
            s.connected = true;
            s.changes = 3;
        });
        let (status, body) = get(addr, "/readyz").await;
        assert!(status.contains(" 200 "), "{status}");
        assert_eq!(body, "ready: connected to the hub\n");
        let metrics = get(addr, "/metrics").await.1;
        assert!(metrics.contains("\nfleetwatch_agent_changes_total 3\n"), "the stats now: {metrics}");
    }

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
            "fleetwatch_agent_connect_failures_total 0",
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
