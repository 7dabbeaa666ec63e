//! `round_robin`: each request goes to the next available worker in turn.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::Policy;
use crate::fleet::FleetView;
use crate::request::RequestInfo;
use crate::workers::Worker;

/// Cycles through the candidates with a shared counter.
#[derive(Debug, Default)]
pub struct RoundRobinPolicy {
    next: AtomicUsize,
}

impl Policy for RoundRobinPolicy {
    fn name(&self) -> &'static str {
        "round_robin"
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
        Some(self.next.fetch_add(1, Ordering::Relaxed) % candidates.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;
    use crate::fleet::LocalFleet;
    use std::time::Duration;

    #[test]
    fn cycles_through_every_candidate() {
        let workers: Vec<_> = (0..3)
            .map(|i| {
                Arc::new(Worker::new(
                    format!("http://w:{i}"),
                    BreakerConfig::default(),
                ))
            })
            .collect();
        let policy = RoundRobinPolicy::default();
        let fleet = LocalFleet::new(Duration::from_secs(1));
        let picks: Vec<_> = (0..6)
            .map(|_| {
                policy
                    .select(&workers, &RequestInfo::default(), &fleet)
                    .unwrap()
            })
            .collect();
        assert_eq!(picks, vec![0, 1, 2, 0, 1, 2]);
        assert_eq!(policy.select(&[], &RequestInfo::default(), &fleet), None);
    }
}
