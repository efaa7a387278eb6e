//! Server-side printing: answers `Accept: application/json;as=Table;v=v1;g=meta.k8s.io`
//! (what `kubectl get` asks for) with a `meta.k8s.io` `Table`, for GET, LIST and WATCH.
//!
//! Like kube-apiserver, the server always renders every column (it prints "wide") and
//! sends each column's `priority`; kubectl hides priority > 0 columns unless `-o wide`.
//! Custom resources get `Name` plus their version's `additionalPrinterColumns` (or `Age`
//! when none are declared, as apiextensions-apiserver defaults them). Built-in kinds get
//! the columns of kube-apiserver's printers for the common kinds, from the table in
//! [`builtin_columns`], and `Name` + `Created At` otherwise (the default table convertor).

use serde_json::{Value, json};

use crate::resources::{PrinterColumn, ResourceDef};

/// Which object a Table row carries (`includeObject`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IncludeObject {
    /// No object.
    None,
    /// A `PartialObjectMetadata` (the default).
    Metadata,
    /// The whole object.
    Object,
}

impl IncludeObject {
    /// Parses the `includeObject` query parameter (default `Metadata`).
    pub fn parse(v: Option<&str>) -> Result<Self, crate::error::ApiError> {
        match v {
            None | Some("") | Some("Metadata") => Ok(IncludeObject::Metadata),
            Some("Object") => Ok(IncludeObject::Object),
            Some("None") => Ok(IncludeObject::None),
            Some(o) => Err(crate::error::ApiError::bad_request(format!(
                "includeObject: Unsupported value: \"{o}\": supported values: \"Metadata\", \"None\", \"Object\""
            ))),
        }
    }
}

/// How a Table was asked for.
#[derive(Debug, Clone)]
pub struct TableRequest {
    /// `v1` or `v1beta1` of meta.k8s.io.
    pub version: &'static str,
    pub include: IncludeObject,
}

/// One cell renderer of a built-in column.
type CellFn = fn(&Value) -> Value;

/// How a column's cells are computed.
enum Cell {
    Name,
    Builtin(CellFn),
    /// A CRD printer column: JSONPath and type.
    Path(String, String),
}

struct Column {
    name: String,
    type_: String,
    format: String,
    description: String,
    priority: i64,
    cell: Cell,
}

const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although some resources may allow a client to request the generation of an appropriate name automatically. Name is primarily intended for creation idempotence and configuration definition. Cannot be updated. More info: https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";

fn name_column() -> Column {
    Column {
        name: "Name".into(),
        type_: "string".into(),
        format: "name".into(),
        description: NAME_DESCRIPTION.into(),
        priority: 0,
        cell: Cell::Name,
    }
}

/// A built-in column: (name, type, priority, cell).
type Builtin = (&'static str, &'static str, i64, CellFn);

const AGE: Builtin = ("Age", "string", 0, age);
const CONTAINERS: Builtin = ("Containers", "string", 1, |o| json!(template_containers(o, "name")));
const IMAGES: Builtin = ("Images", "string", 1, |o| json!(template_containers(o, "image")));
const SELECTOR: Builtin = ("Selector", "string", 1, |o| json!(label_selector(&o["spec"]["selector"])));
const CREATED_AT: Builtin = ("Created At", "date", 0, created_at);

/// Columns (after Name) of kube-apiserver's printers for the built-in kinds served.
fn builtin_columns(group: &str, plural: &str) -> Vec<Builtin> {
    match (group, plural) {
        ("", "namespaces") => vec![("Status", "string", 0, |o| str_cell(&o["status"]["phase"])), AGE],
        ("", "configmaps") => vec![("Data", "integer", 0, |o| json!(len(&o["data"]) + len(&o["binaryData"]))), AGE],
        ("", "secrets") => vec![
            ("Type", "string", 0, |o| str_cell(&o["type"])),
            ("Data", "integer", 0, |o| json!(len(&o["data"]))),
            AGE,
        ],
        ("", "serviceaccounts") => vec![("Secrets", "integer", 0, |o| json!(len(&o["secrets"]))), AGE],
        ("", "services") => vec![
            ("Type", "string", 0, |o| str_cell(&o["spec"]["type"])),
            ("Cluster-IP", "string", 0, |o| json!(or_none(o["spec"]["clusterIP"].as_str().unwrap_or("")))),
            ("External-IP", "string", 0, service_external_ip),
            ("Port(s)", "string", 0, service_ports),
            AGE,
            ("Selector", "string", 1, |o| json!(or_none(&map_labels(&o["spec"]["selector"])))),
        ],
        ("", "pods") => vec![
            ("Ready", "string", 0, pod_ready),
            ("Status", "string", 0, pod_status),
            ("Restarts", "string", 0, pod_restarts),
            AGE,
            ("IP", "string", 1, |o| json!(or_none(o["status"]["podIP"].as_str().unwrap_or("")))),
            ("Node", "string", 1, |o| json!(or_none(o["spec"]["nodeName"].as_str().unwrap_or("")))),
            ("Nominated Node", "string", 1, |o| {
                json!(or_none(o["status"]["nominatedNodeName"].as_str().unwrap_or("")))
            }),
            ("Readiness Gates", "string", 1, pod_readiness_gates),
        ],
        ("", "events") => vec![
            ("Last Seen", "string", 0, |o| json!(event_times(o).1)),
            ("Type", "string", 0, |o| str_cell(&o["type"])),
            ("Reason", "string", 0, |o| str_cell(&o["reason"])),
            ("Object", "string", 0, event_object),
            ("Subobject", "string", 1, |o| str_cell(&o["involvedObject"]["fieldPath"])),
            ("Source", "string", 1, event_source),
            ("Message", "string", 0, |o| json!(o["message"].as_str().unwrap_or("").trim())),
            ("First Seen", "string", 1, |o| json!(event_times(o).0)),
            ("Count", "integer", 1, event_count),
            ("Name", "string", 1, |o| str_cell(&o["metadata"]["name"])),
        ],
        ("", "resourcequotas") => vec![
            AGE,
            ("Request", "string", 0, |o| json!(quota(o, false))),
            ("Limit", "string", 0, |o| json!(quota(o, true))),
        ],
        ("apps", "deployments") => vec![
            ("Ready", "string", 0, |o| {
                json!(format!("{}/{}", int(&o["status"]["readyReplicas"]), int(&o["spec"]["replicas"])))
            }),
            ("Up-to-date", "integer", 0, |o| json!(int(&o["status"]["updatedReplicas"]))),
            ("Available", "integer", 0, |o| json!(int(&o["status"]["availableReplicas"]))),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ],
        ("apps", "statefulsets") => vec![
            ("Ready", "string", 0, |o| {
                json!(format!("{}/{}", int(&o["status"]["readyReplicas"]), int(&o["spec"]["replicas"])))
            }),
            AGE,
            CONTAINERS,
            IMAGES,
        ],
        ("apps", "daemonsets") => vec![
            ("Desired", "integer", 0, |o| json!(int(&o["status"]["desiredNumberScheduled"]))),
            ("Current", "integer", 0, |o| json!(int(&o["status"]["currentNumberScheduled"]))),
            ("Ready", "integer", 0, |o| json!(int(&o["status"]["numberReady"]))),
            ("Up-to-date", "integer", 0, |o| json!(int(&o["status"]["updatedNumberScheduled"]))),
            ("Available", "integer", 0, |o| json!(int(&o["status"]["numberAvailable"]))),
            ("Node Selector", "string", 0, |o| {
                json!(or_none(&map_labels(&o["spec"]["template"]["spec"]["nodeSelector"])))
            }),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ],
        ("apps", "replicasets") => vec![
            ("Desired", "integer", 0, |o| json!(int(&o["spec"]["replicas"]))),
            ("Current", "integer", 0, |o| json!(int(&o["status"]["replicas"]))),
            ("Ready", "integer", 0, |o| json!(int(&o["status"]["readyReplicas"]))),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ],
        ("batch", "jobs") => vec![
            ("Status", "string", 0, job_status),
            ("Completions", "string", 0, job_completions),
            ("Duration", "string", 0, job_duration),
            AGE,
            CONTAINERS,
            IMAGES,
            SELECTOR,
        ],
        ("coordination.k8s.io", "leases") => {
            vec![("Holder", "string", 0, |o| str_cell(&o["spec"]["holderIdentity"])), AGE]
        }
        ("rbac.authorization.k8s.io", "roles" | "clusterroles") => vec![CREATED_AT],
        ("rbac.authorization.k8s.io", "rolebindings" | "clusterrolebindings") => vec![
            ("Role", "string", 0, |o| {
                json!(format!(
                    "{}/{}",
                    o["roleRef"]["kind"].as_str().unwrap_or(""),
                    o["roleRef"]["name"].as_str().unwrap_or("")
                ))
            }),
            AGE,
            ("Users", "string", 1, |o| json!(subjects(o, "User"))),
            ("Groups", "string", 1, |o| json!(subjects(o, "Group"))),
            ("ServiceAccounts", "string", 1, |o| json!(subjects(o, "ServiceAccount"))),
        ],
        ("policy", "poddisruptionbudgets") => vec![
            ("Min Available", "string", 0, |o| int_or_string_na(&o["spec"]["minAvailable"])),
            ("Max Unavailable", "string", 0, |o| int_or_string_na(&o["spec"]["maxUnavailable"])),
            ("Allowed Disruptions", "integer", 0, |o| json!(int(&o["status"]["disruptionsAllowed"]))),
            AGE,
        ],
        ("networking.k8s.io", "networkpolicies") => {
            vec![("Pod-Selector", "string", 0, |o| json!(label_selector(&o["spec"]["podSelector"]))), AGE]
        }
        _ => vec![CREATED_AT],
    }
}

fn columns(def: &ResourceDef) -> Vec<Column> {
    let group = def.storage.as_ref().map(|(g, _)| g.as_str()).unwrap_or(&def.group);
    let plural = def.storage.as_ref().map(|(_, p)| p.as_str()).unwrap_or(&def.plural);
    // The event printer has no leading name column (its Name column is a wide one).
    let mut out = if (group, plural) == ("", "events") { Vec::new() } else { vec![name_column()] };
    if def.from_crd {
        out.extend(def.printer_columns.iter().map(|c: &PrinterColumn| Column {
            name: c.name.clone(),
            type_: c.type_.clone(),
            format: c.format.clone(),
            description: c.description.clone(),
            priority: c.priority,
            cell: Cell::Path(c.json_path.clone(), c.type_.clone()),
        }));
        return out;
    }
    out.extend(builtin_columns(group, plural).into_iter().map(|(name, ty, priority, f)| Column {
        name: name.into(),
        type_: ty.into(),
        format: String::new(),
        description: String::new(),
        priority,
        cell: Cell::Builtin(f),
    }));
    out
}

/// A `Table` of `objects` (as seen through `def`), with `list_meta` as its metadata.
pub fn table<'a>(
    def: &ResourceDef,
    objects: impl IntoIterator<Item = &'a Value>,
    list_meta: Value,
    req: &TableRequest,
    headers: bool,
) -> Value {
    let cols = columns(def);
    // Events are printed from the core v1 shape, whichever API they are read through.
    let core_events = def.storage.as_ref().is_some_and(|(g, p)| g.is_empty() && p == "events");
    let rows: Vec<Value> = objects
        .into_iter()
        .map(|o| {
            let printed = if core_events { crate::convert::convert(o, "v1") } else { o.clone() };
            let cells: Vec<Value> = cols.iter().map(|c| cell(&c.cell, &printed)).collect();
            let mut row = json!({"cells": cells});
            match req.include {
                IncludeObject::None => {}
                IncludeObject::Object => row["object"] = o.clone(),
                IncludeObject::Metadata => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": "meta.k8s.io/v1",
                        "metadata": o["metadata"],
                    })
                }
            }
            row
        })
        .collect();
    let mut t = json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{}", req.version),
        "metadata": list_meta,
        "rows": rows,
    });
    if headers {
        t["columnDefinitions"] = cols
            .iter()
            .map(|c| {
                json!({"name": c.name, "type": c.type_, "format": c.format, "description": c.description, "priority": c.priority})
            })
            .collect();
    } else {
        t["columnDefinitions"] = json!([]);
    }
    t
}

fn cell(c: &Cell, o: &Value) -> Value {
    match c {
        Cell::Name => str_cell(&o["metadata"]["name"]),
        Cell::Builtin(f) => f(o),
        Cell::Path(path, ty) => match jsonpath_first(o, path) {
            Some(v) => typed_cell(ty, v),
            None => Value::Null,
        },
    }
}

/// A CRD column cell, as apiextensions-apiserver's table convertor renders one value.
fn typed_cell(ty: &str, v: &Value) -> Value {
    match (ty, v) {
        ("integer", Value::Number(n)) => {
            n.as_i64().or_else(|| n.as_f64().map(|f| f as i64)).map_or(Value::Null, |i| json!(i))
        }
        ("number", Value::Number(n)) => n.as_f64().map_or(Value::Null, |f| json!(f)),
        ("boolean", Value::Bool(b)) => json!(b),
        ("date", Value::String(s)) => json!(since(s).unwrap_or_else(|| "<invalid>".into())),
        ("string", Value::String(s)) => json!(s),
        ("string", Value::Null) => Value::Null,
        ("string", Value::Bool(_) | Value::Number(_)) => json!(v.to_string()),
        ("string", other) => json!(other.to_string()),
        _ => Value::Null,
    }
}

/// The first result of a simple JSONPath (`.a.b`, `.a[0].b`, `.a[*].b`,
/// `.a[?(@.type=="Ready")].status`, `\.` in keys), like the CRD table convertor uses.
fn jsonpath_first<'a>(o: &'a Value, path: &str) -> Option<&'a Value> {
    let path = path.trim().trim_start_matches('{').trim_end_matches('}');
    let mut cur: Vec<&Value> = vec![o];
    for seg in split_path(path) {
        let (key, filters) = match seg.find('[') {
            Some(i) => (&seg[..i], &seg[i..]),
            None => (seg.as_str(), ""),
        };
        let key = key.replace("\\.", ".");
        if !key.is_empty() {
            cur = cur.into_iter().filter_map(|v| v.get(&key)).collect();
        }
        let mut rest = filters;
        while let Some(end) = rest.find(']') {
            let sel = &rest[1..end];
            rest = &rest[end + 1..];
            cur = cur
                .into_iter()
                .flat_map(|v| -> Vec<&Value> {
                    let Some(items) = v.as_array() else { return Vec::new() };
                    if sel == "*" {
                        items.iter().collect()
                    } else if let Ok(i) = sel.parse::<i64>() {
                        let i = if i < 0 { items.len() as i64 + i } else { i };
                        usize::try_from(i).ok().and_then(|i| items.get(i)).into_iter().collect()
                    } else if let Some(expr) = sel.strip_prefix("?(@.").and_then(|s| s.strip_suffix(')')) {
                        let Some((field, want)) = expr.split_once("==") else { return Vec::new() };
                        let want = want.trim().trim_matches('"').trim_matches('\'');
                        items
                            .iter()
                            .filter(|it| match &it[field.trim()] {
                                Value::String(s) => s == want,
                                Value::Number(n) => want.parse::<f64>().ok() == n.as_f64(),
                                Value::Bool(b) => want == if *b { "true" } else { "false" },
                                _ => false,
                            })
                            .collect()
                    } else {
                        Vec::new()
                    }
                })
                .collect();
        }
    }
    cur.into_iter().next()
}

/// Splits `.a.b\.c[0].d` into `a`, `b\.c[0]`, `d`.
fn split_path(path: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut cur = String::new();
    let mut chars = path.chars().peekable();
    let mut depth = 0;
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'.') => {
                cur.push('\\');
                cur.push('.');
                chars.next();
            }
            '[' => {
                depth += 1;
                cur.push(c);
            }
            ']' => {
                depth -= 1;
                cur.push(c);
            }
            '.' if depth == 0 => {
                if !cur.is_empty() {
                    out.push(std::mem::take(&mut cur));
                }
            }
            _ => cur.push(c),
        }
    }
    if !cur.is_empty() {
        out.push(cur);
    }
    out
}

fn str_cell(v: &Value) -> Value {
    json!(v.as_str().unwrap_or(""))
}

fn int(v: &Value) -> i64 {
    v.as_i64().unwrap_or(0)
}

fn len(v: &Value) -> usize {
    match v {
        Value::Object(m) => m.len(),
        Value::Array(a) => a.len(),
        _ => 0,
    }
}

fn or_none(s: &str) -> String {
    if s.is_empty() { "<none>".into() } else { s.into() }
}

fn age(o: &Value) -> Value {
    json!(since(o["metadata"]["creationTimestamp"].as_str().unwrap_or("")).unwrap_or_else(|| "<unknown>".into()))
}

fn created_at(o: &Value) -> Value {
    o["metadata"]["creationTimestamp"].clone()
}

/// Kubernetes' `HumanDuration` of the time since an RFC 3339 timestamp (None when it
/// does not parse).
fn since(ts: &str) -> Option<String> {
    let t: jiff::Timestamp = ts.parse().ok()?;
    let secs = jiff::Timestamp::now().as_second() - t.as_second();
    Some(human_duration(secs))
}

/// `k8s.io/apimachinery/pkg/util/duration.HumanDuration`, in whole seconds.
pub fn human_duration(secs: i64) -> String {
    if secs < -1 {
        return "<invalid>".into();
    }
    if secs < 0 {
        return "0s".into();
    }
    if secs < 120 {
        return format!("{secs}s");
    }
    let minutes = secs / 60;
    if minutes < 10 {
        let s = secs % 60;
        return if s == 0 { format!("{minutes}m") } else { format!("{minutes}m{s}s") };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = secs / 3600;
    if hours < 8 {
        let m = minutes % 60;
        return if m == 0 { format!("{hours}h") } else { format!("{hours}h{m}m") };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        let h = hours % 24;
        return if h == 0 { format!("{}d", hours / 24) } else { format!("{}d{}h", hours / 24, h) };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        let dy = (hours / 24) % 365;
        return if dy == 0 { format!("{}y", hours / 24 / 365) } else { format!("{}y{}d", hours / 24 / 365, dy) };
    }
    format!("{}y", hours / 24 / 365)
}

/// `labels.FormatLabels`: `k=v,…` sorted by key.
fn map_labels(v: &Value) -> String {
    let Some(m) = v.as_object() else { return String::new() };
    let mut kv: Vec<String> = m.iter().map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or(""))).collect();
    kv.sort();
    kv.join(",")
}

/// `metav1.FormatLabelSelector`: requirements sorted by key, `<none>` when empty.
fn label_selector(sel: &Value) -> String {
    let mut reqs: Vec<(String, String)> = Vec::new();
    if let Some(m) = sel["matchLabels"].as_object() {
        for (k, v) in m {
            reqs.push((k.clone(), format!("{k}={}", v.as_str().unwrap_or(""))));
        }
    }
    for e in sel["matchExpressions"].as_array().into_iter().flatten() {
        let k = e["key"].as_str().unwrap_or("").to_string();
        let mut vals: Vec<&str> = e["values"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        vals.sort();
        let s = match e["operator"].as_str().unwrap_or("") {
            "In" => format!("{k} in ({})", vals.join(",")),
            "NotIn" => format!("{k} notin ({})", vals.join(",")),
            "Exists" => k.clone(),
            "DoesNotExist" => format!("!{k}"),
            _ => return "<error>".into(),
        };
        reqs.push((k, s));
    }
    reqs.sort();
    or_none(&reqs.into_iter().map(|(_, s)| s).collect::<Vec<_>>().join(","))
}

fn template_containers(o: &Value, field: &str) -> String {
    let spec = if o["kind"] == "Pod" { &o["spec"] } else { &o["spec"]["template"]["spec"] };
    spec["containers"].as_array().into_iter().flatten().filter_map(|c| c[field].as_str()).collect::<Vec<_>>().join(",")
}

fn service_external_ip(o: &Value) -> Value {
    let spec = &o["spec"];
    let external: Vec<&str> = spec["externalIPs"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
    let s = match spec["type"].as_str().unwrap_or("ClusterIP") {
        "ClusterIP" | "NodePort" => or_none(&external.join(",")),
        "LoadBalancer" => {
            let mut ips: Vec<&str> = o["status"]["loadBalancer"]["ingress"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|i| i["ip"].as_str().or(i["hostname"].as_str()))
                .collect();
            ips.extend(external);
            if ips.is_empty() { "<pending>".into() } else { ips.join(",") }
        }
        "ExternalName" => spec["externalName"].as_str().unwrap_or("").to_string(),
        _ => "<unknown>".into(),
    };
    json!(s)
}

fn service_ports(o: &Value) -> Value {
    let ports: Vec<String> = o["spec"]["ports"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| {
            let proto = p["protocol"].as_str().unwrap_or("TCP");
            match p["nodePort"].as_i64().filter(|n| *n != 0) {
                Some(n) => format!("{}:{n}/{proto}", int(&p["port"])),
                None => format!("{}/{proto}", int(&p["port"])),
            }
        })
        .collect();
    json!(or_none(&ports.join(",")))
}

fn pod_ready(o: &Value) -> Value {
    let total = len(&o["spec"]["containers"]);
    let ready =
        o["status"]["containerStatuses"].as_array().into_iter().flatten().filter(|c| c["ready"] == json!(true)).count();
    json!(format!("{ready}/{total}"))
}

fn pod_status(o: &Value) -> Value {
    if o["metadata"]["deletionTimestamp"].is_string() {
        return json!("Terminating");
    }
    let mut reason = o["status"]["phase"].as_str().unwrap_or("").to_string();
    if let Some(r) = o["status"]["reason"].as_str().filter(|r| !r.is_empty()) {
        reason = r.to_string();
    }
    for c in o["status"]["containerStatuses"].as_array().into_iter().flatten() {
        if let Some(r) = c["state"]["waiting"]["reason"].as_str().filter(|r| !r.is_empty()) {
            reason = r.to_string();
        } else if let Some(r) = c["state"]["terminated"]["reason"].as_str().filter(|r| !r.is_empty()) {
            reason = r.to_string();
        }
    }
    json!(reason)
}

fn pod_restarts(o: &Value) -> Value {
    let n: i64 =
        o["status"]["containerStatuses"].as_array().into_iter().flatten().map(|c| int(&c["restartCount"])).sum();
    json!(n.to_string())
}

fn pod_readiness_gates(o: &Value) -> Value {
    let gates = len(&o["spec"]["readinessGates"]);
    if gates == 0 {
        return json!("<none>");
    }
    let conds = o["status"]["conditions"].as_array().cloned().unwrap_or_default();
    let met = o["spec"]["readinessGates"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|g| conds.iter().any(|c| c["type"] == g["conditionType"] && c["status"] == "True"))
        .count();
    json!(format!("{met}/{gates}"))
}

/// (first seen, last seen) of a core v1 Event.
fn event_times(o: &Value) -> (String, String) {
    let ts = |v: &Value| v.as_str().filter(|s| !s.is_empty()).map(|s| since(s).unwrap_or_else(|| "<invalid>".into()));
    let first = ts(&o["firstTimestamp"]).or_else(|| ts(&o["eventTime"])).unwrap_or_else(|| "<unknown>".into());
    let mut last = ts(&o["lastTimestamp"]).unwrap_or_else(|| first.clone());
    if o["series"].is_object() {
        last = ts(&o["series"]["lastObservedTime"]).unwrap_or_else(|| "<unknown>".into());
    }
    (first, last)
}

fn event_object(o: &Value) -> Value {
    let kind = o["involvedObject"]["kind"].as_str().unwrap_or("").to_lowercase();
    match o["involvedObject"]["name"].as_str().filter(|n| !n.is_empty()) {
        Some(n) => json!(format!("{kind}/{n}")),
        None => json!(kind),
    }
}

fn event_source(o: &Value) -> Value {
    let first = |a: &Value, b: &Value| a.as_str().filter(|s| !s.is_empty()).or(b.as_str()).unwrap_or("").to_string();
    let component = first(&o["source"]["component"], &o["reportingComponent"]);
    let host = first(&o["source"]["host"], &o["reportingInstance"]);
    json!(match (component.is_empty(), host.is_empty()) {
        (true, _) => String::new(),
        (false, true) => component,
        (false, false) => format!("{component}, {host}"),
    })
}

fn event_count(o: &Value) -> Value {
    if o["series"].is_object() {
        return json!(int(&o["series"]["count"]));
    }
    json!(int(&o["count"]).max(1))
}

fn quota(o: &Value, limits: bool) -> String {
    let Some(hard) = o["status"]["hard"].as_object().or(o["spec"]["hard"].as_object()) else { return String::new() };
    let mut keys: Vec<&String> = hard.keys().filter(|k| k.starts_with("limits.") == limits).collect();
    keys.sort();
    keys.iter()
        .map(|k| {
            let used = o["status"]["used"][k.as_str()].as_str().unwrap_or("0");
            format!("{k}: {used}/{}", hard[k.as_str()].as_str().unwrap_or(""))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn subjects(o: &Value, kind: &str) -> String {
    o["subjects"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|s| s["kind"] == kind)
        .map(|s| {
            let name = s["name"].as_str().unwrap_or("");
            match s["namespace"].as_str().filter(|_| kind == "ServiceAccount") {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn int_or_string_na(v: &Value) -> Value {
    match v {
        Value::Number(n) => json!(n.to_string()),
        Value::String(s) => json!(s),
        _ => json!("N/A"),
    }
}

fn job_status(o: &Value) -> Value {
    let cond = |t: &str| {
        o["status"]["conditions"].as_array().into_iter().flatten().any(|c| c["type"] == t && c["status"] == "True")
    };
    json!(if cond("Complete") {
        "Complete"
    } else if cond("Failed") {
        "Failed"
    } else if o["metadata"]["deletionTimestamp"].is_string() {
        "Terminating"
    } else if cond("Suspended") || o["spec"]["suspend"] == json!(true) {
        "Suspended"
    } else {
        "Running"
    })
}

fn job_completions(o: &Value) -> Value {
    let succeeded = int(&o["status"]["succeeded"]);
    json!(match o["spec"]["completions"].as_i64() {
        Some(c) => format!("{succeeded}/{c}"),
        None => match o["spec"]["parallelism"].as_i64().filter(|p| *p > 1) {
            Some(p) => format!("{succeeded}/1 of {p}"),
            None => format!("{succeeded}/1"),
        },
    })
}

fn job_duration(o: &Value) -> Value {
    let parse = |v: &Value| v.as_str().and_then(|s| s.parse::<jiff::Timestamp>().ok());
    let Some(start) = parse(&o["status"]["startTime"]) else { return json!("") };
    let end = parse(&o["status"]["completionTime"]).unwrap_or_else(jiff::Timestamp::now);
    json!(human_duration(end.as_second() - start.as_second()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::resources::Registry;

    #[test]
    fn human_durations_match_kubernetes() {
        for (s, want) in [
            (5, "5s"),
            (119, "119s"),
            (120, "2m"),
            (150, "2m30s"),
            (700, "11m"),
            (3 * 3600, "3h"),
            (3 * 3600 + 600, "3h10m"),
            (20 * 3600, "20h"),
            (3 * 86400 + 3600, "3d1h"),
            (30 * 86400, "30d"),
            (3 * 365 * 86400, "3y"),
        ] {
            assert_eq!(human_duration(s), want, "{s}");
        }
    }

    #[test]
    fn jsonpath_cells() {
        let o = json!({"spec": {"replicas": 3, "items": [{"n": "a"}, {"n": "b"}]},
            "status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]},
            "metadata": {"labels": {"app.kubernetes.io/name": "x"}}});
        assert_eq!(jsonpath_first(&o, ".spec.replicas"), Some(&json!(3)));
        assert_eq!(jsonpath_first(&o, ".spec.items[1].n"), Some(&json!("b")));
        assert_eq!(jsonpath_first(&o, ".spec.items[*].n"), Some(&json!("a")));
        assert_eq!(jsonpath_first(&o, r#".status.conditions[?(@.type=="Ready")].status"#), Some(&json!("True")));
        assert_eq!(jsonpath_first(&o, r".metadata.labels.app\.kubernetes\.io/name"), Some(&json!("x")));
        assert_eq!(jsonpath_first(&o, ".spec.missing"), None);
        assert_eq!(typed_cell("integer", &json!(3)), json!(3));
        assert_eq!(typed_cell("string", &json!(3)), json!("3"));
        assert_eq!(typed_cell("boolean", &json!("x")), Value::Null);
    }

    #[test]
    fn deployment_table_has_kube_columns_with_priorities() {
        let reg = Registry::with_builtins();
        let def = reg.get("apps", "v1", "deployments").unwrap();
        let d = json!({"kind": "Deployment", "metadata": {"name": "web", "creationTimestamp": "2020-01-01T00:00:00Z"},
            "spec": {"replicas": 3, "selector": {"matchLabels": {"app": "web"}},
                     "template": {"spec": {"containers": [{"name": "c", "image": "nginx:1"}]}}},
            "status": {"readyReplicas": 2, "updatedReplicas": 3, "availableReplicas": 2}});
        let t = table(def, [&d], json!({}), &TableRequest { version: "v1", include: IncludeObject::Metadata }, true);
        let names: Vec<&str> =
            t["columnDefinitions"].as_array().unwrap().iter().map(|c| c["name"].as_str().unwrap()).collect();
        assert_eq!(names, ["Name", "Ready", "Up-to-date", "Available", "Age", "Containers", "Images", "Selector"]);
        assert_eq!(t["columnDefinitions"][5]["priority"], 1);
        let cells = &t["rows"][0]["cells"];
        assert_eq!(cells[0], "web");
        assert_eq!(cells[1], "2/3");
        assert_eq!(cells[2], 3);
        assert!(cells[4].as_str().unwrap().ends_with('d') || cells[4].as_str().unwrap().ends_with('y'));
        assert_eq!(cells[6], "nginx:1");
        assert_eq!(cells[7], "app=web");
        assert_eq!(t["rows"][0]["object"]["kind"], "PartialObjectMetadata");
    }

    #[test]
    fn selectors_format_like_kubernetes() {
        let s = json!({"matchLabels": {"b": "2", "a": "1"},
            "matchExpressions": [{"key": "c", "operator": "In", "values": ["y", "x"]}, {"key": "d", "operator": "DoesNotExist"}]});
        assert_eq!(label_selector(&s), "a=1,b=2,c in (x,y),!d");
        assert_eq!(label_selector(&json!({})), "<none>");
    }
}
