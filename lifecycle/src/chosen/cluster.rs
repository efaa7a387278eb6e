//! Reading and writing the `Module` objects of one runtime cluster: the CRD installed, the
//! objects listed (each read on its own, so one unreadable object is refused, not the whole
//! list), the objects of centrally listed modules kept, statuses written when they change,
//! and the finalizer added to users' objects taken up and removed once their module is gone.

use std::collections::{HashMap, HashSet};

use fleetwatch_api::chosen::{ChosenModuleStatus, FINALIZER, Module};
use fleetwatch_api::{ModuleEntry, ModuleStatus, Runtime};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams};
use kube::core::{ApiResource, GroupVersionKind};
use kube::{CustomResourceExt, ResourceExt};
use serde_json::json;

use super::{Listed, Merged, Verdict};
use crate::Error;
use crate::applier::{Applier, FIELD_MANAGER};

/// What the operator remembers of each runtime cluster's `Module` objects (in memory:
/// after a restart the CRD is applied again and nothing is said to be put back).
#[derive(Default)]
pub(crate) struct Known {
    clusters: std::sync::Mutex<HashMap<String, KnownCluster>>,
}

#[derive(Default)]
struct KnownCluster {
    /// The CRD was applied by this instance.
    crd: bool,
    /// The kept objects of central modules seen, to tell a put-back.
    central: HashSet<String>,
}

impl Known {
    fn with<T>(&self, key: &str, f: impl FnOnce(&mut KnownCluster) -> T) -> Option<T> {
        self.clusters.lock().ok().map(|mut c| f(c.entry(key.to_string()).or_default()))
    }

    /// Forgets a runtime (deleted).
    pub(crate) fn forget(&self, key: &str) {
        if let Ok(mut c) = self.clusters.lock() {
            c.remove(key);
        }
    }
}

fn resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("operator.fleetwatch.dev", "v1alpha1", "Module"),
        "modules",
    )
}

fn api(applier: &Applier) -> Api<DynamicObject> {
    Api::all_with(applier.client().clone(), &resource())
}

/// The CRD as applied into runtime clusters.
fn crd() -> Result<serde_json::Value, Error> {
    fleetwatch_api::crd_manifest(&Module::crd())
        .map_err(|source| Error::Serialize { what: "the Module CRD".into(), source })
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// The cluster's `Module` objects, the CRD applied first when this instance has not yet.
/// A cluster whose CRD is gone while users' modules run is an error (their objects cannot
/// be told from "none chosen", and that would remove them); otherwise no CRD is no object.
pub(crate) async fn gather(
    known: &Known,
    key: &str,
    applier: &Applier,
    previous: &[ModuleStatus],
) -> Result<Vec<Listed>, Error> {
    if known.with(key, |k| k.crd) != Some(true) {
        applier.apply(&crd()?).await?;
        known.with(key, |k| k.crd = true);
    }
    let listed = match api(applier).list(&ListParams::default()).await {
        Ok(list) => list,
        Err(e) if not_found(&e) => {
            known.with(key, |k| k.crd = false);
            if previous.iter().any(|p| p.source == Some(fleetwatch_api::chosen::ChosenBy::User)) {
                return Err(Error::kube("list", format!("Module objects of {key}'s cluster (the CRD is gone)"), e));
            }
            return Ok(Vec::new());
        }
        Err(e) => return Err(Error::kube("list", format!("Module objects of {key}'s cluster"), e)),
    };
    Ok(listed
        .items
        .into_iter()
        .map(|d| {
            let metadata = d.metadata.clone();
            match serde_json::from_value::<fleetwatch_api::chosen::ModuleSpec>(d.data["spec"].clone()) {
                Ok(spec) => {
                    let status = serde_json::from_value::<ChosenModuleStatus>(d.data["status"].clone()).ok();
                    Listed { object: Module { metadata, spec, status }, invalid: None }
                }
                Err(e) => {
                    let status = serde_json::from_value::<ChosenModuleStatus>(d.data["status"].clone()).ok();
                    Listed {
                        object: Module { metadata, spec: Default::default(), status },
                        invalid: Some(e.to_string()),
                    }
                }
            }
        })
        .collect())
}

/// Brings the cluster's objects in line with `merged` and the reconcile's `statuses`: the
/// kept objects of the Runtime's modules created or re-specced, every object's status
/// written when it changed, finalizers added to users' objects taken up and removed from
/// the others once nothing waits for them, kept objects no longer listed deleted. Every
/// object is tried; the first failure is returned (the reconcile comes back soon).
pub(crate) async fn sync(
    known: &Known,
    key: &str,
    applier: &Applier,
    rt: &Runtime,
    merged: &Merged,
    objects: &[Listed],
    statuses: &[ModuleStatus],
) -> Result<(), Error> {
    use futures_util::{FutureExt, StreamExt};
    let api = api(applier);
    let by_name: HashMap<String, &Listed> = objects.iter().map(|o| (o.name(), o)).collect();
    let status_of = |name: &str| statuses.iter().find(|s| s.name == name);
    let mut work: Vec<futures_util::future::BoxFuture<'_, Result<(), Error>>> = Vec::new();
    // The Runtime's modules: each has an object, the operator's own when nobody made one.
    let users = merged.users();
    for entry in rt.spec.modules.iter().filter(|e| !users.contains(e.name.as_str())) {
        let existing = by_name.get(&entry.name).copied();
        let kept = existing.is_none_or(|o| o.kept_by_operator());
        let target = Central { entry, existing, module: status_of(&entry.name), kept };
        work.push(central(known, key, &api, applier, rt, target).boxed());
    }
    // The users' objects.
    for o in objects {
        let name = o.name();
        let Some(verdict) = merged.verdicts.get(&name) else { continue };
        let module = status_of(&name);
        let api = &api;
        work.push(
            async move {
                match verdict {
                    Verdict::Central { .. } => Ok(()), // done above
                    Verdict::Stale => delete(api, &name).await,
                    Verdict::User => {
                        let r = ensure_finalizer(api, o, true).await;
                        let s = write_status(api, o, verdict, module, rt, false).await;
                        r.and(s)
                    }
                    Verdict::Refused { .. } => {
                        // Nothing waits for a refused object's deletion.
                        let r = ensure_finalizer(api, o, false).await;
                        let s = write_status(api, o, verdict, module, rt, false).await;
                        r.and(s)
                    }
                    Verdict::Deleting => match module {
                        // Still being removed: the finalizer stays, the status says what it waits for.
                        Some(st) => write_status(api, o, verdict, Some(st), rt, false).await,
                        None => ensure_finalizer(api, o, false).await,
                    },
                }
            }
            .boxed(),
        );
    }
    // Objects are independent: a few at once, so a runtime with many modules is not
    // written one round trip after another.
    let results: Vec<Result<(), Error>> =
        futures_util::stream::iter(work).buffer_unordered(SYNC_AT_ONCE).collect().await;
    let mut first_error = None;
    for e in results.into_iter().filter_map(Result::err) {
        tracing::warn!(error = %e, "Module object not brought in line");
        first_error.get_or_insert(e);
    }
    match first_error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// Most `Module` objects of one cluster written at once.
const SYNC_AT_ONCE: usize = 8;

/// A module the Runtime lists, and its object in the cluster if it has one.
struct Central<'a> {
    entry: &'a ModuleEntry,
    existing: Option<&'a Listed>,
    module: Option<&'a ModuleStatus>,
    /// The object is the operator's (or there is none yet).
    kept: bool,
}

/// The kept object of a module the Runtime lists: created when missing (a put-back when it
/// was seen before), its spec set to the Runtime's, no finalizer, the status written.
async fn central(
    known: &Known,
    key: &str,
    api: &Api<DynamicObject>,
    applier: &Applier,
    rt: &Runtime,
    target: Central<'_>,
) -> Result<(), Error> {
    let Central { entry, existing, module, kept } = target;
    let verdict = Verdict::Central { kept };
    let (object, put_back) = match existing {
        Some(o) if o.deleting() => {
            // Deleted by someone: let it go (it comes back at the next reconcile).
            return ensure_finalizer(api, o, false).await;
        }
        Some(o) if !kept || super::central_spec_matches(&o.object, entry) => (o.clone(), false),
        _ => {
            let put_back = existing.is_none() && known.with(key, |k| k.central.contains(&entry.name)) == Some(true);
            let applied = applier.apply_as(&super::central_object(entry), FIELD_MANAGER, true).await?;
            if put_back {
                tracing::info!(module = %entry.name, "Module object of a centrally listed module deleted in the cluster; put back");
            }
            let object = Module {
                metadata: applied.metadata,
                spec: serde_json::from_value(applied.data["spec"].clone()).unwrap_or_default(),
                status: existing.and_then(|o| o.object.status.clone()),
            };
            (Listed { object, invalid: None }, put_back)
        }
    };
    known.with(key, |k| k.central.insert(entry.name.clone()));
    ensure_finalizer(api, &object, false).await?;
    write_status(api, &object, &verdict, module, rt, put_back).await
}

/// Writes an object's status when it differs from what it shows.
async fn write_status(
    api: &Api<DynamicObject>,
    o: &Listed,
    verdict: &Verdict,
    module: Option<&ModuleStatus>,
    rt: &Runtime,
    put_back: bool,
) -> Result<(), Error> {
    let runtime = format!("{}/{}", rt.namespace().unwrap_or_default(), rt.name_any());
    let before = o.object.status.as_ref();
    // A put-back is said until the module's status changes.
    let put_back = put_back
        || before.is_some_and(|b| b.conditions.iter().any(|c| c.type_ == "Accepted" && c.reason == "PutBack"))
            && matches!(verdict, Verdict::Central { kept: true });
    let wanted = super::object_status(verdict, module, &runtime, o.object.metadata.generation, put_back, before);
    if before.is_some_and(|b| super::same_status(b, &wanted)) {
        return Ok(());
    }
    let name = o.name();
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(status_patch(&wanted)?))
        .await
        .map(|_| ())
        .map_err(|e| Error::kube("writing status of", format!("Module {name}"), e))
}

/// Every field of [`ChosenModuleStatus`] as it is serialised.
const STATUS_FIELDS: [&str; 9] = [
    "state",
    "version",
    "desiredVersion",
    "channel",
    "source",
    "customResourcePolicy",
    "message",
    "conditions",
    "observedGeneration",
];

/// The merge patch that makes an object's status `wanted`: a field `wanted` leaves out (an
/// empty message, no desired version) is `null`, so the patch clears what the last status said
/// instead of keeping it (a Ready module went on showing "waiting for manager: ...").
fn status_patch(wanted: &ChosenModuleStatus) -> Result<serde_json::Value, Error> {
    let mut status =
        serde_json::to_value(wanted).map_err(|source| Error::Serialize { what: "a Module status".into(), source })?;
    if let Some(fields) = status.as_object_mut() {
        for f in STATUS_FIELDS {
            fields.entry(f).or_insert(serde_json::Value::Null);
        }
    }
    Ok(json!({"status": status}))
}

/// Adds (`want`) or removes the operator's finalizer, with a JSON patch that tests the list
/// it saw first (someone else's change meanwhile fails it, and the reconcile comes back).
async fn ensure_finalizer(api: &Api<DynamicObject>, o: &Listed, want: bool) -> Result<(), Error> {
    let finalizers = o.object.finalizers();
    let has = finalizers.iter().any(|f| f == FINALIZER);
    if has == want {
        return Ok(());
    }
    // A deleting object takes no new finalizer.
    if want && o.deleting() {
        return Ok(());
    }
    let ops = if want {
        if finalizers.is_empty() {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": null},
                   {"op": "add", "path": "/metadata/finalizers", "value": [FINALIZER]}])
        } else {
            json!([{"op": "test", "path": "/metadata/finalizers", "value": finalizers},
                   {"op": "add", "path": "/metadata/finalizers/-", "value": FINALIZER}])
        }
    } else {
        let i = finalizers.iter().position(|f| f == FINALIZER).unwrap_or_default();
        json!([{"op": "test", "path": format!("/metadata/finalizers/{i}"), "value": FINALIZER},
               {"op": "remove", "path": format!("/metadata/finalizers/{i}")}])
    };
    let patch: json_patch::Patch =
        serde_json::from_value(ops).map_err(|source| Error::Serialize { what: "a finalizer patch".into(), source })?;
    let name = o.name();
    match api.patch(&name, &PatchParams::default(), &Patch::Json::<()>(patch)).await {
        Ok(_) => Ok(()),
        // Gone already: nothing to hold.
        Err(e) if !want && not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube(
            if want { "adding the finalizer to" } else { "removing the finalizer from" },
            format!("Module {name}"),
            e,
        )),
    }
}

async fn delete(api: &Api<DynamicObject>, name: &str) -> Result<(), Error> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(Error::kube("delete", format!("Module {name}"), e)),
    }
}

/// The Runtime is gone and its modules with it: the objects let go (finalizers removed) and
/// the CRD deleted, so the cluster no longer shows modules fleetwatch does not manage.
pub(crate) async fn release(known: &Known, key: &str, applier: &Applier) -> Result<(), Error> {
    let api = api(applier);
    match api.list(&ListParams::default()).await {
        Ok(list) => {
            for d in list.items {
                let object = Module { metadata: d.metadata, spec: Default::default(), status: None };
                ensure_finalizer(&api, &Listed { object, invalid: None }, false).await?;
            }
        }
        Err(e) if not_found(&e) => {}
        Err(e) => return Err(Error::kube("list", format!("Module objects of {key}'s cluster"), e)),
    }
    let r = fleetwatch_api::ResourceRef {
        api_version: "apiextensions.k8s.io/v1".into(),
        kind: "CustomResourceDefinition".into(),
        namespace: None,
        name: Module::crd_name().into(),
    };
    applier.delete(&r).await?;
    known.forget(key);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::chosen::{ChosenBy, ModuleState};

    #[test]
    fn a_status_patch_clears_what_the_status_no_longer_says() {
        let full = ChosenModuleStatus {
            state: Some(ModuleState::Ready),
            version: Some("1.0.0".into()),
            desired_version: Some("1.0.0".into()),
            channel: Some("regular".into()),
            source: Some(ChosenBy::User),
            custom_resource_policy: Some(fleetwatch_api::CustomResourcePolicy::Ignore),
            message: "waiting for manager".into(),
            conditions: vec![fleetwatch_api::Condition::default()],
            observed_generation: Some(1),
        };
        let mut keys: Vec<String> = serde_json::to_value(&full).unwrap().as_object().unwrap().keys().cloned().collect();
        let mut fields: Vec<String> = STATUS_FIELDS.iter().map(|f| f.to_string()).collect();
        keys.sort();
        fields.sort();
        assert_eq!(keys, fields, "STATUS_FIELDS names every field of the status");
        let ready = ChosenModuleStatus { state: Some(ModuleState::Ready), ..Default::default() };
        let patch = status_patch(&ready).unwrap();
        assert_eq!(patch["status"]["state"], "Ready");
        assert!(patch["status"]["message"].is_null() && patch["status"].get("message").is_some(), "{patch}");
        let mut previous = serde_json::json!({"status": serde_json::to_value(&full).unwrap()});
        json_patch::merge(&mut previous, &patch);
        assert_eq!(serde_json::from_value::<ChosenModuleStatus>(previous["status"].clone()).unwrap(), ready);
    }
}
