//! The answer to a scrape: OpenMetrics text (what [`prometheus_client`] writes), or the
//! text format 0.0.4 for a scraper that asks for `text/plain` and not OpenMetrics, because
//! `promtool check metrics` reads only that format (prometheus/prometheus#8932). Both carry
//! the same samples.

use std::fmt::Write as _;

use prometheus_client::registry::Registry;

/// The content type of OpenMetrics text, what every fleetwatch `/metrics` answers by
/// default (hub, lifecycle operator, relays, agent).
pub const OPENMETRICS_CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
/// The content type of Prometheus' text format 0.0.4, answered to a scraper that asks for
/// it and not for OpenMetrics. `promtool check metrics` reads only this format.
pub const TEXT_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The OpenMetrics exposition of `registries`, one after the other, closed with one
/// `# EOF`. A registry whose encoding fails (a collector's `fmt::Error`) is logged and
/// leaves what it wrote; the answer is still closed, so a scraper reads the rest.
pub fn encode(registries: &[&Registry]) -> String {
    let mut out = String::new();
    for registry in registries {
        if let Err(e) = prometheus_client::encoding::text::encode_registry(&mut out, registry) {
            tracing::error!(error = %e, "cannot encode metrics");
        }
    }
    out.push_str("# EOF\n");
    out
}

/// A component's `/metrics`: its `registries`, then the families every component serves
/// ([`crate::process`]: `fleetwatch_build_info` and the `process_*` metrics), closed with
/// one `# EOF`.
pub fn encode_component(registries: &[&Registry]) -> String {
    let mut all: Vec<&Registry> = registries.to_vec();
    all.push(crate::process::registry());
    encode(&all)
}

/// Whether a scrape's `Accept` header asks for the text format 0.0.4 rather than
/// OpenMetrics: it names `text/plain` and not `application/openmetrics-text`. No header,
/// `*/*` and Prometheus' default (OpenMetrics first) get OpenMetrics.
pub fn wants_text_format(accept: Option<&str>) -> bool {
    accept.is_some_and(|a| {
        let a = a.to_ascii_lowercase();
        a.contains("text/plain") && !a.contains("application/openmetrics-text")
    })
}

/// The answer to a scrape whose `Accept` header is `accept`: its content type and body,
/// from the OpenMetrics exposition `openmetrics`.
pub fn exposition(accept: Option<&str>, openmetrics: String) -> (&'static str, String) {
    if wants_text_format(accept) {
        (TEXT_CONTENT_TYPE, to_text_format(&openmetrics))
    } else {
        (OPENMETRICS_CONTENT_TYPE, openmetrics)
    }
}

/// The families of an OpenMetrics exposition in the text format 0.0.4: a counter family is
/// named by its samples (`x_total`, where OpenMetrics names it `x`), its `_created` samples
/// are left out, `unknown` becomes `untyped`, and `# UNIT` and `# EOF` go. Samples, labels
/// and values are the same in both formats.
pub fn to_text_format(openmetrics: &str) -> String {
    let mut counters = std::collections::HashSet::new();
    for line in openmetrics.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ")
            && let Some((name, "counter")) = rest.split_once(' ')
        {
            counters.insert(name);
        }
    }
    let mut out = String::with_capacity(openmetrics.len() + 8 * counters.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let descriptor =
            line.strip_prefix("# HELP ").map(|r| ("HELP", r)).or(line.strip_prefix("# TYPE ").map(|r| ("TYPE", r)));
        if let Some((kind, rest)) = descriptor {
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            let suffix = if counters.contains(name) { "_total" } else { "" };
            let tail = if kind == "TYPE" && tail == "unknown" { "untyped" } else { tail };
            let _ = writeln!(out, "# {kind} {name}{suffix} {tail}");
            continue;
        }
        let name = line.split(['{', ' ']).next().unwrap_or_default();
        if name.strip_suffix("_created").is_some_and(|family| counters.contains(family)) {
            continue;
        }
        out.push_str(line);
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;
    use prometheus_client::metrics::gauge::Gauge;

    #[test]
    fn openmetrics_is_the_default_and_the_text_format_is_served_on_request() {
        let prometheus = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;q=0.75,\
                          text/plain;version=0.0.4;q=0.5,*/*;q=0.1";
        for accept in [None, Some("*/*"), Some(prometheus), Some("application/openmetrics-text")] {
            assert!(!wants_text_format(accept), "{accept:?}");
            assert_eq!(exposition(accept, "x 1\n# EOF\n".into()).0, OPENMETRICS_CONTENT_TYPE);
        }
        for accept in [Some("text/plain"), Some("text/plain;version=0.0.4;q=1,*/*;q=0.1"), Some("Text/Plain")] {
            assert!(wants_text_format(accept), "{accept:?}");
        }
        let om = "# HELP a_seconds Time spent.\n# TYPE a_seconds counter\n# UNIT a_seconds seconds\n\
                  a_seconds_total{x=\"1 2\"} 1.5\na_seconds_created{x=\"1 2\"} 1700000000.0\n\
                  # HELP g Level.\n# TYPE g gauge\ng 2\n# HELP u What.\n# TYPE u unknown\nu 3\n# EOF\n";
        let (ct, text) = exposition(Some("text/plain"), om.into());
        assert_eq!(ct, TEXT_CONTENT_TYPE);
        assert_eq!(
            text,
            "# HELP a_seconds_total Time spent.\n# TYPE a_seconds_total counter\na_seconds_total{x=\"1 2\"} 1.5\n\
             # HELP g Level.\n# TYPE g gauge\ng 2\n# HELP u What.\n# TYPE u untyped\nu 3\n"
        );
    }

    #[test]
    fn registries_are_encoded_in_turn_and_closed_once() {
        let mut a = Registry::with_prefix("fw_a");
        let c: Counter = Counter::default();
        c.inc_by(3);
        a.register("events", "Events seen", c);
        let mut b = Registry::with_prefix("fw_b");
        let g: Gauge = Gauge::default();
        g.set(-2);
        b.register("level", "A level", g);
        let text = encode(&[&a, &b]);
        assert_eq!(
            text,
            "# HELP fw_a_events Events seen.\n# TYPE fw_a_events counter\nfw_a_events_total 3\n\
             # HELP fw_b_level A level.\n# TYPE fw_b_level gauge\nfw_b_level -2\n# EOF\n"
        );
        // In the text format the counter family is named by its samples.
        assert!(to_text_format(&text).starts_with("# HELP fw_a_events_total Events seen.\n"));
        assert_eq!(encode(&[]), "# EOF\n");
    }
}
