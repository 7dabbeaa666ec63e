//! `prefix_affinity`: send prompts that share a prefix to the same worker
//! on every replica, but never past a bound on that worker's load.
//!
//! `cache_aware` learns where prefixes are cached from the prompts *this*
//! replica routed, so behind a Service each replica knows 1/N of them, and
//! with full information it piles a hot prefix onto one engine until a
//! count guard trips. This policy needs no memory of placements, so every
//! replica reaches the same decision from the same fleet view:
//!
//! 1. **Key.** The prompt's first `--prefix-affinity-blocks` 64-byte
//!    blocks, hashed ([`affinity_key`]). A prompt shorter than that has no
//!    key: its prefill is cheap, and it is routed by least_load alone.
//! 2. **Evidence of sharing.** A key the fleet has not seen recently (a
//!    small direct-mapped table of recent keys, [`Sightings`], fed by this
//!    replica's prompts and its peers' over the mesh) is routed by
//!    least_load alone: a unique prompt gains nothing from affinity, so it
//!    should get the least wait. The second request with the same key has
//!    affinity, on whichever replica it arrives.
//! 3. **Bounded loads** (Mirrokni, Thorup and Zadimoghaddam, "Consistent
//!    Hashing with Bounded Loads"), on two loads read from the fleet view,
//!    `ε = --prefix-affinity-epsilon` for both. A candidate is eligible
//!    while
//!    - its least_load score (the expected wait in seconds from
//!      fleet-wide token-work and the polled engine queue, plus the KV
//!      barrier) is `≤ (1 + ε) × the mean score + the request's own work`,
//!      and
//!    - its fleet in-flight requests are below MTZ's capacity
//!      `⌈(1 + ε) × (m + 1) / n⌉` (`m` in flight over `n` candidates).
//!
//!    The wait alone is not enough: a prefix that hits the cache is cheap
//!    to prefill, so its home's queue stays short while its running set
//!    (and KV) grows with every request it keeps; the count is live on
//!    every replica (booked and released through the mesh), while KV moves
//!    only at polls. If no candidate passes both, least_load's choice.
//! 4. **Rendezvous.** Among the eligible candidates, the one with the
//!    highest `weight(key, worker URL)` ([`rendezvous_weight`]). A hot
//!    prefix overflows from its first choice to its second, then third (in
//!    an order fixed by the key, the same on every replica), so it ends up
//!    cached on as many engines as its load needs; different prefixes
//!    overflow to different engines, so nothing herds onto one "coldest"
//!    worker. Removing a worker moves only the prefixes it held.
//!
//! The mesh carries no prompt text: replicas agree because the key is a
//! pure function of the prompt and the bound reads the fleet view every
//! replica shares. The recent-keys table, which decides only whether a key
//! is shared at all, is kept fleet-wide by sending each key seen for the
//! first time (8 bytes, the hash above) to the peers: kept per replica, a
//! prefix went without affinity once per replica instead of once.

#[cfg(test)]
mod tests;

use std::sync::Arc;

use super::Policy;
use super::knobs::Knobs;
use super::least_load::{LeastLoadPolicy, Scores};
use super::pick;
use super::sightings::Sightings;
use crate::config::{LeastLoadConfig, PrefixAffinityConfig, RoutingConfig};
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// Bytes per block of the affinity key (the engines' and the mock's
/// prefix-cache granularity in characters of text).
pub const BLOCK_BYTES: usize = 64;

/// splitmix64's finaliser: a well-mixed 64-bit value from a weak one.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The affinity key of `text`: a hash of its first `blocks` × 64 bytes, or
/// `None` when it is shorter. Written out word by word (no standard hasher)
/// so every replica and every build computes the same key; a test pins a
/// known answer.
pub fn affinity_key(text: &[u8], blocks: usize) -> Option<u64> {
    let head = text.get(..blocks.checked_mul(BLOCK_BYTES)?)?;
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for word in head.chunks_exact(8) {
        let mut bytes = [0u8; 8];
        bytes.copy_from_slice(word);
        h = (h.rotate_left(23) ^ u64::from_le_bytes(bytes)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
    Some(mix(h))
}

/// The rendezvous weight of the worker whose URL hashes to `url_hash` for
/// prompts with `key`: the highest eligible weight wins.
pub fn rendezvous_weight(key: u64, url_hash: u64) -> u64 {
    mix(key.wrapping_add(url_hash.wrapping_mul(0x9e37_79b9_7f4a_7c15)))
}

/// The bounded-loads capacity of one selection: a candidate may take the
/// request while both its expected wait and its in-flight requests stay
/// within `1 + ε` of the candidates' mean.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct LoadBound {
    /// Highest admissible least_load score: `(1 + ε) × mean + own work`.
    wait: f64,
    /// Mirrokni–Thorup–Zadimoghaddam's capacity in requests,
    /// `⌈(1 + ε) × (m + 1) / n⌉` for `m` fleet in-flight requests over `n`
    /// candidates (the `+ 1` is this request): a candidate with fewer
    /// in-flight requests than this is admitted.
    requests: u64,
}

impl LoadBound {
    /// The bound over the candidates' least_load `scores` and fleet
    /// in-flight `requests` for a request whose own work is `own` (in the
    /// scores' unit); `None` when no score is finite.
    pub(super) fn over(scores: &[f64], requests: &[u64], own: f64, epsilon: f64) -> Option<Self> {
        let finite = scores.iter().filter(|s| s.is_finite());
        let (sum, n) = finite.fold((0.0, 0usize), |(sum, n), s| (sum + s, n + 1));
        if n == 0 {
            return None;
        }
        let in_flight: u64 = requests.iter().sum();
        let per_candidate = (in_flight as f64 + 1.0) / requests.len() as f64;
        Some(Self {
            wait: (1.0 + epsilon) * (sum / n as f64) + own,
            requests: ((1.0 + epsilon) * per_candidate).ceil() as u64,
        })
    }

    /// Whether a candidate with this score and in-flight count may take
    /// the request.
    pub(super) fn admits(&self, wait: f64, requests: u64) -> bool {
        wait <= self.wait && requests < self.requests
    }
}

/// The `prefix_affinity` policy.
#[derive(Debug)]
pub struct PrefixAffinityPolicy {
    config: Knobs<PrefixAffinityConfig>,
    least_load: LeastLoadPolicy,
    recent: Arc<Sightings>,
}

impl PrefixAffinityPolicy {
    /// A policy with these knobs; its wait is least_load's with `least_load`.
    pub fn new(config: PrefixAffinityConfig, least_load: LeastLoadConfig) -> Self {
        Self {
            config: Knobs::new(config),
            least_load: LeastLoadPolicy::new(least_load),
            recent: Arc::default(),
        }
    }

    /// The key of `request` if it has one and has been seen before.
    fn shared_key(&self, request: &RequestInfo) -> Option<u64> {
        let text = request.text.as_deref()?.as_bytes();
        let key = affinity_key(text, self.config.get().prefix_affinity_blocks)?;
        self.recent.seen_before(key).then_some(key)
    }
}

impl Policy for PrefixAffinityPolicy {
    fn name(&self) -> &'static str {
        "prefix_affinity"
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
        let Some(key) = self.shared_key(request) else {
            return least();
        };
        let own = unit.of_request(self.least_load.work_of(request));
        let epsilon = self.config.get().prefix_affinity_epsilon;
        let Some(bound) = LoadBound::over(&scores.values, &scores.requests, own, epsilon) else {
            return least();
        };
        let mut best: Option<(u64, usize)> = None;
        let loads = scores.values.iter().zip(&scores.requests);
        for (i, (worker, (&wait, &requests))) in candidates.iter().zip(loads).enumerate() {
            if bound.admits(wait, requests) {
                let weight = rendezvous_weight(key, worker.url_hash());
                if best.is_none_or(|(top, _)| weight > top) {
                    best = Some((weight, i));
                }
            }
        }
        best.map(|(_, i)| i).or_else(least)
    }

    fn prompt_text_limit(&self) -> Option<usize> {
        // The key reads only its blocks.
        Some(
            self.config
                .get()
                .prefix_affinity_blocks
                .saturating_mul(BLOCK_BYTES),
        )
    }

    fn sightings(&self) -> Option<Arc<Sightings>> {
        Some(self.recent.clone())
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        self.config.set(routing.prefix_affinity);
        self.least_load.set_config(routing.least_load);
    }

    fn token_work(&self, request: &RequestInfo) -> u64 {
        self.least_load.token_work(request)
    }
}
