//! Reaching a Kubernetes cluster from a kubeconfig file.
//!
//! The agent, the hub (control-plane watch configs) and the lifecycle operator all take a
//! `--kubeconfig`-style path; the one thing a user needs when it fails is which file and
//! which step, so the error is typed and names the file.

use std::path::{Path, PathBuf};

/// Why a kubeconfig file gave no client. Each variant names the file.
#[derive(Debug, thiserror::Error)]
pub enum KubeconfigError {
    /// The file cannot be read or parsed.
    #[error("{}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// Its current context does not make a usable configuration (missing cluster or user,
    /// unreadable certificate, ...).
    #[error("{}: {source}", path.display())]
    Config {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No client can be built from that configuration (TLS setup).
    #[error("{}: {source}", path.display())]
    Client {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: kube::Error,
    },
}

/// A client for the cluster a kubeconfig file's current context names.
pub async fn client_from_kubeconfig(path: &Path) -> Result<kube::Client, KubeconfigError> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .map_err(|source| KubeconfigError::Read { path: path.into(), source })?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|source| KubeconfigError::Config { path: path.into(), source })?;
    kube::Client::try_from(config).map_err(|source| KubeconfigError::Client { path: path.into(), source })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn errors_name_the_file() {
        let missing = std::env::temp_dir().join(format!("fleetwatch-no-such-kubeconfig-{}", std::process::id()));
        let Err(err) = client_from_kubeconfig(&missing).await else { panic!("no such file") };
        assert!(matches!(err, KubeconfigError::Read { .. }), "{err:?}");
        assert!(err.to_string().starts_with(&missing.display().to_string()), "{err}");

        // Parses, but its current context names nothing.
        let empty = std::env::temp_dir().join(format!("fleetwatch-empty-kubeconfig-{}", std::process::id()));
        std::fs::write(&empty, "apiVersion: v1\nkind: Config\ncurrent-context: nowhere\n").unwrap();
        let Err(err) = client_from_kubeconfig(&empty).await else { panic!("no such context") };
        let _ = std::fs::remove_file(&empty);
        assert!(matches!(err, KubeconfigError::Config { .. }), "{err:?}");
        assert!(err.to_string().contains(&empty.display().to_string()), "{err}");
    }
}
