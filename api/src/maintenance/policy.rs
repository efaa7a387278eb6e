//! The policy document: lifecycle-manager's maintenance policy JSON (read the way Go's
//! `encoding/json` reads it, so its files load unchanged), the `MaintenancePolicy` custom
//! resource carrying it, and its rules — which runtimes (by label) get which windows.
//!
//! Checking happens once, in [`MaintenancePolicySpec::compile`]: regular expressions are
//! compiled and every window is parsed, so a broken policy is refused when it is read, not
//! when a runtime first needs a window.

use jiff::Timestamp;
use kube::CustomResource;
use regex::Regex;
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize};

use super::window::{CompiledWindow, NextWindowOptions, Window};
use super::{DAY_NAMES, LABEL_NAMES, MaintenanceError, NoWindowReason};

/// A maintenance policy: rules that pick windows by runtime labels, and a default window.
/// The same JSON as lifecycle-manager's maintenance policy files.
#[derive(CustomResource, Serialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "MaintenancePolicy",
    plural = "maintenancepolicies",
    namespaced,
    status = "MaintenancePolicyStatus",
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

/// What the operator makes of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct MaintenancePolicyStatus {
    /// `Usable`: `False` (reason `InvalidSpec`, the error as message) when the policy does not
    /// decode or one of its rules or windows does not parse (the operator's check,
    /// `MaintenancePolicySpec::compile`), back to `True` (reason `Valid`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::module::Condition>,
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
    use super::super::testdata::*;
    use super::super::*;

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
