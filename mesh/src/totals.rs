//! Per-worker sums of the counted incarnations' slots, kept up to date as
//! slots change, so a merged entry republishes its worker's fleet value in
//! O(1) instead of summing every peer again (at 64 replicas that re-sum
//! was 63 map lookups per entry received).
//!
//! Exact: each field is summed in 128 bits, where adding and removing any
//! number of u64 terms never overflows, and read back saturated to u64 —
//! the same value as the saturating sum recomputed from scratch.

use std::collections::HashMap;
use std::sync::Arc;

use shoal_proto::LoadCounts;

/// One worker's sum and how many slots are in it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Total {
    requests: u128,
    tokens: u128,
    pending_prefill: u128,
    dispatched_since_poll: u128,
    slots: u64,
}

impl Total {
    fn add(&mut self, c: &LoadCounts) {
        self.requests += u128::from(c.requests);
        self.tokens += u128::from(c.tokens);
        self.pending_prefill += u128::from(c.pending_prefill);
        self.dispatched_since_poll += u128::from(c.dispatched_since_poll);
    }

    fn sub(&mut self, c: &LoadCounts) {
        // Only what was added is taken away, so these never underflow;
        // saturating keeps a bug from wrapping to a huge load in release,
        // and a debug build stops at it.
        debug_assert!(
            self.requests >= u128::from(c.requests)
                && self.tokens >= u128::from(c.tokens)
                && self.pending_prefill >= u128::from(c.pending_prefill)
                && self.dispatched_since_poll >= u128::from(c.dispatched_since_poll),
            "a slot took away more than it added: {self:?} - {c:?}"
        );
        self.requests = self.requests.saturating_sub(u128::from(c.requests));
        self.tokens = self.tokens.saturating_sub(u128::from(c.tokens));
        self.pending_prefill = self
            .pending_prefill
            .saturating_sub(u128::from(c.pending_prefill));
        self.dispatched_since_poll = self
            .dispatched_since_poll
            .saturating_sub(u128::from(c.dispatched_since_poll));
    }

    fn counts(&self) -> LoadCounts {
        let narrow = |v: u128| u64::try_from(v).unwrap_or(u64::MAX);
        LoadCounts {
            requests: narrow(self.requests),
            tokens: narrow(self.tokens),
            pending_prefill: narrow(self.pending_prefill),
            dispatched_since_poll: narrow(self.dispatched_since_poll),
        }
    }
}

/// Sums per worker over the slots added and not yet removed.
#[derive(Debug, Clone, Default)]
pub(crate) struct Totals {
    by_worker: HashMap<Arc<str>, Total>,
}

impl Totals {
    /// A slot starts counting with `counts`.
    pub(crate) fn insert(&mut self, worker: &Arc<str>, counts: &LoadCounts) {
        let total = self.by_worker.entry(worker.clone()).or_default();
        total.slots += 1;
        total.add(counts);
    }

    /// A counting slot went from `old` to `new`.
    pub(crate) fn replace(&mut self, worker: &Arc<str>, old: &LoadCounts, new: &LoadCounts) {
        debug_assert!(
            self.by_worker.contains_key(worker),
            "a counting slot of {worker} has no total"
        );
        if let Some(total) = self.by_worker.get_mut(worker) {
            total.sub(old);
            total.add(new);
        }
    }

    /// A slot stops counting (its last value was `counts`); a worker with
    /// no slot left is dropped, so the map follows the live entries.
    pub(crate) fn remove(&mut self, worker: &str, counts: &LoadCounts) {
        let Some(total) = self.by_worker.get_mut(worker) else {
            return;
        };
        debug_assert!(total.slots > 0, "{worker}: a slot removed twice");
        total.sub(counts);
        total.slots = total.slots.saturating_sub(1);
        if total.slots == 0 {
            debug_assert_eq!(
                total.counts(),
                LoadCounts::default(),
                "{worker}: the last slot left a remainder"
            );
            self.by_worker.remove(worker);
        }
    }

    /// The sum for `worker` (zero when no slot counts).
    pub(crate) fn get(&self, worker: &str) -> LoadCounts {
        self.by_worker
            .get(worker)
            .map(Total::counts)
            .unwrap_or_default()
    }

    /// Workers with a sum.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.by_worker.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(r: u64, t: u64) -> LoadCounts {
        LoadCounts {
            requests: r,
            tokens: t,
            pending_prefill: 0,
            dispatched_since_poll: t,
        }
    }

    #[test]
    fn sums_follow_inserts_replacements_and_removals() {
        let w: Arc<str> = Arc::from("http://w");
        let mut t = Totals::default();
        t.insert(&w, &c(2, 10));
        t.insert(&w, &c(1, 5));
        assert_eq!(t.get(&w), c(3, 15));
        t.replace(&w, &c(2, 10), &c(0, 0));
        assert_eq!(t.get(&w), c(1, 5));
        t.remove(&w, &c(1, 5));
        t.remove(&w, &c(0, 0));
        assert_eq!(t.len(), 0, "no slot left: the worker is dropped");
        assert_eq!(t.get(&w), LoadCounts::default());
    }

    #[test]
    fn saturates_like_the_recomputed_sum_and_comes_back_exactly() {
        let w: Arc<str> = Arc::from("http://w");
        let mut t = Totals::default();
        t.insert(&w, &c(u64::MAX, u64::MAX));
        t.insert(&w, &c(5, 7));
        assert_eq!(t.get(&w), c(u64::MAX, u64::MAX), "saturated, as + does");
        t.replace(&w, &c(u64::MAX, u64::MAX), &c(1, 1));
        assert_eq!(t.get(&w), c(6, 8), "exact again once the huge slot left");
    }
}
