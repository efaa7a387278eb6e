//! `ModuleConfigPolicy` (issue 29): central configuration takes precedence over the user's.
//!
//! A policy names a module, optionally selects Runtimes by label, and says which fields of
//! the module's configuration object (the one its template's `defaultConfig` names) the
//! control plane owns (`enforce`) and which JSON Schema the whole object must satisfy
//! (`schema`). The pure parts live here: checking a policy, matching Runtimes, merging the
//! `enforce` of several policies (conflicts are errors, never a silent winner), the enforced
//! JSON pointers and schema validation. The lifecycle operator applies them.
//!
//! ```
//! use fleetwatch_api::config_policy::{enforced_pointers, merge_enforce};
//! use serde_json::json;
//! let a = json!({"spec": {"tls": true}});
//! let b = json!({"spec": {"replicas": 3}});
//! let merged = merge_enforce(&[("a", &a), ("b", &b)]);
//! assert!(merged.conflicts.is_empty());
//! assert_eq!(enforced_pointers(&merged.value), vec!["/spec/replicas", "/spec/tls"]);
//! ```

use std::collections::BTreeMap;

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::module::Condition;

/// The annotation on a Runtime that resets a module's configuration (`<module>` or `all`).
pub const RESET_ANNOTATION: &str = "operator.fleetwatch.dev/reset-config";
/// Most bytes of a last valid configuration kept in the Runtime's status for `Restore`.
pub const LAST_VALID_MAX_BYTES: usize = 32 * 1024;

/// Fields of a module's configuration the control plane owns, and the schema it must meet.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "ModuleConfigPolicy",
    plural = "moduleconfigpolicies",
    shortname = "mcp",
    namespaced,
    status = "ModuleConfigPolicyStatus",
    printcolumn = r#"{"name":"Module","type":"string","jsonPath":".spec.module"}"#,
    printcolumn = r#"{"name":"Runtimes","type":"integer","description":"runtimes the policy matches","jsonPath":".status.runtimesMatched"}"#,
    printcolumn = r#"{"name":"Valid","type":"integer","description":"matched runtimes whose configuration meets the policy","jsonPath":".status.valid"}"#,
    printcolumn = r#"{"name":"Invalid","type":"integer","description":"matched runtimes whose configuration does not meet the schema","jsonPath":".status.invalid"}"#,
    printcolumn = r#"{"name":"Ready","type":"string","jsonPath":".status.conditions[?(@.type==\"Ready\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "Fields of a module's configuration the control plane owns, and the JSON Schema the configuration must meet"
)]
#[serde(rename_all = "camelCase")]
pub struct ModuleConfigPolicySpec {
    /// The module (a ModuleTemplate's `moduleName` in this namespace).
    pub module: String,
    /// The Runtimes (same namespace) it applies to, by their labels; all when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub runtime_selector: Option<LabelSelector>,
    /// Fields of the module's configuration object the control plane owns, as a partial
    /// object (`{spec: {tls: true}}`). Applied with server-side apply (field manager
    /// `fleetwatch-config-policy`, forced); a user's change of one is put back.
    #[serde(default)]
    #[schemars(schema_with = "any_value")]
    pub enforce: Value,
    /// A JSON Schema the whole configuration object must meet (checked at every change).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_value")]
    pub schema: Option<Value>,
    /// What a configuration that does not meet the schema gets: `Report` (status, Event,
    /// metric) or `Restore` (also the last valid configuration the operator saw is put back).
    #[serde(default)]
    pub on_invalid: OnInvalid,
    /// Which objects it governs: the module's configuration object (`DefaultConfig`, the
    /// default) or also every instance of the template's `managedResources` kinds
    /// (`ManagedResources`; those are enforced and validated, never restored).
    #[serde(default)]
    pub apply_to: ApplyTo,
}

/// The objects a policy governs.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ApplyTo {
    /// The object the template's `defaultConfig` names.
    #[default]
    DefaultConfig,
    /// That object and every instance of the template's `managedResources` kinds.
    ManagedResources,
}

/// What an invalid configuration gets.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum OnInvalid {
    /// Reported (module status `ConfigValid=False`, a Warning Event, a metric).
    #[default]
    Report,
    /// Reported, and the last valid configuration is put back.
    Restore,
}

/// A label selector (`matchLabels` and `matchExpressions`, as in Kubernetes).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    /// Labels that must be present with these values.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_labels: BTreeMap<String, String>,
    /// Expressions that must all hold.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// One selector expression.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct LabelSelectorRequirement {
    /// The label key.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    /// Values for `In` and `NotIn`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

impl LabelSelector {
    /// Whether `labels` satisfy the selector; an unknown operator matches nothing.
    ///
    /// ```
    /// use fleetwatch_api::config_policy::LabelSelector;
    /// let s = LabelSelector { match_labels: [("region".to_string(), "eu".to_string())].into(), ..Default::default() };
    /// assert!(s.matches(&[("region".to_string(), "eu".to_string())].into()));
    /// assert!(!s.matches(&Default::default()));
    /// ```
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.match_expressions.iter().all(|e| {
                let v = labels.get(&e.key);
                match e.operator.as_str() {
                    "In" => v.is_some_and(|v| e.values.contains(v)),
                    "NotIn" => v.is_none_or(|v| !e.values.contains(v)),
                    "Exists" => v.is_some(),
                    "DoesNotExist" => v.is_none(),
                    _ => false,
                }
            })
    }
}

/// What the operator makes of a policy.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleConfigPolicyStatus {
    /// `Ready`: `False` with reason `InvalidSpec` (bad input: nothing of it is applied) or
    /// `Conflict` (another matching policy enforces a different value: the conflicting
    /// fields are enforced by neither), else `True`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Runtimes it matches that have the module.
    #[serde(default)]
    pub runtimes_matched: u32,
    /// Of those, the ones whose configuration was last seen valid.
    #[serde(default)]
    pub valid: u32,
    /// Of those, the ones whose configuration does not meet the schema.
    #[serde(default)]
    pub invalid: u32,
    /// The generation the status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

/// The configuration part of a module's status in a Runtime.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModuleConfigStatus {
    /// The ModuleConfigPolicies in force for this module (names).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub policies: Vec<String>,
    /// The enforced fields, as JSON pointers into the configuration object.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub enforced: Vec<String>,
    /// `ConfigValid` (`True`, or `False` with the errors) and `ConfigEnforced`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// Each schema violation of the configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub errors: Vec<ConfigError>,
    /// The last configuration that met every schema (what `onInvalid: Restore` puts back),
    /// kept when it serializes to at most 32 KiB.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "any_object")]
    pub last_valid: Option<Value>,
}

/// One schema violation.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
pub struct ConfigError {
    /// The policy whose schema it violates.
    pub policy: String,
    /// Where, as a JSON pointer into the configuration object.
    pub pointer: String,
    /// What is wrong.
    pub message: String,
    /// The object (`Kind namespace/name`) when it is not the configuration object itself
    /// (`applyTo: ManagedResources`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub object: String,
}

fn any_value(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"x-kubernetes-preserve-unknown-fields": true})
}

fn any_object(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"type": "object", "x-kubernetes-preserve-unknown-fields": true, "nullable": true})
}

impl ModuleConfigPolicySpec {
    /// Why the operator cannot use this policy (bad input), or `Ok`. `modules` are the
    /// module names known in the policy's namespace.
    ///
    /// ```
    /// use fleetwatch_api::config_policy::ModuleConfigPolicySpec;
    /// use serde_json::json;
    /// let mut p = ModuleConfigPolicySpec { module: "redis".into(), enforce: json!({"spec": {"tls": true}}), ..Default::default() };
    /// assert!(p.check(&["redis"]).is_ok());
    /// assert!(p.check(&["nats"]).unwrap_err().contains("unknown module"));
    /// p.enforce = json!([1]);
    /// assert!(p.check(&["redis"]).unwrap_err().contains("enforce"));
    /// ```
    pub fn check(&self, modules: &[&str]) -> Result<(), String> {
        if !modules.contains(&self.module.as_str()) {
            return Err(format!("unknown module {:?}: no ModuleTemplate of it in this namespace", self.module));
        }
        match &self.enforce {
            Value::Null => {}
            Value::Object(m) => {
                for k in ["apiVersion", "kind", "metadata", "status"] {
                    if m.contains_key(k) {
                        return Err(format!("enforce must not name {k:?}: only the object's content is enforced"));
                    }
                }
            }
            other => return Err(format!("enforce must be an object, not {}", type_name(other))),
        }
        if let Some(schema) = &self.schema {
            compile(schema)?;
        }
        Ok(())
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A compiled JSON Schema.
pub type Validator = jsonschema::Validator;

/// A compiled schema, or why it is not a valid JSON Schema. References are resolved only
/// within the schema (no HTTP, no files).
///
/// Its `pattern`s run on the `regex` engine, in time linear in the input, as Kubernetes'
/// own CRD schemas do (RE2): a pattern that needs backtracking (lookaround, backreferences)
/// is refused here, on the policy, instead of costing seconds of CPU on every write of a
/// user's configuration and being reported as the user's fault. Compiled patterns are
/// bounded too ([`PATTERN_SIZE_LIMIT`]).
pub fn compile(schema: &Value) -> Result<jsonschema::Validator, String> {
    if !schema.is_object() && !schema.is_boolean() {
        return Err(format!("schema must be a JSON Schema object, not {}", type_name(schema)));
    }
    jsonschema::meta::validate(schema).map_err(|e| {
        format!("schema is not a valid JSON Schema: {e} (at {})", pointer_or_root(e.instance_path().as_str()))
    })?;
    let patterns =
        jsonschema::PatternOptions::regex().size_limit(PATTERN_SIZE_LIMIT).dfa_size_limit(PATTERN_SIZE_LIMIT);
    jsonschema::options().with_pattern_options(patterns).build(schema).map_err(|e| {
        format!(
            "schema is not usable: {e} (patterns are RE2-like, as in Kubernetes CRDs: no lookaround, no backreferences)"
        )
    })
}

/// The most bytes one compiled `pattern` of a schema may take (the regex engine's size and
/// DFA cache limits).
pub const PATTERN_SIZE_LIMIT: usize = 1 << 20;

fn pointer_or_root(p: &str) -> String {
    if p.is_empty() { "/".into() } else { p.into() }
}

/// Each violation of `schema` by `instance`: (JSON pointer, message).
///
/// ```
/// use fleetwatch_api::config_policy::{compile, violations};
/// use serde_json::json;
/// let v = compile(&json!({"properties": {"spec": {"properties": {"replicas": {"maximum": 5}}}}})).unwrap();
/// let errs = violations(&v, &json!({"spec": {"replicas": 9}}));
/// assert_eq!(errs[0].0, "/spec/replicas");
/// ```
pub fn violations(validator: &jsonschema::Validator, instance: &Value) -> Vec<(String, String)> {
    validator.iter_errors(instance).map(|e| (pointer_or_root(e.instance_path().as_str()), e.to_string())).collect()
}

/// The leaves of an `enforce` object as JSON pointers, sorted. An empty object or array is a
/// leaf (it is enforced as a whole).
pub fn enforced_pointers(enforce: &Value) -> Vec<String> {
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        match v {
            Value::Object(m) if !m.is_empty() => {
                for (k, x) in m {
                    walk(x, &format!("{at}/{}", k.replace('~', "~0").replace('/', "~1")), out);
                }
            }
            _ if !at.is_empty() => out.push(at.to_string()),
            _ => {}
        }
    }
    let mut out = Vec::new();
    walk(enforce, "", &mut out);
    out.sort();
    out
}

/// Several policies' `enforce` merged.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Merged {
    /// The union of the non-conflicting fields.
    pub value: Value,
    /// Conflicts: (JSON pointer, the policies that disagree on it).
    pub conflicts: Vec<(String, Vec<String>)>,
}

/// Merges the `enforce` objects of `(policy, enforce)` pairs. A pointer two policies set to
/// different values (or one sets to a scalar and another below it) is a conflict: reported
/// with every policy concerned and enforced by none.
pub fn merge_enforce(policies: &[(&str, &Value)]) -> Merged {
    // Every leaf: pointer → (value, policies).
    let mut leaves: BTreeMap<String, Vec<(&str, &Value)>> = BTreeMap::new();
    for (name, enforce) in policies {
        for p in enforced_pointers(enforce) {
            if let Some(v) = enforce.pointer(&p) {
                leaves.entry(p).or_default().push((name, v));
            }
        }
    }
    let mut conflicts: Vec<(String, Vec<String>)> = Vec::new();
    let pointers: Vec<String> = leaves.keys().cloned().collect();
    let mut bad: std::collections::BTreeSet<String> = Default::default();
    for (p, vs) in &leaves {
        let mut names: Vec<String> = vs.iter().map(|(n, _)| n.to_string()).collect();
        let differ = vs.iter().any(|(_, v)| *v != vs[0].1);
        // A leaf that another policy's leaf lies below.
        let below: Vec<&String> = pointers.iter().filter(|q| q.starts_with(&format!("{p}/"))).collect();
        if differ || !below.is_empty() {
            for q in below {
                names.extend(leaves[q].iter().map(|(n, _)| n.to_string()));
                bad.insert(q.clone());
            }
            names.sort();
            names.dedup();
            bad.insert(p.clone());
            conflicts.push((p.clone(), names));
        }
    }
    let mut value = Value::Object(Map::new());
    for (p, vs) in &leaves {
        if !bad.contains(p) {
            set_pointer(&mut value, p, vs[0].1.clone());
        }
    }
    Merged { value, conflicts }
}

/// Sets `v` at JSON pointer `p` in `target`, creating objects on the way.
pub fn set_pointer(target: &mut Value, p: &str, v: Value) {
    let mut cur = target;
    let parts: Vec<String> = p.split('/').skip(1).map(|s| s.replace("~1", "/").replace("~0", "~")).collect();
    for (i, part) in parts.iter().enumerate() {
        if !cur.is_object() {
            *cur = Value::Object(Map::new());
        }
        let Value::Object(m) = cur else { return };
        if i + 1 == parts.len() {
            m.insert(part.clone(), v);
            return;
        }
        cur = m.entry(part.clone()).or_insert_with(|| Value::Object(Map::new()));
    }
}

/// Which of `pointers` have another value in `object` than in `enforce`. An enforced empty
/// object only asks for an object there (server-side apply owns the map, not its keys).
pub fn differing(object: &Value, enforce: &Value, pointers: &[String]) -> Vec<String> {
    pointers
        .iter()
        .filter(|p| {
            let (have, want) = (object.pointer(p), enforce.pointer(p));
            match want {
                Some(Value::Object(m)) if m.is_empty() => !have.is_some_and(Value::is_object),
                _ => have != want,
            }
        })
        .cloned()
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn conflicts_are_reported_for_every_policy_and_enforced_by_none() {
        let a = json!({"spec": {"tls": true, "size": 1}});
        let b = json!({"spec": {"tls": false, "mode": "x"}});
        let c = json!({"spec": {"size": 1}});
        let m = merge_enforce(&[("a", &a), ("b", &b), ("c", &c)]);
        assert_eq!(m.conflicts, vec![("/spec/tls".to_string(), vec!["a".to_string(), "b".to_string()])]);
        assert_eq!(m.value, json!({"spec": {"size": 1, "mode": "x"}}));
        // A scalar where another policy has an object below.
        let d = json!({"spec": 1});
        let m = merge_enforce(&[("a", &a), ("d", &d)]);
        assert_eq!(m.conflicts.len(), 1);
        assert_eq!(m.conflicts[0].1, vec!["a".to_string(), "d".to_string()]);
        assert_eq!(m.value, json!({}));
    }

    #[test]
    fn patterns_that_need_backtracking_are_refused_on_the_policy_and_others_run_in_linear_time() {
        // Lookahead and a backreference: refused, saying why.
        for pattern in ["^(?=(a+)+$)a", "^(a)\\1$"] {
            let e = compile(&json!({"properties": {"spec": {"pattern": pattern}}})).unwrap_err();
            assert!(e.contains("schema is not usable") && e.contains("no lookaround"), "{pattern}: {e}");
        }
        // A nested quantifier on a long non-matching input: linear, a violation, no error.
        let v = compile(&json!({"properties": {"spec": {"type": "string", "pattern": "^(a+)+$"}}})).unwrap();
        let long = format!("{}!", "a".repeat(100_000));
        let errs = violations(&v, &json!({"spec": long}));
        assert_eq!(errs.len(), 1, "{errs:?}");
        assert_eq!(errs[0].0, "/spec");
    }

    #[test]
    fn bad_schemas_and_enforce_are_refused_with_a_clear_message() {
        let p = |enforce: Value, schema: Option<Value>| ModuleConfigPolicySpec {
            module: "redis".into(),
            enforce,
            schema,
            ..Default::default()
        };
        assert!(p(json!("x"), None).check(&["redis"]).unwrap_err().contains("enforce must be an object, not a string"));
        assert!(p(json!({"metadata": {}}), None).check(&["redis"]).is_err());
        let e = p(json!({}), Some(json!({"type": "nonsense"}))).check(&["redis"]).unwrap_err();
        assert!(e.contains("not a valid JSON Schema"), "{e}");
        let e = p(json!({}), Some(json!({"maximum": "five"}))).check(&["redis"]).unwrap_err();
        assert!(e.contains("not a valid JSON Schema"), "{e}");
        assert!(p(json!({}), Some(json!({"type": "object"}))).check(&["redis"]).is_ok());
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let labels: BTreeMap<String, String> =
            [("region".to_string(), "eu".to_string()), ("plan".to_string(), "free".to_string())].into();
        let req = |key: &str, operator: &str, values: &[&str]| LabelSelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| v.to_string()).collect(),
        };
        let sel = |e: Vec<LabelSelectorRequirement>| LabelSelector { match_expressions: e, ..Default::default() };
        assert!(LabelSelector::default().matches(&labels));
        assert!(sel(vec![req("region", "In", &["eu", "us"])]).matches(&labels));
        assert!(!sel(vec![req("region", "NotIn", &["eu"])]).matches(&labels));
        assert!(sel(vec![req("plan", "Exists", &[]), req("tier", "DoesNotExist", &[])]).matches(&labels));
        assert!(!sel(vec![req("plan", "Bogus", &[])]).matches(&labels));
    }

    #[test]
    fn violations_carry_pointers() {
        let v = compile(&json!({"type": "object", "properties": {"spec": {"type": "object",
            "properties": {"replicas": {"type": "integer", "maximum": 5}, "tls": {"type": "boolean"}}}}}))
        .unwrap();
        let mut errs = violations(&v, &json!({"spec": {"replicas": 7, "tls": "yes"}}));
        errs.sort();
        assert_eq!(errs.iter().map(|e| e.0.as_str()).collect::<Vec<_>>(), vec!["/spec/replicas", "/spec/tls"]);
        assert!(violations(&v, &json!({"spec": {"replicas": 5}})).is_empty());
    }

    #[test]
    fn pointers_escape_and_set_round_trips() {
        let e = json!({"spec": {"a/b": {"c~d": 1}, "empty": {}}});
        let ps = enforced_pointers(&e);
        assert_eq!(ps, vec!["/spec/a~1b/c~0d", "/spec/empty"]);
        let mut v = json!({});
        for p in &ps {
            set_pointer(&mut v, p, e.pointer(p).unwrap().clone());
        }
        assert_eq!(v, e);
        assert_eq!(differing(&json!({"spec": {"empty": {}}}), &e, &ps), vec!["/spec/a~1b/c~0d"]);
        // A user's keys inside an enforced empty object are theirs.
        assert_eq!(differing(&json!({"spec": {"a/b": {"c~d": 1}, "empty": {"k": 1}}}), &e, &ps), Vec::<String>::new());
    }
}
