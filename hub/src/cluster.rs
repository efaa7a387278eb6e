//! What the hub knows and shows of one cluster: its status ([`ClusterStatus`], the admin
//! API's and `fleetwatch status`'s row, also shared between hub replicas) and its recent
//! events ([`RecentEvent`]). Plain values, so the registry that keeps them, the fleet
//! state that shares them and the admin endpoint that shows them all depend on this leaf
//! rather than on each other.

use fleetwatch_protocol::message::{ModuleInventory, WatchState};
use serde::Serialize;

/// One cluster as the admin API shows it.
#[derive(Debug, Clone, Serialize, serde::Deserialize, Default, PartialEq)]
#[serde(rename_all = "camelCase", default)]
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
    /// The protocol version the live (or last) session speaks, negotiated at its hello.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// The protocol versions the agent speaks, e.g. `1` or `1..2` (oldest..newest).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_protocols: Option<String>,
    /// The newest protocol version the agent speaks (what the skew policy's alert reads).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_protocol: Option<u32>,
    /// When the hub last heard from the agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_seen: Option<jiff::Timestamp>,
    /// When the open session started.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connected_since: Option<jiff::Timestamp>,
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
    /// Serial (lower-case hex) of the certificate the live (or last) session presented.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_serial: Option<String>,
    /// When that certificate expires.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cert_not_after: Option<jiff::Timestamp>,
    /// Agents refused because this cluster id was already connected from elsewhere.
    pub conflicts: u64,
    /// The address of the last refused agent.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_conflict_from: Option<String>,
    /// When the last agent was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_conflict_at: Option<jiff::Timestamp>,
}

/// Most recent events kept per cluster for `/api/v1/clusters/{id}`.
pub(crate) const RECENT_EVENTS: usize = 32;
/// Most bytes (of subjects, types, watch names and reasons) kept per cluster for them.
pub(crate) const RECENT_EVENT_BYTES: usize = 16 << 10;
/// Longest text kept in one field of a recent event; longer ones are cut (with `…`).
pub(crate) const RECENT_FIELD_BYTES: usize = 256;

/// One recent event of a cluster, as the hub took it in (kept in memory, never read back
/// from the bus).
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub(crate) struct RecentEvent {
    /// The agent's seq.
    pub(crate) seq: u64,
    /// The CloudEvents type, or `resync-required`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// The object key (cut to [`RECENT_FIELD_BYTES`]); for a resync, its reason.
    pub(crate) subject: String,
    /// When the agent saw the change (when the hub stored it, for a resync).
    pub(crate) time: jiff::Timestamp,
    /// The WatchConfig that produced it, if any.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) watch: Option<String>,
}

impl RecentEvent {
    /// An entry with every text cut to [`RECENT_FIELD_BYTES`].
    pub(crate) fn new(seq: u64, kind: &str, subject: &str, time: jiff::Timestamp, watch: Option<&str>) -> Self {
        Self { seq, kind: cut(kind), subject: cut(subject), time, watch: watch.map(cut) }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.kind.len() + self.subject.len() + self.watch.as_ref().map_or(0, String::len) + 32
    }
}

/// `s` cut to at most [`RECENT_FIELD_BYTES`] bytes on a character boundary.
fn cut(s: &str) -> String {
    if s.len() <= RECENT_FIELD_BYTES {
        return s.to_string();
    }
    let mut end = RECENT_FIELD_BYTES - '…'.len_utf8();
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}
