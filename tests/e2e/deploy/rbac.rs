//! The charts' RBAC proven with the processes' own ServiceAccount tokens under the sim's RBAC:
//! Secrets kept from the operator, hub and agent; the built-in agent certificates; the hub
//! reading SubscriberAccessPolicies.

use super::*;

/// The rendered RBAC, applied to a sim that enforces it and checked with `kubectl auth can-i
/// --as=<ServiceAccount>`: the lifecycle operator reads Secrets in the kubeconfig namespace
/// only (by name: get, no list), never the hub's TLS key, admin token or a CA in its own
/// namespace; the hub reads no Secret; the agent chart without `watch.allowSecrets` grants
/// no Secret read. The chart refuses the release namespace as the kubeconfig namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn chart_rbac_keeps_secrets_from_the_operator_hub_and_agent() {
    let dir = tempfile::tempdir().unwrap();
    let cp_docs = manifest("control-plane.yaml");
    let agent_docs = manifest("agent.yaml");
    let cp = sim("control-plane", true).await;
    let rt = sim("eu-1", true).await;
    let (cp_kc, rt_kc) = (dir.path().join("cp.kubeconfig"), dir.path().join("rt.kubeconfig"));
    cp.write_kubeconfig(&cp_kc).unwrap();
    rt.write_kubeconfig(&rt_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", manifest_path("control-plane.yaml").to_str().unwrap()], None);
    kubectl(&rt_kc, &["apply", "--server-side", "-f", manifest_path("agent.yaml").to_str().unwrap()], None);

    let lifecycle = find(&cp_docs, "Deployment", "fleetwatch-lifecycle");
    let ns = lifecycle["metadata"]["namespace"].as_str().unwrap().to_string();
    let kubeconfig_ns = arg(lifecycle, "--kubeconfig-namespace").to_string();
    assert_eq!(kubeconfig_ns, "fleetwatch-runtimes");
    let sa = |docs: &[Value], kind: &str, name: &str| {
        let w = find(docs, kind, name);
        format!(
            "system:serviceaccount:{}:{}",
            w["metadata"]["namespace"].as_str().unwrap(),
            pod_spec(w)["serviceAccountName"].as_str().unwrap()
        )
    };
    let operator = sa(&cp_docs, "Deployment", "fleetwatch-lifecycle");
    let hub = sa(&cp_docs, "StatefulSet", "fleetwatch-hub");
    let agent = sa(&agent_docs, "Deployment", "fleetwatch-agent");
    // `kubectl auth can-i` prints yes/no (and exits 1 for no).
    let can_i = |kc: &Path, who: &str, args: &[&str]| -> String {
        let mut all = vec!["auth", "can-i"];
        all.extend_from_slice(args);
        let who = format!("--as={who}");
        all.push(&who);
        let (_, out, err) = kubectl_try(kc, &all);
        let answer = out.trim().to_string();
        assert!(answer == "yes" || answer == "no", "kubectl {all:?}: {out} {err}");
        answer
    };
    // The caller is who we think: whoami through impersonation.
    let (ok, out, err) = kubectl_try(&cp_kc, &["auth", "whoami", "-o", "json", &format!("--as={operator}")]);
    assert!(ok, "{err}");
    let me: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(me["status"]["userInfo"]["username"], operator.as_str());

    // The operator: a kubeconfig Secret in its namespace, by name…
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secret/eu-1-kubeconfig", "-n", &kubeconfig_ns]), "yes");
    // …but it cannot list them, nor read any Secret elsewhere.
    assert_eq!(can_i(&cp_kc, &operator, &["list", "secrets", "-n", &kubeconfig_ns]), "no");
    let hub_tls = mounted_source(find(&cp_docs, "StatefulSet", "fleetwatch-hub"), "/etc/fleetwatch/tls");
    let admin_token = "fleetwatch-hub-admin-token";
    for secret in [hub_tls.as_str(), admin_token, "fleetwatch-ca", "fleetwatch-lifecycle-tls"] {
        assert_eq!(
            can_i(&cp_kc, &operator, &["get", &format!("secret/{secret}"), "-n", &ns]),
            "no",
            "the operator may read Secret {ns}/{secret}"
        );
    }
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secrets", "-n", &ns]), "no");
    assert_eq!(can_i(&cp_kc, &operator, &["get", "secrets", "-n", "default"]), "no");
    assert_eq!(can_i(&cp_kc, &operator, &["list", "secrets", "--all-namespaces"]), "no");
    // What it does need still works (a positive control for the identity): Runtimes, Leases.
    assert_eq!(can_i(&cp_kc, &operator, &["watch", "runtimes.operator.fleetwatch.dev", "--all-namespaces"]), "yes");
    assert_eq!(can_i(&cp_kc, &operator, &["update", "leases", "-n", &ns]), "yes");

    // The hub reads no Secret at all.
    for (verb, where_) in [("get", ns.as_str()), ("get", kubeconfig_ns.as_str()), ("list", ns.as_str())] {
        assert_eq!(can_i(&cp_kc, &hub, &[verb, "secrets", "-n", where_]), "no", "hub {verb} secrets in {where_}");
    }
    assert_eq!(can_i(&cp_kc, &hub, &["watch", "watchconfigs.operator.fleetwatch.dev"]), "yes");

    // The agent (watch.allowSecrets unset): ConfigMaps yes, Secrets nowhere.
    assert_eq!(can_i(&rt_kc, &agent, &["list", "configmaps", "--all-namespaces"]), "yes");
    for args in [
        &["get", "secrets", "-n", "apps"][..],
        &["list", "secrets", "--all-namespaces"],
        &["watch", "secrets", "--all-namespaces"],
        &["get", "secrets", "-n", "fleetwatch-agent"],
    ] {
        assert_eq!(can_i(&rt_kc, &agent, args), "no", "agent {args:?}");
    }

    // The kubeconfig namespace cannot be the release namespace.
    let err =
        helm_template("fleetwatch", "fleetwatch-system", &["lifecycle.runtimeKubeconfigs.namespace=fleetwatch-system"])
            .unwrap_err();
    assert!(err.contains("is the release namespace"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn built_in_agent_certificates_work_under_the_chart_rbac() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let ns = "fleetwatch-system";
    let docs =
        helm_template("fleetwatch", ns, &["createNamespace=true", &format!("lifecycle.agentCASecret={ns}/fleet-ca")])
            .unwrap();
    // Only the CA Secret, by name, read only.
    let role = find(&docs, "Role", "fleetwatch-lifecycle-agent-ca");
    assert_eq!(
        role["rules"],
        json!([{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["fleet-ca"], "verbs": ["get"]}])
    );
    let err = helm_template("fleetwatch", ns, &["lifecycle.agentCASecret=fleet-ca"]).unwrap_err();
    assert!(err.contains("NAMESPACE/NAME"), "{err}");

    let cp = sim("control-plane", true).await;
    let rt = sim("eu-1", false).await;
    let (cp_kc, rt_kc) = (dir.join("cp.kubeconfig"), dir.join("rt.kubeconfig"));
    cp.write_kubeconfig(&cp_kc).unwrap();
    rt.write_kubeconfig(&rt_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", repo().join("deploy/crds").to_str().unwrap()], None);
    for d in &docs {
        apply_json(&cp_kc, d);
    }
    let (hub_kc, lifecycle_kc) = (dir.join("hub.kubeconfig"), dir.join("lifecycle.kubeconfig"));
    cp.write_kubeconfig_for(&hub_kc, ns, "fleetwatch-hub").unwrap();
    cp.write_kubeconfig_for(&lifecycle_kc, ns, "fleetwatch-lifecycle").unwrap();
    let lifecycle_files = pki.subscriber("lifecycle");
    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    files.insert(
        "fleetwatch-lifecycle-tls".into(),
        vec![("tls.crt", lifecycle_files.cert.clone()), ("tls.key", lifecycle_files.key.clone())],
    );
    let hub = start_ready(&docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, &dir).await;
    let hub_url = format!("wss://localhost:{}", hub.port("wss"));

    // The CA Secret, the agent module's template, a runtime cluster's kubeconfig and its Runtime.
    let ca = |f: &str| std::fs::read_to_string(pki.path(f)).unwrap();
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "fleet-ca", "namespace": ns},
                          "stringData": {"ca.crt": ca("ca.crt"), "ca.key": ca("ca.key")}}),
    );
    let out =
        std::process::Command::new(BIN).args(["agent-module", "--hub", &hub_url, "--namespace", ns]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    for d in documents(&String::from_utf8_lossy(&out.stdout)) {
        apply_json(&cp_kc, &d);
    }
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "eu-1-kubeconfig", "namespace": "fleetwatch-runtimes"},
                          "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
        "metadata": {"name": "eu-1", "namespace": ns},
        "spec": {"clusterId": "eu-1", "kubeconfigSecret": {"name": "eu-1-kubeconfig"}, "modules": []}}),
    );

    // The operator, with its own token, reads the CA and writes the agent's certificate.
    let lifecycle =
        start_ready(&docs, "Deployment", "fleetwatch-lifecycle", &files, Some(&hub_url), &lifecycle_kc, &dir).await;
    // Where the agent module (the agent chart rendered) mounts its certificate from.
    let layout = fleetwatch_lifecycle::agent_module::layout().unwrap();
    let issued = |kc: PathBuf| {
        let (secret, agent_ns) = (layout.secret.clone(), layout.namespace.clone());
        async move {
            let (ok, out, _) =
                kubectl_try(&kc, &["get", "secret", &secret, "-n", &agent_ns, "-o", "jsonpath={.data.tls\\.crt}"]);
            ok && !out.is_empty()
        }
    };
    wait_until("the agent certificate in the runtime cluster", || issued(rt_kc.clone()), &|| {
        tail(&lifecycle.proc.stderr())
    })
    .await;
    let pem = kubectl(
        &rt_kc,
        &[
            "get",
            "secret",
            &layout.secret,
            "-n",
            &layout.namespace,
            "-o",
            "go-template={{index .data \"tls.crt\" | base64decode}}",
        ],
        None,
    );
    let info = fleetwatch_certs::inspect_pem(&pem, Path::new("tls.crt")).unwrap();
    assert_eq!(info.identity.unwrap().to_string(), "spiffe://test.local/cluster/eu-1");
    assert!(!lifecycle.proc.stderr().contains("is forbidden"), "lifecycle log:\n{}", tail(&lifecycle.proc.stderr()));
}

/// With `hub.accessPolicy.fromControlPlane`, the hub under the chart's ClusterRole lists and
/// watches SubscriberAccessPolicy objects (it is ready only once it has) and writes their
/// status: accepted, or refused for naming a subscriber the chart's file already grants.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_hub_reads_subscriber_access_policies_under_the_chart_rbac() {
    let pki = Pki::new();
    let dir = pki.path("deploy");
    std::fs::create_dir_all(&dir).unwrap();
    let docs = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["createNamespace=true", "hub.adminToken.createSecret=false", "hub.accessPolicy.fromControlPlane=true"],
    )
    .unwrap();
    let hub_w = find(&docs, "StatefulSet", "fleetwatch-hub");
    assert!(
        hub_w["spec"]["template"]["spec"]["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a == "--access-policy-from-control-plane"),
        "{hub_w}"
    );
    let cp = sim("control-plane", true).await;
    let cp_kc = dir.join("cp.kubeconfig");
    cp.write_kubeconfig(&cp_kc).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", repo().join("deploy/crds").to_str().unwrap()], None);
    let rendered = dir.join("control-plane.yaml");
    std::fs::write(&rendered, docs.iter().map(|d| format!("---\n{d}\n")).collect::<String>()).unwrap();
    kubectl(&cp_kc, &["apply", "--server-side", "-f", rendered.to_str().unwrap()], None);
    let ns = hub_w["metadata"]["namespace"].as_str().unwrap();
    let sa = pod_spec(hub_w)["serviceAccountName"].as_str().unwrap();
    let hub_kc = dir.join("hub.kubeconfig");
    cp.write_kubeconfig_for(&hub_kc, ns, sa).unwrap();

    let mut files = VolumeFiles::new();
    files.insert("fleetwatch-hub-tls".into(), vec![("tls.crt", pki.path("hub.crt")), ("tls.key", pki.path("hub.key"))]);
    files.insert("fleetwatch-hub-admin-token".into(), vec![("token", admin_token_file(&pki))]);
    files.insert("fleetwatch-hub-access-policy".into(), vec![("policy.yaml", access_policy_file(&docs, &dir))]);
    files.insert("fleetwatch-trust-bundle".into(), vec![("ca.crt", pki.path("ca.crt"))]);
    // Ready only once it has listed the objects with its own token.
    let hub = start_ready(&docs, "StatefulSet", "fleetwatch-hub", &files, None, &hub_kc, &dir).await;

    for (name, subscriber) in [("team-x", "team-x"), ("dup", "ops")] {
        apply_json(
            &cp_kc,
            &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "SubscriberAccessPolicy",
                "metadata": {"name": name}, "spec": {"subscribers": [{"name": subscriber, "clusters": ["*"]}]}}),
        );
    }
    let status = |name: &str| {
        kubectl(
            &cp_kc,
            &[
                "get",
                "subscriberaccesspolicies",
                name,
                "-o",
                r#"jsonpath={.status.conditions[0].status}/{.status.conditions[0].reason}/{.status.observedGeneration}"#,
            ],
            None,
        )
    };
    let written = holds_within(Duration::from_secs(30), || {
        status("team-x") == "True/Accepted/1" && status("dup") == "False/DuplicateSubscriber/1"
    })
    .await;
    assert!(written, "{} {}\nhub log:\n{}", status("team-x"), status("dup"), tail(&hub.proc.stderr()));
    assert!(!hub.proc.stderr().contains("cannot write"), "{}", tail(&hub.proc.stderr()));
}
