//! The fleet view: what a policy knows about each worker's load.
//!
//! Policies read load only through [`FleetView`]. A replica without a mesh
//! uses [`LocalFleet`], which reports its own bookings and its own polls; a
//! meshed one uses [`MeshFleet`], which adds every live replica's slot and
//! takes the freshest snapshot any replica polled, so the same policy code
//! sees fleet-wide numbers.

mod mesh_view;

use std::time::{Duration, Instant};

use shoal_proto::{EngineLoad, LoadCounts};

use crate::workers::{SnapshotReading, Worker};

pub use mesh_view::MeshFleet;

/// Everything a policy may know about one worker's load, at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerLoad {
    /// Fleet (or, alone, this replica's) in-flight requests, tokens,
    /// pending prefill and work routed since the engine's last report.
    pub counts: LoadCounts,
    /// The engine's own numbers, if a snapshot fresher than the stale limit exists.
    pub engine: Option<EngineLoad>,
    /// Age of that snapshot.
    pub snapshot_age: Option<Duration>,
}

impl WorkerLoad {
    /// Combines booked counts (one replica's, or the sum over live replicas)
    /// with the latest snapshot: a snapshot older than `stale_after` at `now`
    /// (aged from its poll time) counts as missing. `dispatched_since_poll`
    /// is what the counts say: each replica's work since the snapshot it
    /// knows, summed.
    pub fn assemble(
        counts: LoadCounts,
        snapshot: Option<SnapshotReading>,
        now: Instant,
        stale_after: Duration,
    ) -> Self {
        let fresh = snapshot
            .map(|s| (s, now.saturating_duration_since(s.taken_at)))
            .filter(|(_, age)| *age <= stale_after);
        WorkerLoad {
            counts,
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
    use crate::config::BreakerConfig;
    use shoal_proto::{EngineKind, LoadSnapshot};

    fn poll(worker: &Worker) {
        let stamp = worker.ledger().poll_stamp();
        worker.ledger().slot().record_own_poll(&stamp);
        worker.store_snapshot(
            LoadSnapshot {
                source: EngineKind::Sglang,
                load: EngineLoad {
                    token_usage: Some(0.5),
                    ..EngineLoad::default()
                },
                polled_at_unix_ms: stamp.polled_at_unix_ms,
                poller: "t".into(),
            },
            stamp.started,
        );
    }

    #[test]
    fn dispatched_since_poll_counts_from_the_poll() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        let fleet = LocalFleet::new(Duration::from_secs(10));
        let first = worker.ledger().book(100, 150);
        poll(&worker);
        let _second = worker.ledger().book(10, 30);
        let load = fleet.load(&worker, Instant::now());
        assert_eq!(load.counts.dispatched_since_poll, 30);
        assert_eq!(load.counts.requests, 2);
        assert_eq!(load.counts.tokens, 180);
        assert_eq!(load.counts.pending_prefill, 110);
        assert_eq!(load.engine.and_then(|e| e.token_usage), Some(0.5));
        drop(first);
        assert_eq!(fleet.load(&worker, Instant::now()).counts.tokens, 30);
    }

    #[test]
    fn stale_snapshot_is_missing() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        poll(&worker);
        let fleet = LocalFleet::new(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let load = fleet.load(&worker, Instant::now());
        assert!(load.engine.is_none());
        assert!(load.snapshot_age.is_none());
    }
}
