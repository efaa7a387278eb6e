//! The agent fleet restarted in waves of a third through the other hub replica (issue 31's
//! rolling upgrade of the agents): every change known, one resync marker per agent process.

use super::*;

/// What the load writer of [`agent_fleet_restarted_in_waves_loses_nothing`] did.
#[derive(Default)]
struct Written {
    /// (cluster index, subject) → when the last write that changed the object returned.
    at: HashMap<(usize, String), Instant>,
    /// Writes that changed an object, per cluster.
    per_cluster: Vec<u64>,
    writes: u64,
    deletes: u64,
    errors: Vec<String>,
}

/// The cluster's entry in a hub's `/api/v1/clusters`.
async fn cluster_entry(hub: &HubProc, cluster: &str) -> serde_json::Value {
    let body = hub.clusters().await;
    body["clusters"].as_array().and_then(|l| l.iter().find(|c| c["cluster"] == cluster).cloned()).unwrap_or_default()
}

/// Whether the cluster entry `c` (of [`cluster_entry`]) says its agent is connected in an
/// epoch other than `old` (a new process) and its watch runs.
fn in_new_epoch(c: &serde_json::Value, old: Option<u64>) -> bool {
    let running = c["watches"].as_array().is_some_and(|w| !w.is_empty() && w.iter().all(|s| s["phase"] == "running"));
    c["connected"] == true && c["epoch"].as_u64().is_some_and(|e| Some(e) != old) && running
}

/// Waits, without blocking the runtime, for `p` to exit; its exit code (`-1` for a signal).
async fn exit_of(p: &mut Proc, within: Duration) -> Option<i32> {
    let mut status = None;
    holds_within(within, || {
        status = p.child.try_wait().unwrap();
        status.is_some()
    })
    .await;
    status.map(|s| s.code().unwrap_or(-1))
}

/// Every object of cluster `index` whose final state the subscriber cannot know, one line
/// each, and how many it knows only through a resync. Per object the subscriber knows the
/// latest event it got, or, when a `resync-required` for the cluster (or `*`) arrived after
/// that event and after the write that made the final state, the re-list it then makes.
fn unknown_finals(
    seen: &Seen,
    index: usize,
    finals: &HashMap<String, String>,
    written: &HashMap<(usize, String), Instant>,
) -> (Vec<String>, usize) {
    let cluster = format!("rt-{index}");
    let mut latest: HashMap<&str, (usize, &fleetwatch_protocol::Event)> = HashMap::new();
    for (i, e) in seen.all.iter().enumerate() {
        if e.cluster == cluster && e.watch.as_deref() == Some("cms") {
            latest.insert(&e.subject, (i, e));
        }
    }
    let mut subjects: BTreeSet<&str> = finals.keys().map(String::as_str).collect();
    subjects.extend(latest.keys().copied());
    subjects.extend(written.keys().filter(|(c, _)| *c == index).map(|(_, s)| s.as_str()));
    let (mut problems, mut by_resync) = (Vec::new(), 0);
    for subject in subjects {
        let want = finals.get(subject);
        let got = latest.get(subject);
        let delivered = match (want, got) {
            (Some(v), Some((_, e))) => !e.is_delete() && e.data["projected"]["/data/v"] == v.as_str(),
            (None, Some((_, e))) => e.is_delete(),
            (None, None) => true,
            (Some(_), None) => false,
        };
        if delivered {
            continue;
        }
        let after_event = |before: usize| got.is_none_or(|(i, _)| before > *i);
        let written_at = written.get(&(index, subject.to_string()));
        let relisted = seen.resync_arrivals.iter().any(|(c, before, at)| {
            (*c == cluster || c == "*") && after_event(*before) && written_at.is_none_or(|w| at > w)
        });
        if relisted {
            by_resync += 1;
        } else {
            problems.push(format!(
                "{cluster} {subject}: final {want:?}, latest event {:?}",
                got.map(|(_, e)| (&e.kind, &e.data["projected"]))
            ));
        }
    }
    (problems, by_resync)
}

/// The agent fleet upgraded in waves: two hub replicas on one JetStream stream (as the hubs'
/// rolling test), six sim clusters each watched by a real agent process through a
/// WatchConfig, a writer changing, deleting and recreating ConfigMaps in every cluster
/// throughout, and a durable subscriber. A third of the agents at a time get SIGTERM (as a
/// rollout does), are started again (the next release is the same binary here) on the
/// other replica, and the next wave starts once each is back (connected in a new epoch, its
/// watch running). Per object the subscriber knows the final state (an event, or a re-list
/// at a `resync-required` that came after the write), every agent reconnects, and each
/// agent process costs exactly one resync marker: its start marker (the agent keeps no
/// digest across a restart, DESIGN "Relists do not force subscribers to resync"), nothing
/// more. The times per wave and the counts are printed (`--no-capture`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_fleet_restarted_in_waves_loses_nothing() {
    use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
    use kube::api::{Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
    use kube::discovery::ApiResource;

    const CLUSTERS: usize = 6;
    const WAVES: usize = 3;
    const OBJECTS: u64 = 20;
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let wc_dir = pki.path("watch-configs");
    std::fs::create_dir_all(&wc_dir).unwrap();
    let wc = json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": "cms"},
        "spec": {"resource": {"group": "", "version": "v1", "kind": "ConfigMap"}, "namespace": "load",
                 "fields": ["data"], "project": ["/data/v"]}
    });
    std::fs::write(wc_dir.join("cms.json"), wc.to_string()).unwrap();
    let wc_arg = wc_dir.display().to_string();
    let bus = ["--bus", &js.url(), "--bus-stream", "fleet", "--watch-config", &wc_arg];
    let hubs = [HubProc::start(&pki, free_port(), None, &bus), HubProc::start(&pki, free_port(), None, &bus)];

    let mut sims = Vec::new();
    let mut kubeconfigs = Vec::new();
    let mut cms: Vec<Api<DynamicObject>> = Vec::new();
    for i in 0..CLUSTERS {
        let (sim, kc) = sim_cluster(&pki, &format!("rt-{i}")).await;
        let client = sim.client().await.unwrap();
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "load"}})).unwrap();
        Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
        cms.push(Api::namespaced_with(client, "load", &ApiResource::erase::<ConfigMap>(&())));
        sims.push(sim);
        kubeconfigs.push(kc);
    }
    let name = |i: usize| format!("rt-{i}");
    // Agent `i` of generation `g` (starts so far) reaches replica (i + g) % 2: a restarted
    // agent comes back through the other replica, as behind a load balancer it may.
    let replica = |i: usize, g: usize| (i + g) % 2;
    let mut starts = [1usize; CLUSTERS];
    let mut agents: Vec<Proc> =
        (0..CLUSTERS).map(|i| kube_agent(&pki, &name(i), &hubs[replica(i, 1)].url(), &kubeconfigs[i])).collect();
    let collector = Collector::start(&pki, &hubs[0].url(), "checker").await;

    // The load: in every cluster a writer changes its 20 ConfigMaps in turn, every 7th write
    // a delete (the object is recreated at its next turn).
    let written = Arc::new(Mutex::new(Written { per_cluster: vec![0; CLUSTERS], ..Written::default() }));
    let stop = tokio_util::sync::CancellationToken::new();
    let writers: Vec<_> = (0..CLUSTERS)
        .map(|c| {
            let (api, stop, written) = (cms[c].clone(), stop.clone(), written.clone());
            tokio::spawn(async move {
                let mut i: u64 = 0;
                while !stop.is_cancelled() {
                    let n = i % OBJECTS;
                    let obj = format!("cm-{n}");
                    let subject = format!("v1/ConfigMap/load/{obj}");
                    let delete = i % 7 == 3;
                    let changed = if delete {
                        match api.delete(&obj, &DeleteParams::default()).await {
                            Ok(_) => Ok(true),
                            Err(kube::Error::Api(e)) if e.code == 404 => Ok(false),
                            Err(e) => Err(format!("delete {subject} in rt-{c}: {e}")),
                        }
                    } else {
                        let body = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": obj},
                                          "data": {"v": i.to_string()}});
                        let patch = api.patch(&obj, &PatchParams::apply("writer").force(), &Patch::Apply(&body)).await;
                        patch.map(|_| true).map_err(|e| format!("apply {subject} in rt-{c}: {e}"))
                    };
                    {
                        let mut w = written.lock().unwrap();
                        match changed {
                            Ok(true) => {
                                w.at.insert((c, subject), Instant::now());
                                w.writes += 1;
                                w.per_cluster[c] += 1;
                                w.deletes += u64::from(delete);
                            }
                            Ok(false) => {}
                            Err(e) => {
                                // Whether it took effect is unknown: as late as it can have.
                                w.at.insert((c, subject), Instant::now());
                                w.errors.push(e);
                            }
                        }
                    }
                    i += 1;
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            })
        })
        .collect();
    // Waits until every cluster had `more` changes since `since` (the load runs throughout:
    // each wave starts, and the load stops, only after changes in every cluster).
    let changes = |w: &Mutex<Written>| w.lock().unwrap().per_cluster.clone();
    let load_went_on = async |since: &[u64], more: u64| {
        let ok = holds_within(Duration::from_secs(120), || {
            changes(&written).iter().zip(since).all(|(now, then)| *now >= then + more)
        })
        .await;
        assert!(ok, "the writers stalled: {since:?} → {:?}", changes(&written));
    };

    // Every agent runs its watch and its events reach the subscriber.
    for i in 0..CLUSTERS {
        eventually(format!("agent rt-{i} to start"))
            .within(Duration::from_secs(90))
            .context(|| agents[i].stderr())
            .until(async || cluster_entry(&hubs[replica(i, 1)], &name(i)).await, |c| in_new_epoch(c, None))
            .await;
    }
    let flowing = holds_within(Duration::from_secs(60), || {
        let seen = collector.seen.lock().unwrap();
        (0..CLUSTERS).all(|i| seen.all.iter().any(|e| e.cluster == name(i)))
    })
    .await;
    assert!(flowing, "not every cluster's events reach the subscriber:\n{}", hubs[0].proc.stderr());

    let started = Instant::now();
    let mut waves = Vec::new();
    for wave in 0..WAVES {
        load_went_on(&changes(&written), 2 * OBJECTS).await;
        let members: Vec<usize> = (0..CLUSTERS).filter(|i| i % WAVES == wave).collect();
        let mut old = HashMap::new();
        for &i in &members {
            let epoch = cluster_entry(&hubs[replica(i, starts[i])], &name(i)).await["epoch"].as_u64();
            assert!(epoch.is_some(), "no epoch for rt-{i}");
            old.insert(i, epoch);
        }
        let t = Instant::now();
        for &i in &members {
            agents[i].signal("TERM");
        }
        for &i in &members {
            let code = exit_of(&mut agents[i], Duration::from_secs(30)).await;
            assert_eq!(code, Some(0), "agent rt-{i} did not stop cleanly on SIGTERM:\n{}", agents[i].stderr());
        }
        let stopped = t.elapsed();
        for &i in &members {
            starts[i] += 1;
            agents[i] = kube_agent(&pki, &name(i), &hubs[replica(i, starts[i])].url(), &kubeconfigs[i]);
        }
        for &i in &members {
            let hub = &hubs[replica(i, starts[i])];
            eventually(format!("agent rt-{i} to be back in a new epoch after wave {wave}"))
                .within(Duration::from_secs(90))
                .context(|| agents[i].stderr())
                .until(async || cluster_entry(hub, &name(i)).await, |c| in_new_epoch(c, old[&i]))
                .await;
        }
        waves.push((stopped, t.elapsed()));
    }
    // Every process's start marker reached the subscriber while the load still ran.
    let started_markers = |seen: &Seen, i: usize| {
        seen.resyncs.get(&name(i)).map_or(0, |r| r.iter().filter(|(_, why)| why == "agent started").count())
    };
    let markers_in = holds_within(Duration::from_secs(60), || {
        let seen = collector.seen.lock().unwrap();
        (0..CLUSTERS).all(|i| started_markers(&seen, i) >= starts[i])
    })
    .await;
    assert!(markers_in, "start markers missing: {:?}", collector.seen.lock().unwrap().resyncs);
    load_went_on(&changes(&written), 2 * OBJECTS).await;
    stop.cancel();
    for w in writers {
        w.await.unwrap();
    }
    let load_stopped = Instant::now();
    let written = std::mem::take(&mut *written.lock().unwrap());
    assert!(written.errors.is_empty(), "writes failed: {:?}", written.errors);

    let mut finals = Vec::new();
    for api in &cms {
        finals.push(configmap_values(api, "load").await);
    }
    let check = |seen: &Seen| {
        let (mut problems, mut by_resync) = (Vec::new(), 0);
        for (i, f) in finals.iter().enumerate() {
            let (p, r) = unknown_finals(seen, i, f, &written.at);
            problems.extend(p);
            by_resync += r;
        }
        (problems, by_resync)
    };
    let done = holds_within(Duration::from_secs(120), || check(&collector.seen.lock().unwrap()).0.is_empty()).await;
    let delivered = load_stopped.elapsed();
    let seen = collector.seen.lock().unwrap();
    let (problems, by_resync) = check(&seen);
    assert!(
        done,
        "the subscriber does not know the final state of {} objects: {:#?}\nresyncs: {:?}\nhub a:\n{}\nhub b:\n{}",
        problems.len(),
        &problems[..8.min(problems.len())],
        seen.resyncs,
        hubs[0].proc.stderr(),
        hubs[1].proc.stderr()
    );
    // The check can fail: a final state no event carried, written after every resync (a
    // change, a delete), is reported.
    let (changed, deleted) = ("v1/ConfigMap/load/cm-0".to_string(), "v1/ConfigMap/load/cm-1".to_string());
    let mut fake = finals[0].clone();
    fake.insert(changed.clone(), "never-delivered".into());
    fake.remove(&deleted);
    let mut at = written.at.clone();
    at.insert((0, changed.clone()), Instant::now());
    at.insert((0, deleted.clone()), Instant::now());
    let (flagged, _) = unknown_finals(&seen, 0, &fake, &at);
    let named = |s: &str| flagged.iter().any(|l| l.contains(&format!("{s}:")));
    assert!(named(&changed) && (named(&deleted) || !finals[0].contains_key(&deleted)), "{flagged:?}");
    // Exactly one resync marker per agent process, its start marker; none for the restarts
    // otherwise, and `*` only at the durable name's first subscription.
    for (i, processes) in starts.iter().enumerate() {
        let r = seen.resyncs.get(&name(i)).cloned().unwrap_or_default();
        assert!(r.iter().all(|(_, why)| why == "agent started"), "rt-{i} resyncs: {r:?}");
        assert_eq!(r.len(), *processes, "rt-{i}: {processes} processes, resyncs {r:?}");
    }
    assert!(only_first_subscription_resyncs(&seen), "{:?}", seen.resyncs);
    let markers: usize = seen.resyncs.values().map(Vec::len).sum();
    let restarts: usize = starts.iter().map(|s| s - 1).sum();
    println!(
        "agent waves: {CLUSTERS} agents, {WAVES} waves; per wave (SIGTERM to every agent of the wave exited, to every \
         one back in a new epoch with its watch running): {waves:?}; all waves {:?}; all delivered {delivered:?} after \
         the load stopped; {} writes ({} deletes), {} events at the subscriber, {restarts} restarts, {markers} resync \
         markers ({} agent starts + {} `*` of the first subscription), {by_resync} objects known through a resync",
        started.elapsed(),
        written.writes,
        written.deletes,
        seen.events,
        starts.iter().sum::<usize>(),
        seen.resyncs.get("*").map_or(0, Vec::len),
    );
}
