//! `fleetwatch-sim`: an in-memory Kubernetes API server that speaks the real HTTP API
//! (discovery, CRUD, list/watch with resourceVersions, CRDs, patches, server-side apply,
//! finalizers, garbage collection) over HTTPS, so that the real `kubectl` and kube-rs work
//! against it unchanged — plus fault injection for tests.
//!
//! Embedding one in a test:
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use fleetwatch_sim::{SimCluster, SimOptions};
//! use kube::api::{Api, DynamicObject};
//!
//! let sim = SimCluster::start(SimOptions { history: 100, ..SimOptions::default() }).await?;
//! let client = sim.client().await?;
//! let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(client, "default");
//! sim.faults().fail_next(1, 500);
//! assert!(cms.list(&Default::default()).await.is_err());
//! # Ok(()) }
//! ```
//!
//! See `docs/sim.md` for what is simulated and what is not.

mod apply;
mod authz;
#[cfg(feature = "kube-client")]
mod bench;
mod cli;
mod cluster;
mod convert;
#[cfg(feature = "kube-client")]
mod deployments;
mod discovery;
mod error;
mod faults;
mod gc;
mod http;
mod kubeconfig;
mod meta;
mod openapi;
mod ops;
mod patch;
mod pbwire;
mod protobuf;
mod proxy;
mod resources;
mod schema;
mod selector;
mod store;
mod table;
mod tls;
mod watch;

#[cfg(feature = "kube-client")]
pub use bench::{BenchOptions, BenchReport, bench};
pub use cli::{Endpoint, SimArgs, SimCommand, TokenArgs, run};
pub use cluster::{DEFAULT_HISTORY, SimCluster, SimOptions};
#[cfg(feature = "kube-client")]
pub use deployments::roll_out_deployments;
pub use error::{ApiError, SimError};
pub use faults::Faults;
