//! The fleet as rows ([`Row`]): what the admin lists filter, order and count by, for every
//! cluster, without building its JSON. A list request filters and pages the rows and builds
//! the JSON of the page's items only ([`Row::value`]); the summary and the live stream
//! count from the rows alone. At 50,000 clusters building every cluster's JSON for each
//! request was the term that grew (see docs/performance.md).

use fleetwatch_protocol::message::WatchPhase;
use serde::Deserialize;
use serde_json::Value;

use crate::cluster::ClusterStatus;
use crate::fleet::state::Cached;

/// What the lists need of a cluster's watches and modules.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Health {
    /// Watches in a failing phase.
    pub(crate) watches_failing: u32,
    /// The phases its watches are in, a bit per [`WatchPhase`] ([`phase_bit`]).
    pub(crate) phases: u8,
    /// Modules of the agent's inventory not ready.
    pub(crate) modules_not_ready: u32,
}

/// The bit of a phase in [`Health::phases`].
pub(crate) fn phase_bit(p: WatchPhase) -> u8 {
    1 << (p as u8)
}

impl Health {
    /// Of a status in this replica's registry.
    pub(crate) fn of(status: &ClusterStatus) -> Self {
        Self::from_parts(status.watches.iter().map(|w| Some(w.phase)), status.inventory.iter().map(|m| m.ready))
    }

    fn from_parts(phases: impl Iterator<Item = Option<WatchPhase>>, ready: impl Iterator<Item = bool>) -> Self {
        let mut h = Health::default();
        for p in phases.flatten() {
            h.phases |= phase_bit(p);
            h.watches_failing += u32::from(p.is_failing());
        }
        h.modules_not_ready = ready.filter(|r| !r).count() as u32;
        h
    }

    /// Of an entry's JSON, with its replica, whether it said connected and its watches'
    /// names, read without the rest of it; `None` when it is not an entry.
    pub(crate) fn of_entry(raw: &[u8]) -> Option<(String, bool, Self, WatchNames)> {
        /// The fields the rows need; the rest of the entry is skipped.
        #[derive(Deserialize)]
        struct Head {
            #[serde(default)]
            hub: String,
            #[serde(default)]
            connected: bool,
            #[serde(default)]
            watches: Vec<PhaseOnly>,
            #[serde(default)]
            inventory: Vec<ReadyOnly>,
        }
        #[derive(Deserialize)]
        struct PhaseOnly {
            #[serde(default)]
            name: String,
            #[serde(default)]
            phase: String,
        }
        #[derive(Deserialize)]
        struct ReadyOnly {
            #[serde(default)]
            ready: bool,
        }
        let head: Head = serde_json::from_slice(raw).ok()?;
        // A phase this release does not know (a newer agent's) counts as none.
        let phases = head.watches.iter().map(|w| serde_json::from_value(Value::String(w.phase.clone())).ok());
        let health = Self::from_parts(phases, head.inventory.iter().map(|m| m.ready));
        let names = head.watches.into_iter().map(|w| w.name.into_boxed_str()).collect();
        Some((head.hub, head.connected, health, names))
    }
}

/// The names of a cluster's watches (shared by the rows listing it).
pub(crate) type WatchNames = std::sync::Arc<[Box<str>]>;

/// Where a row's JSON comes from.
#[derive(Debug, Clone)]
enum Source {
    /// This replica's registry.
    Local(Box<ClusterStatus>),
    /// An entry of the fleet state.
    Entry(Cached),
    /// An older release's whole list.
    Legacy(Value),
}

/// One cluster of the merged fleet, as the lists see it.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    /// The cluster id.
    pub(crate) cluster: String,
    /// Whether it is shown connected.
    pub(crate) connected: bool,
    /// The replica its entry is from (`None`: a hub of its own bus).
    pub(crate) hub: Option<std::sync::Arc<str>>,
    /// Its watches and modules.
    pub(crate) health: Health,
    /// Events this replica accepted for it (other replicas' count through their heartbeats).
    pub(crate) own_events: u64,
    source: Source,
}

impl Row {
    /// A cluster of this replica's registry (`hub`: its name on a shared bus).
    pub(crate) fn local(status: ClusterStatus, hub: Option<&str>) -> Self {
        Row {
            cluster: status.cluster.clone(),
            connected: status.connected,
            hub: hub.map(std::sync::Arc::from),
            health: Health::of(&status),
            own_events: status.events_received,
            source: Source::Local(Box::new(status)),
        }
    }

    /// An entry of the fleet state, `connected` as shown.
    pub(crate) fn entry(cluster: &str, c: &Cached, connected: bool) -> Self {
        Row {
            cluster: cluster.to_string(),
            connected,
            hub: Some(c.hub.clone()),
            health: c.health,
            own_events: 0,
            source: Source::Entry(c.clone()),
        }
    }

    /// An entry of an older release's list.
    pub(crate) fn legacy(cluster: &str, hub: &str, mut v: Value) -> Self {
        v["hub"] = hub.into();
        let phases =
            v["watches"].as_array().into_iter().flatten().map(|w| serde_json::from_value(w["phase"].clone()).ok());
        let ready = v["inventory"].as_array().into_iter().flatten().map(|m| m["ready"] == true);
        let health = Health::from_parts(phases, ready);
        Row {
            cluster: cluster.to_string(),
            connected: v["connected"] == true,
            hub: Some(hub.into()),
            health,
            own_events: 0,
            source: Source::Legacy(v),
        }
    }

    /// The names of its watches (the WatchConfigs its agent runs).
    pub(crate) fn watch_names(&self) -> Vec<&str> {
        match &self.source {
            Source::Local(status) => status.watches.iter().map(|w| w.name.as_str()).collect(),
            Source::Entry(c) => c.watches.iter().map(|n| &**n).collect(),
            Source::Legacy(v) => {
                v["watches"].as_array().into_iter().flatten().filter_map(|w| w["name"].as_str()).collect()
            }
        }
    }

    /// Whether one of its watches is in phase `p`.
    pub(crate) fn has_phase(&self, p: WatchPhase) -> bool {
        self.health.phases & phase_bit(p) != 0
    }

    /// The cluster as the admin API lists it (with `hub` on a shared bus).
    pub(crate) fn value(self) -> Value {
        match self.source {
            Source::Local(status) => {
                let mut v = serde_json::to_value(*status).unwrap_or_default();
                if let (Some(hub), Some(obj)) = (self.hub, v.as_object_mut()) {
                    obj.insert("hub".into(), hub.to_string().into());
                }
                v
            }
            Source::Entry(c) => {
                let mut v: Value = serde_json::from_slice(&c.raw).unwrap_or_default();
                if let Some(obj) = v.as_object_mut() {
                    obj.remove("entryFormat");
                    obj.insert("connected".into(), self.connected.into());
                    obj.insert("hub".into(), c.hub.to_string().into());
                }
                v
            }
            Source::Legacy(v) => v,
        }
    }
}

/// Clusters per watch name: connected clusters whose agent reports the watch (any phase),
/// each counted once. One pass over the rows, no cluster's JSON.
pub(crate) fn clusters_by_watch(rows: &[Row]) -> std::collections::HashMap<String, u32> {
    let mut out: std::collections::HashMap<String, u32> = std::collections::HashMap::new();
    for r in rows.iter().filter(|r| r.connected) {
        let mut names = r.watch_names();
        names.sort_unstable();
        names.dedup();
        for name in names {
            match out.get_mut(name) {
                Some(n) => *n += 1,
                None => {
                    out.insert(name.to_string(), 1);
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::message::{ModuleInventory, WatchState};

    use super::*;
    use crate::fleet::entry::{FleetEntry, encode};

    #[test]
    fn an_entrys_health_reads_as_the_registrys_and_unknown_phases_count_as_none() {
        let watch = |phase| WatchState { name: "w".into(), phase, message: String::new(), objects: 0 };
        let status = ClusterStatus {
            cluster: "c".into(),
            connected: true,
            watches: vec![watch(WatchPhase::Running), watch(WatchPhase::Forbidden), watch(WatchPhase::Error)],
            inventory: vec![ModuleInventory { name: "m".into(), version: "1".into(), ready: false }],
            ..ClusterStatus::default()
        };
        let local = Health::of(&status);
        assert_eq!((local.watches_failing, local.modules_not_ready), (2, 1));
        let raw = encode(FleetEntry::new(status, "hub-2"), 16 << 10);
        let (hub, connected, health, names) = Health::of_entry(&raw).unwrap();
        assert_eq!((hub.as_str(), connected, health), ("hub-2", true, local));
        assert_eq!(&*names, [Box::from("w"), "w".into(), "w".into()]);
        let newer = br#"{"cluster":"c","hub":"h","watches":[{"phase":"hibernating"},{"phase":"forbidden"}]}"#;
        let (_, _, h, _) = Health::of_entry(newer).unwrap();
        assert_eq!((h.watches_failing, h.phases), (1, phase_bit(WatchPhase::Forbidden)));
        assert!(Health::of_entry(b"7").is_none() && Health::of_entry(b"not json").is_none());
    }

    #[test]
    fn clusters_are_counted_once_per_watch_they_run_and_only_while_connected() {
        let watch = |name: &str| WatchState {
            name: name.into(),
            phase: WatchPhase::Running,
            message: String::new(),
            objects: 0,
        };
        let status = |cluster: &str, connected: bool, names: &[&str]| ClusterStatus {
            cluster: cluster.into(),
            connected,
            watches: names.iter().map(|n| watch(n)).collect(),
            ..ClusterStatus::default()
        };
        let raw = encode(FleetEntry::new(status("e", true, &["b", "c"]), "hub-2"), 16 << 10);
        let entry = crate::fleet::state::cached_of(&raw, 1, None, &mut Default::default()).unwrap();
        let rows = [
            Row::local(status("x", true, &["a", "a", "b"]), None),
            Row::local(status("y", false, &["a"]), None),
            Row::entry("e", &entry, true),
            Row::entry("f", &entry, false),
        ];
        let counts = clusters_by_watch(&rows);
        let want = [("a", 1), ("b", 2), ("c", 1)].map(|(n, c)| (n.to_string(), c)).into_iter().collect();
        assert_eq!(counts, want);
    }
}
