//! The simulator's benchmark: LIST of many objects, and watch fan-out (many watchers, a
//! steady write rate) with the latency from issuing a write to each watcher receiving
//! its event. Runs real clients over real TLS on loopback: kube-rs for LIST and the
//! writes, minimal raw readers for the watches (see `docs/sim.md`, "What the bench
//! measures").

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::cluster::{SimCluster, SimOptions};
use crate::error::SimError;
use crate::ops::{self, WriteOpts};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Objects in the listed collection.
    pub list_objects: usize,
    /// LIST calls timed (the median is reported).
    pub list_rounds: usize,
    /// Concurrent watchers.
    pub watchers: usize,
    /// Writes per second during the fan-out phase.
    pub writes_per_sec: u32,
    /// Length of the fan-out phase.
    pub duration: Duration,
}

impl Default for BenchOptions {
    fn default() -> Self {
        BenchOptions {
            list_objects: 10_000,
            list_rounds: 5,
            watchers: 100,
            writes_per_sec: 1_000,
            duration: Duration::from_secs(5),
        }
    }
}

/// Results.
#[derive(Debug, Clone, Default)]
pub struct BenchReport {
    /// Objects in the collection the LIST phase read.
    pub list_objects: usize,
    /// Median wall time of one full LIST through kube-rs (client decode included).
    pub list_median: Duration,
    /// Median wall time of the same LIST read as bytes (server and TLS, no decoding).
    pub list_bytes_median: Duration,
    /// Size of one LIST answer in bytes.
    pub list_bytes: usize,
    /// Watches open during the fan-out phase.
    pub watchers: usize,
    /// Writes made during the fan-out phase.
    pub writes: u64,
    /// Achieved write rate.
    pub writes_per_sec: f64,
    /// Events received over all watchers, and how many were expected.
    pub events_received: u64,
    /// Events expected over all watchers (writes × watchers).
    pub events_expected: u64,
    /// Write-to-event latency, median.
    pub latency_p50: Duration,
    /// Write-to-event latency, 99th percentile.
    pub latency_p99: Duration,
    /// Write-to-event latency, largest seen.
    pub latency_max: Duration,
    /// Wall time of the fan-out phase's writes.
    pub fanout_wall: Duration,
    /// CPU time during the fan-out phase of the server's threads (the caller's runtime and
    /// everything else in the process but the writer and watcher threads; zero where
    /// unknown).
    pub cpu_server: Duration,
    /// CPU time of the writer (a kube-rs client on its own thread).
    pub cpu_writer: Duration,
    /// CPU time of all watchers together (raw readers on one thread).
    pub cpu_watchers: Duration,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "list {} objects: median {:?} through kube-rs incl. decoding, {:?} as bytes ({} KiB)",
            self.list_objects,
            self.list_median,
            self.list_bytes_median,
            self.list_bytes / 1024
        )?;
        writeln!(
            f,
            "watch fan-out: {} watchers, {} writes at {:.0}/s, {}/{} events delivered",
            self.watchers, self.writes, self.writes_per_sec, self.events_received, self.events_expected
        )?;
        writeln!(
            f,
            "write->event latency: p50 {:?}, p99 {:?}, max {:?}",
            self.latency_p50, self.latency_p99, self.latency_max
        )?;
        let secs = self.fanout_wall.as_secs_f64().max(1e-9);
        let pct = |d: Duration| 100.0 * d.as_secs_f64() / secs;
        write!(
            f,
            "cpu during fan-out ({:.1}s): server {:.0}% of a core, writer (kube-rs) {:.0}%, watch readers {:.0}%",
            secs,
            pct(self.cpu_server),
            pct(self.cpu_writer),
            pct(self.cpu_watchers)
        )
    }
}

fn percentile(sorted: &[u64], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    Duration::from_micros(sorted[i.min(sorted.len() - 1)])
}

/// CPU time (nanoseconds on a CPU, from `/proc/<task>/schedstat`) of the calling thread.
fn thread_cpu() -> Option<Duration> {
    schedstat("/proc/thread-self/schedstat")
}

/// CPU time of every thread of this process still alive (threads that exited are not
/// counted).
fn process_cpu() -> Option<Duration> {
    let mut total = Duration::ZERO;
    for t in std::fs::read_dir("/proc/self/task").ok()? {
        total += schedstat(&format!("{}/schedstat", t.ok()?.path().display()))?;
    }
    Some(total)
}

fn schedstat(path: &str) -> Option<Duration> {
    let s = std::fs::read_to_string(path).ok()?;
    s.split_whitespace().next()?.parse().ok().map(Duration::from_nanos)
}

fn cpu_delta(a: Option<Duration>, b: Option<Duration>) -> Duration {
    match (a, b) {
        (Some(a), Some(b)) => b.saturating_sub(a),
        _ => Duration::ZERO,
    }
}

/// A minimal watch client: one TLS connection, one HTTP/1.1 request, and a scan of the
/// chunked body for event lines and the `"sent":"…"` stamp the writer put in each object,
/// without decoding JSON — so the figure is the server's fan-out rather than 100 clients
/// parsing JSON on a small machine. Returns one latency (µs since `base`) per event.
async fn raw_watcher(
    addr: std::net::SocketAddr,
    tls: tokio_rustls::TlsConnector,
    token: String,
    path: String,
    base: Instant,
    expected: u64,
) -> std::io::Result<Vec<u64>> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    tcp.set_nodelay(true)?;
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").map_err(std::io::Error::other)?;
    let mut conn = tls.connect(name, tcp).await?;
    let req = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nAccept: application/json\r\n\r\n"
    );
    conn.write_all(req.as_bytes()).await?;
    let mut lat = Vec::with_capacity(expected as usize);
    let mut buf: Vec<u8> = Vec::with_capacity(64 * 1024);
    let mut headers_done = false;
    const STAMP: &[u8] = b"\"sent\":\"";
    while (lat.len() as u64) < expected {
        let mut chunk = [0u8; 32 * 1024];
        let n = match tokio::time::timeout(Duration::from_secs(10), conn.read(&mut chunk)).await {
            Ok(Ok(0)) | Err(_) => break,
            Ok(Ok(n)) => n,
            Ok(Err(e)) => return Err(e),
        };
        buf.extend_from_slice(&chunk[..n]);
        let now = base.elapsed().as_micros() as u64;
        let mut start = 0;
        if !headers_done {
            let Some(h) = buf.windows(4).position(|w| w == b"\r\n\r\n") else { continue };
            if !buf.starts_with(b"HTTP/1.1 200") {
                return Err(std::io::Error::other(String::from_utf8_lossy(&buf[..h]).into_owned()));
            }
            headers_done = true;
            start = h + 4;
        }
        // Complete lines only; chunk-size lines of the chunked encoding are skipped as
        // they do not start with `{"type":`.
        while let Some(nl) = buf[start..].iter().position(|b| *b == b'\n') {
            let line = &buf[start..start + nl];
            start += nl + 1;
            if !line.starts_with(b"{\"type\":") || line.starts_with(b"{\"type\":\"BOOKMARK\"") {
                continue;
            }
            let sent = line
                .windows(STAMP.len())
                .position(|w| w == STAMP)
                .map(|i| &line[i + STAMP.len()..])
                .and_then(|rest| rest.iter().position(|b| *b == b'"').map(|e| &rest[..e]))
                .and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok())
                .unwrap_or(now);
            lat.push(now.saturating_sub(sent));
        }
        buf.drain(..start);
    }
    Ok(lat)
}

/// Runs the benchmark against a fresh in-process cluster.
///
/// The server runs on the caller's runtime. During the fan-out phase the writer (a
/// kube-rs client) and the watchers (raw readers, see [`raw_watcher`]) each run on a
/// thread of their own with a single-threaded runtime, so their CPU time can be told
/// apart from the server's (Linux: from `/proc`; zero elsewhere).
pub async fn bench(o: BenchOptions) -> Result<BenchReport, SimError> {
    use kube::api::{Api, ListParams, Patch, PatchParams};
    let sim = SimCluster::start(SimOptions { history: 100_000, ..SimOptions::default() }).await?;
    let client = sim.client().await?;
    let kerr = |e: kube::Error| SimError::Kube(e.to_string());

    // Phase 1: LIST. Objects are loaded directly into the store (the write path is not
    // what this phase measures).
    {
        let core = sim.core();
        let mut st = core.lock();
        let ns_def = st.registry.get("", "v1", "namespaces").cloned();
        let cm = st.registry.get("", "v1", "configmaps").cloned();
        if let (Some(ns_def), Some(cm)) = (ns_def, cm) {
            let w = WriteOpts { manager: "bench".into(), ..Default::default() };
            let _ = ops::create(&mut st, &ns_def, None, json!({"metadata": {"name": "bench-list"}}), &w);
            let _ = ops::create(&mut st, &ns_def, None, json!({"metadata": {"name": "bench-watch"}}), &w);
            for i in 0..100 {
                let _ =
                    ops::create(&mut st, &cm, Some("bench-watch"), json!({"metadata": {"name": format!("w-{i}")}}), &w);
            }
            for i in 0..o.list_objects {
                let body = json!({"metadata": {"name": format!("cm-{i:06}"), "labels": {"app": "bench"}}, "data": {"key": "value", "n": i.to_string()}});
                ops::create(&mut st, &cm, Some("bench-list"), body, &w).map_err(|e| SimError::Kube(e.to_string()))?;
            }
        }
    }
    let list_api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "bench-list",
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap")),
    );
    let mut times = Vec::new();
    let mut raw_times = Vec::new();
    let mut bytes = 0;
    for _ in 0..o.list_rounds.max(1) {
        let t = Instant::now();
        let l = list_api.list(&ListParams::default()).await.map_err(kerr)?;
        times.push(t.elapsed());
        if l.items.len() != o.list_objects {
            return Err(SimError::Kube(format!("listed {} objects, expected {}", l.items.len(), o.list_objects)));
        }
        // The same LIST read as bytes only: the server's part plus TLS, no client decoding.
        let req = http::Request::get("/api/v1/namespaces/bench-list/configmaps")
            .body(Vec::new())
            .map_err(|e| SimError::Kube(e.to_string()))?;
        let t = Instant::now();
        let text = client.request_text(req).await.map_err(kerr)?;
        raw_times.push(t.elapsed());
        bytes = text.len();
    }
    times.sort();
    raw_times.sort();
    let list_median = times[times.len() / 2];
    let list_bytes_median = raw_times[raw_times.len() / 2];

    // Phase 2: watch fan-out.
    let base = Instant::now();
    let rv = sim.resource_version().to_string();
    let total_writes = u64::from(o.writes_per_sec) * o.duration.as_secs().max(1);
    let mut roots = rustls::RootCertStore::empty();
    {
        use rustls_pki_types::pem::PemObject;
        let ca = rustls_pki_types::CertificateDer::from_pem_slice(sim.ca_pem().as_bytes())
            .map_err(|e| SimError::Kube(format!("reading the CA: {e}")))?;
        roots.add(ca).map_err(|e| SimError::Kube(e.to_string()))?;
    }
    let mut tls_cfg = rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth();
    tls_cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    let tls = tokio_rustls::TlsConnector::from(Arc::new(tls_cfg));
    let cpu_before = process_cpu();
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let watchers = {
        let (addr, token, n) = (sim.addr(), sim.token().to_string(), o.watchers);
        let path =
            format!("/api/v1/namespaces/bench-watch/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=290");
        let core = sim.core().clone();
        std::thread::Builder::new()
            .name("bench-watchers".into())
            .spawn(move || -> Result<(Vec<u64>, Duration), String> {
                let rt =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
                let cpu0 = thread_cpu();
                let lat = rt.block_on(async move {
                    let mut set = tokio::task::JoinSet::new();
                    for _ in 0..n {
                        set.spawn(raw_watcher(addr, tls.clone(), token.clone(), path.clone(), base, total_writes));
                    }
                    // Writes start once every watch is registered.
                    while core.lock().watch_count() < n {
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    let _ = ready_tx.send(());
                    let mut all = Vec::new();
                    while let Some(r) = set.join_next().await {
                        all.extend(r.map_err(|e| e.to_string())?.map_err(|e| e.to_string())?);
                    }
                    Ok::<_, String>(all)
                })?;
                Ok((lat, cpu_delta(cpu0, thread_cpu())))
            })
            .map_err(|e| SimError::io("starting the watcher thread", e))?
    };
    let _ = tokio::task::spawn_blocking(move || ready_rx.recv_timeout(Duration::from_secs(30))).await;
    let writer = {
        let kubeconfig = sim.kubeconfig_yaml();
        let period = Duration::from_secs_f64(1.0 / f64::from(o.writes_per_sec.max(1)));
        std::thread::Builder::new()
            .name("bench-writer".into())
            .spawn(move || -> Result<(u64, Duration, Duration), String> {
                let rt =
                    tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
                let cpu0 = thread_cpu();
                let (ok_writes, took) = rt.block_on(async move {
                    let kc = kube::config::Kubeconfig::from_yaml(&kubeconfig).map_err(|e| e.to_string())?;
                    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    let client = kube::Client::try_from(cfg).map_err(|e| e.to_string())?;
                    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                        client,
                        "bench-watch",
                        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap")),
                    );
                    let mut ticker = tokio::time::interval(period);
                    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
                    let in_flight = Arc::new(tokio::sync::Semaphore::new(64));
                    let started = Instant::now();
                    let mut writers = tokio::task::JoinSet::new();
                    for i in 0..total_writes {
                        ticker.tick().await;
                        let Ok(permit) = in_flight.clone().acquire_owned().await else { break };
                        let api = api.clone();
                        writers.spawn(async move {
                            let sent = base.elapsed().as_micros() as u64;
                            let body = json!({"data": {"sent": sent.to_string()}});
                            let r = api
                                .patch(&format!("w-{}", i % 100), &PatchParams::default(), &Patch::Merge(&body))
                                .await;
                            drop(permit);
                            r.is_ok()
                        });
                    }
                    let mut ok_writes = 0u64;
                    while let Some(r) = writers.join_next().await {
                        if matches!(r, Ok(true)) {
                            ok_writes += 1;
                        }
                    }
                    Ok::<_, String>((ok_writes, started.elapsed()))
                })?;
                Ok((ok_writes, took, cpu_delta(cpu0, thread_cpu())))
            })
            .map_err(|e| SimError::io("starting the writer thread", e))?
    };
    let joined = tokio::task::spawn_blocking(move || (writer.join(), watchers.join()))
        .await
        .map_err(|e| SimError::Kube(e.to_string()))?;
    // The writer and watcher threads have exited: what remains is the server's.
    let cpu_server = cpu_delta(cpu_before, process_cpu());
    let (ok_writes, write_time, cpu_writer) = match joined.0 {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => return Err(SimError::Kube(format!("writer: {e}"))),
        Err(_) => return Err(SimError::Kube("writer panicked".into())),
    };
    let (mut all, cpu_watchers) = match joined.1 {
        Ok(Ok(w)) => w,
        Ok(Err(e)) => return Err(SimError::Kube(format!("watchers: {e}"))),
        Err(_) => return Err(SimError::Kube("watchers panicked".into())),
    };
    all.sort_unstable();
    sim.shutdown();
    Ok(BenchReport {
        list_objects: o.list_objects,
        list_median,
        list_bytes_median,
        list_bytes: bytes,
        watchers: o.watchers,
        writes: ok_writes,
        writes_per_sec: ok_writes as f64 / write_time.as_secs_f64(),
        events_received: all.len() as u64,
        events_expected: ok_writes * o.watchers as u64,
        latency_p50: percentile(&all, 0.50),
        latency_p99: percentile(&all, 0.99),
        latency_max: all.last().map(|m| Duration::from_micros(*m)).unwrap_or_default(),
        fanout_wall: write_time,
        cpu_server,
        cpu_writer,
        cpu_watchers,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let v: Vec<u64> = (1..=100).collect();
        assert_eq!(percentile(&v, 0.5), Duration::from_micros(51));
        assert_eq!(percentile(&v, 0.99), Duration::from_micros(99));
        assert_eq!(percentile(&[], 0.99), Duration::ZERO);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn small_bench_delivers_every_event() {
        let r = bench(BenchOptions {
            list_objects: 50,
            list_rounds: 1,
            watchers: 3,
            writes_per_sec: 50,
            duration: Duration::from_secs(1),
        })
        .await
        .unwrap();
        assert_eq!(r.list_objects, 50);
        assert_eq!(r.writes, 50);
        assert_eq!(r.events_received, r.events_expected);
    }
}
