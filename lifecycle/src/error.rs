//! The operator's errors.
//!
//! A failed reconcile ends up in two places: a log line and the Runtime's status, where the
//! person who owns the runtime reads it. Neither has the call stack, so every error names
//! what was being done and on which object (which runtime, which module, which Kubernetes
//! object), and keeps the underlying error as its `source` instead of flattening it into a
//! string: callers can still match on the Kubernetes error (a 404, a conflict) when they
//! decide whether to retry.

use crate::migration::MigrationError;

/// Operator failures (per reconcile; they never stop the operator).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A Kubernetes API call failed, on the control plane or in a runtime cluster.
    #[error("{action} {object}: {}", plain(source))]
    Kube {
        /// What was being done, e.g. `apply`, `writing status of`.
        action: &'static str,
        /// Which object, e.g. `Deployment default/m-manager` or `Runtime default/eu-1`.
        object: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A runtime cluster cannot be reached.
    #[error("runtime cluster of {runtime} unreachable: {source}")]
    Cluster {
        /// The Runtime, `namespace/name`.
        runtime: String,
        /// Why.
        #[source]
        source: ClusterError,
    },
    /// A runtime cluster holds more `Module` objects than the operator reads.
    #[error(
        "the cluster of {runtime} holds more than {max} Module objects: not read (delete the ones no module needs)"
    )]
    TooManyModules {
        /// The Runtime, `namespace/name`.
        runtime: String,
        /// The most read.
        max: usize,
    },
    /// A template's manifest object is unusable.
    #[error("{0}")]
    Manifest(#[from] ManifestError),
    /// The cluster does not serve an object's kind (its CRD is not there yet).
    #[error("{action} {object}: kind {api_version} {kind} is not served by the cluster (no CRD for it yet)")]
    KindNotServed {
        /// What was being done: `apply`, `create`, `write`.
        action: &'static str,
        /// Which object, in which cluster.
        object: String,
        /// Its apiVersion.
        api_version: String,
        /// Its kind.
        kind: String,
    },
    /// A migration failed.
    #[error("migration {migration} of {module} to {to} failed: {source}")]
    Migration {
        /// The migration's name.
        migration: String,
        /// The module being installed or upgraded.
        module: String,
        /// The version being installed.
        to: semver::Version,
        /// What went wrong.
        #[source]
        source: MigrationError,
    },
    /// An object could not be turned into JSON (or back).
    #[error("serialising {what}: {source}")]
    Serialize {
        /// What, e.g. `the module catalog`.
        what: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
    /// The Runtime finalizer could not be added or removed (cleanup errors are the other
    /// variants, passed through).
    #[error("finalizer of Runtime {runtime}: {}", plain_finalizer(source))]
    Finalizer {
        /// The Runtime, `namespace/name`.
        runtime: String,
        /// kube-runtime's finalizer error.
        #[source]
        source: Box<kube::runtime::finalizer::Error<Error>>,
    },
    /// Not a failure: a deleted Runtime's modules are still being removed (e.g. waiting for
    /// their managed resources to go), so its finalizer stays and the reconcile looks again
    /// soon, without backing off.
    #[error("Runtime {runtime} is being deleted; waiting for modules {} to be removed", modules.join(", "))]
    CleanupPending {
        /// The Runtime, `namespace/name`.
        runtime: String,
        /// The modules not removed yet.
        modules: Vec<String>,
        /// When to look again: soon while removals progress, later while they fail
        /// (the failed ones' backoff).
        again: std::time::Duration,
    },
}

impl Error {
    /// A failed Kubernetes call: `action` on `object`.
    pub fn kube(action: &'static str, object: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube { action, object: object.into(), source }
    }

    /// The step of a reconcile this error stopped (the retry metric's reason).
    pub fn step(&self) -> fleetwatch_api::FailedStep {
        use fleetwatch_api::FailedStep;
        match self {
            Self::Cluster { .. } => FailedStep::Connect,
            Self::Kube { action: "writing the status of", .. } | Self::Finalizer { .. } => FailedStep::StatusWrite,
            Self::Kube { action: "delete", .. } | Self::CleanupPending { .. } => FailedStep::Delete,
            Self::Kube { action: "get" | "list" | "discovery of", .. } => FailedStep::Read,
            Self::Kube { .. } | Self::Manifest(_) | Self::Serialize { .. } | Self::KindNotServed { .. } => {
                FailedStep::Apply
            }
            Self::Migration { .. } => FailedStep::Migration,
            Self::TooManyModules { .. } => FailedStep::Read,
        }
    }
}

/// A Kubernetes client error in one line for people: what the API server said and its code
/// (`namespace ghost-ns does not exist (404)`), or why it could not be asked (`cannot reach
/// the API server: ...: Connection refused`); never the Debug dump of its `Status`.
pub fn plain(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => {
            let details = s.details.as_ref();
            if s.code == 404
                && let Some(d) = details.filter(|d| d.kind == "namespaces" && !d.name.is_empty())
            {
                return format!("namespace {} does not exist (404)", d.name);
            }
            let what = if s.message.is_empty() { s.reason.as_str() } else { s.message.as_str() };
            match (what.is_empty(), s.code) {
                (true, 0) => "the API server refused the request".into(),
                (true, code) => format!("the API server answered {code}"),
                (false, 0) => what.to_string(),
                (false, code) => format!("{what} ({code})"),
            }
        }
        kube::Error::HyperError(inner) => format!("cannot reach the API server: {}", chain(inner)),
        kube::Error::Service(inner) => format!("cannot reach the API server: {}", chain(inner.as_ref())),
        other => chain(other),
    }
}

/// An error and its sources in one line, each said once (`a: b: c`).
fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = vec![e.to_string()];
    let mut next = e.source();
    while let Some(s) = next {
        let text = s.to_string();
        if !parts.last().is_some_and(|last| last.contains(&text)) {
            parts.push(text);
        }
        next = s.source();
    }
    parts.join(": ")
}

fn plain_finalizer(e: &kube::runtime::finalizer::Error<Error>) -> String {
    use kube::runtime::finalizer::Error as F;
    match e {
        F::AddFinalizer(k) => format!("adding the finalizer: {}", plain(k)),
        F::RemoveFinalizer(k) => format!("removing the finalizer: {}", plain(k)),
        F::ApplyFailed(inner) | F::CleanupFailed(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// Why a runtime cluster cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig Secret cannot be read.
    #[error("reading Secret {secret}: {}", plain(source))]
    ReadSecret {
        /// `namespace/name`.
        secret: String,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// The Runtime names a kubeconfig Secret in a namespace the operator does not read
    /// kubeconfigs from.
    #[error("Secret {secret}: kubeconfig Secrets are read from namespace {allowed} only ({why})")]
    ForeignNamespace {
        /// `namespace/name` as the Runtime names it.
        secret: String,
        /// The one namespace kubeconfigs are read from.
        allowed: String,
        /// Where that namespace comes from.
        why: &'static str,
    },
    /// The kubeconfig Secret does not exist.
    #[error("Secret {secret} not found")]
    SecretNotFound {
        /// `namespace/name`.
        secret: String,
    },
    /// The Secret lacks the key holding the kubeconfig.
    #[error("Secret {secret} has no key {key:?}")]
    MissingKey {
        /// `namespace/name`.
        secret: String,
        /// The key.
        key: String,
    },
    /// The kubeconfig is not UTF-8.
    #[error("Secret {secret}: kubeconfig is not UTF-8")]
    NotUtf8 {
        /// `namespace/name`.
        secret: String,
    },
    /// The kubeconfig cannot be read or used.
    #[error("Secret {secret}: bad kubeconfig: {source}")]
    Kubeconfig {
        /// `namespace/name`.
        secret: String,
        /// kube's error.
        #[source]
        source: kube::config::KubeconfigError,
    },
    /// No client can be built from the kubeconfig.
    #[error("Secret {secret}: {}", plain(source))]
    Client {
        /// `namespace/name`.
        secret: String,
        /// kube's error.
        #[source]
        source: kube::Error,
    },
}

/// What is wrong with a manifest object.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// A required field is missing.
    #[error("bad manifest: an object without {field}")]
    MissingField {
        /// `apiVersion`, `kind` or `metadata.name`.
        field: &'static str,
    },
    /// The object is not a Kubernetes object.
    #[error("bad manifest: {kind} {name} is not a Kubernetes object: {source}")]
    NotAnObject {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The serde error.
        #[source]
        source: serde_json::Error,
    },
}

#[cfg(test)]
mod tests {
    #[test]
    fn plain_says_what_the_api_server_said_and_its_code() {
        use super::plain;
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 404, "reason": "NotFound", "message": "namespaces \"ghost-ns\" not found",
            "details": {"name": "ghost-ns", "kind": "namespaces"}}))
        .unwrap();
        assert_eq!(plain(&kube::Error::Api(Box::new(status))), "namespace ghost-ns does not exist (404)");
        let status: kube::core::Status = serde_json::from_value(serde_json::json!({
            "status": "Failure", "code": 422, "reason": "Invalid", "message": "Deployment.apps \"m\" is invalid: spec.replicas: must be >= 0"})).unwrap();
        assert_eq!(
            plain(&kube::Error::Api(Box::new(status))),
            "Deployment.apps \"m\" is invalid: spec.replicas: must be >= 0 (422)"
        );
    }
}
