//! What the hub itself needs around its sessions ([`Context`]): accepting connections
//! (TLS, admission budgets, trust domain), the admin endpoint (readiness) and
//! housekeeping (reloads, closing sessions whose certificate or grant is gone). What the
//! sessions themselves need is the smaller [`Sessions`], which `Context` holds.

use std::sync::Arc;

use fleetwatch_certs::ReloadingServerConfig;

use crate::config::HubConfig;
use crate::session::Sessions;

/// What the hub itself needs around the sessions: accepting connections (TLS, admission
/// budgets, trust domain), the admin endpoint (readiness) and housekeeping (reloads).
pub(crate) struct Context {
    pub(crate) config: HubConfig,
    pub(crate) sessions: Arc<Sessions>,
    pub(crate) tls: ReloadingServerConfig,
    /// The trust domain of the hub's own certificate; clients must share it.
    pub(crate) trust_domain: String,
    /// Handshake and session budgets, refusal counts.
    pub(crate) admission: crate::admission::ConnectionBudget,
    /// Whether the control-plane WatchConfig watch has listed everything (always true for
    /// other sources).
    pub(crate) watch_synced: Arc<crate::watch_source::WatchSync>,
    /// This replica's name among hubs sharing a bus: its wss address.
    pub(crate) replica: String,
    /// The admin endpoint's bearer token, when one is configured.
    pub(crate) admin_token: Option<crate::admin::auth::Token>,
    /// The admin endpoint's TLS (client certificates required), when configured.
    pub(crate) admin_tls: Option<Arc<rustls::ServerConfig>>,
    /// Runtime statuses from the control plane (modules by state), when the hub reads it.
    pub(crate) runtimes: crate::fleet::SharedRuntimes,
    /// Bumped whenever [`Self::runtimes`] changes (the live overview is rebuilt at once).
    pub(crate) runtimes_changed: tokio::sync::watch::Sender<u64>,
    /// What the hub made of each WatchConfig (accepted or why not).
    pub(crate) watch_verdicts: crate::watch_source::Verdicts,
    /// The fleet's state across replicas on a shared bus (empty otherwise).
    pub(crate) fleet: crate::fleet::state::FleetState,
    /// The bus as opened (`sessions.bus` is the same object): empty until it could be.
    pub(crate) storage: Arc<fleetwatch_bus::DeferredBus>,
}

/// One readiness check: its name and `Err(reason)` when failing.
pub(crate) struct Check {
    /// Short name shown in the answer, e.g. `bus`.
    pub(crate) name: &'static str,
    /// `Err(why)` when not ready.
    pub(crate) state: Result<(), String>,
}

impl Context {
    /// Every readiness check: the bus's, then [`Self::readiness`]. Add a check here to make
    /// `/readyz` (and the `ready` metric and overview count) depend on it.
    pub(crate) fn checks(&self) -> Vec<Check> {
        let mut checks = vec![Check { name: "bus", state: self.sessions.bus.health() }];
        checks.extend(self.readiness().into_iter().map(|(name, state)| Check { name, state }));
        checks
    }

    /// Closes every open connection whose certificate the deny list now denies, that has
    /// expired, or (when `recheck_chains`, after the CA bundles changed) no longer verifies.
    pub(crate) fn close_revoked(&self, recheck_chains: bool) {
        let list = self.sessions.revocation.current();
        let now = jiff::Timestamp::now();
        // Copied out: chain verification is too slow to run under the lock new
        // connections take.
        let peers = self.sessions.registry.open_connections();
        for (peer, token) in peers {
            let (label, why) = if list.denies(&peer.identity, &peer.serial) {
                ("revoked", "certificate revoked".to_string())
            } else if peer.not_after <= now {
                ("expired", format!("certificate expired at {}", peer.not_after))
            } else if recheck_chains && let Err(why) = self.tls.verify_peer(&peer.chain) {
                ("untrusted", why)
            } else {
                continue;
            };
            tracing::warn!(identity = %peer.identity, serial = %peer.serial, reason = %why, "closing session");
            self.sessions
                .metrics
                .sessions_expired
                .get_or_create(&crate::metrics::ReasonLabel { reason: label.into() })
                .inc();
            let _ = peer.ended.set(why);
            token.cancel();
        }
    }

    /// Closes the session of every subscriber the access policy no longer names (one whose
    /// filter now reaches outside its grant is ended by its session at its next read).
    pub(crate) fn close_ungranted(&self) {
        for (peer, token) in self.sessions.registry.open_connections() {
            let Ok(identity) = peer.identity.parse::<fleetwatch_protocol::Identity>() else { continue };
            let fleetwatch_protocol::identity::Role::Subscriber(name) = &identity.role else { continue };
            if let crate::policy::access::Decision::Refused(why) = self.sessions.access.decide(name) {
                tracing::warn!(identity = %peer.identity, reason = %why, "closing session");
                let _ = peer.ended.set(why);
                token.cancel();
            }
        }
    }

    /// Named readiness checks beyond the bus: certificates in force and loadable, deny list
    /// readable, control-plane watch synced (when configured). `Err` says what is wrong.
    fn readiness(&self) -> Vec<(&'static str, Result<(), String>)> {
        let not_after = self.tls.not_after();
        let certificates = if not_after <= jiff::Timestamp::now() {
            Err(format!("hub certificate {} expired at {not_after}", self.config.tls.cert.display()))
        } else if let Some(e) = self.tls.load_error() {
            Err(format!("changed certificate files cannot be loaded (the previous ones are in force): {e}"))
        } else {
            Ok(())
        };
        let mut checks = vec![("certificates", certificates)];
        if self.config.deny_list.is_some() {
            let stale = self.sessions.revocation.stale().map(|e| format!("stale, the last good list is in force: {e}"));
            checks.push(("deny-list", stale.map_or(Ok(()), Err)));
        }
        if self.config.access_policy.is_some() {
            let stale = self.sessions.access.stale().map(|e| format!("stale, the last good policy is in force: {e}"));
            checks.push(("access-policy", stale.map_or(Ok(()), Err)));
        }
        if self.config.access_policy_from_control_plane {
            checks.push(("access-policy-objects", self.sessions.access.objects_problem().map_or(Ok(()), Err)));
        }
        if matches!(self.config.watch_source, crate::watch_source::WatchSource::ControlPlane(_)) {
            let synced = self.watch_synced.synced();
            let from = match &self.config.watch_source {
                crate::watch_source::WatchSource::ControlPlane(Some(path)) => format!("kubeconfig {}", path.display()),
                _ => "in-cluster or $KUBECONFIG".into(),
            };
            checks.push((
                "control-plane",
                if synced {
                    Ok(())
                } else {
                    // The watch's last error says why (unreachable, refused credentials, no CRD).
                    let why = self.watch_synced.last_error().map(|e| format!(": {e}")).unwrap_or_default();
                    Err(format!("WatchConfig watch has not synced with the control plane ({from}){why}"))
                },
            ));
        }
        checks
    }
}
