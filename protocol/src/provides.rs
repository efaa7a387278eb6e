//! The contract between a module and the agent about which kinds the module provides:
//! the annotation [`PROVIDES_ANNOTATION`] on the module's manager workload, a
//! comma-separated list of `Kind.group` (`Kind` alone for the core group). The lifecycle
//! operator writes it from the CRDs in the module's manifest; the agent reads it to tell a
//! watch waiting for a kind nothing installed (healthy) from one whose module is installed
//! but whose kind is missing (a failure).

/// Annotation on a module's manager workload listing the kinds the module provides.
pub const PROVIDES_ANNOTATION: &str = "operator.fleetwatch.dev/provides";

/// The (group, kind) pairs of an annotation value (`RedisConfig.modules.example.com,
/// Pod`); malformed entries (empty) are skipped.
pub fn parse_provides(value: &str) -> Vec<(String, String)> {
    value
        .split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .filter_map(|e| {
            let (kind, group) = e.split_once('.').unwrap_or((e, ""));
            (!kind.is_empty()).then(|| (group.to_string(), kind.to_string()))
        })
        .collect()
}

/// The annotation value for kinds given as (group, kind): `Kind.group`, sorted, deduplicated.
pub fn format_provides<'a>(kinds: impl IntoIterator<Item = (&'a str, &'a str)>) -> String {
    let mut out: Vec<String> = kinds
        .into_iter()
        .map(|(group, kind)| if group.is_empty() { kind.to_string() } else { format!("{kind}.{group}") })
        .collect();
    out.sort();
    out.dedup();
    out.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn annotation_round_trip() {
        let v = format_provides([("modules.example.com", "RedisConfig"), ("", "Pod"), ("", "Pod")]);
        assert_eq!(v, "Pod,RedisConfig.modules.example.com");
        assert_eq!(
            parse_provides(&v),
            [("".to_string(), "Pod".to_string()), ("modules.example.com".into(), "RedisConfig".into())]
        );
        assert_eq!(parse_provides(" , A.x.io ,"), [("x.io".to_string(), "A".to_string())]);
    }
}
