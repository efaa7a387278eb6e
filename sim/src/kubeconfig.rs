//! The kubeconfig a simulated cluster hands out. Written as JSON: kubectl and kube-rs both
//! read JSON kubeconfigs (JSON is YAML), which avoids a YAML serializer.

use base64::Engine;
use serde_json::{Value, json};

/// Builds a kubeconfig with one cluster, one user (bearer token) and one context, all
/// named `name`, with the CA embedded.
pub fn build(name: &str, server: &str, ca_pem: &str, token: &str) -> Value {
    let ca = base64::engine::general_purpose::STANDARD.encode(ca_pem.as_bytes());
    json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": name, "cluster": {"server": server, "certificate-authority-data": ca}}],
        "users": [{"name": name, "user": {"token": token}}],
        "contexts": [{"name": name, "context": {"cluster": name, "user": name, "namespace": "default"}}],
        "current-context": name,
        "preferences": {},
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn kubeconfig_has_one_of_each() {
        let k = super::build("sim-0", "https://127.0.0.1:1", "PEM", "tok");
        assert_eq!(k["current-context"], "sim-0");
        assert_eq!(k["users"][0]["user"]["token"], "tok");
        assert_eq!(k["clusters"][0]["cluster"]["certificate-authority-data"], "UEVN");
    }
}
