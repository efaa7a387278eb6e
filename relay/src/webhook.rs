//! `relay webhook`: every event as a structured CloudEvent to an HTTP endpoint.
//!
//! - One event: `POST target`, `Content-Type: application/cloudevents+json`, the event in
//!   CloudEvents 1.0 structured mode (fleetwatch's events already use the attribute names;
//!   `cluster`, `epoch`, `seq`, `watch` and `cursor` are extension attributes). `epoch`,
//!   `seq` and `cursor` are 64-bit on the wire but CloudEvents' Integer is signed 32-bit
//!   (an epoch is a microsecond timestamp), so they are decimal strings here
//!   ([`STRING_ATTRIBUTES`]).
//! - `--batch N` (N > 1): up to N events (and at most [`WebhookConfig::max_batch_bytes`]) as
//!   one JSON array, `Content-Type: application/cloudevents-batch+json`.
//! - `resync-required` becomes a CloudEvent of type [`TYPE_RESYNC_REQUIRED`] (subject: the
//!   cluster, `*` for all; `data: {cluster, reason}`), sent whatever the type filter says:
//!   it is how a receiver learns that it must reconcile a cluster fully.
//! - With a secret, `X-Fleetwatch-Signature: sha256=<hex>` is the HMAC-SHA256 of the exact
//!   body bytes under the secret.
//!
//! At least once: the hub is acknowledged only after a 2xx. 5xx, 408, 429, timeouts and
//! connection failures are retried with backoff (the same delivery; requests of it that
//! were already accepted are not sent again). Another 4xx is logged once per cause, counted
//! (`fleetwatch_relay_skipped_4xx_total`) and skipped, so one bad event cannot stop the stream.

use std::sync::Arc;

use fleetwatch_client::sink::{Accepted, Sink, SinkError};
use fleetwatch_client::subscriber::Delivery;
use fleetwatch_protocol::event::Event;
use fleetwatch_protocol::message::ResyncRequired;
use serde_json::{Value, json};

use crate::SaidOnce;
use crate::http::{Outcome, hex, send};
use crate::metrics::{Counter, Metrics};

/// CloudEvents `type` of a resync-required marker.
pub const TYPE_RESYNC_REQUIRED: &str = "dev.fleetwatch.resync.required";
/// Content type of one structured CloudEvent.
pub const CONTENT_TYPE: &str = "application/cloudevents+json; charset=utf-8";
/// Content type of a batch of structured CloudEvents.
pub const CONTENT_TYPE_BATCH: &str = "application/cloudevents-batch+json; charset=utf-8";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "X-Fleetwatch-Signature";
/// Most events in one batch (`--batch` is clamped to it).
pub const MAX_BATCH: usize = 1000;

/// What the webhook relay does.
#[derive(Clone)]
pub struct WebhookConfig {
    /// The URL events are posted to.
    pub target: String,
    /// Events per request: 1 sends each as one CloudEvent, more sends batches.
    pub batch: usize,
    /// Most bytes of one batch body (a single event larger than it goes alone).
    pub max_batch_bytes: usize,
    /// Only events whose type starts with one of these (all when empty).
    pub types: Vec<String>,
    /// The HMAC key for [`SIGNATURE_HEADER`].
    pub hmac: Option<ring::hmac::Key>,
    /// Where requests refused for good (400, 413, 422) are kept before they are
    /// acknowledged; without it they are skipped and counted.
    pub dead_letter: Option<std::sync::Arc<crate::dead_letter::DeadLetter>>,
}

impl WebhookConfig {
    /// Unsigned, one event per request, every type.
    pub fn new(target: impl Into<String>) -> Self {
        Self {
            target: target.into(),
            batch: 1,
            max_batch_bytes: 1 << 20,
            types: Vec::new(),
            hmac: None,
            dead_letter: None,
        }
    }

    /// Signs bodies with `secret`.
    pub fn with_secret(mut self, secret: &[u8]) -> Self {
        self.hmac = Some(hmac_key(secret));
        self
    }
}

/// An HMAC-SHA256 key.
pub type HmacKey = ring::hmac::Key;

/// The HMAC-SHA256 key of `secret`.
pub fn hmac_key(secret: &[u8]) -> HmacKey {
    ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret)
}

/// The signature header's value for `body`: `sha256=<hex of HMAC-SHA256(secret, body)>`.
pub fn signature(key: &ring::hmac::Key, body: &[u8]) -> String {
    format!("sha256={}", hex(ring::hmac::sign(key, body).as_ref()))
}

/// Checks a signature header value against `body` (constant time), as a receiver would.
pub fn verify_signature(key: &ring::hmac::Key, body: &[u8], header: &str) -> bool {
    let Some(hex_sig) = header.strip_prefix("sha256=") else { return false };
    let Ok(sig) = hex::decode(hex_sig) else { return false };
    ring::hmac::verify(key, body, &sig).is_ok()
}

/// Extension attributes that are unsigned 64-bit numbers in fleetwatch's events and go as
/// decimal strings in the CloudEvents form: CloudEvents' Integer type is signed 32-bit
/// (an `epoch` is a microsecond timestamp, far beyond it), and its String type is what
/// the spec suggests for larger numbers. Receivers parse them back with any 64-bit parser.
pub const STRING_ATTRIBUTES: [&str; 3] = ["epoch", "seq", "cursor"];

/// An event as a structured CloudEvent.
pub fn cloud_event(e: &Event) -> Value {
    let mut v = serde_json::to_value(e).unwrap_or(Value::Null);
    if let Some(m) = v.as_object_mut() {
        m.insert("datacontenttype".into(), "application/json".into());
        for k in STRING_ATTRIBUTES {
            if let Some(n) = m.get(k).and_then(Value::as_u64) {
                m.insert(k.into(), Value::String(n.to_string()));
            }
        }
    }
    v
}

/// A resync-required marker as a structured CloudEvent.
pub fn resync_event(r: &ResyncRequired) -> Value {
    let source =
        if r.cluster == "*" { "/fleetwatch".to_string() } else { fleetwatch_protocol::event::source_for(&r.cluster) };
    json!({
        "specversion": "1.0",
        "id": format!("resync/{}/{}", r.cluster, r.cursor),
        "source": source,
        "type": TYPE_RESYNC_REQUIRED,
        "subject": r.cluster,
        "time": jiff::Timestamp::now(),
        "datacontenttype": "application/json",
        "cluster": r.cluster,
        // A string: see STRING_ATTRIBUTES.
        "cursor": r.cursor.to_string(),
        "data": {"cluster": r.cluster, "reason": r.reason},
    })
}

/// One request's worth of events: bodies are built before sending.
#[derive(Debug, Clone, PartialEq)]
pub struct Request {
    /// The cursor of the last event in it (progress within a delivery).
    pub last_cursor: u64,
    /// How many events it carries.
    pub events: usize,
    /// The body.
    pub body: Vec<u8>,
    /// Whether it is a batch.
    pub batch: bool,
}

/// Splits `items` (cursor, CloudEvent) into requests: single events, or batches of at most
/// `batch` events and `max_bytes` bytes (a single event over `max_bytes` goes alone).
pub fn requests(items: &[(u64, Value)], batch: usize, max_bytes: usize) -> Vec<Request> {
    let batch = batch.clamp(1, MAX_BATCH);
    let mut out = Vec::new();
    if batch == 1 {
        for (c, v) in items {
            out.push(Request { last_cursor: *c, events: 1, body: v.to_string().into_bytes(), batch: false });
        }
        return out;
    }
    let mut cur: Vec<String> = Vec::new();
    let mut size = 2usize;
    let mut last = 0;
    let flush = |cur: &mut Vec<String>, last: u64, out: &mut Vec<Request>| {
        if !cur.is_empty() {
            let body = format!("[{}]", cur.join(",")).into_bytes();
            out.push(Request { last_cursor: last, events: cur.len(), body, batch: true });
            cur.clear();
        }
    };
    for (c, v) in items {
        let text = v.to_string();
        if !cur.is_empty() && (cur.len() >= batch || size + 1 + text.len() > max_bytes) {
            flush(&mut cur, last, &mut out);
            size = 2;
        }
        size += text.len() + 1;
        cur.push(text);
        last = *c;
    }
    flush(&mut cur, last, &mut out);
    out
}

/// The webhook relay as a [`Sink`].
pub struct WebhookSink {
    cfg: WebhookConfig,
    client: reqwest::Client,
    metrics: Arc<Metrics>,
    /// Within the delivery being offered: the last cursor the target accepted, so a retry
    /// does not send accepted requests again.
    done_upto: Option<u64>,
    said: SaidOnce,
}

impl WebhookSink {
    /// A sink posting to `cfg.target` with `client`.
    pub fn new(cfg: WebhookConfig, client: reqwest::Client, metrics: Arc<Metrics>) -> Self {
        metrics.register_target(&cfg.target);
        Self { cfg, client, metrics, done_upto: None, said: SaidOnce::new(64) }
    }

    fn wanted(&self, e: &Event) -> bool {
        self.cfg.types.is_empty() || self.cfg.types.iter().any(|p| e.kind.starts_with(p.as_str()))
    }

    async fn post(&mut self, req: &Request) -> Outcome {
        let ct = if req.batch { CONTENT_TYPE_BATCH } else { CONTENT_TYPE };
        let mut rb = self.client.post(&self.cfg.target).header(reqwest::header::CONTENT_TYPE, ct);
        if let Some(key) = &self.cfg.hmac {
            rb = rb.header(SIGNATURE_HEADER, signature(key, &req.body));
        }
        send(rb.body(req.body.clone())).await
    }

    async fn deliver_items(&mut self, items: Vec<(u64, Value)>) -> Result<(), SinkError> {
        let target = self.cfg.target.clone();
        for req in requests(&items, self.cfg.batch, self.cfg.max_batch_bytes) {
            if self.done_upto.is_some_and(|d| req.last_cursor <= d) {
                continue;
            }
            match self.post(&req).await {
                Outcome::Accepted => {
                    self.metrics.add(Counter::Delivered, &target, req.events as u64);
                }
                Outcome::Retry(why) => {
                    self.metrics.add(Counter::Retries, &target, 1);
                    return Err(SinkError::Retry {
                        sink: "webhook".into(),
                        source: format!("{target}: {why} (events up to cursor {})", req.last_cursor).into(),
                    });
                }
                Outcome::Rejected { status, body } if self.cfg.dead_letter.is_some() => {
                    let dl = self.cfg.dead_letter.clone().expect("guarded by the match arm");
                    if let Err(e) = dl.append(&target, status, &body, &req.body) {
                        // Not kept: not acknowledged either; the events wait at the hub.
                        self.metrics.add(Counter::Retries, &target, 1);
                        return Err(SinkError::Retry {
                            sink: "webhook".into(),
                            source: format!(
                                "{target}: {status} {body}, and {e} (events up to cursor {})",
                                req.last_cursor
                            )
                            .into(),
                        });
                    }
                    self.metrics.add(Counter::DeadLettered, &target, req.events as u64);
                    if self.said.first(&format!("{status} {body}")) {
                        tracing::warn!(%target, status, answer = %body, cursor = req.last_cursor, events = req.events,
                            file = %dl.path().display(), "the target refused events for good; kept in the dead-letter file (logged once per cause)");
                    }
                }
                Outcome::Rejected { status, body } => {
                    self.metrics.add(Counter::Skipped4xx, &target, req.events as u64);
                    if self.said.first(&format!("{status} {body}")) {
                        tracing::warn!(%target, status, answer = %body, cursor = req.last_cursor, events = req.events,
                            "the target refused events for good; skipping them (logged once per cause)");
                    }
                }
            }
            self.done_upto = Some(req.last_cursor);
        }
        Ok(())
    }
}

impl Sink for WebhookSink {
    fn name(&self) -> &str {
        "webhook"
    }

    async fn deliver(&mut self, delivery: &Delivery) -> Result<Accepted, SinkError> {
        let items: Vec<(u64, Value)> = match delivery {
            Delivery::Events(events) => {
                let mut items = Vec::with_capacity(events.len());
                let mut filtered = 0;
                for e in events {
                    if self.wanted(e) {
                        items.push((e.cursor.unwrap_or_default(), cloud_event(e)));
                    } else {
                        filtered += 1;
                    }
                }
                if filtered > 0 && self.done_upto.is_none() {
                    self.metrics.filtered(filtered);
                }
                items
            }
            Delivery::ResyncRequired(r) => {
                tracing::info!(cluster = %r.cluster, reason = %r.reason, "relaying resync-required");
                vec![(r.cursor, resync_event(r))]
            }
        };
        self.deliver_items(items).await?;
        self.done_upto = None;
        Ok(Accepted::All)
    }
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::event::ObjectKey;

    use super::*;

    fn ev(cursor: u64) -> Event {
        let key = ObjectKey::new("apps/v1", "Deployment", Some("ns"), "web");
        let mut e = Event::applied("eu-1", 3, cursor, &key, json!({"x": 1}));
        e.cursor = Some(cursor);
        e.watch = Some("deps".into());
        e
    }

    #[test]
    fn an_event_is_a_structured_cloud_event() {
        let v = cloud_event(&ev(7));
        assert_eq!(v["specversion"], "1.0");
        assert_eq!(v["id"], "eu-1/3/7");
        assert_eq!(v["source"], "/clusters/eu-1");
        assert_eq!(v["type"], "dev.fleetwatch.object.applied");
        assert_eq!(v["subject"], "apps/v1/Deployment/ns/web");
        assert_eq!(v["datacontenttype"], "application/json");
        assert_eq!(
            (v["cluster"].as_str(), v["cursor"].as_str(), v["watch"].as_str()),
            (Some("eu-1"), Some("7"), Some("deps"))
        );
        assert_eq!(v["data"]["x"], 1);
        // Every extension attribute name is a valid CloudEvents name: lowercase alphanumeric.
        for k in v.as_object().unwrap().keys() {
            assert!(k.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit()), "{k}");
        }
    }

    #[test]
    fn attributes_beyond_32_bits_are_strings() {
        // A real epoch (microseconds since 1970) and a seq past 2^31.
        let key = ObjectKey::new("v1", "ConfigMap", Some("ns"), "a");
        let mut e = Event::applied("eu-1", 1_795_607_627_785_767, 3_000_000_000, &key, json!({}));
        e.cursor = Some(u64::MAX);
        let v = cloud_event(&e);
        assert_eq!(
            (v["epoch"].as_str(), v["seq"].as_str(), v["cursor"].as_str()),
            (Some("1795607627785767"), Some("3000000000"), Some("18446744073709551615"))
        );
        // Every attribute has a CloudEvents type: String, or an Integer within 32 bits.
        for (k, a) in v.as_object().unwrap().iter().filter(|(k, _)| *k != "data") {
            let ok = a.is_string() || a.is_boolean() || a.as_i64().is_some_and(|n| i32::try_from(n).is_ok());
            assert!(ok, "{k} = {a} has no CloudEvents type");
        }
        let r = resync_event(&ResyncRequired { cluster: "eu-1".into(), cursor: 1 << 40, reason: String::new() });
        assert_eq!(r["cursor"], "1099511627776");
    }

    #[test]
    fn resync_markers_are_cloud_events_too() {
        let v = resync_event(&ResyncRequired { cluster: "eu-1".into(), cursor: 9, reason: "evicted".into() });
        assert_eq!(
            (v["type"].as_str(), v["subject"].as_str(), v["id"].as_str()),
            (Some(TYPE_RESYNC_REQUIRED), Some("eu-1"), Some("resync/eu-1/9"))
        );
        assert_eq!(v["data"], json!({"cluster": "eu-1", "reason": "evicted"}));
        let all = resync_event(&ResyncRequired { cluster: "*".into(), cursor: 1, reason: String::new() });
        assert_eq!(all["source"], "/fleetwatch");
    }

    #[test]
    fn batches_are_bounded_by_count_and_bytes() {
        let items: Vec<_> = (1..=5).map(|c| (c, cloud_event(&ev(c)))).collect();
        let single = requests(&items, 1, 1 << 20);
        assert_eq!(single.len(), 5);
        assert!(!single[0].batch);
        let one: Value = serde_json::from_slice(&single[2].body).unwrap();
        assert_eq!(one["cursor"], "3");

        let batches = requests(&items, 2, 1 << 20);
        assert_eq!(batches.iter().map(|r| (r.events, r.last_cursor)).collect::<Vec<_>>(), [(2, 2), (2, 4), (1, 5)]);
        let arr: Vec<Value> = serde_json::from_slice(&batches[1].body).unwrap();
        assert_eq!(arr.iter().map(|v| v["cursor"].as_str().unwrap()).collect::<Vec<_>>(), ["3", "4"]);

        let one_len = items[0].1.to_string().len();
        let by_bytes = requests(&items, 100, 2 * one_len + 3);
        assert!(
            by_bytes.iter().all(|r| r.body.len() <= 2 * one_len + 3),
            "{:?}",
            by_bytes.iter().map(|r| r.body.len()).collect::<Vec<_>>()
        );
        assert_eq!(by_bytes.iter().map(|r| r.events).sum::<usize>(), 5);
        // An event larger than the byte bound still goes, alone.
        let tiny = requests(&items, 100, 10);
        assert_eq!(tiny.len(), 5);
        assert_eq!(requests(&items, 5000, 1 << 20).len(), 1, "clamped to MAX_BATCH, one request");
    }

    #[test]
    fn signatures_verify_and_detect_changes() {
        let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"s3cret");
        let sig = signature(&key, b"{\"a\":1}");
        assert!(sig.starts_with("sha256=") && sig.len() == 7 + 64, "{sig}");
        assert!(verify_signature(&key, b"{\"a\":1}", &sig));
        assert!(!verify_signature(&key, b"{\"a\":2}", &sig));
        assert!(!verify_signature(&key, b"{\"a\":1}", "sha256=zz"));
        assert!(!verify_signature(&key, b"{\"a\":1}", &sig.replace("sha256=", "sha1=")));
        // The RFC 4231 test case 2 vector: the signature is plain HMAC-SHA256 of the body.
        let jefe = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, b"Jefe");
        assert_eq!(
            signature(&jefe, b"what do ya want for nothing?"),
            "sha256=5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
