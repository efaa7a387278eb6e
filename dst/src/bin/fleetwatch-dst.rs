//! Runs simulation seeds: `fleetwatch-dst [--seed S | --seeds N [--first F]] [--storage
//! memory|disk|mixed] [--fault-secs T]`. Prints each failing seed with its violations and
//! the command that replays it; exits 1 when one failed. `DST_LOG=info` logs a replay.

use std::time::{Duration, Instant};

use fleetwatch_dst::{Options, Storage, replay_command, run};

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
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |name: &str| args.next().ok_or_else(|| format!("{name} needs a value"));
        let num = |v: String, name: &str| v.parse::<u64>().map_err(|_| format!("{name}: {v:?} is not a number"));
        match a.as_str() {
            "--seed" => seed = Some(num(value("--seed")?, "--seed")?),
            "--seeds" => seeds = Some(num(value("--seeds")?, "--seeds")?),
            "--first" => first = num(value("--first")?, "--first")?,
            "--storage" => opts.storage = value("--storage")?.parse::<Storage>()?,
            "--fault-secs" => opts.fault_time = Duration::from_secs(num(value("--fault-secs")?, "--fault-secs")?),
            "--verbose" => {}
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    let list: Vec<u64> = match (seed, seeds) {
        (Some(s), _) => vec![s],
        (None, n) => (first..first + n.unwrap_or(100)).collect(),
    };
    let started = Instant::now();
    let mut failed = Vec::new();
    for s in &list {
        let r = run(*s, &opts).map_err(|e| format!("seed {s}: {e:#}"))?;
        if list.len() == 1 {
            println!(
                "seed {s}: {} ; writes {} ; faults {:?} ; delivered {:?} ; {:.1}s simulated in {:.2}s ; fingerprint {:016x}",
                r.scenario,
                r.writes,
                r.faults,
                r.delivered,
                r.sim_time.as_secs_f64(),
                r.wall_time.as_secs_f64(),
                r.fingerprint
            );
        }
        if !r.passed() {
            println!("FAILED seed {s} ({}):", r.scenario);
            for v in &r.violations {
                println!("  {v}");
            }
            println!("  replay: {}", replay_command(*s, &opts));
            failed.push(*s);
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!(
        "{} seeds in {secs:.1}s ({:.1} seeds/s), {} failed{}",
        list.len(),
        list.len() as f64 / secs.max(1e-9),
        failed.len(),
        if failed.is_empty() { String::new() } else { format!(": {failed:?}") }
    );
    if failed.is_empty() { Ok(()) } else { std::process::exit(1) }
}
