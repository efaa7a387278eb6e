//! The relays' sinks against real HTTP servers on loopback: the KLM listener contract
//! (support/klm_listener.rs) and a CloudEvents receiver that checks signatures.

#![allow(clippy::unwrap_used, reason = "an integration test: a failed unwrap is a failed test")]

mod support;

use std::sync::{Arc, Mutex};

use fleetwatch_client::sink::{Accepted, Sink, SinkError};
use fleetwatch_client::subscriber::Delivery;
use fleetwatch_protocol::event::{Event, ObjectKey};
use fleetwatch_protocol::message::ResyncRequired;
use fleetwatch_relay::http::{HttpOptions, client};
use fleetwatch_relay::identity::{IdentityMinter, IdentityOptions};
use fleetwatch_relay::klm::{KlmConfig, KlmSink, Route, Routes};
use fleetwatch_relay::metrics::{Counter, Metrics, Refused};
use fleetwatch_relay::webhook::{WebhookConfig, WebhookSink, verify_signature};
use serde_json::json;
use support::klm_listener::KlmListener;

fn ev(cluster: &str, cursor: u64, kind: &str, ns: &str, name: &str, deleted: bool) -> Event {
    let key = ObjectKey::new("operator.kyma-project.io/v1beta2", kind, Some(ns), name);
    let mut e = if deleted {
        Event::deleted(cluster, 1, cursor, &key, json!({}))
    } else {
        Event::applied(cluster, 1, cursor, &key, json!({}))
    };
    e.cursor = Some(cursor);
    e
}

fn body(ns: &str, name: &str, kind: &str) -> serde_json::Value {
    json!({"watched": {"namespace": ns, "name": name},
           "watchedGvk": {"group": "operator.kyma-project.io", "version": "v1beta2", "kind": kind}})
}

fn klm_sink(target: &str, metrics: Arc<Metrics>) -> KlmSink {
    klm_sink_with(target, metrics, KlmConfig::default())
}

fn klm_sink_with(target: &str, metrics: Arc<Metrics>, cfg: KlmConfig) -> KlmSink {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let route = Route { target: target.into(), component: "lifecycle-manager".into() };
    let (_tx, rx) = tokio::sync::watch::channel(Arc::new(Routes::single(route)));
    std::mem::forget(_tx);
    let identity = Arc::new(IdentityMinter::ephemeral(IdentityOptions::default()).unwrap());
    KlmSink::new(cfg, client(&HttpOptions::default()).unwrap(), identity, rx, metrics)
}

#[tokio::test]
async fn the_test_listener_enforces_the_contract() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let listener = KlmListener::start(None).await;
    let http = reqwest::Client::new();
    let url = format!("{}/v2/lifecycle-manager/event", listener.url());
    assert_eq!(http.get(&url).send().await.unwrap().status(), 405);
    let big = vec![b'x'; 16 * 1024 + 1];
    assert_eq!(http.post(&url).body(big).send().await.unwrap().status(), 413);
    let ok_body = serde_json::to_vec(&body("kyma-system", "default", "Kyma")).unwrap();
    assert_eq!(http.post(&url).body(ok_body.clone()).send().await.unwrap().status(), 401, "no XFCC");
    let xfcc = IdentityMinter::ephemeral(IdentityOptions::default()).unwrap().xfcc("rt-9").unwrap();
    let r = http.post(&url).header("X-Forwarded-Client-Cert", &*xfcc).body(ok_body).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(listener.received()[0].runtime, "rt-9");
}

#[tokio::test]
async fn klm_relays_the_contract_and_continues_after_an_outage() {
    let listener = KlmListener::start(None).await;
    let metrics = Arc::new(Metrics::new("klm"));
    let mut sink = klm_sink(&listener.url(), metrics.clone());
    let url = format!("{}/v2/lifecycle-manager/event", listener.url());

    let first = Delivery::Events(vec![ev("rt-1", 1, "Kyma", "kyma-system", "default", false)]);
    assert_eq!(sink.deliver(&first).await.unwrap(), Accepted::All);
    let got = listener.received();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].component.as_str(), got[0].runtime.as_str()), ("lifecycle-manager", "rt-1"));
    assert_eq!(got[0].body, body("kyma-system", "default", "Kyma"));
    assert_eq!(got[0].content_type, "application/json");

    // Outage: the delivery is refused for retry, nothing counted as delivered.
    listener.set_down(true);
    let second = Delivery::Events(vec![
        ev("rt-2", 2, "Kyma", "kyma-system", "default", false),
        ev("rt-1", 3, "Module", "kyma-system", "m1", false),
    ]);
    let err = sink.deliver(&second).await.unwrap_err();
    assert!(matches!(err, SinkError::Retry { .. }), "{err}");
    assert!(err.to_string().contains("503") && err.to_string().contains("rt-2"), "{err}");
    assert_eq!(metrics.get(Counter::Retries, &url), 1);
    listener.set_down(false);
    assert_eq!(sink.deliver(&second).await.unwrap(), Accepted::All);
    let got = listener.received();
    assert_eq!(got.iter().map(|r| r.runtime.as_str()).collect::<Vec<_>>(), ["rt-1", "rt-2", "rt-1"]);
    assert_eq!(got[2].body, body("kyma-system", "m1", "Module"));
    assert_eq!(metrics.get(Counter::Delivered, &url), 3);

    // The listener process gone: connection refused is retried too.
    listener.stop();
    let third = Delivery::Events(vec![ev("rt-1", 4, "Kyma", "kyma-system", "default", false)]);
    assert!(matches!(sink.deliver(&third).await, Err(SinkError::Retry { .. })));
}

#[tokio::test]
async fn klm_retries_routing_4xx_skips_bad_requests_and_refuses_bodies_over_the_limit() {
    let listener = KlmListener::start(None).await;
    let metrics = Arc::new(Metrics::new("klm"));
    // A path the listener does not serve (a missing route): 404, retried, never skipped.
    let wrong = format!("{}/elsewhere", listener.url());
    let mut sink = klm_sink(&wrong, metrics.clone());
    let d = Delivery::Events(vec![ev("rt-1", 1, "Kyma", "kyma-system", "default", false)]);
    let err = sink.deliver(&d).await.unwrap_err();
    assert!(matches!(err, SinkError::Retry { .. }) && err.to_string().contains("404"), "{err}");
    let wrong_url = format!("{wrong}/v2/lifecycle-manager/event");
    assert_eq!(metrics.get(Counter::Retries, &wrong_url), 1);
    assert_eq!(metrics.get(Counter::Skipped4xx, &wrong_url), 0);
    // 422 (the request itself is wrong): skipped and counted.
    let mut sink = klm_sink(&listener.url(), metrics.clone());
    listener.set_status(Some(422));
    assert_eq!(sink.deliver(&d).await.unwrap(), Accepted::All);
    assert_eq!(metrics.get(Counter::Skipped4xx, &format!("{}/v2/lifecycle-manager/event", listener.url())), 1);
    // With a dead-letter file: kept there, then acknowledged; once the file is full, not
    // acknowledged (retried) instead of dropped.
    let dir = tempfile::tempdir().unwrap();
    let dl = Arc::new(fleetwatch_relay::dead_letter::DeadLetter::open(dir.path(), "klm", 600).unwrap());
    let cfg = KlmConfig { dead_letter: Some(dl.clone()), ..KlmConfig::default() };
    let mut kept = klm_sink_with(&listener.url(), metrics.clone(), cfg);
    assert_eq!(kept.deliver(&d).await.unwrap(), Accepted::All);
    let line = std::fs::read_to_string(dl.path()).unwrap();
    assert!(line.contains("\"status\":422") && line.contains("kyma-system"), "{line}");
    let listener_url = format!("{}/v2/lifecycle-manager/event", listener.url());
    assert_eq!(metrics.get(Counter::DeadLettered, &listener_url), 1);
    let mut full = None;
    for _ in 0..5 {
        if let Err(e) = kept.deliver(&d).await {
            full = Some(e.to_string());
            break;
        }
    }
    let full = full.expect("a full dead-letter file stops acknowledging");
    assert!(full.contains("is full") && full.contains("422"), "{full}");
    listener.set_status(None);
    let refused_before = listener.refused().len();

    let mut sink = klm_sink(&listener.url(), metrics.clone());
    let huge = ev("rt-1", 2, "Kyma", "kyma-system", &"n".repeat(17 * 1024), false);
    let small = ev("rt-1", 3, "Kyma", "kyma-system", "ok", false);
    assert_eq!(sink.deliver(&Delivery::Events(vec![huge, small])).await.unwrap(), Accepted::All);
    let url = format!("{}/v2/lifecycle-manager/event", listener.url());
    assert_eq!(metrics.get_refused(Refused::TooLarge, &url), 1);
    let got = listener.received();
    assert_eq!(got.len(), 1, "the oversized event was never sent");
    assert_eq!(got[0].body["watched"]["name"], "ok");
    assert_eq!(listener.refused().len(), refused_before, "{:?}", listener.refused());
}

#[tokio::test]
async fn klm_resync_sends_known_objects_else_the_kyma_fallback() {
    let listener = KlmListener::start(None).await;
    let mut sink = klm_sink(&listener.url(), Arc::new(Metrics::new("klm")));
    let d = Delivery::Events(vec![
        ev("rt-1", 1, "Kyma", "kyma-system", "default", false),
        ev("rt-1", 2, "Module", "kyma-system", "a", false),
        ev("rt-1", 3, "Module", "kyma-system", "b", false),
        ev("rt-1", 4, "Module", "kyma-system", "b", true),
    ]);
    sink.deliver(&d).await.unwrap();
    let before = listener.received().len();
    assert_eq!(before, 4);
    let resync = |cluster: &str, cursor| {
        Delivery::ResyncRequired(ResyncRequired { cluster: cluster.into(), cursor, reason: "evicted".into() })
    };
    sink.deliver(&resync("rt-1", 5)).await.unwrap();
    let got: Vec<_> = listener.received()[before..].to_vec();
    let mut names: Vec<_> = got.iter().map(|r| r.body["watched"]["name"].as_str().unwrap().to_string()).collect();
    names.sort();
    assert_eq!(names, ["a", "default"], "every known object once, the deleted one not");
    assert!(got.iter().all(|r| r.runtime == "rt-1"));

    let n = listener.received().len();
    sink.deliver(&resync("rt-new", 6)).await.unwrap();
    let got: Vec<_> = listener.received()[n..].to_vec();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].runtime.as_str(), &got[0].body), ("rt-new", &body("kyma-system", "default", "Kyma")));

    let n = listener.received().len();
    sink.deliver(&resync("*", 7)).await.unwrap();
    let got: Vec<_> = listener.received()[n..].to_vec();
    assert_eq!(got.len(), 2, "{got:?}");
    assert!(got.iter().all(|r| r.runtime == "rt-1"), "{got:?}");
}

/// A CloudEvents receiver: answers the scripted statuses first (then 200), records bodies
/// that carry a valid signature.
struct Receiver {
    url: String,
    got: Arc<Mutex<Vec<(String, serde_json::Value)>>>,
}

async fn receiver(secret: &'static [u8], mut script: Vec<u16>) -> Receiver {
    use axum::http::{HeaderMap, StatusCode};
    let got: Arc<Mutex<Vec<(String, serde_json::Value)>>> = Arc::default();
    script.reverse();
    let script = Arc::new(Mutex::new(script));
    let g = got.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |headers: HeaderMap, body: axum::body::Bytes| {
            let (g, script) = (g.clone(), script.clone());
            async move {
                if let Some(s) = script.lock().unwrap().pop() {
                    return StatusCode::from_u16(s).unwrap();
                }
                let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA256, secret);
                let sig = headers.get("x-fleetwatch-signature").and_then(|v| v.to_str().ok()).unwrap_or("");
                if !verify_signature(&key, &body, sig) {
                    return StatusCode::UNAUTHORIZED;
                }
                let ct = headers.get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                g.lock().unwrap().push((ct, serde_json::from_slice(&body).unwrap()));
                StatusCode::ACCEPTED
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/hook", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Receiver { url, got }
}

#[tokio::test]
async fn webhook_posts_signed_cloud_events_retries_5xx_and_auth_4xx() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r = receiver(b"topsecret", vec![503]).await;
    let metrics = Arc::new(Metrics::new("webhook"));
    let cfg = WebhookConfig::new(r.url.clone()).with_secret(b"topsecret");
    let mut sink = WebhookSink::new(cfg, client(&HttpOptions::default()).unwrap(), metrics.clone());
    let d = Delivery::Events(vec![ev("c1", 1, "Kyma", "ns", "a", false), ev("c1", 2, "Kyma", "ns", "b", false)]);
    assert!(matches!(sink.deliver(&d).await, Err(SinkError::Retry { .. })));
    assert_eq!(sink.deliver(&d).await.unwrap(), Accepted::All);
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 2);
    assert!(got[0].0.starts_with("application/cloudevents+json"), "{}", got[0].0);
    assert_eq!((got[0].1["cursor"].as_str(), got[1].1["cursor"].as_str()), (Some("1"), Some("2")));
    assert_eq!(metrics.get(Counter::Retries, &r.url), 1);
    assert_eq!(metrics.get(Counter::Delivered, &r.url), 2);

    // A wrong secret: 401 from the receiver, retried (a credential fixed by people while
    // the relay waits), never skipped.
    let cfg = WebhookConfig::new(r.url.clone()).with_secret(b"wrong");
    let mut bad = WebhookSink::new(cfg, client(&HttpOptions::default()).unwrap(), metrics.clone());
    let err = bad.deliver(&d).await.unwrap_err();
    assert!(matches!(err, SinkError::Retry { .. }) && err.to_string().contains("401"), "{err}");
    assert_eq!(metrics.get(Counter::Skipped4xx, &r.url), 0);
    assert_eq!(metrics.get(Counter::Retries, &r.url), 2);
    assert_eq!(r.got.lock().unwrap().len(), 2);
}

#[tokio::test]
async fn webhook_batches_filter_types_and_relays_resyncs() {
    let _ = rustls::crypto::ring::default_provider().install_default();
    let r = receiver(b"k", vec![]).await;
    let metrics = Arc::new(Metrics::new("webhook"));
    let mut cfg = WebhookConfig::new(r.url.clone()).with_secret(b"k");
    cfg.batch = 2;
    cfg.types = vec!["dev.fleetwatch.object.applied".into()];
    let mut sink = WebhookSink::new(cfg, client(&HttpOptions::default()).unwrap(), metrics.clone());
    let d = Delivery::Events(vec![
        ev("c1", 1, "Kyma", "ns", "a", false),
        ev("c1", 2, "Kyma", "ns", "a", true),
        ev("c1", 3, "Kyma", "ns", "b", false),
        ev("c1", 4, "Kyma", "ns", "c", false),
    ]);
    sink.deliver(&d).await.unwrap();
    sink.deliver(&Delivery::ResyncRequired(ResyncRequired { cluster: "c1".into(), cursor: 5, reason: "r".into() }))
        .await
        .unwrap();
    let got = r.got.lock().unwrap().clone();
    assert_eq!(got.len(), 3, "{got:?}");
    assert!(got[0].0.starts_with("application/cloudevents-batch+json"));
    let cursors: Vec<Vec<u64>> = got[..2]
        .iter()
        .map(|(_, v)| v.as_array().unwrap().iter().map(|e| e["cursor"].as_str().unwrap().parse().unwrap()).collect())
        .collect();
    assert_eq!(cursors, [vec![1, 3], vec![4]], "the delete was filtered by type");
    assert_eq!(got[2].1[0]["type"], "dev.fleetwatch.resync.required");
    assert_eq!(got[2].1[0]["subject"], "c1");
}
