//! The structural-schema walker against kube-apiserver's behaviour and error texts.

use super::*;
use serde_json::json;

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "spec": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 2, "maxLength": 5, "pattern": "^[a-z]+$"},
                    "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
                    "replicas": {"type": "integer", "minimum": 1, "maximum": 10, "default": 1},
                    "ratio": {"type": "number", "exclusiveMaximum": true, "maximum": 1.5},
                    "port": {"x-kubernetes-int-or-string": true},
                    "at": {"type": "string", "format": "date-time"},
                    "tags": {"type": "array", "maxItems": 2, "items": {"type": "string"}, "x-kubernetes-list-type": "set"},
                    "labels": {"type": "object", "maxProperties": 2, "additionalProperties": {"type": "string"}},
                    "note": {"type": "string", "nullable": true},
                    "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": true},
                    "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                                 "properties": {"spec": {"type": "object", "properties": {"x": {"type": "string"}}}}},
                    "nested": {"type": "object", "default": {}, "properties": {"deep": {"type": "string", "default": "d"}}},
                }
            },
            "status": {"type": "object", "properties": {"ready": {"type": "boolean"}}}
        }
    })
}

fn messages(obj: Value) -> Vec<String> {
    validate(&obj, &schema()).iter().map(FieldError::message).collect()
}

#[test]
fn enum_type_and_required_use_kube_apiserver_wording() {
    let errs = validate(&json!({"spec": {"mode": "c", "replicas": "x"}}), &schema());
    let msgs: Vec<String> = errs.iter().map(FieldError::message).collect();
    assert_eq!(
        msgs,
        vec![
            r#"spec.mode: Unsupported value: "c": supported values: "a", "b""#,
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#,
            "spec.name: Required value",
        ]
    );
    let reasons: Vec<&str> = errs.iter().map(|e| e.reason).collect();
    assert_eq!(reasons, ["FieldValueNotSupported", "FieldValueTypeInvalid", "FieldValueRequired"]);
}

#[test]
fn bounds_lengths_patterns_and_formats() {
    let m = messages(json!({"spec": {
        "name": "ABCDEF", "replicas": 11, "ratio": 1.5, "at": "yesterday",
        "tags": ["a", "b", "a"], "labels": {"a": "1", "b": "2", "c": "3"}
    }}));
    assert!(m.contains(&"spec.name: Too long: may not be longer than 5".to_string()), "{m:?}");
    assert!(
        m.contains(&r#"spec.name: Invalid value: "ABCDEF": spec.name in body should match '^[a-z]+$'"#.to_string())
    );
    assert!(m.contains(
        &"spec.replicas: Invalid value: 11: spec.replicas in body should be less than or equal to 10".to_string()
    ));
    assert!(m.contains(&"spec.ratio: Invalid value: 1.5: spec.ratio in body should be less than 1.5".to_string()));
    assert!(m.contains(
        &r#"spec.at: Invalid value: "yesterday": spec.at in body must be of type date-time: "yesterday""#.to_string()
    ));
    assert!(m.contains(&"spec.tags: Too many: 3: must have at most 2 items".to_string()));
    assert!(m.contains(&r#"spec.tags[2]: Duplicate value: "a""#.to_string()));
    assert!(m.contains(&"spec.labels: Too many: 3: must have at most 2 items".to_string()));
    let m = messages(json!({"spec": {"name": "a", "replicas": 0, "at": "2024-01-02T03:04:05Z", "port": "http"}}));
    assert_eq!(
        m,
        vec![
            r#"spec.name: Invalid value: "a": spec.name in body should be at least 2 chars long"#,
            "spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1",
        ]
    );
}

#[test]
fn int_or_string_nullable_and_embedded_resources() {
    assert!(messages(json!({"spec": {"name": "ab", "port": 80, "note": null}})).is_empty());
    let m = messages(json!({"spec": {"name": "ab", "port": true, "template": {"spec": {}}}}));
    assert_eq!(
        m,
        vec![
            r#"spec.port: Invalid value: "boolean": spec.port in body must be of type integer,string: "boolean""#,
            "spec.template.apiVersion: Required value: must not be empty",
            "spec.template.kind: Required value: must not be empty",
        ]
    );
    let m = messages(json!({"spec": {"name": "ab", "tags": [null]}}));
    assert_eq!(m, vec![r#"spec.tags[0]: Invalid value: "null": spec.tags[0] in body must be of type string: "null""#]);
}

#[test]
fn pruning_keeps_root_metadata_preserved_and_embedded_fields() {
    let mut o = json!({
        "apiVersion": "x/v1", "kind": "K", "metadata": {"name": "n", "labels": {"a": "b"}},
        "spec": {"name": "ab", "bogus": 1, "free": {"anything": {"goes": 1}},
                 "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": {"x": "1", "y": 2}, "extra": 3},
                 "labels": {"k": "v"}, "tags": ["a"]},
        "other": true,
    });
    let pruned = prune(&mut o, &schema());
    assert_eq!(pruned, ["other", "spec.bogus", "spec.template.extra", "spec.template.spec.y"]);
    assert_eq!(o["metadata"]["labels"]["a"], "b");
    assert_eq!(o["spec"]["free"]["anything"]["goes"], 1);
    assert_eq!(o["spec"]["template"]["metadata"]["name"], "p");
    assert_eq!(o["spec"]["labels"]["k"], "v");
}

#[test]
fn defaults_fill_missing_and_null_fields_and_drop_other_nulls() {
    let mut o = json!({"spec": {"name": "ab", "mode": null, "ratio": null, "note": null}});
    default(&mut o, &schema());
    assert_eq!(o["spec"]["mode"], "a");
    assert_eq!(o["spec"]["replicas"], 1);
    assert_eq!(o["spec"]["nested"], json!({"deep": "d"}), "defaults apply inside defaulted objects");
    assert!(o["spec"].get("ratio").is_none(), "null without default is dropped");
    assert!(o["spec"]["note"].is_null() && o["spec"].get("note").is_some(), "nullable keeps null");
    assert!(o.get("status").is_none(), "no default, no object");
}

#[test]
fn ratcheting_keeps_unchanged_invalid_values() {
    let old = json!({"spec": {"name": "ab", "mode": "legacy"}});
    let new = json!({"spec": {"name": "ab", "mode": "legacy", "replicas": 0}});
    let m: Vec<String> = validate_update(&new, &old, &schema()).iter().map(FieldError::message).collect();
    assert_eq!(m, vec!["spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"]);
}

#[test]
fn crd_schema_must_be_structural() {
    let bad = json!({"type": "object", "properties": {"spec": {"properties": {"a": {"type": "string"}}},
                      "any": {"x-kubernetes-preserve-unknown-fields": true},
                      "list": {"type": "array", "items": {}}}});
    let m: Vec<String> =
        check_structural(&bad, "spec.versions[0].schema.openAPIV3Schema").iter().map(FieldError::message).collect();
    assert_eq!(
        m,
        vec![
            "spec.versions[0].schema.openAPIV3Schema.properties[list].items.type: Required value: must not be empty for specified array items",
            "spec.versions[0].schema.openAPIV3Schema.properties[spec].type: Required value: must not be empty for specified object fields",
        ]
    );
    let m: Vec<String> = check_structural(&json!({"type": "string"}), "s").iter().map(FieldError::message).collect();
    assert_eq!(m, vec![r#"s.type: Invalid value: "string": must be object at the root"#]);
    assert!(check_structural(&schema(), "s").is_empty());
}

#[test]
fn durations_and_other_formats() {
    assert!(is_duration("1h30m") && is_duration("250ms") && is_duration("3 days") && !is_duration("soon"));
    assert!(format_ok("uuid", "123e4567-e89b-12d3-a456-426614174000") && !format_ok("uuid", "x"));
    assert!(format_ok("cidr", "10.0.0.0/8") && !format_ok("cidr", "10.0.0.0/33"));
    assert!(format_ok("int32", "anything"), "formats kube-apiserver strips check nothing");
}
