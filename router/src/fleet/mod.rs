//! The fleet view: what a policy knows about each worker's load.
//!
//! Policies read load only through [`FleetView`]. A replica without a mesh
//! uses [`LocalFleet`], which reports its own bookings and its own polls; a
//! meshed one uses [`MeshFleet`], which adds every live replica's slot and
//! takes the freshest snapshot any replica polled, so the same policy code
//! sees fleet-wide numbers.

mod ledger;
mod mesh_view;
mod snapshot_cell;

use std::time::{Duration, Instant};

use shoal_proto::EngineLoad;

use crate::workers::Worker;

pub use ledger::{Booking, Ledger, LedgerCounts};
pub use mesh_view::MeshFleet;
pub use snapshot_cell::{SnapshotCell, SnapshotReading};

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

impl WorkerLoad {
    /// Combines booked counts (one replica's, or the sum over live replicas)
    /// with the latest snapshot: a snapshot older than `stale_after` at `now`
    /// counts as missing, and `dispatched_since_poll` is measured from the
    /// snapshot's mark (from zero when there is no fresh snapshot).
    pub fn assemble(
        counts: LedgerCounts,
        snapshot: Option<SnapshotReading>,
        now: Instant,
        stale_after: Duration,
    ) -> Self {
        let fresh = snapshot
            .map(|s| (s, now.saturating_duration_since(s.stored_at)))
            .filter(|(_, age)| *age <= stale_after);
        WorkerLoad {
            inflight_requests: counts.requests,
            inflight_tokens: counts.tokens,
            pending_prefill_tokens: counts.pending_prefill,
            dispatched_since_poll: match fresh {
                Some((s, _)) => counts.dispatched.saturating_sub(s.dispatched_mark),
                None => counts.dispatched,
            },
            engine: fresh.map(|(s, _)| s.load),
            snapshot_age: fresh.map(|(_, age)| age),
        }
    }
}

/// Read-only load of the workers, as seen by this replica.
pub trait FleetView: Send + Sync + std::fmt::Debug {
    /// The load of one worker at `now` (read once per selection and passed
    /// to every call, so a selection does one clock read, not one per
    /// worker). Must not block and should not allocate: it runs for every
    /// candidate of every request.
    fn load(&self, worker: &Worker, now: Instant) -> WorkerLoad;
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
    fn load(&self, worker: &Worker, now: Instant) -> WorkerLoad {
        WorkerLoad::assemble(
            worker.ledger().counts(),
            worker.snapshot_cell().read(),
            now,
            self.stale_after,
        )
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
        let load = fleet.load(&worker, Instant::now());
        assert_eq!(load.dispatched_since_poll, 30);
        assert_eq!(load.inflight_requests, 2);
        assert_eq!(load.inflight_tokens, 180);
        assert_eq!(load.pending_prefill_tokens, 110);
        assert_eq!(load.engine.and_then(|e| e.token_usage), Some(0.5));
        drop(first);
        assert_eq!(fleet.load(&worker, Instant::now()).inflight_tokens, 30);
    }

    #[test]
    fn stale_snapshot_is_missing() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        worker.store_snapshot(snapshot(0));
        let fleet = LocalFleet::new(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let load = fleet.load(&worker, Instant::now());
        assert!(load.engine.is_none());
        assert!(load.snapshot_age.is_none());
    }
}
