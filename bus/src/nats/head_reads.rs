//! Heads read together: the hellos of a connect storm share their reads of the stream.
//!
//! An agent's hello needs its cluster's head as the stream holds it ([`NatsBus::head_of`]:
//! the last record on its subject, the heads bucket when the stream holds none), read
//! after its session registered for pokes (decision 0037), so that nothing recorded after
//! the read goes unseen and nothing stored before it is missed. That was a request to the
//! stream leader per hello, two for a cluster without records: 100,000 requests when
//! 50,000 agents of new clusters connect at once, queued behind each other until they
//! timed out and the agents tried again.
//!
//! Now a head is asked for by joining a queue; the bus's reader ([`serve`]) takes the
//! whole queue and reads every head in it, group-commit style, so a read serves every
//! caller that joined before it began (each is then past its registration, which is all
//! the hello asks), and the next read takes whoever joined meanwhile:
//! - on a replica with a local tail, the clusters the tail vouches for are answered without
//!   a request, once a health probe begun after the read found the stream's end and the
//!   tail reached it (see `heads_from_tail`; at most a second's wait, the probe's period);
//! - of the others, a few are read one request each, as before, each caller answered as
//!   soon as its read is;
//! - many (at least one in [`SWEEP_SHARE`] of the clusters this replica knows) are read
//!   through one sweep: one consumer delivering the last record of every subject, headers
//!   only ([`JetStream::last_by_subjects`]), and one of the bucket's values for those
//!   without records ([`KeyValue::values`]); only the clusters asked for are kept.
//!
//! A read that fails fails every caller it was for, who ask again as they did before (a
//! timeout is still a timeout). A caller that goes away only drops its own answer. The
//! queue holds one small entry per caller, and callers are sessions the hub admitted
//! (`--max-connections`), so it is bounded by them.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use futures_util::StreamExt;
use futures_util::stream::FuturesUnordered;
use tokio::sync::oneshot;

use crate::BusError;

use super::heads::Head;
use super::jetstream::{JetStream, KeyValue};
use super::records::token;
use super::{NatsBus, lock};

/// A sweep pays once the heads asked for are at least this share of the clusters the
/// replica knows (a sweep delivers one message per cluster the stream holds; a request per
/// head costs a round trip and the leader's lookup each).
pub(super) const SWEEP_SHARE: usize = 8;

/// How long a read waits for the local tail to vouch for its heads (a probe begun after it,
/// every second, and the tail at the stream's end that probe found) before it asks
/// JetStream instead.
pub(super) const TAIL_WAIT: Duration = Duration::from_secs(3);

/// Fewer heads than this are always read one by one.
pub(super) const SWEEP_MIN: usize = 2;

/// One caller waiting for its cluster's head.
struct Waiter {
    cluster: Arc<str>,
    answer: Answer,
}

/// Where a caller's answer goes.
type Answer = oneshot::Sender<Result<Option<Head>, BusError>>;

/// The queue of heads asked for.
#[derive(Default)]
pub(super) struct HeadReads {
    waiting: std::sync::Mutex<Vec<Waiter>>,
    /// Wakes the reader ([`serve`]) when a caller joined the queue.
    pub(super) wake: Arc<tokio::sync::Notify>,
    /// Reads made, and sweeps among them (for tests and the bench).
    reads: std::sync::atomic::AtomicU64,
    sweeps: std::sync::atomic::AtomicU64,
    /// Heads answered from the local tail, without a request.
    from_tail: std::sync::atomic::AtomicU64,
}

impl HeadReads {
    /// (reads of JetStream, sweeps among them) made so far.
    #[cfg(test)]
    pub(super) fn counts(&self) -> (u64, u64) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.reads.load(Relaxed), self.sweeps.load(Relaxed))
    }

    /// Heads answered from the local tail so far.
    #[cfg(test)]
    pub(super) fn answered_from_tail(&self) -> u64 {
        self.from_tail.load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// How the heads of `n` clusters are read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ReadPlan {
    /// A request each.
    OneByOne,
    /// One sweep for all.
    Sweep,
}

impl ReadPlan {
    /// For `n` heads asked for at once, the replica knowing `known` clusters' heads.
    pub(super) fn of(n: usize, known: usize) -> Self {
        if n >= SWEEP_MIN && n.saturating_mul(SWEEP_SHARE) >= known { ReadPlan::Sweep } else { ReadPlan::OneByOne }
    }
}

/// The bus's reader of heads: takes the whole queue and reads it, again while callers
/// joined meanwhile, then waits to be woken. Callers only wait for their answer: a caller
/// taking its turn at a lock, as a first version did, made thousands of answered callers
/// pass the lock one after another behind every TLS handshake in the runtime's queue (13 s
/// without a read at 50,000 agents).
pub(super) async fn serve<J: JetStream>(bus: std::sync::Weak<NatsBus<J>>, wake: Arc<tokio::sync::Notify>) {
    loop {
        {
            let Some(bus) = bus.upgrade() else { return };
            loop {
                let batch = std::mem::take(&mut *lock(&bus.head_reads.waiting));
                if batch.is_empty() {
                    break;
                }
                bus.read_heads(batch).await;
            }
        }
        wake.notified().await;
    }
}

impl<J: JetStream> NatsBus<J> {
    /// The cluster's head as [`NatsBus::head_of`] reads it, read together with the heads
    /// other callers ask for meanwhile (see the module docs).
    pub(super) async fn shared_head(&self, cluster: &str) -> Result<Option<Head>, BusError> {
        let (tx, rx) = oneshot::channel();
        lock(&self.head_reads.waiting).push(Waiter { cluster: cluster.into(), answer: tx });
        self.head_reads.wake.notify_one();
        // No answer: the reader is gone (the bus is closing).
        rx.await.unwrap_or(Err(BusError::Closed))
    }

    /// Reads the heads `batch` waits for and answers each.
    async fn read_heads(&self, batch: Vec<Waiter>) {
        let callers = batch.len();
        // By cluster, in the clusters' order: a simulation seed replays exactly.
        let mut waiting: BTreeMap<Arc<str>, Vec<Answer>> = BTreeMap::new();
        for w in batch {
            waiting.entry(w.cluster).or_default().push(w.answer);
        }
        let started = tokio::time::Instant::now();
        let mut from_tail = 0usize;
        for (c, head) in self.heads_from_tail(waiting.keys()).await {
            from_tail += 1;
            for a in waiting.remove(&c).unwrap_or_default() {
                let _ = a.send(Ok(head));
            }
        }
        if waiting.is_empty() {
            tracing::debug!(stream = %self.stream, clusters = from_tail, callers, "heads read from the local tail");
            return;
        }
        let clusters: Vec<Arc<str>> = waiting.keys().cloned().collect();
        let known = lock(&self.heads).len();
        let plan = ReadPlan::of(clusters.len(), known);
        {
            use std::sync::atomic::Ordering::Relaxed;
            self.head_reads.reads.fetch_add(1, Relaxed);
            if plan == ReadPlan::Sweep {
                self.head_reads.sweeps.fetch_add(1, Relaxed);
            }
        }
        let mut failed = 0usize;
        let mut answer = |cluster: &Arc<str>, head: Result<Option<Head>, BusError>| {
            failed += usize::from(head.is_err());
            for a in waiting.remove(cluster).unwrap_or_default() {
                let _ = a.send(head.clone());
            }
        };
        match plan {
            // Each answered as soon as its own read is.
            ReadPlan::OneByOne => {
                let mut reads: FuturesUnordered<_> =
                    clusters.iter().map(|c| async move { (c, self.head_of(c).await) }).collect();
                while let Some((c, head)) = reads.next().await {
                    answer(c, head);
                }
            }
            ReadPlan::Sweep => {
                let mut found = self.swept_heads(&clusters).await;
                for c in &clusters {
                    if let Some(head) = found.remove(c) {
                        answer(c, head);
                    }
                }
            }
        }
        tracing::debug!(
            stream = %self.stream,
            clusters = clusters.len(),
            callers,
            from_tail,
            ?plan,
            failed,
            took_ms = started.elapsed().as_millis() as u64,
            "heads read"
        );
        // Every cluster was read; were one not, its callers ask again rather than take a
        // head nobody read.
        for (cluster, answers) in waiting {
            for a in answers {
                let _ = a.send(Err(BusError::Opening(format!("the head of cluster {cluster} was not read"))));
            }
        }
    }

    /// The heads of those of `clusters` the local tail can vouch for, without a request:
    /// it took in a record of theirs since it started, with no gap since (a gap forgets
    /// them, see `tail`), so it has seen every record of theirs up to its end. Once a probe
    /// begun after this call (every second, see `probe`) found the stream's end and the
    /// tail reached it, every record stored before the call is in the tail, and the head
    /// this replica knows is the one [`NatsBus::head_of`] would read. None when the
    /// replica has no tail, or the probe or the tail did not come within [`TAIL_WAIT`].
    async fn heads_from_tail<'a>(&self, clusters: impl Iterator<Item = &'a Arc<str>>) -> Vec<(Arc<str>, Option<Head>)> {
        if !self.holds_records() {
            return Vec::new();
        }
        let candidates = self.vouched_by_tail(clusters);
        if candidates.is_empty() {
            return Vec::new();
        }
        let generation = self.tail_generation.load(Ordering::SeqCst);
        let begun = self.probes_begun.load(Ordering::SeqCst);
        let caught_up = async {
            let mut probed = self.probed.subscribe();
            let last = probed.wait_for(|(number, _)| *number > begun).await.ok()?.1;
            let mut end = self.core.end_tx.subscribe();
            end.wait_for(|end| *end > last).await.ok()?;
            Some(())
        };
        let in_time = tokio::time::timeout(TAIL_WAIT, caught_up).await.ok().flatten().is_some();
        if !in_time || self.tail_generation.load(Ordering::SeqCst) != generation || !self.holds_records() {
            return Vec::new();
        }
        // A gap meanwhile forgot some: they are read from JetStream.
        let still = self.vouched_by_tail(candidates.iter());
        self.head_reads.from_tail.fetch_add(still.len() as u64, Ordering::Relaxed);
        still
            .into_iter()
            .map(|c| {
                let head = self.settle_head(&c, None);
                (c, head)
            })
            .collect()
    }

    /// Those of `clusters` the local tail took in a record of since it started, with no
    /// gap since.
    fn vouched_by_tail<'a>(&self, clusters: impl Iterator<Item = &'a Arc<str>>) -> Vec<Arc<str>> {
        let chain = lock(&self.chain);
        clusters.filter(|c| chain.last.contains_key(*c)).cloned().collect()
    }

    /// The heads of `clusters` through one sweep of the stream's last records and, for
    /// those without any, one of the bucket's values.
    async fn swept_heads(&self, clusters: &[Arc<str>]) -> HashMap<Arc<str>, Result<Option<Head>, BusError>> {
        let subjects: HashMap<String, &Arc<str>> = clusters.iter().map(|c| (self.subject(c), c)).collect();
        let wanted: HashSet<String> = subjects.keys().cloned().collect();
        let last = match self.js.last_by_subjects(&wanted).await {
            Ok(last) => last,
            Err(e) => {
                let err = self.stream_failed(&format!("{} clusters", clusters.len()), e);
                return clusters.iter().map(|c| (c.clone(), Err(err.clone()))).collect();
            }
        };
        let mut found: HashMap<Arc<str>, Result<Option<Head>, BusError>> = HashMap::with_capacity(clusters.len());
        let mut without: Vec<&Arc<str>> = Vec::new();
        for c in clusters {
            match last.get(&self.subject(c)) {
                Some(msg) => {
                    found.insert(c.clone(), self.head_in_record(c, msg));
                }
                None => without.push(c),
            }
        }
        if !without.is_empty() {
            let keys: HashSet<String> = without.iter().map(|c| token(c)).collect();
            match self.heads_kv.values(Some(&keys)).await {
                Ok(values) => {
                    for c in without {
                        found.insert(c.clone(), self.head_in_bucket(c, values.get(&token(c)).map(|v| &v[..])));
                    }
                }
                Err(e) => {
                    let err = self.bucket_failed(&format!("{} clusters", without.len()), e);
                    for c in without {
                        found.insert(c.clone(), Err(err.clone()));
                    }
                }
            }
        }
        for c in clusters {
            if let Some(Ok(h)) = found.get_mut(c) {
                *h = self.settle_head(c, *h);
            }
        }
        found
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_few_heads_are_read_one_by_one_a_storm_through_one_sweep() {
        assert_eq!(ReadPlan::of(1, 0), ReadPlan::OneByOne, "a lone hello: one request, as before");
        assert_eq!(ReadPlan::of(1, 1), ReadPlan::OneByOne);
        assert_eq!(ReadPlan::of(2, 3), ReadPlan::Sweep, "two of three clusters: a sweep of three records");
        assert_eq!(ReadPlan::of(100, 50_000), ReadPlan::OneByOne, "a sweep of 50,000 for 100 does not pay");
        assert_eq!(ReadPlan::of(6_249, 50_000), ReadPlan::OneByOne);
        assert_eq!(ReadPlan::of(6_250, 50_000), ReadPlan::Sweep, "an eighth of the fleet at once");
        assert_eq!(ReadPlan::of(usize::MAX, usize::MAX), ReadPlan::Sweep, "no overflow");
    }
}
