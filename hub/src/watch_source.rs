//! Where the hub's watch configuration comes from: WatchConfig files in a directory
//! (re-read when they change) or WatchConfig resources in the control-plane cluster
//! (watched). Every change is published to all agent sessions at once.
//!
//! Both sources go through one check, [`judge`]: a WatchConfig that fails it is never
//! pushed, and the [`Verdict`]s say so (the admin API, `fleetwatch status`, the web view,
//! and for resources their status, written by `watch_status`).

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::{Duration, SystemTime};

use fleetwatch_api::watchconfig::{WatchConfig, WatchConfigStatus, read_dir};
use fleetwatch_protocol::message::WatchSpec;
use futures_util::StreamExt;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::error::HubError;

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

/// The `source` of WatchConfig resources in [`Verdict`]s.
pub(crate) const CONTROL_PLANE: &str = "control-plane";

/// What the hub made of one WatchConfig: pushed to agents (`accepted`) or not, and why.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", default)]
pub struct Verdict {
    /// Its name (empty for a file that cannot be parsed).
    pub name: String,
    /// Where it comes from: its file, or [`CONTROL_PLANE`].
    pub source: String,
    /// The resource's `metadata.generation` (control plane only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Whether it is pushed to agents.
    pub accepted: bool,
    /// `Accepted`, or why not: `Invalid`, `DuplicateName`, `Unparsable`.
    pub reason: String,
    /// What is wrong, for people (empty when accepted).
    pub message: String,
    /// Clusters whose agent reports this watch (filled in when shown).
    pub clusters: u32,
    /// The resource's status as last read from the control plane (not shown).
    #[serde(skip)]
    pub observed: Option<WatchConfigStatus>,
}

/// The verdicts on the WatchConfigs in force, shared with the admin API and the status writer.
pub(crate) type Verdicts = Arc<RwLock<Vec<Verdict>>>;

/// The one check for files and resources: each WatchConfig must make a valid
/// [`WatchSpec`] and its name must be unique (a second one of a name is refused: two files
/// may both define one). Returns what is pushed (by name) and a verdict on each.
pub(crate) fn judge(configs: &[(String, WatchConfig)]) -> (Vec<WatchSpec>, Vec<Verdict>) {
    let mut specs = Vec::new();
    let mut verdicts = Vec::new();
    let mut names: BTreeMap<String, String> = BTreeMap::new();
    for (source, wc) in configs {
        let name = wc.metadata.name.clone().unwrap_or_default();
        let mut v = Verdict {
            name: name.clone(),
            source: source.clone(),
            generation: wc.metadata.generation,
            observed: wc.status.clone(),
            ..Verdict::default()
        };
        match wc.to_watch_spec() {
            Err(e) => (v.reason, v.message) = ("Invalid".into(), e.why),
            Ok(_) if names.contains_key(&name) => {
                v.reason = "DuplicateName".into();
                v.message = format!("a WatchConfig named {name:?} is already defined in {}", names[&name]);
            }
            Ok(spec) => {
                names.insert(name, source.clone());
                specs.push(spec);
                (v.accepted, v.reason) = (true, "Accepted".into());
            }
        }
        if !v.accepted {
            tracing::warn!(watch = %v.name, source = %v.source, reason = %v.reason, "WatchConfig not pushed to agents: {}", v.message);
        }
        verdicts.push(v);
    }
    specs.sort_by(|a, b| a.name.cmp(&b.name));
    (specs, verdicts)
}

/// Judges and publishes: agents get the accepted ones, the verdicts replace the old ones.
fn apply(publish: &Publish, verdicts: &Verdicts, configs: &[(String, WatchConfig)], extra: Vec<Verdict>) {
    let (specs, mut judged) = judge(configs);
    judged.extend(extra);
    if let Ok(mut v) = verdicts.write() {
        *v = judged;
    }
    set(publish, specs);
}

impl WatchSource {
    /// The configuration at start-up: files are read now, and one that cannot be parsed or
    /// holds a WatchConfig [`judge`] refuses stops the start (later edits are judged one by
    /// one); the control plane is read by [`run`].
    pub(crate) fn initial(&self, verdicts: &Verdicts) -> Result<Vec<WatchSpec>, HubError> {
        let WatchSource::Dir(dir) = self else { return Ok(Vec::new()) };
        let mut configs = Vec::new();
        for (path, docs) in read_dir(dir).map_err(|e| HubError::WatchConfig(e.to_string()))? {
            let docs = docs.map_err(|why| HubError::WatchConfig(format!("{}: {why}", path.display())))?;
            configs.extend(docs.into_iter().map(|d| (path.display().to_string(), d)));
        }
        let (specs, judged) = judge(&configs);
        if let Some(bad) = judged.iter().find(|v| !v.accepted) {
            return Err(HubError::WatchConfig(format!("{}: WatchConfig {:?}: {}", bad.source, bad.name, bad.message)));
        }
        if let Ok(mut v) = verdicts.write() {
            *v = judged;
        }
        Ok(specs)
    }
}

/// Whether the control-plane watch has listed everything, and while it has not, why: its
/// last error (for `/readyz`).
#[derive(Debug, Default)]
pub(crate) struct WatchSync {
    synced: AtomicBool,
    error: std::sync::Mutex<Option<String>>,
}

impl WatchSync {
    /// Most bytes of an error kept.
    const MAX_ERROR: usize = 512;

    /// Synced from the start (`true`: a source that needs no listing) or not yet.
    pub(crate) fn new(synced: bool) -> Self {
        Self { synced: AtomicBool::new(synced), error: Default::default() }
    }

    /// Whether the watch has listed everything (and not failed since).
    pub(crate) fn synced(&self) -> bool {
        self.synced.load(Ordering::Relaxed)
    }

    /// The last error of the watch since it was last synced.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    fn set_synced(&self) {
        self.synced.store(true, Ordering::Relaxed);
        if let Ok(mut e) = self.error.lock() {
            *e = None;
        }
    }

    fn failed(&self, error: &dyn std::fmt::Display) {
        self.synced.store(false, Ordering::Relaxed);
        let mut text = error.to_string();
        if text.len() > Self::MAX_ERROR {
            let mut end = Self::MAX_ERROR;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text.truncate(end);
            text.push('…');
        }
        if let Ok(mut e) = self.error.lock() {
            *e = Some(text);
        }
    }
}

/// Keeps the published configuration up to date until shutdown; `synced` tells readiness
/// whether the control-plane watch has listed everything (other sources are always synced).
pub(crate) async fn run(
    source: WatchSource,
    publish: Publish,
    verdicts: Verdicts,
    synced: Arc<WatchSync>,
    shutdown: CancellationToken,
) {
    match source {
        WatchSource::None => {}
        WatchSource::Dir(dir) => {
            tokio::select! {
                _ = follow_dir(dir, &publish, &verdicts) => {}
                _ = shutdown.cancelled() => {}
            }
        }
        WatchSource::ControlPlane(kubeconfig) => {
            tokio::select! {
                _ = follow_control_plane(kubeconfig, &publish, &verdicts, &synced) => {}
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

/// Polls the directory's files for changes (cheap: a stat per file per second). Each
/// WatchConfig is judged on its own; a file that cannot be parsed keeps what it defined
/// before in force (its last good contents) and is listed as `Unparsable`.
async fn follow_dir(dir: PathBuf, publish: &Publish, verdicts: &Verdicts) {
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
    // Each file's last contents that parsed: what stays in force while it does not.
    let mut good: BTreeMap<PathBuf, Vec<WatchConfig>> = BTreeMap::new();
    if let Ok(files) = read_dir(&dir) {
        good = files.into_iter().filter_map(|(p, d)| d.ok().map(|d| (p, d))).collect();
    }
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    loop {
        tick.tick().await;
        let now = stamp(&dir);
        if now == last {
            continue;
        }
        last = now;
        let files = match read_dir(&dir) {
            Ok(files) => files,
            Err(e) => {
                tracing::warn!(error = %e, "cannot reload WatchConfigs; keeping the current ones");
                continue;
            }
        };
        let present: HashSet<PathBuf> = files.iter().map(|(p, _)| p.clone()).collect();
        good.retain(|p, _| present.contains(p));
        let mut unparsable = Vec::new();
        for (path, docs) in files {
            match docs {
                Ok(docs) => {
                    good.insert(path, docs);
                }
                Err(why) => {
                    let source = path.display().to_string();
                    tracing::warn!(file = %source, error = %why, "cannot parse WatchConfig file; what it defined before stays in force");
                    unparsable.push(Verdict {
                        source,
                        reason: "Unparsable".into(),
                        message: format!("{why} (what the file defined before stays in force)"),
                        ..Verdict::default()
                    });
                }
            }
        }
        let configs: Vec<(String, WatchConfig)> =
            good.iter().flat_map(|(p, docs)| docs.iter().map(move |d| (p.display().to_string(), d.clone()))).collect();
        apply(publish, verdicts, &configs, unparsable);
    }
}

/// A client of the control plane: `kubeconfig`, else in a pod its service account, in a
/// shell `$KUBECONFIG` or `~/.kube/config`. Retries every 5 s until it can build one.
pub(crate) async fn control_plane_client(kubeconfig: Option<PathBuf>) -> kube::Client {
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

async fn follow_control_plane(kubeconfig: Option<PathBuf>, publish: &Publish, verdicts: &Verdicts, synced: &WatchSync) {
    let client = control_plane_client(kubeconfig).await;
    let api: kube::Api<WatchConfig> = kube::Api::all(client);
    let mut current: BTreeMap<String, WatchConfig> = BTreeMap::new();
    let mut building: Option<BTreeMap<String, WatchConfig>> = None;
    let stream = fleetwatch_client::kube_watch::relisting_watcher(api, watcher::Config::default());
    futures_util::pin_mut!(stream);
    while let Some(ev) = stream.next().await {
        // Synced from the first complete list on; not while the watch is failing.
        match &ev {
            Ok(watcher::Event::InitDone) => synced.set_synced(),
            Err(e) => synced.failed(e),
            Ok(watcher::Event::Apply(_) | watcher::Event::Delete(_)) if !synced.synced() => synced.set_synced(),
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
                apply(publish, verdicts, &from_control_plane(&current), Vec::new());
            }
            Ok(watcher::Event::Apply(wc)) => {
                current.insert(wc.metadata.name.clone().unwrap_or_default(), wc);
                apply(publish, verdicts, &from_control_plane(&current), Vec::new());
            }
            Ok(watcher::Event::Delete(wc)) => {
                current.remove(&wc.metadata.name.clone().unwrap_or_default());
                apply(publish, verdicts, &from_control_plane(&current), Vec::new());
            }
            Err(e) => tracing::warn!(error = %e, "watching WatchConfigs in the control plane failed; retrying"),
        }
    }
}

fn from_control_plane(current: &BTreeMap<String, WatchConfig>) -> Vec<(String, WatchConfig)> {
    current.values().map(|wc| (CONTROL_PLANE.to_string(), wc.clone())).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::watchconfig::{ResourceRef, WatchConfigSpec};

    #[test]
    fn the_watchs_last_error_is_kept_until_it_syncs() {
        let s = WatchSync::new(false);
        assert!(!s.synced() && s.last_error().is_none());
        s.failed(&"failed to perform initial object list: client error (Connect)");
        assert_eq!(s.last_error().as_deref(), Some("failed to perform initial object list: client error (Connect)"));
        s.set_synced();
        assert!(s.synced() && s.last_error().is_none());
        s.failed(&"é".repeat(1000));
        let e = s.last_error().unwrap();
        assert!(!s.synced() && e.len() <= WatchSync::MAX_ERROR + '…'.len_utf8() && e.ends_with('…'), "{e}");
    }

    fn wc(name: &str, selector: Option<&str>) -> WatchConfig {
        WatchConfig::new(
            name,
            WatchConfigSpec {
                resource: ResourceRef { group: String::new(), version: "v1".into(), kind: "ConfigMap".into() },
                label_selector: selector.map(str::to_string),
                ..WatchConfigSpec::default()
            },
        )
    }

    #[test]
    fn an_invalid_or_duplicate_watchconfig_is_not_pushed_and_says_why() {
        let configs = vec![
            ("a.yaml".to_string(), wc("cms", None)),
            ("a.yaml".to_string(), wc("bad", Some("app=(web"))),
            ("b.yaml".to_string(), wc("cms", Some("app=web"))),
        ];
        let (specs, verdicts) = judge(&configs);
        assert_eq!(specs.iter().map(|s| s.name.as_str()).collect::<Vec<_>>(), ["cms"]);
        assert_eq!(specs[0].label_selector, None, "the first of a name wins");
        let bad = &verdicts[1];
        assert!(!bad.accepted && bad.reason == "Invalid", "{bad:?}");
        assert!(bad.message.contains("labelSelector \"app=(web\""), "{bad:?}");
        let dup = &verdicts[2];
        assert!(!dup.accepted && dup.reason == "DuplicateName" && dup.message.contains("a.yaml"), "{dup:?}");
        assert!(verdicts[0].accepted && verdicts[0].reason == "Accepted");
    }
}
