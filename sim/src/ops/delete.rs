//! DELETE of one object and of a collection, finalizers, propagation policies and the
//! bookkeeping of dependents (orphaning, the GC's "has dependents" check).

use std::sync::Arc;

use serde_json::{Value, json};

use super::{CRDS, DeleteOpts, NAMESPACES, for_version, list, obj_key};
use crate::error::ApiError;
use crate::meta::{self, finalizers, meta_mut, meta_str};
use crate::resources::{ResourceDef, res_key};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, State};

/// Removes an object for good (no finalizers left) and everything that depends on the
/// resource when it is a CRD.
pub fn remove(st: &mut State, key: &str, ok: ObjKey, last: Option<Arc<Value>>) -> Arc<Value> {
    let removed = st.commit(key, ok, None, last);
    if key == CRDS {
        let group = removed["spec"]["group"].as_str().unwrap_or("").to_string();
        let plural = removed["spec"]["names"]["plural"].as_str().unwrap_or("").to_string();
        let rk = res_key(&group, &plural);
        let keys: Vec<ObjKey> = st.all(&rk).map(|(k, _)| k.clone()).collect();
        for k in keys {
            st.commit(&rk, k, None, None);
        }
        st.drop_resource(&rk);
        st.drop_watches(Some(&rk));
        st.registry.remove_resource(&group, &plural);
    }
    removed
}

/// DELETE of one object. With finalizers the object only gets a deletionTimestamp.
pub fn delete(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    name: &str,
    d: &DeleteOpts,
) -> Result<Value, ApiError> {
    let ok = obj_key(def, ns, name);
    let Some(existing) = st.get(&def.key(), &ok).cloned() else {
        return Err(ApiError::not_found(&def.group, &def.plural, name));
    };
    if d.precondition_uid.as_deref().is_some_and(|u| u != meta_str(&existing, "uid")) {
        return Err(ApiError::conflict(&def.group, &def.plural, name));
    }
    if d.precondition_rv.as_deref().is_some_and(|r| r != meta_str(&existing, "resourceVersion")) {
        return Err(ApiError::conflict(&def.group, &def.plural, name));
    }
    if d.dry_run {
        return Ok(for_version(&existing, def));
    }
    let uid = meta_str(&existing, "uid").to_string();
    let mut extra_finalizer = None;
    match d.propagation.as_deref() {
        Some("Orphan") => orphan_dependents(st, &uid),
        Some("Foreground") if has_dependents(st, &uid) => extra_finalizer = Some("foregroundDeletion"),
        _ => {}
    }
    let is_namespace = def.key() == NAMESPACES;
    let mut fins = finalizers(&existing);
    if let Some(f) = extra_finalizer
        && !fins.iter().any(|x| x == f)
    {
        fins.push(f.to_string());
    }
    if fins.is_empty() && !is_namespace {
        return Ok(for_version(&remove(st, &def.key(), ok, None), def));
    }
    if !meta_str(&existing, "deletionTimestamp").is_empty() && extra_finalizer.is_none() {
        return Ok(for_version(&existing, def));
    }
    let mut new = (*existing).clone();
    {
        let m = meta_mut(&mut new);
        if !m.contains_key("deletionTimestamp") {
            m.insert("deletionTimestamp".into(), json!(meta::now()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
        }
        if !fins.is_empty() {
            m.insert("finalizers".into(), json!(fins));
        }
    }
    if is_namespace {
        new["status"]["phase"] = json!("Terminating");
    }
    if def.tracks_generation {
        let g = existing["metadata"]["generation"].as_i64().unwrap_or(0) + 1;
        new["metadata"]["generation"] = json!(g);
    }
    let stored = st.commit(&def.key(), ok, Some(new), None);
    Ok(for_version(&stored, def))
}

/// DELETE on a collection: deletes every matching object, answers the list of them.
pub fn delete_collection(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    d: &DeleteOpts,
) -> Result<Vec<Value>, ApiError> {
    let page = list(st, def, ns, labels, fields, None, None)?;
    let mut out = Vec::new();
    for item in page.items {
        let name = meta_str(&item.obj, "name").to_string();
        let item_ns = meta_str(&item.obj, "namespace").to_string();
        match delete(st, def, Some(&item_ns), &name, d) {
            Ok(v) => out.push(v),
            Err(e) if e.code == 404 => {}
            Err(e) => return Err(e),
        }
    }
    Ok(out)
}

/// Whether any object names `uid` as an owner.
pub fn has_dependents(st: &State, uid: &str) -> bool {
    st.objects.values().flat_map(|m| m.values()).any(|o| meta::owner_uids(o).iter().any(|u| u == uid))
}

/// Removes ownerReferences to `uid` from every dependent (propagationPolicy=Orphan).
pub(super) fn orphan_dependents(st: &mut State, uid: &str) {
    let mut targets = Vec::new();
    for (key, map) in &st.objects {
        for (ok, o) in map {
            if meta::owner_uids(o).iter().any(|u| u == uid) {
                targets.push((key.clone(), ok.clone(), o.clone()));
            }
        }
    }
    for (key, ok, o) in targets {
        let mut n = (*o).clone();
        if let Some(refs) = n["metadata"]["ownerReferences"].as_array_mut() {
            refs.retain(|r| r["uid"].as_str() != Some(uid));
        }
        st.commit(&key, ok, Some(n), None);
    }
}
