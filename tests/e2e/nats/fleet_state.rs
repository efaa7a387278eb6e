//! The fleet state shared by hub replicas (per-cluster entries in `<stream>_fleet`, one
//! heartbeat per replica in `<stream>_replicas`) with real processes: what each replica
//! lists of the clusters connected to another, when that one dies, and after every replica
//! restarted.

use super::*;

/// The cluster's (connected, hub) in a replica's `/api/v1/clusters`.
async fn listed(hub: &HubProc, cluster: &str) -> Option<(bool, String)> {
    let body = hub.clusters().await;
    let c = body["clusters"].as_array()?.iter().find(|c| c["cluster"] == cluster)?.clone();
    Some((c["connected"] == true, c["hub"].as_str().unwrap_or_default().to_string()))
}

/// A cluster connected to replica a is listed by replica b (with a as its hub); once a is
/// killed, b lists it as not connected (a's heartbeat expired) until the agent reconnects
/// to b; and after every replica restarted, the cluster whose agent is gone is still listed,
/// as not connected, instead of vanishing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replicas_list_each_others_clusters_and_a_dead_replicas_as_not_connected() {
    let pki = Pki::new();
    let js = LocalNatsServer::start(&pki.path("jetstream")).unwrap_or_else(|e| panic!("{e}"));
    let bus = ["--bus", &js.url(), "--bus-stream", "fleet"];
    let (pa, pb) = (free_port(), free_port());
    let mut a = HubProc::start(&pki, pa, None, &bus);
    let mut b = HubProc::start(&pki, pb, None, &bus);
    let (on_a, on_b) = (format!("127.0.0.1:{pa}"), format!("127.0.0.1:{pb}"));
    let to_agents = Balancer::start(pa).await;
    let mut agent = agent(&pki, "c1", &to_agents.url(), "synthetic:objects=5,rate=5", &[]);

    eventually("b to list c1 as connected to a")
        .context(|| b.proc.stderr())
        .until(async || listed(&b, "c1").await, |l| *l == Some((true, on_a.clone())))
        .await;

    // a dies; the agent cannot reach any replica for now.
    a.proc.signal("KILL");
    assert!(a.proc.wait_exit(Duration::from_secs(5)).is_some());
    eventually("b to list c1 as not connected once a's heartbeat expired")
        .context(|| b.proc.stderr())
        .until(async || listed(&b, "c1").await, |l| *l == Some((false, on_a.clone())))
        .await;

    // The agent reconnects, to b.
    to_agents.switch(pb);
    eventually("b to list c1 as connected to b")
        .context(|| b.proc.stderr())
        .until(async || listed(&b, "c1").await, |l| *l == Some((true, on_b.clone())))
        .await;

    // The agent goes; b writes its entry as not connected (it still owns it).
    let _ = agent.child.kill();
    let _ = agent.child.wait();
    eventually("b to list c1 as not connected")
        .until(async || listed(&b, "c1").await, |l| *l == Some((false, on_b.clone())))
        .await;
    // Every replica restarts: the new ones know c1 from the bus, not connected.
    b.proc.signal("KILL");
    assert!(b.proc.wait_exit(Duration::from_secs(5)).is_some());
    let c = HubProc::start(&pki, free_port(), None, &bus);
    eventually("a new replica to list c1 (not connected) from the fleet state")
        .context(|| c.proc.stderr())
        .until(async || listed(&c, "c1").await, |l| *l == Some((false, on_b.clone())))
        .await;
    let metrics = http_get(c.admin_port, "/metrics").await;
    assert_eq!(sample(&metrics, "fleetwatch_hub_fleet_entries"), Some(1.0), "{metrics}");
}
