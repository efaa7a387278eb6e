//! `fleetwatch bench hub` stopped by SIGTERM takes the processes it started with it.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support::*;

/// The pids of live processes of the run marked with `mark` (an environment variable the
/// bench's children inherit) other than `except`.
fn marked_processes(mark: &str, except: u32) -> Vec<u32> {
    let want = format!("FLEETWATCH_TEST_RUN={mark}");
    let Ok(dir) = std::fs::read_dir("/proc") else { return Vec::new() };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| *pid != except)
        .filter(|pid| {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
            // A zombie (exited, not reaped yet) has no environment any more.
            environ.split(|b| *b == 0).any(|w| w == want.as_bytes())
        })
        .collect()
}

#[test]
fn hubs_and_nats_server_end_when_the_bench_is_terminated() {
    let mark = format!("bench-hub-terminated-{}", std::process::id());
    let mut child = Command::new(BIN)
        .args(["--log", "warn", "bench", "hub", "--bus", "nats", "--hub-replicas", "2", "--agents", "4"])
        .args(["--rate", "10", "--warmup", "600", "--duration", "10"])
        .env("FLEETWATCH_TEST_RUN", &mark)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Terminated in the warm-up, once every agent connected: 2 hubs, nats-server and the
    // load process run then.
    let rx = stderr_until(&mut child, "agents connected in");
    let connected = rx.recv_timeout(Duration::from_secs(180));
    let running = marked_processes(&mark, child.id());
    let _ = Command::new("kill").args(["-TERM", &child.id().to_string()]).status();
    let status = child.wait().unwrap();
    assert!(matches!(connected, Ok(Ok(()))), "the bench did not connect its agents: {connected:?}");
    assert!(running.len() >= 4, "2 hubs, nats-server and a load process were running: {running:?}");
    assert!(!status.success(), "an interrupted bench does not report success");
    assert!(
        holds_within_blocking(Duration::from_secs(60), || marked_processes(&mark, child.id()).is_empty()),
        "processes outlived the terminated bench: {:?}",
        marked_processes(&mark, child.id())
    );
}
