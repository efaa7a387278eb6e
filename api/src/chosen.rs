//! Modules chosen in the runtime cluster itself: the cluster-scoped [`Module`] kind
//! (`modules.operator.fleetwatch.dev`, short name `mod`) that the lifecycle operator installs
//! into every runtime cluster, one object per module, named after the module.
//!
//! A user creates one to get the module as managed software; the agent carries the change to
//! the control plane at once and the operator installs the module, writing what it did into
//! the object's status. The modules the control plane's Runtime lists appear here too, as
//! objects with `status.source: central` that a user cannot remove or re-channel. Central
//! configuration takes precedence: the Runtime's `spec.selfService` says which modules users
//! may choose ([`SelfService`]), and a module listed centrally is installed as the Runtime says.
//!
//! ```
//! use fleetwatch_api::chosen::{Module, ModuleSpec};
//! use fleetwatch_api::CustomResourcePolicy;
//! use kube::CustomResourceExt;
//! let m = Module::new("redis", ModuleSpec { channel: Some("fast".into()), ..Default::default() });
//! assert_eq!(m.spec.custom_resource_policy, CustomResourcePolicy::CreateAndDelete);
//! assert_eq!(Module::crd().spec.scope, "Cluster");
//! ```

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::{Condition, CustomResourcePolicy};

/// The finalizer on a user's `Module`: deleting it with `CreateAndDelete` waits until the
/// module's managed resources and the module are gone.
pub const FINALIZER: &str = "operator.fleetwatch.dev/module";
/// The label on the `Module` objects the operator keeps for centrally listed modules.
pub const SOURCE_LABEL: &str = "operator.fleetwatch.dev/source";

/// A module chosen in the runtime cluster (or listed centrally for it).
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "Module",
    plural = "modules",
    shortname = "mod",
    status = "ChosenModuleStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Version","type":"string","description":"the version running","jsonPath":".status.version"}"#,
    printcolumn = r#"{"name":"Channel","type":"string","jsonPath":".status.channel"}"#,
    printcolumn = r#"{"name":"Source","type":"string","description":"who chose it: user (this cluster) or central (the control plane)","jsonPath":".status.source"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.message"}"#,
    doc = "A module this cluster runs as managed software: create one (named after the module) to get it, delete it to remove it"
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSpec {
    /// The release channel (`kubectl get configmap -n kube-public fleetwatch-catalog` lists
    /// them); the channel the control plane gives this cluster when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// What deleting this object does: `CreateAndDelete` (the default) deletes the module's
    /// configuration, waits until no resource it manages is left, then removes the module;
    /// `Ignore` leaves the module installed and no longer managed.
    #[serde(default)]
    pub custom_resource_policy: CustomResourcePolicy,
}

/// Who chose a module.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ChosenBy {
    /// A user of this cluster, with this `Module` object.
    User,
    /// The control plane: the cluster's Runtime lists the module. The object is kept by the
    /// operator; deleting or editing it changes nothing (it is put back).
    Central,
}

impl std::fmt::Display for ChosenBy {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::User => "user",
            Self::Central => "central",
        })
    }
}

/// A chosen module's state, as the runtime cluster's users see it.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ModuleState {
    /// Installed, running the version its channel offers.
    Ready,
    /// Being installed or upgraded.
    Processing,
    /// Held until something else happens (a dependency, a maintenance window, a rollout
    /// wave, an artifact, the manager becoming available): the message says what.
    Waiting,
    /// Failed, or refused (a module nobody offers, one this cluster may not choose, a
    /// channel that does not exist): the message says why; failures are retried.
    Error,
    /// Being removed.
    Deleting,
    /// Runs, but needs attention (e.g. a newer version than its channel's is kept, not
    /// downgraded).
    Warning,
}

impl std::fmt::Display for ModuleState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ready => "Ready",
            Self::Processing => "Processing",
            Self::Waiting => "Waiting",
            Self::Error => "Error",
            Self::Deleting => "Deleting",
            Self::Warning => "Warning",
        })
    }
}

/// What the operator made of a `Module`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ChosenModuleStatus {
    /// The module's state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<ModuleState>,
    /// The version running in this cluster.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// The version the channel (or the control plane's pin) asks for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// The channel in force (the central one for a centrally listed module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// Who chose the module: `user` or `central`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ChosenBy>,
    /// What deleting the object does now (the central policy for a central module).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub custom_resource_policy: Option<CustomResourcePolicy>,
    /// Why, for people: one plain line.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// `Accepted` (whether the choice is taken up, and if not why: `UnknownModule`,
    /// `NotAllowed`, `SelfServiceDisabled`, `UnknownChannel`) and `Ready`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// The generation of the object this status is about.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// What a Runtime's users may choose themselves (`Runtime.spec.selfService`). Central
/// configuration takes precedence: a module the Runtime lists is installed as listed, whatever
/// a user's object says.
///
/// ```
/// use fleetwatch_api::chosen::SelfService;
/// let every = SelfService::default();
/// assert!(every.allows("redis"));
/// let some = SelfService { modules: Some(vec!["keda".into(), "istio-*".into()]), ..Default::default() };
/// assert!(some.allows("istio-gateway") && !some.allows("redis"));
/// let off = SelfService { enabled: false, modules: None };
/// assert!(!off.allows("redis"));
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SelfService {
    /// Whether the cluster's users may choose modules (default true). `false`: their
    /// `Module` objects are refused (their status says so), the central ones still appear.
    #[serde(default = "yes")]
    pub enabled: bool,
    /// Which modules they may choose, as name globs (`*`, `?`): every module the catalog
    /// offers when absent, none when empty.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules: Option<Vec<String>>,
}

fn yes() -> bool {
    true
}

impl Default for SelfService {
    fn default() -> Self {
        Self { enabled: true, modules: None }
    }
}

impl SelfService {
    /// Whether users may choose `module`.
    pub fn allows(&self, module: &str) -> bool {
        self.enabled
            && self
                .modules
                .as_ref()
                .is_none_or(|globs| globs.iter().any(|g| wildmatch::WildMatch::new(g).matches(module)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs_match_whole_names_only() {
        let s = SelfService { modules: Some(vec!["redis".into(), "k?da".into()]), ..Default::default() };
        assert!(s.allows("redis") && s.allows("keda"));
        assert!(!s.allows("redis-extra") && !s.allows("kedaa"));
        assert!(!SelfService { modules: Some(vec![]), ..Default::default() }.allows("redis"));
    }

    #[test]
    fn status_names_are_the_contract() {
        let st = ChosenModuleStatus {
            state: Some(ModuleState::Waiting),
            source: Some(ChosenBy::Central),
            observed_generation: Some(2),
            ..Default::default()
        };
        let v = serde_json::to_value(&st).unwrap();
        assert_eq!(v["state"], "Waiting");
        assert_eq!(v["source"], "central");
        assert_eq!(v["observedGeneration"], 2);
        let spec: ModuleSpec = serde_json::from_str(r#"{"customResourcePolicy":"Ignore"}"#).unwrap();
        assert_eq!(spec.custom_resource_policy, CustomResourcePolicy::Ignore);
    }
}
