//! Replica sharing ([`ReplicaShare`]) on JetStream: one key-value entry per cluster in
//! `<stream>_fleet` (key: the cluster's token, see `records`), written on change by the
//! replica its agent is connected to and followed by every replica; and one small heartbeat
//! per replica in `<stream>_replicas`, expiring after [`REPLICA_TTL`].
//!
//! Until this layout, each replica wrote its whole cluster list as one value of
//! `<stream>_replicas` every few seconds: at 50,000 clusters that value is about 8 MB, above
//! NATS's 1 MB payload limit, so sharing failed and the other replicas' clusters vanished
//! from the admin API. [`ReplicaShare::replicas`] still hands such a value (a JSON array)
//! to the hub, which shows it during a rolling upgrade.

use std::time::Duration;

use bytes::Bytes;
use futures_util::StreamExt;

use crate::{BusError, BusFuture, EntryEvent, EntryStream, Expect, HeadEvent, HeadStream, ReplicaShare, Written};

use super::heads::parse_head;
use super::jetstream::{CreateError, JetStream, KeyValue, KvFollow, UpdateError};
use super::records::{token, untoken};
use super::{FLEET_ENTRY_BYTES, FLEET_MAX_AGE, NatsBus, NatsError};

impl<J: JetStream> NatsBus<J> {
    fn kv_error(&self, bucket: &str, cause: String) -> BusError {
        BusError::Nats(NatsError::KeyValue { bucket: bucket.into(), cause })
    }
}

impl<J: JetStream> ReplicaShare for NatsBus<J> {
    fn heartbeat<'a>(&'a self, replica: &'a str, value: Bytes) -> BusFuture<'a, ()> {
        Box::pin(async move {
            self.replicas_kv
                .put(&token(replica), value)
                .await
                .map(|_| ())
                .map_err(|e| self.kv_error(&self.replicas_bucket, format!("write the heartbeat of {replica}: {e}")))
        })
    }

    fn replicas(&self) -> BusFuture<'_, Vec<(String, Bytes)>> {
        Box::pin(async move {
            let err = |e: String| self.kv_error(&self.replicas_bucket, format!("read the heartbeats: {e}"));
            let keys = self.replicas_kv.keys().await.map_err(err)?;
            let mut out = Vec::with_capacity(keys.len());
            for key in keys {
                let Some(name) = untoken(&key) else { continue };
                // Expired between the two requests: not live.
                if let Some(v) = self.replicas_kv.get(&key).await.map_err(err)? {
                    out.push((name, v));
                }
            }
            Ok(out)
        })
    }

    fn write_entry<'a>(&'a self, cluster: &'a str, value: Bytes, expect: Expect) -> BusFuture<'a, Written> {
        Box::pin(async move {
            let key = token(cluster);
            let err =
                |e: String| self.kv_error(&self.fleet_bucket, format!("write the entry of cluster {cluster}: {e}"));
            match expect {
                Expect::Any => self.fleet_kv.put(&key, value).await.map(Written::Stored).map_err(err),
                Expect::Absent => match self.fleet_kv.create(&key, value).await {
                    Ok(rev) => Ok(Written::Stored(rev)),
                    Err(CreateError::AlreadyExists) => Ok(Written::Moved),
                    Err(CreateError::Other(e)) => Err(err(e)),
                },
                Expect::Revision(rev) => match self.fleet_kv.update(&key, value, rev).await {
                    Ok(rev) => Ok(Written::Stored(rev)),
                    Err(UpdateError::WrongRevision) => Ok(Written::Moved),
                    Err(UpdateError::Other(e)) => Err(err(e)),
                },
            }
        })
    }

    fn follow_entries(&self) -> BusFuture<'_, EntryStream> {
        Box::pin(async move {
            let bucket = self.fleet_bucket.clone();
            let follow =
                self.fleet_kv.follow().await.map_err(|e| self.kv_error(&bucket, format!("follow the entries: {e}")))?;
            let stream = follow.filter_map(move |item| {
                let out = match item {
                    Ok(KvFollow::CaughtUp) => Some(Ok(EntryEvent::CaughtUp)),
                    Ok(KvFollow::Change(c)) => untoken(&c.key).map(|cluster| {
                        // A delete or purge reads as an empty entry.
                        let value = if c.is_put { c.value } else { Bytes::new() };
                        Ok(EntryEvent::Entry { cluster, value, revision: c.revision, written_ms: c.written_ms })
                    }),
                    Err(cause) => Some(Err(BusError::Nats(NatsError::KeyValue {
                        bucket: bucket.clone(),
                        cause: format!("follow the entries: {cause}"),
                    }))),
                };
                std::future::ready(out)
            });
            Ok(Box::pin(stream) as EntryStream)
        })
    }

    fn max_entry_bytes(&self) -> usize {
        // The bucket's bound counts the message: room for the subject and headers.
        FLEET_ENTRY_BYTES - 1024
    }

    fn entry_max_age(&self) -> Duration {
        FLEET_MAX_AGE
    }

    fn generation(&self) -> u64 {
        self.buckets_generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    fn follow_heads(&self) -> BusFuture<'_, HeadStream> {
        Box::pin(async move {
            let bucket = self.heads_bucket.clone();
            let follow =
                self.heads_kv.follow().await.map_err(|e| self.kv_error(&bucket, format!("follow the heads: {e}")))?;
            let stream = follow.filter_map(move |item| {
                let out = match item {
                    Ok(KvFollow::CaughtUp) => None,
                    // A delete, a damaged value or one of a newer format (refused where it
                    // is read for a hello or a tail) tells nothing here.
                    Ok(KvFollow::Change(c)) if c.is_put => untoken(&c.key).and_then(|cluster| {
                        let head = parse_head(&c.value).ok().flatten()?;
                        Some(Ok(HeadEvent { cluster, epoch: head.epoch, seq: head.seq }))
                    }),
                    Ok(KvFollow::Change(_)) => None,
                    Err(cause) => Some(Err(BusError::Nats(NatsError::KeyValue {
                        bucket: bucket.clone(),
                        cause: format!("follow the heads: {cause}"),
                    }))),
                };
                std::future::ready(out)
            });
            Ok(Box::pin(stream) as HeadStream)
        })
    }
}
