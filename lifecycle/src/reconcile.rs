//! Reconciling one Runtime: each module installed, upgraded, protected from downgrades or
//! removed according to the rules, failures kept per module, status written.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::policy::{Step, desired_version, next_step, parse};
use fleetwatch_api::{
    CustomResourcePolicy, FailedStep, ModuleEntry, ModuleReason, ModuleReleaseMeta, ModuleStatus, ModuleTemplate,
    RolloutStatus, Runtime, RuntimeStatus, State,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::Instrument;

use crate::applier::Applier;
use crate::artifact::cache::{Cached, FetchError, MAX_RETRY, PullSecret};
use crate::{Ctx, Error};

mod status;
use status::{admit_recorded, publish_events, publish_note, recorded_rollout, write_rollouts, write_status};

/// The finalizer that makes deleting a Runtime remove its modules first.
pub const FINALIZER: &str = "operator.fleetwatch.dev/lifecycle";
/// The label carrying a module's running version on its manager workload.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";
/// How soon to look again while something is in progress.
pub(crate) const BUSY_REQUEUE: Duration = Duration::from_secs(2);
/// How often a runtime waiting for a maintenance window looks at the clock.
const WINDOW_POLL: Duration = Duration::from_secs(2);

/// What a module's reconcile asks of the runtime's next one.
#[derive(Default)]
struct Flags {
    /// The runtime's modules as known now (this reconcile's statuses of those done, else the
    /// last ones), for their dependents.
    known: Vec<ModuleStatus>,
    /// The modules the Runtime lists.
    listed: Vec<String>,
    /// Waiting for a rollout wave.
    waiting: bool,
    /// Waiting for a maintenance window that opens in this long.
    window: Option<std::time::Duration>,
    /// Waiting for a module artifact: look again in this long (its pull's backoff).
    pull: Option<std::time::Duration>,
}

impl Flags {
    fn pull_in(&mut self, d: Duration) {
        self.pull = Some(self.pull.map_or(d, |p| p.min(d)));
    }
}

/// A template's objects and default configuration: inline, or from its OCI artifact (the
/// objects parsed for this use only: the cache keeps them as JSON).
pub(crate) struct Content {
    template: Arc<ModuleTemplate>,
    artifact: Option<(Arc<Cached>, Vec<Value>)>,
}

impl Content {
    /// The objects, in apply order.
    fn objects(&self) -> &[Value] {
        match &self.artifact {
            Some((_, objects)) => objects,
            None => &self.template.spec.manifest,
        }
    }

    /// The template's default configuration, else the artifact's.
    fn default_config(&self) -> Option<&Value> {
        self.template.spec.default_config.as_ref().or_else(|| self.artifact.as_ref()?.0.default_config.as_ref())
    }

    /// What is applied: the objects, the manager annotated with the kinds they provide.
    fn to_apply(&self) -> std::borrow::Cow<'_, [Value]> {
        crate::provides::annotated(self.objects(), &self.template.spec.manager)
    }
}

/// The objects of `template`: inline, or its artifact from the caches or the registry. An
/// artifact whose annotations disagree with the template is refused (permanent).
async fn content(ctx: &Ctx, template: &Arc<ModuleTemplate>) -> Result<Content, FetchError> {
    let permanent = |message: String| FetchError {
        registry: String::new(),
        message,
        permanent: true,
        refused: false,
        retry_in: MAX_RETRY,
    };
    crate::usable::check_source(&template.spec)
        .map_err(|e| permanent(format!("ModuleTemplate {} is not usable: {e}", template.name_any())))?;
    let Some(oci) = template.spec.oci() else { return Ok(Content { template: template.clone(), artifact: None }) };
    let secret = oci.pull_secret.as_ref().map(|name| PullSecret {
        client: ctx.client.clone(),
        // Credentials live with the kubeconfigs when the operator keeps them apart: its
        // ServiceAccount reads Secrets nowhere else.
        namespace: ctx
            .clusters
            .kubeconfig_namespace()
            .map(str::to_string)
            .unwrap_or_else(|| template.namespace().unwrap_or_default()),
        name: name.clone(),
    });
    let artifact = ctx.artifacts.get(&oci.reference, secret).await.map_err(|mut e| {
        e.message = if e.permanent {
            format!("artifact {} refused: {}", oci.reference, e.message)
        } else {
            format!("waiting for artifact {}: {} (retrying with backoff)", oci.reference, e.message)
        };
        e
    })?;
    agrees(&template.spec, &artifact).map_err(|why| {
        permanent(format!("artifact {} does not match ModuleTemplate {}: {why}", oci.reference, template.name_any()))
    })?;
    let objects = artifact.objects().map_err(|e| permanent(format!("artifact {}: {e}", oci.reference)))?;
    Ok(Content { template: template.clone(), artifact: Some((artifact, objects)) })
}

/// Whether an artifact's annotations say what its template's spec says (name, version,
/// downtime, managed resources, manager); the first difference otherwise.
pub(crate) fn agrees(spec: &fleetwatch_api::ModuleTemplateSpec, a: &Cached) -> Result<(), String> {
    if a.name != spec.module_name {
        return Err(format!("module name is {} in the artifact, {} in spec.moduleName", a.name, spec.module_name));
    }
    let same_version = match (parse(&a.version), parse(&spec.version)) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.version == spec.version,
    };
    if !same_version {
        return Err(format!("version is {} in the artifact, {} in spec.version", a.version, spec.version));
    }
    if a.requires_downtime != spec.requires_downtime {
        return Err(format!(
            "requires-downtime is {} in the artifact, {} in spec.requiresDowntime",
            a.requires_downtime, spec.requires_downtime
        ));
    }
    let kinds = |v: &[fleetwatch_api::KindRef]| {
        let mut k: Vec<String> = v.iter().map(crate::artifact::kind_ref).collect();
        k.sort();
        k
    };
    if kinds(&a.managed_resources) != kinds(&spec.managed_resources) {
        return Err(format!(
            "managed resources are [{}] in the artifact, [{}] in spec.managedResources",
            kinds(&a.managed_resources).join(", "),
            kinds(&spec.managed_resources).join(", ")
        ));
    }
    let m = &spec.manager;
    if a.manager != *m {
        return Err(format!(
            "the manager is {} {}/{} in the artifact, {} {}/{} in spec.manager",
            a.manager.kind,
            a.manager.namespace.as_deref().unwrap_or_default(),
            a.manager.name,
            m.kind,
            m.namespace.as_deref().unwrap_or_default(),
            m.name
        ));
    }
    Ok(())
}

/// Reconciles one Runtime, inside a `reconcile` span naming the runtime and its cluster.
///
/// The span is attached to the future with `.instrument()`, not entered with a guard: a
/// guard held across an `.await` stays entered on the worker thread while this reconcile
/// is parked, so other tasks' log lines would carry this runtime's name.
///
/// The finalizer is kube-runtime's helper: it adds [`FINALIZER`] before the first apply and
/// removes it after a successful cleanup, each with a JSON patch whose `test` operation
/// makes it fail (and the reconcile retry) when someone else changed the finalizer list
/// meanwhile, instead of overwriting their change with a whole-list merge patch.
///
/// A sharded instance reconciles only Runtimes of shards it holds (others are skipped: their
/// holder does it, and taking a shard over triggers all of its Runtimes). A reconcile whose
/// shard is lost meanwhile is cancelled, and the shard is given up only after it ended.
pub async fn reconcile(rt: Arc<Runtime>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let ns = rt.namespace().unwrap_or_else(|| "default".into());
    let runtime = format!("{ns}/{}", rt.name_any());
    let entered = match &ctx.shards {
        Some(map) => match map.enter(&rt) {
            Some(e) => Some(e),
            None => return Ok(Action::await_change()),
        },
        None => None,
    };
    let _observed = ctx.observer.clone().map(|o| Observed::new(o, runtime.clone()));
    let _timed = Timed::new(ctx.metrics.clone());
    // `_observed` is dropped before `entered`: the observer hears of the end before the
    // shard can be given up.
    let work = reconcile_held(rt, ctx, ns, runtime);
    match &entered {
        None => work.await,
        Some(entered) => {
            tokio::select! {
                r = work => r,
                _ = entered.cancelled.cancelled() => {
                    tracing::info!("shard lost; reconcile cancelled");
                    Ok(Action::await_change())
                }
            }
        }
    }
}

/// Counts a reconcile in flight and records its duration when dropped (also when cancelled).
struct Timed {
    metrics: Arc<crate::Metrics>,
    started: std::time::Instant,
}

impl Timed {
    fn new(metrics: Arc<crate::Metrics>) -> Self {
        metrics.in_flight.inc();
        Self { metrics, started: std::time::Instant::now() }
    }
}

impl Drop for Timed {
    fn drop(&mut self) {
        self.metrics.in_flight.dec();
        self.metrics.reconcile_duration.observe(self.started.elapsed().as_secs_f64());
    }
}

/// Tells the observer that a reconcile ended when dropped (also when cancelled).
struct Observed {
    observer: Arc<dyn crate::ReconcileObserver>,
    runtime: String,
}

impl Observed {
    fn new(observer: Arc<dyn crate::ReconcileObserver>, runtime: String) -> Self {
        observer.started(&runtime);
        Self { observer, runtime }
    }
}

impl Drop for Observed {
    fn drop(&mut self) {
        self.observer.finished(&self.runtime);
    }
}

async fn reconcile_held(rt: Arc<Runtime>, ctx: Arc<Ctx>, ns: String, runtime: String) -> Result<Action, Error> {
    let span = tracing::info_span!("reconcile", runtime = %runtime, cluster = %rt.cluster_id());
    async move {
        ctx.metrics.reconciles.inc();
        let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &ns);
        let rt = fresh_until_finalized(&api, rt).await?;
        finalizer(&api, FINALIZER, rt, |event| async {
            match event {
                FinalizerEvent::Apply(rt) => apply(rt, &ctx).await,
                FinalizerEvent::Cleanup(rt) => cleanup(rt, &ctx).await,
            }
        })
        .await
        .map_err(|e| match e {
            // Our own errors come back as they were.
            finalizer::Error::ApplyFailed(e) | finalizer::Error::CleanupFailed(e) => e,
            other => Error::Finalizer { runtime, source: Box::new(other) },
        })
    }
    .instrument(span)
    .await
}

/// The Runtime as the API server has it now when the watched copy lacks our finalizer.
///
/// The finalizer helper adds it with a JSON patch that first tests the list it saw; right
/// after it was added, a reconcile triggered by something else (a ModuleReleaseMeta, a hub
/// event) still gets the watched copy without it, and the test failed with a 422 on every
/// start (a WARN and a retry). Reading the Runtime first costs one GET, only until the
/// finalizer is in place; a Runtime gone meanwhile needs nothing.
async fn fresh_until_finalized(api: &Api<Runtime>, rt: Arc<Runtime>) -> Result<Arc<Runtime>, Error> {
    if rt.finalizers().iter().any(|f| f == FINALIZER) || rt.metadata.deletion_timestamp.is_some() {
        return Ok(rt);
    }
    match api.get_opt(&rt.name_any()).await {
        Ok(Some(now)) => Ok(Arc::new(now)),
        Ok(None) => Ok(rt),
        Err(e) => Err(Error::Finalizer {
            runtime: format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any()),
            source: Box::new(finalizer::Error::<Error>::AddFinalizer(e)),
        }),
    }
}

/// The writer for the Runtime's cluster; when it is out of reach, every module's status says
/// so (those never reconciled too: an unreachable runtime is never "0/0 ready") and the
/// error is returned, so the reconcile backs off.
async fn reach(rt: &Runtime, ctx: &Ctx, api: &Api<Runtime>, previous: &[ModuleStatus]) -> Result<Arc<Applier>, Error> {
    match ctx.clusters.applier(rt).await {
        Ok(a) => Ok(a),
        Err(e) => {
            let mut modules: Vec<ModuleStatus> = previous
                .iter()
                .cloned()
                .map(|mut m| {
                    crate::config_policy::unreachable(&mut m, &e.to_string());
                    crate::retry::failed(m, FailedStep::Connect, e.to_string())
                })
                .collect();
            for entry in &rt.spec.modules {
                if !modules.iter().any(|m| m.name == entry.name) {
                    let m = ModuleStatus { name: entry.name.clone(), ..Default::default() };
                    modules.push(crate::retry::failed(m, FailedStep::Connect, e.to_string()));
                }
            }
            let key = format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any());
            schedule_retries(ctx, &key, previous, &mut modules);
            write_status(api, rt, modules).await?;
            Err(e)
        }
    }
}

/// The Runtime is being deleted: every module goes, with the policy it was installed under,
/// then the catalog. Only when all of that is done does this return `Ok`, and the finalizer
/// is removed; until then [`Error::CleanupPending`] keeps it (and the Runtime).
async fn cleanup(rt: Arc<Runtime>, ctx: &Ctx) -> Result<Action, Error> {
    let ns = rt.namespace().unwrap_or_else(|| "default".into());
    let key = format!("{ns}/{}", rt.name_any());
    let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &ns);
    let previous: Vec<ModuleStatus> = rt.status.as_ref().map(|s| s.modules.clone()).unwrap_or_default();
    let applier = reach(&rt, ctx, &api, &previous).await?;
    let all: Vec<&ModuleStatus> = previous.iter().collect();
    let mut statuses = remove_in_order(ctx, &applier, &ns, &all, &[]).await;
    if statuses.is_empty() {
        // The catalog goes with the Runtime; a failure is retried like any other.
        crate::catalog::remove(&applier).await?;
        if let Some(certs) = &ctx.agent_certs {
            // The agent went with the modules; its certificate goes too.
            crate::agent_module::remove_certificate(certs, &applier).await?;
        }
        if let Ok(mut c) = ctx.catalogs.lock() {
            c.remove(&key);
        }
        tracing::info!("all modules removed; runtime released");
        return Ok(Action::await_change());
    }
    let waiting = statuses.iter().map(|m| m.name.clone()).collect();
    // Failed removals come back with backoff; ones waiting for their resources soon.
    let retries = schedule_retries(ctx, &key, &previous, &mut statuses);
    retries.retried.iter().for_each(|step| ctx.metrics.retried(*step));
    let again = if statuses.iter().any(|m| m.state != State::Error) {
        BUSY_REQUEUE
    } else {
        retries.next.unwrap_or(BUSY_REQUEUE)
    };
    publish_events(ctx, &rt, &previous, &statuses).await;
    write_status(&api, &rt, statuses).await?;
    Err(Error::CleanupPending { runtime: key, modules: waiting, again })
}

/// Reconciles a Runtime that is not being deleted (the finalizer is in place).
async fn apply(rt: Arc<Runtime>, ctx: &Ctx) -> Result<Action, Error> {
    let rt = match &ctx.agent_certs {
        Some(_) => crate::agent_module::with_agent_module(rt),
        None => rt,
    };
    let name = rt.name_any();
    let ns = rt.namespace().unwrap_or_else(|| "default".into());
    let started = std::time::Instant::now();
    let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &ns);
    let previous: Vec<ModuleStatus> = rt.status.as_ref().map(|s| s.modules.clone()).unwrap_or_default();
    let applier = reach(&rt, ctx, &api, &previous).await?;
    let mut busy = false;
    let mut flags = Flags::default();
    let by_name: HashMap<&str, &ModuleStatus> = previous.iter().map(|m| (m.name.as_str(), m)).collect();
    // Modules after those they require ([`crate::requires`]): a dependency installed in this
    // reconcile comes first. Statuses are kept in the Runtime's order.
    flags.listed = rt.spec.modules.iter().map(|e| e.name.clone()).collect();
    flags.known = previous.clone();
    let mut done: Vec<Option<ModuleStatus>> = vec![None; rt.spec.modules.len()];
    for i in requires_order(ctx, &rt, &ns) {
        let entry = &rt.spec.modules[i];
        let prev = by_name.get(entry.name.as_str()).copied();
        // A dependency stays managed while an installed module requires it.
        let required_by = if entry.managed {
            Vec::new()
        } else {
            crate::requires::dependents(&entry.name, &installed_of(&flags.known), &ctx.templates.state(), &ns)
        };
        let st = if entry.managed {
            install(ctx, &applier, &rt, &ns, entry, prev, &mut flags).await
        } else if !required_by.is_empty() {
            let mut st = install(ctx, &applier, &rt, &ns, entry, prev, &mut flags).await;
            if st.state == State::Ready {
                st.state = State::Warning;
                st.message =
                    format!("not unmanaged yet: required by {} (managed until none is)", required_by.join(", "));
                st.reason = Some(ModuleReason::RequiredByOthers);
            }
            st
        } else {
            // `managed: false` only unmanages (as in lifecycle-manager): reconciling stops and
            // everything installed stays, whatever the deletion policy. Removing the entry is
            // what applies the policy.
            let mut known =
                prev.cloned().unwrap_or_else(|| ModuleStatus { name: entry.name.clone(), ..Default::default() });
            known.custom_resource_policy = entry.custom_resource_policy;
            let actual = actual_version(&applier, &known).await;
            let message = match &actual {
                Some(v) => format!("not managed by fleetwatch; {v} is installed"),
                None => "not managed by fleetwatch; nothing of it is installed".into(),
            };
            ModuleStatus {
                state: State::Unmanaged,
                message,
                actual_version: actual,
                // What fleetwatch knew stays: managing it again is not a fresh install
                // (a default configuration the user deleted is not recreated).
                ..known
            }
        };
        busy |= matches!(st.state, State::Processing | State::Deleting);
        flags.known.retain(|k| k.name != st.name);
        flags.known.push(st.clone());
        done[i] = Some(st);
    }
    let mut statuses: Vec<ModuleStatus> = done.into_iter().flatten().collect();
    // Modules whose entry is gone: remove them by the policy kept in status, dependents first;
    // one an installed module still requires waits for it.
    let gone: Vec<&ModuleStatus> = previous
        .iter()
        .filter(|p| !rt.spec.modules.iter().any(|e| e.name == p.name))
        .filter(|p| p.state != State::Unmanaged) // already let go
        .collect();
    let staying = installed_of(&statuses);
    for st in remove_in_order(ctx, &applier, &ns, &gone, &staying).await {
        busy |= st.state == State::Deleting;
        statuses.push(st);
    }
    crate::config_policy::enforce(ctx, &applier, &rt, &mut statuses, &previous).await;
    let key = format!("{ns}/{name}");
    // The catalog of what can be installed, kept in the runtime cluster (written on change).
    let catalog = crate::catalog::build(&ns, &ctx.metas.state(), &ctx.templates.state());
    let fp = crate::catalog::fingerprint(&catalog);
    if ctx.catalogs.lock().ok().and_then(|c| c.get(&key).copied()) != Some(fp) {
        match crate::catalog::write(&applier, &catalog).await {
            Ok(()) => {
                if let Ok(mut c) = ctx.catalogs.lock() {
                    c.insert(key.clone(), fp);
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot write the module catalog"),
        }
    }
    // The agent's certificate: issued, renewed at two thirds of its lifetime, and the
    // reconcile comes back at that moment. A failure shows on the agent module.
    let mut renew_in = None;
    if let Some(certs) = &ctx.agent_certs {
        match crate::agent_module::ensure_certificate(&ctx.client, certs, &rt, &applier).await {
            Ok(state) => {
                if state.issued {
                    let note = format!("agent certificate {} issued for cluster {}", state.serial, rt.cluster_id());
                    publish_note(ctx, &rt, crate::agent_module::MODULE, "AgentCertificateIssued", note).await;
                }
                renew_in = Some(state.renew_in);
            }
            Err(e) => {
                tracing::warn!(error = %e, "agent certificate not written");
                if let Some(st) = statuses.iter_mut().find(|m| m.name == crate::agent_module::MODULE) {
                    *st = crate::retry::failed(st.clone(), FailedStep::Certificate, e.to_string());
                }
            }
        }
    }
    // Failed modules come back with backoff (sooner when the cluster's events trigger them).
    let retries = schedule_retries(ctx, &key, &previous, &mut statuses);
    retries.retried.iter().for_each(|step| ctx.metrics.retried(*step));
    publish_events(ctx, &rt, &previous, &statuses).await;
    write_status(&api, &rt, statuses).await?;
    write_rollouts(ctx).await;
    ctx.metrics.record_duration(started.elapsed());
    ctx.reset_backoff(&key);
    let next = if busy {
        Some(BUSY_REQUEUE)
    } else if let Some(until) = flags.window {
        // Look again when the window opens (and now and then, in case the clock jumps).
        Some(until.clamp(Duration::from_secs(1), Duration::from_secs(60)).min(WINDOW_POLL))
    } else if flags.waiting {
        // Woken when its wave opens; this is only the safety net.
        Some(Duration::from_secs(10))
    } else {
        ctx.resync
    };
    // Back when a module's artifact is due to be pulled again, or a failed module retried.
    let next = [next, flags.pull, retries.next].into_iter().flatten().min();
    // Back in time to renew the agent's certificate, whatever else is pending.
    let next = match (next, renew_in) {
        (Some(a), Some(b)) => Some(a.min(b)),
        (a, b) => a.or(b),
    };
    Ok(next.map(Action::requeue).unwrap_or_else(Action::await_change))
}

async fn actual_version(applier: &Applier, st: &ModuleStatus) -> Option<String> {
    let manager = st.resources.iter().find(|r| r.kind == "Deployment")?;
    let d = applier.get(manager).await.ok()??;
    d.labels().get(VERSION_LABEL).cloned()
}

fn find_meta<'a>(metas: &'a [Arc<ModuleReleaseMeta>], ns: &str, module: &str) -> Option<&'a ModuleReleaseMeta> {
    metas.iter().find(|m| m.spec.module_name == module && m.namespace().as_deref() == Some(ns)).map(|m| m.as_ref())
}

fn find_template(
    templates: &[Arc<ModuleTemplate>],
    ns: &str,
    module: &str,
    version: &semver::Version,
) -> Option<Arc<ModuleTemplate>> {
    templates
        .iter()
        .find(|t| {
            t.spec.module_name == module
                && t.namespace().as_deref() == Some(ns)
                && parse(&t.spec.version).is_ok_and(|v| &v == version)
        })
        .cloned()
}

/// Installs, upgrades or keeps one module; never fails: problems become its state. Sets
/// `retry` when the problem should be retried with backoff (a failed migration).
async fn install(
    ctx: &Ctx,
    applier: &Applier,
    rt: &Runtime,
    ns: &str,
    entry: &ModuleEntry,
    prev: Option<&ModuleStatus>,
    flags: &mut Flags,
) -> ModuleStatus {
    let runtime = format!("{ns}/{}", rt.name_any());
    if let Some(p) = prev
        && held_back(ctx, rt, &runtime, ns, entry, p)
    {
        tracing::debug!(module = %entry.name, "failed step not due yet; nothing changed that could unblock it");
        return p.clone();
    }
    let st = install_inner(ctx, applier, rt, ns, entry, prev, flags).await;
    if st.state == State::Error {
        ctx.changes.failed(&runtime, &rt.cluster_id(), &entry.name);
    } else {
        ctx.changes.recovered(&runtime, &entry.name);
    }
    // Tell a paced rollout how an admitted upgrade ended.
    if let (Some(meta), Some(desired)) = (
        find_meta(&ctx.metas.state(), ns, &entry.name).cloned(),
        st.desired_version.as_deref().and_then(|v| parse(v).ok()),
    ) && let Some(policy) = &meta.spec.rollout
        && !flags.waiting
    {
        let name = rt.name_any();
        let recorded = recorded_rollout(&meta, &desired);
        match st.state {
            State::Ready if st.installed_version.as_deref() == Some(desired.to_string().as_str()) => {
                ctx.rollouts.report(ns, &entry.name, &desired, &name, true, policy, recorded)
            }
            State::Error => ctx.rollouts.report(ns, &entry.name, &desired, &name, false, policy, recorded),
            _ => {}
        }
    }
    st
}

/// Whether a module that failed a step touching its cluster waits for its next attempt in
/// this reconcile: not due yet, and nothing happened since it failed that could unblock it —
/// no spec change of the Runtime, no other desired version, no Namespace, CRD or module
/// inventory change in its cluster ([`crate::retry::ClusterChanges`]). Other reconciles of
/// the Runtime (a sibling in progress, a busy cluster's unrelated events) then leave it alone,
/// so its backoff holds.
fn held_back(ctx: &Ctx, rt: &Runtime, runtime: &str, ns: &str, entry: &ModuleEntry, p: &ModuleStatus) -> bool {
    let Some(r) = p.retry.as_ref().filter(|_| p.state == State::Error) else { return false };
    if !crate::retry::held_back(r.step) {
        return false;
    }
    let due = r.next_attempt.parse::<jiff::Timestamp>().map_or(true, |at| at <= ctx.clock.now());
    let spec_changed = rt.status.as_ref().and_then(|s| s.observed_generation) != rt.metadata.generation;
    let metas = ctx.metas.state();
    let desired =
        desired_version(entry, rt.spec.channel.as_deref(), find_meta(&metas, ns, &entry.name).map(|m| &m.spec))
            .ok()
            .map(|(v, _)| v.to_string());
    !due && !spec_changed && desired == p.desired_version && !ctx.changes.moved(runtime, &rt.cluster_id(), &entry.name)
}

/// How many runtimes of the namespace want `version` of `module` through their channel.
fn affected(ctx: &Ctx, ns: &str, module: &str, version: &semver::Version, metas: &[Arc<ModuleReleaseMeta>]) -> u32 {
    let meta = find_meta(metas, ns, module).map(|m| &m.spec);
    ctx.fleet
        .state()
        .iter()
        .filter(|r| r.namespace().as_deref() == Some(ns))
        .filter(|r| {
            r.spec.modules.iter().any(|e| {
                e.name == module
                    && e.managed
                    && e.version.is_none()
                    && desired_version(e, r.spec.channel.as_deref(), meta).is_ok_and(|(v, _)| &v == version)
            })
        })
        .count() as u32
}

async fn install_inner(
    ctx: &Ctx,
    applier: &Applier,
    rt: &Runtime,
    ns: &str,
    entry: &ModuleEntry,
    prev: Option<&ModuleStatus>,
    flags: &mut Flags,
) -> ModuleStatus {
    let mut st = prev.cloned().unwrap_or_else(|| ModuleStatus { name: entry.name.clone(), ..Default::default() });
    st.custom_resource_policy = entry.custom_resource_policy;
    // Whatever held it last time is decided anew.
    st.reason = None;
    let metas = ctx.metas.state();
    let (desired, channel) =
        match desired_version(entry, rt.spec.channel.as_deref(), find_meta(&metas, ns, &entry.name).map(|m| &m.spec)) {
            Ok(v) => v,
            Err(e) => return failed(st, FailedStep::Resolve, e.to_string()),
        };
    st.channel = channel;
    st.desired_version = Some(desired.to_string());
    let Some(template) = find_template(&ctx.templates.state(), ns, &entry.name, &desired) else {
        return failed(
            st,
            FailedStep::Resolve,
            format!("no ModuleTemplate for {} {desired} in namespace {ns}", entry.name),
        );
    };
    let manager = template.spec.manager.clone();
    let running = match applier.get(&manager).await {
        Ok(d) => d.and_then(|d| d.labels().get(VERSION_LABEL).cloned()),
        Err(e) => return failed(st, FailedStep::Read, e.to_string()),
    };
    st.actual_version = running.clone();
    let actual = running.as_deref().and_then(|v| parse(v).ok());
    let step = next_step(actual.as_ref(), &desired);
    if let Step::RefuseDowngrade { from } = &step {
        // Rule 2: never downgrade what runs; say so once, no error loop.
        let mut st = fail(st, State::Warning, format!("downgrade from {from} to {desired} not applied"));
        st.reason = Some(ModuleReason::DowngradeRefused);
        return st;
    }
    // Dependencies: an install or upgrade waits until what its version requires is Ready.
    if !template.spec.requires.is_empty() {
        if let Err(why) = crate::requires::judge(&template, &ctx.templates.state(), &metas) {
            let message = format!("ModuleTemplate {} is not usable: {why}", template.name_any());
            return failed(st, FailedStep::Resolve, message);
        }
        if matches!(step, Step::Install | Step::Upgrade { .. }) {
            let listed: Vec<&str> = flags.listed.iter().map(String::as_str).collect();
            if let Some(unmet) = crate::requires::unmet(&template.spec.requires, &flags.known, &listed) {
                let state = if unmet.listed { State::Processing } else { State::Warning };
                let mut st = fail(st, state, format!("{} {desired} {}", entry.name, unmet.message));
                st.reason = Some(ModuleReason::WaitingForDependency);
                return st;
            }
        }
    }
    // Paced rollouts: an upgrade that a channel move caused waits for its wave.
    let rollout = match (&step, &entry.version) {
        (Step::Upgrade { .. }, None) => find_meta(&metas, ns, &entry.name).and_then(|m| m.spec.rollout.clone()),
        _ => None,
    };
    if let Some(policy) = &rollout {
        let total = affected(ctx, ns, &entry.name, &desired, &metas);
        // The admission is recorded before the upgrade starts: an instance taking over
        // counts this runtime as in flight. Not recorded, not started (it is retried).
        let why = match admit_recorded(ctx, ns, &entry.name, &desired, policy, rt, total).await {
            crate::rollout::UpgradeGate::Wait(why) => Some(why),
            crate::rollout::UpgradeGate::Go => None,
        };
        if let Some(why) = why {
            // The current version keeps running and being what status reports.
            flags.waiting = true;
            st.state = if prev.is_some_and(|p| p.state == State::Ready) { State::Ready } else { State::Processing };
            st.message = why;
            st.reason = Some(ModuleReason::WaitingForRollout);
            return st;
        }
    }
    // Rule 3: an upgrade needing downtime waits for a maintenance window; meanwhile the
    // current version keeps being reconciled (drift repaired).
    st.next_maintenance_window = None;
    if let (Step::Upgrade { from }, true) = (&step, template.spec.requires_downtime) {
        let now = ctx.clock.now();
        match crate::maintenance::gate(rt, &ctx.policies, now, ctx.min_window_remaining) {
            crate::maintenance::Gate::Open => {}
            crate::maintenance::Gate::Wait(w) => {
                flags.window = Some(w.begin.duration_since(now).unsigned_abs());
                st.next_maintenance_window = Some(format!("{}/{}", w.begin, w.end));
                let mut st = keep_current(
                    applier,
                    ns,
                    ctx,
                    entry,
                    st,
                    from,
                    format!("upgrade to {desired} waits for the maintenance window {} – {}", w.begin, w.end),
                )
                .await;
                if st.state != State::Error {
                    st.reason = Some(ModuleReason::WaitingForMaintenanceWindow);
                }
                return st;
            }
            crate::maintenance::Gate::Never(why) => {
                let message = format!("upgrade to {desired} needs downtime but no maintenance window: {why}");
                return hold(applier, ns, ctx, entry, st, from, message).await;
            }
            crate::maintenance::Gate::Broken(why) => {
                // Fail closed: no downtime upgrade while the policy is missing or invalid.
                // Policy edits do not trigger reconciles, so look again now and then.
                flags.window = Some(Duration::from_secs(60));
                return hold(applier, ns, ctx, entry, st, from, format!("upgrade to {desired} held: {why}")).await;
            }
        }
    }
    // The objects: inline, or the artifact (cached, else pulled). One that cannot be had
    // changes nothing in the cluster: the running version keeps being reconciled.
    let content = match content(ctx, &template).await {
        Ok(c) => c,
        Err(e) => {
            flags.pull_in(e.retry_in);
            let state = if e.permanent { State::Error } else { State::Warning };
            let before = (st.state, st.message.clone());
            let (mut st, message) = match &step {
                Step::Upgrade { from } => {
                    let st = keep_current(applier, ns, ctx, entry, st, from, e.message.clone()).await;
                    if st.state == State::Error && !st.message.starts_with(&e.message) {
                        return st; // repairing the running version failed: that is what shows
                    }
                    let message = st.message.clone();
                    (st, message)
                }
                _ => (st, e.message),
            };
            (st.state, st.message) = before;
            let mut st = if e.permanent { failed(st, FailedStep::Pull, message) } else { fail(st, state, message) };
            st.reason = (!e.permanent).then_some(ModuleReason::WaitingForArtifact);
            return st;
        }
    };
    // Rule 6: migrations run around installs and upgrades only, not when keeping a version.
    let migrating = matches!(step, Step::Install | Step::Upgrade { .. });
    let cx = crate::migration::MigrationContext {
        cluster: applier,
        module: &entry.name,
        from: actual.as_ref(),
        to: &desired,
        metrics: Some(&ctx.metrics),
    };
    if migrating && let Err(e) = ctx.migrations.pre(&cx).await {
        return failed(st, FailedStep::Migration, format!("upgrade of {} to {desired} stopped: {e}", entry.name));
    }
    let mut resources = Vec::new();
    // The manager declares the kinds the module provides (its CRDs), for the agent.
    for obj in content.to_apply().iter() {
        match applier.apply(obj).await {
            Ok(r) => resources.push(r),
            Err(e) => return failed(st, FailedStep::Apply, format!("installing {} {desired}: {e}", entry.name)),
        }
    }
    if migrating && let Err(e) = ctx.migrations.post(&cx).await {
        return failed(st, FailedStep::Migration, format!("after upgrading {} to {desired}: {e}", entry.name));
    }
    st.resources = resources;
    st.installed_version = Some(desired.to_string());
    st.managed_resources = template.spec.managed_resources.clone();
    // Rule 4: the default configuration is created once and never recreated or overwritten.
    if let Some(cfg) = content.default_config() {
        match Applier::reference(cfg) {
            Ok(r) => st.default_config = Some(r),
            Err(e) => return failed(st, FailedStep::DefaultConfig, e.to_string()),
        }
        // The cached Runtime may predate the status write that recorded an earlier creation
        // (a busy API server or watch): ask the API server before creating, so a
        // configuration the user deleted meanwhile is not created again.
        if !st.default_config_created && created_before(ctx, rt, &entry.name).await {
            st.default_config_created = true;
        }
        if !st.default_config_created {
            match applier.create_once(cfg).await {
                Ok((_, created)) => {
                    st.default_config_created = true;
                    if created {
                        tracing::info!(module = %entry.name, "default configuration created");
                    }
                }
                Err(e) => return failed(st, FailedStep::DefaultConfig, format!("creating default configuration: {e}")),
            }
        }
    }
    // Ready once the manager runs the desired version and is available.
    let (state, message) = match applier.get(&manager).await {
        Ok(Some(d)) => {
            let v = d.labels().get(VERSION_LABEL).cloned();
            st.actual_version = v.clone();
            if v.as_deref().and_then(|v| parse(v).ok()).as_ref() != Some(&desired) {
                (State::Processing, format!("manager runs {:?}, waiting for {desired}", v))
            } else if let Some(waiting) = manager_rollout_pending(&d) {
                (State::Processing, waiting)
            } else {
                (State::Ready, String::new())
            }
        }
        Ok(None) => {
            let message = format!("manager {} {} not found after install", manager.kind, manager.name);
            return failed(st, FailedStep::Read, message);
        }
        Err(e) => return failed(st, FailedStep::Read, e.to_string()),
    };
    st.reason = (state == State::Processing).then_some(ModuleReason::WaitingForManager);
    st.state = state;
    st.message = message;
    st
}

/// Keeps (and repairs) the running version while an upgrade waits.
/// Whether the Runtime's current status (read from the API server, not the cache) records
/// module `module`'s default configuration as created. A failed read answers `false`: the
/// caller then creates the configuration once, as it did from the cached status alone.
async fn created_before(ctx: &Ctx, rt: &Runtime, module: &str) -> bool {
    let ns = rt.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &ns);
    match api.get_status(&rt.name_any()).await {
        Ok(fresh) => fresh
            .status
            .as_ref()
            .is_some_and(|s| s.modules.iter().any(|m| m.name == module && m.default_config_created)),
        Err(e) => {
            tracing::debug!(%module, "cannot read the Runtime's current status: {e}");
            false
        }
    }
}

async fn keep_current(
    applier: &Applier,
    ns: &str,
    ctx: &Ctx,
    entry: &ModuleEntry,
    mut st: ModuleStatus,
    running: &semver::Version,
    message: String,
) -> ModuleStatus {
    let mut message = message;
    if let Some(current) = find_template(&ctx.templates.state(), ns, &entry.name, running) {
        match content(ctx, &current).await {
            Ok(c) => {
                for obj in c.to_apply().iter() {
                    if let Err(e) = applier.apply(obj).await {
                        return failed(st, FailedStep::Apply, format!("repairing {} {running}: {e}", entry.name));
                    }
                }
            }
            // Nothing to repair with: what runs stays as it is.
            Err(e) => message = format!("{message}; {running} not repaired: {}", e.message),
        }
    }
    st.state = State::Ready;
    st.message = message;
    st
}

/// An upgrade that cannot happen (no window, a missing or invalid policy): the running
/// version keeps being reconciled and the module is a `Warning` with the reason, unless
/// repairing the current version itself failed (then that error is what it shows).
async fn hold(
    applier: &Applier,
    ns: &str,
    ctx: &Ctx,
    entry: &ModuleEntry,
    st: ModuleStatus,
    running: &semver::Version,
    message: String,
) -> ModuleStatus {
    let before = (st.state, st.message.clone());
    let mut st = keep_current(applier, ns, ctx, entry, st, running, message).await;
    if st.state != State::Error {
        if before != (State::Warning, st.message.clone()) {
            tracing::warn!(module = %st.name, message = %st.message, "upgrade held");
        }
        st.state = State::Warning;
        st.reason = Some(ModuleReason::UpgradeHeld);
    }
    st
}

/// A module failing at `step`: `Error` with the message, retried with backoff
/// ([`crate::retry`]).
fn failed(st: ModuleStatus, step: FailedStep, message: String) -> ModuleStatus {
    if st.state != State::Error || st.message != message {
        tracing::warn!(module = %st.name, %step, %message, "module failed; retrying with backoff");
    }
    crate::retry::failed(st, step, message)
}

fn fail(mut st: ModuleStatus, state: State, message: String) -> ModuleStatus {
    if st.state != state || st.message != message {
        tracing::warn!(module = %st.name, %state, %message, "module not ready");
    }
    st.state = state;
    st.message = message;
    st
}

/// [`crate::retry::schedule`] on the operator's clock, each module's jitter from
/// `runtime/module`.
fn schedule_retries(
    ctx: &Ctx,
    runtime: &str,
    previous: &[ModuleStatus],
    statuses: &mut [ModuleStatus],
) -> crate::retry::Scheduled {
    let now = ctx.clock.now();
    crate::retry::schedule(previous, statuses, now, |m, n| {
        crate::retry::jitter_of(&format!("{runtime}/{m}"), n, now.as_nanosecond())
    })
}

/// Each module's installed version, for [`crate::requires::dependents`].
fn installed_of(statuses: &[ModuleStatus]) -> Vec<(String, String)> {
    statuses
        .iter()
        .filter(|m| m.state != State::Unmanaged)
        .filter_map(|m| Some((m.name.clone(), m.installed_version.clone()?)))
        .collect()
}

/// The order the Runtime's modules are reconciled in: each after the modules its desired
/// version requires (indices into `spec.modules`).
fn requires_order(ctx: &Ctx, rt: &Runtime, ns: &str) -> Vec<usize> {
    let metas = ctx.metas.state();
    let templates = ctx.templates.state();
    let graph: Vec<(String, Vec<String>)> = rt
        .spec
        .modules
        .iter()
        .map(|e| {
            let meta = find_meta(&metas, ns, &e.name).map(|m| &m.spec);
            let requires = desired_version(e, rt.spec.channel.as_deref(), meta)
                .ok()
                .and_then(|(v, _)| find_template(&templates, ns, &e.name, &v))
                .map(|t| t.spec.requires.iter().map(|r| r.module.clone()).collect())
                .unwrap_or_default();
            (e.name.clone(), requires)
        })
        .collect();
    crate::requires::order(&graph)
}

/// Removes `pending` modules by their policy, those that require others first; a module
/// that an installed one still requires (`staying`, or one of `pending` not gone yet) waits
/// with reason `RequiredByOthers`. The statuses of those not gone yet.
async fn remove_in_order(
    ctx: &Ctx,
    applier: &Applier,
    ns: &str,
    pending: &[&ModuleStatus],
    staying: &[(String, String)],
) -> Vec<ModuleStatus> {
    let templates = ctx.templates.state();
    let graph: Vec<(String, Vec<String>)> = pending
        .iter()
        .map(|p| {
            let requires = p
                .installed_version
                .as_deref()
                .and_then(|v| crate::requires::template_of(&templates, ns, &p.name, v))
                .map(|t| t.spec.requires.iter().map(|r| r.module.clone()).collect())
                .unwrap_or_default();
            (p.name.clone(), requires)
        })
        .collect();
    // Dependents before what they require: the dependency order, reversed.
    let mut left: Vec<&ModuleStatus> = pending.to_vec();
    let mut out = Vec::new();
    for i in crate::requires::order(&graph).into_iter().rev() {
        let prev = pending[i];
        let mut installed = staying.to_vec();
        installed.extend(installed_of(&left.iter().map(|p| (*p).clone()).collect::<Vec<_>>()));
        let blocking = crate::requires::dependents(&prev.name, &installed, &templates, ns);
        if prev.custom_resource_policy == CustomResourcePolicy::CreateAndDelete && !blocking.is_empty() {
            let mut st = prev.clone();
            st.state = State::Deleting;
            st.reason = Some(ModuleReason::RequiredByOthers);
            st.message = format!("removal waits: required by {}", blocking.join(", "));
            out.push(st);
            continue;
        }
        match remove(applier, prev).await {
            Some(st) => out.push(st),
            None => left.retain(|p| p.name != prev.name),
        }
    }
    // In the order they were given.
    out.sort_by_key(|st| pending.iter().position(|p| p.name == st.name));
    out
}

/// Rule 5. `None` when the module is gone (or let go); otherwise its status while waiting.
async fn remove(applier: &Applier, prev: &ModuleStatus) -> Option<ModuleStatus> {
    match prev.custom_resource_policy {
        CustomResourcePolicy::Ignore => {
            tracing::info!(module = %prev.name, "removed with Ignore: left installed, no longer reconciled");
            None
        }
        CustomResourcePolicy::CreateAndDelete => {
            let mut st = prev.clone();
            st.reason = None;
            if let Some(cfg) = &prev.default_config
                && let Err(e) = applier.delete(cfg).await
            {
                return Some(failed(st, FailedStep::Delete, format!("deleting default configuration: {e}")));
            }
            let mut blocking = Vec::new();
            for kind in &prev.managed_resources {
                match applier.count(kind).await {
                    Ok(0) => {}
                    Ok(n) => blocking.push(format!("{n} {}", kind.kind)),
                    Err(e) => return Some(failed(st, FailedStep::Delete, e.to_string())),
                }
            }
            if !blocking.is_empty() {
                st.state = State::Deleting;
                st.message = format!("waiting for managed resources to be deleted: {}", blocking.join(", "));
                st.reason = Some(ModuleReason::DeletionBlocked);
                return Some(st);
            }
            for r in prev.resources.iter().rev() {
                if let Err(e) = applier.delete(r).await {
                    return Some(failed(st, FailedStep::Delete, format!("deleting {}: {e}", r.name)));
                }
            }
            tracing::info!(module = %prev.name, "module deleted");
            None
        }
    }
}

/// Why the manager has not finished rolling out its current spec, or `None` once it has.
///
/// Like `kubectl rollout status`: the controller must have observed the latest generation
/// (otherwise the replica counts still describe the previous spec, and an upgrade would
/// count as done the moment its manifest was applied), and the updated and ready replicas
/// must reach the desired count. Kinds that track no generation are judged by replicas.
fn manager_rollout_pending(d: &kube::api::DynamicObject) -> Option<String> {
    let want = d.data["spec"]["replicas"].as_i64().unwrap_or(1);
    let status = &d.data["status"];
    if let Some(generation) = d.metadata.generation {
        let observed = status["observedGeneration"].as_i64().unwrap_or(0);
        if observed < generation {
            return Some(format!("waiting for manager: generation {generation} not yet observed ({observed})"));
        }
        let updated = status["updatedReplicas"].as_i64().unwrap_or(0);
        if updated < want {
            return Some(format!("waiting for manager: {updated}/{want} replicas updated"));
        }
    }
    let ready = status["readyReplicas"].as_i64().unwrap_or(0);
    (ready < want).then(|| format!("waiting for manager: {ready}/{want} replicas ready"))
}

#[cfg(test)]
mod tests;
