//! The chaos soak, short: the real `fleetwatch bench soak` with its hub and agent
//! processes, under hub kills, TCP cuts, agent restarts and deny-list flips; nothing
//! may be lost.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

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

#[test]
fn short_soak_loses_nothing_under_faults() {
    let dir = tempfile::tempdir().unwrap();
    // Every fault kind, the durable log's included (disk full, a damaged closed segment).
    let mut child = Command::new(BIN)
        .args(["--log", "warn", "bench", "soak", "--duration", "20", "--clusters", "3", "--objects", "50"])
        .args(["--rate", "60", "--fault-interval", "1", "--fault-hold", "2", "--settle", "120"])
        .args(["--faults", "kill,cut,agent-restart,disk-full,corrupt,deny"])
        .arg("--dir")
        .arg(dir.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the soak stops by itself (20 s, then at most 120 s to settle).
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break Some(s);
        }
        if started.elapsed() > Duration::from_secs(600) {
            let _ = child.kill();
            break None;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let logs = || {
        let hub = std::fs::read_to_string(dir.path().join("hub.log")).unwrap_or_default();
        let tail: Vec<&str> = hub.lines().rev().take(40).collect();
        format!("stdout:\n{stdout}\nstderr:\n{stderr}\nhub log (last lines, newest first):\n{}", tail.join("\n"))
    };
    let status = status.unwrap_or_else(|| panic!("soak still running after 600 s; {}", logs()));
    assert!(status.success(), "soak failed ({status}); {}", logs());
    assert!(stdout.contains("lost 0)"), "{}", logs());
    let objects = stdout
        .lines()
        .find_map(|l| l.strip_prefix("objects "))
        .and_then(|l| l.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0);
    assert!(objects >= 50, "too few objects checked: {}", logs());
    let injected: Vec<_> = fault_counts(&stdout).into_iter().filter(|(_, n)| *n > 0).collect();
    assert!(injected.len() >= 3, "faults of at least three kinds must have been injected: {injected:?}; {}", logs());
}
