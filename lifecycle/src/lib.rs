//! The module lifecycle operator: the hub's first subscriber. It keeps each `Runtime`'s
//! modules in their desired state in the runtime cluster: release channels, install and
//! upgrade by server-side apply, downgrade protection against the version actually
//! running, create-once default configuration, and deletion policies.
//!
//! Event-driven: Runtime changes, ModuleReleaseMeta and ModuleTemplate changes (only the
//! runtimes they affect) and hub events for a runtime's cluster trigger reconciles; a long
//! periodic resync is only a safety net.
//!
//! The crate's layout:
//! - [`run`] (`operator`) starts the watches, the stores and kube-runtime's controller;
//!   [`LifecycleConfig`] (`config`) is what it is given; `context` holds what reconciles share.
//! - `reconcile` carries out one Runtime's reconcile: it gathers what the cluster and the
//!   stores say, asks `plan` (pure: the module rules) what to do, and does it.
//! - The rules' own modules: `rollout` (paced channel moves), [`maintenance`] (windows),
//!   `requires` and `provides` (dependencies), `config_policy`, [`migration`], `retry`.
//! - Reaching runtime clusters: [`applier`], `clusters`, `catalog`, [`agent_module`];
//!   module artifacts: [`artifact`]; sharing the fleet between instances: [`shards`],
//!   [`buckets`]; triggers from the hub: `triggers`; status, Events and metrics: `events`,
//!   `meta_status`, [`Metrics`], [`health`].
#![warn(missing_docs)]

pub mod agent_module;
pub mod applier;
pub mod artifact;
pub mod buckets;
pub mod health;
pub mod maintenance;
pub mod migration;
pub mod shards;

mod catalog;
mod chosen;
mod clusters;
mod config;
mod config_policy;
mod context;
mod error;
mod events;
mod meta_status;
mod metrics;
mod operator;
mod plan;
mod provides;
mod reconcile;
mod requires;
mod retry;
mod rollout;
mod tolerant;
mod triggers;
mod usable;
mod watches;

pub use config::{LifecycleConfig, ReconcileObserver};
pub(crate) use context::Ctx;
pub use error::Error;
pub use metrics::Metrics;
pub use operator::run;
