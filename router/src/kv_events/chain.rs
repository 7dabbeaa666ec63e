//! Shoal's own block hashes: a chain over token ids, so a prompt's blocks
//! can be matched to an engine's without reproducing the engine's hash
//! function (which differs by engine, release and `--prefix-caching-hash-algo`).
//!
//! Block `i` of a token sequence hashes `(hash of block i-1, its tokens)`,
//! seeded by the adapter, so a block matches only when the whole prefix
//! before it (and the adapter) matches too — the property the engines'
//! own hashes have. Events carry each new block's tokens and its parent's
//! engine hash; the index maps engine hashes to these (`index`). Written
//! out word by word so every replica and build computes the same values;
//! a test pins a known answer.

/// splitmix64's finaliser (a well-mixed word from a weak one).
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The seed of a chain: the adapter's name hashed, or a constant for the
/// base model.
pub fn seed(lora: Option<&str>) -> u64 {
    let base = 0x5348_4f41_4c4b_5631; // "SHOALKV1"
    match lora {
        None => base,
        Some(name) => name.bytes().fold(mix(base ^ 0x4c4f_5241), |h, b| {
            (h.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15)
        }),
    }
}

/// The hash of a block of `tokens` whose parent block hashed to `parent`.
pub fn block(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = mix(parent ^ (tokens.len() as u64));
    for &t in tokens {
        h = (h.rotate_left(23) ^ u64::from(t)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    mix(h)
}

/// A hash of a text's bytes chained from `parent` (a request's identity
/// beyond its full blocks, whether or not all of it was tokenized).
pub fn text(parent: u64, bytes: &[u8]) -> u64 {
    // "TEXT"
    mix(fold_bytes(
        mix(parent ^ (bytes.len() as u64) ^ 0x5445_5854),
        bytes,
    ))
}

/// `h` with `bytes` folded in a word at a time (not finalised: callers mix
/// the result with what else identifies the text).
pub fn fold_bytes(mut h: u64, bytes: &[u8]) -> u64 {
    let mut words = bytes.chunks_exact(8);
    for w in words.by_ref() {
        let mut word = [0u8; 8];
        word.copy_from_slice(w);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(word)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    for &b in words.remainder() {
        h = (h.rotate_left(8) ^ u64::from(b)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    h
}

/// Hashes of every full `block_size`-token block of `tokens`, chained from
/// `seed` (a trailing partial block has none: engines cache full blocks).
pub fn blocks(seed: u64, tokens: &[u32], block_size: usize) -> Vec<u64> {
    let mut out = Vec::with_capacity(tokens.len() / block_size.max(1));
    let mut parent = seed;
    for chunk in tokens.chunks_exact(block_size.max(1)) {
        parent = block(parent, chunk);
        out.push(parent);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_match_only_shared_prefixes_and_adapters() {
        let a = blocks(seed(None), &[1, 2, 3, 4, 5, 6, 7], 2);
        let b = blocks(seed(None), &[1, 2, 3, 4, 9, 9], 2);
        assert_eq!(a.len(), 3, "the partial block is not hashed");
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let lora = blocks(seed(Some("my-lora")), &[1, 2, 3, 4], 2);
        assert_ne!(lora[0], a[0]);
        assert_ne!(seed(Some("a")), seed(Some("b")));
        // Chaining by parent equals hashing the whole sequence.
        assert_eq!(block(a[0], &[3, 4]), a[1]);
    }

    #[test]
    fn known_answer() {
        // A wire contract between replicas of different builds.
        assert_eq!(blocks(seed(None), &[1, 2, 3, 4], 4), vec![KNOWN]);
    }
    const KNOWN: u64 = 4_288_599_764_971_505_036;
}
