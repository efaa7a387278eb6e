//! The JetStream operations the NATS bus uses ([`super`]), behind one trait: the
//! bus's stream (create, info, delete, publish with message id and headers and its ack,
//! last message by subject, the last messages of many subjects through one sweep, an
//! ordered consumer from a sequence), its key-value buckets (get, entry with revision,
//! create, update with revision, put, keys, many values through one sweep, and following
//! every key: its latest value then each change) and the connection state. [`AsyncNats`]
//! is the real thing (async-nats on a thread of its own); the
//! deterministic simulation (`fleetwatch-dst`) has an in-memory JetStream shared by several
//! hub replicas on its simulated runtime, with faults of its own.
//!
//! The hot path (publish and its ack, the ordered consumer) adds no allocation over calling
//! async-nats directly: the headers are async-nats's [`HeaderMap`], the ack and the message
//! stream are thin wrappers over async-nats's own.

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use async_nats::jetstream::{self, consumer, kv, stream};
pub use async_nats::{HeaderMap, Subject};
use bytes::Bytes;
use futures_util::StreamExt;

use super::io_thread::IoThread;

/// What the bus asks of its stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamSpec {
    /// The stream's name; its subjects are `<name>.>`.
    pub name: String,
    /// Its description (the bus's lineage, see `super::state`).
    pub description: String,
    /// Most messages (discard old).
    pub max_messages: i64,
    /// Most bytes (discard old).
    pub max_bytes: i64,
    /// Oldest message age; zero keeps messages regardless of age.
    pub max_age: Duration,
    /// Replicas in a JetStream cluster.
    pub replicas: usize,
    /// How long a `Nats-Msg-Id` is remembered.
    pub duplicate_window: Duration,
}

impl StreamSpec {
    /// The stream's configuration in async-nats terms.
    pub fn config(&self) -> stream::Config {
        stream::Config {
            name: self.name.clone(),
            description: Some(self.description.clone()),
            subjects: vec![format!("{}.>", self.name)],
            retention: stream::RetentionPolicy::Limits,
            discard: stream::DiscardPolicy::Old,
            max_messages: self.max_messages,
            max_bytes: self.max_bytes,
            max_age: self.max_age,
            storage: stream::StorageType::File,
            num_replicas: self.replicas,
            duplicate_window: self.duplicate_window,
            ..Default::default()
        }
    }

    /// The settings an existing stream must have for this hub to use it.
    pub fn settings(&self) -> Settings {
        Settings::of(&self.config())
    }
}

/// The settings of a stream that hub replicas must agree on (compared at start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Subject filters.
    pub subjects: Vec<String>,
    /// Retention policy.
    pub retention: String,
    /// Discard policy.
    pub discard: String,
    /// Storage type.
    pub storage: String,
    /// Replicas.
    pub replicas: usize,
    /// Most messages.
    pub max_messages: i64,
    /// Most bytes.
    pub max_bytes: i64,
    /// Oldest message age.
    pub max_age: Duration,
}

impl Settings {
    /// The settings of an async-nats stream configuration.
    pub fn of(c: &stream::Config) -> Self {
        Self {
            subjects: c.subjects.clone(),
            retention: format!("{:?}", c.retention),
            discard: format!("{:?}", c.discard),
            storage: format!("{:?}", c.storage),
            replicas: c.num_replicas,
            max_messages: c.max_messages,
            max_bytes: c.max_bytes,
            max_age: c.max_age,
        }
    }

    /// What differs from `want`, one line per setting.
    pub fn differences(&self, want: &Settings) -> Vec<String> {
        let mut diffs = Vec::new();
        let mut differs = |what: &str, have: String, want: String| {
            if have != want {
                diffs.push(format!("{what} is {have}, this hub wants {want}"));
            }
        };
        differs("subjects", format!("{:?}", self.subjects), format!("{:?}", want.subjects));
        differs("retention policy", self.retention.clone(), want.retention.clone());
        differs("discard policy", self.discard.clone(), want.discard.clone());
        differs("storage", self.storage.clone(), want.storage.clone());
        differs("replicas", self.replicas.to_string(), want.replicas.to_string());
        differs("max_msgs", self.max_messages.to_string(), want.max_messages.to_string());
        differs("max_bytes", self.max_bytes.to_string(), want.max_bytes.to_string());
        differs("max_age", format!("{:?}", self.max_age), format!("{:?}", want.max_age));
        diffs
    }
}

/// The stream's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StreamState {
    /// Messages retained.
    pub messages: u64,
    /// Their bytes.
    pub bytes: u64,
    /// The first retained sequence (the last one + 1 when empty, as JetStream says).
    pub first_sequence: u64,
    /// The last sequence stored (also when evicted since).
    pub last_sequence: u64,
}

/// What the bus reads of its stream's info.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamInfo {
    /// The description (the bus's lineage).
    pub description: Option<String>,
    /// When the stream was created (Unix nanoseconds): another value means another stream.
    pub created_ns: i128,
    /// Its counters.
    pub state: StreamState,
    /// Whether it is stored in files.
    pub durable: bool,
    /// Its settings.
    pub settings: Settings,
}

/// Why a stream operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JsError {
    /// The stream does not exist.
    #[error("stream not found")]
    NotFound,
    /// Anything else (unreachable, timed out, refused).
    #[error("{0}")]
    Other(String),
}

/// A publish's answer: where the message is, and whether an earlier one with its
/// `Nats-Msg-Id` was there already (then `sequence` is that one's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PublishAck {
    /// Stream sequence.
    pub sequence: u64,
    /// A duplicate of a message within the duplicate window.
    pub duplicate: bool,
}

/// A message of the stream, as the ordered consumer delivers it.
#[derive(Debug, Clone)]
pub struct Delivered {
    /// Its subject.
    pub subject: Subject,
    /// Its headers.
    pub headers: Option<HeaderMap>,
    /// Its payload.
    pub payload: Bytes,
    /// Stream sequence.
    pub sequence: u64,
    /// When it was stored (Unix milliseconds), `None` when unknown.
    pub published_ms: Option<u64>,
}

/// A stored message read back by subject.
#[derive(Debug, Clone)]
pub struct Stored {
    /// Stream sequence.
    pub sequence: u64,
    /// Its headers.
    pub headers: HeaderMap,
}

/// A key-value entry with its revision.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEntry {
    /// The value (empty for a delete or purge).
    pub value: Bytes,
    /// Its revision (compare-and-set with [`KeyValue::update`]).
    pub revision: u64,
    /// Whether it is a value (`false`: deleted or purged).
    pub is_put: bool,
}

/// What a key-value bucket is created with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BucketSpec {
    /// The bucket's name (its stream is `KV_<name>`).
    pub name: String,
    /// Replicas in a JetStream cluster.
    pub replicas: usize,
    /// Entries expire this long after their last write (zero: never).
    pub max_age: Duration,
    /// How long a message id is remembered.
    pub duplicate_window: Duration,
    /// The largest value in bytes (`None`: the server's limit); a larger write is refused.
    pub max_value_size: Option<i32>,
    /// The most bytes the bucket holds (`None`: no bound); a write past it is refused.
    pub max_bytes: Option<i64>,
}

impl BucketSpec {
    /// A bucket without bounds on values or bytes.
    pub fn new(name: &str, replicas: usize, max_age: Duration, duplicate_window: Duration) -> Self {
        Self { name: name.into(), replicas, max_age, duplicate_window, max_value_size: None, max_bytes: None }
    }
}

/// One key's change as a follower of the bucket sees it ([`KeyValue::follow`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvChange {
    /// The key.
    pub key: String,
    /// Its value (empty for a delete or purge).
    pub value: Bytes,
    /// Its revision.
    pub revision: u64,
    /// Whether it is a value (`false`: deleted or purged).
    pub is_put: bool,
    /// When it was written (Unix milliseconds, the server's clock), `None` when unknown.
    pub written_ms: Option<u64>,
}

/// What following a bucket delivers: every key's latest value, [`KvFollow::CaughtUp`] once
/// they were all delivered, then each change as it is written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvFollow {
    /// A key's value (initial or changed).
    Change(KvChange),
    /// Every value the bucket held when following began was delivered (sent once).
    CaughtUp,
}

/// Why a key-value compare-and-set update failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum UpdateError {
    /// The key's revision is another one (or the key has no value): someone wrote it since.
    #[error("wrong last revision")]
    WrongRevision,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// Why a key-value create failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CreateError {
    /// The key has a value.
    #[error("key already exists")]
    AlreadyExists,
    /// Anything else.
    #[error("{0}")]
    Other(String),
}

/// One key-value bucket.
pub trait KeyValue: Send + Sync + 'static {
    /// What [`KeyValue::follow`] delivers.
    type Follow: futures_util::Stream<Item = Result<KvFollow, String>> + Send + Unpin + 'static;

    /// The key's value, `None` when it has none.
    fn get(&self, key: &str) -> impl Future<Output = Result<Option<Bytes>, String>> + Send;
    /// The key's latest entry with its revision.
    fn entry(&self, key: &str) -> impl Future<Output = Result<Option<KvEntry>, String>> + Send;
    /// Writes the value whatever is there.
    fn put(&self, key: &str, value: Bytes) -> impl Future<Output = Result<u64, String>> + Send;
    /// Writes the value only if the key has none.
    fn create(&self, key: &str, value: Bytes) -> impl Future<Output = Result<u64, CreateError>> + Send;
    /// Writes the value only if the key's revision is `revision`.
    fn update(&self, key: &str, value: Bytes, revision: u64) -> impl Future<Output = Result<u64, UpdateError>> + Send;
    /// Every key with a value.
    fn keys(&self) -> impl Future<Output = Result<Vec<String>, String>> + Send;
    /// The values of `keys` (of every key with `None`), as the bucket was at one moment
    /// after the call began. One consumer delivers every key's latest value, where
    /// [`KeyValue::get`] is a request per key; only the values asked for are kept.
    fn values(
        &self,
        keys: Option<&HashSet<String>>,
    ) -> impl Future<Output = Result<HashMap<String, Bytes>, String>> + Send;
    /// Follows every key: its latest value, [`KvFollow::CaughtUp`], then each change.
    /// Entries that expire (the bucket's age) are not announced: a follower ages them out
    /// by [`KvChange::written_ms`] itself.
    fn follow(&self) -> impl Future<Output = Result<Self::Follow, String>> + Send;
}

/// The JetStream of one hub replica, bound to the bus's stream.
pub trait JetStream: Send + Sync + 'static {
    /// A key-value bucket.
    type Kv: KeyValue;
    /// A publish's ack to come.
    type Ack: Future<Output = Result<PublishAck, String>> + Send + 'static;
    /// What an ordered consumer delivers.
    type Messages: futures_util::Stream<Item = Result<Delivered, String>> + Send + Unpin + 'static;

    /// The servers, for logs and errors.
    fn servers(&self) -> &str;
    /// `None` while connected, else the connection's state.
    fn disconnected(&self) -> Option<String>;
    /// Drops the connection and connects again, to another server of the pool when there
    /// is one: the server this client is connected to stopped answering (frozen) though the
    /// connection looks up. The default does nothing (a JetStream of one link).
    fn reconnect(&self) -> impl Future<Output = ()> + Send {
        async {}
    }
    /// The stream's info.
    fn stream_info(&self) -> impl Future<Output = Result<StreamInfo, JsError>> + Send;
    /// Creates the stream (an existing one with the same settings and description is fine).
    fn create_stream(&self, spec: &StreamSpec) -> impl Future<Output = Result<StreamInfo, JsError>> + Send;
    /// Deletes the stream.
    fn delete_stream(&self) -> impl Future<Output = Result<(), JsError>> + Send;
    /// Sends one message with `Nats-Msg-Id` `id`; resolves once it is sent, with its ack
    /// to come.
    fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        id: String,
    ) -> impl Future<Output = Result<Self::Ack, String>> + Send;
    /// The last message on `subject`, `None` when the stream holds none.
    fn last_by_subject(&self, subject: &str) -> impl Future<Output = Result<Option<Stored>, String>> + Send;
    /// The last message of each of `subjects` the stream holds, as the stream was at one
    /// moment after the call began; headers only. One consumer delivers the last message
    /// of every subject of the stream and only `subjects` are kept: one request however
    /// many are asked for, where [`JetStream::last_by_subject`] is one each (nats-server
    /// 2.9 has no batched direct get).
    fn last_by_subjects(
        &self,
        subjects: &HashSet<String>,
    ) -> impl Future<Output = Result<HashMap<String, Stored>, String>> + Send;
    /// An ordered consumer of the whole stream from sequence `from`.
    fn ordered(&self, from: u64) -> impl Future<Output = Result<Self::Messages, String>> + Send;
    /// Opens the bucket, creating it as `spec` says when missing.
    fn bucket(&self, spec: &BucketSpec) -> impl Future<Output = Result<Self::Kv, String>> + Send;
}

/// async-nats: the production [`JetStream`].
pub struct AsyncNats {
    client: async_nats::Client,
    js: jetstream::Context,
    stream_name: String,
    stream: stream::Stream<()>,
    servers: String,
    /// Runs the NATS connection; dropped last (fields drop in order).
    _io: IoThread,
}

impl AsyncNats {
    /// The JetStream of `client` for stream `stream_name`.
    pub(super) async fn new(
        client: async_nats::Client,
        js: jetstream::Context,
        stream_name: &str,
        servers: String,
        io: IoThread,
    ) -> Result<Self, String> {
        // A handle by name: no request.
        let stream = js.get_stream_no_info(stream_name).await.map_err(|e| e.to_string())?;
        Ok(Self { client, js, stream_name: stream_name.into(), stream, servers, _io: io })
    }
}

fn info_of(info: stream::Info) -> StreamInfo {
    StreamInfo {
        description: info.config.description.clone(),
        created_ns: info.created.unix_timestamp_nanos(),
        state: StreamState {
            messages: info.state.messages,
            bytes: info.state.bytes,
            first_sequence: info.state.first_sequence,
            last_sequence: info.state.last_sequence,
        },
        durable: matches!(info.config.storage, stream::StorageType::File),
        settings: Settings::of(&info.config),
    }
}

/// Whether a stream request failed because the stream does not exist.
fn stream_not_found(e: &jetstream::context::RequestError) -> bool {
    std::error::Error::source(e)
        .and_then(|s| s.downcast_ref::<jetstream::Error>())
        .is_some_and(|je| je.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND)
}

/// A publish ack of async-nats, awaited by a task of its own from the publish on.
///
/// async-nats lets 5,000 acks be in flight per context: each publish takes a permit (waiting
/// for one, without a timeout, when none is left) and its ack future holds it until the
/// future completes, and its timeout starts only when it is first polled. A hub session
/// waiting for a permit for its next batch does not poll the acks of its batches in flight,
/// so with thousands of sessions every permit ended up held by acks no one polled: at 50,000
/// agents over 3 replicas every append stopped for good once the agents had connected (0
/// events/s, agents dropping their sessions for want of pongs). Driven by their own task,
/// acks complete as they arrive (or time out), whoever waits for them.
pub struct NatsAck(tokio::task::JoinHandle<Result<PublishAck, String>>);

impl NatsAck {
    fn driven(ack: jetstream::context::PublishAckFuture) -> Self {
        let ack = std::future::IntoFuture::into_future(ack);
        NatsAck(tokio::spawn(async move {
            ack.await.map(|a| PublishAck { sequence: a.sequence, duplicate: a.duplicate }).map_err(|e| e.to_string())
        }))
    }
}

impl Future for NatsAck {
    type Output = Result<PublishAck, String>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|r| r.unwrap_or_else(|e| Err(format!("waiting for the publish ack: {e}"))))
    }
}

type OrderedItem = Result<jetstream::Message, consumer::push::OrderedError>;

fn delivered(m: OrderedItem) -> Result<Delivered, String> {
    let m = m.map_err(|e| e.to_string())?;
    let info = m.info().map_err(|e| e.to_string())?;
    let (sequence, published) = (info.stream_sequence, info.published);
    let published_ms = u64::try_from(published.unix_timestamp_nanos() / 1_000_000).ok();
    let m = m.message;
    Ok(Delivered { subject: m.subject, headers: m.headers, payload: m.payload, sequence, published_ms })
}

/// The ordered consumer of async-nats.
pub type NatsMessages =
    futures_util::stream::Map<consumer::push::Ordered, fn(OrderedItem) -> Result<Delivered, String>>;

impl JetStream for AsyncNats {
    type Kv = kv::Store;
    type Ack = NatsAck;
    type Messages = NatsMessages;

    fn servers(&self) -> &str {
        &self.servers
    }

    fn disconnected(&self) -> Option<String> {
        let state = self.client.connection_state();
        (state != async_nats::connection::State::Connected).then(|| state.to_string())
    }

    async fn reconnect(&self) {
        if let Err(e) = self.client.force_reconnect().await {
            tracing::warn!(error = %e, "cannot reconnect to NATS");
        }
    }

    async fn stream_info(&self) -> Result<StreamInfo, JsError> {
        match self.stream.get_info().await {
            Ok(info) => Ok(info_of(info)),
            Err(e) if stream_not_found(&e) => Err(JsError::NotFound),
            Err(e) => Err(JsError::Other(e.to_string())),
        }
    }

    async fn create_stream(&self, spec: &StreamSpec) -> Result<StreamInfo, JsError> {
        let mut s = self.js.create_stream(spec.config()).await.map_err(|e| JsError::Other(e.to_string()))?;
        Ok(info_of(s.info().await.map_err(|e| JsError::Other(e.to_string()))?.clone()))
    }

    async fn delete_stream(&self) -> Result<(), JsError> {
        match self.js.delete_stream(&self.stream_name).await {
            Ok(_) => Ok(()),
            Err(e)
                if matches!(e.kind(), jetstream::context::DeleteStreamErrorKind::JetStream(je)
                    if je.error_code() == jetstream::ErrorCode::STREAM_NOT_FOUND) =>
            {
                Err(JsError::NotFound)
            }
            Err(e) => Err(JsError::Other(e.to_string())),
        }
    }

    async fn publish(
        &self,
        subject: String,
        headers: HeaderMap,
        payload: Bytes,
        id: String,
    ) -> Result<NatsAck, String> {
        let publish = jetstream::message::PublishMessage::build().payload(payload).headers(headers).message_id(id);
        match self.js.send_publish(subject, publish).await {
            Ok(ack) => Ok(NatsAck::driven(ack)),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn last_by_subject(&self, subject: &str) -> Result<Option<Stored>, String> {
        match self.stream.get_last_raw_message_by_subject(subject).await {
            Ok(msg) => Ok(Some(Stored { sequence: msg.sequence, headers: msg.headers })),
            Err(e) if matches!(e.kind(), stream::LastRawMessageErrorKind::NoMessageFound) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    async fn last_by_subjects(&self, subjects: &HashSet<String>) -> Result<HashMap<String, Stored>, String> {
        let mut found: HashMap<String, Stored> = HashMap::new();
        sweep(&self.stream, format!("{}.>", self.stream_name), true, |m| {
            if let Some(subject) = subjects.get(m.message.subject.as_str()) {
                let sequence = m.info().map_err(|e| e.to_string())?.stream_sequence;
                let headers = m.message.headers.clone().unwrap_or_default();
                // Later ones (stored while the sweep ran) replace earlier ones.
                found.insert(subject.clone(), Stored { sequence, headers });
            }
            Ok(())
        })
        .await
        .map_err(|e| format!("cannot read the last record of {} clusters: {e}", subjects.len()))?;
        Ok(found)
    }

    async fn ordered(&self, from: u64) -> Result<NatsMessages, String> {
        let consumer = self
            .stream
            .create_consumer(consumer::push::OrderedConfig {
                deliver_subject: self.client.new_inbox(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence { start_sequence: from },
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot create the ordered consumer of the local tail: {e}"))?;
        let messages = consumer.messages().await.map_err(|e| format!("cannot follow the stream: {e}"))?;
        Ok(messages.map(delivered as fn(OrderedItem) -> Result<Delivered, String>))
    }

    async fn bucket(&self, spec: &BucketSpec) -> Result<kv::Store, String> {
        let name = spec.name.as_str();
        if let Ok(store) = self.js.get_key_value(name).await {
            return Ok(store);
        }
        // The bucket's stream, as the client library would create it. Created directly
        // because the library's `create_key_value` first parses the account info in a shape
        // newer servers send (2.10+), which Debian's nats-server 2.9 does not.
        let config = stream::Config {
            name: format!("KV_{name}"),
            description: Some("fleetwatch hub state".into()),
            subjects: vec![format!("$KV.{name}.>")],
            max_messages_per_subject: 1,
            max_age: spec.max_age,
            max_message_size: spec.max_value_size.unwrap_or(-1),
            max_bytes: spec.max_bytes.unwrap_or(-1),
            storage: stream::StorageType::File,
            num_replicas: spec.replicas,
            allow_rollup: true,
            deny_delete: true,
            allow_direct: true,
            discard: stream::DiscardPolicy::New,
            duplicate_window: spec.duplicate_window,
            ..Default::default()
        };
        let create = self.js.create_stream(config).await.err();
        // Another replica may have created it meanwhile: the bucket opens either way, or the
        // creation error says why not.
        self.js.get_key_value(name).await.map_err(|e| match create {
            Some(c) => format!("cannot create: {c}"),
            None => e.to_string(),
        })
    }
}

impl KeyValue for kv::Store {
    type Follow = NatsFollow;

    async fn get(&self, key: &str) -> Result<Option<Bytes>, String> {
        kv::Store::get(self, key).await.map_err(|e| e.to_string())
    }

    async fn entry(&self, key: &str) -> Result<Option<KvEntry>, String> {
        let e = kv::Store::entry(self, key).await.map_err(|e| e.to_string())?;
        Ok(e.map(|e| KvEntry {
            is_put: matches!(e.operation, kv::Operation::Put),
            value: e.value,
            revision: e.revision,
        }))
    }

    async fn put(&self, key: &str, value: Bytes) -> Result<u64, String> {
        kv::Store::put(self, key, value).await.map_err(|e| e.to_string())
    }

    async fn create(&self, key: &str, value: Bytes) -> Result<u64, CreateError> {
        kv::Store::create(self, key, value).await.map_err(|e| match e.kind() {
            kv::CreateErrorKind::AlreadyExists => CreateError::AlreadyExists,
            _ => CreateError::Other(e.to_string()),
        })
    }

    async fn update(&self, key: &str, value: Bytes, revision: u64) -> Result<u64, UpdateError> {
        kv::Store::update(self, key, value, revision).await.map_err(|e| match e.kind() {
            kv::UpdateErrorKind::WrongLastRevision => UpdateError::WrongRevision,
            _ => UpdateError::Other(e.to_string()),
        })
    }

    async fn keys(&self) -> Result<Vec<String>, String> {
        let mut keys = kv::Store::keys(self).await.map_err(|e| e.to_string())?;
        let mut out = Vec::new();
        while let Some(k) = keys.next().await {
            out.push(k.map_err(|e| e.to_string())?);
        }
        Ok(out)
    }

    async fn values(&self, keys: Option<&HashSet<String>>) -> Result<HashMap<String, Bytes>, String> {
        let mut found: HashMap<String, Bytes> = HashMap::new();
        sweep(&self.stream, format!("{}>", self.prefix), false, |m| {
            let Some(key) = m.message.subject.as_str().strip_prefix(self.prefix.as_str()) else { return Ok(()) };
            if keys.is_some_and(|k| !k.contains(key)) {
                return Ok(());
            }
            let deleted = m
                .message
                .headers
                .as_ref()
                .and_then(|h| h.get("KV-Operation"))
                .is_some_and(|op| matches!(op.as_str(), "DEL" | "PURGE"));
            if deleted {
                found.remove(key);
            } else {
                found.insert(key.to_string(), m.message.payload.clone());
            }
            Ok(())
        })
        .await
        .map_err(|e| format!("cannot read the values of bucket {}: {e}", self.name))?;
        Ok(found)
    }

    async fn follow(&self) -> Result<NatsFollow, String> {
        // Asked before the watch starts: an empty bucket delivers nothing that could say
        // "caught up" (a value written in between is delivered after it: harmless).
        let mut stream = self.stream.clone();
        let empty = stream.info().await.map_err(|e| e.to_string())?.state.messages == 0;
        let watch = self.watch_with_history(">").await.map_err(|e| e.to_string())?;
        Ok(NatsFollow { watch, caught_up_due: empty, caught_up_sent: false })
    }
}

/// The longest a sweep of a stream's last messages ([`sweep`]) may take.
const SWEEP_TIMEOUT: Duration = Duration::from_secs(15);

/// Gives `each` the last message of every subject under `filter` in `stream`, as the
/// stream was when the consumer was made (and any stored after that until the consumer
/// caught up), in stream order. One ordered consumer: one request, then messages pushed;
/// whatever `each` keeps bounds the memory. Fails after [`SWEEP_TIMEOUT`].
async fn sweep<I>(
    stream: &stream::Stream<I>,
    filter: String,
    headers_only: bool,
    mut each: impl FnMut(&jetstream::Message) -> Result<(), String>,
) -> Result<(), String> {
    let run = async {
        let consumer = stream
            .create_consumer(consumer::push::OrderedConfig {
                // A fresh inbox: the kv store hands out no client to ask for one.
                deliver_subject: format!("_INBOX.fwsweep.{:032x}", rand::random::<u128>()),
                filter_subject: filter,
                headers_only,
                deliver_policy: consumer::DeliverPolicy::LastPerSubject,
                replay_policy: consumer::ReplayPolicy::Instant,
                ..Default::default()
            })
            .await
            .map_err(|e| format!("cannot create the consumer: {e}"))?;
        if consumer.cached_info().num_pending == 0 {
            return Ok(());
        }
        let mut messages = consumer.messages().await.map_err(|e| format!("cannot read the consumer: {e}"))?;
        while let Some(m) = messages.next().await {
            let m = m.map_err(|e| e.to_string())?;
            each(&m)?;
            if m.info().map_err(|e| e.to_string())?.pending == 0 {
                return Ok(());
            }
        }
        Err("the consumer ended before it caught up".to_string())
    };
    tokio::time::timeout(SWEEP_TIMEOUT, run).await.unwrap_or_else(|_| Err(format!("timed out after {SWEEP_TIMEOUT:?}")))
}

/// [`KeyValue::follow`] of async-nats: its watch of every key's latest value (an ordered
/// consumer), with [`KvFollow::CaughtUp`] after the entry that had nothing pending.
pub struct NatsFollow {
    watch: kv::Watch,
    /// `CaughtUp` is the next item.
    caught_up_due: bool,
    caught_up_sent: bool,
}

impl futures_util::Stream for NatsFollow {
    type Item = Result<KvFollow, String>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        if this.caught_up_due && !this.caught_up_sent {
            this.caught_up_sent = true;
            return Poll::Ready(Some(Ok(KvFollow::CaughtUp)));
        }
        match this.watch.poll_next_unpin(cx) {
            Poll::Ready(Some(Ok(e))) => {
                if e.seen_current && !this.caught_up_sent {
                    this.caught_up_due = true;
                }
                let written_ms = u64::try_from(e.created.unix_timestamp_nanos() / 1_000_000).ok();
                Poll::Ready(Some(Ok(KvFollow::Change(KvChange {
                    key: e.key,
                    value: e.value,
                    revision: e.revision,
                    is_put: matches!(e.operation, kv::Operation::Put),
                    written_ms,
                }))))
            }
            Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.to_string()))),
            Poll::Ready(None) => Poll::Ready(None),
            Poll::Pending => Poll::Pending,
        }
    }
}
