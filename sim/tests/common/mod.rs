//! Helpers shared by the integration tests: a SimCluster with a kubeconfig on disk and a
//! way to run the real kubectl against it.
#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output};

use fleetwatch_sim::{SimCluster, SimOptions};

pub const KUBECTL: &str = "/usr/bin/kubectl";

/// A ConfigMap manifest the kubectl scenarios apply and change.
pub const CM: &str = r#"
apiVersion: v1
kind: ConfigMap
metadata:
  name: demo
  labels: {app: web}
data:
  a: "1"
"#;

/// A running cluster plus a private directory for its kubeconfig and kubectl's cache.
pub struct Env {
    pub sim: SimCluster,
    pub dir: PathBuf,
    pub kubeconfig: PathBuf,
}

impl Env {
    pub async fn start(opts: SimOptions) -> Env {
        let sim = SimCluster::start(opts).await.expect("sim starts");
        let dir = std::env::temp_dir().join(format!("fw-sim-test-{}-{}", std::process::id(), rand_suffix()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let kubeconfig = dir.join("kubeconfig");
        sim.write_kubeconfig(&kubeconfig).expect("kubeconfig written");
        Env { sim, dir, kubeconfig }
    }

    /// Runs kubectl with this cluster's kubeconfig and a private cache dir.
    pub fn kubectl(&self, args: &[&str]) -> Output {
        self.kubectl_stdin(args, None)
    }

    pub fn kubectl_stdin(&self, args: &[&str], stdin: Option<&str>) -> Output {
        self.kubectl_as(&self.kubeconfig, args, stdin)
    }

    /// Runs kubectl with another kubeconfig (e.g. a ServiceAccount's) and its own cache.
    pub fn kubectl_as(&self, kubeconfig: &std::path::Path, args: &[&str], stdin: Option<&str>) -> Output {
        use std::io::Write;
        let cache = self.dir.join(format!("cache-{}", kubeconfig.file_name().and_then(|f| f.to_str()).unwrap_or("x")));
        let mut cmd = Command::new(KUBECTL);
        cmd.arg("--kubeconfig").arg(kubeconfig).arg("--cache-dir").arg(cache).args(args);
        cmd.stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut child = cmd.spawn().expect("kubectl runs");
        if let Some(input) = stdin {
            child.stdin.take().expect("stdin").write_all(input.as_bytes()).expect("write stdin");
        } else {
            drop(child.stdin.take());
        }
        child.wait_with_output().expect("kubectl output")
    }

    /// Runs kubectl and expects success; returns stdout.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(out.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Applies a manifest given on stdin; returns stdout.
    pub fn apply(&self, manifest: &str, extra: &[&str]) -> String {
        let mut args = vec!["apply", "-f", "-"];
        args.extend_from_slice(extra);
        let out = self.kubectl_stdin(&args, Some(manifest));
        assert!(out.status.success(), "kubectl apply failed: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Runs kubectl and expects failure; returns stderr.
    pub fn fails(&self, args: &[&str]) -> String {
        let out = self.kubectl(args);
        assert!(
            !out.status.success(),
            "kubectl {args:?} unexpectedly succeeded: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// `kubectl get ... -o json` parsed.
    pub fn get_json(&self, args: &[&str]) -> serde_json::Value {
        let mut a = vec!["get"];
        a.extend_from_slice(args);
        a.extend_from_slice(&["-o", "json"]);
        serde_json::from_str(&self.ok(&a)).expect("kubectl printed JSON")
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn rand_suffix() -> u64 {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u64)
        .unwrap_or(0);
    t ^ (N.fetch_add(1, Ordering::Relaxed) << 32)
}

pub const CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

/// A CRD with a structural schema: enum, default, required, bounds, a map, a status.
pub const RUNTIME_CRD: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: runtimes.fleetwatch.io
spec:
  group: fleetwatch.io
  scope: Namespaced
  names: {plural: runtimes, singular: runtime, kind: Runtime, shortNames: [rt]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources: {status: {}}
    schema:
      openAPIV3Schema:
        type: object
        description: Runtime is one runtime cluster.
        properties:
          spec:
            type: object
            description: Desired state of the runtime.
            required: [name]
            properties:
              name: {type: string, maxLength: 20, description: Name of the runtime.}
              mode: {type: string, enum: [a, b], default: a, description: Upgrade mode.}
              replicas: {type: integer, minimum: 1, default: 1}
              template:
                type: object
                description: What every module gets.
                properties:
                  labels: {type: object, additionalProperties: {type: string}}
          status:
            type: object
            properties:
              ready: {type: boolean}
"#;
