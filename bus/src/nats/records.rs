//! How a record is one JetStream message: its subject (`<stream>.<cluster>`, a cluster
//! name that is not a plain subject token written `=<hex>`), its headers (`Fw-Epoch`,
//! `Fw-Seq`, `Fw-Kind`, `Fw-Format`, `Fw-Prev`, `Fw-Known`) and its payload (the event JSON
//! or the resync reason); the decoding back into a [`Record`], and the same token rules
//! for key-value keys.

use crate::{Record, RecordBody};

use super::heads::Head;
use super::jetstream::{Delivered, HeaderMap};

pub(super) const H_EPOCH: &str = "Fw-Epoch";
pub(super) const H_SEQ: &str = "Fw-Seq";
pub(super) const H_KIND: &str = "Fw-Kind";
/// The record's format ([`NATS_FORMAT`]); a record without it is format 1 (every record
/// before the header existed). Checked by one header lookup, no parsing of the payload.
pub(super) const H_FORMAT: &str = "Fw-Format";
/// The (epoch, seq) of the record its publisher put on the cluster's subject just before
/// this one (`<epoch>/<seq>`, `@<offset>` added when its ack was in), or `-` when it knew
/// of none: lets every replica's tail see from the stream alone that a record follows one
/// that was never stored.
pub(super) const H_PREV: &str = "Fw-Prev";
/// The stream's end as its publisher knew it when it sent this record (an offset: every
/// record at or below it was stored before this one was sent): lets every replica's tail
/// see from the stream alone that records of another agent process of the cluster were
/// stored between the two, so this one may be older than they are (a publish kept while
/// its replica's link to JetStream was cut and sent late).
pub(super) const H_KNOWN: &str = "Fw-Known";
/// [`NATS_FORMAT`] as the header value.
pub(super) const FORMAT_MARK: &str = "1";
pub(super) const KIND_EVENT: &str = "event";
pub(super) const KIND_RESYNC: &str = "resync-required";

pub(super) fn hex(s: &str) -> String {
    hex::encode(s)
}

pub(super) fn unhex(s: &str) -> Option<String> {
    String::from_utf8(hex::decode(s).ok()?).ok()
}

/// A name as a subject token / key-value key: itself when plain, `=<hex>` otherwise.
pub(super) fn token(name: &str) -> String {
    if !name.is_empty() && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_') {
        name.to_string()
    } else {
        format!("={}", hex(name))
    }
}

pub(super) fn untoken(t: &str) -> Option<String> {
    match t.strip_prefix('=') {
        Some(h) => unhex(h),
        None => Some(t.to_string()),
    }
}

pub(super) fn decode(stream: &str, msg: &Delivered, offset: u64, time_ms: u64) -> Result<Record, String> {
    let t = msg.subject.as_str().strip_prefix(stream).and_then(|s| s.strip_prefix('.')).ok_or("foreign subject")?;
    let cluster = untoken(t).ok_or("undecodable cluster token")?;
    let headers = msg.headers.as_ref().ok_or("no headers")?;
    let num = |h: &str| -> Result<u64, String> {
        headers.get(h).ok_or(format!("no {h}"))?.as_str().parse().map_err(|e| format!("{h}: {e}"))
    };
    let (epoch, seq) = (num(H_EPOCH)?, num(H_SEQ)?);
    let body = match headers.get(H_KIND).map(|v| v.as_str()) {
        Some(KIND_EVENT) => RecordBody::Event(msg.payload.clone()),
        Some(KIND_RESYNC) => RecordBody::ResyncRequired(String::from_utf8_lossy(&msg.payload).into_owned()),
        other => return Err(format!("unknown kind {other:?}")),
    };
    Ok(Record { offset, cluster: cluster.into(), epoch, seq, time_ms, body })
}

/// FNV-1a, 64 bits: a stable digest for message ids (the same in every replica and
/// release, unlike the standard library's hasher).
pub(super) fn fnv1a(bytes: &[u8]) -> u64 {
    fleetwatch_protocol::digest::fnv1a64(bytes)
}

/// The head a stored record stands for, from its `Fw-Epoch` and `Fw-Seq` headers.
pub(super) fn head_from_headers(headers: &HeaderMap, offset: u64) -> Option<Head> {
    let num = |h: &str| headers.get(h)?.as_str().parse::<u64>().ok();
    Some(Head { epoch: num(H_EPOCH)?, seq: num(H_SEQ)?, offset })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_round_trip_and_stay_subject_safe() {
        for name in ["prod-eu-1", "a.b", "*", "x y", "=plain", "é"] {
            let t = token(name);
            assert!(!t.contains('.') && !t.contains('*') && !t.contains('>') && !t.contains(' '), "{t}");
            assert_eq!(untoken(&t).as_deref(), Some(name));
        }
        assert_eq!(token("prod-eu-1"), "prod-eu-1");
    }
}
