//! `cargo run --release -p fleetwatch-sim --example bench [RATE [WATCHERS]]`: LIST of 10,000
//! objects and watch fan-out (default 100 watchers at 1,000 writes/s) with write->event
//! latency percentiles.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let mut opts = fleetwatch_sim::BenchOptions::default();
    if let Some(rate) = args.next() {
        opts.writes_per_sec = rate.parse()?;
    }
    if let Some(w) = args.next() {
        opts.watchers = w.parse()?;
    }
    let report = fleetwatch_sim::bench(opts).await?;
    println!("{report}");
    Ok(())
}
