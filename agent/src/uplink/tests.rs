//! The uplink's wake-ups against a small stand-in hub (mutual TLS and WebSocket over an
//! in-memory stream), mostly on tokio's paused clock: the clock only moves when every task
//! waits for a timer, so a session that waited for a timer before sending, or woke on a
//! period, shows in the times and counts below.

use std::sync::{Arc, Mutex};

use fleetwatch_certs::{Authority, LeafSpec};
use fleetwatch_client::transport::{Dial, DialFuture, HubUrls};
use fleetwatch_protocol::codec::decode_agent;
use fleetwatch_protocol::message::{Ack, Welcome};
use tokio::io::DuplexStream;

use super::*;
use crate::source::ChangeKind;

/// What the stand-in hub saw.
#[derive(Debug, Default)]
struct Seen {
    /// When each connection (a session) was accepted.
    sessions: Vec<Instant>,
    /// When each data message arrived, and the highest seq it carried.
    messages: Vec<(Instant, u64)>,
    /// When each ping from the agent arrived.
    pings: Vec<Instant>,
}

/// A stand-in hub: welcomes, acks every frame, pings every `ping` (if any), records.
#[derive(Clone)]
struct Hub {
    files: TlsFiles,
    ping: Option<Duration>,
    seen: Arc<Mutex<Seen>>,
}

impl Hub {
    async fn serve(self, stream: DuplexStream) {
        let config = Arc::new(fleetwatch_certs::server_config(&self.files).unwrap());
        let Ok(tls) = tokio_rustls::TlsAcceptor::from(config).accept(stream).await else { return };
        let Ok(mut ws) = tokio_tungstenite::accept_async(tls).await else { return };
        self.seen.lock().unwrap().sessions.push(Instant::now());
        let limits = Limits::default();
        let mut ping = self.ping.map(|p| tokio::time::interval_at(Instant::now() + p, p));
        loop {
            let tick = async {
                match ping.as_mut() {
                    Some(p) => p.tick().await,
                    None => std::future::pending().await,
                }
            };
            let msg = tokio::select! {
                m = ws.next() => m,
                _ = tick => {
                    if ws.send(Message::Ping(Default::default())).await.is_err() { return; }
                    continue;
                }
            };
            let now = Instant::now();
            let (text, reply) = match msg {
                Some(Ok(Message::Text(t))) => (t, None::<HubToAgent>),
                Some(Ok(Message::Ping(_))) => {
                    self.seen.lock().unwrap().pings.push(now);
                    continue;
                }
                Some(Ok(_)) => continue,
                _ => return,
            };
            let reply = match decode_agent(text.as_bytes(), &limits).unwrap() {
                AgentMessage::Hello(h) => Some(HubToAgent::Welcome(Welcome {
                    protocol: PROTOCOL_VERSION,
                    session: "s".into(),
                    cluster: h.cluster.clone().unwrap_or_default(),
                    epoch: h.epoch,
                    acked_seq: h.last_acked_seq,
                    watches: Vec::new(),
                    max_event_bytes: None,
                })),
                AgentMessage::Events(b) => {
                    let last = b.events.iter().map(|e| e.seq).max().unwrap_or(0);
                    self.seen.lock().unwrap().messages.push((now, last));
                    Some(HubToAgent::Ack(Ack { epoch: b.events[0].epoch, seq: last }))
                }
                AgentMessage::Resync(r) => {
                    self.seen.lock().unwrap().messages.push((now, r.seq));
                    Some(HubToAgent::Ack(Ack { epoch: r.epoch, seq: r.seq }))
                }
                _ => reply,
            };
            if let Some(r) = reply
                && ws.send(Message::text(encode(&r))).await.is_err()
            {
                return;
            }
        }
    }
}

/// The agent's side of the in-memory network: every dial is a new connection to the hub.
struct Net(Hub);

impl Dial for Net {
    fn dial<'a>(&'a self, _addr: &'a str) -> DialFuture<'a> {
        let (ours, theirs) = tokio::io::duplex(64 << 10);
        tokio::spawn(self.0.clone().serve(theirs));
        Box::pin(async move { Ok(Box::new(ours) as Box<dyn fleetwatch_client::transport::ByteStream>) })
    }
}

/// A CA, the hub's and agent `c1`'s certificates in a temporary directory.
struct Pki {
    dir: tempfile::TempDir,
    ca: Authority,
}

impl Pki {
    fn new() -> Self {
        fleetwatch_certs::install_crypto_provider();
        let dir = tempfile::tempdir().unwrap();
        Authority::init(dir.path(), "test.local").unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        ca.issue(dir.path(), &LeafSpec::Hub { dns: vec!["localhost".into()], ips: vec![] }, 1).unwrap();
        ca.issue(dir.path(), &LeafSpec::Agent { cluster: "c1".into() }, 1).unwrap();
        Self { dir, ca }
    }

    fn files(&self, stem: &str) -> TlsFiles {
        let d = self.dir.path();
        TlsFiles { cert: d.join(format!("{stem}.crt")), key: d.join(format!("{stem}.key")), ca: vec![d.join("ca.crt")] }
    }

    /// Renews the agent's certificate on disk (key first, then the certificate).
    fn renew_agent(&self) {
        let (cert, key, _) = self.ca.issue_pem(&LeafSpec::Agent { cluster: "c1".into() }, 1).unwrap();
        let files = self.files("agent-c1");
        std::fs::write(&files.key, key).unwrap();
        std::fs::write(&files.cert, cert).unwrap();
    }
}

/// A running agent against a stand-in hub.
struct Running {
    changes: mpsc::Sender<Change>,
    stats: watch::Receiver<AgentStats>,
    seen: Arc<Mutex<Seen>>,
    shutdown: CancellationToken,
    task: tokio::task::JoinHandle<Result<AgentStats, AgentError>>,
}

impl Running {
    fn start(pki: &Pki, hub_ping: Option<Duration>, tune: impl FnOnce(&mut AgentConfig)) -> Self {
        let seen = Arc::new(Mutex::new(Seen::default()));
        let hub = Hub { files: pki.files("hub"), ping: hub_ping, seen: seen.clone() };
        let mut config = AgentConfig::new("wss://localhost:7443".parse::<HubUrls>().unwrap(), pki.files("agent-c1"));
        config.dialer = Dialer::custom(Arc::new(Net(hub)));
        config.epoch = Some(7);
        tune(&mut config);
        let uplink = Uplink::new(config).unwrap();
        let stats = uplink.stats();
        let (changes, rx) = mpsc::channel(16);
        let shutdown = CancellationToken::new();
        let task = tokio::spawn(uplink.run(rx, shutdown.clone(), false));
        Self { changes, stats, seen, shutdown, task }
    }

    /// Waits until the published counters satisfy `cond`.
    async fn until(&mut self, what: &str, cond: impl Fn(&AgentStats) -> bool) {
        let waited = tokio::time::timeout(Duration::from_secs(600), self.stats.wait_for(|s| cond(s))).await.is_ok();
        assert!(waited, "{what}: {:?}", *self.stats.borrow());
    }

    /// Connected, with the start marker acked.
    async fn settled(&mut self) {
        self.until("connected and the start marker acked", |s| s.connected && s.acked_seq >= 1 && s.outbox_len == 0)
            .await;
    }

    async fn stop(self) -> AgentStats {
        self.shutdown.cancel();
        self.task.await.unwrap().unwrap()
    }
}

fn change(n: u64) -> Change {
    Change {
        key: crate::source::SyntheticSource::key(n),
        kind: ChangeKind::Applied,
        data: serde_json::json!({ "generation": n }),
        watch: None,
    }
}

const IDLE: Duration = Duration::from_secs(30);
/// How often a hub with the agent's idle timeout pings it.
const HUB_PING: Duration = Duration::from_secs(10);

#[tokio::test(start_paused = true)]
async fn an_idle_session_sleeps_between_the_hubs_pings() {
    let pki = Pki::new();
    let mut agent = Running::start(&pki, Some(HUB_PING), |_| {});
    agent.settled().await;
    // Ten minutes of a quiet cluster, on the paused clock (it jumps from timer to timer).
    tokio::time::sleep(Duration::from_secs(600)).await;
    let seen = agent.seen.clone();
    let stats = agent.stop().await;
    // 60 hub pings, 10 fallback reads of the certificate files, a few turns to connect and
    // to drain: the turns of an agent that wakes only for those. (It used to publish its
    // counters every 250 ms: 2,400 turns.)
    eprintln!("{} turns in 10 idle minutes", stats.wakeups);
    assert!(stats.wakeups <= 90, "{} turns in 10 idle minutes", stats.wakeups);
    let seen = seen.lock().unwrap();
    assert!(seen.pings.is_empty(), "a hub that pings was pinged {} times", seen.pings.len());
    assert_eq!(seen.sessions.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_silent_hub_is_pinged_before_the_idle_timeout_and_the_session_lives() {
    let pki = Pki::new();
    let mut agent = Running::start(&pki, None, |c| c.idle_timeout = IDLE);
    agent.settled().await;
    tokio::time::sleep(Duration::from_secs(300)).await;
    let seen = agent.seen.clone();
    let stats = agent.stop().await;
    let seen = seen.lock().unwrap();
    assert_eq!(seen.sessions.len(), 1, "the pongs kept the session");
    assert!(seen.pings.len() >= 300 / 15 - 1, "{} pings", seen.pings.len());
    for w in seen.pings.windows(2) {
        assert_eq!(w[1] - w[0], IDLE / 2, "a ping when the hub was silent for half the idle timeout");
    }
    assert!(stats.wakeups <= 20 + 2 * seen.pings.len() as u64, "{} turns", stats.wakeups);
}

#[tokio::test(start_paused = true)]
async fn a_change_is_sent_at_once_without_waiting_for_a_timer() {
    let pki = Pki::new();
    let mut agent = Running::start(&pki, Some(HUB_PING), |_| {});
    agent.settled().await;
    tokio::time::sleep(Duration::from_secs(35)).await;
    for n in 0..3 {
        let at = Instant::now();
        agent.changes.send(change(n)).await.unwrap();
        let seq = 2 + n;
        agent.until("the change acked", |s| s.acked_seq >= seq).await;
        let (arrived, last) = *agent.seen.lock().unwrap().messages.last().unwrap();
        assert_eq!(last, seq);
        assert_eq!(arrived, at, "the change waited for a timer before it went out");
        tokio::time::sleep(Duration::from_secs(7)).await;
    }
    let stats = agent.stop().await;
    assert_eq!((stats.changes, stats.acked_seq), (3, 4));
}

#[tokio::test(start_paused = true)]
async fn the_window_and_batches_hold_when_changes_come_in_a_burst() {
    let pki = Pki::new();
    let mut agent = Running::start(&pki, Some(HUB_PING), |c| {
        c.batch_size = 10;
        c.window = 20;
    });
    agent.settled().await;
    for n in 0..200 {
        agent.changes.send(change(n)).await.unwrap();
    }
    agent.until("every change acked", |s| s.acked_seq >= 201 && s.outbox_len == 0).await;
    let seen = agent.seen.lock().unwrap();
    // The start marker, then frames of at most 10 events, in order, nothing skipped.
    let mut last = 1;
    for &(_, seq) in &seen.messages[1..] {
        assert!(seq > last && seq - last <= 10, "a frame from {last} to {seq}");
        last = seq;
    }
    assert_eq!(last, 201);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_seen_through_the_watch() {
    let pki = Pki::new();
    // A fallback far beyond the test's patience: only the watch can bring the renewal.
    let mut agent = Running::start(&pki, Some(HUB_PING), |c| c.tls_reload_interval = Duration::from_secs(3600));
    agent.settled().await;
    let first = agent.stats.borrow().cert_serial.clone();
    pki.renew_agent();
    agent.until("reconnected with the renewed certificate", |s| s.renewals == 1 && s.connected).await;
    assert_ne!(agent.stats.borrow().cert_serial, first);
    let seen = agent.seen.clone();
    agent.stop().await;
    assert_eq!(seen.lock().unwrap().sessions.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn without_a_watch_a_renewal_is_seen_on_the_fallback_period() {
    let pki = Pki::new();
    let fallback = Duration::from_secs(60);
    let mut agent = Running::start(&pki, Some(HUB_PING), |c| {
        c.tls_watch = false;
        c.tls_reload_interval = fallback;
    });
    agent.settled().await;
    pki.renew_agent();
    agent.until("reconnected with the renewed certificate", |s| s.renewals == 1 && s.connected).await;
    // Read one fallback period after the last read (just before it connected), not before.
    let sessions = agent.seen.lock().unwrap().sessions.clone();
    assert_eq!(sessions.len(), 2);
    assert_eq!(sessions[1] - sessions[0], fallback);
    agent.stop().await;
}
