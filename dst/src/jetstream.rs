//! An in-memory JetStream for the NATS bus ([`fleetwatch_bus::NatsBus`]) under the
//! simulation: one [`SimJetStream`] (the NATS server and its store) shared by several hub
//! replicas, each reaching it through its own [`SimJs`] link, everything on turmoil's
//! simulated runtime and clock.
//!
//! What the bus relies on is kept: stream sequences (the last one survives evictions),
//! `Nats-Msg-Id` dropped within the duplicate window (the ack names the first copy's
//! sequence), the limits (max messages, bytes, age; discard old), the description and
//! creation time (a recreated stream is another stream), the last message by subject, an
//! ordered consumer from a start sequence (recreated on the stream's next incarnation from
//! where it was, as async-nats's is after its heartbeats stop), key-value buckets whose
//! revisions are the bucket's sequence with compare-and-set (create fails if the key has a
//! value, update fails on another revision), entries expiring after the bucket's age, and
//! the connection state.
//!
//! Its faults: the store lost (the stream and every bucket gone, as a server restarted
//! empty), the server down for a while (every link disconnected), a publish ack lost after
//! the message was stored, one replica's link cut and restored. A request on a link that is
//! down waits for it up to the client's timeout; a publish sent while it is down is lost
//! (in flight as the link broke) or, mostly, kept by the client and sent once the link is
//! back (as async-nats does), so it may be stored after its ack timed out; a kept one is
//! lost with the process that sent it.
//!
//! Every choice comes from the seed (the ack losses) or the simulated clock; nothing
//! iterates a hash map.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use fleetwatch_bus::nats::jetstream::{
    BucketSpec, Delivered, HeaderMap, JetStream, JsError, PublishAck, Settings, Stored, StreamInfo, StreamSpec,
    StreamState, Subject,
};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// One request's round trip (each way half of it).
const LATENCY: Duration = Duration::from_millis(2);
/// The client's request timeout (the bus's `REQUEST_TIMEOUT`).
const TIMEOUT: Duration = Duration::from_secs(5);
/// How long an ordered consumer takes to notice its consumer is gone (missed heartbeats)
/// and create it again.
const CONSUMER_RECREATE: Duration = Duration::from_secs(5);
/// The share of publishes sent while a link is down that are lost (in flight as it broke)
/// rather than kept by the client.
const IN_FLIGHT_LOST: f64 = 0.3;
/// How often a request on a link that is down looks again.
const RETRY: Duration = Duration::from_millis(50);

mod kv;

use kv::Bucket;
pub use kv::{SimFollow, SimKv};

fn now() -> Duration {
    turmoil::sim_elapsed().unwrap_or_default()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Faults counted by kind, for the run's report.
pub type Counts = BTreeMap<&'static str, u64>;

/// The NATS server with JetStream, shared by every hub replica of a run.
#[derive(Clone)]
pub struct SimJetStream {
    inner: Arc<Mutex<Server>>,
}

struct Message {
    seq: u64,
    subject: Subject,
    headers: HeaderMap,
    payload: Bytes,
    time: Duration,
    size: u64,
}

struct MemStream {
    spec: StreamSpec,
    created_ns: i128,
    incarnation: u64,
    messages: VecDeque<Message>,
    last_seq: u64,
    bytes: u64,
    /// `Nats-Msg-Id` → (sequence, when stored), in the duplicate window.
    ids: BTreeMap<String, (u64, Duration)>,
}

impl MemStream {
    fn state(&self) -> StreamState {
        StreamState {
            messages: self.messages.len() as u64,
            bytes: self.bytes,
            first_sequence: self.messages.front().map_or(self.last_seq + 1, |m| m.seq),
            last_sequence: self.last_seq,
        }
    }

    fn info(&self) -> StreamInfo {
        StreamInfo {
            description: Some(self.spec.description.clone()),
            created_ns: self.created_ns,
            state: self.state(),
            durable: true,
            settings: self.spec.settings(),
        }
    }

    /// Discard old: evicts past the limits.
    fn enforce(&mut self, now: Duration) {
        let max_msgs = usize::try_from(self.spec.max_messages).unwrap_or(usize::MAX);
        let max_bytes = u64::try_from(self.spec.max_bytes).unwrap_or(u64::MAX);
        while let Some(front) = self.messages.front() {
            let too_old = !self.spec.max_age.is_zero() && now.saturating_sub(front.time) > self.spec.max_age;
            if self.messages.len() <= max_msgs && self.bytes <= max_bytes && !too_old {
                break;
            }
            let size = front.size;
            self.messages.pop_front();
            self.bytes -= size;
        }
        let window = self.spec.duplicate_window;
        self.ids.retain(|_, (_, t)| now.saturating_sub(*t) <= window);
    }
}

struct Server {
    stream: Option<MemStream>,
    buckets: BTreeMap<String, Bucket>,
    /// Replicas whose link is cut.
    cut: BTreeSet<String>,
    /// The whole server is down (restarting).
    down: bool,
    incarnations: u64,
    /// Chance that a publish's ack is lost after the message was stored.
    ack_loss: f64,
    rng: StdRng,
    counts: Counts,
    /// Reads of many clusters' last records at once ([`JetStream::last_by_subjects`]).
    swept: u64,
    /// Consumers and requests waiting for a change.
    wakers: Vec<Waker>,
    /// Publishes sent while their link was down, in order.
    buffered: Vec<Buffered>,
}

impl Server {
    fn connected(&self, replica: &str) -> bool {
        !self.down && !self.cut.contains(replica)
    }

    fn wake(&mut self) {
        for w in self.wakers.drain(..) {
            w.wake();
        }
    }

    /// Stores one message (or finds it a duplicate).
    fn store(
        &mut self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        id: String,
        t: Duration,
    ) -> Result<PublishAck, String> {
        let Some(st) = self.stream.as_mut() else {
            return Err("no responders: stream not found".to_string());
        };
        st.enforce(t);
        let ack = if let Some((seq, _)) = st.ids.get(&id) {
            tracing::debug!(%id, seq, "stored before: a duplicate");
            PublishAck { sequence: *seq, duplicate: true }
        } else {
            tracing::debug!(%id, seq = st.last_seq + 1, "stored");
            st.last_seq += 1;
            let seq = st.last_seq;
            let size = (subject.len() + payload.len() + id.len() + 64) as u64;
            st.ids.insert(id, (seq, t));
            st.messages.push_back(Message { seq, subject: Subject::from(subject), headers, payload, time: t, size });
            st.bytes += size;
            st.enforce(t);
            PublishAck { sequence: seq, duplicate: false }
        };
        self.wake();
        Ok(ack)
    }

    /// Sends what connected links kept; drops what processes that died kept.
    fn flush(&mut self) {
        let t = now();
        let kept = std::mem::take(&mut self.buffered);
        for b in kept {
            if b.alive.strong_count() == 0 {
                continue;
            }
            if !self.connected(&b.replica) {
                self.buffered.push(b);
                continue;
            }
            let (subject, headers, payload, id) = b.publish;
            let answer = self.store(subject, headers, payload, id, t);
            *lock(&b.slot) = Some(answer);
        }
        self.wake();
    }
}

impl SimJetStream {
    /// A server with an empty store; publish acks are lost with probability `ack_loss`
    /// (drawn from `seed`).
    pub fn new(seed: u64, ack_loss: f64) -> Self {
        Self {
            inner: Arc::new(Mutex::new(Server {
                stream: None,
                buckets: BTreeMap::new(),
                cut: BTreeSet::new(),
                down: false,
                incarnations: 0,
                ack_loss,
                rng: StdRng::seed_from_u64(seed),
                counts: Counts::new(),
                swept: 0,
                wakers: Vec::new(),
                buffered: Vec::new(),
            })),
        }
    }

    /// The link of `replica` (a hub host).
    pub fn link(&self, replica: &str) -> SimJs {
        SimJs { server: self.clone(), replica: replica.into(), alive: Arc::new(()) }
    }

    /// The store is lost: the stream and every bucket are gone (NATS restarted empty).
    pub fn lose_store(&self) {
        let mut s = lock(&self.inner);
        s.stream = None;
        s.buckets.clear();
        s.wake();
    }

    /// The server goes down (every link disconnected) or comes back.
    pub fn set_down(&self, down: bool) {
        let mut s = lock(&self.inner);
        s.down = down;
        s.flush();
    }

    /// Cuts or restores one replica's link.
    pub fn set_cut(&self, replica: &str, cut: bool) {
        let mut s = lock(&self.inner);
        if cut {
            s.cut.insert(replica.into());
        } else {
            s.cut.remove(replica);
        }
        s.flush();
    }

    /// Faults that happened inside (acks lost).
    pub fn counts(&self) -> Counts {
        lock(&self.inner).counts.clone()
    }

    /// How many times hub replicas read many clusters' last records at once (the NATS
    /// bus's sweeps for the hellos of a connect storm): a run that never does has not
    /// tried that path.
    pub fn swept(&self) -> u64 {
        lock(&self.inner).swept
    }

    /// The stream's last sequence and its messages (for tests).
    pub fn stream_state(&self) -> Option<StreamState> {
        lock(&self.inner).stream.as_ref().map(MemStream::state)
    }
}

/// One hub replica's link to the [`SimJetStream`].
#[derive(Clone)]
pub struct SimJs {
    server: SimJetStream,
    replica: String,
    /// Lives as long as the process that opened the link (its clones).
    alive: Arc<()>,
}

impl SimJs {
    fn with<T>(&self, f: impl FnOnce(&mut Server) -> T) -> T {
        f(&mut lock(&self.server.inner))
    }

    /// One request: waits for the link (at most the timeout), then a round trip.
    async fn request<T: Send>(&self, f: impl FnOnce(&mut Server) -> T + Send) -> Result<T, String> {
        let since = now();
        while !self.with(|s| s.connected(&self.replica)) {
            if now().saturating_sub(since) >= TIMEOUT {
                return Err("nats: timed out (not connected)".into());
            }
            tokio::time::sleep(RETRY).await;
        }
        tokio::time::sleep(LATENCY / 2).await;
        // The link may have gone meanwhile: the request is lost.
        let answer = self.with(|s| s.connected(&self.replica).then(|| f(s)));
        match answer {
            Some(a) => {
                tokio::time::sleep(LATENCY / 2).await;
                Ok(a)
            }
            None => {
                tokio::time::sleep(TIMEOUT).await;
                Err("nats: timed out".into())
            }
        }
    }
}

fn not_found() -> String {
    "stream not found".into()
}

/// A publish's ack to come.
pub struct SimAck {
    sleep: Pin<Box<tokio::time::Sleep>>,
    /// The answer once the sleep is over.
    answer: Option<Result<PublishAck, String>>,
    /// For a publish kept while disconnected: its answer once sent (before the sleep, the
    /// client's timeout, is over).
    slot: Option<AckSlot>,
    server: Option<SimJetStream>,
}

impl Future for SimAck {
    type Output = Result<PublishAck, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = &mut *self;
        if let (Some(slot), Some(server)) = (this.slot.clone(), this.server.clone()) {
            let mut srv = lock(&server.inner);
            let sent = lock(&slot).take();
            if let Some(answer) = sent {
                this.slot = None;
                return Poll::Ready(answer);
            }
            srv.wakers.push(cx.waker().clone());
        }
        match this.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(this.answer.take().unwrap_or_else(|| Err("polled again".into()))),
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A publish the client keeps while disconnected.
struct Buffered {
    replica: String,
    /// Gone when the process that sent it is (its buffer with it).
    alive: std::sync::Weak<()>,
    publish: (String, HeaderMap, Bytes, String),
    slot: AckSlot,
}

/// Where a kept publish's answer goes once it is sent.
type AckSlot = Arc<Mutex<Option<Result<PublishAck, String>>>>;

/// An ordered consumer of the whole stream.
pub struct SimMessages {
    server: SimJetStream,
    replica: String,
    /// The next sequence to deliver.
    next: u64,
    /// The stream incarnation it consumes.
    incarnation: u64,
    /// Set while it recreates itself on a new incarnation of the stream.
    recreating: Option<Pin<Box<tokio::time::Sleep>>>,
}

impl futures_util::Stream for SimMessages {
    type Item = Result<Delivered, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if let Some(sleep) = &mut this.recreating {
            if sleep.as_mut().poll(cx).is_pending() {
                return Poll::Pending;
            }
            this.recreating = None;
        }
        let mut s = lock(&this.server.inner);
        let connected = s.connected(&this.replica);
        let current = s.stream.as_ref().map(|st| st.incarnation);
        match current {
            Some(i) if connected && i != this.incarnation => {
                // Its consumer went with the old stream: after missing heartbeats it is
                // created again on the stream there is now, from where it was.
                this.incarnation = i;
                drop(s);
                let mut sleep = Box::pin(tokio::time::sleep(CONSUMER_RECREATE));
                let _ = sleep.as_mut().poll(cx);
                this.recreating = Some(sleep);
                return Poll::Pending;
            }
            Some(_) if connected => {
                let st = s.stream.as_ref().expect("checked");
                if let Some(m) = st.messages.iter().find(|m| m.seq >= this.next) {
                    this.next = m.seq + 1;
                    let d = Delivered {
                        subject: m.subject.clone(),
                        headers: Some(m.headers.clone()),
                        payload: m.payload.clone(),
                        sequence: m.seq,
                        published_ms: None,
                    };
                    return Poll::Ready(Some(Ok(d)));
                }
            }
            _ => {}
        }
        s.wakers.push(cx.waker().clone());
        Poll::Pending
    }
}

impl JetStream for SimJs {
    type Kv = SimKv;
    type Ack = SimAck;
    type Messages = SimMessages;

    fn servers(&self) -> &str {
        "nats://simulated:4222"
    }

    fn disconnected(&self) -> Option<String> {
        (!self.with(|s| s.connected(&self.replica))).then(|| "disconnected".to_string())
    }

    async fn stream_info(&self) -> Result<StreamInfo, JsError> {
        self.request(|s| s.stream.as_ref().map(MemStream::info).ok_or(JsError::NotFound))
            .await
            .map_err(JsError::Other)?
    }

    async fn create_stream(&self, spec: &StreamSpec) -> Result<StreamInfo, JsError> {
        self.request(|s| {
            if let Some(st) = &s.stream {
                return if st.spec == *spec {
                    Ok(st.info())
                } else {
                    Err(JsError::Other("stream name already in use with a different configuration".into()))
                };
            }
            s.incarnations += 1;
            let st = MemStream {
                spec: spec.clone(),
                // Unix nanoseconds of a made-up start plus the simulated time: another
                // stream has another creation time.
                created_ns: 1_800_000_000_000_000_000 + now().as_nanos() as i128 + i128::from(s.incarnations),
                incarnation: s.incarnations,
                messages: VecDeque::new(),
                last_seq: 0,
                bytes: 0,
                ids: BTreeMap::new(),
            };
            let info = st.info();
            s.stream = Some(st);
            s.wake();
            Ok(info)
        })
        .await
        .map_err(JsError::Other)?
    }

    async fn delete_stream(&self) -> Result<(), JsError> {
        self.request(|s| match s.stream.take() {
            Some(_) => {
                s.wake();
                Ok(())
            }
            None => Err(JsError::NotFound),
        })
        .await
        .map_err(JsError::Other)?
    }

    async fn publish(&self, subject: String, headers: HeaderMap, payload: Bytes, id: String) -> Result<SimAck, String> {
        let t = now();
        let h = |name: &str| headers.get(name).map(|v| v.as_str().to_string()).unwrap_or_default();
        tracing::debug!(
            replica = %self.replica, %subject, %id, prev = h("Fw-Prev"), known = h("Fw-Known"),
            "publish"
        );
        let answer = self.with(|s| {
            if !s.connected(&self.replica) {
                // Some went out as the link broke and are lost; the client keeps the others
                // and sends them once connected again (their acks may time out first).
                if s.rng.random_bool(IN_FLIGHT_LOST) {
                    *s.counts.entry("jetstream-publish-lost").or_default() += 1;
                    return Ok((TIMEOUT, Err("nats: timed out (not connected)".to_string())));
                }
                let slot = Arc::new(Mutex::new(None));
                s.buffered.push(Buffered {
                    replica: self.replica.clone(),
                    alive: Arc::downgrade(&self.alive),
                    publish: (subject, headers, payload, id),
                    slot: slot.clone(),
                });
                *s.counts.entry("jetstream-publish-buffered").or_default() += 1;
                return Err(slot);
            }
            let lose = s.ack_loss > 0.0 && s.rng.random_bool(s.ack_loss);
            let stored = s.store(subject, headers, payload, id, t);
            if lose && stored.is_ok() {
                *s.counts.entry("jetstream-ack-lost").or_default() += 1;
                return Ok((TIMEOUT, Err("nats: timed out (the ack was lost)".to_string())));
            }
            Ok((LATENCY, stored))
        });
        Ok(match answer {
            Ok((wait, answer)) => {
                SimAck { sleep: Box::pin(tokio::time::sleep(wait)), answer: Some(answer), slot: None, server: None }
            }
            Err(slot) => SimAck {
                sleep: Box::pin(tokio::time::sleep(TIMEOUT)),
                answer: Some(Err("nats: timed out (not connected)".into())),
                slot: Some(slot),
                server: Some(self.server.clone()),
            },
        })
    }

    async fn last_by_subject(&self, subject: &str) -> Result<Option<Stored>, String> {
        self.request(|s| {
            let st = s.stream.as_ref().ok_or_else(not_found)?;
            Ok(st
                .messages
                .iter()
                .rev()
                .find(|m| m.subject.as_str() == subject)
                .map(|m| Stored { sequence: m.seq, headers: m.headers.clone() }))
        })
        .await?
    }

    async fn last_by_subjects(&self, subjects: &HashSet<String>) -> Result<HashMap<String, Stored>, String> {
        self.request(|s| {
            s.swept += 1;
            let st = s.stream.as_ref().ok_or_else(not_found)?;
            let mut found: HashMap<String, Stored> = HashMap::new();
            for m in st.messages.iter().rev() {
                if found.len() == subjects.len() {
                    break;
                }
                if subjects.contains(m.subject.as_str()) && !found.contains_key(m.subject.as_str()) {
                    found.insert(m.subject.to_string(), Stored { sequence: m.seq, headers: m.headers.clone() });
                }
            }
            Ok(found)
        })
        .await?
    }

    async fn ordered(&self, from: u64) -> Result<SimMessages, String> {
        let incarnation = self.request(|s| s.stream.as_ref().map(|st| st.incarnation).ok_or_else(not_found)).await??;
        Ok(SimMessages {
            server: self.server.clone(),
            replica: self.replica.clone(),
            next: from.max(1),
            incarnation,
            recreating: None,
        })
    }

    async fn bucket(&self, spec: &BucketSpec) -> Result<SimKv, String> {
        let bucket = Bucket::new(spec);
        self.request(|s| {
            s.buckets.entry(spec.name.clone()).or_insert(bucket);
        })
        .await?;
        Ok(SimKv::new(self.clone(), &spec.name))
    }
}

/// The settings a stream created from `spec` has (for tests).
pub fn settings(spec: &StreamSpec) -> Settings {
    spec.settings()
}

#[cfg(test)]
mod tests {
    use futures_util::StreamExt;

    use super::*;

    fn spec(max_messages: i64) -> StreamSpec {
        StreamSpec {
            name: "fw".into(),
            description: "test".into(),
            max_messages,
            max_bytes: i64::MAX,
            max_age: Duration::ZERO,
            replicas: 1,
            duplicate_window: Duration::from_secs(120),
        }
    }

    fn headers(v: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert("Fw-Seq", v);
        h
    }

    /// Runs `f` as a client of a turmoil simulation (its clock and runtime).
    fn sim(f: impl Future<Output = Result<(), String>> + 'static) {
        let mut sim = turmoil::Builder::new().simulation_duration(Duration::from_secs(120)).build();
        sim.client("test", async move { f.await.map_err(|e| e.into()) });
        sim.run().unwrap();
    }

    async fn publish(js: &SimJs, subject: &str, v: &str, id: &str) -> Result<PublishAck, String> {
        js.publish(subject.into(), headers(v), Bytes::from(v.to_string()), id.into()).await?.await
    }

    #[test]
    fn sequences_duplicates_limits_and_last_by_subject() {
        sim(async {
            let server = SimJetStream::new(1, 0.0);
            let js = server.link("hub-1");
            assert_eq!(js.stream_info().await, Err(JsError::NotFound));
            let created = js.create_stream(&spec(3)).await.map_err(|e| e.to_string())?;
            assert_eq!(created.state.first_sequence, 1);
            let again = js.create_stream(&spec(3)).await.map_err(|e| e.to_string())?;
            assert_eq!(again.created_ns, created.created_ns, "the same stream");
            assert!(js.create_stream(&spec(4)).await.is_err(), "other settings are refused");
            assert_eq!(publish(&js, "fw.a", "1", "a/1").await?, PublishAck { sequence: 1, duplicate: false });
            assert_eq!(publish(&js, "fw.b", "2", "b/1").await?, PublishAck { sequence: 2, duplicate: false });
            assert_eq!(publish(&js, "fw.a", "1", "a/1").await?, PublishAck { sequence: 1, duplicate: true });
            for i in 3..=5 {
                publish(&js, "fw.c", &i.to_string(), &format!("c/{i}")).await?;
            }
            let info = js.stream_info().await.map_err(|e| e.to_string())?;
            assert_eq!((info.state.first_sequence, info.state.last_sequence, info.state.messages), (3, 5, 3));
            assert!(js.last_by_subject("fw.a").await?.is_none(), "evicted");
            assert_eq!(js.last_by_subject("fw.c").await?.map(|m| m.sequence), Some(5));
            // An ordered consumer from an evicted sequence starts at the first retained.
            let mut tail = js.ordered(1).await?;
            let first = tail.next().await.ok_or("no message")??;
            assert_eq!((first.sequence, first.subject.as_str()), (3, "fw.c"));
            Ok(())
        });
    }

    #[test]
    fn faults_lose_acks_and_cut_links() {
        sim(async {
            let server = SimJetStream::new(7, 1.0);
            let js = server.link("hub-1");
            js.create_stream(&spec(100)).await.map_err(|e| e.to_string())?;
            assert!(publish(&js, "fw.a", "1", "a/1").await.is_err(), "the ack is lost");
            assert_eq!(server.stream_state().map(|s| s.last_sequence), Some(1), "but the message is stored");
            assert_eq!(server.counts().get("jetstream-ack-lost"), Some(&1));
            server.set_cut("hub-1", true);
            assert!(js.disconnected().is_some());
            assert!(server.link("hub-2").disconnected().is_none(), "only that replica's link");
            assert!(js.stream_info().await.is_err(), "a request times out");
            server.set_cut("hub-1", false);
            assert!(js.stream_info().await.is_ok());
            // Publishes sent while the link is cut are lost or kept and sent once it is back.
            server.set_cut("hub-1", true);
            let mut acks = Vec::new();
            for i in 2..12 {
                let id = format!("a/{i}");
                acks.push(js.publish("fw.a".into(), headers("x"), Bytes::from_static(b"x"), id).await?);
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            assert_eq!(server.stream_state().map(|s| s.last_sequence), Some(1), "nothing stored while cut");
            server.set_cut("hub-1", false);
            let mut stored = 0;
            for ack in acks {
                if ack.await.is_ok() {
                    stored += 1;
                }
            }
            let counts = server.counts();
            let kept = counts.get("jetstream-publish-buffered").copied().unwrap_or(0);
            let lost = counts.get("jetstream-publish-lost").copied().unwrap_or(0);
            assert_eq!((stored, kept + lost), (kept, 10), "{counts:?}");
            assert!(kept > 0 && lost > 0, "{counts:?}");
            assert_eq!(server.stream_state().map(|s| s.last_sequence), Some(1 + kept), "kept ones sent");
            // A recreated stream is another stream: another creation time.
            let before = js.stream_info().await.map_err(|e| e.to_string())?.created_ns;
            server.lose_store();
            assert_eq!(js.stream_info().await, Err(JsError::NotFound));
            let after = js.create_stream(&spec(100)).await.map_err(|e| e.to_string())?;
            assert_ne!(after.created_ns, before);
            assert_eq!(after.state.last_sequence, 0);
            Ok(())
        });
    }
}
