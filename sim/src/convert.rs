//! Conversion between the versions of one stored object. Custom resources of several
//! versions share one stored object that is only relabelled (no conversion webhooks).
//! Core v1 Events and events.k8s.io/v1 Events are one object seen through two APIs, as in
//! kube-apiserver: the fields that were renamed in events.k8s.io/v1 are mapped here.

use serde_json::{Map, Value};

/// Core v1 Event field ↔ events.k8s.io/v1 Event field (the fields whose names differ).
const EVENT_FIELDS: &[(&str, &str)] = &[
    ("involvedObject", "regarding"),
    ("message", "note"),
    ("reportingComponent", "reportingController"),
    ("source", "deprecatedSource"),
    ("firstTimestamp", "deprecatedFirstTimestamp"),
    ("lastTimestamp", "deprecatedLastTimestamp"),
    ("count", "deprecatedCount"),
];

/// The object as seen through `api_version` (same kind).
pub fn convert(obj: &Value, api_version: &str) -> Value {
    let mut v = obj.clone();
    let from = obj["apiVersion"].as_str().unwrap_or("");
    if from == api_version {
        return v;
    }
    if obj["kind"] == "Event"
        && let Some(m) = v.as_object_mut()
    {
        match (from, api_version) {
            ("v1", "events.k8s.io/v1") => rename(m, EVENT_FIELDS.iter().map(|(c, e)| (*c, *e))),
            ("events.k8s.io/v1", "v1") => rename(m, EVENT_FIELDS.iter().map(|(c, e)| (*e, *c))),
            _ => {}
        }
    }
    v["apiVersion"] = Value::String(api_version.to_string());
    v
}

fn rename<'a>(m: &mut Map<String, Value>, pairs: impl Iterator<Item = (&'a str, &'a str)>) {
    let moved: Vec<(&str, Option<Value>)> = pairs.map(|(from, to)| (to, m.remove(from))).collect();
    for (to, v) in moved {
        m.remove(to);
        if let Some(v) = v {
            m.insert(to.to_string(), v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn events_map_renamed_fields_both_ways() {
        let ev = json!({"apiVersion": "events.k8s.io/v1", "kind": "Event", "metadata": {"name": "e"},
            "regarding": {"kind": "Pod", "name": "p"}, "note": "hi", "reason": "Started",
            "reportingController": "ctl", "deprecatedCount": 3, "type": "Normal"});
        let core = convert(&ev, "v1");
        assert_eq!(core["apiVersion"], "v1");
        assert_eq!(core["involvedObject"]["name"], "p");
        assert_eq!(core["message"], "hi");
        assert_eq!(core["reportingComponent"], "ctl");
        assert_eq!(core["count"], 3);
        assert_eq!(core["reason"], "Started");
        assert!(core["note"].is_null() && core["regarding"].is_null());
        assert_eq!(convert(&core, "events.k8s.io/v1"), ev);
    }

    #[test]
    fn other_kinds_are_relabelled() {
        let o = json!({"apiVersion": "example.com/v1", "kind": "Widget", "spec": {"note": 1}});
        assert_eq!(convert(&o, "example.com/v2")["apiVersion"], "example.com/v2");
        assert_eq!(convert(&o, "example.com/v2")["spec"], json!({"note": 1}));
    }
}
