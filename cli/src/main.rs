//! `fleetwatch`: one binary, a subcommand per role. Wiring only; the work is in the libraries.

mod agent_cmd;
mod agent_module_cmd;
mod certs_cmd;
mod crds_cmd;
mod hub_cmd;
mod lifecycle_cmd;
mod log_filter;
mod maintenance_cmd;
mod module_cmd;
mod modules_cmd;
mod relay_cmd;
#[cfg(not(feature = "sandbox"))]
mod sandbox_missing;
mod shell_cmd;
mod size;
mod status_cmd;
mod tail_cmd;
#[cfg(feature = "sandbox")]
mod up_cmd;
mod version_cmd;

use clap::{Parser, Subcommand};

/// fleetwatch keeps the modules of a fleet of Kubernetes clusters in their desired state,
/// event-driven: agents in runtime clusters stream changes over mutual TLS to a hub,
/// which never loses an event and fans them out to subscribers.
#[derive(Parser)]
#[command(name = "fleetwatch", version = version_cmd::VERSION_LINE, propagate_version = true)]
struct Cli {
    /// Log filter: a level (trace, debug, info, warn, error, off), and targets with their
    /// level, comma-separated (e.g. `info,fleetwatch_hub=debug`). A word that is neither is
    /// refused. RUST_LOG, when set, takes precedence and is checked the same way.
    #[arg(long, global = true, env = "FLEETWATCH_LOG", default_value = "info", value_parser = log_filter::parse)]
    log: String,
    /// Log as JSON lines instead of text.
    #[arg(long, global = true)]
    log_json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Start the local sandbox: a simulated control plane and runtime clusters, the hub,
    /// agents, the lifecycle operator and sample modules (one of them offered to the runtime
    /// clusters' users, enabled with a `Module` in their cluster), with a live table.
    #[cfg(feature = "sandbox")]
    Up(up_cmd::UpArgs),
    /// The local sandbox: not in this build (built without the `sandbox` feature).
    #[cfg(not(feature = "sandbox"))]
    Up(sandbox_missing::Args),
    /// Create a CA and issue hub, agent and subscriber certificates.
    Certs(certs_cmd::CertsArgs),
    /// Write the CRD manifests generated from the Rust types (deploy/crds).
    Crds(crds_cmd::CrdsArgs),
    /// Run the hub: serve agents and subscribers over wss with mutual TLS.
    Hub(hub_cmd::HubArgs),
    /// Run an agent: stream a cluster's changes to the hub.
    Agent(agent_cmd::AgentArgs),
    /// Run the module lifecycle operator: keep each Runtime's modules in their desired state.
    Lifecycle(lifecycle_cmd::LifecycleArgs),
    /// Print the agent's ModuleTemplate and ModuleReleaseMeta (YAML) for `lifecycle
    /// --agent-ca-secret`, which installs it into every Runtime's cluster.
    AgentModule(agent_module_cmd::AgentModuleArgs),
    /// For module authors: package a module version as an OCI artifact and push it
    /// (`module package`), or show what an artifact holds (`module inspect`).
    Module(module_cmd::ModuleArgs),
    /// For a runtime cluster's users: list the modules its catalog offers beside what runs,
    /// enable or disable one (creates or deletes its Module object); talks to that cluster only.
    #[command(long_about = modules_cmd::LONG_ABOUT)]
    Modules(modules_cmd::ModulesArgs),
    /// Print events from the hub, one JSON document per line.
    Tail(tail_cmd::TailArgs),
    /// Relay events to another system (lifecycle-manager's listener, a CloudEvents webhook),
    /// acknowledging the hub only after the target accepted them.
    Relay(relay_cmd::RelayArgs),
    /// Show the fleet (clusters, watches, subscriber lag, modules by state); exits 1 when
    /// something is unhealthy, 2 when the hub cannot be asked.
    Status(status_cmd::StatusArgs),
    /// Resolve maintenance windows from a maintenance policy (lifecycle-manager format).
    Maintenance(maintenance_cmd::MaintenanceArgs),
    /// Serve simulated Kubernetes clusters (an in-memory API server kubectl accepts).
    #[cfg(feature = "sandbox")]
    Sim(fleetwatch_sim::SimArgs),
    /// Simulated Kubernetes clusters: not in this build (built without the `sandbox` feature).
    #[cfg(not(feature = "sandbox"))]
    Sim(sandbox_missing::Args),
    /// Measure throughput, latency and memory.
    #[cfg(feature = "sandbox")]
    Bench(fleetwatch_bench::BenchArgs),
    /// Print the build version and git commit (the first line, which `--version` prints
    /// too), the protocol versions spoken and the skew policy, the storage formats and the
    /// CRD versions: what an upgrade has to agree on (docs/upgrade.md); `-o json|yaml` for
    /// scripts.
    Version(version_cmd::VersionArgs),
    /// Print a shell completion script (bash, zsh, fish, elvish, powershell).
    Completion(shell_cmd::CompletionArgs),
    /// Print the man page, or write one per command with `--dir`.
    Man(shell_cmd::ManArgs),
    /// Benchmarks: not in this build (built without the `sandbox` feature).
    #[cfg(not(feature = "sandbox"))]
    Bench(sandbox_missing::Args),
}

/// The agent is a small process beside a cluster's workloads. glibc gives a threaded
/// process up to 8 malloc arenas per core, which cost the agent about 3 MiB of RSS for
/// nothing at its allocation rate (a few percent of a core): one arena will do.
/// `bench agent --objects 50000`, 3 runs each: idle RSS 29.7–31.4 MiB with the default,
/// the same with 2 arenas, 27.2–27.4 MiB with 1; latency and CPU unchanged.
fn limit_malloc_arenas() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets an allocator tunable, and this runs before any thread
    // is started.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    // What every component's /metrics names in fleetwatch_build_info.
    fleetwatch_telemetry::process::set_build(fleetwatch_telemetry::process::Build {
        version: env!("CARGO_PKG_VERSION").to_string(),
        commit: env!("FLEETWATCH_GIT_COMMIT").to_string(),
        rustc: env!("FLEETWATCH_RUSTC").to_string(),
    });
    // The sandbox draws a table on stdout: its logs go to a file in its directory.
    let log_file = match &cli.command {
        #[cfg(feature = "sandbox")]
        Command::Up(args) => Some(args.log_file()),
        _ => None,
    };
    if matches!(cli.command, Command::Agent(_)) {
        limit_malloc_arenas();
    }
    // reqwest's certificate verifier logs every failed verification at ERROR; `module`
    // reports the failure itself, in one line. So does `modules` for kube's client, which
    // logs every failed connection at ERROR; and `status`, whose service proxy answers
    // (403, 503) it would log the same way.
    let filter = match &cli.command {
        Command::Module(_) => format!("{},rustls_platform_verifier=off", cli.log),
        Command::Modules(_) | Command::Status(_) => format!("{},kube_client=off", cli.log),
        _ => cli.log.clone(),
    };
    if let Err(e) = init_logging(&filter, cli.log_json, log_file) {
        eprintln!("error: {e}");
        return std::process::ExitCode::from(2);
    }
    fleetwatch_certs::install_crypto_provider();
    let command = match cli.command {
        Command::Status(args) => return status(args),
        other => other,
    };
    let result = match command {
        #[cfg(not(feature = "sandbox"))]
        Command::Up(_) => Err(sandbox_missing::error("up")),
        #[cfg(not(feature = "sandbox"))]
        Command::Sim(_) => Err(sandbox_missing::error("sim")),
        #[cfg(not(feature = "sandbox"))]
        Command::Bench(_) => Err(sandbox_missing::error("bench")),
        Command::Certs(args) => certs_cmd::run(args),
        Command::Crds(args) => crds_cmd::run(args),
        Command::Maintenance(args) => maintenance_cmd::run(args),
        Command::Version(args) => version_cmd::run(args),
        Command::Man(args) => shell_cmd::man(args, <Cli as clap::CommandFactory>::command()),
        Command::Completion(args) => shell_cmd::completion(args, <Cli as clap::CommandFactory>::command()),
        Command::AgentModule(args) => agent_module_cmd::run(args),
        other => {
            let rt = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("error: cannot start the async runtime: {e}");
                    return std::process::ExitCode::FAILURE;
                }
            };
            rt.block_on(async move {
                match other {
                    Command::Hub(args) => hub_cmd::run(args).await,
                    Command::Agent(args) => agent_cmd::run(args).await,
                    Command::Tail(args) => tail_cmd::run(args).await,
                    Command::Relay(args) => relay_cmd::run(args).await,
                    #[cfg(feature = "sandbox")]
                    Command::Up(args) => up_cmd::run(args).await,
                    Command::Lifecycle(args) => lifecycle_cmd::run(args).await,
                    Command::Module(args) => module_cmd::run(args).await,
                    Command::Modules(args) => modules_cmd::run(args).await,
                    #[cfg(feature = "sandbox")]
                    Command::Bench(args) => {
                        // On SIGTERM or Ctrl-C the bench's future is dropped, and with it the
                        // hubs, nats-server and load processes it started (killed on drop);
                        // ended by the signal's default action they outlived it.
                        let shutdown = shutdown_on_signals();
                        let values = crds_cmd::values()?;
                        tokio::select! {
                            r = fleetwatch_bench::run(args, values) => r,
                            _ = shutdown.cancelled() => {
                                Err(anyhow::anyhow!("bench interrupted: the processes it started were stopped"))
                            }
                        }
                    }
                    #[cfg(feature = "sandbox")]
                    Command::Sim(args) => {
                        let shutdown = shutdown_on_signals();
                        fleetwatch_sim::run(args, shutdown).await.map_err(anyhow::Error::from)
                    }
                    Command::Certs(_)
                    | Command::Crds(_)
                    | Command::Maintenance(_)
                    | Command::AgentModule(_)
                    | Command::Version(_)
                    | Command::Completion(_)
                    | Command::Man(_)
                    | Command::Status(_) => {
                        unreachable!("handled above")
                    }
                    #[cfg(not(feature = "sandbox"))]
                    Command::Up(_) | Command::Sim(_) | Command::Bench(_) => {
                        unreachable!("handled above")
                    }
                }
            })
        }
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `fleetwatch status`: 0 healthy, 1 unhealthy, 2 when the hub cannot be asked.
fn status(args: status_cmd::StatusArgs) -> std::process::ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return std::process::ExitCode::from(2);
        }
    };
    match rt.block_on(status_cmd::run(args)) {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("error: {}", one_line(&e));
            std::process::ExitCode::from(2)
        }
    }
}

/// The error and its causes on one line, each cause once: many errors already include
/// their source in their own message ("cannot listen on X: Address already in use"), so
/// a cause whose text is already there is not repeated.
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        // A cause that spans lines (a YAML parser's error with the source excerpt under it)
        // gives its first one: what it says, with the position.
        let text = cause.to_string().lines().map(str::trim).find(|l| !l.is_empty()).unwrap_or_default().to_string();
        if text.is_empty() || line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_cause_is_printed_once() {
        let io = std::io::Error::from(std::io::ErrorKind::AddrInUse);
        let bind =
            fleetwatch_hub::HubError::Bind { addr: "127.0.0.1:1".parse().unwrap(), source: io, hint: String::new() };
        let e = anyhow::Error::new(bind).context("cannot start hub");
        assert_eq!(super::one_line(&e), "cannot start hub: cannot listen on 127.0.0.1:1: address in use");
        let plain = anyhow::anyhow!("inner").context("outer");
        assert_eq!(super::one_line(&plain), "outer: inner");
        let excerpt =
            anyhow::anyhow!("error: line 1 column 10: unclosed bracket '['\n --> <input>:1:10\n  |\n1 | x: [")
                .context("--control-plane-kubeconfig k: failed to parse kubeconfig YAML");
        assert_eq!(
            super::one_line(&excerpt),
            "--control-plane-kubeconfig k: failed to parse kubeconfig YAML: error: line 1 column 10: unclosed bracket '['"
        );
    }
}

/// Starts logging with `filter` (or RUST_LOG); refuses a filter that would log something
/// other than what was asked (see [`log_filter`]).
fn init_logging(filter: &str, json: bool, file: Option<std::path::PathBuf>) -> Result<(), String> {
    use std::io::IsTerminal;
    use tracing_subscriber::EnvFilter;
    use tracing_subscriber::fmt::writer::BoxMakeWriter;
    let filter = match std::env::var("RUST_LOG") {
        Ok(env) => log_filter::check(&env).map_err(|e| format!("RUST_LOG={env}: {e}"))?,
        Err(_) => filter.to_string(),
    };
    let filter = EnvFilter::try_new(&filter).map_err(|e| format!("log filter {filter}: {e}"))?;
    let opened = file.and_then(|p| {
        p.parent().map(std::fs::create_dir_all);
        std::fs::OpenOptions::new().create(true).append(true).open(p).ok()
    });
    let (writer, ansi) = match opened {
        Some(f) => (BoxMakeWriter::new(std::sync::Mutex::new(f)), false),
        None => (BoxMakeWriter::new(std::io::stderr), std::io::stderr().is_terminal()),
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(writer).with_ansi(ansi);
    if json {
        builder.json().init();
    } else {
        builder.init();
    }
    Ok(())
}

/// A token cancelled on SIGTERM or Ctrl-C.
pub(crate) fn shutdown_on_signals() -> tokio_util::sync::CancellationToken {
    let token = tokio_util::sync::CancellationToken::new();
    let t = token.clone();
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
                return;
            };
            tokio::select! {
                _ = term.recv() => tracing::info!("SIGTERM: shutting down"),
                _ = int.recv() => tracing::info!("SIGINT: shutting down"),
            }
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
        }
        t.cancel();
    });
    token
}

/// How a client (agent or subscriber) reaches the hub: the flags `agent` and `tail` share.
#[derive(clap::Args)]
pub(crate) struct HubClientArgs {
    /// The hub, as wss://HOST:PORT. Several hub replicas (on one JetStream stream): repeat
    /// the flag or separate with commas; they are tried in order, and the client stays with
    /// the one it reached until it becomes unreachable, then fails over to the next.
    #[arg(long, env = "FLEETWATCH_HUB", value_delimiter = ',', required = true)]
    hub: Vec<String>,
    /// This client's certificate (its identity is the one in it).
    #[arg(long, env = "FLEETWATCH_CERT")]
    cert: std::path::PathBuf,
    /// This client's private key.
    #[arg(long, env = "FLEETWATCH_KEY")]
    key: std::path::PathBuf,
    /// CA bundle that signed the hub's certificate (repeatable during a CA rotation).
    #[arg(long, env = "FLEETWATCH_CA", required = true)]
    ca: Vec<std::path::PathBuf>,
    /// Seconds between reads of the certificate, key and CA files when nothing reported a
    /// change (the fallback: with --tls-watch a change is seen at once). The files are
    /// followed by content, and also read before every connection: a renewed certificate
    /// (e.g. a Secret cert-manager or the lifecycle operator rotated) makes the client
    /// reconnect with it without losing anything (an agent keeps its pending events, a
    /// subscriber resumes after its last acknowledged event); a changed CA bundle is used
    /// from the next connection. No restart needed.
    #[arg(long, env = "FLEETWATCH_TLS_RELOAD_INTERVAL", default_value_t = 60.0)]
    tls_reload_interval: f64,
    /// Watch the directories of the certificate, key and CA files (inotify; a Secret
    /// volume's symlink swap included), so a change is read at once; `false` leaves only
    /// the reads every --tls-reload-interval.
    #[arg(long, env = "FLEETWATCH_TLS_WATCH", default_value_t = true, action = clap::ArgAction::Set)]
    tls_watch: bool,
}

impl HubClientArgs {
    /// The hub address and the TLS files.
    pub(crate) fn resolve(
        &self,
    ) -> anyhow::Result<(fleetwatch_client::transport::HubUrls, fleetwatch_certs::TlsFiles)> {
        Ok((fleetwatch_client::transport::HubUrls::parse_all(&self.hub)?, tls_files(&self.cert, &self.key, &self.ca)))
    }

    /// `--tls-watch`.
    pub(crate) fn tls_watch(&self) -> bool {
        self.tls_watch
    }

    /// `--tls-reload-interval`.
    pub(crate) fn tls_reload_interval(&self) -> anyhow::Result<std::time::Duration> {
        std::time::Duration::try_from_secs_f64(self.tls_reload_interval)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| anyhow::anyhow!("--tls-reload-interval must be a positive number of seconds"))
    }
}

/// The TLS files of a client or server from the common flags.
pub(crate) fn tls_files(
    cert: &std::path::Path,
    key: &std::path::Path,
    ca: &[std::path::PathBuf],
) -> fleetwatch_certs::TlsFiles {
    fleetwatch_certs::TlsFiles { cert: cert.into(), key: key.into(), ca: ca.to_vec() }
}
