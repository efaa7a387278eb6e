//! Deterministic simulation of fleetwatch's delivery path.
//!
//! The real agent runtime (outbox, uplink), the real hub (accept loop, TLS, agent and
//! subscriber sessions, ingest, bus, fan-out) and the real subscriber client run in one
//! process on [turmoil]: one thread, a seeded scheduler, a simulated clock and a simulated
//! network. A driver, drawing every choice from the seed, writes to simulated clusters
//! ([`cluster`]) and injects faults: connection cuts, partitions and held links, hub
//! crashes (memory bus, or the segment log with its last records cut and its cursor store
//! lost), agent crashes while the cluster changes, a second agent process of a cluster,
//! subscriber crashes (the live one back from `earliest` or `latest`, the durable one
//! resuming under its name), slow and stalled
//! subscribers, expired watches; with `--storage nats`, 2 or 3 hub replicas on the NATS bus
//! over an in-memory JetStream ([`jetstream`]) that restarts (its store lost or kept), loses
//! publish acks and has one replica's link cut. Then everything heals, and the oracle ([`oracle`]) checks
//! that each subscriber knows every object's final state, or was told to resync after the
//! change it missed, and saw no duplicate it had acknowledged.
//!
//! ```no_run
//! let report = fleetwatch_dst::run(42, &fleetwatch_dst::Options::default()).unwrap();
//! assert!(report.passed(), "{:?}", report.violations);
//! ```
//!
//! Where the real code needed a seam to run here, it got a small one: the transport's
//! [`fleetwatch_client::transport::Dialer`] and the hub's [`fleetwatch_hub::Listener`]
//! (streams other than TCP), the agent's epoch, tokio's clock (simulated here) where
//! std's decided behaviour (session liveness, rate budgets), and where the segment log's
//! writer runs ([`fleetwatch_bus::WriterPlacement::Runtime`]: on the simulated
//! runtime, so a segment-log seed replays as exactly as a memory-bus one).

pub mod batch;
pub mod cluster;
pub mod hosts;
pub mod jetstream;
pub mod net;
pub mod oracle;
pub mod pki;
pub mod sim;
pub mod source;
pub mod storage;

pub use batch::{Summary, print_report, run_seeds};
pub use sim::{Options, Report, Storage, replay_command, run};

/// Logs to stderr when `DST_LOG` is set (an env filter, e.g. `info` or
/// `fleetwatch_hub=debug`); silent otherwise, which keeps runs fast.
pub fn init_logging() {
    if let Ok(filter) = std::env::var("DST_LOG") {
        let _ = tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_writer(std::io::stderr)
            .try_init();
    }
}
