//! What the real kubectl prints from a SimCluster's answers: server-side Table columns,
//! `get -w` rows, events through both Event APIs, `describe` — checked against what
//! kubectl shows for a real cluster.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{CM, CRD, Env, KUBECTL};
use fleetwatch_sim::SimOptions;

/// `kubectl get` renders the server's Table: built-in columns, a CRD's
/// additionalPrinterColumns, and priority > 0 columns only with `-o wide`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_prints_server_side_columns() {
    let env = Env::start(SimOptions::default()).await;
    let crd = CRD.replace(
        "    subresources: {status: {}}",
        r#"    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas, labelSelectorPath: .status.selector}
    additionalPrinterColumns:
    - {name: Size, type: integer, jsonPath: .spec.replicas}
    - {name: Color, type: string, jsonPath: .spec.color, description: the color}
    - {name: Ready, type: string, jsonPath: '.status.conditions[?(@.type=="Ready")].status'}
    - {name: Owner, type: string, jsonPath: .spec.owner, priority: 1}"#,
    );
    env.apply(&crd, &[]);
    env.apply(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {replicas: 2, color: blue, owner: ops}\n",
        &[],
    );
    let out = env.ok(&["get", "widgets"]);
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "COLOR", "READY"], "{out}");
    assert_eq!(lines[1], ["w1", "2", "blue"], "a missing value is an empty cell: {out}");
    let status =
        r#"{"status": {"conditions": [{"type": "Synced", "status": "False"}, {"type": "Ready", "status": "True"}]}}"#;
    env.ok(&["patch", "widget", "w1", "--subresource=status", "--type=merge", "-p", status]);
    let wide = env.ok(&["get", "widgets", "-o", "wide"]);
    let lines: Vec<Vec<&str>> = wide.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(lines[0], ["NAME", "SIZE", "COLOR", "READY", "OWNER"], "{wide}");
    assert_eq!(lines[1], ["w1", "2", "blue", "True", "ops"], "{wide}");

    env.ok(&["create", "deployment", "web", "--image=nginx:1.27", "--replicas=3"]);
    let out = env.ok(&["get", "deployments", "-o", "wide"]);
    let lines: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(
        lines[0],
        ["NAME", "READY", "UP-TO-DATE", "AVAILABLE", "AGE", "CONTAINERS", "IMAGES", "SELECTOR"],
        "{out}"
    );
    assert_eq!(
        [lines[1][0], lines[1][1], lines[1][5], lines[1][6], lines[1][7]],
        ["web", "0/3", "nginx", "nginx:1.27", "app=web"]
    );
    let out = env.ok(&["get", "namespaces", "default"]);
    assert!(out.lines().next().is_some_and(|h| h.split_whitespace().eq(["NAME", "STATUS", "AGE"])), "{out}");
    assert!(out.contains("Active"), "{out}");
    // --show-labels needs the row's object metadata (includeObject=Metadata by default).
    let out = env.ok(&["get", "deployments", "--show-labels"]);
    assert!(out.contains("app=web"), "{out}");
}

/// `kubectl scale` (a merge patch on `/scale`) for a Deployment and a custom resource
/// with `subresources.scale`, and `kubectl get all` through the `all` category.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_and_get_all() {
    let env = Env::start(SimOptions::default()).await;
    env.ok(&["create", "deployment", "web", "--image=nginx"]);
    assert_eq!(env.ok(&["scale", "deployment", "web", "--replicas=4"]).trim(), "deployment.apps/web scaled");
    let d = env.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["replicas"], 4);
    assert_eq!(d["metadata"]["generation"], 2, "scaling changes the spec");
    // --current-replicas is a precondition.
    let err = env.fails(&["scale", "deployment", "web", "--current-replicas=1", "--replicas=2"]);
    assert!(err.contains("Expected replicas to be 1, was 4"), "{err}");

    let crd = CRD.replace(
        "    subresources: {status: {}}",
        "    subresources:\n      status: {}\n      scale: {specReplicasPath: .spec.size, statusReplicasPath: .status.size}",
    );
    env.apply(&crd, &[]);
    env.apply("apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1}\nspec: {size: 1}\n", &[]);
    assert_eq!(env.ok(&["scale", "widget", "w1", "--replicas=5"]).trim(), "widget.example.com/w1 scaled");
    assert_eq!(env.get_json(&["widget", "w1"])["spec"]["size"], 5);
    let err = env.fails(&["scale", "configmap", "x", "--replicas=1"]);
    assert!(err.contains("could not find") || err.contains("not found") || err.contains("scale"), "{err}");

    env.ok(&["create", "service", "clusterip", "web", "--tcp=80"]);
    env.ok(&["create", "configmap", "not-in-all"]);
    let all = env.ok(&["get", "all"]);
    assert!(all.contains("deployment.apps/web"), "{all}");
    assert!(all.contains("service/web"), "{all}");
    assert!(!all.contains("configmap"), "{all}");
}

/// `kubectl get events` prints an event created through events.k8s.io/v1 with the
/// core columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_events_shows_events_k8s_io_events() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(
        r#"
apiVersion: events.k8s.io/v1
kind: Event
metadata: {name: hub-started}
eventTime: "2026-01-01T00:00:00.000000Z"
reportingController: fleetwatch.io/hub
reportingInstance: hub-0
action: Start
reason: Started
type: Normal
note: hub is up
regarding: {kind: StatefulSet, name: hub, namespace: default, apiVersion: apps/v1}
"#,
        &[],
    );
    let out = env.ok(&["get", "events"]);
    let mut lines = out.lines();
    let header: Vec<&str> = lines.next().unwrap_or("").split_whitespace().collect();
    assert_eq!(header, ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"], "{out}");
    let row = lines.next().unwrap_or("");
    for cell in ["Normal", "Started", "statefulset/hub", "hub is up"] {
        assert!(row.contains(cell), "{cell} missing: {out}");
    }
    let wide = env.ok(&["get", "events", "-o", "wide"]);
    assert!(wide.contains("fleetwatch.io/hub, hub-0"), "source column: {wide}");
}

/// `kubectl get -w` without `-o` asks for Tables on the watch too: each event is printed
/// with the server's columns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_prints_table_rows() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(CM, &[]);
    let mut child = Command::new(KUBECTL)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--cache-dir")
        .arg(env.dir.join("cache"))
        .args(["get", "configmaps", "-w", "--output-watch-events"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("kubectl -w");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let next = || -> Vec<String> {
        rx.recv_timeout(Duration::from_secs(10)).expect("watch line").split_whitespace().map(str::to_string).collect()
    };
    assert_eq!(next()[..3], ["EVENT", "NAME", "DATA"]);
    assert_eq!(next()[..3], ["ADDED", "demo", "1"]);
    env.ok(&["create", "configmap", "two", "--from-literal=x=1", "--from-literal=y=2"]);
    assert_eq!(next()[..3], ["ADDED", "two", "2"]);
    env.ok(&["delete", "configmap", "two"]);
    assert_eq!(next()[..3], ["DELETED", "two", "2"]);
    let _ = child.kill();
    let _ = child.wait();
}

/// An events.k8s.io/v1 Event about a Widget, as a controller's recorder writes it.
fn widget_event(
    name: &str,
    regarding: &str,
    uid: &str,
    reason: &str,
    type_: &str,
    note: &str,
    count: Option<u32>,
) -> String {
    let series = count.map_or(String::new(), |c| {
        format!("series: {{count: {c}, lastObservedTime: \"2026-01-01T00:05:00.000000Z\"}}\n")
    });
    format!(
        r#"apiVersion: events.k8s.io/v1
kind: Event
metadata: {{name: {name}, namespace: default}}
eventTime: "2026-01-01T00:00:00.000000Z"
reportingController: fleetwatch-lifecycle
reportingInstance: lifecycle-0
action: Install
reason: {reason}
type: {type_}
note: "{note}"
regarding: {{kind: Widget, name: {regarding}, namespace: default, apiVersion: example.com/v1, uid: "{uid}"}}
{series}"#
    )
}

/// `kubectl describe` (its Events section) and `kubectl events --for` find the Events of
/// an object written through events.k8s.io/v1: they list core v1 events with field
/// selectors on `involvedObject.*`, as kube-apiserver serves them (issue 27: "Events:
/// <none>" and "field label not supported").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn describe_and_kubectl_events_find_an_objects_events() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(CRD, &[]);
    env.apply(
        "apiVersion: example.com/v1\nkind: Widget\nmetadata: {name: w1, namespace: default}\nspec: {size: 1}\n",
        &[],
    );
    let uid = env.get_json(&["widget", "w1"])["metadata"]["uid"].as_str().expect("uid").to_string();
    for ev in [
        widget_event("w1.a", "w1", &uid, "Installed", "Normal", "installed redis 1.0.0", Some(3)),
        widget_event("w1.b", "w1", &uid, "Failed", "Warning", "nats 1.0.0: boom", None),
        // Another object, and an earlier object of the same name (another uid).
        widget_event("w2.a", "w2", "u-other", "Installed", "Normal", "installed for w2", None),
        widget_event("w1.old", "w1", "u-old", "Installed", "Normal", "installed for the old w1", None),
    ] {
        env.apply(&ev, &[]);
    }

    let described = env.ok(&["describe", "widget", "w1"]);
    let events = described.split("Events:").nth(1).unwrap_or_else(|| panic!("no Events section: {described}"));
    assert!(!events.contains("<none>"), "{described}");
    assert!(events.contains("installed redis 1.0.0") && events.contains("(x3 over"), "{described}");
    assert!(events.contains("nats 1.0.0: boom") && events.contains("Warning"), "{described}");
    assert!(events.contains("fleetwatch-lifecycle"), "the source column: {described}");
    assert!(!events.contains("w2") && !events.contains("old w1"), "other objects' events: {described}");

    let listed = env.ok(&["events", "--for", "widget/w1"]);
    assert!(listed.contains("installed redis 1.0.0") && listed.contains("nats 1.0.0: boom"), "{listed}");
    assert!(!listed.contains("installed for w2"), "{listed}");
    let warnings = env.ok(&["events", "--for", "widget/w1", "--types", "Warning"]);
    assert!(warnings.contains("boom") && !warnings.contains("installed redis"), "{warnings}");

    // The field selectors of both APIs, as kube-apiserver names them.
    let names = |args: &[&str]| -> Vec<String> {
        let mut n: Vec<String> = env.get_json(args)["items"]
            .as_array()
            .expect("items")
            .iter()
            .filter_map(|e| e["metadata"]["name"].as_str().map(str::to_string))
            .collect();
        n.sort();
        n
    };
    let sel = format!("involvedObject.name=w1,involvedObject.uid={uid}");
    assert_eq!(names(&["events.v1.", "--field-selector", &sel]), ["w1.a", "w1.b"]);
    assert_eq!(names(&["events.v1.", "--field-selector", "type=Warning"]), ["w1.b"]);
    assert_eq!(
        names(&["events.v1.", "--field-selector", "involvedObject.kind=Widget,reason!=Failed,involvedObject.name=w1"]),
        ["w1.a", "w1.old"]
    );
    assert_eq!(names(&["events.events.k8s.io", "--field-selector", "regarding.name=w2"]), ["w2.a"]);
    assert_eq!(
        names(&["events.events.k8s.io", "--field-selector", "reportingController=fleetwatch-lifecycle,reason=Failed"]),
        ["w1.b"]
    );
    // Each API takes its own field names only.
    let err = env.fails(&["get", "events.v1.", "--field-selector", "regarding.name=w1"]);
    assert!(err.contains("field label not supported: regarding.name"), "{err}");
    let err = env.fails(&["get", "events.events.k8s.io", "--field-selector", "involvedObject.name=w1"]);
    assert!(err.contains("field label not supported: involvedObject.name"), "{err}");
}
