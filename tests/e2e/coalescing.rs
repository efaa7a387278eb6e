//! Resync coalescing with real processes (issue 26, break 1): a resync an agent asks for
//! must not be absorbed by a marker a subscriber has already consumed, or the subscriber
//! never learns what changed while the agent was away.

use std::time::Duration;

use serde_json::json;

use crate::support::*;

/// The lines `tail` printed from `from` on, parsed.
fn lines_since(tail: &Proc, from: usize) -> Vec<serde_json::Value> {
    tail.stdout_lines.lock().unwrap()[from..].iter().filter_map(|l| serde_json::from_str(l).ok()).collect()
}

fn is_resync_for(line: &serde_json::Value, cluster: &str) -> bool {
    line["type"] == "resync-required" && (line["cluster"] == cluster || line["cluster"] == "*")
}

/// The issue's reproduction: in-memory hub restarted (the tail consumes "hub lost acked
/// events"), agent SIGKILLed, a ConfigMap deleted meanwhile, a new agent started. The new
/// agent's "agent started" resync used to be coalesced into the consumed marker, and the
/// tail never heard of the deletion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resync_after_a_consumed_marker_reaches_the_subscriber() {
    let pki = Pki::new();
    let (_sim, kc) = sim_cluster(&pki, "rt1").await;
    kubectl(&kc, &["create", "namespace", "w"], None);
    for name in ["victim", "keep"] {
        let cm = json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name, "namespace": "w"}, "data": {"v": "1"}});
        apply_json(&kc, &cm);
    }
    let wc_dir = pki.path("watch-configs");
    std::fs::create_dir_all(&wc_dir).unwrap();
    let wc = json!({
        "apiVersion": "operator.fleetwatch.dev/v1alpha1", "kind": "WatchConfig", "metadata": {"name": "w"},
        "spec": {"resource": {"group": "", "version": "v1", "kind": "ConfigMap"}, "namespace": "w", "fields": ["data"]},
    });
    std::fs::write(wc_dir.join("w.json"), wc.to_string()).unwrap();
    let wc_flag = ["--watch-config", wc_dir.to_str().unwrap()];
    let port = free_port();
    let hub = HubProc::start(&pki, port, None, &wc_flag);
    let mut agent = kube_agent(&pki, "rt1", &hub.url(), &kc);
    let mut args = vec!["tail".to_string(), "--hub".into(), hub.url(), "--name".into(), "t".into()];
    args.extend(["--from".into(), "earliest".into()]);
    args.extend(client_args(&pki.subscriber("ops")));
    let tail = Proc::spawn(&args, pki.path("tail.log"));
    let victim = "v1/ConfigMap/w/victim";
    let saw_victim = holds_within(Duration::from_secs(30), || {
        lines_since(&tail, 0).iter().any(|l| l["subject"] == victim && l["type"] == "dev.fleetwatch.object.applied")
    })
    .await;
    assert!(saw_victim, "tail never printed {victim}; tail log:\n{}\nhub log:\n{}", tail.stderr(), hub.proc.stderr());

    // Restart the hub without a data directory: the agent's acked events are gone, the
    // hub records "hub lost acked events" for rt1 and the tail consumes it.
    drop(hub);
    let before_restart = tail.stdout_lines.lock().unwrap().len();
    let hub = HubProc::start(&pki, port, None, &wc_flag);
    let consumed = holds_within(Duration::from_secs(60), || {
        lines_since(&tail, before_restart).iter().any(|l| {
            l["type"] == "resync-required"
                && l["cluster"] == "rt1"
                && l["reason"].as_str().is_some_and(|r| r.contains("hub lost acked events"))
        })
    })
    .await;
    assert!(
        consumed,
        "tail never got the lost-events marker: {:?}\nhub log:\n{}",
        lines_since(&tail, before_restart),
        hub.proc.stderr()
    );

    // The agent dies; the victim is deleted while no agent watches; a new agent starts.
    agent.signal("KILL");
    assert!(agent.wait_exit(Duration::from_secs(10)).is_some());
    let before_delete = tail.stdout_lines.lock().unwrap().len();
    kubectl(&kc, &["-n", "w", "delete", "configmap", "victim"], None);
    let _agent = kube_agent(&pki, "rt1", &hub.url(), &kc);

    // The tail must learn of it: the deletion, or a resync of rt1 delivered after it.
    let learned = holds_within(Duration::from_secs(60), || {
        lines_since(&tail, before_delete).iter().any(|l| {
            is_resync_for(l, "rt1") || (l["subject"] == victim && l["type"] == "dev.fleetwatch.object.deleted")
        })
    })
    .await;
    assert!(
        learned,
        "the tail never learned of the deletion: {:?}\nhub log:\n{}",
        lines_since(&tail, before_delete),
        hub.proc.stderr()
    );
    assert!(!hub.proc.stderr().contains("already pending, acked without storing"), "{}", hub.proc.stderr());
}
