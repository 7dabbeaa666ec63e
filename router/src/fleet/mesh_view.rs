//! The fleet view of a meshed replica: every live verified replica's
//! bookings and the freshest snapshot any of them polled.

use std::time::{Duration, Instant};

use super::{FleetView, Moment, WorkerLoad};
use crate::workers::Worker;

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
    fn moment(&self, now: Instant) -> Moment {
        Moment::new(now, self.stale_after)
    }

    #[inline]
    fn load(&self, worker: &Worker, at: &Moment) -> WorkerLoad {
        let fleet = worker.ledger().slot().fleet();
        let fresh = fleet
            .snapshot
            .filter(|s| at.is_fresh(s.taken_at))
            .map(|s| (s.load, s.figures));
        WorkerLoad::assemble(fleet.counts, fresh)
    }
}
