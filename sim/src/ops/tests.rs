//! Unit tests of the verbs on a bare `State`.

use serde_json::json;

use super::*;
use crate::patch::PatchType;
use crate::selector::{FieldSelector, LabelSelector};

fn setup() -> (State, ResourceDef) {
    let mut st = State::new(100);
    let ns_def = st.registry.get("", "v1", "namespaces").cloned().unwrap();
    create(&mut st, &ns_def, None, json!({"metadata": {"name": "d"}}), &WriteOpts::default()).unwrap();
    let def = st.registry.get("", "v1", "configmaps").cloned().unwrap();
    (st, def)
}

fn w() -> WriteOpts {
    WriteOpts { manager: "test".into(), ..Default::default() }
}

#[test]
fn create_stamps_metadata_and_requires_namespace() {
    let (mut st, def) = setup();
    let o = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v"}}), &w()).unwrap();
    assert_eq!(o["kind"], "ConfigMap");
    assert_eq!(o["metadata"]["uid"].as_str().map(str::len), Some(36));
    assert!(o["metadata"]["creationTimestamp"].is_string());
    assert!(o["metadata"]["generation"].is_null(), "configmaps have no generation");
    let e = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}}), &w()).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "AlreadyExists"));
    let e = create(&mut st, &def, Some("nope"), json!({"metadata": {"name": "a"}}), &w()).unwrap_err();
    assert_eq!((e.code, e.reason), (404, "NotFound"));
    let e = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "Bad_Name"}}), &w()).unwrap_err();
    assert_eq!((e.code, e.reason), (422, "Invalid"));
}

#[test]
fn stale_update_conflicts_and_noop_keeps_rv() {
    let (mut st, def) = setup();
    let o = create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v"}}), &w()).unwrap();
    let mut u = o.clone();
    u["data"]["k"] = json!("v2");
    let o2 = update(&mut st, &def, Some("d"), "a", u.clone(), false, &w()).unwrap();
    assert_ne!(o2["metadata"]["resourceVersion"], o["metadata"]["resourceVersion"]);
    let e = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap_err();
    assert_eq!((e.code, e.reason), (409, "Conflict"));
    let o3 = update(&mut st, &def, Some("d"), "a", o2.clone(), false, &w()).unwrap();
    assert_eq!(o3["metadata"]["resourceVersion"], o2["metadata"]["resourceVersion"]);
}

#[test]
fn generation_tracks_spec_only() {
    let mut st = State::new(100);
    let ns_def = st.registry.get("", "v1", "namespaces").cloned().unwrap();
    create(&mut st, &ns_def, None, json!({"metadata": {"name": "d"}}), &w()).unwrap();
    let def = st.registry.get("apps", "v1", "deployments").cloned().unwrap();
    let o = create(
        &mut st,
        &def,
        Some("d"),
        json!({"metadata": {"name": "a"}, "spec": {"replicas": 1}, "status": {"x": 1}}),
        &w(),
    )
    .unwrap();
    assert_eq!(o["metadata"]["generation"], 1);
    assert!(o["status"].is_null(), "status is reset on create");
    let mut u = o.clone();
    u["metadata"]["labels"] = json!({"a": "b"});
    let o = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
    assert_eq!(o["metadata"]["generation"], 1);
    let mut u = o.clone();
    u["spec"]["replicas"] = json!(3);
    let o = update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
    assert_eq!(o["metadata"]["generation"], 2);
    let mut s = o.clone();
    s["status"] = json!({"readyReplicas": 3});
    s["spec"]["replicas"] = json!(9);
    let o = update(&mut st, &def, Some("d"), "a", s, true, &w()).unwrap();
    assert_eq!(o["status"]["readyReplicas"], 3);
    assert_eq!(o["spec"]["replicas"], 3, "status update ignores spec");
    assert_eq!(o["metadata"]["generation"], 2);
}

#[test]
fn delete_waits_for_finalizers() {
    let (mut st, def) = setup();
    create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a", "finalizers": ["x/y"]}}), &w()).unwrap();
    let o = delete(&mut st, &def, Some("d"), "a", &DeleteOpts::default()).unwrap();
    assert!(o["metadata"]["deletionTimestamp"].is_string());
    assert!(get(&st, &def, Some("d"), "a").is_ok());
    let mut u = o.clone();
    u["metadata"]["finalizers"] = json!(["x/y", "new/one"]);
    assert_eq!(update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap_err().code, 403);
    let mut u = o.clone();
    u["metadata"]["finalizers"] = json!([]);
    update(&mut st, &def, Some("d"), "a", u, false, &w()).unwrap();
    assert_eq!(get(&st, &def, Some("d"), "a").unwrap_err().code, 404);
}

#[test]
fn list_pages_with_continue() {
    let (mut st, def) = setup();
    for i in 0..5 {
        create(
            &mut st,
            &def,
            Some("d"),
            json!({"metadata": {"name": format!("c{i}"), "labels": {"i": i.to_string()}}}),
            &w(),
        )
        .unwrap();
    }
    let all = LabelSelector::default();
    let f = FieldSelector::default();
    let p1 = list(&st, &def, Some("d"), &all, &f, Some(2), None).unwrap();
    assert_eq!(p1.items.len(), 2);
    assert_eq!(p1.remaining, Some(3));
    let p2 = list(&st, &def, Some("d"), &all, &f, Some(2), p1.continue_token.as_deref()).unwrap();
    let p3 = list(&st, &def, Some("d"), &all, &f, Some(2), p2.continue_token.as_deref()).unwrap();
    assert_eq!(p3.items.len(), 1);
    assert!(p3.continue_token.is_none());
    assert_eq!(p3.items[0].obj["metadata"]["name"], "c4");
    st.compact();
    assert_eq!(list(&st, &def, Some("d"), &all, &f, Some(2), p1.continue_token.as_deref()).unwrap_err().code, 410);
    let sel = LabelSelector::parse("i in (1,3)").unwrap();
    assert_eq!(list(&st, &def, None, &sel, &f, None, None).unwrap().items.len(), 2);
}

#[test]
fn patches_and_strategic_for_builtins() {
    let (mut st, def) = setup();
    create(&mut st, &def, Some("d"), json!({"metadata": {"name": "a"}, "data": {"k": "v", "z": "1"}}), &w()).unwrap();
    let (o, _) =
        patch(&mut st, &def, Some("d"), "a", PatchType::Merge, json!({"data": {"z": null, "n": "2"}}), false, &w())
            .unwrap();
    assert_eq!(o["data"], json!({"k": "v", "n": "2"}));
    let (o, _) =
        patch(&mut st, &def, Some("d"), "a", PatchType::Strategic, json!({"data": {"k": "w"}}), false, &w()).unwrap();
    assert_eq!(o["data"]["k"], "w");
    let e = patch(
        &mut st,
        &def,
        Some("d"),
        "a",
        PatchType::Merge,
        json!({"metadata": {"resourceVersion": "1"}}),
        false,
        &w(),
    )
    .unwrap_err();
    assert_eq!(e.code, 409);
}

#[test]
fn crd_lifecycle_serves_and_removes_resource() {
    let mut st = State::new(100);
    let crd_def = st.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").cloned().unwrap();
    let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Cluster",
        "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
    let o = create(&mut st, &crd_def, None, crd, &w()).unwrap();
    assert_eq!(o["status"]["conditions"][1]["type"], "Established");
    let def = st.registry.get("example.com", "v1", "widgets").cloned().unwrap();
    create(&mut st, &def, None, json!({"metadata": {"name": "w1"}, "spec": {"size": 1}}), &w()).unwrap();
    delete(&mut st, &crd_def, None, "widgets.example.com", &DeleteOpts::default()).unwrap();
    assert!(st.registry.get("example.com", "v1", "widgets").is_none());
    assert!(!st.objects.contains_key("example.com/widgets"));
    let bad = json!({"metadata": {"name": "wrong"}, "spec": {"group": "example.com", "scope": "Cluster",
        "names": {"plural": "widgets", "kind": "Widget"}, "versions": [{"name": "v1", "served": true, "storage": true}]}});
    assert_eq!(create(&mut st, &crd_def, None, bad, &w()).unwrap_err().code, 422);
}

#[test]
fn listed_json_is_the_object_as_seen_through_the_listed_version() {
    let mut st = State::new(100);
    let crd_def = st.registry.get("apiextensions.k8s.io", "v1", "customresourcedefinitions").cloned().unwrap();
    let crd = json!({"metadata": {"name": "widgets.example.com"}, "spec": {"group": "example.com", "scope": "Cluster",
        "names": {"plural": "widgets", "kind": "Widget"}, "versions": [
            {"name": "v1", "served": true, "storage": true}, {"name": "v2", "served": true, "storage": false}]}});
    create(&mut st, &crd_def, None, crd, &w()).unwrap();
    let v1 = st.registry.get("example.com", "v1", "widgets").cloned().unwrap();
    let v2 = st.registry.get("example.com", "v2", "widgets").cloned().unwrap();
    create(&mut st, &v1, None, json!({"metadata": {"name": "w1"}, "spec": {"size": 1}}), &w()).unwrap();
    let sel = LabelSelector::default();
    let f = FieldSelector::default();
    for def in [&v1, &v2] {
        let page = list(&st, def, None, &sel, &f, None, None).unwrap();
        assert_eq!(page.items.len(), 1);
        let parsed: Value = serde_json::from_slice(&page.items[0].json).unwrap();
        assert_eq!(parsed, get(&st, def, None, "w1").unwrap());
        assert_eq!(parsed["apiVersion"], def.api_version());
        let got: Value = serde_json::from_slice(&get_json(&st, def, None, "w1").unwrap()).unwrap();
        assert_eq!(got, parsed);
    }
    assert_eq!(get_json(&st, &v1, None, "nope").unwrap_err().code, 404);
    // An update replaces the stored JSON.
    let mut cur = get(&st, &v1, None, "w1").unwrap();
    cur["spec"]["size"] = json!(2);
    update(&mut st, &v1, None, "w1", cur, false, &w()).unwrap();
    let page = list(&st, &v1, None, &sel, &f, None, None).unwrap();
    let parsed: Value = serde_json::from_slice(&page.items[0].json).unwrap();
    assert_eq!(parsed["spec"]["size"], 2);
    assert_eq!(parsed, get(&st, &v1, None, "w1").unwrap());
}

#[test]
fn secret_string_data_is_encoded() {
    let (mut st, _) = setup();
    let def = st.registry.get("", "v1", "secrets").cloned().unwrap();
    let o =
        create(&mut st, &def, Some("d"), json!({"metadata": {"name": "s"}, "stringData": {"a": "hi"}}), &w()).unwrap();
    assert_eq!(o["data"]["a"], "aGk=");
    assert!(o["stringData"].is_null());
    assert_eq!(o["type"], "Opaque");
}
