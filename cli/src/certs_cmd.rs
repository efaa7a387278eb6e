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
    /// Print a certificate's identity, serial and validity (EXPIRED or NOT YET VALID marked).
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
    #[arg(long, default_value_t = 365, conflicts_with = "not_after")]
    days: u32,
    /// End of validity instead of --days, for testing expiry: an RFC 3339 time (a past one
    /// makes an already expired certificate) or a duration from now (`90s`, `10m`, `2h`).
    #[arg(long, value_name = "RFC3339|DURATION", value_parser = parse_not_after)]
    not_after: Option<jiff::Timestamp>,
}

/// `--not-after`: a time, or a duration from now.
fn parse_not_after(s: &str) -> Result<jiff::Timestamp, String> {
    if let Ok(t) = s.parse::<jiff::Timestamp>() {
        return Ok(t);
    }
    let d: jiff::SignedDuration = s.parse().map_err(|_| {
        format!("expected an RFC 3339 time (2030-01-01T00:00:00Z) or a duration (90s, 10m, 2h), got {s:?}")
    })?;
    if d.is_negative() || d.is_zero() {
        return Err("a duration must be positive (give a past RFC 3339 time for an expired certificate)".into());
    }
    jiff::Timestamp::now().checked_add(d).map_err(|e| format!("{s:?}: {e}"))
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
            let files = match common.not_after {
                Some(t) => ca.issue_until(&common.dir, &spec, t),
                None => ca.issue(&common.dir, &spec, common.days),
            }
            .context("cannot issue certificate")?;
            println!("issued {} ({}), key {}", files.cert.display(), files.identity, files.key.display());
            if let Some(t) = common.not_after.filter(|t| *t <= jiff::Timestamp::now()) {
                println!("note: it expired at {t} (--not-after is in the past)");
            }
        }
        CertsCommand::Inspect { file } => {
            let info = fleetwatch_certs::inspect_file(&file)?;
            print!("{info}");
        }
    }
    Ok(())
}
