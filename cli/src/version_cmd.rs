//! `fleetwatch version`: what this build is and what it speaks, for upgrades
//! (docs/upgrade.md): the build version and commit, the protocol range and skew policy,
//! the storage formats and the CRD versions; as text, JSON or YAML.

use anyhow::Context;
use fleetwatch_protocol::message::{MIN_PROTOCOL_VERSION, PROTOCOL_SKEW, PROTOCOL_VERSION};
use kube::CustomResourceExt;
use serde::Serialize;

/// The first line of `fleetwatch version`, also what `--version` prints after the name.
pub const VERSION_LINE: &str = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("FLEETWATCH_GIT_COMMIT"), ")");

/// `fleetwatch version`'s arguments.
#[derive(clap::Args)]
pub struct VersionArgs {
    /// Output: text, or one JSON or YAML document (for scripts comparing builds).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum Output {
    Text,
    Json,
    Yaml,
}

/// What a build is and speaks.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Build {
    version: &'static str,
    commit: &'static str,
    protocol: Protocol,
    log_format: u32,
    cursor_store_format: u32,
    crds: Vec<Crd>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct Protocol {
    current: u32,
    oldest: u32,
    skew: u32,
}

#[derive(Debug, Serialize)]
struct Crd {
    name: String,
    versions: Vec<CrdVersion>,
}

#[derive(Debug, Serialize)]
struct CrdVersion {
    name: String,
    served: bool,
    storage: bool,
}

fn build() -> Build {
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
    Build {
        version: env!("CARGO_PKG_VERSION"),
        commit: env!("FLEETWATCH_GIT_COMMIT"),
        protocol: Protocol { current: PROTOCOL_VERSION, oldest: MIN_PROTOCOL_VERSION, skew: PROTOCOL_SKEW },
        log_format: fleetwatch_bus::LOG_FORMAT,
        cursor_store_format: fleetwatch_bus::CURSOR_STORE_FORMAT,
        crds: crds
            .into_iter()
            .map(|crd| Crd {
                name: crd.metadata.name.clone().unwrap_or_else(|| crd.spec.names.kind.clone()),
                versions: crd
                    .spec
                    .versions
                    .iter()
                    .map(|v| CrdVersion { name: v.name.clone(), served: v.served, storage: v.storage })
                    .collect(),
            })
            .collect(),
    }
}

/// Prints `fleetwatch version` as asked.
pub fn run(args: VersionArgs) -> anyhow::Result<()> {
    match args.output {
        Output::Text => print!("{}", text()),
        Output::Json => println!("{}", serde_json::to_string_pretty(&build())?),
        Output::Yaml => {
            let yaml = serde_saphyr::to_string(&build()).context("cannot render the version as YAML")?;
            println!("{}", yaml.trim_end());
        }
    }
    Ok(())
}

/// `fleetwatch version`'s text.
pub fn text() -> String {
    let b = build();
    let mut out = format!("fleetwatch {VERSION_LINE}\n");
    out.push_str(&format!(
        "protocol: {} (speaks {}..{}; skew policy: each release speaks its protocol and the {} before it)\n",
        b.protocol.current, b.protocol.oldest, b.protocol.current, b.protocol.skew
    ));
    out.push_str(&format!(
        "log format: fleetwatch-bus {} (the data directory's `format` file; a directory of format 1 is moved aside, a \
         newer one refused)\n",
        b.log_format
    ));
    out.push_str(&format!("cursor store format: {}\n", b.cursor_store_format));
    out.push_str("CRD versions:\n");
    for crd in &b.crds {
        let versions: Vec<String> = crd
            .versions
            .iter()
            .map(|v| {
                let tags: Vec<&str> = [(v.served, "served"), (v.storage, "storage")]
                    .into_iter()
                    .filter(|(on, _)| *on)
                    .map(|(_, t)| t)
                    .collect();
                format!("{} ({})", v.name, tags.join(", "))
            })
            .collect();
        out.push_str(&format!("  {}: {}\n", crd.name, versions.join(", ")));
    }
    out
}
