//! One subscriber's session, the fan-out end of the bus: where to start, events in bus
//! order with their cursors, `resync-required` for history it cannot get, acks, durable
//! cursors, and disconnecting a subscriber that stops draining (so one slow reader cannot
//! hold hub memory). Frames are built by [`EventsFrame`] from the stored JSON: the hub
//! serialises an event once, on arrival, and never parses it again here. Where it starts,
//! its window and its filter are decided by the pure [`crate::delivery`]; its position is
//! published to [`crate::fanout`].

use std::sync::Arc;

use tokio::time::Instant;

use fleetwatch_protocol::Limits;
use fleetwatch_protocol::codec::{AGENT_MESSAGE_TYPES, DecodeError, EventsFrame, decode_subscriber, encode};
use fleetwatch_protocol::message::{
    ErrorCode, HubToSubscriber, ProtocolRange, ResyncRequired, StartFrom, Subscribe, Subscribed, SubscriberMessage,
};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::delivery::{self, Asked, Filter, Start, StoredCursor, Window};
use crate::peer::Peer;
use crate::policy::access::{Decision, Grant};
use crate::session::Sessions;
use crate::session::conn::{Conn, End};
use fleetwatch_bus::{ALL_CLUSTERS, BusError, Gap, Lookup, Read, RecordBody};

/// Most records read from the bus for one frame.
const READ_CHUNK: usize = 512;

pub(crate) async fn run(mut conn: Conn, name: String, peer: Peer, ctx: Arc<Sessions>, shutdown: CancellationToken) {
    let limits = ctx.settings.limits;
    let first = conn.first_message("subscribe", ctx.settings.handshake_timeout, &shutdown, &ctx.metrics).await;
    let (sub, protocol) = match first.and_then(|bytes| first_subscribe(&ctx, &bytes, &limits)) {
        Ok(negotiated) => negotiated,
        Err(end) => return Box::pin(end.finish(conn, "subscriber")).await,
    };
    // The access policy: the subscriber must be named, and ask only for granted clusters.
    let grant = match granted(&ctx, &name, &sub.clusters) {
        Ok(g) => g,
        Err(why) => {
            ctx.metrics.reject("access-policy");
            tracing::warn!(subscriber = %name, "refused: {why}");
            let end = End::Fail(ErrorCode::Forbidden, why, CloseCode::Policy);
            return Box::pin(end.finish(conn, "subscriber")).await;
        }
    };
    // A durable subscription is named after the certificate, so one subscriber cannot
    // take over another's cursor.
    let durable = sub.durable.clone().map(|d| (name.clone(), d));
    ctx.metrics.subscriber_sessions.inc();
    ctx.metrics.connected("subscriber");
    let board = ctx.fanout.join(&name, sub.durable.as_deref());
    let max_sessions = ctx.settings.max_sessions_per_subscriber;
    let (slot, evicted) = ctx.subscriber_slots.take(
        &peer.identity,
        max_sessions,
        board.progress.clone(),
        peer.ended.clone(),
        shutdown.clone(),
    );
    for e in evicted {
        ctx.metrics.reject("subscriber-sessions-per-identity");
        tracing::warn!(
            subscriber = %name,
            max = max_sessions,
            age_s = e.age.as_secs(),
            was_reading = e.was_reading,
            "closed an older session of this subscriber identity to make room (--max-sessions-per-subscriber)"
        );
    }
    let mut session = Session {
        progress: board.progress.clone(),
        ctx: ctx.clone(),
        name: name.clone(),
        durable,
        filter: Filter { clusters: sub.clusters.clone(), grant },
        access_generation: ctx.access.generation(),
        window: Window::new(0, delivery::DEFAULT_WINDOW),
        protocol,
    };
    let end = session.serve(&mut conn, &sub, &shutdown).await;
    let end = match ctx.end_reason(&peer).filter(|_| shutdown.is_cancelled()) {
        Some(why) if why.starts_with(crate::session::slots::EVICTED) => {
            End::Fail(ErrorCode::LimitExceeded, why, CloseCode::Policy)
        }
        Some(why) => End::Fail(ErrorCode::Forbidden, why, CloseCode::Policy),
        None => end,
    };
    drop(slot);
    ctx.metrics.subscriber_sessions.dec();
    ctx.metrics.disconnected("subscriber", end.reason());
    drop(board);
    Box::pin(end.finish(conn, "subscriber")).await;
}

/// The subscription the first message must be, and the protocol version the session speaks
/// (the highest the subscriber and this hub have in common).
fn first_subscribe(ctx: &Sessions, bytes: &[u8], limits: &Limits) -> Result<(Subscribe, u32), End> {
    match decode_subscriber(bytes, limits) {
        Ok(SubscriberMessage::Subscribe(s)) => match s.protocols().and_then(|p| ProtocolRange::OURS.negotiate(p)) {
            Ok(version) => Ok((s, version)),
            Err(e) => {
                ctx.metrics.reject("protocol-version");
                let msg = format!("subscriber protocol not supported: {e} (hub {})", env!("CARGO_PKG_VERSION"));
                Err(End::Fail(ErrorCode::UnsupportedVersion, msg, CloseCode::Policy))
            }
        },
        Ok(_) => Err(End::Fail(ErrorCode::Forbidden, "the first message must be subscribe".into(), CloseCode::Policy)),
        Err(DecodeError::UnknownType(t)) => {
            ctx.metrics.reject("subscriber-sent-agent-message");
            Err(End::Fail(ErrorCode::Forbidden, unexpected_type(&t), CloseCode::Policy))
        }
        Err(e) => Err(End::Fail(e.code(), e.to_string(), CloseCode::Invalid)),
    }
}

/// What the access policy grants `name` (`None`: no policy, everything), or why it is
/// refused: not named, or asking for clusters outside its grant.
fn granted(ctx: &Sessions, name: &str, asked: &[String]) -> Result<Option<Arc<Grant>>, String> {
    match ctx.access.decide(name) {
        Decision::Everything => Ok(None),
        Decision::Refused(why) => Err(why),
        Decision::Granted(g) => {
            let outside: Vec<&str> = asked.iter().filter(|c| !allows(ctx, &g, c)).map(String::as_str).collect();
            if outside.is_empty() {
                return Ok(Some(g));
            }
            let policy = ctx.access.describe();
            let grants = g.describe_clusters();
            Err(format!(
                "subscriber {name:?} may not read cluster(s) {}: the hub's access policy ({policy}) grants it {grants}",
                outside.join(", ")
            ))
        }
    }
}

/// Whether `g` covers `cluster` now: its globs, or the labels of the cluster's Runtime in
/// the hub's Runtime view (read per call, so a relabelled Runtime counts at once).
fn allows(ctx: &Sessions, g: &Grant, cluster: &str) -> bool {
    if !g.uses_runtime_labels() {
        return g.allows_cluster(cluster, None);
    }
    let view = ctx.runtimes.read().unwrap_or_else(|p| p.into_inner());
    g.allows_cluster(cluster, view.labels(cluster))
}

struct Session {
    ctx: Arc<Sessions>,
    /// The subscriber's name, from its certificate.
    name: String,
    /// (subscriber identity, durable name).
    durable: Option<(String, String)>,
    /// The clusters asked for and what the access policy grants (as of `access_generation`).
    filter: Filter,
    access_generation: u64,
    /// What was acked, read and sent, and how much may be unacked.
    window: Window,
    /// Where the session is, for the lag metrics.
    progress: Arc<crate::fanout::SubscriberProgress>,
    /// The protocol version negotiated at the subscribe, spoken for the whole session.
    protocol: u32,
}

impl Session {
    async fn serve(&mut self, conn: &mut Conn, sub: &Subscribe, shutdown: &CancellationToken) -> End {
        let bus = self.ctx.bus.clone();
        // The NATS bus starts following the stream with this replica's first reader.
        if let Err(e) = bus.prepare_reads().await {
            // A hub whose storage is not open yet (or failing) says so: the subscriber retries.
            return End::Fail(reads_refused(&e), format!("hub cannot read events: {e}"), CloseCode::Error);
        }
        let stored = match &self.durable {
            Some((identity, name)) => match bus.durable_lookup(identity, name).await {
                Ok(Lookup::Known(c)) => StoredCursor::Known(c),
                Ok(Lookup::New) => StoredCursor::None,
                Ok(Lookup::Lost) => StoredCursor::Lost(bus.resync_reason(Gap::LostCursor { name }).into_owned()),
                Err(e) => return durable_refused(e),
            },
            None => StoredCursor::None,
        };
        let asked = Asked {
            resume: sub.resume.as_ref().map(|r| (r.stream.as_str(), r.cursor)),
            stream: bus.stream_id(),
            lost_history: &bus.resync_reason(Gap::LostHistory),
        };
        let Start { cursor: start, resync_all, register } =
            delivery::start(asked, stored, || self.default_start(sub.from), || bus.last_offset());
        if let Some((identity, name)) = &self.durable
            && register
            && let Err(e) = bus.register_durable(identity, name, start).await
        {
            return durable_refused(e);
        }
        // Placed past everything up to `start`: a resync marker there is no longer one
        // nobody read (a later resync must not be coalesced into it).
        self.ctx.registry.read_past(start);
        self.window = Window::new(start, Window::size_for(sub.max_in_flight));
        self.publish_progress();
        let durable = self.durable.as_ref().map(|(_, d)| d.as_str()).unwrap_or("-");
        let clusters = if self.filter.clusters.is_empty() { "*".to_string() } else { self.filter.clusters.join(",") };
        tracing::info!(durable, start, %clusters, "subscriber connected");
        // Clusters nobody has heard of: probably a typo, said once here, at subscribe.
        let mut unknown_clusters: Vec<String> = Vec::new();
        for c in self.filter.clusters.iter().filter(|c| !self.ctx.registry.knows(c)) {
            if matches!(bus.head(c).await, Ok(None)) {
                unknown_clusters.push(c.clone());
            }
        }
        if !unknown_clusters.is_empty() {
            tracing::info!(unknown = %unknown_clusters.join(","), "subscriber filters on clusters this hub has never seen");
        }
        let hello = HubToSubscriber::Subscribed(Subscribed {
            protocol: self.protocol,
            stream: bus.stream_id().into(),
            cursor: start,
            unknown_clusters,
        });
        if let Err(e) = conn.send_text(encode(&hello)).await {
            return End::Closed(e.to_string());
        }
        if let Some(reason) = resync_all {
            tracing::warn!(durable, %reason, "subscriber must resync every cluster");
            let r = ResyncRequired { cluster: ALL_CLUSTERS.into(), cursor: start, reason };
            if let Err(e) = conn.send_text(encode(&HubToSubscriber::ResyncRequired(r))).await {
                return End::Closed(e.to_string());
            }
        }
        self.progress.window.store(self.window.size(), std::sync::atomic::Ordering::Relaxed);
        let mut end_rx = bus.watch_end();
        let stall = self.ctx.settings.subscriber_stall_timeout;
        loop {
            // The window is full and records wait: the subscriber must ack within the
            // stall timeout. An ack (see `handle`) restarts the clock.
            let look = self.window.look(bus.last_offset(), Instant::now(), stall);
            let (can_send, window_deadline) = (look.can_send, look.stall_at);
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return End::Fail(ErrorCode::ShuttingDown, "hub shutting down".into(), CloseCode::Away),
                m = conn.next_message(&self.ctx.metrics) => {
                    let handled = match m {
                        Ok(bytes) => self.handle(conn, &bytes).await,
                        Err(end) => Err(end),
                    };
                    if let Err(end) = handled {
                        return end;
                    }
                }
                _ = std::future::ready(()), if can_send => {
                    match tokio::time::timeout(stall, self.send_more(conn)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(end)) => return end,
                        // The socket stays blocked: only a close, best effort.
                        Err(_) => return self.stalled("a send did not complete", true),
                    }
                }
                _ = sleep_until_opt(window_deadline), if window_deadline.is_some() => {
                    return self.stalled("its window of unacked events stayed full with no ack", false);
                }
                changed = end_rx.changed(), if !can_send => {
                    if changed.is_err() {
                        return End::Fail(ErrorCode::Internal, "bus closed".into(), CloseCode::Error);
                    }
                }
            }
        }
    }

    /// Ends a session whose subscriber stopped draining: its durable cursor is kept. With
    /// the socket blocked only a close frame is tried; otherwise an error frame first.
    fn stalled(&self, what: &str, socket_blocked: bool) -> End {
        let stall = self.ctx.settings.subscriber_stall_timeout;
        self.ctx.metrics.subscriber_stalls.inc();
        self.ctx.metrics.reject("subscriber-stalled");
        let msg = format!(
            "subscriber stalled: {what} within {}s; disconnected (its durable cursor {} is kept)",
            stall.as_secs_f64(),
            self.window.acked()
        );
        tracing::error!(
            subscriber = %self.name,
            durable = self.durable.as_ref().map(|(_, d)| d.as_str()).unwrap_or("-"),
            sent = self.window.read(),
            acked = self.window.acked(),
            "{msg}"
        );
        if socket_blocked {
            End::Close(CloseCode::Away, "stalled", msg)
        } else {
            End::Fail(ErrorCode::LimitExceeded, msg, CloseCode::Policy)
        }
    }

    fn default_start(&self, from: StartFrom) -> u64 {
        match from {
            StartFrom::Earliest => self.ctx.bus.stats().first_offset.saturating_sub(1),
            StartFrom::Latest => self.ctx.bus.last_offset(),
        }
    }

    async fn handle(&mut self, conn: &mut Conn, bytes: &[u8]) -> Result<(), End> {
        match decode_subscriber(bytes, &self.ctx.settings.limits) {
            Ok(SubscriberMessage::Ack(a)) => {
                if let Some(cursor) = self.window.ack(a.cursor) {
                    self.publish_progress();
                    // Also at an equal cursor: the ack of a resync registers a name whose
                    // cursor was lost.
                    if let Some((identity, name)) = &self.durable
                        && let Err(e) = self.ctx.bus.set_durable_cursor(identity, name, cursor).await
                    {
                        tracing::warn!(error = %e, "durable cursor not stored");
                    }
                }
                Ok(())
            }
            Ok(SubscriberMessage::Subscribe(_)) => {
                conn.send_error(ErrorCode::Forbidden, "already subscribed", false).await;
                Ok(())
            }
            Err(DecodeError::UnknownType(t)) => {
                self.ctx.metrics.reject("unknown-type");
                let msg = unexpected_type(&t);
                conn.send_error(ErrorCode::Forbidden, msg, false).await;
                Ok(())
            }
            Err(e) => Err(End::Fail(e.code(), e.to_string(), CloseCode::Invalid)),
        }
    }

    fn wants(&self, cluster: &str) -> bool {
        self.filter.wants(cluster, |g, c| allows(&self.ctx, g, c))
    }

    /// Follows a reloaded access policy: a subscriber no longer named, or whose filter
    /// now reaches outside its grant, is ended.
    fn refresh_grant(&mut self) -> Result<(), End> {
        let generation = self.ctx.access.generation();
        if generation == self.access_generation {
            return Ok(());
        }
        self.access_generation = generation;
        match granted(&self.ctx, &self.name, &self.filter.clusters) {
            Ok(g) => {
                self.filter.grant = g;
                Ok(())
            }
            Err(why) => {
                tracing::warn!(subscriber = %self.name, "closing session: {why}");
                Err(End::Fail(ErrorCode::Forbidden, why, CloseCode::Policy))
            }
        }
    }

    /// Sends the next chunk: resync markers for evicted history first, then records in
    /// order, events batched into frames and each marker as its own frame.
    async fn send_more(&mut self, conn: &mut Conn) -> Result<(), End> {
        self.refresh_grant()?;
        let read = self.ctx.bus.read(self.window.read() + 1, READ_CHUNK).await.map_err(|e| {
            tracing::error!(error = %e, "bus read failed");
            End::Fail(ErrorCode::Internal, format!("hub could not read events: {e}"), CloseCode::Error)
        })?;
        // Before anything is sent: see `SessionRegistry::read_past`.
        self.ctx.registry.read_past(read.next.saturating_sub(1));
        self.send_read(conn, read).await.map_err(|e| End::Closed(e.to_string()))
    }

    /// Sends what one read returned.
    async fn send_read(&mut self, conn: &mut Conn, read: Read) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        // In the order the bus gives them, lowest offset first (see `Read::evicted`): the
        // subscriber acks each resync's offset.
        for (cluster, offset) in &read.evicted {
            if self.wants(cluster) {
                let r = ResyncRequired {
                    cluster: cluster.to_string(),
                    cursor: *offset,
                    reason: self.ctx.bus.resync_reason(Gap::Evicted { offset: *offset }).into_owned(),
                };
                conn.send_text(encode(&HubToSubscriber::ResyncRequired(r))).await?;
                self.window.sent_at(*offset);
            }
        }
        let mut frame = EventsFrame::new();
        for rec in &read.records {
            if !self.wants(&rec.cluster) {
                continue;
            }
            let marker = match &rec.body {
                RecordBody::Event(json) => {
                    let pushed = match self.through_grant(json) {
                        // A type outside the grant: like a cluster it filters out.
                        Inspected::Skip => continue,
                        Inspected::Unreadable(e) => Err(e),
                        Inspected::Send(Some(redacted)) => {
                            frame.push_with_cursor(rec.offset, &redacted).map_err(|e| e.to_string())
                        }
                        Inspected::Send(None) => frame.push_with_cursor(rec.offset, json).map_err(|e| e.to_string()),
                    };
                    match pushed {
                        Ok(()) => None,
                        Err(e) => {
                            // Never skipped silently: the subscriber reconciles the cluster.
                            tracing::error!(offset = rec.offset, cluster = %rec.cluster, error = %e, "unreadable stored event");
                            Some(format!("the hub's stored event at offset {} is unreadable: {e}", rec.offset))
                        }
                    }
                }
                RecordBody::ResyncRequired(reason) => Some(reason.clone()),
            };
            self.window.sent_at(rec.offset);
            if let Some(reason) = marker {
                self.flush(conn, &mut frame).await?;
                let r = ResyncRequired { cluster: rec.cluster.to_string(), cursor: rec.offset, reason };
                conn.send_text(encode(&HubToSubscriber::ResyncRequired(r))).await?;
            }
            if delivery::frame_full(frame.len_bytes(), self.ctx.settings.limits.max_message_bytes) {
                self.flush(conn, &mut frame).await?;
            }
        }
        self.flush(conn, &mut frame).await?;
        self.window.read_up_to(read.next - 1);
        self.publish_progress();
        Ok(())
    }

    /// What the grant makes of a stored event: skipped (its type is not granted), sent as
    /// stored (`None`: nothing to inspect) or with its redacted fields removed.
    fn through_grant(&self, json: &[u8]) -> Inspected {
        let Some(grant) = self.filter.grant.as_ref().filter(|g| g.inspects_events()) else {
            return Inspected::Send(None);
        };
        let mut event: serde_json::Value = match serde_json::from_slice(json) {
            Ok(v) => v,
            Err(e) => return Inspected::Unreadable(e.to_string()),
        };
        let kind = event.get("type").and_then(|t| t.as_str()).unwrap_or_default();
        if !grant.allows_type(kind) {
            return Inspected::Skip;
        }
        let removed = match event.get_mut("data") {
            Some(data) if !grant.redact.is_empty() => grant.redact(data),
            _ => 0,
        };
        if removed == 0 {
            return Inspected::Send(None);
        }
        match serde_json::to_vec(&event) {
            Ok(v) => Inspected::Send(Some(v)),
            Err(e) => Inspected::Unreadable(e.to_string()),
        }
    }

    /// Shows where the session is to the lag metrics.
    fn publish_progress(&self) {
        let w = &self.window;
        self.ctx.fanout.publish(&self.progress, w.acked(), w.read(), w.sent());
    }

    async fn flush(
        &self,
        conn: &mut Conn,
        frame: &mut EventsFrame,
    ) -> Result<(), tokio_tungstenite::tungstenite::Error> {
        let events = frame.events() as u64;
        let Some(text) = frame.take() else { return Ok(()) };
        conn.send_text(text).await?;
        self.ctx.metrics.events_delivered.inc_by(events);
        Ok(())
    }
}

/// What the access grant makes of one stored event.
enum Inspected {
    /// Not for this subscriber.
    Skip,
    /// Send it: as stored (`None`) or redacted.
    Send(Option<Vec<u8>>),
    /// It cannot be parsed.
    Unreadable(String),
}

/// Ends a session whose durable subscription the bus refused: a name over the bounds is
/// the subscriber's to fix; storage that fails (a full disk, JetStream away) passes, so the
/// subscriber is told to retry. A registration is never acknowledged unstored: a crash
/// would forget where the name starts.
fn durable_refused(e: BusError) -> End {
    match e {
        BusError::Durable(e) => End::Fail(ErrorCode::LimitExceeded, e.to_string(), CloseCode::Policy),
        BusError::Closed => End::Fail(ErrorCode::ShuttingDown, "hub shutting down".into(), CloseCode::Away),
        e => End::Fail(
            ErrorCode::Unavailable,
            format!("durable subscription: the hub cannot store it now, retry: {e}"),
            CloseCode::Error,
        ),
    }
}

/// The code of a subscription refused because the bus could not prepare reads: storage
/// that fails passes (retry), a bus shut down is the hub stopping.
fn reads_refused(e: &BusError) -> ErrorCode {
    match e {
        BusError::Closed => ErrorCode::ShuttingDown,
        _ => ErrorCode::Unavailable,
    }
}

/// Sleeps until `deadline`; never returns without one.
async fn sleep_until_opt(deadline: Option<Instant>) {
    match deadline {
        Some(d) => tokio::time::sleep_until(d).await,
        None => std::future::pending().await,
    }
}

/// What to tell a subscriber that sent a type it may not: agent messages are refused by
/// role, anything else is unknown.
fn unexpected_type(t: &str) -> String {
    if AGENT_MESSAGE_TYPES.contains(&t) {
        format!("a subscriber certificate cannot publish ({t:?}); subscribers can only subscribe")
    } else {
        format!("unknown message type {t:?}")
    }
}
