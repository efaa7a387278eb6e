//! `fleetwatch sim`: command-line arguments and the serving loop.

use std::net::SocketAddr;
use std::path::PathBuf;

use tokio_util::sync::CancellationToken;

use crate::cluster::{DEFAULT_HISTORY, SimCluster, SimOptions};
use crate::error::SimError;

/// Serve simulated Kubernetes clusters (in-memory API servers speaking the real HTTP API).
///
/// Each cluster has its own self-signed CA and bearer token; the kubeconfig written for it
/// works unchanged with kubectl and kube-rs.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address of the (first) cluster. With --clusters N, cluster i listens on port+i
    /// (or on a free port each when the port is 0).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:6443")]
    pub listen: SocketAddr,

    /// Write the kubeconfig of the (single) cluster to FILE.
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,

    /// Number of clusters to serve, one port each.
    #[arg(long, value_name = "N", default_value_t = 1)]
    pub clusters: usize,

    /// Directory receiving <name>.kubeconfig for every cluster (required with --clusters > 1).
    #[arg(long, value_name = "D")]
    pub dir: Option<PathBuf>,

    /// Watch events retained per cluster; a watch resuming from an older resourceVersion
    /// gets 410 Gone and must relist.
    #[arg(long, value_name = "N", default_value_t = DEFAULT_HISTORY)]
    pub history: usize,
}

/// Name of cluster `i` of `n`.
fn cluster_name(i: usize, n: usize) -> String {
    if n == 1 { "sim".to_string() } else { format!("sim-{i}") }
}

/// Serves the clusters `args` describe until `shutdown` is cancelled. Prints one line per
/// cluster: `cluster NAME URL kubeconfig PATH`.
pub async fn run(args: SimArgs, shutdown: CancellationToken) -> Result<(), SimError> {
    if args.clusters == 0 {
        return Err(SimError::Args("--clusters must be at least 1".into()));
    }
    if args.clusters > 1 && args.dir.is_none() {
        return Err(SimError::Args("--clusters > 1 needs --dir for the kubeconfigs".into()));
    }
    if args.clusters > 1 && args.kubeconfig_out.is_some() {
        return Err(SimError::Args("--kubeconfig-out is for a single cluster; use --dir with --clusters".into()));
    }
    let mut clusters = Vec::with_capacity(args.clusters);
    for i in 0..args.clusters {
        let mut listen = args.listen;
        if listen.port() != 0 {
            let port = u16::try_from(usize::from(listen.port()) + i)
                .map_err(|_| SimError::Args("port range exceeds 65535".into()))?;
            listen.set_port(port);
        }
        let name = cluster_name(i, args.clusters);
        let sim = SimCluster::start(SimOptions {
            name: name.clone(),
            listen,
            history: args.history,
            ..SimOptions::default()
        })
        .await?;
        let path = match (&args.kubeconfig_out, &args.dir) {
            (Some(p), _) => Some(p.clone()),
            (None, Some(d)) => Some(d.join(format!("{name}.kubeconfig"))),
            (None, None) => None,
        };
        if let Some(p) = &path {
            sim.write_kubeconfig(p)?;
        }
        let shown = path.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "-".into());
        println!("cluster {name} {} kubeconfig {shown}", sim.url());
        clusters.push(sim);
    }
    shutdown.cancelled().await;
    for c in &clusters {
        c.shutdown();
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn defaults_and_flags() {
        let c = Cli::parse_from(["x"]);
        assert_eq!(c.sim.listen.to_string(), "127.0.0.1:6443");
        assert_eq!(c.sim.clusters, 1);
        let c = Cli::parse_from(["x", "--clusters", "3", "--dir", "/tmp/d", "--history", "5"]);
        assert_eq!((c.sim.clusters, c.sim.history), (3, 5));
    }

    #[tokio::test]
    async fn many_clusters_need_a_dir() {
        let c = Cli::parse_from(["x", "--clusters", "2"]);
        assert!(matches!(run(c.sim, CancellationToken::new()).await, Err(SimError::Args(_))));
    }

    #[tokio::test]
    async fn serves_n_clusters_and_writes_kubeconfigs() {
        let dir = std::env::temp_dir().join(format!("fw-sim-cli-{}", std::process::id()));
        let c = Cli::parse_from(["x", "--listen", "127.0.0.1:0", "--clusters", "2", "--dir", dir.to_str().unwrap()]);
        let token = CancellationToken::new();
        let t = tokio::spawn(run(c.sim, token.clone()));
        let mut found = false;
        for _ in 0..100 {
            if dir.join("sim-1.kubeconfig").exists() {
                found = true;
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        token.cancel();
        t.await.unwrap().unwrap();
        assert!(found);
        let k: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("sim-0.kubeconfig")).unwrap()).unwrap();
        assert_eq!(k["current-context"], "sim-0");
        let _ = std::fs::remove_dir_all(dir);
    }
}
