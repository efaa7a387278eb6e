//! The README's ways in, run as it prints them (issue 43): the run command
//! `cargo run --release -- up` from the repository root, stopped by Ctrl-C, and
//! `bash docs/quickstart.sh`, beside anything else on the machine.
//!
//! Both use the release build with the sandbox, which `scripts/test.sh` makes before the
//! tests; run alone, a test may have to make it first (minutes: .config/nextest.toml gives
//! these tests the time, and the waits below allow for it).

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support::*;

/// How long `cargo` may take to build before the command starts (nothing to build after
/// `scripts/test.sh`'s release build; a release build from scratch on a loaded 2-core machine
/// otherwise).
const BUILD: Duration = Duration::from_secs(40 * 60);

/// The repository root, where the README's commands run.
fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..").canonicalize().unwrap()
}

/// A command started in a process group of its own, as a shell starts a job: Ctrl-C is a
/// SIGINT to the group. Whatever is left of the group is killed on drop, so a failing test
/// leaves nothing running.
struct Group {
    child: Child,
    /// Set once the group was seen empty: its id may then be reused by another group.
    gone: bool,
}

impl Group {
    fn spawn(cmd: &mut Command) -> Self {
        Self { child: cmd.process_group(0).spawn().unwrap(), gone: false }
    }

    fn pgid(&self) -> i32 {
        i32::try_from(self.child.id()).unwrap()
    }

    fn signal(&self, sig: i32) {
        // SAFETY: kill(2) with a negative pid signals the process group; no memory involved.
        assert_eq!(unsafe { libc::kill(-self.pgid(), sig) }, 0, "kill -{sig} -{}", self.pgid());
    }

    /// The group's processes that still run (zombies left to init do not count), as
    /// "pid state command"; reaps the leader once it exited.
    fn running(&mut self) -> Vec<String> {
        let _ = self.child.try_wait();
        let pgid = self.pgid().to_string();
        let mut left = Vec::new();
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else { continue };
            // pid (comm) state ppid pgrp ...; comm may hold spaces and parentheses.
            let Some((head, rest)) = stat.rsplit_once(") ") else { continue };
            let fields: Vec<&str> = rest.split_whitespace().collect();
            if fields.get(2) == Some(&pgid.as_str()) && fields.first() != Some(&"Z") {
                left.push(format!("{head}) {}", fields[0]));
            }
        }
        if left.is_empty() {
            self.gone = true;
        }
        left
    }
}

impl Drop for Group {
    fn drop(&mut self) {
        if !self.gone {
            // SAFETY: as in `signal`.
            unsafe { libc::kill(-self.pgid(), libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

/// The environment a new user's shell has: without what this test run adds that would change
/// what the commands do (a kubeconfig, `FLEETWATCH_*` flags), nor what cargo and nextest set
/// for a test process (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, `OUT_DIR`, `NEXTEST_*`, ...,
/// `FLEETWATCH_GIT_COMMIT`): build scripts (ring's, cli/build.rs) rerun when one of those
/// changes, so the nested `cargo` would rebuild ring and everything above it (minutes), and
/// the next `cargo build` outside again.
fn user_env(cmd: &mut Command) -> &mut Command {
    cmd.env_remove("KUBECONFIG").env_remove("KUBERNETES_SERVICE_HOST");
    for (k, _) in std::env::vars_os() {
        let name = k.to_string_lossy();
        let set_for_tests = name == "CARGO"
            || name == "OUT_DIR"
            || name == "CARGO_PRIMARY_PACKAGE"
            || name == "CARGO_TARGET_TMPDIR"
            || name == "CARGO_RUSTC_CURRENT_DIR"
            || ["CARGO_PKG_", "CARGO_MANIFEST_", "CARGO_CRATE_", "CARGO_BIN_", "CARGO_CFG_", "NEXTEST", "__NEXTEST"]
                .iter()
                .any(|p| name.starts_with(p));
        // Flags, and FLEETWATCH_GIT_COMMIT, which nextest passes on from cli/build.rs's output
        // and which that build script reruns for.
        if set_for_tests || name.starts_with("FLEETWATCH_") {
            cmd.env_remove(k);
        }
    }
    cmd
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// Whether something accepts connections on this loopback port.
fn answers(port: u16) -> bool {
    std::net::TcpStream::connect(("127.0.0.1", port)).is_ok()
}

/// The README's run command, `cargo run --release -- up`, from the repository root with free
/// ports and a temporary folder: the sandbox's three runtimes get Ready, and Ctrl-C (SIGINT
/// to the process group, as a terminal sends it) stops it cleanly, leaving nothing running.
/// It failed at once before `default-run` (cli/Cargo.toml): "`cargo run` could not
/// determine which binary to run ... available binaries: fleetwatch, fleetwatch-dst".
#[test]
fn readme_run_command_starts_the_sandbox_and_ctrl_c_stops_it() {
    let tmp = tempfile::tempdir().unwrap();
    let sbx = tmp.path().join("sandbox");
    let (out, err) = (tmp.path().join("stdout"), tmp.path().join("stderr"));
    let start = Instant::now();
    let mut up = Group::spawn(
        user_env(&mut Command::new("cargo"))
            .args(["run", "--release", "--", "up", "--dir", sbx.to_str().unwrap()])
            .args(["--hub-port", "0", "--admin-port", "0", "--lifecycle-metrics-port", "0", "--sim-port", "0"])
            .current_dir(root())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap()),
    );
    let context = || format!("stdout:\n{}\nstderr (cargo's, then fleetwatch's):\n{}", read(&out), read(&err));

    // cargo builds (nothing after scripts/test.sh's release build), then runs the sandbox.
    let exited = eventually("`cargo run --release -- up` to start the sandbox (or to end)")
        .within(BUILD)
        .context(context)
        .until_blocking(
            || (read(&out).contains("fleetwatch sandbox up in"), up.child.try_wait().unwrap()),
            |(started, exited)| *started || exited.is_some(),
        )
        .1;
    if let Some(status) = exited {
        panic!("`cargo run --release -- up` ended ({status}) instead of starting:\n{}", context());
    }
    // What cargo did before it ran the sandbox: nothing but `Finished` and `Running` after
    // scripts/test.sh's release build (`Blocking`: another cargo held the build folder).
    let cargo_said: Vec<String> = read(&err)
        .lines()
        .map(str::trim_start)
        .filter(|l| ["Blocking ", "Compiling ", "Finished ", "Running "].iter().any(|s| l.starts_with(s)))
        .map(|l| l.chars().take(160).collect())
        .collect();
    eprintln!("cargo: {} lines; the first and last: {:?}", cargo_said.len(), [cargo_said.first(), cargo_said.last()]);
    eprintln!("the sandbox started {:.1} s after `cargo run`", start.elapsed().as_secs_f64());

    // stdout is not a terminal: a line per change, the runtimes' newest lines say Ready.
    let ready = |stdout: &String| {
        ["rt-1", "rt-2", "rt-3"].iter().all(|rt| {
            stdout
                .lines()
                .rev()
                .find(|l| l.starts_with(&format!("runtime={rt} ")))
                .is_some_and(|l| l.contains("agent=connected") && l.contains("state=Ready"))
        })
    };
    eventually("rt-1, rt-2 and rt-3 Ready")
        .within(Duration::from_secs(120))
        .context(|| format!("{}\nlog:\n{}", context(), read(&sbx.join("fleetwatch.log"))))
        .until_blocking(|| read(&out), ready);
    eprintln!("the three runtimes were Ready {:.1} s after `cargo run`", start.elapsed().as_secs_f64());
    let stdout = read(&out);
    let admin_port: u16 = stdout
        .lines()
        .find(|l| l.trim_start().starts_with("hub:"))
        .and_then(|l| l.split("admin: http://127.0.0.1:").nth(1))
        .and_then(|r| r.split('/').next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no admin address in the intro:\n{stdout}"));
    assert!(answers(admin_port), "the hub's admin port {admin_port} does not answer");

    // Ctrl-C.
    up.signal(libc::SIGINT);
    let status = eventually("the sandbox to end after Ctrl-C")
        .within(Duration::from_secs(30))
        .context(context)
        .until_blocking(|| up.child.try_wait().unwrap(), Option::is_some)
        .unwrap();
    assert_eq!(status.code(), Some(0), "exit after Ctrl-C: {status}\n{}", context());
    assert!(read(&out).lines().any(|l| l == "stopped"), "no `stopped` line:\n{}", context());
    let left = eventually("nothing of `cargo run` left running").until_blocking(|| up.running(), Vec::is_empty);
    assert!(left.is_empty());
    assert!(!answers(admin_port), "the hub's admin port {admin_port} still answers after Ctrl-C");
}

/// `bash docs/quickstart.sh` as the README prints it, from the repository root, with its
/// ports and folder moved by its environment variables (free ports, a temporary folder), so
/// it runs beside a sandbox or anything else: every step works (the Runtime Ready, the
/// module's version in the runtime cluster, events tailed, the user's module enabled in the
/// runtime cluster and removed again), it ends 0, and its background
/// processes do not outlive it.
#[test]
fn quickstart_script_runs_with_moved_ports_beside_anything() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("quickstart");
    let (out, err) = (tmp.path().join("stdout"), tmp.path().join("stderr"));
    let (hub, admin, cp, rt) = (free_port(), free_port(), free_port(), free_port());
    // The script puts `$PWD/target/release` first on PATH; where the target folder is moved
    // (CARGO_TARGET_DIR), its build lands next to this test's binary instead.
    let release = Path::new(BIN).parent().and_then(Path::parent).unwrap().join("release");
    let path = format!("{}:{}", release.display(), std::env::var("PATH").unwrap_or_default());
    let repo_quickstart = root().join("quickstart");
    let had_repo_quickstart = repo_quickstart.exists();
    let start = Instant::now();
    let mut qs = Group::spawn(
        user_env(&mut Command::new("bash"))
            .arg("docs/quickstart.sh")
            .current_dir(root())
            .env("PATH", path)
            .env("QUICKSTART_HUB_PORT", hub.to_string())
            .env("QUICKSTART_ADMIN_PORT", admin.to_string())
            .env("QUICKSTART_CP_PORT", cp.to_string())
            .env("QUICKSTART_RT_PORT", rt.to_string())
            .env("QUICKSTART_DIR", &dir)
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(&out).unwrap())
            .stderr(std::fs::File::create(&err).unwrap()),
    );
    let logs = || {
        ["hub.log", "agent-eu-1.log", "lifecycle.log", "sim-cp.log", "sim-eu-1.log"]
            .iter()
            .map(|f| format!("--- {f} (end):\n{}", tail(&read(&dir.join(f)), 40)))
            .collect::<Vec<_>>()
            .join("\n")
    };
    let context = || format!("stdout:\n{}\nstderr:\n{}\n{}", read(&out), read(&err), logs());
    // Its `cargo build --release` (nothing to build after scripts/test.sh's), then the steps,
    // whose first prints a line and whose waits give up by themselves.
    eventually("docs/quickstart.sh's `cargo build --release` (its first step's output, or its end)")
        .within(BUILD)
        .context(context)
        .until_blocking(|| (read(&out), qs.child.try_wait().unwrap()), |(o, end)| !o.is_empty() || end.is_some());
    let status = eventually("`bash docs/quickstart.sh` to end")
        .within(Duration::from_secs(300))
        .context(context)
        .until_blocking(|| qs.child.try_wait().unwrap(), Option::is_some)
        .unwrap();
    eprintln!("docs/quickstart.sh took {:.1} s", start.elapsed().as_secs_f64());
    assert!(status.success(), "docs/quickstart.sh: {status}\n{}", context());
    let stdout = read(&out);
    let lines: Vec<&str> = stdout.lines().collect();
    assert!(lines.contains(&"1.0.0"), "no hello-manager version 1.0.0 in the runtime cluster:\n{}", context());
    assert!(stdout.contains(r#""cluster":"eu-1""#), "no event of eu-1 tailed:\n{}", context());
    // Step 7: `kubectl get modules` in eu-1 shows the user's echo Ready beside the central
    // hello, `describe` says who chose it, and once deleted echo is listed no more (only the
    // first `get modules` has it).
    let listed = |name: &str| -> Vec<&str> {
        lines.iter().copied().filter(|l| l.split_whitespace().next() == Some(name)).collect()
    };
    let echo = listed("echo");
    assert!(
        echo.len() == 1 && echo[0].contains("Ready") && echo[0].contains("user"),
        "eu-1's user's echo in `kubectl get modules`: {echo:?}\n{}",
        context()
    );
    let hello = listed("hello");
    assert!(
        hello.len() == 2 && hello.iter().all(|l| l.contains("central")),
        "the central hello in both `kubectl get modules`: {hello:?}\n{}",
        context()
    );
    assert!(
        lines.iter().any(|l| l.trim_start().starts_with("Source:") && l.contains("user")),
        "`kubectl describe module echo` names no source:\n{}",
        context()
    );
    assert_eq!(lines.last(), Some(&"quickstart: all steps worked"), "{}", context());
    assert!(dir.join("pki/ca.crt").exists(), "docs/quickstart.sh did not work in QUICKSTART_DIR");
    assert_eq!(repo_quickstart.exists(), had_repo_quickstart, "docs/quickstart.sh touched ./quickstart");
    // What it started in the background ends with it.
    let left = eventually("nothing of docs/quickstart.sh left running").until_blocking(|| qs.running(), Vec::is_empty);
    assert!(left.is_empty());
    for port in [hub, admin, cp, rt] {
        assert!(!answers(port), "port {port} still answers after docs/quickstart.sh ended");
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}
