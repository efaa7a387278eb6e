//! The other side of `bench hub --vs-nats`: the hub bench's load, sent straight to a NATS
//! JetStream server instead of to a hub, so the two can be compared on the same machine in
//! the same run.
//!
//! The same work on both sides: every synthetic agent is one publisher with its own
//! connection and client certificate (mutual TLS, the bench PKI, the hub's certificate on
//! the server), it publishes the same CloudEvents JSON the agent sends (one message per
//! event on `fwbench.<cluster>`, `Nats-Msg-Id` = cluster/epoch/seq, so resends are
//! deduplicated as the hub does), keeps up to [`WINDOW`] publishes awaiting their acks (an
//! agent keeps a window of unacked batches), and the stream is file-backed. One durable
//! pull consumer in the bench process takes the place of the fleetwatch subscriber and
//! acknowledges cumulatively (`AckPolicy::All`), as a fleetwatch subscriber does.
//!
//! One difference the report states: nats-server does not fsync each write (it syncs its
//! files every two minutes by default), while the hub's `--durable` log fsyncs every group
//! commit and the hub without it keeps memory only.

use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Context;
use async_nats::jetstream::{self, consumer, message::PublishMessage, stream};
use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_bus::nats::server::LocalNatsServer;
use fleetwatch_protocol::event::Event;
use futures_util::StreamExt;
use futures_util::stream::FuturesOrdered;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Subjects are `fwbench.<cluster>`.
pub(super) const SUBJECT_PREFIX: &str = "fwbench";

/// The stream every publisher writes to.
pub(super) const STREAM: &str = "FWBENCH";

/// Publishes one publisher keeps awaiting their acks.
const WINDOW: usize = 256;

/// Starts a local `nats-server -js` with its store under `dir` and mutual TLS from the bench
/// PKI in `pki` (the hub's certificate and key; client certificates must chain to `ca.crt`).
pub(super) async fn start_server(pki: &Path, dir: &Path) -> anyhow::Result<LocalNatsServer> {
    let arg = |p: &str| pki.join(p).display().to_string();
    let extra = vec![
        "--tls".to_string(),
        "--tlscert".into(),
        arg("hub.crt"),
        "--tlskey".into(),
        arg("hub.key"),
        "--tlsverify".into(),
        "--tlscacert".into(),
        arg("ca.crt"),
    ];
    let store = dir.to_path_buf();
    tokio::task::spawn_blocking(move || LocalNatsServer::start_with(&store, 0, &extra))
        .await?
        .context("cannot start a local nats-server for --vs-nats")
}

/// A client connection with certificate `stem` of the bench PKI.
pub(super) async fn connect(pki: &Path, url: &str, stem: &str) -> anyhow::Result<async_nats::Client> {
    async_nats::ConnectOptions::new()
        .add_client_certificate(pki.join(format!("{stem}.crt")), pki.join(format!("{stem}.key")))
        .add_root_certificates(pki.join("ca.crt"))
        .require_tls(true)
        // The bench starts a thousand of these at once; the default would give up on the
        // slowest handshakes.
        .connection_timeout(Duration::from_secs(30))
        .connect(url)
        .await
        .with_context(|| format!("cannot connect to {url} as {stem}"))
}

/// Creates the file-backed stream (removing one left by an earlier round) and a durable pull
/// consumer for new messages, and returns the consumer's message stream.
pub(super) async fn subscribe(client: &async_nats::Client) -> anyhow::Result<consumer::pull::Stream> {
    let js = jetstream::new(client.clone());
    let _ = js.delete_stream(STREAM).await;
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec![format!("{SUBJECT_PREFIX}.>")],
            storage: stream::StorageType::File,
            max_bytes: 2 << 30,
            duplicate_window: Duration::from_secs(120),
            ..Default::default()
        })
        .await
        .context("cannot create the bench stream")?;
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("bench".into()),
            deliver_policy: consumer::DeliverPolicy::New,
            ack_policy: consumer::AckPolicy::All,
            max_ack_pending: 100_000,
            ..Default::default()
        })
        .await
        .context("cannot create the bench consumer")?;
    consumer.stream().max_messages_per_batch(1_000).messages().await.context("cannot pull from the bench consumer")
}

/// Synthetic agents as JetStream publishers (in the bench process or in one load process).
pub(super) struct PublisherGroup {
    connected: Arc<AtomicU64>,
    stop: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl PublisherGroup {
    /// Connects publishers `range` (agent indices into the bench PKI) to `url` and starts
    /// their sources.
    pub async fn start(pki: &Path, url: &str, range: Range<usize>, source: &SyntheticSource) -> anyhow::Result<Self> {
        let connected = Arc::new(AtomicU64::new(0));
        let stop = CancellationToken::new();
        let mut tasks = Vec::new();
        for i in range {
            let (pki, url, source) = (pki.to_path_buf(), url.to_string(), source.clone());
            let (connected, stop) = (connected.clone(), stop.clone());
            tasks.push(tokio::spawn(async move {
                let cluster = format!("bench-{i}");
                let client = match connect(&pki, &url, &format!("agent-{cluster}")).await {
                    Ok(c) => c,
                    Err(e) => {
                        tracing::warn!(%cluster, "publisher not connected: {e:#}");
                        return;
                    }
                };
                connected.fetch_add(1, Ordering::Relaxed);
                publish(client, &cluster, source, stop).await;
                connected.fetch_sub(1, Ordering::Relaxed);
            }));
        }
        Ok(Self { connected, stop, tasks })
    }

    /// Publishers connected.
    pub fn connected(&self) -> usize {
        self.connected.load(Ordering::Relaxed) as usize
    }

    /// Stops the sources and waits (at most 10 s) for the publishers to have their acks.
    pub async fn stop(self) {
        self.stop.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(10), futures_util::future::join_all(self.tasks)).await;
    }
}

/// One publisher: its source's changes as events on `fwbench.<cluster>`, at most [`WINDOW`]
/// awaiting acks. A refused publish is counted and logged once.
async fn publish(client: async_nats::Client, cluster: &str, source: SyntheticSource, stop: CancellationToken) {
    let js = jetstream::new(client);
    let (tx, mut rx) = mpsc::channel(1024);
    tokio::spawn(source.produce(tx, stop.clone()));
    let subject = format!("{SUBJECT_PREFIX}.{cluster}");
    let epoch = jiff::Timestamp::now().as_millisecond() as u64;
    let mut seq = 0u64;
    let mut pending = FuturesOrdered::new();
    let mut refused = false;
    loop {
        tokio::select! {
            biased;
            Some(acked) = pending.next(), if !pending.is_empty() => {
                let acked: Result<_, async_nats::jetstream::context::PublishError> = acked;
                if let Err(e) = acked && !refused {
                    refused = true;
                    tracing::warn!(%cluster, "JetStream refused a publish: {e}");
                }
            }
            change = rx.recv(), if pending.len() < WINDOW => {
                let Some(change) = change else { break };
                seq += 1;
                let event = Event::applied(cluster, epoch, seq, &change.key, change.data);
                let Ok(body) = serde_json::to_vec(&event) else { continue };
                let message = PublishMessage::build().payload(body.into()).message_id(format!("{cluster}/{epoch}/{seq}"));
                match js.send_publish(subject.clone(), message).await {
                    Ok(ack) => pending.push_back(ack.into_future()),
                    Err(e) => {
                        tracing::warn!(%cluster, "cannot publish: {e}");
                        break;
                    }
                }
            }
        }
    }
    while pending.next().await.is_some() {}
}
