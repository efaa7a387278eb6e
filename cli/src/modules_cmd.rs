//! `fleetwatch modules`: the runtime cluster user's side of self-service modules. It lists
//! what the cluster's catalog offers (`kube-public/fleetwatch-catalog`) beside what runs (the
//! cluster-scoped `Module` objects and their status), and enables or disables a module by
//! creating or deleting its `Module` object. It talks to that cluster's API server only.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand, ValueEnum};
use fleetwatch_api::CustomResourcePolicy;
use fleetwatch_api::chosen::{ChosenBy, ChosenModuleStatus, Module, ModuleSpec, ModuleState, SOURCE_LABEL};
use futures_util::StreamExt;

use crate::status_cmd::columns;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};

/// The field manager of the `Module` objects this command writes.
pub const FIELD_MANAGER: &str = "fleetwatch-cli";
/// Namespace of the catalog ConfigMap (as the lifecycle operator writes it).
pub const CATALOG_NAMESPACE: &str = "kube-public";
/// Name of the catalog ConfigMap.
pub const CATALOG_NAME: &str = "fleetwatch-catalog";
/// The catalog's key in the ConfigMap.
pub const CATALOG_KEY: &str = "catalog.json";

/// `--help` of `fleetwatch modules`.
pub const LONG_ABOUT: &str = "\
Choose modules in a runtime cluster, as its user: list what the cluster's catalog offers beside
what runs, enable or disable a module. Only this cluster's API server is needed (--kubeconfig,
else $KUBECONFIG or ~/.kube/config, else the in-cluster configuration), never the control plane.

How it works: `enable NAME` creates the cluster-scoped Module object NAME
(modules.operator.fleetwatch.dev; `kubectl get modules` lists them too). That object is the
choice: the cluster's agent carries it to the control plane at once, the lifecycle operator
installs the module from the chosen channel (default: the cluster's) and writes its state,
version and any problem into the object's status (`enable --wait` follows it).
`disable NAME` deletes the object. With policy CreateAndDelete (the default) the operator
deletes the module's configuration, waits until no resource the module manages is left (the
object stays, in state Deleting, its message saying what is left), then removes the module;
with Ignore the module stays installed, no longer managed.

Central configuration takes precedence: the control plane decides which modules this cluster's
users may choose (`list` says \"not offered to this cluster\" for the others), and a module the
control plane lists for this cluster has a Module object with source `central`: its channel and
policy are set centrally, it cannot be enabled differently or disabled here.

Not to be confused with `fleetwatch module` (singular), which packages module versions as OCI
artifacts, for module authors.";

#[derive(Args)]
pub struct ModulesArgs {
    /// The runtime cluster's kubeconfig. Default: $KUBECONFIG, else ~/.kube/config, else the
    /// in-cluster configuration (as kubectl).
    #[arg(long, global = true, value_name = "FILE")]
    kubeconfig: Option<PathBuf>,
    /// The kubeconfig context to use instead of its current one.
    #[arg(long, global = true, value_name = "NAME")]
    context: Option<String>,
    #[command(subcommand)]
    command: ModulesCommand,
}

#[derive(Subcommand)]
enum ModulesCommand {
    /// What the catalog offers beside what runs, one row per module.
    ///
    /// The catalog's modules (channels with their versions, the cluster's default channel
    /// marked *, deprecations, whether this cluster's users may choose them) beside the Module
    /// objects (state, running version, channel in force, who chose it: user or central), and
    /// a note. A Module naming a module the catalog does not offer gets a row too.
    List(ListArgs),
    /// Choose a module: create its Module object (or change the one you created).
    ///
    /// Creates the Module object NAME, or updates the channel or policy of the one you created.
    /// Refused, naming the reason, for a module the catalog does not offer, one not offered to
    /// this cluster's users, a channel the module does not have, and a module the control
    /// plane lists for this cluster (source central).
    #[command(after_long_help = "\
Without --channel a new Module follows the cluster's default channel (`list` marks it with *);
an existing one keeps its channel, and its policy unless --policy is given. The object is
written by server-side apply, field manager fleetwatch-cli.

--wait follows the object's status until the operator has acted on this change (its
observedGeneration reaches the object's generation): exit 0 when the state is Ready, non-zero
with the status message when it is Error or Warning, or when --timeout passes first.")]
    Enable(EnableArgs),
    /// Give a module up: delete its Module object.
    ///
    /// With policy CreateAndDelete the module's configuration goes, the deletion waits until no
    /// resource it manages is left, then the module is removed; with Ignore it stays installed,
    /// unmanaged. Refused for a module the control plane lists (source central).
    #[command(after_long_help = "\
--wait waits until the object is gone, printing its status message while the removal waits
(e.g. for the module's managed resources to be deleted); --timeout bounds it, exiting non-zero.")]
    Disable(DisableArgs),
}

#[derive(Args)]
struct ListArgs {
    /// Output: a table, or the same data as one JSON or YAML document (for tools).
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Args)]
struct EnableArgs {
    /// The module (its name in the catalog; the Module object is named after it).
    name: String,
    /// The release channel (one the catalog lists for the module). Default: the cluster's.
    #[arg(long)]
    channel: Option<String>,
    /// What disabling the module will do: CreateAndDelete (delete its configuration, wait until
    /// no managed resource is left, remove the module) or Ignore (leave it installed).
    /// Default for a new object: CreateAndDelete.
    #[arg(long, value_enum)]
    policy: Option<Policy>,
    /// Wait until the operator has acted on it: exit 0 when Ready, non-zero when Error or
    /// Warning (the message says why).
    #[arg(long)]
    wait: bool,
    /// With --wait: how long at most, e.g. 90s, 5m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_timeout, requires = "wait")]
    timeout: Duration,
}

#[derive(Args)]
struct DisableArgs {
    /// The module.
    name: String,
    /// Wait until the Module object is gone (with CreateAndDelete: until the module's managed
    /// resources and the module are removed).
    #[arg(long)]
    wait: bool,
    /// With --wait: how long at most, e.g. 90s, 5m, 1h.
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = parse_timeout, requires = "wait")]
    timeout: Duration,
}

/// `--policy`, spelled as in the Module's `spec.customResourcePolicy`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
enum Policy {
    #[value(name = "CreateAndDelete")]
    CreateAndDelete,
    #[value(name = "Ignore")]
    Ignore,
}

impl From<Policy> for CustomResourcePolicy {
    fn from(p: Policy) -> Self {
        match p {
            Policy::CreateAndDelete => Self::CreateAndDelete,
            Policy::Ignore => Self::Ignore,
        }
    }
}

fn parse_timeout(s: &str) -> Result<Duration, String> {
    let d: jiff::SignedDuration = s.parse().map_err(|e| format!("{e} (expected e.g. 90s, 5m, 1h)"))?;
    if d.is_negative() || d.is_zero() {
        return Err("must be positive".into());
    }
    Duration::try_from(d).map_err(|e| e.to_string())
}

fn policy_name(p: CustomResourcePolicy) -> &'static str {
    match p {
        CustomResourcePolicy::CreateAndDelete => "CreateAndDelete",
        CustomResourcePolicy::Ignore => "Ignore",
    }
}

// ---------------------------------------------------------------------------------------
// The catalog and the listing

/// The catalog's `catalog.json` (lifecycle/src/catalog.rs writes it).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    /// The cluster's default channel.
    #[serde(default)]
    pub channel: String,
    /// Whether the cluster's users may choose modules at all.
    #[serde(default = "yes")]
    pub self_service: bool,
    /// The modules offered.
    #[serde(default)]
    pub modules: Vec<Offer>,
}

fn yes() -> bool {
    true
}

/// One module of the catalog.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Offer {
    /// The module's name.
    pub name: String,
    /// Channel → version.
    #[serde(default)]
    pub channels: BTreeMap<String, String>,
    /// Every version there is, oldest first.
    #[serde(default)]
    pub versions: Vec<String>,
    /// A version every cluster must run, whatever its channel.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<String>,
    /// Deprecated versions.
    #[serde(default)]
    pub deprecated: Vec<Deprecation>,
    /// Whether this cluster's users may choose it.
    #[serde(default = "yes")]
    pub self_service: bool,
}

/// A deprecated version.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct Deprecation {
    /// The version.
    pub version: String,
    /// Since when (a date).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub deprecation_date: Option<String>,
    /// Why, what to do.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}

impl Catalog {
    /// The cluster's default channel (`regular` when the catalog names none).
    pub fn default_channel(&self) -> &str {
        if self.channel.is_empty() { fleetwatch_api::DEFAULT_CHANNEL } else { &self.channel }
    }

    fn offer(&self, name: &str) -> Option<&Offer> {
        self.modules.iter().find(|m| m.name == name)
    }
}

/// What `list` shows, also its `-o json` / `-o yaml` document.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Listing {
    /// Which cluster: its API server and kubeconfig context.
    pub cluster: String,
    /// The cluster's default channel.
    pub default_channel: String,
    /// Whether the cluster's users may choose modules at all.
    pub self_service: bool,
    /// Whether the Module kind is installed in the cluster (the lifecycle operator installs
    /// it); when not, nothing chosen can be shown and nothing can be enabled yet.
    pub module_kind_installed: bool,
    /// One per module of the catalog, and one per Module object naming another module.
    pub modules: Vec<Row>,
}

/// One module: what the catalog says of it and its Module object.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Row {
    /// The module.
    pub name: String,
    /// Whether the catalog offers it.
    pub offered: bool,
    /// Whether this cluster's users may choose it.
    pub self_service: bool,
    /// Channel → version (empty when not offered).
    pub channels: BTreeMap<String, String>,
    /// Every version, oldest first.
    pub versions: Vec<String>,
    /// A version every cluster must run.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mandatory: Option<String>,
    /// Deprecated versions.
    pub deprecated: Vec<Deprecation>,
    /// Its Module object, when there is one.
    pub chosen: Option<Chosen>,
    /// The table's note column, as a list.
    pub notes: Vec<String>,
}

/// A Module object, as `list` reports it.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Chosen {
    /// Who chose it (the status's, else the central label's, else `user`).
    pub source: ChosenBy,
    /// The object's spec.
    pub spec: ModuleSpec,
    /// The object's status (none before the operator took it up).
    pub status: Option<ChosenModuleStatus>,
    /// The object's generation.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub generation: Option<i64>,
    /// Whether it is being deleted.
    pub deleting: bool,
}

/// Who chose the module of `m`: its status says, else the label the operator puts on central
/// objects, else the user (who created it).
pub fn source_of(m: &Module) -> ChosenBy {
    if let Some(s) = m.status.as_ref().and_then(|s| s.source) {
        return s;
    }
    if m.metadata.labels.as_ref().and_then(|l| l.get(SOURCE_LABEL)).map(String::as_str) == Some("central") {
        return ChosenBy::Central;
    }
    ChosenBy::User
}

fn module_name(m: &Module) -> &str {
    m.metadata.name.as_deref().unwrap_or_default()
}

/// The rows: one per catalog module, one per Module object naming another module; by name.
pub fn rows(catalog: &Catalog, objects: &[Module]) -> Vec<Row> {
    let mut by_name: BTreeMap<String, Row> = BTreeMap::new();
    for o in &catalog.modules {
        by_name.insert(
            o.name.clone(),
            Row {
                name: o.name.clone(),
                offered: true,
                self_service: catalog.self_service && o.self_service,
                channels: o.channels.clone(),
                versions: o.versions.clone(),
                mandatory: o.mandatory.clone(),
                deprecated: o.deprecated.clone(),
                chosen: None,
                notes: Vec::new(),
            },
        );
    }
    for m in objects {
        let name = module_name(m).to_string();
        let chosen = Chosen {
            source: source_of(m),
            spec: m.spec.clone(),
            status: m.status.clone(),
            generation: m.metadata.generation,
            deleting: m.metadata.deletion_timestamp.is_some(),
        };
        by_name
            .entry(name.clone())
            .or_insert_with(|| Row {
                name,
                offered: false,
                self_service: false,
                channels: BTreeMap::new(),
                versions: Vec::new(),
                mandatory: None,
                deprecated: Vec::new(),
                chosen: None,
                notes: Vec::new(),
            })
            .chosen = Some(chosen);
    }
    let mut out: Vec<Row> = by_name.into_values().collect();
    for r in &mut out {
        r.notes = notes(r);
    }
    out
}

/// The note column: what a user should know about the module, shortly.
fn notes(r: &Row) -> Vec<String> {
    let mut out = Vec::new();
    let status = r.chosen.as_ref().and_then(|c| c.status.as_ref());
    let running = status.and_then(|s| s.version.as_deref());
    if !r.offered {
        out.push("not in the catalog".to_string());
    } else if !r.self_service && r.chosen.as_ref().is_none_or(|c| c.source == ChosenBy::User) {
        out.push("not offered to this cluster".to_string());
    }
    if let Some(c) = &r.chosen {
        match status {
            None => out.push("not taken up yet (no status from the lifecycle operator)".to_string()),
            Some(s) => {
                if s.observed_generation.zip(c.generation).is_some_and(|(seen, generation)| seen < generation) {
                    out.push("change not taken up yet".to_string());
                }
                let says = matches!(
                    s.state,
                    Some(ModuleState::Error | ModuleState::Warning | ModuleState::Waiting | ModuleState::Deleting)
                );
                if says && !s.message.is_empty() {
                    out.push(s.message.clone());
                }
            }
        }
        if c.deleting && status.and_then(|s| s.state) != Some(ModuleState::Deleting) {
            out.push("being removed".to_string());
        }
    }
    let mut old = Vec::new();
    for d in &r.deprecated {
        if Some(d.version.as_str()) == running {
            let since = d.deprecation_date.as_deref().map(|t| format!(" since {t}")).unwrap_or_default();
            let why = d.message.as_deref().filter(|m| !m.is_empty()).map(|m| format!(": {m}")).unwrap_or_default();
            out.push(format!("running {} is deprecated{since}{why}", d.version));
        } else {
            old.push(d.version.as_str());
        }
    }
    if !old.is_empty() {
        out.push(format!("deprecated: {}", old.join(", ")));
    }
    out
}

fn channels_cell(r: &Row, default_channel: &str) -> String {
    if r.channels.is_empty() {
        return "-".into();
    }
    r.channels
        .iter()
        .map(|(c, v)| if c == default_channel { format!("{c}={v}*") } else { format!("{c}={v}") })
        .collect::<Vec<_>>()
        .join(" ")
}

/// The table, with the notes about the cluster under it.
pub fn render(l: &Listing) -> String {
    let mut table =
        vec![["MODULE", "CHANNELS", "STATE", "VERSION", "CHANNEL", "SOURCE", "NOTE"].map(String::from).to_vec()];
    for r in &l.modules {
        let status = r.chosen.as_ref().and_then(|c| c.status.as_ref());
        let dash = || "-".to_string();
        table.push(vec![
            r.name.clone(),
            channels_cell(r, &l.default_channel),
            status.and_then(|s| s.state).map_or_else(dash, |s| s.to_string()),
            status.and_then(|s| s.version.clone()).unwrap_or_else(dash),
            status
                .and_then(|s| s.channel.clone())
                .or_else(|| r.chosen.as_ref().and_then(|c| c.spec.channel.clone()))
                .unwrap_or_else(dash),
            r.chosen.as_ref().map_or_else(dash, |c| c.source.to_string()),
            r.notes.join("; "),
        ]);
    }
    let mut out = columns(&table);
    if l.modules.is_empty() {
        out.push_str("(the catalog offers no module)\n");
    }
    let _ = writeln!(
        out,
        "\n* the cluster's default channel ({}), which a module enabled without --channel follows",
        l.default_channel
    );
    if !l.self_service {
        out.push_str(
            "self-service is off for this cluster: its modules are chosen in the control plane only (its Runtime's \
             spec.selfService)\n",
        );
    }
    if !l.module_kind_installed {
        out.push_str(
            "the Module kind (modules.operator.fleetwatch.dev) is not installed in this cluster yet: the lifecycle \
             operator installs it when it reconciles the cluster's Runtime; until then nothing can be enabled\n",
        );
    }
    out
}

// ---------------------------------------------------------------------------------------
// The cluster

/// A client for the runtime cluster and how to name it in messages.
struct Cluster {
    client: kube::Client,
    /// `context NAME (https://host:port)`.
    what: String,
}

impl Cluster {
    async fn connect(kubeconfig: Option<&Path>, context: Option<&str>) -> anyhow::Result<Self> {
        let (kc, file) = match kubeconfig {
            Some(path) => (
                kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("cannot read --kubeconfig {}", path.display()))?,
                path.display().to_string(),
            ),
            None => match kube::config::Kubeconfig::read() {
                Ok(kc) => (kc, std::env::var("KUBECONFIG").unwrap_or_else(|_| "~/.kube/config".into())),
                Err(e) if context.is_none() => {
                    let config = kube::Config::incluster().map_err(|in_cluster| {
                        anyhow::anyhow!(
                            "no --kubeconfig given, and neither $KUBECONFIG or ~/.kube/config ({e}) nor an in-cluster \
                             configuration ({in_cluster}) is usable"
                        )
                    })?;
                    let what = format!("the in-cluster configuration ({})", server(&config));
                    let client = kube::Client::try_from(config).with_context(|| what.clone())?;
                    return Ok(Self { client, what });
                }
                Err(e) => return Err(e).context("no --kubeconfig given and $KUBECONFIG or ~/.kube/config unusable"),
            },
        };
        let name = context.map(str::to_string).or_else(|| kc.current_context.clone()).unwrap_or_default();
        let options = kube::config::KubeConfigOptions { context: context.map(str::to_string), ..Default::default() };
        let config = kube::Config::from_custom_kubeconfig(kc, &options)
            .await
            .with_context(|| format!("{file}: context {name:?} is not usable"))?;
        let what = format!("context {name} ({})", server(&config));
        let client = kube::Client::try_from(config).with_context(|| format!("{file}: {what}"))?;
        Ok(Self { client, what })
    }

    fn modules(&self) -> Api<Module> {
        Api::all(self.client.clone())
    }

    /// The catalog; a clear error when the cluster has none (not managed by fleetwatch).
    async fn catalog(&self) -> anyhow::Result<Catalog> {
        let cms: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(self.client.clone(), CATALOG_NAMESPACE);
        let where_ = format!("ConfigMap {CATALOG_NAMESPACE}/{CATALOG_NAME}");
        let cm = match cms.get_opt(CATALOG_NAME).await {
            Ok(Some(cm)) => cm,
            Ok(None) => bail!(
                "{}: no module catalog ({where_}): this cluster is not (yet) managed by fleetwatch, or its Runtime \
                 in the control plane has not been reconciled yet",
                self.what
            ),
            Err(e) => return Err(e).with_context(|| format!("{}: cannot read the module catalog {where_}", self.what)),
        };
        let text = cm
            .data
            .as_ref()
            .and_then(|d| d.get(CATALOG_KEY))
            .with_context(|| format!("{}: the module catalog {where_} has no key {CATALOG_KEY}", self.what))?;
        serde_json::from_str(text)
            .with_context(|| format!("{}: the module catalog {where_} ({CATALOG_KEY}) cannot be read", self.what))
    }

    /// Every Module object, `None` when the kind is not installed.
    async fn list_modules(&self) -> anyhow::Result<Option<Vec<Module>>> {
        let ar = kube::core::ApiResource::erase::<Module>(&());
        let api: Api<kube::api::DynamicObject> = Api::all_with(self.client.clone(), &ar);
        let list = match api.list(&ListParams::default()).await {
            Ok(l) => l,
            Err(kube::Error::Api(s)) if s.code == 404 => return Ok(None),
            Err(e) => return Err(e).with_context(|| format!("{}: cannot list the Module objects", self.what)),
        };
        let mut out = Vec::new();
        for obj in list.items {
            let name = obj.metadata.name.clone().unwrap_or_default();
            let m = serde_json::to_value(&obj)
                .and_then(serde_json::from_value::<Module>)
                .with_context(|| format!("{}: Module {name} cannot be read", self.what))?;
            out.push(m);
        }
        Ok(Some(out))
    }

    /// The Module object `name`; `Ok(None)` when there is none; an error when the kind is
    /// not installed.
    async fn get_module(&self, name: &str) -> anyhow::Result<Option<Module>> {
        match self.modules().get_opt(name).await {
            Ok(Some(m)) => Ok(Some(m)),
            // A 404: no such object, or no such kind.
            Ok(None) => match self.module_kind_served().await? {
                true => Ok(None),
                false => bail!(
                    "{}: the Module kind (modules.operator.fleetwatch.dev) is not installed in this cluster yet: the \
                     lifecycle operator installs it when it reconciles the cluster's Runtime",
                    self.what
                ),
            },
            Err(e) => Err(e).with_context(|| format!("{}: cannot read Module {name}", self.what)),
        }
    }

    /// Whether the Module kind is served.
    async fn module_kind_served(&self) -> anyhow::Result<bool> {
        match self.modules().list_metadata(&ListParams::default().limit(1)).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(false),
            Err(e) => Err(e).with_context(|| format!("{}: cannot list the Module objects", self.what)),
        }
    }
}

/// The API server's address, as people write it (no trailing slash).
fn server(config: &kube::Config) -> String {
    config.cluster_url.to_string().trim_end_matches('/').to_string()
}

// ---------------------------------------------------------------------------------------
// The commands

pub async fn run(args: ModulesArgs) -> anyhow::Result<()> {
    let cluster = Cluster::connect(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    match args.command {
        ModulesCommand::List(a) => list(&cluster, a).await,
        ModulesCommand::Enable(a) => enable(&cluster, a).await,
        ModulesCommand::Disable(a) => disable(&cluster, a).await,
    }
}

async fn list(cluster: &Cluster, args: ListArgs) -> anyhow::Result<()> {
    let catalog = cluster.catalog().await?;
    let objects = cluster.list_modules().await?;
    let listing = Listing {
        cluster: cluster.what.clone(),
        default_channel: catalog.default_channel().to_string(),
        self_service: catalog.self_service,
        module_kind_installed: objects.is_some(),
        modules: rows(&catalog, objects.as_deref().unwrap_or_default()),
    };
    match args.output {
        Output::Table => print!("{}", render(&listing)),
        Output::Json => println!("{}", serde_json::to_string_pretty(&listing)?),
        Output::Yaml => {
            let yaml = serde_saphyr::to_string(&listing).context("cannot render the listing as YAML")?;
            println!("{}", yaml.trim_end());
        }
    }
    Ok(())
}

/// Why `enable` refuses, `None` when it may go ahead. `existing` is the module's Module object.
pub fn refusal(catalog: &Catalog, name: &str, channel: Option<&str>, existing: Option<&Module>) -> Option<String> {
    let Some(offer) = catalog.offer(name) else {
        let offered: Vec<&str> = catalog.modules.iter().map(|m| m.name.as_str()).collect();
        let list = if offered.is_empty() { "nothing".to_string() } else { offered.join(", ") };
        return Some(format!("the catalog does not offer it (it offers: {list})"));
    };
    if existing.is_some_and(|m| source_of(m) == ChosenBy::Central) {
        return Some(
            "it is managed from the control plane (its Runtime lists it; Module source central): its channel and \
             policy are set there"
                .into(),
        );
    }
    if let Some(m) = existing.filter(|m| m.metadata.deletion_timestamp.is_some()) {
        let msg = m.status.as_ref().map(|s| s.message.as_str()).filter(|s| !s.is_empty());
        let msg = msg.map(|s| format!(" ({s})")).unwrap_or_default();
        return Some(format!(
            "it is being disabled{msg}: wait until its Module object is gone (`disable {name} --wait`), then enable it \
             again"
        ));
    }
    if !catalog.self_service {
        return Some(
            "self-service is off for this cluster (its Runtime's spec.selfService.enabled is false): its modules are \
             chosen in the control plane"
                .into(),
        );
    }
    if !offer.self_service {
        return Some(
            "it is not offered to this cluster's users (its Runtime's spec.selfService.modules does not include it)"
                .into(),
        );
    }
    let channels = || offer.channels.keys().map(String::as_str).collect::<Vec<_>>().join(", ");
    match channel {
        Some(c) if !offer.channels.contains_key(c) => {
            Some(format!("it has no channel {c:?} (its channels: {})", channels()))
        }
        None if !offer.channels.contains_key(catalog.default_channel()) => Some(format!(
            "it has no channel {:?}, the cluster's default: choose one with --channel ({})",
            catalog.default_channel(),
            channels()
        )),
        _ => None,
    }
}

async fn enable(cluster: &Cluster, args: EnableArgs) -> anyhow::Result<()> {
    let name = &args.name;
    let fail = |why: String| anyhow::anyhow!("{}: cannot enable module {name}: {why}", cluster.what);
    let catalog = cluster.catalog().await?;
    let existing = cluster.get_module(name).await?;
    // What the object will say: the flags, else what it says now.
    let channel = args.channel.clone().or_else(|| existing.as_ref().and_then(|m| m.spec.channel.clone()));
    let policy: CustomResourcePolicy = args
        .policy
        .map(Into::into)
        .or_else(|| existing.as_ref().map(|m| m.spec.custom_resource_policy))
        .unwrap_or_default();
    if let Some(why) = refusal(&catalog, name, channel.as_deref(), existing.as_ref()) {
        return Err(fail(why));
    }
    let mut spec = serde_json::json!({"customResourcePolicy": policy_name(policy)});
    if let Some(c) = &channel {
        spec["channel"] = serde_json::json!(c);
    }
    let object = serde_json::json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1",
        "kind": "Module",
        "metadata": {"name": name},
        "spec": spec,
    });
    let applied = cluster
        .modules()
        .patch(name, &PatchParams::apply(FIELD_MANAGER).force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("{}: cannot write Module {name}", cluster.what))?;
    let what = match &existing {
        None => "created",
        Some(m) if m.spec == applied.spec => "unchanged",
        Some(_) => "updated",
    };
    let channel_text = match &channel {
        Some(c) => format!("channel {c}"),
        None => format!("channel: the cluster's default, now {}", catalog.default_channel()),
    };
    println!("module {name}: Module {name} {what} ({channel_text}; policy {})", policy_name(policy));
    if !args.wait {
        println!(
            "the lifecycle operator installs it; `fleetwatch modules list` or `kubectl get module {name}` shows its state"
        );
        return Ok(());
    }
    let generation = applied.metadata.generation.unwrap_or(0);
    follow(cluster, name, args.timeout, |m| {
        let Some(m) = m else { return Verdict::Fail("its Module object was deleted".into()) };
        let Some(s) = &m.status else { return Verdict::Wait };
        if s.observed_generation.unwrap_or(0) < generation {
            return Verdict::Wait;
        }
        match s.state {
            Some(ModuleState::Ready) => Verdict::Done,
            Some(state @ (ModuleState::Error | ModuleState::Warning)) => {
                Verdict::Fail(format!("{state}: {}", s.message))
            }
            _ => Verdict::Wait,
        }
    })
    .await
}

async fn disable(cluster: &Cluster, args: DisableArgs) -> anyhow::Result<()> {
    let name = &args.name;
    let fail = |why: String| anyhow::anyhow!("{}: cannot disable module {name}: {why}", cluster.what);
    let Some(existing) = cluster.get_module(name).await? else {
        return Err(fail(
            "it is not enabled: there is no Module object of that name (`fleetwatch modules list` shows what runs)"
                .into(),
        ));
    };
    if source_of(&existing) == ChosenBy::Central {
        return Err(fail(
            "it is managed from the control plane (its Runtime lists it; Module source central): deleting its Module \
             object would leave it installed and the object would be put back; it is removed from the Runtime in the \
             control plane"
                .into(),
        ));
    }
    let policy =
        existing.status.as_ref().and_then(|s| s.custom_resource_policy).unwrap_or(existing.spec.custom_resource_policy);
    let already = existing.metadata.deletion_timestamp.is_some();
    match cluster.modules().delete(name, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 404 => {
            println!("module {name}: its Module object is gone");
            return Ok(());
        }
        Err(e) => return Err(e).with_context(|| format!("{}: cannot delete Module {name}", cluster.what)),
    }
    let what = if already { "was already being deleted" } else { "deleted" };
    let effect = match policy {
        CustomResourcePolicy::CreateAndDelete => {
            "policy CreateAndDelete: the module's configuration is deleted, the removal waits until no resource the \
             module manages is left, then the module is removed"
        }
        CustomResourcePolicy::Ignore => "policy Ignore: the module stays installed, no longer managed",
    };
    println!("module {name}: Module {name} {what} ({effect})");
    if !args.wait {
        return Ok(());
    }
    follow(cluster, name, args.timeout, |m| match m {
        None => Verdict::Done,
        Some(_) => Verdict::Wait,
    })
    .await
}

/// What [`follow`] makes of the object's current state.
enum Verdict {
    Wait,
    Done,
    Fail(String),
}

/// One line about the object's state: `Processing 1.10.0: installing` / `gone`.
fn state_line(m: Option<&Module>) -> String {
    let Some(m) = m else { return "gone".into() };
    let Some(s) = &m.status else { return "no status yet (waiting for the lifecycle operator)".into() };
    let mut line = s.state.map_or_else(|| "no state".to_string(), |st| st.to_string());
    if let Some(v) = &s.version {
        let _ = write!(line, " {v}");
    }
    if !s.message.is_empty() {
        let _ = write!(line, ": {}", s.message);
    }
    line
}

/// Watches Module `name` until `judge` says done or failed, printing each new state, at most
/// `timeout`.
async fn follow(
    cluster: &Cluster,
    name: &str,
    timeout: Duration,
    judge: impl Fn(Option<&Module>) -> Verdict,
) -> anyhow::Result<()> {
    let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
    let stream = fleetwatch_client::kube_watch::relisting_watcher(cluster.modules(), config);
    futures_util::pin_mut!(stream);
    let mut last_line = String::new();
    let mut current: Option<Module> = None;
    let mut seen = false;
    let mut listed: Option<Module> = None;
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        let next = match tokio::time::timeout_at(deadline, stream.next()).await {
            Ok(Some(ev)) => ev,
            Ok(None) => bail!("{}: the watch of Module {name} ended", cluster.what),
            Err(_) => bail!(
                "{}: module {name}: gave up waiting after {} (now: {})",
                cluster.what,
                humanize(timeout),
                if seen {
                    state_line(current.as_ref())
                } else {
                    "not listed yet, the API server did not answer".into()
                }
            ),
        };
        let changed = match next {
            Ok(watcher::Event::Init) => {
                listed = None;
                false
            }
            Ok(watcher::Event::InitApply(m)) => {
                listed = Some(m);
                false
            }
            Ok(watcher::Event::InitDone) => {
                current = listed.take();
                true
            }
            Ok(watcher::Event::Apply(m)) => {
                current = Some(m);
                true
            }
            Ok(watcher::Event::Delete(_)) => {
                current = None;
                true
            }
            Err(e) => {
                eprintln!("{}: watching Module {name}: {e} (watching again)", cluster.what);
                false
            }
        };
        if !changed {
            continue;
        }
        seen = true;
        let line = state_line(current.as_ref());
        if line != last_line {
            println!("module {name}: {line}");
            last_line = line;
        }
        match judge(current.as_ref()) {
            Verdict::Wait => {}
            Verdict::Done => return Ok(()),
            Verdict::Fail(why) => bail!("{}: module {name}: {why}", cluster.what),
        }
    }
}

fn humanize(d: Duration) -> String {
    jiff::SignedDuration::try_from(d).map_or_else(|_| format!("{d:?}"), |s| format!("{s:#}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::chosen::ChosenModuleStatus;

    fn catalog() -> Catalog {
        serde_json::from_value(serde_json::json!({
            "channel": "regular",
            "selfService": true,
            "modules": [
                {"name": "redis", "channels": {"fast": "1.11.0", "regular": "1.10.0"}, "versions": ["1.9.0", "1.10.0", "1.11.0"],
                 "mandatory": null, "selfService": true,
                 "deprecated": [{"version": "1.9.0", "deprecationDate": "2030-01-01", "message": "move to 1.10"}]},
                {"name": "keda", "channels": {"fast": "2.15.0"}, "versions": ["2.15.0"], "mandatory": null, "deprecated": [], "selfService": true},
                {"name": "istio", "channels": {"regular": "1.22.0"}, "versions": ["1.22.0"], "mandatory": null, "deprecated": [], "selfService": false}
            ]
        }))
        .unwrap()
    }

    fn object(name: &str, status: Option<ChosenModuleStatus>) -> Module {
        let mut m = Module::new(name, ModuleSpec::default());
        m.metadata.generation = Some(1);
        m.status = status;
        m
    }

    fn listing(objects: &[Module]) -> Listing {
        let c = catalog();
        Listing {
            cluster: "context rt-1 (https://127.0.0.1:1)".into(),
            default_channel: c.default_channel().into(),
            self_service: c.self_service,
            module_kind_installed: true,
            modules: rows(&c, objects),
        }
    }

    #[test]
    fn the_table_shows_offers_beside_what_runs() {
        let running = object(
            "redis",
            Some(ChosenModuleStatus {
                state: Some(ModuleState::Ready),
                version: Some("1.9.0".into()),
                channel: Some("regular".into()),
                source: Some(ChosenBy::User),
                observed_generation: Some(1),
                ..Default::default()
            }),
        );
        let unknown = object(
            "nosuch",
            Some(ChosenModuleStatus {
                state: Some(ModuleState::Error),
                source: Some(ChosenBy::User),
                message: "no module nosuch is offered".into(),
                observed_generation: Some(1),
                ..Default::default()
            }),
        );
        let out = render(&listing(&[running, unknown]));
        let lines: Vec<&str> = out.lines().collect();
        let cells =
            |l: &str| l.split("  ").map(str::trim).filter(|c| !c.is_empty()).map(String::from).collect::<Vec<_>>();
        assert_eq!(cells(lines[0]), ["MODULE", "CHANNELS", "STATE", "VERSION", "CHANNEL", "SOURCE", "NOTE"]);
        assert_eq!(cells(lines[1]), ["istio", "regular=1.22.0*", "-", "-", "-", "-", "not offered to this cluster"]);
        assert_eq!(cells(lines[2]), ["keda", "fast=2.15.0", "-", "-", "-", "-"]);
        assert_eq!(
            cells(lines[3]),
            ["nosuch", "-", "Error", "-", "-", "user", "not in the catalog; no module nosuch is offered"]
        );
        assert_eq!(
            cells(lines[4]),
            [
                "redis",
                "fast=1.11.0 regular=1.10.0*",
                "Ready",
                "1.9.0",
                "regular",
                "user",
                "running 1.9.0 is deprecated since 2030-01-01: move to 1.10"
            ]
        );
        assert!(out.contains("* the cluster's default channel (regular)"), "{out}");
        assert!(!out.contains("not installed"), "{out}");
        // The columns line up: every row's STATE starts where the header's does.
        let col = lines[0].find("STATE").unwrap();
        for l in &lines[1..5] {
            assert_ne!(&l[col..col + 1], " ", "{out}");
        }
    }

    #[test]
    fn notes_say_what_needs_saying() {
        let mut central = object(
            "istio",
            Some(ChosenModuleStatus {
                state: Some(ModuleState::Waiting),
                source: Some(ChosenBy::Central),
                message: "waiting for the maintenance window".into(),
                observed_generation: Some(1),
                ..Default::default()
            }),
        );
        central.metadata.generation = Some(1);
        let mut deleting = object(
            "redis",
            Some(ChosenModuleStatus {
                state: Some(ModuleState::Deleting),
                version: Some("1.10.0".into()),
                source: Some(ChosenBy::User),
                message: "waiting: 3 RedisConfig objects left".into(),
                observed_generation: Some(1),
                ..Default::default()
            }),
        );
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time("2030-01-01T00:00:00Z".parse().unwrap()));
        let mut fresh = object("keda", None);
        fresh.spec.channel = Some("fast".into());
        let l = listing(&[central, deleting, fresh]);
        let by = |n: &str| l.modules.iter().find(|r| r.name == n).unwrap();
        // A central module not offered to users is no problem: the control plane chose it.
        assert_eq!(by("istio").notes, ["waiting for the maintenance window"]);
        assert_eq!(by("redis").notes, ["waiting: 3 RedisConfig objects left", "deprecated: 1.9.0"]);
        assert_eq!(by("keda").notes, ["not taken up yet (no status from the lifecycle operator)"]);
        let out = render(&l);
        let keda = out.lines().find(|l| l.starts_with("keda")).unwrap();
        assert!(keda.contains(" fast ") && keda.contains(" user "), "the spec's channel before any status: {out}");
    }

    #[test]
    fn a_listing_without_the_module_kind_or_self_service_says_so() {
        let mut l = listing(&[]);
        l.module_kind_installed = false;
        l.self_service = false;
        let out = render(&l);
        assert!(out.contains("the Module kind (modules.operator.fleetwatch.dev) is not installed"), "{out}");
        assert!(out.contains("self-service is off for this cluster"), "{out}");
        let json = serde_json::to_value(&l).unwrap();
        assert_eq!(json["moduleKindInstalled"], false);
        assert_eq!(json["modules"][2]["channels"]["fast"], "1.11.0");
        assert_eq!(json["modules"][2]["chosen"], serde_json::Value::Null);
    }

    #[test]
    fn refusals_name_the_reason() {
        let c = catalog();
        assert_eq!(refusal(&c, "redis", None, None), None);
        assert_eq!(refusal(&c, "redis", Some("fast"), None), None);
        let r = |name: &str, ch: Option<&str>, m: Option<&Module>| refusal(&c, name, ch, m).unwrap();
        assert_eq!(r("nosuch", None, None), "the catalog does not offer it (it offers: redis, keda, istio)");
        assert!(r("istio", None, None).starts_with("it is not offered to this cluster's users"));
        assert_eq!(r("redis", Some("slow"), None), "it has no channel \"slow\" (its channels: fast, regular)");
        assert!(r("keda", None, None).starts_with("it has no channel \"regular\", the cluster's default"));
        let mut central = object("redis", None);
        central.metadata.labels = Some([(SOURCE_LABEL.to_string(), "central".to_string())].into());
        assert!(r("redis", None, Some(&central)).starts_with("it is managed from the control plane"));
        let mut off = c.clone();
        off.self_service = false;
        assert!(refusal(&off, "redis", None, None).unwrap().starts_with("self-service is off"));
    }

    #[test]
    fn timeouts_parse() {
        assert_eq!(parse_timeout("90s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_timeout("5m"), Ok(Duration::from_secs(300)));
        assert!(parse_timeout("0s").is_err() && parse_timeout("soon").is_err());
        assert_eq!(humanize(Duration::from_secs(300)), "5m");
    }
}
