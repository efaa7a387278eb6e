//! Sharded instances split their memory: each watches and caches only the Runtimes of the
//! shards it holds, selected by a label the operator maintains.
//!
//! - Every Runtime carries [`BUCKET_LABEL`] = `fnv1a64("<namespace>/<name>") mod` [`BUCKETS`]
//!   and belongs to shard `bucket mod N` ([`crate::shards::shard_of`]). The bucket does not
//!   depend on N, so changing `--shards` relabels nothing; N must divide [`BUCKETS`] so that
//!   every shard gets the same number of buckets and, for those N, `bucket mod N` equals the
//!   `fnv mod N` of releases before the buckets (a rolling upgrade keeps every Runtime in its
//!   shard).
//! - The instance holding a shard labels that shard's Runtimes that lack the label (or carry
//!   a wrong value): `label_runtimes` keeps a metadata-only watch of `!label` (empty once
//!   the fleet is labelled) and rescans it whenever the held shards change. The label is a
//!   pure function of the name, so concurrent writers agree.
//! - `watch_held` watches `label in (buckets of the held shards)`; the held set changing
//!   restarts the watch with the new selector, so the cache grows and shrinks with the
//!   shards. It applies events to the reflector store itself before passing them on, and
//!   once a restarted watch has listed (`InitDone`) it triggers every Runtime of the shards
//!   taken since: a hand-over loses no Runtime, whether it was labelled before (the new list
//!   has it) or gets labelled later (ADDED to the watch when the label appears).
//! - Rollout totals and policy statuses need the whole fleet: `fleet_index` keeps every
//!   Runtime with its spec and labels only (status and managed fields dropped on arrival).

use std::collections::BTreeSet;
use std::sync::Arc;

use fleetwatch_api::Runtime;
use futures_util::{StreamExt, TryStreamExt};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use kube::{Resource, ResourceExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::shards::{ShardMap, fnv1a64};

/// The label naming a Runtime's bucket (`0`..`BUCKETS - 1`).
pub const BUCKET_LABEL: &str = "lifecycle.fleetwatch.dev/bucket";
/// Buckets: 60 has many divisors, so 1, 2, 3, 4, 5, 6, 10, 12, 15, 20, 30 and 60 shards
/// each get an equal share.
pub const BUCKETS: u32 = 60;

/// The bucket of the Runtime `namespace/name`.
pub fn bucket_of(namespace: &str, name: &str) -> u32 {
    (fnv1a64(format!("{namespace}/{name}").as_bytes()) % u64::from(BUCKETS)) as u32
}

/// The bucket of a Runtime object (a Runtime without namespace counts as `default`).
pub(crate) fn bucket_of_runtime<K: Resource>(rt: &K) -> u32 {
    bucket_of(rt.meta().namespace.as_deref().unwrap_or("default"), rt.meta().name.as_deref().unwrap_or(""))
}

/// Whether `count` shards can split the buckets evenly (a divisor of [`BUCKETS`]).
pub fn valid_shard_count(count: u32) -> bool {
    count >= 1 && BUCKETS.is_multiple_of(count)
}

/// The label selector of the Runtimes of `held` among `count` shards; `None` when they are
/// all held (watch everything, labelled or not). Holding nothing selects a value never
/// written, so the cache empties.
pub(crate) fn selector(count: u32, held: &BTreeSet<u32>) -> Option<String> {
    let count = count.max(1);
    if (0..count).all(|s| held.contains(&s)) {
        return None;
    }
    let buckets: Vec<String> = (0..BUCKETS).filter(|b| held.contains(&(b % count))).map(|b| b.to_string()).collect();
    if buckets.is_empty() {
        return Some(format!("{BUCKET_LABEL} in (none)"));
    }
    Some(format!("{BUCKET_LABEL} in ({})", buckets.join(",")))
}

/// The label value a Runtime should carry, when it does not carry it already.
fn wrong_label<K: Resource>(rt: &K) -> Option<String> {
    let want = bucket_of_runtime(rt).to_string();
    let has = rt.meta().labels.as_ref().and_then(|l| l.get(BUCKET_LABEL));
    (has != Some(&want)).then_some(want)
}

/// Writes the bucket label of one Runtime (a merge patch of that one label).
async fn write_label(client: &kube::Client, ns: &str, name: &str, bucket: &str) {
    let api: Api<Runtime> = Api::namespaced(client.clone(), ns);
    let patch = serde_json::json!({"metadata": {"labels": {BUCKET_LABEL: bucket}}});
    match api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {} // deleted meanwhile
        Err(e) => {
            tracing::warn!(runtime = %format!("{ns}/{name}"), error = %e, "cannot write the Runtime's bucket label; its shard's instance does not see it until it is written")
        }
    }
}

/// Labels the Runtimes of held shards that lack [`BUCKET_LABEL`] (or carry a wrong value),
/// until `shutdown`. Runtimes of shards held by others are left to their holders.
pub(crate) async fn label_runtimes(
    client: kube::Client,
    map: Arc<ShardMap>,
    mut mislabelled: mpsc::Receiver<(String, String)>,
    shutdown: CancellationToken,
) {
    // Metadata only: a Runtime waiting for its label costs its name and labels, no more.
    let api: Api<kube::core::PartialObjectMeta<Runtime>> = Api::all(client.clone());
    let config = watcher::Config::default().labels(&format!("!{BUCKET_LABEL}"));
    let (unlabelled, writer) = reflector::store();
    let stream = watcher::watcher(api, config).default_backoff().reflect(writer).applied_objects();
    let mut stream = std::pin::pin!(stream);
    let mut held = map.subscribe();
    let label_if_held = |ns: &str, name: &str| {
        let shard = crate::shards::shard_of(ns, name, map.count());
        map.held().contains(&shard).then(|| bucket_of(ns, name).to_string())
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            next = stream.next() => match next {
                Some(Ok(meta)) => {
                    let ns = meta.namespace().unwrap_or_else(|| "default".into());
                    if let Some(bucket) = label_if_held(&ns, &meta.name_any()) {
                        write_label(&client, &ns, &meta.name_any(), &bucket).await;
                    }
                }
                Some(Err(e)) => tracing::debug!(error = %e, "watch of unlabelled Runtimes"),
                None => return,
            },
            changed = held.changed() => {
                if changed.is_err() {
                    return;
                }
                // Shards taken: their unlabelled Runtimes are ours to label now.
                for meta in unlabelled.state() {
                    let ns = meta.namespace().unwrap_or_else(|| "default".into());
                    if let Some(bucket) = label_if_held(&ns, &meta.name_any()) {
                        write_label(&client, &ns, &meta.name_any(), &bucket).await;
                    }
                }
            }
            Some((ns, name)) = mislabelled.recv() => {
                write_label(&client, &ns, &name, &bucket_of(&ns, &name).to_string()).await;
            }
        }
    }
}

/// Where [`watch_held`] reports.
pub(crate) struct Outputs {
    /// The store the controller reads (applied here before events are passed on).
    pub writer: reflector::store::Writer<Runtime>,
    /// The events, after they are in the store.
    pub events: mpsc::Sender<Result<Event<Runtime>, watcher::Error>>,
    /// Reconciles of the Runtimes of shards taken.
    pub trigger: mpsc::Sender<ObjectRef<Runtime>>,
    /// Runtimes seen with a missing or wrong bucket label (to [`label_runtimes`]).
    pub mislabelled: mpsc::Sender<(String, String)>,
    /// Runtimes that cannot be decoded (their status says so).
    pub invalid: Option<mpsc::Sender<crate::tolerant::Invalid>>,
}

/// Watches the Runtimes of the held shards into `out.writer` until `shutdown` (see the
/// module docs). `acquired` names each shard as it is taken.
pub(crate) async fn watch_held(
    client: kube::Client,
    map: Arc<ShardMap>,
    mut acquired: mpsc::UnboundedReceiver<u32>,
    mut out: Outputs,
    shutdown: CancellationToken,
) {
    let mut held_rx = map.subscribe();
    // Shards taken whose Runtimes have not been triggered yet.
    let mut pending: BTreeSet<u32> = BTreeSet::new();
    let mut first_list = true;
    loop {
        let held = held_rx.borrow_and_update().clone();
        let selector = selector(map.count(), &held);
        tracing::debug!(
            ?held,
            selector = selector.as_deref().unwrap_or("(all)"),
            "watching the Runtimes of the held shards"
        );
        let config = match &selector {
            Some(s) => watcher::Config::default().labels(s),
            None => watcher::Config::default(),
        };
        let events = crate::tolerant::watch::<Runtime>(client.clone(), config, out.invalid.clone()).default_backoff();
        let mut events = std::pin::pin!(events);
        let mut listed = false;
        // Runtimes this watch lists that the store did not hold (see `entered` below).
        let mut entered_in_list: Vec<ObjectRef<Runtime>> = Vec::new();
        loop {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                changed = held_rx.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    break; // a new selector
                }
                Some(shard) = acquired.recv() => {
                    pending.insert(shard);
                    if listed && held.contains(&shard) && !trigger(&map, &out, &mut pending, &held).await {
                        return;
                    }
                }
                next = events.next() => {
                    let Some(next) = next else { return };
                    // A Runtime that enters this instance's watch (labelled after it was
                    // first seen, or listed by a restarted watch while it was out of the
                    // store) must be reconciled even though nothing in it changed: the
                    // controller's predicate filter remembers it from before and drops the
                    // event, and a reconcile asked for while it was out of the store was
                    // dropped too. It is triggered directly once the store holds it (seen
                    // at 1,000 Runtimes: 122 created during a hand-over never reconciled).
                    let mut entered = None;
                    if let Ok(ev) = &next {
                        match ev {
                            Event::Apply(rt) | Event::InitApply(rt) => {
                                let key = ObjectRef::from_obj(rt);
                                if out.writer.as_reader().get(&key).is_none() {
                                    if matches!(ev, Event::Apply(_)) { entered = Some(key) } else { entered_in_list.push(key) }
                                }
                            }
                            Event::Init => entered_in_list.clear(),
                            _ => {}
                        }
                        out.writer.apply_watcher_event(ev);
                        if let Event::Apply(rt) | Event::InitApply(rt) = ev
                            && selector.is_some()
                            && wrong_label(rt).is_some()
                        {
                            let key = (rt.namespace().unwrap_or_else(|| "default".into()), rt.name_any());
                            let _ = out.mislabelled.try_send(key);
                        }
                    }
                    let done = matches!(next, Ok(Event::InitDone));
                    if out.events.send(next).await.is_err() {
                        return;
                    }
                    if let Some(key) = entered
                        && out.trigger.send(key).await.is_err()
                    {
                        return;
                    }
                    if done {
                        listed = true;
                        // The first list of this instance has nothing to compare with: the
                        // controller sees each of its Runtimes for the first time anyway.
                        if first_list {
                            entered_in_list.clear();
                        }
                        for key in entered_in_list.drain(..) {
                            if out.trigger.send(key).await.is_err() {
                                return;
                            }
                        }
                        first_list = false;
                        if !trigger(&map, &out, &mut pending, &held).await {
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// Triggers every cached Runtime of the pending shards that the current watch covers.
/// `false` when the controller is gone.
async fn trigger(map: &ShardMap, out: &Outputs, pending: &mut BTreeSet<u32>, held: &BTreeSet<u32>) -> bool {
    let now: BTreeSet<u32> = pending.intersection(held).copied().collect();
    pending.retain(|s| !now.contains(s) && map.held().contains(s));
    if now.is_empty() {
        return true;
    }
    for rt in out.writer.as_reader().state() {
        if now.contains(&map.shard(&rt)) && out.trigger.send(ObjectRef::from_obj(rt.as_ref())).await.is_err() {
            return false;
        }
    }
    true
}

/// Every Runtime with its spec, labels and finalizers only, for what needs the whole fleet
/// (rollout totals, policy statuses) while the full objects are cached per shard. The
/// returned future keeps it current.
pub(crate) fn fleet_index(client: kube::Client) -> (Store<Runtime>, impl std::future::Future<Output = ()> + Send) {
    let (store, writer) = reflector::store();
    let stream = crate::tolerant::watch::<Runtime>(client, watcher::Config::default(), None)
        .default_backoff()
        .modify(|rt| {
            rt.status = None;
            rt.metadata.managed_fields = None;
            rt.metadata.annotations = None;
        })
        .reflect(writer);
    let run = async move {
        let _ = stream.try_for_each(|_| futures_util::future::ready(Ok(()))).await;
    };
    (store, run)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_keep_the_shards_of_releases_before_them() {
        // For every N dividing 60, bucket mod N is fnv mod N: a rolling upgrade from the
        // release that hashed straight to shards keeps every Runtime in its shard.
        for n in (1..=60).filter(|n| valid_shard_count(*n)) {
            for i in 0..500 {
                let name = format!("rt{i}");
                let old = (fnv1a64(format!("kcp/{name}").as_bytes()) % u64::from(n)) as u32;
                assert_eq!(bucket_of("kcp", &name) % n, old, "n={n} {name}");
            }
        }
        assert!(!valid_shard_count(7) && !valid_shard_count(0) && valid_shard_count(12));
    }

    #[test]
    fn selectors_name_the_buckets_of_the_held_shards() {
        let held = |s: &[u32]| s.iter().copied().collect::<BTreeSet<u32>>();
        assert_eq!(selector(1, &held(&[0])), None);
        assert_eq!(selector(3, &held(&[0, 1, 2])), None);
        assert_eq!(selector(3, &held(&[])).as_deref(), Some("lifecycle.fleetwatch.dev/bucket in (none)"));
        let one = selector(3, &held(&[1])).unwrap();
        let values: Vec<u32> = one
            .trim_start_matches("lifecycle.fleetwatch.dev/bucket in (")
            .trim_end_matches(')')
            .split(',')
            .map(|v| v.parse().unwrap())
            .collect();
        assert_eq!(values.len(), 20);
        assert!(values.iter().all(|b| b % 3 == 1));
        // The selector parses as the API server (and the simulated one) reads it.
        assert!(fleetwatch_api::label_selector::LabelSelector::parse(&one).is_ok());
        let two = selector(3, &held(&[0, 2])).unwrap();
        assert_eq!(two.matches(',').count() + 1, 40);
    }

    /// A Runtime first seen while this instance held every shard, out of its watch while
    /// the shards were shared out (it had no bucket label yet), then labelled into a shard
    /// it kept: the controller's predicate filter has seen it and drops the ADDED event, so
    /// it must be triggered directly (without that, 122 of 1,000 Runtimes created during a
    /// hand-over were never reconciled).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_runtime_labelled_into_a_kept_shard_after_a_hand_over_is_triggered() {
        use kube::CustomResourceExt;
        let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
        let client = sim.client().await.unwrap();
        let cp = crate::applier::Applier::new(client.clone());
        cp.apply(&serde_json::to_value(Runtime::crd()).unwrap()).await.unwrap();
        let (map, acquired) = ShardMap::new(3);
        for shard in 0..3 {
            map.start(shard);
        }
        let (store, writer) = reflector::store::<Runtime>();
        let (events_tx, mut events) = mpsc::channel(1024);
        let (trigger_tx, mut triggers) = mpsc::channel(1024);
        let (mislabelled, _mislabelled_rx) = mpsc::channel(1024);
        let out = Outputs { writer, events: events_tx, trigger: trigger_tx, mislabelled, invalid: None };
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(watch_held(client.clone(), map.clone(), acquired, out, stop.clone()));
        // Drain the watch's events (as the controller would) and count the lists.
        let (lists_tx, mut lists) = tokio::sync::watch::channel(0u32);
        tokio::spawn(async move {
            while let Some(ev) = events.recv().await {
                if matches!(ev, Ok(Event::InitDone)) {
                    lists_tx.send_modify(|n| *n += 1);
                }
            }
        });
        lists.wait_for(|n| *n >= 1).await.unwrap();
        // A Runtime of shard 0, without its label yet, seen by the watch of every shard.
        let name = (0..).map(|i| format!("rt{i}")).find(|n| crate::shards::shard_of("default", n, 3) == 0).unwrap();
        let bucket = bucket_of("default", &name);
        cp.apply(&serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": name, "namespace": "default"}, "spec": {"modules": []}}))
            .await
            .unwrap();
        let key = ObjectRef::<Runtime>::new(&name).within("default");
        fleetwatch_test_support::eventually("the Runtime in the store")
            .until(async || store.get(&key).is_some(), |seen| *seen)
            .await;
        while triggers.try_recv().is_ok() {}
        // Shards 1 and 2 go to other instances: the watch selects shard 0's buckets, where
        // the unlabelled Runtime is not.
        assert!(
            map.stop(1, std::time::Duration::from_secs(5)).await
                && map.stop(2, std::time::Duration::from_secs(5)).await
        );
        lists.wait_for(|n| *n >= 2).await.unwrap();
        fleetwatch_test_support::eventually("the unlabelled Runtime out of the store")
            .until(async || store.get(&key).is_none(), |gone| *gone)
            .await;
        // Labelled (by this instance's labeller): it enters the watch and is triggered.
        let api: Api<Runtime> = Api::namespaced(client.clone(), "default");
        let patch = serde_json::json!({"metadata": {"labels": {BUCKET_LABEL: bucket.to_string()}}});
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
        let triggered = tokio::time::timeout(std::time::Duration::from_secs(30), async {
            while let Some(r) = triggers.recv().await {
                if r == key {
                    return true;
                }
            }
            false
        })
        .await;
        assert_eq!(triggered, Ok(true), "the Runtime labelled into a kept shard was never triggered");
        assert!(store.get(&key).is_some(), "triggered before the store held it");
    }
}
