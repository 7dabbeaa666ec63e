//! A 64-bit hash every replica computes the same whatever its Rust version
//! or platform: FNV-1a with a splitmix64 finaliser, written out here.
//! Poll ownership (`ownership`) and the worker-set digest
//! (`worker_set::digest`) are wire contracts built on it, each pinned by
//! its own known-answer tests.

/// FNV-1a of `bytes`, continuing from `h` (start at [`FNV_OFFSET`]).
pub(crate) fn fnv1a(bytes: impl Iterator<Item = u8>, mut h: u64) -> u64 {
    for b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

/// FNV-1a's 64-bit offset basis.
pub(crate) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

/// splitmix64's finaliser: spreads FNV's weak low bits over the word.
pub(crate) fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
