//! The lifecycle operator against a hostile OCI registry on loopback (issue 44, item 1): a
//! small HTTP server in this test serves what a registry under an attacker's control would —
//! a layer streamed far past its descriptor's size without Content-Length, many large layers,
//! an artifact whose layers add up past the bound, a giant manifest — and holds several
//! honest-looking large pulls open at once. The real `fleetwatch lifecycle` process pulls
//! them; each module must end in `Error` with the refusal's reason, and the operator's peak
//! RSS (VmHWM) stays under a bound derived from its configured limits.
//!
//! The streams are a few hundred MiB at most (what an operator that buffered them would
//! hold is then well over the bound, and they cost little on loopback), not the 1.5 GiB of
//! the adversarial run: a reader that bounds what it reads reads the same few bytes of both.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_api::{ModuleStatus, Runtime, State};
use fleetwatch_lifecycle::artifact::{DEFAULT_CONFIG_MEDIA_TYPE, MANIFEST_MEDIA_TYPE, ModuleArtifact, sha256};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::modules::Operated;
use crate::support::{Pki, Proc, eventually};

const MIB: u64 = 1 << 20;
/// `--artifact-pull-max-bytes` given to the operator (as its environment variable).
const PULL_MAX: u64 = 64 * MIB;
/// `--artifact-memory-max-bytes` given to the operator.
const MEMORY_MAX: u64 = 8 * MIB;
/// What the operator may take on top of its idle RSS and its configured bounds: its own
/// work besides pulls (runtime clients, reconciles, status writes) and the allocator.
const SLACK: u64 = 100 * MIB;

/// What the registry answers for a path.
#[derive(Clone)]
enum Body {
    /// These bytes, with Content-Length.
    Bytes(Arc<Vec<u8>>),
    /// `prefix`, `len` bytes of `fill`, `suffix`; with Content-Length only if `length`; the
    /// stream waits at `hold_at` bytes of fill until the registry is released.
    Stream { prefix: Arc<Vec<u8>>, fill: u8, len: u64, suffix: Arc<Vec<u8>>, length: bool, hold_at: Option<u64> },
}

/// The hostile registry: bodies by `manifests/REF` and `blobs/DIGEST` (any repository), the
/// bytes it sent of each, how many streams wait at their hold point.
struct Hostile {
    port: u16,
    routes: Arc<Mutex<HashMap<String, Body>>>,
    sent: Arc<Mutex<HashMap<String, u64>>>,
    held: Arc<AtomicUsize>,
    release: tokio::sync::watch::Sender<bool>,
}

impl Hostile {
    async fn start() -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let routes: Arc<Mutex<HashMap<String, Body>>> = Default::default();
        let sent: Arc<Mutex<HashMap<String, u64>>> = Default::default();
        let held = Arc::new(AtomicUsize::new(0));
        let (release, released) = tokio::sync::watch::channel(false);
        let (r, s, h) = (routes.clone(), sent.clone(), held.clone());
        tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                let (r, s, h, released) = (r.clone(), s.clone(), h.clone(), released.clone());
                tokio::spawn(serve(conn, r, s, h, released));
            }
        });
        Self { port, routes, sent, held, release }
    }

    fn host(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    fn route(&self, key: String, body: Body) {
        self.routes.lock().unwrap().insert(key, body);
    }

    fn sent(&self, key: &str) -> u64 {
        self.sent.lock().unwrap().get(key).copied().unwrap_or(0)
    }
}

/// One request (each connection is closed after its answer).
async fn serve(
    mut conn: tokio::net::TcpStream,
    routes: Arc<Mutex<HashMap<String, Body>>>,
    sent: Arc<Mutex<HashMap<String, u64>>>,
    held: Arc<AtomicUsize>,
    mut released: tokio::sync::watch::Receiver<bool>,
) {
    let mut req = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        let Ok(n) = conn.read(&mut buf).await else { return };
        req.extend_from_slice(&buf[..n]);
        // A TLS ClientHello (the operator asks whether a loopback registry speaks TLS) is
        // answered at once, in plain HTTP.
        let http = req.starts_with(b"GET ") || req.starts_with(b"HEAD ");
        if n == 0 || !http || req.windows(4).any(|w| w == b"\r\n\r\n") || req.len() > 64 << 10 {
            break;
        }
    }
    let line = String::from_utf8_lossy(&req).lines().next().unwrap_or_default().to_string();
    let path = line.split(' ').nth(1).unwrap_or_default().to_string();
    let key = if path == "/v2/" {
        None
    } else if let Some((_, r)) = path.split_once("/manifests/") {
        Some(format!("manifests/{r}"))
    } else {
        path.split_once("/blobs/").map(|(_, d)| format!("blobs/{d}"))
    };
    let body = match &key {
        None if path == "/v2/" => Some(Body::Bytes(Arc::new(b"{}".to_vec()))),
        Some(k) => routes.lock().unwrap().get(k).cloned(),
        None => None,
    };
    let Some(body) = body else {
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").await;
        return;
    };
    let content_type = match &key {
        Some(k) if k.starts_with("manifests/") => "application/vnd.oci.image.manifest.v1+json",
        _ => "application/octet-stream",
    };
    let head = |len: Option<u64>| {
        let len = len.map(|l| format!("Content-Length: {l}\r\n")).unwrap_or_default();
        format!("HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\n{len}Connection: close\r\n\r\n")
    };
    let count = |n: usize| {
        if let Some(k) = &key {
            *sent.lock().unwrap().entry(k.clone()).or_default() += n as u64;
        }
    };
    match body {
        Body::Bytes(b) => {
            if conn.write_all(head(Some(b.len() as u64)).as_bytes()).await.is_ok() && conn.write_all(&b).await.is_ok() {
                count(b.len());
            }
        }
        Body::Stream { prefix, fill, len, suffix, length, hold_at } => {
            let total = prefix.len() as u64 + len + suffix.len() as u64;
            if conn.write_all(head(length.then_some(total)).as_bytes()).await.is_err()
                || conn.write_all(&prefix).await.is_err()
            {
                return;
            }
            count(prefix.len());
            let chunk = vec![fill; 64 << 10];
            let mut done = 0u64;
            while done < len {
                if hold_at == Some(done) && !*released.borrow() {
                    held.fetch_add(1, Ordering::SeqCst);
                    let _ = released.wait_for(|r| *r).await;
                    held.fetch_sub(1, Ordering::SeqCst);
                }
                let mut n = (len - done).min(chunk.len() as u64);
                if let Some(h) = hold_at.filter(|h| *h > done) {
                    n = n.min(h - done);
                }
                if conn.write_all(&chunk[..n as usize]).await.is_err() {
                    return;
                }
                count(n as usize);
                done += n;
            }
            if conn.write_all(&suffix).await.is_ok() {
                count(suffix.len());
            }
        }
    }
}

/// `n` bytes of zeros and their digest.
fn zeros_digest(n: u64) -> String {
    sha256(&vec![0u8; n as usize])
}

/// An honest small module (a Namespace and its manager) as the operator would install it:
/// its OCI manifest as JSON, and its layers' bytes by digest.
fn module(name: &str) -> (ModuleArtifact, Value, Vec<(String, Vec<u8>)>) {
    let objects = vec![
        json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}),
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": name},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "op"}},
                "template": {"metadata": {"labels": {"app": "op"}},
                    "spec": {"containers": [{"name": "op", "image": "example.com/op:1.0.0"}]}}}}),
    ];
    let artifact = ModuleArtifact::new(name, "1.0.0", &format!("{name}/op"), objects).unwrap();
    let (manifest, layers) = artifact.to_oci().unwrap();
    let manifest = serde_json::to_value(&manifest).unwrap();
    let blobs = layers.into_iter().map(|l| (sha256(&l.data), l.data.to_vec())).collect();
    (artifact, manifest, blobs)
}

fn layer(media_type: &str, size: u64, digest: &str) -> Value {
    json!({"mediaType": media_type, "size": size, "digest": digest})
}

fn rss_kib(pid: u32, field: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap_or_else(|| panic!("no {field} in /proc/{pid}/status"))
}

/// The lifecycle operator with the test's bounds (the pull budget by its environment
/// variable, which an operator without that flag ignores).
fn operator(op: &Operated) -> Proc {
    let args: Vec<String> = [
        "lifecycle",
        "--control-plane-kubeconfig",
        op.cp_kc.to_str().unwrap(),
        "--leader-elect=false",
        "--watch-configs=false",
        "--artifact-memory-max-bytes",
        &MEMORY_MAX.to_string(),
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let budget = PULL_MAX.to_string();
    let p = Proc::spawn_with_env(&args, op.log.clone(), &[("FLEETWATCH_ARTIFACT_PULL_MAX_BYTES", &budget)]);
    p.wait_stdout("lifecycle operator running", Duration::from_secs(10));
    p
}

/// The ModuleTemplate, release and a Runtime of its own (in `rt1`'s cluster) for the module
/// of `artifact`, whose manifest the registry serves as `manifest_digest`.
fn deploy(op: &Operated, reg: &Hostile, artifact: &ModuleArtifact, manifest_digest: &str) -> String {
    let name = artifact.name.clone();
    let pinned = format!("{}/modules/{name}@{manifest_digest}", reg.host());
    op.apply(&artifact.module_template("kcp", &pinned));
    op.release(&name, &artifact.version);
    op.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": format!("rt-{name}"), "namespace": "kcp"},
        "spec": {"clusterId": format!("rt-{name}"), "kubeconfigSecret": {"name": "rt1-kubeconfig"},
            "modules": [{"name": name}]}}));
    pinned
}

async fn module_status(op: &Operated, module: &str) -> Option<ModuleStatus> {
    let runtimes: kube::Api<Runtime> = kube::Api::namespaced(op.cp.clone(), "kcp");
    let status = runtimes.get_status(&format!("rt-{module}")).await.ok().and_then(|r| r.status);
    status.and_then(|s| s.modules.into_iter().find(|m| m.name == module))
}

/// Waits for `module` to settle: `Error` (refused, or anything else) or `Ready`.
async fn settled(op: &Operated, module: &str) -> ModuleStatus {
    eventually(format!("{module}: Error or Ready"))
        .context(|| format!("lifecycle log:\n{}", std::fs::read_to_string(&op.log).unwrap_or_default()))
        .until(
            async || module_status(op, module).await,
            |m| m.as_ref().is_some_and(|m| matches!(m.state, State::Error | State::Ready)),
        )
        .await
        .expect("until returns only what satisfies the condition")
}

/// That `m` is `Error`, its artifact `pinned` refused with `reason`.
fn assert_refused(m: &ModuleStatus, pinned: &str, reason: &str) {
    let want = format!("artifact {pinned} refused: ");
    assert!(
        m.state == State::Error && m.message.contains(&want) && m.message.contains(reason),
        "{}: want Error {want}…{reason}…, got {:?} {}",
        m.name,
        m.state,
        m.message
    );
}

/// A hostile registry, the sim clusters and a lifecycle operator of their own: each case
/// runs in a fresh operator process, so that its peak RSS is its own.
struct Fixture {
    reg: Hostile,
    op: Operated,
    lifecycle: Proc,
    /// The operator's RSS once running, before any case.
    idle: u64,
    _pki: Pki,
}

impl Fixture {
    async fn start() -> Self {
        let pki = Pki::new();
        let reg = Hostile::start().await;
        let op = Operated::start(&pki).await;
        let lifecycle = operator(&op);
        let idle = rss_kib(lifecycle.child.id(), "VmRSS:") << 10;
        Self { reg, op, lifecycle, idle, _pki: pki }
    }

    /// The operator's peak RSS (VmHWM) so far, checked against its bound: idle RSS, the pull
    /// budget, the memory cache and [`SLACK`].
    fn peak(&self, case: &str) -> u64 {
        let bound = self.idle + PULL_MAX + MEMORY_MAX + SLACK;
        let peak = rss_kib(self.lifecycle.child.id(), "VmHWM:") << 10;
        let mib = |b: u64| b as f64 / MIB as f64;
        eprintln!(
            "hostile registry: {case}: operator peak RSS {:.1} MiB ({:+.1} MiB over idle {:.1} MiB; bound {:.1} MiB)",
            mib(peak),
            mib(peak) - mib(self.idle),
            mib(self.idle),
            mib(bound)
        );
        assert!(
            peak <= bound,
            "{case}: the operator's peak RSS is {:.1} MiB, over {:.1} MiB (idle {:.1} MiB + pull budget {} MiB + \
             memory cache {} MiB + {} MiB)",
            mib(peak),
            mib(bound),
            mib(self.idle),
            PULL_MAX / MIB,
            MEMORY_MAX / MIB,
            SLACK / MIB
        );
        peak
    }

    /// Serves `manifest` (with Content-Length) and deploys its module; returns the pinned ref.
    fn serve_and_deploy(&self, artifact: &ModuleArtifact, manifest: &Value) -> String {
        let body = serde_json::to_vec(manifest).unwrap();
        let digest = sha256(&body);
        self.reg.route(format!("manifests/{digest}"), Body::Bytes(Arc::new(body)));
        deploy(&self.op, &self.reg, artifact, &digest)
    }
}

/// `len` zeros, with Content-Length or not, held at `hold_at` bytes.
fn zeros(len: u64, length: bool, hold_at: Option<u64>) -> Body {
    Body::Stream { prefix: Default::default(), fill: 0, len, suffix: Default::default(), length, hold_at }
}

/// A layer whose descriptor says 700 bytes, streamed as 300 MiB without Content-Length: cut
/// off at 700 bytes and refused (an operator reading the whole stream holds 300 MiB, over
/// the bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_layer_streamed_past_its_descriptor_is_cut_off_within_the_memory_bound() {
    let f = Fixture::start().await;
    let (artifact, mut manifest, _) = module("liar");
    manifest["layers"][0]["size"] = json!(700);
    let layer_digest = manifest["layers"][0]["digest"].as_str().unwrap().to_string();
    let blob = format!("blobs/{layer_digest}");
    f.reg.route(blob.clone(), zeros(300 * MIB, false, None));
    let pinned = f.serve_and_deploy(&artifact, &manifest);
    let reason = format!("layer {layer_digest} sent more than the 700 bytes its descriptor gives");
    let m = settled(&f.op, "liar").await;
    f.peak("a 700-byte layer streamed as 300 MiB");
    assert_refused(&m, &pinned, &reason);
    let sent = f.reg.sent(&blob);
    assert!(sent < 64 * MIB, "the registry sent {sent} bytes of a 700-byte layer");
}

/// 24 honest layers of 60 MiB (1.4 GiB): refused before any blob is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_large_layers_are_refused_before_any_is_fetched() {
    let f = Fixture::start().await;
    let (artifact, mut manifest, _) = module("layers24");
    let z60 = zeros_digest(60 * MIB);
    manifest["layers"] = Value::Array((0..24).map(|_| layer(MANIFEST_MEDIA_TYPE, 60 * MIB, &z60)).collect());
    f.reg.route(format!("blobs/{z60}"), zeros(60 * MIB, true, None));
    let pinned = f.serve_and_deploy(&artifact, &manifest);
    let m = settled(&f.op, "layers24").await;
    f.peak("24 layers of 60 MiB");
    assert_refused(&m, &pinned, "24 layers, a module artifact has at most 2");
    assert_eq!(f.reg.sent(&format!("blobs/{z60}")), 0, "no blob is fetched");
}

/// Two honest layers of 40 MiB: each under the layer bound, 80 MiB together over the
/// artifact's; refused before either is fetched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layers_over_the_artifact_bound_together_are_refused_before_any_is_fetched() {
    let f = Fixture::start().await;
    let (artifact, mut manifest, _) = module("heavy");
    let z40 = zeros_digest(40 * MIB);
    manifest["layers"] =
        json!([layer(MANIFEST_MEDIA_TYPE, 40 * MIB, &z40), layer(DEFAULT_CONFIG_MEDIA_TYPE, 40 * MIB, &z40)]);
    f.reg.route(format!("blobs/{z40}"), zeros(40 * MIB, true, None));
    let pinned = f.serve_and_deploy(&artifact, &manifest);
    let reason = "layers of 83886080 bytes in all, over the 67108864 bytes a module artifact may take";
    let m = settled(&f.op, "heavy").await;
    f.peak("2 layers of 40 MiB");
    assert_refused(&m, &pinned, reason);
    assert_eq!(f.reg.sent(&format!("blobs/{z40}")), 0, "no blob is fetched");
}

/// A valid module whose manifest carries a 128 MiB annotation, its digest pinned and right,
/// sent without Content-Length: refused once 4 MiB are read (it used to be accepted, the
/// module Ready).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_giant_manifest_is_refused_at_its_bound() {
    let f = Fixture::start().await;
    let (artifact, mut manifest, blobs) = module("giant");
    manifest["annotations"]["org.example.pad"] = json!("PAD");
    let text = serde_json::to_vec(&manifest).unwrap();
    let at = text.windows(5).position(|w| w == b"\"PAD\"").unwrap() + 1;
    let (prefix, suffix) = (text[..at].to_vec(), text[at + 3..].to_vec());
    let pad = 128 * MIB;
    let digest = {
        let mut whole = prefix.clone();
        whole.resize(prefix.len() + pad as usize, b'a');
        whole.extend_from_slice(&suffix);
        sha256(&whole)
    };
    let key = format!("manifests/{digest}");
    let (prefix, suffix) = (Arc::new(prefix), Arc::new(suffix));
    f.reg.route(key.clone(), Body::Stream { prefix, fill: b'a', len: pad, suffix, length: false, hold_at: None });
    for (d, data) in blobs {
        f.reg.route(format!("blobs/{d}"), Body::Bytes(Arc::new(data)));
    }
    let pinned = deploy(&f.op, &f.reg, &artifact, &digest);
    let m = settled(&f.op, "giant").await;
    f.peak("a 128 MiB manifest");
    assert_refused(&m, &pinned, "manifest larger than 4194304 bytes");
    let sent = f.reg.sent(&key);
    assert!(sent < 64 * MIB, "the registry sent {sent} bytes of manifest");
}

/// Six artifacts of one 48 MiB layer each, pulled at once (six Runtimes); the registry holds
/// every layer at 47 MiB until released. Together (288 MiB) they are over the pull budget
/// (64 MiB): one pull streams, the others wait for the budget and their modules say so; once
/// released they stream one after the other, each refused (zeros are not JSON).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_pulls_stay_within_the_pull_budget() {
    let f = Fixture::start().await;
    let z48 = zeros_digest(48 * MIB);
    f.reg.route(format!("blobs/{z48}"), zeros(48 * MIB, false, Some(47 * MIB)));
    let names: Vec<String> = (1..=6).map(|i| format!("crowd{i}")).collect();
    let mut pinned = Vec::new();
    for name in &names {
        let (artifact, mut manifest, _) = module(name);
        manifest["layers"] = json!([layer(MANIFEST_MEDIA_TYPE, 48 * MIB, &z48)]);
        pinned.push(f.serve_and_deploy(&artifact, &manifest));
    }
    let observe = async || {
        let mut waiting = 0;
        for name in &names {
            if module_status(&f.op, name).await.is_some_and(|m| {
                m.state == State::Warning && m.message.contains("waits for") && m.message.contains("of the pull budget")
            }) {
                waiting += 1;
            }
        }
        (f.reg.held.load(Ordering::SeqCst), waiting)
    };
    // Either the budget holds (one streaming, five waiting) or every pull streams at once.
    let (held, waiting) = eventually("one pull streaming and five waiting for the pull budget")
        .context(|| format!("lifecycle log:\n{}", std::fs::read_to_string(&f.op.log).unwrap_or_default()))
        .until(observe, |(held, waiting)| *held == names.len() || (*held == 1 && *waiting == 5))
        .await;
    f.peak("6 pulls of 48 MiB at once, held at 47 MiB");
    assert_eq!((held, waiting), (1, 5), "pulls streaming at once, pulls waiting for the budget");
    f.reg.release.send_replace(true);
    let mut settled_all = Vec::new();
    for name in &names {
        settled_all.push(settled(&f.op, name).await);
    }
    f.peak("6 pulls of 48 MiB, released");
    for (m, pinned) in settled_all.iter().zip(&pinned) {
        assert_refused(m, pinned, "the manifest layer is not JSON");
    }
    assert_eq!(f.reg.sent(&format!("blobs/{z48}")), 6 * 48 * MIB, "each pull read its layer once");
}
