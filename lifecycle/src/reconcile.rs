//! Reconciling one Runtime: each module installed, upgraded, protected from downgrades or
//! removed according to the rules, failures kept per module, status written.
//!
//! This module carries decisions out; it does not make them. For each module it gathers what
//! the rules read (the stores, the clock, the version the manager runs, the other modules'
//! statuses), asks [`crate::plan`] what to do (the desired version, downgrade protection,
//! dependencies, the rollout and maintenance gates, deletion, when to look again), and does
//! it against the runtime cluster and the control plane.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::policy::{Step, parse};
use fleetwatch_api::{
    FailedStep, ModuleEntry, ModuleReason, ModuleReleaseMeta, ModuleStatus, ModuleTemplate, RolloutStatus, Runtime,
    RuntimeStatus, State,
};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::controller::Action;
use kube::runtime::finalizer::{self, Event as FinalizerEvent, finalizer};
use kube::{Resource, ResourceExt};
use serde_json::{Value, json};
use tracing::Instrument;

use crate::applier::Applier;
use crate::artifact::cache::{Cached, FetchError, MAX_RETRY, PullSecret};
use crate::plan::{self, BUSY_REQUEUE, Decision, Inputs, Stores, Window, find_meta, find_template};
use crate::{Ctx, Error};

mod status;
use status::{Admission, admit_recorded, publish_events, publish_note, recorded_rollout, write_rollouts, write_status};

/// The finalizer that makes deleting a Runtime remove its modules first.
pub const FINALIZER: &str = "operator.fleetwatch.dev/lifecycle";
/// The label carrying a module's running version on its manager workload.
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";

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
        // The catalog and the Module kind go with the Runtime; a failure is retried like any other.
        crate::catalog::remove(&applier).await?;
        crate::chosen::cluster::release(&ctx.chosen, &key, &applier).await?;
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
    let mut previous: Vec<ModuleStatus> = rt.status.as_ref().map(|s| s.modules.clone()).unwrap_or_default();
    let applier = reach(&rt, ctx, &api, &previous).await?;
    let key = format!("{ns}/{name}");
    // The modules the cluster's users chose ([`crate::chosen`]), read from the cluster itself,
    // reconciled after the Runtime's own.
    // When they cannot be read, the users' modules are left as they are (never taken for
    // "none chosen", which would remove them) and say why; the Runtime's own go on.
    let (objects, merged) = match crate::chosen::cluster::gather(&ctx.chosen, &key, &applier, &previous).await {
        Ok(objects) => {
            let merged = crate::chosen::merge(&rt, &ns, &objects, &ctx.metas.state(), &previous);
            (Some(objects), merged)
        }
        Err(e) => {
            tracing::warn!(error = %e, "cannot read the cluster's Module objects; the modules its users chose are left as they are");
            (None, crate::chosen::Merged::unread(&rt, &previous, &e.to_string()))
        }
    };
    for p in previous.iter_mut() {
        // A user's object deleted: its module goes by the object's policy.
        if let Some(policy) = merged.removal.get(&p.name) {
            p.custom_resource_policy = *policy;
        }
    }
    let rt = merged.runtime(rt);
    let mut busy = false;
    let mut flags = Flags::default();
    let by_name: HashMap<&str, &ModuleStatus> = previous.iter().map(|m| (m.name.as_str(), m)).collect();
    // Modules after those they require ([`crate::requires`]): a dependency installed in this
    // reconcile comes first. Statuses are kept in the Runtime's order.
    flags.listed = rt.spec.modules.iter().map(|e| e.name.clone()).collect();
    flags.known = previous.clone();
    let mut done: Vec<Option<ModuleStatus>> = vec![None; rt.spec.modules.len()];
    let order = {
        let (templates, metas) = (ctx.templates.state(), ctx.metas.state());
        plan::order(&rt, &Stores { ns: &ns, templates: &templates, metas: &metas, policies: &[] })
    };
    for i in order {
        let entry = &rt.spec.modules[i];
        let prev = by_name.get(entry.name.as_str()).copied();
        let management = {
            let templates = ctx.templates.state();
            plan::management(entry, &flags.known, &Stores { ns: &ns, templates: &templates, metas: &[], policies: &[] })
        };
        let st = match management {
            plan::Management::Manage => install(ctx, &applier, &rt, &ns, entry, prev, &mut flags).await,
            plan::Management::StillRequired(required_by) => {
                let mut st = install(ctx, &applier, &rt, &ns, entry, prev, &mut flags).await;
                if st.state == State::Ready {
                    st.state = State::Warning;
                    st.message = plan::still_required_message(&required_by);
                    st.reason = Some(ModuleReason::RequiredByOthers);
                }
                st
            }
            plan::Management::Unmanage => unmanage(&applier, entry, prev).await,
        };
        busy |= matches!(st.state, State::Processing | State::Deleting);
        flags.known.retain(|k| k.name != st.name);
        flags.known.push(st.clone());
        done[i] = Some(st);
    }
    let mut statuses: Vec<ModuleStatus> = done.into_iter().flatten().collect();
    // Modules whose entry is gone: remove them by the policy kept in status, dependents first;
    // one an installed module still requires waits for it.
    let gone: Vec<&ModuleStatus> =
        plan::gone(&rt, &previous).into_iter().filter(|p| !merged.unread.iter().any(|u| u.name == p.name)).collect();
    statuses.extend(merged.unread.iter().cloned());
    let staying = plan::installed_of(&statuses);
    for st in remove_in_order(ctx, &applier, &ns, &gone, &staying).await {
        busy |= st.state == State::Deleting;
        statuses.push(st);
    }
    crate::config_policy::enforce(ctx, &applier, &rt, &mut statuses, &previous).await;
    let users = merged.users();
    for st in statuses.iter_mut() {
        st.source = users.contains(st.name.as_str()).then_some(fleetwatch_api::chosen::ChosenBy::User);
    }
    // The catalog of what can be installed, kept in the runtime cluster (written on change).
    let catalog = crate::catalog::build(&rt, &ns, &ctx.metas.state(), &ctx.templates.state());
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
    // What each Module object in the cluster shows, after the Runtime's status (the
    // finalizer of a removed module's object goes only once its removal is recorded).
    write_status(&api, &rt, statuses.clone()).await?;
    let synced = match &objects {
        Some(objects) => {
            crate::chosen::cluster::sync(&ctx.chosen, &key, &applier, &rt, &merged, objects, &statuses).await
        }
        None => Ok(()),
    };
    let chosen_pending = match synced {
        Ok(()) => None,
        Err(e) => {
            tracing::warn!(error = %e, "the cluster's Module objects are not all in line; looking again soon");
            Some(BUSY_REQUEUE)
        }
    };
    write_rollouts(ctx).await;
    ctx.metrics.record_duration(started.elapsed());
    ctx.reset_backoff(&key);
    let pending = plan::Pending {
        busy,
        window: flags.window,
        waiting: flags.waiting,
        pull: flags.pull,
        retry: match (retries.next, chosen_pending) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        },
        renew: renew_in,
    };
    Ok(plan::requeue(&pending, ctx.resync).map(Action::requeue).unwrap_or_else(Action::await_change))
}

/// `managed: false`: nothing is touched; the status says what runs, and what fleetwatch knew
/// stays (managing it again is not a fresh install).
async fn unmanage(applier: &Applier, entry: &ModuleEntry, prev: Option<&ModuleStatus>) -> ModuleStatus {
    let mut known = prev.cloned().unwrap_or_else(|| ModuleStatus { name: entry.name.clone(), ..Default::default() });
    known.custom_resource_policy = entry.custom_resource_policy;
    let actual = actual_version(applier, &known).await;
    let message = plan::unmanaged_message(actual.as_deref());
    ModuleStatus {
        state: State::Unmanaged,
        message,
        actual_version: actual,
        // What fleetwatch knew stays: managing it again is not a fresh install
        // (a default configuration the user deleted is not recreated).
        ..known
    }
}

/// The version the module's manager Deployment runs (its version label), if it can be read.
async fn actual_version(applier: &Applier, st: &ModuleStatus) -> Option<String> {
    let manager = st.resources.iter().find(|r| r.kind == "Deployment")?;
    let d = applier.get(manager).await.ok()??;
    d.labels().get(VERSION_LABEL).cloned()
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
    // What the rules read, gathered once for this module.
    let (templates, metas, policies) = (ctx.templates.state(), ctx.metas.state(), ctx.policies.state());
    let stores = Stores { ns, templates: &templates, metas: &metas, policies: &policies };
    let now = ctx.clock.now();
    if let Some(p) = prev {
        let failed = plan::Failed {
            previous: p,
            spec_changed: rt.status.as_ref().and_then(|s| s.observed_generation) != rt.metadata.generation,
            desired: plan::desired(entry, rt, &stores).ok().map(|(v, _)| v.to_string()),
            cluster_moved: ctx.changes.moved(&runtime, &rt.cluster_id(), &entry.name),
        };
        if plan::held_back(&failed, now) {
            tracing::debug!(module = %entry.name, "failed step not due yet; nothing changed that could unblock it");
            return p.clone();
        }
    }
    let inputs = Inputs {
        rt,
        stores,
        known: &flags.known,
        listed: &flags.listed,
        now,
        min_window_remaining: ctx.min_window_remaining,
    };
    let mut gates = Gates::default();
    let st = install_inner(ctx, applier, &inputs, entry, prev, &mut gates).await;
    gates.into(flags);
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
        let of = crate::rollout::RolloutOf { ns, module: &entry.name, version: &desired };
        match st.state {
            State::Ready if st.installed_version.as_deref() == Some(desired.to_string().as_str()) => {
                ctx.rollouts.report(of, &name, true, policy, recorded)
            }
            State::Error => ctx.rollouts.report(of, &name, false, policy, recorded),
            _ => {}
        }
    }
    st
}

/// What one module's gates ask of the runtime's next reconcile ([`Flags`]).
#[derive(Default)]
struct Gates {
    /// Waiting for a rollout wave.
    waiting: bool,
    /// Look again in this long (a maintenance window, a held upgrade).
    window: Option<Duration>,
    /// Waiting for a module artifact: its pull's backoff.
    pull: Option<Duration>,
}

impl Gates {
    fn into(self, flags: &mut Flags) {
        flags.waiting |= self.waiting;
        if let Some(w) = self.window {
            flags.window = Some(w);
        }
        if let Some(p) = self.pull {
            flags.pull_in(p);
        }
    }
}

/// One module: its desired version and template resolved ([`plan::desired`]), the version
/// its manager runs read, the rules decided ([`plan::decide`]), then the decision carried
/// out: a status for what must wait, the gates (rollout admission, maintenance window), then
/// [`change`].
async fn install_inner(
    ctx: &Ctx,
    applier: &Applier,
    inputs: &Inputs<'_>,
    entry: &ModuleEntry,
    prev: Option<&ModuleStatus>,
    gates: &mut Gates,
) -> ModuleStatus {
    let (rt, ns) = (inputs.rt, inputs.stores.ns);
    let mut st = prev.cloned().unwrap_or_else(|| ModuleStatus { name: entry.name.clone(), ..Default::default() });
    st.custom_resource_policy = entry.custom_resource_policy;
    // Whatever held it last time is decided anew.
    st.reason = None;
    let (desired, channel) = match plan::desired(entry, rt, &inputs.stores) {
        Ok(v) => v,
        Err(e) => return failed(st, FailedStep::Resolve, e),
    };
    st.channel = channel;
    st.desired_version = Some(desired.to_string());
    let Some(template) = inputs.stores.template(&entry.name, &desired) else {
        return failed(
            st,
            FailedStep::Resolve,
            format!("no ModuleTemplate for {} {desired} in namespace {ns}", entry.name),
        );
    };
    let running = match applier.get(&template.spec.manager).await {
        Ok(d) => d.and_then(|d| d.labels().get(VERSION_LABEL).cloned()),
        Err(e) => return failed(st, FailedStep::Read, e.to_string()),
    };
    st.actual_version = running.clone();
    let actual = running.as_deref().and_then(|v| parse(v).ok());
    let change = match plan::decide(inputs, entry, &desired, &template, actual.as_ref()) {
        Decision::RefuseDowngrade(message) => {
            // Rule 2: never downgrade what runs; say so once, no error loop.
            let mut st = fail(st, State::Warning, message);
            st.reason = Some(ModuleReason::DowngradeRefused);
            return st;
        }
        Decision::Unusable(message) => return failed(st, FailedStep::Resolve, message),
        Decision::WaitForDependency(state, message) => {
            let mut st = fail(st, state, message);
            st.reason = Some(ModuleReason::WaitingForDependency);
            return st;
        }
        Decision::Change(change) => change,
    };
    if let Some(policy) = &change.rollout {
        let total = plan::rollout_total(&ctx.fleet.state(), &inputs.stores, &entry.name, &desired);
        // The admission is recorded before the upgrade starts: an instance taking over
        // counts this runtime as in flight. Not recorded, not started (it is retried).
        let admission = Admission { ns, module: &entry.name, version: &desired, policy, rt, total };
        if let crate::rollout::UpgradeGate::Wait(why) = admit_recorded(ctx, &admission).await {
            // The current version keeps running and being what status reports.
            gates.waiting = true;
            st.state = if prev.is_some_and(|p| p.state == State::Ready) { State::Ready } else { State::Processing };
            st.message = why;
            st.reason = Some(ModuleReason::WaitingForRollout);
            return st;
        }
    }
    // Rule 3: an upgrade needing downtime waits for a maintenance window; meanwhile the
    // current version keeps being reconciled (drift repaired).
    st.next_maintenance_window = None;
    match change.window.clone() {
        Window::Open => {}
        Window::Wait { from, message, next, opens_in } => {
            gates.window = Some(opens_in);
            st.next_maintenance_window = Some(next);
            let mut st = keep_current(applier, ns, ctx, entry, st, &from, message).await;
            if st.state != State::Error {
                st.reason = Some(ModuleReason::WaitingForMaintenanceWindow);
            }
            return st;
        }
        Window::Hold { from, message, look_again } => {
            if look_again.is_some() {
                gates.window = look_again;
            }
            return hold(applier, ns, ctx, entry, st, &from, message).await;
        }
    }
    let target = Target { entry, template, desired, actual, change };
    change_module(ctx, applier, rt, ns, &target, st, gates).await
}

/// A module's change as decided, carried out by [`change_module`].
struct Target<'a> {
    entry: &'a ModuleEntry,
    template: Arc<ModuleTemplate>,
    desired: semver::Version,
    /// The version running before the change.
    actual: Option<semver::Version>,
    change: plan::Change,
}

/// Carries out an install, upgrade or keep that the gates let through: the objects fetched,
/// migrations run around them, applied, the default configuration created once, and the
/// manager's readiness read.
async fn change_module(
    ctx: &Ctx,
    applier: &Applier,
    rt: &Runtime,
    ns: &str,
    target: &Target<'_>,
    mut st: ModuleStatus,
    gates: &mut Gates,
) -> ModuleStatus {
    let Target { entry, template, desired, actual, change } = target;
    // The objects: inline, or the artifact (cached, else pulled). One that cannot be had
    // changes nothing in the cluster: the running version keeps being reconciled.
    let content = match content(ctx, template).await {
        Ok(c) => c,
        Err(e) => {
            gates.pull = Some(e.retry_in);
            return unfetched(ctx, applier, ns, entry, st, &change.step, e).await;
        }
    };
    // Rule 6: migrations run around installs and upgrades only, not when keeping a version.
    let cx = crate::migration::MigrationContext {
        cluster: applier,
        module: &entry.name,
        from: actual.as_ref(),
        to: desired,
        metrics: Some(&ctx.metrics),
    };
    if change.migrate
        && let Err(e) = ctx.migrations.pre(&cx).await
    {
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
    if change.migrate
        && let Err(e) = ctx.migrations.post(&cx).await
    {
        return failed(st, FailedStep::Migration, format!("after upgrading {} to {desired}: {e}", entry.name));
    }
    st.resources = resources;
    st.installed_version = Some(desired.to_string());
    st.managed_resources = template.spec.managed_resources.clone();
    if let Some(cfg) = content.default_config() {
        st = match default_config(ctx, applier, rt, st, cfg).await {
            Ok(st) => st,
            Err(failed) => return failed,
        };
    }
    readiness(applier, &template.spec.manager, desired, st).await
}

/// A module whose objects cannot be had (`e`): nothing changes in the cluster; an upgrade
/// keeps (and repairs) the running version. A transient failure is a `Warning`
/// (`WaitingForArtifact`), a permanent one an `Error` retried with backoff.
async fn unfetched(
    ctx: &Ctx,
    applier: &Applier,
    ns: &str,
    entry: &ModuleEntry,
    st: ModuleStatus,
    step: &Step,
    e: FetchError,
) -> ModuleStatus {
    let state = if e.permanent { State::Error } else { State::Warning };
    let before = (st.state, st.message.clone());
    let (mut st, message) = match step {
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
    st
}

/// Rule 4: the default configuration `cfg` is created once and never recreated or
/// overwritten. `Err` with the failed status when it cannot be.
async fn default_config(
    ctx: &Ctx,
    applier: &Applier,
    rt: &Runtime,
    mut st: ModuleStatus,
    cfg: &Value,
) -> Result<ModuleStatus, ModuleStatus> {
    match Applier::reference(cfg) {
        Ok(r) => st.default_config = Some(r),
        Err(e) => return Err(failed(st, FailedStep::DefaultConfig, e.to_string())),
    }
    // The cached Runtime may predate the status write that recorded an earlier creation
    // (a busy API server or watch): ask the API server before creating, so a
    // configuration the user deleted meanwhile is not created again.
    let in_api_server = !st.default_config_created && created_before(ctx, rt, &st.name).await;
    if !plan::create_default_config(st.default_config_created, in_api_server) {
        st.default_config_created = true;
        return Ok(st);
    }
    match applier.create_once(cfg).await {
        Ok((_, created)) => {
            st.default_config_created = true;
            if created {
                tracing::info!(module = %st.name, "default configuration created");
            }
            Ok(st)
        }
        Err(e) => Err(failed(st, FailedStep::DefaultConfig, format!("creating default configuration: {e}"))),
    }
}

/// Ready once the manager runs the desired version and is available.
async fn readiness(
    applier: &Applier,
    manager: &fleetwatch_api::ResourceRef,
    desired: &semver::Version,
    mut st: ModuleStatus,
) -> ModuleStatus {
    let (state, message) = match applier.get(manager).await {
        Ok(Some(d)) => {
            let v = d.labels().get(VERSION_LABEL).cloned();
            st.actual_version = v.clone();
            if v.as_deref().and_then(|v| parse(v).ok()).as_ref() != Some(desired) {
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
        installed.extend(plan::installed_of(&left.iter().map(|p| (*p).clone()).collect::<Vec<_>>()));
        let blocking = crate::requires::dependents(&prev.name, &installed, &templates, ns);
        let gone = match plan::removal(prev.custom_resource_policy, &blocking) {
            plan::Removal::Wait(message) => {
                let mut st = prev.clone();
                st.state = State::Deleting;
                st.reason = Some(ModuleReason::RequiredByOthers);
                st.message = message;
                out.push(st);
                continue;
            }
            plan::Removal::LetGo => {
                tracing::info!(module = %prev.name, "removed with Ignore: left installed, no longer reconciled");
                None
            }
            plan::Removal::Delete => delete(applier, prev).await,
        };
        match gone {
            Some(st) => out.push(st),
            None => left.retain(|p| p.name != prev.name),
        }
    }
    // In the order they were given.
    out.sort_by_key(|st| pending.iter().position(|p| p.name == st.name));
    out
}

/// Rule 5, `CreateAndDelete`: the default configuration deleted, then, once no managed
/// resource is left, the module's objects in reverse order. `None` when the module is gone;
/// otherwise its status while waiting.
async fn delete(applier: &Applier, prev: &ModuleStatus) -> Option<ModuleStatus> {
    let mut st = prev.clone();
    st.reason = None;
    if let Some(cfg) = &prev.default_config
        && let Err(e) = applier.delete(cfg).await
    {
        return Some(failed(st, FailedStep::Delete, format!("deleting default configuration: {e}")));
    }
    let mut left = Vec::new();
    for kind in &prev.managed_resources {
        match applier.count(kind).await {
            Ok(n) => left.push((kind.kind.clone(), n)),
            Err(e) => return Some(failed(st, FailedStep::Delete, e.to_string())),
        }
    }
    if let Some(message) = plan::deletion_blocked(&left) {
        st.state = State::Deleting;
        st.message = message;
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
