//! Why the hub could not start or run ([`HubError`]): one variant per cause, each carrying
//! the file or address it is about.

use std::net::SocketAddr;

use fleetwatch_certs::CertError;

use crate::admin::auth::AdminAuthError;
use crate::policy::access::AccessPolicyError;
use crate::policy::revocation::DenyListError;

/// Why the hub could not start or run.
#[derive(Debug, thiserror::Error)]
pub enum HubError {
    /// Certificates or keys are unusable.
    #[error(transparent)]
    Tls(#[from] CertError),
    /// A listener could not bind.
    #[error("cannot listen on {addr}: {source}{hint}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
        /// What to do about it (empty, or starting with `; `).
        hint: String,
    },
    /// A start-up check refused the configuration: it cannot work (see `policy::preflight`).
    #[error("{0}")]
    Refused(String),
    /// The bus could not open its storage.
    #[error(transparent)]
    Bus(#[from] fleetwatch_bus::BusError),
    /// The bus can never work again in this process (see `Bus::fatal`): the hub stopped,
    /// for its supervisor to start it again.
    #[error("the bus cannot work again in this process: {0}")]
    BusUnusable(String),
    /// The deny list cannot be read.
    #[error(transparent)]
    DenyList(#[from] DenyListError),
    /// The access policy cannot be read or is invalid.
    #[error(transparent)]
    AccessPolicy(#[from] AccessPolicyError),
    /// The watch configuration cannot be loaded.
    #[error("watch configuration: {0}")]
    WatchConfig(String),
    /// The admin endpoint cannot be protected as configured.
    #[error(transparent)]
    AdminAuth(#[from] AdminAuthError),
}
