//! Poll ownership by rendezvous (highest random weight) hashing: each
//! worker is owned by the member whose `hash(member, worker)` is largest.
//! When a member joins or leaves, only the workers it wins or held move.
//!
//! The hash is FNV-1a with a splitmix64 finaliser (`stable_hash`), so
//! every replica computes the same owner whatever its Rust version or
//! platform.
//!
//! Two builds that hash differently would each believe a different member
//! owns a worker, and some workers would be polled by nobody. So the hash
//! has a version ([`OWNERSHIP_HASH_VERSION`]) that every replica gossips,
//! and a replica shares ownership only with the members that hash as it
//! does (see `Core::refresh_membership`): during a rollout that changes the
//! hash, each version group elects its own owners, so a worker is polled
//! once per group, never by nobody. The tests pin known answers, so a
//! change of hash fails them until the version is bumped with it.

use std::sync::Arc;

use crate::stable_hash::{FNV_OFFSET, fnv1a, mix};

/// Version of [`weight`], gossiped as `ownership_hash`. Bump it with any
/// change to the hash (the known-answer test below fails until then); a
/// member that gossips no version hashes as version 1 did.
pub const OWNERSHIP_HASH_VERSION: u32 = 1;

/// The version a member's gossiped `ownership_hash` value names: absent
/// means 1 (builds from before the key existed hash as version 1 does);
/// an unreadable value is `None` and matches no version.
pub fn gossiped_hash_version(value: Option<&str>) -> Option<u32> {
    match value {
        None => Some(1),
        Some(v) => v.trim().parse().ok(),
    }
}

/// The rendezvous weight of `member` for `worker`.
pub fn weight(member: &str, worker: &str) -> u64 {
    let h = fnv1a(member.bytes(), FNV_OFFSET);
    let h = fnv1a(std::iter::once(0xff).chain(worker.bytes()), h);
    mix(h)
}

/// The owner of `worker` among `members` (ties go to the larger name).
pub fn owner<'a>(members: &'a [Arc<str>], worker: &str) -> Option<&'a Arc<str>> {
    members
        .iter()
        .max_by(|a, b| weight(a, worker).cmp(&weight(b, worker)).then(a.cmp(b)))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(n: &[&str]) -> Vec<Arc<str>> {
        n.iter().map(|s| Arc::from(*s)).collect()
    }

    #[test]
    fn spreads_and_moves_only_what_it_must() {
        let three = names(&["a", "b", "c"]);
        let two = names(&["a", "b"]);
        let workers: Vec<String> = (0..300).map(|i| format!("http://w{i}:8000")).collect();
        let mut per = std::collections::HashMap::new();
        for w in &workers {
            let o = owner(&three, w).unwrap().clone();
            *per.entry(o.clone()).or_insert(0) += 1;
            let after = owner(&two, w).unwrap();
            if &*o != "c" {
                assert_eq!(after, &o, "a worker not owned by the dead member moved");
            }
        }
        for n in ["a", "b", "c"] {
            assert!(per[&Arc::from(n)] > 60, "uneven spread: {per:?}");
        }
        assert!(owner(&[], "w").is_none());
    }

    /// Known answers of hash version 1. A failure here means the hash
    /// changed: bump [`OWNERSHIP_HASH_VERSION`] and write the new answers,
    /// or mixed-version fleets would split poll ownership.
    #[test]
    fn weight_matches_the_known_answers_of_its_version() {
        assert_eq!(OWNERSHIP_HASH_VERSION, 1, "new version: new answers below");
        let vectors: [(&str, &str, u64); 6] = [
            ("a", "w", KNOWN[0]),
            ("b", "w", KNOWN[1]),
            ("ab", "w", KNOWN[2]),
            ("a", "bw", KNOWN[3]),
            ("shoal-0", "http://10.0.0.7:8000", KNOWN[4]),
            ("", "", KNOWN[5]),
        ];
        for (member, worker, want) in vectors {
            assert_eq!(
                weight(member, worker),
                want,
                "weight({member:?}, {worker:?}) changed"
            );
        }
        let three = names(&["shoal-0", "shoal-1", "shoal-2"]);
        let owners: Vec<&str> = ["http://10.0.0.7:8000", "http://10.0.0.8:8000", "http://e:1"]
            .iter()
            .map(|w| &**owner(&three, w).unwrap())
            .collect();
        assert_eq!(owners, KNOWN_OWNERS);
    }

    /// Computed independently (a few lines of Python over the same
    /// definition), not copied from this implementation's output.
    const KNOWN: [u64; 6] = [
        0xf29a_4a11_a15a_307b,
        0x594a_baad_3b1a_2ccf,
        0xcdaf_35ec_c951_5120,
        0xa5f3_b6f5_a465_31cd,
        0x6abf_2bd4_b985_3b8a,
        0x4f2d_b50f_1240_40cd,
    ];
    const KNOWN_OWNERS: [&str; 3] = ["shoal-1", "shoal-2", "shoal-2"];

    #[test]
    fn gossiped_versions_read_as_documented() {
        assert_eq!(gossiped_hash_version(None), Some(1));
        assert_eq!(gossiped_hash_version(Some("1")), Some(1));
        assert_eq!(gossiped_hash_version(Some("2")), Some(2));
        assert_eq!(gossiped_hash_version(Some("fnv")), None);
    }
}
