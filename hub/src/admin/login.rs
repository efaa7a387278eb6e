//! Browser logins to the admin endpoint: the cookie holds a random session id (never the
//! token), and wrong tokens are rate-limited per client address.
//!
//! - A session lives [`SESSION_TTL`] and only while the token it was opened with is still
//!   the one in force (a rotated token ends every browser session). At most
//!   [`MAX_SESSIONS`] are kept; past that the oldest goes.
//! - [`FAILURES_PER_WINDOW`] wrong credentials per client per [`WINDOW`], on every
//!   authentication path (the login page, a bearer token, a session cookie); then `429`
//!   with `Retry-After` until the window ends, without even comparing the token. Wrong
//!   credentials and refusals are logged as one summary line per [`WINDOW`], not a line each.
//! - A client is an IPv4 address or an IPv6 /64 ([`client_key`]): whoever holds a /64 holds
//!   every address in it, so counting addresses would give them 2^64 budgets.
//! - At most [`MAX_ADDRESSES`] clients are tracked; past that the one whose window started
//!   first is forgotten. A table strangers filled never refuses a client of its own (the
//!   right token from a fresh address is always compared): the token's 128+ bits, not the
//!   table, are what keeps guessers out; the table only keeps the hub from answering
//!   thousands of guesses a second to one client.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

/// How long a browser session lasts.
pub(crate) const SESSION_TTL: Duration = Duration::from_secs(12 * 3600);
/// Most browser sessions kept.
pub(crate) const MAX_SESSIONS: usize = 1024;
/// Wrong tokens allowed per address per window.
pub(crate) const FAILURES_PER_WINDOW: u32 = 5;
/// The rate-limit window, also the summary interval.
pub(crate) const WINDOW: Duration = Duration::from_secs(60);
/// Most addresses tracked at once.
pub(crate) const MAX_ADDRESSES: usize = 4096;

struct Session {
    /// The token the session was opened with: it ends when the token in force changes.
    token: String,
    expires: Instant,
}

#[derive(Default)]
struct Counts {
    wrong: u64,
    limited: u64,
    addresses: std::collections::HashSet<IpAddr>,
}

/// Browser sessions and the per-address login budget.
#[derive(Default)]
pub(crate) struct Logins {
    sessions: Mutex<HashMap<String, Session>>,
    /// Per address: (window start, wrong tokens in it).
    failures: Mutex<HashMap<IpAddr, (Instant, u32)>>,
    counts: Mutex<Counts>,
}

/// What to do with a login attempt before looking at its token.
pub(crate) enum Gate {
    /// Go on.
    Open,
    /// Over the budget: answer 429 with this Retry-After.
    Limited(Duration),
}

/// The client an address counts as: an IPv4 address (also when mapped into IPv6), or the
/// /64 an IPv6 address is in (`2001:db8::1` and `2001:db8::ffff:1` are one client).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(std::net::Ipv6Addr::from(u128::from(v6) & !((1u128 << 64) - 1))),
        },
    }
}

impl Logins {
    /// Whether the client at `ip` may try a credential now.
    pub(crate) fn gate(&self, ip: IpAddr) -> Gate {
        let ip = client_key(ip);
        let now = Instant::now();
        let f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let limited = match f.get(&ip) {
            Some((start, n)) if now.duration_since(*start) < WINDOW && *n >= FAILURES_PER_WINDOW => {
                Some(WINDOW.saturating_sub(now.duration_since(*start)))
            }
            _ => None,
        };
        drop(f);
        match limited {
            Some(wait) => {
                let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
                c.limited += 1;
                c.addresses.insert(ip);
                Gate::Limited(wait.max(Duration::from_secs(1)))
            }
            None => Gate::Open,
        }
    }

    /// Counts a wrong credential from the client at `ip`.
    pub(crate) fn failed(&self, ip: IpAddr) {
        let ip = client_key(ip);
        let now = Instant::now();
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        if !f.contains_key(&ip) && f.len() >= MAX_ADDRESSES {
            f.retain(|_, (start, _)| now.duration_since(*start) < WINDOW);
            // Still full: forget the client whose window started first.
            if f.len() >= MAX_ADDRESSES
                && let Some(oldest) = f.iter().min_by_key(|(_, (start, _))| *start).map(|(k, _)| *k)
            {
                f.remove(&oldest);
            }
        }
        let e = f.entry(ip).or_insert((now, 0));
        if now.duration_since(e.0) >= WINDOW {
            *e = (now, 0);
        }
        e.1 += 1;
        drop(f);
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.wrong += 1;
        if c.addresses.len() < MAX_ADDRESSES {
            c.addresses.insert(ip);
        }
    }

    /// Opens a session for a browser that presented `token`; its random id.
    pub(crate) fn open(&self, token: &str) -> String {
        let id = format!("{:032x}", rand::random::<u128>());
        let now = Instant::now();
        let mut s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        s.retain(|_, v| v.expires > now);
        while s.len() >= MAX_SESSIONS {
            let Some(oldest) = s.iter().min_by_key(|(_, v)| v.expires).map(|(k, _)| k.clone()) else { break };
            s.remove(&oldest);
        }
        s.insert(id.clone(), Session { token: token.to_string(), expires: now + SESSION_TTL });
        id
    }

    /// Whether the session id is open and was opened with the token in force.
    pub(crate) fn valid(&self, id: &str, token: &crate::admin::auth::Token) -> bool {
        let s = self.sessions.lock().unwrap_or_else(|p| p.into_inner());
        s.get(id).is_some_and(|v| v.expires > Instant::now() && token.matches(&v.token))
    }

    /// The summary line for the window just ended, if there were wrong tokens; resets.
    pub(crate) fn take_summary(&self) -> Option<String> {
        let c = std::mem::take(&mut *self.counts.lock().unwrap_or_else(|p| p.into_inner()));
        if c.wrong == 0 && c.limited == 0 {
            return None;
        }
        Some(format!(
            "admin login: {} wrong tokens, {} attempts refused with 429 (over {FAILURES_PER_WINDOW} a minute), from {} \
             addresses in the last {}s",
            c.wrong,
            c.limited,
            c.addresses.len(),
            WINDOW.as_secs()
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn five_wrong_tokens_then_429_per_address() {
        let l = Logins::default();
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        for _ in 0..FAILURES_PER_WINDOW {
            assert!(matches!(l.gate(a), Gate::Open));
            l.failed(a);
        }
        assert!(matches!(l.gate(a), Gate::Limited(d) if d <= WINDOW && d >= Duration::from_secs(1)));
        assert!(matches!(l.gate(b), Gate::Open), "another address is not limited");
        let line = l.take_summary().unwrap();
        assert!(line.contains("5 wrong tokens") && line.contains("1 attempts refused") && line.contains("1 addresses"));
        assert!(l.take_summary().is_none());
    }

    #[test]
    fn an_ipv6_64_is_one_client_and_a_mapped_ipv4_its_address() {
        let l = Logins::default();
        for i in 0..FAILURES_PER_WINDOW {
            // A different address of the same /64 each time.
            l.failed(format!("2001:db8:1:2::{:x}", i + 1).parse().unwrap());
        }
        assert!(matches!(l.gate("2001:db8:1:2:ffff::9".parse().unwrap()), Gate::Limited(_)));
        assert!(matches!(l.gate("2001:db8:1:3::1".parse().unwrap()), Gate::Open), "another /64");
        assert_eq!(client_key("::ffff:10.0.0.1".parse().unwrap()), "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn a_table_strangers_filled_never_refuses_a_fresh_client() {
        let l = Logins::default();
        // One wrong guess from each of more clients than the table holds.
        for i in 0..(MAX_ADDRESSES as u32 + 100) {
            l.failed(IpAddr::V4(std::net::Ipv4Addr::from(0x0a00_0000 + i)));
        }
        assert!(l.failures.lock().unwrap().len() <= MAX_ADDRESSES);
        assert!(matches!(l.gate("192.168.1.1".parse().unwrap()), Gate::Open));
        // A client over its own budget is still limited.
        let a: IpAddr = "172.16.0.1".parse().unwrap();
        for _ in 0..FAILURES_PER_WINDOW {
            l.failed(a);
        }
        assert!(matches!(l.gate(a), Gate::Limited(_)));
    }

    #[test]
    fn sessions_are_random_and_end_with_the_token() {
        let l = Logins::default();
        let token = crate::admin::auth::Token::fixed("a-long-admin-token-0123456789");
        let id = l.open("a-long-admin-token-0123456789");
        assert!(!id.contains("admin-token") && id.len() == 32);
        assert_ne!(id, l.open("a-long-admin-token-0123456789"));
        assert!(l.valid(&id, &token));
        assert!(!l.valid("guess", &token));
        let rotated = crate::admin::auth::Token::fixed("another-long-admin-token-987654");
        assert!(!l.valid(&id, &rotated));
    }
}
