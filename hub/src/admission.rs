//! Admission: who may take a socket, and for how long before proving who they are.
//!
//! Connections still in the TLS or WebSocket handshake are unauthenticated: they have
//! their own small budget, globally and per source address, so idle sockets from one
//! address cannot lock out real clients. While the global budget is used up the hub does
//! not accept at all: new connections wait in the kernel's accept queue and are served as
//! slots free, instead of being reset and backing off (a fleet reconnecting after a hub
//! restart comes back at handshake speed). Only connections that completed both handshakes
//! count toward `--max-connections`.
//!
//! Sockets that have sent nothing are the cheapest attack on that budget (thousands of
//! idle TCP connections, no TLS work): a connection that has not sent its first byte is
//! *idle*. When the budget is used up and a connection waits for a place, the oldest idle
//! connection is closed to make room for it, so real clients (which send their TLS
//! ClientHello at once) keep moving through. With no one waiting nothing is closed; only a
//! connection idle for at least [`IDLE_EVICTION_AGE`] goes (its first bytes are not merely
//! in flight), and one whose bytes arrived before a busy hub looked goes on instead.
//! While idle connections hold over half the budget,
//! new connections get [`PRESSURE_HANDSHAKE_TIMEOUT`] instead of `--handshake-timeout`.
//! Refusals are counted and logged as one summary line
//! per interval, so a scanner cannot flood the log.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::metrics::Metrics;

/// How often refusals are summarised in the log.
pub(crate) const SUMMARY_INTERVAL: Duration = Duration::from_secs(10);

/// Handshake failures logged one by one per interval before they are only counted.
const DETAILED_FAILURES_PER_INTERVAL: u64 = 10;

/// The handshake timeout (first byte included) of connections accepted while idle
/// sockets hold over half the handshake budget.
pub(crate) const PRESSURE_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);

/// How long a connection must have sent nothing before it may be closed to make room.
/// Real clients send their ClientHello right behind the TCP handshake's last ACK, so a
/// connection idle this long is not one whose first bytes are merely in flight.
pub(crate) const IDLE_EVICTION_AGE: Duration = Duration::from_millis(100);

/// What [`ConnectionBudget::evict_oldest_idle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Eviction {
    /// The oldest idle connection was told to close; its place frees as it does.
    Evicted,
    /// The oldest idle connection is too young; it may be closed at this instant.
    NotBefore(Instant),
    /// No connection is idle.
    NoneIdle,
}

/// Why a connection was turned away before it became a session.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Refusal {
    /// The session budget (`--max-connections`) is used up.
    MaxConnections,
    /// Too many handshakes in progress from one source address.
    HandshakesPerIp,
}

impl Refusal {
    /// The metric label and the name in the summary line (the flag that sets the limit).
    pub(crate) fn name(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max-connections",
            Refusal::HandshakesPerIp => "max-handshakes-per-ip",
        }
    }
}

/// The budgets and the refusal counts since the last summary.
pub(crate) struct ConnectionBudget {
    sessions: Arc<Semaphore>,
    handshakes: Arc<Semaphore>,
    per_ip_limit: usize,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
    refused: Mutex<BTreeMap<Refusal, u64>>,
    failures: AtomicU64,
    failures_logged: AtomicU64,
    max_handshakes: usize,
    /// Accepted connections that have sent nothing yet, oldest first.
    idle: Mutex<std::collections::VecDeque<(u64, Instant, CancellationToken)>>,
    idle_next: AtomicU64,
}

/// An idle connection's entry; cancelled when it is closed to make room, removed on drop.
pub(crate) struct IdleGuard<'a> {
    admission: &'a ConnectionBudget,
    id: u64,
    /// Cancelled when the connection must close to make room.
    pub(crate) evicted: CancellationToken,
}

impl Drop for IdleGuard<'_> {
    fn drop(&mut self) {
        if let Ok(mut q) = self.admission.idle.lock() {
            q.retain(|(id, _, _)| *id != self.id);
        }
    }
}

/// A place in the global handshake budget, taken for an accepted connection.
pub(crate) struct HandshakePermit(OwnedSemaphorePermit);

/// A connection's place in the handshake budget; released on drop.
pub(crate) struct HandshakeSlot {
    _global: OwnedSemaphorePermit,
    ip: IpAddr,
    per_ip: Arc<Mutex<HashMap<IpAddr, usize>>>,
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        if let Ok(mut map) = self.per_ip.lock()
            && let Some(n) = map.get_mut(&self.ip)
        {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

impl ConnectionBudget {
    /// Budgets: sessions, handshakes in progress, handshakes in progress per address.
    pub(crate) fn new(max_sessions: usize, max_handshakes: usize, per_ip: usize) -> Self {
        Self {
            sessions: Arc::new(Semaphore::new(max_sessions)),
            handshakes: Arc::new(Semaphore::new(max_handshakes)),
            per_ip_limit: per_ip,
            per_ip: Default::default(),
            refused: Mutex::new(BTreeMap::new()),
            failures: AtomicU64::new(0),
            failures_logged: AtomicU64::new(0),
            max_handshakes,
            idle: Mutex::default(),
            idle_next: AtomicU64::new(0),
        }
    }

    /// A place in the global handshake budget if one is free now.
    pub(crate) fn try_handshake_permit(&self) -> Option<HandshakePermit> {
        self.handshakes.clone().try_acquire_owned().ok().map(HandshakePermit)
    }

    /// Registers a connection that has sent nothing yet.
    pub(crate) fn idle_begin(&self) -> IdleGuard<'_> {
        let id = self.idle_next.fetch_add(1, Ordering::Relaxed);
        let evicted = CancellationToken::new();
        if let Ok(mut q) = self.idle.lock() {
            q.push_back((id, Instant::now(), evicted.clone()));
        }
        IdleGuard { admission: self, id, evicted }
    }

    /// Closes the oldest connection that has sent nothing if it has been idle for
    /// `min_age` (the budget is used up and a connection waits for a place).
    pub(crate) fn evict_oldest_idle(&self, min_age: Duration) -> Eviction {
        let Ok(mut q) = self.idle.lock() else { return Eviction::NoneIdle };
        let Some((_, since, _)) = q.front() else { return Eviction::NoneIdle };
        let at = *since + min_age;
        if Instant::now() < at {
            return Eviction::NotBefore(at);
        }
        match q.pop_front() {
            Some((_, _, token)) => {
                token.cancel();
                Eviction::Evicted
            }
            None => Eviction::NoneIdle,
        }
    }

    /// Connections that have sent nothing yet.
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().map(|q| q.len()).unwrap_or(0)
    }

    /// The handshake timeout for a connection accepted now: shortened to
    /// [`PRESSURE_HANDSHAKE_TIMEOUT`] while idle sockets hold over half the budget.
    pub(crate) fn handshake_timeout(&self, configured: Duration) -> Duration {
        if self.idle_count() * 2 > self.max_handshakes {
            configured.min(PRESSURE_HANDSHAKE_TIMEOUT)
        } else {
            configured
        }
    }

    /// A place in the global handshake budget: waits while all are taken. `None` only if
    /// the budget was closed.
    pub(crate) async fn handshake_permit(&self) -> Option<HandshakePermit> {
        self.handshakes.clone().acquire_owned().await.ok().map(HandshakePermit)
    }

    /// A handshake slot for a new connection from `ip`, holding `permit`, or why not.
    pub(crate) fn begin_handshake(&self, ip: IpAddr, permit: HandshakePermit) -> Result<HandshakeSlot, Refusal> {
        let ip = source_key(ip);
        let mut map = self.per_ip.lock().map_err(|_| Refusal::HandshakesPerIp)?;
        let n = map.entry(ip).or_default();
        if *n >= self.per_ip_limit {
            if *n == 0 {
                map.remove(&ip);
            }
            return Err(Refusal::HandshakesPerIp);
        }
        *n += 1;
        Ok(HandshakeSlot { _global: permit.0, ip, per_ip: self.per_ip.clone() })
    }

    /// A session slot for a connection that completed its handshakes, or why not.
    pub(crate) fn begin_session(&self) -> Result<OwnedSemaphorePermit, Refusal> {
        self.sessions.clone().try_acquire_owned().map_err(|_| Refusal::MaxConnections)
    }

    /// Counts a refusal (metric now, log line at the next summary).
    pub(crate) fn refuse(&self, why: Refusal, metrics: &Metrics) {
        metrics.reject(why.name());
        if let Ok(mut r) = self.refused.lock() {
            *r.entry(why).or_default() += 1;
        }
    }

    /// Whether a failed handshake should be logged on its own line: the first few per
    /// interval are, the rest only counted in the summary.
    pub(crate) fn log_failure(&self) -> bool {
        self.failures.fetch_add(1, Ordering::Relaxed);
        self.failures_logged.fetch_add(1, Ordering::Relaxed) < DETAILED_FAILURES_PER_INTERVAL
    }

    /// The summary line for the interval just ended, if anything was refused or failed;
    /// resets the counts.
    pub(crate) fn take_summary(&self) -> Option<String> {
        let refused = self.refused.lock().map(|mut r| std::mem::take(&mut *r)).unwrap_or_default();
        let failures = self.failures.swap(0, Ordering::Relaxed);
        let logged = self.failures_logged.swap(0, Ordering::Relaxed).min(DETAILED_FAILURES_PER_INTERVAL);
        let total: u64 = refused.values().sum();
        let mut parts = Vec::new();
        if total > 0 {
            let by: Vec<String> = refused.iter().map(|(k, v)| format!("{}={v}", k.name())).collect();
            parts.push(format!("refused {total} connections ({})", by.join(", ")));
        }
        if failures > logged {
            parts.push(format!("{failures} handshakes failed ({} not logged one by one)", failures - logged));
        }
        if parts.is_empty() {
            return None;
        }
        Some(format!("{} in the last {}s", parts.join("; "), SUMMARY_INTERVAL.as_secs()))
    }
}

/// The source a per-address budget is kept for: an IPv4 address (also when it arrives
/// IPv4-mapped on a dual-stack listener), or an IPv6 /64, since one host usually holds a
/// whole /64 and could otherwise pick a fresh address per connection.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

/// Raises the soft open-file limit to the hard one and returns how many descriptors the
/// process may hold (`None` when the platform does not say).
pub(crate) fn raise_open_file_limit() -> Option<u64> {
    match rlimit::increase_nofile_limit(u64::MAX) {
        Ok(n) => Some(n),
        Err(e) => {
            tracing::warn!(error = %e, "cannot raise the open-file limit");
            rlimit::getrlimit(rlimit::Resource::NOFILE).ok().map(|(soft, _)| soft)
        }
    }
}

/// Descriptors kept back for files, the admin endpoint and accept bursts.
pub(crate) const FD_HEADROOM: u64 = 128;

/// Fits the session and handshake budgets under the open-file limit: returns the
/// (sessions, handshakes) to use, lowered when both together would not fit.
pub(crate) fn fit_to_fd_limit(sessions: usize, handshakes: usize, fd_limit: u64) -> (usize, usize) {
    let budget = usize::try_from(fd_limit.saturating_sub(FD_HEADROOM)).unwrap_or(usize::MAX).max(2);
    if sessions.saturating_add(handshakes) <= budget {
        return (sessions, handshakes);
    }
    // Handshakes get at most a quarter; sessions what remains.
    let handshakes = handshakes.min(budget / 4).max(1);
    (sessions.min(budget - handshakes).max(1), handshakes)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A handshake slot from `ip` (a global permit must be free: the tests never wait).
    fn begin(a: &ConnectionBudget, ip: &str) -> Result<HandshakeSlot, Refusal> {
        let permit = a.handshakes.clone().try_acquire_owned().map(HandshakePermit).expect("a free global permit");
        a.begin_handshake(ip.parse().unwrap(), permit)
    }

    #[test]
    fn per_address_budget_leaves_room_for_others() {
        let a = ConnectionBudget::new(2, 10, 3);
        let held: Vec<_> = (0..3).map(|_| begin(&a, "10.0.0.1").unwrap()).collect();
        assert_eq!(begin(&a, "10.0.0.1").err(), Some(Refusal::HandshakesPerIp));
        let other = begin(&a, "10.0.0.2").unwrap();
        drop(held);
        assert!(begin(&a, "10.0.0.1").is_ok(), "slots come back when handshakes end");
        drop(other);
        assert!(a.per_ip.lock().unwrap().len() <= 1);
        assert_eq!(a.handshakes.available_permits(), 10, "a refusal gives its global permit back");
    }

    #[test]
    fn an_ipv6_host_is_one_source_per_64() {
        let a = ConnectionBudget::new(1, 10, 2);
        let _x = begin(&a, "2001:db8::1").unwrap();
        let _y = begin(&a, "2001:db8::2").unwrap();
        assert_eq!(begin(&a, "2001:db8::3").err(), Some(Refusal::HandshakesPerIp));
        assert!(begin(&a, "2001:db8:0:1::1").is_ok());
        let _m = begin(&a, "::ffff:10.0.0.9").unwrap();
        let _n = begin(&a, "10.0.0.9").unwrap();
        assert!(begin(&a, "10.0.0.9").is_err(), "mapped and plain IPv4 are one source");
    }

    #[tokio::test]
    async fn a_full_global_budget_waits_instead_of_refusing() {
        let a = ConnectionBudget::new(1, 2, 10);
        let p1 = a.handshake_permit().await.unwrap();
        let h1 = a.begin_handshake("10.0.0.1".parse().unwrap(), p1).unwrap();
        let _h2 = a.begin_handshake("10.0.0.2".parse().unwrap(), a.handshake_permit().await.unwrap()).unwrap();
        let third = a.handshake_permit();
        tokio::pin!(third);
        assert!(futures_util::poll!(&mut third).is_pending(), "no third handshake while two are in progress");
        drop(h1);
        let p3 = third.await.expect("a slot once a handshake ended");
        assert!(a.begin_handshake("10.0.0.3".parse().unwrap(), p3).is_ok());
    }

    #[test]
    fn sessions_have_their_own_budget() {
        let a = ConnectionBudget::new(1, 2, 10);
        let s = a.begin_session().unwrap();
        assert_eq!(a.begin_session().err(), Some(Refusal::MaxConnections));
        drop(s);
        assert!(a.begin_session().is_ok());
    }

    #[test]
    fn refusals_are_summarised_once_per_interval() {
        let a = ConnectionBudget::new(1, 1, 1);
        let m = Metrics::default();
        assert_eq!(a.take_summary(), None);
        for _ in 0..150 {
            a.refuse(Refusal::HandshakesPerIp, &m);
        }
        a.refuse(Refusal::MaxConnections, &m);
        let logged = (0..25).filter(|_| a.log_failure()).count();
        assert_eq!(logged as u64, DETAILED_FAILURES_PER_INTERVAL);
        let line = a.take_summary().unwrap();
        assert_eq!(
            line,
            "refused 151 connections (max-connections=1, max-handshakes-per-ip=150); 25 handshakes failed (15 not logged one by one) in the last 10s"
        );
        assert_eq!(a.take_summary(), None);
        assert!(a.log_failure(), "a new interval logs again");
    }

    #[test]
    fn budgets_fit_the_open_file_limit() {
        assert_eq!(fit_to_fd_limit(50_000, 1024, 1 << 20), (50_000, 1024));
        let (s, h) = fit_to_fd_limit(50_000, 1024, 20_000);
        assert!(s + h <= 20_000 - FD_HEADROOM as usize && h == 1024, "{s} {h}");
        let (s, h) = fit_to_fd_limit(50_000, 1024, 1024);
        assert!(s + h <= 1024 - FD_HEADROOM as usize && h >= 1 && s >= 1, "{s} {h}");
    }
}

#[cfg(test)]
mod idle_tests {
    use super::*;

    #[test]
    fn the_oldest_idle_connection_goes_first_and_pressure_shortens_the_timeout() {
        let a = ConnectionBudget::new(10, 4, 64);
        let ten = Duration::from_secs(10);
        let g1 = a.idle_begin();
        let g2 = a.idle_begin();
        assert_eq!(a.handshake_timeout(ten), ten, "half the budget is not over half");
        let g3 = a.idle_begin();
        assert_eq!(a.handshake_timeout(ten), PRESSURE_HANDSHAKE_TIMEOUT);
        assert_eq!(a.evict_oldest_idle(Duration::ZERO), Eviction::Evicted);
        assert!(g1.evicted.is_cancelled() && !g2.evicted.is_cancelled());
        drop(g2);
        assert_eq!(a.idle_count(), 1);
        assert_eq!(a.evict_oldest_idle(Duration::ZERO), Eviction::Evicted);
        assert!(g3.evicted.is_cancelled());
        assert_eq!(a.evict_oldest_idle(Duration::ZERO), Eviction::NoneIdle);
        drop((g1, g3));
        assert_eq!(a.idle_count(), 0);
    }

    /// A connection accepted a moment ago is not closed: its first bytes may be in flight.
    #[tokio::test(start_paused = true)]
    async fn a_young_idle_connection_is_not_closed_before_its_age() {
        let a = ConnectionBudget::new(10, 4, 64);
        let g = a.idle_begin();
        let Eviction::NotBefore(at) = a.evict_oldest_idle(IDLE_EVICTION_AGE) else {
            panic!("a connection idle for no time was closed")
        };
        assert_eq!(at, Instant::now() + IDLE_EVICTION_AGE);
        assert!(!g.evicted.is_cancelled());
        tokio::time::sleep_until(at).await;
        assert_eq!(a.evict_oldest_idle(IDLE_EVICTION_AGE), Eviction::Evicted);
        assert!(g.evicted.is_cancelled());
    }
}
