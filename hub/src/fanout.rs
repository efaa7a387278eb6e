//! Fan-out progress: where each subscriber session is in the bus, owned by the fan-out
//! side (the sessions of [`crate::session::subscriber`] publish it) and read by the agent
//! sessions, which let delivery catch up before they hand the bus more (see
//! `session::agent::Session::yield_to_fanout`), by the lag metrics and by
//! `/api/v1/subscriptions`. An agent session waits on a [`Notify`] woken by every move, not
//! by polling.
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

// tokio's clock: the simulation runs sessions on simulated time.
use tokio::sync::Notify;
use tokio::time::Instant;

/// One subscriber session's position, updated by the session (see [`FanOut::publish`]),
/// read by the agent sessions (see [`FanOut::wait_for_fanout`]) and at scrape time.
#[derive(Debug, Default)]
pub(crate) struct SubscriberProgress {
    /// The subscriber's name (from its certificate).
    pub(crate) name: String,
    /// Its durable subscription name, or `-`.
    pub(crate) durable: String,
    /// The highest offset it acked.
    pub(crate) acked: AtomicU64,
    /// The highest offset read for it (sent, or skipped by its filter).
    pub(crate) sent: AtomicU64,
    /// The highest offset actually sent to it.
    pub(crate) delivered: AtomicU64,
    /// Its window: how many sent records it may leave unacked.
    pub(crate) window: AtomicU64,
}

impl SubscriberProgress {
    /// Records not yet acked that concern it: read but unacked, plus not read yet up to
    /// `last_offset`; and the offset of the oldest of them (for its age), if any.
    pub(crate) fn lag(&self, last_offset: u64) -> (u64, Option<u64>) {
        let acked = self.acked.load(Ordering::Relaxed);
        let sent = self.sent.load(Ordering::Relaxed);
        let delivered = self.delivered.load(Ordering::Relaxed);
        let unacked = delivered.saturating_sub(acked);
        let unread = last_offset.saturating_sub(sent);
        let oldest = if unacked > 0 {
            Some(acked + 1)
        } else if unread > 0 {
            Some(sent + 1)
        } else {
            None
        };
        (unacked + unread, oldest)
    }
}

/// Most durable subscriptions remembered after their session ended (the oldest are
/// forgotten first).
pub(crate) const DEPARTED_DURABLES: usize = 1024;

/// The subscriber sessions open now with their positions (for ingest, which lets delivery
/// catch up, and the lag metrics), and the durable subscriptions whose session ended since
/// the hub started (for `/api/v1/subscriptions`).
#[derive(Debug, Default)]
pub(crate) struct FanOut {
    sessions: Mutex<HashMap<u64, Arc<SubscriberProgress>>>,
    /// (subscriber, durable name) → (acked cursor, when its session ended).
    departed: Mutex<HashMap<(String, String), (u64, jiff::Timestamp)>>,
    /// Woken whenever a session moves on or leaves: what ingest waits on.
    moved: Notify,
}

/// One subscription as `/api/v1/subscriptions` shows it.
#[derive(Debug, Clone, serde::Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Subscription {
    /// The subscriber's name (from its certificate).
    pub(crate) subscriber: String,
    /// Its durable name, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) durable: Option<String>,
    /// Whether a session is open.
    pub(crate) connected: bool,
    /// The highest offset it acked.
    pub(crate) cursor: u64,
    /// Records it has not acked yet (read but unacked, plus not read yet).
    pub(crate) lag_records: u64,
    /// Age of the oldest of them, in seconds.
    pub(crate) lag_seconds: f64,
    /// When its session ended (disconnected durable subscriptions).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) disconnected_at: Option<jiff::Timestamp>,
    /// The offset of its oldest unacked record (for the age), not shown.
    #[serde(skip)]
    pub(crate) oldest: Option<u64>,
}

/// A subscriber's entry on the fan-out board; dropping it removes the entry.
pub(crate) struct BoardEntry<'a> {
    board: &'a FanOut,
    id: u64,
    /// The position to update.
    pub(crate) progress: Arc<SubscriberProgress>,
}

impl Drop for BoardEntry<'_> {
    fn drop(&mut self) {
        if let Ok(mut s) = self.board.sessions.lock() {
            s.remove(&self.id);
        }
        // A session gone may have been the one ingest waits for.
        self.board.moved.notify_waiters();
        let p = &self.progress;
        if p.durable != "-"
            && let Ok(mut d) = self.board.departed.lock()
        {
            if d.len() >= DEPARTED_DURABLES
                && let Some(oldest) = d.iter().min_by_key(|(_, (_, at))| *at).map(|(k, _)| k.clone())
            {
                d.remove(&oldest);
            }
            let acked = p.acked.load(Ordering::Relaxed);
            d.insert((p.name.clone(), p.durable.clone()), (acked, jiff::Timestamp::now()));
        }
    }
}

impl FanOut {
    /// Puts a session on the board for as long as the entry lives.
    pub(crate) fn join(&self, name: &str, durable: Option<&str>) -> BoardEntry<'_> {
        let progress = Arc::new(SubscriberProgress {
            name: name.into(),
            durable: durable.unwrap_or("-").into(),
            ..Default::default()
        });
        let id = rand::random::<u64>();
        if let Ok(mut s) = self.sessions.lock() {
            s.insert(id, progress.clone());
        }
        if let Some(durable) = durable
            && let Ok(mut d) = self.departed.lock()
        {
            d.remove(&(name.to_string(), durable.to_string()));
        }
        BoardEntry { board: self, id, progress }
    }

    /// Every open session, then every durable subscription whose session ended, sorted
    /// by subscriber and durable name; `lag_seconds` is left 0 (the caller reads the
    /// oldest record's time from the bus).
    pub(crate) fn subscriptions(&self, last_offset: u64) -> Vec<Subscription> {
        let mut out: Vec<Subscription> = self
            .all()
            .iter()
            .map(|p| {
                let (lag_records, oldest) = p.lag(last_offset);
                Subscription {
                    subscriber: p.name.clone(),
                    durable: (p.durable != "-").then(|| p.durable.clone()),
                    connected: true,
                    cursor: p.acked.load(Ordering::Relaxed),
                    lag_records,
                    lag_seconds: 0.0,
                    disconnected_at: None,
                    oldest,
                }
            })
            .collect();
        if let Ok(d) = self.departed.lock() {
            for ((name, durable), (acked, at)) in d.iter() {
                let lag_records = last_offset.saturating_sub(*acked);
                out.push(Subscription {
                    subscriber: name.clone(),
                    durable: Some(durable.clone()),
                    connected: false,
                    cursor: *acked,
                    lag_records,
                    lag_seconds: 0.0,
                    disconnected_at: Some(*at),
                    oldest: (lag_records > 0).then_some(acked + 1),
                });
            }
        }
        out.sort_by(|a, b| (&a.subscriber, &a.durable, !a.connected).cmp(&(&b.subscriber, &b.durable, !b.connected)));
        out
    }

    /// Whether some open session is more than `lag` records behind `last_offset` while its
    /// window has room: the hub, not the subscriber, is what holds it back.
    pub(crate) fn hub_behind(&self, last_offset: u64, lag: u64) -> bool {
        let Ok(s) = self.sessions.lock() else { return false };
        s.values().any(|p| {
            let sent = p.sent.load(Ordering::Relaxed);
            let unacked = p.delivered.load(Ordering::Relaxed).saturating_sub(p.acked.load(Ordering::Relaxed));
            last_offset.saturating_sub(sent) > lag && unacked < p.window.load(Ordering::Relaxed)
        })
    }

    /// Shows where a session is: what it acked, read (sent or skipped by its filter) and
    /// sent. Wakes ingest waiting in [`FanOut::wait_for_fanout`].
    pub(crate) fn publish(&self, progress: &SubscriberProgress, acked: u64, sent: u64, delivered: u64) {
        progress.acked.store(acked, Ordering::Relaxed);
        progress.sent.store(sent, Ordering::Relaxed);
        progress.delivered.store(delivered.max(acked), Ordering::Relaxed);
        self.moved.notify_waiters();
    }

    /// Waits while the hub itself holds delivery back (see [`FanOut::hub_behind`]; the end
    /// of the log is read again at each look), at most `max`. Woken by every move of a
    /// session and every session leaving, never by polling.
    pub(crate) async fn wait_for_fanout(&self, last_offset: impl Fn() -> u64, lag: u64, max: Duration) {
        if !self.hub_behind(last_offset(), lag) {
            return;
        }
        let deadline = Instant::now() + max;
        loop {
            // Registered before the look, so a move between the look and the wait wakes it.
            let moved = self.moved.notified();
            tokio::pin!(moved);
            moved.as_mut().enable();
            if !self.hub_behind(last_offset(), lag) {
                return;
            }
            if tokio::time::timeout_at(deadline, moved).await.is_err() {
                return;
            }
        }
    }

    /// Every open session's position.
    pub(crate) fn all(&self) -> Vec<Arc<SubscriberProgress>> {
        self.sessions.lock().map(|s| s.values().cloned().collect()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hub_is_behind_only_for_a_subscriber_with_room_that_waits_for_it() {
        let board = FanOut::default();
        assert!(!board.hub_behind(1_000_000, 10), "no subscriber: nothing to wait for");
        let entry = board.join("s", None);
        let p = &entry.progress;
        p.window.store(100, Ordering::Relaxed);
        p.sent.store(50, Ordering::Relaxed);
        p.delivered.store(50, Ordering::Relaxed);
        assert!(board.hub_behind(100, 10), "50 records unread, 50 of 100 in flight");
        assert!(!board.hub_behind(55, 10), "only 5 unread");
        // Its window is full: the subscriber, not the hub, holds it back.
        p.sent.store(120, Ordering::Relaxed);
        p.delivered.store(120, Ordering::Relaxed);
        p.acked.store(20, Ordering::Relaxed);
        assert!(!board.hub_behind(1_000, 10));
        p.acked.store(21, Ordering::Relaxed);
        assert!(board.hub_behind(1_000, 10));
        drop(entry);
        assert!(!board.hub_behind(1_000, 10), "gone from the board");
    }

    #[test]
    fn durable_subscriptions_are_remembered_after_their_session_ends() {
        let board = FanOut::default();
        let a = board.join("ops", Some("d1"));
        a.progress.acked.store(5, Ordering::Relaxed);
        a.progress.sent.store(5, Ordering::Relaxed);
        a.progress.delivered.store(5, Ordering::Relaxed);
        let b = board.join("tail", None);
        let subs = board.subscriptions(8);
        assert_eq!(subs.len(), 2);
        assert!(subs.iter().all(|s| s.connected));
        assert_eq!(
            (subs[0].subscriber.as_str(), subs[0].durable.as_deref(), subs[0].lag_records),
            ("ops", Some("d1"), 3)
        );
        drop(a);
        drop(b);
        // The durable one stays listed, disconnected, with its cursor; the other is gone.
        let subs = board.subscriptions(10);
        assert_eq!(subs.len(), 1);
        assert_eq!((subs[0].connected, subs[0].cursor, subs[0].lag_records, subs[0].oldest), (false, 5, 5, Some(6)));
        assert!(subs[0].disconnected_at.is_some());
        // Back: connected again, listed once.
        let _again = board.join("ops", Some("d1"));
        let subs = board.subscriptions(10);
        assert_eq!(subs.len(), 1);
        assert!(subs[0].connected);
    }

    #[test]
    fn departed_durables_are_bounded() {
        let board = FanOut::default();
        for i in 0..DEPARTED_DURABLES + 10 {
            drop(board.join("s", Some(&format!("d{i}"))));
        }
        assert_eq!(board.subscriptions(0).len(), DEPARTED_DURABLES);
    }

    #[test]
    fn lag_counts_unacked_and_unread_records() {
        let p = SubscriberProgress::default();
        assert_eq!(p.lag(0), (0, None));
        p.sent.store(10, Ordering::Relaxed);
        p.delivered.store(10, Ordering::Relaxed);
        p.acked.store(7, Ordering::Relaxed);
        assert_eq!(p.lag(15), (3 + 5, Some(8)));
        p.acked.store(10, Ordering::Relaxed);
        assert_eq!(p.lag(15), (5, Some(11)));
        // Records its filter skipped were read for it: they are not lag.
        p.sent.store(15, Ordering::Relaxed);
        assert_eq!(p.lag(15), (0, None));
    }

    /// A fan-out with one session that has room in its window and is `behind` records
    /// behind an end of 1,000.
    fn lagging(board: &FanOut, behind: u64) -> BoardEntry<'_> {
        let entry = board.join("s", None);
        entry.progress.window.store(10_000, Ordering::Relaxed);
        board.publish(&entry.progress, 0, 1_000 - behind, 1_000 - behind);
        entry
    }

    #[tokio::test(start_paused = true)]
    async fn ingest_goes_on_at_once_when_the_fanout_keeps_up() {
        let board = FanOut::default();
        let _entry = lagging(&board, 5);
        let started = Instant::now();
        board.wait_for_fanout(|| 1_000, 10, Duration::from_millis(20)).await;
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn ingest_waits_until_a_session_moves_on_and_is_woken_by_it() {
        let board = Arc::new(FanOut::default());
        let entry = lagging(&board, 500);
        let progress = entry.progress.clone();
        let started = Instant::now();
        let waiter = tokio::spawn({
            let board = board.clone();
            async move { board.wait_for_fanout(|| 1_000, 10, Duration::from_secs(3600)).await }
        });
        // Still behind after a move that is not far enough: it keeps waiting.
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        board.publish(&progress, 0, 900, 900);
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished(), "100 records behind, over the lag of 10");
        board.publish(&progress, 0, 995, 995);
        waiter.await.expect("waiter");
        // Woken by the move itself: the paused clock never advanced to a poll or the bound.
        assert_eq!(started.elapsed(), Duration::ZERO);
        drop(entry);
    }

    #[tokio::test(start_paused = true)]
    async fn a_session_leaving_wakes_ingest() {
        let board = Arc::new(FanOut::default());
        let started = Instant::now();
        let entry = lagging(&board, 500);
        let waiter = tokio::spawn({
            let board = board.clone();
            async move { board.wait_for_fanout(|| 1_000, 10, Duration::from_secs(3600)).await }
        });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!waiter.is_finished());
        drop(entry);
        waiter.await.expect("waiter");
        assert_eq!(started.elapsed(), Duration::ZERO);
    }

    #[tokio::test(start_paused = true)]
    async fn ingest_waits_no_longer_than_its_bound_for_a_fanout_that_stays_behind() {
        let board = FanOut::default();
        let _entry = lagging(&board, 500);
        let started = Instant::now();
        board.wait_for_fanout(|| 1_000, 10, Duration::from_millis(20)).await;
        // The paused clock moved to the bound (the timer wheel's millisecond), not past it.
        let waited = started.elapsed();
        assert!(waited >= Duration::from_millis(20) && waited <= Duration::from_millis(21), "{waited:?}");
    }
}
