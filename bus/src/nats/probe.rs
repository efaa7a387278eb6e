//! Health: the probe that checks the connection and the stream every second.
//!
//! [`Bus::health`] is `Err(cause)` while the NATS connection is down, the stream does not
//! answer (checked every second), or the last publish failed: the hub's `/readyz` turns 503
//! and agents are not acked (they keep their outboxes and resend).

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::jetstream::{JetStream, JsError};
use super::recreate::MISSING_CONFIRM;
use super::tail::StreamState;
use super::{NatsBus, REQUEST_TIMEOUT, lock};

/// Probes in a row that time out on a connection that looks up before the hub connects
/// again (to another server where there is one). A frozen server keeps its TCP connections
/// open and the client's pings take minutes to notice; a JetStream cluster with quorum
/// serves through any other node.
const SILENT_PROBES: u32 = 2;

/// Checks every second (and at once when an ack showed the stream went backwards) that
/// the connection is up and the stream answers; recreates the stream when JetStream lost
/// it, and takes on one another replica recreated (see [`NatsBus::recreate`]).
pub(super) async fn probe<J: JetStream>(bus: Weak<NatsBus<J>>, recheck: Arc<tokio::sync::Notify>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Since when probes in a row found no stream: a moment alone may be a server still
    // starting up.
    let mut missing: Option<tokio::time::Instant> = None;
    // Probes in a row that timed out on a connection that looks up: the server this hub
    // is connected to may be frozen while the others of its cluster serve.
    let mut silent = 0u32;
    loop {
        tokio::select! {
            _ = every.tick() => {}
            _ = recheck.notified() => {}
        }
        let Some(bus) = bus.upgrade() else { return };
        let verdict = if let Some(state) = bus.js.disconnected() {
            missing = None;
            Some(format!("not connected to NATS at {} ({state})", bus.js.servers()))
        } else {
            // Numbered before it is sent: a probe numbered after a moment reads the stream as
            // it is after that moment.
            let number = bus.probes_begun.fetch_add(1, Ordering::SeqCst) + 1;
            match tokio::time::timeout(REQUEST_TIMEOUT, bus.js.stream_info()).await {
                Ok(Ok(info)) => {
                    missing = None;
                    if info.created_ns != *lock(&bus.created) {
                        bus.adopt(info).await.err().map(|e| e.to_string())
                    } else {
                        let base = bus.base.load(Ordering::SeqCst);
                        let last = info.state.last_sequence + base;
                        bus.stream_last.fetch_max(last, Ordering::Relaxed);
                        *lock(&bus.stream_state) = StreamState::of(&info.state, base);
                        bus.probed.send_replace((number, last));
                        None
                    }
                }
                Ok(Err(JsError::NotFound)) => {
                    let since = *missing.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() < MISSING_CONFIRM {
                        Some(format!("JetStream stream {} does not exist (did NATS lose its store?)", bus.stream))
                    } else {
                        bus.recreate().await.err().map(|e| e.to_string())
                    }
                }
                Ok(Err(e)) => {
                    missing = None;
                    Some(format!("JetStream stream {} does not answer: {e}", bus.stream))
                }
                Err(_) => Some(format!("JetStream stream {} does not answer within {REQUEST_TIMEOUT:?}", bus.stream)),
            }
        };
        let timed_out = verdict.as_deref().is_some_and(|v| v.contains("timed out") || v.contains("within"));
        silent = if timed_out && bus.js.disconnected().is_none() { silent + 1 } else { 0 };
        if silent >= SILENT_PROBES {
            silent = 0;
            tracing::warn!(
                servers = %bus.js.servers(),
                "the NATS server this hub is connected to does not answer: connecting again, to another server of the cluster where there is one"
            );
            bus.js.reconnect().await;
        }
        let mut unhealthy = lock(&bus.unhealthy);
        if *unhealthy != verdict {
            match &verdict {
                Some(cause) => tracing::warn!(%cause, "bus not ready"),
                None => tracing::info!(stream = %bus.stream, "JetStream reachable again"),
            }
            *unhealthy = verdict;
        }
    }
}
