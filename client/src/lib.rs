//! fleetwatch's client side: the mutual-TLS WebSocket transport to the hub, the
//! subscriber client that resumes from a durable cursor, the reconnect backoff both it and
//! the agent's uplink use, and loading a Kubernetes client from a kubeconfig file.
//!
//! The wire format itself lives in `fleetwatch-protocol`; this crate owns the sockets.
#![warn(missing_docs)]

pub mod backoff;
pub mod kubeconfig;
pub mod subscriber;
pub mod tls_hint;
pub mod transport;
