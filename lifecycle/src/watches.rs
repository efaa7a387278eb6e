//! The WatchConfigs the operator relies on, kept in the control plane by the operator itself,
//! so that what a failing module waits for reaches it as an event, not at its next backoff
//! step ([`crate::retry`]):
//! - `fleetwatch-lifecycle.namespaces`: Namespaces created or deleted (a module whose objects
//!   go into a namespace it does not create);
//! - `fleetwatch-lifecycle.crds`: CustomResourceDefinitions created, established or deleted
//!   (a module whose objects are of a kind another module provides);
//! - `fleetwatch-lifecycle.modules`: the `Module` objects of runtime clusters (a user choosing,
//!   re-channelling or removing a module in their own cluster, [`crate::chosen`]);
//! - `fleetwatch-lifecycle.config.KIND.GROUP`: every module's default configuration kind
//!   (from the ModuleTemplates), unless a WatchConfig of someone else already watches the
//!   kind, so a user's edit of a module's configuration reaches the operator (ModuleConfigPolicy
//!   enforcement) without a hand-written WatchConfig;
//! - `fleetwatch-lifecycle.managed.KIND.GROUP`: the `managedResources` kinds of modules a
//!   ModuleConfigPolicy governs with `applyTo: ManagedResources`, on the same terms.
//!
//! Module managers becoming Ready need nothing here: the agent reports them in its inventory.
//! Every hub event of a cluster triggers its Runtimes ([`crate::triggers`]).
//!
//! The hub must read WatchConfigs from the same control plane (`--control-plane-kubeconfig`)
//! and the agents be allowed to list and watch those kinds (the agent chart's defaults
//! include Namespaces and CRDs); a watch an agent may not run shows as `forbidden`.
//! The ones the operator no longer needs (a module's templates all gone) are deleted; only
//! those labelled [`MANAGED_BY`] `fleetwatch-lifecycle` are ever touched.

use std::collections::BTreeMap;
use std::time::Duration;

use fleetwatch_api::ModuleTemplate;
use fleetwatch_api::config_policy::{ApplyTo, ModuleConfigPolicy};
use fleetwatch_api::watchconfig::{ResourceRef, WatchConfig, WatchConfigSpec};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::reflector::Store;
use tokio_util::sync::CancellationToken;

/// The label saying who keeps a WatchConfig (`app.kubernetes.io/managed-by`).
pub const MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// Its value on the operator's WatchConfigs.
pub const OPERATOR: &str = "fleetwatch-lifecycle";
/// How often the wanted set is compared with what was applied (in memory; the API server is
/// asked only when it differs, and every [`REAPPLY`] in case someone deleted one).
const LOOK: Duration = Duration::from_secs(2);
/// How often every WatchConfig is applied again, whatever changed.
const REAPPLY: Duration = Duration::from_secs(300);

/// The WatchConfigs wanted now: the fixed two, and one per module configuration kind that no
/// other WatchConfig watches, by name.
pub fn wanted(
    templates: &[std::sync::Arc<ModuleTemplate>],
    others: &[WatchConfig],
    policies: &[std::sync::Arc<ModuleConfigPolicy>],
) -> BTreeMap<String, WatchConfig> {
    let mut out = BTreeMap::new();
    let add = |out: &mut BTreeMap<String, WatchConfig>, name: String, resource: ResourceRef, fields: Vec<String>| {
        let mut wc = WatchConfig::new(&name, WatchConfigSpec { resource, fields, ..Default::default() });
        wc.metadata.labels = Some([(MANAGED_BY.to_string(), OPERATOR.to_string())].into());
        out.insert(name, wc);
    };
    add(
        &mut out,
        "fleetwatch-lifecycle.namespaces".into(),
        ResourceRef { group: String::new(), version: "v1".into(), kind: "Namespace".into() },
        // Created and deleted only: the name never changes.
        vec!["/metadata/name".into()],
    );
    add(
        &mut out,
        "fleetwatch-lifecycle.crds".into(),
        ResourceRef {
            group: "apiextensions.k8s.io".into(),
            version: "v1".into(),
            kind: "CustomResourceDefinition".into(),
        },
        // Created, established (its kinds served), deleted.
        vec!["/status/conditions".into()],
    );
    add(
        &mut out,
        "fleetwatch-lifecycle.modules".into(),
        ResourceRef { group: "operator.fleetwatch.dev".into(), version: "v1alpha1".into(), kind: "Module".into() },
        // A user's choice: created, edited (channel, policy), deleted (the deletion starts
        // with the timestamp while the finalizer holds it). Not status: the operator writes it.
        vec!["spec".into(), "metadata.deletionTimestamp".into(), "metadata.labels".into()],
    );
    let covered = |group: &str, kind: &str| {
        others
            .iter()
            .any(|w| !is_ours(w) && w.spec.resource.group == group && w.spec.resource.kind.eq_ignore_ascii_case(kind))
    };
    for t in templates {
        let Some(cfg) = &t.spec.default_config else { continue };
        let (Some(api_version), Some(kind)) = (cfg["apiVersion"].as_str(), cfg["kind"].as_str()) else { continue };
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        if covered(group, kind) {
            continue;
        }
        let name = if group.is_empty() {
            format!("fleetwatch-lifecycle.config.{}", kind.to_ascii_lowercase())
        } else {
            format!("fleetwatch-lifecycle.config.{}.{group}", kind.to_ascii_lowercase())
        };
        // Two templates naming two versions of one kind: the first one kept (one watch per kind).
        if out.contains_key(&name) {
            continue;
        }
        add(
            &mut out,
            name,
            ResourceRef { group: group.into(), version: version.into(), kind: kind.into() },
            config_fields(),
        );
    }
    // Instances of managed resources a policy governs.
    for p in policies.iter().filter(|p| p.spec.apply_to == ApplyTo::ManagedResources) {
        let of_module =
            templates.iter().filter(|t| t.spec.module_name == p.spec.module && t.namespace() == p.namespace());
        for k in of_module.flat_map(|t| &t.spec.managed_resources) {
            if covered(&k.group, &k.kind) {
                continue;
            }
            let name = if k.group.is_empty() {
                format!("fleetwatch-lifecycle.managed.{}", k.kind.to_ascii_lowercase())
            } else {
                format!("fleetwatch-lifecycle.managed.{}.{}", k.kind.to_ascii_lowercase(), k.group)
            };
            if out.contains_key(&name) {
                continue;
            }
            let resource = ResourceRef { group: k.group.clone(), version: k.version.clone(), kind: k.kind.clone() };
            add(&mut out, name, resource, config_fields());
        }
    }
    out
}

/// What counts as a change of a configuration object: what users edit (`spec`, and `data`
/// of ConfigMaps and Secrets), labels and annotations; not `status`, which the module's own
/// operator writes.
fn config_fields() -> Vec<String> {
    ["spec", "data", "binaryData", "metadata.labels", "metadata.annotations"].map(String::from).to_vec()
}

fn is_ours(w: &WatchConfig) -> bool {
    w.metadata.labels.as_ref().and_then(|l| l.get(MANAGED_BY)).is_some_and(|v| v == OPERATOR)
}

/// Keeps the operator's WatchConfigs in the control plane until `shutdown`: applies what is
/// wanted when it changes (and every few minutes), deletes its own that are no longer
/// wanted. Failures are logged and tried again; they cost latency, never correctness (the
/// modules' backoff still retries).
pub async fn keep(
    client: kube::Client,
    templates: Store<ModuleTemplate>,
    policies: Store<ModuleConfigPolicy>,
    shutdown: CancellationToken,
) {
    let api: Api<WatchConfig> = Api::all(client);
    let mut applied: Option<BTreeMap<String, serde_json::Value>> = None;
    let mut last_full = tokio::time::Instant::now();
    let mut said_failure = false;
    loop {
        let result = async {
            let others = api.list(&ListParams::default()).await?.items;
            let mut want = BTreeMap::new();
            for (name, wc) in wanted(&templates.state(), &others, &policies.state()) {
                let mut body = serde_json::to_value(&wc).map_err(kube::Error::SerdeError)?;
                body["apiVersion"] = "operator.fleetwatch.dev/v1alpha1".into();
                body["kind"] = "WatchConfig".into();
                if let Some(o) = body.as_object_mut() {
                    o.remove("status");
                }
                want.insert(name, body);
            }
            if applied.as_ref() == Some(&want) && last_full.elapsed() < REAPPLY {
                return Ok::<_, kube::Error>(());
            }
            for (name, body) in &want {
                api.patch(name, &PatchParams::apply(OPERATOR).force(), &Patch::Apply(body)).await?;
            }
            for old in others.iter().filter(|w| is_ours(w)) {
                let name = old.metadata.name.clone().unwrap_or_default();
                if !want.contains_key(&name) {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => tracing::info!(watchconfig = %name, "deleted a WatchConfig no module needs any more"),
                        Err(kube::Error::Api(s)) if s.code == 404 => {}
                        Err(e) => return Err(e),
                    }
                }
            }
            if applied.as_ref().map(|a| a.keys().collect::<Vec<_>>()) != Some(want.keys().collect()) {
                tracing::info!(watchconfigs = %want.keys().cloned().collect::<Vec<_>>().join(", "),
                    "WatchConfigs the operator relies on are in place");
            }
            applied = Some(want);
            last_full = tokio::time::Instant::now();
            Ok(())
        }
        .await;
        match result {
            Ok(()) => said_failure = false,
            Err(e) => {
                if !said_failure {
                    tracing::warn!(error = %crate::error::plain(&e),
                        "cannot keep the operator's WatchConfigs (Namespaces, CRDs, module configuration kinds); modules waiting for them are retried with backoff only; trying again");
                    said_failure = true;
                }
                applied = None;
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(LOOK) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::ModuleTemplateSpec;
    use serde_json::json;

    #[test]
    fn the_fixed_three_watch_configs_are_always_wanted() {
        use super::wanted;
        let w = wanted(&[], &[], &[]);
        assert_eq!(
            w.keys().collect::<Vec<_>>(),
            ["fleetwatch-lifecycle.crds", "fleetwatch-lifecycle.modules", "fleetwatch-lifecycle.namespaces"]
        );
        assert_eq!(w["fleetwatch-lifecycle.namespaces"].spec.resource.kind, "Namespace");
        let modules = &w["fleetwatch-lifecycle.modules"];
        assert_eq!(
            (modules.spec.resource.group.as_str(), modules.spec.resource.kind.as_str()),
            ("operator.fleetwatch.dev", "Module")
        );
        assert!(modules.to_watch_spec().is_ok(), "{modules:?}");
    }

    fn template(module: &str, cfg: serde_json::Value) -> std::sync::Arc<ModuleTemplate> {
        std::sync::Arc::new(ModuleTemplate::new(
            module,
            ModuleTemplateSpec { module_name: module.into(), default_config: Some(cfg), ..Default::default() },
        ))
    }

    #[test]
    fn managed_resources_are_watched_only_for_modules_a_policy_governs_with_them() {
        use fleetwatch_api::KindRef;
        use fleetwatch_api::config_policy::ModuleConfigPolicySpec;
        let mut t = ModuleTemplateSpec { module_name: "redis".into(), ..Default::default() };
        t.managed_resources =
            vec![KindRef { group: "example.com".into(), version: "v1".into(), kind: "RedisCluster".into() }];
        let mut t = ModuleTemplate::new("redis-1", t);
        t.metadata.namespace = Some("kcp".into());
        let ts = [std::sync::Arc::new(t)];
        let policy = |apply_to| {
            let mut p = ModuleConfigPolicy::new(
                "p",
                ModuleConfigPolicySpec { module: "redis".into(), apply_to, ..Default::default() },
            );
            p.metadata.namespace = Some("kcp".into());
            std::sync::Arc::new(p)
        };
        let name = "fleetwatch-lifecycle.managed.rediscluster.example.com";
        assert!(!wanted(&ts, &[], &[]).contains_key(name));
        assert!(!wanted(&ts, &[], &[policy(ApplyTo::DefaultConfig)]).contains_key(name));
        let w = wanted(&ts, &[], &[policy(ApplyTo::ManagedResources)]);
        assert_eq!(w[name].spec.resource.kind, "RedisCluster");
    }

    #[test]
    fn each_configuration_kind_is_watched_once_unless_someone_else_watches_it() {
        let ts = [
            template("redis", json!({"apiVersion": "modules.example.com/v1", "kind": "RedisConfig"})),
            template("redis2", json!({"apiVersion": "modules.example.com/v1", "kind": "RedisConfig"})),
            template("hello", json!({"apiVersion": "v1", "kind": "ConfigMap"})),
            template("nats", json!({"apiVersion": "modules.example.com/v1", "kind": "NatsConfig"})),
        ];
        let user = WatchConfig::new(
            "nats-config",
            WatchConfigSpec {
                resource: ResourceRef {
                    group: "modules.example.com".into(),
                    version: "v1".into(),
                    kind: "NatsConfig".into(),
                },
                ..Default::default()
            },
        );
        let w = wanted(&ts, &[user], &[]);
        let names: Vec<&str> = w.keys().map(String::as_str).collect();
        assert_eq!(
            names,
            [
                "fleetwatch-lifecycle.config.configmap",
                "fleetwatch-lifecycle.config.redisconfig.modules.example.com",
                "fleetwatch-lifecycle.crds",
                "fleetwatch-lifecycle.modules",
                "fleetwatch-lifecycle.namespaces",
            ]
        );
        for wc in w.values() {
            assert!(is_ours(wc));
            assert!(wc.to_watch_spec().is_ok(), "{wc:?}");
        }
        // Our own WatchConfig of a kind does not count as someone else's.
        let ours = w["fleetwatch-lifecycle.config.redisconfig.modules.example.com"].clone();
        assert!(wanted(&ts, &[ours], &[]).contains_key("fleetwatch-lifecycle.config.redisconfig.modules.example.com"));
    }
}
