//! `fleetwatch module package` / `inspect` against a real registry: Debian's
//! `docker-registry` (the CNCF distribution registry) on loopback, plain HTTP and with TLS
//! (a CA from fleetwatch-certs) and htpasswd basic auth (bcrypt hashes from apache2-utils'
//! htpasswd). scripts/test.sh installs both.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::support::{BIN, Pki, free_port};

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
        let config_path = dir.path().join("config.yml");
        std::fs::write(&config_path, config).unwrap();
        let log = std::fs::File::create(dir.path().join("registry.log")).unwrap();
        let child = Command::new(REGISTRY_BIN)
            .arg("serve")
            .arg(&config_path)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        let mut r = Self { child, dir, port };
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = r.child.try_wait().unwrap() {
                panic!("docker-registry exited ({status}): {}", r.log());
            }
            assert!(Instant::now() < deadline, "docker-registry did not listen in 30s: {}", r.log());
            std::thread::sleep(Duration::from_millis(20));
        }
        r
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
            "  CustomResourceDefinition widgets.example.com (apiextensions.k8s.io/v1)\n",
            "  Namespace widgets (v1)\n",
            "  Deployment widgets/widget-operator (apps/v1)\n",
        ] {
            assert!(out.contains(want), "{want:?} not in:\n{}", &out[..out.len().min(2000)]);
        }
        let docs: Vec<Value> = serde_saphyr::from_multiple(&out[out.find("---\n").unwrap()..]).unwrap();
        assert_eq!(docs[0], crd, "the CRD came back changed");
        assert_eq!(docs[2]["metadata"]["labels"]["app.kubernetes.io/version"], "1.0.0");
    }
    fails_in_one_line(
        &["module", "inspect", &pinned, "--registry-auth", &wrong.display().to_string(), "--registry-ca", &ca_s],
        "refused the credentials",
    );
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
