//! Cluster heads: the (epoch, seq, offset) of each cluster's latest record, for agents
//! resuming on any replica, and their key-value bucket `<stream>_heads`.
//!
//! An agent that says hello gets its cluster's head from the stream's last message on the
//! cluster's subject (a direct get, or a share of one sweep in a connect storm: see
//! [`super::head_reads`]; the bucket is read only when the stream holds nothing of the
//! cluster), or the local tail's if later: right after another
//! replica acked a batch and died, this replica's tail may not have the batch yet and the
//! bucket may be a second old, but the stream has it. Appends filter resends by the head
//! this replica knows (its own appends in flight, its acks and its tail); a resend it does
//! not recognise is dropped by JetStream's duplicate window.
//!
//! The bucket is written coalesced ([`Bus::flush`](crate::Bus::flush), once a
//! second), with compare-and-set on the revision this replica wrote last, so a head of a
//! newer format written meanwhile is read, and refused, before it is written over.
//!
//! The bucket matters only once the stream has evicted every record of a cluster (hello,
//! and a tail starting after eviction attributes lost history by it), so a head need not be
//! written as soon as it moves, only well before its record can be evicted. Writing every
//! moved head each second doubled JetStream's writes at 10,000 agents (one head per active
//! cluster per second beside the records) and was the largest term of the bus's latency. So
//! [`HeadPacing`] lets a cluster's head wait up to an eighth of the time the stream takes to
//! evict its newest record at the rate seen (records, bytes and age retention), at most
//! [`HEAD_WRITE_DELAY_MAX`]: a stream turning over in seconds (a small retention, the
//! simulation's) gets its heads written at once, as before.
//!
//! The bucket is also how replicas tell each other of another agent process's records
//! (decision 0037): every replica follows it ([`crate::ReplicaShare::follow_heads`]) and
//! pokes its agent sessions of the cluster of another epoch. For that, a head of another
//! agent process than the one this replica knew is written at the next flush, not paced
//! ([`HeadPacing::hurry`]); a head is never written over a later one (a follower that
//! missed the later write would never see it); and the head of a cluster whose append
//! failed is read back once the link works ([`Uncertain`]), since its records may be stored
//! without this replica knowing.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::time::Instant;

use serde::{Deserialize, Serialize};

use crate::BusError;

use super::jetstream::{JetStream, KeyValue, Stored};
use super::records::{H_FORMAT, head_from_headers, token, untoken};
use super::state::{NATS_FORMAT, newer_format, readable_mark};
use super::{NatsBus, NatsError, lock, state};

/// A cluster's latest record as far as this replica knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Head {
    pub(super) epoch: u64,
    pub(super) seq: u64,
    pub(super) offset: u64,
}

/// A head as the heads bucket keeps it: with its format (releases before it wrote none and
/// ignore it when they read).
#[derive(Serialize)]
struct StoredHead<'a> {
    #[serde(flatten)]
    head: &'a Head,
    format: u32,
}

/// The longest a moved head waits before it is written to the bucket.
pub(super) const HEAD_WRITE_DELAY_MAX: Duration = Duration::from_secs(30);

/// Head writes in flight at once: a flush of thousands of heads must not queue ahead of
/// every record publish on the connection.
const HEAD_WRITES_IN_FLIGHT: usize = 64;

/// How long moved heads may wait before they are written (see the module docs).
#[derive(Debug, Default)]
pub(super) struct HeadPacing {
    /// (when, the stream's last offset then) at the previous flush.
    sample: Option<(Instant, u64)>,
    /// Records per second the stream grew by, decaying slowly: a burst shortens the delay
    /// at once, a lull lengthens it only gradually.
    rate: f64,
    /// Per cluster: when its head was last written, or moved first after that.
    since: HashMap<Arc<str>, Instant>,
    /// Clusters whose moved head is written at the next flush whatever the delay.
    urgent: HashSet<Arc<str>>,
}

impl HeadPacing {
    /// The delay allowed now, given the stream's last offset and its retention; records
    /// of `avg_bytes` on average.
    pub(super) fn delay(
        &mut self,
        now: Instant,
        last: u64,
        retention: &crate::retention::Retention,
        avg_bytes: f64,
    ) -> Duration {
        let Some((then, before)) = self.sample.replace((now, last)) else {
            return Duration::ZERO;
        };
        let secs = now.saturating_duration_since(then).as_secs_f64();
        if secs <= 0.0 {
            return Duration::ZERO;
        }
        let seen = last.saturating_sub(before) as f64 / secs;
        self.rate = seen.max(self.rate * 0.9);
        turnover(self.rate, retention, avg_bytes).map_or(HEAD_WRITE_DELAY_MAX, |t| (t / 8).min(HEAD_WRITE_DELAY_MAX))
    }

    /// Whether `cluster`'s moved head is due: it waited `delay` since its last write (or
    /// since it moved first after that).
    fn due(&mut self, cluster: &Arc<str>, now: Instant, delay: Duration) -> bool {
        let since = *self.since.entry(cluster.clone()).or_insert(now);
        self.urgent.contains(cluster) || now.saturating_duration_since(since) >= delay
    }

    fn written(&mut self, cluster: &Arc<str>, now: Instant) {
        self.since.insert(cluster.clone(), now);
        self.urgent.remove(cluster);
    }

    /// The cluster's moved head is written at the next flush, not paced: it is of another
    /// agent process than the head this replica knew before, or it was read after records
    /// of unknown fate. Replicas holding a session of another process of the cluster learn
    /// of it from the bucket (see [`crate::ReplicaShare::follow_heads`]); this happens when
    /// an agent process starts or two run at once, not on every batch.
    pub(super) fn hurry(&mut self, cluster: &Arc<str>) {
        self.urgent.insert(cluster.clone());
    }
}

/// How long a cluster found without any record stays known so (see [`Absent`]).
pub(super) const ABSENCE_FRESH: Duration = Duration::from_secs(10);

/// Clusters whose head was read just now and found to be none (a hello of a new cluster):
/// the first append after it does not read again. Each is taken by that append, or
/// forgotten after [`ABSENCE_FRESH`].
#[derive(Debug, Default)]
pub(super) struct Absent {
    at: HashMap<Arc<str>, Instant>,
    /// The size after the last pruning: pruned again at twice that (amortised).
    pruned_len: usize,
}

impl Absent {
    pub(super) fn noted(&mut self, cluster: &Arc<str>, now: Instant) {
        self.at.insert(cluster.clone(), now);
        if self.at.len() > (2 * self.pruned_len).max(4096) {
            self.at.retain(|_, t| now.saturating_duration_since(*t) < ABSENCE_FRESH);
            self.pruned_len = self.at.len();
        }
    }

    /// Whether the cluster was found without a record within [`ABSENCE_FRESH`]; takes it.
    pub(super) fn seen_now(&mut self, cluster: &Arc<str>, now: Instant) -> bool {
        self.at.remove(cluster).is_some_and(|t| now.saturating_duration_since(t) < ABSENCE_FRESH)
    }
}

/// How long after an append failed (and after the link to JetStream was last seen down)
/// this replica reads the cluster's head: publishes the client kept while the link was
/// down are sent as soon as it is back, and stored by then.
pub(super) const UNCERTAIN_SETTLE: Duration = super::REQUEST_TIMEOUT;

/// Clusters whose records this replica published without learning whether they were
/// stored: an ack lost or timed out, a publish the client kept while its link was down
/// and sends once it is back. Such records may become their cluster's head unknown to this
/// replica, so no head of theirs would reach the bucket, and a session of another agent
/// process of the cluster on another replica would never learn of them (seed 2928: they
/// may carry older states than that process reported). So once the link has worked for
/// [`UNCERTAIN_SETTLE`] after the failure, the cluster's head is read (one request per
/// cluster and failure, never while idle) and recorded at once.
#[derive(Debug, Default)]
pub(super) struct Uncertain {
    /// Per cluster: when an append of it failed last.
    since: HashMap<Arc<str>, Instant>,
    /// When the link to JetStream was last seen down.
    down: Option<Instant>,
}

impl Uncertain {
    pub(super) fn failed(&mut self, cluster: &Arc<str>, now: Instant) {
        self.since.insert(cluster.clone(), now);
    }

    /// Notes the link's state as seen now.
    pub(super) fn link(&mut self, up: bool, now: Instant) {
        if !up {
            self.down = Some(now);
        }
    }

    /// The clusters whose head is to be read now (with when their append failed), in order.
    pub(super) fn due(&self, now: Instant) -> Vec<(Arc<str>, Instant)> {
        if self.down.is_some_and(|d| now.saturating_duration_since(d) < UNCERTAIN_SETTLE) {
            return Vec::new();
        }
        let mut due: Vec<(Arc<str>, Instant)> = self
            .since
            .iter()
            .filter(|(_, t)| now.saturating_duration_since(**t) >= UNCERTAIN_SETTLE)
            .map(|(c, t)| (c.clone(), *t))
            .collect();
        // In the clusters' order, not the map's: a simulation seed replays exactly.
        due.sort_unstable();
        due
    }

    /// The cluster's head was read after its append that failed at `at` (a later failure
    /// keeps it uncertain).
    pub(super) fn settled(&mut self, cluster: &Arc<str>, at: Instant) {
        if self.since.get(cluster) == Some(&at) {
            self.since.remove(cluster);
        }
    }
}

/// How long the stream takes to evict a record appended now, at `rate` records per
/// second of `avg_bytes`: the shortest of its record, byte and age retention (`None`: never).
fn turnover(rate: f64, retention: &crate::retention::Retention, avg_bytes: f64) -> Option<Duration> {
    let mut secs = f64::INFINITY;
    if rate > 0.0 {
        secs = secs.min(retention.records as f64 / rate).min(retention.bytes as f64 / (rate * avg_bytes.max(1.0)));
    }
    if let Some(age) = retention.age
        && !age.is_zero()
    {
        secs = secs.min(age.as_secs_f64());
    }
    secs.is_finite().then(|| Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX))
}

/// Why a head was not written.
enum HeadWrite {
    /// The bucket holds one of a newer format: not written over (the refusal).
    Newer(String),
    /// The bucket failed, or the value changed meanwhile: tried again at the next flush.
    Failed(String),
}

/// A value of the heads bucket: `Ok(None)` when it is not a head (damaged: as before, the
/// stream and the agents' resyncs stand in for it), `Err` with the format found when a
/// newer release wrote it.
pub(super) fn parse_head(bytes: &[u8]) -> Result<Option<Head>, String> {
    state::readable_value(bytes)?;
    Ok(serde_json::from_slice(bytes).ok())
}

/// Keeps the later (by offset) of `h` and what `heads` has for the cluster.
pub(super) fn keep_latest(heads: &mut HashMap<Arc<str>, Head>, cluster: &Arc<str>, h: Head) {
    let entry = heads.entry(cluster.clone()).or_insert(h);
    if h.offset > entry.offset {
        *entry = h;
    }
}

/// Every head in the bucket: one read of all its values (a request per key made a
/// replica's start at 50,000 clusters take 100,000 requests).
pub(super) async fn load_heads<K: KeyValue>(store: &K, bucket: &str) -> Result<HashMap<Arc<str>, Head>, NatsError> {
    let err = |cause: String| NatsError::KeyValue { bucket: bucket.into(), cause };
    let values = store.values(None).await.map_err(|e| err(format!("cannot read the heads: {e}")))?;
    // In the keys' order, not the map's: the refusal names the same head each time.
    let mut keys: Vec<&String> = values.keys().collect();
    keys.sort_unstable();
    let mut heads = HashMap::with_capacity(keys.len());
    for key in keys {
        let Some(cluster) = untoken(key) else { continue };
        match parse_head(&values[key]) {
            Ok(Some(h)) => {
                heads.insert(Arc::from(cluster), h);
            }
            Ok(None) => {}
            Err(found) => return Err(err(newer_format(&format!("the head of cluster {cluster}"), &found))),
        }
    }
    Ok(heads)
}

impl<J: JetStream> NatsBus<J> {
    /// The cluster's head: the later (by offset) of the stream's last message on the
    /// cluster's subject — or the key-value entry when the stream holds none of it — and
    /// what this replica saw. Two requests at most; [`super::head_reads`] shares them
    /// among the hellos of a connect storm.
    pub(super) async fn head_of(&self, cluster: &str) -> Result<Option<Head>, BusError> {
        let subject = self.subject(cluster);
        let found = match self.js.last_by_subject(&subject).await {
            Ok(Some(msg)) => self.head_in_record(cluster, &msg)?,
            // The bucket only matters once the stream holds nothing of the cluster: while it
            // does, its last record is at least as new as anything the bucket was given.
            Ok(None) => {
                let stored = self.heads_kv.get(&token(cluster)).await.map_err(|e| self.bucket_failed(cluster, e))?;
                self.head_in_bucket(cluster, stored.as_deref())?
            }
            Err(e) => return Err(self.stream_failed(cluster, e)),
        };
        Ok(self.settle_head(cluster, found))
    }

    /// The head a cluster's last record in the stream names; a record of a newer format is
    /// refused.
    pub(super) fn head_in_record(&self, cluster: &str, msg: &Stored) -> Result<Option<Head>, BusError> {
        let offset = msg.sequence + self.base.load(Ordering::SeqCst);
        if let Err(found) = readable_mark(msg.headers.get(H_FORMAT).map(|v| v.as_str())) {
            let what = format!("the last record of cluster {cluster} (offset {offset})");
            return Err(self.refuse_newer(newer_format(&what, &found)));
        }
        Ok(head_from_headers(&msg.headers, offset))
    }

    /// The head the bucket's value for the cluster names (`None`: no value, or not a
    /// head); a value of a newer format is refused.
    pub(super) fn head_in_bucket(&self, cluster: &str, stored: Option<&[u8]>) -> Result<Option<Head>, BusError> {
        match stored.map(parse_head).transpose() {
            Ok(h) => Ok(h.flatten()),
            Err(found) => {
                let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                Err(self.refuse_newer(newer_format(&what, &found)))
            }
        }
    }

    /// Reading the cluster's last record failed.
    pub(super) fn stream_failed(&self, what: &str, cause: String) -> BusError {
        self.fail(NatsError::Stream {
            stream: self.stream.clone(),
            cause: format!("read the last record of {what}: {cause}"),
        })
    }

    /// Reading the cluster's head in the bucket failed.
    pub(super) fn bucket_failed(&self, what: &str, cause: String) -> BusError {
        self.fail(NatsError::KeyValue {
            bucket: self.heads_bucket.clone(),
            cause: format!("read head of {what}: {cause}"),
        })
    }

    /// The cluster's head once `found` was read: the later of it and what this replica
    /// knows. A cluster found without any is noted (see [`Absent`]).
    pub(super) fn settle_head(&self, cluster: &str, found: Option<Head>) -> Option<Head> {
        if let Some(h) = found {
            self.note_head(&cluster.into(), h);
        }
        let head = lock(&self.heads).get(cluster).copied();
        if head.is_none() {
            lock(&self.absent).noted(&cluster.into(), Instant::now());
        }
        head
    }

    /// Writes the moved heads that are due (see [`HeadPacing`]), or all of them with `all`
    /// (shutdown), to the bucket; what fails is kept for the next call (unless a later head
    /// replaced it meanwhile).
    pub(super) async fn flush_heads(&self, all: bool) -> Result<(), BusError> {
        self.usable()?;
        self.read_uncertain().await;
        let now = Instant::now();
        let avg_bytes = {
            let st = lock(&self.stream_state);
            if st.messages > 0 { st.bytes as f64 / st.messages as f64 } else { 1024.0 }
        };
        let pending: Vec<(Arc<str>, Head)> = {
            let mut pacing = lock(&self.head_pacing);
            let delay = pacing.delay(now, self.stream_last.load(Ordering::SeqCst), &self.retention, avg_bytes);
            let delay = if all { Duration::ZERO } else { delay };
            let mut dirty = lock(&self.dirty_heads);
            let mut due: Vec<Arc<str>> = dirty.keys().filter(|c| pacing.due(c, now, delay)).cloned().collect();
            // Written in the clusters' order, not the map's (random per process): a
            // simulation seed then replays exactly.
            due.sort_unstable();
            due.into_iter().filter_map(|c| dirty.remove_entry(&c)).collect()
        };
        if pending.is_empty() {
            return Ok(());
        }
        let mut results: Vec<Result<(), HeadWrite>> = Vec::with_capacity(pending.len());
        for chunk in pending.chunks(HEAD_WRITES_IN_FLIGHT) {
            let puts = chunk.iter().map(|(cluster, h)| async move {
                let value: bytes::Bytes =
                    serde_json::to_vec(&StoredHead { head: h, format: NATS_FORMAT }).unwrap_or_default().into();
                self.write_head(cluster, h, value).await
            });
            results.extend(futures_util::future::join_all(puts).await);
        }
        let mut failure = None;
        let mut pacing = lock(&self.head_pacing);
        let mut dirty = lock(&self.dirty_heads);
        for ((cluster, h), r) in pending.into_iter().zip(results) {
            match r {
                Ok(()) => pacing.written(&cluster, now),
                Err(HeadWrite::Newer(why)) => {
                    drop((dirty, pacing));
                    return Err(self.refuse_newer(why));
                }
                Err(HeadWrite::Failed(e)) => {
                    failure.get_or_insert_with(|| format!("write head of {cluster}: {e}"));
                    dirty.entry(cluster).or_insert(h);
                }
            }
        }
        match failure {
            None => Ok(()),
            Some(cause) => Err(BusError::Nats(NatsError::KeyValue { bucket: self.heads_bucket.clone(), cause })),
        }
    }

    /// Reads the head of the clusters whose records' fate this replica did not learn, once
    /// that is due (see [`Uncertain`]), and has it written at this flush. A read that
    /// fails is tried again at the next flush.
    async fn read_uncertain(&self) {
        let now = Instant::now();
        let due = {
            let mut uncertain = lock(&self.uncertain);
            uncertain.link(self.js.disconnected().is_none(), now);
            uncertain.due(now)
        };
        for (cluster, at) in due {
            match self.head_of(&cluster).await {
                Ok(head) => {
                    if let Some(h) = head {
                        keep_latest(&mut lock(&self.dirty_heads), &cluster, h);
                        lock(&self.head_pacing).hurry(&cluster);
                    }
                    lock(&self.uncertain).settled(&cluster, at);
                }
                Err(e) => {
                    tracing::debug!(%cluster, error = %e, "cannot read the head after records of unknown fate; trying again");
                    return;
                }
            }
        }
    }

    /// Writes one head: compare-and-set on the revision this replica wrote last; when the
    /// value changed since (or this replica has not written it), the value there is read
    /// first: one of a newer format is not written over, nor a later head (another
    /// replica's): a follower that missed it would then never see it (see
    /// [`crate::ReplicaShare::follow_heads`]).
    async fn write_head(&self, cluster: &Arc<str>, head: &Head, value: bytes::Bytes) -> Result<(), HeadWrite> {
        let key = token(cluster);
        let known = lock(&self.head_revisions).get(cluster).copied();
        if let Some(rev) = known
            && let Ok(new) = self.heads_kv.update(&key, value.clone(), rev).await
        {
            lock(&self.head_revisions).insert(cluster.clone(), new);
            return Ok(());
        }
        let there = self.heads_kv.entry(&key).await.map_err(HeadWrite::Failed)?;
        let written = match there {
            Some(e) => {
                if e.is_put {
                    match parse_head(&e.value) {
                        Err(found) => {
                            let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                            return Err(HeadWrite::Newer(newer_format(&what, &found)));
                        }
                        Ok(Some(there)) if there.offset > head.offset => {
                            lock(&self.head_revisions).insert(cluster.clone(), e.revision);
                            return Ok(());
                        }
                        Ok(_) => {}
                    }
                }
                self.heads_kv.update(&key, value, e.revision).await.map_err(|e| e.to_string())
            }
            None => self.heads_kv.create(&key, value).await.map_err(|e| e.to_string()),
        };
        let new = written.map_err(HeadWrite::Failed)?;
        lock(&self.head_revisions).insert(cluster.clone(), new);
        Ok(())
    }

    pub(super) fn note_head(&self, cluster: &Arc<str>, h: Head) {
        keep_latest(&mut lock(&self.heads), cluster, h);
    }
}

#[cfg(test)]
mod pacing_tests {
    use super::*;
    use crate::retention::Retention;

    fn retention(records: usize, bytes: u64, age: Option<Duration>) -> Retention {
        Retention { records, bytes, age }
    }

    #[test]
    fn heads_wait_an_eighth_of_the_turnover_at_most_the_maximum() {
        let t0 = Instant::now();
        let secs = |s: f64| t0 + Duration::from_secs_f64(s);
        // A large retention at 5,000 records/s: the maximum.
        let mut p = HeadPacing::default();
        let big = retention(10_000_000, 1 << 40, Some(Duration::from_secs(24 * 3600)));
        assert_eq!(p.delay(t0, 0, &big, 300.0), Duration::ZERO, "no rate known yet: at once");
        assert_eq!(p.delay(secs(1.0), 5_000, &big, 300.0), HEAD_WRITE_DELAY_MAX);
        // 1,000 records at 100/s turn over in 10 s: heads wait 1.25 s.
        let mut p = HeadPacing::default();
        let small = retention(1_000, 1 << 40, None);
        p.delay(t0, 0, &small, 300.0);
        assert_eq!(p.delay(secs(1.0), 100, &small, 300.0), Duration::from_millis(1250));
        // Bytes bound too: 1 MiB at 100 records/s of 1 KiB turns over in ~10 s.
        let mut p = HeadPacing::default();
        let bytes = retention(10_000_000, 1 << 20, None);
        p.delay(t0, 0, &bytes, 1024.0);
        let d = p.delay(secs(1.0), 100, &bytes, 1024.0);
        assert!((d.as_secs_f64() - 10.24 / 8.0).abs() < 0.01, "{d:?}");
        // And age: records kept 8 s are written within a second even with no traffic.
        let mut p = HeadPacing::default();
        let age = retention(10_000_000, 1 << 40, Some(Duration::from_secs(8)));
        p.delay(t0, 0, &age, 300.0);
        assert_eq!(p.delay(secs(1.0), 0, &age, 300.0), Duration::from_secs(1));
    }

    #[test]
    fn a_burst_shortens_the_delay_at_once_a_lull_lengthens_it_slowly() {
        let t0 = Instant::now();
        let secs = |s: u64| t0 + Duration::from_secs(s);
        let r = retention(80_000, 1 << 40, None);
        let mut p = HeadPacing::default();
        p.delay(t0, 0, &r, 300.0);
        assert_eq!(p.delay(secs(1), 1_000, &r, 300.0), Duration::from_secs(10));
        assert_eq!(p.delay(secs(2), 11_000, &r, 300.0), Duration::from_secs(1), "10,000/s: 8 s turnover");
        // Quiet for a second: the rate decays to 9,000/s, not to 0.
        let d = p.delay(secs(3), 11_000, &r, 300.0);
        assert!(d > Duration::from_secs(1) && d < Duration::from_secs(2), "{d:?}");
    }

    #[test]
    fn a_cluster_found_empty_is_taken_once_while_fresh() {
        let t0 = Instant::now();
        let c: Arc<str> = "c".into();
        let mut a = Absent::default();
        assert!(!a.seen_now(&c, t0), "never read");
        a.noted(&c, t0);
        assert!(a.seen_now(&c, t0 + Duration::from_secs(1)));
        assert!(!a.seen_now(&c, t0 + Duration::from_secs(1)), "taken by the first append");
        a.noted(&c, t0);
        assert!(!a.seen_now(&c, t0 + ABSENCE_FRESH), "too old: read again");
        for i in 0..5000 {
            a.noted(&format!("old{i}").into(), t0);
        }
        a.noted(&c, t0 + ABSENCE_FRESH);
        for i in 0..4000 {
            a.noted(&format!("new{i}").into(), t0 + ABSENCE_FRESH);
        }
        assert!(a.at.len() < 5000, "stale entries pruned (amortised): {}", a.at.len());
        assert!(a.seen_now(&c, t0 + ABSENCE_FRESH));
    }

    #[test]
    fn a_hurried_head_is_due_at_once_until_written() {
        let t0 = Instant::now();
        let c: Arc<str> = "eu-1".into();
        let mut p = HeadPacing::default();
        let delay = Duration::from_secs(30);
        assert!(!p.due(&c, t0, delay));
        p.hurry(&c);
        assert!(p.due(&c, t0, delay), "another agent process's head: at once");
        p.written(&c, t0);
        assert!(!p.due(&c, t0 + Duration::from_secs(1), delay), "paced again once written");
    }

    #[test]
    fn records_of_unknown_fate_are_read_once_the_link_worked_for_a_while_after_the_failure() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let (c, d): (Arc<str>, Arc<str>) = ("c".into(), "d".into());
        let mut u = Uncertain::default();
        u.failed(&c, t0);
        u.link(false, at(1));
        assert!(u.due(at(4)).is_empty(), "not settled yet");
        u.link(false, at(4));
        assert!(u.due(at(8)).is_empty(), "the link was down 4 s ago: kept publishes may not be stored yet");
        u.link(true, at(9));
        u.failed(&d, at(8));
        assert_eq!(u.due(at(9)), vec![(c.clone(), t0)], "d failed too recently");
        u.failed(&c, at(9));
        u.settled(&c, t0);
        assert!(u.due(at(13)).iter().any(|(x, _)| *x == d), "d is due");
        assert!(u.due(at(13)).iter().all(|(x, _)| *x != c), "c failed again at 9: not settled by the read before");
        assert_eq!(u.due(at(14)).len(), 2);
        u.settled(&c, at(9));
        u.settled(&d, at(8));
        assert!(u.due(at(60)).is_empty());
    }

    #[test]
    fn a_moved_head_is_due_after_the_delay_since_its_last_write() {
        let t0 = Instant::now();
        let c: Arc<str> = "eu-1".into();
        let mut p = HeadPacing::default();
        let delay = Duration::from_secs(30);
        assert!(!p.due(&c, t0, delay), "moved now: waits");
        assert!(!p.due(&c, t0 + Duration::from_secs(29), delay));
        assert!(p.due(&c, t0 + Duration::from_secs(30), delay));
        p.written(&c, t0 + Duration::from_secs(30));
        assert!(!p.due(&c, t0 + Duration::from_secs(31), delay), "written: waits again");
        assert!(p.due(&c, t0 + Duration::from_secs(31), Duration::ZERO), "no delay under pressure");
    }
}
