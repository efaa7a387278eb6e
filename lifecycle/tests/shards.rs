//! Sharded instances: three operator instances share the Runtimes of simulated runtime
//! clusters through shard Leases. Every runtime converges, each shard Lease has one live
//! holder and no one holds more than its share, no runtime is ever reconciled by two
//! instances at once, a crashed instance's shards are taken over, and a paced rollout
//! across shards stays within `maxInFlight`.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetwatch_api::ModuleReleaseMeta;
use fleetwatch_lifecycle::buckets::{BUCKET_LABEL, bucket_of};
use fleetwatch_lifecycle::shards::{ShardConfig, fair_share, shard_of};
use fleetwatch_test_support::eventually;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::DynamicObject;
use kube::discovery::ApiResource;
use serde_json::json;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "fleetwatch-lifecycle";

/// Reconciles in flight per runtime, across every instance: two at once is a violation.
#[derive(Default)]
struct Tracker {
    in_flight: Mutex<HashMap<String, u32>>,
    overlaps: AtomicU64,
    /// (instance, runtime) → reconciles started.
    started: Mutex<BTreeMap<(String, String), u64>>,
}

struct InstanceObserver {
    instance: String,
    tracker: Arc<Tracker>,
}

impl fleetwatch_lifecycle::ReconcileObserver for InstanceObserver {
    fn started(&self, runtime: &str) {
        let mut f = self.tracker.in_flight.lock().unwrap();
        let n = f.entry(runtime.to_string()).or_default();
        *n += 1;
        if *n > 1 {
            eprintln!("{runtime} reconciled by two instances at once ({} started)", self.instance);
            self.tracker.overlaps.fetch_add(1, Ordering::SeqCst);
        }
        *self.tracker.started.lock().unwrap().entry((self.instance.clone(), runtime.to_string())).or_default() += 1;
    }

    fn finished(&self, runtime: &str) {
        if let Some(n) = self.tracker.in_flight.lock().unwrap().get_mut(runtime) {
            *n -= 1;
        }
    }
}

fn template(version: &str) -> serde_json::Value {
    json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("m-{version}"), "namespace": "default"},
        "spec": {"moduleName": "m", "version": version, "manifest": [{"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "m-manager", "namespace": "default", "labels": {"app.kubernetes.io/version": version}},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "m"}}, "template": {"metadata": {"labels": {"app": "m", "app.kubernetes.io/version": version}}, "spec": {"containers": [{"name": "c", "image": "m"}]}}}}],
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "default", "name": "m-manager"}}})
}

fn meta(version: &str, paced: bool) -> serde_json::Value {
    let mut m = common::release_meta(version);
    if paced {
        m["spec"]["rollout"] = json!({"maxInFlight": 2, "stepPercent": 30, "maxFailureRatio": 0.3});
    }
    m
}

struct Fleet {
    _cp_sim: fleetwatch_sim::SimCluster,
    cp_client: kube::Client,
    _sims: Vec<fleetwatch_sim::SimCluster>,
    clients: Vec<kube::Client>,
    tracker: Arc<Tracker>,
}

/// A control plane and `n` runtime clusters whose Deployments roll out `kubelet_delay` after
/// each change, with module `m` at 1.0.0 (and 2.0.0 available).
async fn fleet(n: usize, kubelet_delay: Duration, paced: bool) -> Fleet {
    let (cp_sim, cp_client, cp) = common::control_plane().await;
    for v in ["1.0.0", "2.0.0"] {
        cp.apply(&template(v)).await.unwrap();
    }
    cp.apply(&meta("1.0.0", paced)).await.unwrap();
    let mut sims = Vec::new();
    let mut clients = Vec::new();
    for i in 0..n {
        let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
        let client = sim.client().await.unwrap();
        tokio::spawn(fleetwatch_sim::roll_out_deployments(client.clone(), kubelet_delay, CancellationToken::new()));
        clients.push(client);
        cp.apply(
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "stringData": {"config": sim.kubeconfig_yaml()}}),
        )
        .await
        .unwrap();
        cp.apply(&json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime", "metadata": {"name": format!("r{i}"), "namespace": "default"},
            "spec": {"kubeconfigSecret": {"name": format!("r{i}")}, "modules": [{"name": "m"}]}})).await.unwrap();
        sims.push(sim);
    }
    Fleet { _cp_sim: cp_sim, cp_client, _sims: sims, clients, tracker: Default::default() }
}

/// An instance of `shards` shards with short Leases (3 s: renew deadline 2 s).
fn instance(f: &Fleet, name: &str, shards: u32) -> (CancellationToken, JoinHandle<()>) {
    instance_with(f, name, shards, Default::default())
}

/// [`instance`] reporting to `metrics`.
fn instance_with(
    f: &Fleet,
    name: &str,
    shards: u32,
    metrics: Arc<fleetwatch_lifecycle::Metrics>,
) -> (CancellationToken, JoinHandle<()>) {
    let stop = CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        resync: None,
        concurrency: 4,
        migrations: Default::default(),
        shards: Some(ShardConfig::new("default", LEASE, name, shards).with_lease_duration(Duration::from_secs(3))),
        observer: Some(Arc::new(InstanceObserver { instance: name.into(), tracker: f.tracker.clone() })),
        ..fleetwatch_lifecycle::LifecycleConfig::new(f.cp_client.clone())
    };
    (stop.clone(), tokio::spawn(fleetwatch_lifecycle::run(config, metrics, stop)))
}

/// Shard → holder, as the shard Leases say.
async fn holders(client: &kube::Client, shards: u32) -> BTreeMap<u32, String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "default");
    let mut out = BTreeMap::new();
    for i in 0..shards {
        if let Some(l) = leases.get_opt(&format!("{LEASE}-shard-{i}")).await.unwrap() {
            let holder = l.spec.and_then(|s| s.holder_identity).unwrap_or_default();
            if !holder.is_empty() {
                out.insert(i, holder);
            }
        }
    }
    out
}

/// Whether every shard is held by one of `live` and none of them holds more than its share.
fn balanced(holders: &BTreeMap<u32, String>, shards: u32, live: &[&str]) -> bool {
    let mut per: HashMap<&str, usize> = HashMap::new();
    for h in holders.values() {
        *per.entry(h.as_str()).or_default() += 1;
    }
    holders.len() == shards as usize
        && holders.values().all(|h| live.contains(&h.as_str()))
        && per.values().all(|n| *n <= fair_share(shards, live.len()))
}

async fn apply(client: &kube::Client, v: &serde_json::Value) {
    fleetwatch_lifecycle::applier::Applier::new(client.clone()).apply(v).await.unwrap();
}

async fn wait_for<F, Fut>(what: &str, within: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), String>>,
{
    let _ = eventually(what).within(within).until(async || check().await, Result::is_ok).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_share_the_runtimes_and_take_over_a_crashed_one() {
    const N: usize = 9;
    const SHARDS: u32 = 5;
    let f = fleet(N, Duration::ZERO, false).await;
    let names = ["a", "b", "c"];
    let mut running: Vec<(CancellationToken, JoinHandle<()>)> = names.iter().map(|n| instance(&f, n, SHARDS)).collect();

    wait_for("every runtime converges with three instances", Duration::from_secs(90), || async {
        let ready = common::ready_on(&f.cp_client, "1.0.0").await;
        let h = holders(&f.cp_client, SHARDS).await;
        if ready == N && balanced(&h, SHARDS, &names) { Ok(()) } else { Err(format!("{ready}/{N} ready; {h:?}")) }
    })
    .await;
    // Every instance took part: with 5 shards over 3 live instances, each holds 1 or 2.
    let h = holders(&f.cp_client, SHARDS).await;
    let distinct: BTreeSet<&String> = h.values().collect();
    assert_eq!(distinct.len(), 3, "{h:?}");
    let by_instance: BTreeSet<String> = f.tracker.started.lock().unwrap().keys().map(|(i, _)| i.clone()).collect();
    assert!(by_instance.len() >= 2, "reconciles came from {by_instance:?} only");

    // Instance "c" crashes: nothing is given back, its Leases expire and the others take
    // its shards over; then a channel move reaches every runtime.
    let crashed: Vec<u32> = h.iter().filter(|(_, who)| *who == "c").map(|(s, _)| *s).collect();
    assert!(!crashed.is_empty());
    let (_, c) = running.pop().unwrap();
    c.abort();
    let _ = c.await;
    let crash = Instant::now();
    wait_for("the crashed instance's shards move to the others", Duration::from_secs(60), || async {
        let h = holders(&f.cp_client, SHARDS).await;
        if balanced(&h, SHARDS, &["a", "b"]) { Ok(()) } else { Err(format!("{h:?}")) }
    })
    .await;
    eprintln!("shards {crashed:?} of the crashed instance taken over after {:?} (lease 3 s)", crash.elapsed());
    apply(&f.cp_client, &meta("2.0.0", false)).await;
    wait_for("the channel move reaches every runtime", Duration::from_secs(90), || async {
        let n = common::ready_on(&f.cp_client, "2.0.0").await;
        if n == N { Ok(()) } else { Err(format!("{n}/{N} on 2.0.0; {:?}", holders(&f.cp_client, SHARDS).await)) }
    })
    .await;
    assert_eq!(f.tracker.overlaps.load(Ordering::SeqCst), 0, "a runtime was reconciled by two instances at once");

    // A clean stop gives the shards back at once (no lease expiry to wait for).
    let (stop_b, b) = running.pop().unwrap();
    stop_b.cancel();
    b.await.unwrap();
    wait_for("a stopped instance's shards move to the last one", Duration::from_secs(60), || async {
        let h = holders(&f.cp_client, SHARDS).await;
        if balanced(&h, SHARDS, &["a"]) { Ok(()) } else { Err(format!("{h:?}")) }
    })
    .await;
    let (stop_a, a) = running.pop().unwrap();
    stop_a.cancel();
    a.await.unwrap();
    assert!(holders(&f.cp_client, SHARDS).await.is_empty(), "the last instance gave every shard back");
    assert_eq!(f.tracker.overlaps.load(Ordering::SeqCst), 0, "a runtime was reconciled by two instances at once");
}

/// Whether the runtime cluster runs `version` of the module's manager but not ready yet.
async fn upgrading(client: &kube::Client, version: &str) -> bool {
    let ar = ApiResource::erase::<k8s_openapi::api::apps::v1::Deployment>(&());
    let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), "default", &ar);
    let Ok(Some(d)) = api.get_opt("m-manager").await else { return false };
    let labelled = d.metadata.labels.as_ref().and_then(|l| l.get("app.kubernetes.io/version")).map(String::as_str);
    labelled == Some(version) && d.data["status"]["observedGeneration"].as_i64() != d.metadata.generation
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_across_shards_stays_within_max_in_flight() {
    const N: usize = 10;
    const SHARDS: u32 = 4;
    // Slow clusters, so that upgrades overlap and admissions race between instances.
    let f = fleet(N, Duration::from_millis(300), true).await;
    let names = ["a", "b", "c"];
    let running: Vec<(CancellationToken, JoinHandle<()>)> = names.iter().map(|n| instance(&f, n, SHARDS)).collect();
    wait_for("every runtime converges", Duration::from_secs(90), || async {
        let ready = common::ready_on(&f.cp_client, "1.0.0").await;
        let h = holders(&f.cp_client, SHARDS).await;
        if ready == N && balanced(&h, SHARDS, &names) { Ok(()) } else { Err(format!("{ready}/{N} ready; {h:?}")) }
    })
    .await;
    let before: BTreeMap<(String, String), u64> = f.tracker.started.lock().unwrap().clone();

    apply(&f.cp_client, &meta("2.0.0", true)).await;
    let metas: Api<ModuleReleaseMeta> = Api::namespaced(f.cp_client.clone(), "default");
    let mut most_upgrading = 0;
    // Checked at every look: never more than maxInFlight upgrading or admitted.
    let (_, done) = eventually("the rollout to complete")
        .within(Duration::from_secs(120))
        .every(Duration::from_millis(20))
        .until(
            async || {
                let mut now_upgrading = 0;
                for c in &f.clients {
                    now_upgrading += usize::from(upgrading(c, "2.0.0").await);
                }
                let st = metas.get("m").await.unwrap().status.unwrap_or_default();
                (now_upgrading, st.rollouts.into_iter().find(|r| r.version == "2.0.0"))
            },
            |(now_upgrading, r)| {
                most_upgrading = most_upgrading.max(*now_upgrading);
                assert!(*now_upgrading <= 2, "{now_upgrading} runtimes upgrading at once, more than maxInFlight 2");
                let Some(r) = r else { return false };
                assert!(r.admitted - r.upgraded - r.failed <= 2, "more than maxInFlight admitted: {r:?}");
                assert_eq!(r.admitted as usize, r.admitted_runtimes.len(), "{r:?}");
                r.phase == "Complete"
            },
        )
        .await;
    let done = done.expect("until returns only what satisfies the condition");
    assert_eq!((done.upgraded, done.failed, done.total), (N as u32, 0, N as u32), "{done:?}");
    assert!(done.wave >= 4, "10 runtimes in waves of 3 take 4 waves: {done:?}");
    assert!(most_upgrading >= 1, "no upgrade was ever seen in flight");
    assert_eq!(common::ready_on(&f.cp_client, "2.0.0").await, N);
    // The upgrades were done by more than one instance: admissions came from several.
    let after = f.tracker.started.lock().unwrap().clone();
    let upgraders: BTreeSet<&String> =
        after.iter().filter(|(k, n)| before.get(*k).copied().unwrap_or(0) < **n).map(|((i, _), _)| i).collect();
    assert!(upgraders.len() >= 2, "only {upgraders:?} reconciled during the rollout");
    assert_eq!(f.tracker.overlaps.load(Ordering::SeqCst), 0, "a runtime was reconciled by two instances at once");
    for (stop, task) in running {
        stop.cancel();
        task.await.unwrap();
    }
}

/// A rolling upgrade from a release before the shards, whose leader election held the Lease
/// `fleetwatch-lifecycle` (no labels, no member Leases): a new single instance (a shard of
/// one) reads that same Lease and does not act while the old leader renews it, for many
/// rounds and lease durations; once the old leader releases it on SIGTERM, the new one takes
/// it (labelled now) and reconciles every runtime.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_of_one_waits_for_the_leader_of_an_older_release() {
    const N: usize = 2;
    let f = fleet(N, Duration::ZERO, false).await;
    let leases: Api<Lease> = Api::namespaced(f.cp_client.clone(), "default");
    let now = || jiff::Timestamp::now().strftime("%Y-%m-%dT%H:%M:%S.%6fZ").to_string();
    let old: Lease = serde_json::from_value(json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
        "metadata": {"name": LEASE, "namespace": "default"},
        "spec": {"holderIdentity": "old-release-pod", "leaseDurationSeconds": 3, "acquireTime": now(),
            "renewTime": now(), "leaseTransitions": 0}}))
    .unwrap();
    leases.create(&Default::default(), &old).await.unwrap();
    // The old leader renews as client-go does: read, new renewTime, replace.
    let old_alive = CancellationToken::new();
    let renewer = {
        let (leases, alive) = (leases.clone(), old_alive.clone());
        tokio::spawn(async move {
            while !alive.is_cancelled() {
                let mut l = leases.get(LEASE).await.unwrap();
                assert_eq!(l.spec.as_ref().unwrap().holder_identity.as_deref(), Some("old-release-pod"), "taken over");
                l.spec.as_mut().unwrap().renew_time = Some(serde_json::from_value(json!(now())).unwrap());
                leases.replace(LEASE, &Default::default(), &l).await.unwrap();
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
        })
    };
    let (stop, task) = instance(&f, "new", 1);
    // Its member Lease is renewed once per round (every 400 ms): 20 renewals span well over
    // two lease durations of looking at the old leader's Lease.
    let member = ShardConfig::new("default", LEASE, "new", 1).member_lease();
    let mut renewals = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    while renewals.len() < 20 {
        assert!(Instant::now() < deadline, "the new instance ran only {} rounds", renewals.len());
        if let Some(l) = leases.get_opt(&member).await.unwrap() {
            renewals.insert(format!("{:?}", l.spec.and_then(|s| s.renew_time)));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(f.tracker.started.lock().unwrap().is_empty(), "acted while the old release led");
    assert_eq!(common::ready_on(&f.cp_client, "1.0.0").await, 0);
    assert!(leases.get_opt(&format!("{LEASE}-shard-0")).await.unwrap().is_none(), "no Lease beside the old one");

    // The old leader stops cleanly and releases the Lease (as its election did).
    old_alive.cancel();
    renewer.await.unwrap();
    let mut l = leases.get(LEASE).await.unwrap();
    let spec = l.spec.as_mut().unwrap();
    (spec.holder_identity, spec.renew_time, spec.acquire_time) = (None, None, None);
    leases.replace(LEASE, &Default::default(), &l).await.unwrap();
    wait_for("the new instance leads and reconciles", Duration::from_secs(60), || async {
        let ready = common::ready_on(&f.cp_client, "1.0.0").await;
        if ready == N { Ok(()) } else { Err(format!("{ready}/{N} ready")) }
    })
    .await;
    let l = leases.get(LEASE).await.unwrap();
    assert_eq!(l.spec.and_then(|s| s.holder_identity).as_deref(), Some("new"));
    assert_eq!(
        l.metadata.labels.unwrap_or_default().get(fleetwatch_lifecycle::shards::GROUP_LABEL),
        Some(&LEASE.to_string())
    );
    stop.cancel();
    task.await.unwrap();
    let l = leases.get(LEASE).await.unwrap();
    assert_eq!(l.spec.and_then(|s| s.holder_identity), None, "given back on a clean stop");
}

/// `fleetwatch_lifecycle_runtimes_cached` of an instance.
fn cached(m: &fleetwatch_lifecycle::Metrics) -> usize {
    let text = m.encode();
    let line = text.lines().find(|l| l.starts_with("fleetwatch_lifecycle_runtimes_cached ")).unwrap_or_default();
    line.rsplit(' ').next().and_then(|v| v.parse().ok()).unwrap_or(usize::MAX)
}

/// The names of the Runtimes whose shard is one of `shards`.
async fn runtimes_of(client: &kube::Client, count: u32, shards: &[u32]) -> BTreeSet<String> {
    let api: Api<fleetwatch_api::Runtime> = Api::namespaced(client.clone(), "default");
    let list = api.list(&Default::default()).await.unwrap();
    list.items
        .iter()
        .map(|r| r.metadata.name.clone().unwrap_or_default())
        .filter(|n| shards.contains(&shard_of("default", n, count)))
        .collect()
}

/// Memory splits by shard: two instances over 3 shards each cache only the Runtimes of the
/// shards they hold (selected by the bucket label they write), and when one crashes, a
/// Runtime created while nobody holds its shard is labelled and reconciled by the survivor
/// once it takes the shard, along with every Runtime the crashed one had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instances_cache_only_their_shards_and_a_hand_over_loses_no_runtime() {
    const N: usize = 6;
    const SHARDS: u32 = 3;
    let f = fleet(N, Duration::ZERO, false).await;
    let (ma, mb) =
        (Arc::new(fleetwatch_lifecycle::Metrics::default()), Arc::new(fleetwatch_lifecycle::Metrics::default()));
    let (stop_a, a) = instance_with(&f, "a", SHARDS, ma.clone());
    let (_stop_b, b) = instance_with(&f, "b", SHARDS, mb.clone());
    let mine = |h: &BTreeMap<u32, String>, who: &str| -> Vec<u32> {
        h.iter().filter(|(_, w)| w.as_str() == who).map(|(s, _)| *s).collect()
    };
    wait_for("the runtimes converge and each instance caches only its shards", Duration::from_secs(90), || async {
        let ready = common::ready_on(&f.cp_client, "1.0.0").await;
        let h = holders(&f.cp_client, SHARDS).await;
        let want_a = runtimes_of(&f.cp_client, SHARDS, &mine(&h, "a")).await.len();
        let want_b = runtimes_of(&f.cp_client, SHARDS, &mine(&h, "b")).await.len();
        let got = (cached(&ma), cached(&mb));
        if ready == N && balanced(&h, SHARDS, &["a", "b"]) && got == (want_a, want_b) && want_a + want_b == N {
            Ok(())
        } else {
            Err(format!("{ready}/{N} ready; {h:?}; cached {got:?}, want ({want_a}, {want_b})"))
        }
    })
    .await;
    let api: Api<fleetwatch_api::Runtime> = Api::namespaced(f.cp_client.clone(), "default");
    for rt in api.list(&Default::default()).await.unwrap().items {
        let name = rt.metadata.name.clone().unwrap();
        let label = rt.metadata.labels.unwrap_or_default().get(BUCKET_LABEL).cloned();
        assert_eq!(label, Some(bucket_of("default", &name).to_string()), "{name}");
    }

    // "b" crashes; a Runtime of one of its shards appears while nobody holds that shard.
    let h = holders(&f.cp_client, SHARDS).await;
    let b_shards = mine(&h, "b");
    b.abort();
    let _ = b.await;
    let name = (0..).map(|i| format!("late{i}")).find(|n| b_shards.contains(&shard_of("default", n, SHARDS))).unwrap();
    let sim = fleetwatch_sim::SimCluster::start(Default::default()).await.unwrap();
    tokio::spawn(fleetwatch_sim::roll_out_deployments(
        sim.client().await.unwrap(),
        Duration::ZERO,
        CancellationToken::new(),
    ));
    apply(
        &f.cp_client,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": name.clone(), "namespace": "default"},
        "stringData": {"config": sim.kubeconfig_yaml()}}),
    )
    .await;
    apply(
        &f.cp_client,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": name.clone(), "namespace": "default"},
        "spec": {"kubeconfigSecret": {"name": name.clone()}, "modules": [{"name": "m"}]}}),
    )
    .await;
    wait_for(
        "the survivor takes every shard, labels and reconciles every runtime",
        Duration::from_secs(90),
        || async {
            let ready = common::ready_on(&f.cp_client, "1.0.0").await;
            let h = holders(&f.cp_client, SHARDS).await;
            let got = cached(&ma);
            if ready == N + 1 && balanced(&h, SHARDS, &["a"]) && got == N + 1 {
                Ok(())
            } else {
                Err(format!("{ready}/{} ready; {h:?}; a caches {got}", N + 1))
            }
        },
    )
    .await;
    let late = api.get(&name).await.unwrap();
    assert_eq!(
        late.metadata.labels.unwrap_or_default().get(BUCKET_LABEL),
        Some(&bucket_of("default", &name).to_string())
    );
    assert_eq!(f.tracker.overlaps.load(Ordering::SeqCst), 0, "a runtime was reconciled by two instances at once");
    stop_a.cancel();
    a.await.unwrap();
}
