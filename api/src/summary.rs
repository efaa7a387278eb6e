//! A Runtime's status summarised for people: modules by state, pending upgrades and the
//! maintenance windows they wait for. `fleetwatch status` and the hub's web view show it.
//!
//! ```
//! use fleetwatch_api::summary::RuntimeSummary;
//! let rt: fleetwatch_api::Runtime = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
//!     "metadata": {"name": "rt-1", "namespace": "kcp"},
//!     "spec": {"modules": [{"name": "redis"}]},
//!     "status": {"state": "Ready", "modules": [{"name": "redis", "state": "Ready",
//!       "desiredVersion": "1.0.0", "actualVersion": "1.0.0", "customResourcePolicy": "CreateAndDelete"}]}
//! })).unwrap();
//! let s = RuntimeSummary::from_runtime(&rt);
//! assert_eq!(s.modules_by_state.get("Ready"), Some(&1));
//! assert!(s.healthy());
//! ```

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::policy::{Step, next_step, parse};
use crate::{ModuleStatus, Runtime, State};

/// One module of a runtime, for people.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ModuleSummary {
    /// Module name.
    pub name: String,
    /// State (`Ready`, `Processing`, `Warning`, `Error`, ...).
    pub state: String,
    /// The version running (the cluster's own report, else the one fleetwatch applied).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub running: Option<String>,
    /// The version the rules ask for, when it differs from the running one and is not an
    /// older one (that is [`ModuleSummary::refused_downgrade`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_upgrade: Option<String>,
    /// The version the rules ask for when it is older than the running one: the downgrade
    /// is refused (rule 2), nothing is pending.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub refused_downgrade: Option<String>,
    /// The maintenance window the upgrade waits for (`begin/end`, RFC 3339).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_maintenance_window: Option<String>,
    /// Why, for people (cut to 512 bytes).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// The configuration's schema violations (`pointer: message`, ModuleConfigPolicy), at
    /// most 5, each cut to 256 bytes.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub config_invalid: Vec<String>,
    /// While it fails: the step, how many times in a row and the next try
    /// (`apply failed 3 times, next try at 2026-11-27T22:41:05Z`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<String>,
}

/// One Runtime, for people.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct RuntimeSummary {
    /// `namespace/name` of the Runtime.
    pub runtime: String,
    /// The cluster id its agent connects with.
    pub cluster: String,
    /// The runtime's overall state, if reconciled yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state: Option<String>,
    /// Number of modules per state.
    pub modules_by_state: BTreeMap<String, u32>,
    /// Its modules.
    pub modules: Vec<ModuleSummary>,
    /// The Runtime's labels: for the hub's access policy (`clusterSelector`), not shown, so
    /// not serialized (the admin API's documents are unchanged).
    #[serde(skip)]
    pub labels: BTreeMap<String, String>,
}

/// Longest module message kept.
const MESSAGE_BYTES: usize = 512;

fn cut(s: &str, max: usize) -> String {
    if s.len() <= max {
        return s.to_string();
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

impl ModuleSummary {
    /// The summary of one module's status.
    pub fn from_status(m: &ModuleStatus) -> Self {
        let running = m.actual_version.clone().or_else(|| m.installed_version.clone());
        let differs = m.desired_version.clone().filter(|d| running.as_ref() != Some(d));
        // Older than what runs: the operator refuses it (the same comparison as its rule 2).
        let older = |d: &String| {
            let (Some(r), Ok(d)) = (running.as_deref().and_then(|r| parse(r).ok()), parse(d)) else { return false };
            matches!(next_step(Some(&r), &d), Step::RefuseDowngrade { .. })
        };
        let (refused_downgrade, pending_upgrade) = match differs {
            Some(d) if older(&d) => (Some(d), None),
            other => (None, other),
        };
        Self {
            name: m.name.clone(),
            state: m.state.to_string(),
            running,
            next_maintenance_window: pending_upgrade.as_ref().and(m.next_maintenance_window.clone()),
            pending_upgrade,
            refused_downgrade,
            message: cut(&m.message, MESSAGE_BYTES),
            config_invalid: m
                .config
                .iter()
                .flat_map(|c| &c.errors)
                .take(5)
                .map(|e| {
                    let at =
                        if e.object.is_empty() { e.pointer.clone() } else { format!("{} {}", e.object, e.pointer) };
                    cut(&format!("{at}: {}", e.message), 256)
                })
                .collect(),
            retry: m.retry.as_ref().map(|r| {
                let times = if r.failures == 1 { "once".to_string() } else { format!("{} times", r.failures) };
                format!("{} failed {times}, next try at {}", r.step, r.next_attempt)
            }),
        }
    }
}

impl RuntimeSummary {
    /// The summary of a Runtime's status.
    pub fn from_runtime(rt: &Runtime) -> Self {
        let modules: Vec<ModuleSummary> =
            rt.status.as_ref().map(|s| s.modules.iter().map(ModuleSummary::from_status).collect()).unwrap_or_default();
        let mut modules_by_state = BTreeMap::new();
        for m in &modules {
            *modules_by_state.entry(m.state.clone()).or_insert(0) += 1;
        }
        Self {
            runtime: format!(
                "{}/{}",
                rt.metadata.namespace.as_deref().unwrap_or_default(),
                rt.metadata.name.as_deref().unwrap_or_default()
            ),
            cluster: rt.cluster_id(),
            state: rt.status.as_ref().and_then(|s| s.state).map(|s| s.to_string()),
            modules_by_state,
            modules,
            labels: rt.metadata.labels.clone().unwrap_or_default(),
        }
    }

    /// No module in `Error` or `Warning`.
    pub fn healthy(&self) -> bool {
        let bad = [State::Error.to_string(), State::Warning.to_string()];
        !self.modules.iter().any(|m| bad.contains(&m.state))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn schema_violations_are_listed_with_their_pointers() {
        let m = ModuleStatus {
            name: "redis".into(),
            config: Some(crate::config_policy::ModuleConfigStatus {
                errors: vec![crate::config_policy::ConfigError {
                    policy: "central".into(),
                    pointer: "/spec/replicas".into(),
                    message: "9 is greater than the maximum of 5".into(),
                    object: String::new(),
                }],
                ..Default::default()
            }),
            ..Default::default()
        };
        let s = ModuleSummary::from_status(&m);
        assert_eq!(s.config_invalid, vec!["/spec/replicas: 9 is greater than the maximum of 5".to_string()]);
        assert!(ModuleSummary::from_status(&ModuleStatus::default()).config_invalid.is_empty());
    }

    #[test]
    fn a_failing_module_says_which_step_how_often_and_when_next() {
        let mut m = ModuleStatus { name: "ghost".into(), state: State::Error, ..Default::default() };
        assert_eq!(ModuleSummary::from_status(&m).retry, None);
        m.retry = Some(crate::module::ModuleRetry {
            step: crate::module::FailedStep::Apply,
            failures: 3,
            next_attempt: "2026-11-27T22:41:05Z".into(),
        });
        assert_eq!(
            ModuleSummary::from_status(&m).retry.as_deref(),
            Some("apply failed 3 times, next try at 2026-11-27T22:41:05Z")
        );
    }

    #[test]
    fn a_waiting_upgrade_shows_where_it_goes_and_when() {
        let m = ModuleStatus {
            name: "nats".into(),
            desired_version: Some("2.0.0".into()),
            installed_version: Some("1.0.0".into()),
            actual_version: Some("1.0.0".into()),
            state: State::Ready,
            next_maintenance_window: Some("2030-01-01T02:00:00Z/2030-01-01T04:00:00Z".into()),
            message: "x".repeat(2000),
            ..Default::default()
        };
        let s = ModuleSummary::from_status(&m);
        assert_eq!(s.running.as_deref(), Some("1.0.0"));
        assert_eq!(s.pending_upgrade.as_deref(), Some("2.0.0"));
        assert!(s.next_maintenance_window.is_some());
        assert!(s.message.len() <= MESSAGE_BYTES + '…'.len_utf8());
        // Up to date: nothing pending, no window shown.
        let done = ModuleStatus { actual_version: Some("2.0.0".into()), ..m };
        let s = ModuleSummary::from_status(&done);
        assert_eq!((s.pending_upgrade, s.next_maintenance_window), (None, None));
    }

    #[test]
    fn a_refused_downgrade_is_not_a_pending_upgrade() {
        let m = ModuleStatus {
            name: "redis".into(),
            desired_version: Some("1.0.0".into()),
            installed_version: Some("2.0.0".into()),
            actual_version: Some("2.0.0".into()),
            state: State::Warning,
            message: "downgrade from 2.0.0 to 1.0.0 not applied".into(),
            ..Default::default()
        };
        let s = ModuleSummary::from_status(&m);
        assert_eq!(
            (s.running.as_deref(), s.pending_upgrade.as_deref(), s.refused_downgrade.as_deref()),
            (Some("2.0.0"), None, Some("1.0.0"))
        );
        let json = serde_json::to_value(&s).unwrap();
        assert_eq!(json["refusedDowngrade"], "1.0.0");
        // An unparsable running version: shown as pending, as before.
        let odd = ModuleStatus { actual_version: Some("custom".into()), ..m };
        assert_eq!(ModuleSummary::from_status(&odd).pending_upgrade.as_deref(), Some("1.0.0"));
    }

    #[test]
    fn errors_and_warnings_are_unhealthy() {
        let mut rt: Runtime = serde_json::from_value(serde_json::json!({
            "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "rt", "namespace": "kcp"}, "spec": {"clusterId": "c-1"}
        }))
        .unwrap();
        let s = RuntimeSummary::from_runtime(&rt);
        assert_eq!((s.runtime.as_str(), s.cluster.as_str(), s.state.as_deref()), ("kcp/rt", "c-1", None));
        assert!(s.healthy());
        rt.status = Some(crate::RuntimeStatus {
            modules: vec![
                ModuleStatus { name: "a".into(), state: State::Ready, ..Default::default() },
                ModuleStatus { name: "b".into(), state: State::Error, ..Default::default() },
                ModuleStatus { name: "c".into(), state: State::Ready, ..Default::default() },
            ],
            ..Default::default()
        });
        let s = RuntimeSummary::from_runtime(&rt);
        assert_eq!(s.modules_by_state, BTreeMap::from([("Error".into(), 1), ("Ready".into(), 2)]));
        assert!(!s.healthy());
    }
}
