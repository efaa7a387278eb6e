//! `fleetwatch maintenance`: resolve maintenance windows from a policy file, with the code
//! the lifecycle operator uses.

use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, Subcommand};
use fleetwatch_api::maintenance::{MaintenanceError, MaintenancePolicySpec, NextWindowOptions, RuntimeLabels};
use jiff::{SignedDuration, Timestamp};

#[derive(Args)]
pub struct MaintenanceArgs {
    #[command(subcommand)]
    command: MaintenanceCommand,
}

#[derive(Subcommand)]
enum MaintenanceCommand {
    /// Print the next maintenance window of a runtime as {"begin": RFC 3339, "end": RFC 3339}.
    Next(NextArgs),
}

#[derive(Args)]
struct NextArgs {
    /// Maintenance policy file (`-` for stdin): JSON as lifecycle-manager's policy files,
    /// or a MaintenancePolicy object as `kubectl get maintenancepolicy NAME -o json` prints
    /// it (its `spec` is used; a list is accepted when it holds exactly one).
    #[arg(long)]
    policy: PathBuf,
    /// A runtime label rules match on: plan=X, region=Y, platformRegion=Z or
    /// globalAccountID=W (repeatable).
    #[arg(long = "label", value_name = "NAME=VALUE", value_parser = parse_label)]
    labels: Vec<(String, String)>,
    /// Resolve at this time (RFC 3339) instead of now.
    #[arg(long, value_name = "RFC3339")]
    at: Option<Timestamp>,
    /// Return the window in progress if at least --min-remaining of it is left.
    #[arg(long)]
    ongoing: bool,
    /// With --ongoing: how much of the current window must remain, e.g. 20m, 1h30m.
    #[arg(long, value_name = "DURATION", default_value = "20m", value_parser = parse_duration, requires = "ongoing")]
    min_remaining: SignedDuration,
}

fn parse_label(s: &str) -> Result<(String, String), String> {
    let (name, value) = s.split_once('=').ok_or_else(|| format!("expected NAME=VALUE, got {s:?}"))?;
    RuntimeLabels::default().set(name, value).map_err(|e| e.to_string())?;
    Ok((name.to_string(), value.to_string()))
}

fn parse_duration(s: &str) -> Result<SignedDuration, String> {
    let d: SignedDuration = s.parse().map_err(|e| format!("{e} (expected e.g. 20m, 1h30m)"))?;
    if d.is_negative() {
        return Err("must not be negative".into());
    }
    Ok(d)
}

pub fn run(args: MaintenanceArgs) -> anyhow::Result<()> {
    match args.command {
        MaintenanceCommand::Next(args) => next(args),
    }
}

/// The policy document inside `doc`: a MaintenancePolicy object's `spec` (also the one
/// object of a `kubectl get -o json` list), or `doc` itself (a lifecycle-manager policy file,
/// which has no `kind`).
fn policy_document(doc: serde_json::Value) -> anyhow::Result<serde_json::Value> {
    let kind = doc.get("kind").and_then(|k| k.as_str()).map(str::to_string);
    match kind.as_deref() {
        None => Ok(doc),
        Some("MaintenancePolicy") => {
            let name = doc.pointer("/metadata/name").and_then(|n| n.as_str()).unwrap_or("?").to_string();
            doc.get("spec").cloned().with_context(|| format!("MaintenancePolicy {name} has no spec"))
        }
        Some(list) if list == "List" || list == "MaintenancePolicyList" => {
            let items = doc.get("items").and_then(|i| i.as_array()).cloned().unwrap_or_default();
            match <[serde_json::Value; 1]>::try_from(items) {
                Ok([one]) => policy_document(one),
                Err(items) => {
                    let names: Vec<&str> =
                        items.iter().filter_map(|i| i.pointer("/metadata/name").and_then(|n| n.as_str())).collect();
                    anyhow::bail!(
                        "the list holds {} objects ({}); give one (kubectl get maintenancepolicy NAME -o json)",
                        items.len(),
                        names.join(", ")
                    )
                }
            }
        }
        Some(other) => anyhow::bail!("a {other}, not a MaintenancePolicy or a policy file"),
    }
}

fn next(args: NextArgs) -> anyhow::Result<()> {
    let path = args.policy.display();
    let json = if args.policy.as_os_str() == "-" {
        std::io::read_to_string(std::io::stdin()).context("cannot read the policy from stdin")?
    } else {
        std::fs::read_to_string(&args.policy).with_context(|| format!("cannot read {path}"))?
    };
    let policy = serde_json::from_str::<serde_json::Value>(&json)
        .map_err(|e| anyhow::Error::from(MaintenanceError::from(e)))
        .and_then(policy_document)
        .and_then(|doc| {
            let spec = serde_json::from_value::<MaintenancePolicySpec>(doc).map_err(MaintenanceError::from)?;
            Ok(spec.compile()?)
        })
        .with_context(|| format!("invalid maintenance policy {path}"))?;
    let mut labels = RuntimeLabels::default();
    for (name, value) in args.labels {
        labels.set(&name, value)?;
    }
    let opts = NextWindowOptions { ongoing: args.ongoing, min_remaining: args.min_remaining };
    let window = policy.next_window(&labels, args.at.unwrap_or_else(Timestamp::now), opts)?;
    println!("{}", serde_json::to_string(&window)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn a_kubectl_object_or_list_of_one_gives_its_spec() {
        let spec =
            json!({"rules": [], "default": {"days": ["Mon"], "begin": "01:00:00+00:00", "end": "02:00:00+00:00"}});
        let obj = json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "MaintenancePolicy",
            "metadata": {"name": "default", "namespace": "kcp", "resourceVersion": "7"}, "spec": spec});
        assert_eq!(policy_document(obj.clone()).unwrap(), spec);
        assert_eq!(policy_document(spec.clone()).unwrap(), spec, "a policy file as it is");
        let list = json!({"apiVersion": "v1", "kind": "List", "items": [obj.clone()]});
        assert_eq!(policy_document(list).unwrap(), spec);
        let two = json!({"kind": "MaintenancePolicyList", "items": [obj.clone(), obj]});
        let err = policy_document(two).unwrap_err().to_string();
        assert!(err.contains("holds 2 objects (default, default)"), "{err}");
        let err = policy_document(json!({"kind": "Runtime", "spec": {}})).unwrap_err().to_string();
        assert!(err.contains("a Runtime, not a MaintenancePolicy"), "{err}");
    }
}
