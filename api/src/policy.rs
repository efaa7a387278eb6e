//! Pure module policy: which version a module should run (rule 1) and whether applying it
//! is allowed (rule 2: no downgrades of what actually runs).

use crate::module::{DEFAULT_CHANNEL, ModuleEntry, ModuleReleaseMetaSpec};

/// Why no desired version can be found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    /// A version string is not semver.
    #[error("version {0:?} is not a semantic version")]
    BadVersion(String),
    /// The channel has no version in the module's release meta.
    #[error("module {module} has no version in channel {channel:?}")]
    NoChannel {
        /// Module.
        module: String,
        /// Channel.
        channel: String,
    },
    /// No release meta for the module.
    #[error("module {0} has no ModuleReleaseMeta")]
    NoReleaseMeta(String),
}

/// The version a module should run, and the channel that says so (`None` when pinned).
///
/// Rule 1: the pinned version, else the module's channel, else the runtime's channel,
/// else `regular`, looked up in the module's release meta.
///
/// ```
/// use fleetwatch_api::{ModuleEntry, ModuleReleaseMetaSpec, ChannelVersion};
/// use fleetwatch_api::policy::desired_version;
/// let meta = ModuleReleaseMetaSpec {
///     module_name: "redis".into(),
///     channels: vec![ChannelVersion { channel: "regular".into(), version: "1.2.0".into() },
///                    ChannelVersion { channel: "fast".into(), version: "1.3.0".into() }],
///     ..Default::default()
/// };
/// let entry = ModuleEntry { name: "redis".into(), ..Default::default() };
/// let (v, ch) = desired_version(&entry, Some("fast"), Some(&meta)).unwrap();
/// assert_eq!((v.to_string(), ch.as_deref()), ("1.3.0".into(), Some("fast")));
/// let (v, _) = desired_version(&entry, None, Some(&meta)).unwrap();
/// assert_eq!(v.to_string(), "1.2.0");
/// ```
pub fn desired_version(
    entry: &ModuleEntry,
    runtime_channel: Option<&str>,
    meta: Option<&ModuleReleaseMetaSpec>,
) -> Result<(semver::Version, Option<String>), PolicyError> {
    if let Some(pinned) = &entry.version {
        return Ok((parse(pinned)?, None));
    }
    let channel = entry.channel.as_deref().or(runtime_channel).unwrap_or(DEFAULT_CHANNEL).to_string();
    let meta = meta.ok_or_else(|| PolicyError::NoReleaseMeta(entry.name.clone()))?;
    let offered = meta
        .channels
        .iter()
        .find(|c| c.channel == channel)
        .ok_or_else(|| PolicyError::NoChannel { module: entry.name.clone(), channel: channel.clone() })?;
    let mut version = parse(&offered.version)?;
    // A mandatory version is a floor for every channel.
    if let Some(m) = &meta.mandatory {
        let m = parse(m)?;
        if m > version {
            version = m;
        }
    }
    Ok((version, Some(channel)))
}

/// Parses a version, accepting a leading `v`.
pub fn parse(v: &str) -> Result<semver::Version, PolicyError> {
    semver::Version::parse(v.trim_start_matches('v')).map_err(|_| PolicyError::BadVersion(v.into()))
}

/// What to do about a module, given what runs and what is desired.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Nothing runs: install.
    Install,
    /// The desired version runs: keep it in shape (repair drift).
    Keep,
    /// An older version runs: upgrade.
    Upgrade {
        /// What runs.
        from: semver::Version,
    },
    /// A newer version runs: leave it (rule 2), with a warning.
    RefuseDowngrade {
        /// What runs.
        from: semver::Version,
    },
}

/// Rule 2: compare against the version actually running, whoever installed it.
///
/// ```
/// use fleetwatch_api::policy::{next_step, Step};
/// let v = |s: &str| semver::Version::parse(s).unwrap();
/// assert_eq!(next_step(None, &v("1.0.0")), Step::Install);
/// assert_eq!(next_step(Some(&v("2.0.0")), &v("1.0.0")), Step::RefuseDowngrade { from: v("2.0.0") });
/// assert_eq!(next_step(Some(&v("1.0.0")), &v("1.1.0")), Step::Upgrade { from: v("1.0.0") });
/// ```
pub fn next_step(actual: Option<&semver::Version>, desired: &semver::Version) -> Step {
    match actual {
        None => Step::Install,
        Some(a) if a == desired => Step::Keep,
        Some(a) if a < desired => Step::Upgrade { from: a.clone() },
        Some(a) => Step::RefuseDowngrade { from: a.clone() },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::module::ChannelVersion;

    fn meta() -> ModuleReleaseMetaSpec {
        ModuleReleaseMetaSpec {
            module_name: "m".into(),
            channels: vec![
                ChannelVersion { channel: "regular".into(), version: "1.0.0".into() },
                ChannelVersion { channel: "fast".into(), version: "2.0.0".into() },
            ],
            ..Default::default()
        }
    }

    #[test]
    fn precedence_pinned_then_module_then_runtime_then_regular() {
        let mut e = ModuleEntry { name: "m".into(), ..Default::default() };
        assert_eq!(desired_version(&e, None, Some(&meta())).unwrap().0.to_string(), "1.0.0");
        assert_eq!(desired_version(&e, Some("fast"), Some(&meta())).unwrap().0.to_string(), "2.0.0");
        e.channel = Some("regular".into());
        assert_eq!(desired_version(&e, Some("fast"), Some(&meta())).unwrap().0.to_string(), "1.0.0");
        e.version = Some("1.5.0".into());
        assert_eq!(desired_version(&e, Some("fast"), None).unwrap(), (parse("1.5.0").unwrap(), None));
    }

    #[test]
    fn errors_and_mandatory_floor() {
        let e = ModuleEntry { name: "m".into(), channel: Some("nightly".into()), ..Default::default() };
        assert!(matches!(desired_version(&e, None, Some(&meta())), Err(PolicyError::NoChannel { .. })));
        assert!(matches!(desired_version(&e, None, None), Err(PolicyError::NoReleaseMeta(_))));
        let mut m = meta();
        m.mandatory = Some("1.5.0".into());
        let e = ModuleEntry { name: "m".into(), ..Default::default() };
        assert_eq!(desired_version(&e, None, Some(&m)).unwrap().0.to_string(), "1.5.0");
        assert!(parse("x").is_err());
        assert_eq!(parse("v1.2.3").unwrap().to_string(), "1.2.3");
    }
}
