//! Kubernetes-like churn in one simulated cluster: ConfigMaps created, changed (a version
//! counter in `data.v`) and deleted through the real API, one write at a time, with a
//! ledger of each object's last write for the final check. While the cluster's agent
//! process is down ([`Churn::set_agent_down`]) the churn mostly deletes, and deletes and
//! recreates at once: the agent must find both by its relist when it comes back (a
//! synthetic delete for what vanished, the new state of what was recreated).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use rand::Rng;
use tokio_util::sync::CancellationToken;

use super::check::Truth;

/// The namespace the churn writes in (and the watch follows).
pub const NAMESPACE: &str = "soak";

/// One object's write history, as far as the final check needs it.
#[derive(Debug, Clone)]
pub struct ObjectLog {
    /// The version written last (also for a delete: the version the object had).
    pub version: u64,
    /// Whether the last successful write left it existing.
    pub exists: bool,
    /// When the last write (successful or not) finished.
    pub last_write: Instant,
}

/// Counters of one cluster's churn.
#[derive(Debug, Default, Clone, Copy)]
pub struct ChurnStats {
    /// Writes that succeeded.
    pub writes: u64,
    /// Writes that failed (their outcome is read back from the cluster at the end).
    pub errors: u64,
    /// Deletes that succeeded while the agent process was down.
    pub deletes_while_down: u64,
    /// Creates (of objects deleted before) that succeeded while the agent process was down.
    pub creates_while_down: u64,
}

/// The churn of one cluster.
pub struct Churn {
    cluster: String,
    api: Api<DynamicObject>,
    objects: usize,
    /// Object name → its log.
    ledger: Arc<Mutex<HashMap<String, ObjectLog>>>,
    stats: Arc<Mutex<ChurnStats>>,
    /// Set while the cluster's agent process is stopped.
    agent_down: AtomicBool,
}

/// The name of object `i`.
pub fn object_name(i: usize) -> String {
    format!("cm-{i}")
}

impl Churn {
    /// Churn over `objects` ConfigMaps in `client`'s cluster.
    pub fn new(cluster: &str, client: kube::Client, objects: usize) -> Self {
        let ar = ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&());
        Self {
            cluster: cluster.to_string(),
            api: Api::namespaced_with(client, NAMESPACE, &ar),
            objects: objects.max(1),
            ledger: Default::default(),
            stats: Default::default(),
            agent_down: AtomicBool::new(false),
        }
    }

    /// The cluster id.
    pub fn cluster(&self) -> &str {
        &self.cluster
    }

    /// Creates the namespace and every other object, before the agent starts.
    pub async fn populate(&self, client: kube::Client) -> anyhow::Result<()> {
        let ns: Api<DynamicObject> =
            Api::all_with(client, &ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()));
        let body = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
        ns.patch(NAMESPACE, &PatchParams::apply("fleetwatch-soak").force(), &Patch::Apply(body)).await?;
        for i in (0..self.objects).step_by(2) {
            // A failed create is in the ledger and read back at the end.
            let _ = self.write(i, Op::Create).await;
        }
        Ok(())
    }

    /// Whether the cluster's agent process is down: the churn then deletes and recreates
    /// objects rather than only changing them.
    pub fn set_agent_down(&self, down: bool) {
        self.agent_down.store(down, Ordering::Relaxed);
    }

    /// Writes at `rate` per second until `stop`.
    pub async fn run(self: Arc<Self>, rate: f64, stop: CancellationToken) {
        let period = Duration::from_secs_f64(1.0 / rate.max(0.01));
        let mut tick = tokio::time::interval(period);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = stop.cancelled() => return,
            }
            let (i, roll) = {
                let mut rng = rand::rng();
                (rng.random_range(0..self.objects), rng.random_range(0..100u32))
            };
            let exists = self.ledger.lock().map(|l| l.get(&object_name(i)).is_some_and(|o| o.exists)).unwrap_or(false);
            let down = self.agent_down.load(Ordering::Relaxed);
            // A failed write is in the ledger and read back at the end.
            let _ = match (exists, down, roll) {
                (false, _, _) => self.write(i, Op::Create).await,
                (true, false, 0..15) => self.write(i, Op::Delete).await,
                (true, false, _) => self.write(i, Op::Update).await,
                // Agent down: deleted (and left so, or created again later), or deleted and
                // recreated at once (same name, new object, new version), some updates.
                (true, true, 0..35) => self.write(i, Op::Delete).await,
                (true, true, 35..75) => self.write(i, Op::Delete).await && self.write(i, Op::Create).await,
                (true, true, _) => self.write(i, Op::Update).await,
            };
        }
    }

    /// One write and its ledger entry; whether it succeeded.
    async fn write(&self, i: usize, op: Op) -> bool {
        let name = object_name(i);
        let version = self.ledger.lock().map(|l| l.get(&name).map_or(0, |o| o.version)).unwrap_or(0) + 1;
        let v = version.to_string();
        let result = match op {
            Op::Create => {
                let body = serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap",
                    "metadata": {"name": name, "namespace": NAMESPACE}, "data": {"v": v}});
                let pp = PatchParams::apply("fleetwatch-soak").force();
                self.api.patch(&name, &pp, &Patch::Apply(body)).await.map(|_| ())
            }
            Op::Update => {
                let body = serde_json::json!({"data": {"v": v}});
                self.api.patch(&name, &PatchParams::default(), &Patch::Merge(body)).await.map(|_| ())
            }
            Op::Delete => self.api.delete(&name, &DeleteParams::default()).await.map(|_| ()),
        };
        let now = Instant::now();
        let ok = match &result {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(cluster = %self.cluster, object = %name, error = %e, "churn write failed");
                false
            }
        };
        let down = self.agent_down.load(Ordering::Relaxed);
        if let Ok(mut stats) = self.stats.lock() {
            if ok {
                stats.writes += 1
            } else {
                stats.errors += 1
            }
            match op {
                Op::Delete if ok && down => stats.deletes_while_down += 1,
                // A create of an object that had a version was a recreate.
                Op::Create if ok && down && version > 1 => stats.creates_while_down += 1,
                _ => {}
            }
        }
        if let Ok(mut ledger) = self.ledger.lock() {
            let entry = ledger.entry(name).or_insert(ObjectLog { version: 0, exists: false, last_write: now });
            entry.last_write = now;
            if ok {
                match op {
                    // A delete leaves the version the object had.
                    Op::Delete => entry.exists = false,
                    Op::Create | Op::Update => {
                        entry.exists = true;
                        entry.version = version;
                    }
                }
            } else if op != Op::Delete {
                // The write may have happened: never reuse its version.
                entry.version = version;
            }
        }
        ok
    }

    /// Counters so far.
    pub fn stats(&self) -> ChurnStats {
        self.stats.lock().map(|s| *s).unwrap_or_default()
    }

    /// Every object ever written, with its final state read from the cluster and its
    /// last write time.
    pub async fn truth(&self) -> anyhow::Result<Vec<(String, Truth, Instant)>> {
        let list = self.api.list(&Default::default()).await?;
        let present: HashMap<String, Option<String>> = list
            .items
            .iter()
            .filter_map(|o| {
                let name = o.metadata.name.clone()?;
                Some((name, o.data["data"]["v"].as_str().map(str::to_string)))
            })
            .collect();
        let ledger = self.ledger.lock().map(|l| l.clone()).unwrap_or_default();
        let mut out = Vec::with_capacity(ledger.len());
        for (name, log) in ledger {
            let truth = match present.get(&name) {
                Some(v) => Truth::Present(v.clone().unwrap_or_default()),
                None if log.version == 0 => continue, // never created
                None => Truth::Absent((!log.exists).then(|| log.version.to_string())),
            };
            out.push((name, truth, log.last_write));
        }
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Create,
    Update,
    Delete,
}
