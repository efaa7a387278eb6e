//! What the soak's subscriber saw, and the per-object verdict.
//!
//! The promise checked (see DESIGN.md, "Delivery guarantee"): every change of a watched
//! object reaches the subscriber as an event, or is subsumed by a later event for the same
//! object, or by a `resync-required` for its cluster. So per object, at the end, either the
//! last event the subscriber saw shows the object's final state, or a `resync-required`
//! for its cluster (or `*`) arrived after the object's last write: a subscriber that
//! reconciles the cluster then reads the final state. Anything else is lost.

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

/// Judges one object.
pub fn judge(truth: &Truth, view: Option<&View>, last_write: Instant, last_resync: Option<Instant>) -> Verdict {
    let delivered = match (truth, view) {
        (Truth::Present(v), Some(View::Applied(Some(seen)))) => v == seen,
        // A delete found by a relist carries no version; any delete says "gone".
        (Truth::Absent(_), Some(View::Deleted(None))) => true,
        (Truth::Absent(last), Some(View::Deleted(Some(seen)))) => last.as_ref().is_none_or(|l| l == seen),
        _ => false,
    };
    if delivered {
        Verdict::Final
    } else if last_resync.is_some_and(|r| r > last_write) {
        Verdict::Resync
    } else {
        Verdict::Lost
    }
}

/// Everything the subscriber received, in arrival order.
#[derive(Default)]
pub struct Observed {
    /// (cluster, subject) → last view and when it arrived.
    views: HashMap<(String, String), (View, Instant)>,
    /// cluster (or `*`) → when the newest distinct `resync-required` first arrived.
    resyncs: HashMap<String, Instant>,
    /// Resync records seen, by (cluster, cursor, reason): a redelivery after a reconnect
    /// is the same record and must not count as a newer one.
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
        if !self.seen_resyncs.insert((r.cluster.clone(), r.cursor, r.reason.clone())) {
            return;
        }
        self.resync_count += 1;
        // Reasons carry sequence numbers; count them by their wording only.
        let kind: String = r.reason.chars().take_while(|c| !c.is_ascii_digit()).collect();
        *self.resync_reasons.entry(kind.trim().to_string()).or_default() += 1;
        self.resyncs.insert(r.cluster.clone(), now);
    }

    /// The last view of an object.
    pub fn view(&self, cluster: &str, subject: &str) -> Option<&(View, Instant)> {
        self.views.get(&(cluster.to_string(), subject.to_string()))
    }

    /// When the newest resync covering `cluster` (its own or `*`) arrived.
    pub fn last_resync(&self, cluster: &str) -> Option<Instant> {
        self.resyncs.get(cluster).copied().max(self.resyncs.get("*").copied())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn at(base: Instant, ms: u64) -> Instant {
        base + Duration::from_millis(ms)
    }

    #[test]
    fn final_state_seen_passes() {
        let t = Instant::now();
        let v = View::Applied(Some("7".into()));
        assert_eq!(judge(&Truth::Present("7".into()), Some(&v), t, None), Verdict::Final);
        let d = View::Deleted(Some("7".into()));
        assert_eq!(judge(&Truth::Absent(Some("7".into())), Some(&d), t, None), Verdict::Final);
        assert_eq!(judge(&Truth::Absent(Some("7".into())), Some(&View::Deleted(None)), t, None), Verdict::Final);
    }

    #[test]
    fn stale_or_missing_state_needs_a_later_resync() {
        let t = Instant::now();
        let old = View::Applied(Some("6".into()));
        let truth = Truth::Present("7".into());
        assert_eq!(judge(&truth, Some(&old), at(t, 10), None), Verdict::Lost);
        assert_eq!(judge(&truth, Some(&old), at(t, 10), Some(at(t, 5))), Verdict::Lost, "resync before the write");
        assert_eq!(judge(&truth, Some(&old), at(t, 10), Some(at(t, 20))), Verdict::Resync);
        assert_eq!(judge(&truth, None, at(t, 10), None), Verdict::Lost);
        // An earlier delete of an object that was recreated and deleted again is stale.
        let earlier = View::Deleted(Some("3".into()));
        assert_eq!(judge(&Truth::Absent(Some("9".into())), Some(&earlier), t, None), Verdict::Lost);
        // Seen as existing, but deleted since.
        assert_eq!(
            judge(&Truth::Absent(Some("9".into())), Some(&View::Applied(Some("9".into()))), t, None),
            Verdict::Lost
        );
    }

    #[test]
    fn redelivered_resync_does_not_move_forward() {
        let t = Instant::now();
        let mut o = Observed::default();
        let r = ResyncRequired { cluster: "c1".into(), cursor: 5, reason: "agent started".into() };
        o.resync(&r, at(t, 10));
        o.resync(&r, at(t, 50));
        assert_eq!(o.last_resync("c1"), Some(at(t, 10)));
        assert_eq!(o.resync_count, 1);
        let all = ResyncRequired { cluster: "*".into(), cursor: 9, reason: "history lost".into() };
        o.resync(&all, at(t, 30));
        assert_eq!(o.last_resync("c1"), Some(at(t, 30)));
        assert_eq!(o.last_resync("c2"), Some(at(t, 30)));
    }
}
