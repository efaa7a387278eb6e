//! Who may use the admin endpoint.
//!
//! On a loopback address nothing is required by default (only local processes reach it).
//! Bound anywhere else, the hub refuses to start unless a bearer token
//! (`--admin-token-file`) or client certificates (`--admin-client-ca`: the admin port then
//! speaks TLS with the hub's certificate, and every path but the open ones needs a client
//! certificate signed by that CA; see `tls`) protect it. Configured protection is enforced on every address. `/healthz` and
//! `/readyz` stay open for probes (they tell nothing but "alive" and "ready: bus ok"), and
//! so does the login page that turns a token into a cookie for browsers; everything else
//! needs `Authorization: Bearer <token>`, `X-Fleetwatch-Admin-Token: <token>` or that cookie.
//!
//! The second header exists for the Kubernetes API server's service proxy
//! (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/…`, what `fleetwatch status
//! --kubeconfig` goes through): kube-apiserver authenticates the caller with
//! `Authorization` and removes it before forwarding, so a bearer token for the hub cannot
//! travel in it; other headers are forwarded (decision 0040).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use fleetwatch_certs::{Compare, Reload, ReloadingFile};

/// The admin endpoint's protection, as configured.
#[derive(Debug, Clone, Default)]
pub struct AdminAuthConfig {
    /// A file holding the bearer token (surrounding whitespace is ignored).
    pub token_file: Option<PathBuf>,
    /// CA bundle whose client certificates may use the admin endpoint (TLS).
    pub client_ca: Option<PathBuf>,
}

/// Why the admin endpoint cannot be protected as configured.
#[derive(Debug, thiserror::Error)]
pub enum AdminAuthError {
    /// Bound beyond loopback with nothing protecting it.
    #[error(
        "--admin-listen {0} is not a loopback address: refusing to serve the admin API unprotected; give \
         --admin-token-file FILE (a bearer token) or --admin-client-ca FILE (client certificates), or listen on 127.0.0.1"
    )]
    Unprotected(SocketAddr),
    /// The token file cannot be read.
    #[error("cannot read the admin token file {path}: {source}")]
    TokenFile {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The token has characters a header or cookie cannot carry.
    #[error("the admin token in {0} may only contain printable ASCII without spaces, ';', ',', '\"' or '\\'")]
    BadToken(PathBuf),
    /// The token is too short to be a secret.
    #[error("the admin token in {0} is shorter than 16 characters: use a long random one (e.g. openssl rand -hex 32)")]
    WeakToken(PathBuf),
}

/// The token checked on each request (never printed). Loaded from its file, it follows
/// the file: a rotated token (a new Secret mounted by Kubernetes, a file rewritten) is in
/// force from the next request on, without a restart. A replacement that cannot be read
/// or is not a valid token is refused with a warning, and the token in force stays: the
/// endpoint never ends up unprotected.
#[derive(Clone)]
pub(crate) struct Token(Arc<ReloadingFile<String>>);

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Token(<redacted>)")
    }
}

/// Reads and checks a token file.
fn read_token(path: &Path) -> Result<String, AdminAuthError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| AdminAuthError::TokenFile { path: path.to_path_buf(), source })?;
    let token = text.trim();
    if !token.chars().all(|c| c.is_ascii_graphic() && !matches!(c, ';' | ',' | '"' | '\\')) {
        return Err(AdminAuthError::BadToken(path.to_path_buf()));
    }
    if token.len() < 16 {
        return Err(AdminAuthError::WeakToken(path.to_path_buf()));
    }
    Ok(token.to_string())
}

impl Token {
    /// Reads and checks a token file; the token then follows the file (see [`Token`]): a
    /// rewrite is noticed by the file's modified time and length, as it is checked at
    /// every request.
    pub(crate) fn load(path: &Path) -> Result<Self, AdminAuthError> {
        let token = ReloadingFile::load(vec![path.to_path_buf()], Compare::ModifiedAndLength, |_| read_token(path))?;
        Ok(Self(Arc::new(token)))
    }

    /// A token that is not read from a file.
    #[cfg(test)]
    pub(crate) fn fixed(token: &str) -> Self {
        Self(Arc::new(ReloadingFile::fixed(token.to_string())))
    }

    /// Takes a rewritten file's token in, if it is valid (else keeps the one in force).
    fn refresh(&self) {
        let Some(path) = self.0.paths().first() else { return };
        if std::fs::metadata(path).and_then(|m| m.modified()).is_err() {
            return; // gone for the moment (a Secret's files are swapped)
        }
        let mut rotated = false;
        let reload = self.0.reload_if_changed(|_, old| {
            let token = read_token(path)?;
            rotated = token != *old;
            Ok::<_, AdminAuthError>(token)
        });
        match reload {
            Reload::Replaced if rotated => {
                tracing::info!(file = %path.display(), "admin token rotated: the new token is in force");
            }
            Reload::Failed(e) => {
                // Said once per rewrite.
                tracing::warn!(error = %e, "the rewritten admin token file is refused; the token in force stays");
            }
            Reload::Replaced | Reload::Recovered | Reload::Unchanged => {}
        }
    }

    /// Compares in time independent of where the first difference is.
    pub(crate) fn matches(&self, presented: &str) -> bool {
        self.refresh();
        constant_time_eq(self.0.current().as_bytes(), presented.as_bytes())
    }
}

/// `a == b`, looking at every byte whatever differs (the length is not secret).
pub(crate) fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    if a.len() != b.len() {
        return false;
    }
    let diff = a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y));
    std::hint::black_box(diff) == 0
}

/// Checks the configuration before anything binds: fails closed.
pub(crate) fn check(listen: SocketAddr, config: &AdminAuthConfig) -> Result<Option<Token>, AdminAuthError> {
    let token = config.token_file.as_deref().map(Token::load).transpose()?;
    if !listen.ip().is_loopback() && token.is_none() && config.client_ca.is_none() {
        return Err(AdminAuthError::Unprotected(listen));
    }
    Ok(token)
}

/// Paths served without authentication.
pub(crate) fn is_open(path: &str) -> bool {
    matches!(path, "/healthz" | "/readyz" | "/login")
}

/// The header carrying the token where `Authorization` cannot reach the hub (see the
/// module documentation): its whole value is the token.
pub const TOKEN_HEADER: &str = "x-fleetwatch-admin-token";

/// The cookie a browser gets from the login page.
pub(crate) const COOKIE: &str = "fleetwatch_admin";

/// The credential a request presents: the bearer token, else the login cookie.
pub(crate) fn presented<'a>(authorization: Option<&'a str>, cookie: Option<&'a str>) -> Option<&'a str> {
    if let Some(bearer) = authorization.and_then(|h| h.strip_prefix("Bearer ")) {
        return Some(bearer.trim());
    }
    cookie?.split(';').map(str::trim).find_map(|c| c.strip_prefix(COOKIE)?.strip_prefix('='))
}

/// Whether a request may go on as far as the token is concerned: open paths always;
/// otherwise the token must match when one is configured. (With `--admin-client-ca` the
/// admin router also requires a verified client certificate on the connection.)
pub(crate) fn allowed(path: &str, token: Option<&Token>, authorization: Option<&str>, cookie: Option<&str>) -> bool {
    if is_open(path) {
        return true;
    }
    match token {
        None => true,
        Some(t) => presented(authorization, cookie).is_some_and(|p| t.matches(p)),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    fn token_file(dir: &Path, content: &str) -> PathBuf {
        let p = dir.join("token");
        std::fs::write(&p, content).unwrap();
        p
    }

    #[test]
    fn beyond_loopback_something_must_protect_the_admin_api() {
        let dir = tempfile::tempdir().unwrap();
        let any: SocketAddr = "0.0.0.0:9090".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:9090".parse().unwrap();
        let err = check(any, &AdminAuthConfig::default()).unwrap_err();
        assert!(err.to_string().contains("--admin-token-file"), "{err}");
        assert!(check(lo, &AdminAuthConfig::default()).unwrap().is_none());
        assert!(check("[::1]:9090".parse().unwrap(), &AdminAuthConfig::default()).is_ok());
        let with_ca = AdminAuthConfig { client_ca: Some(dir.path().join("ca.crt")), ..Default::default() };
        assert!(check(any, &with_ca).unwrap().is_none());
        let with_token = AdminAuthConfig {
            token_file: Some(token_file(dir.path(), "0123456789abcdef0123\n")),
            ..Default::default()
        };
        assert!(check(any, &with_token).unwrap().unwrap().matches("0123456789abcdef0123"));
        // A missing or weak token fails closed, on loopback too.
        let missing = AdminAuthConfig { token_file: Some(dir.path().join("nope")), ..Default::default() };
        assert!(matches!(check(lo, &missing), Err(AdminAuthError::TokenFile { .. })));
        let weak = AdminAuthConfig { token_file: Some(token_file(dir.path(), " short \n")), ..Default::default() };
        assert!(matches!(check(lo, &weak), Err(AdminAuthError::WeakToken(_))));
        let spaced =
            AdminAuthConfig { token_file: Some(token_file(dir.path(), "0123456789 abcdef0123")), ..Default::default() };
        assert!(matches!(check(lo, &spaced), Err(AdminAuthError::BadToken(_))));
    }

    #[test]
    fn requests_need_the_token_except_on_probe_paths() {
        let t = Token::fixed("0123456789abcdef");
        let good = Some("Bearer 0123456789abcdef");
        assert!(allowed("/api/v1/clusters", Some(&t), good, None));
        assert!(!allowed("/api/v1/clusters", Some(&t), None, None));
        assert!(!allowed("/metrics", Some(&t), Some("Bearer 0123456789abcdeX"), None));
        assert!(!allowed("/metrics", Some(&t), Some("Bearer 0123456789abcdef0"), None));
        assert!(!allowed("/metrics", Some(&t), Some("Basic 0123456789abcdef"), None));
        assert!(allowed("/", Some(&t), None, Some("a=b; fleetwatch_admin=0123456789abcdef")));
        assert!(!allowed("/", Some(&t), None, Some("fleetwatch_admin_x=0123456789abcdef")));
        for open in ["/healthz", "/readyz", "/login"] {
            assert!(allowed(open, Some(&t), None, None), "{open}");
        }
        // Nothing configured (loopback): open.
        assert!(allowed("/metrics", None, None, None));
        assert!(format!("{t:?}").contains("redacted"));
    }

    #[test]
    fn a_rotated_token_file_is_in_force_at_once_and_a_bad_one_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = token_file(dir.path(), "first-token-0123456789\n");
        let t = Token::load(&path).unwrap();
        assert!(t.matches("first-token-0123456789"));
        let rewrite = |content: &str, age: u64| {
            std::fs::write(&path, content).unwrap();
            // Different modification times even on a coarse clock.
            let when = SystemTime::now() - std::time::Duration::from_secs(age);
            std::fs::File::options().write(true).open(&path).unwrap().set_modified(when).unwrap();
        };
        rewrite("second-token-0123456789\n", 100);
        assert!(t.matches("second-token-0123456789"), "the new token is in force");
        assert!(!t.matches("first-token-0123456789"), "the old one is not");
        // A weak, malformed or missing replacement leaves the token in force.
        rewrite("short\n", 50);
        assert!(t.matches("second-token-0123456789") && !t.matches("short"));
        rewrite("has a space 0123456789\n", 40);
        assert!(t.matches("second-token-0123456789"));
        std::fs::remove_file(&path).unwrap();
        assert!(t.matches("second-token-0123456789"), "a file gone for the moment changes nothing");
        rewrite("third-token-0123456789\n", 30);
        assert!(t.matches("third-token-0123456789") && !t.matches("second-token-0123456789"));
    }

    #[test]
    fn comparison_is_exact() {
        assert!(constant_time_eq(b"abc", b"abc"));
        assert!(!constant_time_eq(b"abc", b"abd"));
        assert!(!constant_time_eq(b"abc", b"ab"));
        assert!(constant_time_eq(b"", b""));
    }
}
