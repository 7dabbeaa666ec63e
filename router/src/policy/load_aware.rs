//! `load_aware`: llm-d's queue scorer. Each candidate scores
//!
//! ```text
//! waiting = 0          -> 0.5
//! waiting >= threshold -> 0
//! otherwise            -> 0.5 * (1 - waiting / threshold)
//! ```
//!
//! from its engine's waiting-queue length (`--load-aware-threshold`, 128),
//! and the highest score wins. A candidate without a fresh waiting count
//! scores 0: unknown is never treated as idle. Equal scores (common: queue
//! lengths are integers and idle engines all score 0.5) go to the fewest
//! fleet in-flight requests, then at random; that tie-break is what lets a
//! burst between two polls spread instead of herding onto one engine.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::pick::{self, MinPick};
use super::{Policy, signals};
use crate::config::RoutingConfig;
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// The llm-d queue score of a worker with `waiting` queued requests.
/// `threshold` must be > 0 (the `--load-aware-threshold` parser ensures it;
/// 0 is treated as 1).
pub fn queue_score(waiting: u64, threshold: u64) -> f64 {
    let threshold = threshold.max(1);
    if waiting >= threshold {
        0.0
    } else {
        0.5 * (1.0 - waiting as f64 / threshold as f64)
    }
}

/// The `load_aware` policy.
#[derive(Debug)]
pub struct LoadAwarePolicy {
    threshold: AtomicU64,
}

impl LoadAwarePolicy {
    /// A policy scoring queues against `threshold` (> 0).
    pub fn new(threshold: u64) -> Self {
        Self {
            threshold: AtomicU64::new(threshold.max(1)),
        }
    }
}

impl Policy for LoadAwarePolicy {
    fn name(&self) -> &'static str {
        "load_aware"
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        _: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize> {
        let now = fleet.moment(Instant::now());
        let threshold = self.threshold.load(Ordering::Relaxed);
        let mut best = MinPick::new(pick::seed());
        for (i, worker) in candidates.iter().enumerate() {
            let load = fleet.load(worker, &now);
            let score = signals::waiting(&load).map_or(0.0, |w| queue_score(w, threshold));
            best.offer((-score, load.counts.requests), i);
        }
        best.index()
    }

    fn reconfigure(&self, routing: &RoutingConfig) {
        let threshold = routing.load_aware.load_aware_threshold.max(1);
        self.threshold.store(threshold, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testkit::*;

    #[test]
    fn score_is_piecewise_linear() {
        assert_eq!(queue_score(0, 128), 0.5);
        assert_eq!(queue_score(32, 128), 0.375);
        assert_eq!(queue_score(64, 128), 0.25);
        assert_eq!(queue_score(127, 128), 0.5 * (1.0 - 127.0 / 128.0));
        assert_eq!(queue_score(128, 128), 0.0);
        assert_eq!(queue_score(10_000, 128), 0.0);
        assert_eq!(
            queue_score(0, 0),
            0.5,
            "a zero threshold cannot divide by zero"
        );
        assert_eq!(queue_score(1, 1), 0.0);
    }

    #[test]
    fn threshold_is_validated_at_start_up() {
        for bad in ["0", "-1", "nan", "1.5"] {
            let flag = format!("--load-aware-threshold={bad}");
            let err = crate::config::Config::load_from(["shoal", flag.as_str()])
                .unwrap_err()
                .to_string();
            assert!(err.contains("--load-aware-threshold"), "{bad}: {err}");
        }
        let config =
            crate::config::Config::load_from(["shoal", "--load-aware-threshold", "4"]).unwrap();
        assert_eq!(config.routing.load_aware.load_aware_threshold, 4);
    }

    #[test]
    fn shortest_queue_wins_and_unknown_is_not_idle() {
        let workers = workers(3);
        set_load(&workers[0], engine().waiting(40));
        set_load(&workers[1], engine().waiting(3));
        // workers[2] has no snapshot: scores 0, below any known queue.
        let policy = LoadAwarePolicy::new(128);
        assert_eq!(pick_n(&policy, &workers, &plain(), 20), [0, 20, 0]);
        // Past the threshold a queue scores like an unknown one; then the
        // fleet in-flight count decides.
        set_load(&workers[0], engine().waiting(500));
        set_load(&workers[1], engine().waiting(200));
        let _busy = book(&workers[0], 2, 10);
        let _lighter = book(&workers[1], 1, 10);
        assert_eq!(pick_n(&policy, &workers, &plain(), 20), [0, 0, 20]);
    }

    #[test]
    fn equal_queues_water_fill_by_in_flight_requests() {
        let workers = workers(4);
        for w in &workers {
            set_load(w, engine().waiting(0));
        }
        let policy = LoadAwarePolicy::new(128);
        let fleet = fleet();
        let mut bookings = Vec::new();
        for _ in 0..8 {
            let i = policy.select(&workers, &plain(), &fleet).unwrap();
            bookings.push(book(&workers[i], 1, 10));
        }
        let spread: Vec<u64> = workers
            .iter()
            .map(|w| w.ledger().counts().requests)
            .collect();
        assert_eq!(spread, [2, 2, 2, 2]);
    }
}
