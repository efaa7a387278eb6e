//! Replica sharing: each replica's cluster list in the key-value bucket `<stream>_replicas`,
//! rewritten every few seconds and expiring after [`REPLICA_TTL`], so `/api/v1/clusters` on
//! any replica shows the whole fleet and where each agent is connected.

use crate::{BusError, BusFuture, ReplicaShare};

use super::jetstream::{JetStream, KeyValue};
use super::records::{token, untoken};
use super::{NatsBus, NatsError};

/// Each replica's cluster list in the `<stream>_replicas` bucket, one entry per replica,
/// expiring after [`REPLICA_TTL`] without a write.
impl<J: JetStream> ReplicaShare for NatsBus<J> {
    fn share_clusters<'a>(&'a self, replica: &'a str, clusters: serde_json::Value) -> BusFuture<'a, ()> {
        Box::pin(async move {
            let value = serde_json::to_vec(&clusters).unwrap_or_default();
            self.replicas_kv.put(&token(replica), value.into()).await.map(|_| ()).map_err(|e| {
                BusError::Nats(NatsError::KeyValue {
                    bucket: self.replicas_bucket.clone(),
                    cause: format!("share the clusters of {replica}: {e}"),
                })
            })
        })
    }

    fn shared_clusters<'a>(&'a self, replica: &'a str) -> BusFuture<'a, Vec<(String, serde_json::Value)>> {
        Box::pin(async move {
            let err =
                |e: String| BusError::Nats(NatsError::KeyValue { bucket: self.replicas_bucket.clone(), cause: e });
            let keys = self.replicas_kv.keys().await.map_err(err)?;
            let mut out = Vec::new();
            let own = token(replica);
            for key in keys {
                if key == own {
                    continue;
                }
                let Some(name) = untoken(&key) else { continue };
                if let Some(v) = self.replicas_kv.get(&key).await.map_err(err)?
                    && let Ok(clusters) = serde_json::from_slice(&v)
                {
                    out.push((name, clusters));
                }
            }
            Ok(out)
        })
    }
}
