//! Which installed module provides which kind, and so whether an absent kind is a failure.
//!
//! A watch whose kind the API server does not serve is normal while nothing installed it
//! (the module was removed, its CRD is not there yet): `waiting-for-kind`, healthy. It is
//! a failure (`kind-not-found`) only while a module that declares the kind is installed in
//! the cluster. Modules declare their kinds on their manager workload, which the agent
//! already follows for the inventory, with the annotation [`PROVIDES_ANNOTATION`]: a
//! comma-separated list of `Kind.group` (`Kind` alone for the core group). The lifecycle
//! operator writes it from the CRDs in the module's manifest; a module installed by other
//! means can carry it itself. The decision is the agent's, so the phase on the wire is the
//! truth for `/api/v1/clusters`, `fleetwatch status`, the web view and the metric alike.

use std::collections::BTreeMap;

use fleetwatch_protocol::message::WatchPhase;

pub use fleetwatch_protocol::provides::{PROVIDES_ANNOTATION, parse_provides};

/// A module that declares a kind: its name and running version.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Provider {
    /// The module.
    pub module: String,
    /// Its running version.
    pub version: String,
}

/// The installed modules' declared kinds: (group, kind) → the modules declaring it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Providers(BTreeMap<(String, String), Vec<Provider>>);

impl Providers {
    /// Builds the table from each installed module's annotation value.
    pub fn from_modules<'a>(modules: impl IntoIterator<Item = (&'a str, &'a str, &'a str)>) -> Self {
        let mut map: BTreeMap<(String, String), Vec<Provider>> = BTreeMap::new();
        for (module, version, provides) in modules {
            for gk in parse_provides(provides) {
                let p = Provider { module: module.to_string(), version: version.to_string() };
                let list = map.entry(gk).or_default();
                if !list.contains(&p) {
                    list.push(p);
                    list.sort();
                }
            }
        }
        Providers(map)
    }

    /// The phase and message of a watch whose kind `group`/`kind` is not served:
    /// `kind-not-found` while an installed module declares it, else `waiting-for-kind`.
    /// `detail` is the API server's (or discovery's) answer, kept in the message.
    pub fn absent_kind(&self, group: &str, kind: &str, detail: &str) -> (WatchPhase, String) {
        match self.0.get(&(group.to_string(), kind.to_string())) {
            Some(mods) if !mods.is_empty() => {
                let names: Vec<String> = mods.iter().map(|p| format!("{} {}", p.module, p.version)).collect();
                (
                    WatchPhase::KindNotFound,
                    format!("not served although module {} is installed and provides it: {detail}", names.join(", ")),
                )
            }
            _ => (WatchPhase::WaitingForKind, format!("no installed module provides it (yet): {detail}")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn absent_kind_fails_only_while_a_provider_is_installed() {
        let none = Providers::default();
        assert_eq!(none.absent_kind("modules.example.com", "RedisConfig", "404").0, WatchPhase::WaitingForKind);
        let p = Providers::from_modules([("redis", "1.0.0", "RedisConfig.modules.example.com"), ("nats", "1.0.0", "")]);
        let (phase, msg) = p.absent_kind("modules.example.com", "RedisConfig", "404 not found");
        assert_eq!(phase, WatchPhase::KindNotFound);
        assert!(msg.contains("redis 1.0.0") && msg.contains("404 not found"), "{msg}");
        // Another group, or another kind of the group: nobody provides it.
        assert_eq!(p.absent_kind("other.io", "RedisConfig", "").0, WatchPhase::WaitingForKind);
        assert_eq!(p.absent_kind("modules.example.com", "NatsConfig", "").0, WatchPhase::WaitingForKind);
    }
}
