//! The thread the NATS connection runs on: a current-thread tokio runtime of its own, so
//! the client's I/O is not delayed by (and does not delay) the hub's workers serving
//! sessions. Dropping the [`IoThread`] stops it.

use super::NatsError;

/// A thread of its own for the NATS client's connection task.
///
/// On the hub's runtime that task — which reads every publish ack and every record of the
/// local tail off the socket and hands them on — waited in the run queue behind a thousand
/// agent sessions: publish acks that JetStream sent within milliseconds reached the append
/// tens of milliseconds later. On its own single-threaded runtime it runs as soon as the
/// socket has data; the futures waiting for acks stay on the hub's runtime (the hand-over is
/// a channel, which works across runtimes).
pub(super) struct IoThread {
    pub(super) handle: tokio::runtime::Handle,
    /// Dropping it ends the thread's `block_on`, which drops the runtime and its tasks.
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl IoThread {
    pub(super) fn start() -> Result<Self, NatsError> {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| NatsError::Settings(format!("cannot start the NATS connection thread: {e}")))?;
        let handle = rt.handle().clone();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        std::thread::Builder::new()
            .name("fleetwatch-nats".into())
            .spawn(move || {
                let _ = rt.block_on(stopped);
            })
            .map_err(|e| NatsError::Settings(format!("cannot start the NATS connection thread: {e}")))?;
        Ok(Self { handle, _stop: stop })
    }
}
