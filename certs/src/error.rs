use std::path::PathBuf;

/// What went wrong with a certificate, a key or a TLS configuration; always names the file.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    /// A file could not be read or written.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A file holds no usable PEM certificate or key.
    #[error("{path}: {what}")]
    Pem {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        what: String,
    },
    /// Generating or signing failed.
    #[error("cannot generate certificate: {0}")]
    Generate(#[from] rcgen::Error),
    /// The CA directory already has a CA.
    #[error("{0} already holds a CA (ca.crt); refusing to overwrite it")]
    AlreadyInitialised(PathBuf),
    /// An identity or name is invalid.
    #[error(transparent)]
    Identity(#[from] fleetwatch_protocol::identity::IdentityError),
    /// The certificate and key do not belong together, or rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// The peer's certificate carries no identity we accept.
    #[error("peer certificate: {0}")]
    PeerIdentity(String),
    /// A bad argument.
    #[error("{0}")]
    Invalid(String),
}

pub(crate) fn io_err(path: &std::path::Path) -> impl FnOnce(std::io::Error) -> CertError + '_ {
    move |source| CertError::Io { path: path.to_path_buf(), source }
}
