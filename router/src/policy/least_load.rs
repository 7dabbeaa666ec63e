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
//!   `--least-load-default-throughput`;
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

use super::pick;
use super::{Policy, signals};
use crate::config::LeastLoadConfig;
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// Highest KV usage fed to `k/(1-k)`, which is infinite at 1.
pub const KV_USAGE_CLAMP: f64 = 0.999;

/// One candidate's score parts, before the fleet-wide terms are known.
#[derive(Debug, Clone, Copy)]
struct Row {
    /// Seconds of queued work (lit), or in-flight tokens (dark).
    wait: f64,
    /// `w * k/(1-k)` for a fresh valid `k`; `None` when it is missing
    /// (charged the imputed barrier).
    barrier: Option<f64>,
    /// Whether the candidate has a fresh snapshot.
    lit: bool,
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
}

impl Scores {
    /// Empty scores with room for `n` candidates.
    pub fn with_capacity(n: usize) -> Self {
        Self {
            values: Vec::with_capacity(n),
            requests: Vec::with_capacity(n),
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

/// The `least_load` policy.
#[derive(Debug, Clone)]
pub struct LeastLoadPolicy {
    config: LeastLoadConfig,
    mean_prompt: Arc<MeanPrompt>,
}

impl LeastLoadPolicy {
    /// A policy with these knobs (validated by the config parsers).
    pub fn new(config: LeastLoadConfig) -> Self {
        let mean_prompt = Arc::new(MeanPrompt::new(
            config.least_load_mean_prefill_tokens as f64,
        ));
        Self {
            config,
            mean_prompt,
        }
    }

    /// The mean prompt size learned from this replica's bookings.
    pub fn mean_prompt_tokens(&self) -> f64 {
        self.mean_prompt.get()
    }

    /// The KV barrier `w * k/(1-k)` for a valid usage `k`.
    pub fn kv_barrier(&self, k: f64) -> f64 {
        let k = k.clamp(0.0, KV_USAGE_CLAMP);
        self.config.least_load_kv_pressure_weight * k / (1.0 - k)
    }

    /// Each candidate's score and in-flight requests into `out` (cleared
    /// first), in candidate order: the score is the expected wait in
    /// seconds, or, when no candidate has a fresh snapshot, its fleet
    /// in-flight requests (join-shortest-queue). Returns the unit the
    /// scores are in, for a caller that compares a request's own size with
    /// them (`prefix_affinity`'s load bound).
    pub fn scores(
        &self,
        candidates: &[Arc<Worker>],
        fleet: &dyn FleetView,
        out: &mut Scores,
    ) -> ScoreUnit {
        out.values.clear();
        out.requests.clear();
        let now = Instant::now();
        let mean_prompt = self.mean_prompt.get();
        let mut rows = Vec::with_capacity(candidates.len());
        let mut lit = 0usize;
        let mut throughput_sum = 0.0;
        let mut hottest: Option<f64> = None;
        for worker in candidates {
            let load = fleet.load(worker, now);
            let k = signals::token_usage(&load);
            if let Some(k) = k {
                hottest = Some(hottest.map_or(k, |h: f64| h.max(k)));
            }
            let barrier = k.map(|k| self.kv_barrier(k));
            out.requests.push(load.counts.requests);
            rows.push(match signals::engine(&load) {
                Some(engine) => {
                    let throughput = self.throughput(signals::throughput(engine));
                    lit += 1;
                    throughput_sum += throughput;
                    let polled_queue = engine
                        .queued_tokens
                        .or_else(|| {
                            signals::waiting(&load).map(|n| (n as f64 * mean_prompt) as u64)
                        })
                        .unwrap_or(0);
                    let work = polled_queue
                        .saturating_add(load.counts.dispatched_since_poll)
                        .max(load.counts.pending_prefill);
                    Row {
                        wait: work as f64 / throughput,
                        barrier,
                        lit: true,
                    }
                }
                None => Row {
                    wait: load.counts.tokens as f64,
                    barrier,
                    lit: false,
                },
            });
        }
        if lit == 0 {
            out.values.extend(out.requests.iter().map(|&n| n as f64));
            return ScoreUnit::Requests;
        }
        let mean_throughput = throughput_sum / lit as f64;
        let imputed = hottest.map_or(0.0, |k| self.kv_barrier(k));
        out.values.extend(rows.iter().map(|row| {
            let wait = if row.lit {
                row.wait
            } else {
                row.wait / mean_throughput
            };
            wait + row.barrier.unwrap_or(imputed)
        }));
        ScoreUnit::Seconds { mean_throughput }
    }

    /// The token-work this policy books for `request` (what
    /// [`Policy::token_work`] returns), without learning from it.
    pub fn work_of(&self, request: &RequestInfo) -> u64 {
        if request.prompt_tokens == 0 {
            self.config
                .least_load_mean_prefill_tokens
                .saturating_add(request.max_output_tokens.unwrap_or(0))
        } else {
            request.token_work()
        }
    }

    /// Throughput used for an engine's reported value.
    fn throughput(&self, reported: Option<f64>) -> f64 {
        reported.unwrap_or(self.config.least_load_default_throughput)
    }
}

impl Policy for LeastLoadPolicy {
    fn name(&self) -> &'static str {
        "least_load"
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
