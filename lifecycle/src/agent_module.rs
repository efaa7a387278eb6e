//! The agent as a module, with its certificate issued and rotated by the operator.
//!
//! Why here: registering a runtime cluster should be one Runtime and its kubeconfig
//! Secret. With [`AgentCerts`] configured (`fleetwatch lifecycle --agent-ca-secret`),
//! every Runtime gets the module `MODULE` as if its spec listed it (installed through the
//! same ModuleTemplate / ModuleReleaseMeta path as any module), and the operator writes
//! into the runtime cluster the Secret the agent's Deployment mounts (its namespace and name
//! come from the manifest: [`layout`]): `tls.crt` (identity `spiffe://<trust-domain>/cluster/<clusterId>`,
//! clientAuth), `tls.key` and `ca.crt` (the CA bundle the agent trusts for the hub).
//!
//! Rotation without a gap: a certificate is renewed once two thirds of its lifetime have
//! passed (`not_after - lifetime / 3`), so the new one is in the Secret a third of the
//! lifetime before the old one expires; the reconcile is requeued for that moment. The
//! agent reads its files every few seconds and reconnects with a renewed certificate,
//! keeping its outbox ([`fleetwatch_agent`'s uplink]). A certificate from another CA, for
//! another identity, or unreadable is replaced at once.
//!
//! The agent's manifests have one source, `deploy/manifests/agent.yaml` (the agent Helm
//! chart rendered with default values), wrapped into a ModuleTemplate by [`render`] (and
//! `fleetwatch agent-module`), which sets the hub address, image and version label.
//!
//! [`fleetwatch_agent`'s uplink]: https://docs.rs/fleetwatch-agent

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_api::{ModuleEntry, Runtime};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

use crate::Error;
use crate::applier::Applier;

/// The module name of the agent.
pub(crate) const MODULE: &str = "fleetwatch-agent";
/// The name of the agent's Deployment (the module's manager workload).
pub(crate) const DEPLOYMENT: &str = "fleetwatch-agent";
/// The agent's manifests (one source; see the module docs).
const MANIFEST: &str = include_str!("../../deploy/manifests/agent.yaml");
/// The manifest file, for messages.
const MANIFEST_PATH: &str = "deploy/manifests/agent.yaml";
/// The field manager of the certificate Secret.
const FIELD_MANAGER: &str = "fleetwatch-lifecycle-certs";
/// Annotations on the certificate Secret: what is in it, and when it is renewed.
const ANNOTATION_SERIAL: &str = "operator.fleetwatch.dev/serial";
const ANNOTATION_NOT_AFTER: &str = "operator.fleetwatch.dev/not-after";
const ANNOTATION_RENEW_AT: &str = "operator.fleetwatch.dev/renew-at";
const ANNOTATION_ISSUER: &str = "operator.fleetwatch.dev/issuer";

/// Issuing agent certificates: where the CA is and how long certificates live.
#[derive(Debug, Clone)]
pub struct AgentCerts {
    /// The control-plane Secret holding the CA: `ca.crt` and `ca.key` (or `tls.crt` and
    /// `tls.key`), optionally `hub-ca.crt`, the bundle agents trust for the hub (default:
    /// the CA's own certificate).
    pub ca_secret_namespace: String,
    /// Its name.
    pub ca_secret_name: String,
    /// How long an agent certificate is valid; renewed after two thirds of it.
    pub lifetime: Duration,
    /// Where the agent's manifest expects its certificate.
    pub layout: Layout,
}

/// Where the agent runs and reads its certificate, as its manifest says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// The agent Deployment's namespace in each runtime cluster.
    pub namespace: String,
    /// The Secret its pod mounts (`tls.crt`, `tls.key`, `ca.crt`).
    pub secret: String,
}

/// The agent's namespace and certificate Secret, from the manifest's Deployment.
pub fn layout() -> Result<Layout, RenderError> {
    let objects = manifest_objects()?;
    let d = agent_deployment(&objects)?;
    let namespace = d["metadata"]["namespace"]
        .as_str()
        .ok_or_else(|| RenderError::Shape(format!("the Deployment {DEPLOYMENT} has no namespace")))?;
    let secret = d["spec"]["template"]["spec"]["volumes"]
        .as_array()
        .into_iter()
        .flatten()
        .find_map(|v| v["secret"]["secretName"].as_str())
        .ok_or_else(|| RenderError::Shape(format!("the Deployment {DEPLOYMENT} mounts no Secret")))?;
    Ok(Layout { namespace: namespace.into(), secret: secret.into() })
}

fn agent_deployment(objects: &[Value]) -> Result<&Value, RenderError> {
    objects
        .iter()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == DEPLOYMENT)
        .ok_or_else(|| RenderError::Shape(format!("no Deployment named {DEPLOYMENT}")))
}

impl AgentCerts {
    /// Parses `NAMESPACE/NAME`.
    pub fn new(ca_secret: &str, lifetime: Duration) -> Result<Self, String> {
        let (ns, name) = ca_secret
            .split_once('/')
            .filter(|(ns, name)| !ns.is_empty() && !name.is_empty() && !name.contains('/'))
            .ok_or_else(|| format!("{ca_secret:?} is not NAMESPACE/NAME"))?;
        if lifetime < Duration::from_secs(3) {
            return Err("the certificate lifetime must be at least 3 seconds".into());
        }
        let layout = layout().map_err(|e| e.to_string())?;
        Ok(Self { ca_secret_namespace: ns.into(), ca_secret_name: name.into(), lifetime, layout })
    }

    fn ca_secret(&self) -> String {
        format!("{}/{}", self.ca_secret_namespace, self.ca_secret_name)
    }

    /// When a certificate valid until `not_after` is renewed: a third of the lifetime
    /// before it expires.
    pub fn renew_at(&self, not_after: jiff::Timestamp) -> jiff::Timestamp {
        let third = jiff::SignedDuration::try_from(self.lifetime / 3).unwrap_or(jiff::SignedDuration::ZERO);
        not_after.checked_sub(third).unwrap_or(not_after)
    }
}

/// The Runtime as the operator reconciles it: with the agent module listed when agents are
/// installed and its spec does not name it already (then the spec's entry wins: it may pin
/// a version, choose a channel or unmanage it).
pub(crate) fn with_agent_module(rt: Arc<Runtime>) -> Arc<Runtime> {
    if rt.spec.modules.iter().any(|m| m.name == MODULE) {
        return rt;
    }
    let mut rt = (*rt).clone();
    rt.spec.modules.push(ModuleEntry { name: MODULE.into(), ..ModuleEntry::default() });
    Arc::new(rt)
}

/// What [`ensure_certificate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CertState {
    /// Serial of the certificate in the Secret now.
    pub serial: String,
    /// Whether it was issued by this call.
    pub issued: bool,
    /// How long until it must be renewed.
    pub renew_in: Duration,
}

/// A certificate problem, said for the agent module's status.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CertFailure {
    /// The CA Secret is missing or unusable.
    #[error("agent CA Secret {secret}: {what}")]
    Ca {
        /// `namespace/name`.
        secret: String,
        /// What is wrong.
        what: String,
    },
    /// Issuing failed.
    #[error("issuing the agent certificate: {0}")]
    Issue(#[from] fleetwatch_certs::CertError),
    /// Reading or writing the Secret in the runtime cluster failed.
    #[error(transparent)]
    Kube(#[from] Error),
}

fn secret_bytes(secret: &Secret, key: &str) -> Option<String> {
    let from_data = secret.data.as_ref().and_then(|d| d.get(key)).map(|b| b.0.clone());
    let from_string = secret.string_data.as_ref().and_then(|d| d.get(key)).map(|s| s.clone().into_bytes());
    from_data.or(from_string).and_then(|b| String::from_utf8(b).ok())
}

/// The CA from the control plane: (issuer, its certificate PEM, the hub bundle for agents).
async fn load_ca(
    control_plane: &kube::Client,
    cfg: &AgentCerts,
) -> Result<(fleetwatch_certs::Authority, String, String), CertFailure> {
    let api: Api<Secret> = Api::namespaced(control_plane.clone(), &cfg.ca_secret_namespace);
    let fail = |what: String| CertFailure::Ca { secret: cfg.ca_secret(), what };
    let secret = api
        .get_opt(&cfg.ca_secret_name)
        .await
        .map_err(|e| fail(format!("cannot read it: {}", crate::error::plain(&e))))?
        .ok_or_else(|| fail("not found".into()))?;
    let (cert, key) = match (secret_bytes(&secret, "ca.crt"), secret_bytes(&secret, "ca.key")) {
        (Some(c), Some(k)) => (c, k),
        _ => match (secret_bytes(&secret, "tls.crt"), secret_bytes(&secret, "tls.key")) {
            (Some(c), Some(k)) => (c, k),
            _ => return Err(fail("needs ca.crt and ca.key (or tls.crt and tls.key)".into())),
        },
    };
    let authority =
        fleetwatch_certs::Authority::from_pem(&cert, &key, &cfg.ca_secret()).map_err(|e| fail(e.to_string()))?;
    let bundle = secret_bytes(&secret, "hub-ca.crt").unwrap_or_else(|| cert.clone());
    Ok((authority, cert, bundle))
}

/// A short, stable fingerprint of the issuing CA's certificate (FNV-1a, hex).
fn issuer_fingerprint(ca_pem: &str) -> String {
    format!("{:016x}", crate::shards::fnv1a64(ca_pem.trim().as_bytes()))
}

/// Makes sure the runtime cluster holds a current agent certificate for `rt`: issues and
/// writes one when there is none, it is unreadable, names another identity, comes from
/// another CA, carries another CA bundle, or has reached its renewal time.
pub(crate) async fn ensure_certificate(
    control_plane: &kube::Client,
    cfg: &AgentCerts,
    rt: &Runtime,
    applier: &Applier,
) -> Result<CertState, CertFailure> {
    let (authority, ca_pem, bundle) = load_ca(control_plane, cfg).await?;
    let cluster = rt.cluster_id();
    let want = fleetwatch_protocol::identity::Identity::cluster(authority.trust_domain(), &cluster)
        .map_err(|e| CertFailure::Issue(e.into()))?;
    let issuer = issuer_fingerprint(&ca_pem);
    let (namespace, name) = (cfg.layout.namespace.as_str(), cfg.layout.secret.as_str());
    let api: Api<Secret> = Api::namespaced(applier.client().clone(), namespace);
    let object = format!("Secret {namespace}/{name}");
    let existing =
        api.get_opt(name).await.map_err(|source| Error::Kube { action: "reading", object: object.clone(), source })?;
    let now = jiff::Timestamp::now();
    if let Some(secret) = &existing
        && let Some(reason) = current(secret, &want, &issuer, &bundle, cfg, now)
    {
        return Ok(reason);
    }
    if existing.is_none() {
        // The module's manifest creates the namespace too; the Secret must not wait for it.
        let ns_api: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(applier.client().clone());
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
        ns_api
            .patch(namespace, &PatchParams::apply(FIELD_MANAGER), &Patch::Apply(&ns))
            .await
            .map_err(|source| Error::Kube { action: "creating", object: format!("Namespace {namespace}"), source })?;
    }
    let (cert_pem, key_pem, _) =
        authority.issue_pem_for(&fleetwatch_certs::LeafSpec::Agent { cluster: cluster.clone() }, cfg.lifetime)?;
    let info = fleetwatch_certs::inspect_pem(&cert_pem, std::path::Path::new("issued certificate"))?;
    let renew_at = cfg.renew_at(info.not_after);
    let data: std::collections::BTreeMap<String, ByteString> =
        [("tls.crt", cert_pem.into_bytes()), ("tls.key", key_pem.into_bytes()), ("ca.crt", bundle.into_bytes())]
            .into_iter()
            .map(|(k, v)| (k.to_string(), ByteString(v)))
            .collect();
    let secret = json!({
        "apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
        "metadata": {
            "name": name, "namespace": namespace,
            "labels": {"app.kubernetes.io/managed-by": "fleetwatch-lifecycle", "operator.fleetwatch.dev/module": MODULE},
            "annotations": {
                ANNOTATION_SERIAL: info.serial,
                ANNOTATION_NOT_AFTER: info.not_after.to_string(),
                ANNOTATION_RENEW_AT: renew_at.to_string(),
                ANNOTATION_ISSUER: issuer,
            },
        },
        "data": data,
    });
    api.patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&secret))
        .await
        .map_err(|source| Error::Kube { action: "writing", object, source })?;
    let previous = existing
        .as_ref()
        .and_then(|s| secret_bytes(s, "tls.crt"))
        .and_then(|pem| fleetwatch_certs::inspect_pem(&pem, std::path::Path::new(name)).ok().map(|i| i.serial));
    tracing::info!(
        cluster = %cluster,
        serial = %info.serial,
        previous = previous.as_deref().unwrap_or("-"),
        not_after = %info.not_after,
        %renew_at,
        "agent certificate written"
    );
    Ok(CertState { serial: info.serial, issued: true, renew_in: until(now, renew_at) })
}

/// `Some` (nothing to do until the returned renewal) when the Secret holds a certificate
/// for `want` from the CA `issuer`, with `bundle`, before its renewal time.
fn current(
    secret: &Secret,
    want: &fleetwatch_protocol::identity::Identity,
    issuer: &str,
    bundle: &str,
    cfg: &AgentCerts,
    now: jiff::Timestamp,
) -> Option<CertState> {
    let annotations = secret.metadata.annotations.as_ref()?;
    if annotations.get(ANNOTATION_ISSUER).map(String::as_str) != Some(issuer) {
        return None;
    }
    if secret_bytes(secret, "ca.crt").as_deref() != Some(bundle) || secret_bytes(secret, "tls.key").is_none() {
        return None;
    }
    let pem = secret_bytes(secret, "tls.crt")?;
    let info = fleetwatch_certs::inspect_pem(&pem, std::path::Path::new("tls.crt")).ok()?;
    if info.identity.as_ref() != Some(want) {
        return None;
    }
    let renew_at = cfg.renew_at(info.not_after);
    (now < renew_at).then(|| CertState { serial: info.serial, issued: false, renew_in: until(now, renew_at) })
}

fn until(now: jiff::Timestamp, then: jiff::Timestamp) -> Duration {
    Duration::try_from(then.duration_since(now)).unwrap_or(Duration::ZERO).max(Duration::from_millis(500))
}

/// Deletes the certificate Secret (the Runtime is going away); a missing one is fine.
pub(crate) async fn remove_certificate(cfg: &AgentCerts, applier: &Applier) -> Result<(), Error> {
    let Layout { namespace, secret } = &cfg.layout;
    let api: Api<Secret> = Api::namespaced(applier.client().clone(), namespace);
    match api.delete(secret, &Default::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
        Err(source) => Err(Error::Kube { action: "deleting", object: format!("Secret {namespace}/{secret}"), source }),
    }
}

/// How [`render`] fills in the agent's ModuleTemplate.
#[derive(Debug, Clone)]
pub struct ModuleSpec {
    /// The control-plane namespace of the Runtimes (templates are looked up there).
    pub namespace: String,
    /// The module version (the template name is `fleetwatch-agent-<version>`).
    pub version: String,
    /// The hub address(es) agents connect to, as for `fleetwatch agent --hub`.
    pub hub: Vec<String>,
    /// The container image; the manifest's when `None`.
    pub image: Option<String>,
}

/// Why the agent's manifest cannot be rendered.
#[derive(Debug, thiserror::Error)]
pub enum RenderError {
    /// The manifest file is not YAML.
    #[error("{MANIFEST_PATH}: {0}")]
    Yaml(String),
    /// It lacks what the operator relies on.
    #[error("{MANIFEST_PATH}: {0}")]
    Shape(String),
}

/// The agent's objects as the manifest file has them.
pub(crate) fn manifest_objects() -> Result<Vec<Value>, RenderError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(MANIFEST).map_err(|e| RenderError::Yaml(e.to_string()))?;
    Ok(docs.into_iter().filter(|d| !d.is_null()).collect())
}

/// The agent's ModuleTemplate and its ModuleReleaseMeta (channel `regular`), ready to
/// apply to the control plane: the manifest with the hub address, the image and the
/// version label (the module's running version, for downgrade protection) filled in.
pub fn render(spec: &ModuleSpec) -> Result<Vec<Value>, RenderError> {
    let mut objects = manifest_objects()?;
    let layout = layout()?;
    let deployment = objects
        .iter_mut()
        .find(|o| o["kind"] == "Deployment" && o["metadata"]["name"] == DEPLOYMENT)
        .ok_or_else(|| RenderError::Shape(format!("no Deployment named {DEPLOYMENT}")))?;
    let labels = &mut deployment["metadata"]["labels"];
    if !labels.is_object() {
        *labels = json!({});
    }
    labels["app.kubernetes.io/version"] = json!(spec.version);
    labels["operator.fleetwatch.dev/module"] = json!(MODULE);
    let container = deployment["spec"]["template"]["spec"]["containers"]
        .as_array_mut()
        .and_then(|c| c.first_mut())
        .ok_or_else(|| RenderError::Shape("the Deployment has no container".into()))?;
    if let Some(image) = &spec.image {
        container["image"] = json!(image);
    }
    set_hub(container, &spec.hub.join(","))?;
    allow_hub_egress(&mut objects, &layout.namespace, &spec.hub);
    let template = json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
        "metadata": {"name": format!("{MODULE}-{}", spec.version), "namespace": spec.namespace},
        "spec": {
            "moduleName": MODULE, "version": spec.version, "manifest": objects,
            "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": layout.namespace, "name": DEPLOYMENT},
        },
    });
    let meta = json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
        "metadata": {"name": MODULE, "namespace": spec.namespace},
        "spec": {"moduleName": MODULE, "channels": [{"channel": "regular", "version": spec.version}]},
    });
    Ok(vec![template, meta])
}

/// Lets the agent reach the hub's port(s) through the NetworkPolicies of its namespace (the
/// chart's default allows 443 only): one more egress rule per policy, which only widens it
/// by those ports.
fn allow_hub_egress(objects: &mut [Value], namespace: &str, hubs: &[String]) {
    let mut ports: Vec<u16> = hubs
        .iter()
        .filter_map(|h| {
            let rest = h.strip_prefix("wss://")?;
            let authority = rest.split('/').next()?;
            match authority.rsplit_once(':') {
                Some((_, port)) if !port.ends_with(']') => port.parse().ok(),
                _ => Some(443),
            }
        })
        .collect();
    ports.sort_unstable();
    ports.dedup();
    if ports.is_empty() {
        return;
    }
    for policy in objects.iter_mut().filter(|o| o["kind"] == "NetworkPolicy" && o["metadata"]["namespace"] == namespace)
    {
        let allows = |p: u16| {
            policy["spec"]["egress"].as_array().into_iter().flatten().any(|rule| {
                rule["ports"].as_array().into_iter().flatten().any(|x| x["port"] == p)
                    && rule["to"].as_array().is_some_and(|to| to.iter().any(|t| t["ipBlock"]["cidr"] == "0.0.0.0/0"))
            })
        };
        let missing: Vec<Value> =
            ports.iter().filter(|p| !allows(**p)).map(|p| json!({"port": p, "protocol": "TCP"})).collect();
        if missing.is_empty() {
            continue;
        }
        if let Some(egress) = policy["spec"]["egress"].as_array_mut() {
            egress.push(json!({"to": [{"ipBlock": {"cidr": "0.0.0.0/0"}}], "ports": missing}));
        }
    }
}

/// Points the agent container at `hub`: its `--hub=` or `--hub` argument, else its
/// `FLEETWATCH_HUB` variable, else a new `--hub=` argument.
fn set_hub(container: &mut Value, hub: &str) -> Result<(), RenderError> {
    if let Some(args) = container["args"].as_array_mut() {
        if let Some(a) = args.iter_mut().find(|a| a.as_str().is_some_and(|a| a.starts_with("--hub="))) {
            *a = json!(format!("--hub={hub}"));
            return Ok(());
        }
        if let Some(i) = args.iter().position(|a| a == "--hub")
            && let Some(v) = args.get_mut(i + 1)
        {
            *v = json!(hub);
            return Ok(());
        }
    }
    if let Some(e) =
        container["env"].as_array_mut().and_then(|env| env.iter_mut().find(|e| e["name"] == "FLEETWATCH_HUB"))
    {
        e["value"] = json!(hub);
        return Ok(());
    }
    match container["args"].as_array_mut() {
        Some(args) => args.push(json!(format!("--hub={hub}"))),
        None => return Err(RenderError::Shape("the agent container has no args".into())),
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_manifest_renders_into_a_template_with_the_hub_and_version() {
        let out = render(&ModuleSpec {
            namespace: "kcp".into(),
            version: "1.2.3".into(),
            hub: vec!["wss://a:1".into(), "wss://b:1".into()],
            image: Some("registry/fleetwatch:1.2.3".into()),
        })
        .unwrap();
        let tpl: fleetwatch_api::ModuleTemplate = serde_json::from_value(out[0].clone()).unwrap();
        assert_eq!(tpl.spec.module_name, MODULE);
        let d = tpl.spec.manifest.iter().find(|o| o["kind"] == "Deployment").unwrap();
        assert_eq!(d["metadata"]["labels"]["app.kubernetes.io/version"], "1.2.3");
        let c = &d["spec"]["template"]["spec"]["containers"][0];
        assert_eq!(c["image"], "registry/fleetwatch:1.2.3");
        let hubs: Vec<&Value> =
            c["args"].as_array().unwrap().iter().filter(|a| a.as_str().unwrap().starts_with("--hub")).collect();
        assert_eq!(hubs, [&json!("--hub=wss://a:1,wss://b:1")]);
        // The Deployment mounts the Secret the operator writes.
        let layout = layout().unwrap();
        assert_eq!(d["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"], json!(layout.secret));
        assert_eq!(d["metadata"]["namespace"], json!(layout.namespace));
        assert_eq!(tpl.spec.manager.namespace.as_deref(), Some(layout.namespace.as_str()));
        // The hub's port is let through the agent's NetworkPolicy.
        for policy in tpl.spec.manifest.iter().filter(|o| o["kind"] == "NetworkPolicy") {
            let ports: Vec<&Value> = policy["spec"]["egress"]
                .as_array()
                .unwrap()
                .iter()
                .flat_map(|r| r["ports"].as_array().unwrap())
                .map(|p| &p["port"])
                .collect();
            assert!(ports.contains(&&json!(1)), "{policy}");
        }
        // Read-only RBAC.
        let role = tpl.spec.manifest.iter().find(|o| o["kind"] == "ClusterRole").unwrap();
        for rule in role["rules"].as_array().unwrap() {
            assert_eq!(rule["verbs"], json!(["get", "list", "watch"]), "{rule}");
        }
        let meta: fleetwatch_api::ModuleReleaseMeta = serde_json::from_value(out[1].clone()).unwrap();
        assert_eq!(meta.spec.channels[0].version, "1.2.3");
    }

    #[test]
    fn the_hub_goes_where_the_container_takes_it() {
        let mut c = json!({"args": ["agent", "--hub", "wss://old"]});
        set_hub(&mut c, "wss://new").unwrap();
        assert_eq!(c["args"], json!(["agent", "--hub", "wss://new"]));
        let mut c = json!({"args": ["agent"], "env": [{"name": "FLEETWATCH_HUB", "value": "wss://old"}]});
        set_hub(&mut c, "wss://new").unwrap();
        assert_eq!(c["env"][0]["value"], "wss://new");
        let mut c = json!({"args": ["agent"]});
        set_hub(&mut c, "wss://new").unwrap();
        assert_eq!(c["args"], json!(["agent", "--hub=wss://new"]));
    }

    #[test]
    fn renewal_is_at_two_thirds_of_the_lifetime() {
        let cfg = AgentCerts::new("kcp/ca", Duration::from_secs(30)).unwrap();
        let not_after: jiff::Timestamp = "2030-01-01T00:00:30Z".parse().unwrap();
        assert_eq!(cfg.renew_at(not_after).to_string(), "2030-01-01T00:00:20Z");
        assert!(AgentCerts::new("ca", Duration::from_secs(30)).is_err());
        assert!(AgentCerts::new("kcp/", Duration::from_secs(30)).is_err());
        assert!(AgentCerts::new("kcp/ca", Duration::from_secs(1)).is_err());
    }

    #[test]
    fn the_agent_module_is_added_unless_listed() {
        let mut rt = Runtime::new("rt", Default::default());
        let added = with_agent_module(Arc::new(rt.clone()));
        assert_eq!(added.spec.modules.iter().filter(|m| m.name == MODULE).count(), 1);
        rt.spec.modules.push(ModuleEntry { name: MODULE.into(), version: Some("0.9.0".into()), ..Default::default() });
        let kept = with_agent_module(Arc::new(rt));
        assert_eq!(kept.spec.modules.len(), 1);
        assert_eq!(kept.spec.modules[0].version.as_deref(), Some("0.9.0"));
    }
}
