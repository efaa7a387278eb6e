//! One agent's session: hello / welcome, then batches appended to the bus and acked.
//!
//! The cluster id comes from the certificate; a frame that claims another one is
//! rejected. Acks are sent only after the bus accepted a batch, and delayed (never
//! dropped) when the agent exceeds its event rate; resync markers count against that rate
//! too, and one that would follow another with nothing in between is acked unstored.
//! A second agent for a connected cluster id is refused (see [`crate::registry`]).

use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use fleetwatch_protocol::codec::{DecodeError, decode_agent, encode};
use fleetwatch_protocol::event::{event_id, source_for};
use fleetwatch_protocol::message::{
    Ack, AgentMessage, Configure, ErrorCode, EventBatch, Hello, HubToAgent, PROTOCOL_VERSION, Resync, Welcome,
};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::bus::{Append, RecordBody};
use crate::conn::{Conn, Incoming};
use crate::rate::{Budget, RESYNCS_PER_SEC};
use crate::registry::{Admission, Opening};
use crate::{Context, Peer};

pub(crate) async fn run(mut conn: Conn, cluster: String, peer: Peer, ctx: Arc<Context>, shutdown: CancellationToken) {
    let limits = ctx.config.limits;
    // The first message must be a hello, within the handshake timeout.
    let Some(first) = conn.first_message(ctx.config.handshake_timeout, &shutdown).await else {
        return conn.close(CloseCode::Away, "hub shutting down").await;
    };
    let hello = match first {
        Err(_) => {
            ctx.metrics.reject("hello-timeout");
            return conn.fail(ErrorCode::Forbidden, "no hello within the handshake timeout", CloseCode::Policy).await;
        }
        Ok(Incoming::Message(bytes)) => match decode_agent(&bytes, &limits) {
            Ok(AgentMessage::Hello(h)) => h,
            Ok(_) => {
                ctx.metrics.reject("no-hello");
                return conn.fail(ErrorCode::Forbidden, "the first message must be hello", CloseCode::Policy).await;
            }
            Err(DecodeError::UnknownType(t)) if is_subscriber_message(&t) => {
                ctx.metrics.reject("agent-sent-subscriber-message");
                let msg = format!("an agent certificate cannot subscribe ({t:?}); agents can only publish");
                return conn.fail(ErrorCode::Forbidden, msg, CloseCode::Policy).await;
            }
            Err(e) => return reject_decode(conn, &ctx, e).await,
        },
        Ok(Incoming::Invalid(why)) => {
            ctx.metrics.reject("invalid-frame");
            return conn.fail(ErrorCode::Malformed, why, CloseCode::Invalid).await;
        }
        Ok(Incoming::TooLarge(why)) => {
            ctx.metrics.reject("too-large");
            return conn.close(CloseCode::Size, &format!("message too large: {why}")).await;
        }
        Ok(_) => return,
    };
    if hello.protocol != PROTOCOL_VERSION {
        ctx.metrics.reject("protocol-version");
        let msg = format!("protocol {} is not supported; this hub speaks {PROTOCOL_VERSION}", hello.protocol);
        return conn.fail(ErrorCode::UnsupportedVersion, msg, CloseCode::Policy).await;
    }
    if let Some(claimed) = &hello.cluster
        && claimed != &cluster
    {
        ctx.metrics.reject("identity-mismatch");
        tracing::warn!(%claimed, "hello claims another cluster");
        let msg = format!("hello claims cluster {claimed:?} but the certificate says {cluster:?}");
        return conn.fail(ErrorCode::IdentityMismatch, msg, CloseCode::Policy).await;
    }

    let session_id = format!("{:016x}", rand::random::<u64>());
    let cancel = shutdown.child_token();
    conn.count_pings(ctx.metrics.pings_sent.clone());
    let opening = Opening {
        session: &session_id,
        remote: &conn.peer.to_string(),
        agent_version: &hello.agent_version,
        epoch: hello.epoch,
        cancel: cancel.clone(),
        liveness: conn.liveness(),
    };
    // A live session answers pings every ping interval: silence over two of them means
    // it missed a round and is presumed dead.
    let stale_after = 2 * Conn::ping_interval(ctx.config.idle_timeout);
    match ctx.registry.open(&cluster, opening, stale_after) {
        Admission::Opened { replaced: None } => {}
        Admission::Opened { replaced: Some(why) } => tracing::info!(%why, "new session replaces the old one"),
        Admission::Conflict { connected_from, since } => {
            ctx.metrics.cluster_conflicts.inc();
            ctx.metrics.reject("cluster-already-connected");
            let since = since.map(|t| format!(" since {t}")).unwrap_or_default();
            let msg = format!(
                "cluster {cluster:?} is already connected from {connected_from}{since} (another agent process with \
                 the same cluster id); this agent (epoch {}) is refused: stop one of them or give it its own \
                 cluster certificate",
                hello.epoch
            );
            tracing::warn!(%connected_from, epoch = hello.epoch, "second agent for a connected cluster refused");
            return conn.fail(ErrorCode::ClusterAlreadyConnected, msg, CloseCode::Policy).await;
        }
    }
    ctx.metrics.agent_sessions.inc();
    tracing::info!(session = %session_id, epoch = hello.epoch, last_acked = hello.last_acked_seq, "agent connected");
    let cluster: Arc<str> = Arc::from(cluster);
    let mut session = Session {
        ctx: ctx.clone(),
        cluster: cluster.clone(),
        epoch: hello.epoch,
        acked: 0,
        budget: ctx.registry.budget(&cluster, ctx.config.max_events_per_sec),
        warned_rate: false,
    };
    let result = session.serve(&mut conn, &hello, &session_id, &cancel, &shutdown, &peer).await;
    ctx.metrics.agent_sessions.dec();
    ctx.registry.close(&cluster, &session_id);
    match result {
        Ok(()) => {}
        Err(end) => match end {
            End::Closed(why) => tracing::info!(%why, "agent disconnected"),
            End::Fail(code, msg, close) => {
                if code == ErrorCode::ShuttingDown || code == ErrorCode::Replaced {
                    tracing::info!(%code, %msg, "closing agent session");
                } else {
                    tracing::warn!(%code, %msg, "closing agent session");
                }
                conn.fail(code, msg, close).await;
            }
            End::Close(close, msg) => {
                tracing::info!(%msg, "closing agent session");
                conn.close(close, &msg).await;
            }
        },
    }
}

enum End {
    Closed(String),
    Fail(ErrorCode, String, CloseCode),
    Close(CloseCode, String),
}

struct Session {
    ctx: Arc<Context>,
    cluster: Arc<str>,
    epoch: u64,
    acked: u64,
    /// The cluster's rate budget, shared by its sessions: reconnecting does not refill it.
    budget: Arc<std::sync::Mutex<Budget>>,
    warned_rate: bool,
}

impl Session {
    async fn serve(
        &mut self,
        conn: &mut Conn,
        hello: &Hello,
        session_id: &str,
        cancel: &CancellationToken,
        shutdown: &CancellationToken,
        peer: &Peer,
    ) -> Result<(), End> {
        self.acked = self.resume_point(hello).await?;
        let mut watches_rx = self.ctx.watches.subscribe();
        let welcome = HubToAgent::Welcome(Welcome {
            protocol: PROTOCOL_VERSION,
            session: session_id.into(),
            cluster: self.cluster.to_string(),
            epoch: self.epoch,
            acked_seq: self.acked,
            watches: watches_rx.borrow_and_update().as_ref().clone(),
            max_event_bytes: Some(self.ctx.config.limits.max_event_bytes),
        });
        conn.send_text(encode(&welcome)).await.map_err(|e| End::Closed(e.to_string()))?;
        loop {
            let incoming = tokio::select! {
                m = conn.recv() => m,
                Ok(()) = watches_rx.changed() => {
                    let watches = watches_rx.borrow_and_update().as_ref().clone();
                    tracing::info!(watches = watches.len(), "pushing new watch configuration");
                    let msg = HubToAgent::Configure(Configure { watches });
                    conn.send_text(encode(&msg)).await.map_err(|e| End::Closed(e.to_string()))?;
                    continue;
                }
                _ = cancel.cancelled() => {
                    return Err(if let Some(why) = self.ctx.end_reason(peer) {
                        End::Fail(ErrorCode::Forbidden, why, CloseCode::Policy)
                    } else if shutdown.is_cancelled() {
                        End::Fail(ErrorCode::ShuttingDown, "hub shutting down".into(), CloseCode::Away)
                    } else {
                        End::Fail(ErrorCode::Replaced, "a newer session of this agent (or one replacing this silent session) took over".into(), CloseCode::Policy)
                    });
                }
            };
            let bytes = match incoming {
                Incoming::Message(b) => b,
                Incoming::Closed(why) => return Err(End::Closed(why)),
                Incoming::Idle => return Err(End::Close(CloseCode::Away, "idle timeout".into())),
                Incoming::TooLarge(why) => {
                    self.ctx.metrics.reject("too-large");
                    return Err(End::Close(CloseCode::Size, format!("message too large: {why}")));
                }
                Incoming::Invalid(why) => {
                    self.ctx.metrics.reject("invalid-frame");
                    return Err(End::Fail(ErrorCode::Malformed, why, CloseCode::Invalid));
                }
            };
            self.ctx.registry.seen(&self.cluster);
            // A batch in progress is finished (appended and acked) even when shutdown
            // starts meanwhile: cancellation is only looked at between messages.
            match decode_agent(&bytes, &self.ctx.config.limits) {
                Ok(AgentMessage::Events(batch)) => self.events(conn, batch).await?,
                Ok(AgentMessage::Resync(r)) => self.resync(conn, r).await?,
                Ok(AgentMessage::Inventory(inv)) => self.ctx.registry.inventory(&self.cluster, inv.modules),
                Ok(AgentMessage::WatchStatus(report)) => {
                    tracing::debug!(watches = report.watches.len(), "watch status");
                    self.ctx.registry.watch_status(&self.cluster, report.watches);
                }
                Ok(AgentMessage::Hello(_)) => {
                    self.ctx.metrics.reject("duplicate-hello");
                    conn.send_error(ErrorCode::Forbidden, "hello was already received", false).await;
                }
                Err(DecodeError::UnknownType(t)) if is_subscriber_message(&t) => {
                    self.ctx.metrics.reject("agent-sent-subscriber-message");
                    let msg = format!("an agent certificate cannot subscribe ({t:?}); agents can only publish");
                    return Err(End::Fail(ErrorCode::Forbidden, msg, CloseCode::Policy));
                }
                Err(DecodeError::UnknownType(t)) => {
                    self.ctx.metrics.reject("unknown-type");
                    conn.send_error(ErrorCode::UnknownType, format!("unknown message type {t:?}"), false).await;
                }
                Err(e) => {
                    self.ctx.metrics.reject("malformed");
                    return Err(End::Fail(e.code(), e.to_string(), CloseCode::Invalid));
                }
            }
        }
    }

    /// Works out what the hub has of this agent's stream. When the agent was acked more
    /// than the cluster's head shows, subscribers may have missed something: a resync
    /// marker is recorded with the true reason (see [`resume_gap`]), unless one is
    /// already pending at the head.
    async fn resume_point(&mut self, hello: &Hello) -> Result<u64, End> {
        let head = self.ctx.bus.head(&self.cluster);
        let (have, reason) = resume_gap(head, hello.epoch, hello.last_acked_seq, self.ctx.bus.is_durable());
        let Some(reason) = reason else { return Ok(have) };
        if self.ctx.registry.resync_pending(&self.cluster, head) {
            tracing::info!(%reason, "a resync-required is already pending for this cluster; not recording another");
            return Ok(hello.last_acked_seq);
        }
        tracing::warn!(%reason, "recording resync-required");
        self.append(vec![Append {
            epoch: hello.epoch,
            seq: hello.last_acked_seq,
            body: RecordBody::ResyncRequired(reason),
        }])
        .await?;
        self.ctx.registry.resync_stored(&self.cluster, hello.epoch, hello.last_acked_seq);
        self.ctx.metrics.resyncs.inc();
        Ok(hello.last_acked_seq)
    }

    /// Appends to the bus. A storage failure ends the session with its real cause (the
    /// batch is not acked; the agent resends it after reconnecting).
    async fn append(&self, items: Vec<Append>) -> Result<(), End> {
        let started = Instant::now();
        self.ctx.bus.append(self.cluster.clone(), items).await.map_err(|e| {
            tracing::warn!(error = %e, "bus append failed: batch not acked");
            let code = match e {
                crate::bus::BusError::Closed => ErrorCode::ShuttingDown,
                crate::bus::BusError::Storage(_) => ErrorCode::Internal,
            };
            End::Fail(code, format!("hub could not store events: {e}"), CloseCode::Error)
        })?;
        self.ctx.metrics.append_seconds.observe(started.elapsed().as_secs_f64());
        Ok(())
    }

    async fn events(&mut self, conn: &mut Conn, batch: EventBatch) -> Result<(), End> {
        let limits = &self.ctx.config.limits;
        if batch.events.len() > limits.max_batch_events {
            self.ctx.metrics.reject("batch-too-large");
            let msg =
                format!("batch of {} events exceeds the limit of {}", batch.events.len(), limits.max_batch_events);
            return Err(End::Fail(ErrorCode::LimitExceeded, msg, CloseCode::Size));
        }
        let mut items = Vec::with_capacity(batch.events.len());
        let mut last = self.acked;
        for mut ev in batch.events {
            if !ev.cluster.is_empty() && *ev.cluster != *self.cluster {
                self.ctx.metrics.reject("identity-mismatch");
                let msg =
                    format!("event {} claims cluster {:?}; the certificate says {:?}", ev.id, ev.cluster, self.cluster);
                return Err(End::Fail(ErrorCode::IdentityMismatch, msg, CloseCode::Policy));
            }
            if ev.epoch != self.epoch {
                let msg = format!("event of epoch {} in a session of epoch {}", ev.epoch, self.epoch);
                return Err(End::Fail(ErrorCode::BadSequence, msg, CloseCode::Policy));
            }
            if ev.seq == 0 {
                self.ctx.metrics.reject("seq-zero");
                let msg = format!("event {} has seq 0: sequence numbers start at 1", ev.subject);
                return Err(End::Fail(ErrorCode::BadSequence, msg, CloseCode::Policy));
            }
            if ev.seq <= last {
                if ev.seq <= self.acked {
                    continue; // a resend of something already stored
                }
                let msg = format!("seq {} after {last}: sequence numbers must increase", ev.seq);
                return Err(End::Fail(ErrorCode::BadSequence, msg, CloseCode::Policy));
            }
            // The hub, not the agent, vouches for where an event comes from.
            ev.cluster = self.cluster.to_string();
            ev.source = source_for(&self.cluster);
            ev.id = event_id(&self.cluster, ev.epoch, ev.seq);
            ev.cursor = None;
            last = ev.seq;
            if ev.kind == fleetwatch_protocol::event::TYPE_INVENTORY
                && let Ok(inv) = serde_json::from_value::<fleetwatch_protocol::message::Inventory>(ev.data.clone())
            {
                self.ctx.registry.inventory(&self.cluster, inv.modules);
            }
            let json = serde_json::to_vec(&ev).unwrap_or_default();
            if json.len() > limits.max_event_bytes {
                self.ctx.metrics.reject("event-too-large");
                let msg = format!("event {} of {} bytes exceeds {}", ev.subject, json.len(), limits.max_event_bytes);
                return Err(End::Fail(ErrorCode::LimitExceeded, msg, CloseCode::Size));
            }
            items.push(Append { epoch: ev.epoch, seq: ev.seq, body: RecordBody::Event(Bytes::from(json)) });
        }
        if items.is_empty() {
            return self.ack(conn).await;
        }
        self.throttle(conn, items.len()).await;
        let n = items.len() as u64;
        self.append(items).await?;
        self.acked = last;
        self.ctx.metrics.events_received.inc_by(n);
        self.ctx.registry.acked(&self.cluster, self.epoch, last, n);
        self.ack(conn).await
    }

    async fn resync(&mut self, conn: &mut Conn, r: Resync) -> Result<(), End> {
        if r.seq == 0 {
            self.ctx.metrics.reject("seq-zero");
            let msg = "resync with seq 0: sequence numbers start at 1".to_string();
            return Err(End::Fail(ErrorCode::BadSequence, msg, CloseCode::Policy));
        }
        if r.epoch != self.epoch || r.seq <= self.acked {
            if r.epoch == self.epoch {
                return self.ack(conn).await; // a resend
            }
            let msg = format!("resync for epoch {} in a session of epoch {}", r.epoch, self.epoch);
            return Err(End::Fail(ErrorCode::BadSequence, msg, CloseCode::Policy));
        }
        // Every resync counts, stored or coalesced: a flood of them is slowed down like
        // a flood of events.
        let wait = self.budget.lock().unwrap_or_else(|e| e.into_inner()).take_resync();
        self.delay_ack(conn, wait).await;
        // The decoder already cut the reason to the limit; cut again in case the limits
        // were configured apart.
        let mut reason = if r.reason.is_empty() { "agent resync".to_string() } else { r.reason };
        fleetwatch_protocol::codec::cut_reason(&mut reason, self.ctx.config.limits.max_reason_bytes);
        let head = self.ctx.bus.head(&self.cluster);
        if self.ctx.registry.resync_pending(&self.cluster, head) {
            // Nothing was stored since the last marker: subscribers reconcile once anyway.
            tracing::info!(%reason, seq = r.seq, "agent requested resync; one is already pending, acked without storing");
            self.ctx.metrics.resyncs_coalesced.inc();
        } else {
            tracing::info!(%reason, seq = r.seq, "agent requested resync");
            self.append(vec![Append { epoch: r.epoch, seq: r.seq, body: RecordBody::ResyncRequired(reason) }]).await?;
            self.ctx.registry.resync_stored(&self.cluster, r.epoch, r.seq);
            self.ctx.metrics.resyncs.inc();
        }
        self.acked = r.seq;
        self.ctx.registry.acked(&self.cluster, self.epoch, r.seq, 0);
        self.ack(conn).await
    }

    /// Delays the ack while the agent is over its rate: back-pressure, never dropping.
    async fn throttle(&mut self, conn: &mut Conn, n: usize) {
        // A poisoned lock only means a panic elsewhere mid-update: the budget is still usable.
        let wait = self.budget.lock().unwrap_or_else(|e| e.into_inner()).take_events(n);
        self.delay_ack(conn, wait).await;
    }

    /// Waits `wait` before the next ack, telling the agent once why.
    async fn delay_ack(&mut self, conn: &mut Conn, wait: std::time::Duration) {
        if wait.is_zero() {
            return;
        }
        if !self.warned_rate {
            self.warned_rate = true;
            let msg = format!(
                "over {} events/s or {RESYNCS_PER_SEC} resyncs/s: acks are delayed",
                self.ctx.config.max_events_per_sec
            );
            tracing::info!(%msg, "throttling agent");
            conn.send_error(ErrorCode::RateLimited, msg, false).await;
        }
        self.ctx.metrics.throttled_seconds.inc_by(wait.as_secs_f64());
        tokio::time::sleep(wait).await;
    }

    async fn ack(&self, conn: &mut Conn) -> Result<(), End> {
        let ack = HubToAgent::Ack(Ack { epoch: self.epoch, seq: self.acked });
        conn.send_text(encode(&ack)).await.map_err(|e| End::Closed(e.to_string()))
    }
}

/// What the hub has of an agent's stream at resume, and why subscribers need a resync
/// when it has less than the agent was acked: `(have, reason)`.
fn resume_gap(head: Option<(u64, u64)>, epoch: u64, last_acked: u64, durable: bool) -> (u64, Option<String>) {
    let lost_cause = if durable {
        "its data directory lost them (damaged, truncated or replaced)"
    } else {
        "the hub restarted without a data directory"
    };
    match head {
        Some((e, seq)) if e == epoch => {
            let reason = (last_acked > seq).then(|| {
                format!("hub lost acked events {}..={last_acked} of agent epoch {epoch}: {lost_cause}", seq + 1)
            });
            (seq, reason)
        }
        Some((other, seq)) => {
            let reason = (last_acked > 0).then(|| {
                format!(
                    "another agent process of this cluster (epoch {other}, up to seq {seq}) stored events after this \
                     agent's last acked seq {last_acked} of epoch {epoch}: the two streams interleave"
                )
            });
            (0, reason)
        }
        None => {
            let reason = (last_acked > 0).then(|| {
                format!(
                    "hub lost acked events 1..={last_acked} of agent epoch {epoch} (it has no record of this cluster): \
                     {lost_cause}"
                )
            });
            (0, reason)
        }
    }
}

fn is_subscriber_message(t: &str) -> bool {
    t == "subscribe"
}

async fn reject_decode(conn: Conn, ctx: &Context, e: DecodeError) {
    ctx.metrics.reject(match e {
        DecodeError::TooLarge { .. } => "too-large",
        DecodeError::Malformed(_) => "malformed",
        DecodeError::UnknownType(_) => "unknown-type",
    });
    let close = if matches!(e, DecodeError::TooLarge { .. }) { CloseCode::Size } else { CloseCode::Invalid };
    conn.fail(e.code(), e.to_string(), close).await;
}

#[cfg(test)]
mod tests {
    use super::resume_gap;

    #[test]
    fn resume_reasons_say_what_happened() {
        // Nothing acked, nothing stored: no resync.
        assert_eq!(resume_gap(None, 5, 0, false), (0, None));
        // The hub has all it acked.
        assert_eq!(resume_gap(Some((5, 10)), 5, 10, true), (10, None));
        // An in-memory hub restarted.
        let (have, r) = resume_gap(None, 5, 10, false);
        assert_eq!(have, 0);
        assert!(r.unwrap().contains("restarted without a data directory"));
        // A durable hub lost part of the epoch.
        let r = resume_gap(Some((5, 4)), 5, 10, true).1.unwrap();
        assert!(r.contains("5..=10") && r.contains("data directory lost"), "{r}");
        // Another agent process stored events meanwhile: not a "restart without storage".
        let r = resume_gap(Some((9, 3)), 5, 10, true).1.unwrap();
        assert!(r.contains("another agent process") && r.contains("epoch 9"), "{r}");
        assert!(!r.contains("storage"), "{r}");
    }
}
