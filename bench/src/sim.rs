//! `fleetwatch bench sim`: the simulated API server's LIST of many objects and its watch
//! fan-out latency; the measuring itself is `fleetwatch_sim::bench`, next to what it measures.

use std::time::Duration;

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub(super) struct SimBench {
    /// Objects in the listed collection.
    #[arg(long, default_value_t = 10_000)]
    list_objects: usize,
    /// Concurrent watchers.
    #[arg(long, default_value_t = 100)]
    watchers: usize,
    /// Writes per second during the fan-out phase.
    #[arg(long, default_value_t = 1_000)]
    writes_per_sec: u32,
    /// Seconds of the fan-out phase.
    #[arg(long, default_value_t = 5.0)]
    duration: f64,
}

pub(super) async fn run(b: SimBench) -> anyhow::Result<()> {
    let opts = fleetwatch_sim::BenchOptions {
        list_objects: b.list_objects,
        watchers: b.watchers,
        writes_per_sec: b.writes_per_sec,
        duration: Duration::try_from_secs_f64(b.duration).context("--duration")?,
        ..fleetwatch_sim::BenchOptions::default()
    };
    let report = fleetwatch_sim::bench(opts).await?;
    println!("{report}");
    Ok(())
}
