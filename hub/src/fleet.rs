//! The fleet at a glance, for the web view and `fleetwatch status`: Runtime statuses read
//! from the control plane (a periodic, bounded list; the hub never writes there), and the
//! overview document the web view receives live (clusters with event rates, subscriptions,
//! modules by state).

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fleetwatch_api::Runtime;
use fleetwatch_api::summary::RuntimeSummary;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::registry::ClusterStatus;
use fleetwatch_protocol::message::WatchPhase;

/// How often Runtime statuses are listed.
pub const RUNTIME_POLL: Duration = Duration::from_secs(5);
/// Most Runtimes kept (the list stops there and says so).
pub const MAX_RUNTIMES: usize = 20_000;
/// Most modules kept per Runtime.
pub const MAX_MODULES: usize = 64;
/// Most clusters in one overview document (those not connected first); the rest are
/// counted in `clustersOmitted`.
pub const OVERVIEW_CLUSTERS: usize = 2_000;
/// Most Runtimes in one overview document (unhealthy ones first).
pub const OVERVIEW_RUNTIMES: usize = 2_000;

/// What the hub knows of the Runtimes in the control plane.
#[derive(Debug, Clone, Default, Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct RuntimesView {
    /// Whether the hub reads Runtimes at all (it does when it reads WatchConfigs from the
    /// control plane).
    pub configured: bool,
    /// When the last list succeeded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub updated: Option<jiff::Timestamp>,
    /// Why the last list failed, if it did (the previous result is kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// Runtimes skipped: undecodable, or beyond [`MAX_RUNTIMES`].
    pub skipped: usize,
    /// The Runtimes, by namespace/name.
    pub items: Vec<RuntimeSummary>,
    /// Each cluster id's Runtime labels (the access policy's `clusterSelector`); a cluster
    /// id several Runtimes name gets the labels of the first by namespace/name.
    #[serde(skip)]
    pub labels_by_cluster: HashMap<String, BTreeMap<String, String>>,
}

impl RuntimesView {
    /// The labels of the Runtime of `cluster`, if the hub has read one.
    pub fn labels(&self, cluster: &str) -> Option<&BTreeMap<String, String>> {
        self.labels_by_cluster.get(cluster)
    }
}

/// Shared view of the Runtimes.
pub type SharedRuntimes = Arc<RwLock<RuntimesView>>;

/// Lists Runtimes every [`RUNTIME_POLL`] until shutdown.
pub async fn follow_runtimes(kubeconfig: Option<PathBuf>, view: SharedRuntimes, shutdown: CancellationToken) {
    if let Ok(mut v) = view.write() {
        v.configured = true;
    }
    let client = tokio::select! {
        c = crate::watch_source::control_plane_client(kubeconfig) => c,
        _ = shutdown.cancelled() => return,
    };
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client, &kube::core::ApiResource::erase::<Runtime>(&()));
    let mut tick = tokio::time::interval(RUNTIME_POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        let result = list(&api).await;
        let Ok(mut v) = view.write() else { return };
        match result {
            Ok((items, labels, skipped)) => {
                v.items = items;
                v.labels_by_cluster = labels;
                v.skipped = skipped;
                v.error = None;
                v.updated = Some(jiff::Timestamp::now());
            }
            Err(e) => {
                if v.error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(error = %e, "cannot list Runtimes in the control plane (web view and status show the last list)");
                }
                v.error = Some(e);
            }
        }
    }
}

/// One full list, in pages, bounded by [`MAX_RUNTIMES`].
async fn list(api: &kube::Api<kube::api::DynamicObject>) -> Result<RuntimeList, String> {
    let mut items = Vec::new();
    let mut labeled: Vec<(String, String, BTreeMap<String, String>)> = Vec::new();
    let mut skipped = 0;
    let mut params = kube::api::ListParams::default().limit(500);
    loop {
        let page = api.list(&params).await.map_err(|e| format!("listing Runtimes: {e}"))?;
        for obj in page.items {
            if items.len() >= MAX_RUNTIMES {
                skipped += 1;
                continue;
            }
            match serde_json::to_value(&obj).and_then(serde_json::from_value::<Runtime>) {
                Ok(rt) => {
                    let mut s = RuntimeSummary::from_runtime(&rt);
                    labeled.push((
                        s.runtime.clone(),
                        s.cluster.clone(),
                        rt.metadata.labels.clone().unwrap_or_default(),
                    ));
                    s.modules.truncate(MAX_MODULES);
                    items.push(s);
                }
                Err(_) => skipped += 1,
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) if items.len() < MAX_RUNTIMES => params = params.continue_token(&token),
            Some(_) => {
                // Beyond the bound: the rest are not read (counted as one page's worth unknown).
                skipped += 1;
                break;
            }
            None => break,
        }
    }
    items.sort_by(|a, b| a.runtime.cmp(&b.runtime));
    labeled.sort();
    let mut labels = HashMap::new();
    for (_, cluster, l) in labeled {
        labels.entry(cluster).or_insert(l);
    }
    Ok((items, labels, skipped))
}

/// A list of Runtimes: summaries, labels by cluster id, how many were skipped.
type RuntimeList = (Vec<RuntimeSummary>, HashMap<String, BTreeMap<String, String>>, usize);

/// One cluster in the overview.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ClusterRow {
    /// Cluster id.
    pub cluster: String,
    /// Whether its agent is connected.
    pub connected: bool,
    /// When the hub last heard from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<jiff::Timestamp>,
    /// Events accepted since the hub started.
    pub events_received: u64,
    /// Events per second over the last interval.
    pub events_per_sec: f64,
    /// Watches running.
    pub watches_running: usize,
    /// Watches failing (any phase but running, starting and `waiting-for-kind`).
    pub watches_failed: usize,
    /// Watches waiting for a kind that nothing installed yet (healthy, not failing).
    pub watches_waiting: usize,
    /// The agent's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// The protocol version the agent's session speaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// The hub replica it is connected to (shared bus).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub hub: Option<String>,
}

/// Watches (running, failed, waiting for their kind) of a cluster's report.
pub fn watch_counts(c: &ClusterStatus) -> (usize, usize, usize) {
    let count = |f: &dyn Fn(WatchPhase) -> bool| c.watches.iter().filter(|w| f(w.phase)).count();
    (count(&|p| p == WatchPhase::Running), count(&|p| p.is_failing()), count(&|p| p == WatchPhase::WaitingForKind))
}

/// Turns cluster totals into rates between two overviews.
#[derive(Default)]
pub struct Rates {
    last: HashMap<String, u64>,
    at: Option<Instant>,
}

impl Rates {
    /// Rows for `clusters`, with each cluster's events per second since the last call.
    pub fn rows(&mut self, clusters: &[ClusterStatus], hubs: &HashMap<String, String>) -> Vec<ClusterRow> {
        let now = Instant::now();
        let dt = self.at.map(|t| now.duration_since(t).as_secs_f64()).filter(|d| *d > 0.05);
        let mut next = HashMap::with_capacity(clusters.len());
        let rows = clusters
            .iter()
            .map(|c| {
                let before = self.last.get(&c.cluster).copied();
                next.insert(c.cluster.clone(), c.events_received);
                let rate = match (dt, before) {
                    (Some(dt), Some(b)) => c.events_received.saturating_sub(b) as f64 / dt,
                    _ => 0.0,
                };
                let (running, failed, waiting) = watch_counts(c);
                ClusterRow {
                    cluster: c.cluster.clone(),
                    connected: c.connected,
                    last_seen: c.last_seen,
                    events_received: c.events_received,
                    events_per_sec: (rate * 10.0).round() / 10.0,
                    watches_running: running,
                    watches_failed: failed,
                    watches_waiting: waiting,
                    agent_version: c.agent_version.clone(),
                    protocol: c.protocol,
                    hub: hubs.get(&c.cluster).cloned(),
                }
            })
            .collect();
        self.last = next;
        self.at = Some(now);
        rows
    }
}

/// Keeps at most `max` rows, those for which `first` is true ahead of the others (order
/// kept otherwise); returns how many were left out.
pub fn bounded<T>(rows: &mut Vec<T>, max: usize, first: impl Fn(&T) -> bool) -> usize {
    if rows.len() <= max {
        return 0;
    }
    rows.sort_by_key(|r| !first(r));
    let omitted = rows.len() - max;
    rows.truncate(max);
    omitted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rates_follow_the_totals() {
        let mut rates = Rates::default();
        let mut c = ClusterStatus { cluster: "a".into(), connected: true, events_received: 100, ..Default::default() };
        let rows = rates.rows(std::slice::from_ref(&c), &HashMap::new());
        assert_eq!(rows[0].events_per_sec, 0.0, "no rate before a second sample");
        rates.at = Some(Instant::now() - Duration::from_secs(2));
        c.events_received = 300;
        let rows = rates.rows(std::slice::from_ref(&c), &HashMap::new());
        assert!((rows[0].events_per_sec - 100.0).abs() < 5.0, "{}", rows[0].events_per_sec);
    }

    #[test]
    fn bounded_keeps_the_interesting_rows_first() {
        let mut rows: Vec<u32> = (0..10).collect();
        let omitted = bounded(&mut rows, 3, |r| r % 4 == 0);
        assert_eq!((rows, omitted), (vec![0, 4, 8], 7));
        let mut few = vec![1, 2];
        assert_eq!(bounded(&mut few, 3, |_| false), 0);
    }
}
