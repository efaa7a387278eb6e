//! `fleetwatch bench dst`: many seeds of the deterministic simulation of the delivery path
//! (`fleetwatch-dst`: the real agent, hub and subscriber client on a simulated network
//! under faults, checked by its oracle). Prints how many ran, how fast, and every failing
//! seed with what broke and how to replay it.

use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_dst::{Options, Storage, print_report, run_seeds};

#[derive(Args)]
pub(super) struct DstBench {
    /// How many seeds, from --first on.
    #[arg(long, default_value_t = 1_000)]
    seeds: u64,
    /// The first seed.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Run only this seed (a replay), with its details.
    #[arg(long)]
    seed: Option<u64>,
    /// The hub's bus: memory, disk (the segment log), mixed (chosen per seed) or nats (2-3 hub
    /// replicas on an in-memory JetStream).
    #[arg(long, default_value = "mixed")]
    storage: String,
    /// Simulated seconds of faults per seed.
    #[arg(long, default_value_t = 10)]
    fault_secs: u64,
    /// Keep the durable subscriber's process alive (by default it crashes too, and its
    /// name must resume where the hub's cursor says).
    #[arg(long)]
    no_durable_crashes: bool,
    /// Threads (each runs one simulation at a time); default: the CPUs.
    #[arg(long)]
    jobs: Option<usize>,
}

pub(super) async fn run(b: DstBench) -> anyhow::Result<()> {
    let opts = Options {
        storage: b.storage.parse::<Storage>().map_err(anyhow::Error::msg).context("--storage")?,
        fault_time: Duration::from_secs(b.fault_secs),
        durable_crashes: !b.no_durable_crashes,
        ..Options::default()
    };
    let seeds: Vec<u64> = match b.seed {
        Some(s) => vec![s],
        None => (b.first..b.first.saturating_add(b.seeds)).collect(),
    };
    let jobs = b.jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let single = seeds.len() == 1;
    // The simulation runs its own (simulated) runtimes: not on this one's threads.
    let summary =
        tokio::task::spawn_blocking(move || run_seeds(&seeds, &opts, jobs, |r| print_report(r, &opts, single)))
            .await
            .context("simulation thread")??;
    let wall = summary.wall.as_secs_f64().max(1e-9);
    println!(
        "dst: {} seeds in {:.1}s on {jobs} threads ({:.1} seeds/s, {:.0}x real time), {} events delivered, {} failed{}",
        summary.ran,
        wall,
        summary.ran as f64 / wall,
        summary.simulated.as_secs_f64() / wall,
        summary.delivered,
        summary.failed.len(),
        if summary.failed.is_empty() {
            String::new()
        } else {
            format!(": {:?}", summary.failed.iter().map(|r| r.seed).collect::<Vec<_>>())
        }
    );
    if summary.failed.is_empty() { Ok(()) } else { anyhow::bail!("{} seeds failed", summary.failed.len()) }
}
