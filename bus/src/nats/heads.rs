//! Cluster heads: the (epoch, seq, offset) of each cluster's latest record, for agents
//! resuming on any replica, and their key-value bucket `<stream>_heads`.
//!
//! An agent that says hello gets its cluster's head from the stream's last message on the
//! cluster's subject (one request to the stream leader; the bucket is read only when the
//! stream holds nothing of the cluster), or the local tail's if later: right after another
//! replica acked a batch and died, this replica's tail may not have the batch yet and the
//! bucket may be a second old, but the stream has it. Appends filter resends by the head
//! this replica knows (its own appends in flight, its acks and its tail); a resend it does
//! not recognise is dropped by JetStream's duplicate window.
//!
//! The bucket is written coalesced, once a second ([`Bus::flush_cursors`](crate::Bus::flush_cursors)), with
//! compare-and-set on the revision this replica wrote last, so a head of a newer format
//! written meanwhile is read, and refused, before it is written over.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use serde::{Deserialize, Serialize};

use crate::BusError;

use super::jetstream::{JetStream, KeyValue};
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

pub(super) async fn load_heads<K: KeyValue>(store: &K, bucket: &str) -> Result<HashMap<Arc<str>, Head>, NatsError> {
    let err = |cause: String| NatsError::KeyValue { bucket: bucket.into(), cause };
    let names = store.keys().await.map_err(|e| err(format!("cannot list heads: {e}")))?;
    let mut heads = HashMap::new();
    for key in names {
        let Some(cluster) = untoken(&key) else { continue };
        if let Some(v) = store.get(&key).await.map_err(|e| err(format!("cannot read head {key}: {e}")))? {
            match parse_head(&v) {
                Ok(Some(h)) => {
                    heads.insert(Arc::from(cluster), h);
                }
                Ok(None) => {}
                Err(found) => return Err(err(newer_format(&format!("the head of cluster {cluster}"), &found))),
            }
        }
    }
    Ok(heads)
}

impl<J: JetStream> NatsBus<J> {
    /// The cluster's head: the later (by offset) of the stream's last message on the
    /// cluster's subject — or the key-value entry when the stream holds none of it — and
    /// what this replica saw.
    pub(super) async fn head_of(&self, cluster: &str) -> Result<Option<Head>, BusError> {
        let subject = self.subject(cluster);
        let found = match self.js.last_by_subject(&subject).await {
            Ok(Some(msg)) => {
                let offset = msg.sequence + self.base.load(Ordering::SeqCst);
                if let Err(found) = readable_mark(msg.headers.get(H_FORMAT).map(|v| v.as_str())) {
                    let what = format!("the last record of cluster {cluster} (offset {offset})");
                    return Err(self.refuse_newer(newer_format(&what, &found)));
                }
                head_from_headers(&msg.headers, offset)
            }
            // The bucket only matters once the stream holds nothing of the cluster: while it
            // does, its last record is at least as new as anything the bucket was given.
            Ok(None) => {
                let stored = self.heads_kv.get(&token(cluster)).await.map_err(|e| {
                    self.fail(NatsError::KeyValue {
                        bucket: self.heads_bucket.clone(),
                        cause: format!("read head of {cluster}: {e}"),
                    })
                })?;
                match stored.map(|b| parse_head(&b)).transpose() {
                    Ok(h) => h.flatten(),
                    Err(found) => {
                        let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                        return Err(self.refuse_newer(newer_format(&what, &found)));
                    }
                }
            }
            Err(e) => {
                return Err(self.fail(NatsError::Stream {
                    stream: self.stream.clone(),
                    cause: format!("read the last record of {cluster}: {e}"),
                }));
            }
        };
        if let Some(h) = found {
            self.note_head(&cluster.into(), h);
        }
        Ok(lock(&self.heads).get(cluster).copied())
    }

    /// Writes the heads appended since the last call to the bucket; what fails is kept
    /// for the next call (unless a later head replaced it meanwhile).
    pub(super) async fn flush_heads(&self) -> Result<(), BusError> {
        self.usable()?;
        let pending: Vec<(Arc<str>, Head)> = std::mem::take(&mut *lock(&self.dirty_heads)).into_iter().collect();
        if pending.is_empty() {
            return Ok(());
        }
        let puts = pending.iter().map(|(cluster, h)| async move {
            let value: bytes::Bytes =
                serde_json::to_vec(&StoredHead { head: h, format: NATS_FORMAT }).unwrap_or_default().into();
            self.write_head(cluster, value).await
        });
        let results = futures_util::future::join_all(puts).await;
        let mut failure = None;
        let mut dirty = lock(&self.dirty_heads);
        for ((cluster, h), r) in pending.into_iter().zip(results) {
            match r {
                Ok(()) => {}
                Err(HeadWrite::Newer(why)) => {
                    drop(dirty);
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

    /// Writes one head: compare-and-set on the revision this replica wrote last; when the
    /// value changed since (or this replica has not written it), the value there is read
    /// first, and one of a newer format is not written over.
    async fn write_head(&self, cluster: &Arc<str>, value: bytes::Bytes) -> Result<(), HeadWrite> {
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
                if e.is_put
                    && let Err(found) = parse_head(&e.value)
                {
                    let what = format!("the head of cluster {cluster} in bucket {}", self.heads_bucket);
                    return Err(HeadWrite::Newer(newer_format(&what, &found)));
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
