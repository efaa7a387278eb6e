//! The durable bus under storage faults, with real processes: a full disk (a small tmpfs
//! filled by a balloon file, or the hub's storage fault hook where mounting is not
//! possible) refuses batches with the cause and makes the hub not ready, appends resume
//! afterwards and nothing is lost; durable cursors are bounded and a lost cursor store
//! makes durable subscribers resync.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use fleetwatch_agent::source::SyntheticSource;
use fleetwatch_client::subscriber::{Delivery, SubscribeError, SubscriberOptions, Subscription};
use fleetwatch_client::transport::HubUrl;
use fleetwatch_protocol::message::{ErrorCode, StartFrom};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::*;

/// One HTTP/1.0 request to the admin endpoint: (status, body).
async fn http(port: u16, method: &str, path: &str) -> (u16, String) {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)).await else { return (0, String::new()) };
    let req = format!("{method} {path} HTTP/1.0\r\nHost: x\r\nContent-Length: 0\r\n\r\n");
    let _ = s.write_all(req.as_bytes()).await;
    let mut buf = String::new();
    let _ = s.read_to_string(&mut buf).await;
    let status = buf.split(' ').nth(1).and_then(|c| c.parse().ok()).unwrap_or(0);
    (status, buf.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or_default())
}

/// Waits until the agent's whole stream up to `seq` (its start marker included) is acked.
async fn acked_up_to(hub: &HubProc, seq: u64, agent: &Proc) {
    eventually(format!("the hub to ack up to seq {seq}"))
        .context(|| format!("agent log:\n{}", agent.stderr()))
        .until(
            async || hub.clusters().await,
            |clusters| {
                clusters["clusters"].as_array().and_then(|a| a.first()).and_then(|c| c["ackedSeq"].as_u64())
                    == Some(seq)
            },
        )
        .await;
}

/// A small tmpfs, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(dir)
            .output()
            .map_err(|e| format!("cannot run mount: {e}"))?;
        if !out.status.success() {
            return Err(String::from_utf8_lossy(&out.stderr).trim().to_string());
        }
        Ok(Self(dir.to_path_buf()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

/// A file that fills its file system and keeps it full: space the hub frees by cutting a
/// failed write back is taken again at once, as other tenants of a full disk would.
struct Balloon {
    path: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Balloon {
    fn inflate(path: &Path) -> Self {
        use std::io::Write;
        let mut f = std::fs::File::create(path).unwrap();
        let fill = |f: &mut std::fs::File, chunk: &[u8]| loop {
            match f.write_all(chunk).and_then(|()| f.sync_data()) {
                Ok(()) => {}
                Err(e) if e.raw_os_error() == Some(28) => return,
                Err(e) => panic!("balloon: unexpected error {e}"),
            }
        };
        fill(&mut f, &vec![0xa5u8; 64 << 10]);
        fill(&mut f, &[0xa5u8; 512]);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::spawn(move || {
            while !s.load(std::sync::atomic::Ordering::SeqCst) {
                fill(&mut f, &[0xa5u8; 512]);
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        Self { path: path.to_path_buf(), stop, thread: Some(thread) }
    }

    fn deflate(mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        std::fs::remove_file(&self.path).unwrap();
    }
}

/// Objects whose final generation did not reach the collector, unless a resync for their
/// cluster (or `*`) did.
fn lost(seen: &Seen, cluster: &str, source: &SyntheticSource) -> Vec<String> {
    if seen.resyncs.get(cluster).is_some_and(|r| r.iter().any(|(_, why)| why != "agent started"))
        || seen.resyncs.contains_key("*")
    {
        return Vec::new();
    }
    (0..source.objects)
        .filter_map(|n| {
            let want = source.final_generation(n)?;
            let got = seen.generation.get(&(cluster.to_string(), synthetic_subject(n))).copied().unwrap_or(0);
            (got != want).then(|| format!("{cluster}/obj-{n}: got generation {got}, want {want}"))
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disk_full_refuses_batches_with_the_cause_and_appends_resume() {
    let pki = Pki::new();
    let mount_dir = pki.path("small-disk");
    // A real full disk where we can mount; otherwise the hub's fault hook, which fails
    // writes at the same layer.
    // FLEETWATCH_TEST_NO_TMPFS=1 takes the fault-hook path even where mounting works.
    let mounted = if std::env::var_os("FLEETWATCH_TEST_NO_TMPFS").is_some() {
        Err("FLEETWATCH_TEST_NO_TMPFS is set".to_string())
    } else {
        Tmpfs::mount(&mount_dir, "16m")
    };
    let tmpfs = match mounted {
        Ok(t) => Some(t),
        Err(e) => {
            println!("cannot mount a tmpfs ({e}): using the storage fault hook instead");
            None
        }
    };
    let data = mount_dir.join("hub-data");
    let port = free_port();
    let hub = HubProc::start(&pki, port, Some(&data), &["--fault-injection"]);
    let spec = "synthetic:objects=30,rate=150,total=3000";
    let source: SyntheticSource = spec.parse().unwrap();
    let agent = agent(&pki, "c1", &hub.url(), spec, &[]);
    let collector = Collector::start(&pki, &hub.url(), "checker").await;
    assert!(holds_within(Duration::from_secs(30), || collector.seen.lock().unwrap().events >= 100).await);
    assert_eq!(http(hub.admin_port, "GET", "/readyz").await, (200, "ready: bus ok, certificates ok\n".to_string()));

    // Readiness is watched from before the disk fills: on a real full disk the hub gets a
    // page back now and then (its own cut-back frees one) and is ready again for a moment.
    let not_ready: Arc<std::sync::Mutex<Option<String>>> = Default::default();
    let watcher = {
        let (seen, port) = (not_ready.clone(), hub.admin_port);
        tokio::spawn(async move {
            loop {
                let (status, body) = http(port, "GET", "/readyz").await;
                if status == 503 {
                    seen.lock().unwrap().get_or_insert(body);
                    return;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        })
    };
    let balloon = if tmpfs.is_some() {
        Some(Balloon::inflate(&mount_dir.join("balloon")))
    } else {
        let (status, body) = http(hub.admin_port, "POST", "/debug/faults/storage?fail_for_ms=600000").await;
        assert_eq!((status, body.as_str()), (200, "storage writes fail for 600000 ms\n"));
        None
    };
    // The hub reports the cause on /readyz and to the agent, whose batch is not acked.
    assert!(
        holds_within(Duration::from_secs(30), || not_ready.lock().unwrap().is_some()).await,
        "never 503; hub log:\n{}",
        hub.proc.stderr()
    );
    watcher.abort();
    let metrics = http_get(hub.admin_port, "/metrics").await;
    assert!(!metrics.contains("fleetwatch_hub_bus_write_failures_total 0\n"), "{metrics}");
    assert!(metrics.contains("fleetwatch_hub_bus_write_failures_total "), "{metrics}");
    let body = not_ready.lock().unwrap().clone().unwrap_or_default();
    assert!(body.starts_with("not ready: bus: no space left on device ("), "{body}");
    assert!(hub.proc.stderr().contains("bus cannot write: refusing appends until writes succeed again"));
    let cause = "hub could not store events: no space left on device (";
    assert!(
        holds_within(Duration::from_secs(30), || agent.stderr().contains(cause)).await,
        "agent log:\n{}",
        agent.stderr()
    );
    let during = collector.seen.lock().unwrap().events;

    // Space again: appends resume, the hub is ready, nothing is lost.
    if let Some(b) = balloon {
        b.deflate();
    } else {
        assert_eq!(http(hub.admin_port, "POST", "/debug/faults/storage?fail_for_ms=0").await.0, 200);
    }
    let ready = eventually("/readyz to answer 200")
        .context(|| hub.proc.stderr())
        .until(async || http(hub.admin_port, "GET", "/readyz").await, |answer| answer.0 == 200)
        .await;
    assert_eq!(ready, (200, "ready: bus ok, certificates ok\n".to_string()), "hub log:\n{}", hub.proc.stderr());
    let done =
        holds_within(Duration::from_secs(90), || lost(&collector.seen.lock().unwrap(), "c1", &source).is_empty()).await;
    let seen = collector.seen.lock().unwrap();
    assert!(done, "lost: {:?}\nhub log:\n{}", &lost(&seen, "c1", &source)[..3], hub.proc.stderr());
    assert!(seen.events > during, "events flow again after the disk had space");
    // Acked events were never lost: no resync beyond the agent's own start marker.
    assert_eq!(seen.resyncs.get("c1").map(|r| r.len()), Some(1), "{:?}", seen.resyncs);
    assert!(!seen.resyncs.contains_key("*"), "{:?}", seen.resyncs);
    drop(seen);
    drop(collector);
    drop(agent);
    drop(hub);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn storage_fault_endpoint_exists_only_with_the_flag() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), Some(&pki.path("data")), &[]);
    assert_eq!(http(hub.admin_port, "POST", "/debug/faults/storage?fail_for_ms=1000").await.0, 404);
    assert_eq!(http(hub.admin_port, "GET", "/readyz").await, (200, "ready: bus ok, certificates ok\n".to_string()));
}

fn subscriber_opts(pki: &Pki, hub: &str, durable: &str, from: StartFrom) -> SubscriberOptions {
    let files = pki.subscriber("sub");
    let tls = Arc::new(fleetwatch_certs::client_config(&files).unwrap());
    let mut opts = SubscriberOptions::new(hub.parse::<HubUrl>().unwrap(), tls);
    opts.durable = Some(durable.into());
    opts.from = from;
    opts
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn durable_names_are_bounded_per_subscriber() {
    let pki = Pki::new();
    let hub = HubProc::start(&pki, free_port(), Some(&pki.path("data")), &[]);
    let mut subs = Vec::new();
    for i in 0..16 {
        subs.push(
            Subscription::connect(subscriber_opts(&pki, &hub.url(), &format!("d{i}"), StartFrom::Latest))
                .await
                .unwrap(),
        );
    }
    let err = Subscription::connect(subscriber_opts(&pki, &hub.url(), "one-too-many", StartFrom::Latest))
        .await
        .err()
        .expect("the 17th durable name is refused");
    match err {
        SubscribeError::Refused { code, message } => {
            assert_eq!(code, ErrorCode::LimitExceeded);
            assert!(message.contains("already has 16 durable names"), "{message}");
        }
        other => panic!("unexpected: {other}"),
    }
    // A known name is still accepted, and a long name is refused.
    drop(subs);
    Subscription::connect(subscriber_opts(&pki, &hub.url(), "d3", StartFrom::Latest)).await.unwrap();
    let err = Subscription::connect(subscriber_opts(&pki, &hub.url(), &"n".repeat(300), StartFrom::Latest))
        .await
        .err()
        .expect("a 300-byte name is refused");
    assert!(err.to_string().contains("exceeds the limit of 256 bytes"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_cursor_store_makes_durable_subscribers_resync() {
    let pki = Pki::new();
    let data = pki.path("data");
    let port = free_port();
    let mut hub = HubProc::start(&pki, port, Some(&data), &[]);
    let _agent = agent(&pki, "c1", &hub.url(), "synthetic:objects=5,rate=50,total=50", &[]);
    {
        let mut sub =
            Subscription::connect(subscriber_opts(&pki, &hub.url(), "keep", StartFrom::Latest)).await.unwrap();
        let first = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.unwrap().unwrap();
        sub.ack(first.last_cursor().unwrap()).await.unwrap();
    }
    hub.proc.signal("TERM");
    assert!(hub.proc.wait_exit(Duration::from_secs(20)).is_some(), "hub did not stop on SIGTERM");
    std::fs::remove_file(data.join("cursors.json")).unwrap();
    hub = HubProc::start(&pki, port, Some(&data), &[]);
    let mut sub = Subscription::connect(subscriber_opts(&pki, &hub.url(), "keep", StartFrom::Latest)).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.unwrap().unwrap();
    match d {
        Delivery::ResyncRequired(r) => {
            assert_eq!(r.cluster, "*");
            assert!(r.reason.contains("lost its durable cursor store"), "{}", r.reason);
        }
        other => panic!("expected resync-required *, got {other:?}"),
    }
    // Not taken in (no ack) before the reconnect: the resync comes again.
    drop(sub);
    let mut sub = Subscription::connect(subscriber_opts(&pki, &hub.url(), "keep", StartFrom::Latest)).await.unwrap();
    let d = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.unwrap().unwrap();
    assert!(matches!(&d, Delivery::ResyncRequired(r) if r.cluster == "*"), "{d:?}");
    // Acked: the name is known again and the next session resumes without a resync.
    sub.ack(d.last_cursor().unwrap()).await.unwrap();
    let cursors = data.join("cursors.json");
    assert!(
        holds_within(Duration::from_secs(30), || std::fs::read_to_string(&cursors)
            .is_ok_and(|t| t.contains("\"keep\"")))
        .await,
        "the acked name was not stored"
    );
    drop(sub);
    let mut sub = Subscription::connect(subscriber_opts(&pki, &hub.url(), "keep", StartFrom::Latest)).await.unwrap();
    let _more = agent(&pki, "c2", &hub.url(), "synthetic:objects=2,rate=50,total=5", &[]);
    // c2's own "agent started" marker may come first (every agent start stores one); what
    // must not come again is the store-wide `*` resync.
    loop {
        let d = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.unwrap().unwrap();
        match &d {
            Delivery::Events(_) => break,
            Delivery::ResyncRequired(r) if r.cluster == "c2" => continue,
            other => panic!("no second resync once it was acked: {other:?}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_segment_is_skipped_and_a_subscriber_reads_across_the_gap() {
    let pki = Pki::new();
    let data = pki.path("data");
    let port = free_port();
    // Small segments, so the damage hits a closed one (indexed: only its clusters resync).
    let small = ["--segment-bytes", "64KiB"];
    let mut hub = HubProc::start(&pki, port, Some(&data), &small);
    let spec = "synthetic:objects=20,rate=1000,total=2000";
    let agent_proc = agent(&pki, "c1", &hub.url(), spec, &[]);
    // Wait until the agent's whole stream (its start marker and 2000 events) is acked.
    acked_up_to(&hub, 2001, &agent_proc).await;
    drop(agent_proc);
    hub.proc.signal("TERM");
    assert!(hub.proc.wait_exit(Duration::from_secs(20)).is_some());

    // Zero a 4 KiB block in the middle of the first (closed) segment.
    let mut segs: Vec<_> = std::fs::read_dir(data.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segs.sort();
    assert!(segs.len() > 2, "{segs:?}");
    let seg = segs[0].clone();
    assert!(seg.with_extension("idx").exists());
    let mut bytes = std::fs::read(&seg).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid..mid + 4096].fill(0);
    std::fs::write(&seg, &bytes).unwrap();

    hub = HubProc::start(&pki, port, Some(&data), &small);
    let log = hub.proc.stderr();
    assert!(log.contains("skipping damaged bytes in bus segment"), "{log}");
    let mut sub =
        Subscription::connect(subscriber_opts(&pki, &hub.url(), "reader", StartFrom::Earliest)).await.unwrap();
    let mut events = 0usize;
    let mut resync = None;
    let mut max_seq = 0;
    while max_seq < 2001 || resync.is_none() {
        let d = tokio::time::timeout(Duration::from_secs(30), sub.next()).await.expect("reader stalled").unwrap();
        match &d {
            Delivery::Events(evs) => {
                events += evs.len();
                max_seq = max_seq.max(evs.iter().map(|e| e.seq).max().unwrap_or(0));
            }
            Delivery::ResyncRequired(r) if r.cluster == "c1" && r.reason != "agent started" => {
                resync = Some(r.reason.clone())
            }
            Delivery::ResyncRequired(r) if r.cluster == "*" => panic!("the closed segment's index names c1: {r:?}"),
            Delivery::ResyncRequired(_) => {}
        }
        sub.ack(d.last_cursor().unwrap()).await.unwrap();
    }
    let reason = resync.unwrap();
    assert!(reason.starts_with("records lost in segment "), "{reason}");
    assert!(events < 2001, "some events were lost with the block ({events} delivered)");
    assert!(events > 1000, "records after the damage are kept ({events} delivered)");
    // The hub still answers and stops on SIGTERM.
    assert_eq!(http(hub.admin_port, "GET", "/readyz").await.0, 200);
    hub.proc.signal("TERM");
    assert!(hub.proc.wait_exit(Duration::from_secs(20)).is_some(), "hub did not stop on SIGTERM");
}

/// Cuts the last record of a segment file at its record boundary (frames: magic, length
/// u32 LE, CRC32C, payload): what remains reads back as a valid, shorter log.
fn cut_last_record(seg: &Path) {
    let bytes = std::fs::read(seg).unwrap();
    let (mut pos, mut last) = (0usize, None);
    while pos + 12 <= bytes.len() && &bytes[pos..pos + 4] == b"FWR2" {
        let len = u32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) as usize;
        last = Some(pos);
        pos += 12 + len;
    }
    assert_eq!(pos, bytes.len(), "{} is not a sequence of whole records", seg.display());
    let at = last.expect("a record to cut");
    std::fs::OpenOptions::new().write(true).open(seg).unwrap().set_len(at as u64).unwrap();
}

/// A hub on `data` acks the 100 events of an agent that is then gone for good (its cluster
/// was deleted), the hub is SIGKILLed, and the last acked record is cut from the end of its
/// log at a record boundary.
async fn crash_with_the_last_record_cut(pki: &Pki, port: u16, data: &Path) {
    let mut hub = HubProc::start(pki, port, Some(data), &[]);
    let mut agent_proc = agent(pki, "c1", &hub.url(), "synthetic:objects=5,rate=200,total=100", &[]);
    acked_up_to(&hub, 101, &agent_proc).await;
    agent_proc.signal("KILL");
    assert!(agent_proc.wait_exit(Duration::from_secs(10)).is_some());
    hub.proc.signal("KILL");
    assert!(hub.proc.wait_exit(Duration::from_secs(10)).is_some());
    let mut segs: Vec<_> = std::fs::read_dir(data.join("segments"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    segs.sort();
    cut_last_record(segs.last().unwrap());
}

/// Issue 26, break 4: the hub is SIGKILLed, the last acked record is cut from its log at a
/// record boundary, and the agent never comes back. The hub alone must tell subscribers
/// which cluster lost acked records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_cut_from_the_end_after_a_crash_resyncs_its_cluster() {
    let pki = Pki::new();
    let data = pki.path("data");
    let port = free_port();
    crash_with_the_last_record_cut(&pki, port, &data).await;

    let hub = HubProc::start(&pki, port, Some(&data), &[]);
    let reason = loss_of_c1(&pki, &hub).await;
    assert!(reason.contains("up to seq 101 of epoch") && reason.contains("are missing"), "{reason}");
    assert!(reason.contains("the end of the log was cut"), "{reason}");
}

/// The reason of the first `resync-required` for c1 other than its agent's start, read by a
/// new durable subscriber from the earliest record; a `*` fails (the log's mark names the
/// cluster).
async fn loss_of_c1(pki: &Pki, hub: &HubProc) -> String {
    let mut sub = Subscription::connect(subscriber_opts(pki, &hub.url(), "reader", StartFrom::Earliest)).await.unwrap();
    loop {
        let d = tokio::time::timeout(Duration::from_secs(30), sub.next())
            .await
            .unwrap_or_else(|_| panic!("no resync-required for c1; hub log:\n{}", hub.proc.stderr()))
            .unwrap();
        match &d {
            Delivery::ResyncRequired(r) if r.cluster == "c1" && r.reason != "agent started" => return r.reason.clone(),
            Delivery::ResyncRequired(r) if r.cluster == "*" => panic!("the log's mark names the cluster: {r:?}"),
            _ => {}
        }
        sub.ack(d.last_cursor().unwrap()).await.unwrap();
    }
}

/// Issue 44, break 3: a hub restarted into a full disk, its log's last acked record cut
/// (so the start must write a resync marker first), does not exit. It serves: `/healthz`
/// answers, `/readyz` 503 names the cause, a subscriber is refused as `unavailable` (to
/// retry). Once the disk has room it opens the log by itself, without a restart, and the
/// subscriber learns which cluster lost acked records.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_restarted_into_a_full_disk_opens_its_log_once_there_is_room() {
    let pki = Pki::new();
    let mount_dir = pki.path("small-disk");
    let _tmpfs = Tmpfs::mount(&mount_dir, "16m")
        .unwrap_or_else(|e| panic!("this test needs a tmpfs mount (root, as the test command runs): {e}"));
    let data = mount_dir.join("hub-data");
    let port = free_port();
    crash_with_the_last_record_cut(&pki, port, &data).await;
    let balloon = Balloon::inflate(&mount_dir.join("balloon"));

    let hub = HubProc::start(&pki, port, Some(&data), &[]);
    assert_eq!(http(hub.admin_port, "GET", "/healthz").await.0, 200);
    let (status, body) = http(hub.admin_port, "GET", "/readyz").await;
    assert_eq!(status, 503, "{body}");
    assert!(body.starts_with("not ready: bus: not open yet: no space left on device ("), "{body}");
    match Subscription::connect(subscriber_opts(&pki, &hub.url(), "reader", StartFrom::Earliest)).await {
        Err(SubscribeError::Refused { code: ErrorCode::Unavailable, message }) => {
            assert!(message.contains("not open yet: no space left on device"), "{message}")
        }
        Err(e) => panic!("refused otherwise: {e}"),
        Ok(_) => panic!("subscribed before the log was open"),
    }

    balloon.deflate();
    eventually("/readyz to answer 200 once the disk has room")
        .context(|| hub.proc.stderr())
        .until(async || http(hub.admin_port, "GET", "/readyz").await, |answer| answer.0 == 200)
        .await;
    let reason = loss_of_c1(&pki, &hub).await;
    assert!(reason.contains("up to seq 101 of epoch") && reason.contains("the end of the log was cut"), "{reason}");
    assert!(hub.proc.stderr().contains("opened the bus"), "{}", hub.proc.stderr());
}
