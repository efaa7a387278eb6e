//! Maintenance windows: which window a runtime may be disrupted in, resolved from a
//! maintenance policy.
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

use jiff::civil::{Date, DateTime, Time};
use jiff::tz::Offset;
use jiff::{SignedDuration, Timestamp};
use kube::CustomResource;
use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

/// The runtime label names a rule can match, in the order they are checked.
pub const LABEL_NAMES: [&str; 4] = ["globalAccountID", "plan", "region", "platformRegion"];

/// The day names a recurring window may list.
pub const DAY_NAMES: [&str; 7] = ["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"];

/// The default minimum remaining length of an ongoing window (lifecycle-manager's setting).
pub const DEFAULT_MIN_REMAINING: SignedDuration = SignedDuration::from_mins(20);

/// A maintenance policy: rules that pick windows by runtime labels, and a default window.
/// The same JSON as lifecycle-manager's maintenance policy files.
#[derive(CustomResource, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "MaintenancePolicy",
    plural = "maintenancepolicies",
    namespaced,
    printcolumn = r#"{"name":"Default Begin","type":"string","jsonPath":".spec.default.begin"}"#,
    printcolumn = r#"{"name":"Default End","type":"string","jsonPath":".spec.default.end"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "Maintenance windows for runtimes, chosen by plan, region, platform region and global account"
)]
pub struct MaintenancePolicySpec {
    /// Rules in order; the first whose `match` fits the runtime decides.
    #[serde(default)]
    pub rules: Vec<PolicyRule>,
    /// The window used when no rule matches or the matching rule yields no window.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<WindowSpec>,
}

/// One rule: which runtimes, and their windows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct PolicyRule {
    /// Which runtimes this rule is for.
    #[serde(rename = "match", default)]
    pub matcher: PolicyMatch,
    /// Windows in order of preference: the first that yields a window wins.
    #[serde(default)]
    pub windows: Vec<WindowSpec>,
}

/// Regular expressions on runtime labels; a rule matches when any of them is found in the
/// runtime's value. Empty or absent fields are not checked.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-preserve-unknown-fields" = true))]
pub struct PolicyMatch {
    /// Regular expression on the global account id.
    #[serde(rename = "globalAccountID", default, skip_serializing_if = "Option::is_none")]
    pub global_account_id: Option<String>,
    /// Regular expression on the plan (e.g. `trial|free`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub plan: Option<String>,
    /// Regular expression on the region (e.g. `europe|eu-`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Regular expression on the platform region.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_region: Option<String>,
}

/// A window as written in a policy.
///
/// With `days`, a recurring window: `begin` and `end` are times of day with an offset
/// (`01:00:00Z`, `21:00:00+02:00`), and an `end` at or before `begin` is on the next day.
/// Without `days`, an absolute window between two RFC 3339 date-times.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct WindowSpec {
    /// Days the window recurs on: `Mon`, `Tue`, `Wed`, `Thu`, `Fri`, `Sat`, `Sun`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(schema_with = "day_names")]
    pub days: Vec<String>,
    /// Start: `HH:MM:SS±HH:MM` (or `Z`) with `days`, else an RFC 3339 date-time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub begin: Option<String>,
    /// End: `HH:MM:SS±HH:MM` (or `Z`) with `days`, else an RFC 3339 date-time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<String>,
}

fn day_names(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "array", "items": {"type": "string", "enum": DAY_NAMES}})
}

/// Deserialization as Go's `encoding/json` reads lifecycle-manager's files: keys match
/// case-insensitively (the last of duplicates wins) and unknown keys are ignored.
impl<'de> Deserialize<'de> for MaintenancePolicySpec {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        struct Plain {
            #[serde(default)]
            rules: Vec<PolicyRule>,
            #[serde(default)]
            default: Option<WindowSpec>,
        }
        let mut value = serde_json::Value::deserialize(deserializer)?;
        canonical_keys(&mut value);
        let plain = Plain::deserialize(value).map_err(serde::de::Error::custom)?;
        Ok(Self { rules: plain.rules, default: plain.default })
    }
}

/// Renames keys that equal a known field name ignoring ASCII case to that name.
fn canonical_keys(policy: &mut serde_json::Value) {
    const WINDOW: &[&str] = &["days", "begin", "end"];
    fn rename(value: &mut serde_json::Value, known: &[&str]) {
        let serde_json::Value::Object(map) = value else { return };
        for (key, v) in std::mem::take(map) {
            let key = known.iter().find(|n| n.eq_ignore_ascii_case(&key)).map_or(key, |n| (*n).to_string());
            map.insert(key, v);
        }
    }
    rename(policy, &["rules", "default"]);
    let serde_json::Value::Object(top) = policy else { return };
    if let Some(default) = top.get_mut("default") {
        rename(default, WINDOW);
    }
    let Some(serde_json::Value::Array(rules)) = top.get_mut("rules") else { return };
    for rule in rules {
        rename(rule, &["match", "windows"]);
        let serde_json::Value::Object(rule) = rule else { continue };
        if let Some(m) = rule.get_mut("match") {
            rename(m, &LABEL_NAMES);
        }
        if let Some(serde_json::Value::Array(windows)) = rule.get_mut("windows") {
            windows.iter_mut().for_each(|w| rename(w, WINDOW));
        }
    }
}

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
        reason: String,
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

/// The runtime's labels that rules match on. An empty value matches no rule field.
///
/// ```
/// use fleetwatch_api::maintenance::RuntimeLabels;
/// let mut labels = RuntimeLabels::default();
/// labels.set("plan", "trial").unwrap();
/// labels.set("platformRegion", "cf-eu10").unwrap();
/// assert_eq!(labels.plan, "trial");
/// assert!(labels.set("zone", "a").is_err());
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuntimeLabels {
    /// The plan (lifecycle-manager: label `kyma-project.io/broker-plan-name`).
    pub plan: String,
    /// The region.
    pub region: String,
    /// The platform region.
    pub platform_region: String,
    /// The global account id.
    pub global_account_id: String,
}

impl RuntimeLabels {
    /// Sets one label by its policy name (`plan`, `region`, `platformRegion`,
    /// `globalAccountID`; ASCII case is ignored).
    pub fn set(&mut self, name: &str, value: impl Into<String>) -> Result<(), MaintenanceError> {
        let slot = match LABEL_NAMES.iter().position(|n| n.eq_ignore_ascii_case(name)) {
            Some(0) => &mut self.global_account_id,
            Some(1) => &mut self.plan,
            Some(2) => &mut self.region,
            Some(3) => &mut self.platform_region,
            _ => return Err(MaintenanceError::UnknownLabel(name.to_string())),
        };
        *slot = value.into();
        Ok(())
    }

    fn get(&self, field: Field) -> &str {
        match field {
            Field::GlobalAccountId => &self.global_account_id,
            Field::Plan => &self.plan,
            Field::Region => &self.region,
            Field::PlatformRegion => &self.platform_region,
        }
    }
}

/// How to pick a window.
///
/// ```
/// use fleetwatch_api::maintenance::NextWindowOptions;
/// let opts = NextWindowOptions { ongoing: true, ..NextWindowOptions::default() };
/// assert_eq!(opts.min_remaining, jiff::SignedDuration::from_mins(20));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NextWindowOptions {
    /// Also return a window that has already begun, if more than `min_remaining` of it is
    /// left. Without it, only a window that begins after the resolution time qualifies.
    pub ongoing: bool,
    /// With `ongoing`: how much of a window must remain (strictly more). Default 20 minutes.
    pub min_remaining: SignedDuration,
}

impl Default for NextWindowOptions {
    fn default() -> Self {
        Self { ongoing: false, min_remaining: DEFAULT_MIN_REMAINING }
    }
}

/// A resolved maintenance window; serializes as `{"begin": RFC 3339, "end": RFC 3339}`.
///
/// ```
/// use fleetwatch_api::maintenance::Window;
/// let w = Window { begin: "2024-10-12T22:00:00Z".parse().unwrap(), end: "2024-10-13T02:00:00Z".parse().unwrap() };
/// assert!(w.contains("2024-10-13T01:00:00Z".parse().unwrap()));
/// assert_eq!(serde_json::to_string(&w).unwrap(),
///            r#"{"begin":"2024-10-12T22:00:00Z","end":"2024-10-13T02:00:00Z"}"#);
/// ```
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// When the window opens.
    pub begin: Timestamp,
    /// When it closes.
    pub end: Timestamp,
}

impl Window {
    /// Whether `at` lies in the window (`begin <= at < end`).
    pub fn contains(&self, at: Timestamp) -> bool {
        self.begin <= at && at < self.end
    }
}

impl MaintenancePolicySpec {
    /// Parses a policy document (a lifecycle-manager maintenance policy file) and checks it.
    ///
    /// ```
    /// use fleetwatch_api::maintenance::MaintenancePolicySpec;
    /// let err = MaintenancePolicySpec::from_json(r#"{"default": {"days": ["Saturday"]}}"#).unwrap_err();
    /// assert!(err.to_string().contains(r#"unknown day "Saturday" in default.days"#));
    /// ```
    pub fn from_json(json: &str) -> Result<Self, MaintenanceError> {
        let spec: Self = serde_json::from_str(json)?;
        spec.compile()?;
        Ok(spec)
    }

    /// Checks the policy and prepares it for resolution: compiles the regular expressions and
    /// parses days and times.
    ///
    /// ```
    /// use fleetwatch_api::maintenance::MaintenancePolicySpec;
    /// let spec: MaintenancePolicySpec = serde_json::from_str(r#"{"rules": [{"match": {"plan": "("}}]}"#).unwrap();
    /// let err = spec.compile().unwrap_err().to_string();
    /// assert!(err.starts_with(r#"invalid regular expression "(" in rules[0].match.plan"#), "{err}");
    /// ```
    pub fn compile(&self) -> Result<CompiledPolicy, MaintenanceError> {
        let rules = self
            .rules
            .iter()
            .enumerate()
            .map(|(i, rule)| {
                let m = &rule.matcher;
                let mut matchers = Vec::new();
                for (field, pattern) in [
                    (Field::GlobalAccountId, &m.global_account_id),
                    (Field::Plan, &m.plan),
                    (Field::Region, &m.region),
                    (Field::PlatformRegion, &m.platform_region),
                ] {
                    let Some(pattern) = pattern.as_deref().filter(|p| !p.is_empty()) else { continue };
                    let regex = Regex::new(pattern).map_err(|e| MaintenanceError::InvalidRegex {
                        location: format!("rules[{i}].match.{}", field.name()),
                        pattern: pattern.to_string(),
                        reason: regex_reason(&e),
                    })?;
                    matchers.push((field, regex));
                }
                let windows = rule
                    .windows
                    .iter()
                    .enumerate()
                    .map(|(j, w)| CompiledWindow::new(w, &format!("rules[{i}].windows[{j}]")))
                    .collect::<Result<_, _>>()?;
                Ok(CompiledRule { matchers, windows })
            })
            .collect::<Result<_, MaintenanceError>>()?;
        let default = self.default.as_ref().map(|w| CompiledWindow::new(w, "default")).transpose()?;
        Ok(CompiledPolicy { rules, default })
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

/// A checked policy, ready to resolve windows.
#[derive(Clone, Debug)]
pub struct CompiledPolicy {
    rules: Vec<CompiledRule>,
    default: Option<CompiledWindow>,
}

impl CompiledPolicy {
    /// The window for a runtime with these labels at time `at`: from the first rule that
    /// matches, else (or when that rule yields none) from the default window.
    ///
    /// ```
    /// use fleetwatch_api::maintenance::{MaintenancePolicySpec, NextWindowOptions, RuntimeLabels};
    /// let policy = MaintenancePolicySpec::from_json(r#"{"rules": [{"match": {"region": "eu-"},
    ///     "windows": [{"begin": "2024-10-10T20:00:00Z", "end": "2024-10-11T00:00:00Z"}]}]}"#)
    ///     .unwrap().compile().unwrap();
    /// let eu = RuntimeLabels { region: "eu-west-1".into(), ..RuntimeLabels::default() };
    /// let before = "2024-10-01T00:00:00Z".parse().unwrap();
    /// assert!(policy.next_window(&eu, before, NextWindowOptions::default()).is_ok());
    /// let after = "2024-11-01T00:00:00Z".parse().unwrap();
    /// assert!(policy.next_window(&eu, after, NextWindowOptions::default()).is_err());
    /// ```
    pub fn next_window(
        &self,
        labels: &RuntimeLabels,
        at: Timestamp,
        opts: NextWindowOptions,
    ) -> Result<Window, MaintenanceError> {
        let matched_rule = self.rules.iter().position(|r| r.matches(labels));
        if let Some(rule) = matched_rule.map(|i| &self.rules[i])
            && let Some(w) = rule.windows.iter().find_map(|w| w.next(at, opts))
        {
            return Ok(w);
        }
        if let Some(w) = self.default.as_ref().and_then(|w| w.next(at, opts)) {
            return Ok(w);
        }
        Err(MaintenanceError::NoWindow(NoWindowReason { matched_rule, has_default: self.default.is_some() }))
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    GlobalAccountId,
    Plan,
    Region,
    PlatformRegion,
}

impl Field {
    fn name(self) -> &'static str {
        match self {
            Field::GlobalAccountId => LABEL_NAMES[0],
            Field::Plan => LABEL_NAMES[1],
            Field::Region => LABEL_NAMES[2],
            Field::PlatformRegion => LABEL_NAMES[3],
        }
    }
}

#[derive(Clone, Debug)]
struct CompiledRule {
    matchers: Vec<(Field, Regex)>,
    windows: Vec<CompiledWindow>,
}

impl CompiledRule {
    fn matches(&self, labels: &RuntimeLabels) -> bool {
        self.matchers.iter().any(|(field, re)| {
            let value = labels.get(*field);
            !value.is_empty() && re.is_match(value)
        })
    }
}

#[derive(Clone, Debug)]
enum CompiledWindow {
    /// Recurs on `days` (indexed by `Weekday::to_monday_zero_offset`).
    Recurring {
        days: [bool; 7],
        begin: WindowTime,
        end: WindowTime,
    },
    Absolute {
        begin: Timestamp,
        end: Timestamp,
    },
}

impl CompiledWindow {
    fn new(spec: &WindowSpec, location: &str) -> Result<Self, MaintenanceError> {
        let time = |value: &Option<String>, field: &str| match value {
            None => Ok(WindowTime::GO_ZERO),
            Some(v) => WindowTime::parse(v).map_err(|reason| MaintenanceError::InvalidTime {
                location: format!("{location}.{field}"),
                value: v.clone(),
                reason,
            }),
        };
        let (begin, end) = (time(&spec.begin, "begin")?, time(&spec.end, "end")?);
        if spec.days.is_empty() {
            if begin.date.is_none() || end.date.is_none() {
                return Err(MaintenanceError::TimeOfDayWithoutDays {
                    location: location.to_string(),
                    begin: spec.begin.clone().unwrap_or_default(),
                    end: spec.end.clone().unwrap_or_default(),
                });
            }
            return Ok(Self::Absolute { begin: begin.instant(), end: end.instant() });
        }
        let mut days = [false; 7];
        for day in &spec.days {
            let Some(i) = DAY_NAMES.iter().position(|d| d == day) else {
                return Err(MaintenanceError::UnknownDay { location: format!("{location}.days"), day: day.clone() });
            };
            days[i] = true;
        }
        Ok(Self::Recurring { days, begin, end })
    }

    /// The first occurrence of this window that qualifies at `at`.
    fn next(&self, at: Timestamp, opts: NextWindowOptions) -> Option<Window> {
        let qualifies = |w: &Window| {
            let ok =
                if opts.ongoing { at.checked_add(opts.min_remaining).is_ok_and(|t| t < w.end) } else { at < w.begin };
            ok.then_some(*w)
        };
        match self {
            Self::Absolute { begin, end } => {
                let w = Window { begin: *begin, end: *end };
                if w.end <= w.begin { None } else { qualifies(&w) }
            }
            Self::Recurring { days, begin, end } => {
                // Occurrences from the day before `at` (in begin's offset), so one that began
                // yesterday and is still running is seen, up to a week ahead.
                let today = begin.offset.to_datetime(at).date();
                let mut day = today.yesterday().ok()?;
                for _ in 0..9 {
                    if days[day.weekday().to_monday_zero_offset() as usize] {
                        let w = begin.occurrence(day, end)?;
                        if let Some(w) = qualifies(&w) {
                            return Some(w);
                        }
                    }
                    day = day.tomorrow().ok()?;
                }
                None
            }
        }
    }
}

/// A policy time: a time of day (with a date for RFC 3339 values) and its UTC offset.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct WindowTime {
    /// `None` for a time-only value; Go dates those 0000-01-01.
    date: Option<Date>,
    time: Time,
    offset: Offset,
}

impl WindowTime {
    /// Go's zero `time.Time`, which an absent `begin` or `end` is in lifecycle-manager.
    const GO_ZERO: WindowTime =
        WindowTime { date: Some(jiff::civil::date(1, 1, 1)), time: Time::midnight(), offset: Offset::UTC };

    /// The instant, for absolute windows (a time-only value is on 0000-01-01, as in Go).
    fn instant(&self) -> Timestamp {
        let date = self.date.unwrap_or(jiff::civil::date(0, 1, 1));
        self.offset.to_timestamp(date.to_datetime(self.time)).unwrap_or(Timestamp::MIN)
    }

    /// The occurrence of a recurring window beginning on `day` (in this time's offset) and
    /// ending at `end`'s time of day, on the next day if not after the begin.
    fn occurrence(&self, day: Date, end: &WindowTime) -> Option<Window> {
        let clock = |t: &WindowTime| Time::new(t.time.hour(), t.time.minute(), t.time.second(), 0).ok();
        let begin = self.offset.to_timestamp(DateTime::from_parts(day, clock(self)?)).ok()?;
        let mut end = end.offset.to_timestamp(DateTime::from_parts(day, clock(end)?)).ok()?;
        while end <= begin {
            end = end.checked_add(SignedDuration::from_hours(24)).ok()?;
        }
        Some(Window { begin, end })
    }

    /// Parses `HH:MM:SS[.fff](Z|±HH:MM)` or `YYYY-MM-DDTHH:MM:SS[.fff](Z|±HH:MM)`, as Go's
    /// `time.Parse` with the layouts `15:04:05Z07:00` and RFC 3339 does.
    fn parse(value: &str) -> Result<WindowTime, String> {
        let mut c = Cursor { s: value.as_bytes(), i: 0 };
        let date = if value.len() > 10 && value.as_bytes()[4] == b'-' {
            let y = c.num(4, 4, "year")?;
            c.lit(b'-')?;
            let m = c.num(2, 2, "month")?;
            c.lit(b'-')?;
            let d = c.num(2, 2, "day")?;
            c.lit(b'T')?;
            Some(Date::new(y as i16, m as i8, d as i8).map_err(|_| format!("no such date {y:04}-{m:02}-{d:02}"))?)
        } else {
            None
        };
        let h = c.num(1, 2, "hour")?;
        c.lit(b':')?;
        let mi = c.num(2, 2, "minute")?;
        c.lit(b':')?;
        let s = c.num(2, 2, "second")?;
        let mut nanos = 0;
        if matches!(c.peek(), Some(b'.' | b',')) && c.s.get(c.i + 1).is_some_and(u8::is_ascii_digit) {
            c.i += 1;
            let start = c.i;
            while c.peek().is_some_and(|b| b.is_ascii_digit()) {
                c.i += 1;
            }
            let digits = &value[start..c.i.min(start + 9)];
            nanos = format!("{digits:0<9}").parse().unwrap_or(0);
        }
        if h > 23 || mi > 59 || s > 59 {
            return Err(format!("{h:02}:{mi:02}:{s:02} is not a time of day"));
        }
        let time = Time::new(h as i8, mi as i8, s as i8, nanos).map_err(|e| e.to_string())?;
        let offset = match c.peek() {
            Some(b'Z') => {
                c.i += 1;
                Offset::UTC
            }
            Some(sign @ (b'+' | b'-')) => {
                c.i += 1;
                let oh = c.num(2, 2, "offset hours")?;
                c.lit(b':')?;
                let om = c.num(2, 2, "offset minutes")?;
                if oh > 23 || om > 59 {
                    return Err("offset out of range".into());
                }
                let secs = (oh * 3600 + om * 60) as i32;
                Offset::from_seconds(if sign == b'-' { -secs } else { secs }).map_err(|e| e.to_string())?
            }
            _ => return Err("missing UTC offset (Z or ±HH:MM)".into()),
        };
        if c.i != c.s.len() {
            return Err(format!("unexpected {:?} after the time", &value[c.i..]));
        }
        Ok(WindowTime { date, time, offset })
    }
}

struct Cursor<'a> {
    s: &'a [u8],
    i: usize,
}

impl Cursor<'_> {
    fn peek(&self) -> Option<u8> {
        self.s.get(self.i).copied()
    }

    fn lit(&mut self, b: u8) -> Result<(), String> {
        if self.peek() == Some(b) {
            self.i += 1;
            Ok(())
        } else {
            Err(format!("expected {:?} at position {}", b as char, self.i + 1))
        }
    }

    /// `min..=max` ASCII digits.
    fn num(&mut self, min: usize, max: usize, what: &str) -> Result<u32, String> {
        let start = self.i;
        while self.i - start < max && self.peek().is_some_and(|b| b.is_ascii_digit()) {
            self.i += 1;
        }
        if self.i - start < min {
            return Err(format!("expected {what} at position {}", start + 1));
        }
        Ok(self.s[start..self.i].iter().fold(0, |n, b| n * 10 + u32::from(b - b'0')))
    }
}

/// The one-line cause of a regex error (its Display spans several lines).
fn regex_reason(e: &regex::Error) -> String {
    let text = e.to_string();
    match text.rsplit_once("error: ") {
        Some((_, reason)) => reason.trim().to_string(),
        None => text.split_whitespace().collect::<Vec<_>>().join(" "),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ts(s: &str) -> Timestamp {
        s.parse().unwrap()
    }

    fn win(begin: &str, end: &str) -> Window {
        Window { begin: ts(begin), end: ts(end) }
    }

    fn labels(gaid: &str, plan: &str, region: &str, platform_region: &str) -> RuntimeLabels {
        RuntimeLabels {
            global_account_id: gaid.into(),
            plan: plan.into(),
            region: region.into(),
            platform_region: platform_region.into(),
        }
    }

    fn next(policy: &str, l: &RuntimeLabels, at: &str) -> Result<Window, MaintenanceError> {
        next_window(&MaintenancePolicySpec::from_json(policy)?, l, ts(at), NextWindowOptions::default())
    }

    fn ongoing(min_remaining: SignedDuration) -> NextWindowOptions {
        NextWindowOptions { ongoing: true, min_remaining }
    }

    /// lifecycle-manager's `maintenancewindows/resolver/testdata/ruleset-1.json`, as is:
    /// note `globalAccountId` (case-insensitive key), the `default` with `timeBegin` /
    /// `timeEnd` (unknown keys, so begin and end are Go's zero time: Sat 00:00Z–Sun 00:00Z)
    /// and the last rule's absolute window that ends before it begins.
    const RULESET_1: &str = r#"{
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
    const LM_POLICY: &str = r#"{
      "rules": [
        {"match": {"plan": "trial|free"},
         "windows": [{"days": ["Mon","Tue","Wed","Thu","Fri","Sat","Sun"], "begin": "01:00:00+00:00", "end": "01:00:00+00:00"}]},
        {"match": {"region": "europe|eu-|uksouth"},
         "windows": [{"days": ["Sat"], "begin": "21:00:00+00:00", "end": "00:00:00+00:00"}]}
      ],
      "default": {"days": ["Sat"], "begin": "21:00:00+00:00", "end": "23:00:00+00:00"}
    }"#;

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

    #[test]
    fn maintenance_lifecycle_manager_match_cases() {
        let p = MaintenancePolicySpec::from_json(RULESET_1).unwrap().compile().unwrap();
        let m = |i: usize, l: RuntimeLabels| p.rules[i].matches(&l);
        assert!(m(0, labels("", "free", "", "")));
        assert!(m(0, labels("", "trial", "", "")));
        assert!(!m(0, labels("", "azure_lite", "", "")));
        assert!(m(1, labels("", "", "eu-balkan-1", "")));
        assert!(m(1, labels("", "", "uksouth-teaparty", "")));
        assert!(!m(1, labels("", "", "us-cottoneyejoe", "")));
        assert!(m(2, labels("sup-er-ga-case", "", "", "")));
        assert!(!m(2, labels("not-matching", "", "", "")));
        assert!(m(2, labels("", "", "uksouth-teaparty", "super-mario-bros")));
        assert!(!m(2, labels("", "", "us-cottoneyejoe", "luigi")));
    }

    #[test]
    fn maintenance_lifecycle_manager_policy_file() {
        let spec = MaintenancePolicySpec::from_json(LM_POLICY).unwrap();
        assert_eq!(spec.rules.len(), 2);
        assert_eq!(spec.rules[1].matcher.region.as_deref(), Some("europe|eu-|uksouth"));
        assert_eq!(spec.default.as_ref().unwrap().days, ["Sat"]);
        let wed = "2024-10-09T12:00:00Z";
        // europe: Saturday 21:00 to midnight.
        let w = next(LM_POLICY, &labels("", "aws", "eu-central-1", ""), wed).unwrap();
        assert_eq!(w, win("2024-10-12T21:00:00Z", "2024-10-13T00:00:00Z"));
        // trial: every day 01:00 for 24h.
        let w = next(LM_POLICY, &labels("", "trial", "eu-central-1", ""), wed).unwrap();
        assert_eq!(w, win("2024-10-10T01:00:00Z", "2024-10-11T01:00:00Z"));
        // No match: the default.
        let w = next(LM_POLICY, &labels("ga", "aws", "us-east-1", "cf-us10"), wed).unwrap();
        assert_eq!(w, win("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z"));
        // No labels at all match nothing.
        let w = next(LM_POLICY, &RuntimeLabels::default(), wed).unwrap();
        assert_eq!(w, win("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z"));
    }

    #[test]
    fn maintenance_overnight_windows() {
        let policy = r#"{"default": {"days": ["Sat"], "begin": "22:00:00Z", "end": "02:00:00Z"}}"#;
        let l = RuntimeLabels::default();
        // From Wednesday: Saturday 22:00 to Sunday 02:00.
        let w = next(policy, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-12T22:00:00Z", "2024-10-13T02:00:00Z"));
        // Sunday 00:30 is inside the window that began on Saturday: found with `ongoing`
        // (lifecycle-manager starts at Sunday and would return the next Saturday).
        let p = MaintenancePolicySpec::from_json(policy).unwrap().compile().unwrap();
        let w = p.next_window(&l, ts("2024-10-13T00:30:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w, win("2024-10-12T22:00:00Z", "2024-10-13T02:00:00Z"));
        assert!(w.contains(ts("2024-10-13T00:30:00Z")));
        // Too little left of it: the next one.
        let w = p.next_window(&l, ts("2024-10-13T01:45:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w, win("2024-10-19T22:00:00Z", "2024-10-20T02:00:00Z"));
        // Exactly the minimum left is not enough (strictly more, as in lifecycle-manager).
        let w = p.next_window(&l, ts("2024-10-13T01:40:00Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w.begin, ts("2024-10-19T22:00:00Z"));
        let w = p.next_window(&l, ts("2024-10-13T01:39:59Z"), ongoing(SignedDuration::from_mins(20))).unwrap();
        assert_eq!(w.begin, ts("2024-10-12T22:00:00Z"));
        // Without `ongoing` a window must begin strictly later.
        let w = p.next_window(&l, ts("2024-10-12T22:00:00Z"), NextWindowOptions::default()).unwrap();
        assert_eq!(w.begin, ts("2024-10-19T22:00:00Z"));
        let w = p.next_window(&l, ts("2024-10-12T21:59:59Z"), NextWindowOptions::default()).unwrap();
        assert_eq!(w.begin, ts("2024-10-12T22:00:00Z"));
        // end == begin is a whole day.
        let day = r#"{"default": {"days": ["Mon"], "begin": "05:00:00Z", "end": "05:00:00Z"}}"#;
        let w = next(day, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-14T05:00:00Z", "2024-10-15T05:00:00Z"));
    }

    #[test]
    fn maintenance_days_are_in_the_offset_of_begin() {
        // Saturday 23:00 at +02:00 is Saturday 21:00 UTC; at -05:00 Saturday 22:00 is
        // Sunday 03:00 UTC.
        let l = RuntimeLabels::default();
        let east = r#"{"default": {"days": ["Sat"], "begin": "23:00:00+02:00", "end": "01:00:00+02:00"}}"#;
        let w = next(east, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-12T21:00:00Z", "2024-10-12T23:00:00Z"));
        let west = r#"{"default": {"days": ["Sat"], "begin": "22:00:00-05:00", "end": "23:30:00-05:00"}}"#;
        let w = next(west, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T03:00:00Z", "2024-10-13T04:30:00Z"));
        // Just after midnight UTC the window that begins a few hours later is found (it is on
        // the previous calendar day in -05:00).
        let w = next(west, &l, "2024-10-13T00:30:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T03:00:00Z", "2024-10-13T04:30:00Z"));
        // A full RFC 3339 value in a recurring window: its time of day and offset count.
        let full = r#"{"default": {"days": ["Sun"], "begin": "2020-01-01T10:00:00.5+01:00", "end": "2020-01-01T12:00:00+01:00"}}"#;
        let w = next(full, &l, "2024-10-09T12:00:00Z").unwrap();
        assert_eq!(w, win("2024-10-13T09:00:00Z", "2024-10-13T11:00:00Z"));
    }

    #[test]
    fn maintenance_absolute_windows_in_listed_order() {
        let policy = r#"{"rules": [{"match": {"plan": "."}, "windows": [
            {"begin": "2024-12-01T10:00:00+01:00", "end": "2024-12-01T12:00:00+01:00"},
            {"begin": "2024-11-01T10:00:00Z", "end": "2024-11-01T12:00:00Z"},
            {"begin": "2024-10-20T12:00:00Z", "end": "2024-10-20T10:00:00Z"}]}]}"#;
        let l = labels("", "aws", "", "");
        // The first listed window that is still ahead wins, not the earliest.
        let w = next(policy, &l, "2024-10-01T00:00:00Z").unwrap();
        assert_eq!(w, win("2024-12-01T09:00:00Z", "2024-12-01T11:00:00Z"));
        let w = next(policy, &l, "2024-12-05T00:00:00Z");
        // An inverted window never qualifies; the rule matched, there is no default.
        let err = w.unwrap_err().to_string();
        assert_eq!(
            err,
            "no maintenance window found: rules[0] matches but has no upcoming window, and the policy has no default window"
        );
        // Times of day without days would be in year 0 (lifecycle-manager): such a window
        // could never open, so it is refused with what to write instead.
        let t = r#"{"default": {"begin": "01:00:00Z", "end": "02:00:00Z"}}"#;
        let err = next(t, &l, "2024-10-01T00:00:00Z").unwrap_err();
        assert!(matches!(err, MaintenanceError::TimeOfDayWithoutDays { .. }), "{err}");
        assert!(err.to_string().contains("default has times of day (01:00:00Z, 02:00:00Z) but no days"), "{err}");
    }

    #[test]
    fn maintenance_no_match_uses_default_and_first_match_decides() {
        let policy = r#"{
          "rules": [
            {"match": {"region": "^eu-"}, "windows": [{"begin": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z"}]},
            {"match": {"region": "eu"}, "windows": [{"days": ["Mon"], "begin": "01:00:00Z", "end": "02:00:00Z"}]},
            {"match": {}, "windows": [{"days": ["Tue"], "begin": "01:00:00Z", "end": "02:00:00Z"}]}
          ],
          "default": {"days": ["Wed"], "begin": "01:00:00Z", "end": "02:00:00Z"}
        }"#;
        let at = "2024-10-09T12:00:00Z"; // Wednesday
        // Rule 0 matches and has no window left: the default, not rule 1.
        assert_eq!(next(policy, &labels("", "", "eu-west-1", ""), at).unwrap().begin, ts("2024-10-16T01:00:00Z"));
        // Rule 1 (search, not anchored).
        assert_eq!(next(policy, &labels("", "", "westeurope", ""), at).unwrap().begin, ts("2024-10-14T01:00:00Z"));
        // An empty match matches nothing; no match: the default.
        assert_eq!(next(policy, &labels("", "x", "us-east-1", ""), at).unwrap().begin, ts("2024-10-16T01:00:00Z"));
        // Empty pattern fields are ignored.
        let empty = r#"{"rules": [{"match": {"plan": ""}, "windows": [{"days": ["Mon"], "begin": "01:00:00Z", "end": "02:00:00Z"}]}]}"#;
        assert!(matches!(next(empty, &labels("", "x", "", ""), at), Err(MaintenanceError::NoWindow(_))));
    }

    #[test]
    fn maintenance_no_window_at_all_is_an_error() {
        let l = labels("", "trial", "", "");
        let err = next(r#"{"rules": []}"#, &l, "2024-10-09T12:00:00Z").unwrap_err();
        assert_eq!(
            err.to_string(),
            "no maintenance window found: no rule matches the runtime, and the policy has no default window"
        );
        let past = r#"{"default": {"begin": "2024-01-01T00:00:00Z", "end": "2024-01-02T00:00:00Z"}}"#;
        let err = next(past, &l, "2024-10-09T12:00:00Z").unwrap_err();
        assert!(err.to_string().ends_with("no rule matches the runtime, and the default window has none either"));
        // lifecycle-manager's with-rules.json: no default.
        let rules_only = r#"{"rules": [{"match": {"plan": "trial|free"}, "windows": [{"days": ["Sat"], "begin": "21:00:00+00:00", "end": "00:00:00+00:00"}]}]}"#;
        assert!(next(rules_only, &l, "2024-10-09T12:00:00Z").is_ok());
        assert!(next(rules_only, &labels("", "aws", "", ""), "2024-10-09T12:00:00Z").is_err());
        // An ongoing minimum longer than any window: nothing qualifies.
        let p = MaintenancePolicySpec::from_json(LM_POLICY).unwrap().compile().unwrap();
        let err = p.next_window(&l, ts("2024-10-09T12:00:00Z"), ongoing(SignedDuration::from_hours(200))).unwrap_err();
        assert!(err.to_string().contains("rules[0] matches but has no upcoming window"), "{err}");
    }

    #[test]
    fn maintenance_invalid_policies() {
        let err = |json: &str| MaintenancePolicySpec::from_json(json).unwrap_err().to_string();
        assert_eq!(
            err(r#"{"rules": [{"match": {"plan": "trial"}}, {"match": {"region": "eu-(west"}}]}"#),
            r#"invalid regular expression "eu-(west" in rules[1].match.region: unclosed group"#
        );
        let e = err(r#"{"default": {"days": ["Sat"], "begin": "25:00:00Z", "end": "01:00:00Z"}}"#);
        assert!(e.starts_with(r#"invalid time "25:00:00Z" in default.begin: 25:00:00 is not a time of day"#), "{e}");
        let e = err(r#"{"rules": [{"windows": [{"days": ["Sat"], "begin": "21:00:00", "end": "01:00:00Z"}]}]}"#);
        assert!(e.starts_with(r#"invalid time "21:00:00" in rules[0].windows[0].begin: missing UTC offset"#), "{e}");
        let e = err(r#"{"default": {"begin": "2024-02-30T00:00:00Z", "end": "2024-03-01T00:00:00Z"}}"#);
        assert!(e.contains("no such date 2024-02-30"), "{e}");
        let e = err(r#"{"default": {"begin": "2024-02-01 00:00:00Z", "end": "2024-03-01T00:00:00Z"}}"#);
        assert!(e.contains(r#"expected 'T'"#), "{e}");
        let e = err(r#"{"default": {"days": ["Sat"], "begin": "21:00:00Z", "end": "23:00:00Zulu"}}"#);
        assert!(e.contains(r#"unexpected "ulu" after the time"#), "{e}");
        assert_eq!(
            err(
                r#"{"rules": [{"match": {"plan": "x"}, "windows": [{"days": ["Sat", "sun"], "begin": "21:00:00Z", "end": "23:00:00Z"}]}]}"#
            ),
            r#"unknown day "sun" in rules[0].windows[0].days (expected one of Mon, Tue, Wed, Thu, Fri, Sat, Sun)"#
        );
        assert!(err(r#"{"rules": {}}"#).starts_with("invalid maintenance policy JSON:"));
        assert!(err("not json").starts_with("invalid maintenance policy JSON:"));
        // Every error message is one line.
        for e in
            [err(r#"{"rules": [{"match": {"plan": "a{2,1}"}}]}"#), err(r#"{"rules": [{"match": {"plan": "(?<"}}]}"#)]
        {
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn maintenance_time_formats() {
        let ok = |s: &str| WindowTime::parse(s).unwrap();
        assert_eq!(ok("01:00:00Z").offset, Offset::UTC);
        assert_eq!(ok("1:00:00+00:00").time, jiff::civil::time(1, 0, 0, 0));
        assert_eq!(ok("21:30:15-05:30").offset, Offset::from_seconds(-(5 * 3600 + 1800)).unwrap());
        assert_eq!(ok("2024-10-10T20:00:00.250Z").instant(), ts("2024-10-10T20:00:00.25Z"));
        assert_eq!(ok("2024-10-10T20:00:00+02:00").instant(), ts("2024-10-10T18:00:00Z"));
        for bad in ["", "21:00", "21:00:00", "21:0:00Z", "21:00:60Z", "2024-10-10t20:00:00Z", "21:00:00+1:00", "x"] {
            assert!(WindowTime::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn maintenance_keys_like_go() {
        // Case-insensitive keys, unknown keys ignored, the last duplicate wins.
        let p = MaintenancePolicySpec::from_json(
            r#"{"Rules": [{"MATCH": {"PlatformRegion": "cf-eu", "comment": "x"}, "Windows": [
                {"Days": ["Sat"], "BEGIN": "01:00:00Z", "End": "02:00:00Z", "note": 1}]}], "extra": true}"#,
        )
        .unwrap();
        assert_eq!(p.rules[0].matcher.platform_region.as_deref(), Some("cf-eu"));
        assert_eq!(p.rules[0].windows[0].begin.as_deref(), Some("01:00:00Z"));
        let w =
            next_window(&p, &labels("", "", "", "cf-eu10"), ts("2024-10-09T12:00:00Z"), NextWindowOptions::default());
        assert_eq!(w.unwrap(), win("2024-10-12T01:00:00Z", "2024-10-12T02:00:00Z"));
    }

    #[test]
    fn maintenance_labels_and_round_trip() {
        let mut l = RuntimeLabels::default();
        l.set("globalAccountID", "ga").unwrap();
        l.set("globalaccountid", "ga2").unwrap();
        l.set("region", "eu").unwrap();
        assert_eq!((l.global_account_id.as_str(), l.region.as_str()), ("ga2", "eu"));
        assert!(matches!(l.set("zone", "x"), Err(MaintenanceError::UnknownLabel(_))));
        // The spec serializes to the lifecycle-manager format again.
        let spec = MaintenancePolicySpec::from_json(LM_POLICY).unwrap();
        let json = serde_json::to_value(&spec).unwrap();
        assert_eq!(json["rules"][0]["match"], serde_json::json!({"plan": "trial|free"}));
        assert_eq!(json["default"]["begin"], "21:00:00+00:00");
        let back: MaintenancePolicySpec = serde_json::from_value(json).unwrap();
        assert_eq!(back, spec);
    }

    #[test]
    fn maintenance_crd() {
        use kube::CustomResourceExt;
        let crd = MaintenancePolicy::crd();
        assert_eq!(crd.metadata.name.as_deref(), Some("maintenancepolicies.operator.fleetwatch.dev"));
        assert_eq!(crd.spec.scope, "Namespaced");
        let schema = serde_json::to_value(&crd.spec.versions[0].schema).unwrap();
        let m = &schema["openAPIV3Schema"]["properties"]["spec"]["properties"]["rules"]["items"]["properties"]["match"];
        assert_eq!(m["x-kubernetes-preserve-unknown-fields"], true, "{m}");
        assert!(m["properties"]["globalAccountID"].is_object(), "{m}");
    }
}
