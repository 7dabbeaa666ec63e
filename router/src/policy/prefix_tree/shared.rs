//! The tree as `cache_aware` shares it between selections and its upkeep
//! task: one mutex, held by a selection only for the match and the insert,
//! and by the upkeep only in bounded steps.

use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use super::evict::{EVICT_BATCH, SCAN_CHUNK};
use super::{PrefixTree, Tenant};

/// What one prefix-tree upkeep round did (logged by the policy's
/// background task; returned to tests and benchmarks by
/// `CacheAwarePolicy::evict_now`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TreeUpkeep {
    /// Nodes freed because their workers were removed.
    pub forgotten_nodes: usize,
    /// Bytes evicted to bring every worker within `--max-tree-size`.
    pub evicted_bytes: usize,
    /// Live nodes afterwards.
    pub nodes: usize,
    /// Times the round took the tree's lock (it steps, releasing it).
    pub lock_holds: usize,
    /// The longest hold: the most a selection could have waited.
    pub longest_hold: Duration,
}

/// How an upkeep run steps through the tree.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Steps {
    /// Arena slots scanned per lock hold.
    pub(crate) scan: usize,
    /// Candidates examined per lock hold.
    pub(crate) evict: usize,
}

impl Default for Steps {
    fn default() -> Self {
        Self {
            scan: SCAN_CHUNK,
            evict: EVICT_BATCH,
        }
    }
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

    /// The tree if nobody holds the lock now (tests check the upkeep lets
    /// go between its steps).
    #[cfg(test)]
    pub(crate) fn try_lock(&self) -> Option<MutexGuard<'_, PrefixTree>> {
        self.tree.try_lock().ok()
    }

    /// Queues `tenant` to be forgotten by the next [`SharedTree::maintain`].
    pub(crate) fn forget_later(&self, tenant: Tenant) {
        self.gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(tenant);
    }

    /// Forgets removed workers, then evicts down to `max_bytes` per worker,
    /// in bounded steps with the lock released (and the thread yielded)
    /// between them. Walks the tree only when there is something to do.
    pub(crate) fn maintain(&self, max_bytes: usize) -> TreeUpkeep {
        self.maintain_in_steps(max_bytes, Steps::default(), std::thread::yield_now)
    }

    /// [`SharedTree::maintain`] with explicit step sizes, calling `between`
    /// each time the lock is released (tests use it to act in the gaps).
    pub(crate) fn maintain_in_steps(
        &self,
        max_bytes: usize,
        steps: Steps,
        mut between: impl FnMut(),
    ) -> TreeUpkeep {
        let gone = self
            .gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        let mut upkeep = TreeUpkeep::default();
        let mut held = |op: &mut dyn FnMut(&mut PrefixTree)| {
            let mut tree = self.lock();
            let started = Instant::now();
            op(&mut tree);
            upkeep.lock_holds += 1;
            upkeep.longest_hold = upkeep.longest_hold.max(started.elapsed());
        };
        // Forgetting walks the whole arena in one hold, but only after a
        // worker was removed.
        let mut forgotten_nodes = 0;
        let mut round = None;
        held(&mut |tree| {
            forgotten_nodes = tree.forget(&gone);
            round = tree.eviction_round(max_bytes);
        });
        let mut evicted_bytes = 0;
        if let Some(mut round) = round {
            let mut scanned = false;
            while !scanned {
                between();
                held(&mut |tree| scanned = tree.scan_leaves(&mut round, steps.scan));
            }
            let mut done = false;
            while !done {
                between();
                held(&mut |tree| {
                    let (bytes, finished) = tree.evict_some(&mut round, max_bytes, steps.evict);
                    evicted_bytes += bytes;
                    done = finished;
                });
            }
        }
        let mut nodes = 0;
        held(&mut |tree| nodes = tree.node_count());
        TreeUpkeep {
            forgotten_nodes,
            evicted_bytes,
            nodes,
            ..upkeep
        }
    }
}
