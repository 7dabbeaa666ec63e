//! `cache_aware`: send a prompt where its prefix is probably cached, unless
//! the pool is imbalanced.
//!
//! Per selection, over the candidates (the healthy, available workers):
//!
//! 1. **Imbalance guard.** The pool is imbalanced if any of
//!    (a) max k > `--overload-token-usage-threshold` (1.0 = off),
//!    (b) max k - min k > `--balance-token-usage-threshold` (1.0 = off),
//!    (c) max - min fleet in-flight requests > `--balance-abs-threshold`
//!    and max > `--balance-rel-threshold` × min.
//!    (a) and (b) are evaluated only when *every* candidate has a fresh,
//!    valid KV usage `k`; otherwise they are skipped (a partial view would
//!    compare known workers against unknown ones). With the defaults (a)
//!    and (b) can never fire, so the policy is exactly the count-only guard.
//! 2. **Imbalanced:** if (a) or (b) fired, the fewest fleet in-flight
//!    requests among the workers under both KV thresholds (k at most the
//!    overload threshold and at most min k + the balance threshold; if
//!    every worker is overloaded, just the latter); if only (c), the
//!    fewest fleet in-flight requests. (The SGLang gateway takes the single
//!    coldest-KV worker, and so did this policy: KV moves only at polls,
//!    so every request from every replica went to that one worker for a
//!    whole poll interval. In-flight counts move with every booking, so
//!    the fallback water-fills across the cool workers instead.)
//! 3. **Balanced:** the candidate holding the longest prefix of the prompt
//!    in the prefix tree (`prefix_tree`), if that prefix is more than
//!    `--cache-threshold` of the prompt (bytes of UTF-8 text); several
//!    candidates with that same match: the fewest in-flight requests.
//!    Otherwise the fewest fleet in-flight requests ("lowest load").
//! 4. The prompt is inserted into the chosen worker's tree in every case, as
//!    the engine will now cache it. Remaining ties break at random.
//!
//! Choices: "lowest load" is fleet in-flight requests (the same signal as the guard, so it means the same on 1 or N
//! replicas and water-fills, as bookings show at once); a request without
//! text (token ids only) has match rate 0 and inserts nothing. Eviction and
//! forgetting removed workers run in [`Policy::background_task`]. Only the
//! first [`MAX_PROMPT_BYTES`] of a prompt are matched and inserted: a
//! longer prompt (a 64 MiB body) would otherwise be copied into the tree
//! under its lock.

#[cfg(test)]
mod tests;

/// Leading bytes of a prompt the prefix tree matches and remembers (1 MiB,
/// about 250k tokens: past any context window served today).
pub const MAX_PROMPT_BYTES: usize = 1 << 20;

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;

use super::knobs::Knobs;
use super::pick::{self, MinPick};
use super::prefix_tree::{Level, PrefixTree, SharedTree, TreeUpkeep};
use super::{Policy, signals};
use crate::config::{CacheAwareConfig, RoutingConfig};
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// What one pass over the candidates learned.
struct Survey {
    /// Fleet in-flight requests per candidate.
    requests: Vec<u64>,
    min_requests: u64,
    max_requests: u64,
    /// Fresh, valid KV usage per candidate.
    usage: Vec<Option<f64>>,
    /// (min k, max k) if every candidate has a fresh, valid k.
    kv_range: Option<(f64, f64)>,
    least_loaded: MinPick<u64>,
}

fn survey(candidates: &[Arc<Worker>], fleet: &dyn FleetView, seed: u64) -> Survey {
    let now = fleet.moment(Instant::now());
    let mut s = Survey {
        requests: Vec::with_capacity(candidates.len()),
        usage: Vec::with_capacity(candidates.len()),
        min_requests: u64::MAX,
        max_requests: 0,
        kv_range: Some((f64::INFINITY, f64::NEG_INFINITY)),
        least_loaded: MinPick::new(seed),
    };
    for (i, worker) in candidates.iter().enumerate() {
        let load = fleet.load(worker, &now);
        let requests = load.counts.requests;
        s.requests.push(requests);
        s.min_requests = s.min_requests.min(requests);
        s.max_requests = s.max_requests.max(requests);
        s.least_loaded.offer(requests, i);
        let k = signals::token_usage(&load);
        s.usage.push(k);
        match (k, s.kv_range.as_mut()) {
            (Some(k), Some((lo, hi))) => {
                *lo = lo.min(k);
                *hi = hi.max(k);
            }
            _ => s.kv_range = None,
        }
    }
    s
}

/// Which rule of the imbalance guard fired, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Imbalance {
    /// (a) or (b): fall back to the least loaded of the KV-cool workers.
    Kv,
    /// (c) only: fall back to the fewest in-flight requests.
    Requests,
}

/// The `cache_aware` policy.
#[derive(Debug)]
pub struct CacheAwarePolicy {
    config: Arc<Knobs<CacheAwareConfig>>,
    /// `config.eviction_interval()`, kept apart so tests can use a
    /// sub-second one.
    eviction_interval: Duration,
    tree: Arc<SharedTree>,
}

impl CacheAwarePolicy {
    /// A policy with an empty prefix tree.
    pub fn new(config: CacheAwareConfig) -> Self {
        Self {
            eviction_interval: config.eviction_interval(),
            config: Arc::new(Knobs::new(config)),
            tree: Arc::default(),
        }
    }

    /// Runs one upkeep round now (what the background task does every
    /// `--eviction-interval-secs`) and says what it did.
    pub fn evict_now(&self) -> TreeUpkeep {
        self.tree.maintain(self.config.get().max_tree_size)
    }

    fn imbalance(&self, s: &Survey, c: &CacheAwareConfig) -> Option<Imbalance> {
        if let Some((lo, hi)) = s.kv_range
            && (hi > c.overload_token_usage_threshold || hi - lo > c.balance_token_usage_threshold)
        {
            return Some(Imbalance::Kv);
        }
        let spread = s.max_requests.saturating_sub(s.min_requests);
        ((spread > c.balance_abs_threshold)
            && (s.max_requests as f64) > c.balance_rel_threshold * (s.min_requests as f64))
            .then_some(Imbalance::Requests)
    }

    /// The fewest fleet in-flight requests among the candidates under
    /// both KV thresholds, or, if every one is over the overload
    /// threshold, among those within the balance threshold of the coldest.
    fn least_loaded_under_kv_thresholds(
        &self,
        s: &Survey,
        c: &CacheAwareConfig,
        seed: u64,
    ) -> Option<usize> {
        let (lo, _) = s.kv_range?;
        let mut cool = MinPick::new(seed);
        let mut near_coldest = MinPick::new(seed);
        for (i, k) in s.usage.iter().enumerate() {
            let Some(k) = *k else { continue };
            if k - lo <= c.balance_token_usage_threshold {
                near_coldest.offer(s.requests[i], i);
                if k <= c.overload_token_usage_threshold {
                    cool.offer(s.requests[i], i);
                }
            }
        }
        cool.index().or(near_coldest.index())
    }

    /// The candidate with the deepest prefix match above the threshold.
    fn affinity(
        &self,
        tree: &PrefixTree,
        text: &[u8],
        candidates: &[Arc<Worker>],
        s: &Survey,
        cache_threshold: f64,
        seed: u64,
    ) -> Option<usize> {
        let mut path: Vec<Level> = Vec::new();
        tree.walk(text, &mut path);
        let mut scanned_tenants = 0;
        for level in path.iter().rev() {
            if level.matched as f64 / text.len() as f64 <= cache_threshold {
                break;
            }
            let tenants = tree.tenants(level.node);
            // Tenants nest: a level with as many tenants as the deeper one
            // just scanned holds exactly the same ones.
            if tenants.len() == scanned_tenants {
                continue;
            }
            scanned_tenants = tenants.len();
            let mut pick = MinPick::new(seed);
            for (i, worker) in candidates.iter().enumerate() {
                if tenants.contains_key(&worker.id()) {
                    pick.offer(s.requests[i], i);
                }
            }
            if pick.index().is_some() {
                return pick.index();
            }
        }
        None
    }
}

impl Policy for CacheAwarePolicy {
    fn name(&self) -> &'static str {
        "cache_aware"
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        request: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize> {
        let seed = pick::seed();
        let c = self.config.get();
        let s = survey(candidates, fleet, seed);
        let text = request.text.as_deref().unwrap_or_default().as_bytes();
        let mut tree = self.tree.lock();
        let chosen = match self.imbalance(&s, &c) {
            Some(Imbalance::Kv) => self.least_loaded_under_kv_thresholds(&s, &c, seed),
            Some(Imbalance::Requests) => s.least_loaded.index(),
            None if text.is_empty() => s.least_loaded.index(),
            None => self
                .affinity(&tree, text, candidates, &s, c.cache_threshold, seed)
                .or(s.least_loaded.index()),
        }?;
        if !text.is_empty() {
            tree.insert(text, candidates.get(chosen)?.id());
        }
        Some(chosen)
    }

    fn prompt_text_limit(&self) -> Option<usize> {
        Some(MAX_PROMPT_BYTES)
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        // The upkeep interval is fixed when the task starts; the rest
        // applies from the next selection (and upkeep round) on.
        self.config.set(routing.cache_aware);
    }

    fn on_worker_removed(&self, worker: &Worker) {
        self.tree.forget_later(worker.id());
    }

    fn background_task(&self) -> Option<BoxFuture<'static, ()>> {
        let tree = self.tree.clone();
        let interval = self.eviction_interval;
        let knobs = self.config.clone();
        Some(Box::pin(async move {
            let mut ticker = tokio::time::interval(interval);
            ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            ticker.tick().await;
            loop {
                ticker.tick().await;
                let tree = tree.clone();
                let max_bytes = knobs.get().max_tree_size;
                match tokio::task::spawn_blocking(move || tree.maintain(max_bytes)).await {
                    Ok(upkeep) => tracing::debug!(
                        forgotten_nodes = upkeep.forgotten_nodes,
                        evicted_bytes = upkeep.evicted_bytes,
                        nodes = upkeep.nodes,
                        lock_holds = upkeep.lock_holds,
                        longest_hold_us = upkeep.longest_hold.as_micros() as u64,
                        "prefix tree upkeep"
                    ),
                    Err(err) => tracing::warn!(error = %err, "prefix tree upkeep failed"),
                }
            }
        }))
    }
}
