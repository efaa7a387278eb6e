//! The local tail: started by the first reader only, and recovering when its consumer
//! vanishes.

use super::*;

/// The consumers feeding the local tails vanish on the server (as with the JetStream node
/// that held them): the tails recover and still receive every record, on both replicas.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_tails_recover_when_their_consumers_vanish() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let b = open(&server.url(), "fw", keep_all()).await;
    assert_eq!(a.append("c".into(), vec![ev(1, 1)]).await.unwrap(), 1);
    let client = async_nats::connect(server.url()).await.unwrap();
    let js = async_nats::jetstream::new(client);
    let stream = js.get_stream("fw").await.unwrap();
    let names: Vec<String> = futures_util::StreamExt::collect::<Vec<_>>(stream.consumer_names())
        .await
        .into_iter()
        .map(|n| n.unwrap())
        .collect();
    assert_eq!(names.len(), 2, "one tail consumer per replica: {names:?}");
    for n in &names {
        stream.delete_consumer(n).await.unwrap();
    }
    // Appends go on (an append waits for its own tail, which recovers meanwhile).
    let mut last = 0;
    wait_for("an append after the consumers vanished", Duration::from_secs(90), async || {
        match a.append("c".into(), vec![ev(1, 2), ev(1, 3)]).await {
            Ok(off) => {
                last = off;
                true
            }
            Err(_) => false,
        }
    })
    .await;
    assert_eq!(last, 3);
    wait_for("b's tail to recover", Duration::from_secs(60), async || b.last_offset() == 3).await;
    let seqs: Vec<u64> = b.read(1, 10).await.unwrap().records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, vec![1, 2, 3]);
}

/// Consumers on the stream (the local tails following it).
async fn tail_consumers(url: &str) -> usize {
    let js = async_nats::jetstream::new(async_nats::connect(url).await.unwrap());
    let stream = js.get_stream("fw").await.unwrap();
    futures_util::StreamExt::collect::<Vec<_>>(stream.consumer_names()).await.len()
}

/// A replica without readers only appends: nothing of the stream is delivered to it. Its
/// local tail starts with its first reader, loads what the stream holds (appended by any
/// replica, with their predecessors checked), and from then on an append answers only
/// once its records are in it; a replica still without readers does not wait for a tail.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lazy_tails_start_with_the_first_reader() {
    let (server, _dir) = server();
    let opts = || NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let a = NatsBus::open(opts()).await.unwrap();
    let b = NatsBus::open(opts()).await.unwrap();
    assert_eq!(a.append("c".into(), vec![ev(1, 1), ev(1, 2), ev(1, 3)]).await.unwrap(), 3);
    assert_eq!(b.append("d".into(), vec![ev(1, 1), ev(1, 2)]).await.unwrap(), 5);
    assert_eq!(a.last_offset(), 3, "a replica without a tail knows the offsets of its own acks");
    assert_eq!(tail_consumers(&server.url()).await, 0, "no replica follows the stream without a reader");
    assert!(!a.stats().holds_records && !b.stats().holds_records);
    // A reader on b starts its tail: everything, from both replicas, no marker.
    let got: Vec<(String, u64, bool)> = b
        .read(1, 10)
        .await
        .unwrap()
        .records
        .iter()
        .map(|r| (r.cluster.to_string(), r.seq, matches!(r.body, RecordBody::ResyncRequired(_))))
        .collect();
    let want: Vec<(String, u64, bool)> =
        [("c", 1), ("c", 2), ("c", 3), ("d", 1), ("d", 2)].iter().map(|(c, s)| (c.to_string(), *s, false)).collect();
    assert_eq!(got, want);
    assert_eq!(tail_consumers(&server.url()).await, 1, "only the replica with a reader follows the stream");
    assert!(b.stats().holds_records && !a.stats().holds_records);
    assert_eq!((b.stats().first_offset, b.last_offset(), b.stats().retained), (1, 5, 5));
    // Read your writes on b; a's appends reach b's tail and follow their predecessors.
    assert_eq!(b.append("d".into(), vec![ev(1, 3)]).await.unwrap(), 6);
    assert_eq!(b.read(6, 10).await.unwrap().records.len(), 1, "b's own append is in its tail when acked");
    assert_eq!(a.append("c".into(), vec![ev(1, 4)]).await.unwrap(), 7);
    wait_for("b's tail at offset 7", Duration::from_secs(30), async || b.last_offset() == 7).await;
    assert_eq!(kinds(&b).await.iter().filter(|(_, marker)| *marker).count(), 0, "no record broke its chain");
    // a's first reader gets the same stream.
    a.prepare_reads().await.unwrap();
    assert_eq!(a.read(1, 10).await.unwrap().records.len(), 7);
    assert_eq!(tail_consumers(&server.url()).await, 2);
}
