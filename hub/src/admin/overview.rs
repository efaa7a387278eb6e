//! The fleet-sized parts of the admin API: the paged, filtered lists of clusters and
//! Runtimes ([`crate::admin::list`]), the counts alone (`/api/v1/summary`), and the live
//! stream of counts and changes ([`crate::admin::stream`]) with the task that computes them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use fleetwatch_protocol::message::WatchPhase;
use tokio_util::sync::CancellationToken;

use crate::admin::list::{BadRequest, ListQuery, PhaseFilter};
use crate::admin::stream::{ClusterState, Counts, Delta, Follower, Tracker};
use crate::admin::{Admin, MAX_STREAMS, OVERVIEW_INTERVAL, cluster_rows};
use crate::context::Context;
use crate::fleet::rows::Row;

/// The broadcast of deltas the followers read, and the states the next delta is computed
/// from. A new follower measures its snapshot under the same lock, priming the tracker when
/// nobody followed before: no change falls between its snapshot and its first delta.
#[derive(Clone)]
pub(crate) struct Deltas {
    tx: Arc<tokio::sync::broadcast::Sender<Arc<Delta>>>,
    tracker: Arc<tokio::sync::Mutex<Tracker>>,
}

impl Deltas {
    pub(crate) fn new() -> Self {
        let tx = tokio::sync::broadcast::channel(crate::admin::stream::BROADCAST_DEPTH).0;
        Self { tx: Arc::new(tx), tracker: Arc::default() }
    }
}

fn bad_request(e: BadRequest) -> Response {
    (StatusCode::BAD_REQUEST, axum::Json(serde_json::json!({ "error": e.0 }))).into_response()
}

/// Modules not ready per cluster id, from the Runtimes the hub reads.
fn runtime_not_ready(ctx: &Context) -> HashMap<String, usize> {
    let Ok(view) = ctx.runtimes.read() else { return HashMap::new() };
    let mut out = HashMap::new();
    for r in &view.items {
        let n = r.modules.iter().filter(|m| m.state != "Ready").count();
        *out.entry(r.cluster.clone()).or_default() += n;
    }
    out
}

/// The state the stream follows of one cluster.
fn state_of(r: &Row, not_ready: &HashMap<String, usize>) -> ClusterState {
    let runtime = not_ready.get(&r.cluster).copied().unwrap_or(0);
    ClusterState {
        connected: r.connected,
        watches_failed: r.health.watches_failing as usize,
        modules_not_ready: (r.health.modules_not_ready as usize).max(runtime),
        hub: r.hub.as_deref().map(str::to_string),
    }
}

/// Where a row sorts with `order=problems` ([`ClusterState::rank`]), without allocating.
fn rank_of(r: &Row, not_ready: &HashMap<String, usize>) -> u8 {
    let runtime = not_ready.get(&r.cluster).copied().unwrap_or(0);
    ClusterState {
        connected: r.connected,
        watches_failed: r.health.watches_failing as usize,
        modules_not_ready: (r.health.modules_not_ready as usize).max(runtime),
        hub: None,
    }
    .rank()
}

fn has_phase(r: &Row, filter: &PhaseFilter) -> bool {
    match filter {
        PhaseFilter::Failed => r.health.watches_failing > 0,
        PhaseFilter::Phase(p) => {
            serde_json::from_value::<WatchPhase>(serde_json::Value::String(p.clone())).is_ok_and(|p| r.has_phase(p))
        }
    }
}

/// `GET /api/v1/clusters`: paged and filtered (`connected`, `watchPhase`, `q`, `order`).
pub(crate) async fn clusters(
    State(ctx): State<Arc<Context>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let q = match ListQuery::parse(&params, &["connected", "watchPhase"]) {
        Ok(q) => q,
        Err(e) => return bad_request(e),
    };
    let not_ready = runtime_not_ready(&ctx);
    // Filtered and paged as rows; JSON only for the page's items.
    let list: Vec<(u8, Row)> = cluster_rows(&ctx)
        .into_iter()
        .filter(|r| q.connected.is_none_or(|want| r.connected == want))
        .filter(|r| q.watch_phase.as_ref().is_none_or(|f| has_phase(r, f)))
        .filter(|r| q.name_matches(&r.cluster))
        .map(|r| (rank_of(&r, &not_ready), r))
        .collect();
    match q.page(list, |(rank, r)| (*rank, r.cluster.clone())) {
        Ok(page) => {
            let metadata = page.metadata();
            let items: Vec<serde_json::Value> = page.items.into_iter().map(|(_, r)| r.value()).collect();
            axum::Json(serde_json::json!({ "metadata": metadata, "clusters": items })).into_response()
        }
        Err(e) => bad_request(e),
    }
}

/// `GET /api/v1/runtimes`: the hub's view of the Runtimes, paged and filtered
/// (`labelSelector`, `q` on the Runtime or its cluster, `order=problems`: unhealthy first).
pub(crate) async fn runtimes(
    State(ctx): State<Arc<Context>>,
    Query(params): Query<HashMap<String, String>>,
) -> Response {
    let q = match ListQuery::parse(&params, &["labelSelector"]) {
        Ok(q) => q,
        Err(e) => return bad_request(e),
    };
    // One read of the shared view: its state, and the matching Runtimes (not all of them
    // cloned).
    let (mut view, items) = match ctx.runtimes.read() {
        Ok(v) => {
            let state = crate::fleet::RuntimesView {
                configured: v.configured,
                updated: v.updated,
                error: v.error.clone(),
                skipped: v.skipped,
                ..Default::default()
            };
            let items: Vec<_> = v
                .items
                .iter()
                .filter(|r| q.label_selector.as_ref().is_none_or(|s| s.matches(&r.labels)))
                .filter(|r| q.name_matches(&r.runtime) || q.name_matches(&r.cluster))
                .cloned()
                .collect();
            (state, items)
        }
        Err(_) => Default::default(),
    };
    match q.page(items, |r| (u8::from(r.healthy()), r.runtime.clone())) {
        Ok(page) => {
            let metadata = page.metadata();
            view.items = page.items;
            let mut doc = serde_json::to_value(&view).unwrap_or_default();
            doc["metadata"] = metadata;
            axum::Json(doc).into_response()
        }
        Err(e) => bad_request(e),
    }
}

/// The states of every cluster and the overview's counts, `events_total` being the
/// events accepted so far (for the rate).
async fn measure(ctx: &Context) -> (HashMap<String, ClusterState>, Counts, u64) {
    let not_ready = runtime_not_ready(ctx);
    let list = cluster_rows(ctx);
    let mut events_total = 0u64;
    let mut states = HashMap::with_capacity(list.len());
    let mut counts = Counts::default();
    for r in &list {
        // Other replicas' clusters count through their heartbeats (their entries hold the
        // counters as of their last write only).
        events_total += r.own_events;
        let s = state_of(r, &not_ready);
        counts.connected += usize::from(s.connected);
        counts.watches_failing += usize::from(s.connected && s.watches_failed > 0);
        counts.modules_not_ready += usize::from(s.connected && s.modules_not_ready > 0);
        states.insert(r.cluster.clone(), s);
    }
    events_total += ctx.fleet.others_events();
    counts.clusters = list.len();
    counts.disconnected = counts.clusters - counts.connected;
    counts.ready = ctx.checks().iter().all(|c| c.state.is_ok());
    if let Ok(view) = ctx.runtimes.read() {
        counts.runtimes = view.items.len();
        counts.runtimes_not_ready = view.items.iter().filter(|r| r.state.as_deref() != Some("Ready")).count();
    }
    counts.runtimes_version = *ctx.runtimes_changed.borrow();
    let subs = ctx.sessions.fanout.subscriptions(ctx.sessions.bus.last_offset());
    counts.subscriptions = subs.len();
    counts.subscriptions_lagging = subs.iter().filter(|s| s.lag_records > 0).count();
    counts.watch_configs_refused =
        ctx.watch_verdicts.read().map(|v| v.iter().filter(|v| !v.accepted).count()).unwrap_or(0);
    (states, counts, events_total)
}

/// `GET /api/v1/summary`: the overview's counts without any list.
pub(crate) async fn summary(State(ctx): State<Arc<Context>>) -> impl IntoResponse {
    let (_, counts, _) = measure(&ctx).await;
    axum::Json(counts)
}

/// The least time between two rounds of [`follow_overview`] woken by changes.
const MIN_ROUND_GAP: Duration = Duration::from_millis(250);

/// The pause after a round of `took` before a change may start the next: at least
/// [`MIN_ROUND_GAP`], and four times the round, so following the fleet takes at most a
/// fifth of a core however fast clusters come and go (at 50,000 clusters a round is tens of
/// milliseconds, and in a reconnect storm clusters connect every millisecond).
fn round_gap(took: Duration) -> Duration {
    MIN_ROUND_GAP.max(took * 4)
}

/// Computes the deltas every [`OVERVIEW_INTERVAL`], when a cluster connects or
/// disconnects and when a Runtime changes (no sooner than [`round_gap`] after the last
/// round: the next round sees every change made meanwhile), while someone follows the
/// stream.
pub(crate) async fn follow_overview(ctx: Arc<Context>, deltas: Deltas, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(OVERVIEW_INTERVAL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut runtimes = ctx.runtimes_changed.subscribe();
    let mut last: Option<(u64, tokio::time::Instant)> = None;
    let mut next_round = tokio::time::Instant::now();
    loop {
        let woken_by_change = tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => false,
            _ = ctx.sessions.registry.changed() => true,
            _ = runtimes.changed() => true,
        };
        if woken_by_change {
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep_until(next_round) => {}
            }
        }
        let round_began = tokio::time::Instant::now();
        let mut tracker = deltas.tracker.lock().await;
        if deltas.tx.receiver_count() == 0 {
            // Nobody follows: start afresh when someone does.
            *tracker = Tracker::default();
            last = None;
            continue;
        }
        let (states, mut counts, events) = measure(&ctx).await;
        let now = tokio::time::Instant::now();
        // The rate over the last interval; a round sooner than 0.5 s after the last keeps
        // the last rate (a burst of connects must not read as a rate of zero).
        match last {
            Some((before, at)) if now.duration_since(at) >= OVERVIEW_INTERVAL / 2 => {
                let rate = events.saturating_sub(before) as f64 / now.duration_since(at).as_secs_f64();
                counts.events_per_sec = (rate * 10.0).round() / 10.0;
                last = Some((events, now));
            }
            Some(_) => counts.events_per_sec = tracker.events_per_sec(),
            None => last = Some((events, now)),
        }
        if let Some(d) = tracker.update(states, counts) {
            let _ = deltas.tx.send(Arc::new(d));
        }
        drop(tracker);
        next_round = tokio::time::Instant::now() + round_gap(round_began.elapsed());
    }
}

/// `GET /api/v1/overview/stream`: a snapshot of the counts, then deltas, within the
/// follower's byte budget.
pub(crate) async fn overview_stream(State(admin): State<Admin>) -> Response {
    let Ok(permit) = admin.streams.clone().try_acquire_owned() else {
        let msg = format!("too many followers of the live overview (at most {MAX_STREAMS}); try again later\n");
        return (StatusCode::SERVICE_UNAVAILABLE, msg).into_response();
    };
    // Subscribed and measured under the tracker's lock: the next delta is computed from
    // states no older than this snapshot, so no change falls between the two.
    let mut tracker = admin.deltas.tracker.lock().await;
    let rx = admin.deltas.tx.subscribe();
    let (states, mut counts, _) = measure(&admin.ctx).await;
    counts.events_per_sec = tracker.events_per_sec();
    let first = crate::admin::stream::snapshot(&counts, 0, false);
    if tracker.is_fresh() {
        // The prime round: its counts-only delta reaches this follower too (harmless).
        if let Some(d) = tracker.update(states, counts) {
            let _ = admin.deltas.tx.send(Arc::new(d));
        }
    }
    drop(tracker);
    let follower = Follower::new(rx, first);
    let stream = futures_util::stream::unfold((follower, permit), |(mut f, permit)| async move {
        let out = f.next().await?;
        let event = Event::default().event(out.event).data(out.data);
        Some((Ok::<_, std::convert::Infallible>(event), (f, permit)))
    });
    Sse::new(stream).keep_alive(KeepAlive::default()).into_response()
}

#[cfg(test)]
mod tests {
    use fleetwatch_protocol::message::{ModuleInventory, WatchState};

    use super::*;
    use crate::cluster::ClusterStatus;

    fn row(phases: &[WatchPhase], modules_ready: &[bool], connected: bool) -> Row {
        let watch = |p: &WatchPhase| WatchState { name: "w".into(), phase: *p, message: String::new(), objects: 0 };
        let module = |r: &bool| ModuleInventory { name: "m".into(), version: "1".into(), ready: *r };
        let status = ClusterStatus {
            cluster: "c".into(),
            connected,
            watches: phases.iter().map(watch).collect(),
            inventory: modules_ready.iter().map(module).collect(),
            ..ClusterStatus::default()
        };
        Row::local(status, Some("hub-1"))
    }

    #[test]
    fn rows_filter_by_watch_phase_and_rank_problems_first() {
        let r = row(&[WatchPhase::Running, WatchPhase::Forbidden], &[true], true);
        let phase = |p: &str| PhaseFilter::Phase(p.into());
        assert!(has_phase(&r, &PhaseFilter::Failed) && has_phase(&r, &phase("forbidden")));
        assert!(has_phase(&r, &phase("running")) && !has_phase(&r, &phase("error")));
        let healthy = row(&[WatchPhase::Running, WatchPhase::WaitingForKind], &[true], true);
        assert!(!has_phase(&healthy, &PhaseFilter::Failed) && has_phase(&healthy, &phase("waiting-for-kind")));
        let none = HashMap::new();
        assert_eq!(state_of(&r, &none).rank(), 1, "failing watches");
        assert_eq!(state_of(&row(&[], &[true, false], true), &none).rank(), 2, "a module not ready");
        assert_eq!(state_of(&healthy, &none).rank(), 3);
        assert_eq!(state_of(&row(&[WatchPhase::Error], &[], false), &none).rank(), 0, "disconnected first");
        // A Runtime's modules not ready count too.
        let runtime = HashMap::from([("c".to_string(), 2)]);
        let s = state_of(&healthy, &runtime);
        assert_eq!((s.rank(), s.modules_not_ready, s.hub.as_deref()), (2, 2, Some("hub-1")));
    }

    #[test]
    fn following_takes_at_most_a_fifth_of_a_core() {
        assert_eq!(round_gap(Duration::from_millis(5)), MIN_ROUND_GAP, "small fleets: a change shows within 250 ms");
        let took = Duration::from_millis(120);
        let gap = round_gap(took);
        assert!(took.as_secs_f64() / (took + gap).as_secs_f64() <= 0.2, "{gap:?}");
    }
}
