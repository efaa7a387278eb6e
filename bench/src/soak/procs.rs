//! The soak's child processes: one durable hub and one agent per simulated cluster, each
//! a real `fleetwatch` process that can be killed and started again with the same
//! arguments. Their logs go to files in the soak directory (appended across restarts,
//! rotated once past [`LOG_FILE_MAX`], so a long soak's disk use stays bounded).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use std::io::Write;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, BufReader};
use tokio::process::{Child, ChildStderr, Command};

/// Most bytes of one process's log file: past it the file becomes `<log>.1` (replacing an
/// older one) and a new one is begun, so each process keeps at most twice this on disk.
pub const LOG_FILE_MAX: u64 = 16 << 20;

/// Why a child process could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// Spawning failed.
    #[error("cannot start {what}: {source}")]
    Spawn {
        /// Which process.
        what: String,
        /// Why.
        source: std::io::Error,
    },
    /// The log file could not be opened.
    #[error("cannot open log file {path}: {source}")]
    Log {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The process did not print its start-up line.
    #[error("{what} {why} (see {log})")]
    NotStarted {
        /// Which process.
        what: String,
        /// What happened instead.
        why: String,
        /// Its log file.
        log: String,
    },
}

/// How to signal a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stop {
    /// SIGKILL: no chance to flush or drain.
    Kill,
    /// SIGTERM: orderly shutdown (an agent drains its outbox first).
    Term,
}

impl std::fmt::Display for Stop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Stop::Kill => "SIGKILL",
            Stop::Term => "SIGTERM",
        })
    }
}

/// A `fleetwatch` child process that can be stopped and started again.
pub struct Restartable {
    what: String,
    args: Vec<String>,
    log: PathBuf,
    child: Option<Child>,
    /// Kept open so the child can write its start-up line without a broken pipe.
    stdout: Option<tokio::io::Lines<BufReader<tokio::process::ChildStdout>>>,
}

impl Restartable {
    /// A process described by its arguments, not started yet.
    pub fn new(what: impl Into<String>, args: Vec<String>, log: PathBuf) -> Self {
        Self { what: what.into(), args, log, child: None, stdout: None }
    }

    /// Its log file.
    pub fn log(&self) -> &Path {
        &self.log
    }

    /// [`start`](Self::start) until it starts: a failed start (a hub that exited because
    /// it could not start) is tried again with backoff (1 s doubling to 10 s) for up to
    /// `give_up`, as a supervisor would. Answers the outage, when a start failed: what,
    /// how long until it was up, how many starts failed and the first cause. A soak counts
    /// and prints it instead of losing its verdict.
    pub async fn start_until_up(
        &mut self,
        wait_for: Option<&str>,
        timeout: Duration,
        give_up: Duration,
    ) -> Result<Option<String>, ProcError> {
        let began = std::time::Instant::now();
        let mut failed = 0u32;
        let mut first = None;
        let mut pause = Duration::from_secs(1);
        loop {
            match self.start(wait_for, timeout).await {
                Ok(()) if failed == 0 => return Ok(None),
                Ok(()) => {
                    let outage = format!(
                        "{} down {:.1} s: {failed} start(s) failed, first: {}",
                        self.what,
                        began.elapsed().as_secs_f64(),
                        first.unwrap_or_default()
                    );
                    tracing::warn!("{outage}");
                    return Ok(Some(outage));
                }
                Err(e) if began.elapsed() >= give_up => return Err(e),
                Err(e) => {
                    tracing::warn!(error = %e, "start failed: trying again in {pause:?}");
                    failed += 1;
                    first.get_or_insert_with(|| e.to_string());
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_secs(10));
                }
            }
        }
    }

    /// Starts the process; with `wait_for` set, waits (up to `timeout`) for a stdout line
    /// that starts with it.
    pub async fn start(&mut self, wait_for: Option<&str>, timeout: Duration) -> Result<(), ProcError> {
        let exe = std::env::current_exe().map_err(|source| ProcError::Spawn { what: self.what.clone(), source })?;
        let log = LogFile::open(self.log.clone())?;
        let mut child = Command::new(exe)
            .args(&self.args)
            .env_remove("RUST_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProcError::Spawn { what: self.what.clone(), source })?;
        if let Some(stderr) = child.stderr.take() {
            tokio::spawn(copy_log(stderr, log));
        }
        let mut lines = child.stdout.take().map(|o| BufReader::new(o).lines());
        self.child = Some(child);
        if let (Some(needle), Some(lines)) = (wait_for, lines.as_mut()) {
            let found = tokio::time::timeout(timeout, async {
                while let Ok(Some(line)) = lines.next_line().await {
                    if line.starts_with(needle) {
                        return true;
                    }
                }
                false
            })
            .await;
            let why = match found {
                Ok(true) => None,
                Ok(false) => Some(format!("exited before printing `{needle}`")),
                Err(_) => Some(format!("did not print `{needle}` within {} s", timeout.as_secs())),
            };
            if let Some(mut why) = why {
                // The last line of its log usually says why.
                if let Some(last) = std::fs::read_to_string(&self.log)
                    .ok()
                    .and_then(|t| t.lines().rev().find(|l| !l.trim().is_empty()).map(str::to_string))
                {
                    why = format!("{why}; its log ends with: {last}");
                }
                return Err(ProcError::NotStarted {
                    what: self.what.clone(),
                    why,
                    log: self.log.display().to_string(),
                });
            }
        }
        self.stdout = lines;
        Ok(())
    }

    /// Signals the process and waits for it to exit (SIGKILL after `grace` when a SIGTERM
    /// was not enough). Does nothing when it is not running.
    pub async fn stop(&mut self, how: Stop, grace: Duration) {
        let Some(mut child) = self.child.take() else { return };
        if how == Stop::Term
            && let Some(pid) = child.id()
            && let Ok(pid) = i32::try_from(pid)
        {
            // SAFETY: kill(2) with a pid of our own child, which has not been reaped
            // (we still hold its handle), so the pid cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
            if tokio::time::timeout(grace, child.wait()).await.is_ok() {
                self.stdout = None;
                return;
            }
            tracing::warn!(process = %self.what, "did not stop on SIGTERM in time: killing it");
        }
        let _ = child.start_kill();
        let _ = child.wait().await;
        self.stdout = None;
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) the running process: a process that stops
    /// answering without closing its connections (a paused VM, a stalled node).
    pub fn freeze(&self, frozen: bool) {
        let Some(pid) = self.child.as_ref().and_then(|c| c.id()).and_then(|p| i32::try_from(p).ok()) else { return };
        // SAFETY: kill(2) with a pid of our own child, not reaped yet (we hold its handle).
        unsafe {
            libc::kill(pid, if frozen { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Whether it exited by itself (a crash); returns its status then.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }
}

/// A log file that is rotated once past [`LOG_FILE_MAX`].
struct LogFile {
    path: PathBuf,
    file: std::fs::File,
    len: u64,
}

impl LogFile {
    fn open(path: PathBuf) -> Result<Self, ProcError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .map_err(|source| ProcError::Log { path: path.clone(), source })?;
        let len = file.metadata().map(|m| m.len()).unwrap_or(0);
        Ok(Self { path, file, len })
    }

    fn write(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        if self.len + bytes.len() as u64 > LOG_FILE_MAX && self.len > 0 {
            let mut old = self.path.clone().into_os_string();
            old.push(".1");
            std::fs::rename(&self.path, &old)?;
            self.file = std::fs::OpenOptions::new().create(true).append(true).open(&self.path)?;
            self.len = 0;
        }
        self.file.write_all(bytes)?;
        self.len += bytes.len() as u64;
        Ok(())
    }
}

/// Copies a child's stderr into its log file until the child closes it.
async fn copy_log(mut stderr: ChildStderr, mut log: LogFile) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match stderr.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => {
                if let Err(e) = log.write(&buf[..n]) {
                    // Keep reading: a child blocked on a full pipe would stall the soak.
                    tracing::warn!(log = %log.path.display(), error = %e, "cannot write a process log");
                }
            }
        }
    }
}

/// A free loopback port (bound and released; the hub takes it right after).
pub fn free_port() -> std::io::Result<SocketAddr> {
    std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()
}
