//! `fleetwatch certs`: the PKI.

use std::net::IpAddr;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use fleetwatch_certs::{Authority, LeafSpec};

#[derive(Args)]
pub struct CertsArgs {
    #[command(subcommand)]
    command: CertsCommand,
}

#[derive(Subcommand)]
enum CertsCommand {
    /// Create a CA (ECDSA P-256, 10 years) in a directory: ca.crt and ca.key.
    Init {
        /// Directory for the CA and the certificates it issues.
        #[arg(long)]
        dir: PathBuf,
        /// SPIFFE trust domain of all identities this CA issues.
        #[arg(long, default_value = fleetwatch_protocol::identity::DEFAULT_TRUST_DOMAIN)]
        trust_domain: String,
    },
    /// Issue a certificate signed by the CA in --dir.
    Issue {
        #[command(subcommand)]
        what: IssueWhat,
    },
    /// Print a certificate's identity, serial and validity.
    Inspect {
        /// PEM certificate file.
        file: PathBuf,
    },
}

#[derive(Subcommand)]
enum IssueWhat {
    /// The hub's server certificate: hub.crt / hub.key.
    Hub {
        #[command(flatten)]
        common: IssueCommon,
        /// DNS names agents use to reach the hub (repeatable).
        #[arg(long = "dns", num_args = 1..)]
        dns: Vec<String>,
        /// IP addresses agents use to reach the hub (repeatable).
        #[arg(long = "ip", num_args = 1..)]
        ip: Vec<IpAddr>,
    },
    /// An agent's client certificate for one cluster: agent-ID.crt / agent-ID.key.
    Agent {
        #[command(flatten)]
        common: IssueCommon,
        /// The cluster id (letters, digits, '.', '-', '_').
        #[arg(long)]
        cluster: String,
    },
    /// A subscriber's client certificate: subscriber-NAME.crt / subscriber-NAME.key.
    Subscriber {
        #[command(flatten)]
        common: IssueCommon,
        /// The subscriber name.
        #[arg(long)]
        name: String,
    },
}

#[derive(Args)]
struct IssueCommon {
    /// The CA directory (from `certs init`); the certificate is written there too.
    #[arg(long)]
    dir: PathBuf,
    /// Validity in days.
    #[arg(long, default_value_t = 365)]
    days: u32,
}

pub fn run(args: CertsArgs) -> anyhow::Result<()> {
    match args.command {
        CertsCommand::Init { dir, trust_domain } => {
            let files = Authority::init(&dir, &trust_domain).context("cannot create CA")?;
            println!("created CA {} ({})", files.cert.display(), files.identity);
        }
        CertsCommand::Issue { what } => {
            let (common, spec) = match what {
                IssueWhat::Hub { common, dns, ip } => (common, LeafSpec::Hub { dns, ips: ip }),
                IssueWhat::Agent { common, cluster } => (common, LeafSpec::Agent { cluster }),
                IssueWhat::Subscriber { common, name } => (common, LeafSpec::Subscriber { name }),
            };
            let ca = Authority::load(&common.dir).context("cannot load CA (run `fleetwatch certs init` first)")?;
            let files = ca.issue(&common.dir, &spec, common.days).context("cannot issue certificate")?;
            println!("issued {} ({}), key {}", files.cert.display(), files.identity, files.key.display());
        }
        CertsCommand::Inspect { file } => {
            let info = fleetwatch_certs::inspect_file(&file)?;
            print!("{info}");
        }
    }
    Ok(())
}
