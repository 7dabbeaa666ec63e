//! Test helpers shared by the policy tests: workers with scripted engine
//! snapshots and bookings, and a fleet view summed over several replicas.

#![allow(clippy::unwrap_used)]

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_proto::{EngineKind, EngineLoad, LoadSnapshot};

use super::Policy;
use crate::config::BreakerConfig;
use crate::fleet::{FleetView, LocalFleet, Moment, WorkerLoad};
use crate::request::RequestInfo;
use crate::workers::Worker;
use crate::workers::{Ledger, SlotBooking};
use shoal_proto::LoadCounts;

/// How long test snapshots stay fresh.
pub const STALE_AFTER: Duration = Duration::from_secs(60);

/// `n` workers named `http://w:<i>`.
pub fn workers(n: usize) -> Vec<Arc<Worker>> {
    (0..n)
        .map(|i| {
            Arc::new(Worker::new(
                format!("http://w:{i}"),
                BreakerConfig::default(),
            ))
        })
        .collect()
}

/// A builder for an engine snapshot.
#[derive(Debug, Clone, Copy, Default)]
pub struct Engine(pub EngineLoad);

/// An engine snapshot with no signal set yet.
pub fn engine() -> Engine {
    Engine::default()
}

impl Engine {
    pub fn usage(mut self, k: f64) -> Self {
        self.0.token_usage = Some(k);
        self
    }
    pub fn waiting(mut self, n: u64) -> Self {
        self.0.waiting_requests = Some(n);
        self
    }
    pub fn queued(mut self, tokens: u64) -> Self {
        self.0.queued_tokens = Some(tokens);
        self
    }
    pub fn throughput(mut self, tokens_per_s: f64) -> Self {
        self.0.gen_throughput = Some(tokens_per_s);
        self
    }
}

/// Stores a snapshot polled now, and counts the worker's own work since
/// the poll from here on (as the load monitor does).
pub fn set_load(worker: &Worker, engine: Engine) {
    let stamp = worker.ledger().poll_stamp();
    worker.ledger().slot().record_own_poll(&stamp);
    store_load(worker, engine);
}

/// Stores a snapshot polled now without rebasing the work since the poll
/// (the engine's numbers do not include what was routed before).
pub fn store_load(worker: &Worker, engine: Engine) {
    worker.store_snapshot(
        LoadSnapshot {
            source: EngineKind::Sglang,
            load: engine.0,
            polled_at_unix_ms: 0,
            poller: "test".into(),
        },
        Instant::now(),
    );
}

/// Books `n` requests of `tokens` token-work each on the worker's ledger.
pub fn book(worker: &Worker, n: usize, tokens: u64) -> Vec<SlotBooking> {
    (0..n)
        .map(|_| worker.ledger().book(tokens, tokens))
        .collect()
}

/// The single-replica fleet view.
pub fn fleet() -> LocalFleet {
    LocalFleet::new(STALE_AFTER)
}

/// A request of 100 prompt tokens without text.
pub fn plain() -> RequestInfo {
    RequestInfo {
        prompt_tokens: 100,
        ..RequestInfo::default()
    }
}

/// A request carrying `text` (for prefix matching).
pub fn text(text: &str) -> RequestInfo {
    RequestInfo {
        prompt_tokens: text.len().div_ceil(4) as u64,
        text: Some(text.to_string()),
        ..RequestInfo::default()
    }
}

/// How often each worker is picked in `n` selections without booking.
pub fn pick_n(
    policy: &dyn Policy,
    workers: &[Arc<Worker>],
    request: &RequestInfo,
    n: usize,
) -> Vec<u32> {
    let fleet = fleet();
    let mut counts = vec![0; workers.len()];
    for _ in 0..n {
        counts[policy.select(workers, request, &fleet).unwrap()] += 1;
    }
    counts
}

/// Several replicas' ledgers per worker; the view sums them, as the mesh
/// does over live replicas. Snapshots are the workers' own.
#[derive(Debug, Default)]
pub struct ReplicaFleet {
    replicas: Vec<HashMap<u64, Ledger>>,
}

impl ReplicaFleet {
    /// A view over `replicas` replicas with no bookings.
    pub fn new(replicas: usize) -> Self {
        Self {
            replicas: vec![HashMap::new(); replicas],
        }
    }

    /// Books on `replica`'s slot for `worker`.
    pub fn book(&mut self, replica: usize, worker: &Worker, tokens: u64) -> SlotBooking {
        self.replicas[replica]
            .entry(worker.id())
            .or_insert_with(|| Ledger::detached(worker.url()))
            .book(tokens, tokens)
    }

    /// Every replica learns a new snapshot of `worker`: each counts its own
    /// work since the poll from now on (as the mesh does).
    pub fn learn_poll(&self, worker: &Worker) {
        for ledger in self.replicas.iter().filter_map(|r| r.get(&worker.id())) {
            ledger.slot().record_own_poll(&ledger.poll_stamp());
        }
    }

    /// The view of replica `replica` alone (its own slots, shared counters).
    pub fn only(&self, replica: usize) -> Self {
        Self {
            replicas: vec![self.replicas[replica].clone()],
        }
    }

    /// Fleet token-work routed to `worker` since each replica's poll.
    pub fn dispatched_since_poll(&self, worker: &Worker) -> u64 {
        self.counts(worker).dispatched_since_poll
    }

    fn counts(&self, worker: &Worker) -> LoadCounts {
        self.replicas
            .iter()
            .filter_map(|slots| slots.get(&worker.id()))
            .fold(LoadCounts::default(), |sum, l| sum + l.counts())
    }
}

impl FleetView for ReplicaFleet {
    fn moment(&self, now: Instant) -> Moment {
        Moment::new(now, STALE_AFTER)
    }

    fn load(&self, worker: &Worker, at: &Moment) -> WorkerLoad {
        WorkerLoad::assemble(
            self.counts(worker),
            worker.snapshot_cell().read_fresh(at.fresh_from_stamp()),
        )
    }
}
