//! Seeded open-loop workloads for the fleet benchmark and the capacity
//! calibration that sizes their arrival rate.
//!
//! Every scenario of one run replays the same [`Arrival`] list (same seed),
//! so the only thing that differs between scenarios is the routing.

use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Exp};
use serde::Serialize;

use super::trace::text::BlockText;
use crate::mock::EngineConfig;
use crate::workload::text;

/// Prompt characters per token: the mock engines count `ceil(chars / 4)`
/// tokens ([`crate::mock::prompt_tokens_for`]), so a prompt meant to be `n`
/// tokens is `CHARS_PER_TOKEN × n` characters.
pub const CHARS_PER_TOKEN: usize = 4;

/// Which traffic a scenario sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum WorkloadKind {
    /// Unique prompts: four fifths ~200 tokens, one fifth ~6,000 tokens;
    /// outputs uniform in 50..=500 tokens.
    SizeSkewed,
    /// Prompts made of one of `4 × engines` shared prefixes (four fifths
    /// ~800 tokens, one fifth ~4,000) plus a unique 30..=120-token
    /// question; outputs uniform in 50..=500 tokens.
    SharedPrefix,
}

impl WorkloadKind {
    /// Short name used in tables and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadKind::SizeSkewed => "size_skewed",
            WorkloadKind::SharedPrefix => "shared_prefix",
        }
    }
}

/// Output tokens are uniform in this range for both workloads.
pub const OUTPUT_TOKENS: (u64, u64) = (50, 500);
/// Size-skewed prompts: share of large ones and the two typical sizes.
pub const LARGE_SHARE: f64 = 0.2;
/// Typical small and large prompt, tokens (each jittered by ±20 % / ±10 %).
pub const SKEWED_PROMPT_TOKENS: (u64, u64) = (200, 6_000);
/// Shared-prefix workload: typical small and large prefix, tokens.
pub const PREFIX_TOKENS: (u64, u64) = (800, 4_000);
/// Shared-prefix workload: the unique question after the prefix, tokens.
pub const SUFFIX_TOKENS: (u64, u64) = (30, 120);
/// Share of a shared prefix assumed cached when calibrating its capacity.
pub const ASSUMED_PREFIX_HIT: f64 = 0.9;

/// One request of the schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Arrival {
    /// When to send it, from the start of the load.
    pub at: Duration,
    /// Shared prefix group (shared-prefix workload only).
    pub group: Option<usize>,
    /// Prefix block ids (trace replays only; [`Schedule::blocks`] says how
    /// long a block is).
    pub blocks: Option<Arc<[u64]>>,
    /// Seed of the request's unique text.
    pub seed: u64,
    /// Prompt tokens (the ceil(chars / 4) rule; the prompt is
    /// [`CHARS_PER_TOKEN`] × this chars).
    pub prompt_tokens: u64,
    /// Output tokens asked for (`max_tokens`).
    pub max_tokens: u64,
}

/// A generated or replayed schedule and the prefix texts it refers to.
#[derive(Debug, Clone)]
pub struct Schedule {
    /// Workload name in tables and JSON ([`WorkloadKind::as_str`], or
    /// `trace:<name>` for a replayed trace).
    pub workload: String,
    /// Offered rate, requests per wall second.
    pub rate: f64,
    /// The seed it was generated from (results are grouped by it).
    pub seed: u64,
    /// The requests in arrival order.
    pub arrivals: Vec<Arrival>,
    /// Shared prefixes (empty for the size-skewed workload and traces).
    pub prefixes: Vec<String>,
    /// Block text of a trace replay (`None` for generated workloads).
    pub blocks: Option<BlockText>,
}

impl Schedule {
    /// Poisson arrivals at `rate` per second for `duration` (at most
    /// `max_requests`), sizes drawn from `kind`'s mix, all from `seed`.
    pub fn generate(
        kind: WorkloadKind,
        rate: f64,
        duration: Duration,
        max_requests: usize,
        engines: usize,
        seed: u64,
    ) -> Self {
        let mut rng = StdRng::seed_from_u64(seed);
        let groups = 4 * engines.max(1);
        let prefixes: Vec<String> = match kind {
            WorkloadKind::SizeSkewed => Vec::new(),
            WorkloadKind::SharedPrefix => (0..groups)
                .map(|g| {
                    let base = if g % 5 == 0 {
                        PREFIX_TOKENS.1
                    } else {
                        PREFIX_TOKENS.0
                    };
                    let tokens = jitter(&mut rng, base, 0.1);
                    // A seed space disjoint from requests.
                    text(u64::MAX - g as u64, CHARS_PER_TOKEN * tokens as usize)
                })
                .collect(),
        };
        let gap = Exp::new(rate.max(1e-6)).ok();
        let mut at = 0.0f64;
        let mut arrivals = Vec::new();
        while arrivals.len() < max_requests {
            at += gap.map_or(1.0, |g| g.sample(&mut rng));
            if at >= duration.as_secs_f64() {
                break;
            }
            let max_tokens = rng.random_range(OUTPUT_TOKENS.0..=OUTPUT_TOKENS.1);
            let seed = rng.random::<u64>() >> 1;
            let (group, prompt_tokens) = match kind {
                WorkloadKind::SizeSkewed => {
                    let tokens = if rng.random_bool(LARGE_SHARE) {
                        jitter(&mut rng, SKEWED_PROMPT_TOKENS.1, 0.1)
                    } else {
                        jitter(&mut rng, SKEWED_PROMPT_TOKENS.0, 0.2)
                    };
                    (None, tokens)
                }
                WorkloadKind::SharedPrefix => {
                    let g = rng.random_range(0..groups);
                    let suffix = rng.random_range(SUFFIX_TOKENS.0..=SUFFIX_TOKENS.1);
                    let prefix = (prefixes[g].len() / CHARS_PER_TOKEN) as u64;
                    (Some(g), prefix + suffix)
                }
            };
            arrivals.push(Arrival {
                at: Duration::from_secs_f64(at),
                group,
                blocks: None,
                seed,
                prompt_tokens,
                max_tokens,
            });
        }
        Self {
            workload: kind.as_str().to_string(),
            rate,
            seed,
            arrivals,
            prefixes,
            blocks: None,
        }
    }

    /// The prompt text of `a`, [`CHARS_PER_TOKEN`] characters per token:
    /// its blocks' text (trace replays), or its prefix (if any) and unique
    /// text.
    pub fn prompt(&self, a: &Arrival) -> String {
        let chars = CHARS_PER_TOKEN * a.prompt_tokens as usize;
        if let (Some(ids), Some(blocks)) = (&a.blocks, &self.blocks) {
            return blocks.prompt(ids, chars, a.seed);
        }
        match a.group.and_then(|g| self.prefixes.get(g)) {
            Some(prefix) => {
                let rest = chars.saturating_sub(prefix.len());
                let mut s = String::with_capacity(prefix.len() + rest);
                s.push_str(prefix);
                s.push_str(&text(a.seed, rest));
                s
            }
            None => text(a.seed, chars),
        }
    }
}

fn jitter(rng: &mut StdRng, base: u64, frac: f64) -> u64 {
    let f = rng.random_range((1.0 - frac)..=(1.0 + frac));
    ((base as f64 * f).round() as u64).max(1)
}

/// Mean sizes of a workload, tokens: (prompt, uncached prompt, output).
pub fn mean_sizes(kind: WorkloadKind) -> (f64, f64, f64) {
    let output = (OUTPUT_TOKENS.0 + OUTPUT_TOKENS.1) as f64 / 2.0;
    match kind {
        WorkloadKind::SizeSkewed => {
            let p = (1.0 - LARGE_SHARE) * SKEWED_PROMPT_TOKENS.0 as f64
                + LARGE_SHARE * SKEWED_PROMPT_TOKENS.1 as f64;
            (p, p, output)
        }
        WorkloadKind::SharedPrefix => {
            let prefix =
                (1.0 - LARGE_SHARE) * PREFIX_TOKENS.0 as f64 + LARGE_SHARE * PREFIX_TOKENS.1 as f64;
            let suffix = (SUFFIX_TOKENS.0 + SUFFIX_TOKENS.1) as f64 / 2.0;
            (
                prefix + suffix,
                suffix + (1.0 - ASSUMED_PREFIX_HIT) * prefix,
                output,
            )
        }
    }
}

/// Sustainable requests per *model* second of one engine for a workload of
/// mean prompt `p`, uncached prompt `u` and output `o` tokens, keeping the
/// KV cache at most `kv_target` full.
///
/// In steady state `B` requests run; each holds about `p + o/2` KV tokens,
/// so `B = min(max_running, kv_target × capacity / (p + o/2))`. A second of
/// model time is spent in `S` decode steps of `base + per_req × B` ms each
/// plus `λ × u / prefill_tps` of prefill, and the steps emit `S × B = λ × o`
/// tokens. Solving gives `λ = B / (o × (base + per_req × B) / 1000 + B × u /
/// prefill_tps)`.
pub fn engine_capacity(cfg: &EngineConfig, p: f64, u: f64, o: f64, kv_target: f64) -> f64 {
    let kv_bound = kv_target * cfg.kv_capacity_tokens as f64 / (p + o / 2.0).max(1.0);
    let b = kv_bound.min(cfg.max_running as f64).max(1.0);
    let step_s = (cfg.decode_base_ms + cfg.decode_per_req_ms * b) / 1000.0;
    b / (o * step_s + b * u / cfg.prefill_tps)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_schedule_and_sizes_follow_the_mix() {
        let d = Duration::from_secs(100);
        let a = Schedule::generate(WorkloadKind::SizeSkewed, 20.0, d, 10_000, 4, 7);
        let b = Schedule::generate(WorkloadKind::SizeSkewed, 20.0, d, 10_000, 4, 7);
        assert_eq!(a.arrivals, b.arrivals);
        let n = a.arrivals.len();
        assert!((1_800..2_200).contains(&n), "{n} arrivals");
        let large = a
            .arrivals
            .iter()
            .filter(|x| x.prompt_tokens > 1_000)
            .count();
        let share = large as f64 / n as f64;
        assert!((0.15..0.25).contains(&share), "{share}");
        assert!(
            a.arrivals
                .iter()
                .all(|x| (50..=500).contains(&x.max_tokens))
        );
        let first = &a.arrivals[0];
        assert_eq!(a.prompt(first).len() as u64, 4 * first.prompt_tokens);
    }

    #[test]
    fn shared_prefix_prompts_start_with_their_group_prefix() {
        let d = Duration::from_secs(10);
        let s = Schedule::generate(WorkloadKind::SharedPrefix, 20.0, d, 50, 2, 1);
        assert_eq!(s.prefixes.len(), 8);
        for a in &s.arrivals {
            let g = a.group.unwrap_or(usize::MAX);
            let p = s.prompt(a);
            assert!(p.starts_with(&s.prefixes[g]));
            assert_eq!(p.len() as u64, 4 * a.prompt_tokens);
        }
    }

    #[test]
    fn capacity_of_the_default_engine_is_a_few_requests_per_second() {
        let cfg = EngineConfig::default();
        let (p, u, o) = mean_sizes(WorkloadKind::SizeSkewed);
        let c = engine_capacity(&cfg, p, u, o, 0.9);
        assert!((3.0..4.5).contains(&c), "{c}");
    }
}
