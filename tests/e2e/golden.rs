//! Golden transcripts (`tests/golden/*.json`): sessions of released protocol versions,
//! replayed in file-name order against a real hub process over real mutual TLS. A change
//! that stops the hub reading a released frame, or changes an answer a released client
//! relies on, fails here. See `tests/golden/README.md` for the format.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_certs::TlsFiles;
use fleetwatch_client::transport::{ClientWs, connect};
use fleetwatch_protocol::codec::Limits;
use futures_util::{SinkExt, StreamExt};
use serde_json::Value;
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

fn golden_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/golden")
}

/// Whether `got` contains `want`: objects key by key (extra keys in `got` allowed), arrays
/// of the same length element by element, scalars equal. Returns where they differ.
fn contains(got: &Value, want: &Value, at: &str) -> Result<(), String> {
    match (got, want) {
        (Value::Object(g), Value::Object(w)) => {
            for (k, wv) in w {
                let here = format!("{at}.{k}");
                match g.get(k) {
                    Some(gv) => contains(gv, wv, &here)?,
                    None => return Err(format!("{here} is missing")),
                }
            }
            Ok(())
        }
        (Value::Array(g), Value::Array(w)) => {
            if g.len() != w.len() {
                return Err(format!("{at} has {} elements, expected {}", g.len(), w.len()));
            }
            for (i, (gv, wv)) in g.iter().zip(w).enumerate() {
                contains(gv, wv, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        (g, w) if g == w => Ok(()),
        (g, w) => Err(format!("{at} is {g}, expected {w}")),
    }
}

enum Next {
    Text(String),
    Close(u16),
    Gone(String),
}

async fn next(ws: &mut ClientWs) -> Next {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), ws.next()).await {
            Err(_) => return Next::Gone("nothing within 20 s".into()),
            Ok(Some(Ok(Message::Text(t)))) => return Next::Text(t.to_string()),
            Ok(Some(Ok(Message::Close(f)))) => return Next::Close(f.map_or(1005, |f| f.code.into())),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Next::Gone(e.to_string()),
            Ok(None) => return Next::Gone("end of stream".into()),
        }
    }
}

async fn replay(pki: &Pki, port: u16, name: &str, transcript: &Value) -> Result<usize, String> {
    let identity = &transcript["identity"];
    let files: TlsFiles = match (identity["agent"].as_str(), identity["subscriber"].as_str()) {
        (Some(cluster), None) => pki.agent(cluster),
        (None, Some(sub)) => pki.subscriber(sub),
        _ => return Err(format!("{name}: identity must name one agent or one subscriber")),
    };
    let tls = Arc::new(fleetwatch_certs::client_config(&files).map_err(|e| e.to_string())?);
    let url = format!("wss://127.0.0.1:{port}").parse().map_err(|e| format!("{e}"))?;
    let mut ws = connect(&url, tls, &Limits::default(), Duration::from_secs(10)).await.map_err(|e| e.to_string())?;
    let steps = transcript["steps"].as_array().ok_or(format!("{name}: no steps"))?;
    for (i, step) in steps.iter().enumerate() {
        let at = format!("{name} step {i}");
        if let Some(msg) = step.get("send") {
            ws.send(Message::text(msg.to_string())).await.map_err(|e| format!("{at}: send: {e}"))?;
        } else if let Some(want) = step.get("expect") {
            match next(&mut ws).await {
                Next::Text(t) => {
                    let got: Value = serde_json::from_str(&t).map_err(|e| format!("{at}: not JSON ({e}): {t}"))?;
                    contains(&got, want, "$").map_err(|e| format!("{at}: {e}\n  got {t}"))?;
                }
                Next::Close(c) => return Err(format!("{at}: closed ({c}) instead of {want}")),
                Next::Gone(why) => return Err(format!("{at}: {why} instead of {want}")),
            }
        } else if let Some(code) = step.get("expect_close").and_then(Value::as_u64) {
            loop {
                match next(&mut ws).await {
                    Next::Text(_) => continue,
                    Next::Close(c) if u64::from(c) == code => break,
                    Next::Close(c) => return Err(format!("{at}: closed with {c}, expected {code}")),
                    Next::Gone(why) => return Err(format!("{at}: {why} instead of close {code}")),
                }
            }
        } else if step.get("close").is_some() {
            ws.close(None).await.map_err(|e| format!("{at}: close: {e}"))?;
            // Wait for the hub's close answer, so the next transcript finds the session ended.
            while let Next::Text(_) = next(&mut ws).await {}
        } else {
            return Err(format!("{at}: unknown step {step}"));
        }
    }
    Ok(steps.len())
}

#[test]
fn the_subset_match_can_fail() {
    let got = serde_json::json!({"type": "ack", "seq": 2, "extra": [1, 2]});
    assert!(contains(&got, &serde_json::json!({"type": "ack"}), "$").is_ok());
    assert!(contains(&got, &serde_json::json!({"seq": 3}), "$").is_err());
    assert!(contains(&got, &serde_json::json!({"missing": 1}), "$").is_err());
    assert!(contains(&got, &serde_json::json!({"extra": [1]}), "$").is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transcripts_replay_against_a_real_hub() {
    let pki = Pki::new();
    // A data directory: the durable subscriber's cursor is kept (an in-memory hub tells a
    // durable name it does not know to resync everything).
    let data = tempfile::tempdir().unwrap();
    let hub = HubProc::start(&pki, free_port(), Some(data.path()), &[]);
    let mut files: Vec<PathBuf> = std::fs::read_dir(golden_dir())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "golden transcripts missing: {files:?}");
    let mut steps = 0;
    for file in &files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let transcript: Value = serde_json::from_slice(&std::fs::read(file).unwrap()).unwrap();
        match replay(&pki, hub.port, &name, &transcript).await {
            Ok(n) => steps += n,
            Err(e) => panic!("golden transcript failed: {e}\nhub log:\n{}", hub.proc.stderr()),
        }
    }
    assert!(steps > 30, "{steps} steps");
    // The versions agents speak show in the clusters API.
    let clusters = hub.clusters().await;
    let list = clusters["clusters"].as_array().cloned().unwrap_or_default();
    let future = list.iter().find(|c| c["cluster"] == "golden-future").cloned().unwrap_or_default();
    assert_eq!(future["protocol"], 1, "{clusters}");
    assert_eq!(future["agentProtocols"], "1..2", "{clusters}");
    assert_eq!(future["agentVersion"], "9.0.0", "{clusters}");
    // A connected future agent shows in the skew metric: its newest protocol, its build,
    // and the version its session speaks.
    let live = serde_json::json!({"steps": [
        {"send": {"type": "hello", "protocol": 2, "min_protocol": 1, "agent_version": "9.0.0", "cluster": "golden-live", "epoch": 1}},
        {"expect": {"type": "welcome", "protocol": 1}}
    ]});
    let files = pki.agent("golden-live");
    let tls = Arc::new(fleetwatch_certs::client_config(&files).unwrap());
    let url = format!("wss://127.0.0.1:{}", hub.port).parse().unwrap();
    let mut ws = connect(&url, tls, &Limits::default(), Duration::from_secs(10)).await.unwrap();
    for step in live["steps"].as_array().unwrap() {
        if let Some(msg) = step.get("send") {
            ws.send(Message::text(msg.to_string())).await.unwrap();
        } else if let Next::Text(t) = next(&mut ws).await {
            contains(&serde_json::from_str(&t).unwrap(), &step["expect"], "$").unwrap();
        } else {
            panic!("no welcome for golden-live");
        }
    }
    let series = r#"fleetwatch_hub_cluster_agent_protocol{runtime_cluster="golden-live",agent_version="9.0.0",session_protocol="1"} 2"#;
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(metrics.lines().any(|l| l == series), "no {series} in\n{metrics}");
    // The refused agent and subscriber are counted for the skew alert.
    let refused = metrics
        .lines()
        .find(|l| l.starts_with("fleetwatch_hub_rejected_total{reason=\"protocol-version\"}"))
        .unwrap_or_else(|| panic!("no protocol-version rejections in\n{metrics}"));
    assert!(refused.ends_with(" 2"), "{refused}");
}

/// A stand-in for a hub of another protocol range (real TLS, a real WebSocket): the first
/// connection's hello is answered with `unsupported-version`, later ones with a welcome in
/// protocol 9, which the agent does not speak. Sends each hello it received to `hellos`.
async fn foreign_hub(pki: &Pki, listener: tokio::net::TcpListener, hellos: tokio::sync::mpsc::Sender<Value>) {
    let files = TlsFiles { cert: pki.path("hub.crt"), key: pki.path("hub.key"), ca: vec![pki.path("ca.crt")] };
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(fleetwatch_certs::server_config(&files).unwrap()));
    let mut n = 0;
    loop {
        let Ok((tcp, _)) = listener.accept().await else { return };
        let Ok(tls) = acceptor.accept(tcp).await else { continue };
        let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else { continue };
        let hello = loop {
            match ws.next().await {
                Some(Ok(Message::Text(t))) => break serde_json::from_str::<Value>(&t).unwrap_or_default(),
                Some(Ok(_)) => continue,
                _ => break Value::Null,
            }
        };
        let epoch = hello["epoch"].clone();
        let _ = hellos.send(hello).await;
        n += 1;
        let answer = if n == 1 {
            serde_json::json!({"type": "error", "code": "unsupported-version", "fatal": true,
                "message": "agent protocol not supported: no common protocol version: the peer speaks 1, this side speaks 3..4; upgrade the peer"})
        } else {
            serde_json::json!({"type": "welcome", "protocol": 9, "session": "s", "cluster": "foreign", "epoch": epoch, "acked_seq": 0})
        };
        let _ = ws.send(Message::text(answer.to_string())).await;
        let _ = ws.close(None).await;
    }
}

/// An agent announces its range, logs what to upgrade when the hub has no version in
/// common, waits `--version-retry` (not the seconds of a lost connection), and does not
/// take a welcome in a protocol it does not speak.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_with_no_common_version_says_what_to_upgrade_and_waits() {
    let pki = Pki::new();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let (tx, mut hellos) = tokio::sync::mpsc::channel(16);
    let pki = Arc::new(pki);
    tokio::spawn({
        let pki = pki.clone();
        async move { foreign_hub(&pki, listener, tx).await }
    });
    let url = format!("wss://127.0.0.1:{port}");
    let agent = agent(&pki, "foreign", &url, "synthetic:objects=2,rate=20,total=4", &["--version-retry", "1"]);
    let first = tokio::time::timeout(Duration::from_secs(30), hellos.recv()).await.unwrap().unwrap();
    assert_eq!((first["protocol"].as_u64(), first["min_protocol"].as_u64()), (Some(1), Some(1)), "{first}");
    let said = holds_within(Duration::from_secs(20), || agent.stderr().contains("no protocol version in common")).await;
    let log = agent.stderr();
    assert!(said, "{log}");
    let line = log.lines().find(|l| l.contains("no protocol version in common")).unwrap();
    assert!(line.contains("this side speaks 3..4") && line.contains("upgrade"), "{line}");
    assert!(line.contains("agent_protocols=1") && line.contains("retry_in=1s"), "{line}");
    // The retry: welcomed in protocol 9, which this agent refuses.
    tokio::time::timeout(Duration::from_secs(30), hellos.recv()).await.unwrap().unwrap();
    let refused = holds_within(Duration::from_secs(20), || agent.stderr().contains("the hub chose protocol 9")).await;
    assert!(refused, "{}", agent.stderr());
}
