//! Structural schemas of CustomResourceDefinitions: what kube-apiserver does with a custom
//! resource's `openAPIV3Schema` on every write — pruning unknown fields, dropping nulls
//! of non-nullable fields, applying defaults, then validating — with the error texts of
//! `k8s.io/kube-openapi/pkg/validation` as `apiextensions-apiserver` turns them into
//! `field.Error`s (so clients and humans see what a real cluster would say).
//!
//! A small purpose-built walker over the schema's JSON rather than a JSON-schema crate:
//! Kubernetes' semantics differ from plain JSON schema in the parts that matter here
//! (pruning, `x-kubernetes-*` extensions, nullable, formats it strips, error wording).
//!
//! Differences from kube-apiserver, on purpose or for brevity:
//! - CEL rules (`x-kubernetes-validations`) are not evaluated;
//! - formats: `date-time`, `date`, `uuid*`, `ipv4`, `ipv6`, `cidr`, `mac`, `byte`,
//!   `hostname`, `email`, `uri` and `duration` are checked (approximately); kube-apiserver
//!   strips every other format (`int32`, `int64`, `float`, `double`, `password`…) before
//!   validating, so those check nothing there either;
//! - validation ratcheting on update is per erroring node: an error is dropped when the
//!   value at its path equals the old object's value there;
//! - `x-kubernetes-list-type: map` duplicates are not reported (`set` duplicates are).

use std::sync::{Arc, Mutex};

use serde_json::{Map, Value, json};

use crate::error::ApiError;
use crate::resources::ResourceDef;
use crate::store::State;

/// One field error, rendered like apimachinery's `field.Error`.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// The `StatusCause.reason`, e.g. `FieldValueNotSupported`.
    pub reason: &'static str,
    /// The field path, e.g. `spec.items[0].name`.
    pub field: String,
    /// The message without the field, e.g. `Unsupported value: "c": supported values: "a"`.
    pub body: String,
    /// JSON pointer of the node the error is about (for ratcheting).
    pointer: String,
}

impl FieldError {
    fn new(reason: &'static str, field: &str, pointer: &str, body: String) -> Self {
        FieldError { reason, field: field.to_string(), body, pointer: pointer.to_string() }
    }

    /// `field: body`, as in a Status message.
    pub fn message(&self) -> String {
        format!("{}: {}", self.field, self.body)
    }
}

/// Go's `%q` of a string (close enough: JSON escaping).
fn quote(s: &str) -> String {
    serde_json::to_string(s).unwrap_or_else(|_| format!("\"{s}\""))
}

/// A bad value as `field.Error.ErrorBody` prints it.
fn show(v: &Value) -> String {
    match v {
        Value::Null => "\"null\"".into(),
        Value::String(s) => quote(s),
        Value::Number(n) => show_number(n),
        Value::Bool(b) => b.to_string(),
        other => other.to_string(),
    }
}

fn show_number(n: &serde_json::Number) -> String {
    if let Some(i) = n.as_i64() {
        return i.to_string();
    }
    if let Some(u) = n.as_u64() {
        return u.to_string();
    }
    let f = n.as_f64().unwrap_or(0.0);
    format_float(f)
}

/// Go's `%v` of a float64.
fn format_float(f: f64) -> String {
    if f.fract() == 0.0 && f.abs() < 1e21 { format!("{}", f as i128) } else { format!("{f}") }
}

fn invalid(field: &str, ptr: &str, value: &Value, detail: String) -> FieldError {
    FieldError::new("FieldValueInvalid", field, ptr, format!("Invalid value: {}: {detail}", show(value)))
}

fn type_invalid(field: &str, ptr: &str, shown: &str, detail: String) -> FieldError {
    FieldError::new("FieldValueTypeInvalid", field, ptr, format!("Invalid value: {}: {detail}", quote(shown)))
}

fn required(field: &str, ptr: &str, detail: &str) -> FieldError {
    let body = if detail.is_empty() { "Required value".to_string() } else { format!("Required value: {detail}") };
    FieldError::new("FieldValueRequired", field, ptr, body)
}

fn child_path(path: &str, key: &str) -> String {
    if path.is_empty() { key.to_string() } else { format!("{path}.{key}") }
}

fn child_ptr(ptr: &str, key: &str) -> String {
    format!("{ptr}/{}", key.replace('~', "~0").replace('/', "~1"))
}

fn flag(s: &Value, ext: &str) -> bool {
    s.get(ext).and_then(Value::as_bool) == Some(true)
}

fn props(s: &Value) -> Option<&Map<String, Value>> {
    s.get("properties").and_then(Value::as_object)
}

/// The schema of values not listed in `properties`, when `additionalProperties` is one.
fn additional(s: &Value) -> Option<&Value> {
    s.get("additionalProperties").filter(|a| a.is_object())
}

fn preserves_unknown(s: &Value) -> bool {
    flag(s, "x-kubernetes-preserve-unknown-fields") || s.get("additionalProperties") == Some(&Value::Bool(true))
}

// ----------------------------------------------------------------------------------------
// Admission of a custom resource write

/// `fieldValidation`: what to do with fields the schema does not know.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum FieldValidation {
    /// Drop them silently.
    Ignore,
    /// Drop them and answer a `Warning` header per field (the default).
    #[default]
    Warn,
    /// Reject the request (400), what kubectl asks for by default.
    Strict,
}

impl FieldValidation {
    /// Parses the query parameter; unknown values are a 400 like upstream.
    pub fn parse(v: Option<&str>) -> Result<Self, ApiError> {
        match v {
            None | Some("") | Some("Warn") => Ok(FieldValidation::Warn),
            Some("Ignore") => Ok(FieldValidation::Ignore),
            Some("Strict") => Ok(FieldValidation::Strict),
            Some(other) => Err(ApiError::bad_request(format!(
                "fieldValidation parameter unsupported: {other}; expected one of Ignore, Warn, Strict"
            ))),
        }
    }
}

/// Warnings a write collects for the `Warning` response header.
pub type Warnings = Arc<Mutex<Vec<String>>>;

/// Store key of CRDs.
const CRDS: &str = "apiextensions.k8s.io/customresourcedefinitions";

/// The schema of the version `def` serves, when `def` is a custom resource whose CRD
/// declares one.
pub fn schema_for(st: &State, def: &ResourceDef) -> Option<Value> {
    if !def.from_crd {
        return None;
    }
    let crd = st.get(CRDS, &(String::new(), format!("{}.{}", def.plural, def.group)))?;
    version_schema(crd, &def.version).cloned()
}

/// What kube-apiserver does to a custom resource on create, update, patch and apply
/// (main resource or `/status`): prune unknown fields (400 under `Strict`, a warning
/// under `Warn`), default, and validate (422 `Invalid` with one cause per field; on
/// update, errors in unchanged fields are ratcheted). `old` is the stored object on update.
pub fn admit(
    st: &State,
    def: &ResourceDef,
    obj: &mut Value,
    old: Option<&Value>,
    fv: FieldValidation,
    warnings: &Warnings,
) -> Result<(), ApiError> {
    let Some(schema) = schema_for(st, def) else { return Ok(()) };
    let pruned = prune(obj, &schema);
    if !pruned.is_empty() {
        let list: Vec<String> = pruned.iter().map(|p| format!("unknown field {}", quote(p))).collect();
        match fv {
            FieldValidation::Strict => {
                return Err(ApiError::bad_request(format!(
                    "{kind} in version {v} cannot be handled as a {kind}: strict decoding error: {}",
                    list.join(", "),
                    kind = def.kind,
                    v = quote(&def.version),
                )));
            }
            FieldValidation::Warn => warnings.lock().unwrap_or_else(|p| p.into_inner()).extend(list),
            FieldValidation::Ignore => {}
        }
    }
    default(obj, &schema);
    let errs = match old {
        Some(o) => validate_update(obj, o, &schema),
        None => validate(obj, &schema),
    };
    if errs.is_empty() {
        return Ok(());
    }
    let name = obj["metadata"]["name"].as_str().unwrap_or("");
    Err(invalid_error(&def.kind, &def.group, name, &errs))
}

/// kube-apiserver's `NewInvalid`: `Kind.group "name" is invalid: f: msg` (several in
/// brackets), one cause per field with its reason; duplicate messages appear once.
pub fn invalid_error(kind: &str, group: &str, name: &str, errs: &[FieldError]) -> ApiError {
    let mut seen = Vec::new();
    for e in errs {
        let m = e.message();
        if !seen.contains(&m) {
            seen.push(m);
        }
    }
    let msg = if seen.len() == 1 { seen[0].clone() } else { format!("[{}]", seen.join(", ")) };
    let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
    let causes: Vec<Value> =
        errs.iter().map(|e| json!({"reason": e.reason, "message": e.body, "field": e.field})).collect();
    ApiError {
        code: 422,
        reason: "Invalid",
        message: format!("{qualified} {} is invalid: {msg}", quote(name)),
        details: Some(json!({"name": name, "group": group, "kind": kind, "causes": causes})),
    }
}

// ----------------------------------------------------------------------------------------
// Pruning

/// Removes fields the schema does not know, in place, and returns their paths (sorted),
/// as kube-apiserver does when decoding a custom resource. `apiVersion`, `kind` and
/// `metadata` of the root (and of embedded resources) are always kept.
pub fn prune(obj: &mut Value, schema: &Value) -> Vec<String> {
    let mut out = Vec::new();
    prune_node(obj, schema, "", true, &mut out);
    out.sort();
    out
}

fn prune_node(v: &mut Value, s: &Value, path: &str, resource_root: bool, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            let embedded = resource_root || flag(s, "x-kubernetes-embedded-resource");
            let known = props(s);
            let add = additional(s);
            let keep_unknown = preserves_unknown(s);
            let keys: Vec<String> = m.keys().cloned().collect();
            for k in keys {
                let p = child_path(path, &k);
                if embedded && matches!(k.as_str(), "apiVersion" | "kind" | "metadata") {
                    // Metadata's own fields are the API server's business, not the schema's.
                    if k != "metadata"
                        && let (Some(ps), Some(child)) = (known.and_then(|ps| ps.get(&k)), m.get_mut(&k))
                    {
                        prune_node(child, ps, &p, false, out);
                    }
                    continue;
                }
                match (known.and_then(|ps| ps.get(&k)), add) {
                    (Some(ps), _) | (None, Some(ps)) => {
                        if let Some(child) = m.get_mut(&k) {
                            prune_node(child, ps, &p, false, out);
                        }
                    }
                    (None, None) if keep_unknown => {}
                    (None, None) => {
                        m.remove(&k);
                        out.push(p);
                    }
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items").filter(|i| i.is_object()) {
                for (i, item) in items.iter_mut().enumerate() {
                    prune_node(item, is, &format!("{path}[{i}]"), false, out);
                }
            }
        }
        _ => {}
    }
}

// ----------------------------------------------------------------------------------------
// Defaulting

/// Applies `default`s of properties missing from present objects (and of null,
/// non-nullable ones), then drops nulls of non-nullable properties without a default —
/// the order kube-apiserver's structural defaulting uses.
pub fn default(obj: &mut Value, schema: &Value) {
    default_node(obj, schema);
}

fn default_node(v: &mut Value, s: &Value) {
    match v {
        Value::Object(m) => {
            if let Some(ps) = props(s) {
                for (k, ps) in ps {
                    let nullable = flag(ps, "nullable");
                    match (m.get(k), ps.get("default")) {
                        (None, Some(d)) => {
                            m.insert(k.clone(), d.clone());
                        }
                        (Some(Value::Null), Some(d)) if !nullable => {
                            m.insert(k.clone(), d.clone());
                        }
                        (Some(Value::Null), None) if !nullable => {
                            m.remove(k);
                        }
                        _ => {}
                    }
                }
                for (k, child) in m.iter_mut() {
                    if let Some(ps) = ps.get(k) {
                        default_node(child, ps);
                    }
                }
            }
            if let Some(add) = additional(s) {
                let known = props(s);
                let nullable = flag(add, "nullable");
                let keys: Vec<String> =
                    m.keys().filter(|k| !known.is_some_and(|p| p.contains_key(*k))).cloned().collect();
                for k in keys {
                    let Some(child) = m.get_mut(&k) else { continue };
                    if child.is_null() && !nullable {
                        match add.get("default") {
                            Some(d) => *child = d.clone(),
                            None => {
                                m.remove(&k);
                                continue;
                            }
                        }
                    }
                    default_node(child, add);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items").filter(|i| i.is_object()) {
                for item in items.iter_mut() {
                    if item.is_null()
                        && !flag(is, "nullable")
                        && let Some(d) = is.get("default")
                    {
                        *item = d.clone();
                    }
                    default_node(item, is);
                }
            }
        }
        _ => {}
    }
}

// ----------------------------------------------------------------------------------------
// Validation

/// Validates an object against a structural schema; errors in kube-apiserver's wording.
pub fn validate(obj: &Value, schema: &Value) -> Vec<FieldError> {
    let mut errs = Vec::new();
    validate_node(obj, schema, "", "", &mut errs);
    errs
}

/// Like [`validate`], but on update errors whose node did not change are dropped
/// (kube-apiserver's validation ratcheting, on by default since 1.30).
pub fn validate_update(new: &Value, old: &Value, schema: &Value) -> Vec<FieldError> {
    validate(new, schema).into_iter().filter(|e| new.pointer(&e.pointer) != old.pointer(&e.pointer)).collect()
}

/// The JSON type name kube-openapi infers for a value.
fn type_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

fn type_matches(want: &str, v: &Value) -> bool {
    let got = type_of(v);
    want == got
        || (want == "number" && got == "integer")
        || (want == "integer" && v.as_f64().is_some_and(|f| f.fract() == 0.0) && got == "number")
}

fn num(s: &Value, k: &str) -> Option<f64> {
    s.get(k).and_then(Value::as_f64)
}

fn int(s: &Value, k: &str) -> Option<i64> {
    s.get(k).and_then(Value::as_i64)
}

/// JSON equality with numbers compared by value (1 == 1.0), as enum checks need.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        (Value::Array(x), Value::Array(y)) => x.len() == y.len() && x.iter().zip(y).all(|(a, b)| json_eq(a, b)),
        (Value::Object(x), Value::Object(y)) => {
            x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| json_eq(v, w)))
        }
        _ => a == b,
    }
}

fn validate_node(v: &Value, s: &Value, path: &str, ptr: &str, errs: &mut Vec<FieldError>) {
    if !s.is_object() {
        return;
    }
    let int_or_string = flag(s, "x-kubernetes-int-or-string");
    let ty = s.get("type").and_then(Value::as_str).filter(|t| !t.is_empty());
    let type_name = if int_or_string { Some("integer,string") } else { ty };
    if v.is_null() {
        if !flag(s, "nullable")
            && let Some(t) = type_name
        {
            errs.push(type_invalid(path, ptr, "null", format!("{path} in body must be of type {t}: \"null\"")));
        }
        return;
    }
    if int_or_string {
        if !matches!(type_of(v), "integer" | "string") && !type_matches("integer", v) {
            let got = type_of(v);
            errs.push(type_invalid(
                path,
                ptr,
                got,
                format!("{path} in body must be of type integer,string: \"{got}\""),
            ));
            return;
        }
    } else if let Some(t) = ty
        && !type_matches(t, v)
    {
        let got = type_of(v);
        errs.push(type_invalid(path, ptr, got, format!("{path} in body must be of type {t}: \"{got}\"")));
        return;
    }
    // allOf / anyOf / oneOf / not carry value validations only in structural schemas.
    if let Some(all) = s.get("allOf").and_then(Value::as_array) {
        for sub in all {
            validate_node(v, sub, path, ptr, errs);
        }
    }
    let passes = |sub: &Value| {
        let mut e = Vec::new();
        validate_node(v, sub, path, ptr, &mut e);
        e.is_empty()
    };
    if let Some(any) = s.get("anyOf").and_then(Value::as_array)
        && !any.iter().any(passes)
    {
        errs.push(invalid(path, ptr, v, format!("{path} in body must validate at least one schema (anyOf)")));
    }
    if let Some(one) = s.get("oneOf").and_then(Value::as_array)
        && one.iter().filter(|sub| passes(sub)).count() != 1
    {
        errs.push(invalid(path, ptr, v, format!("{path} in body must validate one and only one schema (oneOf)")));
    }
    if let Some(not) = s.get("not")
        && passes(not)
    {
        errs.push(invalid(path, ptr, v, format!("{path} in body must not validate the schema (not)")));
    }
    match v {
        Value::String(st) => validate_string(st, v, s, path, ptr, errs),
        Value::Number(_) => validate_number(v, s, path, ptr, errs),
        _ => {}
    }
    if let Value::Array(items) = v {
        if let Some(is) = s.get("items").filter(|i| i.is_object()) {
            for (i, item) in items.iter().enumerate() {
                validate_node(item, is, &format!("{path}[{i}]"), &format!("{ptr}/{i}"), errs);
            }
        }
        let n = items.len() as i64;
        if let Some(min) = int(s, "minItems")
            && n < min
        {
            errs.push(invalid(path, ptr, &Value::from(n), format!("{path} in body should have at least {min} items")));
        }
        if let Some(max) = int(s, "maxItems")
            && n > max
        {
            errs.push(FieldError::new(
                "FieldValueTooMany",
                path,
                ptr,
                format!("Too many: {n}: must have at most {max} items"),
            ));
        }
        if s.get("x-kubernetes-list-type").and_then(Value::as_str) == Some("set") {
            for (i, item) in items.iter().enumerate() {
                if items[..i].iter().any(|prev| json_eq(prev, item)) {
                    errs.push(FieldError::new(
                        "FieldValueDuplicate",
                        &format!("{path}[{i}]"),
                        &format!("{ptr}/{i}"),
                        format!("Duplicate value: {}", show(item)),
                    ));
                }
            }
        }
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.iter().any(|a| json_eq(a, v))
    {
        let values: Vec<String> =
            allowed.iter().map(|a| quote(&a.as_str().map(str::to_string).unwrap_or_else(|| a.to_string()))).collect();
        errs.push(FieldError::new(
            "FieldValueNotSupported",
            path,
            ptr,
            format!("Unsupported value: {}: supported values: {}", show(v), values.join(", ")),
        ));
    }
    if let Value::Object(m) = v {
        validate_object(m, s, path, ptr, errs);
    }
}

fn validate_object(m: &Map<String, Value>, s: &Value, path: &str, ptr: &str, errs: &mut Vec<FieldError>) {
    let n = m.len() as i64;
    if let Some(min) = int(s, "minProperties")
        && n < min
    {
        errs.push(invalid(
            path,
            ptr,
            &Value::from(min),
            format!("{path} in body should have at least {min} properties"),
        ));
        return;
    }
    if let Some(max) = int(s, "maxProperties")
        && n > max
    {
        errs.push(FieldError::new(
            "FieldValueTooMany",
            path,
            ptr,
            format!("Too many: {n}: must have at most {max} items"),
        ));
        return;
    }
    let known = props(s);
    if let Some(add) = additional(s) {
        for (k, child) in m {
            if !known.is_some_and(|p| p.contains_key(k)) {
                validate_node(child, add, &child_path(path, k), &child_ptr(ptr, k), errs);
            }
        }
    }
    if let Some(ps) = known {
        for (k, ps) in ps {
            if let Some(child) = m.get(k) {
                validate_node(child, ps, &child_path(path, k), &child_ptr(ptr, k), errs);
            }
        }
    }
    if let Some(req) = s.get("required").and_then(Value::as_array) {
        for k in req.iter().filter_map(Value::as_str) {
            if !m.contains_key(k) {
                errs.push(required(&child_path(path, k), ptr, ""));
            }
        }
    }
    if flag(s, "x-kubernetes-embedded-resource") {
        for k in ["apiVersion", "kind"] {
            if m.get(k).and_then(Value::as_str).is_none_or(str::is_empty) {
                errs.push(required(&child_path(path, k), ptr, "must not be empty"));
            }
        }
    }
}

fn validate_string(st: &str, v: &Value, s: &Value, path: &str, ptr: &str, errs: &mut Vec<FieldError>) {
    let len = st.chars().count() as i64;
    if let Some(max) = int(s, "maxLength")
        && len > max
    {
        errs.push(FieldError::new("FieldValueTooLong", path, ptr, format!("Too long: may not be longer than {max}")));
    }
    if let Some(min) = int(s, "minLength")
        && len < min
    {
        errs.push(invalid(path, ptr, v, format!("{path} in body should be at least {min} chars long")));
    }
    if let Some(p) = s.get("pattern").and_then(Value::as_str) {
        match regex::Regex::new(p) {
            Ok(re) if !re.is_match(st) => {
                errs.push(invalid(path, ptr, v, format!("{path} in body should match '{p}'")));
            }
            _ => {}
        }
    }
    if let Some(f) = s.get("format").and_then(Value::as_str)
        && !format_ok(f, st)
    {
        errs.push(type_invalid(path, ptr, st, format!("{path} in body must be of type {f}: {}", quote(st))));
    }
}

fn validate_number(v: &Value, s: &Value, path: &str, ptr: &str, errs: &mut Vec<FieldError>) {
    let Some(x) = v.as_f64() else { return };
    if let Some(m) = num(s, "multipleOf")
        && m > 0.0
        && (x / m).fract() != 0.0
    {
        errs.push(invalid(path, ptr, v, format!("{path} in body should be a multiple of {}", format_float(m))));
    }
    if let Some(max) = num(s, "maximum") {
        let excl = flag(s, "exclusiveMaximum");
        if x > max || (excl && x == max) {
            let how = if excl { "less than" } else { "less than or equal to" };
            errs.push(invalid(path, ptr, v, format!("{path} in body should be {how} {}", format_float(max))));
        }
    }
    if let Some(min) = num(s, "minimum") {
        let excl = flag(s, "exclusiveMinimum");
        if x < min || (excl && x == min) {
            let how = if excl { "greater than" } else { "greater than or equal to" };
            errs.push(invalid(path, ptr, v, format!("{path} in body should be {how} {}", format_float(min))));
        }
    }
}

/// The string formats kube-apiserver keeps (it strips all others before validating).
fn format_ok(format: &str, s: &str) -> bool {
    let hex = |p: &str| p.chars().all(|c| c.is_ascii_hexdigit());
    match format.replace(['-', '_'], "").as_str() {
        "datetime" => s.parse::<jiff::Timestamp>().is_ok(),
        "date" => s.len() == 10 && s.parse::<jiff::civil::Date>().is_ok(),
        "uuid" | "uuid3" | "uuid4" | "uuid5" => {
            let parts: Vec<&str> = s.split('-').collect();
            parts.len() == 5 && parts.iter().zip([8, 4, 4, 4, 12]).all(|(p, n)| p.len() == n && hex(p))
        }
        "ipv4" => s.parse::<std::net::Ipv4Addr>().is_ok(),
        "ipv6" => s.parse::<std::net::Ipv6Addr>().is_ok(),
        "cidr" => s.split_once('/').is_some_and(|(ip, bits)| {
            let max = if ip.parse::<std::net::Ipv4Addr>().is_ok() {
                32
            } else if ip.parse::<std::net::Ipv6Addr>().is_ok() {
                128
            } else {
                return false;
            };
            bits.parse::<u8>().is_ok_and(|b| b <= max)
        }),
        "mac" => {
            let parts: Vec<&str> = s.split([':', '-']).collect();
            matches!(parts.len(), 6 | 8 | 20) && parts.iter().all(|p| p.len() == 2 && hex(p))
        }
        "byte" => {
            use base64::Engine;
            base64::engine::general_purpose::STANDARD.decode(s).is_ok()
        }
        "hostname" => {
            !s.is_empty()
                && s.len() <= 253
                && s.trim_end_matches('.').split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                })
        }
        "email" => s.split_once('@').is_some_and(|(a, b)| !a.is_empty() && b.contains('.') && !b.ends_with('.')),
        "uri" => s.split_once(':').is_some_and(|(scheme, _)| {
            !scheme.is_empty()
                && scheme.starts_with(|c: char| c.is_ascii_alphabetic())
                && scheme.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        }),
        "duration" => is_duration(s),
        _ => true,
    }
}

/// Go `time.ParseDuration` syntax (`1h30m`, `250ms`) or strfmt's `3 days` style.
fn is_duration(s: &str) -> bool {
    let s = s.trim();
    if let Some((n, unit)) = s.split_once(' ') {
        return n.parse::<f64>().is_ok()
            && matches!(
                unit.trim_end_matches('s'),
                "ns" | "n"
                    | "us"
                    | "u"
                    | "ms"
                    | "m"
                    | "sec"
                    | "second"
                    | "minute"
                    | "min"
                    | "hour"
                    | "h"
                    | "day"
                    | "d"
                    | "week"
                    | "w"
            );
    }
    let body = s.strip_prefix(['-', '+']).unwrap_or(s);
    if body == "0" {
        return true;
    }
    let mut rest = body;
    let mut any = false;
    while !rest.is_empty() {
        let n = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if n == 0 || rest[..n].parse::<f64>().is_err() {
            return false;
        }
        rest = &rest[n..];
        let u = ["ns", "us", "µs", "ms", "s", "m", "h"].iter().find(|u| rest.starts_with(**u));
        match u {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
        any = true;
    }
    any
}

// ----------------------------------------------------------------------------------------
// The CRD's own schema

/// Checks that a CRD version's schema is structural enough to be served: the root is an
/// object and every specified field and array item has a type (unless it is
/// `x-kubernetes-int-or-string` or `x-kubernetes-preserve-unknown-fields`). Returns
/// errors with the CRD field paths kube-apiserver reports.
pub fn check_structural(schema: &Value, base: &str) -> Vec<FieldError> {
    let mut errs = Vec::new();
    let p = format!("{base}.type");
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {}
        None | Some("") => errs.push(required(&p, "", "must not be empty at the root")),
        Some(t) => errs.push(invalid(&p, "", &Value::from(t), "must be object at the root".into())),
    }
    check_children(schema, base, &mut errs);
    errs
}

fn check_children(s: &Value, base: &str, errs: &mut Vec<FieldError>) {
    if let Some(ps) = props(s) {
        for (k, c) in ps {
            let p = format!("{base}.properties[{k}]");
            check_typed(c, &p, "must not be empty for specified object fields", errs);
            check_children(c, &p, errs);
        }
    }
    if let Some(a) = additional(s) {
        let p = format!("{base}.additionalProperties");
        check_typed(a, &p, "must not be empty for specified object fields", errs);
        check_children(a, &p, errs);
    }
    if let Some(i) = s.get("items").filter(|i| i.is_object()) {
        let p = format!("{base}.items");
        check_typed(i, &p, "must not be empty for specified array items", errs);
        check_children(i, &p, errs);
    }
}

fn check_typed(s: &Value, base: &str, why: &str, errs: &mut Vec<FieldError>) {
    let typed = s.get("type").and_then(Value::as_str).is_some_and(|t| !t.is_empty());
    if !typed && !flag(s, "x-kubernetes-int-or-string") && !flag(s, "x-kubernetes-preserve-unknown-fields") {
        errs.push(required(&format!("{base}.type"), "", why));
    }
}

/// Validates the schemas of a CRD being written (422 for the CRD when one is not
/// structural).
pub fn check_crd(crd: &Value) -> Result<(), ApiError> {
    let mut errs = Vec::new();
    for (i, v) in crd["spec"]["versions"].as_array().into_iter().flatten().enumerate() {
        if let Some(s) = v["schema"].get("openAPIV3Schema").filter(|s| s.is_object()) {
            errs.extend(check_structural(s, &format!("spec.versions[{i}].schema.openAPIV3Schema")));
        }
    }
    if errs.is_empty() {
        return Ok(());
    }
    let name = crd["metadata"]["name"].as_str().unwrap_or("");
    Err(invalid_error("CustomResourceDefinition", "apiextensions.k8s.io", name, &errs))
}

/// The `openAPIV3Schema` of one version of a CRD object, if it declares one.
pub fn version_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd["spec"]["versions"]
        .as_array()?
        .iter()
        .find(|v| v["name"].as_str() == Some(version))
        .and_then(|v| v["schema"].get("openAPIV3Schema"))
        .filter(|s| s.is_object())
}

#[cfg(test)]
mod tests;
