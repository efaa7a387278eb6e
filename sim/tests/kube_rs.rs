//! The same scenarios through kube-rs: dynamic objects via Discovery, typed Api errors,
//! server-side apply, and kube-runtime's watcher in list-then-watch and streaming-list
//! modes surviving a forced 410 relist.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use fleetwatch_sim::{SimCluster, SimOptions};
use fleetwatch_test_support::eventually;
use futures_util::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::runtime::watcher;
use serde_json::json;

async fn sim() -> (SimCluster, kube::Client) {
    let sim = SimCluster::start(SimOptions { bookmark_interval: Duration::from_millis(300), ..SimOptions::default() })
        .await
        .expect("sim starts");
    let client = sim.client().await.expect("client");
    (sim, client)
}

/// Code, reason and message of an API error.
struct ApiErr {
    code: u16,
    reason: String,
    message: String,
}

fn api_error(e: kube::Error) -> ApiErr {
    match e {
        kube::Error::Api(s) => ApiErr { code: s.code, reason: s.reason.clone(), message: s.message.clone() },
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn cm(name: &str, labels: serde_json::Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}, "data": {"k": "v"}}))
        .expect("configmap")
}

#[tokio::test]
async fn dynamic_objects_through_discovery_including_a_crd() {
    let (_sim, client) = sim().await;
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
    let (ar, caps) =
        discovery.resolve_gvk(&GroupVersionKind::gvk("", "v1", "ConfigMap")).expect("configmaps discovered");
    assert_eq!(caps.scope, Scope::Namespaced);
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let obj: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "dyn"}, "data": {"a": "1"}}),
    )
    .unwrap();
    let created = api.create(&PostParams::default(), &obj).await.expect("create");
    assert!(created.metadata.uid.is_some());
    let got = api.get("dyn").await.expect("get");
    assert_eq!(got.data["data"]["a"], "1");

    // A CRD makes its resource discoverable and usable; deleting it removes both.
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &discovery
            .resolve_gvk(&GroupVersionKind::gvk("apiextensions.k8s.io", "v1", "CustomResourceDefinition"))
            .expect("crd kind")
            .0,
    );
    let crd: serde_yaml_free::Crd = serde_yaml_free::crd();
    crds.create(&PostParams::default(), &crd.0).await.expect("create crd");
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery again");
    let (war, wcaps) =
        discovery.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")).expect("widgets discovered");
    assert!(
        wcaps.subresources.iter().any(|(r, _)| r.plural == "widgets/status" || r.plural == "status"),
        "{:?}",
        wcaps.subresources
    );
    let widgets: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &war);
    let w: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": {"n": 1}}),
    )
    .unwrap();
    widgets.create(&PostParams::default(), &w).await.expect("create widget");
    assert_eq!(widgets.list(&ListParams::default()).await.expect("list").items.len(), 1);
    crds.delete("widgets.example.com", &DeleteParams::default()).await.expect("delete crd");
    let e = api_error(widgets.list(&ListParams::default()).await.expect_err("resource gone"));
    assert_eq!(e.code, 404);
    let discovery = Discovery::new(client).run().await.expect("discovery after delete");
    assert!(discovery.resolve_gvk(&GroupVersionKind::gvk("example.com", "v1", "Widget")).is_none());
}

/// The CRD used by the kube-rs tests (built as JSON: no YAML parser needed).
mod serde_yaml_free {
    pub struct Crd(pub kube::api::DynamicObject);
    pub fn crd() -> Crd {
        Crd(serde_json::from_value(serde_json::json!({
            "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
            "metadata": {"name": "widgets.example.com"},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true, "subresources": {"status": {}},
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}
        }))
        .expect("crd"))
    }
}

#[tokio::test]
async fn typed_api_errors_conflicts_and_apply() {
    let (sim, client) = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let c = api.create(&PostParams::default(), &cm("a", json!({}))).await.expect("create");
    let e = api_error(api.create(&PostParams::default(), &cm("a", json!({}))).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    let e = api_error(api.get("missing").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    // Optimistic concurrency: replacing with a stale resourceVersion is a 409 Conflict.
    let mut fresh = c.clone();
    fresh.data = Some([("k".to_string(), "v2".to_string())].into());
    api.replace("a", &PostParams::default(), &fresh).await.expect("first replace");
    let e = api_error(api.replace("a", &PostParams::default(), &fresh).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    // Server-side apply with a field manager; another manager conflicts unless forced.
    let applied = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "1"}});
    api.patch("ssa", &PatchParams::apply("alice"), &Patch::Apply(&applied)).await.expect("apply creates");
    let other = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "ssa"}, "data": {"x": "2"}});
    let e = api_error(api.patch("ssa", &PatchParams::apply("bob"), &Patch::Apply(&other)).await.unwrap_err());
    assert_eq!(e.code, 409);
    assert!(e.message.contains("alice"), "{}", e.message);
    let forced = api.patch("ssa", &PatchParams::apply("bob").force(), &Patch::Apply(&other)).await.expect("forced");
    assert_eq!(forced.data.unwrap()["x"], "2");
    // Faults: the next requests fail with what was asked for, then things work again.
    // kube-rs retries 429 by itself: the injected 429 is served and the call still succeeds.
    sim.faults().fail_next(1, 429);
    api.get("a").await.expect("429 retried by the client");
    assert_eq!(sim.faults().pending_failures(), 0);
    sim.faults().fail_next(1, 500);
    assert_eq!(api_error(api.get("a").await.unwrap_err()).code, 500);
    api.get("a").await.expect("recovered");
    // Background garbage collection of dependents.
    let owner = api.get("a").await.unwrap();
    let dep: ConfigMap = serde_json::from_value(json!({"metadata": {"name": "dep", "ownerReferences": [
        {"apiVersion": "v1", "kind": "ConfigMap", "name": "a", "uid": owner.metadata.uid}]}}))
    .unwrap();
    api.create(&PostParams::default(), &dep).await.expect("dependent");
    api.delete("a", &DeleteParams::background()).await.expect("delete owner");
    eventually("the dependent to be garbage collected")
        .until(async || api.get_opt("dep").await.expect("get_opt"), Option::is_none)
        .await;
}

async fn watcher_survives_forced_relist(streaming: bool) {
    let (sim, client) = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    for n in ["a", "b", "c"] {
        api.create(&PostParams::default(), &cm(n, json!({"app": "x"}))).await.expect("create");
    }
    api.create(&PostParams::default(), &cm("other", json!({"app": "y"}))).await.expect("create");
    let mut cfg = watcher::Config::default().labels("app=x");
    if streaming {
        cfg = cfg.streaming_lists();
    }
    let (reader, writer) = kube::runtime::reflector::store::<ConfigMap>();
    let mut inits = 0usize;
    let stream = kube::runtime::reflector(writer, watcher(api.clone(), cfg));
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        let mut stream = std::pin::pin!(stream);
        while let Some(ev) = stream.next().await {
            if let Ok(watcher::Event::InitDone) = ev {
                let _ = tx.send(());
            }
        }
    });
    let names = |r: &kube::runtime::reflector::Store<ConfigMap>| -> BTreeSet<String> {
        r.state().iter().filter_map(|o| o.metadata.name.clone()).collect()
    };
    let wait_for = |want: BTreeSet<String>| {
        let reader = reader.clone();
        async move {
            eventually(format!("the store to become {want:?}"))
                .until(async || names(&reader), |now| *now == want)
                .await;
        }
    };
    let set = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>();
    tokio::time::timeout(Duration::from_secs(10), rx.recv()).await.expect("initial list done");
    inits += 1;
    wait_for(set(&["a", "b", "c"])).await;
    // Live events flow.
    api.create(&PostParams::default(), &cm("d", json!({"app": "x"}))).await.unwrap();
    wait_for(set(&["a", "b", "c", "d"])).await;

    // Force a relist: hold new watches, end the open one, compact the history, then
    // change things the watcher cannot see until it relists.
    let faults = sim.faults();
    faults.hold_watches(true);
    assert!(faults.drop_watches() >= 1);
    faults.compact_history();
    api.delete("a", &DeleteParams::default()).await.unwrap();
    api.create(&PostParams::default(), &cm("e", json!({"app": "x"}))).await.unwrap();
    let mut relabel = api.get("b").await.unwrap();
    relabel.metadata.labels = Some([("app".to_string(), "y".to_string())].into());
    api.replace("b", &PostParams::default(), &relabel).await.unwrap();
    faults.hold_watches(false);
    tokio::time::timeout(Duration::from_secs(15), rx.recv()).await.expect("relisted after 410");
    inits += 1;
    wait_for(set(&["c", "d", "e"])).await;
    // And it keeps watching after the relist.
    api.delete("c", &DeleteParams::default()).await.unwrap();
    wait_for(set(&["d", "e"])).await;
    assert_eq!(inits, 2);
    task.abort();
}

#[tokio::test]
async fn watcher_list_then_watch_relists_after_410() {
    watcher_survives_forced_relist(false).await;
}

#[tokio::test]
async fn watcher_streaming_list_relists_after_410() {
    watcher_survives_forced_relist(true).await;
}

#[tokio::test]
async fn raw_watch_from_old_resource_version_gets_410_and_bookmarks_arrive() {
    let (sim, client) = sim().await;
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    api.create(&PostParams::default(), &cm("a", json!({}))).await.unwrap();
    let rv = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    sim.faults().compact_history();
    let mut s = api.watch(&kube::api::WatchParams::default(), &rv).await.expect("watch starts").boxed();
    match s.next().await {
        Some(Err(kube::Error::Api(status))) => assert_eq!(status.code, 410),
        Some(Ok(kube::api::WatchEvent::Error(e))) => assert_eq!(e.code, 410),
        other => panic!("expected a 410 ERROR event, got {other:?}"),
    }
    // From a current resourceVersion: events, then bookmarks carrying the latest resourceVersion.
    let rv = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    let mut s = api
        .watch(&kube::api::WatchParams { bookmarks: true, ..Default::default() }.timeout(5), &rv)
        .await
        .unwrap()
        .boxed();
    api.create(&PostParams::default(), &cm("b", json!({}))).await.unwrap();
    let mut saw_added = false;
    let mut bookmark_rv = None;
    while let Some(ev) = tokio::time::timeout(Duration::from_secs(5), s.next()).await.expect("event in time") {
        match ev.expect("event") {
            kube::api::WatchEvent::Added(o) => saw_added = o.metadata.name.as_deref() == Some("b"),
            kube::api::WatchEvent::Bookmark(b) => {
                bookmark_rv = Some(b.metadata.resource_version);
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert!(saw_added);
    let b: u64 = bookmark_rv.expect("bookmark").parse().unwrap();
    assert!(b >= sim.resource_version() - 1 && b > rv.parse::<u64>().unwrap());
}

#[tokio::test]
async fn slow_watcher_is_closed_and_others_keep_their_events() {
    let sim = SimCluster::start(SimOptions { watch_buffer: 4, ..SimOptions::default() }).await.expect("sim starts");
    let client = sim.client().await.expect("client");
    let api: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let rv = api.list(&ListParams::default()).await.unwrap().metadata.resource_version.unwrap();
    // A watcher that reads nothing: once the socket buffers are full its queue fills and
    // the server closes its watch.
    let req = http::Request::get(format!("/api/v1/namespaces/default/configmaps?watch=true&resourceVersion={rv}"))
        .body(Vec::new())
        .unwrap();
    let stalled = client.request_stream(req).await.expect("watch starts");
    // A watcher that keeps up.
    let mut live = api.watch(&kube::api::WatchParams::default(), &rv).await.expect("watch starts").boxed();
    let big = "x".repeat(512 * 1024);
    let total = 60;
    // Lockstep with the live watcher, so only the stalled one can fall behind.
    for i in 0..total {
        let name = format!("big-{i:03}");
        let o: ConfigMap = serde_json::from_value(json!({"metadata": {"name": name}, "data": {"k": big}})).unwrap();
        api.create(&PostParams::default(), &o).await.unwrap();
        loop {
            match tokio::time::timeout(Duration::from_secs(30), live.next()).await.expect("event in time") {
                Some(Ok(kube::api::WatchEvent::Added(o))) => {
                    assert_eq!(o.metadata.name.as_deref(), Some(name.as_str()));
                    break;
                }
                // Bookmarks come on a timer, so a slow (busy) machine may see one in between.
                Some(Ok(kube::api::WatchEvent::Bookmark(_))) => continue,
                other => panic!("unexpected {other:?}"),
            }
        }
    }
    // The stalled watch ends (rather than hanging) before it has seen every event.
    use futures_util::AsyncBufReadExt;
    let mut lines = std::pin::pin!(stalled.lines());
    let mut seen = 0;
    while let Some(Ok(_)) =
        tokio::time::timeout(Duration::from_secs(30), lines.next()).await.expect("stalled watch ends")
    {
        seen += 1;
    }
    assert!(seen < total, "a slow watcher is closed, it saw {seen} of {total} events");
}

#[tokio::test]
async fn scale_subresource_through_kube_rs() {
    use k8s_openapi::api::apps::v1::Deployment;
    let (_sim, client) = sim().await;
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), "default");
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": "web"},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": "web"}},
                 "template": {"metadata": {"labels": {"app": "web"}}, "spec": {"containers": [{"name": "c", "image": "nginx"}]}}}
    }))
    .expect("deployment");
    deployments.create(&PostParams::default(), &d).await.expect("create");
    let scale = deployments.get_scale("web").await.expect("get_scale");
    assert_eq!(scale.spec.as_ref().and_then(|s| s.replicas), Some(2));
    assert_eq!(scale.status.as_ref().and_then(|s| s.selector.as_deref()), Some("app=web"));
    let scaled = deployments
        .patch_scale("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": 5}})))
        .await
        .expect("patch_scale");
    assert_eq!(scaled.spec.and_then(|s| s.replicas), Some(5));
    let d = deployments.get("web").await.expect("get");
    assert_eq!(d.spec.replicas, Some(5));
    assert_eq!(d.metadata.generation, Some(2));
    // A Scale with a stale resourceVersion conflicts; a negative count is invalid.
    let mut stale = scale.clone();
    stale.spec = Some(k8s_openapi::api::autoscaling::v1::ScaleSpec { replicas: Some(1) });
    let e = deployments.replace_scale("web", &PostParams::default(), &stale).await.expect_err("stale");
    assert_eq!(api_error(e).code, 409);
    let e = deployments
        .patch_scale("web", &PatchParams::default(), &Patch::Merge(json!({"spec": {"replicas": -1}})))
        .await
        .expect_err("negative");
    assert_eq!(api_error(e).code, 422);
    // Kinds without /scale answer 404.
    let cms: Api<ConfigMap> = Api::namespaced(client, "default");
    cms.create(&PostParams::default(), &cm("c", json!({}))).await.expect("create cm");
    assert_eq!(api_error(cms.get_scale("c").await.expect_err("no scale")).code, 404);
}

#[tokio::test]
async fn table_requests_with_the_accept_header() {
    let (_sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let mut c = cm("tab", json!({"app": "x"}));
    c.data = Some([("a".to_string(), "1".to_string()), ("b".to_string(), "2".to_string())].into());
    cms.create(&PostParams::default(), &c).await.expect("create");
    let table = |uri: &str| {
        http::Request::get(uri)
            .header("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io,application/json")
            .body(Vec::new())
            .expect("request")
    };
    let t: serde_json::Value = client.request(table("/api/v1/namespaces/default/configmaps")).await.expect("table");
    assert_eq!((t["kind"].as_str(), t["apiVersion"].as_str()), (Some("Table"), Some("meta.k8s.io/v1")));
    let cols: Vec<&str> =
        t["columnDefinitions"].as_array().expect("columns").iter().filter_map(|c| c["name"].as_str()).collect();
    assert_eq!(cols, ["Name", "Data", "Age"]);
    assert_eq!(t["columnDefinitions"][0]["format"], "name");
    let row = &t["rows"][0];
    assert_eq!(row["cells"][0], "tab");
    assert_eq!(row["cells"][1], 2);
    assert!(row["cells"][2].as_str().is_some_and(|a| a.ends_with('s')), "{row}");
    assert_eq!(row["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(row["object"]["metadata"]["labels"]["app"], "x");
    assert!(t["metadata"]["resourceVersion"].is_string());
    // includeObject=Object carries the whole object, None none; a single GET is a one-row Table.
    let t: serde_json::Value =
        client.request(table("/api/v1/namespaces/default/configmaps/tab?includeObject=Object")).await.expect("get");
    assert_eq!(t["rows"].as_array().map(Vec::len), Some(1));
    assert_eq!(t["rows"][0]["object"]["data"]["a"], "1");
    let t: serde_json::Value =
        client.request(table("/api/v1/namespaces/default/configmaps?includeObject=None")).await.expect("none");
    assert!(t["rows"][0].get("object").is_none_or(|o| o.is_null()), "{t}");
    // Only protobuf accepted: 406, as nothing else can be produced.
    let req = http::Request::get("/api/v1/namespaces/default/configmaps")
        .header("Accept", "application/vnd.kubernetes.protobuf")
        .body(Vec::new())
        .expect("request");
    let e = client.request::<serde_json::Value>(req).await.expect_err("406");
    assert_eq!(api_error(e).code, 406);
}

#[tokio::test]
async fn metadata_only_get_list_and_watch() {
    let (_sim, client) = sim().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(&PostParams::default(), &cm("m1", json!({"app": "x"}))).await.expect("create");
    let m = cms.get_metadata("m1").await.expect("get_metadata");
    assert_eq!(m.metadata.labels.as_ref().and_then(|l| l.get("app")).map(String::as_str), Some("x"));
    let list = cms.list_metadata(&ListParams::default()).await.expect("list_metadata");
    assert_eq!(list.items.len(), 1);
    assert_eq!(list.items[0].metadata.name.as_deref(), Some("m1"));
    let raw = client
        .request_text(
            http::Request::get("/api/v1/namespaces/default/configmaps/m1")
                .header("Accept", "application/json;as=PartialObjectMetadata;g=meta.k8s.io;v=v1")
                .body(Vec::new())
                .expect("request"),
        )
        .await
        .expect("raw");
    let v: serde_json::Value = serde_json::from_str(&raw).expect("json");
    assert_eq!(v["kind"], "PartialObjectMetadata");
    assert!(v.get("data").is_none(), "{v}");
    let mut events = cms.watch_metadata(&kube::api::WatchParams::default(), "0").await.expect("watch").boxed();
    match events.next().await {
        Some(Ok(kube::api::WatchEvent::Added(o))) => assert_eq!(o.metadata.name.as_deref(), Some("m1")),
        other => panic!("expected ADDED, got {other:?}"),
    }
}

#[tokio::test]
async fn custom_resource_schema_violations_are_422_with_causes() {
    let (_sim, client) = sim().await;
    let crds: Api<DynamicObject> = Api::all_with(
        client.clone(),
        &kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let crd: serde_json::Value = json!({
    "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
    "metadata": {"name": "runtimes.fleetwatch.io"},
    "spec": {"group": "fleetwatch.io", "scope": "Namespaced",
        "names": {"plural": "runtimes", "singular": "runtime", "kind": "Runtime"},
        "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
            "type": "object",
            "properties": {"spec": {"type": "object", "required": ["name"], "properties": {
                "name": {"type": "string"},
                "mode": {"type": "string", "enum": ["a", "b"], "default": "a"},
            }}}}}}]}});
    crds.create(&PostParams::default(), &serde_json::from_value(crd).unwrap()).await.expect("crd created");
    let ar = kube::api::ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("fleetwatch.io", "v1", "Runtime"),
        "runtimes",
    );
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let bad: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "fleetwatch.io/v1", "kind": "Runtime", "metadata": {"name": "x"}, "spec": {"mode": "c"}}),
    )
    .unwrap();
    let status = match api.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected a 422, got {other:?}"),
    };
    assert_eq!((status.code, status.reason.as_str()), (422, "Invalid"));
    assert!(status.is_invalid());
    assert_eq!(
        status.message,
        r#"Runtime.fleetwatch.io "x" is invalid: [spec.mode: Unsupported value: "c": supported values: "a", "b", spec.name: Required value]"#
    );
    let details = status.details.expect("details");
    let causes: Vec<(&str, &str, &str)> =
        details.causes.iter().map(|c| (c.reason.as_str(), c.field.as_str(), c.message.as_str())).collect();
    assert_eq!(
        causes,
        vec![
            ("FieldValueNotSupported", "spec.mode", r#"Unsupported value: "c": supported values: "a", "b""#),
            ("FieldValueRequired", "spec.name", "Required value"),
        ]
    );
    // Defaults are applied on write.
    let ok: DynamicObject = serde_json::from_value(
        json!({"apiVersion": "fleetwatch.io/v1", "kind": "Runtime", "metadata": {"name": "x"}, "spec": {"name": "alpha"}}),
    )
    .unwrap();
    let created = api.create(&PostParams::default(), &ok).await.expect("valid object created");
    assert_eq!(created.data["spec"]["mode"], "a");
}

#[tokio::test]
async fn rbac_denials_are_403_forbidden_and_access_reviews_agree() {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
    };
    let sim = SimCluster::start(SimOptions { rbac: true, ..SimOptions::default() }).await.expect("sim starts");
    let token = sim.token_for("default", "bot").expect("token for a new ServiceAccount");
    let kc = kube::config::Kubeconfig::from_yaml(&sim.kubeconfig_with_token(&token).to_string()).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await.unwrap();
    let bot = kube::Client::try_from(cfg).unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(bot.clone(), "default");
    let e = api_error(cms.list(&ListParams::default()).await.expect_err("nothing granted yet"));
    assert_eq!((e.code, e.reason.as_str()), (403, "Forbidden"));
    assert_eq!(
        e.message,
        r#"configmaps is forbidden: User "system:serviceaccount:default:bot" cannot list resource "configmaps" in API group "" in the namespace "default""#
    );
    // Grant list through a ClusterRole bound in the namespace, as the admin.
    let admin = sim.client().await.unwrap();
    let rb_ar =
        kube::api::ApiResource::from_gvk(&GroupVersionKind::gvk("rbac.authorization.k8s.io", "v1", "RoleBinding"));
    let rbs: Api<DynamicObject> = Api::namespaced_with(admin.clone(), "default", &rb_ar);
    let rb = json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding", "metadata": {"name": "bot-view"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "view"},
        "subjects": [{"kind": "ServiceAccount", "name": "bot", "namespace": "default"}]});
    rbs.create(&PostParams::default(), &serde_json::from_value(rb).unwrap()).await.expect("binding created");
    assert!(cms.list(&ListParams::default()).await.is_ok(), "view grants list");
    let e = api_error(cms.create(&PostParams::default(), &cm("x", json!({}))).await.expect_err("view does not write"));
    assert_eq!(e.code, 403);
    let reviews: Api<SelfSubjectAccessReview> = Api::all(bot);
    let ask = |verb: &str| SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some("configmaps".into()),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let r = reviews.create(&PostParams::default(), &ask("list")).await.expect("review");
    assert!(r.status.as_ref().is_some_and(|s| s.allowed), "{r:?}");
    let r = reviews.create(&PostParams::default(), &ask("create")).await.expect("review");
    assert!(r.status.as_ref().is_some_and(|s| !s.allowed), "{r:?}");
}
