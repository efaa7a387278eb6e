//! Serves simulated clusters from the command line, like `fleetwatch sim`:
//! `cargo run -p fleetwatch-sim --example serve -- --listen 127.0.0.1:6443 --kubeconfig-out /tmp/sim.kubeconfig`
use clap::Parser;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    sim: fleetwatch_sim::SimArgs,
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        let _ = tokio::signal::ctrl_c().await;
        t.cancel();
    });
    fleetwatch_sim::run(cli.sim, token).await?;
    Ok(())
}
