//! One accepted WebSocket over TLS: receiving with keep-alive pings and an idle timeout,
//! sending frames, errors and close codes, and how a session ends ([`End`]).
//!
//! Agent and subscriber sessions read the same way and end the same way; that lives here
//! once, so the two sessions only hold what differs (their protocol).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_client::transport::Stream;
use fleetwatch_protocol::codec::encode;
use fleetwatch_protocol::message::{ErrorCode, ErrorFrame};
use futures_util::{SinkExt, StreamExt};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;

use crate::metrics::Metrics;
use crate::registry::Liveness;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_tungstenite::tungstenite::{Error as WsError, Message, Utf8Bytes};

/// A server-side WebSocket over TLS (over TCP, or the simulation's network).
pub(crate) type ServerWs = WebSocketStream<super::lean_tls::LeanTls<Stream>>;

/// What arrived.
pub(crate) enum Incoming {
    /// A text or binary message's bytes.
    Message(bytes::Bytes),
    /// The peer closed, or the connection broke.
    Closed(String),
    /// A message larger than the limit.
    TooLarge(String),
    /// A frame the WebSocket layer refused as invalid (a text frame that is not UTF-8).
    Invalid(String),
    /// Nothing for the idle timeout.
    Idle,
}

/// Sessions ended for a failure (a bad frame, a refusal) logged one by one per summary
/// interval; past that they are only counted, by error code, in one summary line (so a
/// peer sending bad frames in a loop cannot flood the log).
const DETAILED_FAILURES_PER_INTERVAL: u64 = 20;

/// The failure log's budget for the current interval and what it did not log.
pub(crate) struct FailureLog {
    logged: std::sync::atomic::AtomicU64,
    suppressed: std::sync::Mutex<std::collections::BTreeMap<&'static str, u64>>,
}

/// The one failure log of the process (sessions of every hub in it share the budget).
pub(crate) static FAILURE_LOG: FailureLog = FailureLog {
    logged: std::sync::atomic::AtomicU64::new(0),
    suppressed: std::sync::Mutex::new(std::collections::BTreeMap::new()),
};

impl FailureLog {
    /// Whether a session failure with `code` gets its own line; otherwise it is counted.
    pub(crate) fn admit(&self, code: ErrorCode) -> bool {
        if self.logged.fetch_add(1, std::sync::atomic::Ordering::Relaxed) < DETAILED_FAILURES_PER_INTERVAL {
            return true;
        }
        if let Ok(mut m) = self.suppressed.lock() {
            *m.entry(code.as_str()).or_default() += 1;
        }
        false
    }

    /// The summary of the failures not logged one by one since the last call; resets.
    pub(crate) fn take_summary(&self) -> Option<String> {
        self.logged.store(0, std::sync::atomic::Ordering::Relaxed);
        let m = self.suppressed.lock().map(|mut m| std::mem::take(&mut *m)).unwrap_or_default();
        let total: u64 = m.values().sum();
        if total == 0 {
            return None;
        }
        let by: Vec<String> = m.iter().map(|(k, v)| format!("{k}={v}")).collect();
        Some(format!("{total} more sessions closed for errors, not logged one by one ({})", by.join(", ")))
    }
}

/// What the connection's timer found due when it fired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Due {
    /// Nothing for the idle timeout: the session ends.
    Idle,
    /// A ping.
    Ping,
    /// Neither (a message moved the idle deadline since the timer was set).
    Nothing,
}

/// What is due at `now` for a connection last heard from at `last_rx` with idle timeout
/// `idle` and its next ping at `next_ping`, and when the ping after a ping sent now is due.
fn timer_due(now: Instant, last_rx: Instant, idle: Duration, next_ping: Instant) -> (Due, Instant) {
    let after = now + Conn::ping_interval(idle);
    if now >= last_rx + idle {
        (Due::Idle, next_ping)
    } else if now >= next_ping {
        (Due::Ping, after)
    } else {
        (Due::Nothing, next_ping)
    }
}

/// How a session ends, carried out by [`End::finish`].
#[derive(Debug)]
pub(crate) enum End {
    /// The peer closed or the connection broke: nothing to send.
    Closed(String),
    /// A fatal error frame, then a close.
    Fail(ErrorCode, String, CloseCode),
    /// A close frame only; the label says why for the metrics (`idle-timeout`, ...).
    Close(CloseCode, &'static str, String),
}

impl End {
    /// Why the session ends, as the `reason` label of the disconnect counter: the error
    /// code sent, the close's label, or `peer-closed`.
    pub(crate) fn reason(&self) -> &'static str {
        match self {
            End::Closed(_) => "peer-closed",
            End::Fail(code, ..) => code.as_str(),
            End::Close(_, label, _) => label,
        }
    }

    /// Logs why the session of `role` ends and tells the peer.
    pub(crate) async fn finish(self, conn: Conn, role: &str) {
        match self {
            End::Closed(why) => tracing::info!(%why, "{role} disconnected"),
            End::Fail(code, msg, close) => {
                if code == ErrorCode::ShuttingDown || code == ErrorCode::Replaced {
                    tracing::info!(%code, %msg, "closing {role} session");
                } else if FAILURE_LOG.admit(code) {
                    tracing::warn!(%code, %msg, "closing {role} session");
                }
                conn.fail(code, msg, close).await;
            }
            End::Close(close, _, msg) => {
                tracing::info!(%msg, "closing {role} session");
                conn.close(close, &msg).await;
            }
        }
    }
}

/// An accepted connection.
pub(crate) struct Conn {
    /// Boxed: the stream (TLS state and WebSocket codec) is about 1.5 KiB, and a `Conn`
    /// passed by value into the session and close futures would otherwise be copied into
    /// each of them, per connection, for the connection's life.
    ws: Box<ServerWs>,
    /// The peer address.
    pub(crate) peer: SocketAddr,
    idle: Duration,
    last_rx: Instant,
    /// The connection's one timer: set to the earlier of the next ping and the idle deadline
    /// (see [`Conn::recv`]). A message arriving does not touch it: the timer looks at
    /// `last_rx` when it fires. Every session keeps it: one boxed `Sleep` instead of an
    /// `Interval`'s plus one more inside every `recv` future.
    timer: std::pin::Pin<Box<tokio::time::Sleep>>,
    /// When the next ping is due.
    next_ping: Instant,
    liveness: Arc<Liveness>,
    pings_sent: Option<prometheus_client::metrics::counter::Counter>,
    /// The WebSocket layer failed (oversized frame, invalid UTF-8): it reads nothing more.
    broken: bool,
}

impl Conn {
    pub(crate) fn new(ws: ServerWs, peer: SocketAddr, idle: Duration) -> Self {
        let now = Instant::now();
        let liveness = Arc::new(Liveness::new());
        // The first ping at once, as a tokio `Interval`'s first tick.
        let timer = Box::pin(tokio::time::sleep_until(now));
        Self {
            ws: Box::new(ws),
            peer,
            idle,
            last_rx: now,
            timer,
            next_ping: now,
            liveness,
            pings_sent: None,
            broken: false,
        }
    }

    /// When this connection last heard from its peer.
    pub(crate) fn liveness(&self) -> Arc<Liveness> {
        self.liveness.clone()
    }

    /// Counts the keep-alive pings this connection sends in `counter`.
    pub(crate) fn count_pings(&mut self, counter: prometheus_client::metrics::counter::Counter) {
        self.pings_sent = Some(counter);
    }

    /// The interval at which the hub pings its peers.
    pub(crate) fn ping_interval(idle: Duration) -> Duration {
        idle / 3
    }

    /// Waits for the next message, pinging the peer meanwhile. Cancel-safe.
    pub(crate) async fn recv(&mut self) -> Incoming {
        loop {
            tokio::select! {
                msg = self.ws.next() => {
                    self.last_rx = Instant::now();
                    self.liveness.touch();
                    match msg {
                        Some(Ok(Message::Text(t))) => return Incoming::Message(t.into()),
                        Some(Ok(Message::Binary(b))) => return Incoming::Message(b),
                        Some(Ok(Message::Close(f))) => {
                            return Incoming::Closed(f.map(|f| format!("{} {}", u16::from(f.code), f.reason)).unwrap_or_default())
                        }
                        Some(Ok(_)) => continue, // ping / pong: liveness only
                        Some(Err(WsError::Capacity(e))) => {
                            self.broken = true;
                            return Incoming::TooLarge(e.to_string());
                        }
                        Some(Err(WsError::Utf8(_))) => {
                            // Answered with close 1007, not a dropped socket: see `close`. The
                            // error's text holds the peer's bytes: not echoed.
                            self.broken = true;
                            return Incoming::Invalid("a text frame is not valid UTF-8".into());
                        }
                        Some(Err(e)) => return Incoming::Closed(e.to_string()),
                        None => return Incoming::Closed("connection closed".into()),
                    }
                }
                () = &mut self.timer => {
                    let now = Instant::now();
                    let (due, ping) = timer_due(now, self.last_rx, self.idle, self.next_ping);
                    if due == Due::Idle {
                        return Incoming::Idle;
                    }
                    if due == Due::Ping {
                        // The next one a period after this one, however late this one is (as
                        // `MissedTickBehavior::Delay`).
                        self.next_ping = ping;
                        if self.ws.send(Message::Ping(bytes::Bytes::new())).await.is_err() {
                            return Incoming::Closed("ping failed".into());
                        }
                        if let Some(c) = &self.pings_sent {
                            c.inc();
                        }
                    }
                    self.timer.as_mut().reset(self.next_ping.min(self.last_rx + self.idle));
                }
            }
        }
    }

    /// The next message's bytes; anything else ends the session (counted in `metrics`
    /// when it is the peer's fault). Cancel-safe.
    pub(crate) async fn next_message(&mut self, metrics: &Metrics) -> Result<bytes::Bytes, End> {
        match self.recv().await {
            Incoming::Message(b) => Ok(b),
            Incoming::Closed(why) => Err(End::Closed(why)),
            Incoming::Idle => Err(End::Close(CloseCode::Away, "idle-timeout", "idle timeout".into())),
            Incoming::TooLarge(why) => {
                metrics.reject("too-large");
                Err(End::Close(CloseCode::Size, "too-large", format!("message too large: {why}")))
            }
            Incoming::Invalid(why) => {
                metrics.reject("invalid-frame");
                Err(End::Fail(ErrorCode::Malformed, why, CloseCode::Invalid))
            }
        }
    }

    /// The session's first message, `expected` (e.g. `hello`), which must come within
    /// `timeout`; the hub shutting down meanwhile ends the session too.
    pub(crate) async fn first_message(
        &mut self,
        expected: &str,
        timeout: Duration,
        shutdown: &tokio_util::sync::CancellationToken,
        metrics: &Metrics,
    ) -> Result<bytes::Bytes, End> {
        tokio::select! {
            m = tokio::time::timeout(timeout, self.next_message(metrics)) => m.unwrap_or_else(|_| {
                metrics.reject(&format!("{expected}-timeout"));
                let msg = format!("no {expected} within the handshake timeout");
                Err(End::Fail(ErrorCode::Forbidden, msg, CloseCode::Policy))
            }),
            _ = shutdown.cancelled() => Err(End::Close(CloseCode::Away, "shutting-down", "hub shutting down".into())),
        }
    }

    /// Sends a text message.
    pub(crate) async fn send_text(&mut self, text: String) -> Result<(), WsError> {
        self.ws.send(Message::Text(Utf8Bytes::from(text))).await
    }

    /// Sends an error frame (waiting at most two seconds for a slow peer).
    pub(crate) async fn send_error(&mut self, code: ErrorCode, message: impl Into<String>, fatal: bool) {
        let frame = ErrorFrame { code, message: message.into(), fatal };
        #[derive(serde::Serialize)]
        struct Tagged<'a> {
            #[serde(rename = "type")]
            ty: &'static str,
            #[serde(flatten)]
            frame: &'a ErrorFrame,
        }
        // Best effort, bounded: a peer that stopped reading must not hold the session.
        let text = encode(&Tagged { ty: "error", frame: &frame });
        let _ = tokio::time::timeout(Duration::from_secs(2), self.send_text(text)).await;
    }

    /// Sends a fatal error frame, then closes with `code`.
    pub(crate) async fn fail(mut self, code: ErrorCode, message: impl Into<String>, close: CloseCode) {
        let message = message.into();
        self.send_error(code, message.clone(), true).await;
        self.close(close, &message).await;
    }

    /// Closes with a code and reason (the reason is cut to the 123 bytes a close frame allows).
    pub(crate) async fn close(mut self, code: CloseCode, reason: &str) {
        let mut end = reason.len().min(120);
        while !reason.is_char_boundary(end) {
            end -= 1;
        }
        let frame = CloseFrame { code, reason: Utf8Bytes::from(reason[..end].to_string()) };
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            let _ = (*self.ws).close(Some(frame)).await;
            if self.broken {
                // After an oversized or invalid frame tungstenite reads no more, but the
                // rest of that frame (and what follows) may still be arriving. Closing a socket with unread data sends a reset
                // that destroys our close frame before the peer reads it: discard the raw
                // bytes until the peer goes quiet.
                use tokio::io::AsyncReadExt;
                let mut buf = vec![0u8; 16 << 10];
                while let Ok(Ok(n)) =
                    tokio::time::timeout(Duration::from_millis(300), self.ws.get_mut().read(&mut buf)).await
                {
                    if n == 0 {
                        break;
                    }
                }
                return;
            }
            // Drain until the peer answers the close, so it sees our frame before the FIN.
            while let Some(Ok(_)) = self.ws.next().await {}
        })
        .await;
    }
}

#[cfg(test)]
mod failure_log_tests {
    use super::*;

    #[test]
    fn failures_past_the_budget_are_counted_by_code() {
        let log = FailureLog {
            logged: std::sync::atomic::AtomicU64::new(0),
            suppressed: std::sync::Mutex::new(std::collections::BTreeMap::new()),
        };
        let admitted = (0..50).filter(|_| log.admit(ErrorCode::Malformed)).count();
        assert_eq!(admitted as u64, DETAILED_FAILURES_PER_INTERVAL);
        assert!(!log.admit(ErrorCode::Forbidden));
        let line = log.take_summary().unwrap();
        assert!(line.starts_with("31 more sessions closed") && line.contains("forbidden=1"), "{line}");
        assert!(log.take_summary().is_none());
        assert!(log.admit(ErrorCode::Forbidden), "a new interval logs again");
    }
}

#[cfg(test)]
mod timer_tests {
    use super::*;

    #[test]
    fn the_timer_ends_an_idle_connection_and_pings_a_ping_interval_apart() {
        let idle = Duration::from_secs(30);
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        // Just connected: the first ping is due at once.
        assert_eq!(timer_due(t0, t0, idle, t0), (Due::Ping, at(10)));
        // Before the next ping, heard from lately: nothing (the timer is set again).
        assert_eq!(timer_due(at(5), at(4), idle, at(10)), (Due::Nothing, at(10)));
        // A late ping: the next one a whole interval after it.
        assert_eq!(timer_due(at(13), at(12), idle, at(10)), (Due::Ping, at(23)));
        // Silent for the idle timeout: idle, whatever ping is due.
        assert_eq!(timer_due(at(30), t0, idle, at(30)).0, Due::Idle);
        assert_eq!(timer_due(at(31), at(1), idle, at(40)).0, Due::Idle);
        // A message moved the deadline: not idle yet.
        assert_eq!(timer_due(at(30), at(29), idle, at(40)), (Due::Nothing, at(40)));
    }
}
