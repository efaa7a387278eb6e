//! [`SimCluster`]: one simulated cluster — its state, TLS listener, background controllers
//! and fault-injection handle — all owned by one task tree that ends on
//! [`SimCluster::shutdown`] or drop. No global state, so a test can run many.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use hyper_util::rt::{TokioExecutor, TokioIo};
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::authz::Tokens;
use crate::error::{ApiError, SimError};
use crate::faults::{FaultState, Faults};
use crate::ops::{self, WriteOpts};
use crate::store::State;
use crate::{http, kubeconfig, tls};

/// Default number of watch events retained for watches that resume from a resourceVersion.
pub const DEFAULT_HISTORY: usize = 10_000;

/// How to start a [`SimCluster`].
///
/// ```
/// use fleetwatch_sim::SimOptions;
/// let opts = SimOptions { name: "edge-1".into(), history: 50, ..SimOptions::default() };
/// assert_eq!(opts.listen.port(), 0); // any free port
/// ```
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Cluster, user and context name in the kubeconfig.
    pub name: String,
    /// Address to listen on; port 0 picks a free port.
    pub listen: SocketAddr,
    /// Number of write events retained for watches resuming from a resourceVersion;
    /// older resourceVersions get 410 Gone. Small values make tests relist.
    pub history: usize,
    /// Interval of BOOKMARK events on watches that asked for them.
    pub bookmark_interval: Duration,
    /// Events buffered per watcher; a watcher that falls this far behind is closed.
    pub watch_buffer: usize,
    /// Bearer token clients must present; random when `None`.
    pub token: Option<String>,
    /// Safety-net period of the garbage collector (it also runs after every delete).
    pub gc_period: Duration,
    /// Enforce RBAC for ServiceAccount tokens (the cluster's own token keeps full
    /// access). Off: every authenticated caller may do everything.
    pub rbac: bool,
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions {
            name: "sim".into(),
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            history: DEFAULT_HISTORY,
            bookmark_interval: Duration::from_secs(10),
            watch_buffer: 1024,
            token: None,
            gc_period: Duration::from_secs(5),
            rbac: false,
        }
    }
}

/// Shared by the listener, the request handlers, the watch streams and the controllers.
pub(crate) struct Core {
    state: Mutex<State>,
    pub faults: FaultState,
    pub gc_wake: Notify,
    pub shutdown: CancellationToken,
    pub options: SimOptions,
    pub token: String,
    pub server_addr: String,
    /// ServiceAccount tokens. Lock order: `tokens` before `state`.
    pub tokens: Mutex<Tokens>,
    /// Endpoints of Service ports, for the service proxy. Never held with `state`.
    pub endpoints: Mutex<crate::proxy::Endpoints>,
}

impl Core {
    /// Locks the state. A panic while locked cannot leave it half-written in a way later
    /// requests could not handle, so a poisoned lock is taken over.
    pub fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A running simulated Kubernetes API server.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use fleetwatch_sim::{SimCluster, SimOptions};
/// let sim = SimCluster::start(SimOptions::default()).await?;
/// sim.write_kubeconfig(std::path::Path::new("/tmp/sim.kubeconfig"))?;
/// println!("serving {}", sim.url());
/// let client: kube::Client = sim.client().await?;
/// sim.shutdown();
/// # Ok(()) }
/// ```
pub struct SimCluster {
    core: Arc<Core>,
    addr: SocketAddr,
    ca_pem: String,
}

impl SimCluster {
    /// Generates the CA, binds the listener and starts serving.
    pub async fn start(options: SimOptions) -> Result<SimCluster, SimError> {
        let tls = tls::generate(&[])?;
        let listener = TcpListener::bind(options.listen)
            .await
            .map_err(|e| SimError::io(format!("binding {}", options.listen), e))?;
        let addr = listener.local_addr().map_err(|e| SimError::io("reading local address", e))?;
        let token = options.token.clone().unwrap_or_else(|| {
            let b: [u8; 24] = rand::random();
            hex::encode(b)
        });
        let mut state = State::new(options.history);
        seed(&mut state);
        let core = Arc::new(Core {
            state: Mutex::new(state),
            faults: FaultState::default(),
            gc_wake: Notify::new(),
            shutdown: CancellationToken::new(),
            token,
            server_addr: addr.to_string(),
            tokens: Mutex::new(Tokens::default()),
            endpoints: Mutex::default(),
            options,
        });
        let span = tracing::info_span!("sim", cluster = %core.options.name, %addr);
        tokio::spawn(crate::gc::run(core.clone(), core.options.gc_period).instrument(span.clone()));
        tokio::spawn(
            serve(core.clone(), listener, tokio_rustls::TlsAcceptor::from(tls.server_config)).instrument(span),
        );
        Ok(SimCluster { core, addr, ca_pem: tls.ca_pem })
    }

    /// The cluster name (as in the kubeconfig).
    pub fn name(&self) -> &str {
        &self.core.options.name
    }

    /// The bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// The bearer token clients present.
    pub fn token(&self) -> &str {
        &self.core.token
    }

    /// PEM of the cluster's self-signed CA.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The kubeconfig as a JSON value.
    pub fn kubeconfig(&self) -> Value {
        kubeconfig::build(self.name(), &self.url(), &self.ca_pem, &self.core.token)
    }

    /// The kubeconfig as text kubectl and kube-rs read (JSON, which is valid YAML).
    pub fn kubeconfig_yaml(&self) -> String {
        serde_json::to_string_pretty(&self.kubeconfig()).unwrap_or_default()
    }

    /// Writes the kubeconfig to `path` (mode 0600, as it holds a credential).
    pub fn write_kubeconfig(&self, path: &Path) -> Result<(), SimError> {
        write_private(path, &self.kubeconfig_yaml())
    }

    /// A bearer token for the ServiceAccount `ns/name`, valid for a year or until the
    /// account is deleted; the account is created when it does not exist (the namespace
    /// must). Under [`SimOptions::rbac`] the token gets what the account's bindings grant.
    pub fn token_for(&self, ns: &str, name: &str) -> Result<String, ApiError> {
        let mut tokens = self.core.tokens.lock().unwrap_or_else(|p| p.into_inner());
        let mut st = self.core.lock();
        if st.get(SERVICEACCOUNTS, &(ns.to_string(), name.to_string())).is_none() {
            let def = st
                .registry
                .get("", "v1", "serviceaccounts")
                .cloned()
                .ok_or_else(|| ApiError::internal("serviceaccounts are not served"))?;
            let w = WriteOpts { manager: "fleetwatch-sim".into(), ..Default::default() };
            ops::create(&mut st, &def, Some(ns), json!({"metadata": {"name": name}}), &w)?;
        }
        Ok(tokens.issue(&st, ns, name, Duration::from_secs(365 * 24 * 3600))?.0)
    }

    /// A kubeconfig like [`SimCluster::kubeconfig`] that authenticates with `token`.
    pub fn kubeconfig_with_token(&self, token: &str) -> Value {
        kubeconfig::build(self.name(), &self.url(), &self.ca_pem, token)
    }

    /// Writes a kubeconfig for the ServiceAccount `ns/name` (see [`SimCluster::token_for`]).
    pub fn write_kubeconfig_for(&self, path: &Path, ns: &str, name: &str) -> Result<(), SimError> {
        let token = self.token_for(ns, name).map_err(|e| SimError::Args(format!("token for {ns}/{name}: {e}")))?;
        write_private(path, &serde_json::to_string_pretty(&self.kubeconfig_with_token(&token)).unwrap_or_default())
    }

    /// Makes `address` the endpoint of port `port` of the Service `ns/name`, for the API
    /// server's service proxy (`/api/v1/namespaces/NS/services/NAME:PORT/proxy/…`, what
    /// `kubectl get --raw` and a `kube::Client` reach a Service through). `port` is the
    /// Service port's name (`""` for a Service's one unnamed port), as in the Endpoints
    /// object a cluster's endpoints controller would write; the Service object itself is
    /// created as usual (without it the proxy answers 404, and a port it does not declare
    /// has no endpoint). Only loopback addresses: the sim is not an open proxy.
    ///
    /// ```no_run
    /// # async fn demo(sim: &fleetwatch_sim::SimCluster) -> Result<(), Box<dyn std::error::Error>> {
    /// sim.expose_service("fleetwatch-system", "fleetwatch-hub-admin", "admin", "127.0.0.1:9090".parse()?)?;
    /// # Ok(()) }
    /// ```
    pub fn expose_service(&self, ns: &str, name: &str, port: &str, address: SocketAddr) -> Result<(), ApiError> {
        self.core.endpoints.lock().unwrap_or_else(|p| p.into_inner()).insert(ns, name, port, address)
    }

    /// Removes the endpoint [`SimCluster::expose_service`] registered (the proxy then
    /// answers 503 `no endpoints available`, as for a Service without ready pods); whether
    /// there was one.
    pub fn unexpose_service(&self, ns: &str, name: &str, port: &str) -> bool {
        self.core.endpoints.lock().unwrap_or_else(|p| p.into_inner()).remove(ns, name, port)
    }

    /// The fault-injection handle.
    pub fn faults(&self) -> Faults {
        Faults { core: self.core.clone() }
    }

    /// The current cluster-wide resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.core.lock().rv
    }

    /// A `kube::Client` for this cluster (through the same kubeconfig a user gets).
    #[cfg(feature = "kube-client")]
    pub async fn client(&self) -> Result<kube::Client, SimError> {
        let kc =
            kube::config::Kubeconfig::from_yaml(&self.kubeconfig_yaml()).map_err(|e| SimError::Kube(e.to_string()))?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| SimError::Kube(e.to_string()))?;
        kube::Client::try_from(cfg).map_err(|e| SimError::Kube(e.to_string()))
    }

    /// Stops serving: the listener, open connections and watches, and the controllers.
    pub fn shutdown(&self) {
        self.core.shutdown.cancel();
    }

    /// The shared state (for in-crate helpers such as the bench).
    #[cfg_attr(not(feature = "kube-client"), allow(dead_code))]
    pub(crate) fn core(&self) -> &Arc<Core> {
        &self.core
    }

    /// A token cancelled when the cluster shuts down.
    pub fn shutdown_token(&self) -> CancellationToken {
        self.core.shutdown.clone()
    }
}

impl Drop for SimCluster {
    fn drop(&mut self) {
        self.core.shutdown.cancel();
    }
}

/// Writes a file holding a credential (mode 0600), creating its directory.
pub(crate) fn write_private(path: &Path, text: &str) -> Result<(), SimError> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| SimError::io(format!("creating {}", dir.display()), e))?;
    }
    std::fs::write(path, text).map_err(|e| SimError::io(format!("writing {}", path.display()), e))?;
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600));
    }
    Ok(())
}

/// Store key of ServiceAccounts.
const SERVICEACCOUNTS: &str = "/serviceaccounts";

/// `POST …/serviceaccounts/NAME/token` (the TokenRequest API `kubectl create token` uses):
/// issues a token for an existing ServiceAccount and answers the TokenRequest with it.
pub(crate) fn token_request(core: &Core, ns: &str, name: &str, mut request: Value) -> Result<Value, ApiError> {
    let secs = request["spec"]["expirationSeconds"].as_u64().unwrap_or(3600);
    if secs < 600 {
        return Err(ApiError::invalid(
            "TokenRequest",
            "authentication.k8s.io",
            name,
            &[(
                "spec.expirationSeconds",
                format!("Invalid value: {secs}: may not specify a duration less than 10 minutes"),
            )],
        ));
    }
    let mut tokens = core.tokens.lock().unwrap_or_else(|p| p.into_inner());
    let (token, expires) = tokens.issue(&core.lock(), ns, name, Duration::from_secs(secs))?;
    let expires =
        jiff::Timestamp::try_from(expires).map(|t| t.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()).unwrap_or_default();
    if request["spec"]["audiences"].as_array().is_none_or(|a| a.is_empty()) {
        request["spec"]["audiences"] = json!(["https://kubernetes.default.svc.cluster.local"]);
    }
    request["spec"]["expirationSeconds"] = json!(secs);
    Ok(json!({
        "kind": "TokenRequest",
        "apiVersion": "authentication.k8s.io/v1",
        "metadata": {"name": name, "namespace": ns, "creationTimestamp": null},
        "spec": request["spec"],
        "status": {"token": token, "expirationTimestamp": expires},
    }))
}

/// The namespaces every cluster starts with.
fn seed(st: &mut State) {
    let Some(def) = st.registry.get("", "v1", "namespaces").cloned() else { return };
    for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        let w = WriteOpts { manager: "kube-apiserver".into(), ..Default::default() };
        let _ = ops::create(st, &def, None, json!({"metadata": {"name": ns}}), &w);
    }
}

async fn serve(core: Arc<Core>, listener: TcpListener, acceptor: tokio_rustls::TlsAcceptor) {
    tracing::info!("serving");
    loop {
        let accepted = tokio::select! {
            _ = core.shutdown.cancelled() => break,
            a = listener.accept() => a,
        };
        let (tcp, peer) = match accepted {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = tcp.set_nodelay(true);
        let core = core.clone();
        let acceptor = acceptor.clone();
        tokio::spawn(
            async move {
                let tls = match acceptor.accept(tcp).await {
                    Ok(t) => t,
                    Err(e) => {
                        tracing::debug!(error = %e, "tls handshake failed");
                        return;
                    }
                };
                let shutdown = core.shutdown.clone();
                let svc = hyper::service::service_fn(move |req| http::handle(core.clone(), req));
                let builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
                let conn = builder.serve_connection(TokioIo::new(tls), svc);
                tokio::select! {
                    r = conn => if let Err(e) = r { tracing::debug!(error = %e, "connection ended") },
                    _ = shutdown.cancelled() => {}
                }
            }
            .instrument(tracing::debug_span!("conn", %peer)),
        );
    }
    tracing::info!("stopped");
}
