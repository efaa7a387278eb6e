//! The fleet at a glance, for the web view and `fleetwatch status`: Runtime statuses read
//! from the control plane (a watch, bounded; the hub never writes there), and the
//! overview document the web view receives live (clusters with event rates, subscriptions,
//! modules by state).

pub mod entry;
pub(crate) mod rows;
pub(crate) mod state;
pub(crate) mod writer;

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};

use fleetwatch_api::Runtime;
use fleetwatch_api::summary::RuntimeSummary;
use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::cluster::ClusterStatus;
use fleetwatch_protocol::message::WatchPhase;

/// Most Runtimes kept (the list stops there and says so).
pub(crate) const MAX_RUNTIMES: usize = 20_000;
/// Most modules kept per Runtime.
pub(crate) const MAX_MODULES: usize = 64;
/// Most clusters in one overview document (those not connected first); the rest are
/// counted in `clustersOmitted`.
pub(crate) const OVERVIEW_CLUSTERS: usize = 2_000;
/// Most Runtimes in one overview document (unhealthy ones first).
pub(crate) const OVERVIEW_RUNTIMES: usize = 2_000;

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
    pub(crate) fn labels(&self, cluster: &str) -> Option<&BTreeMap<String, String>> {
        self.labels_by_cluster.get(cluster)
    }
}

/// Labels by cluster id from Runtimes sorted by namespace/name (the first one wins).
fn labels_by_cluster(items: &[RuntimeSummary]) -> HashMap<String, BTreeMap<String, String>> {
    let mut out = HashMap::new();
    for s in items {
        out.entry(s.cluster.clone()).or_insert_with(|| s.labels.clone());
    }
    out
}

/// Shared view of the Runtimes.
pub(crate) type SharedRuntimes = Arc<RwLock<RuntimesView>>;

/// Most changes of the Runtimes view published per second: a watch event updates the table
/// at once, the shared copy (cloned for every reader) at most this often.
pub(crate) const RUNTIME_PUBLISH: Duration = Duration::from_millis(200);

/// The Runtimes of the control plane as the watch reports them, bounded by
/// [`MAX_RUNTIMES`]: the pure core of [`follow_runtimes`].
#[derive(Debug, Default)]
pub(crate) struct RuntimeTable {
    shown: std::collections::BTreeMap<String, RuntimeSummary>,
    /// Runtimes not shown: undecodable, or beyond [`MAX_RUNTIMES`] (names only, bounded by
    /// [`MAX_SKIPPED_NAMES`]; past that they are counted in `lost_count`).
    skipped: std::collections::BTreeSet<String>,
    lost_count: usize,
    /// A list being read (the watch started or restarted): replaces the table when done.
    building: Option<Box<RuntimeTable>>,
}

/// Most names of Runtimes not shown that are remembered (so a deletion uncounts them).
pub(crate) const MAX_SKIPPED_NAMES: usize = 100_000;

impl RuntimeTable {
    /// The watch (re)starts its list: what follows until [`Self::initial_done`] replaces
    /// the table.
    pub(crate) fn restart(&mut self) {
        self.building = Some(Box::default());
    }

    /// One Runtime of the initial list (`None`: it could not be decoded).
    pub(crate) fn apply_initial(&mut self, key: &str, summary: Option<RuntimeSummary>) {
        if let Some(b) = self.building.as_mut() {
            b.apply(key, summary);
        }
    }

    /// The initial list is complete.
    pub(crate) fn initial_done(&mut self) {
        if let Some(b) = self.building.take() {
            *self = *b;
        }
    }

    /// A Runtime added or changed (`None`: it could not be decoded).
    pub(crate) fn apply(&mut self, key: &str, summary: Option<RuntimeSummary>) {
        match summary {
            Some(s) if self.shown.contains_key(key) || self.shown.len() < MAX_RUNTIMES => {
                self.skipped.remove(key);
                self.shown.insert(key.to_string(), s);
            }
            _ => {
                self.shown.remove(key);
                if self.skipped.len() < MAX_SKIPPED_NAMES {
                    self.skipped.insert(key.to_string());
                } else if !self.skipped.contains(key) {
                    self.lost_count += 1;
                }
            }
        }
    }

    /// A Runtime deleted.
    pub(crate) fn delete(&mut self, key: &str) {
        if self.shown.remove(key).is_none() && !self.skipped.remove(key) {
            self.lost_count = self.lost_count.saturating_sub(1);
        }
    }

    /// Runtimes not shown (undecodable or beyond the bound).
    pub(crate) fn skipped(&self) -> usize {
        self.skipped.len() + self.lost_count
    }

    /// The Runtimes shown, by `namespace/name`.
    pub(crate) fn items(&self) -> Vec<RuntimeSummary> {
        self.shown.values().cloned().collect()
    }
}

/// Follows the Runtimes of the control plane with a watch until shutdown: a deleted or
/// changed Runtime is in the view (and the web view's live table) within a fraction of a
/// second, with no periodic list of the whole fleet. `changed` is bumped on each update of
/// the view, so the live overview is rebuilt at once.
pub(crate) async fn follow_runtimes(
    kubeconfig: Option<PathBuf>,
    view: SharedRuntimes,
    changed: tokio::sync::watch::Sender<u64>,
    shutdown: CancellationToken,
) {
    use futures_util::StreamExt as _;
    use kube::runtime::watcher;
    if let Ok(mut v) = view.write() {
        v.configured = true;
    }
    let client = tokio::select! {
        c = crate::watch_source::control_plane_client(kubeconfig) => c,
        _ = shutdown.cancelled() => return,
    };
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client, &kube::core::ApiResource::erase::<Runtime>(&()));
    // Pages of 500 for the initial list, as before: the list of a large fleet stays bounded
    // per answer.
    let stream = fleetwatch_client::kube_watch::relisting_watcher(api, watcher::Config::default().page_size(500));
    futures_util::pin_mut!(stream);
    let mut table = RuntimeTable::default();
    let mut synced = false;
    let mut dirty = false;
    let mut last_publish: Option<tokio::time::Instant> = None;
    loop {
        let publish_at = last_publish.map_or_else(tokio::time::Instant::now, |t| t + RUNTIME_PUBLISH);
        tokio::select! {
            ev = stream.next() => {
                let Some(ev) = ev else { return };
                match ev {
                    Ok(watcher::Event::Init) => table.restart(),
                    Ok(watcher::Event::InitApply(obj)) => {
                        let (key, summary) = summarise(&obj);
                        table.apply_initial(&key, summary);
                    }
                    Ok(watcher::Event::InitDone) => {
                        table.initial_done();
                        synced = true;
                        dirty = true;
                    }
                    Ok(watcher::Event::Apply(obj)) => {
                        let (key, summary) = summarise(&obj);
                        table.apply(&key, summary);
                        dirty = synced;
                    }
                    Ok(watcher::Event::Delete(obj)) => {
                        table.delete(&runtime_key(&obj));
                        dirty = synced;
                    }
                    Err(e) => {
                        let e = format!("watching Runtimes: {e}");
                        let Ok(mut v) = view.write() else { return };
                        if v.error.as_deref() != Some(e.as_str()) {
                            tracing::warn!(error = %e, "cannot watch Runtimes in the control plane (web view and status show the last state; retrying)");
                        }
                        v.error = Some(e);
                    }
                }
            }
            _ = tokio::time::sleep_until(publish_at), if dirty => {}
            _ = shutdown.cancelled() => return,
        }
        if dirty && last_publish.is_none_or(|t| t.elapsed() >= RUNTIME_PUBLISH) {
            let items = table.items();
            let labels = labels_by_cluster(&items);
            let Ok(mut v) = view.write() else { return };
            v.items = items;
            v.labels_by_cluster = labels;
            v.skipped = table.skipped();
            v.error = None;
            v.updated = Some(jiff::Timestamp::now());
            drop(v);
            changed.send_modify(|n| *n = n.wrapping_add(1));
            dirty = false;
            last_publish = Some(tokio::time::Instant::now());
        }
    }
}

/// A Runtime's `namespace/name`.
fn runtime_key(obj: &kube::api::DynamicObject) -> String {
    format!(
        "{}/{}",
        obj.metadata.namespace.as_deref().unwrap_or_default(),
        obj.metadata.name.as_deref().unwrap_or_default()
    )
}

/// A Runtime's `namespace/name` and its summary (`None` when it cannot be decoded).
fn summarise(obj: &kube::api::DynamicObject) -> (String, Option<RuntimeSummary>) {
    let key = runtime_key(obj);
    let summary = serde_json::to_value(obj).and_then(serde_json::from_value::<Runtime>).ok().map(|rt| {
        let mut s = RuntimeSummary::from_runtime(&rt);
        s.modules.truncate(MAX_MODULES);
        s
    });
    (key, summary)
}

/// One cluster in the overview.
#[derive(Debug, Clone, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct ClusterRow {
    /// Cluster id.
    pub(crate) cluster: String,
    /// Whether its agent is connected.
    pub(crate) connected: bool,
    /// When the hub last heard from it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) last_seen: Option<jiff::Timestamp>,
    /// Events accepted since the hub started.
    pub(crate) events_received: u64,
    /// Events per second over the last interval.
    pub(crate) events_per_sec: f64,
    /// Watches running.
    pub(crate) watches_running: usize,
    /// Watches failing (any phase but running, starting and `waiting-for-kind`).
    pub(crate) watches_failed: usize,
    /// Watches waiting for a kind that nothing installed yet (healthy, not failing).
    pub(crate) watches_waiting: usize,
    /// The agent's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) agent_version: Option<String>,
    /// The protocol version the agent's session speaks.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) protocol: Option<u32>,
    /// The hub replica it is connected to (shared bus).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) hub: Option<String>,
}

/// Watches (running, failed, waiting for their kind) of a cluster's report.
pub(crate) fn watch_counts(c: &ClusterStatus) -> (usize, usize, usize) {
    let count = |f: &dyn Fn(WatchPhase) -> bool| c.watches.iter().filter(|w| f(w.phase)).count();
    (count(&|p| p == WatchPhase::Running), count(&|p| p.is_failing()), count(&|p| p == WatchPhase::WaitingForKind))
}

/// Turns cluster totals into rates between two overviews.
#[derive(Default)]
pub(crate) struct Rates {
    last: HashMap<String, u64>,
    last_total: u64,
    at: Option<Instant>,
}

impl Rates {
    /// Each cluster's events per second (in the order given) and the whole fleet's, from
    /// their event totals since the last call. Rounded to a tenth; 0 on the first call.
    pub(crate) fn rates<'a>(
        &mut self,
        clusters: impl ExactSizeIterator<Item = (&'a str, u64)>,
        total: u64,
    ) -> (Vec<f64>, f64) {
        let now = Instant::now();
        let dt = self.at.map(|t| now.duration_since(t).as_secs_f64()).filter(|d| *d > 0.05);
        let round = |r: f64| (r * 10.0).round() / 10.0;
        let mut next = HashMap::with_capacity(clusters.len());
        let rates = clusters
            .map(|(cluster, events)| {
                let before = self.last.get(cluster).copied();
                next.insert(cluster.to_string(), events);
                match (dt, before) {
                    (Some(dt), Some(b)) => round(events.saturating_sub(b) as f64 / dt),
                    _ => 0.0,
                }
            })
            .collect();
        let all = dt.map_or(0.0, |dt| round(total.saturating_sub(self.last_total) as f64 / dt));
        self.last = next;
        self.last_total = total;
        self.at = Some(now);
        (rates, all)
    }
}

impl ClusterRow {
    /// The row of a cluster's status, with its rate and replica.
    pub(crate) fn of(c: &ClusterStatus, events_per_sec: f64, hub: Option<String>) -> Self {
        let (running, failed, waiting) = watch_counts(c);
        ClusterRow {
            cluster: c.cluster.clone(),
            connected: c.connected,
            last_seen: c.last_seen,
            events_received: c.events_received,
            events_per_sec,
            watches_running: running,
            watches_failed: failed,
            watches_waiting: waiting,
            agent_version: c.agent_version.clone(),
            protocol: c.protocol,
            hub,
        }
    }
}

/// Keeps at most `max` rows, those for which `first` is true ahead of the others (order
/// kept otherwise); returns how many were left out.
pub(crate) fn bounded<T>(rows: &mut Vec<T>, max: usize, first: impl Fn(&T) -> bool) -> usize {
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
    fn an_undecodable_runtime_is_counted_not_shown() {
        let mut table = RuntimeTable::default();
        table.restart();
        table.apply_initial("kcp/rt-1", None);
        table.initial_done();
        assert_eq!(table.skipped(), 1, "an undecodable Runtime is counted, not shown");
        table.delete("kcp/rt-1");
        assert_eq!(table.skipped(), 0);
    }

    #[test]
    fn rates_follow_the_totals() {
        let mut rates = Rates::default();
        let (each, all) = rates.rates([("a", 100), ("b", 7)].into_iter(), 1_000);
        assert_eq!((each, all), (vec![0.0, 0.0], 0.0), "no rate before a second sample");
        rates.at = Some(Instant::now() - Duration::from_secs(2));
        let (each, all) = rates.rates([("a", 300), ("c", 5)].into_iter(), 1_400);
        assert!((each[0] - 100.0).abs() < 5.0, "{each:?}");
        assert_eq!(each[1], 0.0, "a cluster new since the last call has no rate yet");
        assert!((all - 200.0).abs() < 10.0, "{all}");
    }

    fn summary(key: &str) -> Option<RuntimeSummary> {
        Some(RuntimeSummary {
            runtime: key.into(),
            cluster: key.replace('/', "-"),
            state: None,
            modules_by_state: Default::default(),
            modules: Vec::new(),
            labels: Default::default(),
        })
    }

    fn shown(table: &RuntimeTable) -> Vec<String> {
        table.items().into_iter().map(|s| s.runtime).collect()
    }

    #[test]
    fn the_runtime_table_follows_the_watch() {
        let mut t = RuntimeTable::default();
        t.restart();
        t.apply_initial("a/1", summary("a/1"));
        t.apply_initial("a/2", summary("a/2"));
        t.apply_initial("a/bad", None);
        assert!(shown(&t).is_empty(), "nothing before the initial list is complete");
        t.initial_done();
        assert_eq!((shown(&t), t.skipped()), (vec!["a/1".to_string(), "a/2".into()], 1));
        t.delete("a/1");
        t.apply("a/3", summary("a/3"));
        assert_eq!(shown(&t), ["a/2", "a/3"], "a deleted Runtime leaves at once");
        // A Runtime that becomes undecodable is no longer shown (its old state would be a
        // false calm) and is counted; fixed, it is back.
        t.apply("a/2", None);
        assert_eq!((shown(&t), t.skipped()), (vec!["a/3".to_string()], 2));
        t.apply("a/2", summary("a/2"));
        t.delete("a/bad");
        assert_eq!((shown(&t), t.skipped()), (vec!["a/2".to_string(), "a/3".into()], 0));
        // A restarted watch (410 Gone, a reconnect) replaces the table with its new list:
        // what was deleted meanwhile is gone.
        t.restart();
        t.apply_initial("a/3", summary("a/3"));
        t.initial_done();
        assert_eq!(shown(&t), ["a/3"]);
    }

    #[test]
    fn the_runtime_table_is_bounded() {
        let mut t = RuntimeTable::default();
        for i in 0..MAX_RUNTIMES + 3 {
            let k = format!("n/{i:06}");
            t.apply(&k, summary(&k));
        }
        assert_eq!((t.items().len(), t.skipped()), (MAX_RUNTIMES, 3));
        // A shown one changing stays shown; one beyond the bound deleted is uncounted.
        t.apply("n/000000", summary("n/000000"));
        t.delete(&format!("n/{:06}", MAX_RUNTIMES + 1));
        assert_eq!((t.items().len(), t.skipped()), (MAX_RUNTIMES, 2));
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
