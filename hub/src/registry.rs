//! What the hub knows about each cluster, connected or not, and which session serves it.

use std::collections::HashMap;
use std::sync::Mutex;

use fleetwatch_shared::protocol::{ModuleInventory, WatchState};
use serde::Serialize;
use tokio_util::sync::CancellationToken;

/// One cluster as the admin API shows it.
#[derive(Debug, Clone, Serialize, Default)]
#[serde(rename_all = "camelCase")]
pub struct ClusterStatus {
    /// The cluster id.
    pub cluster: String,
    /// Whether an agent session is open.
    pub connected: bool,
    /// The open session's id.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub session: Option<String>,
    /// The agent's address.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub remote: Option<String>,
    /// The agent's version.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_version: Option<String>,
    /// When the hub last heard from the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<jiff::Timestamp>,
    /// The agent's current epoch.
    pub epoch: u64,
    /// The highest seq acked in that epoch.
    pub acked_seq: u64,
    /// Events accepted since the hub started.
    pub events_received: u64,
    /// Sessions opened since the hub started.
    pub sessions: u64,
    /// The module inventory the agent reported last.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub inventory: Vec<ModuleInventory>,
    /// How each configured watch is doing in the agent.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub watches: Vec<WatchState>,
}

struct Entry {
    status: ClusterStatus,
    cancel: Option<CancellationToken>,
}

/// Live sessions and per-cluster state. One session per cluster: a new one replaces the old.
#[derive(Default)]
pub struct SessionRegistry {
    clusters: Mutex<HashMap<String, Entry>>,
}

impl SessionRegistry {
    /// Registers a new session for `cluster`, cancelling the one it replaces.
    pub fn open(&self, cluster: &str, session: &str, remote: &str, agent_version: &str, cancel: CancellationToken) {
        let Ok(mut map) = self.clusters.lock() else { return };
        let e = map.entry(cluster.to_string()).or_insert_with(|| Entry {
            status: ClusterStatus { cluster: cluster.into(), ..ClusterStatus::default() },
            cancel: None,
        });
        if let Some(old) = e.cancel.replace(cancel) {
            old.cancel();
        }
        e.status.connected = true;
        e.status.session = Some(session.into());
        e.status.remote = Some(remote.into());
        e.status.agent_version = Some(agent_version.into());
        e.status.last_seen = Some(jiff::Timestamp::now());
        e.status.sessions += 1;
    }

    /// Marks the session closed, unless a newer one already replaced it.
    pub fn close(&self, cluster: &str, session: &str) {
        let Ok(mut map) = self.clusters.lock() else { return };
        if let Some(e) = map.get_mut(cluster)
            && e.status.session.as_deref() == Some(session)
        {
            e.status.connected = false;
            e.status.session = None;
            e.cancel = None;
        }
    }

    /// Records accepted events.
    pub fn acked(&self, cluster: &str, epoch: u64, seq: u64, events: u64) {
        let Ok(mut map) = self.clusters.lock() else { return };
        if let Some(e) = map.get_mut(cluster) {
            e.status.epoch = epoch;
            e.status.acked_seq = seq;
            e.status.events_received += events;
            e.status.last_seen = Some(jiff::Timestamp::now());
        }
    }

    /// Records that the agent was heard from.
    pub fn seen(&self, cluster: &str) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.last_seen = Some(jiff::Timestamp::now());
        }
    }

    /// Records an inventory report.
    pub fn inventory(&self, cluster: &str, modules: Vec<ModuleInventory>) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.inventory = modules;
        }
    }

    /// Records a watch status report.
    pub fn watch_status(&self, cluster: &str, watches: Vec<WatchState>) {
        if let Ok(mut map) = self.clusters.lock()
            && let Some(e) = map.get_mut(cluster)
        {
            e.status.watches = watches;
        }
    }

    /// All clusters, sorted by id.
    pub fn list(&self) -> Vec<ClusterStatus> {
        let Ok(map) = self.clusters.lock() else { return Vec::new() };
        let mut v: Vec<_> = map.values().map(|e| e.status.clone()).collect();
        v.sort_by(|a, b| a.cluster.cmp(&b.cluster));
        v
    }
}
