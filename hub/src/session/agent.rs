//! One agent's session: the connection side of the agent → hub arrow. It admits the
//! session in the registry, then for each frame asks [`crate::ingest`] what to do and
//! carries the decision out: throttle, append to the bus, ack, record status, or close.
//!
//! What it owns is what the pure ingest step cannot: the socket, the bus round trip, the
//! clock (rate budgets delay acks, never drop), and the registry's shared state. Acks are
//! sent only after the bus accepted a batch. Up to [`crate::in_flight::MAX_IN_FLIGHT`] batches are being
//! stored at once (the bookkeeping is the pure [`crate::in_flight::Ledger`]) (a network bus's round trips then overlap instead of queueing the
//! agent's next batch); acks stay cumulative and in order, and the first failure ends the
//! session, nothing after it acked (see [`fleetwatch_bus::Bus::start_append`] for why a later
//! batch stored meanwhile cannot hide the loss). A second agent for a connected cluster id
//! is refused (see [`crate::registry`]).

use std::sync::Arc;
// tokio's clock (std's in programs): the simulation runs sessions on simulated time.
use tokio::time::Instant;

use futures_util::stream::FuturesOrdered;
use futures_util::{FutureExt, StreamExt};

use fleetwatch_protocol::codec::encode;
use fleetwatch_protocol::message::{Ack, Configure, ErrorCode, Hello, HubToAgent, ProtocolRange, Welcome};
use tokio_tungstenite::tungstenite::protocol::frame::coding::CloseCode;
use tokio_util::sync::CancellationToken;

use crate::cluster::RecentEvent;
use crate::in_flight::{Batch, Ledger, LedgerError};
use crate::ingest::{self, Decision, Refusal};
use crate::peer::Peer;
use crate::rate::{Budget, RESYNCS_PER_SEC};
use crate::registry::{OpenOutcome, Opening, StoredMarker};
use crate::session::Sessions;
use crate::session::conn::{Conn, End};
use fleetwatch_bus::{Append, Bus, BusError, BusFuture, RecordBody};

/// Records a subscriber may be behind for want of the hub's CPU before batches wait
/// (four of its reads; about 20 ms at 100,000 events/s).
const FANOUT_LAG: u64 = 2_048;
/// The first and the longest wait before a hello asks the bus again for its cluster's head
/// (see `Session::head_at_hello`).
const HEAD_RETRY_FIRST: std::time::Duration = std::time::Duration::from_millis(250);
const HEAD_RETRY_MAX: std::time::Duration = std::time::Duration::from_secs(2);
/// The longest a batch waits for subscribers to catch up.
const FANOUT_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Serves an agent's session until it ends.
///
/// A plain function answering an `async move` block rather than an `async fn`: an `async fn`
/// keeps its arguments twice in its future (as passed and as moved into its body), a block
/// once; the future is held for the session's life (see decision 0026).
#[allow(clippy::manual_async_fn)] // on purpose: see above
pub(crate) fn run(
    mut conn: Conn,
    cluster: String,
    peer: Peer,
    ctx: Arc<Sessions>,
    shutdown: CancellationToken,
) -> impl std::future::Future<Output = ()> + Send {
    async move {
        let limits = ctx.settings.limits;
        // The first message must be a hello, within the handshake timeout (boxed: once per session).
        let first =
            Box::pin(conn.first_message("hello", ctx.settings.handshake_timeout, &shutdown, &ctx.metrics)).await;
        let (hello, protocol) =
            match first.and_then(|bytes| ingest::hello(&cluster, &bytes, &limits).map_err(|r| refused(&ctx, r))) {
                Ok(negotiated) => negotiated,
                Err(end) => return Box::pin(end.finish(conn, "agent")).await,
            };

        let session_id = format!("{:016x}", rand::random::<u64>());
        let cancel = shutdown.child_token();
        conn.count_pings(ctx.metrics.pings_sent.clone());
        let opening = Opening {
            session: &session_id,
            remote: &conn.peer.to_string(),
            agent_version: &hello.agent_version,
            protocol,
            // Checked by `ingest::hello`; the fallback is never taken.
            agent_protocols: hello.protocols().unwrap_or(ProtocolRange { min: protocol, max: protocol }),
            epoch: hello.epoch,
            cancel: cancel.clone(),
            liveness: conn.liveness(),
        };
        // A live session answers pings every ping interval: silence over two of them means
        // it missed a round and is presumed dead.
        let stale_after = 2 * Conn::ping_interval(ctx.settings.idle_timeout);
        match ctx.registry.open(&cluster, opening, stale_after) {
            OpenOutcome::Opened { replaced: None } => {}
            OpenOutcome::Opened { replaced: Some(why) } => tracing::info!(%why, "new session replaces the old one"),
            OpenOutcome::Conflict { connected_from, since } => {
                ctx.metrics.cluster_conflicts.inc();
                ctx.metrics.reject("cluster-already-connected");
                let since = since.map(|t| format!(" since {t}")).unwrap_or_default();
                let msg = format!(
                    "cluster {cluster:?} is already connected from {connected_from}{since} (another agent process with \
                     the same cluster id); this agent (epoch {}) is refused: stop one of them or give it its own \
                     cluster certificate",
                    hello.epoch
                );
                tracing::warn!(%connected_from, epoch = hello.epoch, "second agent for a connected cluster refused");
                return Box::pin(conn.fail(ErrorCode::ClusterAlreadyConnected, msg, CloseCode::Policy)).await;
            }
        }
        ctx.registry.certificate(&cluster, &peer.serial, peer.not_after);
        ctx.metrics.agent_sessions.inc();
        ctx.metrics.connected("agent");
        tracing::info!(
            session = %session_id,
            epoch = hello.epoch,
            last_acked = hello.last_acked_seq,
            protocol,
            agent_version = %hello.agent_version,
            "agent connected"
        );
        let cluster: Arc<str> = Arc::from(cluster);
        let mut session = Session {
            ctx: ctx.clone(),
            cluster: cluster.clone(),
            epoch: hello.epoch,
            ledger: Ledger::default(),
            budget: ctx.registry.budget(&cluster, ctx.settings.max_events_per_sec),
            warned_rate: false,
            foreign_head: None,
            liveness: conn.liveness(),
            protocol,
            // Registered before the hello's head read (see `Session::serve_inner`).
            watching: ctx.bus.replica_share().is_some().then(|| ctx.heads.watch(&cluster, hello.epoch)),
        };
        let end = session.serve(&mut conn, &hello, &session_id, &cancel, &shutdown, &peer).await;
        ctx.metrics.agent_sessions.dec();
        ctx.metrics.disconnected("agent", end.reason());
        ctx.registry.close(&cluster, &session_id);
        Box::pin(end.finish(conn, "agent")).await;
    }
}

/// The bus's answers for the batches being stored, in the order of the session's
/// [`Ledger`].
type InFlight<'b> = FuturesOrdered<BusFuture<'b, u64>>;

/// Counts a refusal and turns a fatal one into how the session ends.
fn refused(ctx: &Sessions, r: Refusal) -> End {
    if let Some(reject) = r.reject {
        ctx.metrics.reject(reject);
    }
    End::Fail(r.code, r.message, r.close.unwrap_or(CloseCode::Policy))
}

struct Session {
    ctx: Arc<Sessions>,
    cluster: Arc<str>,
    epoch: u64,
    /// What is stored and acked, and what is being stored.
    ledger: Ledger,
    /// The cluster's rate budget, shared by its sessions: reconnecting does not refill it.
    budget: Arc<std::sync::Mutex<Budget>>,
    warned_rate: bool,
    /// The latest record of another agent process of this cluster this session has
    /// answered with a marker (see [`Session::check_interleaved`]).
    foreign_head: Option<(u64, u64)>,
    /// When the agent was last heard from.
    liveness: Arc<crate::registry::Liveness>,
    /// The protocol version negotiated at the hello, spoken for the whole session.
    protocol: u32,
    /// Its place among the sessions poked to look at their cluster's head (on a shared
    /// bus); taken by the serving loop.
    watching: Option<crate::session::heads::Watching>,
}

/// What [`Session::check_interleaved`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Checked {
    /// Answered the head (or found nothing to answer).
    Done,
    /// The agent was silent: made again later.
    Deferred,
}

impl Session {
    /// Serves until the session ends; returns how.
    async fn serve(
        &mut self,
        conn: &mut Conn,
        hello: &Hello,
        session_id: &str,
        cancel: &CancellationToken,
        shutdown: &CancellationToken,
        peer: &Peer,
    ) -> End {
        match self.serve_inner(conn, hello, session_id, cancel, shutdown, peer).await {
            Ok(never) => match never {},
            Err(end) => end,
        }
    }

    async fn serve_inner(
        &mut self,
        conn: &mut Conn,
        hello: &Hello,
        session_id: &str,
        cancel: &CancellationToken,
        shutdown: &CancellationToken,
        peer: &Peer,
    ) -> Result<std::convert::Infallible, End> {
        // Boxed here and on the other rare paths below (a resync, the interleave check, a
        // configuration push, throttling, the end): a session's future is as large as its
        // largest state, kept for the session's life, idle or not (decision 0026).
        self.ledger = Ledger::resumed(Box::pin(self.resume_point(hello, cancel)).await?);
        let mut watches_rx = self.ctx.watches.subscribe();
        // Encoded at once, not kept: a local lives in the session's future until its scope ends.
        let welcome = encode(&HubToAgent::Welcome(Welcome {
            protocol: self.protocol,
            session: session_id.into(),
            cluster: self.cluster.to_string(),
            epoch: self.epoch,
            acked_seq: self.ledger.acked(),
            watches: watches_rx.borrow_and_update().as_ref().clone(),
            max_event_bytes: Some(self.ctx.settings.limits.max_event_bytes),
        }));
        Box::pin(conn.send_text(welcome)).await.map_err(|e| End::Closed(e.to_string()))?;
        // Batches being stored, oldest first: the agent is acked in this order, each batch
        // only once it and every batch before it were stored. The first failure ends the
        // session (the agent resends from its last ack); a later batch that was stored
        // meanwhile is the bus's to mark (see `Bus::start_append`).
        let bus = self.ctx.bus.clone();
        let mut in_flight = InFlight::new();
        // On a bus shared by hub replicas another process of this cluster may be connected
        // to another replica at the same time; when a head of another process is recorded
        // for the cluster (or a replica went away before recording its heads) the session
        // is poked and looks whether that process stored records after this one's (see
        // `check_interleaved` and `session::heads`). The session registered before it read
        // the head for the hello, so nothing recorded after that read goes unnoticed.
        // Within one hub the registry refuses a second live process, so the other buses
        // need no check.
        let watching = self.watching.take();
        // The interleave check's look at the head, in flight.
        let mut peek: Option<BusFuture<'static, Option<(u64, u64)>>> = None;
        // When a check deferred because the agent was silent is made again.
        let mut recheck: Option<Instant> = None;
        loop {
            if self.ledger.is_full() {
                self.stored(conn, &mut in_flight).await?;
            }
            let bytes = tokio::select! {
                m = conn.next_message(&self.ctx.metrics) => m?,
                r = in_flight.next(), if !self.ledger.is_idle() => {
                    self.acknowledge(conn, &mut in_flight, r).await?;
                    continue;
                }
                Ok(()) = watches_rx.changed() => {
                    let watches = watches_rx.borrow_and_update().as_ref().clone();
                    tracing::info!(watches = watches.len(), "pushing new watch configuration");
                    let msg = HubToAgent::Configure(Configure { watches });
                    Box::pin(conn.send_text(encode(&msg))).await.map_err(|e| End::Closed(e.to_string()))?;
                    continue;
                }
                _ = async { watching.as_ref().expect("guarded").poke.notified().await }, if watching.is_some() && peek.is_none() => {
                    // A look at the head first, beside the session's traffic: only a head of
                    // another process is worth stopping for (waiting for every batch in
                    // flight and asking again). The head recorded may be older than the
                    // stream's (paced), or answered already.
                    self.ctx.metrics.interleave_peeks.inc();
                    let (bus, cluster) = (self.ctx.bus.clone(), self.cluster.clone());
                    peek = Some(Box::pin(async move { bus.head(&cluster).await }));
                    continue;
                }
                // Boxed: rare, and a timer is large in the session's future (held for its life).
                _ = async { Box::pin(tokio::time::sleep_until(recheck.expect("guarded"))).await }, if recheck.is_some() && peek.is_none() => {
                    recheck = None;
                    self.ctx.metrics.interleave_peeks.inc();
                    let (bus, cluster) = (self.ctx.bus.clone(), self.cluster.clone());
                    peek = Some(Box::pin(async move { bus.head(&cluster).await }));
                    continue;
                }
                head = async { peek.as_mut().expect("guarded").await }, if peek.is_some() => {
                    peek = None;
                    let head = head.map_err(bus_failed)?;
                    if head.is_some_and(|(epoch, _)| epoch != self.epoch) {
                        // The check decides from the cluster's head: everything before it first.
                        Box::pin(self.finish_in_flight(conn, &mut in_flight)).await?;
                        if Box::pin(self.check_interleaved()).await? == Checked::Deferred {
                            recheck = Some(Instant::now() + Conn::ping_interval(self.ctx.settings.idle_timeout));
                        }
                    }
                    continue;
                }
                _ = cancel.cancelled() => {
                    // Batches in progress are finished (stored and acked) first.
                    Box::pin(self.finish_in_flight(conn, &mut in_flight)).await?;
                    return Err(if let Some(why) = self.ctx.end_reason(peer) {
                        End::Fail(ErrorCode::Forbidden, why, CloseCode::Policy)
                    } else if shutdown.is_cancelled() {
                        End::Fail(ErrorCode::ShuttingDown, "hub shutting down".into(), CloseCode::Away)
                    } else {
                        End::Fail(ErrorCode::Replaced, "a newer session of this agent (or one replacing this silent session) took over".into(), CloseCode::Policy)
                    });
                }
            };
            // A batch in progress is finished (appended and acked) even when shutdown
            // starts meanwhile: cancellation is only looked at between messages.
            let state = ingest::State { cluster: &self.cluster, epoch: self.epoch, acked: self.ledger.submitted() };
            match ingest::frame(state, &bytes, &self.ctx.settings.limits) {
                Decision::Append { items, last, inventory, recent } => {
                    let n = items.len() as u64;
                    let started = Instant::now();
                    let storing = self.start_events(conn, &*bus, items, inventory).await?;
                    in_flight.push_back(storing);
                    self.ledger.submit(Batch { last, n, started }).map_err(ledger_broken)?;
                    // The web view's recent events: shown once handed to the bus.
                    self.ctx.registry.recent(&self.cluster, recent);
                }
                Decision::Ack => self.ack(conn).await?,
                Decision::Resync { seq, reason } => {
                    // A marker decides from the cluster's head: everything before it first.
                    Box::pin(self.finish_in_flight(conn, &mut in_flight)).await?;
                    Box::pin(self.resync(conn, seq, reason)).await?;
                }
                Decision::Inventory(modules) => self.ctx.registry.inventory(&self.cluster, modules),
                Decision::WatchStatus(watches) => {
                    tracing::debug!(watches = watches.len(), "watch status");
                    self.ctx.registry.watch_status(&self.cluster, watches);
                }
                Decision::Refuse(r) if r.close.is_none() => {
                    if let Some(reject) = r.reject {
                        self.ctx.metrics.reject(reject);
                    }
                    Box::pin(conn.send_error(r.code, r.message, false)).await;
                }
                Decision::Refuse(r) => return Err(refused(&self.ctx, r)),
            }
        }
    }

    /// Waits for every batch in flight to be stored, acking them.
    async fn finish_in_flight(&mut self, conn: &mut Conn, in_flight: &mut InFlight<'_>) -> Result<(), End> {
        while !self.ledger.is_idle() {
            self.stored(conn, in_flight).await?;
        }
        Ok(())
    }

    /// Waits for the oldest batch in flight to be stored and acks it.
    async fn stored(&mut self, conn: &mut Conn, in_flight: &mut InFlight<'_>) -> Result<(), End> {
        let r = in_flight.next().await;
        self.acknowledge(conn, in_flight, r).await
    }

    /// Takes the answer for the oldest batch in flight (and those of the next ones that are
    /// ready too), then sends one cumulative ack. A failure ends the session with its
    /// cause; nothing after it is acked.
    async fn acknowledge(
        &mut self,
        conn: &mut Conn,
        in_flight: &mut InFlight<'_>,
        mut answer: Option<Result<u64, BusError>>,
    ) -> Result<(), End> {
        while let Some(r) = answer {
            if self.ledger.is_idle() {
                break;
            }
            r.map_err(|e| {
                tracing::warn!(error = %e, "bus append failed: batch not acked");
                bus_failed(e)
            })?;
            let batch = self.ledger.stored().map_err(ledger_broken)?;
            self.ctx.metrics.append_seconds.observe(batch.started.elapsed().as_secs_f64());
            self.ctx.metrics.events_received.inc_by(batch.n);
            self.ctx.registry.acked(&self.cluster, self.epoch, batch.last, batch.n);
            if self.ledger.is_idle() {
                break;
            }
            answer = in_flight.next().now_or_never().flatten();
        }
        self.ack(conn).await
    }

    /// Another agent process of this cluster connected to another hub replica may have
    /// stored records after this session's (a second pod of the agent during a rollout, or
    /// one started by mistake). They may carry older states than this process reported: it
    /// listed before this one's latest changes and sent later (seed 2928 of the NATS
    /// simulation). If that process stops first, nothing corrects them, since this process
    /// sends an object again only when it changes. So when the cluster's head is a record
    /// of another process, not answered yet, a `resync-required` is stored after it: a
    /// subscriber reconciles the cluster from that point on. The session looks at the head
    /// beside its traffic when poked (see [`crate::session::heads`]) and
    /// runs this check (after its batches in flight) only when the head is another
    /// process's record; one process alone never triggers it.
    async fn check_interleaved(&mut self) -> Result<Checked, End> {
        let head = self.ctx.bus.head(&self.cluster).await.map_err(bus_failed)?;
        let Some((epoch, seq)) = head else { return Ok(Checked::Done) };
        // Nothing of this process stored (no state of it to protect: its first batch after
        // these records is preceded by a marker, or does not follow them and is delivered as
        // one; see `interleave_marker` and `Fw-Prev`), its own record is the head, or this
        // head was answered already.
        if self.ledger.acked() == 0 || epoch == self.epoch || self.foreign_head == Some((epoch, seq)) {
            return Ok(Checked::Done);
        }
        // An agent silent for more than a ping round may be the process that died (its
        // session lingers until the ping timeout while its successor appends elsewhere): a
        // marker from it would be a resync more. The check is made again a ping interval
        // later (nothing pokes again); by then a dead agent's session has ended, and a live
        // one's reconnect answers the other process's records too (see `ingest::resume_gap`).
        if self.liveness.silent_for() > Conn::ping_interval(self.ctx.settings.idle_timeout).mul_f32(1.5) {
            return Ok(Checked::Deferred);
        }
        self.foreign_head = Some((epoch, seq));
        let reason = format!(
            "another agent process of this cluster (epoch {epoch}, up to seq {seq}) stored events while this one \
             (epoch {}) is connected to another hub replica: they may be older than what this one reported",
            self.epoch
        );
        tracing::warn!(%reason, "recording resync-required");
        let offset = self
            .append(vec![Append {
                epoch: self.epoch,
                seq: self.ledger.acked(),
                body: RecordBody::ResyncRequired(reason),
            }])
            .await?;
        let marker = StoredMarker { epoch: self.epoch, seq: self.ledger.acked(), offset };
        self.ctx.registry.resync_stored(&self.cluster, marker);
        self.ctx.metrics.resyncs.inc();
        Ok(Checked::Done)
    }

    /// Works out what the hub has of this agent's stream. When the agent was acked more
    /// than the cluster's head shows, subscribers may have missed something: a resync
    /// marker is recorded with the true reason (see [`ingest::resume_gap`]), unless one
    /// this hub stored is still the head and unread (see
    /// [`crate::registry::SessionRegistry::resync_pending`]).
    async fn resume_point(&mut self, hello: &Hello, cancel: &CancellationToken) -> Result<u64, End> {
        let head = self.head_at_hello(cancel).await?;
        let bus = &self.ctx.bus;
        let stats = bus.stats();
        let cause = ingest::lost_cause(stats.durable, bus.replica_share().is_some(), stats.first_offset > 1);
        let (have, reason) = ingest::resume_gap(head, hello.epoch, hello.last_acked_seq, cause);
        let Some(reason) = reason else { return Ok(have) };
        if self.ctx.registry.resync_pending(&self.cluster, head, self.ctx.bus.replica_share().is_some()) {
            tracing::info!(%reason, "a resync-required no subscriber has read yet is pending for this cluster; not recording another");
            return Ok(hello.last_acked_seq);
        }
        tracing::warn!(%reason, "recording resync-required");
        let offset = self
            .append(vec![Append {
                epoch: hello.epoch,
                seq: hello.last_acked_seq,
                body: RecordBody::ResyncRequired(reason),
            }])
            .await?;
        let marker = StoredMarker { epoch: hello.epoch, seq: hello.last_acked_seq, offset };
        self.ctx.registry.resync_stored(&self.cluster, marker);
        self.ctx.metrics.resyncs.inc();
        Ok(hello.last_acked_seq)
    }

    /// The cluster's head for the welcome, asked again while the bus times out, for up to
    /// half the idle timeout (the agent waits that long for its welcome). The session holds
    /// nothing yet, so a read asked again changes nothing; ending it instead made the agent
    /// connect again, a TLS handshake more for each, while JetStream was already short of
    /// time (at 50,000 agents over 3 replicas a third of the sessions ended so).
    async fn head_at_hello(&self, cancel: &CancellationToken) -> Result<Option<(u64, u64)>, End> {
        let give_up = Instant::now() + self.ctx.settings.idle_timeout / 2;
        let mut wait = HEAD_RETRY_FIRST;
        loop {
            match self.ctx.bus.head(&self.cluster).await {
                Ok(head) => return Ok(head),
                Err(e) if e.is_timeout() && Instant::now() + wait < give_up => {
                    tracing::debug!(error = %e, retry_in = ?wait, "the bus did not answer in time: asking again");
                    self.ctx.metrics.hello_head_retries.inc();
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = cancel.cancelled() => return Err(bus_failed(e)),
                    }
                    wait = (wait * 2).min(HEAD_RETRY_MAX);
                }
                Err(e) => return Err(bus_failed(e)),
            }
        }
    }

    /// Appends to the bus. A failure ends the session with its real cause (the batch is
    /// not acked; the agent resends it after reconnecting). Answers the offset of the
    /// last record.
    async fn append(&self, items: Vec<Append>) -> Result<u64, End> {
        let started = Instant::now();
        let offset = self.ctx.bus.append(self.cluster.clone(), items).await.map_err(|e| {
            tracing::warn!(error = %e, "bus append failed: batch not acked");
            bus_failed(e)
        })?;
        self.ctx.metrics.append_seconds.observe(started.elapsed().as_secs_f64());
        Ok(offset)
    }

    /// Starts carrying out [`Decision::Append`]: throttle, hand the batch to the bus; the
    /// returned future answers once it is stored (then the session acks it).
    async fn start_events<'b>(
        &mut self,
        conn: &mut Conn,
        bus: &'b dyn Bus,
        items: Vec<Append>,
        inventory: Option<Vec<fleetwatch_protocol::message::ModuleInventory>>,
    ) -> Result<BusFuture<'b, u64>, End> {
        if let Some(modules) = inventory {
            self.ctx.registry.inventory(&self.cluster, modules);
        }
        self.yield_to_fanout().await;
        // A poisoned lock only means a panic elsewhere mid-update: the budget is still usable.
        let wait = self.budget.lock().unwrap_or_else(|e| e.into_inner()).take_events(items.len());
        if !wait.is_zero() {
            Box::pin(self.delay_ack(conn, wait)).await;
        }
        let storing = bus.start_append(self.cluster.clone(), items).await.map_err(|e| {
            tracing::warn!(error = %e, "bus append failed: batch not acked");
            bus_failed(e)
        })?;
        Ok(storing)
    }

    /// Delivering what is stored comes before storing more. While some subscriber that could
    /// take more is over [`FANOUT_LAG`] records behind because the hub has not sent them yet
    /// (its CPU spent on ingest), this batch waits, up to [`FANOUT_WAIT`]. The agent's window
    /// then fills and its outbox coalesces changes, so an overloaded hub delivers at its
    /// capacity instead of taking in everything and sending out little (measured before: at
    /// 200,000 offered events/s, 155,000/s accepted, 21,000/s delivered). Bounded, so a
    /// subscriber stuck for another reason slows ingest but never stops it.
    async fn yield_to_fanout(&self) {
        let bus = &self.ctx.bus;
        // Looked at first without waiting: the wait is the rare case, and boxed.
        if self.ctx.fanout.hub_behind(bus.last_offset(), FANOUT_LAG) {
            Box::pin(self.ctx.fanout.wait_for_fanout(|| bus.last_offset(), FANOUT_LAG, FANOUT_WAIT)).await;
        }
    }

    /// Carries out [`Decision::Resync`]: throttle, store unless an unread one is pending
    /// (see [`crate::registry::SessionRegistry::resync_pending`]), ack.
    async fn resync(&mut self, conn: &mut Conn, seq: u64, reason: String) -> Result<(), End> {
        // Every resync counts, stored or coalesced: a flood of them is slowed down like
        // a flood of events.
        let wait = self.budget.lock().unwrap_or_else(|e| e.into_inner()).take_resync();
        self.delay_ack(conn, wait).await;
        // The head is asked for only when a pending marker could absorb this request: on a
        // bus shared by replicas never, and there it cost every starting agent a request or
        // two to JetStream's stream leader for nothing.
        let shared = self.ctx.bus.replica_share().is_some();
        let pending = self.ctx.registry.may_absorb_resync(&self.cluster, shared) && {
            let head = self.ctx.bus.head(&self.cluster).await.map_err(bus_failed)?;
            self.ctx.registry.resync_pending(&self.cluster, head, shared)
        };
        if pending {
            // Nothing was stored since the last marker and no subscriber was sent it yet:
            // they reconcile once, after this request, anyway.
            tracing::info!(%reason, seq, "agent requested resync; an unread one is already pending, acked without storing");
            self.ctx.metrics.resyncs_coalesced.inc();
        } else {
            tracing::info!(%reason, seq, "agent requested resync");
            let entry = RecentEvent::new(seq, "resync-required", &reason, jiff::Timestamp::now(), None);
            let offset =
                self.append(vec![Append { epoch: self.epoch, seq, body: RecordBody::ResyncRequired(reason) }]).await?;
            self.ctx.registry.resync_stored(&self.cluster, StoredMarker { epoch: self.epoch, seq, offset });
            self.ctx.registry.recent(&self.cluster, [entry]);
            self.ctx.metrics.resyncs.inc();
        }
        self.ledger.resynced(seq).map_err(ledger_broken)?;
        self.ctx.registry.acked(&self.cluster, self.epoch, seq, 0);
        self.ack(conn).await
    }

    /// Waits `wait` before the next ack, telling the agent once why.
    async fn delay_ack(&mut self, conn: &mut Conn, wait: std::time::Duration) {
        if wait.is_zero() {
            return;
        }
        if !self.warned_rate {
            self.warned_rate = true;
            let msg = format!(
                "over {} events/s or {RESYNCS_PER_SEC} resyncs/s: acks are delayed",
                self.ctx.settings.max_events_per_sec
            );
            tracing::info!(%msg, "throttling agent");
            conn.send_error(ErrorCode::RateLimited, msg, false).await;
        }
        self.ctx.metrics.throttled_seconds.inc_by(wait.as_secs_f64());
        self.ctx.metrics.throttled_acks.inc();
        tokio::time::sleep(wait).await;
    }

    async fn ack(&self, conn: &mut Conn) -> Result<(), End> {
        let ack = HubToAgent::Ack(Ack { epoch: self.epoch, seq: self.ledger.acked() });
        conn.send_text(encode(&ack)).await.map_err(|e| End::Closed(e.to_string()))
    }
}

/// Ends the session on a bus failure with its real cause (nothing unstored is acked; the
/// agent resends after reconnecting).
fn bus_failed(e: BusError) -> End {
    let code = match e {
        BusError::Closed => ErrorCode::ShuttingDown,
        BusError::Opening(_) => ErrorCode::Unavailable,
        _ => ErrorCode::Internal,
    };
    End::Fail(code, format!("hub could not store events: {e}"), CloseCode::Error)
}

/// Ends the session on a broken rule of its bookkeeping (a bug here, never the agent's
/// doing): nothing more is acked, the agent resends after reconnecting.
fn ledger_broken(e: LedgerError) -> End {
    tracing::error!(error = %e, "agent session bookkeeping broken");
    End::Fail(ErrorCode::Internal, format!("hub session error: {e}"), CloseCode::Error)
}
