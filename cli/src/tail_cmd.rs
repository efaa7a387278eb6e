//! `fleetwatch tail`: a durable subscriber that prints the stream as JSON lines, written as a
//! [`Sink`] so the subscriber client acknowledges only what reached stdout.

use std::io::Write;

use anyhow::Context;
use clap::{Args, ValueEnum};
use fleetwatch_client::sink::{Accepted, Sink, SinkError, pump};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_protocol::codec::encode;
use fleetwatch_protocol::message::StartFrom;

#[derive(Args)]
pub struct TailArgs {
    /// The hub and the subscriber's certificate.
    #[command(flatten)]
    conn: crate::HubClientArgs,
    /// Durable subscription name: the hub keeps the position and resumes there.
    #[arg(long, env = "FLEETWATCH_NAME")]
    name: Option<String>,
    /// Only these clusters (repeatable); all when absent.
    #[arg(long = "cluster", env = "FLEETWATCH_CLUSTER")]
    clusters: Vec<String>,
    /// Where to start when there is no stored position.
    #[arg(long, env = "FLEETWATCH_FROM", value_enum, default_value_t = From::Latest)]
    from: From,
    /// Exit after this many events.
    #[arg(long, env = "FLEETWATCH_COUNT")]
    count: Option<u64>,
}

#[derive(Clone, Copy, ValueEnum)]
enum From {
    /// The oldest event the hub still has.
    Earliest,
    /// Only new events.
    Latest,
}

pub async fn run(args: TailArgs) -> anyhow::Result<()> {
    let (hub, files) = args.conn.resolve()?;
    // Followed by content: a renewed certificate is used without a restart.
    let tls = fleetwatch_client::client_tls::ClientTls::from_files(files)?;
    let mut opts = SubscriberOptions::new(hub, tls);
    opts.tls_reload_interval = args.conn.tls_reload_interval()?;
    opts.tls_watch = args.conn.tls_watch();
    opts.durable = args.name;
    opts.clusters = args.clusters;
    opts.from = match args.from {
        From::Earliest => StartFrom::Earliest,
        From::Latest => StartFrom::Latest,
    };
    let mut sub = Subscription::connect(opts).await.context("cannot subscribe")?;
    let shutdown = crate::shutdown_on_signals();
    let mut sink = LinesSink::new(std::io::BufWriter::new(std::io::stdout()), args.count);
    let result = pump(&mut sub, &mut sink, &shutdown).await;
    sub.close().await;
    result?;
    Ok(())
}

/// `tail`'s sink: one JSON line per event or resync marker. Printed (and flushed) means
/// handled, so the pump acknowledges it and a durable subscription resumes after it.
struct LinesSink<W> {
    out: W,
    /// Stop after this many events.
    count: Option<u64>,
    printed: u64,
}

impl<W: Write + Send> LinesSink<W> {
    fn new(out: W, count: Option<u64>) -> Self {
        Self { out, count, printed: 0 }
    }

    fn done(&self) -> bool {
        self.count.is_some_and(|n| self.printed >= n)
    }

    fn write(&mut self, delivery: &Delivery) -> std::io::Result<Accepted> {
        match delivery {
            Delivery::Events(events) => {
                for e in events {
                    writeln!(self.out, "{}", encode(e))?;
                    self.printed += 1;
                    if self.done() {
                        // Stop mid-batch: acknowledge only what was printed.
                        self.out.flush()?;
                        return Ok(Accepted::ThenStop { cursor: e.cursor });
                    }
                }
            }
            Delivery::ResyncRequired(r) => {
                let line = serde_json::json!({
                    "type": "resync-required", "cluster": r.cluster, "cursor": r.cursor, "reason": r.reason,
                });
                writeln!(self.out, "{line}")?;
            }
        }
        self.out.flush()?;
        Ok(if self.done() { Accepted::ThenStop { cursor: delivery.last_cursor() } } else { Accepted::All })
    }
}

impl<W: Write + Send> Sink for LinesSink<W> {
    fn name(&self) -> &str {
        "stdout"
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<Accepted, SinkError> {
        // A closed stdout (the reader went away) will not come back: stop.
        self.write(delivery).map_err(|e| SinkError::Fatal { sink: "stdout".into(), source: Box::new(e) })
    }
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::event::{Event, ObjectKey};
    use fleetwatch_protocol::message::ResyncRequired;

    use super::*;

    fn events(cursors: &[u64]) -> Delivery {
        let key = ObjectKey::new("v1", "ConfigMap", Some("default"), "x");
        Delivery::Events(
            cursors
                .iter()
                .map(|&c| {
                    let mut e = Event::applied("c1", 1, c, &key, serde_json::json!({}));
                    e.cursor = Some(c);
                    e
                })
                .collect(),
        )
    }

    #[test]
    fn prints_one_line_per_event_and_marker() {
        let mut sink = LinesSink::new(Vec::new(), None);
        assert_eq!(sink.write(&events(&[1, 2])).unwrap(), Accepted::All);
        let marker = ResyncRequired { cluster: "c1".into(), cursor: 3, reason: "evicted".into() };
        assert_eq!(sink.write(&Delivery::ResyncRequired(marker)).unwrap(), Accepted::All);
        let text = String::from_utf8(sink.out).unwrap();
        let lines: Vec<serde_json::Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(lines[1]["cursor"], 2);
        assert_eq!(lines[2]["type"], "resync-required");
    }

    #[test]
    fn count_stops_mid_batch_at_the_last_printed_cursor() {
        let mut sink = LinesSink::new(Vec::new(), Some(3));
        assert_eq!(sink.write(&events(&[1, 2])).unwrap(), Accepted::All);
        assert_eq!(sink.write(&events(&[3, 4, 5])).unwrap(), Accepted::ThenStop { cursor: Some(3) });
        assert_eq!(String::from_utf8(sink.out).unwrap().lines().count(), 3);
    }
}
