//! PATCH bodies other than server-side apply: JSON merge patch (RFC 7386) and JSON patch
//! (RFC 6902) through the `json-patch` crate, and strategic merge patch for built-in kinds:
//! maps merge like a merge patch, lists with a known merge key (containers by name, …)
//! merge element-wise, and the `$patch` / `$retainKeys` / `$setElementOrder` /
//! `$deleteFromPrimitiveList` directives kubectl sends are honoured or stripped.

use serde_json::{Map, Value};

use crate::error::ApiError;

/// The patch formats PATCH accepts, chosen by `Content-Type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/json-patch+json`
    Json,
    /// `application/merge-patch+json`
    Merge,
    /// `application/strategic-merge-patch+json`
    Strategic,
    /// `application/apply-patch+yaml` (server-side apply)
    Apply,
}

impl PatchType {
    /// Maps a `Content-Type` header to a patch type.
    pub fn from_content_type(ct: &str) -> Result<Self, ApiError> {
        let base = ct.split(';').next().unwrap_or("").trim();
        match base {
            "application/json-patch+json" => Ok(PatchType::Json),
            "application/merge-patch+json" => Ok(PatchType::Merge),
            "application/strategic-merge-patch+json" => Ok(PatchType::Strategic),
            "application/apply-patch+yaml" | "application/apply-patch+json" | "application/apply-patch+cbor" => {
                Ok(PatchType::Apply)
            }
            _ => Err(ApiError::unsupported_media_type(ct)),
        }
    }
}

/// Applies a JSON merge patch, JSON patch or strategic merge patch to `target`.
pub fn apply_patch(target: &Value, patch: &Value, kind: PatchType, strategic_ok: bool) -> Result<Value, ApiError> {
    let mut out = target.clone();
    match kind {
        PatchType::Merge => json_patch::merge(&mut out, patch),
        PatchType::Json => {
            let p: json_patch::Patch = serde_json::from_value(patch.clone()).map_err(|e| {
                ApiError::bad_request(format!("the server rejected our request due to an error in our request: {e}"))
            })?;
            // As the API server's JSON patch library does, a `test` for `null` passes when the
            // member is absent (its parent exists); kube-runtime's finalizer helper relies on it.
            for op in p.0 {
                if let json_patch::PatchOperation::Test(t) = &op
                    && t.value.is_null()
                    && out.pointer(t.path.as_str()).is_none()
                    && t.path.parent().is_some_and(|parent| out.pointer(parent.as_str()).is_some_and(Value::is_object))
                {
                    continue;
                }
                json_patch::patch(&mut out, &[op]).map_err(|e| ApiError::invalid_patch(&e.to_string()))?;
            }
        }
        PatchType::Strategic => {
            if !strategic_ok {
                return Err(ApiError::unsupported_media_type(
                    "application/strategic-merge-patch+json is not supported for custom resources",
                ));
            }
            if !patch.is_object() {
                return Err(ApiError::bad_request("strategic merge patch must be a JSON object"));
            }
            strategic_merge(&mut out, patch, "");
        }
        PatchType::Apply => return Err(ApiError::internal("apply is not a plain patch")),
    }
    Ok(out)
}

impl ApiError {
    /// `422 Invalid` for a JSON patch whose operations do not apply (e.g. a failed `test`).
    pub fn invalid_patch(msg: &str) -> Self {
        ApiError {
            code: 422,
            reason: "Invalid",
            message: format!("the server rejected our request due to an error in our request: {msg}"),
            details: None,
        }
    }
}

/// The merge key of a list field of a built-in kind, from the Kubernetes API's
/// `patchMergeKey` tags (the subset fleetwatch and its users touch).
fn merge_key(field: &str, sample: Option<&Value>) -> Option<&'static str> {
    match field {
        "containers"
        | "initContainers"
        | "ephemeralContainers"
        | "volumes"
        | "env"
        | "volumeMounts"
        | "imagePullSecrets"
        | "volumeDevices" => Some("name"),
        "ports" => {
            Some(if sample.is_some_and(|s| s.get("containerPort").is_some()) { "containerPort" } else { "port" })
        }
        "conditions" => Some("type"),
        "ownerReferences" => Some("uid"),
        "finalizers" => Some(""), // list of scalars merged as a set
        _ => None,
    }
}

/// Strategic merge of `patch` into `target` (both JSON objects at the top).
pub fn strategic_merge(target: &mut Value, patch: &Value, field: &str) {
    let Some(pmap) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if pmap.get("$patch").and_then(Value::as_str) == Some("replace") {
        let mut clean = pmap.clone();
        clean.remove("$patch");
        *target = Value::Object(clean);
        return;
    }
    if !target.is_object() {
        *target = Value::Object(Map::new());
    }
    let Some(tmap) = target.as_object_mut() else { return };
    for (k, v) in pmap {
        if k == "$patch" || k == "$retainKeys" || k.starts_with("$setElementOrder/") {
            continue;
        }
        if let Some(list_field) = k.strip_prefix("$deleteFromPrimitiveList/") {
            if let (Some(Value::Array(items)), Some(del)) = (tmap.get_mut(list_field), v.as_array()) {
                items.retain(|i| !del.contains(i));
            }
            continue;
        }
        match v {
            Value::Null => {
                tmap.remove(k);
            }
            Value::Object(o) if o.get("$patch").and_then(Value::as_str) == Some("delete") => {
                tmap.remove(k);
            }
            Value::Object(_) => strategic_merge(tmap.entry(k.clone()).or_insert(Value::Null), v, k),
            Value::Array(items) => {
                let existing = tmap.get_mut(k);
                match (merge_key(k, items.first()), existing) {
                    (Some(key), Some(Value::Array(cur))) => merge_list(cur, items, key),
                    _ => {
                        let cleaned: Vec<Value> = items.iter().filter(|i| i.get("$patch").is_none()).cloned().collect();
                        tmap.insert(k.clone(), Value::Array(cleaned));
                    }
                }
            }
            _ => {
                tmap.insert(k.clone(), v.clone());
            }
        }
    }
    if let Some(Value::Array(keep)) = pmap.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        tmap.retain(|k, _| keep.contains(&k.as_str()));
    }
    let _ = field;
}

fn merge_list(cur: &mut Vec<Value>, patch: &[Value], key: &str) {
    if key.is_empty() {
        for p in patch {
            if !cur.contains(p) {
                cur.push(p.clone());
            }
        }
        return;
    }
    for p in patch {
        let Some(kv) = p.get(key) else {
            cur.push(p.clone());
            continue;
        };
        let pos = cur.iter().position(|c| c.get(key) == Some(kv));
        let delete = p.get("$patch").and_then(Value::as_str) == Some("delete");
        match (pos, delete) {
            (Some(i), true) => {
                cur.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => strategic_merge(&mut cur[i], p, key),
            (None, false) => {
                let mut item = Value::Null;
                strategic_merge(&mut item, p, key);
                cur.push(item);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn merge_patch_removes_nulls() {
        let out =
            apply_patch(&json!({"a": 1, "b": {"c": 2}}), &json!({"a": null, "b": {"d": 3}}), PatchType::Merge, true)
                .unwrap();
        assert_eq!(out, json!({"b": {"c": 2, "d": 3}}));
    }

    #[test]
    fn json_patch_test_failure_is_422() {
        let e =
            apply_patch(&json!({"a": 1}), &json!([{"op": "test", "path": "/a", "value": 2}]), PatchType::Json, true)
                .unwrap_err();
        assert_eq!(e.code, 422);
        let ok =
            apply_patch(&json!({"a": 1}), &json!([{"op": "replace", "path": "/a", "value": 2}]), PatchType::Json, true)
                .unwrap();
        assert_eq!(ok, json!({"a": 2}));
    }

    #[test]
    fn json_patch_test_for_null_passes_on_an_absent_member() {
        let patch = json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                           {"op": "add", "path": "/metadata/finalizers", "value": ["f"]}]);
        let out = apply_patch(&json!({"metadata": {"name": "x"}}), &patch, PatchType::Json, true).unwrap();
        assert_eq!(out, json!({"metadata": {"name": "x", "finalizers": ["f"]}}));
        let e = apply_patch(&json!({"metadata": {"finalizers": ["g"]}}), &patch, PatchType::Json, true).unwrap_err();
        assert_eq!(e.code, 422, "a present member is not null");
    }

    #[test]
    fn strategic_merges_containers_by_name() {
        let cur = json!({"spec": {"containers": [{"name": "a", "image": "x:1"}, {"name": "b", "image": "y:1"}]}});
        let p = json!({"spec": {"$setElementOrder/containers": [{"name": "a"}, {"name": "b"}],
            "containers": [{"name": "b", "image": "y:2"}, {"name": "a", "$patch": "delete"}]}});
        let out = apply_patch(&cur, &p, PatchType::Strategic, true).unwrap();
        assert_eq!(out, json!({"spec": {"containers": [{"name": "b", "image": "y:2"}]}}));
    }

    #[test]
    fn strategic_is_refused_for_custom_resources() {
        assert_eq!(apply_patch(&json!({}), &json!({}), PatchType::Strategic, false).unwrap_err().code, 415);
    }

    #[test]
    fn content_types() {
        assert_eq!(
            PatchType::from_content_type("application/merge-patch+json; charset=utf-8").unwrap(),
            PatchType::Merge
        );
        assert_eq!(PatchType::from_content_type("text/plain").unwrap_err().code, 415);
    }
}
