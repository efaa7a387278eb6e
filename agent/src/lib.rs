//! The fleetwatch agent: turns changes in a runtime cluster into events, keeps them in a
//! coalescing outbox, and streams them to the hub over one mutual-TLS WebSocket,
//! reconnecting forever and resuming from the last acked seq.
//!
//! Pipeline, one module per arrow: [`source`] (a [`source::Source`]: Kubernetes in
//! [`kube_source`], or synthetic) → [`filter`] (only changes of watched fields, synthetic
//! deletes after a relist) → [`outbox`] (coalescing, bounded) → the uplink (to the hub; its
//! pure core is [`link`]).
//! [`runtime::AgentRuntime`] wires them together and owns their tasks; every program that
//! runs an agent goes through it.

pub mod filter;
pub mod kube_source;
pub mod link;
pub mod metrics;
pub mod outbox;
pub mod providers;
pub mod runtime;
pub mod source;
mod uplink;

pub use runtime::{AgentHandle, AgentRuntime};
pub use uplink::{AgentConfig, AgentError, AgentStats, LinkError};
