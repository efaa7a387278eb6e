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
    #[error("{action} {object}: {source}")]
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
    /// A template's manifest object is unusable.
    #[error("bad manifest: {0}")]
    Manifest(#[from] ManifestError),
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
    #[error("finalizer of Runtime {runtime}: {source}")]
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
    },
}

impl Error {
    /// A failed Kubernetes call: `action` on `object`.
    pub fn kube(action: &'static str, object: impl Into<String>, source: kube::Error) -> Self {
        Self::Kube { action, object: object.into(), source }
    }
}

/// Why a runtime cluster cannot be reached.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The kubeconfig Secret cannot be read.
    #[error("reading Secret {secret}: {source}")]
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
    #[error("Secret {secret}: {source}")]
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
    #[error("an object without {field}")]
    MissingField {
        /// `apiVersion`, `kind` or `metadata.name`.
        field: &'static str,
    },
    /// The cluster does not serve the object's kind.
    #[error("kind {api_version} {kind} is not served by the cluster")]
    KindNotServed {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
    },
    /// The object is not a Kubernetes object.
    #[error("{kind} {name} is not a Kubernetes object: {source}")]
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
