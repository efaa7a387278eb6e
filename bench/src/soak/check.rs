//! What the soak's subscriber saw, and the per-object verdict.
//!
//! The promise checked (see DESIGN.md, "Delivery guarantee"): every change of a watched
//! object reaches the subscriber as an event, or is subsumed by a later event for the same
//! object, or by a `resync-required` for its cluster. The checker models what a level-based
//! subscriber knows at the end: per object, the newer of (a) the last event it received
//! for it and (b) a re-list of the cluster at the last `resync-required` for the cluster
//! (or `*`). So a resync only counts for an object when it arrived
//! - after the write that produced the object's final state (a re-list then reads that
//!   state), and
//! - after the subscriber's last event for the object (an event that arrives after the
//!   resync replaces what the re-list read: when that event is stale, the change after it
//!   was lost after the resync, and the resync does not cover it).
//!
//! Times are the soak process's own monotonic clock: the churn and the subscriber both run
//! in it. A redelivered record (after a reconnect, from the acked cursor) counts again at
//! its new arrival, as a real subscriber applies it again.

use std::collections::{HashMap, HashSet};
use std::time::Instant;

use fleetwatch_protocol::Event;
use fleetwatch_protocol::message::ResyncRequired;

/// The field the churn writes and the watch projects: a per-object version.
pub const VERSION_FIELD: &str = "/data/v";

/// The last thing the subscriber heard about one object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum View {
    /// Applied, with the projected version (none when the projection lacked it).
    Applied(Option<String>),
    /// Deleted, with the version it had (none for a delete found by a relist).
    Deleted(Option<String>),
}

impl std::fmt::Display for View {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            View::Applied(v) => write!(f, "applied v={}", v.as_deref().unwrap_or("?")),
            View::Deleted(v) => write!(f, "deleted (v={})", v.as_deref().unwrap_or("?")),
        }
    }
}

/// An object's state in its cluster at the end.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Truth {
    /// It exists with this version.
    Present(String),
    /// It does not exist; it had this version when last deleted (when known).
    Absent(Option<String>),
}

impl std::fmt::Display for Truth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Truth::Present(v) => write!(f, "exists with v={v}"),
            Truth::Absent(v) => write!(f, "deleted (last v={})", v.as_deref().unwrap_or("?")),
        }
    }
}

/// Per object: how its final state reached the subscriber.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The last event seen shows the final state.
    Final,
    /// A `resync-required` for its cluster arrived after its last write.
    Resync,
    /// Neither: the change was lost.
    Lost,
}

/// Judges one object: `truth` is its final state in the cluster, `last_write` when the
/// write that produced it finished (or a later failed attempt: the later time is the
/// conservative one), `view` the last event the subscriber received for it with its arrival
/// time, and `last_resync` when the newest `resync-required` covering its cluster arrived.
pub fn judge(
    truth: &Truth,
    view: Option<(&View, Instant)>,
    last_write: Instant,
    last_resync: Option<Instant>,
) -> Verdict {
    let delivered = view.is_some_and(|(v, _)| shows(truth, v));
    // A resync the last event arrived after is superseded by that event.
    let resync_after_view = last_resync.filter(|r| view.is_none_or(|(_, seen_at)| *r > seen_at));
    match resync_after_view {
        // The subscriber's knowledge is its last event.
        None if delivered => Verdict::Final,
        None => Verdict::Lost,
        // Its knowledge is a re-list at the resync: the final state when the resync came
        // after the final write.
        Some(r) if r > last_write => {
            if delivered {
                Verdict::Final
            } else {
                Verdict::Resync
            }
        }
        Some(_) => Verdict::Lost,
    }
}

/// Whether a view shows the final state.
fn shows(truth: &Truth, view: &View) -> bool {
    match (truth, view) {
        (Truth::Present(v), View::Applied(Some(seen))) => v == seen,
        // A delete found by a relist carries no version; any delete says "gone".
        (Truth::Absent(_), View::Deleted(None)) => true,
        (Truth::Absent(last), View::Deleted(Some(seen))) => last.as_ref().is_none_or(|l| l == seen),
        _ => false,
    }
}

/// Everything the subscriber received, in arrival order.
#[derive(Default)]
pub struct Observed {
    /// (cluster, subject) → last view and when it arrived.
    views: HashMap<(String, String), (View, Instant)>,
    /// cluster (or `*`) → when the newest `resync-required` for it arrived (a redelivery
    /// included: the subscriber re-lists again then).
    resyncs: HashMap<String, Instant>,
    /// Resync records seen, by (cluster, cursor, reason): a redelivery after a reconnect
    /// is the same record, counted once in the figures.
    seen_resyncs: HashSet<(String, u64, String)>,
    /// Events received (redeliveries included).
    pub events: u64,
    /// Distinct `resync-required` records received.
    pub resync_count: u64,
    /// Reasons of distinct resyncs, counted.
    pub resync_reasons: HashMap<String, u64>,
}

impl Observed {
    /// Records events of the watch `watch`; other events are only counted.
    pub fn events(&mut self, events: &[Event], watch: &str, now: Instant) {
        for e in events {
            self.events += 1;
            if e.watch.as_deref() != Some(watch) {
                continue;
            }
            let version = e.data["projected"][VERSION_FIELD].as_str().map(str::to_string);
            let view = if e.is_delete() { View::Deleted(version) } else { View::Applied(version) };
            self.views.insert((e.cluster.clone(), e.subject.clone()), (view, now));
        }
    }

    /// Records a `resync-required`.
    pub fn resync(&mut self, r: &ResyncRequired, now: Instant) {
        self.resyncs.insert(r.cluster.clone(), now);
        if !self.seen_resyncs.insert((r.cluster.clone(), r.cursor, r.reason.clone())) {
            return;
        }
        self.resync_count += 1;
        *self.resync_reasons.entry(reason_kind(&r.reason)).or_default() += 1;
    }

    /// The last view of an object and when it arrived.
    pub fn view(&self, cluster: &str, subject: &str) -> Option<(&View, Instant)> {
        self.views.get(&(cluster.to_string(), subject.to_string())).map(|(v, at)| (v, *at))
    }

    /// When the newest resync covering `cluster` (its own or `*`) arrived.
    pub fn last_resync(&self, cluster: &str) -> Option<Instant> {
        self.resyncs.get(cluster).copied().max(self.resyncs.get("*").copied())
    }
}

/// A reason's wording without its numbers (sequence numbers, offsets, cursors), at most
/// 100 characters: resyncs are counted by it.
fn reason_kind(reason: &str) -> String {
    let mut out = String::new();
    for c in reason.chars() {
        if c.is_ascii_digit() {
            if !out.ends_with('N') {
                out.push('N');
            }
        } else {
            out.push(c);
        }
        if out.len() >= 100 {
            out.push('…');
            break;
        }
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_protocol::event::ObjectKey;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    const WATCH: &str = "w";

    fn subject() -> String {
        ObjectKey::new("v1", "ConfigMap", Some("soak"), "cm-1").to_string()
    }

    /// An event of the watch for `cm-1` in `c1` with version `v`.
    fn event(v: &str, seq: u64) -> Event {
        let key = ObjectKey::new("v1", "ConfigMap", Some("soak"), "cm-1");
        let mut e = Event::applied("c1", 1, seq, &key, serde_json::json!({"projected": {VERSION_FIELD: v}}));
        e.watch = Some(WATCH.into());
        e
    }

    fn resync(cluster: &str, cursor: u64) -> ResyncRequired {
        ResyncRequired { cluster: cluster.into(), cursor, reason: "agent started".into() }
    }

    /// The verdict for `cm-1` of `c1` from what `o` observed.
    fn verdict(o: &Observed, truth: &Truth, last_write: Instant) -> Verdict {
        judge(truth, o.view("c1", &subject()), last_write, o.last_resync("c1"))
    }

    #[test]
    fn final_state_seen_passes() {
        let t = Instant::now();
        let v = View::Applied(Some("7".into()));
        assert_eq!(judge(&Truth::Present("7".into()), Some((&v, at(t, 5))), t, None), Verdict::Final);
        let d = View::Deleted(Some("7".into()));
        assert_eq!(judge(&Truth::Absent(Some("7".into())), Some((&d, at(t, 5))), t, None), Verdict::Final);
        let gone = View::Deleted(None);
        assert_eq!(judge(&Truth::Absent(Some("7".into())), Some((&gone, at(t, 5))), t, None), Verdict::Final);
        // A resync after the final event (and after the write) changes nothing.
        assert_eq!(judge(&Truth::Present("7".into()), Some((&v, at(t, 5))), t, Some(at(t, 9))), Verdict::Final);
    }

    #[test]
    fn stale_or_missing_state_needs_a_later_resync() {
        let t = Instant::now();
        let old = View::Applied(Some("6".into()));
        let truth = Truth::Present("7".into());
        let seen = Some((&old, at(t, 1)));
        assert_eq!(judge(&truth, seen, at(t, 10), None), Verdict::Lost);
        assert_eq!(judge(&truth, seen, at(t, 10), Some(at(t, 5))), Verdict::Lost, "resync before the write");
        assert_eq!(judge(&truth, seen, at(t, 10), Some(at(t, 20))), Verdict::Resync);
        assert_eq!(judge(&truth, None, at(t, 10), None), Verdict::Lost);
        assert_eq!(judge(&truth, None, at(t, 10), Some(at(t, 11))), Verdict::Resync);
        // An earlier delete of an object that was recreated and deleted again is stale.
        let earlier = View::Deleted(Some("3".into()));
        assert_eq!(judge(&Truth::Absent(Some("9".into())), Some((&earlier, t)), t, None), Verdict::Lost);
        // Seen as existing, but deleted since.
        let applied = View::Applied(Some("9".into()));
        assert_eq!(judge(&Truth::Absent(Some("9".into())), Some((&applied, t)), t, None), Verdict::Lost);
    }

    /// The order that counts: write v7, then the resync, then the last (stale) event.
    /// The resync came after the write, but the subscriber's knowledge afterwards is the
    /// stale event: v7 was lost after the resync. The checker before issue 26 compared
    /// the resync with the write only and passed this.
    #[test]
    fn a_stale_event_after_the_resync_is_lost() {
        let t = Instant::now();
        let mut o = Observed::default();
        o.events(&[event("5", 1)], WATCH, at(t, 1));
        let write_v7 = at(t, 10);
        o.resync(&resync("c1", 40), at(t, 20));
        o.events(&[event("6", 2)], WATCH, at(t, 30));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Lost);
        // The same with a resync for every cluster.
        let mut o = Observed::default();
        o.resync(&resync("*", 40), at(t, 20));
        o.events(&[event("6", 2)], WATCH, at(t, 30));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Lost);
    }

    /// The other order: the stale event, the write, then the resync: a re-list at the
    /// resync reads v7.
    #[test]
    fn a_resync_after_the_stale_event_and_the_write_covers_it() {
        let t = Instant::now();
        let mut o = Observed::default();
        o.events(&[event("6", 2)], WATCH, at(t, 5));
        let write_v7 = at(t, 10);
        o.resync(&resync("c1", 40), at(t, 20));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Resync);
        // A resync for another cluster covers nothing here.
        let mut o = Observed::default();
        o.events(&[event("6", 2)], WATCH, at(t, 5));
        o.resync(&resync("c2", 41), at(t, 20));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Lost);
        // Nor does one that came before the write.
        let mut o = Observed::default();
        o.events(&[event("6", 2)], WATCH, at(t, 5));
        o.resync(&resync("c1", 40), at(t, 8));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Lost);
    }

    #[test]
    fn reasons_are_counted_by_their_wording() {
        assert_eq!(
            reason_kind("records lost in segment 00000012.log at offset 4096: checksum mismatch"),
            "records lost in segment N.log at offset N: checksum mismatch"
        );
        assert_eq!(reason_kind(&"x".repeat(300)).chars().count(), 101);
    }

    /// After a reconnect the hub redelivers from the acked cursor: the stale event and then
    /// the resync again. The subscriber applies both again, so the redelivered resync
    /// (after the redelivered event) covers the object; it is counted once.
    #[test]
    fn a_redelivered_resync_counts_at_its_new_arrival_but_once() {
        let t = Instant::now();
        let mut o = Observed::default();
        let write_v7 = at(t, 10);
        o.events(&[event("6", 2)], WATCH, at(t, 15));
        o.resync(&resync("c1", 40), at(t, 20));
        o.events(&[event("6", 2)], WATCH, at(t, 30));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Lost, "stale redelivery last");
        o.resync(&resync("c1", 40), at(t, 31));
        assert_eq!(verdict(&o, &Truth::Present("7".into()), write_v7), Verdict::Resync);
        assert_eq!(o.resync_count, 1);
        let all = ResyncRequired { cluster: "*".into(), cursor: 9, reason: "history lost".into() };
        o.resync(&all, at(t, 50));
        assert_eq!(o.last_resync("c1"), Some(at(t, 50)));
        assert_eq!(o.last_resync("c2"), Some(at(t, 50)));
        assert_eq!(o.resync_count, 2);
    }
}
