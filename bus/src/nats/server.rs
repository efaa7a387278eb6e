//! A local `nats-server` with JetStream, started as a child process: for the tests, the
//! end-to-end suite and the bench, which need a real server (the Debian `nats-server`
//! package) rather than a mock. It is stopped (SIGKILL) when dropped.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why a local server could not start.
#[derive(Debug, thiserror::Error)]
pub enum LocalServerError {
    /// The binary is not installed.
    #[error("nats-server not found on PATH: install it (apt-get install -y nats-server): {0}")]
    Missing(std::io::Error),
    /// It started but did not become ready.
    #[error("nats-server did not become ready: {0}")]
    NotReady(String),
    /// Its store directory could not be emptied.
    #[error("cannot empty the nats-server store {path}: {cause}", path = path.display())]
    Store {
        /// The store directory.
        path: PathBuf,
        /// Why.
        cause: std::io::Error,
    },
}

/// A running local `nats-server -js`.
pub struct LocalNatsServer {
    child: Option<Child>,
    port: u16,
    store: PathBuf,
    extra: Vec<String>,
}

impl LocalNatsServer {
    /// Starts a server on a free loopback port with its JetStream store in `store`.
    pub fn start(store: &Path) -> Result<Self, LocalServerError> {
        Self::start_with(store, 0, &[])
    }

    /// Starts a server on `port` (0: a free one) with extra arguments (e.g. a cluster
    /// config).
    pub fn start_with(store: &Path, port: u16, extra: &[String]) -> Result<Self, LocalServerError> {
        let mut s = Self { child: None, port, store: store.to_path_buf(), extra: extra.to_vec() };
        s.spawn()?;
        Ok(s)
    }

    fn spawn(&mut self) -> Result<(), LocalServerError> {
        let port = if self.port == 0 { "-1".to_string() } else { self.port.to_string() };
        let mut cmd = Command::new("nats-server");
        cmd.args(["-js", "-a", "127.0.0.1", "-p", &port, "-sd"])
            .arg(&self.store)
            .args(&self.extra)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut child = cmd.spawn().map_err(LocalServerError::Missing)?;
        let stderr = child.stderr.take().ok_or_else(|| LocalServerError::NotReady("no stderr".into()))?;
        let (tx, rx) = mpsc::channel();
        // Reads the log: reports the port and readiness, then keeps draining the pipe.
        std::thread::spawn(move || {
            let mut port = None;
            let mut tail = Vec::new();
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                if let Some(rest) = line.split("Listening for client connections on ").nth(1) {
                    port = rest.trim().rsplit(':').next().and_then(|p| p.parse::<u16>().ok());
                }
                if line.contains("Server is ready") {
                    let _ = tx.send(port.ok_or_else(|| "no client port in the log".to_string()));
                } else if tail.len() < 50 {
                    tail.push(line);
                }
            }
            let _ = tx.send(Err(format!("exited: {}", tail.join("\n"))));
        });
        self.child = Some(child);
        match rx.recv_timeout(READY_TIMEOUT) {
            Ok(Ok(port)) => {
                self.port = port;
                Ok(())
            }
            Ok(Err(why)) => {
                self.stop();
                Err(LocalServerError::NotReady(why))
            }
            Err(_) => {
                self.stop();
                Err(LocalServerError::NotReady(format!("not ready within {READY_TIMEOUT:?}")))
            }
        }
    }

    /// The client URL.
    pub fn url(&self) -> String {
        format!("nats://127.0.0.1:{}", self.port)
    }

    /// The server's process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Whether the server exited by itself (e.g. it could not bind a route or monitoring
    /// port it was given after it had reported ready). A stopped server counts as exited.
    pub fn has_exited(&mut self) -> bool {
        self.child.as_mut().is_none_or(|c| !matches!(c.try_wait(), Ok(None)))
    }

    /// The client port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Kills the server (SIGKILL) and waits for it; its store stays.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts it again on the same port with the same store.
    pub fn restart(&mut self) -> Result<(), LocalServerError> {
        self.stop();
        self.spawn()
    }

    /// Starts it again on the same port with an empty store, as a server that lost its
    /// disk: every stream and key-value bucket is gone.
    pub fn restart_empty(&mut self) -> Result<(), LocalServerError> {
        self.stop();
        let store_err = |cause| LocalServerError::Store { path: self.store.clone(), cause };
        match std::fs::remove_dir_all(&self.store) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(store_err(e)),
        }
        std::fs::create_dir_all(&self.store).map_err(store_err)?;
        self.spawn()
    }
}

impl Drop for LocalNatsServer {
    fn drop(&mut self) {
        self.stop();
    }
}
