//! Tests of the session registry: one session per cluster (refusal and replacement), last
//! seen from the live connection, rate budgets kept across sessions, listed connections,
//! bounded recent events and resync coalescing.

use super::*;
use crate::cluster::RECENT_FIELD_BYTES;

fn opening<'a>(session: &'a str, remote: &'a str, epoch: u64, cancel: &CancellationToken) -> Opening<'a> {
    Opening {
        session,
        remote,
        agent_version: "t",
        protocol: 1,
        agent_protocols: fleetwatch_protocol::message::ProtocolRange::OURS,
        epoch,
        cancel: cancel.clone(),
        liveness: Arc::new(Liveness::new()),
    }
}

#[test]
fn a_second_agent_is_refused_while_the_first_is_alive() {
    let reg = SessionRegistry::default();
    let first = CancellationToken::new();
    let stale = Duration::from_secs(3600);
    assert_eq!(reg.open("c", opening("s1", "10.0.0.1:1", 1, &first), stale), OpenOutcome::Opened { replaced: None });
    let second = CancellationToken::new();
    match reg.open("c", opening("s2", "10.0.0.2:2", 2, &second), stale) {
        OpenOutcome::Conflict { connected_from, .. } => assert_eq!(connected_from, "10.0.0.1:1"),
        other => panic!("{other:?}"),
    }
    assert!(!first.is_cancelled());
    let st = &reg.list()[0];
    assert_eq!((st.sessions, st.conflicts), (1, 1));
    assert_eq!(st.last_conflict_from.as_deref(), Some("10.0.0.2:2"));
    assert_eq!(st.session.as_deref(), Some("s1"));
}

#[test]
fn the_same_epoch_or_a_silent_session_is_replaced() {
    let reg = SessionRegistry::default();
    let first = CancellationToken::new();
    let stale = Duration::from_secs(3600);
    reg.open("c", opening("s1", "a:1", 1, &first), stale);
    // Same epoch: the same agent reconnecting.
    let again = CancellationToken::new();
    assert!(matches!(reg.open("c", opening("s2", "a:2", 1, &again), stale), OpenOutcome::Opened { replaced: Some(_) }));
    assert!(first.is_cancelled());
    // Another epoch, but the live session is silent beyond the window: replaced.
    let other = CancellationToken::new();
    assert!(matches!(
        reg.open("c", opening("s3", "b:3", 2, &other), Duration::ZERO),
        OpenOutcome::Opened { replaced: Some(_) }
    ));
    assert!(again.is_cancelled());
    // The replaced session closing does not mark the new one closed.
    reg.close("c", "s2");
    assert!(reg.list()[0].connected);
    reg.close("c", "s3");
    assert!(!reg.list()[0].connected);
    // Once closed, any epoch opens.
    let later = CancellationToken::new();
    assert_eq!(reg.open("c", opening("s4", "c:4", 9, &later), stale), OpenOutcome::Opened { replaced: None });
    assert_eq!(reg.list()[0].conflicts, 0);
}

#[test]
fn any_frame_of_the_live_connection_moves_last_seen_without_the_registry() {
    let reg = SessionRegistry::default();
    let liveness = Arc::new(Liveness::new());
    let cancel = CancellationToken::new();
    let open = Opening { liveness: liveness.clone(), ..opening("s1", "a:1", 1, &cancel) };
    reg.open("c", open, Duration::from_secs(3600));
    // What the registry recorded is an hour old (an idle agent: no event since).
    let now = jiff::Timestamp::now();
    let hour_ago = now - jiff::SignedDuration::from_hours(1);
    reg.clusters.lock().unwrap().get_mut("c").unwrap().status.last_seen = Some(hour_ago);
    // Its connection just received a frame (a pong): that is when it was last seen,
    // in the list, the single view and (through both) `/metrics` and the shared list.
    liveness.touch();
    let recent = |t: Option<jiff::Timestamp>| t.is_some_and(|t| t > now - jiff::SignedDuration::from_mins(1));
    assert!(recent(reg.list()[0].last_seen), "{:?}", reg.list()[0].last_seen);
    assert!(recent(reg.get("c").unwrap().0.last_seen));
    // Once the session closes, its last frame stays the cluster's last-seen.
    reg.close("c", "s1");
    let closed = reg.list()[0].clone();
    assert!(!closed.connected && recent(closed.last_seen), "{closed:?}");
    // A closed cluster's last-seen no longer follows that connection.
    reg.clusters.lock().unwrap().get_mut("c").unwrap().status.last_seen = Some(hour_ago);
    liveness.touch();
    assert_eq!(reg.list()[0].last_seen, Some(hour_ago));
}

#[test]
fn a_reconnect_keeps_the_clusters_rate_budget() {
    let reg = SessionRegistry::default();
    reg.open("c", opening("s1", "a:1", 1, &CancellationToken::new()), Duration::from_secs(60));
    let first = reg.budget("c", 10);
    assert!(first.lock().unwrap().take_events(10).is_zero());
    // The next session of the cluster gets the same, now empty, budget.
    let second = reg.budget("c", 10);
    assert!(Arc::ptr_eq(&first, &second));
    assert!(!second.lock().unwrap().take_events(10).is_zero());
}

#[test]
fn connections_are_listed_while_their_guard_lives() {
    let reg = SessionRegistry::default();
    let peer = |id: &str| Peer {
        identity: id.into(),
        serial: "01".into(),
        not_after: jiff::Timestamp::MAX,
        chain: Arc::default(),
        ended: Arc::default(),
    };
    let a = reg.connected(peer("a"), CancellationToken::new());
    let closing = CancellationToken::new();
    let b = reg.connected(peer("b"), closing.clone());
    let mut ids: Vec<_> = reg.open_connections().into_iter().map(|(p, _)| p.identity).collect();
    ids.sort();
    assert_eq!(ids, ["a", "b"]);
    closing.cancel();
    assert_eq!(reg.open_connections().len(), 1, "a connection being closed is not listed");
    drop(b);
    drop(a);
    assert!(reg.open_connections().is_empty());
}

#[test]
fn recent_events_are_bounded_in_count_and_bytes() {
    let reg = SessionRegistry::default();
    reg.open("c", opening("s1", "a:1", 1, &CancellationToken::new()), Duration::from_secs(60));
    let now = jiff::Timestamp::now();
    reg.recent("c", (1..=100).map(|i| RecentEvent::new(i, "t", &format!("s{i}"), now, None)));
    let (_, recent) = reg.get("c").unwrap();
    assert_eq!(recent.len(), RECENT_EVENTS);
    assert_eq!((recent[0].seq, recent[RECENT_EVENTS - 1].seq), (100 - RECENT_EVENTS as u64 + 1, 100));
    // Long subjects: cut, and the byte bound keeps fewer of them.
    let long = "ü".repeat(10_000);
    reg.recent("c", (101..=200).map(|i| RecentEvent::new(i, "t", &long, now, Some(&long))));
    let (_, recent) = reg.get("c").unwrap();
    assert!(recent.iter().all(|e| e.subject.len() <= RECENT_FIELD_BYTES && e.subject.ends_with('…')));
    let bytes: usize = recent.iter().map(RecentEvent::bytes).sum();
    assert!(bytes <= RECENT_EVENT_BYTES, "{bytes}");
    assert!(recent.len() < RECENT_EVENTS && !recent.is_empty());
    assert_eq!(recent.last().unwrap().seq, 200);
    // An unknown cluster keeps nothing.
    reg.recent("nope", [RecentEvent::new(1, "t", "s", now, None)]);
    assert!(reg.get("nope").is_none());
}

#[test]
fn a_resync_is_pending_while_it_is_the_head_and_unread() {
    let reg = SessionRegistry::default();
    reg.open("c", opening("s1", "a:1", 1, &CancellationToken::new()), Duration::from_secs(60));
    assert!(!reg.resync_pending("c", Some((1, 1)), false));
    assert!(!reg.may_absorb_resync("c", false), "no marker: the head need not be asked for");
    reg.resync_stored("c", StoredMarker { epoch: 1, seq: 1, offset: 7 });
    assert!(reg.may_absorb_resync("c", false) && !reg.may_absorb_resync("c", true));
    assert!(reg.resync_pending("c", Some((1, 1)), false));
    // An event appended after it: the head moved on.
    assert!(!reg.resync_pending("c", Some((1, 2)), false));
    assert!(!reg.resync_pending("c", None, false));
    // Other replicas' readers are unknown.
    assert!(!reg.resync_pending("c", Some((1, 1)), true));
    // A subscriber read up to just before it: still unread.
    reg.read_past(6);
    assert!(reg.resync_pending("c", Some((1, 1)), false));
}

#[test]
fn a_resync_a_subscriber_was_sent_is_never_coalesced_into() {
    let reg = SessionRegistry::default();
    reg.open("c", opening("s1", "a:1", 1, &CancellationToken::new()), Duration::from_secs(60));
    reg.resync_stored("c", StoredMarker { epoch: 1, seq: 5, offset: 7 });
    // A subscriber was sent the marker (or placed past it, e.g. `from: latest`).
    reg.read_past(7);
    assert!(!reg.resync_pending("c", Some((1, 5)), false));
    assert!(!reg.may_absorb_resync("c", false), "read: whatever the head, not absorbed");
    // The mark only rises: a session that reads from an older cursor does not lower it.
    reg.read_past(3);
    assert!(!reg.resync_pending("c", Some((1, 5)), false));
    // A marker stored after it is coalescible again until read.
    reg.resync_stored("c", StoredMarker { epoch: 2, seq: 1, offset: 9 });
    assert!(reg.resync_pending("c", Some((2, 1)), false));
    reg.read_past(12);
    assert!(!reg.resync_pending("c", Some((2, 1)), false));
}
