//! The local tail's check that a record follows its cluster's latest one (`Fw-Prev`) and
//! is not older than a record of another agent process stored before it (`Fw-Known`): a
//! record that does not is delivered as `resync-required`. Pure: the tail feeds it the
//! records in stream order (see [`super::append`] for why records name their predecessor).

use std::collections::HashMap;
use std::sync::Arc;

/// What the local tail knows of each cluster's records.
pub(super) struct Chain {
    pub(super) last: HashMap<Arc<str>, Latest>,
    /// The first offset the tail saw: a cluster missing from `last` has no record below it
    /// only when it is 1 (otherwise its latest may have been evicted unseen).
    pub(super) seen_from: u64,
    /// The tail reads a recreated stream from its first record, and its `resync-required`
    /// `*` ([`super::RECREATED`]) is known stored further on: every record before it is
    /// covered by it (a subscriber re-lists every cluster when it reads the marker, after
    /// them), so none of them needs a check of its own. Records of replicas that had not
    /// noticed the recreation land there (a whole batch of an agent: one `resync-required`
    /// each, a hundred per `js-empty` in the soak of issue 44).
    pub(super) before_marker: bool,
}

/// A cluster's latest records as the local tail took them in.
#[derive(Debug, Clone, Copy)]
pub(super) struct Latest {
    /// (epoch, seq) of the latest record that was not stale: the one the next must name.
    key: (u64, u64),
    /// The epoch and offset of the latest record stored (a stale one too).
    epoch: u64,
    offset: u64,
    /// The offset of the latest record stored of another epoch than `epoch` (0: none seen).
    other: u64,
    /// The highest seq taken in of the last few agent processes (epoch, seq; epoch 0:
    /// none), newest first: `key` only knows the latest process's.
    seqs: [(u64, u64); 3],
}

impl Latest {
    pub(super) fn new(key: (u64, u64), offset: u64) -> Self {
        Self { key, epoch: key.0, offset, other: 0, seqs: [key, (0, 0), (0, 0)] }
    }

    /// The highest seq taken in of agent process `epoch`, if it is one of the last few.
    fn highest(&self, epoch: u64) -> Option<u64> {
        self.seqs.iter().find(|(e, _)| *e == epoch && epoch != 0).map(|(_, s)| *s)
    }

    /// Takes in record `key` of its process.
    fn note(&mut self, key: (u64, u64)) {
        match self.seqs.iter().position(|(e, _)| *e == key.0) {
            Some(i) => {
                let seq = self.seqs[i].1.max(key.1);
                self.seqs[..=i].rotate_right(1);
                self.seqs[0] = (key.0, seq);
            }
            None => {
                self.seqs.rotate_right(1);
                self.seqs[0] = key;
            }
        }
    }
}

impl Chain {
    /// Whether a record of `cluster` stored at `offset`, naming `prev` as its predecessor
    /// and `known` as the stream's end its publisher knew, follows the cluster's latest
    /// record and is not older than a record of another agent process stored before it:
    /// `Err(why)` when it does not (or cannot be known to), and it takes the record's place
    /// as the latest either way (unless it is older than the latest of its own process).
    pub(super) fn follow(
        &mut self,
        cluster: &Arc<str>,
        prev: Option<&str>,
        known: Option<&str>,
        now: (u64, u64),
        offset: u64,
    ) -> Result<(), &'static str> {
        // The bookkeeping either way: the records after the marker follow these.
        let verdict = self.check(cluster, prev, known, now, offset);
        if self.before_marker { Ok(()) } else { verdict }
    }

    /// The recreated stream's `resync-required` `*` was read: records after it are checked.
    pub(super) fn marker_read(&mut self) {
        self.before_marker = false;
    }

    fn check(
        &mut self,
        cluster: &Arc<str>,
        prev: Option<&str>,
        known: Option<&str>,
        now: (u64, u64),
        offset: u64,
    ) -> Result<(), &'static str> {
        // The cluster's latest key, and the offset of its latest record of another agent
        // process than this one's (0: none).
        let (last, other) = match self.last.get_mut(cluster) {
            Some(l) => {
                let other = if l.epoch == now.0 { l.other } else { l.offset };
                if l.epoch != now.0 {
                    l.other = l.offset;
                    l.epoch = now.0;
                }
                l.offset = offset;
                if (l.key.0 == now.0 && now.1 <= l.key.1) || l.highest(now.0).is_some_and(|seq| now.1 <= seq) {
                    // Older than a record of the same agent process stored before it: a
                    // publish a client kept while its link to JetStream was down and sent
                    // once it was back, after the agent had resent it and more through
                    // another replica; or one a session the agent had left took in late,
                    // after its records through another replica and another process's
                    // (seed 7056). Delivered as an event it would put an older state over a
                    // newer one; the latest stays the latest.
                    return Err(STALE);
                }
                l.note(now);
                (Some(std::mem::replace(&mut l.key, now)), other)
            }
            None => {
                self.last.insert(cluster.clone(), Latest::new(now, offset));
                (None, 0)
            }
        };
        self.follows(last, prev)?;
        // Whether a record of another agent process of the cluster was stored after this
        // one was sent: then it may be newer than this one (its process kept appending
        // while this one's publish waited on a cut link, and the records after this one
        // follow it). Records of a hub that did not say are not checked.
        let Some(known) = known else { return Ok(()) };
        match known.parse::<u64>() {
            Ok(known) if known < offset && known.saturating_add(1) >= self.seen_from => {
                if other > known {
                    Err(LATE)
                } else {
                    Ok(())
                }
            }
            // Part of what was stored after it was sent is unseen here (evicted before the
            // tail started), or it names an end beyond itself (a stream recreated under it).
            _ => Err(UNCHECKED),
        }
    }

    /// Whether a record naming `prev` follows `last`, the cluster's latest record.
    fn follows(&self, last: Option<(u64, u64)>, prev: Option<&str>) -> Result<(), &'static str> {
        let Some(prev) = prev else { return Ok(()) }; // written by a hub that did not say
        if prev == "-" {
            // Its publisher knew of no record of the cluster.
            return if last.is_none() { Ok(()) } else { Err(BROKEN) };
        }
        let (key, offset) = match prev.split_once('@') {
            Some((key, offset)) => (key, offset.parse::<u64>().ok()),
            None => (prev, None),
        };
        let named = key.split_once('/').and_then(|(e, s)| Some((e.parse::<u64>().ok()?, s.parse::<u64>().ok()?)));
        match (last, named, offset) {
            (Some(last), Some(named), _) if last == named => Ok(()),
            // A predecessor this tail never saw, but which was stored (its publisher knew its
            // offset from the ack) where the tail did not look: nothing of its publisher lies
            // between the two, and what other publishers lost is marked at their own records.
            (None, Some(_), Some(offset)) if offset < self.seen_from => Ok(()),
            (None, Some(_), _) if self.seen_from > 1 => Err(UNKNOWN),
            _ => Err(BROKEN),
        }
    }
}

const BROKEN: &str = "records of the cluster may be missing before this one (a JetStream publish failed or was \
                      overtaken while a later one of the cluster was stored)";
const STALE: &str = "this record is older than a record of the cluster stored before it (a JetStream publish sent \
                     late, after the agent's resend)";
const UNKNOWN: &str = "this hub replica cannot check that no record of the cluster is missing before this one (its \
                       predecessor was evicted before the replica started)";
const LATE: &str = "this record may be older than a record of another agent process of the cluster stored before it \
                    (a JetStream publish sent late, after its hub replica's link to JetStream was back)";
const UNCHECKED: &str = "this hub replica cannot check that this record is not older than a record of another agent \
                         process of the cluster stored before it (stored where the replica did not look)";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_follows_only_the_latest_one_its_tail_saw() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1, before_marker: false };
        assert_eq!(chain.follow(&c, Some("-"), None, (1, 1), 1), Ok(()), "the first record of a cluster");
        assert_eq!(chain.follow(&c, Some("1/1"), None, (1, 2), 2), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/3"), None, (1, 4), 3), Err(BROKEN), "3 is missing");
        assert_eq!(chain.follow(&c, Some("1/4"), None, (1, 5), 4), Ok(()), "it took 4's place");
        assert_eq!(chain.follow(&c, None, None, (1, 9), 5), Ok(()), "a record of a hub that did not say");
        assert_eq!(
            chain.follow(&c, Some("-"), None, (2, 1), 6),
            Err(BROKEN),
            "its publisher missed the cluster's records"
        );
        assert_eq!(chain.follow(&c, Some("2/1"), None, (3, 1), 7), Ok(()), "epochs change within a chain");
        assert_eq!(chain.follow(&c, Some("garbage"), None, (3, 2), 8), Err(BROKEN));
        let d: Arc<str> = "d".into();
        assert_eq!(chain.follow(&d, Some("1/1"), None, (1, 2), 9), Err(BROKEN), "a predecessor never seen");
        assert_eq!(
            chain.follow(&c, Some("3/1@7"), None, (3, 3), 10),
            Err(BROKEN),
            "an offset does not excuse a gap seen"
        );
        let mut partial = Chain { last: HashMap::new(), seen_from: 10, before_marker: false };
        assert_eq!(partial.follow(&d, Some("1/1"), None, (1, 2), 11), Err(UNKNOWN), "a predecessor evicted unseen");
        let e: Arc<str> = "e".into();
        assert_eq!(partial.follow(&e, Some("1/1@9"), None, (1, 2), 12), Ok(()), "stored below what the tail saw");
        let f: Arc<str> = "f".into();
        assert_eq!(partial.follow(&f, Some("1/1@10"), None, (1, 2), 13), Err(UNKNOWN), "where the tail looked");
        assert_eq!(partial.follow(&c, Some("-"), None, (1, 1), 14), Ok(()));
        // Records sent late: older than the latest of their agent process.
        let g: Arc<str> = "g".into();
        let mut late = Chain { last: HashMap::new(), seen_from: 1, before_marker: false };
        assert_eq!(late.follow(&g, Some("-"), None, (5, 1), 15), Ok(()));
        assert_eq!(late.follow(&g, Some("5/1"), None, (5, 2), 16), Ok(()));
        assert_eq!(late.follow(&g, Some("5/2"), None, (5, 3), 17), Ok(()));
        assert_eq!(late.follow(&g, Some("5/1"), None, (5, 2), 18), Err(STALE), "2 again, after 3");
        assert_eq!(late.follow(&g, Some("5/2"), None, (5, 3), 19), Err(STALE), "and what followed it");
        assert_eq!(late.follow(&g, Some("5/3"), None, (5, 4), 20), Ok(()), "3 is still the latest");
    }

    /// Seed 172 of the simulation: publishes of a second agent process kept while its
    /// replica's link to JetStream was cut, stored after newer records of the first.
    #[test]
    fn a_record_sent_before_another_agent_process_stored_newer_ones_is_late() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1, before_marker: false };
        assert_eq!(chain.follow(&c, Some("-"), Some("0"), (1, 1), 1), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/1"), Some("0"), (1, 2), 2), Ok(()), "in flight with the first");
        assert_eq!(chain.follow(&c, Some("1/2@2"), Some("2"), (2, 1), 3), Ok(()), "a second process after the first");
        assert_eq!(chain.follow(&c, Some("2/1"), Some("2"), (2, 2), 4), Ok(()), "its records in flight");
        // The second one's replica loses its link: 2/3 and 2/4 wait in its client, sent
        // when the stream's end it knew was 4; the first process appends meanwhile.
        assert_eq!(chain.follow(&c, Some("2/2@4"), Some("4"), (1, 3), 5), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/3"), Some("4"), (1, 4), 6), Ok(()));
        assert_eq!(chain.follow(&c, Some("2/2@4"), Some("4"), (2, 3), 7), Err(BROKEN), "the first late one");
        assert_eq!(chain.follow(&c, Some("2/3"), Some("4"), (2, 4), 8), Err(LATE), "follows it, sent before 5 and 6");
        assert_eq!(chain.follow(&c, Some("1/4@6"), Some("8"), (1, 5), 9), Err(BROKEN), "2/4 took the latest's place");
        assert_eq!(chain.follow(&c, Some("1/5"), Some("8"), (1, 6), 10), Ok(()), "sent after 2/4 was stored");
        // After the hole of a partly stored batch of one process the records stay events.
        assert_eq!(chain.follow(&c, Some("1/7"), Some("8"), (1, 8), 11), Err(BROKEN), "7 is missing");
        assert_eq!(chain.follow(&c, Some("1/8"), Some("8"), (1, 9), 12), Ok(()), "nothing of another process after 8");
        // A new process whose replica knew less than the last one stored: late only until
        // its acks are in.
        assert_eq!(chain.follow(&c, Some("1/6@10"), Some("10"), (3, 1), 13), Err(BROKEN), "1/8, 1/9 unseen");
        assert_eq!(chain.follow(&c, Some("3/1"), Some("10"), (3, 2), 14), Err(LATE), "in flight with it");
        assert_eq!(chain.follow(&c, Some("3/2@14"), Some("14"), (3, 3), 15), Ok(()), "once its acks were in");
        // Where the tail did not look, it cannot tell.
        let d: Arc<str> = "d".into();
        let mut partial = Chain { last: HashMap::new(), seen_from: 10, before_marker: false };
        assert_eq!(partial.follow(&d, Some("1/1@5"), Some("5"), (1, 2), 11), Err(UNCHECKED), "6 to 9 unseen");
        assert_eq!(partial.follow(&d, Some("1/2"), Some("9"), (1, 3), 12), Ok(()), "everything after 9 seen");
        assert_eq!(partial.follow(&d, Some("1/3"), Some("13"), (1, 4), 13), Err(UNCHECKED), "an end beyond itself");
        assert_eq!(partial.follow(&d, Some("1/4"), Some("x"), (1, 5), 14), Err(UNCHECKED));
    }

    /// Issue 44: records of replicas that had not noticed a recreation, stored before the
    /// recreated stream's `resync-required` `*`, name an end in the old stream below the
    /// tail's start. The marker after them covers them: delivered as events, not one
    /// resync each. After the marker the checks are back.
    #[test]
    fn records_before_a_recreated_streams_marker_are_covered_by_it() {
        let c: Arc<str> = "c".into();
        let star: Arc<str> = ALL.into();
        let base = 8_388_608;
        let mut chain = Chain { last: HashMap::new(), seen_from: base + 1, before_marker: true };
        // A batch of an agent whose replica still knew the old stream's end.
        for (i, seq) in (40..45).enumerate() {
            let offset = base + 1 + i as u64;
            let prev = format!("7/{}", seq - 1);
            assert_eq!(chain.follow(&c, Some(&prev), Some("5000000"), (7, seq), offset), Ok(()), "{offset}");
        }
        let at = base + 6;
        assert_eq!(chain.follow(&star, Some("-"), None, (0, base), at), Ok(()));
        chain.marker_read();
        // The same records after the marker: unchecked, as without it.
        assert_eq!(chain.follow(&c, Some("7/44"), Some("5000000"), (7, 45), at + 1), Err(UNCHECKED));
        // A tail that did not start before the marker checks from the first record.
        let mut later = Chain { last: HashMap::new(), seen_from: base + 1, before_marker: false };
        assert_eq!(later.follow(&c, Some("7/39"), Some("5000000"), (7, 40), base + 1), Err(UNKNOWN));
    }

    const ALL: &str = "*";

    /// Seed 7056 of the simulation: a session the second agent process had left took its
    /// record in late, after that process's newer records through another replica and the
    /// first process's after them; it named the latest (the first process's) and followed
    /// it, but is older than what its own process had stored.
    #[test]
    fn a_record_older_than_its_process_stored_behind_another_process_is_stale() {
        let c: Arc<str> = "c".into();
        let mut chain = Chain { last: HashMap::new(), seen_from: 1, before_marker: false };
        assert_eq!(chain.follow(&c, Some("-"), Some("0"), (1, 1), 1), Ok(()));
        assert_eq!(chain.follow(&c, Some("1/1@1"), Some("1"), (2, 1), 2), Ok(()));
        assert_eq!(chain.follow(&c, Some("2/1"), Some("2"), (2, 5), 3), Ok(()), "2/2..2/4 through another replica");
        assert_eq!(chain.follow(&c, Some("2/5@3"), Some("3"), (1, 2), 4), Ok(()), "the first process again");
        assert_eq!(chain.follow(&c, Some("1/2@4"), Some("4"), (2, 3), 5), Err(STALE), "older than 2/5");
        assert_eq!(chain.follow(&c, Some("1/2@4"), Some("5"), (1, 3), 6), Ok(()), "1/2 is still the latest");
        assert_eq!(chain.follow(&c, Some("1/3@6"), Some("6"), (2, 6), 7), Ok(()), "newer than 2/5");
    }
}
