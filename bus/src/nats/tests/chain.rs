//! The chain of records across failed and pipelined appends: a record stored after a lost
//! one reaches readers as `resync-required`, on every replica.

use super::*;

/// Makes the stream refuse records over 300 bytes; `big` makes one.
async fn refuse_big_records(url: &str) {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let mut stream = js.get_stream("fw").await.unwrap();
    let mut config = stream.info().await.unwrap().config.clone();
    config.max_message_size = 300;
    js.update_stream(config).await.unwrap();
}

fn big(seq: u64) -> Append {
    Append { epoch: 1, seq, body: RecordBody::Event(Bytes::from(format!("\"{}\"", "x".repeat(1000)))) }
}

/// A batch of which a middle record was refused but later ones stored leaves a hole in the
/// cluster's stream: the append fails, and the first record stored after the hole reaches
/// subscribers as a `resync-required`, so they reconcile the cluster instead of missing it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hole_in_a_batch_is_followed_by_a_resync_marker() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    assert_eq!(bus.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
    refuse_big_records(&server.url()).await;
    // 3 and 5 are refused, 2 and 4 stored: the head is 4, not 5.
    let err = bus.append(c.clone(), vec![ev(1, 2), big(3), ev(1, 4), big(5)]).await.unwrap_err();
    assert!(err.to_string().contains("JetStream did not store the batch for cluster eu-1"), "{err}");
    // The agent resends from 2 on; 2 and 4 are stored, so only 5 is new.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    assert_eq!(kinds(&bus).await, vec![(1, false), (2, false), (4, true), (5, false)]);
    match &bus.read(3, 1).await.unwrap().records[0].body {
        RecordBody::ResyncRequired(reason) => {
            assert!(reason.contains("records of the cluster may be missing before this one"), "{reason}")
        }
        other => panic!("{other:?}"),
    }
    // Only once.
    assert_eq!(bus.append(c.clone(), vec![ev(1, 6)]).await.unwrap(), 5);
    assert_eq!(kinds(&bus).await.last(), Some(&(6, false)));
}

/// Two appends of a session in flight (as a session pipelines them): the first is refused,
/// the second stored. The agent is never acked for either, but the second moved the head,
/// so its resend of the first is skipped as duplicates: the second's record must reach
/// subscribers as a `resync-required` — on the replica that appended, on one that only
/// follows the stream, and on one started afterwards (the appending one may die right
/// after; nothing it remembers may be needed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_stored_after_a_failed_one_is_a_resync_marker_on_every_replica() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    assert_eq!(a.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
    refuse_big_records(&server.url()).await;
    let first = a.start_append(c.clone(), vec![ev(1, 2), big(3)]).await.unwrap();
    let second = a.start_append(c.clone(), vec![ev(1, 4)]).await.unwrap();
    let err = first.await.unwrap_err();
    assert!(err.to_string().contains("JetStream did not store the batch for cluster eu-1"), "{err}");
    assert_eq!(second.await.unwrap(), 3, "the later batch was stored (and would not be acked)");
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&a, &b, &late] {
        wait_for("the tail at offset 3", Duration::from_secs(30), async || bus.last_offset() == 3).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true)], "3 was lost: 4 is a marker");
    }
    // The agent reconnects to b, which reads the head from the stream, and resends from 2.
    assert_eq!(b.head("eu-1").await.unwrap(), Some((1, 4)));
    assert_eq!(b.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    for bus in [&a, &b, &late] {
        wait_for("the tail at offset 4", Duration::from_secs(30), async || bus.last_offset() == 4).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true), (5, false)], "no second marker");
    }
}

/// Appends of a cluster in flight on one replica chain up: none of them is a marker when
/// all are stored, whichever order their acks are awaited in.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pipelined_appends_that_all_succeed_need_no_marker() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    let mut started = Vec::new();
    for seq in 1..=20 {
        started.push(bus.start_append(c.clone(), vec![ev(1, seq)]).await.unwrap());
    }
    // Resends of what is in flight are skipped (the session's own filter already does so).
    let resend = bus.start_append(c.clone(), vec![ev(1, 19), ev(1, 20), ev(1, 21)]).await.unwrap();
    let mut offsets = Vec::new();
    for f in started.into_iter().rev() {
        offsets.push(f.await.unwrap());
    }
    assert_eq!(resend.await.unwrap(), 21);
    offsets.sort();
    assert_eq!(offsets, (1..=20).collect::<Vec<u64>>());
    let want: Vec<(u64, bool)> = (1..=21).map(|s| (s, false)).collect();
    assert_eq!(kinds(&bus).await, want);
    // Once nothing is in flight, the next append starts from the head (also from another
    // replica's appends, which its tail saw).
    let other = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(other.head("eu-1").await.unwrap(), Some((1, 21)));
    assert_eq!(other.append(c.clone(), vec![ev(1, 22)]).await.unwrap(), 22);
    wait_for("the tail at offset 22", Duration::from_secs(30), async || bus.last_offset() == 22).await;
    assert_eq!(bus.append(c.clone(), vec![ev(1, 22), ev(1, 23)]).await.unwrap(), 23);
    let want: Vec<(u64, bool)> = (1..=23).map(|s| (s, false)).collect();
    assert_eq!(kinds(&bus).await, want);
}

/// A hub replica that crashes right after a batch was partly stored (a hole, then a stored
/// record) owes nothing: the record after the hole names its lost predecessor (`Fw-Prev`),
/// so every replica — one following the stream, one started after the crash — delivers it
/// as `resync-required` from the stream alone, and the agent's resend on another replica
/// is skipped up to the stored head without hiding the loss.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crash_right_after_a_partly_stored_batch_still_marks_the_loss() {
    let (server, _dir) = server();
    let follower = open(&server.url(), "fw", keep_all()).await;
    let c: Arc<str> = "eu-1".into();
    {
        let crashing = open(&server.url(), "fw", keep_all()).await;
        assert_eq!(crashing.append(c.clone(), vec![ev(1, 1)]).await.unwrap(), 1);
        refuse_big_records(&server.url()).await;
        // 3 refused, 4 stored: the batch fails and the replica dies before anything else
        // (no heads flushed, no marker appended, the agent never acked).
        assert!(crashing.append(c.clone(), vec![ev(1, 2), big(3), ev(1, 4)]).await.is_err());
    }
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&follower, &late] {
        wait_for("the tail at offset 3", Duration::from_secs(30), async || bus.last_offset() == 3).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true)], "3 was lost: 4 is a marker");
    }
    // The agent resends from 2 to the late replica: 2 and 4 are duplicates, 5 is new.
    assert_eq!(late.head("eu-1").await.unwrap(), Some((1, 4)));
    assert_eq!(late.append(c.clone(), vec![ev(1, 2), ev(1, 3), ev(1, 4), ev(1, 5)]).await.unwrap(), 4);
    for bus in [&follower, &late] {
        wait_for("the tail at offset 4", Duration::from_secs(30), async || bus.last_offset() == 4).await;
        assert_eq!(kinds(bus).await, vec![(1, false), (2, false), (4, true), (5, false)]);
    }
}
