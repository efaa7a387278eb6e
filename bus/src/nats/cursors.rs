//! Durable subscriptions on JetStream: each identity's cursors in the key-value bucket
//! `<stream>_cursors`, changed with compare-and-set.
//!
//! The issue suggested one JetStream durable consumer per durable name. That does not fit
//! the [`Bus`] contract: a registration may store a *lower* cursor, which a consumer's ack
//! floor cannot express without deleting and recreating it; moving a cursor would need every
//! record delivered through that consumer a second time (the fan-out is already local); and
//! a subscriber acks many times a second, which would be one consumer update per ack. So a
//! cursor is a stream sequence stored in the `<stream>_cursors` bucket, one entry per
//! identity (its names and cursors, bounded like the embedded store), updated with
//! compare-and-set. Registrations are written at once; cursor moves are kept in memory and
//! written every second by the hub's housekeeping ([`Bus::flush`]), as the segment
//! log does. A registration stores a random id with the name, and a move is written only
//! if the name still has the registration it was made under ([`Cursors::current`]): a
//! subscriber that moved to another replica and registered there (maybe lower, as the
//! contract allows) is not overtaken by what the old replica had not written yet.
//!
//! The bucket's entry `meta.bus` ([`Meta`]) is created with the bucket: `names_lost` when
//! the bus already had history then (the bucket was recreated), or when the stream was
//! created after a wait for a missing one (JetStream may have lost its store while no
//! replica that knew the bus ran; a new bus has no record of it). The creator says so in
//! the stream's description, so a replica that found the stream at once writes the same. A name not found while it
//! says so, or while it is missing (the bucket was lost after this replica opened it), is
//! [`Lookup::Lost`]: the subscriber gets `resync-required` `*` instead of being taken for a
//! new one and placed after the loss.

use std::sync::atomic::Ordering;

use crate::BusError;
use crate::cursors::{DurableError, MAX_NAME_BYTES};

use super::jetstream::{CreateError, JetStream, KeyValue};
use super::records::token;
use super::state::{Cursors, META_KEY, Meta, newer_format};
use super::{CAS_ATTEMPTS, NatsBus, NatsError};

pub(super) fn check_name(name: &str) -> Result<(), DurableError> {
    if name.len() > MAX_NAME_BYTES {
        return Err(DurableError::NameTooLong { len: name.len() });
    }
    Ok(())
}

impl<J: JetStream> NatsBus<J> {
    /// One identity's cursors and the entry's revision. An entry written for another bus
    /// (by a replica of the bus this one replaced, or of a bus begun under this one) reads
    /// as empty: its offsets mean nothing here, and its names count as lost (seed 9866: a
    /// replica flushed a cursor of the old bus into the new bus's bucket, and the subscriber
    /// resumed at that offset of the new bus, past its first records).
    pub(super) async fn cursor_entry(&self, identity: &str) -> Result<(Cursors, Option<u64>), BusError> {
        let entry = self.cursors_kv.entry(&token(identity)).await.map_err(|e| self.cursor_err(identity, e))?;
        Ok(match entry {
            Some(e) if e.is_put => {
                let cursors = Cursors::parse(&e.value).map_err(|found| {
                    let what = format!("the durable cursors of {identity} in bucket {}", self.cursors_bucket);
                    self.refuse_newer(newer_format(&what, &found))
                })?;
                if cursors.bus.as_deref().is_some_and(|bus| bus != self.stream_id) {
                    (Cursors::default(), Some(e.revision))
                } else {
                    (cursors, Some(e.revision))
                }
            }
            Some(e) => (Cursors::default(), Some(e.revision)),
            None => (Cursors::default(), None),
        })
    }

    /// Whether names not in the cursor store may have existed: its meta entry says so, or
    /// is missing (the bucket was lost after this replica opened it).
    pub(super) async fn names_lost(&self) -> Result<bool, BusError> {
        let meta = self.cursors_kv.get(META_KEY).await.map_err(|e| {
            BusError::Nats(NatsError::KeyValue {
                bucket: self.cursors_bucket.clone(),
                cause: format!("read the meta entry: {e}"),
            })
        })?;
        let meta = meta.and_then(|m| serde_json::from_slice::<Meta>(&m).ok());
        self.lost_names_begun.store(meta.is_some_and(|m| m.begun_after_wait), Ordering::Relaxed);
        Ok(meta.is_none_or(|m| m.names_lost))
    }

    pub(super) fn cursor_err(&self, identity: &str, e: impl std::fmt::Display) -> BusError {
        BusError::Nats(NatsError::KeyValue {
            bucket: self.cursors_bucket.clone(),
            cause: format!("cursors of {identity}: {e}"),
        })
    }

    /// Changes one identity's cursors with compare-and-set.
    pub(super) async fn update_cursors(
        &self,
        identity: &str,
        change: impl Fn(&mut Cursors) -> Result<(), DurableError>,
    ) -> Result<(), BusError> {
        for _ in 0..CAS_ATTEMPTS {
            // An entry of another bus reads as empty (see `cursor_entry`) and is written
            // over with this bus's: whichever replica serves the bus that is gone stops once
            // its probe finds the other (a refusal here kept a replica of the new bus from
            // registering a durable name at all: seed 1593).
            let (mut names, revision) = self.cursor_entry(identity).await?;
            change(&mut names)?;
            names.bus = Some(self.stream_id.clone());
            let value: bytes::Bytes = serde_json::to_vec(&names).unwrap_or_default().into();
            let key = token(identity);
            let written = match revision {
                Some(rev) => self.cursors_kv.update(&key, value, rev).await.map(|_| ()).map_err(|e| e.to_string()),
                None => self.cursors_kv.create(&key, value).await.map(|_| ()).map_err(|e: CreateError| e.to_string()),
            };
            match written {
                Ok(()) => return Ok(()),
                Err(e) => tracing::debug!(identity, error = %e, "cursor entry changed meanwhile; retrying"),
            }
        }
        Err(self.cursor_err(identity, "kept changing on every attempt"))
    }
}
