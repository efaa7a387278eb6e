//! The local tail: the retained records in this replica's memory, fed by one ordered
//! consumer, started by the first reader.
//!
//! A replica with readers keeps the retained records in memory, fed by one ordered push
//! consumer over the whole stream, and applies the same retention to it ([`crate::log::Log`], shared with
//! the embedded backends). So `last_offset`, `stats` and `watch_end`
//! stay synchronous, reads and subscriber fan-out are local (no consumer per subscriber on
//! the server), and every replica reports the same evicted clusters: eviction is decided by
//! the same rule over the same sequence of records. Reading older offsets back from
//! JetStream would not help: the local tail holds everything the retention keeps, and what
//! it evicted the stream evicts too (same limits). History that was evicted before a
//! replica started is attributed to the clusters whose head offset (in the key-value
//! bucket) lies at or above the reader's cursor: a superset of the clusters concerned, so a
//! subscriber may resync a cluster more than needed, never less. A gap in the sequence
//! delivered while running (the replica fell behind the stream's eviction) evicts the local
//! tail and reports `*`.
//!
//! The tail starts with the replica's first reader ([`Bus::prepare_reads`], a read), not at
//! start: a replica that serves only agents never has the stream delivered to it (with one
//! subscriber on one of 3 replicas, the hubs' CPU fell by a sixth and p99 by a third), and
//! its appends answer on JetStream's ack alone. Once started, the tail stays. A subscriber
//! session waits until the tail holds the stream's end as JetStream reports it (and the
//! stream is the one this replica took on), so a cursor another replica handed out is
//! never beyond this replica's log. Until then
//! the offsets and counts it answers are the stream's as last seen (its acks, the probe).

use futures_util::{FutureExt, StreamExt};
use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use crate::log::Log;
use crate::retention;
use crate::{ALL_CLUSTERS, Bus, RecordBody};

use super::chain::{Chain, Latest};
use super::heads::{Head, keep_latest, load_heads};
use super::jetstream::{Delivered, JetStream, StreamState as JsState};
use super::records::{H_FORMAT, H_KNOWN, H_PREV, decode};
use super::state::{newer_format, readable_mark};
use super::{LOCAL_WAIT, NatsBus, NatsError, lock};

/// The stream's first offset and size as last seen (start, probe), answered by a replica
/// without a local tail.
#[derive(Debug, Clone, Copy)]
pub(super) struct StreamState {
    pub(super) first: u64,
    pub(super) messages: u64,
    pub(super) bytes: u64,
}

impl StreamState {
    /// The state in offsets (stream sequence + `base`).
    pub(super) fn of(s: &JsState, base: u64) -> Self {
        let first = if s.messages == 0 { s.last_sequence + 1 } else { s.first_sequence.max(1) };
        Self { first: first + base, messages: s.messages, bytes: s.bytes }
    }
}

/// The local tail's starting point: the stream's retained range, and what was evicted
/// before it (from the heads in the bucket). The tail checks each record's predecessor;
/// what it cannot see (records evicted before it started) it knows only from heads written
/// before them.
fn initial_log(state: &JsState, base: u64, heads: &HashMap<Arc<str>, Head>, marker_stored: bool) -> (Log, Chain) {
    let mut log = Log::new();
    log.base = StreamState::of(state, base).first;
    log.end = log.base;
    // A recreated stream read from its first record, with its `resync-required` `*` known
    // stored (this replica published it): the records before the marker are covered by it.
    let before_marker = marker_stored && base > 0 && log.base == base + 1;
    let mut chain = Chain { last: HashMap::new(), seen_from: log.base, before_marker };
    for (cluster, h) in heads {
        if h.offset < log.base {
            log.evicted.insert(cluster.clone(), h.offset);
            let latest = Latest::new((h.epoch, h.seq), h.offset);
            chain.last.insert(cluster.clone(), latest);
        } else if log.base > 1 {
            log.evicted.insert(cluster.clone(), log.base - 1);
        }
        log.heads.insert(cluster.clone(), (h.epoch, h.seq));
    }
    // Records of this stream were evicted before the tail started: the bucket names the
    // clusters whose heads were written before, but not one whose latest record was stored
    // after the last write of the heads (written once a second, and not at all by a replica
    // that crashed first). A reader from before the first retained record gets
    // `resync-required *` (seed 8146: a subscriber resuming on a replica whose tail had just
    // started skipped a cluster's evicted records without a word).
    let first_seq = if state.messages == 0 { state.last_sequence + 1 } else { state.first_sequence.max(1) };
    if first_seq > 1 {
        log.evicted.insert(Arc::from(ALL_CLUSTERS), log.base - 1);
    }
    (log, chain)
}

impl<J: JetStream> NatsBus<J> {
    /// Starts the local tail, once: loads the retained records and follows the stream from
    /// then on; answers when what the stream held at the call is in it. Called by the first
    /// reader (a subscriber session, a read): until then this replica only appends, and
    /// neither it nor JetStream spends anything on delivering it the stream.
    pub(crate) async fn start_tail(&self) -> Result<(), NatsError> {
        if self.tail_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        // On a task of its own: a reader that gives up (its connection closed) must not
        // leave the tail half set up while appends already wait for it.
        let Some(bus) = self.me.upgrade() else {
            return Err(self.stream_error("the bus is shutting down".into()));
        };
        tokio::spawn(async move { bus.start_tail_now().await })
            .await
            .map_err(|e| self.stream_error(format!("starting the local tail failed: {e}")))?
    }

    pub(super) async fn start_tail_now(&self) -> Result<(), NatsError> {
        let _starting = self.tail_starting.lock().await;
        if self.tail_ready.load(Ordering::Acquire) {
            return Ok(());
        }
        if !self.tail_started.load(Ordering::SeqCst) {
            // From here on, appends wait for their records in the tail: whatever is acked
            // before the stream's state is read below is loaded with the retained records.
            self.tail_started.store(true, Ordering::SeqCst);
            if let Err(e) = self.spawn_tail().await {
                self.tail_started.store(false, Ordering::SeqCst);
                // Appends that began waiting for the tail need not: nothing reads here yet.
                let waiting = std::mem::take(&mut *lock(&self.local_waiters));
                for tx in waiting.into_values().flatten() {
                    let _ = tx.send(());
                }
                return Err(e);
            }
        }
        // Loaded once it holds what the stream holds now (a retry after a timeout waits again).
        let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
        let last = info.state.last_sequence + self.base.load(Ordering::SeqCst);
        if last >= self.core.first_offset() {
            tracing::info!(stream = %self.stream, records = info.state.messages, "loading the retained records from JetStream into the local tail");
            self.wait_local(last).await?;
        }
        self.tail_ready.store(true, Ordering::Release);
        tracing::info!(stream = %self.stream, first = self.stats().first_offset, last = self.last_offset(), "local tail ready");
        Ok(())
    }

    /// Sets the local tail up from the stream's state and the heads in the bucket, and
    /// starts its consumer.
    pub(super) async fn spawn_tail(&self) -> Result<(), NatsError> {
        let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
        // The bucket's heads are up to a second old (appending replicas write them once a
        // second): this replica's own acks and lookups may be newer.
        let mut heads = load_heads(&self.heads_kv, &self.heads_bucket).await?;
        for (cluster, h) in lock(&self.heads).iter() {
            keep_latest(&mut heads, cluster, *h);
        }
        let base = self.base.load(Ordering::SeqCst);
        let marker_stored = self.marker_base.load(Ordering::SeqCst) == base;
        let (log, chain) = initial_log(&info.state, base, &heads, marker_stored);
        let start = log.end;
        let generation = {
            let mut current =
                self.core.log.write().map_err(|_| self.stream_error("local tail lock poisoned".into()))?;
            *current = log;
            *lock(&self.chain) = chain;
            // Batches of a consumer started before are dropped from now on.
            self.tail_generation.fetch_add(1, Ordering::SeqCst) + 1
        };
        for (cluster, h) in heads {
            self.note_head(&cluster, h);
        }
        // A tail restarted on a recreated stream starts above the old end: readers and
        // appends waiting for old offsets go on.
        self.core.announce(start);
        self.release_local();
        let messages = self.js.ordered(start - base).await.map_err(|e| self.stream_error(e))?;
        let tail = tokio::spawn(follow(self.me.clone(), messages, generation));
        if let Some(old) = lock(&self.tail_task).replace(tail.abort_handle()) {
            old.abort();
        }
        Ok(())
    }

    /// Waits until the local tail holds what the stream holds now. A subscriber comes with
    /// a cursor another replica may have handed out, up to the stream's end; a tail behind
    /// it (lagging, or back from a cut link to JetStream) would take it for a cursor beyond
    /// the log, which means lost records: a `resync-required` `*` and offsets the
    /// subscriber had acknowledged delivered again (the simulation found it: seed 58 of
    /// `--storage nats`).
    pub(super) async fn catch_up(&self) -> Result<(), NatsError> {
        let deadline = tokio::time::Instant::now() + LOCAL_WAIT;
        let info = loop {
            let info = self.js.stream_info().await.map_err(|e| self.stream_error(format!("stream info: {e}")))?;
            if info.created_ns == *lock(&self.created) && !self.adopting.load(Ordering::SeqCst) {
                break info;
            }
            // A stream recreated that this replica has not taken on yet: its offsets are
            // still the old stream's, below the cursors of replicas that took it on (the
            // simulation found a subscriber placed below what it had acknowledged, seeds
            // 273 and 376 of `--storage nats`). The probe takes it on now.
            if tokio::time::Instant::now() >= deadline {
                return Err(self.stream_error("the stream was recreated and is not taken on yet".into()));
            }
            self.recheck.notify_one();
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let last = info.state.last_sequence + self.base.load(Ordering::SeqCst);
        if last > self.core.last_offset() && last >= self.core.first_offset() {
            self.wait_local(last).await?;
        }
        Ok(())
    }

    /// Waits until the local tail holds `offset` (at most [`LOCAL_WAIT`]).
    pub(super) async fn wait_local(&self, offset: u64) -> Result<(), NatsError> {
        let arrived = {
            // The end is read under the waiters' lock and [`Self::release_local`] takes it
            // after every advance, so an advance is either seen here or releases us.
            let mut waiters = lock(&self.local_waiters);
            if *self.core.end_tx.borrow() > offset {
                return Ok(());
            }
            let (tx, rx) = tokio::sync::oneshot::channel();
            waiters.entry(offset).or_default().push(tx);
            rx
        };
        match tokio::time::timeout(LOCAL_WAIT, arrived).await {
            Ok(Ok(())) => Ok(()),
            _ => Err(NatsError::Lagging { stream: self.stream.clone(), offset }),
        }
    }

    /// Wakes the appends whose records the local tail now holds (offsets below its end).
    /// Entries of appends that gave up are dropped here too, once the end passes them.
    pub(super) fn release_local(&self) {
        let ready = {
            let mut waiters = lock(&self.local_waiters);
            let end = *self.core.end_tx.borrow();
            let later = waiters.split_off(&end);
            std::mem::replace(&mut *waiters, later)
        };
        for tx in ready.into_values().flatten() {
            let _ = tx.send(());
        }
    }

    /// Takes delivered messages into the local tail (unless they come from the consumer of
    /// an earlier `generation` of it).
    pub(super) fn ingest(&self, batch: Vec<Delivered>, generation: u64) {
        if lock(&self.poisoned).is_some() {
            // Refused to go on (a record of a newer format, another bus): what follows is
            // neither read nor taken for a gap.
            return;
        }
        let now = retention::now_ms();
        let Ok(mut log) = self.core.log.write() else { return };
        if self.tail_generation.load(Ordering::SeqCst) != generation {
            return;
        }
        let base = self.base.load(Ordering::SeqCst);
        let mut chain = lock(&self.chain);
        let mut end = log.end;
        let mut records = Vec::with_capacity(batch.len());
        let mut new_heads = Vec::new();
        let mut refused = false;
        for msg in batch {
            let offset = msg.sequence + base;
            if offset < end {
                continue; // delivered again after the consumer was recreated
            }
            if offset > end {
                // JetStream evicted records this replica had not received yet: everything
                // older goes too, and every cluster may have lost something.
                tracing::warn!(stream = %self.stream, from = end, to = offset, "the local tail fell behind the stream's retention");
                let mut dropped = std::mem::take(&mut records);
                dropped.extend(log.records.drain(..));
                for r in dropped {
                    log.evicted.insert(r.cluster.clone(), r.offset);
                }
                log.bytes = 0;
                log.evicted.insert(ALL_CLUSTERS.into(), offset - 1);
                log.base = offset;
                // What the dropped records carried is unseen: predecessors are unknown now.
                chain.seen_from = offset;
                chain.last.clear();
                chain.before_marker = false;
            }
            // A record of a newer format is neither skipped nor taken for damage: the tail
            // stops before it and this replica refuses to go on (its hub exits, naming both
            // formats; the record stays in the stream for the release that reads it).
            if let Err(found) = readable_mark(msg.headers.as_ref().and_then(|h| h.get(H_FORMAT)).map(|v| v.as_str())) {
                let _ = self.refuse_newer(newer_format(&format!("the record at offset {offset}"), &found));
                refused = true;
                break;
            }
            end = offset + 1;
            let time_ms = msg.published_ms.unwrap_or(now);
            match decode(&self.stream, &msg, offset, time_ms) {
                Ok(mut rec) => {
                    let header = |name| msg.headers.as_ref().and_then(|h| h.get(name)).map(|v| v.as_str());
                    let (prev, known) = (header(H_PREV), header(H_KNOWN));
                    if rec.epoch == 0
                        && &*rec.cluster == ALL_CLUSTERS
                        && matches!(&rec.body, RecordBody::ResyncRequired(r) if r.starts_with(super::RECREATED))
                    {
                        chain.marker_read();
                    }
                    // A marker that does not follow already asks for what a replacement would.
                    if let Err(why) = chain.follow(&rec.cluster, prev, known, (rec.epoch, rec.seq), offset)
                        && matches!(rec.body, RecordBody::Event(_))
                    {
                        tracing::warn!(stream = %self.stream, cluster = %rec.cluster, offset, why, "a record does not follow its cluster's latest one: delivered as resync-required");
                        rec.body = RecordBody::ResyncRequired(format!("offset {offset}: {why}"));
                    }
                    new_heads.push((rec.cluster.clone(), Head { epoch: rec.epoch, seq: rec.seq, offset }));
                    records.push(Arc::new(rec));
                }
                Err(why) => {
                    tracing::warn!(stream = %self.stream, offset, "skipping a message that is not a fleetwatch record: {why}")
                }
            }
        }
        let log_heads: Vec<_> = new_heads.iter().map(|(c, h)| (c.clone(), (h.epoch, h.seq))).collect();
        log.publish(records, end, log_heads, &self.retention, now);
        drop(chain);
        drop(log);
        for (c, h) in new_heads {
            self.note_head(&c, h);
        }
        self.core.announce(end);
        self.release_local();
        if refused {
            // Readers waiting for more read now and fail (see `adopt`).
            self.core.announce(u64::MAX);
        }
    }
}

/// How long the local tail may make no progress while the stream has more before its
/// consumer is recreated.
const TAIL_STALL: Duration = Duration::from_secs(5);

/// Feeds the local tail from the ordered consumer, in batches of what is already there.
/// The consumer recreates itself after most failures; as a backstop (a consumer lost with
/// a JetStream node, a recreation that hangs), one that makes no progress for
/// [`TAIL_STALL`] while the stream has more is replaced from the local end.
pub(super) async fn follow<J: JetStream>(bus: Weak<NatsBus<J>>, mut messages: J::Messages, generation: u64) {
    let mut check = tokio::time::interval(Duration::from_secs(1));
    check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut stalled: Option<(tokio::time::Instant, u64)> = None;
    loop {
        let first = tokio::select! {
            next = messages.next() => next,
            _ = check.tick() => {
                let Some(bus) = bus.upgrade() else { return };
                let end = bus.core.log.read().map(|l| l.end).unwrap_or(0);
                if bus.stream_last.load(Ordering::Relaxed) < end {
                    stalled = None;
                    continue;
                }
                match stalled {
                    Some((since, at)) if at == end && since.elapsed() >= TAIL_STALL => {
                        tracing::warn!(stream = %bus.stream, end, "the local tail made no progress while the stream has more: recreating its consumer");
                        let from = end.saturating_sub(bus.base.load(Ordering::SeqCst)).max(1);
                        match bus.js.ordered(from).await {
                            Ok(m) => messages = m,
                            Err(e) => tracing::warn!(error = %e, "cannot recreate the local tail's consumer; retrying"),
                        }
                        stalled = None;
                    }
                    Some((_, at)) if at == end => {}
                    _ => stalled = Some((tokio::time::Instant::now(), end)),
                }
                continue;
            }
        };
        let mut batch = Vec::new();
        let mut next = first;
        let mut ended = false;
        loop {
            match next {
                Some(Ok(m)) => batch.push(m),
                Some(Err(e)) => tracing::warn!(error = %e, "local tail consumer interrupted; it resumes where it was"),
                None => {
                    ended = true;
                    break;
                }
            }
            if batch.len() >= 1024 {
                break;
            }
            match messages.next().now_or_never() {
                Some(n) => next = n,
                None => break,
            }
        }
        let Some(bus) = bus.upgrade() else { return };
        if !batch.is_empty() {
            bus.ingest(batch, generation);
        }
        if ended {
            // The subscription closed: start a new consumer from the local end.
            let end = bus.core.log.read().map(|l| l.end).unwrap_or(0);
            let from = end.saturating_sub(bus.base.load(Ordering::SeqCst)).max(1);
            match bus.js.ordered(from).await {
                Ok(m) => messages = m,
                Err(e) => {
                    *lock(&bus.unhealthy) = Some(format!("the local tail of stream {} stopped: {e}", bus.stream));
                    tokio::time::sleep(Duration::from_secs(1)).await;
                }
            }
        }
    }
}

/// Evicts by age once a second, so old records go without new appends.
pub(super) async fn age_retention<J: JetStream>(bus: Weak<NatsBus<J>>) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        every.tick().await;
        let Some(bus) = bus.upgrade() else { return };
        if bus.retention.age.is_some()
            && let Ok(mut log) = bus.core.log.write()
        {
            let end = log.end;
            log.publish(Vec::new(), end, None, &bus.retention, retention::now_ms());
        }
    }
}
