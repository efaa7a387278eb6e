//! The oracle: what a subscriber knows, built only from what the hub delivered to it, and
//! the check against the clusters' final state.
//!
//! A subscriber's knowledge is one value per object, set by events in delivery order
//! (a delete removes it). A `resync-required` for a cluster (or `*`) makes it re-list
//! that cluster at the moment it is delivered: its knowledge of the cluster becomes the
//! cluster's state then. So at the end, knowledge equals the cluster's final state exactly
//! when every change was delivered, subsumed by a later event for the same object, or
//! followed by a resync delivered after it; anything else is a silent loss.
//!
//! Duplicates: within one subscriber process and one stream, a cursor at or below one
//! it already acknowledged must not come again (unless a `resync-required` `*` below it
//! placed the subscriber back: the hub's log lost what it had read), and one event
//! (cluster, epoch, seq) must not be delivered under two cursors unless a resync of its
//! cluster came between.

use std::collections::BTreeMap;

use fleetwatch_protocol::event::Event;

use crate::cluster::{Value64, event_name, event_value};

/// Every cluster's objects and values: `cluster → name → value`.
pub type States = BTreeMap<String, BTreeMap<String, Value64>>;

/// What one subscriber knows and what went wrong on its way.
#[derive(Debug, Default, Clone)]
pub struct SubscriberModel {
    /// `cluster → name → value`.
    knowledge: States,
    /// The stream read, and the highest cursor acknowledged in it (this process).
    stream: Option<String>,
    acked: Option<u64>,
    /// Event id → the cursor it came under, per stream, until its cluster resyncs.
    seen: BTreeMap<String, (String, u64)>,
    /// Violations of the delivery rules, as they happened.
    pub violations: Vec<String>,
    /// Events delivered.
    pub events: u64,
    /// `resync-required` deliveries.
    pub resyncs: u64,
    /// Times the knowledge was rebuilt by a re-list at (re)subscribe.
    pub relists: u64,
    /// A digest of everything delivered, in order (replays must match it).
    pub fingerprint: u64,
}

impl SubscriberModel {
    /// The subscriber process (re)started: acknowledgements it sent may not have arrived.
    pub fn restarted(&mut self) {
        self.acked = None;
    }

    /// The process lost its memory (a subscriber without durable state).
    pub fn forget(&mut self) {
        self.knowledge.clear();
        self.seen.clear();
    }

    /// Re-listed every cluster: knowledge is `states` (a subscriber starting from `latest`).
    pub fn relist(&mut self, states: &States) {
        self.knowledge = states.clone();
        self.seen.clear();
        self.relists += 1;
        self.mix(format!("relist {}", states.values().map(BTreeMap::len).sum::<usize>()));
    }

    /// The stream now read; dedup tracking restarts with another stream.
    fn on_stream(&mut self, stream: &str) {
        if self.stream.as_deref() != Some(stream) {
            self.stream = Some(stream.to_string());
            self.acked = None;
            self.seen.clear();
        }
    }

    /// Events delivered from `stream`.
    pub fn deliver_events(&mut self, stream: &str, events: &[Event]) {
        self.on_stream(stream);
        for ev in events {
            let cursor = ev.cursor.unwrap_or(0);
            self.events += 1;
            self.mix(format!("ev {} {} {cursor}", ev.id, ev.kind));
            if let Some(a) = self.acked
                && cursor <= a
            {
                self.violations.push(format!(
                    "duplicate after ack: event {} delivered at cursor {cursor}, but cursor {a} of stream {stream} was \
                     already acknowledged by this process",
                    ev.id
                ));
            }
            match self.seen.get(&ev.id) {
                Some((s, c)) if s == stream && *c != cursor => self.violations.push(format!(
                    "duplicate: event {} delivered at cursor {c} and again at cursor {cursor} of stream {stream} with \
                     no resync of cluster {} between",
                    ev.id, ev.cluster
                )),
                _ => {
                    self.seen.insert(ev.id.clone(), (stream.to_string(), cursor));
                }
            }
            let Some(name) = event_name(&ev.data) else {
                self.violations.push(format!("event {} has no object name", ev.id));
                continue;
            };
            let objects = self.knowledge.entry(ev.cluster.clone()).or_default();
            if ev.is_delete() {
                objects.remove(name);
            } else {
                match event_value(&ev.data) {
                    Some(v) => {
                        objects.insert(name.to_string(), v);
                    }
                    None => self.violations.push(format!("event {} of {name} carries no spec.v", ev.id)),
                }
            }
        }
    }

    /// A `resync-required` for `cluster` (or `*`) delivered from `stream`: the subscriber
    /// re-lists it now, seeing `states`.
    pub fn deliver_resync(&mut self, stream: &str, cluster: &str, cursor: u64, states: &States) {
        self.on_stream(stream);
        self.resyncs += 1;
        self.mix(format!("resync {cluster} {cursor}"));
        if cluster == fleetwatch_bus::ALL_CLUSTERS {
            self.knowledge = states.clone();
            self.seen.clear();
            if self.acked.is_some_and(|a| cursor < a) {
                // Placed below what it acknowledged: the hub's log lost records it had (its
                // cursor lay beyond the end; the client follows the hub's placement), so the
                // offsets after this one are new records, not ones it read (seed 71972).
                self.acked = Some(cursor);
            }
        } else {
            self.knowledge.insert(cluster.to_string(), states.get(cluster).cloned().unwrap_or_default());
            let prefix = format!("{cluster}/");
            self.seen.retain(|id, _| !id.starts_with(&prefix));
        }
    }

    /// The subscriber acknowledged `cursor` of `stream`.
    pub fn acknowledged(&mut self, stream: &str, cursor: u64) {
        self.on_stream(stream);
        self.acked = Some(self.acked.map_or(cursor, |a| a.max(cursor)));
    }

    /// How knowledge differs from the clusters' `finals` (empty: it matches).
    pub fn differences(&self, finals: &States) -> Vec<String> {
        let mut out = Vec::new();
        let empty = BTreeMap::new();
        for (cluster, want) in finals {
            let have = self.knowledge.get(cluster).unwrap_or(&empty);
            for (name, v) in want {
                match have.get(name) {
                    Some(h) if h == v => {}
                    Some(h) => out.push(format!("cluster {cluster} object {name}: knows value {h}, cluster has {v}")),
                    None => out.push(format!("cluster {cluster} object {name}: unknown, cluster has value {v}")),
                }
            }
            for (name, h) in have {
                if !want.contains_key(name) {
                    out.push(format!("cluster {cluster} object {name}: knows value {h}, but it was deleted"));
                }
            }
        }
        out
    }

    fn mix(&mut self, s: String) {
        // FNV-1a: stable across processes and releases, unlike std's hasher.
        let h = if self.fingerprint == 0 {
            fleetwatch_protocol::digest::Fnv1a::new()
        } else {
            fleetwatch_protocol::digest::Fnv1a::resume(self.fingerprint)
        };
        self.fingerprint = h.update(s.as_bytes()).finish();
    }
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::event::ObjectKey;
    use serde_json::json;

    use super::*;

    fn ev(cluster: &str, seq: u64, cursor: u64, name: &str, v: Option<u64>) -> Event {
        let key = ObjectKey::new("v1", "ConfigMap", Some("w"), name);
        let mut e = match v {
            Some(v) => Event::applied(
                cluster,
                1,
                seq,
                &key,
                json!({"metadata": {"name": name}, "projected": {"spec": {"v": v}}}),
            ),
            None => Event::deleted(cluster, 1, seq, &key, json!({"metadata": {"name": name}})),
        };
        e.cursor = Some(cursor);
        e
    }

    fn states(objs: &[(&str, &str, u64)]) -> States {
        let mut s = States::new();
        for (c, n, v) in objs {
            s.entry(c.to_string()).or_default().insert(n.to_string(), *v);
        }
        s
    }

    #[test]
    fn events_in_order_make_the_final_state() {
        let mut m = SubscriberModel::default();
        m.deliver_events("s", &[ev("c1", 1, 1, "a", Some(1)), ev("c1", 2, 2, "b", Some(2))]);
        m.deliver_events("s", &[ev("c1", 3, 3, "a", None), ev("c1", 4, 4, "b", Some(4))]);
        let mut finals = states(&[("c1", "b", 4)]);
        assert!(m.differences(&finals).is_empty(), "{:?}", m.differences(&finals));
        finals.get_mut("c1").unwrap().insert("a".into(), 5);
        assert_eq!(m.differences(&finals).len(), 1, "a missed create is found");
        assert!(m.violations.is_empty());
    }

    #[test]
    fn a_missed_delete_is_found_unless_a_resync_came_after_it() {
        let mut m = SubscriberModel::default();
        m.deliver_events("s", &[ev("c1", 1, 1, "victim", Some(1))]);
        let after_delete = states(&[]);
        assert_eq!(m.differences(&after_delete).len(), 0, "no cluster entry in finals: nothing to compare");
        let finals = states(&[("c1", "other", 2)]);
        let d = m.differences(&finals);
        assert!(d.iter().any(|l| l.contains("victim") && l.contains("deleted")), "{d:?}");
        // A resync before the delete does not help; one after it does.
        m.deliver_resync("s", "c1", 2, &states(&[("c1", "victim", 1), ("c1", "other", 2)]));
        assert!(!m.differences(&finals).is_empty());
        m.deliver_resync("s", "*", 3, &finals);
        assert!(m.differences(&finals).is_empty());
    }

    #[test]
    fn redelivery_after_ack_and_double_storage_are_violations() {
        let mut m = SubscriberModel::default();
        m.deliver_events("s", &[ev("c1", 1, 5, "a", Some(1))]);
        m.acknowledged("s", 5);
        // Unacked redelivery under the same cursor is fine; an acked one is not.
        m.deliver_events("s", &[ev("c1", 1, 5, "a", Some(1))]);
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
        // The same event stored twice (another cursor) without a resync between.
        m.deliver_events("s", &[ev("c1", 1, 9, "a", Some(1))]);
        assert_eq!(m.violations.len(), 2, "{:?}", m.violations);
        // A new stream (hub restarted empty) starts over; a restarted process may get
        // what it acked again.
        m.deliver_events("t", &[ev("c1", 1, 1, "a", Some(1))]);
        m.restarted();
        m.deliver_events("t", &[ev("c1", 1, 1, "a", Some(1))]);
        assert_eq!(m.violations.len(), 2, "{:?}", m.violations);
    }

    #[test]
    fn a_resync_of_every_cluster_below_the_ack_places_the_subscriber_back() {
        let mut m = SubscriberModel::default();
        m.deliver_events("s", &[ev("c1", 1, 7, "a", Some(1))]);
        m.acknowledged("s", 7);
        // One cluster's resync below the ack does not: offsets at or below 7 stay read.
        m.deliver_resync("s", "c1", 3, &states(&[("c1", "a", 1)]));
        m.deliver_events("s", &[ev("c1", 2, 5, "a", Some(2))]);
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
        // `*` at 3 (the hub's log lost what it had): 4.. are new records.
        m.deliver_resync("s", "*", 3, &states(&[("c1", "a", 2)]));
        m.deliver_events("s", &[ev("c1", 3, 4, "a", Some(3)), ev("c1", 4, 7, "a", Some(4))]);
        assert_eq!(m.violations.len(), 1, "{:?}", m.violations);
        m.acknowledged("s", 7);
        m.deliver_events("s", &[ev("c1", 4, 7, "a", Some(4))]);
        assert_eq!(m.violations.len(), 2, "acked again after the placement: {:?}", m.violations);
    }
}
