//! Protobuf request bodies (`Content-Type: application/vnd.kubernetes.protobuf`), which
//! kubectl's typed commands (`kubectl create configmap|secret|deployment …`) send.
//!
//! A body is the Kubernetes envelope: the magic `k8s\0` and a `runtime.Unknown` holding
//! the `apiVersion`/`kind` and the message bytes. The message is decoded with the prost
//! types of the `k8s-pb` crate and turned into the JSON kube-apiserver would store, by
//! `ToJson` impls generated from those types (`generated.rs`, by
//! `sim/tools/gen_protobuf.py`): each impl destructures its message exhaustively, so no
//! field can be dropped silently. The server stores and answers JSON.
//!
//! Where the result can differ from kube-apiserver: protobuf cannot tell an unset scalar
//! from its zero value (Go writes `0`, `""` and `false` for plain fields), so zero scalars
//! are left out, except for the pointer fields in [`KEEP_ZERO`] whose zero is meaningful
//! (`replicas: 0`). Go's JSON keeps a few non-`omitempty` empty strings (e.g.
//! `roleRef.apiGroup: ""`) that are left out here.

mod generated;

use std::collections::BTreeMap;

use base64::Engine;
use prost::Message;
use serde_json::{Map, Value, json};

use crate::error::ApiError;

/// The magic prefix of Kubernetes protobuf bodies.
const MAGIC: &[u8] = b"k8s\0";

/// JSON names of optional (pointer) scalar fields whose zero value is kept.
const KEEP_ZERO: &[&str] = &[
    "replicas",
    "immutable",
    "automountServiceAccountToken",
    "completions",
    "parallelism",
    "backoffLimit",
    "backoffLimitPerIndex",
    "maxFailedIndexes",
    "activeDeadlineSeconds",
    "ttlSecondsAfterFinished",
    "terminationGracePeriodSeconds",
    "revisionHistoryLimit",
    "progressDeadlineSeconds",
    "suspend",
    "runAsUser",
    "runAsGroup",
    "runAsNonRoot",
    "privileged",
    "readOnlyRootFilesystem",
    "allowPrivilegeEscalation",
    "successfulJobsHistoryLimit",
    "failedJobsHistoryLimit",
    "startingDeadlineSeconds",
    "deletionGracePeriodSeconds",
    "expirationSeconds",
    "defaultMode",
    "mode",
    "optional",
    "leaseDurationSeconds",
    "leaseTransitions",
    "controller",
    "blockOwnerDeletion",
    "enableServiceLinks",
    "shareProcessNamespace",
    "hostUsers",
    "allocateLoadBalancerNodePorts",
    "unhealthyPodEvictionPolicy",
];

/// A k8s-pb message as the JSON kube-apiserver stores.
pub trait ToJson {
    /// Converts the message; fails for content that has no JSON form.
    fn to_json(self) -> Result<Value, ApiError>;

    /// Whether a zero value of this type is still written when the field is present.
    fn keeps_zero() -> bool
    where
        Self: Sized,
    {
        false
    }
}

/// A message field: how it goes into its parent's JSON object.
pub trait Field {
    /// Inserts the field under `key` unless it is unset.
    fn put_into(self, m: &mut Map<String, Value>, key: &str) -> Result<(), ApiError>;
}

/// Inserts a field (generated code calls this for every field).
pub fn put<F: Field>(m: &mut Map<String, Value>, key: &str, f: F) -> Result<(), ApiError> {
    f.put_into(m, key)
}

fn zero(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::String(s) => s.is_empty(),
        Value::Bool(b) => !b,
        Value::Number(n) => n.as_f64() == Some(0.0),
        _ => false,
    }
}

impl<T: ToJson> Field for Option<T> {
    fn put_into(self, m: &mut Map<String, Value>, key: &str) -> Result<(), ApiError> {
        let Some(v) = self else { return Ok(()) };
        let v = v.to_json()?;
        let scalar = !(v.is_object() || v.is_array());
        if v.is_null() || (scalar && zero(&v) && !T::keeps_zero() && !KEEP_ZERO.contains(&key)) {
            return Ok(());
        }
        m.insert(key.to_string(), v);
        Ok(())
    }
}

impl<T: ToJson> Field for Vec<T> {
    fn put_into(self, m: &mut Map<String, Value>, key: &str) -> Result<(), ApiError> {
        if self.is_empty() {
            return Ok(());
        }
        let items = self.into_iter().map(ToJson::to_json).collect::<Result<Vec<_>, _>>()?;
        m.insert(key.to_string(), Value::Array(items));
        Ok(())
    }
}

impl<T: ToJson> Field for BTreeMap<String, T> {
    fn put_into(self, m: &mut Map<String, Value>, key: &str) -> Result<(), ApiError> {
        if self.is_empty() {
            return Ok(());
        }
        let mut out = Map::new();
        for (k, v) in self {
            out.insert(k, v.to_json()?);
        }
        m.insert(key.to_string(), Value::Object(out));
        Ok(())
    }
}

impl ToJson for String {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(Value::String(self))
    }
}

impl ToJson for bool {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(self))
    }
}

impl ToJson for i32 {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(self))
    }
}

impl ToJson for i64 {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(self))
    }
}

impl ToJson for f64 {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(self))
    }
}

/// `[]byte` fields are base64 in JSON (Secret data).
impl ToJson for Vec<u8> {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(base64::engine::general_purpose::STANDARD.encode(self)))
    }
}

/// `StringList` values of maps (e.g. `extra` of subjects) are lists of strings.
impl ToJson for k8s_pb::api::authentication::v1::ExtraValue {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(json!(self.items))
    }
}

fn rfc3339(seconds: i64, nanos: i32, micros: bool) -> Result<Value, ApiError> {
    if seconds == 0 && nanos == 0 {
        return Ok(Value::Null);
    }
    let t = jiff::Timestamp::new(seconds, if micros { nanos } else { 0 })
        .map_err(|e| ApiError::bad_request(format!("protobuf timestamp out of range: {e}")))?;
    let s = if micros { format!("{t:.6}") } else { format!("{t:.0}") };
    Ok(Value::String(s))
}

impl ToJson for k8s_pb::apimachinery::pkg::apis::meta::v1::Time {
    fn to_json(self) -> Result<Value, ApiError> {
        rfc3339(self.seconds.unwrap_or(0), self.nanos.unwrap_or(0), false)
    }
}

impl ToJson for k8s_pb::apimachinery::pkg::apis::meta::v1::MicroTime {
    fn to_json(self) -> Result<Value, ApiError> {
        rfc3339(self.seconds.unwrap_or(0), self.nanos.unwrap_or(0), true)
    }
}

/// `metav1.Duration`: Go's duration string (`1h2m3s`, `500ms`).
impl ToJson for k8s_pb::apimachinery::pkg::apis::meta::v1::Duration {
    fn to_json(self) -> Result<Value, ApiError> {
        let ns = self.duration.unwrap_or(0);
        let s = std::time::Duration::from_nanos(ns.unsigned_abs());
        let sign = if ns < 0 { "-" } else { "" };
        let secs = s.as_secs();
        let out = if secs == 0 {
            format!("{sign}{}ms", s.subsec_millis())
        } else {
            let (h, m, sec) = (secs / 3600, secs / 60 % 60, secs % 60);
            let frac = if s.subsec_nanos() > 0 {
                format!(".{:09}", s.subsec_nanos()).trim_end_matches('0').to_string()
            } else {
                String::new()
            };
            match (h, m) {
                (0, 0) => format!("{sign}{sec}{frac}s"),
                (0, _) => format!("{sign}{m}m{sec}{frac}s"),
                _ => format!("{sign}{h}h{m}m{sec}{frac}s"),
            }
        };
        Ok(Value::String(out))
    }
}

impl ToJson for k8s_pb::apimachinery::pkg::apis::meta::v1::FieldsV1 {
    fn to_json(self) -> Result<Value, ApiError> {
        raw_json(self.raw.unwrap_or_default(), "fieldsV1")
    }
}

impl ToJson for k8s_pb::apimachinery::pkg::runtime::RawExtension {
    fn to_json(self) -> Result<Value, ApiError> {
        raw_json(self.raw.unwrap_or_default(), "RawExtension")
    }
}

fn raw_json(raw: Vec<u8>, what: &str) -> Result<Value, ApiError> {
    if raw.is_empty() {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&raw)
        .map_err(|e| ApiError::bad_request(format!("{what} in a protobuf body is not JSON: {e}")))
}

impl ToJson for k8s_pb::apimachinery::pkg::api::resource::Quantity {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(Value::String(self.string.unwrap_or_default()))
    }
}

/// IntOrString is an object in protobuf and a number or a string in JSON. Its zero (an
/// explicit `0`) is kept: it is only sent when set (`minAvailable: 0`).
impl ToJson for k8s_pb::apimachinery::pkg::util::intstr::IntOrString {
    fn to_json(self) -> Result<Value, ApiError> {
        Ok(match self.r#type.unwrap_or(0) {
            0 => json!(self.int_val.unwrap_or(0)),
            _ => json!(self.str_val.unwrap_or_default()),
        })
    }

    fn keeps_zero() -> bool {
        true
    }
}

/// Decodes one message and converts it.
fn decode<T: Message + Default + ToJson>(raw: &[u8]) -> Result<Value, ApiError> {
    let msg = T::decode(raw).map_err(|e| ApiError::bad_request(format!("decoding the protobuf body: {e}")))?;
    msg.to_json()
}

/// Decodes a protobuf request body into the JSON object it carries.
pub fn decode_body(body: &[u8]) -> Result<Value, ApiError> {
    let rest = body.strip_prefix(MAGIC).ok_or_else(|| {
        ApiError::bad_request("protobuf body does not start with the Kubernetes magic number (k8s\\0)")
    })?;
    let unknown = k8s_pb::apimachinery::pkg::runtime::Unknown::decode(rest)
        .map_err(|e| ApiError::bad_request(format!("decoding the protobuf envelope (runtime.Unknown): {e}")))?;
    let tm = unknown.type_meta.unwrap_or_default();
    let (av, kind) = (tm.api_version.unwrap_or_default(), tm.kind.unwrap_or_default());
    if let Some(enc) = unknown.content_encoding.as_deref().filter(|e| !e.is_empty()) {
        return Err(ApiError::unsupported_media_type(&format!("protobuf contentEncoding {enc}")));
    }
    let raw = unknown.raw.unwrap_or_default();
    // DeleteOptions is registered in every group version (client-go sends it as `v1`,
    // `apps/v1`, ... in the body of a DELETE; Helm's `uninstall` does), so it is not one
    // of the generated kinds.
    let decoded = if kind == "DeleteOptions" {
        Some(decode::<k8s_pb::apimachinery::pkg::apis::meta::v1::DeleteOptions>(&raw))
    } else {
        generated::decode_kind(&av, &kind, &raw)
    };
    let mut obj = decoded.ok_or_else(|| {
        ApiError::unsupported_media_type(&format!(
            "application/vnd.kubernetes.protobuf for {av} {kind} (the simulator decodes protobuf only for the built-in kinds it serves)"
        ))
    })??;
    let mut out = Map::new();
    out.insert("apiVersion".into(), json!(av));
    out.insert("kind".into(), json!(kind));
    if let Some(m) = obj.as_object_mut() {
        out.append(m);
    }
    Ok(Value::Object(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_pb::apimachinery::pkg::apis::meta::v1::{DeleteOptions, Preconditions};
    use k8s_pb::apimachinery::pkg::runtime::{TypeMeta, Unknown};

    fn envelope(api_version: &str, kind: &str, raw: Vec<u8>) -> Vec<u8> {
        let unknown = Unknown {
            type_meta: Some(TypeMeta { api_version: Some(api_version.into()), kind: Some(kind.into()) }),
            raw: Some(raw),
            content_encoding: None,
            content_type: None,
        };
        [MAGIC, &unknown.encode_to_vec()].concat()
    }

    /// The body of a DELETE from client-go (Helm's uninstall) in any group version.
    #[test]
    fn delete_options_decode_in_any_group_version() {
        let opts = DeleteOptions {
            propagation_policy: Some("Foreground".into()),
            preconditions: Some(Preconditions { uid: Some("u-1".into()), resource_version: None }),
            ..Default::default()
        };
        for av in ["v1", "apps/v1"] {
            let got = decode_body(&envelope(av, "DeleteOptions", opts.encode_to_vec())).unwrap();
            assert_eq!(got["apiVersion"], av);
            assert_eq!(got["propagationPolicy"], "Foreground");
            assert_eq!(got["preconditions"]["uid"], "u-1");
        }
        // A kind the simulator does not serve is still refused, naming it.
        let err = decode_body(&envelope("example.com/v1", "Widget", Vec::new())).unwrap_err();
        assert!(format!("{err:?}").contains("example.com/v1 Widget"), "{err:?}");
    }
}
