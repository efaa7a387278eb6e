//! Discovery documents: `/version`, `/api`, `/api/v1`, `/apis`, `/apis/G`, `/apis/G/V`,
//! computed from the registry on each request so CRDs appear and disappear at once.
//! Aggregated discovery (`apidiscovery.k8s.io/v2`) is not served: clients that ask for it
//! get the plain documents with `Content-Type: application/json` and fall back.

use serde_json::{Value, json};

use crate::resources::Registry;

/// The Kubernetes version the simulator claims.
pub fn version() -> Value {
    json!({
        "major": "1",
        "minor": "32",
        "gitVersion": "v1.32.0-fleetwatch-sim",
        "gitCommit": "0000000000000000000000000000000000000000",
        "gitTreeState": "clean",
        "buildDate": "2025-01-01T00:00:00Z",
        "goVersion": "go1.23.0",
        "compiler": "gc",
        "platform": "linux/amd64",
    })
}

/// `/api`.
pub fn core_versions(server_addr: &str) -> Value {
    json!({
        "kind": "APIVersions",
        "versions": ["v1"],
        "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": server_addr}],
    })
}

fn group_entry(group: &str, versions: &[String]) -> Value {
    let vs: Vec<Value> =
        versions.iter().map(|v| json!({"groupVersion": format!("{group}/{v}"), "version": v})).collect();
    json!({"name": group, "versions": vs, "preferredVersion": vs.first().cloned().unwrap_or(Value::Null)})
}

/// The review resources served by dedicated handlers rather than the store (group,
/// version, plural, kind): create only, never stored, as in kube-apiserver. Listed so
/// clients that look them up (`kubectl auth whoami`, `kubectl api-resources`) find them.
const REVIEWS: &[(&str, &str, &str, &str)] = &[
    ("authentication.k8s.io", "v1", "selfsubjectreviews", "SelfSubjectReview"),
    ("authorization.k8s.io", "v1", "selfsubjectaccessreviews", "SelfSubjectAccessReview"),
    ("authorization.k8s.io", "v1", "selfsubjectrulesreviews", "SelfSubjectRulesReview"),
];

/// The registry's groups and versions plus those of [`REVIEWS`].
fn groups(reg: &Registry) -> Vec<(String, Vec<String>)> {
    let mut out = reg.groups().to_vec();
    for (g, v, _, _) in REVIEWS {
        match out.iter_mut().find(|(name, _)| name == g) {
            Some((_, vs)) if !vs.iter().any(|x| x == v) => vs.push(v.to_string()),
            Some(_) => {}
            None => out.push((g.to_string(), vec![v.to_string()])),
        }
    }
    out
}

/// `/apis`.
pub fn group_list(reg: &Registry) -> Value {
    let groups: Vec<Value> =
        groups(reg).iter().filter(|(g, _)| !g.is_empty()).map(|(g, vs)| group_entry(g, vs)).collect();
    json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups})
}

/// `/apis/GROUP`, or None when the group is not served.
pub fn group(reg: &Registry, name: &str) -> Option<Value> {
    let all = groups(reg);
    let (g, vs) = all.iter().find(|(g, _)| g == name && !g.is_empty())?;
    let mut e = group_entry(g, vs);
    e["kind"] = json!("APIGroup");
    e["apiVersion"] = json!("v1");
    Some(e)
}

/// `/api/v1` or `/apis/GROUP/VERSION`, or None when not served.
pub fn resource_list(reg: &Registry, group: &str, version: &str) -> Option<Value> {
    let defs = reg.resources(group, version);
    let reviews: Vec<Value> = REVIEWS
        .iter()
        .filter(|(g, v, _, _)| *g == group && *v == version)
        .map(|(_, _, plural, kind)| {
            json!({"name": plural, "singularName": plural.trim_end_matches('s'), "namespaced": false,
                   "kind": kind, "verbs": ["create"]})
        })
        .collect();
    if defs.is_empty() && reviews.is_empty() {
        return None;
    }
    let resources: Vec<Value> = defs.iter().flat_map(|d| d.discovery_entries()).chain(reviews).collect();
    let gv = if group.is_empty() { version.to_string() } else { format!("{group}/{version}") };
    Some(json!({"kind": "APIResourceList", "apiVersion": "v1", "groupVersion": gv, "resources": resources}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_are_discoverable() {
        let r = Registry::with_builtins();
        let core = resource_list(&r, "", "v1").unwrap();
        let names: Vec<&str> =
            core["resources"].as_array().unwrap().iter().filter_map(|x| x["name"].as_str()).collect();
        for n in ["namespaces", "configmaps", "secrets", "serviceaccounts", "services", "events", "namespaces/status"] {
            assert!(names.contains(&n), "{n} missing from {names:?}");
        }
        let groups = group_list(&r);
        let gnames: Vec<&str> =
            groups["groups"].as_array().unwrap().iter().filter_map(|g| g["name"].as_str()).collect();
        for g in ["apps", "coordination.k8s.io", "events.k8s.io", "apiextensions.k8s.io"] {
            assert!(gnames.contains(&g));
        }
        // The reviews kubectl auth uses are discoverable, create only.
        for (g, plural) in [
            ("authentication.k8s.io", "selfsubjectreviews"),
            ("authorization.k8s.io", "selfsubjectaccessreviews"),
            ("authorization.k8s.io", "selfsubjectrulesreviews"),
        ] {
            assert!(group(&r, g).is_some(), "{g}");
            let list = resource_list(&r, g, "v1").unwrap();
            let e = list["resources"].as_array().unwrap().iter().find(|x| x["name"] == plural).cloned();
            assert_eq!(e.map(|e| e["verbs"].clone()), Some(json!(["create"])), "{plural}");
        }
        assert!(group(&r, "nope").is_none());
        assert!(resource_list(&r, "apps", "v2").is_none());
    }
}
