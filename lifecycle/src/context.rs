//! What every reconcile shares ([`Ctx`]): the control-plane client, the stores of templates,
//! release metas and policies, the runtime clusters' writers, the rollouts, the caches and
//! the per-runtime backoff of whole-reconcile failures. Built once by [`crate::run`].

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate, Runtime};
use kube::runtime::reflector::Store;

use crate::{
    Metrics, ReconcileObserver, agent_module, artifact, clusters, config_policy, events, maintenance, migration, retry,
    rollout, shards,
};

/// What reconciles share.
pub(crate) struct Ctx {
    /// The control-plane client.
    pub(crate) client: kube::Client,
    /// Writers for the runtime clusters, from the Runtimes' kubeconfig Secrets.
    pub(crate) clusters: clusters::Clusters,
    /// Every ModuleReleaseMeta (channels and rollout policies).
    pub(crate) metas: Store<ModuleReleaseMeta>,
    /// Every ModuleTemplate (one per module version).
    pub(crate) templates: Store<ModuleTemplate>,
    /// Safety resync of a Runtime with nothing pending; `None`: none.
    pub(crate) resync: Option<Duration>,
    /// Migrations run around installs and upgrades.
    pub(crate) migrations: migration::Registry,
    /// Where reconciles read time (maintenance windows, retries).
    pub(crate) clock: Arc<dyn maintenance::Clock>,
    /// How much of a maintenance window must be left for a downtime upgrade to start.
    pub(crate) min_window_remaining: jiff::SignedDuration,
    /// Every MaintenancePolicy.
    pub(crate) policies: Store<fleetwatch_api::maintenance::MaintenancePolicy>,
    /// ModuleConfigPolicies ([`config_policy`]).
    pub(crate) config: config_policy::Shared,
    /// Counters.
    pub(crate) metrics: Arc<Metrics>,
    /// Per runtime: how many whole reconciles failed in a row ([`Ctx::next_backoff`]).
    pub(crate) backoff: std::sync::Mutex<std::collections::HashMap<String, u32>>,
    /// Paced rollouts of channel moves.
    pub(crate) rollouts: rollout::Rollouts,
    /// Every Runtime (sharded: spec and labels only), to size rollouts.
    pub(crate) fleet: Store<Runtime>,
    /// Per runtime: the fingerprint of the catalog last written into its cluster.
    pub(crate) catalogs: std::sync::Mutex<std::collections::HashMap<String, u64>>,
    /// What this instance knows of each runtime cluster's `Module` objects.
    pub(crate) chosen: crate::chosen::cluster::Known,
    /// Publishes Kubernetes Events on Runtimes.
    pub(crate) recorder: events::Recorder,
    /// The shards this instance holds, when sharded.
    pub(crate) shards: Option<Arc<shards::ShardMap>>,
    /// Told about each reconcile.
    pub(crate) observer: Option<Arc<dyn ReconcileObserver>>,
    /// Agent installation and certificates, when on.
    pub(crate) agent_certs: Option<agent_module::AgentCerts>,
    /// Pulled module artifacts, shared by every reconcile.
    pub(crate) artifacts: Arc<artifact::cache::Artifacts>,
    /// What changed in each runtime cluster since a module failed there ([`retry`]).
    pub(crate) changes: Arc<retry::ClusterChanges>,
}

impl Ctx {
    /// The next retry delay of a runtime whose reconcile failed as a whole (its cluster out of
    /// reach, its status not written): per runtime, so one broken cluster does not slow the
    /// others, with the modules' backoff ([`retry::delay`]: about 1 s doubling to 5 minutes).
    pub(crate) fn next_backoff(&self, key: &str) -> Duration {
        let attempt = self.backoff.lock().map(|mut b| {
            let a = b.entry(key.to_string()).or_insert(0);
            *a = a.saturating_add(1).min(64);
            *a
        });
        let failures = attempt.unwrap_or(1);
        retry::delay(failures, retry::jitter_of(key, failures, jiff::Timestamp::now().as_nanosecond()))
    }

    /// Forgets the failures of a runtime whose reconcile succeeded.
    pub(crate) fn reset_backoff(&self, key: &str) {
        if let Ok(mut b) = self.backoff.lock() {
            b.remove(key);
        }
    }
}
