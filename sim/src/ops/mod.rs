//! Object semantics of the write verbs: create, update (main resource and `/status`),
//! patch, server-side apply, delete and deletecollection, with the metadata rules of
//! kube-apiserver (uid, creationTimestamp, generation, optimistic concurrency,
//! finalizers and deletionTimestamp, namespaces that must exist, kind-specific defaults).
//! Everything runs on a locked [`State`], so each verb is atomic.

mod create;
mod delete;
mod kinds;
mod read;
mod scale;
#[cfg(test)]
mod tests;
mod update;

pub use create::create;
pub use delete::{delete, delete_collection, has_dependents, remove};
pub use read::{ListPage, for_version, get, get_json, list};
pub use scale::{get_scale, patch_scale, update_scale};
pub use update::{patch, update};

use serde_json::{Value, json};

use crate::apply::WriteCtx;
use crate::error::ApiError;
use crate::meta::{self, meta_mut, meta_str};
use crate::resources::ResourceDef;
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
    /// `fieldValidation`: unknown fields of custom resources are dropped silently,
    /// with a warning, or rejected.
    pub field_validation: crate::schema::FieldValidation,
    /// Warnings for the response's `Warning` headers.
    pub warnings: crate::schema::Warnings,
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
