//! Object semantics of the write verbs: create, update (main resource and `/status`),
//! patch, server-side apply, delete and deletecollection, with the metadata rules of
//! kube-apiserver (uid, creationTimestamp, generation, optimistic concurrency,
//! finalizers and deletionTimestamp, namespaces that must exist, kind-specific defaults).
//! Everything runs on a locked [`State`], so each verb is atomic.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Value, json};

use crate::apply::{self, WriteCtx};
use crate::error::ApiError;
use crate::meta::{self, finalizers, meta_mut, meta_str};
use crate::patch::{self, PatchType};
use crate::resources::{ResourceDef, res_key};
use crate::selector::{FieldSelector, LabelSelector};
use crate::store::{ObjKey, State};

/// Store key of namespaces (cluster-scoped, core group).
pub const NAMESPACES: &str = "/namespaces";
/// Store key of CRDs.
pub const CRDS: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// Options shared by the write verbs.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    /// `fieldManager`, or the client's user agent up to the first `/`.
    pub manager: String,
    /// `dryRun=All`: validate and answer, but store nothing.
    pub dry_run: bool,
    /// `force=true` for server-side apply.
    pub force: bool,
}

/// `DeleteOptions` (body or query).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    /// `Background` (default), `Foreground` or `Orphan`.
    pub propagation: Option<String>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

fn obj_key(def: &ResourceDef, ns: Option<&str>, name: &str) -> ObjKey {
    (if def.namespaced { ns.unwrap_or("").to_string() } else { String::new() }, name.to_string())
}

/// Reads an object the way a GET does (as a `Value`; the server answers with `get_json`).
#[cfg(test)]
pub fn get(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Value, ApiError> {
    st.get(&def.key(), &obj_key(def, ns, name))
        .map(|o| for_version(o, def))
        .ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))
}

/// GET's response body: the stored JSON when the object was written through the same
/// version (no clone, no serialization).
pub fn get_json(st: &State, def: &ResourceDef, ns: Option<&str>, name: &str) -> Result<Bytes, ApiError> {
    let key = def.key();
    let ok = obj_key(def, ns, name);
    let o = st.get(&key, &ok).ok_or_else(|| ApiError::not_found(&def.group, &def.plural, name))?;
    match st.serialized(&key).and_then(|m| m.get(&ok)) {
        Some(j) if o["apiVersion"].as_str() == Some(def.api_version().as_str()) => Ok(j.clone()),
        _ => Ok(crate::store::to_json(&for_version(o, def))),
    }
}

/// The object as seen through `def`'s version (CRD versions share storage).
pub fn for_version(o: &Arc<Value>, def: &ResourceDef) -> Value {
    let mut v = (**o).clone();
    if v["apiVersion"].as_str() != Some(def.api_version().as_str()) {
        v["apiVersion"] = Value::String(def.api_version());
    }
    v
}

/// One listed object: the stored value and its JSON as seen through the listed version.
#[derive(Debug, Clone)]
pub struct ListItem {
    pub obj: Arc<Value>,
    pub json: Bytes,
}

/// One page of a list.
#[derive(Debug)]
pub struct ListPage {
    pub items: Vec<ListItem>,
    pub rv: u64,
    pub continue_token: Option<String>,
    pub remaining: Option<usize>,
}

/// A continue token: the resourceVersion of the first page and the last key returned.
fn encode_continue(rv: u64, last: &ObjKey) -> String {
    let raw = json!({"rv": rv, "ns": last.0, "name": last.1}).to_string();
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
}

fn decode_continue(tok: &str) -> Result<(u64, ObjKey), ApiError> {
    let bad = || ApiError::bad_request("continue key is not valid");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(tok).map_err(|_| bad())?;
    let v: Value = serde_json::from_slice(&raw).map_err(|_| bad())?;
    let rv = v["rv"].as_u64().ok_or_else(bad)?;
    Ok((rv, (v["ns"].as_str().unwrap_or("").to_string(), v["name"].as_str().ok_or_else(bad)?.to_string())))
}

/// LIST with selectors and `limit`/`continue`. Pages are served from the current state
/// (kube-apiserver serves them from a snapshot); a continue token older than the retained
/// history is answered with 410 like an expired etcd revision.
pub fn list(
    st: &State,
    def: &ResourceDef,
    ns: Option<&str>,
    labels: &LabelSelector,
    fields: &FieldSelector,
    limit: Option<usize>,
    cont: Option<&str>,
) -> Result<ListPage, ApiError> {
    let (rv, after) = match cont {
        Some(tok) if !tok.is_empty() => {
            let (rv, after) = decode_continue(tok)?;
            if rv < st.floor {
                return Err(ApiError::expired(
                    "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                ));
            }
            (rv, Some(after))
        }
        _ => (st.rv, None),
    };
    let Some(map) = st.objects.get(&def.key()) else {
        return Ok(ListPage { items: Vec::new(), rv, continue_token: None, remaining: None });
    };
    let range: Box<dyn Iterator<Item = (&ObjKey, &Arc<Value>)>> = match (&after, ns.filter(|_| def.namespaced)) {
        (Some(a), _) => {
            Box::new(map.range::<ObjKey, _>((std::ops::Bound::Excluded(a.clone()), std::ops::Bound::Unbounded)))
        }
        (None, Some(n)) => Box::new(map.range::<ObjKey, _>((n.to_string(), String::new())..)),
        (None, None) => Box::new(map.iter()),
    };
    let serialized = st.serialized(&def.key());
    let api_version = def.api_version();
    let mut items = Vec::new();
    let mut last = None;
    let mut more = 0usize;
    for (k, o) in range {
        if let Some(n) = ns.filter(|_| def.namespaced)
            && k.0 != n
        {
            if k.0.as_str() > n {
                break;
            }
            continue;
        }
        if !labels.matches(o) || !fields.matches(o) {
            continue;
        }
        if limit.is_some_and(|l| l > 0 && items.len() >= l) {
            more += 1;
            continue;
        }
        let json = match serialized.and_then(|m| m.get(k)) {
            Some(j) if o["apiVersion"].as_str() == Some(api_version.as_str()) => j.clone(),
            _ => crate::store::to_json(&for_version(o, def)),
        };
        items.push(ListItem { obj: o.clone(), json });
        last = Some(k.clone());
    }
    let continue_token = if more > 0 { last.map(|l| encode_continue(rv, &l)) } else { None };
    Ok(ListPage { items, rv, continue_token, remaining: (more > 0).then_some(more) })
}

/// Checks kind/apiVersion of a body against the URL, filling them in when absent.
fn check_type(def: &ResourceDef, body: &mut Value) -> Result<(), ApiError> {
    if !body.is_object() {
        return Err(ApiError::bad_request("the body of the request must be a JSON object"));
    }
    match body["kind"].as_str() {
        None | Some("") => body["kind"] = json!(def.kind),
        Some(k) if k == def.kind => {}
        Some(k) => {
            return Err(ApiError::bad_request(format!(
                "the kind of the provided object ({k}) does not match the kind of the request ({})",
                def.kind
            )));
        }
    }
    match body["apiVersion"].as_str() {
        None | Some("") => body["apiVersion"] = json!(def.api_version()),
        Some(v) if v == def.api_version() => {}
        Some(v) => {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({v}) does not match the expected API version ({})",
                def.api_version()
            )));
        }
    }
    if !body.get("metadata").is_some_and(Value::is_object) {
        body["metadata"] = json!({});
    }
    Ok(())
}

/// Checks that the namespace of the body matches the URL and exists and is not terminating.
fn check_namespace(
    st: &State,
    def: &ResourceDef,
    ns: Option<&str>,
    body: &mut Value,
    name: &str,
) -> Result<(), ApiError> {
    if !def.namespaced {
        meta_mut(body).remove("namespace");
        return Ok(());
    }
    let url_ns = ns.unwrap_or("");
    let body_ns = meta_str(body, "namespace").to_string();
    let ns = match (url_ns, body_ns.as_str()) {
        ("", "") => return Err(ApiError::bad_request("the namespace of the object is required")),
        ("", b) => b.to_string(),
        (u, "") => u.to_string(),
        (u, b) if u == b => u.to_string(),
        _ => {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    };
    match st.get(NAMESPACES, &(String::new(), ns.clone())) {
        None => return Err(ApiError::not_found("", "namespaces", &ns)),
        Some(n) if !meta_str(n, "deletionTimestamp").is_empty() => {
            return Err(ApiError::forbidden(format!(
                "{} \"{name}\" is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                def.plural
            )));
        }
        Some(_) => {}
    }
    meta_mut(body).insert("namespace".into(), json!(ns));
    Ok(())
}

/// Body without metadata and status: what `generation` tracks.
fn spec_part(o: &Value) -> Value {
    let mut v = o.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

/// Kind-specific defaults and checks (the parts of registry strategies fleetwatch meets).
fn prepare_kind(st: &State, def: &ResourceDef, obj: &mut Value, creating: bool) -> Result<(), ApiError> {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "secrets") => {
            // stringData is write-only: merged into data (base64) and dropped.
            if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                let data = obj["data"].as_object().cloned().unwrap_or_default();
                let mut data = data;
                for (k, v) in sd {
                    let s = v.as_str().unwrap_or("").as_bytes().to_vec();
                    data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(s)));
                }
                obj["data"] = Value::Object(data);
            }
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
        }
        ("", "namespaces") => {
            if creating {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
                obj["status"] = json!({"phase": "Active"});
            }
            let name = meta_str(obj, "name").to_string();
            meta_mut(obj)
                .entry("labels")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|l| l.insert("kubernetes.io/metadata.name".into(), json!(name)));
        }
        ("", "services") if creating => {
            if obj["spec"]["type"].is_null() {
                obj["spec"]["type"] = json!("ClusterIP");
            }
            if obj["spec"]["clusterIP"].is_null() && obj["spec"]["type"] != "ExternalName" {
                let ip = format!("10.96.{}.{}", rand::random_range(0..255u8), rand::random_range(1..255u8));
                obj["spec"]["clusterIP"] = json!(ip);
                obj["spec"]["clusterIPs"] = json!([ip]);
            }
        }
        ("apps", "deployments") if obj["spec"]["replicas"].is_null() => {
            obj["spec"]["replicas"] = json!(1);
        }
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            let mut reg = st.registry.clone();
            let group = obj["spec"]["group"].as_str().unwrap_or("");
            let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or("");
            let name = meta_str(obj, "name").to_string();
            let invalid = |m: String| {
                ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", &name, &[("spec", m)])
            };
            if name != format!("{plural}.{group}") {
                return Err(ApiError::invalid(
                    "CustomResourceDefinition",
                    "apiextensions.k8s.io",
                    &name,
                    &[(
                        "metadata.name",
                        format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
                    )],
                ));
            }
            if let Some(other) = reg.any_version(&res_key(group, plural))
                && !other.from_crd
            {
                return Err(invalid(format!("{plural}.{group} is a built-in resource")));
            }
            reg.apply_crd(obj).map_err(invalid)?;
            let stored: Vec<Value> = obj["spec"]["versions"]
                .as_array()
                .map(|vs| vs.iter().filter(|v| v["storage"] == json!(true)).map(|v| v["name"].clone()).collect())
                .unwrap_or_default();
            let now = meta::now();
            let mut accepted = obj["spec"]["names"].clone();
            if accepted["singular"].is_null() {
                accepted["singular"] = json!(accepted["kind"].as_str().unwrap_or("").to_lowercase());
            }
            if accepted["listKind"].is_null() {
                accepted["listKind"] = json!(format!("{}List", accepted["kind"].as_str().unwrap_or("")));
            }
            obj["status"] = json!({
                "acceptedNames": accepted,
                "storedVersions": stored,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": now},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": now},
                ],
            });
        }
        _ => {}
    }
    Ok(())
}

/// Validates `metadata.name`.
fn check_name(def: &ResourceDef, name: &str) -> Result<(), ApiError> {
    if name.is_empty() {
        return Err(ApiError::invalid(
            &def.kind,
            &def.group,
            name,
            &[("metadata.name", "Required value: name or generateName is required".into())],
        ));
    }
    if !meta::is_dns_subdomain(name) {
        return Err(ApiError::invalid(
            &def.kind,
            &def.group,
            name,
            &[(
                "metadata.name",
                format!(
                    "Invalid value: \"{name}\": a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                ),
            )],
        ));
    }
    Ok(())
}

fn ctx<'a>(
    def: &'a ResourceDef,
    w: &'a WriteOpts,
    now: &'a str,
    api_version: &'a str,
    sub: Option<&'a str>,
) -> WriteCtx<'a> {
    let _ = def;
    WriteCtx { manager: if w.manager.is_empty() { "unknown" } else { &w.manager }, api_version, now, subresource: sub }
}

/// CREATE (POST on the collection).
pub fn create(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    mut body: Value,
    w: &WriteOpts,
) -> Result<Value, ApiError> {
    check_type(def, &mut body)?;
    finish_create(st, def, ns, body, w, None)
}

fn finish_create(
    st: &mut State,
    def: &ResourceDef,
    ns: Option<&str>,
    mut body: Value,
    w: &WriteOpts,
    applied: Option<&Value>,
) -> Result<Value, ApiError> {
    let mut name = meta_str(&body, "name").to_string();
    if name.is_empty() {
        let gen_name = meta_str(&body, "generateName").to_string();
        if !gen_name.is_empty() {
            name = format!("{gen_name}{}", meta::random_suffix());
            meta_mut(&mut body).insert("name".into(), json!(name));
        }
    }
    check_name(def, &name)?;
    check_namespace(st, def, ns, &mut body, &name)?;
    let ok = obj_key(def, Some(meta_str(&body, "namespace")), &name);
    if st.get(&def.key(), &ok).is_some() {
        return Err(ApiError::already_exists(&def.group, &def.plural, &name));
    }
    let now = meta::now();
    {
        let m = meta_mut(&mut body);
        for k in
            ["uid", "resourceVersion", "deletionTimestamp", "deletionGracePeriodSeconds", "managedFields", "selfLink"]
        {
            m.remove(k);
        }
        m.insert("uid".into(), json!(meta::new_uid()));
        m.insert("creationTimestamp".into(), json!(now));
        if def.tracks_generation {
            m.insert("generation".into(), json!(1));
        } else {
            m.remove("generation");
        }
    }
    if def.has_status && !(def.group.is_empty() && def.plural == "namespaces") {
        // Status is written through /status only; a create starts without one.
        if let Some(m) = body.as_object_mut() {
            m.remove("status");
        }
    }
    prepare_kind(st, def, &mut body, true)?;
    let av = def.api_version();
    let c = ctx(def, w, &now, &av, None);
    match applied {
        Some(a) => {
            let with_fields = apply::apply(None, a, w.force, &c)?;
            if let Some(mf) = with_fields["metadata"].get("managedFields") {
                meta_mut(&mut body).insert("managedFields".into(), mf.clone());
            }
        }
        None => apply::track_update(None, &mut body, &c),
    }
    if w.dry_run {
        return Ok(body);
    }
    if def.key() == CRDS {
        st.registry.apply_crd(&body).map_err(ApiError::bad_request)?;
    }
    let stored = st.commit(&def.key(), ok, Some(body), None);
    Ok(for_version(&stored, def))
}

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
fn write_existing(
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
    if !new["apiVersion"].is_string() || new["apiVersion"] != existing["apiVersion"] {
        new["apiVersion"] = existing["apiVersion"].clone();
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
fn orphan_dependents(st: &mut State, uid: &str) {
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

#[cfg(test)]
mod tests {
    use super::*;

    fn setup() -> (State, ResourceDef) {
        let mut st = State::new(100);
        let ns_def = st.registry.get("", "v1", "namespaces").cloned().unwrap();
        create(&mut st, &ns_def, None, json!({"metadata": {"name": "d"}}), &WriteOpts::default()).unwrap();
        let def = st.registry.get("", "v1", "configmaps").cloned().unwrap();
        (st, def)
    }

    fn w() -> WriteOpts {
        WriteOpts { manager: "test".into(), ..Default::default() }
    }

    #[test]
    fn create_stamps_metadata_and_requires_namespace() {
        let (mut st, def) = setup();
        let o = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v"}}), &w()).unwrap();
        assert_eq!(o["kind"], "ConfigMap");
        assert_eq!(o["metadata"]["uid"].as_str().map(str::len), Some(36));
        assert!(o["metadata"]["creationTimestamp"].is_string());
        assert!(o["metadata"]["generation"].is_null(), "configmaps have no generation");
        let e = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}}), &w()).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
        let e = create(&mut st, &def, Some("nope"), json!({"metadata": {"name": "a"}}), &w()).unwrap_err();
        assert_eq!((e.code, e.reason), (404, "NotFound"));
        let e = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "Bad_Name"}}), &w()).unwrap_err();
        assert_eq!((e.code, e.reason), (422, "Invalid"));
    }

    #[test]
    fn stale_update_conflicts_and_noop_keeps_rv() {
        let (mut st, def) = setup();
        let o = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v"}}), &w()).unwrap();
        let mut u = o.clone();
        u["data"]["k"] = json!("v2");
        let o2 = update(&mut st, &def, Some("d"), "a", u.clone(), false, &w()).unwrap();
        assert_ne!(o2["metadata"]["resourceVersion"], o["metadata"]["resourceVersion"]);
        let e = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap_err();
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        let o3 = update(&mut st, &def, Some("d"), "a", o2.clone(), false, &w()).unwrap();
        assert_eq!(o3["metadata"]["resourceVersion"], o2["metadata"]["resourceVersion"]);
    }

    #[test]
    fn generation_tracks_spec_only() {
        let mut st = State::new(100);
        let ns_def = st.registry.get("", "v1", "namespaces").cloned().unwrap();
        create(&mut st, &ns_def, None, json!({"metadata": {"name": "d"}}), &w()).unwrap();
        let def = st.registry.get("apps", "v1", "deployments").cloned().unwrap();
        let o = create(
            &mut st,
            &def,
            Some("d"),
            json!({"metadata": {"name": "a"}, "spec": {"replicas": 1}, "status": {"x": 1}}),
            &w(),
        )
        .unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        assert!(o["status"].is_null(), "status is reset on create");
        let mut u = o.clone();
        u["metadata"]["labels"] = json!({"a": "b"});
        let o = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
        assert_eq!(o["metadata"]["generation"], 1);
        let mut u = o.clone();
        u["spec"]["replicas"] = json!(3);
        let o = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
        assert_eq!(o["metadata"]["generation"], 2);
        let mut s = o.clone();
        s["status"] = json!({"readyReplicas": 3});
        s["spec"]["replicas"] = json!(9);
        let o = update(&mut st, &def, Some("d"), "a", s, true, &w()).unwrap();
        assert_eq!(o["status"]["readyReplicas"], 3);
        assert_eq!(o["spec"]["replicas"], 3, "status update ignores spec");
        assert_eq!(o["metadata"]["generation"], 2);
    }

    #[test]
    fn delete_waits_for_finalizers() {
        let (mut st, def) = setup();
        create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a", "finalizers": ["x/y"]}}), &w()).unwrap();
        let o = delete(&mut st, &def, Some("d"), "a", &DeleteOpts::default()).unwrap();
        assert!(o["metadata"]["deletionTimestamp"].is_string());
        assert!(get(&st, &def, Some("d"), "a").is_ok());
        let mut u = o.clone();
        u["metadata"]["finalizers"] = json!(["x/y", "new/one"]);
        assert_eq!(update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap_err().code, 403);
        let mut u = o.clone();
        u["metadata"]["finalizers"] = json!([]);
        update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
        assert_eq!(get(&st, &def, Some("d"), "a").unwrap_err().code, 404);
    }

    #[test]
    fn list_pages_with_continue() {
        let (mut st, def) = setup();
        for i in 0..5 {
            create(
                &mut st,
                &def,
                Some("d"),
                json!({"metadata": {"name": format!("c{i}"), "labels": {"i": i.to_string()}}}),
                &w(),
            )
            .unwrap();
        }
        let all = LabelSelector::default();
        let f = FieldSelector::default();
        let p1 = list(&st, &def, Some("d"), &all, &f, Some(2), None).unwrap();
        assert_eq!(p1.items.len(), 2);
        assert_eq!(p1.remaining, Some(3));
        let p2 = list(&st, &def, Some("d"), &all, &f, Some(2), p1.continue_token.as_deref()).unwrap();
        let p3 = list(&st, &def, Some("d"), &all, &f, Some(2), p2.continue_token.as_deref()).unwrap();
        assert_eq!(p3.items.len(), 1);
        assert!(p3.continue_token.is_none());
        assert_eq!(p3.items[0].obj["metadata"]["name"], "c4");
        st.compact();
        assert_eq!(list(&st, &def, Some("d"), &all, &f, Some(2), p1.continue_token.as_deref()).unwrap_err().code, 410);
        let sel = LabelSelector::parse("i in (1,3)").unwrap();
        assert_eq!(list(&st, &def, None, &sel, &f, None, None).unwrap().items.len(), 2);
    }

    #[test]
    fn patches_and_strategic_for_builtins() {
        let (mut st, def) = setup();
        create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v", "z": "1"}}), &w())
            .unwrap();
        let (o, _) =
            patch(&mut st, &def, Some("d"), "a", PatchType::Merge, json!({"data": {"z": null, "n": "2"}}), false, &w())
                .unwrap();
        assert_eq!(o["data"], json!({"k": "v", "n": "2"}));
        let (o, _) =
            patch(&mut st, &def, Some("d"), "a", PatchType::Strategic, json!({"data": {"k": "w"}}), false, &w())
                .unwrap();
        assert_eq!(o["data"]["k"], "w");
        let e = patch(
            &mut st,
            &def,
            Some("d"),
            "a",
            PatchType::Merge,
            json!({"metadata": {"resourceVersion": "1"}}),
            false,
            &w(),
        )
        .unwrap_err();
        assert_eq!(e.code, 409);
    }

    #[test]
    fn crd_lifecycle_serves_and_removes_resource() {
        let mut st = State::new(100);
        let crd_def = st.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").cloned().unwrap();
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
        let o = create(&mut st, &crd_def, None, crd, &w()).unwrap();
        assert_eq!(o["status"]["conditions"][1]["type"], "Established");
        let def = st.registry.get("example.com", "v1", "widgets").cloned().unwrap();
        create(&mut st, &def, None, json!({"metadata": {"name": "w1"}, "spec": {"size": 1}}), &w()).unwrap();
        delete(&mut st, &crd_def, None, "widgets.example.com", &DeleteOpts::default()).unwrap();
        assert!(st.registry.get("example.com", "v1", "widgets").is_none());
        assert!(!st.objects.contains_key("example.com/widgets"));
        let bad = json!({"metadata": {"name": "wrong"}, "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
        assert_eq!(create(&mut st, &crd_def, None, bad, &w()).unwrap_err().code, 422);
    }

    #[test]
    fn listed_json_is_the_object_as_seen_through_the_listed_version() {
        let mut st = State::new(100);
        let crd_def = st.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").cloned().unwrap();
        let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Cluster",
            "names": {"plural": "widgets", "kind": "Widget"}, "versions": [
                {"name": "v1", "served": true, "storage": true}, {"name": "v2", "served": true, "storage": false}]}});
        create(&mut st, &crd_def, None, crd, &w()).unwrap();
        let v1 = st.registry.get("example.com", "v1", "widgets").cloned().unwrap();
        let v2 = st.registry.get("example.com", "v2", "widgets").cloned().unwrap();
        create(&mut st, &v1, None, json!({"metadata": {"name": "w1"}, "spec": {"size": 1}}), &w()).unwrap();
        let sel = LabelSelector::default();
        let f = FieldSelector::default();
        for def in [&v1, &v2] {
            let page = list(&st, def, None, &sel, &f, None, None).unwrap();
            assert_eq!(page.items.len(), 1);
            let parsed: Value = serde_json::from_slice(&page.items[0].json).unwrap();
            assert_eq!(parsed, get(&st, def, None, "w1").unwrap());
            assert_eq!(parsed["apiVersion"], def.api_version());
            let got: Value = serde_json::from_slice(&get_json(&st, def, None, "w1").unwrap()).unwrap();
            assert_eq!(got, parsed);
        }
        assert_eq!(get_json(&st, &v1, None, "nope").unwrap_err().code, 404);
        // An update replaces the stored JSON.
        let mut cur = get(&st, &v1, None, "w1").unwrap();
        cur["spec"]["size"] = json!(2);
        update(&mut st, &v1, None, "w1", cur, false, &w()).unwrap();
        let page = list(&st, &v1, None, &sel, &f, None, None).unwrap();
        let parsed: Value = serde_json::from_slice(&page.items[0].json).unwrap();
        assert_eq!(parsed["spec"]["size"], 2);
        assert_eq!(parsed, get(&st, &v1, None, "w1").unwrap());
    }

    #[test]
    fn secret_string_data_is_encoded() {
        let (mut st, _) = setup();
        let def = st.registry.get("", "v1", "secrets").cloned().unwrap();
        let o = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "s"}, "stringData": {"a": "hi"}}), &w())
            .unwrap();
        assert_eq!(o["data"]["a"], "aGk=");
        assert!(o["stringData"].is_null());
        assert_eq!(o["type"], "Opaque");
    }
}
