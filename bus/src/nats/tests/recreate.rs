//! JetStream restarted with an empty store: the stream recreated as the continuation of
//! the bus, every replica agreeing, durable names lost with the cursor store reported so.

use super::*;

/// Whether the bus took a recreated stream on and is healthy.
fn recreated(bus: &NatsBus) -> bool {
    bus.offset_base() > 0 && bus.health().is_ok()
}

/// Appends until JetStream takes it (an agent resending after its session ended).
async fn append_eventually(bus: &NatsBus, cluster: &str, items: impl Fn() -> Vec<Append>) -> u64 {
    let mut last = 0;
    wait_for("an append to be stored", Duration::from_secs(60), async || {
        match bus.append(cluster.into(), items()).await {
            Ok(off) => {
                last = off;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    last
}

/// NATS restarted with an empty store (its disk lost): without a hub restart, the replicas
/// recreate the stream and its buckets and become healthy again; all of them agree on the
/// bus id and the offsets (one recreates, the other takes the new stream on, a replica
/// started later reads the same); offsets continue above the old ones, and the first
/// record of the new stream is one `resync-required` `*` with the true reason, so a
/// reader going on from an old cursor learns of the loss; appends go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jetstream_restarted_empty_is_recreated_and_every_replica_agrees() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    // b serves only agents (no local tail) until its first reader comes.
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let b = NatsBus::open(opts).await.unwrap();
    let id = a.stream_id().to_string();
    assert_eq!(a.append("c".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    assert_eq!(b.append("d".into(), vec![ev(1, 1)]).await.unwrap(), 4);
    wait_for("a's tail at offset 4", Duration::from_secs(30), async || a.last_offset() == 4).await;

    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let next_c = append_eventually(&a, "c", || vec![ev(1, 4)]).await;
    let next_d = append_eventually(&b, "d", || vec![ev(1, 2)]).await;
    assert!(next_c > 4 && next_d > 4, "offsets continue above the old ones: {next_c}, {next_d}");
    let late = open(&server.url(), "fw", keep_all()).await;
    b.prepare_reads().await.unwrap();
    for bus in [&a, &b, &late] {
        assert_eq!(bus.stream_id(), id, "the recreated stream continues the bus");
        wait_for("the tail holds both appends", Duration::from_secs(30), async || {
            bus.last_offset() == next_c.max(next_d)
        })
        .await;
        // A reader going on from its old cursor (4) reads the marker first.
        let read = bus.read(5, 100).await.unwrap();
        let first = read.records.first().expect("records after the recreation");
        assert_eq!(first.cluster.as_ref(), "*");
        match &first.body {
            RecordBody::ResyncRequired(why) => assert!(why.contains(super::super::RECREATED), "{why}"),
            other => panic!("the first record of the recreated stream is {other:?}"),
        }
        // A cluster whose records went with the old stream is told why, truly (a replica
        // that still knew its head reports it evicted at its old offset, at most 4).
        let why = bus.resync_reason(Gap::Evicted { offset: 4 });
        assert!(why.contains("recreated empty") && !why.contains("evicted"), "{why}");
        let aged = bus.resync_reason(Gap::Evicted { offset: next_c.max(next_d) });
        assert!(aged.contains("evicted"), "offsets of the new stream age out as usual: {aged}");
        for (cluster, offset) in &read.evicted {
            let why = bus.resync_reason(Gap::Evicted { offset: *offset });
            assert!(why.contains("recreated empty") && !why.contains("evicted"), "{cluster}: {why}");
        }
        let all_markers = markers(bus, 1).await;
        assert_eq!(all_markers.len(), 1, "one marker, recorded once for all replicas: {all_markers:?}");
        assert_eq!(bus.stats().first_offset, first.offset, "the new stream holds no older offset");
    }
    assert_eq!(late.head("c").await.unwrap(), Some((1, 4)));
}

/// The durable cursor store went with JetStream's store: a durable subscriber returning
/// afterwards (e.g. the lifecycle operator, `from: latest` without a resume cursor) must
/// not be taken for a new one and placed after the loss — its name is `Lost`, on the
/// replica that recreated the stream, on one that took it on, and on one started later
/// (the flag lives in the bucket). A name stored since is known again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_durable_name_lost_with_the_cursor_store_is_reported_lost() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(a.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::New, "a fresh bus has lost nothing");
    a.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    a.register_durable("op", "lifecycle", 2).await.unwrap();
    assert_eq!(b.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(2));

    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let late = open(&server.url(), "fw", keep_all()).await;
    for bus in [&a, &b, &late] {
        assert_eq!(bus.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Lost);
    }
    // Stored again at the subscriber's first ack after its resync (on a, which registered
    // the name before the loss): known from then on, everywhere.
    a.set_durable_cursor("op", "lifecycle", 9).await.unwrap();
    assert_eq!(a.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(9), "before the flush too");
    a.flush(Flush::Cursors).await.unwrap();
    for bus in [&a, &b, &late] {
        assert_eq!(bus.durable_lookup("op", "lifecycle").await.unwrap(), Lookup::Known(9));
    }
}

/// A new bus begun by a hub that waited for a missing stream, found at once by another
/// replica that did not wait and writes the cursor store's meta entry before the creator
/// does (it is still making its buckets): that replica answers as the creator would, from
/// the stream's description, and an unknown durable name is `Lost` (seed 15240's
/// neighbour; before, it wrote "no names lost" and the name was taken for a new one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_finding_a_bus_begun_after_a_wait_writes_the_creators_meta_entry() {
    let (server, _dir) = server();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    // The creator's stream, created in one step with its description; its buckets not yet.
    let mut config = super::super::setup::wanted_config(&NatsOptions {
        stream: "fw".into(),
        ..NatsOptions::new(vec![server.url()], keep_all())
    });
    config.description = Some(super::super::state::describe_begun_after_wait());
    js.create_stream(config).await.unwrap();
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(b.durable_lookup("op", "d").await.unwrap(), Lookup::Lost);
}

/// A replica restarted on a stream whose cursor store lost its meta entry (the bucket
/// deleted while the stream kept its history) reports unknown names as `Lost` too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cursor_store_recreated_under_a_stream_with_history_has_lost_names() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    a.register_durable("op", "d", 1).await.unwrap();
    drop(a);
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("KV_fw_cursors").await.unwrap();
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(b.durable_lookup("op", "d").await.unwrap(), Lookup::Lost);
}

/// A hub that starts while NATS has just come back empty waits for the running replica to
/// recreate the stream as the continuation of the bus, instead of creating a new bus of
/// its own (whose offsets would repeat the running replica's): both end up on one bus.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_starting_right_after_nats_lost_its_store_joins_the_recreated_stream() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    // Started at once, with a generous wait (the default is shorter) for a busy machine.
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::from_secs(60),
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let c = NatsBus::open(opts).await.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(c.stream_id(), a.stream_id(), "one bus");
    wait_for("a took the stream on", Duration::from_secs(60), async || recreated(&a)).await;
    assert!(c.offset_base() > 1 && c.offset_base() == a.offset_base());
    c.prepare_reads().await.unwrap();
    assert!(c.append("c".into(), vec![ev(1, 2)]).await.unwrap() > c.offset_base());
}

/// A stream recreated by a hub that did not know this bus (a new bus, offsets from 1) is
/// not taken on as if it continued it: the replica says why it cannot go on, refuses
/// appends and reads (its subscribers reconnect elsewhere and resync), instead of handing
/// out offsets it already handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_as_another_bus_makes_the_replica_refuse_to_go_on() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("fw").await.unwrap();
    // Another hub creates a new bus at once, before a notices the stream gone.
    let other = open(&server.url(), "fw", keep_all()).await;
    assert_ne!(other.stream_id(), a.stream_id());
    wait_for("a to refuse", Duration::from_secs(60), async || a.health().is_err_and(|e| e.contains("restart"))).await;
    let err = a.append("c".into(), vec![ev(1, 3)]).await.unwrap_err();
    assert!(err.to_string().contains("did not know bus"), "{err}");
    assert!(a.read(1, 10).await.is_err(), "a reader's session ends instead of waiting for offsets");
    assert!(other.health().is_ok());
}

/// JetStream lost its store twice in a short time, and the second stream was recreated by
/// a replica that had not taken on the first recreation: from what it knew, it chose the
/// same offset base, so the new stream's offsets repeat offsets a replica that did take
/// the first one on handed out. That replica must neither take it on (its readers would
/// skip the new stream's first records, its `*` among them) nor refuse for good (unready
/// until restarted, its agents' events refused: the NATS soak found this): it recreates the
/// stream above every offset it knows, and a reader going on from any cursor it was given
/// reads `resync-required *` next, on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_recreated_below_offsets_a_replica_handed_out_is_recreated_above_them() {
    let (mut server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    server.restart_empty().unwrap_or_else(|e| panic!("{e}"));
    for bus in [&a, &b] {
        wait_for("the recreated stream taken on", Duration::from_secs(90), async || recreated(bus)).await;
    }
    let first_base = a.offset_base();
    assert_eq!(b.offset_base(), first_base);
    let mut handed_out = 0;
    for seq in 2..=6 {
        handed_out = append_eventually(&a, "c", || vec![ev(1, seq)]).await;
    }
    assert!(handed_out > first_base + 1, "{handed_out}");

    // A replica that never saw the first recreation recreates the stream at the same base,
    // with its own marker, and an agent of it appends one record.
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    js.delete_stream("fw").await.unwrap();
    let opts = NatsOptions::new(vec![server.url()], keep_all());
    let mut config = super::super::setup::wanted_config(&NatsOptions { stream: "fw".into(), ..opts });
    let stale = super::super::state::Lineage { id: a.stream_id().to_string(), base: first_base };
    config.description = Some(super::super::state::describe(Some(&stale)));
    js.create_stream(config).await.unwrap();
    js.publish("fw.stale", Bytes::from_static(b"{}")).await.unwrap().await.unwrap();

    for bus in [&a, &b] {
        wait_for("a stream above every offset handed out", Duration::from_secs(90), async || {
            bus.offset_base() > handed_out && bus.health().is_ok()
        })
        .await;
        assert_eq!(bus.stream_id(), a.stream_id(), "still one bus");
    }
    let next = append_eventually(&a, "c", || vec![ev(1, 7)]).await;
    assert!(next > handed_out, "offsets go on above the ones handed out: {next} after {handed_out}");
    b.prepare_reads().await.unwrap();
    for bus in [&a, &b] {
        wait_for("the tail holds the append", Duration::from_secs(30), async || bus.last_offset() >= next).await;
        // A reader going on from the last cursor a handed out reads the marker first.
        let read = bus.read(handed_out + 1, 100).await.unwrap();
        let first = read.records.first().expect("records after the cursor");
        assert_eq!(first.cluster.as_ref(), "*", "{:?}", read.records);
        match &first.body {
            RecordBody::ResyncRequired(why) => assert!(why.contains(super::super::RECREATED), "{why}"),
            other => panic!("the first record after the cursor is {other:?}"),
        }
        assert!(!bus.health().is_err_and(|e| e.contains("restart")), "not refused for good");
    }
}
