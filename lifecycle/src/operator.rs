//! Running the operator ([`run`]): wait for the CRDs it needs, start the watches and stores,
//! the shard keeper, the hub follower and the status writers, and drive kube-runtime's
//! controller with [`crate::reconcile::reconcile`] until shutdown.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate, Runtime};
use fleetwatch_client::subscriber::SubscriberOptions;
use futures_util::StreamExt;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::metrics::View;
use crate::{
    Ctx, Error, LifecycleConfig, Metrics, agent_module, artifact, buckets, clusters, config_policy, events,
    meta_status, reconcile, retry, rollout, shards, tolerant, triggers, usable, watches,
};

fn error_policy(rt: Arc<Runtime>, err: &Error, ctx: Arc<Ctx>) -> Action {
    if let Error::CleanupPending { again, .. } = err {
        // Removal in progress (it keeps the finalizer by not succeeding): look again soon,
        // or at the failed removals' next retry.
        tracing::debug!(%err, "runtime deletion in progress");
        return Action::requeue(*again);
    }
    ctx.metrics.failures.inc();
    ctx.metrics.retried(err.step());
    let key = format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any());
    let wait = ctx.next_backoff(&key);
    tracing::warn!(runtime = %key, error = %err, retry_in = ?wait, "reconcile failed");
    Action::requeue(wait)
}

/// How long in-flight reconciles may run on after shutdown was asked for.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(4);

/// The CRDs the operator needs in its control plane, as `plural.group`.
fn required_kinds() -> Vec<(kube::api::GroupVersionKind, String)> {
    use kube::Resource;
    fn one<K: Resource<DynamicType = ()>>() -> (kube::api::GroupVersionKind, String) {
        let gvk = kube::api::GroupVersionKind::gvk(&K::group(&()), &K::version(&()), &K::kind(&()));
        (gvk, format!("{}.{}", K::plural(&()), K::group(&())))
    }
    vec![
        one::<Runtime>(),
        one::<ModuleTemplate>(),
        one::<ModuleReleaseMeta>(),
        one::<fleetwatch_api::maintenance::MaintenancePolicy>(),
    ]
}

/// Waits until the control plane serves every kind the operator needs, saying once (at
/// ERROR) which CRDs are missing and how to install them. `false` when shut down meanwhile.
async fn wait_for_crds(client: &kube::Client, shutdown: &CancellationToken) -> bool {
    let mut said: Option<Vec<String>> = None;
    loop {
        let mut missing = Vec::new();
        let mut unreachable = None;
        for (gvk, name) in required_kinds() {
            match kube::discovery::pinned_kind(client, &gvk).await {
                Ok(_) => {}
                Err(kube::Error::Discovery(_)) => missing.push(name),
                Err(kube::Error::Api(s)) if s.code == 404 => missing.push(name),
                Err(e) => unreachable = Some(e.to_string()),
            }
        }
        if missing.is_empty() && unreachable.is_none() {
            if said.is_some() {
                tracing::info!("the control plane serves every CRD the operator needs; starting");
            }
            return true;
        }
        if let Some(e) = unreachable {
            tracing::warn!(error = %e, "cannot reach the control plane to look for the CRDs; retrying");
        } else if said.as_ref() != Some(&missing) {
            tracing::error!(
                missing = %missing.join(", "),
                "the control plane lacks CRDs the operator needs; install them (`fleetwatch crds --dir crds && kubectl apply -f crds/`); waiting for them"
            );
            said = Some(missing);
        }
        tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(Duration::from_secs(2)) => {}
        }
    }
}

/// Runs the operator until `shutdown`. Returns the metrics handle at once through `metrics`.
///
/// It first waits for its CRDs (naming the missing ones); after `shutdown`, reconciles in
/// flight get a few seconds to finish, so the operator stops promptly in every state.
pub async fn run(config: LifecycleConfig, metrics: Arc<Metrics>, shutdown: CancellationToken) {
    if let Some(hub) = &config.hub {
        metrics.set_client_tls(hub.tls.clone());
    }
    metrics.set_shard_count(config.shards.as_ref().map_or(1, |s| s.count));
    if !wait_for_crds(&config.client, &shutdown).await {
        tracing::info!("lifecycle operator stopped before its CRDs appeared");
        return;
    }
    let client = config.client.clone();
    let artifacts = match artifact::cache::Artifacts::new(config.artifacts.clone()) {
        Ok(a) => a,
        Err(e) => {
            // An unusable disk cache costs pulls after a restart, never the operator.
            tracing::error!(dir = ?config.artifacts.cache_dir, error = %e, "cannot use the artifact cache directory; caching in memory only");
            let memory_only = artifact::cache::ArtifactConfig { cache_dir: None, ..config.artifacts.clone() };
            match artifact::cache::Artifacts::new(memory_only) {
                Ok(a) => a,
                Err(e) => {
                    tracing::error!(error = %e, "cannot start the artifact cache");
                    return;
                }
            }
        }
    };
    let (metas, metas_writer) = reflector::store::<ModuleReleaseMeta>();
    let (templates, templates_writer) = reflector::store::<ModuleTemplate>();
    // Templates, release metas and policies the operator cannot use say so in their status.
    let metas_stream = tolerant::watch_checked::<ModuleReleaseMeta, _>(
        client.clone(),
        watcher::Config::default(),
        Some(usable::reporter::<ModuleReleaseMeta>(&client)),
        usable::check_meta,
    )
    .default_backoff()
    .reflect(metas_writer)
    .touched_objects();
    let templates_stream = tolerant::watch_checked::<ModuleTemplate, _>(
        client.clone(),
        watcher::Config::default(),
        Some(usable::reporter::<ModuleTemplate>(&client)),
        usable::check_template,
    )
    .default_backoff()
    .reflect(templates_writer)
    .touched_objects();

    tokio::spawn(usable::keep_requirements(client.clone(), templates.clone(), metas.clone(), shutdown.child_token()));
    let (policies, policies_writer) = reflector::store::<fleetwatch_api::maintenance::MaintenancePolicy>();
    let policies_stream = tolerant::watch_checked::<fleetwatch_api::maintenance::MaintenancePolicy, _>(
        client.clone(),
        watcher::Config::default(),
        Some(usable::reporter::<fleetwatch_api::maintenance::MaintenancePolicy>(&client)),
        usable::check_policy,
    )
    .default_backoff()
    .reflect(policies_writer)
    .touched_objects();
    tokio::spawn(async move {
        // Only keeps the store current; policy changes take effect at the next reconcile.
        policies_stream.for_each(|_| futures_util::future::ready(())).await;
    });

    // Runtimes: only spec changes, deletion and our finalizer start a reconcile, not our own
    // status writes. Sharded, an instance watches only its shards' Runtimes ([`buckets`]).
    let (runtimes, runtimes_writer) = reflector::store::<Runtime>();
    let (invalid_tx, invalid_rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(report_invalid_runtimes(client.clone(), invalid_rx));
    // Reconciles requested from outside the watches: hub events, rollout waves opening and
    // shards taken over.
    let (hub_tx, hub_rx) = tokio::sync::mpsc::channel(4096);
    let sharding = config.shards.clone().map(|sc| {
        let (map, acquired) = shards::ShardMap::new(sc.count);
        (sc, map, acquired)
    });
    let (runtime_events, sharding) = match sharding {
        None => {
            let events = tolerant::watch::<Runtime>(client.clone(), watcher::Config::default(), Some(invalid_tx))
                .default_backoff()
                .reflect(runtimes_writer)
                .boxed();
            (events, None)
        }
        Some((sc, map, acquired)) => {
            let (events_tx, events_rx) = tokio::sync::mpsc::channel(1024);
            let (mislabelled_tx, mislabelled_rx) = tokio::sync::mpsc::channel(1024);
            let out = buckets::Outputs {
                writer: runtimes_writer,
                events: events_tx,
                trigger: hub_tx.clone(),
                mislabelled: mislabelled_tx,
                invalid: Some(invalid_tx),
            };
            tokio::spawn(buckets::watch_held(client.clone(), map.clone(), acquired, out, shutdown.child_token()));
            if sc.count > 1 {
                tokio::spawn(buckets::label_runtimes(
                    client.clone(),
                    map.clone(),
                    mislabelled_rx,
                    shutdown.child_token(),
                ));
            }
            (tokio_stream_from(events_rx).boxed(), Some((sc, map)))
        }
    };
    let runtime_stream = runtime_events.touched_objects().predicate_filter(
        |rt: &Runtime| {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            rt.metadata.generation.hash(&mut h);
            rt.metadata.deletion_timestamp.is_some().hash(&mut h);
            // The finalizer helper adds the finalizer and waits for the change it made:
            // that change must start the reconcile that installs.
            rt.finalizers().iter().any(|f| f == reconcile::FINALIZER).hash(&mut h);
            rt.annotations().get(fleetwatch_api::config_policy::RESET_ANNOTATION).hash(&mut h);
            Some(h.finish())
        },
        Default::default(),
    );
    // What needs the whole fleet (rollout totals, policy statuses): with several shards a slim
    // index of every Runtime; otherwise the one store (the acting instance holds them all).
    let fleet = match &sharding {
        Some((sc, _)) if sc.count > 1 => {
            let (store, keep) = buckets::fleet_index(client.clone());
            let stop = shutdown.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = keep => {}
                    _ = stop.cancelled() => {}
                }
            });
            store
        }
        _ => runtimes.clone(),
    };
    let shard_map = sharding.as_ref().map(|(_, map)| map.clone());
    let (config_policies, config_stream) = config_policy::watch(client.clone());
    let config_changed = Arc::new(tokio::sync::Notify::new());
    if config.watch_configs {
        let keep = watches::keep(client.clone(), templates.clone(), config_policies.clone(), shutdown.child_token());
        tokio::spawn(keep);
    }
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        clusters: clusters::Clusters::new(client.clone(), config.kubeconfig_namespace.clone()),
        metas: metas.clone(),
        templates: templates.clone(),
        resync: config.resync,
        migrations: config.migrations.clone(),
        clock: config.clock.clone(),
        min_window_remaining: config.min_window_remaining,
        policies: policies.clone(),
        config: config_policy::Shared { policies: config_policies.clone(), changed: config_changed.clone() },
        metrics,
        backoff: Default::default(),
        catalogs: Default::default(),
        chosen: Default::default(),
        rollouts: rollout::Rollouts::new(hub_tx.clone()),
        recorder: events::Recorder::new(
            client.clone(),
            events::Reporter { controller: "fleetwatch-lifecycle".into(), instance: std::env::var("POD_NAME").ok() },
        ),
        fleet: fleet.clone(),
        shards: shard_map.clone(),
        observer: config.observer.clone(),
        agent_certs: config.agent_certs.clone(),
        artifacts,
        changes: Default::default(),
    });
    tokio::spawn(config_policy::run_status(
        client.clone(),
        config_changed.clone(),
        config_policies.clone(),
        fleet.clone(),
        templates.clone(),
        shard_map.clone(),
        shutdown.child_token(),
    ));
    let by_config_policy =
        config_policy::on_policy_change(runtimes.clone(), ctx.config.policies.clone(), config_changed);
    ctx.metrics.set_view(Some(View {
        runtimes: runtimes.clone(),
        shards: shard_map.clone(),
        triggers: hub_tx.clone(),
    }));
    // Shards: keep our share of the Leases; a shard taken reconciles all of its Runtimes
    // (the previous holder's work continues from the cluster and the statuses) once the
    // watch of its buckets has listed them ([`buckets::watch_held`]).
    let keep_shards = {
        let client = client.clone();
        let shutdown = shutdown.clone();
        async move {
            let Some((sc, map)) = sharding else { return };
            shards::maintain(client, sc, map, shutdown).await;
        }
    };
    if let Some(opts) = config.hub.clone() {
        let owns: triggers::Owns = match &shard_map {
            Some(map) => {
                let map = map.clone();
                Arc::new(move |rt: &Runtime| map.owns(rt))
            }
            None => Arc::new(|_: &Runtime| true),
        };
        match &shard_map {
            Some(map) => tokio::spawn(follow_hub_while_holding(
                map.clone(),
                opts,
                runtimes.clone(),
                owns,
                hub_tx,
                ctx.changes.clone(),
                shutdown.clone(),
            )),
            None => tokio::spawn(triggers::follow_hub(
                opts,
                runtimes.clone(),
                owns,
                hub_tx,
                ctx.changes.clone(),
                shutdown.child_token(),
            )),
        };
    }
    let agents_installed = config.agent_certs.is_some();
    // Every instance writes the summaries (the same value, only when it differs): no lease
    // needed, and a meta without any Runtime gets its column too.
    let channels = meta_status::ChannelsSummary::default();
    tokio::spawn(channels.clone().run(client.clone(), shutdown.child_token()));
    let by_meta = {
        let store = runtimes.clone();
        let progress = triggers::RolloutProgress::default();
        move |meta: ModuleReleaseMeta| {
            channels.touched(&meta);
            // Every Runtime has the agent module (not in its spec).
            if agents_installed && meta.spec.module_name == agent_module::MODULE {
                return store.state().iter().map(|rt| ObjectRef::from_obj(rt.as_ref())).collect();
            }
            let mut affected = triggers::affected_by_meta(&store, &meta);
            if progress.progressed(&meta) {
                affected.extend(triggers::waiting_for_rollout(&store, &meta));
            }
            affected
        }
    };
    let by_template = {
        let store = runtimes.clone();
        move |tpl: ModuleTemplate| {
            if agents_installed && tpl.spec.module_name == agent_module::MODULE {
                return store.state().iter().map(|rt| ObjectRef::from_obj(rt.as_ref())).collect();
            }
            triggers::affected_by_template(&store, &tpl)
        }
    };
    let metrics = ctx.metrics.clone();
    let controller = Controller::for_stream(runtime_stream, runtimes)
        .with_config(kube::runtime::controller::Config::default().concurrency(config.concurrency))
        .watches_stream(metas_stream, by_meta)
        .watches_stream(templates_stream, by_template)
        .watches_stream(config_stream, by_config_policy)
        .reconcile_on(tokio_stream_from(hub_rx))
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile::reconcile, error_policy, ctx)
        .for_each(|_| futures_util::future::ready(()));
    // kube-runtime's runner waits for its store to be ready even after a graceful shutdown
    // (a Runtime list that never succeeds would hold it forever): bound the wait.
    // Both run in this task (nothing acting is spawned), so dropping it stops all of it at
    // once; the shard keeper gives its shards back on a clean shutdown.
    let controller = async {
        tokio::select! {
            _ = controller => tracing::info!("lifecycle operator stopped"),
            _ = async { shutdown.cancelled().await; tokio::time::sleep(SHUTDOWN_GRACE).await } => {
                tracing::warn!(grace = ?SHUTDOWN_GRACE, "reconciles still running after shutdown; stopping anyway");
            }
        }
    };
    tokio::join!(controller, keep_shards);
    metrics.set_view(None);
}

/// Follows the hub only while this instance holds a shard: a standby of a shard of one must
/// not share the leader's durable subscription (it would ack events the leader has not
/// seen), and an instance without shards has nothing to trigger.
async fn follow_hub_while_holding(
    map: Arc<shards::ShardMap>,
    opts: SubscriberOptions,
    runtimes: Store<Runtime>,
    owns: triggers::Owns,
    trigger: tokio::sync::mpsc::Sender<ObjectRef<Runtime>>,
    changes: Arc<retry::ClusterChanges>,
    shutdown: CancellationToken,
) {
    let mut held = map.subscribe();
    drop(map);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            r = held.wait_for(|h| !h.is_empty()) => if r.is_err() { return },
        }
        let term = shutdown.child_token();
        let following = tokio::spawn(triggers::follow_hub(
            opts.clone(),
            runtimes.clone(),
            owns.clone(),
            trigger.clone(),
            changes.clone(),
            term.clone(),
        ));
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = held.wait_for(|h| h.is_empty()) => {}
        }
        term.cancel();
        let _ = following.await;
        if shutdown.is_cancelled() {
            return;
        }
    }
}

/// Tells the owner of a Runtime that cannot be decoded why, in its status (the Ready
/// condition), since the operator cannot reconcile it.
async fn report_invalid_runtimes(client: kube::Client, mut rx: tokio::sync::mpsc::Receiver<tolerant::Invalid>) {
    use kube::api::{DynamicObject, Patch, PatchParams};
    let ar = kube::core::ApiResource::erase::<Runtime>(&());
    while let Some(bad) = rx.recv().await {
        // A Runtime decoding again is reconciled, and the reconcile writes its status.
        let Some(error) = &bad.error else { continue };
        let Some(ns) = bad.namespace.as_deref() else { continue };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let message = format!("the operator cannot read this Runtime: {error}");
        let patch = serde_json::json!({"status": {"state": "Error", "conditions": [{
            "type": "Ready", "status": "False", "reason": "InvalidSpec", "message": message,
            "lastTransitionTime": jiff::Timestamp::now().to_string(),
        }]}});
        if let Err(e) = api.patch_status(&bad.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            tracing::warn!(runtime = %bad.key, error = %e, "cannot write the status of an invalid Runtime");
        }
    }
}

fn tokio_stream_from<T: Send + 'static>(
    mut rx: tokio::sync::mpsc::Receiver<T>,
) -> impl futures_util::Stream<Item = T> + Send {
    futures_util::stream::poll_fn(move |cx| rx.poll_recv(cx))
}
