//! Modules chosen in the runtime cluster (issue 46): every move of the seeds' diagram made
//! with kubectl in the runtime cluster, carried by the agent and the hub to the lifecycle
//! operator (its resync is an hour: only events drive it), central precedence, adoption
//! without downgrade, blocked deletion and refusals.

use fleetwatch_api::State;
use fleetwatch_api::chosen::{ChosenBy, Module, ModuleState};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use serde_json::{Value, json};

use crate::lifecycle::{Fleet, Watches, apply_json, module, release_meta, runtime};
use crate::support::*;

fn modules(f: &Fleet) -> Api<Module> {
    Api::all(f.rt.clone())
}

/// A user's `kubectl apply` of a Module in the runtime cluster.
fn choose(f: &Fleet, name: &str, spec: Value) {
    let m = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Module", "metadata": {"name": name}, "spec": spec});
    kubectl(&f.rt_kc, &["apply", "-f", "-"], Some(&m.to_string()));
}

/// A user's `kubectl patch` of a Module's channel.
fn set_channel(f: &Fleet, name: &str, channel: &str) {
    let patch = json!({"spec": {"channel": channel}}).to_string();
    kubectl(&f.rt_kc, &["patch", "module", name, "--type", "merge", "-p", &patch], None);
}

/// Waits until the runtime cluster's Module `name` satisfies `cond`; returns it.
async fn wait_module(f: &Fleet, name: &str, what: &str, cond: impl Fn(&Module) -> bool) -> Module {
    let api = modules(f);
    eventually(format!("Module {name} in the runtime cluster: {what}"))
        .context(|| format!("lifecycle log:\n{}", f.lifecycle.stderr()))
        .until(async || api.get_opt(name).await.ok().flatten(), |m| m.as_ref().is_some_and(&cond))
        .await
        .unwrap_or_else(|| panic!("Module {name} vanished"))
}

async fn wait_gone(f: &Fleet, name: &str) {
    let api = modules(f);
    eventually(format!("Module {name} gone from the runtime cluster"))
        .context(|| format!("lifecycle log:\n{}", f.lifecycle.stderr()))
        .until(async || api.get_opt(name).await.ok().flatten().is_none(), |gone| *gone)
        .await;
}

fn state(m: &Module) -> Option<ModuleState> {
    m.status.as_ref().and_then(|s| s.state)
}

fn condition<'a>(m: &'a Module, type_: &str) -> Option<&'a fleetwatch_api::Condition> {
    m.status.as_ref()?.conditions.iter().find(|c| c.type_ == type_)
}

fn ready_at(m: &Module, version: &str, source: ChosenBy) -> bool {
    let Some(s) = &m.status else { return false };
    s.state == Some(ModuleState::Ready)
        && s.version.as_deref() == Some(version)
        && s.source == Some(source)
        && s.observed_generation == m.metadata.generation
}

async fn fleet_with_an_empty_runtime() -> Fleet {
    let f = Fleet::start_with("3600", None, Watches::ControlPlane).await;
    apply_json(&f.cp_kc, &runtime("rt1", json!([])));
    f.wait("rt1", "reconciled", |s| s.state == Some(State::Ready)).await;
    // The operator installs the Module kind into the runtime cluster.
    eventually("the Module CRD in the runtime cluster")
        .until(async || kubectl_ok(&f.rt_kc, &["get", "crd", "modules.operator.fleetwatch.dev"]), |ok| *ok)
        .await;
    f
}

fn kubectl_ok(kc: &std::path::Path, args: &[&str]) -> bool {
    std::process::Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kc)
        .args(args)
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_user_moves_a_module_through_every_state_from_their_own_cluster() {
    let f = fleet_with_an_empty_runtime().await;

    // Not installed → managed: the user's kubectl apply reaches the operator by event.
    choose(&f, "redis", json!({}));
    let m = wait_module(&f, "redis", "Ready 1.0.0, chosen by the user", |m| ready_at(m, "1.0.0", ChosenBy::User)).await;
    assert!(m.metadata.finalizers.clone().unwrap_or_default().contains(&fleetwatch_api::chosen::FINALIZER.to_string()));
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"));
    let st = f.status("rt1").await.unwrap();
    assert_eq!(module(&st, "redis").and_then(|m| m.source), Some(ChosenBy::User), "{st:?}");
    assert_eq!(m.status.as_ref().unwrap().channel.as_deref(), Some("regular"));
    let accepted = condition(&m, "Accepted").unwrap();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("True", "User"));
    // kubectl get modules lists it with the printer columns.
    let listed = kubectl(&f.rt_kc, &["get", "modules", "-o", "json"], None);
    assert!(listed.contains("\"redis\""), "{listed}");
    let columns = kubectl(
        &f.rt_kc,
        &[
            "get",
            "crd",
            "modules.operator.fleetwatch.dev",
            "-o",
            "jsonpath={.spec.versions[0].additionalPrinterColumns[*].name}",
        ],
        None,
    );
    assert_eq!(columns, "State Version Channel Source Age Message");
    // kubectl describe tells what runs and why.
    let described = kubectl(&f.rt_kc, &["describe", "module", "redis"], None);
    for want in ["Ready", "1.0.0", "regular", "user", "Accepted"] {
        assert!(described.contains(want), "describe lacks {want}:\n{described}");
    }

    // Central configuration applies to a user's module as to a central one.
    apply_json(
        &f.cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleConfigPolicy",
                "metadata": {"name": "redis-tls", "namespace": "kcp"}, "spec": {"module": "redis", "enforce": {"spec": {"tls": true}}}}),
    );
    eventually("the policy enforced on the user's module")
        .context(|| format!("lifecycle log:\n{}", f.lifecycle.stderr()))
        .until(
            async || f.redis_configs().get_opt("default").await.ok().flatten(),
            |c| c.as_ref().is_some_and(|c| c.data["spec"]["tls"] == true),
        )
        .await;

    // Re-channelled by the user: upgraded.
    set_channel(&f, "redis", "fast");
    wait_module(&f, "redis", "Ready 2.0.0 on fast", |m| ready_at(m, "2.0.0", ChosenBy::User)).await;
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"));

    // Managed → not installed with CreateAndDelete: blocked while a managed resource exists.
    let extra = json!({"apiVersion": "example.com/v1", "kind": "RedisConfig", "metadata": {"name": "extra", "namespace": "redis-system"}, "spec": {"size": 2}});
    f.redis_configs().patch("extra", &PatchParams::apply("user"), &Patch::Apply(&extra)).await.unwrap();
    kubectl(&f.rt_kc, &["delete", "module", "redis", "--wait=false"], None);
    let m = wait_module(&f, "redis", "Deleting, blocked by the RedisConfig left", |m| {
        state(m) == Some(ModuleState::Deleting)
            && m.status.as_ref().is_some_and(|s| s.message.contains("1 RedisConfig"))
    })
    .await;
    assert!(m.metadata.deletion_timestamp.is_some());
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"), "the module stays while its resources exist");
    f.redis_configs().delete("extra", &DeleteParams::default()).await.unwrap();
    wait_gone(&f, "redis").await;
    eventually("the module operator deleted").until(async || f.manager_version().await, |v| v.is_none()).await;
    f.wait("rt1", "redis no longer listed", |s| module(s, "redis").is_none()).await;

    // Not installed → managed, then managed → installed with Ignore: left running, unmanaged.
    choose(&f, "redis", json!({"customResourcePolicy": "Ignore"}));
    wait_module(&f, "redis", "Ready 1.0.0 again", |m| ready_at(m, "1.0.0", ChosenBy::User)).await;
    kubectl(&f.rt_kc, &["delete", "module", "redis", "--wait=false"], None);
    wait_gone(&f, "redis").await;
    f.wait("rt1", "redis let go", |s| module(s, "redis").is_none()).await;
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"), "Ignore leaves the module installed");
    assert!(f.redis_configs().get_opt("default").await.unwrap().is_some(), "and its configuration");

    // Installed → managed: chosen again, adopted as it runs.
    choose(&f, "redis", json!({}));
    wait_module(&f, "redis", "adopted, Ready 1.0.0", |m| ready_at(m, "1.0.0", ChosenBy::User)).await;

    // Refusals name what is wrong; nothing is installed for them.
    choose(&f, "istio", json!({}));
    let m = wait_module(&f, "istio", "refused: unknown module", |m| state(m) == Some(ModuleState::Error)).await;
    let accepted = condition(&m, "Accepted").unwrap();
    assert_eq!((accepted.status.as_str(), accepted.reason.as_str()), ("False", "UnknownModule"));
    assert!(m.status.as_ref().unwrap().message.contains("istio"), "{m:?}");
    set_channel(&f, "redis", "nightly");
    let m = wait_module(&f, "redis", "refused: no channel nightly", |m| {
        condition(m, "Accepted").is_some_and(|c| c.reason == "UnknownChannel")
    })
    .await;
    let message = &m.status.as_ref().unwrap().message;
    assert!(message.contains("nightly") && message.contains("fast, regular"), "{message}");
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"), "a refusal never removes what runs");
    // The Runtime narrows what its users may choose: central configuration first.
    let mut rt = runtime("rt1", json!([]));
    rt["spec"]["selfService"] = json!({"modules": ["keda"]});
    apply_json(&f.cp_kc, &rt);
    set_channel(&f, "redis", "regular");
    let m = wait_module(&f, "redis", "refused: not allowed", |m| {
        condition(m, "Accepted").is_some_and(|c| c.reason == "NotAllowed")
    })
    .await;
    assert!(m.status.as_ref().unwrap().message.contains("keda"), "{m:?}");
    // A refused object is deleted at once: nothing waits for it.
    kubectl(&f.rt_kc, &["delete", "module", "istio"], None);
    wait_gone(&f, "istio").await;
    assert_eq!(f.manager_version().await.as_deref(), Some("1.0.0"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn central_listing_wins_and_a_newer_hand_applied_version_is_not_downgraded() {
    let f = fleet_with_an_empty_runtime().await;
    // Installed by hand: redis 2.0.0's objects applied with kubectl, newer than regular's 1.0.0.
    let template = redis_template("kcp", "2.0.0");
    for object in template["spec"]["manifest"].as_array().unwrap() {
        apply_json(&f.rt_kc, object);
    }
    eventually("redis 2.0.0 running")
        .until(async || f.manager_version().await, |v| v.as_deref() == Some("2.0.0"))
        .await;

    // Chosen on regular (1.0.0): adopted, not downgraded; the state says so, naming both.
    choose(&f, "redis", json!({}));
    let m = wait_module(&f, "redis", "Warning: not downgraded", |m| state(m) == Some(ModuleState::Warning)).await;
    let message = &m.status.as_ref().unwrap().message;
    assert!(message.contains("2.0.0") && message.contains("1.0.0"), "{message}");
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"), "downgraded");
    // The channel catches up: Ready.
    apply_json(&f.cp_kc, &release_meta("2.0.0", "2.0.0"));
    wait_module(&f, "redis", "Ready once regular offers 2.0.0", |m| ready_at(m, "2.0.0", ChosenBy::User)).await;

    // The Runtime lists it: central wins (its channel), the user's object says so.
    apply_json(&f.cp_kc, &release_meta("1.0.0", "2.0.0"));
    set_channel(&f, "redis", "regular");
    apply_json(&f.cp_kc, &runtime("rt1", json!([{"name": "redis", "channel": "fast"}])));
    let m = wait_module(&f, "redis", "central, on fast", |m| {
        ready_at(m, "2.0.0", ChosenBy::Central) && m.status.as_ref().unwrap().channel.as_deref() == Some("fast")
    })
    .await;
    assert!(condition(&m, "Accepted").unwrap().message.contains("precedence"), "{m:?}");
    // Deleting it changes nothing: the module stays and the object is put back, saying why.
    kubectl(&f.rt_kc, &["delete", "module", "redis"], None);
    let m =
        wait_module(&f, "redis", "put back", |m| condition(m, "Accepted").is_some_and(|c| c.reason == "PutBack")).await;
    assert_eq!(
        m.metadata.labels.unwrap_or_default().get("operator.fleetwatch.dev/source").map(String::as_str),
        Some("central")
    );
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"));
    // Re-channelling the central object is undone.
    set_channel(&f, "redis", "regular");
    let m = wait_module(&f, "redis", "channel set back to fast", |m| {
        m.spec.channel.as_deref() == Some("fast")
            && m.metadata.generation == m.status.as_ref().and_then(|s| s.observed_generation)
    })
    .await;
    assert_eq!(state(&m), Some(ModuleState::Ready));
    assert_eq!(f.manager_version().await.as_deref(), Some("2.0.0"));
    // No longer listed: the kept object goes with the module (the central policy).
    apply_json(&f.cp_kc, &runtime("rt1", json!([])));
    wait_gone(&f, "redis").await;
    eventually("redis removed by the central policy").until(async || f.manager_version().await, |v| v.is_none()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_clusters_certificate_can_choose_modules_for_that_cluster_only() {
    use fleetwatch_protocol::message::ErrorCode;
    use futures_util::SinkExt;
    let f = fleet_with_an_empty_runtime().await;
    // Another cluster's agent claiming a Module change in rt1 is refused by the hub: an event
    // is bound to the cluster of the certificate that sent it.
    let mut ws = crate::protocol::raw(&f.pki.agent("rt2"), f.hub.port).await.unwrap();
    crate::protocol::welcome(&mut ws, "rt2").await;
    let forged = r#"{"specversion":"1.0","id":"x","source":"x","type":"dev.fleetwatch.object.applied","subject":"operator.fleetwatch.dev/v1alpha1/Module/_/redis","time":"2026-01-01T00:00:00Z","cluster":"rt1","epoch":7,"seq":1,"data":{"generation":1}}"#;
    ws.send(tokio_tungstenite::tungstenite::Message::text(format!(r#"{{"type":"events","events":[{forged}]}}"#)))
        .await
        .unwrap();
    let (code, message, _) = crate::protocol::expect_agent_error(&mut ws).await;
    assert_eq!(code, ErrorCode::IdentityMismatch, "{message}");
    // An event only triggers: what is chosen is read from the cluster itself. A real choice
    // in rt1 afterwards is reconciled, and nothing of the forged one is there.
    choose(&f, "istio", json!({}));
    wait_module(&f, "istio", "refused: unknown module", |m| state(m) == Some(ModuleState::Error)).await;
    assert_eq!(f.manager_version().await, None, "redis installed in rt1 from another cluster's claim");
    assert!(module(&f.status("rt1").await.unwrap(), "redis").is_none());
}
