//! Sinks: where a subscription's deliveries go.
//!
//! Everything that consumes the hub's stream — `fleetwatch tail` printing to stdout, the
//! lifecycle operator turning events into reconciles, and relays to other systems (a
//! CloudEvents webhook, lifecycle-manager's listener) — does the same three things: take a
//! delivery, hand it to its target, and acknowledge it. The order of the last two is the
//! whole delivery guarantee: a cursor acknowledged before the target accepted the events is
//! a loss the moment the target fails. So the loop lives here once, in [`pump`], and a
//! consumer only writes a [`Sink`]: "accept this delivery, or say why not".
//!
//! The contract:
//! - [`pump`] acknowledges a delivery only after [`Sink::deliver`] returned `Ok`, and only as
//!   far as the sink says it took ([`Accepted`]).
//! - [`SinkError::Retry`]: the same delivery is offered again after a backoff; nothing is
//!   acknowledged meanwhile, so a pump that stops then leaves it to be delivered again.
//! - [`SinkError::Fatal`]: the pump stops with the error, without acknowledging.

use std::future::Future;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::backoff::reconnect as reconnect_backoff;
use crate::subscriber::{Delivery, SubscribeError, Subscription};

/// Any error a sink's target reports.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How much of a delivery a sink took.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accepted {
    /// All of it: acknowledge its last cursor and go on.
    All,
    /// The sink wants no more: acknowledge up to and including `cursor` (none: nothing of
    /// this delivery was taken) and stop. E.g. `tail --count` reaching its count mid-batch.
    ThenStop {
        /// The last cursor taken.
        cursor: Option<u64>,
    },
}

/// Why a sink did not accept a delivery.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    /// A passing failure (the target is busy or unreachable): the pump offers the same
    /// delivery again after a backoff.
    #[error("sink {sink} did not accept the delivery (retrying): {source}")]
    Retry {
        /// The sink's name.
        sink: String,
        /// The target's error.
        #[source]
        source: BoxError,
    },
    /// The sink cannot go on (its output is closed, its receiver gone): the pump stops.
    #[error("sink {sink} failed: {source}")]
    Fatal {
        /// The sink's name.
        sink: String,
        /// The target's error.
        #[source]
        source: BoxError,
    },
}

/// What receives deliveries from the hub. Implement this to relay the stream somewhere.
pub trait Sink: Send {
    /// A short name, for logs and errors (`stdout`, `lifecycle-trigger`, `webhook`).
    fn name(&self) -> &str;

    /// Hands one delivery to the target. `Ok` means the target has it (written, queued
    /// durably, answered 2xx): only then is it acknowledged to the hub.
    fn deliver(&mut self, delivery: &Delivery) -> impl Future<Output = Result<Accepted, SinkError>> + Send;
}

/// Where deliveries come from: a [`Subscription`], or anything with the same two calls
/// (the sink tests use a scripted one).
pub trait Deliveries: Send {
    /// The next delivery.
    fn next(&mut self) -> impl Future<Output = Result<Delivery, SubscribeError>> + Send;
    /// Acknowledges everything up to `cursor`.
    fn ack(&mut self, cursor: u64) -> impl Future<Output = Result<(), SubscribeError>> + Send;
}

impl Deliveries for Subscription {
    fn next(&mut self) -> impl Future<Output = Result<Delivery, SubscribeError>> + Send {
        Subscription::next(self)
    }

    fn ack(&mut self, cursor: u64) -> impl Future<Output = Result<(), SubscribeError>> + Send {
        Subscription::ack(self, cursor)
    }
}

/// Why [`pump`] returned normally.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stopped {
    /// `cancel` fired.
    Cancelled,
    /// The sink said it wants no more ([`Accepted::ThenStop`]).
    SinkDone,
}

/// Why [`pump`] failed.
#[derive(Debug, thiserror::Error)]
pub enum PumpError {
    /// The subscription failed (refused, or lost without reconnecting).
    #[error(transparent)]
    Subscription(#[from] SubscribeError),
    /// The sink failed for good.
    #[error(transparent)]
    Sink(#[from] SinkError),
}

/// Feeds deliveries into `sink` until the sink is done, `cancel` fires, or either side fails
/// for good. Acknowledges a delivery only after the sink accepted it, and only as far as it
/// did; a delivery the sink asks to retry is offered again (with backoff) and not
/// acknowledged meanwhile.
pub async fn pump<D: Deliveries, S: Sink>(
    deliveries: &mut D,
    sink: &mut S,
    cancel: &CancellationToken,
) -> Result<Stopped, PumpError> {
    loop {
        let delivery = tokio::select! {
            _ = cancel.cancelled() => return Ok(Stopped::Cancelled),
            d = deliveries.next() => d?,
        };
        let Some(accepted) = deliver(sink, &delivery, cancel).await? else { return Ok(Stopped::Cancelled) };
        let (cursor, stop) = match accepted {
            Accepted::All => (delivery.last_cursor(), false),
            Accepted::ThenStop { cursor } => (cursor, true),
        };
        if let Some(c) = cursor {
            deliveries.ack(c).await?;
        }
        if stop {
            return Ok(Stopped::SinkDone);
        }
    }
}

/// Offers one delivery until the sink accepts it or fails for good; `None` when cancelled.
async fn deliver<S: Sink>(
    sink: &mut S,
    delivery: &Delivery,
    cancel: &CancellationToken,
) -> Result<Option<Accepted>, SinkError> {
    let mut backoff = reconnect_backoff();
    loop {
        let result = tokio::select! {
            _ = cancel.cancelled() => return Ok(None),
            r = sink.deliver(delivery) => r,
        };
        match result {
            Ok(accepted) => return Ok(Some(accepted)),
            Err(e @ SinkError::Fatal { .. }) => return Err(e),
            Err(e @ SinkError::Retry { .. }) => {
                let wait = backoff.next().unwrap_or(Duration::from_secs(5));
                tracing::warn!(sink = sink.name(), error = %e, retry_in = ?wait, "sink refused a delivery");
                tokio::select! {
                    _ = cancel.cancelled() => return Ok(None),
                    _ = tokio::time::sleep(wait) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::sync::Arc;

    use fleetwatch_protocol::event::{Event, ObjectKey};

    use super::*;

    /// What happened, in order, across the scripted subscription and the test sink.
    type Log = Arc<tokio::sync::watch::Sender<Vec<String>>>;

    fn note(log: &Log, line: String) {
        log.send_modify(|lines| lines.push(line));
    }

    fn lines(log: &Log) -> Vec<String> {
        log.borrow().clone()
    }

    /// A subscription that yields scripted deliveries, then waits forever.
    struct Scripted {
        queue: VecDeque<Delivery>,
        log: Log,
    }

    impl Deliveries for Scripted {
        async fn next(&mut self) -> Result<Delivery, SubscribeError> {
            match self.queue.pop_front() {
                Some(d) => Ok(d),
                None => std::future::pending().await,
            }
        }

        async fn ack(&mut self, cursor: u64) -> Result<(), SubscribeError> {
            note(&self.log, format!("ack {cursor}"));
            Ok(())
        }
    }

    /// Answers each delivery with the next scripted answer (then `All`), logging what it took.
    struct TestSink {
        answers: VecDeque<Result<Accepted, &'static str>>,
        log: Log,
    }

    impl Sink for TestSink {
        fn name(&self) -> &str {
            "test"
        }

        async fn deliver(&mut self, delivery: &Delivery) -> Result<Accepted, SinkError> {
            let cursor = delivery.last_cursor().unwrap_or_default();
            let answer = self.answers.pop_front().unwrap_or(Ok(Accepted::All));
            let sink = self.name().to_string();
            match answer {
                Ok(a) => {
                    note(&self.log, format!("accept {cursor}"));
                    Ok(a)
                }
                Err("retry") => {
                    note(&self.log, format!("refuse {cursor}"));
                    Err(SinkError::Retry { sink, source: "target busy".into() })
                }
                Err(why) => {
                    note(&self.log, format!("fail {cursor}"));
                    Err(SinkError::Fatal { sink, source: why.into() })
                }
            }
        }
    }

    fn events(cursors: &[u64]) -> Delivery {
        Delivery::Events(
            cursors
                .iter()
                .map(|&c| {
                    let key = ObjectKey::new("v1", "ConfigMap", Some("default"), "x");
                    let mut e = Event::applied("c1", 1, c, &key, serde_json::json!({}));
                    e.cursor = Some(c);
                    e
                })
                .collect(),
        )
    }

    fn setup(deliveries: Vec<Delivery>, answers: Vec<Result<Accepted, &'static str>>) -> (Scripted, TestSink, Log) {
        let log: Log = Arc::new(tokio::sync::watch::Sender::new(Vec::new()));
        (
            Scripted { queue: deliveries.into(), log: log.clone() },
            TestSink { answers: answers.into(), log: log.clone() },
            log,
        )
    }

    /// Runs the pump until `log` holds `lines` lines (the scripted subscription then waits
    /// forever), then cancels it.
    async fn run_until(d: &mut Scripted, s: &mut TestSink, log: &Log, count: usize) -> Result<Stopped, PumpError> {
        let cancel = CancellationToken::new();
        let watcher = async {
            // Waiting, not spinning: a paused clock moves on only when every task waits.
            let _ = log.subscribe().wait_for(|l| l.len() >= count).await;
            cancel.cancel();
            std::future::pending::<()>().await;
        };
        tokio::select! {
            r = pump(d, s, &cancel) => r,
            _ = watcher => unreachable!("the watcher never returns"),
        }
    }

    #[tokio::test]
    async fn acks_each_delivery_after_the_sink_accepted_it() {
        let (mut d, mut s, log) = setup(vec![events(&[1, 2]), events(&[3])], vec![]);
        assert_eq!(run_until(&mut d, &mut s, &log, 4).await.unwrap(), Stopped::Cancelled);
        assert_eq!(lines(&log), ["accept 2", "ack 2", "accept 3", "ack 3"]);
    }

    #[tokio::test(start_paused = true)]
    async fn a_refused_delivery_is_offered_again_and_not_acked_meanwhile() {
        let (mut d, mut s, log) = setup(vec![events(&[5])], vec![Err("retry"), Err("retry")]);
        assert_eq!(run_until(&mut d, &mut s, &log, 4).await.unwrap(), Stopped::Cancelled);
        assert_eq!(lines(&log), ["refuse 5", "refuse 5", "accept 5", "ack 5"]);
    }

    #[tokio::test(start_paused = true)]
    async fn cancelled_while_retrying_acks_nothing() {
        let (mut d, mut s, log) = setup(vec![events(&[7])], vec![Err("retry"); 100]);
        assert_eq!(run_until(&mut d, &mut s, &log, 3).await.unwrap(), Stopped::Cancelled);
        assert!(lines(&log).iter().all(|l| l == "refuse 7"), "{:?}", lines(&log));
    }

    #[tokio::test]
    async fn a_failing_sink_stops_the_pump_without_an_ack() {
        let (mut d, mut s, log) = setup(vec![events(&[1]), events(&[2])], vec![Ok(Accepted::All), Err("disk full")]);
        let err = run_until(&mut d, &mut s, &log, usize::MAX).await.unwrap_err();
        assert!(err.to_string().contains("sink test failed: disk full"), "{err}");
        assert_eq!(lines(&log), ["accept 1", "ack 1", "fail 2"]);
    }

    #[tokio::test]
    async fn a_sink_done_mid_batch_is_acked_only_as_far_as_it_took() {
        let (mut d, mut s, log) =
            setup(vec![events(&[1, 2, 3]), events(&[4])], vec![Ok(Accepted::ThenStop { cursor: Some(2) })]);
        assert_eq!(run_until(&mut d, &mut s, &log, usize::MAX).await.unwrap(), Stopped::SinkDone);
        assert_eq!(lines(&log), ["accept 3", "ack 2"]);
    }

    #[tokio::test]
    async fn resync_markers_are_acked_at_their_cursor_once_accepted() {
        let marker = Delivery::ResyncRequired(fleetwatch_protocol::message::ResyncRequired {
            cluster: "c1".into(),
            cursor: 9,
            reason: "history evicted".into(),
        });
        let (mut d, mut s, log) = setup(vec![marker], vec![]);
        assert_eq!(run_until(&mut d, &mut s, &log, 2).await.unwrap(), Stopped::Cancelled);
        assert_eq!(lines(&log), ["accept 9", "ack 9"]);
    }
}
