//! The worker set's digest: [`WORKER_DIGEST_BUCKETS`] buckets of URLs,
//! each the XOR of a 64-bit hash of its entries. XOR lets the set keep it
//! up to date per change (an entry's hash goes out as it comes in), so a
//! digest costs nothing to send; two replicas compare theirs and send each
//! other only the buckets that differ.
//!
//! A wire contract: both sides must bucket and hash alike. The known-answer
//! test pins it; a change needs a new frame variant (an old build would
//! otherwise see every bucket differ and repair forever).

use shoal_proto::frames::WORKER_DIGEST_BUCKETS;

use super::Register;
use crate::stable_hash::{FNV_OFFSET, fnv1a, mix};

/// The bucket of `url`.
pub(crate) fn bucket_of(url: &str) -> usize {
    (mix(fnv1a(url.bytes(), FNV_OFFSET)) % WORKER_DIGEST_BUCKETS as u64) as usize
}

/// The hash of one entry: its URL, stamp (clock, then writer) and
/// whether it is present, each field closed by a `0xff` byte.
pub(crate) fn entry_hash(url: &str, register: &Register) -> u64 {
    let h = fnv1a(url.bytes().chain([0xff]), FNV_OFFSET);
    let h = fnv1a(register.stamp.hlc_us.to_le_bytes().into_iter(), h);
    let h = fnv1a(register.stamp.origin.bytes().chain([0xff]), h);
    mix(fnv1a([u8::from(register.present)].into_iter(), h))
}

/// Per bucket, the XOR of the hashes of its entries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Digest {
    buckets: [u64; WORKER_DIGEST_BUCKETS],
}

impl Default for Digest {
    fn default() -> Self {
        Self {
            buckets: [0; WORKER_DIGEST_BUCKETS],
        }
    }
}

impl Digest {
    /// Adds or removes (XOR is its own inverse) an entry's hash.
    pub(crate) fn toggle(&mut self, bucket: usize, hash: u64) {
        if let Some(b) = self.buckets.get_mut(bucket) {
            *b ^= hash;
        }
    }

    /// The buckets, for the wire.
    pub(crate) fn to_vec(&self) -> Vec<u64> {
        self.buckets.to_vec()
    }

    /// Which buckets differ from a peer's; `None` when its digest has
    /// another number of buckets (not comparable).
    pub(crate) fn differing(&self, theirs: &[u64]) -> Option<Vec<bool>> {
        (theirs.len() == WORKER_DIGEST_BUCKETS).then(|| {
            self.buckets
                .iter()
                .zip(theirs)
                .map(|(mine, theirs)| mine != theirs)
                .collect()
        })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::worker_set::Stamp;

    fn register(hlc_us: u64, origin: &str, present: bool) -> Register {
        Register {
            present,
            stamp: Stamp {
                hlc_us,
                origin: Arc::from(origin),
            },
        }
    }

    /// Known answers of the digest. Two builds repair each other's worker
    /// sets only while they agree on these: a failure here is a protocol
    /// change (see the module doc).
    #[test]
    fn buckets_and_hashes_match_their_known_answers() {
        assert_eq!(WORKER_DIGEST_BUCKETS, 64);
        let buckets: Vec<usize> = ["", "http://10.0.0.7:8000", "http://w:1"]
            .iter()
            .map(|u| bucket_of(u))
            .collect();
        assert_eq!(buckets, KNOWN_BUCKETS);
        let hashes = [
            entry_hash("http://w:1", &register(1_700_000_000_000_000, "a", true)),
            entry_hash("http://w:1", &register(1_700_000_000_000_000, "a", false)),
            entry_hash("http://w:1", &register(1_700_000_000_000_001, "a", true)),
            entry_hash("http://w:1", &register(1_700_000_000_000_000, "b", true)),
        ];
        assert_eq!(hashes, KNOWN_HASHES);
    }

    /// Computed independently (a few lines of Python over the same
    /// definition), not copied from this implementation's output.
    const KNOWN_BUCKETS: [usize; 3] = [27, 54, 22];
    const KNOWN_HASHES: [u64; 4] = [
        0x7ebf_b36e_28f6_e1af,
        0x5cf8_f2ff_66de_1a1a,
        0x7dc7_7da8_d1cd_a511,
        0x6e74_c6b8_98f0_2518,
    ];

    #[test]
    fn toggling_an_entry_twice_restores_the_digest_and_shapes_are_checked() {
        let mut d = Digest::default();
        let h = entry_hash("u", &register(5, "a", true));
        d.toggle(bucket_of("u"), h);
        assert_ne!(d, Digest::default());
        let differing = d.differing(&Digest::default().to_vec()).unwrap();
        assert_eq!(differing.iter().filter(|x| **x).count(), 1);
        assert!(differing[bucket_of("u")]);
        d.toggle(bucket_of("u"), h);
        assert_eq!(d, Digest::default());
        assert!(d.differing(&[0; 3]).is_none());
    }
}
