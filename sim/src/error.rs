//! Errors: [`ApiError`] is what a request gets back (rendered as a Kubernetes
//! `Status` object, with the code and reason kube-apiserver would use, because clients
//! branch on `reason`, not on the message); [`SimError`] is what starting a cluster can fail with.

use serde_json::{Value, json};

/// An error answered to a client as a `meta.k8s.io/v1` `Status`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status code, also `Status.code`.
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `AlreadyExists`, `Conflict`, `Invalid`, `Expired`.
    pub reason: &'static str,
    /// Human-readable `Status.message`.
    pub message: String,
    /// `Status.details`, when there are any.
    pub details: Option<Value>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError { code, reason, message: message.into(), details: None }
    }

    fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// `404 NotFound` for an object: `configmaps "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(404, "NotFound", format!("{qualified} \"{name}\" not found"))
            .with_details(details(group, plural, name))
    }

    /// `404 NotFound` for a path that serves nothing.
    pub fn no_route(path: &str) -> Self {
        Self::new(404, "NotFound", format!("the server could not find the requested resource ({path})"))
            .with_details(json!({"causes": [{"reason": "UnexpectedServerResponse", "message": "404 page not found"}]}))
    }

    /// `409 AlreadyExists`.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(409, "AlreadyExists", format!("{qualified} \"{name}\" already exists"))
            .with_details(details(group, plural, name))
    }

    /// `409 Conflict` for a stale `metadata.resourceVersion` (optimistic concurrency).
    pub fn conflict(group: &str, plural: &str, name: &str) -> Self {
        let qualified = qualified(group, plural);
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(details(group, plural, name))
    }

    /// `409 Conflict` for a server-side apply that touches fields other managers own.
    pub fn apply_conflict(conflicts: &[(String, String)]) -> Self {
        let n = conflicts.len();
        let mut message = format!("Apply failed with {n} conflict{}:", if n == 1 { "" } else { "s" });
        let mut causes = Vec::new();
        for (manager, field) in conflicts {
            message.push_str(&format!(" conflict with \"{manager}\": {field}"));
            causes.push(json!({"reason": "FieldManagerConflict", "message": format!("conflict with \"{manager}\""), "field": field}));
        }
        Self::new(409, "Conflict", message).with_details(json!({"causes": causes}))
    }

    /// `410 Expired`: a resourceVersion or continue token older than the retained history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// `422 Invalid` with one cause per bad field.
    pub fn invalid(kind: &str, group: &str, name: &str, causes: &[(&str, String)]) -> Self {
        let list: Vec<String> = causes.iter().map(|(f, m)| format!("{f}: {m}")).collect();
        let msg = if list.len() == 1 { list[0].clone() } else { format!("[{}]", list.join(", ")) };
        let qualified = if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") };
        Self::new(422, "Invalid", format!("{qualified} \"{name}\" is invalid: {msg}")).with_details(json!({
            "name": name, "group": group, "kind": kind,
            "causes": causes.iter().map(|(f, m)| json!({"reason": "FieldValueInvalid", "message": m, "field": f})).collect::<Vec<_>>(),
        }))
    }

    /// `400 BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// `413 RequestEntityTooLarge`: a request body over the server's limit, worded as
    /// kube-apiserver words it (`Request entity too large: limit is 3145728`).
    pub fn too_large(limit: usize) -> Self {
        Self::new(413, "RequestEntityTooLarge", format!("Request entity too large: limit is {limit}"))
    }

    /// `401 Unauthorized` for a missing or wrong bearer token.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// `403 Forbidden`, e.g. creating in a terminating namespace.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// `405 MethodNotAllowed`.
    pub fn method_not_allowed() -> Self {
        Self::new(405, "MethodNotAllowed", "the server does not allow this method on the requested resource")
    }

    /// `415 UnsupportedMediaType`, e.g. an unknown patch type.
    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml, application/strategic-merge-patch+json (got {ct})"
            ),
        )
    }

    /// `406 NotAcceptable`: no media type the client accepts can be produced.
    pub fn not_acceptable(accept: &str) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: application/json, application/json;as=Table;v=v1;g=meta.k8s.io (got {accept})"
            ),
        )
    }

    /// `500 InternalError` (also what the fault injector answers).
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// `429 TooManyRequests` (what the fault injector answers when asked to throttle).
    pub fn too_many_requests() -> Self {
        Self::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        )
        .with_details(json!({"retryAfterSeconds": 1}))
    }

    /// The `Status` object clients decode.
    pub fn to_status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() { plural.to_string() } else { format!("{plural}.{group}") }
}

fn details(group: &str, plural: &str, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": plural});
    if !group.is_empty() {
        d["group"] = json!(group);
    }
    d
}

/// What starting or running a simulated cluster can fail with.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// Binding or serving the listen address failed.
    #[error("io error on {what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Creating the self-signed CA or the serving certificate failed.
    #[error("certificate generation failed: {0}")]
    Cert(#[from] rcgen::Error),
    /// Building the TLS configuration failed.
    #[error("tls configuration failed: {0}")]
    Tls(#[from] rustls::Error),
    /// Invalid command-line arguments.
    #[error("invalid arguments: {0}")]
    Args(String),
    /// Building a kube client failed.
    #[cfg(feature = "kube-client")]
    #[error("kube client: {0}")]
    Kube(String),
}

impl SimError {
    pub(crate) fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        SimError::Io { what: what.into(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn not_found_status_matches_apiserver_shape() {
        let s = ApiError::not_found("apps", "deployments", "web").to_status();
        assert_eq!(s["kind"], "Status");
        assert_eq!(s["code"], 404);
        assert_eq!(s["reason"], "NotFound");
        assert_eq!(s["message"], "deployments.apps \"web\" not found");
        assert_eq!(s["details"]["group"], "apps");
    }

    #[test]
    fn apply_conflict_lists_fields() {
        let e = ApiError::apply_conflict(&[("kubectl".into(), ".data.a".into())]);
        assert_eq!(e.code, 409);
        assert!(e.message.contains("1 conflict:"), "{}", e.message);
        assert_eq!(e.to_status()["details"]["causes"][0]["field"], ".data.a");
    }
}
