//! Shrinking the tree: per-tenant LRU eviction down to a size bound, and
//! forgetting tenants (removed workers). Both walk the whole arena, so they
//! run in the background task, never on a request.

use std::cmp::Reverse;
use std::collections::BinaryHeap;

use super::{FREE, IdMap, PrefixTree, ROOT, Tenant};

/// Oldest-first queue of a tenant's leaves: (last access tick, node).
type LeafHeap = BinaryHeap<Reverse<(u64, u32)>>;

impl PrefixTree {
    /// Evicts, for every tenant holding more than `max_bytes`, its least
    /// recently used leaves (a node of the tenant none of whose children
    /// the tenant holds) until it fits, the way the SGLang gateway does.
    /// A node no tenant holds any more is freed. Returns the bytes evicted.
    pub(crate) fn evict(&mut self, max_bytes: usize) -> usize {
        let mut heaps: IdMap<LeafHeap> = self
            .sizes
            .iter()
            .filter(|(_, size)| **size > max_bytes)
            .map(|(tenant, _)| (*tenant, LeafHeap::new()))
            .collect();
        if heaps.is_empty() {
            return 0;
        }
        for (slot, node) in self.nodes.iter().enumerate().skip(1) {
            if node.parent == FREE {
                continue;
            }
            for (tenant, tick) in &node.tenants {
                if let Some(heap) = heaps.get_mut(tenant)
                    && !self.child_holds(slot as u32, *tenant)
                {
                    heap.push(Reverse((*tick, slot as u32)));
                }
            }
        }
        let mut evicted = 0;
        for (tenant, mut heap) in heaps {
            while self.size_of(tenant) > max_bytes {
                let Some(Reverse((_, node))) = heap.pop() else {
                    break;
                };
                let parent = self.nodes[node as usize].parent;
                if parent == FREE {
                    continue;
                }
                evicted += self.drop_leaf(node, tenant);
                if parent != ROOT
                    && let Some(tick) = self.nodes[parent as usize].tenants.get(&tenant).copied()
                    && !self.child_holds(parent, tenant)
                {
                    heap.push(Reverse((tick, parent)));
                }
            }
        }
        evicted
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
