//! Writing into one runtime cluster: server-side apply of manifest objects, create-once,
//! delete, count instances of a kind. Kinds are resolved through discovery, cached.

use std::collections::HashMap;
use std::sync::Mutex;

use fleetwatch_api::{KindRef, ResourceRef};
use kube::api::{Api, DeleteParams, DynamicObject, ListParams, Patch, PatchParams, PostParams};
use kube::discovery::{ApiCapabilities, ApiResource, Scope};
use serde_json::Value;

use crate::Error;
use crate::error::ManifestError;

/// The field manager fleetwatch applies with.
pub(crate) const FIELD_MANAGER: &str = "fleetwatch-lifecycle";

/// One runtime cluster's writer.
pub struct Applier {
    client: kube::Client,
    /// The runtime cluster it writes to, for messages (`in rt-1`); `None`: the local one.
    cluster: Option<String>,
    kinds: Mutex<HashMap<(String, String), (ApiResource, ApiCapabilities)>>,
}

/// `Kind namespace/name` (or `Kind name`), for errors.
fn object(r: &ResourceRef) -> String {
    match &r.namespace {
        Some(ns) => format!("{} {ns}/{}", r.kind, r.name),
        None => format!("{} {}", r.kind, r.name),
    }
}

fn split_api_version(api_version: &str) -> (&str, &str) {
    api_version.rsplit_once('/').unwrap_or(("", api_version))
}

impl Applier {
    /// A writer for the cluster `client` reaches.
    pub fn new(client: kube::Client) -> Self {
        Self { client, cluster: None, kinds: Mutex::new(HashMap::new()) }
    }

    /// A writer for runtime cluster `cluster` (named in its errors).
    pub fn for_cluster(client: kube::Client, cluster: impl Into<String>) -> Self {
        Self { client, cluster: Some(cluster.into()), kinds: Mutex::new(HashMap::new()) }
    }

    /// `Kind namespace/name in CLUSTER`, for errors.
    fn describe(&self, r: &ResourceRef) -> String {
        self.within(object(r))
    }

    fn not_served(&self, action: &'static str, r: &ResourceRef) -> Error {
        Error::KindNotServed {
            action,
            object: self.describe(r),
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
        }
    }

    fn within(&self, what: String) -> String {
        match &self.cluster {
            Some(c) => format!("{what} in {c}"),
            None => what,
        }
    }

    /// The client.
    pub fn client(&self) -> &kube::Client {
        &self.client
    }

    /// Resolves a kind (cached; a miss is not cached, so a CRD that appears later is found).
    async fn resolve(&self, api_version: &str, kind: &str) -> Result<Option<(ApiResource, ApiCapabilities)>, Error> {
        let key = (api_version.to_string(), kind.to_string());
        if let Some(v) = self.kinds.lock().ok().and_then(|m| m.get(&key).cloned()) {
            return Ok(Some(v));
        }
        let (group, version) = split_api_version(api_version);
        let gvk = kube::api::GroupVersionKind::gvk(group, version, kind);
        match kube::discovery::pinned_kind(&self.client, &gvk).await {
            Ok(found) => {
                if let Ok(mut m) = self.kinds.lock() {
                    m.insert(key, found.clone());
                }
                Ok(Some(found))
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(None),
            Err(kube::Error::Discovery(_)) => Ok(None),
            Err(e) => Err(Error::kube("discovery of", self.within(format!("{api_version} {kind}")), e)),
        }
    }

    /// Forgets cached kinds (after a CRD was installed or removed).
    pub fn forget_kinds(&self) {
        if let Ok(mut m) = self.kinds.lock() {
            m.clear();
        }
    }

    fn api(&self, ar: &ApiResource, caps: &ApiCapabilities, namespace: Option<&str>) -> Api<DynamicObject> {
        match (caps.scope.clone(), namespace) {
            (Scope::Namespaced, Some(ns)) => Api::namespaced_with(self.client.clone(), ns, ar),
            (Scope::Namespaced, None) => Api::default_namespaced_with(self.client.clone(), ar),
            (Scope::Cluster, _) => Api::all_with(self.client.clone(), ar),
        }
    }

    /// The reference of a manifest object.
    pub fn reference(obj: &Value) -> Result<ResourceRef, Error> {
        let s = |p: &str| obj.pointer(p).and_then(Value::as_str).map(str::to_string);
        Ok(ResourceRef {
            api_version: s("/apiVersion").ok_or(ManifestError::MissingField { field: "apiVersion" })?,
            kind: s("/kind").ok_or(ManifestError::MissingField { field: "kind" })?,
            namespace: s("/metadata/namespace"),
            name: s("/metadata/name").ok_or(ManifestError::MissingField { field: "metadata.name" })?,
        })
    }

    /// Server-side applies an object (taking ownership of conflicting fields: fleetwatch is
    /// the manager of what it installs).
    pub async fn apply(&self, obj: &Value) -> Result<ResourceRef, Error> {
        let r = Self::reference(obj)?;
        let (ar, caps) = self.resolve(&r.api_version, &r.kind).await?.ok_or_else(|| self.not_served("apply", &r))?;
        let api = self.api(&ar, &caps, r.namespace.as_deref());
        api.patch(&r.name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(obj))
            .await
            .map_err(|e| Error::kube("apply", self.describe(&r), e))?;
        if r.kind == "CustomResourceDefinition" {
            self.forget_kinds();
        }
        Ok(r)
    }

    /// Creates an object unless it exists; never overwrites. Returns whether it created it.
    pub async fn create_once(&self, obj: &Value) -> Result<(ResourceRef, bool), Error> {
        let r = Self::reference(obj)?;
        let (ar, caps) = self.resolve(&r.api_version, &r.kind).await?.ok_or_else(|| self.not_served("create", &r))?;
        let api = self.api(&ar, &caps, r.namespace.as_deref());
        let dynobj: DynamicObject = serde_json::from_value(obj.clone())
            .map_err(|source| ManifestError::NotAnObject { kind: r.kind.clone(), name: r.name.clone(), source })?;
        match api.create(&PostParams { field_manager: Some(FIELD_MANAGER.into()), ..Default::default() }, &dynobj).await
        {
            Ok(_) => Ok((r, true)),
            Err(kube::Error::Api(s)) if s.code == 409 => Ok((r, false)),
            Err(e) => Err(Error::kube("create", self.describe(&r), e)),
        }
    }

    /// Reads an object; `None` when it or its kind does not exist.
    pub async fn get(&self, r: &ResourceRef) -> Result<Option<DynamicObject>, Error> {
        let Some((ar, caps)) = self.resolve(&r.api_version, &r.kind).await? else { return Ok(None) };
        self.api(&ar, &caps, r.namespace.as_deref())
            .get_opt(&r.name)
            .await
            .map_err(|e| Error::kube("get", self.describe(r), e))
    }

    /// Deletes an object; a missing object or kind is fine.
    pub async fn delete(&self, r: &ResourceRef) -> Result<(), Error> {
        let Some((ar, caps)) = self.resolve(&r.api_version, &r.kind).await? else { return Ok(()) };
        match self.api(&ar, &caps, r.namespace.as_deref()).delete(&r.name, &DeleteParams::background()).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => Err(Error::kube("delete", self.describe(r), e)),
        }
        .inspect(|_| {
            if r.kind == "CustomResourceDefinition" {
                self.forget_kinds();
            }
        })
    }

    /// How many instances of a kind exist, in all namespaces (0 when the kind is gone).
    pub async fn count(&self, kind: &KindRef) -> Result<usize, Error> {
        let api_version =
            if kind.group.is_empty() { kind.version.clone() } else { format!("{}/{}", kind.group, kind.version) };
        let Some((ar, _)) = self.resolve(&api_version, &kind.kind).await? else { return Ok(0) };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        match api.list(&ListParams::default()).await {
            Ok(list) => Ok(list.items.len()),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(0),
            Err(e) => Err(Error::kube("list", self.within(format!("{api_version} {}", kind.kind)), e)),
        }
    }

    /// Server-side applies `obj` as field manager `manager` (with `force` or not) and
    /// returns the object as stored (ModuleConfigPolicy enforcement, `config_policy.rs`).
    pub async fn apply_as(&self, obj: &Value, manager: &str, force: bool) -> Result<DynamicObject, Error> {
        let r = Self::reference(obj)?;
        let api = self.api_for(&r).await?;
        let mut pp = PatchParams::apply(manager);
        pp.force = force;
        api.patch(&r.name, &pp, &Patch::Apply(obj)).await.map_err(|e| Error::kube("apply", self.describe(&r), e))
    }

    /// Replaces an object's content with `obj` (its `metadata.resourceVersion` guards the
    /// write) as field manager `manager`.
    pub async fn replace_as(&self, obj: &Value, manager: &str) -> Result<DynamicObject, Error> {
        let r = Self::reference(obj)?;
        let api = self.api_for(&r).await?;
        let dynobj: DynamicObject = serde_json::from_value(obj.clone())
            .map_err(|source| ManifestError::NotAnObject { kind: r.kind.clone(), name: r.name.clone(), source })?;
        let pp = PostParams { field_manager: Some(manager.into()), ..Default::default() };
        api.replace(&r.name, &pp, &dynobj).await.map_err(|e| Error::kube("replace", self.describe(&r), e))
    }

    /// Every instance of a kind, in all namespaces (none when the kind is not served).
    pub async fn list(&self, kind: &KindRef) -> Result<Vec<ResourceRef>, Error> {
        let api_version =
            if kind.group.is_empty() { kind.version.clone() } else { format!("{}/{}", kind.group, kind.version) };
        let Some((ar, _)) = self.resolve(&api_version, &kind.kind).await? else { return Ok(Vec::new()) };
        let api: Api<DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let list = api
            .list(&ListParams::default())
            .await
            .map_err(|e| Error::kube("list", self.within(format!("{api_version} {}", kind.kind)), e))?;
        Ok(list
            .items
            .into_iter()
            .map(|o| ResourceRef {
                api_version: api_version.clone(),
                kind: kind.kind.clone(),
                namespace: o.metadata.namespace,
                name: o.metadata.name.unwrap_or_default(),
            })
            .collect())
    }

    async fn api_for(&self, r: &ResourceRef) -> Result<Api<DynamicObject>, Error> {
        let (ar, caps) = self.resolve(&r.api_version, &r.kind).await?.ok_or_else(|| self.not_served("write", r))?;
        Ok(self.api(&ar, &caps, r.namespace.as_deref()))
    }
}
