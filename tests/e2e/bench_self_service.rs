//! `fleetwatch bench self-service` at a tiny size: three sim runtime clusters with their
//! agents, a hub and the lifecycle operator as processes; every `Module` the bench creates in
//! a runtime cluster gets its status from the operator through the whole path, and the bench
//! measures each one (nothing lost). Not a timing assertion: the figures are the bench's
//! business (docs/performance.md).

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

#[test]
fn every_module_created_in_a_runtime_cluster_is_measured_to_its_status() {
    let child = Command::new(BIN)
        .args(["--log", "warn", "bench", "self-service", "--runtimes", "3", "--sims-per-process", "2"])
        // Two rounds over the three clusters: each gets u0, then u1 beside it.
        .args(["--rate", "3", "--duration", "2", "--setup-wait", "300", "--json"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: the bench gives up by itself after --setup-wait plus --timeout (30 s).
    let (status, stdout, stderr) = finish_within(child, Duration::from_secs(600));
    let logs = format!("stdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(status.is_some_and(|s| s.success()), "bench failed or hung: {logs}");
    let json: serde_json::Value = stdout
        .lines()
        .find_map(|l| serde_json::from_str(l).ok().filter(|v: &serde_json::Value| v["bench"] == "self-service"))
        .unwrap_or_else(|| panic!("no JSON line: {logs}"));
    assert_eq!(json["runtimes"], 3, "{logs}");
    assert_eq!(json["sim_processes"], 2, "3 clusters at 2 per process: {logs}");
    assert_eq!(json["stand_in"], false, "{logs}");
    assert_eq!(json["offered"], 6, "{logs}");
    assert_eq!(json["create_errors"], 0, "{logs}");
    assert_eq!(json["created"], 6, "{logs}");
    assert_eq!(json["measured"], 6, "every created Module's status seen: {logs}");
    assert_eq!(json["lost"], 0, "{logs}");
    // Each went through the hub (the bench's own subscription saw its event) and the
    // operator reconciled for it.
    assert_eq!(json["to_hub_subscriber"]["n"], 6, "{logs}");
    assert!(json["reconciles"].as_f64().is_some_and(|n| n >= 6.0), "{logs}");
    assert!(json["p99_ms"].as_f64().is_some_and(|p| p >= json["p50_ms"].as_f64().unwrap_or(f64::MAX)), "{logs}");
}
