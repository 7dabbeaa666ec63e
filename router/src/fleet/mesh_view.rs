//! The fleet view of a meshed replica: every live verified replica's
//! bookings and the freshest snapshot any of them polled.

use std::time::{Duration, Instant};

use super::{FleetView, LedgerCounts, LocalFleet, SnapshotReading, WorkerLoad};
use crate::workers::Worker;

/// Reads each worker's mesh slot: lock-free sums over live incarnations.
/// A worker without a slot (none is expected) falls back to local numbers.
#[derive(Debug, Clone)]
pub struct MeshFleet {
    stale_after: Duration,
    local: LocalFleet,
}

impl MeshFleet {
    /// A view in which snapshots older than `stale_after` count as missing.
    pub fn new(stale_after: Duration) -> Self {
        Self {
            stale_after,
            local: LocalFleet::new(stale_after),
        }
    }
}

impl FleetView for MeshFleet {
    fn load(&self, worker: &Worker, now: Instant) -> WorkerLoad {
        let Some(slot) = worker.ledger().mesh_slot() else {
            return self.local.load(worker, now);
        };
        let fleet = slot.fleet();
        let counts = LedgerCounts {
            requests: fleet.inflight_requests,
            tokens: fleet.inflight_tokens,
            pending_prefill: fleet.pending_prefill_tokens,
            dispatched: fleet.dispatched_total,
        };
        let snapshot = fleet.snapshot.map(|s| SnapshotReading {
            stored_at: s.learned_at,
            dispatched_mark: s.dispatched_mark,
            load: s.load,
        });
        WorkerLoad::assemble(counts, snapshot, now, self.stale_after)
    }
}
