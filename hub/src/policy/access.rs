//! The subscriber access policy (`--access-policy FILE`): which clusters, which event
//! types and which fields each subscriber identity may read.
//!
//! ```yaml
//! subscribers:
//!   - name: team-a                 # the subscriber name in its certificate
//!     clusters: ["a1", "eu-*"]     # cluster id globs (`*` any run of characters, `?` one)
//!     clusterSelector: "team=a"    # optional: clusters whose Runtime labels match, too
//!     types: ["dev.fleetwatch.object.*"]   # optional CloudEvents type globs (none: all)
//!     redact: ["/data/password"]   # optional JSON pointers removed before delivery
//! ```
//!
//! With a policy, a subscriber it does not name is refused at subscribe; without one
//! every subscriber reads every cluster (the hub says so at start). Like the deny list it
//! follows its file (re-read when the content changes) and fails closed: a file that
//! disappears or breaks after start keeps the last good policy in force and makes the hub
//! not ready; at start it is an error.
//!
//! `clusterSelector` (Kubernetes label selector syntax, `team=a,env in (prod)`) grants the
//! clusters whose Runtime (by `spec.clusterId`) carries matching labels, in addition to the
//! globs. It needs the hub to read Runtimes from a control plane: a hub that reads none
//! refuses such a policy rather than let the selector silently grant nothing. The labels
//! are those of the hub's view of the Runtimes (`fleet::follow_runtimes`, a watch), looked
//! up for every event, so a relabelled Runtime moves its cluster in or out of live
//! sessions; before the first list the selector grants nothing.
//!
//! A redaction pointer names a field of the watched object (`/data/password`). It is
//! removed from the event's `data` at that pointer and from the projected fields
//! (`data.projected`, keyed by the projection the WatchConfig asked for): a projection of
//! exactly that field, one inside it, or the field inside a projection of an enclosing
//! object (`/data` projected whole loses its `password`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use fleetwatch_api::label_selector::LabelSelector;
use fleetwatch_certs::{Compare, Contents, Reload as FileReload, ReloadingFile};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What one subscriber identity may read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct Grant {
    /// The subscriber name in its certificate (`spiffe://<td>/subscriber/<name>`).
    pub(crate) name: String,
    /// Cluster id globs. Required: an empty list grants no cluster.
    pub(crate) clusters: Vec<String>,
    /// Runtime labels (a label selector): the clusters whose Runtime matches are granted
    /// too. Only when the hub reads a control plane.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cluster_selector: Option<String>,
    /// `cluster_selector`, parsed.
    #[serde(skip)]
    selector: Option<LabelSelector>,
    /// CloudEvents type globs; empty: every type.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) types: Vec<String>,
    /// JSON pointers removed from event data before delivery.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) redact: Vec<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFile {
    subscribers: Vec<Grant>,
}

/// Why an access policy cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum AccessPolicyError {
    /// The file cannot be read.
    #[error("access policy {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not a valid policy.
    #[error("access policy {path}: {why}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong.
        why: String,
    },
}

/// A parsed policy: grants by subscriber name.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct AccessPolicy {
    grants: BTreeMap<String, Arc<Grant>>,
}

impl AccessPolicy {
    /// Parses the YAML (or JSON) text of a policy file (`path` for messages);
    /// `runtime_labels`: whether the hub reads Runtimes, which `clusterSelector` needs.
    pub(crate) fn parse(text: &str, path: &Path, runtime_labels: bool) -> Result<Self, AccessPolicyError> {
        let invalid = |why: String| AccessPolicyError::Invalid { path: path.display().to_string(), why };
        let file: PolicyFile = serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?;
        let mut grants = BTreeMap::new();
        for (i, mut g) in file.subscribers.into_iter().enumerate() {
            let at = format!("subscribers[{i}]");
            if g.name.is_empty() || g.name.contains('/') {
                return Err(invalid(format!("{at}: name {:?} is not a subscriber name", g.name)));
            }
            if let Some(sel) = &g.cluster_selector {
                if !runtime_labels {
                    return Err(invalid(format!(
                        "{at} ({}): clusterSelector {sel:?} needs Runtime labels, and this hub reads no control \
                         plane (--control-plane-kubeconfig); list the clusters as globs",
                        g.name
                    )));
                }
                let parsed = LabelSelector::parse(sel)
                    .map_err(|e| invalid(format!("{at} ({}): clusterSelector: {e}", g.name)))?;
                // An empty selector matches every Runtime: refused, as a grant of everything
                // is written `clusters: ["*"]`.
                if parsed.is_empty() {
                    return Err(invalid(format!(
                        "{at} ({}): clusterSelector is empty (it would match every Runtime); use clusters: [\"*\"] \
                         to grant every cluster",
                        g.name
                    )));
                }
                g.selector = Some(parsed);
            }
            for c in &g.clusters {
                if c.is_empty() {
                    return Err(invalid(format!("{at} ({}): an empty cluster glob", g.name)));
                }
            }
            for t in &g.types {
                if t.is_empty() {
                    return Err(invalid(format!("{at} ({}): an empty type glob", g.name)));
                }
            }
            for p in &g.redact {
                if !p.starts_with('/') || fleetwatch_protocol::watch::field_pointer(p).is_err() {
                    return Err(invalid(format!("{at} ({}): redact {p:?} is not a JSON pointer (/a/b)", g.name)));
                }
            }
            let name = g.name.clone();
            if grants.insert(name.clone(), Arc::new(g)).is_some() {
                return Err(invalid(format!("{at}: subscriber {name:?} is named twice")));
            }
        }
        Ok(Self { grants })
    }

    /// The grant of a subscriber, if the policy names it.
    pub(crate) fn grant(&self, name: &str) -> Option<Arc<Grant>> {
        self.grants.get(name).cloned()
    }

    /// Every grant, by name.
    pub(crate) fn grants(&self) -> impl Iterator<Item = &Grant> {
        self.grants.values().map(|g| g.as_ref())
    }

    /// How many subscribers it names.
    pub(crate) fn len(&self) -> usize {
        self.grants.len()
    }

    /// Whether it names none.
    pub(crate) fn is_empty(&self) -> bool {
        self.grants.is_empty()
    }
}

impl Grant {
    /// Whether the grant covers this cluster: a glob matches, or its Runtime's `labels`
    /// (`None`: no Runtime known for it) match the `clusterSelector`.
    pub(crate) fn allows_cluster(&self, cluster: &str, labels: Option<&BTreeMap<String, String>>) -> bool {
        self.clusters.iter().any(|g| glob(g, cluster))
            || self.selector.as_ref().zip(labels).is_some_and(|(s, l)| s.matches(l))
    }

    /// Whether the grant depends on Runtime labels (`clusterSelector`).
    pub(crate) fn uses_runtime_labels(&self) -> bool {
        self.selector.is_some()
    }

    /// The grant's clusters, for messages: its globs and selector.
    pub(crate) fn describe_clusters(&self) -> String {
        let mut parts: Vec<String> = self.clusters.clone();
        if let Some(s) = &self.cluster_selector {
            parts.push(format!("the clusters whose Runtime matches {s:?}"));
        }
        if parts.is_empty() { "no cluster".to_string() } else { parts.join(", ") }
    }

    /// Whether the grant covers this CloudEvents type.
    pub(crate) fn allows_type(&self, kind: &str) -> bool {
        self.types.is_empty() || self.types.iter().any(|g| glob(g, kind))
    }

    /// Whether events must be looked into (type filter, redaction) before delivery.
    pub(crate) fn inspects_events(&self) -> bool {
        !self.types.is_empty() || !self.redact.is_empty()
    }

    /// Removes the redacted fields from an event's `data`; how many values were removed.
    pub(crate) fn redact(&self, data: &mut Value) -> usize {
        let mut removed = 0;
        for p in &self.redact {
            removed += usize::from(remove_pointer(data, p));
            let Some(Value::Object(projected)) = data.get_mut("projected") else { continue };
            let mut gone = Vec::new();
            for (key, value) in projected.iter_mut() {
                let Ok(k) = fleetwatch_protocol::watch::field_pointer(key) else {
                    // Not a field the agent could have projected: drop it rather than guess.
                    gone.push(key.clone());
                    continue;
                };
                if k == *p || k.starts_with(&format!("{p}/")) {
                    gone.push(key.clone());
                } else if let Some(rest) = p.strip_prefix(&k).filter(|r| r.starts_with('/')) {
                    removed += usize::from(remove_pointer(value, rest));
                }
            }
            for key in gone {
                projected.remove(&key);
                removed += 1;
            }
        }
        removed
    }
}

/// Removes the value at a JSON pointer; whether there was one.
fn remove_pointer(root: &mut Value, pointer: &str) -> bool {
    let Some((parent, last)) = pointer.rsplit_once('/') else { return false };
    let last = last.replace("~1", "/").replace("~0", "~");
    match root.pointer_mut(parent) {
        Some(Value::Object(m)) => m.remove(&last).is_some(),
        Some(Value::Array(a)) => match last.parse::<usize>() {
            Ok(i) if i < a.len() => {
                a.remove(i);
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// Glob match: `*` any run of characters (also none), `?` exactly one; nothing else is
/// special.
pub(crate) fn glob(pattern: &str, text: &str) -> bool {
    let (p, t): (Vec<char>, Vec<char>) = (pattern.chars().collect(), text.chars().collect());
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        if pi < p.len() && (p[pi] == '?' || (p[pi] != '*' && p[pi] == t[ti])) {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some((pi, ti));
            pi += 1;
        } else if let Some((sp, st)) = star {
            pi = sp + 1;
            ti = st + 1;
            star = Some((sp, st + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// What the policy in force says about one subscriber.
#[derive(Debug, Clone)]
pub(crate) enum Decision {
    /// No policy is configured: everything.
    Everything,
    /// The subscriber's grant.
    Granted(Arc<Grant>),
    /// Not named: refused, with the message for the subscriber.
    Refused(String),
}

/// The access policy in force, following its file.
pub(crate) struct AccessControl {
    path: Option<PathBuf>,
    /// Whether the hub reads Runtime labels (`clusterSelector` is allowed).
    runtime_labels: bool,
    /// Whether accepted SubscriberAccessPolicy objects of the control plane grant too.
    from_control_plane: bool,
    /// The file's policy, following the file by content (none configured: an empty
    /// policy that never changes).
    file: ReloadingFile<AccessPolicy>,
    /// Bumped at every replacement of the policy in force (the file's or the objects'):
    /// sessions re-check their grant when it moves.
    generation: AtomicU64,
    objects: RwLock<Objects>,
    /// Bumped when the file's policy is replaced: the objects are judged again against it
    /// (a subscriber the file now grants makes an object naming it a duplicate).
    file_replaced: tokio::sync::watch::Sender<u64>,
}

/// The grants of the SubscriberAccessPolicy objects in force.
#[derive(Default)]
struct Objects {
    /// Whether the first complete list was read: before it, every subscriber is refused.
    synced: bool,
    /// The accepted objects' grants, by object name.
    accepted: BTreeMap<String, Arc<AccessPolicy>>,
    /// The last watch error since the last good list (the grants above stay in force).
    error: Option<String>,
    /// The objects not used, by name: the subscribers each names and why it is not used
    /// (a subscriber named only there is told which object failed to grant it).
    refused: BTreeMap<String, (Vec<String>, String)>,
}

/// The kind name, for messages and grant sources.
pub(crate) const KIND: &str = "SubscriberAccessPolicy";

/// What the hub made of one SubscriberAccessPolicy (written into its status).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ObjectVerdict {
    /// Whether its grants are in force.
    pub(crate) accepted: bool,
    /// `Accepted`, `Invalid` or `DuplicateSubscriber`.
    pub(crate) reason: String,
    /// What is wrong (or what is in force), for people.
    pub(crate) message: String,
}

/// Checks SubscriberAccessPolicy objects (name, spec) with the file's check, in name
/// order. An invalid object is not used (`Invalid`); one naming a subscriber the file or
/// an accepted object of a smaller name already grants is not used at all
/// (`DuplicateSubscriber`, naming the other): grants are never merged, so the union of
/// the sources is a union of whole grants and no object can widen another's grant.
/// Returns the accepted grants by object name and a verdict per object.
pub(crate) fn judge_objects(
    file: Option<&AccessPolicy>,
    file_name: &str,
    objects: &BTreeMap<String, fleetwatch_api::access_policy::SubscriberAccessPolicySpec>,
    runtime_labels: bool,
) -> (BTreeMap<String, Arc<AccessPolicy>>, BTreeMap<String, ObjectVerdict>) {
    let mut accepted: BTreeMap<String, Arc<AccessPolicy>> = BTreeMap::new();
    let mut verdicts = BTreeMap::new();
    for (name, spec) in objects {
        let verdict = |accepted: bool, reason: &str, message: String| ObjectVerdict {
            accepted,
            reason: reason.to_string(),
            message,
        };
        let text = match serde_json::to_string(spec) {
            Ok(t) => t,
            Err(e) => {
                verdicts.insert(name.clone(), verdict(false, "Invalid", format!("cannot read the spec: {e}")));
                continue;
            }
        };
        let policy = match AccessPolicy::parse(&text, Path::new(&format!("{KIND}/{name}")), runtime_labels) {
            Ok(p) => p,
            Err(e) => {
                verdicts.insert(name.clone(), verdict(false, "Invalid", e.to_string()));
                continue;
            }
        };
        let clash = policy.grants().find_map(|g| {
            if file.is_some_and(|f| f.grant(&g.name).is_some()) {
                return Some(format!(
                    "subscriber {:?} is already granted by the access policy file {file_name}; a subscriber is \
                     granted in one place only",
                    g.name
                ));
            }
            accepted.iter().find(|(_, p)| p.grant(&g.name).is_some()).map(|(other, _)| {
                format!(
                    "subscriber {:?} is already granted by {KIND} {other:?}; a subscriber is granted in one place only",
                    g.name
                )
            })
        });
        if let Some(why) = clash {
            verdicts.insert(name.clone(), verdict(false, "DuplicateSubscriber", why));
            continue;
        }
        let subscribers = policy.grants().map(|g| g.name.clone()).collect::<Vec<_>>().join(", ");
        verdicts.insert(name.clone(), verdict(true, "Accepted", format!("in force for: {subscribers}")));
        accepted.insert(name.clone(), Arc::new(policy));
    }
    (accepted, verdicts)
}

/// What a reload check found.
#[derive(Debug)]
pub(crate) enum Reload {
    /// Nothing changed (or still broken in the same way, already reported).
    Unchanged,
    /// A new policy is in force.
    Replaced,
    /// The file cannot be used now: the previous policy stays in force.
    Failed(AccessPolicyError),
}

impl AccessControl {
    /// Loads the policy file (none: every subscriber reads everything). A missing,
    /// unreadable or invalid file is a start-up error; `runtime_labels`: whether the hub
    /// reads Runtimes (without, a `clusterSelector` makes the file invalid).
    #[cfg(test)]
    pub(crate) fn load(path: Option<PathBuf>, runtime_labels: bool) -> Result<Self, AccessPolicyError> {
        Self::load_with_objects(path, runtime_labels, false)
    }

    /// As [`load`](Self::load); `from_control_plane`: accepted SubscriberAccessPolicy
    /// objects grant too (see [`set_objects`](Self::set_objects)), and until their first
    /// list every subscriber is refused.
    pub(crate) fn load_with_objects(
        path: Option<PathBuf>,
        runtime_labels: bool,
        from_control_plane: bool,
    ) -> Result<Self, AccessPolicyError> {
        let file = match &path {
            Some(p) => ReloadingFile::load(vec![p.clone()], Compare::Content, |c| read(c, p, runtime_labels))?,
            None => ReloadingFile::fixed(AccessPolicy::default()),
        };
        Ok(Self {
            path,
            runtime_labels,
            from_control_plane,
            file,
            generation: AtomicU64::new(0),
            objects: Default::default(),
            file_replaced: tokio::sync::watch::channel(0).0,
        })
    }

    /// Changes each time the file's policy is replaced by a reload.
    pub(crate) fn file_replaced(&self) -> tokio::sync::watch::Receiver<u64> {
        self.file_replaced.subscribe()
    }

    /// The file, when a policy is configured.
    pub(crate) fn path(&self) -> Option<&Path> {
        self.path.as_deref()
    }

    /// The policy in force (`None`: no policy, everything allowed): the file's grants and
    /// those of the accepted SubscriberAccessPolicy objects.
    pub(crate) fn current(&self) -> Option<Arc<AccessPolicy>> {
        if self.path.is_none() && !self.from_control_plane {
            return None;
        }
        let file = self.file_policy();
        if !self.from_control_plane {
            return Some(file);
        }
        let objects = self.objects.read().unwrap_or_else(|p| p.into_inner());
        let mut all = (*file).clone();
        for policy in objects.accepted.values() {
            for (name, g) in &policy.grants {
                all.grants.entry(name.clone()).or_insert_with(|| g.clone());
            }
        }
        Some(Arc::new(all))
    }

    fn file_policy(&self) -> Arc<AccessPolicy> {
        self.file.current()
    }

    /// Whether SubscriberAccessPolicy objects grant too (`--access-policy-from-control-plane`).
    pub(crate) fn grants_from_control_plane(&self) -> bool {
        self.from_control_plane
    }

    /// Where each subscriber's grant comes from: `file <path>` or `SubscriberAccessPolicy/<name>`.
    pub(crate) fn sources(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        if let Some(path) = &self.path {
            for g in self.file_policy().grants() {
                out.insert(g.name.clone(), format!("file {}", path.display()));
            }
        }
        let objects = self.objects.read().unwrap_or_else(|p| p.into_inner());
        for (object, policy) in &objects.accepted {
            for g in policy.grants() {
                out.entry(g.name.clone()).or_insert_with(|| format!("{KIND}/{object}"));
            }
        }
        out
    }

    /// Whether the first list of SubscriberAccessPolicy objects was read (always, when they
    /// do not count).
    pub(crate) fn objects_synced(&self) -> bool {
        !self.from_control_plane || self.objects.read().map(|o| o.synced).unwrap_or(false)
    }

    /// Why the SubscriberAccessPolicy objects in force may be stale or missing, if so.
    pub(crate) fn objects_problem(&self) -> Option<String> {
        if !self.from_control_plane {
            return None;
        }
        let o = self.objects.read().unwrap_or_else(|p| p.into_inner());
        let error = o.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
        if !o.synced {
            Some(format!(
                "the {KIND} objects of the control plane have not been listed yet (subscribers are refused){error}"
            ))
        } else {
            o.error.as_ref().map(|_| format!("watching {KIND} objects failed, the last good set is in force{error}"))
        }
    }

    /// Puts the accepted objects' grants in force (a complete view: the first list and
    /// every change after it). Whether the policy in force changed.
    pub(crate) fn set_objects(&self, accepted: BTreeMap<String, Arc<AccessPolicy>>) -> bool {
        let mut o = self.objects.write().unwrap_or_else(|p| p.into_inner());
        let changed = !o.synced || o.accepted != accepted;
        o.synced = true;
        o.error = None;
        o.accepted = accepted;
        drop(o);
        if changed {
            self.generation.fetch_add(1, Ordering::SeqCst);
        }
        changed
    }

    /// The objects not used (not a change of the policy in force): by name, the subscribers
    /// each names and why it is not used.
    pub(crate) fn set_refused(&self, refused: BTreeMap<String, (Vec<String>, String)>) {
        let mut o = self.objects.write().unwrap_or_else(|p| p.into_inner());
        o.refused = refused;
    }

    /// The objects not used that name the subscriber `name`, with why, for its refusal.
    fn refused_naming(&self, name: &str) -> Vec<String> {
        let o = self.objects.read().unwrap_or_else(|p| p.into_inner());
        o.refused
            .iter()
            .filter(|(_, (names, _))| names.iter().any(|n| n == name))
            .map(|(object, (_, why))| format!("{KIND}/{object} names it but is not used: {why}"))
            .collect()
    }

    /// Records a watch error: the grants in force stay (none before the first list).
    pub(crate) fn objects_failed(&self, error: String) {
        let mut o = self.objects.write().unwrap_or_else(|p| p.into_inner());
        o.error = Some(error);
    }

    /// The file's grants alone (for checking objects against them).
    pub(crate) fn file_grants(&self) -> Option<Arc<AccessPolicy>> {
        self.path.as_ref().map(|_| self.file_policy())
    }

    /// Changes with every replacement of the policy.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::SeqCst)
    }

    /// Why the policy in force is stale (its file cannot be used), if it is.
    pub(crate) fn stale(&self) -> Option<String> {
        self.file.failure()
    }

    /// What the policy in force says about the subscriber `name`.
    pub(crate) fn decide(&self, name: &str) -> Decision {
        if !self.objects_synced() {
            return Decision::Refused(format!(
                "the hub has not read the {KIND} objects of its control plane yet; try again shortly"
            ));
        }
        let Some(policy) = self.current() else { return Decision::Everything };
        match policy.grant(name) {
            Some(g) => Decision::Granted(g),
            None => {
                let failed = self.refused_naming(name);
                Decision::Refused(if failed.is_empty() {
                    format!(
                        "subscriber {name:?} is not named in the hub's access policy ({}); ask the hub's operator for a \
                         grant",
                        self.describe()
                    )
                } else {
                    format!(
                        "subscriber {name:?} is not granted by the hub's access policy ({}): {}",
                        self.describe(),
                        failed.join("; ")
                    )
                })
            }
        }
    }

    /// Where the policy comes from, for messages: its file and/or the control plane's objects.
    pub(crate) fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.path {
            parts.push(p.display().to_string());
        }
        if self.from_control_plane {
            let n = self.objects.read().map(|o| o.accepted.len()).unwrap_or_default();
            parts.push(format!("{n} accepted {KIND} object(s) in the control plane"));
        }
        parts.join(" and ")
    }

    /// Re-reads the file when its content changed. On error the old policy stays.
    pub(crate) fn reload_if_changed(&self) -> Reload {
        let Some(path) = &self.path else { return Reload::Unchanged };
        match self.file.reload_if_changed(|c, _| read(c, path, self.runtime_labels)) {
            FileReload::Unchanged => Reload::Unchanged,
            // The file is back as the policy in force was read from: that policy is in
            // force again, no longer stale, as a fresh read of the same content makes it.
            FileReload::Recovered | FileReload::Replaced => {
                self.generation.fetch_add(1, Ordering::SeqCst);
                self.file_replaced.send_modify(|n| *n = n.wrapping_add(1));
                Reload::Replaced
            }
            FileReload::Failed(e) => Reload::Failed(e),
        }
    }
}

/// The policy in the file as read.
fn read(mut contents: Contents, path: &Path, runtime_labels: bool) -> Result<AccessPolicy, AccessPolicyError> {
    let bytes =
        contents.take(0).map_err(|source| AccessPolicyError::Read { path: path.display().to_string(), source })?;
    parse_bytes(&bytes, path, runtime_labels)
}

fn parse_bytes(bytes: &[u8], path: &Path, runtime_labels: bool) -> Result<AccessPolicy, AccessPolicyError> {
    let text = std::str::from_utf8(bytes)
        .map_err(|_| AccessPolicyError::Invalid { path: path.display().to_string(), why: "not UTF-8".into() })?;
    AccessPolicy::parse(text, path, runtime_labels)
}

#[cfg(test)]
mod tests;
