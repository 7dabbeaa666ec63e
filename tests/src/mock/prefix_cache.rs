//! An LRU prefix cache over fixed-size blocks of prompt text.
//!
//! The prompt is cut into blocks of `block_chars` characters; block `i` is
//! identified by a hash chained over blocks `0..=i`, so a block only matches
//! when the whole prefix before it matches too (like a radix tree of KV
//! pages). Only full blocks are cached. Eviction is least recently used, and a
//! chain is touched from its last block to its first so that deeper blocks
//! are evicted before the shallow ones they depend on.

use std::collections::{BTreeMap, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::ops::Range;

/// Chained hashes of the full `block_chars`-character blocks of `text`.
pub fn block_hashes(text: &str, block_chars: usize) -> Vec<u64> {
    let block_chars = block_chars.max(1);
    let mut out = Vec::new();
    let mut prev: u64 = 0x5348_4f41_4c00_0001;
    let mut start = 0usize;
    let mut count = 0usize;
    for (i, c) in text.char_indices() {
        count += 1;
        if count == block_chars {
            let end = i + c.len_utf8();
            let mut h = DefaultHasher::new();
            prev.hash(&mut h);
            text.as_bytes()[start..end].hash(&mut h);
            prev = h.finish();
            out.push(prev);
            start = end;
            count = 0;
        }
    }
    out
}

/// What one [`PrefixCache::insert`] changed: what a real engine reports
/// as KV-cache events.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CacheChanges {
    /// Runs of newly cached blocks, as index ranges into the inserted chain.
    pub stored: Vec<Range<usize>>,
    /// Hashes of the blocks evicted to make room, oldest first.
    pub evicted: Vec<u64>,
}

/// An LRU set of block hashes with a capacity in blocks.
#[derive(Debug, Default)]
pub struct PrefixCache {
    capacity_blocks: usize,
    tick: u64,
    last_use: HashMap<u64, u64>,
    by_tick: BTreeMap<u64, u64>,
}

impl PrefixCache {
    /// A cache holding at most `capacity_blocks` blocks (0 disables caching).
    pub fn new(capacity_blocks: usize) -> Self {
        Self {
            capacity_blocks,
            ..Self::default()
        }
    }

    /// Number of blocks resident.
    pub fn len(&self) -> usize {
        self.last_use.len()
    }

    /// Whether no block is resident.
    pub fn is_empty(&self) -> bool {
        self.last_use.is_empty()
    }

    /// Length of the cached prefix of `hashes`, in blocks, without touching it.
    pub fn peek(&self, hashes: &[u64]) -> usize {
        hashes
            .iter()
            .take_while(|h| self.last_use.contains_key(h))
            .count()
    }

    /// Length of the cached prefix of `hashes` in blocks, marking it used.
    pub fn lookup(&mut self, hashes: &[u64]) -> usize {
        let n = self.peek(hashes);
        self.touch(&hashes[..n]);
        n
    }

    /// Inserts (or refreshes) every block of `hashes`, evicting as needed;
    /// returns which blocks were new and which were evicted.
    pub fn insert(&mut self, hashes: &[u64]) -> CacheChanges {
        let mut changes = CacheChanges::default();
        if self.capacity_blocks == 0 {
            return changes;
        }
        let keep = hashes.len().min(self.capacity_blocks);
        let mut run: Option<usize> = None;
        for (i, h) in hashes[..keep].iter().enumerate() {
            match (self.last_use.contains_key(h), run) {
                (false, None) => run = Some(i),
                (true, Some(start)) => {
                    changes.stored.push(start..i);
                    run = None;
                }
                _ => {}
            }
        }
        if let Some(start) = run {
            changes.stored.push(start..keep);
        }
        self.touch(&hashes[..keep]);
        while self.last_use.len() > self.capacity_blocks {
            let Some((&tick, &hash)) = self.by_tick.iter().next() else {
                break;
            };
            self.by_tick.remove(&tick);
            self.last_use.remove(&hash);
            changes.evicted.push(hash);
        }
        changes
    }

    /// Drops every block; returns how many there were.
    pub fn clear(&mut self) -> usize {
        let n = self.last_use.len();
        self.last_use.clear();
        self.by_tick.clear();
        n
    }

    fn touch(&mut self, hashes: &[u64]) {
        for &h in hashes.iter().rev() {
            self.tick += 1;
            if let Some(old) = self.last_use.insert(h, self.tick) {
                self.by_tick.remove(&old);
            }
            self.by_tick.insert(self.tick, h);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chained_blocks_match_only_shared_prefixes() {
        let a = block_hashes("aaaabbbbccccdd", 4);
        let b = block_hashes("aaaabbbbxxxx", 4);
        assert_eq!(a.len(), 3);
        assert_eq!(a[..2], b[..2]);
        assert_ne!(a[2], b[2]);
        let mut cache = PrefixCache::new(16);
        assert_eq!(cache.lookup(&a), 0);
        cache.insert(&a);
        assert_eq!(cache.lookup(&b), 2);
        assert_eq!(cache.peek(&a), 3);
    }

    #[test]
    fn evicts_least_recently_used_deepest_first() {
        let a = block_hashes("aaaabbbbcccc", 4);
        let b = block_hashes("zzzzyyyy", 4);
        let mut cache = PrefixCache::new(4);
        assert_eq!(cache.insert(&a).stored, vec![0..3]);
        let changes = cache.insert(&b);
        assert_eq!(changes.stored, vec![0..2]);
        assert_eq!(changes.evicted, vec![a[2]]);
        assert_eq!(cache.len(), 4);
        // a's deepest block went first; its first two blocks still match.
        assert_eq!(cache.peek(&a), 2);
        assert_eq!(cache.peek(&b), 2);
    }

    #[test]
    fn reports_only_new_runs_and_clears() {
        let a = block_hashes("aaaabbbbcccc", 4);
        let mut cache = PrefixCache::new(8);
        // Only the middle block resident: two runs of new blocks around it.
        cache.insert(&a[1..2]);
        let changes = cache.insert(&a);
        assert_eq!(
            changes,
            CacheChanges {
                stored: vec![0..1, 2..3],
                evicted: vec![]
            }
        );
        assert!(
            cache.insert(&a).stored.is_empty(),
            "refreshing stores nothing"
        );
        assert_eq!(cache.clear(), 3);
        assert_eq!(cache.peek(&a), 0);
        assert_eq!(PrefixCache::new(0).insert(&a), CacheChanges::default());
    }
}
