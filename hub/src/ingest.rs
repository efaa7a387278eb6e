//! Ingest: what the hub does with each frame an agent sends, decided by pure functions of
//! the session's state and the frame.
//!
//! The rules of the agent → hub arrow live here, apart from sockets, the bus and clocks,
//! so they can be read in one place and unit-tested exhaustively: the first message must
//! be a `hello` for the certificate's cluster in this protocol; events must carry the
//! session's epoch and strictly increasing seqs from 1 (resends of acked seqs are
//! skipped, not refused); the hub restamps `cluster`, `source` and `id` (it, not the
//! agent, vouches for where an event comes from); oversized events and batches are
//! refused; inventory events also update the cluster's inventory. The session
//! ([`crate::session::agent`]) carries the [`Decision`] out: it throttles by the cost the
//! decision names, appends, acks, or closes.

use bytes::Bytes;
use fleetwatch_protocol::Limits;
use fleetwatch_protocol::codec::{DecodeError, decode_agent};
use fleetwatch_protocol::event::{TYPE_INVENTORY, event_id, source_for};
use fleetwatch_protocol::message::{
    AgentMessage, ErrorCode, EventBatch, Hello, Inventory, ModuleInventory, ProtocolRange, Resync, WatchState,
};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;

use crate::cluster::{RECENT_EVENTS, RecentEvent};
use fleetwatch_bus::{Append, RecordBody};

/// What an agent's session knows when a frame arrives.
#[derive(Debug, Clone, Copy)]
pub(crate) struct State<'a> {
    /// The cluster id, from the certificate.
    pub(crate) cluster: &'a str,
    /// The session's agent epoch, from its hello.
    pub(crate) epoch: u64,
    /// The highest seq acked in this session.
    pub(crate) acked: u64,
}

/// A frame the hub refuses: the metric label (if counted), the error frame's code and
/// message, and whether (and how) the connection closes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The `rejected` metric's reason label; `None` when not counted.
    pub(crate) reject: Option<&'static str>,
    /// The error code sent.
    pub(crate) code: ErrorCode,
    /// The error message sent.
    pub(crate) message: String,
    /// `Some(close code)` ends the session; `None` only answers with an error frame.
    pub(crate) close: Option<CloseCode>,
}

impl Refusal {
    fn fatal(reject: Option<&'static str>, code: ErrorCode, message: String, close: CloseCode) -> Self {
        Self { reject, code, message, close: Some(close) }
    }

    fn warn(reject: &'static str, code: ErrorCode, message: String) -> Self {
        Self { reject: Some(reject), code, message, close: None }
    }
}

/// What to do with one frame.
#[derive(Debug, PartialEq)]
pub(crate) enum Decision {
    /// Store these events (costing `items.len()` from the event budget), then ack `last`.
    /// `inventory` is the newest inventory carried as an event, for the cluster's status.
    /// `recent` summarises the batch's last few events for the cluster's recent events.
    Append { items: Vec<Append>, last: u64, inventory: Option<Vec<ModuleInventory>>, recent: Vec<RecentEvent> },
    /// Nothing new (resends only, or an empty batch): ack what is acked.
    Ack,
    /// A new resync marker at `seq` (costing one resync): stored unless one is pending,
    /// then acked.
    Resync { seq: u64, reason: String },
    /// An inventory report for the cluster's status.
    Inventory(Vec<ModuleInventory>),
    /// A watch status report for the cluster's status.
    WatchStatus(Vec<WatchState>),
    /// Refused (see [`Refusal`]).
    Refuse(Refusal),
}

/// Checks the first message of a session: a `hello` for `cluster` (the certificate's) in a
/// protocol range that shares a version with this hub's; answers the hello and the version
/// the session speaks (the highest in common).
pub(crate) fn hello(cluster: &str, bytes: &[u8], limits: &Limits) -> Result<(Hello, u32), Refusal> {
    let hello = match decode_agent(bytes, limits) {
        Ok(AgentMessage::Hello(h)) => h,
        Ok(_) => {
            let msg = "the first message must be hello".to_string();
            return Err(Refusal::fatal(Some("no-hello"), ErrorCode::Forbidden, msg, CloseCode::Policy));
        }
        Err(e) => return Err(decode_refusal(e)),
    };
    let version = match hello.protocols().and_then(|theirs| ProtocolRange::OURS.negotiate(theirs)) {
        Ok(v) => v,
        Err(e) => {
            let msg = format!("agent protocol not supported: {e} (hub {})", env!("CARGO_PKG_VERSION"));
            return Err(Refusal::fatal(
                Some("protocol-version"),
                ErrorCode::UnsupportedVersion,
                msg,
                CloseCode::Policy,
            ));
        }
    };
    if let Some(claimed) = &hello.cluster
        && claimed != cluster
    {
        let msg = format!("hello claims cluster {claimed:?} but the certificate says {cluster:?}");
        return Err(Refusal::fatal(Some("identity-mismatch"), ErrorCode::IdentityMismatch, msg, CloseCode::Policy));
    }
    Ok((hello, version))
}

/// Decides what to do with a frame that arrived after the hello.
pub(crate) fn frame(state: State<'_>, bytes: &[u8], limits: &Limits) -> Decision {
    match decode_agent(bytes, limits) {
        Ok(AgentMessage::Events(batch)) => events(state, batch, limits),
        Ok(AgentMessage::Resync(r)) => resync(state, r, limits),
        Ok(AgentMessage::Inventory(inv)) => Decision::Inventory(inv.modules),
        Ok(AgentMessage::WatchStatus(report)) => Decision::WatchStatus(report.watches),
        Ok(AgentMessage::Hello(_)) => Decision::Refuse(Refusal::warn(
            "duplicate-hello",
            ErrorCode::Forbidden,
            "hello was already received".into(),
        )),
        Err(DecodeError::UnknownType(t)) if !is_subscriber_message(&t) => Decision::Refuse(Refusal::warn(
            "unknown-type",
            ErrorCode::UnknownType,
            format!("unknown message type {t:?}"),
        )),
        Err(e @ DecodeError::UnknownType(_)) => Decision::Refuse(decode_refusal(e)),
        // After the hello every other undecodable frame counts as malformed.
        Err(e) => refuse(Some("malformed"), e.code(), e.to_string(), CloseCode::Invalid),
    }
}

/// Refusal of an undecodable frame; a subscriber's message is refused by role.
fn decode_refusal(e: DecodeError) -> Refusal {
    match e {
        DecodeError::UnknownType(t) if is_subscriber_message(&t) => {
            let msg = format!("an agent certificate cannot subscribe ({t:?}); agents can only publish");
            Refusal::fatal(Some("agent-sent-subscriber-message"), ErrorCode::Forbidden, msg, CloseCode::Policy)
        }
        e => {
            let (reject, close) = match e {
                DecodeError::TooLarge { .. } => ("too-large", CloseCode::Size),
                DecodeError::Malformed(_) => ("malformed", CloseCode::Invalid),
                DecodeError::UnknownType(_) => ("unknown-type", CloseCode::Invalid),
            };
            Refusal::fatal(Some(reject), e.code(), e.to_string(), close)
        }
    }
}

fn is_subscriber_message(t: &str) -> bool {
    t == "subscribe"
}

/// Validates and restamps a batch.
fn events(state: State<'_>, batch: EventBatch, limits: &Limits) -> Decision {
    if batch.events.len() > limits.max_batch_events {
        let msg = format!("batch of {} events exceeds the limit of {}", batch.events.len(), limits.max_batch_events);
        return Decision::Refuse(Refusal::fatal(
            Some("batch-too-large"),
            ErrorCode::LimitExceeded,
            msg,
            CloseCode::Size,
        ));
    }
    let mut items = Vec::with_capacity(batch.events.len());
    let mut recent = Vec::new();
    // Only the last few events of a batch can stay among the cluster's recent ones.
    let recent_from = batch.events.len().saturating_sub(RECENT_EVENTS);
    let mut last = state.acked;
    let mut inventory = None;
    let source = source_for(state.cluster);
    for (index, mut ev) in batch.events.into_iter().enumerate() {
        if !ev.cluster.is_empty() && *ev.cluster != *state.cluster {
            let msg =
                format!("event {} claims cluster {:?}; the certificate says {:?}", ev.id, ev.cluster, state.cluster);
            return refuse(Some("identity-mismatch"), ErrorCode::IdentityMismatch, msg, CloseCode::Policy);
        }
        if ev.epoch != state.epoch {
            let msg = format!("event of epoch {} in a session of epoch {}", ev.epoch, state.epoch);
            return refuse(None, ErrorCode::BadSequence, msg, CloseCode::Policy);
        }
        if ev.seq == 0 {
            let msg = format!("event {} has seq 0: sequence numbers start at 1", ev.subject);
            return refuse(Some("seq-zero"), ErrorCode::BadSequence, msg, CloseCode::Policy);
        }
        if ev.seq <= last {
            if ev.seq <= state.acked {
                continue; // a resend of something already stored
            }
            let msg = format!("seq {} after {last}: sequence numbers must increase", ev.seq);
            return refuse(None, ErrorCode::BadSequence, msg, CloseCode::Policy);
        }
        // The hub, not the agent, vouches for where an event comes from.
        ev.cluster = state.cluster.to_string();
        ev.source.clone_from(&source);
        ev.id = event_id(state.cluster, ev.epoch, ev.seq);
        ev.cursor = None;
        last = ev.seq;
        if ev.kind == TYPE_INVENTORY
            && let Ok(inv) = serde_json::from_value::<Inventory>(ev.data.clone())
        {
            inventory = Some(inv.modules);
        }
        let json = match serde_json::to_vec(&ev) {
            Ok(json) => json,
            Err(e) => {
                let msg = format!("hub cannot serialise event {}: {e}", ev.subject);
                return refuse(None, ErrorCode::Internal, msg, CloseCode::Error);
            }
        };
        if json.len() > limits.max_event_bytes {
            let msg = format!("event {} of {} bytes exceeds {}", ev.subject, json.len(), limits.max_event_bytes);
            return refuse(Some("event-too-large"), ErrorCode::LimitExceeded, msg, CloseCode::Size);
        }
        // Exactly its length: `Bytes::from(Vec)` keeps the vector's spare capacity (up to
        // as much again), which the bus would hold for as long as it retains the event
        // while its byte limits count only the length.
        if index >= recent_from {
            recent.push(RecentEvent::new(ev.seq, &ev.kind, &ev.subject, ev.time, ev.watch.as_deref()));
        }
        items.push(Append {
            epoch: ev.epoch,
            seq: ev.seq,
            body: RecordBody::Event(Bytes::from(json.into_boxed_slice())),
        });
    }
    if items.is_empty() { Decision::Ack } else { Decision::Append { items, last, inventory, recent } }
}

fn refuse(reject: Option<&'static str>, code: ErrorCode, message: String, close: CloseCode) -> Decision {
    Decision::Refuse(Refusal::fatal(reject, code, message, close))
}

/// Validates a resync request.
fn resync(state: State<'_>, r: Resync, limits: &Limits) -> Decision {
    if r.seq == 0 {
        let msg = "resync with seq 0: sequence numbers start at 1".to_string();
        return refuse(Some("seq-zero"), ErrorCode::BadSequence, msg, CloseCode::Policy);
    }
    if r.epoch != state.epoch {
        let msg = format!("resync for epoch {} in a session of epoch {}", r.epoch, state.epoch);
        return refuse(None, ErrorCode::BadSequence, msg, CloseCode::Policy);
    }
    if r.seq <= state.acked {
        return Decision::Ack; // a resend
    }
    // The decoder already cut the reason to the limit; cut again in case the limits
    // were configured apart.
    let mut reason = if r.reason.is_empty() { "agent resync".to_string() } else { r.reason };
    fleetwatch_protocol::codec::cut_reason(&mut reason, limits.max_reason_bytes);
    Decision::Resync { seq: r.seq, reason }
}

/// What can have taken records an agent was acked for, as far as the bus can tell: the
/// `lost_cause` of [`resume_gap`].
pub(crate) fn lost_cause(durable: bool, shared: bool, evicted: bool) -> &'static str {
    match (durable, shared, evicted) {
        // On JetStream a cluster's head is kept in a bucket for when its records are
        // evicted, but written paced: under a burst, eviction can overtake it.
        (_, true, true) => {
            "evicted by the bus's retention (--retention, --retention-bytes, --retention-age) before the cluster's \
             head was recorded, or JetStream lost them"
        }
        (_, true, false) => "JetStream lost them (its store lost, or the stream deleted and recreated)",
        (true, false, _) => "its data directory lost them (damaged, truncated or replaced)",
        (false, false, _) => "the hub restarted without a data directory",
    }
}

/// What the hub has of an agent's stream at resume, and why subscribers need a resync
/// when it has less than the agent was acked: `(have, reason)`. `lost_cause` says what can
/// have taken them (see [`lost_cause`]).
pub(crate) fn resume_gap(
    head: Option<(u64, u64)>,
    epoch: u64,
    last_acked: u64,
    lost_cause: &str,
) -> (u64, Option<String>) {
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

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_protocol::codec::encode;
    use fleetwatch_protocol::event::{Event, ObjectKey};
    use fleetwatch_protocol::message::{ModuleInventory, PROTOCOL_VERSION};

    const C: &str = "c1";

    fn state(acked: u64) -> State<'static> {
        State { cluster: C, epoch: 5, acked }
    }

    fn event(cluster: &str, epoch: u64, seq: u64) -> Event {
        let key = ObjectKey::new("v1", "ConfigMap", Some("ns"), &format!("o{seq}"));
        Event::applied(cluster, epoch, seq, &key, serde_json::json!({"seq": seq}))
    }

    fn batch(events: Vec<Event>) -> Vec<u8> {
        encode(&AgentMessage::Events(EventBatch { events })).into_bytes()
    }

    fn refusal(d: Decision) -> Refusal {
        match d {
            Decision::Refuse(r) => r,
            other => panic!("expected a refusal, got {other:?}"),
        }
    }

    #[test]
    fn events_are_restamped_and_resends_skipped() {
        let mut spoofed = event("", 5, 3);
        spoofed.source = "/clusters/elsewhere".into();
        spoofed.id = "made-up".into();
        spoofed.cursor = Some(99);
        let frame_bytes = batch(vec![event(C, 5, 1), event(C, 5, 2), spoofed]);
        match frame(state(2), &frame_bytes, &Limits::default()) {
            Decision::Append { items, last, inventory, recent } => {
                assert_eq!(last, 3);
                assert_eq!(recent.len(), 1, "the stored event is among the recent ones");
                assert_eq!(recent[0].seq, 3);
                assert!(inventory.is_none());
                assert_eq!(items.len(), 1, "seqs 1 and 2 were acked: resends are skipped");
                let RecordBody::Event(json) = &items[0].body else { panic!("{:?}", items[0].body) };
                let stored: Event = serde_json::from_slice(json).unwrap();
                assert_eq!((stored.cluster.as_str(), stored.source.as_str()), (C, "/clusters/c1"));
                assert_eq!(stored.id, "c1/5/3");
                assert_eq!(stored.cursor, None);
                assert_eq!((items[0].epoch, items[0].seq), (5, 3));
            }
            other => panic!("{other:?}"),
        }
        // Only resends, or nothing: just an ack.
        assert_eq!(frame(state(2), &batch(vec![event(C, 5, 2)]), &Limits::default()), Decision::Ack);
        assert_eq!(frame(state(2), &batch(vec![]), &Limits::default()), Decision::Ack);
    }

    #[test]
    fn sequence_and_identity_violations_are_refused() {
        let l = Limits::default();
        let r = refusal(frame(state(0), &batch(vec![event("other", 5, 1)]), &l));
        assert_eq!(
            (r.reject, r.code, r.close),
            (Some("identity-mismatch"), ErrorCode::IdentityMismatch, Some(CloseCode::Policy))
        );
        let r = refusal(frame(state(0), &batch(vec![event(C, 4, 1)]), &l));
        assert_eq!((r.code, r.reject), (ErrorCode::BadSequence, None));
        assert!(r.message.contains("epoch 4 in a session of epoch 5"), "{}", r.message);
        let r = refusal(frame(state(0), &batch(vec![event(C, 5, 0)]), &l));
        assert_eq!((r.code, r.reject), (ErrorCode::BadSequence, Some("seq-zero")));
        let r = refusal(frame(state(0), &batch(vec![event(C, 5, 2), event(C, 5, 2)]), &l));
        assert!(r.message.contains("seq 2 after 2: sequence numbers must increase"), "{}", r.message);
    }

    #[test]
    fn limits_are_enforced() {
        let l = Limits { max_batch_events: 2, max_event_bytes: 600, ..Limits::default() };
        let r = refusal(frame(state(0), &batch(vec![event(C, 5, 1), event(C, 5, 2), event(C, 5, 3)]), &l));
        assert_eq!(
            (r.reject, r.code, r.close),
            (Some("batch-too-large"), ErrorCode::LimitExceeded, Some(CloseCode::Size))
        );
        let mut big = event(C, 5, 1);
        big.data = serde_json::json!({"pad": "x".repeat(1000)});
        let r = refusal(frame(state(0), &batch(vec![big]), &l));
        assert_eq!((r.reject, r.close), (Some("event-too-large"), Some(CloseCode::Size)));
        let tiny = Limits { max_message_bytes: 10, ..Limits::default() };
        let r = refusal(frame(state(0), &batch(vec![event(C, 5, 1)]), &tiny));
        assert_eq!((r.code, r.close), (ErrorCode::LimitExceeded, Some(CloseCode::Invalid)));
    }

    #[test]
    fn inventory_events_update_the_inventory_too() {
        let key = ObjectKey::new("v1", "Inventory", None, "inv");
        let modules = vec![ModuleInventory { name: "m".into(), version: "1.0".into(), ready: true }];
        let mut inv =
            Event::applied(C, 5, 1, &key, serde_json::to_value(Inventory { modules: modules.clone() }).unwrap());
        inv.kind = TYPE_INVENTORY.into();
        match frame(state(0), &batch(vec![inv]), &Limits::default()) {
            Decision::Append { inventory, items, .. } => {
                assert_eq!(inventory, Some(modules));
                assert_eq!(items.len(), 1, "and it is stored as an event");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn resyncs_are_validated_and_reasons_defaulted() {
        let l = Limits::default();
        let msg = |epoch, seq, reason: &str| {
            encode(&AgentMessage::Resync(Resync { epoch, seq, reason: reason.into(), objects: vec![] })).into_bytes()
        };
        assert_eq!(frame(state(3), &msg(5, 4, ""), &l), Decision::Resync { seq: 4, reason: "agent resync".into() });
        assert_eq!(frame(state(3), &msg(5, 3, "x"), &l), Decision::Ack, "a resend");
        assert_eq!(refusal(frame(state(3), &msg(5, 0, "x"), &l)).reject, Some("seq-zero"));
        assert_eq!(refusal(frame(state(3), &msg(6, 9, "x"), &l)).code, ErrorCode::BadSequence);
        let short = Limits { max_reason_bytes: 8, ..Limits::default() };
        match frame(state(3), &msg(5, 4, &"r".repeat(100)), &short) {
            Decision::Resync { reason, .. } => assert!(reason.len() <= 8),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn other_frames_are_answered_by_kind() {
        let l = Limits::default();
        let hello = encode(&AgentMessage::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            min_protocol: None,
            agent_version: "t".into(),
            cluster: None,
            epoch: 5,
            last_acked_seq: 0,
        }));
        let r = refusal(frame(state(0), hello.as_bytes(), &l));
        assert_eq!((r.reject, r.close), (Some("duplicate-hello"), None), "answered, not fatal");
        let r = refusal(frame(state(0), br#"{"type":"launch"}"#, &l));
        assert_eq!((r.reject, r.code, r.close), (Some("unknown-type"), ErrorCode::UnknownType, None));
        let r = refusal(frame(state(0), br#"{"type":"subscribe"}"#, &l));
        assert_eq!((r.reject, r.code), (Some("agent-sent-subscriber-message"), ErrorCode::Forbidden));
        assert!(r.close.is_some());
        let r = refusal(frame(state(0), b"{nope", &l));
        assert_eq!((r.reject, r.code, r.close), (Some("malformed"), ErrorCode::Malformed, Some(CloseCode::Invalid)));
        let inv = encode(&AgentMessage::Inventory(Inventory { modules: vec![] }));
        assert_eq!(frame(state(0), inv.as_bytes(), &l), Decision::Inventory(vec![]));
    }

    #[test]
    fn the_hello_must_match_protocol_and_certificate() {
        let l = Limits::default();
        let hello = |protocol, cluster: Option<&str>| {
            encode(&AgentMessage::Hello(Hello {
                protocol,
                min_protocol: None,
                agent_version: "t".into(),
                cluster: cluster.map(Into::into),
                epoch: 5,
                last_acked_seq: 0,
            }))
            .into_bytes()
        };
        assert_eq!(super::hello(C, &hello(PROTOCOL_VERSION, Some(C)), &l).unwrap().0.epoch, 5);
        assert_eq!(super::hello(C, &hello(PROTOCOL_VERSION, None), &l).unwrap().1, PROTOCOL_VERSION);
        let r = super::hello(C, &hello(PROTOCOL_VERSION, Some("other")), &l).unwrap_err();
        assert_eq!((r.reject, r.code), (Some("identity-mismatch"), ErrorCode::IdentityMismatch));
        let r = super::hello(C, &hello(PROTOCOL_VERSION + 1, None), &l).unwrap_err();
        assert_eq!(r.code, ErrorCode::UnsupportedVersion);
        assert!(r.message.contains(&format!("peer speaks {}", PROTOCOL_VERSION + 1)), "{}", r.message);
        assert!(r.message.contains(&format!("this side speaks {}", ProtocolRange::OURS)), "{}", r.message);
        // A future agent that still speaks this hub's protocol is welcomed at it.
        let future = br#"{"type":"hello","protocol":2,"min_protocol":1,"agent_version":"9","epoch":5}"#;
        assert_eq!(super::hello(C, future, &l).unwrap().1, 1);
        let bad = br#"{"type":"hello","protocol":1,"min_protocol":2,"epoch":5}"#;
        let r = super::hello(C, bad, &l).unwrap_err();
        assert!(r.message.contains("min_protocol 2"), "{}", r.message);
        let r = super::hello(C, &batch(vec![]), &l).unwrap_err();
        assert_eq!((r.reject, r.code), (Some("no-hello"), ErrorCode::Forbidden));
        let r = super::hello(C, br#"{"type":"subscribe"}"#, &l).unwrap_err();
        assert_eq!(r.reject, Some("agent-sent-subscriber-message"));
    }

    #[test]
    fn resume_reasons_say_what_happened() {
        let memory = lost_cause(false, false, false);
        let disk = lost_cause(true, false, true);
        // Nothing acked, nothing stored: no resync.
        assert_eq!(resume_gap(None, 5, 0, memory), (0, None));
        // The hub has all it acked.
        assert_eq!(resume_gap(Some((5, 10)), 5, 10, disk), (10, None));
        // An in-memory hub restarted.
        let (have, r) = resume_gap(None, 5, 10, memory);
        assert_eq!(have, 0);
        assert!(r.unwrap().contains("restarted without a data directory"));
        // A durable hub lost part of the epoch.
        let r = resume_gap(Some((5, 4)), 5, 10, disk).1.unwrap();
        assert!(r.contains("5..=10") && r.contains("data directory lost"), "{r}");
        // On JetStream there is no data directory; a stream that evicted records may have
        // evicted the cluster's before its head was recorded.
        let r = resume_gap(None, 5, 10, lost_cause(true, true, true)).1.unwrap();
        assert!(r.contains("1..=10") && r.contains("evicted") && !r.contains("data directory"), "{r}");
        let r = resume_gap(None, 5, 10, lost_cause(true, true, false)).1.unwrap();
        assert!(r.contains("JetStream lost them") && !r.contains("evicted"), "{r}");
        // Another agent process stored events meanwhile: not a "restart without storage".
        let r = resume_gap(Some((9, 3)), 5, 10, disk).1.unwrap();
        assert!(r.contains("another agent process") && r.contains("epoch 9"), "{r}");
        assert!(!r.contains("storage"), "{r}");
    }
}
