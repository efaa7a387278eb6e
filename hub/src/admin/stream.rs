//! The live overview stream (`/api/v1/overview/stream`, server-sent events) at any fleet
//! size: a follower gets the overview's counts (`event: snapshot`), then changes
//! (`event: delta`): the counts when they changed and each cluster whose state (connected,
//! failing watches, modules not ready, replica) changed, or `removed`. Per-cluster
//! counters (events, rates) are not sent: at 50,000 clusters they change every second for
//! all of them. Lists are read page by page from the list endpoints (`crate::admin::list`).
//!
//! One task computes the changes for everyone ([`Tracker`]) and broadcasts them; each
//! follower coalesces what it has not sent yet ([`Pending`]: the newest state per cluster)
//! and sends at most [`FOLLOWER_BYTES_PER_SEC`] ([`Bucket`]). When a follower falls too far
//! behind (more than [`MAX_PENDING`] clusters changed, a delta larger than the burst, or
//! the broadcast overran it), its pending changes are dropped and it gets a new snapshot
//! with `"resnapshot": true`: its lists are stale and must be read again. So a follower's
//! memory and bandwidth are bounded whatever the fleet does.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Bytes per second one follower is sent at most (and its burst).
pub(crate) const FOLLOWER_BYTES_PER_SEC: usize = 64 << 10;
/// Most clusters with a change waiting for one follower; past it, a resnapshot.
pub(crate) const MAX_PENDING: usize = 500;
/// Deltas the broadcast keeps for slow followers (past it they resnapshot).
pub(crate) const BROADCAST_DEPTH: usize = 32;

/// A cluster's state as the stream follows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterState {
    /// Whether its agent is connected.
    pub(crate) connected: bool,
    /// Watches failing.
    pub(crate) watches_failed: usize,
    /// Modules not ready (the agent's inventory, or its Runtime's modules).
    pub(crate) modules_not_ready: usize,
    /// The replica it is connected to (shared bus).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hub: Option<String>,
}

impl ClusterState {
    /// 0 disconnected, 1 failing watches, 2 modules not ready, 3 fine: the order of
    /// `order=problems`.
    pub(crate) fn rank(&self) -> u8 {
        if !self.connected {
            0
        } else if self.watches_failed > 0 {
            1
        } else if self.modules_not_ready > 0 {
            2
        } else {
            3
        }
    }
}

/// The overview's counts.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Counts {
    /// Whether the hub answers ready.
    pub(crate) ready: bool,
    /// Clusters known.
    pub(crate) clusters: usize,
    /// Of which connected.
    pub(crate) connected: usize,
    /// Of which not connected.
    pub(crate) disconnected: usize,
    /// Connected clusters with failing watches.
    pub(crate) watches_failing: usize,
    /// Connected clusters with modules not ready.
    pub(crate) modules_not_ready: usize,
    /// Events per second accepted by the hub(s) over the last interval.
    pub(crate) events_per_sec: f64,
    /// Runtimes the hub reads.
    pub(crate) runtimes: usize,
    /// Runtimes not `Ready`.
    pub(crate) runtimes_not_ready: usize,
    /// Changes of the Runtimes view seen (a follower reads its Runtimes page again).
    pub(crate) runtimes_version: u64,
    /// Subscriptions known.
    pub(crate) subscriptions: usize,
    /// Subscriptions with records not acked.
    pub(crate) subscriptions_lagging: usize,
    /// WatchConfigs refused.
    pub(crate) watch_configs_refused: usize,
}

/// One change of a cluster: its new state, or `removed`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Change {
    /// The cluster id.
    pub(crate) cluster: String,
    /// Its new state.
    #[serde(flatten)]
    pub(crate) state: Option<ClusterState>,
    /// The hub no longer lists it.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) removed: bool,
}

/// What changed between two rounds.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub(crate) struct Delta {
    /// Round number (increases by one per delta).
    pub(crate) seq: u64,
    /// The counts now.
    pub(crate) counts: Counts,
    /// Clusters whose state changed, by id.
    pub(crate) changes: Vec<Change>,
}

/// The state of every cluster last round, to compute the next delta.
#[derive(Debug, Default)]
pub(crate) struct Tracker {
    last: HashMap<String, ClusterState>,
    counts: Option<Counts>,
    seq: u64,
}

impl Tracker {
    /// The delta from the last round to `now` (`None`: nothing changed). The first round
    /// only learns the states (its delta has the counts alone): a follower read the lists
    /// after its snapshot, so resending every cluster would say nothing new.
    pub(crate) fn update(&mut self, now: HashMap<String, ClusterState>, counts: Counts) -> Option<Delta> {
        if self.counts.is_none() {
            self.last = now;
            self.counts = Some(counts.clone());
            self.seq += 1;
            return Some(Delta { seq: self.seq, counts, changes: Vec::new() });
        }
        let mut changes: Vec<Change> = now
            .iter()
            .filter(|(id, s)| self.last.get(*id) != Some(*s))
            .map(|(id, s)| Change { cluster: id.clone(), state: Some(s.clone()), removed: false })
            .collect();
        changes.extend(self.last.keys().filter(|id| !now.contains_key(*id)).map(|id| Change {
            cluster: id.clone(),
            state: None,
            removed: true,
        }));
        changes.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        self.last = now;
        if changes.is_empty() && self.counts.as_ref() == Some(&counts) {
            return None;
        }
        self.counts = Some(counts.clone());
        self.seq += 1;
        Some(Delta { seq: self.seq, counts, changes })
    }

    /// Whether no round was made yet (the next one only learns the states).
    pub(crate) fn is_fresh(&self) -> bool {
        self.counts.is_none()
    }

    /// The events per second of the last counts sent.
    pub(crate) fn events_per_sec(&self) -> f64 {
        self.counts.as_ref().map_or(0.0, |c| c.events_per_sec)
    }
}

/// One event for a follower: its SSE name and JSON data.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Out {
    /// `snapshot` or `delta`.
    pub(crate) event: &'static str,
    /// The JSON document.
    pub(crate) data: String,
}

/// A snapshot event: the counts, and whether it replaces changes that were dropped.
pub(crate) fn snapshot(counts: &Counts, seq: u64, resnapshot: bool) -> Out {
    let data = serde_json::json!({ "seq": seq, "counts": counts, "resnapshot": resnapshot }).to_string();
    Out { event: "snapshot", data }
}

/// What one follower has not been sent yet: the newest counts and the newest state of each
/// changed cluster, at most [`MAX_PENDING`] of them.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    counts: Option<Counts>,
    changes: BTreeMap<String, Change>,
    seq: u64,
    overflow: bool,
}

impl Pending {
    /// Takes in a broadcast delta.
    pub(crate) fn add(&mut self, d: &Delta) {
        self.counts = Some(d.counts.clone());
        self.seq = d.seq;
        if self.overflow {
            return;
        }
        for c in &d.changes {
            self.changes.insert(c.cluster.clone(), c.clone());
        }
        if self.changes.len() > MAX_PENDING {
            self.overflowed();
        }
    }

    /// The follower missed deltas (or has too many waiting): its next event is a resnapshot.
    pub(crate) fn overflowed(&mut self) {
        self.overflow = true;
        self.changes.clear();
    }

    /// Whether something waits.
    pub(crate) fn is_empty(&self) -> bool {
        self.counts.is_none() && !self.overflow
    }

    /// The next event, if something waits: a delta, or a resnapshot when changes were
    /// dropped or the delta would be larger than `max_bytes`. Nothing is taken out.
    pub(crate) fn render(&self, max_bytes: usize) -> Option<Out> {
        let counts = self.counts.as_ref()?;
        if !self.overflow {
            let changes: Vec<&Change> = self.changes.values().collect();
            let data = serde_json::json!({ "seq": self.seq, "counts": counts, "changes": changes }).to_string();
            if data.len() <= max_bytes {
                return Some(Out { event: "delta", data });
            }
        }
        Some(snapshot(counts, self.seq, true))
    }

    /// [`Self::render`], and nothing waits any more.
    pub(crate) fn take(&mut self, max_bytes: usize) -> Option<Out> {
        let out = self.render(max_bytes)?;
        *self = Pending { seq: self.seq, ..Default::default() };
        Some(out)
    }
}

/// A token bucket of bytes.
#[derive(Debug)]
pub(crate) struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    /// Full, refilling at `per_sec` bytes a second up to `per_sec`.
    pub(crate) fn new(per_sec: usize, now: Instant) -> Self {
        Self { rate: per_sec as f64, burst: per_sec as f64, tokens: per_sec as f64, at: now }
    }

    /// The most bytes one event may have (the burst).
    pub(crate) fn burst(&self) -> usize {
        self.burst as usize
    }

    fn refill(&mut self, now: Instant) {
        let dt = now.saturating_duration_since(self.at).as_secs_f64();
        self.tokens = (self.tokens + dt * self.rate).min(self.burst);
        self.at = now;
    }

    /// How long until `bytes` may be sent (zero: now).
    pub(crate) fn wait(&mut self, bytes: usize, now: Instant) -> Duration {
        self.refill(now);
        let missing = bytes as f64 - self.tokens;
        if missing <= 0.0 { Duration::ZERO } else { Duration::from_secs_f64(missing / self.rate) }
    }

    /// Spends `bytes` (after [`Self::wait`] said zero).
    pub(crate) fn spend(&mut self, bytes: usize) {
        self.tokens -= bytes as f64;
    }
}

/// One follower: the broadcast it reads, what it has not been sent, its byte budget.
pub(crate) struct Follower {
    rx: tokio::sync::broadcast::Receiver<std::sync::Arc<Delta>>,
    pending: Pending,
    bucket: Bucket,
    first: Option<Out>,
}

impl Follower {
    /// A follower whose first event is `first` (a snapshot).
    pub(crate) fn new(rx: tokio::sync::broadcast::Receiver<std::sync::Arc<Delta>>, first: Out) -> Self {
        Self {
            rx,
            pending: Pending::default(),
            bucket: Bucket::new(FOLLOWER_BYTES_PER_SEC, Instant::now()),
            first: Some(first),
        }
    }

    /// The next event to send, within the byte budget (`None`: the hub is stopping).
    pub(crate) async fn next(&mut self) -> Option<Out> {
        use tokio::sync::broadcast::error::RecvError;
        if let Some(first) = self.first.take() {
            self.bucket.spend(first.data.len());
            return Some(first);
        }
        let mut ready_at: Option<Instant> = None;
        loop {
            tokio::select! {
                r = self.rx.recv() => match r {
                    Ok(d) => self.pending.add(&d),
                    Err(RecvError::Lagged(_)) => self.pending.overflowed(),
                    Err(RecvError::Closed) => return None,
                },
                _ = tokio::time::sleep_until(ready_at.unwrap_or_else(Instant::now)), if ready_at.is_some() => {}
            }
            if self.pending.is_empty() {
                continue;
            }
            // Sized as it would be sent now: wait until the budget allows it, taking in
            // (coalescing) whatever arrives meanwhile.
            let now = Instant::now();
            let Some(out) = self.pending.render(self.bucket.burst()) else { continue };
            let wait = self.bucket.wait(out.data.len(), now);
            if wait.is_zero() {
                self.pending.take(self.bucket.burst());
                self.bucket.spend(out.data.len());
                return Some(out);
            }
            ready_at = Some(now + wait);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state(connected: bool) -> ClusterState {
        ClusterState { connected, watches_failed: 0, modules_not_ready: 0, hub: None }
    }

    fn fleet(n: usize, down: &[usize]) -> HashMap<String, ClusterState> {
        (0..n).map(|i| (format!("c-{i}"), state(!down.contains(&i)))).collect()
    }

    #[test]
    fn the_tracker_sends_only_what_changed() {
        let mut t = Tracker::default();
        let first = t.update(fleet(3, &[]), Counts { clusters: 3, ..Default::default() }).unwrap();
        assert_eq!((first.seq, first.changes.len()), (1, 0), "the first round learns the states");
        assert_eq!(t.update(fleet(3, &[]), Counts { clusters: 3, ..Default::default() }), None, "no change, no delta");
        let mut now = fleet(3, &[1]);
        now.remove("c-2");
        let d = t.update(now, Counts { clusters: 2, ..Default::default() }).unwrap();
        assert_eq!(d.seq, 2);
        assert_eq!(
            serde_json::to_value(&d.changes).unwrap(),
            serde_json::json!([
                {"cluster": "c-1", "connected": false, "watchesFailed": 0, "modulesNotReady": 0},
                {"cluster": "c-2", "removed": true}
            ])
        );
        // Counts alone changing is a delta without changes.
        let d = t.update(fleet(2, &[1]), Counts { clusters: 2, events_per_sec: 5.0, ..Default::default() }).unwrap();
        assert!(d.changes.is_empty());
    }

    #[test]
    fn a_follower_coalesces_and_resnapshots_when_too_far_behind() {
        let mut t = Tracker::default();
        let mut p = Pending::default();
        p.add(&t.update(HashMap::new(), Counts::default()).unwrap());
        p.add(&t.update(fleet(3, &[0]), Counts { connected: 2, ..Default::default() }).unwrap());
        p.add(&t.update(fleet(3, &[]), Counts { connected: 3, ..Default::default() }).unwrap());
        let out = p.take(1 << 20).unwrap();
        assert_eq!(out.event, "delta");
        let doc: serde_json::Value = serde_json::from_str(&out.data).unwrap();
        // Three deltas, one event: the newest counts and one entry per cluster.
        assert_eq!((doc["seq"].clone(), doc["counts"]["connected"].clone()), (3.into(), 3.into()));
        assert_eq!(doc["changes"].as_array().unwrap().len(), 3);
        assert_eq!(
            doc["changes"][0],
            serde_json::json!({"cluster": "c-0", "connected": true, "watchesFailed": 0, "modulesNotReady": 0})
        );
        assert!(p.take(1 << 20).is_none(), "nothing left");

        // Over MAX_PENDING clusters changed: dropped, one resnapshot (small) instead.
        let mut t = Tracker::default();
        t.update(HashMap::new(), Counts::default());
        p.add(&t.update(fleet(MAX_PENDING + 1, &[]), Counts::default()).unwrap());
        let out = p.take(1 << 20).unwrap();
        assert_eq!(out.event, "snapshot");
        assert!(out.data.contains("\"resnapshot\":true") && out.data.len() < 1024, "{}", out.data);
        // A delta larger than the byte budget allows: a resnapshot too.
        p.add(&t.update(fleet(MAX_PENDING + 1, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]), Counts::default()).unwrap());
        let out = p.take(200).unwrap();
        assert_eq!(out.event, "snapshot");
        // Missed broadcasts: a resnapshot.
        p.add(&t.update(fleet(MAX_PENDING + 1, &[1]), Counts::default()).unwrap());
        p.overflowed();
        assert_eq!(p.take(1 << 20).unwrap().event, "snapshot");
    }

    #[test]
    fn the_bucket_bounds_bytes_per_second() {
        let t0 = Instant::now();
        let mut b = Bucket::new(1000, t0);
        assert_eq!(b.wait(1000, t0), Duration::ZERO);
        b.spend(1000);
        assert_eq!(b.wait(500, t0), Duration::from_millis(500));
        assert_eq!(b.wait(500, t0 + Duration::from_millis(500)), Duration::ZERO);
        // Idle time refills only up to the burst.
        b.spend(500);
        assert_eq!(b.wait(1000, t0 + Duration::from_secs(60)), Duration::ZERO);
        assert!(b.wait(1001, t0 + Duration::from_secs(60)) > Duration::ZERO);
    }

    #[tokio::test]
    async fn a_slow_follower_is_sent_at_most_its_budget() {
        let (tx, rx) = tokio::sync::broadcast::channel(BROADCAST_DEPTH);
        let mut f = Follower::new(rx, snapshot(&Counts::default(), 0, false));
        assert_eq!(f.next().await.unwrap().event, "snapshot");
        let mut t = Tracker::default();
        t.update(HashMap::new(), Counts::default());
        let start = Instant::now();
        let mut sent = 0usize;
        // 60 rounds in 0.6 s in which 100 clusters change each: far more than 64 KiB/s worth
        // (a bound the bucket guarantees, whatever the machine's speed).
        let producer = tokio::spawn(async move {
            for round in 0..60usize {
                let down: Vec<usize> = (0..100).map(|i| (i + round) % 400).collect();
                if let Some(d) = t.update(fleet(400, &down), Counts { clusters: 400, ..Default::default() }) {
                    let _ = tx.send(std::sync::Arc::new(d));
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        });
        while let Some(out) = f.next().await {
            sent += out.data.len();
        }
        producer.await.unwrap();
        let secs = start.elapsed().as_secs_f64();
        // The budget: one burst, then the rate.
        let allowed = FOLLOWER_BYTES_PER_SEC as f64 * (1.0 + secs);
        assert!(sent as f64 <= allowed, "{sent} bytes in {secs} s");
        assert!(sent > 0);
    }
}
