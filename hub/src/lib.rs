//! The fleetwatch hub: authenticates agents and subscribers by their certificates, takes
//! events from agents into the bus (acking only what the bus accepted), and fans them out
//! to subscribers.
//!
//! One module per arrow of the data path, so each rule has one home:
//! `listener` and `server` (accept, TLS, identity, admission budgets) → `session::agent`
//! (a connection: carries decisions out) → `ingest` (pure: what to do with each frame) →
//! the bus (crate `fleetwatch_bus`: the log behind its `Bus` trait, in memory, as a
//! segment log on disk, or on NATS JetStream shared by several hub replicas) →
//! `session::subscriber` (fan-out from a cursor, decided by the pure `delivery`; frames
//! built once by the protocol's `EventsFrame`). Around them: `registry` (the one registry
//! of connections and clusters, whose rows are the plain values of `cluster`), `policy`
//! (the access policy, the deny list, the start-up checks), [`admin`], `metrics` (with
//! `scrape`, the state read at scrape time), [`fleet`], [`watch_source`], [`opening`] and
//! `housekeeping`. Shared state is split by who needs it: `session::Sessions` for
//! sessions, `context::Context` for the hub around them; [`Hub`] binds and runs it all.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fleetwatch_hub::HubError> {
//! use fleetwatch_hub::{Hub, HubConfig};
//! use fleetwatch_certs::TlsFiles;
//! let tls = TlsFiles { cert: "hub.crt".into(), key: "hub.key".into(), ca: vec!["ca.crt".into()] };
//! let hub = Hub::bind(HubConfig::new("127.0.0.1:7443".parse().unwrap(), tls)).await?;
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! hub.run(shutdown).await
//! # }
//! ```
#![warn(missing_docs)]

pub mod admin;
mod admission;
mod cluster;
mod config;
mod context;
mod delivery;
mod error;
mod fanout;
pub mod fleet;
mod housekeeping;
mod hub;
mod in_flight;
mod ingest;
mod listener;
mod metrics;
pub mod opening;
mod peer;
mod policy;
mod rate;
mod registry;
mod scrape;
mod server;
mod session;
mod tls_hint;
pub mod watch_source;
mod watch_status;

pub use cluster::ClusterStatus;
pub use config::HubConfig;
pub use error::HubError;
pub use hub::Hub;
pub use listener::{Accept, Accepted, Listener};
pub use policy::access::AccessPolicyError;
pub use policy::revocation::DenyListError;
