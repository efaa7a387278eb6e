//! Relays end to end: real hub, agent and relay processes, sim clusters changed with the
//! real kubectl, and real HTTP(S) targets in this process: a listener implementing
//! runtime-watcher's v2 contract (shared with the relay crate's tests) and a CloudEvents
//! receiver that checks the HMAC signature.

#[path = "../../relay/tests/support/klm_listener.rs"]
pub(crate) mod klm_listener;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use klm_listener::KlmListener;
use serde_json::json;

use crate::support::*;

const WAIT: Duration = Duration::from_secs(30);

fn write_watch_config(dir: &Path, name: &str, group: &str, version: &str, kind: &str, spec: serde_json::Value) {
    std::fs::create_dir_all(dir).unwrap();
    let mut s = json!({"resource": {"group": group, "version": version, "kind": kind}});
    for (k, v) in spec.as_object().unwrap() {
        s[k] = v.clone();
    }
    let wc = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig",
        "metadata": {"name": name}, "spec": s});
    std::fs::write(dir.join(format!("{name}.json")), wc.to_string()).unwrap();
}

fn configmap(ns: &str, name: &str, v: &str) -> serde_json::Value {
    json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": ns}, "data": {"v": v}})
}

fn relay_proc(pki: &Pki, kind: &str, hub: &str, name: &str, extra: &[String]) -> Proc {
    let mut args: Vec<String> =
        vec!["relay".into(), kind.into(), "--hub".into(), hub.into(), "--name".into(), name.into()];
    args.extend(client_args(&pki.subscriber(name)));
    args.extend(extra.iter().cloned());
    let log = pki.path(&format!("relay-{kind}-{}.log", free_port()));
    let p = Proc::spawn(&args, log);
    p.wait_stdout(&format!("relay {kind} running"), WAIT);
    p
}

/// (runtime, namespace, name, kind) of every request the listener accepted.
fn requests(l: &KlmListener) -> BTreeSet<(String, String, String, String)> {
    l.received()
        .iter()
        .map(|r| {
            (
                r.runtime.clone(),
                r.body["watched"]["namespace"].as_str().unwrap_or("?").into(),
                r.body["watched"]["name"].as_str().unwrap_or("?").into(),
                r.body["watchedGvk"]["kind"].as_str().unwrap_or("?").into(),
            )
        })
        .collect()
}

fn cm_request(name: &str) -> (String, String, String, String) {
    ("rt1".into(), "kyma-system".into(), name.into(), "ConfigMap".into())
}

async fn wait_requests(l: &KlmListener, want: &BTreeSet<(String, String, String, String)>, relay: &Proc) {
    let ok = holds_within(WAIT, || requests(l).is_superset(want)).await;
    assert!(ok, "listener got {:?}, want {want:?}; relay log:\n{}", requests(l), relay.stderr());
}

/// Every request is well-formed: exactly the contract's fields, JSON, the runtime's CN.
fn assert_contract(l: &KlmListener) {
    for r in l.received() {
        assert_eq!(r.component, "lifecycle-manager");
        assert_eq!(r.content_type, "application/json");
        let keys: BTreeSet<_> = r.body.as_object().unwrap().keys().cloned().collect();
        assert_eq!(keys, BTreeSet::from(["watched".to_string(), "watchedGvk".to_string()]), "{}", r.body);
    }
    assert!(l.refused().iter().all(|(s, _)| [503, 404, 422].contains(s)), "refused: {:?}", l.refused());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_klm_speaks_the_listener_contract_across_restart_and_outage() {
    let pki = Pki::new();
    let (_sim, kc) = sim_cluster(&pki, "rt1").await;
    kubectl(&kc, &["create", "namespace", "kyma-system"], None);
    let wc_dir = pki.path("watch-configs");
    write_watch_config(&wc_dir, "cms", "", "v1", "ConfigMap", json!({"namespace": "kyma-system", "fields": ["data"]}));
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc_dir.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &kc);

    // The listener over mutual TLS: the server certificate is the test PKI's (localhost,
    // 127.0.0.1), clients must present a certificate of the same CA.
    let server_files = fleetwatch_certs::TlsFiles {
        cert: pki.path("hub.crt"),
        key: pki.path("hub.key"),
        ca: vec![pki.path("ca.crt")],
    };
    let tls = Arc::new(fleetwatch_certs::server_config(&server_files).unwrap());
    let mut listener = KlmListener::start(Some(tls)).await;
    let target_client = pki.subscriber("to-listener");
    let metrics_port = free_port();
    let relay_args = vec![
        "--target".into(),
        listener.url(),
        "--component".into(),
        "lifecycle-manager".into(),
        "--target-ca".into(),
        pki.path("ca.crt").display().to_string(),
        "--target-cert".into(),
        target_client.cert.display().to_string(),
        "--target-key".into(),
        target_client.key.display().to_string(),
        "--target-timeout".into(),
        "3".into(),
        "--metrics-listen".into(),
        format!("127.0.0.1:{metrics_port}"),
        "--dead-letter".into(),
        pki.path("dead-letter").display().to_string(),
    ];
    let relay = relay_proc(&pki, "klm", &hub.url(), "klm", &relay_args);

    // The agent's start is a resync of rt1 (it has no digests yet): the relay knows no
    // object of rt1 then, so the documented fallback, an event for the runtime's Kyma.
    let kyma = ("rt1".to_string(), "kyma-system".to_string(), "default".to_string(), "Kyma".to_string());
    let mut want = BTreeSet::from([kyma]);
    wait_requests(&listener, &want, &relay).await;
    assert_eq!(listener.received()[0].body["watchedGvk"]["group"], "operator.kyma-project.io");

    apply_json(&kc, &configmap("kyma-system", "a", "1"));
    want.insert(cm_request("a"));
    wait_requests(&listener, &want, &relay).await;

    // Relay restart (killed, not stopped): a change made meanwhile arrives after it.
    drop(relay);
    apply_json(&kc, &configmap("kyma-system", "b", "1"));
    let relay = relay_proc(&pki, "klm", &hub.url(), "klm", &relay_args);
    want.insert(cm_request("b"));
    wait_requests(&listener, &want, &relay).await;

    // Listener outage: the process gone (connection refused), then answering 503.
    listener.stop();
    apply_json(&kc, &configmap("kyma-system", "c", "1"));
    let retried = holds_within(WAIT, || relay.stderr().contains("sink refused a delivery")).await;
    assert!(retried, "{}", relay.stderr());
    listener.restart().await;
    listener.set_down(true);
    let saw_503 = holds_within(WAIT, || !listener.refused().is_empty()).await;
    assert!(saw_503, "{}", relay.stderr());
    listener.set_down(false);
    want.insert(cm_request("c"));
    wait_requests(&listener, &want, &relay).await;

    // A missing route (404, as an ingress answers before its route exists) is retried like
    // an outage, never skipped: the change arrives once the route is back.
    listener.set_status(Some(404));
    apply_json(&kc, &configmap("kyma-system", "d", "1"));
    let saw_404 = holds_within(WAIT, || listener.refused().iter().any(|(s, _)| *s == 404)).await;
    assert!(saw_404, "{}", relay.stderr());
    let retried_404 = holds_within(WAIT, || listener.refused().iter().filter(|(s, _)| *s == 404).count() >= 3).await;
    assert!(retried_404, "{:?}\n{}", listener.refused(), relay.stderr());
    // Meanwhile the relay is not ready, and says which target fails.
    let not_ready = holds_within(WAIT, || {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(http_get(metrics_port, "/readyz")))
            .contains("requests failed in a row")
    })
    .await;
    assert!(not_ready, "{}", http_get(metrics_port, "/readyz").await);
    listener.set_status(None);
    want.insert(cm_request("d"));
    wait_requests(&listener, &want, &relay).await;
    let ready = holds_within(WAIT, || {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(http_get(metrics_port, "/readyz")))
            .starts_with("ready")
    })
    .await;
    assert!(ready, "{}", http_get(metrics_port, "/readyz").await);

    // Refused for good (422): kept in the dead-letter file with the answer, then acknowledged
    // (the next change still arrives).
    listener.set_status(Some(422));
    apply_json(&kc, &configmap("kyma-system", "e", "1"));
    let dead_letter = pki.path("dead-letter").join("klm.jsonl");
    let kept = holds_within(WAIT, || std::fs::read_to_string(&dead_letter).is_ok_and(|t| t.contains("\"e\""))).await;
    assert!(kept, "{}", relay.stderr());
    let line = std::fs::read_to_string(&dead_letter).unwrap();
    assert!(line.contains("\"status\":422") && line.contains("answered as told"), "{line}");
    listener.set_status(None);
    apply_json(&kc, &configmap("kyma-system", "f", "1"));
    want.insert(cm_request("f"));
    wait_requests(&listener, &want, &relay).await;

    // A deletion is an event too.
    let before = listener.received().len();
    kubectl(&kc, &["delete", "configmap", "a", "-n", "kyma-system"], None);
    let deleted =
        holds_within(WAIT, || listener.received()[before..].iter().any(|r| r.body["watched"]["name"] == "a")).await;
    assert!(deleted, "{}", relay.stderr());

    assert_eq!(requests(&listener), want, "nothing else was sent");
    assert_contract(&listener);
    let metrics = http_get(metrics_port, "/metrics").await;
    let url = format!("{}/v2/lifecycle-manager/event", listener.url());
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(&format!("fleetwatch_relay_{name}_total{{relay=\"klm\",target=\"{url}\"}}")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no {name} for {url} in {metrics}"))
    };
    assert!(line("retries") >= 2, "{metrics}");
    assert!(line("delivered") >= 2, "delivered since the restart; {metrics}");
    assert_eq!(line("skipped_4xx"), 0, "{metrics}");
}

const KYMA_CRD: &str = r#"{"apiVersion":"apiextensions.k8s.io/v1","kind":"CustomResourceDefinition",
 "metadata":{"name":"kymas.operator.kyma-project.io"},
 "spec":{"group":"operator.kyma-project.io","scope":"Namespaced",
  "names":{"plural":"kymas","singular":"kyma","kind":"Kyma","listKind":"KymaList"},
  "versions":[{"name":"v1beta2","served":true,"storage":true,"subresources":{"status":{}},
   "schema":{"openAPIV3Schema":{"type":"object","x-kubernetes-preserve-unknown-fields":true}}}]}}"#;

fn watcher_crd() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/klm/watcher-crd.json")).unwrap()
}

fn kyma(name: &str, channel: &str, watched: bool) -> serde_json::Value {
    let labels = if watched { json!({"operator.kyma-project.io/watched-by": "lifecycle-manager"}) } else { json!({}) };
    json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Kyma",
        "metadata": {"name": name, "namespace": "kyma-system", "labels": labels}, "spec": {"channel": channel}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_klm_from_watchers_creates_watch_configs_and_routes_to_the_manager() {
    let pki = Pki::new();
    let (_cp, cp_kc) = sim_cluster(&pki, "kcp").await;
    let crd_yaml = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/watchconfigs.operator.fleetwatch.dev.yaml"),
    )
    .unwrap();
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&crd_yaml));
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&watcher_crd()));
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(KYMA_CRD));
    kubectl(&cp_kc, &["create", "namespace", "kcp-system"], None);
    let watcher = json!({"apiVersion": "operator.kyma-project.io/v1beta2", "kind": "Watcher",
        "metadata": {"name": "klm-watcher", "namespace": "kcp-system"},
        "spec": {"manager": "lifecycle-manager", "field": "spec",
            "labelsToWatch": {"operator.kyma-project.io/watched-by": "lifecycle-manager"},
            "resourceToWatch": {"group": "operator.kyma-project.io", "version": "v1beta2", "resource": "kymas"},
            "serviceInfo": {"name": "klm-event-service", "namespace": "kcp-system", "port": 8082},
            "gateway": {"selector": {"matchLabels": {"operator.kyma-project.io/watcher-gateway": "default"}}}}});
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&watcher.to_string()));

    let (_rt, kc) = sim_cluster(&pki, "rt1").await;
    kubectl(&kc, &["apply", "-f", "-"], Some(KYMA_CRD));
    kubectl(&kc, &["create", "namespace", "kyma-system"], None);
    let hub = HubProc::start(&pki, free_port(), None, &["--control-plane-kubeconfig", cp_kc.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &kc);
    let listener = KlmListener::start(None).await;
    let relay = relay_proc(
        &pki,
        "klm",
        &hub.url(),
        "klm",
        &["--from-watchers".into(), cp_kc.display().to_string(), "--target".into(), listener.url()],
    );

    // The Watcher became a WatchConfig in the control plane.
    let wc = kubectl(&cp_kc, &["get", "watchconfigs", "klm-kcp-system-klm-watcher", "-o", "json"], None);
    let wc: serde_json::Value = serde_json::from_str(&wc).unwrap();
    assert_eq!(
        wc["spec"]["resource"],
        json!({"group": "operator.kyma-project.io", "version": "v1beta2", "kind": "Kyma"})
    );
    assert_eq!(wc["spec"]["labelSelector"], "operator.kyma-project.io/watched-by=lifecycle-manager");
    assert_eq!(wc["spec"]["fields"], json!(["spec"]));
    let running = holds_within(WAIT, || {
        let v = futures_executor(hub.clusters());
        v["clusters"][0]["watches"].as_array().is_some_and(|w| w.iter().any(|s| s["phase"] == "running"))
    })
    .await;
    assert!(running, "{}", hub.clusters().await);

    apply_json(&kc, &kyma("unwatched", "regular", false));
    apply_json(&kc, &kyma("default", "regular", true));
    let want = (String::from("rt1"), String::from("kyma-system"), String::from("default"), String::from("Kyma"));
    let got = holds_within(WAIT, || {
        listener.received().iter().any(|r| r.runtime == "rt1" && r.body["watched"]["name"] == "default")
    })
    .await;
    assert!(got, "{:?}; relay:\n{}", listener.received(), relay.stderr());
    let r = listener.received();
    assert_eq!(r[0].component, "lifecycle-manager");
    assert_eq!(
        r[0].body,
        json!({"watched": {"namespace": "kyma-system", "name": "default"},
               "watchedGvk": {"group": "operator.kyma-project.io", "version": "v1beta2", "kind": "Kyma"}})
    );
    // A spec change is relayed; the unlabelled Kyma never is.
    apply_json(&kc, &kyma("default", "fast", true));
    let twice = holds_within(WAIT, || listener.received().len() >= 2).await;
    assert!(twice, "{:?}", listener.received());
    assert!(requests(&listener).iter().all(|r| *r == want), "{:?}", requests(&listener));

    // Deleting the Watcher deletes its WatchConfig.
    kubectl(&cp_kc, &["delete", "watcher", "klm-watcher", "-n", "kcp-system"], None);
    let gone = holds_within(WAIT, || {
        let out = kubectl(&cp_kc, &["get", "watchconfigs", "-o", "name"], None);
        !out.contains("klm-kcp-system-klm-watcher")
    })
    .await;
    assert!(gone, "{}", relay.stderr());
}

/// The strict CloudEvents receiver (`cloudevents_receiver.py`), a process of its own: every
/// request is parsed with the official CloudEvents SDK for Python and each attribute checked
/// against the CloudEvents type system; 503 to the first request, 401 to a bad signature.
struct CloudEventsReceiver {
    child: std::process::Child,
    url: String,
    out: PathBuf,
    invalid: PathBuf,
}

impl Drop for CloudEventsReceiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl CloudEventsReceiver {
    fn start(pki: &Pki, secret_file: &Path) -> Self {
        use std::io::BufRead;
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        // The SDK in a venv of its own (scripts/test.sh makes it first; this reuses it).
        let setup = std::process::Command::new("bash")
            .arg(root.join("scripts/cloudevents-python.sh"))
            .stderr(std::process::Stdio::inherit())
            .output()
            .expect("bash");
        assert!(setup.status.success(), "cannot set up the CloudEvents SDK for Python (scripts/cloudevents-python.sh)");
        let python = String::from_utf8(setup.stdout).unwrap().trim().to_string();
        let (out, invalid) = (pki.path("cloudevents.jsonl"), pki.path("cloudevents-invalid.jsonl"));
        let mut child = std::process::Command::new(&python)
            .arg(root.join("tests/e2e/cloudevents_receiver.py"))
            .args(["--secret-file", secret_file.to_str().unwrap(), "--out", out.to_str().unwrap()])
            .args(["--invalid", invalid.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::fs::File::create(pki.path("cloudevents-receiver.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {python}: {e}"));
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
        let url =
            line.trim().strip_prefix("listening on ").unwrap_or_else(|| panic!("receiver said {line:?}")).to_string();
        Self { child, url, out, invalid }
    }

    /// The events it accepted, as the SDK parsed them.
    fn events(&self) -> Vec<serde_json::Value> {
        let text = std::fs::read_to_string(&self.out).unwrap_or_default();
        text.lines().map(|l| serde_json::from_str(l).unwrap()).collect()
    }

    /// Fails the test on any event it refused.
    fn assert_all_valid(&self) {
        let refused = std::fs::read_to_string(&self.invalid).unwrap_or_default();
        assert!(refused.is_empty(), "the CloudEvents SDK receiver refused events:\n{refused}");
    }
}

/// Blocks on a future from a sync closure (for `holds_within`).
fn futures_executor<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relay_webhook_posts_signed_cloud_events_at_least_once() {
    let pki = Pki::new();
    let (_sim, kc) = sim_cluster(&pki, "rt1").await;
    kubectl(&kc, &["create", "namespace", "apps"], None);
    let wc_dir = pki.path("watch-configs");
    write_watch_config(&wc_dir, "cms", "", "v1", "ConfigMap", json!({"namespace": "apps", "fields": ["data"]}));
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc_dir.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &kc);
    let secret: PathBuf = pki.path("hmac.secret");
    std::fs::write(&secret, "hook-secret\n").unwrap();
    let receiver = CloudEventsReceiver::start(&pki, &secret);
    let relay_args = |extra: &[&str]| -> Vec<String> {
        let mut a: Vec<String> = vec![
            "--target".into(),
            receiver.url.clone(),
            "--hmac-secret-file".into(),
            secret.display().to_string(),
            "--type".into(),
            "dev.fleetwatch.object".into(),
        ];
        a.extend(extra.iter().map(|s| s.to_string()));
        a
    };
    // One relay posting batches, one posting single events (structured mode both).
    let batched = relay_proc(&pki, "webhook", &hub.url(), "hook", &relay_args(&["--batch", "10"]));
    let single = relay_proc(&pki, "webhook", &hub.url(), "hook1", &relay_args(&[]));
    for n in ["a", "b", "c"] {
        apply_json(&kc, &configmap("apps", n, "1"));
    }
    // Each relay delivers each change at least once: every subject at least twice.
    let counts = || -> std::collections::BTreeMap<String, usize> {
        let mut m = std::collections::BTreeMap::new();
        for e in receiver.events() {
            if let Some(s) = e["subject"].as_str() {
                *m.entry(s.to_string()).or_default() += 1;
            }
        }
        m
    };
    let want: Vec<String> = ["a", "b", "c"].iter().map(|n| format!("v1/ConfigMap/apps/{n}")).collect();
    let ok = holds_within(WAIT, || {
        receiver.assert_all_valid();
        let c = counts();
        want.iter().all(|w| c.get(w).is_some_and(|n| *n >= 2))
    })
    .await;
    assert!(ok, "{:?}; relays:\n{}\n{}", counts(), batched.stderr(), single.stderr());
    receiver.assert_all_valid();
    let stderrs = batched.stderr() + &single.stderr();
    assert!(stderrs.contains("sink refused a delivery"), "the first 503 was retried: {stderrs}");
    let got = receiver.events();
    for e in &got {
        if e["cluster"] == "*" {
            // A hub without a data directory cannot tell a relay's first subscription from
            // one it forgot in a restart: each relay's durable name gets one `*` first.
            assert_eq!(
                (e["type"].as_str(), e["source"].as_str()),
                (Some("dev.fleetwatch.resync.required"), Some("/fleetwatch")),
                "{e}"
            );
            assert!(e["data"]["reason"].as_str().is_some_and(|r| r.contains("in memory only")), "{e}");
            continue;
        }
        assert_eq!((e["specversion"].as_str(), e["source"].as_str()), (Some("1.0"), Some("/clusters/rt1")), "{e}");
        assert_eq!(e["cluster"], "rt1");
        assert!(e["type"] == "dev.fleetwatch.object.applied" || e["type"] == "dev.fleetwatch.resync.required", "{e}");
        // 64-bit numbers travel as decimal strings (CloudEvents' Integer is 32-bit).
        assert!(e["cursor"].as_str().is_some_and(|c| c.parse::<u64>().is_ok()), "{e}");
        if e["type"] == "dev.fleetwatch.object.applied" {
            assert!(
                e["epoch"].as_str().is_some_and(|c| c.parse::<u64>().is_ok_and(|n| n > u64::from(u32::MAX))),
                "{e}"
            );
            assert!(e["seq"].as_str().is_some_and(|c| c.parse::<u64>().is_ok()), "{e}");
        }
    }
    // The agent's start is a resync of rt1: relayed as a CloudEvent too, whatever --type
    // says (the inventory event was filtered).
    assert!(got.iter().any(|e| e["type"] == "dev.fleetwatch.resync.required" && e["subject"] == "rt1"), "{got:?}");
}
