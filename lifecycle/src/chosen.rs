//! Modules chosen in the runtime cluster (issue 46, [0036](../../docs/decisions/0036-self-service-modules.md)):
//! the `Module` objects a cluster's users create, merged with what the control plane's Runtime
//! lists, central configuration first.
//!
//! This module is the pure core: given the Runtime, the cluster's `Module` objects, what the
//! catalog offers and the last statuses, [`merge`] says which modules the reconcile manages
//! beside the Runtime's own and what to answer each object; [`object_status`] turns a
//! module's status into what its object shows. `cluster` reads and writes the objects.
//!
//! The rules:
//! - a module the Runtime lists is the Runtime's: its channel, pin and policy are in force,
//!   and its object (kept by the operator, labelled `source=central`) is put back when
//!   deleted and re-channelled when edited;
//! - a user's object is taken up when the Runtime's `spec.selfService` allows the module,
//!   the catalog offers it and its channel exists; otherwise it is refused with a reason
//!   (a module taken up before and refused now stays installed as it runs, unmanaged:
//!   a refusal never deletes anything);
//! - a user's object being deleted removes the module by its policy (`CreateAndDelete`
//!   blocks on the finalizer until the managed resources are gone; `Ignore` leaves the
//!   module installed and unmanaged).
//!
//! The objects are read from the cluster through the Runtime's kubeconfig at every
//! reconcile; a hub event only triggers it. So one cluster's objects can change that
//! cluster's modules only, whatever an event says.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use fleetwatch_api::chosen::{ChosenBy, ChosenModuleStatus, Module, ModuleState, SOURCE_LABEL};
use fleetwatch_api::{
    Condition, CustomResourcePolicy, ModuleEntry, ModuleReason, ModuleReleaseMeta, ModuleStatus, Runtime, State,
};
use kube::ResourceExt;

pub(crate) mod cluster;

/// Why a user's `Module` is not taken up.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// The Runtime's `spec.selfService.enabled` is false.
    SelfServiceDisabled,
    /// The Runtime's `spec.selfService.modules` does not name it.
    NotAllowed,
    /// No ModuleReleaseMeta offers it.
    UnknownModule,
    /// Its meta has no such channel.
    UnknownChannel,
    /// The object cannot be read (its spec is not what the CRD says).
    InvalidSpec,
}

impl Refusal {
    /// The `Accepted` condition's reason.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::SelfServiceDisabled => "SelfServiceDisabled",
            Self::NotAllowed => "NotAllowed",
            Self::UnknownModule => "UnknownModule",
            Self::UnknownChannel => "UnknownChannel",
            Self::InvalidSpec => "InvalidSpec",
        }
    }
}

/// What the operator makes of one `Module` object.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// The Runtime lists the module: its entry is in force. `kept`: the object is the
    /// operator's (labelled central), so its spec is kept as the Runtime says.
    Central { kept: bool },
    /// A user's choice, taken up.
    User,
    /// A user's choice, refused.
    Refused { reason: Refusal, message: String },
    /// A user's object being deleted: the module goes by its policy, then the finalizer.
    Deleting,
    /// An object the operator kept for a module the Runtime no longer lists: deleted.
    Stale,
}

/// What the reconcile manages beside the Runtime's own modules, and the answer to each object.
#[derive(Debug, Default)]
pub(crate) struct Merged {
    /// The users' modules to reconcile, after the Runtime's (refused ones that were taken up
    /// before come as `managed: false`).
    pub(crate) entries: Vec<ModuleEntry>,
    /// Per object name.
    pub(crate) verdicts: BTreeMap<String, Verdict>,
    /// Removal policies of the users' objects being deleted (the object's, which may have
    /// changed since the module's last reconcile).
    pub(crate) removal: BTreeMap<String, CustomResourcePolicy>,
    /// When the objects could not be read: the users' modules as they were, left alone
    /// (neither reconciled nor removed), each saying why.
    pub(crate) unread: Vec<ModuleStatus>,
}

impl Merged {
    /// The cluster's objects could not be read (`why`): the users' modules of `previous` are
    /// kept as they were, failed at reading the cluster (retried with backoff).
    pub(crate) fn unread(rt: &Runtime, previous: &[ModuleStatus], why: &str) -> Self {
        let unread = previous
            .iter()
            .filter(|p| p.source == Some(ChosenBy::User) && !rt.spec.modules.iter().any(|e| e.name == p.name))
            .map(|p| {
                let message = format!("cannot read this cluster's Module objects: {why}");
                crate::retry::failed(p.clone(), fleetwatch_api::FailedStep::Read, message)
            })
            .collect();
        Self { unread, ..Self::default() }
    }

    /// The names of the modules users chose (taken up, or refused but still installed).
    pub(crate) fn users(&self) -> BTreeSet<&str> {
        self.entries.iter().map(|e| e.name.as_str()).chain(self.unread.iter().map(|u| u.name.as_str())).collect()
    }

    /// `rt` with the users' modules appended to its list: what the reconcile works on.
    pub(crate) fn runtime(&self, rt: Arc<Runtime>) -> Arc<Runtime> {
        if self.entries.is_empty() {
            return rt;
        }
        let mut effective = (*rt).clone();
        effective.spec.modules.extend(self.entries.iter().cloned());
        Arc::new(effective)
    }
}

/// One `Module` object as listed: its name, whether the operator keeps it (labelled
/// central), whether it is being deleted, and its spec when it could be read.
#[derive(Clone, Debug)]
pub(crate) struct Listed {
    /// The object (its spec default when `invalid`).
    pub(crate) object: Module,
    /// Why its spec could not be read, if it could not.
    pub(crate) invalid: Option<String>,
}

impl Listed {
    pub(crate) fn name(&self) -> String {
        self.object.name_any()
    }
    pub(crate) fn kept_by_operator(&self) -> bool {
        self.object.labels().get(SOURCE_LABEL).is_some_and(|v| v == "central")
    }
    pub(crate) fn deleting(&self) -> bool {
        self.object.metadata.deletion_timestamp.is_some()
    }
}

/// Merges the cluster's `objects` into the Runtime's list (see the module docs for the rules).
/// `metas` are the release metas of the Runtime's namespace `ns`; `previous` its last statuses.
pub(crate) fn merge(
    rt: &Runtime,
    ns: &str,
    objects: &[Listed],
    metas: &[Arc<ModuleReleaseMeta>],
    previous: &[ModuleStatus],
) -> Merged {
    let mut out = Merged::default();
    let self_service = rt.spec.self_service.clone().unwrap_or_default();
    let runtime = format!("{ns}/{}", rt.name_any());
    for o in objects {
        let name = o.name();
        let was_users = previous.iter().find(|p| p.name == name && p.source == Some(ChosenBy::User));
        if rt.spec.modules.iter().any(|e| e.name == name) {
            out.verdicts.insert(name, Verdict::Central { kept: o.kept_by_operator() });
            continue;
        }
        if o.kept_by_operator() {
            out.verdicts.insert(name, Verdict::Stale);
            continue;
        }
        if o.deleting() {
            if was_users.is_some() {
                out.removal.insert(name.clone(), o.object.spec.custom_resource_policy);
            }
            out.verdicts.insert(name, Verdict::Deleting);
            continue;
        }
        let meta = crate::plan::find_meta(metas, ns, &name);
        let refusal = if let Some(why) = &o.invalid {
            Some((Refusal::InvalidSpec, format!("module {name}: the object cannot be read: {why}")))
        } else if !self_service.enabled {
            Some((
                Refusal::SelfServiceDisabled,
                format!(
                    "module {name} cannot be chosen: its Runtime {runtime} turns self-service off (spec.selfService.enabled: false)"
                ),
            ))
        } else if !self_service.allows(&name) {
            let globs = self_service.modules.clone().unwrap_or_default().join(", ");
            Some((
                Refusal::NotAllowed,
                format!(
                    "module {name} cannot be chosen in this cluster: its Runtime {runtime} allows [{globs}] (spec.selfService.modules)"
                ),
            ))
        } else if meta.is_none() {
            Some((
                Refusal::UnknownModule,
                format!(
                    "module {name} is not offered: no ModuleReleaseMeta names it (kubectl get configmap -n kube-public fleetwatch-catalog lists what is)"
                ),
            ))
        } else if let (Some(meta), Some(channel)) = (meta, &o.object.spec.channel)
            && !meta.spec.channels.iter().any(|c| &c.channel == channel)
        {
            let mut have: Vec<&str> = meta.spec.channels.iter().map(|c| c.channel.as_str()).collect();
            have.sort_unstable();
            Some((
                Refusal::UnknownChannel,
                format!("module {name} has no channel {channel:?}; it has {}", have.join(", ")),
            ))
        } else {
            None
        };
        match refusal {
            Some((reason, message)) => {
                // A refusal never deletes: a module taken up before stays as it runs.
                if let Some(p) = was_users {
                    out.entries.push(ModuleEntry {
                        name: name.clone(),
                        channel: p.channel.clone(),
                        managed: false,
                        custom_resource_policy: p.custom_resource_policy,
                        version: None,
                    });
                }
                out.verdicts.insert(name, Verdict::Refused { reason, message });
            }
            None => {
                out.entries.push(ModuleEntry {
                    name: name.clone(),
                    channel: o.object.spec.channel.clone(),
                    version: None,
                    managed: true,
                    custom_resource_policy: o.object.spec.custom_resource_policy,
                });
                out.verdicts.insert(name, Verdict::User);
            }
        }
    }
    out
}

/// Every module `rt` has: those it lists, then those its cluster's users chose as its status
/// last recorded them (with the channel then in force). What looks across Runtimes without
/// reading their clusters (which Runtimes a channel move affects, a rollout's size) uses it.
pub(crate) fn listed_and_chosen(rt: &Runtime) -> Vec<std::borrow::Cow<'_, ModuleEntry>> {
    let mut out: Vec<std::borrow::Cow<'_, ModuleEntry>> =
        rt.spec.modules.iter().map(std::borrow::Cow::Borrowed).collect();
    let chosen = rt
        .status
        .iter()
        .flat_map(|s| &s.modules)
        .filter(|m| m.source == Some(ChosenBy::User) && !rt.spec.modules.iter().any(|e| e.name == m.name));
    for m in chosen {
        out.push(std::borrow::Cow::Owned(ModuleEntry {
            name: m.name.clone(),
            channel: m.channel.clone(),
            version: None,
            managed: m.state != State::Unmanaged,
            custom_resource_policy: m.custom_resource_policy,
        }));
    }
    out
}

/// The object a centrally listed module gets: named after it, labelled central, the
/// Runtime's channel and policy in its spec.
pub(crate) fn central_object(entry: &ModuleEntry) -> serde_json::Value {
    let mut spec = serde_json::json!({"customResourcePolicy": entry.custom_resource_policy});
    if let Some(c) = &entry.channel {
        spec["channel"] = c.clone().into();
    }
    serde_json::json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Module",
        "metadata": {"name": entry.name, "labels": {SOURCE_LABEL: "central", "app.kubernetes.io/managed-by": "fleetwatch"}},
        "spec": spec,
    })
}

/// Whether a kept object's spec says what the Runtime's entry says.
pub(crate) fn central_spec_matches(object: &Module, entry: &ModuleEntry) -> bool {
    object.spec.channel == entry.channel && object.spec.custom_resource_policy == entry.custom_resource_policy
}

/// What an object shows for one verdict. `module` is the module's status from this
/// reconcile, when it has one; `put_back`: a kept object was deleted and created again.
pub(crate) fn object_status(
    verdict: &Verdict,
    module: Option<&ModuleStatus>,
    runtime: &str,
    generation: Option<i64>,
    put_back: bool,
    before: Option<&ChosenModuleStatus>,
) -> ChosenModuleStatus {
    let mut st = ChosenModuleStatus { observed_generation: generation, ..Default::default() };
    let accepted = match verdict {
        Verdict::Central { kept } => {
            st.source = Some(ChosenBy::Central);
            let message = match (kept, put_back) {
                (true, true) => format!(
                    "deleted in this cluster and put back: the module is listed centrally (Runtime {runtime}); remove it there"
                ),
                (true, false) => format!(
                    "listed centrally (Runtime {runtime}): its channel, version and removal policy are set there; deleting or editing this object changes nothing (it is put back)"
                ),
                (false, _) => format!(
                    "listed centrally (Runtime {runtime}), which takes precedence: this object's channel and policy are not used while it is"
                ),
            };
            ("True", if put_back { "PutBack" } else { "Central" }, message)
        }
        Verdict::User => {
            st.source = Some(ChosenBy::User);
            ("True", "User", "chosen in this cluster and managed by fleetwatch".to_string())
        }
        Verdict::Deleting => {
            st.source = Some(ChosenBy::User);
            ("True", "User", "being removed".to_string())
        }
        Verdict::Refused { reason, message } => {
            st.source = Some(ChosenBy::User);
            ("False", reason.as_str(), message.clone())
        }
        Verdict::Stale => ("False", "NoLongerListed", "no longer listed centrally".to_string()),
    };
    match (verdict, module) {
        (Verdict::Refused { message, .. }, m) => {
            st.state = Some(ModuleState::Error);
            st.message = match m.filter(|m| m.state == State::Unmanaged) {
                Some(m) => format!("{message}; it stays installed as it runs, no longer managed ({})", m.message),
                None => message.clone(),
            };
            if let Some(m) = m {
                st.version = m.actual_version.clone();
            }
        }
        (_, Some(m)) => {
            st.state = Some(state_of(m));
            st.version = m.actual_version.clone();
            st.desired_version = m.desired_version.clone();
            st.channel = m.channel.clone();
            st.custom_resource_policy = Some(m.custom_resource_policy);
            st.message = m.message.clone();
        }
        (Verdict::Deleting, None) => {
            st.state = Some(ModuleState::Deleting);
            st.message = "removed".into();
        }
        (_, None) => {
            st.state = Some(ModuleState::Processing);
            st.message = "not reconciled yet".into();
        }
    }
    let ready = if st.state == Some(ModuleState::Ready) { "True" } else { "False" };
    let ready_reason = module
        .and_then(|m| m.reason)
        .map(|r| format!("{r:?}"))
        .unwrap_or_else(|| st.state.map(|s| s.to_string()).unwrap_or_default());
    let since = |type_: &str, status: &str| {
        before
            .and_then(|b| b.conditions.iter().find(|c| c.type_ == type_ && c.status == status))
            .and_then(|c| c.last_transition_time.clone())
            .or_else(|| Some(jiff::Timestamp::now().to_string()))
    };
    st.conditions = vec![
        Condition {
            type_: "Accepted".into(),
            status: accepted.0.into(),
            reason: accepted.1.into(),
            message: accepted.2,
            last_transition_time: since("Accepted", accepted.0),
        },
        Condition {
            type_: "Ready".into(),
            status: ready.into(),
            reason: ready_reason,
            message: st.message.clone(),
            last_transition_time: since("Ready", ready),
        },
    ];
    st
}

/// A module's state as its object shows it: what waits says `Waiting`, what is not
/// managed says `Warning`.
pub(crate) fn state_of(m: &ModuleStatus) -> ModuleState {
    let waits = m.reason.is_some_and(|r| {
        matches!(
            r,
            ModuleReason::WaitingForRollout
                | ModuleReason::WaitingForMaintenanceWindow
                | ModuleReason::WaitingForArtifact
                | ModuleReason::WaitingForManager
                | ModuleReason::WaitingForDependency
        )
    });
    match m.state {
        State::Ready => ModuleState::Ready,
        State::Processing if waits => ModuleState::Waiting,
        State::Processing => ModuleState::Processing,
        State::Deleting => ModuleState::Deleting,
        State::Warning | State::Unmanaged => ModuleState::Warning,
        State::Error => ModuleState::Error,
    }
}

/// Whether two statuses differ in anything but the conditions' transition times (so an
/// unchanged status is not written again).
pub(crate) fn same_status(a: &ChosenModuleStatus, b: &ChosenModuleStatus) -> bool {
    let strip = |s: &ChosenModuleStatus| {
        let mut s = s.clone();
        s.conditions.iter_mut().for_each(|c| c.last_transition_time = None);
        s
    };
    strip(a) == strip(b)
}

#[cfg(test)]
mod tests;
