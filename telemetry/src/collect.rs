//! Writing the families a [`Collector`](prometheus_client::collector::Collector) reads at
//! scrape time: each call writes one family (its `# HELP` and `# TYPE` lines, then its
//! samples) through prometheus-client's encoder, so names, escaping and the counters'
//! `_total` suffix are the library's, as for the instruments kept up to date.
//!
//! The HELP text is written as given: a collector whose families used to end their HELP
//! with a full stop (as [`Registry::register`](prometheus_client::registry::Registry::register)
//! adds one) passes it with the stop.

use prometheus_client::encoding::{
    DescriptorEncoder, EncodeCounterValue, EncodeGaugeValue, EncodeLabelSet, EncodeMetric,
};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;

/// A gauge family with one unlabelled sample.
pub fn gauge<V: EncodeGaugeValue>(e: &mut DescriptorEncoder, name: &str, help: &str, value: V) -> std::fmt::Result {
    ConstGauge::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

/// A counter family with one unlabelled sample (`name_total`).
pub fn counter<V: EncodeCounterValue>(e: &mut DescriptorEncoder, name: &str, help: &str, value: V) -> std::fmt::Result {
    ConstCounter::new(value).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

/// A gauge family with one sample per label set; none at all writes the family alone
/// (dashboards and alerts see it declared before its first series).
pub fn gauges<'a, L, V>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (&'a L, V)>,
) -> std::fmt::Result
where
    L: EncodeLabelSet + 'a,
    V: EncodeGaugeValue,
{
    let mut family = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in samples {
        ConstGauge::new(value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter family with one sample (`name_total{…}`) per label set.
pub fn counters<'a, L, V>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (&'a L, V)>,
) -> std::fmt::Result
where
    L: EncodeLabelSet + 'a,
    V: EncodeCounterValue,
{
    let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in samples {
        ConstCounter::new(value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A gauge family with at most one unlabelled sample: `None` writes the family alone.
pub fn maybe_gauge<V: EncodeGaugeValue>(
    e: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    value: Option<V>,
) -> std::fmt::Result {
    let metric = e.encode_descriptor(name, help, None, MetricType::Gauge)?;
    match value {
        Some(v) => ConstGauge::new(v).encode(metric),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::collector::Collector;
    use prometheus_client::registry::Registry;

    #[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
    struct Labels {
        cluster: String,
        phase: String,
    }

    #[derive(Debug)]
    struct Fixed;

    impl Collector for Fixed {
        fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
            gauge(&mut e, "ready", "Ready (1) or not (0).", 1i64)?;
            counter(&mut e, "evicted", "Records evicted.", 7u64)?;
            let rows = [Labels { cluster: "a\"b".into(), phase: "running".into() }];
            gauges(&mut e, "watches", "Watches by phase.", rows.iter().map(|l| (l, 2i64)))?;
            counters(&mut e, "sessions", "Sessions opened.", rows.iter().map(|l| (l, 3u64)))?;
            gauges(&mut e, "empty", "Nothing yet.", std::iter::empty::<(&Labels, f64)>())?;
            maybe_gauge(&mut e, "earliest", "Seconds left.", Some(1.5f64))?;
            maybe_gauge::<f64>(&mut e, "none", "Not known.", None)
        }
    }

    #[test]
    fn families_are_written_with_their_type_labels_and_values() {
        let mut r = Registry::with_prefix("fw");
        r.register_collector(Box::new(Fixed));
        let text = crate::exposition::encode(&[&r]);
        assert_eq!(
            text,
            "# HELP fw_ready Ready (1) or not (0).\n# TYPE fw_ready gauge\nfw_ready 1\n\
             # HELP fw_evicted Records evicted.\n# TYPE fw_evicted counter\nfw_evicted_total 7\n\
             # HELP fw_watches Watches by phase.\n# TYPE fw_watches gauge\n\
             fw_watches{cluster=\"a\\\"b\",phase=\"running\"} 2\n\
             # HELP fw_sessions Sessions opened.\n# TYPE fw_sessions counter\n\
             fw_sessions_total{cluster=\"a\\\"b\",phase=\"running\"} 3\n\
             # HELP fw_empty Nothing yet.\n# TYPE fw_empty gauge\n\
             # HELP fw_earliest Seconds left.\n# TYPE fw_earliest gauge\nfw_earliest 1.5\n\
             # HELP fw_none Not known.\n# TYPE fw_none gauge\n# EOF\n"
        );
    }
}
