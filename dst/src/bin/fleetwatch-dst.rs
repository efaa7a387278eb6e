//! Runs simulation seeds: `fleetwatch-dst [--seed S | --seeds N [--first F]] [--storage
//! memory|disk|mixed|nats] [--fault-secs T] [--no-durable-crashes] [--jobs J]`. Prints each failing seed with its violations and
//! the command that replays it; exits 1 when one failed. `DST_LOG=info` logs a replay.

use std::time::Duration;

use fleetwatch_dst::{Options, Storage, print_report, run_seeds};

fn main() {
    if let Err(e) = real_main() {
        eprintln!("fleetwatch-dst: {e}");
        std::process::exit(2);
    }
}

fn real_main() -> Result<(), String> {
    let mut opts = Options::default();
    let mut seeds: Option<u64> = None;
    let mut seed: Option<u64> = None;
    let mut first = 0u64;
    let mut jobs: Option<usize> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |v: String, name: &str| v.parse::<u64>().map_err(|_| format!("{name}: {v:?} is not a number"));
        match a.as_str() {
            "--seed" => seed = Some(num(value("--seed")?, "--seed")?),
            "--seeds" => seeds = Some(num(value("--seeds")?, "--seeds")?),
            "--first" => first = num(value("--first")?, "--first")?,
            "--jobs" => jobs = Some(num(value("--jobs")?, "--jobs")? as usize),
            "--storage" => opts.storage = value("--storage")?.parse::<Storage>()?,
            "--fault-secs" => opts.fault_time = Duration::from_secs(num(value("--fault-secs")?, "--fault-secs")?),
            "--no-durable-crashes" => opts.durable_crashes = false,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let list: Vec<u64> = match (seed, seeds) {
        (Some(s), _) => vec![s],
        (None, n) => (first..first + n.unwrap_or(100)).collect(),
    };
    let single = list.len() == 1;
    let jobs =
        if single { 1 } else { jobs.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get())) };
    let summary = run_seeds(&list, &opts, jobs, |r| print_report(r, &opts, single)).map_err(|e| format!("{e:#}"))?;
    let secs = summary.wall.as_secs_f64().max(1e-9);
    let failed: Vec<u64> = summary.failed.iter().map(|r| r.seed).collect();
    println!(
        "{} seeds in {secs:.1}s on {jobs} threads ({:.1} seeds/s), {} failed{}",
        summary.ran,
        summary.ran as f64 / secs,
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(": {failed:?}") }
    );
    if failed.is_empty() { Ok(()) } else { std::process::exit(1) }
}
