//! The fleet view of a meshed replica: every live verified replica's
//! bookings and the freshest snapshot any of them polled.

use std::time::{Duration, Instant};

use super::{FleetView, WorkerLoad};
use crate::workers::{SnapshotReading, Worker};

/// Reads each worker's mesh slot: lock-free sums over live incarnations
/// and the freshest snapshot, aged from its poll time.
#[derive(Debug, Clone)]
pub struct MeshFleet {
    stale_after: Duration,
}

impl MeshFleet {
    /// A view in which snapshots older than `stale_after` count as missing.
    pub fn new(stale_after: Duration) -> Self {
        Self { stale_after }
    }
}

impl FleetView for MeshFleet {
    fn load(&self, worker: &Worker, now: Instant) -> WorkerLoad {
        let fleet = worker.ledger().slot().fleet();
        let snapshot = fleet.snapshot.map(|s| SnapshotReading {
            taken_at: s.taken_at,
            load: s.load,
        });
        WorkerLoad::assemble(fleet.counts, snapshot, now, self.stale_after)
    }
}
