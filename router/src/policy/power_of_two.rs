//! `power_of_two`: sample two distinct candidates at random and take the
//! less loaded. "Less loaded" compares, in order, each signal both workers
//! have: KV usage `k` from a fresh snapshot, then the engine's waiting
//! queue, then fleet in-flight requests; the first signal that differs
//! decides. A signal missing (or invalid) on either side is skipped, so a
//! worker that reports nothing never wins by default. Equal on everything:
//! either of the two, at random.

use std::sync::Arc;
use std::time::Instant;

use rand::Rng;

use super::{Policy, signals};
use crate::fleet::{FleetView, WorkerLoad};
use crate::request::RequestInfo;
use crate::workers::Worker;

/// The `power_of_two` policy.
#[derive(Debug, Clone, Copy, Default)]
pub struct PowerOfTwoPolicy;

/// Whether `a` is strictly less loaded than `b`, `None` if they are equal
/// on every signal both have.
fn lighter(a: &WorkerLoad, b: &WorkerLoad) -> Option<bool> {
    if let (Some(ka), Some(kb)) = (signals::token_usage(a), signals::token_usage(b))
        && ka != kb
    {
        return Some(ka < kb);
    }
    if let (Some(wa), Some(wb)) = (signals::waiting(a), signals::waiting(b))
        && wa != wb
    {
        return Some(wa < wb);
    }
    (a.counts.requests != b.counts.requests).then_some(a.counts.requests < b.counts.requests)
}

impl Policy for PowerOfTwoPolicy {
    fn name(&self) -> &'static str {
        "power_of_two"
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        _: &RequestInfo,
        fleet: &dyn FleetView,
    ) -> Option<usize> {
        let n = candidates.len();
        let mut rng = rand::rng();
        match n {
            0 => None,
            1 => Some(0),
            _ => {
                let first = rng.random_range(0..n);
                let second = (first + rng.random_range(1..n)) % n;
                let now = fleet.moment(Instant::now());
                let a = fleet.load(&candidates[first], &now);
                let b = fleet.load(&candidates[second], &now);
                Some(match lighter(&a, &b) {
                    Some(true) => first,
                    Some(false) => second,
                    None if rng.random_bool(0.5) => first,
                    None => second,
                })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::testkit::*;

    #[test]
    fn kv_then_queue_then_in_flight() {
        let workers = workers(2);
        let policy = PowerOfTwoPolicy;
        set_load(&workers[0], engine().usage(0.2).waiting(9));
        set_load(&workers[1], engine().usage(0.6).waiting(0));
        assert_eq!(pick_n(&policy, &workers, &plain(), 30), [30, 0], "lower k");
        set_load(&workers[0], engine().usage(0.6).waiting(9));
        assert_eq!(
            pick_n(&policy, &workers, &plain(), 30),
            [0, 30],
            "equal k: queue"
        );
        set_load(&workers[0], engine().waiting(0));
        let _b = book(&workers[1], 1, 10);
        assert_eq!(
            pick_n(&policy, &workers, &plain(), 30),
            [30, 0],
            "k missing on one side, equal queues: in-flight"
        );
    }

    #[test]
    fn samples_two_distinct_workers_and_ties_spread() {
        let workers = workers(3);
        let policy = PowerOfTwoPolicy;
        let counts = pick_n(&policy, &workers, &plain(), 600);
        assert!(counts.iter().all(|&c| c > 100), "{counts:?}");
        // The busiest of three is never picked: it always loses its pair.
        let _b = book(&workers[2], 5, 10);
        let counts = pick_n(&policy, &workers, &plain(), 300);
        assert_eq!(counts[2], 0, "{counts:?}");
        assert_eq!(policy.select(&workers[..1], &plain(), &fleet()), Some(0));
    }
}
