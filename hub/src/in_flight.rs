//! The pure core of an agent session (see [`crate::session::agent`]): which of the agent's
//! batches are being stored, and what may be acked. The session hands a batch to the bus
//! ([`Ledger::submit`]), takes the bus's answers oldest first ([`Ledger::stored`]) and acks
//! cumulatively what every batch up to it made stored ([`Ledger::acked`]). Keeping this
//! apart from the socket and the bus lets its rules be tested alone: acks only move
//! forward and only over stored batches, a batch must follow what was handed on before,
//! a marker waits until nothing is in flight, and at most [`MAX_IN_FLIGHT`] batches are
//! stored at once.

use std::collections::VecDeque;

// tokio's clock (std's in programs): the simulation runs sessions on simulated time.
use tokio::time::Instant;

/// Batches of one session being stored at once; beyond it the session waits for the oldest
/// before it reads the next frame (a network bus's round trips overlap, within bounds).
pub(crate) const MAX_IN_FLIGHT: usize = 4;

/// A batch being stored: the seq its ack covers, its events, when it was handed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Batch {
    /// The highest seq in the batch: what its ack covers.
    pub(crate) last: u64,
    /// Events in it.
    pub(crate) n: u64,
    /// When it was handed to the bus (for the append histogram).
    pub(crate) started: Instant,
}

/// What the ledger refuses, with why: each one is a bug in the session, never the agent's
/// doing (ingest refuses out-of-order seqs before they get here).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum LedgerError {
    /// A batch that does not follow what was handed to the bus already.
    #[error("batch up to seq {last} does not follow seq {submitted}, already handed to the bus")]
    NotAfter {
        /// The batch's last seq.
        last: u64,
        /// The highest seq handed on before.
        submitted: u64,
    },
    /// More batches than [`MAX_IN_FLIGHT`]: the session must wait for the oldest first.
    #[error("{MAX_IN_FLIGHT} batches are being stored already; wait for the oldest first")]
    Full,
    /// A bus answer when no batch is being stored: nothing it could ack.
    #[error("a bus answer with no batch in flight: nothing to ack")]
    NothingInFlight,
    /// A resync marker while batches are being stored: a marker decides from the cluster's
    /// head, so everything before it must be stored first.
    #[error("a resync marker at seq {seq} while {in_flight} batch(es) are being stored")]
    MarkerWhileInFlight {
        /// The marker's seq.
        seq: u64,
        /// Batches in flight.
        in_flight: usize,
    },
}

/// The in-flight bookkeeping of one agent session.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    /// The highest seq stored and acked.
    acked: u64,
    /// The highest seq handed to the bus (stored, or in flight).
    submitted: u64,
    /// Batches being stored, oldest first: the bus answers in this order.
    batches: VecDeque<Batch>,
}

impl Ledger {
    /// A session resumed where the hub has the agent's stream up to `acked`.
    pub(crate) fn resumed(acked: u64) -> Self {
        Self { acked, submitted: acked, batches: VecDeque::new() }
    }

    /// The highest seq stored: what the agent is (or may be) acked.
    pub(crate) fn acked(&self) -> u64 {
        self.acked
    }

    /// The highest seq handed to the bus: what ingest takes as already had (a resend of
    /// it is skipped).
    pub(crate) fn submitted(&self) -> u64 {
        self.submitted
    }

    /// Whether no batch is being stored.
    pub(crate) fn is_idle(&self) -> bool {
        self.batches.is_empty()
    }

    /// Whether the session must wait for the oldest batch before it reads another frame.
    pub(crate) fn is_full(&self) -> bool {
        self.batches.len() >= MAX_IN_FLIGHT
    }

    /// A batch was handed to the bus.
    pub(crate) fn submit(&mut self, batch: Batch) -> Result<(), LedgerError> {
        if self.is_full() {
            return Err(LedgerError::Full);
        }
        if batch.last <= self.submitted {
            return Err(LedgerError::NotAfter { last: batch.last, submitted: self.submitted });
        }
        self.submitted = batch.last;
        self.batches.push_back(batch);
        Ok(())
    }

    /// The bus stored the oldest batch in flight (it answers in order): the ack moves to
    /// its last seq. Answers the batch. After a failed answer the session ends instead, and
    /// nothing after it is acked.
    pub(crate) fn stored(&mut self) -> Result<Batch, LedgerError> {
        let batch = self.batches.pop_front().ok_or(LedgerError::NothingInFlight)?;
        self.acked = batch.last;
        Ok(batch)
    }

    /// A resync marker at `seq` was stored (or coalesced into a pending one): acked. Only
    /// with nothing in flight. What was handed on is left as it was (a resend of the
    /// marker's seq is taken as new, as before).
    pub(crate) fn resynced(&mut self, seq: u64) -> Result<(), LedgerError> {
        if !self.batches.is_empty() {
            return Err(LedgerError::MarkerWhileInFlight { seq, in_flight: self.batches.len() });
        }
        self.acked = seq;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn batch(last: u64, n: u64) -> Batch {
        Batch { last, n, started: Instant::now() }
    }

    #[test]
    fn acks_move_only_over_stored_batches_oldest_first() {
        let mut l = Ledger::resumed(10);
        l.submit(batch(12, 2)).unwrap();
        l.submit(batch(15, 3)).unwrap();
        // Handed on but not stored: nothing more may be acked yet, resends are had.
        assert_eq!((l.acked(), l.submitted()), (10, 15));
        assert_eq!(l.stored().unwrap().last, 12);
        assert_eq!(l.acked(), 12, "only the oldest batch is stored");
        let b = l.stored().unwrap();
        assert_eq!((b.last, b.n), (15, 3));
        assert_eq!(l.acked(), 15);
        assert!(l.is_idle());
    }

    #[test]
    fn an_answer_with_nothing_in_flight_is_refused_and_acks_nothing() {
        let mut l = Ledger::resumed(7);
        assert_eq!(l.stored(), Err(LedgerError::NothingInFlight));
        assert_eq!(l.acked(), 7);
        l.submit(batch(8, 1)).unwrap();
        l.stored().unwrap();
        assert_eq!(l.stored(), Err(LedgerError::NothingInFlight), "that batch was answered already");
        assert_eq!(l.acked(), 8);
    }

    #[test]
    fn a_batch_must_follow_what_was_handed_on() {
        let mut l = Ledger::resumed(5);
        assert_eq!(l.submit(batch(5, 1)), Err(LedgerError::NotAfter { last: 5, submitted: 5 }));
        l.submit(batch(9, 4)).unwrap();
        let e = l.submit(batch(8, 1)).unwrap_err();
        assert_eq!(e, LedgerError::NotAfter { last: 8, submitted: 9 });
        assert!(e.to_string().contains("does not follow seq 9"), "{e}");
        assert_eq!(l.submitted(), 9, "a refused batch changes nothing");
    }

    #[test]
    fn at_most_max_in_flight_batches_are_stored_at_once() {
        let mut l = Ledger::resumed(0);
        for i in 1..=MAX_IN_FLIGHT as u64 {
            assert!(!l.is_full());
            l.submit(batch(i, 1)).unwrap();
        }
        assert!(l.is_full());
        assert_eq!(l.submit(batch(100, 1)), Err(LedgerError::Full));
        l.stored().unwrap();
        assert!(!l.is_full(), "the oldest stored: room for one more");
        l.submit(batch(100, 1)).unwrap();
    }

    #[test]
    fn a_marker_waits_until_nothing_is_in_flight() {
        let mut l = Ledger::resumed(3);
        l.submit(batch(4, 1)).unwrap();
        assert_eq!(l.resynced(5), Err(LedgerError::MarkerWhileInFlight { seq: 5, in_flight: 1 }));
        assert_eq!(l.acked(), 3);
        l.stored().unwrap();
        l.resynced(5).unwrap();
        assert_eq!(l.acked(), 5);
    }
}
