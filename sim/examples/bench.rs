//! `cargo run --release -p fleetwatch-sim --example bench`: LIST of 10,000 objects and watch
//! fan-out to 100 watchers at 1,000 writes/s, with write->event latency percentiles.
#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let report = fleetwatch_sim::bench(fleetwatch_sim::BenchOptions::default()).await?;
    println!("{report}");
    Ok(())
}
