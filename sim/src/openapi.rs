//! A minimal OpenAPI v3 document per group/version. kubectl 1.32 reads it before every
//! write to decide whether the server validates fields itself (`fieldValidation`); a
//! PATCH operation tagged with the kind and listing that query parameter is enough for
//! kubectl to leave validation to the server. Schemas are not published, so
//! `kubectl explain` does not work and client-side apply uses kubectl's compiled-in
//! strategic-merge metadata.

use std::hash::{DefaultHasher, Hash, Hasher};

use serde_json::{Map, Value, json};

use crate::resources::Registry;

fn gv_path(group: &str, version: &str) -> String {
    if group.is_empty() { format!("api/{version}") } else { format!("apis/{group}/{version}") }
}

/// `/openapi/v3/<gv path>`, or None when not served.
pub fn gv_doc(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = reg.resources(group, version);
    if defs.is_empty() {
        return None;
    }
    let mut paths = Map::new();
    for d in defs {
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
        "components": {"schemas": {}},
    }))
}

/// `/openapi/v3`: the index of group/version documents, with a hash that changes when
/// what a document would contain changes (kubectl caches by it).
pub fn root(reg: &Registry) -> Value {
    let mut paths = Map::new();
    for (g, vs) in reg.groups() {
        for v in vs {
            let Some(doc) = gv_doc(reg, g, v) else { continue };
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
        let r = Registry::with_builtins();
        let root = root(&r);
        assert!(root["paths"]["api/v1"]["serverRelativeURL"].as_str().unwrap().starts_with("/openapi/v3/api/v1?hash="));
        assert!(root["paths"]["apis/apps/v1"].is_object());
        let doc = gv_doc(&r, "apps", "v1").unwrap();
        let op = &doc["paths"]["/apis/apps/v1/namespaces/{namespace}/deployments/{name}"]["patch"];
        assert_eq!(op["x-kubernetes-group-version-kind"]["kind"], "Deployment");
    }
}
