//! fleetwatch core: the wire protocol, identities, limits and the subscriber client.
//!
//! Everything that more than one fleetwatch component needs lives here, so that the
//! agent, the hub and subscribers agree on one definition.
#![warn(missing_docs)]

pub mod api;
pub mod codec;
pub mod event;
pub mod identity;
pub mod kubeconfig;
pub mod maintenance;
pub mod policy;
pub mod protocol;
pub mod subscriber;
pub mod tls_hint;
pub mod transport;
pub mod watchconfig;

pub use codec::Limits;
pub use event::{Event, ObjectKey};
pub use identity::{Identity, Role};
