//! `fleetwatch bench self-service`: the self-service flow of issue 46 at fleet scale, through
//! the real path. A user creates a `Module` in a runtime cluster (what `kubectl apply` of a new
//! object does: a create through that cluster's API server); the cluster's agent sees it (the
//! lifecycle operator keeps the WatchConfig for `Module` objects in the control plane, the hub
//! reads it there and pushes it to every agent) and streams it to the hub over mTLS; the hub
//! delivers it to the lifecycle operator (a subscriber), which reconciles that Runtime and
//! writes the object's `status`. Measured per object: from the create returning to the
//! bench's watch of that cluster's `Module` objects showing `status.state` set.
//!
//! The processes: a sim control plane in the bench process; N sim runtime clusters, each with
//! its agent (the real [`fleetwatch_agent::AgentRuntime`] with a Kubernetes source and its own
//! certificate), in `bench lifecycle-sims` child processes; the hub and `fleetwatch lifecycle`
//! as child processes (this same binary). Set-up (not measured): every Runtime installs its
//! central modules, every runtime cluster serves the `Module` kind, and every agent runs the
//! operator's watch of `Module` objects (its phase `running` in the hub's admin API). Then
//! `--rate` creations per second for `--duration` seconds, spread over the runtimes (each
//! cluster gets its next `u<k>` module, offered by the catalog and listed by no Runtime).
//!
//! Where the time goes, per object: the event's own time (when the agent saw the change),
//! its arrival at the bench's own hub subscription, the operator's trigger line for it (its
//! log, JSON, `fleetwatch_lifecycle::triggers` at info: when the reconcile was queued), and
//! the status in the bench's watch; beside them the operator's reconcile durations (its
//! histogram) and its reconciles in flight against `--concurrency`, sampled. `--per-object`
//! writes all of it per object. `--stand-in` takes the operator out once set up: the bench
//! writes each `Module`'s status itself as soon as its event reaches the bench's
//! subscription, which is the floor of the path without the reconcile (and, before the
//! operator took up `Module` objects, let the rest of the bench be checked).

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use clap::Args;
use fleetwatch_api::chosen::Module;
use fleetwatch_api::watchconfig::{ResourceRef, WatchConfig, WatchConfigSpec};
use fleetwatch_api::{Runtime, State};
use fleetwatch_certs::{Authority, LeafSpec, TlsFiles};
use fleetwatch_client::subscriber::{Delivery, SubscriberOptions, Subscription};
use fleetwatch_client::transport::{HubUrl, HubUrls};
use fleetwatch_protocol::message::StartFrom;
use futures_util::StreamExt;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{CustomResourceExt, Resource};
use tokio_util::sync::CancellationToken;

use super::lifecycle::{module_template, release_meta};
use super::lifecycle_sims::{AgentSpec, SimProcess};
use super::{percentile, tempdir};

/// The control-plane namespace of Runtimes, templates, metas and kubeconfig Secrets.
const NS: &str = "kcp";
/// The `Module` CRD the operator installs in every runtime cluster.
const MODULE_CRD: &str = "modules.operator.fleetwatch.dev";
/// Prefix of the modules the bench's users choose (`u0`, `u1`, …): offered by the catalog,
/// listed by no Runtime. The centrally listed ones are `m0`, `m1`, ….
const USER: &str = "u";

#[derive(Args)]
pub(super) struct SelfServiceBench {
    /// Runtimes, each its own simulated cluster with its own agent.
    #[arg(long, default_value_t = 1000)]
    runtimes: usize,
    /// Modules every Runtime lists centrally (installed before the measurement; each
    /// reconcile looks at them too).
    #[arg(long, default_value_t = 3)]
    central_modules: usize,
    /// `Module` objects created per second, spread over the runtimes.
    #[arg(long, default_value_t = 10.0)]
    rate: f64,
    /// Seconds of creations.
    #[arg(long, default_value_t = 60.0)]
    duration: f64,
    /// Seconds an object may wait for its status before it counts as lost.
    #[arg(long, default_value_t = 30.0)]
    timeout: f64,
    /// Reconciles the operator runs at once (`fleetwatch lifecycle --concurrency`).
    #[arg(long, default_value_t = 16)]
    concurrency: u16,
    /// Seconds the set-up (install, CRDs, agents' watches) may take before the bench gives up.
    #[arg(long, default_value_t = 900.0)]
    setup_wait: f64,
    /// After set-up, stop the lifecycle operator and let the bench write each `Module`'s
    /// status when its event reaches the bench's own hub subscription: the path without the
    /// operator's queue and reconcile. Installs the `Module` CRD and a WatchConfig for it
    /// where the operator did not.
    #[arg(long)]
    stand_in: bool,
    /// Simulated runtime clusters (and agents) per sim child process: each cluster with its
    /// agent holds about 20 descriptors, so 250 stay well below a 20,000 open-file limit.
    #[arg(long, default_value_t = 250, hide = true)]
    sims_per_process: usize,
    /// Print one JSON object with every figure as the last line.
    #[arg(long)]
    json: bool,
    /// Write one CSV line per created object to this file: runtime, module, seconds into the
    /// run, and the milliseconds from its create to the agent seeing it (the event's time),
    /// the events of its cluster in that delivery, to its event at the bench's subscription,
    /// to the operator's trigger, to its first state (and which) and to Ready (empty: not
    /// seen); the operator's log is copied to FILE.lifecycle.log.
    #[arg(long, value_name = "FILE")]
    per_object: Option<std::path::PathBuf>,
}

/// When each user `Module` (by runtime index and name) was created and first seen.
#[derive(Default)]
struct Times {
    /// The create returned.
    created: HashMap<(usize, String), Instant>,
    /// The same, by the wall clock (to compare with the operator's log).
    created_wall: HashMap<(usize, String), jiff::Timestamp>,
    /// Its first event reached the bench's hub subscription.
    at_hub: HashMap<(usize, String), Instant>,
    /// That event's time: when the agent saw the change (its wall clock), and how many
    /// events of the same cluster its delivery held.
    agent_saw: HashMap<(usize, String), (jiff::Timestamp, usize)>,
    /// The bench's watch of its cluster first showed `status.state` set, and to what.
    state: HashMap<(usize, String), (Instant, String)>,
    /// The same, by the wall clock.
    state_wall: HashMap<(usize, String), jiff::Timestamp>,
    /// It first showed `status.state: Ready` (installed and rolled out).
    ready: HashMap<(usize, String), Instant>,
}

type Shared = Arc<Mutex<Times>>;

/// One `fleetwatch lifecycle` process, subscribed to the hub.
struct Operator {
    child: tokio::process::Child,
    metrics: String,
    log: std::path::PathBuf,
}

impl Operator {
    /// Starts it with its subscriber certificate from the PKI directory `pki`, logging into
    /// `work`.
    fn spawn(b: &SelfServiceBench, pki: &Path, work: &Path, kubeconfig: &Path, hub: &HubUrl) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let metrics = format!("127.0.0.1:{port}");
        let log = work.join("lifecycle.log");
        let dir = pki;
        let exe = std::env::current_exe().context("cannot find own executable")?;
        let child = tokio::process::Command::new(exe)
            // Its trigger lines (JSON, with their time): when each hub event was queued for a
            // reconcile.
            .args(["--log", "warn,fleetwatch_lifecycle::triggers=info", "--log-json"])
            .args(["lifecycle", "--control-plane-kubeconfig"])
            .arg(kubeconfig)
            .args(["--hub", &hub.to_string(), "--cert"])
            .arg(dir.join("subscriber-lifecycle.crt"))
            .arg("--key")
            .arg(dir.join("subscriber-lifecycle.key"))
            .arg("--ca")
            .arg(dir.join("ca.crt"))
            // Only hub events and control-plane changes start reconciles: what is measured.
            .args(["--resync", "0", "--leader-elect=false"])
            .args(["--concurrency", &b.concurrency.to_string(), "--metrics-listen", &metrics])
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("cannot start the lifecycle operator")?;
        Ok(Self { child, metrics, log })
    }

    /// Fails with its log's last lines if it has exited.
    fn running(&mut self) -> anyhow::Result<()> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => {
                bail!("the lifecycle operator exited ({status}); its log ends with:\n{}", log_tail(&self.log))
            }
            Err(e) => bail!("the lifecycle operator: {e}"),
        }
    }

    async fn sample(&self, name: &str) -> Option<f64> {
        super::hub_counter(&self.metrics, name).await
    }

    /// SIGTERM, then waits for it to stop (killed after 20 s).
    async fn stop(&mut self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            // SAFETY: kill(2) with the pid of our own child, not reaped yet (we hold its
            // handle), so the pid cannot have been reused.
            unsafe {
                libc::kill(pid, libc::SIGTERM);
            }
        }
        if tokio::time::timeout(Duration::from_secs(20), self.child.wait()).await.is_err() {
            let _ = self.child.start_kill();
        }
    }
}

pub(super) async fn run(b: SelfServiceBench, crds: &[serde_json::Value]) -> anyhow::Result<()> {
    if b.runtimes == 0 || b.rate <= 0.0 || b.duration <= 0.0 || b.timeout <= 0.0 || b.concurrency == 0 {
        bail!("--runtimes, --rate, --duration, --timeout and --concurrency must be positive");
    }
    let total = (b.rate * b.duration).round() as usize;
    if total == 0 {
        bail!("--rate × --duration makes no creation");
    }
    // Every runtime gets its next user module: as many modules as rounds over the runtimes.
    let user_modules = total.div_ceil(b.runtimes);
    // One watch per runtime cluster, and a connection for its creates.
    if let Err(e) = rlimit::increase_nofile_limit(u64::MAX) {
        tracing::warn!(error = %e, "cannot raise the open-file limit");
    }
    let setup_started = Instant::now();
    let limit = Duration::from_secs_f64(b.setup_wait);
    let clusters: Vec<String> = (0..b.runtimes).map(|i| format!("rt{i}")).collect();
    let (_pki, dir) = super::bench_pki(&clusters)?;
    Authority::load(&dir)?.issue(&dir, &LeafSpec::Subscriber { name: "lifecycle".into() }, 1)?;

    // The control plane: CRDs, the modules (central m*, user u*), its kubeconfig for the hub
    // and the operator.
    let cp = fleetwatch_sim::SimCluster::start(fleetwatch_sim::SimOptions {
        name: "control-plane".into(),
        ..Default::default()
    })
    .await?;
    let client = cp.client().await?;
    let apply = |v: serde_json::Value| {
        let client = client.clone();
        async move { fleetwatch_client::kube_apply::apply(&client, "bench", &v).await }
    };
    fleetwatch_client::kube_apply::install_crds(&client, crds).await?;
    apply(serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}})).await?;
    let modules =
        (0..b.central_modules).map(|m| format!("m{m}")).chain((0..user_modules).map(|u| format!("{USER}{u}")));
    for m in modules {
        apply(module_template(NS, &m, "1.0.0")).await?;
        apply(release_meta(NS, &m, "1.0.0")).await?;
    }
    let work = tempdir()?;
    let cp_kubeconfig = work.path().join("control-plane.kubeconfig");
    std::fs::write(&cp_kubeconfig, cp.kubeconfig_yaml())?;

    // The hub, reading WatchConfigs from the control plane.
    let cp_arg = cp_kubeconfig.to_str().context("the temporary directory's path is not UTF-8")?;
    let hub = super::start_hub(&dir, false, &["--control-plane-kubeconfig", cp_arg]).await?;
    let hub_pid = hub.child.id().context("hub pid")?;
    eprintln!("hub pid {hub_pid} at {}", hub.wss);

    // The runtime clusters with their agents, their kubeconfig Secrets.
    let started = Instant::now();
    let agents = AgentSpec { pki: dir.clone(), hub: hub.wss.clone() };
    let (sims, kubeconfigs) = super::lifecycle_sims::start(b.runtimes, b.sims_per_process, Some(&agents)).await?;
    let secrets = kubeconfigs.iter().enumerate().map(|(i, kubeconfig)| {
        apply(serde_json::json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("rt{i}-kubeconfig"), "namespace": NS}, "stringData": {"config": kubeconfig}}))
    });
    let mut secrets = std::pin::pin!(futures_util::stream::iter(secrets).buffer_unordered(16));
    while let Some(done) = secrets.next().await {
        done?;
    }
    eprintln!(
        "started {} sim runtime clusters with their agents in {} processes in {:.1} s",
        b.runtimes,
        sims.len(),
        started.elapsed().as_secs_f64()
    );
    // The users' clients, one per runtime cluster.
    let mut clients = Vec::with_capacity(b.runtimes);
    for (i, kubeconfig) in kubeconfigs.iter().enumerate() {
        clients.push(client_for(kubeconfig).await.with_context(|| format!("a client for runtime cluster rt{i}"))?);
    }

    // The operator, and the Runtimes.
    let mut operator = Operator::spawn(&b, &dir, work.path(), &cp_kubeconfig, &hub.wss)?;
    let central: Vec<serde_json::Value> =
        (0..b.central_modules).map(|m| serde_json::json!({"name": format!("m{m}")})).collect();
    let runtimes = (0..b.runtimes).map(|i| {
        apply(serde_json::json!({"apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "Runtime",
            "metadata": {"name": format!("rt{i}"), "namespace": NS},
            "spec": {"kubeconfigSecret": {"name": format!("rt{i}-kubeconfig")}, "modules": central}}))
    });
    let mut runtimes = std::pin::pin!(futures_util::stream::iter(runtimes).buffer_unordered(16));
    while let Some(done) = runtimes.next().await {
        done?;
    }
    let operator_log = operator.log.clone();
    let in_setup = |what: &'static str| {
        let log = operator_log.clone();
        move || format!("set-up: {what}; the lifecycle operator's log ends with:\n{}", log_tail(&log))
    };
    let runtimes: Api<Runtime> = Api::namespaced(client.clone(), NS);
    let central_modules = b.central_modules;
    wait_for("Runtimes Ready with their central modules", b.runtimes, setup_started, limit, &mut operator, || {
        let runtimes = runtimes.clone();
        async move {
            let list = runtimes.list(&Default::default()).await?;
            Ok(list
                .items
                .iter()
                .filter(|r| {
                    r.status.as_ref().is_some_and(|s| {
                        s.state == Some(State::Ready)
                            && s.modules.iter().filter(|m| m.state == State::Ready).count() >= central_modules
                    })
                })
                .count())
        }
    })
    .await
    .with_context(in_setup("installing the central modules"))?;

    let module_ar = ApiResource::erase::<Module>(&());
    if b.stand_in {
        stand_in_setup(&client, &clients).await?;
    }
    wait_for(
        &format!("runtime clusters serving {MODULE_CRD}"),
        b.runtimes,
        setup_started,
        limit,
        &mut operator,
        || count_serving(&clients),
    )
    .await
    .with_context(in_setup("the operator installing the Module CRD in every runtime cluster"))?;
    // The WatchConfig for Module objects (the operator's), and every agent running it: its
    // watch listed (a kind served only lately is looked up again at most 5 s apart). The
    // WatchConfig's status counts clusters whose agent has the watch in any phase, so each
    // cluster's watch phase is read from the hub's admin API.
    let watchconfigs: Api<WatchConfig> = Api::all(client.clone());
    let found: Arc<Mutex<String>> = Arc::default();
    wait_for("a WatchConfig for Module objects", 1, setup_started, limit, &mut operator, || {
        let (watchconfigs, found) = (watchconfigs.clone(), found.clone());
        async move {
            let list = watchconfigs.list(&Default::default()).await?;
            let name = list.items.iter().find(|w| watches_modules(w)).and_then(|w| w.metadata.name.clone());
            let n = usize::from(name.is_some());
            if let (Some(name), Ok(mut f)) = (name, found.lock()) {
                *f = name;
            }
            Ok(n)
        }
    })
    .await
    .with_context(in_setup("the operator's WatchConfig for Module objects"))?;
    let watch_name = found.lock().map(|f| f.clone()).unwrap_or_default();
    let admin = hub.admin.clone();
    let running = Arc::new(Mutex::new(vec![false; b.runtimes]));
    wait_for(
        &format!("agents running the watch {watch_name}"),
        b.runtimes,
        setup_started,
        limit,
        &mut operator,
        || count_running(&admin, &watch_name, running.clone()),
    )
    .await
    .with_context(in_setup("every agent running the watch of Module objects"))?;

    // The bench's own watches of every runtime cluster's Module objects.
    let times: Shared = Arc::default();
    let stop = CancellationToken::new();
    let _stop_tasks = stop.clone().drop_guard();
    let listed = Arc::new(AtomicUsize::new(0));
    let mut tasks = Vec::with_capacity(b.runtimes + 1);
    for (i, c) in clients.iter().enumerate() {
        let api: Api<DynamicObject> = Api::all_with(c.clone(), &module_ar);
        tasks.push(tokio::spawn(watch_modules(i, api, times.clone(), listed.clone(), stop.clone())));
    }
    wait_for("the bench's watches of Module objects listed", b.runtimes, setup_started, limit, &mut operator, || {
        let n = listed.load(Ordering::Relaxed);
        async move { Ok(n) }
    })
    .await?;
    // The bench's subscription (and, with --stand-in, the status writer).
    let files = TlsFiles {
        cert: dir.join("subscriber-bench.crt"),
        key: dir.join("subscriber-bench.key"),
        ca: vec![dir.join("ca.crt")],
    };
    let mut opts = SubscriberOptions::new(
        HubUrls::new(vec![hub.wss.clone()])?,
        Arc::new(fleetwatch_certs::client_config(&files)?),
    );
    opts.from = StartFrom::Latest;
    let sub = Subscription::connect(opts).await.context("the bench's hub subscription")?;
    let writer = b.stand_in.then(|| clients.clone());
    tasks.push(tokio::spawn(follow_hub(sub, times.clone(), writer, module_ar.clone(), stop.clone())));
    if b.stand_in {
        operator.stop().await;
        eprintln!("stand-in: the lifecycle operator stopped; the bench writes each Module's status");
    }
    let setup_secs = setup_started.elapsed().as_secs_f64();
    eprintln!("set up in {setup_secs:.1} s; creating {total} Module objects at {}/s", b.rate);

    // The measurement.
    let operator_pid = (!b.stand_in).then(|| operator.child.id()).flatten();
    let sim_pids: Vec<u32> = sims.iter().filter_map(SimProcess::pid).collect();
    let cpu = |pid: Option<u32>| pid.and_then(super::cpu_seconds).unwrap_or(0.0);
    let cpu_now = || Cpu {
        hub: cpu(Some(hub_pid)),
        operator: cpu(operator_pid),
        sims: sim_pids.iter().map(|p| cpu(Some(*p))).sum(),
        bench: cpu(Some(std::process::id())),
    };
    let reconciles = || async {
        if b.stand_in {
            return (0.0, 0.0);
        }
        let n = operator.sample("fleetwatch_lifecycle_reconciles_total").await.unwrap_or(0.0);
        let s = operator.sample("fleetwatch_lifecycle_reconcile_seconds_total").await.unwrap_or(0.0);
        (n, s)
    };
    let durations = || async {
        let text = super::metrics_text(&operator.metrics).await.unwrap_or_default();
        buckets(&text, "fleetwatch_lifecycle_reconcile_duration_seconds")
    };
    let cpu0 = cpu_now();
    let rec0 = reconciles().await;
    let durations0 = durations().await;
    let t0 = Instant::now();
    let create_errors: Arc<Mutex<Vec<String>>> = Arc::default();
    let stride = stride(b.runtimes);
    let mut tick = tokio::time::interval(Duration::from_secs_f64(1.0 / b.rate));
    let mut creates = Vec::with_capacity(total);
    // The operator's trigger queue and reconciles in flight, four times a second.
    let sampling = CancellationToken::new();
    let sampler = (!b.stand_in).then(|| tokio::spawn(sample_operator(operator.metrics.clone(), sampling.clone())));
    for k in 0..total {
        tick.tick().await;
        let i = (k * stride) % b.runtimes;
        let name = format!("{USER}{}", k / b.runtimes);
        let api: Api<DynamicObject> = Api::all_with(clients[i].clone(), &module_ar);
        let (times, errors) = (times.clone(), create_errors.clone());
        creates.push(tokio::spawn(async move {
            let obj = user_module(&name);
            match api.create(&PostParams::default(), &obj).await {
                Ok(_) => {
                    let (now, wall) = (Instant::now(), jiff::Timestamp::now());
                    if let Ok(mut t) = times.lock() {
                        t.created_wall.insert((i, name.clone()), wall);
                        t.created.insert((i, name), now);
                    }
                }
                Err(e) => {
                    if let Ok(mut errs) = errors.lock() {
                        errs.push(format!("rt{i} {name}: {e}"));
                    }
                }
            }
        }));
    }
    for c in creates {
        let _ = c.await;
    }
    let created_at = t0.elapsed().as_secs_f64();
    // Until every created object has its status, or its time is up.
    let timeout = Duration::from_secs_f64(b.timeout);
    loop {
        let (pending, last) = {
            let t = times.lock().map_err(|_| anyhow::anyhow!("a bench task panicked"))?;
            let pending = t.created.keys().filter(|k| !t.state.contains_key(*k)).count();
            (pending, t.created.values().max().copied())
        };
        if pending == 0 || last.is_none_or(|l| l.elapsed() > timeout) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let wall = t0.elapsed().as_secs_f64();
    sampling.cancel();
    let samples = match sampler {
        Some(s) => s.await.unwrap_or_default(),
        None => Samples::default(),
    };
    let max_queue = samples.queue_max;
    let in_flight_mean = samples.in_flight.iter().sum::<f64>() / samples.in_flight.len().max(1) as f64;
    let in_flight_max = samples.in_flight.iter().copied().fold(0.0, f64::max);
    let at_limit = samples.in_flight.iter().filter(|n| **n >= f64::from(b.concurrency)).count();
    let cpu1 = cpu_now();
    let rec1 = reconciles().await;
    let durations1 = durations().await;
    // The watches and the subscription end before the processes they talk to.
    stop.cancel();
    let _ = tokio::time::timeout(Duration::from_secs(10), futures_util::future::join_all(tasks)).await;

    // The figures.
    let times = times.lock().map_err(|_| anyhow::anyhow!("a bench task panicked"))?;
    let mut total_us = Vec::new();
    let mut hub_us = Vec::new();
    let mut rest_us = Vec::new();
    let mut lost = Vec::new();
    let mut ready_us = Vec::new();
    let mut first_states: std::collections::BTreeMap<String, usize> = Default::default();
    for (key, created) in &times.created {
        let state = times.state.get(key).filter(|(s, _)| s.saturating_duration_since(*created) <= timeout);
        match state {
            Some((s, first)) => {
                total_us.push(s.saturating_duration_since(*created).as_micros() as u64);
                *first_states.entry(first.clone()).or_default() += 1;
            }
            None => lost.push(format!("rt{} {}", key.0, key.1)),
        }
        let state = state.map(|(s, _)| s);
        if let Some(r) = times.ready.get(key) {
            ready_us.push(r.saturating_duration_since(*created).as_micros() as u64);
        }
        if let Some(h) = times.at_hub.get(key) {
            hub_us.push(h.saturating_duration_since(*created).as_micros() as u64);
            if let Some(s) = state {
                rest_us.push(s.saturating_duration_since(*h).as_micros() as u64);
            }
        }
    }
    // From the operator's log: when it queued a reconcile for each object's event.
    let triggered = if b.stand_in { HashMap::new() } else { triggers(&std::fs::read_to_string(&operator.log)?) };
    // From the events' time: when the agent saw each change (it may be before the create
    // returned, by the create's response time).
    let mut to_agent_us: Vec<u64> = times
        .created_wall
        .iter()
        .filter_map(|(key, c)| times.agent_saw.get(key).map(|(a, _)| micros_between(*c, *a)))
        .collect();
    to_agent_us.sort_unstable();
    let mut to_trigger_us = Vec::new();
    let mut trigger_to_state_us = Vec::new();
    for (key, created) in &times.created_wall {
        let Some(t) = triggered.get(key) else { continue };
        to_trigger_us.push(micros_between(*created, *t));
        if let Some(s) = times.state_wall.get(key) {
            trigger_to_state_us.push(micros_between(*t, *s));
        }
    }
    to_trigger_us.sort_unstable();
    trigger_to_state_us.sort_unstable();
    let reconcile_quantiles = [0.5, 0.9, 0.99].map(|p| bucket_quantile(&durations0, &durations1, p) * 1000.0);
    let reconcile_max_le = bucket_quantile(&durations0, &durations1, 1.0) * 1000.0;
    let slow_reconciles = observed_above(&durations0, &durations1, 1.0);
    total_us.sort_unstable();
    hub_us.sort_unstable();
    rest_us.sort_unstable();
    ready_us.sort_unstable();
    lost.sort();
    if let Some(path) = &b.per_object {
        let ms = |from: &Instant, to: Option<&Instant>| {
            to.map(|t| format!("{:.1}", t.saturating_duration_since(*from).as_secs_f64() * 1000.0)).unwrap_or_default()
        };
        let mut csv = String::from(
            "runtime,module,created_s,to_agent_ms,batch,to_hub_subscriber_ms,to_operator_trigger_ms,to_state_ms,state,to_ready_ms\n",
        );
        let mut keys: Vec<_> = times.created.keys().collect();
        keys.sort();
        for key in keys {
            let created = &times.created[key];
            let trigger = times.created_wall.get(key).zip(triggered.get(key)).map(|(c, t)| micros_between(*c, *t));
            let state = times.state.get(key);
            let saw = times.created_wall.get(key).zip(times.agent_saw.get(key));
            csv += &format!(
                "rt{},{},{:.3},{},{},{},{},{},{},{}\n",
                key.0,
                key.1,
                created.saturating_duration_since(t0).as_secs_f64(),
                saw.map(|(c, (a, _))| format!(
                    "{:.1}",
                    a.as_microsecond().saturating_sub(c.as_microsecond()) as f64 / 1000.0
                ))
                .unwrap_or_default(),
                saw.map(|(_, (_, n))| n.to_string()).unwrap_or_default(),
                ms(created, times.at_hub.get(key)),
                trigger.map(|us| format!("{:.1}", us as f64 / 1000.0)).unwrap_or_default(),
                ms(created, state.map(|(s, _)| s)),
                state.map(|(_, st)| st.as_str()).unwrap_or_default(),
                ms(created, times.ready.get(key)),
            );
        }
        std::fs::write(path, csv).with_context(|| format!("writing {}", path.display()))?;
        // The operator's log beside it (its trigger lines name what each reconcile was for).
        let mut log_copy = path.clone().into_os_string();
        log_copy.push(".lifecycle.log");
        std::fs::copy(&operator.log, &log_copy)
            .with_context(|| format!("copying the operator's log to {log_copy:?}"))?;
    }
    let errors = create_errors.lock().map_err(|_| anyhow::anyhow!("a bench task panicked"))?.clone();
    let pct = |a: f64, b: f64| (b - a) / wall * 100.0;
    let cpu_percent = Cpu {
        hub: pct(cpu0.hub, cpu1.hub),
        operator: pct(cpu0.operator, cpu1.operator),
        sims: pct(cpu0.sims, cpu1.sims),
        bench: pct(cpu0.bench, cpu1.bench),
    };
    let reconciled = rec1.0 - rec0.0;
    let reconcile_mean_ms = if reconciled > 0.0 { (rec1.1 - rec0.1) / reconciled * 1000.0 } else { f64::NAN };
    let q = |v: &[u64]| Quantiles {
        n: v.len(),
        p50: percentile(v, 0.5),
        p90: percentile(v, 0.9),
        p99: percentile(v, 0.99),
        max: percentile(v, 1.0),
    };
    let (all, to_hub, rest, ready) = (q(&total_us), q(&hub_us), q(&rest_us), q(&ready_us));
    let (to_trigger, trigger_to_state, to_agent) = (q(&to_trigger_us), q(&trigger_to_state_us), q(&to_agent_us));
    let writer_name = if b.stand_in { "the bench (stand-in)" } else { "the lifecycle operator" };
    let line = |label: &str, q: &Quantiles, tail: String| {
        println!(
            "{label:<38} p50 {:>7.1} ms, p90 {:>7.1} ms, p99 {:>7.1} ms, max {:>7.1} ms{tail}",
            q.p50, q.p90, q.p99, q.max
        );
    };
    println!(
        "{:<38} {} (one sim cluster and one agent each, in {} sim processes), {} central modules each",
        "runtimes:",
        b.runtimes,
        sims.len(),
        b.central_modules
    );
    println!(
        "{:<38} {} of {total} created ({} failed) at {}/s in {created_at:.1} s; status writer: {writer_name}",
        "creations:",
        times.created.len(),
        errors.len(),
        b.rate
    );
    let lost_line = format!(" ({} measured, {} lost: no status within {} s)", all.n, lost.len(), b.timeout);
    line("apply → status.state:", &all, lost_line);
    line("  apply → the agent saw it:", &to_agent, " (the event's time)".into());
    line("  apply → event at the bench's sub.:", &to_hub, format!(" ({} seen)", to_hub.n));
    line("  that event → status.state:", &rest, String::new());
    if !b.stand_in {
        line("  apply → operator's trigger queued:", &to_trigger, format!(" ({} found in its log)", to_trigger.n));
        line("  trigger → status.state:", &trigger_to_state, String::new());
        let [r50, r90, r99] = reconcile_quantiles;
        println!(
            "{:<38} p50 ≤ {r50:.0} ms, p90 ≤ {r90:.0} ms, p99 ≤ {r99:.0} ms, max ≤ {reconcile_max_le:.0} ms; {slow_reconciles:.0} over 1 s (its histogram: every reconcile of the run)",
            "  reconcile durations:"
        );
    }
    let firsts: Vec<String> = first_states.iter().map(|(s, n)| format!("{s} {n}")).collect();
    println!("{:<38} {}", "  first state written:", firsts.join(", "));
    if ready.n > 0 {
        line("apply → Ready:", &ready, format!(" ({} Ready within the run)", ready.n));
    }
    println!(
        "{:<38} hub {:.0} %, lifecycle {:.0} %, sims + agents {:.0} % ({} processes), bench {:.0} % (control plane, watches, creates)",
        format!("CPU over {wall:.1} s:"),
        cpu_percent.hub,
        cpu_percent.operator,
        cpu_percent.sims,
        sims.len(),
        cpu_percent.bench
    );
    if !b.stand_in {
        println!(
            "{:<38} {reconciled:.0} reconciles ({:.1}/s), mean {reconcile_mean_ms:.1} ms, trigger queue at most {max_queue:.0}",
            "lifecycle:",
            reconciled / wall
        );
        println!(
            "{:<38} mean {in_flight_mean:.1}, at most {in_flight_max:.0} of --concurrency {}; at the limit in {at_limit} of {} samples",
            "  reconciles in flight (every 250 ms):",
            b.concurrency,
            samples.in_flight.len()
        );
    }
    for l in lost.iter().take(10) {
        eprintln!("lost: {l}");
    }
    for e in errors.iter().take(10) {
        eprintln!("create failed: {e}");
    }
    if b.json {
        let quantiles = |q: &Quantiles| serde_json::json!({"n": q.n, "p50_ms": q.p50, "p90_ms": q.p90, "p99_ms": q.p99, "max_ms": q.max});
        println!(
            "{}",
            serde_json::json!({"bench": "self-service", "runtimes": b.runtimes, "central_modules": b.central_modules,
                "rate": b.rate, "duration": b.duration, "stand_in": b.stand_in, "sim_processes": sims.len(),
                "setup_s": setup_secs, "offered": total, "created": times.created.len(), "create_errors": errors.len(),
                "measured": all.n, "lost": lost.len(), "timeout_s": b.timeout,
                "p50_ms": all.p50, "p90_ms": all.p90, "p99_ms": all.p99, "max_ms": all.max,
                "to_agent": quantiles(&to_agent), "to_hub_subscriber": quantiles(&to_hub), "hub_subscriber_to_status": quantiles(&rest),
                "first_states": first_states, "to_ready": quantiles(&ready),
                "to_operator_trigger": quantiles(&to_trigger), "operator_trigger_to_status": quantiles(&trigger_to_state),
                "reconcile_duration_le_ms": {"p50": reconcile_quantiles[0], "p90": reconcile_quantiles[1], "p99": reconcile_quantiles[2],
                    "max": reconcile_max_le}, "reconciles_over_1s": slow_reconciles,
                "wall_s": wall, "cpu_percent": {"hub": cpu_percent.hub, "lifecycle": cpu_percent.operator,
                    "sims": cpu_percent.sims, "bench": cpu_percent.bench},
                "reconciles": reconciled, "reconcile_mean_ms": reconcile_mean_ms, "queue_depth_max": max_queue,
                "concurrency": b.concurrency, "in_flight_mean": in_flight_mean, "in_flight_max": in_flight_max,
                "in_flight_samples": samples.in_flight.len(), "in_flight_at_limit": at_limit})
        );
    }
    drop(operator);
    drop(sims);
    drop(hub);
    Ok(())
}

/// The last lines of a log file, for an error.
fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

/// What the operator's metrics said during the measurement.
#[derive(Default)]
struct Samples {
    /// The largest trigger queue depth seen.
    queue_max: f64,
    /// Reconciles in flight, one value per sample.
    in_flight: Vec<f64>,
}

/// Samples the operator's trigger queue and reconciles in flight every 250 ms until `stop`.
async fn sample_operator(metrics: String, stop: CancellationToken) -> Samples {
    let mut s = Samples::default();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    loop {
        tokio::select! {
            _ = stop.cancelled() => return s,
            _ = tick.tick() => {}
        }
        let Some(text) = super::metrics_text(&metrics).await else { continue };
        let value =
            |name: &str| text.lines().find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.trim().parse::<f64>().ok());
        s.queue_max = s.queue_max.max(value("fleetwatch_lifecycle_queue_depth").unwrap_or(0.0));
        if let Some(n) = value("fleetwatch_lifecycle_reconciles_in_flight") {
            s.in_flight.push(n);
        }
    }
}

/// CPU seconds (or percent) by process.
struct Cpu {
    hub: f64,
    operator: f64,
    sims: f64,
    bench: f64,
}

/// Quantiles of one latency, in milliseconds.
struct Quantiles {
    n: usize,
    p50: f64,
    p90: f64,
    p99: f64,
    max: f64,
}

/// A step through the runtimes that visits each once per round and spreads consecutive
/// creations over the sim processes: a prime that does not divide `n` (else 1).
fn stride(n: usize) -> usize {
    const PRIME: usize = 7_919;
    if n.is_multiple_of(PRIME) { 1 } else { PRIME }
}

/// What a user applies: `Module` `name` with an empty spec (the Runtime's channel, policy
/// `CreateAndDelete`).
fn user_module(name: &str) -> DynamicObject {
    let ar = ApiResource::erase::<Module>(&());
    let mut obj = DynamicObject::new(name, &ar);
    obj.data = serde_json::json!({"spec": {}});
    obj
}

/// A client from a kubeconfig's text.
async fn client_for(kubeconfig: &str) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::from_yaml(kubeconfig)?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// Whether a WatchConfig watches `Module` objects in runtime clusters.
fn watches_modules(w: &WatchConfig) -> bool {
    w.spec.resource.group == Module::group(&()) && w.spec.resource.kind == Module::kind(&())
}

/// Polls `count` until it reaches `want` (printing progress every 10 s), or fails once
/// `limit` has passed since `since` or when the `operator` exits.
async fn wait_for<F, Fut>(
    what: &str,
    want: usize,
    since: Instant,
    limit: Duration,
    operator: &mut Operator,
    mut count: F,
) -> anyhow::Result<()>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<usize>>,
{
    let mut progress_at = Instant::now() + Duration::from_secs(10);
    loop {
        operator.running()?;
        let asked = Instant::now();
        let n = match count().await {
            Ok(n) => n,
            Err(e) => {
                tracing::debug!(error = %e, "{what}: not known yet");
                0
            }
        };
        if n >= want {
            eprintln!("{what}: {n} after {:.1} s", since.elapsed().as_secs_f64());
            return Ok(());
        }
        if since.elapsed() > limit {
            bail!("{what}: only {n} of {want} after {:.0} s (--setup-wait)", since.elapsed().as_secs_f64());
        }
        if Instant::now() >= progress_at {
            eprintln!("{what}: {n} of {want} after {:.0} s", since.elapsed().as_secs_f64());
            progress_at += Duration::from_secs(10);
        }
        // A list of a thousand objects competes with the fleet for the CPU: at most a third
        // of the time.
        tokio::time::sleep(Duration::from_millis(250).max(asked.elapsed() * 2)).await;
    }
}

/// How many clusters' agents run the watch `watch` (phase `running`), by the hub's admin API
/// (`running` remembers the clusters found so, which are not asked again).
async fn count_running(admin: &str, watch: &str, running: Arc<Mutex<Vec<bool>>>) -> anyhow::Result<usize> {
    let pending: Vec<usize> = {
        let r = running.lock().map_err(|_| anyhow::anyhow!("a bench task panicked"))?;
        r.iter().enumerate().filter(|(_, ok)| !**ok).map(|(i, _)| i).collect()
    };
    let asks = pending.into_iter().map(|i| async move {
        let response = super::http_get(admin, &format!("/api/v1/clusters/rt{i}")).await.unwrap_or_default();
        let body = response.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or_default();
        let cluster: serde_json::Value = serde_json::from_str(body).unwrap_or_default();
        let ok = cluster["watches"]
            .as_array()
            .is_some_and(|ws| ws.iter().any(|w| w["name"] == watch && w["phase"] == "running"));
        (i, ok)
    });
    let found: Vec<(usize, bool)> = futures_util::stream::iter(asks).buffer_unordered(16).collect().await;
    let mut r = running.lock().map_err(|_| anyhow::anyhow!("a bench task panicked"))?;
    for (i, ok) in found {
        r[i] |= ok;
    }
    Ok(r.iter().filter(|ok| **ok).count())
}

/// How many runtime clusters serve the `Module` kind (its CRD established).
async fn count_serving(clients: &[kube::Client]) -> anyhow::Result<usize> {
    let serving = clients.iter().map(|c| async move {
        let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
        let crd = crds.get_opt(MODULE_CRD).await.ok().flatten();
        crd.and_then(|c| c.status)
            .and_then(|s| s.conditions)
            .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Established" && c.status == "True"))
    });
    let found: Vec<bool> = futures_util::stream::iter(serving).buffer_unordered(32).collect().await;
    Ok(found.into_iter().filter(|s| *s).count())
}

/// `--stand-in`: the `Module` CRD in every runtime cluster and a WatchConfig for `Module`
/// objects in the control plane, where the operator did not put them.
async fn stand_in_setup(cp: &kube::Client, clients: &[kube::Client]) -> anyhow::Result<()> {
    let crd = serde_json::to_value(Module::crd())?;
    let installs = clients.iter().enumerate().map(|(i, c)| {
        let crd = crd.clone();
        async move {
            let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
            if crds.get_opt(MODULE_CRD).await?.is_none() {
                fleetwatch_client::kube_apply::apply(c, "bench", &crd)
                    .await
                    .with_context(|| format!("the Module CRD in runtime cluster rt{i}"))?;
            }
            Ok::<(), anyhow::Error>(())
        }
    });
    let mut installs = std::pin::pin!(futures_util::stream::iter(installs).buffer_unordered(32));
    while let Some(done) = installs.next().await {
        done?;
    }
    let watchconfigs: Api<WatchConfig> = Api::all(cp.clone());
    if !watchconfigs.list(&Default::default()).await?.items.iter().any(watches_modules) {
        let wc = WatchConfig::new(
            "bench.modules",
            WatchConfigSpec {
                resource: ResourceRef {
                    group: Module::group(&()).into(),
                    version: Module::version(&()).into(),
                    kind: Module::kind(&()).into(),
                },
                fields: vec!["spec".into(), "metadata.deletionTimestamp".into()],
                ..Default::default()
            },
        );
        watchconfigs
            .create(&PostParams::default(), &wc)
            .await
            .context("the stand-in's WatchConfig for Module objects")?;
    }
    Ok(())
}

/// Watches runtime cluster `i`'s `Module` objects: counts `listed` once its first list is
/// in, and records when each user object first shows `status.state`.
async fn watch_modules(
    i: usize,
    api: Api<DynamicObject>,
    times: Shared,
    listed: Arc<AtomicUsize>,
    stop: CancellationToken,
) {
    let events = watcher(api, watcher::Config::default()).default_backoff();
    let mut events = std::pin::pin!(events);
    let mut counted = false;
    loop {
        let ev = tokio::select! {
            _ = stop.cancelled() => return,
            ev = events.next() => match ev {
                Some(Ok(ev)) => ev,
                Some(Err(e)) => {
                    tracing::debug!(cluster = %format!("rt{i}"), error = %e, "watch of Module objects");
                    continue;
                }
                None => return,
            },
        };
        let obj = match ev {
            watcher::Event::Apply(o) | watcher::Event::InitApply(o) => o,
            watcher::Event::InitDone => {
                if !counted {
                    counted = true;
                    listed.fetch_add(1, Ordering::Relaxed);
                }
                continue;
            }
            watcher::Event::Init | watcher::Event::Delete(_) => continue,
        };
        let (now, wall) = (Instant::now(), jiff::Timestamp::now());
        let Some(name) = obj.metadata.name.as_deref() else { continue };
        let Some(state) = obj.data["status"]["state"].as_str().filter(|s| !s.is_empty()) else { continue };
        if !name.starts_with(USER) {
            continue;
        }
        if let Ok(mut t) = times.lock() {
            t.state.entry((i, name.to_string())).or_insert_with(|| (now, state.to_string()));
            t.state_wall.entry((i, name.to_string())).or_insert(wall);
            if state == "Ready" {
                t.ready.entry((i, name.to_string())).or_insert(now);
            }
        }
    }
}

/// Microseconds from `a` to `b` (0 if `b` is earlier).
fn micros_between(a: jiff::Timestamp, b: jiff::Timestamp) -> u64 {
    u64::try_from(b.as_microsecond() - a.as_microsecond()).unwrap_or(0)
}

/// A histogram's cumulative buckets in a metrics text: `(le, count)`, `+Inf` last.
fn buckets(text: &str, name: &str) -> Vec<(f64, f64)> {
    let prefix = format!("{name}_bucket{{le=\"");
    text.lines()
        .filter_map(|l| {
            let rest = l.strip_prefix(&prefix)?;
            let (le, rest) = rest.split_once('"')?;
            let le = if le == "+Inf" { f64::INFINITY } else { le.parse().ok()? };
            Some((le, rest.rsplit(' ').next()?.parse().ok()?))
        })
        .collect()
}

/// The upper bound (`le`) of the bucket holding quantile `p` of what was observed between
/// two samples of one histogram; NaN when nothing was.
fn bucket_quantile(before: &[(f64, f64)], after: &[(f64, f64)], p: f64) -> f64 {
    let diff: Vec<(f64, f64)> =
        after.iter().map(|(le, n)| (*le, n - before.iter().find(|(l, _)| l == le).map_or(0.0, |(_, m)| *m))).collect();
    let total = diff.last().map_or(0.0, |(_, n)| *n);
    if total <= 0.0 {
        return f64::NAN;
    }
    diff.iter().find(|(_, n)| *n >= p * total).map_or(f64::NAN, |(le, _)| *le)
}

/// How many observations between two samples of one histogram were above `le` (a bucket
/// bound): the `+Inf` count minus that bucket's.
fn observed_above(before: &[(f64, f64)], after: &[(f64, f64)], le: f64) -> f64 {
    let at = |h: &[(f64, f64)], bound: f64| h.iter().find(|(l, _)| *l == bound).map_or(0.0, |(_, n)| *n);
    (at(after, f64::INFINITY) - at(before, f64::INFINITY)) - (at(after, le) - at(before, le))
}

/// From the operator's JSON log: when it queued a reconcile for each user `Module`'s event
/// (its line `reconciling after a change in the runtime cluster`, which names the Runtime
/// and up to three changes), first time per runtime index and module.
fn triggers(log: &str) -> HashMap<(usize, String), jiff::Timestamp> {
    let mut out = HashMap::new();
    for line in log.lines() {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else { continue };
        let f = &v["fields"];
        if !f["message"].as_str().is_some_and(|m| m.starts_with("reconciling after a change in the runtime cluster")) {
            continue;
        }
        let Some(i) = f["runtime"].as_str().and_then(|r| r.rsplit_once('/')).and_then(|(_, n)| runtime_index(n)) else {
            continue;
        };
        let Some(at) = v["timestamp"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok()) else { continue };
        let changes = f["changes"].as_str().unwrap_or_default();
        for part in changes.split(", ") {
            let Some(subject) = part.split_whitespace().nth(1) else { continue };
            if let Some(name) = module_name(subject).filter(|n| n.starts_with(USER)) {
                out.entry((i, name.to_string())).or_insert(at);
            }
        }
    }
    out
}

/// The runtime index of cluster `rt<i>`.
fn runtime_index(cluster: &str) -> Option<usize> {
    cluster.strip_prefix("rt")?.parse().ok()
}

/// The name in a `Module` event's subject (`operator.fleetwatch.dev/v1alpha1/Module/_/NAME`).
fn module_name(subject: &str) -> Option<&str> {
    let (kind_path, name) = subject.rsplit_once('/')?;
    kind_path.ends_with("/Module/_").then_some(name)
}

/// Follows the hub as the bench's subscriber: records when each user `Module`'s first event
/// arrives and, with `writer` (`--stand-in`: the runtime clusters' clients), writes its
/// status at once.
async fn follow_hub(
    mut sub: Subscription,
    times: Shared,
    writer: Option<Vec<kube::Client>>,
    ar: ApiResource,
    stop: CancellationToken,
) {
    loop {
        let d = tokio::select! {
            _ = stop.cancelled() => return,
            d = sub.next() => match d {
                Ok(d) => d,
                Err(e) => {
                    eprintln!("the bench's hub subscription failed: {e}");
                    return;
                }
            },
        };
        let now = Instant::now();
        if let Delivery::Events(evs) = &d {
            for e in evs.iter() {
                let (Some(i), Some(name)) = (runtime_index(&e.cluster), module_name(&e.subject)) else { continue };
                if !name.starts_with(USER) {
                    continue;
                }
                let same_cluster = evs.iter().filter(|o| o.cluster == e.cluster).count();
                let first = times
                    .lock()
                    .map(|mut t| {
                        let key = (i, name.to_string());
                        let new = !t.at_hub.contains_key(&key);
                        t.agent_saw.entry(key.clone()).or_insert((e.time, same_cluster));
                        t.at_hub.entry(key).or_insert(now);
                        new
                    })
                    .unwrap_or(false);
                if first && let Some(client) = writer.as_ref().and_then(|w| w.get(i)) {
                    let api: Api<DynamicObject> = Api::all_with(client.clone(), &ar);
                    let name = name.to_string();
                    tokio::spawn(async move {
                        let status = serde_json::json!({"status": {"state": "Processing", "source": "user",
                            "message": "stand-in: written by the bench on the hub event"}});
                        if let Err(e) = api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&status)).await {
                            eprintln!("stand-in: cannot write the status of rt{i} {name}: {e}");
                        }
                    });
                }
            }
        }
        if let Some(c) = d.last_cursor()
            && sub.ack(c).await.is_err()
        {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn module_events_name_their_object() {
        assert_eq!(module_name("operator.fleetwatch.dev/v1alpha1/Module/_/u3"), Some("u3"));
        assert_eq!(module_name("v1/Namespace/_/u3-system"), None);
        assert_eq!(module_name("apps/v1/Deployment/u0-system/manager"), None);
        assert_eq!(runtime_index("rt42"), Some(42));
        assert_eq!(runtime_index("control-plane"), None);
    }

    #[test]
    fn trigger_lines_of_the_operator_name_runtime_and_modules() {
        let log = [
            r#"{"timestamp":"2026-11-28T09:00:00.000100Z","level":"INFO","fields":{"message":"reconciling after a change in the runtime cluster (hub event)","runtime":"kcp/rt7","cluster":"rt7","changes":"applied operator.fleetwatch.dev/v1alpha1/Module/_/u1, applied v1/Namespace/_/u1-system"},"target":"fleetwatch_lifecycle::triggers"}"#,
            r#"{"timestamp":"2026-11-28T09:00:01Z","level":"INFO","fields":{"message":"reconciling after a change in the runtime cluster (hub event)","runtime":"kcp/rt7","cluster":"rt7","changes":"applied operator.fleetwatch.dev/v1alpha1/Module/_/u1"},"target":"fleetwatch_lifecycle::triggers"}"#,
            r#"{"timestamp":"2026-11-28T09:00:02Z","level":"WARN","fields":{"message":"something else"},"target":"x"}"#,
            "not json",
        ]
        .join("\n");
        let t = triggers(&log);
        assert_eq!(t.len(), 1, "{t:?}");
        assert_eq!(t[&(7, "u1".to_string())].to_string(), "2026-11-28T09:00:00.0001Z");
    }

    #[test]
    fn reconcile_duration_quantiles_from_two_histogram_samples() {
        let name = "fleetwatch_lifecycle_reconcile_duration_seconds";
        let text = |a: u32, b: u32, c: u32| {
            format!(
                "{name}_bucket{{le=\"0.01\"}} {a}\n{name}_bucket{{le=\"0.1\"}} {b}\n{name}_bucket{{le=\"+Inf\"}} {c}\n{name}_count {c}\n"
            )
        };
        let before = buckets(&text(5, 5, 5), name);
        assert_eq!(before, [(0.01, 5.0), (0.1, 5.0), (f64::INFINITY, 5.0)]);
        // 100 more: 90 within 10 ms, 9 within 100 ms, 1 beyond.
        let after = buckets(&text(95, 104, 105), name);
        assert_eq!(bucket_quantile(&before, &after, 0.5), 0.01);
        assert_eq!(bucket_quantile(&before, &after, 0.9), 0.01);
        assert_eq!(bucket_quantile(&before, &after, 0.99), 0.1);
        assert_eq!(bucket_quantile(&before, &after, 1.0), f64::INFINITY);
        assert!(bucket_quantile(&after, &after, 0.5).is_nan());
        assert_eq!(observed_above(&before, &after, 0.1), 1.0);
        assert_eq!(observed_above(&before, &after, 0.01), 10.0);
    }

    #[test]
    fn the_stride_visits_every_runtime_once_per_round() {
        for n in [1, 3, 7, 1000, 7919, 15838] {
            let s = stride(n);
            let mut seen: Vec<usize> = (0..n).map(|k| (k * s) % n).collect();
            seen.sort_unstable();
            seen.dedup();
            assert_eq!(seen.len(), n, "n = {n}");
        }
    }

    #[test]
    fn a_user_module_is_a_named_module_object() {
        let m = user_module("u7");
        let v = serde_json::to_value(&m).unwrap();
        assert_eq!(v["apiVersion"], "operator.fleetwatch.dev/v1alpha1");
        assert_eq!(v["kind"], "Module");
        assert_eq!(v["metadata"]["name"], "u7");
        assert!(v["metadata"].get("namespace").is_none());
    }
}
