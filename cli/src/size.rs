//! Byte sizes on the command line: one parser for every size flag.
//!
//! The hub and the lifecycle operator had a parser each, and they disagreed: the hub took
//! `G` for GiB and refused `1Gi` (what a Kubernetes user writes, and what the chart's values
//! suggest), the operator took `G` for 10^9. Now every size flag takes Kubernetes
//! quantities and the IEC/SI names the docs use:
//!
//! | written | means |
//! |---|---|
//! | `1048576`, `1048576B` | bytes |
//! | `Ki`, `Mi`, `Gi`, `Ti`, `Pi`, `Ei` (also `KiB` … `EiB`, any case) | powers of 1024 |
//! | `k`, `M`, `G`, `T`, `P`, `E` (also `K`, `kB`, `KB`, `MB` … `EB`) | powers of 1000 (as in Kubernetes) |
//!
//! A decimal number (`1.5Gi`) is rounded up to a whole byte. `m` is refused: in a Kubernetes
//! quantity it is milli, never mega. The charts' schemas hold the same rule as a pattern
//! ([`SCHEMA_PATTERN`]), so a value the binaries would refuse is refused at render.

/// The JSON-schema pattern of a size string, as the charts use it (kept equal to what
/// [`parse`] takes by a test).
#[cfg(test)]
pub const SCHEMA_PATTERN: &str = r"^[0-9]+(\.[0-9]+)?([KkMmGgTtPpEe][Ii][Bb]?|[Kk]|[MGTPE]|[KkMGTPE]B|B)?$";

/// Parses a size into bytes, or says why it is not one (naming it and the units taken).
pub fn parse(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit() && c != '.').unwrap_or(t.len());
    let (number, unit) = t.split_at(split);
    let bad = || format!("{s:?} is not a size: a number of bytes, or with a unit such as 512Mi, 1Gi, 1G or 1GiB");
    let (whole, frac) = number.split_once('.').unwrap_or((number, ""));
    if whole.is_empty() || frac.contains('.') || (number.contains('.') && frac.is_empty()) {
        return Err(bad());
    }
    let mult = multiplier(unit).map_err(|why| format!("{s:?}: {why}"))?;
    let digits = format!("{whole}{frac}");
    let n: u128 = digits.parse().map_err(|_| bad())?;
    let scale = 10u128.checked_pow(frac.len() as u32).ok_or_else(bad)?;
    let bytes = n.checked_mul(mult).map(|b| b.div_ceil(scale)).ok_or_else(|| format!("{s:?} is too large"))?;
    u64::try_from(bytes).map_err(|_| format!("{s:?} is too large"))
}

/// What a unit multiplies by.
fn multiplier(unit: &str) -> Result<u128, String> {
    const UNITS: &str =
        "use Ki, Mi, Gi, Ti (powers of 1024; KiB … TiB too) or k, M, G, T (powers of 1000; kB … TB too)";
    let binary = |i: u32| 1u128 << (10 * i);
    let decimal = |i: u32| 1000u128.pow(i);
    let power = |c: char| "kmgtpe".find(c.to_ascii_lowercase()).map(|i| i as u32 + 1);
    let chars: Vec<char> = unit.chars().collect();
    Ok(match chars.as_slice() {
        [] | ['B'] => 1,
        // Ki, KiB, kib, MiB …: unambiguous in any case.
        [p, 'i' | 'I'] | [p, 'i' | 'I', 'b' | 'B'] if power(*p).is_some() => binary(power(*p).unwrap_or(0)),
        ['m'] | ['m', 'B'] => return Err(format!("`{unit}` is milli in a Kubernetes quantity, not mega: {UNITS}")),
        ['k' | 'K'] | ['k' | 'K', 'B'] => decimal(1),
        [p @ ('M' | 'G' | 'T' | 'P' | 'E')] | [p @ ('M' | 'G' | 'T' | 'P' | 'E'), 'B'] => {
            decimal(power(*p).unwrap_or(0))
        }
        _ => return Err(format!("unknown size unit `{unit}`: {UNITS}")),
    })
}

#[cfg(test)]
mod tests {
    use super::{SCHEMA_PATTERN, parse};

    #[test]
    fn kubernetes_quantities_and_iec_and_si_names_are_taken() {
        let cases: [(&str, u64); 16] = [
            ("1000", 1000),
            ("1000B", 1000),
            ("512Mi", 512 << 20),
            ("1Gi", 1 << 30),
            ("1GiB", 1 << 30),
            ("1gib", 1 << 30),
            ("64MiB", 64 << 20),
            ("1G", 1_000_000_000),
            ("1GB", 1_000_000_000),
            ("3M", 3_000_000),
            ("2k", 2000),
            ("2K", 2000),
            ("1Ti", 1 << 40),
            ("1.5Gi", 3 << 29),
            ("0.5k", 500),
            (" 256MiB ", 256 << 20),
        ];
        for (s, want) in cases {
            assert_eq!(parse(s), Ok(want), "{s}");
        }
        assert_eq!(parse("1.0001k"), Ok(1001), "rounded up to a whole byte");
    }

    #[test]
    fn what_is_not_a_size_is_refused_naming_it() {
        let e = parse("1m").unwrap_err();
        assert!(e.contains("milli"), "{e}");
        let e = parse("12 furlongs").unwrap_err();
        assert!(e.contains("12 furlongs") && e.contains("unknown size unit"), "{e}");
        for bad in ["", "Gi", "1..5Gi", "1.Gi", ".5Gi", "-1", "1e9", "1Gb", "99999999999Ei"] {
            assert!(parse(bad).is_err(), "{bad} was taken: {:?}", parse(bad));
        }
    }

    /// The charts' pattern takes exactly what the parser takes (over the units and forms
    /// above), so a chart never renders a size the binary refuses.
    #[test]
    fn the_schema_pattern_agrees_with_the_parser() {
        let re = regex::Regex::new(SCHEMA_PATTERN).unwrap();
        // Small enough for every unit: too large is the parser's alone to say.
        let numbers = ["1", "7", "1.5", "0.25"];
        let units = [
            "", "B", "b", "Ki", "KiB", "ki", "kib", "Mi", "MiB", "mi", "Gi", "GiB", "Ti", "Pi", "Ei", "k", "K", "kB",
            "KB", "M", "MB", "m", "mB", "G", "GB", "g", "T", "TB", "P", "E", "Gb", "gb", "x", "iB", "Kb",
        ];
        for n in numbers {
            for u in units {
                let s = format!("{n}{u}");
                assert_eq!(
                    re.is_match(&s),
                    parse(&s).is_ok(),
                    "{s}: pattern {} parser {:?}",
                    re.is_match(&s),
                    parse(&s)
                );
            }
        }
    }
}

#[cfg(test)]
mod chart_tests {
    use super::SCHEMA_PATTERN;

    /// Every size the control-plane chart passes to a binary as a string (`hub.retention.bytes`,
    /// the artifact cache's bytes) carries the parser's pattern, so `helm` refuses what the
    /// binary would (`1Gi` rendered and then the hub refused it, before one parser).
    #[test]
    fn the_charts_size_fields_carry_the_parsers_pattern() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/helm/fleetwatch/values.schema.json");
        let schema: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        let mut found = Vec::new();
        fn walk(v: &serde_json::Value, at: &str, found: &mut Vec<(String, Option<String>)>) {
            if let Some(props) = v.get("properties").and_then(|p| p.as_object()) {
                for (k, p) in props {
                    let here = format!("{at}.{k}");
                    let size = ["bytes", "maxBytes", "memoryMaxBytes", "pullMaxBytes"].contains(&k.as_str());
                    if size && p["type"] == "string" {
                        found.push((here.clone(), p["pattern"].as_str().map(String::from)));
                    }
                    walk(p, &here, found);
                }
            }
        }
        walk(&schema, "", &mut found);
        assert!(found.len() >= 4, "{found:?}");
        for (field, pattern) in found {
            assert_eq!(pattern.as_deref(), Some(SCHEMA_PATTERN), "{field}");
        }
    }
}
