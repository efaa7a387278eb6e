//! The agent watching real(istic) clusters: sim clusters served over HTTPS, changed with
//! the real kubectl and kube-rs, watched by real agent processes.

use std::collections::HashMap;
use std::path::Path;
use std::time::{Duration, Instant};

use fleetwatch_protocol::Event;
use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::discovery::ApiResource;
use serde_json::json;

use crate::support::*;

fn watch_config(name: &str, group: &str, version: &str, kind: &str, extra: serde_json::Value) -> String {
    let mut spec = json!({"resource": {"group": group, "version": version, "kind": kind}});
    if let Some(m) = extra.as_object() {
        for (k, v) in m {
            spec[k] = v.clone();
        }
    }
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": name}, "spec": spec})
        .to_string()
}

fn events_for<'a>(seen: &'a Seen, watch: &str, subject: &str) -> Vec<&'a Event> {
    seen.all.iter().filter(|e| e.watch.as_deref() == Some(watch) && e.subject == subject).collect()
}

async fn wait_for(collector: &Collector, what: &str, cond: impl Fn(&Seen) -> bool) {
    let ok = holds_within(Duration::from_secs(15), || cond(&collector.seen.lock().unwrap())).await;
    assert!(
        ok,
        "timed out waiting for {what}; events: {:#?}",
        collector.seen.lock().unwrap().all.iter().map(|e| (&e.watch, &e.kind, &e.subject, &e.data)).collect::<Vec<_>>()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_changes_reach_subscribers_through_field_filters() {
    let pki = Pki::new();
    let (_sim, kc) = sim_cluster(&pki, "rt1").await;
    kubectl(&kc, &["apply", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"apps"}}"#));
    let wc_dir = pki.path("watch-configs");
    std::fs::create_dir_all(&wc_dir).unwrap();
    std::fs::write(
        wc_dir.join("cms.json"),
        watch_config(
            "cms",
            "",
            "v1",
            "ConfigMap",
            json!({"namespace": "apps", "fields": ["data"], "project": ["/data/color"]}),
        ),
    )
    .unwrap();
    std::fs::write(
        wc_dir.join("spec.json"),
        watch_config(
            "deploy-spec",
            "apps",
            "v1",
            "Deployment",
            json!({"fields": ["spec"], "project": ["/spec/replicas"]}),
        ),
    )
    .unwrap();
    std::fs::write(
        wc_dir.join("status.json"),
        watch_config(
            "deploy-status",
            "apps",
            "v1",
            "Deployment",
            json!({"fields": ["status"], "project": ["/status/readyReplicas"]}),
        ),
    )
    .unwrap();
    // Two invalid ones: validated at the hub, never pushed to agents.
    std::fs::write(
        wc_dir.join("bad-selector.json"),
        watch_config("bad-selector", "", "v1", "ConfigMap", json!({"labelSelector": "app=(web"})),
    )
    .unwrap();
    std::fs::write(
        wc_dir.join("bad-pointer.json"),
        watch_config("bad-pointer", "", "v1", "ConfigMap", json!({"fields": ["/data/~9"]})),
    )
    .unwrap();
    // A directory with an invalid WatchConfig is refused at start, naming file and fault.
    let out = std::process::Command::new(BIN)
        .args(hub_args(&pki, 0, 0))
        .args(["--watch-config", wc_dir.to_str().unwrap()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("bad-") && (err.contains("RFC 6901") || err.contains("labelSelector")), "{err}");
    std::fs::remove_file(wc_dir.join("bad-selector.json")).unwrap();
    std::fs::remove_file(wc_dir.join("bad-pointer.json")).unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc_dir.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &kc);
    let collector = Collector::start(&pki, &hub.url(), "ops").await;

    // Every (valid) watch reports running to the hub.
    let running = holds_within(Duration::from_secs(15), || {
        let v = futures_executor(hub.clusters());
        v["clusters"][0]["watches"]
            .as_array()
            .is_some_and(|w| w.len() == 3 && w.iter().all(|s| s["phase"] == "running"))
    })
    .await;
    assert!(running, "{}", hub.clusters().await);

    // Create, change, delete a ConfigMap with kubectl.
    let cm = |color: &str| {
        format!(
            r#"{{"apiVersion":"v1","kind":"ConfigMap","metadata":{{"name":"web","namespace":"apps"}},"data":{{"color":"{color}"}}}}"#
        )
    };
    kubectl(&kc, &["apply", "-f", "-"], Some(&cm("blue")));
    let subject = "v1/ConfigMap/apps/web";
    wait_for(&collector, "blue", |s| {
        events_for(s, "cms", subject).iter().any(|e| e.data["projected"]["/data/color"] == "blue")
    })
    .await;
    kubectl(
        &kc,
        &["patch", "configmap", "web", "-n", "apps", "--type", "merge", "-p", r#"{"data":{"color":"red"}}"#],
        None,
    );
    wait_for(&collector, "red", |s| {
        events_for(s, "cms", subject).iter().any(|e| e.data["projected"]["/data/color"] == "red")
    })
    .await;
    // A label change is not a `data` change: filtered in the agent.
    kubectl(&kc, &["label", "configmap", "web", "-n", "apps", "tier=front"], None);
    kubectl(&kc, &["delete", "configmap", "web", "-n", "apps"], None);
    wait_for(&collector, "delete", |s| events_for(s, "cms", subject).iter().any(|e| e.is_delete())).await;
    {
        let seen = collector.seen.lock().unwrap();
        let evs = events_for(&seen, "cms", subject);
        let kinds: Vec<_> = evs.iter().map(|e| e.kind.as_str()).collect();
        assert_eq!(
            kinds,
            ["dev.fleetwatch.object.applied", "dev.fleetwatch.object.applied", "dev.fleetwatch.object.deleted"],
            "{evs:#?}"
        );
        assert_eq!(evs[0].data["kind"], "ConfigMap");
        assert_eq!(evs[0].data["metadata"]["namespace"], "apps");
        assert_eq!(evs[0].cluster, "rt1");
    }

    // A Deployment: a status-only change reaches the status watch, not the spec watch.
    let dep = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"api","namespace":"apps"},"spec":{"replicas":2,"selector":{"matchLabels":{"app":"api"}},"template":{"metadata":{"labels":{"app":"api"}},"spec":{"containers":[{"name":"c","image":"x"}]}}}}"#;
    kubectl(&kc, &["apply", "-f", "-"], Some(dep));
    let dsub = "apps/v1/Deployment/apps/api";
    wait_for(&collector, "deployment seen by both", |s| {
        !events_for(s, "deploy-spec", dsub).is_empty() && !events_for(s, "deploy-status", dsub).is_empty()
    })
    .await;
    kubectl(
        &kc,
        &[
            "patch",
            "deployment",
            "api",
            "-n",
            "apps",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            r#"{"status":{"readyReplicas":2}}"#,
        ],
        None,
    );
    wait_for(&collector, "status change", |s| {
        events_for(s, "deploy-status", dsub).iter().any(|e| e.data["projected"]["/status/readyReplicas"] == 2)
    })
    .await;
    kubectl(
        &kc,
        &["patch", "deployment", "api", "-n", "apps", "--type", "merge", "-p", r#"{"spec":{"replicas":3}}"#],
        None,
    );
    wait_for(&collector, "spec change", |s| {
        events_for(s, "deploy-spec", dsub).iter().any(|e| e.data["projected"]["/spec/replicas"] == 3)
    })
    .await;
    {
        let seen = collector.seen.lock().unwrap();
        let spec_events = events_for(&seen, "deploy-spec", dsub);
        assert_eq!(
            spec_events.len(),
            2,
            "the status-only change must be filtered for the spec watch: {spec_events:#?}"
        );
    }

    // The same events through the real `fleetwatch tail`.
    let sub = pki.subscriber("cli");
    let out = std::process::Command::new(BIN)
        .args(["tail", "--hub", &hub.url(), "--from", "earliest", "--count", "3", "--cluster", "rt1"])
        .args(client_args(&sub))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(r#""subject":"v1/ConfigMap/apps/web""#) && text.contains(r#""/data/color":"blue""#),
        "{text}"
    );
}

/// Blocks on a future from a sync closure (for `holds_within`).
fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// Latest event per object, compared with the cluster's real state at the end.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nothing_lost_through_relists_restarts_and_deletes_during_outages() {
    let pki = Pki::new();
    let (sim, kc) = sim_cluster(&pki, "rt2").await;
    let client = sim.client().await.unwrap();
    kubectl(&kc, &["apply", "-f", "-"], Some(r#"{"apiVersion":"v1","kind":"Namespace","metadata":{"name":"load"}}"#));
    let wc_dir = pki.path("wc");
    std::fs::create_dir_all(&wc_dir).unwrap();
    std::fs::write(
        wc_dir.join("cms.json"),
        watch_config(
            "cms",
            "",
            "v1",
            "ConfigMap",
            json!({"namespace": "load", "fields": ["data"], "project": ["/data/v"]}),
        ),
    )
    .unwrap();
    let data = pki.path("hub-data");
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, Some(&data), &["--watch-config", wc_dir.to_str().unwrap()]);
    let mut agent = kube_agent(&pki, "rt2", &hub.url(), &kc);
    let collector = Collector::start(&pki, &hub.url(), "ops").await;

    // A writer keeps changing 30 ConfigMaps, deleting and recreating some.
    let cms: Api<DynamicObject> =
        Api::namespaced_with(client.clone(), "load", &ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()));
    let stop = tokio_util::sync::CancellationToken::new();
    let written = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let writer = {
        let (cms, stop, written) = (cms.clone(), stop.clone(), written.clone());
        tokio::spawn(async move {
            let mut i: u64 = 0;
            while !stop.is_cancelled() {
                let n = i % 30;
                let name = format!("cm-{n}");
                if i % 7 == 3 {
                    let _ = cms.delete(&name, &DeleteParams::default()).await;
                } else {
                    let obj = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": {"v": i.to_string()}});
                    let _ = cms.patch(&name, &PatchParams::apply("writer").force(), &Patch::Apply(&obj)).await;
                }
                i += 1;
                written.store(i, std::sync::atomic::Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(15)).await;
            }
            i
        })
    };
    // Each step lets the writer go on for `WRITES` more changes (the load runs through
    // every fault), and, where a process came back, lets its events flow again first.
    const WRITES: u64 = 60;
    let writes_went_on = async || {
        let since = written.load(std::sync::atomic::Ordering::SeqCst);
        let ok = holds_within(fleetwatch_test_support::DEADLINE, || {
            written.load(std::sync::atomic::Ordering::SeqCst) >= since + WRITES
        })
        .await;
        assert!(ok, "the writer stalled at {since} changes");
    };
    let events_flow = async |what: &str| {
        let since = collector.seen.lock().unwrap().all.len();
        wait_for(&collector, what, |s| s.all.len() >= since + 10).await;
    };
    // 1. A delete while the agent cannot watch, then a forced relist (history compacted,
    //    so resuming gets 410): the agent's digest diff turns the vanished object into a
    //    synthetic delete.
    let vanish =
        json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "vanish-me"}, "data": {"v": "x"}});
    cms.patch("vanish-me", &PatchParams::apply("test"), &Patch::Apply(&vanish)).await.unwrap();
    wait_for(&collector, "vanish-me created", |s| s.all.iter().any(|e| e.subject == "v1/ConfigMap/load/vanish-me"))
        .await;
    sim.faults().hold_watches(true);
    sim.faults().drop_watches();
    cms.delete("vanish-me", &DeleteParams::default()).await.unwrap();
    sim.faults().compact_history();
    sim.faults().hold_watches(false);
    wait_for(&collector, "synthetic delete of vanish-me", |s| {
        s.all.iter().any(|e| e.subject == "v1/ConfigMap/load/vanish-me" && e.is_delete() && e.data["vanished"] == true)
    })
    .await;
    writes_went_on().await;
    // 2. Agent restart, with deletes while it is down.
    agent.signal("KILL");
    agent.wait_exit(Duration::from_secs(5));
    for n in 0..5 {
        let _ = cms.delete(&format!("cm-{n}"), &DeleteParams::default()).await;
    }
    writes_went_on().await;
    agent = kube_agent(&pki, "rt2", &hub.url(), &kc);
    events_flow("events from the restarted agent").await;
    writes_went_on().await;
    // 3. Hub crash and restart (durable bus).
    hub.proc.signal("KILL");
    hub.proc.wait_exit(Duration::from_secs(5));
    hub = HubProc::start(&pki, port, Some(&data), &["--watch-config", wc_dir.to_str().unwrap()]);
    events_flow("events through the restarted hub").await;
    writes_went_on().await;
    // 4. Watches dropped while writes continue; the watcher resumes from its resourceVersion.
    sim.faults().drop_watches();
    events_flow("events after the dropped watches").await;
    writes_went_on().await;
    stop.cancel();
    let writes = writer.await.unwrap();
    assert!(writes > 200, "writer made only {writes} changes");

    // Expected: the cluster's final state.
    let finals = configmap_values(&cms, "load").await;
    let check = |seen: &Seen| -> Vec<String> {
        let mut problems = Vec::new();
        let last_resync = seen.resyncs.get("rt2").and_then(|r| r.iter().map(|(c, _)| *c).max()).unwrap_or(0);
        let mut latest: HashMap<&str, &Event> = HashMap::new();
        for e in seen.all.iter().filter(|e| e.cluster == "rt2" && e.watch.as_deref() == Some("cms")) {
            latest.insert(&e.subject, e);
        }
        for (subject, v) in &finals {
            match latest.get(subject.as_str()) {
                Some(e) if !e.is_delete() && e.data["projected"]["/data/v"] == v.as_str() => {}
                other => problems.push(format!(
                    "{subject}: want v={v}, latest event {:?}",
                    other.map(|e| (&e.kind, &e.data["projected"]))
                )),
            }
        }
        for (subject, e) in &latest {
            if !finals.contains_key(*subject) && !e.is_delete() && e.cursor.unwrap_or(0) > last_resync {
                problems.push(format!(
                    "{subject}: deleted in the cluster, but the latest event is {} after the last resync",
                    e.kind
                ));
            }
        }
        problems
    };
    let ok = holds_within(Duration::from_secs(30), || check(&collector.seen.lock().unwrap()).is_empty()).await;
    let seen = collector.seen.lock().unwrap();
    assert!(ok, "{:#?}\nagent log:\n{}\nhub log:\n{}", check(&seen), agent.stderr(), hub.proc.stderr());
    // Deletes during the agent's downtime are covered by the agent's resync on start; the
    // relist diff makes synthetic deletes for the rest.
    assert!(seen.resyncs.get("rt2").is_some_and(|r| r.len() >= 2), "{:?}", seen.resyncs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_plane_watch_configs_reach_every_agent_and_kinds_appear_later() {
    let pki = Pki::new();
    let (cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let cp_client = cp.client().await.unwrap();
    // Install the WatchConfig CRD from the generated manifest, as a user would.
    let crd_yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/watchconfigs.operator.fleetwatch.dev.yaml"),
    )
    .unwrap();
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&crd_yaml));
    kubectl(
        &cp_kc,
        &["apply", "-f", "-"],
        Some(&watch_config("cms", "", "v1", "ConfigMap", json!({"fields": ["data"]}))),
    );
    let hub = HubProc::start(&pki, free_port(), None, &["--control-plane-kubeconfig", cp_kc.to_str().unwrap()]);
    let (_s1, kc1) = sim_cluster(&pki, "a").await;
    let (_s2, kc2) = sim_cluster(&pki, "b").await;
    let _a1 = kube_agent(&pki, "a", &hub.url(), &kc1);
    let _a2 = kube_agent(&pki, "b", &hub.url(), &kc2);
    let collector = Collector::start(&pki, &hub.url(), "ops").await;

    let phases = |v: &serde_json::Value, watch: &str| -> Vec<String> {
        v["clusters"].as_array().map_or(vec![], |cs| {
            cs.iter()
                .map(|c| {
                    c["watches"]
                        .as_array()
                        .and_then(|w| w.iter().find(|s| s["name"] == watch))
                        .map_or("absent".to_string(), |s| s["phase"].as_str().unwrap_or("").to_string())
                })
                .collect()
        })
    };
    let all_running = |watch: &str| {
        let v = futures_executor(hub.clusters());
        let p = phases(&v, watch);
        p.len() == 2 && p.iter().all(|x| x == "running")
    };
    assert!(holds_within(Duration::from_secs(15), || all_running("cms")).await, "{}", hub.clusters().await);

    // A new WatchConfig, for a kind that does not exist yet in the runtime clusters.
    let started = Instant::now();
    let wcs: Api<fleetwatch_api::watchconfig::WatchConfig> = Api::all(cp_client.clone());
    let widget = serde_json::from_str(&watch_config(
        "widgets",
        "example.com",
        "v1",
        "Widget",
        json!({"fields": ["spec"], "project": ["/spec/size"]}),
    ))
    .unwrap();
    wcs.create(&PostParams::default(), &widget).await.unwrap();
    // Nothing installed the kind: the watches wait for it, which is healthy (issue 27).
    let reported = holds_within(Duration::from_secs(5), || {
        let p = phases(&futures_executor(hub.clusters()), "widgets");
        p.len() == 2 && p.iter().all(|x| x == "waiting-for-kind")
    })
    .await;
    let took = started.elapsed();
    assert!(reported, "{}", hub.clusters().await);
    eprintln!("new WatchConfig reached both agents and was reported in {took:?}");

    // The CRD appears in cluster a: its watch starts and objects flow.
    let crd = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition","metadata":{"name":"widgets.example.com"},"spec":{"group":"example.com","names":{"kind":"Widget","plural":"widgets","singular":"widget"},"scope":"Namespaced","versions":[{"name":"v1","served":true,"storage":true,"schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;
    kubectl(&kc1, &["apply", "-f", "-"], Some(crd));
    kubectl(
        &kc1,
        &["apply", "-f", "-"],
        Some(
            r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w1","namespace":"default"},"spec":{"size":7}}"#,
        ),
    );
    wait_for(&collector, "widget event", |s| {
        s.all.iter().any(|e| {
            e.cluster == "a"
                && e.subject == "example.com/v1/Widget/default/w1"
                && e.data["projected"]["/spec/size"] == 7
        })
    })
    .await;

    // A module that declares the kind is installed in b (its manager's provides
    // annotation) but the kind is missing there: now that is a failure.
    let phase_of = |cluster: &'static str| {
        let v = futures_executor(hub.clusters());
        v["clusters"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["cluster"] == cluster))
            .and_then(|c| c["watches"].as_array())
            .and_then(|ws| ws.iter().find(|w| w["name"] == "widgets"))
            .map_or(String::new(), |w| w["phase"].as_str().unwrap_or("").to_string())
    };
    let manager = r#"{"apiVersion":"apps/v1","kind":"Deployment","metadata":{"name":"widget-manager","namespace":"default","labels":{"operator.fleetwatch.dev/module":"widgets","app.kubernetes.io/version":"1.2.3"},"annotations":{"operator.fleetwatch.dev/provides":"Widget.example.com"}},"spec":{"replicas":1,"selector":{"matchLabels":{"app":"w"}},"template":{"metadata":{"labels":{"app":"w"}},"spec":{"containers":[{"name":"c","image":"x"}]}}}}"#;
    kubectl(&kc2, &["apply", "-f", "-"], Some(manager));
    assert!(
        holds_within(Duration::from_secs(15), || phase_of("b") == "kind-not-found").await,
        "{}",
        hub.clusters().await
    );
    let b = futures_executor(hub.clusters());
    let b_watch = b["clusters"].as_array().unwrap().iter().find(|c| c["cluster"] == "b").unwrap()["watches"]
        .as_array()
        .unwrap()
        .iter()
        .find(|w| w["name"] == "widgets")
        .unwrap()
        .clone();
    assert!(b_watch["message"].as_str().unwrap_or("").contains("widgets 1.2.3"), "{b_watch}");
    assert_eq!(phase_of("a"), "running", "a serves the kind");
    // The module removed: waiting again, healthy.
    kubectl(&kc2, &["delete", "deployment", "widget-manager", "-n", "default"], None);
    assert!(
        holds_within(Duration::from_secs(15), || phase_of("b") == "waiting-for-kind").await,
        "{}",
        hub.clusters().await
    );

    // The CRD removed from a (its module uninstalled): a's watch waits for the kind, and
    // takes up the kind again when the CRD comes back.
    kubectl(&kc1, &["delete", "crd", "widgets.example.com"], None);
    assert!(
        holds_within(Duration::from_secs(15), || phase_of("a") == "waiting-for-kind").await,
        "{}",
        hub.clusters().await
    );
    kubectl(&kc1, &["apply", "-f", "-"], Some(crd));
    kubectl(
        &kc1,
        &["apply", "-f", "-"],
        Some(
            r#"{"apiVersion":"example.com/v1","kind":"Widget","metadata":{"name":"w2","namespace":"default"},"spec":{"size":8}}"#,
        ),
    );
    wait_for(&collector, "widget event after the CRD came back", |s| {
        s.all.iter().any(|e| {
            e.cluster == "a"
                && e.subject == "example.com/v1/Widget/default/w2"
                && e.data["projected"]["/spec/size"] == 8
        })
    })
    .await;
    assert!(holds_within(Duration::from_secs(15), || phase_of("a") == "running").await, "{}", hub.clusters().await);

    // Deleting the WatchConfig stops the watch everywhere.
    wcs.delete("widgets", &DeleteParams::default()).await.unwrap();
    let gone = holds_within(Duration::from_secs(5), || {
        phases(&futures_executor(hub.clusters()), "widgets").iter().all(|p| p == "absent")
    })
    .await;
    assert!(gone, "{}", hub.clusters().await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inventory_reports_the_running_module_versions() {
    let pki = Pki::new();
    let (_sim, kc) = sim_cluster(&pki, "inv").await;
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let _agent = kube_agent(&pki, "inv", &hub.url(), &kc);
    let collector = Collector::start(&pki, &hub.url(), "ops").await;
    let dep = |version: &str| {
        format!(
            r#"{{"apiVersion":"apps/v1","kind":"Deployment","metadata":{{"name":"redis-manager","namespace":"default","labels":{{"operator.fleetwatch.dev/module":"redis","app.kubernetes.io/version":"{version}"}}}},"spec":{{"replicas":1,"selector":{{"matchLabels":{{"app":"r"}}}},"template":{{"metadata":{{"labels":{{"app":"r"}}}},"spec":{{"containers":[{{"name":"c","image":"x"}}]}}}}}}}}"#
        )
    };
    kubectl(&kc, &["apply", "-f", "-"], Some(&dep("2.0.0")));
    wait_for(&collector, "inventory 2.0.0", |s| {
        s.all.iter().any(|e| {
            e.kind == "dev.fleetwatch.inventory"
                && e.data["modules"][0]["version"] == "2.0.0"
                && e.data["modules"][0]["ready"] == false
        })
    })
    .await;
    kubectl(
        &kc,
        &[
            "patch",
            "deployment",
            "redis-manager",
            "--subresource",
            "status",
            "--type",
            "merge",
            "-p",
            // A finished rollout: the controller observed the spec, updated and ready replicas
            // reach the desired count (as `kubectl rollout status` and the operator judge it;
            // `manager_ready` in agent/src/kube_source.rs).
            r#"{"status":{"observedGeneration":1,"updatedReplicas":1,"readyReplicas":1}}"#,
        ],
        None,
    );
    wait_for(&collector, "ready", |s| {
        s.all.iter().any(|e| e.kind == "dev.fleetwatch.inventory" && e.data["modules"][0]["ready"] == true)
    })
    .await;
    let v = hub.clusters().await;
    assert_eq!(v["clusters"][0]["inventory"][0]["name"], "redis", "{v}");
    assert_eq!(v["clusters"][0]["inventory"][0]["version"], "2.0.0", "{v}");
}

/// An RBAC denial is reported as the watch's phase and retried, not a crash loop.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forbidden_watch_is_reported_and_retried() {
    let pki = Pki::new();
    let (sim, kc) = sim_cluster(&pki, "rbac").await;
    let wc_dir = pki.path("wc");
    std::fs::create_dir_all(&wc_dir).unwrap();
    std::fs::write(wc_dir.join("cms.json"), watch_config("cms", "", "v1", "ConfigMap", json!({"fields": ["data"]})))
        .unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc_dir.to_str().unwrap()]);
    // The agent's first requests are denied.
    sim.faults().fail_next(6, 403);
    let mut agent = kube_agent(&pki, "rbac", &hub.url(), &kc);
    let running = holds_within(Duration::from_secs(20), || {
        let v = futures_executor(hub.clusters());
        v["clusters"][0]["watches"][0]["phase"] == "running"
    })
    .await;
    assert!(running, "{}\n{}", hub.clusters().await, agent.stderr());
    assert!(agent.stderr().contains("Forbidden"), "the denial was not reported:\n{}", agent.stderr());
    assert_eq!(agent.wait_exit(Duration::from_millis(100)), None, "the agent must keep running");
}

/// A watch that fails and works again while nothing changes in the cluster says so: its
/// phase goes back to running without waiting for an object to change. (kube-runtime's
/// watcher resumes silently; without the relist the phase stayed `error`, a false alarm
/// in the WatchConfig status, the admin API and the `FleetwatchWatchFailing` alert.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_that_failed_reports_running_again_in_a_quiet_cluster() {
    let pki = Pki::new();
    let (sim, kc) = sim_cluster(&pki, "quiet").await;
    let wc_dir = pki.path("wc");
    std::fs::create_dir_all(&wc_dir).unwrap();
    std::fs::write(wc_dir.join("cms.json"), watch_config("cms", "", "v1", "ConfigMap", json!({"fields": ["data"]})))
        .unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc_dir.to_str().unwrap()]);
    let agent = kube_agent(&pki, "quiet", &hub.url(), &kc);
    let phase = || {
        let v = futures_executor(hub.clusters());
        v["clusters"][0]["watches"][0]["phase"].as_str().unwrap_or("").to_string()
    };
    assert!(holds_within(Duration::from_secs(20), || phase() == "running").await, "{}", hub.clusters().await);
    // The open watch ends and the next requests fail (an API server restarting): the
    // agent reports the failure. Nothing in the cluster changes from here on.
    sim.faults().fail_next(3, 500);
    assert!(sim.faults().drop_watches() >= 1, "the agent's watch was open");
    assert!(
        holds_within(Duration::from_secs(20), || phase() == "error").await,
        "the failure was not reported: {}\n{}",
        hub.clusters().await,
        agent.stderr()
    );
    assert!(
        holds_within(Duration::from_secs(30), || phase() == "running").await,
        "the watch works again but still reports {}: {}\n{}",
        phase(),
        hub.clusters().await,
        agent.stderr()
    );
    assert_eq!(sim.faults().pending_failures(), 0, "every injected failure was served");
}
