//! The `--log` filter (and `RUST_LOG`), checked before it is used.
//!
//! tracing's `EnvFilter` takes a bare word that is not a level for a target: `--log
//! verbose` or `--log warning` became "every level of a module named `verbose`", which
//! muted almost every log without a word. Here a bare word must be a level; a target is
//! given with its level (`fleetwatch_hub=debug`), and every directive must be one
//! `EnvFilter` accepts.

/// The levels a bare directive may name.
const LEVELS: [&str; 6] = ["trace", "debug", "info", "warn", "error", "off"];

/// Checks a filter: every comma-separated directive is a level or a `TARGET[span]=LEVEL`
/// directive tracing accepts. Answers the filter as given, or why it is refused (naming the
/// directive and what was probably meant).
///
/// ```ignore
/// assert!(check("info,fleetwatch_hub=debug").is_ok());
/// assert!(check("warning").unwrap_err().contains("did you mean `warn`"));
/// ```
pub fn check(filter: &str) -> Result<String, String> {
    for directive in filter.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        if !directive.contains('=') && !directive.contains('[') {
            if LEVELS.contains(&directive.to_ascii_lowercase().as_str()) {
                continue;
            }
            let hint = match directive.to_ascii_lowercase().as_str() {
                "warning" => " (did you mean `warn`?)".to_string(),
                "verbose" | "all" => " (did you mean `debug` or `trace`?)".to_string(),
                "err" | "fatal" | "critical" => " (did you mean `error`?)".to_string(),
                "none" | "quiet" | "silent" => " (did you mean `off`?)".to_string(),
                _ => format!(" (for a target's logs give its level: `{directive}=debug`)"),
            };
            return Err(format!("`{directive}` is not a log level: one of {}{hint}", LEVELS.join(", ")));
        }
        if let Err(e) = checked_directive(directive) {
            return Err(format!("`{directive}` is not a log filter directive (TARGET=LEVEL): {e}"));
        }
    }
    Ok(filter.to_string())
}

/// For clap: `--log` refused with the reason at parse time.
pub fn parse(filter: &str) -> Result<String, String> {
    check(filter)
}

/// One `TARGET[span]=LEVEL` directive, as tracing parses it (it refuses a level that is not
/// one: `fleetwatch_hub=verbose`).
fn checked_directive(s: &str) -> Result<(), String> {
    if s.ends_with('=') {
        return Err(format!("no level after `=`: one of {}", LEVELS.join(", ")));
    }
    s.parse::<tracing_subscriber::filter::Directive>().map(drop).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn levels_and_target_directives_are_taken() {
        for ok in [
            "info",
            "WARN",
            "off",
            "info,fleetwatch_hub=debug",
            "kube_client=off",
            "fleetwatch_hub::session=trace",
            " debug , hyper=warn ",
        ] {
            assert!(check(ok).is_ok(), "{ok}: {:?}", check(ok));
        }
    }

    #[test]
    fn a_bare_word_that_is_not_a_level_is_refused_with_what_was_meant() {
        let e = check("warning").unwrap_err();
        assert!(e.contains("`warning` is not a log level") && e.contains("did you mean `warn`"), "{e}");
        let e = check("verbose").unwrap_err();
        assert!(e.contains("did you mean `debug` or `trace`"), "{e}");
        let e = check("info,fleetwatch_hub").unwrap_err();
        assert!(e.contains("`fleetwatch_hub=debug`"), "{e}");
    }

    #[test]
    fn a_directive_with_a_bad_level_is_refused() {
        let e = check("fleetwatch_hub=verbose").unwrap_err();
        assert!(
            e.contains("`fleetwatch_hub=verbose` is not a log filter directive") && e.contains("expected one of"),
            "{e}"
        );
        assert!(check("fleetwatch_hub=").is_err());
    }
}
