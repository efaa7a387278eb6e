//! `fleetwatch maintenance`: resolve maintenance windows from a policy file, with the code
//! the lifecycle operator uses.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use fleetwatch_api::maintenance::{MaintenanceError, MaintenancePolicySpec, NextWindowOptions, RuntimeLabels};
use jiff::{SignedDuration, Timestamp};

#[derive(Args)]
pub struct MaintenanceArgs {
    #[command(subcommand)]
    command: MaintenanceCommand,
}

#[derive(Subcommand)]
enum MaintenanceCommand {
    /// Print the next maintenance window of a runtime as {"begin": RFC 3339, "end": RFC 3339}.
    Next(NextArgs),
}

#[derive(Args)]
struct NextArgs {
    /// Maintenance policy file (JSON, as lifecycle-manager's policy files).
    #[arg(long)]
    policy: PathBuf,
    /// A runtime label rules match on: plan=X, region=Y, platformRegion=Z or
    /// globalAccountID=W (repeatable).
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Resolve at this time (RFC 3339) instead of now.
    #[arg(long, value_name = "RFC3339")]
    at: Option<Timestamp>,
    /// Return the window in progress if at least --min-remaining of it is left.
    #[arg(long)]
    ongoing: bool,
    /// With --ongoing: how much of the current window must remain, e.g. 20m, 1h30m.
    #[arg(long, value_name = "DURATION", default_value = "20m", value_parser = parse_duration, requires = "ongoing")]
    min_remaining: SignedDuration,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    RuntimeLabels::default().set(name, value).map_err(|e| e.to_string())?;
    Ok((name.to_string(), value.to_string()))
}

fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let d: SignedDuration = s.parse().map_err(|e| format!("{e} (expected e.g. 20m, 1h30m)"))?;
    if d.is_negative() {
        return Err("must not be negative".into());
    }
    Ok(d)
}

pub fn run(args: MaintenanceArgs) -> anyhow::Result<()> {
    match args.command {
        MaintenanceCommand::Next(args) => next(args),
    }
}

fn next(args: NextArgs) -> anyhow::Result<()> {
    let path = args.policy.display();
    let json = std::fs::read_to_string(&args.policy).with_context(|| format!("cannot read {path}"))?;
    let policy = serde_json::from_str::<MaintenancePolicySpec>(&json)
        .map_err(MaintenanceError::from)
        .and_then(|p| p.compile())
        .with_context(|| format!("invalid maintenance policy {path}"))?;
    let mut labels = RuntimeLabels::default();
    for (name, value) in args.labels {
        labels.set(&name, value)?;
    }
    let opts = NextWindowOptions { ongoing: args.ongoing, min_remaining: args.min_remaining };
    let window = policy.next_window(&labels, args.at.unwrap_or_else(Timestamp::now), opts)?;
    println!("{}", serde_json::to_string(&window)?);
    Ok(())
}
