//! `fleetwatch tail`.

use std::io::Write;
use std::sync::Arc;

use anyhow::Context;
use clap::{Args, ValueEnum};
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
    let tls = Arc::new(fleetwatch_certs::client_config(&files)?);
    let mut opts = SubscriberOptions::new(hub, tls);
    opts.durable = args.name;
    opts.clusters = args.clusters;
    opts.from = match args.from {
        From::Earliest => StartFrom::Earliest,
        From::Latest => StartFrom::Latest,
    };
    let mut sub = Subscription::connect(opts).await.context("cannot subscribe")?;
    let shutdown = crate::shutdown_on_signals();
    let mut printed = 0u64;
    let stdout = std::io::stdout();
    loop {
        let delivery = tokio::select! {
            d = sub.next() => d?,
            _ = shutdown.cancelled() => break,
        };
        let mut out = stdout.lock();
        let mut handled = delivery.last_cursor();
        match &delivery {
            Delivery::Events(events) => {
                for e in events {
                    writeln!(out, "{}", encode(e)).context("stdout")?;
                    printed += 1;
                    if args.count.is_some_and(|n| printed >= n) {
                        // Stop mid-batch: acknowledge only what was printed.
                        handled = e.cursor;
                        break;
                    }
                }
            }
            Delivery::ResyncRequired(r) => {
                let line = serde_json::json!({
                    "type": "resync-required", "cluster": r.cluster, "cursor": r.cursor, "reason": r.reason,
                });
                writeln!(out, "{line}").context("stdout")?;
            }
        }
        out.flush().context("stdout")?;
        drop(out);
        // Printed means handled: acknowledge so a durable subscription resumes after it.
        if let Some(c) = handled {
            sub.ack(c).await?;
        }
        if args.count.is_some_and(|n| printed >= n) {
            break;
        }
    }
    sub.close().await;
    Ok(())
}
