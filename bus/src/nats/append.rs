//! Appends: duplicate filtering, publishing a batch back to back with its chain headers,
//! and awaiting the acks.
//!
//! The records left after duplicate filtering (seq not above the cluster's head in the same
//! epoch, as every backend does) are published back to back and their acks awaited
//! together: one round trip per batch, not per record. Each publish carries
//! `Nats-Msg-Id = <cluster>/<epoch>/<seq>`, so a resend after a hub died between the
//! publish and the agent's ack (or two replicas racing) is dropped by JetStream's duplicate
//! window. The append answers only after every ack and, once this replica has readers, the
//! record's arrival in the local tail (below), so a reader here sees what was just acked.
//!
//! A session keeps several appends in flight ([`Bus::start_append`]: publishing is done
//! when the outer future resolves, in call order; the acks come with the inner one) and
//! acks its agent only up to the last batch whose predecessors were all stored. That is safe
//! only if a record stored after one that was lost cannot pass for a complete history: the
//! agent resends the lost records after reconnecting, and the head (from the later, stored
//! batch) calls them duplicates. So every record names its predecessor: `Fw-Prev =
//! <epoch>/<seq>` of the record this replica published just before it for the cluster (its
//! appends in flight chain up; with none in flight, the head it knows, then with
//! `@<offset>`), or `-` when it knew of none. Each replica's tail checks, in stream order, that a record's `Fw-Prev` is the
//! cluster's latest record it took in, and delivers one that is not as `resync-required`
//! (its change, and the lost ones before it, are then reconciled from the cluster). The
//! check needs only the stream, so every replica decides alike, the appending replica may
//! die right after, and a replica started later decides from the records it loads; where it
//! cannot see the predecessor (evicted before it started) it accepts one named with an
//! offset below what it loaded (stored, as its ack said) and otherwise delivers the marker
//! too: a resync more than needed, never one less. A record older than the cluster's
//! latest of the same agent process (a publish a client kept while its link was down and
//! sent late, after the agent resent it elsewhere) is delivered as `resync-required` as
//! well, and the latest stays the latest. So is one sent before a record of another agent
//! process of the cluster was stored, stored after it: every record names the stream's end
//! its publisher knew (`Fw-Known`: its acks and probes, its tail, the head it chained
//! onto), and a record of another epoch of the cluster beyond that end and before the
//! record may be newer than it (a second agent process appending through a replica whose
//! link was cut: its kept publishes followed the first late one, seed 172). A healthy
//! process is checked alike, but its replica knows the stream's end past the other
//! process's records once its first acks are in; the records after the hole of a partly
//! stored batch of one process stay events. Where part of what lies between is unseen
//! (evicted before the tail started) the record is delivered as the marker. JetStream's
//! own per-subject expectation (`Nats-Expected-Last-Subject-Sequence`) would refuse such a
//! record instead, but needs the previous record's stream sequence, known only from its ack:
//! it cannot chain publishes in flight. Two replicas appending for one cluster at once (a
//! session moving while the old one still publishes) also break the chain and cost a resync.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::{Append, Bus, BusError, BusFuture, RecordBody, cap_reasons};

use super::heads::{Head, keep_latest};
use super::jetstream::{HeaderMap, JetStream};
use super::records::{
    FORMAT_MARK, H_EPOCH, H_FORMAT, H_KIND, H_KNOWN, H_PREV, H_SEQ, KIND_EVENT, KIND_RESYNC, fnv1a, token,
};
use super::{NatsBus, NatsError, lock};

/// Appends of one cluster in flight on this replica (see [`NatsBus::start_inner`]).
#[derive(Debug, Clone, Copy)]
pub(super) struct Pending {
    /// (epoch, seq) of the record published last.
    tip: (u64, u64),
    /// Appends whose acks are outstanding.
    in_flight: usize,
    generation: u64,
    /// An append failed since `tip` was published: `tip` may be lost. The entry stays
    /// (also with nothing in flight), so the next records go on naming it.
    broken: bool,
}

/// One append of a cluster in flight: counts down its [`Pending`] entry when done, and drops
/// it when the append failed or was abandoned, so the next append starts from the heads
/// this replica knows (and names a predecessor the tails can check) instead of from a
/// record that may not have been stored.
struct InFlight<'a, J: JetStream> {
    bus: &'a NatsBus<J>,
    cluster: Arc<str>,
    /// `None` when the entry was already dropped.
    generation: Option<u64>,
    stored: bool,
}

impl<J: JetStream> Drop for InFlight<'_, J> {
    fn drop(&mut self) {
        let Some(generation) = self.generation else { return };
        let mut pending = lock(&self.bus.pending);
        let Some(p) = pending.get_mut(&self.cluster) else { return };
        if p.generation != generation {
            return;
        }
        p.in_flight -= 1;
        if !self.stored {
            // Its records may be lost: the entry stays, for the next records to name the
            // tip (see `NatsBus::start_inner`).
            p.broken = true;
        } else if p.in_flight == 0 && !p.broken {
            pending.remove(&self.cluster);
        }
    }
}

impl<J: JetStream> NatsBus<J> {
    /// Publishes the records of one append and returns the future of their acks. Publishes
    /// of one cluster on this replica form a chain: each names the record published before
    /// it (`Fw-Prev`), so a record stored after one that was not is noticed by every
    /// replica's tail ([`Chain`]) and turned into a `resync-required`, which is what makes
    /// several appends of a session in flight safe: the agent is acked only up to the last
    /// batch whose predecessors were all stored, and its resend after a failure may be
    /// skipped as duplicates of a later stored batch, whose marker covers what was lost.
    pub(super) async fn start_inner(
        &self,
        cluster: Arc<str>,
        mut items: Vec<Append>,
    ) -> Result<BusFuture<'_, u64>, BusError> {
        self.usable()?;
        if self.adopting.load(Ordering::SeqCst) {
            return Err(BusError::Nats(NatsError::Publish {
                cluster: cluster.to_string(),
                cause: format!("the JetStream stream {} is being recreated; resend", self.stream),
            }));
        }
        cap_reasons(&mut items);
        // Every record stored from here on gets a sequence above this: an ack below it
        // comes from a stream that was recreated under this replica.
        let known = self.stream_last.load(Ordering::SeqCst);
        let pending = lock(&self.pending).get(&cluster).copied();
        // After an append failed, records continuing past what was published go on naming
        // the last published record, which may be lost: a batch the session had already
        // taken in (or another session of the agent on this replica) is then marked by the
        // tail if it is. Chained onto the stored head instead, it would follow it and be
        // delivered as events, and the agent's resend of the lost records would be skipped
        // as duplicates of it (seed 4726: a replaced session's failing batch dropped the
        // chain of the new session's batch in flight). A resend (from at or below the tip)
        // starts again from the stored head.
        let resend = |p: &Pending| items.first().is_some_and(|first| first.epoch != p.tip.0 || first.seq <= p.tip.1);
        // A broken tip the stored head covers (the agent resent it through another replica)
        // is not named any more either: that would only cost a resync.
        let covered = |p: &Pending| {
            p.in_flight == 0 && lock(&self.heads).get(&cluster).is_some_and(|h| h.epoch == p.tip.0 && h.seq >= p.tip.1)
        };
        let pending = pending.filter(|p| !(p.broken && (resend(p) || covered(p))));
        // The predecessor of the first record, with its offset when it is known stored.
        let (mut tip, mut tip_offset) = match pending {
            Some(p) => (Some(p.tip), None),
            None => {
                let known = lock(&self.heads).get(&cluster).copied();
                let head = match known {
                    Some(h) => Some(h),
                    // The hello read it a moment ago and the stream held nothing of the
                    // cluster: not asked again (in a connect storm of new clusters that was
                    // a second request per agent). Another replica appending meanwhile is
                    // no more hidden than one appending right after a second read: this
                    // batch's first record names no predecessor (`-`), and the tails
                    // deliver it as `resync-required` if one was stored before it.
                    None if lock(&self.absent).seen_now(&cluster, tokio::time::Instant::now()) => None,
                    None => self.head_of(&cluster).await?,
                };
                (head.map(|h| (h.epoch, h.seq)), head.map(|h| h.offset))
            }
        };
        if pending.is_none()
            && let Some(marker) = interleave_marker(tip, items.first())
        {
            tracing::warn!(stream = %self.stream, %cluster, "recording resync-required before a batch that follows another agent process's records");
            items.insert(0, marker);
        }
        // The stream's end as this replica knows it (`Fw-Known`): its acks and probes, its
        // tail, the cluster's head. Every record at or below it is stored already.
        let tail_last = if self.tail_started.load(Ordering::SeqCst) { self.core.last_offset() } else { 0 };
        let seen = known.max(tail_last).max(tip_offset.unwrap_or(0)).to_string();
        // Resends are skipped only up to what is known stored: a record of an append still
        // in flight is published again (JetStream's duplicate window drops the copy if the
        // first was stored). Skipped and answered at once, it was acked to the agent while
        // the publish in flight could still fail (seed 10074: a replaced session's batch
        // lost after the new session's resend of it had been acked).
        let stored = match pending {
            Some(_) => lock(&self.heads).get(&cluster).map(|h| (h.epoch, h.seq)),
            None => tip,
        };
        let mut fresh = Vec::with_capacity(items.len());
        for item in items {
            if let Some((ep, seq)) = stored
                && ep == item.epoch
                && item.seq <= seq
            {
                continue; // duplicate from a resend
            }
            fresh.push((tip, tip_offset.take(), item));
            tip = fresh.last().map(|(_, _, i)| (i.epoch, i.seq));
        }
        if fresh.is_empty() {
            return Ok(crate::ready(Ok(self.last_offset())));
        }

        // Publish back to back; the acks are awaited by the returned future.
        let subject = self.subject(&cluster);
        let mut acks = Vec::with_capacity(fresh.len());
        let mut keys = Vec::with_capacity(fresh.len());
        let mut refused = None;
        for (prev, prev_offset, item) in fresh {
            let mut headers = HeaderMap::new();
            headers.insert(H_EPOCH, item.epoch.to_string().as_str());
            headers.insert(H_SEQ, item.seq.to_string().as_str());
            let prev = match (prev, prev_offset) {
                (None, _) => "-".to_string(),
                (Some((e, s)), None) => format!("{e}/{s}"),
                (Some((e, s)), Some(offset)) => format!("{e}/{s}@{offset}"),
            };
            headers.insert(H_PREV, prev.as_str());
            headers.insert(H_KNOWN, seen.as_str());
            let (kind, payload, suffix) = match item.body {
                RecordBody::Event(b) => (KIND_EVENT, b, String::new()),
                // Markers of one (epoch, seq) differ by their reason: a hub stores one after
                // another process's records with the seq this process had reached, which an
                // earlier marker may have had too. A resend has the same reason.
                RecordBody::ResyncRequired(r) => {
                    let suffix = format!("/r{:016x}", fnv1a(r.as_bytes()));
                    (KIND_RESYNC, bytes::Bytes::from(r), suffix)
                }
            };
            headers.insert(H_KIND, kind);
            headers.insert(H_FORMAT, FORMAT_MARK);
            let id = format!("{}/{}/{}{suffix}", token(&cluster), item.epoch, item.seq);
            match self.js.publish(subject.clone(), headers, payload, id).await {
                Ok(ack) => {
                    acks.push(ack);
                    keys.push((item.epoch, item.seq));
                }
                Err(e) => {
                    // Nothing after a refused send was sent; earlier ones may be stored.
                    refused = Some(e.to_string());
                    break;
                }
            }
        }
        let generation = {
            let mut pending = lock(&self.pending);
            if refused.is_some() {
                // What was sent before the refusal may be lost: the next records name it.
                if let Some(&tip) = keys.last() {
                    let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                    let p = pending.entry(cluster.clone()).or_insert(Pending {
                        tip,
                        in_flight: 0,
                        generation,
                        broken: true,
                    });
                    p.tip = tip;
                    p.broken = true;
                } else if let Some(p) = pending.get_mut(&cluster) {
                    p.broken = true;
                }
                None
            } else {
                let generation = self.generation.fetch_add(1, Ordering::Relaxed);
                let tip = keys.last().copied().unwrap_or_default();
                let p =
                    pending.entry(cluster.clone()).or_insert(Pending { tip, in_flight: 0, generation, broken: false });
                p.tip = tip;
                p.in_flight += 1;
                // Published after a failure and naming its tip (or a resend from the
                // stored head): the chain goes on from here.
                p.broken = false;
                Some(p.generation)
            }
        };
        let guard = InFlight { bus: self, cluster: cluster.clone(), generation, stored: false };
        Ok(Box::pin(self.finish(guard, acks, keys, refused, known)))
    }

    /// Awaits the acks of one append's publishes (see [`NatsBus::start_inner`]).
    async fn finish<F>(
        &self,
        mut guard: InFlight<'_, J>,
        acks: Vec<F>,
        keys: Vec<(u64, u64)>,
        refused: Option<String>,
        known: u64,
    ) -> Result<u64, BusError>
    where
        F: std::future::Future<Output = Result<super::jetstream::PublishAck, String>>,
    {
        let cluster = guard.cluster.clone();
        let results = futures_util::future::join_all(acks).await;
        let mut last_offset = 0;
        let mut last_stored = None;
        let mut failure = refused;
        let base = self.base.load(Ordering::SeqCst);
        for (r, key) in results.into_iter().zip(keys) {
            match r {
                Ok(ack) if !ack.duplicate && ack.sequence + base <= known => {
                    // Numbered as by a stream that started again: JetStream lost its store
                    // and another replica recreated the stream before this one noticed.
                    // Not acked; the probe takes the new stream on, the agent resends.
                    self.recheck.notify_one();
                    failure.get_or_insert_with(|| {
                        format!("stored at sequence {} of a stream that was recreated meanwhile; resend", ack.sequence)
                    });
                }
                Ok(ack) => {
                    let offset = ack.sequence + base;
                    if offset >= last_offset {
                        last_offset = offset;
                        last_stored = Some(key);
                    }
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        // The agent process of the cluster's head this replica knew before: a head of
        // another one is recorded at once (see `HeadPacing::hurry`).
        let known_epoch = lock(&self.heads).get(&cluster).map(|h| h.epoch);
        if let Some((epoch, seq)) = last_stored {
            // Stored, whatever else failed: resends of it are duplicates (a marker at the
            // first record stored after a lost one covers what was lost).
            self.stream_last.fetch_max(last_offset, Ordering::Relaxed);
            self.note_head(&cluster, Head { epoch, seq, offset: last_offset });
        }
        if let Some(cause) = failure {
            // Records of it may be stored without this replica knowing (an ack lost, or a
            // publish its client kept while the link was down and sends once it is back):
            // their head is read and recorded once the link works (see `Uncertain`).
            lock(&self.uncertain).failed(&cluster, tokio::time::Instant::now());
            // The stream may be gone: the probe looks now rather than within a second.
            self.recheck.notify_one();
            self.write_failures.fetch_add(1, Ordering::Relaxed);
            return Err(self.fail(NatsError::Publish { cluster: cluster.to_string(), cause }));
        }
        guard.stored = true;
        drop(guard);
        if let Some((epoch, seq)) = last_stored {
            keep_latest(&mut lock(&self.dirty_heads), &cluster, Head { epoch, seq, offset: last_offset });
            // Only after another process's head: a cluster's first records (nothing known
            // before) stay paced, or a connect storm of new agents would write every head
            // at once (a session of another process still learns within the delay).
            if known_epoch.is_some_and(|known| known != epoch) {
                lock(&self.head_pacing).hurry(&cluster);
            }
        }
        // A reader on this replica sees what was just acked; without one, nothing waits.
        if self.tail_started.load(Ordering::SeqCst) {
            self.wait_local(last_offset).await.map_err(|e| self.fail(e))?;
        }
        Ok(last_offset)
    }
}

/// The `resync-required` stored before a batch of events whose first record would follow
/// `tip`, the cluster's stored head, when that head is a record of another agent process.
/// Only another process appending through another replica makes it so (on a shared bus a
/// new process begins with its own "agent started" marker, never coalesced, and one
/// resuming after another's records gets the resume marker first): its records stored
/// after this one's latest may carry older states than this one reported (it listed
/// before this one's latest changes and sent later), and this one sends an object again
/// only when it changes. Answered at the append, not only by the session's idle-time
/// head check, which comes too late while this process keeps appending (seed 56434:
/// its next record chained onto the other's stale state and everything followed it). The
/// marker takes the seq before the batch's first and its reason names the other head, so
/// a resend of the batch has the same message id (JetStream drops the copy).
fn interleave_marker(tip: Option<(u64, u64)>, first: Option<&Append>) -> Option<Append> {
    let (epoch, seq) = tip?;
    let first = first?;
    if epoch == first.epoch || !matches!(first.body, RecordBody::Event(_)) {
        return None;
    }
    let reason = format!(
        "another agent process of this cluster (epoch {epoch}, up to seq {seq}) stored events after the latest \
         of this one (epoch {}) through another hub replica: they may be older than what this one reported",
        first.epoch
    );
    Some(Append { epoch: first.epoch, seq: first.seq.saturating_sub(1), body: RecordBody::ResyncRequired(reason) })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A batch whose first event would follow another agent process's head gets a marker
    /// before it; its own head, no head, or a marker of its own first need none.
    #[test]
    fn a_batch_following_another_agent_process_is_preceded_by_a_marker() {
        let ev = |epoch, seq| Append { epoch, seq, body: RecordBody::Event(bytes::Bytes::from_static(b"{}")) };
        let marker = interleave_marker(Some((2, 13)), Some(&ev(1, 53))).expect("another process's head");
        assert_eq!((marker.epoch, marker.seq), (1, 52), "the seq before the batch");
        assert!(matches!(marker.body, RecordBody::ResyncRequired(ref r) if r.contains("epoch 2, up to seq 13")));
        assert!(interleave_marker(Some((1, 52)), Some(&ev(1, 53))).is_none(), "its own head");
        assert!(interleave_marker(None, Some(&ev(1, 53))).is_none(), "no head");
        let own = Append { epoch: 1, seq: 1, body: RecordBody::ResyncRequired("agent started".into()) };
        assert!(interleave_marker(Some((2, 13)), Some(&own)).is_none(), "a marker of its own answers already");
    }
}
