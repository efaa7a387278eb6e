//! The agent's source in the simulation: list and watch a [`ClusterModel`] the way the
//! Kubernetes source lists and watches an API server, through the real change filter
//! ([`fleetwatch_agent::filter::WatchFilter`]: digests, the relist diff, synthetic deletes).
//!
//! A new source knows nothing (like a restarted agent): it lists, then follows the watch
//! history from the list's version, polling it every [`POLL`]; when the history it needs
//! was compacted it relists, and the filter turns objects that vanished meanwhile into
//! deletes.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use fleetwatch_agent::filter::WatchFilter;
use fleetwatch_agent::source::{Change, Source, SourceIo};
use fleetwatch_protocol::message::WatchSpec;

use crate::cluster::{ClusterModel, WatchEvent};

/// How often the watch looks for new writes (simulated time).
pub const POLL: Duration = Duration::from_millis(20);
/// The watch's name in events.
pub const WATCH: &str = "objects";

/// The watch every simulated agent runs: ConfigMaps, changes of `spec`, `spec` projected.
pub fn watch_spec() -> WatchSpec {
    serde_json::from_value(serde_json::json!({
        "name": WATCH, "version": "v1", "kind": "ConfigMap", "fields": ["spec"], "project": ["spec"],
    }))
    .expect("a valid watch spec")
}

/// Lists and watches one simulated cluster.
pub struct SimSource {
    /// The cluster.
    pub cluster: Arc<Mutex<ClusterModel>>,
}

impl Source for SimSource {
    fn describe(&self) -> String {
        "simulated cluster".into()
    }

    async fn run(self, io: SourceIo) {
        let mut filter = WatchFilter::new(&watch_spec(), "v1", "ConfigMap");
        'relist: loop {
            // A list: the filter diffs it against what it knew.
            let (objects, mut rv) = lock(&self.cluster).list();
            filter.relist_started();
            let mut changes: Vec<Change> = objects.iter().filter_map(|o| filter.listed(o)).collect();
            let mut vanished = filter.relist_done();
            // The filter's map has no order; the simulation must replay exactly.
            vanished.sort_by(|a, b| a.key.name.cmp(&b.key.name));
            changes.extend(vanished);
            if !send_all(&io, changes).await {
                return;
            }
            // The watch.
            loop {
                tokio::select! {
                    _ = io.shutdown.cancelled() => return,
                    _ = tokio::time::sleep(POLL) => {}
                }
                let writes = match lock(&self.cluster).watch_since(rv) {
                    Ok(w) => w,
                    Err(_gone) => continue 'relist,
                };
                let mut changes = Vec::new();
                for (v, write) in writes {
                    rv = v;
                    let change = match &write {
                        WatchEvent::Applied(obj) => filter.applied(obj),
                        WatchEvent::Deleted(obj) => filter.deleted(obj),
                    };
                    changes.extend(change);
                }
                if !send_all(&io, changes).await {
                    return;
                }
            }
        }
    }
}

fn lock(c: &Mutex<ClusterModel>) -> std::sync::MutexGuard<'_, ClusterModel> {
    c.lock().unwrap_or_else(|e| e.into_inner())
}

/// Sends `changes` in order; false when the agent is gone or shutting down.
async fn send_all(io: &SourceIo, changes: Vec<Change>) -> bool {
    for ch in changes {
        tokio::select! {
            _ = io.shutdown.cancelled() => return false,
            sent = io.changes.send(ch) => if sent.is_err() { return false },
        }
    }
    true
}
