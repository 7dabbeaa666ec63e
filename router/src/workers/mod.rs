//! The set of engines this replica routes to, and each one's state.
//!
//! Readers (every request) load the current list, indexed by model
//! (`models`), lock-free through `ArcSwap`; the rare writers (admin API,
//! discovery, a changed model list) swap in a new index.

mod breaker;
pub mod health;
mod ledger;
pub mod models;
mod roles;
mod snapshot_cell;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::{ArcSwap, ArcSwapOption};
use serde::Serialize;
use shoal_mesh::Mesh;
use shoal_proto::LoadSnapshot;

use crate::config::BreakerConfig;

pub use breaker::{CircuitBreaker, CircuitState};
pub use ledger::Ledger;
pub use models::{ModelIndex, ModelList, ModelNotFound, Served, parse_model_list};
pub use roles::{OwnedPoolSide, PoolSide, Roles};
pub use shoal_mesh::SlotBooking;
pub use snapshot_cell::{CellStamp, SnapshotCell};

/// A polled snapshot together with the local instant its poll started, so
/// its age can be measured on the monotonic clock.
#[derive(Debug, Clone)]
pub struct StoredSnapshot {
    /// What the engine reported.
    pub snapshot: LoadSnapshot,
    /// When the poll that produced it started.
    pub stored_at: Instant,
}

/// One engine: its address, health, circuit breaker, the router's own
/// bookings on it, and the latest load snapshot polled from it.
#[derive(Debug)]
pub struct Worker {
    id: u64,
    url: String,
    url_hash: u64,
    healthy: AtomicBool,
    /// Whether any health check has run yet (until then the worker is
    /// routed optimistically but shown as `healthy: null`).
    checked: AtomicBool,
    /// Its first check decides its health at once (a worker added at run
    /// time, which is out of rotation until then: a dead address must not
    /// look healthy, and a live one is routed only once its model list is
    /// read). Seeds keep the thresholds, so engines still starting when
    /// the replica does are not dropped by one early failure.
    first_check_decides: AtomicBool,
    health_streak: std::sync::Mutex<health::Streak>,
    breaker: CircuitBreaker,
    ledger: Ledger,
    snapshot: ArcSwap<Option<StoredSnapshot>>,
    snapshot_cell: SnapshotCell,
    served: ArcSwap<Served>,
    /// The engine's model objects from its last model list (what `GET
    /// /v1/models` answers with; read with the health checks).
    model_cards: ArcSwap<Vec<serde_json::Value>>,
    /// Where the engine publishes KV-cache events, when discovery named it.
    kv_event_sockets: ArcSwapOption<KvEventSockets>,
    /// Discovery put the engine in the prefill pool of a disaggregated
    /// fleet (`--discovery-role-label`).
    discovered_prefill: AtomicBool,
    /// Taken for each side request (health check, model list, load poll):
    /// see [`Worker::side_turn`].
    side_turn: tokio::sync::Mutex<()>,
}

/// Where a worker's engine publishes its KV-cache events, as discovery
/// found them: the EndpointSlice's `kv-events` (and `kv-events-replay`)
/// ports on the endpoint's address, as `tcp://host:port`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvEventSockets {
    /// The PUB socket.
    pub events: String,
    /// The replay (ROUTER) socket, if the slice lists one.
    pub replay: Option<String>,
}

impl Worker {
    /// A worker that starts in rotation (optimistic until a check fails),
    /// booking into a ledger of its own (a replica routing alone).
    pub fn new(url: String, breaker: BreakerConfig) -> Self {
        let ledger = Ledger::detached(&url);
        Self::with_ledger(url, breaker, ledger)
    }

    /// A worker whose bookings go to `ledger` (a mesh slot when meshed).
    pub fn with_ledger(url: String, breaker: BreakerConfig, ledger: Ledger) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            url_hash: url_hash(&url),
            url,
            healthy: AtomicBool::new(true),
            checked: AtomicBool::new(false),
            first_check_decides: AtomicBool::new(false),
            health_streak: std::sync::Mutex::new(health::Streak::default()),
            breaker: CircuitBreaker::new(breaker),
            ledger,
            snapshot: ArcSwap::from_pointee(None),
            snapshot_cell: SnapshotCell::default(),
            served: ArcSwap::from_pointee(Served::Unread),
            model_cards: ArcSwap::from_pointee(Vec::new()),
            kv_event_sockets: ArcSwapOption::empty(),
            discovered_prefill: AtomicBool::new(false),
            side_turn: tokio::sync::Mutex::new(()),
        }
    }

    /// Waits until no other side request to this engine is in flight and
    /// holds that turn until the guard drops. The health checks and the
    /// load polls run on their own tickers and met every health interval:
    /// two requests at once took two pooled connections to every engine,
    /// kept idle for the pool's timeout (at 1,000 engines, 1,000 sockets
    /// and their buffers more than needed). In turns they share one.
    pub async fn side_turn(&self) -> tokio::sync::MutexGuard<'_, ()> {
        self.side_turn.lock().await
    }

    /// Where discovery says the engine publishes KV-cache events.
    pub fn kv_event_sockets(&self) -> Option<Arc<KvEventSockets>> {
        self.kv_event_sockets.load_full()
    }

    /// Whether discovery put the engine in the prefill pool.
    pub fn discovered_prefill(&self) -> bool {
        self.discovered_prefill.load(Ordering::Relaxed)
    }

    /// Records the pool discovery puts the engine in (its slice's role
    /// label says `prefill`, or not).
    pub fn set_discovered_prefill(&self, prefill: bool) {
        self.discovered_prefill.store(prefill, Ordering::Relaxed);
    }

    /// Records where discovery says the engine publishes KV-cache events.
    pub fn set_kv_event_sockets(&self, sockets: Option<KvEventSockets>) {
        if self.kv_event_sockets.load().as_deref() != sockets.as_ref() {
            self.kv_event_sockets.store(sockets.map(Arc::new));
        }
    }

    /// The engine's model objects from its last model list.
    pub fn model_cards(&self) -> Arc<Vec<serde_json::Value>> {
        self.model_cards.load_full()
    }

    /// Records the engine's model objects.
    pub fn set_model_cards(&self, cards: Vec<serde_json::Value>) {
        self.model_cards.store(Arc::new(cards));
    }

    /// The models this worker serves, as its model list last said.
    pub fn served(&self) -> Arc<Served> {
        self.served.load_full()
    }

    /// Records what the worker serves; true when that changed. The
    /// registry's model index must be rebuilt after a change
    /// ([`Registry::set_served`] does both).
    fn set_served(&self, served: Served) -> bool {
        if **self.served.load() == served {
            return false;
        }
        self.served.store(Arc::new(served));
        true
    }

    /// The normalised base URL, also the worker's identity.
    pub fn url(&self) -> &str {
        &self.url
    }

    /// Process-unique id, never reused (a re-added URL gets a new one).
    /// Policies key per-worker state by it instead of hashing the URL.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A hash of the URL that every replica and every build computes alike
    /// ([`url_hash`]), computed once: rendezvous placement keys on it, so
    /// replicas place the same prompt on the same worker.
    #[inline]
    pub fn url_hash(&self) -> u64 {
        self.url_hash
    }

    /// Whether active health checks currently pass.
    pub fn is_healthy(&self) -> bool {
        self.healthy.load(Ordering::Relaxed)
    }

    /// Whether new requests may go here: healthy and the circuit lets them.
    pub fn is_available(&self) -> bool {
        self.is_healthy() && self.breaker.allows()
    }

    /// The circuit breaker guarding this worker.
    pub fn breaker(&self) -> &CircuitBreaker {
        &self.breaker
    }

    /// This replica's in-flight bookings on the worker.
    #[inline]
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Latest snapshot polled from the engine, however old.
    pub fn snapshot(&self) -> Arc<Option<StoredSnapshot>> {
        self.snapshot.load_full()
    }

    /// The latest snapshot as policies read it: lock-free, no reference
    /// counting, no allocation (the per-request path).
    #[inline]
    pub fn snapshot_cell(&self) -> &SnapshotCell {
        &self.snapshot_cell
    }

    /// Replaces the latest snapshot this replica polled itself, taken when
    /// the poll started at `taken_at`.
    pub fn store_snapshot(&self, snapshot: LoadSnapshot, taken_at: Instant) {
        self.snapshot_cell.store(taken_at, &snapshot.load);
        self.snapshot.store(Arc::new(Some(StoredSnapshot {
            snapshot,
            stored_at: taken_at,
        })));
    }

    fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }

    /// Whether a health check has run on it yet.
    pub fn is_checked(&self) -> bool {
        self.checked.load(Ordering::Relaxed)
    }
}

/// FNV-1a of `url`, written out so it is the same on every replica whatever
/// its Rust version or platform (the standard hasher promises neither).
pub fn url_hash(url: &str) -> u64 {
    url.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// A worker as `GET /workers` shows it.
#[derive(Debug, Serialize)]
pub struct WorkerStatus {
    /// Base URL.
    pub url: String,
    /// Active health checks pass; `null` until the first check ran (the
    /// worker is routed meanwhile, retries covering a dead one).
    pub healthy: Option<bool>,
    /// Circuit state.
    pub circuit: CircuitState,
    /// Requests this replica has in flight there.
    pub inflight_requests: u64,
    /// Token-work this replica has in flight there.
    pub inflight_tokens: u64,
    /// Latest polled snapshot, if any.
    pub snapshot: Option<LoadSnapshot>,
    /// Its age in milliseconds.
    pub snapshot_age_ms: Option<u64>,
    /// The models it serves (its `/v1/models`), `null` while unknown.
    pub models: Option<Vec<String>>,
}

impl WorkerStatus {
    /// Captures a worker's current state.
    pub fn of(worker: &Worker) -> Self {
        let stored = worker.snapshot();
        let stored = stored.as_ref().as_ref();
        Self {
            url: worker.url.clone(),
            healthy: worker.is_checked().then(|| worker.is_healthy()),
            circuit: worker.breaker.state(),
            inflight_requests: worker.ledger.counts().requests,
            inflight_tokens: worker.ledger.counts().tokens,
            snapshot: stored.map(|s| s.snapshot.clone()),
            snapshot_age_ms: stored
                .map(|s| u64::try_from(s.stored_at.elapsed().as_millis()).unwrap_or(u64::MAX)),
            models: worker
                .served()
                .ids()
                .map(|ids| ids.iter().map(|id| id.to_string()).collect()),
        }
    }
}

/// Adding or removing a worker failed.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RegistryError {
    /// The URL is already registered.
    #[error("worker {0} is already registered")]
    Exists(String),
    /// No worker has that URL.
    #[error("no worker {0} is registered")]
    NotFound(String),
}

/// The current worker list, indexed by model, readable without locks.
#[derive(Debug)]
pub struct Registry {
    index: ArcSwap<ModelIndex>,
    breaker: BreakerConfig,
    mesh: Option<Arc<Mesh>>,
    polls: bool,
    write: std::sync::Mutex<()>,
    /// Woken when a worker is added, so it is checked at once.
    added: tokio::sync::Notify,
}

impl Registry {
    /// A registry holding `urls` (already normalised), in order, deduplicated.
    pub fn new(urls: &[String], breaker: BreakerConfig) -> Self {
        Self::with_mesh(urls, breaker, None, true)
    }

    /// Like [`Registry::new`]; with a mesh, every worker books into its
    /// mesh slot so peers see this replica's load. `polls` says whether
    /// this replica polls its workers' load (peers split polling among
    /// those that do).
    pub fn with_mesh(
        urls: &[String],
        breaker: BreakerConfig,
        mesh: Option<Arc<Mesh>>,
        polls: bool,
    ) -> Self {
        let registry = Self {
            index: ArcSwap::from_pointee(ModelIndex::default()),
            breaker,
            mesh,
            polls,
            write: std::sync::Mutex::new(()),
            added: tokio::sync::Notify::new(),
        };
        let mut workers: Vec<Arc<Worker>> = Vec::with_capacity(urls.len());
        for url in urls {
            if !workers.iter().any(|w| w.url == *url) {
                workers.push(registry.make_worker(url.clone()));
            }
        }
        registry.publish(workers);
        registry
    }

    /// Makes `workers` the current list (indexed anew).
    fn publish(&self, workers: Vec<Arc<Worker>>) {
        self.index
            .store(Arc::new(ModelIndex::build(Arc::new(workers))));
    }

    fn make_worker(&self, url: String) -> Arc<Worker> {
        let ledger = match &self.mesh {
            Some(mesh) => Ledger::new(mesh.worker(&url)),
            None => Ledger::detached(&url),
        };
        // Peers share poll ownership only among replicas that poll.
        ledger.slot().set_polled(self.polls);
        Arc::new(Worker::with_ledger(url, self.breaker.clone(), ledger))
    }

    /// Refreshes the per-worker metrics (in-flight, circuit, health) and
    /// the worker counts, just before a scrape renders them.
    pub fn record_gauges(&self) {
        let workers = self.all();
        for worker in workers.iter() {
            let ledger = worker.ledger();
            crate::telemetry::worker_gauges(
                worker.url(),
                ledger.counts().requests,
                ledger.counts().tokens,
                worker.breaker().state().as_gauge(),
            );
            crate::telemetry::worker_health(worker.url(), worker.is_healthy());
        }
        let available = workers.iter().filter(|w| w.is_available()).count();
        crate::telemetry::worker_counts(workers.len(), available);
    }

    /// Resolves when a worker was added since the last call.
    pub async fn worker_added(&self) {
        self.added.notified().await;
    }

    /// A consistent snapshot of all workers.
    pub fn all(&self) -> Arc<Vec<Arc<Worker>>> {
        self.index.load().all().clone()
    }

    /// The registered worker whose base URL is `url`, if any (a linear
    /// scan: only requests about stored objects look a worker up by URL).
    pub fn find(&self, url: &str) -> Option<Arc<Worker>> {
        self.all().iter().find(|w| w.url() == url).cloned()
    }

    /// The workers a request for `model` may go to ([`ModelIndex::serving`]).
    pub fn serving(&self, model: Option<&str>) -> Result<Arc<Vec<Arc<Worker>>>, ModelNotFound> {
        self.index.load().serving(model).cloned()
    }

    /// Records what `worker` serves and, if that changed while it is
    /// registered, re-indexes; true when it changed.
    pub fn set_served(&self, worker: &Arc<Worker>, served: Served) -> bool {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        if !worker.set_served(served) {
            return false;
        }
        let current = self.index.load_full();
        if current.all().iter().any(|w| Arc::ptr_eq(w, worker)) {
            self.publish(current.all().as_ref().clone());
        }
        true
    }

    /// Registers a new worker at the (normalised) `url`.
    pub fn add(&self, url: String) -> Result<Arc<Worker>, RegistryError> {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.all();
        if current.iter().any(|w| w.url == url) {
            return Err(RegistryError::Exists(url));
        }
        let worker = self.make_worker(url);
        // Out of rotation until its first check (which reads its models).
        worker.first_check_decides.store(true, Ordering::Relaxed);
        worker.healthy.store(false, Ordering::Relaxed);
        let mut next = Vec::with_capacity(current.len() + 1);
        next.extend(current.iter().cloned());
        next.push(worker.clone());
        self.publish(next);
        self.added.notify_one();
        Ok(worker)
    }

    /// Removes the worker at `url`; requests in flight there finish normally.
    pub fn remove(&self, url: &str) -> Result<Arc<Worker>, RegistryError> {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.all();
        let Some(position) = current.iter().position(|w| w.url == url) else {
            return Err(RegistryError::NotFound(url.to_string()));
        };
        let mut next: Vec<Arc<Worker>> = current.as_ref().clone();
        let removed = next.remove(position);
        self.publish(next);
        // No longer polled here: peers must not leave it to this replica.
        removed.ledger().slot().set_polled(false);
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_adds_and_removes_once() {
        let registry = Registry::new(
            &["http://a:1".into(), "http://a:1".into()],
            BreakerConfig::default(),
        );
        assert_eq!(registry.all().len(), 1);
        registry.add("http://b:1".into()).unwrap();
        assert_eq!(
            registry.add("http://b:1".into()).unwrap_err(),
            RegistryError::Exists("http://b:1".into())
        );
        registry.remove("http://a:1").unwrap();
        assert!(registry.remove("http://a:1").is_err());
        let urls: Vec<_> = registry.all().iter().map(|w| w.url().to_string()).collect();
        assert_eq!(urls, vec!["http://b:1"]);
    }
}
