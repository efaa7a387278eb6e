//! fleetwatch's client side: the mutual-TLS WebSocket transport to the hub, the
//! subscriber client that resumes from a durable cursor, the `Sink` trait its consumers
//! implement (acknowledged only after the sink accepted), the reconnect backoff both the
//! subscriber and the agent's uplink use, and loading a Kubernetes client from a kubeconfig file.
//!
//! The wire format itself lives in `fleetwatch-protocol`; this crate owns the sockets.
#![warn(missing_docs)]

pub mod backoff;
pub mod client_tls;
pub mod kubeconfig;
pub mod resume;
pub mod sink;
pub mod subscriber;
pub mod tls_hint;
pub mod transport;
