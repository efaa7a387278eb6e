//! Reaching runtime clusters: a client per Runtime, built from the kubeconfig in the Secret
//! the Runtime names (or the control plane's own client when it names none), cached until
//! the Secret changes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use fleetwatch_api::Runtime;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;

use crate::Error;
use crate::applier::Applier;

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
        let secrets: Api<Secret> = Api::namespaced(self.control_plane.clone(), &ns);
        let secret = secrets
            .get_opt(&secret_ref.name)
            .await
            .map_err(|e| Error::Cluster(format!("reading Secret {ns}/{}: {e}", secret_ref.name)))?
            .ok_or_else(|| Error::Cluster(format!("Secret {ns}/{} not found", secret_ref.name)))?;
        let version = secret.metadata.resource_version.clone().unwrap_or_default();
        let key = (ns.clone(), secret_ref.name.clone());
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
            .ok_or_else(|| Error::Cluster(format!("Secret {ns}/{} has no key {field:?}", secret_ref.name)))?;
        let text = String::from_utf8(bytes).map_err(|_| Error::Cluster("kubeconfig is not UTF-8".into()))?;
        let kc = kube::config::Kubeconfig::from_yaml(&text)
            .map_err(|e| Error::Cluster(format!("Secret {ns}/{}: bad kubeconfig: {e}", secret_ref.name)))?;
        let config = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| Error::Cluster(format!("Secret {ns}/{}: {e}", secret_ref.name)))?;
        let client = kube::Client::try_from(config).map_err(|e| Error::Cluster(e.to_string()))?;
        let applier = Arc::new(Applier::new(client));
        if let Ok(mut c) = self.cache.lock() {
            c.insert(key, (version, applier.clone()));
        }
        Ok(applier)
    }
}
