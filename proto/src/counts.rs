//! The four numbers a replica books per worker, in one type.
//!
//! The same [`LoadCounts`] is a replica's own slot, a slot on the wire, the
//! fleet sum a policy reads and a share in `/mesh/status`, so the numbers
//! keep one name from the booking to the operator's screen.

use serde::{Deserialize, Serialize};

/// In-flight load and work routed since the last engine report, for one
/// worker: one replica's share, or the sum over live replicas.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct LoadCounts {
    /// Requests routed there and not yet finished.
    pub requests: u64,
    /// Token-work (prompt + expected output) routed there and not finished.
    pub tokens: u64,
    /// Prompt tokens routed there still waiting for a first response byte.
    pub pending_prefill: u64,
    /// Token-work routed there since the engine snapshot the counter knows
    /// of (each incarnation counts its own; the fleet value is their sum).
    pub dispatched_since_poll: u64,
}

impl LoadCounts {
    /// True when nothing is in flight (work since the poll may remain).
    pub fn is_idle(&self) -> bool {
        self.requests == 0 && self.tokens == 0 && self.pending_prefill == 0
    }
}

impl std::ops::Add for LoadCounts {
    type Output = Self;

    #[inline]
    fn add(self, other: Self) -> Self {
        Self {
            requests: self.requests.saturating_add(other.requests),
            tokens: self.tokens.saturating_add(other.tokens),
            pending_prefill: self.pending_prefill.saturating_add(other.pending_prefill),
            dispatched_since_poll: self
                .dispatched_since_poll
                .saturating_add(other.dispatched_since_poll),
        }
    }
}

impl std::ops::AddAssign for LoadCounts {
    #[inline]
    fn add_assign(&mut self, other: Self) {
        *self = *self + other;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_saturate() {
        let a = LoadCounts {
            requests: u64::MAX,
            tokens: 1,
            pending_prefill: 2,
            dispatched_since_poll: 3,
        };
        let sum = a + a;
        assert_eq!(sum.requests, u64::MAX);
        assert_eq!(sum.tokens, 2);
        assert_eq!(sum.dispatched_since_poll, 6);
        assert!(!sum.is_idle());
        assert!(LoadCounts::default().is_idle());
    }
}
