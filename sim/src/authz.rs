//! Who is calling and what they may do: bearer tokens of ServiceAccounts (issued through
//! the TokenRequest API or [`crate::SimCluster::token_for`]), request attributes derived
//! from the URL as kube-apiserver's `RequestInfoFactory` does, RBAC evaluation of the
//! Roles and ClusterRoles bound to the caller, the 403 text kube-apiserver answers, and
//! the `SelfSubjectAccessReview` / `SelfSubjectRulesReview` answers built on the same
//! evaluation (so `kubectl auth can-i` tells the truth about what the sim enforces),
//! impersonation (`kubectl --as`, checked with the `impersonate` verb as kube-apiserver
//! does) and the `SelfSubjectReview` `kubectl auth whoami` reads.
//!
//! The default ClusterRoles a real cluster bootstraps (`cluster-admin`, `admin`, `edit`,
//! `view`, `system:discovery`, `system:basic-user`, `system:public-info-viewer`) and their
//! bindings to `system:masters` / `system:authenticated` are built in: a stored
//! ClusterRole of the same name takes precedence.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use crate::error::ApiError;
use crate::store::State;

/// The authenticated caller.
#[derive(Debug, Clone, PartialEq)]
pub struct User {
    /// `admin` for the cluster's own token, `system:serviceaccount:NS:NAME` for a ServiceAccount.
    pub name: String,
    /// Groups, always including `system:authenticated`.
    pub groups: Vec<String>,
    /// uid of the ServiceAccount, empty for the admin.
    pub uid: String,
}

impl User {
    /// The holder of the cluster's own bearer token (member of `system:masters`).
    pub fn admin() -> User {
        User {
            name: "admin".into(),
            groups: vec!["system:masters".into(), "system:authenticated".into()],
            uid: String::new(),
        }
    }

    /// A ServiceAccount's identity with the groups kube-apiserver gives it.
    pub fn service_account(ns: &str, name: &str, uid: &str) -> User {
        User {
            name: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".into(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".into(),
            ],
            uid: uid.to_string(),
        }
    }
}

/// Store key of ServiceAccounts.
const SERVICEACCOUNTS: &str = "/serviceaccounts";

/// One issued ServiceAccount token.
#[derive(Debug, Clone)]
struct Issued {
    namespace: String,
    name: String,
    uid: String,
    expires: SystemTime,
}

/// Tokens issued for ServiceAccounts. A token stays valid until it expires or its
/// ServiceAccount is deleted (it is bound to the account's uid, like a bound token).
#[derive(Debug, Default)]
pub struct Tokens {
    issued: HashMap<String, Issued>,
}

impl Tokens {
    /// Issues a token for an existing ServiceAccount; Err(404) when it does not exist.
    pub fn issue(&mut self, st: &State, ns: &str, name: &str, ttl: Duration) -> Result<(String, SystemTime), ApiError> {
        let sa = st
            .get(SERVICEACCOUNTS, &(ns.to_string(), name.to_string()))
            .ok_or_else(|| ApiError::not_found("", "serviceaccounts", name))?;
        let uid = sa["metadata"]["uid"].as_str().unwrap_or("").to_string();
        let b: [u8; 24] = rand::random();
        let token = format!("fwsa.{}", hex::encode(b));
        let expires = SystemTime::now() + ttl;
        self.issued.insert(token.clone(), Issued { namespace: ns.to_string(), name: name.to_string(), uid, expires });
        Ok((token, expires))
    }

    /// The ServiceAccount a token authenticates, if it is valid now.
    pub fn authenticate(&self, st: &State, token: &str) -> Option<User> {
        let t = self.issued.get(token)?;
        if SystemTime::now() >= t.expires {
            return None;
        }
        let sa = st.get(SERVICEACCOUNTS, &(t.namespace.clone(), t.name.clone()))?;
        (sa["metadata"]["uid"].as_str() == Some(t.uid.as_str()))
            .then(|| User::service_account(&t.namespace, &t.name, &t.uid))
    }
}

/// What a request asks to do, as RBAC sees it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Attributes {
    pub verb: String,
    pub resource_request: bool,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path (for non-resource requests).
    pub path: String,
}

/// Request attributes from method, path and query, following kube-apiserver's
/// `RequestInfoFactory` (list/watch/deletecollection on collections, namespace
/// subresources, non-resource URLs for everything outside `/api/v1/…` and `/apis/G/V/…`).
pub fn attributes(method: &str, path: &str, watch: bool, field_selector_name: Option<&str>) -> Attributes {
    let parts: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let verb = match method {
        "POST" => "create",
        "GET" | "HEAD" => "get",
        "PUT" => "update",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => return Attributes { verb: other.to_lowercase(), path: path.to_string(), ..Default::default() },
    };
    let (group, rest) = match parts.as_slice() {
        ["api", _v, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", g, _v, rest @ ..] if !rest.is_empty() => (*g, rest),
        _ => {
            return Attributes { verb: method.to_lowercase(), path: path.to_string(), ..Default::default() };
        }
    };
    let mut a = Attributes {
        verb: verb.into(),
        resource_request: true,
        group: group.into(),
        path: path.to_string(),
        ..Default::default()
    };
    let mut cur: &[&str] = rest;
    if cur[0] == "namespaces" && cur.len() > 1 {
        a.namespace = cur[1].to_string();
        if cur.len() > 2 && !matches!(cur[2], "status" | "finalize") {
            cur = &cur[2..];
        }
    }
    a.resource = cur[0].to_string();
    if let Some(n) = cur.get(1) {
        a.name = n.to_string();
    }
    if let Some(s) = cur.get(2) {
        a.subresource = s.to_string();
    }
    if a.name.is_empty() && a.verb == "get" {
        a.verb = if watch { "watch" } else { "list" }.into();
        if let Some(n) = field_selector_name {
            a.name = n.to_string();
        }
    }
    if a.name.is_empty() && a.verb == "delete" {
        a.verb = "deletecollection".into();
    }
    a
}

/// RBAC group `rbac.authorization.k8s.io` store keys.
const ROLES: &str = "rbac.authorization.k8s.io/roles";
const ROLEBINDINGS: &str = "rbac.authorization.k8s.io/rolebindings";
const CLUSTERROLES: &str = "rbac.authorization.k8s.io/clusterroles";
const CLUSTERROLEBINDINGS: &str = "rbac.authorization.k8s.io/clusterrolebindings";

fn rule(groups: &[&str], resources: &[&str], verbs: &[&str]) -> Value {
    json!({"apiGroups": groups, "resources": resources, "verbs": verbs})
}

const READ: &[&str] = &["get", "list", "watch"];
const WRITE: &[&str] = &["create", "delete", "deletecollection", "patch", "update"];

/// The rules of the default ClusterRoles a cluster bootstraps (abridged to the kinds a
/// cluster commonly serves).
pub fn bootstrap_cluster_role(name: &str) -> Option<Vec<Value>> {
    let core_ro = [
        "configmaps",
        "endpoints",
        "events",
        "limitranges",
        "persistentvolumeclaims",
        "pods",
        "pods/log",
        "pods/status",
        "replicationcontrollers",
        "replicationcontrollers/scale",
        "resourcequotas",
        "serviceaccounts",
        "services",
        "services/status",
        "namespaces",
        "namespaces/status",
    ];
    let apps = [
        "controllerrevisions",
        "daemonsets",
        "deployments",
        "deployments/scale",
        "deployments/status",
        "replicasets",
        "replicasets/scale",
        "statefulsets",
        "statefulsets/scale",
    ];
    let editable_core = [
        "configmaps",
        "endpoints",
        "persistentvolumeclaims",
        "pods",
        "replicationcontrollers",
        "replicationcontrollers/scale",
        "secrets",
        "serviceaccounts",
        "services",
        "services/proxy",
    ];
    let view = vec![
        rule(&[""], &core_ro, READ),
        rule(&["apps"], &apps, READ),
        rule(&["batch"], &["cronjobs", "jobs"], READ),
        rule(&["policy"], &["poddisruptionbudgets"], READ),
        rule(&["networking.k8s.io"], &["ingresses", "networkpolicies"], READ),
        rule(&["autoscaling"], &["horizontalpodautoscalers"], READ),
    ];
    let edit = || {
        let mut r = view.clone();
        // As upstream: the service proxy is edit's, not view's (it reaches into workloads).
        r.push(rule(&[""], &["secrets", "services/proxy"], READ));
        r.push(rule(&[""], &editable_core, WRITE));
        r.push(rule(&["apps"], &apps, WRITE));
        r.push(rule(&["batch"], &["cronjobs", "jobs"], WRITE));
        r.push(rule(&["policy"], &["poddisruptionbudgets"], WRITE));
        r.push(rule(&["networking.k8s.io"], &["ingresses", "networkpolicies"], WRITE));
        r.push(rule(&["autoscaling"], &["horizontalpodautoscalers"], WRITE));
        r.push(rule(
            &["coordination.k8s.io"],
            &["leases"],
            &["get", "list", "watch", "create", "delete", "patch", "update"],
        ));
        r
    };
    Some(match name {
        "cluster-admin" => vec![rule(&["*"], &["*"], &["*"]), json!({"nonResourceURLs": ["*"], "verbs": ["*"]})],
        "view" => view,
        "edit" => edit(),
        "admin" => {
            let mut r = edit();
            r.push(rule(&["rbac.authorization.k8s.io"], &["rolebindings", "roles"], &["*"]));
            r.push(rule(&["authorization.k8s.io"], &["localsubjectaccessreviews"], &["create"]));
            r
        }
        "system:discovery" => vec![json!({"nonResourceURLs": [
            "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*", "/readyz", "/version", "/version/"
        ], "verbs": ["get"]})],
        "system:public-info-viewer" => vec![json!({"nonResourceURLs": [
            "/healthz", "/livez", "/readyz", "/version", "/version/"
        ], "verbs": ["get"]})],
        "system:basic-user" => vec![
            rule(&["authorization.k8s.io"], &["selfsubjectaccessreviews", "selfsubjectrulesreviews"], &["create"]),
            rule(&["authentication.k8s.io"], &["selfsubjectreviews"], &["create"]),
        ],
        _ => return None,
    })
}

/// The default ClusterRoleBindings: (binding name, role, group).
const BOOTSTRAP_BINDINGS: &[(&str, &str, &str)] = &[
    ("cluster-admin", "cluster-admin", "system:masters"),
    ("system:discovery", "system:discovery", "system:authenticated"),
    ("system:basic-user", "system:basic-user", "system:authenticated"),
    ("system:public-info-viewer", "system:public-info-viewer", "system:authenticated"),
];

fn strs(v: &Value) -> impl Iterator<Item = &str> {
    v.as_array().into_iter().flatten().filter_map(Value::as_str)
}

fn has(v: &Value, want: &str) -> bool {
    strs(v).any(|s| s == want || s == "*")
}

fn subject_matches(s: &Value, user: &User, binding_ns: &str) -> bool {
    let name = s["name"].as_str().unwrap_or("");
    match s["kind"].as_str() {
        Some("User") => name == user.name,
        Some("Group") => user.groups.iter().any(|g| g == name),
        Some("ServiceAccount") => {
            let ns = s["namespace"].as_str().filter(|n| !n.is_empty()).unwrap_or(binding_ns);
            user.name == format!("system:serviceaccount:{ns}:{name}")
        }
        _ => false,
    }
}

fn cluster_role_rules(st: &State, name: &str) -> Vec<Value> {
    match st.get(CLUSTERROLES, &(String::new(), name.to_string())) {
        Some(r) => r["rules"].as_array().cloned().unwrap_or_default(),
        None => bootstrap_cluster_role(name).unwrap_or_default(),
    }
}

/// A rule granted to the user and where it comes from (for `reason`).
struct Grant {
    rule: Value,
    source: String,
}

/// Every rule that applies to `user` for requests in `namespace` ("" = cluster scope).
fn grants(st: &State, user: &User, namespace: &str) -> Vec<Grant> {
    let mut out = Vec::new();
    let user_desc = if user.name.starts_with("system:serviceaccount:") {
        format!("ServiceAccount \"{}\"", user.name.rsplit(':').next().unwrap_or(""))
    } else {
        format!("User \"{}\"", user.name)
    };
    let mut push = |rules: Vec<Value>, source: String| {
        out.extend(rules.into_iter().map(|rule| Grant { rule, source: source.clone() }));
    };
    for (bname, role, group) in BOOTSTRAP_BINDINGS {
        let stored = st.get(CLUSTERROLEBINDINGS, &(String::new(), bname.to_string())).is_some();
        if !stored && user.groups.iter().any(|g| g == group) {
            push(
                cluster_role_rules(st, role),
                format!("ClusterRoleBinding \"{bname}\" of ClusterRole \"{role}\" to Group \"{group}\""),
            );
        }
    }
    for (_, b) in st.all(CLUSTERROLEBINDINGS) {
        if b["roleRef"]["kind"] != "ClusterRole" {
            continue;
        }
        if strs_obj(&b["subjects"]).any(|s| subject_matches(s, user, "")) {
            let role = b["roleRef"]["name"].as_str().unwrap_or("");
            let bname = b["metadata"]["name"].as_str().unwrap_or("");
            push(
                cluster_role_rules(st, role),
                format!("ClusterRoleBinding \"{bname}\" of ClusterRole \"{role}\" to {user_desc}"),
            );
        }
    }
    if namespace.is_empty() {
        return out;
    }
    for ((ns, _), b) in st.all(ROLEBINDINGS) {
        if ns != namespace || !strs_obj(&b["subjects"]).any(|s| subject_matches(s, user, ns)) {
            continue;
        }
        let role = b["roleRef"]["name"].as_str().unwrap_or("");
        let kind = b["roleRef"]["kind"].as_str().unwrap_or("");
        let rules = match kind {
            "Role" => st
                .get(ROLES, &(ns.clone(), role.to_string()))
                .and_then(|r| r["rules"].as_array().cloned())
                .unwrap_or_default(),
            "ClusterRole" => cluster_role_rules(st, role),
            _ => continue,
        };
        let bname = b["metadata"]["name"].as_str().unwrap_or("");
        push(rules, format!("RoleBinding \"{bname}/{ns}\" of {kind} \"{role}\" to {user_desc}"));
    }
    out
}

fn strs_obj(v: &Value) -> impl Iterator<Item = &Value> {
    v.as_array().into_iter().flatten()
}

/// Whether one PolicyRule allows the request (rbac's `RuleAllows`).
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has(&rule["verbs"], &a.verb) {
        return false;
    }
    if !a.resource_request {
        return strs(&rule["nonResourceURLs"])
            .any(|u| u == "*" || u == a.path || (u.ends_with('*') && a.path.starts_with(u.trim_end_matches('*'))));
    }
    if !has(&rule["apiGroups"], &a.group) {
        return false;
    }
    let combined =
        if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
    let resource_ok = strs(&rule["resources"]).any(|r| {
        r == "*" || r == combined || (!a.subresource.is_empty() && r.strip_prefix("*/") == Some(a.subresource.as_str()))
    });
    if !resource_ok {
        return false;
    }
    let names: Vec<&str> = strs(&rule["resourceNames"]).collect();
    names.is_empty() || names.contains(&a.name.as_str())
}

/// The reason a request is allowed, or None when RBAC denies it.
pub fn authorize(st: &State, user: &User, a: &Attributes) -> Option<String> {
    let ns = if a.resource_request { a.namespace.as_str() } else { "" };
    grants(st, user, ns).into_iter().find(|g| rule_allows(&g.rule, a)).map(|g| format!("RBAC: allowed by {}", g.source))
}

/// kube-apiserver's 403 for a denied request.
pub fn forbidden(user: &User, a: &Attributes) -> ApiError {
    let (message, details) = if !a.resource_request {
        (format!("forbidden: User \"{}\" cannot {} path \"{}\"", user.name, a.verb, a.path), None)
    } else {
        let resource =
            if a.subresource.is_empty() { a.resource.clone() } else { format!("{}/{}", a.resource, a.subresource) };
        let scope = if a.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", a.namespace)
        };
        let why = format!(
            "User \"{}\" cannot {} resource \"{resource}\" in API group \"{}\" {scope}",
            user.name, a.verb, a.group
        );
        let qualified = if a.group.is_empty() { a.resource.clone() } else { format!("{}.{}", a.resource, a.group) };
        let message = if a.name.is_empty() {
            format!("{qualified} is forbidden: {why}")
        } else {
            format!("{qualified} \"{}\" is forbidden: {why}", a.name)
        };
        let mut d = json!({"kind": a.resource});
        if !a.group.is_empty() {
            d["group"] = json!(a.group);
        }
        if !a.name.is_empty() {
            d["name"] = json!(a.name);
        }
        (message, Some(d))
    };
    ApiError { code: 403, reason: "Forbidden", message, details }
}

/// The impersonation headers of a request (`Impersonate-User`, `Impersonate-Group`,
/// `Impersonate-Uid`, `Impersonate-Extra-*`), as kubectl's `--as`, `--as-group` and
/// `--as-uid` send them.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Impersonation {
    /// `Impersonate-User`.
    pub user: Option<String>,
    /// Every `Impersonate-Group`.
    pub groups: Vec<String>,
    /// `Impersonate-Uid`.
    pub uid: Option<String>,
    /// Whether any `Impersonate-Extra-*` header was sent (not supported: refused).
    pub extra: bool,
}

impl Impersonation {
    /// Whether the request asks to act as someone else at all.
    pub fn requested(&self) -> bool {
        self.user.is_some() || !self.groups.is_empty() || self.uid.is_some() || self.extra
    }
}

/// The user a request acts as, following kube-apiserver's `WithImpersonation` filter:
/// the caller needs the `impersonate` verb on `users` (or `serviceaccounts` NAME in NS for
/// `system:serviceaccount:NS:NAME`), on `groups` for each group and on
/// `uids.authentication.k8s.io` for the uid, each checked by name; a ServiceAccount
/// impersonated without groups gets the groups of a ServiceAccount; everyone but
/// `system:anonymous` gets `system:authenticated`. Without RBAC enforcement every caller
/// may impersonate (the sim then authorizes everything anyway).
pub fn impersonate(st: &State, caller: &User, imp: &Impersonation, enforce: bool) -> Result<User, ApiError> {
    let Some(name) = &imp.user else {
        // kube-apiserver answers this with an internal error (500), not a 400.
        return Err(ApiError::internal(format!(
            "requested impersonation of groups {:?} / uid {:?} without impersonating a user",
            imp.groups, imp.uid
        )));
    };
    if imp.extra {
        // Refused rather than ignored: acting with fewer attributes than asked could
        // answer "allowed" for a request the real cluster would judge differently.
        return Err(ApiError::bad_request(
            "Impersonate-Extra-* headers are not supported by this simulated cluster".to_string(),
        ));
    }
    let check = |a: Attributes| -> Result<(), ApiError> {
        if enforce && authorize(st, caller, &a).is_none() {
            return Err(forbidden(caller, &a));
        }
        Ok(())
    };
    let act = |resource: &str, group: &str, namespace: &str, name: &str| Attributes {
        verb: "impersonate".into(),
        resource_request: true,
        group: group.into(),
        resource: resource.into(),
        namespace: namespace.into(),
        name: name.into(),
        ..Default::default()
    };
    let service_account = name
        .strip_prefix("system:serviceaccount:")
        .and_then(|rest| rest.split_once(':'))
        .filter(|(ns, n)| !ns.is_empty() && !n.is_empty() && !n.contains(':'));
    let mut groups = imp.groups.clone();
    match service_account {
        Some((ns, sa)) => {
            check(act("serviceaccounts", "", ns, sa))?;
            if imp.groups.is_empty() {
                groups = vec!["system:serviceaccounts".into(), format!("system:serviceaccounts:{ns}")];
            }
        }
        None => check(act("users", "", "", name))?,
    }
    for g in &imp.groups {
        check(act("groups", "", "", g))?;
    }
    if let Some(uid) = &imp.uid {
        check(act("uids", "authentication.k8s.io", "", uid))?;
    }
    if name != "system:anonymous" && !groups.iter().any(|g| g == "system:authenticated") {
        groups.push("system:authenticated".into());
    }
    Ok(User { name: name.clone(), groups, uid: imp.uid.clone().unwrap_or_default() })
}

/// Answers a `SelfSubjectReview` (`kubectl auth whoami`): the attributes of the caller,
/// after impersonation.
pub fn self_review(user: &User) -> Value {
    let mut info = json!({"username": user.name, "groups": user.groups});
    if !user.uid.is_empty() {
        info["uid"] = json!(user.uid);
    }
    json!({
        "kind": "SelfSubjectReview",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "status": {"userInfo": info},
    })
}

/// Answers a `SelfSubjectAccessReview` for `user`. Without RBAC enforcement everyone
/// may do everything, and the answer says so.
pub fn access_review(st: &State, user: &User, review: &Value, enforce: bool) -> Value {
    let spec = &review["spec"];
    let s = |v: &Value, k: &str| v[k].as_str().unwrap_or("").to_string();
    let a = if let Some(ra) = spec.get("resourceAttributes").filter(|v| v.is_object()) {
        Attributes {
            verb: s(ra, "verb"),
            resource_request: true,
            group: s(ra, "group"),
            resource: s(ra, "resource"),
            subresource: s(ra, "subresource"),
            namespace: s(ra, "namespace"),
            name: s(ra, "name"),
            path: String::new(),
        }
    } else {
        let na = &spec["nonResourceAttributes"];
        Attributes { verb: s(na, "verb"), path: s(na, "path"), ..Default::default() }
    };
    let status = if !enforce {
        json!({"allowed": true, "reason": "RBAC is not enforced by this simulated cluster (fleetwatch sim without --rbac)"})
    } else {
        match authorize(st, user, &a) {
            Some(reason) => json!({"allowed": true, "reason": reason}),
            None => json!({"allowed": false}),
        }
    };
    json!({
        "kind": "SelfSubjectAccessReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": spec,
        "status": status,
    })
}

/// Answers a `SelfSubjectRulesReview`: the rules that apply to `user` in the namespace.
pub fn rules_review(st: &State, user: &User, review: &Value, enforce: bool) -> Value {
    let ns = review["spec"]["namespace"].as_str().unwrap_or("");
    let rules: Vec<Value> = if enforce {
        grants(st, user, ns).into_iter().map(|g| g.rule).collect()
    } else {
        bootstrap_cluster_role("cluster-admin").unwrap_or_default()
    };
    let mut resource_rules = Vec::new();
    let mut non_resource_rules = Vec::new();
    for r in rules {
        if r.get("nonResourceURLs").is_some_and(|u| u.as_array().is_some_and(|a| !a.is_empty())) {
            non_resource_rules.push(json!({"verbs": r["verbs"], "nonResourceURLs": r["nonResourceURLs"]}));
        } else {
            let mut rr = json!({"verbs": r["verbs"], "apiGroups": r["apiGroups"], "resources": r["resources"]});
            if r.get("resourceNames").is_some_and(|n| n.as_array().is_some_and(|a| !a.is_empty())) {
                rr["resourceNames"] = r["resourceNames"].clone();
            }
            resource_rules.push(rr);
        }
    }
    json!({
        "kind": "SelfSubjectRulesReview",
        "apiVersion": "authorization.k8s.io/v1",
        "metadata": {"creationTimestamp": null},
        "spec": review["spec"],
        "status": {"resourceRules": resource_rules, "nonResourceRules": non_resource_rules, "incomplete": false},
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn st_with(objs: &[(&str, &str, Value)]) -> State {
        let mut st = State::new(100);
        for (key, ns, o) in objs {
            let name = o["metadata"]["name"].as_str().unwrap().to_string();
            st.commit(key, (ns.to_string(), name), Some(o.clone()), None);
        }
        st
    }

    fn sa() -> User {
        User::service_account("team", "bot", "u1")
    }

    #[test]
    fn request_attributes_follow_request_info() {
        let a = attributes("GET", "/apis/apps/v1/namespaces/team/deployments", false, None);
        assert_eq!(
            (a.verb.as_str(), a.group.as_str(), a.resource.as_str(), a.namespace.as_str()),
            ("list", "apps", "deployments", "team")
        );
        let a = attributes("GET", "/api/v1/pods", true, None);
        assert_eq!((a.verb.as_str(), a.namespace.as_str()), ("watch", ""));
        let a = attributes("PUT", "/apis/apps/v1/namespaces/team/deployments/web/scale", false, None);
        assert_eq!((a.verb.as_str(), a.name.as_str(), a.subresource.as_str()), ("update", "web", "scale"));
        let a = attributes("PUT", "/api/v1/namespaces/team/finalize", false, None);
        assert_eq!((a.resource.as_str(), a.name.as_str(), a.subresource.as_str()), ("namespaces", "team", "finalize"));
        let a = attributes("DELETE", "/api/v1/namespaces/team/configmaps", false, None);
        assert_eq!(a.verb, "deletecollection");
        let a = attributes("GET", "/apis/apps/v1", false, None);
        assert!(!a.resource_request && a.verb == "get" && a.path == "/apis/apps/v1");
    }

    #[test]
    fn role_binding_grants_only_in_its_namespace_and_subresources_are_separate() {
        let st = st_with(&[
            (
                "rbac.authorization.k8s.io/roles",
                "team",
                json!({"metadata": {"name": "r", "namespace": "team"},
                "rules": [{"apiGroups": ["apps"], "resources": ["deployments"], "verbs": ["get", "list"]},
                          {"apiGroups": [""], "resources": ["configmaps"], "resourceNames": ["cfg"], "verbs": ["*"]}]}),
            ),
            (
                "rbac.authorization.k8s.io/rolebindings",
                "team",
                json!({"metadata": {"name": "b", "namespace": "team"},
                "roleRef": {"kind": "Role", "name": "r", "apiGroup": "rbac.authorization.k8s.io"},
                "subjects": [{"kind": "ServiceAccount", "name": "bot"}]}),
            ),
        ]);
        let ok = |m: &str, p: &str| authorize(&st, &sa(), &attributes(m, p, false, None)).is_some();
        assert!(ok("GET", "/apis/apps/v1/namespaces/team/deployments"));
        assert!(ok("GET", "/apis/apps/v1/namespaces/team/deployments/web"));
        assert!(!ok("GET", "/apis/apps/v1/deployments"), "a Role does not grant across namespaces");
        assert!(!ok("GET", "/apis/apps/v1/namespaces/other/deployments"));
        assert!(!ok("GET", "/apis/apps/v1/namespaces/team/deployments/web/scale"));
        assert!(!ok("DELETE", "/apis/apps/v1/namespaces/team/deployments/web"));
        assert!(ok("DELETE", "/api/v1/namespaces/team/configmaps/cfg"));
        assert!(!ok("DELETE", "/api/v1/namespaces/team/configmaps/other"));
        assert!(!ok("GET", "/api/v1/namespaces/team/configmaps"), "resourceNames do not grant list");
        assert!(ok("GET", "/apis"), "discovery is open to every authenticated user");
        assert!(!ok("GET", "/metrics"));
        let e = forbidden(&sa(), &attributes("GET", "/apis/apps/v1/namespaces/other/deployments", false, None));
        assert_eq!(
            e.message,
            "deployments.apps is forbidden: User \"system:serviceaccount:team:bot\" cannot list resource \"deployments\" in API group \"apps\" in the namespace \"other\""
        );
        let e = forbidden(&sa(), &attributes("DELETE", "/api/v1/namespaces/team/configmaps/x", false, None));
        assert_eq!(
            e.message,
            "configmaps \"x\" is forbidden: User \"system:serviceaccount:team:bot\" cannot delete resource \"configmaps\" in API group \"\" in the namespace \"team\""
        );
        let e = forbidden(&sa(), &attributes("GET", "/api/v1/nodes", false, None));
        assert!(
            e.message.ends_with("cannot list resource \"nodes\" in API group \"\" at the cluster scope"),
            "{}",
            e.message
        );
    }

    #[test]
    fn cluster_role_bindings_groups_and_wildcards() {
        let st = st_with(&[
            (
                "rbac.authorization.k8s.io/clusterroles",
                "",
                json!({"metadata": {"name": "scaler"},
                "rules": [{"apiGroups": ["*"], "resources": ["*/scale"], "verbs": ["update"]}]}),
            ),
            (
                "rbac.authorization.k8s.io/clusterrolebindings",
                "",
                json!({"metadata": {"name": "all-sa"},
                "roleRef": {"kind": "ClusterRole", "name": "scaler"},
                "subjects": [{"kind": "Group", "name": "system:serviceaccounts"}]}),
            ),
            (
                "rbac.authorization.k8s.io/rolebindings",
                "team",
                json!({"metadata": {"name": "v", "namespace": "team"},
                "roleRef": {"kind": "ClusterRole", "name": "view"},
                "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "team"}]}),
            ),
        ]);
        let ok = |m: &str, p: &str| authorize(&st, &sa(), &attributes(m, p, false, None)).is_some();
        assert!(ok("PUT", "/apis/apps/v1/namespaces/x/deployments/web/scale"));
        assert!(!ok("PUT", "/apis/apps/v1/namespaces/x/deployments/web"));
        assert!(ok("GET", "/api/v1/namespaces/team/pods"), "bootstrap view role");
        assert!(!ok("GET", "/api/v1/namespaces/team/secrets"), "view does not read secrets");
        assert!(authorize(&st, &User::admin(), &attributes("DELETE", "/api/v1/namespaces/x", false, None)).is_some());
        let r = rules_review(&st, &sa(), &json!({"spec": {"namespace": "team"}}), true);
        let rr = r["status"]["resourceRules"].as_array().unwrap();
        assert!(rr.iter().any(|r| r["resources"] == json!(["*/scale"])));
        assert!(
            rr.iter().any(|r| r["verbs"] == json!(["create"]) && r["apiGroups"] == json!(["authorization.k8s.io"]))
        );
        assert!(r["status"]["nonResourceRules"].as_array().unwrap().iter().any(|r| has(&r["nonResourceURLs"], "/api")));
    }

    #[test]
    fn access_review_answers_for_the_caller() {
        let st = st_with(&[]);
        let review = json!({"spec": {"resourceAttributes": {"verb": "create", "group": "apps", "resource": "deployments", "namespace": "default"}}});
        assert_eq!(access_review(&st, &sa(), &review, true)["status"]["allowed"], false);
        assert_eq!(access_review(&st, &sa(), &review, false)["status"]["allowed"], true);
        let admin = access_review(&st, &User::admin(), &review, true);
        assert_eq!(admin["status"]["allowed"], true);
        assert!(admin["status"]["reason"].as_str().unwrap().contains("system:masters"));
    }

    #[test]
    fn tokens_are_bound_to_the_service_account() {
        let mut st = st_with(&[(
            "/serviceaccounts",
            "team",
            json!({"metadata": {"name": "bot", "namespace": "team", "uid": "u1"}}),
        )]);
        let mut t = Tokens::default();
        assert_eq!(t.issue(&st, "team", "nobody", Duration::from_secs(60)).unwrap_err().code, 404);
        let (tok, _) = t.issue(&st, "team", "bot", Duration::from_secs(60)).unwrap();
        assert_eq!(t.authenticate(&st, &tok), Some(sa()));
        assert_eq!(t.authenticate(&st, "fwsa.nope"), None);
        st.commit("/serviceaccounts", ("team".into(), "bot".into()), None, None);
        assert_eq!(t.authenticate(&st, &tok), None, "deleting the account revokes its tokens");
        let (expired, _) = {
            st.commit(
                "/serviceaccounts",
                ("team".into(), "bot".into()),
                Some(json!({"metadata": {"name": "bot", "uid": "u2"}})),
                None,
            );
            t.issue(&st, "team", "bot", Duration::ZERO).unwrap()
        };
        assert_eq!(t.authenticate(&st, &expired), None);
    }
}
