//! The manager rollout judgement against `kubectl rollout status`.

use super::manager_rollout_pending;

#[test]
fn an_artifact_must_say_what_its_template_says() {
    use crate::artifact::ModuleArtifact;
    let objects = vec![
        serde_json::json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": "ns"}}),
    ];
    let mut a = ModuleArtifact::new("w", "1.0.0", "ns/op", objects).unwrap();
    a.managed_resources = vec![crate::artifact::parse_kind_ref("example.com/v1/Widget").unwrap()];
    let a = crate::artifact::cache::Cached::new(a).unwrap();
    let spec = fleetwatch_api::ModuleTemplateSpec {
        module_name: "w".into(),
        version: "1.0.0".into(),
        managed_resources: a.managed_resources.clone(),
        manager: a.manager.clone(),
        ..Default::default()
    };
    assert_eq!(super::agrees(&spec, &a), Ok(()));
    let mut other = spec.clone();
    other.version = "1.0.1".into();
    assert_eq!(super::agrees(&other, &a).unwrap_err(), "version is 1.0.0 in the artifact, 1.0.1 in spec.version");
    let mut other = spec.clone();
    other.requires_downtime = true;
    assert_eq!(
        super::agrees(&other, &a).unwrap_err(),
        "requires-downtime is false in the artifact, true in spec.requiresDowntime"
    );
    let mut other = spec.clone();
    other.managed_resources.clear();
    assert!(super::agrees(&other, &a).unwrap_err().starts_with("managed resources are [example.com/v1/Widget]"));
    let mut other = spec.clone();
    other.manager.name = "else".into();
    assert!(super::agrees(&other, &a).unwrap_err().starts_with("the manager is Deployment ns/op in the artifact"));
    let mut other = spec;
    other.module_name = "x".into();
    assert!(super::agrees(&other, &a).unwrap_err().starts_with("module name is w"));
}

fn deployment(generation: Option<i64>, status: serde_json::Value) -> kube::api::DynamicObject {
    let mut d: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "m"},
        "spec": {"replicas": 2}, "status": status}))
    .unwrap();
    d.metadata.generation = generation;
    d
}

#[test]
fn an_unobserved_generation_is_not_rolled_out_even_with_ready_replicas() {
    // The old pods are ready, but the controller has not seen the upgrade yet.
    let d = deployment(Some(3), serde_json::json!({"observedGeneration": 2, "updatedReplicas": 2, "readyReplicas": 2}));
    assert!(manager_rollout_pending(&d).unwrap().contains("generation 3"));
}

#[test]
fn updated_and_ready_replicas_must_reach_the_spec() {
    let d = deployment(Some(3), serde_json::json!({"observedGeneration": 3, "updatedReplicas": 1, "readyReplicas": 2}));
    assert!(manager_rollout_pending(&d).unwrap().contains("1/2 replicas updated"));
    let d = deployment(Some(3), serde_json::json!({"observedGeneration": 3, "updatedReplicas": 2, "readyReplicas": 1}));
    assert!(manager_rollout_pending(&d).unwrap().contains("1/2 replicas ready"));
    let d = deployment(Some(3), serde_json::json!({"observedGeneration": 3, "updatedReplicas": 2, "readyReplicas": 2}));
    assert_eq!(manager_rollout_pending(&d), None);
}

#[test]
fn kinds_without_a_generation_are_judged_by_ready_replicas() {
    assert_eq!(manager_rollout_pending(&deployment(None, serde_json::json!({"readyReplicas": 2}))), None);
    assert!(manager_rollout_pending(&deployment(None, serde_json::json!({}))).is_some());
}
