//! The fleet view: what a policy knows about each worker's load.
//!
//! Policies read load only through [`FleetView`]. A replica without a mesh
//! uses [`LocalFleet`], which reports its own bookings and its own polls; a
//! meshed one uses [`MeshFleet`], which adds every live replica's slot and
//! takes the freshest snapshot any replica polled, so the same policy code
//! sees fleet-wide numbers.

mod mesh_view;

use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_proto::{EngineLoad, LoadCounts, LoadFigures};

use crate::workers::{CellStamp, Worker};

pub use mesh_view::MeshFleet;

/// Everything a policy may know about one worker's load, at one instant.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerLoad {
    /// Fleet (or, alone, this replica's) in-flight requests, tokens,
    /// pending prefill and work routed since the engine's last report.
    pub counts: LoadCounts,
    /// The engine's own numbers, if a snapshot fresher than the stale limit exists.
    pub engine: Option<EngineLoad>,
    /// What those numbers imply for scoring (all missing without them).
    pub figures: LoadFigures,
}

/// The instant one selection reads the fleet at, with the view's staleness
/// cutoff worked out once: reading a worker then compares its poll time
/// with the cutoff instead of subtracting instants (which, per candidate,
/// was a fifth of least_load's time at 1,024 workers).
#[derive(Debug, Clone, Copy)]
pub struct Moment {
    /// A snapshot polled before this is stale (`None`: none can be, the
    /// stale limit reaches back past the clock's start).
    fresh_from: Option<Instant>,
    /// The same cutoff as the snapshot cell stamps poll times.
    fresh_from_stamp: CellStamp,
}

impl Moment {
    /// The moment `now`, at which a snapshot older than `stale_after` is
    /// stale (aged from its poll time; exactly `stale_after` old is fresh).
    pub fn new(now: Instant, stale_after: Duration) -> Self {
        let fresh_from = now.checked_sub(stale_after);
        Self {
            fresh_from,
            fresh_from_stamp: fresh_from.map_or(CellStamp::EARLIEST, CellStamp::of),
        }
    }

    /// Whether a snapshot polled at `taken_at` is fresh at this moment.
    #[inline]
    pub fn is_fresh(&self, taken_at: Instant) -> bool {
        self.fresh_from.is_none_or(|from| taken_at >= from)
    }

    /// The cutoff as a snapshot cell stamp.
    #[inline]
    pub fn fresh_from_stamp(&self) -> CellStamp {
        self.fresh_from_stamp
    }
}

impl WorkerLoad {
    /// Combines booked counts (one replica's, or the sum over live replicas)
    /// with the latest snapshot, if it is fresh: `dispatched_since_poll` is
    /// what the counts say (each replica's work since the snapshot it
    /// knows, summed).
    #[inline]
    pub fn assemble(counts: LoadCounts, fresh: Option<(EngineLoad, LoadFigures)>) -> Self {
        let (engine, figures) = fresh.map_or((None, LoadFigures::default()), |(e, f)| (Some(e), f));
        WorkerLoad {
            counts,
            engine,
            figures,
        }
    }
}

/// Read-only load of the workers, as seen by this replica.
pub trait FleetView: Send + Sync + std::fmt::Debug {
    /// The moment a selection that starts `now` reads at: call once per
    /// selection and pass it to every [`FleetView::load`], so a selection
    /// reads the clock and works out the stale cutoff once.
    fn moment(&self, now: Instant) -> Moment;

    /// The load of one worker at moment `at`. Must not block and should
    /// not allocate: it runs for every candidate of every request.
    fn load(&self, worker: &Worker, at: &Moment) -> WorkerLoad;

    /// The load of every worker in `workers`, in order, appended to `out`:
    /// what a policy that scores every candidate reads. One call per
    /// selection instead of one per candidate: this default is compiled
    /// for each view with its `load` called statically, so the reads
    /// inline into one loop (a call per candidate, with its spills and
    /// returned copies, cost as much as the reads themselves at 1,024
    /// workers).
    fn load_all(&self, workers: &[Arc<Worker>], at: &Moment, out: &mut Vec<WorkerLoad>) {
        out.extend(workers.iter().map(|w| self.load(w, at)));
    }
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
    fn moment(&self, now: Instant) -> Moment {
        Moment::new(now, self.stale_after)
    }

    #[inline]
    fn load(&self, worker: &Worker, at: &Moment) -> WorkerLoad {
        WorkerLoad::assemble(
            worker.ledger().counts(),
            worker.snapshot_cell().read_fresh(at.fresh_from_stamp()),
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
        let load = fleet.load(&worker, &fleet.moment(Instant::now()));
        assert_eq!(load.counts.dispatched_since_poll, 30);
        assert_eq!(load.counts.requests, 2);
        assert_eq!(load.counts.tokens, 180);
        assert_eq!(load.counts.pending_prefill, 110);
        assert_eq!(load.engine.and_then(|e| e.token_usage), Some(0.5));
        drop(first);
        let at = fleet.moment(Instant::now());
        assert_eq!(fleet.load(&worker, &at).counts.tokens, 30);
    }

    #[test]
    fn a_moment_admits_polls_from_its_cutoff_on() {
        let now = Instant::now();
        let at = Moment::new(now, Duration::from_secs(2));
        assert!(
            at.is_fresh(now - Duration::from_secs(2)),
            "exactly the limit old"
        );
        assert!(!at.is_fresh(now - Duration::from_millis(2001)));
        assert!(at.is_fresh(now + Duration::from_secs(1)));
        let cell = crate::workers::SnapshotCell::default();
        cell.store(now - Duration::from_secs(2), &EngineLoad::default());
        assert!(cell.read_fresh(at.fresh_from_stamp()).is_some());
        cell.store(now - Duration::from_millis(2001), &EngineLoad::default());
        assert!(cell.read_fresh(at.fresh_from_stamp()).is_none());
        // A stale limit longer than the clock has run: nothing is stale.
        let forever = Moment::new(now, Duration::from_secs(u64::MAX / 4));
        assert!(forever.is_fresh(now - Duration::from_secs(1)));
        assert_eq!(forever.fresh_from_stamp(), CellStamp::EARLIEST);
    }

    #[test]
    fn stale_snapshot_is_missing() {
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        poll(&worker);
        let fleet = LocalFleet::new(Duration::ZERO);
        std::thread::sleep(Duration::from_millis(2));
        let load = fleet.load(&worker, &fleet.moment(Instant::now()));
        assert!(load.engine.is_none());
        assert_eq!(load.figures, LoadFigures::default());
    }
}
