//! Writes each WatchConfig resource's status in the control plane: `Accepted` (True, or
//! False with the reason and what is wrong), `observedGeneration`, and the number of
//! clusters whose agent runs it.
//!
//! Several hub replicas may read the same control plane; they do not fight over the status:
//! each computes it from the same inputs (the resource, and the fleet's cluster list merged
//! over the replicas sharing the bus), writes only when it differs from what the resource
//! already says, and a change of the cluster count alone is written at most once per
//! [`COUNT_EVERY`] by each replica (counts move with every agent that connects).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use fleetwatch_api::module::Condition;
use fleetwatch_api::watchconfig::{WatchConfig, WatchConfigStatus};
use kube::api::{Patch, PatchParams};
use tokio_util::sync::CancellationToken;

use crate::context::Context;
use crate::watch_source::{CONTROL_PLANE, Verdict};

/// How often the statuses are compared with what they should say.
const EVERY: Duration = Duration::from_secs(2);
/// Least time between two writes of one resource whose only change is its cluster count.
pub(crate) const COUNT_EVERY: Duration = Duration::from_secs(10);
/// After a failed write (no RBAC for `watchconfigs/status`, a CRD without the status
/// subresource), the resource is left alone this long: one warning, not one per tick.
const RETRY_FAILED_AFTER: Duration = Duration::from_secs(60);

/// The status a verdict makes, keeping the condition's transition time when its status and
/// reason did not change.
pub(crate) fn desired(v: &Verdict, clusters: u32, now: jiff::Timestamp) -> WatchConfigStatus {
    let (status, reason) = if v.accepted { ("True", "Accepted") } else { ("False", v.reason.as_str()) };
    let previous = v.observed.as_ref().and_then(|o| o.conditions.iter().find(|c| c.type_ == "Accepted"));
    let since = match previous {
        Some(c) if c.status == status && c.reason == reason => c.last_transition_time.clone(),
        _ => None,
    };
    let message = if v.accepted { "pushed to agents".to_string() } else { v.message.clone() };
    WatchConfigStatus {
        observed_generation: v.generation,
        conditions: vec![Condition {
            type_: "Accepted".into(),
            status: status.into(),
            reason: reason.into(),
            message,
            last_transition_time: since.or_else(|| Some(now.to_string())),
        }],
        clusters: if v.accepted { clusters } else { 0 },
    }
}

/// Whether `desired` must be written over what the resource says (`observed`), given when
/// this replica last wrote it.
pub(crate) fn needs_write(
    observed: Option<&WatchConfigStatus>,
    desired: &WatchConfigStatus,
    last_write: Option<Instant>,
    now: Instant,
) -> bool {
    let Some(observed) = observed else { return true };
    let same = |a: &WatchConfigStatus, b: &WatchConfigStatus| {
        a.observed_generation == b.observed_generation
            && a.conditions.len() == b.conditions.len()
            && a.conditions.iter().zip(&b.conditions).all(|(x, y)| {
                (&x.type_, &x.status, &x.reason, &x.message) == (&y.type_, &y.status, &y.reason, &y.message)
            })
    };
    if !same(observed, desired) {
        return true;
    }
    observed.clusters != desired.clusters && last_write.is_none_or(|t| now.duration_since(t) >= COUNT_EVERY)
}

/// Keeps the statuses current until shutdown.
pub(crate) async fn run(ctx: Arc<Context>, kubeconfig: Option<PathBuf>, shutdown: CancellationToken) {
    let client = tokio::select! {
        c = crate::watch_source::control_plane_client(kubeconfig) => c,
        _ = shutdown.cancelled() => return,
    };
    let api: kube::Api<WatchConfig> = kube::Api::all(client);
    let mut written: HashMap<String, Instant> = HashMap::new();
    let mut failed: HashMap<String, Instant> = HashMap::new();
    let mut tick = tokio::time::interval(EVERY);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let verdicts: Vec<Verdict> = match ctx.watch_verdicts.read() {
            Ok(v) => v.iter().filter(|v| v.source == CONTROL_PLANE).cloned().collect(),
            Err(_) => continue,
        };
        if verdicts.is_empty() {
            continue;
        }
        let counts = crate::fleet::rows::clusters_by_watch(&crate::admin::cluster_rows(&ctx));
        let now = jiff::Timestamp::now();
        failed.retain(|_, t| t.elapsed() < RETRY_FAILED_AFTER);
        for v in verdicts {
            if failed.contains_key(&v.name) {
                continue;
            }
            let want = desired(&v, counts.get(&v.name).copied().unwrap_or(0), now);
            if !needs_write(v.observed.as_ref(), &want, written.get(&v.name).copied(), Instant::now()) {
                continue;
            }
            let patch = serde_json::json!({ "status": want });
            match api.patch_status(&v.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    tracing::debug!(watch = %v.name, accepted = v.accepted, "wrote WatchConfig status");
                    written.insert(v.name.clone(), Instant::now());
                }
                Err(e) => {
                    tracing::warn!(watch = %v.name, error = %e, "cannot write the WatchConfig's status (RBAC: watchconfigs/status patch; retrying in {}s)", RETRY_FAILED_AFTER.as_secs());
                    failed.insert(v.name.clone(), Instant::now());
                }
            }
        }
        written.retain(|_, t| t.elapsed() < COUNT_EVERY * 6);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(accepted: bool) -> Verdict {
        Verdict {
            name: "w".into(),
            source: CONTROL_PLANE.into(),
            generation: Some(3),
            accepted,
            reason: if accepted { "Accepted".into() } else { "Invalid".into() },
            message: if accepted { String::new() } else { "labelSelector \"(\": bad".into() },
            ..Verdict::default()
        }
    }

    #[test]
    fn the_status_says_accepted_or_why_not() {
        let now: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let ok = desired(&verdict(true), 4, now);
        assert_eq!((ok.observed_generation, ok.clusters), (Some(3), 4));
        assert_eq!((ok.conditions[0].status.as_str(), ok.conditions[0].reason.as_str()), ("True", "Accepted"));
        let bad = desired(&verdict(false), 4, now);
        assert_eq!(bad.clusters, 0, "never pushed");
        let c = &bad.conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("False", "Invalid"));
        assert!(c.message.contains("labelSelector"));
        // The transition time stays while the condition does not change.
        let mut again = verdict(false);
        again.observed = Some(bad.clone());
        let later = desired(&again, 0, "2030-01-02T00:00:00Z".parse().unwrap());
        assert_eq!(later.conditions[0].last_transition_time.as_deref(), Some("2030-01-01T00:00:00Z"));
    }

    #[test]
    fn only_a_difference_is_written_and_counts_are_throttled() {
        let now: jiff::Timestamp = "2030-01-01T00:00:00Z".parse().unwrap();
        let t = Instant::now();
        let want = desired(&verdict(true), 2, now);
        assert!(needs_write(None, &want, None, t), "no status yet");
        assert!(!needs_write(Some(&want), &want, None, t), "already says so (another replica wrote it)");
        let mut other_count = want.clone();
        other_count.clusters = 1;
        assert!(needs_write(Some(&other_count), &want, None, t));
        assert!(!needs_write(Some(&other_count), &want, Some(t), t), "count written just now");
        assert!(needs_write(Some(&other_count), &want, Some(t), t + COUNT_EVERY));
        let rejected = desired(&verdict(false), 0, now);
        assert!(needs_write(Some(&want), &rejected, Some(t), t), "acceptance changes are written at once");
    }
}
