//! Wire protocol v1: one JSON document per WebSocket message, each with a `type`.
//!
//! Unknown fields are ignored; an unknown `type` is answered with an [`ErrorFrame`].
//! See `DESIGN.md`, "Wire protocol (v1)".

use serde::{Deserialize, Serialize};

use crate::event::Event;

/// The newest protocol version this build speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The oldest protocol version this build still speaks. The skew policy (`docs/upgrade.md`):
/// a release whose newest protocol is N keeps speaking N-1 and N-2, so a hub of protocol N
/// serves agents and subscribers of N-2 up to N+1 (those speak down to N-1).
pub const MIN_PROTOCOL_VERSION: u32 = 1;

/// How many protocol versions before its newest a release keeps speaking (the skew policy).
pub const PROTOCOL_SKEW: u32 = 2;

/// A range of protocol versions one side speaks, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ProtocolRange {
    /// The oldest version.
    pub min: u32,
    /// The newest version.
    pub max: u32,
}

impl ProtocolRange {
    /// What this build speaks: [`MIN_PROTOCOL_VERSION`] to [`PROTOCOL_VERSION`].
    pub const OURS: ProtocolRange = ProtocolRange { min: MIN_PROTOCOL_VERSION, max: PROTOCOL_VERSION };

    /// The range a peer announced: `protocol` is its newest version, `min_protocol` its
    /// oldest (absent: the same as `protocol`). A minimum above the newest is an error.
    pub fn announced(protocol: u32, min_protocol: Option<u32>) -> Result<ProtocolRange, VersionError> {
        let min = min_protocol.unwrap_or(protocol);
        if min > protocol || min == 0 {
            return Err(VersionError::BadRange { min, max: protocol });
        }
        Ok(ProtocolRange { min, max: protocol })
    }

    /// Whether `version` is in the range.
    pub fn contains(self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }

    /// The highest version both `self` (ours) and `peer` speak.
    pub fn negotiate(self, peer: ProtocolRange) -> Result<u32, VersionError> {
        let best = self.max.min(peer.max);
        if best >= self.min.max(peer.min) {
            Ok(best)
        } else {
            Err(VersionError::NoCommonVersion { ours: self, theirs: peer })
        }
    }
}

impl std::fmt::Display for ProtocolRange {
    /// `1` for a single version, `1..3` (both included) for a range.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.min == self.max { write!(f, "{}", self.max) } else { write!(f, "{}..{}", self.min, self.max) }
    }
}

/// Why two sides cannot agree on a protocol version.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    /// The peer's oldest version is above its newest (or 0).
    #[error("min_protocol {min} is not between 1 and protocol {max}")]
    BadRange {
        /// The announced oldest version.
        min: u32,
        /// The announced newest version.
        max: u32,
    },
    /// The ranges do not overlap.
    #[error(
        "no common protocol version: the peer speaks {theirs}, this side speaks {ours}; upgrade the {}",
        upgrade_whom(.theirs, .ours)
    )]
    NoCommonVersion {
        /// What this side speaks.
        ours: ProtocolRange,
        /// What the peer speaks.
        theirs: ProtocolRange,
    },
}

/// The WebSocket path agents and subscribers connect to.
pub const WS_PATH: &str = "/v1/connect";

/// Messages an agent sends to the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum AgentMessage {
    /// First message of a session.
    Hello(Hello),
    /// A batch of events in increasing `seq` order.
    Events(EventBatch),
    /// The agent lost track of changes (restart, outbox overflow, relist): subscribers
    /// must reconcile the cluster fully.
    Resync(Resync),
    /// Module versions actually running in the cluster.
    Inventory(Inventory),
    /// How each configured watch is doing.
    WatchStatus(WatchStatusReport),
}

/// How each configured watch is doing, reported on every change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchStatusReport {
    /// One entry per configured watch.
    pub watches: Vec<WatchState>,
}

/// One watch's state in an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct WatchState {
    /// The watch name.
    pub name: String,
    /// Its phase.
    pub phase: WatchPhase,
    /// Details, e.g. the API server's error.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// Objects currently watched.
    #[serde(default)]
    pub objects: u64,
}

/// The phase of a watch in an agent.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum WatchPhase {
    /// Resolving the kind or listing.
    Starting,
    /// Listed and watching.
    Running,
    /// The kind is not served and nothing in the cluster is meant to provide it (its module
    /// is not installed, or was removed, or its CRD is simply not there yet). Healthy: the
    /// agent keeps looking and starts watching as soon as the CRD appears.
    WaitingForKind,
    /// The kind is not served although a module installed in the cluster declares that it
    /// provides it (the manager Deployment's `operator.fleetwatch.dev/provides` annotation):
    /// a failure. Agents before `waiting-for-kind` existed report every absent kind so.
    KindNotFound,
    /// RBAC denies list or watch; retried.
    Forbidden,
    /// Another error; retried.
    Error,
}

impl WatchPhase {
    /// Whether the phase is a failure that someone should look at (what `fleetwatch status`,
    /// the web view and the `FleetwatchWatchFailing` alert count): everything but running,
    /// starting and waiting for a kind that nothing installed.
    pub fn is_failing(self) -> bool {
        !matches!(self, WatchPhase::Running | WatchPhase::Starting | WatchPhase::WaitingForKind)
    }
}

impl std::fmt::Display for WatchPhase {
    /// The wire name (`running`, `kind-not-found`, ...).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match serde_json::to_value(self) {
            Ok(serde_json::Value::String(name)) => f.write_str(&name),
            _ => f.write_str("unknown"),
        }
    }
}

/// Which side is behind, for the error's advice.
fn upgrade_whom(theirs: &ProtocolRange, ours: &ProtocolRange) -> &'static str {
    if theirs.max < ours.min { "peer" } else { "side speaking the older protocols (this one)" }
}

/// Opens an agent session.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Hello {
    /// The newest protocol version the agent speaks.
    pub protocol: u32,
    /// The oldest protocol version the agent speaks; absent means the same as `protocol`
    /// (agents before negotiation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol: Option<u32>,
    /// The agent's build version.
    #[serde(default)]
    pub agent_version: String,
    /// The cluster the agent believes it is; must match its certificate when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster: Option<String>,
    /// A new value after every agent start.
    pub epoch: u64,
    /// The highest seq the hub acknowledged to this agent in `epoch`.
    #[serde(default)]
    pub last_acked_seq: u64,
}

/// A batch of events.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct EventBatch {
    /// Events in increasing `seq` order, all of the session's epoch.
    pub events: Vec<Event>,
}

/// The agent's marker that subscribers must reconcile its cluster fully.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Resync {
    /// The marker's place in the agent's sequence.
    pub epoch: u64,
    /// The marker's seq.
    pub seq: u64,
    /// Why, for logs and subscribers.
    #[serde(default)]
    pub reason: String,
    /// The agent's digest of every object it watches (key → content digest), when it has one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectDigest>,
}

/// One object's digest in a [`Resync`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectDigest {
    /// The object key.
    pub key: String,
    /// A digest of the object's watched fields.
    pub digest: String,
}

/// Module versions actually running in the cluster.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Inventory {
    /// One entry per module manager workload found.
    pub modules: Vec<ModuleInventory>,
}

/// One module's running version.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ModuleInventory {
    /// The module name.
    pub name: String,
    /// The running version.
    pub version: String,
    /// Whether its manager workload is ready.
    #[serde(default)]
    pub ready: bool,
}

/// Messages the hub sends to an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum HubToAgent {
    /// Answer to [`Hello`].
    Welcome(Welcome),
    /// Cumulative acknowledgement.
    Ack(Ack),
    /// New watch configuration.
    Configure(Configure),
    /// Something went wrong; see the code.
    Error(ErrorFrame),
}

impl Hello {
    /// The versions the agent announced.
    pub fn protocols(&self) -> Result<ProtocolRange, VersionError> {
        ProtocolRange::announced(self.protocol, self.min_protocol)
    }
}

/// Answer to [`Hello`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Welcome {
    /// The protocol version the hub chose (the highest both speak), spoken for the session.
    pub protocol: u32,
    /// Session id, for logs.
    pub session: String,
    /// The cluster id taken from the agent's certificate.
    pub cluster: String,
    /// The epoch the ack refers to.
    pub epoch: u64,
    /// Highest seq of `epoch` the hub has durably accepted; the agent drops what is below.
    pub acked_seq: u64,
    /// What the agent should watch.
    #[serde(default)]
    pub watches: Vec<WatchSpec>,
    /// The largest event the hub accepts, in bytes of JSON; the agent cuts larger ones
    /// down before sending (absent from older hubs: the default limit holds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_event_bytes: Option<usize>,
}

/// Cumulative acknowledgement: everything up to `seq` of `epoch` is in the bus.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Ack {
    /// The epoch.
    pub epoch: u64,
    /// The highest accepted seq.
    pub seq: u64,
}

/// New watch configuration for an agent.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Configure {
    /// The full set of watches; what is not listed is stopped.
    pub watches: Vec<WatchSpec>,
}

/// One thing an agent watches (filled out by the watch-configuration work).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchSpec {
    /// A name unique within the configuration.
    pub name: String,
    /// API group; empty for the core group.
    #[serde(default)]
    pub group: String,
    /// API version.
    pub version: String,
    /// Kind.
    pub kind: String,
    /// Only this namespace, when set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace: Option<String>,
    /// Label selector, Kubernetes syntax.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<String>,
    /// Fields whose change counts (`spec`, `status`, `metadata.labels`, JSON pointers).
    #[serde(default)]
    pub fields: Vec<String>,
    /// JSON pointers copied into the event.
    #[serde(default)]
    pub project: Vec<String>,
    /// The subscriber this watch is for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subscriber: Option<String>,
}

/// An error report; `fatal` ones are followed by a close.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorFrame {
    /// Machine-readable code.
    pub code: ErrorCode,
    /// What went wrong, for people.
    pub message: String,
    /// Whether the sender closes the connection after this frame.
    #[serde(default)]
    pub fatal: bool,
}

/// Machine-readable error codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ErrorCode {
    /// The message is not valid JSON or lacks required fields.
    Malformed,
    /// The `type` is unknown.
    UnknownType,
    /// The message is not allowed in this state or role.
    Forbidden,
    /// A claim disagrees with the certificate.
    IdentityMismatch,
    /// The protocol version is not supported.
    UnsupportedVersion,
    /// A limit was exceeded (batch size, field size).
    LimitExceeded,
    /// The sender is throttled: acks are delayed.
    RateLimited,
    /// Sequence numbers out of order.
    BadSequence,
    /// The hub had an internal failure.
    Internal,
    /// The hub is shutting down.
    ShuttingDown,
    /// A newer session for the same identity replaced this one.
    Replaced,
    /// Another agent process is already connected for this cluster id: the live session
    /// wins and this one is refused (retry after a long backoff). See `DESIGN.md`,
    /// "One session per cluster".
    ClusterAlreadyConnected,
    /// The hub cannot serve yet: its storage is not open (it started during a fault that
    /// passes). Retry with backoff; the hub becomes ready by itself.
    Unavailable,
}

impl ErrorCode {
    /// The code as it travels on the wire, e.g. `cluster-already-connected`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::Malformed => "malformed",
            ErrorCode::UnknownType => "unknown-type",
            ErrorCode::Forbidden => "forbidden",
            ErrorCode::IdentityMismatch => "identity-mismatch",
            ErrorCode::UnsupportedVersion => "unsupported-version",
            ErrorCode::LimitExceeded => "limit-exceeded",
            ErrorCode::RateLimited => "rate-limited",
            ErrorCode::BadSequence => "bad-sequence",
            ErrorCode::Internal => "internal",
            ErrorCode::ShuttingDown => "shutting-down",
            ErrorCode::Replaced => "replaced",
            ErrorCode::ClusterAlreadyConnected => "cluster-already-connected",
            ErrorCode::Unavailable => "unavailable",
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Messages a subscriber sends to the hub.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum SubscriberMessage {
    /// Starts (or resumes) a subscription.
    Subscribe(Subscribe),
    /// Acknowledges everything up to `cursor`.
    Ack(CursorAck),
}

/// Starts a subscription.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Subscribe {
    /// The newest protocol version the subscriber speaks; absent means 1 (subscribers
    /// before negotiation).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<u32>,
    /// The oldest protocol version the subscriber speaks; absent means the same as
    /// `protocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_protocol: Option<u32>,
    /// Durable name: the hub keeps the acked cursor under it and resumes there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub durable: Option<String>,
    /// Only these clusters; empty means all.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// Where to start when there is no stored cursor.
    #[serde(default)]
    pub from: StartFrom,
    /// The stream and cursor this client last acknowledged, when it reconnects.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub resume: Option<ResumePoint>,
    /// Most events in flight without an ack.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
}

impl Subscribe {
    /// The versions the subscriber announced.
    pub fn protocols(&self) -> Result<ProtocolRange, VersionError> {
        ProtocolRange::announced(self.protocol.unwrap_or(1), self.min_protocol)
    }
}

/// Where a subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum StartFrom {
    /// The oldest event still in the bus.
    Earliest,
    /// Only events that arrive from now on.
    #[default]
    Latest,
}

/// A position in one bus stream.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResumePoint {
    /// The stream's id; a different id means the bus lost its history.
    pub stream: String,
    /// The last acknowledged cursor.
    pub cursor: u64,
}

/// Acknowledges a cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct CursorAck {
    /// Everything up to and including this cursor is processed.
    pub cursor: u64,
}

/// Messages the hub sends to a subscriber.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "kebab-case")]
pub enum HubToSubscriber {
    /// The subscription is live.
    Subscribed(Subscribed),
    /// Events with their cursors.
    Events(EventBatch),
    /// The subscriber cannot get (part of) a cluster's history: reconcile it fully.
    ResyncRequired(ResyncRequired),
    /// Something went wrong.
    Error(ErrorFrame),
}

/// Confirms a subscription.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Subscribed {
    /// The protocol version the hub chose (the highest both speak), spoken for the
    /// session; absent from hubs before negotiation, which spoke 1.
    #[serde(default = "protocol_one")]
    pub protocol: u32,
    /// The bus stream id.
    pub stream: String,
    /// Delivery starts after this cursor.
    pub cursor: u64,
    /// Clusters of the subscriber's filter the hub has never seen (no agent session, no
    /// stored event): most likely a misspelt id. Delivery waits for them all the same.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unknown_clusters: Vec<String>,
}

fn protocol_one() -> u32 {
    1
}

/// A cluster whose history the subscriber cannot get.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResyncRequired {
    /// The cluster, or `*` for every cluster.
    pub cluster: String,
    /// The cursor to acknowledge once handled.
    pub cursor: u64,
    /// Why.
    #[serde(default)]
    pub reason: String,
}

#[cfg(test)]
mod display_tests {
    use super::*;

    #[test]
    fn codes_and_phases_display_their_wire_names() {
        assert_eq!(ErrorCode::LimitExceeded.to_string(), "limit-exceeded");
        assert_eq!(ErrorCode::Forbidden.to_string(), "forbidden");
        assert_eq!(WatchPhase::KindNotFound.to_string(), "kind-not-found");
        assert_eq!(WatchPhase::WaitingForKind.to_string(), "waiting-for-kind");
        assert!(!WatchPhase::WaitingForKind.is_failing() && !WatchPhase::Running.is_failing());
        assert!(WatchPhase::KindNotFound.is_failing() && WatchPhase::Forbidden.is_failing());
    }
}

#[cfg(test)]
mod version_tests {
    use super::*;

    fn r(min: u32, max: u32) -> ProtocolRange {
        ProtocolRange { min, max }
    }

    #[test]
    fn the_highest_common_version_wins() {
        assert_eq!(r(1, 1).negotiate(r(1, 2)), Ok(1));
        assert_eq!(r(1, 3).negotiate(r(2, 5)), Ok(3));
        assert_eq!(r(2, 4).negotiate(r(1, 2)), Ok(2));
        assert_eq!(r(3, 4).negotiate(r(1, 2)), Err(VersionError::NoCommonVersion { ours: r(3, 4), theirs: r(1, 2) }));
        assert_eq!(r(1, 1).negotiate(r(2, 2)), Err(VersionError::NoCommonVersion { ours: r(1, 1), theirs: r(2, 2) }));
    }

    #[test]
    fn an_absent_minimum_is_the_newest_and_a_bad_range_is_refused() {
        assert_eq!(ProtocolRange::announced(2, None), Ok(r(2, 2)));
        assert_eq!(ProtocolRange::announced(2, Some(1)), Ok(r(1, 2)));
        assert!(ProtocolRange::announced(1, Some(2)).is_err());
        assert!(ProtocolRange::announced(0, None).is_err());
    }

    #[test]
    fn the_error_names_both_ranges_and_who_upgrades() {
        let old_peer = r(3, 4).negotiate(r(1, 2)).unwrap_err().to_string();
        assert!(old_peer.contains("peer speaks 1..2") && old_peer.contains("this side speaks 3..4"), "{old_peer}");
        assert!(old_peer.ends_with("upgrade the peer"), "{old_peer}");
        let new_peer = r(1, 1).negotiate(r(3, 3)).unwrap_err().to_string();
        assert!(new_peer.contains("(this one)"), "{new_peer}");
    }

    #[test]
    fn frames_without_versions_read_as_protocol_one() {
        let s: Subscribe = serde_json::from_str(r#"{"from":"earliest"}"#).unwrap();
        assert_eq!(s.protocols(), Ok(r(1, 1)));
        let h: Hello = serde_json::from_str(r#"{"protocol":1,"epoch":3}"#).unwrap();
        assert_eq!(h.protocols(), Ok(r(1, 1)));
        let d: Subscribed = serde_json::from_str(r#"{"stream":"s","cursor":0}"#).unwrap();
        assert_eq!(d.protocol, 1);
        // The skew policy in numbers: this build serves its own protocol and the one after.
        assert!(ProtocolRange::OURS.contains(PROTOCOL_VERSION));
        assert_eq!(ProtocolRange::OURS.negotiate(r(MIN_PROTOCOL_VERSION, PROTOCOL_VERSION + 1)), Ok(PROTOCOL_VERSION));
    }
}

#[cfg(test)]
mod tests {
    use super::ErrorCode;

    #[test]
    fn error_code_names_match_the_wire() {
        for code in [
            ErrorCode::Malformed,
            ErrorCode::UnknownType,
            ErrorCode::Forbidden,
            ErrorCode::IdentityMismatch,
            ErrorCode::UnsupportedVersion,
            ErrorCode::LimitExceeded,
            ErrorCode::RateLimited,
            ErrorCode::BadSequence,
            ErrorCode::Internal,
            ErrorCode::ShuttingDown,
            ErrorCode::Replaced,
            ErrorCode::ClusterAlreadyConnected,
            ErrorCode::Unavailable,
        ] {
            assert_eq!(serde_json::to_string(&code).unwrap(), format!("\"{code}\""));
        }
    }
}
