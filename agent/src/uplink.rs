//! The uplink: the last arrow in the agent (source → outbox → uplink → hub).
//!
//! One task owns the outbox and the connection, and selects over source changes, hub
//! messages, sending and shutdown: with a single owner there is no lock around the outbox
//! and no ordering question between "take a change" and "send what is pending". It
//! reconnects forever with its own backoff ([`fleetwatch_client::backoff`]), resumes from
//! the hub's last ack, and keeps absorbing changes while disconnected (the outbox coalesces
//! them). Programs run it through [`crate::runtime::AgentRuntime`], not directly. What a
//! session decides (what may be sent, which acks count, when it ends: drain, renewal,
//! silence) is the pure [`crate::link::Link`]; this module carries it out.

use std::time::Duration;

use fleetwatch_certs::{FileChecks, TlsFiles};
use fleetwatch_client::backoff::ConnectWait;
use fleetwatch_client::backoff::Reconnect;
use fleetwatch_client::transport::{ClientWs, ConnectError, Dialer, HubUrls, connect_any};
use fleetwatch_protocol::Limits;
use fleetwatch_protocol::codec::{DecodeError, decode_hub_to_agent, encode};
use fleetwatch_protocol::message::{
    AgentMessage, ErrorCode, Hello, HubToAgent, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, ProtocolRange, WatchSpec,
    WatchState, WatchStatusReport,
};
use futures_util::{SinkExt, StreamExt};
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::link::{self, AckRefused, Closing, Link, WelcomeRefused};
use crate::outbox::Outbox;
use crate::source::Change;

/// Agent settings.
#[derive(Debug, Clone)]
pub struct AgentConfig {
    /// The hub replicas, tried in order: the agent stays with the one it reached and moves
    /// to the next when it cannot connect.
    pub hub: HubUrls,
    /// Client certificate, key and the CA that signed the hub's certificate.
    pub tls: TlsFiles,
    /// Objects the outbox holds before it collapses into a resync marker.
    pub outbox_capacity: usize,
    /// Bytes of events the outbox holds before it collapses into a resync marker.
    pub outbox_max_bytes: usize,
    /// Most events per frame.
    pub batch_size: usize,
    /// Most unacked seqs in flight.
    pub window: u64,
    /// Time for one connect attempt; doubled after each attempt in which every hub timed
    /// out (a queue at busy hubs), up to 80 s, and back after a connection
    /// ([`ConnectWait`]).
    pub connect_timeout: Duration,
    /// Without any frame from the hub (data, ping or pong) for this long, the connection is
    /// dead. The agent pings a hub silent for half of it (a hub pings its sessions more often,
    /// so a healthy one is not pinged), so a half-open connection is noticed even when the
    /// hub's pings cannot arrive.
    pub idle_timeout: Duration,
    /// On shutdown, how long to wait for the hub to ack what is pending.
    pub drain_timeout: Duration,
    /// Message limits.
    pub limits: Limits,
    /// How long to wait before reconnecting after the hub refused this agent for good
    /// (revoked, wrong identity): long, because retrying fast does not fix those.
    pub refused_retry: Duration,
    /// How long to wait before reconnecting after the hub found no protocol version in
    /// common (`unsupported-version`): minutes, since only an upgrade of the agent or the
    /// hub fixes it, and a fleet of agents retrying fast would load the hub for nothing.
    pub version_retry: Duration,
    /// Delays between reconnects after a failed connect or a lost connection (restarted
    /// after every session that got as far as a welcome).
    pub reconnect: Reconnect,
    /// How often the certificate, key and CA files are read for changes when nothing
    /// reported one (with [`tls_watch`](Self::tls_watch) a change is seen at once; this is the
    /// fallback); they are also read before every connection. A renewed certificate makes
    /// the agent reconnect with it (gracefully: in-flight events are acked first, the outbox
    /// is kept); a changed CA bundle is used from the next connection on.
    pub tls_reload_interval: Duration,
    /// Whether the directories of the certificate files are watched (inotify), so that a
    /// renewal is seen at once rather than at the next fallback read.
    pub tls_watch: bool,
    /// How the hub is reached: TCP unless a simulation supplies its own network.
    pub dialer: Dialer,
    /// The epoch of this agent process; `None` takes the start time in microseconds (a
    /// new epoch per start). A simulation sets it from its own clock so a run replays.
    pub epoch: Option<u64>,
}

impl AgentConfig {
    /// Settings with defaults.
    pub fn new(hub: impl Into<HubUrls>, tls: TlsFiles) -> Self {
        Self {
            hub: hub.into(),
            tls,
            outbox_capacity: 100_000,
            outbox_max_bytes: crate::outbox::DEFAULT_MAX_BYTES,
            batch_size: 500,
            window: 5_000,
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(30),
            drain_timeout: Duration::from_secs(5),
            limits: Limits::default(),
            refused_retry: Duration::from_secs(30),
            version_retry: Duration::from_secs(300),
            reconnect: Reconnect::default(),
            tls_reload_interval: fleetwatch_certs::watch::DEFAULT_FALLBACK,
            tls_watch: true,
            dialer: Dialer::default(),
            epoch: None,
        }
    }
}

/// Why the agent cannot run.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    /// Its certificate or key is unusable.
    #[error(transparent)]
    Tls(#[from] fleetwatch_certs::CertError),
    /// Its certificate is not an agent certificate.
    #[error("{0} is not an agent certificate (expected a spiffe://<trust-domain>/cluster/<id> identity)")]
    NotAnAgent(String),
    /// The hub refused the agent for good (identity, protocol version).
    #[error("hub refused the agent ({code}): {message}")]
    Refused {
        /// The code.
        code: ErrorCode,
        /// The hub's message.
        message: String,
    },
    /// The first connection failed (later ones are retried forever).
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// One of the agent's tasks panicked or was aborted.
    #[error("agent task failed: {0}")]
    Task(#[from] tokio::task::JoinError),
}

/// Why a connection to the hub was lost; the uplink reconnects after each.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Sending a frame failed.
    #[error(transparent)]
    Send(tokio_tungstenite::tungstenite::Error),
    /// Our keep-alive ping could not be sent.
    #[error("cannot ping the hub: {0}")]
    Ping(#[source] tokio_tungstenite::tungstenite::Error),
    /// Reading a frame failed.
    #[error(transparent)]
    Receive(tokio_tungstenite::tungstenite::Error),
    /// The hub sent something that is not a valid message.
    #[error(transparent)]
    Decode(#[from] DecodeError),
    /// The hub closed the connection (with its close frame, if any).
    #[error("hub closed the connection{}", close_detail(.0.as_ref()))]
    Closed(Option<CloseFrame>),
    /// The connection ended without a close frame.
    #[error("connection closed")]
    Ended,
    /// The hub did not answer our hello in time.
    #[error("no welcome from hub")]
    NoWelcome,
    /// The hub answered our hello with something else.
    #[error("expected welcome, got {0}")]
    NotWelcome(String),
    /// The hub welcomed another epoch than ours.
    #[error("welcome for epoch {got} but ours is {ours}")]
    EpochMismatch {
        /// The welcome's epoch.
        got: u64,
        /// Ours.
        ours: u64,
    },
    /// The hub reported a fatal error that retrying may fix.
    #[error("{code}: {message}")]
    Hub {
        /// The code.
        code: ErrorCode,
        /// The hub's message.
        message: String,
    },
    /// Nothing arrived from the hub for the idle timeout.
    #[error("no frame from the hub (not even a pong to our pings) for {0:?}")]
    Idle(Duration),
}

fn close_detail(frame: Option<&CloseFrame>) -> String {
    frame.map(|f| format!(": {} {}", u16::from(f.code), f.reason)).unwrap_or_default()
}

/// Counters an embedding program can watch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AgentStats {
    /// Whether a session is open.
    pub connected: bool,
    /// Changes taken from the source.
    pub changes: u64,
    /// Highest acked seq.
    pub acked_seq: u64,
    /// Highest seq assigned.
    pub last_seq: u64,
    /// Events waiting in the outbox.
    pub outbox_len: usize,
    /// Bytes of events waiting in the outbox.
    pub outbox_bytes: usize,
    /// Events larger than the per-event limit, sent cut down.
    pub truncated: u64,
    /// Times the outbox collapsed into a resync marker.
    pub overflows: u64,
    /// Sessions opened.
    pub sessions: u64,
    /// Serial (lower-case hex) of the client certificate in use.
    pub cert_serial: String,
    /// When the client certificate in use expires.
    pub cert_not_after: Option<jiff::Timestamp>,
    /// Reconnects made to put a renewed certificate in use.
    pub renewals: u64,
    /// Connect attempts that reached no hub (every hub of the list failed).
    pub connect_failures: u64,
    /// Of those, attempts in which the hubs timed out (the agent queued at busy hubs).
    pub connect_timeouts: u64,
    /// Turns of the session's loop (a frame, a change, a timer): what an idle session
    /// costs. An idle session turns about once per ping interval of the hub. Published with
    /// the other counters, never on its own.
    pub wakeups: u64,
}

/// A configured uplink, ready to run.
pub struct Uplink {
    config: AgentConfig,
    cluster: String,
    tls: fleetwatch_certs::ReloadingClientConfig,
    stats: watch::Sender<AgentStats>,
    watches: watch::Sender<Vec<WatchSpec>>,
    watch_status: Option<watch::Receiver<Vec<WatchState>>>,
}

enum SessionEnd {
    /// Lost the connection; reconnect.
    Lost(LinkError),
    /// Shutdown finished.
    Done,
    /// The hub refused us for good.
    Refused(ErrorCode, String),
    /// Closed to reconnect with a renewed certificate.
    Renewed,
}

impl Uplink {
    /// Loads the certificate and finds the cluster id in it.
    pub fn new(config: AgentConfig) -> Result<Self, AgentError> {
        fleetwatch_certs::install_crypto_provider();
        let info = fleetwatch_certs::inspect_file(&config.tls.cert)?;
        let cluster = info
            .identity
            .and_then(|id| id.cluster_id().map(str::to_string))
            .ok_or_else(|| AgentError::NotAnAgent(config.tls.cert.display().to_string()))?;
        let tls = fleetwatch_certs::ReloadingClientConfig::new(config.tls.clone())?;
        Ok(Self {
            config,
            cluster,
            tls,
            stats: watch::channel(AgentStats::default()).0,
            watches: watch::channel(Vec::new()).0,
            watch_status: None,
        })
    }

    /// Reports these watch states to the hub (on connect and on every change).
    pub fn with_watch_status(mut self, status: watch::Receiver<Vec<WatchState>>) -> Self {
        self.watch_status = Some(status);
        self
    }

    /// The cluster id from the certificate.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Live counters.
    pub fn stats(&self) -> watch::Receiver<AgentStats> {
        self.stats.subscribe()
    }

    /// The watch configuration the hub pushed last.
    pub fn watches(&self) -> watch::Receiver<Vec<WatchSpec>> {
        self.watches.subscribe()
    }

    /// Runs until `shutdown`: takes changes from `changes`, streams them to the hub.
    /// The first connection's failure is returned when `fail_fast` is set (a CLI reports
    /// a wrong address or certificate at once); otherwise it retries forever.
    pub async fn run(
        self,
        mut changes: mpsc::Receiver<Change>,
        shutdown: CancellationToken,
        fail_fast: bool,
    ) -> Result<AgentStats, AgentError> {
        // A new epoch per start: the hub then knows earlier unacked events are gone.
        let epoch = self.config.epoch.unwrap_or_else(|| jiff::Timestamp::now().as_microsecond().max(1) as u64);
        let mut outbox = Outbox::new(&self.cluster, epoch, self.config.outbox_capacity)
            .with_limits(self.config.outbox_max_bytes, self.config.limits.max_event_bytes);
        // This agent has no memory of what it sent before it started: ask for a full resync.
        outbox.push_resync("agent started");
        let mut stats = AgentStats::default();
        self.note_certificate(&mut stats);
        let mut source_open = true;
        let mut backoff = self.config.reconnect.delays();
        let mut connect_wait = ConnectWait::new(self.config.connect_timeout);
        let mut first = true;
        let mut connected_once = false;
        let mut tls_checks = self.tls.checks(self.config.tls_reload_interval, self.config.tls_watch);
        // The replica to try first: the one reached last (a restarted hub is back quickly;
        // a dead one fails at once and the next is tried within the same attempt).
        let mut current = 0;
        loop {
            // A certificate renewed while disconnected (perhaps the reason the last
            // attempt failed: the old one expired) is used for this attempt.
            self.reload_tls(&mut stats);
            tls_checks.checked();
            // Disconnected: keep absorbing changes while connecting.
            let connecting = connect_any(
                &self.config.dialer,
                &self.config.hub,
                current,
                self.tls.current(),
                &self.config.limits,
                connect_wait.current(),
            );
            tokio::pin!(connecting);
            let ws = loop {
                tokio::select! {
                    res = &mut connecting => break Some(res),
                    ch = changes.recv(), if source_open => match ch {
                        Some(ch) => { push(&mut outbox, ch); stats.changes += 1; }
                        None => source_open = false,
                    },
                    _ = shutdown.cancelled() => break None,
                }
            };
            let Some(ws) = ws else {
                tracing::info!(
                    pending = outbox.len(),
                    "shutting down while disconnected; pending events are dropped and the next start resyncs"
                );
                return Ok(self.final_stats(&stats, &outbox));
            };
            let ws = match ws {
                Ok((ws, reached)) => {
                    if reached != current {
                        tracing::info!(hub = %self.config.hub.get(reached), "failed over to another hub");
                    }
                    current = reached;
                    connect_wait.connected();
                    ws
                }
                Err(e) => {
                    if first && fail_fast {
                        return Err(e.into());
                    }
                    stats.connect_failures += 1;
                    if matches!(e, ConnectError::Timeout(_)) {
                        // Queued at a busy hub: keep the place next time (see ConnectWait).
                        connect_wait.timed_out();
                        stats.connect_timeouts += 1;
                    }
                    self.publish(&stats, &outbox);
                    first = false;
                    let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(error = %e, retry_in = ?wait, "cannot reach hub");
                    if sleep_absorbing(wait, &mut changes, &mut outbox, &mut source_open, &mut stats, &shutdown).await {
                        return Ok(self.final_stats(&stats, &outbox));
                    }
                    continue;
                }
            };
            first = false;
            stats.sessions += 1;
            let io = SessionIo {
                outbox: &mut outbox,
                changes: &mut changes,
                source_open: &mut source_open,
                stats: &mut stats,
                tls_checks: &mut tls_checks,
            };
            let end = self.session(ws, io, &shutdown).await;
            // A hub with no room (it refused before the welcome: `--max-connections`): the
            // next attempt starts at the next hub, so a full replica sheds agents to the
            // others instead of being asked again, a TLS handshake each time, until a place
            // frees (at 50,000 agents over 3 replicas: 9,000 such refusals in 2 minutes).
            if !stats.connected
                && matches!(&end, SessionEnd::Lost(LinkError::Hub { code: ErrorCode::LimitExceeded, .. }))
                && self.config.hub.len() > 1
            {
                current = (current + 1) % self.config.hub.len();
            }
            if stats.connected {
                // The session got as far as a welcome: start the backoff afresh.
                backoff = self.config.reconnect.delays();
                connected_once = true;
            }
            stats.connected = false;
            self.publish(&stats, &outbox);
            match end {
                SessionEnd::Done => return Ok(self.final_stats(&stats, &outbox)),
                SessionEnd::Renewed => {
                    // At once: the renewed certificate should be in use well before the
                    // old one expires, and the hub resumes this epoch where it acked.
                    stats.renewals += 1;
                    tracing::info!(serial = %stats.cert_serial, "reconnecting with the renewed certificate");
                }
                SessionEnd::Refused(code, message) => {
                    let retry = if code == ErrorCode::UnsupportedVersion {
                        tracing::error!(
                            %message,
                            agent_protocols = %ProtocolRange::OURS,
                            agent_version = env!("CARGO_PKG_VERSION"),
                            retry_in = ?self.config.version_retry,
                            "the hub and this agent have no protocol version in common: upgrade the one speaking the older protocols (see docs/upgrade.md)"
                        );
                        self.config.version_retry
                    } else {
                        tracing::error!(%code, %message, retry_in = ?self.config.refused_retry, "hub refused this agent");
                        self.config.refused_retry
                    };
                    // Another agent holding our cluster id after we were connected is a
                    // passing state (a replacement starting, a half-open old session):
                    // waited out, not fatal. Before any connection it is reported at once.
                    let passing = code == ErrorCode::ClusterAlreadyConnected && connected_once;
                    if fail_fast && !passing {
                        return Err(AgentError::Refused { code, message });
                    }
                    // Identity problems and a cluster id already in use are not fixed by
                    // retrying fast: wait long.
                    if sleep_absorbing(retry, &mut changes, &mut outbox, &mut source_open, &mut stats, &shutdown).await
                    {
                        return Ok(self.final_stats(&stats, &outbox));
                    }
                }
                SessionEnd::Lost(why) => {
                    let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                    tracing::warn!(%why, retry_in = ?wait, "connection to hub lost");
                    if sleep_absorbing(wait, &mut changes, &mut outbox, &mut source_open, &mut stats, &shutdown).await {
                        return Ok(self.final_stats(&stats, &outbox));
                    }
                }
            }
        }
    }

    /// Shows the certificate in force in the stats.
    fn note_certificate(&self, stats: &mut AgentStats) {
        let info = self.tls.certificate();
        stats.cert_serial = info.serial;
        stats.cert_not_after = Some(info.not_after);
    }

    /// Reads the TLS files again; true when the agent's own certificate was renewed.
    /// Unusable files are logged (once per content) and the configuration in force stays.
    fn reload_tls(&self, stats: &mut AgentStats) -> bool {
        match self.tls.reload_if_changed() {
            Ok(fleetwatch_certs::ClientReload::Unchanged) => false,
            Ok(fleetwatch_certs::ClientReload::Bundles) => {
                tracing::info!("reloaded the CA bundle; the next connection uses it");
                false
            }
            Ok(fleetwatch_certs::ClientReload::Certificate { serial, not_after }) => {
                tracing::info!(%serial, %not_after, "certificate renewed on disk");
                self.note_certificate(stats);
                true
            }
            Err(e) => {
                tracing::error!(error = %e, "certificate files changed but cannot be used; keeping the ones in force");
                false
            }
        }
    }

    fn final_stats(&self, stats: &AgentStats, outbox: &Outbox) -> AgentStats {
        let mut s = stats.clone();
        s.acked_seq = outbox.acked();
        s.last_seq = outbox.last_seq();
        s.outbox_len = outbox.len();
        s.outbox_bytes = outbox.bytes();
        s.truncated = outbox.truncated();
        s.overflows = outbox.overflows();
        s
    }

    fn publish(&self, stats: &AgentStats, outbox: &Outbox) {
        self.stats.send_replace(self.final_stats(stats, outbox));
    }

    /// One session: the hello and the welcome, then [`Uplink::stream`].
    async fn session(&self, mut ws: ClientWs, io: SessionIo<'_>, shutdown: &CancellationToken) -> SessionEnd {
        if let Err(end) = self.handshake(&mut ws, io.outbox).await {
            return end;
        }
        io.stats.connected = true;
        self.publish(io.stats, io.outbox);
        let mut status = self.watch_status.clone();
        if let Some(st) = status.as_mut() {
            let watches = st.borrow_and_update().clone();
            let msg = AgentMessage::WatchStatus(WatchStatusReport { watches });
            if let Err(e) = ws.send(Message::text(encode(&msg))).await {
                return SessionEnd::Lost(LinkError::Send(e));
            }
        }
        self.stream(ws, io, &mut status, shutdown).await
    }

    /// Says hello and takes the welcome: the hub's ack of this epoch, its event size limit
    /// and the watch configuration.
    async fn handshake(&self, ws: &mut ClientWs, outbox: &mut Outbox) -> Result<(), SessionEnd> {
        let hello = AgentMessage::Hello(Hello {
            protocol: PROTOCOL_VERSION,
            min_protocol: Some(MIN_PROTOCOL_VERSION),
            agent_version: env!("CARGO_PKG_VERSION").into(),
            cluster: Some(self.cluster.clone()),
            epoch: outbox.epoch(),
            last_acked_seq: outbox.acked(),
        });
        ws.send(Message::text(encode(&hello))).await.map_err(|e| SessionEnd::Lost(LinkError::Send(e)))?;
        let welcome =
            match tokio::time::timeout(self.config.idle_timeout, next_data_message(ws, &self.config.limits)).await {
                Err(_) => return Err(SessionEnd::Lost(LinkError::NoWelcome)),
                Ok(Err(e)) => return Err(SessionEnd::Lost(e)),
                Ok(Ok(HubToAgent::Welcome(w))) => w,
                Ok(Ok(HubToAgent::Error(e))) if e.fatal => return Err(refused_or_lost(e.code, e.message)),
                Ok(Ok(other)) => return Err(SessionEnd::Lost(LinkError::NotWelcome(format!("{other:?}")))),
            };
        match link::check_welcome(welcome.protocol, welcome.epoch, outbox.epoch()) {
            Ok(()) => {}
            Err(e @ WelcomeRefused::Protocol { .. }) => {
                return Err(SessionEnd::Refused(ErrorCode::UnsupportedVersion, e.to_string()));
            }
            Err(WelcomeRefused::Epoch { got, ours }) => {
                return Err(SessionEnd::Lost(LinkError::EpochMismatch { got, ours }));
            }
        }
        outbox.ack(welcome.acked_seq);
        if let Some(hub_limit) = welcome.max_event_bytes {
            // Never send what the hub would refuse (it closes the session over it): follow
            // the lower of the two limits.
            outbox.set_max_event_bytes(hub_limit.min(self.config.limits.max_event_bytes));
        }
        self.watches.send_replace(welcome.watches);
        tracing::info!(session = %welcome.session, acked = welcome.acked_seq, pending = outbox.len(), "connected to hub");
        Ok(())
    }

    /// Streams the outbox to the hub and takes its acks until the session ends; the
    /// decisions are [`Link`]'s, this loop carries them out.
    ///
    /// The loop turns only when something happened: a frame from the hub, a change, room
    /// to send (sending is driven by the outbox having something the window lets out), a
    /// certificate file reported changed, or its one timer, set to the earliest of the
    /// link's deadline, the next ping, a pending publication of the counters and the next
    /// fallback check of the certificate files. An idle session therefore sleeps until the
    /// hub's next ping.
    async fn stream(
        &self,
        mut ws: ClientWs,
        io: SessionIo<'_>,
        status: &mut Option<watch::Receiver<Vec<WatchState>>>,
        shutdown: &CancellationToken,
    ) -> SessionEnd {
        let SessionIo { outbox, changes, source_open, stats, tls_checks } = io;
        let idle = self.config.idle_timeout;
        let mut link = Link::new(outbox.acked(), Instant::now(), self.config.window, idle);
        let mut publishing = Publishing::default();
        let wake = tokio::time::sleep_until(link.deadline());
        tokio::pin!(wake);
        loop {
            stats.wakeups += 1;
            publishing.changed(Instant::now(), published(stats, outbox));
            let can_send = link.can_send(outbox.acked(), outbox.last_seq());
            let tls_due = link.may_renew().then(|| tls_checks.deadline());
            let wake_at = [Some(link.next_ping()), publishing.due(), tls_due]
                .into_iter()
                .flatten()
                .fold(link.deadline(), Instant::min);
            if wake.deadline() != wake_at {
                wake.as_mut().reset(wake_at);
            }
            let closing = tokio::select! {
                biased;
                _ = shutdown.cancelled(), if !link.is_draining() => {
                    tracing::info!(pending = outbox.len(), "shutting down: waiting for the hub to ack pending events");
                    link.shut_down(Instant::now(), self.config.drain_timeout);
                    // What the source queued before it stopped goes out with the rest (no
                    // branch takes changes once the source is closed).
                    stats.changes += drain_ready(changes, outbox, changes.len());
                    *source_open = false;
                    None
                }
                msg = next_message(&mut ws, &self.config.limits) => {
                    // Any frame, pings and pongs included, shows the hub is there.
                    link.heard(Instant::now());
                    match msg {
                        Ok(None) => {}
                        Ok(Some(HubToAgent::Ack(a))) => match link.ack(a.epoch, a.seq, outbox.epoch()) {
                            Ok(seq) => outbox.ack(seq),
                            Err(e @ AckRefused::OtherEpoch { .. }) => tracing::debug!(error = %e, "ack ignored"),
                            Err(e) => tracing::warn!(error = %e, "ack ignored"),
                        },
                        Ok(Some(HubToAgent::Configure(c))) => {
                            tracing::info!(watches = c.watches.len(), "new watch configuration");
                            self.watches.send_replace(c.watches);
                        }
                        Ok(Some(HubToAgent::Welcome(_))) => {}
                        Ok(Some(HubToAgent::Error(e))) => {
                            if e.fatal {
                                return refused_or_lost(e.code, e.message);
                            }
                            tracing::info!(code = %e.code, message = %e.message, "hub says");
                        }
                        Err(e) => return SessionEnd::Lost(e),
                    }
                    None
                }
                // Before sending: a source that never pauses must not starve the pings or
                // the link's deadline.
                _ = wake.as_mut() => {
                    let now = Instant::now();
                    if now >= link.deadline() {
                        Some(link.timed_out(now))
                    } else {
                        if now >= link.next_ping() {
                            if let Err(e) = ws.send(Message::Ping(Default::default())).await {
                                return SessionEnd::Lost(LinkError::Ping(e));
                            }
                            link.pinged(now);
                        }
                        if publishing.due().is_some_and(|at| now >= at) {
                            self.publish(stats, outbox);
                            publishing.published(now, published(stats, outbox));
                        }
                        if link.may_renew() && tls_checks.deadline() <= now {
                            tls_checks.checked();
                            if self.reload_tls(stats) {
                                link.renew(now, self.config.drain_timeout);
                            }
                        }
                        None
                    }
                }
                // Sending comes before taking changes: a source that never pauses must not
                // starve the link. What arrives while a frame is on its way coalesces in the
                // outbox, so delivery stays at the link's capacity however fast the source.
                _ = std::future::ready(()), if can_send => {
                    match self.send_next(&mut ws, outbox, link.sent()).await {
                        Ok(last) => link.sent_up_to(last),
                        Err(e) => return SessionEnd::Lost(e),
                    }
                    None
                }
                ch = changes.recv(), if *source_open => {
                    match ch {
                        Some(ch) => {
                            push(outbox, ch);
                            stats.changes += 1;
                            // Take what is already queued, up to a frame's worth, so the next
                            // frame carries a batch rather than one change.
                            stats.changes += drain_ready(changes, outbox, self.config.batch_size.saturating_sub(1));
                        }
                        None => *source_open = false,
                    }
                    None
                }
                // A certificate file reported changed: the check is due once it settled
                // (the timer above).
                _ = tls_checks.changed(), if link.may_renew() => None,
                Some(watches) = next_status(status) => {
                    let msg = AgentMessage::WatchStatus(WatchStatusReport { watches });
                    if let Err(e) = ws.send(Message::text(encode(&msg))).await {
                        return SessionEnd::Lost(LinkError::Send(e));
                    }
                    None
                }
            };
            let closing = closing.or_else(|| {
                if link.is_draining() {
                    // Changes the source queued while stopping.
                    stats.changes += drain_ready(changes, outbox, changes.len());
                }
                link.step(outbox.acked(), outbox.is_empty())
            });
            let Some(closing) = closing else { continue };
            return match closing {
                Closing::Idle => SessionEnd::Lost(LinkError::Idle(idle)),
                Closing::RenewedUnacked => {
                    tracing::warn!(
                        unacked = link.sent().saturating_sub(outbox.acked()),
                        "in-flight events not acked in time; reconnecting with the renewed certificate anyway (they are resent)"
                    );
                    close(&mut ws, "certificate renewed").await;
                    SessionEnd::Renewed
                }
                Closing::Renewed => {
                    tracing::info!(
                        acked = outbox.acked(),
                        "in-flight events acked; closing to reconnect with the renewed certificate"
                    );
                    self.publish(stats, outbox);
                    close(&mut ws, "certificate renewed").await;
                    SessionEnd::Renewed
                }
                Closing::DrainTimeout => {
                    tracing::warn!(pending = outbox.len(), "drain timeout: closing with events unacked");
                    close(&mut ws, "agent shutting down").await;
                    SessionEnd::Done
                }
                Closing::Drained => {
                    tracing::info!(acked = outbox.acked(), "all events acked; closing");
                    self.publish(stats, outbox);
                    close(&mut ws, "agent shutting down").await;
                    SessionEnd::Done
                }
            };
        }
    }

    /// Sends the next frame after `sent`; returns the highest seq it carried.
    async fn send_next(&self, ws: &mut ClientWs, outbox: &Outbox, sent: u64) -> Result<u64, LinkError> {
        let Some(frame) = outbox.next_frame(sent, self.config.batch_size) else {
            return Ok(outbox.last_seq()); // only coalesced-away seqs remain
        };
        ws.send(Message::text(frame.text)).await.map_err(LinkError::Send)?;
        Ok(frame.last_seq)
    }
}

/// What a session works on, owned by [`Uplink::run`] across sessions.
struct SessionIo<'a> {
    outbox: &'a mut Outbox,
    changes: &'a mut mpsc::Receiver<Change>,
    source_open: &'a mut bool,
    stats: &'a mut AgentStats,
    tls_checks: &'a mut FileChecks,
}

/// What the published counters show, to tell whether they need publishing again.
type Shown = (u64, u64, u64, usize, usize, u64, u64);

fn published(stats: &AgentStats, outbox: &Outbox) -> Shown {
    (
        stats.changes,
        outbox.acked(),
        outbox.last_seq(),
        outbox.len(),
        outbox.bytes(),
        outbox.truncated(),
        outbox.overflows(),
    )
}

/// When a session publishes its counters: when they changed, at most every
/// [`Publishing::EVERY`] (a busy session changes them at every frame), and never while they
/// stay as they are (an idle session has no timer for them).
#[derive(Debug, Default)]
struct Publishing {
    /// What was published last, and when.
    last: Option<(Shown, Instant)>,
    /// Changed since: publish at this time.
    due: Option<Instant>,
}

impl Publishing {
    const EVERY: Duration = Duration::from_millis(250);

    /// The counters now show `shown`.
    fn changed(&mut self, now: Instant, shown: Shown) {
        if self.due.is_some() {
            return;
        }
        match self.last {
            Some((last, _)) if last == shown => {}
            Some((_, at)) => self.due = Some((at + Self::EVERY).max(now)),
            None => self.due = Some(now),
        }
    }

    /// When to publish, if anything changed.
    fn due(&self) -> Option<Instant> {
        self.due
    }

    /// Published `shown` at `now`.
    fn published(&mut self, now: Instant, shown: Shown) {
        self.due = None;
        self.last = Some((shown, now));
    }
}

/// The next watch status, or never when there is none to report.
async fn next_status(status: &mut Option<watch::Receiver<Vec<WatchState>>>) -> Option<Vec<WatchState>> {
    match status {
        Some(st) => match st.changed().await {
            Ok(()) => Some(st.borrow_and_update().clone()),
            Err(_) => {
                *status = None;
                None
            }
        },
        None => std::future::pending().await,
    }
}

fn refused_or_lost(code: ErrorCode, message: String) -> SessionEnd {
    match code {
        ErrorCode::IdentityMismatch
        | ErrorCode::Forbidden
        | ErrorCode::UnsupportedVersion
        | ErrorCode::ClusterAlreadyConnected => SessionEnd::Refused(code, message),
        _ => SessionEnd::Lost(LinkError::Hub { code, message }),
    }
}

fn push(outbox: &mut Outbox, ch: Change) {
    outbox.push_change(ch);
}

/// Moves up to `max` changes that are already queued into the outbox without waiting;
/// returns how many.
fn drain_ready(changes: &mut mpsc::Receiver<Change>, outbox: &mut Outbox, max: usize) -> u64 {
    let mut taken = 0;
    while taken < max as u64 {
        match changes.try_recv() {
            Ok(ch) => {
                push(outbox, ch);
                taken += 1;
            }
            Err(_) => break,
        }
    }
    taken
}

/// Sleeps `wait` while still taking changes into the outbox; true when shut down meanwhile.
async fn sleep_absorbing(
    wait: Duration,
    changes: &mut mpsc::Receiver<Change>,
    outbox: &mut Outbox,
    source_open: &mut bool,
    stats: &mut AgentStats,
    shutdown: &CancellationToken,
) -> bool {
    let until = tokio::time::sleep(wait);
    tokio::pin!(until);
    loop {
        tokio::select! {
            _ = &mut until => return false,
            _ = shutdown.cancelled() => return true,
            ch = changes.recv(), if *source_open => match ch {
                Some(ch) => { push(outbox, ch); stats.changes += 1; }
                None => *source_open = false,
            },
        }
    }
}

async fn close(ws: &mut ClientWs, reason: &str) {
    let frame = CloseFrame { code: CloseCode::Normal, reason: reason.into() };
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        let _ = ws.close(Some(frame)).await;
        while let Some(Ok(_)) = ws.next().await {}
    })
    .await;
}

/// The next frame from the hub: a message, or `None` for a ping or pong (liveness only;
/// tungstenite answers pings itself). Cancel-safe.
async fn next_message(ws: &mut ClientWs, limits: &Limits) -> Result<Option<HubToAgent>, LinkError> {
    match ws.next().await {
        Some(Ok(Message::Text(t))) => Ok(Some(decode_hub_to_agent(t.as_bytes(), limits)?)),
        Some(Ok(Message::Binary(b))) => Ok(Some(decode_hub_to_agent(&b, limits)?)),
        Some(Ok(Message::Close(f))) => Err(LinkError::Closed(f)),
        Some(Ok(_)) => Ok(None),
        Some(Err(e)) => Err(LinkError::Receive(e)),
        None => Err(LinkError::Ended),
    }
}

/// The next message from the hub, skipping pings and pongs.
async fn next_data_message(ws: &mut ClientWs, limits: &Limits) -> Result<HubToAgent, LinkError> {
    loop {
        if let Some(msg) = next_message(ws, limits).await? {
            return Ok(msg);
        }
    }
}

#[cfg(test)]
mod tests;
