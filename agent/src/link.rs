//! The pure core of one uplink session (see [`crate::uplink`]): what was sent, whether
//! more may be sent, which acks count, and when the session ends — draining on shutdown,
//! renewing the certificate (stop sending, let the hub ack what is in flight, reconnect),
//! or silence from the hub. The uplink's task carries these decisions out on the socket
//! and the outbox; kept apart, their rules are tested alone.

use std::time::Duration;

// tokio's clock: the simulation runs the agent on simulated time.
use tokio::time::Instant;

/// Why an ack from the hub is not taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AckRefused {
    /// An ack of another epoch (a hub still answering the agent's previous process).
    #[error("ack for epoch {epoch}, but this agent's epoch is {ours}")]
    OtherEpoch {
        /// The ack's epoch.
        epoch: u64,
        /// Ours.
        ours: u64,
    },
    /// An ack beyond what this session sent: taking it would drop events the hub never
    /// had from the outbox.
    #[error("ack for seq {seq}, but this session sent only up to {sent}")]
    NotSent {
        /// The acked seq.
        seq: u64,
        /// The highest seq sent.
        sent: u64,
    },
}

/// Why the hub's welcome cannot open the session.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WelcomeRefused {
    /// The hub chose a protocol version this agent does not speak: only an upgrade helps.
    #[error("the hub chose protocol {chosen} but this agent speaks {ours}")]
    Protocol {
        /// The hub's choice.
        chosen: u32,
        /// What this agent speaks.
        ours: fleetwatch_protocol::message::ProtocolRange,
    },
    /// A welcome for another epoch: a hub mixing up sessions; reconnect.
    #[error("welcome for epoch {got} but ours is {ours}")]
    Epoch {
        /// The welcome's epoch.
        got: u64,
        /// Ours.
        ours: u64,
    },
}

/// Checks the hub's welcome (its protocol choice and epoch) against this agent.
pub fn check_welcome(protocol: u32, epoch: u64, ours: u64) -> Result<(), WelcomeRefused> {
    let range = fleetwatch_protocol::message::ProtocolRange::OURS;
    if !range.contains(protocol) {
        return Err(WelcomeRefused::Protocol { chosen: protocol, ours: range });
    }
    if epoch != ours {
        return Err(WelcomeRefused::Epoch { got: epoch, ours });
    }
    Ok(())
}

/// How a session ends, as decided by [`Link::step`] and [`Link::timed_out`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Closing {
    /// Shutting down and everything is acked: close.
    Drained,
    /// Shutting down and the drain timeout passed with events unacked: close anyway (the
    /// next start resyncs).
    DrainTimeout,
    /// A renewed certificate and everything in flight is acked: reconnect with it.
    Renewed,
    /// A renewed certificate and the hub did not ack what is in flight in time: reconnect
    /// anyway (it is resent).
    RenewedUnacked,
    /// Nothing from the hub for the idle timeout: the connection is dead.
    Idle,
}

/// One session's state.
#[derive(Debug, Clone)]
pub struct Link {
    /// Most unacked seqs in flight.
    window: u64,
    /// Without any frame from the hub for this long the connection is dead.
    idle: Duration,
    /// The highest seq sent in this session.
    sent: u64,
    /// When the hub was last heard from (any frame).
    heard: Instant,
    /// When this session last pinged the hub (its start before the first ping).
    pinged: Instant,
    /// Shutting down: close once everything is acked, or at this deadline.
    draining: Option<Instant>,
    /// A renewed certificate: stop sending, close once what is in flight is acked, or at
    /// this deadline.
    renewing: Option<Instant>,
}

impl Link {
    /// A session opened at `now`, resuming after `acked` (the welcome's ack).
    pub fn new(acked: u64, now: Instant, window: u64, idle: Duration) -> Self {
        Self { window, idle, sent: acked, heard: now, pinged: now, draining: None, renewing: None }
    }

    /// The highest seq sent.
    pub fn sent(&self) -> u64 {
        self.sent
    }

    /// Whether the next frame may go out: something after what was sent waits, fewer
    /// than the window's seqs are unacked, and no renewal holds sending (a renewal's hold
    /// is lifted by a shutdown: what is left is drained on the old certificate).
    pub fn can_send(&self, acked: u64, last_seq: u64) -> bool {
        (self.renewing.is_none() || self.draining.is_some())
            && self.sent < last_seq
            && self.sent.saturating_sub(acked) < self.window
    }

    /// A frame carrying seqs up to `last` went out.
    pub fn sent_up_to(&mut self, last: u64) {
        self.sent = self.sent.max(last);
    }

    /// Any frame arrived from the hub (pings and pongs included).
    pub fn heard(&mut self, now: Instant) {
        self.heard = now;
    }

    /// When to ping the hub: once it has been silent for half the idle timeout (a hub pings
    /// its sessions at a third of its own, so a healthy hub with the same timeout is never
    /// pinged: an idle session costs neither side a ping and its pong), and again a third of
    /// the timeout later while it stays silent. Its pong is traffic; without one the idle
    /// timeout ends the session, so a half-open connection is noticed even when the hub's
    /// pings cannot arrive.
    pub fn next_ping(&self) -> Instant {
        (self.heard + self.idle / 2).max(self.pinged + self.idle / 3)
    }

    /// A ping went out at `now`.
    pub fn pinged(&mut self, now: Instant) {
        self.pinged = now;
    }

    /// Whether an ack of (`epoch`, `seq`) is taken: the seq to drop from the outbox up to.
    pub fn ack(&self, epoch: u64, seq: u64, ours: u64) -> Result<u64, AckRefused> {
        if epoch != ours {
            return Err(AckRefused::OtherEpoch { epoch, ours });
        }
        if seq > self.sent {
            return Err(AckRefused::NotSent { seq, sent: self.sent });
        }
        Ok(seq)
    }

    /// Shutdown began at `now`: drain what is pending for at most `timeout`. False when
    /// it was draining already.
    pub fn shut_down(&mut self, now: Instant, timeout: Duration) -> bool {
        if self.draining.is_some() {
            return false;
        }
        self.draining = Some(now + timeout);
        true
    }

    /// Whether the session is draining for a shutdown.
    pub fn is_draining(&self) -> bool {
        self.draining.is_some()
    }

    /// Whether the certificate files are looked at now (not while renewing or draining).
    pub fn may_renew(&self) -> bool {
        self.renewing.is_none() && self.draining.is_none()
    }

    /// The certificate was renewed at `now`: stop sending, wait at most `timeout` for the
    /// acks of what is in flight.
    pub fn renew(&mut self, now: Instant, timeout: Duration) {
        if self.may_renew() {
            self.renewing = Some(now + timeout);
        }
    }

    /// When the session must end if nothing else happens first: the idle timeout, the
    /// drain or the renewal deadline.
    pub fn deadline(&self) -> Instant {
        [self.draining, self.renewing].into_iter().flatten().fold(self.heard + self.idle, Instant::min)
    }

    /// What the [`Link::deadline`] passing at `now` means.
    pub fn timed_out(&self, now: Instant) -> Closing {
        if self.draining.is_some() {
            Closing::DrainTimeout
        } else if self.renewing.is_some_and(|r| r <= now) {
            Closing::RenewedUnacked
        } else {
            Closing::Idle
        }
    }

    /// Whether the session ends now, after anything happened: a renewal whose in-flight
    /// seqs are all acked, or a drain with nothing pending (`outbox_empty`).
    pub fn step(&self, acked: u64, outbox_empty: bool) -> Option<Closing> {
        if self.draining.is_none() && self.renewing.is_some() && acked >= self.sent {
            return Some(Closing::Renewed);
        }
        if self.draining.is_some() && outbox_empty {
            return Some(Closing::Drained);
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const IDLE: Duration = Duration::from_secs(30);
    const DRAIN: Duration = Duration::from_secs(5);

    fn link(acked: u64, window: u64) -> (Link, Instant) {
        let now = Instant::now();
        (Link::new(acked, now, window, IDLE), now)
    }

    #[test]
    fn sending_stops_at_the_window_and_resumes_with_acks() {
        let (mut l, _) = link(10, 3);
        assert!(!l.can_send(10, 10), "nothing after what was sent");
        assert!(l.can_send(10, 20));
        l.sent_up_to(13);
        assert!(!l.can_send(10, 20), "3 seqs unacked of a window of 3");
        assert!(l.can_send(11, 20));
        l.sent_up_to(20);
        assert!(!l.can_send(20, 20), "all sent");
    }

    #[test]
    fn an_ack_for_a_seq_not_sent_is_refused_with_a_reason() {
        let (mut l, _) = link(4, 100);
        l.sent_up_to(9);
        assert_eq!(l.ack(1, 9, 1), Ok(9));
        assert_eq!(l.ack(1, 3, 1), Ok(3), "an old ack is harmless: the outbox ignores it");
        let e = l.ack(1, 12, 1).unwrap_err();
        assert_eq!(e, AckRefused::NotSent { seq: 12, sent: 9 });
        assert!(e.to_string().contains("sent only up to 9"), "{e}");
        assert_eq!(l.ack(2, 5, 1), Err(AckRefused::OtherEpoch { epoch: 2, ours: 1 }));
    }

    #[test]
    fn a_renewal_stops_sending_and_closes_once_in_flight_is_acked() {
        let (mut l, now) = link(0, 100);
        l.sent_up_to(5);
        assert!(l.may_renew());
        l.renew(now, DRAIN);
        assert!(!l.may_renew(), "one renewal at a time");
        assert!(!l.can_send(0, 50), "no new frames while renewing");
        assert_eq!(l.step(4, false), None, "seq 5 is still in flight");
        assert_eq!(l.step(5, false), Some(Closing::Renewed), "what is pending but unsent waits in the outbox");
    }

    #[test]
    fn a_renewal_not_acked_in_time_reconnects_anyway() {
        let (mut l, now) = link(0, 100);
        l.sent_up_to(5);
        l.renew(now, DRAIN);
        assert_eq!(l.deadline(), now + DRAIN, "before the idle timeout");
        assert_eq!(l.timed_out(now + DRAIN), Closing::RenewedUnacked);
    }

    #[test]
    fn a_shutdown_drains_what_is_pending_even_while_renewing() {
        let (mut l, now) = link(0, 100);
        l.renew(now, DRAIN);
        assert!(l.shut_down(now, DRAIN));
        assert!(!l.shut_down(now, DRAIN), "draining already");
        assert!(l.can_send(0, 3), "the rest goes out on the old certificate");
        l.sent_up_to(3);
        assert_eq!(l.step(3, false), None, "acked, but the outbox still holds changes");
        assert_eq!(l.step(3, true), Some(Closing::Drained));
        assert_eq!(l.timed_out(now + DRAIN), Closing::DrainTimeout);
    }

    #[test]
    fn silence_past_the_idle_timeout_ends_the_session_and_any_frame_moves_it() {
        let (mut l, now) = link(0, 100);
        assert_eq!(l.deadline(), now + IDLE);
        l.heard(now + Duration::from_secs(10));
        assert_eq!(l.deadline(), now + Duration::from_secs(10) + IDLE);
        assert_eq!(l.timed_out(l.deadline()), Closing::Idle);
        // A renewal whose deadline has not come yet does not turn silence into a renewal.
        l.renew(now + Duration::from_secs(38), DRAIN);
        assert_eq!(l.timed_out(now + Duration::from_secs(40)), Closing::Idle);
    }

    #[test]
    fn a_hub_heard_from_is_not_pinged_and_a_silent_one_is_pinged_before_the_timeout() {
        let (mut l, now) = link(0, 100);
        assert_eq!(l.next_ping(), now + IDLE / 2, "no ping before half the idle timeout of silence");
        // The hub's own pings (every IDLE / 3) keep moving it: never due.
        for k in 1..10u32 {
            l.heard(now + IDLE / 3 * k);
            assert!(l.next_ping() > now + IDLE / 3 * (k + 1), "pinged a hub that pings");
        }
        // Silent from then on: a ping at half the timeout, another a third later, both
        // before the silence ends the session.
        let quiet = now + IDLE / 3 * 9;
        let first = l.next_ping();
        assert_eq!(first, quiet + IDLE / 2);
        l.pinged(first);
        let second = l.next_ping();
        assert_eq!(second, first + IDLE / 3);
        assert!(first < l.deadline() && second < l.deadline(), "the pings come before the idle timeout");
    }

    #[test]
    fn a_welcome_must_speak_our_protocol_and_epoch() {
        let ours = fleetwatch_protocol::message::PROTOCOL_VERSION;
        assert_eq!(check_welcome(ours, 7, 7), Ok(()));
        assert_eq!(check_welcome(ours, 8, 7), Err(WelcomeRefused::Epoch { got: 8, ours: 7 }));
        assert!(matches!(check_welcome(ours + 100, 7, 7), Err(WelcomeRefused::Protocol { .. })));
    }
}
