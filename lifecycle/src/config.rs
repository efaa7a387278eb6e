//! The operator's settings ([`LifecycleConfig`]) and the hook that watches its reconciles
//! from outside ([`ReconcileObserver`]): what a caller (the CLI, the benchmarks, the tests)
//! hands to [`crate::run`].

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_client::subscriber::SubscriberOptions;

use crate::{agent_module, artifact, maintenance, migration, shards};

/// Operator settings.
#[derive(Clone)]
pub struct LifecycleConfig {
    /// The control-plane client (Runtimes, templates, release metas, Secrets).
    pub client: kube::Client,
    /// The hub subscription that makes reconciles event-driven (optional).
    pub hub: Option<SubscriberOptions>,
    /// Safety resync of every Runtime; `None` switches it off.
    pub resync: Option<Duration>,
    /// Reconciles running at once.
    pub concurrency: u16,
    /// Migrations run around installs and upgrades.
    pub migrations: migration::Registry,
    /// Where the operator reads time (maintenance windows).
    pub clock: Arc<dyn maintenance::Clock>,
    /// How much of a maintenance window must be left for a downtime upgrade to start.
    pub min_window_remaining: jiff::SignedDuration,
    /// Share the Runtimes with other instances by shard Leases ([`shards`]); one shard is
    /// leader election (one instance acts, the others stand by). `None`: this instance
    /// reconciles every Runtime at once, with no Lease (only safe when it is the only one).
    pub shards: Option<shards::ShardConfig>,
    /// Told when each reconcile starts and ends (tests and benchmarks count with it).
    pub observer: Option<Arc<dyn ReconcileObserver>>,
    /// Install the agent into every Runtime's cluster and issue its certificate
    /// ([`agent_module`]); `None`: agents are installed some other way.
    pub agent_certs: Option<agent_module::AgentCerts>,
    /// Module artifacts of templates with `spec.source.oci` ([`artifact::cache`]): registry
    /// access and caches.
    pub artifacts: artifact::cache::ArtifactConfig,
    /// The one namespace Runtimes' kubeconfig Secrets and ModuleTemplates' pull Secrets are
    /// read from (the `clusters` module); `None`: each object's own namespace.
    pub kubeconfig_namespace: Option<String>,
    /// Keep the WatchConfigs the operator relies on in the control plane (the `watches` module:
    /// Namespaces, CRDs, module configuration kinds), so what a failing module waits for
    /// triggers it at once.
    pub watch_configs: bool,
}

/// Watches reconciles from outside: `started` when a reconcile of a Runtime this instance
/// acts on begins, `finished` when it ends (also when it is cancelled because its shard was
/// lost). Keys are `namespace/name`.
pub trait ReconcileObserver: Send + Sync {
    /// A reconcile of `runtime` begins.
    fn started(&self, runtime: &str);
    /// That reconcile ended.
    fn finished(&self, runtime: &str);
}

impl LifecycleConfig {
    /// Settings with defaults: no hub, resync every hour, built-in migrations, system clock.
    pub fn new(client: kube::Client) -> Self {
        Self {
            client,
            hub: None,
            resync: Some(Duration::from_secs(3600)),
            concurrency: 16,
            migrations: migration::Registry::builtin(),
            clock: Arc::new(maintenance::SystemClock),
            min_window_remaining: jiff::SignedDuration::from_mins(20),
            shards: None,
            observer: None,
            agent_certs: None,
            artifacts: Default::default(),
            kubeconfig_namespace: None,
            watch_configs: true,
        }
    }
}
