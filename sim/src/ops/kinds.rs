//! Kind-specific defaults and checks (the parts of kube-apiserver's registry strategies
//! fleetwatch meets), and what `generation` tracks.

use base64::Engine;
use serde_json::{Value, json};

use crate::error::ApiError;
use crate::meta::{self, meta_mut, meta_str};
use crate::resources::{ResourceDef, res_key};
use crate::store::State;

/// Body without metadata and status: what `generation` tracks.
pub(super) fn spec_part(o: &Value) -> Value {
    let mut v = o.clone();
    if let Some(m) = v.as_object_mut() {
        m.remove("metadata");
        m.remove("status");
    }
    v
}

/// Kind-specific defaults and checks (the parts of registry strategies fleetwatch meets).
pub(super) fn prepare_kind(st: &State, def: &ResourceDef, obj: &mut Value, creating: bool) -> Result<(), ApiError> {
    match (def.group.as_str(), def.plural.as_str()) {
        ("", "secrets") => {
            // stringData is write-only: merged into data (base64) and dropped.
            if let Some(Value::Object(sd)) = obj.as_object_mut().and_then(|m| m.remove("stringData")) {
                let data = obj["data"].as_object().cloned().unwrap_or_default();
                let mut data = data;
                for (k, v) in sd {
                    let s = v.as_str().unwrap_or("").as_bytes().to_vec();
                    data.insert(k, json!(base64::engine::general_purpose::STANDARD.encode(s)));
                }
                obj["data"] = Value::Object(data);
            }
            if obj["type"].is_null() {
                obj["type"] = json!("Opaque");
            }
        }
        ("", "namespaces") => {
            if creating {
                obj["spec"]["finalizers"] = json!(["kubernetes"]);
                obj["status"] = json!({"phase": "Active"});
            }
            let name = meta_str(obj, "name").to_string();
            meta_mut(obj)
                .entry("labels")
                .or_insert_with(|| json!({}))
                .as_object_mut()
                .map(|l| l.insert("kubernetes.io/metadata.name".into(), json!(name)));
        }
        ("", "services") if creating => {
            if obj["spec"]["type"].is_null() {
                obj["spec"]["type"] = json!("ClusterIP");
            }
            if obj["spec"]["clusterIP"].is_null() && obj["spec"]["type"] != "ExternalName" {
                let ip = format!("10.96.{}.{}", rand::random_range(0..255u8), rand::random_range(1..255u8));
                obj["spec"]["clusterIP"] = json!(ip);
                obj["spec"]["clusterIPs"] = json!([ip]);
            }
        }
        ("apps", "deployments" | "replicasets") if obj["spec"]["replicas"].is_null() => {
            obj["spec"]["replicas"] = json!(1);
        }
        ("apps", "statefulsets") => default_statefulset(obj),
        ("apiextensions.k8s.io", "customresourcedefinitions") => {
            crate::schema::check_crd(obj)?;
            let mut reg = st.registry.clone();
            let group = obj["spec"]["group"].as_str().unwrap_or("");
            let plural = obj["spec"]["names"]["plural"].as_str().unwrap_or("");
            let name = meta_str(obj, "name").to_string();
            let invalid = |m: String| {
                ApiError::invalid("CustomResourceDefinition", "apiextensions.k8s.io", &name, &[("spec", m)])
            };
            if name != format!("{plural}.{group}") {
                return Err(ApiError::invalid(
                    "CustomResourceDefinition",
                    "apiextensions.k8s.io",
                    &name,
                    &[(
                        "metadata.name",
                        format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
                    )],
                ));
            }
            if let Some(other) = reg.any_version(&res_key(group, plural))
                && !other.from_crd
            {
                return Err(invalid(format!("{plural}.{group} is a built-in resource")));
            }
            reg.apply_crd(obj).map_err(invalid)?;
            let stored: Vec<Value> = obj["spec"]["versions"]
                .as_array()
                .map(|vs| vs.iter().filter(|v| v["storage"] == json!(true)).map(|v| v["name"].clone()).collect())
                .unwrap_or_default();
            let now = meta::now();
            // A condition keeps its lastTransitionTime while its status stays the same (as in
            // kube-apiserver), so re-applying an unchanged CRD is a no-op.
            let since = |kind: &str| {
                obj["status"]["conditions"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["type"] == kind && c["status"] == "True"))
                    .and_then(|c| c["lastTransitionTime"].as_str())
                    .map_or_else(|| now.clone(), str::to_string)
            };
            let (names_since, established_since) = (since("NamesAccepted"), since("Established"));
            let mut accepted = obj["spec"]["names"].clone();
            if accepted["singular"].is_null() {
                accepted["singular"] = json!(accepted["kind"].as_str().unwrap_or("").to_lowercase());
            }
            if accepted["listKind"].is_null() {
                accepted["listKind"] = json!(format!("{}List", accepted["kind"].as_str().unwrap_or("")));
            }
            obj["status"] = json!({
                "acceptedNames": accepted,
                "storedVersions": stored,
                "conditions": [
                    {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts", "message": "no conflicts found", "lastTransitionTime": names_since},
                    {"type": "Established", "status": "True", "reason": "InitialNamesAccepted", "message": "the initial names have been accepted", "lastTransitionTime": established_since},
                ],
            });
        }
        _ => {}
    }
    Ok(())
}

/// kube-apiserver's defaults of an apps/v1 StatefulSet (`SetDefaults_StatefulSet`), applied
/// on every write as its decoding does: `kubectl rollout status` refuses a StatefulSet whose
/// `updateStrategy.type` is not `RollingUpdate`, and reads the partition.
fn default_statefulset(obj: &mut Value) {
    let spec = &mut obj["spec"];
    if spec["replicas"].is_null() {
        spec["replicas"] = json!(1);
    }
    if spec["podManagementPolicy"].is_null() {
        spec["podManagementPolicy"] = json!("OrderedReady");
    }
    if spec["revisionHistoryLimit"].is_null() {
        spec["revisionHistoryLimit"] = json!(10);
    }
    if spec["updateStrategy"]["type"].is_null() {
        spec["updateStrategy"]["type"] = json!("RollingUpdate");
    }
    if spec["updateStrategy"]["type"] == "RollingUpdate"
        && spec["updateStrategy"]["rollingUpdate"]["partition"].is_null()
    {
        spec["updateStrategy"]["rollingUpdate"]["partition"] = json!(0);
    }
    let policy = &mut spec["persistentVolumeClaimRetentionPolicy"];
    for k in ["whenDeleted", "whenScaled"] {
        if policy[k].is_null() {
            policy[k] = json!("Retain");
        }
    }
}
