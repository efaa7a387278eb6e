//! The command line as a user meets it: certificates, help, and one-line errors.

use std::process::Command;

use crate::support::*;

fn run(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into(),
        String::from_utf8_lossy(&out.stderr).into(),
    )
}

#[test]
fn certs_commands_write_and_inspect_identities() {
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path().to_str().unwrap();
    let (code, out, err) = run(&["certs", "init", "--dir", d, "--trust-domain", "example.org"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("spiffe://example.org"), "{out}");
    assert_eq!(run(&["certs", "issue", "hub", "--dir", d, "--dns", "hub.example.org", "--ip", "127.0.0.1"]).0, 0);
    assert_eq!(run(&["certs", "issue", "agent", "--dir", d, "--cluster", "eu-1", "--days", "7"]).0, 0);
    assert_eq!(run(&["certs", "issue", "subscriber", "--dir", d, "--name", "lifecycle"]).0, 0);
    for f in [
        "hub.crt",
        "hub.key",
        "agent-eu-1.crt",
        "agent-eu-1.key",
        "subscriber-lifecycle.crt",
        "subscriber-lifecycle.key",
    ] {
        assert!(dir.path().join(f).exists(), "{f} missing");
    }
    let (code, out, _) = run(&["certs", "inspect", &format!("{d}/agent-eu-1.crt")]);
    assert_eq!(code, 0);
    assert!(out.contains("identity:   spiffe://example.org/cluster/eu-1"), "{out}");
    assert!(out.contains("serial:"), "{out}");
    let not_after = out.lines().find(|l| l.starts_with("not after:")).unwrap();
    let ts: jiff::Timestamp = not_after.trim_start_matches("not after:").trim().parse().unwrap();
    let days = (ts.as_second() - jiff::Timestamp::now().as_second()) / 86_400;
    assert!((6..=7).contains(&days), "{not_after}");
    let (_, out, _) = run(&["certs", "inspect", &format!("{d}/hub.crt")]);
    assert!(
        out.contains("spiffe://example.org/hub") && out.contains("hub.example.org") && out.contains("127.0.0.1"),
        "{out}"
    );

    // Short-lived and already expired certificates, for tests of expiry; inspect marks them.
    assert_eq!(run(&["certs", "issue", "agent", "--dir", d, "--cluster", "soon", "--not-after", "10m"]).0, 0);
    let (_, out, _) = run(&["certs", "inspect", &format!("{d}/agent-soon.crt")]);
    let not_after: jiff::Timestamp = out
        .lines()
        .find(|l| l.starts_with("not after:"))
        .unwrap()
        .trim_start_matches("not after:")
        .trim()
        .parse()
        .unwrap();
    let left = not_after.as_second() - jiff::Timestamp::now().as_second();
    assert!((300..=600).contains(&left), "{out}");
    assert!(out.contains("validity:   valid, "), "{out}");
    let (code, out, err) =
        run(&["certs", "issue", "agent", "--dir", d, "--cluster", "old", "--not-after", "2020-01-01T00:00:00Z"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("expired at 2020-01-01T00:00:00Z"), "{out}");
    let (code, out, _) = run(&["certs", "inspect", &format!("{d}/agent-old.crt")]);
    assert_eq!(code, 0);
    assert!(out.contains("not after:  2020-01-01T00:00:00Z") && out.contains("validity:   EXPIRED "), "{out}");
    let (code, _, err) = run(&["certs", "issue", "agent", "--dir", d, "--cluster", "x", "--not-after", "soon"]);
    assert_ne!(code, 0);
    assert!(err.contains("--not-after") && err.contains("RFC 3339"), "{err}");

    // Refusals are one line and name the cause.
    let (code, _, err) = run(&["certs", "init", "--dir", d]);
    assert_ne!(code, 0);
    assert!(err.contains("already holds a CA"), "{err}");
    let (code, _, err) = run(&["certs", "issue", "agent", "--dir", d, "--cluster", "no/slash"]);
    assert_ne!(code, 0);
    assert!(err.contains("invalid name"), "{err}");
    let (code, _, err) = run(&["certs", "issue", "agent", "--dir", "/nonexistent", "--cluster", "x"]);
    assert_ne!(code, 0);
    assert!(err.contains("/nonexistent/ca.crt"), "{err}");
}

#[test]
fn every_subcommand_explains_itself() {
    for args in [
        vec!["--help"],
        vec!["certs", "--help"],
        vec!["certs", "issue", "agent", "--help"],
        vec!["hub", "--help"],
        vec!["agent", "--help"],
        vec!["tail", "--help"],
        vec!["bench", "hub", "--help"],
        vec!["version", "--help"],
    ] {
        let (code, out, _) = run(&args);
        assert_eq!(code, 0, "{args:?}");
        assert!(out.contains("Usage:"), "{args:?}: {out}");
    }
    let (_, out, _) = run(&["hub", "--help"]);
    assert!(out.contains("--data-dir") && out.contains("--client-ca"), "{out}");
    let (_, out, _) = run(&["agent", "--help"]);
    assert!(out.contains("--version-retry") && out.contains("[default: 300]"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_gives_a_one_line_error() {
    let pki = Pki::new();
    let sub = pki.subscriber("s");
    let (cert, key, ca) =
        (sub.cert.display().to_string(), sub.key.display().to_string(), pki.path("ca.crt").display().to_string());
    let dead = format!("wss://127.0.0.1:{}", free_port());

    let error_line = |err: &str| -> String {
        let lines: Vec<_> = err.lines().filter(|l| l.starts_with("error")).collect();
        assert_eq!(lines.len(), 1, "{err}");
        lines[0].to_string()
    };
    // Unreachable hub.
    let (code, _, err) = run(&["tail", "--hub", &dead, "--cert", &cert, "--key", &key, "--ca", &ca]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("cannot reach hub"), "{err}");
    // Unreadable certificate.
    let (code, _, err) = run(&["tail", "--hub", &dead, "--cert", "/nope.crt", "--key", &key, "--ca", &ca]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("/nope.crt"), "{err}");
    // Certificate and key that do not belong together.
    let other = pki.subscriber("t");
    let (code, _, err) =
        run(&["tail", "--hub", &dead, "--cert", &cert, "--key", other.key.to_str().unwrap(), "--ca", &ca]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("do not match"), "{err}");
    // Bad hub address and bad source.
    let (code, _, err) = run(&["tail", "--hub", "http://x", "--cert", &cert, "--key", &key, "--ca", &ca]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("wss://"), "{err}");
    let a = pki.agent("x");
    let (code, _, err) = run(&[
        "agent",
        "--hub",
        &dead,
        "--cert",
        a.cert.to_str().unwrap(),
        "--key",
        a.key.to_str().unwrap(),
        "--ca",
        &ca,
        "--source",
        "synthetic:objects=0,rate=1",
    ]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("objects must be at least 1"), "{err}");
    // A subscriber certificate is not an agent certificate.
    let (code, _, err) = run(&[
        "agent",
        "--hub",
        &dead,
        "--cert",
        &cert,
        "--key",
        &key,
        "--ca",
        &ca,
        "--source",
        "synthetic:objects=1,rate=1",
    ]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("not an agent certificate"), "{err}");
    // Unknown flag (clap's own message, non-zero exit).
    let (code, _, err) = run(&["hub", "--bogus"]);
    assert_eq!(code, 2);
    assert!(err.contains("--bogus"), "{err}");
    // A hub whose key does not match its certificate.
    let (code, _, err) = run(&[
        "hub",
        "--listen",
        "127.0.0.1:0",
        "--cert",
        pki.path("hub.crt").to_str().unwrap(),
        "--key",
        &key,
        "--client-ca",
        &ca,
    ]);
    assert_ne!(code, 0);
    assert!(error_line(&err).contains("do not match"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quickstart_tail_prints_events_and_resumes_a_durable_subscription() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let _a = agent(&pki, "eu-1", &hub.url(), "synthetic:objects=3,rate=100,total=30", &[]);
    let _b = agent(&pki, "us-1", &hub.url(), "synthetic:objects=3,rate=100,total=30", &[]);
    let sub = pki.subscriber("ops");
    let tail = |extra: &[&str]| {
        let mut args = vec!["tail".to_string(), "--hub".into(), hub.url()];
        args.extend(client_args(&sub));
        args.extend(extra.iter().map(|s| s.to_string()));
        Command::new(BIN).args(&args).output().unwrap()
    };
    // Wait until the hub has stored all of eu-1's events: a resync marker (seq 1) and 30 events.
    eventually("eu-1 to have stored its 30 events")
        .until(
            async || hub.clusters().await,
            |clusters| {
                let acked = clusters["clusters"]
                    .as_array()
                    .and_then(|cs| cs.iter().find(|c| c["cluster"] == "eu-1"))
                    .and_then(|c| c["ackedSeq"].as_u64())
                    .unwrap_or(0);
                acked >= 31
            },
        )
        .await;
    let first = tail(&["--name", "n1", "--from", "earliest", "--cluster", "eu-1", "--count", "10"]);
    assert!(first.status.success(), "{}", String::from_utf8_lossy(&first.stderr));
    let lines: Vec<serde_json::Value> =
        String::from_utf8_lossy(&first.stdout).lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let events: Vec<_> = lines.iter().filter(|l| l["type"] == "dev.fleetwatch.object.applied").collect();
    assert_eq!(events.len(), 10);
    for e in &events {
        assert_eq!(e["cluster"], "eu-1");
        assert_eq!(e["source"], "/clusters/eu-1");
        assert!(e["subject"].as_str().unwrap().starts_with("synthetic.fleetwatch.dev/v1/Object/default/obj-"));
        assert!(e["seq"].as_u64().unwrap() >= 2 && e["id"].as_str().unwrap().starts_with("eu-1/"));
    }
    // The second run resumes after what the first printed.
    let second = tail(&["--name", "n1", "--from", "earliest", "--cluster", "eu-1", "--count", "5"]);
    let seqs = |out: &std::process::Output| -> Vec<u64> {
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok()?["seq"].as_u64())
            .collect()
    };
    let (s1, s2) = (seqs(&first), seqs(&second));
    assert_eq!(s2.len(), 5);
    assert_eq!(s2[0], s1.last().unwrap() + 1, "first {s1:?} second {s2:?}");
}

/// `tail --cluster X` for a cluster the hub never saw says so once and keeps waiting.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tail_of_an_unknown_cluster_says_so_once_and_waits() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), None, &[]);
    let mut args: Vec<String> = vec!["tail".into(), "--hub".into(), hub.url(), "--cluster".into(), "nosuch".into()];
    args.extend(client_args(&pki.subscriber("ops")));
    let mut tail = Proc::spawn(&args, pki.path("tail.log"));
    assert!(
        holds_within(std::time::Duration::from_secs(30), || tail.stderr().contains("never seen")).await,
        "{}",
        tail.stderr()
    );
    let said = tail.stderr();
    assert!(said.contains("nosuch"), "{said}");
    assert_eq!(said.matches("never seen").count(), 1, "{said}");
    // Still waiting for it.
    assert_eq!(tail.wait_exit(std::time::Duration::from_millis(200)), None);
}

/// Without a watch-config flag, a hub with $KUBECONFIG (in a pod: its service account)
/// reads WatchConfigs from that cluster, as the agent and the lifecycle operator do.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_reads_watch_configs_through_kubeconfig_when_no_flag_says_otherwise() {
    let pki = Pki::new();
    let (_cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let crds = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    let hub = HubProc::start_with_env(&pki, free_port(), None, &[], &[("KUBECONFIG", cp_kc.to_str().unwrap())]);
    let admin = hub.admin_port;
    let ready = holds_within(std::time::Duration::from_secs(30), || {
        tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(http_get(admin, "/readyz")))
            .contains("control-plane ok")
    })
    .await;
    assert!(ready, "{}\n{}", http_get(admin, "/readyz").await, hub.proc.stderr());
    assert!(hub.proc.stderr().contains("$KUBECONFIG"), "{}", hub.proc.stderr());
}

#[test]
fn agent_module_says_to_set_its_image_and_the_deploy_guide_does() {
    let (code, out, _) = run(&["agent-module", "--help"]);
    assert_eq!(code, 0);
    let help = out.split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(help.contains("--image <IMAGE>") && help.contains("Dockerfile") && help.contains("Set it"), "{help}");
    let (code, out, err) = run(&[
        "agent-module",
        "--hub",
        "wss://hub.example.org:443",
        "--image",
        "registry.example.com/fleetwatch:9.9.9",
    ]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("image: registry.example.com/fleetwatch:9.9.9"), "{out}");
    // Every agent-module command in the deploy guide sets the image.
    let guide =
        std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/deploy.md")).unwrap();
    let commands: Vec<String> = guide
        .replace("\\\n", " ")
        .lines()
        .filter(|l| l.starts_with("fleetwatch agent-module"))
        .map(String::from)
        .collect();
    assert!(!commands.is_empty() && commands.iter().all(|c| c.contains("--image ")), "{commands:?}");
}

#[test]
fn version_names_build_protocols_formats_and_crds() {
    let (code, out, err) = run(&["version"]);
    assert_eq!(code, 0, "{err}");
    let first = out.lines().next().unwrap_or_default();
    let commit = first.split("(commit ").nth(1).and_then(|c| c.strip_suffix(')')).unwrap_or_default();
    assert!(first.starts_with(&format!("fleetwatch {} (commit ", env!("CARGO_PKG_VERSION"))), "{out}");
    // A checkout's short hash, or `unknown` when built without git (a tarball).
    assert!(commit == "unknown" || commit.len() == 12 && commit.chars().all(|c| c.is_ascii_hexdigit()), "{first}");
    let protocol = fleetwatch_protocol::message::ProtocolRange::OURS;
    assert!(out.contains(&format!("protocol: {} (speaks {}..{};", protocol.max, protocol.min, protocol.max)), "{out}");
    assert!(out.contains("log format: fleetwatch-bus 2"), "{out}");
    for crd in ["runtimes", "moduletemplates", "modulereleasemetas", "maintenancepolicies", "watchconfigs"] {
        assert!(out.contains(&format!("  {crd}.operator.fleetwatch.dev: v1alpha1 (served, storage)")), "{out}");
    }
    // `--version` prints the first line.
    let (code, short, _) = run(&["--version"]);
    assert_eq!((code, short.trim_end()), (0, first));
    // The charts carry the same version (the image tag defaults to their appVersion).
    for chart in ["fleetwatch", "fleetwatch-agent"] {
        let path =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/helm").join(chart).join("Chart.yaml");
        let text = std::fs::read_to_string(&path).unwrap();
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.trim().trim_matches('"').to_string())
                .unwrap_or_default()
        };
        assert_eq!(field("version:"), env!("CARGO_PKG_VERSION"), "{chart}");
        assert_eq!(field("appVersion:"), env!("CARGO_PKG_VERSION"), "{chart}");
    }
}

/// `--log warning` (or RUST_LOG=verbose) was taken for a target filter and muted almost every
/// log without a word: now refused before anything runs, naming the word and what was meant.
#[test]
fn a_log_filter_that_is_not_a_level_is_refused_naming_it() {
    let (code, _, err) = run(&["--log", "warning", "version"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("`warning` is not a log level") && err.contains("did you mean `warn`"), "{err}");
    let out = Command::new(BIN).args(["version"]).env("RUST_LOG", "verbose").output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("RUST_LOG=verbose") && err.contains("did you mean `debug` or `trace`"), "{err}");
    let (code, out, err) = run(&["--log", "warn,fleetwatch_hub=debug", "version"]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("fleetwatch "), "{out}");
}

/// `fleetwatch completion bash` completes commands and flags in a real bash, the other
/// shells get their scripts, and `fleetwatch man --dir` writes a page per command.
#[test]
fn completion_scripts_complete_in_bash_and_man_pages_are_written() {
    let (code, script, err) = run(&["completion", "bash"]);
    assert_eq!(code, 0, "{err}");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("fleetwatch.bash");
    std::fs::write(&file, &script).unwrap();
    let complete = |words: &str, cword: usize| {
        let cmd = format!(
            "source {}; COMP_WORDS=({words}); COMP_CWORD={cword}; _fleetwatch fleetwatch \"${{COMP_WORDS[$COMP_CWORD]}}\" \"${{COMP_WORDS[$COMP_CWORD-1]}}\"; echo \"${{COMPREPLY[@]}}\"",
            file.display()
        );
        let out = Command::new("bash").args(["-c", &cmd]).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    assert_eq!(complete("fleetwatch hu", 1), "hub");
    assert_eq!(complete("fleetwatch hub --retention-b", 2), "--retention-bytes");
    assert!(complete("fleetwatch modules ", 2).split_whitespace().any(|w| w == "enable"));
    for (shell, mark) in
        [("zsh", "#compdef fleetwatch"), ("fish", "complete -c fleetwatch"), ("powershell", "fleetwatch")]
    {
        let (code, out, err) = run(&["completion", shell]);
        assert_eq!(code, 0, "{shell}: {err}");
        assert!(out.contains(mark) && out.contains("retention-bytes"), "{shell}: {out:.300}");
    }
    let (code, _, err) = run(&["completion", "tcsh"]);
    assert_eq!(code, 2, "an unknown shell is refused: {err}");

    let (code, out, err) = run(&["man", "--dir", dir.path().to_str().unwrap()]);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("man pages into"), "{out}");
    let hub = std::fs::read_to_string(dir.path().join("fleetwatch-hub.1")).unwrap();
    assert!(hub.contains(".TH fleetwatch-hub 1") && hub.contains("retention\\-bytes"), "{hub:.500}");
    assert!(dir.path().join("fleetwatch-modules-enable.1").exists());
    let (code, page, _) = run(&["man"]);
    assert_eq!(code, 0);
    assert!(page.contains(".TH fleetwatch 1"), "{page:.300}");
}

/// `fleetwatch version -o json|yaml`: what the text says, for scripts (every CRD with its
/// served and storage versions).
#[test]
fn version_prints_text_json_and_yaml_with_every_crd() {
    let (code, text, err) = run(&["version"]);
    assert_eq!(code, 0, "{err}");
    let (code, json, err) = run(&["version", "-o", "json"]);
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        text.starts_with(&format!(
            "fleetwatch {} (commit {})",
            v["version"].as_str().unwrap(),
            v["commit"].as_str().unwrap()
        )),
        "{text}\n{v}"
    );
    let crds = v["crds"].as_array().unwrap();
    assert_eq!(crds.len(), 8, "{v}");
    for crd in crds {
        let name = crd["name"].as_str().unwrap();
        assert!(text.contains(&format!("  {name}: ")), "{name} not in the text: {text}");
        assert!(crd["versions"].as_array().unwrap().iter().any(|x| x["storage"] == true), "{crd}");
    }
    assert!(crds.iter().any(|c| c["name"] == "subscriberaccesspolicies.operator.fleetwatch.dev"), "{v}");
    let (code, yaml, err) = run(&["version", "-o", "yaml"]);
    assert_eq!(code, 0, "{err}");
    assert!(yaml.contains(&format!("commit: {}", v["commit"].as_str().unwrap())), "{yaml}");
    assert!(yaml.contains("- name: modules.operator.fleetwatch.dev"), "{yaml}");
}
