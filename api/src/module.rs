//! The module lifecycle's custom resources (group `operator.fleetwatch.dev`, namespaced):
//! [`Runtime`] (one per managed cluster), [`ModuleTemplate`] (one immutable module
//! version) and [`ModuleReleaseMeta`] (a module's channels and versions).
//!
//! ```
//! use fleetwatch_api::{Runtime, RuntimeSpec, ModuleEntry};
//! let rt = Runtime::new("eu-1", RuntimeSpec {
//!     channel: Some("fast".into()),
//!     modules: vec![ModuleEntry { name: "redis".into(), ..ModuleEntry::default() }],
//!     ..RuntimeSpec::default()
//! });
//! assert_eq!(rt.cluster_id(), "eu-1");
//! assert!(rt.spec.modules[0].managed);
//! ```

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// The channel used when neither the module entry nor the runtime names one.
pub const DEFAULT_CHANNEL: &str = "regular";

/// One managed runtime cluster and the modules it should have.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "Runtime",
    plural = "runtimes",
    shortname = "rt",
    namespaced,
    status = "RuntimeStatus",
    printcolumn = r#"{"name":"State","type":"string","jsonPath":".status.state"}"#,
    printcolumn = r#"{"name":"Channel","type":"string","jsonPath":".spec.channel"}"#,
    printcolumn = r#"{"name":"Modules","type":"string","description":"modules ready / managed","jsonPath":".status.modulesReady"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A managed runtime cluster and the modules it should have"
)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSpec {
    /// The cluster id in the agent's certificate; defaults to the Runtime's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_id: Option<String>,
    /// Default release channel of its modules (`regular` when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The modules.
    #[serde(default)]
    pub modules: Vec<ModuleEntry>,
    /// Upgrades that need downtime do not wait for a maintenance window.
    #[serde(default)]
    pub skip_maintenance_windows: bool,
    /// This runtime's own maintenance windows; they override the policy.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub maintenance_windows: Vec<crate::maintenance::WindowSpec>,
    /// The MaintenancePolicy (same namespace) whose rules pick this runtime's windows by its
    /// labels `operator.fleetwatch.dev/plan`, `.../region`, `.../platformRegion` and
    /// `.../globalAccountID`; `default` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub maintenance_policy: Option<String>,
    /// The Secret whose `key` holds a kubeconfig reaching the cluster; none means the
    /// cluster the operator runs in. It is read from the namespace the operator keeps
    /// kubeconfigs in (`--kubeconfig-namespace`; the chart's `fleetwatch-runtimes`) or, when
    /// the operator has none, from the Runtime's own namespace; a Secret named in any other
    /// namespace is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kubeconfig_secret: Option<SecretKeyRef>,
    /// What the cluster's users may choose themselves with `Module` objects in their cluster
    /// (every module of the catalog when absent; `enabled: false` turns it off). A module
    /// listed in `modules` here wins over a user's object.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub self_service: Option<crate::chosen::SelfService>,
}

/// A key of a Secret.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct SecretKeyRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace, for saying so explicitly: it must be the namespace the operator
    /// reads kubeconfigs from (see `kubeconfigSecret`); absent means that one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Key in the Secret's data; `config` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub key: Option<String>,
}

/// One module of a runtime.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleEntry {
    /// Module name (a ModuleReleaseMeta's `moduleName`).
    pub name: String,
    /// Release channel of this module; the runtime's channel when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// A pinned version: channel moves are ignored.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
    /// Whether fleetwatch manages the module (default true). `false` unmanages it:
    /// everything stays in the cluster as it is (the module's resources and its
    /// configuration, at the version running) and the operator stops touching it: no
    /// upgrade, no drift repair, no deletion; its status keeps showing what is installed.
    /// Setting it back to true resumes management. Removing the entry instead uninstalls
    /// the module as its `customResourcePolicy` says (`CreateAndDelete` deletes the
    /// configuration, waits for the managed resources to go, then deletes the module;
    /// `Ignore` leaves everything and stops reconciling).
    #[serde(default = "yes")]
    pub managed: bool,
    /// What removing the module does.
    #[serde(default)]
    pub custom_resource_policy: CustomResourcePolicy,
}

fn yes() -> bool {
    true
}

impl Default for ModuleEntry {
    fn default() -> Self {
        Self {
            name: String::new(),
            channel: None,
            version: None,
            managed: true,
            custom_resource_policy: CustomResourcePolicy::default(),
        }
    }
}

/// What removing a module's entry does (`managed: false` never deletes anything).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum CustomResourcePolicy {
    /// Create the default configuration at install; on removal delete it, wait until no
    /// managed resource is left, then delete the module.
    #[default]
    CreateAndDelete,
    /// Leave everything installed and stop reconciling.
    Ignore,
}

/// What the operator observed and did.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeStatus {
    /// The runtime's overall state: the worst of its modules' (their configuration's own
    /// state does not count).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<State>,
    /// Per module.
    #[serde(default)]
    pub modules: Vec<ModuleStatus>,
    /// The generation last reconciled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// When the last reconcile finished.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_reconcile: Option<String>,
    /// Conditions (`Ready`).
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// Modules ready out of those managed, e.g. `2/3` (a printer column).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modules_ready: Option<String>,
}

/// One module's status.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleStatus {
    /// Module name.
    pub name: String,
    /// The channel in force.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<String>,
    /// The version the rules ask for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub desired_version: Option<String>,
    /// The version fleetwatch last applied.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub installed_version: Option<String>,
    /// The version actually running (the manager workload's version label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub actual_version: Option<String>,
    /// State.
    pub state: State,
    /// Why, for people.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Why, for machines: what the module waits for or what was refused, when anything is
    /// (the message says the same for people; nothing matches its text).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<ModuleReason>,
    /// The removal policy in force, kept so it is known after the entry is gone.
    pub custom_resource_policy: CustomResourcePolicy,
    /// Who chose the module: `user` when a `Module` object in the runtime cluster did (and
    /// the Runtime does not list it); absent for modules the Runtime lists.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<crate::chosen::ChosenBy>,
    /// Whether the default configuration was created (it is never created again).
    #[serde(default)]
    pub default_config_created: bool,
    /// The resources fleetwatch applied, to delete them on removal.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<ResourceRef>,
    /// The default configuration's resource.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_config: Option<ResourceRef>,
    /// Kinds whose instances block deletion (from the template).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub managed_resources: Vec<KindRef>,
    /// The maintenance window an upgrade waits for (`begin/end`, RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_maintenance_window: Option<String>,
    /// What ModuleConfigPolicies make of the module's configuration (enforced fields,
    /// validity), when any policy applies.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<crate::config_policy::ModuleConfigStatus>,
    /// While the module's last reconcile failed: which step, how many times in a row, and
    /// when it is tried next (sooner when what it waits for appears in the cluster). Absent
    /// once a reconcile of it succeeds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<ModuleRetry>,
}

/// A failing module's retries: capped exponential backoff with jitter, from about 1 s to at
/// most 5 minutes.
///
/// ```
/// use fleetwatch_api::module::{FailedStep, ModuleRetry};
/// let r = ModuleRetry { step: FailedStep::Apply, failures: 3, next_attempt: "2026-11-27T22:41:05Z".into() };
/// assert_eq!(serde_json::to_value(&r).unwrap()["nextAttempt"], "2026-11-27T22:41:05Z");
/// assert_eq!(FailedStep::Apply.to_string(), "apply");
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleRetry {
    /// The step that failed.
    pub step: FailedStep,
    /// Failed reconciles of the module in a row.
    pub failures: u32,
    /// When the next try is due (RFC 3339).
    pub next_attempt: String,
}

/// The step of a module's reconcile that failed (a retry's reason).
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, JsonSchema)]
pub enum FailedStep {
    /// Choosing the version: no release meta, channel or template for it.
    Resolve,
    /// Reading what runs in the cluster (the manager workload).
    Read,
    /// Getting the version's objects (its artifact refused).
    Pull,
    /// A migration before or after the upgrade.
    Migration,
    /// Applying the module's objects.
    Apply,
    /// Creating the default configuration.
    DefaultConfig,
    /// Deleting the module's objects or configuration.
    Delete,
    /// Reaching the runtime cluster.
    Connect,
    /// The agent's certificate.
    Certificate,
    /// Writing the Runtime (its status or finalizer) in the control plane.
    StatusWrite,
}

impl FailedStep {
    /// The name in metrics and messages (`apply`, `default-config`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Resolve => "resolve",
            Self::Read => "read",
            Self::Pull => "pull",
            Self::Migration => "migration",
            Self::Apply => "apply",
            Self::DefaultConfig => "default-config",
            Self::Delete => "delete",
            Self::Connect => "connect",
            Self::Certificate => "certificate",
            Self::StatusWrite => "status-write",
        }
    }
}

impl std::fmt::Display for FailedStep {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What holds a module back, typed: triggers and Events act on it, the message is for people.
///
/// ```
/// use fleetwatch_api::module::{ModuleReason, ModuleStatus};
/// let st = ModuleStatus { reason: Some(ModuleReason::WaitingForRollout), ..Default::default() };
/// assert!(st.reason.is_some_and(|r| r.waits_for_rollout()));
/// assert_eq!(serde_json::to_value(ModuleReason::DowngradeRefused).unwrap(), "DowngradeRefused");
/// ```
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, Hash, JsonSchema)]
pub enum ModuleReason {
    /// The upgrade waits for its rollout wave or a free place in it (or to record or read
    /// its admission): a change of the rollout's status can let it go.
    WaitingForRollout,
    /// The upgrade needs downtime and waits for the next maintenance window.
    WaitingForMaintenanceWindow,
    /// The version's artifact cannot be had yet (registry unreachable): retried with backoff.
    WaitingForArtifact,
    /// The manager workload does not yet run the desired version, or is not yet available.
    WaitingForManager,
    /// The rules ask for an older version than runs: not applied.
    DowngradeRefused,
    /// An upgrade is held for another reason (the message says which).
    UpgradeHeld,
    /// Removal waits until the module's managed resources are deleted.
    DeletionBlocked,
    /// The version requires another module (`spec.requires` of its ModuleTemplate) that is
    /// not installed and Ready in the runtime yet: nothing of it is applied until it is.
    WaitingForDependency,
    /// Removal waits until no installed module requires this one any more.
    RequiredByOthers,
}

impl ModuleReason {
    /// Whether a change of the module's rollout status can let this one go.
    pub fn waits_for_rollout(self) -> bool {
        self == Self::WaitingForRollout
    }
}

/// States of modules and runtimes.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, JsonSchema)]
pub enum State {
    /// Installed, running the desired version.
    Ready,
    /// Not managed: left as it is.
    Unmanaged,
    /// Being installed or upgraded.
    #[default]
    Processing,
    /// Being removed.
    Deleting,
    /// Needs attention but is not failing (e.g. a downgrade not applied).
    Warning,
    /// Failed.
    Error,
}

impl std::fmt::Display for State {
    /// The name the status shows (`Ready`, `Warning`, ...).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => f.write_str(&name),
            _ => f.write_str("Unknown"),
        }
    }
}

/// A condition, Kubernetes style.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    /// Type.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// Machine-readable reason.
    #[serde(default)]
    pub reason: String,
    /// For people.
    #[serde(default)]
    pub message: String,
    /// When it last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_transition_time: Option<String>,
}

/// A resource in a runtime cluster.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ResourceRef {
    /// apiVersion.
    pub api_version: String,
    /// Kind.
    pub kind: String,
    /// Namespace, for namespaced resources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Name.
    pub name: String,
}

/// A kind.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, Hash, JsonSchema)]
pub struct KindRef {
    /// API group (empty for core).
    #[serde(default)]
    pub group: String,
    /// Version.
    pub version: String,
    /// Kind.
    pub kind: String,
}

impl Runtime {
    /// The cluster id: `spec.clusterId`, else the Runtime's name.
    pub fn cluster_id(&self) -> String {
        self.spec.cluster_id.clone().or_else(|| self.metadata.name.clone()).unwrap_or_default()
    }
}

/// One immutable version of a module.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "ModuleTemplate",
    plural = "moduletemplates",
    shortname = "mt",
    namespaced,
    status = "ModuleTemplateStatus",
    printcolumn = r#"{"name":"Module","type":"string","jsonPath":".spec.moduleName"}"#,
    printcolumn = r#"{"name":"Version","type":"string","jsonPath":".spec.version"}"#,
    printcolumn = r#"{"name":"Downtime","type":"boolean","jsonPath":".spec.requiresDowntime"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "One immutable version of a module"
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleTemplateSpec {
    /// The module's name.
    pub module_name: String,
    /// This template's version (semver).
    pub version: String,
    /// An upgrade to this version needs downtime: it waits for a maintenance window.
    #[serde(default)]
    pub requires_downtime: bool,
    /// The module operator's resources, applied in order with server-side apply. Exactly
    /// one of `manifest` and `source` gives them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "any_objects")]
    pub manifest: Vec<serde_json::Value>,
    /// Where the resources are instead of `manifest`: an OCI artifact in a registry, named by
    /// digest (docs/modules.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<ModuleSource>,
    /// The default configuration resource, created once at install. With `source`, the
    /// artifact's default configuration layer when absent here.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub default_config: Option<serde_json::Value>,
    /// Kinds whose instances block deletion of the module operator.
    #[serde(default)]
    pub managed_resources: Vec<KindRef>,
    /// The manager workload (a Deployment in the manifest) whose `app.kubernetes.io/version`
    /// label is the module's actual running version.
    pub manager: ResourceRef,
    /// Modules this version needs installed and Ready in the same runtime first (istio,
    /// certificates...). It waits for them (`WaitingForDependency`), and none of them is
    /// removed while this one is installed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub requires: Vec<ModuleRequirement>,
}

/// A module another module needs.
///
/// ```
/// use fleetwatch_api::module::ModuleRequirement;
/// let r: ModuleRequirement = serde_json::from_str(r#"{"module":"istio","versions":">=1.2, <2"}"#).unwrap();
/// assert!(r.accepts(&semver::Version::new(1, 4, 0)).unwrap());
/// assert!(!r.accepts(&semver::Version::new(2, 0, 0)).unwrap());
/// assert_eq!(r.to_string(), "istio >=1.2, <2");
/// ```
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ModuleRequirement {
    /// The module's name.
    pub module: String,
    /// The versions that do (a semver range, `>=1.2, <2`); any when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub versions: Option<String>,
}

impl ModuleRequirement {
    /// Whether `version` satisfies the range (any version without one); an error names a
    /// range that does not parse.
    pub fn accepts(&self, version: &semver::Version) -> Result<bool, String> {
        match &self.versions {
            None => Ok(true),
            Some(range) => semver::VersionReq::parse(range)
                .map(|req| req.matches(version))
                .map_err(|e| format!("requirement {}: versions {range:?} is not a semver range: {e}", self.module)),
        }
    }
}

impl std::fmt::Display for ModuleRequirement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.versions {
            Some(v) => write!(f, "{} {v}", self.module),
            None => f.write_str(&self.module),
        }
    }
}

/// Where a module version's resources are, when not inline in `manifest`.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ModuleSource {
    /// An OCI artifact (`fleetwatch module package` builds and pushes it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oci: Option<OciSource>,
}

/// A module artifact in an OCI registry.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OciSource {
    /// `REGISTRY/REPOSITORY@sha256:…`: pinned by digest, as a module version is immutable
    /// (a tag is refused).
    #[serde(rename = "ref")]
    pub reference: String,
    /// A Secret of type `kubernetes.io/dockerconfigjson` with the registry's credentials, in
    /// the namespace the operator keeps credentials in (`--kubeconfig-namespace`) or, when it
    /// has none, the template's namespace; the operator's `--registry-auth` when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pull_secret: Option<String>,
}

impl ModuleTemplateSpec {
    /// The OCI artifact the template names, if any.
    pub fn oci(&self) -> Option<&OciSource> {
        self.source.as_ref().and_then(|s| s.oci.as_ref())
    }
}

/// What the operator makes of a template.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ModuleTemplateStatus {
    /// `Usable`: `False` (reason `InvalidSpec`, the error as message) when the operator cannot
    /// read or use the template, back to `True` (reason `Valid`) once it can.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "nullable": true})
}

fn any_objects(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}})
}

/// A module's release channels and versions.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "ModuleReleaseMeta",
    plural = "modulereleasemetas",
    shortname = "mrm",
    namespaced,
    status = "ModuleReleaseMetaStatus",
    printcolumn = r#"{"name":"Module","type":"string","jsonPath":".spec.moduleName"}"#,
    printcolumn = r#"{"name":"Channels","type":"string","description":"every channel and its version, e.g. fast=2.0.0 regular=1.0.0 (written by the operator)","jsonPath":".status.channels"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "A module's release channels and versions"
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleReleaseMetaSpec {
    /// The module's name.
    pub module_name: String,
    /// Which version each channel offers.
    #[serde(default)]
    pub channels: Vec<ChannelVersion>,
    /// A version every runtime must run, whatever its channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<String>,
    /// Known versions with deprecation notes.
    #[serde(default)]
    pub versions: Vec<VersionInfo>,
    /// Upgrade affected runtimes in waves when a channel moves (all at once when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<RolloutPolicy>,
}

/// How a channel move rolls out.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutPolicy {
    /// Most runtimes upgrading at once.
    #[serde(default = "default_max_in_flight")]
    pub max_in_flight: u32,
    /// Share of the affected runtimes admitted per wave, in percent.
    #[serde(default = "default_step_percent")]
    pub step_percent: u32,
    /// Stop admitting when failed / admitted exceeds this ratio.
    #[serde(default = "default_max_failure_ratio")]
    pub max_failure_ratio: f64,
}

fn default_max_in_flight() -> u32 {
    10
}
fn default_step_percent() -> u32 {
    20
}
fn default_max_failure_ratio() -> f64 {
    0.2
}

impl Default for RolloutPolicy {
    fn default() -> Self {
        Self {
            max_in_flight: default_max_in_flight(),
            step_percent: default_step_percent(),
            max_failure_ratio: default_max_failure_ratio(),
        }
    }
}

/// A release meta's observed rollouts.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
pub struct ModuleReleaseMetaStatus {
    /// One per version being (or last) rolled out.
    #[serde(default)]
    pub rollouts: Vec<RolloutStatus>,
    /// Every channel with its version, `channel=version` sorted by channel and separated
    /// by spaces (`fast=2.0.0 regular=1.0.0`; `ModuleReleaseMetaSpec::channels_summary`):
    /// the `Channels` printer column, as a column can show only one value of a list.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channels: Option<String>,
    /// `Usable`: `False` (reason `InvalidSpec`) when the operator cannot read or use it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl ModuleReleaseMetaSpec {
    /// Every channel with its version for people, e.g. `fast=2.0.0 regular=1.0.0` (sorted by
    /// channel; `mandatory=V` last when set), `-` when there is none.
    ///
    /// ```
    /// use fleetwatch_api::{ChannelVersion, ModuleReleaseMetaSpec};
    /// let spec = ModuleReleaseMetaSpec {
    ///     module_name: "redis".into(),
    ///     channels: vec![
    ///         ChannelVersion { channel: "regular".into(), version: "1.0.0".into() },
    ///         ChannelVersion { channel: "fast".into(), version: "2.0.0".into() },
    ///     ],
    ///     ..Default::default()
    /// };
    /// assert_eq!(spec.channels_summary(), "fast=2.0.0 regular=1.0.0");
    /// ```
    pub fn channels_summary(&self) -> String {
        let mut parts: Vec<String> = self.channels.iter().map(|c| format!("{}={}", c.channel, c.version)).collect();
        parts.sort();
        if let Some(m) = &self.mandatory {
            parts.push(format!("mandatory={m}"));
        }
        if parts.is_empty() { "-".into() } else { parts.join(" ") }
    }
}

/// Progress of rolling out one version.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RolloutStatus {
    /// The version.
    pub version: String,
    /// `Progressing`, `Complete` or `Halted`.
    pub phase: String,
    /// Runtimes that want it.
    pub total: u32,
    /// Runtimes admitted so far.
    pub admitted: u32,
    /// Runtimes running it.
    pub upgraded: u32,
    /// Runtimes whose upgrade failed.
    pub failed: u32,
    /// The current wave, from 1.
    pub wave: u32,
    /// Why it halted, when it did.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The runtimes admitted so far (names, in the release meta's namespace). Recorded before
    /// each upgrade starts, so an operator instance taking over knows which are in flight.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub admitted_runtimes: Vec<String>,
    /// The admitted runtimes running it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub upgraded_runtimes: Vec<String>,
    /// The admitted runtimes whose upgrade failed.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub failed_runtimes: Vec<String>,
}

/// A channel and its version.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ChannelVersion {
    /// Channel name.
    pub channel: String,
    /// Version it offers.
    pub version: String,
}

/// A version's notes.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct VersionInfo {
    /// Version.
    pub version: String,
    /// When it is deprecated (RFC 3339 date).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecation_date: Option<String>,
    /// Deprecation message.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

#[cfg(test)]
mod tests {
    #[test]
    fn states_display_their_api_names() {
        assert_eq!(super::State::Ready.to_string(), "Ready");
    }
}
