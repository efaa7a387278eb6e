//! fleetwatch's client side: the mutual-TLS WebSocket transport to the hub, the
//! subscriber client that resumes from a durable cursor, the `Sink` trait its consumers
//! implement (acknowledged only after the sink accepted), the reconnect backoff both the
//! subscriber and the agent's uplink use, loading a Kubernetes client from a kubeconfig file, and a
//! Kubernetes watch that lists again after a failure (so a status set from the failure is taken back).
//!
//! The wire format itself lives in `fleetwatch-protocol`; this crate owns the sockets.
#![warn(missing_docs)]

pub mod backoff;
pub mod client_tls;
pub mod kube_watch;
pub mod kubeconfig;
pub mod sink;
pub mod subscriber;
pub mod tls_hint;
pub mod transport;
