//! Formats: what earlier releases wrote is read as format 1, what a newer one wrote is
//! refused untouched.

use super::*;

/// A rolled-back hub refuses a bus a newer release keeps in another format (the cursors
/// bucket's meta entry says so), in one line naming both formats.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bus_of_a_newer_format_is_refused() {
    let (server, _dir) = server();
    let bus = open(&server.url(), "fw", keep_all()).await;
    drop(bus);
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let kv = js.get_key_value("fw_cursors").await.unwrap();
    let meta = kv.get("meta.bus").await.unwrap().unwrap();
    let mut value: serde_json::Value = serde_json::from_slice(&meta).unwrap();
    assert_eq!(value["format"], 1, "{value}");
    value["format"] = 2.into();
    kv.put("meta.bus", serde_json::to_vec(&value).unwrap().into()).await.unwrap();
    let opts = NatsOptions {
        stream: "fw".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let err = match NatsBus::open(opts).await {
        Ok(_) => panic!("a bus of a newer format was opened"),
        Err(e) => e.to_string(),
    };
    assert!(err.contains("kept in format 2, newer than this hub's 1"), "{err}");
    assert!(!err.contains('\n'), "{err}");
}

/// Publishes a record as `headers` name it, straight to JetStream (a release before the
/// format marks, or a newer one); answers its stream sequence.
async fn publish_raw(
    js: &async_nats::jetstream::Context,
    subject: &str,
    headers: &[(&str, &str)],
    payload: &str,
) -> u64 {
    let mut map = async_nats::HeaderMap::new();
    for (k, v) in headers {
        map.insert(*k, *v);
    }
    js.publish_with_headers(subject.to_string(), map, Bytes::from(payload.to_string()))
        .await
        .unwrap()
        .await
        .unwrap()
        .sequence
}

/// What the releases before the format marks wrote — records without `Fw-Format`, heads and
/// cursor entries without `format` — is read as format 1; what this release writes carries
/// the marks (but for cursor entries of format 1, which the releases before read only
/// without one).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_heads_and_cursors_without_a_format_are_read_as_format_1() {
    let (server, _dir) = server();
    let a = open(&server.url(), "fw", keep_all()).await;
    let id = a.stream_id().to_string();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    // An agent's record and a head and cursor entry as the previous release wrote them.
    let old = [("Fw-Epoch", "7"), ("Fw-Seq", "1"), ("Fw-Kind", "event"), ("Fw-Prev", "-"), ("Fw-Known", "0")];
    let seq = publish_raw(&js, "fw.old", &old, r#"{"seq":1}"#).await;
    let heads = js.get_key_value("fw_heads").await.unwrap();
    heads.put("gone", Bytes::from_static(br#"{"epoch":3,"seq":40,"offset":1}"#)).await.unwrap();
    let cursors = js.get_key_value("fw_cursors").await.unwrap();
    let entry = format!(r#"{{"names":{{"d":{seq}}},"regs":{{"d":5}},"bus":"{id}"}}"#);
    cursors.put("sub", Bytes::from(entry)).await.unwrap();

    let b = open(&server.url(), "fw", keep_all()).await;
    assert!(b.health().is_ok(), "{:?}", b.health());
    assert_eq!(b.head("old").await.unwrap(), Some((7, 1)), "the head from the unmarked record");
    assert_eq!(b.head("gone").await.unwrap(), Some((3, 40)), "the head from the unmarked bucket value");
    assert_eq!(b.durable_lookup("sub", "d").await.unwrap(), Lookup::Known(seq));
    wait_for("the unmarked record in the tail", Duration::from_secs(30), async || b.last_offset() >= seq).await;
    let read = b.read(seq, 10).await.unwrap();
    assert_eq!(read.records.first().map(|r| (r.cluster.as_ref(), r.epoch, r.seq)), Some(("old", 7, 1)));
    assert!(matches!(read.records[0].body, RecordBody::Event(_)), "{:?}", read.records[0]);
    // The agent goes on: its next record follows the unmarked one.
    let next = b.append("old".into(), vec![ev(7, 2)]).await.unwrap();
    b.register_durable("sub", "d", next).await.unwrap();
    wait_for("the head flushed", Duration::from_secs(30), async || {
        b.flush(Flush::Cursors).await.is_ok() && heads.get("old").await.unwrap().is_some()
    })
    .await;
    let stream = js.get_stream("fw").await.unwrap();
    let written = stream.get_raw_message(next).await.unwrap();
    assert_eq!(written.headers.get("Fw-Format").map(|v| v.as_str()), Some("1"));
    assert!(matches!(b.read(next, 1).await.unwrap().records[0].body, RecordBody::Event(_)), "it follows");
    let head: serde_json::Value = serde_json::from_slice(&heads.get("old").await.unwrap().unwrap()).unwrap();
    assert_eq!(head["format"], 1, "{head}");
    let entry: serde_json::Value = serde_json::from_slice(&cursors.get("sub").await.unwrap().unwrap()).unwrap();
    assert_eq!(entry["names"]["d"], next, "{entry}");
    assert!(entry.get("format").is_none(), "format 1 cursor entries stay unmarked: {entry}");
}

/// A record, head or cursor entry a newer release wrote (a rolled-back replica next to a
/// newer one, or reading what it left) is refused with both formats named: the replica does
/// not go on (its hub exits), and nothing is skipped, cut or written over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_head_or_cursor_entry_of_a_newer_format_is_refused_untouched() {
    let (server, _dir) = server();
    let js = async_nats::jetstream::new(async_nats::connect(server.url()).await.unwrap());
    let refused =
        |e: &str| e.contains("kept in format 2, newer than this hub's 1") && e.contains("leaves it untouched");

    // A record: the replica's tail stops before it and the replica refuses to go on.
    let a = open(&server.url(), "fw1", keep_all()).await;
    a.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    let newer = [("Fw-Epoch", "1"), ("Fw-Seq", "2"), ("Fw-Kind", "event"), ("Fw-Prev", "1/1"), ("Fw-Format", "2")];
    let seq = publish_raw(&js, "fw1.c", &newer, r#"{"a":"shape this release does not know"}"#).await;
    wait_for("the replica to refuse", Duration::from_secs(30), async || a.fatal().is_some()).await;
    let why = a.fatal().unwrap_or_default();
    assert!(refused(&why) && why.contains(&format!("offset {seq}")), "{why}");
    assert!(a.health().is_err_and(|e| refused(&e)));
    assert!(a.append("c".into(), vec![ev(1, 3)]).await.is_err(), "no appends after it");
    assert!(a.read(1, 10).await.is_err(), "no reads either");
    let kept = js.get_stream("fw1").await.unwrap().get_raw_message(seq).await.unwrap();
    assert_eq!(kept.headers.get("Fw-Format").map(|v| v.as_str()), Some("2"), "the record is still there");
    // A replica without a tail asked for the cluster's head (an agent's hello) refuses too.
    let opts = NatsOptions {
        stream: "fw1".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let b = NatsBus::open(opts).await.unwrap_or_else(|e| panic!("{e}"));
    let err = b.head("c").await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the last record of cluster c"), "{err}");
    assert!(b.fatal().is_some_and(|w| refused(&w)));

    // A cursor entry: the durable subscriber is refused, the entry left as it is.
    let c = open(&server.url(), "fw2", keep_all()).await;
    let cursors = js.get_key_value("fw2_cursors").await.unwrap();
    let entry = format!(r#"{{"format":2,"subscribers":[{{"name":"d","at":"4","bus":"{}"}}]}}"#, c.stream_id());
    let revision = cursors.put("sub", Bytes::from(entry.clone())).await.unwrap();
    let err = c.durable_lookup("sub", "d").await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the durable cursors of sub"), "{err}");
    assert!(c.register_durable("sub", "d", 1).await.is_err());
    assert!(c.set_durable_cursor("sub", "d", 1).await.is_err() || c.flush(Flush::Cursors).await.is_err());
    let now = cursors.entry("sub").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, entry.as_bytes()), "written over");

    // A head in the bucket: a replica does not start on it.
    drop(open(&server.url(), "fw3", keep_all()).await);
    let heads = js.get_key_value("fw3_heads").await.unwrap();
    let head = br#"{"epoch":1,"seq":9,"offset":3,"format":2,"lineage":"x"}"#;
    let revision = heads.put("c", Bytes::from_static(head)).await.unwrap();
    let opts = NatsOptions {
        stream: "fw3".into(),
        missing_stream_wait: Duration::ZERO,
        ..NatsOptions::new(vec![server.url()], keep_all())
    };
    let err = match NatsBus::open(opts).await {
        Ok(_) => panic!("a replica started on a head of a newer format"),
        Err(e) => e.to_string(),
    };
    assert!(refused(&err) && err.contains("the head of cluster c"), "{err}");
    assert!(!err.contains('\n'), "{err}");
    let now = heads.entry("c").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, &head[..]));

    // A head a newer replica wrote while this one runs: its next head of the cluster does
    // not write over it (compare-and-set on what it wrote last).
    let d = open(&server.url(), "fw4", keep_all()).await;
    d.append("c".into(), vec![ev(1, 1)]).await.unwrap();
    d.flush(Flush::Cursors).await.unwrap();
    let heads = js.get_key_value("fw4_heads").await.unwrap();
    let newer = br#"{"epoch":1,"seq":1,"offset":1,"format":2}"#;
    let revision = heads.put("c", Bytes::from_static(newer)).await.unwrap();
    d.append("c".into(), vec![ev(1, 2)]).await.unwrap();
    let err = d.flush(Flush::All).await.unwrap_err().to_string();
    assert!(refused(&err) && err.contains("the head of cluster c"), "{err}");
    assert!(d.fatal().is_some());
    let now = heads.entry("c").await.unwrap().unwrap();
    assert_eq!((now.revision, now.value.as_ref()), (revision, &newer[..]), "written over");
}
