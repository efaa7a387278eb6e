//! Leader election through a `coordination.k8s.io/v1` Lease, so only one instance acts.
//!
//! The algorithm is client-go's: the holder renews `renewTime` every `renew_every`; a
//! candidate takes the Lease over when the record it observed has not changed for a whole
//! `lease_duration` *by its own clock* (so clock skew between machines does not matter);
//! every write carries the resourceVersion it read, so two candidates never both win. A
//! leader that cannot renew within `renew_deadline` stops acting before anyone may take over.
//!
//! One [`LeaseLock`] guards one Lease; shards (a later step) use one Lease each.
//!
//! ```no_run
//! # async fn demo(client: kube::Client) {
//! use fleetwatch_lifecycle::election::{ElectionConfig, LeaseLock};
//! let lock = LeaseLock::new(client, ElectionConfig::new("default", "fleetwatch-lifecycle", "pod-a"));
//! let shutdown = tokio_util::sync::CancellationToken::new();
//! lock.run(shutdown, |leading| async move {
//!     // act until `leading` is cancelled
//!     leading.cancelled().await;
//! })
//! .await;
//! # }
//! ```

use std::future::Future;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// Election settings.
#[derive(Debug, Clone)]
pub struct ElectionConfig {
    /// Namespace of the Lease.
    pub namespace: String,
    /// Name of the Lease.
    pub name: String,
    /// Who this instance is (shown as the holder).
    pub identity: String,
    /// How long a Lease is valid without renewal.
    pub lease_duration: Duration,
    /// A leader that could not renew for this long stops acting (less than the duration).
    pub renew_deadline: Duration,
    /// How often the leader renews and candidates look.
    pub retry_period: Duration,
}

impl ElectionConfig {
    /// Settings with client-go's defaults: 15 s lease, 10 s renew deadline, 2 s retry.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.into(),
            name: name.into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    /// Scales the deadlines to a lease duration (renew deadline 2/3, retry 2/15 of it).
    pub fn with_lease_duration(mut self, d: Duration) -> Self {
        self.lease_duration = d;
        self.renew_deadline = d * 2 / 3;
        self.retry_period = (d * 2 / 15).max(Duration::from_millis(200));
        self
    }
}

/// Why one round of the election did not make us leader.
#[derive(Debug, thiserror::Error)]
pub enum ElectionError {
    /// Another instance holds a valid Lease.
    #[error("lease {lease} is held by {holder}")]
    HeldBy {
        /// The Lease.
        lease: String,
        /// Its holder.
        holder: String,
    },
    /// The API server refused or could not be reached.
    #[error("lease {lease}: {source}")]
    Api {
        /// The Lease.
        lease: String,
        /// Why.
        source: kube::Error,
    },
}

/// One Lease and this instance's view of it.
pub struct LeaseLock {
    api: Api<Lease>,
    config: ElectionConfig,
    /// The record last seen (holder, renew time, transitions) and when we saw it change.
    observed: Option<(String, Instant)>,
}

impl LeaseLock {
    /// A lock on the Lease `config.namespace/config.name`.
    pub fn new(client: kube::Client, config: ElectionConfig) -> Self {
        Self { api: Api::namespaced(client, &config.namespace), config, observed: None }
    }

    fn lease_key(&self) -> String {
        format!("{}/{}", self.config.namespace, self.config.name)
    }

    fn spec(&self, transitions: i32, acquired: Option<MicroTime>) -> LeaseSpec {
        let now = MicroTime(jiff::Timestamp::now());
        LeaseSpec {
            holder_identity: Some(self.config.identity.clone()),
            lease_duration_seconds: Some(self.config.lease_duration.as_secs().max(1) as i32),
            acquire_time: Some(acquired.unwrap_or_else(|| now.clone())),
            renew_time: Some(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: creates, renews or takes over the Lease. `Ok(())` when we hold it now.
    pub async fn try_acquire_or_renew(&mut self) -> Result<(), ElectionError> {
        let lease = self.lease_key();
        let api_err = |source| ElectionError::Api { lease: lease.clone(), source };
        let current = self.api.get_opt(&self.config.name).await.map_err(api_err)?;
        let Some(mut current) = current else {
            let fresh = Lease {
                metadata: ObjectMeta {
                    name: Some(self.config.name.clone()),
                    namespace: Some(self.config.namespace.clone()),
                    ..ObjectMeta::default()
                },
                spec: Some(self.spec(0, None)),
            };
            self.api.create(&PostParams::default(), &fresh).await.map_err(api_err)?;
            return Ok(());
        };
        let spec = current.spec.clone().unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        let record = format!("{holder}|{:?}|{:?}", spec.renew_time.as_ref().map(|t| t.0), spec.lease_transitions);
        let now = Instant::now();
        let changed_at = match &self.observed {
            Some((seen, at)) if *seen == record => *at,
            _ => {
                self.observed = Some((record, now));
                now
            }
        };
        let duration = spec
            .lease_duration_seconds
            .map(|s| Duration::from_secs(s.max(1) as u64))
            .unwrap_or(self.config.lease_duration);
        let mine = holder == self.config.identity;
        let expired = holder.is_empty() || now.duration_since(changed_at) >= duration;
        if !mine && !expired {
            return Err(ElectionError::HeldBy { lease, holder });
        }
        let transitions = spec.lease_transitions.unwrap_or(0) + i32::from(!mine);
        let acquired = if mine { spec.acquire_time.clone() } else { None };
        current.spec = Some(self.spec(transitions, acquired));
        // The resourceVersion read above guards the write: a concurrent winner makes it 409.
        self.api.replace(&self.config.name, &PostParams::default(), &current).await.map_err(api_err)?;
        Ok(())
    }

    /// Releases the Lease if we hold it (on a clean shutdown), so a successor need not wait.
    pub async fn release(&mut self) {
        let Ok(Some(mut current)) = self.api.get_opt(&self.config.name).await else { return };
        let Some(spec) = current.spec.as_mut() else { return };
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.renew_time = None;
        spec.acquire_time = None;
        if let Err(e) = self.api.replace(&self.config.name, &PostParams::default(), &current).await {
            tracing::warn!(lease = %self.lease_key(), error = %e, "cannot release the lease");
        }
    }

    /// Runs `lead` whenever this instance leads, until `shutdown`. `lead` gets a token that
    /// is cancelled when leadership is lost (or on shutdown) and must stop acting then; the
    /// next term starts only after it returned.
    pub async fn run<F, Fut>(mut self, shutdown: CancellationToken, mut lead: F)
    where
        F: FnMut(CancellationToken) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let lease = self.lease_key();
        let mut last_holder = String::new();
        loop {
            // Candidate: look every retry period until we win or shut down.
            loop {
                match self.try_acquire_or_renew().await {
                    Ok(()) => break,
                    Err(ElectionError::HeldBy { holder, .. }) => {
                        if holder != last_holder {
                            tracing::info!(%lease, leader = %holder, "another instance leads; waiting");
                            last_holder = holder;
                        }
                    }
                    Err(e) => tracing::warn!(error = %e, "leader election round failed"),
                }
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(self.config.retry_period) => {}
                }
            }
            tracing::info!(%lease, identity = %self.config.identity, "leading");
            last_holder = self.config.identity.clone();
            let leading = shutdown.child_token();
            let mut term = tokio::spawn(lead(leading.clone()));
            let mut renewed = Instant::now();
            let mut finished = false;
            let lost = loop {
                tokio::select! {
                    _ = &mut term => { finished = true; break false }
                    _ = shutdown.cancelled() => break false,
                    _ = tokio::time::sleep(self.config.retry_period) => {}
                }
                match self.try_acquire_or_renew().await {
                    Ok(()) => renewed = Instant::now(),
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot renew the lease");
                        if matches!(e, ElectionError::HeldBy { .. }) || renewed.elapsed() >= self.config.renew_deadline
                        {
                            break true;
                        }
                    }
                }
            };
            leading.cancel();
            if !finished {
                let _ = term.await;
            }
            if lost {
                tracing::warn!(%lease, "lost leadership; stopped acting");
                continue;
            }
            self.release().await;
            return;
        }
    }
}
