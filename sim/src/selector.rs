//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!`exists) and field selectors
//! (`metadata.name`, `metadata.namespace`, and the Event fields kube-apiserver indexes),
//! parsed once per request and matched per object.

use serde_json::Value;

use crate::error::ApiError;

/// A parsed label selector; the empty selector matches everything. The parser is the one
/// the hub's access policy uses (`fleetwatch_api::label_selector`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector(fleetwatch_api::label_selector::LabelSelector);

impl LabelSelector {
    /// Parses the `labelSelector` query parameter (400 when it cannot be parsed).
    pub fn parse(sel: &str) -> Result<Self, ApiError> {
        fleetwatch_api::label_selector::LabelSelector::parse(sel)
            .map(LabelSelector)
            .map_err(|e| ApiError::bad_request(e.to_string()))
    }

    /// Whether the object's `metadata.labels` satisfy every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = &obj["metadata"]["labels"];
        self.0.matches_with(|k| labels.get(k).and_then(Value::as_str))
    }
}

/// A parsed field selector. Every kind supports `metadata.name` and `metadata.namespace`;
/// Events also support kube-apiserver's Event fields (see [`event_label`]). Requirements
/// keep the core v1 label, so one matcher serves both Event APIs whatever version an Event
/// was written through.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector(Vec<(String, bool, String)>);

/// The core v1 Event field labels kube-apiserver selects on (`ToSelectableFields` of the
/// Event strategy), besides `metadata.name` / `metadata.namespace`.
const CORE_EVENT_FIELDS: &[&str] = &[
    "involvedObject.kind",
    "involvedObject.namespace",
    "involvedObject.name",
    "involvedObject.uid",
    "involvedObject.apiVersion",
    "involvedObject.resourceVersion",
    "involvedObject.fieldPath",
    "reason",
    "reportingComponent",
    "source",
    "type",
];

/// The core v1 label a field selector label of an Event stands for, as kube-apiserver's
/// field label conversion functions map them: core v1 takes [`CORE_EVENT_FIELDS`] as they
/// are; events.k8s.io/v1 takes `regarding.*` (for `involvedObject.*`),
/// `reportingController` (for `reportingComponent`), `reason` and `type`. `None`: not
/// supported.
fn event_label(group: &str, label: &str) -> Option<String> {
    match group {
        "" => CORE_EVENT_FIELDS.contains(&label).then(|| label.to_string()),
        "events.k8s.io" => match label {
            "reason" | "type" => Some(label.to_string()),
            "reportingController" => Some("reportingComponent".into()),
            _ => label
                .strip_prefix("regarding.")
                .map(|f| format!("involvedObject.{f}"))
                .filter(|l| CORE_EVENT_FIELDS.contains(&l.as_str())),
        },
        _ => None,
    }
}

/// Splits at separators not escaped with `\` (kubectl escapes `\`, `,` and `=` in values,
/// `fields.EscapeValue`).
fn split_unescaped(s: &str, sep: char) -> Vec<&str> {
    let mut out = Vec::new();
    let (mut start, mut escaped) = (0usize, false);
    for (i, c) in s.char_indices() {
        if escaped {
            escaped = false;
        } else if c == '\\' {
            escaped = true;
        } else if c == sep {
            out.push(&s[start..i]);
            start = i + c.len_utf8();
        }
    }
    out.push(&s[start..]);
    out
}

/// A value with its escapes removed.
fn unescape(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    let mut chars = v.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                out.push(n);
            }
        } else {
            out.push(c);
        }
    }
    out
}

/// The first unescaped operator of a requirement: (field, is `=`/`==`, raw value).
fn split_requirement(part: &str) -> Option<(&str, bool, &str)> {
    let b = part.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'\\' => i += 2,
            b'!' if b.get(i + 1) == Some(&b'=') => return Some((&part[..i], false, &part[i + 2..])),
            b'=' if b.get(i + 1) == Some(&b'=') => return Some((&part[..i], true, &part[i + 2..])),
            b'=' => return Some((&part[..i], true, &part[i + 1..])),
            _ => i += 1,
        }
    }
    None
}

impl FieldSelector {
    /// Parses the `fieldSelector` query parameter of a kind that selects on metadata only;
    /// other fields are rejected like kube-apiserver does for kinds that do not index them.
    #[cfg(test)]
    pub fn parse(sel: &str) -> Result<Self, ApiError> {
        Self::parse_for(sel, "", "")
    }

    /// Parses the `fieldSelector` query parameter for the kind `kind` of API group `group`
    /// (Events of either API select on their fields too).
    pub fn parse_for(sel: &str, group: &str, kind: &str) -> Result<Self, ApiError> {
        let mut out = Vec::new();
        if sel.trim().is_empty() {
            return Ok(FieldSelector(out));
        }
        for part in split_unescaped(sel, ',') {
            let Some((field, eq, value)) = split_requirement(part) else {
                return Err(ApiError::bad_request(format!("invalid selector: '{sel}'; can't understand '{part}'")));
            };
            let field = field.trim();
            let label = match field {
                "metadata.name" | "metadata.namespace" => Some(field.to_string()),
                _ if kind == "Event" => event_label(group, field),
                _ => None,
            };
            let Some(label) = label else {
                return Err(ApiError::bad_request(format!("field label not supported: {field}")));
            };
            out.push((label, eq, unescape(value.trim())));
        }
        Ok(FieldSelector(out))
    }

    /// Whether the object (as stored, through whichever API it was written) satisfies
    /// every requirement.
    pub fn matches(&self, obj: &Value) -> bool {
        self.0.iter().all(|(field, eq, value)| (field_value(obj, field) == *value) == *eq)
    }
}

/// The value of a (core v1) field label in a stored object; absent fields are "".
fn field_value(obj: &Value, label: &str) -> String {
    let s = |v: &Value| v.as_str().unwrap_or("").to_string();
    // Events written through events.k8s.io/v1 are stored with its field names.
    let new_api = obj["apiVersion"] == "events.k8s.io/v1";
    match label {
        "metadata.name" => s(&obj["metadata"]["name"]),
        "metadata.namespace" => s(&obj["metadata"]["namespace"]),
        "reportingComponent" => s(&obj[if new_api { "reportingController" } else { "reportingComponent" }]),
        // kube-apiserver: the source's component, else the reporting controller.
        "source" => {
            let component = s(&obj[if new_api { "deprecatedSource" } else { "source" }]["component"]);
            if component.is_empty() {
                s(&obj[if new_api { "reportingController" } else { "reportingComponent" }])
            } else {
                component
            }
        }
        _ => match label.strip_prefix("involvedObject.") {
            Some(f) => s(&obj[if new_api { "regarding" } else { "involvedObject" }][f]),
            None => s(&obj[label]),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn obj(labels: Value) -> Value {
        json!({"metadata": {"name": "a", "namespace": "ns1", "labels": labels}})
    }

    #[test]
    fn label_operators() {
        let o = obj(json!({"app": "web", "tier": "front"}));
        let m = |s: &str| LabelSelector::parse(s).unwrap().matches(&o);
        assert!(m("app=web"));
        assert!(m("app==web,tier"));
        assert!(!m("app!=web"));
        assert!(m("app in (web, db)"));
        assert!(!m("app notin (web,db)"));
        assert!(m("tier notin (back)"));
        assert!(m("!missing"));
        assert!(!m("missing"));
        assert!(m("missing notin (x)"));
        assert!(!m("app in (db),tier"));
        assert!(m(""));
    }

    #[test]
    fn bad_label_selector_is_400() {
        let e = LabelSelector::parse("app in web").unwrap_err();
        assert_eq!(e.code, 400);
        assert!(LabelSelector::parse("a b=c").is_err());
    }

    #[test]
    fn field_selectors() {
        let o = obj(json!({}));
        assert!(FieldSelector::parse("metadata.name=a").unwrap().matches(&o));
        assert!(!FieldSelector::parse("metadata.namespace!=ns1").unwrap().matches(&o));
        assert_eq!(FieldSelector::parse("spec.x=1").unwrap_err().code, 400);
        assert_eq!(FieldSelector::parse("involvedObject.name=a").unwrap_err().code, 400);
    }

    #[test]
    fn event_fields_through_both_apis_match_events_stored_either_way() {
        let core = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "e1", "namespace": "kcp"},
            "involvedObject": {"kind": "Runtime", "name": "rt-1", "namespace": "kcp", "uid": "u1"},
            "reason": "Installed", "type": "Normal", "reportingComponent": "ctl", "source": {}});
        let new = crate::convert::convert(&core, "events.k8s.io/v1");
        let describe =
            "involvedObject.name=rt-1,involvedObject.namespace=kcp,involvedObject.kind=Runtime,involvedObject.uid=u1";
        for stored in [&core, &new] {
            let core_sel = |s: &str| FieldSelector::parse_for(s, "", "Event").unwrap().matches(stored);
            let new_sel = |s: &str| FieldSelector::parse_for(s, "events.k8s.io", "Event").unwrap().matches(stored);
            assert!(core_sel(describe));
            assert!(!core_sel("involvedObject.uid=u2"));
            assert!(core_sel("reason=Installed,type=Normal,reportingComponent=ctl,source=ctl"));
            assert!(core_sel("type!=Warning"));
            assert!(new_sel("regarding.name=rt-1,regarding.kind=Runtime,regarding.uid=u1,reportingController=ctl"));
            assert!(!new_sel("regarding.name=rt-2"));
            assert!(new_sel("reason=Installed,metadata.namespace=kcp"));
        }
        // Each API takes its own labels only, as kube-apiserver's label conversions do.
        assert_eq!(FieldSelector::parse_for("regarding.name=a", "", "Event").unwrap_err().code, 400);
        assert_eq!(FieldSelector::parse_for("involvedObject.name=a", "events.k8s.io", "Event").unwrap_err().code, 400);
        assert_eq!(FieldSelector::parse_for("note=x", "events.k8s.io", "Event").unwrap_err().code, 400);
        assert_eq!(FieldSelector::parse_for("reason=x", "", "ConfigMap").unwrap_err().code, 400);
    }

    #[test]
    fn escaped_values() {
        let o = json!({"apiVersion": "v1", "kind": "Event", "metadata": {"name": "a,b=c\\d"}, "reason": "x"});
        let sel = FieldSelector::parse_for("metadata.name=a\\,b\\=c\\\\d,reason==x", "", "Event").unwrap();
        assert!(sel.matches(&o));
        assert!(FieldSelector::parse("metadata.name").is_err());
    }
}
