//! The module rules as pure functions: from what a reconcile gathered beforehand (the
//! Runtime, the templates, release metas and maintenance policies of the stores, the fleet
//! for rollout totals, the modules' observed state and the clock's `now`) to what to do.
//! No I/O, no clock, no Kubernetes client: `reconcile` gathers, asks here, and carries out.
//!
//! The rules (docs/modules.md): the desired version from the pinned version or the channel
//! with the mandatory floor ([`desired`]); downgrade protection against the version running,
//! the dependencies of `spec.requires`, paced rollouts and maintenance windows ([`decide`]);
//! dependency order ([`order`]); which listed modules are managed ([`management`]) and which
//! are gone ([`gone`]); a failed module waiting out its backoff ([`held_back`]);
//! deletion strategies and what blocks a removal ([`removal`], [`deletion_blocked`]);
//! create-once default configuration ([`create_default_config`]); when to look again
//! ([`requeue`]).

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::maintenance::MaintenancePolicy;
use fleetwatch_api::policy::{Step, desired_version, next_step, parse};
use fleetwatch_api::{
    CustomResourcePolicy, ModuleEntry, ModuleReleaseMeta, ModuleStatus, ModuleTemplate, RolloutPolicy, Runtime, State,
};
use kube::ResourceExt;

use crate::maintenance::Gate;

/// What the stores hold that the rules read, for the namespace of one Runtime.
#[derive(Clone, Copy)]
pub(crate) struct Stores<'a> {
    /// The Runtime's namespace: templates and release metas of other namespaces do not count.
    pub(crate) ns: &'a str,
    /// Every ModuleTemplate.
    pub(crate) templates: &'a [Arc<ModuleTemplate>],
    /// Every ModuleReleaseMeta.
    pub(crate) metas: &'a [Arc<ModuleReleaseMeta>],
    /// Every MaintenancePolicy.
    pub(crate) policies: &'a [Arc<MaintenancePolicy>],
}

impl Stores<'_> {
    /// The release meta of `module` in this namespace.
    pub(crate) fn meta(&self, module: &str) -> Option<&ModuleReleaseMeta> {
        find_meta(self.metas, self.ns, module)
    }

    /// The template of `module` at `version` in this namespace.
    pub(crate) fn template(&self, module: &str, version: &semver::Version) -> Option<Arc<ModuleTemplate>> {
        find_template(self.templates, self.ns, module, version)
    }
}

/// The release meta of `module` in namespace `ns`.
pub(crate) fn find_meta<'a>(
    metas: &'a [Arc<ModuleReleaseMeta>],
    ns: &str,
    module: &str,
) -> Option<&'a ModuleReleaseMeta> {
    metas.iter().find(|m| m.spec.module_name == module && m.namespace().as_deref() == Some(ns)).map(|m| m.as_ref())
}

/// The template of `module` at `version` in namespace `ns`.
pub(crate) fn find_template(
    templates: &[Arc<ModuleTemplate>],
    ns: &str,
    module: &str,
    version: &semver::Version,
) -> Option<Arc<ModuleTemplate>> {
    templates
        .iter()
        .find(|t| {
            t.spec.module_name == module
                && t.namespace().as_deref() == Some(ns)
                && parse(&t.spec.version).is_ok_and(|v| &v == version)
        })
        .cloned()
}

/// Rule 1: the version `entry` should run and the channel it came from (`None` when
/// pinned): the pinned version, else the module's channel, else the Runtime's, else
/// `regular`, raised to the release meta's mandatory version. The error says why none can be
/// chosen.
pub(crate) fn desired(
    entry: &ModuleEntry,
    rt: &Runtime,
    stores: &Stores<'_>,
) -> Result<(semver::Version, Option<String>), String> {
    desired_version(entry, rt.spec.channel.as_deref(), stores.meta(&entry.name).map(|m| &m.spec))
        .map_err(|e| e.to_string())
}

/// The order the Runtime's modules are reconciled in: each after the modules its desired
/// version requires (indices into `spec.modules`).
pub(crate) fn order(rt: &Runtime, stores: &Stores<'_>) -> Vec<usize> {
    let graph: Vec<(String, Vec<String>)> = rt
        .spec
        .modules
        .iter()
        .map(|e| {
            let requires = desired(e, rt, stores)
                .ok()
                .and_then(|(v, _)| stores.template(&e.name, &v))
                .map(|t| t.spec.requires.iter().map(|r| r.module.clone()).collect())
                .unwrap_or_default();
            (e.name.clone(), requires)
        })
        .collect();
    crate::requires::order(&graph)
}

/// What the reconcile saw of a failed module, for [`held_back`].
pub(crate) struct Failed<'a> {
    /// The module's last status.
    pub(crate) previous: &'a ModuleStatus,
    /// The Runtime's spec changed since its status was written.
    pub(crate) spec_changed: bool,
    /// The version the module should run now (`None` when none can be chosen).
    pub(crate) desired: Option<String>,
    /// Something that could unblock it happened in its cluster ([`crate::retry::ClusterChanges`]).
    pub(crate) cluster_moved: bool,
}

/// Whether a module that failed a step touching its cluster waits for its next attempt in
/// this reconcile: not due yet at `now`, and nothing happened since it failed that could
/// unblock it — no spec change of the Runtime, no other desired version, no Namespace, CRD or
/// module inventory change in its cluster. Other reconciles of the Runtime then leave it
/// alone, so its backoff holds.
pub(crate) fn held_back(failed: &Failed<'_>, now: jiff::Timestamp) -> bool {
    let p = failed.previous;
    let Some(r) = p.retry.as_ref().filter(|_| p.state == State::Error) else { return false };
    if !crate::retry::held_back(r.step) {
        return false;
    }
    let due = r.next_attempt.parse::<jiff::Timestamp>().map_or(true, |at| at <= now);
    !due && !failed.spec_changed && failed.desired == p.desired_version && !failed.cluster_moved
}

/// How many runtimes of `fleet` in namespace `ns` want `version` of `module` through their
/// channel: the size of a paced rollout.
pub(crate) fn rollout_total(
    fleet: &[Arc<Runtime>],
    stores: &Stores<'_>,
    module: &str,
    version: &semver::Version,
) -> u32 {
    let meta = stores.meta(module).map(|m| &m.spec);
    fleet
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(stores.ns))
        .filter(|r| {
            // With the users' modules, as the status recorded them (a sharded instance's slim
            // index has no status: those count once they are reconciled by their holder).
            crate::chosen::listed_and_chosen(r).iter().any(|e| {
                e.name == module
                    && e.managed
                    && e.version.is_none()
                    && desired_version(e, r.spec.channel.as_deref(), meta).is_ok_and(|(v, _)| &v == version)
            })
        })
        .count() as u32
}

/// What the rules need besides the module itself.
pub(crate) struct Inputs<'a> {
    /// The Runtime being reconciled.
    pub(crate) rt: &'a Runtime,
    /// What the stores hold.
    pub(crate) stores: Stores<'a>,
    /// The runtime's modules as known now (this reconcile's statuses of those done, else the
    /// last ones), for their dependents.
    pub(crate) known: &'a [ModuleStatus],
    /// The modules the Runtime lists.
    pub(crate) listed: &'a [String],
    /// The operator's clock, read once by the reconcile.
    pub(crate) now: jiff::Timestamp,
    /// How much of a maintenance window must be left for a downtime upgrade to start.
    pub(crate) min_window_remaining: jiff::SignedDuration,
}

/// What to do with a module whose desired version and template are known and whose running
/// version was read.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Decision {
    /// Rule 2: a newer version runs; it is left alone and the module is a `Warning`
    /// (`DowngradeRefused`) with this message.
    RefuseDowngrade(String),
    /// The desired version's template is not usable (its requirements): the module fails
    /// its `Resolve` step with this message.
    Unusable(String),
    /// What the desired version requires is not there yet: the module waits
    /// (`WaitingForDependency`) in this state with this message.
    WaitForDependency(State, String),
    /// Install, upgrade or keep, once the gates let it.
    Change(Change),
}

/// An install, upgrade or keep and the gates it passes first.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Change {
    /// Install, upgrade or keep.
    pub(crate) step: Step,
    /// A paced rollout admits the upgrade first (an upgrade a channel move caused).
    pub(crate) rollout: Option<RolloutPolicy>,
    /// Rule 3: an upgrade needing downtime and the maintenance window.
    pub(crate) window: Window,
    /// Rule 6: migrations run around installs and upgrades, not when keeping a version.
    pub(crate) migrate: bool,
}

/// Rule 3 for one change: whether it may start now.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Window {
    /// No downtime needed, or inside a window (or windows skipped).
    Open,
    /// Wait for the next window; the running version `from` keeps being reconciled.
    Wait {
        /// The running version.
        from: semver::Version,
        /// For the module's status.
        message: String,
        /// The window, `begin/end`, for `status.nextMaintenanceWindow`.
        next: String,
        /// How long until it opens.
        opens_in: Duration,
    },
    /// No window to wait for, or the policy is missing or invalid: the upgrade is held
    /// (`UpgradeHeld`) and the running version `from` kept.
    Hold {
        /// The running version.
        from: semver::Version,
        /// For the module's status.
        message: String,
        /// Look again this soon (policy edits trigger no reconcile).
        look_again: Option<Duration>,
    },
}

/// The rules for one module: rule 2 (downgrade protection against the `running` version),
/// the dependencies of the desired version's `template`, a paced rollout of a channel move,
/// and rule 3 (maintenance windows).
pub(crate) fn decide(
    inputs: &Inputs<'_>,
    entry: &ModuleEntry,
    desired: &semver::Version,
    template: &ModuleTemplate,
    running: Option<&semver::Version>,
) -> Decision {
    let step = next_step(running, desired);
    if let Step::RefuseDowngrade { from } = &step {
        return Decision::RefuseDowngrade(format!("downgrade from {from} to {desired} not applied"));
    }
    let stores = &inputs.stores;
    // Dependencies: an install or upgrade waits until what its version requires is Ready.
    if !template.spec.requires.is_empty() {
        if let Err(why) = crate::requires::judge(template, stores.templates, stores.metas) {
            return Decision::Unusable(format!("ModuleTemplate {} is not usable: {why}", template.name_any()));
        }
        if matches!(step, Step::Install | Step::Upgrade { .. }) {
            let listed: Vec<&str> = inputs.listed.iter().map(String::as_str).collect();
            if let Some(unmet) = crate::requires::unmet(&template.spec.requires, inputs.known, &listed) {
                let state = if unmet.listed { State::Processing } else { State::Warning };
                return Decision::WaitForDependency(state, format!("{} {desired} {}", entry.name, unmet.message));
            }
        }
    }
    // Paced rollouts: an upgrade that a channel move caused (not a pinned one) waits for its wave.
    let rollout = match (&step, &entry.version) {
        (Step::Upgrade { .. }, None) => stores.meta(&entry.name).and_then(|m| m.spec.rollout.clone()),
        _ => None,
    };
    let window = match (&step, template.spec.requires_downtime) {
        (Step::Upgrade { from }, true) => window(inputs, desired, from),
        _ => Window::Open,
    };
    let migrate = matches!(step, Step::Install | Step::Upgrade { .. });
    Decision::Change(Change { step, rollout, window, migrate })
}

/// Rule 3 for a downtime upgrade from `from` to `desired`.
fn window(inputs: &Inputs<'_>, desired: &semver::Version, from: &semver::Version) -> Window {
    let now = inputs.now;
    match crate::maintenance::gate(inputs.rt, inputs.stores.policies, now, inputs.min_window_remaining) {
        Gate::Open => Window::Open,
        Gate::Wait(w) => Window::Wait {
            from: from.clone(),
            message: format!("upgrade to {desired} waits for the maintenance window {} – {}", w.begin, w.end),
            next: format!("{}/{}", w.begin, w.end),
            opens_in: w.begin.duration_since(now).unsigned_abs(),
        },
        Gate::Never(why) => Window::Hold {
            from: from.clone(),
            message: format!("upgrade to {desired} needs downtime but no maintenance window: {why}"),
            look_again: None,
        },
        // Fail closed: no downtime upgrade while the policy is missing or invalid. Policy
        // edits do not trigger reconciles, so look again now and then.
        Gate::Broken(why) => Window::Hold {
            from: from.clone(),
            message: format!("upgrade to {desired} held: {why}"),
            look_again: Some(Duration::from_secs(60)),
        },
    }
}

/// Rule 4: whether the default configuration is created now — only if no status (the cached
/// one, or the API server's when asked) records it as created before.
pub(crate) fn create_default_config(recorded: bool, recorded_in_api_server: bool) -> bool {
    !recorded && !recorded_in_api_server
}

/// Each module's installed version (those not let go), for [`crate::requires::dependents`].
pub(crate) fn installed_of(statuses: &[ModuleStatus]) -> Vec<(String, String)> {
    statuses
        .iter()
        .filter(|m| m.state != State::Unmanaged)
        .filter_map(|m| Some((m.name.clone(), m.installed_version.clone()?)))
        .collect()
}

/// Whether a module the Runtime lists is reconciled.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Management {
    /// `managed` (the default): installed, upgraded, kept.
    Manage,
    /// `managed: false`, but installed modules (named) still require it: managed until none
    /// does, `Warning` (`RequiredByOthers`) instead of `Ready`.
    StillRequired(Vec<String>),
    /// `managed: false`: reconciling stops and everything installed stays, whatever the
    /// deletion policy (as in lifecycle-manager); removing the entry is what applies it.
    Unmanage,
}

/// Whether `entry` is reconciled, given the runtime's modules as known now.
pub(crate) fn management(entry: &ModuleEntry, known: &[ModuleStatus], stores: &Stores<'_>) -> Management {
    if entry.managed {
        return Management::Manage;
    }
    // A dependency stays managed while an installed module requires it.
    let required_by = crate::requires::dependents(&entry.name, &installed_of(known), stores.templates, stores.ns);
    if required_by.is_empty() { Management::Unmanage } else { Management::StillRequired(required_by) }
}

/// The modules of the last status whose entry is gone from the Runtime (those let go
/// before excepted): they are removed by the policy kept in their status.
pub(crate) fn gone<'a>(rt: &Runtime, previous: &'a [ModuleStatus]) -> Vec<&'a ModuleStatus> {
    previous
        .iter()
        .filter(|p| !rt.spec.modules.iter().any(|e| e.name == p.name))
        .filter(|p| p.state != State::Unmanaged) // already let go
        .collect()
}

/// The message of a module not managed (`managed: false`): what of it runs.
pub(crate) fn unmanaged_message(running: Option<&str>) -> String {
    match running {
        Some(v) => format!("not managed by fleetwatch; {v} is installed"),
        None => "not managed by fleetwatch; nothing of it is installed".into(),
    }
}

/// The message of a module set to `managed: false` that installed modules still require.
pub(crate) fn still_required_message(required_by: &[String]) -> String {
    format!("not unmanaged yet: required by {} (managed until none is)", required_by.join(", "))
}

/// Rule 5: what removing a module does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Removal {
    /// An installed module still requires it (`RequiredByOthers`): the removal waits.
    Wait(String),
    /// `Ignore`: everything stays installed, no longer reconciled.
    LetGo,
    /// `CreateAndDelete`: its default configuration is deleted, then, once no managed
    /// resource is left ([`deletion_blocked`]), its objects in reverse order.
    Delete,
}

/// Rule 5 for a module whose entry is gone (or whose Runtime is being deleted), given the
/// installed modules that still require it (`blocking`).
pub(crate) fn removal(policy: CustomResourcePolicy, blocking: &[String]) -> Removal {
    match policy {
        CustomResourcePolicy::Ignore => Removal::LetGo,
        CustomResourcePolicy::CreateAndDelete if !blocking.is_empty() => {
            Removal::Wait(format!("removal waits: required by {}", blocking.join(", ")))
        }
        CustomResourcePolicy::CreateAndDelete => Removal::Delete,
    }
}

/// Rule 5: a `CreateAndDelete` removal waits while managed resources are left (`left`: each
/// kind and how many); the message says which.
pub(crate) fn deletion_blocked(left: &[(String, usize)]) -> Option<String> {
    let blocking: Vec<String> = left.iter().filter(|(_, n)| *n > 0).map(|(kind, n)| format!("{n} {kind}")).collect();
    (!blocking.is_empty()).then(|| format!("waiting for managed resources to be deleted: {}", blocking.join(", ")))
}

/// What a reconcile of a Runtime that is not being deleted is waiting for, for [`requeue`].
#[derive(Debug, Default, Clone, PartialEq)]
pub(crate) struct Pending {
    /// A module is `Processing` or `Deleting`.
    pub(crate) busy: bool,
    /// Waiting for a maintenance window that opens in this long (or a held upgrade's next look).
    pub(crate) window: Option<Duration>,
    /// Waiting for a rollout wave.
    pub(crate) waiting: bool,
    /// Waiting for a module artifact: its pull's backoff.
    pub(crate) pull: Option<Duration>,
    /// The earliest retry of a failed module.
    pub(crate) retry: Option<Duration>,
    /// When the agent's certificate is to be renewed.
    pub(crate) renew: Option<Duration>,
}

/// How soon to look again while something is in progress.
pub(crate) const BUSY_REQUEUE: Duration = Duration::from_secs(2);
/// How often a runtime waiting for a maintenance window looks at the clock.
const WINDOW_POLL: Duration = Duration::from_secs(2);
/// The safety net of a runtime waiting for its rollout wave (it is woken when the wave opens).
const WAVE_POLL: Duration = Duration::from_secs(10);

/// When to reconcile the Runtime again (`None`: on the next change only), `resync` being the
/// safety resync.
pub(crate) fn requeue(p: &Pending, resync: Option<Duration>) -> Option<Duration> {
    let next = if p.busy {
        Some(BUSY_REQUEUE)
    } else if let Some(until) = p.window {
        // Look again when the window opens (and now and then, in case the clock jumps).
        Some(until.clamp(Duration::from_secs(1), Duration::from_secs(60)).min(WINDOW_POLL))
    } else if p.waiting {
        // Woken when its wave opens; this is only the safety net.
        Some(WAVE_POLL)
    } else {
        resync
    };
    // Back when a module's artifact is due to be pulled again, or a failed module retried.
    let next = [next, p.pull, p.retry].into_iter().flatten().min();
    // Back in time to renew the agent's certificate, whatever else is pending.
    match (next, p.renew) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    }
}

#[cfg(test)]
mod tests;
