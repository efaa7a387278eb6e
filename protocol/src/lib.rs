//! fleetwatch's wire protocol: the messages agents, the hub and subscribers exchange, the
//! events they carry, the codec with its limits, and the identities certificates name.
//!
//! This crate does no I/O: no sockets, no async runtime, no Kubernetes client (like
//! kube-rs's `kube-core`). Everything on the wire is defined once here, so the agent, the
//! hub and every subscriber agree on it, and its properties are tested without a network.
//!
//! ```
//! use fleetwatch_protocol::{Event, ObjectKey};
//! let key = ObjectKey::new("v1", "ConfigMap", Some("default"), "settings");
//! let ev = Event::applied("eu-1", 1, 7, &key, serde_json::json!({"data": {}}));
//! assert_eq!(ev.id, "eu-1/1/7");
//! ```

pub mod codec;
pub mod digest;
pub mod event;
pub mod identity;
pub mod message;
pub mod provides;
pub mod watch;

pub use codec::Limits;
pub use event::{Event, ObjectKey};
pub use identity::{Identity, Role};
