//! Tests of the fleet state's merge and change set (`super`).

use serde_json::json;

use super::*;

fn status(cluster: &str, connected: bool) -> ClusterStatus {
    ClusterStatus { cluster: cluster.into(), connected, ..ClusterStatus::default() }
}

fn cached(cluster: &str, hub: &str, connected: bool, revision: u64) -> Cached {
    let raw = crate::fleet::entry::encode(FleetEntry::new(status(cluster, connected), hub), 16 << 10);
    cached_of(&raw, revision, Some(now_ms()), &mut Default::default()).unwrap()
}

fn beat(name: &str) -> (String, bytes::Bytes) {
    (name.to_string(), heartbeat(name, 0, 0, 1))
}

/// The rows as the admin API lists them.
fn merged(fleet: &FleetState, local: Vec<ClusterStatus>) -> Vec<Value> {
    let mut rows = fleet.rows(local);
    rows.sort_by(|a, b| a.cluster.cmp(&b.cluster));
    rows.into_iter().map(Row::value).collect()
}

fn state(me: &str) -> FleetState {
    let s = FleetState::new(me);
    FleetState { max_age_ms: std::sync::atomic::AtomicU64::new(7 * 24 * 3600 * 1000), ..s }
}

/// (cluster, hub, connected) of each listed entry.
fn view(list: &[Value]) -> Vec<(String, String, bool)> {
    list.iter()
        .map(|c| (c["cluster"].as_str().unwrap().into(), c["hub"].as_str().unwrap().into(), c["connected"] == true))
        .collect()
}

fn row(c: &str, hub: &str, connected: bool) -> (String, String, bool) {
    (c.into(), hub.into(), connected)
}

#[test]
fn a_cluster_connected_elsewhere_wins_over_a_disconnected_entry_here() {
    let fleet = state("hub-1");
    fleet.set_live(vec![beat("hub-1"), beat("hub-2")]);
    fleet.apply("a".into(), Some(cached("a", "hub-2", true, 1)));
    fleet.apply("b".into(), Some(cached("b", "hub-2", false, 2)));
    fleet.apply("c".into(), Some(cached("c", "hub-2", true, 3)));
    let merged = merged(&fleet, vec![status("a", false), status("b", true)]);
    assert_eq!(view(&merged), [row("a", "hub-2", true), row("b", "hub-1", true), row("c", "hub-2", true)]);
    // Listed as the admin API shows a cluster (the entry's own format mark left out).
    assert!(merged[0].get("entryFormat").is_none() && merged[0]["epoch"] == 0, "{}", merged[0]);
    // One cluster alone, as the other replicas show it.
    assert_eq!(fleet.elsewhere("a").map(|(c, v)| (c, v["hub"].clone())), Some((true, json!("hub-2"))));
    assert!(fleet.elsewhere("nope").is_none());
}

#[test]
fn the_clusters_of_a_replica_without_a_heartbeat_show_as_not_connected() {
    let fleet = state("hub-1");
    fleet.apply("c".into(), Some(cached("c", "hub-2", true, 1)));
    // No heartbeat read yet: nobody else counts as alive.
    assert_eq!(view(&merged(&fleet, vec![])), [row("c", "hub-2", false)]);
    fleet.set_live(vec![beat("hub-1"), beat("hub-2")]);
    assert_eq!(view(&merged(&fleet, vec![])), [row("c", "hub-2", true)]);
    // hub-2 died: its heartbeat expired.
    fleet.set_live(vec![beat("hub-1")]);
    assert_eq!(view(&merged(&fleet, vec![])), [row("c", "hub-2", false)]);
    assert_eq!(fleet.elsewhere("c").map(|(c, _)| c), Some(false));
    // Its agent reconnected here: this replica's registry shows it.
    assert_eq!(view(&merged(&fleet, vec![status("c", true)])), [row("c", "hub-1", true)]);
}

#[test]
fn entries_of_this_replicas_earlier_life_show_as_not_connected_and_clusters_do_not_vanish() {
    // After a restart of every replica: the registry is empty, the bus still has the entries.
    let fleet = state("hub-1");
    fleet.set_live(vec![beat("hub-1")]);
    let mut entries = HashMap::new();
    entries.insert("mine".to_string(), cached("mine", "hub-1", true, 1));
    entries.insert("gone".to_string(), cached("gone", "hub-9", true, 2));
    entries.insert("down".to_string(), cached("down", "hub-2", false, 3));
    fleet.replace(entries);
    assert_eq!(
        view(&merged(&fleet, vec![])),
        [row("down", "hub-2", false), row("gone", "hub-9", false), row("mine", "hub-1", false)]
    );
    assert_eq!(fleet.own_clusters(), ["mine"]);
}

#[test]
fn an_older_releases_whole_list_is_shown_during_a_rolling_upgrade() {
    let fleet = state("hub-1");
    let old = json!([{"cluster": "e", "connected": true}, {"cluster": "f", "connected": false}]);
    fleet.set_live(vec![beat("hub-1"), ("hub-old".into(), serde_json::to_vec(&old).unwrap().into())]);
    fleet.apply("f".into(), Some(cached("f", "hub-2", false, 1)));
    let merged = merged(&fleet, vec![]);
    assert_eq!(view(&merged), [row("e", "hub-old", true), row("f", "hub-2", false)]);
    assert_eq!(fleet.elsewhere("e").map(|(c, _)| c), Some(true));
    // Its events do not count as a heartbeat's.
    assert_eq!(fleet.others_events(), 0);
}

#[test]
fn expired_entries_are_not_listed_and_age_out() {
    let fleet = state("hub-1");
    let mut old = cached("old", "hub-2", false, 1);
    old.written_ms = Some(now_ms() - 8 * 24 * 3600 * 1000);
    fleet.apply("old".into(), Some(old));
    fleet.apply("new".into(), Some(cached("new", "hub-2", false, 2)));
    assert_eq!(view(&merged(&fleet, vec![])), [row("new", "hub-2", false)]);
    assert!(fleet.elsewhere("old").is_none());
    fleet.age_out();
    assert_eq!(fleet.len(), 1);
}

#[test]
fn other_replicas_events_add_up_from_their_heartbeats() {
    let fleet = state("hub-1");
    let b = |name: &str, events| (name.to_string(), heartbeat(name, events, 1, 1));
    fleet.set_live(vec![b("hub-1", 100), b("hub-2", 5), b("hub-3", 7)]);
    assert_eq!(fleet.others_events(), 12);
}

#[test]
fn changes_hold_each_cluster_once_and_are_bounded() {
    let changes = Changes::default();
    changes.mark("a");
    assert_eq!(changes.take(), (HashSet::new(), false), "nothing kept before a writer drains them");
    changes.enable();
    changes.mark("a");
    changes.mark("a");
    changes.mark("b");
    let (set, everything) = changes.take();
    assert_eq!((set.len(), everything), (2, false));
    for i in 0..=MAX_PENDING {
        changes.mark(&format!("c-{i}"));
    }
    let (set, everything) = changes.take();
    assert!(set.is_empty() && everything, "past the bound: one look at everything instead");
    assert_eq!(changes.take(), (HashSet::new(), false));
}

#[tokio::test]
async fn a_mark_wakes_the_writer_even_when_made_before_it_waits() {
    let changes = Changes::default();
    changes.enable();
    let wait = changes.wait();
    tokio::pin!(wait);
    assert!(futures_util::poll!(&mut wait).is_pending());
    changes.mark("a");
    assert!(futures_util::poll!(&mut wait).is_ready(), "a mark wakes a waiting writer");
    // A mark while nobody waits is kept for the next wait.
    changes.mark("b");
    let again = changes.wait();
    tokio::pin!(again);
    assert!(futures_util::poll!(&mut again).is_ready(), "woken by the earlier mark");
}

#[test]
fn entries_share_their_replica_and_watch_names() {
    let with_watches = |cluster: &str, hub: &str, names: &[&str]| {
        let watches = names
            .iter()
            .map(|n| fleetwatch_protocol::message::WatchState {
                name: (*n).into(),
                phase: fleetwatch_protocol::message::WatchPhase::Running,
                message: String::new(),
                objects: 0,
            })
            .collect();
        let s = ClusterStatus { watches, ..status(cluster, true) };
        crate::fleet::entry::encode(FleetEntry::new(s, hub), 16 << 10)
    };
    let mut shared = Interner::default();
    let a = cached_of(&with_watches("a", "hub-1", &["w1", "w2"]), 1, None, &mut shared).unwrap();
    let b = cached_of(&with_watches("b", "hub-1", &["w1", "w2"]), 2, None, &mut shared).unwrap();
    let c = cached_of(&with_watches("c", "hub-2", &["w1"]), 3, None, &mut shared).unwrap();
    assert!(std::sync::Arc::ptr_eq(&a.hub, &b.hub) && std::sync::Arc::ptr_eq(&a.watches, &b.watches));
    assert!(!std::sync::Arc::ptr_eq(&a.watches, &c.watches) && &*c.hub == "hub-2");
    assert_eq!(&*c.watches, [Box::<str>::from("w1")]);
}
