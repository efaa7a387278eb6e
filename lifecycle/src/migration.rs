//! Migrations (rule 6): tested code that runs around a module's install or upgrade.
//!
//! Order: generic pre → the module's pre → apply → the module's post → generic post.
//! Each migration decides from cluster state whether it must run (`needed`), so it costs
//! one check when it is not, is timed and logged, and names the version after which it
//! can be removed from the code base.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use fleetwatch_api::ResourceRef;
use semver::Version;

use crate::Error;
use crate::applier::Applier;

/// A boxed future, so migrations can live behind `dyn`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Which upgrades a migration belongs to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Before / after any module's install or upgrade.
    Generic,
    /// Only around this module's.
    Module(String),
}

/// Before or after the module's resources are applied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Before applying.
    Pre,
    /// After applying.
    Post,
}

/// What a migration sees.
pub struct MigrationContext<'a> {
    /// The runtime cluster.
    pub cluster: &'a Applier,
    /// The module being installed or upgraded.
    pub module: &'a str,
    /// The version running before (none for an install).
    pub from: Option<&'a Version>,
    /// The version being installed.
    pub to: &'a Version,
    /// Where timings and counts go (optional).
    pub metrics: Option<&'a crate::Metrics>,
}

/// One migration.
pub trait Migration: Send + Sync {
    /// A unique name, for logs and status.
    fn name(&self) -> &str;
    /// Generic or module-specific.
    fn scope(&self) -> Scope;
    /// Before or after applying.
    fn phase(&self) -> Phase;
    /// The module version after which this code may be deleted.
    fn removable_after(&self) -> Version;
    /// Whether it must run, decided from cluster state.
    fn needed<'a>(&'a self, cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<bool, MigrationError>>;
    /// Does the work; must be idempotent.
    fn run<'a>(&'a self, cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<(), MigrationError>>;
}

/// Why a migration failed. The registry wraps it in [`Error::Migration`] with the
/// migration's name, the module and the target version.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// Reading or writing the runtime cluster failed.
    #[error(transparent)]
    Cluster(Box<Error>),
    /// The cluster is in a state the migration cannot handle (yet); the reason is for the
    /// runtime's owner, who sees it in the module's status.
    #[error("{0}")]
    NotPossible(String),
}

impl From<Error> for MigrationError {
    fn from(e: Error) -> Self {
        Self::Cluster(Box::new(e))
    }
}

/// What ran, for status and tests.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ran {
    /// Migration name.
    pub name: String,
    /// Whether it was needed (and so ran).
    pub ran: bool,
}

/// The registered migrations.
#[derive(Clone, Default)]
pub struct Registry {
    migrations: Vec<Arc<dyn Migration>>,
}

impl Registry {
    /// An empty registry.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a migration.
    pub fn register(mut self, m: impl Migration + 'static) -> Self {
        self.migrations.push(Arc::new(m));
        self
    }

    /// The migrations fleetwatch ships.
    pub fn builtin() -> Self {
        // The sample `redis` module renamed its settings ConfigMap in 2.0.0.
        Self::new().register(RenameResource {
            name: "redis-settings-renamed".into(),
            module: "redis".into(),
            since: Version::new(2, 0, 0),
            removable_after: Version::new(3, 0, 0),
            from: ResourceRef {
                api_version: "v1".into(),
                kind: "ConfigMap".into(),
                namespace: Some("redis-system".into()),
                name: "redis-settings".into(),
            },
            to_name: "redis-config".into(),
        })
    }

    fn select(&self, module: &str, phase: Phase, generic: bool) -> impl Iterator<Item = &Arc<dyn Migration>> {
        self.migrations.iter().filter(move |m| {
            m.phase() == phase
                && match m.scope() {
                    Scope::Generic => generic,
                    Scope::Module(name) => !generic && name == module,
                }
        })
    }

    /// Runs the pre-apply migrations: generic, then the module's.
    pub async fn pre(&self, cx: &MigrationContext<'_>) -> Result<Vec<Ran>, Error> {
        let list: Vec<_> = self
            .select(cx.module, Phase::Pre, true)
            .chain(self.select(cx.module, Phase::Pre, false))
            .cloned()
            .collect();
        run_all(&list, cx).await
    }

    /// Runs the post-apply migrations: the module's, then generic.
    pub async fn post(&self, cx: &MigrationContext<'_>) -> Result<Vec<Ran>, Error> {
        let list: Vec<_> = self
            .select(cx.module, Phase::Post, false)
            .chain(self.select(cx.module, Phase::Post, true))
            .cloned()
            .collect();
        run_all(&list, cx).await
    }
}

async fn run_all(list: &[Arc<dyn Migration>], cx: &MigrationContext<'_>) -> Result<Vec<Ran>, Error> {
    let mut out = Vec::new();
    let failed = |m: &Arc<dyn Migration>, source| Error::Migration {
        migration: m.name().into(),
        module: cx.module.into(),
        to: cx.to.clone(),
        source,
    };
    for m in list {
        if !m.needed(cx).await.map_err(|e| failed(m, e))? {
            out.push(Ran { name: m.name().into(), ran: false });
            continue;
        }
        let started = Instant::now();
        let result = m.run(cx).await;
        let took = started.elapsed();
        if let Some(metrics) = cx.metrics {
            metrics.migration_seconds.inc_by(took.as_secs_f64());
            if result.is_ok() { &metrics.migrations_run } else { &metrics.migrations_failed }.inc();
        }
        match &result {
            Ok(()) => tracing::info!(migration = m.name(), module = cx.module, to = %cx.to, ?took, "migration ran"),
            Err(e) => {
                tracing::warn!(migration = m.name(), module = cx.module, to = %cx.to, ?took, error = %e, "migration failed")
            }
        }
        result.map_err(|e| failed(m, e))?;
        out.push(Ran { name: m.name().into(), ran: true });
    }
    Ok(out)
}

/// A resource renamed between two versions: copy it to the new name (unless that exists),
/// then delete the old one. Runs before the upgrade to `since` or later.
pub struct RenameResource {
    /// Migration name.
    pub name: String,
    /// The module.
    pub module: String,
    /// The first version using the new name.
    pub since: Version,
    /// When this code can go.
    pub removable_after: Version,
    /// The old resource.
    pub from: ResourceRef,
    /// The new name (same kind and namespace).
    pub to_name: String,
}

impl Migration for RenameResource {
    fn name(&self) -> &str {
        &self.name
    }

    fn scope(&self) -> Scope {
        Scope::Module(self.module.clone())
    }

    fn phase(&self) -> Phase {
        Phase::Pre
    }

    fn removable_after(&self) -> Version {
        self.removable_after.clone()
    }

    fn needed<'a>(&'a self, cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<bool, MigrationError>> {
        Box::pin(async move { Ok(cx.to >= &self.since && cx.cluster.get(&self.from).await?.is_some()) })
    }

    fn run<'a>(&'a self, cx: &'a MigrationContext<'a>) -> BoxFuture<'a, Result<(), MigrationError>> {
        Box::pin(async move {
            let Some(old) = cx.cluster.get(&self.from).await? else { return Ok(()) };
            let to = ResourceRef { name: self.to_name.clone(), ..self.from.clone() };
            if cx.cluster.get(&to).await?.is_none() {
                let mut copy = serde_json::to_value(&old).map_err(|source| Error::Serialize {
                    what: format!("{} {}", self.from.kind, self.from.name),
                    source,
                })?;
                let md = &mut copy["metadata"];
                md["name"] = self.to_name.clone().into();
                for f in ["uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"] {
                    if let Some(m) = md.as_object_mut() {
                        m.remove(f);
                    }
                }
                cx.cluster.create_once(&copy).await?;
            }
            Ok(cx.cluster.delete(&self.from).await?)
        })
    }
}
