//! Applying JSON manifests with server-side apply, kind resolved through discovery: what
//! `kubectl apply --server-side` does, for the sandbox (`up`) and the benchmarks.

use kube::api::{Api, DynamicObject, Patch, PatchParams};

/// Why an object could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    /// The object lacks a field every object has.
    #[error("object without {0}")]
    Incomplete(&'static str),
    /// Discovery does not know the kind.
    #[error("kind {api_version} {kind}")]
    Kind {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The API server refused the apply.
    #[error("applying {kind} {name}")]
    Apply {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The cause.
        #[source]
        source: kube::Error,
    },
    /// The CRDs were applied but their kinds are not served.
    #[error("fleetwatch CRDs are not served after 5 s")]
    NotServed,
}

/// Server-side applies one object as `manager` (forcing conflicts).
pub async fn apply(client: &kube::Client, manager: &str, v: &serde_json::Value) -> Result<(), ApplyError> {
    let api_version = v["apiVersion"].as_str().ok_or(ApplyError::Incomplete("apiVersion"))?;
    let kind = v["kind"].as_str().ok_or(ApplyError::Incomplete("kind"))?;
    let name = v["metadata"]["name"].as_str().ok_or(ApplyError::Incomplete("metadata.name"))?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) = kube::discovery::pinned_kind(client, &gvk).await.map_err(|source| ApplyError::Kind {
        api_version: api_version.into(),
        kind: kind.into(),
        source,
    })?;
    let api: Api<DynamicObject> = match (caps.scope, v["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    api.patch(name, &PatchParams::apply(manager).force(), &Patch::Apply(v))
        .await
        .map_err(|source| ApplyError::Apply { kind: kind.into(), name: name.into(), source })?;
    Ok(())
}

/// Applies the CRDs `crds` (fleetwatch's, from `fleetwatch crds`) and waits until they are
/// served.
pub async fn install_crds(client: &kube::Client, crds: &[serde_json::Value]) -> Result<(), ApplyError> {
    for crd in crds {
        apply(client, "fleetwatch", crd).await?;
    }
    for _ in 0..50 {
        let gvk = kube::api::GroupVersionKind::gvk("operator.fleetwatch.dev", "v1alpha1", "Runtime");
        if kube::discovery::pinned_kind(client, &gvk).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    Err(ApplyError::NotServed)
}
