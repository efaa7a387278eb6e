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

    /// Enforce RBAC for ServiceAccount tokens (Roles, ClusterRoles and their bindings);
    /// the cluster's own token keeps full access. Get a ServiceAccount's token with
    /// `fleetwatch sim token NS/NAME` or `kubectl create token NAME -n NS`.
    #[arg(long)]
    pub rbac: bool,

    /// Do not report Deployments and StatefulSets as rolled out. By default the sim stands
    /// in for their controllers and kubelets (no pods run here): it sets their
    /// observedGeneration, replica counts (and a StatefulSet's revisions) to the spec, as a
    /// healthy cluster would, so `kubectl rollout status` finishes.
    #[arg(long)]
    pub no_deployment_controller: bool,

    /// The endpoint of a Service port for the service proxy
    /// (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/…`): NS/NAME:PORT=ADDR, PORT the
    /// Service port's name, ADDR a loopback address. The Service object is created as usual
    /// (kubectl apply). Repeatable.
    #[arg(long = "endpoint", value_name = "NS/NAME:PORT=ADDR", value_parser = parse_endpoint)]
    pub endpoints: Vec<Endpoint>,

    /// Instead of serving: a helper command against a running sim.
    #[command(subcommand)]
    pub command: Option<SimCommand>,
}

/// Helper commands against a running sim.
#[derive(Debug, Clone, clap::Subcommand)]
pub enum SimCommand {
    /// Print a bearer token for a ServiceAccount (through the TokenRequest API, as
    /// `kubectl create token` does), optionally writing a kubeconfig that uses it.
    Token(TokenArgs),
}

/// `fleetwatch sim token`.
#[derive(Debug, Clone, clap::Args)]
pub struct TokenArgs {
    /// The ServiceAccount, NAMESPACE/NAME (it must exist).
    #[arg(value_name = "NAMESPACE/NAME")]
    pub account: String,

    /// The sim's kubeconfig (the one `fleetwatch sim` wrote; its token may create tokens).
    #[arg(long, value_name = "FILE", env = "KUBECONFIG")]
    pub kubeconfig: PathBuf,

    /// Also write a kubeconfig authenticating as the ServiceAccount to FILE (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub kubeconfig_out: Option<PathBuf>,

    /// Lifetime of the token in seconds (at least 600).
    #[arg(long, value_name = "SECONDS", default_value_t = 86_400)]
    pub duration: u64,
}

/// One `--endpoint`: a Service port and the loopback address the proxy forwards it to.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub service: String,
    /// The Service port's name (empty for a Service's one unnamed port).
    pub port: String,
    /// Where requests go.
    pub address: SocketAddr,
}

fn parse_endpoint(s: &str) -> Result<Endpoint, String> {
    let bad = || format!("{s:?}: expected NAMESPACE/SERVICE:PORT=ADDRESS, e.g. default/web:http=127.0.0.1:8080");
    let (svc, addr) = s.split_once('=').ok_or_else(bad)?;
    let (namespace, rest) = svc.split_once('/').ok_or_else(bad)?;
    let (service, port) = rest.split_once(':').unwrap_or((rest, ""));
    if namespace.is_empty() || service.is_empty() {
        return Err(bad());
    }
    let address: SocketAddr = addr.parse().map_err(|e| format!("{s:?}: address {addr:?}: {e}"))?;
    if !address.ip().is_loopback() {
        return Err(format!("{s:?}: only loopback addresses can be exposed"));
    }
    Ok(Endpoint { namespace: namespace.into(), service: service.into(), port: port.into(), address })
}

/// Name of cluster `i` of `n`.
fn cluster_name(i: usize, n: usize) -> String {
    if n == 1 { "sim".to_string() } else { format!("sim-{i}") }
}

/// Serves the clusters `args` describe until `shutdown` is cancelled (printing one line
/// per cluster: `cluster NAME URL kubeconfig PATH`), or runs the helper subcommand
/// (`token`) against a running sim.
pub async fn run(args: SimArgs, shutdown: CancellationToken) -> Result<(), SimError> {
    if let Some(SimCommand::Token(t)) = args.command {
        return token(t).await;
    }
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
            rbac: args.rbac,
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
        for e in &args.endpoints {
            sim.expose_service(&e.namespace, &e.service, &e.port, e.address)
                .map_err(|err| SimError::Args(format!("--endpoint: {err}")))?;
        }
        #[cfg(feature = "kube-client")]
        if !args.no_deployment_controller {
            let client = sim.client().await?;
            tokio::spawn(crate::roll_out_deployments(client, std::time::Duration::ZERO, shutdown.child_token()));
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

/// `fleetwatch sim token NS/NAME`: asks the running sim for a token through the
/// TokenRequest API with the admin kubeconfig and prints it.
#[cfg(feature = "kube-client")]
async fn token(args: TokenArgs) -> Result<(), SimError> {
    let (ns, name) = args
        .account
        .split_once('/')
        .filter(|(n, a)| !n.is_empty() && !a.is_empty())
        .ok_or_else(|| SimError::Args(format!("expected NAMESPACE/NAME, got {:?}", args.account)))?;
    let text = std::fs::read_to_string(&args.kubeconfig)
        .map_err(|e| SimError::io(format!("reading {}", args.kubeconfig.display()), e))?;
    let kc = kube::config::Kubeconfig::from_yaml(&text).map_err(|e| SimError::Kube(e.to_string()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
        .await
        .map_err(|e| SimError::Kube(e.to_string()))?;
    let client = kube::Client::try_from(cfg).map_err(|e| SimError::Kube(e.to_string()))?;
    let body = serde_json::json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"expirationSeconds": args.duration},
    });
    let req = http::Request::post(format!("/api/v1/namespaces/{ns}/serviceaccounts/{name}/token"))
        .header(http::header::CONTENT_TYPE, "application/json")
        .body(serde_json::to_vec(&body).unwrap_or_default())
        .map_err(|e| SimError::Kube(e.to_string()))?;
    let resp: serde_json::Value =
        client.request(req).await.map_err(|e| SimError::Kube(format!("requesting a token for {ns}/{name}: {e}")))?;
    let token = resp["status"]["token"]
        .as_str()
        .ok_or_else(|| SimError::Kube(format!("the TokenRequest answer has no token: {resp}")))?;
    if let Some(out) = &args.kubeconfig_out {
        let mut kc: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
            SimError::Args(format!("--kubeconfig-out needs the JSON kubeconfig fleetwatch sim writes: {e}"))
        })?;
        let user = kc["contexts"]
            .as_array()
            .and_then(|cs| cs.iter().find(|c| c["name"] == kc["current-context"]))
            .and_then(|c| c["context"]["user"].as_str())
            .map(str::to_string)
            .ok_or_else(|| SimError::Args("the kubeconfig has no current context".into()))?;
        for u in kc["users"].as_array_mut().into_iter().flatten() {
            if u["name"] == user.as_str() {
                u["user"] = serde_json::json!({"token": token});
            }
        }
        crate::cluster::write_private(out, &serde_json::to_string_pretty(&kc).unwrap_or_default())?;
    }
    println!("{token}");
    Ok(())
}

#[cfg(not(feature = "kube-client"))]
async fn token(_args: TokenArgs) -> Result<(), SimError> {
    Err(SimError::Args("fleetwatch sim token needs the kube-client feature".into()))
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
        let c = Cli::parse_from(["x", "--clusters", "3", "--dir", "/tmp/d", "--history", "5", "--rbac"]);
        assert_eq!((c.sim.clusters, c.sim.history, c.sim.rbac), (3, 5, true));
        let c =
            Cli::parse_from(["x", "--endpoint", "fw/hub:admin=127.0.0.1:9090", "--endpoint", "default/web=[::1]:80"]);
        assert_eq!(c.sim.endpoints[0].port, "admin");
        assert_eq!((c.sim.endpoints[1].service.as_str(), c.sim.endpoints[1].port.as_str()), ("web", ""));
        for bad in ["fw/hub:admin", "hub:admin=127.0.0.1:1", "fw/hub=10.0.0.1:80", "fw/:a=127.0.0.1:1"] {
            assert!(Cli::try_parse_from(["x", "--endpoint", bad]).is_err(), "{bad}");
        }
        let c = Cli::parse_from(["x", "token", "team/bot", "--kubeconfig", "/tmp/k", "--kubeconfig-out", "/tmp/o"]);
        let Some(SimCommand::Token(t)) = c.sim.command else { panic!("token subcommand") };
        assert_eq!((t.account.as_str(), t.duration), ("team/bot", 86_400));
    }

    #[cfg(feature = "kube-client")]
    #[tokio::test]
    async fn token_subcommand_writes_a_kubeconfig_that_authenticates_as_the_account() {
        let sim = SimCluster::start(SimOptions { rbac: true, ..SimOptions::default() }).await.unwrap();
        let dir = std::env::temp_dir().join(format!("fw-sim-token-{}", std::process::id()));
        let (admin, out) = (dir.join("admin.kubeconfig"), dir.join("bot.kubeconfig"));
        sim.write_kubeconfig(&admin).unwrap();
        sim.token_for("default", "bot").unwrap();
        let (a, o) = (admin.to_str().unwrap(), out.to_str().unwrap());
        let c = Cli::parse_from(["x", "token", "default/bot", "--kubeconfig", a, "--kubeconfig-out", o]);
        run(c.sim, CancellationToken::new()).await.unwrap();
        let text = std::fs::read_to_string(&out).unwrap();
        let kc = kube::config::Kubeconfig::from_yaml(&text).unwrap();
        let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await.unwrap();
        let client = kube::Client::try_from(cfg).unwrap();
        let cms: kube::Api<k8s_openapi::api::core::v1::ConfigMap> = kube::Api::namespaced(client, "default");
        // Authenticated (not 401) as the ServiceAccount, which nothing grants anything yet.
        match cms.list(&Default::default()).await {
            Err(kube::Error::Api(s)) => {
                assert_eq!(s.code, 403);
                assert!(s.message.contains("system:serviceaccount:default:bot"), "{}", s.message);
            }
            other => panic!("expected 403, got {other:?}"),
        }
        let c = Cli::parse_from(["x", "token", "default/nobody", "--kubeconfig", a]);
        assert!(run(c.sim, CancellationToken::new()).await.is_err(), "no such ServiceAccount");
        let _ = std::fs::remove_dir_all(dir);
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
