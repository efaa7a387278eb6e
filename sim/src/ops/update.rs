//! UPDATE (PUT) and PATCH (merge, JSON, strategic, server-side apply) of the main
//! resource or of `/status`.

use std::sync::Arc;

use serde_json::{Value, json};

use super::create::finish_create;
use super::delete::remove;
use super::kinds::{prepare_kind, spec_part};
use super::{CRDS, WriteOpts, check_type, ctx, for_version, obj_key};
use crate::apply::{self};
use crate::error::ApiError;
use crate::meta::{self, finalizers, meta_mut, meta_str};
use crate::patch::{self, PatchType};
use crate::resources::ResourceDef;
use crate::store::{ObjKey, State};

/// UPDATE (PUT) of the main resource or of `/status`.
pub fn update(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    mut body: Value,
    status: bool,
    w: &WriteOpts,
) -> Result<Value, ApiError> {
    check_type(def, &mut body)?;
    let ok = obj_key(def, ns, name);
    let Some(existing) = st.get(&def.key(), &ok).cloned() else {
        return Err(ApiError::not_found(&def.group, &def.plural, name));
    };
    let body_name = meta_str(&body, "name");
    if !body_name.is_empty() && body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_rv = meta_str(&body, "resourceVersion");
    if !body_rv.is_empty() && body_rv != meta_str(&existing, "resourceVersion") {
        return Err(ApiError::conflict(&def.group, &def.plural, name));
    }
    if def.namespaced {
        let body_ns = meta_str(&body, "namespace");
        if !body_ns.is_empty() && Some(body_ns) != ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    }
    let new = if status {
        // /status changes the status stanza only.
        let mut n = (*existing).clone();
        n["status"] = body.get("status").cloned().unwrap_or(Value::Null);
        if n["status"].is_null()
            && let Some(m) = n.as_object_mut()
        {
            m.remove("status");
        }
        n
    } else {
        let mut n = body;
        {
            let m = meta_mut(&mut n);
            let old_meta = &existing["metadata"];
            for k in [
                "uid",
                "creationTimestamp",
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "generation",
                "managedFields",
                "namespace",
                "name",
            ] {
                match old_meta.get(k) {
                    Some(v) => m.insert(k.into(), v.clone()),
                    None => m.remove(k),
                };
            }
        }
        if def.has_status {
            match existing.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(m) = n.as_object_mut() {
                        m.remove("status");
                    }
                }
            }
        }
        n
    };
    write_existing(st, def, ok, existing, new, status, w, None)
}

/// Stores a modified object: generation, kind rules, field managers, no-op detection
/// and the end of a deletion once the last finalizer is gone.
#[allow(clippy::too_many_arguments)]
pub(super) fn write_existing(
    st: &mut State,
    def: &ResourceDef,
    ok: ObjKey,
    existing: Arc<Value>,
    mut new: Value,
    status: bool,
    w: &WriteOpts,
    applied: Option<Value>,
) -> Result<Value, ApiError> {
    // Finalizers cannot be added once deletion started.
    if !meta_str(&existing, "deletionTimestamp").is_empty() {
        let old_f = finalizers(&existing);
        if finalizers(&new).iter().any(|f| !old_f.contains(f)) {
            return Err(ApiError::forbidden(format!(
                "{} \"{}\" is forbidden: no new finalizers can be added if the object is being deleted",
                def.plural, ok.1
            )));
        }
    }
    crate::schema::admit(st, def, &mut new, Some(&existing), w.field_validation, &w.warnings)?;
    prepare_kind(st, def, &mut new, false)?;
    if def.tracks_generation && spec_part(&existing) != spec_part(&new) {
        let g = existing["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    let now = meta::now();
    let av = def.api_version();
    let sub = status.then_some("status");
    let c = ctx(def, w, &now, &av, sub);
    if applied.is_none() {
        apply::track_update(Some(&existing), &mut new, &c);
    }
    new["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
    if !new["apiVersion"].is_string() {
        new["apiVersion"] = json!(av);
    }
    // Kept in the version it is stored in (CRD versions, the two Event APIs).
    if new["apiVersion"] != existing["apiVersion"] {
        new = crate::convert::convert(&new, existing["apiVersion"].as_str().unwrap_or(&av));
    }
    // A write that changes nothing is not stored and does not bump the resourceVersion.
    if same_ignoring_managed_time(&existing, &new) {
        return Ok(for_version(&existing, def));
    }
    if w.dry_run {
        return Ok(new);
    }
    if !meta_str(&new, "deletionTimestamp").is_empty() && finalizers(&new).is_empty() {
        return Ok(for_version(&remove(st, &def.key(), ok, Some(Arc::new(new))), def));
    }
    if def.key() == CRDS {
        st.registry.apply_crd(&new).map_err(ApiError::bad_request)?;
    }
    let stored = st.commit(&def.key(), ok, Some(new), None);
    Ok(for_version(&stored, def))
}

/// Equality that ignores the time stamps of managedFields entries.
fn same_ignoring_managed_time(a: &Value, b: &Value) -> bool {
    let strip = |v: &Value| {
        let mut v = v.clone();
        if let Some(list) = v["metadata"].get_mut("managedFields").and_then(Value::as_array_mut) {
            for e in list {
                if let Some(m) = e.as_object_mut() {
                    m.remove("time");
                }
            }
        }
        v
    };
    strip(a) == strip(b)
}

/// PATCH (merge, JSON, strategic, or server-side apply) of the main resource or `/status`.
/// Returns the object and whether apply created it.
#[allow(clippy::too_many_arguments)]
pub fn patch(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    kind: PatchType,
    body: Value,
    status: bool,
    w: &WriteOpts,
) -> Result<(Value, bool), ApiError> {
    let ok = obj_key(def, ns, name);
    let existing = st.get(&def.key(), &ok).cloned();
    if kind == PatchType::Apply {
        return server_side_apply(st, def, ns, name, body, status, w, existing);
    }
    let Some(existing) = existing else {
        return Err(ApiError::not_found(&def.group, &def.plural, name));
    };
    let current = for_version(&existing, def);
    let mut patched = patch::apply_patch(&current, &body, kind, def.strategic)?;
    // A resourceVersion in the patch is a precondition, like in an update.
    if kind != PatchType::Json {
        let prv = body["metadata"]["resourceVersion"].as_str().unwrap_or("");
        if !prv.is_empty() && prv != meta_str(&existing, "resourceVersion") {
            return Err(ApiError::conflict(&def.group, &def.plural, name));
        }
    }
    if meta_str(&patched, "name") != name {
        return Err(ApiError::bad_request("metadata.name cannot be changed by a patch"));
    }
    patched["metadata"]["resourceVersion"] = existing["metadata"]["resourceVersion"].clone();
    Ok((update(st, def, ns, name, patched, status, w)?, false))
}

#[allow(clippy::too_many_arguments)]
fn server_side_apply(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    mut body: Value,
    status: bool,
    w: &WriteOpts,
    existing: Option<Arc<Value>>,
) -> Result<(Value, bool), ApiError> {
    if w.manager.is_empty() {
        return Err(ApiError::bad_request(
            "PatchOptions.meta.k8s.io \"\" is invalid: fieldManager: Required value: is required for apply patch",
        ));
    }
    check_type(def, &mut body)?;
    let body_name = meta_str(&body, "name");
    if body_name.is_empty() {
        meta_mut(&mut body).insert("name".into(), json!(name));
    } else if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let Some(existing) = existing else {
        if status {
            return Err(ApiError::not_found(&def.group, &def.plural, name));
        }
        let applied = body.clone();
        let created = finish_create(st, def, ns, body, w, Some(&applied))?;
        return Ok((created, true));
    };
    let now = meta::now();
    let av = def.api_version();
    let sub = status.then_some("status");
    let c = ctx(def, w, &now, &av, sub);
    let mut applied = body;
    if status {
        // Only the status stanza of an apply to /status counts.
        applied = json!({"apiVersion": applied["apiVersion"], "kind": applied["kind"], "metadata": {"name": name}, "status": applied["status"]});
    } else if def.has_status
        && let Some(m) = applied.as_object_mut()
    {
        m.remove("status");
    }
    let mut new = apply::apply(Some(&existing), &applied, w.force, &c)?;
    for k in ["uid", "creationTimestamp", "deletionTimestamp", "generation", "resourceVersion", "name", "namespace"] {
        if let Some(v) = existing["metadata"].get(k) {
            new["metadata"][k] = v.clone();
        }
    }
    Ok((write_existing(st, def, obj_key(def, ns, name), existing, new, status, w, Some(applied))?, false))
}
