//! The `/scale` subresource (autoscaling/v1 `Scale`) of Deployments, StatefulSets,
//! ReplicaSets and custom resources that declare `subresources.scale`: reads build a
//! `Scale` from the object's replica and selector fields, writes (PUT, or a patch applied
//! to the `Scale`) change only the object's spec replicas, through the ordinary update.

use serde_json::{Map, Value, json};

use super::{WriteOpts, for_version, obj_key, update};
use crate::error::ApiError;
use crate::meta::meta_str;
use crate::patch::{self, PatchType};
use crate::resources::{ResourceDef, ScalePaths};
use crate::store::State;

fn paths(def: &ResourceDef) -> Result<&ScalePaths, ApiError> {
    def.scale.as_ref().ok_or_else(|| ApiError::no_route(&format!("{}/scale", def.plural)))
}

fn at<'a>(o: &'a Value, path: &str) -> &'a Value {
    path.split('.').fold(o, |v, k| &v[k])
}

fn set(o: &mut Value, path: &str, v: Value) {
    let mut cur = o;
    let keys: Vec<&str> = path.split('.').collect();
    for (i, k) in keys.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        if i + 1 == keys.len() {
            cur[*k] = v;
            return;
        }
        cur = &mut cur[*k];
    }
}

/// A label selector object as a selector string (`metav1.LabelSelectorAsSelector`).
fn selector_string(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        reqs.extend(m.iter().map(|(k, v)| (k.clone(), format!("{k}={}", v.as_str().unwrap_or("")))));
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let k = e["key"].as_str().unwrap_or("").to_string();
        let mut vals: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        vals.sort();
        let s = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{k} in ({})", vals.join(",")),
            "NotIn" => format!("{k} notin ({})", vals.join(",")),
            "DoesNotExist" => format!("!{k}"),
            _ => k.clone(),
        };
        reqs.push((k, s));
    }
    reqs.sort();
    reqs.into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(",")
}

/// The `Scale` of an object.
pub fn scale_of(def: &ResourceDef, obj: &Value) -> Result<Value, ApiError> {
    let p = paths(def)?;
    let mut status = json!({"replicas": at(obj, &p.status_replicas).as_i64().unwrap_or(0)});
    if !p.label_selector.is_empty() {
        let sel = at(obj, &p.label_selector);
        // Built-in kinds keep a LabelSelector object, custom resources a string.
        let s = if sel.is_object() { selector_string(sel) } else { sel.as_str().unwrap_or("").to_string() };
        if !s.is_empty() {
            status["selector"] = json!(s);
        }
    }
    let m = &obj["metadata"];
    let mut meta = json!({"name": m["name"], "uid": m["uid"], "resourceVersion": m["resourceVersion"],
        "creationTimestamp": m["creationTimestamp"]});
    if m["namespace"].is_string() {
        meta["namespace"] = m["namespace"].clone();
    }
    Ok(json!({
        "kind": "Scale",
        "apiVersion": "autoscaling/v1",
        "metadata": meta,
        "spec": {"replicas": at(obj, &p.spec_replicas).as_i64().unwrap_or(0)},
        "status": status,
    }))
}

/// GET `/scale`.
pub fn get_scale(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
    let o = st
        .get(&def.key(), &obj_key(def, ns, name))
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    scale_of(def, &for_version(o, def))
}

/// PUT `/scale`: sets the object's replicas from a `Scale` (its resourceVersion, when
/// given, is a precondition).
pub fn update_scale(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    scale: &Value,
    w: &WriteOpts,
) -> Result<Value, ApiError> {
    let p = paths(def)?.clone();
    if !scale["kind"].is_null() && scale["kind"] != "Scale" {
        return Err(ApiError::bad_request(format!("the body is a {}, not a Scale", scale["kind"])));
    }
    let replicas = match &scale["spec"]["replicas"] {
        Value::Null => 0,
        v => v.as_i64().ok_or_else(|| invalid(name, format!("Invalid value: {v}: must be an integer")))?,
    };
    if replicas < 0 {
        return Err(invalid(name, format!("Invalid value: {replicas}: must be greater than or equal to 0")));
    }
    if replicas > i64::from(i32::MAX) {
        return Err(invalid(name, format!("Invalid value: {replicas}: must be less than or equal to 2147483647")));
    }
    let existing = st
        .get(&def.key(), &obj_key(def, ns, name))
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    let mut new = for_version(existing, def);
    let rv = meta_str(scale, "resourceVersion");
    if !rv.is_empty() {
        new["metadata"]["resourceVersion"] = json!(rv);
    }
    set(&mut new, &p.spec_replicas, json!(replicas));
    let updated = update(st, def, ns, name, new, false, w)?;
    scale_of(def, &updated)
}

fn invalid(name: &str, msg: String) -> ApiError {
    ApiError::invalid("Scale", "autoscaling", name, &[("spec.replicas", msg)])
}

/// PATCH `/scale`: the patch applies to the `Scale` (strategic merge as for a built-in
/// kind), then as PUT.
#[allow(clippy::too_many_arguments)]
pub fn patch_scale(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    kind: PatchType,
    body: &Value,
    w: &WriteOpts,
) -> Result<Value, ApiError> {
    if kind == PatchType::Apply {
        return Err(ApiError::unsupported_media_type("application/apply-patch+yaml (on /scale)"));
    }
    let current = get_scale(st, def, ns, name)?;
    let patched = patch::apply_patch(&current, body, kind, true)?;
    update_scale(st, def, ns, name, &patched, w)
}
