//! `bench soak --bus nats`: a 3-node NATS JetStream cluster on loopback (real
//! `nats-server` processes), each node behind a cut-able proxy the hubs connect through.
//! Nodes can be killed and started again on their store, or all of them restarted with
//! their stores wiped (JetStream restarted empty).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use fleetwatch_bus::nats::server::{LocalNatsServer, LocalServerError};
use tokio_util::sync::CancellationToken;

use super::procs::free_port;
use super::proxy::CutProxy;

/// Nodes in the cluster: a stream with 3 replicas survives the loss of one.
pub const NODES: usize = 3;

/// How long the cluster may take to elect a meta leader, or a node to become current.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// Why the cluster could not be started, or a node not started again.
#[derive(Debug, thiserror::Error)]
pub enum JetStreamError {
    /// A node did not start.
    #[error("JetStream node {node}: {source}")]
    Node {
        /// Which node.
        node: usize,
        /// Why.
        source: LocalServerError,
    },
    /// A store directory could not be removed.
    #[error("cannot wipe the store {path} of JetStream node {node}: {source}")]
    Wipe {
        /// Which node.
        node: usize,
        /// The store.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// A proxy could not listen.
    #[error("cannot start the proxy in front of JetStream node {node}: {source}")]
    Proxy {
        /// Which node.
        node: usize,
        /// Why.
        source: std::io::Error,
    },
    /// A blocking start did not finish.
    #[error("starting JetStream node {node} panicked or was cancelled")]
    Join {
        /// Which node.
        node: usize,
    },
}

/// One node: its process (while it runs) and what starts it again.
struct Node {
    server: Option<LocalNatsServer>,
    store: PathBuf,
    port: u16,
    monitor: SocketAddr,
    args: Vec<String>,
}

/// The cluster and the proxies in front of its nodes.
pub struct JetStream {
    nodes: Vec<Node>,
    proxies: Vec<CutProxy>,
}

impl JetStream {
    /// Starts [`NODES`] nodes with their stores under `dir`, waits for a meta leader, and
    /// puts a proxy in front of each.
    pub async fn start(dir: &Path, stop: &CancellationToken) -> Result<Self, JetStreamError> {
        let free = |node| free_port().map_err(|source| JetStreamError::Proxy { node, source });
        let mut routes = Vec::with_capacity(NODES);
        let mut plan = Vec::with_capacity(NODES);
        for i in 0..NODES {
            let (client, route, monitor) = (free(i)?, free(i)?, free(i)?);
            routes.push(format!("nats://127.0.0.1:{}", route.port()));
            plan.push((client.port(), route.port(), monitor));
        }
        let routes = routes.join(",");
        let mut nodes = Vec::with_capacity(NODES);
        for (i, (port, route, monitor)) in plan.into_iter().enumerate() {
            let args: Vec<String> = [
                "-n",
                &format!("soak-{i}"),
                "--cluster_name",
                "soak",
                "--cluster",
                &format!("nats://127.0.0.1:{route}"),
                "--routes",
                &routes,
                "-m",
                &monitor.port().to_string(),
                // Clients (the hubs) must reach the nodes through the proxies only, or a
                // cut would not cut: do not tell them the nodes' own addresses.
                "--no_advertise",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            nodes.push(Node { server: None, store: dir.join(format!("js-{i}")), port, monitor, args });
        }
        let mut js = Self { nodes, proxies: Vec::new() };
        js.start_nodes(&(0..NODES).collect::<Vec<_>>()).await?;
        for (i, n) in js.nodes.iter().enumerate() {
            let target = SocketAddr::from(([127, 0, 0, 1], n.port));
            let proxy = CutProxy::start(target, stop.child_token())
                .await
                .map_err(|source| JetStreamError::Proxy { node: i, source })?;
            js.proxies.push(proxy);
        }
        if !js.wait_meta_leader(READY_TIMEOUT).await {
            tracing::warn!("the JetStream cluster has no meta leader yet; the hubs will wait for it");
        }
        Ok(js)
    }

    /// The hubs' `--bus`: every node through its proxy.
    pub fn urls(&self) -> String {
        self.proxies.iter().map(|p| format!("nats://{}", p.addr())).collect::<Vec<_>>().join(",")
    }

    /// Nodes in the cluster.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// SIGKILLs node `i` (its store stays).
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut s) = self.nodes.get_mut(i).and_then(|n| n.server.take()) {
            let _ = tokio::task::spawn_blocking(move || s.stop()).await;
        }
    }

    /// Freezes (`SIGSTOP`) or thaws (`SIGCONT`) node `i`: it keeps its connections open
    /// and answers nothing, while the other two keep quorum.
    pub fn freeze(&self, i: usize, frozen: bool) -> bool {
        let Some(pid) = self.nodes.get(i).and_then(|n| n.server.as_ref()).and_then(|s| s.pid()) else { return false };
        let Ok(pid) = i32::try_from(pid) else { return false };
        // SAFETY: kill(2) with the pid of a running child the server handle owns (not reaped).
        unsafe {
            libc::kill(pid, if frozen { libc::SIGSTOP } else { libc::SIGCONT });
        }
        true
    }

    /// Starts the given nodes (stopped ones only), in parallel: a restarted cluster's
    /// nodes wait for each other.
    pub async fn start_nodes(&mut self, which: &[usize]) -> Result<(), JetStreamError> {
        let mut starts = Vec::new();
        for &i in which {
            let Some(n) = self.nodes.get(i) else { continue };
            if n.server.is_some() {
                continue;
            }
            let (store, port, args) = (n.store.clone(), n.port, n.args.clone());
            starts.push((i, tokio::task::spawn_blocking(move || LocalNatsServer::start_with(&store, port, &args))));
        }
        let mut first_error = None;
        for (i, start) in starts {
            match start.await {
                Ok(Ok(server)) => self.nodes[i].server = Some(server),
                Ok(Err(source)) => {
                    first_error.get_or_insert(JetStreamError::Node { node: i, source });
                }
                Err(_) => {
                    first_error.get_or_insert(JetStreamError::Join { node: i });
                }
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// JetStream restarted empty: SIGKILLs every node, removes every store, starts them
    /// all again.
    pub async fn restart_empty(&mut self) -> Result<(), JetStreamError> {
        for i in 0..self.nodes.len() {
            self.kill(i).await;
        }
        for (i, n) in self.nodes.iter().enumerate() {
            match std::fs::remove_dir_all(&n.store) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(source) => return Err(JetStreamError::Wipe { node: i, path: n.store.clone(), source }),
            }
        }
        self.start_nodes(&(0..self.nodes.len()).collect::<Vec<_>>()).await
    }

    /// Cuts the path to node `i`, or to every node.
    pub fn cut(&self, node: Option<usize>) {
        for (i, p) in self.proxies.iter().enumerate() {
            if node.is_none_or(|n| n == i) {
                p.cut();
            }
        }
    }

    /// Restores every path.
    pub fn restore(&self) {
        for p in &self.proxies {
            p.restore();
        }
    }

    /// Waits until a node reports a meta leader of the whole cluster; false after `timeout`.
    pub async fn wait_meta_leader(&self, timeout: Duration) -> bool {
        let start = Instant::now();
        loop {
            for n in self.nodes.iter().filter(|n| n.server.is_some()) {
                let jsz = http(n.monitor, "/jsz").await.map(|(_, body)| body).unwrap_or_default();
                let v: serde_json::Value = serde_json::from_str(&jsz).unwrap_or_default();
                let m = &v["meta_cluster"];
                if m["leader"].as_str().is_some_and(|l| !l.is_empty())
                    && m["cluster_size"].as_u64() == Some(NODES as u64)
                {
                    return true;
                }
            }
            if start.elapsed() > timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits until node `i` says it is healthy (JetStream current); false after `timeout`.
    pub async fn wait_healthy(&self, i: usize, timeout: Duration) -> bool {
        let Some(n) = self.nodes.get(i) else { return false };
        let start = Instant::now();
        loop {
            if let Some((200, _)) = http(n.monitor, "/healthz").await {
                return true;
            }
            if start.elapsed() > timeout {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `GET path` on a node's monitoring port: (status, body); none when it does not answer
/// within 5 s (a stopped or hung node).
async fn http(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
    let addr = addr.to_string();
    tokio::time::timeout(Duration::from_secs(5), fleetwatch_client::admin_http::request(&addr, path, None))
        .await
        .ok()?
        .ok()
}

/// How long [`JetStream::wait_healthy`] and [`JetStream::wait_meta_leader`] wait after a
/// fault.
pub const RECOVER_TIMEOUT: Duration = READY_TIMEOUT;
