//! Subscribers follow their certificate files like the agent: a `fleetwatch tail` process
//! whose certificate is renewed on disk reconnects with it while connected (a half-written
//! pair keeps the certificate in force), the old certificate can then be revoked, and no
//! event is lost across the switch; and a subscriber whose old certificate is revoked
//! before it noticed the renewal reconnects with the one on disk.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_certs::LeafSpec;

use crate::support::*;

/// Waits for `cond` up to `timeout`; panics with `what` and `context()` when it does not come.
async fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool, context: impl Fn() -> String) {
    eventually(what).within(timeout).context(context).until(async || cond(), |held| *held).await;
}

/// The events `tail` printed: (subject, generation) → times seen, and the seqs seen.
fn printed(tail: &Proc, cluster: &str) -> (HashMap<(String, u64), u32>, BTreeSet<u64>) {
    let mut by_object = HashMap::new();
    let mut seqs = BTreeSet::new();
    for line in tail.stdout_lines.lock().unwrap().iter() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        if v["cluster"] != cluster || v["seq"].as_u64().is_none() {
            continue;
        }
        let subject = v["subject"].as_str().unwrap_or_default().to_string();
        let generation = v["data"]["generation"].as_u64().unwrap_or(0);
        *by_object.entry((subject, generation)).or_insert(0) += 1;
        seqs.extend(v["seq"].as_u64());
    }
    (by_object, seqs)
}

/// Lines of `log` that mention the hub's "subscriber connected" for `serial`.
fn connected_with(log: &str, serial: &str) -> usize {
    log.lines().filter(|l| l.contains("subscriber connected") && l.contains(&format!("serial={serial}"))).count()
}

/// A durable hub following a deny list, and a subscriber certificate in files of its own
/// (as a mounted Secret would be) that a test renews.
struct Renewable {
    hub: HubProc,
    deny: std::path::PathBuf,
    cert: std::path::PathBuf,
    key: std::path::PathBuf,
    old_serial: String,
    files: fleetwatch_certs::TlsFiles,
}

impl Renewable {
    fn start(pki: &Pki) -> Self {
        let deny = pki.path("deny.txt");
        std::fs::write(&deny, "").unwrap();
        let deny_arg = deny.display().to_string();
        let data = pki.path("hub-data");
        let hub =
            HubProc::start(pki, free_port(), Some(&data), &["--deny-list", &deny_arg, "--tls-reload-interval", "1"]);
        let issued = pki.subscriber("tailer");
        let dir = pki.path("tailer-tls");
        std::fs::create_dir_all(&dir).unwrap();
        let (cert, key) = (dir.join("tls.crt"), dir.join("tls.key"));
        std::fs::copy(&issued.cert, &cert).unwrap();
        std::fs::copy(&issued.key, &key).unwrap();
        let old_serial = fleetwatch_certs::inspect_file(&cert).unwrap().serial.to_lowercase();
        let files = fleetwatch_certs::TlsFiles { cert: cert.clone(), key: key.clone(), ca: issued.ca.clone() };
        Self { hub, deny, cert, key, old_serial, files }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reconnects_with_its_renewed_certificate_and_loses_nothing() {
    let pki = Pki::new();
    let Renewable { hub, deny, cert, key, old_serial, files } = Renewable::start(&pki);

    // Events flow before, during and after the switch (about 40 s of them).
    let spec = "synthetic:objects=25,rate=50,total=2000";
    let source: SyntheticSource = spec.parse().unwrap();
    let _agent = agent(&pki, "c1", &hub.url(), spec, &[]);

    let mut args: Vec<String> = vec![
        "tail".into(),
        "--hub".into(),
        hub.url(),
        "--name".into(),
        "durable".into(),
        "--from".into(),
        "earliest".into(),
        "--tls-reload-interval".into(),
        "1".into(),
    ];
    args.extend(client_args(&files));
    let tail = Proc::spawn(&args, pki.path("tail.log"));
    let context = || format!("tail log:\n{}\nhub log:\n{}", tail.stderr(), hub.proc.stderr());
    wait_for(
        "the hub sees the subscriber with its first certificate",
        Duration::from_secs(20),
        || connected_with(&hub.proc.stderr(), &old_serial) >= 1,
        context,
    )
    .await;
    wait_for("tail prints events", Duration::from_secs(20), || printed(&tail, "c1").1.len() > 100, context).await;

    // The renewal is written as a kubelet without atomic swap might: the new certificate
    // first. The pair does not match: the certificate in force stays, said once.
    let (new_cert, new_key, _) = pki.ca().issue_pem(&LeafSpec::Subscriber { name: "tailer".into() }, 1).unwrap();
    let new_serial = fleetwatch_certs::inspect_pem(&new_cert, &cert).unwrap().serial.to_lowercase();
    assert_ne!(new_serial, old_serial);
    std::fs::write(&cert, &new_cert).unwrap();
    wait_for(
        "tail notices the half-written pair",
        Duration::from_secs(20),
        || tail.stderr().contains("certificate files changed but cannot be used"),
        context,
    )
    .await;
    let seen_before = printed(&tail, "c1").1.len();
    let old_sessions = connected_with(&hub.proc.stderr(), &old_serial);
    wait_for(
        "tail keeps receiving with the certificate in force",
        Duration::from_secs(20),
        || printed(&tail, "c1").1.len() > seen_before + 50,
        context,
    )
    .await;
    assert_eq!(connected_with(&hub.proc.stderr(), &new_serial), 0, "no reconnect with a broken pair: {}", context());

    // The key follows: the subscriber closes its session and comes back with the new
    // certificate, while connected (nothing cut it).
    std::fs::write(&key, &new_key).unwrap();
    let renewed_at = Instant::now();
    wait_for(
        "the hub sees the subscriber with its renewed certificate",
        Duration::from_secs(20),
        || connected_with(&hub.proc.stderr(), &new_serial) >= 1,
        context,
    )
    .await;
    let switch = renewed_at.elapsed();
    let log = tail.stderr();
    assert!(log.contains("closing the session to reconnect with the renewed certificate"), "{log}");
    assert_eq!(log.matches("certificate files changed but cannot be used").count(), 1, "one WARN per change: {log}");

    // The old certificate is revoked: the subscriber does not care, it no longer uses it.
    std::fs::write(&deny, format!("serial={}\n", old_serial.to_uppercase())).unwrap();
    wait_for(
        "the hub reloads its deny list",
        Duration::from_secs(20),
        || hub.proc.stderr().contains("reloaded the deny list entries=1"),
        context,
    )
    .await;

    // Every event the agent made reached tail, by object and by seq.
    let done = || {
        let (by_object, _) = printed(&tail, "c1");
        (0..source.objects).all(|n| {
            let last = source.final_generation(n).unwrap();
            by_object.contains_key(&(synthetic_subject(n), last))
        })
    };
    wait_for("every object reaches its final generation", Duration::from_secs(90), done, context).await;
    let (by_object, seqs) = printed(&tail, "c1");
    let acked = hub.clusters().await["clusters"][0]["ackedSeq"].as_u64().unwrap();
    // seq 1 is the agent's start marker (a resync, not an event); every other one is an event.
    let lost: Vec<u64> = (2..=acked).filter(|s| !seqs.contains(s)).collect();
    assert!(lost.is_empty(), "events stored by the hub and never printed: {lost:?}\n{}", context());
    // After the renewal the old certificate was never used again (so never refused).
    assert_eq!(connected_with(&hub.proc.stderr(), &old_serial), old_sessions, "{}", context());
    assert!(!hub.proc.stderr().contains("revoked certificate refused"), "{}", context());
    let twice = by_object.values().filter(|n| **n > 1).count();
    eprintln!("switched {switch:?} after the key was written; {twice} events printed twice (at least once)");
}

/// Renewed while the session is up but not checked (no `--tls-watch`, a long
/// `--tls-reload-interval`: as on a file system inotify does not see), then
/// the old certificate revoked: the hub closes the session, and the reconnect reads the
/// files first, so it comes back with the renewed certificate instead of being refused for
/// good with the revoked one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscriber_reconnects_with_the_certificate_on_disk_after_its_old_one_is_revoked() {
    let pki = Pki::new();
    let Renewable { hub, deny, cert, key, old_serial, files } = Renewable::start(&pki);
    let spec = "synthetic:objects=10,rate=50,total=1000";
    let source: SyntheticSource = spec.parse().unwrap();
    let _agent = agent(&pki, "c1", &hub.url(), spec, &[]);
    let mut args: Vec<String> = vec!["tail".into(), "--hub".into(), hub.url(), "--name".into(), "durable".into()];
    args.extend(["--from".into(), "earliest".into(), "--tls-reload-interval".into(), "3600".into()]);
    args.extend(["--tls-watch".into(), "false".into()]);
    args.extend(client_args(&files));
    let tail = Proc::spawn(&args, pki.path("tail.log"));
    let context = || format!("tail log:\n{}\nhub log:\n{}", tail.stderr(), hub.proc.stderr());
    wait_for("tail prints events", Duration::from_secs(20), || printed(&tail, "c1").1.len() > 50, context).await;

    let (new_cert, new_key, _) = pki.ca().issue_pem(&LeafSpec::Subscriber { name: "tailer".into() }, 1).unwrap();
    let new_serial = fleetwatch_certs::inspect_pem(&new_cert, &cert).unwrap().serial.to_lowercase();
    std::fs::write(&key, &new_key).unwrap();
    std::fs::write(&cert, &new_cert).unwrap();
    std::fs::write(&deny, format!("serial={}\n", old_serial.to_uppercase())).unwrap();
    wait_for(
        "the hub closes the revoked session",
        Duration::from_secs(20),
        || hub.proc.stderr().contains("certificate revoked"),
        context,
    )
    .await;
    wait_for(
        "the subscriber comes back with the certificate on disk",
        Duration::from_secs(20),
        || connected_with(&hub.proc.stderr(), &new_serial) >= 1,
        context,
    )
    .await;
    let done = || {
        let (by_object, _) = printed(&tail, "c1");
        (0..source.objects)
            .all(|n| by_object.contains_key(&(synthetic_subject(n), source.final_generation(n).unwrap())))
    };
    wait_for("every object reaches its final generation", Duration::from_secs(60), done, context).await;
    let (_, seqs) = printed(&tail, "c1");
    let acked = hub.clusters().await["clusters"][0]["ackedSeq"].as_u64().unwrap();
    let lost: Vec<u64> = (2..=acked).filter(|s| !seqs.contains(s)).collect();
    assert!(lost.is_empty(), "events stored by the hub and never printed: {lost:?}\n{}", context());
}
