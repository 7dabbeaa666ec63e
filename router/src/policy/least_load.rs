//! `least_load`: the worker with the least expected wait, in seconds of
//! token-work (after the SGLang gateway's policy of that name).
//!
//! For a candidate with a fresh snapshot:
//!
//! ```text
//! score = (queued_tokens + dispatched_since_poll) / throughput  +  w * k/(1-k)
//! ```
//!
//! where the queue is the live estimate
//!
//! ```text
//! queued_tokens = max(polled_queue + dispatched_since_poll, pending_prefill)
//! ```
//!
//! - `polled_queue`: the engine's uncached waiting-queue tokens (SGLang);
//!   for an engine that reports only a waiting-request count (vLLM,
//!   llama.cpp), that count times the mean prompt this replica books
//!   (learned, starting at `--least-load-mean-prefill-tokens`); else 0;
//! - `dispatched_since_poll`: fleet token-work routed there since that poll.
//!   It grows with every booking, so selections within one poll interval
//!   water-fill, and a fresh poll (which re-marks it) resets the correction;
//! - `pending_prefill`: fleet-wide prompt tokens routed there whose first
//!   byte has not come back yet — requests queued or in prefill, counted
//!   live by every replica (released at the first byte), so it needs no
//!   poll. Without it a poll of an engine that reports no queued tokens
//!   made its whole waiting queue invisible until the next booking; with
//!   SGLang it is a cross-check on a polled figure up to a poll old;
//! - `throughput`: reported `gen_throughput` if finite and > 0, else
//!   `--least-load-default-throughput`; never less than
//!   `--least-load-min-throughput` (engines report their recent decode
//!   rate, which at low load is demand, not capacity);
//! - the KV barrier `w * k/(1-k)`, `k` clamped to [0, 0.999] and
//!   `w = --least-load-kv-pressure-weight`. It degrades per worker: a
//!   candidate without a fresh, valid `k` (a stale snapshot, an endpoint
//!   that reports none, no snapshot at all) is charged the barrier of the
//!   *highest* `k` among the candidates that report one. Imputing the
//!   worst keeps both halves of the intent: a worker that reports nothing
//!   never wins on KV by default (it cannot look colder than any reporting
//!   worker), and one missing reading no longer switches KV protection off
//!   for everyone (a reporting worker at `k` = 0.99 still pays its
//!   barrier). With no `k` anywhere the barrier is 0 for all.
//!
//! A candidate without a fresh snapshot (or with one carrying no signal)
//! scores `counts.tokens / fleet-mean throughput`, the mean being over
//! the candidates that have snapshots (reported-or-default throughput). If
//! no candidate has one, the choice is join-shortest-queue on fleet
//! in-flight requests. Argmin; ties are broken at random.
//!
//! A request without a token estimate (no prompt text could be measured) is
//! booked as `--least-load-mean-prefill-tokens` plus its `max_tokens` (see
//! [`Policy::token_work`]), so it still counts in `dispatched_since_poll`.
//! The score is the wait before the request starts; the request's own size
//! is deliberately not added: it is the same for every candidate, so it
//! cannot change the argmin, and adding it would only blur the score's
//! meaning as an expected wait.

#[cfg(test)]
mod tests;

use std::cell::Cell;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::Instant;

use super::knobs::Knobs;
use super::pick;
use super::{Policy, signals};
use crate::config::{LeastLoadConfig, RoutingConfig};
use crate::fleet::{FleetView, WorkerLoad};
use crate::request::RequestInfo;
use crate::workers::Worker;

/// What a candidate's first-pass score still lacks, fixed once the
/// candidates' shared terms are known.
#[derive(Debug, Clone, Copy)]
enum Missing {
    /// A fresh snapshot without a valid `k`: add the imputed barrier.
    Barrier,
    /// No fresh snapshot: the value is in-flight tokens, to be priced at
    /// the mean throughput, plus the imputed barrier.
    Snapshot,
}

/// What one read of the fleet view gives each candidate, in candidate
/// order ([`LeastLoadPolicy::scores`] fills it), so a policy that bounds
/// loads reads the view once.
#[derive(Debug, Default)]
pub struct Scores {
    /// least_load's score of each candidate, in [`ScoreUnit`]s.
    pub values: Vec<f64>,
    /// Each candidate's fleet in-flight requests (every replica's).
    pub requests: Vec<u64>,
    /// Scratch: the fleet view's read of each candidate.
    loads: Vec<WorkerLoad>,
}

impl Scores {
    /// Empty scores with room for `n` candidates.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            values: Vec::with_capacity(n),
            requests: Vec::with_capacity(n),
            loads: Vec::with_capacity(n),
        }
    }
}

/// Once warmed up, one booked prompt in this many (per I/O thread)
/// updates the mean.
const MEAN_PROMPT_SAMPLE_EVERY: u32 = 8;
/// Weight of a new sample in the mean prompt once warmed up (an EWMA over
/// ~64 samples).
const MEAN_PROMPT_WEIGHT: f64 = 1.0 / 64.0;
/// Samples taken from every booking at the start, averaged plainly.
const MEAN_PROMPT_WARMUP: u32 = 64;

/// Mean prompt size of the requests this replica books, for engines that
/// report waiting requests but no waiting tokens.
///
/// Every replica must reach the same estimate fast, or meshed replicas
/// (each booking 1/N of the traffic) score the same engine differently
/// from each other and from one router: with sampling alone (1 in 8, EWMA
/// 1/64) the estimate's time constant was ~512 bookings, about 40 s for a
/// replica of four at 50 req/s fleet-wide, longer than a benchmark run. So
/// the first [`MEAN_PROMPT_WARMUP`] bookings are all sampled and averaged
/// plainly (the first replaces the configured guess), and only then does
/// the hot path drop to writing the shared value once in
/// [`MEAN_PROMPT_SAMPLE_EVERY`] requests.
#[derive(Debug)]
struct MeanPrompt {
    bits: AtomicU64,
    /// Warm-up samples taken so far (stops at [`MEAN_PROMPT_WARMUP`]).
    warmup: AtomicU32,
}

impl MeanPrompt {
    fn new(initial: f64) -> Self {
        Self {
            bits: AtomicU64::new(initial.to_bits()),
            warmup: AtomicU32::new(0),
        }
    }

    fn get(&self) -> f64 {
        f64::from_bits(self.bits.load(Ordering::Relaxed))
    }

    fn observe(&self, prompt_tokens: u64) {
        thread_local! {
            static TICK: Cell<u32> = const { Cell::new(0) };
        }
        let taken = self.warmup.load(Ordering::Relaxed);
        let weight = if taken < MEAN_PROMPT_WARMUP {
            let n = self.warmup.fetch_add(1, Ordering::Relaxed);
            1.0 / f64::from(n.min(MEAN_PROMPT_WARMUP - 1) + 1)
        } else {
            let due = TICK.with(|tick| {
                let n = tick.get().wrapping_add(1);
                tick.set(n);
                n % MEAN_PROMPT_SAMPLE_EVERY == 0
            });
            if !due {
                return;
            }
            MEAN_PROMPT_WEIGHT
        };
        let old = self.get();
        let new = old + weight * (prompt_tokens as f64 - old);
        // A lost race loses one sample, nothing else.
        self.bits.store(new.to_bits(), Ordering::Relaxed);
    }
}

/// What [`LeastLoadPolicy::scores`] are measured in.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum ScoreUnit {
    /// Expected wait in seconds; a token of work costs
    /// `1 / mean_throughput` of them.
    Seconds {
        /// Mean tokens/s over the candidates with snapshots.
        mean_throughput: f64,
    },
    /// Fleet in-flight requests (no candidate had a snapshot).
    Requests,
}

impl ScoreUnit {
    /// What one request of `token_work` tokens adds to a score.
    pub fn of_request(self, token_work: u64) -> f64 {
        match self {
            ScoreUnit::Seconds { mean_throughput } => token_work as f64 / mean_throughput,
            ScoreUnit::Requests => 1.0,
        }
    }
}

/// The knobs of `least_load`, with what is derived from them.
#[derive(Debug, Clone, Copy)]
struct LeastLoadKnobs {
    config: LeastLoadConfig,
    /// `1 / --least-load-default-throughput`, for engines that report none.
    default_secs_per_token: f64,
    /// `1 / --least-load-min-throughput` (infinite when 0): the most a
    /// token of work may cost on any engine.
    max_secs_per_token: f64,
}

impl LeastLoadKnobs {
    fn of(config: LeastLoadConfig) -> Self {
        Self {
            config,
            default_secs_per_token: 1.0 / config.least_load_default_throughput,
            max_secs_per_token: 1.0 / config.least_load_min_throughput,
        }
    }
}

/// The `least_load` policy.
#[derive(Debug, Clone)]
pub struct LeastLoadPolicy {
    knobs: Arc<Knobs<LeastLoadKnobs>>,
    mean_prompt: Arc<MeanPrompt>,
}

impl LeastLoadPolicy {
    /// A policy with these knobs (validated by the config parsers).
    pub fn new(config: LeastLoadConfig) -> Self {
        let mean_prompt = Arc::new(MeanPrompt::new(
            config.least_load_mean_prefill_tokens as f64,
        ));
        Self {
            knobs: Arc::new(Knobs::new(LeastLoadKnobs::of(config))),
            mean_prompt,
        }
    }

    /// Takes new knobs (a reload); what it learned stays.
    pub fn set_config(&self, config: LeastLoadConfig) {
        self.knobs.set(LeastLoadKnobs::of(config));
    }

    /// The mean prompt size learned from this replica's bookings.
    pub fn mean_prompt_tokens(&self) -> f64 {
        self.mean_prompt.get()
    }

    /// The KV barrier `w * k/(1-k)` for a valid usage `k`.
    pub fn kv_barrier(&self, k: f64) -> f64 {
        self.knobs.get().config.least_load_kv_pressure_weight * shoal_proto::figures::kv_odds(k)
    }

    /// Each candidate's score and in-flight requests into `out` (cleared
    /// first), in candidate order: the score is the expected wait in
    /// seconds, or, when no candidate has a fresh snapshot, its fleet
    /// in-flight requests (join-shortest-queue). Returns the unit the
    /// scores are in, for a caller that compares a request's own size with
    /// them (`prefix_affinity`'s load bound).
    ///
    /// One pass over the fleet view, with no division per candidate (the
    /// snapshot's [`shoal_proto::LoadFigures`] were derived when it was
    /// stored); candidates missing a term (no `k`, no snapshot) are noted
    /// and completed after it, which in a fully polled fleet costs nothing.
    pub fn scores(
        &self,
        candidates: &[Arc<Worker>],
        fleet: &dyn FleetView,
        out: &mut Scores,
    ) -> ScoreUnit {
        out.values.clear();
        out.requests.clear();
        let at = fleet.moment(Instant::now());
        let mean_prompt = self.mean_prompt.get();
        let knobs = self.knobs.get();
        let weight = knobs.config.least_load_kv_pressure_weight;
        // Allocates only if some candidate lacks a term.
        let mut missing: Vec<(usize, Missing)> = Vec::new();
        let mut lit = 0usize;
        let mut throughput_sum = 0.0;
        let mut hottest: Option<f64> = None;
        out.loads.clear();
        fleet.load_all(candidates, &at, &mut out.loads);
        for (i, load) in out.loads.iter().enumerate() {
            out.requests.push(load.counts.requests);
            let odds = load.figures.kv_odds;
            if let Some(odds) = odds {
                hottest = Some(hottest.map_or(odds, |h: f64| h.max(odds)));
            }
            let Some(engine) = signals::engine(load) else {
                missing.push((i, Missing::Snapshot));
                out.values.push(load.counts.tokens as f64);
                continue;
            };
            let (throughput, secs_per_token) =
                match (load.figures.secs_per_token, signals::throughput(engine)) {
                    (Some(secs), Some(throughput)) => (
                        throughput.max(knobs.config.least_load_min_throughput),
                        secs.min(knobs.max_secs_per_token),
                    ),
                    _ => (
                        knobs.config.least_load_default_throughput,
                        knobs.default_secs_per_token,
                    ),
                };
            lit += 1;
            throughput_sum += throughput;
            let polled_queue = engine
                .queued_tokens
                .or_else(|| signals::waiting(load).map(|n| (n as f64 * mean_prompt) as u64))
                .unwrap_or(0);
            let work = polled_queue
                .saturating_add(load.counts.dispatched_since_poll)
                .max(load.counts.pending_prefill);
            let wait = work as f64 * secs_per_token;
            out.values.push(match odds {
                Some(odds) => wait + weight * odds,
                None => {
                    missing.push((i, Missing::Barrier));
                    wait
                }
            });
        }
        if lit == 0 {
            out.values.clear();
            out.values.extend(out.requests.iter().map(|&n| n as f64));
            return ScoreUnit::Requests;
        }
        let mean_throughput = throughput_sum / lit as f64;
        let secs_per_mean_token = 1.0 / mean_throughput;
        let imputed = hottest.map_or(0.0, |odds| weight * odds);
        for (i, term) in missing {
            let value = &mut out.values[i];
            *value = match term {
                Missing::Barrier => *value + imputed,
                Missing::Snapshot => *value * secs_per_mean_token + imputed,
            };
        }
        ScoreUnit::Seconds { mean_throughput }
    }

    /// The token-work this policy books for `request` (what
    /// [`Policy::token_work`] returns), without learning from it.
    pub fn work_of(&self, request: &RequestInfo) -> u64 {
        if request.prompt_tokens == 0 {
            self.knobs
                .get()
                .config
                .least_load_mean_prefill_tokens
                .saturating_add(request.max_output_tokens.unwrap_or(0))
        } else {
            request.token_work()
        }
    }
}

impl Policy for LeastLoadPolicy {
    fn name(&self) -> &'static str {
        "least_load"
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        self.set_config(routing.least_load);
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        _: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize> {
        let mut scores = Scores::with_capacity(candidates.len());
        self.scores(candidates, fleet, &mut scores);
        pick::argmin(&scores.values, pick::seed())
    }

    fn token_work(&self, request: &RequestInfo) -> u64 {
        if request.prompt_tokens > 0 {
            self.mean_prompt.observe(request.prompt_tokens);
        }
        self.work_of(request)
    }
}
