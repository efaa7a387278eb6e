//! Change events, named after CloudEvents 1.0 attributes so other tools can read them.

use serde::{Deserialize, Serialize};

/// CloudEvents `type` of an object that was created or changed.
pub const TYPE_APPLIED: &str = "dev.fleetwatch.object.applied";
/// CloudEvents `type` of an object that was deleted.
pub const TYPE_DELETED: &str = "dev.fleetwatch.object.deleted";
/// CloudEvents `type` of the cluster's module inventory (`data.modules`).
pub const TYPE_INVENTORY: &str = "dev.fleetwatch.inventory";
/// Subject of inventory events.
pub const INVENTORY_SUBJECT: &str = "fleetwatch.dev/Inventory";

/// One change of one watched object in one runtime cluster.
///
/// `subject` is the object key (see [`ObjectKey`]); `cluster`, `epoch` and `seq` are
/// CloudEvents extension attributes. `cursor` is set by the hub when it delivers the
/// event to a subscriber: the event's position in the bus.
///
/// ```
/// use fleetwatch_protocol::event::{Event, ObjectKey};
/// let key = ObjectKey::new("apps/v1", "Deployment", Some("default"), "web");
/// let ev = Event::applied("eu-1", 7, 42, &key, serde_json::json!({"replicas": 3}));
/// assert_eq!(ev.subject, "apps/v1/Deployment/default/web");
/// assert_eq!(ev.id, "eu-1/7/42");
/// let json = serde_json::to_string(&ev).unwrap();
/// assert_eq!(serde_json::from_str::<Event>(&json).unwrap(), ev);
/// ```
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Event {
    /// The CloudEvents spec version, always `1.0`.
    #[serde(default = "spec_version")]
    pub specversion: String,
    /// Unique per event: `<cluster>/<epoch>/<seq>`.
    pub id: String,
    /// Where the event comes from: `/clusters/<cluster>`.
    pub source: String,
    /// [`TYPE_APPLIED`] or [`TYPE_DELETED`].
    #[serde(rename = "type")]
    pub kind: String,
    /// The object key.
    pub subject: String,
    /// When the agent saw the change.
    pub time: jiff::Timestamp,
    /// The cluster id (set by the hub from the agent's certificate).
    pub cluster: String,
    /// The agent's epoch: a new one after every agent start.
    pub epoch: u64,
    /// Per-agent sequence number, increasing within an epoch.
    pub seq: u64,
    /// The watch (WatchConfig name) that produced the event, for Kubernetes sources.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub watch: Option<String>,
    /// The bus position, set on delivery to a subscriber.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cursor: Option<u64>,
    /// The changed object's projected content.
    #[serde(default)]
    pub data: serde_json::Value,
}

fn spec_version() -> String {
    "1.0".into()
}

impl Event {
    /// An "applied" event (object created or changed).
    pub fn applied(cluster: &str, epoch: u64, seq: u64, key: &ObjectKey, data: serde_json::Value) -> Self {
        Self::new(TYPE_APPLIED, cluster, epoch, seq, key, data)
    }

    /// A "deleted" event.
    pub fn deleted(cluster: &str, epoch: u64, seq: u64, key: &ObjectKey, data: serde_json::Value) -> Self {
        Self::new(TYPE_DELETED, cluster, epoch, seq, key, data)
    }

    fn new(kind: &str, cluster: &str, epoch: u64, seq: u64, key: &ObjectKey, data: serde_json::Value) -> Self {
        Self {
            specversion: spec_version(),
            id: event_id(cluster, epoch, seq),
            source: source_for(cluster),
            kind: kind.into(),
            subject: key.to_string(),
            time: jiff::Timestamp::now(),
            cluster: cluster.into(),
            epoch,
            seq,
            watch: None,
            cursor: None,
            data,
        }
    }

    /// The same event, tagged with the watch that produced it.
    pub fn with_watch(mut self, watch: Option<String>) -> Self {
        self.watch = watch;
        self
    }

    /// Whether this event says the object was deleted.
    pub fn is_delete(&self) -> bool {
        self.kind == TYPE_DELETED
    }
}

/// The CloudEvents `id` of an event.
pub fn event_id(cluster: &str, epoch: u64, seq: u64) -> String {
    format!("{cluster}/{epoch}/{seq}")
}

/// The CloudEvents `source` of a cluster's events.
pub fn source_for(cluster: &str) -> String {
    format!("/clusters/{cluster}")
}

/// Names one Kubernetes object: `<apiVersion>/<kind>/<namespace>/<name>`, with `_` for
/// the namespace of a cluster-scoped object.
///
/// ```
/// use fleetwatch_protocol::event::ObjectKey;
/// assert_eq!(ObjectKey::new("v1", "Namespace", None, "prod").to_string(), "v1/Namespace/_/prod");
/// ```
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ObjectKey {
    /// `group/version`, or `version` for the core group.
    pub api_version: String,
    /// The kind, e.g. `Deployment`.
    pub kind: String,
    /// The namespace; `None` for cluster-scoped objects.
    pub namespace: Option<String>,
    /// The object's name.
    pub name: String,
}

impl ObjectKey {
    /// A key from its parts.
    pub fn new(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Self {
        Self {
            api_version: api_version.into(),
            kind: kind.into(),
            namespace: namespace.map(Into::into),
            name: name.into(),
        }
    }
}

impl std::fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ns = self.namespace.as_deref().unwrap_or("_");
        write!(f, "{}/{}/{}/{}", self.api_version, self.kind, ns, self.name)
    }
}
