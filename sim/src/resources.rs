//! The resource types the simulated cluster serves: the built-in kinds, plus one entry per
//! served version of every established CustomResourceDefinition.

use std::collections::BTreeMap;

use serde_json::Value;

/// Identifies a resource independent of version: objects of all versions of one CRD
/// share one store, as they share one etcd prefix in a real cluster.
pub type ResKey = String;

/// Builds the store key of a resource.
pub fn res_key(group: &str, plural: &str) -> ResKey {
    format!("{group}/{plural}")
}

/// One served resource (at one group/version).
#[derive(Debug, Clone, PartialEq)]
pub struct ResourceDef {
    pub group: String,
    pub version: String,
    pub plural: String,
    pub singular: String,
    pub kind: String,
    pub namespaced: bool,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    /// Serves `/status` and keeps status out of main-resource writes.
    pub has_status: bool,
    /// `metadata.generation` is maintained (bumped on changes outside metadata and status).
    pub tracks_generation: bool,
    /// Created from a CRD (so deleting the CRD removes it).
    pub from_crd: bool,
    /// Merge keys of lists for strategic merge patch (built-in kinds only).
    pub strategic: bool,
    /// Serves `/scale` (autoscaling/v1 Scale) with these paths.
    pub scale: Option<ScalePaths>,
    /// `additionalPrinterColumns` of a CRD version (server-side Table output).
    pub printer_columns: Vec<PrinterColumn>,
    /// The store key when it differs from `group/plural`: events.k8s.io/v1 Events are the
    /// core v1 Events seen through another API, as in kube-apiserver.
    pub storage: Option<(String, String)>,
}

/// Where a kind keeps the fields of its `/scale` subresource (paths without the leading
/// dot, split at dots: `spec.replicas`).
#[derive(Debug, Clone, PartialEq)]
pub struct ScalePaths {
    pub spec_replicas: String,
    pub status_replicas: String,
    /// Where the label selector (as a string) is; empty when the kind has none.
    pub label_selector: String,
}

/// One `additionalPrinterColumns` entry of a CRD version.
#[derive(Debug, Clone, PartialEq)]
pub struct PrinterColumn {
    pub name: String,
    pub type_: String,
    pub format: String,
    pub description: String,
    pub priority: i64,
    pub json_path: String,
}

impl ResourceDef {
    /// The store key (group/plural).
    pub fn key(&self) -> ResKey {
        match &self.storage {
            Some((g, p)) => res_key(g, p),
            None => res_key(&self.group, &self.plural),
        }
    }

    /// `v1` or `group/version`.
    pub fn api_version(&self) -> String {
        if self.group.is_empty() { self.version.clone() } else { format!("{}/{}", self.group, self.version) }
    }

    /// Verbs advertised in discovery.
    pub fn verbs(&self) -> Vec<&'static str> {
        vec!["create", "delete", "deletecollection", "get", "list", "patch", "update", "watch"]
    }

    /// Short names etc. as they appear in an `APIResourceList`.
    pub fn discovery_entries(&self) -> Vec<Value> {
        let mut main = serde_json::json!({
            "name": self.plural,
            "singularName": self.singular,
            "namespaced": self.namespaced,
            "kind": self.kind,
            "verbs": self.verbs(),
        });
        if !self.short_names.is_empty() {
            main["shortNames"] = serde_json::json!(self.short_names);
        }
        if !self.categories.is_empty() {
            main["categories"] = serde_json::json!(self.categories);
        }
        let mut out = vec![main];
        if self.has_status {
            out.push(serde_json::json!({
                "name": format!("{}/status", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "kind": self.kind,
                "verbs": ["get", "patch", "update"],
            }));
        }
        if self.scale.is_some() {
            out.push(serde_json::json!({
                "name": format!("{}/scale", self.plural),
                "singularName": "",
                "namespaced": self.namespaced,
                "group": "autoscaling",
                "version": "v1",
                "kind": "Scale",
                "verbs": ["get", "patch", "update"],
            }));
        }
        out
    }
}

/// A built-in resource: namespaced, no short names, no status, no generation (the
/// builder methods below add them).
fn builtin(group: &str, version: &str, plural: &str, kind: &str) -> ResourceDef {
    ResourceDef {
        group: group.into(),
        version: version.into(),
        plural: plural.into(),
        singular: kind.to_lowercase(),
        kind: kind.into(),
        namespaced: true,
        short_names: Vec::new(),
        categories: Vec::new(),
        has_status: false,
        tracks_generation: false,
        from_crd: false,
        strategic: true,
        scale: None,
        printer_columns: Vec::new(),
        storage: None,
    }
}

impl ResourceDef {
    fn cluster(mut self) -> Self {
        self.namespaced = false;
        self
    }
    fn short(mut self, s: &[&str]) -> Self {
        self.short_names = s.iter().map(|s| s.to_string()).collect();
        self
    }
    fn status(mut self) -> Self {
        self.has_status = true;
        self
    }
    fn generation(mut self) -> Self {
        self.tracks_generation = true;
        self
    }
    /// In the `all` category (`kubectl get all`).
    fn all(mut self) -> Self {
        self.categories = vec!["all".into()];
        self
    }
    /// Serves `/scale` from `spec.replicas` / `status.replicas` and the `spec.selector`.
    fn scalable(mut self) -> Self {
        self.scale = Some(ScalePaths {
            spec_replicas: "spec.replicas".into(),
            status_replicas: "status.replicas".into(),
            label_selector: "spec.selector".into(),
        });
        self
    }
    fn stored_as(mut self, group: &str, plural: &str) -> Self {
        self.storage = Some((group.into(), plural.into()));
        self
    }
}

/// All resources currently served, in discovery order.
#[derive(Debug, Clone)]
pub struct Registry {
    /// (group, version, plural) -> definition.
    defs: BTreeMap<(String, String, String), ResourceDef>,
    /// Group -> versions in preference order.
    group_versions: Vec<(String, Vec<String>)>,
}

impl Default for Registry {
    fn default() -> Self {
        Self::with_builtins()
    }
}

impl Registry {
    /// The built-in kinds a fresh cluster serves.
    pub fn with_builtins() -> Self {
        let mut r = Registry { defs: BTreeMap::new(), group_versions: Vec::new() };
        for d in [
            builtin("", "v1", "namespaces", "Namespace").cluster().short(&["ns"]).status(),
            builtin("", "v1", "configmaps", "ConfigMap").short(&["cm"]),
            builtin("", "v1", "secrets", "Secret"),
            builtin("", "v1", "serviceaccounts", "ServiceAccount").short(&["sa"]),
            builtin("", "v1", "services", "Service").short(&["svc"]).status().all(),
            builtin("", "v1", "events", "Event").short(&["ev"]),
            builtin("", "v1", "pods", "Pod").short(&["po"]).status().all(),
            builtin("", "v1", "resourcequotas", "ResourceQuota").short(&["quota"]).status(),
            builtin("apps", "v1", "deployments", "Deployment")
                .short(&["deploy"])
                .status()
                .generation()
                .all()
                .scalable(),
            builtin("apps", "v1", "statefulsets", "StatefulSet").short(&["sts"]).status().generation().all().scalable(),
            builtin("apps", "v1", "daemonsets", "DaemonSet").short(&["ds"]).status().generation().all(),
            builtin("apps", "v1", "replicasets", "ReplicaSet").short(&["rs"]).status().generation().all().scalable(),
            builtin("batch", "v1", "jobs", "Job").status().generation().all(),
            builtin("coordination.k8s.io", "v1", "leases", "Lease"),
            builtin("events.k8s.io", "v1", "events", "Event").short(&["ev"]).stored_as("", "events"),
            builtin("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget")
                .short(&["pdb"])
                .status()
                .generation(),
            builtin("networking.k8s.io", "v1", "networkpolicies", "NetworkPolicy").short(&["netpol"]).generation(),
            builtin("rbac.authorization.k8s.io", "v1", "roles", "Role"),
            builtin("rbac.authorization.k8s.io", "v1", "clusterroles", "ClusterRole").cluster(),
            builtin("rbac.authorization.k8s.io", "v1", "rolebindings", "RoleBinding"),
            builtin("rbac.authorization.k8s.io", "v1", "clusterrolebindings", "ClusterRoleBinding").cluster(),
            builtin("apiextensions.k8s.io", "v1", "customresourcedefinitions", "CustomResourceDefinition")
                .cluster()
                .short(&["crd", "crds"])
                .status()
                .generation(),
        ] {
            r.insert(d);
        }
        r
    }

    fn insert(&mut self, d: ResourceDef) {
        match self.group_versions.iter_mut().find(|(g, _)| *g == d.group) {
            Some((_, vs)) => {
                if !vs.contains(&d.version) {
                    vs.push(d.version.clone());
                }
            }
            None => self.group_versions.push((d.group.clone(), vec![d.version.clone()])),
        }
        self.defs.insert((d.group.clone(), d.version.clone(), d.plural.clone()), d);
    }

    /// Looks a resource up by group, version and plural name.
    pub fn get(&self, group: &str, version: &str, plural: &str) -> Option<&ResourceDef> {
        self.defs.get(&(group.to_string(), version.to_string(), plural.to_string()))
    }

    /// Any served version of the store key (used for GC and namespace cleanup).
    pub fn any_version(&self, key: &str) -> Option<&ResourceDef> {
        self.defs.values().find(|d| d.key() == key)
    }

    /// Groups and their versions, preferred first; the core group is `""`.
    pub fn groups(&self) -> &[(String, Vec<String>)] {
        &self.group_versions
    }

    /// Resources of one group/version.
    pub fn resources(&self, group: &str, version: &str) -> Vec<&ResourceDef> {
        self.defs.values().filter(|d| d.group == group && d.version == version).collect()
    }

    /// All distinct store keys of namespaced resources.
    pub fn namespaced_keys(&self) -> Vec<ResKey> {
        let mut v: Vec<ResKey> = self.defs.values().filter(|d| d.namespaced).map(|d| d.key()).collect();
        v.sort();
        v.dedup();
        v
    }

    /// Serves the versions a CRD declares (replacing what it served before).
    /// Returns an error message when the CRD is not well-formed.
    pub fn apply_crd(&mut self, crd: &Value) -> Result<ResKey, String> {
        let spec = &crd["spec"];
        let group = spec["group"].as_str().ok_or("spec.group: Required value")?.to_string();
        let names = &spec["names"];
        let plural = names["plural"].as_str().ok_or("spec.names.plural: Required value")?.to_string();
        let kind = names["kind"].as_str().ok_or("spec.names.kind: Required value")?.to_string();
        let singular = names["singular"].as_str().map(str::to_string).unwrap_or_else(|| kind.to_lowercase());
        let namespaced = match spec["scope"].as_str() {
            Some("Namespaced") => true,
            Some("Cluster") => false,
            _ => return Err("spec.scope: Unsupported value: must be Namespaced or Cluster".into()),
        };
        let strs = |v: &Value| -> Vec<String> {
            v.as_array().map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect()).unwrap_or_default()
        };
        let versions = spec["versions"].as_array().ok_or("spec.versions: Required value")?;
        if versions.is_empty() {
            return Err("spec.versions: Invalid value: must have exactly one version marked as storage version".into());
        }
        self.remove_resource(&group, &plural);
        for v in versions {
            let Some(name) = v["name"].as_str() else { return Err("spec.versions[].name: Required value".into()) };
            if v["served"].as_bool() == Some(false) {
                continue;
            }
            self.insert(ResourceDef {
                group: group.clone(),
                version: name.to_string(),
                plural: plural.clone(),
                singular: singular.clone(),
                kind: kind.clone(),
                namespaced,
                short_names: strs(&names["shortNames"]),
                categories: strs(&names["categories"]),
                has_status: v["subresources"]["status"].is_object(),
                tracks_generation: true,
                from_crd: true,
                strategic: false,
                scale: crd_scale(&v["subresources"]["scale"]),
                printer_columns: crd_columns(v),
                storage: None,
            });
        }
        Ok(res_key(&group, &plural))
    }

    /// Stops serving a resource (all versions). Returns whether anything was served.
    pub fn remove_resource(&mut self, group: &str, plural: &str) -> bool {
        let before = self.defs.len();
        self.defs.retain(|(g, _, p), _| !(g == group && p == plural));
        let removed = before != self.defs.len();
        let defs = &self.defs;
        for (g, vs) in self.group_versions.iter_mut() {
            vs.retain(|v| defs.keys().any(|(dg, dv, _)| dg == g && dv == v));
        }
        self.group_versions.retain(|(_, vs)| !vs.is_empty());
        removed
    }
}

/// `subresources.scale` of a CRD version (paths given as `.spec.replicas`).
fn crd_scale(v: &Value) -> Option<ScalePaths> {
    let path = |k: &str| v[k].as_str().map(|p| p.trim_start_matches('.').to_string());
    Some(ScalePaths {
        spec_replicas: path("specReplicasPath")?,
        status_replicas: path("statusReplicasPath")?,
        label_selector: path("labelSelectorPath").unwrap_or_default(),
    })
}

/// `additionalPrinterColumns` of a CRD version; like apiextensions-apiserver, a version
/// that declares none gets an `Age` column.
fn crd_columns(v: &Value) -> Vec<PrinterColumn> {
    let Some(cols) = v["additionalPrinterColumns"].as_array().filter(|c| !c.is_empty()) else {
        return vec![PrinterColumn {
            name: "Age".into(),
            type_: "date".into(),
            format: String::new(),
            description: String::new(),
            priority: 0,
            json_path: ".metadata.creationTimestamp".into(),
        }];
    };
    cols.iter()
        .map(|c| PrinterColumn {
            name: c["name"].as_str().unwrap_or("").into(),
            type_: c["type"].as_str().unwrap_or("string").into(),
            format: c["format"].as_str().unwrap_or("").into(),
            description: c["description"].as_str().unwrap_or("").into(),
            priority: c["priority"].as_i64().unwrap_or(0),
            json_path: c["jsonPath"].as_str().unwrap_or("").into(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn crd(scope: &str) -> Value {
        json!({"spec": {"group": "example.com", "scope": scope,
            "names": {"plural": "widgets", "kind": "Widget", "shortNames": ["wd"]},
            "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}}},
                         {"name": "v1beta1", "served": false, "storage": false}]}})
    }

    #[test]
    fn crd_serves_declared_versions_only() {
        let mut r = Registry::with_builtins();
        r.apply_crd(&crd("Namespaced")).unwrap();
        let d = r.get("example.com", "v1", "widgets").unwrap();
        assert!(d.namespaced && d.has_status && d.from_crd);
        assert!(r.get("example.com", "v1beta1", "widgets").is_none());
        assert!(r.groups().iter().any(|(g, _)| g == "example.com"));
        assert!(r.remove_resource("example.com", "widgets"));
        assert!(!r.groups().iter().any(|(g, _)| g == "example.com"));
    }

    #[test]
    fn crd_with_bad_scope_is_rejected() {
        let mut r = Registry::with_builtins();
        assert!(r.apply_crd(&crd("Galaxy")).is_err());
    }
}
