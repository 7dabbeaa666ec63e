//! A hasher for maps keyed by Shoal's own small ids (worker ids, stream
//! ids): one multiply instead of SipHash. Those keys are assigned by the
//! router, never chosen by a client, so they need spreading into the high
//! bits hashbrown probes with, not resistance to crafted collisions. Keys
//! a client can influence (prompt or block hashes) keep std's `RandomState`.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The hasher: a running xor-multiply over the key's words.
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

/// Fibonacci hashing's multiplier (2^64 / φ).
const SPREAD: u64 = 0x9E37_79B9_7F4A_7C15;

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for byte in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(*byte)).wrapping_mul(SPREAD);
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(SPREAD);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// A map keyed by router-assigned ids.
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn consecutive_ids_spread_into_the_high_bits() {
        let build = BuildHasherDefault::<IdHasher>::default();
        let tops: std::collections::HashSet<u64> =
            (0u64..64).map(|id| build.hash_one(id) >> 57).collect();
        assert!(
            tops.len() > 32,
            "only {} distinct top-7-bit groups",
            tops.len()
        );
        assert_eq!(build.hash_one(7u32), build.hash_one(7u64));
    }
}
