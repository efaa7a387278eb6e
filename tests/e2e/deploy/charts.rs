//! What the charts render without running anything: cert-manager Certificates, refused
//! values, the ServiceMonitor, monitoring objects, the CRDs chart, value schemas, pod options
//! and the helm test jobs.

use super::*;

#[test]
fn cert_manager_certificates_carry_the_spiffe_identity_and_renew_early() {
    // Runtime cluster: the agent's Certificate.
    let agent = helm_template(
        "fleetwatch-agent",
        "fleetwatch-agent",
        &["certificate.mode=cert-manager", "clusterId=eu-1", "trustDomain=fleet.example.org"],
    )
    .unwrap();
    let cert = find(&agent, "Certificate", "fleetwatch-agent");
    check_certificate(cert, "spiffe://fleet.example.org/cluster/eu-1", "client auth");
    let identity: Identity = "spiffe://fleet.example.org/cluster/eu-1".parse().unwrap();
    assert_eq!(identity.cluster_id(), Some("eu-1"));
    let deployment = find(&agent, "Deployment", "fleetwatch-agent");
    assert_eq!(cert["spec"]["secretName"].as_str().unwrap(), mounted_source(deployment, "/etc/fleetwatch/tls"));
    assert!(arg(deployment, "--cert").starts_with("/etc/fleetwatch/tls/"));
    assert!(!agent.iter().any(|d| d["kind"] == "Secret"), "cert-manager mode renders no Secret of its own");

    // Without a cluster id, or with one SPIFFE forbids, nothing is rendered.
    let err = helm_template("fleetwatch-agent", "fleetwatch-agent", &["certificate.mode=cert-manager"]).unwrap_err();
    assert!(err.contains("clusterId: the cluster id"), "{err}");
    let err =
        helm_template("fleetwatch-agent", "fleetwatch-agent", &["certificate.mode=cert-manager", "clusterId=a/b"])
            .unwrap_err();
    assert!(err.contains("clusterId \"a/b\""), "{err}");

    // Control plane: the hub's serving certificate, the operator's subscriber certificate and
    // the trust-manager Bundle the hub trusts.
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "certificates.mode=cert-manager",
            "trustDomain=fleet.example.org",
            "certificates.certManager.hubDnsNames[0]=hub.fleet.example.org",
            "certificates.certManager.trustManager.enabled=true",
            "certificates.certManager.trustManager.sources[0].secret.name=fleetwatch-ca",
            "certificates.certManager.trustManager.sources[0].secret.key=ca.crt",
        ],
    )
    .unwrap();
    let hub_cert = find(&cp, "Certificate", "fleetwatch-hub");
    check_certificate(hub_cert, "spiffe://fleet.example.org/hub", "server auth");
    let hub = find(&cp, "StatefulSet", "fleetwatch-hub");
    assert_eq!(hub_cert["spec"]["secretName"].as_str().unwrap(), mounted_source(hub, "/etc/fleetwatch/tls"));
    let lifecycle = find(&cp, "Deployment", "fleetwatch-lifecycle");
    // The name the operator dials is in the hub's certificate, and so is the public one.
    let dialed = arg(lifecycle, "--hub").trim_start_matches("wss://").rsplit_once(':').unwrap().0.to_string();
    let names = hub_cert["spec"]["dnsNames"].as_array().unwrap();
    assert!(names.contains(&json!(dialed)), "{dialed} not in {names:?}");
    assert!(names.contains(&json!("hub.fleet.example.org")), "{names:?}");
    let lc_cert = find(&cp, "Certificate", "fleetwatch-lifecycle");
    check_certificate(lc_cert, "spiffe://fleet.example.org/subscriber/lifecycle", "client auth");
    assert_eq!(lc_cert["spec"]["secretName"].as_str().unwrap(), mounted_source(lifecycle, "/etc/fleetwatch/tls"));
    // The Bundle writes the ConfigMap and key the hub's --client-ca reads.
    let bundle = cp.iter().find(|d| d["kind"] == "Bundle").expect("a trust-manager Bundle");
    assert_eq!(bundle["metadata"]["name"].as_str().unwrap(), mounted_source(hub, "/etc/fleetwatch/trust"));
    let client_ca = arg(hub, "--client-ca");
    assert_eq!(
        client_ca,
        format!("/etc/fleetwatch/trust/{}", bundle["spec"]["target"]["configMap"]["key"].as_str().unwrap())
    );
    assert_eq!(bundle["spec"]["sources"], json!([{"secret": {"name": "fleetwatch-ca", "key": "ca.crt"}}]));
}

#[test]
fn chart_values_that_cannot_work_are_refused() {
    let err = helm_template("fleetwatch", "fleetwatch-system", &["hub.replicas=3"]).unwrap_err();
    assert!(err.contains("hub.replicas > 1 needs hub.bus=nats"), "{err}");
    // The agent chart refuses watch.rules granting Secrets (core group, or *), and says why,
    // unless watch.allowSecrets is set.
    for (groups, resources) in [("", "secrets"), ("*", "secrets"), ("", "*")] {
        let g = format!("watch.rules[0].apiGroups[0]={groups}");
        let r = format!("watch.rules[0].resources[0]={resources}");
        let err = helm_template("fleetwatch-agent", "fleetwatch-agent", &[&g, &r]).unwrap_err();
        assert!(err.contains("grants reading Secrets") && err.contains("watch.allowSecrets: true"), "{err}");
        let ok = helm_template("fleetwatch-agent", "fleetwatch-agent", &[&g, &r, "watch.allowSecrets=true"]).unwrap();
        let role = find(&ok, "ClusterRole", "fleetwatch-agent");
        assert!(role["rules"].as_array().unwrap().iter().any(|r| r["resources"] == json!([resources])), "{role}");
    }
    // Another group's "secrets" (not core Secrets) and the default are fine.
    helm_template(
        "fleetwatch-agent",
        "fleetwatch-agent",
        &["watch.rules[0].apiGroups[0]=example.com", "watch.rules[0].resources[0]=secrets"],
    )
    .unwrap();
    // Several hubs on JetStream: a Deployment with the bus flags and a disruption budget.
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &[
            "hub.bus=nats",
            "hub.replicas=3",
            "hub.nats.urls={nats://n1:4222,nats://n2:4222}",
            "hub.nats.streamReplicas=3",
        ],
    )
    .unwrap();
    let hub = find(&cp, "Deployment", "fleetwatch-hub");
    assert_eq!(hub["spec"]["replicas"], 3);
    assert_eq!(arg(hub, "--bus"), "nats://n1:4222,nats://n2:4222");
    assert_eq!(arg(hub, "--bus-replicas"), "3");
    assert!(
        !pod_spec(hub)["containers"][0]["args"]
            .as_array()
            .unwrap()
            .iter()
            .any(|a| a.as_str().unwrap().starts_with("--data-dir"))
    );
    assert_eq!(find(&cp, "PodDisruptionBudget", "fleetwatch-hub")["spec"]["minAvailable"], 1);
}

#[test]
fn the_service_monitor_scrapes_the_ports_that_serve_metrics() {
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["monitoring.serviceMonitor.enabled=true", "hub.adminToken.createSecret=true"],
    )
    .unwrap();
    let sm = cp.iter().find(|d| d["kind"] == "ServiceMonitor").expect("a ServiceMonitor");
    let selector = &sm["spec"]["selector"];
    let wanted: Vec<&Value> = selector["matchExpressions"][0]["values"].as_array().unwrap().iter().collect();
    // The Services it selects, and on them the ports its endpoints name.
    let selected: Vec<&Value> = cp
        .iter()
        .filter(|d| d["kind"] == "Service")
        .filter(|s| {
            let labels = &s["metadata"]["labels"];
            wanted.contains(&&labels["app.kubernetes.io/component"])
                && selector["matchLabels"].as_object().unwrap().iter().all(|(k, v)| &labels[k] == v)
        })
        .collect();
    assert_eq!(selected.len(), 2, "hub admin and lifecycle metrics Services");
    // Every series gets the job label the absence alerts name, whatever the release's name.
    assert_eq!(sm["spec"]["jobLabel"], "fleetwatch.dev/job");
    let alerts = std::fs::read_to_string(repo().join("deploy/observability/alerts.yaml")).unwrap();
    for service in &selected {
        let job = service["metadata"]["labels"]["fleetwatch.dev/job"].as_str().unwrap_or_default();
        let component = service["metadata"]["labels"]["app.kubernetes.io/component"].as_str().unwrap();
        let want = if component == "hub-admin" { "fleetwatch-hub" } else { "fleetwatch-lifecycle" };
        assert_eq!(job, want, "{}", service["metadata"]["name"]);
        assert!(alerts.contains(&format!("absent(up{{job=\"{job}\"}} == 1)")), "no absence alert for job {job}");
    }
    for endpoint in sm["spec"]["endpoints"].as_array().unwrap() {
        assert_eq!(endpoint["path"], "/metrics");
        let service = selected
            .iter()
            .find(|s| s["spec"]["ports"].as_array().unwrap().iter().any(|p| p["name"] == endpoint["port"]))
            .unwrap_or_else(|| panic!("no selected Service has port {}", endpoint["port"]));
        // …and that port leads to a container port of a workload whose binary serves /metrics there.
        let port = service["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == endpoint["port"]).unwrap();
        let target = &port["targetPort"];
        let serving = workloads(&cp)
            .into_iter()
            .find(|w| pod_spec(w)["containers"][0]["ports"].as_array().unwrap().iter().any(|p| &p["name"] == target));
        let w = serving.unwrap_or_else(|| panic!("no container port {target}"));
        let flag = if w["kind"] == "StatefulSet" { "--admin-listen" } else { "--metrics-listen" };
        let container_port = pod_spec(w)["containers"][0]["ports"]
            .as_array()
            .unwrap()
            .iter()
            .find(|p| &p["name"] == target)
            .unwrap()["containerPort"]
            .clone();
        assert_eq!(arg(w, flag), format!("0.0.0.0:{container_port}"), "{}", key(w));
    }
    // The hub's endpoint sends the token the hub requires: the Secret it mounts for
    // --admin-token-file (here the chart's, createSecret=true; by default yours).
    let hub = find(&cp, "StatefulSet", "fleetwatch-hub");
    let endpoint = sm["spec"]["endpoints"].as_array().unwrap().iter().find(|e| e["port"] == "admin").unwrap();
    assert_eq!(endpoint["authorization"]["type"], "Bearer");
    let secret = endpoint["authorization"]["credentials"]["name"].as_str().unwrap();
    let token_file = arg(hub, "--admin-token-file");
    let (dir, file) = token_file.rsplit_once('/').unwrap();
    assert_eq!(mounted_source(hub, dir), secret);
    assert_eq!(endpoint["authorization"]["credentials"]["key"], file);
    let token = find(&cp, "Secret", secret)["data"][file].as_str().unwrap_or_default().to_string();
    assert!(token.len() >= 32, "the chart's admin token Secret holds a long token: {token:?}");
}

/// The options platform teams set: ServiceMonitor and PrometheusRule namespace, scrape
/// timeout, interval, relabelings and labels; name overrides; labels on every object;
/// extra objects through tpl; view/edit ClusterRoles aggregated for the CRDs.
#[test]
fn platform_options_land_on_the_objects_they_name() {
    let cp = helm_template_values(
        "fleetwatch",
        "fleetwatch-system",
        &json!({
            "fullnameOverride": "fw",
            "commonLabels": {"team": "platform", "cost-centre": "42"},
            "monitoring": {
                "serviceMonitor": {
                    "enabled": true,
                    "namespace": "monitoring",
                    "interval": "15s",
                    "scrapeTimeout": "5s",
                    "labels": {"release": "kube-prometheus-stack"},
                    "relabelings": [{"targetLabel": "team", "replacement": "platform"}],
                    "metricRelabelings": [{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}],
                },
                "prometheusRule": {
                    "enabled": true,
                    "namespace": "monitoring",
                    "labels": {"release": "kube-prometheus-stack"},
                },
                "grafanaDashboard": {"enabled": true},
            },
            "extraObjects": [
                {
                    "apiVersion": "v1",
                    "kind": "ConfigMap",
                    "metadata": {"name": "{{ .Release.Name }}-extra", "namespace": "{{ .Release.Namespace }}"},
                },
                "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: as-text-{{ .Release.Namespace }}\n",
            ],
        }),
    )
    .unwrap();
    // commonLabels on every object (CRDs, RBAC, monitors, the helm test Jobs) and pods; the
    // chart's own labels stay.
    for d in &cp {
        let labels = &d["metadata"]["labels"];
        if d["kind"] == "ConfigMap" && d["metadata"]["name"].as_str().is_some_and(|n| n.contains("extra")) {
            continue; // extraObjects are yours, as written
        }
        if d["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("as-text")) {
            continue;
        }
        assert_eq!(labels["team"], "platform", "{}: {labels}", key(d));
        assert_eq!(labels["cost-centre"], "42", "{}", key(d));
        assert_eq!(labels["app.kubernetes.io/part-of"], "fleetwatch", "{}", key(d));
    }
    for w in workloads(&cp) {
        assert_eq!(w["spec"]["template"]["metadata"]["labels"]["team"], "platform", "{}", key(w));
        assert!(w["spec"]["selector"]["matchLabels"].get("team").is_none(), "{}: not in selectors", key(w));
    }
    // fullnameOverride names every object of the release.
    find(&cp, "StatefulSet", "fw-hub");
    find(&cp, "Deployment", "fw-lifecycle");
    find(&cp, "ClusterRole", "fw-hub");
    assert!(
        !cp.iter().any(|d| d["metadata"]["name"].as_str().is_some_and(|n| n.starts_with("fleetwatch-hub"))
            && d["kind"] != "Secret"),
        "an object kept the default prefix"
    );
    // nameOverride replaces the chart name.
    let renamed = helm_template("fleetwatch", "ns", &["nameOverride=watcher"]).unwrap();
    find(&renamed, "StatefulSet", "fleetwatch-watcher-hub");

    let sm = find(&cp, "ServiceMonitor", "fw");
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(sm["metadata"]["labels"]["release"], "kube-prometheus-stack");
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!(["fleetwatch-system"]), "scrapes the release");
    let endpoints = sm["spec"]["endpoints"].as_array().unwrap();
    assert_eq!(endpoints.len(), 2);
    for e in endpoints {
        assert_eq!(e["interval"], "15s");
        assert_eq!(e["scrapeTimeout"], "5s");
        assert_eq!(e["relabelings"], json!([{"targetLabel": "team", "replacement": "platform"}]));
        assert_eq!(e["metricRelabelings"], json!([{"sourceLabels": ["__name__"], "regex": "go_.*", "action": "drop"}]));
    }
    let rule = find(&cp, "PrometheusRule", "fw");
    assert_eq!(rule["metadata"]["namespace"], "monitoring");
    assert_eq!(rule["metadata"]["labels"]["release"], "kube-prometheus-stack");
    // Without them: the release namespace, no timeout (Prometheus's default), no relabelings.
    let plain = helm_template("fleetwatch", "fleetwatch-system", &["monitoring.serviceMonitor.enabled=true"]).unwrap();
    let sm = plain.iter().find(|d| d["kind"] == "ServiceMonitor").unwrap();
    assert_eq!(sm["metadata"]["namespace"], "fleetwatch-system");
    assert!(
        sm["spec"]["endpoints"][0].get("scrapeTimeout").is_none()
            && sm["spec"]["endpoints"][0].get("relabelings").is_none()
    );

    // extraObjects, maps and strings, through tpl.
    assert_eq!(find(&cp, "ConfigMap", "fleetwatch-extra")["metadata"]["namespace"], "fleetwatch-system");
    find(&cp, "ConfigMap", "as-text-fleetwatch-system");

    // Aggregated roles: view reads every CRD the chart installs, edit writes the namespaced ones.
    let crds: Vec<Value> = std::fs::read_dir(repo().join("deploy/crds"))
        .unwrap()
        .flat_map(|e| documents(&std::fs::read_to_string(e.unwrap().path()).unwrap()))
        .collect();
    let plurals = |namespaced_only: bool| -> Vec<Value> {
        let mut v: Vec<Value> = crds
            .iter()
            .filter(|c| !namespaced_only || c["spec"]["scope"] == "Namespaced")
            .map(|c| c["spec"]["names"]["plural"].clone())
            .collect();
        v.sort_by_key(|p| p.as_str().unwrap_or_default().to_string());
        v
    };
    let view = find(&cp, "ClusterRole", "fw-view");
    for to in ["view", "edit", "admin"] {
        assert_eq!(view["metadata"]["labels"][format!("rbac.authorization.k8s.io/aggregate-to-{to}")], "true");
    }
    assert_eq!(view["rules"][0]["resources"], Value::Array(plurals(false)));
    assert_eq!(view["rules"][0]["verbs"], json!(["get", "list", "watch"]));
    let edit = find(&cp, "ClusterRole", "fw-edit");
    assert!(edit["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view").is_none());
    assert_eq!(edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"], "true");
    let editable = plurals(true);
    assert_eq!(edit["rules"][0]["resources"], Value::Array(editable.clone()));
    assert!(!editable.contains(&json!("subscriberaccesspolicies")), "access grants stay with cluster admins");
    let off = helm_template("fleetwatch", "ns", &["aggregateClusterRoles=false"]).unwrap();
    assert!(!off.iter().any(|d| d["metadata"]["labels"].get("rbac.authorization.k8s.io/aggregate-to-view").is_some()));

    // The agent chart: the same names and labels.
    let agent = helm_template_values(
        "fleetwatch-agent",
        "fleetwatch-agent",
        &json!({
            "fullnameOverride": "agent",
            "commonLabels": {"team": "platform"},
            "extraObjects": ["apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\n"],
        }),
    )
    .unwrap();
    find(&agent, "Deployment", "agent");
    find(&agent, "ConfigMap", "x");
    for d in agent.iter().filter(|d| d["metadata"]["name"] != "x") {
        assert_eq!(d["metadata"]["labels"]["team"], "platform", "{}", key(d));
    }
    // The chart's own label keys cannot be overridden (they would be duplicated).
    for chart in ["fleetwatch", "fleetwatch-agent"] {
        let err =
            helm_template_values(chart, "ns", &json!({"commonLabels": {"app.kubernetes.io/name": "x"}})).unwrap_err();
        assert!(err.contains("commonLabels"), "{err}");
    }
}

/// Whether a label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist)
/// selects `labels`; `{}` selects everything.
fn selects(selector: &Value, labels: &Value) -> bool {
    let by_labels = selector["matchLabels"].as_object().is_none_or(|m| m.iter().all(|(k, v)| &labels[k] == v));
    let by_expressions = selector["matchExpressions"].as_array().is_none_or(|exprs| {
        exprs.iter().all(|e| {
            let value = &labels[e["key"].as_str().unwrap()];
            let values = e["values"].as_array().cloned().unwrap_or_default();
            match e["operator"].as_str().unwrap() {
                "In" => values.contains(value),
                "NotIn" => !values.contains(value),
                "Exists" => !value.is_null(),
                "DoesNotExist" => value.is_null(),
                other => panic!("operator {other}"),
            }
        })
    });
    by_labels && by_expressions
}

/// Whether a NetworkPolicy (of `policy_ns`) admits TCP `port` from a pod with `pod_labels`
/// in namespace `ns` with `ns_labels`: the semantics of ingress rules and their peers.
fn admits(np: &Value, policy_ns: &str, ns: &str, ns_labels: &Value, pod_labels: &Value, port: u16) -> bool {
    np["spec"]["ingress"].as_array().unwrap().iter().any(|rule| {
        let port_ok = rule["ports"].as_array().is_none_or(|ps| ps.iter().any(|p| p["port"] == port));
        let peer_ok = rule["from"].as_array().is_none_or(|peers| {
            peers.iter().any(|peer| match (peer.get("namespaceSelector"), peer.get("podSelector")) {
                (Some(nss), pods) => selects(nss, ns_labels) && pods.is_none_or(|p| selects(p, pod_labels)),
                (None, Some(pods)) => ns == policy_ns && selects(pods, pod_labels),
                (None, None) => false, // ipBlock peers: not a pod
            })
        });
        port_ok && peer_ok
    })
}

/// The agent's metrics can be scraped: a ServiceMonitor or a PodMonitor on the port that
/// serves /metrics (`--health-listen`), and the NetworkPolicy lets the monitoring
/// namespace's scraper in on that port, and nobody else.
#[test]
fn the_agent_renders_monitors_and_its_network_policy_admits_the_scraper() {
    let ns = "fleetwatch-agent";
    let docs = helm_template_values(
        "fleetwatch-agent",
        ns,
        &json!({"metrics": {
            "serviceMonitor": {"enabled": true, "namespace": "monitoring", "interval": "20s", "scrapeTimeout": "5s",
                               "labels": {"release": "prom"}, "metricRelabelings": [{"action": "labeldrop", "regex": "pod"}]},
            "podMonitor": {"enabled": true, "labels": {"release": "prom"},
                           "relabelings": [{"targetLabel": "team", "replacement": "platform"}]},
        }}),
    )
    .unwrap();
    let deployment = find(&docs, "Deployment", "fleetwatch-agent");
    let container = &pod_spec(deployment)["containers"][0];
    let metrics_port = container["ports"].as_array().unwrap().iter().find(|p| p["name"] == "health").unwrap();
    let port = metrics_port["containerPort"].as_u64().unwrap() as u16;
    assert_eq!(arg(deployment, "--health-listen"), format!("0.0.0.0:{port}"), "the port that serves /metrics");

    let sm = find(&docs, "ServiceMonitor", "fleetwatch-agent");
    assert_eq!(sm["metadata"]["namespace"], "monitoring");
    assert_eq!(sm["metadata"]["labels"]["release"], "prom");
    assert_eq!(sm["spec"]["namespaceSelector"]["matchNames"], json!([ns]));
    let selected: Vec<&Value> = docs
        .iter()
        .filter(|d| d["kind"] == "Service" && selects(&sm["spec"]["selector"], &d["metadata"]["labels"]))
        .collect();
    assert_eq!(selected.len(), 1, "{selected:?}");
    let endpoint = &sm["spec"]["endpoints"][0];
    assert_eq!((endpoint["path"].as_str(), endpoint["interval"].as_str()), (Some("/metrics"), Some("20s")));
    assert_eq!(endpoint["scrapeTimeout"], "5s");
    assert_eq!(endpoint["metricRelabelings"], json!([{"action": "labeldrop", "regex": "pod"}]));
    let svc_port = selected[0]["spec"]["ports"].as_array().unwrap().iter().find(|p| p["name"] == endpoint["port"]);
    let svc_port = svc_port.expect("the Service has the endpoint's port");
    assert_eq!(svc_port["targetPort"], "health");
    assert!(selects(&selected[0]["spec"]["selector"], &deployment["spec"]["template"]["metadata"]["labels"]));

    let pm = find(&docs, "PodMonitor", "fleetwatch-agent");
    assert_eq!(pm["metadata"]["namespace"], ns);
    assert!(selects(&pm["spec"]["selector"], &deployment["spec"]["template"]["metadata"]["labels"]));
    let pe = &pm["spec"]["podMetricsEndpoints"][0];
    assert_eq!((pe["port"].as_str(), pe["path"].as_str()), (Some("health"), Some("/metrics")));
    assert_eq!(pe["relabelings"], json!([{"targetLabel": "team", "replacement": "platform"}]));
    // Neither by default.
    let plain = helm_template("fleetwatch-agent", ns, &[]).unwrap();
    assert!(!plain.iter().any(|d| d["kind"] == "ServiceMonitor" || d["kind"] == "PodMonitor"));

    // The NetworkPolicy of the agent's pods admits the scraper on that port.
    let np = docs
        .iter()
        .find(|d| {
            d["kind"] == "NetworkPolicy"
                && selects(&d["spec"]["podSelector"], &deployment["spec"]["template"]["metadata"]["labels"])
        })
        .expect("a NetworkPolicy selecting the agent");
    let monitoring = json!({"kubernetes.io/metadata.name": "monitoring"});
    let prometheus = json!({"app.kubernetes.io/name": "prometheus"});
    assert!(admits(np, ns, "monitoring", &monitoring, &prometheus, port));
    assert!(!admits(np, ns, "monitoring", &monitoring, &prometheus, 7443), "only the metrics port");
    let other = json!({"kubernetes.io/metadata.name": "default"});
    assert!(!admits(np, ns, "default", &other, &prometheus, port), "not from any namespace");
    // Selectors of your own: only the Prometheus pods of namespace `observability`.
    let custom = helm_template_values(
        "fleetwatch-agent",
        ns,
        &json!({"networkPolicy": {
            "metricsNamespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "observability"}},
            "metricsPodSelector": {"matchLabels": {"app.kubernetes.io/name": "prometheus"}},
        }}),
    )
    .unwrap();
    let np =
        custom.iter().find(|d| d["kind"] == "NetworkPolicy" && d["metadata"]["name"] == "fleetwatch-agent").unwrap();
    let observability = json!({"kubernetes.io/metadata.name": "observability"});
    assert!(admits(np, ns, "observability", &observability, &prometheus, port));
    assert!(!admits(np, ns, "observability", &observability, &json!({"app": "debug"}), port));
    assert!(!admits(np, ns, "monitoring", &monitoring, &prometheus, port));
}

#[test]
fn monitoring_objects_carry_the_observability_files_unchanged() {
    let cp = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["monitoring.prometheusRule.enabled=true", "monitoring.grafanaDashboard.enabled=true"],
    )
    .unwrap();
    let rules: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(repo().join("deploy/observability/alerts.yaml")).unwrap())
            .unwrap();
    let rule = cp.iter().find(|d| d["kind"] == "PrometheusRule").expect("a PrometheusRule");
    // No relay enabled: the relays' absence group is left out (it would fire for relays
    // never meant to run); everything else as written.
    let mut without_relays = rules.clone();
    let groups = without_relays["groups"].as_array_mut().unwrap();
    let before = groups.len();
    groups.retain(|g| g["name"] != "fleetwatch-relays-absence");
    assert_eq!(groups.len(), before - 1, "alerts.yaml has a group fleetwatch-relays-absence");
    assert_eq!(rule["spec"], without_relays);
    assert!(!rules["groups"].as_array().unwrap().is_empty());
    // With a relay, all of it.
    let with_relay = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["monitoring.prometheusRule.enabled=true", "relays.klm.enabled=true", "relays.klm.target=http://klm:8082/"],
    )
    .unwrap();
    assert_eq!(with_relay.iter().find(|d| d["kind"] == "PrometheusRule").unwrap()["spec"], rules);
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(repo().join("deploy/observability/dashboard.json")).unwrap())
            .unwrap();
    // The runbook links point where monitoring.runbookBaseUrl says, each to its alert.
    let own = helm_template(
        "fleetwatch",
        "fleetwatch-system",
        &["monitoring.prometheusRule.enabled=true", "monitoring.runbookBaseUrl=https://wiki.example.com/fleetwatch"],
    )
    .unwrap();
    let own = own.iter().find(|d| d["kind"] == "PrometheusRule").unwrap();
    for rule in own["spec"]["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()) {
        let want = format!("https://wiki.example.com/fleetwatch#{}", rule["alert"].as_str().unwrap().to_lowercase());
        assert_eq!(rule["annotations"]["runbook_url"], want.as_str(), "{rule}");
    }
    let cm = find(&cp, "ConfigMap", "fleetwatch-dashboard");
    assert_eq!(cm["metadata"]["labels"]["grafana_dashboard"], "1");
    let shipped: Value = serde_json::from_str(cm["data"]["fleetwatch.json"].as_str().unwrap()).unwrap();
    assert_eq!(shipped, dashboard);
}

/// The CRDs are templates by default (`crds.install`, so `helm upgrade` upgrades them), the
/// same as deploy/crds, kept on uninstall unless `crds.keep=false`; the chart has no crds/
/// directory (Helm would install them twice and refuse its own templates).
#[test]
fn crds_render_as_kept_templates_equal_to_deploy_crds() {
    let crds = |docs: &[Value]| -> Vec<Value> {
        let mut v: Vec<Value> = docs.iter().filter(|d| d["kind"] == "CustomResourceDefinition").cloned().collect();
        v.sort_by_key(|d| d["metadata"]["name"].as_str().unwrap_or_default().to_string());
        v
    };
    assert!(
        !repo().join("deploy/helm/fleetwatch/crds").exists(),
        "the chart's crds/ would be installed besides the templates (an ownership conflict)"
    );
    let templated = crds(&helm_template("fleetwatch", "fleetwatch-system", &[]).unwrap());
    let files: Vec<Value> = {
        let mut v: Vec<Value> = std::fs::read_dir(repo().join("deploy/crds"))
            .unwrap()
            .flat_map(|e| documents(&std::fs::read_to_string(e.unwrap().path()).unwrap()))
            .collect();
        v.sort_by_key(|d| d["metadata"]["name"].as_str().unwrap_or_default().to_string());
        v
    };
    assert_eq!(templated.len(), files.len());
    for (t, f) in templated.iter().zip(&files) {
        assert_eq!(t["metadata"]["name"], f["metadata"]["name"]);
        // Helm's toYaml writes the float 0.0 as 0: compare numbers by value.
        fn numbers_as_f64(v: &Value) -> Value {
            match v {
                Value::Number(n) => n.as_f64().map_or(v.clone(), Value::from),
                Value::Array(a) => Value::Array(a.iter().map(numbers_as_f64).collect()),
                Value::Object(o) => Value::Object(o.iter().map(|(k, x)| (k.clone(), numbers_as_f64(x))).collect()),
                other => other.clone(),
            }
        }
        let name = &f["metadata"]["name"];
        assert_eq!(
            numbers_as_f64(&t["spec"]),
            numbers_as_f64(&f["spec"]),
            "{name}: the template differs from deploy/crds"
        );
        assert_eq!(t["metadata"]["annotations"]["helm.sh/resource-policy"], "keep");
    }
    let unkept = crds(&helm_template("fleetwatch", "fleetwatch-system", &["crds.keep=false"]).unwrap());
    assert_eq!(unkept.len(), files.len());
    assert!(unkept.iter().all(|d| d["metadata"]["annotations"].get("helm.sh/resource-policy").is_none()));
    // crds.install=false: none (you apply deploy/crds yourself).
    assert!(crds(&helm_template("fleetwatch", "fleetwatch-system", &["crds.install=false"]).unwrap()).is_empty());
}

/// Runs helm with its own config/cache/data dirs under `home`: (success, stdout, stderr).
fn helm_in(home: &Path, kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("helm")
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_DATA_HOME", home.join("data"))
        .output()
        .expect("helm on PATH (bash scripts/helm.sh installs it)");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// `helm upgrade` from the previous chart version (CRDs in crds/, no SubscriberAccessPolicy)
/// to this one, with real helm against the sim: Helm refuses to adopt the CRDs crds/ put
/// there until they carry its ownership metadata (the commands docs/upgrade.md gives); then
/// the upgrade adds the new CRD, objects of it can be created, and an uninstall keeps every
/// CRD (and so every object of their kinds).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_from_the_previous_chart_adds_the_new_crd() {
    let dir = tempfile::tempdir().unwrap();
    // The previous chart, as released (tests/fixtures/previous-release/chart: its crds/ and
    // files/ were symlinks into deploy/, copied as files).
    let old_chart = repo().join("tests/fixtures/previous-release/chart");
    assert!(old_chart.join("crds/watchconfigs.operator.fleetwatch.dev.yaml").exists());
    assert!(!old_chart.join("crds/subscriberaccesspolicies.operator.fleetwatch.dev.yaml").exists());

    let cluster = sim("helm-upgrade", false).await;
    let kc = dir.path().join("sim.kubeconfig");
    cluster.write_kubeconfig(&kc).unwrap();
    let home = dir.path().join("helm");
    let new_chart = repo().join("deploy/helm/fleetwatch");
    let ns = "fleetwatch-system";
    let crd_names = |kc: &Path| -> Vec<String> {
        let got: Value = serde_json::from_str(&kubectl(kc, &["get", "crd", "-o", "json"], None)).unwrap();
        let mut v: Vec<String> = got["items"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["metadata"]["name"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    };
    let sap = "subscriberaccesspolicies.operator.fleetwatch.dev".to_string();

    let (ok, out, err) =
        helm_in(&home, &kc, &["install", "fw", old_chart.to_str().unwrap(), "-n", ns, "--create-namespace"]);
    assert!(ok, "helm install (previous chart): {out}{err}");
    let before = crd_names(&kc);
    assert_eq!(before.len(), 6, "{before:?}");
    assert!(!before.contains(&sap));

    // Helm does not adopt objects it did not create: the CRDs from crds/ lack its metadata.
    let upgrade = ["upgrade", "fw", new_chart.to_str().unwrap(), "-n", ns];
    let (ok, out, err) = helm_in(&home, &kc, &upgrade);
    assert!(!ok, "{out}");
    assert!(err.contains("invalid ownership metadata") && err.contains("meta.helm.sh/release-name"), "{err}");
    assert!(!crd_names(&kc).contains(&sap));

    // docs/upgrade.md: label and annotate them as the release's, then upgrade.
    for crd in &before {
        let c = format!("crd/{crd}");
        kubectl(&kc, &["label", &c, "app.kubernetes.io/managed-by=Helm", "--overwrite"], None);
        kubectl(
            &kc,
            &["annotate", &c, "meta.helm.sh/release-name=fw", &format!("meta.helm.sh/release-namespace={ns}")],
            None,
        );
    }
    let (ok, out, err) = helm_in(&home, &kc, &upgrade);
    assert!(ok, "helm upgrade: {out}{err}");
    // The admin token the previous chart made (createSecret was its default) is kept
    // (resource-policy keep) and is the existing Secret the new chart's hub mounts.
    kubectl(&kc, &["-n", ns, "get", "secret", "fleetwatch-hub-admin-token"], None);
    let after = crd_names(&kc);
    assert_eq!(after.len(), 7, "{after:?}");
    assert!(after.contains(&sap), "{after:?}");
    kubectl(&kc, &["wait", "--for=condition=Established", &format!("crd/{sap}"), "--timeout=60s"], None);
    let policy = json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1",
        "kind": "SubscriberAccessPolicy",
        "metadata": {"name": "ops", "namespace": ns},
        "spec": {"subscribers": [{"name": "ops", "clusters": ["*"]}]}
    });
    kubectl(&kc, &["apply", "-f", "-"], Some(&policy.to_string()));
    kubectl(&kc, &["get", "subscriberaccesspolicy", "ops", "-n", ns], None);
    // Another upgrade is a no-op for the CRDs; an uninstall keeps them (resource-policy keep).
    let (ok, out, err) = helm_in(&home, &kc, &upgrade);
    assert!(ok, "second helm upgrade: {out}{err}");
    let (ok, out, err) = helm_in(&home, &kc, &["uninstall", "fw", "-n", ns]);
    assert!(ok, "helm uninstall: {out}{err}");
    assert_eq!(crd_names(&kc), after);
    kubectl(&kc, &["get", "subscriberaccesspolicy", "ops", "-n", ns], None);
}

/// The agent chart cannot work without the hub's address: it refuses to render without
/// one, naming `hub.urls` and how to set it, and refuses the former default placeholder
/// (which `helm upgrade --reuse-values` would carry over).
#[test]
fn the_agent_chart_refuses_to_render_without_the_hub_url() {
    let template = |set: &[&str]| {
        let mut cmd = std::process::Command::new("helm");
        cmd.args(["template", "fleetwatch-agent"]).arg(repo().join("deploy/helm/fleetwatch-agent"));
        for s in set {
            cmd.args(["--set", s]);
        }
        let out = cmd.output().expect("helm on PATH");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (ok, out, err) = template(&[]);
    assert!(!ok, "rendered without hub.urls: {out}");
    assert!(err.contains("hub.urls: the hub's wss address(es) the agent dials are required"), "{err}");
    assert!(err.contains("--set 'hub.urls={wss://"), "says how to set it: {err}");
    let (ok, out, err) = template(&["hub.urls={wss://fleetwatch-hub.example.com:443}"]);
    assert!(!ok, "rendered the placeholder: {out}");
    assert!(err.contains("former placeholder"), "{err}");
    let (ok, out, err) = template(&["hub.urls={wss://hub-a.fleet.example.org:443,wss://hub-b.fleet.example.org:443}"]);
    assert!(ok, "{err}");
    let docs = documents(&out);
    let deployment = find(&docs, "Deployment", "fleetwatch-agent");
    assert_eq!(arg(deployment, "--hub"), "wss://hub-a.fleet.example.org:443,wss://hub-b.fleet.example.org:443");
}

/// The hub's admin token is a Secret you create (default), so it is the same whoever renders
/// the chart: nothing random is rendered, and `helm install` against a cluster without it
/// refuses, naming the value and the command; `createSecret=true` is random per `helm
/// template` (why it is not the default) but kept across `helm upgrade` (lookup).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_token_is_stable_under_gitops_and_required_at_install() {
    let ns = "fleetwatch-system";
    let token_secret = |docs: &[Value]| -> Option<String> {
        docs.iter()
            .find(|d| d["kind"] == "Secret" && d["metadata"]["name"] == "fleetwatch-hub-admin-token")
            .map(|s| s["data"]["token"].as_str().unwrap_or_default().to_string())
    };
    // Defaults: two renders (GitOps) are the same and carry no token; the hub mounts yours.
    let a = helm_template("fleetwatch", ns, &[]).unwrap();
    let b = helm_template("fleetwatch", ns, &[]).unwrap();
    assert_eq!(a, b, "two renders differ");
    assert_eq!(token_secret(&a), None);
    let hub = find(&a, "StatefulSet", "fleetwatch-hub");
    let (dir, _) = arg(hub, "--admin-token-file").rsplit_once('/').unwrap();
    assert_eq!(mounted_source(hub, dir), "fleetwatch-hub-admin-token");
    // createSecret=true under helm template: a new token each render.
    let one = token_secret(&helm_template("fleetwatch", ns, &["hub.adminToken.createSecret=true"]).unwrap());
    let two = token_secret(&helm_template("fleetwatch", ns, &["hub.adminToken.createSecret=true"]).unwrap());
    assert!(one.is_some() && one != two, "createSecret renders a random token each time: {one:?} {two:?}");

    // Real helm against the sim: install refuses until the Secret exists.
    let dir = tempfile::tempdir().unwrap();
    let home = dir.path().join("helm");
    let chart = repo().join("deploy/helm/fleetwatch");
    let cluster = sim("admin-token", false).await;
    let kc = dir.path().join("sim.kubeconfig");
    cluster.write_kubeconfig(&kc).unwrap();
    kubectl(&kc, &["create", "namespace", ns], None);
    let install = ["install", "fw", chart.to_str().unwrap(), "-n", ns];
    let (ok, out, err) = helm_in(&home, &kc, &install);
    assert!(!ok, "installed without the admin token Secret: {out}");
    assert!(
        err.contains("hub.adminToken.secretName: Secret fleetwatch-system/fleetwatch-hub-admin-token")
            && err.contains("kubectl -n fleetwatch-system create secret generic fleetwatch-hub-admin-token"),
        "{err}"
    );
    let token = "a-token-from-the-platform-secret-store-0123456789";
    kubectl(
        &kc,
        &[
            "-n",
            ns,
            "create",
            "secret",
            "generic",
            "fleetwatch-hub-admin-token",
            &format!("--from-literal=token={token}"),
        ],
        None,
    );
    let (ok, out, err) = helm_in(&home, &kc, &install);
    assert!(ok, "helm install: {out}{err}");
    let (ok, out, err) = helm_in(&home, &kc, &["upgrade", "fw", chart.to_str().unwrap(), "-n", ns]);
    assert!(ok, "helm upgrade: {out}{err}");
    let read = |kc: &Path| {
        let b64 = kubectl(
            kc,
            &["-n", ns, "get", "secret", "fleetwatch-hub-admin-token", "-o", "jsonpath={.data.token}"],
            None,
        );
        String::from_utf8(base64::Engine::decode(&base64::engine::general_purpose::STANDARD, b64.trim()).unwrap())
            .unwrap()
    };
    assert_eq!(read(&kc), token, "the chart left your token alone");

    // createSecret=true with helm install/upgrade: made once, kept by the upgrade.
    let other = sim("admin-token-created", false).await;
    let kc2 = dir.path().join("other.kubeconfig");
    other.write_kubeconfig(&kc2).unwrap();
    let set = ["--set", "hub.adminToken.createSecret=true", "--create-namespace"];
    let (ok, out, err) = helm_in(&home, &kc2, &[&install[..], &set[..]].concat());
    assert!(ok, "helm install createSecret=true: {out}{err}");
    let made = read(&kc2);
    assert!(made.len() >= 32, "{made:?}");
    let (ok, out, err) = helm_in(
        &home,
        &kc2,
        &["upgrade", "fw", chart.to_str().unwrap(), "-n", ns, "--set", "hub.adminToken.createSecret=true"],
    );
    assert!(ok, "helm upgrade: {out}{err}");
    assert_eq!(read(&kc2), made, "helm upgrade kept the token (lookup)");
}

/// values.schema.json refuses values that cannot work at render time, naming the value.
#[test]
fn chart_schemas_refuse_bad_values_naming_them() {
    let refused = |chart: &str, set: &[&str], says: &[&str]| {
        let err = helm_template(chart, "ns", set).expect_err(&format!("{chart} rendered with {set:?}"));
        for s in says {
            assert!(err.contains(s), "{chart} {set:?}: {s:?} not in {err}");
        }
    };
    refused("fleetwatch", &["hub.replicas=foo"], &["hub.replicas", "Expected: integer"]);
    refused("fleetwatch", &["hub.replicas=0"], &["hub.replicas"]);
    refused("fleetwatch", &["hub.bus=redis"], &["hub.bus", "embedded", "nats"]);
    refused("fleetwatch", &["certificates.mode=vault"], &["certificates.mode"]);
    // trust-manager on with no source would render an empty Bundle.
    refused(
        "fleetwatch",
        &["certificates.mode=cert-manager", "certificates.certManager.trustManager.enabled=true"],
        &["certificates.certManager.trustManager.sources", "at least 1"],
    );
    refused("fleetwatch", &["image.digest=latest"], &["image.digest"]);
    refused("fleetwatch", &["hub.serviceAccount.create=false"], &["hub.serviceAccount.name"]);
    refused("fleetwatch", &["hubs.replicas=3"], &["hubs"]);
    refused("fleetwatch", &["hub.extraEnv[0].value=x"], &["hub.extraEnv.0", "name"]);
    refused(
        "fleetwatch",
        &["lifecycle.extraEnv[0].name=N", "lifecycle.extraEnv[0].value=1"],
        &["lifecycle.extraEnv.0.value", "string"],
    );
    // A runbook base with an anchor of its own would make every runbook_url point nowhere.
    refused("fleetwatch", &["monitoring.runbookBaseUrl=https://wiki/runbooks#top"], &["monitoring.runbookBaseUrl"]);
    refused("fleetwatch", &["monitoring.runbookBaseUrl=runbooks.md"], &["monitoring.runbookBaseUrl"]);
    refused("fleetwatch-agent", &["hub.urls={https://hub:443}"], &["hub.urls.0"]);
    refused("fleetwatch-agent", &["outbox.capacity=many"], &["outbox.capacity"]);
    // What the schema lets through still renders.
    helm_template("fleetwatch", "ns", &["certificates.mode=cert-manager"]).unwrap();
    helm_template("fleetwatch-agent", "ns", &["certificate.mode=cert-manager", "clusterId=c1"]).unwrap();
}

/// The options platform teams expect of a chart: ServiceAccounts of their own (workload
/// identity), extra env / volumes / labels, priority class, digest-pinned image; replicated
/// workloads spread over nodes and zones by default; the hub StatefulSet governed by a
/// headless Service; `helm test` Jobs.
#[test]
fn chart_pod_options_render_into_every_workload() {
    let default = helm_template("fleetwatch", "ns", &[]).unwrap();
    // The StatefulSet's serviceName is a headless Service selecting the hub pods.
    let sts = find(&default, "StatefulSet", "fleetwatch-hub");
    let governing = sts["spec"]["serviceName"].as_str().unwrap();
    let svc = find(&default, "Service", governing);
    assert_eq!(svc["spec"]["clusterIP"], "None");
    assert_eq!(svc["spec"]["selector"], sts["spec"]["selector"]["matchLabels"]);
    // Two operator replicas: soft anti-affinity and zone spread on their own labels; one hub: none.
    let lc = pod_spec(find(&default, "Deployment", "fleetwatch-lifecycle"));
    let term =
        &lc["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"][0]["podAffinityTerm"];
    assert_eq!(term["topologyKey"], "kubernetes.io/hostname");
    assert_eq!(term["labelSelector"]["matchLabels"]["app.kubernetes.io/name"], "fleetwatch-lifecycle");
    assert_eq!(lc["topologySpreadConstraints"][0]["topologyKey"], "topology.kubernetes.io/zone");
    assert_eq!(lc["topologySpreadConstraints"][0]["whenUnsatisfiable"], "ScheduleAnyway");
    assert!(pod_spec(sts)["affinity"].is_null() && pod_spec(sts)["topologySpreadConstraints"].is_null());
    // Three NATS hubs spread too; an affinity of one's own replaces the default.
    let nats =
        helm_template("fleetwatch", "ns", &["hub.bus=nats", "hub.replicas=3", "lifecycle.affinity.nodeAffinity.x=y"])
            .unwrap();
    assert!(!pod_spec(find(&nats, "Deployment", "fleetwatch-hub"))["affinity"]["podAntiAffinity"].is_null());
    assert_eq!(
        pod_spec(find(&nats, "Deployment", "fleetwatch-lifecycle"))["affinity"],
        json!({"nodeAffinity": {"x": "y"}})
    );

    // Every option, on both workloads of the control-plane chart and the agent's.
    let digest = format!("sha256:{}", "a".repeat(64));
    for (chart, workloads) in [
        (
            "fleetwatch",
            vec![("hub", "StatefulSet", "fleetwatch-hub"), ("lifecycle", "Deployment", "fleetwatch-lifecycle")],
        ),
        ("fleetwatch-agent", vec![("", "Deployment", "fleetwatch-agent")]),
    ] {
        let mut set = vec![format!("image.digest={digest}")];
        for (prefix, _, _) in &workloads {
            let p = if prefix.is_empty() { String::new() } else { format!("{prefix}.") };
            set.extend([
                format!("{p}serviceAccount.create=false"),
                format!("{p}serviceAccount.name=wi-{}", if prefix.is_empty() { "agent" } else { prefix }),
                format!("{p}extraEnv[0].name=EXTRA"),
                format!("{p}extraEnv[0].value=on"),
                format!("{p}extraVolumes[0].name=extra"),
                format!("{p}extraVolumes[0].emptyDir.medium=Memory"),
                format!("{p}extraVolumeMounts[0].name=extra"),
                format!("{p}extraVolumeMounts[0].mountPath=/extra"),
                format!("{p}podLabels.team=platform"),
                format!("{p}podAnnotations.note=x"),
                format!("{p}priorityClassName=critical"),
            ]);
        }
        let set: Vec<&str> = set.iter().map(String::as_str).collect();
        let docs = helm_template(chart, "ns", &set).unwrap();
        assert!(
            !docs.iter().any(|d| d["kind"] == "ServiceAccount"),
            "{chart}: serviceAccount.create=false still renders one"
        );
        for (prefix, kind, name) in workloads {
            let w = find(&docs, kind, name);
            let spec = pod_spec(w);
            let sa = format!("wi-{}", if prefix.is_empty() { "agent" } else { prefix });
            assert_eq!(spec["serviceAccountName"], sa.as_str(), "{name}");
            // RBAC is bound to the ServiceAccount in use.
            assert!(
                docs.iter()
                    .filter(|d| d["kind"].as_str().is_some_and(|k| k.ends_with("Binding")))
                    .any(|b| b["subjects"][0]["name"] == sa.as_str()),
                "{name}: no binding for {sa}"
            );
            let c = &spec["containers"][0];
            assert_eq!(c["image"], format!("ghcr.io/fleetwatch/fleetwatch@{digest}"), "{name}");
            assert!(
                c["env"].as_array().unwrap().iter().any(|e| e["name"] == "EXTRA" && e["value"] == "on"),
                "{name}: {}",
                c["env"]
            );
            assert!(c["volumeMounts"].as_array().unwrap().iter().any(|m| m["mountPath"] == "/extra"), "{name}");
            assert!(
                spec["volumes"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|v| v["name"] == "extra" && v["emptyDir"]["medium"] == "Memory"),
                "{name}"
            );
            assert_eq!(w["spec"]["template"]["metadata"]["labels"]["team"], "platform", "{name}");
            assert_eq!(w["spec"]["template"]["metadata"]["annotations"]["note"], "x", "{name}");
            assert_eq!(spec["priorityClassName"], "critical", "{name}");
            // The selector is untouched by podLabels (a Deployment's selector is immutable).
            assert!(w["spec"]["selector"]["matchLabels"]["team"].is_null());
        }
    }
    let wi = helm_template(
        "fleetwatch",
        "ns",
        &["hub.serviceAccount.annotations.iam\\.gke\\.io/gcp-service-account=hub@p.iam"],
    )
    .unwrap();
    assert_eq!(
        find(&wi, "ServiceAccount", "fleetwatch-hub")["metadata"]["annotations"]["iam.gke.io/gcp-service-account"],
        "hub@p.iam"
    );
}

/// `helm test` Jobs (hooks, not in the plain manifests) ask /readyz of what the release runs,
/// through Services that exist, and the NetworkPolicies let them in.
#[test]
fn helm_test_jobs_ask_readyz_through_rendered_services() {
    for (chart, ports) in [("fleetwatch", vec![9090, 9091]), ("fleetwatch-agent", vec![9091])] {
        let docs = helm_template(chart, "ns", &[]).unwrap();
        let job = docs.iter().find(|d| d["kind"] == "Job").unwrap_or_else(|| panic!("{chart}: no test Job"));
        assert_eq!(job["metadata"]["annotations"]["helm.sh/hook"], "test");
        let args: Vec<&str> =
            pod_spec(job)["containers"][0]["args"].as_array().unwrap().iter().map(|a| a.as_str().unwrap()).collect();
        assert!(args.contains(&"--fail"), "{args:?}");
        let urls: Vec<&&str> = args.iter().filter(|a| a.starts_with("http://")).collect();
        assert_eq!(urls.len(), ports.len(), "{chart}: {urls:?}");
        for (url, port) in urls.iter().zip(&ports) {
            let host = url.trim_start_matches("http://").split(['.', ':']).next().unwrap();
            let svc = find(&docs, "Service", host);
            assert!(svc["spec"]["ports"].as_array().unwrap().iter().any(|p| p["port"] == *port), "{chart}: {url}");
            assert!(url.ends_with(&format!(":{port}/readyz")), "{url}");
        }
        let labels = &job["spec"]["template"]["metadata"]["labels"];
        assert_eq!(labels["app.kubernetes.io/component"], "helm-test");
        // Each port the Job asks is open to it in the target's NetworkPolicy.
        for port in &ports {
            let open = docs.iter().filter(|d| d["kind"] == "NetworkPolicy").any(|np| {
                np["spec"]["ingress"].as_array().into_iter().flatten().any(|rule| {
                    rule["ports"].as_array().into_iter().flatten().any(|p| p["port"] == *port)
                        && rule["from"].as_array().into_iter().flatten().any(|f| {
                            f["podSelector"] == json!({})
                                || f["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test"
                        })
                })
            });
            assert!(open, "{chart}: no NetworkPolicy lets the test Job reach port {port}");
        }
        // The Job's own pod is under a NetworkPolicy (a test hook like it): no ingress, out
        // only DNS and the ports it asks.
        let own = docs
            .iter()
            .filter(|d| d["kind"] == "NetworkPolicy")
            .find(|np| np["spec"]["podSelector"]["matchLabels"]["app.kubernetes.io/component"] == "helm-test")
            .unwrap_or_else(|| panic!("{chart}: no NetworkPolicy selects the test Job's pod"));
        assert_eq!(own["metadata"]["annotations"]["helm.sh/hook"], "test");
        assert_eq!(own["spec"]["policyTypes"], json!(["Ingress", "Egress"]));
        assert!(own["spec"]["ingress"].is_null(), "{chart}: ingress to the test Job");
        let egress_ports: Vec<u64> = own["spec"]["egress"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|r| r["ports"].as_array().unwrap().iter().map(|p| p["port"].as_u64().unwrap()))
            .collect();
        for port in ports.iter().chain(&[53]) {
            assert!(egress_ports.contains(&(*port as u64)), "{chart}: the test Job may not reach port {port}");
        }
        assert!(job["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"].is_string());
        // The plain manifests leave the Jobs out.
        let plain = manifest(if chart == "fleetwatch" { "control-plane.yaml" } else { "agent.yaml" });
        assert!(!plain.iter().any(|d| d["kind"] == "Job"), "{chart}: a test Job in deploy/manifests");
    }
}
