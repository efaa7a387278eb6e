//! One bad object never stops the others: a Runtime the operator cannot decode is named and
//! marked in its status, while the good ones are reconciled as usual.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use fleetwatch_api::{Runtime, State};
use fleetwatch_test_support::eventually;
use kube::api::DynamicObject;
use kube::core::ApiResource;
use kube::{Api, CustomResourceExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_runtime_is_reported_and_the_others_reconciled() {
    let (_sim, client, cp) = common::control_plane().await;
    // A Runtime with a value the operator's types do not know, created before the operator
    // starts. It was stored while the CRD had no enum for that field: an API server (the sim
    // too) validates writes against the schema, not what it already stores, so it stays.
    let runtime_crd = serde_json::to_value(Runtime::crd()).unwrap();
    let mut without_enum = runtime_crd.clone();
    without_enum
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec/properties/modules/items/properties/customResourcePolicy")
        .and_then(serde_json::Value::as_object_mut)
        .expect("customResourcePolicy in the Runtime CRD")
        .remove("enum");
    cp.apply(&without_enum).await.unwrap();
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "bad", "namespace": "default"},
        "spec": {"modules": [{"name": "m", "customResourcePolicy": "DeleteEverything"}]}}))
        .await
        .unwrap();
    cp.apply(&runtime_crd).await.unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let mut config = fleetwatch_lifecycle::LifecycleConfig::new(client.clone());
    config.resync = None;
    tokio::spawn(fleetwatch_lifecycle::run(config, Default::default(), stop.clone()));
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "good", "namespace": "default"}, "spec": {"modules": []}}))
        .await
        .unwrap();

    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), "default");
    let raw: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ApiResource::erase::<Runtime>(&()));
    eventually("good reconciled and bad reported InvalidSpec")
        .until(
            async || (runtimes.get("good").await.unwrap().status, raw.get("bad").await.unwrap().data["status"].clone()),
            |(good, bad)| {
                let good_ready = good.as_ref().is_some_and(|s| {
                    s.state == Some(State::Ready) && s.conditions.iter().any(|c| c.message == "0/0 modules ready")
                });
                good_ready
                    && bad["conditions"][0]["reason"] == "InvalidSpec"
                    && bad["conditions"][0]["message"].as_str().is_some_and(|m| m.contains("DeleteEverything"))
            },
        )
        .await;
    // Fixing the bad one lets it be reconciled like any other.
    cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "bad", "namespace": "default"}, "spec": {"modules": []}}))
        .await
        .unwrap();
    eventually("the fixed runtime to be reconciled")
        .until(
            async || runtimes.get("bad").await.unwrap().status,
            |st| {
                st.as_ref().is_some_and(|s| {
                    s.state == Some(State::Ready) && s.conditions.iter().any(|c| c.reason != "InvalidSpec")
                })
            },
        )
        .await;
    stop.cancel();
}
