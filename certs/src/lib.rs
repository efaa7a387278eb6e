//! fleetwatch PKI: a certificate authority per trust domain, certificates for the hub,
//! agents and subscribers carrying SPIFFE identities, and the rustls configurations that
//! enforce mutual TLS, with hot reload from disk ([`ReloadingFile`], which the hub's deny
//! list, access policy and admin token follow their files with too; [`FileChecks`] says
//! when to look again: at once when inotify reports a change, else on a slow fallback).
//!
//! ```no_run
//! use fleetwatch_certs::{Authority, LeafSpec};
//! let dir = std::path::Path::new("/tmp/pki");
//! Authority::init(dir, "fleetwatch.local").unwrap();
//! let ca = Authority::load(dir).unwrap();
//! ca.issue(dir, &LeafSpec::Agent { cluster: "eu-1".into() }, 365).unwrap();
//! ```
#![warn(missing_docs)]

mod authority;
mod error;
mod inspect;
mod reloading;
mod tls;
pub mod tls_error;
mod verify;
pub mod watch;

pub use authority::{Authority, IssuedFiles, LeafSpec};
pub use error::CertError;
pub use inspect::{CertInfo, Purpose, inspect_bundle, inspect_file, inspect_pem};
pub use reloading::{Compare, Contents, Reload, ReloadingFile};
pub use tls::{
    ClientReload, PeerCert, ReloadingClientConfig, ReloadingServerConfig, TlsFiles, client_config,
    install_crypto_provider, peer_certificate, peer_identity, server_config, server_config_optional_client,
};
pub use watch::FileChecks;
