//! fleetwatch's Kubernetes API: the custom resources of the control plane (modules, their
//! release metadata, runtimes, maintenance policies, WatchConfigs), the version policy that
//! picks a module's version, and maintenance-window resolution.
//!
//! The lifecycle operator, the hub (WatchConfigs) and the CLI (`crds`, `maintenance`, `up`)
//! share these types without depending on each other.
//!
//! ```
//! use kube::CustomResourceExt;
//! let crd = fleetwatch_api::Runtime::crd();
//! assert_eq!(crd.spec.names.kind, "Runtime");
//! ```

pub mod access_policy;
pub mod chosen;
pub mod config_policy;
pub mod label_selector;
pub mod maintenance;
pub mod module;
pub mod policy;
pub mod summary;
pub mod watchconfig;

pub use module::*;

/// A CRD as it is applied and written out: every `description` reflowed to one line per
/// paragraph (`kubectl explain` wraps a description to the terminal itself and keeps its line
/// breaks, so a doc comment's hard-wrapped lines came out ragged).
///
/// ```
/// use kube::CustomResourceExt;
/// let v = fleetwatch_api::crd_manifest(&fleetwatch_api::chosen::Module::crd()).unwrap();
/// assert_eq!(v["spec"]["names"]["shortNames"][0], "mod");
/// ```
pub fn crd_manifest(
    crd: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
) -> Result<serde_json::Value, serde_json::Error> {
    let mut value = serde_json::to_value(crd)?;
    reflow_descriptions(&mut value);
    Ok(value)
}

/// `text` with the line breaks inside each paragraph (blank-line separated) made spaces:
/// `kubectl explain` wraps a description to the terminal itself and keeps its line breaks,
/// so a doc comment's hard-wrapped lines came out ragged (a line of one word, then the rest).
pub fn reflow(text: &str) -> String {
    text.split("\n\n")
        .map(|p| p.lines().map(str::trim).filter(|l| !l.is_empty()).collect::<Vec<_>>().join(" "))
        .filter(|p| !p.is_empty())
        .collect::<Vec<_>>()
        .join("\n\n")
}

/// Every `description` string in `v` (schemas at any depth, printer columns) reflowed.
pub fn reflow_descriptions(v: &mut serde_json::Value) {
    match v {
        serde_json::Value::Object(map) => {
            for (key, x) in map.iter_mut() {
                match x {
                    // A property named `description` is a schema (an object): walked below.
                    serde_json::Value::String(s) if key == "description" => *s = reflow(s),
                    _ => reflow_descriptions(x),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(reflow_descriptions),
        _ => {}
    }
}
