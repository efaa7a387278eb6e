//! The on-disk record framing.
//!
//! Every record is one frame:
//!
//! ```text
//! magic "FWR2" (4 bytes) | payload length u32 LE | CRC32C u32 LE | payload
//! ```
//!
//! The CRC32C covers the length field and the payload, so a flipped digit, a torn write or
//! a zeroed block is detected, and after damage the loader can find the next record by
//! looking for a magic whose frame verifies. The payload is JSON:
//! `{"o":offset,"t":unix_ms,"c":cluster,"ep":epoch,"s":seq,"e":event}` or `…"r":reason}` for a
//! `resync-required` marker. A zero-filled region never verifies: it has no magic.

use std::sync::Arc;

use bytes::Bytes;
use serde::Deserialize;

use crate::{Record, RecordBody};

/// Marks the start of a frame.
pub(crate) const MAGIC: &[u8; 4] = b"FWR2";
/// Bytes before the payload.
pub(crate) const HEADER: usize = 12;
/// Largest payload accepted when reading; a bigger length field is damage.
pub(crate) const MAX_PAYLOAD: usize = 16 << 20;

/// Why bytes at some position are not a valid frame.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FrameError {
    /// The file ends inside the frame (a write that did not finish).
    #[error("torn record (the file ends inside it)")]
    Incomplete,
    /// No frame starts here.
    #[error("no record header (bad magic)")]
    BadMagic,
    /// The length field is impossible.
    #[error("record length {0} exceeds the maximum")]
    TooLong(u32),
    /// The checksum does not match the content.
    #[error("checksum mismatch")]
    ChecksumMismatch,
    /// The checksum matches but the payload is not a record.
    #[error("undecodable record payload: {0}")]
    BadPayload(String),
}

/// Appends one framed record to `buf`.
pub(crate) fn encode(rec: &Record, buf: &mut Vec<u8>) {
    let start = buf.len();
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&[0; 8]);
    encode_payload(rec, buf);
    seal(buf, start);
}

/// Frames an arbitrary payload (used for segment index files).
pub(crate) fn encode_raw(payload: &[u8], buf: &mut Vec<u8>) {
    let start = buf.len();
    buf.extend_from_slice(MAGIC);
    buf.extend_from_slice(&[0; 8]);
    buf.extend_from_slice(payload);
    seal(buf, start);
}

/// Fills in the length and checksum of the frame that starts at `start`.
fn seal(buf: &mut [u8], start: usize) {
    let len = (buf.len() - start - HEADER) as u32;
    buf[start + 4..start + 8].copy_from_slice(&len.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&len.to_le_bytes()), &buf[start + HEADER..]);
    buf[start + 8..start + 12].copy_from_slice(&crc.to_le_bytes());
}

/// Writes the payload JSON directly (the event is spliced in as stored): nothing here can
/// fail, so nothing is swallowed.
fn encode_payload(rec: &Record, buf: &mut Vec<u8>) {
    buf.extend_from_slice(br#"{"o":"#);
    push_u64(buf, rec.offset);
    buf.extend_from_slice(br#","t":"#);
    push_u64(buf, rec.time_ms);
    buf.extend_from_slice(br#","c":"#);
    push_json_str(buf, &rec.cluster);
    buf.extend_from_slice(br#","ep":"#);
    push_u64(buf, rec.epoch);
    buf.extend_from_slice(br#","s":"#);
    push_u64(buf, rec.seq);
    match &rec.body {
        RecordBody::Event(json) => {
            buf.extend_from_slice(br#","e":"#);
            buf.extend_from_slice(json);
        }
        RecordBody::ResyncRequired(reason) => {
            buf.extend_from_slice(br#","r":"#);
            push_json_str(buf, reason);
        }
    }
    buf.push(b'}');
}

/// Appends `n` in decimal.
fn push_u64(buf: &mut Vec<u8>, mut n: u64) {
    let mut digits = [0u8; 20];
    let mut at = digits.len();
    loop {
        at -= 1;
        digits[at] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    buf.extend_from_slice(&digits[at..]);
}

/// Appends `s` as a JSON string (quoted, with `"`, `\` and control characters escaped).
pub(crate) fn push_json_str(buf: &mut Vec<u8>, s: &str) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf.push(b'"');
    let mut plain = 0;
    let bytes = s.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => br#"\""#,
            b'\\' => br"\\",
            b'\n' => br"\n",
            b'\r' => br"\r",
            b'\t' => br"\t",
            0..=0x1f => &[],
            _ => continue,
        };
        buf.extend_from_slice(&bytes[plain..i]);
        plain = i + 1;
        if escape.is_empty() {
            buf.extend_from_slice(&[b'\\', b'u', b'0', b'0', HEX[usize::from(b >> 4)], HEX[usize::from(b & 0xf)]]);
        } else {
            buf.extend_from_slice(escape);
        }
    }
    buf.extend_from_slice(&bytes[plain..]);
    buf.push(b'"');
}

/// The verified payload of the frame at `pos`, and the frame's total size.
pub(crate) fn frame_at(buf: &[u8], pos: usize) -> Result<(&[u8], usize), FrameError> {
    let rest = &buf[pos.min(buf.len())..];
    if rest.len() < HEADER {
        // Fewer bytes than a header: torn only if what is there could be a header start.
        return if MAGIC.starts_with(&rest[..rest.len().min(4)]) {
            Err(FrameError::Incomplete)
        } else {
            Err(FrameError::BadMagic)
        };
    }
    if &rest[..4] != MAGIC {
        return Err(FrameError::BadMagic);
    }
    let len_bytes: [u8; 4] = rest[4..8].try_into().map_err(|_| FrameError::BadMagic)?;
    let len = u32::from_le_bytes(len_bytes);
    if len as usize > MAX_PAYLOAD || len == 0 {
        return Err(FrameError::TooLong(len));
    }
    let total = HEADER + len as usize;
    if rest.len() < total {
        return Err(FrameError::Incomplete);
    }
    let stored = u32::from_le_bytes(rest[8..12].try_into().map_err(|_| FrameError::BadMagic)?);
    let payload = &rest[HEADER..total];
    if crc32c::crc32c_append(crc32c::crc32c(&len_bytes), payload) != stored {
        return Err(FrameError::ChecksumMismatch);
    }
    Ok((payload, total))
}

/// The first position after `from` where a frame verifies.
pub(crate) fn next_valid_frame(buf: &[u8], from: usize) -> Option<usize> {
    let mut pos = from;
    while pos + HEADER <= buf.len() {
        let hit = buf[pos..].windows(4).position(|w| w == MAGIC)?;
        pos += hit;
        if frame_at(buf, pos).is_ok() {
            return Some(pos);
        }
        pos += 1;
    }
    None
}

#[derive(Deserialize)]
struct DiskRecord<'a> {
    o: u64,
    #[serde(default)]
    t: u64,
    c: &'a str,
    ep: u64,
    s: u64,
    #[serde(borrow, default)]
    e: Option<&'a serde_json::value::RawValue>,
    #[serde(default)]
    r: Option<String>,
}

/// Decodes a verified record payload; `intern` shares cluster names between records.
pub(crate) fn decode(payload: &[u8], intern: &mut impl FnMut(&str) -> Arc<str>) -> Result<Record, FrameError> {
    let rec: DiskRecord = serde_json::from_slice(payload).map_err(|e| FrameError::BadPayload(e.to_string()))?;
    let body = match (rec.e, rec.r) {
        (Some(raw), _) => RecordBody::Event(Bytes::copy_from_slice(raw.get().as_bytes())),
        (None, reason) => RecordBody::ResyncRequired(reason.unwrap_or_default()),
    };
    Ok(Record { offset: rec.o, cluster: intern(rec.c), epoch: rec.ep, seq: rec.s, time_ms: rec.t, body })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(offset: u64, event: &str) -> Record {
        Record {
            offset,
            cluster: "c".into(),
            epoch: 1,
            seq: offset,
            time_ms: 5,
            body: RecordBody::Event(Bytes::from(event.to_string())),
        }
    }

    #[test]
    fn round_trip_and_checksum_catches_a_flipped_digit() {
        let mut buf = Vec::new();
        encode(&rec(1, r#"{"v":1234}"#), &mut buf);
        let (payload, size) = frame_at(&buf, 0).unwrap();
        assert_eq!(size, buf.len());
        let back = decode(payload, &mut |c| Arc::from(c)).unwrap();
        assert_eq!((back.offset, back.time_ms), (1, 5));
        let digit = buf.iter().position(|b| *b == b'3').unwrap();
        buf[digit] = b'4';
        assert_eq!(frame_at(&buf, 0).unwrap_err(), FrameError::ChecksumMismatch);
    }

    #[test]
    fn torn_frame_and_zeros_are_detected_and_the_next_frame_found() {
        let mut buf = Vec::new();
        encode(&rec(1, r#"{"a":1}"#), &mut buf);
        let second = buf.len();
        encode(&rec(2, r#"{"a":2}"#), &mut buf);
        assert_eq!(frame_at(&buf[..buf.len() - 3], second).unwrap_err(), FrameError::Incomplete);
        let mut zeroed = buf.clone();
        zeroed[..8].fill(0);
        assert_eq!(frame_at(&zeroed, 0).unwrap_err(), FrameError::BadMagic);
        assert_eq!(next_valid_frame(&zeroed, 1), Some(second));
        assert_eq!(frame_at(&[0u8; 64], 0).unwrap_err(), FrameError::BadMagic);
    }

    #[test]
    fn payload_is_the_json_serde_would_write() {
        let reason = "a \"quoted\" \\ reason\n\t\u{1}é ✓".to_string();
        let cluster = "c\"x\u{7f}";
        let rec = Record {
            offset: u64::MAX,
            cluster: cluster.into(),
            epoch: 0,
            seq: 10,
            time_ms: 1234567890123,
            body: RecordBody::ResyncRequired(reason.clone()),
        };
        let mut buf = Vec::new();
        encode_payload(&rec, &mut buf);
        let expected =
            serde_json::json!({"o": u64::MAX, "t": 1234567890123u64, "c": cluster, "ep": 0, "s": 10, "r": reason});
        assert_eq!(serde_json::from_slice::<serde_json::Value>(&buf).unwrap(), expected);
        let mut s = Vec::new();
        push_json_str(&mut s, &reason);
        assert_eq!(String::from_utf8(s).unwrap(), serde_json::to_string(&reason).unwrap());
    }
}
