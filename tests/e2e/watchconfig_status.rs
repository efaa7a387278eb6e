//! A WatchConfig the hub refuses says so where people look: `kubectl get watchconfigs`
//! (its status, written by the hub), `fleetwatch status` (exit 1), `/api/v1/watchconfigs`;
//! it is never pushed to agents. A file in `--watch-config` edited into an invalid one is
//! judged the same way.

use std::time::Duration;

use crate::support::*;

fn status(args: &[&str]) -> (i32, String) {
    let out = std::process::Command::new(BIN).arg("status").args(args).output().unwrap();
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into())
}

fn watchconfig(name: &str, selector: &str) -> String {
    format!(
        "apiVersion: operator.fleetwatch.dev/v1alpha1\nkind: WatchConfig\nmetadata:\n  name: {name}\nspec:\n  resource: \
         {{version: v1, kind: ConfigMap}}\n  labelSelector: {selector:?}\n  fields: [data]\n"
    )
}

/// A CRD of deploy/crds.
fn crd(plural: &str) -> String {
    let file = format!("../deploy/crds/{plural}.operator.fleetwatch.dev.yaml");
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(file)).unwrap()
}

/// Waits until `cond` (blocking work inside) gives a value.
async fn wait_for(what: &str, mut cond: impl FnMut() -> Option<String>) -> String {
    eventually(what)
        .until(async || tokio::task::block_in_place(&mut cond), Option::is_some)
        .await
        .expect("until returns only what satisfies the condition")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalid_watchconfig_resource_is_refused_visibly_and_never_pushed() {
    let pki = Pki::new();
    let (_cp, cp) = sim_cluster(&pki, "control-plane").await;
    let (_rt, rt) = sim_cluster(&pki, "runtime").await;
    // Runtimes too: the hub reads them for `status`, which would otherwise report their absence.
    for plural in ["watchconfigs", "runtimes"] {
        kubectl(&cp, &["apply", "-f", "-"], Some(&crd(plural)));
    }
    let hub = HubProc::start(&pki, free_port(), None, &["--control-plane-kubeconfig", cp.to_str().unwrap()]);
    let _agent = kube_agent(&pki, "rt-1", &hub.url(), &rt);
    kubectl(&cp, &["apply", "-f", "-"], Some(&watchconfig("good", "app=web")));
    kubectl(&cp, &["apply", "-f", "-"], Some(&watchconfig("bad", "app=(web")));

    // kubectl shows the refusal with its reason; the good one runs on the one cluster.
    let table = wait_for("kubectl get watchconfigs with both statuses", || {
        let out = kubectl(&cp, &["get", "watchconfigs", "-o", "wide"], None);
        let row = |name: &str| out.lines().find(|l| l.starts_with(name)).unwrap_or_default().to_string();
        let (bad, good) = (row("bad "), row("good "));
        (bad.contains("False") && bad.contains("Invalid") && good.contains("True") && good.contains(" 1 "))
            .then_some(out)
    })
    .await;
    assert!(table.contains("labelSelector"), "the message (wide) names the field:\n{table}");
    let message = kubectl(
        &cp,
        &["get", "watchconfig", "bad", "-o", "jsonpath={.status.observedGeneration} {.status.conditions[0].message}"],
        None,
    );
    assert!(message.starts_with("1 ") && message.contains("labelSelector \"app=(web\""), "{message}");

    // Never pushed: the agent runs only the good watch.
    let clusters = hub.clusters().await;
    let watches: Vec<&str> =
        clusters["clusters"][0]["watches"].as_array().unwrap().iter().filter_map(|w| w["name"].as_str()).collect();
    assert_eq!(watches, ["good"], "{clusters}");

    // `fleetwatch status` lists it and exits 1; the admin API names it.
    let admin = format!("http://127.0.0.1:{}", hub.admin_port);
    let (code, out) = status(&["--admin", &admin]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("watchconfig bad (control-plane): not accepted, not pushed to agents: Invalid: "), "{out}");
    let api: serde_json::Value =
        serde_json::from_str(&http_get(hub.admin_port, "/api/v1/watchconfigs").await).unwrap_or_default();
    assert_eq!(api["refused"], 1, "{api}");
    assert_eq!(
        (&api["watchConfigs"][0]["name"], &api["watchConfigs"][0]["reason"]),
        (&"bad".into(), &"Invalid".into())
    );

    // Fixed: accepted at its new generation, pushed, and status is healthy again.
    kubectl(&cp, &["apply", "-f", "-"], Some(&watchconfig("bad", "app=db")));
    wait_for("the fixed WatchConfig accepted at generation 2", || {
        let s = kubectl(
            &cp,
            &[
                "get",
                "watchconfig",
                "bad",
                "-o",
                "jsonpath={.status.observedGeneration} {.status.conditions[0].status}",
            ],
            None,
        );
        (s == "2 True").then_some(s)
    })
    .await;
    let mut last = String::new();
    let healthy = holds_within(Duration::from_secs(60), || {
        let (code, out) = tokio::task::block_in_place(|| status(&["--admin", &admin]));
        last = out;
        code == 0
    })
    .await;
    assert!(healthy, "fleetwatch status not healthy:\n{last}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watchconfig_file_edited_into_an_invalid_one_is_refused_the_same_way() {
    let pki = Pki::new();
    let dir = pki.path("watches");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("a.yaml"), watchconfig("cms", "app=web")).unwrap();
    let hub = HubProc::start(&pki, free_port(), None, &["--watch-config", dir.to_str().unwrap()]);
    let admin = format!("http://127.0.0.1:{}", hub.admin_port);
    assert_eq!(status(&["--admin", &admin]).0, 0);
    std::fs::write(dir.join("b.yaml"), watchconfig("bad", "app=(web")).unwrap();
    let out = wait_for("status lists the invalid file's WatchConfig", || {
        let (code, out) = status(&["--admin", &admin]);
        (code == 1).then_some(out)
    })
    .await;
    let file = dir.join("b.yaml");
    assert!(
        out.contains(&format!("watchconfig bad ({}): not accepted, not pushed to agents: Invalid: ", file.display())),
        "{out}"
    );
    let api: serde_json::Value =
        serde_json::from_str(&http_get(hub.admin_port, "/api/v1/watchconfigs").await).unwrap_or_default();
    let accepted: Vec<&str> = api["watchConfigs"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|v| v["accepted"] == true)
        .filter_map(|v| v["name"].as_str())
        .collect();
    assert_eq!(accepted, ["cms"], "{api}");
}
