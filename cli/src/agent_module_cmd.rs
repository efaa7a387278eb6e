//! `fleetwatch agent-module`: the agent's ModuleTemplate and ModuleReleaseMeta, rendered
//! from its one manifest source (`deploy/manifests/agent.yaml`, the agent chart rendered), for the
//! lifecycle operator's built-in agent installation (`lifecycle --agent-ca-secret`).

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct AgentModuleArgs {
    /// The hub address agents connect to, as wss://HOST:PORT (repeat or separate with
    /// commas for several replicas). It must be reachable from the runtime clusters and
    /// named in the hub's certificate.
    #[arg(long, value_delimiter = ',', required = true)]
    hub: Vec<String>,
    /// The control-plane namespace of the Runtimes (templates are looked up there).
    #[arg(long, default_value = "kcp")]
    namespace: String,
    /// The module version (default: this binary's version).
    #[arg(long, default_value = env!("CARGO_PKG_VERSION"))]
    module_version: String,
    /// The agent's container image, as runtime clusters pull it: the image you built from
    /// the Dockerfile and pushed (e.g. registry.example.com/fleetwatch:0.1.0; docs/deploy.md
    /// "The image"). Set it: the default is the manifest's placeholder
    /// (ghcr.io/fleetwatch/fleetwatch:VERSION), which is not published, so agents would stay
    /// in ImagePullBackOff.
    #[arg(long, value_name = "IMAGE")]
    image: Option<String>,
}

pub fn run(args: AgentModuleArgs) -> anyhow::Result<()> {
    fleetwatch_client::transport::HubUrls::parse_all(&args.hub)?;
    semver::Version::parse(&args.module_version)
        .with_context(|| format!("--module-version {:?} is not a semantic version", args.module_version))?;
    let spec = fleetwatch_lifecycle::agent_module::ModuleSpec {
        namespace: args.namespace,
        version: args.module_version,
        hub: args.hub,
        image: args.image,
    };
    let objects = fleetwatch_lifecycle::agent_module::render(&spec)?;
    let mut out = String::new();
    for o in &objects {
        out.push_str("---\n");
        out.push_str(&serde_saphyr::to_string(o).context("cannot render YAML")?);
    }
    print!("{out}");
    Ok(())
}
