//! Maintenance windows: which window a runtime may be disrupted in, resolved from a
//! maintenance policy.
//!
//! Two jobs, two files, because they change for different reasons: [`policy`] reads the
//! policy document (lifecycle-manager's JSON, Go-like key matching, the custom resource)
//! and checks it, and decides which rule's windows apply to a runtime's labels; [`window`]
//! knows times and calendars: it parses `begin` / `end` and finds the next occurrence of a
//! window. The lifecycle operator only needs [`CompiledPolicy::next_window`].
//!
//! A policy is the JSON Kyma lifecycle-manager reads from its maintenance policy files, and
//! those files load unchanged:
//!
//! ```json
//! {
//!   "rules": [
//!     { "match": { "plan": "trial|free" },
//!       "windows": [ { "days": ["Mon","Tue","Wed","Thu","Fri","Sat","Sun"],
//!                      "begin": "01:00:00+00:00", "end": "01:00:00+00:00" } ] },
//!     { "match": { "region": "europe|eu-|uksouth" },
//!       "windows": [ { "begin": "2024-10-10T20:00:00Z", "end": "2024-10-11T00:00:00Z" } ] }
//!   ],
//!   "default": { "days": ["Sat"], "begin": "21:00:00+00:00", "end": "23:00:00+00:00" }
//! }
//! ```
//!
//! The same document is the spec of the [`MaintenancePolicy`] custom resource:
//!
//! ```
//! use fleetwatch_api::maintenance::MaintenancePolicy;
//! let mp: MaintenancePolicy = serde_json::from_value(serde_json::json!({
//!     "apiVersion": "operator.fleetwatch.dev/v1alpha1",
//!     "kind": "MaintenancePolicy",
//!     "metadata": {"name": "default", "namespace": "kcp-system"},
//!     "spec": {"rules": [], "default": {"days": ["Sat"], "begin": "21:00:00Z", "end": "23:00:00Z"}}
//! })).unwrap();
//! assert!(mp.spec.compile().is_ok());
//! ```
//!
//! # Resolution
//!
//! - A rule matches a runtime when any of its non-empty `match` fields (`plan`, `region`,
//!   `platformRegion`, `globalAccountID`) finds its regular expression in the runtime's
//!   non-empty value of that label (an unanchored search, like Go's `MatchString`). A rule
//!   without match fields matches nothing.
//! - The **first** matching rule decides: its windows are tried in the order listed and the
//!   first that yields one wins. If it yields none, later rules are not consulted; the
//!   `default` window is tried (as lifecycle-manager does with its default options).
//! - A window with `days` (`"Mon"`..`"Sun"`) recurs on those days. `begin` and `end` are a
//!   time of day with a UTC offset, `HH:MM:SS±HH:MM` or `HH:MM:SSZ` (a full RFC 3339 value
//!   works too; only its time of day and offset are used). The day is the weekday of
//!   `begin` in `begin`'s offset. An `end` at or before `begin` is on the next day.
//! - A window without `days` is absolute: `begin` and `end` are RFC 3339 date-times. Times
//!   of day without `days` are refused with an explanation (a deliberate difference:
//!   lifecycle-manager dates them in year 0, so such a window silently never opens).
//! - Without `ongoing`, the window must begin strictly after the resolution time. With
//!   `ongoing`, any window whose end lies more than `min_remaining` after the resolution
//!   time qualifies, so a window in progress is returned while enough of it remains.
//!
//! ```
//! use fleetwatch_api::maintenance::{MaintenancePolicySpec, NextWindowOptions, RuntimeLabels, next_window};
//! let policy = MaintenancePolicySpec::from_json(r#"{
//!     "rules": [{"match": {"plan": "trial|free"},
//!                "windows": [{"days": ["Sat"], "begin": "22:00:00Z", "end": "02:00:00Z"}]}],
//!     "default": {"days": ["Sun"], "begin": "01:00:00+00:00", "end": "03:00:00+00:00"}
//! }"#).unwrap();
//! let trial = RuntimeLabels { plan: "trial".into(), ..RuntimeLabels::default() };
//! let at = "2024-10-09T12:00:00Z".parse().unwrap(); // a Wednesday
//! let w = next_window(&policy, &trial, at, NextWindowOptions::default()).unwrap();
//! assert_eq!(w.begin.to_string(), "2024-10-12T22:00:00Z"); // Saturday night ...
//! assert_eq!(w.end.to_string(), "2024-10-13T02:00:00Z"); //   ... into Sunday
//! ```
//!
//! # Compatibility with lifecycle-manager
//!
//! For the same policy, labels, time and options the result is the window lifecycle-manager's
//! `resolver.Resolve` returns, with these deliberate differences:
//! - Recurring windows are searched from the day before the resolution time (in `begin`'s
//!   offset), so a window that began yesterday and is still running is found with
//!   `ongoing`, and a window whose `begin` falls on the previous calendar day in UTC (e.g.
//!   `22:00:00-05:00`) is not skipped. lifecycle-manager starts at the resolution time's
//!   calendar day and returns a later window in those cases.
//! - An unknown day name, a bad time or a bad regular expression is an error
//!   ([`MaintenanceError`]); lifecycle-manager ignores unknown day names.
//! - An absolute window whose end is not after its begin never yields a window.
//! - Object keys match case-insensitively, as Go's `encoding/json` does
//!   (`"globalAccountId"` is `globalAccountID`); unknown keys are ignored. A missing
//!   `begin`/`end` is Go's zero time, i.e. `00:00:00Z` for a recurring window.

use std::fmt;

use jiff::{SignedDuration, Timestamp};

pub mod policy;
pub mod window;

pub use policy::{
    CompiledPolicy, MaintenancePolicy, MaintenancePolicySpec, MaintenancePolicyStatus, PolicyMatch, PolicyRule,
    RuntimeLabels, WindowSpec,
};
pub use window::{NextWindowOptions, TimeError, Window};

/// The runtime label names a rule can match, in the order they are checked.
pub const LABEL_NAMES: [&str; 4] = ["globalAccountID", "plan", "region", "platformRegion"];

/// The day names a recurring window may list.
pub const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// The default minimum remaining length of an ongoing window (lifecycle-manager's setting).
pub const DEFAULT_MIN_REMAINING: SignedDuration = SignedDuration::from_mins(20);

/// Why a policy is invalid, or why it yields no window.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MaintenanceError {
    /// The document is not a policy.
    #[error("invalid maintenance policy JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// A `match` field is not a valid regular expression.
    #[error("invalid regular expression {pattern:?} in {location}: {reason}")]
    InvalidRegex {
        /// Where, e.g. `rules[0].match.plan`.
        location: String,
        /// The pattern.
        pattern: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A `begin` or `end` is not a time.
    #[error(
        "invalid time {value:?} in {location}: {reason} (expected HH:MM:SS±HH:MM, e.g. 21:00:00Z, \
         or an RFC 3339 date-time, e.g. 2024-10-10T20:00:00Z)"
    )]
    InvalidTime {
        /// Where, e.g. `default.begin`.
        location: String,
        /// The value.
        value: String,
        /// What is wrong with it.
        #[source]
        reason: TimeError,
    },
    /// A window with times of day but no `days`: lifecycle-manager dates such times on year
    /// 0, so the window would never open. Refused, with what to write instead.
    #[error(
        "{location} has times of day ({begin}, {end}) but no days, so it would never open (lifecycle-manager \
         dates them in year 0): list its days (all seven for a daily window), or give RFC 3339 date-times \
         for a one-off window"
    )]
    TimeOfDayWithoutDays {
        /// Where, e.g. `default`.
        location: String,
        /// The begin as written.
        begin: String,
        /// The end as written.
        end: String,
    },
    /// A day name other than `Mon`..`Sun`.
    #[error("unknown day {day:?} in {location} (expected one of Mon, Tue, Wed, Thu, Fri, Sat, Sun)")]
    UnknownDay {
        /// Where, e.g. `rules[1].windows[0].days`.
        location: String,
        /// The day name.
        day: String,
    },
    /// A runtime label name other than those in [`LABEL_NAMES`].
    #[error("unknown runtime label {0:?} (expected plan, region, platformRegion or globalAccountID)")]
    UnknownLabel(String),
    /// Neither the matching rule nor the default yields a window.
    #[error("no maintenance window found: {0}")]
    NoWindow(NoWindowReason),
}

/// Why resolution found no window.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NoWindowReason {
    /// The index of the rule that matched (and yielded nothing), if any.
    pub matched_rule: Option<usize>,
    /// Whether the policy has a default window (which yielded nothing).
    pub has_default: bool,
}

impl fmt::Display for NoWindowReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.matched_rule {
            Some(i) => write!(f, "rules[{i}] matches but has no upcoming window")?,
            None => write!(f, "no rule matches the runtime")?,
        }
        if self.has_default {
            write!(f, ", and the default window has none either")
        } else {
            write!(f, ", and the policy has no default window")
        }
    }
}

/// The next maintenance window for a runtime: checks the policy, then resolves as
/// [`CompiledPolicy::next_window`] does. To resolve many times, compile once.
///
/// ```
/// use fleetwatch_api::maintenance::{MaintenancePolicySpec, NextWindowOptions, RuntimeLabels, next_window};
/// let policy = MaintenancePolicySpec::from_json(
///     r#"{"default": {"days": ["Sat"], "begin": "21:00:00+00:00", "end": "23:00:00+00:00"}}"#).unwrap();
/// let at = "2024-10-12T22:00:00Z".parse().unwrap(); // Saturday, in the window
/// let next = next_window(&policy, &RuntimeLabels::default(), at, NextWindowOptions::default()).unwrap();
/// assert_eq!(next.begin.to_string(), "2024-10-19T21:00:00Z");
/// let ongoing = NextWindowOptions { ongoing: true, ..NextWindowOptions::default() };
/// let now = next_window(&policy, &RuntimeLabels::default(), at, ongoing).unwrap();
/// assert_eq!(now.begin.to_string(), "2024-10-12T21:00:00Z");
/// ```
pub fn next_window(
    policy: &MaintenancePolicySpec,
    labels: &RuntimeLabels,
    at: Timestamp,
    opts: NextWindowOptions,
) -> Result<Window, MaintenanceError> {
    policy.compile()?.next_window(labels, at, opts)
}

/// Helpers and lifecycle-manager's own test policies, shared by the tests of both files.
#[cfg(test)]
pub(crate) mod testdata {
    use super::*;

    pub(crate) fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    pub(crate) fn win(begin: &str, end: &str) -> Window {
        Window { begin: ts(begin), end: ts(end) }
    }

    pub(crate) fn labels(gaid: &str, plan: &str, region: &str, platform_region: &str) -> RuntimeLabels {
        RuntimeLabels {
            global_account_id: gaid.into(),
            plan: plan.into(),
            region: region.into(),
            platform_region: platform_region.into(),
        }
    }

    pub(crate) fn next(policy: &str, l: &RuntimeLabels, at: &str) -> Result<Window, MaintenanceError> {
        next_window(&MaintenancePolicySpec::from_json(policy)?, l, ts(at), NextWindowOptions::default())
    }

    pub(crate) fn ongoing(min_remaining: SignedDuration) -> NextWindowOptions {
        NextWindowOptions { ongoing: true, min_remaining }
    }

    /// lifecycle-manager's `maintenancewindows/resolver/testdata/ruleset-1.json`, as is:
    /// note `globalAccountId` (case-insensitive key), the `default` with `timeBegin` /
    /// `timeEnd` (unknown keys, so begin and end are Go's zero time: Sat 00:00Z–Sun 00:00Z)
    /// and the last rule's absolute window that ends before it begins.
    pub(crate) const RULESET_1: &str = r#"{
      "rules": [
        {"match": {"plan": "trial|free"},
         "windows": [{"days": ["Mon","Tue","Wed","Thu","Fri","Sat","Sun"], "begin": "01:00:00Z", "end": "01:00:00Z"}]},
        {"match": {"region": "europe|eu-|uksouth"},
         "windows": [{"begin": "2024-10-10T20:00:00Z", "end": "2024-10-11T00:00:00Z"},
                     {"begin": "2024-12-08T20:00:00Z", "end": "2024-12-09T00:00:00Z"}]},
        {"match": {"globalAccountId": "sup-er-ga-case", "platformRegion": "super-mario"},
         "windows": [{"begin": "2024-10-10T20:00:00Z", "end": "2024-10-11T00:00:00Z"},
                     {"begin": "2024-12-08T20:00:00Z", "end": "2024-12-09T00:00:00Z"}]},
        {"match": {"region": "asia|japan|australia|ap-"},
         "windows": [{"begin": "2024-10-15T13:00:00Z", "end": "2024-10-15T17:00:00Z"},
                     {"begin": "2024-12-13T13:00:00Z", "end": "2024-12-13T17:00:00Z"}]},
        {"match": {"region": "europe|eu-|uksouth"},
         "windows": [{"begin": "2024-12-18T20:00:00Z", "end": "2024-12-19T00:00:00Z"}]},
        {"match": {"region": "centralus|eastus|westus|northamerica|southamerica|us-|ca-|sa-"},
         "windows": [{"begin": "2024-10-20T04:00:00Z", "end": "2024-10-20T08:00:00Z"},
                     {"begin": "2024-12-20T04:00:00Z", "end": "2024-12-13T08:00:00Z"}]}
      ],
      "default": {"days": ["Sat"], "timeBegin": "20:00:00Z", "timeEnd": "00:00:00Z"}
    }"#;

    /// lifecycle-manager's `internal/maintenancewindows/testdata/policy.json`.
    pub(crate) const LM_POLICY: &str = r#"{
      "rules": [
        {"match": {"plan": "trial|free"},
         "windows": [{"days": ["Mon","Tue","Wed","Thu","Fri","Sat","Sun"], "begin": "01:00:00+00:00", "end": "01:00:00+00:00"}]},
        {"match": {"region": "europe|eu-|uksouth"},
         "windows": [{"days": ["Sat"], "begin": "21:00:00+00:00", "end": "00:00:00+00:00"}]}
      ],
      "default": {"days": ["Sat"], "begin": "21:00:00+00:00", "end": "23:00:00+00:00"}
    }"#;
}

#[cfg(test)]
mod tests {
    use super::testdata::*;
    use super::*;

    #[test]
    fn maintenance_lifecycle_manager_resolver_cases() {
        // The cases of lifecycle-manager's MaintWindowSuite (resolver defaults: first match
        // only, fall back to the default, minimum 1h for ongoing windows).
        let p = MaintenancePolicySpec::from_json(RULESET_1).unwrap().compile().unwrap();
        let plain = NextWindowOptions::default();
        let uk = labels("", "", "uksouth-vikings", "");

        // "freetrials next"
        let w = p.next_window(&labels("", "trial", "", ""), ts("2024-10-03T05:05:00Z"), plain).unwrap();
        assert_eq!(w, win("2024-10-04T01:00:00Z", "2024-10-05T01:00:00Z"));
        // "ongoing"
        let w = p.next_window(&uk, ts("2024-10-10T22:05:00Z"), ongoing(SignedDuration::from_hours(1))).unwrap();
        assert_eq!(w, win("2024-10-10T20:00:00Z", "2024-10-11T00:00:00Z"));
        // "ongoing+minsize"
        let w = p.next_window(&uk, ts("2024-10-10T22:05:00Z"), ongoing(SignedDuration::from_hours(5))).unwrap();
        assert_eq!(w, win("2024-12-08T20:00:00Z", "2024-12-09T00:00:00Z"));
        // "first match fail -> default": the first matching rule has no window left, so the
        // default (Go zero times: Saturday 00:00Z to Sunday 00:00Z) and not the later
        // europe rule.
        let w = p.next_window(&uk, ts("2024-12-10T22:05:00Z"), plain).unwrap();
        assert_eq!(w, win("2024-12-14T00:00:00Z", "2024-12-15T00:00:00Z"));
    }
}
