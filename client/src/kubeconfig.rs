//! Reaching a Kubernetes cluster from a kubeconfig file.

/// A client for the cluster a kubeconfig file's current context names.
///
/// Errors name the file.
pub async fn client_from_kubeconfig(path: &std::path::Path) -> Result<kube::Client, String> {
    let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| format!("{}: {e}", path.display()))?;
    kube::Client::try_from(config).map_err(|e| format!("{}: {e}", path.display()))
}
