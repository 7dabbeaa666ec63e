//! `precise_prefix`: the worker whose KV cache really holds the most of the
//! prompt, priced against its wait, never past a bound on its load.
//!
//! The engines say what they cache (KV events, `kv_events`); every replica
//! keeps the same index of it. For a request, the prompt is tokenized and
//! chained into blocks, and for each candidate:
//!
//! ```text
//! score = wait − saved,   saved = cached prefix tokens in least_load's unit
//! ```
//!
//! `wait` is `least_load`'s expected wait (fleet-wide token-work over
//! throughput, plus the KV barrier) and `saved` is the prefill the cached
//! prefix spares, in the same seconds-of-work unit, so a long cached prefix
//! on a busy engine and a cold idle engine are compared on one scale.
//! Lowest score wins, among the candidates inside `prefix_affinity`'s
//! bounded-load guard (wait and fleet in-flight requests within `1 + ε` of
//! the mean): a hot prefix spreads to more engines instead of piling onto
//! one. Outside the guard, or when nobody caches anything, least_load.
//!
//! A worker whose event stream cannot be trusted (no events configured,
//! not connected, a gap not repaired) is scored as `prefix_affinity` would
//! place it: among such workers, the rendezvous choice for the prompt's
//! affinity key is credited with that key's prefix. The fallback is per
//! worker: one engine without events never turns the index off for the rest.
//!
//! Ties (equal scores, common when nothing is cached) go to the highest
//! rendezvous weight of the prompt's first block, not to a coin: every
//! replica asked the same question gives the same answer.

use std::collections::HashMap;
use std::sync::Arc;

use super::least_load::{LeastLoadPolicy, Scores};
use super::prefix_affinity::{BLOCK_BYTES, LoadBound, affinity_key, rendezvous_weight};
use super::{Policy, pick};
use crate::config::defaults::{CHARS_PER_TOKEN, PRECISE_PREFIX_MAX_PROMPT_BYTES};
use crate::config::{KvEventsConfig, LeastLoadConfig, PrefixAffinityConfig, RoutingConfig};
use crate::fleet::FleetView;
use crate::kv_events::KvEvents;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// The `precise_prefix` policy.
#[derive(Debug)]
pub struct PrecisePrefixPolicy {
    kv: Arc<KvEvents>,
    epsilon: super::knobs::Knobs<f64>,
    affinity_blocks: super::knobs::Knobs<usize>,
    least_load: LeastLoadPolicy,
}

impl PrecisePrefixPolicy {
    /// A policy on these knobs; its wait is least_load's with `least_load`.
    pub fn new(
        kv: KvEventsConfig,
        affinity: PrefixAffinityConfig,
        least_load: LeastLoadConfig,
    ) -> Self {
        Self {
            epsilon: super::knobs::Knobs::new(kv.precise_prefix_epsilon),
            affinity_blocks: super::knobs::Knobs::new(affinity.prefix_affinity_blocks),
            kv: Arc::new(KvEvents::new(kv)),
            least_load: LeastLoadPolicy::new(least_load),
        }
    }

    /// Cached prefix tokens per candidate: from the index for trusted
    /// workers, by prefix affinity for the others.
    fn cached_tokens(
        &self,
        candidates: &[Arc<Worker>],
        request: &RequestInfo,
        blocks: &[u64],
    ) -> Vec<u64> {
        let ids: Vec<u64> = candidates.iter().map(|w| w.id()).collect();
        let (mut depth, mut trusted) = (HashMap::new(), Vec::new());
        self.kv
            .cached_and_trusted(blocks, &ids, &mut depth, &mut trusted);
        let block_tokens = self.kv.block_size() as u64;
        let mut cached: Vec<u64> = ids
            .iter()
            .map(|id| depth.get(id).map_or(0, |d| *d as u64 * block_tokens))
            .collect();
        let untrusted: Vec<usize> = (0..candidates.len()).filter(|&i| !trusted[i]).collect();
        if untrusted.is_empty() {
            return cached;
        }
        let key_blocks = self.affinity_blocks.get();
        let key = request
            .text
            .as_deref()
            .and_then(|t| affinity_key(t.as_bytes(), key_blocks));
        if let Some(key) = key {
            let home = untrusted
                .iter()
                .copied()
                .max_by_key(|&i| rendezvous_weight(key, candidates[i].url_hash()));
            if let Some(home) = home {
                let key_tokens = (key_blocks * BLOCK_BYTES) as u64 / CHARS_PER_TOKEN;
                cached[home] = key_tokens.min(request.prompt_tokens);
            }
        }
        cached
    }
}

impl Policy for PrecisePrefixPolicy {
    fn name(&self) -> &'static str {
        "precise_prefix"
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        request: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize> {
        let mut scores = Scores::with_capacity(candidates.len());
        let unit = self.least_load.scores(candidates, fleet, &mut scores);
        let least = || pick::argmin(&scores.values, pick::seed());
        let Some(blocks) = self.kv.prompt_blocks(request) else {
            return least();
        };
        let own = unit.of_request(self.least_load.work_of(request));
        let Some(bound) =
            LoadBound::over(&scores.values, &scores.requests, own, self.epsilon.get())
        else {
            return least();
        };
        let cached = self.cached_tokens(candidates, request, &blocks);
        if cached.iter().all(|c| *c == 0) {
            return least();
        }
        let tie_key = blocks.first().copied().unwrap_or(0);
        let mut best: Option<(f64, u64, usize)> = None;
        for (i, worker) in candidates.iter().enumerate() {
            let (wait, requests) = (scores.values[i], scores.requests[i]);
            if !bound.admits(wait, requests) {
                continue;
            }
            let score = wait - unit.of_request(cached[i]);
            let weight = rendezvous_weight(tie_key, worker.url_hash());
            let better = match best {
                None => score.is_finite(),
                Some((top, top_weight, _)) => score < top || (score == top && weight > top_weight),
            };
            if better {
                best = Some((score, weight, i));
            }
        }
        best.map(|(_, _, i)| i).or_else(least)
    }

    fn prompt_text_limit(&self) -> Option<usize> {
        Some(PRECISE_PREFIX_MAX_PROMPT_BYTES)
    }

    fn kv_events(&self) -> Option<Arc<KvEvents>> {
        Some(self.kv.clone())
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        self.epsilon.set(routing.kv_events.precise_prefix_epsilon);
        self.affinity_blocks
            .set(routing.prefix_affinity.prefix_affinity_blocks);
        self.least_load.set_config(routing.least_load);
    }

    fn token_work(&self, request: &RequestInfo) -> u64 {
        self.least_load.token_work(request)
    }
}

#[cfg(test)]
mod tests;
