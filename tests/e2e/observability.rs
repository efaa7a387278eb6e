//! `deploy/observability/`: every metric the Grafana dashboard and the Prometheus alert
//! rules use is served by the running components (a real hub and lifecycle operator,
//! scraped over HTTP), so a renamed metric breaks this test instead of a dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::*;

fn block<F: std::future::Future>(f: F) -> F::Output {
    tokio::task::block_in_place(|| tokio::runtime::Handle::current().block_on(f))
}

const NS: &str = "kcp";

/// The families a `/metrics` answer declares (`# TYPE name kind`) and the sample names it
/// carries.
#[derive(Debug, Default)]
struct Exposition {
    families: BTreeMap<String, String>,
    samples: BTreeSet<String>,
}

impl Exposition {
    fn parse(text: &str) -> Self {
        let mut e = Exposition::default();
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let mut parts = rest.split_whitespace();
                if let (Some(name), Some(kind)) = (parts.next(), parts.next()) {
                    e.families.insert(name.to_string(), kind.to_string());
                }
            } else if !line.starts_with('#') && !line.is_empty() {
                let name: String =
                    line.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
                e.samples.insert(name);
            }
        }
        e
    }

    /// Whether a query's metric name is served: as a sample now, or as the sample name its
    /// declared family produces (a labelled family may have no samples yet).
    fn serves(&self, name: &str) -> bool {
        if self.samples.contains(name) {
            return true;
        }
        self.families.iter().any(|(family, kind)| match kind.as_str() {
            "counter" => name == format!("{family}_total"),
            "histogram" => ["_bucket", "_sum", "_count"].iter().any(|s| name == format!("{family}{s}")),
            _ => name == family,
        })
    }

    /// The value of one sample line (`name{labels}` exactly as served).
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
    }
}

/// Every `fleetwatch_*` metric name in a PromQL expression.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut rest = expr;
    while let Some(i) = rest.find("fleetwatch_") {
        // Only at the start of an identifier.
        let before = rest[..i].chars().last();
        let name: String =
            rest[i..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':').collect();
        if !before.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_') {
            out.insert(name.clone());
        }
        rest = &rest[i + name.len()..];
    }
    out
}

/// Every `expr` of the dashboard's panels (rows included), with the panel's title.
fn dashboard_exprs(dashboard: &Value) -> Vec<(String, String)> {
    fn walk(panels: &Value, out: &mut Vec<(String, String)>) {
        for p in panels.as_array().into_iter().flatten() {
            let title = p["title"].as_str().unwrap_or("?").to_string();
            for t in p["targets"].as_array().into_iter().flatten() {
                if let Some(e) = t["expr"].as_str() {
                    out.push((title.clone(), e.to_string()));
                }
            }
            walk(&p["panels"], out);
        }
    }
    let mut out = Vec::new();
    walk(&dashboard["panels"], &mut out);
    out
}

fn observability_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/observability")
}

#[test]
fn metric_names_are_found_in_promql() {
    let names = metric_names(
        "time() - max by (runtime_cluster) (fleetwatch_hub_cluster_last_seen_timestamp_seconds{job=~\"x\"}) > 300 and \
         rate(fleetwatch_lifecycle_reconciles_total[5m]) and my_fleetwatch_other",
    );
    let want: BTreeSet<String> =
        ["fleetwatch_hub_cluster_last_seen_timestamp_seconds", "fleetwatch_lifecycle_reconciles_total"]
            .iter()
            .map(|s| s.to_string())
            .collect();
    assert_eq!(names, want);
    let e = Exposition::parse(
        "# TYPE a counter\na_total 1\n# TYPE h histogram\n# TYPE g gauge\ng{x=\"1\"} 2\n# TYPE empty gauge\n# EOF\n",
    );
    assert!(e.serves("a_total") && e.serves("h_bucket") && e.serves("g") && e.serves("empty"));
    assert!(!e.serves("a") && !e.serves("h") && !e.serves("g_total") && !e.serves("missing"));
}

/// The OpenMetrics content type every `/metrics` endpoint answers with.
const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The text format 0.0.4, the one `promtool check metrics` reads.
const TEXT_FORMAT: &str = "text/plain; version=0.0.4; charset=utf-8";
/// What Prometheus (2.x, 3.x) sends by default.
const PROMETHEUS_ACCEPT: &str = "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;\
                                 q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1";

/// One `/metrics` answer to a request with `accept` as its `Accept` header: its
/// `Content-Type` and body.
async fn scrape(port: u16, accept: Option<&str>) -> (String, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await.expect("connect to a /metrics endpoint");
    let accept = accept.map(|a| format!("Accept: {a}\r\n")).unwrap_or_default();
    s.write_all(format!("GET /metrics HTTP/1.0\r\nHost: x\r\n{accept}\r\n").as_bytes()).await.unwrap();
    let mut buf = String::new();
    s.read_to_string(&mut buf).await.unwrap();
    let (head, body) = buf.split_once("\r\n\r\n").unwrap_or_else(|| panic!("not an HTTP answer: {buf}"));
    let ct = head
        .lines()
        .find_map(|l| l.split_once(':').filter(|(k, _)| k.eq_ignore_ascii_case("content-type")).map(|(_, v)| v.trim()))
        .unwrap_or_default();
    (ct.to_string(), body.to_string())
}

/// What `promtool check metrics` says about an exposition: `None` when it has no
/// complaint (exit 0, nothing printed).
fn promtool_check_metrics(text: &str) -> Option<String> {
    use std::io::Write as _;
    let mut child = std::process::Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("promtool (Debian package prometheus; scripts/test.sh installs it)");
    child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (!out.status.success() || !said.trim().is_empty()).then(|| format!("{}: {said}", out.status))
}

#[test]
fn promtool_check_metrics_complains_about_bad_expositions() {
    // The check itself must be able to fail: a counter without `_total`, and no HELP.
    assert!(promtool_check_metrics("# TYPE requests counter\nrequests 1\n").is_some());
    assert!(promtool_check_metrics("# HELP ok_total Fine.\n# TYPE ok_total counter\nok_total 1\n").is_none());
}

/// The alert rules: (name, expr, for) of every rule, after checking each is complete.
fn alert_rules() -> Vec<(String, String)> {
    let text = std::fs::read_to_string(observability_dir().join("alerts.yaml")).unwrap();
    let rules: Value = serde_saphyr::from_str(&text).expect("alerts.yaml is YAML");
    let mut out = Vec::new();
    for group in rules["groups"].as_array().expect("groups") {
        assert!(group["name"].is_string(), "group without a name: {group}");
        for rule in group["rules"].as_array().expect("rules") {
            let name = rule["alert"].as_str().expect("every rule is an alert with a name").to_string();
            let expr = rule["expr"].as_str().unwrap_or_else(|| panic!("{name}: no expr")).to_string();
            assert!(rule["labels"]["severity"].is_string(), "{name}: no severity label");
            assert!(rule["annotations"]["summary"].is_string(), "{name}: no summary");
            assert!(rule["for"].is_string(), "{name}: no `for`");
            assert!(rule["annotations"]["runbook_url"].is_string(), "{name}: no runbook_url");
            out.push((name, expr));
        }
    }
    out
}

/// Where the alerts' `runbook_url` annotations point (the chart's default
/// `monitoring.runbookBaseUrl`): docs/runbooks.md on the project's home (Chart.yaml).
const RUNBOOKS: &str = "https://github.com/fleetwatch/fleetwatch/blob/main/docs/runbooks.md";

/// The anchors GitHub gives a Markdown file's headings: lower case, spaces to `-`, other
/// punctuation dropped.
fn markdown_anchors(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter_map(|l| l.trim_start_matches('#').strip_prefix(' ').filter(|_| l.starts_with('#')))
        .map(|h| {
            h.trim()
                .to_lowercase()
                .chars()
                .filter_map(|c| match c {
                    ' ' => Some('-'),
                    c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
                    _ => None,
                })
                .collect()
        })
        .collect()
}

#[test]
fn every_alert_has_a_runbook_that_exists() {
    let runbooks = std::fs::read_to_string(observability_dir().join("../../docs/runbooks.md")).unwrap();
    let anchors = markdown_anchors(&runbooks);
    assert!(anchors.contains("fleetwatchclusternotseen") && !anchors.contains("nothing-like-it"), "{anchors:?}");
    let text = std::fs::read_to_string(observability_dir().join("alerts.yaml")).unwrap();
    let rules: Value = serde_saphyr::from_str(&text).unwrap();
    let mut missing = Vec::new();
    let mut alerts = BTreeSet::new();
    for rule in rules["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()) {
        let name = rule["alert"].as_str().unwrap();
        alerts.insert(name.to_lowercase());
        let url = rule["annotations"]["runbook_url"].as_str().unwrap_or_default();
        match url.strip_prefix(RUNBOOKS).and_then(|u| u.strip_prefix('#')) {
            Some(anchor) if anchor == name.to_lowercase() && anchors.contains(anchor) => {}
            _ => missing.push(format!("{name}: runbook_url {url:?}")),
        }
    }
    assert!(missing.is_empty(), "alerts without a section of docs/runbooks.md of their name:\n{}", missing.join("\n"));
    // And no section for an alert that is gone.
    let stale: Vec<_> = anchors.iter().filter(|a| a.starts_with("fleetwatch") && !alerts.contains(*a)).collect();
    assert!(stale.is_empty(), "docs/runbooks.md sections of no alert: {stale:?}");
}

/// Whether PromQL (or a dashboard legend) uses a label named `cluster`: the
/// external label multi-cluster Prometheus setups (Thanos, Mimir) put on every series, which
/// fleetwatch leaves to them (decision 0039; its label is `runtime_cluster`).
fn uses_cluster_label(text: &str) -> bool {
    text.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).any(|token| token == "cluster")
}

#[test]
fn no_query_uses_the_cluster_label_of_multi_cluster_prometheus() {
    assert!(uses_cluster_label("max by (cluster) (x)") && uses_cluster_label("x{cluster=\"a\"}"));
    assert!(uses_cluster_label("{{cluster}}") && uses_cluster_label("sum by (cluster, phase) (x)"));
    assert!(!uses_cluster_label("max by (runtime_cluster) (fleetwatch_hub_cluster_watches)"));
    assert!(!uses_cluster_label("{{runtime_cluster}}"));
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(observability_dir().join("dashboard.json")).unwrap()).unwrap();
    let mut found = Vec::new();
    fn walk(v: &Value, path: &str, found: &mut Vec<String>) {
        match v {
            Value::Object(o) => o.iter().for_each(|(k, x)| walk(x, &format!("{path}.{k}"), found)),
            Value::Array(a) => a.iter().enumerate().for_each(|(i, x)| walk(x, &format!("{path}[{i}]"), found)),
            Value::String(s)
                if (path.ends_with(".expr") || path.ends_with(".legendFormat")) && uses_cluster_label(s) =>
            {
                found.push(format!("dashboard {path}: {s}"))
            }
            _ => {}
        }
    }
    walk(&dashboard, "", &mut found);
    let rules: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(observability_dir().join("alerts.yaml")).unwrap()).unwrap();
    for rule in rules["groups"].as_array().unwrap().iter().flat_map(|g| g["rules"].as_array().unwrap()) {
        let name = rule["alert"].as_str().unwrap();
        if let Some(expr) = rule["expr"].as_str().filter(|e| uses_cluster_label(e)) {
            found.push(format!("alert {name}: {expr}"));
        }
        // In the annotations' prose "cluster" is a word: only the template's label counts.
        for t in rule["annotations"].as_object().unwrap().values().filter_map(Value::as_str) {
            if t.contains("$labels.cluster ") || t.contains("$labels.cluster}") {
                found.push(format!("alert {name}: {t}"));
            }
        }
    }
    assert!(found.is_empty(), "queries using the label `cluster`:\n{}", found.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_metric_the_dashboard_and_alerts_use_is_served() {
    // The files first: what they must contain.
    let dashboard: Value =
        serde_json::from_str(&std::fs::read_to_string(observability_dir().join("dashboard.json")).unwrap())
            .expect("dashboard.json is JSON");
    assert!(dashboard["title"].is_string() && dashboard["uid"].is_string(), "a Grafana dashboard needs title and uid");
    let panels = dashboard_exprs(&dashboard);
    assert!(panels.len() >= 20, "dashboard has only {} queries", panels.len());
    let rules = alert_rules();
    let names: BTreeSet<&str> = rules.iter().map(|(n, _)| n.as_str()).collect();
    for required in [
        "FleetwatchClusterNotSeen",
        "FleetwatchAgentFlapping",
        "FleetwatchSubscriberLagging",
        "FleetwatchModuleError",
        "FleetwatchAgentCertificateExpiring",
        "FleetwatchHubNotReady",
    ] {
        assert!(names.contains(required), "alert {required} missing from alerts.yaml");
    }
    let module_error = rules.iter().find(|(n, _)| n == "FleetwatchModuleError").unwrap();
    assert!(module_error.1.contains("state=\"Error\""), "{module_error:?}");
    let mut used: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (title, expr) in panels.iter().chain(rules.iter()) {
        let found = metric_names(expr);
        // The absence alerts read Prometheus' own `up` of a fleetwatch job.
        let absence = expr.contains("up{job=\"fleetwatch-");
        assert!(!found.is_empty() || absence, "{title}: {expr:?} uses no fleetwatch metric");
        for n in found {
            used.entry(n).or_default().push(title.clone());
        }
    }

    // A fleet: control plane and runtime sims, hub, agent, lifecycle operator, a durable
    // subscriber, and a Runtime with a module installed.
    // Every process below starts after this (whole seconds: /proc's boot time is one).
    let started = jiff::Timestamp::now().as_second() as f64 - 1.0;
    let pki = Pki::new();
    let (cp, cp_kc) = sim_cluster(&pki, "control-plane").await;
    let (rt_sim, rt_kc) = sim_cluster(&pki, "rt1").await;
    let rt_client = rt_sim.client().await.unwrap();
    let crds = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds");
    kubectl(&cp_kc, &["apply", "-f", crds.to_str().unwrap()], None);
    apply_json(&cp_kc, &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}}));
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "rt1-kubeconfig", "namespace": NS},
                "stringData": {"config": std::fs::read_to_string(&rt_kc).unwrap()}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleTemplate",
            "metadata": {"name": "hello-1.0.0", "namespace": NS},
            "spec": {"moduleName": "hello", "version": "1.0.0", "manifest": [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "hello-system"}},
                {"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "hello-manager", "namespace": "hello-system",
                              "labels": {"operator.fleetwatch.dev/module": "hello", "app.kubernetes.io/version": "1.0.0"}},
                 "spec": {"replicas": 1, "selector": {"matchLabels": {"app": "hello"}},
                          "template": {"metadata": {"labels": {"app": "hello"}},
                                       "spec": {"containers": [{"name": "m", "image": "hello:1.0.0"}]}}}}],
                "manager": {"apiVersion": "apps/v1", "kind": "Deployment", "namespace": "hello-system", "name": "hello-manager"}}}),
    );
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "ModuleReleaseMeta",
            "metadata": {"name": "hello", "namespace": NS},
            "spec": {"moduleName": "hello", "channels": [{"channel": "regular", "version": "1.0.0"}]}}),
    );
    let wc = pki.path("wc");
    std::fs::create_dir_all(&wc).unwrap();
    std::fs::write(
        wc.join("cm.json"),
        json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": "cms"},
               "spec": {"resource": {"version": "v1", "kind": "ConfigMap"}, "fields": ["data"]}})
        .to_string(),
    )
    .unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", wc.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &rt_kc);
    // An agent with its health listener (/metrics), and a relay with its metrics listener.
    let agent_port = free_port();
    let health = format!("127.0.0.1:{agent_port}");
    let _syn = agent(&pki, "syn", &hub.url(), "synthetic:objects=2,rate=20,total=4", &["--health-listen", &health]);
    let relay_port = free_port();
    let mut relay_args: Vec<String> = vec![
        "relay".into(),
        "webhook".into(),
        "--hub".into(),
        hub.url(),
        "--name".into(),
        "hooks".into(),
        "--target".into(),
        format!("http://127.0.0.1:{}/events", free_port()),
        "--metrics-listen".into(),
        format!("127.0.0.1:{relay_port}"),
    ];
    relay_args.extend(client_args(&pki.subscriber("hooks")));
    let relay = Proc::spawn(&relay_args, pki.path("relay.log"));
    relay.wait_stdout("relay webhook running", Duration::from_secs(30));
    let _collector = Collector::start(&pki, &hub.url(), "ops").await;
    let metrics_port = free_port();
    let mut args: Vec<String> = vec![
        "lifecycle".into(),
        "--control-plane-kubeconfig".into(),
        cp_kc.display().to_string(),
        "--hub".into(),
        hub.url(),
        "--leader-elect=false".into(),
        "--metrics-listen".into(),
        format!("127.0.0.1:{metrics_port}"),
    ];
    args.extend(client_args(&pki.subscriber("lifecycle")));
    let lifecycle = Proc::spawn(&args, pki.path("lifecycle.log"));
    lifecycle.wait_stdout("lifecycle operator running", Duration::from_secs(10));
    let kubelet = tokio_util::sync::CancellationToken::new();
    let _kubelet = kubelet.clone().drop_guard();
    tokio::spawn(fleetwatch_sim::roll_out_deployments(rt_client, Duration::ZERO, kubelet));
    apply_json(
        &cp_kc,
        &json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": "rt1", "namespace": NS},
            "spec": {"clusterId": "rt1", "kubeconfigSecret": {"name": "rt1-kubeconfig"}, "modules": [{"name": "hello"}]}}),
    );

    // Wait until both report the fleet: the agent connected with a watch running, the
    // module Ready in the operator's gauge.
    let (hub_text, lc_text) = eventually("the hub and the operator to report the fleet")
        .context(|| format!("lifecycle log:\n{}", lifecycle.stderr()))
        .until(
            async || (http_get(hub.admin_port, "/metrics").await, http_get(metrics_port, "/metrics").await),
            |(hub_text, lc_text)| {
                Exposition::value(hub_text, "fleetwatch_hub_cluster_connected{runtime_cluster=\"rt1\"}") == Some(1.0)
                    && Exposition::value(
                        hub_text,
                        "fleetwatch_hub_cluster_watches{runtime_cluster=\"rt1\",phase=\"running\"}",
                    ) == Some(1.0)
                    && Exposition::value(lc_text, "fleetwatch_lifecycle_modules{module=\"hello\",state=\"Ready\"}")
                        == Some(1.0)
            },
        )
        .await;
    // Every /metrics endpoint is OpenMetrics with its content type, and promtool finds
    // nothing to complain about (the agent's once it reports its session).
    let agent_up = holds_within(Duration::from_secs(30), || {
        Exposition::value(&block(http_get(agent_port, "/metrics")), "fleetwatch_agent_connected") == Some(1.0)
    })
    .await;
    assert!(agent_up, "{}", http_get(agent_port, "/metrics").await);
    // The probes of every endpoint (one implementation, fleetwatch-telemetry): alive, and
    // ready with what each component checks.
    for port in [hub.admin_port, metrics_port, relay_port, agent_port] {
        assert_eq!(http_get(port, "/healthz").await, "ok\n", "port {port}");
    }
    assert_eq!(http_get(agent_port, "/readyz").await, "ready: connected to the hub\n");
    assert!(http_get(hub.admin_port, "/readyz").await.starts_with("ready: bus ok"));
    for (what, port) in
        [("hub", hub.admin_port), ("lifecycle", metrics_port), ("relay", relay_port), ("agent", agent_port)]
    {
        for accept in [None, Some(PROMETHEUS_ACCEPT)] {
            let (ct, text) = scrape(port, accept).await;
            assert_eq!(ct, OPENMETRICS, "{what}'s /metrics content type for Accept {accept:?}");
            assert!(text.ends_with("# EOF\n") && text.matches("# EOF").count() == 1, "{what}:\n{text}");
        }
        // promtool reads only the text format 0.0.4 (prometheus/prometheus#8932): each
        // endpoint serves it to a scraper that asks for it, with the same samples.
        let (ct, text) = scrape(port, Some("text/plain;version=0.0.4")).await;
        assert_eq!(ct, TEXT_FORMAT, "{what}'s /metrics content type when asked for the text format");
        if let Some(complaint) = promtool_check_metrics(&text) {
            panic!("promtool check metrics on the {what}'s /metrics: {complaint}\n{text}");
        }
        let openmetrics = Exposition::parse(&scrape(port, None).await.1);
        let classic = Exposition::parse(&text);
        let differ: Vec<_> = openmetrics.samples.symmetric_difference(&classic.samples).collect();
        assert!(differ.is_empty(), "{what}: the two formats carry other samples: {differ:?}\n{text}");
        assert!(!classic.samples.is_empty() && !text.contains("# EOF"), "{what}:\n{text}");
        // No family has a label `cluster` (decision 0039).
        let clashing: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#') && (l.contains("{cluster=") || l.contains(",cluster=")))
            .collect();
        assert!(clashing.is_empty(), "{what}: series with a label `cluster`: {clashing:?}");
        // Every component says which build runs and serves the standard process metrics,
        // with values that fit a process started by this test.
        let build = format!("fleetwatch_build_info{{version=\"{}\",commit=\"", env!("CARGO_PKG_VERSION"));
        let info =
            text.lines().find(|l| l.starts_with(&build)).unwrap_or_else(|| panic!("{what}: no {build}…\n{text}"));
        assert!(info.ends_with(" 1") && info.contains(",rustc=\"rustc "), "{what}: {info}");
        let v = |name: &str| Exposition::value(&text, name).unwrap_or_else(|| panic!("{what}: no {name}\n{text}"));
        let now = jiff::Timestamp::now().as_second() as f64;
        let start = v("process_start_time_seconds");
        assert!(start >= started && start <= now, "{what}: started at {start}, the test at {started}, now {now}");
        let (rss, vsz) = (v("process_resident_memory_bytes"), v("process_virtual_memory_bytes"));
        assert!(rss > 1_000_000.0 && vsz >= rss, "{what}: resident {rss}, virtual {vsz}");
        let (fds, max_fds) = (v("process_open_fds"), v("process_max_fds"));
        assert!(fds >= 3.0 && max_fds >= fds, "{what}: {fds} of {max_fds} descriptors open");
        let cpu = v("process_cpu_seconds_total");
        // No more CPU time than every core for the whole test.
        let cores = std::thread::available_parallelism().map_or(64.0, |n| n.get() as f64);
        assert!(cpu > 0.0 && cpu <= (now - started + 1.0) * cores, "{what}: {cpu} CPU seconds");
    }
    let relay_text = scrape(relay_port, None).await.1;
    assert!(
        relay_text.contains("fleetwatch_relay_delivered_total{relay=\"webhook\",target=\""),
        "the relay's families keep their names:\n{relay_text}"
    );
    let hub_metrics = Exposition::parse(&hub_text);
    let lc_metrics = Exposition::parse(&lc_text);
    let relay_metrics = Exposition::parse(&relay_text);
    assert!(hub_text.ends_with("# EOF\n") && lc_text.ends_with("# EOF\n"), "OpenMetrics answers end with # EOF");
    assert_eq!(hub_text.matches("# EOF").count(), 1, "{hub_text}");

    // Every metric used is served by the component it names.
    let mut unserved = Vec::new();
    for (name, users) in &used {
        let served = if name.starts_with("fleetwatch_hub_") {
            hub_metrics.serves(name)
        } else if name.starts_with("fleetwatch_lifecycle_") {
            lc_metrics.serves(name)
        } else if name.starts_with("fleetwatch_relay_") {
            relay_metrics.serves(name)
        } else {
            false
        };
        if !served {
            unserved.push(format!("{name} (used by {})", users.join(", ")));
        }
    }
    assert!(unserved.is_empty(), "not served:\n{}\nhub:\n{hub_text}\nlifecycle:\n{lc_text}", unserved.join("\n"));

    // And the values mean what they say.
    assert_eq!(Exposition::value(&hub_text, "fleetwatch_hub_ready"), Some(1.0), "{hub_text}");
    assert!(Exposition::value(&hub_text, "fleetwatch_hub_connects_total{role=\"agent\"}").is_some_and(|v| v >= 1.0));
    assert!(
        Exposition::value(&hub_text, "fleetwatch_hub_connects_total{role=\"subscriber\"}").is_some_and(|v| v >= 2.0)
    );
    let expiry = Exposition::value(&hub_text, "fleetwatch_hub_client_cert_earliest_expiry_seconds").unwrap();
    assert!(expiry > 0.0 && expiry <= 86_400.0 + 60.0, "test certificates live one day: {expiry}");
    let agent_expiry =
        Exposition::value(&hub_text, "fleetwatch_hub_agent_cert_expiry_timestamp_seconds{runtime_cluster=\"rt1\"}")
            .unwrap();
    let now = jiff::Timestamp::now().as_second() as f64;
    assert!(agent_expiry > now, "{agent_expiry} vs now {now}");
    // Subscribers serve the expiry of the certificate they use (one day, like every test one).
    for (text, series) in [
        (&lc_text, "fleetwatch_lifecycle_client_certificate_expiry_timestamp_seconds"),
        (&relay_text, "fleetwatch_relay_client_certificate_expiry_timestamp_seconds{relay=\"webhook\"}"),
    ] {
        let at = Exposition::value(text, series).unwrap_or_else(|| panic!("{series} not served:\n{text}"));
        assert!(at > now && at <= now + 86_400.0 + 60.0, "{series} {at} vs now {now}");
    }
    assert_eq!(Exposition::value(&lc_text, "fleetwatch_lifecycle_shards_held"), Some(1.0), "{lc_text}");
    assert_eq!(Exposition::value(&lc_text, "fleetwatch_lifecycle_shards"), Some(1.0), "unsharded is one shard");
    assert!(
        Exposition::value(&lc_text, "fleetwatch_lifecycle_reconcile_duration_seconds_count").is_some_and(|v| v >= 1.0),
        "{lc_text}"
    );
    // The durable subscriber drains: its lag comes back to zero.
    let text = eventually("the collector's lag to come back to 0")
        .until(
            async || http_get(hub.admin_port, "/metrics").await,
            |text| {
                Exposition::value(
                    text,
                    "fleetwatch_hub_subscriber_lag_records{subscriber=\"ops\",durable=\"collector\"}",
                ) == Some(0.0)
            },
        )
        .await;
    assert_eq!(
        Exposition::value(&text, "fleetwatch_hub_subscriber_lag_seconds{subscriber=\"ops\",durable=\"collector\"}"),
        Some(0.0)
    );
    // The operator's readiness follows its API server: ready now, not ready once it is gone.
    assert_eq!(http_get(metrics_port, "/readyz").await, "ready\n");
    cp.shutdown();
    eventually("/readyz to say not ready with the API server gone")
        .until(async || http_get(metrics_port, "/readyz").await, |body| body.starts_with("not ready: "))
        .await;
}
