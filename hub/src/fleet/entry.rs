//! What hub replicas on a shared bus tell each other (see `crate::fleet::state`): one
//! [`FleetEntry`] per cluster — its [`ClusterStatus`] as the replica its agent is (or was
//! last) connected to shows it, with that replica's name — and one [`Heartbeat`] per
//! replica. Both are JSON; a reader ignores fields it does not know, so a newer release may
//! add some.
//!
//! An entry is bounded in bytes (the bus refuses larger values): one over the bound is
//! written trimmed ([`encode`]) — its watches and modules cut, the failing ones and the
//! ones not ready kept first, `trimmed: true` said — never dropped.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::cluster::ClusterStatus;

/// The format of [`FleetEntry`] (`entryFormat`).
pub(crate) const ENTRY_FORMAT: u32 = 1;

/// Longest text kept in one field of an entry that had to be trimmed.
const TRIMMED_FIELD_BYTES: usize = 256;

/// One cluster's entry as a replica wrote it.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct FleetEntry {
    /// The cluster as the writing replica shows it.
    #[serde(flatten)]
    pub status: ClusterStatus,
    /// The replica that wrote it (its agent is, or was last, connected there).
    #[serde(default)]
    pub hub: String,
    /// Whether lists were cut to fit [the bound](encode).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub trimmed: bool,
    /// [`ENTRY_FORMAT`] of the writer.
    #[serde(default)]
    pub entry_format: u32,
}

impl FleetEntry {
    /// The entry `hub` writes for `status`.
    pub fn new(status: ClusterStatus, hub: &str) -> Self {
        Self { status, hub: hub.into(), trimmed: false, entry_format: ENTRY_FORMAT }
    }

    /// Reads an entry (`None`: not one, e.g. empty after a delete).
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        serde_json::from_slice(bytes).ok()
    }
}

/// The entry's bytes, at most `max` long when the cluster id allows: trimmed (see the
/// module docs) when the whole status does not fit.
pub fn encode(mut entry: FleetEntry, max: usize) -> Bytes {
    let bytes = serde_json::to_vec(&entry).unwrap_or_default();
    if bytes.len() <= max {
        return bytes.into();
    }
    entry.trimmed = true;
    let s = &mut entry.status;
    // Problems first: what is cut is what matters least.
    s.watches.sort_by_key(|w| !w.phase.is_failing());
    s.inventory.sort_by_key(|m| m.ready);
    loop {
        let bytes = serde_json::to_vec(&entry).unwrap_or_default();
        if bytes.len() <= max {
            return bytes.into();
        }
        let s = &mut entry.status;
        if !s.watches.is_empty() && s.watches.len() >= s.inventory.len() {
            s.watches.truncate(s.watches.len() / 2);
        } else if !s.inventory.is_empty() {
            s.inventory.truncate(s.inventory.len() / 2);
        } else {
            break;
        }
    }
    // Still too large without lists: long texts cut, then only what lists need.
    let s = &mut entry.status;
    for text in
        [&mut s.remote, &mut s.agent_version, &mut s.agent_protocols, &mut s.last_conflict_from].into_iter().flatten()
    {
        cut(text, TRIMMED_FIELD_BYTES);
    }
    let bytes = serde_json::to_vec(&entry).unwrap_or_default();
    if bytes.len() <= max {
        return bytes.into();
    }
    let minimal = FleetEntry {
        status: ClusterStatus {
            cluster: entry.status.cluster.clone(),
            connected: entry.status.connected,
            last_seen: entry.status.last_seen,
            connected_since: entry.status.connected_since,
            ..ClusterStatus::default()
        },
        ..entry
    };
    serde_json::to_vec(&minimal).unwrap_or_default().into()
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn cut(s: &mut String, max: usize) {
    if s.len() > max {
        let mut end = max;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
}

/// A digest of what an entry shows that is worth a write: everything but the counters
/// that move with every event (events, acked seq) and the last-seen time. An entry is
/// written again when its digest changes (and refreshed daily), not per event.
pub(crate) fn digest(status: &ClusterStatus) -> u64 {
    let quiet = ClusterStatus { last_seen: None, acked_seq: 0, events_received: 0, ..status.clone() };
    let bytes = serde_json::to_vec(&quiet).unwrap_or_default();
    fleetwatch_protocol::digest::fnv1a64(&bytes)
}

/// A replica's heartbeat in the replicas' bucket.
#[derive(Debug, Clone, Serialize, Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct Heartbeat {
    /// The replica.
    pub(crate) replica: String,
    /// Events it accepted since it started (the fleet's event rate adds them up).
    #[serde(default)]
    pub(crate) events_total: u64,
    /// Agents connected to it.
    #[serde(default)]
    pub(crate) connected: u64,
    /// Drawn when the replica started (0: a release before it): a replica whose heartbeat
    /// comes back with another one started again, and the heads it had not recorded may be
    /// lost (see `session::heads`).
    #[serde(default)]
    pub(crate) incarnation: u64,
}

/// What a replica found in the replicas' bucket under another replica's name.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Beat {
    /// A heartbeat of this release's layout.
    Alive(Heartbeat),
    /// A release before the per-cluster entries: its whole cluster list (JSON array), shown
    /// as it is during a rolling upgrade.
    Legacy(Vec<serde_json::Value>),
    /// Something else (a newer layout): the replica is alive.
    Other,
}

impl Beat {
    /// Reads a value of the replicas' bucket.
    pub(crate) fn decode(bytes: &[u8]) -> Self {
        match serde_json::from_slice::<serde_json::Value>(bytes) {
            Ok(serde_json::Value::Array(list)) => Beat::Legacy(list),
            Ok(v) => serde_json::from_value(v).map_or(Beat::Other, Beat::Alive),
            Err(_) => Beat::Other,
        }
    }
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::message::{ModuleInventory, WatchPhase, WatchState};

    use super::*;

    fn big_status(watches: usize, modules: usize) -> ClusterStatus {
        let watch = |i: usize| WatchState {
            name: format!("watch-{i}"),
            phase: if i % 50 == 7 { WatchPhase::Forbidden } else { WatchPhase::Running },
            message: "x".repeat(200),
            objects: 1,
        };
        let module =
            |i: usize| ModuleInventory { name: format!("module-{i}"), version: "1.2.3".into(), ready: i % 40 != 3 };
        ClusterStatus {
            cluster: "prod-eu-1".into(),
            connected: true,
            remote: Some("10.0.0.1:1234".into()),
            watches: (0..watches).map(watch).collect(),
            inventory: (0..modules).map(module).collect(),
            ..ClusterStatus::default()
        }
    }

    #[test]
    fn a_small_entry_is_written_whole_and_reads_back() {
        let status = big_status(3, 2);
        let bytes = encode(FleetEntry::new(status.clone(), "hub-a"), 16 << 10);
        let back = FleetEntry::decode(&bytes).unwrap();
        assert_eq!(back, FleetEntry::new(status, "hub-a"));
        assert!(!String::from_utf8_lossy(&bytes).contains("trimmed"));
    }

    #[test]
    fn an_entry_over_the_bound_is_trimmed_problems_first_and_says_so() {
        let status = big_status(400, 300);
        let max = 16 << 10;
        assert!(serde_json::to_vec(&FleetEntry::new(status.clone(), "hub-a")).unwrap().len() > max);
        let bytes = encode(FleetEntry::new(status, "hub-a"), max);
        assert!(bytes.len() <= max, "{}", bytes.len());
        let back = FleetEntry::decode(&bytes).unwrap();
        assert!(back.trimmed);
        assert_eq!(
            (back.status.cluster.as_str(), back.status.connected, back.hub.as_str()),
            ("prod-eu-1", true, "hub-a")
        );
        // The failing watches (8 of 400) and the modules not ready (8 of 300) survive the cut.
        let failing = back.status.watches.iter().filter(|w| w.phase.is_failing()).count();
        let not_ready = back.status.inventory.iter().filter(|m| !m.ready).count();
        assert_eq!(
            (failing, not_ready),
            (8, 8),
            "{} watches, {} modules kept",
            back.status.watches.len(),
            back.status.inventory.len()
        );
        assert!(back.status.watches.len() < 400 && back.status.inventory.len() < 300);
    }

    #[test]
    fn an_entry_too_large_even_without_lists_keeps_what_lists_need() {
        let mut status = big_status(0, 0);
        status.remote = Some("r".repeat(10_000));
        status.agent_version = Some("v".repeat(10_000));
        let bytes = encode(FleetEntry::new(status.clone(), "hub-a"), 1024);
        let back = FleetEntry::decode(&bytes).unwrap();
        assert!(bytes.len() <= 1024 && back.trimmed);
        assert_eq!(back.status.remote.as_deref().map(str::len), Some(TRIMMED_FIELD_BYTES));
        // A bound below even that: the cluster, whether connected, and the replica remain.
        let bytes = encode(FleetEntry::new(status, "hub-a"), 300);
        let back = FleetEntry::decode(&bytes).unwrap();
        assert!(bytes.len() <= 300 && back.trimmed && back.status.connected && back.status.remote.is_none());
    }

    #[test]
    fn the_digest_ignores_counters_and_last_seen() {
        let a = big_status(2, 2);
        let mut b = a.clone();
        b.events_received = 99;
        b.acked_seq = 7;
        b.last_seen = Some(jiff::Timestamp::now());
        assert_eq!(digest(&a), digest(&b));
        b.connected = false;
        assert_ne!(digest(&a), digest(&b));
    }

    #[test]
    fn heartbeats_and_old_whole_lists_are_told_apart() {
        let beat = Heartbeat { replica: "a".into(), events_total: 5, connected: 1, incarnation: 9 };
        assert_eq!(Beat::decode(&serde_json::to_vec(&beat).unwrap()), Beat::Alive(beat));
        assert!(matches!(Beat::decode(br#"[{"cluster":"c","connected":true}]"#), Beat::Legacy(l) if l.len() == 1));
        assert_eq!(Beat::decode(b"not json"), Beat::Other);
    }
}
