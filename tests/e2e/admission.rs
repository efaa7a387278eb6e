//! Admission and revocation against a hub process over real mTLS: handshake budgets apart
//! from the session budget, a deny list that fails closed, sessions ended by certificate
//! expiry and CA removal, strict identities, and errors that say what to fix.

use std::sync::Arc;
use std::time::Duration;

use fleetwatch_certs::{LeafSpec, TlsFiles};
use fleetwatch_client::transport::{ClientWs, connect};
use fleetwatch_protocol::codec::{Limits, decode_hub_to_agent};
use fleetwatch_protocol::message::{ErrorCode, HubToAgent};
use futures_util::{SinkExt, StreamExt};
use tokio_tungstenite::tungstenite::Message;

use crate::support::*;

async fn raw(files: &TlsFiles, port: u16) -> Result<ClientWs, String> {
    let tls = Arc::new(fleetwatch_certs::client_config(files).map_err(|e| e.to_string())?);
    let url = format!("wss://127.0.0.1:{port}").parse().unwrap();
    connect(&url, tls, &Limits::default(), Duration::from_secs(10)).await.map_err(|e| e.to_string())
}

fn hello(cluster: &str) -> String {
    format!(r#"{{"type":"hello","protocol":1,"agentVersion":"t","cluster":"{cluster}","epoch":7,"last_acked_seq":0}}"#)
}

/// What the hub said next: a decoded error frame, a welcome, or the end.
#[derive(Debug)]
enum Said {
    Welcome,
    Error(ErrorCode, String),
    Other(#[allow(dead_code)] String),
    Gone(String),
}

async fn said(ws: &mut ClientWs, within: Duration) -> Said {
    loop {
        match tokio::time::timeout(within, ws.next()).await {
            Err(_) => return Said::Gone("timeout".into()),
            Ok(Some(Ok(Message::Text(t)))) => {
                return match decode_hub_to_agent(t.as_bytes(), &Limits::default()) {
                    Ok(HubToAgent::Welcome(_)) => Said::Welcome,
                    Ok(HubToAgent::Error(e)) => Said::Error(e.code, e.message),
                    _ => Said::Other(t.to_string()),
                };
            }
            Ok(Some(Ok(Message::Close(f)))) => return Said::Gone(f.map(|f| f.reason.to_string()).unwrap_or_default()),
            Ok(Some(Ok(_))) => continue,
            Ok(Some(Err(e))) => return Said::Gone(e.to_string()),
            Ok(None) => return Said::Gone("eof".into()),
        }
    }
}

/// Connects and says hello; what the hub answered.
async fn try_session(files: &TlsFiles, port: u16, cluster: &str) -> (Option<ClientWs>, Said) {
    match raw(files, port).await {
        Err(e) => (None, Said::Gone(e)),
        Ok(mut ws) => {
            let _ = ws.send(Message::text(hello(cluster))).await;
            let s = said(&mut ws, Duration::from_secs(10)).await;
            (Some(ws), s)
        }
    }
}

fn metrics(hub: &HubProc) -> String {
    futures_block(http_get(hub.admin_port, "/metrics"))
}

fn futures_block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

/// A leaf signed by the PKI's CA with any URI SANs and usages (what `certs issue` never makes).
fn odd_leaf(pki: &Pki, name: &str, uris: &[&str], eku: Vec<rcgen::ExtendedKeyUsagePurpose>) -> TlsFiles {
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.path("ca.key")).unwrap()).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.path("ca.crt")).unwrap(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    params.subject_alt_names = uris.iter().map(|u| rcgen::SanType::URI((*u).try_into().unwrap())).collect();
    params.extended_key_usages = eku;
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k) = (pki.path(&format!("{name}.crt")), pki.path(&format!("{name}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    TlsFiles { cert: c, key: k, ca: vec![pki.path("ca.crt")] }
}

/// Idle TCP sockets (unauthenticated) neither take the places of sessions nor lock out
/// other addresses, and their refusals are summarised, not logged one by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_sockets_do_not_keep_agents_out() {
    let pki = Pki::new();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--max-connections", "20", "--max-handshakes-per-ip", "50", "--handshake-timeout", "60"],
    );
    // 200 idle sockets from one address (127.0.0.2; the agents come from 127.0.0.1).
    let mut idle = Vec::new();
    for _ in 0..200 {
        let sock = tokio::net::TcpSocket::new_v4().unwrap();
        sock.bind("127.0.0.2:0".parse().unwrap()).unwrap();
        idle.push(sock.connect(format!("127.0.0.1:{}", hub.port).parse().unwrap()).await.unwrap());
    }
    let refused = holds_within(Duration::from_secs(20), || {
        metrics(&hub).contains(r#"fleetwatch_hub_rejected_total{reason="max-handshakes-per-ip"} 150"#)
    })
    .await;
    assert!(refused, "{}", metrics(&hub));

    // Real agents get all 20 session places while the idle sockets are held.
    let mut sessions = Vec::new();
    for i in 0..20 {
        let cluster = format!("c{i}");
        let (ws, s) = try_session(&pki.agent(&cluster), hub.port, &cluster).await;
        assert!(matches!(s, Said::Welcome), "agent {i}: {s:?}\n{}", hub.proc.stderr());
        sessions.push(ws);
    }
    // The 21st is told why, and which flag sets the limit.
    let (_, s) = try_session(&pki.agent("c21"), hub.port, "c21").await;
    match s {
        Said::Error(ErrorCode::LimitExceeded, m) => assert!(m.contains("--max-connections"), "{m}"),
        other => panic!("expected a max-connections refusal, got {other:?}"),
    }
    // Summary lines for the refusals (one per interval; the burst may straddle two), not
    // one line each.
    let per_ip_refusals = |log: &str| -> (u64, usize) {
        let lines: Vec<&str> = log.lines().filter(|l| l.contains("refused") && l.contains("in the last")).collect();
        let counted = lines
            .iter()
            .filter_map(|l| l.split("max-handshakes-per-ip=").nth(1))
            .filter_map(|rest| rest.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok())
            .sum();
        (counted, lines.len())
    };
    let summarised = holds_within(Duration::from_secs(40), || per_ip_refusals(&hub.proc.stderr()).0 == 150).await;
    let log = hub.proc.stderr();
    assert!(summarised, "no summary of the 150 refusals:\n{log}");
    assert!(per_ip_refusals(&log).1 <= 3, "{log}");
    assert!(log.lines().filter(|l| l.contains("127.0.0.2")).count() <= 10, "per-refusal lines:\n{log}");
    drop(idle);
}

/// A connection whose client gave up while it waited in the listen backlog (it sent its
/// first bytes, then closed) is dropped before the TLS work, and counted as `abandoned`.
/// And with the budget used up and no one waiting, the connection accepted last is not
/// closed as idle before its ClientHello is seen (half the runs failed that way before).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_its_client_gave_up_on_gets_no_handshake() {
    use tokio::io::AsyncWriteExt;
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--max-handshakes", "1", "--handshake-timeout", "60"]);
    let addr = format!("127.0.0.1:{}", hub.port);
    // The one handshake place, held by a client through TLS that never asks for the
    // WebSocket: its TLS handshake completing shows the hub took it.
    let tls = Arc::new(fleetwatch_certs::client_config(&pki.agent("holder")).unwrap());
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let holder = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .unwrap_or_else(|e| panic!("the holder's handshake: {e}\n{}", hub.proc.stderr()));
    // The one that gives up: its ClientHello's first bytes, then its side closed, all while
    // it waits in the backlog.
    let mut quitter = tokio::net::TcpStream::connect(&addr).await.unwrap();
    quitter.write_all(&[0x16, 0x03, 0x01, 0x00, 0x05, 1, 2, 3, 4, 5]).await.unwrap();
    quitter.shutdown().await.unwrap();
    // Its close must have reached the hub before the place frees (on loopback two
    // connections' packets need not arrive in the order sent): the hub's kernel has
    // acknowledged the FIN once the quitter's side is in FIN_WAIT2.
    eventually("the hub's kernel acknowledged the quitter's close")
        .until(async || tcp_state(&quitter), |s| *s == Some(TCP_FIN_WAIT2))
        .await;
    drop(holder);
    eventually("the given-up connection counted as abandoned")
        .context(|| hub.proc.stderr())
        .until(
            async || metrics(&hub),
            |m| m.contains(r#"fleetwatch_hub_handshake_failures_total{reason="abandoned"} 1"#),
        )
        .await;
    let m = metrics(&hub);
    assert!(
        m.contains(r#"fleetwatch_hub_handshake_failures_total{reason="tls-handshake"} 0"#),
        "no TLS work for it: {m}"
    );
    // And a real agent still gets in.
    let (_ws, s) = try_session(&pki.agent("c1"), hub.port, "c1").await;
    assert!(matches!(s, Said::Welcome), "{s:?}");
}

/// Linux's `TCP_FIN_WAIT2` (include/net/tcp_states.h): our FIN sent and acknowledged.
const TCP_FIN_WAIT2: u8 = 5;

/// The TCP state of a socket (`TCP_ESTABLISHED`, `TCP_FIN_WAIT2`, ...), from `TCP_INFO`.
fn tcp_state(s: &tokio::net::TcpStream) -> Option<u8> {
    use std::os::fd::AsRawFd;
    // SAFETY: `tcp_info` is plain data; the kernel fills at most `len` bytes of it.
    let mut info: libc::tcp_info = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::tcp_info>() as libc::socklen_t;
    // SAFETY: the fd is open for the borrow's life and `info` is `len` bytes long.
    let rc = unsafe {
        libc::getsockopt(
            s.as_raw_fd(),
            libc::IPPROTO_TCP,
            libc::TCP_INFO,
            (&mut info as *mut libc::tcp_info).cast(),
            &mut len,
        )
    };
    (rc == 0).then_some(info.tcpi_state)
}

/// A deny list that disappears or becomes unreadable keeps the last good list in force.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deny_list_fails_closed() {
    let pki = Pki::new();
    let deny = pki.path("deny-list");
    // Missing at start: the hub refuses to start, naming the file.
    let mut args = hub_args(&pki, free_port(), free_port());
    args.extend(["--deny-list".into(), deny.display().to_string()]);
    let mut p = Proc::spawn(&args, pki.path("hub-missing-deny.log"));
    assert_eq!(p.wait_exit(Duration::from_secs(20)), Some(1), "{}", p.stderr());
    assert!(p.stderr().contains(&format!("deny list {}", deny.display())), "{}", p.stderr());

    let agent = pki.agent("bad");
    let serial = fleetwatch_certs::inspect_file(&agent.cert).unwrap().serial;
    std::fs::write(&deny, format!("{serial}\n")).unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--deny-list", deny.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let refused = |s: &Said| matches!(s, Said::Error(ErrorCode::Forbidden, m) if m.contains("revoked"));
    let (_, s) = try_session(&agent, hub.port, "bad").await;
    assert!(refused(&s), "{s:?}");

    // Deleted: still refused; one ERROR line, a metric, and /readyz says so.
    std::fs::remove_file(&deny).unwrap();
    let stale =
        holds_within(Duration::from_secs(10), || metrics(&hub).contains("\nfleetwatch_hub_deny_list_stale 1\n")).await;
    assert!(stale, "{}", metrics(&hub));
    let (_, s) = try_session(&agent, hub.port, "bad").await;
    assert!(refused(&s), "un-revoked when the deny list disappeared: {s:?}");
    let ready = http_get(hub.admin_port, "/readyz").await;
    assert!(ready.contains("deny-list: stale"), "{ready}\n{}\n{}", hub.proc.stderr(), metrics(&hub));
    let errors = || hub.proc.stderr().lines().filter(|l| l.contains("ERROR") && l.contains("deny list")).count();

    // Replaced by a directory: the same. (Behind a symlink, swapped atomically as a kubelet
    // swaps a mounted ConfigMap, so the hub never sees a moment without a file between
    // this step and the next — that would be a third change, reported a third time.)
    let dir = deny.with_extension("dir");
    std::fs::create_dir(&dir).unwrap();
    let swap_in = |target: &std::path::Path| {
        let link = deny.with_extension("link");
        std::os::unix::fs::symlink(target, &link).unwrap();
        std::fs::rename(&link, &deny).unwrap();
    };
    swap_in(&dir);
    let again =
        holds_within(Duration::from_secs(10), || metrics(&hub).contains("fleetwatch_hub_deny_list_errors_total 2"))
            .await;
    assert!(again, "{}", metrics(&hub));
    let (_, s) = try_session(&agent, hub.port, "bad").await;
    assert!(refused(&s), "un-revoked when the deny list became a directory: {s:?}");

    // A readable list again is taken as it is: the agent is no longer denied.
    let nobody = deny.with_extension("new");
    std::fs::write(&nobody, "# nobody\n").unwrap();
    swap_in(&nobody);
    let fresh =
        holds_within(Duration::from_secs(10), || metrics(&hub).contains("\nfleetwatch_hub_deny_list_stale 0\n")).await;
    assert!(fresh, "{}", metrics(&hub));
    let (_, s) = try_session(&agent, hub.port, "bad").await;
    assert!(matches!(s, Said::Welcome), "{s:?}");
    let ready = http_get(hub.admin_port, "/readyz").await;
    assert!(ready.starts_with("ready: ") && ready.contains("deny-list ok"), "{ready}");
    // Reported once per change (two changes), not at every reload tick in between.
    assert_eq!(errors(), 2, "{}", hub.proc.stderr());
    assert!(metrics(&hub).contains("fleetwatch_hub_deny_list_errors_total 2"), "{}", metrics(&hub));
}

/// A live session ends when its certificate expires, with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_its_certificate_expires() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &["--tls-reload-interval", "0.2"]);
    let (cert, key, _) =
        pki.ca().issue_pem_for(&LeafSpec::Agent { cluster: "brief".into() }, Duration::from_secs(8)).unwrap();
    let expires = fleetwatch_certs::inspect_pem(&cert, std::path::Path::new("brief")).unwrap().not_after;
    let files = TlsFiles { cert: pki.path("brief.crt"), key: pki.path("brief.key"), ca: vec![pki.path("ca.crt")] };
    std::fs::write(&files.cert, cert).unwrap();
    std::fs::write(&files.key, key).unwrap();
    let (ws, s) = try_session(&files, hub.port, "brief").await;
    assert!(matches!(s, Said::Welcome), "{s:?}");
    let mut ws = ws.unwrap();
    match said(&mut ws, Duration::from_secs(60)).await {
        Said::Error(ErrorCode::Forbidden, m) => assert_eq!(m, format!("certificate expired at {expires}")),
        other => panic!("expected the session to end at expiry: {other:?}\n{}", hub.proc.stderr()),
    }
    assert!(metrics(&hub).contains(r#"fleetwatch_hub_sessions_ended_total{reason="expired"} 1"#));
}

/// A live session ends when its CA leaves the trusted bundles (CA rotation finished).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_ends_when_its_ca_leaves_the_bundle() {
    let pki = Pki::new();
    let old = Pki::new(); // the CA being rotated out
    let bundle = pki.path("old-bundle.crt");
    std::fs::copy(old.path("ca.crt"), &bundle).unwrap();
    let hub = HubProc::start(
        &pki,
        free_port(),
        None,
        &["--client-ca", bundle.to_str().unwrap(), "--tls-reload-interval", "0.2"],
    );
    let mut rotated = old.agent("old");
    rotated.ca = vec![pki.path("ca.crt")];
    let (ws, s) = try_session(&rotated, hub.port, "old").await;
    assert!(matches!(s, Said::Welcome), "{s:?}");
    let mut ws = ws.unwrap();
    // A session of the current CA stays.
    let (current, s) = try_session(&pki.agent("new"), hub.port, "new").await;
    assert!(matches!(s, Said::Welcome), "{s:?}");
    // The rotation ends: the bundle file now holds only the current CA.
    std::fs::copy(pki.path("ca.crt"), &bundle).unwrap();
    match said(&mut ws, Duration::from_secs(30)).await {
        Said::Error(ErrorCode::Forbidden, m) => assert_eq!(m, "its CA is no longer trusted"),
        other => panic!("expected the session to end: {other:?}\n{}", hub.proc.stderr()),
    }
    let mut current = current.unwrap();
    current.send(Message::Ping(Default::default())).await.unwrap();
    assert!(matches!(said(&mut current, Duration::from_secs(1)).await, Said::Gone(t) if t == "timeout"));
    let v = hub.clusters().await;
    let connected =
        |c: &str| v["clusters"].as_array().unwrap().iter().any(|x| x["cluster"] == c && x["connected"] == true);
    assert!(connected("new") && !connected("old"), "{v}");
}

/// Exactly one URI SAN: a SPIFFE id next to an https URI is refused with a clear reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_with_two_uri_sans_is_refused() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let files = odd_leaf(
        &pki,
        "two-uris",
        &["spiffe://test.local/cluster/two", "https://example.org/two"],
        vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth],
    );
    let (_, s) = try_session(&files, hub.port, "two").await;
    match s {
        Said::Error(ErrorCode::Forbidden, m) => {
            assert!(m.contains("2 URI SANs") && m.contains("exactly one, a SPIFFE id"), "{m}")
        }
        other => panic!("expected a refusal: {other:?}"),
    }
    // Without the clientAuth usage: `client_config` refuses to present it; presented
    // anyway, the hub refuses it in the TLS handshake and says why.
    let no_eku = odd_leaf(&pki, "no-eku", &["spiffe://test.local/cluster/no-eku"], vec![]);
    let err = fleetwatch_certs::client_config(&no_eku).expect_err("refused locally").to_string();
    assert!(err.contains("needs clientAuth"), "{err}");
    use rustls_pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    roots.add(rustls_pki_types::CertificateDer::from_pem_file(pki.path("ca.crt")).unwrap()).unwrap();
    let chain = vec![rustls_pki_types::CertificateDer::from_pem_file(&no_eku.cert).unwrap()];
    let key = rustls_pki_types::PrivateKeyDer::from_pem_file(&no_eku.key).unwrap();
    let tls = rustls::ClientConfig::builder().with_root_certificates(roots).with_client_auth_cert(chain, key).unwrap();
    let url = format!("wss://127.0.0.1:{}", hub.port).parse().unwrap();
    let err = match connect(&url, Arc::new(tls), &Limits::default(), Duration::from_secs(10)).await {
        Err(e) => e.to_string(),
        Ok(mut ws) => {
            let _ = ws.send(Message::text(hello("no-eku"))).await;
            format!("{:?}", said(&mut ws, Duration::from_secs(10)).await)
        }
    };
    assert!(err.contains("clientAuth"), "{err}");
    let logged = holds_within(Duration::from_secs(10), || {
        hub.proc.stderr().contains("client certificate lacks the clientAuth extended key usage")
    })
    .await;
    assert!(logged, "{}", hub.proc.stderr());
}

/// TLS failures say what to fix, on the agent's stderr and in the hub's log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_failures_say_what_to_fix() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let run_agent = |files: &TlsFiles, ca: &std::path::Path, name: &str| {
        let args: Vec<String> = vec![
            "agent".into(),
            "--hub".into(),
            hub.url(),
            "--cert".into(),
            files.cert.display().to_string(),
            "--key".into(),
            files.key.display().to_string(),
            "--ca".into(),
            ca.display().to_string(),
            "--source".into(),
            "synthetic:objects=1,rate=1".into(),
        ];
        let mut p = Proc::spawn(&args, pki.path(&format!("{name}.log")));
        assert_eq!(p.wait_exit(Duration::from_secs(30)), Some(1), "{}", p.stderr());
        p.stderr()
    };
    // A client certificate from a CA the hub does not trust.
    let other = Pki::new();
    let stderr = run_agent(&other.agent("foreign"), &pki.path("ca.crt"), "foreign");
    assert!(
        stderr
            .contains("the hub does not trust this client certificate: is it signed by a CA in the hub's --client-ca?"),
        "{stderr}"
    );
    let warned = holds_within(Duration::from_secs(10), || {
        hub.proc
            .stderr()
            .lines()
            .any(|l| l.contains("WARN") && l.contains("127.0.0.1:") && l.contains("not signed by a CA in --client-ca"))
    })
    .await;
    assert!(warned, "{}", hub.proc.stderr());
    // A hub certificate the client's --ca did not sign.
    let stderr = run_agent(&pki.agent("lost"), &other.path("ca.crt"), "wrong-ca");
    assert!(stderr.contains("the hub's certificate is not signed by a CA in --ca"), "{stderr}");
    assert_eq!(stderr.trim().lines().filter(|l| l.contains("error:")).count(), 1, "{stderr}");
}

/// A start-up failure prints its cause once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_port_is_reported_once() {
    let pki = Pki::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let mut p = Proc::spawn(&hub_args(&pki, port, free_port()), pki.path("busy.log"));
    assert_eq!(p.wait_exit(Duration::from_secs(20)), Some(1), "{}", p.stderr());
    let err = p.stderr();
    let line = err.lines().find(|l| l.starts_with("error:")).unwrap_or_else(|| panic!("{err}"));
    assert!(line.contains(&format!("cannot listen on 127.0.0.1:{port}")), "{line}");
    assert_eq!(line.matches("in use").count(), 1, "{line}");
}

/// `/readyz` names what is not ready: the control-plane watch until it has synced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_waits_for_the_control_plane_watch() {
    let pki = Pki::new();
    let (_cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let hub = HubProc::start(&pki, free_port(), None, &["--control-plane-kubeconfig", cp_kc.to_str().unwrap()]);
    // No WatchConfig CRD yet: the watch cannot list, so the hub is not ready.
    let ready = http_get(hub.admin_port, "/readyz").await;
    assert!(ready.starts_with("not ready: ") && ready.contains("control-plane: "), "{ready}");
    // ... and names the kubeconfig it reads the control plane with (issue 27), and why it
    // has not synced: the watch's last error (the API server has no such resource yet).
    let why = format!("(kubeconfig {}): ", cp_kc.display());
    let synced_why = holds_within(Duration::from_secs(30), || {
        let r = futures_block(http_get(hub.admin_port, "/readyz"));
        r.contains(&why) && r.contains("404")
    })
    .await;
    assert!(synced_why, "{}", http_get(hub.admin_port, "/readyz").await);
    let crd = std::fs::read_to_string(
        std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../deploy/crds/watchconfigs.operator.fleetwatch.dev.yaml"),
    )
    .unwrap();
    kubectl(&cp_kc, &["apply", "-f", "-"], Some(&crd));
    let synced = holds_within(Duration::from_secs(60), || {
        futures_block(http_get(hub.admin_port, "/readyz")).starts_with("ready: ")
    })
    .await;
    assert!(synced, "{}\n{}", http_get(hub.admin_port, "/readyz").await, hub.proc.stderr());
}
