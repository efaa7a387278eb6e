//! A minimal OpenAPI v3 document per group/version. kubectl 1.32 reads it before every
//! write to decide whether the server validates fields itself (`fieldValidation`); a
//! PATCH operation tagged with the kind and listing that query parameter is enough for
//! kubectl to leave validation to the server. Custom resources are published with their
//! CRD's `openAPIV3Schema` (descriptions included) under `components.schemas`, tagged
//! with `x-kubernetes-group-version-kind`, which is what `kubectl explain` looks for;
//! built-in kinds have no schema here, so `kubectl explain` works for CRDs only and
//! client-side apply uses kubectl's compiled-in strategic-merge metadata.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::ops::CRDS;
use crate::resources::{Registry, ResourceDef};
use crate::schema;
use crate::store::State;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// The component name kube-apiserver gives a kind: the group reversed, then version and
/// kind (`fleetwatch.io`, `v1`, `Runtime` → `io.fleetwatch.v1.Runtime`).
fn component_name(group: &str, version: &str, kind: &str) -> String {
    let mut parts: Vec<&str> = group.split('.').filter(|p| !p.is_empty()).collect();
    parts.reverse();
    parts.push(version);
    parts.push(kind);
    parts.join(".")
}

const OBJECT_META: &str = "io.k8s.apimachinery.pkg.apis.meta.v1.ObjectMeta";

/// The schemas a custom resource publishes: the kind (the CRD's schema plus the standard
/// apiVersion/kind/metadata fields) and its list.
fn crd_components(st: &State, d: &ResourceDef, out: &mut Map<String, Value>) {
    let Some(crd) = st.get(CRDS, &(String::new(), format!("{}.{}", d.plural, d.group))) else { return };
    let mut s = schema::version_schema(crd, &d.version).cloned().unwrap_or_else(|| json!({"type": "object"}));
    let gvk = json!([{"group": d.group, "version": d.version, "kind": d.kind}]);
    let props = s.as_object_mut().map(|m| m.entry("properties").or_insert_with(|| json!({})));
    if let Some(Value::Object(p)) = props {
        p.insert("apiVersion".into(), json!({"type": "string", "description": API_VERSION_DOC}));
        p.insert("kind".into(), json!({"type": "string", "description": KIND_DOC}));
        p.insert(
            "metadata".into(),
            json!({"allOf": [{"$ref": format!("#/components/schemas/{OBJECT_META}")}], "description": METADATA_DOC}),
        );
    }
    s["x-kubernetes-group-version-kind"] = gvk;
    let name = component_name(&d.group, &d.version, &d.kind);
    out.insert(
        format!("{name}List"),
        json!({
            "type": "object",
            "description": format!("{}List is a list of {}", d.kind, d.kind),
            "required": ["items"],
            "properties": {
                "apiVersion": {"type": "string", "description": API_VERSION_DOC},
                "kind": {"type": "string", "description": KIND_DOC},
                "items": {"type": "array", "description": format!("List of {}.", d.plural), "items": {"$ref": format!("#/components/schemas/{name}")}},
                "metadata": {"type": "object", "description": "Standard list metadata."},
            },
            "x-kubernetes-group-version-kind": [{"group": d.group, "version": d.version, "kind": format!("{}List", d.kind)}],
        }),
    );
    out.insert(name, s);
    out.entry(OBJECT_META).or_insert_with(object_meta);
}

const API_VERSION_DOC: &str = "APIVersion defines the versioned schema of this representation of an object. Servers should convert recognized schemas to the latest internal value, and may reject unrecognized values. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#resources";
const KIND_DOC: &str = "Kind is a string value representing the REST resource this object represents. Servers may infer this from the endpoint the client submits requests to. Cannot be updated. In CamelCase. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#types-kinds";
const METADATA_DOC: &str = "Standard object's metadata. More info: https://git.k8s.io/community/contributors/devel/sig-architecture/api-conventions.md#metadata";

/// ObjectMeta, abridged to the fields users set or read.
fn object_meta() -> Value {
    let s = |d: &str| json!({"type": "string", "description": d});
    json!({
        "type": "object",
        "description": "ObjectMeta is metadata that all persisted resources must have, which includes all objects users must create.",
        "properties": {
            "name": s("Name must be unique within a namespace. Cannot be updated."),
            "generateName": s("GenerateName is an optional prefix, used by the server, to generate a unique name ONLY IF the Name field has not been provided."),
            "namespace": s("Namespace defines the space within which each name must be unique. Cannot be updated."),
            "uid": s("UID is the unique in time and space value for this object. Populated by the system. Read-only."),
            "resourceVersion": s("An opaque value that represents the internal version of this object. Populated by the system. Read-only."),
            "generation": {"type": "integer", "format": "int64", "description": "A sequence number representing a specific generation of the desired state. Populated by the system. Read-only."},
            "creationTimestamp": {"type": "string", "format": "date-time", "description": "CreationTimestamp is a timestamp representing the server time when this object was created. Populated by the system. Read-only."},
            "deletionTimestamp": {"type": "string", "format": "date-time", "description": "DeletionTimestamp is RFC 3339 date and time at which this resource will be deleted. Populated by the system when a graceful deletion is requested. Read-only."},
            "labels": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Map of string keys and values that can be used to organize and categorize (scope and select) objects."},
            "annotations": {"type": "object", "additionalProperties": {"type": "string"}, "description": "Annotations is an unstructured key value map stored with a resource that may be set by external tools to store and retrieve arbitrary metadata."},
            "finalizers": {"type": "array", "items": {"type": "string"}, "description": "Must be empty before the object is deleted from the registry."},
            "ownerReferences": {"type": "array", "items": {"type": "object"}, "description": "List of objects depended by this object."},
            "managedFields": {"type": "array", "items": {"type": "object"}, "description": "ManagedFields maps workflow-id and version to the set of fields that are managed by that workflow."},
        },
    })
}

/// `/openapi/v3/<gv path>`, or None when not served.
pub fn gv_doc(st: &State, group: &str, version: &str) -> Option<Value> {
    let reg = &st.registry;
    let defs = reg.resources(group, version);
    if defs.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for d in defs {
        if d.from_crd {
            crd_components(st, d, &mut schemas);
        }
        let base = if d.namespaced {
            format!("/{}/namespaces/{{namespace}}/{}/{{name}}", gv_path(group, version), d.plural)
        } else {
            format!("/{}/{}/{{name}}", gv_path(group, version), d.plural)
        };
        paths.insert(
            base,
            json!({
                "patch": {
                    "x-kubernetes-group-version-kind": {"group": d.group, "version": d.version, "kind": d.kind},
                    "x-kubernetes-action": "patch",
                    "parameters": [
                        {"name": "fieldValidation", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "fieldManager", "in": "query", "schema": {"type": "string", "uniqueItems": true}},
                        {"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}},
                    ],
                    "responses": {"200": {"description": "OK"}},
                }
            }),
        );
    }
    Some(json!({
        "openapi": "3.0.0",
        "info": {"title": "Kubernetes", "version": "v1.32.0"},
        "paths": paths,
        "components": {"schemas": schemas},
    }))
}

/// `/openapi/v3`: the index of group/version documents, with a hash that changes when
/// what a document would contain changes (kubectl caches by it).
pub fn root(st: &State) -> Value {
    let reg: &Registry = &st.registry;
    let mut paths = Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let Some(doc) = gv_doc(st, g, v) else { continue };
            let mut h = DefaultHasher::new();
            doc.to_string().hash(&mut h);
            let p = gv_path(g, v);
            paths.insert(p.clone(), json!({"serverRelativeURL": format!("/openapi/v3/{p}?hash={:016X}", h.finish())}));
        }
    }
    json!({"paths": paths})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_lists_every_group_version() {
        let st = State::new(10);
        let r = &st.registry;
        let root = root(&st);
        assert!(root["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap().starts_with("/openapi/v3/api/v1?hash="));
        assert!(root["paths"]["apis/apps/v1"].is_object());
        assert!(r.get("apps", "v1", "deployments").is_some());
        let doc = gv_doc(&st, "apps", "v1").unwrap();
        let op = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "Deployment");
    }

    #[test]
    fn crd_schemas_are_published_for_explain() {
        use crate::ops::{self, WriteOpts};
        let mut st = State::new(10);
        let crd_def = st.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").unwrap().clone();
        let crd = json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "runtimes.fleetwatch.io"},
            "spec": {"group": "fleetwatch.io", "scope": "Namespaced", "names": {"plural": "runtimes", "kind": "Runtime"},
                "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                    "type": "object", "description": "A runtime.",
                    "properties": {"spec": {"type": "object", "description": "What is wanted.",
                        "properties": {"mode": {"type": "string", "description": "How."}}}}}}}]}});
        ops::create(&mut st, &crd_def, None, crd, &WriteOpts::default()).unwrap();
        assert_eq!(component_name("fleetwatch.io", "v1", "Runtime"), "io.fleetwatch.v1.Runtime");
        let doc = gv_doc(&st, "fleetwatch.io", "v1").unwrap();
        let s = &doc["components"]["schemas"]["io.fleetwatch.v1.Runtime"];
        assert_eq!(s["x-kubernetes-group-version-kind"][0]["kind"], "Runtime");
        assert_eq!(s["properties"]["spec"]["properties"]["mode"]["description"], "How.");
        assert!(s["properties"]["metadata"]["allOf"][0]["$ref"].as_str().unwrap().ends_with(OBJECT_META));
        assert!(doc["components"]["schemas"][OBJECT_META].is_object());
        assert!(root(&st)["paths"]["apis/fleetwatch.io/v1"].is_object());
    }
}
