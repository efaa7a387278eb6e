//! Sources of change events: the first arrow of the agent's pipeline
//! (source → outbox → uplink).
//!
//! The runtime ([`crate::runtime`]) does not care where changes come from, so a source is a
//! trait: the Kubernetes source ([`crate::kube_source::KubeSource`]) in production, and the
//! [`SyntheticSource`] here, which stands in for a cluster in the fleet simulator, benchmarks
//! and tests (its output is known in advance, so a test can check every event arrived).

use std::future::Future;
use std::str::FromStr;
use std::time::Duration;

use fleetwatch_protocol::ObjectKey;
use fleetwatch_protocol::message::{WatchSpec, WatchState};
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// What a running source is handed by the runtime.
#[derive(Debug)]
pub struct SourceIo {
    /// Where changes go; a source stops when the receiver is gone.
    pub changes: mpsc::Sender<Change>,
    /// The watch configuration the hub pushed last (sources that watch a cluster follow it).
    pub watches: watch::Receiver<Vec<WatchSpec>>,
    /// Where the source publishes the state of its watches; the uplink reports them to the
    /// hub when [`Source::reports_watch_status`] says so.
    pub status: watch::Sender<Vec<WatchState>>,
    /// Stops the source.
    pub shutdown: CancellationToken,
}

/// A producer of changes.
pub trait Source: Send + 'static {
    /// A short description for logs (`synthetic:objects=…`, `kubernetes`).
    fn describe(&self) -> String;

    /// Whether the source publishes watch states the hub should see. Only sources that
    /// follow the pushed watch configuration do; the others would report an empty list.
    fn reports_watch_status(&self) -> bool {
        false
    }

    /// Produces changes into `io.changes` until done, shut down, or the receiver is gone.
    fn run(self, io: SourceIo) -> impl Future<Output = ()> + Send;
}

/// One observed change.
#[derive(Debug, Clone, PartialEq)]
pub struct Change {
    /// The object.
    pub key: ObjectKey,
    /// What happened.
    pub kind: ChangeKind,
    /// Its projected content.
    pub data: serde_json::Value,
    /// The watch that saw it (Kubernetes sources).
    pub watch: Option<String>,
}

/// What happened to an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Created or changed.
    Applied,
    /// Deleted.
    Deleted,
    /// The module inventory changed (`data.modules`).
    Inventory,
}

/// Synthetic changes: `objects` objects changed round-robin at `rate` changes per second,
/// optionally stopping after `total` changes. Rate 0 is an idle cluster: no change at all
/// (the source then only waits to be stopped).
///
/// Change number `i` (from 0) sets object `obj-(i % objects)` to generation
/// `i / objects + 1`, so a test knows every object's final state from `total` alone.
///
/// ```
/// use fleetwatch_agent::source::SyntheticSource;
/// let s: SyntheticSource = "synthetic:objects=100,rate=50,total=1000".parse().unwrap();
/// assert_eq!((s.objects, s.rate, s.total), (100, 50.0, Some(1000)));
/// assert_eq!(s.final_generation(7), Some(10));
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct SyntheticSource {
    /// Number of distinct objects.
    pub objects: u64,
    /// Changes per second.
    pub rate: f64,
    /// Stop after this many changes.
    pub total: Option<u64>,
    /// Bytes of padding in each event's data, to model bigger objects.
    pub payload: usize,
}

/// Why a source spec is invalid.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("bad source {spec:?}: {why} (expected synthetic:objects=N,rate=R[,total=T][,payload=BYTES])")]
pub struct SourceSpecError {
    spec: String,
    why: String,
}

impl FromStr for SyntheticSource {
    type Err = SourceSpecError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |why: &str| SourceSpecError { spec: spec.into(), why: why.into() };
        let params = spec.strip_prefix("synthetic:").ok_or_else(|| err("unknown source kind"))?;
        let mut s = SyntheticSource { objects: 0, rate: 0.0, total: None, payload: 0 };
        for kv in params.split(',').filter(|p| !p.is_empty()) {
            let (k, v) = kv.split_once('=').ok_or_else(|| err(&format!("{kv:?} is not key=value")))?;
            let num = |v: &str| v.parse::<u64>().map_err(|_| err(&format!("{k}={v} is not a whole number")));
            match k {
                "objects" => s.objects = num(v)?,
                "rate" => {
                    s.rate = v
                        .parse()
                        .ok()
                        .filter(|r: &f64| r.is_finite() && *r >= 0.0)
                        .ok_or_else(|| err("rate must be a number, 0 or more"))?
                }
                "total" => s.total = Some(num(v)?),
                "payload" => s.payload = num(v)? as usize,
                _ => return Err(err(&format!("unknown parameter {k:?}"))),
            }
        }
        if s.objects == 0 {
            return Err(err("objects must be at least 1"));
        }
        if !params.split(',').any(|kv| kv.starts_with("rate=")) {
            return Err(err("rate must be given"));
        }
        Ok(s)
    }
}

impl SyntheticSource {
    /// The key of object `n`.
    pub fn key(n: u64) -> ObjectKey {
        ObjectKey::new("synthetic.fleetwatch.dev/v1", "Object", Some("default"), &format!("obj-{n}"))
    }

    /// The last generation object `n` reaches, when there is a `total`.
    pub fn final_generation(&self, n: u64) -> Option<u64> {
        let total = self.total?;
        if n >= self.objects || n >= total {
            return None;
        }
        // Changes n, n + objects, n + 2*objects, ... below total.
        Some((total - 1 - n) / self.objects + 1)
    }

    /// Produces changes into `tx` until done, cancelled, or the receiver is gone.
    ///
    /// It wakes only when a change is due (change `i` is due `(i + 1) / rate` seconds after
    /// the start), and at high rates at most every [`MIN_TICK`], taking all that became due
    /// meanwhile: a load process runs thousands of sources, and an idle one (rate 0, or a
    /// change a minute) costs nothing between its changes.
    pub async fn produce(self, tx: mpsc::Sender<Change>, cancel: CancellationToken) {
        let started = tokio::time::Instant::now();
        let pad = "x".repeat(self.payload);
        let mut i: u64 = 0;
        loop {
            if self.total.is_some_and(|t| i >= t) {
                tracing::info!(changes = i, "synthetic source finished");
                return;
            }
            // When change `i` is due; never, at rate 0 (or a rate too low to count).
            let due = Duration::try_from_secs_f64((i + 1) as f64 / self.rate).ok().and_then(|d| started.checked_add(d));
            let wake = due.map(|d| d.max(tokio::time::Instant::now() + MIN_TICK));
            tokio::select! {
                _ = cancel.cancelled() => return,
                _ = sleep_until(wake) => {}
            }
            let due = (started.elapsed().as_secs_f64() * self.rate) as u64;
            let due = self.total.map_or(due, |t| due.min(t));
            while i < due {
                let n = i % self.objects;
                let generation = i / self.objects + 1;
                let mut data = serde_json::json!({ "generation": generation, "change": i });
                if !pad.is_empty() {
                    data["payload"] = serde_json::Value::String(pad.clone());
                }
                if tx.send(Change { key: Self::key(n), kind: ChangeKind::Applied, data, watch: None }).await.is_err() {
                    return;
                }
                i += 1;
            }
        }
    }
}

/// The shortest time between two wake-ups of a [`SyntheticSource`]: at high rates it takes
/// what became due meanwhile as one burst.
pub const MIN_TICK: Duration = Duration::from_millis(5);

/// Waits until `at`; forever when `None`.
async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

impl Source for SyntheticSource {
    fn describe(&self) -> String {
        let mut d = format!("synthetic:objects={},rate={}", self.objects, self.rate);
        if let Some(t) = self.total {
            d += &format!(",total={t}");
        }
        if self.payload > 0 {
            d += &format!(",payload={}", self.payload);
        }
        d
    }

    fn run(self, io: SourceIo) -> impl Future<Output = ()> + Send {
        self.produce(io.changes, io.shutdown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_rejects_specs() {
        assert!("synthetic:objects=1,rate=1".parse::<SyntheticSource>().is_ok());
        for bad in [
            "kube:x",
            "synthetic:objects=0,rate=1",
            "synthetic:objects=3",
            "synthetic:objects=3,rate=-1",
            "synthetic:objects=3,rate=inf",
            "synthetic:objects=x,rate=1",
            "synthetic:objects=1,rate=1,color=red",
        ] {
            assert!(bad.parse::<SyntheticSource>().is_err(), "{bad}");
        }
    }

    #[test]
    fn final_generation_matches_round_robin() {
        let s: SyntheticSource = "synthetic:objects=3,rate=1,total=7".parse().unwrap();
        // changes 0..7 touch objects 0,1,2,0,1,2,0
        assert_eq!(s.final_generation(0), Some(3));
        assert_eq!(s.final_generation(1), Some(2));
        assert_eq!(s.final_generation(2), Some(2));
        assert_eq!(s.final_generation(3), None);
    }

    #[tokio::test(start_paused = true)]
    async fn produces_total_changes() {
        let s: SyntheticSource = "synthetic:objects=3,rate=1000,total=10".parse().unwrap();
        let (tx, mut rx) = mpsc::channel(100);
        s.produce(tx, CancellationToken::new()).await;
        let mut got = Vec::new();
        while let Ok(c) = rx.try_recv() {
            got.push(c);
        }
        assert_eq!(got.len(), 10);
        assert_eq!(got[9].data["generation"], 4);
        assert_eq!(got[9].key.name, "obj-0");
    }

    #[tokio::test(start_paused = true)]
    async fn changes_come_when_due_and_an_idle_source_never_wakes() {
        // One change every 100 s: each arrives when due, not before (no tick in between).
        let s: SyntheticSource = "synthetic:objects=2,rate=0.01,total=3".parse().unwrap();
        let (tx, mut rx) = mpsc::channel(10);
        let start = tokio::time::Instant::now();
        let producer = tokio::spawn(s.produce(tx, CancellationToken::new()));
        for k in 1..=3u64 {
            let c = rx.recv().await.expect("a change");
            assert_eq!(c.data["change"], k - 1);
            assert_eq!(start.elapsed(), Duration::from_secs(100 * k));
        }
        producer.await.unwrap();
        // Rate 0: nothing, ever, until stopped (paused time would jump to any timer of its).
        let idle: SyntheticSource = "synthetic:objects=1,rate=0".parse().unwrap();
        assert_eq!(idle.rate, 0.0);
        let (tx, mut rx) = mpsc::channel(10);
        let cancel = CancellationToken::new();
        let producer = tokio::spawn(idle.produce(tx, cancel.clone()));
        let start = tokio::time::Instant::now();
        assert!(tokio::time::timeout(Duration::from_secs(86_400), rx.recv()).await.is_err());
        assert_eq!(start.elapsed(), Duration::from_secs(86_400));
        cancel.cancel();
        producer.await.unwrap();
        assert!(rx.recv().await.is_none());
    }

    #[test]
    fn describes_itself_as_its_spec() {
        for spec in ["synthetic:objects=3,rate=1000,total=10", "synthetic:objects=1,rate=2.5,payload=64"] {
            let s: SyntheticSource = spec.parse().unwrap();
            assert_eq!(s.describe(), spec);
            assert_eq!(s.describe().parse::<SyntheticSource>().unwrap(), s);
        }
    }
}
