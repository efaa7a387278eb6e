//! Scenarios driven by the real kubectl binary against a SimCluster, checked against what
//! Kubernetes documents for each command.

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{CM, CRD, Env, KUBECTL};
use fleetwatch_sim::SimOptions;
use serde_json::Value;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_side_apply_create_configure_unchanged() {
    let env = Env::start(SimOptions::default()).await;
    assert_eq!(env.apply(CM, &[]).trim(), "configmap/demo created");
    assert_eq!(env.apply(CM, &[]).trim(), "configmap/demo unchanged");
    let first = env.get_json(&["configmap", "demo"]);
    assert_eq!(env.apply(&CM.replace("\"1\"", "\"2\""), &[]).trim(), "configmap/demo configured");
    let cm = env.get_json(&["configmap", "demo"]);
    assert_eq!(cm["data"]["a"], "2");
    assert_eq!(cm["metadata"]["namespace"], "default");
    assert_eq!(cm["metadata"]["uid"], first["metadata"]["uid"], "uid is stable across updates");
    assert_eq!(cm["metadata"]["uid"].as_str().map(str::len), Some(36));
    assert!(cm["metadata"]["creationTimestamp"].as_str().is_some_and(|t| t.ends_with('Z')));
    let rv =
        |v: &Value| v["metadata"]["resourceVersion"].as_str().and_then(|s| s.parse::<u64>().ok()).expect("numeric rv");
    assert!(rv(&cm) > rv(&first), "resourceVersion grows on update");
    let last = cm["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"]
        .as_str()
        .expect("last-applied");
    assert!(last.contains("\"a\":\"2\""));
    // Dropping a key from the manifest removes it (three-way merge through strategic merge patch).
    env.apply(&CM.replace("labels: {app: web}", ""), &[]);
    let cm = env.get_json(&["configmap", "demo"]);
    assert!(cm["metadata"]["labels"].get("app").is_none(), "{cm}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_owns_fields_and_reports_conflicts() {
    let env = Env::start(SimOptions::default()).await;
    let two = CM.replace("a: \"1\"", "a: \"1\"\n  b: \"x\"");
    assert!(env.apply(&two, &["--server-side"]).contains("serverside-applied"));
    let cm = env.get_json(&["configmap", "demo", "--show-managed-fields"]);
    let mf = &cm["metadata"]["managedFields"][0];
    assert_eq!(mf["manager"], "kubectl");
    assert_eq!(mf["operation"], "Apply");
    assert_eq!(mf["fieldsType"], "FieldsV1");
    assert!(mf["fieldsV1"]["f:data"]["f:a"].is_object(), "{mf}");
    // Another manager applying a different value conflicts...
    let other = CM.replace("\"1\"", "\"9\"");
    let out = env.kubectl_stdin(&["apply", "--server-side", "--field-manager", "other", "-f", "-"], Some(&other));
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("conflict") && err.contains(".data.a"), "{err}");
    // ...unless forced, which moves ownership of .data.a.
    env.apply(&other, &["--server-side", "--field-manager", "other", "--force-conflicts"]);
    let cm = env.get_json(&["configmap", "demo", "--show-managed-fields"]);
    assert_eq!(cm["data"]["a"], "9");
    let managers: Vec<&str> =
        cm["metadata"]["managedFields"].as_array().unwrap().iter().filter_map(|m| m["manager"].as_str()).collect();
    assert!(managers.contains(&"other") && managers.contains(&"kubectl"), "{managers:?}");
    // kubectl stops applying .data.b: it is removed, as nobody else owns it.
    env.apply(&CM.replace("a: \"1\"", "a: \"9\""), &["--server-side"]);
    let cm = env.get_json(&["configmap", "demo"]);
    assert!(cm["data"].get("b").is_none(), "{cm}");
    assert_eq!(cm["data"]["a"], "9");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn patch_merge_and_json() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(CM, &[]);
    env.ok(&["patch", "configmap", "demo", "--type", "merge", "-p", r#"{"data":{"b":"2","a":null}}"#]);
    let cm = env.get_json(&["configmap", "demo"]);
    assert_eq!(cm["data"], serde_json::json!({"b": "2"}));
    env.ok(&[
        "patch",
        "configmap",
        "demo",
        "--type",
        "json",
        "-p",
        r#"[{"op":"add","path":"/data/c","value":"3"},{"op":"remove","path":"/data/b"}]"#,
    ]);
    let cm = env.get_json(&["configmap", "demo"]);
    assert_eq!(cm["data"], serde_json::json!({"c": "3"}));
    let err = env.fails(&[
        "patch",
        "configmap",
        "demo",
        "--type",
        "json",
        "-p",
        r#"[{"op":"test","path":"/data/c","value":"nope"}]"#,
    ]);
    assert!(err.contains("Invalid") || err.contains("invalid") || err.contains("rejected"), "{err}");
    let err = env.fails(&["patch", "configmap", "missing", "--type", "merge", "-p", "{}"]);
    assert!(err.contains("NotFound") && err.contains("configmaps \"missing\" not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_waits_for_finalizer() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(&CM.replace("labels: {app: web}", "finalizers: [example.com/hold]"), &[]);
    env.ok(&["delete", "configmap", "demo", "--wait=false"]);
    let cm = env.get_json(&["configmap", "demo"]);
    assert!(cm["metadata"]["deletionTimestamp"].is_string(), "still there, being deleted: {cm}");
    env.ok(&[
        "patch",
        "configmap",
        "demo",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    let err = env.fails(&["get", "configmap", "demo"]);
    assert!(err.contains("Error from server (NotFound): configmaps \"demo\" not found"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_field_selectors() {
    let env = Env::start(SimOptions::default()).await;
    let mk = |name: &str, labels: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  labels: {{{labels}}}\n")
    };
    let all = [mk("a", "app: web, tier: front"), mk("b", "app: db"), mk("c", "app: cache, tier: back")].join("---\n");
    env.apply(&all, &[]);
    let names = |sel: &[&str]| {
        let mut a = vec!["get", "configmaps", "-o", "name"];
        a.extend_from_slice(sel);
        let mut v: Vec<String> = env.ok(&a).lines().map(|l| l.trim_start_matches("configmap/").to_string()).collect();
        v.sort();
        v
    };
    assert_eq!(names(&["-l", "app=web"]), ["a"]);
    assert_eq!(names(&["-l", "app!=web"]), ["b", "c"]);
    assert_eq!(names(&["-l", "app in (db,cache)"]), ["b", "c"]);
    assert_eq!(names(&["-l", "app notin (db,cache)"]), ["a"]);
    assert_eq!(names(&["-l", "tier"]), ["a", "c"]);
    assert_eq!(names(&["-l", "!tier"]), ["b"]);
    assert_eq!(names(&["--field-selector", "metadata.name=b"]), ["b"]);
    assert_eq!(names(&["-A", "--field-selector", "metadata.namespace=default", "-l", "app=db"]), ["b"]);
    let err = env.fails(&["get", "configmaps", "--field-selector", "spec.foo=bar"]);
    assert!(err.contains("field label not supported"), "{err}");
    // Paged lists: kubectl follows continue tokens.
    assert_eq!(names(&["--chunk-size", "1"]), ["a", "b", "c"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_then_custom_resource() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(CRD, &[]);
    let crd = env.get_json(&["crd", "widgets.example.com"]);
    let established = crd["status"]["conditions"]
        .as_array()
        .unwrap()
        .iter()
        .any(|c| c["type"] == "Established" && c["status"] == "True");
    assert!(established, "{crd}");
    let widget = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w1\nspec:\n  size: 1\n";
    assert_eq!(env.apply(widget, &[]).trim(), "widget.example.com/w1 created");
    let w = env.get_json(&["wd", "w1"]);
    assert_eq!(w["spec"]["size"], 1);
    assert_eq!(w["metadata"]["generation"], 1);
    env.apply(&widget.replace("size: 1", "size: 2"), &[]);
    assert_eq!(env.get_json(&["widgets", "w1"])["metadata"]["generation"], 2);
    env.ok(&["label", "widget", "w1", "x=y"]);
    assert_eq!(env.get_json(&["widgets", "w1"])["metadata"]["generation"], 2, "metadata changes keep generation");
    // The status subresource: status written through it, ignored on the main resource.
    env.ok(&[
        "patch",
        "widget",
        "w1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ]);
    assert_eq!(env.get_json(&["widgets", "w1"])["status"]["ready"], true);
    env.ok(&["patch", "widget", "w1", "--type", "merge", "-p", r#"{"status":{"ready":false}}"#]);
    assert_eq!(env.get_json(&["widgets", "w1"])["status"]["ready"], true);
    env.ok(&["delete", "crd", "widgets.example.com"]);
    // api-resources re-reads discovery: the group is gone, and so is the resource type.
    assert_eq!(env.ok(&["api-resources", "--api-group", "example.com", "-o", "name"]).trim(), "");
    let err = env.fails(&["get", "widgets"]);
    assert!(err.contains("the server doesn't have a resource type \"widgets\""), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn get_watch_streams_events() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(CM, &[]);
    let mut child = Command::new(KUBECTL)
        .arg("--kubeconfig")
        .arg(&env.kubeconfig)
        .arg("--cache-dir")
        .arg(env.dir.join("cache"))
        .args([
            "get",
            "configmaps",
            "-w",
            "--output-watch-events",
            "-o",
            "jsonpath={.type} {.object.metadata.name} {.object.data.a}{\"\\n\"}",
        ])
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
    let next = || rx.recv_timeout(Duration::from_secs(10)).expect("watch line");
    assert_eq!(next(), "ADDED demo 1");
    env.apply(&CM.replace("\"1\"", "\"2\""), &[]);
    assert_eq!(next(), "MODIFIED demo 2");
    env.ok(&["delete", "configmap", "demo"]);
    assert_eq!(next(), "DELETED demo 2");
    let _ = child.kill();
    let _ = child.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_are_kubernetes_statuses() {
    let env = Env::start(SimOptions::default()).await;
    let cm = |name: &str, ns: &str| {
        format!("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: {name}\n  namespace: {ns}\n")
    };
    let out = env.kubectl_stdin(&["apply", "-f", "-"], Some(&cm("x", "nowhere")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("namespaces \"nowhere\" not found"), "{err}");
    env.apply(&cm("x", "default"), &[]);
    let out = env.kubectl_stdin(&["create", "-f", "-"], Some(&cm("x", "default")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("Error from server (AlreadyExists)") && err.contains("configmaps \"x\" already exists"),
        "{err}"
    );
    let out = env.kubectl_stdin(&["create", "-f", "-"], Some(&cm("Bad_Name", "default")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("Invalid"), "{err}");
    // Deployment generation moves with spec only.
    let dep = "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\nspec:\n  replicas: 1\n  selector: {matchLabels: {app: web}}\n  template:\n    metadata: {labels: {app: web}}\n    spec:\n      containers: [{name: c, image: nginx:1}]\n";
    env.apply(dep, &[]);
    env.ok(&["patch", "deployment", "web", "-p", r#"{"spec":{"replicas":3}}"#]);
    env.ok(&["annotate", "deployment", "web", "note=x"]);
    let d = env.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["replicas"], 3);
    assert_eq!(d["metadata"]["generation"], 2);
    env.apply(&dep.replace("nginx:1", "nginx:2").replace("replicas: 1", "replicas: 3"), &[]);
    let d = env.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["template"]["spec"]["containers"][0]["image"], "nginx:2");
    assert_eq!(d["metadata"]["generation"], 3);
    // Deleting a namespace removes what is in it.
    env.apply("apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n", &[]);
    env.apply(&cm("cm-y", "team"), &[]);
    env.ok(&["delete", "namespace", "team", "--timeout=20s"]);
    let err = env.fails(&["get", "namespace", "team"]);
    assert!(err.contains("NotFound"), "{err}");
    let err = env.fails(&["get", "configmap", "cm-y", "-n", "team"]);
    assert!(err.contains("NotFound"), "{err}");
}

/// The kinds a deployment of fleetwatch consists of.
const DEPLOYMENT_KINDS: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: fw}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRole
metadata: {name: fw-read}
rules: [{apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: ClusterRoleBinding
metadata: {name: fw-read}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: fw-read}
subjects: [{kind: ServiceAccount, name: fw, namespace: default}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: fw-leases}
rules: [{apiGroups: [coordination.k8s.io], resources: [leases], verbs: ["*"]}]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: fw-leases}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: fw-leases}
subjects: [{kind: ServiceAccount, name: fw}]
---
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: hub}
spec:
  serviceName: hub
  selector: {matchLabels: {app: hub}}
  template:
    metadata: {labels: {app: hub}}
    spec: {containers: [{name: hub, image: fleetwatch:1}]}
---
apiVersion: apps/v1
kind: DaemonSet
metadata: {name: agent}
spec:
  selector: {matchLabels: {app: agent}}
  template:
    metadata: {labels: {app: agent}}
    spec: {containers: [{name: agent, image: fleetwatch:1}]}
---
apiVersion: policy/v1
kind: PodDisruptionBudget
metadata: {name: hub}
spec: {minAvailable: 1, selector: {matchLabels: {app: hub}}}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: hub}
spec: {podSelector: {matchLabels: {app: hub}}, policyTypes: [Ingress]}
---
apiVersion: coordination.k8s.io/v1
kind: Lease
metadata: {name: fw-leader}
spec: {holderIdentity: hub-0}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deployment_kinds_apply_and_read_back() {
    let env = Env::start(SimOptions::default()).await;
    let out = env.apply(DEPLOYMENT_KINDS, &[]);
    for line in [
        "serviceaccount/fw created",
        "clusterrole.rbac.authorization.k8s.io/fw-read created",
        "clusterrolebinding.rbac.authorization.k8s.io/fw-read created",
        "role.rbac.authorization.k8s.io/fw-leases created",
        "rolebinding.rbac.authorization.k8s.io/fw-leases created",
        "statefulset.apps/hub created",
        "daemonset.apps/agent created",
        "poddisruptionbudget.policy/hub created",
        "networkpolicy.networking.k8s.io/hub created",
        "lease.coordination.k8s.io/fw-leader created",
    ] {
        assert!(out.contains(line), "{line} missing from {out}");
    }
    let again = env.apply(DEPLOYMENT_KINDS, &[]);
    // kubectl always resends a PodDisruptionBudget's selector (patchStrategy=replace), so
    // only that one reports "configured" on a second apply, as against kube-apiserver.
    assert_eq!(
        again.lines().filter(|l| l.ends_with("unchanged") && !l.contains("poddisruptionbudget")).count(),
        9,
        "{again}"
    );
    let sts = env.get_json(&["statefulset", "hub"]);
    assert_eq!(sts["spec"]["replicas"], 1, "defaulted like kube-apiserver");
    assert_eq!(sts["metadata"]["generation"], 1);
    let crb = env.get_json(&["clusterrolebinding", "fw-read"]);
    assert!(crb["metadata"]["namespace"].is_null(), "cluster-scoped: {crb}");
    assert_eq!(crb["subjects"][0]["name"], "fw");
    assert_eq!(env.get_json(&["pdb", "hub"])["spec"]["minAvailable"], 1);
    assert_eq!(env.get_json(&["netpol", "hub"])["spec"]["policyTypes"][0], "Ingress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_are_one_object_through_both_apis() {
    let env = Env::start(SimOptions::default()).await;
    let ev = r#"
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
"#;
    assert!(env.apply(ev, &[]).contains("event.events.k8s.io/hub-started created"));
    // The core v1 view of the same object carries the old field names.
    let core = env.get_json(&["events.v1.", "hub-started"]);
    assert_eq!(core["apiVersion"], "v1");
    assert_eq!(core["message"], "hub is up");
    assert_eq!(core["involvedObject"]["name"], "hub");
    assert_eq!(core["reportingComponent"], "fleetwatch.io/hub");
    assert!(core["note"].is_null());
    // `kubectl get events` lists it.
    let names: Vec<String> = env.get_json(&["events.v1."])["items"]
        .as_array()
        .expect("items")
        .iter()
        .filter_map(|e| e["metadata"]["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(names, ["hub-started"]);
    // A change through the core API is seen through events.k8s.io/v1.
    env.ok(&["annotate", "events.v1.", "hub-started", "seen=yes"]);
    let new = env.get_json(&["events.v1.events.k8s.io", "hub-started"]);
    assert_eq!(new["metadata"]["annotations"]["seen"], "yes");
    assert_eq!(new["note"], "hub is up");
    assert!(new["message"].is_null(), "{new}");
}

fn runtime(spec: &str) -> String {
    format!("apiVersion: fleetwatch.io/v1\nkind: Runtime\nmetadata: {{name: rt1}}\nspec: {spec}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crd_schema_validates_prunes_and_defaults() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(common::RUNTIME_CRD, &[]);
    let apply_fails = |manifest: &str, extra: &[&str]| {
        let mut args = vec!["apply", "-f", "-"];
        args.extend_from_slice(extra);
        let out = env.kubectl_stdin(&args, Some(manifest));
        assert!(!out.status.success(), "apply of {manifest} unexpectedly succeeded");
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    // kube-apiserver's field errors, one per bad field, as kubectl prints the causes.
    let err = apply_fails(&runtime("{name: alpha, mode: c}"), &[]);
    assert!(err.contains(r#"The Runtime "rt1" is invalid"#), "{err}");
    assert!(err.contains(r#"spec.mode: Unsupported value: "c": supported values: "a", "b""#), "{err}");
    let err = apply_fails(&runtime("{replicas: two}"), &[]);
    assert!(
        err.contains(
            r#"spec.replicas: Invalid value: "string": spec.replicas in body must be of type integer: "string""#
        ),
        "{err}"
    );
    assert!(err.contains("spec.name: Required value"), "{err}");
    // kubectl asks for strict field validation by default: unknown fields are an error...
    let bogus = runtime("{name: alpha, bogus: 1}") + "extra: 2\n";
    let err = apply_fails(&bogus, &[]);
    assert!(
        err.contains(r#"Runtime in version "v1" cannot be handled as a Runtime: strict decoding error: unknown field "extra", unknown field "spec.bogus""#),
        "{err}"
    );
    // ...with --validate=warn they are pruned and reported as warnings; defaults are applied.
    let out = env.kubectl_stdin(&["apply", "--validate=warn", "-f", "-"], Some(&bogus));
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let warnings = String::from_utf8_lossy(&out.stderr);
    assert!(warnings.contains(r#"Warning: unknown field "spec.bogus""#), "{warnings}");
    let rt = env.get_json(&["runtime", "rt1"]);
    assert!(rt.get("extra").is_none() && rt["spec"].get("bogus").is_none(), "pruned: {rt}");
    assert_eq!(rt["spec"], serde_json::json!({"name": "alpha", "mode": "a", "replicas": 1}), "defaulted: {rt}");
    // Patches and the status subresource are validated too.
    let err = env.fails(&["patch", "runtime", "rt1", "--type", "merge", "-p", r#"{"spec":{"replicas":0}}"#]);
    assert!(
        err.contains("spec.replicas: Invalid value: 0: spec.replicas in body should be greater than or equal to 1"),
        "{err}"
    );
    let err = env.fails(&[
        "patch",
        "runtime",
        "rt1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"ready":"yes"}}"#,
    ]);
    assert!(err.contains("status.ready in body must be of type boolean"), "{err}");
    env.ok(&[
        "patch",
        "runtime",
        "rt1",
        "--subresource",
        "status",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"ready":true}}"#,
    ]);
    assert_eq!(env.get_json(&["runtime", "rt1"])["status"]["ready"], true);
    // A CRD whose schema is not structural is refused.
    let bad = common::RUNTIME_CRD
        .replace("name: runtimes.fleetwatch.io", "name: gadgets.fleetwatch.io")
        .replace(
            "{plural: runtimes, singular: runtime, kind: Runtime, shortNames: [rt]}",
            "{plural: gadgets, kind: Gadget}",
        )
        .replace(
            "              replicas: {type: integer, minimum: 1, default: 1}",
            "              replicas: {minimum: 1}",
        );
    let out = env.kubectl_stdin(&["apply", "-f", "-"], Some(&bad));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("spec.versions[0].schema.openAPIV3Schema.properties[spec].properties[replicas].type: Required value: must not be empty for specified object fields"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_reads_the_crd_schema() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(common::RUNTIME_CRD, &[]);
    let out = env.ok(&["explain", "runtimes.spec"]);
    assert!(out.contains("KIND:       Runtime") && out.contains("GROUP:      fleetwatch.io"), "{out}");
    assert!(out.contains("Desired state of the runtime."), "{out}");
    assert!(out.contains("name\t<string> -required-") && out.contains("Upgrade mode."), "{out}");
    let out = env.ok(&["explain", "runtimes", "--recursive"]);
    assert!(out.contains("Runtime is one runtime cluster."), "{out}");
    assert!(out.contains("labels\t<map[string]string>") && out.contains("ready\t<boolean>"), "{out}");
    let out = env.ok(&["explain", "rt.spec.template"]);
    assert!(out.contains("What every module gets."), "{out}");
}

const SA_RBAC: &str = r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: bot, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: default}
rules:
- apiGroups: [""]
  resources: [configmaps]
  verbs: [get, list, watch]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bot-reads, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
subjects:
- {kind: ServiceAccount, name: bot, namespace: default}
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_can_i_without_rbac_allows_everything() {
    let env = Env::start(SimOptions::default()).await;
    assert_eq!(env.ok(&["auth", "can-i", "create", "deployments"]).trim(), "yes");
    let list = env.ok(&["auth", "can-i", "--list"]);
    assert!(list.lines().any(|l| l.starts_with("*.*") && l.contains("[*]")), "{list}");
    // A ServiceAccount token authenticates, and without --rbac it may do everything.
    env.apply(SA_RBAC, &[]);
    let kc = env.dir.join("bot.kubeconfig");
    env.sim.write_kubeconfig_for(&kc, "default", "bot").expect("kubeconfig for bot");
    let out = env.kubectl_as(&kc, &["auth", "can-i", "delete", "namespaces"], None);
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "yes");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rbac_grants_what_is_bound_and_forbids_the_rest() {
    let env = Env::start(SimOptions { rbac: true, ..SimOptions::default() }).await;
    env.apply(SA_RBAC, &[]);
    env.apply(CM, &[]);
    // The TokenRequest API, as `kubectl create token` uses it (protobuf body).
    let token = env.ok(&["create", "token", "bot"]);
    let token = token.trim();
    assert!(!token.is_empty());
    let kc = env.dir.join("bot.kubeconfig");
    std::fs::write(&kc, serde_json::to_string(&env.sim.kubeconfig_with_token(token)).unwrap()).unwrap();
    let run = |args: &[&str]| env.kubectl_as(&kc, args, None);
    let text = |o: &std::process::Output| {
        (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let out = run(&["get", "configmap", "demo", "-o", "name"]);
    assert!(out.status.success(), "granted: {:?}", text(&out));
    assert_eq!(text(&out).0.trim(), "configmap/demo");
    let out = run(&["get", "deployments"]);
    assert!(!out.status.success());
    assert!(
        text(&out).1.contains(r#"Error from server (Forbidden): deployments.apps is forbidden: User "system:serviceaccount:default:bot" cannot list resource "deployments" in API group "apps" in the namespace "default""#),
        "{:?}",
        text(&out)
    );
    let out = run(&["get", "configmaps", "-A"]);
    assert!(
        text(&out).1.contains(r#"cannot list resource "configmaps" in API group "" at the cluster scope"#),
        "{:?}",
        text(&out)
    );
    let out = run(&["delete", "configmap", "demo"]);
    assert!(text(&out).1.contains(r#"configmaps "demo" is forbidden"#), "{:?}", text(&out));
    assert_eq!(text(&run(&["auth", "can-i", "list", "configmaps"])).0.trim(), "yes");
    assert_eq!(text(&run(&["auth", "can-i", "create", "deployments"])).0.trim(), "no");
    let list = text(&run(&["auth", "can-i", "--list"])).0;
    assert!(list.lines().any(|l| l.starts_with("configmaps ") && l.contains("[get list watch]")), "{list}");
    assert!(!list.contains("*.*"), "{list}");
    // The admin token keeps full access; a forged token is 401.
    assert_eq!(env.ok(&["auth", "can-i", "create", "deployments"]).trim(), "yes");
    std::fs::write(&kc, serde_json::to_string(&env.sim.kubeconfig_with_token("fwsa.forged")).unwrap()).unwrap();
    let out = run(&["get", "configmaps"]);
    assert!(text(&out).1.contains("Unauthorized"), "{:?}", text(&out));
}

/// `kubectl auth whoami` (SelfSubjectReview) and `--as` (impersonation headers): the caller
/// needs the `impersonate` verb on the user / ServiceAccount / group / uid it names, and the
/// request is then authorized as the impersonated user, so `kubectl auth can-i --as=…`
/// answers what that user may do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn whoami_and_impersonation_follow_rbac() {
    let env = Env::start(SimOptions { rbac: true, ..SimOptions::default() }).await;
    env.apply(SA_RBAC, &[]);
    env.apply(CM, &[]);
    let whoami = |args: &[&str]| -> Value {
        let mut all = vec!["auth", "whoami", "-o", "json"];
        all.extend_from_slice(args);
        serde_json::from_str(&env.ok(&all)).expect("whoami prints JSON")
    };
    let me = whoami(&[]);
    assert_eq!(me["kind"], "SelfSubjectReview", "{me}");
    assert_eq!(me["status"]["userInfo"]["username"], "admin", "{me}");
    assert_eq!(me["status"]["userInfo"]["groups"], serde_json::json!(["system:masters", "system:authenticated"]));
    // A ServiceAccount impersonated without groups gets a ServiceAccount's groups.
    let bot = whoami(&["--as=system:serviceaccount:default:bot"]);
    assert_eq!(bot["status"]["userInfo"]["username"], "system:serviceaccount:default:bot", "{bot}");
    assert_eq!(
        bot["status"]["userInfo"]["groups"],
        serde_json::json!(["system:serviceaccounts", "system:serviceaccounts:default", "system:authenticated"])
    );
    let custom = whoami(&["--as=jane", "--as-group=devs", "--as-uid=42"]);
    assert_eq!(custom["status"]["userInfo"]["username"], "jane", "{custom}");
    assert_eq!(custom["status"]["userInfo"]["groups"], serde_json::json!(["devs", "system:authenticated"]));
    assert_eq!(custom["status"]["userInfo"]["uid"], "42");
    // The table form kubectl prints by default.
    let table = env.ok(&["auth", "whoami", "--as=system:serviceaccount:default:bot"]);
    assert!(
        table.lines().any(|l| l.starts_with("Username") && l.contains("system:serviceaccount:default:bot")),
        "{table}"
    );

    // can-i --as answers for the impersonated user ("no" exits 1).
    let can_i = |kc: &std::path::Path, args: &[&str]| {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let out = env.kubectl_as(kc, &all, None);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let admin_kc = env.kubeconfig.clone();
    assert_eq!(can_i(&admin_kc, &["get", "configmaps", "--as=system:serviceaccount:default:bot"]), "yes");
    assert_eq!(can_i(&admin_kc, &["get", "secrets", "--as=system:serviceaccount:default:bot"]), "no");
    assert_eq!(
        can_i(&admin_kc, &["get", "configmaps", "-n", "kube-system", "--as=system:serviceaccount:default:bot"]),
        "no"
    );
    assert_eq!(can_i(&admin_kc, &["get", "secrets"]), "yes", "the admin itself");
    // Any request made --as is enforced as that user.
    let out = env.kubectl(&["get", "secrets", "--as=system:serviceaccount:default:bot"]);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"secrets is forbidden: User "system:serviceaccount:default:bot" cannot list resource "secrets" in API group "" in the namespace "default""#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        env.ok(&["get", "configmap", "demo", "-o", "name", "--as=system:serviceaccount:default:bot"]).trim(),
        "configmap/demo"
    );

    // Impersonating needs the impersonate verb, checked by name.
    let kc = env.dir.join("bot.kubeconfig");
    env.sim.write_kubeconfig_for(&kc, "default", "bot").expect("kubeconfig for bot");
    // (whoami itself turns any 403 into "not enabled or you do not have permission": the
    // server's own message shows on a plain get. Discovery is refused too when impersonating
    // is, so the bot first reads discovery as itself, which kubectl caches, as in daily use.)
    let out = env.kubectl_as(&kc, &["get", "configmap", "demo", "-o", "name"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let out = env.kubectl_as(&kc, &["get", "configmap", "demo", "--as=admin"], None);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"users "admin" is forbidden: User "system:serviceaccount:default:bot" cannot impersonate resource "users" in API group "" at the cluster scope"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    env.apply(
        r#"
apiVersion: v1
kind: ServiceAccount
metadata: {name: helper, namespace: default}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: be-helper, namespace: default}
rules:
- apiGroups: [""]
  resources: [serviceaccounts]
  resourceNames: [helper]
  verbs: [impersonate]
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: bot-is-helper, namespace: default}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: be-helper}
subjects:
- {kind: ServiceAccount, name: bot, namespace: default}
"#,
        &[],
    );
    let out = env.kubectl_as(&kc, &["auth", "whoami", "--as=system:serviceaccount:default:helper"], None);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("system:serviceaccount:default:helper"));
    // …and the helper may not read the ConfigMap the bot itself may.
    assert_eq!(can_i(&kc, &["get", "configmaps", "--as=system:serviceaccount:default:helper"]), "no");
    let out = env.kubectl_as(&kc, &["get", "configmap", "demo", "--as=system:serviceaccount:default:other"], None);
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"serviceaccounts "other" is forbidden: User "system:serviceaccount:default:bot" cannot impersonate resource "serviceaccounts" in API group "" in the namespace "default""#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A group the bot may not impersonate is refused even with an allowed user.
    let out = env.kubectl_as(
        &kc,
        &["get", "configmap", "demo", "--as=system:serviceaccount:default:helper", "--as-group=system:masters"],
        None,
    );
    assert!(
        String::from_utf8_lossy(&out.stderr).contains(r#"groups "system:masters" is forbidden"#),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every typed `kubectl create` of a served kind sends a protobuf body; each must be
/// decoded into the object kubectl built.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn typed_creates_send_protobuf_and_work() {
    let env = Env::start(SimOptions::default()).await;
    for (args, created) in [
        (&["create", "namespace", "team"][..], "namespace/team created"),
        (&["create", "configmap", "cfg", "--from-literal=a=1", "--from-literal=b=two"], "configmap/cfg created"),
        (&["create", "secret", "generic", "sec", "--from-literal=pw=hunter2"], "secret/sec created"),
        (
            &["create", "deployment", "web", "--image=nginx:1.27", "--replicas=2", "--port=80"],
            "deployment.apps/web created",
        ),
        (&["create", "deployment", "idle", "--image=nginx", "--replicas=0"], "deployment.apps/idle created"),
        (&["create", "serviceaccount", "bot"], "serviceaccount/bot created"),
        (&["create", "service", "clusterip", "web", "--tcp=80:8080"], "service/web created"),
        (
            &["create", "role", "reader", "--verb=get,list", "--resource=pods,configmaps"],
            "role.rbac.authorization.k8s.io/reader created",
        ),
        (
            &["create", "clusterrole", "creader", "--verb=get", "--resource=namespaces"],
            "clusterrole.rbac.authorization.k8s.io/creader created",
        ),
        (
            &["create", "rolebinding", "rb", "--role=reader", "--serviceaccount=default:bot"],
            "rolebinding.rbac.authorization.k8s.io/rb created",
        ),
        (
            &["create", "clusterrolebinding", "crb", "--clusterrole=creader", "--user=alice", "--group=devs"],
            "clusterrolebinding.rbac.authorization.k8s.io/crb created",
        ),
        (
            &["create", "poddisruptionbudget", "pdb", "--selector=app=web", "--min-available=50%"],
            "poddisruptionbudget.policy/pdb created",
        ),
        (&["create", "job", "once", "--image=busybox", "--", "echo", "hi"], "job.batch/once created"),
        (&["create", "quota", "q", "--hard=pods=10,configmaps=5"], "resourcequota/q created"),
    ] {
        assert_eq!(env.ok(args).trim(), created, "{args:?}");
    }
    // What kubectl sent is what is stored.
    let cm = env.get_json(&["configmap", "cfg"]);
    assert_eq!(cm["data"], serde_json::json!({"a": "1", "b": "two"}));
    let sec = env.get_json(&["secret", "sec"]);
    assert_eq!(sec["data"]["pw"], "aHVudGVyMg==", "bytes are base64 in JSON");
    assert_eq!(sec["type"], "Opaque");
    let d = env.get_json(&["deployment", "web"]);
    assert_eq!(d["spec"]["replicas"], 2);
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!((c["name"].as_str(), c["image"].as_str()), (Some("nginx"), Some("nginx:1.27")));
    assert_eq!(c["ports"][0]["containerPort"], 80);
    assert_eq!(env.get_json(&["deployment", "idle"])["spec"]["replicas"], 0, "an explicit 0 is kept");
    let svc = env.get_json(&["service", "web"]);
    assert_eq!(svc["spec"]["ports"][0]["port"], 80);
    assert_eq!(svc["spec"]["ports"][0]["targetPort"], 8080, "IntOrString as a number");
    assert_eq!(svc["spec"]["type"], "ClusterIP");
    let role = env.get_json(&["role", "reader"]);
    assert_eq!(role["rules"][0]["verbs"], serde_json::json!(["get", "list"]));
    let rb = env.get_json(&["rolebinding", "rb"]);
    assert_eq!(rb["roleRef"]["kind"], "Role");
    assert_eq!(rb["subjects"][0]["namespace"], "default");
    let crb = env.get_json(&["clusterrolebinding", "crb"]);
    assert_eq!(crb["subjects"].as_array().map(Vec::len), Some(2));
    assert_eq!(env.get_json(&["pdb", "pdb"])["spec"]["minAvailable"], "50%", "IntOrString as a string");
    let job = env.get_json(&["job", "once"]);
    assert_eq!(job["spec"]["template"]["spec"]["containers"][0]["command"], serde_json::json!(["echo", "hi"]));
    assert_eq!(env.get_json(&["quota", "q"])["spec"]["hard"]["pods"], "10", "Quantity as a string");
    assert_eq!(env.get_json(&["namespace", "team"])["status"]["phase"], "Active");
}

/// A CRD of `properties` string fields, each with a description of `pad` bytes.
fn large_crd(properties: usize, pad: usize) -> String {
    let mut props = serde_json::Map::new();
    for i in 0..properties {
        props.insert(
            format!("field{i}"),
            serde_json::json!({"type": "string", "description": format!("{i} {}", "d".repeat(pad))}),
        );
    }
    serde_json::json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "bigs.example.com"},
        "spec": {
            "group": "example.com",
            "names": {"kind": "Big", "plural": "bigs", "singular": "big", "listKind": "BigList"},
            "scope": "Namespaced",
            "versions": [{"name": "v1", "served": true, "storage": true, "schema": {"openAPIV3Schema": {
                "type": "object",
                "properties": {"spec": {"type": "object", "properties": props}}
            }}}]
        }
    })
    .to_string()
}

/// Real modules ship CRDs of megabytes (cert-manager's are about 1 MiB together): the sim
/// takes what kube-apiserver takes, up to its 3 MiB request limit, through server-side
/// apply, and answers a larger request with kube-apiserver's 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_crds_apply_server_side_and_oversized_requests_get_413() {
    let env = Env::start(SimOptions::default()).await;
    let crd = large_crd(2_000, 1_000);
    assert!(crd.len() > 2 << 20, "{} bytes", crd.len());
    let out = env.apply(&crd, &["--server-side", "--field-manager", "modules"]);
    assert!(out.contains("bigs.example.com serverside-applied"), "{out}");
    let got = env.get_json(&["crd", "bigs.example.com", "--show-managed-fields"]);
    let props = &got["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"];
    assert_eq!(props.as_object().map(|p| p.len()), Some(2_000));
    assert!(got["metadata"]["managedFields"].as_array().is_some_and(|m| m.iter().any(|e| e["manager"] == "modules")));
    // Applied again unchanged: nothing to do, still there.
    env.apply(&crd, &["--server-side", "--field-manager", "modules"]);
    let big = "apiVersion: example.com/v1\nkind: Big\nmetadata:\n  name: b1\nspec:\n  field1: x\n";
    assert_eq!(env.apply(big, &[]).trim(), "big.example.com/b1 created");

    let oversized = large_crd(3_500, 1_000).replace("bigs.example.com", "huges.example.com");
    let out = env.kubectl_stdin(&["apply", "--server-side", "-f", "-"], Some(&oversized));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a request over 3 MiB is refused");
    assert!(err.contains("Request entity too large: limit is 3145728"), "{err}");
    assert!(env.fails(&["get", "crd", "huges.example.com"]).contains("NotFound"));
}

/// A loopback HTTP server answering every request with one line describing it (method,
/// path and query, whether credentials reached it, a custom header, the body), so a test
/// sees what the service proxy forwarded.
async fn echo_server(tls: bool) -> std::net::SocketAddr {
    use http_body_util::BodyExt;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind echo server");
    let addr = listener.local_addr().expect("echo address");
    // A self-signed certificate: the proxy does not verify it, as kube-apiserver's does not.
    let acceptor = tls.then(|| {
        let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).expect("certificate");
        let key = rustls_pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
        let config =
            rustls::ServerConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .expect("protocol versions")
                .with_no_client_auth()
                .with_single_cert(vec![ck.cert.der().clone()], key)
                .expect("server config");
        tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config))
    });
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: hyper::Request<hyper::body::Incoming>| async move {
                    let line = format!(
                        "{} {} authorization={} impersonate={} x-probe={}",
                        req.method(),
                        req.uri(),
                        req.headers().contains_key("authorization"),
                        req.headers().keys().any(|k| k.as_str().starts_with("impersonate-")),
                        req.headers().get("x-probe").and_then(|v| v.to_str().ok()).unwrap_or("-"),
                    );
                    let body = req.into_body().collect().await.map(|b| b.to_bytes()).unwrap_or_default();
                    let text = format!("{line} body={}", String::from_utf8_lossy(&body));
                    Ok::<_, std::convert::Infallible>(
                        hyper::Response::builder()
                            .status(if text.contains("/teapot") { 418 } else { 200 })
                            .header("content-type", "text/plain")
                            .body(http_body_util::Full::new(bytes::Bytes::from(text)))
                            .expect("echo response"),
                    )
                });
                let http = hyper::server::conn::http1::Builder::new();
                match acceptor {
                    Some(a) => {
                        if let Ok(tls) = a.accept(tcp).await {
                            let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tls), svc).await;
                        }
                    }
                    None => {
                        let _ = http.serve_connection(hyper_util::rt::TokioIo::new(tcp), svc).await;
                    }
                }
            });
        }
    });
    addr
}

const WEB_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: web, namespace: default}
spec:
  selector: {app: web}
  ports:
  - {name: http, port: 80, targetPort: 8080}
  - {name: https, port: 443, targetPort: 8443}
---
apiVersion: v1
kind: ServiceAccount
metadata: {name: prober, namespace: default}
"#;

/// The API server's service proxy as `kubectl get --raw` / `create --raw` use it: the
/// Service port by name or number, the path after `/proxy` and the query forwarded, the
/// caller's credentials not; 404 without the Service, 503 without an endpoint; RBAC on
/// `services/proxy` (edit has it, view does not).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_proxy_forwards_to_the_exposed_endpoint() {
    let env = Env::start(SimOptions { rbac: true, ..SimOptions::default() }).await;
    let addr = echo_server(false).await;
    let tls_addr = echo_server(true).await;
    env.apply(WEB_SERVICE, &[]);
    let base = "/api/v1/namespaces/default/services";
    // Registered, but the Service declares no port "admin": no endpoint for it.
    env.sim.expose_service("default", "web", "admin", addr).expect("loopback endpoint");
    let err = env.fails(&["get", "--raw", &format!("{base}/web:admin/proxy/healthz")]);
    assert!(err.contains(r#"no endpoints available for service "web:admin""#), "{err}");
    env.sim.expose_service("default", "web", "http", addr).expect("loopback endpoint");
    assert!(env.sim.expose_service("default", "web", "http", "10.1.2.3:80".parse().unwrap()).is_err());

    let out = env.ok(&["get", "--raw", &format!("{base}/web:http/proxy/healthz?verbose=1&x=a%20b")]);
    assert_eq!(out.trim(), "GET /healthz?verbose=1&x=a+b authorization=false impersonate=false x-probe=- body=");
    let out = env.ok(&["get", "--raw", &format!("{base}/web:80/proxy/")]);
    assert!(out.starts_with("GET / "), "by port number: {out}");
    let out = env.ok(&["get", "--raw", &format!("{base}/http:web:http/proxy")]);
    assert!(out.starts_with("GET / "), "scheme prefix, empty path: {out}");
    // https: to the TLS endpoint of the port named https; plain HTTP to it fails, named.
    env.sim.expose_service("default", "web", "https", tls_addr).expect("loopback endpoint");
    let out = env.ok(&["get", "--raw", &format!("{base}/https:web:https/proxy/secure")]);
    assert!(out.starts_with("GET /secure "), "over TLS: {out}");
    let err = env.fails(&["get", "--raw", &format!("{base}/web:https/proxy/secure")]);
    assert!(err.contains("error trying to reach service"), "{err}");
    let out =
        env.kubectl_stdin(&["create", "--raw", &format!("{base}/web:http/proxy/echo"), "-f", "-"], Some(r#"{"a":1}"#));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("POST /echo") && text.contains(r#"body={"a":1}"#),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The endpoint's own errors pass through.
    let err = env.fails(&["get", "--raw", &format!("{base}/web:http/proxy/teapot")]);
    assert!(err.contains("status code 418"), "{err}");

    let err = env.fails(&["get", "--raw", &format!("{base}/web/proxy/")]);
    assert!(err.contains(r#"no endpoints available for service "web""#), "unnamed port: {err}");
    let err = env.fails(&["get", "--raw", &format!("{base}/web:81/proxy/")]);
    assert!(err.contains(r#"no service port 81 found for service "web""#), "{err}");
    let err = env.fails(&["get", "--raw", &format!("{base}/nope:http/proxy/")]);
    assert!(err.contains(r#"services "nope" not found"#), "{err}");
    let err = env.fails(&["get", "--raw", &format!("{base}/ftp:web:http/proxy/")]);
    assert!(err.contains("invalid service request"), "{err}");

    // RBAC: the subresource services/proxy, verb from the method.
    let kc = env.dir.join("prober.kubeconfig");
    env.sim.write_kubeconfig_for(&kc, "default", "prober").expect("kubeconfig for prober");
    env.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: prober-view, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: view}\nsubjects:\n- {kind: ServiceAccount, name: prober, namespace: default}\n",
        &[],
    );
    let out = env.kubectl_as(&kc, &["get", "--raw", &format!("{base}/web:http/proxy/healthz")], None);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(r#"services "web:http" is forbidden: User "system:serviceaccount:default:prober" cannot get resource "services/proxy" in API group "" in the namespace "default""#),
        "{err}"
    );
    env.apply(
        "apiVersion: rbac.authorization.k8s.io/v1\nkind: RoleBinding\nmetadata: {name: prober-edit, namespace: default}\nroleRef: {apiGroup: rbac.authorization.k8s.io, kind: ClusterRole, name: edit}\nsubjects:\n- {kind: ServiceAccount, name: prober, namespace: default}\n",
        &[],
    );
    let out = env.kubectl_as(&kc, &["get", "--raw", &format!("{base}/web:http/proxy/healthz")], None);
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("GET /healthz"), "{out:?}");
    let out = env.ok(&[
        "get",
        "--raw",
        &format!("{base}/web:http/proxy/a/b/"),
        "--as",
        "system:serviceaccount:default:prober",
    ]);
    assert!(out.contains("GET /a/b/ authorization=false impersonate=false"), "credentials not forwarded: {out}");

    // No endpoint any more: 503, as for a Service without ready pods.
    assert!(env.sim.unexpose_service("default", "web", "http"));
    let err = env.fails(&["get", "--raw", &format!("{base}/web:http/proxy/healthz")]);
    assert!(err.contains("ServiceUnavailable") || err.contains("no endpoints available"), "{err}");
}

const STS: &str = r#"
apiVersion: apps/v1
kind: StatefulSet
metadata: {name: store, namespace: default}
spec:
  replicas: 3
  serviceName: store
  selector: {matchLabels: {app: store}}
  template:
    metadata: {labels: {app: store}}
    spec:
      containers: [{name: c, image: "store:1"}]
"#;

/// `kubectl rollout status statefulset/NAME` waits for the stand-in controller as for a
/// Deployment: defaults as kube-apiserver sets them (RollingUpdate, partition 0), then the
/// status fields the StatefulSet controller writes, a new revision per template.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rollout_status_follows_statefulsets() {
    let env = Env::start(SimOptions::default()).await;
    env.apply(STS, &[]);
    let sts = env.get_json(&["statefulset", "store"]);
    assert_eq!(
        sts["spec"]["updateStrategy"],
        serde_json::json!({"type": "RollingUpdate", "rollingUpdate": {"partition": 0}})
    );
    assert_eq!(sts["spec"]["podManagementPolicy"], "OrderedReady");
    assert_eq!(sts["spec"]["revisionHistoryLimit"], 10);
    // Nothing rolls it out yet: kubectl waits (and gives up after its timeout).
    let err = env.fails(&["rollout", "status", "statefulset/store", "--timeout=1s"]);
    assert!(err.contains("timed out"), "{err}");

    let stop = tokio_util::sync::CancellationToken::new();
    let _stop = stop.clone().drop_guard();
    tokio::spawn(fleetwatch_sim::roll_out_deployments(env.sim.client().await.unwrap(), Duration::ZERO, stop));
    let out = env.ok(&["rollout", "status", "statefulset/store", "--timeout=60s"]);
    assert!(out.contains("partitioned roll out complete: 3 new pods have been updated"), "{out}");
    let status = env.get_json(&["statefulset", "store"])["status"].clone();
    assert_eq!((status["observedGeneration"].as_i64(), status["readyReplicas"].as_i64()), (Some(1), Some(3)));
    assert_eq!((status["currentReplicas"].as_i64(), status["updatedReplicas"].as_i64()), (Some(3), Some(3)));
    let first = status["updateRevision"].as_str().unwrap().to_string();
    assert!(first.starts_with("store-") && status["currentRevision"] == first.as_str(), "{status}");

    env.apply(&STS.replace("store:1", "store:2"), &[]);
    let out = env.ok(&["rollout", "status", "statefulset/store", "--timeout=60s"]);
    assert!(out.contains("roll out complete"), "{out}");
    let status = env.get_json(&["statefulset", "store"])["status"].clone();
    assert_eq!(status["observedGeneration"].as_i64(), Some(2), "{status}");
    assert_ne!(status["updateRevision"].as_str(), Some(first.as_str()), "a new template is a new revision");
}
