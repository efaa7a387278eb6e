//! Sharded instances: three operator instances share the Runtimes of simulated runtime
//! clusters through shard Leases. Every runtime converges, each shard Lease has one live
//! holder and no one holds more than its share, no runtime is ever reconciled by two
//! instances at once, a crashed instance's shards are taken over, and a paced rollout
//! across shards stays within `maxInFlight`.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use fleetwatch_api::ModuleReleaseMeta;
use fleetwatch_lifecycle::shards::{ShardConfig, fair_share};
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
    let stop = CancellationToken::new();
    let config = fleetwatch_lifecycle::LifecycleConfig {
        resync: None,
        concurrency: 4,
        migrations: Default::default(),
        shards: Some(ShardConfig::new("default", LEASE, name, shards).with_lease_duration(Duration::from_secs(3))),
        observer: Some(Arc::new(InstanceObserver { instance: name.into(), tracker: f.tracker.clone() })),
        ..fleetwatch_lifecycle::LifecycleConfig::new(f.cp_client.clone())
    };
    (stop.clone(), tokio::spawn(fleetwatch_lifecycle::run(config, Default::default(), stop)))
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
