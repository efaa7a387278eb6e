//! Applying JSON manifests with server-side apply, kind resolved through discovery: what
//! `kubectl apply --server-side` does, for the sandbox and the benchmarks.

use anyhow::Context;
use kube::api::{Api, DynamicObject, Patch, PatchParams};

/// Server-side applies one object as `manager` (forcing conflicts).
pub async fn apply(client: &kube::Client, manager: &str, v: &serde_json::Value) -> anyhow::Result<()> {
    let api_version = v["apiVersion"].as_str().context("object without apiVersion")?;
    let kind = v["kind"].as_str().context("object without kind")?;
    let name = v["metadata"]["name"].as_str().context("object without metadata.name")?;
    let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
    let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
    let (ar, caps) =
        kube::discovery::pinned_kind(client, &gvk).await.with_context(|| format!("kind {api_version} {kind}"))?;
    let api: Api<DynamicObject> = match (caps.scope, v["metadata"]["namespace"].as_str()) {
        (kube::discovery::Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &ar),
        _ => Api::all_with(client.clone(), &ar),
    };
    api.patch(name, &PatchParams::apply(manager).force(), &Patch::Apply(v))
        .await
        .with_context(|| format!("applying {kind} {name}"))?;
    Ok(())
}

/// Applies every CRD fleetwatch defines and waits until they are served.
pub async fn install_crds(client: &kube::Client) -> anyhow::Result<()> {
    for (_, yaml) in crate::crds_cmd::generated()? {
        let crd: serde_json::Value = serde_saphyr::from_str(&yaml).context("generated CRD")?;
        apply(client, "fleetwatch", &crd).await?;
    }
    for _ in 0..50 {
        let gvk = kube::api::GroupVersionKind::gvk("operator.fleetwatch.dev", "v1alpha1", "Runtime");
        if kube::discovery::pinned_kind(client, &gvk).await.is_ok() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    anyhow::bail!("fleetwatch CRDs are not served after 5 s")
}
