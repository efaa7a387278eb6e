//! `fleetwatch bench lifecycle` with its simulated runtime clusters spread over sim child
//! processes (`bench lifecycle-sims`): every module converges, and no sim process outlives
//! the bench, also when the bench is killed.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The pids of live sim processes of the bench run marked with `mark` (an environment
/// variable its children inherit, so other runs on the machine do not count).
fn sim_processes(mark: &str) -> Vec<u32> {
    let want = format!("FLEETWATCH_TEST_RUN={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            let has = |hay: &[u8], needle: &[u8]| hay.split(|b| *b == 0).any(|w| w == needle);
            has(&cmdline, b"lifecycle-sims") && has(&environ, want.as_bytes())
        })
        .collect()
}

fn bench(mark: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(BIN);
    cmd.args(["--log", "warn", "bench", "lifecycle"]).args(args).env("FLEETWATCH_TEST_RUN", mark);
    cmd
}

#[test]
fn sims_in_two_processes_every_module_converges_after_a_channel_move() {
    let mark = format!("bench-lifecycle-{}", std::process::id());
    let child = bench(&mark, &["--runtimes", "20", "--modules", "2", "--shards", "2", "--processes"])
        .args(["--sims-per-process", "10"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the bench gives up by itself after 600 s without convergence.
    let (status, stdout, stderr) = finish_within(child, Duration::from_secs(900));
    let logs = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.is_some_and(|s| s.success()), "bench failed or hung: {logs}");
    // The JSON line; the bench prints it only once every Runtime had every module Ready at
    // the first version and then m0 at the moved channel's version.
    let json: serde_json::Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok().filter(|v: &serde_json::Value| v["bench"] == "lifecycle"))
        .unwrap_or_else(|| panic!("no JSON line: {logs}"));
    assert_eq!(json["runtimes"], 20, "{logs}");
    assert_eq!(json["sim_processes"], 2, "20 clusters at 10 per process: {logs}");
    assert!(json["install_s"].as_f64().is_some() && json["channel_move_s"].as_f64().is_some(), "{logs}");
    let processes = json["processes"].as_array().unwrap_or_else(|| panic!("{logs}"));
    assert_eq!(processes.len(), 2, "{logs}");
    let cached: u64 = processes.iter().filter_map(|p| p["runtimes_cached"].as_u64()).sum();
    assert_eq!(cached, 20, "the two shards' instances cache every Runtime between them: {logs}");
    assert!(processes.iter().all(|p| p["open_files"].as_u64().is_some_and(|n| n > 0)), "{logs}");
    assert!(
        holds_within_blocking(Duration::from_secs(30), || sim_processes(&mark).is_empty()),
        "sim processes left behind: {:?}",
        sim_processes(&mark)
    );
}

#[test]
fn sim_processes_end_when_the_bench_is_killed() {
    let mark = format!("bench-lifecycle-killed-{}", std::process::id());
    let mut child = bench(&mark, &["--runtimes", "20", "--modules", "1", "--sims-per-process", "10"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Killed once every sim cluster serves (its sim processes then only wait): a sim
    // process that missed its parent's end would wait forever.
    let rx = stderr_until(&mut child, "started 20 sim runtime clusters in 2 processes");
    let started = matches!(rx.recv_timeout(Duration::from_secs(120)), Ok(Ok(())));
    let running = sim_processes(&mark).len();
    let _ = child.kill(); // SIGKILL: no destructor of the bench runs
    let _ = child.wait();
    assert!(started && running == 2, "the bench did not start its two sim processes (saw {running})");
    assert!(
        holds_within_blocking(Duration::from_secs(60), || sim_processes(&mark).is_empty()),
        "sim processes outlived the killed bench: {:?}",
        sim_processes(&mark)
    );
}
