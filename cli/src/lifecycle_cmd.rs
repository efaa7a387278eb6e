//! `fleetwatch lifecycle`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use fleetwatch_client::subscriber::SubscriberOptions;
use fleetwatch_client::transport::HubUrls;
use fleetwatch_protocol::message::StartFrom;

#[derive(Args)]
pub struct LifecycleArgs {
    /// The control plane holding Runtimes, ModuleTemplates and ModuleReleaseMetas (and the
    /// kubeconfig Secrets of runtime clusters). Default: the in-cluster configuration, else
    /// $KUBECONFIG or ~/.kube/config.
    #[arg(long, env = "FLEETWATCH_CONTROL_PLANE_KUBECONFIG")]
    control_plane_kubeconfig: Option<PathBuf>,
    /// The hub to subscribe to, as wss://HOST:PORT: its events make reconciles event-driven.
    /// Without it only changes in the control plane and the resync trigger reconciles.
    /// Several hub replicas: repeat the flag or separate with commas; they are tried in
    /// order and the operator fails over to the next when one is unreachable.
    #[arg(long, env = "FLEETWATCH_HUB", value_delimiter = ',', requires_all = ["cert", "key", "ca"])]
    hub: Vec<String>,
    /// Subscriber certificate for the hub.
    #[arg(long, env = "FLEETWATCH_CERT")]
    cert: Option<PathBuf>,
    /// Subscriber key.
    #[arg(long, env = "FLEETWATCH_KEY")]
    key: Option<PathBuf>,
    /// CA bundle that signed the hub's certificate.
    #[arg(long, env = "FLEETWATCH_CA")]
    ca: Vec<PathBuf>,
    /// Seconds between safety resyncs of every Runtime; 0 switches them off.
    #[arg(long, env = "FLEETWATCH_RESYNC", default_value_t = 3600.0)]
    resync: f64,
    /// Reconciles running at once.
    #[arg(long, env = "FLEETWATCH_CONCURRENCY", default_value_t = 16)]
    concurrency: u16,
    /// Serve `/metrics` (Prometheus text: reconciles, failures, migrations and their time,
    /// reconcile duration histogram, modules by state, queue depth, shards held), `/healthz`
    /// (the process answers) and `/readyz` (200 only while the control plane's API server
    /// answers a list of Runtimes within 2 s; 503 with the cause otherwise) on this address.
    #[arg(long, env = "FLEETWATCH_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// How much of a maintenance window must be left for an upgrade that needs downtime to
    /// start (e.g. `20m`, `1h`).
    #[arg(long, env = "FLEETWATCH_MIN_WINDOW_REMAINING", default_value = "20m")]
    min_window_remaining: String,
    /// Only one instance acts: the one holding a coordination.k8s.io/v1 Lease in the control
    /// plane. Others wait and take over when the leader's lease expires. `--leader-elect=false`
    /// for a single instance that acts at once.
    #[arg(long, env = "FLEETWATCH_LEADER_ELECT", default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// Namespace of the leader-election Lease (in a cluster: the pod's namespace).
    #[arg(long, env = "POD_NAMESPACE", default_value = "default")]
    leader_elect_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, env = "FLEETWATCH_LEADER_ELECT_LEASE", default_value = "fleetwatch-lifecycle")]
    leader_elect_lease: String,
    /// Seconds a leader's Lease is valid without renewal: how long a dead leader is waited for.
    #[arg(long, env = "FLEETWATCH_LEADER_ELECT_LEASE_DURATION", default_value_t = 15.0)]
    leader_elect_lease_duration: f64,
    /// Share the Runtimes among instances in this many shards, each guarded by its own Lease
    /// `<lease>-shard-<i>` (a Runtime's shard is its bucket label `lifecycle.fleetwatch.dev/bucket`,
    /// FNV-1a of `namespace/name` modulo 60, modulo N; N divides 60). Every instance takes
    /// up to ceil(N / live instances) shards and watches, caches and reconciles only their
    /// Runtimes; a lost instance's shards are taken over within the lease duration. 1: one
    /// leader (the Lease `<lease>`) reconciles everything. Give every instance the same N.
    #[arg(long, env = "FLEETWATCH_SHARDS", default_value_t = 1)]
    shards: u32,
    /// Read Runtimes' kubeconfig Secrets (and ModuleTemplates' registry pull Secrets) from
    /// this control-plane namespace only, whatever namespace the Runtime is in; a Runtime
    /// naming a Secret in another namespace is refused (its status says so). A namespace
    /// that holds nothing else lets the operator's ServiceAccount read Secrets there and
    /// nowhere else (the chart: `lifecycle.runtimeKubeconfigs.namespace`). Default: each
    /// Runtime's (template's) own namespace.
    #[arg(long, env = "FLEETWATCH_KUBECONFIG_NAMESPACE")]
    kubeconfig_namespace: Option<String>,
    /// Install the agent into every Runtime's cluster and issue its certificate from this
    /// CA: a control-plane Secret NAMESPACE/NAME with `ca.crt` and `ca.key` (as `fleetwatch
    /// certs init` writes them; `tls.crt`/`tls.key` work too) and optionally `hub-ca.crt`,
    /// the CA bundle agents trust for the hub (default: `ca.crt`). Every Runtime then gets
    /// the module `fleetwatch-agent` (its ModuleTemplate: `fleetwatch agent-module`) and, in
    /// its cluster, the Secret fleetwatch-system/fleetwatch-agent-tls with `tls.crt`
    /// (identity spiffe://<trust-domain>/cluster/<clusterId>, clientAuth), `tls.key` and
    /// `ca.crt`, renewed at two thirds of its lifetime; agents reload it without a restart.
    #[arg(long, env = "FLEETWATCH_AGENT_CA_SECRET")]
    agent_ca_secret: Option<String>,
    /// How long the agent certificates issued with --agent-ca-secret are valid (e.g.
    /// `30d`, `720h`, `45s`); each is renewed when two thirds of it have passed.
    #[arg(long, env = "FLEETWATCH_AGENT_CERT_LIFETIME", default_value = "30d", requires = "agent_ca_secret")]
    agent_cert_lifetime: String,
    /// Keep the module artifacts pulled for ModuleTemplates with `spec.source.oci.ref` in
    /// this directory (one entry per digest, checked when read), so a restart needs no
    /// registry for them. Without it they are kept in memory only.
    #[arg(long, env = "FLEETWATCH_ARTIFACT_CACHE", value_name = "DIR")]
    artifact_cache: Option<PathBuf>,
    /// Most bytes the artifact cache directory holds; the least recently used artifacts
    /// are removed beyond it (e.g. `1Gi`, `500Mi`, `2000000`).
    #[arg(long, env = "FLEETWATCH_ARTIFACT_CACHE_MAX_BYTES", default_value = "1Gi", value_parser = crate::size::parse)]
    artifact_cache_max_bytes: u64,
    /// Most bytes of artifacts (their objects as JSON) kept in memory, shared by every runtime; the
    /// least recently used are dropped beyond it and read again from the cache directory.
    #[arg(long, env = "FLEETWATCH_ARTIFACT_MEMORY_MAX_BYTES", default_value = "64Mi", value_parser = crate::size::parse)]
    artifact_memory_max_bytes: u64,
    /// Most bytes all artifact pulls in flight may hold together: a pull reserves 4 MiB while it
    /// reads a manifest, then its layers' declared sizes before it fetches any; one that does
    /// not fit waits (at most 2 minutes, then it is retried with backoff), and an artifact
    /// declaring more than this is refused. At least `4Mi`.
    #[arg(long, env = "FLEETWATCH_ARTIFACT_PULL_MAX_BYTES", default_value = "64Mi", value_parser = crate::size::parse)]
    artifact_pull_max_bytes: u64,
    /// Keep the WatchConfigs the operator relies on in the control plane (default true):
    /// `fleetwatch-lifecycle.namespaces`, `fleetwatch-lifecycle.crds`,
    /// `fleetwatch-lifecycle.modules` (the `Module` objects users create in their clusters)
    /// and one per module configuration kind no other WatchConfig watches. A module waiting
    /// for a namespace, a kind or its configuration, or chosen by a user in their cluster, is
    /// then reconciled as soon as the agent reports it, not at its next retry or resync. The hub must read WatchConfigs from this control plane; `false` when
    /// it reads them from files (then give the same watches there).
    #[arg(long, env = "FLEETWATCH_WATCH_CONFIGS", default_value_t = true, action = clap::ArgAction::Set)]
    watch_configs: bool,
    #[command(flatten)]
    registry: crate::module_cmd::RegistryArgs,
}

pub async fn run(args: LifecycleArgs) -> anyhow::Result<()> {
    // One kept-alive connection per runtime cluster reached: thousands of Runtimes need more
    // descriptors than the usual soft limit of 1,024, so take what the hard limit allows.
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => tracing::debug!(open_files = n, "open-file limit"),
        Err(e) => tracing::warn!(error = %e, "cannot raise the open-file limit"),
    }
    let client = match &args.control_plane_kubeconfig {
        Some(path) => fleetwatch_client::kubeconfig::client_from_kubeconfig(path)
            .await
            .context("cannot reach the control plane")?,
        None => kube::Client::try_default()
            .await
            .context("no --control-plane-kubeconfig given and no in-cluster configuration or $KUBECONFIG found")?,
    };
    if !fleetwatch_lifecycle::buckets::valid_shard_count(args.shards) {
        anyhow::bail!(
            "--shards {} must divide {} (1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 or 60): each shard takes an equal share of the Runtime buckets",
            args.shards,
            fleetwatch_lifecycle::buckets::BUCKETS
        );
    }
    if args.shards > 1 && !args.leader_elect {
        anyhow::bail!("--shards {} needs leader election (Leases): drop --leader-elect=false", args.shards);
    }
    let identity = instance_identity();
    let hub = if args.hub.is_empty() {
        None
    } else {
        let url = HubUrls::parse_all(&args.hub)?;
        let (Some(cert), Some(key)) = (&args.cert, &args.key) else { anyhow::bail!("--hub needs --cert and --key") };
        // Followed by content: a renewed certificate is used without a restart.
        let tls = fleetwatch_client::client_tls::ClientTls::from_files(crate::tls_files(cert, key, &args.ca))?;
        let mut opts = SubscriberOptions::new(url, tls);
        // Sharded instances follow the hub without a durable name: one shared cursor would
        // let one instance ack what another has not seen, and a name per process would pile
        // up in the hub. The subscription resumes from its own acked cursor across
        // reconnects; a new process starts from the latest events and reconciles every
        // Runtime of each shard it takes, so nothing it missed is lost.
        opts.durable = (args.shards == 1).then(|| "lifecycle".into());
        opts.from = StartFrom::Latest;
        Some(opts)
    };
    let resync =
        if args.resync > 0.0 { Some(Duration::try_from_secs_f64(args.resync).context("--resync")?) } else { None };
    let min_window_remaining: jiff::SignedDuration = args
        .min_window_remaining
        .parse()
        .with_context(|| format!("--min-window-remaining {:?}", args.min_window_remaining))?;
    let agent_certs = match &args.agent_ca_secret {
        Some(secret) => {
            let lifetime: jiff::SignedDuration = args
                .agent_cert_lifetime
                .parse()
                .or_else(|_| {
                    args.agent_cert_lifetime
                        .parse::<jiff::Span>()
                        .and_then(|s| s.to_duration(jiff::SpanRelativeTo::days_are_24_hours()))
                })
                .with_context(|| format!("--agent-cert-lifetime {:?}", args.agent_cert_lifetime))?;
            let lifetime = std::time::Duration::try_from(lifetime)
                .with_context(|| format!("--agent-cert-lifetime {:?} must be positive", args.agent_cert_lifetime))?;
            let certs = fleetwatch_lifecycle::agent_module::AgentCerts::new(secret, lifetime)
                .map_err(|e| anyhow::anyhow!("--agent-ca-secret: {e}"))?;
            tracing::info!(ca = %secret, lifetime_secs = lifetime.as_secs(), "installing agents and issuing their certificates");
            Some(certs)
        }
        None => None,
    };
    if let Some(dir) = &args.artifact_cache {
        std::fs::create_dir_all(dir).with_context(|| format!("--artifact-cache {}", dir.display()))?;
    }
    let manifest_max = fleetwatch_lifecycle::artifact::registry::MAX_MANIFEST_BYTES;
    if args.artifact_pull_max_bytes < manifest_max {
        anyhow::bail!(
            "--artifact-pull-max-bytes {} is less than the {manifest_max} bytes a manifest may take",
            args.artifact_pull_max_bytes
        );
    }
    let artifacts = fleetwatch_lifecycle::artifact::cache::ArtifactConfig {
        registry: args.registry.options()?,
        cache_dir: args.artifact_cache.clone(),
        disk_max_bytes: args.artifact_cache_max_bytes,
        memory_max_bytes: args.artifact_memory_max_bytes,
        pull_max_bytes: args.artifact_pull_max_bytes,
    };
    let config = fleetwatch_lifecycle::LifecycleConfig {
        artifacts,
        agent_certs,
        min_window_remaining,
        client: client.clone(),
        hub,
        resync,
        concurrency: args.concurrency.max(1),
        migrations: fleetwatch_lifecycle::migration::Registry::builtin(),
        kubeconfig_namespace: args.kubeconfig_namespace.clone().filter(|ns| !ns.is_empty()),
        watch_configs: args.watch_configs,
        ..fleetwatch_lifecycle::LifecycleConfig::new(client.clone())
    };
    tracing::info!(resync_secs = resync.map_or(0.0, |d| d.as_secs_f64()), "lifecycle operator starting");
    println!("lifecycle operator running");
    let shutdown = crate::shutdown_on_signals();
    let metrics = Arc::new(fleetwatch_lifecycle::Metrics::default());
    if let Some(addr) = args.metrics_listen {
        let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
        let health = fleetwatch_lifecycle::health::health(metrics.clone(), client.clone());
        tokio::spawn(health.serve(listener, shutdown.clone()));
    }
    if !args.leader_elect {
        fleetwatch_lifecycle::run(config, metrics, shutdown).await;
        return Ok(());
    }
    let lease_duration = Duration::try_from_secs_f64(args.leader_elect_lease_duration)
        .ok()
        .filter(|d| *d >= Duration::from_secs(1))
        .context("--leader-elect-lease-duration must be at least 1 second")?;
    // One Lease mechanism for every count: a single instance is a shard of one, on the
    // Lease name earlier releases used for their leader (so rolling upgrades stay safe).
    let shards = fleetwatch_lifecycle::shards::ShardConfig::new(
        &args.leader_elect_namespace,
        &args.leader_elect_lease,
        &identity,
        args.shards,
    )
    .with_lease_duration(lease_duration);
    tracing::info!(%identity, shards = args.shards, lease = %format!("{}/{}", args.leader_elect_namespace, shards.shard_lease(0)), "sharing the Runtimes by Leases");
    let config = fleetwatch_lifecycle::LifecycleConfig { shards: Some(shards), ..config };
    fleetwatch_lifecycle::run(config, metrics, shutdown).await;
    Ok(())
}

/// Who this instance is, as the Leases show it: the pod (or host) name plus a per-process
/// suffix, so two processes never share an identity.
fn instance_identity() -> String {
    let host = std::env::var("POD_NAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok().map(|h| h.trim().to_string()))
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "lifecycle".into());
    let nanos =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    format!("{host}-{}-{nanos:08x}", std::process::id())
}
