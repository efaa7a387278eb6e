//! The operator's Prometheus metrics, with [`prometheus_client`] as every component,
//! served as OpenMetrics on `--metrics-listen`'s `/metrics` ([`crate::health`]).
//!
//! Two kinds, as in the hub: instruments updated where things happen (reconciles,
//! failures, migrations, the duration histogram, reconciles in flight), and state read at
//! scrape time by a [`Collector`] (queue depth, shards held, modules by state, from what
//! the operator acts on), because keeping those current on every change would cost the
//! controller for a number read every few seconds. The names are a contract with
//! `deploy/observability/`, checked by a test against a running operator.

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_api::Runtime;
use fleetwatch_telemetry::collect::{gauge, gauges};
use kube::runtime::reflector::{ObjectRef, Store};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::shards;

/// Upper bounds of the reconcile duration histogram, in seconds.
const DURATION_BUCKETS: [f64; 12] = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0];

/// What the operator acts on, for the gauges read at scrape time; set while
/// [`crate::run`] acts.
pub(crate) struct View {
    pub(crate) runtimes: Store<Runtime>,
    pub(crate) shards: Option<Arc<shards::ShardMap>>,
    /// The queue of requested reconciles (hub events, rollout waves, shards taken).
    pub(crate) triggers: tokio::sync::mpsc::Sender<ObjectRef<Runtime>>,
}

/// Labels of `fleetwatch_lifecycle_modules`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ModuleState {
    module: String,
    state: String,
}

/// Labels of `fleetwatch_lifecycle_retries`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct RetryReason {
    reason: String,
}

/// Labels of `fleetwatch_lifecycle_module_config_invalid`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, PartialOrd, Ord, EncodeLabelSet)]
struct ModuleLabel {
    module: String,
}

/// The scrape-time gauges, read from the [`View`].
#[derive(Default)]
struct ViewCollector {
    view: Mutex<Option<View>>,
    /// The shards the Runtimes are split into (`--shards`; 1 unsharded), known once
    /// [`crate::run`] starts (0 before).
    shard_count: std::sync::atomic::AtomicU32,
}

impl std::fmt::Debug for ViewCollector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ViewCollector").finish_non_exhaustive()
    }
}

impl Collector for ViewCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let view = self.view.lock().ok();
        let view = view.as_ref().and_then(|v| v.as_ref());
        let depth = view.map_or(0, |v| v.triggers.max_capacity() - v.triggers.capacity());
        let held = match view {
            Some(View { shards: Some(map), .. }) => map.held().len(),
            Some(View { shards: None, .. }) => 1,
            None => 0,
        };
        let mut modules: BTreeMap<ModuleState, i64> = BTreeMap::new();
        let mut invalid: BTreeMap<ModuleLabel, i64> = BTreeMap::new();
        if let Some(v) = view {
            for rt in v.runtimes.state() {
                if v.shards.as_ref().is_some_and(|m| !m.owns(&rt)) {
                    continue;
                }
                for m in rt.status.iter().flat_map(|s| &s.modules) {
                    let bad = m.config.iter().flat_map(|c| &c.conditions);
                    if bad.filter(|c| c.type_ == "ConfigValid" && c.status == "False").count() > 0 {
                        *invalid.entry(ModuleLabel { module: m.name.clone() }).or_default() += 1;
                    }
                    *modules.entry(ModuleState { module: m.name.clone(), state: m.state.to_string() }).or_default() +=
                        1;
                }
            }
        }
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        gauge(
            &mut encoder,
            "queue_depth",
            "Requested reconciles (hub events, rollout waves, shards taken over) waiting to enter the controller",
            count(depth),
        )?;
        gauge(
            &mut encoder,
            "shards_held",
            "Shards this instance acts on (unsharded: 1 while it is the acting leader)",
            count(held),
        )?;
        // Not `shards_total`: a `_total` suffix marks a counter (OpenMetrics, promtool).
        gauge(
            &mut encoder,
            "shards",
            "Shards the Runtimes are split into (--shards; 1 unsharded): the shards held across instances should add up to it",
            i64::from(self.shard_count.load(std::sync::atomic::Ordering::Relaxed)),
        )?;
        gauge(
            &mut encoder,
            "runtimes_cached",
            "Runtimes this instance watches and caches in full (sharded: those of the shards it holds)",
            count(view.map_or(0, |v| v.runtimes.state().len())),
        )?;
        gauges(
            &mut encoder,
            "modules",
            "Modules of the Runtimes this instance acts on, by module and state (from the Runtime status)",
            modules.iter().map(|(l, n)| (l, *n)),
        )?;
        gauges(
            &mut encoder,
            "module_config_invalid",
            "Runtimes whose configuration of the module does not meet a ModuleConfigPolicy schema (from the Runtime status)",
            invalid.iter().map(|(l, n)| (l, *n)),
        )
    }
}

/// The expiry of the hub subscription's certificate, read at scrape time.
#[derive(Debug, Default)]
struct ClientCertificate {
    tls: std::sync::OnceLock<fleetwatch_client::client_tls::ClientTls>,
}

impl Collector for ClientCertificate {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(info) = self.tls.get().and_then(|t| t.certificate()) else { return Ok(()) };
        gauge(
            &mut encoder,
            "client_certificate_expiry_timestamp_seconds",
            "When the certificate the operator subscribes to the hub with expires (Unix time; renewed files are followed)",
            info.not_after.as_second(),
        )
    }
}

fleetwatch_telemetry::instruments! {
    /// Counters, read by benchmarks and logs, and served as Prometheus metrics
    /// (`--metrics-listen`). The names are a contract with `deploy/observability/`: one
    /// entry each, registered in this order (the exposition's), then the families read at
    /// scrape time.
    pub struct Metrics {
        /// Reconciles started.
        pub reconciles: Counter = Counter::default() => "reconciles", "Reconciles started";
        /// Reconciles that failed.
        pub failures: Counter = Counter::default() => "reconcile_failures", "Reconciles that failed";
        /// Migrations that ran.
        pub migrations_run: Counter = Counter::default() => "migrations", "Migrations that ran";
        /// Migrations that failed.
        pub migrations_failed: Counter = Counter::default() => "migration_failures", "Migrations that failed";
        /// Time spent in successful reconciles, in seconds.
        pub reconcile_seconds: Counter<f64, AtomicU64> = Counter::default()
            => "reconcile_seconds", "Time spent in successful reconciles";
        /// Time spent in migrations, in seconds.
        pub migration_seconds: Counter<f64, AtomicU64> = Counter::default()
            => "migration_seconds", "Time spent in migrations";
        /// How long reconciles took (every outcome, cancelled ones included), in seconds.
        pub reconcile_duration: Histogram = Histogram::new(DURATION_BUCKETS)
            => "reconcile_duration_seconds", "How long reconciles took, every outcome";
        /// Reconciles running now.
        pub in_flight: Gauge = Gauge::default() => "reconciles_in_flight", "Reconciles running now";
        /// Enforced configuration fields put back (ModuleConfigPolicy).
        pub config_enforced: Counter = Counter::default()
            => "config_enforcements", "Times enforced configuration fields were applied because they differed";
        /// Module configurations found invalid (each new set of errors counts once).
        pub config_invalid: Counter = Counter::default()
            => "config_invalid_found", "Times a module configuration was found invalid";
        /// Failed steps tried again, by the step that failed before.
        retries: Family<RetryReason, Counter> = Family::default()
            => "retries", "Failed steps of reconciles tried again (with backoff, or at once when the runtime cluster changed), by the step that failed: resolve, read, pull, migration, apply, default-config, delete, connect, certificate, status-write";
        /// The gauges read at scrape time from what the operator acts on.
        view: Arc<ViewCollector> = Arc::new(ViewCollector::default());
        /// The hub subscription certificate's expiry, read at scrape time.
        client_certificate: Arc<ClientCertificate> = Arc::default();
        /// Where they are registered, under the prefix `fleetwatch_lifecycle`.
        registry: Registry = Registry::default();
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("fleetwatch_lifecycle");
        let m = Self::unregistered();
        m.register(&mut registry);
        registry.register_collector(Box::new(m.view.clone()));
        registry.register_collector(Box::new(m.client_certificate.clone()));
        Self { registry, ..m }
    }
}

impl Metrics {
    /// The OpenMetrics text exposition, closed with `# EOF`.
    pub fn encode(&self) -> String {
        fleetwatch_telemetry::exposition::encode_component(&[&self.registry])
    }

    /// Counts a failed step tried again.
    pub(crate) fn retried(&self, step: fleetwatch_api::FailedStep) {
        self.retries.get_or_create(&RetryReason { reason: step.as_str().to_string() }).inc();
    }

    /// How often a failed `step` was tried again (tests).
    pub fn retries_of(&self, step: fleetwatch_api::FailedStep) -> u64 {
        self.retries.get_or_create(&RetryReason { reason: step.as_str().to_string() }).get()
    }

    /// Records the duration of a successful reconcile.
    pub(crate) fn record_duration(&self, d: Duration) {
        self.reconcile_seconds.inc_by(d.as_secs_f64());
    }

    /// The TLS settings of the hub subscription, for the certificate expiry gauge (the first
    /// one set stays).
    pub fn set_client_tls(&self, tls: fleetwatch_client::client_tls::ClientTls) {
        let _ = self.client_certificate.tls.set(tls);
    }

    /// Sets how many shards the Runtimes are split into (`fleetwatch_lifecycle_shards`).
    pub(crate) fn set_shard_count(&self, count: u32) {
        self.view.shard_count.store(count, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sets what the scrape-time gauges read (`None`: the operator stopped acting).
    pub(crate) fn set_view(&self, view: Option<View>) {
        if let Ok(mut v) = self.view.view.lock() {
            *v = view;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_family_is_served_from_the_start_as_openmetrics() {
        let m = Metrics::default();
        let text = m.encode();
        for line in [
            "# TYPE fleetwatch_lifecycle_reconciles counter",
            "fleetwatch_lifecycle_reconciles_total 0",
            "fleetwatch_lifecycle_reconcile_failures_total 0",
            "fleetwatch_lifecycle_migrations_total 0",
            "fleetwatch_lifecycle_migration_failures_total 0",
            "fleetwatch_lifecycle_reconcile_seconds_total 0.0",
            "fleetwatch_lifecycle_migration_seconds_total 0.0",
            "# TYPE fleetwatch_lifecycle_reconcile_duration_seconds histogram",
            "fleetwatch_lifecycle_reconcile_duration_seconds_bucket{le=\"+Inf\"} 0",
            "fleetwatch_lifecycle_reconciles_in_flight 0",
            "fleetwatch_lifecycle_queue_depth 0",
            "fleetwatch_lifecycle_shards_held 0",
            "fleetwatch_lifecycle_shards 0",
            "# TYPE fleetwatch_lifecycle_modules gauge",
            "# TYPE fleetwatch_lifecycle_module_config_invalid gauge",
            "fleetwatch_lifecycle_config_enforcements_total 0",
            "fleetwatch_lifecycle_config_invalid_found_total 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line:?} missing:\n{text}");
        }
        assert!(text.ends_with("# EOF\n"), "{text}");
        assert_eq!(text.matches("# EOF").count(), 1, "{text}");
    }

    #[test]
    fn the_subscription_certificate_expiry_is_served_once_known() {
        use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
        let m = Metrics::default();
        let name = "fleetwatch_lifecycle_client_certificate_expiry_timestamp_seconds";
        assert!(!m.encode().contains(name), "no subscription, no certificate");
        fleetwatch_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        Authority::init(dir.path(), "td").unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        let issued = ca.issue(dir.path(), &LeafSpec::Subscriber { name: "lifecycle".into() }, 1).unwrap();
        let files = TlsFiles { cert: issued.cert.clone(), key: issued.key, ca: vec![dir.path().join("ca.crt")] };
        m.set_client_tls(fleetwatch_client::client_tls::ClientTls::from_files(files).unwrap());
        let not_after = fleetwatch_certs::inspect_file(&issued.cert).unwrap().not_after.as_second();
        let text = m.encode();
        assert!(text.lines().any(|l| l == format!("{name} {not_after}")), "{text}");
        assert!(text.contains(&format!("# TYPE {name} gauge")), "{text}");
    }

    #[test]
    fn instruments_count() {
        let m = Metrics::default();
        m.reconciles.inc();
        m.failures.inc();
        m.record_duration(Duration::from_millis(1500));
        m.reconcile_duration.observe(0.02);
        m.reconcile_duration.observe(40.0);
        let text = m.encode();
        assert!(text.contains("fleetwatch_lifecycle_reconciles_total 1\n"), "{text}");
        assert!(text.contains("fleetwatch_lifecycle_reconcile_failures_total 1\n"), "{text}");
        assert!(text.contains("fleetwatch_lifecycle_reconcile_seconds_total 1.5\n"), "{text}");
        assert!(text.contains("fleetwatch_lifecycle_reconcile_duration_seconds_bucket{le=\"0.025\"} 1\n"), "{text}");
        assert!(text.contains("fleetwatch_lifecycle_reconcile_duration_seconds_bucket{le=\"30.0\"} 1\n"), "{text}");
        assert!(text.contains("fleetwatch_lifecycle_reconcile_duration_seconds_count 2\n"), "{text}");
    }
}
