//! `fleetwatch version`: what this build is and what it speaks, for upgrades
//! (docs/upgrade.md): the build version and commit, the protocol range and skew policy,
//! the storage formats and the CRD versions.

use fleetwatch_protocol::message::{MIN_PROTOCOL_VERSION, PROTOCOL_SKEW, PROTOCOL_VERSION};
use kube::CustomResourceExt;

/// The first line of `fleetwatch version`, also what `--version` prints after the name.
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("FLEETWATCH_GIT_COMMIT"), ")");

/// `fleetwatch version`'s text.
pub fn text() -> String {
    let mut out = format!("fleetwatch {VERSION_LINE}\n");
    out.push_str(&format!(
        "protocol: {PROTOCOL_VERSION} (speaks {MIN_PROTOCOL_VERSION}..{PROTOCOL_VERSION}; skew policy: each release \
         speaks its protocol and the {PROTOCOL_SKEW} before it)\n"
    ));
    out.push_str(&format!(
        "log format: fleetwatch-bus {} (the data directory's `format` file; a directory of format 1 is moved aside, a \
         newer one refused)\n",
        fleetwatch_bus::LOG_FORMAT
    ));
    out.push_str(&format!("cursor store format: {}\n", fleetwatch_bus::CURSOR_STORE_FORMAT));
    out.push_str("CRD versions:\n");
    let crds = [
        fleetwatch_api::watchconfig::WatchConfig::crd(),
        fleetwatch_api::Runtime::crd(),
        fleetwatch_api::ModuleTemplate::crd(),
        fleetwatch_api::ModuleReleaseMeta::crd(),
        fleetwatch_api::maintenance::MaintenancePolicy::crd(),
        fleetwatch_api::config_policy::ModuleConfigPolicy::crd(),
        fleetwatch_api::access_policy::SubscriberAccessPolicy::crd(),
        // In runtime clusters, installed by the lifecycle operator.
        fleetwatch_api::chosen::Module::crd(),
    ];
    for crd in crds {
        let versions: Vec<String> = crd
            .spec
            .versions
            .iter()
            .map(|v| {
                let mut tags = Vec::new();
                if v.served {
                    tags.push("served");
                }
                if v.storage {
                    tags.push("storage");
                }
                format!("{} ({})", v.name, tags.join(", "))
            })
            .collect();
        out.push_str(&format!(
            "  {}: {}\n",
            crd.metadata.name.as_deref().unwrap_or(&crd.spec.names.kind),
            versions.join(", ")
        ));
    }
    out
}
