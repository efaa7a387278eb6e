//! Declares, on a module's manager workload, the kinds the module provides (the CRDs in its
//! manifest), as the annotation `operator.fleetwatch.dev/provides`. The agent reads it
//! with the inventory: a watch whose kind is absent fails (`kind-not-found`) only while a
//! module declaring the kind is installed; otherwise it is waiting for the kind, which is
//! healthy (the module was removed, or its CRD is not there yet).

use std::borrow::Cow;

use fleetwatch_api::ResourceRef;
use fleetwatch_protocol::provides::{PROVIDES_ANNOTATION, format_provides, parse_provides};
use serde_json::Value;

/// The (group, kind) of each CustomResourceDefinition in `manifest`.
pub fn crd_kinds(manifest: &[Value]) -> Vec<(String, String)> {
    manifest
        .iter()
        .filter(|o| o["kind"] == "CustomResourceDefinition" && o["apiVersion"].as_str().is_some_and(is_crd_api))
        .filter_map(|o| {
            let group = o["spec"]["group"].as_str()?;
            let kind = o["spec"]["names"]["kind"].as_str()?;
            Some((group.to_string(), kind.to_string()))
        })
        .collect()
}

fn is_crd_api(api_version: &str) -> bool {
    api_version.starts_with("apiextensions.k8s.io/")
}

/// The manifest to apply: the template's, with the manager workload annotated with the
/// kinds of the manifest's CRDs (merged with what the module itself declares there).
/// Borrowed unchanged when the manifest has no CRD or no manager object.
#[cfg(test)]
pub fn annotated_manifest(spec: &fleetwatch_api::ModuleTemplateSpec) -> Cow<'_, [Value]> {
    annotated(&spec.manifest, &spec.manager)
}

/// [`annotated_manifest`] of objects from anywhere (a template's, an artifact's) and their
/// manager.
pub fn annotated<'a>(manifest: &'a [Value], m: &ResourceRef) -> Cow<'a, [Value]> {
    let kinds = crd_kinds(manifest);
    if kinds.is_empty() {
        return Cow::Borrowed(manifest);
    }
    let is_manager = |o: &Value| {
        o["kind"].as_str() == Some(m.kind.as_str())
            && o["apiVersion"].as_str() == Some(m.api_version.as_str())
            && o["metadata"]["name"].as_str() == Some(m.name.as_str())
            && o["metadata"]["namespace"].as_str() == m.namespace.as_deref()
    };
    let Some(i) = manifest.iter().position(is_manager) else {
        return Cow::Borrowed(manifest);
    };
    let mut out = manifest.to_vec();
    let obj = &mut out[i];
    let own = obj["metadata"]["annotations"][PROVIDES_ANNOTATION].as_str().map(parse_provides).unwrap_or_default();
    let all: Vec<(String, String)> = kinds.into_iter().chain(own).collect();
    let value = format_provides(all.iter().map(|(g, k)| (g.as_str(), k.as_str())));
    if let Some(md) = obj.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = md.entry("annotations").or_insert_with(|| Value::Object(Default::default()));
        if !annotations.is_object() {
            *annotations = Value::Object(Default::default());
        }
        annotations[PROVIDES_ANNOTATION] = Value::String(value);
    }
    Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::ModuleTemplateSpec;
    use serde_json::json;

    fn spec(manifest: Vec<Value>) -> ModuleTemplateSpec {
        ModuleTemplateSpec {
            module_name: "redis".into(),
            version: "1.0.0".into(),
            manifest,
            manager: ResourceRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some("redis-system".into()),
                name: "redis-manager".into(),
            },
            ..Default::default()
        }
    }

    fn crd(group: &str, kind: &str) -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
               "metadata": {"name": "x"}, "spec": {"group": group, "names": {"kind": kind}}})
    }

    fn manager(annotations: Option<Value>) -> Value {
        let mut d = json!({"apiVersion": "apps/v1", "kind": "Deployment",
                           "metadata": {"name": "redis-manager", "namespace": "redis-system"}});
        if let Some(a) = annotations {
            d["metadata"]["annotations"] = a;
        }
        d
    }

    #[test]
    fn the_manager_declares_the_manifests_crds() {
        let s = spec(vec![crd("modules.example.com", "RedisConfig"), manager(None), crd("b.io", "B")]);
        let out = annotated_manifest(&s);
        assert_eq!(out[1]["metadata"]["annotations"][PROVIDES_ANNOTATION], "B.b.io,RedisConfig.modules.example.com");
        assert_eq!(out[0], s.manifest[0]);
    }

    #[test]
    fn the_modules_own_declaration_is_kept() {
        let s = spec(vec![
            crd("modules.example.com", "RedisConfig"),
            manager(Some(json!({PROVIDES_ANNOTATION: "Extra.x.io", "other": "1"}))),
        ]);
        let out = annotated_manifest(&s);
        assert_eq!(
            out[1]["metadata"]["annotations"][PROVIDES_ANNOTATION],
            "Extra.x.io,RedisConfig.modules.example.com"
        );
        assert_eq!(out[1]["metadata"]["annotations"]["other"], "1");
    }

    #[test]
    fn without_crds_or_manager_the_manifest_is_unchanged() {
        let s = spec(vec![manager(None)]);
        assert!(matches!(annotated_manifest(&s), Cow::Borrowed(_)));
        let mut s = spec(vec![crd("a.io", "A"), manager(None)]);
        s.manager.name = "elsewhere".into();
        assert!(matches!(annotated_manifest(&s), Cow::Borrowed(_)));
    }
}
