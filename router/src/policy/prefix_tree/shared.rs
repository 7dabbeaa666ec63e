//! The tree as `cache_aware` shares it between selections and its upkeep
//! task: one mutex, held by a selection only for the match and the insert.

use std::sync::{Mutex, MutexGuard, PoisonError};

use super::{PrefixTree, Tenant};

/// What one upkeep run did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Upkeep {
    /// Nodes freed because their workers were removed.
    pub(crate) forgotten_nodes: usize,
    /// Bytes evicted to keep every worker under the size bound.
    pub(crate) evicted_bytes: usize,
    /// Live nodes afterwards.
    pub(crate) nodes: usize,
}

/// A [`PrefixTree`] behind a mutex, plus the removed workers to forget.
#[derive(Debug, Default)]
pub(crate) struct SharedTree {
    tree: Mutex<PrefixTree>,
    /// Removed workers. Kept after they are forgotten, so a selection that
    /// raced with the removal and re-inserted one is cleaned up next run.
    gone: Mutex<Vec<Tenant>>,
}

impl SharedTree {
    /// Exclusive access for one selection (poisoning is ignored: the tree
    /// is a cache, and every operation leaves it consistent).
    pub(crate) fn lock(&self) -> MutexGuard<'_, PrefixTree> {
        self.tree.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Queues `tenant` to be forgotten by the next [`SharedTree::maintain`].
    pub(crate) fn forget_later(&self, tenant: Tenant) {
        self.gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tenant);
    }

    /// Forgets removed workers, then evicts down to `max_bytes` per worker.
    /// Walks the whole tree only when there is something to do.
    pub(crate) fn maintain(&self, max_bytes: usize) -> Upkeep {
        let gone = self
            .gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut tree = self.lock();
        let forgotten_nodes = tree.forget(&gone);
        let evicted_bytes = tree.evict(max_bytes);
        Upkeep {
            forgotten_nodes,
            evicted_bytes,
            nodes: tree.node_count(),
        }
    }
}
