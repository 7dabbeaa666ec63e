//! Shrinking the tree: per-tenant LRU eviction down to a size bound, and
//! forgetting tenants (removed workers). Both walk the whole arena, so they
//! run in the background task, never on a request; eviction runs in
//! bounded steps so the lock selections share is never held for long.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{FREE, IdMap, PrefixTree, ROOT, Tenant};

/// Oldest-first queue of a tenant's leaves: (last access tick, node).
type LeafHeap = BinaryHeap<Reverse<(u64, u32)>>;

/// Arena slots scanned for eviction candidates per lock hold.
pub(crate) const SCAN_CHUNK: usize = 4 * 1024;
/// Candidate leaves examined per lock hold while evicting.
pub(crate) const EVICT_BATCH: usize = 512;

/// One eviction round in progress: for each tenant over the bound, its
/// candidate leaves oldest first, and how far the arena has been scanned.
///
/// Why a value of its own: the round runs in steps, each under its own
/// short hold of the tree's lock (see `SharedTree::maintain`), so
/// selections never wait for a whole-tree walk. Between steps selections
/// may touch, extend or split what was found; every candidate is checked
/// again when its turn comes ([`PrefixTree::evict_some`]).
#[derive(Debug, Default)]
pub(crate) struct EvictionRound {
    heaps: IdMap<LeafHeap>,
    next_slot: usize,
}

impl PrefixTree {
    /// Evicts, for every tenant holding more than `max_bytes`, its least
    /// recently used leaves (a node of the tenant none of whose children
    /// the tenant holds) until it fits, the way the SGLang gateway does.
    /// A node no tenant holds any more is freed. Returns the bytes evicted.
    /// All in one go (tests); the policy's upkeep runs the same round in
    /// steps (`SharedTree::maintain`).
    #[cfg(test)]
    pub(crate) fn evict(&mut self, max_bytes: usize) -> usize {
        let Some(mut round) = self.eviction_round(max_bytes) else {
            return 0;
        };
        self.scan_leaves(&mut round, usize::MAX);
        self.evict_some(&mut round, max_bytes, usize::MAX).0
    }

    /// Starts a round for the tenants over `max_bytes`; `None` when none is.
    pub(crate) fn eviction_round(&self, max_bytes: usize) -> Option<EvictionRound> {
        let heaps: IdMap<LeafHeap> = self
            .sizes
            .iter()
            .filter(|(_, size)| **size > max_bytes)
            .map(|(tenant, _)| (*tenant, LeafHeap::new()))
            .collect();
        (!heaps.is_empty()).then_some(EvictionRound {
            heaps,
            next_slot: 1,
        })
    }

    /// Scans up to `limit` more arena slots for the round's candidate
    /// leaves. Returns whether the whole arena has now been scanned.
    pub(crate) fn scan_leaves(&self, round: &mut EvictionRound, limit: usize) -> bool {
        let end = self.nodes.len().min(round.next_slot.saturating_add(limit));
        for slot in round.next_slot..end {
            let node = &self.nodes[slot];
            if node.parent == FREE {
                continue;
            }
            for (tenant, tick) in &node.tenants {
                if let Some(heap) = round.heaps.get_mut(tenant)
                    && !self.child_holds(slot as u32, *tenant)
                {
                    heap.push(Reverse((*tick, slot as u32)));
                }
            }
        }
        round.next_slot = end.max(round.next_slot);
        round.next_slot >= self.nodes.len()
    }

    /// Evicts the round's candidates, oldest first per tenant, until each
    /// tenant fits or `limit` candidates were examined. A candidate a
    /// selection touched (newer tick), extended (no longer a leaf) or freed
    /// since the scan is skipped. Returns the bytes evicted and whether the
    /// round is finished.
    pub(crate) fn evict_some(
        &mut self,
        round: &mut EvictionRound,
        max_bytes: usize,
        limit: usize,
    ) -> (usize, bool) {
        let mut evicted = 0;
        let mut budget = limit;
        let tenants: Vec<Tenant> = round.heaps.keys().copied().collect();
        for tenant in tenants {
            let Some(heap) = round.heaps.get_mut(&tenant) else {
                continue;
            };
            while self.size_of(tenant) > max_bytes {
                if budget == 0 {
                    return (evicted, false);
                }
                budget -= 1;
                let Some(Reverse((tick, node))) = heap.pop() else {
                    break;
                };
                if !self.is_leaf_of(node, tenant, tick) {
                    continue;
                }
                let parent = self.nodes[node as usize].parent;
                evicted += self.drop_leaf(node, tenant);
                if parent != ROOT
                    && let Some(tick) = self.nodes[parent as usize].tenants.get(&tenant).copied()
                    && !self.child_holds(parent, tenant)
                {
                    heap.push(Reverse((tick, parent)));
                }
            }
            round.heaps.remove(&tenant);
        }
        (evicted, true)
    }

    /// Whether `node` is live, held by `tenant` since exactly `tick`, and a
    /// leaf of the tenant (none of its children held by it).
    fn is_leaf_of(&self, node: u32, tenant: Tenant, tick: u64) -> bool {
        self.nodes.get(node as usize).is_some_and(|slot| {
            slot.parent != FREE
                && slot.tenants.get(&tenant) == Some(&tick)
                && !self.child_holds(node, tenant)
        })
    }

    /// Removes `tenants` from every node and frees the nodes left without
    /// any tenant. Returns how many nodes were freed.
    pub(crate) fn forget(&mut self, tenants: &[Tenant]) -> usize {
        if tenants.iter().all(|t| !self.sizes.contains_key(t)) {
            return 0;
        }
        for tenant in tenants {
            self.sizes.remove(tenant);
        }
        let mut emptied = Vec::new();
        for (slot, node) in self.nodes.iter_mut().enumerate().skip(1) {
            if node.parent == FREE {
                continue;
            }
            for tenant in tenants {
                node.tenants.remove(tenant);
            }
            if node.tenants.is_empty() {
                emptied.push(slot as u32);
            }
        }
        // Tenants nest, so an emptied node's subtree is emptied too: detach
        // only the tops, then free every emptied slot.
        for &slot in &emptied {
            let parent = self.nodes[slot as usize].parent;
            if parent == ROOT || !self.nodes[parent as usize].tenants.is_empty() {
                self.unlink(parent, slot);
            }
        }
        for &slot in &emptied {
            self.release(slot);
        }
        emptied.len()
    }

    fn child_holds(&self, node: u32, tenant: Tenant) -> bool {
        self.nodes[node as usize]
            .children
            .iter()
            .any(|(_, child)| self.nodes[*child as usize].tenants.contains_key(&tenant))
    }

    /// Takes `tenant` off leaf `node`; frees the node if nobody holds it.
    /// Returns the bytes the tenant gave up.
    fn drop_leaf(&mut self, node: u32, tenant: Tenant) -> usize {
        let slot = &mut self.nodes[node as usize];
        if slot.tenants.remove(&tenant).is_none() {
            return 0;
        }
        let bytes = slot.edge.len();
        if let Some(size) = self.sizes.get_mut(&tenant) {
            *size = size.saturating_sub(bytes);
            if *size == 0 {
                self.sizes.remove(&tenant);
            }
        }
        if self.nodes[node as usize].tenants.is_empty() {
            let parent = self.nodes[node as usize].parent;
            self.unlink(parent, node);
            self.release(node);
        }
        bytes
    }

    fn unlink(&mut self, parent: u32, child: u32) {
        self.nodes[parent as usize]
            .children
            .retain(|(_, c)| *c != child);
    }

    /// Puts a detached node's slot on the free list. A node without tenants
    /// has no children with tenants, so any children left are freed too.
    fn release(&mut self, node: u32) {
        let mut stack = vec![node];
        while let Some(slot) = stack.pop() {
            let freed = std::mem::take(&mut self.nodes[slot as usize]);
            if freed.parent == FREE {
                self.nodes[slot as usize].parent = FREE;
                continue;
            }
            self.nodes[slot as usize].parent = FREE;
            stack.extend(freed.children.iter().map(|(_, c)| *c));
            self.free.push(slot);
        }
    }
}
