//! The relays in the control-plane chart: what they render (certificate, probes, network
//! policy, the access-policy grant), what is refused, and each relay run from its rendered
//! Deployment.

use super::*;

/// The values that turn both relays on (targets, a scoped grant, TLS to the target, HMAC,
/// an XFCC CA), with cert-manager certificates and the ServiceMonitor.
const RELAYS_ON: &[&str] = &[
    "relays.webhook.enabled=true",
    "relays.webhook.target=https://receiver.example/events",
    "relays.webhook.clusters={eu-*,us-1}",
    "relays.webhook.hmacSecret.secretName=webhook-hmac",
    "relays.webhook.targetTLS.caSecretName=receiver-ca",
    "relays.webhook.types={dev.fleetwatch.object}",
    "relays.klm.enabled=true",
    "relays.klm.target=http://klm-listener.kcp-system.svc:8082",
    "relays.klm.xfccCASecretName=klm-xfcc",
    "relays.klm.deadLetter.persistence.enabled=false",
    "certificates.mode=cert-manager",
    "trustDomain=fleet.example.org",
    "monitoring.serviceMonitor.enabled=true",
];

/// Whether a NetworkPolicy rule's peers and ports admit `port` from/to `peer`.
fn rule_admits(rule: &Value, peers: &str, port: u64, peer: &dyn Fn(&Value) -> bool) -> bool {
    rule["ports"].as_array().into_iter().flatten().any(|p| p["port"] == port)
        && rule[peers].as_array().into_iter().flatten().any(peer)
}

/// Each relay the chart renders is a restricted, probed Deployment of one pod with its own
/// ServiceAccount (no token), its subscriber certificate, its dead letters on a claim (or
/// an emptyDir when asked), a NetworkPolicy (in: the metrics port only; out: DNS, the hub,
/// the target's port), a metrics Service the ServiceMonitor selects, a `helm test` URL, and
/// the access-policy grant for its subscriber name, scoped to `clusters`.
#[test]
fn relays_render_with_their_certificate_probes_policy_and_grant() {
    let docs = helm_template("fleetwatch", "fleetwatch-system", RELAYS_ON).unwrap();
    let lifecycle = find(&docs, "Deployment", "fleetwatch-lifecycle");
    let sm = docs.iter().find(|d| d["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
    let np_of = |labels: &Value| {
        docs.iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .find(|np| {
                np["spec"]["podSelector"]["matchLabels"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v)
            })
            .unwrap_or_else(|| panic!("no NetworkPolicy selects {labels}"))
    };
    for (kind, name, target_port, claim) in [("webhook", "webhook", 443, true), ("klm", "klm", 8082, false)] {
        let wname = format!("fleetwatch-relay-{kind}");
        let w = find(&docs, "Deployment", &wname);
        assert_restricted_and_probed(w);
        let spec = pod_spec(w);
        let c = &spec["containers"][0];
        let args: Vec<&str> = c["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert_eq!(&args[..2], &["relay", kind], "{wname}");
        assert_eq!(w["spec"]["replicas"], 1);
        assert_eq!(w["spec"]["strategy"]["type"], "Recreate");
        // Probes on what the relay serves on --metrics-listen.
        assert_eq!(arg(w, "--metrics-listen"), "0.0.0.0:9091");
        assert_eq!(c["ports"][0], json!({"name": "metrics", "containerPort": 9091, "protocol": "TCP"}));
        assert_eq!(c["livenessProbe"]["httpGet"], json!({"path": "/healthz", "port": "metrics"}));
        assert_eq!(c["readinessProbe"]["httpGet"], json!({"path": "/readyz", "port": "metrics"}));
        // Its own ServiceAccount, without a token (it calls no Kubernetes API).
        let sa = find(&docs, "ServiceAccount", &wname);
        assert_eq!(spec["serviceAccountName"], wname.as_str());
        assert_eq!(sa["automountServiceAccountToken"], false);
        assert_eq!(spec["automountServiceAccountToken"], false);
        // The hub the operator dials, the trust bundle, its durable name.
        assert_eq!(arg(w, "--hub"), arg(lifecycle, "--hub"));
        assert_eq!(mounted_source(w, "/etc/fleetwatch/trust"), mounted_source(lifecycle, "/etc/fleetwatch/trust"));
        assert_eq!(arg(w, "--name"), name);
        // The subscriber certificate: cert-manager's, for spiffe://<td>/subscriber/<name>.
        let cert = find(&docs, "Certificate", &wname);
        check_certificate(cert, &format!("spiffe://fleet.example.org/subscriber/{name}"), "client auth");
        assert_eq!(cert["spec"]["secretName"].as_str().unwrap(), mounted_source(w, "/etc/fleetwatch/tls"));
        assert_eq!(arg(w, "--cert"), "/etc/fleetwatch/tls/tls.crt");
        // Dead letters on a claim the chart makes (kept on uninstall), or an emptyDir.
        assert_eq!(arg(w, "--dead-letter"), "/var/lib/fleetwatch/dead-letter");
        let mount =
            c["volumeMounts"].as_array().unwrap().iter().find(|m| m["mountPath"] == "/var/lib/fleetwatch/dead-letter");
        let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == mount.unwrap()["name"]).unwrap();
        if claim {
            let pvc =
                find(&docs, "PersistentVolumeClaim", volume["persistentVolumeClaim"]["claimName"].as_str().unwrap());
            assert_eq!(pvc["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
        } else {
            assert!(volume["emptyDir"]["sizeLimit"].is_string(), "{volume}");
            assert!(!docs.iter().any(|d| d["kind"] == "PersistentVolumeClaim" && key(d).contains("relay-klm")));
        }
        // NetworkPolicy: in, only the metrics port (Prometheus' namespace, the helm test
        // Job); out, DNS, the hub's wss port and the target's port.
        let labels = &w["spec"]["template"]["metadata"]["labels"];
        let np = np_of(labels);
        assert_eq!(np["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        let ingress = np["spec"]["ingress"].as_array().unwrap();
        assert!(
            ingress.iter().all(|r| r["ports"] == json!([{"port": 9091, "protocol": "TCP"}]) && r["from"].is_array()),
            "{wname}: {ingress:?}"
        );
        let egress = np["spec"]["egress"].as_array().unwrap();
        let hub_labels = &find(&docs, "StatefulSet", "fleetwatch-hub")["spec"]["template"]["metadata"]["labels"];
        let to_hub = |p: &Value| {
            p["podSelector"]["matchLabels"].as_object().is_some_and(|m| m.iter().all(|(k, v)| &hub_labels[k] == v))
        };
        assert!(egress.iter().any(|r| rule_admits(r, "to", 7443, &to_hub)), "{wname}: no egress to the hub");
        assert!(
            egress.iter().any(|r| rule_admits(r, "to", target_port, &|p| p["ipBlock"]["cidr"] == "0.0.0.0/0")),
            "{wname}: no egress to the target's port {target_port}: {egress:?}"
        );
        assert_eq!(egress.len(), 3, "{wname}: DNS, hub, target and nothing else: {egress:?}");
        // The metrics Service the ServiceMonitor scrapes (also while not ready).
        let svc = find(&docs, "Service", &format!("{wname}-metrics"));
        let component = &svc["metadata"]["labels"]["app.kubernetes.io/component"];
        assert!(sm["spec"]["selector"]["matchExpressions"][0]["values"].as_array().unwrap().contains(component));
        assert_eq!(svc["metadata"]["labels"]["fleetwatch.dev/job"], "fleetwatch-relay", "the absence alerts' job");
        assert_eq!(svc["spec"]["publishNotReadyAddresses"], true);
        assert!(svc["spec"]["selector"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v));
        assert!(
            sm["spec"]["endpoints"].as_array().unwrap().iter().any(|e| e["port"] == svc["spec"]["ports"][0]["name"])
        );
        // `helm test` asks its /readyz.
        let job = docs.iter().find(|d| d["kind"] == "Job").unwrap();
        let url = format!("http://{wname}-metrics.fleetwatch-system.svc:9091/readyz");
        assert!(pod_spec(job)["containers"][0]["args"].as_array().unwrap().contains(&json!(url)), "{url}");
    }
    // Per-relay options.
    let hook = find(&docs, "Deployment", "fleetwatch-relay-webhook");
    assert_eq!(arg(hook, "--target"), "https://receiver.example/events");
    assert_eq!(arg(hook, "--type"), "dev.fleetwatch.object");
    assert_eq!(mounted_source(hook, "/etc/fleetwatch/hmac"), "webhook-hmac");
    assert_eq!(arg(hook, "--hmac-secret-file"), "/etc/fleetwatch/hmac/secret");
    assert_eq!(mounted_source(hook, "/etc/fleetwatch/target-ca"), "receiver-ca");
    assert_eq!(arg(hook, "--target-ca"), "/etc/fleetwatch/target-ca/ca.crt");
    let klm = find(&docs, "Deployment", "fleetwatch-relay-klm");
    assert_eq!(arg(klm, "--component"), "lifecycle-manager");
    assert_eq!(mounted_source(klm, "/etc/fleetwatch/xfcc-ca"), "klm-xfcc");
    assert_eq!(arg(klm, "--xfcc-ca-key"), "/etc/fleetwatch/xfcc-ca/tls.key");
    // The access policy grants each relay's subscriber name, scoped as asked, besides the
    // chart's own entries.
    let cm = find(&docs, "ConfigMap", "fleetwatch-hub-access-policy");
    let policy: Value = serde_saphyr::from_str(cm["data"]["policy.yaml"].as_str().unwrap()).unwrap();
    let grant = |n: &str| policy["subscribers"].as_array().unwrap().iter().find(|s| s["name"] == n).cloned();
    assert_eq!(grant("webhook").unwrap()["clusters"], json!(["eu-*", "us-1"]));
    assert_eq!(grant("klm").unwrap()["clusters"], json!(["*"]));
    assert!(grant("lifecycle").is_some() && grant("ops").is_some());
    // Secret mode: the relay mounts the Secret named in values (no Certificate).
    let secret_mode = helm_template(
        "fleetwatch",
        "ns",
        &["relays.klm.enabled=true", "relays.klm.target=http://l:8082", "relays.klm.certificateSecretName=my-klm-tls"],
    )
    .unwrap();
    assert_eq!(
        mounted_source(find(&secret_mode, "Deployment", "fleetwatch-relay-klm"), "/etc/fleetwatch/tls"),
        "my-klm-tls"
    );
    assert!(!secret_mode.iter().any(|d| d["kind"] == "Certificate"));
    // The pod options of the other workloads, on a relay too.
    let digest = format!("sha256:{}", "b".repeat(64));
    let options = helm_template(
        "fleetwatch",
        "ns",
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            &format!("image.digest={digest}"),
            "relays.webhook.serviceAccount.create=false",
            "relays.webhook.serviceAccount.name=wi-relay",
            "relays.webhook.extraEnv[0].name=HTTPS_PROXY",
            "relays.webhook.extraEnv[0].value=http://proxy:3128",
            "relays.webhook.extraVolumes[0].name=extra",
            "relays.webhook.extraVolumes[0].emptyDir.medium=Memory",
            "relays.webhook.extraVolumeMounts[0].name=extra",
            "relays.webhook.extraVolumeMounts[0].mountPath=/extra",
            "relays.webhook.podLabels.team=platform",
            "relays.webhook.podAnnotations.note=x",
            "relays.webhook.priorityClassName=critical",
            "relays.webhook.extraArgs={--batch-max-bytes=65536}",
        ],
    )
    .unwrap();
    let w = find(&options, "Deployment", "fleetwatch-relay-webhook");
    let spec = pod_spec(w);
    let c = &spec["containers"][0];
    assert_eq!(spec["serviceAccountName"], "wi-relay");
    assert!(!options.iter().any(|d| d["kind"] == "ServiceAccount" && key(d).contains("relay")));
    assert_eq!(c["image"], format!("ghcr.io/fleetwatch/fleetwatch@{digest}"));
    assert_eq!(c["env"], json!([{"name": "HTTPS_PROXY", "value": "http://proxy:3128"}]));
    assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/extra"));
    assert!(spec["volumes"].as_array().unwrap().iter().any(|v| v["name"] == "extra"));
    assert_eq!(w["spec"]["template"]["metadata"]["labels"]["team"], "platform");
    assert!(w["spec"]["selector"]["matchLabels"]["team"].is_null());
    assert_eq!(w["spec"]["template"]["metadata"]["annotations"]["note"], "x");
    assert_eq!(spec["priorityClassName"], "critical");
    assert_eq!(arg(w, "--batch-max-bytes"), "65536");
    // Off by default: nothing of the relays, and the policy has only the chart's entries.
    let default = helm_template("fleetwatch", "ns", &[]).unwrap();
    assert!(!default.iter().any(|d| key(d).contains("relay")), "a relay object with default values");
    let policy = find(&default, "ConfigMap", "fleetwatch-hub-access-policy")["data"]["policy.yaml"].as_str().unwrap();
    let policy: Value = serde_saphyr::from_str(policy).unwrap();
    let names: Vec<&str> =
        policy["subscribers"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["lifecycle", "ops"]);
}

/// A relay enabled without what it needs is refused, saying what to set; never rendered
/// half-working (no target, no grant, a grant the policy would reject).
#[test]
fn relays_without_what_they_need_are_refused() {
    let refused = |set: &[&str], says: &[&str]| {
        let err = helm_template("fleetwatch", "ns", set).expect_err(&format!("rendered with {set:?}"));
        for s in says {
            assert!(err.contains(s), "{set:?}: {s:?} not in {err}");
        }
    };
    refused(&["relays.webhook.enabled=true"], &["relays.webhook.target", "required when relays.webhook.enabled=true"]);
    refused(&["relays.klm.enabled=true"], &["relays.klm.target", "required when relays.klm.enabled=true"]);
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=ftp://x/"],
        &["must be an http:// or https:// URL"],
    );
    // No cluster in the grant: the relay would receive nothing.
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=https://r/", "relays.webhook.clusters=null"],
        &["relays.webhook.clusters", "at least one cluster"],
    );
    // A name the policy already grants (or the other relay's) would make the policy invalid.
    refused(
        &["relays.webhook.enabled=true", "relays.webhook.target=https://r/", "relays.webhook.name=ops"],
        &["relays.webhook.name \"ops\" is already granted in hub.accessPolicy.subscribers"],
    );
    refused(
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            "relays.klm.enabled=true",
            "relays.klm.target=https://l/",
            "relays.klm.name=webhook",
        ],
        &["each relay needs its own subscriber name"],
    );
    refused(
        &[
            "relays.webhook.enabled=true",
            "relays.webhook.target=https://r/",
            "relays.webhook.targetTLS.clientSecretName=c",
        ],
        &["relays.webhook.targetTLS.caSecretName"],
    );
    // The schema is closed and typed for the relays too.
    refused(&["relays.webhook.targett=https://r/"], &["relays.webhook", "targett"]);
    refused(&["relays.webhook.batch=0"], &["relays.webhook.batch"]);
    refused(&["relays.klm.from=middle"], &["relays.klm.from"]);
}

/// A control plane (sim, CRDs) and the hub run from `docs` (the chart rendered with a
/// relay), with the files of every volume the hub and relay `kind` mount (the relay's
/// subscriber certificate for its default name).
async fn rendered_hub_for_relay(
    pki: &Pki,
    dir: &Path,
    docs: &[Value],
    kind: &str,
) -> (fleetwatch_sim::SimCluster, PathBuf, Workload, VolumeFiles) {
    let cp = sim("control-plane", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    let hub_kc = dir.join("hub.kubeconfig");
    cp.write_kubeconfig_for(&hub_kc, "fleetwatch-system", "fleetwatch-hub").unwrap();
    let relay_files = pki.subscriber(kind);
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(docs, dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    files.insert(
        format!("fleetwatch-relay-{kind}-tls"),
        vec![("tls.crt", relay_files.cert.clone()), ("tls.key", relay_files.key.clone())],
    );
    let hub = start_ready(docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, dir).await;
    (cp, cp_kc, hub, files)
}

/// What the relay test's target received: the signature header and the body.
type Request = (String, Vec<u8>);

/// A relay enabled in the chart runs from its rendered Deployment (args, mounts, probes)
/// against a hub run from the same render: it subscribes under the access-policy grant the
/// chart added (scoped to one cluster: another cluster's events, earlier in the log, never
/// reach it), becomes ready, and posts signed CloudEvents to its target.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_runs_from_its_rendered_deployment_under_the_grant_the_chart_adds() {
    use std::sync::{Arc, Mutex};
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    // The target: records each request's signature header and body, answers 200.
    let got: Arc<Mutex<Vec<Request>>> = Default::default();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let target = format!("http://127.0.0.1:{}/events", listener.local_addr().unwrap().port());
    let store = got.clone();
    let app = axum::Router::new().route(
        "/events",
        axum::routing::post(move |headers: axum::http::HeaderMap, body: axum::body::Bytes| {
            let store = store.clone();
            async move {
                let sig = headers.get("x-fleetwatch-signature").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                store.lock().unwrap().push((sig, body.to_vec()));
                axum::http::StatusCode::OK
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });

    let target_value = format!("relays.webhook.target={target}");
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "relays.webhook.enabled=true",
            &target_value,
            "relays.webhook.clusters={eu-1}",
            "relays.webhook.hmacSecret.secretName=webhook-hmac",
        ],
    )
    .unwrap();
    let hmac = pki.path("hmac-secret");
    std::fs::write(&hmac, "s3cret\n").unwrap();
    let (_cp, cp_kc, hub, mut files) = rendered_hub_for_relay(&pki, &dir, &docs, "webhook").await;
    files.insert("webhook-hmac".into(), vec![("secret", hmac)]);
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));

    // eu-2's events first, all in the hub's log (ops reads every cluster)…
    let collector = Collector::start(&pki, &hub_url, "ops").await;
    let all_of = |cluster: &str| {
        let seen = collector.seen.lock().unwrap();
        (0..5).all(|n| seen.generation.contains_key(&(cluster.to_string(), synthetic_subject(n))))
    };
    let _eu2 = agent(&pki, "eu-2", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    assert!(holds_within(Duration::from_secs(30), || all_of("eu-2")).await, "ops did not get eu-2's events");
    // …then the relay, from its rendered Deployment (its claim an empty directory here).
    let relay =
        start_ready(&docs, "Deployment", "fleetwatch-relay-webhook", &files, Some(&hub_url), &cp_kc, &dir).await;
    let _eu1 = agent(&pki, "eu-1", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    let subjects = |got: &[Request]| {
        got.iter()
            .filter_map(|(_, b)| serde_json::from_slice::<Value>(b).ok())
            .filter(|e| e["source"] == "/clusters/eu-1")
            .filter_map(|e| e["subject"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    let want: std::collections::BTreeSet<String> = (0..5).map(synthetic_subject).collect();
    let delivered = holds_within(Duration::from_secs(30), || subjects(&got.lock().unwrap()).is_superset(&want)).await;
    assert!(delivered, "the relay did not post eu-1's 5 objects; relay log:\n{}", tail(&relay.proc.stderr()));
    // Signed with the mounted secret; nothing of eu-2, whose events came before in the log.
    let key = fleetwatch_relay::webhook::hmac_key(b"s3cret");
    for (sig, body) in got.lock().unwrap().iter() {
        assert!(fleetwatch_relay::webhook::verify_signature(&key, body, sig), "bad signature {sig:?}");
        let text = String::from_utf8_lossy(body);
        assert!(!text.contains("eu-2"), "the relay's grant is eu-1 only, it posted: {text}");
    }
    // Its metrics endpoint (the ServiceMonitor's) counts the deliveries.
    let metrics = http_get(relay.port("metrics"), "/metrics").await;
    let delivered: u64 = metrics
        .lines()
        .find(|l| l.starts_with("fleetwatch_relay_delivered_total{") && l.contains(&target))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no delivered count for {target} in:\n{metrics}"));
    assert!(delivered >= 5, "{metrics}");
}

/// The KLM relay from its rendered Deployment: the listener (runtime-watcher's v2 contract)
/// gets a request per object of the granted cluster, with that cluster as the runtime id.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_klm_relay_runs_from_its_rendered_deployment() {
    use crate::relay::klm_listener::KlmListener;
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let listener = KlmListener::start(None).await;
    let target = format!("relays.klm.target={}", listener.url());
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["relays.klm.enabled=true", &target, "relays.klm.clusters={rt-*}"],
    )
    .unwrap();
    let (_cp, cp_kc, hub, files) = rendered_hub_for_relay(&pki, &dir, &docs, "klm").await;
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));
    let relay = start_ready(&docs, "Deployment", "fleetwatch-relay-klm", &files, Some(&hub_url), &cp_kc, &dir).await;
    let _agent = agent(&pki, "rt-1", &hub_url, "synthetic:objects=5,rate=50,total=5", &[]);
    let names = || {
        listener
            .received()
            .iter()
            .filter(|r| r.runtime == "rt-1" && r.component == "lifecycle-manager")
            .filter_map(|r| r.body["watched"]["name"].as_str().map(str::to_string))
            .collect::<std::collections::BTreeSet<_>>()
    };
    // The five objects (and the agent start's resync fallback, the runtime's Kyma object).
    let want: std::collections::BTreeSet<String> = (0..5).map(|n| format!("obj-{n}")).collect();
    let all = holds_within(Duration::from_secs(30), || names().is_superset(&want)).await;
    assert!(
        all,
        "the listener got {:?} (refused {:?}); relay log:\n{}",
        names(),
        listener.refused(),
        tail(&relay.proc.stderr())
    );
    let received = listener.received();
    let r = received.iter().find(|r| r.body["watched"]["name"] == "obj-0").unwrap();
    assert_eq!(r.body["watchedGvk"], json!({"group": "synthetic.fleetwatch.dev", "version": "v1", "kind": "Object"}));
    assert_eq!(r.body["watched"]["namespace"], "default");
}
