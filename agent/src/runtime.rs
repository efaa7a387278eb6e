//! The agent runtime: one source, the outbox and the uplink, wired together and owned.
//!
//! Every program that runs an agent (`fleetwatch agent`, the `up` sandbox with one agent per
//! simulated cluster, the hub benchmark with hundreds) needs the same wiring: a channel from
//! the source to the uplink, the pushed watch configuration back to the source, the source's
//! watch states to the hub, a span naming the cluster, and a shutdown that stops the source
//! and lets the uplink drain. Written once here, they cannot drift apart.
//!
//! ```no_run
//! # async fn demo(config: fleetwatch_agent::AgentConfig) -> Result<(), fleetwatch_agent::AgentError> {
//! use fleetwatch_agent::AgentRuntime;
//! use fleetwatch_agent::source::SyntheticSource;
//! let source: SyntheticSource = "synthetic:objects=10,rate=100,total=1000".parse().unwrap();
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! let agent = AgentRuntime::new(config)?.start(source, shutdown.clone());
//! // ... later:
//! shutdown.cancel();
//! let stats = agent.wait().await?;
//! # Ok(()) }
//! ```

use fleetwatch_protocol::message::WatchSpec;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::Instrument;

use crate::source::{Source, SourceIo};
use crate::uplink::Uplink;
use crate::{AgentConfig, AgentError, AgentStats};

/// Default room in the channel from the source to the uplink.
pub const DEFAULT_CHANGES_BUFFER: usize = 4096;

/// An agent ready to start: its certificate loaded, its settings fixed.
pub struct AgentRuntime {
    uplink: Uplink,
    fail_fast: bool,
    changes_buffer: usize,
}

impl AgentRuntime {
    /// Loads the certificate and finds the cluster id in it. The agent retries a failing
    /// first connection forever (see [`fail_fast`](Self::fail_fast)).
    pub fn new(config: AgentConfig) -> Result<Self, AgentError> {
        Ok(Self { uplink: Uplink::new(config)?, fail_fast: false, changes_buffer: DEFAULT_CHANGES_BUFFER })
    }

    /// Stop with the error when the first connection fails or the hub refuses the agent
    /// before it ever connected (a CLI reports a wrong address or certificate at once),
    /// instead of retrying.
    pub fn fail_fast(mut self, yes: bool) -> Self {
        self.fail_fast = yes;
        self
    }

    /// Room for changes between the source and the uplink (at least 1). A full channel
    /// holds the source back; the outbox behind it coalesces.
    pub fn changes_buffer(mut self, n: usize) -> Self {
        self.changes_buffer = n.max(1);
        self
    }

    /// The cluster id from the certificate.
    pub fn cluster(&self) -> &str {
        self.uplink.cluster()
    }

    /// Spawns the source and the uplink, each in the span `agent{cluster=…}`. They run
    /// until `shutdown` is cancelled (the uplink then drains what is pending) or, with
    /// [`fail_fast`](Self::fail_fast), until the uplink fails; either way the source is
    /// stopped too.
    pub fn start<S: Source>(self, source: S, shutdown: CancellationToken) -> AgentHandle {
        let Self { mut uplink, fail_fast, changes_buffer } = self;
        let cluster = uplink.cluster().to_string();
        let span = tracing::info_span!("agent", cluster = %cluster);
        tracing::info!(parent: &span, source = %source.describe(), "agent starting");
        let (changes_tx, changes_rx) = mpsc::channel(changes_buffer);
        let (status_tx, status_rx) = watch::channel(Vec::new());
        if source.reports_watch_status() {
            uplink = uplink.with_watch_status(status_rx);
        }
        let stats = uplink.stats();
        let watches = uplink.watches();
        // The source stops with the agent, or earlier when the uplink gives up.
        let source_stop = shutdown.child_token();
        let tasks = TaskTracker::new();
        tasks.spawn(
            source
                .run(SourceIo {
                    changes: changes_tx,
                    watches: uplink.watches(),
                    status: status_tx,
                    shutdown: source_stop.clone(),
                })
                .instrument(span.clone()),
        );
        let uplink = {
            let source_stop = source_stop.clone();
            tasks.spawn(
                async move {
                    let result = uplink.run(changes_rx, shutdown, fail_fast).await;
                    source_stop.cancel();
                    result
                }
                .instrument(span),
            )
        };
        tasks.close();
        AgentHandle { cluster, stats, watches, uplink, source_stop, tasks }
    }
}

/// A running agent.
#[derive(Debug)]
pub struct AgentHandle {
    cluster: String,
    stats: watch::Receiver<AgentStats>,
    watches: watch::Receiver<Vec<WatchSpec>>,
    uplink: JoinHandle<Result<AgentStats, AgentError>>,
    source_stop: CancellationToken,
    tasks: TaskTracker,
}

impl AgentHandle {
    /// The cluster id from the agent's certificate.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Live counters.
    pub fn stats(&self) -> watch::Receiver<AgentStats> {
        self.stats.clone()
    }

    /// The watch configuration the hub pushed last.
    pub fn watches(&self) -> watch::Receiver<Vec<WatchSpec>> {
        self.watches.clone()
    }

    /// Waits until the uplink has stopped (after shutdown and draining, or with its error
    /// under fail-fast) and the source with it; the final counters.
    pub async fn wait(self) -> Result<AgentStats, AgentError> {
        let result = self.uplink.await;
        self.source_stop.cancel();
        self.tasks.wait().await;
        result?
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};

    use super::*;
    use crate::source::SourceIo;

    /// A source that runs until stopped and records that it was.
    struct Probe {
        stopped: Arc<AtomicBool>,
    }

    impl Source for Probe {
        fn describe(&self) -> String {
            "probe".into()
        }

        async fn run(self, io: SourceIo) {
            io.shutdown.cancelled().await;
            self.stopped.store(true, Ordering::SeqCst);
        }
    }

    /// A runtime for agent `c1` pointed at a port nothing listens on.
    fn runtime(name: &str) -> (AgentRuntime, std::path::PathBuf) {
        let dir = std::env::temp_dir().join(format!("fleetwatch-agent-runtime-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Authority::init(&dir, "test.local").unwrap();
        Authority::load(&dir).unwrap().issue(&dir, &LeafSpec::Agent { cluster: "c1".into() }, 1).unwrap();
        let files =
            TlsFiles { cert: dir.join("agent-c1.crt"), key: dir.join("agent-c1.key"), ca: vec![dir.join("ca.crt")] };
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let config = AgentConfig::new(
            format!("wss://127.0.0.1:{port}").parse::<fleetwatch_client::transport::HubUrls>().unwrap(),
            files,
        );
        (AgentRuntime::new(config).unwrap(), dir)
    }

    #[tokio::test]
    async fn a_failing_uplink_stops_the_source() {
        let (rt, dir) = runtime("fail");
        assert_eq!(rt.cluster(), "c1");
        let stopped = Arc::new(AtomicBool::new(false));
        let agent = rt.fail_fast(true).start(Probe { stopped: stopped.clone() }, CancellationToken::new());
        let err = agent.wait().await.expect_err("nothing listens there");
        assert!(matches!(err, AgentError::Connect(_)), "{err}");
        assert!(stopped.load(Ordering::SeqCst), "the source outlived the agent");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[tokio::test]
    async fn shutdown_stops_both_tasks() {
        let (rt, dir) = runtime("shutdown");
        let stopped = Arc::new(AtomicBool::new(false));
        let shutdown = CancellationToken::new();
        let agent = rt.start(Probe { stopped: stopped.clone() }, shutdown.clone());
        assert_eq!(agent.cluster(), "c1");
        shutdown.cancel();
        let stats = agent.wait().await.expect("a clean shutdown");
        assert!(!stats.connected);
        // The resync marker of a fresh start got a seq and was never acked.
        assert_eq!((stats.last_seq, stats.acked_seq), (1, 0));
        assert!(stopped.load(Ordering::SeqCst));
        let _ = std::fs::remove_dir_all(dir);
    }
}
