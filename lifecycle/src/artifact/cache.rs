//! The operator's module artifacts (`spec.source.oci.ref` of ModuleTemplates): pulled once
//! per digest, kept on disk (bounded in bytes, least recently used evicted) and once in
//! memory for every runtime's reconcile (bounded too; one [`Arc`] per digest).
//!
//! A digest names immutable content, so a cached artifact is never pulled again: runtimes
//! whose modules are cached keep reconciling while the registry is down. A pull runs in
//! its own task, one per digest however many reconciles want it; a reconcile waits for it
//! at most [`PULL_WAIT`], then tells its module to wait. A failed pull is remembered and
//! not tried again before its backoff has passed (1 s doubling up to [`MAX_RETRY`]; a
//! digest whose content was refused, [`REFUSED_RETRY`]): reconciles in between get the same
//! error without touching the registry.
//!
//! Pulls in flight share one [`PullBudget`] (`--artifact-pull-max-bytes`): each reserves the
//! bound of a manifest while it reads one, then its layers' declared bytes before it fetches
//! any, and holds them until its artifact is kept, so that however many pulls run their
//! buffers stay within the bound. A pull that does not fit waits in its task (first come,
//! first served) at most [`super::registry::BUDGET_WAIT`], its module in `Warning` saying so
//! meanwhile; then it is deferred like a pull that failed (transient, with backoff).
//!
//! On disk: `DIR/sha256-HEX/` holds `manifest.json` (the OCI manifest) and one file per
//! layer, named by the hex of its digest. An entry is checked when read (each layer against
//! its digest, the artifact validated as after a pull); a broken one is deleted and pulled
//! again. Writes go to a temporary directory renamed into place, so a crash leaves no half
//! entry.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::FutureExt;
use futures_util::future::{BoxFuture, Shared};
use oci_client::client::ImageLayer;
use oci_client::manifest::OciImageManifest;

use super::registry::{PullBudget, Registry, RegistryError, RegistryOptions, parse_pinned};
use super::{ModuleArtifact, sha256};

/// How long a reconcile waits for a pull before its module waits instead (the pull goes on).
pub const PULL_WAIT: Duration = Duration::from_secs(5);
/// The longest wait between two pulls of a digest that failed.
pub const MAX_RETRY: Duration = Duration::from_secs(60);
/// The wait before a digest whose content was refused is pulled again.
pub const REFUSED_RETRY: Duration = Duration::from_secs(3600);
/// Default bound of the disk cache.
pub const DEFAULT_DISK_MAX_BYTES: u64 = 1 << 30;
/// Default bound of the memory cache (bytes of the artifacts' objects as JSON).
pub const DEFAULT_MEMORY_MAX_BYTES: u64 = 64 << 20;
/// Default bound of the bytes all pulls in flight may hold together (one artifact of the
/// largest size, [`super::registry::MAX_ARTIFACT_BYTES`], fits).
pub const DEFAULT_PULL_MAX_BYTES: u64 = 64 << 20;

/// Where artifacts come from and where they are kept.
#[derive(Clone, Debug)]
pub struct ArtifactConfig {
    /// How to reach registries (the `--registry-*` flags).
    pub registry: RegistryOptions,
    /// The disk cache; none: memory only (every restart pulls again).
    pub cache_dir: Option<PathBuf>,
    /// Most bytes kept on disk.
    pub disk_max_bytes: u64,
    /// Most bytes (of the objects' JSON) kept in memory.
    pub memory_max_bytes: u64,
    /// Most bytes all pulls in flight may hold together (manifests being read, layers
    /// declared); at least [`super::registry::MAX_MANIFEST_BYTES`].
    pub pull_max_bytes: u64,
}

impl Default for ArtifactConfig {
    fn default() -> Self {
        Self {
            registry: RegistryOptions::default(),
            cache_dir: None,
            disk_max_bytes: DEFAULT_DISK_MAX_BYTES,
            memory_max_bytes: DEFAULT_MEMORY_MAX_BYTES,
            pull_max_bytes: DEFAULT_PULL_MAX_BYTES,
        }
    }
}

/// Why an artifact is not available (yet).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FetchError {
    /// The registry (`host[:port]`).
    pub registry: String,
    /// What went wrong.
    pub message: String,
    /// The artifact itself or the access to it is wrong (digest mismatch, media type,
    /// credentials): the module is in `Error`. Otherwise (registry unreachable, a pull in
    /// progress) the module waits.
    pub permanent: bool,
    /// The artifact's content itself was refused (other bytes than its digest, more bytes
    /// than its descriptor, not a module): a digest names immutable content, so it is pulled
    /// again only after [`REFUSED_RETRY`] (a template naming another digest is pulled at once).
    pub refused: bool,
    /// When a reconcile should look again.
    pub retry_in: Duration,
}

impl std::fmt::Display for FetchError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// Credentials from a `kubernetes.io/dockerconfigjson` Secret, read only when a pull
/// needs them.
#[derive(Clone)]
pub struct PullSecret {
    /// The control-plane client.
    pub client: kube::Client,
    /// The template's namespace.
    pub namespace: String,
    /// The Secret's name.
    pub name: String,
}

/// An artifact as the operator keeps it: everything parsed but its objects, which stay JSON
/// until they are applied ([`Cached::objects`]). A parsed object takes several times the
/// bytes of its JSON (a large CRD's schema is many small maps), so the memory bound counts
/// what is really held.
#[derive(Debug)]
pub struct Cached {
    /// Module name.
    pub name: String,
    /// Version.
    pub version: String,
    /// An upgrade to it waits for a maintenance window.
    pub requires_downtime: bool,
    /// Kinds whose instances block deletion.
    pub managed_resources: Vec<fleetwatch_api::KindRef>,
    /// The manager Deployment.
    pub manager: fleetwatch_api::ResourceRef,
    /// The default configuration.
    pub default_config: Option<serde_json::Value>,
    objects: Vec<u8>,
}

impl Cached {
    /// Keeps a validated artifact.
    pub fn new(a: ModuleArtifact) -> Result<Self, serde_json::Error> {
        Ok(Self {
            objects: serde_json::to_vec(&a.objects)?,
            name: a.name,
            version: a.version,
            requires_downtime: a.requires_downtime,
            managed_resources: a.managed_resources,
            manager: a.manager,
            default_config: a.default_config,
        })
    }

    /// The objects, in apply order (parsed now; they were valid when kept).
    pub fn objects(&self) -> Result<Vec<serde_json::Value>, serde_json::Error> {
        serde_json::from_slice(&self.objects)
    }

    /// Bytes held: the objects' JSON and an estimate of the rest.
    pub fn bytes(&self) -> u64 {
        let config = self.default_config.as_ref().map_or(0, |c| c.to_string().len());
        (self.objects.len() + config + 1024) as u64
    }
}

type PullFuture = Shared<BoxFuture<'static, Result<Arc<Cached>, FetchError>>>;

enum PullState {
    /// The pull, its attempts so far, and the bytes it waits for from the budget (0: none).
    InFlight(PullFuture, u32, Arc<std::sync::atomic::AtomicU64>),
    Failed {
        error: FetchError,
        next_try: Instant,
        attempts: u32,
    },
}

struct Entry {
    artifact: Arc<Cached>,
    bytes: u64,
    used: u64,
}

struct Lru<V> {
    entries: HashMap<String, V>,
    tick: u64,
    bytes: u64,
}

impl<V> Default for Lru<V> {
    fn default() -> Self {
        Self { entries: HashMap::new(), tick: 0, bytes: 0 }
    }
}

/// The artifacts of one operator process.
pub struct Artifacts {
    config: ArtifactConfig,
    memory: Mutex<Lru<Entry>>,
    /// Digest → (bytes, last use) of what is on disk.
    disk: Mutex<Lru<(u64, u64)>>,
    pulls: Mutex<HashMap<String, PullState>>,
    budget: PullBudget,
}

impl Artifacts {
    /// The store; with a cache directory, what is already there is indexed (oldest first by
    /// modification time, which a use updates).
    pub fn new(config: ArtifactConfig) -> std::io::Result<Arc<Self>> {
        let mut disk = Lru::default();
        if let Some(dir) = &config.cache_dir {
            std::fs::create_dir_all(dir)?;
            let mut found = Vec::new();
            for e in std::fs::read_dir(dir)?.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                let path = e.path();
                if name.starts_with(".tmp-") {
                    let _ = std::fs::remove_dir_all(&path);
                    continue;
                }
                let Some(hex) = name.strip_prefix("sha256-") else { continue };
                let modified = e.metadata().and_then(|m| m.modified()).unwrap_or(std::time::UNIX_EPOCH);
                found.push((modified, format!("sha256:{hex}"), dir_bytes(&path)));
            }
            found.sort();
            for (_, digest, bytes) in found {
                disk.tick += 1;
                disk.bytes += bytes;
                disk.entries.insert(digest, (bytes, disk.tick));
            }
        }
        let budget = PullBudget::new(config.pull_max_bytes);
        let a = Arc::new(Self {
            config,
            memory: Default::default(),
            disk: Mutex::new(disk),
            pulls: Default::default(),
            budget,
        });
        a.evict_disk(None, 0);
        Ok(a)
    }

    /// Bytes in memory and on disk, and how many artifacts each holds.
    pub fn usage(&self) -> (u64, usize, u64, usize) {
        let m = self.memory.lock().map(|m| (m.bytes, m.entries.len())).unwrap_or_default();
        let d = self.disk.lock().map(|d| (d.bytes, d.entries.len())).unwrap_or_default();
        (m.0, m.1, d.0, d.1)
    }

    /// The artifact at `reference` (`REGISTRY/REPOSITORY@sha256:…`): from memory, else from
    /// disk, else pulled (waiting at most [`PULL_WAIT`]).
    pub async fn get(self: &Arc<Self>, reference: &str, secret: Option<PullSecret>) -> Result<Arc<Cached>, FetchError> {
        let r = parse_pinned(reference).map_err(|e| FetchError {
            registry: String::new(),
            message: e.to_string(),
            permanent: true,
            refused: false,
            retry_in: MAX_RETRY,
        })?;
        let registry = r.registry().to_string();
        let digest = r.digest().unwrap_or_default().to_string();
        if let Some(a) = self.in_memory(&digest) {
            return Ok(a);
        }
        if let Some(a) = self.on_disk(&digest).await {
            return Ok(a);
        }
        let pull = {
            let Ok(mut pulls) = self.pulls.lock() else {
                return Err(FetchError {
                    registry,
                    message: "internal error: the pull table is poisoned".into(),
                    permanent: false,
                    refused: false,
                    retry_in: MAX_RETRY,
                });
            };
            let in_flight = match pulls.get(&digest) {
                Some(PullState::InFlight(f, _, _)) => Some(f.clone()),
                Some(PullState::Failed { error, next_try, .. }) if *next_try > Instant::now() => {
                    let mut e = error.clone();
                    e.retry_in = next_try.saturating_duration_since(Instant::now()).max(Duration::from_millis(100));
                    return Err(e);
                }
                _ => None,
            };
            match in_flight {
                Some(f) => f,
                None => {
                    let attempts = match pulls.get(&digest) {
                        Some(PullState::Failed { attempts, .. }) => *attempts,
                        _ => 0,
                    };
                    let this = self.clone();
                    let waiting = Arc::new(std::sync::atomic::AtomicU64::new(0));
                    let (reference, digest2, registry2, waiting2) =
                        (reference.to_string(), digest.clone(), registry.clone(), waiting.clone());
                    let task =
                        tokio::spawn(
                            async move { this.pull(&reference, &digest2, &registry2, secret, &waiting2).await },
                        );
                    let (reg, this, d) = (registry.clone(), self.clone(), digest.clone());
                    let f: PullFuture = async move {
                        task.await.unwrap_or_else(|e| {
                            let error = FetchError {
                                registry: reg,
                                message: format!("the pull stopped: {e}"),
                                permanent: false,
                                refused: false,
                                retry_in: Duration::from_secs(1),
                            };
                            // Not left in flight: the next reconcile tries again.
                            if let Ok(mut pulls) = this.pulls.lock() {
                                pulls.remove(&d);
                            }
                            Err(error)
                        })
                    }
                    .boxed()
                    .shared();
                    pulls.insert(digest.clone(), PullState::InFlight(f.clone(), attempts, waiting));
                    f
                }
            }
        };
        match tokio::time::timeout(PULL_WAIT, pull).await {
            Ok(r) => r,
            Err(_) => {
                let waiting = match self.pulls.lock().as_deref().map(|p| p.get(&digest)) {
                    Ok(Some(PullState::InFlight(_, _, w))) => w.load(std::sync::atomic::Ordering::Relaxed),
                    _ => 0,
                };
                let message = if waiting > 0 {
                    format!(
                        "the pull from registry {registry} waits for {waiting} bytes of the pull budget ({} bytes \
                         for all pulls in flight, --artifact-pull-max-bytes; {} free), held by other pulls",
                        self.budget.max_bytes(),
                        self.budget.available_bytes()
                    )
                } else {
                    format!("the pull from registry {registry} is still running")
                };
                Err(FetchError {
                    message,
                    registry,
                    permanent: false,
                    refused: false,
                    retry_in: Duration::from_secs(2),
                })
            }
        }
    }

    /// One pull (in its own task): kept in memory and on disk when it worked, remembered
    /// with its backoff when not.
    async fn pull(
        self: Arc<Self>,
        reference: &str,
        digest: &str,
        registry: &str,
        secret: Option<PullSecret>,
        waiting: &std::sync::atomic::AtomicU64,
    ) -> Result<Arc<Cached>, FetchError> {
        let result = self.pull_once(reference, registry, secret, waiting).await;
        let Ok(mut pulls) = self.pulls.lock() else { return result };
        let attempts = match pulls.get(digest) {
            Some(PullState::InFlight(_, a, _)) => *a,
            _ => 0,
        };
        match &result {
            Ok(_) => {
                pulls.remove(digest);
            }
            Err(e) => {
                let attempts = attempts + 1;
                let wait = if e.refused {
                    REFUSED_RETRY
                } else {
                    (Duration::from_secs(1) * 2u32.pow(attempts.min(10) - 1)).min(MAX_RETRY)
                };
                tracing::warn!(artifact = %reference, error = %e.message, retry_in = ?wait, "cannot pull a module artifact");
                let mut error = e.clone();
                error.retry_in = wait;
                pulls.insert(
                    digest.to_string(),
                    PullState::Failed { error: error.clone(), next_try: Instant::now() + wait, attempts },
                );
                return Err(error);
            }
        }
        result
    }

    async fn pull_once(
        &self,
        reference: &str,
        registry: &str,
        secret: Option<PullSecret>,
        waiting: &std::sync::atomic::AtomicU64,
    ) -> Result<Arc<Cached>, FetchError> {
        let fail = |message: String, permanent: bool| FetchError {
            registry: registry.to_string(),
            message,
            permanent,
            refused: false,
            retry_in: Duration::from_secs(1),
        };
        let mut options = self.config.registry.clone();
        if let Some(s) = &secret {
            options.docker_config = Some(read_pull_secret(s).await.map_err(|m| fail(m, true))?);
            // A Secret does not choose programs for the operator to run.
            options.helpers = crate::artifact::credentials::Helpers::Refuse;
        }
        let started = Instant::now();
        // The reservation is held until the artifact is kept (its layers, parsed and encoded
        // again, are in memory until then).
        let (artifact, digest, _reservation) =
            Registry::new(options).pull_within(reference, &self.budget, waiting).await.map_err(|e| {
                let transient = matches!(e, RegistryError::Oci { .. } | RegistryError::TimedOut { .. });
                let deferred = matches!(e, RegistryError::Deferred(_));
                let message = if transient {
                    format!("registry {registry} unreachable: {}", error_chain(&e))
                } else {
                    e.to_string()
                };
                let refused = matches!(
                    e,
                    RegistryError::DigestMismatch { .. } | RegistryError::Artifact { .. } | RegistryError::TooLarge(_)
                );
                FetchError { refused, ..fail(message, !(transient || deferred)) }
            })?;
        let (manifest, layers) =
            artifact.to_oci().map_err(|e| fail(format!("{reference}: the artifact does not re-encode: {e}"), true))?;
        let bytes: u64 = layers.iter().map(|l| l.data.len() as u64).sum();
        tracing::info!(artifact = %reference, bytes, took = ?started.elapsed(), "module artifact pulled");
        let artifact = Arc::new(Cached::new(artifact).map_err(|e| fail(format!("{reference}: {e}"), true))?);
        self.remember(&digest, artifact.clone());
        if let Some(dir) = self.config.cache_dir.clone() {
            if bytes > self.config.disk_max_bytes {
                tracing::warn!(artifact = %reference, bytes, max = self.config.disk_max_bytes, "artifact larger than the disk cache; kept in memory only");
            } else {
                // Room first, so the directory never holds more than its bound.
                self.evict_disk(None, bytes);
                let d = digest.clone();
                match tokio::task::spawn_blocking(move || write_entry(&dir, &d, &manifest, &layers)).await {
                    Ok(Ok(written)) => {
                        if let Ok(mut disk) = self.disk.lock() {
                            disk.tick += 1;
                            let t = disk.tick;
                            if let Some((old, _)) = disk.entries.insert(digest.clone(), (written, t)) {
                                disk.bytes -= old;
                            }
                            disk.bytes += written;
                        }
                        self.evict_disk(Some(&digest), 0);
                    }
                    Ok(Err(e)) => {
                        tracing::warn!(artifact = %reference, error = %e, "cannot write the artifact to the disk cache")
                    }
                    Err(e) => {
                        tracing::warn!(artifact = %reference, error = %e, "cannot write the artifact to the disk cache")
                    }
                }
            }
        }
        Ok(artifact)
    }

    fn in_memory(&self, digest: &str) -> Option<Arc<Cached>> {
        let mut m = self.memory.lock().ok()?;
        m.tick += 1;
        let t = m.tick;
        let e = m.entries.get_mut(digest)?;
        e.used = t;
        Some(e.artifact.clone())
    }

    async fn on_disk(&self, digest: &str) -> Option<Arc<Cached>> {
        let dir = self.config.cache_dir.clone()?;
        if !self.disk.lock().ok()?.entries.contains_key(digest) {
            return None;
        }
        let d = digest.to_string();
        let read = tokio::task::spawn_blocking(move || read_entry(&dir, &d)).await.ok()?;
        match read {
            Ok(artifact) => {
                if let Ok(mut disk) = self.disk.lock() {
                    disk.tick += 1;
                    let t = disk.tick;
                    if let Some(e) = disk.entries.get_mut(digest) {
                        e.1 = t;
                    }
                }
                self.remember(digest, artifact.clone());
                Some(artifact)
            }
            Err(e) => {
                tracing::warn!(%digest, error = %e, "a disk cache entry is broken; removing it");
                if let Some(dir) = &self.config.cache_dir {
                    let _ = std::fs::remove_dir_all(entry_dir(dir, digest));
                }
                if let Ok(mut disk) = self.disk.lock()
                    && let Some((b, _)) = disk.entries.remove(digest)
                {
                    disk.bytes -= b;
                }
                None
            }
        }
    }

    /// Keeps an artifact in memory, evicting the least recently used beyond the bound (the
    /// newest always stays: a reconcile needs it now).
    fn remember(&self, digest: &str, artifact: Arc<Cached>) {
        let bytes = artifact.bytes();
        let Ok(mut m) = self.memory.lock() else { return };
        m.tick += 1;
        let used = m.tick;
        if let Some(old) = m.entries.insert(digest.to_string(), Entry { artifact, bytes, used }) {
            m.bytes -= old.bytes;
        }
        m.bytes += bytes;
        while m.bytes > self.config.memory_max_bytes && m.entries.len() > 1 {
            let Some(oldest) = m
                .entries
                .iter()
                .filter(|(d, _)| d.as_str() != digest)
                .min_by_key(|(_, e)| e.used)
                .map(|(d, _)| d.clone())
            else {
                break;
            };
            if let Some(e) = m.entries.remove(&oldest) {
                m.bytes -= e.bytes;
                tracing::debug!(digest = %oldest, "artifact evicted from memory");
            }
        }
    }

    /// Removes the least recently used entries from disk until the bound holds with `room`
    /// bytes to spare (`keep`, the one just written, stays).
    fn evict_disk(&self, keep: Option<&str>, room: u64) {
        let Some(dir) = &self.config.cache_dir else { return };
        let Ok(mut d) = self.disk.lock() else { return };
        while d.bytes + room > self.config.disk_max_bytes {
            let Some(oldest) = d
                .entries
                .iter()
                .filter(|(k, _)| Some(k.as_str()) != keep)
                .min_by_key(|(_, (_, used))| *used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some((b, _)) = d.entries.remove(&oldest) {
                d.bytes -= b;
            }
            let _ = std::fs::remove_dir_all(entry_dir(dir, &oldest));
            tracing::info!(digest = %oldest, "artifact evicted from the disk cache");
        }
    }
}

/// The `.dockerconfigjson` of a pull Secret.
async fn read_pull_secret(s: &PullSecret) -> Result<Vec<u8>, String> {
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(s.client.clone(), &s.namespace);
    let what = format!("pull secret {}/{}", s.namespace, s.name);
    let secret = api.get_opt(&s.name).await.map_err(|e| format!("{what}: {e}"))?.ok_or(format!("{what}: not found"))?;
    if secret.type_.as_deref() != Some("kubernetes.io/dockerconfigjson") {
        return Err(format!(
            "{what} is of type {}, not kubernetes.io/dockerconfigjson",
            secret.type_.as_deref().unwrap_or("Opaque")
        ));
    }
    secret
        .data
        .and_then(|mut d| d.remove(".dockerconfigjson"))
        .map(|b| b.0)
        .ok_or(format!("{what} has no .dockerconfigjson"))
}

/// An error with its causes, on one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

fn entry_dir(dir: &Path, digest: &str) -> PathBuf {
    dir.join(digest.replace(':', "-"))
}

fn dir_bytes(path: &Path) -> u64 {
    std::fs::read_dir(path).map(|rd| rd.flatten().filter_map(|e| e.metadata().ok()).map(|m| m.len()).sum()).unwrap_or(0)
}

fn hex_of(digest: &str) -> &str {
    digest.strip_prefix("sha256:").unwrap_or(digest)
}

/// Writes an entry (temporary directory, renamed into place); returns its bytes.
fn write_entry(dir: &Path, digest: &str, manifest: &OciImageManifest, layers: &[ImageLayer]) -> std::io::Result<u64> {
    let tmp = dir.join(format!(".tmp-{}-{}", hex_of(digest), std::process::id()));
    let _ = std::fs::remove_dir_all(&tmp);
    std::fs::create_dir_all(&tmp)?;
    let body = serde_json::to_vec(manifest).map_err(std::io::Error::other)?;
    let mut bytes = body.len() as u64;
    std::fs::write(tmp.join("manifest.json"), body)?;
    for (l, d) in layers.iter().zip(&manifest.layers) {
        std::fs::write(tmp.join(hex_of(&d.digest)), &l.data)?;
        bytes += l.data.len() as u64;
    }
    let target = entry_dir(dir, digest);
    let _ = std::fs::remove_dir_all(&target);
    std::fs::rename(&tmp, &target)?;
    Ok(bytes)
}

/// Reads and checks an entry. Marks it used.
fn read_entry(dir: &Path, digest: &str) -> Result<Arc<Cached>, String> {
    let path = entry_dir(dir, digest);
    let body = std::fs::read(path.join("manifest.json")).map_err(|e| format!("manifest.json: {e}"))?;
    let manifest: OciImageManifest = serde_json::from_slice(&body).map_err(|e| format!("manifest.json: {e}"))?;
    let mut layers = Vec::new();
    for d in &manifest.layers {
        let data = std::fs::read(path.join(hex_of(&d.digest))).map_err(|e| format!("layer {}: {e}", d.digest))?;
        let actual = sha256(&data);
        if actual != d.digest {
            return Err(format!("layer {}: digest mismatch ({actual})", d.digest));
        }
        layers.push(ImageLayer::new(data, d.media_type.clone(), None));
    }
    let artifact = ModuleArtifact::from_oci(&manifest, &layers).map_err(|e| e.to_string())?;
    drop(layers);
    if let Ok(f) = std::fs::File::open(&path) {
        let _ = f.set_modified(std::time::SystemTime::now());
    }
    Ok(Arc::new(Cached::new(artifact).map_err(|e| e.to_string())?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn artifact(version: &str, pad: usize) -> ModuleArtifact {
        let objects = vec![
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "pad", "namespace": "ns"},
                "data": {"pad": "x".repeat(pad)}}),
            json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": "ns"}}),
        ];
        ModuleArtifact::new("w", version, "ns/op", objects).unwrap()
    }

    fn store(dir: &Path, disk_max: u64, memory_max: u64) -> Arc<Artifacts> {
        Artifacts::new(ArtifactConfig {
            cache_dir: Some(dir.to_path_buf()),
            disk_max_bytes: disk_max,
            memory_max_bytes: memory_max,
            ..Default::default()
        })
        .unwrap()
    }

    fn put(s: &Arc<Artifacts>, a: &ModuleArtifact) -> String {
        let (manifest, layers) = a.to_oci().unwrap();
        let digest = sha256(&serde_json::to_vec(&manifest).unwrap());
        let dir = s.config.cache_dir.clone().unwrap();
        let written = write_entry(&dir, &digest, &manifest, &layers).unwrap();
        {
            let mut d = s.disk.lock().unwrap();
            d.tick += 1;
            let t = d.tick;
            d.entries.insert(digest.clone(), (written, t));
            d.bytes += written;
        }
        s.evict_disk(Some(&digest), 0);
        digest
    }

    #[tokio::test]
    async fn disk_entries_are_checked_reused_across_restarts_and_evicted_oldest_first() {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 10_000, 1 << 20);
        let (a1, a2, a3) = (artifact("1.0.0", 3000), artifact("2.0.0", 3000), artifact("3.0.0", 3000));
        let d1 = put(&s, &a1);
        let d2 = put(&s, &a2);
        // Used: 1 is now more recent than 2.
        let r = format!("reg.invalid/m@{d1}");
        assert_eq!(s.get(&r, None).await.unwrap().objects().unwrap(), a1.objects);
        let d3 = put(&s, &a3);
        assert!(!entry_dir(dir.path(), &d2).exists(), "the least recently used goes");
        assert!(entry_dir(dir.path(), &d1).exists() && entry_dir(dir.path(), &d3).exists());
        let (_, _, disk_bytes, n) = s.usage();
        assert!(disk_bytes <= 10_000 && n == 2, "{disk_bytes} {n}");

        // A new process finds them; a tampered layer is refused and removed.
        let s = store(dir.path(), 10_000, 1 << 20);
        let got = s.get(&format!("reg.invalid/m@{d3}"), None).await.unwrap();
        assert_eq!((got.objects().unwrap(), got.version.as_str()), (a3.objects.clone(), "3.0.0"));
        let e = entry_dir(dir.path(), &d1);
        let (manifest, _) = a1.to_oci().unwrap();
        let layer = e.join(hex_of(&manifest.layers[0].digest));
        let text = std::fs::read_to_string(&layer).unwrap().replace("pad", "pal");
        std::fs::write(&layer, text).unwrap();
        let err = s.get(&format!("127.0.0.1:1/m@{d1}"), None).await.unwrap_err();
        assert!(!err.permanent && err.message.contains("registry 127.0.0.1:1 unreachable"), "{err:?}");
        assert!(!e.exists(), "the broken entry is removed");
        // Failed pulls are not retried before their backoff.
        let again = s.get(&format!("127.0.0.1:1/m@{d1}"), None).await.unwrap_err();
        assert!(again.retry_in <= Duration::from_secs(1) && again.message == err.message, "{again:?}");
    }

    #[tokio::test]
    async fn memory_holds_one_arc_per_digest_within_its_bound() {
        let dir = tempfile::tempdir().unwrap();
        let s = store(dir.path(), 1 << 20, 5000);
        let d1 = put(&s, &artifact("1.0.0", 3000));
        let d2 = put(&s, &artifact("2.0.0", 3000));
        let r1 = format!("reg.invalid/m@{d1}");
        let x = s.get(&r1, None).await.unwrap();
        let y = s.get(&r1, None).await.unwrap();
        assert!(Arc::ptr_eq(&x, &y));
        s.get(&format!("reg.invalid/m@{d2}"), None).await.unwrap();
        let (mem, n, _, _) = s.usage();
        assert!(mem <= 5000 && n == 1, "{mem} {n}");
        let z = s.get(&r1, None).await.unwrap();
        assert!(!Arc::ptr_eq(&x, &z), "evicted from memory, read again from disk");
    }

    #[tokio::test]
    async fn a_tag_is_refused() {
        let s = Artifacts::new(ArtifactConfig::default()).unwrap();
        let e = s.get("reg.example/m:1.0.0", None).await.unwrap_err();
        assert!(e.permanent && e.message.contains("has no digest"), "{e:?}");
    }
}
