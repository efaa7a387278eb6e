//! The two kinds of session a connection becomes once its certificate says who it is:
//! an agent's ([`agent`], events in) and a subscriber's ([`subscriber`], events out),
//! with what both share: the connection itself ([`conn`]: reading, keep-alive, how a
//! session ends), the live sessions per subscriber identity ([`slots`]), and
//! [`Sessions`], everything a session may use and nothing else. The pure rules they carry
//! out live beside them: `ingest` and `in_flight` for agents, `delivery` for subscribers.

pub(crate) mod agent;
pub(crate) mod conn;
pub(crate) mod heads;
pub(crate) mod lean_tls;
pub(crate) mod slots;
pub(crate) mod subscriber;

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_bus::Bus;
use fleetwatch_protocol::Limits;

use crate::config::HubConfig;
use crate::metrics::Metrics;
use crate::peer::Peer;
use crate::registry::SessionRegistry;

/// What agent and subscriber sessions need, and nothing else: their settings, the bus,
/// the registry, the metrics, the watch configuration pushed to agents, the deny list.
pub(crate) struct Sessions {
    pub(crate) settings: SessionSettings,
    pub(crate) bus: Arc<dyn Bus>,
    pub(crate) registry: SessionRegistry,
    pub(crate) metrics: Metrics,
    /// Where each subscriber session is: fan-out progress, which ingest waits on.
    pub(crate) fanout: crate::fanout::FanOut,
    /// The watch configuration pushed to agents.
    pub(crate) watches: tokio::sync::watch::Sender<Arc<Vec<fleetwatch_protocol::message::WatchSpec>>>,
    /// The deny list in force.
    pub(crate) revocation: crate::policy::revocation::Revocation,
    /// The subscriber access policy in force.
    pub(crate) access: crate::policy::access::AccessControl,
    /// Live subscriber sessions per identity (`--max-sessions-per-subscriber`).
    pub(crate) subscriber_slots: slots::SubscriberSlots,
    /// The Runtimes read from the control plane (the access policy's `clusterSelector`
    /// looks up their labels); the same view as [`crate::context::Context::runtimes`].
    pub(crate) runtimes: crate::fleet::SharedRuntimes,
    /// The agent sessions that look at their cluster's head when another agent process's
    /// head is recorded (on a shared bus).
    pub(crate) heads: Arc<heads::HeadWatch>,
}

/// The limits and timeouts sessions apply (from [`HubConfig`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SessionSettings {
    pub(crate) limits: Limits,
    pub(crate) handshake_timeout: Duration,
    pub(crate) idle_timeout: Duration,
    pub(crate) max_events_per_sec: u32,
    pub(crate) subscriber_stall_timeout: Duration,
    pub(crate) max_sessions_per_subscriber: usize,
}

impl SessionSettings {
    pub(crate) fn from_config(c: &HubConfig) -> Self {
        Self {
            limits: c.limits,
            handshake_timeout: c.handshake_timeout,
            idle_timeout: c.idle_timeout,
            max_events_per_sec: c.max_events_per_sec,
            subscriber_stall_timeout: c.subscriber_stall_timeout,
            max_sessions_per_subscriber: c.max_sessions_per_subscriber.max(1),
        }
    }
}

impl Sessions {
    /// Whether the peer's certificate is denied now.
    pub(crate) fn revoked(&self, peer: &Peer) -> bool {
        self.revocation.current().denies(&peer.identity, &peer.serial)
    }

    /// Why the hub ends this peer's session, if it does: revoked, expired, CA gone.
    pub(crate) fn end_reason(&self, peer: &Peer) -> Option<String> {
        peer.ended.get().cloned().or_else(|| self.revoked(peer).then(|| "certificate revoked".to_string()))
    }
}
