//! Rule 3: an upgrade to a template that `requiresDowntime` starts only inside a
//! maintenance window with enough time left; until then the current version is kept.

use std::sync::Arc;

use fleetwatch_api::Runtime;
use fleetwatch_api::maintenance::{MaintenancePolicy, MaintenancePolicySpec, NextWindowOptions, RuntimeLabels, Window};
use kube::ResourceExt;

/// Where the operator reads time: the system clock, or one a test moves.
pub trait Clock: Send + Sync {
    /// Now.
    fn now(&self) -> jiff::Timestamp;
}

/// The system clock.
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> jiff::Timestamp {
        jiff::Timestamp::now()
    }
}

/// A clock that stands still until told otherwise.
pub struct ManualClock(std::sync::Mutex<jiff::Timestamp>);

impl ManualClock {
    /// A clock showing `t`.
    pub fn new(t: jiff::Timestamp) -> Self {
        Self(std::sync::Mutex::new(t))
    }

    /// Sets the time.
    pub fn set(&self, t: jiff::Timestamp) {
        if let Ok(mut g) = self.0.lock() {
            *g = t;
        }
    }
}

impl Clock for ManualClock {
    fn now(&self) -> jiff::Timestamp {
        self.0.lock().map(|g| *g).unwrap_or_else(|_| jiff::Timestamp::now())
    }
}

/// Label prefix of the runtime values maintenance rules match on.
pub(crate) const LABEL_PREFIX: &str = "operator.fleetwatch.dev/";

/// What the rule decides for a downtime upgrade now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Gate {
    /// Go ahead (inside a window, or windows skipped).
    Open,
    /// Wait for this window.
    Wait(Window),
    /// No window can be found; the message says why.
    Never(String),
    /// The policy the runtime names is missing or invalid: fail closed, no downtime upgrade
    /// until it is fixed. The message names the policy and what is wrong.
    Broken(String),
}

/// Decides whether a downtime upgrade of `rt` may start at `now`, given every policy of the
/// control plane (`policies`). Pure: the caller reads the store and the clock.
pub(crate) fn gate(
    rt: &Runtime,
    policies: &[Arc<MaintenancePolicy>],
    now: jiff::Timestamp,
    min_remaining: jiff::SignedDuration,
) -> Gate {
    if rt.spec.skip_maintenance_windows {
        return Gate::Open;
    }
    // The runtime's own windows override the policy; each is tried as a default window.
    let specs: Vec<MaintenancePolicySpec> = if rt.spec.maintenance_windows.is_empty() {
        let named = rt.spec.maintenance_policy.clone();
        let name = named.clone().unwrap_or_else(|| "default".into());
        let found = policies.iter().find(|p| p.namespace() == rt.namespace() && p.name_any() == name);
        match (found, named) {
            (Some(p), _) => vec![p.spec.clone()],
            // A policy the runtime names must exist: a typo never turns windows off.
            (None, Some(name)) => {
                let ns = rt.namespace().unwrap_or_default();
                return Gate::Broken(format!("maintenance policy {ns}/{name} not found"));
            }
            // No policy named and no `default` one: no window is known, so a downtime
            // upgrade is held (fails closed) until one is configured or windows are skipped.
            (None, None) => {
                let ns = rt.namespace().unwrap_or_default();
                return Gate::Broken(format!(
                    "no maintenance window is configured: name a MaintenancePolicy (maintenancePolicy), create \
                     one called default in namespace {ns}, set maintenanceWindows, or set skipMaintenanceWindows"
                ));
            }
        }
    } else {
        rt.spec
            .maintenance_windows
            .iter()
            .map(|w| MaintenancePolicySpec { rules: Vec::new(), default: Some(w.clone()) })
            .collect()
    };
    let mut labels = RuntimeLabels::default();
    for (k, v) in rt.labels() {
        if let Some(name) = k.strip_prefix(LABEL_PREFIX) {
            let _ = labels.set(name, v.clone());
        }
    }
    let opts = NextWindowOptions { ongoing: true, min_remaining };
    let mut next: Option<Window> = None;
    let mut why = String::new();
    for spec in specs {
        let compiled = match spec.compile() {
            Ok(c) => c,
            Err(e) => {
                let which = match (&rt.spec.maintenance_policy, rt.spec.maintenance_windows.is_empty()) {
                    (_, false) => "the runtime's maintenanceWindows".to_string(),
                    (Some(n), true) => format!("maintenance policy {}/{n}", rt.namespace().unwrap_or_default()),
                    (None, true) => format!("maintenance policy {}/default", rt.namespace().unwrap_or_default()),
                };
                return Gate::Broken(format!("{which} is invalid: {e}"));
            }
        };
        match compiled.next_window(&labels, now, opts) {
            Ok(w) if w.contains(now) => return Gate::Open,
            Ok(w) => {
                if next.is_none_or(|n| w.begin < n.begin) {
                    next = Some(w);
                }
            }
            Err(e) => why = e.to_string(),
        }
    }
    match next {
        Some(w) => Gate::Wait(w),
        None => Gate::Never(why),
    }
}
