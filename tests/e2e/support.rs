//! Test support: a PKI, real `fleetwatch` processes, a fault-injecting TCP proxy and a
//! collecting subscriber.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_client::transport::HubUrls;
use fleetwatch_protocol::message::StartFrom;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

pub use fleetwatch_test_support::{eventually, holds_within, holds_within_blocking};

pub const BIN: &str = env!("CARGO_BIN_EXE_fleetwatch");

/// A CA with a hub certificate in a temporary directory.
pub struct Pki {
    pub dir: tempfile::TempDir,
    ca: Authority,
}

impl Pki {
    pub fn new() -> Self {
        fleetwatch_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        Authority::init(dir.path(), "test.local").unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        ca.issue(
            dir.path(),
            &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec!["127.0.0.1".parse().unwrap()] },
            1,
        )
        .unwrap();
        Self { dir, ca }
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// A certificate for an agent of `cluster`, in files of its own: a second process of the
    /// same cluster must not overwrite the first one's files, which the first follows (a
    /// changed certificate is a renewal: it would reconnect with it).
    pub fn agent(&self, cluster: &str) -> TlsFiles {
        let f = self.ca.issue(&self.fresh_dir(), &LeafSpec::Agent { cluster: cluster.into() }, 1).unwrap();
        TlsFiles { cert: f.cert, key: f.key, ca: vec![self.path("ca.crt")] }
    }

    /// A subscriber's certificate, in files of its own (see [`Pki::agent`]).
    pub fn subscriber(&self, name: &str) -> TlsFiles {
        let f = self.ca.issue(&self.fresh_dir(), &LeafSpec::Subscriber { name: name.into() }, 1).unwrap();
        TlsFiles { cert: f.cert, key: f.key, ca: vec![self.path("ca.crt")] }
    }

    /// A directory no certificate was issued into yet.
    fn fresh_dir(&self) -> PathBuf {
        static ISSUED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = ISSUED.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = self.path(&format!("issued-{n}"));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    pub fn ca(&self) -> &Authority {
        &self.ca
    }
}

/// The `--cert/--key/--ca` flags of a client (agent, tail, lifecycle) with these files.
pub fn client_args(files: &TlsFiles) -> Vec<String> {
    let mut args =
        vec!["--cert".to_string(), files.cert.display().to_string(), "--key".into(), files.key.display().to_string()];
    for ca in &files.ca {
        args.extend(["--ca".to_string(), ca.display().to_string()]);
    }
    args
}

/// Where the test processes of a run reserve the ports they hand out (one lock file each).
const PORT_LOCKS: &str = "fleetwatch-e2e-ports";
/// Ports are handed out from here, below the kernel's ephemeral range (32768–60999 on
/// Linux, `ip_local_port_range`).
const PORTS: std::ops::Range<u16> = 20000..32000;

/// A port for a process this test starts to listen on, free on every local address and
/// reserved until this test process exits.
///
/// A port the kernel picked for `bind(0)` and released is one any `connect()` on the machine
/// may take as its local port before the process binds it, and hold for as long as its
/// connection lives (agents, NATS clients): seen as "Address already in use" under load,
/// even after 20 s of `--bind-retry`. Ports below the ephemeral range are never taken that
/// way; an flock on a file per port keeps the suite's concurrent test processes (and this
/// one) from handing out the same port twice.
pub fn free_port() -> u16 {
    static HELD: Mutex<Vec<std::fs::File>> = Mutex::new(Vec::new());
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let dir = std::env::temp_dir().join(PORT_LOCKS);
    std::fs::create_dir_all(&dir).unwrap();
    let seed = (u64::from(std::process::id()) << 32) ^ (rand_u32() as u64);
    for _ in 0..10_000 {
        // A different walk through the range per process, so they rarely try the same ports.
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed).wrapping_add(seed);
        let span = u64::from(PORTS.end - PORTS.start);
        let port = PORTS.start + (n.wrapping_mul(0x9E37_79B9_7F4A_7C15) % span) as u16;
        let Ok(lock) =
            std::fs::File::options().create(true).truncate(false).write(true).open(dir.join(port.to_string()))
        else {
            continue;
        };
        if lock.try_lock().is_err() {
            continue;
        }
        if std::net::TcpListener::bind(("0.0.0.0", port)).is_err() {
            continue;
        }
        HELD.lock().unwrap().push(lock);
        return port;
    }
    panic!("no free port in {PORTS:?} after 10,000 tries");
}

/// A port free on every local address, for a process that listens on `0.0.0.0`
/// ([`free_port`] already is).
pub fn free_port_on_all_addresses() -> u16 {
    free_port()
}

#[test]
fn free_ports_are_distinct_below_the_ephemeral_range_and_free() {
    let ports: Vec<u16> = (0..64).map(|_| free_port()).collect();
    let distinct: std::collections::BTreeSet<u16> = ports.iter().copied().collect();
    assert_eq!(distinct.len(), ports.len(), "{ports:?}");
    for port in ports {
        assert!(PORTS.contains(&port), "{port}");
        assert!(std::net::TcpListener::bind(("127.0.0.1", port)).is_ok(), "{port} not free");
    }
}

/// A `fleetwatch` child process whose stderr is kept in a file; killed on drop.
pub struct Proc {
    pub child: Child,
    pub log: PathBuf,
    pub stdout_lines: Arc<Mutex<Vec<String>>>,
}

impl Proc {
    pub fn spawn(args: &[String], log: PathBuf) -> Self {
        Self::spawn_with_env(args, log, &[])
    }

    /// Like [`Proc::spawn`], with extra environment variables.
    pub fn spawn_with_env(args: &[String], log: PathBuf, env: &[(&str, &str)]) -> Self {
        let err = std::fs::File::create(&log).unwrap();
        let mut child = Command::new(BIN)
            .args(args)
            // Hubs and operators fall back to these; a test says so explicitly when it wants it.
            .env_remove("KUBECONFIG")
            .env_remove("KUBERNETES_SERVICE_HOST")
            .envs(env.iter().copied())
            .env("FLEETWATCH_LOG", "info")
            .stdout(Stdio::piped())
            .stderr(err)
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let l = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l.lock().unwrap().push(line);
            }
        });
        Self { child, log, stdout_lines: lines }
    }

    pub fn signal(&self, sig: &str) {
        let ok = Command::new("kill").arg(format!("-{sig}")).arg(self.child.id().to_string()).status().unwrap();
        assert!(ok.success());
    }

    /// Waits for exit up to `timeout`; returns the exit code (`Some(-1)` when killed by a
    /// signal), `None` when still running.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<i32> {
        let mut status = None;
        holds_within_blocking(timeout, || {
            status = self.child.try_wait().unwrap();
            status.is_some()
        });
        status.map(|s| s.code().unwrap_or(-1))
    }

    pub fn stderr(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The first line on stdout that contains `needle`; panics after `timeout` with the log.
    pub fn wait_stdout(&self, needle: &str, timeout: Duration) -> String {
        let lines = || self.stdout_lines.lock().unwrap().iter().find(|l| l.contains(needle)).cloned();
        eventually(format!("{needle:?} on stdout"))
            .within(timeout)
            .context(|| format!("stderr:\n{}", self.stderr()))
            .until_blocking(lines, Option::is_some)
            .expect("until_blocking returns only what satisfies the condition")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A hub process.
pub struct HubProc {
    pub proc: Proc,
    pub port: u16,
    pub admin_port: u16,
}

/// `fleetwatch hub` with the test PKI's certificates on these loopback ports.
pub fn hub_args(pki: &Pki, port: u16, admin_port: u16) -> Vec<String> {
    vec![
        "hub".into(),
        "--listen".into(),
        format!("127.0.0.1:{port}"),
        "--admin-listen".into(),
        format!("127.0.0.1:{admin_port}"),
        "--cert".into(),
        pki.path("hub.crt").display().to_string(),
        "--key".into(),
        pki.path("hub.key").display().to_string(),
        "--client-ca".into(),
        pki.path("ca.crt").display().to_string(),
    ]
}

impl HubProc {
    pub fn start(pki: &Pki, port: u16, data_dir: Option<&Path>, extra: &[&str]) -> Self {
        Self::start_with_env(pki, port, data_dir, extra, &[])
    }

    /// Like [`HubProc::start`], with environment variables for the hub.
    pub fn start_with_env(pki: &Pki, port: u16, data_dir: Option<&Path>, extra: &[&str], env: &[(&str, &str)]) -> Self {
        let admin_port = free_port();
        let mut args = hub_args(pki, port, admin_port);
        if !extra.contains(&"--idle-timeout") {
            args.extend(["--idle-timeout".into(), "6".into()]);
        }
        // Tests restart hubs on the port they had: wait for it to be free.
        if !extra.contains(&"--bind-retry") {
            args.extend(["--bind-retry".into(), "20".into()]);
        }
        if let Some(d) = data_dir {
            args.push("--data-dir".into());
            args.push(d.display().to_string());
        }
        args.extend(extra.iter().map(|s| s.to_string()));
        let log = pki.path(&format!("hub-{port}-{}.log", Instant::now().elapsed().as_nanos() ^ rand_u32()));
        let proc = Proc::spawn_with_env(&args, log, env);
        proc.wait_stdout("hub listening", Duration::from_secs(20));
        Self { proc, port, admin_port }
    }

    pub fn url(&self) -> String {
        format!("wss://127.0.0.1:{}", self.port)
    }

    pub async fn clusters(&self) -> serde_json::Value {
        let body = http_get(self.admin_port, "/api/v1/clusters").await;
        serde_json::from_str(&body).unwrap_or_default()
    }
}

fn rand_u32() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().subsec_nanos() as u128
}

pub async fn http_get(port: u16, path: &str) -> String {
    use tokio::io::AsyncReadExt;
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else { return String::new() };
    let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes()).await;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default()
}

/// The value of one sample in a Prometheus text exposition (`name{labels}` exactly as
/// served), e.g. a counter an absence check reads before and after.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

/// Starts an agent process for `cluster` with extra arguments (its source).
fn agent_with(pki: &Pki, cluster: &str, hub: &str, extra: &[&str]) -> Proc {
    let mut args: Vec<String> = vec!["agent".into(), "--hub".into(), hub.into(), "--retry-first-connect".into()];
    args.extend(client_args(&pki.agent(cluster)));
    args.extend(extra.iter().map(|s| s.to_string()));
    Proc::spawn(&args, pki.path(&format!("agent-{cluster}-{}.log", rand_u32())))
}

/// Starts an agent process with a synthetic source.
pub fn agent(pki: &Pki, cluster: &str, hub: &str, source: &str, extra: &[&str]) -> Proc {
    let mut args = vec!["--source", source];
    args.extend_from_slice(extra);
    agent_with(pki, cluster, hub, &args)
}

/// A TCP proxy that can cut the path: `cut` closes every connection and blackholes new
/// ones (accepted, never forwarded), as a network partition would.
pub struct Proxy {
    pub port: u16,
    /// (cut now, cuts so far): connections wait on changes instead of polling.
    state: tokio::sync::watch::Sender<(bool, u64)>,
}

impl Proxy {
    pub async fn start(target_port: u16) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = tokio::sync::watch::Sender::new((false, 0u64));
        let watching = state.clone();
        tokio::spawn(async move {
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { return };
                let mut rx = watching.subscribe();
                tokio::spawn(async move {
                    let (cut, my_gen) = *rx.borrow_and_update();
                    if cut {
                        // Blackhole: hold the socket open, forward nothing, until restored.
                        let _ = rx.wait_for(|(cut, _)| !cut).await;
                        return;
                    }
                    let Ok(mut outbound) = TcpStream::connect(("127.0.0.1", target_port)).await else { return };
                    tokio::select! {
                        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
                        // Cut: drop both sides.
                        _ = rx.wait_for(|(_, g)| *g != my_gen) => {}
                    }
                });
            }
        });
        Self { port, state }
    }

    pub fn url(&self) -> String {
        format!("wss://127.0.0.1:{}", self.port)
    }

    pub fn cut(&self) {
        self.state.send_modify(|(cut, generation)| {
            *cut = true;
            *generation += 1;
        });
    }

    pub fn restore(&self) {
        self.state.send_modify(|(cut, _)| *cut = false);
    }
}

/// What a subscriber saw.
#[derive(Default, Debug)]
pub struct Seen {
    /// (cluster, subject) → highest generation seen.
    pub generation: HashMap<(String, String), u64>,
    /// cluster → resync-required (cursor, reason), in arrival order; `*` for all.
    pub resyncs: BTreeMap<String, Vec<(u64, String)>>,
    /// cluster → highest seq seen.
    pub max_seq: HashMap<String, u64>,
    pub events: u64,
    /// Every event, in arrival order.
    pub all: Vec<fleetwatch_protocol::Event>,
    /// Every resync-required in arrival order: (cluster, how many events had arrived before
    /// it (an index into `all`), when it arrived).
    pub resync_arrivals: Vec<(String, usize, Instant)>,
}

/// A durable subscriber in this test process that records what it sees.
pub struct Collector {
    pub seen: Arc<Mutex<Seen>>,
    stop: tokio_util::sync::CancellationToken,
}

impl Collector {
    pub async fn start(pki: &Pki, hub: &str, name: &str) -> Self {
        let files = pki.subscriber(name);
        let tls = Arc::new(fleetwatch_certs::client_config(&files).unwrap());
        let mut opts = SubscriberOptions::new(hub.parse::<HubUrls>().unwrap(), tls);
        opts.durable = Some("collector".into());
        opts.from = StartFrom::Earliest;
        opts.idle_timeout = Duration::from_secs(8);
        let mut sub = Subscription::connect(opts).await.unwrap();
        let seen = Arc::new(Mutex::new(Seen::default()));
        let stop = tokio_util::sync::CancellationToken::new();
        let (s, st) = (seen.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                let d = tokio::select! {
                    d = sub.next() => d,
                    _ = st.cancelled() => return,
                };
                let Ok(d) = d else { continue };
                {
                    let mut seen = s.lock().unwrap();
                    match &d {
                        Delivery::Events(evs) => {
                            for e in evs {
                                seen.events += 1;
                                let g = e.data["generation"].as_u64().unwrap_or(0);
                                let slot = seen.generation.entry((e.cluster.clone(), e.subject.clone())).or_default();
                                *slot = (*slot).max(g);
                                let m = seen.max_seq.entry(e.cluster.clone()).or_default();
                                *m = (*m).max(e.seq);
                                seen.all.push(e.clone());
                            }
                        }
                        Delivery::ResyncRequired(r) => {
                            seen.resyncs.entry(r.cluster.clone()).or_default().push((r.cursor, r.reason.clone()));
                            let before = seen.all.len();
                            seen.resync_arrivals.push((r.cluster.clone(), before, Instant::now()));
                        }
                    }
                }
                if let Some(c) = d.last_cursor() {
                    let _ = sub.ack(c).await;
                }
            }
        });
        Self { seen, stop }
    }
}

impl Drop for Collector {
    fn drop(&mut self) {
        self.stop.cancel();
    }
}

/// The subject of synthetic object `n`.
/// Every object of every cluster that has not reached its final generation at the
/// subscriber, one line each.
pub fn missing(seen: &Seen, clusters: &[&str], source: &fleetwatch_agent::source::SyntheticSource) -> Vec<String> {
    let mut out = Vec::new();
    for c in clusters {
        for n in 0..source.objects {
            let want = source.final_generation(n).unwrap();
            let got = seen.generation.get(&(c.to_string(), synthetic_subject(n))).copied().unwrap_or(0);
            if got != want {
                out.push(format!("{c}/obj-{n}: got generation {got}, want {want}"));
            }
        }
    }
    out
}

pub fn synthetic_subject(n: u64) -> String {
    fleetwatch_agent::source::SyntheticSource::key(n).to_string()
}

/// `kubectl apply --server-side --force-conflicts` of one object.
pub fn apply_json(kubeconfig: &Path, object: &serde_json::Value) {
    kubectl(kubeconfig, &["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(&object.to_string()));
}

/// The written value (`data.v`) of every ConfigMap `cms` lists, keyed by the subject the
/// agent reports it under (`v1/ConfigMap/<namespace>/<name>`): the final state a subscriber
/// must have seen.
pub async fn configmap_values(cms: &kube::Api<kube::api::DynamicObject>, namespace: &str) -> HashMap<String, String> {
    cms.list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|o| {
            (
                format!("v1/ConfigMap/{namespace}/{}", o.metadata.name.unwrap()),
                o.data["data"]["v"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

/// Runs the real kubectl against a kubeconfig; returns stdout, panics with stderr on failure.
pub fn kubectl(kubeconfig: &Path, args: &[&str], stdin: Option<&str>) -> String {
    use std::io::Write;
    let mut child = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("kubectl on PATH");
    if let Some(input) = stdin {
        child.stdin.take().unwrap().write_all(input.as_bytes()).unwrap();
    }
    drop(child.stdin.take());
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout).into()
}

/// Starts a simulated cluster and writes its kubeconfig next to the PKI.
pub async fn sim_cluster(pki: &Pki, name: &str) -> (fleetwatch_sim::SimCluster, PathBuf) {
    let sim = fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions { name: name.into(), ..Default::default() })
        .await
        .unwrap();
    let path = pki.path(&format!("{name}.kubeconfig"));
    sim.write_kubeconfig(&path).unwrap();
    (sim, path)
}

/// An agent process watching a simulated cluster.
pub fn kube_agent(pki: &Pki, cluster: &str, hub: &str, kubeconfig: &Path) -> Proc {
    agent_with(pki, cluster, hub, &["--kubeconfig", kubeconfig.to_str().unwrap()])
}

/// The sample `redis` module's ModuleTemplate at `version` in `namespace`: a Namespace, the
/// RedisConfig CRD, the manager Deployment, a default RedisConfig.
pub fn redis_template(namespace: &str, version: &str) -> serde_json::Value {
    serde_json::json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("redis-{version}"), "namespace": namespace},
        "spec": {
            "moduleName": "redis", "version": version,
            "manifest": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "redis-system"}},
                {"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition",
                 "metadata": {"name": "redisconfigs.example.com"},
                 "spec": {"group": "example.com", "scope": "Namespaced",
                          "names": {"kind": "RedisConfig", "plural": "redisconfigs", "singular": "redisconfig"},
                          "versions": [{"name": "v1", "served": true, "storage": true,
                                        "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}},
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "redis-manager", "namespace": "redis-system",
                              "labels": {"operator.fleetwatch.dev/module": "redis", "app.kubernetes.io/version": version}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "redis-manager"}},
                          "template": {"metadata": {"labels": {"app": "redis-manager"}},
                                       "spec": {"containers": [{"name": "manager", "image": format!("redis-manager:{version}")}]}}}}
            ],
            "defaultConfig": {"apiVersion": "example.com/v1", "kind": "RedisConfig",
                              "metadata": {"name": "default", "namespace": "redis-system"}, "spec": {"size": 1}},
            "managedResources": [{"group": "example.com", "version": "v1", "kind": "RedisConfig"}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "redis-system", "name": "redis-manager"}
        }
    })
}

/// Reads `child`'s stderr (taken from it) on a thread of its own: the receiver gets `Ok(())`
/// when a line containing `needle` appears, and `Err(log)` with everything read once stderr
/// ends.
pub fn stderr_until(child: &mut Child, needle: &str) -> std::sync::mpsc::Receiver<Result<(), String>> {
    let stderr = child.stderr.take().expect("the child's stderr is piped");
    let needle = needle.to_string();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut log = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if line.contains(&needle) {
                let _ = tx.send(Ok(()));
            }
            log += &line;
            log.push('\n');
        }
        let _ = tx.send(Err(log));
    });
    rx
}

/// Waits up to `within` for `child` to exit by itself (killing it after that) and answers
/// its exit status (`None`: it had to be killed), stdout and stderr; both must be piped.
pub fn finish_within(mut child: Child, within: Duration) -> (Option<std::process::ExitStatus>, String, String) {
    let mut status = None;
    if !holds_within_blocking(within, || {
        status = child.try_wait().unwrap();
        status.is_some()
    }) {
        let _ = child.kill();
    }
    let out = child.wait_with_output().unwrap();
    (status, String::from_utf8_lossy(&out.stdout).to_string(), String::from_utf8_lossy(&out.stderr).to_string())
}
