//! The hub as a whole ([`Hub`]): binding it (start-up checks, certificates, listeners, the
//! deny list and access policy, the bus opened or kept trying) and running it (every task
//! under one shutdown, and a stop of its own when the bus can never work again).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_bus::Bus;
use fleetwatch_certs::{CertError, ReloadingServerConfig, TlsFiles};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::config::HubConfig;
use crate::context::Context;
use crate::error::HubError;
use crate::listener::{Listener, bind_retrying};
use crate::metrics::Metrics;
use crate::registry::SessionRegistry;
use crate::session::Sessions;

/// A bound, not yet running hub.
pub struct Hub {
    ctx: Arc<Context>,
    listener: Listener,
    admin: Option<TcpListener>,
    /// How to open the bus, while it could not be opened yet (see [`crate::opening`]).
    open: Option<crate::opening::OpenBus>,
}

impl Hub {
    /// Loads certificates, opens the bus and binds the listeners.
    pub async fn bind(config: HubConfig) -> Result<Self, HubError> {
        Self::bind_on(config, None).await
    }

    /// Like [`bind`](Self::bind), but accepts agents and subscribers from `listener`
    /// instead of binding `config.listen` (the simulation's network); `None` binds it.
    pub async fn bind_on(config: HubConfig, listener: Option<Listener>) -> Result<Self, HubError> {
        Self::bind_with(config, listener, None).await
    }

    /// Like [`bind_on`](Self::bind_on), opening the bus with `open` (the simulation's NATS
    /// bus on an in-memory JetStream); `None` opens the one `config` says. A bus that
    /// cannot be opened for a while does not stop the start: see [`crate::opening`].
    pub async fn bind_with(
        mut config: HubConfig,
        listener: Option<Listener>,
        open: Option<crate::opening::OpenBus>,
    ) -> Result<Self, HubError> {
        fleetwatch_certs::install_crypto_provider();
        // What cannot work is refused before anything is opened, one line each.
        crate::policy::preflight::check(&config).await?;
        fit_open_file_limit(&mut config);
        // The admin endpoint's protection is checked before anything listens or is opened: fail closed.
        let (admin_token, admin_tls) = match config.admin_listen {
            Some(addr) => {
                let token = crate::admin::auth::check(addr, &config.admin_auth)?;
                let tls = match &config.admin_auth.client_ca {
                    // A client certificate is checked per request, so probes need none.
                    Some(ca) => Some(Arc::new(fleetwatch_certs::server_config_optional_client(&TlsFiles {
                        cert: config.tls.cert.clone(),
                        key: config.tls.key.clone(),
                        ca: vec![ca.clone()],
                    })?)),
                    None => None,
                };
                (token, tls)
            }
            None => (None, None),
        };
        let tls = ReloadingServerConfig::new(config.tls.clone())?;
        let open = open.unwrap_or_else(|| crate::opening::from_config(&config));
        let storage = fleetwatch_bus::DeferredBus::new(crate::opening::durable(&config));
        let bus: Arc<dyn Bus> = storage.clone();
        let listener = match listener {
            Some(l) => l,
            None => Listener::Tcp(bind_retrying(config.listen, config.bind_retry).await?),
        };
        let admin = match config.admin_listen {
            Some(addr) => Some(bind_retrying(addr, config.bind_retry).await?),
            None => None,
        };
        // Clients must share the trust domain of the hub's own SPIFFE id.
        let trust_domain = fleetwatch_certs::inspect_file(&config.tls.cert)?
            .require_identity()
            .map_err(|what| CertError::Pem { path: config.tls.cert.clone(), what })?
            .trust_domain;
        // A broken WatchConfig directory is a start-up error; later edits are reloaded.
        let watch_verdicts = crate::watch_source::Verdicts::default();
        let initial_watches = config.watch_source.initial(&watch_verdicts)?;
        let revocation = crate::policy::revocation::Revocation::load(config.deny_list.clone())?;
        // Runtime labels exist only when the hub reads the control plane (crate::fleet::follow_runtimes).
        let reads_runtimes = matches!(config.watch_source, crate::watch_source::WatchSource::ControlPlane(_));
        if config.access_policy_from_control_plane && !reads_runtimes {
            return Err(HubError::Refused(
                "--access-policy-from-control-plane needs a control plane (--control-plane-kubeconfig, or in a pod its \
                 own cluster)"
                    .into(),
            ));
        }
        let access = crate::policy::access::AccessControl::load_with_objects(
            config.access_policy.clone(),
            reads_runtimes,
            config.access_policy_from_control_plane,
        )?;
        let runtimes = crate::fleet::SharedRuntimes::default();
        match access.current() {
            Some(_) if config.access_policy_from_control_plane => tracing::warn!(
                policy = %access.describe(),
                "subscriber access policy from the control plane's SubscriberAccessPolicy objects{}: until they are \
                 listed every subscriber is refused, and with no accepted object only the file grants (none: nobody)",
                if config.access_policy.is_some() { " and the file" } else { "" }
            ),
            Some(policy) => tracing::info!(
                policy = %config.access_policy.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                subscribers = policy.len(),
                "subscriber access policy in force: subscribers it does not name are refused"
            ),
            None => tracing::warn!(
                "no subscriber access policy (--access-policy): every subscriber certificate reads every cluster"
            ),
        }
        let watch_synced = !matches!(config.watch_source, crate::watch_source::WatchSource::ControlPlane(_));
        // Set from the bus once it is open (`crate::opening::adopt`).
        let registry = SessionRegistry::default();
        let sessions = Arc::new(Sessions {
            settings: crate::session::SessionSettings::from_config(&config),
            bus,
            registry,
            metrics: Metrics::default(),
            fanout: crate::fanout::FanOut::default(),
            watches: tokio::sync::watch::channel(Arc::new(initial_watches)).0,
            revocation,
            access,
            subscriber_slots: Default::default(),
            heads: Default::default(),
            runtimes: runtimes.clone(),
        });
        let replica = listener.local_addr().unwrap_or(config.listen).to_string();
        let fleet = crate::fleet::state::FleetState::new(&replica);
        let ctx = Arc::new(Context {
            admission: crate::admission::ConnectionBudget::new(
                config.max_connections,
                config.max_handshakes,
                config.max_handshakes_per_ip,
            ),
            watch_synced: Arc::new(crate::watch_source::WatchSync::new(watch_synced)),
            replica,
            fleet,
            admin_token,
            admin_tls,
            runtimes,
            runtimes_changed: tokio::sync::watch::channel(0).0,
            watch_verdicts,
            config,
            sessions,
            tls,
            trust_domain,
            storage,
        });
        let open = match crate::opening::first(&ctx, &open).await? {
            true => None,
            false => Some(open),
        };
        Ok(Self { ctx, listener, admin, open })
    }

    /// The address agents connect to.
    pub fn local_addr(&self) -> SocketAddr {
        self.listener.local_addr().unwrap_or(self.ctx.config.listen)
    }

    /// The admin address, when enabled.
    pub fn admin_addr(&self) -> Option<SocketAddr> {
        self.admin.as_ref().and_then(|l| l.local_addr().ok())
    }

    /// Whether the bus is open (`false`: the hub serves unready and keeps trying, see
    /// [`crate::opening`]).
    pub fn bus_open(&self) -> bool {
        self.ctx.storage.get().is_some()
    }

    /// Serves until `shutdown` is cancelled, then closes every session after its current
    /// batch is acked, and flushes the bus.
    pub async fn run(self, shutdown: CancellationToken) -> Result<(), HubError> {
        // The hub also stops by itself when its bus can never work again in this process
        // (`Bus::fatal`): serving on would keep it unready and its agents refused until
        // someone restarts it, while an exit lets its supervisor do that at once.
        let outer = shutdown;
        let shutdown = outer.child_token();
        let fatal = Arc::new(std::sync::Mutex::new(None::<String>));
        tokio::spawn(watch_fatal(self.ctx.sessions.bus.clone(), fatal.clone(), shutdown.clone()));
        let tracker = tokio_util::task::TaskTracker::new();
        if let Some(open) = self.open {
            tracker.spawn(crate::opening::keep_opening(self.ctx.clone(), open, shutdown.clone()));
        }
        if let Some(admin) = self.admin {
            tracker.spawn(crate::admin::serve(admin, self.ctx.clone(), shutdown.clone()));
        }
        tracker.spawn(crate::housekeeping::run(self.ctx.clone(), shutdown.clone()));
        tracker.spawn(crate::fleet::writer::run(self.ctx.clone(), shutdown.clone()));
        // Reading WatchConfigs from the control plane, the hub shows its Runtimes too.
        if let crate::watch_source::WatchSource::ControlPlane(kubeconfig) = &self.ctx.config.watch_source {
            tracker.spawn(crate::fleet::follow_runtimes(
                kubeconfig.clone(),
                self.ctx.runtimes.clone(),
                self.ctx.runtimes_changed.clone(),
                shutdown.clone(),
            ));
            // ... and writes what it made of each WatchConfig into its status.
            tracker.spawn(crate::watch_status::run(self.ctx.clone(), kubeconfig.clone(), shutdown.clone()));
            if self.ctx.config.access_policy_from_control_plane {
                tracker.spawn(crate::policy::objects::run(self.ctx.clone(), kubeconfig.clone(), shutdown.clone()));
            }
        }
        tracker.spawn(crate::watch_source::run(
            self.ctx.config.watch_source.clone(),
            self.ctx.sessions.watches.clone(),
            self.ctx.watch_verdicts.clone(),
            self.ctx.watch_synced.clone(),
            shutdown.clone(),
        ));
        crate::server::accept_loop(self.listener, self.ctx.clone(), shutdown.clone(), &tracker).await;
        tracker.close();
        tracker.wait().await;
        let fatal = fatal.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(cause) = fatal {
            return Err(HubError::BusUnusable(cause));
        }
        self.ctx.sessions.bus.flush(fleetwatch_bus::Flush::All).await?;
        tracing::info!("hub stopped");
        Ok(())
    }
}

/// Stops the hub (cancels `stop`) once its bus says it can never work again, keeping why.
async fn watch_fatal(bus: Arc<dyn Bus>, fatal: Arc<std::sync::Mutex<Option<String>>>, stop: CancellationToken) {
    let mut every = tokio::time::interval(Duration::from_secs(1));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = every.tick() => {}
        }
        if let Some(cause) = bus.fatal() {
            tracing::error!(%cause, "the bus cannot work again in this process: stopping so that the supervisor starts this hub replica again");
            *fatal.lock().unwrap_or_else(|e| e.into_inner()) = Some(cause);
            stop.cancel();
            return;
        }
    }
}

/// Raises the open-file limit and fits the connection budgets under it, in one log line.
fn fit_open_file_limit(config: &mut HubConfig) {
    let Some(limit) = crate::admission::raise_open_file_limit() else { return };
    let (sessions, handshakes) =
        crate::admission::fit_to_fd_limit(config.max_connections, config.max_handshakes, limit);
    if (sessions, handshakes) == (config.max_connections, config.max_handshakes) {
        tracing::info!(
            open_files = limit,
            max_connections = sessions,
            max_handshakes = handshakes,
            "open-file limit allows the connection budgets"
        );
    } else {
        let mut lowered = vec![format!("--max-connections from {} to {sessions}", config.max_connections)];
        if handshakes != config.max_handshakes {
            lowered.push(format!("--max-handshakes from {} to {handshakes}", config.max_handshakes));
        }
        let lowered = lowered.join(" and ");
        if config.connection_budgets_given {
            tracing::warn!(
                open_files = limit,
                "open-file limit {limit} is too low: lowering {lowered} (raise the hard limit, e.g. LimitNOFILE, to allow more)"
            );
        } else {
            tracing::info!(
                open_files = limit,
                "open-file limit {limit}: lowering the default {lowered} (raise the hard limit, e.g. LimitNOFILE, to allow more)"
            );
        }
        config.max_connections = sessions;
        config.max_handshakes = handshakes;
    }
}
