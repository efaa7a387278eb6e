//! `fleetwatch module package` / `inspect` against a real registry: Debian's
//! `docker-registry` (the CNCF distribution registry) on loopback, plain HTTP and with TLS
//! (a CA from fleetwatch-certs) and htpasswd basic auth (bcrypt hashes from apache2-utils'
//! htpasswd). scripts/test.sh installs both.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::{BIN, Pki, eventually, free_port};

const REGISTRY_BIN: &str = "/usr/bin/docker-registry";

/// A registry process on 127.0.0.1 with its storage in a temporary directory; killed on drop.
struct Registry {
    child: Child,
    dir: tempfile::TempDir,
    port: u16,
}

impl Registry {
    /// Plain HTTP, anonymous.
    fn plain() -> Self {
        Self::start(tempfile::tempdir().unwrap(), "")
    }

    /// TLS with `cert`/`key` and basic auth for `user`/`password`.
    fn tls_auth(cert: &Path, key: &Path, user: &str, password: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let out = Command::new("htpasswd")
            .args(["-Bbn", user, password])
            .output()
            .expect("htpasswd (Debian's apache2-utils; scripts/test.sh installs it)");
        assert!(out.status.success(), "htpasswd: {}", String::from_utf8_lossy(&out.stderr));
        let htpasswd = dir.path().join("htpasswd");
        std::fs::write(&htpasswd, &out.stdout).unwrap();
        let extra = format!(
            "  tls:\n    certificate: {}\n    key: {}\nauth:\n  htpasswd:\n    realm: fleetwatch-test\n    path: {}\n",
            cert.display(),
            key.display(),
            htpasswd.display()
        );
        Self::start(dir, &extra)
    }

    /// Starts the registry with its config, log and storage in `dir`.
    fn start(dir: tempfile::TempDir, http_extra: &str) -> Self {
        assert!(
            Path::new(REGISTRY_BIN).exists(),
            "{REGISTRY_BIN} missing: apt-get install docker-registry (scripts/test.sh does)"
        );
        let port = free_port();
        let config = format!(
            "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {}\n  delete:\n    enabled: true\nhttp:\n  addr: 127.0.0.1:{port}\n{http_extra}",
            dir.path().join("data").display()
        );
        std::fs::write(dir.path().join("config.yml"), config).unwrap();
        let child = Self::spawn(dir.path());
        let mut r = Self { child, dir, port };
        r.wait_listening();
        r
    }

    fn spawn(dir: &Path) -> Child {
        let log = std::fs::OpenOptions::new().create(true).append(true).open(dir.join("registry.log")).unwrap();
        Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(dir.join("config.yml"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap()
    }

    fn wait_listening(&mut self) {
        let port = self.port;
        let child = &mut self.child;
        // (listening, exit status)
        let (_, exited) = eventually("docker-registry to listen").until_blocking(
            || match child.try_wait().unwrap() {
                Some(status) => (false, Some(status)),
                None => (std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), None),
            },
            |(listening, exited)| *listening || exited.is_some(),
        );
        if let Some(status) = exited {
            panic!("docker-registry exited ({status}): {}", self.log());
        }
    }

    /// Stops the registry (its storage stays).
    fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port with the same storage.
    fn restart(&mut self) {
        self.child = Self::spawn(self.dir.path());
        self.wait_listening();
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("registry.log")).unwrap_or_default()
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// The file of a blob in the registry's storage.
    fn blob_file(&self, digest: &str) -> PathBuf {
        let hex = digest.strip_prefix("sha256:").unwrap();
        self.dir.path().join("data/docker/registry/v2/blobs/sha256").join(&hex[..2]).join(hex).join("data")
    }
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `fleetwatch ARGS`: (success, stdout, stderr).
fn fleetwatch<S: AsRef<str>>(args: &[S]) -> (bool, String, String) {
    let out = Command::new(BIN)
        .args(args.iter().map(AsRef::as_ref))
        .env_remove("FLEETWATCH_LOG")
        .env_remove("RUST_LOG")
        .output()
        .unwrap();
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// Runs `fleetwatch ARGS`, expecting a failure told in exactly one line containing `needle`.
fn fails_in_one_line<S: AsRef<str>>(args: &[S], needle: &str) -> String {
    let (ok, stdout, stderr) = fleetwatch(args);
    let shown: Vec<&str> = args.iter().map(AsRef::as_ref).collect();
    assert!(!ok, "fleetwatch {shown:?} succeeded: {stdout}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "not one line: {stderr}");
    assert!(lines[0].starts_with("error: ") && lines[0].contains(needle), "{needle:?} not in {stderr}");
    lines[0].to_string()
}

/// A CustomResourceDefinition of about `bytes` bytes (a schema with many described fields).
fn big_crd(bytes: usize) -> Value {
    let mut properties = serde_json::Map::new();
    let description = "A field of the widget. ".repeat(10);
    let mut i = 0;
    while properties.len() * (description.len() + 60) < bytes {
        properties
            .insert(format!("field{i:05}"), json!({"type": "string", "description": format!("{description}{i}")}));
        i += 1;
    }
    json!({
        "apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {"group": "example.com", "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget", "listKind": "WidgetList"},
            "versions": [{"name": "v1", "served": true, "storage": true,
                "schema": {"openAPIV3Schema": {"type": "object", "properties": {"spec": {"type": "object", "properties": properties}}}}}]},
    })
}

fn deployment(namespace: &str, name: &str, image: &str) -> Value {
    json!({
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "manager", "image": image}]}}},
    })
}

fn write_yaml(path: &Path, objects: &[Value]) {
    let mut text = String::new();
    for o in objects {
        text.push_str("---\n");
        text.push_str(&serde_saphyr::to_string(o).unwrap());
    }
    std::fs::write(path, text).unwrap();
}

/// The `ref` of the printed ModuleTemplate, checked to be pinned by digest.
fn template_ref(stdout: &str, host: &str) -> String {
    let t: Value = serde_saphyr::from_str(stdout).unwrap_or_else(|e| panic!("not YAML ({e}): {stdout}"));
    assert_eq!(t["kind"], "ModuleTemplate", "{stdout}");
    let r = t["spec"]["source"]["oci"]["ref"].as_str().unwrap().to_string();
    assert!(r.starts_with(&format!("{host}/")) && r.contains("@sha256:"), "{r}");
    r
}

#[test]
fn a_2mib_crd_goes_through_a_tls_registry_with_auth_and_a_tampered_blob_is_refused() {
    let pki = Pki::new();
    let reg = Registry::tls_auth(&pki.path("hub.crt"), &pki.path("hub.key"), "fleet", "s3cret");
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("module");
    std::fs::create_dir_all(dir.join("crds")).unwrap();
    let crd = big_crd(2 << 20);
    write_yaml(&dir.join("crds/widgets.yaml"), std::slice::from_ref(&crd));
    write_yaml(
        &dir.join("operator.yaml"),
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "widgets"}}),
            deployment("widgets", "widget-operator", "example.com/widget-operator:1.0.0"),
        ],
    );
    let size = std::fs::metadata(dir.join("crds/widgets.yaml")).unwrap().len();
    assert!(size > 2 << 20, "the CRD is {size} bytes");
    std::fs::write(dir.join("README.md"), "not a manifest").unwrap();
    let default_config = work.path().join("default.yaml");
    write_yaml(
        &default_config,
        &[
            json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "default", "namespace": "widgets"}}),
        ],
    );
    let auth = work.path().join("config.json");
    let token = base64_encode("fleet:s3cret");
    std::fs::write(&auth, json!({"auths": {host.clone(): {"auth": token}}}).to_string()).unwrap();
    let wrong = work.path().join("wrong.json");
    std::fs::write(&wrong, json!({"auths": {host.clone(): {"username": "fleet", "password": "nope"}}}).to_string())
        .unwrap();
    let ca = pki.path("ca.crt");
    let push = format!("{host}/modules/widgets:1.0.0");
    let (dir_s, dc, auth_s, ca_s) = (
        dir.display().to_string(),
        default_config.display().to_string(),
        auth.display().to_string(),
        ca.display().to_string(),
    );
    let package = |auth: &str, ca: Option<&str>| {
        let mut args = vec![
            "module",
            "package",
            "--dir",
            &dir_s,
            "--name",
            "widgets",
            "--version",
            "1.0.0",
            "--manager",
            "widgets/widget-operator",
            "--default-config",
            &dc,
            "--requires-downtime",
            "--managed-resource",
            "example.com/v1/Widget",
            "--push",
            &push,
            "--registry-auth",
            auth,
        ];
        if let Some(ca) = ca {
            args.extend(["--registry-ca", ca]);
        }
        args.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };

    // The registry refuses: wrong password; and an untrusted CA.
    let args = package(&wrong.display().to_string(), Some(&ca_s));
    let line = fails_in_one_line(&args, "refused the credentials");
    assert!(line.contains(&host), "{line}");
    let args = package(&auth_s, None);
    fails_in_one_line(
        &args,
        "its TLS certificate is not signed by a trusted CA (UnknownIssuer): give its CA with --registry-ca",
    );

    // Packaged and pushed: the ModuleTemplate is printed, pinned by digest.
    let args = package(&auth_s, Some(&ca_s));
    let (ok, stdout, stderr) = fleetwatch(&args);
    assert!(ok, "package failed: {stderr}\n{}", reg.log());
    let pinned = template_ref(&stdout, &host);
    assert!(stderr.contains(&format!("pushed {pinned} (3 objects)")), "{stderr}");
    let t: Value = serde_saphyr::from_str(&stdout).unwrap();
    assert_eq!(t["metadata"]["name"], "widgets-1.0.0");
    assert_eq!(t["spec"]["requiresDowntime"], true);
    assert_eq!(t["spec"]["managedResources"], json!([{"group": "example.com", "version": "v1", "kind": "Widget"}]));
    assert_eq!(t["spec"]["manager"]["name"], "widget-operator");

    // Inspect by digest and by tag: what was packaged, the CRD intact.
    for r in [pinned.as_str(), push.as_str()] {
        let (ok, out, err) =
            fleetwatch(&["module", "inspect", r, "--registry-auth", &auth_s, "--registry-ca", &ca_s, "--objects"]);
        assert!(ok, "inspect {r}: {err}");
        assert!(out.starts_with(&format!("artifact:          {pinned}\n")), "{out}");
        for want in [
            "module:            widgets\n",
            "version:           1.0.0\n",
            "requires downtime: yes\n",
            "manager:           Deployment widgets/widget-operator\n",
            "managed resources: example.com/v1/Widget\n",
            "default config:    Widget widgets/default (example.com/v1)\n",
            "objects:           3\n",
            // In apply order: the Namespace, the CRD, the rest as given.
            "  Namespace widgets (v1)\n  CustomResourceDefinition widgets.example.com (apiextensions.k8s.io/v1)\n",
            "  Deployment widgets/widget-operator (apps/v1)\n",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{}", &out[..out.len().min(2000)]);
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&out[out.find("---\n").unwrap()..]).unwrap();
        assert_eq!(docs[1], crd, "the CRD came back changed");
        assert_eq!(docs[2]["metadata"]["labels"]["app.kubernetes.io/version"], "1.0.0");
    }
    fails_in_one_line(
        &["module", "inspect", &pinned, "--registry-auth", &wrong.display().to_string(), "--registry-ca", &ca_s],
        "refused the credentials",
    );

    // Credential helpers, as Docker runs them: `credHelpers` named by --registry-auth, and
    // `credsStore` in Docker's own config ($DOCKER_CONFIG) when no --registry-auth is given.
    let bin = work.path().join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = |name: &str, body: &str| {
        use std::os::unix::fs::PermissionsExt;
        let path = bin.join(format!("docker-credential-{name}"));
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    };
    // The helper answers only for the registry it is asked about, on stdin.
    helper(
        "fwtest",
        &format!(
            "read server; [ \"$server\" = \"{host}\" ] || {{ echo \"no credentials for $server\" >&2; exit 1; }}\n\
             echo '{{\"ServerURL\":\"{host}\",\"Username\":\"fleet\",\"Secret\":\"s3cret\"}}'"
        ),
    );
    helper("fwbroken", "read server; echo 'credentials not found in native keychain' >&2; exit 1");
    let path = format!("{}:{}", bin.display(), std::env::var("PATH").unwrap());
    let with_env = |args: &[&str], env: &[(&str, &str)]| {
        let mut cmd = Command::new(BIN);
        cmd.args(args).env_remove("FLEETWATCH_LOG").env_remove("RUST_LOG").env_remove("FLEETWATCH_REGISTRY_AUTH");
        cmd.env("PATH", &path).env("HOME", work.path());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output().unwrap();
        (out.status.success(), String::from_utf8_lossy(&out.stderr).to_string())
    };
    let helpers = work.path().join("helpers.json");
    std::fs::write(&helpers, json!({"credHelpers": {host.clone(): "fwtest"}}).to_string()).unwrap();
    let (ok, err) = with_env(
        &["module", "inspect", &pinned, "--registry-auth", &helpers.display().to_string(), "--registry-ca", &ca_s],
        &[],
    );
    assert!(ok, "credHelpers: {err}");
    let docker_dir = work.path().join("docker");
    std::fs::create_dir_all(&docker_dir).unwrap();
    std::fs::write(docker_dir.join("config.json"), json!({"credsStore": "fwtest"}).to_string()).unwrap();
    let docker_env = [("DOCKER_CONFIG", docker_dir.to_str().unwrap())];
    let (ok, err) = with_env(&["module", "inspect", &pinned, "--registry-ca", &ca_s], &docker_env);
    assert!(ok, "credsStore in $DOCKER_CONFIG: {err}");
    // A helper that fails is named with what it said; one that is not there too.
    std::fs::write(docker_dir.join("config.json"), json!({"credsStore": "fwbroken"}).to_string()).unwrap();
    let (ok, err) = with_env(&["module", "inspect", &pinned, "--registry-ca", &ca_s], &docker_env);
    assert!(!ok);
    assert!(
        err.contains(&format!(
            "the credential helper docker-credential-fwbroken failed for {host}: credentials not found in native keychain"
        )),
        "{err}"
    );
    std::fs::write(docker_dir.join("config.json"), json!({"credHelpers": {host.clone(): "fwmissing"}}).to_string())
        .unwrap();
    let (ok, err) = with_env(&["module", "inspect", &pinned, "--registry-ca", &ca_s], &docker_env);
    assert!(!ok && err.contains("docker-credential-fwmissing") && err.contains("is it on PATH?"), "{err}");
    // Without any config (HOME has none): anonymous, which this registry refuses.
    let (ok, err) = with_env(&["module", "inspect", &pinned, "--registry-ca", &ca_s], &[]);
    assert!(!ok && err.contains("refused the credentials"), "{err}");
    fails_in_one_line(
        &[
            "module",
            "inspect",
            &format!("{host}/modules/widgets:9.9.9"),
            "--registry-auth",
            &auth_s,
            "--registry-ca",
            &ca_s,
        ],
        "not found in the registry",
    );

    // Tamper with the objects' blob in the registry's storage (same size): refused.
    let manifest = manifest_of(&reg, &pinned);
    let layer = manifest["layers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["mediaType"] == "application/vnd.fleetwatch.module.manifest.v1+json")
        .unwrap();
    let file = reg.blob_file(layer["digest"].as_str().unwrap());
    let mut data = std::fs::read(&file).unwrap();
    let at = data.windows(6).position(|w| w == b"widget").unwrap();
    data[at..at + 6].copy_from_slice(b"gadget");
    std::fs::write(&file, &data).unwrap();
    let line = fails_in_one_line(
        &["module", "inspect", &pinned, "--registry-auth", &auth_s, "--registry-ca", &ca_s],
        "digest mismatch",
    );
    assert!(line.contains(layer["digest"].as_str().unwrap()), "{line}");
}

/// The artifact's manifest, read from the registry's storage (its digest names its file).
fn manifest_of(reg: &Registry, pinned: &str) -> Value {
    let digest = pinned.rsplit_once('@').unwrap().1;
    serde_json::from_slice(&std::fs::read(reg.blob_file(digest)).unwrap()).unwrap()
}

fn base64_encode(s: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[test]
fn a_helm_chart_is_rendered_with_values_at_packaging_time() {
    let reg = Registry::plain();
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let chart = work.path().join("gizmo");
    std::fs::create_dir_all(chart.join("templates")).unwrap();
    std::fs::write(chart.join("Chart.yaml"), "apiVersion: v2\nname: gizmo\nversion: 0.3.0\nappVersion: \"0.3.0\"\n")
        .unwrap();
    std::fs::write(chart.join("values.yaml"), "image: example.com/gizmo:default\nreplicas: 1\n").unwrap();
    std::fs::write(
        chart.join("templates/manager.yaml"),
        r#"apiVersion: apps/v1
kind: Deployment
metadata:
  name: {{ .Release.Name }}-manager
  namespace: {{ .Release.Namespace }}
spec:
  replicas: {{ .Values.replicas }}
  selector: {matchLabels: {app: gizmo}}
  template:
    metadata: {labels: {app: gizmo}}
    spec:
      containers:
      - name: manager
        image: {{ .Values.image }}
---
apiVersion: v1
kind: ServiceAccount
metadata:
  name: {{ .Release.Name }}
  namespace: {{ .Release.Namespace }}
"#,
    )
    .unwrap();
    let values = work.path().join("prod.yaml");
    std::fs::write(&values, "image: example.com/gizmo:0.3.0\nreplicas: 2\n").unwrap();
    let push = format!("{host}/modules/gizmo:0.3.0");
    let (chart_s, values_s) = (chart.display().to_string(), values.display().to_string());
    let package = [
        "module",
        "package",
        "--chart",
        &chart_s,
        "--values",
        &values_s,
        "--name",
        "gizmo",
        "--version",
        "0.3.0",
        "--manager",
        "gizmo-system/gizmo-manager",
        "--push",
        &push,
    ];
    let (ok, stdout, stderr) = fleetwatch(&package);
    assert!(ok, "package failed: {stderr}\n{}", reg.log());
    let pinned = template_ref(&stdout, &host);
    let (ok, out, err) = fleetwatch(&["module", "inspect", &pinned, "--objects"]);
    assert!(ok, "{err}");
    assert!(out.contains("  Deployment gizmo-system/gizmo-manager (apps/v1)\n"), "{out}");
    assert!(out.contains("  ServiceAccount gizmo-system/gizmo (v1)\n"), "{out}");
    // The chart's target namespace is put in, as `helm install --create-namespace` would.
    assert!(out.contains("  Namespace gizmo-system (v1)\n"), "{out}");
    assert!(stderr.contains("added Namespace gizmo-system to the artifact"), "{stderr}");
    assert!(out.contains("requires downtime: no\n") && out.contains("managed resources: none\n"), "{out}");
    let docs: Vec<Value> = serde_saphyr::from_multiple(&out[out.find("---\n").unwrap()..]).unwrap();
    let manager = docs.iter().find(|d| d["kind"] == "Deployment").unwrap();
    assert_eq!(manager["spec"]["template"]["spec"]["containers"][0]["image"], "example.com/gizmo:0.3.0");
    assert_eq!(manager["spec"]["replicas"], 2);

    // Packaging the same input again gives the same digest.
    let (ok, again, _) = fleetwatch(&package);
    assert!(ok);
    assert_eq!(template_ref(&again, &host), pinned);

    // A chart that does not render: helm's reason, on one line.
    std::fs::write(chart.join("templates/broken.yaml"), "{{ required \"broken.value is required\" .Values.broken }}\n")
        .unwrap();
    fails_in_one_line(
        &[
            "module",
            "package",
            "--chart",
            &chart_s,
            "--name",
            "gizmo",
            "--version",
            "0.3.1",
            "--manager",
            "gizmo-system/gizmo-manager",
            "--push",
            &push,
        ],
        "helm template failed: Error: execution error at (gizmo/templates/broken.yaml:1:3): broken.value is required",
    );
}

#[test]
fn bad_inputs_are_one_clear_line() {
    let reg = Registry::plain();
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let push = format!("{host}/modules/empty:1.0.0");
    let empty = work.path().join("empty");
    std::fs::create_dir_all(&empty).unwrap();
    std::fs::write(empty.join("nothing.yaml"), "# nothing here\n---\n").unwrap();
    let empty_s = empty.display().to_string();
    let base = |dir: &str, manager: &str| -> Vec<String> {
        [
            "module",
            "package",
            "--dir",
            dir,
            "--name",
            "empty",
            "--version",
            "1.0.0",
            "--manager",
            manager,
            "--push",
            &push,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    };
    let run = |args: Vec<String>, needle: &str| {
        fails_in_one_line(&args, needle);
    };
    run(base(&empty_s, "ns/op"), "no Kubernetes objects found (in 1 *.yaml, *.yml, *.json files)");

    let objects = work.path().join("objects");
    std::fs::create_dir_all(&objects).unwrap();
    write_yaml(&objects.join("op.yaml"), &[deployment("ns", "op", "example.com/op:1")]);
    let objects_s = objects.display().to_string();
    run(base(&objects_s, "ns/other"), "manager: no Deployment (apps/v1) ns/other among the objects");
    std::fs::write(objects.join("bad.yaml"), "apiVersion: v1\nkind: ConfigMap\nmetadata: {labels: {}}\n").unwrap();
    run(base(&objects_s, "ns/op"), "bad.yaml: document 1: ConfigMap (no name) has no metadata.name");
    std::fs::write(objects.join("bad.yaml"), "a: [\n").unwrap();
    run(base(&objects_s, "ns/op"), "bad.yaml: not YAML");
    let mut crd = big_crd(1000);
    crd["spec"]["versions"] = json!("v1");
    write_yaml(&objects.join("bad.yaml"), &[crd]);
    run(base(&objects_s, "ns/op"), "is not a valid CustomResourceDefinition");
    std::fs::remove_file(objects.join("bad.yaml")).unwrap();

    // A registry that is not there, and a reference that is not one.
    let mut args = base(&objects_s, "ns/op");
    let gone = format!("127.0.0.1:{}/modules/x:1.0.0", free_port());
    *args.last_mut().unwrap() = gone;
    run(args, "cannot push to");
    let mut args = base(&objects_s, "ns/op");
    *args.last_mut().unwrap() = "Not A Ref".into();
    run(args, "--push: \"Not A Ref\" is not an OCI reference");
    run(vec!["module".into(), "inspect".into(), format!("{host}/modules/none:1.0.0")], "not found in the registry");
    // With the bad file gone, the same command packages.
    let (ok, _, err) = fleetwatch(&base(&objects_s, "ns/op"));
    assert!(ok, "{err}");
}

/// What the operator's tests share: a sim control plane (the CRDs, namespace `kcp`, the
/// runtime's kubeconfig Secret), a sim runtime cluster `rt1` whose Deployments roll out, and
/// `fleetwatch lifecycle` against them (also used by hostile_registry.rs).
pub(crate) struct Operated {
    _cp_sim: fleetwatch_sim::SimCluster,
    _rt_sim: fleetwatch_sim::SimCluster,
    pub(crate) cp_kc: PathBuf,
    pub(crate) cp: kube::Client,
    rt: kube::Client,
    pub(crate) log: PathBuf,
    _kubelet: tokio_util::sync::DropGuard,
}

impl Operated {
    pub(crate) async fn start(pki: &Pki) -> Self {
        let (cp_sim, cp_kc) = crate::support::sim_cluster(pki, "control-plane").await;
        let (rt_sim, rt_kc) = crate::support::sim_cluster(pki, "rt1").await;
        let cp = cp_sim.client().await.unwrap();
        let rt = rt_sim.client().await.unwrap();
        let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
        crate::support::kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
        let kubelet = tokio_util::sync::CancellationToken::new();
        tokio::spawn(fleetwatch_sim::roll_out_deployments(rt.clone(), Duration::ZERO, kubelet.clone()));
        let o = Self {
            _cp_sim: cp_sim,
            _rt_sim: rt_sim,
            cp_kc,
            cp,
            rt,
            log: pki.path("lifecycle.log"),
            _kubelet: kubelet.drop_guard(),
        };
        o.apply(&json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "kcp"}}));
        o.apply(
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rt1-kubeconfig", "namespace": "kcp"},
            "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}}),
        );
        o
    }

    pub(crate) fn apply(&self, v: &Value) {
        crate::support::apply_json(&self.cp_kc, v);
    }

    /// `module`'s ModuleReleaseMeta, offering `version` on `regular`.
    pub(crate) fn release(&self, module: &str, version: &str) {
        self.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
            "metadata": {"name": module, "namespace": "kcp"},
            "spec": {"moduleName": module, "channels": [{"channel": "regular", "version": version}]}}));
    }

    /// The Runtime `rt1` with `module`.
    fn runtime(&self, module: &str) {
        self.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "rt1", "namespace": "kcp"},
            "spec": {"clusterId": "rt1", "kubeconfigSecret": {"name": "rt1-kubeconfig"}, "modules": [{"name": module}]}}));
    }

    /// Starts `fleetwatch lifecycle` (no leader election) with `extra` flags.
    fn lifecycle(&self, extra: &[&str]) -> crate::support::Proc {
        let mut args: Vec<String> =
            ["lifecycle", "--control-plane-kubeconfig", self.cp_kc.to_str().unwrap(), "--leader-elect=false"]
                .iter()
                .map(|s| s.to_string())
                .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let p = crate::support::Proc::spawn(&args, self.log.clone());
        p.wait_stdout("lifecycle operator running", Duration::from_secs(10));
        p
    }

    /// Waits (up to 45 s) until `module`'s status in `rt1` satisfies `cond`.
    async fn wait(
        &self,
        module: &str,
        what: &str,
        cond: impl Fn(&fleetwatch_api::ModuleStatus) -> bool,
    ) -> fleetwatch_api::ModuleStatus {
        let runtimes: kube::Api<fleetwatch_api::Runtime> = kube::Api::namespaced(self.cp.clone(), "kcp");
        eventually(format!("{module}: {what}"))
            .context(|| format!("lifecycle log:\n{}", std::fs::read_to_string(&self.log).unwrap_or_default()))
            .until(
                async || {
                    let status = runtimes.get_status("rt1").await.ok().and_then(|r| r.status);
                    status.and_then(|s| s.modules.into_iter().find(|m| m.name == module))
                },
                |m| m.as_ref().is_some_and(&cond),
            )
            .await
            .expect("until returns only what satisfies the condition")
    }
}

/// The lifecycle operator installs modules whose templates name an artifact by digest
/// (`spec.source.oci.ref`): real registry, sim control plane and runtime cluster, real
/// lifecycle process. Upgrades pull the next digest; without the registry the cached
/// version keeps being reconciled (also after a restart, from the disk cache) and an
/// upgrade waits naming the registry; a tampered blob is an `Error`, nothing applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_installs_by_digest_and_keeps_reconciling_without_the_registry() {
    use fleetwatch_api::State;
    use kube::api::{Api, DynamicObject};

    let mut reg = Registry::plain();
    let host = reg.host();
    let pki = Pki::new();
    let work = tempfile::tempdir().unwrap();
    let crd = big_crd(2 << 20);
    // Four versions, all pushed now: a 2 MiB CRD, a Namespace and the manager.
    let package = |version: &str| -> (String, Value) {
        let dir = work.path().join(version);
        std::fs::create_dir_all(&dir).unwrap();
        write_yaml(&dir.join("crds.yaml"), std::slice::from_ref(&crd));
        write_yaml(
            &dir.join("operator.yaml"),
            &[
                json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "widgets"}}),
                deployment("widgets", "widget-operator", &format!("example.com/widget-operator:{version}")),
            ],
        );
        let (ok, stdout, stderr) = fleetwatch(&[
            "module",
            "package",
            "--dir",
            dir.to_str().unwrap(),
            "--name",
            "widgets",
            "--version",
            version,
            "--manager",
            "widgets/widget-operator",
            "--managed-resource",
            "example.com/v1/Widget",
            "--push",
            &format!("{host}/modules/widgets:{version}"),
            "--namespace",
            "kcp",
        ]);
        assert!(ok, "package {version}: {stderr}\n{}", reg.log());
        let pinned = template_ref(&stdout, &host);
        (pinned, serde_saphyr::from_str(&stdout).unwrap())
    };
    let versions: Vec<(String, Value)> = ["1.0.0", "2.0.0", "3.0.0", "4.0.0"].into_iter().map(package).collect();

    let op = Operated::start(&pki).await;
    op.apply(&versions[0].1);
    op.release("widgets", "1.0.0");
    op.runtime("widgets");
    let cache = work.path().join("artifact-cache");
    let flags = ["--resync", "2", "--artifact-cache", cache.to_str().unwrap()];
    let mut lifecycle = op.lifecycle(&flags);
    let deployments: Api<DynamicObject> = Api::namespaced_with(
        op.rt.clone(),
        "widgets",
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("apps", "v1", "Deployment")),
    );
    let crds_in_rt: Api<DynamicObject> = Api::all_with(
        op.rt.clone(),
        &kube::discovery::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
        )),
    );
    let installed = |v: &'static str| -> Box<dyn Fn(&fleetwatch_api::ModuleStatus) -> bool> {
        Box::new(move |m| m.state == State::Ready && m.installed_version.as_deref() == Some(v))
    };
    let manager_version = || {
        let deployments = deployments.clone();
        async move {
            deployments
                .get_opt("widget-operator")
                .await
                .unwrap()
                .and_then(|d| d.metadata.labels?.get("app.kubernetes.io/version").cloned())
        }
    };

    // Installed from the registry: the 2 MiB CRD and the manager are in the runtime cluster.
    op.wait("widgets", "1.0.0 installed", installed("1.0.0")).await;
    let got = crds_in_rt.get("widgets.example.com").await.unwrap();
    assert_eq!(got.data["spec"]["versions"][0]["schema"], crd["spec"]["versions"][0]["schema"]);
    assert_eq!(manager_version().await.as_deref(), Some("1.0.0"));
    let cached = |dir: &Path| {
        std::fs::read_dir(dir)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().starts_with("sha256-"))
            .count()
    };
    assert_eq!(cached(&cache), 1);

    // Upgrade: the channel moves to a second digest.
    op.apply(&versions[1].1);
    op.release("widgets", "2.0.0");
    op.wait("widgets", "2.0.0 installed", installed("2.0.0")).await;
    assert_eq!(manager_version().await.as_deref(), Some("2.0.0"));
    assert_eq!(cached(&cache), 2);

    // The registry goes away, and the operator restarts: the running version comes from the
    // disk cache; drift is repaired (a deleted manager comes back).
    reg.stop();
    drop(lifecycle);
    lifecycle = op.lifecycle(&flags);
    deployments.delete("widget-operator", &Default::default()).await.unwrap();
    eventually("the deleted manager to come back at 2.0.0")
        .context(|| lifecycle.stderr())
        .until(async || manager_version().await, |v| v.as_deref() == Some("2.0.0"))
        .await;

    // An upgrade to a digest not in the cache waits, naming the registry; 2.0.0 keeps running.
    op.apply(&versions[2].1);
    op.release("widgets", "3.0.0");
    let reg_host = host.clone();
    let m = op
        .wait("widgets", "the upgrade to wait for the registry", move |m| {
            m.state == State::Warning && m.message.contains("waiting for artifact") && m.message.contains(&reg_host)
        })
        .await;
    assert!(m.message.contains(&versions[2].0) && m.message.contains("unreachable"), "{}", m.message);
    assert_eq!(m.installed_version.as_deref(), Some("2.0.0"));
    assert_eq!(manager_version().await.as_deref(), Some("2.0.0"));

    // The registry is back: the retry (with backoff) installs 3.0.0.
    reg.restart();
    op.wait("widgets", "3.0.0 installed once the registry is back", installed("3.0.0")).await;

    // A blob changed in the registry: refused with Error, nothing applied.
    let manifest = manifest_of(&reg, &versions[3].0);
    let layer = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
    let file = reg.blob_file(&layer);
    let mut data = std::fs::read(&file).unwrap();
    let at = data.windows(6).position(|w| w == b"widget").unwrap();
    data[at..at + 6].copy_from_slice(b"gadget");
    std::fs::write(&file, &data).unwrap();
    op.apply(&versions[3].1);
    op.release("widgets", "4.0.0");
    let m = op
        .wait("widgets", "the tampered artifact to be refused", |m| {
            m.state == State::Error && m.message.contains("digest mismatch")
        })
        .await;
    assert!(m.message.contains(&layer), "{}", m.message);
    assert_eq!(m.installed_version.as_deref(), Some("3.0.0"));
    assert_eq!(manager_version().await.as_deref(), Some("3.0.0"));

    // A template whose spec disagrees with its artifact's annotations: Error, with the field.
    let mut wrong = versions[2].1.clone();
    wrong["metadata"]["name"] = json!("widgets-3.0.1");
    wrong["spec"]["version"] = json!("3.0.1");
    op.apply(&wrong);
    op.release("widgets", "3.0.1");
    let m = op
        .wait("widgets", "the disagreeing template to be refused", |m| {
            m.state == State::Error && m.message.contains("version is 3.0.0 in the artifact, 3.0.1 in spec.version")
        })
        .await;
    assert_eq!(m.installed_version.as_deref(), Some("3.0.0"));

    // A ref by tag, or both inline objects and a ref: the template says it is not usable.
    let mut tagged = versions[0].1.clone();
    tagged["metadata"]["name"] = json!("widgets-tagged");
    tagged["spec"]["source"]["oci"]["ref"] = json!(format!("{host}/modules/widgets:1.0.0"));
    let mut both = versions[0].1.clone();
    both["metadata"]["name"] = json!("widgets-both");
    both["spec"]["manifest"] = json!([{"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "x"}}]);
    let templates: Api<fleetwatch_api::ModuleTemplate> = Api::namespaced(op.cp.clone(), "kcp");
    for (t, needle) in [(tagged, "has no digest: a module version must be immutable"), (both, "are both given")] {
        op.apply(&t);
        let name = t["metadata"]["name"].as_str().unwrap();
        eventually(format!("{name} to say Usable=False"))
            .until(
                async || templates.get_status(name).await.unwrap().status.map(|s| s.conditions).unwrap_or_default(),
                |conditions| {
                    conditions.iter().any(|c| {
                        c.type_ == "Usable"
                            && c.status == "False"
                            && c.reason == "InvalidSpec"
                            && c.message.contains(needle)
                    })
                },
            )
            .await;
    }
    drop(lifecycle);
}

/// A template's `pullSecret` gives the operator the registry's credentials (TLS registry
/// with basic auth, its CA given with `--registry-ca`): a missing Secret and a wrong
/// password are the module's `Error` with the reason; the right one installs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pull_secret_gives_the_operator_the_registry_credentials() {
    use fleetwatch_api::State;

    let pki = Pki::new();
    let reg = Registry::tls_auth(&pki.path("hub.crt"), &pki.path("hub.key"), "fleet", "s3cret");
    let host = reg.host();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("module");
    std::fs::create_dir_all(&dir).unwrap();
    write_yaml(
        &dir.join("operator.yaml"),
        &[
            json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "gadgets"}}),
            deployment("gadgets", "gadget-operator", "example.com/gadget-operator:1.0.0"),
        ],
    );
    let config = |password: &str| json!({"auths": {host.clone(): {"username": "fleet", "password": password}}});
    let auth = work.path().join("config.json");
    std::fs::write(&auth, config("s3cret").to_string()).unwrap();
    let (ok, stdout, stderr) = fleetwatch(&[
        "module",
        "package",
        "--dir",
        dir.to_str().unwrap(),
        "--name",
        "gadgets",
        "--version",
        "1.0.0",
        "--manager",
        "gadgets/gadget-operator",
        "--push",
        &format!("{host}/modules/gadgets:1.0.0"),
        "--registry-auth",
        auth.to_str().unwrap(),
        "--registry-ca",
        pki.path("ca.crt").to_str().unwrap(),
    ]);
    assert!(ok, "package: {stderr}\n{}", reg.log());
    let mut template: Value = serde_saphyr::from_str(&stdout).unwrap();
    template["spec"]["source"]["oci"]["pullSecret"] = json!("regcred");

    let op = Operated::start(&pki).await;
    op.apply(&template);
    op.release("gadgets", "1.0.0");
    op.runtime("gadgets");
    let _lifecycle = op.lifecycle(&["--registry-ca", pki.path("ca.crt").to_str().unwrap()]);
    let error_with =
        |needle: String| move |m: &fleetwatch_api::ModuleStatus| m.state == State::Error && m.message.contains(&needle);
    op.wait("gadgets", "the missing Secret to be named", error_with("pull secret kcp/regcred: not found".into())).await;
    let secret = |password: &str| {
        json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
            "metadata": {"name": "regcred", "namespace": "kcp"},
            "stringData": {".dockerconfigjson": config(password).to_string()}})
    };
    op.apply(&secret("wrong"));
    op.wait("gadgets", "the wrong password to be refused", error_with(format!("{host} refused the credentials"))).await;
    // A Secret naming a credential helper is refused with the reason; the operator runs none.
    let helper_secret = json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/dockerconfigjson",
        "metadata": {"name": "regcred", "namespace": "kcp"},
        "stringData": {".dockerconfigjson": json!({"credHelpers": {host.clone(): "sh"}}).to_string()}});
    op.apply(&helper_secret);
    op.wait(
        "gadgets",
        "the credential helper to be refused",
        error_with(format!("sends {host} to the credential helper docker-credential-sh, which is not run here")),
    )
    .await;
    op.apply(&secret("s3cret"));
    op.wait("gadgets", "1.0.0 installed with the Secret's credentials", |m| {
        m.state == State::Ready && m.installed_version.as_deref() == Some("1.0.0")
    })
    .await;
}
