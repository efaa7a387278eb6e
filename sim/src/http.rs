//! The HTTP layer: authentication, fault injection, routing of Kubernetes API paths to
//! the verbs, query parameters, and JSON / streaming responses. Every error is a
//! `Status` object.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, Limited, StreamBody};
use hyper::body::Incoming;
use serde_json::{Value, json};
use tracing::Instrument;

use crate::authz::{self, User};
use crate::cluster::Core;
use crate::error::ApiError;
use crate::ops::{self, DeleteOpts, WriteOpts};
use crate::patch::PatchType;
use crate::resources::ResourceDef;
use crate::schema::FieldValidation;
use crate::selector::{FieldSelector, LabelSelector};
use crate::table::{self, IncludeObject, TableRequest};
use crate::watch::{self, WatchParams};
use crate::{discovery, openapi, protobuf};

/// Response body type.
pub type Body = BoxBody<Bytes, Infallible>;

/// Largest request body accepted: kube-apiserver's `--max-request-bytes` default (3 MiB),
/// answered beyond with 413 as it does. Module manifests (large CRDs) must fit.
pub const MAX_BODY: usize = 3 * 1024 * 1024;

/// Reads a request body of at most [`MAX_BODY`] bytes.
pub(crate) async fn read_body(req: Request<Incoming>) -> Result<bytes::Bytes, ApiError> {
    match Limited::new(req.into_body(), MAX_BODY).collect().await {
        Ok(body) => Ok(body.to_bytes()),
        Err(e) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(ApiError::too_large(MAX_BODY)),
        Err(e) => Err(ApiError::bad_request(format!("reading request body: {e}"))),
    }
}

fn json_response(code: u16, v: &Value) -> Response<Body> {
    bytes_response(code, Bytes::from(serde_json::to_vec(v).unwrap_or_default()))
}

/// A response with an already serialized JSON body.
fn bytes_response(code: u16, bytes: Bytes) -> Response<Body> {
    Response::builder()
        .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
        .header(header::CONTENT_TYPE, "application/json")
        .header("Audit-Id", crate::meta::new_uid())
        .body(Full::new(bytes).boxed())
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// Adds one `Warning: 299 - "…"` header per warning (how kube-apiserver reports
/// dropped unknown fields under `fieldValidation=Warn`; kubectl prints them).
fn with_warnings(mut r: Response<Body>, warnings: &crate::schema::Warnings) -> Response<Body> {
    for w in warnings.lock().unwrap_or_else(|p| p.into_inner()).iter() {
        let text = format!("299 - {}", serde_json::to_string(w).unwrap_or_default());
        if let Ok(v) = header::HeaderValue::from_str(&text) {
            r.headers_mut().append(header::WARNING, v);
        }
    }
    r
}

fn error_response(e: &ApiError) -> Response<Body> {
    let mut r = json_response(e.code, &e.to_status());
    if e.code == 429
        && let Ok(v) = header::HeaderValue::from_str("1")
    {
        r.headers_mut().insert(header::RETRY_AFTER, v);
    }
    r
}

/// Entry point for every request.
pub async fn handle(core: Arc<Core>, req: Request<Incoming>) -> Result<Response<Body>, Infallible> {
    let span = tracing::debug_span!("request", method = %req.method(), path = %req.uri().path());
    Ok(handle_inner(core, req).instrument(span).await)
}

async fn handle_inner(core: Arc<Core>, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if matches!(path.as_str(), "/healthz" | "/livez" | "/readyz") {
        return Response::new(Full::new(Bytes::from_static(b"ok")).boxed());
    }
    let bearer = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::trim);
    let user = match bearer {
        Some(t) if t == core.token => User::admin(),
        Some(t) => {
            let tokens = core.tokens.lock().unwrap_or_else(|p| p.into_inner());
            match tokens.authenticate(&core.lock(), t) {
                Some(u) => u,
                None => return error_response(&ApiError::unauthorized()),
            }
        }
        None => return error_response(&ApiError::unauthorized()),
    };
    let imp = impersonation(req.headers());
    let user = if imp.requested() {
        match authz::impersonate(&core.lock(), &user, &imp, core.options.rbac) {
            Ok(u) => u,
            Err(e) => {
                tracing::debug!(caller = %user.name, code = e.code, message = %e.message, "impersonation refused");
                return error_response(&e);
            }
        }
    } else {
        user
    };
    if core.options.rbac {
        let q = Query::parse(req.uri().query());
        let by_name =
            q.get("fieldSelector").and_then(|f| f.strip_prefix("metadata.name=")).filter(|n| !n.contains(','));
        let a = authz::attributes(req.method().as_str(), &path, q.flag("watch"), by_name);
        if authz::authorize(&core.lock(), &user, &a).is_none() {
            tracing::debug!(user = %user.name, verb = %a.verb, %path, "forbidden");
            return error_response(&authz::forbidden(&user, &a));
        }
    }
    let delay = core.faults.delay();
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(e) = core.faults.take_failure() {
        tracing::debug!(code = e.code, %path, "injected failure");
        return error_response(&e);
    }
    match route(core, req, &user).await {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(code = e.code, reason = e.reason, message = %e.message, %path, "request failed");
            error_response(&e)
        }
    }
}

/// The impersonation headers of a request; header values that are not text count as
/// absent for user and uid and are skipped for groups.
fn impersonation(h: &http::HeaderMap) -> authz::Impersonation {
    let text = |name: &str| h.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    authz::Impersonation {
        user: text("impersonate-user"),
        groups: h.get_all("impersonate-group").iter().filter_map(|v| v.to_str().ok()).map(str::to_string).collect(),
        uid: text("impersonate-uid"),
        extra: h.keys().any(|k| k.as_str().starts_with("impersonate-extra-")),
    }
}

/// Query parameters (last value wins).
struct Query(HashMap<String, String>);

impl Query {
    fn parse(q: Option<&str>) -> Self {
        Query(form_urlencoded::parse(q.unwrap_or("").as_bytes()).into_owned().collect())
    }
    fn get(&self, k: &str) -> Option<&str> {
        self.0.get(k).map(String::as_str)
    }
    fn flag(&self, k: &str) -> bool {
        matches!(self.get(k), Some("true" | "1"))
    }
    fn opt_bool(&self, k: &str) -> Option<bool> {
        self.get(k).map(|v| v == "true" || v == "1")
    }
}

async fn route(core: Arc<Core>, req: Request<Incoming>, user: &User) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let segs: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let get = req.method() == Method::GET;
    let post = req.method() == Method::POST;
    if let Some((ns, id, rest)) = proxy_path(&path) {
        let (ns, id) = (decode(ns), decode(id));
        return crate::proxy::serve(core, req, &ns, &id, rest).await;
    }
    match segs.as_slice() {
        ["apis", "authorization.k8s.io", "v1", "selfsubjectaccessreviews"] if post => {
            let review = read_review(req).await?;
            Ok(json_response(201, &authz::access_review(&core.lock(), user, &review, core.options.rbac)))
        }
        ["apis", "authorization.k8s.io", "v1", "selfsubjectrulesreviews"] if post => {
            let review = read_review(req).await?;
            Ok(json_response(201, &authz::rules_review(&core.lock(), user, &review, core.options.rbac)))
        }
        ["apis", "authentication.k8s.io", "v1", "selfsubjectreviews"] if post => {
            // The body carries nothing to read (no spec), but must still be a review.
            read_review(req).await?;
            Ok(json_response(201, &authz::self_review(user)))
        }
        ["api", "v1", "namespaces", ns, "serviceaccounts", name, "token"] if post => {
            let (ns, name) = (ns.to_string(), name.to_string());
            let request = read_review(req).await?;
            Ok(json_response(201, &crate::cluster::token_request(&core, &ns, &name, request)?))
        }
        ["version"] if get => Ok(json_response(200, &discovery::version())),
        ["api"] if get => Ok(json_response(200, &discovery::core_versions(&core.server_addr))),
        ["api", "v1"] if get => {
            let v = discovery::resource_list(&core.lock().registry, "", "v1");
            v.map(|v| json_response(200, &v)).ok_or_else(|| ApiError::no_route(&path))
        }
        ["apis"] if get => Ok(json_response(200, &discovery::group_list(&core.lock().registry))),
        ["apis", g] if get => {
            let v = discovery::group(&core.lock().registry, g);
            v.map(|v| json_response(200, &v)).ok_or_else(|| ApiError::no_route(&path))
        }
        ["apis", g, v] if get => {
            let doc = discovery::resource_list(&core.lock().registry, g, v);
            doc.map(|d| json_response(200, &d)).ok_or_else(|| ApiError::no_route(&path))
        }
        ["openapi", "v3"] if get => Ok(json_response(200, &openapi::root(&core.lock()))),
        ["openapi", "v3", "api", v] if get => {
            let doc = openapi::gv_doc(&core.lock(), "", v);
            doc.map(|d| json_response(200, &d)).ok_or_else(|| ApiError::no_route(&path))
        }
        ["openapi", "v3", "apis", g, v] if get => {
            let doc = openapi::gv_doc(&core.lock(), g, v);
            doc.map(|d| json_response(200, &d)).ok_or_else(|| ApiError::no_route(&path))
        }
        ["api", "v1", rest @ ..] if !rest.is_empty() => {
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            resource(core, req, "", "v1", &rest).await
        }
        ["apis", g, v, rest @ ..] if !rest.is_empty() => {
            let (g, v) = (g.to_string(), v.to_string());
            let rest: Vec<String> = rest.iter().map(|s| s.to_string()).collect();
            resource(core, req, &g, &v, &rest).await
        }
        _ => Err(ApiError::no_route(&path)),
    }
}

/// `/api/v1/namespaces/NS/services/ID/proxy[/REST]` → (NS, ID, REST): REST keeps its
/// slashes (a trailing one included), as the proxied path.
fn proxy_path(path: &str) -> Option<(&str, &str, &str)> {
    let mut it = path.splitn(9, '/');
    let head: Vec<&str> = it.by_ref().take(8).collect();
    match head.as_slice() {
        ["", "api", "v1", "namespaces", ns, "services", id, "proxy"] if !ns.is_empty() && !id.is_empty() => {
            Some((ns, id, it.next().unwrap_or("")))
        }
        _ => None,
    }
}

/// A path segment percent-decoded (`https%3Ahub%3Aadmin`), as Go's URL parsing does before
/// kube-apiserver routes a request.
fn decode(segment: &str) -> String {
    percent_encoding::percent_decode_str(segment).decode_utf8_lossy().into_owned()
}

/// What a resource path addresses.
struct Target {
    def: ResourceDef,
    namespace: Option<String>,
    name: Option<String>,
    status: bool,
    /// The `/scale` subresource.
    scale: bool,
}

fn resolve(core: &Core, group: &str, version: &str, rest: &[String], path: &str) -> Result<Target, ApiError> {
    let r: Vec<&str> = rest.iter().map(String::as_str).collect();
    let (ns, plural, name, sub) = match r.as_slice() {
        ["namespaces", ns, res] if *res != "status" && *res != "finalize" => (Some(*ns), *res, None, None),
        ["namespaces", ns, res, name] => (Some(*ns), *res, Some(*name), None),
        ["namespaces", ns, res, name, sub] => (Some(*ns), *res, Some(*name), Some(*sub)),
        [res] => (None, *res, None, None),
        [res, name] => (None, *res, Some(*name), None),
        [res, name, sub] => (None, *res, Some(*name), Some(*sub)),
        _ => return Err(ApiError::no_route(path)),
    };
    let def = core.lock().registry.get(group, version, plural).cloned().ok_or_else(|| ApiError::no_route(path))?;
    if ns.is_some() && !def.namespaced {
        return Err(ApiError::no_route(path));
    }
    if ns.is_none() && def.namespaced && name.is_some() {
        return Err(ApiError::no_route(path));
    }
    let (status, scale) = match sub {
        None => (false, false),
        Some("status") if def.has_status => (true, false),
        Some("scale") if def.scale.is_some() => (false, true),
        Some(_) => return Err(ApiError::no_route(path)),
    };
    Ok(Target { def, namespace: ns.map(str::to_string), name: name.map(str::to_string), status, scale })
}

/// The body of a review or TokenRequest: JSON, or the protobuf kubectl sends for them.
async fn read_review(req: Request<Incoming>) -> Result<Value, ApiError> {
    let ct =
        req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string();
    let body = read_body(req).await?;
    if ct.starts_with("application/vnd.kubernetes.protobuf") {
        return crate::pbwire::decode(&body).ok_or_else(|| ApiError::unsupported_media_type(&ct));
    }
    if body.is_empty() {
        return Ok(json!({}));
    }
    serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("the body of the request could not be decoded as JSON: {e}")))
}

async fn read_json(req: Request<Incoming>) -> Result<(Value, String), ApiError> {
    let ct =
        req.headers().get(header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("application/json").to_string();
    // CBOR bodies are not decoded (client-go retries with JSON on 415).
    if ct.starts_with("application/cbor") {
        return Err(ApiError::unsupported_media_type(&ct));
    }
    let protobuf = ct.starts_with("application/vnd.kubernetes.protobuf");
    let body = read_body(req).await?;
    if body.is_empty() {
        return Ok((Value::Null, ct));
    }
    if protobuf {
        return Ok((protobuf::decode_body(&body)?, ct));
    }
    let v = serde_json::from_slice(&body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body of the request could not be decoded as JSON (only JSON bodies are supported): {e}"
        ))
    })?;
    Ok((v, ct))
}

/// What a GET / LIST / WATCH answers with.
enum Output {
    Json,
    Table(TableRequest),
    /// `as=PartialObjectMetadata(List)`, with the meta.k8s.io version.
    Metadata(&'static str),
}

/// Content negotiation on `Accept`: the first media type that can be produced wins.
/// Protobuf is never produced (kubectl always offers JSON after it).
fn negotiate(req: &Request<Incoming>, q: &Query) -> Result<Output, ApiError> {
    let accept = req.headers().get(header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").trim();
    if accept.is_empty() {
        return Ok(Output::Json);
    }
    for range in accept.split(',') {
        let mut parts = range.split(';').map(str::trim);
        let mt = parts.next().unwrap_or("");
        let params: HashMap<&str, &str> =
            parts.filter_map(|p| p.split_once('=')).map(|(k, v)| (k.trim(), v.trim())).collect();
        if !matches!(mt, "application/json" | "application/*" | "*/*") {
            continue;
        }
        match params.get("as").copied() {
            None => return Ok(Output::Json),
            Some("Table") if params.get("g").copied() == Some("meta.k8s.io") => {
                let version = match params.get("v").copied() {
                    Some("v1") => "v1",
                    Some("v1beta1") => "v1beta1",
                    _ => continue,
                };
                let include = IncludeObject::parse(q.get("includeObject"))?;
                return Ok(Output::Table(TableRequest { version, include }));
            }
            Some("PartialObjectMetadata" | "PartialObjectMetadataList")
                if params.get("g").copied() == Some("meta.k8s.io") =>
            {
                match params.get("v").copied() {
                    Some("v1") => return Ok(Output::Metadata("v1")),
                    Some("v1beta1") => return Ok(Output::Metadata("v1beta1")),
                    _ => continue,
                }
            }
            Some(_) => continue,
        }
    }
    Err(ApiError::not_acceptable(accept))
}

fn manager(req: &Request<Incoming>, q: &Query) -> String {
    if let Some(m) = q.get("fieldManager").filter(|m| !m.is_empty()) {
        return m.to_string();
    }
    req.headers()
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .and_then(|ua| ua.split('/').next())
        .filter(|s| !s.is_empty())
        .unwrap_or("unknown")
        .to_string()
}

fn list_object(def: &ResourceDef, items: Vec<Value>, rv: u64, cont: Option<String>, remaining: Option<usize>) -> Value {
    let mut meta = json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = json!(c);
    }
    if let Some(n) = remaining {
        meta["remainingItemCount"] = json!(n);
    }
    json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": meta, "items": items})
}

/// An object as `PartialObjectMetadata`.
fn partial(obj: &Value, version: &str) -> Value {
    json!({"kind": "PartialObjectMetadata", "apiVersion": format!("meta.k8s.io/{version}"), "metadata": obj["metadata"]})
}

/// A LIST answered as a `PartialObjectMetadataList`.
fn metadata_list_response(page: ops::ListPage, version: &str) -> Response<Body> {
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    let items: Vec<Value> = page.items.iter().map(|i| partial(&i.obj, version)).collect();
    json_response(
        200,
        &json!({"kind": "PartialObjectMetadataList", "apiVersion": format!("meta.k8s.io/{version}"), "metadata": meta, "items": items}),
    )
}

/// A LIST answered as a Table.
fn table_list_response(def: &ResourceDef, page: ops::ListPage, t: &TableRequest) -> Response<Body> {
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    let objs: Vec<Value> = page.items.iter().map(|i| ops::for_version(&i.obj, def)).collect();
    json_response(200, &table::table(def, &objs, meta, t, true))
}

/// A LIST response assembled from the objects' stored JSON (no per-object
/// re-serialization; runs after the state lock is released).
fn list_response(def: &ResourceDef, page: ops::ListPage) -> Response<Body> {
    let mut meta = json!({"resourceVersion": page.rv.to_string()});
    if let Some(c) = page.continue_token {
        meta["continue"] = json!(c);
    }
    if let Some(n) = page.remaining {
        meta["remainingItemCount"] = json!(n);
    }
    let head = json!({"kind": format!("{}List", def.kind), "apiVersion": def.api_version(), "metadata": meta});
    let head = serde_json::to_vec(&head).unwrap_or_default();
    let items: usize = page.items.iter().map(|i| i.json.len() + 1).sum();
    let mut out = Vec::with_capacity(head.len() + items + 16);
    // `head` is an object: drop its closing brace and append the items.
    out.extend_from_slice(&head[..head.len().saturating_sub(1)]);
    out.extend_from_slice(b",\"items\":[");
    for (i, item) in page.items.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(&item.json);
    }
    out.extend_from_slice(b"]}");
    bytes_response(200, Bytes::from(out))
}

async fn resource(
    core: Arc<Core>,
    req: Request<Incoming>,
    group: &str,
    version: &str,
    rest: &[String],
) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let t = resolve(&core, group, version, rest, &path)?;
    let q = Query::parse(req.uri().query());
    let ns = t.namespace.as_deref();
    let w = WriteOpts {
        manager: manager(&req, &q),
        dry_run: q.get("dryRun") == Some("All"),
        force: q.flag("force"),
        field_validation: FieldValidation::parse(q.get("fieldValidation"))?,
        warnings: Default::default(),
    };
    let method = req.method().clone();
    if t.scale {
        return scale(core, req, &t, &q, &w).await;
    }
    match (&method, t.name.as_deref()) {
        (&Method::GET, None) => {
            let output = negotiate(&req, &q)?;
            let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?;
            let fields = FieldSelector::parse_for(q.get("fieldSelector").unwrap_or(""), &t.def.group, &t.def.kind)?;
            if q.flag("watch") {
                core.faults.watch_gate().await;
                return start_watch(core, &t.def, &q, ns, labels, fields, output);
            }
            let limit = q.get("limit").and_then(|l| l.parse().ok());
            let page = ops::list(&core.lock(), &t.def, ns, &labels, &fields, limit, q.get("continue"))?;
            Ok(match output {
                Output::Json => list_response(&t.def, page),
                Output::Table(tr) => table_list_response(&t.def, page, &tr),
                Output::Metadata(v) => metadata_list_response(page, v),
            })
        }
        (&Method::GET, Some(name)) => match negotiate(&req, &q)? {
            Output::Json => Ok(bytes_response(200, ops::get_json(&core.lock(), &t.def, ns, name)?)),
            Output::Table(tr) => {
                let obj = ops::get(&core.lock(), &t.def, ns, name)?;
                let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                Ok(json_response(200, &table::table(&t.def, [&obj], meta, &tr, true)))
            }
            Output::Metadata(v) => Ok(json_response(200, &partial(&ops::get(&core.lock(), &t.def, ns, name)?, v))),
        },
        (&Method::POST, None) => {
            if t.def.namespaced && ns.is_none() {
                return Err(ApiError::method_not_allowed());
            }
            let (body, _) = read_json(req).await?;
            let created = ops::create(&mut core.lock(), &t.def, ns, body, &w)?;
            // An object created with ownerReferences to owners that are gone is collected.
            core.gc_wake.notify_one();
            Ok(with_warnings(json_response(201, &created), &w.warnings))
        }
        (&Method::PUT, Some(name)) => {
            let (body, _) = read_json(req).await?;
            let updated = ops::update(&mut core.lock(), &t.def, ns, name, body, t.status, &w)?;
            core.gc_wake.notify_one();
            Ok(with_warnings(json_response(200, &updated), &w.warnings))
        }
        (&Method::PATCH, Some(name)) => {
            let name = name.to_string();
            let (body, ct) = read_json(req).await?;
            let kind = PatchType::from_content_type(&ct)?;
            let (obj, created) = ops::patch(&mut core.lock(), &t.def, ns, &name, kind, body, t.status, &w)?;
            core.gc_wake.notify_one();
            Ok(with_warnings(json_response(if created { 201 } else { 200 }, &obj), &w.warnings))
        }
        (&Method::DELETE, name) => {
            let (body, _) = read_json(req).await?;
            let d = DeleteOpts {
                propagation: body["propagationPolicy"].as_str().or(q.get("propagationPolicy")).map(str::to_string),
                precondition_uid: body["preconditions"]["uid"].as_str().map(str::to_string),
                precondition_rv: body["preconditions"]["resourceVersion"].as_str().map(str::to_string),
                dry_run: w.dry_run || body["dryRun"].as_array().is_some_and(|a| a.iter().any(|v| v == "All")),
            };
            let out = match name {
                Some(name) => json_response(200, &ops::delete(&mut core.lock(), &t.def, ns, name, &d)?),
                None => {
                    let labels = LabelSelector::parse(q.get("labelSelector").unwrap_or(""))?;
                    let fields =
                        FieldSelector::parse_for(q.get("fieldSelector").unwrap_or(""), &t.def.group, &t.def.kind)?;
                    let mut st = core.lock();
                    let items = ops::delete_collection(&mut st, &t.def, ns, &labels, &fields, &d)?;
                    let rv = st.rv;
                    drop(st);
                    json_response(200, &list_object(&t.def, items, rv, None, None))
                }
            };
            core.gc_wake.notify_one();
            Ok(out)
        }
        _ => Err(ApiError::method_not_allowed()),
    }
}

/// GET, PUT and PATCH on `/scale`.
async fn scale(
    core: Arc<Core>,
    req: Request<Incoming>,
    t: &Target,
    q: &Query,
    w: &WriteOpts,
) -> Result<Response<Body>, ApiError> {
    let ns = t.namespace.as_deref();
    let name = t.name.clone().ok_or_else(ApiError::method_not_allowed)?;
    let method = req.method().clone();
    let out = match method {
        Method::GET => {
            if !matches!(negotiate(&req, q)?, Output::Json) {
                return Err(ApiError::not_acceptable("a Table or metadata of a Scale"));
            }
            ops::get_scale(&core.lock(), &t.def, ns, &name)?
        }
        Method::PUT => {
            let (body, _) = read_json(req).await?;
            ops::update_scale(&mut core.lock(), &t.def, ns, &name, &body, w)?
        }
        Method::PATCH => {
            let (body, ct) = read_json(req).await?;
            let kind = PatchType::from_content_type(&ct)?;
            ops::patch_scale(&mut core.lock(), &t.def, ns, &name, kind, &body, w)?
        }
        _ => return Err(ApiError::method_not_allowed()),
    };
    Ok(json_response(200, &out))
}

/// Rewrites the lines of a watch chunk so that each object is a one-row Table or a
/// PartialObjectMetadata (BOOKMARK and ERROR events pass unchanged), as kube-apiserver
/// does for `kubectl get -w` and metadata watches.
fn transform_chunk(def: &ResourceDef, output: &Output, chunk: &Bytes) -> Bytes {
    let mut out = Vec::with_capacity(chunk.len() * 2);
    for line in chunk.split(|b| *b == b'\n').filter(|l| !l.is_empty()) {
        let Ok(mut ev) = serde_json::from_slice::<Value>(line) else {
            out.extend_from_slice(line);
            out.push(b'\n');
            continue;
        };
        if matches!(ev["type"].as_str(), Some("ADDED" | "MODIFIED" | "DELETED")) {
            let obj = ev["object"].take();
            ev["object"] = match output {
                Output::Table(tr) => {
                    let meta = json!({"resourceVersion": obj["metadata"]["resourceVersion"]});
                    table::table(def, [&obj], meta, tr, true)
                }
                Output::Metadata(v) => partial(&obj, v),
                Output::Json => obj,
            };
        }
        out.extend_from_slice(&serde_json::to_vec(&ev).unwrap_or_default());
        out.push(b'\n');
    }
    Bytes::from(out)
}

#[allow(clippy::too_many_arguments)]
fn start_watch(
    core: Arc<Core>,
    def: &ResourceDef,
    q: &Query,
    ns: Option<&str>,
    labels: LabelSelector,
    fields: FieldSelector,
    output: Output,
) -> Result<Response<Body>, ApiError> {
    let p = WatchParams {
        namespace: ns.map(str::to_string),
        labels,
        fields,
        resource_version: q.get("resourceVersion").map(str::to_string),
        send_initial_events: q.opt_bool("sendInitialEvents"),
        bookmarks: q.flag("allowWatchBookmarks"),
        timeout: q.get("timeoutSeconds").and_then(|t| t.parse().ok()).map(Duration::from_secs),
    };
    let reg = watch::register(&mut core.lock(), def, &p, core.options.watch_buffer)?;
    let timeout = p.timeout.unwrap_or(watch::DEFAULT_WATCH_TIMEOUT);
    let stream = watch::body_stream(core.clone(), def.clone(), reg, p.bookmarks, timeout);
    let body = match output {
        Output::Json => StreamBody::new(stream).boxed(),
        output => {
            let def = def.clone();
            let stream = futures_util::StreamExt::map(stream, move |f| {
                f.map(|frame| match frame.into_data() {
                    Ok(chunk) => hyper::body::Frame::data(transform_chunk(&def, &output, &chunk)),
                    Err(frame) => frame,
                })
            });
            StreamBody::new(stream).boxed()
        }
    };
    Response::builder()
        .status(200)
        .header(header::CONTENT_TYPE, "application/json")
        .header(header::CACHE_CONTROL, "no-cache, private")
        .body(body)
        .map_err(|e| ApiError::internal(e.to_string()))
}
