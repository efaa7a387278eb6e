//! Reaching runtime clusters: a client per Runtime, built from the kubeconfig in the Secret
//! the Runtime names (or the control plane's own client when it names none), cached until
//! the Secret changes.

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
    local: Arc<Applier>,
    cache: Mutex<ApplierCache>,
}

impl Clusters {
    /// Clusters reached from the control plane.
    pub fn new(control_plane: kube::Client) -> Self {
        Self { local: Arc::new(Applier::new(control_plane.clone())), control_plane, cache: Mutex::new(HashMap::new()) }
    }

    /// The writer for a Runtime's cluster.
    pub async fn applier(&self, rt: &Runtime) -> Result<Arc<Applier>, Error> {
        let Some(secret_ref) = &rt.spec.kubeconfig_secret else { return Ok(self.local.clone()) };
        let ns = rt.metadata.namespace.clone().unwrap_or_else(|| "default".into());
        let runtime = format!("{ns}/{}", rt.metadata.name.as_deref().unwrap_or_default());
        self.remote(&ns, secret_ref).await.map_err(|source| Error::Cluster { runtime, source })
    }

    async fn remote(&self, ns: &str, secret_ref: &SecretKeyRef) -> Result<Arc<Applier>, ClusterError> {
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
        let applier = Arc::new(Applier::new(client));
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, (version, applier.clone()));
        }
        Ok(applier)
    }
}
