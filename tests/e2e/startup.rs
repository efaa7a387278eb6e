//! The hub refuses at start what cannot work, with one error line each, exit code 1: its own
//! certificate outside its validity, a leaf certificate given as `--client-ca`, a
//! `--control-plane-kubeconfig` it cannot read, a port in use (unless `--bind-retry`).

use std::time::Duration;

use crate::support::*;

/// Runs `fleetwatch hub` with `args`; returns its exit code and its one `error:` line
/// (asserting there is exactly one).
fn refused(pki: &Pki, args: &[String], name: &str) -> String {
    let mut p = Proc::spawn(args, pki.path(&format!("{name}.log")));
    // Generous: a busy machine; a hub that does not refuse runs on and this fails.
    let code = p.wait_exit(Duration::from_secs(30));
    let err = p.stderr();
    assert_eq!(code, Some(1), "{name}: the hub did not stop with exit code 1; stderr:\n{err}");
    let errors: Vec<&str> = err.lines().filter(|l| l.starts_with("error:")).collect();
    assert_eq!(errors.len(), 1, "{name}: {err}");
    // Nothing else but log lines (a timestamp first): no excerpt or trace under the error.
    let is_log = |l: &str| l.split_whitespace().next().is_some_and(|t| t.parse::<jiff::Timestamp>().is_ok());
    let stray: Vec<&str> = err.lines().filter(|l| !l.starts_with("error:") && !is_log(l)).collect();
    assert!(stray.is_empty(), "{name}: lines besides the error and the log: {stray:?}\n{err}");
    errors[0].to_string()
}

/// A hub certificate signed by the test CA, valid from `not_before` to `not_after`
/// (rcgen directly: `certs issue` makes only certificates valid from now).
fn hub_cert(pki: &Pki, name: &str, not_before: (i32, u8, u8), not_after: (i32, u8, u8)) -> String {
    let ca_key = rcgen::KeyPair::from_pem(&std::fs::read_to_string(pki.path("ca.key")).unwrap()).unwrap();
    let issuer =
        rcgen::Issuer::from_ca_cert_pem(&std::fs::read_to_string(pki.path("ca.crt")).unwrap(), ca_key).unwrap();
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
    let mut params = rcgen::CertificateParams::new(vec!["localhost".to_string()]).unwrap();
    params.subject_alt_names.push(rcgen::SanType::URI("spiffe://test.local/hub".try_into().unwrap()));
    params.subject_alt_names.push(rcgen::SanType::IpAddress("127.0.0.1".parse().unwrap()));
    params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
    params.not_before = rcgen::date_time_ymd(not_before.0, not_before.1, not_before.2);
    params.not_after = rcgen::date_time_ymd(not_after.0, not_after.1, not_after.2);
    let cert = params.signed_by(&key, &issuer).unwrap();
    let (c, k) = (pki.path(&format!("{name}.crt")), pki.path(&format!("{name}.key")));
    std::fs::write(&c, cert.pem()).unwrap();
    std::fs::write(&k, key.serialize_pem()).unwrap();
    c.display().to_string()
}

/// `hub_args` with `--cert`/`--key` replaced by `<name>.crt`/`<name>.key`.
fn with_cert(pki: &Pki, name: &str) -> Vec<String> {
    let mut args = hub_args(pki, free_port(), free_port());
    let at = args.iter().position(|a| a == "--cert").unwrap();
    args[at + 1] = pki.path(&format!("{name}.crt")).display().to_string();
    let at = args.iter().position(|a| a == "--key").unwrap();
    args[at + 1] = pki.path(&format!("{name}.key")).display().to_string();
    args
}

#[test]
fn a_hub_certificate_outside_its_validity_is_refused() {
    let pki = Pki::new();
    let expired = hub_cert(&pki, "expired", (2020, 1, 1), (2021, 1, 1));
    let line = refused(&pki, &with_cert(&pki, "expired"), "expired");
    assert!(line.contains(&format!("hub certificate {expired} expired at ")), "{line}");

    let early = hub_cert(&pki, "early", (2090, 1, 1), (2091, 1, 1));
    let line = refused(&pki, &with_cert(&pki, "early"), "early");
    assert!(line.contains(&format!("hub certificate {early} is not valid before ")), "{line}");
}

#[test]
fn a_leaf_certificate_as_client_ca_is_refused() {
    let pki = Pki::new();
    // The agent's certificate given where the CA that issued it belongs.
    let leaf = pki.agent("rt-1").cert.display().to_string();
    let mut args = hub_args(&pki, free_port(), free_port());
    let at = args.iter().position(|a| a == "--client-ca").unwrap();
    args[at + 1] = leaf.clone();
    let line = refused(&pki, &args, "leaf-ca");
    assert!(line.contains(&format!("--client-ca {leaf}: certificate ")), "{line}");
    assert!(line.contains("is not a CA certificate"), "{line}");
}

#[test]
fn an_unreadable_control_plane_kubeconfig_is_refused() {
    let pki = Pki::new();
    for (name, contents) in [("missing", None), ("garbage", Some("this: [is not a kubeconfig"))] {
        let path = pki.path(&format!("{name}.kubeconfig"));
        if let Some(c) = contents {
            std::fs::write(&path, c).unwrap();
        }
        let mut args = hub_args(&pki, free_port(), free_port());
        args.extend(["--control-plane-kubeconfig".into(), path.display().to_string()]);
        let line = refused(&pki, &args, name);
        assert!(line.contains(&format!("--control-plane-kubeconfig {}", path.display())), "{line}");
    }
}

#[test]
fn a_port_in_use_is_refused_at_once_unless_bind_retry_is_given() {
    let pki = Pki::new();
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let line = refused(&pki, &hub_args(&pki, port, free_port()), "busy");
    assert!(line.contains(&format!("cannot listen on 127.0.0.1:{port}")) && line.contains("--bind-retry"), "{line}");
    // Without the flag nothing waits: no retry was announced.
    let log = std::fs::read_to_string(pki.path("busy.log")).unwrap();
    assert!(!log.contains("retrying"), "{log}");

    // With --bind-retry the hub waits for the address and starts once it is free.
    let mut args = hub_args(&pki, port, free_port());
    args.extend(["--bind-retry".into(), "120".into()]);
    let hub = Proc::spawn(&args, pki.path("retry.log"));
    eventually("the hub to announce its bind retry")
        .until_blocking(|| hub.stderr(), |log| log.contains("retrying for up to 120s"));
    drop(taken);
    hub.wait_stdout(&format!("hub listening wss=wss://127.0.0.1:{port}"), Duration::from_secs(60));
}

/// A hub rolled back onto a data directory a newer release wrote refuses to start, in one
/// line naming both formats, and changes nothing (it does not take the newer format for
/// damage and cut it).
#[test]
fn a_data_directory_of_a_newer_format_is_refused_untouched() {
    let pki = Pki::new();
    let data = tempfile::tempdir().unwrap();
    {
        let hub = HubProc::start(&pki, free_port(), Some(data.path()), &[]);
        drop(hub);
    }
    std::fs::write(data.path().join("format"), "fleetwatch-bus 3\n").unwrap();
    let listing = |dir: &std::path::Path| {
        let mut names: Vec<String> =
            std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().to_string()).collect();
        names.sort();
        names
    };
    let before = listing(data.path());
    let mut args = hub_args(&pki, free_port(), free_port());
    args.extend(["--data-dir".into(), data.path().display().to_string()]);
    let line = refused(&pki, &args, "newer-format");
    assert!(line.contains("\"fleetwatch-bus 3\", newer than this hub's fleetwatch-bus 2"), "{line}");
    assert!(line.contains("nothing was changed"), "{line}");
    assert_eq!(listing(data.path()), before);
    assert_eq!(std::fs::read_to_string(data.path().join("format")).unwrap(), "fleetwatch-bus 3\n");
}
