//! `WatchConfig`: what agents watch, as a cluster-scoped custom resource in the control
//! plane (or a file for the embedded default). The hub turns each into a [`WatchSpec`] and
//! pushes the set to every agent.
//!
//! ```
//! use fleetwatch_api::watchconfig::{WatchConfig, WatchConfigSpec, ResourceRef};
//! let wc = WatchConfig::new("deployments", WatchConfigSpec {
//!     resource: ResourceRef { group: "apps".into(), version: "v1".into(), kind: "Deployment".into() },
//!     fields: vec!["spec".into()],
//!     ..WatchConfigSpec::default()
//! });
//! let spec = wc.to_watch_spec().unwrap();
//! assert_eq!((spec.name.as_str(), spec.kind.as_str()), ("deployments", "Deployment"));
//! ```

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use fleetwatch_protocol::message::WatchSpec;
use fleetwatch_protocol::watch::{field_pointer, validate_label_selector};

/// API group of fleetwatch's resources.
pub const GROUP: &str = "operator.fleetwatch.dev";

/// What agents watch.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "WatchConfig",
    plural = "watchconfigs",
    shortname = "wcfg",
    status = "WatchConfigStatus",
    printcolumn = r#"{"name":"Kind","type":"string","jsonPath":".spec.resource.kind"}"#,
    printcolumn = r#"{"name":"Subscriber","type":"string","jsonPath":".spec.subscriber"}"#,
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name":"Clusters","type":"integer","description":"clusters whose agent runs this watch","jsonPath":".status.clusters"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Accepted\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "What fleetwatch agents watch in runtime clusters"
)]
#[serde(rename_all = "camelCase")]
pub struct WatchConfigSpec {
    /// The kind to watch.
    pub resource: ResourceRef,
    /// Only this namespace (all when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Kubernetes label selector, e.g. `app=web,tier!=db`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// What counts as a change: `spec`, `status`, `metadata.labels`,
    /// `metadata.annotations` or JSON pointers like `/spec/replicas`. A change elsewhere is
    /// filtered out in the agent. Default: spec, status, labels and annotations.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub fields: Vec<String>,
    /// JSON pointers copied into each event (at most 16 KiB in all).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub project: Vec<String>,
    /// The subscriber this watch is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
}

/// What the hub made of a WatchConfig (written by the hub; see docs/DESIGN.md).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WatchConfigStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True` when the hub pushes it to agents, `False` with the reason
    /// (`Invalid`, `DuplicateName`) and what is wrong when it does not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::module::Condition>,
    /// Connected clusters whose agent reports running this watch (all hub replicas).
    #[serde(default)]
    pub clusters: u32,
}

/// Group, version and kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ResourceRef {
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

/// Why a WatchConfig cannot be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("WatchConfig {name:?}: {why}")]
pub struct WatchConfigError {
    /// Its name.
    pub name: String,
    /// What is wrong.
    pub why: String,
}

impl WatchConfig {
    /// The wire form, after checking the fields.
    pub fn to_watch_spec(&self) -> Result<WatchSpec, WatchConfigError> {
        let name = self.metadata.name.clone().unwrap_or_default();
        let err = |why: String| WatchConfigError { name: name.clone(), why };
        if name.is_empty() {
            return Err(err("metadata.name is required".into()));
        }
        let s = &self.spec;
        if s.resource.version.is_empty() || s.resource.kind.is_empty() {
            return Err(err("resource.version and resource.kind are required".into()));
        }
        for f in s.fields.iter().chain(&s.project) {
            field_pointer(f).map_err(|e| err(e.to_string()))?;
        }
        if let Some(sel) = &s.label_selector {
            validate_label_selector(sel).map_err(|why| err(format!("labelSelector {sel:?}: {why}")))?;
        }
        Ok(WatchSpec {
            name: name.clone(),
            group: s.resource.group.clone(),
            version: s.resource.version.clone(),
            kind: s.resource.kind.clone(),
            namespace: s.namespace.clone(),
            label_selector: s.label_selector.clone(),
            fields: s.fields.clone(),
            project: s.project.clone(),
            subscriber: s.subscriber.clone(),
        })
    }
}

/// Reads WatchConfig manifests (YAML or JSON, several documents per file) from a directory,
/// checking each ([`WatchConfig::to_watch_spec`]): the first file that cannot be parsed or
/// holds an invalid WatchConfig is the error (the hub's start-up).
pub fn load_dir(dir: &std::path::Path) -> Result<Vec<WatchConfig>, WatchConfigLoadError> {
    let mut out = Vec::new();
    for (path, docs) in read_dir(dir)? {
        let err = |why: String| WatchConfigLoadError { path: path.display().to_string(), why };
        for d in docs.map_err(err)? {
            d.to_watch_spec().map_err(|e| err(e.to_string()))?;
            out.push(d);
        }
    }
    Ok(out)
}

/// The WatchConfig manifests of a directory (`*.yaml`, `*.yml`, `*.json`, in name order),
/// per file: its documents, unchecked, or why the file cannot be read or parsed. Only an
/// unreadable directory is an error.
#[allow(clippy::type_complexity)]
pub fn read_dir(
    dir: &std::path::Path,
) -> Result<Vec<(std::path::PathBuf, Result<Vec<WatchConfig>, String>)>, WatchConfigLoadError> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .map_err(|e| WatchConfigLoadError { path: dir.display().to_string(), why: e.to_string() })?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml" | "json")))
        .collect();
    files.sort();
    Ok(files
        .into_iter()
        .map(|path| {
            let docs = std::fs::read_to_string(&path).map_err(|e| e.to_string()).and_then(|text| {
                if path.extension().is_some_and(|e| e == "json") {
                    serde_json::from_str(&text).map(|d| vec![d]).map_err(|e| e.to_string())
                } else {
                    serde_saphyr::from_multiple(&text).map_err(|e| e.to_string())
                }
            });
            (path, docs)
        })
        .collect())
}

/// A WatchConfig file that cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("{path}: {why}")]
pub struct WatchConfigLoadError {
    /// The file or directory.
    pub path: String,
    /// What is wrong.
    pub why: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::CustomResourceExt;

    #[test]
    fn crd_is_cluster_scoped_in_our_group() {
        let crd = WatchConfig::crd();
        assert_eq!(crd.spec.group, GROUP);
        assert_eq!(crd.spec.scope, "Cluster");
        assert_eq!(crd.spec.names.plural, "watchconfigs");
    }

    #[test]
    fn rejects_bad_specs() {
        let mut wc = WatchConfig::new("x", WatchConfigSpec::default());
        assert!(wc.to_watch_spec().is_err());
        wc.spec.resource = ResourceRef { group: String::new(), version: "v1".into(), kind: "ConfigMap".into() };
        assert!(wc.to_watch_spec().is_ok());
        wc.spec.fields = vec!["spec..x".into()];
        assert!(wc.to_watch_spec().is_err());
        wc.spec.fields = vec!["/spec/~2x".into()];
        let e = wc.to_watch_spec().unwrap_err().to_string();
        assert!(e.contains("RFC 6901") && e.contains('x'), "{e}");
        wc.spec.fields = vec!["spec/replicas".into()];
        assert!(wc.to_watch_spec().unwrap_err().to_string().contains("starts with '/'"));
        wc.spec.fields = vec!["/spec/a~1b".into(), "metadata.labels".into()];
        assert!(wc.to_watch_spec().is_ok());
        for bad in ["app=(web", "env in prod", "a,,b", "-x=y", "app=web!", "Bad_Prefix.io/x=y", "k=v,"] {
            wc.spec.label_selector = Some(bad.into());
            let e = wc.to_watch_spec().unwrap_err().to_string();
            assert!(e.contains("labelSelector") && e.contains('x'), "{bad}: {e}");
        }
        for good in ["app=web", "app.kubernetes.io/name in (a, b),!legacy", "tier!=db,env", "k==v"] {
            wc.spec.label_selector = Some(good.into());
            assert!(wc.to_watch_spec().is_ok(), "{good}");
        }
    }

    #[test]
    fn loads_yaml_and_json_files() {
        let dir = std::env::temp_dir().join(format!("wc-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("a.yaml"),
            "apiVersion: operator.fleetwatch.dev/v1alpha1\nkind: WatchConfig\nmetadata:\n  name: cms\nspec:\n  resource: {version: v1, kind: ConfigMap}\n  fields: [data]\n---\napiVersion: operator.fleetwatch.dev/v1alpha1\nkind: WatchConfig\nmetadata:\n  name: deps\nspec:\n  resource: {group: apps, version: v1, kind: Deployment}\n",
        )
        .unwrap();
        std::fs::write(
            dir.join("b.json"),
            r#"{"apiVersion":"operator.fleetwatch.dev/v1alpha1","kind":"WatchConfig","metadata":{"name":"secrets"},"spec":{"resource":{"version":"v1","kind":"Secret"}}}"#,
        )
        .unwrap();
        let all = load_dir(&dir).unwrap();
        let names: Vec<_> = all.iter().map(|w| w.metadata.name.clone().unwrap()).collect();
        assert_eq!(names, vec!["cms", "deps", "secrets"]);
        std::fs::write(dir.join("c.yaml"), "kind: WatchConfig\nmetadata: {name: bad}\nspec: {resource: {kind: X}}\n")
            .unwrap();
        let e = load_dir(&dir).unwrap_err();
        assert!(e.path.ends_with("c.yaml"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
