//! What the NATS bus keeps in JetStream besides the records, as plain data with its rules
//! (the I/O is in the other modules of [`super`]):
//!
//! - the stream's **lineage**: a stream recreated after JetStream lost its store continues
//!   the bus it replaces — same bus id, offsets above every offset handed out before — and
//!   says so in its description, written atomically with the stream, so every replica (also
//!   one started later) reads the same id and offset base;
//! - whether a new bus was **begun after waiting for a missing stream**, also in the
//!   description: a replica that finds the stream without having waited must answer as
//!   its creator does, whichever of them writes the cursor store's meta entry first;
//! - the cursor store's **meta entry**: whether durable names may have been lost (the
//!   bucket was recreated empty while the bus had history);
//! - one subscriber identity's **durable cursors**, each with the registration it belongs
//!   to, so a cursor move made under an older registration (unflushed on another replica)
//!   cannot overtake a newer registration.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A recreated stream's offsets start above a multiple of this past every offset the
/// recreating replica knew: other replicas may have seen a little more (their tails and
/// probes lag by seconds of appends, far below a million records).
pub(super) const BASE_STEP: u64 = 1 << 20;

/// The first part of the stream's description, written by every hub.
const DESCRIPTION: &str = "fleetwatch hub bus: one message per record, subject <stream>.<cluster>";
const CONTINUES: &str = "; continues bus ";
const ABOVE: &str = " at offsets above ";
/// Said by a new bus's description when the hub that created it had waited for a missing
/// stream (JetStream may have lost its store while no replica that knew the bus ran).
const BEGUN_AFTER_WAIT: &str = "; begun after waiting for a missing stream";

/// Which bus a stream continues, and where its offsets start.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Lineage {
    /// The bus id subscribers know (the first stream's).
    pub(super) id: String,
    /// Offset = stream sequence + base.
    pub(super) base: u64,
}

/// The stream description for a stream created fresh (`None`) or recreated.
pub(super) fn describe(lineage: Option<&Lineage>) -> String {
    match lineage {
        None => DESCRIPTION.to_string(),
        Some(l) => format!("{DESCRIPTION}{CONTINUES}{}{ABOVE}{}", l.id, l.base),
    }
}

/// The stream description for a new bus begun by a hub that waited for a missing stream:
/// created with the stream in one step, so a replica that finds the stream (without having
/// waited itself) knows it, also when it writes the cursor store's meta entry before the
/// creator does (seed 15240).
pub(super) fn describe_begun_after_wait() -> String {
    format!("{DESCRIPTION}{BEGUN_AFTER_WAIT}")
}

/// Whether a stream description says its bus was begun after a wait for a missing stream.
pub(super) fn begun_after_wait(description: &str) -> bool {
    description.ends_with(BEGUN_AFTER_WAIT) && parse_lineage(description).is_none()
}

/// The lineage a stream description states, if any.
pub(super) fn parse_lineage(description: &str) -> Option<Lineage> {
    let rest = description.split_once(CONTINUES)?.1;
    let (id, base) = rest.rsplit_once(ABOVE)?;
    Some(Lineage { id: id.to_string(), base: base.trim().parse().ok()? })
}

/// The offset base of a stream recreated by a replica that knew offsets up to `known`:
/// above it, on a multiple of [`BASE_STEP`] with at least one step of margin.
pub(super) fn next_base(known: u64) -> u64 {
    (known / BASE_STEP + 1).saturating_add(1).saturating_mul(BASE_STEP)
}

/// The key of the meta entry in the cursors bucket. Identity keys never contain a '.'
/// (see `token`), so it cannot collide with one.
pub(super) const META_KEY: &str = "meta.bus";

/// The cursors bucket's meta entry, written once when the bucket is (re)created. A bucket
/// without it was recreated (lost) after this hub opened it: names may be lost.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct Meta {
    /// Names not in the bucket may have existed: a durable subscriber whose name is not
    /// found must reconcile everything (`Lookup::Lost`).
    pub(super) names_lost: bool,
    /// Why, when `names_lost`: the bus was begun by a hub after it waited for a missing
    /// stream (a first start, or JetStream lost its store while no replica ran), not a
    /// bucket recreated under a bus with history. Only the reason told differs.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub(super) begun_after_wait: bool,
    /// The format of what the bus keeps in JetStream (records, heads, cursors), for a
    /// rolled-back hub to refuse a newer one; absent in entries written before it existed,
    /// which are format 1, today's.
    #[serde(default = "format_one")]
    pub(super) format: u32,
}

/// The format of what the NATS bus keeps in JetStream; a hub finding a newer one in the
/// cursors bucket's meta entry refuses to start. Records (`Fw-Format` header), heads
/// (`format`) and cursor entries (`format`, written only from format 2 on) name their own;
/// one without is format 1.
pub(super) const NATS_FORMAT: u32 = 1;

/// Why a hub does not use `what`: it is kept in format `found`, newer than this build's.
pub(super) fn newer_format(what: &str, found: &str) -> String {
    format!(
        "{what} is kept in format {found}, newer than this hub's {NATS_FORMAT} (fleetwatch {}): a newer release \
         writes this bus; run a release that reads it (docs/upgrade.md); this hub leaves it untouched",
        env!("CARGO_PKG_VERSION")
    )
}

/// Whether a format mark (a record's `Fw-Format` header, a value's `format`) names a
/// format this build reads: absent is format 1, what every release before the marks wrote.
/// `Err` with the mark as found when it is newer (or not a format this build knows).
pub(super) fn readable_mark(mark: Option<&str>) -> Result<(), String> {
    match mark {
        None => Ok(()),
        Some(m) => match m.trim().parse::<u32>() {
            Ok(n) if (1..=NATS_FORMAT).contains(&n) => Ok(()),
            _ => Err(m.to_string()),
        },
    }
}

/// The `format` a JSON value of the bus names, if it is a JSON object with one.
#[derive(Deserialize)]
struct Mark {
    #[serde(default)]
    format: Option<serde_json::Value>,
}

/// [`readable_mark`] of a JSON value's `format` (a number): a value that is not a JSON
/// object, or has none, is format 1 (what is not JSON is left to the value's own parser).
pub(super) fn readable_value(bytes: &[u8]) -> Result<(), String> {
    match serde_json::from_slice::<Mark>(bytes).ok().and_then(|m| m.format) {
        None => Ok(()),
        Some(serde_json::Value::Number(n)) => readable_mark(Some(&n.to_string())),
        Some(other) => Err(other.to_string()),
    }
}

fn format_one() -> u32 {
    1
}

/// One identity's durable names: cursor and registration of each.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Cursors {
    /// Name → cursor (a stream offset).
    pub(super) names: BTreeMap<String, u64>,
    /// Name → the registration that set its start point (random, per registration).
    pub(super) regs: BTreeMap<String, u64>,
    /// The bus (stream lineage id) the cursors are offsets of; absent in entries of
    /// earlier releases. A bus begun anew numbers its offsets from 1 again, so a cursor of
    /// another bus means nothing in it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) bus: Option<String>,
    /// The entry's format; absent (never written by this release) is format 1. Format 1
    /// entries stay without it: the releases before it refuse unknown fields here and
    /// would read such an entry as empty, losing its names on a rollback.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) format: Option<u32>,
}

/// A cursor move not written yet: the cursor and the registration it was made under
/// (`None`: the name was not registered through this replica, e.g. a lost name stored at
/// its first ack).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Move {
    pub(super) cursor: u64,
    pub(super) reg: Option<u64>,
}

impl Cursors {
    /// Reads an entry; an entry of an older release (name → cursor) has no registrations.
    /// `Err` with the format found for an entry of a newer format: never read as empty
    /// (and then written over), unlike one that is damaged.
    pub(super) fn parse(bytes: &[u8]) -> Result<Self, String> {
        if let Ok(c) = serde_json::from_slice::<Cursors>(bytes) {
            return readable_mark(c.format.map(|f| f.to_string()).as_deref()).map(|()| c);
        }
        if let Ok(names) = serde_json::from_slice::<BTreeMap<String, u64>>(bytes) {
            return Ok(Cursors { names, ..Self::default() });
        }
        readable_value(bytes)?;
        Ok(Self::default())
    }

    /// Registers `name`'s start point, even when lower than its cursor.
    pub(super) fn register(&mut self, name: &str, cursor: u64, reg: u64) {
        self.names.insert(name.into(), cursor);
        self.regs.insert(name.into(), reg);
    }

    /// Whether a move made under `reg` still belongs to the name's current registration: a
    /// name registered since (on any replica) is not moved by what an older registration's
    /// subscriber acked. A name without a registration in the entry (lost with the store,
    /// stored at its first ack, or of an older release) takes any move: offsets never
    /// repeat, so an older cursor still means what it meant.
    pub(super) fn current(&self, name: &str, reg: Option<u64>) -> bool {
        match (reg, self.regs.get(name)) {
            (_, None) => true,
            (Some(r), Some(now)) => r == *now,
            (None, Some(_)) => false,
        }
    }

    /// Applies a move (forward only) if it belongs to the current registration; answers
    /// whether it did.
    pub(super) fn apply(&mut self, name: &str, m: Move) -> bool {
        if !self.current(name, m.reg) {
            return false;
        }
        let c = self.names.entry(name.into()).or_insert(m.cursor);
        *c = (*c).max(m.cursor);
        true
    }

    /// The name's cursor counting a move not written yet.
    pub(super) fn cursor(&self, name: &str, pending: Option<Move>) -> Option<u64> {
        let pending = pending.filter(|m| self.current(name, m.reg)).map(|m| m.cursor);
        match (self.names.get(name).copied(), pending) {
            (Some(s), Some(p)) => Some(s.max(p)),
            (s, p) => s.or(p),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lineage_round_trips_through_the_description() {
        assert_eq!(parse_lineage(&describe(None)), None);
        let l = Lineage { id: "fw-18a2b3c4d5e6f708".into(), base: 3 << 20 };
        assert_eq!(parse_lineage(&describe(Some(&l))), Some(l.clone()));
        assert_eq!(parse_lineage("someone else's stream"), None);
        assert_eq!(parse_lineage(&format!("{DESCRIPTION}{CONTINUES}x{ABOVE}not-a-number")), None);
        assert_eq!(parse_lineage(&describe_begun_after_wait()), None, "a new bus");
        assert!(begun_after_wait(&describe_begun_after_wait()));
        assert!(!begun_after_wait(&describe(None)));
        assert!(!begun_after_wait(&describe(Some(&l))));
    }

    #[test]
    fn a_recreated_stream_starts_well_above_what_was_known() {
        assert_eq!(next_base(0), 2 * BASE_STEP);
        assert_eq!(next_base(BASE_STEP - 1), 2 * BASE_STEP);
        assert_eq!(next_base(BASE_STEP), 3 * BASE_STEP);
        for known in [0, 1, 5000, BASE_STEP * 7 + 3] {
            assert!(next_base(known) >= known + BASE_STEP, "{known}");
        }
        assert_eq!(next_base(u64::MAX), u64::MAX, "saturates");
    }

    #[test]
    fn a_move_of_an_older_registration_does_not_overtake_a_newer_one() {
        let mut c = Cursors::default();
        c.register("d", 1, 11);
        assert!(c.apply("d", Move { cursor: 500, reg: Some(11) }));
        assert_eq!(c.cursor("d", None), Some(500));
        // Registered again elsewhere, lower (e.g. its cursor was beyond the log's end).
        c.register("d", 400, 22);
        assert!(!c.apply("d", Move { cursor: 600, reg: Some(11) }), "the old registration's move is dropped");
        assert!(!c.apply("d", Move { cursor: 600, reg: None }));
        assert_eq!(c.cursor("d", Some(Move { cursor: 600, reg: Some(11) })), Some(400));
        assert!(c.apply("d", Move { cursor: 450, reg: Some(22) }));
        assert!(c.apply("d", Move { cursor: 420, reg: Some(22) }));
        assert_eq!(c.names["d"], 450, "never back");
        assert_eq!(c.cursor("d", Some(Move { cursor: 470, reg: Some(22) })), Some(470));
        // A name stored at its first ack (lost before): no registration, moves apply, also
        // one made under a registration the lost store had.
        assert!(c.apply("lost", Move { cursor: 9, reg: None }));
        assert_eq!(c.cursor("lost", None), Some(9));
        assert!(c.apply("lost", Move { cursor: 12, reg: Some(33) }));
        assert_eq!(c.cursor("lost", None), Some(12));
        assert_eq!(c.cursor("new", Some(Move { cursor: 3, reg: Some(44) })), Some(3));
    }

    #[test]
    fn entries_of_the_older_format_are_read() {
        let old = Cursors::parse(br#"{"a":3,"b":7}"#).unwrap();
        assert_eq!(old.names.get("b"), Some(&7));
        assert!(old.regs.is_empty());
        let mut c = Cursors::default();
        c.register("names", 5, 1);
        let written = serde_json::to_vec(&c).unwrap();
        assert!(!String::from_utf8_lossy(&written).contains("format"), "format 1 is written without a mark");
        assert_eq!(Cursors::parse(&written), Ok(c.clone()));
        assert_eq!(Cursors::parse(b"garbage"), Ok(Cursors::default()));
        // A durable named `format` in the oldest form is a name, not a mark.
        assert_eq!(Cursors::parse(br#"{"format":2}"#).unwrap().names.get("format"), Some(&2));
        let marked = br#"{"names":{"d":4},"regs":{},"format":1}"#;
        assert_eq!(Cursors::parse(marked).unwrap().names.get("d"), Some(&4));
    }

    #[test]
    fn entries_of_a_newer_format_are_refused_not_read_as_empty() {
        assert_eq!(Cursors::parse(br#"{"names":{"d":4},"regs":{},"format":2}"#), Err("2".into()));
        // A newer format with fields this release does not know.
        assert_eq!(Cursors::parse(br#"{"format":3,"subscribers":[{"name":"d","at":"4"}]}"#), Err("3".into()));
        assert_eq!(readable_value(br#"{"epoch":1,"seq":2,"offset":3}"#), Ok(()));
        assert_eq!(readable_value(br#"{"epoch":1,"seq":2,"offset":3,"format":1}"#), Ok(()));
        assert_eq!(readable_value(br#"{"format":2}"#), Err("2".into()));
        assert_eq!(readable_value(br#"{"format":"two"}"#), Err(r#""two""#.into()));
        assert_eq!(readable_mark(None), Ok(()));
        assert_eq!(readable_mark(Some("1")), Ok(()));
        assert_eq!(readable_mark(Some("2")), Err("2".into()));
        assert_eq!(readable_mark(Some("0")), Err("0".into()));
        let why = newer_format("the head of cluster c1", "2");
        assert!(why.contains("format 2, newer than this hub's 1"), "{why}");
    }
}
