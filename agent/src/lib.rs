//! The fleetwatch agent: turns changes in a runtime cluster into events, keeps them in a
//! coalescing outbox, and streams them to the hub over one mutual-TLS WebSocket,
//! reconnecting forever and resuming from the last acked seq.
//!
//! Pipeline: source → outbox → uplink.
#![warn(missing_docs)]

pub mod kube_source;
pub mod outbox;
pub mod source;
mod uplink;

pub use uplink::{Agent, AgentConfig, AgentError, AgentStats};
