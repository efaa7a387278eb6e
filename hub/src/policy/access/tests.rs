//! Tests of the access policy: parsing, globs, selectors, redaction, following the file
//! and failing closed, and the control plane's SubscriberAccessPolicy objects.

use super::*;
use serde_json::json;

#[test]
fn globs() {
    assert!(glob("eu-*", "eu-1") && glob("eu-*", "eu-") && !glob("eu-*", "us-1"));
    assert!(glob("*", "") && glob("a?c", "abc") && !glob("a?c", "ac"));
    assert!(glob("*-prod-*", "x-prod-y") && !glob("*-prod-*", "x-prod"));
    assert!(glob("a1", "a1") && !glob("a1", "a10"));
}

#[test]
fn parses_and_refuses_what_it_cannot_enforce() {
    let p = Path::new("p.yaml");
    let ok = "subscribers:\n  - name: team-a\n    clusters: [a1, 'eu-*']\n    types: ['dev.fleetwatch.object.*']\n    redact: [/data/password]\n";
    let policy = AccessPolicy::parse(ok, p, false).unwrap();
    let g = policy.grant("team-a").unwrap();
    assert!(g.allows_cluster("eu-3", None) && !g.allows_cluster("b1", None));
    assert!(g.allows_type("dev.fleetwatch.object.applied") && !g.allows_type("dev.fleetwatch.inventory"));
    assert!(policy.grant("team-b").is_none());
    for (bad, why) in [
        ("subscribers:\n  - name: a\n", "clusters"),
        // Without Runtime labels a selector could only grant nothing: refused.
        ("subscribers:\n  - name: a\n    clusters: []\n    clusterSelector: team=a\n", "reads no control plane"),
        ("subscribers:\n  - name: a\n    clusters: []\n    redact: [data.password]\n", "not a JSON pointer"),
        ("subscribers:\n  - name: a\n    clusters: []\n  - name: a\n    clusters: []\n", "named twice"),
        ("subscribers:\n  - name: a\n    clusters: []\n    clustres: [x]\n", "clustres"),
        ("nope: 1\n", "nope"),
    ] {
        let err = AccessPolicy::parse(bad, p, false).err().unwrap().to_string();
        assert!(err.contains("p.yaml") && err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn a_cluster_selector_grants_by_runtime_labels() {
    let p = Path::new("p.yaml");
    let text = "subscribers:\n  - name: a\n    clusters: [a1]\n    clusterSelector: 'team=a,env in (prod)'\n";
    let policy = AccessPolicy::parse(text, p, true).unwrap();
    let g = policy.grant("a").unwrap();
    assert!(g.uses_runtime_labels());
    let labels = |kv: &[(&str, &str)]| -> BTreeMap<String, String> {
        kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    };
    assert!(g.allows_cluster("b7", Some(&labels(&[("team", "a"), ("env", "prod")]))));
    assert!(!g.allows_cluster("b7", Some(&labels(&[("team", "a"), ("env", "dev")]))));
    // No Runtime known for the cluster: the selector grants nothing; the glob still does.
    assert!(!g.allows_cluster("b7", None));
    assert!(g.allows_cluster("a1", None));
    assert!(g.describe_clusters().contains("team=a"), "{}", g.describe_clusters());
    for (bad, why) in [
        ("subscribers:\n  - name: a\n    clusters: []\n    clusterSelector: 'env in prod'\n", "set of values"),
        ("subscribers:\n  - name: a\n    clusters: []\n    clusterSelector: ''\n", "is empty"),
    ] {
        let err = AccessPolicy::parse(bad, p, true).err().unwrap().to_string();
        assert!(err.contains("p.yaml") && err.contains(why), "{bad}: {err}");
    }
}

#[test]
fn redaction_reaches_data_and_projections() {
    let g = Grant {
        name: "a".into(),
        clusters: vec!["*".into()],
        cluster_selector: None,
        selector: None,
        types: vec![],
        redact: vec!["/data/password".into(), "/spec/token".into()],
    };
    let mut d = json!({
        "kind": "Secret",
        "data": {"password": "p", "user": "u"},
        "projected": {"/data/password": "p", "/data": {"password": "p", "user": "u"}, "spec.token": "t", "/data/user": "u"},
    });
    assert_eq!(g.redact(&mut d), 4);
    assert_eq!(
        d,
        json!({"kind": "Secret", "data": {"user": "u"}, "projected": {"/data": {"user": "u"}, "/data/user": "u"}})
    );
    // Nothing there: nothing removed, nothing added.
    let mut plain = json!({"generation": 1});
    assert_eq!(g.redact(&mut plain), 0);
    assert_eq!(plain, json!({"generation": 1}));
}

#[test]
fn follows_content_and_fails_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    assert!(AccessControl::load(Some(path.clone()), false).is_err());
    std::fs::write(&path, "subscribers:\n  - name: a\n    clusters: [x]\n").unwrap();
    let ac = AccessControl::load(Some(path.clone()), false).unwrap();
    let replaced = ac.file_replaced();
    assert!(matches!(ac.decide("a"), Decision::Granted(_)));
    let Decision::Refused(why) = ac.decide("b") else { panic!("b is not named") };
    assert!(why.contains("policy.yaml") && why.contains("\"b\""), "{why}");
    assert!(matches!(ac.reload_if_changed(), Reload::Unchanged));
    // Broken: the old policy stays, reported once, stale.
    std::fs::write(&path, "subscribers: [").unwrap();
    assert!(matches!(ac.reload_if_changed(), Reload::Failed(AccessPolicyError::Invalid { .. })));
    assert!(matches!(ac.reload_if_changed(), Reload::Unchanged));
    assert!(ac.stale().is_some() && matches!(ac.decide("a"), Decision::Granted(_)));
    std::fs::remove_file(&path).unwrap();
    assert!(matches!(ac.reload_if_changed(), Reload::Failed(AccessPolicyError::Read { .. })));
    assert!(matches!(ac.decide("a"), Decision::Granted(_)));
    // Fixed, with the same length and without any mtime trick: the content counts.
    let g0 = ac.generation();
    std::fs::write(&path, "subscribers:\n  - name: b\n    clusters: [x]\n").unwrap();
    assert!(!replaced.has_changed().unwrap(), "failed reloads replace nothing");
    assert!(matches!(ac.reload_if_changed(), Reload::Replaced));
    assert!(ac.stale().is_none() && ac.generation() > g0);
    // The objects are judged again against the new file.
    assert!(replaced.has_changed().unwrap());
    assert!(matches!(ac.decide("a"), Decision::Refused(_)) && matches!(ac.decide("b"), Decision::Granted(_)));
    // No policy: everything.
    assert!(matches!(AccessControl::load(None, false).unwrap().decide("z"), Decision::Everything));
}

fn spec(grants: &[(&str, &[&str])]) -> fleetwatch_api::access_policy::SubscriberAccessPolicySpec {
    fleetwatch_api::access_policy::SubscriberAccessPolicySpec {
        subscribers: grants
            .iter()
            .map(|(name, clusters)| fleetwatch_api::access_policy::SubscriberGrant {
                name: name.to_string(),
                clusters: clusters.iter().map(|c| c.to_string()).collect(),
                ..Default::default()
            })
            .collect(),
    }
}

#[test]
fn objects_are_checked_like_the_file_and_never_merged() {
    let file =
        AccessPolicy::parse("subscribers:\n  - name: ops\n    clusters: ['*']\n", Path::new("f.yaml"), true).unwrap();
    let mut bad = spec(&[("team-b", &["*"])]);
    bad.subscribers[0].redact = vec!["data.password".into()];
    let objects: BTreeMap<_, _> = [
        ("a".to_string(), spec(&[("team-a", &["a-*"])])),
        ("b-bad".to_string(), bad),
        // Names team-a again (after "a"): not used at all, so it cannot widen team-a.
        ("c-dup".to_string(), spec(&[("team-a", &["*"]), ("team-c", &["c-*"])])),
        ("d-file".to_string(), spec(&[("ops", &["x"])])),
        ("e".to_string(), spec(&[("team-e", &["e-1"])])),
    ]
    .into();
    let (accepted, verdicts) = judge_objects(Some(&file), "f.yaml", &objects, true);
    assert_eq!(accepted.keys().map(String::as_str).collect::<Vec<_>>(), ["a", "e"]);
    let v = &verdicts["b-bad"];
    assert!(!v.accepted && v.reason == "Invalid" && v.message.contains("SubscriberAccessPolicy/b-bad"), "{v:?}");
    assert!(v.message.contains("not a JSON pointer"), "{v:?}");
    let v = &verdicts["c-dup"];
    assert!(!v.accepted && v.reason == "DuplicateSubscriber" && v.message.contains("\"a\""), "{v:?}");
    let v = &verdicts["d-file"];
    assert!(!v.accepted && v.reason == "DuplicateSubscriber" && v.message.contains("f.yaml"), "{v:?}");
    assert!(verdicts["a"].accepted && verdicts["a"].reason == "Accepted");
    // Without Runtime labels a selector is refused, as in the file.
    let mut sel = spec(&[("s", &[])]);
    sel.subscribers[0].cluster_selector = Some("team=a".into());
    let (accepted, verdicts) = judge_objects(None, "", &[("s".to_string(), sel)].into(), false);
    assert!(accepted.is_empty() && verdicts["s"].reason == "Invalid", "{verdicts:?}");
}

#[test]
fn objects_grant_with_the_file_and_fail_closed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("policy.yaml");
    std::fs::write(&path, "subscribers:\n  - name: ops\n    clusters: [x]\n").unwrap();
    let ac = AccessControl::load_with_objects(Some(path), true, true).unwrap();
    // Before the first list: everybody refused, even the file's subscribers; not ready.
    assert!(matches!(ac.decide("ops"), Decision::Refused(w) if w.contains("not read")));
    assert!(ac.objects_problem().is_some());
    let (accepted, _) = judge_objects(
        ac.file_grants().as_deref(),
        "policy.yaml",
        &[("a".to_string(), spec(&[("team-a", &["a-*"])]))].into(),
        true,
    );
    let g0 = ac.generation();
    assert!(ac.set_objects(accepted.clone()));
    assert!(!ac.set_objects(accepted.clone()), "the same set is no change");
    assert!(ac.generation() > g0 && ac.objects_problem().is_none());
    assert!(matches!(ac.decide("ops"), Decision::Granted(_)));
    assert!(
        matches!(ac.decide("team-a"), Decision::Granted(g) if g.allows_cluster("a-1", None) && !g.allows_cluster("b-1", None))
    );
    assert!(matches!(ac.decide("team-b"), Decision::Refused(_)));
    let sources = ac.sources();
    assert_eq!(sources["team-a"], "SubscriberAccessPolicy/a");
    assert!(sources["ops"].starts_with("file "), "{sources:?}");
    // A watch error keeps the set in force and is reported.
    ac.objects_failed("connection refused".into());
    assert!(matches!(ac.decide("team-a"), Decision::Granted(_)));
    assert!(ac.objects_problem().is_some_and(|p| p.contains("connection refused")));
    // No accepted object and no file: nobody.
    let only = AccessControl::load_with_objects(None, true, true).unwrap();
    only.set_objects(BTreeMap::new());
    assert!(matches!(only.decide("ops"), Decision::Refused(w) if w.contains("0 accepted")));
    assert!(only.current().is_some_and(|p| p.is_empty()));
}
