//! The chaos soak, short: the real `fleetwatch bench soak` with its hub and agent
//! processes, under hub kills, TCP cuts, agent restarts and deny-list flips, on the
//! embedded bus and on a 3-node JetStream cluster (node kills, restarted empty, cuts to
//! NATS); nothing may be lost.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The fault counts from the summary line `faults: kill 1, cut 2, … (off), …`.
fn fault_counts(stdout: &str) -> Vec<(String, u64)> {
    let line = stdout.lines().find_map(|l| l.strip_prefix("faults: ")).unwrap_or_default();
    line.split(", ")
        .filter_map(|part| {
            let mut words = part.split_whitespace();
            Some((words.next()?.to_string(), words.next()?.parse().ok()?))
        })
        .collect()
}

/// What a finished soak printed.
struct SoakRun {
    stdout: String,
    /// Everything to show when an assertion fails: output and the hub logs' last lines.
    logs: String,
}

/// Runs `fleetwatch bench soak` with `args` in a temporary directory (its logs are read
/// for failure messages); panics when it fails or does not end within 600 s.
fn run_soak(args: &[&str], hub_logs: &[&str]) -> SoakRun {
    let dir = tempfile::tempdir().unwrap();
    let child = Command::new(BIN)
        .args(["--log", "warn", "bench", "soak"])
        .args(args)
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the soak stops by itself (its duration, then at most --settle to settle).
    let (status, stdout, stderr) = finish_within(child, Duration::from_secs(600));
    let mut logs = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    for name in hub_logs {
        let hub = std::fs::read_to_string(dir.path().join(name)).unwrap_or_default();
        let tail: Vec<&str> = hub.lines().rev().take(40).collect();
        logs.push_str(&format!("\n{name} (last lines, newest first):\n{}", tail.join("\n")));
    }
    let status = status.unwrap_or_else(|| panic!("soak still running after 600 s; {logs}"));
    assert!(status.success(), "soak failed ({status}); {logs}");
    assert!(stdout.contains("lost 0)"), "{logs}");
    let objects = stdout
        .lines()
        .find_map(|l| l.strip_prefix("objects "))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(objects >= 50, "too few objects checked: {logs}");
    SoakRun { stdout, logs }
}

/// The `while agents were down: D deletes, C recreates` line.
fn churn_while_down(stdout: &str) -> (u64, u64) {
    let line = stdout.lines().find_map(|l| l.strip_prefix("while agents were down: ")).unwrap_or_default();
    let mut n = line.split_whitespace().filter_map(|w| w.trim_end_matches(',').parse::<u64>().ok());
    (n.next().unwrap_or(0), n.next().unwrap_or(0))
}

#[test]
fn short_soak_loses_nothing_under_faults() {
    // Every fault kind, the durable log's included (disk full, a damaged closed segment).
    let run = run_soak(
        &[
            "--duration",
            "20",
            "--clusters",
            "3",
            "--objects",
            "50",
            "--rate",
            "60",
            "--fault-interval",
            "1",
            "--fault-hold",
            "2",
            "--settle",
            "120",
            "--faults",
            "kill,cut,agent-restart,disk-full,corrupt,deny",
        ],
        &["hub.log"],
    );
    let counts = fault_counts(&run.stdout);
    let injected: Vec<_> = counts.iter().filter(|(_, n)| *n > 0).collect();
    assert!(injected.len() >= 3, "faults of at least three kinds must have been injected: {injected:?}; {}", run.logs);
    // An agent held down means its churn deleted and recreated meanwhile.
    if counts.iter().any(|(k, n)| k == "agent-restart" && *n > 0) {
        let (deletes, _) = churn_while_down(&run.stdout);
        assert!(deletes > 0, "no deletes while an agent was down; {}", run.logs);
    }
}

/// The soak on NATS: three hub replicas on a 3-node JetStream cluster, agents and the
/// subscriber given every replica, under replica kills, JetStream node kills, JetStream
/// restarted empty, cuts between the hubs and NATS, agent restarts (with deletes and
/// recreates meanwhile), client cuts and deny flips; nothing may be lost.
#[test]
fn short_soak_on_nats_loses_nothing_under_faults() {
    let run = run_soak(
        &[
            "--bus",
            "nats",
            "--duration",
            "80",
            "--clusters",
            "3",
            "--objects",
            "50",
            "--rate",
            "60",
            "--fault-interval",
            "1",
            "--fault-hold",
            "2",
            // The JetStream kinds first, a hub restarted into a JetStream outage among them;
            // the freezes are left to the long soaks (the 600 s runs in docs/performance.md).
            "--faults",
            "js-empty,node-kill,bus-cut,restart-into-outage,kill,agent-restart,cut,deny",
            // Within nextest's 180 s: 80 s of churn, at most 60 s to settle.
            "--settle",
            "60",
        ],
        &["hub-0.log", "hub-1.log", "hub-2.log"],
    );
    assert!(!run.stdout.contains("NOTE "), "{}", run.logs);
    assert!(!run.stdout.contains("OUTAGE "), "a restart failed: {}", run.logs);
    let counts = fault_counts(&run.stdout);
    // The first round goes in the order given; a round of every kind fits the fault window
    // (a tenth to five sixths of 80 s, some 59 s; a round takes some 40 s here).
    for kind in ["js-empty", "node-kill", "bus-cut", "restart-into-outage", "kill", "agent-restart", "cut", "deny"] {
        assert!(counts.iter().any(|(k, n)| k == kind && *n > 0), "no {kind} fault injected: {counts:?}; {}", run.logs);
    }
    let (deletes, recreates) = churn_while_down(&run.stdout);
    assert!(deletes > 0 && recreates > 0, "no deletes or recreates while an agent was down; {}", run.logs);
}
