//! The module catalog kept in every runtime cluster: a read-only ConfigMap
//! `kube-public/fleetwatch-catalog` listing the available modules, their channels and
//! versions, so tools in the cluster can show what can be installed.
//!
//! Its `catalog.json` is a contract (`fleetwatch modules list` reads it):
//! `{"channel": "<the Runtime's default channel>", "selfService": <whether users may choose
//! modules>, "modules": [{"name", "channels": {"<channel>": "<version>"}, "versions": [...],
//! "mandatory", "deprecated": [{"version", "deprecationDate", "message"}], "selfService":
//! <whether users of this cluster may choose it>}]}`.

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate};
use kube::ResourceExt;
use serde_json::{Value, json};

use crate::Error;
use crate::applier::Applier;

/// Namespace of the catalog.
pub const NAMESPACE: &str = "kube-public";
/// Name of the catalog ConfigMap.
pub const NAME: &str = "fleetwatch-catalog";

/// The catalog of one control-plane namespace, as `rt`'s users see it (which modules they may
/// choose, which channel is theirs by default).
pub fn build(
    rt: &fleetwatch_api::Runtime,
    ns: &str,
    metas: &[std::sync::Arc<ModuleReleaseMeta>],
    templates: &[std::sync::Arc<ModuleTemplate>],
) -> Value {
    let mut modules: BTreeMap<String, Value> = BTreeMap::new();
    for m in metas.iter().filter(|m| m.namespace().as_deref() == Some(ns)) {
        let mut versions: Vec<String> = templates
            .iter()
            .filter(|t| t.namespace().as_deref() == Some(ns) && t.spec.module_name == m.spec.module_name)
            .map(|t| t.spec.version.clone())
            .collect();
        versions.sort_by(|a, b| match (semver::Version::parse(a), semver::Version::parse(b)) {
            (Ok(a), Ok(b)) => a.cmp(&b),
            _ => a.cmp(b),
        });
        let channels: BTreeMap<&str, &str> =
            m.spec.channels.iter().map(|c| (c.channel.as_str(), c.version.as_str())).collect();
        let deprecated: Vec<Value> = m
            .spec
            .versions
            .iter()
            .filter(|v| v.deprecation_date.is_some())
            .map(|v| json!({"version": v.version, "deprecationDate": v.deprecation_date, "message": v.message}))
            .collect();
        modules.insert(
            m.spec.module_name.clone(),
            json!({"name": m.spec.module_name, "channels": channels, "versions": versions, "mandatory": m.spec.mandatory, "deprecated": deprecated}),
        );
    }
    let self_service = rt.spec.self_service.clone().unwrap_or_default();
    for (name, m) in modules.iter_mut() {
        m["selfService"] = json!(self_service.allows(name));
    }
    let channel = rt.spec.channel.as_deref().unwrap_or(fleetwatch_api::DEFAULT_CHANNEL);
    json!({"channel": channel, "selfService": self_service.enabled, "modules": modules.into_values().collect::<Vec<_>>()})
}

/// A stable fingerprint, to skip writing an unchanged catalog.
pub fn fingerprint(catalog: &Value) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    catalog.to_string().hash(&mut h);
    h.finish()
}

/// Writes the catalog into the runtime cluster.
pub async fn write(applier: &Applier, catalog: &Value) -> Result<(), Error> {
    applier.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})).await?;
    // An unserialisable catalog is an error, never an empty ConfigMap that says "nothing
    // can be installed".
    let text = serde_json::to_string_pretty(catalog)
        .map_err(|source| Error::Serialize { what: "the module catalog".into(), source })?;
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": NAME, "namespace": NAMESPACE, "labels": {"app.kubernetes.io/managed-by": "fleetwatch"}},
        "data": {"catalog.json": text},
    });
    applier.apply(&cm).await.map(|_| ())
}

/// Removes the catalog from the runtime cluster (its Runtime is being deleted).
pub async fn remove(applier: &Applier) -> Result<(), Error> {
    let r = fleetwatch_api::ResourceRef {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        namespace: Some(NAMESPACE.into()),
        name: NAME.into(),
    };
    applier.delete(&r).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::{ChannelVersion, ModuleReleaseMetaSpec, ModuleTemplateSpec};
    use std::sync::Arc;

    #[test]
    fn lists_channels_and_sorted_versions_of_the_namespace() {
        let mut meta = ModuleReleaseMeta::new(
            "redis",
            ModuleReleaseMetaSpec {
                module_name: "redis".into(),
                channels: vec![ChannelVersion { channel: "regular".into(), version: "1.10.0".into() }],
                ..Default::default()
            },
        );
        meta.metadata.namespace = Some("kcp".into());
        let tpl = |v: &str, ns: &str| {
            let mut t = ModuleTemplate::new(
                &format!("redis-{v}"),
                ModuleTemplateSpec { module_name: "redis".into(), version: v.into(), ..Default::default() },
            );
            t.metadata.namespace = Some(ns.into());
            Arc::new(t)
        };
        let mut rt = fleetwatch_api::Runtime::new("rt", Default::default());
        rt.spec.self_service =
            Some(fleetwatch_api::chosen::SelfService { modules: Some(vec!["other".into()]), ..Default::default() });
        let c =
            build(&rt, "kcp", &[Arc::new(meta)], &[tpl("1.10.0", "kcp"), tpl("1.9.0", "kcp"), tpl("3.0.0", "other")]);
        assert_eq!(c["modules"][0]["name"], "redis");
        assert_eq!(c["modules"][0]["channels"]["regular"], "1.10.0");
        assert_eq!(c["modules"][0]["versions"], json!(["1.9.0", "1.10.0"]));
        assert_eq!(c["modules"][0]["selfService"], false, "the Runtime lets its users choose `other` only");
        assert_eq!((c["channel"].as_str(), c["selfService"].as_bool()), (Some("regular"), Some(true)));
        assert_eq!(fingerprint(&c), fingerprint(&c.clone()));
    }
}
