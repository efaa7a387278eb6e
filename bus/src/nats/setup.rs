//! Setting the bus up: connecting to NATS, creating (or checking) the stream and the
//! key-value buckets, the cursor store's meta entry and the bus's format, and opening a
//! [`NatsBus`] on them.

use std::collections::{BTreeMap, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_nats::{ServerAddr, jetstream};

use crate::Bus;
use crate::log::{Core, Log};

use super::chain::Chain;
use super::heads::load_heads;
use super::io_thread::IoThread;
use super::jetstream::{AsyncNats, BucketSpec, CreateError, JetStream, JsError, KeyValue, StreamInfo, StreamSpec};
use super::probe::probe;
use super::recreate::lineage_of;
use super::state::{META_KEY, Meta, NATS_FORMAT};
use super::tail::{StreamState, age_retention};
use super::{
    DUPLICATE_WINDOW, FLEET_BUCKET_BYTES, FLEET_ENTRY_BYTES, FLEET_MAX_AGE, NatsBus, NatsError, NatsOptions,
    RECONNECT_DELAY_MAX, REPLICA_TTL, REQUEST_TIMEOUT, lock, state,
};

impl NatsBus<AsyncNats> {
    /// Connects, creates (or checks) the stream and the buckets, loads the retained records
    /// into the local tail and starts following the stream. Fails with one error naming
    /// the cause when the servers are unreachable, refuse the credentials, or the stream
    /// exists with other settings.
    pub async fn open(opts: NatsOptions) -> Result<Arc<Self>, NatsError> {
        check_options(&opts)?;
        let io = IoThread::start()?;
        let connecting = opts.clone();
        let (client, servers) = io
            .handle
            .spawn(async move { connect(&connecting).await })
            .await
            .map_err(|e| NatsError::Settings(format!("the NATS connection thread failed: {e}")))??;
        let js = jetstream::ContextBuilder::new().timeout(REQUEST_TIMEOUT).build(client.clone());
        let js = AsyncNats::new(client, js, &opts.stream, servers, io)
            .await
            .map_err(|cause| NatsError::Stream { stream: opts.stream.clone(), cause })?;
        NatsBus::open_on(js, opts).await
    }
}

pub(super) fn check_options(opts: &NatsOptions) -> Result<(), NatsError> {
    if !valid_stream_name(&opts.stream) {
        return Err(NatsError::Settings(format!(
            "stream name {:?}: use letters, digits, '-' and '_' (at most 200)",
            opts.stream
        )));
    }
    if opts.replicas == 0 || opts.replicas > 5 {
        return Err(NatsError::Settings(format!("--bus-replicas {}: JetStream allows 1 to 5", opts.replicas)));
    }
    Ok(())
}

fn valid_stream_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 200 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
}

impl<J: JetStream> NatsBus<J> {
    /// [`NatsBus::open`] on a JetStream given (the simulation's in-memory one), bound to
    /// `opts.stream`; `opts.servers` and the TLS settings are unused.
    pub async fn open_on(js: J, opts: NatsOptions) -> Result<Arc<Self>, NatsError> {
        check_options(&opts)?;
        let (info, created_after_wait) = ensure_stream(&js, &opts).await?;
        let lineage = lineage_of(&opts.stream, &info);
        let stream_id = lineage.id.clone();
        let durable = info.durable;
        let heads_bucket = format!("{}_heads", opts.stream);
        let cursors_bucket = format!("{}_cursors", opts.stream);
        let replicas_bucket = format!("{}_replicas", opts.stream);
        let fleet_bucket = format!("{}_fleet", opts.stream);
        let heads_kv = ensure_bucket(&js, &bucket_spec(&heads_bucket, opts.replicas, Duration::ZERO)).await?;
        let cursors_kv = ensure_bucket(&js, &bucket_spec(&cursors_bucket, opts.replicas, Duration::ZERO)).await?;
        let replicas_kv = ensure_bucket(&js, &bucket_spec(&replicas_bucket, opts.replicas, REPLICA_TTL)).await?;
        let fleet_kv = ensure_bucket(&js, &fleet_spec(&fleet_bucket, opts.replicas)).await?;
        // A cursor store first written while the bus already has history was recreated (or
        // is from a release that did not write the entry): names not in it may have existed.
        // So may they in a bus this hub created after waiting for a missing stream: JetStream
        // may have lost its store while no replica that knew the bus ran (or it is the first
        // start; a durable subscriber's first subscription then costs one resync, as on a
        // memory bus). Seed 263 of the simulation's `--storage nats` lost a durable
        // subscriber's changes: placed at `latest` of the new bus as a new name.
        let had_history = info.state.last_sequence > 0 || lineage.base > 0;
        let meta = Meta {
            names_lost: had_history || created_after_wait,
            begun_after_wait: !had_history && created_after_wait,
            format: NATS_FORMAT,
        };
        ensure_meta(&cursors_kv, &cursors_bucket, meta).await?;
        check_format(&cursors_kv, &cursors_bucket).await?;

        // Heads of every cluster (the tail, once started, loads them again).
        let heads = load_heads(&heads_kv, &heads_bucket).await?;
        let bus = Arc::new_cyclic(|me| Self {
            me: me.clone(),
            stream: opts.stream.clone(),
            stream_id: stream_id.clone(),
            durable,
            // Empty until the local tail starts (see [`NatsBus::start_tail`]).
            core: Core::new(Log::new(), crate::cursors::CursorStore::memory(), stream_id),
            retention: opts.retention,
            heads: Mutex::new(heads),
            heads_kv,
            heads_bucket,
            cursors_kv,
            cursors_bucket,
            replicas_kv,
            replicas_bucket,
            fleet_kv,
            fleet_bucket,
            buckets_generation: AtomicU64::new(0),
            dirty: Mutex::new(HashMap::new()),
            regs: Mutex::new(HashMap::new()),
            opts: opts.clone(),
            base: AtomicU64::new(lineage.base),
            created: Mutex::new(info.created_ns),
            taking_on: Mutex::new(None),
            adopting: AtomicBool::new(false),
            poisoned: Mutex::new(None),
            recheck: Arc::new(tokio::sync::Notify::new()),
            tail_generation: AtomicU64::new(0),
            probes_begun: AtomicU64::new(0),
            probed: tokio::sync::watch::channel((0, 0)).0,
            tail_task: Mutex::new(None),
            dirty_heads: Mutex::new(HashMap::new()),
            head_revisions: Mutex::new(HashMap::new()),
            head_pacing: Mutex::new(Default::default()),
            uncertain: Mutex::new(Default::default()),
            absent: Mutex::new(Default::default()),
            head_reads: Default::default(),
            local_waiters: Mutex::new(BTreeMap::new()),
            pending: Mutex::new(HashMap::new()),
            generation: AtomicU64::new(0),
            chain: Mutex::new(Chain { last: HashMap::new(), seen_from: 1, before_marker: false }),
            tail_starting: tokio::sync::Mutex::new(()),
            tail_started: AtomicBool::new(false),
            tail_ready: AtomicBool::new(false),
            lost_names_begun: AtomicBool::new(false),
            marker_base: AtomicU64::new(0),
            stream_state: Mutex::new(StreamState::of(&info.state, lineage.base)),
            unhealthy: Mutex::new(None),
            stream_last: AtomicU64::new(info.state.last_sequence + lineage.base),
            write_failures: AtomicU64::new(0),
            tasks: Mutex::new(Vec::new()),
            js,
        });

        let probe = tokio::spawn(probe(Arc::downgrade(&bus), bus.recheck.clone()));
        let age = tokio::spawn(age_retention(Arc::downgrade(&bus)));
        let heads = tokio::spawn(super::head_reads::serve(Arc::downgrade(&bus), bus.head_reads.wake.clone()));
        lock(&bus.tasks).extend([probe.abort_handle(), age.abort_handle(), heads.abort_handle()]);
        tracing::info!(stream = %opts.stream, servers = %bus.js.servers(), first = bus.stats().first_offset, last = bus.last_offset(), "bus on NATS JetStream");
        Ok(bus)
    }
}

pub(super) async fn connect(opts: &NatsOptions) -> Result<(async_nats::Client, String), NatsError> {
    if opts.servers.is_empty() {
        return Err(NatsError::Settings("no NATS server given".into()));
    }
    let mut addrs = Vec::new();
    for s in &opts.servers {
        let addr: ServerAddr = s.parse().map_err(|e| NatsError::Settings(format!("server address {s:?}: {e}")))?;
        addrs.push(addr);
    }
    // Shown in errors and logs without a password.
    let servers =
        addrs.iter().map(|a| format!("{}://{}:{}", a.scheme(), a.host(), a.port())).collect::<Vec<_>>().join(",");
    let mut o = async_nats::ConnectOptions::new()
        .name("fleetwatch-hub")
        .connection_timeout(REQUEST_TIMEOUT)
        .request_timeout(Some(REQUEST_TIMEOUT))
        .max_reconnects(None)
        .reconnect_delay_callback(|attempts| {
            Duration::from_millis(2u64.saturating_pow(u32::try_from(attempts).unwrap_or(u32::MAX)))
                .min(RECONNECT_DELAY_MAX)
        });
    // nats://USER:PASSWORD@HOST:PORT: the client library does not read them from the URL.
    if let Some(a) = addrs.iter().find(|a| a.has_user_pass()) {
        o = o.user_and_password(a.username().unwrap_or_default().into(), a.password().unwrap_or_default().into());
    }
    if let Some(path) = &opts.creds {
        o = o
            .credentials_file(path)
            .await
            .map_err(|e| NatsError::Credentials { path: path.clone(), cause: e.to_string() })?;
    }
    for p in [&opts.tls_cert, &opts.tls_key, &opts.tls_ca].into_iter().flatten() {
        std::fs::metadata(p).map_err(|e| NatsError::Settings(format!("cannot read {}: {e}", p.display())))?;
    }
    match (&opts.tls_cert, &opts.tls_key) {
        (Some(c), Some(k)) => o = o.add_client_certificate(c.clone(), k.clone()).require_tls(true),
        (None, None) => {}
        _ => return Err(NatsError::Settings("--bus-tls-cert and --bus-tls-key go together".into())),
    }
    if let Some(ca) = &opts.tls_ca {
        o = o.add_root_certificates(ca.clone()).require_tls(true);
    }
    let client = o.connect(addrs).await.map_err(|e| {
        use async_nats::ConnectErrorKind::*;
        let lasting = matches!(e.kind(), ServerParse | Authentication | AuthorizationViolation | Tls);
        NatsError::Connect { servers: servers.clone(), cause: e.to_string(), lasting }
    })?;
    Ok((client, servers))
}

/// The stream this hub wants (a fresh one's description; a recreated one states its
/// lineage instead).
pub(super) fn wanted_spec(opts: &NatsOptions) -> StreamSpec {
    let age = opts.retention.age.unwrap_or(Duration::ZERO);
    let window = if age.is_zero() { DUPLICATE_WINDOW } else { DUPLICATE_WINDOW.min(age) };
    StreamSpec {
        name: opts.stream.clone(),
        description: state::describe(None),
        max_messages: i64::try_from(opts.retention.records).unwrap_or(i64::MAX),
        max_bytes: i64::try_from(opts.retention.bytes).unwrap_or(i64::MAX),
        max_age: age,
        replicas: opts.replicas,
        duplicate_window: window,
    }
}

/// The stream's configuration as async-nats takes it.
#[cfg(test)]
pub(super) fn wanted_config(opts: &NatsOptions) -> async_nats::jetstream::stream::Config {
    wanted_spec(opts).config()
}

/// Creates the stream, or checks that the existing one has our settings; answers with
/// whether the bus was begun after a wait for a missing stream: this hub waited (and
/// created the stream then, or found the one another replica created meanwhile), or the
/// stream's description says its creator did.
pub(super) async fn ensure_stream<J: JetStream>(js: &J, opts: &NatsOptions) -> Result<(StreamInfo, bool), NatsError> {
    let want = wanted_spec(opts);
    let stream_err = |cause: String| NatsError::Stream { stream: opts.stream.clone(), cause };
    let deadline = tokio::time::Instant::now() + opts.missing_stream_wait;
    let mut found = js.stream_info().await;
    // Missing at first and waited for: a stream found afterwards may be a new bus another
    // replica began after waiting too, and answers as if this one had begun it (seed 10841:
    // two replicas started together after JetStream lost its store; the one that found the
    // other's new stream wrote the cursor store's meta entry first, saying no names were
    // lost, and a durable subscriber returning from `latest` was placed at the end).
    let waited = matches!(found, Err(JsError::NotFound)) && !opts.missing_stream_wait.is_zero();
    while matches!(found, Err(JsError::NotFound)) && tokio::time::Instant::now() < deadline {
        tracing::info!(stream = %opts.stream, wait = ?opts.missing_stream_wait, "no JetStream stream: waiting for a running hub replica to recreate it (NATS may have lost its store) before creating a new bus");
        tokio::time::sleep(Duration::from_millis(250)).await;
        found = js.stream_info().await;
    }
    match found {
        Ok(info) => {
            let diffs = info.settings.differences(&want.settings());
            if diffs.is_empty() {
                // A new bus its creator began after waiting for a missing stream answers so
                // here too, though this hub found it at once: the cursor store's meta entry
                // is written by whichever replica comes first (seed 15240: a replica
                // restarted while another waited found the stream the other had just
                // created, wrote the meta entry first saying no names were lost, and a
                // durable subscriber coming back from `latest` was placed at the new bus's
                // end as a new name, past the changes agents resent into it).
                let begun = info.description.as_deref().is_some_and(state::begun_after_wait);
                Ok((info, waited || begun))
            } else {
                Err(NatsError::Conflict { stream: opts.stream.clone(), what: diffs.join("; ") })
            }
        }
        Err(JsError::NotFound) => {
            let after_wait = !opts.missing_stream_wait.is_zero();
            let mut spec = want;
            if after_wait {
                // Said in the description, created with the stream in one step, so every
                // replica that finds this bus knows it (see above).
                spec.description = state::describe_begun_after_wait();
            }
            let info = js.create_stream(&spec).await.map_err(|e| stream_err(format!("cannot create: {e}")))?;
            Ok((info, after_wait))
        }
        Err(e) => Err(stream_err(format!("{e} (is JetStream enabled on the server?)"))),
    }
}

/// A bucket of `replicas` whose entries expire `max_age` after their last write (zero:
/// never), without bounds on values or bytes.
pub(super) fn bucket_spec(name: &str, replicas: usize, max_age: Duration) -> BucketSpec {
    let window = if max_age.is_zero() { DUPLICATE_WINDOW } else { DUPLICATE_WINDOW.min(max_age) };
    BucketSpec::new(name, replicas, max_age, window)
}

/// The fleet bucket: one entry per cluster, bounded in value size and bytes, expiring
/// [`FLEET_MAX_AGE`] after its last write (see [`crate::nats`]).
pub(super) fn fleet_spec(name: &str, replicas: usize) -> BucketSpec {
    BucketSpec {
        max_value_size: i32::try_from(FLEET_ENTRY_BYTES).ok(),
        max_bytes: Some(FLEET_BUCKET_BYTES),
        ..bucket_spec(name, replicas, FLEET_MAX_AGE)
    }
}

pub(super) async fn ensure_bucket<J: JetStream>(js: &J, spec: &BucketSpec) -> Result<J::Kv, NatsError> {
    js.bucket(spec).await.map_err(|cause| NatsError::KeyValue { bucket: spec.name.clone(), cause })
}

/// Writes the meta entry of a cursor bucket this hub just opened, unless it has one.
/// Refuses a bus a newer release keeps in another format (the cursors bucket's meta entry
/// says which): a rolled-back hub must not read it as its own. Reads only.
pub(super) async fn check_format<K: KeyValue>(store: &K, bucket: &str) -> Result<(), NatsError> {
    let meta = store
        .get(META_KEY)
        .await
        .map_err(|e| NatsError::KeyValue { bucket: bucket.into(), cause: format!("read the meta entry: {e}") })?;
    let format = meta.and_then(|m| serde_json::from_slice::<Meta>(&m).ok()).map_or(NATS_FORMAT, |m| m.format);
    if format > NATS_FORMAT {
        let cause = format!(
            "the bus is kept in format {format}, newer than this hub's {NATS_FORMAT} (fleetwatch {}): run a release \
             that reads it (docs/upgrade.md); this hub does not use it",
            env!("CARGO_PKG_VERSION")
        );
        return Err(NatsError::NewerFormat { bucket: bucket.into(), cause });
    }
    Ok(())
}

pub(super) async fn ensure_meta<K: KeyValue>(store: &K, bucket: &str, meta: Meta) -> Result<(), NatsError> {
    let value = serde_json::to_vec(&meta).unwrap_or_default();
    match store.create(META_KEY, value.into()).await {
        Ok(_) => {
            // A store lost under a bus with history is news; a bus begun after the wait is
            // also every first start.
            if meta.begun_after_wait {
                tracing::info!(
                    bucket,
                    "this hub began the bus after waiting for a missing stream (a first start, or JetStream lost its store while no hub replica ran): a durable subscriber whose name is not found gets resync-required * at its first subscription"
                );
            } else if meta.names_lost {
                tracing::warn!(
                    bucket,
                    "the durable cursor store was recreated while the bus had history: a durable subscriber whose name is not found gets resync-required *"
                );
            }
            Ok(())
        }
        Err(CreateError::AlreadyExists) => Ok(()),
        Err(e) => Err(NatsError::KeyValue { bucket: bucket.into(), cause: format!("write the meta entry: {e}") }),
    }
}
