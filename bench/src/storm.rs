//! `fleetwatch bench storm`: a reconnect storm. N synthetic agents connect to a hub (a child
//! process); the hub is SIGKILLed and at once restarted on the same port (with the same
//! data directory when `--durable`); the bench reports how long after the kill 50, 90, 99
//! and 100 % of the agents were back: connected in a new session that acked everything the
//! agent had produced by the kill (so the new hub holds their state: resynced). A memory hub
//! starts over, so subscribers get `resync-required`; a durable one resumes each stream.
//!
//! With `--hub-replicas N` (2 or more) the hubs are N replicas on a local nats-server
//! JetStream: the last replica is SIGKILLed and not restarted, its agents fail over to the
//! others, and the times are those of the agents that lost their session (counted as
//! they notice) being back; every agent must end connected.
//!
//! Agents report their state a few times a second (the agent every 250 ms, a load process
//! every 100 ms), so each time is late by up to about 0.35 s.

use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_agent::source::SyntheticSource;

use super::load::{Load, LoadSpec};
use super::{bench_pki, cpu_seconds, rss_kib, start_hub_at};

#[derive(Args)]
pub(super) struct StormBench {
    /// Number of agents (each its own certificate and connection).
    #[arg(long, default_value_t = 1000)]
    agents: usize,
    /// Objects per agent.
    #[arg(long, default_value_t = 10)]
    objects: u64,
    /// Events per second offered by all agents together (they keep producing through the
    /// storm).
    #[arg(long, default_value_t = 1000.0)]
    rate: f64,
    /// Give the hub a data directory (durable log), kept through the restart.
    #[arg(long)]
    durable: bool,
    /// Run the agents in this many child processes (0: in the bench process).
    #[arg(long, default_value_t = 1)]
    load_procs: usize,
    /// Give up waiting for agents after this many seconds.
    #[arg(long, default_value_t = 120.0)]
    timeout: f64,
    /// The hub's `--max-handshakes` (and, with one hub, `--max-handshakes-per-ip`; each
    /// bench agent dials from its own loopback address, as a fleet's come from many).
    #[arg(long, default_value_t = 1024)]
    handshakes: usize,
    /// Hub replicas on a local nats-server JetStream (the Debian package, or the first
    /// `nats-server` on PATH): 2 or more kills one replica for good instead of restarting
    /// the hub.
    #[arg(long, default_value_t = 1)]
    hub_replicas: usize,
    /// Print one JSON object with every figure as the last line.
    #[arg(long)]
    json: bool,
}

/// The hub's log level: a memory hub warns once per agent that it lost its events.
const HUB_LOG: &str = "error";

/// The fractions of agents whose return is timed.
const MILESTONES: [f64; 4] = [0.5, 0.9, 0.99, 1.0];

pub(super) async fn run(b: StormBench) -> anyhow::Result<()> {
    if b.agents == 0 || b.rate <= 0.0 || b.objects == 0 || b.timeout <= 0.0 {
        bail!("--agents, --objects, --rate and --timeout must be positive");
    }
    if b.hub_replicas == 0 {
        bail!("--hub-replicas must be positive");
    }
    if b.hub_replicas > 1 && b.durable {
        bail!("--durable is for one hub: replicas keep their stream in JetStream");
    }
    let clusters: Vec<String> = (0..b.agents).map(|i| format!("bench-{i}")).collect();
    let (_tmp, dir) = bench_pki(&clusters)?;
    if b.hub_replicas > 1 {
        return replicas(&b, &dir).await;
    }
    let handshakes = b.handshakes.to_string();
    // --bind-retry: the hub is restarted on its port at once, while the old one's sockets
    // may still be closing.
    let hub_args = ["--max-handshakes", &handshakes, "--max-handshakes-per-ip", &handshakes, "--bind-retry", "10"];
    let mut hub = start_hub_at(&dir, b.durable, 0, HUB_LOG, &hub_args).await?;
    let port = hub.wss.port;
    let source = SyntheticSource { objects: b.objects, rate: b.rate / b.agents as f64, total: None, payload: 0 };
    let spec = LoadSpec { pki: dir.clone(), hubs: vec![hub.wss.clone()], agents: b.agents, source, jetstream: None };
    let (mut load, connect_secs) = start_connected(&spec, &b).await?;
    eprintln!("{} agents connected in {connect_secs:.1} s; killing the hub", b.agents);

    load.mark().await?;
    // Let the mark reach every load process before the kill (they answer within 100 ms).
    tokio::time::sleep(Duration::from_millis(300)).await;
    let killed = Instant::now();
    hub.child.start_kill().context("kill hub")?;
    let _ = hub.child.wait().await;
    // Restarted at once: the new hub must get the port although the old one's sockets are
    // still closing (--bind-retry retries an address in use).
    hub = start_hub_at(&dir, b.durable, port, HUB_LOG, &hub_args).await.context("restarting the hub on its port")?;
    let restarted_secs = killed.elapsed().as_secs_f64();
    let pid = hub.child.id().context("hub pid")?;
    let cpu_at_restart = cpu_seconds(pid).unwrap_or(0.0);
    let load_cpu_at_restart = load.cpu_seconds();
    let mut times: Vec<Option<f64>> = vec![None; MILESTONES.len()];
    let mut peak_rss = 0;
    while times.iter().any(Option::is_none) && killed.elapsed() < Duration::from_secs_f64(b.timeout) {
        let back = load.back();
        let t = killed.elapsed().as_secs_f64();
        for (slot, frac) in times.iter_mut().zip(MILESTONES) {
            if slot.is_none() && back >= needed(b.agents, frac) {
                *slot = Some(t);
            }
        }
        peak_rss = peak_rss.max(rss_kib(pid, "VmRSS:").unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let hub_cpu = cpu_seconds(pid).unwrap_or(0.0) - cpu_at_restart;
    let load_cpu = load.cpu_seconds() - load_cpu_at_restart;
    peak_rss = peak_rss.max(rss_kib(pid, "VmHWM:").unwrap_or(0));
    let back = load.back();
    load.stop().await;

    println!("agents:            {} ({} load process(es); connected in {connect_secs:.1} s)", b.agents, b.load_procs);
    println!(
        "hub:               {}; restarted {restarted_secs:.2} s after the kill",
        if b.durable { "durable" } else { "memory" }
    );
    for (frac, t) in MILESTONES.iter().zip(&times) {
        match t {
            Some(t) => println!("{:>4.0} % back:        {t:.2} s after the kill", frac * 100.0),
            None => println!("{:>4.0} % back:        not within {} s ({back} back)", frac * 100.0, b.timeout),
        }
    }
    println!("hub after restart: {hub_cpu:.1} CPU s until all were back, peak RSS {:.1} MiB", peak_rss as f64 / 1024.0);
    println!("load after restart: {load_cpu:.1} CPU s (the agents' side of the handshakes)");
    if b.json {
        let json = serde_json::json!({
            "bench": "storm", "agents": b.agents, "durable": b.durable, "load_procs": b.load_procs,
            "connect_seconds": connect_secs, "restarted_seconds": restarted_secs,
            "back_50_s": times[0], "back_90_s": times[1], "back_99_s": times[2], "back_100_s": times[3],
            "agents_back": back, "hub_cpu_seconds": hub_cpu, "load_cpu_seconds": load_cpu, "hub_peak_rss_bytes": peak_rss * 1024,
        });
        println!("{json}");
    }
    Ok(())
}

/// Starts the load and waits until every agent is connected (at most `--timeout`);
/// answers the load and the seconds that took.
async fn start_connected(spec: &LoadSpec, b: &StormBench) -> anyhow::Result<(Load, f64)> {
    let started = Instant::now();
    let load = Load::start(spec, b.load_procs).await?;
    while load.connected() < b.agents {
        if started.elapsed() > Duration::from_secs_f64(b.timeout) {
            bail!("only {} of {} agents connected after {} s", load.connected(), b.agents, b.timeout);
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok((load, started.elapsed().as_secs_f64()))
}

/// The replica storm: N replicas on JetStream, the last one killed for good.
async fn replicas(b: &StormBench, dir: &std::path::Path) -> anyhow::Result<()> {
    let store = dir.join("nats");
    let nats = tokio::task::spawn_blocking(move || fleetwatch_bus::nats::server::LocalNatsServer::start(&store))
        .await?
        .context("cannot start a local nats-server")?;
    let url = nats.url();
    let handshakes = b.handshakes.to_string();
    let hub_args = ["--bus", url.as_str(), "--bus-stream", "storm", "--max-handshakes", handshakes.as_str()];
    let mut hubs = Vec::new();
    for _ in 0..b.hub_replicas {
        hubs.push(start_hub_at(dir, false, 0, HUB_LOG, &hub_args).await?);
    }
    let source = SyntheticSource { objects: b.objects, rate: b.rate / b.agents as f64, total: None, payload: 0 };
    let urls = hubs.iter().map(|h| h.wss.clone()).collect();
    let spec = LoadSpec { pki: dir.to_path_buf(), hubs: urls, agents: b.agents, source, jetstream: None };
    let (mut load, connect_secs) = start_connected(&spec, b).await?;
    let mut victim = hubs.pop().context("no replica")?;
    eprintln!("{} agents connected to {} replicas in {connect_secs:.1} s; killing one", b.agents, b.hub_replicas);
    load.mark().await?;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let pids: Vec<u32> = hubs.iter().filter_map(|h| h.child.id()).collect();
    let cpu = |load: &Load| (pids.iter().filter_map(|p| cpu_seconds(*p)).sum::<f64>(), load.cpu_seconds());
    let (hub_cpu0, load_cpu0) = cpu(&load);
    let killed = Instant::now();
    victim.child.start_kill().context("kill replica")?;
    let _ = victim.child.wait().await;
    let mut times: Vec<Option<f64>> = vec![None; MILESTONES.len()];
    let mut all_connected = None;
    let mut moved = 0;
    let mut peak_rss = 0;
    while (times.iter().any(Option::is_none) || all_connected.is_none())
        && killed.elapsed() < Duration::from_secs_f64(b.timeout)
    {
        // Agents notice the kill as their sockets close: the count grows for a moment.
        moved = moved.max(load.moved());
        let back = load.back();
        let t = killed.elapsed().as_secs_f64();
        if moved > 0 {
            for (slot, frac) in times.iter_mut().zip(MILESTONES) {
                if slot.is_none() && back >= needed(moved, frac) {
                    *slot = Some(t);
                }
            }
        }
        if all_connected.is_none() && moved > 0 && load.connected() >= b.agents {
            all_connected = Some(t);
        }
        peak_rss = pids.iter().map(|p| rss_kib(*p, "VmRSS:").unwrap_or(0)).fold(peak_rss, u64::max);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (hub_cpu1, load_cpu1) = cpu(&load);
    peak_rss = pids.iter().map(|p| rss_kib(*p, "VmHWM:").unwrap_or(0)).fold(peak_rss, u64::max);
    let back = load.back();
    load.stop().await;
    drop(hubs);
    drop(nats);

    println!(
        "agents:            {} ({} load process(es); connected to {} replicas in {connect_secs:.1} s)",
        b.agents, b.load_procs, b.hub_replicas
    );
    println!("killed:            1 replica (SIGKILL, not restarted); {moved} agents lost their session");
    for (frac, t) in MILESTONES.iter().zip(&times) {
        match t {
            Some(t) => println!("{:>4.0} % of those back: {t:.2} s after the kill", frac * 100.0),
            None => println!("{:>4.0} % of those back: not within {} s ({back} back)", frac * 100.0, b.timeout),
        }
    }
    match all_connected {
        Some(t) => println!("all {} connected:  {t:.2} s after the kill", b.agents),
        None => println!("all {} connected:  not within {} s", b.agents, b.timeout),
    }
    println!(
        "survivors:         {:.1} CPU s meanwhile, peak RSS {:.1} MiB (largest)",
        hub_cpu1 - hub_cpu0,
        peak_rss as f64 / 1024.0
    );
    println!("load meanwhile:    {:.1} CPU s (the agents' side of the handshakes)", load_cpu1 - load_cpu0);
    if b.json {
        let json = serde_json::json!({
            "bench": "storm", "agents": b.agents, "hub_replicas": b.hub_replicas, "load_procs": b.load_procs,
            "connect_seconds": connect_secs, "agents_moved": moved,
            "back_50_s": times[0], "back_90_s": times[1], "back_99_s": times[2], "back_100_s": times[3],
            "all_connected_s": all_connected, "agents_back": back,
            "hub_cpu_seconds": hub_cpu1 - hub_cpu0, "load_cpu_seconds": load_cpu1 - load_cpu0,
            "hub_peak_rss_bytes": peak_rss * 1024,
        });
        println!("{json}");
    }
    Ok(())
}

/// Agents needed for a fraction of `n` (rounded up: 99 % of 10 is all 10).
fn needed(n: usize, frac: f64) -> usize {
    ((n as f64 * frac).ceil() as usize).clamp(1, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn milestones_round_up() {
        assert_eq!(needed(10_000, 0.5), 5_000);
        assert_eq!(needed(10_000, 0.99), 9_900);
        assert_eq!(needed(10, 0.99), 10);
        assert_eq!(needed(3, 0.5), 2);
        assert_eq!(needed(1, 0.5), 1);
        assert_eq!(needed(7, 1.0), 7);
    }
}
