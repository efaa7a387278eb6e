//! `fleetwatch bench hub`: many synthetic agents (in this process) into one hub (a child
//! process), measured at one subscriber: delivered events/s, agent-to-subscriber latency
//! and the hub's peak RSS. The agents run in-process so that hundreds of them cost little
//! besides what is measured.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_agent::{AgentConfig, AgentRuntime};
use fleetwatch_certs::TlsFiles;
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_protocol::message::StartFrom;
use tokio_util::sync::CancellationToken;

use super::{bench_pki, percentile, rss_kib, start_hub};

#[derive(Args)]
pub(super) struct HubBench {
    /// Number of agents (each its own certificate and connection).
    #[arg(long, default_value_t = 100)]
    agents: usize,
    /// Total events per second offered by all agents together.
    #[arg(long, default_value_t = 10_000.0)]
    rate: f64,
    /// Seconds to measure (after the warm-up).
    #[arg(long, default_value_t = 10.0)]
    duration: f64,
    /// Seconds of warm-up not counted.
    #[arg(long, default_value_t = 2.0)]
    warmup: f64,
    /// Objects per agent.
    #[arg(long, default_value_t = 100)]
    objects: u64,
    /// Bytes of padding per event.
    #[arg(long, default_value_t = 0)]
    payload: usize,
    /// Give the hub a data directory (durable log with fsync) instead of memory only.
    #[arg(long)]
    durable: bool,
}

pub(super) async fn run(b: HubBench) -> anyhow::Result<()> {
    if b.agents == 0 || b.rate <= 0.0 || b.duration <= 0.0 {
        bail!("--agents, --rate and --duration must be positive");
    }
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;
    let mut hub = start_hub(&dir, b.durable, &[]).await?;
    let hub_pid = hub.child.id().context("hub pid")?;
    eprintln!("hub pid {hub_pid} at {} (admin {})", hub.wss, hub.admin);

    let files = |stem: &str| TlsFiles {
        cert: dir.join(format!("{stem}.crt")),
        key: dir.join(format!("{stem}.key")),
        ca: vec![dir.join("ca.crt")],
    };
    let tls = Arc::new(fleetwatch_certs::client_config(&files("subscriber-bench"))?);
    let mut opts = SubscriberOptions::new(hub.wss.clone(), tls);
    opts.from = StartFrom::Latest;
    opts.max_in_flight = 100_000;
    let mut sub = Subscription::connect(opts).await.context("subscriber")?;

    let stop = CancellationToken::new();
    let per_agent = b.rate / b.agents as f64;
    for i in 0..b.agents {
        let mut cfg = AgentConfig::new(hub.wss.clone(), files(&format!("agent-bench-{i}")));
        cfg.outbox_capacity = 1_000_000;
        let source = SyntheticSource { objects: b.objects, rate: per_agent, total: None, payload: b.payload };
        // Runs until `stop`; the handle is not needed (nothing waits for the agents).
        AgentRuntime::new(cfg)?.changes_buffer(1024).start(source, stop.clone());
        if i % 50 == 49 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    // Wait until every agent is connected.
    let connect_started = Instant::now();
    loop {
        let body = crate::admin_http::get(&hub.admin, "/api/v1/clusters").await.unwrap_or_default();
        let v: serde_json::Value = serde_json::from_str(&body).unwrap_or_default();
        let connected = v["clusters"].as_array().map_or(0, |a| a.iter().filter(|c| c["connected"] == true).count());
        if connected >= b.agents {
            eprintln!("{connected} agents connected in {:.1} s", connect_started.elapsed().as_secs_f64());
            break;
        }
        if connect_started.elapsed() > Duration::from_secs(120) {
            bail!("only {connected} of {} agents connected after 120 s", b.agents);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    let warmup_end = Instant::now() + Duration::from_secs_f64(b.warmup);
    let end = warmup_end + Duration::from_secs_f64(b.duration);
    let mut latencies_us: Vec<u64> = Vec::new();
    let mut counted = 0u64;
    let mut resyncs = 0u64;
    let mut peak_rss = 0u64;
    let mut last_sample = Instant::now();
    while Instant::now() < end {
        let d = match tokio::time::timeout_at(end.into(), sub.next()).await {
            Ok(d) => d?,
            Err(_) => break,
        };
        let now = Instant::now();
        let wall = jiff::Timestamp::now();
        match &d {
            Delivery::Events(evs) if now >= warmup_end => {
                for e in evs {
                    let lat = wall.as_microsecond() - e.time.as_microsecond();
                    latencies_us.push(lat.max(0) as u64);
                }
                counted += evs.len() as u64;
            }
            Delivery::ResyncRequired(_) => resyncs += 1,
            _ => {}
        }
        if let Some(c) = d.last_cursor() {
            sub.ack(c).await?;
        }
        if now.duration_since(last_sample) > Duration::from_millis(250) {
            last_sample = now;
            peak_rss = peak_rss.max(rss_kib(hub_pid, "VmRSS:").unwrap_or(0));
        }
    }
    let hwm = rss_kib(hub_pid, "VmHWM:").unwrap_or(peak_rss);
    stop.cancel();
    latencies_us.sort_unstable();
    let rate = counted as f64 / b.duration;
    let p50 = percentile(&latencies_us, 0.50);
    let p99 = percentile(&latencies_us, 0.99);
    let max = percentile(&latencies_us, 1.0);
    println!("agents:               {}", b.agents);
    println!("offered rate:         {:.0} events/s", b.rate);
    println!("delivered:            {counted} events in {:.1} s = {rate:.0} events/s", b.duration);
    println!("latency p50 / p99:    {p50:.2} ms / {p99:.2} ms (max {max:.2} ms)");
    println!("hub peak RSS:         {:.1} MiB", hwm as f64 / 1024.0);
    println!("resync-required seen: {resyncs}");
    println!(
        "{}",
        serde_json::json!({
            "bench": "hub", "agents": b.agents, "offered_rate": b.rate, "durable": b.durable,
            "delivered_per_sec": rate.round(), "latency_ms_p50": p50, "latency_ms_p99": p99,
            "latency_ms_max": max, "hub_peak_rss_mib": (hwm as f64 / 1024.0 * 10.0).round() / 10.0,
        })
    );
    let _ = hub.child.start_kill();
    let _ = hub.child.wait().await;
    Ok(())
}
