//! `fleetwatch status`: one table of the fleet from the hub's admin API (clusters,
//! connection, last seen, watches, subscriber lag) and, with the control plane, each
//! runtime's modules by state. Exits 1 when something is unhealthy, so scripts can use it.
//!
//! The lists are read page by page (`?limit=`[`PAGE`]`&continue=`), so a fleet of any size
//! is read in bounded answers. Above `--rows` clusters the table gives way to a summary
//! (counts and the problems, at most [`PROBLEM_LINES`] of them); `--full`, `-o wide` and
//! `-o json` show every row.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::PathBuf;

use anyhow::Context;
use clap::{Args, ValueEnum};
use fleetwatch_api::Runtime;
use fleetwatch_api::summary::RuntimeSummary;
use fleetwatch_hub::ClusterStatus;
use fleetwatch_protocol::message::WatchPhase;
use serde::{Deserialize, Serialize};

mod admin;

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    admin: admin::AdminArgs,
    /// Read Runtimes from the control plane this kubeconfig reaches, for modules by state.
    /// Without it, the hub's own view of them is shown when it reads the control plane.
    #[arg(long, env = "FLEETWATCH_CONTROL_PLANE_KUBECONFIG")]
    control_plane_kubeconfig: Option<PathBuf>,
    /// Output: a table, a wide table, or one JSON or YAML document.
    #[arg(short = 'o', long, value_enum, default_value_t = Output::Table)]
    output: Output,
    /// A subscriber whose oldest unacked record is older than this many seconds is unhealthy.
    #[arg(long, default_value_t = 60.0)]
    max_lag_seconds: f64,
    /// Above this many clusters, the table output is a summary (counts and problems).
    #[arg(long, default_value_t = 200)]
    rows: usize,
    /// Every row, whatever the fleet's size.
    #[arg(long)]
    full: bool,
}

/// Items asked for per page of a list.
pub const PAGE: usize = 1_000;
/// Most problems the summary lists (the count says how many there are).
pub const PROBLEM_LINES: usize = 50;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Table,
    Wide,
    Json,
    Yaml,
}

/// One subscription as `/api/v1/subscriptions` lists it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "camelCase", default)]
pub struct Subscription {
    pub subscriber: String,
    pub durable: Option<String>,
    pub connected: bool,
    pub cursor: u64,
    pub lag_records: u64,
    pub lag_seconds: f64,
}

/// What `status` shows.
#[derive(Debug, Default, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Fleet {
    pub clusters: Vec<ClusterStatus>,
    pub subscriptions: Vec<Subscription>,
    /// `None` without a control plane.
    pub runtimes: Option<Vec<RuntimeSummary>>,
    /// Why the Runtimes could not be read.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub runtimes_error: Option<String>,
    /// What the hub made of each WatchConfig (accepted, or refused and why).
    pub watch_configs: Vec<fleetwatch_hub::watch_source::Verdict>,
}

/// Everything unhealthy, one line each: WatchConfigs the hub refused, disconnected agents,
/// failing watches, subscribers too far behind or disconnected with records waiting, modules
/// in Error or Warning, module configurations that fail a ModuleConfigPolicy schema, runtimes
/// whose agent never connected, Runtimes that cannot be read.
pub fn problems(fleet: &Fleet, max_lag_seconds: f64) -> Vec<String> {
    let mut out = Vec::new();
    for v in fleet.watch_configs.iter().filter(|v| !v.accepted) {
        let what = if v.name.is_empty() { v.source.clone() } else { format!("{} ({})", v.name, v.source) };
        out.push(format!("watchconfig {what}: not accepted, not pushed to agents: {}: {}", v.reason, v.message));
    }
    for c in &fleet.clusters {
        if !c.connected {
            let seen = c.last_seen.map(|t| format!(" (last seen {t})")).unwrap_or_default();
            out.push(format!("cluster {}: agent not connected{seen}", c.cluster));
        }
        // `waiting-for-kind` is healthy: nothing installed the kind (yet).
        for w in c.watches.iter().filter(|w| w.phase.is_failing()) {
            let msg = if w.message.is_empty() { String::new() } else { format!(": {}", w.message) };
            out.push(format!("cluster {}: watch {} is {}{msg}", c.cluster, w.name, w.phase));
        }
    }
    for s in &fleet.subscriptions {
        let name = sub_name(s);
        if s.lag_seconds > max_lag_seconds {
            out.push(format!(
                "subscriber {name}: {} records behind, the oldest {:.0} s old (over {max_lag_seconds} s)",
                s.lag_records, s.lag_seconds
            ));
        } else if !s.connected && s.lag_records > 0 {
            out.push(format!("subscriber {name}: disconnected with {} records waiting", s.lag_records));
        }
    }
    if let Some(e) = &fleet.runtimes_error {
        out.push(format!("control plane: {e}"));
    }
    for r in fleet.runtimes.iter().flatten() {
        for m in r.modules.iter().filter(|m| m.state == "Error" || m.state == "Warning") {
            let msg = if m.message.is_empty() { String::new() } else { format!(": {}", m.message) };
            let retry = m.retry.as_deref().map(|r| format!(" ({r})")).unwrap_or_default();
            out.push(format!("runtime {}: module {} is {}{msg}{retry}", r.runtime, m.name, m.state));
        }
        for m in r.modules.iter().filter(|m| !m.config_invalid.is_empty()) {
            out.push(format!(
                "runtime {}: module {} configuration invalid: {}",
                r.runtime,
                m.name,
                m.config_invalid.join("; ")
            ));
        }
        if !fleet.clusters.iter().any(|c| c.cluster == r.cluster) {
            out.push(format!("runtime {}: its agent (cluster {}) has not connected to the hub", r.runtime, r.cluster));
        }
    }
    out
}

fn sub_name(s: &Subscription) -> String {
    match &s.durable {
        Some(d) => format!("{}/{d}", s.subscriber),
        None => s.subscriber.clone(),
    }
}

/// "3s ago", "5m ago", "2h ago", "4d ago", or "never".
pub fn ago(t: Option<jiff::Timestamp>, now: jiff::Timestamp) -> String {
    let Some(t) = t else { return "never".into() };
    let s = now.duration_since(t).as_secs().max(0);
    match s {
        0..120 => format!("{s}s ago"),
        120..7200 => format!("{}m ago", s / 60),
        7200..172_800 => format!("{}h ago", s / 3600),
        _ => format!("{}d ago", s / 86_400),
    }
}

fn modules_cell(r: &RuntimeSummary, wide: bool) -> String {
    let mut parts: Vec<String> = r.modules_by_state.iter().map(|(s, n)| format!("{s}={n}")).collect();
    if wide {
        for m in &r.modules {
            if let Some(to) = &m.pending_upgrade {
                let window = m
                    .next_maintenance_window
                    .as_deref()
                    .map(|w| format!(" @{}", w.split('/').next().unwrap_or_default()))
                    .unwrap_or_default();
                parts.push(format!("{} {}→{to}{window}", m.name, m.running.as_deref().unwrap_or("-")));
            }
            if let Some(to) = &m.refused_downgrade {
                parts.push(format!("{} refused: downgrade {}→{to}", m.name, m.running.as_deref().unwrap_or("-")));
            }
            if let Some(first) = m.config_invalid.first() {
                parts.push(format!("{} config invalid: {}", m.name, first.split(':').next().unwrap_or_default()));
            }
        }
    }
    if parts.is_empty() { "-".into() } else { parts.join(" ") }
}

/// Rows as left-aligned columns two spaces apart (also `fleetwatch modules list`).
pub(crate) fn columns(rows: &[Vec<String>]) -> String {
    let n = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> =
        (0..n).map(|i| rows.iter().map(|r| r.get(i).map_or(0, |c| c.chars().count())).max().unwrap_or(0)).collect();
    let mut out = String::new();
    for r in rows {
        let line: Vec<String> = r.iter().zip(&widths).map(|(c, w)| format!("{c:<w$}")).collect();
        let _ = writeln!(out, "{}", line.join("  ").trim_end());
    }
    out
}

/// The tables (clusters with their runtimes' modules, then subscribers) and a summary.
pub fn render(fleet: &Fleet, problems: &[String], wide: bool, now: jiff::Timestamp) -> String {
    let by_cluster: BTreeMap<&str, Vec<&RuntimeSummary>> =
        fleet.runtimes.iter().flatten().fold(BTreeMap::new(), |mut m, r| {
            m.entry(r.cluster.as_str()).or_default().push(r);
            m
        });
    let mut head = vec!["CLUSTER", "AGENT", "LAST SEEN", "WATCHES"];
    if fleet.runtimes.is_some() {
        head.extend(["RUNTIME", "MODULES"]);
    }
    if wide {
        head.extend(["AGENT VERSION", "ADDRESS", "EVENTS", "HUB"]);
    }
    let mut rows = vec![head.iter().map(|h| h.to_string()).collect::<Vec<_>>()];
    let runtime_cells = |cluster: &str| -> Vec<String> {
        match by_cluster.get(cluster) {
            Some(rts) => vec![
                rts.iter().map(|r| r.runtime.as_str()).collect::<Vec<_>>().join(","),
                rts.iter().map(|r| modules_cell(r, wide)).collect::<Vec<_>>().join(" | "),
            ],
            None => vec!["-".into(), "-".into()],
        }
    };
    for c in &fleet.clusters {
        let running = c.watches.iter().filter(|w| w.phase == WatchPhase::Running).count();
        let waiting = c.watches.iter().filter(|w| w.phase == WatchPhase::WaitingForKind).count();
        let failed = c.watches.iter().filter(|w| w.phase.is_failing()).count();
        let mut watches = format!("{running} running");
        if waiting > 0 {
            watches.push_str(&format!(", {waiting} waiting for kind"));
        }
        if failed > 0 {
            watches.push_str(&format!(", {failed} failed"));
        }
        let mut row = vec![
            c.cluster.clone(),
            if c.connected { "connected".into() } else { "disconnected".into() },
            ago(c.last_seen, now),
            watches,
        ];
        if fleet.runtimes.is_some() {
            row.extend(runtime_cells(&c.cluster));
        }
        if wide {
            row.extend([
                c.agent_version.clone().unwrap_or_else(|| "-".into()),
                c.remote.clone().unwrap_or_else(|| "-".into()),
                c.events_received.to_string(),
                "-".into(),
            ]);
        }
        rows.push(row);
    }
    // Runtimes whose agent never reached the hub.
    for (cluster, _) in by_cluster.iter().filter(|(id, _)| !fleet.clusters.iter().any(|c| c.cluster == **id)) {
        let mut row = vec![cluster.to_string(), "never".into(), "never".into(), "-".into()];
        row.extend(runtime_cells(cluster));
        if wide {
            row.extend(["-".into(), "-".into(), "0".into(), "-".into()]);
        }
        rows.push(row);
    }
    let mut out = columns(&rows);
    out.push('\n');
    if fleet.subscriptions.is_empty() {
        out.push_str("no subscriber\n");
    } else {
        let mut subs = vec![
            ["SUBSCRIBER", "DURABLE", "CONNECTED", "CURSOR", "LAG", "LAG AGE"].iter().map(|h| h.to_string()).collect(),
        ];
        for s in &fleet.subscriptions {
            subs.push(vec![
                s.subscriber.clone(),
                s.durable.clone().unwrap_or_else(|| "-".into()),
                if s.connected { "yes".into() } else { "no".into() },
                s.cursor.to_string(),
                s.lag_records.to_string(),
                format!("{:.1}s", s.lag_seconds),
            ]);
        }
        out.push_str(&columns(&subs));
    }
    let connected = fleet.clusters.iter().filter(|c| c.connected).count();
    let _ = write!(
        out,
        "\n{} ({connected} connected), {}",
        counted(fleet.clusters.len(), "cluster"),
        counted(fleet.subscriptions.len(), "subscription")
    );
    if let Some(rts) = &fleet.runtimes {
        let _ = write!(out, ", {}", counted(rts.len(), "runtime"));
    }
    if problems.is_empty() {
        out.push_str(": healthy\n");
    } else {
        let _ = writeln!(out, ": {}", counted(problems.len(), "problem"));
        for p in problems {
            let _ = writeln!(out, "  - {p}");
        }
    }
    out
}

/// `n` and the word, in the plural unless `n` is 1 ("1 problem", "2 problems").
fn counted(n: usize, word: &str) -> String {
    if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") }
}

/// The summary shown instead of the table for a large fleet: counts, then the problems
/// (at most [`PROBLEM_LINES`]; disconnected clusters first, as the hub orders them).
pub fn render_summary(fleet: &Fleet, problems: &[String]) -> String {
    let connected = fleet.clusters.iter().filter(|c| c.connected).count();
    let failing =
        fleet.clusters.iter().filter(|c| c.connected && c.watches.iter().any(|w| w.phase.is_failing())).count();
    let mut out = format!(
        "{}: {connected} connected, {} disconnected, {failing} with failing watches\n{}",
        counted(fleet.clusters.len(), "cluster"),
        fleet.clusters.len() - connected,
        counted(fleet.subscriptions.len(), "subscription")
    );
    if let Some(rts) = &fleet.runtimes {
        let unhealthy = rts.iter().filter(|r| !r.healthy()).count();
        let _ = write!(out, ", {} ({unhealthy} with modules in Error or Warning)", counted(rts.len(), "runtime"));
    }
    if problems.is_empty() {
        out.push_str(": healthy\n");
    } else {
        let _ = writeln!(out, ": {}", counted(problems.len(), "problem"));
        for p in problems.iter().take(PROBLEM_LINES) {
            let _ = writeln!(out, "  - {p}");
        }
        if problems.len() > PROBLEM_LINES {
            let _ = writeln!(out, "  … and {} more (-o json lists them all)", problems.len() - PROBLEM_LINES);
        }
    }
    out.push_str("(a summary: the fleet has more clusters than --rows; --full or -o wide prints every row)\n");
    out
}

/// Every item of a paged list (`field` of each answer), following `metadata.continue`. A hub
/// that does not page answers the whole list at once, without a token: that ends it too.
async fn get_all<T: serde::de::DeserializeOwned>(
    admin: &admin::Admin,
    path: &str,
    field: &str,
) -> anyhow::Result<(Vec<T>, serde_json::Value)> {
    let mut items = Vec::new();
    let mut cont: Option<String> = None;
    let limit = PAGE.to_string();
    loop {
        let mut query = vec![("limit", limit.as_str())];
        if let Some(c) = &cont {
            query.push(("continue", c.as_str()));
        }
        let mut doc: serde_json::Value = admin.get_json(path, &query).await?;
        let list = doc.as_object_mut().and_then(|o| o.remove(field)).unwrap_or_default();
        let page: Vec<T> = serde_json::from_value(list).with_context(|| format!("{path}: unexpected {field}"))?;
        items.extend(page);
        match doc["metadata"]["continue"].as_str() {
            Some(c) if !c.is_empty() && cont.as_deref() != Some(c) => cont = Some(c.to_string()),
            _ => return Ok((items, doc)),
        }
    }
}

/// Every Runtime in the control plane, summarised (one that cannot be decoded is an error
/// line, not a failure of the whole list).
async fn read_runtimes(kubeconfig: &std::path::Path) -> anyhow::Result<(Vec<RuntimeSummary>, Vec<String>)> {
    let client = fleetwatch_client::kubeconfig::client_from_kubeconfig(kubeconfig)
        .await
        .with_context(|| format!("cannot use the control plane's kubeconfig {}", kubeconfig.display()))?;
    let api: kube::Api<kube::api::DynamicObject> =
        kube::Api::all_with(client, &kube::core::ApiResource::erase::<Runtime>(&()));
    let list = api.list(&Default::default()).await.context("cannot list Runtimes in the control plane")?;
    let mut out = Vec::new();
    let mut bad = Vec::new();
    for obj in list.items {
        let name = format!(
            "{}/{}",
            obj.metadata.namespace.as_deref().unwrap_or_default(),
            obj.metadata.name.as_deref().unwrap_or_default()
        );
        match serde_json::to_value(&obj).and_then(serde_json::from_value::<Runtime>) {
            Ok(rt) => out.push(RuntimeSummary::from_runtime(&rt)),
            Err(e) => bad.push(format!("runtime {name}: cannot be read: {e}")),
        }
    }
    out.sort_by(|a, b| a.runtime.cmp(&b.runtime));
    Ok((out, bad))
}

/// Returns whether the fleet is healthy; `Err` when the hub cannot be asked.
pub async fn run(args: StatusArgs) -> anyhow::Result<bool> {
    let admin = admin::Admin::new(&args.admin).await?;
    #[derive(Deserialize)]
    struct Subs {
        subscriptions: Vec<Subscription>,
    }
    #[derive(Deserialize)]
    #[serde(rename_all = "camelCase")]
    struct WatchConfigs {
        watch_configs: Vec<fleetwatch_hub::watch_source::Verdict>,
    }
    let (clusters, _) = get_all::<ClusterStatus>(&admin, "/api/v1/clusters", "clusters").await?;
    let subs: Subs = admin.get_json("/api/v1/subscriptions", &[]).await?;
    let wcs: WatchConfigs = admin.get_json("/api/v1/watchconfigs", &[]).await?;
    let mut fleet =
        Fleet { clusters, subscriptions: subs.subscriptions, watch_configs: wcs.watch_configs, ..Default::default() };
    let mut extra = Vec::new();
    match &args.control_plane_kubeconfig {
        Some(kc) => match read_runtimes(kc).await {
            Ok((rts, bad)) => {
                fleet.runtimes = Some(rts);
                extra = bad;
            }
            Err(e) => {
                fleet.runtimes = Some(Vec::new());
                fleet.runtimes_error = Some(format!("{e:#}"));
            }
        },
        None => {
            // The hub's own view, when it reads the control plane.
            let (items, last) = get_all::<RuntimeSummary>(&admin, "/api/v1/runtimes", "items").await?;
            let view: fleetwatch_hub::fleet::RuntimesView = serde_json::from_value(last).unwrap_or_default();
            if view.configured {
                fleet.runtimes = Some(items);
                fleet.runtimes_error = view.error;
            }
        }
    }
    let mut problems = problems(&fleet, args.max_lag_seconds);
    problems.extend(extra);
    let healthy = problems.is_empty();
    match args.output {
        Output::Json | Output::Yaml => {
            let doc = serde_json::json!({
                "healthy": healthy,
                "problems": problems,
                "clusters": fleet.clusters,
                "subscriptions": fleet.subscriptions,
                "runtimes": fleet.runtimes,
                "watchConfigs": fleet.watch_configs,
            });
            if args.output == Output::Json {
                println!("{}", serde_json::to_string_pretty(&doc)?);
            } else {
                let yaml = serde_saphyr::to_string(&doc).context("cannot render the status as YAML")?;
                println!("{}", yaml.trim_end());
            }
        }
        Output::Table if !args.full && fleet.clusters.len() > args.rows => {
            print!("{}", render_summary(&fleet, &problems));
        }
        Output::Table | Output::Wide => {
            print!("{}", render(&fleet, &problems, args.output == Output::Wide, jiff::Timestamp::now()));
        }
    }
    Ok(healthy)
}

#[cfg(test)]
mod tests {
    use super::*;
    use fleetwatch_api::summary::ModuleSummary;
    use fleetwatch_protocol::message::WatchState;

    fn now() -> jiff::Timestamp {
        "2030-01-01T12:00:00Z".parse().unwrap()
    }

    fn cluster(id: &str, connected: bool) -> ClusterStatus {
        ClusterStatus {
            cluster: id.into(),
            connected,
            last_seen: Some("2030-01-01T11:59:57Z".parse().unwrap()),
            watches: vec![WatchState {
                name: "w".into(),
                phase: WatchPhase::Running,
                message: String::new(),
                objects: 1,
            }],
            ..Default::default()
        }
    }

    fn runtime(cluster: &str, states: &[&str]) -> RuntimeSummary {
        let modules: Vec<ModuleSummary> = states
            .iter()
            .enumerate()
            .map(|(i, s)| ModuleSummary {
                name: format!("m{i}"),
                state: s.to_string(),
                running: Some("1.0.0".into()),
                pending_upgrade: None,
                refused_downgrade: None,
                next_maintenance_window: None,
                message: String::new(),
                config_invalid: Vec::new(),
                retry: None,
            })
            .collect();
        let mut by = BTreeMap::new();
        for s in states {
            *by.entry(s.to_string()).or_insert(0) += 1;
        }
        RuntimeSummary {
            runtime: format!("kcp/{cluster}"),
            cluster: cluster.into(),
            state: Some("Ready".into()),
            modules_by_state: by,
            modules,
            labels: Default::default(),
        }
    }

    #[test]
    fn a_healthy_fleet_has_no_problems_and_renders_one_row_per_cluster() {
        let fleet = Fleet {
            clusters: vec![cluster("rt-1", true), cluster("rt-2", true)],
            subscriptions: vec![Subscription {
                subscriber: "lifecycle".into(),
                durable: Some("lifecycle".into()),
                connected: true,
                cursor: 42,
                ..Default::default()
            }],
            runtimes: Some(vec![runtime("rt-1", &["Ready", "Ready"]), runtime("rt-2", &["Ready"])]),
            runtimes_error: None,
            watch_configs: vec![fleetwatch_hub::watch_source::Verdict {
                name: "cms".into(),
                accepted: true,
                ..Default::default()
            }],
        };
        let p = problems(&fleet, 60.0);
        assert!(p.is_empty(), "{p:?}");
        let out = render(&fleet, &p, false, now());
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("CLUSTER") && lines[0].contains("MODULES"), "{out}");
        assert!(
            lines[1].starts_with("rt-1  ") && lines[1].contains("connected") && lines[1].contains("3s ago"),
            "{out}"
        );
        assert!(lines[1].contains("Ready=2") && lines[1].contains("1 running"), "{out}");
        assert!(out.contains("lifecycle   lifecycle  yes"), "{out}");
        assert!(out.trim_end().ends_with("2 clusters (2 connected), 1 subscription, 2 runtimes: healthy"), "{out}");
    }

    #[test]
    fn every_kind_of_trouble_is_a_problem() {
        let mut broken = cluster("rt-2", false);
        broken.watches.push(WatchState {
            name: "secrets".into(),
            phase: WatchPhase::Forbidden,
            message: "403".into(),
            objects: 0,
        });
        let fleet = Fleet {
            clusters: vec![cluster("rt-1", true), broken],
            subscriptions: vec![
                Subscription {
                    subscriber: "slow".into(),
                    connected: true,
                    lag_records: 9,
                    lag_seconds: 120.0,
                    ..Default::default()
                },
                Subscription {
                    subscriber: "gone".into(),
                    durable: Some("d".into()),
                    connected: false,
                    lag_records: 3,
                    lag_seconds: 5.0,
                    ..Default::default()
                },
                Subscription { subscriber: "idle".into(), durable: Some("x".into()), ..Default::default() },
            ],
            runtimes: Some(vec![runtime("rt-1", &["Ready", "Error"]), runtime("rt-9", &["Ready"])]),
            ..Default::default()
        };
        let p = problems(&fleet, 60.0);
        let want = [
            "cluster rt-2: agent not connected (last seen 2030-01-01T11:59:57Z)",
            "cluster rt-2: watch secrets is forbidden: 403",
            "subscriber slow: 9 records behind, the oldest 120 s old (over 60 s)",
            "subscriber gone/d: disconnected with 3 records waiting",
            "runtime kcp/rt-1: module m1 is Error",
            "runtime kcp/rt-9: its agent (cluster rt-9) has not connected to the hub",
        ];
        assert_eq!(p, want);
        let out = render(&fleet, &p, true, now());
        assert!(out.contains("1 running, 1 failed"), "{out}");
        assert!(out.lines().any(|l| l.starts_with("rt-9") && l.contains("never")), "{out}");
        assert!(out.contains("AGENT VERSION"), "{out}");
        assert!(out.contains(": 6 problems"), "{out}");
    }

    #[test]
    fn a_watch_waiting_for_an_uninstalled_kind_is_healthy_but_a_provided_one_is_not() {
        let mut c = cluster("rt-1", true);
        c.watches.push(WatchState {
            name: "redis-config".into(),
            phase: WatchPhase::WaitingForKind,
            message: "no installed module provides it (yet)".into(),
            objects: 0,
        });
        let mut fleet = Fleet { clusters: vec![c], ..Default::default() };
        let p = problems(&fleet, 60.0);
        assert!(p.is_empty(), "{p:?}");
        let out = render(&fleet, &p, false, now());
        assert!(out.contains("1 running, 1 waiting for kind") && !out.contains("failed"), "{out}");
        fleet.clusters[0].watches[1].phase = WatchPhase::KindNotFound;
        let p = problems(&fleet, 60.0);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("cluster rt-1: watch redis-config is kind-not-found"), "{p:?}");
    }

    #[test]
    fn pending_upgrades_show_in_wide_output() {
        let mut r = runtime("rt-1", &["Ready"]);
        r.modules[0].pending_upgrade = Some("2.0.0".into());
        r.modules[0].next_maintenance_window = Some("2030-01-02T02:00:00Z/2030-01-02T04:00:00Z".into());
        assert_eq!(modules_cell(&r, false), "Ready=1");
        assert_eq!(modules_cell(&r, true), "Ready=1 m0 1.0.0→2.0.0 @2030-01-02T02:00:00Z");
        let mut d = runtime("rt-1", &["Warning"]);
        d.modules[0].running = Some("2.0.0".into());
        d.modules[0].refused_downgrade = Some("1.0.0".into());
        assert_eq!(modules_cell(&d, true), "Warning=1 m0 refused: downgrade 2.0.0→1.0.0");
    }

    #[test]
    fn ages() {
        assert_eq!(ago(None, now()), "never");
        assert_eq!(ago(Some("2030-01-01T11:00:00Z".parse().unwrap()), now()), "60m ago");
        assert_eq!(ago(Some("2029-12-30T12:00:00Z".parse().unwrap()), now()), "2d ago");
    }

    #[test]
    fn a_large_fleet_is_summed_up_with_its_problems_bounded() {
        let clusters: Vec<ClusterStatus> = (0..300).map(|i| cluster(&format!("c-{i:03}"), i >= 60)).collect();
        let fleet = Fleet { clusters, runtimes: Some(vec![runtime("c-100", &["Error"])]), ..Default::default() };
        let p = problems(&fleet, 60.0);
        assert_eq!(p.len(), 61);
        let out = render_summary(&fleet, &p);
        let lines: Vec<&str> = out.lines().collect();
        assert_eq!(lines[0], "300 clusters: 240 connected, 60 disconnected, 0 with failing watches", "{out}");
        assert!(
            lines[1].starts_with("0 subscriptions, 1 runtime (1 with modules in Error or Warning): 61 problems"),
            "{out}"
        );
        assert_eq!(out.lines().filter(|l| l.starts_with("  - ")).count(), PROBLEM_LINES, "{out}");
        assert!(out.contains("… and 11 more"), "{out}");
        assert!(!out.contains("CLUSTER"), "no table: {out}");
    }

    #[test]
    fn a_refused_watchconfig_is_a_problem() {
        let fleet = Fleet {
            watch_configs: vec![fleetwatch_hub::watch_source::Verdict {
                name: "bad".into(),
                source: "control-plane".into(),
                accepted: false,
                reason: "Invalid".into(),
                message: "labelSelector \"app=(web\": bad".into(),
                ..Default::default()
            }],
            ..Default::default()
        };
        let p = problems(&fleet, 60.0);
        assert_eq!(
            p,
            [
                "watchconfig bad (control-plane): not accepted, not pushed to agents: Invalid: labelSelector \"app=(web\": bad"
            ]
        );
    }
}
