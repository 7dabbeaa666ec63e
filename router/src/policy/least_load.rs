//! `least_load`: the worker with the least expected wait, in seconds of
//! token-work (after the SGLang gateway's policy of that name).
//!
//! For a candidate with a fresh snapshot:
//!
//! ```text
//! score = (queued_tokens + dispatched_since_poll) / throughput  +  w * k/(1-k)
//! ```
//!
//! - `queued_tokens`: the engine's uncached waiting-queue tokens (missing -> 0);
//! - `dispatched_since_poll`: fleet token-work routed there since that poll.
//!   It grows with every booking, so selections within one poll interval
//!   water-fill, and a fresh poll (which re-marks it) resets the correction;
//! - `throughput`: reported `gen_throughput` if finite and > 0, else
//!   `--least-load-default-throughput`;
//! - the KV barrier `w * k/(1-k)`, `k` clamped to [0, 0.999] and
//!   `w = --least-load-kv-pressure-weight`, is added only when *every*
//!   candidate has a fresh, valid `k`; otherwise it is left out for all of
//!   them (a worker that reports nothing must not win by default).
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

use std::sync::Arc;
use std::time::Instant;

use super::pick::{self, MinPick};
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
    /// `w * k/(1-k)`, or 0 when `k` is missing.
    barrier: f64,
    /// Whether the candidate has a fresh snapshot.
    lit: bool,
    requests: u64,
}

/// The `least_load` policy.
#[derive(Debug, Clone)]
pub struct LeastLoadPolicy {
    config: LeastLoadConfig,
}

impl LeastLoadPolicy {
    /// A policy with these knobs (validated by the config parsers).
    pub fn new(config: LeastLoadConfig) -> Self {
        Self { config }
    }

    /// The KV barrier `w * k/(1-k)` for a valid usage `k`.
    pub fn kv_barrier(&self, k: f64) -> f64 {
        let k = k.clamp(0.0, KV_USAGE_CLAMP);
        self.config.least_load_kv_pressure_weight * k / (1.0 - k)
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
        let now = Instant::now();
        let seed = pick::seed();
        let mut rows = Vec::with_capacity(candidates.len());
        let mut lit = 0usize;
        let mut throughput_sum = 0.0;
        let mut kv_everywhere = true;
        for worker in candidates {
            let load = fleet.load(worker, now);
            let k = signals::token_usage(&load);
            kv_everywhere &= k.is_some();
            let barrier = k.map_or(0.0, |k| self.kv_barrier(k));
            let requests = load.counts.requests;
            rows.push(match signals::engine(&load) {
                Some(engine) => {
                    let throughput = self.throughput(signals::throughput(engine));
                    lit += 1;
                    throughput_sum += throughput;
                    let work = engine
                        .queued_tokens
                        .unwrap_or(0)
                        .saturating_add(load.counts.dispatched_since_poll);
                    Row {
                        wait: work as f64 / throughput,
                        barrier,
                        lit: true,
                        requests,
                    }
                }
                None => Row {
                    wait: load.counts.tokens as f64,
                    barrier,
                    lit: false,
                    requests,
                },
            });
        }
        if lit == 0 {
            let mut jsq = MinPick::new(seed);
            for (i, row) in rows.iter().enumerate() {
                jsq.offer(row.requests, i);
            }
            return jsq.index();
        }
        let mean_throughput = throughput_sum / lit as f64;
        let mut best = MinPick::new(seed);
        for (i, row) in rows.iter().enumerate() {
            let wait = if row.lit {
                row.wait
            } else {
                row.wait / mean_throughput
            };
            let barrier = if kv_everywhere { row.barrier } else { 0.0 };
            best.offer(wait + barrier, i);
        }
        best.index()
    }

    fn token_work(&self, request: &RequestInfo) -> u64 {
        if request.prompt_tokens == 0 {
            self.config
                .least_load_mean_prefill_tokens
                .saturating_add(request.max_output_tokens.unwrap_or(0))
        } else {
            request.token_work()
        }
    }
}
