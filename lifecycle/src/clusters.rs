//! Reaching runtime clusters: a client per Runtime, built from the kubeconfig in the Secret
//! the Runtime names (or the control plane's own client when it names none), cached until
//! the Secret changes.
//!
//! Where the Secret is read: the one namespace the operator keeps kubeconfigs in
//! (`--kubeconfig-namespace`), so its ServiceAccount needs Secret access there only and
//! none where the hub's key, the admin token and the CA live; without it, the Runtime's
//! own namespace. A Runtime naming a Secret anywhere else is refused: letting it point at
//! any namespace would let whoever writes Runtimes make the operator use (and reveal by
//! its effects) credentials of namespaces they cannot read.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleetwatch_api::{Runtime, SecretKeyRef};
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::Error;
use crate::applier::Applier;
use crate::error::ClusterError;

/// (namespace, Secret name) → (the Secret's resourceVersion, its cluster's writer).
type ApplierCache = HashMap<(String, String), (String, Arc<Applier>)>;

/// Cached appliers per Secret version.
pub struct Clusters {
    control_plane: kube::Client,
    /// `--kubeconfig-namespace`: the only namespace kubeconfig Secrets are read from.
    kubeconfig_namespace: Option<String>,
    local: Arc<Applier>,
    cache: Mutex<ApplierCache>,
}

impl Clusters {
    /// Clusters reached from the control plane; kubeconfig Secrets are read from
    /// `kubeconfig_namespace` only, or from each Runtime's namespace when `None`.
    pub fn new(control_plane: kube::Client, kubeconfig_namespace: Option<String>) -> Self {
        Self {
            local: Arc::new(Applier::new(control_plane.clone())),
            control_plane,
            kubeconfig_namespace,
            cache: Mutex::new(HashMap::new()),
        }
    }

    /// The namespace credentials are read from instead of the object's own, when the
    /// operator keeps them apart (`--kubeconfig-namespace`).
    pub fn kubeconfig_namespace(&self) -> Option<&str> {
        self.kubeconfig_namespace.as_deref()
    }

    /// The writer for a Runtime's cluster.
    pub async fn applier(&self, rt: &Runtime) -> Result<Arc<Applier>, Error> {
        let Some(secret_ref) = &rt.spec.kubeconfig_secret else { return Ok(self.local.clone()) };
        let rt_ns = rt.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let runtime = format!("{rt_ns}/{}", rt.metadata.name.as_deref().unwrap_or_default());
        let ns = secret_namespace(self.kubeconfig_namespace.as_deref(), &rt_ns, secret_ref)
            .map_err(|source| Error::Cluster { runtime: runtime.clone(), source })?;
        self.remote(&ns, secret_ref, &rt.cluster_id()).await.map_err(|source| Error::Cluster { runtime, source })
    }

    async fn remote(&self, ns: &str, secret_ref: &SecretKeyRef, cluster: &str) -> Result<Arc<Applier>, ClusterError> {
        let secret_name = format!("{ns}/{}", secret_ref.name);
        let secrets: Api<Secret> = Api::namespaced(self.control_plane.clone(), ns);
        let secret = secrets
            .get_opt(&secret_ref.name)
            .await
            .map_err(|source| ClusterError::ReadSecret { secret: secret_name.clone(), source })?
            .ok_or_else(|| ClusterError::SecretNotFound { secret: secret_name.clone() })?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = (ns.to_string(), secret_ref.name.clone());
        if let Some((v, a)) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned())
            && v == version
        {
            return Ok(a);
        }
        let field = secret_ref.key.clone().unwrap_or_else(|| "config".into());
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(&field))
            .map(|b| b.0.clone())
            .or_else(|| secret.string_data.as_ref().and_then(|d| d.get(&field)).map(|s| s.clone().into_bytes()))
            .ok_or_else(|| ClusterError::MissingKey { secret: secret_name.clone(), key: field.clone() })?;
        let text = String::from_utf8(bytes).map_err(|_| ClusterError::NotUtf8 { secret: secret_name.clone() })?;
        let kubeconfig = |source| ClusterError::Kubeconfig { secret: secret_name.clone(), source };
        let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(kubeconfig)?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(kubeconfig)?;
        let client =
            kube::Client::try_from(config).map_err(|source| ClusterError::Client { secret: secret_name, source })?;
        let applier = Arc::new(Applier::for_cluster(client, cluster));
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, (version, applier.clone()));
        }
        Ok(applier)
    }
}

/// The namespace a Runtime's kubeconfig Secret is read from: the operator's kubeconfig
/// namespace (or, without one, the Runtime's), which the reference may repeat but not change.
pub fn secret_namespace(
    kubeconfig_namespace: Option<&str>,
    runtime_namespace: &str,
    secret_ref: &SecretKeyRef,
) -> Result<String, ClusterError> {
    let (allowed, why) = match kubeconfig_namespace {
        Some(ns) => (ns, "--kubeconfig-namespace"),
        None => (runtime_namespace, "the Runtime's own namespace: the operator has no --kubeconfig-namespace"),
    };
    match secret_ref.namespace.as_deref() {
        None => Ok(allowed.to_string()),
        Some(ns) if ns == allowed => Ok(allowed.to_string()),
        Some(ns) => Err(ClusterError::ForeignNamespace {
            secret: format!("{ns}/{}", secret_ref.name),
            allowed: allowed.to_string(),
            why,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(ns: Option<&str>) -> SecretKeyRef {
        SecretKeyRef { name: "kc".into(), namespace: ns.map(str::to_string), key: None }
    }

    #[test]
    fn kubeconfigs_are_read_from_one_namespace_only() {
        // With --kubeconfig-namespace: there, whatever the Runtime's namespace.
        assert_eq!(secret_namespace(Some("fw-runtimes"), "team-a", &r(None)).unwrap(), "fw-runtimes");
        assert_eq!(secret_namespace(Some("fw-runtimes"), "team-a", &r(Some("fw-runtimes"))).unwrap(), "fw-runtimes");
        let err = secret_namespace(Some("fw-runtimes"), "team-a", &r(Some("fleetwatch-system"))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "Secret fleetwatch-system/kc: kubeconfig Secrets are read from namespace fw-runtimes only (--kubeconfig-namespace)"
        );
        // Without it: the Runtime's own namespace, and no other.
        assert_eq!(secret_namespace(None, "team-a", &r(None)).unwrap(), "team-a");
        let err = secret_namespace(None, "team-a", &r(Some("team-b"))).unwrap_err();
        assert!(err.to_string().contains("read from namespace team-a only"), "{err}");
    }
}
