//! Prometheus metrics of the hub.
//!
//! Two kinds, both with [`prometheus_client`]: instruments kept up to date where things
//! happen (counters, gauges, the append histogram; [`Metrics`]), and state read at scrape
//! time (bus size, per-cluster liveness, certificate expiry, subscriber lag; the collector
//! in `scrape.rs`), because keeping those current on every event would cost the hot path
//! for a number read every few seconds. The admin endpoint answers `/metrics` with both
//! through [`fleetwatch_telemetry`]. The names are a contract with
//! `deploy/observability/` (dashboard and alert rules), checked by a test against a
//! running hub.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

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
    /// 1 while the access policy file cannot be used and the last good policy is in force.
    pub access_policy_stale: Gauge,
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
    /// Sessions that completed their opening (agent welcomed, subscriber subscribed), by role.
    pub connects: Family<RoleLabel, Counter>,
    /// Sessions that ended, by role and reason.
    pub disconnects: Family<DisconnectLabel, Counter>,
    /// Connections that failed before a session began (TLS, WebSocket, identity), by reason.
    pub handshake_failures: Family<ReasonLabel, Counter>,
    /// Acks delayed by the per-cluster rate limits.
    pub throttled_acks: Counter,
    /// Where each subscriber session is, for the lag read at scrape time.
    pub subscribers: SubscriberBoard,
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
            access_policy_stale: Gauge::default(),
            sessions_expired: Family::default(),
            cluster_conflicts: Counter::default(),
            resyncs_coalesced: Counter::default(),
            pings_sent: Counter::default(),
            subscriber_stalls: Counter::default(),
            connects: Family::default(),
            disconnects: Family::default(),
            handshake_failures: Family::default(),
            throttled_acks: Counter::default(),
            subscribers: SubscriberBoard::default(),
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
            "access_policy_stale",
            "Whether the access policy file is unusable and the last good policy is in force (1) or not (0)",
            m.access_policy_stale.clone(),
        );
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
        registry.register(
            "connects",
            "Sessions opened (agent welcomed, subscriber subscribed), by role",
            m.connects.clone(),
        );
        registry.register("disconnects", "Sessions ended, by role and reason", m.disconnects.clone());
        registry.register(
            "handshake_failures",
            "Connections that failed before a session began (TLS, WebSocket, identity, revoked), by reason",
            m.handshake_failures.clone(),
        );
        registry.register("throttled_acks", "Acks delayed by the per-cluster rate limits", m.throttled_acks.clone());
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
        fleetwatch_telemetry::exposition::encode(&[&self.registry, scrape])
    }
}

/// One subscriber session's position, updated by the session, read at scrape time.
#[derive(Debug, Default)]
pub struct SubscriberProgress {
    /// The subscriber's name (from its certificate).
    pub name: String,
    /// Its durable subscription name, or `-`.
    pub durable: String,
    /// The highest offset it acked.
    pub acked: AtomicU64,
    /// The highest offset read for it (sent, or skipped by its filter).
    pub sent: AtomicU64,
    /// The highest offset actually sent to it.
    pub delivered: AtomicU64,
    /// Its window: how many sent records it may leave unacked.
    pub window: AtomicU64,
}

impl SubscriberProgress {
    /// Records not yet acked that concern it: read but unacked, plus not read yet up to
    /// `last_offset`; and the offset of the oldest of them (for its age), if any.
    pub fn lag(&self, last_offset: u64) -> (u64, Option<u64>) {
        let acked = self.acked.load(Ordering::Relaxed);
        let sent = self.sent.load(Ordering::Relaxed);
        let delivered = self.delivered.load(Ordering::Relaxed);
        let unacked = delivered.saturating_sub(acked);
        let unread = last_offset.saturating_sub(sent);
        let oldest = if unacked > 0 {
            Some(acked + 1)
        } else if unread > 0 {
            Some(sent + 1)
        } else {
            None
        };
        (unacked + unread, oldest)
    }
}

/// Most durable subscriptions remembered after their session ended (the oldest are
/// forgotten first).
pub const DEPARTED_DURABLES: usize = 1024;

/// The subscriber sessions open now, for the lag metrics, and the durable subscriptions
/// whose session ended since the hub started (for `/api/v1/subscriptions`).
#[derive(Debug, Default)]
pub struct SubscriberBoard {
    sessions: Mutex<HashMap<u64, Arc<SubscriberProgress>>>,
    /// (subscriber, durable name) → (acked cursor, when its session ended).
    departed: Mutex<HashMap<(String, String), (u64, jiff::Timestamp)>>,
}

/// One subscription as `/api/v1/subscriptions` shows it.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Subscription {
    /// The subscriber's name (from its certificate).
    pub subscriber: String,
    /// Its durable name, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub durable: Option<String>,
    /// Whether a session is open.
    pub connected: bool,
    /// The highest offset it acked.
    pub cursor: u64,
    /// Records it has not acked yet (read but unacked, plus not read yet).
    pub lag_records: u64,
    /// Age of the oldest of them, in seconds.
    pub lag_seconds: f64,
    /// When its session ended (disconnected durable subscriptions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub disconnected_at: Option<jiff::Timestamp>,
    /// The offset of its oldest unacked record (for the age), not shown.
    #[serde(skip)]
    pub oldest: Option<u64>,
}

/// A subscriber's entry on the board; dropping it removes the entry.
pub struct BoardEntry<'a> {
    board: &'a SubscriberBoard,
    id: u64,
    /// The position to update.
    pub progress: Arc<SubscriberProgress>,
}

impl Drop for BoardEntry<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.board.sessions.lock() {
            s.remove(&self.id);
        }
        let p = &self.progress;
        if p.durable != "-"
            && let Ok(mut d) = self.board.departed.lock()
        {
            if d.len() >= DEPARTED_DURABLES
                && let Some(oldest) = d.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone())
            {
                d.remove(&oldest);
            }
            let acked = p.acked.load(Ordering::Relaxed);
            d.insert((p.name.clone(), p.durable.clone()), (acked, jiff::Timestamp::now()));
        }
    }
}

impl SubscriberBoard {
    /// Puts a session on the board for as long as the entry lives.
    pub fn join(&self, name: &str, durable: Option<&str>) -> BoardEntry<'_> {
        let progress = Arc::new(SubscriberProgress {
            name: name.into(),
            durable: durable.unwrap_or("-").into(),
            ..Default::default()
        });
        let id = rand::random::<u64>();
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(id, progress.clone());
        }
        if let Some(durable) = durable
            && let Ok(mut d) = self.departed.lock()
        {
            d.remove(&(name.to_string(), durable.to_string()));
        }
        BoardEntry { board: self, id, progress }
    }

    /// Every open session, then every durable subscription whose session ended, sorted
    /// by subscriber and durable name; `lag_seconds` is left 0 (the caller reads the
    /// oldest record's time from the bus).
    pub fn subscriptions(&self, last_offset: u64) -> Vec<Subscription> {
        let mut out: Vec<Subscription> = self
            .all()
            .iter()
            .map(|p| {
                let (lag_records, oldest) = p.lag(last_offset);
                Subscription {
                    subscriber: p.name.clone(),
                    durable: (p.durable != "-").then(|| p.durable.clone()),
                    connected: true,
                    cursor: p.acked.load(Ordering::Relaxed),
                    lag_records,
                    lag_seconds: 0.0,
                    disconnected_at: None,
                    oldest,
                }
            })
            .collect();
        if let Ok(d) = self.departed.lock() {
            for ((name, durable), (acked, at)) in d.iter() {
                let lag_records = last_offset.saturating_sub(*acked);
                out.push(Subscription {
                    subscriber: name.clone(),
                    durable: Some(durable.clone()),
                    connected: false,
                    cursor: *acked,
                    lag_records,
                    lag_seconds: 0.0,
                    disconnected_at: Some(*at),
                    oldest: (lag_records > 0).then_some(acked + 1),
                });
            }
        }
        out.sort_by(|a, b| (&a.subscriber, &a.durable, !a.connected).cmp(&(&b.subscriber, &b.durable, !b.connected)));
        out
    }

    /// Whether some open session is more than `lag` records behind `last_offset` while its
    /// window has room: the hub, not the subscriber, is what holds it back.
    pub fn hub_behind(&self, last_offset: u64, lag: u64) -> bool {
        let Ok(s) = self.sessions.lock() else { return false };
        s.values().any(|p| {
            let sent = p.sent.load(Ordering::Relaxed);
            let unacked = p.delivered.load(Ordering::Relaxed).saturating_sub(p.acked.load(Ordering::Relaxed));
            last_offset.saturating_sub(sent) > lag && unacked < p.window.load(Ordering::Relaxed)
        })
    }

    /// Every open session's position.
    pub fn all(&self) -> Vec<Arc<SubscriberProgress>> {
        self.sessions.lock().map(|s| s.values().cloned().collect()).unwrap_or_default()
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
    fn hub_is_behind_only_for_a_subscriber_with_room_that_waits_for_it() {
        let board = SubscriberBoard::default();
        assert!(!board.hub_behind(1_000_000, 10), "no subscriber: nothing to wait for");
        let entry = board.join("s", None);
        let p = &entry.progress;
        p.window.store(100, Ordering::Relaxed);
        p.sent.store(50, Ordering::Relaxed);
        p.delivered.store(50, Ordering::Relaxed);
        assert!(board.hub_behind(100, 10), "50 records unread, 50 of 100 in flight");
        assert!(!board.hub_behind(55, 10), "only 5 unread");
        // Its window is full: the subscriber, not the hub, holds it back.
        p.sent.store(120, Ordering::Relaxed);
        p.delivered.store(120, Ordering::Relaxed);
        p.acked.store(20, Ordering::Relaxed);
        assert!(!board.hub_behind(1_000, 10));
        p.acked.store(21, Ordering::Relaxed);
        assert!(board.hub_behind(1_000, 10));
        drop(entry);
        assert!(!board.hub_behind(1_000, 10), "gone from the board");
    }

    #[test]
    fn durable_subscriptions_are_remembered_after_their_session_ends() {
        let board = SubscriberBoard::default();
        let a = board.join("ops", Some("d1"));
        a.progress.acked.store(5, Ordering::Relaxed);
        a.progress.sent.store(5, Ordering::Relaxed);
        a.progress.delivered.store(5, Ordering::Relaxed);
        let b = board.join("tail", None);
        let subs = board.subscriptions(8);
        assert_eq!(subs.len(), 2);
        assert!(subs.iter().all(|s| s.connected));
        assert_eq!(
            (subs[0].subscriber.as_str(), subs[0].durable.as_deref(), subs[0].lag_records),
            ("ops", Some("d1"), 3)
        );
        drop(a);
        drop(b);
        // The durable one stays listed, disconnected, with its cursor; the other is gone.
        let subs = board.subscriptions(10);
        assert_eq!(subs.len(), 1);
        assert_eq!((subs[0].connected, subs[0].cursor, subs[0].lag_records, subs[0].oldest), (false, 5, 5, Some(6)));
        assert!(subs[0].disconnected_at.is_some());
        // Back: connected again, listed once.
        let _again = board.join("ops", Some("d1"));
        let subs = board.subscriptions(10);
        assert_eq!(subs.len(), 1);
        assert!(subs[0].connected);
    }

    #[test]
    fn departed_durables_are_bounded() {
        let board = SubscriberBoard::default();
        for i in 0..DEPARTED_DURABLES + 10 {
            drop(board.join("s", Some(&format!("d{i}"))));
        }
        assert_eq!(board.subscriptions(0).len(), DEPARTED_DURABLES);
    }

    #[test]
    fn lag_counts_unacked_and_unread_records() {
        let p = SubscriberProgress::default();
        assert_eq!(p.lag(0), (0, None));
        p.sent.store(10, Ordering::Relaxed);
        p.delivered.store(10, Ordering::Relaxed);
        p.acked.store(7, Ordering::Relaxed);
        assert_eq!(p.lag(15), (3 + 5, Some(8)));
        p.acked.store(10, Ordering::Relaxed);
        assert_eq!(p.lag(15), (5, Some(11)));
        // Records its filter skipped were read for it: they are not lag.
        p.sent.store(15, Ordering::Relaxed);
        assert_eq!(p.lag(15), (0, None));
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
        assert!(out.ends_with("fleetwatch_hub_scraped 0\n# EOF\n"), "{out}");
        assert_eq!(out.matches("# EOF").count(), 1, "{out}");
        assert!(out.contains("fleetwatch_hub_connects_total{role=\"agent\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_disconnects_total{role=\"agent\",reason=\"peer-closed\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_handshake_failures_total{reason=\"tls-handshake\"} 1"), "{out}");
        assert!(out.contains("fleetwatch_hub_rejected_total{reason=\"tls-handshake\"} 1"), "{out}");
    }
}
