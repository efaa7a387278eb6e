//! The subscriber client: how an operator (or `fleetwatch tail`) receives events.
//!
//! A [`Subscription`] reconnects by itself, with exponential backoff and jitter, and
//! resumes after the last cursor it acknowledged (the pure [`crate::resume::Resume`] keeps
//! that point). Delivery is at least once: events
//! delivered but not acknowledged before a disconnect come again. Consumers usually do not
//! call `next` and `ack` themselves: they implement [`crate::sink::Sink`] and let
//! [`crate::sink::pump`] acknowledge what the sink accepted.
//!
//! With [`ClientTls::Files`] the subscription follows its certificate files as the agent
//! does: it re-reads them by content before every connection and, while connected, when
//! their directory reports a change ([`SubscriberOptions::tls_watch`], inotify) or every
//! [`SubscriberOptions::tls_reload_interval`] otherwise. A renewed certificate
//! ends the session between deliveries (everything handed out before was acknowledged,
//! or comes again: at least once) and the subscription resumes at once, with the new
//! certificate, after its last acknowledged cursor. Files that cannot be used keep the
//! certificate in force. A certificate near its expiry that was not renewed is warned about.

use std::time::Duration;

use crate::backoff::reconnect as reconnect_backoff;
use crate::client_tls::{ClientTls, ExpiryWarning, Reloaded};
use crate::resume::Resume;
use fleetwatch_certs::FileChecks;
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::tungstenite::Message;

use crate::transport::{ClientWs, ConnectError, Dialer, HubUrls, connect_any};
use fleetwatch_protocol::codec::{DecodeError, Limits, decode_hub_to_subscriber, encode};
use fleetwatch_protocol::event::Event;
use fleetwatch_protocol::message::{
    CursorAck, ErrorCode, ErrorFrame, HubToSubscriber, MIN_PROTOCOL_VERSION, PROTOCOL_VERSION, ProtocolRange,
    ResumePoint, ResyncRequired, StartFrom, Subscribe, SubscriberMessage,
};

/// How to subscribe.
#[derive(Clone)]
pub struct SubscriberOptions {
    /// The hub replicas, tried in order: the subscription stays with the one it reached and
    /// moves to the next when it cannot connect (replicas on one JetStream stream share the
    /// stream id and durable cursors, so it resumes where it was).
    pub hub: HubUrls,
    /// TLS settings carrying the subscriber certificate: fixed, or following its files.
    pub tls: ClientTls,
    /// How often certificate files ([`ClientTls::Files`]) are read for changes while
    /// connected when nothing reported one (with [`tls_watch`](Self::tls_watch) a change is
    /// seen at once; this is the fallback). They are also read before every connection.
    pub tls_reload_interval: Duration,
    /// Whether the directories of the certificate files are watched (inotify).
    pub tls_watch: bool,
    /// Durable name: the hub keeps the cursor under it.
    pub durable: Option<String>,
    /// Only these clusters (empty: all).
    pub clusters: Vec<String>,
    /// Where to start without a stored cursor.
    pub from: StartFrom,
    /// Most unacknowledged events in flight.
    pub max_in_flight: u32,
    /// Message limits.
    pub limits: Limits,
    /// Time allowed for one connect attempt.
    pub connect_timeout: Duration,
    /// Without a message (the hub pings) for this long, the connection is taken as dead.
    pub idle_timeout: Duration,
    /// Reconnect after a lost connection instead of returning the error.
    pub reconnect: bool,
    /// How the hub is reached: TCP unless a simulation supplies its own network.
    pub dialer: Dialer,
}

impl SubscriberOptions {
    /// Options with defaults: start at the latest event, reconnect forever.
    pub fn new(hub: impl Into<HubUrls>, tls: impl Into<ClientTls>) -> Self {
        Self {
            hub: hub.into(),
            tls: tls.into(),
            tls_reload_interval: fleetwatch_certs::watch::DEFAULT_FALLBACK,
            tls_watch: true,
            durable: None,
            clusters: Vec::new(),
            from: StartFrom::Latest,
            max_in_flight: 10_000,
            limits: Limits::default(),
            connect_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(45),
            reconnect: true,
            dialer: Dialer::default(),
        }
    }
}

/// What a subscription yields.
#[derive(Debug, Clone, PartialEq)]
pub enum Delivery {
    /// Events, each with its `cursor` set.
    Events(Vec<Event>),
    /// Part of a cluster's history is gone: reconcile that cluster (or all, for `*`) fully.
    ResyncRequired(ResyncRequired),
}

impl Delivery {
    /// The highest cursor in this delivery, to acknowledge once handled.
    pub fn last_cursor(&self) -> Option<u64> {
        match self {
            Delivery::Events(evs) => evs.iter().filter_map(|e| e.cursor).max(),
            Delivery::ResyncRequired(r) => Some(r.cursor),
        }
    }
}

/// Why a subscription failed.
#[derive(Debug, thiserror::Error)]
pub enum SubscribeError {
    /// Could not connect.
    #[error(transparent)]
    Connect(#[from] ConnectError),
    /// The hub refused or reported an error.
    #[error("hub refused the subscription: {code:?}: {message}")]
    Refused {
        /// The code.
        code: fleetwatch_protocol::message::ErrorCode,
        /// The hub's message.
        message: String,
    },
    /// The hub sent something we cannot read.
    #[error("bad message from hub: {0}")]
    Decode(#[from] DecodeError),
    /// The connection broke.
    #[error("connection to hub lost: {0}")]
    Lost(String),
}

/// A live subscription.
pub struct Subscription {
    opts: SubscriberOptions,
    ws: Option<ClientWs>,
    /// The resume point and the stream read now (see [`Resume`]).
    resume: Resume,
    /// The unknown clusters last warned about.
    unknown_clusters_said: Vec<String>,
    /// The hub replica to try first (the one reached last).
    current: usize,
    /// When the certificate files are read next while connected (`None`: they are not
    /// followed).
    tls_checks: Option<FileChecks>,
    /// Reconnect without a backoff: the session was closed to put a renewed certificate in use.
    renewing: bool,
    /// Warns about a certificate near its expiry that was not renewed.
    expiry: ExpiryWarning,
    /// When the hub was last heard from (any message), for the idle timeout.
    heard: Instant,
}

impl Subscription {
    /// Connects and subscribes. The first connection's failure is returned, so a CLI can
    /// report a wrong address or certificate at once; later ones are retried.
    pub async fn connect(opts: SubscriberOptions) -> Result<Self, SubscribeError> {
        let mut sub = Self {
            opts,
            ws: None,
            resume: Resume::default(),
            unknown_clusters_said: Vec::new(),
            current: 0,
            tls_checks: None,
            renewing: false,
            expiry: ExpiryWarning::default(),
            heard: Instant::now(),
        };
        sub.open().await?;
        Ok(sub)
    }

    /// The id of the stream the subscription reads (known once subscribed).
    pub fn stream(&self) -> Option<&str> {
        self.resume.reading()
    }

    /// The stream and cursor acknowledged last.
    pub fn resume_point(&self) -> Option<ResumePoint> {
        self.resume.point()
    }

    /// Reads the certificate files (when followed) and warns about a near expiry; true when
    /// the subscriber's own certificate was renewed.
    fn check_certificate(&mut self) -> bool {
        if let Some(checks) = &mut self.tls_checks {
            checks.checked();
        }
        let renewed = matches!(self.opts.tls.reload(), Reloaded::Certificate { .. });
        self.expiry.check(&self.opts.tls, "subscriber");
        renewed
    }

    async fn open(&mut self) -> Result<(), SubscribeError> {
        if self.tls_checks.is_none()
            && let ClientTls::Files(files) = &self.opts.tls
        {
            self.tls_checks = Some(files.checks(self.opts.tls_reload_interval, self.opts.tls_watch));
        }
        // A certificate renewed while disconnected (perhaps why the hub refused the last
        // attempt) is used for this one.
        self.check_certificate();
        let (mut ws, reached) = connect_any(
            &self.opts.dialer,
            &self.opts.hub,
            self.current,
            self.opts.tls.current(),
            &self.opts.limits,
            self.opts.connect_timeout,
        )
        .await?;
        if reached != self.current {
            tracing::info!(hub = %self.opts.hub.get(reached), "failed over to another hub");
            self.current = reached;
        }
        let subscribe = SubscriberMessage::Subscribe(Subscribe {
            protocol: Some(PROTOCOL_VERSION),
            min_protocol: Some(MIN_PROTOCOL_VERSION),
            durable: self.opts.durable.clone(),
            clusters: self.opts.clusters.clone(),
            from: self.opts.from,
            resume: self.resume_point(),
            max_in_flight: Some(self.opts.max_in_flight),
        });
        send(&mut ws, &subscribe).await?;
        self.heard = Instant::now();
        match read(&mut ws, &self.opts, &mut self.heard).await? {
            HubToSubscriber::Subscribed(s) => {
                tracing::debug!(stream = %s.stream, cursor = s.cursor, protocol = s.protocol, "subscribed");
                if !ProtocolRange::OURS.contains(s.protocol) {
                    let message = format!(
                        "the hub chose protocol {} but this subscriber speaks {}",
                        s.protocol,
                        ProtocolRange::OURS
                    );
                    return Err(SubscribeError::Refused { code: ErrorCode::UnsupportedVersion, message });
                }
                // Said once per set, not at every reconnect.
                if !s.unknown_clusters.is_empty() && s.unknown_clusters != self.unknown_clusters_said {
                    tracing::warn!(
                        clusters = %s.unknown_clusters.join(","),
                        "the hub has never seen these clusters (no agent connected, no event stored): check the ids; waiting for them"
                    );
                    self.unknown_clusters_said = s.unknown_clusters.clone();
                }
                self.resume.subscribed(s.stream, s.cursor);
                self.ws = Some(ws);
                Ok(())
            }
            HubToSubscriber::Error(ErrorFrame { code, message, .. }) => Err(SubscribeError::Refused { code, message }),
            other => Err(SubscribeError::Lost(format!("expected subscribed, got {other:?}"))),
        }
    }

    /// The next delivery. Reconnects on a lost connection when the options say so.
    pub async fn next(&mut self) -> Result<Delivery, SubscribeError> {
        let mut backoff = reconnect_backoff();
        // The idle timeout counts from now: the time the caller spent on the last delivery
        // is not the hub's silence.
        self.heard = Instant::now();
        loop {
            if self.ws.is_some() && self.tls_checks.as_mut().is_some_and(FileChecks::is_due) {
                // Between deliveries: what was handed out before has been acknowledged (or
                // comes again after the reconnect), so the session can end here.
                if self.check_certificate()
                    && let Some(ws) = self.ws.take()
                {
                    tracing::info!("closing the session to reconnect with the renewed certificate");
                    close_gracefully(ws, &self.opts).await;
                    self.renewing = true;
                }
            }
            let Some(ws) = self.ws.as_mut() else {
                if std::mem::take(&mut self.renewing) {
                    backoff = reconnect_backoff();
                } else {
                    let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                    tokio::time::sleep(wait).await;
                }
                if let Err(e) = self.open().await {
                    // Refusals are final, except a hub not able to serve yet (its storage
                    // is not open): that passes by itself.
                    let passing = matches!(e, SubscribeError::Refused { code: ErrorCode::Unavailable, .. });
                    if !self.opts.reconnect || (matches!(e, SubscribeError::Refused { .. }) && !passing) {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "reconnecting to hub");
                }
                continue;
            };
            let read = tokio::select! {
                r = read(ws, &self.opts, &mut self.heard) => Some(r),
                // While the hub is quiet; while it sends, the check at the top of the loop
                // runs between deliveries.
                _ = tls_due(&mut self.tls_checks) => None,
            };
            let Some(read) = read else { continue };
            match read {
                Ok(HubToSubscriber::Events(batch)) => return Ok(Delivery::Events(batch.events)),
                Ok(HubToSubscriber::ResyncRequired(r)) => return Ok(Delivery::ResyncRequired(r)),
                Ok(HubToSubscriber::Subscribed(_)) => continue,
                Ok(HubToSubscriber::Error(ErrorFrame { code, message, fatal })) => {
                    tracing::warn!(%code, %message, fatal, "hub reported an error");
                    if fatal {
                        self.ws = None;
                    }
                }
                Err(e) => {
                    self.ws = None;
                    if !self.opts.reconnect {
                        return Err(e);
                    }
                    tracing::warn!(error = %e, "connection to hub lost; reconnecting");
                }
            }
        }
    }

    /// Acknowledges everything up to `cursor`. While disconnected the ack is remembered and
    /// sent as the resume point.
    pub async fn ack(&mut self, cursor: u64) -> Result<(), SubscribeError> {
        self.resume.ack(cursor);
        if let Some(ws) = self.ws.as_mut()
            && let Err(e) = send(ws, &SubscriberMessage::Ack(CursorAck { cursor })).await
        {
            self.ws = None;
            if !self.opts.reconnect {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Closes the connection politely.
    pub async fn close(mut self) {
        if let Some(mut ws) = self.ws.take() {
            let _ = ws.close(None).await;
        }
    }
}

async fn send(ws: &mut ClientWs, msg: &SubscriberMessage) -> Result<(), SubscribeError> {
    ws.send(Message::text(encode(msg))).await.map_err(|e| SubscribeError::Lost(e.to_string()))
}

/// Waits until the certificate files are due for a check; forever when they are not
/// followed. Cancel-safe.
async fn tls_due(checks: &mut Option<FileChecks>) {
    match checks {
        Some(c) => c.due().await,
        None => std::future::pending().await,
    }
}

/// Closes a session cleanly: a close frame, then what the hub still sends is read (and
/// dropped: it comes again after the last acknowledged cursor) until it closes too, for at
/// most a few seconds.
async fn close_gracefully(mut ws: ClientWs, opts: &SubscriberOptions) {
    if let Err(e) = ws.close(None).await {
        tracing::debug!(error = %e, "closing the session");
        return;
    }
    let drained = tokio::time::timeout(opts.connect_timeout.min(Duration::from_secs(5)), async {
        while let Some(Ok(m)) = ws.next().await {
            if matches!(m, Message::Close(_)) {
                break;
            }
        }
    })
    .await;
    if drained.is_err() {
        tracing::debug!("the hub did not answer the close in time");
    }
}

/// The next message; `heard` is when the hub was last heard from, moved by every message
/// (pings included): without one for the idle timeout the connection is taken as dead.
/// Cancel-safe (a cancelled read loses nothing: the stream keeps what it received).
async fn read(
    ws: &mut ClientWs,
    opts: &SubscriberOptions,
    heard: &mut Instant,
) -> Result<HubToSubscriber, SubscribeError> {
    loop {
        let next = tokio::time::timeout_at(*heard + opts.idle_timeout, ws.next())
            .await
            .map_err(|_| SubscribeError::Lost(format!("no message from hub for {:?}", opts.idle_timeout)))?;
        *heard = Instant::now();
        match next {
            Some(Ok(Message::Text(t))) => return Ok(decode_hub_to_subscriber(t.as_bytes(), &opts.limits)?),
            Some(Ok(Message::Binary(b))) => return Ok(decode_hub_to_subscriber(&b, &opts.limits)?),
            Some(Ok(Message::Close(frame))) => {
                let why = frame.map(|f| format!("{} {}", u16::from(f.code), f.reason)).unwrap_or_default();
                return Err(SubscribeError::Lost(format!("hub closed the connection {why}")));
            }
            Some(Ok(_)) => continue,
            Some(Err(e)) => return Err(SubscribeError::Lost(e.to_string())),
            None => return Err(SubscribeError::Lost("connection closed".into())),
        }
    }
}
