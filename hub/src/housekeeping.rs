//! The hub's periodic chores: reloading the certificates, the deny list and the access
//! policy (keeping the last good one when a file breaks), closing sessions whose
//! certificate or grant is gone, flushing subscriber cursors, and the refusal summary.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::context::Context;

/// Periodic chores: certificate and deny-list reload, closing sessions whose certificate
/// is no longer good, cursor flush, the refusal summary.
pub(crate) async fn run(ctx: Arc<Context>, shutdown: CancellationToken) {
    let mut flush = tokio::time::interval(Duration::from_secs(1));
    let mut reload = tokio::time::interval(ctx.config.tls_reload_interval);
    let mut summary = tokio::time::interval(crate::admission::SUMMARY_INTERVAL);
    summary.tick().await; // the first tick is immediate; summaries cover a whole interval
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = flush.tick() => {
                if let Err(e) = ctx.sessions.bus.flush(fleetwatch_bus::Flush::Cursors).await {
                    tracing::warn!(error = %e, "cannot store subscriber cursors");
                }
            }
            _ = summary.tick() => {
                if let Some(line) = ctx.admission.take_summary() {
                    tracing::warn!("{line}");
                }
                if let Some(line) = crate::session::conn::FAILURE_LOG.take_summary() {
                    tracing::warn!("{line}");
                }
            }
            _ = reload.tick() => {
                let bundles_changed = match ctx.tls.reload_if_changed() {
                    Ok(true) => {
                        tracing::info!("reloaded TLS certificates and CA bundles");
                        true
                    }
                    Ok(false) => false,
                    Err(e) => {
                        tracing::error!(error = %e, "certificate files changed but cannot be loaded; keeping the old ones");
                        false
                    }
                };
                let sessions = &ctx.sessions;
                match sessions.revocation.reload_if_changed() {
                    crate::policy::revocation::Reload::Replaced => {
                        tracing::info!(entries = sessions.revocation.current().len(), "reloaded the deny list");
                        sessions.metrics.deny_list_stale.set(0);
                    }
                    crate::policy::revocation::Reload::Unchanged => {}
                    crate::policy::revocation::Reload::Failed(e) => {
                        tracing::error!(
                            error = %e,
                            entries = sessions.revocation.current().len(),
                            "deny list cannot be used; the last good list stays in force"
                        );
                        sessions.metrics.deny_list_errors.inc();
                        sessions.metrics.deny_list_stale.set(1);
                    }
                }
                match sessions.access.reload_if_changed() {
                    crate::policy::access::Reload::Replaced => {
                        let subscribers = sessions.access.current().map(|p| p.len()).unwrap_or_default();
                        sessions.metrics.access_policy_stale.set(0);
                        tracing::info!(subscribers, "reloaded the subscriber access policy");
                        ctx.close_ungranted();
                    }
                    crate::policy::access::Reload::Unchanged => {}
                    crate::policy::access::Reload::Failed(e) => {
                        // Before the log line: whoever reads the line finds the metric set.
                        sessions.metrics.access_policy_stale.set(1);
                        tracing::error!(
                            error = %e,
                            "subscriber access policy cannot be used; the last good policy stays in force (not ready)"
                        );
                    }
                }
                ctx.close_revoked(bundles_changed);
            }
        }
    }
}
