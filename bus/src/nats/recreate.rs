//! A stream JetStream lost, recreated as the continuation of this bus, and taken on by
//! every replica.
//!
//! The probe finds the stream missing (for a second: not a server still starting) and
//! recreates it as the continuation of this bus ([`NatsBus::recreate`]): the same bus id,
//! offsets = stream sequence + a base above every offset this replica knew
//! ([`super::state::next_base`]), both in the stream's description, which is created with the
//! stream in one step, so whichever replica creates it decides for all ([`super::state`]).
//! Every replica takes the new stream on ([`NatsBus::adopt`]; the others notice its new
//! creation time): buckets created again, the cursor store's meta entry (names lost),
//! `resync-required` `*` ("the JetStream stream was recreated empty") published with one
//! message id so JetStream keeps it once, the local tail restarted above the old offsets
//! (readers go on from their cursors into the marker), appends refused until then. An ack
//! numbered below what this replica knew fails its append (the stream was recreated
//! before this replica noticed). NATS 2.9 streams cannot start at a chosen sequence
//! (`first_seq` is 2.10), hence the base here. A stream recreated by a hub that did not
//! know the bus (a new bus id, offsets from 1) would repeat offsets: the replica refuses to
//! go on (health, appends, reads fail, "restart this hub replica") and [`Bus::fatal`] makes
//! the hub exit so its supervisor starts it again; a hub that finds no
//! stream at start waits [`NatsOptions::missing_stream_wait`] for a running replica to
//! recreate it first.

use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::ALL_CLUSTERS;

use super::jetstream::{HeaderMap, JetStream, JsError, StreamInfo};
use super::records::{FORMAT_MARK, H_EPOCH, H_FORMAT, H_KIND, H_PREV, H_SEQ, KIND_RESYNC, token};
use super::setup::{bucket_spec, ensure_bucket, ensure_meta, fleet_spec, wanted_spec};
use super::state::{Lineage, Meta, NATS_FORMAT};
use super::tail::StreamState;
use super::{NatsBus, NatsError, REPLICA_TTL, lock, state};

/// How long the stream must be found missing before it is recreated.
pub(super) const MISSING_CONFIRM: Duration = Duration::from_secs(1);

/// The reason of the `resync-required` `*` recorded in a recreated stream.
pub const RECREATED: &str = "the JetStream stream was recreated empty";

/// Which bus the stream continues: its description's lineage, or (a stream created fresh)
/// a new bus id from its creation time with offsets equal to stream sequences.
pub(super) fn lineage_of(stream: &str, info: &StreamInfo) -> Lineage {
    info.description
        .as_deref()
        .and_then(state::parse_lineage)
        .unwrap_or_else(|| Lineage { id: format!("{stream}-{:x}", info.created_ns), base: 0 })
}

impl<J: JetStream> NatsBus<J> {
    /// The highest offset this replica knows to exist (acks, probes, its tail, heads).
    pub(super) fn known_last(&self) -> u64 {
        let heads = lock(&self.heads).values().map(|h| h.offset).max().unwrap_or(0);
        let tail = if self.tail_started.load(Ordering::SeqCst) { self.core.last_offset() } else { 0 };
        self.stream_last.load(Ordering::SeqCst).max(heads).max(tail)
    }

    /// JetStream lost the stream (NATS restarted with an empty store): creates it again as
    /// the continuation of this bus — the same bus id, offsets above every offset this
    /// replica knew (its description says so, see [`super::state`]) — and takes it on. Another
    /// replica may have been first: then its stream is taken on.
    pub(super) async fn recreate(&self) -> Result<(), NatsError> {
        if let Some(cause) = lock(&self.poisoned).clone() {
            // Its offsets are not to be trusted (its readers were released at the end of
            // all offsets): recreating from them would start at the end of the numbering
            // (the simulation found it: an overflow in a debug build).
            return Err(self.stream_error(cause));
        }
        let lineage = Lineage { id: self.stream_id.clone(), base: super::state::next_base(self.known_last()) };
        let mut spec = wanted_spec(&self.opts);
        spec.description = state::describe(Some(&lineage));
        tracing::warn!(stream = %self.stream, base = lineage.base, "the JetStream stream is gone (NATS lost its store?): recreating it");
        let refused = self.js.create_stream(&spec).await.err();
        let info = self.js.stream_info().await.map_err(|e| {
            self.stream_error(match refused {
                Some(c) => format!("cannot recreate the stream: {c}"),
                None => format!("stream info after recreating it: {e}"),
            })
        })?;
        if info.created_ns == *lock(&self.created) {
            // It was there after all (a server still starting up answered "not found").
            return Ok(());
        }
        self.adopt(info).await
    }

    /// Takes on a stream that was recreated (by this replica or another): the buckets are
    /// created again where they went with it, a cursor store found without its meta entry
    /// is marked as having lost names, the `resync-required` `*` is recorded once (every
    /// replica publishes it with the same message id, JetStream keeps one), and offsets
    /// continue above the old ones — a subscriber reading on from an old cursor reads the
    /// marker next. Until done, appends are refused.
    pub(super) async fn adopt(&self, info: StreamInfo) -> Result<(), NatsError> {
        let lineage = lineage_of(&self.stream, &info);
        let known = self.known_last();
        // A stream this replica began taking on holds offsets above its base that this
        // replica knows from it (its marker, its tail): not ones handed out below it.
        // Superseding it then would drop it (and every record stored meanwhile) after any
        // failure part way, e.g. its tail's consumer not created under load.
        let retry = *lock(&self.taking_on) == Some(info.created_ns);
        if lineage.id == self.stream_id && lineage.base < known && !retry {
            return self.supersede(&info, &lineage, known).await;
        }
        if lineage.id != self.stream_id {
            let cause = format!(
                "the JetStream stream {} was recreated by a hub that did not know bus {} (bus {}, offsets from {}, while \
                 this replica handed out offsets up to {known}): restart this hub replica",
                self.stream,
                self.stream_id,
                lineage.id,
                lineage.base + 1
            );
            tracing::error!(%cause, "bus unusable");
            *lock(&self.poisoned) = Some(cause.clone());
            // Readers waiting for more read now and fail, so their sessions end and the
            // subscribers reconnect (to a replica that works, or to this one restarted).
            self.core.announce(u64::MAX);
            self.release_local();
            return Err(self.stream_error(cause));
        }
        self.adopting.store(true, Ordering::SeqCst);
        *lock(&self.taking_on) = Some(info.created_ns);
        self.adopt_now(&info, &lineage).await?;
        *lock(&self.created) = info.created_ns;
        self.adopting.store(false, Ordering::SeqCst);
        tracing::warn!(stream = %self.stream, base = lineage.base, "taken on the recreated JetStream stream: offsets continue above {}; subscribers get resync-required *", lineage.base);
        Ok(())
    }

    /// The stream continues this bus but numbers its records from below offsets this
    /// replica handed out: another replica recreated it from what it knew before it had
    /// taken on an earlier recreation (JetStream lost its store twice in a short time, or
    /// lost a stream it had just recreated). Taking it on would repeat offsets, and readers
    /// going on from a cursor this replica gave them would skip its first records — its
    /// `resync-required *` among them — silently; refusing for good would keep this replica
    /// unready until restarted. So the replica that knows more recreates the stream once
    /// more, above every offset it knows (its own and the short-lived stream's): what was
    /// stored in the short-lived stream goes with it, and the new stream's `*`, which every
    /// reader reads next from any cursor it holds, tells them so. Only the stream this
    /// replica looked at is deleted: one superseded meanwhile by another replica is taken on
    /// (or superseded in turn) at the next probe.
    pub(super) async fn supersede(&self, info: &StreamInfo, lineage: &Lineage, known: u64) -> Result<(), NatsError> {
        // Appends are refused until a stream is taken on (see `adopt`).
        self.adopting.store(true, Ordering::SeqCst);
        self.stream_last.fetch_max(info.state.last_sequence + lineage.base, Ordering::SeqCst);
        tracing::warn!(
            stream = %self.stream,
            base = lineage.base,
            known,
            "the JetStream stream was recreated below offsets this replica handed out (by a replica that had not taken on an earlier recreation): recreating it above them"
        );
        let created = info.created_ns;
        match self.js.stream_info().await {
            Ok(now) if now.created_ns != created => return Ok(()),
            Ok(now) => {
                self.stream_last.fetch_max(now.state.last_sequence + lineage.base, Ordering::SeqCst);
                match self.js.delete_stream().await {
                    Ok(()) | Err(JsError::NotFound) => {}
                    Err(e) => return Err(self.stream_error(format!("cannot delete the stream to recreate it: {e}"))),
                }
            }
            Err(JsError::NotFound) => {}
            Err(e) => return Err(self.stream_error(format!("stream info: {e}"))),
        }
        // Boxed: recreating takes the new stream on, which may supersede again.
        Box::pin(self.recreate()).await
    }

    pub(super) async fn adopt_now(&self, info: &StreamInfo, lineage: &Lineage) -> Result<(), NatsError> {
        // Offsets up to the new stream's base count as handed out from here on, before
        // anything below can fail: a replica that lost the stream again before it finished
        // taking this one on must recreate it above this base, not at it (seed 9427: it
        // recreated at the same base, and its offsets repeated ones another replica had
        // handed out of the first recreation).
        self.stream_last.fetch_max(lineage.base, Ordering::SeqCst);
        // The key-value handles name their buckets: they work on buckets created again.
        let replicas = self.opts.replicas;
        ensure_bucket(&self.js, &bucket_spec(&self.heads_bucket, replicas, Duration::ZERO)).await?;
        ensure_bucket(&self.js, &bucket_spec(&self.cursors_bucket, replicas, Duration::ZERO)).await?;
        ensure_bucket(&self.js, &bucket_spec(&self.replicas_bucket, replicas, REPLICA_TTL)).await?;
        ensure_bucket(&self.js, &fleet_spec(&self.fleet_bucket, replicas)).await?;
        // The fleet bucket may be new and empty: the hub writes its clusters again and
        // follows the bucket afresh (see `ReplicaShare::buckets_generation`).
        self.buckets_generation.fetch_add(1, Ordering::SeqCst);
        // Recreated under a bus with history: names not in it may have existed.
        ensure_meta(
            &self.cursors_kv,
            &self.cursors_bucket,
            Meta { names_lost: true, begun_after_wait: false, format: NATS_FORMAT },
        )
        .await?;
        self.publish_recreated_marker(lineage.base).await?;
        let _starting = self.tail_starting.lock().await;
        if let Ok(_log) = self.core.log.write() {
            // The old stream's consumer ingests nothing more.
            self.tail_generation.fetch_add(1, Ordering::SeqCst);
            self.base.store(lineage.base, Ordering::SeqCst);
        }
        self.stream_last.fetch_max(info.state.last_sequence + lineage.base, Ordering::SeqCst);
        *lock(&self.stream_state) = StreamState::of(&info.state, lineage.base);
        // Appends in flight chained onto records of the old stream.
        lock(&self.pending).clear();
        if self.tail_started.load(Ordering::SeqCst) {
            self.spawn_tail().await?;
        }
        Ok(())
    }

    /// Records `resync-required` `*` in a recreated stream, as its first record unless
    /// appends of replicas that had not noticed yet came first (then right after them).
    pub(super) async fn publish_recreated_marker(&self, base: u64) -> Result<(), NatsError> {
        let mut headers = HeaderMap::new();
        headers.insert(H_EPOCH, "0");
        headers.insert(H_SEQ, base.to_string().as_str());
        headers.insert(H_KIND, KIND_RESYNC);
        headers.insert(H_PREV, "-");
        headers.insert(H_FORMAT, FORMAT_MARK);
        let reason = format!("{RECREATED}: the records before offset {} are lost", base + 1);
        let id = format!("{}/recreated/{base}", token(ALL_CLUSTERS));
        let failed = |e: String| NatsError::Publish { cluster: ALL_CLUSTERS.into(), cause: e };
        let ack = self.js.publish(self.subject(ALL_CLUSTERS), headers, reason.into(), id).await.map_err(failed)?;
        ack.await.map_err(failed)?;
        self.marker_base.store(base, Ordering::SeqCst);
        Ok(())
    }
}
