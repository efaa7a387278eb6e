//! The one FNV-1a digest of the project: 64 bits, the same in every process, replica,
//! platform and release (unlike std's hasher), for what must not change between them —
//! message ids, shard buckets, list tokens, entry digests, the simulation's fingerprints.
//!
//! ```
//! use fleetwatch_protocol::digest::{Fnv1a, fnv1a64};
//! assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
//! // In parts: the same as at once.
//! assert_eq!(Fnv1a::new().update(b"fo").update(b"o").finish(), fnv1a64(b"foo"));
//! ```

use std::hash::Hasher;

/// 64-bit FNV-1a of `bytes` (offset basis `0xcbf29ce484222325`, prime `0x100000001b3`).
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    Fnv1a::new().update(bytes).finish()
}

/// FNV-1a fed in parts, or resumed from an earlier digest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fnv1a(u64);

impl Fnv1a {
    /// A digest of nothing yet (the offset basis).
    pub fn new() -> Self {
        Self(fnv::FnvHasher::default().finish())
    }

    /// Goes on from the digest `h` (what [`Fnv1a::finish`] answered).
    pub fn resume(h: u64) -> Self {
        Self(h)
    }

    /// `bytes` fed after what came before.
    #[must_use]
    pub fn update(self, bytes: &[u8]) -> Self {
        let mut h = fnv::FnvHasher::with_key(self.0);
        h.write(bytes);
        Self(h.finish())
    }

    /// The digest so far.
    pub fn finish(self) -> u64 {
        self.0
    }
}

impl Default for Fnv1a {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The published test vectors (draft-eastlake-fnv): what every digest written by an
    /// earlier release was computed as.
    #[test]
    fn fnv1a_matches_the_published_test_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf29ce484222325);
        assert_eq!(fnv1a64(b"a"), 0xaf63dc4c8601ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x85944171f73967e8);
        assert_eq!(Fnv1a::new().finish(), 0xcbf29ce484222325);
        assert_eq!(Fnv1a::resume(fnv1a64(b"foo")).update(b"bar").finish(), fnv1a64(b"foobar"));
    }
}
