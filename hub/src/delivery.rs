//! The pure core of a subscriber session (see [`crate::session::subscriber`]): where it
//! starts ([`start`]), how much it may have sent and not acked ([`Window`]), and which
//! records are its ([`Filter`]). The session carries these decisions out against the bus
//! and the socket; kept apart, their rules are tested alone.

use std::sync::Arc;

// tokio's clock (std's in programs): the simulation runs sessions on simulated time.
use tokio::time::Instant;

use crate::policy::access::Grant;
use fleetwatch_bus::ALL_CLUSTERS;

/// The window when the subscriber does not ask for one.
pub(crate) const DEFAULT_WINDOW: u64 = 10_000;
/// The largest window a subscriber may ask for.
pub(crate) const MAX_WINDOW: u64 = 100_000;

/// What the bus keeps under a subscription's durable name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StoredCursor {
    /// No durable name, or one never seen: nothing stored.
    None,
    /// The cursor stored under it.
    Known(u64),
    /// Unknown because the cursor store was lost: the name may have existed. Why, for the
    /// subscriber.
    Lost(String),
}

/// Where a subscription starts, as the session was asked.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Asked<'a> {
    /// The client's resume point: the stream and cursor it acknowledged last.
    pub(crate) resume: Option<(&'a str, u64)>,
    /// The stream the bus holds now.
    pub(crate) stream: &'a str,
    /// Why a resume point from another stream lost its history.
    pub(crate) lost_history: &'a str,
}

/// Where a session starts and what it must tell the subscriber first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Start {
    /// The session sends records after this offset.
    pub(crate) cursor: u64,
    /// Why the subscriber must reconcile every cluster before reading on, if it must.
    pub(crate) resync_all: Option<String>,
    /// Whether the durable name (if any) is stored at `cursor` now. A name whose cursor
    /// was lost is stored at its first ack instead: until the subscriber took the resync
    /// in, a reconnect must get it again.
    pub(crate) register: bool,
}

/// Decides where a session starts: after the client's resume point in the same stream
/// (or the stored durable cursor if that is further on), else the stored cursor, else
/// where `default_start` puts a new subscription (`from`). A resume point from another
/// stream, a lost cursor store, or a cursor past `last` (the end of the log: records the
/// subscriber had were lost) each make the subscriber reconcile everything; a cursor past
/// the end is never taken, the session starts at the end (`last` is read once the start
/// is known).
pub(crate) fn start(
    asked: Asked<'_>,
    stored: StoredCursor,
    default_start: impl FnOnce() -> u64,
    last: impl FnOnce() -> u64,
) -> Start {
    let mut resync_all = None;
    let register = !matches!(stored, StoredCursor::Lost(_));
    let stored = match stored {
        StoredCursor::Known(c) => Some(c),
        StoredCursor::None => None,
        StoredCursor::Lost(why) => {
            resync_all = Some(why);
            None
        }
    };
    let mut cursor = match (asked.resume, stored) {
        (Some((stream, cursor)), stored) if stream == asked.stream => cursor.max(stored.unwrap_or(0)),
        (Some(_), stored) => {
            // The client's cursor is from a bus that no longer exists.
            resync_all = Some(asked.lost_history.to_string());
            stored.unwrap_or_else(default_start)
        }
        (None, Some(c)) => c,
        (None, None) => default_start(),
    };
    // Read after the default start: records appended meanwhile do not make `latest` look
    // past the end.
    let last = last();
    if cursor > last {
        // Records this subscriber had were lost from the log: it must not skip what
        // comes next under offsets it thinks it has read.
        resync_all = Some(format!("cursor {cursor} is beyond the end of the hub's log ({last}): records were lost"));
        cursor = last;
    }
    Start { cursor, resync_all, register }
}

/// What a session may do now, from its window (see [`Window::look`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Look {
    /// Records wait and the window has room: read and send more.
    pub(crate) can_send: bool,
    /// The window is full while records wait: the subscriber must ack by then or the
    /// session ends as stalled.
    pub(crate) stall_at: Option<Instant>,
}

/// A session's window: the offsets acked, read (sent, or skipped by its filter) and sent,
/// and how far past its ack the last record sent may be (in offsets). Records its filter
/// skips after the last one sent are read for it but not sent: it cannot ack those, so
/// they do not count against its window.
#[derive(Debug, Clone)]
pub(crate) struct Window {
    size: u64,
    acked: u64,
    read: u64,
    sent: u64,
    /// Since when the window is full while more records wait, with no ack since.
    full_since: Option<Instant>,
}

impl Window {
    /// The window a subscriber asked for (`max_in_flight`), within bounds.
    pub(crate) fn size_for(asked: Option<u32>) -> u64 {
        asked.map_or(DEFAULT_WINDOW, |n| u64::from(n).clamp(1, MAX_WINDOW))
    }

    /// A session placed at `start` (everything up to it counts as acked and read).
    pub(crate) fn new(start: u64, size: u64) -> Self {
        Self { size: size.max(1), acked: start, read: start, sent: start, full_since: None }
    }

    /// How many sent records may be unacked.
    pub(crate) fn size(&self) -> u64 {
        self.size
    }

    /// The highest offset acked.
    pub(crate) fn acked(&self) -> u64 {
        self.acked
    }

    /// The highest offset read for the subscriber (sent or skipped).
    pub(crate) fn read(&self) -> u64 {
        self.read
    }

    /// The highest offset actually sent.
    pub(crate) fn sent(&self) -> u64 {
        self.sent
    }

    /// Whether more may be sent with the log ending at `last`, and, when the window is
    /// full while records wait, by when the subscriber must ack (the stall clock starts
    /// at the first look that finds it full, `now`).
    pub(crate) fn look(&mut self, last: u64, now: Instant, stall_timeout: std::time::Duration) -> Look {
        let more = self.read < last;
        let can_send = more && self.sent.saturating_sub(self.acked) < self.size;
        if more && !can_send {
            self.full_since.get_or_insert(now);
        } else {
            self.full_since = None;
        }
        Look { can_send, stall_at: self.full_since.map(|t| t + stall_timeout) }
    }

    /// The subscriber acked `cursor`. Answers the cursor to store when the ack counts: one
    /// beyond what was read is taken as acking what was read, one below the current ack
    /// is stale (`None`). An equal one counts too: the ack of a resync registers a durable
    /// name whose cursor was lost. A counted ack restarts the stall clock.
    pub(crate) fn ack(&mut self, cursor: u64) -> Option<u64> {
        let cursor = cursor.min(self.read);
        if cursor < self.acked {
            return None;
        }
        self.acked = cursor;
        self.full_since = None;
        Some(cursor)
    }

    /// A record (or a marker) at `offset` was sent.
    pub(crate) fn sent_at(&mut self, offset: u64) {
        self.sent = self.sent.max(offset);
    }

    /// Everything up to `offset` was read for the subscriber.
    pub(crate) fn read_up_to(&mut self, offset: u64) {
        self.read = offset;
    }
}

/// Whether a frame of `frame_bytes` is sent now rather than filled further: past half the
/// message limit, so the next event (at most half of it, see the protocol limits) still
/// fits into a frame the subscriber accepts.
pub(crate) fn frame_full(frame_bytes: usize, max_message_bytes: usize) -> bool {
    frame_bytes > max_message_bytes / 2
}

/// Which records are a subscriber's: those of the clusters it asked for (all when it
/// named none) that its access grant covers; `*` markers always.
#[derive(Debug, Clone)]
pub(crate) struct Filter {
    /// The clusters asked for (empty: all).
    pub(crate) clusters: Vec<String>,
    /// What the access policy grants (`None`: no policy, everything).
    pub(crate) grant: Option<Arc<Grant>>,
}

impl Filter {
    /// Whether a record of `cluster` is for this subscriber; `allows` says whether a grant
    /// covers a cluster now (its globs, or the labels of the cluster's Runtime).
    pub(crate) fn wants(&self, cluster: &str, allows: impl FnOnce(&Grant, &str) -> bool) -> bool {
        if cluster == ALL_CLUSTERS {
            return true;
        }
        if let Some(g) = &self.grant
            && !allows(g, cluster)
        {
            return false;
        }
        self.clusters.is_empty() || self.clusters.iter().any(|c| c == cluster)
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    const STREAM: &str = "s-2";
    const LOST: &str = "the hub's log was replaced";

    fn asked(resume: Option<(&'static str, u64)>) -> Asked<'static> {
        Asked { resume, stream: STREAM, lost_history: LOST }
    }

    #[test]
    fn a_resume_point_in_the_same_stream_continues_after_it_or_the_stored_cursor() {
        let s = start(asked(Some((STREAM, 40))), StoredCursor::None, || unreachable!(), || 100);
        assert_eq!(s, Start { cursor: 40, resync_all: None, register: true });
        // Another session of the durable name got further: no record comes twice.
        let s = start(asked(Some((STREAM, 40))), StoredCursor::Known(55), || unreachable!(), || 100);
        assert_eq!(s.cursor, 55);
        let s = start(asked(Some((STREAM, 60))), StoredCursor::Known(55), || unreachable!(), || 100);
        assert_eq!(s.cursor, 60);
    }

    #[test]
    fn a_resume_point_past_the_end_is_not_taken_and_the_subscriber_reconciles() {
        let s = start(asked(Some((STREAM, 120))), StoredCursor::None, || 0, || 100);
        assert_eq!(s.cursor, 100, "placed at the end, not beyond it");
        let why = s.resync_all.expect("records it had were lost");
        assert!(why.contains("cursor 120 is beyond the end of the hub's log (100)"), "{why}");
        // A stored cursor past the end likewise.
        let s = start(asked(None), StoredCursor::Known(300), || 0, || 100);
        assert_eq!((s.cursor, s.resync_all.is_some()), (100, true));
    }

    #[test]
    fn a_resume_point_from_another_stream_falls_back_and_reconciles() {
        let s = start(asked(Some(("s-1", 40))), StoredCursor::None, || 7, || 100);
        assert_eq!(s, Start { cursor: 7, resync_all: Some(LOST.into()), register: true });
        let s = start(asked(Some(("s-1", 40))), StoredCursor::Known(30), || unreachable!(), || 100);
        assert_eq!((s.cursor, s.resync_all.as_deref()), (30, Some(LOST)));
    }

    #[test]
    fn a_lost_cursor_reconciles_and_is_registered_only_at_the_first_ack() {
        let s = start(asked(None), StoredCursor::Lost("cursor store lost".into()), || 12, || 100);
        assert_eq!(s, Start { cursor: 12, resync_all: Some("cursor store lost".into()), register: false });
        let s = start(asked(None), StoredCursor::None, || 12, || 100);
        assert_eq!(s, Start { cursor: 12, resync_all: None, register: true });
    }

    #[test]
    fn the_window_stops_sending_at_its_bound_and_opens_with_acks() {
        let now = Instant::now();
        let stall = Duration::from_secs(30);
        let mut w = Window::new(10, 3);
        assert_eq!(w.look(10, now, stall), Look { can_send: false, stall_at: None }, "nothing to send");
        assert!(w.look(50, now, stall).can_send);
        w.sent_at(13);
        w.read_up_to(13);
        // 3 sent and unacked of a window of 3: full while records wait.
        let look = w.look(50, now, stall);
        assert_eq!(look, Look { can_send: false, stall_at: Some(now + stall) });
        // The stall clock keeps its start across looks.
        assert_eq!(w.look(50, now + Duration::from_secs(5), stall).stall_at, Some(now + stall));
        assert_eq!(w.ack(11), Some(11));
        assert_eq!(w.look(50, now + Duration::from_secs(6), stall), Look { can_send: true, stall_at: None });
    }

    #[test]
    fn records_the_filter_skips_do_not_fill_the_window() {
        let now = Instant::now();
        let mut w = Window::new(0, 10);
        // 500 records read, the last one sent at offset 3: the window (counted in offsets
        // from the ack to the last one sent) still has room.
        w.sent_at(3);
        w.read_up_to(500);
        assert!(w.look(900, now, Duration::from_secs(1)).can_send);
        // Sent up to 10 of a window of 10: full, however many were skipped.
        w.sent_at(10);
        assert!(!w.look(900, now, Duration::from_secs(1)).can_send);
    }

    #[test]
    fn acks_beyond_what_was_read_are_capped_and_stale_ones_ignored() {
        let mut w = Window::new(5, 10);
        w.read_up_to(20);
        w.sent_at(20);
        assert_eq!(w.ack(1_000), Some(20), "never acks past what was read");
        assert_eq!(w.ack(15), None, "below the ack: stale");
        assert_eq!(w.acked(), 20);
        assert_eq!(w.ack(20), Some(20), "an equal ack counts (it registers a lost name)");
    }

    #[test]
    fn the_window_asked_for_is_bounded() {
        assert_eq!(Window::size_for(None), DEFAULT_WINDOW);
        assert_eq!(Window::size_for(Some(0)), 1);
        assert_eq!(Window::size_for(Some(u32::MAX)), MAX_WINDOW);
        assert_eq!(Window::size_for(Some(64)), 64);
    }

    #[test]
    fn a_frame_goes_out_before_the_next_event_could_overflow_it() {
        assert!(!frame_full(500, 1000));
        assert!(frame_full(501, 1000));
    }

    #[test]
    fn the_filter_takes_asked_and_granted_clusters_and_every_all_marker() {
        let f = Filter { clusters: vec!["a".into(), "b".into()], grant: None };
        let deny_all = |_: &Grant, _: &str| false;
        assert!(f.wants("a", deny_all), "no grant: the asked clusters");
        assert!(!f.wants("c", deny_all));
        assert!(f.wants(ALL_CLUSTERS, deny_all));
        let all = Filter { clusters: Vec::new(), grant: None };
        assert!(all.wants("zz", deny_all), "nothing asked: every cluster");
    }

    #[test]
    fn the_grant_narrows_what_was_asked() {
        let policy = crate::policy::access::AccessPolicy::parse(
            "subscribers:\n  - name: ops\n    clusters: ['prod-*']\n",
            std::path::Path::new("policy.yaml"),
            false,
        )
        .expect("policy");
        let g = policy.grant("ops").expect("ops is granted");
        let f = Filter { clusters: Vec::new(), grant: Some(g) };
        let by_globs = |g: &Grant, c: &str| g.allows_cluster(c, None);
        assert!(f.wants("prod-1", by_globs));
        assert!(!f.wants("dev-1", by_globs), "asked for everything, granted prod only");
        assert!(f.wants(ALL_CLUSTERS, by_globs));
    }
}
