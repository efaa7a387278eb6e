//! Where the hub's watch configuration comes from: WatchConfig files in a directory
//! (re-read when they change) or WatchConfig resources in the control-plane cluster
//! (watched). Every change is published to all agent sessions at once.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, SystemTime};

use fleetwatch_api::watchconfig::{WatchConfig, load_dir};
use fleetwatch_protocol::message::WatchSpec;
use futures_util::StreamExt;
use kube::runtime::{WatchStreamExt, watcher};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::HubError;

/// A source of WatchConfigs.
#[derive(Debug, Clone, Default)]
pub enum WatchSource {
    /// No watches are pushed.
    #[default]
    None,
    /// YAML / JSON manifests in a directory.
    Dir(PathBuf),
    /// WatchConfig resources in the cluster this kubeconfig reaches.
    ControlPlane(Option<PathBuf>),
}

type Publish = watch::Sender<Arc<Vec<WatchSpec>>>;

fn specs(configs: &[WatchConfig]) -> Vec<WatchSpec> {
    let mut out: Vec<WatchSpec> = configs
        .iter()
        .filter_map(|c| match c.to_watch_spec() {
            Ok(s) => Some(s),
            Err(e) => {
                tracing::warn!(error = %e, "ignoring invalid WatchConfig");
                None
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

impl WatchSource {
    /// The configuration at start-up: files are read now (an error stops the start);
    /// the control plane is read by [`run`].
    pub fn initial(&self) -> Result<Vec<WatchSpec>, HubError> {
        match self {
            WatchSource::Dir(dir) => Ok(specs(&load_dir(dir).map_err(|e| HubError::WatchConfig(e.to_string()))?)),
            _ => Ok(Vec::new()),
        }
    }
}

/// Keeps the published configuration up to date until shutdown; `synced` tells readiness
/// whether the control-plane watch has listed everything (other sources are always synced).
pub async fn run(source: WatchSource, publish: Publish, synced: Arc<AtomicBool>, shutdown: CancellationToken) {
    match source {
        WatchSource::None => {}
        WatchSource::Dir(dir) => {
            tokio::select! {
                _ = follow_dir(dir, &publish) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        WatchSource::ControlPlane(kubeconfig) => {
            tokio::select! {
                _ = follow_control_plane(kubeconfig, &publish, &synced) => {}
                _ = shutdown.cancelled() => {}
            }
        }
    }
}

fn set(publish: &Publish, next: Vec<WatchSpec>) {
    publish.send_if_modified(|cur| {
        if **cur == next {
            return false;
        }
        let names = next.iter().map(|w| w.name.as_str()).collect::<Vec<_>>().join(", ");
        tracing::info!(watches = next.len(), %names, "watch configuration changed");
        *cur = Arc::new(next);
        true
    });
}

/// Polls the directory's files for changes (cheap: a stat per file per second).
async fn follow_dir(dir: PathBuf, publish: &Publish) {
    let stamp = |dir: &PathBuf| -> Vec<(PathBuf, Option<SystemTime>, u64)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .into_iter()
            .flatten()
            .filter_map(|e| e.ok())
            .map(|e| {
                let m = e.metadata().ok();
                (e.path(), m.as_ref().and_then(|m| m.modified().ok()), m.map_or(0, |m| m.len()))
            })
            .collect();
        v.sort();
        v
    };
    let mut last = stamp(&dir);
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = stamp(&dir);
        if now == last {
            continue;
        }
        last = now;
        match load_dir(&dir) {
            Ok(configs) => set(publish, specs(&configs)),
            Err(e) => tracing::warn!(error = %e, "cannot reload WatchConfigs; keeping the current ones"),
        }
    }
}

/// A client of the control plane: `kubeconfig`, else in a pod its service account, in a
/// shell `$KUBECONFIG` or `~/.kube/config`. Retries every 5 s until it can build one.
pub async fn control_plane_client(kubeconfig: Option<PathBuf>) -> kube::Client {
    loop {
        let client = match &kubeconfig {
            Some(path) => fleetwatch_client::kubeconfig::client_from_kubeconfig(path).await.map_err(|e| e.to_string()),
            None => kube::Client::try_default().await.map_err(|e| e.to_string()),
        };
        match client {
            Ok(c) => return c,
            Err(e) => {
                let path = kubeconfig.as_ref().map_or("in-cluster or $KUBECONFIG".into(), |p| p.display().to_string());
                tracing::error!(error = %e, %path, "cannot reach the control plane; retrying");
                tokio::time::sleep(Duration::from_secs(5)).await;
            }
        }
    }
}

async fn follow_control_plane(kubeconfig: Option<PathBuf>, publish: &Publish, synced: &AtomicBool) {
    let client = control_plane_client(kubeconfig).await;
    let api: kube::Api<WatchConfig> = kube::Api::all(client);
    let mut current: BTreeMap<String, WatchConfig> = BTreeMap::new();
    let mut building: Option<BTreeMap<String, WatchConfig>> = None;
    let stream = watcher(api, watcher::Config::default()).default_backoff();
    futures_util::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        // Synced from the first complete list on; not while the watch is failing.
        match &ev {
            Ok(watcher::Event::InitDone) => synced.store(true, Ordering::Relaxed),
            Err(_) => synced.store(false, Ordering::Relaxed),
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if !synced.load(Ordering::Relaxed) => {
                synced.store(true, Ordering::Relaxed)
            }
            Ok(_) => {}
        }
        match ev {
            Ok(watcher::Event::Init) => building = Some(BTreeMap::new()),
            Ok(watcher::Event::InitApply(wc)) => {
                if let Some(b) = building.as_mut() {
                    b.insert(wc.metadata.name.clone().unwrap_or_default(), wc);
                }
            }
            Ok(watcher::Event::InitDone) => {
                if let Some(b) = building.take() {
                    current = b;
                }
                set(publish, specs(&current.values().cloned().collect::<Vec<_>>()));
            }
            Ok(watcher::Event::Apply(wc)) => {
                current.insert(wc.metadata.name.clone().unwrap_or_default(), wc);
                set(publish, specs(&current.values().cloned().collect::<Vec<_>>()));
            }
            Ok(watcher::Event::Delete(wc)) => {
                current.remove(&wc.metadata.name.clone().unwrap_or_default());
                set(publish, specs(&current.values().cloned().collect::<Vec<_>>()));
            }
            Err(e) => tracing::warn!(error = %e, "watching WatchConfigs in the control plane failed; retrying"),
        }
    }
}
