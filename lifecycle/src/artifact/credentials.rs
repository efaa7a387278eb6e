//! Registry credentials from a Docker config, as Docker finds them: `credHelpers` for the
//! registry first, then the inline `auths` entry (`identitytoken`, `auth`,
//! `username`/`password`), then `credsStore`. The resolution and the helper protocol
//! (`docker-credential-NAME get`) are the `docker_credential` crate's.
//!
//! Helpers run only where they are allowed ([`Helpers::Run`]): on a user's machine (the
//! CLI), never for a pull secret read by the operator, where a Secret would choose the
//! programs the operator runs and whose image has none. There a config that sends the
//! registry to a helper is refused with a reason, not read as "anonymous".

use std::time::Duration;

use docker_credential::{CredentialRetrievalError, DockerCredential};
use oci_client::secrets::RegistryAuth;

use super::registry::RegistryError;

/// How long a credential helper may take: an ECR or GCR helper asks its cloud, which takes
/// seconds; one that has not answered in this time is hung.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(30);

/// The most of a helper's error output quoted in a message.
const QUOTED_BYTES: usize = 300;

/// Whether credential helpers (`credHelpers`, `credsStore`) may be run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Helpers {
    /// Refuse a config that names a helper for the registry (the operator's pull secrets).
    #[default]
    Refuse,
    /// Run `docker-credential-NAME get` as Docker does (the CLI on a user's machine).
    Run,
}

/// The helper a config sends `registry` to, if any: its `credHelpers` entry, or its
/// `credsStore` when the config holds no inline credentials for the registry.
fn helper_for(config: &serde_json::Value, registry: &str, inline: bool) -> Option<String> {
    let named = config.get("credHelpers").and_then(|h| h.get(registry)).and_then(|n| n.as_str());
    let store = config.get("credsStore").and_then(|n| n.as_str()).filter(|_| !inline);
    named.or(store).filter(|n| !n.is_empty()).map(str::to_string)
}

/// The credentials `docker_config` holds for `registry` (`host[:port]`; `docker.io` matches
/// Docker Hub's `https://index.docker.io/v1/` key). Anonymous when it holds none.
///
/// ```
/// use fleetwatch_lifecycle::artifact::credentials::{Helpers, credentials};
/// use oci_client::secrets::RegistryAuth;
/// # let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
/// # rt.block_on(async {
/// let config = br#"{"auths": {"reg.example:5000": {"auth": "dXNlcjpwYXNz"}}}"#;
/// let auth = credentials(config, "reg.example:5000", Helpers::Refuse).await.unwrap();
/// assert_eq!(auth, RegistryAuth::Basic("user".into(), "pass".into()));
/// # });
/// ```
pub async fn credentials(
    docker_config: &[u8],
    registry: &str,
    helpers: Helpers,
) -> Result<RegistryAuth, RegistryError> {
    let config: serde_json::Value = serde_json::from_slice(docker_config)
        .map_err(|e| RegistryError::Config(format!("the Docker config is not valid: {e}")))?;
    if !config.is_object() {
        return Err(RegistryError::Config("the Docker config is not a JSON object".into()));
    }
    // What the config holds inline, read with no helper able to run.
    let mut inline_only = config.clone();
    if let Some(o) = inline_only.as_object_mut() {
        o.remove("credHelpers");
        o.remove("credsStore");
    }
    let inline = resolve(&inline_only, registry, None).await?;
    let Some(helper) = helper_for(&config, registry, inline.is_some()) else {
        return Ok(inline.unwrap_or(RegistryAuth::Anonymous));
    };
    // A `credHelpers` entry wins over inline credentials, as in Docker.
    match helpers {
        Helpers::Refuse => Err(RegistryError::Config(format!(
            "the Docker config sends {registry} to the credential helper docker-credential-{helper}, which is not \
             run here: put the credentials in the config's auths (a kubernetes.io/dockerconfigjson Secret refreshed \
             by your cloud's tooling)"
        ))),
        Helpers::Run => Ok(resolve(&config, registry, Some(&helper)).await?.unwrap_or(RegistryAuth::Anonymous)),
    }
}

/// Resolves with the crate (blocking: it may run a helper) off the async threads, bounded by
/// [`HELPER_TIMEOUT`]. `None` when the config holds nothing for the registry.
async fn resolve(
    config: &serde_json::Value,
    registry: &str,
    helper: Option<&str>,
) -> Result<Option<RegistryAuth>, RegistryError> {
    let bytes = config.to_string().into_bytes();
    let server = registry.to_string();
    let job = tokio::task::spawn_blocking(move || docker_credential::get_credential_from_reader(&bytes[..], &server));
    let helper_name = helper.map(|h| format!("docker-credential-{h}")).unwrap_or_default();
    let result = match tokio::time::timeout(HELPER_TIMEOUT, job).await {
        Err(_) => {
            return Err(RegistryError::Config(format!(
                "the credential helper {helper_name} did not answer for {registry} within {} s",
                HELPER_TIMEOUT.as_secs()
            )));
        }
        Ok(Err(e)) => return Err(RegistryError::Config(format!("reading the Docker config for {registry}: {e}"))),
        Ok(Ok(r)) => r,
    };
    match result {
        Ok(DockerCredential::UsernamePassword(u, p)) => Ok(Some(RegistryAuth::Basic(u, p))),
        Ok(DockerCredential::IdentityToken(t)) => Ok(Some(RegistryAuth::Bearer(t))),
        Err(CredentialRetrievalError::NoCredentialConfigured) => Ok(None),
        Err(e) => Err(RegistryError::Config(explain(e, registry, &helper_name))),
    }
}

/// A message naming the registry and, for helper failures, the helper and what it said.
fn explain(e: CredentialRetrievalError, registry: &str, helper: &str) -> String {
    match e {
        CredentialRetrievalError::CredentialDecodingError => {
            format!("the Docker config's auth for {registry} is not base64(USER:PASSWORD)")
        }
        CredentialRetrievalError::CredentialMismatchError => {
            format!("the Docker config's auth for {registry} disagrees with its username and password")
        }
        CredentialRetrievalError::HelperCommunicationError => {
            format!(
                "the credential helper {helper} for {registry} could not be run or did not read its request: is it on PATH?"
            )
        }
        CredentialRetrievalError::MalformedHelperResponse => {
            format!("the credential helper {helper} for {registry} answered no JSON with Username and Secret")
        }
        CredentialRetrievalError::HelperFailure { stdout, stderr, .. } => {
            let said = if stderr.trim().is_empty() { stdout } else { stderr };
            format!("the credential helper {helper} failed for {registry}: {}", quote(&said))
        }
        other => format!("the Docker config for {registry}: {other}"),
    }
}

/// At most [`QUOTED_BYTES`] of a helper's output, on one line.
fn quote(s: &str) -> String {
    let line = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if line.len() <= QUOTED_BYTES {
        return line;
    }
    let mut end = QUOTED_BYTES;
    while !line.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &line[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn creds(cfg: &[u8], registry: &str) -> Result<RegistryAuth, RegistryError> {
        credentials(cfg, registry, Helpers::Refuse).await
    }

    #[tokio::test]
    async fn inline_credentials_as_docker_writes_them() {
        let cfg = br#"{"auths": {"https://reg.example:5000/v1/": {"auth": "dXNlcjpwYXNz"},
            "other": {"username": "u", "password": "p"},
            "tok.example": {"identitytoken": "t0k"},
            "https://index.docker.io/v1/": {"auth": "aHViOmh1Yg=="}}}"#;
        assert_eq!(creds(cfg, "reg.example:5000").await.unwrap(), RegistryAuth::Basic("user".into(), "pass".into()));
        assert_eq!(creds(cfg, "other").await.unwrap(), RegistryAuth::Basic("u".into(), "p".into()));
        assert_eq!(creds(cfg, "tok.example").await.unwrap(), RegistryAuth::Bearer("t0k".into()));
        assert_eq!(creds(cfg, "docker.io").await.unwrap(), RegistryAuth::Basic("hub".into(), "hub".into()));
        assert_eq!(creds(cfg, "none").await.unwrap(), RegistryAuth::Anonymous);
        assert!(creds(b"{", "x").await.unwrap_err().to_string().contains("not valid"));
        assert!(creds(b"[]", "x").await.unwrap_err().to_string().contains("not a JSON object"));
        let bad = br#"{"auths": {"r": {"auth": "not base64!"}}}"#;
        assert_eq!(
            creds(bad, "r").await.unwrap_err().to_string(),
            "the Docker config's auth for r is not base64(USER:PASSWORD)"
        );
    }

    #[tokio::test]
    async fn a_helper_is_refused_where_helpers_do_not_run() {
        // Named for the registry: refused even with inline credentials (Docker asks the helper).
        let cfg = br#"{"credHelpers": {"123.dkr.ecr.example": "ecr-login"},
            "auths": {"123.dkr.ecr.example": {"auth": "dXNlcjpwYXNz"}, "inline.example": {"auth": "dXNlcjpwYXNz"}},
            "credsStore": "desktop"}"#;
        let e = creds(cfg, "123.dkr.ecr.example").await.unwrap_err().to_string();
        assert!(e.contains("docker-credential-ecr-login") && e.contains("not run here"), "{e}");
        // The store: only for registries with nothing inline.
        assert_eq!(creds(cfg, "inline.example").await.unwrap(), RegistryAuth::Basic("user".into(), "pass".into()));
        let e = creds(cfg, "other.example").await.unwrap_err().to_string();
        assert!(e.contains("docker-credential-desktop"), "{e}");
        // No helper anywhere: anonymous.
        assert_eq!(creds(br#"{"credHelpers": {"a": "x"}}"#, "b").await.unwrap(), RegistryAuth::Anonymous);
    }

    #[tokio::test]
    async fn a_helper_that_is_missing_is_named() {
        let cfg = br#"{"credHelpers": {"reg.example": "fleetwatch-test-no-such-helper"}}"#;
        let e = credentials(cfg, "reg.example", Helpers::Run).await.unwrap_err().to_string();
        assert_eq!(
            e,
            "the credential helper docker-credential-fleetwatch-test-no-such-helper for reg.example could not be run or did \
             not read its request: is it on PATH?"
        );
    }

    #[test]
    fn quotes_are_one_bounded_line() {
        assert_eq!(quote("a\n b\tc "), "a b c");
        let long = "é".repeat(400);
        let q = quote(&long);
        assert!(q.len() <= QUOTED_BYTES + '…'.len_utf8() && q.ends_with('…'), "{}", q.len());
    }
}
