//! ModuleConfigPolicies in force (issue 29): central configuration takes precedence.
//!
//! Precedence: a policy's `enforce` > the template's `defaultConfig` (created once) > the
//! user. Per reconcile of a Runtime (which a hub event for its cluster triggers, so a user's
//! edit of the module configuration is seen within the event's delivery, never by polling),
//! for each installed module with a configuration object:
//! 1. the usable policies matching the Runtime are merged; a field two of them disagree on
//!    is a conflict, reported on each policy and enforced by none;
//! 2. exactly the enforced fields are server-side applied with the field manager
//!    [`FIELD_MANAGER`] and `force`, only when the object differs or the set of fields
//!    changed; a changed value gets an Event `ConfigEnforced` naming the pointers;
//! 3. fields no longer enforced (a policy removed, narrowed or made unusable) are released:
//!    first co-owned at their current values by [`RELEASE_MANAGER`] (no force), then the
//!    policy manager's set is applied without them, so they stay as they are (an apply that
//!    simply drops a field its manager owns alone deletes it);
//! 4. the whole object is checked against every policy's schema; errors (JSON pointer,
//!    message) go into the module's status (`config`, condition `ConfigValid=False`), a
//!    Warning Event `ConfigInvalid` and the gauge `fleetwatch_lifecycle_module_config_invalid`;
//!    with `onInvalid: Restore` the last valid configuration is put back. The last valid
//!    configuration is kept in the Runtime's status (`status.modules[].config.lastValid`,
//!    at most [`LAST_VALID_MAX_BYTES`]; larger ones are not kept and cannot be restored);
//! 5. the annotation [`RESET_ANNOTATION`] (`<module>` or `all`) puts the configuration back
//!    to the template's default, then the enforced fields, once; the annotation is removed
//!    and an Event `ConfigReset` records it.
//!
//! A policy's own status (runtimes matched, valid, invalid, `Ready` with `InvalidSpec` or
//! `Conflict`) is computed from the operator's caches by [`run_status`] and written only
//! when it differs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::config_policy::{
    ApplyTo, ConfigError, LAST_VALID_MAX_BYTES, ModuleConfigPolicy, ModuleConfigPolicyStatus, ModuleConfigStatus,
    OnInvalid, RESET_ANNOTATION, compile, differing, enforced_pointers, merge_enforce, violations,
};
use fleetwatch_api::{Condition, ModuleStatus, ModuleTemplate, ResourceRef, Runtime, State};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Resource, ResourceExt};
use serde_json::{Map, Value, json};
use tokio_util::sync::CancellationToken;

use crate::Ctx;
use crate::applier::Applier;
use crate::events::{EventType, event};

/// The field manager that owns enforced fields.
pub const FIELD_MANAGER: &str = "fleetwatch-config-policy";
/// The field manager that keeps released fields (no longer enforced) as they are.
pub const RELEASE_MANAGER: &str = "fleetwatch-config-released";
/// The field manager of restores and resets (whole-object replacements).
pub const RESTORE_MANAGER: &str = "fleetwatch-config-restore";

/// What reconciles share about policies.
pub struct Shared {
    /// The ModuleConfigPolicies.
    pub policies: Store<ModuleConfigPolicy>,
    /// Wakes [`run_status`].
    pub changed: Arc<tokio::sync::Notify>,
}

/// The policy store and the stream of touched (applied or deleted) policies.
pub fn watch(
    client: kube::Client,
) -> (Store<ModuleConfigPolicy>, impl futures_util::Stream<Item = Result<ModuleConfigPolicy, watcher::Error>> + Send) {
    let (store, writer) = reflector::store::<ModuleConfigPolicy>();
    let api: Api<ModuleConfigPolicy> = Api::all(client);
    let stream = watcher(api, watcher::Config::default()).default_backoff().reflect(writer).touched_objects();
    (store, stream)
}

/// What a policy watch event triggers: the [`affected`] Runtimes when the spec changed
/// (another generation) or the policy is gone; nothing for a status-only change (the
/// operator's own status writes would otherwise reconcile every matched Runtime).
pub fn on_policy_change(
    runtimes: Store<Runtime>,
    policies: Store<ModuleConfigPolicy>,
    changed: Arc<tokio::sync::Notify>,
) -> impl Fn(ModuleConfigPolicy) -> Vec<ObjectRef<Runtime>> + Send + Sync + 'static {
    let seen: std::sync::Mutex<std::collections::HashMap<String, Option<i64>>> = Default::default();
    move |p: ModuleConfigPolicy| {
        changed.notify_one();
        let key = format!("{}/{}", p.namespace().unwrap_or_default(), p.name_any());
        let gone = policies.get(&ObjectRef::from_obj(&p)).is_none();
        let Ok(mut seen) = seen.lock() else { return affected(&runtimes, &p) };
        if gone {
            seen.remove(&key);
        } else if seen.insert(key, p.metadata.generation) == Some(p.metadata.generation) {
            return Vec::new();
        }
        affected(&runtimes, &p)
    }
}

/// The Runtimes a policy change concerns: those of its namespace that have its module.
pub fn affected(runtimes: &Store<Runtime>, policy: &ModuleConfigPolicy) -> Vec<ObjectRef<Runtime>> {
    runtimes
        .state()
        .iter()
        .filter(|rt| rt.namespace() == policy.namespace())
        .filter(|rt| {
            rt.spec.modules.iter().any(|m| m.name == policy.spec.module)
                || rt.status.iter().flat_map(|s| &s.modules).any(|m| m.name == policy.spec.module)
        })
        .map(|rt| ObjectRef::from_obj(rt.as_ref()))
        .collect()
}

/// Why the operator cannot use `policy` (bad input), if it cannot.
pub fn problem(policy: &ModuleConfigPolicy, templates: &[Arc<ModuleTemplate>]) -> Option<String> {
    let ns = policy.namespace();
    let module = policy.spec.module.as_str();
    let known = module == crate::agent_module::MODULE
        || templates.iter().any(|t| t.namespace() == ns && t.spec.module_name == module);
    if !known {
        return policy.spec.check(&[]).err();
    }
    // The rest (enforce, schema) depends on the spec only: checked once per generation.
    compiled(policy).err()
}

/// Compiled schemas (and spec problems) per policy generation, shared by reconciles and the
/// status writer: a schema is compiled once per change, not per reconcile. Bounded: cleared
/// when it holds more than [`COMPILED_MAX`] entries.
type Compiled = Result<Option<Arc<fleetwatch_api::config_policy::Validator>>, String>;
type CompiledCache = std::sync::Mutex<std::collections::HashMap<(String, Option<String>), Compiled>>;
static COMPILED: std::sync::LazyLock<CompiledCache> = std::sync::LazyLock::new(Default::default);
const COMPILED_MAX: usize = 4096;

/// The policy's compiled schema (`None` without one), or why its spec cannot be used.
fn compiled(policy: &ModuleConfigPolicy) -> Compiled {
    let key = (
        format!(
            "{}/{}/{}",
            policy.namespace().unwrap_or_default(),
            policy.name_any(),
            policy.uid().unwrap_or_default()
        ),
        policy.resource_version(),
    );
    if let Some(hit) = COMPILED.lock().ok().and_then(|c| c.get(&key).cloned()) {
        return hit;
    }
    let result = policy.spec.check(&[policy.spec.module.as_str()]).and_then(|()| match &policy.spec.schema {
        Some(schema) => compile(schema).map(|v| Some(Arc::new(v))),
        None => Ok(None),
    });
    if let Ok(mut c) = COMPILED.lock() {
        if c.len() >= COMPILED_MAX {
            c.clear();
        }
        c.insert(key, result.clone());
    }
    result
}

/// The usable policies of `module` that match `rt`, sorted by name.
fn matching(
    policies: &[Arc<ModuleConfigPolicy>],
    templates: &[Arc<ModuleTemplate>],
    rt: &Runtime,
    module: &str,
) -> Vec<Arc<ModuleConfigPolicy>> {
    let labels = rt.labels();
    let mut out: Vec<_> = policies
        .iter()
        .filter(|p| p.namespace() == rt.namespace() && p.spec.module == module)
        .filter(|p| p.spec.runtime_selector.as_ref().is_none_or(|s| s.matches(labels)))
        .filter(|p| problem(p, templates).is_none())
        .cloned()
        .collect();
    out.sort_by_key(|p| p.name_any());
    out
}

/// Applies the policies to every module of `rt` (called by the reconcile before it writes
/// the status; never fails it: problems go into the modules' `config` status).
pub(crate) async fn enforce(
    ctx: &Ctx,
    applier: &Applier,
    rt: &Runtime,
    statuses: &mut [ModuleStatus],
    previous: &[ModuleStatus],
) {
    let mut reset = rt.annotations().get(RESET_ANNOTATION).cloned();
    if reset.is_some() {
        // Once: a reconcile right after the reset may still see the annotation in the cache.
        let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &rt.namespace().unwrap_or_default());
        if let Ok(fresh) = api.get(&rt.name_any()).await {
            reset = fresh.annotations().get(RESET_ANNOTATION).cloned();
        }
    }
    let policies = ctx.config.policies.state();
    let templates = ctx.templates.state();
    let mut was_reset = Vec::new();
    for st in statuses.iter_mut() {
        if matches!(st.state, State::Deleting | State::Unmanaged) {
            continue;
        }
        let prev = previous.iter().find(|p| p.name == st.name).and_then(|p| p.config.clone());
        let in_force = matching(&policies, &templates, rt, &st.name);
        let reset_this = reset.as_deref().is_some_and(|r| r == "all" || r == st.name);
        if in_force.is_empty() && prev.as_ref().is_none_or(|c| c.enforced.is_empty()) && !reset_this {
            st.config = None;
            continue;
        }
        let Some(cfg) = st.default_config.clone() else {
            st.config = None;
            continue;
        };
        let mut m =
            Module { ctx, applier, rt, module: st.name.clone(), cfg, prev: prev.unwrap_or_default(), other: false };
        let default = reset_this.then(|| default_config(&templates, rt, st)).flatten();
        if reset_this {
            was_reset.push(st.name.clone());
        }
        st.config = Some(m.run(&in_force, reset_this.then_some(default)).await);
        // Policies over every instance of the managed kinds.
        let wide: Vec<_> = in_force.iter().filter(|p| p.spec.apply_to == ApplyTo::ManagedResources).cloned().collect();
        if !wide.is_empty() {
            let mut total = st.config.take().unwrap_or_default();
            for kind in &st.managed_resources {
                let objects = match applier.list(kind).await {
                    Ok(o) => o,
                    Err(e) => {
                        tracing::warn!(module = %st.name, error = %e, "cannot list the managed resources");
                        continue;
                    }
                };
                for r in objects.into_iter().filter(|r| *r != m.cfg) {
                    let mut o = Module {
                        ctx,
                        applier,
                        rt,
                        module: st.name.clone(),
                        cfg: r,
                        prev: Default::default(),
                        other: true,
                    };
                    let sub = o.run(&wide, None).await;
                    add_object(&mut total, sub, &o.object());
                }
            }
            st.config = Some(total);
        }
    }
    if reset.is_some() {
        remove_reset_annotation(ctx, rt).await;
        for module in &was_reset {
            note(
                ctx,
                rt,
                EventType::Normal,
                "ConfigReset",
                module,
                format!("configuration of {module} reset to the default and the enforced fields"),
            )
            .await;
        }
    }
    ctx.config.changed.notify_one();
}

/// The cluster cannot be reached: what was known of the configuration is no longer known
/// (`ConfigValid=Unknown`); the reconcile is retried.
pub(crate) fn unreachable(st: &mut ModuleStatus, why: &str) {
    if let Some(c) = st.config.as_mut() {
        for cond in c.conditions.iter_mut().filter(|c| c.type_ == "ConfigValid") {
            if cond.status != "Unknown" {
                cond.last_transition_time = Some(jiff::Timestamp::now().to_string());
            }
            cond.status = "Unknown".into();
            cond.reason = "Unreachable".into();
            cond.message = format!("the cluster cannot be reached: {why}");
        }
    }
}

/// Adds one managed object's outcome to the module's: its errors, and a `False` condition
/// (prefixed with the object) over a `True` one.
fn add_object(total: &mut ModuleConfigStatus, sub: ModuleConfigStatus, object: &str) {
    total.errors.extend(sub.errors);
    for c in sub.conditions.into_iter().filter(|c| c.status != "True") {
        let message = format!("{object}: {}", c.message);
        match total.conditions.iter_mut().find(|t| t.type_ == c.type_) {
            Some(t) if t.status == "True" => *t = Condition { message, ..c },
            Some(t) => t.message = format!("{}; {message}", t.message),
            None => total.conditions.push(Condition { message, ..c }),
        }
    }
}

/// The template's default configuration of the module's installed version.
fn default_config(templates: &[Arc<ModuleTemplate>], rt: &Runtime, st: &ModuleStatus) -> Option<Value> {
    let version = st.installed_version.as_deref()?;
    templates
        .iter()
        .find(|t| {
            t.namespace() == rt.namespace()
                && t.spec.module_name == st.name
                && fleetwatch_api::policy::parse(&t.spec.version).ok() == fleetwatch_api::policy::parse(version).ok()
        })
        .and_then(|t| t.spec.default_config.clone())
}

async fn remove_reset_annotation(ctx: &Ctx, rt: &Runtime) {
    let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &rt.namespace().unwrap_or_default());
    let patch = json!({"metadata": {"annotations": {RESET_ANNOTATION: null}}});
    if let Err(e) = api.patch(&rt.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
        tracing::warn!(error = %e, "cannot remove the reset-config annotation");
    }
}

async fn note(ctx: &Ctx, rt: &Runtime, type_: EventType, reason: &str, module: &str, text: String) {
    let ev = event(type_, reason, "Configure", module, text);
    if let Err(e) = ctx.recorder.publish(&ev, &rt.object_ref(&())).await {
        tracing::debug!(%reason, error = %e, "cannot publish an Event");
    }
}

/// One module's configuration under its policies.
struct Module<'a> {
    ctx: &'a Ctx,
    applier: &'a Applier,
    rt: &'a Runtime,
    module: String,
    cfg: ResourceRef,
    prev: ModuleConfigStatus,
    /// An instance of a managed kind, not the configuration object: enforced and validated,
    /// never restored, no last valid copy kept.
    other: bool,
}

/// `apiVersion`, `kind` and `metadata` (name, namespace) of the configuration object.
fn header(cfg: &ResourceRef) -> Value {
    let mut meta = Map::new();
    meta.insert("name".into(), json!(cfg.name));
    if let Some(ns) = &cfg.namespace {
        meta.insert("namespace".into(), json!(ns));
    }
    json!({"apiVersion": cfg.api_version, "kind": cfg.kind, "metadata": meta})
}

/// `enforce`'s content on the object's header.
fn with_header(cfg: &ResourceRef, content: &Value) -> Value {
    let mut obj = header(cfg);
    if let (Some(o), Some(c)) = (obj.as_object_mut(), content.as_object()) {
        for (k, v) in c.iter().filter(|(k, _)| !matches!(k.as_str(), "apiVersion" | "kind" | "metadata")) {
            o.insert(k.clone(), v.clone());
        }
    }
    obj
}

/// What the schemas see and `lastValid` keeps: the object without status and server-set
/// metadata (only name, namespace, labels and annotations stay).
fn content(obj: &Value) -> Value {
    let mut out = obj.clone();
    if let Some(o) = out.as_object_mut() {
        o.remove("status");
        if let Some(meta) = obj.get("metadata").and_then(Value::as_object) {
            let kept: Map<String, Value> = meta
                .iter()
                .filter(|(k, _)| matches!(k.as_str(), "name" | "namespace" | "labels" | "annotations"))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            o.insert("metadata".into(), Value::Object(kept));
        }
    }
    out
}

/// The leaves (JSON pointers) `manager` owns by apply, from `metadata.managedFields`.
fn owned_by(obj: &Value, manager: &str) -> Vec<String> {
    fn walk(v: &Value, at: &str, out: &mut Vec<String>) {
        let children: Vec<(&String, &Value)> =
            v.as_object().map(|m| m.iter().filter(|(k, _)| k.starts_with("f:")).collect()).unwrap_or_default();
        if children.is_empty() {
            if !at.is_empty() {
                out.push(at.to_string());
            }
            return;
        }
        for (k, x) in children {
            walk(x, &format!("{at}/{}", k[2..].replace('~', "~0").replace('/', "~1")), out);
        }
    }
    let mut out = Vec::new();
    for e in obj.pointer("/metadata/managedFields").and_then(Value::as_array).into_iter().flatten() {
        if e["manager"] == manager && e["operation"] == "Apply" {
            walk(&e["fieldsV1"], "", &mut out);
        }
    }
    out.retain(|p| !p.starts_with("/metadata"));
    out
}

fn condition(prev: &[Condition], type_: &str, ok: bool, reason: &str, message: String) -> Condition {
    let status = if ok { "True" } else { "False" };
    let since = prev
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .and_then(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| jiff::Timestamp::now().to_string());
    Condition {
        type_: type_.into(),
        status: status.into(),
        reason: reason.into(),
        message,
        last_transition_time: Some(since),
    }
}

impl Module<'_> {
    /// `Kind namespace/name` of the object.
    fn object(&self) -> String {
        match &self.cfg.namespace {
            Some(ns) => format!("{} {ns}/{}", self.cfg.kind, self.cfg.name),
            None => format!("{} {}", self.cfg.kind, self.cfg.name),
        }
    }

    /// How Events and logs name what is configured.
    fn what(&self) -> String {
        if self.other {
            format!("{}'s {}", self.module, self.object())
        } else {
            format!("{}'s configuration", self.module)
        }
    }

    async fn get(&self) -> Result<Option<Value>, String> {
        match self.applier.get(&self.cfg).await {
            Ok(Some(o)) => serde_json::to_value(o).map(Some).map_err(|e| e.to_string()),
            Ok(None) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    /// Replaces the object's content with `body` (keeping what the API server needs).
    async fn replace(&self, current: Option<&Value>, body: &Value) -> Result<(), String> {
        let mut obj = with_header(&self.cfg, body);
        if let Some(src) = body.pointer("/metadata").and_then(Value::as_object) {
            for k in ["labels", "annotations"] {
                if let Some(v) = src.get(k) {
                    obj["metadata"][k] = v.clone();
                }
            }
        }
        match current.and_then(|c| c.pointer("/metadata/resourceVersion")) {
            Some(rv) => {
                obj["metadata"]["resourceVersion"] = rv.clone();
                self.applier.replace_as(&obj, RESTORE_MANAGER).await.map(|_| ()).map_err(|e| e.to_string())
            }
            None => self.applier.create_once(&obj).await.map(|_| ()).map_err(|e| e.to_string()),
        }
    }

    async fn run(&mut self, in_force: &[Arc<ModuleConfigPolicy>], reset: Option<Option<Value>>) -> ModuleConfigStatus {
        let module = self.module.clone();
        let names: Vec<String> = in_force.iter().map(|p| p.name_any()).collect();
        let pairs: Vec<(&str, &Value)> =
            in_force.iter().zip(&names).map(|(p, n)| (n.as_str(), &p.spec.enforce)).collect();
        let merged = merge_enforce(&pairs);
        let pointers = enforced_pointers(&merged.value);
        let mut status = ModuleConfigStatus {
            policies: names.clone(),
            enforced: pointers.clone(),
            last_valid: self.prev.last_valid.clone(),
            ..Default::default()
        };
        let prev_conditions = self.prev.conditions.clone();
        let fail = |mut status: ModuleConfigStatus, why: String| {
            tracing::warn!(module = %module, error = %why, "module configuration not enforced");
            status.enforced = Vec::new();
            status.conditions = vec![condition(&prev_conditions, "ConfigEnforced", false, "Error", why)];
            status
        };
        // A reset: the template's default content, then the enforced fields below.
        if let Some(default) = reset {
            let Some(default) = default else {
                return fail(status, "reset asked for, but the template has no default configuration".into());
            };
            let current = match self.get().await {
                Ok(c) => c,
                Err(e) => return fail(status, e),
            };
            if let Err(e) = self.replace(current.as_ref(), &content(&default)).await {
                return fail(status, format!("resetting the configuration: {e}"));
            }
            tracing::info!(module = %module, "module configuration reset to its default");
        }
        let mut obj = match self.get().await {
            Ok(Some(o)) => o,
            Ok(None) => {
                return fail(status, format!("configuration object {} {} not found", self.cfg.kind, self.cfg.name));
            }
            Err(e) => return fail(status, e),
        };
        // Released fields stay as they are: co-owned by the release manager first.
        let now: BTreeSet<&String> = pointers.iter().collect();
        // What this manager owns is read from the object itself: the cached status can lag.
        let mut owned = owned_by(&obj, FIELD_MANAGER);
        owned.sort();
        let released: Vec<&String> = owned.iter().filter(|p| !now.contains(p)).collect();
        if !released.is_empty() {
            // An apply sets the manager's whole set: what it kept before is kept again.
            let kept = owned_by(&obj, RELEASE_MANAGER);
            let mut keep = Value::Object(Map::new());
            for p in released.iter().copied().chain(kept.iter()) {
                if let Some(v) = obj.pointer(p) {
                    fleetwatch_api::config_policy::set_pointer(&mut keep, p, v.clone());
                }
            }
            if let Err(e) = self.applier.apply_as(&with_header(&self.cfg, &keep), RELEASE_MANAGER, false).await {
                tracing::warn!(module = %module, error = %e, "cannot keep the released configuration fields");
            }
            tracing::info!(module = %module, fields = ?released, "configuration fields released");
        }
        let diffs = differing(&obj, &merged.value, &pointers);
        if !diffs.is_empty() || !released.is_empty() || pointers != owned {
            match self.applier.apply_as(&with_header(&self.cfg, &merged.value), FIELD_MANAGER, true).await {
                Ok(stored) => obj = serde_json::to_value(stored).unwrap_or(obj),
                Err(e) => return fail(status, format!("applying the enforced fields: {e}")),
            }
            if !diffs.is_empty() {
                self.ctx.metrics.config_enforced.inc();
                let text = format!("enforced {} of {} ({})", diffs.join(", "), self.what(), names.join(", "));
                tracing::info!(module = %module, fields = %diffs.join(","), "configuration fields enforced");
                note(self.ctx, self.rt, EventType::Normal, "ConfigEnforced", &module, text).await;
            }
        }
        let enforced_cond = if merged.conflicts.is_empty() {
            condition(
                &prev_conditions,
                "ConfigEnforced",
                true,
                "Enforced",
                format!("{} fields enforced", pointers.len()),
            )
        } else {
            let text: Vec<String> =
                merged.conflicts.iter().map(|(p, who)| format!("{p} ({})", who.join(" vs "))).collect();
            condition(
                &prev_conditions,
                "ConfigEnforced",
                false,
                "Conflict",
                format!("policies disagree, not enforced: {}", text.join(", ")),
            )
        };
        // Validation, and a restore of the last valid configuration when asked for.
        let mut errors = self.validate(in_force, &obj);
        if !errors.is_empty() && !self.other {
            // The cached Runtime can predate the status holding the latest valid
            // configuration (the previous reconcile wrote it moments ago): ask the API server.
            status.last_valid = self.fresh_last_valid().await;
        }
        if !errors.is_empty()
            && let Some(last) = status.last_valid.clone()
            && in_force
                .iter()
                .any(|p| p.spec.on_invalid == OnInvalid::Restore && errors.iter().any(|e| e.policy == p.name_any()))
        {
            let pointers: Vec<String> = errors.iter().map(|e| e.pointer.clone()).collect();
            let restored = async {
                self.replace(Some(&obj), &last).await?;
                self.applier
                    .apply_as(&with_header(&self.cfg, &merged.value), FIELD_MANAGER, true)
                    .await
                    .map_err(|e| e.to_string())?;
                self.get().await
            }
            .await;
            match restored {
                Ok(Some(o)) => {
                    obj = o;
                    let text =
                        format!("restored the last valid configuration of {module} (invalid: {})", pointers.join(", "));
                    tracing::info!(module = %module, "last valid configuration restored");
                    note(self.ctx, self.rt, EventType::Normal, "ConfigRestored", &module, text).await;
                    errors = self.validate(in_force, &obj);
                }
                Ok(None) => {}
                Err(e) => tracing::warn!(module = %module, error = %e, "cannot restore the last valid configuration"),
            }
        }
        let valid_cond = if errors.is_empty() {
            let c = content(&obj);
            let size = serde_json::to_vec(&c).map(|v| v.len()).unwrap_or(usize::MAX);
            status.last_valid = (size <= LAST_VALID_MAX_BYTES && !self.other).then_some(c);
            let schemas = in_force.iter().filter(|p| p.spec.schema.is_some()).count();
            condition(&prev_conditions, "ConfigValid", true, "Valid", format!("meets {schemas} schemas"))
        } else {
            let text: Vec<String> = errors.iter().map(|e| format!("{}: {}", e.pointer, e.message)).collect();
            if errors != self.prev.errors {
                self.ctx.metrics.config_invalid.inc();
                let note_text = format!("{} is invalid: {}", self.what(), text.join("; "));
                tracing::warn!(module = %module, errors = %text.join("; "), "module configuration invalid");
                note(self.ctx, self.rt, EventType::Warning, "ConfigInvalid", &module, note_text).await;
            }
            condition(&prev_conditions, "ConfigValid", false, "SchemaViolation", text.join("; "))
        };
        status.errors = errors;
        status.conditions = vec![valid_cond, enforced_cond];
        status
    }

    /// The last valid configuration as the API server's Runtime status records it (the
    /// cached one when it cannot be read).
    async fn fresh_last_valid(&self) -> Option<Value> {
        let api: Api<Runtime> = Api::namespaced(self.ctx.client.clone(), &self.rt.namespace().unwrap_or_default());
        match api.get_status(&self.rt.name_any()).await {
            Ok(fresh) => fresh
                .status
                .into_iter()
                .flat_map(|s| s.modules)
                .find(|m| m.name == self.module)
                .and_then(|m| m.config)
                .and_then(|c| c.last_valid),
            Err(e) => {
                tracing::debug!(error = %e, "cannot read the Runtime's status; the cached last valid configuration is used");
                self.prev.last_valid.clone()
            }
        }
    }

    fn validate(&self, in_force: &[Arc<ModuleConfigPolicy>], obj: &Value) -> Vec<ConfigError> {
        let c = content(obj);
        let mut out = Vec::new();
        for p in in_force {
            // Checked usable before; compiled once per policy change.
            let Ok(Some(v)) = compiled(p) else { continue };
            for (pointer, message) in violations(&v, &c) {
                let object = if self.other { self.object() } else { String::new() };
                out.push(ConfigError { policy: p.name_any(), pointer, message, object });
            }
        }
        out
    }
}

/// Keeps every policy's status current (runtimes matched, valid, invalid, `Ready`), from
/// the caches, woken by reconciles and policy changes (and every few seconds, for Runtime
/// status changes written by other instances); written only when it differs. `runtimes`
/// must hold the whole fleet; with shards only the holder of shard 0 writes (one writer,
/// no flapping between instances).
pub async fn run_status(
    client: kube::Client,
    shared: Arc<tokio::sync::Notify>,
    policies: Store<ModuleConfigPolicy>,
    runtimes: Store<Runtime>,
    templates: Store<ModuleTemplate>,
    shards: Option<Arc<crate::shards::ShardMap>>,
    shutdown: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = shared.notified() => {}
            _ = tokio::time::sleep(Duration::from_secs(5)) => {}
        }
        // Let the status the reconcile is writing reach the cache; a second pass catches a
        // status that took longer (several runtimes reconciling).
        for wait in [Duration::from_millis(300), Duration::from_millis(1200)] {
            tokio::time::sleep(wait).await;
            if shards.as_ref().is_some_and(|m| !m.held().contains(&0)) {
                continue;
            }
            write_statuses(&client, &policies, &runtimes, &templates).await;
        }
    }
}

async fn write_statuses(
    client: &kube::Client,
    policies: &Store<ModuleConfigPolicy>,
    runtimes: &Store<Runtime>,
    templates: &Store<ModuleTemplate>,
) {
    let all = policies.state();
    let templates = templates.state();
    let runtimes = runtimes.state();
    for p in &all {
        let next = status_of(p, &all, &templates, &runtimes);
        let same = p.status.as_ref().is_some_and(|s| {
            let strip = |s: &ModuleConfigPolicyStatus| {
                let mut s = s.clone();
                s.conditions.iter_mut().for_each(|c| c.last_transition_time = None);
                s
            };
            strip(s) == strip(&next)
        });
        if same {
            continue;
        }
        let api: Api<ModuleConfigPolicy> = Api::namespaced(client.clone(), &p.namespace().unwrap_or_default());
        if let Err(e) =
            api.patch_status(&p.name_any(), &PatchParams::default(), &Patch::Merge(&json!({"status": next}))).await
        {
            tracing::debug!(policy = %p.name_any(), error = %e, "cannot write the ModuleConfigPolicy status");
        }
    }
}

/// A policy's status from the caches.
pub fn status_of(
    p: &ModuleConfigPolicy,
    all: &[Arc<ModuleConfigPolicy>],
    templates: &[Arc<ModuleTemplate>],
    runtimes: &[Arc<Runtime>],
) -> ModuleConfigPolicyStatus {
    let prev = p.status.clone().unwrap_or_default().conditions;
    let mut status = ModuleConfigPolicyStatus { observed_generation: p.metadata.generation, ..Default::default() };
    if let Some(why) = problem(p, templates) {
        status.conditions = vec![condition(&prev, "Ready", false, "InvalidSpec", why)];
        return status;
    }
    let name = p.name_any();
    let mut conflicts: BTreeSet<String> = BTreeSet::new();
    for rt in runtimes {
        if rt.namespace() != p.namespace() || !rt.spec.modules.iter().any(|m| m.name == p.spec.module) {
            continue;
        }
        let in_force = matching(all, templates, rt, &p.spec.module);
        if !in_force.iter().any(|q| q.name_any() == name) {
            continue;
        }
        status.runtimes_matched += 1;
        let names: Vec<String> = in_force.iter().map(|q| q.name_any()).collect();
        let pairs: Vec<(&str, &Value)> =
            in_force.iter().zip(&names).map(|(q, n)| (n.as_str(), &q.spec.enforce)).collect();
        for (pointer, who) in merge_enforce(&pairs).conflicts {
            if who.contains(&name) {
                let others: Vec<&String> = who.iter().filter(|w| **w != name).collect();
                conflicts.insert(format!(
                    "{pointer} with {} on {}",
                    others.iter().map(|s| s.as_str()).collect::<Vec<_>>().join(", "),
                    rt.name_any()
                ));
            }
        }
        let module = rt.status.iter().flat_map(|s| &s.modules).find(|m| m.name == p.spec.module);
        let valid = module.and_then(|m| {
            let c = m.config.as_ref()?.conditions.iter().find(|c| c.type_ == "ConfigValid")?;
            Some((c.status == "True", m.state))
        });
        match valid {
            Some((true, state)) if state != State::Error => status.valid += 1,
            Some((false, _)) => status.invalid += 1,
            _ => {}
        }
    }
    status.conditions = vec![if conflicts.is_empty() {
        condition(&prev, "Ready", true, "Valid", format!("matches {} runtimes", status.runtimes_matched))
    } else {
        let list: Vec<String> = conflicts.into_iter().collect();
        condition(&prev, "Ready", false, "Conflict", format!("conflicting enforce, not enforced: {}", list.join("; ")))
    }];
    status
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::config_policy::ModuleConfigPolicySpec;
    use fleetwatch_api::{ModuleEntry, ModuleTemplateSpec, RuntimeSpec};

    fn policy(name: &str, enforce: Value) -> Arc<ModuleConfigPolicy> {
        let mut p = ModuleConfigPolicy::new(
            name,
            ModuleConfigPolicySpec { module: "redis".into(), enforce, ..Default::default() },
        );
        p.metadata.namespace = Some("kcp".into());
        Arc::new(p)
    }

    #[test]
    fn policy_status_counts_and_reports_conflicts_and_bad_input() {
        let mut t =
            ModuleTemplate::new("redis-1", ModuleTemplateSpec { module_name: "redis".into(), ..Default::default() });
        t.metadata.namespace = Some("kcp".into());
        let templates = vec![Arc::new(t)];
        let mut rt = Runtime::new(
            "rt1",
            RuntimeSpec {
                modules: vec![ModuleEntry { name: "redis".into(), ..Default::default() }],
                ..Default::default()
            },
        );
        rt.metadata.namespace = Some("kcp".into());
        let runtimes = vec![Arc::new(rt)];
        let a = policy("a", json!({"spec": {"tls": true}}));
        let b = policy("b", json!({"spec": {"tls": false}}));
        let bad = policy("bad", json!("x"));
        let all = vec![a.clone(), b.clone(), bad.clone()];
        let s = status_of(&a, &all, &templates, &runtimes);
        assert_eq!(s.runtimes_matched, 1);
        assert_eq!(s.conditions[0].reason, "Conflict");
        assert!(s.conditions[0].message.contains("/spec/tls with b on rt1"), "{:?}", s.conditions);
        let s = status_of(&bad, &all, &templates, &runtimes);
        assert_eq!(s.conditions[0].reason, "InvalidSpec");
        assert_eq!(s.runtimes_matched, 0);
        let s = status_of(&a, std::slice::from_ref(&a), &templates, &runtimes);
        assert_eq!(s.conditions[0].status, "True");
    }

    #[test]
    fn owned_fields_are_read_from_managed_fields() {
        let obj = json!({"metadata": {"managedFields": [
            {"manager": "fleetwatch-config-released", "operation": "Apply",
             "fieldsV1": {"f:spec": {"f:tls": {}, "f:a/b": {}}, "f:metadata": {"f:labels": {"f:x": {}}}}},
            {"manager": "other", "operation": "Apply", "fieldsV1": {"f:spec": {"f:size": {}}}}]}});
        let mut got = owned_by(&obj, RELEASE_MANAGER);
        got.sort();
        assert_eq!(got, vec!["/spec/a~1b", "/spec/tls"]);
    }

    #[test]
    fn an_unreachable_cluster_is_not_reported_valid() {
        let valid = condition(&[], "ConfigValid", true, "Valid", "meets 1 schemas".into());
        let mut st = ModuleStatus {
            name: "redis".into(),
            config: Some(ModuleConfigStatus { conditions: vec![valid], ..Default::default() }),
            ..Default::default()
        };
        unreachable(&mut st, "connection refused");
        let c = &st.config.unwrap().conditions[0];
        assert_eq!((c.status.as_str(), c.reason.as_str()), ("Unknown", "Unreachable"));
        assert!(c.message.contains("connection refused"));
        let mut none = ModuleStatus::default();
        unreachable(&mut none, "x");
        assert!(none.config.is_none());
    }

    #[test]
    fn content_keeps_what_a_restore_needs() {
        let obj = json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "resourceVersion": "3",
            "managedFields": [], "labels": {"a": "b"}}, "spec": {"x": 1}, "status": {"y": 2}});
        assert_eq!(
            content(&obj),
            json!({"apiVersion": "v1", "kind": "X", "metadata": {"name": "n", "labels": {"a": "b"}}, "spec": {"x": 1}})
        );
    }
}
