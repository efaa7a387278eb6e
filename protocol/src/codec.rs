//! Decoding messages from untrusted peers, with limits and errors that say what was wrong.

use serde::Deserialize;
use serde::de::DeserializeOwned;

use crate::message::{AgentMessage, ErrorCode, HubToAgent, HubToSubscriber, SubscriberMessage};

/// Limits on what a peer may send. The same defaults hold on both ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest WebSocket message in bytes.
    pub max_message_bytes: usize,
    /// Most events in one batch.
    pub max_batch_events: usize,
    /// Largest single event, in bytes of JSON. The hub refuses a larger one; the agent never
    /// sends one (it shrinks it first, see the agent's outbox).
    pub max_event_bytes: usize,
    /// Longest reason or error message kept from a frame, in bytes; longer ones are cut at a
    /// character boundary when decoded, so a peer cannot make the hub store megabyte reasons.
    pub max_reason_bytes: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Self { max_message_bytes: 1 << 20, max_batch_events: 1000, max_event_bytes: 64 << 10, max_reason_bytes: 1024 }
    }
}

/// Cuts `text` to at most `max` bytes, at a character boundary, marking the cut with `…`
/// when there is room for it.
///
/// ```
/// let mut s = "é".repeat(10); // 20 bytes
/// fleetwatch_protocol::codec::cut_reason(&mut s, 7);
/// assert!(s.len() <= 7 && s.ends_with('…'));
/// ```
pub fn cut_reason(text: &mut String, max: usize) {
    if text.len() <= max {
        return;
    }
    const MARK: &str = "…";
    let room = max.saturating_sub(MARK.len());
    let mut end = room.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    if max >= MARK.len() {
        text.push_str(MARK);
    }
}

/// Why a message was refused.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum DecodeError {
    /// Larger than [`Limits::max_message_bytes`].
    #[error("message of {size} bytes exceeds the limit of {limit} bytes")]
    TooLarge {
        /// Its size.
        size: usize,
        /// The limit.
        limit: usize,
    },
    /// Not JSON, or a known type with missing or mistyped fields.
    #[error("malformed message: {0}")]
    Malformed(String),
    /// A `type` this end does not know.
    #[error("unknown message type {0:?}")]
    UnknownType(String),
}

impl DecodeError {
    /// The error code to answer with.
    pub fn code(&self) -> ErrorCode {
        match self {
            DecodeError::TooLarge { .. } => ErrorCode::LimitExceeded,
            DecodeError::Malformed(_) => ErrorCode::Malformed,
            DecodeError::UnknownType(_) => ErrorCode::UnknownType,
        }
    }
}

/// The `type` tags each direction knows; used to tell "unknown type" from "malformed".
trait Tagged: DeserializeOwned {
    const TYPES: &'static [&'static str];

    /// Cuts free-text fields (reasons, error messages) to [`Limits::max_reason_bytes`].
    fn cap_text(&mut self, _max: usize) {}
}

/// The `type`s an agent sends. The hub refuses them by role from a subscriber.
pub const AGENT_MESSAGE_TYPES: &[&str] = &["hello", "events", "resync", "inventory", "watch-status"];

impl Tagged for AgentMessage {
    const TYPES: &'static [&'static str] = AGENT_MESSAGE_TYPES;

    fn cap_text(&mut self, max: usize) {
        if let AgentMessage::Resync(r) = self {
            cut_reason(&mut r.reason, max);
        }
    }
}
impl Tagged for HubToAgent {
    const TYPES: &'static [&'static str] = &["welcome", "ack", "configure", "error"];

    fn cap_text(&mut self, max: usize) {
        if let HubToAgent::Error(e) = self {
            cut_reason(&mut e.message, max);
        }
    }
}
impl Tagged for SubscriberMessage {
    const TYPES: &'static [&'static str] = &["subscribe", "ack"];
}
impl Tagged for HubToSubscriber {
    const TYPES: &'static [&'static str] = &["subscribed", "events", "resync-required", "error"];

    fn cap_text(&mut self, max: usize) {
        match self {
            HubToSubscriber::ResyncRequired(r) => cut_reason(&mut r.reason, max),
            HubToSubscriber::Error(e) => cut_reason(&mut e.message, max),
            _ => {}
        }
    }
}

fn decode<T: Tagged>(bytes: &[u8], limits: &Limits) -> Result<T, DecodeError> {
    if bytes.len() > limits.max_message_bytes {
        return Err(DecodeError::TooLarge { size: bytes.len(), limit: limits.max_message_bytes });
    }
    match serde_json::from_slice::<T>(bytes) {
        Ok(mut msg) => {
            msg.cap_text(limits.max_reason_bytes);
            Ok(msg)
        }
        Err(err) => {
            // Only on the error path: find out whether the type tag is the problem.
            #[derive(Deserialize)]
            struct TypeOnly {
                #[serde(rename = "type")]
                ty: String,
            }
            match serde_json::from_slice::<TypeOnly>(bytes) {
                Ok(t) if !T::TYPES.contains(&t.ty.as_str()) => Err(DecodeError::UnknownType(t.ty)),
                _ => Err(DecodeError::Malformed(err.to_string())),
            }
        }
    }
}

/// Decodes a message from an agent.
///
/// ```
/// use fleetwatch_protocol::codec::{decode_agent, DecodeError, Limits};
/// let err = decode_agent(br#"{"type":"launch"}"#, &Limits::default()).unwrap_err();
/// assert_eq!(err, DecodeError::UnknownType("launch".into()));
/// ```
pub fn decode_agent(bytes: &[u8], limits: &Limits) -> Result<AgentMessage, DecodeError> {
    decode(bytes, limits)
}

/// Decodes a message from the hub, on an agent.
pub fn decode_hub_to_agent(bytes: &[u8], limits: &Limits) -> Result<HubToAgent, DecodeError> {
    decode(bytes, limits)
}

/// Decodes a message from a subscriber.
pub fn decode_subscriber(bytes: &[u8], limits: &Limits) -> Result<SubscriberMessage, DecodeError> {
    decode(bytes, limits)
}

/// Decodes a message from the hub, on a subscriber.
pub fn decode_hub_to_subscriber(bytes: &[u8], limits: &Limits) -> Result<HubToSubscriber, DecodeError> {
    decode(bytes, limits)
}

/// Encodes any message as JSON text.
pub fn encode<T: serde::Serialize>(msg: &T) -> String {
    // Serializing our own types to a String cannot fail: no maps with non-string keys.
    serde_json::to_string(msg).unwrap_or_else(|e| format!(r#"{{"type":"error","code":"internal","message":"{e}"}}"#))
}

/// Builds an `events` frame (`{"type":"events","events":[...]}`) from events that are
/// already serialized, without parsing them again: the agent's outbox keeps events as JSON
/// from the moment they are recorded, and the hub stores them as JSON on arrival. The hub
/// also splices each event's bus cursor in as its first field ([`EventsFrame::push_with_cursor`]).
/// This is the one place that knows the frame's layout, so both ends stay in step with
/// [`crate::message`]'s `events` messages.
///
/// ```
/// use fleetwatch_protocol::codec::{EventsFrame, Limits, decode_hub_to_subscriber};
/// use fleetwatch_protocol::message::HubToSubscriber;
/// let mut frame = EventsFrame::new();
/// frame.push_with_cursor(7, br#"{"id":"a","seq":1}"#).unwrap();
/// assert_eq!(frame.events(), 1);
/// let text = frame.take().unwrap();
/// assert_eq!(text, r#"{"type":"events","events":[{"cursor":7,"id":"a","seq":1}]}"#);
/// assert!(frame.take().is_none()); // taken: empty again
/// ```
#[derive(Debug, Default)]
pub struct EventsFrame {
    text: String,
    events: usize,
}

/// A stored event that cannot be spliced into a frame: not a JSON object in UTF-8.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("stored event is not a JSON object ({0})")]
pub struct SpliceError(&'static str);

const EVENTS_FRAME_START: &str = r#"{"type":"events","events":["#;
const EVENTS_FRAME_END: &str = "]}";

impl EventsFrame {
    /// An empty frame.
    pub fn new() -> Self {
        Self::default()
    }

    /// Events added since the frame was started.
    pub fn events(&self) -> usize {
        self.events
    }

    /// Whether no event was added.
    pub fn is_empty(&self) -> bool {
        self.events == 0
    }

    /// Bytes of the frame so far (without its closing `]}`).
    pub fn len_bytes(&self) -> usize {
        self.text.len()
    }

    fn separator(&mut self) {
        if self.events == 0 {
            self.text.push_str(EVENTS_FRAME_START);
        } else {
            self.text.push(',');
        }
        self.events += 1;
    }

    /// Adds an event serialized from an [`crate::Event`] (a JSON object), as it is.
    pub fn push(&mut self, event_json: &str) {
        self.separator();
        self.text.push_str(event_json);
    }

    /// Adds a stored event with its bus `cursor` spliced in as the first field. Checks
    /// only what the splice needs (UTF-8, an object); the event is not parsed.
    pub fn push_with_cursor(&mut self, cursor: u64, event_json: &[u8]) -> Result<(), SpliceError> {
        let text = std::str::from_utf8(event_json).map_err(|_| SpliceError("not UTF-8"))?;
        let trimmed = text.trim();
        let Some(fields) = trimmed.strip_prefix('{').filter(|_| trimmed.ends_with('}')) else {
            return Err(SpliceError("no enclosing braces"));
        };
        self.separator();
        use std::fmt::Write;
        // Writing to a String cannot fail.
        let _ = write!(self.text, r#"{{"cursor":{cursor}"#);
        if !fields.trim_start().starts_with('}') {
            self.text.push(',');
        }
        self.text.push_str(fields);
        Ok(())
    }

    /// The finished frame, leaving this builder empty for the next one; `None` when no
    /// event was added.
    pub fn take(&mut self) -> Option<String> {
        if self.events == 0 {
            return None;
        }
        self.events = 0;
        let mut text = std::mem::take(&mut self.text);
        text.push_str(EVENTS_FRAME_END);
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::event::{Event, ObjectKey};
    use crate::message::*;
    use proptest::prelude::*;

    fn arb_event() -> impl Strategy<Value = Event> {
        ("[a-z0-9-]{1,12}", any::<u64>(), any::<u64>(), "[a-z]{1,8}", any::<i64>(), any::<bool>()).prop_map(
            |(cluster, epoch, seq, name, n, del)| {
                let key = ObjectKey::new("v1", "ConfigMap", Some("ns"), &name);
                let data = serde_json::json!({"n": n, "s": name});
                let mut e = if del {
                    Event::deleted(&cluster, epoch, seq, &key, data)
                } else {
                    Event::applied(&cluster, epoch, seq, &key, data)
                };
                if n % 2 == 0 {
                    e.cursor = Some(seq);
                }
                e
            },
        )
    }

    fn arb_agent_message() -> impl Strategy<Value = AgentMessage> {
        prop_oneof![
            (any::<u32>(), ".{0,10}", proptest::option::of("[a-z]{1,5}"), any::<u64>(), any::<u64>()).prop_map(
                |(protocol, agent_version, cluster, epoch, last_acked_seq)| {
                    AgentMessage::Hello(Hello {
                        protocol,
                        min_protocol: None,
                        agent_version,
                        cluster,
                        epoch,
                        last_acked_seq,
                    })
                }
            ),
            proptest::collection::vec(arb_event(), 0..5).prop_map(|events| AgentMessage::Events(EventBatch { events })),
            (any::<u64>(), any::<u64>(), ".{0,10}").prop_map(|(epoch, seq, reason)| AgentMessage::Resync(Resync {
                epoch,
                seq,
                reason,
                objects: vec![ObjectDigest { key: "k".into(), digest: "d".into() }],
            })),
            ("[a-z]{1,5}", "[0-9.]{1,5}", any::<bool>()).prop_map(|(name, version, ready)| {
                AgentMessage::Inventory(Inventory { modules: vec![ModuleInventory { name, version, ready }] })
            }),
        ]
    }

    fn arb_subscriber_message() -> impl Strategy<Value = SubscriberMessage> {
        prop_oneof![
            (proptest::option::of("[a-z]{1,5}"), proptest::collection::vec("[a-z]{1,5}", 0..3), any::<bool>())
                .prop_map(|(durable, clusters, early)| SubscriberMessage::Subscribe(Subscribe {
                    protocol: early.then_some(2),
                    min_protocol: early.then_some(1),
                    durable,
                    clusters,
                    from: if early { StartFrom::Earliest } else { StartFrom::Latest },
                    resume: early.then(|| ResumePoint { stream: "s".into(), cursor: 3 }),
                    max_in_flight: Some(10),
                })),
            any::<u64>().prop_map(|cursor| SubscriberMessage::Ack(CursorAck { cursor })),
        ]
    }

    proptest! {
        #[test]
        fn agent_messages_round_trip(msg in arb_agent_message()) {
            let text = encode(&msg);
            prop_assert_eq!(decode_agent(text.as_bytes(), &Limits { max_message_bytes: usize::MAX, ..Limits::default() }).unwrap(), msg);
        }

        #[test]
        fn subscriber_messages_round_trip(msg in arb_subscriber_message()) {
            let text = encode(&msg);
            prop_assert_eq!(decode_subscriber(text.as_bytes(), &Limits::default()).unwrap(), msg);
        }

        #[test]
        fn hub_messages_round_trip(epoch in any::<u64>(), seq in any::<u64>(), msg in ".{0,20}", cursor in any::<u64>()) {
            for m in [
                HubToAgent::Ack(Ack { epoch, seq }),
                HubToAgent::Error(ErrorFrame { code: ErrorCode::RateLimited, message: msg.clone(), fatal: false }),
                HubToAgent::Welcome(Welcome { protocol: 1, session: msg.clone(), cluster: "c".into(), epoch, acked_seq: seq, watches: vec![], max_event_bytes: Some(65536) }),
            ] {
                prop_assert_eq!(decode_hub_to_agent(encode(&m).as_bytes(), &Limits::default()).unwrap(), m);
            }
            let r = HubToSubscriber::ResyncRequired(ResyncRequired { cluster: msg.clone(), cursor, reason: msg });
            prop_assert_eq!(decode_hub_to_subscriber(encode(&r).as_bytes(), &Limits::default()).unwrap(), r);
        }

        #[test]
        fn decoders_never_panic_on_arbitrary_bytes(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let limits = Limits::default();
            let _ = decode_agent(&bytes, &limits);
            let _ = decode_subscriber(&bytes, &limits);
            let _ = decode_hub_to_agent(&bytes, &limits);
            let _ = decode_hub_to_subscriber(&bytes, &limits);
        }

        #[test]
        fn decoders_never_panic_on_json_like_text(text in r#"\{("type":"(hello|events|ack|subscribe|x)",?)?("[a-z]{1,6}":(\d{1,3}|"[a-z]*"|\[\]|null|\{\}),?){0,4}\}"#) {
            let limits = Limits::default();
            if let Err(e) = decode_agent(text.as_bytes(), &limits) {
                prop_assert!(matches!(e, DecodeError::Malformed(_) | DecodeError::UnknownType(_)));
            }
            let _ = decode_subscriber(text.as_bytes(), &limits);
        }
    }

    #[test]
    fn long_reasons_are_cut_at_a_character_boundary() {
        let l = Limits::default();
        let reason = "ü".repeat(5000); // 10,000 bytes
        let msg = encode(&AgentMessage::Resync(Resync { epoch: 1, seq: 1, reason, objects: vec![] }));
        match decode_agent(msg.as_bytes(), &l).unwrap() {
            AgentMessage::Resync(r) => {
                assert!(r.reason.len() <= l.max_reason_bytes, "{}", r.reason.len());
                assert!(r.reason.len() > l.max_reason_bytes - 8);
                assert!(r.reason.starts_with("üü") && r.reason.ends_with('…'));
            }
            other => panic!("{other:?}"),
        }
        let r = HubToSubscriber::ResyncRequired(ResyncRequired {
            cluster: "c".into(),
            cursor: 1,
            reason: "x".repeat(3000),
        });
        match decode_hub_to_subscriber(encode(&r).as_bytes(), &l).unwrap() {
            HubToSubscriber::ResyncRequired(r) => assert!(r.reason.len() <= 1024),
            other => panic!("{other:?}"),
        }
        let mut short = "fine".to_string();
        cut_reason(&mut short, 1024);
        assert_eq!(short, "fine");
    }

    #[test]
    fn tells_malformed_from_unknown_and_too_large() {
        let l = Limits { max_message_bytes: 64, ..Limits::default() };
        assert!(matches!(decode_agent(b"{not json", &l), Err(DecodeError::Malformed(_))));
        assert!(matches!(decode_agent(br#"{"type":"hello"}"#, &l), Err(DecodeError::Malformed(_))));
        assert_eq!(decode_agent(br#"{"type":"nope","x":1}"#, &l), Err(DecodeError::UnknownType("nope".into())));
        assert!(matches!(decode_agent(&[b' '; 65], &l), Err(DecodeError::TooLarge { size: 65, limit: 64 })));
        // Unknown fields are ignored.
        let m = decode_agent(br#"{"type":"hello","protocol":1,"epoch":5,"future":true}"#, &l).unwrap();
        assert!(matches!(m, AgentMessage::Hello(Hello { epoch: 5, .. })));
    }

    #[test]
    fn events_frames_decode_on_both_ends() {
        let key = ObjectKey::new("v1", "ConfigMap", Some("ns"), "a");
        let a = Event::applied("c", 1, 1, &key, serde_json::json!({"v": 1}));
        let b = Event::deleted("c", 1, 2, &key, serde_json::json!({}));
        // Agent side: events as they are.
        let mut frame = EventsFrame::new();
        assert!(frame.take().is_none());
        frame.push(&serde_json::to_string(&a).unwrap());
        frame.push(&serde_json::to_string(&b).unwrap());
        assert_eq!(frame.events(), 2);
        let text = frame.take().unwrap();
        assert!(frame.is_empty() && frame.len_bytes() == 0);
        match decode_agent(text.as_bytes(), &Limits::default()).unwrap() {
            AgentMessage::Events(batch) => assert_eq!(batch.events, vec![a.clone(), b.clone()]),
            other => panic!("{other:?}"),
        }
        // Hub side: cursors spliced in.
        frame.push_with_cursor(10, serde_json::to_string(&a).unwrap().as_bytes()).unwrap();
        frame.push_with_cursor(11, serde_json::to_string(&b).unwrap().as_bytes()).unwrap();
        let text = frame.take().unwrap();
        let (mut a10, mut b11) = (a.clone(), b.clone());
        a10.cursor = Some(10);
        b11.cursor = Some(11);
        match decode_hub_to_subscriber(text.as_bytes(), &Limits::default()).unwrap() {
            HubToSubscriber::Events(batch) => assert_eq!(batch.events, vec![a10, b11]),
            other => panic!("{other:?}"),
        }
        // Also into an empty object.
        frame.push_with_cursor(12, b" { } ").unwrap();
        let v: serde_json::Value = serde_json::from_str(&frame.take().unwrap()).unwrap();
        assert_eq!(v["events"][0], serde_json::json!({"cursor": 12}));
    }

    #[test]
    fn only_objects_are_spliced() {
        let mut frame = EventsFrame::new();
        assert!(frame.push_with_cursor(1, b"5").is_err());
        assert!(frame.push_with_cursor(1, b"[1]").is_err());
        assert!(frame.push_with_cursor(1, &[b'{', 0xff, b'}']).is_err());
        assert!(frame.take().is_none(), "a refused event leaves the frame untouched");
    }
}
