//! `fleetwatch modules list|enable|disable`, the runtime cluster user's CLI, against a
//! simulated runtime cluster: the tests install the Module CRD and write the catalog
//! ConfigMap themselves, and play the lifecycle operator's part by writing the objects'
//! status by hand (status subresource), so every answer of the CLI is checked against a
//! known cluster state.

use std::path::PathBuf;
use std::process::Stdio;

use fleetwatch_api::chosen::{FINALIZER, Module, SOURCE_LABEL};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::{Value, json};
use tokio::io::{AsyncBufReadExt, BufReader};

use crate::support::{BIN, eventually};

/// A simulated runtime cluster with its kubeconfig in a temporary directory.
struct Runtime {
    sim: fleetwatch_sim::SimCluster,
    client: kube::Client,
    kubeconfig: PathBuf,
    _dir: tempfile::TempDir,
}

impl Runtime {
    async fn start() -> Self {
        fleetwatch_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        let sim =
            fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions { name: "rt-1".into(), ..Default::default() })
                .await
                .unwrap();
        let kubeconfig = dir.path().join("rt-1.kubeconfig");
        sim.write_kubeconfig(&kubeconfig).unwrap();
        let client = sim.client().await.unwrap();
        Self { sim, client, kubeconfig, _dir: dir }
    }

    /// The Module CRD, as the lifecycle operator installs it.
    async fn install_module_kind(&self) {
        let crd: CustomResourceDefinition =
            serde_json::from_value(serde_json::to_value(Module::crd()).unwrap()).unwrap();
        Api::<CustomResourceDefinition>::all(self.client.clone()).create(&PostParams::default(), &crd).await.unwrap();
        let modules = self.modules();
        eventually("the Module kind to be served")
            .until(async || modules.list(&Default::default()).await.is_ok(), |ok| *ok)
            .await;
    }

    /// Writes `catalog` as the lifecycle operator does.
    async fn write_catalog(&self, catalog: &Value) {
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "kube-public"}})).unwrap();
        let _ = Api::<Namespace>::all(self.client.clone()).create(&PostParams::default(), &ns).await;
        let cm = json!({
            "apiVersion": "v1", "kind": "ConfigMap",
            "metadata": {"name": "fleetwatch-catalog", "namespace": "kube-public"},
            "data": {"catalog.json": catalog.to_string()},
        });
        Api::<ConfigMap>::namespaced(self.client.clone(), "kube-public")
            .patch("fleetwatch-catalog", &PatchParams::apply("test").force(), &Patch::Apply(&cm))
            .await
            .unwrap();
    }

    fn modules(&self) -> Api<Module> {
        Api::all(self.client.clone())
    }

    /// Creates a Module object as a user (or, `central`, as the operator for a centrally
    /// listed module) would.
    async fn create_module(&self, name: &str, spec: Value, central: bool) -> Module {
        let mut obj = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Module",
                             "metadata": {"name": name}, "spec": spec});
        if central {
            obj["metadata"]["labels"] = json!({SOURCE_LABEL: "central"});
        }
        self.modules().create(&PostParams::default(), &serde_json::from_value(obj).unwrap()).await.unwrap()
    }

    /// Writes `status` into Module `name` (merged), as the lifecycle operator would.
    async fn set_status(&self, name: &str, status: Value) {
        self.modules()
            .patch_status(name, &PatchParams::default(), &Patch::Merge(json!({"status": status})))
            .await
            .unwrap();
    }

    /// Runs the CLI against this cluster: (exit code, stdout, stderr).
    async fn cli(&self, args: &[&str]) -> (i32, String, String) {
        let out = self.command(args).output().await.unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into(),
            String::from_utf8_lossy(&out.stderr).into(),
        )
    }

    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut c = tokio::process::Command::new(BIN);
        c.arg("modules").args(args).arg("--kubeconfig").arg(&self.kubeconfig).env("FLEETWATCH_LOG", "warn");
        c.kill_on_drop(true);
        c
    }
}

fn catalog() -> Value {
    json!({
        "channel": "regular",
        "selfService": true,
        "modules": [
            {"name": "redis", "channels": {"fast": "1.11.0", "regular": "1.10.0"}, "versions": ["1.9.0", "1.10.0", "1.11.0"],
             "mandatory": null, "selfService": true,
             "deprecated": [{"version": "1.9.0", "deprecationDate": "2030-01-01", "message": "move to 1.10"}]},
            {"name": "keda", "channels": {"regular": "2.15.0"}, "versions": ["2.15.0"], "mandatory": null, "deprecated": [], "selfService": true},
            {"name": "istio", "channels": {"regular": "1.22.0"}, "versions": ["1.22.0"], "mandatory": null, "deprecated": [], "selfService": false}
        ]
    })
}

/// The row of `module` in the table, split into its cells.
fn row(table: &str, module: &str) -> Vec<String> {
    let line = table.lines().find(|l| l.split_whitespace().next() == Some(module)).unwrap_or_else(|| panic!("{table}"));
    line.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect()
}

/// A `modules` process whose stdout is read line by line.
struct Following {
    child: tokio::process::Child,
    lines: tokio::io::Lines<BufReader<tokio::process::ChildStdout>>,
    seen: Vec<String>,
}

impl Following {
    fn spawn(rt: &Runtime, args: &[&str]) -> Self {
        let mut child = rt.command(args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let lines = BufReader::new(child.stdout.take().unwrap()).lines();
        Self { child, lines, seen: Vec::new() }
    }

    /// Reads stdout until a line containing `needle` (panics when stdout ends first).
    async fn line_with(&mut self, needle: &str) -> String {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                self.seen.push(line.clone());
                if line.contains(needle) {
                    return Some(line);
                }
            }
            None
        };
        match tokio::time::timeout(fleetwatch_test_support::DEADLINE, read).await {
            Ok(Some(line)) => line,
            _ => panic!("no line with {needle:?} in the output: {:#?}", self.seen),
        }
    }

    /// Waits for the exit: (code, the rest of stdout, stderr).
    async fn finish(mut self) -> (i32, String, String) {
        let mut rest = String::new();
        let status = tokio::time::timeout(fleetwatch_test_support::DEADLINE, async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                rest.push_str(&line);
                rest.push('\n');
            }
            self.child.wait().await.unwrap()
        })
        .await
        .unwrap_or_else(|_| panic!("the process did not exit; it printed {:#?}", self.seen));
        let mut err = String::new();
        tokio::io::AsyncReadExt::read_to_string(self.child.stderr.as_mut().unwrap(), &mut err).await.unwrap();
        (status.code().unwrap_or(-1), rest, err)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_list_shows_the_catalog_beside_what_runs() {
    let rt = Runtime::start().await;
    let kubeconfig = rt.kubeconfig.display().to_string();

    // Not managed by fleetwatch: no catalog.
    let (code, out, err) = rt.cli(&["list"]).await;
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("not (yet) managed by fleetwatch") && err.contains("kube-public/fleetwatch-catalog"), "{err}");
    assert!(
        err.starts_with(&format!("error: context rt-1 ({}): ", rt.sim.url())),
        "the error names the cluster: {err}"
    );
    assert_eq!(err.lines().count(), 1, "{err}");

    // A catalog, but the Module kind is not installed yet: the catalog is listed, and that said.
    rt.write_catalog(&catalog()).await;
    let (code, out, err) = rt.cli(&["list"]).await;
    assert_eq!(code, 0, "{err}");
    assert_eq!(row(&out, "redis"), ["redis", "fast=1.11.0 regular=1.10.0*", "-", "-", "-", "-", "deprecated: 1.9.0"]);
    assert_eq!(row(&out, "istio"), ["istio", "regular=1.22.0*", "-", "-", "-", "-", "not offered to this cluster"]);
    assert!(
        out.contains("the Module kind (modules.operator.fleetwatch.dev) is not installed in this cluster yet"),
        "{out}"
    );
    let (code, out, err) = rt.cli(&["list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(doc["moduleKindInstalled"], false, "{doc:#}");

    // What runs: a user's module (running a deprecated version), a central one, one the
    // catalog does not offer (refused by the operator), one not taken up yet.
    rt.install_module_kind().await;
    rt.create_module("redis", json!({"channel": "regular"}), false).await;
    rt.set_status(
        "redis",
        json!({"state": "Ready", "version": "1.9.0", "channel": "regular", "source": "user", "observedGeneration": 1}),
    )
    .await;
    rt.create_module("istio", json!({}), true).await;
    rt.set_status(
        "istio",
        json!({"state": "Warning", "version": "1.23.0", "channel": "regular", "source": "central",
               "message": "1.23.0 runs, newer than channel regular's 1.22.0: not downgraded", "observedGeneration": 1}),
    )
    .await;
    rt.create_module("nosuch", json!({}), false).await;
    rt.set_status(
        "nosuch",
        json!({"state": "Error", "source": "user", "message": "no module nosuch is offered", "observedGeneration": 1}),
    )
    .await;
    rt.create_module("keda", json!({}), false).await;

    let (code, out, err) = rt.cli(&["list"]).await;
    assert_eq!(code, 0, "{err}");
    let head: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(head, ["MODULE", "CHANNELS", "STATE", "VERSION", "CHANNEL", "SOURCE", "NOTE"], "{out}");
    assert_eq!(
        row(&out, "redis"),
        [
            "redis",
            "fast=1.11.0 regular=1.10.0*",
            "Ready",
            "1.9.0",
            "regular",
            "user",
            "running 1.9.0 is deprecated since 2030-01-01: move to 1.10"
        ]
    );
    assert_eq!(
        row(&out, "istio"),
        [
            "istio",
            "regular=1.22.0*",
            "Warning",
            "1.23.0",
            "regular",
            "central",
            "1.23.0 runs, newer than channel regular's 1.22.0: not downgraded"
        ]
    );
    assert_eq!(
        row(&out, "nosuch"),
        ["nosuch", "-", "Error", "-", "-", "user", "not in the catalog; no module nosuch is offered"]
    );
    assert_eq!(
        row(&out, "keda"),
        ["keda", "regular=2.15.0*", "-", "-", "-", "user", "not taken up yet (no status from the lifecycle operator)"]
    );
    assert!(!out.contains("not installed"), "{out}");

    // The same for tools.
    let (code, out, err) = rt.cli(&["list", "-o", "json"]).await;
    assert_eq!(code, 0, "{err}");
    let doc: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((doc["defaultChannel"].as_str(), doc["moduleKindInstalled"].as_bool()), (Some("regular"), Some(true)));
    let names: Vec<&str> = doc["modules"].as_array().unwrap().iter().map(|m| m["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["istio", "keda", "nosuch", "redis"], "{doc:#}");
    let redis = &doc["modules"][3];
    assert_eq!(redis["channels"], json!({"fast": "1.11.0", "regular": "1.10.0"}));
    assert_eq!(redis["chosen"]["source"], "user");
    assert_eq!(redis["chosen"]["spec"]["channel"], "regular");
    assert_eq!(redis["chosen"]["status"]["version"], "1.9.0");
    assert_eq!(doc["modules"][0]["chosen"]["source"], "central");
    assert_eq!(
        (doc["modules"][2]["offered"].as_bool(), doc["modules"][0]["selfService"].as_bool()),
        (Some(false), Some(false))
    );
    let (code, out, err) = rt.cli(&["list", "-o", "yaml"]).await;
    assert_eq!(code, 0, "{err}");
    let yaml: Value = serde_saphyr::from_str(&out).unwrap();
    assert_eq!(yaml, doc, "YAML and JSON give the same data");

    // KUBECONFIG instead of --kubeconfig, and --context.
    let out = tokio::process::Command::new(BIN)
        .args(["modules", "list", "-o", "json", "--context", "rt-1"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let (code, _, err) = rt.cli(&["list", "--context", "elsewhere"]).await;
    assert_ne!(code, 0);
    assert!(err.contains(&kubeconfig) && err.contains("elsewhere"), "{err}");

    // An API server that does not answer: one line naming the cluster and what was asked.
    let mut dead: Value = serde_json::from_str(&std::fs::read_to_string(&rt.kubeconfig).unwrap()).unwrap();
    let nobody = format!("https://127.0.0.1:{}", crate::support::free_port());
    dead["clusters"][0]["cluster"]["server"] = json!(nobody);
    let dead_path = rt.kubeconfig.with_file_name("dead.kubeconfig");
    std::fs::write(&dead_path, dead.to_string()).unwrap();
    let out = tokio::process::Command::new(BIN)
        .args(["modules", "disable", "redis", "--kubeconfig", dead_path.to_str().unwrap()])
        .output()
        .await
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.starts_with(&format!("error: context rt-1 ({nobody}): cannot read Module redis: ")), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_enable_creates_the_object_or_refuses_naming_the_reason() {
    let rt = Runtime::start().await;
    rt.write_catalog(&catalog()).await;

    // The Module kind is not installed yet: nothing to create.
    let (code, _, err) = rt.cli(&["enable", "redis"]).await;
    assert_ne!(code, 0);
    assert!(err.contains("the Module kind (modules.operator.fleetwatch.dev) is not installed"), "{err}");
    rt.install_module_kind().await;

    // Refusals, each naming its reason, nothing created.
    let refused = [
        (
            vec!["enable", "nosuch"],
            "cannot enable module nosuch: the catalog does not offer it (it offers: redis, keda, istio)",
        ),
        (vec!["enable", "istio"], "cannot enable module istio: it is not offered to this cluster's users"),
        (
            vec!["enable", "redis", "--channel", "slow"],
            "cannot enable module redis: it has no channel \"slow\" (its channels: fast, regular)",
        ),
    ];
    for (args, reason) in refused {
        let (code, out, err) = rt.cli(&args).await;
        assert_eq!(code, 1, "{args:?}: {out}");
        assert!(err.contains(reason) && err.contains("context rt-1"), "{args:?}: {err}");
    }
    assert!(rt.modules().list(&Default::default()).await.unwrap().items.is_empty());

    // Created with the spec asked for, by the CLI's field manager.
    let (code, out, err) = rt.cli(&["enable", "redis", "--channel", "fast", "--policy", "Ignore"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Module redis created (channel fast; policy Ignore)"), "{out}");
    let m = rt.modules().get("redis").await.unwrap();
    assert_eq!(m.spec.channel.as_deref(), Some("fast"));
    assert_eq!(m.spec.custom_resource_policy, fleetwatch_api::CustomResourcePolicy::Ignore);
    assert!(m.managed_fields().iter().any(|f| f.manager.as_deref() == Some("fleetwatch-cli")), "{m:?}");

    // Enabled again with another channel: updated, the policy kept.
    let (code, out, err) = rt.cli(&["enable", "redis", "--channel", "regular"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Module redis updated (channel regular; policy Ignore)"), "{out}");
    let m = rt.modules().get("redis").await.unwrap();
    assert_eq!(
        (m.spec.channel.as_deref(), m.spec.custom_resource_policy),
        (Some("regular"), fleetwatch_api::CustomResourcePolicy::Ignore)
    );
    let (code, out, _) = rt.cli(&["enable", "redis"]).await;
    assert_eq!(code, 0);
    assert!(out.contains("Module redis unchanged"), "{out}");

    // Without --channel a new one follows the cluster's default: keda has it, but a module
    // without the default channel is refused.
    let (code, out, err) = rt.cli(&["enable", "keda"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("Module keda created (channel: the cluster's default, now regular; policy CreateAndDelete)"),
        "{out}"
    );
    assert_eq!(rt.modules().get("keda").await.unwrap().spec.channel, None);
    let mut only_fast = catalog();
    only_fast["modules"][1]["channels"] = json!({"fast": "2.16.0"});
    only_fast["modules"].as_array_mut().unwrap().push(json!({"name": "serverless", "channels": {"fast": "1.0.0"}}));
    rt.write_catalog(&only_fast).await;
    let (code, _, err) = rt.cli(&["enable", "serverless"]).await;
    assert_eq!(code, 1);
    assert!(
        err.contains("it has no channel \"regular\", the cluster's default: choose one with --channel (fast)"),
        "{err}"
    );

    // A module the control plane lists: refused, its object untouched.
    let central = rt.create_module("istio", json!({"channel": "regular"}), true).await;
    rt.set_status("istio", json!({"state": "Ready", "source": "central", "observedGeneration": 1})).await;
    let (code, _, err) = rt.cli(&["enable", "istio", "--channel", "fast"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot enable module istio: it is managed from the control plane"), "{err}");
    assert_eq!(rt.modules().get("istio").await.unwrap().spec, central.spec);

    // Self-service off for the whole cluster.
    let mut off = catalog();
    off["selfService"] = json!(false);
    rt.write_catalog(&off).await;
    let (code, _, err) = rt.cli(&["enable", "keda"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot enable module keda: self-service is off for this cluster"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_disable_deletes_the_users_object_and_refuses_central_ones() {
    let rt = Runtime::start().await;
    rt.write_catalog(&catalog()).await;
    rt.install_module_kind().await;

    let (code, _, err) = rt.cli(&["disable", "redis"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot disable module redis: it is not enabled: there is no Module object"), "{err}");

    rt.create_module("istio", json!({}), true).await;
    let (code, _, err) = rt.cli(&["disable", "istio"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("cannot disable module istio: it is managed from the control plane"), "{err}");
    assert!(rt.modules().get_opt("istio").await.unwrap().is_some(), "a central object is left alone");

    let (code, out, err) = rt.cli(&["enable", "redis", "--policy", "Ignore"]).await;
    assert_eq!(code, 0, "{err}: {out}");
    let (code, out, err) = rt.cli(&["disable", "redis"]).await;
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("Module redis deleted (policy Ignore: the module stays installed"), "{out}");
    assert!(rt.modules().get_opt("redis").await.unwrap().is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_enable_wait_follows_the_status_to_ready_or_error() {
    let rt = Runtime::start().await;
    rt.write_catalog(&catalog()).await;
    rt.install_module_kind().await;

    // Ready: each state is printed as it comes, exit 0 once the status is about this generation.
    let mut enable = Following::spawn(&rt, &["enable", "redis", "--wait"]);
    enable.line_with("Module redis created").await;
    enable.line_with("no status yet").await;
    let generation = rt.modules().get("redis").await.unwrap().metadata.generation.unwrap();
    // A status about an older generation is not the answer.
    rt.set_status("redis", json!({"state": "Ready", "source": "user", "observedGeneration": generation - 1})).await;
    enable.line_with("module redis: Ready").await;
    rt.set_status(
        "redis",
        json!({"state": "Processing", "version": "1.9.0", "message": "installing 1.10.0", "observedGeneration": generation}),
    )
    .await;
    enable.line_with("module redis: Processing 1.9.0: installing 1.10.0").await;
    rt.set_status("redis", json!({"state": "Ready", "version": "1.10.0", "message": ""})).await;
    let (code, rest, err) = enable.finish().await;
    assert_eq!(code, 0, "{rest}{err}");
    assert!(rest.contains("module redis: Ready 1.10.0"), "{rest}");

    // Error: the message, and a non-zero exit.
    let mut enable = Following::spawn(&rt, &["enable", "keda", "--wait"]);
    enable.line_with("Module keda created").await;
    let generation = rt.modules().get("keda").await.unwrap().metadata.generation.unwrap();
    rt.set_status(
        "keda",
        json!({"state": "Error", "source": "user", "message": "keda 2.15.0: image pull failed", "observedGeneration": generation}),
    )
    .await;
    let (code, _, err) = enable.finish().await;
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("module keda: Error: keda 2.15.0: image pull failed"), "{err}");

    // Nothing happens: --timeout ends it, saying what was last seen.
    let (code, _, err) = rt.cli(&["enable", "redis", "--channel", "fast", "--wait", "--timeout", "1s"]).await;
    assert_eq!(code, 1);
    // (What it saw last is the Ready of the previous generation, unless the list took longer
    // than the timeout.)
    assert!(err.contains("module redis: gave up waiting after 1s (now: "), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn modules_disable_wait_prints_what_the_removal_waits_for_until_the_object_is_gone() {
    let rt = Runtime::start().await;
    rt.write_catalog(&catalog()).await;
    rt.install_module_kind().await;
    let (code, out, err) = rt.cli(&["enable", "redis"]).await;
    assert_eq!(code, 0, "{err}: {out}");
    // What the operator does when it takes the object up.
    rt.modules()
        .patch("redis", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": [FINALIZER]}})))
        .await
        .unwrap();
    rt.set_status(
        "redis",
        json!({"state": "Ready", "source": "user", "customResourcePolicy": "CreateAndDelete", "observedGeneration": 1}),
    )
    .await;

    let mut disable = Following::spawn(&rt, &["disable", "redis", "--wait"]);
    disable.line_with("Module redis deleted (policy CreateAndDelete").await;
    rt.set_status("redis", json!({"state": "Deleting", "message": "waiting: 3 RedisConfig objects left"})).await;
    disable.line_with("module redis: Deleting: waiting: 3 RedisConfig objects left").await;
    rt.set_status("redis", json!({"message": "waiting: 1 RedisConfig object left"})).await;
    disable.line_with("waiting: 1 RedisConfig object left").await;
    let m = rt.modules().get("redis").await.unwrap();
    assert!(m.metadata.deletion_timestamp.is_some(), "the finalizer holds it");
    // The operator is done: it releases the finalizer, the object goes, the CLI returns.
    rt.modules()
        .patch("redis", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"finalizers": null}})))
        .await
        .unwrap();
    let (code, rest, err) = disable.finish().await;
    assert_eq!(code, 0, "{rest}{err}");
    assert!(rest.contains("module redis: gone"), "{rest}");

    // A central object cannot be disabled, with or without --wait; and nothing is left.
    rt.create_module("istio", json!({}), true).await;
    let (code, _, err) = rt.cli(&["disable", "istio", "--wait"]).await;
    assert_eq!(code, 1);
    assert!(err.contains("managed from the control plane"), "{err}");
    let left: Vec<String> =
        rt.modules().list(&Default::default()).await.unwrap().iter().map(|m| m.name_any()).collect();
    assert_eq!(left, ["istio"]);
}

#[test]
fn modules_help_explains_the_flow_and_is_told_apart_from_module() {
    let help = |args: &[&str]| {
        let out = std::process::Command::new(BIN).args(args).output().unwrap();
        assert!(out.status.success(), "{args:?}");
        String::from_utf8_lossy(&out.stdout).to_string()
    };
    let top = help(&["--help"]);
    let line = |name: &str| top.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap().to_string();
    assert!(line("module").contains("For module authors"), "{top}");
    assert!(line("modules").contains("For a runtime cluster's users"), "{top}");
    let modules = help(&["modules", "--help"]);
    for needle in [
        "creates the cluster-scoped Module object NAME",
        "With policy CreateAndDelete (the default)",
        "Central configuration takes precedence",
        "Not to be confused with `fleetwatch module` (singular)",
        "--kubeconfig",
        "--context",
    ] {
        assert!(modules.contains(needle), "{needle:?} not in {modules}");
    }
    let enable = help(&["modules", "enable", "--help"]);
    assert!(
        enable.contains("observedGeneration") && enable.contains("[possible values: CreateAndDelete, Ignore]"),
        "{enable}"
    );
    assert!(help(&["modules", "disable", "--help"]).contains("--wait"));
}
