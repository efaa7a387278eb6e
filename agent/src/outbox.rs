//! The outbox: events not yet acked by the hub, keyed by object.
//!
//! A newer event for an object replaces the older one (coalescing), so memory is bounded
//! by the number of watched objects, not by how long the hub is away. Past its capacity,
//! in objects or in bytes, the outbox collapses into one "resync needed" marker:
//! subscribers then reconcile the cluster fully, which subsumes everything that was dropped.
//!
//! An event larger than the per-event limit (the hub refuses those) is never sent as is:
//! its `data` is cut down to the object's identity and scalar fields (`metadata`,
//! `generation`, ...), dropping the large parts (`projected`, payloads), and marked
//! `data.truncated: true` with `data.originalBytes`. Subscribers see that the object
//! changed and must read it themselves. Only when even that does not fit does the outbox
//! collapse into a resync marker.

use std::collections::{BTreeMap, HashMap};

use fleetwatch_protocol::Event;

/// What the outbox holds, in seq order.
#[derive(Debug, Clone, PartialEq)]
pub enum Item {
    /// An event, already serialized.
    Event {
        /// Its seq.
        seq: u64,
        /// Its JSON.
        json: Box<str>,
    },
    /// A resync marker with its seq and reason.
    Resync {
        /// The marker's seq.
        seq: u64,
        /// Why.
        reason: String,
    },
}

impl Item {
    /// The item's seq.
    pub fn seq(&self) -> u64 {
        match self {
            Item::Event { seq, .. } => *seq,
            Item::Resync { seq, .. } => *seq,
        }
    }
}

#[derive(Debug)]
struct Stored {
    key: Box<str>,
    json: Box<str>,
}

impl Stored {
    /// Bytes this entry costs: its JSON, its key twice (here and in `by_key`).
    fn cost(&self) -> usize {
        self.json.len() + 2 * self.key.len()
    }
}

/// Default byte bound of an outbox.
pub const DEFAULT_MAX_BYTES: usize = 64 << 20;

/// Top-level scalar fields of a truncated event's data are kept up to this size each.
const KEPT_SCALAR_BYTES: usize = 256;
/// A truncated event's `metadata` is kept when no larger than this.
const KEPT_METADATA_BYTES: usize = 4 << 10;

/// A frame ready to send and the highest seq it carries.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    /// The highest seq in the frame.
    pub last_seq: u64,
    /// The message text.
    pub text: String,
}

/// Unacked events of one agent epoch.
///
/// ```
/// use fleetwatch_agent::outbox::Outbox;
/// use fleetwatch_protocol::ObjectKey;
/// let mut ob = Outbox::new("c1", 1, 100);
/// let key = ObjectKey::new("v1", "ConfigMap", Some("ns"), "a");
/// ob.push_applied(&key, serde_json::json!({"v": 1}));
/// ob.push_applied(&key, serde_json::json!({"v": 2}));
/// assert_eq!(ob.len(), 1); // coalesced
/// ob.ack(2);
/// assert!(ob.is_empty());
/// ```
#[derive(Debug)]
pub struct Outbox {
    cluster: String,
    epoch: u64,
    capacity: usize,
    max_bytes: usize,
    max_event_bytes: usize,
    /// Bytes held in `by_seq` and `by_key`.
    bytes: usize,
    truncated: u64,
    last_seq: u64,
    acked: u64,
    /// Events as JSON (serialized once, when recorded: smaller than the structs and ready
    /// to send), with their coalescing key.
    by_seq: BTreeMap<u64, Stored>,
    by_key: HashMap<String, u64>,
    resync: Option<(u64, String)>,
    overflows: u64,
}

impl Outbox {
    /// An empty outbox for `cluster` in `epoch`, holding at most `capacity` objects and
    /// [`DEFAULT_MAX_BYTES`]; events are cut to the default per-event limit.
    pub fn new(cluster: &str, epoch: u64, capacity: usize) -> Self {
        Self {
            cluster: cluster.into(),
            epoch,
            capacity: capacity.max(1),
            max_bytes: DEFAULT_MAX_BYTES,
            max_event_bytes: fleetwatch_protocol::Limits::default().max_event_bytes,
            bytes: 0,
            truncated: 0,
            last_seq: 0,
            acked: 0,
            by_seq: BTreeMap::new(),
            by_key: HashMap::new(),
            resync: None,
            overflows: 0,
        }
    }

    /// The same outbox holding at most `max_bytes` of events, each cut to `max_event_bytes`.
    pub fn with_limits(mut self, max_bytes: usize, max_event_bytes: usize) -> Self {
        self.max_bytes = max_bytes.max(1);
        self.max_event_bytes = max_event_bytes.max(1);
        self
    }

    /// Changes the per-event limit (to the hub's, learnt at welcome); held events over a
    /// lower limit are cut down the same way, or collapse the outbox when they cannot be.
    pub fn set_max_event_bytes(&mut self, max_event_bytes: usize) {
        let max_event_bytes = max_event_bytes.max(1);
        if max_event_bytes == self.max_event_bytes {
            return;
        }
        self.max_event_bytes = max_event_bytes;
        let over: Vec<u64> =
            self.by_seq.iter().filter(|(_, st)| st.json.len() > max_event_bytes).map(|(seq, _)| *seq).collect();
        for seq in over {
            let Some(stored) = self.by_seq.get(&seq) else { continue };
            let cut = serde_json::from_str::<Event>(&stored.json).ok().and_then(|ev| self.encode_within_limit(&ev));
            match (cut, self.by_seq.get_mut(&seq)) {
                (Some(json), Some(stored)) => {
                    self.bytes -= stored.json.len();
                    self.bytes += json.len();
                    stored.json = json.into_boxed_str();
                }
                _ => {
                    let reason =
                        format!("agent could not fit a held event into the hub's limit of {max_event_bytes} bytes");
                    self.collapse(self.last_seq, reason);
                    return;
                }
            }
        }
    }

    /// Bytes held (events' JSON and their keys).
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Events that were larger than the per-event limit and sent cut down.
    pub fn truncated(&self) -> u64 {
        self.truncated
    }

    /// The epoch.
    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// The highest acked seq.
    pub fn acked(&self) -> u64 {
        self.acked
    }

    /// The highest seq assigned.
    pub fn last_seq(&self) -> u64 {
        self.last_seq
    }

    /// Events held.
    pub fn len(&self) -> usize {
        self.by_seq.len()
    }

    /// Whether nothing is waiting for an ack.
    pub fn is_empty(&self) -> bool {
        self.by_seq.is_empty() && self.resync.is_none()
    }

    /// How often the outbox collapsed into a resync marker.
    pub fn overflows(&self) -> u64 {
        self.overflows
    }

    /// Records a change from a source.
    pub fn push_change(&mut self, change: crate::source::Change) -> u64 {
        use crate::source::ChangeKind;
        let seq = self.last_seq + 1;
        let (cluster, epoch) = (&self.cluster, self.epoch);
        let ev = match change.kind {
            ChangeKind::Applied => Event::applied(cluster, epoch, seq, &change.key, change.data),
            ChangeKind::Deleted => Event::deleted(cluster, epoch, seq, &change.key, change.data),
            ChangeKind::Inventory => {
                let mut e = Event::applied(cluster, epoch, seq, &change.key, change.data);
                e.kind = fleetwatch_protocol::event::TYPE_INVENTORY.into();
                e.subject = fleetwatch_protocol::event::INVENTORY_SUBJECT.into();
                e
            }
        };
        self.push(ev.with_watch(change.watch))
    }

    /// Records a change of an object.
    pub fn push_applied(&mut self, key: &fleetwatch_protocol::ObjectKey, data: serde_json::Value) -> u64 {
        let seq = self.last_seq + 1;
        self.push(Event::applied(&self.cluster, self.epoch, seq, key, data))
    }

    /// Records a deletion.
    pub fn push_deleted(&mut self, key: &fleetwatch_protocol::ObjectKey, data: serde_json::Value) -> u64 {
        let seq = self.last_seq + 1;
        self.push(Event::deleted(&self.cluster, self.epoch, seq, key, data))
    }

    /// Events coalesce per object and watch: two watches of one object keep their own.
    fn coalesce_key(event: &Event) -> String {
        match &event.watch {
            Some(w) => format!("{w}|{}", event.subject),
            None => event.subject.clone(),
        }
    }

    fn push(&mut self, event: Event) -> u64 {
        let seq = event.seq;
        self.last_seq = seq;
        let key = Self::coalesce_key(&event);
        if let Some(old) = self.by_key.remove(&key)
            && let Some(stored) = self.by_seq.remove(&old)
        {
            self.bytes -= stored.cost();
        }
        let Some(json) = self.encode_within_limit(&event) else {
            let reason = format!(
                "agent could not fit an event for {} into the per-event limit of {} bytes",
                event.subject, self.max_event_bytes
            );
            self.collapse(seq, reason);
            return seq;
        };
        let stored = Stored { key: key.clone().into_boxed_str(), json: json.into_boxed_str() };
        if self.by_seq.len() >= self.capacity {
            self.collapse(seq, format!("agent outbox overflowed its capacity of {} objects", self.capacity));
            return seq;
        }
        if self.bytes + stored.cost() > self.max_bytes {
            let reason = format!(
                "agent outbox overflowed its limit of {} bytes ({} events held)",
                self.max_bytes,
                self.by_seq.len()
            );
            self.collapse(seq, reason);
            return seq;
        }
        self.bytes += stored.cost();
        self.by_key.insert(key, seq);
        self.by_seq.insert(seq, stored);
        seq
    }

    /// Drops every held event for one resync marker at `seq`.
    fn collapse(&mut self, seq: u64, reason: String) {
        self.overflows += 1;
        tracing::warn!(%reason, dropped = self.by_seq.len(), "collapsing outbox into a resync marker");
        self.by_seq.clear();
        self.by_key.clear();
        self.bytes = 0;
        self.resync = Some((seq, reason));
    }

    /// The event's JSON, cut down (see the module doc) when larger than the per-event
    /// limit; `None` when even the cut-down event does not fit.
    fn encode_within_limit(&mut self, event: &Event) -> Option<String> {
        let json = serde_json::to_string(event).ok()?;
        if json.len() <= self.max_event_bytes {
            return Some(json);
        }
        let mut data = serde_json::Map::new();
        if let Some(obj) = event.data.as_object() {
            for (k, v) in obj {
                let keep = match v {
                    serde_json::Value::Object(_) => k == "metadata" && v.to_string().len() <= KEPT_METADATA_BYTES,
                    serde_json::Value::Array(_) => false,
                    _ => v.to_string().len() <= KEPT_SCALAR_BYTES,
                };
                if keep {
                    data.insert(k.clone(), v.clone());
                }
            }
        }
        data.insert("truncated".into(), serde_json::Value::Bool(true));
        data.insert("originalBytes".into(), serde_json::Value::from(json.len()));
        let mut small = event.clone();
        small.data = serde_json::Value::Object(data);
        let cut = serde_json::to_string(&small).ok()?;
        if cut.len() > self.max_event_bytes {
            return None;
        }
        self.truncated += 1;
        tracing::warn!(
            subject = %event.subject,
            bytes = json.len(),
            limit = self.max_event_bytes,
            "event larger than the per-event limit: sending it without its large fields (data.truncated)"
        );
        Some(cut)
    }

    /// Asks subscribers to reconcile the cluster fully (after a restart or relist); the
    /// marker takes the next seq. The reason is cut to the protocol's reason limit.
    pub fn push_resync(&mut self, reason: &str) -> u64 {
        self.last_seq += 1;
        let mut reason = reason.to_string();
        fleetwatch_protocol::codec::cut_reason(&mut reason, fleetwatch_protocol::Limits::default().max_reason_bytes);
        self.resync = Some((self.last_seq, reason));
        self.last_seq
    }

    /// Drops everything up to and including `seq`.
    pub fn ack(&mut self, seq: u64) {
        if seq <= self.acked {
            return;
        }
        self.acked = seq.min(self.last_seq);
        let rest = self.by_seq.split_off(&(seq + 1));
        for (s, stored) in std::mem::replace(&mut self.by_seq, rest) {
            self.bytes -= stored.cost();
            if self.by_key.get(&*stored.key) == Some(&s) {
                self.by_key.remove(&*stored.key);
            }
        }
        if matches!(self.resync, Some((s, _)) if s <= seq) {
            self.resync = None;
        }
    }

    /// Up to `max` items with a seq above `after`, in order. A resync marker is returned
    /// alone, since it travels in its own frame.
    pub fn pending_after(&self, after: u64, max: usize) -> Vec<Item> {
        if let Some((rs, reason)) = &self.resync
            && *rs > after
            && self.by_seq.range(after + 1..*rs).next().is_none()
        {
            return vec![Item::Resync { seq: *rs, reason: reason.clone() }];
        }
        let until = match &self.resync {
            Some((rs, _)) if *rs > after => *rs,
            _ => u64::MAX,
        };
        self.by_seq
            .range(after + 1..until)
            .take(max)
            .map(|(seq, e)| Item::Event { seq: *seq, json: e.json.clone() })
            .collect()
    }

    /// The next frame after `after`: a resync marker alone, or up to `max` events,
    /// assembled from their stored JSON without re-serializing. `None` when nothing waits.
    pub fn next_frame(&self, after: u64, max: usize) -> Option<Frame> {
        if let Some((rs, reason)) = &self.resync
            && *rs > after
            && self.by_seq.range(after + 1..*rs).next().is_none()
        {
            let msg = fleetwatch_protocol::message::AgentMessage::Resync(fleetwatch_protocol::message::Resync {
                epoch: self.epoch,
                seq: *rs,
                reason: reason.clone(),
                objects: Vec::new(),
            });
            return Some(Frame { last_seq: *rs, text: fleetwatch_protocol::codec::encode(&msg) });
        }
        let until = match &self.resync {
            Some((rs, _)) if *rs > after => *rs,
            _ => u64::MAX,
        };
        let mut frame = fleetwatch_protocol::codec::EventsFrame::new();
        let mut last = None;
        for (seq, e) in self.by_seq.range(after + 1..until).take(max.max(1)) {
            frame.push(&e.json);
            last = Some(*seq);
        }
        Some(Frame { last_seq: last?, text: frame.take()? })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_protocol::ObjectKey;
    use proptest::prelude::*;

    fn key(i: usize) -> ObjectKey {
        ObjectKey::new("v1", "ConfigMap", Some("ns"), &format!("o{i}"))
    }

    #[test]
    fn coalesces_per_object_and_keeps_order() {
        let mut ob = Outbox::new("c", 1, 10);
        ob.push_applied(&key(1), serde_json::json!(1));
        ob.push_applied(&key(2), serde_json::json!(2));
        ob.push_applied(&key(1), serde_json::json!(3));
        let items = ob.pending_after(0, 10);
        let seqs: Vec<_> = items.iter().map(Item::seq).collect();
        assert_eq!(seqs, vec![2, 3]);
        ob.ack(2);
        assert_eq!(ob.pending_after(0, 10).len(), 1);
        ob.ack(3);
        assert!(ob.is_empty());
    }

    #[test]
    fn overflow_collapses_into_a_resync_marker() {
        let mut ob = Outbox::new("c", 1, 3);
        for i in 0..3 {
            ob.push_applied(&key(i), serde_json::json!(i));
        }
        ob.push_applied(&key(99), serde_json::json!(0)); // 4th object: overflow
        assert_eq!(ob.len(), 0);
        assert_eq!(ob.overflows(), 1);
        ob.push_applied(&key(5), serde_json::json!(5));
        let first = ob.pending_after(0, 10);
        assert!(matches!(first.as_slice(), [Item::Resync { seq: 4, .. }]));
        let next = ob.pending_after(4, 10);
        assert_eq!(next.iter().map(Item::seq).collect::<Vec<_>>(), vec![5]);
        ob.ack(5);
        assert!(ob.is_empty());
    }

    #[test]
    fn frames_decode_as_protocol_messages() {
        use fleetwatch_protocol::codec::{Limits, decode_agent};
        use fleetwatch_protocol::message::AgentMessage;
        let mut ob = Outbox::new("c", 7, 10);
        ob.push_resync("agent started");
        for i in 0..4 {
            ob.push_applied(&key(i), serde_json::json!({"i": i}));
        }
        let f = ob.next_frame(0, 10).unwrap();
        assert_eq!(f.last_seq, 1);
        assert!(
            matches!(decode_agent(f.text.as_bytes(), &Limits::default()).unwrap(), AgentMessage::Resync(r) if r.seq == 1 && r.epoch == 7)
        );
        let f = ob.next_frame(1, 3).unwrap();
        assert_eq!(f.last_seq, 4);
        match decode_agent(f.text.as_bytes(), &Limits::default()).unwrap() {
            AgentMessage::Events(b) => {
                assert_eq!(b.events.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![2, 3, 4]);
                assert_eq!(b.events[0].data["i"], 0);
            }
            other => panic!("{other:?}"),
        }
        assert!(ob.next_frame(5, 10).is_none());
    }

    #[test]
    fn memory_stays_bounded_through_a_long_outage() {
        let mut ob = Outbox::new("c", 1, 1000);
        for i in 0..1_000_000usize {
            ob.push_applied(&key(i % 500), serde_json::json!({"i": i}));
        }
        assert_eq!(ob.len(), 500);
        assert_eq!(ob.overflows(), 0);
        assert_eq!(ob.by_key.len(), 500);
    }

    #[test]
    fn bytes_are_tracked_and_bounded() {
        let payload = "x".repeat(4000);
        let mut ob = Outbox::new("c", 1, 1_000_000).with_limits(100_000, 64 << 10);
        ob.push_applied(&key(1), serde_json::json!({"p": payload}));
        let one = ob.bytes();
        assert!(one > 4000 && one < 5000, "{one}");
        // Replacing an object's event keeps the byte count of one event (give or take the
        // digits of the timestamp's fraction).
        ob.push_applied(&key(1), serde_json::json!({"p": payload}));
        assert!(ob.bytes().abs_diff(one) < 16, "{} vs {one}", ob.bytes());
        ob.push_applied(&key(2), serde_json::json!({"p": payload}));
        assert!(ob.bytes().abs_diff(2 * one) < 32, "{} vs 2 × {one}", ob.bytes());
        ob.ack(ob.last_seq());
        assert_eq!(ob.bytes(), 0);
        // A long outage with distinct objects: the byte bound collapses it, well below the count bound.
        for i in 0..1000 {
            ob.push_applied(&key(i), serde_json::json!({"p": payload}));
            assert!(ob.bytes() <= 100_000);
        }
        // 1000 events of ~4 KiB against 100 kB: it collapsed (again and again), never grew.
        assert!(ob.overflows() >= 1, "{}", ob.overflows());
        let first = ob.pending_after(ob.acked(), 10);
        match first.as_slice() {
            [Item::Resync { reason, .. }] => assert!(reason.contains("100000 bytes"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn oversized_events_are_cut_down_not_sent_as_is() {
        use fleetwatch_protocol::codec::{Limits, decode_agent};
        use fleetwatch_protocol::message::AgentMessage;
        let mut ob = Outbox::new("c", 1, 10).with_limits(1 << 20, 64 << 10);
        let big = serde_json::json!({
            "apiVersion": "v1", "kind": "ConfigMap", "generation": 7,
            "metadata": {"name": "a", "namespace": "ns"},
            "projected": {"/data": "y".repeat(100_000)},
        });
        ob.push_applied(&key(1), big);
        assert_eq!(ob.truncated(), 1);
        assert_eq!(ob.overflows(), 0);
        let f = ob.next_frame(0, 10).unwrap();
        assert!(f.text.len() < 64 << 10);
        match decode_agent(f.text.as_bytes(), &Limits::default()).unwrap() {
            AgentMessage::Events(b) => {
                let d = &b.events[0].data;
                assert_eq!(d["truncated"], true);
                assert_eq!(d["generation"], 7);
                assert_eq!(d["metadata"]["name"], "a");
                assert!(d.get("projected").is_none());
                assert!(d["originalBytes"].as_u64().unwrap() > 100_000);
            }
            other => panic!("{other:?}"),
        }
        // A small event is untouched.
        ob.push_applied(&key(2), serde_json::json!({"generation": 1}));
        assert_eq!(ob.truncated(), 1);
    }

    #[test]
    fn a_lower_hub_limit_cuts_held_events() {
        let mut ob = Outbox::new("c", 1, 10);
        ob.push_applied(&key(1), serde_json::json!({"generation": 3, "blob": "z".repeat(20_000)}));
        ob.push_applied(&key(2), serde_json::json!({"generation": 1}));
        let before = ob.bytes();
        ob.set_max_event_bytes(8 << 10);
        assert_eq!(ob.truncated(), 1);
        assert!(ob.bytes() < before - 15_000, "{} vs {before}", ob.bytes());
        let f = ob.next_frame(0, 10).unwrap();
        assert!(f.text.contains(r#""truncated":true"#) && !f.text.contains("zzzz"));
        assert_eq!(ob.len(), 2);
    }

    #[test]
    fn long_resync_reasons_are_cut() {
        let mut ob = Outbox::new("c", 1, 10);
        ob.push_resync(&"r".repeat(5000));
        match ob.pending_after(0, 1).as_slice() {
            [Item::Resync { reason, .. }] => assert!(reason.len() <= 1024),
            other => panic!("{other:?}"),
        }
    }

    proptest! {
        /// Whatever the interleaving of changes and acks, the outbox holds exactly the latest
        /// unacked event of each object (or a resync marker after an overflow).
        #[test]
        fn holds_latest_unacked_state(ops in proptest::collection::vec((0usize..8, any::<bool>()), 1..200)) {
            let mut ob = Outbox::new("c", 1, 100);
            let mut latest: HashMap<String, u64> = HashMap::new();
            let mut acked = 0;
            for (k, ack) in ops {
                if ack {
                    acked = ob.last_seq();
                    ob.ack(acked);
                } else {
                    let seq = ob.push_applied(&key(k), serde_json::json!(k));
                    latest.insert(key(k).to_string(), seq);
                }
            }
            let mut expect: Vec<u64> = latest.values().copied().filter(|s| *s > acked).collect();
            expect.sort();
            let got: Vec<u64> = ob.pending_after(0, usize::MAX).iter().map(Item::seq).collect();
            prop_assert_eq!(got, expect);
        }
    }
}
