//! `fleetwatch module`: package a module version as an OCI artifact and push it
//! (`package`), or show what an artifact holds (`inspect`). docs/modules.md describes the
//! artifact.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use fleetwatch_lifecycle::artifact::credentials::Helpers;
use fleetwatch_lifecycle::artifact::registry::{Registry, RegistryOptions, parse_reference, pinned};
use fleetwatch_lifecycle::artifact::{ModuleArtifact, parse_documents, parse_kind_ref, validate_object};

#[derive(Args)]
pub struct ModuleArgs {
    #[command(subcommand)]
    command: ModuleCommand,
}

#[derive(Subcommand)]
enum ModuleCommand {
    /// Package a module version (a directory of YAML, or a Helm chart rendered now with
    /// `helm template`), push it to an OCI registry, and print the ModuleTemplate that
    /// installs it, pinned by digest.
    Package(Box<PackageArgs>),
    /// Pull an artifact, check every digest, and show what it holds.
    Inspect(InspectArgs),
}

#[derive(Args)]
#[command(group(clap::ArgGroup::new("source").required(true).args(["dir", "chart"])))]
#[command(disable_version_flag = true)]
struct PackageArgs {
    /// A directory of Kubernetes objects: every *.yaml, *.yml and *.json file under it, in
    /// path order (documents separated by `---`; `kind: List` gives its items).
    #[arg(long, value_name = "DIR")]
    dir: Option<PathBuf>,
    /// A Helm chart (a directory or .tgz), rendered here with `helm template NAME CHART
    /// --namespace MANAGER_NAMESPACE --include-crds`; the operator never runs Helm.
    #[arg(long, value_name = "CHART")]
    chart: Option<String>,
    /// Values for the chart (repeatable, later files win), as `helm template --values`.
    #[arg(long = "values", value_name = "FILE", requires = "chart")]
    values: Vec<PathBuf>,
    /// Do not add the chart's target Namespace (the manager's) to the artifact. By default
    /// it is added when the chart does not render it, as `helm install --create-namespace`
    /// would: without it every install fails until someone creates the namespace.
    #[arg(long, requires = "chart")]
    no_create_namespace: bool,
    /// The helm binary.
    #[arg(long, env = "FLEETWATCH_HELM", default_value = "helm", value_name = "PATH")]
    helm: PathBuf,
    /// The module's name (a DNS label; the ModuleReleaseMeta's `moduleName`).
    #[arg(long)]
    name: String,
    /// The module version (semver). It is also set as the manager's
    /// `app.kubernetes.io/version` label, the version the operator sees running.
    #[arg(long = "version", id = "module_version", value_name = "VERSION")]
    version: String,
    /// The manager workload: a Deployment (apps/v1) among the objects, as NAMESPACE/NAME.
    #[arg(long, value_name = "NAMESPACE/NAME")]
    manager: String,
    /// The default configuration: a file with one Kubernetes object, created once at install.
    #[arg(long, value_name = "FILE")]
    default_config: Option<PathBuf>,
    /// An upgrade to this version needs downtime: it waits for a maintenance window.
    #[arg(long)]
    requires_downtime: bool,
    /// A module this version needs installed and Ready in the same runtime first, as NAME
    /// or NAME@RANGE (a semver range: `istio@>=1.20, <2`). Repeatable. Written into the
    /// printed ModuleTemplate's `spec.requires`.
    #[arg(long = "requires", value_name = "NAME[@RANGE]", value_parser = parse_requirement)]
    requires: Vec<fleetwatch_api::ModuleRequirement>,
    /// A kind whose instances block the module's deletion, as GROUP/VERSION/KIND (core
    /// group: v1/KIND). Repeatable.
    #[arg(long = "managed-resource", value_name = "GROUP/VERSION/KIND")]
    managed_resources: Vec<String>,
    /// Where to push: REGISTRY/REPOSITORY:TAG (the tag is usually the version). The
    /// printed ModuleTemplate names the pushed digest, not the tag.
    #[arg(long, value_name = "REF")]
    push: String,
    /// The namespace of the printed ModuleTemplate (the Runtimes' control-plane namespace).
    #[arg(long, default_value = "kcp")]
    namespace: String,
    #[command(flatten)]
    registry: RegistryArgs,
}

#[derive(Args)]
struct InspectArgs {
    /// The artifact: REGISTRY/REPOSITORY:TAG or REGISTRY/REPOSITORY@sha256:…
    #[arg(value_name = "REF")]
    reference: String,
    /// Print the objects too, as YAML documents after the summary.
    #[arg(long)]
    objects: bool,
    #[command(flatten)]
    registry: RegistryArgs,
}

/// How to reach the registry: the flags `package` and `inspect` share.
#[derive(Args)]
pub(crate) struct RegistryArgs {
    /// Registry credentials: a Docker config file (the `.dockerconfigjson` key of a
    /// kubernetes.io/dockerconfigjson Secret will do). Without it, Docker's own config
    /// ($DOCKER_CONFIG/config.json, else ~/.docker/config.json) when there is one. Its
    /// `credHelpers` and `credsStore` are run as Docker runs them
    /// (`docker-credential-NAME get`, e.g. ecr-login, gcr, acr-env). Anonymous when the
    /// config has nothing for the registry.
    #[arg(long, env = "FLEETWATCH_REGISTRY_AUTH", value_name = "FILE")]
    registry_auth: Option<PathBuf>,
    /// A CA certificate bundle (PEM) trusted for registries besides the system's
    /// (repeatable).
    #[arg(long, value_name = "FILE")]
    registry_ca: Vec<PathBuf>,
    /// A registry (HOST[:PORT]) reached over plain HTTP (repeatable). Loopback registries
    /// that do not speak TLS are reached over plain HTTP without it, as Docker does.
    #[arg(long, value_name = "HOST[:PORT]")]
    insecure_registry: Vec<String>,
}

impl RegistryArgs {
    fn registry(&self) -> anyhow::Result<Registry> {
        Ok(Registry::new(self.options()?))
    }

    /// The registry options the flags give (files read now).
    pub(crate) fn options(&self) -> anyhow::Result<RegistryOptions> {
        let mut options = RegistryOptions { insecure: self.insecure_registry.clone(), ..RegistryOptions::default() };
        for ca in &self.registry_ca {
            let pem = std::fs::read(ca).with_context(|| format!("--registry-ca {}", ca.display()))?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                bail!("--registry-ca {}: no PEM certificate in it", ca.display());
            }
            options.ca_pem.push(pem);
        }
        options.helpers = Helpers::Run;
        if let Some(path) = &self.registry_auth {
            options.docker_config =
                Some(read_docker_config(path).with_context(|| format!("--registry-auth {}", path.display()))?);
        } else if let Some(path) = docker_config_path().filter(|p| p.exists()) {
            options.docker_config =
                Some(read_docker_config(&path).with_context(|| format!("Docker's config {}", path.display()))?);
        }
        Ok(options)
    }
}

/// The most a Docker config may take: one holds a few credentials; more is not one.
const DOCKER_CONFIG_MAX_BYTES: u64 = 1 << 20;

/// Reads a Docker config, refusing more than [`DOCKER_CONFIG_MAX_BYTES`] (counted as read).
fn read_docker_config(path: &Path) -> anyhow::Result<Vec<u8>> {
    use std::io::Read;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.take(DOCKER_CONFIG_MAX_BYTES + 1).read_to_end(&mut bytes)?;
    if bytes.len() as u64 > DOCKER_CONFIG_MAX_BYTES {
        bail!("larger than {} KiB: not a Docker config", DOCKER_CONFIG_MAX_BYTES >> 10);
    }
    Ok(bytes)
}

/// Where Docker keeps its config: `$DOCKER_CONFIG/config.json`, else `~/.docker/config.json`.
fn docker_config_path() -> Option<PathBuf> {
    match std::env::var_os("DOCKER_CONFIG").filter(|d| !d.is_empty()) {
        Some(dir) => Some(PathBuf::from(dir).join("config.json")),
        None => {
            std::env::var_os("HOME").filter(|h| !h.is_empty()).map(|h| PathBuf::from(h).join(".docker/config.json"))
        }
    }
}

pub async fn run(args: ModuleArgs) -> anyhow::Result<()> {
    match args.command {
        ModuleCommand::Package(a) => package(*a).await,
        ModuleCommand::Inspect(a) => inspect(a).await,
    }
}

async fn package(args: PackageArgs) -> anyhow::Result<()> {
    // Parse the reference first: a typo should not cost a chart rendering.
    let reference = parse_reference(&args.push).context("--push")?;
    let registry = args.registry.registry()?;
    let objects = match (&args.dir, &args.chart) {
        (Some(dir), _) => read_dir(dir)?,
        (None, Some(chart)) => render_chart(&args, chart)?,
        (None, None) => bail!("give --dir or --chart"),
    };
    let mut artifact = ModuleArtifact::new(&args.name, &args.version, &args.manager, objects)?;
    artifact.requires_downtime = args.requires_downtime;
    artifact.managed_resources = args
        .managed_resources
        .iter()
        .map(|k| parse_kind_ref(k))
        .collect::<Result<_, _>>()
        .context("--managed-resource")?;
    if let Some(path) = &args.default_config {
        let origin = format!("--default-config {}", path.display());
        let text = std::fs::read_to_string(path).with_context(|| origin.clone())?;
        let mut docs = parse_documents(&text, &origin)?;
        if docs.len() != 1 {
            bail!("{origin}: {} objects, expected one", docs.len());
        }
        let config = docs.remove(0);
        validate_object(&config, &origin)?;
        artifact.default_config = Some(config);
    }
    artifact.validate()?;
    let digest = registry.push(&args.push, &artifact).await?;
    let pinned = pinned(&reference, &digest);
    let mut template = artifact.module_template(&args.namespace, &pinned);
    if !args.requires.is_empty() {
        template["spec"]["requires"] = serde_json::to_value(&args.requires).context("--requires")?;
    }
    eprintln!("pushed {pinned} ({} objects)", artifact.objects.len());
    print!("{}", serde_saphyr::to_string(&template).context("cannot render the ModuleTemplate as YAML")?);
    Ok(())
}

async fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    let registry = args.registry.registry()?;
    let (artifact, digest) = registry.pull(&args.reference).await?;
    let reference = parse_reference(&args.reference)?;
    println!("artifact:          {}", pinned(&reference, &digest));
    print!("{artifact}");
    if args.objects {
        for o in &artifact.objects {
            println!("---");
            print!("{}", serde_saphyr::to_string(o).context("cannot render YAML")?);
        }
    }
    Ok(())
}

/// Every *.yaml, *.yml, *.json file under `dir`, in path order, as objects.
fn read_dir(dir: &Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let mut files = Vec::new();
    collect(dir, &mut files).with_context(|| format!("--dir {}", dir.display()))?;
    files.sort();
    let mut objects = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f).with_context(|| format!("cannot read {}", f.display()))?;
        objects.extend(parse_documents(&text, &f.display().to_string())?);
    }
    if objects.is_empty() {
        bail!("--dir {}: no Kubernetes objects found (in {} *.yaml, *.yml, *.json files)", dir.display(), files.len());
    }
    Ok(objects)
}

fn collect(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    for entry in std::fs::read_dir(dir)? {
        let path = entry?.path();
        if path.is_dir() {
            collect(&path, out)?;
        } else if path.extension().and_then(|e| e.to_str()).is_some_and(|e| matches!(e, "yaml" | "yml" | "json")) {
            out.push(path);
        }
    }
    Ok(())
}

/// `helm template` of the chart, as objects.
fn render_chart(args: &PackageArgs, chart: &str) -> anyhow::Result<Vec<serde_json::Value>> {
    let namespace = args.manager.split_once('/').map(|(n, _)| n).unwrap_or("default");
    let mut cmd = std::process::Command::new(&args.helm);
    cmd.args(["template", &args.name, chart, "--namespace", namespace, "--include-crds"]);
    for v in &args.values {
        cmd.arg("--values").arg(v);
    }
    let out = cmd.output().with_context(|| format!("cannot run {} (set --helm)", args.helm.display()))?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        let reason = stderr.lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or("no message");
        bail!("--chart {chart}: helm template failed: {reason}");
    }
    let text = String::from_utf8(out.stdout).context("helm template printed something that is not UTF-8")?;
    let mut objects = parse_documents(&text, &format!("--chart {chart} (helm template output)"))?;
    if objects.is_empty() {
        bail!("--chart {chart}: the chart renders no Kubernetes objects");
    }
    if !args.no_create_namespace
        && let Some(ns) = with_namespace(&mut objects, namespace)
    {
        eprintln!(
            "added Namespace {ns} to the artifact: the chart's target namespace, as `helm install --create-namespace` would (--no-create-namespace leaves it out)"
        );
    }
    Ok(objects)
}

/// Puts Namespace `namespace` first into `objects` unless they hold it; its name when added.
fn with_namespace(objects: &mut Vec<serde_json::Value>, namespace: &str) -> Option<String> {
    let has = objects.iter().any(|o| o["kind"] == "Namespace" && o["metadata"]["name"] == namespace);
    if has {
        return None;
    }
    let ns = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}});
    objects.insert(0, ns);
    Some(namespace.to_string())
}

/// `NAME` or `NAME@RANGE` of `--requires`.
fn parse_requirement(s: &str) -> Result<fleetwatch_api::ModuleRequirement, String> {
    let (module, versions) = match s.split_once('@') {
        Some((m, r)) => (m.trim(), Some(r.trim().to_string())),
        None => (s.trim(), None),
    };
    let dns_label = !module.is_empty()
        && module.len() <= 63
        && module.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && !module.starts_with('-')
        && !module.ends_with('-');
    if !dns_label {
        return Err(format!("{module:?} is not a module name (a DNS label); give NAME or NAME@RANGE"));
    }
    if let Some(r) = &versions {
        semver::VersionReq::parse(r)
            .map_err(|e| format!("{r:?} is not a semver range ({e}); e.g. istio@>=1.20, <2"))?;
    }
    Ok(fleetwatch_api::ModuleRequirement { module: module.to_string(), versions })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requirements_parse_as_name_or_name_at_range() {
        let r = parse_requirement("istio@>=1.20, <2").unwrap();
        assert_eq!((r.module.as_str(), r.versions.as_deref()), ("istio", Some(">=1.20, <2")));
        assert_eq!(parse_requirement("cert-manager").unwrap().versions, None);
        assert!(parse_requirement("Istio").unwrap_err().contains("not a module name"));
        assert!(parse_requirement("istio@latest").unwrap_err().contains("not a semver range"));
        assert!(parse_requirement("@1.0").is_err());
    }

    #[test]
    fn a_charts_target_namespace_is_added_once_and_first() {
        let cm =
            serde_json::json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ksm"}});
        let mut objects = vec![cm.clone()];
        assert_eq!(with_namespace(&mut objects, "ksm").as_deref(), Some("ksm"));
        assert_eq!(objects[0]["kind"], "Namespace");
        assert_eq!(objects.len(), 2);
        assert_eq!(with_namespace(&mut objects, "ksm"), None);
        assert_eq!(objects.len(), 2);
    }
}
