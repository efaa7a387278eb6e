//! The simulated JetStream's key-value buckets: revisions are the bucket's sequence, one
//! value per key (history 1), compare-and-set (create fails if the key has a value, update
//! fails on another revision), entries expiring after the bucket's age, values and the
//! bucket bounded in bytes as their spec says, and following every key (its latest value,
//! then caught up, then each change), as async-nats's watch does.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Bytes;
use fleetwatch_bus::nats::jetstream::{BucketSpec, CreateError, KeyValue, KvChange, KvEntry, KvFollow, UpdateError};

use super::{SimJs, lock, not_found, now};

/// One bucket in the server's store.
#[derive(Default)]
pub(super) struct Bucket {
    /// Key → (value, revision, when written).
    entries: BTreeMap<String, (Bytes, u64, Duration)>,
    revision: u64,
    max_age: Duration,
    /// Largest value (`None`: no bound).
    max_value: Option<usize>,
    /// Most bytes of values (`None`: no bound).
    max_bytes: Option<u64>,
}

impl Bucket {
    pub(super) fn new(spec: &BucketSpec) -> Self {
        Self {
            max_age: spec.max_age,
            max_value: spec.max_value_size.and_then(|n| usize::try_from(n).ok()),
            max_bytes: spec.max_bytes.and_then(|n| u64::try_from(n).ok()),
            ..Self::default()
        }
    }

    fn live(&self, key: &str, now: Duration) -> Option<&(Bytes, u64, Duration)> {
        self.entries.get(key).filter(|(_, _, t)| self.is_live(*t, now))
    }

    fn is_live(&self, written: Duration, now: Duration) -> bool {
        self.max_age.is_zero() || now.saturating_sub(written) <= self.max_age
    }

    /// Writes the value if it is within the bounds (the store refuses it otherwise).
    fn write(&mut self, key: &str, value: Bytes, now: Duration) -> Result<u64, String> {
        if self.max_value.is_some_and(|max| key.len() + value.len() > max) {
            return Err("nats: maximum message payload exceeded".into());
        }
        if let Some(max) = self.max_bytes {
            let held: u64 = self
                .entries
                .iter()
                .filter(|(k, (_, _, t))| k.as_str() != key && self.is_live(*t, now))
                .map(|(k, (v, _, _))| (k.len() + v.len()) as u64)
                .sum();
            if held + (key.len() + value.len()) as u64 > max {
                return Err("nats: maximum bytes exceeded".into());
            }
        }
        self.revision += 1;
        self.entries.insert(key.to_string(), (value, self.revision, now));
        Ok(self.revision)
    }

    /// The live entry with the lowest revision above `after`.
    fn next_after(&self, after: u64, now: Duration) -> Option<(String, Bytes, u64)> {
        self.entries
            .iter()
            .filter(|(_, (_, r, t))| *r > after && self.is_live(*t, now))
            .min_by_key(|(_, (_, r, _))| *r)
            .map(|(k, (v, r, _))| (k.clone(), v.clone(), *r))
    }

    /// The highest revision of a live entry (0: none).
    fn last_live(&self, now: Duration) -> u64 {
        self.entries.values().filter(|(_, _, t)| self.is_live(*t, now)).map(|(_, r, _)| *r).max().unwrap_or(0)
    }
}

/// A key-value bucket through one replica's link.
pub struct SimKv {
    js: SimJs,
    bucket: String,
}

impl SimKv {
    pub(super) fn new(js: SimJs, bucket: &str) -> Self {
        Self { js, bucket: bucket.into() }
    }

    async fn on<T: Send>(&self, f: impl FnOnce(&mut Bucket, Duration) -> T + Send) -> Result<T, String> {
        let bucket = self.bucket.clone();
        self.js
            .request(move |s| match s.buckets.get_mut(&bucket) {
                Some(b) => {
                    let out = f(b, now());
                    // Followers of the bucket look again.
                    s.wake();
                    Ok(out)
                }
                None => Err(not_found()),
            })
            .await?
    }
}

impl KeyValue for SimKv {
    type Follow = SimFollow;

    async fn get(&self, key: &str) -> Result<Option<Bytes>, String> {
        self.on(|b, now| b.live(key, now).map(|(v, _, _)| v.clone())).await
    }

    async fn entry(&self, key: &str) -> Result<Option<KvEntry>, String> {
        self.on(|b, now| b.live(key, now).map(|(v, r, _)| KvEntry { value: v.clone(), revision: *r, is_put: true }))
            .await
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<u64, String> {
        self.on(|b, now| b.write(key, value, now)).await?
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, CreateError> {
        let created = self
            .on(|b, now| match b.live(key, now) {
                Some(_) => Err(CreateError::AlreadyExists),
                None => b.write(key, value, now).map_err(CreateError::Other),
            })
            .await;
        match created {
            Ok(r) => r,
            Err(e) => Err(CreateError::Other(e)),
        }
    }

    async fn update(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, UpdateError> {
        let updated = self
            .on(|b, now| match b.live(key, now) {
                Some((_, r, _)) if *r == revision => b.write(key, value, now).map_err(UpdateError::Other),
                _ => Err(UpdateError::WrongRevision),
            })
            .await;
        match updated {
            Ok(r) => r,
            Err(e) => Err(UpdateError::Other(e)),
        }
    }

    async fn keys(&self) -> Result<Vec<String>, String> {
        self.on(|b, now| b.entries.keys().filter(|k| b.live(k, now).is_some()).cloned().collect()).await
    }

    async fn values(&self, keys: Option<&HashSet<String>>) -> Result<HashMap<String, Bytes>, String> {
        self.on(|b, now| {
            b.entries
                .keys()
                .filter(|k| keys.is_none_or(|want| want.contains(k.as_str())))
                .filter_map(|k| b.live(k, now).map(|(v, _, _)| (k.clone(), v.clone())))
                .collect()
        })
        .await
    }

    async fn follow(&self) -> Result<SimFollow, String> {
        let last = self.on(|b, now| b.last_live(now)).await?;
        Ok(SimFollow {
            js: self.js.clone(),
            bucket: self.bucket.clone(),
            delivered: 0,
            initial_last: last,
            caught_up: false,
        })
    }
}

/// Following a bucket: every live entry by revision (the latest of each key), `CaughtUp`
/// once every entry there was at the start was delivered, then each write. Waits while the
/// link is down or the bucket is gone (a store lost: the hub follows afresh once the
/// bucket is created again).
pub struct SimFollow {
    js: SimJs,
    bucket: String,
    /// The highest revision delivered.
    delivered: u64,
    /// The highest revision there was when following began.
    initial_last: u64,
    caught_up: bool,
}

impl futures_util::Stream for SimFollow {
    type Item = Result<KvFollow, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        let mut s = lock(&this.js.server.inner);
        if s.connected(&this.js.replica)
            && let Some(b) = s.buckets.get(&this.bucket)
        {
            let next = b.next_after(this.delivered, now());
            if !this.caught_up && next.as_ref().is_none_or(|(_, _, r)| *r > this.initial_last) {
                this.caught_up = true;
                return Poll::Ready(Some(Ok(KvFollow::CaughtUp)));
            }
            if let Some((key, value, revision)) = next {
                this.delivered = revision;
                let change = KvChange { key, value, revision, is_put: true, written_ms: None };
                return Poll::Ready(Some(Ok(KvFollow::Change(change))));
            }
        }
        s.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::super::SimJetStream;
    use super::*;
    use fleetwatch_bus::nats::jetstream::JetStream;

    /// Runs `f` as a client of a turmoil simulation (its clock and runtime).
    fn sim(f: impl Future<Output = Result<(), String>> + 'static) {
        let mut sim = turmoil::Builder::new().simulation_duration(Duration::from_secs(120)).build();
        sim.client("test", async move { f.await.map_err(|e| e.into()) });
        sim.run().unwrap();
    }

    fn spec(name: &str, max_age: Duration) -> BucketSpec {
        BucketSpec::new(name, 1, max_age, Duration::from_secs(120))
    }

    #[test]
    fn key_value_compare_and_set_and_expiry() {
        sim(async {
            let server = SimJetStream::new(1, 0.0);
            let js = server.link("hub-1");
            let kv = js.bucket(&spec("b", Duration::ZERO)).await?;
            let r1 = kv.create("k", Bytes::from_static(b"1")).await.map_err(|e| e.to_string())?;
            assert_eq!(kv.create("k", Bytes::from_static(b"2")).await, Err(CreateError::AlreadyExists));
            assert_eq!(kv.update("k", Bytes::from_static(b"2"), r1 + 7).await, Err(UpdateError::WrongRevision));
            let r2 = kv.update("k", Bytes::from_static(b"2"), r1).await.map_err(|e| e.to_string())?;
            assert!(r2 > r1);
            assert_eq!(kv.entry("k").await?.map(|e| (e.value, e.revision)), Some((Bytes::from_static(b"2"), r2)));
            kv.put("j", Bytes::from_static(b"x")).await?;
            assert_eq!(kv.keys().await?, vec!["j".to_string(), "k".to_string()]);
            let ttl = js.bucket(&spec("t", Duration::from_secs(15))).await?;
            ttl.put("r", Bytes::from_static(b"x")).await?;
            tokio::time::sleep(Duration::from_secs(16)).await;
            assert_eq!(ttl.get("r").await?, None, "expired");
            assert!(ttl.create("r", Bytes::from_static(b"y")).await.is_ok(), "an expired key can be created");
            // The store lost: the bucket is gone until it is created again, empty.
            server.lose_store();
            assert!(kv.get("k").await.is_err());
            js.bucket(&spec("b", Duration::ZERO)).await?;
            assert_eq!(kv.get("k").await?, None);
            Ok(())
        });
    }

    #[test]
    fn values_and_the_bucket_are_bounded_in_bytes() {
        sim(async {
            let server = SimJetStream::new(1, 0.0);
            let js = server.link("hub-1");
            let bounded = BucketSpec { max_value_size: Some(10), max_bytes: Some(20), ..spec("f", Duration::ZERO) };
            let kv = js.bucket(&bounded).await?;
            assert!(kv.put("a", Bytes::from_static(b"123456789")).await.is_ok());
            assert!(kv.put("b", Bytes::from_static(b"1234567890")).await.is_err(), "over the value bound");
            assert!(kv.put("b", Bytes::from_static(b"12345678")).await.is_ok());
            assert!(kv.put("c", Bytes::from_static(b"1")).await.is_err(), "over the bucket's bytes");
            // Rewriting a key counts its new value, not both.
            assert!(kv.put("a", Bytes::from_static(b"1")).await.is_ok());
            Ok(())
        });
    }

    #[test]
    fn following_delivers_the_latest_of_each_key_then_caught_up_then_changes() {
        sim(async {
            let server = SimJetStream::new(1, 0.0);
            let js = server.link("hub-1");
            let kv = js.bucket(&spec("f", Duration::ZERO)).await?;
            kv.put("a", Bytes::from_static(b"1")).await?;
            kv.put("b", Bytes::from_static(b"1")).await?;
            kv.put("a", Bytes::from_static(b"2")).await?;
            let mut f = kv.follow().await?;
            let mut seen = Vec::new();
            while let Some(item) = f.next().await {
                match item? {
                    KvFollow::Change(c) => seen.push((c.key, c.value)),
                    KvFollow::CaughtUp => break,
                }
            }
            assert_eq!(seen, [("b".into(), Bytes::from_static(b"1")), ("a".into(), Bytes::from_static(b"2"))]);
            kv.put("c", Bytes::from_static(b"3")).await?;
            let Some(Ok(KvFollow::Change(c))) = f.next().await else { return Err("no change".into()) };
            assert_eq!((c.key.as_str(), c.value), ("c", Bytes::from_static(b"3")));
            // An empty bucket is caught up at once.
            let other = js.bucket(&spec("g", Duration::ZERO)).await?;
            let mut f = other.follow().await?;
            assert_eq!(f.next().await, Some(Ok(KvFollow::CaughtUp)));
            Ok(())
        });
    }
}
