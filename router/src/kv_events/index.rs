//! The KV-block index: which engine holds which prompt blocks, built from
//! the engines' own events.
//!
//! Every replica subscribes to every engine's event stream and applies the
//! same events, so every replica holds the same index (see `mod.rs` for
//! why this beats shipping index deltas over the mesh).
//!
//! Layout, per event stream (one per engine data-parallel rank):
//! `engine hash → Shoal hash` ([`chain`](super::chain)), needed to chain a
//! new block from its parent and to find a removed one; and, shared by
//! all streams, `Shoal hash → streams holding it`, so a prompt's match is
//! one walk down its blocks whose cost is the number of holders, not the
//! number of engines. A stream's blocks are bounded
//! (`--kv-index-max-blocks-per-engine`); past it new blocks are not indexed
//! (counted): the index then misses blocks, it never claims one wrongly.

use std::collections::HashMap;

use crate::id_hash::IdMap;
use std::collections::hash_map::Entry;

use super::chain;
use super::holders::{self, Holders};
use super::wire::{KvEvent, Removed, Stored};

/// An event stream's handle in the index: one engine (data-parallel
/// rank) of one worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct StreamId(pub u32);

/// Whether a stream's blocks can be routed on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coverage {
    /// Every event since the engine started (seq 0) was applied: the index
    /// holds exactly what the engine caches.
    Complete,
    /// Events from some point on were applied (a late join, a replay whose
    /// buffer did not reach back to the start, a repaired gap): every block
    /// indexed is cached, but blocks stored earlier are missing.
    Suffix,
    /// Nothing trustworthy yet (never connected, or a gap not repaired).
    Cold,
}

/// What applying one batch did, for metrics.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Applied {
    /// Blocks added.
    pub stored: u64,
    /// Blocks removed.
    pub removed: u64,
    /// Blocks not indexed: no token ids, a parent never seen, another
    /// block size, a non-GPU tier or another attention group.
    pub skipped: u64,
    /// Blocks not indexed because the stream is at its bound.
    pub over_capacity: u64,
    /// Events of a type this router does not know.
    pub unknown: u64,
}

#[derive(Debug)]
struct Stream {
    /// The worker this stream's engine serves as (its registry id).
    worker: u64,
    blocks: HashMap<u64, u64>,
    coverage: Coverage,
}

/// The index of one replica.
#[derive(Debug)]
pub struct KvIndex {
    block_size: usize,
    max_blocks_per_stream: usize,
    /// Keyed by router-assigned ids: the cheap hasher (one lookup per
    /// candidate per selection).
    streams: IdMap<StreamId, Stream>,
    /// Keyed by Shoal's block hashes, which a client's prompt steers:
    /// std's keyed hasher.
    holders: HashMap<u64, Holders>,
    by_worker: IdMap<u64, Vec<StreamId>>,
    /// The best coverage of each worker's streams, kept beside them: a
    /// selection reads it for every candidate, and one small map stays in
    /// cache where two lookups into the stream records would not.
    trust: IdMap<u64, Coverage>,
    next_stream: u32,
    /// Adapter names blocks were stored under (at most [`MAX_ADAPTERS`]),
    /// so a request for one chains its prompt from the adapter's seed.
    adapters: std::collections::HashSet<String>,
}

/// Adapter names remembered; past it a new adapter's requests chain from
/// the base model's seed and match nothing of it (never a wrong claim:
/// its blocks are under its own seed).
pub const MAX_ADAPTERS: usize = 4096;

impl KvIndex {
    /// An empty index of `block_size`-token blocks, at most
    /// `max_blocks_per_stream` per engine.
    pub fn new(block_size: usize, max_blocks_per_stream: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            max_blocks_per_stream,
            streams: IdMap::default(),
            holders: HashMap::new(),
            by_worker: IdMap::default(),
            trust: IdMap::default(),
            next_stream: 0,
            adapters: std::collections::HashSet::new(),
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Registers a new, cold stream for `worker`.
    pub fn add_stream(&mut self, worker: u64) -> StreamId {
        let id = StreamId(self.next_stream);
        self.next_stream = self.next_stream.wrapping_add(1);
        self.streams.insert(
            id,
            Stream {
                worker,
                blocks: HashMap::new(),
                coverage: Coverage::Cold,
            },
        );
        self.by_worker.entry(worker).or_default().push(id);
        self.retrust(worker);
        id
    }

    /// Drops a stream and its blocks (its worker left).
    pub fn remove_stream(&mut self, id: StreamId) {
        self.clear(id);
        let Some(stream) = self.streams.remove(&id) else {
            return;
        };
        if let Entry::Occupied(mut entry) = self.by_worker.entry(stream.worker) {
            entry.get_mut().retain(|s| *s != id);
            if entry.get().is_empty() {
                entry.remove();
            }
        }
        self.retrust(stream.worker);
    }

    /// The best coverage among `worker`'s streams: whether its blocks can
    /// be routed on at all.
    pub fn worker_coverage(&self, worker: u64) -> Coverage {
        self.trust.get(&worker).copied().unwrap_or(Coverage::Cold)
    }

    /// Recomputes [`KvIndex::worker_coverage`] of `worker` from its
    /// streams (after one was added, removed or changed coverage).
    fn retrust(&mut self, worker: u64) {
        let streams = self.by_worker.get(&worker).map_or(&[][..], Vec::as_slice);
        let mut best = Coverage::Cold;
        for id in streams {
            match self.coverage(*id) {
                Coverage::Complete => {
                    best = Coverage::Complete;
                    break;
                }
                Coverage::Suffix => best = Coverage::Suffix,
                Coverage::Cold => {}
            }
        }
        if best == Coverage::Cold {
            self.trust.remove(&worker);
        } else {
            self.trust.insert(worker, best);
        }
    }

    /// Forgets every block of `id` (the engine cleared its cache, restarted
    /// or events were lost); its coverage is left to the caller.
    pub fn clear(&mut self, id: StreamId) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        for (_, ours) in stream.blocks.drain() {
            unhold(&mut self.holders, ours, id);
        }
    }

    /// Sets how far `id`'s blocks can be trusted.
    pub fn set_coverage(&mut self, id: StreamId, coverage: Coverage) {
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.coverage = coverage;
            let worker = stream.worker;
            self.retrust(worker);
        }
    }

    /// How far `id`'s blocks can be trusted.
    pub fn coverage(&self, id: StreamId) -> Coverage {
        self.streams
            .get(&id)
            .map_or(Coverage::Cold, |stream| stream.coverage)
    }

    /// The streams of `worker` (one per engine rank).
    pub fn streams_of(&self, worker: u64) -> Vec<StreamId> {
        self.by_worker.get(&worker).cloned().unwrap_or_default()
    }

    /// Blocks indexed for `id`.
    pub fn blocks_of(&self, id: StreamId) -> usize {
        self.streams.get(&id).map_or(0, |s| s.blocks.len())
    }

    /// Whether some engine holds `block` (any stream, trusted or not): a
    /// prompt's blocks after one nobody holds cannot match anywhere.
    pub fn holds(&self, block: u64) -> bool {
        self.holders.contains_key(&block)
    }

    /// Whether blocks were stored under the adapter `name`.
    pub fn has_adapter(&self, name: &str) -> bool {
        self.adapters.contains(name)
    }

    /// Distinct blocks indexed over all streams.
    pub fn distinct_blocks(&self) -> usize {
        self.holders.len()
    }

    /// Applies one batch's events from `id`.
    pub fn apply(&mut self, id: StreamId, events: &[KvEvent]) -> Applied {
        let mut applied = Applied::default();
        for event in events {
            match event {
                KvEvent::Stored(stored) => self.store(id, stored, &mut applied),
                KvEvent::Removed(removed) => self.remove(id, removed, &mut applied),
                KvEvent::AllCleared => self.clear(id),
                KvEvent::Unknown(_) => applied.unknown += 1,
            }
        }
        applied
    }

    fn store(&mut self, id: StreamId, event: &Stored, applied: &mut Applied) {
        let count = event.block_hashes.len() as u64;
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let size = self.block_size;
        let tokens = match &event.token_ids {
            Some(tokens)
                if event.on_gpu
                    && event.main_group
                    && event.block_size.is_none_or(|s| s as usize == size)
                    && tokens.len() == event.block_hashes.len() * size =>
            {
                tokens
            }
            _ => {
                applied.skipped += count;
                return;
            }
        };
        if let Some(name) = &event.lora
            && self.adapters.len() < MAX_ADAPTERS
            && !self.adapters.contains(name)
        {
            self.adapters.insert(name.clone());
        }
        let mut parent = match event.parent {
            None => chain::seed(event.lora.as_deref()),
            Some(engine_parent) => match stream.blocks.get(&engine_parent) {
                Some(&ours) => ours,
                None => {
                    applied.skipped += count;
                    return;
                }
            },
        };
        for (engine_hash, block_tokens) in event.block_hashes.iter().zip(tokens.chunks_exact(size))
        {
            let ours = chain::block(parent, block_tokens);
            parent = ours;
            let full = stream.blocks.len() >= self.max_blocks_per_stream;
            match stream.blocks.entry(*engine_hash) {
                Entry::Occupied(mut slot) => {
                    // Re-announced (vLLM's "full" report mode): idempotent.
                    let old = slot.insert(ours);
                    if old != ours {
                        unhold(&mut self.holders, old, id);
                        hold(&mut self.holders, ours, id);
                    }
                }
                Entry::Vacant(slot) => {
                    if full {
                        applied.over_capacity += 1;
                        continue;
                    }
                    slot.insert(ours);
                    hold(&mut self.holders, ours, id);
                    applied.stored += 1;
                }
            }
        }
    }

    fn remove(&mut self, id: StreamId, event: &Removed, applied: &mut Applied) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if !event.on_gpu || !event.main_group {
            applied.skipped += event.block_hashes.len() as u64;
            return;
        }
        for engine_hash in &event.block_hashes {
            if let Some(ours) = stream.blocks.remove(engine_hash) {
                unhold(&mut self.holders, ours, id);
                applied.removed += 1;
            }
        }
    }

    /// For `blocks` (a prompt's chained hashes), each trusted stream's
    /// cached prefix in blocks, as `(worker, blocks)`; streams matching no
    /// block are absent. A worker with several ranks appears once per rank.
    pub fn matches(&self, blocks: &[u64], out: &mut Vec<(u64, usize)>) {
        out.clear();
        let Some(first) = blocks.first().and_then(|b| self.holders.get(b)) else {
            return;
        };
        let mut alive: Vec<StreamId> = first
            .as_slice()
            .iter()
            .copied()
            .filter(|s| self.coverage(*s) != Coverage::Cold)
            .collect();
        let mut alive_print = holders::fingerprint(&alive);
        let mut depth = 1;
        let mut done: Vec<(StreamId, usize)> = Vec::new();
        for block in &blocks[1..] {
            if alive.is_empty() {
                break;
            }
            let holders = self.holders.get(block);
            if let Some(h) = holders
                && h.len() == alive.len()
                && h.fingerprint() == alive_print
            {
                // The common case down a shared prefix: everyone still
                // matches (a length and a fingerprint, one cache line,
                // instead of comparing or searching the list).
                depth += 1;
                continue;
            }
            let holders = holders.map_or(&[][..], Holders::as_slice);
            alive.retain(|s| {
                let still = holders.binary_search(s).is_ok();
                if !still {
                    done.push((*s, depth));
                    alive_print ^= holders::fingerprint_of(*s);
                }
                still
            });
            depth += 1;
        }
        done.extend(alive.into_iter().map(|s| (s, depth)));
        out.extend(
            done.into_iter()
                .filter_map(|(s, d)| self.streams.get(&s).map(|st| (st.worker, d))),
        );
    }
}

/// Adds `stream` to the holders of `block`.
fn hold(holders: &mut HashMap<u64, Holders>, block: u64, stream: StreamId) {
    match holders.entry(block) {
        Entry::Occupied(mut entry) => entry.get_mut().insert(stream),
        Entry::Vacant(slot) => {
            slot.insert(Holders::One(stream));
        }
    }
}

/// Removes `stream` from the holders of `block`, dropping an empty entry.
fn unhold(holders: &mut HashMap<u64, Holders>, block: u64, stream: StreamId) {
    if let Entry::Occupied(mut entry) = holders.entry(block)
        && !entry.get_mut().remove(stream)
    {
        entry.remove();
    }
}

#[cfg(test)]
#[path = "index_tests.rs"]
mod tests;
