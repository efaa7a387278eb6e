//! The `Usable` condition of ModuleTemplates, ModuleReleaseMetas and MaintenancePolicies:
//! what the operator cannot use says so in its own status (not only in the operator's log),
//! and says so no more once it is fixed.
//!
//! The checks are the ones the operator applies when it uses the object (version parsing,
//! [`MaintenancePolicySpec::compile`](fleetwatch_api::maintenance::MaintenancePolicySpec::compile)),
//! run as soon as the object is seen.

use fleetwatch_api::maintenance::MaintenancePolicy;
use fleetwatch_api::{ModuleReleaseMeta, ModuleTemplate};
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::{Resource, ResourceExt};

use crate::tolerant::{Invalid, USABLE};

/// A template is usable when its version parses and it gives its resources exactly one
/// way: inline (`spec.manifest`) or as an OCI artifact pinned by digest
/// (`spec.source.oci.ref`).
pub fn check_template(t: &ModuleTemplate) -> Result<(), String> {
    fleetwatch_api::policy::parse(&t.spec.version).map_err(|e| format!("spec.version: {e}"))?;
    check_source(&t.spec)
}

/// The source half of [`check_template`]: exactly one of `spec.manifest` and
/// `spec.source.oci`, and a ref with a digest.
pub fn check_source(spec: &fleetwatch_api::ModuleTemplateSpec) -> Result<(), String> {
    match (spec.manifest.is_empty(), spec.oci()) {
        (false, Some(_)) => Err("spec.manifest and spec.source.oci are both given: a template gives its resources \
             inline or as an OCI artifact, not both"
            .into()),
        (true, None) if spec.source.is_some() => Err("spec.source has no oci: give spec.source.oci.ref".into()),
        (true, None) => Err("neither spec.manifest nor spec.source.oci.ref is given: a template needs its resources \
             inline or as an OCI artifact"
            .into()),
        (true, Some(oci)) => crate::artifact::registry::parse_pinned(&oci.reference)
            .map(|_| ())
            .map_err(|e| format!("spec.source.oci.ref: {e}")),
        (false, None) => Ok(()),
    }
}

/// A release meta is usable when every version it offers (channels, mandatory) parses.
pub fn check_meta(m: &ModuleReleaseMeta) -> Result<(), String> {
    for (i, c) in m.spec.channels.iter().enumerate() {
        fleetwatch_api::policy::parse(&c.version).map_err(|e| format!("spec.channels[{i}].version: {e}"))?;
    }
    if let Some(v) = &m.spec.mandatory {
        fleetwatch_api::policy::parse(v).map_err(|e| format!("spec.mandatory: {e}"))?;
    }
    Ok(())
}

/// A policy is usable when it compiles (regular expressions, days and times).
pub fn check_policy(p: &MaintenancePolicy) -> Result<(), String> {
    p.spec.compile().map(|_| ()).map_err(|e| e.to_string())
}

/// The status patch for one report: the `Usable` condition, `False` with reason
/// `InvalidSpec` and the error, or `True` with reason `Valid`.
pub fn condition_patch(error: Option<&str>, now: &str) -> serde_json::Value {
    let (status, reason, message) = usable(error.map(|e| ("InvalidSpec", e)));
    patch(status, reason, &message, now)
}

/// The `Usable` condition's status, reason and message: `False` with `reason` and the error,
/// or `True`.
fn usable(error: Option<(&'static str, &str)>) -> (&'static str, &'static str, String) {
    match error {
        Some((reason, e)) => ("False", reason, format!("the operator cannot use this object: {e}")),
        None => ("True", "Valid", "the operator can use this object".to_string()),
    }
}

fn patch(status: &str, reason: &str, message: &str, now: &str) -> serde_json::Value {
    serde_json::json!({"status": {"conditions": [{
        "type": USABLE, "status": status, "reason": reason, "message": message, "lastTransitionTime": now,
    }]}})
}

/// Starts [`report`] for `K`; the sender is for [`crate::tolerant::watch_checked`]. Bounded:
/// a report that does not fit is dropped (logged by the watch), never the watch.
pub fn reporter<K: Resource<DynamicType = ()> + 'static>(client: &kube::Client) -> tokio::sync::mpsc::Sender<Invalid> {
    let (tx, rx) = tokio::sync::mpsc::channel(256);
    tokio::spawn(report::<K>(client.clone(), rx));
    tx
}

/// Writes each report about a `K` into that object's status, as a merge patch of the
/// `Usable` condition (the only condition these kinds have). A failed write is logged: the
/// next change of the object reports it again.
pub async fn report<K: Resource<DynamicType = ()>>(client: kube::Client, mut rx: tokio::sync::mpsc::Receiver<Invalid>) {
    let ar = kube::core::ApiResource::erase::<K>(&());
    while let Some(r) = rx.recv().await {
        let Some(ns) = r.namespace.as_deref() else { continue };
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), ns, &ar);
        let patch = condition_patch(r.error.as_deref(), &jiff::Timestamp::now().to_string());
        match api.patch_status(&r.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
            Ok(_) => tracing::debug!(kind = %ar.kind, object = %r.key, usable = r.error.is_none(), "wrote Usable"),
            Err(e) => {
                tracing::warn!(kind = %ar.kind, object = %r.key, error = %e, "cannot write the Usable condition")
            }
        }
    }
}

/// The `Usable=False` reason of a template whose requirements cannot be met.
pub const UNMET_REQUIREMENTS: &str = "UnmetRequirements";

/// Keeps the `Usable` condition of templates with requirements ([`crate::requires::judge`]:
/// a cycle, a range no channel satisfies) until `shutdown`. Those need the other templates and
/// the release metas, so they are judged from the stores every few seconds, not as each
/// template is seen; a template's condition is written only when it says otherwise.
pub async fn keep_requirements(
    client: kube::Client,
    templates: kube::runtime::reflector::Store<ModuleTemplate>,
    metas: kube::runtime::reflector::Store<ModuleReleaseMeta>,
    shutdown: tokio_util::sync::CancellationToken,
) {
    loop {
        let all = templates.state();
        let metas_now = metas.state();
        for t in &all {
            let shown = t.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == USABLE));
            let about_requires = shown.is_some_and(|c| c.message.contains("spec.requires"));
            if t.spec.requires.is_empty() && !about_requires {
                continue;
            }
            // A template that fails its own checks is the per-object reporter's.
            if check_template(t).is_err() {
                continue;
            }
            let verdict = crate::requires::judge(t, &all, &metas_now);
            let (status, reason, message) = usable(verdict.as_ref().err().map(|e| (UNMET_REQUIREMENTS, e.as_str())));
            if shown.is_some_and(|c| c.status == status && c.message == message) {
                continue;
            }
            let Some(ns) = t.namespace() else { continue };
            let api: Api<ModuleTemplate> = Api::namespaced(client.clone(), &ns);
            let patch = patch(status, reason, &message, &jiff::Timestamp::now().to_string());
            match api.patch_status(&t.name_any(), &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => tracing::info!(template = %format!("{ns}/{}", t.name_any()), usable = verdict.is_ok(),
                    reason = %verdict.err().unwrap_or_default(), "judged the template's requirements"),
                Err(e) => tracing::warn!(template = %t.name_any(), error = %crate::error::plain(&e),
                    "cannot write the Usable condition"),
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(std::time::Duration::from_secs(2)) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inline() -> Vec<serde_json::Value> {
        vec![serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "redis"}})]
    }

    #[test]
    fn a_template_gives_its_resources_exactly_one_way_and_pinned() {
        use fleetwatch_api::{ModuleSource, OciSource};
        let mut t = ModuleTemplate::new("redis-1", Default::default());
        t.spec.version = "1.0.0".into();
        let e = check_template(&t).unwrap_err();
        assert!(e.starts_with("neither spec.manifest nor spec.source.oci.ref is given"), "{e}");
        let digest = format!("sha256:{}", "a".repeat(64));
        let oci = |r: &str| Some(ModuleSource { oci: Some(OciSource { reference: r.into(), pull_secret: None }) });
        t.spec.source = oci(&format!("reg.example/mods/redis@{digest}"));
        assert_eq!(check_template(&t), Ok(()));
        t.spec.manifest = inline();
        let e = check_template(&t).unwrap_err();
        assert!(e.starts_with("spec.manifest and spec.source.oci are both given"), "{e}");
        t.spec.manifest.clear();
        t.spec.source = oci("reg.example/mods/redis:1.0.0");
        let e = check_template(&t).unwrap_err();
        assert!(e.starts_with("spec.source.oci.ref: reg.example/mods/redis:1.0.0 has no digest"), "{e}");
        t.spec.source = Some(ModuleSource { oci: None });
        assert!(check_template(&t).unwrap_err().contains("spec.source has no oci"));
    }

    #[test]
    fn a_template_with_a_bad_version_is_not_usable() {
        let mut t = ModuleTemplate::new("redis-1", Default::default());
        t.spec.manifest = inline();
        t.spec.version = "1.0.0".into();
        assert_eq!(check_template(&t), Ok(()));
        t.spec.version = "one".into();
        let e = check_template(&t).unwrap_err();
        assert!(e.starts_with("spec.version: ") && e.contains("one"), "{e}");
    }

    #[test]
    fn a_meta_names_the_channel_whose_version_does_not_parse() {
        let mut m = ModuleReleaseMeta::new("redis", Default::default());
        m.spec.channels.push(fleetwatch_api::ChannelVersion { channel: "regular".into(), version: "1.0.0".into() });
        assert_eq!(check_meta(&m), Ok(()));
        m.spec.channels.push(fleetwatch_api::ChannelVersion { channel: "fast".into(), version: "latest".into() });
        let e = check_meta(&m).unwrap_err();
        assert!(e.starts_with("spec.channels[1].version: ") && e.contains("latest"), "{e}");
        m.spec.channels.pop();
        m.spec.mandatory = Some("x".into());
        assert!(check_meta(&m).unwrap_err().starts_with("spec.mandatory: "));
    }

    #[test]
    fn a_policy_whose_window_does_not_parse_is_not_usable() {
        let spec = fleetwatch_api::maintenance::MaintenancePolicySpec::from_json(
            r#"{"default": {"days": ["Sat"], "begin": "01:00:00Z", "end": "03:00:00Z"}}"#,
        )
        .unwrap();
        let mut p = MaintenancePolicy::new("default", spec);
        assert_eq!(check_policy(&p), Ok(()));
        p.spec.default.as_mut().unwrap().days = vec!["Saturday".into()];
        let e = check_policy(&p).unwrap_err();
        assert!(e.contains(r#"unknown day "Saturday" in default.days"#), "{e}");
    }

    #[test]
    fn the_patch_says_why_or_that_it_is_valid_again() {
        let bad = condition_patch(Some("spec.version: bad"), "t");
        let c = &bad["status"]["conditions"][0];
        assert_eq!(
            (c["type"].as_str(), c["status"].as_str(), c["reason"].as_str()),
            (Some("Usable"), Some("False"), Some("InvalidSpec"))
        );
        assert!(c["message"].as_str().unwrap().ends_with("spec.version: bad"));
        let good = condition_patch(None, "t");
        let c = &good["status"]["conditions"][0];
        assert_eq!((c["status"].as_str(), c["reason"].as_str()), (Some("True"), Some("Valid")));
    }
}
