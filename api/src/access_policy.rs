//! `SubscriberAccessPolicy`: the hub's subscriber access policy (`--access-policy FILE`)
//! as a cluster-scoped custom resource in the control plane, read by a hub started with
//! `--access-policy-from-control-plane`. The spec has the shape of the file; the hub checks
//! each object with the file's check and uses only the accepted ones (see docs/DESIGN.md).

use kube::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Which clusters, event types and fields subscriber identities may read.
#[derive(CustomResource, Serialize, Deserialize, Clone, Debug, Default, PartialEq, JsonSchema)]
#[kube(
    group = "operator.fleetwatch.dev",
    version = "v1alpha1",
    kind = "SubscriberAccessPolicy",
    plural = "subscriberaccesspolicies",
    shortname = "sap",
    status = "SubscriberAccessPolicyStatus",
    printcolumn = r#"{"name":"Accepted","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].status"}"#,
    printcolumn = r#"{"name":"Reason","type":"string","jsonPath":".status.conditions[?(@.type==\"Accepted\")].reason"}"#,
    printcolumn = r#"{"name":"Subscribers","type":"string","jsonPath":".spec.subscribers[*].name"}"#,
    printcolumn = r#"{"name":"Message","type":"string","priority":1,"jsonPath":".status.conditions[?(@.type==\"Accepted\")].message"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#,
    doc = "Which clusters, event types and fields fleetwatch subscriber identities may read"
)]
#[serde(rename_all = "camelCase")]
pub struct SubscriberAccessPolicySpec {
    /// One grant per subscriber name.
    #[serde(default)]
    pub subscribers: Vec<SubscriberGrant>,
}

/// What one subscriber identity may read (the file's `subscribers[]` entry).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriberGrant {
    /// The subscriber name in its certificate (`spiffe://<td>/subscriber/<name>`).
    pub name: String,
    /// Cluster id globs (`*` any run of characters, `?` one). Empty: no cluster by glob.
    #[serde(default)]
    pub clusters: Vec<String>,
    /// A label selector: the clusters whose Runtime labels match are granted too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selector: Option<String>,
    /// CloudEvents type globs; none: every type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub types: Vec<String>,
    /// JSON pointers removed from event data before delivery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub redact: Vec<String>,
}

/// What the hub made of a SubscriberAccessPolicy (written by the hub).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SubscriberAccessPolicyStatus {
    /// The `metadata.generation` this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// `Accepted`: `True` when its grants are in force, `False` with the reason (`Invalid`,
    /// `DuplicateSubscriber`) and what is wrong when they are not.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<crate::module::Condition>,
}
