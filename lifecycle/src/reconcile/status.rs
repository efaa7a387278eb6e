//! What a reconcile writes back: the status subresource (retried on conflict), the
//! module Events for the transitions it made, and the rollout records of the release metas.

use super::*;

/// Publishes an Event on the Runtime for each module transition. Best effort: a failure
/// to publish is logged and never fails the reconcile.
///
/// The transitions are taken against the status as the API server has it: the cached
/// Runtime can predate the status the previous reconcile wrote (its watch event not in yet),
/// and counting from it reported every install twice (issue 27: "count 2"). Only a
/// reconcile that seems to have transitions pays for the read.
pub(super) async fn publish_events(ctx: &Ctx, rt: &Runtime, previous: &[ModuleStatus], next: &[ModuleStatus]) {
    let mut events = crate::events::transitions(previous, next);
    if events.is_empty() {
        return;
    }
    let ns = rt.namespace().unwrap_or_else(|| "default".into());
    let api: Api<Runtime> = Api::namespaced(ctx.client.clone(), &ns);
    match api.get_status(&rt.name_any()).await {
        Ok(fresh) => {
            let stored = fresh.status.map(|s| s.modules).unwrap_or_default();
            events = crate::events::transitions(&stored, next);
        }
        Err(e) => tracing::debug!(error = %e, "cannot read the Runtime's current status; Events from the cached one"),
    }
    let reference = rt.object_ref(&());
    for ev in events {
        if let Err(e) = ctx.recorder.publish(&ev, &reference).await {
            tracing::debug!(reason = %ev.reason, module = %ev.module, error = %e, "cannot publish an Event");
        }
    }
}

/// Publishes one Normal Event of `module` on the Runtime (best effort, like
/// [`publish_events`]).
pub(super) async fn publish_note(ctx: &Ctx, rt: &Runtime, module: &str, reason: &str, note: String) {
    let ev = crate::events::event(crate::events::EventType::Normal, reason, "Certificate", module, note);
    if let Err(e) = ctx.recorder.publish(&ev, &rt.object_ref(&())).await {
        tracing::debug!(%reason, error = %e, "cannot publish an Event");
    }
}

/// This version's rollout as the release meta's status records it.
pub(super) fn recorded_rollout<'a>(
    meta: &'a ModuleReleaseMeta,
    version: &semver::Version,
) -> Option<&'a RolloutStatus> {
    let version = version.to_string();
    meta.status.as_ref()?.rollouts.iter().find(|r| r.version == version)
}

/// How often an admission or a progress write is tried again after losing a race.
pub(super) const STATUS_WRITE_ATTEMPTS: usize = 8;

/// One runtime's upgrade asking a paced rollout for admission.
#[derive(Clone, Copy)]
pub(super) struct Admission<'a> {
    /// The namespace of the Runtime and the release meta.
    pub(super) ns: &'a str,
    /// The module upgrading.
    pub(super) module: &'a str,
    /// The version it upgrades to.
    pub(super) version: &'a semver::Version,
    /// The release meta's rollout policy.
    pub(super) policy: &'a fleetwatch_api::RolloutPolicy,
    /// The Runtime upgrading.
    pub(super) rt: &'a Runtime,
    /// How many runtimes the channel move affects ([`crate::plan::rollout_total`]).
    pub(super) total: u32,
}

/// Whether the admission's runtime may upgrade its module to the version now, decided on the status as it is
/// in the API server and recorded there before the answer is `Go`.
///
/// Several instances (shards) admit runtimes of one rollout: each reads the
/// ModuleReleaseMeta, decides on what it records (plus what this instance learnt), and
/// writes the admission with the resourceVersion it read. A concurrent admission makes the
/// write fail with 409; the admission is taken back and decided again on the newer status,
/// so two instances never admit beyond `maxInFlight` together.
pub(super) async fn admit_recorded(ctx: &Ctx, admission: &Admission<'_>) -> crate::rollout::UpgradeGate {
    let Admission { ns, module, version, policy, rt, total } = *admission;
    let of = crate::rollout::RolloutOf { ns, module, version };
    use crate::rollout::UpgradeGate;
    let Some(meta_name) = find_meta(&ctx.metas.state(), ns, module).map(|m| m.name_any()) else {
        return UpgradeGate::Wait(format!("rollout of {module} {version}: no ModuleReleaseMeta"));
    };
    let name = rt.name_any();
    let api: Api<ModuleReleaseMeta> = Api::namespaced(ctx.client.clone(), ns);
    let _one_at_a_time = ctx.rollouts.writing().await;
    for _ in 0..STATUS_WRITE_ATTEMPTS {
        let mut meta = match api.get(&meta_name).await {
            Ok(m) => m,
            Err(e) => {
                let e = crate::error::plain(&e);
                return UpgradeGate::Wait(format!("waiting to read the rollout of {module} {version}: {e}"));
            }
        };
        let recorded = recorded_rollout(&meta, version);
        let already = recorded.is_some_and(|r| r.admitted_runtimes.contains(&name));
        let admission = ctx.rollouts.admit(of, policy, rt, total, recorded);
        if already || matches!(admission, UpgradeGate::Wait(_)) {
            return admission;
        }
        let statuses =
            ctx.rollouts.merged(ns, module, &meta.status.as_ref().map(|s| s.rollouts.clone()).unwrap_or_default());
        meta.status.get_or_insert_with(Default::default).rollouts = statuses;
        match api.replace_status(&meta_name, &PostParams::default(), &meta).await {
            Ok(_) => return UpgradeGate::Go,
            Err(kube::Error::Api(s)) if s.code == 409 => {
                ctx.rollouts.retract(of, &name);
            }
            Err(e) => {
                ctx.rollouts.retract(of, &name);
                let e = crate::error::plain(&e);
                return UpgradeGate::Wait(format!(
                    "waiting to record the rollout admission of {module} {version}: {e}"
                ));
            }
        }
    }
    UpgradeGate::Wait(format!("waiting to record the rollout admission of {module} {version}: concurrent writes"))
}

/// Writes changed rollout progress into the ModuleReleaseMetas' status, one write at a time
/// per instance, each a read-merge-write guarded by the resourceVersion read (another
/// instance's admissions and results are kept, never overwritten). `false` when a write
/// failed; what it carried is written again with the next one.
pub(super) async fn write_rollouts(ctx: &Ctx) -> bool {
    let _one_at_a_time = ctx.rollouts.writing().await;
    let mut ok = true;
    for (ns, module) in ctx.rollouts.take_changed_modules() {
        let Some(name) = find_meta(&ctx.metas.state(), &ns, &module).map(|m| m.name_any()) else { continue };
        let api: Api<ModuleReleaseMeta> = Api::namespaced(ctx.client.clone(), &ns);
        let mut written = false;
        for _ in 0..STATUS_WRITE_ATTEMPTS {
            let mut meta = match api.get(&name).await {
                Ok(m) => m,
                Err(e) => {
                    tracing::warn!(%module, error = %e, "cannot read the rollout status");
                    break;
                }
            };
            let recorded = meta.status.as_ref().map(|s| s.rollouts.clone()).unwrap_or_default();
            let statuses = ctx.rollouts.merged(&ns, &module, &recorded);
            if statuses == recorded {
                written = true;
                break;
            }
            meta.status.get_or_insert_with(Default::default).rollouts = statuses;
            match api.replace_status(&name, &PostParams::default(), &meta).await {
                Ok(_) => {
                    written = true;
                    break;
                }
                Err(kube::Error::Api(s)) if s.code == 409 => continue,
                Err(e) => {
                    tracing::warn!(%module, error = %e, "cannot write rollout status");
                    break;
                }
            }
        }
        if !written {
            ctx.rollouts.mark_changed(&ns, &module);
            ok = false;
        }
    }
    ok
}

/// Writes status: modules, the runtime's state (the worst module state; Unmanaged counts as
/// fine) and the Ready condition.
pub(super) async fn write_status(api: &Api<Runtime>, rt: &Runtime, modules: Vec<ModuleStatus>) -> Result<(), Error> {
    let state = modules
        .iter()
        .map(|m| if m.state == State::Unmanaged { State::Ready } else { m.state })
        .max()
        .unwrap_or(State::Ready);
    let now = jiff::Timestamp::now().to_string();
    let ready = state == State::Ready;
    let prev_cond = rt.status.as_ref().and_then(|s| s.conditions.iter().find(|c| c.type_ == "Ready"));
    let status_str = if ready { "True" } else { "False" };
    let since = match prev_cond {
        Some(c) if c.status == status_str => c.last_transition_time.clone(),
        _ => Some(now.clone()),
    };
    let not_ready: Vec<String> = modules
        .iter()
        .filter(|m| !matches!(m.state, State::Ready | State::Unmanaged))
        .map(|m| {
            if m.message.is_empty() {
                format!("{}: {:?}", m.name, m.state)
            } else {
                format!("{}: {:?}: {}", m.name, m.state, m.message)
            }
        })
        .collect();
    let counted = modules.iter().filter(|m| m.state != State::Unmanaged).count();
    let message = if not_ready.is_empty() {
        format!("{counted}/{counted} modules ready")
    } else {
        format!("{}/{counted} modules ready; {}", counted - not_ready.len(), not_ready.join("; "))
    };
    let status = RuntimeStatus {
        modules_ready: Some(format!("{}/{counted}", counted - not_ready.len())),
        state: Some(state),
        modules,
        observed_generation: rt.metadata.generation,
        last_reconcile: Some(now),
        conditions: vec![fleetwatch_api::Condition {
            type_: "Ready".into(),
            status: status_str.into(),
            reason: format!("{state:?}"),
            message,
            last_transition_time: since,
        }],
    };
    api.patch_status(&rt.name_any(), &PatchParams::default(), &Patch::Merge(&json!({ "status": status })))
        .await
        .map_err(|e| {
            Error::kube(
                "writing the status of",
                format!("Runtime {}/{}", rt.namespace().unwrap_or_default(), rt.name_any()),
                e,
            )
        })?;
    Ok(())
}
