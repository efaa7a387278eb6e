//! What starts a reconcile besides Runtime changes: release-meta and template changes (only
//! the runtimes they affect) and hub events for a runtime's cluster.
//!
//! The hub side is a [`Sink`] like any other consumer of the stream: the subscriber
//! client's pump acknowledges a delivery only after the reconciles it causes are queued.

use fleetwatch_api::policy::{desired_version, parse};
use fleetwatch_api::{ModuleReason, ModuleReleaseMeta, ModuleTemplate, Runtime};
use fleetwatch_client::sink::{Accepted, PumpError, Sink, SinkError, pump};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use kube::ResourceExt;
use kube::runtime::reflector::{ObjectRef, Store};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// Runtimes whose desired version of the meta's module changes with this meta: they use
/// the module, are not pinned, and the version their channel now offers differs from the
/// one their status records.
pub fn affected_by_meta(runtimes: &Store<Runtime>, meta: &ModuleReleaseMeta) -> Vec<ObjectRef<Runtime>> {
    let module = &meta.spec.module_name;
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == meta.namespace())
        .filter(|rt| {
            // The users' modules too: a channel move reaches the clusters that chose the module.
            crate::chosen::listed_and_chosen(rt).iter().any(|e| {
                if &e.name != module || e.version.is_some() {
                    return false;
                }
                let now =
                    desired_version(e, rt.spec.channel.as_deref(), Some(&meta.spec)).ok().map(|(v, _)| v.to_string());
                let recorded = rt
                    .status
                    .as_ref()
                    .and_then(|s| s.modules.iter().find(|m| &m.name == module))
                    .and_then(|m| m.desired_version.clone());
                now != recorded
            })
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// One rollout's progress as a waiting runtime cares about it: version, upgraded, failed,
/// wave, phase.
type Progress = (String, u32, u32, u32, String);

/// Remembers how far each ModuleReleaseMeta's rollouts were, to tell when an upgrade ended.
#[derive(Default)]
pub struct RolloutProgress {
    seen: std::sync::Mutex<std::collections::HashMap<String, Vec<Progress>>>,
}

impl RolloutProgress {
    /// Whether an upgrade of this meta's rollouts ended (or a wave opened, or it halted)
    /// since the last look: places may have freed up for waiting runtimes.
    pub fn progressed(&self, meta: &ModuleReleaseMeta) -> bool {
        let key = format!("{}/{}", meta.namespace().unwrap_or_default(), meta.name_any());
        let now: Vec<_> = meta
            .status
            .iter()
            .flat_map(|s| &s.rollouts)
            .map(|r| (r.version.clone(), r.upgraded, r.failed, r.wave, r.phase.clone()))
            .collect();
        let Ok(mut seen) = self.seen.lock() else { return true };
        seen.insert(key, now.clone()).is_none_or(|before| before != now)
    }
}

/// Runtimes of the meta's namespace that wait for a rollout of its module (a wave, a free
/// place, or to record their admission). Another instance's upgrade ending frees a place
/// for them; this instance learns of it from the status.
pub fn waiting_for_rollout(runtimes: &Store<Runtime>, meta: &ModuleReleaseMeta) -> Vec<ObjectRef<Runtime>> {
    let module = &meta.spec.module_name;
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == meta.namespace())
        .filter(|rt| {
            rt.status.as_ref().is_some_and(|s| {
                s.modules.iter().any(|m| &m.name == module && m.reason.is_some_and(ModuleReason::waits_for_rollout))
            })
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// Runtimes that want exactly this template's module version.
pub fn affected_by_template(runtimes: &Store<Runtime>, tpl: &ModuleTemplate) -> Vec<ObjectRef<Runtime>> {
    let Ok(version) = parse(&tpl.spec.version) else { return Vec::new() };
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == tpl.namespace())
        .filter(|rt| {
            rt.status
                .as_ref()
                .and_then(|s| s.modules.iter().find(|m| m.name == tpl.spec.module_name))
                .is_some_and(|m| m.desired_version.as_deref().and_then(|v| parse(v).ok()).is_none_or(|v| v == version))
                || rt.spec.modules.iter().any(|e| e.name == tpl.spec.module_name) && rt.status.is_none()
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// The lifecycle operator's sink: every event (or resync-required) for a cluster triggers
/// the Runtimes of that cluster. A delivery is accepted once its reconciles are queued, so
/// the hub's cursor moves on only when nothing of it can be lost any more (a reconcile reads
/// the latest state, so queuing it is handling the event).
pub struct TriggerSink {
    runtimes: Store<Runtime>,
    owns: Owns,
    trigger: mpsc::Sender<ObjectRef<Runtime>>,
    changes: std::sync::Arc<crate::retry::ClusterChanges>,
}

/// Whether this instance acts on a Runtime (sharded instances: its shard is held).
pub type Owns = std::sync::Arc<dyn Fn(&Runtime) -> bool + Send + Sync>;

impl TriggerSink {
    /// A sink that queues reconciles of those `runtimes` this instance `owns` into `trigger`.
    pub fn new(runtimes: Store<Runtime>, owns: Owns, trigger: mpsc::Sender<ObjectRef<Runtime>>) -> Self {
        Self { runtimes, owns, trigger, changes: Default::default() }
    }

    /// Counts the deliveries that can unblock a failed module into `changes`.
    pub fn with_changes(mut self, changes: std::sync::Arc<crate::retry::ClusterChanges>) -> Self {
        self.changes = changes;
        self
    }
}

impl Sink for TriggerSink {
    fn name(&self) -> &str {
        "lifecycle-trigger"
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<Accepted, SinkError> {
        let mut clusters: Vec<&str> = match delivery {
            Delivery::Events(evs) => evs.iter().map(|e| e.cluster.as_str()).collect(),
            Delivery::ResyncRequired(r) => vec![r.cluster.as_str()],
        };
        clusters.sort_unstable();
        clusters.dedup();
        match delivery {
            Delivery::Events(evs) => {
                for e in evs.iter().filter(|e| unblocks(e)) {
                    self.changes.bump(&e.cluster);
                }
            }
            Delivery::ResyncRequired(r) => self.changes.bump(&r.cluster),
        }
        let mut triggered = 0usize;
        for rt in self.runtimes.state() {
            let id = rt.cluster_id();
            if clusters.iter().any(|c| *c == "*" || *c == id) && (self.owns)(&rt) {
                triggered += 1;
                // A change people made (a module configuration edited) must be visible where
                // they look: one INFO line per Runtime it reconciles, naming what changed.
                if let Delivery::Events(evs) = delivery {
                    let changes = changes_in(evs, &id);
                    tracing::info!(runtime = %format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any()),
                        cluster = %id, changes = %changes, "reconciling after a change in the runtime cluster (hub event)");
                }
                // The receiver is the controller: gone means the operator is stopping.
                self.trigger
                    .send(ObjectRef::from_obj(rt.as_ref()))
                    .await
                    .map_err(|e| SinkError::Fatal { sink: "lifecycle-trigger".into(), source: Box::new(e) })?;
            }
        }
        if let Delivery::ResyncRequired(r) = delivery {
            // One line for the whole marker (`*` may reconcile every Runtime).
            tracing::info!(cluster = %r.cluster, runtimes = triggered, reason = %r.reason,
                "reconciling after resync-required from the hub");
        }
        Ok(Accepted::All)
    }
}

/// Whether an event can unblock a failed module: a Namespace or CRD created or deleted, a
/// `Module` object chosen or changed in the cluster, or the module inventory (a manager Ready).
pub fn unblocks(e: &fleetwatch_protocol::event::Event) -> bool {
    e.kind == fleetwatch_protocol::event::TYPE_INVENTORY
        || e.subject.starts_with("v1/Namespace/")
        || e.subject.starts_with("operator.fleetwatch.dev/v1alpha1/Module/")
        || e.subject.starts_with("apiextensions.k8s.io/v1/CustomResourceDefinition/")
        || e.subject.starts_with("apiextensions.k8s.io/v1beta1/CustomResourceDefinition/")
}

/// Most changes named in one log line.
const CHANGES_NAMED: usize = 3;

/// What changed in `cluster` among `events`, for a log line: `<type> <subject>` of the first
/// few, then how many more (`applied example.com/v1/RedisConfig/redis-system/default`).
pub fn changes_in(events: &[fleetwatch_protocol::event::Event], cluster: &str) -> String {
    let mine: Vec<_> = events.iter().filter(|e| e.cluster == cluster).collect();
    let mut parts: Vec<String> = mine
        .iter()
        .take(CHANGES_NAMED)
        .map(|e| format!("{} {}", e.kind.rsplit('.').next().unwrap_or(&e.kind), e.subject))
        .collect();
    if mine.len() > CHANGES_NAMED {
        parts.push(format!("and {} more", mine.len() - CHANGES_NAMED));
    }
    parts.join(", ")
}

/// Follows the hub: deliveries go into a [`TriggerSink`] (only the Runtimes this instance
/// `owns` are triggered) until `cancel` or the operator stops.
pub async fn follow_hub(
    opts: SubscriberOptions,
    runtimes: Store<Runtime>,
    owns: Owns,
    trigger: mpsc::Sender<ObjectRef<Runtime>>,
    changes: std::sync::Arc<crate::retry::ClusterChanges>,
    cancel: CancellationToken,
) {
    let mut sub = loop {
        let connecting = Subscription::connect(opts.clone());
        tokio::select! {
            _ = cancel.cancelled() => return,
            res = connecting => match res {
                Ok(s) => break s,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot subscribe to the hub; retrying (reconciles fall back to resyncs)");
                    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
                }
            }
        }
    };
    tracing::info!("subscribed to the hub");
    let mut sink = TriggerSink::new(runtimes, owns, trigger).with_changes(changes);
    loop {
        match pump(&mut sub, &mut sink, &cancel).await {
            Ok(_) => return,
            Err(PumpError::Sink(e)) => {
                tracing::debug!(error = %e, "no longer following the hub");
                return;
            }
            Err(PumpError::Subscription(e)) => {
                tracing::warn!(error = %e, "hub subscription failed");
                tokio::select! {
                    _ = cancel.cancelled() => return,
                    _ = tokio::time::sleep(std::time::Duration::from_secs(1)) => {}
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_protocol::message::ResyncRequired;
    use kube::runtime::{reflector, watcher};

    #[test]
    fn changes_name_the_first_few_events_of_the_cluster() {
        use fleetwatch_protocol::event::{Event, ObjectKey};
        use serde_json::json;
        let key = |n: &str| ObjectKey::new("example.com/v1", "RedisConfig", Some("redis-system"), n);
        let evs: Vec<Event> = (1..=5)
            .map(|i| Event::applied(if i == 2 { "other" } else { "c1" }, 1, i, &key(&format!("n{i}")), json!({})))
            .collect();
        assert_eq!(
            changes_in(&evs, "c1"),
            "applied example.com/v1/RedisConfig/redis-system/n1, applied example.com/v1/RedisConfig/redis-system/n3, \
             applied example.com/v1/RedisConfig/redis-system/n4, and 1 more"
        );
        assert_eq!(changes_in(&evs[1..2], "other"), "applied example.com/v1/RedisConfig/redis-system/n2");
    }

    #[test]
    fn runtimes_waiting_for_a_rollout_are_found_by_their_typed_reason() {
        use fleetwatch_api::{ModuleReleaseMetaSpec, ModuleStatus, RuntimeStatus};
        let (store, mut writer) = reflector::store::<Runtime>();
        let runtime = |name: &str, module: &str, reason: Option<ModuleReason>, message: &str| {
            let mut rt = Runtime::new(name, Default::default());
            rt.metadata.namespace = Some("kcp".into());
            rt.status = Some(RuntimeStatus {
                modules: vec![ModuleStatus {
                    name: module.into(),
                    reason,
                    message: message.into(),
                    ..Default::default()
                }],
                ..Default::default()
            });
            rt
        };
        for rt in [
            runtime("waits", "redis", Some(ModuleReason::WaitingForRollout), "waiting to record the rollout admission"),
            // The same words without the reason (a message people read) wake nothing.
            runtime("says-so", "redis", None, "waiting for rollout of redis 2.0.0"),
            runtime("window", "redis", Some(ModuleReason::WaitingForMaintenanceWindow), ""),
            runtime("other-module", "nats", Some(ModuleReason::WaitingForRollout), ""),
        ] {
            writer.apply_watcher_event(&watcher::Event::Apply(rt));
        }
        let mut meta = ModuleReleaseMeta::new(
            "redis",
            ModuleReleaseMetaSpec { module_name: "redis".into(), ..Default::default() },
        );
        meta.metadata.namespace = Some("kcp".into());
        let names: Vec<String> = waiting_for_rollout(&store, &meta).into_iter().map(|r| r.name).collect();
        assert_eq!(names, ["waits"]);
    }

    #[tokio::test]
    async fn hub_events_trigger_only_the_runtimes_of_held_shards() {
        let (store, mut writer) = reflector::store::<Runtime>();
        for i in 0..30 {
            let mut rt = Runtime::new(&format!("rt{i}"), Default::default());
            rt.metadata.namespace = Some("kcp".into());
            writer.apply_watcher_event(&watcher::Event::Apply(rt));
        }
        let owns: Owns = std::sync::Arc::new(|rt: &Runtime| crate::shards::shard_of_runtime(rt, 3) == 1);
        let (tx, mut rx) = mpsc::channel(100);
        let mut sink = TriggerSink::new(store, owns, tx);
        let all = Delivery::ResyncRequired(ResyncRequired { cluster: "*".into(), cursor: 1, reason: String::new() });
        assert!(matches!(sink.deliver(&all).await, Ok(Accepted::All)));
        let mut triggered = Vec::new();
        while let Ok(r) = rx.try_recv() {
            triggered.push(r.name);
        }
        triggered.sort();
        let mut expected: Vec<String> =
            (0..30).map(|i| format!("rt{i}")).filter(|n| crate::shards::shard_of("kcp", n, 3) == 1).collect();
        expected.sort();
        assert!(!expected.is_empty() && expected.len() < 30);
        assert_eq!(triggered, expected);
    }
}
