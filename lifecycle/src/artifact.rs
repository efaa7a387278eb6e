//! Module artifacts: one module version as an OCI artifact in a registry (docs/modules.md).
//!
//! An artifact is an OCI image manifest of artifact type [`ARTIFACT_TYPE`] with the empty
//! config (`application/vnd.oci.empty.v1+json`), a layer [`MANIFEST_MEDIA_TYPE`] (the
//! module's objects, a JSON array, applied in order) and at most one layer
//! [`DEFAULT_CONFIG_MEDIA_TYPE`] (the default configuration, one JSON object). What the
//! ModuleTemplate needs besides the objects is in the manifest's annotations
//! ([`ANNOTATION_NAME`], [`ANNOTATION_VERSION`], [`ANNOTATION_REQUIRES_DOWNTIME`],
//! [`ANNOTATION_MANAGED_RESOURCES`], [`ANNOTATION_MANAGER`]), so the manifest's digest pins
//! all of it. Nothing in it depends on the time of packaging: the same input gives the same
//! digest.
//!
//! ```
//! use fleetwatch_lifecycle::artifact::{ModuleArtifact, parse_documents};
//! let objects = parse_documents("apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: op, namespace: ns}\n", "op.yaml").unwrap();
//! let a = ModuleArtifact::new("redis", "1.0.0", "ns/op", objects).unwrap();
//! let (manifest, layers) = a.to_oci().unwrap();
//! let back = ModuleArtifact::from_oci(&manifest, &layers).unwrap();
//! assert_eq!(back, a);
//! ```

use std::collections::{BTreeMap, HashSet};
use std::fmt;

use fleetwatch_api::{KindRef, ResourceRef};
use oci_client::client::ImageLayer;
use oci_client::manifest::{OciDescriptor, OciImageManifest};
use serde_json::Value;

pub mod cache;
pub mod credentials;
pub mod registry;

/// The manifest's `artifactType`.
pub const ARTIFACT_TYPE: &str = "application/vnd.fleetwatch.module.v1";
/// The layer with the module's objects: a JSON array of Kubernetes objects, in apply order.
pub const MANIFEST_MEDIA_TYPE: &str = "application/vnd.fleetwatch.module.manifest.v1+json";
/// The optional layer with the default configuration: one Kubernetes object, as JSON.
pub const DEFAULT_CONFIG_MEDIA_TYPE: &str = "application/vnd.fleetwatch.module.default-config.v1+json";
/// The config's media type: OCI's empty descriptor (everything is in the annotations).
pub const EMPTY_CONFIG_MEDIA_TYPE: &str = "application/vnd.oci.empty.v1+json";
/// The empty config's content.
pub const EMPTY_CONFIG: &[u8] = b"{}";

/// Annotation: the module's name.
pub const ANNOTATION_NAME: &str = "dev.fleetwatch.module.name";
/// Annotation: the module version (semver).
pub const ANNOTATION_VERSION: &str = "dev.fleetwatch.module.version";
/// Annotation: `true` when an upgrade to this version needs downtime (a maintenance window).
pub const ANNOTATION_REQUIRES_DOWNTIME: &str = "dev.fleetwatch.module.requires-downtime";
/// Annotation: kinds whose instances block deletion, comma-separated `GROUP/VERSION/KIND`
/// (the core group is empty: `/v1/ConfigMap`); absent when none.
pub const ANNOTATION_MANAGED_RESOURCES: &str = "dev.fleetwatch.module.managed-resources";
/// Annotation: the manager workload, the Deployment `NAMESPACE/NAME` among the objects.
pub const ANNOTATION_MANAGER: &str = "dev.fleetwatch.module.manager";
/// The standard OCI annotations also set: the title (module name) and version.
pub const ANNOTATION_OCI_TITLE: &str = "org.opencontainers.image.title";
/// See [`ANNOTATION_OCI_TITLE`].
pub const ANNOTATION_OCI_VERSION: &str = "org.opencontainers.image.version";

/// The label packaging sets on the manager Deployment: the operator reads the running
/// version from it (downgrade protection).
pub const VERSION_LABEL: &str = "app.kubernetes.io/version";

/// Why an artifact cannot be built or read.
#[derive(Debug, thiserror::Error)]
pub enum ArtifactError {
    /// A file is not YAML.
    #[error("{origin}: not YAML: {message}")]
    Yaml {
        /// The file (or "helm template output").
        origin: String,
        /// The parser's message.
        message: String,
    },
    /// An object lacks what every Kubernetes object has, or a CRD does not parse.
    #[error("{origin}: {message}")]
    Object {
        /// Where the object came from, with its index or name.
        origin: String,
        /// What is wrong.
        message: String,
    },
    /// There is nothing to package.
    #[error("{0}: no Kubernetes objects found")]
    NoObjects(String),
    /// The module's own fields are wrong (name, version, manager, managed resources).
    #[error("{0}")]
    Invalid(String),
    /// The registry's artifact is not a fleetwatch module or is malformed.
    #[error("not a fleetwatch module artifact: {0}")]
    NotModule(String),
}

/// One module version: what a ModuleTemplate needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ModuleArtifact {
    /// Module name (a DNS label).
    pub name: String,
    /// Version (semver).
    pub version: String,
    /// An upgrade to this version waits for a maintenance window.
    pub requires_downtime: bool,
    /// Kinds whose instances block deletion.
    pub managed_resources: Vec<KindRef>,
    /// The manager Deployment (among `objects`).
    pub manager: ResourceRef,
    /// The module's objects, in apply order.
    pub objects: Vec<Value>,
    /// The default configuration, created once at install.
    pub default_config: Option<Value>,
}

impl ModuleArtifact {
    /// A module from its objects and manager (`NAMESPACE/NAME` of a Deployment among them),
    /// validated; the manager gets the [`VERSION_LABEL`] of `version`.
    pub fn new(name: &str, version: &str, manager: &str, objects: Vec<Value>) -> Result<Self, ArtifactError> {
        let (namespace, manager_name) = manager
            .split_once('/')
            .filter(|(n, m)| !n.is_empty() && !m.is_empty() && !m.contains('/'))
            .ok_or_else(|| ArtifactError::Invalid(format!("manager {manager:?} is not NAMESPACE/NAME")))?;
        let mut a = Self {
            name: name.to_string(),
            version: version.to_string(),
            requires_downtime: false,
            managed_resources: Vec::new(),
            manager: ResourceRef {
                api_version: "apps/v1".into(),
                kind: "Deployment".into(),
                namespace: Some(namespace.into()),
                name: manager_name.into(),
            },
            objects: in_apply_order(objects),
            default_config: None,
        };
        a.validate()?;
        if let Some(d) = a.manager_object_mut() {
            let labels = &mut d["metadata"]["labels"];
            if !labels.is_object() {
                *labels = Value::Object(Default::default());
            }
            labels[VERSION_LABEL] = Value::String(version.into());
        }
        Ok(a)
    }

    fn manager_object_mut(&mut self) -> Option<&mut Value> {
        let m = &self.manager;
        self.objects.iter_mut().find(|o| {
            o["kind"] == "Deployment"
                && o["apiVersion"] == "apps/v1"
                && o["metadata"]["name"] == m.name.as_str()
                && o["metadata"]["namespace"].as_str() == m.namespace.as_deref()
        })
    }

    /// Checks every rule packaging and the operator rely on.
    pub fn validate(&self) -> Result<(), ArtifactError> {
        if !is_dns_label(&self.name) {
            return Err(ArtifactError::Invalid(format!(
                "module name {:?} is not a DNS label (lowercase letters, digits, '-', at most 63)",
                self.name
            )));
        }
        semver::Version::parse(&self.version).map_err(|e| {
            ArtifactError::Invalid(format!("version {:?} is not a semantic version: {e}", self.version))
        })?;
        if self.objects.is_empty() {
            return Err(ArtifactError::NoObjects(format!("module {}", self.name)));
        }
        let mut seen = HashSet::new();
        for (i, o) in self.objects.iter().enumerate() {
            let origin = format!("object {}", i + 1);
            validate_object(o, &origin)?;
            let key =
                (group_of(o), o["kind"].clone(), o["metadata"]["namespace"].clone(), o["metadata"]["name"].clone());
            if !seen.insert(key) {
                return Err(ArtifactError::Object { origin, message: format!("{} appears twice", describe(o)) });
            }
        }
        if let Some(c) = &self.default_config {
            validate_object(c, "default config")?;
        }
        let m = &self.manager;
        let found = self.objects.iter().any(|o| {
            o["kind"] == "Deployment"
                && o["apiVersion"] == "apps/v1"
                && o["metadata"]["name"] == m.name.as_str()
                && o["metadata"]["namespace"].as_str() == m.namespace.as_deref()
        });
        if !found {
            return Err(ArtifactError::Invalid(format!(
                "manager: no Deployment (apps/v1) {}/{} among the objects (a Deployment needs metadata.namespace)",
                m.namespace.as_deref().unwrap_or_default(),
                m.name
            )));
        }
        for k in &self.managed_resources {
            if k.version.is_empty() || k.kind.is_empty() {
                return Err(ArtifactError::Invalid(format!(
                    "managed resource {} lacks a version or kind",
                    kind_ref(k)
                )));
            }
        }
        Ok(())
    }

    /// The OCI manifest (without the config descriptor's and layers' upload details) and
    /// its layers, in order.
    pub fn to_oci(&self) -> Result<(OciImageManifest, Vec<ImageLayer>), ArtifactError> {
        self.validate()?;
        let json = |v: &Value| serde_json::to_vec(v).map_err(|e| ArtifactError::Invalid(e.to_string()));
        let mut layers =
            vec![ImageLayer::new(json(&Value::Array(self.objects.clone()))?, MANIFEST_MEDIA_TYPE.into(), None)];
        if let Some(c) = &self.default_config {
            layers.push(ImageLayer::new(json(c)?, DEFAULT_CONFIG_MEDIA_TYPE.into(), None));
        }
        let mut annotations = BTreeMap::new();
        annotations.insert(ANNOTATION_NAME.to_string(), self.name.clone());
        annotations.insert(ANNOTATION_VERSION.to_string(), self.version.clone());
        annotations.insert(ANNOTATION_OCI_TITLE.to_string(), self.name.clone());
        annotations.insert(ANNOTATION_OCI_VERSION.to_string(), self.version.clone());
        annotations.insert(ANNOTATION_REQUIRES_DOWNTIME.to_string(), self.requires_downtime.to_string());
        let m = &self.manager;
        annotations
            .insert(ANNOTATION_MANAGER.to_string(), format!("{}/{}", m.namespace.as_deref().unwrap_or(""), m.name));
        if !self.managed_resources.is_empty() {
            let list: Vec<String> = self.managed_resources.iter().map(kind_ref).collect();
            annotations.insert(ANNOTATION_MANAGED_RESOURCES.to_string(), list.join(","));
        }
        let config = OciDescriptor {
            media_type: EMPTY_CONFIG_MEDIA_TYPE.into(),
            digest: sha256(EMPTY_CONFIG),
            size: EMPTY_CONFIG.len() as i64,
            ..OciDescriptor::default()
        };
        let manifest = OciImageManifest {
            schema_version: 2,
            media_type: Some(oci_client::manifest::OCI_IMAGE_MEDIA_TYPE.into()),
            config,
            layers: layers
                .iter()
                .map(|l| OciDescriptor {
                    media_type: l.media_type.clone(),
                    digest: l.sha256_digest(),
                    size: l.data.len() as i64,
                    ..OciDescriptor::default()
                })
                .collect(),
            subject: None,
            artifact_type: Some(ARTIFACT_TYPE.into()),
            annotations: Some(annotations),
        };
        Ok((manifest, layers))
    }

    /// Reads an artifact back from its manifest and its layers' contents (in the
    /// manifest's order), validating it as packaging did.
    pub fn from_oci(manifest: &OciImageManifest, layers: &[ImageLayer]) -> Result<Self, ArtifactError> {
        if manifest.artifact_type.as_deref() != Some(ARTIFACT_TYPE) {
            return Err(ArtifactError::NotModule(format!(
                "artifactType is {:?}, not {ARTIFACT_TYPE}",
                manifest.artifact_type.as_deref().unwrap_or("(none)")
            )));
        }
        if manifest.config.media_type != EMPTY_CONFIG_MEDIA_TYPE {
            return Err(ArtifactError::NotModule(format!(
                "the config is of type {}, not {EMPTY_CONFIG_MEDIA_TYPE}",
                manifest.config.media_type
            )));
        }
        let empty = BTreeMap::new();
        let ann = manifest.annotations.as_ref().unwrap_or(&empty);
        let get = |k: &str| {
            ann.get(k).cloned().ok_or_else(|| ArtifactError::NotModule(format!("the annotation {k} is missing")))
        };
        let mut objects = None;
        let mut default_config = None;
        for l in layers {
            let parse = |what: &str| {
                serde_json::from_slice::<Value>(&l.data)
                    .map_err(|e| ArtifactError::NotModule(format!("the {what} layer is not JSON: {e}")))
            };
            match l.media_type.as_str() {
                MANIFEST_MEDIA_TYPE if objects.is_none() => match parse("manifest")? {
                    Value::Array(a) => objects = Some(a),
                    _ => return Err(ArtifactError::NotModule("the manifest layer is not a JSON array".into())),
                },
                DEFAULT_CONFIG_MEDIA_TYPE if default_config.is_none() => {
                    default_config = Some(parse("default config")?)
                }
                other => return Err(ArtifactError::NotModule(format!("unexpected or repeated layer of type {other}"))),
            }
        }
        let objects =
            objects.ok_or_else(|| ArtifactError::NotModule(format!("no layer of type {MANIFEST_MEDIA_TYPE}")))?;
        let managed_resources = match ann.get(ANNOTATION_MANAGED_RESOURCES) {
            Some(list) if !list.is_empty() => list.split(',').map(parse_kind_ref).collect::<Result<Vec<_>, _>>()?,
            _ => Vec::new(),
        };
        let requires_downtime = match get(ANNOTATION_REQUIRES_DOWNTIME)?.as_str() {
            "true" => true,
            "false" => false,
            other => {
                return Err(ArtifactError::NotModule(format!(
                    "{ANNOTATION_REQUIRES_DOWNTIME} is {other:?}, not true/false"
                )));
            }
        };
        let mut a = Self::new(&get(ANNOTATION_NAME)?, &get(ANNOTATION_VERSION)?, &get(ANNOTATION_MANAGER)?, objects)?;
        a.requires_downtime = requires_downtime;
        a.managed_resources = managed_resources;
        a.default_config = default_config;
        a.validate()?;
        Ok(a)
    }

    /// The ModuleTemplate that installs this artifact from `pinned_ref`
    /// (`REGISTRY/REPOSITORY@sha256:…`), in `namespace`: named `NAME-VERSION`, its
    /// `spec.source.oci.ref` in place of an inline `manifest`.
    pub fn module_template(&self, namespace: &str, pinned_ref: &str) -> Value {
        serde_json::json!({
            "apiVersion": "operator.fleetwatch.dev/v1alpha1",
            "kind": "ModuleTemplate",
            "metadata": {"name": format!("{}-{}", self.name, self.version), "namespace": namespace},
            "spec": {
                "moduleName": self.name,
                "version": self.version,
                "requiresDowntime": self.requires_downtime,
                "managedResources": self.managed_resources,
                "manager": self.manager,
                "source": {"oci": {"ref": pinned_ref}},
            },
        })
    }
}

/// `GROUP/VERSION/KIND` (`/v1/ConfigMap` for the core group).
pub fn kind_ref(k: &KindRef) -> String {
    format!("{}/{}/{}", k.group, k.version, k.kind)
}

/// Parses `GROUP/VERSION/KIND`; the core group is empty (`/v1/ConfigMap`) or left out
/// (`v1/ConfigMap`).
pub fn parse_kind_ref(s: &str) -> Result<KindRef, ArtifactError> {
    let parts: Vec<&str> = s.split('/').collect();
    let (group, version, kind) = match parts.as_slice() {
        [g, v, k] => (*g, *v, *k),
        [v, k] => ("", *v, *k),
        _ => return Err(ArtifactError::Invalid(format!("managed resource {s:?} is not GROUP/VERSION/KIND"))),
    };
    if version.is_empty() || kind.is_empty() {
        return Err(ArtifactError::Invalid(format!("managed resource {s:?} is not GROUP/VERSION/KIND")));
    }
    Ok(KindRef { group: group.into(), version: version.into(), kind: kind.into() })
}

/// The objects of a stream of YAML documents (`---`-separated; empty documents are
/// skipped, `kind: List` documents give their items), each checked with
/// [`validate_object`]. `origin` names the source in errors.
pub fn parse_documents(text: &str, origin: &str) -> Result<Vec<Value>, ArtifactError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| ArtifactError::Yaml { origin: origin.into(), message: first_line(&e.to_string()) })?;
    let mut out = Vec::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        if d["kind"].as_str().is_some_and(|k| k == "List" || k.ends_with("List")) && d["items"].is_array() {
            out.extend(d["items"].as_array().into_iter().flatten().cloned());
        } else {
            out.push(d);
        }
    }
    for (i, o) in out.iter().enumerate() {
        validate_object(o, &format!("{origin}: document {}", i + 1))?;
    }
    Ok(out)
}

/// `objects` in the order the operator applies them: Namespaces, then
/// CustomResourceDefinitions (their kinds must be served before objects of them are
/// applied), then the rest; a stable sort, so each group keeps the order it was given in.
pub fn in_apply_order(mut objects: Vec<Value>) -> Vec<Value> {
    let rank = |o: &Value| match (o["kind"].as_str(), group_of(o).as_str()) {
        (Some("Namespace"), "") => 0,
        (Some("CustomResourceDefinition"), "apiextensions.k8s.io") => 1,
        _ => 2,
    };
    objects.sort_by_key(rank);
    objects
}

/// Checks one object: a mapping with `apiVersion`, `kind` and `metadata.name`; a
/// CustomResourceDefinition must parse as one and be named `PLURAL.GROUP`.
pub fn validate_object(o: &Value, origin: &str) -> Result<(), ArtifactError> {
    let err = |message: String| ArtifactError::Object { origin: origin.into(), message };
    if !o.is_object() {
        return Err(err("not a mapping (a Kubernetes object)".into()));
    }
    for (field, v) in
        [("apiVersion", &o["apiVersion"]), ("kind", &o["kind"]), ("metadata.name", &o["metadata"]["name"])]
    {
        if v.as_str().is_none_or(str::is_empty) {
            return Err(err(format!("{} has no {field}", describe(o))));
        }
    }
    if o["kind"] == "CustomResourceDefinition" && group_of(o) == "apiextensions.k8s.io" {
        use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
        let crd: CustomResourceDefinition = serde_json::from_value(o.clone())
            .map_err(|e| err(format!("{} is not a valid CustomResourceDefinition: {e}", describe(o))))?;
        let want = format!("{}.{}", crd.spec.names.plural, crd.spec.group);
        if crd.metadata.name.as_deref() != Some(want.as_str()) {
            return Err(err(format!("{} must be named {want} (spec.names.plural.spec.group)", describe(o))));
        }
        if crd.spec.versions.is_empty() {
            return Err(err(format!("{} has no versions", describe(o))));
        }
    }
    Ok(())
}

/// `Kind namespace/name` (or `Kind name`) of an object, for messages and listings.
pub fn describe(o: &Value) -> String {
    let kind = o["kind"].as_str().unwrap_or("(no kind)");
    let name = o["metadata"]["name"].as_str().unwrap_or("(no name)");
    match o["metadata"]["namespace"].as_str() {
        Some(ns) => format!("{kind} {ns}/{name}"),
        None => format!("{kind} {name}"),
    }
}

fn group_of(o: &Value) -> String {
    o["apiVersion"].as_str().and_then(|a| a.rsplit_once('/')).map(|(g, _)| g.to_string()).unwrap_or_default()
}

fn is_dns_label(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !s.starts_with('-')
        && !s.ends_with('-')
}

fn first_line(s: &str) -> String {
    s.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string()
}

/// `sha256:HEX` of some bytes.
pub fn sha256(data: &[u8]) -> String {
    let d = ring::digest::digest(&ring::digest::SHA256, data);
    format!("sha256:{}", hex::encode(d))
}

impl fmt::Display for ModuleArtifact {
    /// What `fleetwatch module inspect` shows.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "module:            {}", self.name)?;
        writeln!(f, "version:           {}", self.version)?;
        writeln!(f, "requires downtime: {}", if self.requires_downtime { "yes" } else { "no" })?;
        let m = &self.manager;
        writeln!(f, "manager:           Deployment {}/{}", m.namespace.as_deref().unwrap_or(""), m.name)?;
        let managed: Vec<String> = self.managed_resources.iter().map(kind_ref).collect();
        writeln!(f, "managed resources: {}", if managed.is_empty() { "none".into() } else { managed.join(", ") })?;
        match &self.default_config {
            Some(c) => writeln!(f, "default config:    {} ({})", describe(c), c["apiVersion"].as_str().unwrap_or(""))?,
            None => writeln!(f, "default config:    none")?,
        }
        writeln!(f, "objects:           {}", self.objects.len())?;
        for o in &self.objects {
            writeln!(f, "  {} ({})", describe(o), o["apiVersion"].as_str().unwrap_or(""))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn deployment() -> Value {
        json!({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "op", "namespace": "ns"}})
    }

    fn crd(name: &str) -> Value {
        json!({"apiVersion": "apiextensions.k8s.io/v1", "kind": "CustomResourceDefinition", "metadata": {"name": name},
            "spec": {"group": "example.com", "scope": "Namespaced",
                "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
                "versions": [{"name": "v1", "served": true, "storage": true,
                    "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}}}]}})
    }

    #[test]
    fn round_trips_through_oci_and_is_reproducible() {
        let mut a =
            ModuleArtifact::new("widgets", "1.2.3", "ns/op", vec![crd("widgets.example.com"), deployment()]).unwrap();
        a.requires_downtime = true;
        a.managed_resources = vec![parse_kind_ref("example.com/v1/Widget").unwrap()];
        a.default_config =
            Some(json!({"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "default"}}));
        assert_eq!(a.objects[1]["metadata"]["labels"][VERSION_LABEL], "1.2.3");
        let (manifest, layers) = a.to_oci().unwrap();
        assert_eq!(layers.len(), 2);
        let ann = manifest.annotations.as_ref().unwrap();
        assert_eq!(ann[ANNOTATION_MANAGED_RESOURCES], "example.com/v1/Widget");
        assert_eq!(ann[ANNOTATION_REQUIRES_DOWNTIME], "true");
        assert_eq!(ann[ANNOTATION_MANAGER], "ns/op");
        assert_eq!(ModuleArtifact::from_oci(&manifest, &layers).unwrap(), a);
        let (again, _) = a.to_oci().unwrap();
        assert_eq!(serde_json::to_string(&manifest).unwrap(), serde_json::to_string(&again).unwrap());
    }

    #[test]
    fn refuses_bad_objects_and_fields() {
        let e = parse_documents("apiVersion: v1\nkind: ConfigMap\nmetadata: {}\n", "x.yaml").unwrap_err();
        assert_eq!(e.to_string(), "x.yaml: document 1: ConfigMap (no name) has no metadata.name");
        let e = parse_documents("kind: ConfigMap\nmetadata: {name: a}\n", "x.yaml").unwrap_err();
        assert_eq!(e.to_string(), "x.yaml: document 1: ConfigMap a has no apiVersion");
        assert!(parse_documents("a: [", "x.yaml").unwrap_err().to_string().starts_with("x.yaml: not YAML: "));
        assert!(parse_documents("---\n---\n", "x.yaml").unwrap().is_empty());
        let e = validate_object(&crd("wrong.example.com"), "o").unwrap_err();
        assert_eq!(
            e.to_string(),
            "o: CustomResourceDefinition wrong.example.com must be named widgets.example.com (spec.names.plural.spec.group)"
        );
        let mut broken = crd("widgets.example.com");
        broken["spec"]["versions"] = json!("v1");
        let e = validate_object(&broken, "o").unwrap_err().to_string();
        assert!(
            e.starts_with("o: CustomResourceDefinition widgets.example.com is not a valid CustomResourceDefinition"),
            "{e}"
        );
        let e = ModuleArtifact::new("w", "1.0.0", "ns/other", vec![deployment()]).unwrap_err();
        assert!(e.to_string().starts_with("manager: no Deployment (apps/v1) ns/other"), "{e}");
        let e = ModuleArtifact::new("w", "1.0", "ns/op", vec![deployment()]).unwrap_err();
        assert!(e.to_string().starts_with("version \"1.0\" is not a semantic version"), "{e}");
        let e = ModuleArtifact::new("W", "1.0.0", "ns/op", vec![deployment()]).unwrap_err();
        assert!(e.to_string().starts_with("module name \"W\" is not a DNS label"), "{e}");
        let e = ModuleArtifact::new("w", "1.0.0", "op", vec![deployment()]).unwrap_err();
        assert_eq!(e.to_string(), "manager \"op\" is not NAMESPACE/NAME");
        let e = ModuleArtifact::new("w", "1.0.0", "ns/op", vec![deployment(), deployment()]).unwrap_err();
        assert_eq!(e.to_string(), "object 2: Deployment ns/op appears twice");
        assert!(parse_kind_ref("Widget").is_err());
        assert_eq!(
            parse_kind_ref("v1/ConfigMap").unwrap(),
            KindRef { group: "".into(), version: "v1".into(), kind: "ConfigMap".into() }
        );
    }

    #[test]
    fn objects_are_stored_in_apply_order() {
        let ns = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "ns"}});
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ns"}});
        let given = vec![cm.clone(), deployment(), crd("widgets.example.com"), ns.clone()];
        let a = ModuleArtifact::new("widgets", "1.0.0", "ns/op", given).unwrap();
        let order: Vec<String> = a.objects.iter().map(describe).collect();
        let want: Vec<String> = [ns, crd("widgets.example.com"), cm, deployment()].iter().map(describe).collect();
        assert_eq!(order, want);
    }

    #[test]
    fn lists_are_flattened() {
        let objs = parse_documents(
            "apiVersion: v1\nkind: List\nitems:\n- {apiVersion: v1, kind: ConfigMap, metadata: {name: a}}\n---\napiVersion: v1\nkind: ConfigMap\nmetadata: {name: b}\n",
            "l.yaml",
        )
        .unwrap();
        assert_eq!(objs.len(), 2);
    }

    #[test]
    fn foreign_artifacts_are_refused() {
        let a = ModuleArtifact::new("w", "1.0.0", "ns/op", vec![deployment()]).unwrap();
        let (mut manifest, layers) = a.to_oci().unwrap();
        manifest.artifact_type = Some("application/vnd.cncf.helm.config.v1+json".into());
        let e = ModuleArtifact::from_oci(&manifest, &layers).unwrap_err();
        assert!(e.to_string().starts_with("not a fleetwatch module artifact: artifactType is"), "{e}");
        let (mut manifest, mut layers) = a.to_oci().unwrap();
        manifest.config.media_type = "application/vnd.oci.image.config.v1+json".into();
        let e = ModuleArtifact::from_oci(&manifest, &layers).unwrap_err();
        assert!(
            e.to_string().ends_with(
                "the config is of type application/vnd.oci.image.config.v1+json, not application/vnd.oci.empty.v1+json"
            ),
            "{e}"
        );
        manifest.config.media_type = EMPTY_CONFIG_MEDIA_TYPE.into();
        layers[0].media_type = "application/vnd.oci.image.layer.v1.tar+gzip".into();
        let e = ModuleArtifact::from_oci(&manifest, &layers).unwrap_err();
        assert!(
            e.to_string().contains("unexpected or repeated layer of type application/vnd.oci.image.layer.v1.tar+gzip"),
            "{e}"
        );
    }
}
