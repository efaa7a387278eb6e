//! fleetwatch's client side: the mutual-TLS WebSocket transport to the hub, the
//! subscriber client that resumes from a durable cursor, the `Sink` trait its consumers
//! implement (acknowledged only after the sink accepted), the reconnect backoff both the
//! subscriber and the agent's uplink use, loading a Kubernetes client from a kubeconfig file,
//! a Kubernetes watch that lists again after a failure (so a status set from the failure is
//! taken back), server-side applying manifests (`kube_apply`, for the sandbox and the
//! benchmarks) and reading the hub's admin API (`admin_http`, for `status`, the sandbox and
//! the benchmarks).
//!
//! The wire format itself lives in `fleetwatch-protocol`; this crate owns the sockets.

pub mod admin_http;
pub mod backoff;
pub mod client_tls;
pub mod kube_apply;
pub mod kube_watch;
pub mod kubeconfig;
pub mod resume;
pub mod sink;
pub mod subscriber;
pub mod tls_hint;
pub mod transport;
