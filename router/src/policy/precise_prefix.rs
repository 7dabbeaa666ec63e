//! `precise_prefix`: the worker whose KV cache really holds the most of the
//! prompt, priced against its wait, never past a bound on its load.
//!
//! The engines say what they cache (KV events, `kv_events`); every replica
//! keeps the same index of it. For a request, the prompt is tokenized and
//! chained into blocks, and for each candidate:
//!
//! ```text
//! score = wait − w × saved,   saved = cached prefix tokens in least_load's unit
//! ```
//!
//! (`w`, `--precise-prefix-cache-weight`: 1 weighs only this request's
//! own TTFT; a miss also adds its prefill to the queue of every request
//! behind it, which a larger `w` counts.)
//!
//! `wait` is `least_load`'s expected wait (fleet-wide token-work over
//! throughput, plus the KV barrier) and `saved` is the prefill the cached
//! prefix spares, in the same seconds-of-work unit, so a long cached prefix
//! on a busy engine and a cold idle engine are compared on one scale.
//! Lowest score wins, among the candidates inside `prefix_affinity`'s
//! bounded-load guard (wait and fleet in-flight requests within `1 + ε` of
//! the mean): a hot prefix spreads to more engines instead of piling onto
//! one. Outside the guard, least_load; when nobody caches anything, the
//! near-tie rule below picks among the least loaded.
//!
//! Work conservation last: an engine with no request in flight takes the
//! request when its first token would come sooner there (its whole
//! prefill against the chosen engine's wait plus the uncached rest). The
//! cache weight spares the requests that queue behind a miss's prefill,
//! and an idle engine has none; without this a cold engine could sit idle
//! while the holders of a hot prefix queue.
//!
//! A worker whose event stream cannot be trusted (no events configured,
//! not connected, a gap not repaired), and every worker for a prompt no
//! tokenizer serves, is scored as `prefix_affinity` would place it: among such workers, the rendezvous choice for the prompt's
//! affinity key is credited with that key's prefix. The fallback is per
//! worker: one engine without events never turns the index off for the rest.
//!
//! Near-ties are settled by the cache, then by the prompt's rendezvous
//! choice, not by a coin: among the candidates scoring within a few times
//! the request's own work of the best, the one caching the most wins, and
//! among equal caches the highest rendezvous weight of the whole prompt's
//! hash. Every replica asked about one request gives
//! the same answer, and different requests arriving together at several
//! replicas spread over the near-equal engines instead of herding onto the
//! single lowest score (which the mesh would only show them after its lag).

use std::sync::Arc;

use super::least_load::{LeastLoadPolicy, Scores};
use super::prefix_affinity::{BLOCK_BYTES, LoadBound, affinity_key, rendezvous_weight};
use super::{Policy, pick};
use crate::config::defaults::{
    CHARS_PER_TOKEN, PRECISE_PREFIX_MAX_PROMPT_BYTES, PRECISE_PREFIX_NEAR_TIE_WORK,
};
use crate::config::{KvEventsConfig, LeastLoadConfig, PrefixAffinityConfig, RoutingConfig};
use crate::fleet::FleetView;
use crate::id_hash::IdMap;
use crate::kv_events::{KvEvents, PromptBlocks};
use crate::request::RequestInfo;
use crate::workers::Worker;

/// The `precise_prefix` policy.
#[derive(Debug)]
pub struct PrecisePrefixPolicy {
    kv: Arc<KvEvents>,
    epsilon: super::knobs::Knobs<f64>,
    cache_weight: super::knobs::Knobs<f64>,
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
            cache_weight: super::knobs::Knobs::new(kv.precise_prefix_cache_weight),
            affinity_blocks: super::knobs::Knobs::new(affinity.prefix_affinity_blocks),
            kv: Arc::new(KvEvents::new(kv)),
            least_load: LeastLoadPolicy::new(least_load),
        }
    }

    /// Cached prefix tokens per candidate, in the unit of the request's
    /// `prompt_tokens` (least_load's work): from the index for trusted
    /// workers (the cached blocks' share of the prompt,
    /// [`PromptBlocks::cached_part`]), by prefix affinity for the others.
    fn cached_tokens(
        &self,
        candidates: &[Arc<Worker>],
        request: &RequestInfo,
        blocks: &PromptBlocks,
    ) -> Vec<u64> {
        let ids: Vec<u64> = candidates.iter().map(|w| w.id()).collect();
        let (mut depth, mut trusted) = (IdMap::default(), Vec::new());
        if blocks.hashes.is_empty() && blocks.tokens == 0 {
            // Not tokenized (no tokenizer serves the model): the index
            // cannot place it, so every worker is placed by affinity.
            trusted.resize(ids.len(), false);
        } else {
            self.kv
                .cached_and_trusted(&blocks.hashes, &ids, &mut depth, &mut trusted);
        }
        let block_size = self.kv.block_size();
        let mut cached: Vec<u64> = ids
            .iter()
            .map(|id| {
                let depth = depth.get(id).copied().unwrap_or(0);
                blocks.cached_part(depth, block_size, request.prompt_tokens)
            })
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
        // A prompt no tokenizer serves has no blocks: it is placed as
        // prefix_affinity would place it, by its opening bytes; a request
        // without text (or engine token ids) has nothing to place by.
        let blocks = match self.kv.prompt_blocks(request) {
            Some(blocks) => blocks,
            None if request.text.is_some() => PromptBlocks::untokenized(request),
            None => return least(),
        };
        let own = unit.of_request(self.least_load.work_of(request));
        let Some(bound) =
            LoadBound::over(&scores.values, &scores.requests, own, self.epsilon.get())
        else {
            return least();
        };
        let cached = self.cached_tokens(candidates, request, &blocks);
        let weight = self.cache_weight.get();
        let admitted: Vec<(usize, f64)> = (0..candidates.len())
            .filter(|&i| bound.admits(scores.values[i], scores.requests[i]))
            .map(|i| (i, scores.values[i] - weight * unit.of_request(cached[i])))
            .filter(|(_, score)| score.is_finite())
            .collect();
        let Some(&(top, top_score)) = admitted.iter().min_by(|a, b| a.1.total_cmp(&b.1)) else {
            return least();
        };
        // Near-equals: every admitted worker scoring within a few times this
        // request's own work of the best (one booking the mesh has not yet
        // carried moves a score by about that much, so a narrower band
        // flips with the replica asked). Among them the one caching the most wins,
        // and among equal caches the prompt's own rendezvous choice: a
        // small change in one replica's load view moves the band's edge,
        // not its answer, so every replica asked about one request names
        // the same worker; and requests arriving together at several
        // replicas (before the mesh carries their bookings) spread by
        // their own hashes instead of all taking the one lowest score.
        let slack = own.max(0.0) * PRECISE_PREFIX_NEAR_TIE_WORK;
        let spread_key = blocks.whole;
        let chosen = admitted
            .iter()
            .filter(|(_, score)| *score <= top_score + slack)
            .max_by_key(|(i, _)| {
                (
                    cached[*i],
                    rendezvous_weight(spread_key, candidates[*i].url_hash()),
                )
            })
            .map_or(top, |(i, _)| *i);
        // Work conservation: the cache weight keeps a request off a cold
        // engine for the sake of the requests that would queue behind its
        // prefill, but an idle engine has nobody behind it. When one would
        // give this request its first token sooner (its whole prefill
        // there against the chosen engine's wait plus the uncached rest),
        // it goes there; else a cold engine could stay idle for a whole
        // run while the others queue (measured on the agentic trace).
        let first_token = |i: usize| {
            scores.values[i] + unit.of_request(request.prompt_tokens.saturating_sub(cached[i]))
        };
        // Equal idle engines go by the prompt's rendezvous weight, so
        // requests arriving together at several replicas spread over them
        // instead of all taking the first in candidate order.
        let idle = admitted
            .iter()
            .map(|&(i, _)| i)
            .filter(|&i| scores.requests[i] == 0)
            .min_by(|&a, &b| {
                first_token(a).total_cmp(&first_token(b)).then_with(|| {
                    let weight = |i: usize| rendezvous_weight(spread_key, candidates[i].url_hash());
                    weight(b).cmp(&weight(a))
                })
            });
        match idle {
            Some(i) if scores.requests[chosen] > 0 && first_token(i) < first_token(chosen) => {
                Some(i)
            }
            _ => Some(chosen),
        }
    }

    fn prompt_text_limit(&self) -> Option<usize> {
        Some(PRECISE_PREFIX_MAX_PROMPT_BYTES)
    }

    fn kv_events(&self) -> Option<Arc<KvEvents>> {
        Some(self.kv.clone())
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        self.epsilon.set(routing.kv_events.precise_prefix_epsilon);
        self.cache_weight
            .set(routing.kv_events.precise_prefix_cache_weight);
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
