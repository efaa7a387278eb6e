//! The simulator's benchmark: LIST of many objects, and watch fan-out (many watchers, a
//! steady write rate) with the latency from issuing a write to each watcher receiving
//! its event. Runs real clients (kube-rs) over real TLS on loopback.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
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
    pub list_objects: usize,
    /// Median wall time of one full LIST (client decode included).
    pub list_median: Duration,
    pub list_bytes: usize,
    pub watchers: usize,
    pub writes: u64,
    /// Achieved write rate.
    pub writes_per_sec: f64,
    /// Events received over all watchers, and how many were expected.
    pub events_received: u64,
    pub events_expected: u64,
    pub latency_p50: Duration,
    pub latency_p99: Duration,
    pub latency_max: Duration,
}

impl std::fmt::Display for BenchReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(
            f,
            "list {} objects: median {:?} ({} KiB)",
            self.list_objects,
            self.list_median,
            self.list_bytes / 1024
        )?;
        writeln!(
            f,
            "watch fan-out: {} watchers, {} writes at {:.0}/s, {}/{} events delivered",
            self.watchers, self.writes, self.writes_per_sec, self.events_received, self.events_expected
        )?;
        write!(
            f,
            "write->event latency: p50 {:?}, p99 {:?}, max {:?}",
            self.latency_p50, self.latency_p99, self.latency_max
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

/// Runs the benchmark against a fresh in-process cluster.
pub async fn bench(o: BenchOptions) -> Result<BenchReport, SimError> {
    use kube::api::{Api, ListParams, Patch, PatchParams};
    let sim =
        SimCluster::start(SimOptions { history: 100_000, watch_buffer: 100_000, ..SimOptions::default() }).await?;
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
    let mut bytes = 0;
    for _ in 0..o.list_rounds.max(1) {
        let t = Instant::now();
        let l = list_api.list(&ListParams::default()).await.map_err(kerr)?;
        times.push(t.elapsed());
        if l.items.len() != o.list_objects {
            return Err(SimError::Kube(format!("listed {} objects, expected {}", l.items.len(), o.list_objects)));
        }
        bytes = serde_json::to_vec(&l.items).map(|v| v.len()).unwrap_or(0);
    }
    times.sort();
    let list_median = times[times.len() / 2];

    // Phase 2: watch fan-out.
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
        client.clone(),
        "bench-watch",
        &kube::api::ApiResource::from_gvk(&kube::api::GroupVersionKind::gvk("", "v1", "ConfigMap")),
    );
    let base = Instant::now();
    let rv = sim.resource_version().to_string();
    let total_writes = u64::from(o.writes_per_sec) * o.duration.as_secs().max(1);
    let mut handles = Vec::new();
    for _ in 0..o.watchers {
        // Watchers read the raw event lines and pick out the send time, so the figure is
        // the server's fan-out rather than 100 clients decoding JSON on a 2-core machine.
        let uri =
            format!("/api/v1/namespaces/bench-watch/configmaps?watch=true&resourceVersion={rv}&timeoutSeconds=290");
        let req = http::Request::get(uri).body(Vec::new()).map_err(|e| SimError::Kube(e.to_string()))?;
        let reader = client.request_stream(req).await.map_err(kerr)?;
        handles.push(tokio::spawn(async move {
            use futures_util::AsyncBufReadExt;
            let mut lat = Vec::with_capacity(total_writes as usize);
            let mut lines = std::pin::pin!(reader.lines());
            while let Ok(Some(Ok(line))) = tokio::time::timeout(Duration::from_secs(10), lines.next()).await {
                let Some(i) = line.find("\"sent\":\"") else { continue };
                let rest = &line[i + 8..];
                let sent: u64 = rest.split('"').next().and_then(|v| v.parse().ok()).unwrap_or(0);
                let now = base.elapsed().as_micros() as u64;
                lat.push(now.saturating_sub(sent));
                if lat.len() as u64 >= total_writes {
                    break;
                }
            }
            lat
        }));
    }
    let period = Duration::from_secs_f64(1.0 / f64::from(o.writes_per_sec.max(1)));
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
            let r = api.patch(&format!("w-{}", i % 100), &PatchParams::default(), &Patch::Merge(&body)).await;
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
    let write_time = started.elapsed();
    let mut all = Vec::new();
    for h in handles {
        if let Ok(l) = h.await {
            all.extend(l);
        }
    }
    all.sort_unstable();
    sim.shutdown();
    Ok(BenchReport {
        list_objects: o.list_objects,
        list_median,
        list_bytes: bytes,
        watchers: o.watchers,
        writes: ok_writes,
        writes_per_sec: ok_writes as f64 / write_time.as_secs_f64(),
        events_received: all.len() as u64,
        events_expected: ok_writes * o.watchers as u64,
        latency_p50: percentile(&all, 0.50),
        latency_p99: percentile(&all, 0.99),
        latency_max: all.last().map(|m| Duration::from_micros(*m)).unwrap_or_default(),
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
