//! Many seeds on several threads (each simulation is single-threaded): what `fleetwatch
//! bench dst` and the `fleetwatch-dst` program run.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use crate::sim::{Options, Report, run};

/// What a batch of seeds found.
#[derive(Debug, Default)]
pub struct Summary {
    /// Seeds run.
    pub ran: u64,
    /// The reports of the seeds that failed, by seed.
    pub failed: Vec<Report>,
    /// Wall-clock time of the batch.
    pub wall: Duration,
    /// Simulated time of all seeds together.
    pub simulated: Duration,
    /// Events delivered to subscribers in all seeds together.
    pub delivered: u64,
}

/// Runs `seeds` on `jobs` threads; `each` sees every report as it comes (in completion
/// order). A seed that cannot run at all (no certificates) ends the batch with the error.
pub fn run_seeds(seeds: &[u64], opts: &Options, jobs: usize, mut each: impl FnMut(&Report)) -> anyhow::Result<Summary> {
    let started = Instant::now();
    let next = AtomicUsize::new(0);
    let (tx, rx) = mpsc::channel::<anyhow::Result<Report>>();
    let mut summary = Summary::default();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        for _ in 0..jobs.max(1) {
            let tx = tx.clone();
            let next = &next;
            scope.spawn(move || {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(&seed) = seeds.get(i) else { return };
                    if tx.send(run(seed, opts)).is_err() {
                        return;
                    }
                }
            });
        }
        drop(tx);
        for result in rx {
            let report = match result {
                Ok(r) => r,
                Err(e) => {
                    // Stop the other threads after their current seed.
                    next.store(seeds.len(), Ordering::Relaxed);
                    return Err(e);
                }
            };
            summary.ran += 1;
            summary.simulated += report.sim_time;
            summary.delivered += report.delivered.iter().map(|(_, events, _)| events).sum::<u64>();
            each(&report);
            if !report.passed() {
                summary.failed.push(report);
            }
        }
        Ok(())
    })?;
    summary.failed.sort_by_key(|r| r.seed);
    summary.wall = started.elapsed();
    Ok(summary)
}

/// Prints what a seed found, as both the `fleetwatch-dst` program and `fleetwatch bench dst`
/// show it: the details of a seed run alone (`detailed`), and for a failed seed its
/// violations and the command that replays it.
pub fn print_report(r: &Report, opts: &Options, detailed: bool) {
    if detailed {
        println!(
            "seed {}: {}\n  writes {}, faults {:?}, delivered {:?}, heads swept {}, {:.1}s simulated in {:.2}s, fingerprint {:016x}",
            r.seed,
            r.scenario,
            r.writes,
            r.faults,
            r.delivered,
            r.swept,
            r.sim_time.as_secs_f64(),
            r.wall_time.as_secs_f64(),
            r.fingerprint
        );
    }
    if !r.passed() {
        println!("FAILED seed {} ({}):", r.seed, r.scenario);
        for v in &r.violations {
            println!("  {v}");
        }
        println!("  replay: {}", crate::sim::replay_command(r.seed, opts));
    }
}
