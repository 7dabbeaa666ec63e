//! `random`: each request goes to a uniformly random available worker.

use std::sync::Arc;

use rand::Rng;

use super::Policy;
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// Uniform random choice.
#[derive(Debug, Default)]
pub struct RandomPolicy;

impl Policy for RandomPolicy {
    fn name(&self) -> &'static str {
        "random"
    }

    fn select(
        &self,
        candidates: &[Arc<Worker>],
        _: &RequestInfo,
        _: &dyn FleetView,
    ) -> Option<usize> {
        if candidates.is_empty() {
            return None;
        }
        Some(rand::rng().random_range(0..candidates.len()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;
    use crate::fleet::LocalFleet;
    use std::time::Duration;

    #[test]
    fn picks_every_candidate_eventually_and_only_valid_indices() {
        let workers: Vec<_> = (0..4)
            .map(|i| {
                Arc::new(Worker::new(
                    format!("http://w:{i}"),
                    BreakerConfig::default(),
                ))
            })
            .collect();
        let fleet = LocalFleet::new(Duration::from_secs(1));
        let mut seen = [0u32; 4];
        for _ in 0..400 {
            let i = RandomPolicy
                .select(&workers, &RequestInfo::default(), &fleet)
                .unwrap();
            seen[i] += 1;
        }
        assert!(seen.iter().all(|&n| n > 0), "{seen:?}");
    }
}
