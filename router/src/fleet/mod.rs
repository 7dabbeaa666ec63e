//! The fleet view: what a policy knows about each worker's load.
//!
//! Policies read load only through [`FleetView`]. A replica without a mesh
//! uses [`LocalFleet`], which reports its own bookings and its own polls; the
//! mesh will provide another implementation that adds every live replica's
//! slot, so the same policy code sees fleet-wide numbers.

mod ledger;

use std::time::Duration;

use shoal_proto::EngineLoad;

use crate::workers::Worker;

pub use ledger::{Booking, Ledger};

/// Everything a policy may know about one worker's load, at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerLoad {
    /// Requests routed there and not yet finished.
    pub inflight_requests: u64,
    /// Token-work (prompt + expected output) routed there and not finished.
    pub inflight_tokens: u64,
    /// Prompt tokens routed there that have not seen a first response byte.
    pub pending_prefill_tokens: u64,
    /// Token-work routed there since the engine's last load report.
    pub dispatched_since_poll: u64,
    /// The engine's own numbers, if a snapshot fresher than the stale limit exists.
    pub engine: Option<EngineLoad>,
    /// Age of that snapshot.
    pub snapshot_age: Option<Duration>,
}

/// Read-only load of the workers, as seen by this replica.
pub trait FleetView: Send + Sync + std::fmt::Debug {
    /// The load of one worker now. Must not block and should not allocate:
    /// it runs for every candidate of every request.
    fn load(&self, worker: &Worker) -> WorkerLoad;
}

/// The fleet view of a replica that knows only its own traffic.
#[derive(Debug, Clone)]
pub struct LocalFleet {
    stale_after: Duration,
}

impl LocalFleet {
    /// A view in which snapshots older than `stale_after` count as missing.
    pub fn new(stale_after: Duration) -> Self {
        Self { stale_after }
    }
}

impl FleetView for LocalFleet {
    fn load(&self, worker: &Worker) -> WorkerLoad {
        let ledger = worker.ledger();
        let stored = worker.snapshot();
        let fresh = stored
            .as_ref()
            .as_ref()
            .filter(|s| s.stored_at.elapsed() <= self.stale_after);
        let dispatched = ledger.dispatched_tokens();
        WorkerLoad {
            inflight_requests: ledger.inflight_requests(),
            inflight_tokens: ledger.inflight_tokens(),
            pending_prefill_tokens: ledger.pending_prefill_tokens(),
            dispatched_since_poll: match fresh {
                Some(s) => dispatched.saturating_sub(s.snapshot.dispatched_mark),
                None => dispatched,
            },
            engine: fresh.map(|s| s.snapshot.load),
            snapshot_age: fresh.map(|s| s.stored_at.elapsed()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::workers::BreakerConfig;
    use shoal_proto::{EngineKind, LoadSnapshot};

    fn snapshot(mark: u64) -> LoadSnapshot {
        LoadSnapshot {
            source: EngineKind::Sglang,
            load: EngineLoad {
                token_usage: Some(0.5),
                ..EngineLoad::default()
            },
            polled_at_unix_ms: 0,
            poller: "t".into(),
            dispatched_mark: mark,
        }
    }

    #[test]
    fn dispatched_since_poll_counts_from_the_mark() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        let fleet = LocalFleet::new(Duration::from_secs(10));
        let first = worker.ledger().book(100, 150);
        worker.store_snapshot(snapshot(worker.ledger().dispatched_tokens()));
        let _second = worker.ledger().book(10, 30);
        let load = fleet.load(&worker);
        assert_eq!(load.dispatched_since_poll, 30);
        assert_eq!(load.inflight_requests, 2);
        assert_eq!(load.inflight_tokens, 180);
        assert_eq!(load.pending_prefill_tokens, 110);
        assert_eq!(load.engine.and_then(|e| e.token_usage), Some(0.5));
        drop(first);
        assert_eq!(fleet.load(&worker).inflight_tokens, 30);
    }

    #[test]
    fn stale_snapshot_is_missing() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        worker.store_snapshot(snapshot(0));
        let fleet = LocalFleet::new(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let load = fleet.load(&worker);
        assert!(load.engine.is_none());
        assert!(load.snapshot_age.is_none());
    }
}
