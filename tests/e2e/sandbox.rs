//! `fleetwatch up` as a new user runs it: everything comes up, modules get Ready, a user
//! enables the offered module in their cluster with the printed line, a channel move
//! upgrades every runtime.

use std::time::{Duration, Instant};

use crate::support::*;
use fleetwatch_test_support::DEADLINE;

#[test]
fn sandbox_comes_up_and_follows_a_channel_move() {
    let dir = tempfile::tempdir().unwrap();
    let sbx = dir.path().join("sbx");
    let args: Vec<String> = [
        "up",
        "--dir",
        sbx.to_str().unwrap(),
        "--plain",
        "--hub-port",
        "0",
        "--admin-port",
        "0",
        "--lifecycle-metrics-port",
        "0",
        "--clusters",
        "2",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let mut up = Proc::spawn(&args, dir.path().join("up.stderr"));
    let lines = up.stdout_lines.clone();
    let wait_lines = |what: &str, cond: &dyn Fn(&[String]) -> bool| {
        eventually(format!("sandbox: {what}"))
            .context(|| {
                format!(
                    "stdout:\n{}\nlog:\n{}",
                    lines.lock().unwrap().join("\n"),
                    std::fs::read_to_string(sbx.join("fleetwatch.log")).unwrap_or_default()
                )
            })
            .until_blocking(|| cond(&lines.lock().unwrap()), |held| *held);
    };
    let row_has = |rt: &'static str, needles: &'static [&'static str]| {
        move |ls: &[String]| {
            ls.iter()
                .rev()
                .find(|l| l.starts_with(&format!("runtime={rt} ")))
                .is_some_and(|l| needles.iter().all(|n| l.contains(n)))
        }
    };
    for rt in ["rt-1", "rt-2"] {
        wait_lines(
            "all modules Ready",
            &row_has(rt, &["agent=connected", "state=Ready", r#"redis="1.0.0 Ready""#, r#"nats="1.0.0 Ready""#]),
        );
    }
    // The intro tells where the kubeconfigs are; use the control plane's with kubectl.
    let cp = sbx.join("control-plane.kubeconfig");
    assert!(lines.lock().unwrap().iter().any(|l| l.contains(cp.to_str().unwrap())));
    // Start-up says nothing alarming: no finalizer conflict (the operator's first reconciles
    // raced its own finalizer patch, a 422 WARN on every start) and no WARN about lowering
    // a connection budget nobody asked for.
    let log = std::fs::read_to_string(sbx.join("fleetwatch.log")).unwrap_or_default();
    let noise: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("failed to add finalizer") || (l.contains(" WARN ") && l.contains("open-file limit")))
        .collect();
    // What a new user met (issue 27), collected so one run names every one that fails.
    let mut problems: Vec<String> = Vec::new();
    if !noise.is_empty() {
        problems.push(format!("start-up noise in the sandbox log:\n{}", noise.join("\n")));
    }
    // `kubectl get modulereleasemetas` shows every channel with its version.
    let mut metas = String::new();
    holds_within_blocking(DEADLINE, || {
        metas = kubectl(&cp, &["-n", "kcp", "get", "modulereleasemetas"], None);
        metas.lines().any(|l| l.starts_with("redis ") && l.contains("fast=2.0.0 regular=1.0.0"))
    });
    if !metas.lines().any(|l| l.starts_with("redis ") && l.contains("fast=2.0.0 regular=1.0.0")) {
        problems.push(format!("kubectl get modulereleasemetas does not show every channel:\n{metas}"));
    }
    // `kubectl explain` tells what `managed: false` does and how it differs from removing.
    let explain = kubectl(&cp, &["explain", "runtime.spec.modules.managed"], None)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    if !(explain.contains("everything stays in the cluster as it is")
        && explain.contains("the operator stops touching it")
        && explain.contains("Removing the entry instead uninstalls"))
    {
        problems.push(format!("kubectl explain runtime.spec.modules.managed: {explain}"));
    }
    // `maintenance next` takes the MaintenancePolicy as kubectl prints it.
    let policy = dir.path().join("policy.json");
    std::fs::write(&policy, kubectl(&cp, &["-n", "kcp", "get", "maintenancepolicy", "default", "-o", "json"], None))
        .unwrap();
    let next = std::process::Command::new(BIN)
        .args(["maintenance", "next", "--policy", policy.to_str().unwrap(), "--at", "2030-01-01T12:00:00Z"])
        .output()
        .unwrap();
    let window: serde_json::Value = serde_json::from_slice(&next.stdout).unwrap_or_default();
    if !next.status.success() || window["begin"] != "2030-01-02T02:00:00Z" {
        problems.push(format!(
            "maintenance next with kubectl's object: {window} {}",
            String::from_utf8_lossy(&next.stderr)
        ));
    }
    // ... and where the lifecycle operator's metrics are.
    let metrics_line = lines.lock().unwrap().iter().find(|l| l.contains("lifecycle:")).cloned().unwrap_or_default();
    let port: u16 = metrics_line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no lifecycle metrics address in the intro: {metrics_line:?}"));
    let metrics = futures_block(http_get(port, "/metrics"));
    // ... and the web view's address, which serves the page.
    let web_line = lines.lock().unwrap().iter().find(|l| l.contains("web view:")).cloned().unwrap_or_default();
    let web_port: u16 = web_line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no web view address in the intro: {web_line:?}"));
    let page = futures_block(http_get(web_port, "/"));
    assert!(page.contains("/assets/app.js"), "{page}");
    assert!(metrics.contains("fleetwatch_lifecycle_reconciles_total"), "{metrics}");
    assert!(std::fs::read_to_string(sbx.join("README.txt")).unwrap().contains("start empty"));
    // A second sandbox in the same folder is refused before it touches anything.
    let before = std::fs::read(&cp).unwrap();
    let second = std::process::Command::new(BIN).args(&args).output().unwrap();
    assert!(!second.status.success());
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(err.contains("a sandbox is already running in") && err.contains(&up.child.id().to_string()), "{err}");
    assert_eq!(std::fs::read(&cp).unwrap(), before, "the second sandbox rewrote the running one's kubeconfig");
    // Self-service (issue 46): the intro's line that enables the offered module in rt-2 runs
    // as printed; the Module object there gets Ready with source user, rt-2 runs the module,
    // `kubectl get modules` (the intro's line) lists it beside the central ones, and the
    // table shows it as the user's.
    let printed = |label: &str| -> String {
        let ls = lines.lock().unwrap();
        ls.iter()
            .find_map(|l| l.trim_start().strip_prefix(label))
            .map(|cmd| cmd.trim().to_string())
            .unwrap_or_else(|| panic!("no {label:?} line in the intro:\n{}", ls.join("\n")))
    };
    let shell = |cmd: &str| -> String {
        let out = std::process::Command::new("sh").arg("-c").arg(cmd).output().unwrap();
        assert!(out.status.success(), "{cmd}: {}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into()
    };
    let rt2 = sbx.join("rt-2.kubeconfig");
    let enable = printed("enable keda:");
    let file = sbx.join("enable-keda.yaml");
    assert_eq!(enable, format!("kubectl --kubeconfig {} apply -f {}", rt2.display(), file.display()));
    shell(&enable);
    let module = eventually("sandbox: the keda Module in rt-2 Ready, chosen by its user")
        .context(|| format!("log:\n{}", std::fs::read_to_string(sbx.join("fleetwatch.log")).unwrap_or_default()))
        .until_blocking(
            || {
                let out = kubectl(&rt2, &["get", "module", "keda", "-o", "json"], None);
                serde_json::from_str::<serde_json::Value>(&out).unwrap_or_default()
            },
            |m| m["status"]["state"] == "Ready" && m["status"]["source"] == "user",
        );
    assert_eq!(module["status"]["version"], "1.0.0", "{module:#}");
    // A Ready module's message says nothing of what it waited for before (a merge patch of the
    // status kept "waiting for manager: ..." after the wait was over).
    if module["status"]["message"].as_str().is_some_and(|m| m.contains("waiting")) {
        problems.push(format!("the Ready keda Module in rt-2 still says what it waited for: {module:#}"));
    }
    let running = kubectl(
        &rt2,
        &[
            "get",
            "deployment",
            "keda-manager",
            "-n",
            "keda-system",
            "-o",
            "jsonpath={.metadata.labels.app\\.kubernetes\\.io/version}",
        ],
        None,
    );
    assert_eq!(running, "1.0.0");
    wait_lines(
        "the user's keda in the table",
        &row_has("rt-2", &[r#"keda="1.0.0 Ready (user)""#, r#"redis="1.0.0 Ready""#]),
    );
    // rt-1's user chose nothing: no keda there.
    assert!(
        row_has("rt-1", &["keda=-"])(&lines.lock().unwrap()),
        "keda in rt-1's row:\n{}",
        lines.lock().unwrap().join("\n")
    );
    let listed = shell(&printed("modules:"));
    let row = |name: &str| listed.lines().find(|l| l.split_whitespace().next() == Some(name)).unwrap_or_default();
    if !(row("keda").contains("user") && row("redis").contains("central") && row("nats").contains("central")) {
        problems.push(format!("kubectl get modules in rt-2 does not show who chose what:\n{listed}"));
    }
    // What a user reads about their module.
    let described = kubectl(&rt2, &["describe", "module", "keda"], None);
    if !["State:", "Ready", "Source:", "user", "Version:", "1.0.0", "Accepted"].iter().all(|s| described.contains(s)) {
        problems.push(format!("kubectl describe module keda in rt-2:\n{described}"));
    }

    let meta = r#"{"apiVersion":"operator.fleetwatch.dev/v1alpha1","kind":"ModuleReleaseMeta","metadata":{"name":"redis","namespace":"kcp"},"spec":{"moduleName":"redis","channels":[{"channel":"regular","version":"2.0.0"},{"channel":"fast","version":"2.0.0"}]}}"#;
    kubectl(&cp, &["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(meta));
    for rt in ["rt-1", "rt-2"] {
        wait_lines("the upgrade", &row_has(rt, &[r#"redis="2.0.0 Ready""#, r#"nats="1.0.0 Ready""#]));
    }
    // nats 2.0.0 needs downtime: it waits for the nightly window, shown in the table
    // (unless the clock happens to be inside it).
    let meta = r#"{"apiVersion":"operator.fleetwatch.dev/v1alpha1","kind":"ModuleReleaseMeta","metadata":{"name":"nats","namespace":"kcp"},"spec":{"moduleName":"nats","channels":[{"channel":"regular","version":"2.0.0"},{"channel":"fast","version":"2.0.0"}]}}"#;
    kubectl(&cp, &["apply", "--server-side", "--force-conflicts", "-f", "-"], Some(meta));
    let now = jiff::Timestamp::now().to_zoned(jiff::tz::TimeZone::UTC);
    let minute_of_day = i32::from(now.hour()) * 60 + i32::from(now.minute());
    // Inside 02:00–04:00 with the 20 minutes the upgrade needs; near the edges, either outcome is right.
    let near_edge = (115..=125).contains(&minute_of_day) || (215..=225).contains(&minute_of_day);
    if !near_edge {
        if (120..220).contains(&minute_of_day) {
            wait_lines("the nats upgrade inside the window", &row_has("rt-1", &[r#"nats="2.0.0 Ready""#]));
        } else {
            wait_lines("the next window", &|ls: &[String]| {
                ls.iter().rev().find(|l| l.starts_with("runtime=rt-1 ")).is_some_and(|l| {
                    l.contains(r#"nats="1.0.0 → 2.0.0 waits for 02:00Z""#) && l.contains("next-window=20")
                })
            });
        }
    }
    // The runtime cluster really runs the new version.
    let out = kubectl(
        &sbx.join("rt-1.kubeconfig"),
        &[
            "get",
            "deployment",
            "redis-manager",
            "-n",
            "redis-system",
            "-o",
            "jsonpath={.metadata.labels.app\\.kubernetes\\.io/version}",
        ],
        None,
    );
    assert_eq!(out, "2.0.0");
    // Deleting a Runtime shows in the table within 1 s of the API server having it gone
    // (issue 27: the table follows a watch of Runtimes). `gone_at` is when this loop saw it
    // gone, at most one `kubectl get` after the API server did.
    kubectl(&cp, &["-n", "kcp", "delete", "runtime", "rt-2", "--wait=false"], None);
    let start = Instant::now();
    let mut gone_at: Option<Instant> = None;
    let removed_line = || lines.lock().unwrap().iter().any(|l| l == "runtime=rt-2 removed");
    loop {
        if removed_line() {
            if let Some(t) = gone_at {
                eprintln!("the table showed rt-2 removed {} ms after it was seen gone", t.elapsed().as_millis());
            }
            break;
        }
        match gone_at {
            Some(t) if t.elapsed() > Duration::from_secs(1) => {
                problems.push(format!(
                    "no line for the deleted runtime rt-2 within 1 s of its removal from the API server:\n{}",
                    lines.lock().unwrap().join("\n")
                ));
                break;
            }
            Some(_) => {}
            None if !kubectl(&cp, &["-n", "kcp", "get", "runtimes", "-o", "name"], None).contains("rt-2") => {
                gone_at = Some(Instant::now());
                continue;
            }
            None if start.elapsed() > Duration::from_secs(60) => {
                problems.push("the deleted runtime rt-2 was still in the API server after 60 s".into());
                break;
            }
            None => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
    up.signal("INT");
    assert_eq!(up.wait_exit(Duration::from_secs(15)), Some(0), "{}", up.stderr());
    assert!(lines.lock().unwrap().iter().any(|l| l == "stopped"));
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap().block_on(f)
}

/// Issue 27, items 2 and 3, as a new user saw them in the sandbox: each module's install is
/// its own Event on the Runtime (not folded into another module's series), `kubectl
/// describe runtime` and `kubectl events --for runtime/…` show them; removing a module
/// leaves its configuration watch `waiting-for-kind`, which is healthy (`fleetwatch status`
/// exits 0, the metric's phase says so), and the watch runs again when the module returns.
#[test]
fn sandbox_events_per_module_and_a_removed_modules_watch_waits_for_its_kind() {
    let dir = tempfile::tempdir().unwrap();
    let sbx = dir.path().join("sbx");
    let args: Vec<String> =
        ["up", "--dir", sbx.to_str().unwrap(), "--plain", "--hub-port", "0", "--admin-port", "0", "--clusters", "1"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    let up = Proc::spawn(&args, dir.path().join("up.stderr"));
    let lines = up.stdout_lines.clone();
    let log = || std::fs::read_to_string(sbx.join("fleetwatch.log")).unwrap_or_default();
    let until = |what: &str, cond: &mut dyn FnMut() -> bool| {
        eventually(format!("sandbox: {what}"))
            .within(Duration::from_secs(90))
            .context(|| format!("stdout:\n{}\nlog:\n{}", lines.lock().unwrap().join("\n"), log()))
            .until_blocking(&mut *cond, |held| *held);
    };
    let ready = |redis: bool| {
        move |ls: &[String]| {
            ls.iter().rev().find(|l| l.starts_with("runtime=rt-1 ")).is_some_and(|l| {
                l.contains("state=Ready")
                    && l.contains(r#"nats="1.0.0 Ready""#)
                    && l.contains(r#"redis="1.0.0 Ready""#) == redis
            })
        }
    };
    until("all modules Ready", &mut || ready(true)(&lines.lock().unwrap()));
    let cp = sbx.join("control-plane.kubeconfig");
    let web_line = lines.lock().unwrap().iter().find(|l| l.contains("web view:")).cloned().unwrap_or_default();
    let admin_port: u16 = web_line
        .split("127.0.0.1:")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no web view address in the intro: {web_line:?}"));

    // Events of rt-1 as (reason, note, count), through events.k8s.io/v1.
    let events = || -> Vec<(String, String, i64)> {
        let out = kubectl(&cp, &["-n", "kcp", "get", "events.events.k8s.io", "-o", "json"], None);
        let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_default();
        let mut evs: Vec<(String, String, i64)> = v["items"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|e| e["regarding"]["kind"] == "Runtime" && e["regarding"]["name"] == "rt-1")
            .map(|e| {
                let count = e["series"]["count"].as_i64().unwrap_or(1);
                (e["reason"].as_str().unwrap_or("").into(), e["note"].as_str().unwrap_or("").into(), count)
            })
            .collect();
        evs.sort();
        evs
    };
    let installed = |evs: &[(String, String, i64)]| -> Vec<(String, i64)> {
        evs.iter().filter(|e| e.0 == "Installed").map(|e| (e.1.clone(), e.2)).collect()
    };
    until("an Installed Event per module", &mut || installed(&events()).len() >= 2);
    assert_eq!(
        installed(&events()),
        [("installed nats 1.0.0".to_string(), 1), ("installed redis 1.0.0".to_string(), 1)],
        "{:?}",
        events()
    );
    // kubectl finds them through the core API and its field selectors.
    let described = kubectl(&cp, &["-n", "kcp", "describe", "runtime", "rt-1"], None);
    let section = described.split("\nEvents:").nth(1).unwrap_or_default();
    for note in ["installed redis 1.0.0", "installed nats 1.0.0"] {
        assert!(section.contains(note), "describe's Events lack {note:?}:\n{described}");
    }
    let listed = kubectl(&cp, &["-n", "kcp", "events", "--for", "runtime/rt-1"], None);
    assert!(listed.contains("installed redis 1.0.0") && listed.contains("installed nats 1.0.0"), "{listed}");

    // rt-1's watches as (name, phase).
    let watch_phases = || -> Vec<(String, String)> {
        let v: serde_json::Value =
            serde_json::from_str(&futures_block(http_get(admin_port, "/api/v1/clusters"))).unwrap_or_default();
        v["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|c| c["cluster"] == "rt-1")
            .flat_map(|c| c["watches"].as_array().cloned().unwrap_or_default())
            .map(|w| (w["name"].as_str().unwrap_or("").to_string(), w["phase"].as_str().unwrap_or("").to_string()))
            .collect()
    };
    let phase_of = |name: &str| watch_phases().into_iter().find(|w| w.0 == name).map(|w| w.1).unwrap_or_default();
    let watch_phase = || phase_of("redis-config");
    let status = || {
        let out = std::process::Command::new(BIN)
            .args(["status", "--admin", &format!("http://127.0.0.1:{admin_port}"), "--control-plane-kubeconfig"])
            .arg(&cp)
            .output()
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stdout).to_string())
    };
    until("the redis-config watch running", &mut || watch_phase() == "running");
    // rt-1's watches waiting for their kind, from the hub's metric: keda's configuration kind
    // already (no user of rt-1 chose keda), redis's once it is removed. Counted once every
    // watch has settled.
    until("keda-config waiting for its kind, every other watch running", &mut || {
        let phases = watch_phases();
        phase_of("keda-config") == "waiting-for-kind"
            && phases.iter().all(|w| w.1 == "running" || w.1 == "waiting-for-kind")
    });
    let waiting_for_kind = || -> Option<u64> {
        let metrics = futures_block(http_get(admin_port, "/metrics"));
        metrics
            .lines()
            .find_map(|l| {
                l.strip_prefix(r#"fleetwatch_hub_cluster_watches{runtime_cluster="rt-1",phase="waiting-for-kind"} "#)
            })
            .and_then(|v| v.trim().parse().ok())
    };
    let waiting_before = waiting_for_kind().unwrap_or(0);

    // Remove redis: its CRD leaves the cluster, its watch waits for the kind, healthily.
    // A merge patch replaces the list and leaves the rest of the spec as the sandbox set it.
    let modules = |m: &str| format!(r#"{{"spec":{{"modules":[{m}]}}}}"#);
    let nats_only = modules(r#"{"name":"nats"}"#);
    kubectl(&cp, &["-n", "kcp", "patch", "runtime", "rt-1", "--type", "merge", "-p", &nats_only], None);
    until("redis removed", &mut || ready(false)(&lines.lock().unwrap()));
    until("the redis-config watch waiting for its kind", &mut || watch_phase() == "waiting-for-kind");
    let (code, out) = status();
    assert_eq!(code, Some(0), "a removed module's watch is not a problem:\n{out}");
    assert!(out.contains("waiting for kind") && !out.contains("failed"), "{out}");
    // The same through the control plane's service proxy, as the intro prints it.
    let out = std::process::Command::new(BIN)
        .args(["status", "--kubeconfig"])
        .arg(&cp)
        .arg("--control-plane-kubeconfig")
        .arg(&cp)
        .output()
        .unwrap();
    let proxied = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{proxied}{}", String::from_utf8_lossy(&out.stderr));
    assert!(proxied.contains("waiting for kind") && proxied.contains("rt-1"), "{proxied}");
    let metrics = futures_block(http_get(admin_port, "/metrics"));
    assert_eq!(waiting_for_kind(), Some(waiting_before + 1), "{metrics}");
    assert!(!metrics.contains(r#"phase="kind-not-found""#), "{metrics}");
    until("a Deleted Event naming the version", &mut || {
        events().iter().any(|e| e.0 == "Deleted" && e.1 == "removed redis 1.0.0")
    });

    // redis back: the watch resumes by itself, and the second install counts in redis's series.
    let both = modules(r#"{"name":"redis"},{"name":"nats"}"#);
    kubectl(&cp, &["-n", "kcp", "patch", "runtime", "rt-1", "--type", "merge", "-p", &both], None);
    until("the redis-config watch running again", &mut || watch_phase() == "running");
    until("redis's Installed series at 2", &mut || {
        installed(&events()).contains(&("installed redis 1.0.0".to_string(), 2))
    });
    assert_eq!(
        installed(&events()),
        [("installed nats 1.0.0".to_string(), 1), ("installed redis 1.0.0".to_string(), 2)],
        "{:?}",
        events()
    );
    drop(up);
}
