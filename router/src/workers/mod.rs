//! The set of engines this replica routes to, and each one's state.
//!
//! Readers (every request) load the current list lock-free through
//! `ArcSwap`; the rare writers (admin API) swap in a new list.

mod breaker;
pub mod health;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use arc_swap::ArcSwap;
use http::Uri;
use serde::Serialize;
use shoal_mesh::Mesh;
use shoal_proto::LoadSnapshot;

use crate::fleet::{Ledger, SnapshotCell};

pub use breaker::{BreakerConfig, CircuitBreaker, CircuitState};

/// Checks and normalises a worker base URL: `http://host[:port][/prefix]`,
/// no query, no trailing slash. Only plain HTTP is proxied for now.
pub fn normalize_url(text: &str) -> Result<String, String> {
    let trimmed = text.trim().trim_end_matches('/');
    let uri: Uri = trimmed
        .parse()
        .map_err(|err| format!("`{text}` is not a URL: {err}"))?;
    match uri.scheme_str() {
        Some("http") => {}
        Some(other) => {
            return Err(format!(
                "`{text}`: scheme `{other}` is not supported (use http://)"
            ));
        }
        None => return Err(format!("`{text}` needs a scheme, e.g. http://{text}")),
    }
    let Some(authority) = uri.authority() else {
        return Err(format!("`{text}` has no host"));
    };
    if authority.host().is_empty() {
        return Err(format!("`{text}` has no host"));
    }
    if uri.query().is_some() {
        return Err(format!("`{text}` must not carry a query string"));
    }
    Ok(trimmed.to_string())
}

/// A polled snapshot together with the local instant it was stored, so its
/// age can be measured on the monotonic clock.
#[derive(Debug, Clone)]
pub struct StoredSnapshot {
    /// What the engine reported.
    pub snapshot: LoadSnapshot,
    /// When this replica stored it.
    pub stored_at: Instant,
}

/// One engine: its address, health, circuit breaker, the router's own
/// bookings on it, and the latest load snapshot polled from it.
#[derive(Debug)]
pub struct Worker {
    id: u64,
    url: String,
    healthy: AtomicBool,
    health_streak: std::sync::Mutex<health::Streak>,
    breaker: CircuitBreaker,
    ledger: Ledger,
    snapshot: ArcSwap<Option<StoredSnapshot>>,
    snapshot_cell: SnapshotCell,
}

impl Worker {
    /// A worker that starts in rotation (optimistic until a check fails).
    pub fn new(url: String, breaker: BreakerConfig) -> Self {
        Self::with_ledger(url, breaker, Ledger::default())
    }

    /// A worker whose bookings go to `ledger` (a mesh slot when meshed).
    pub fn with_ledger(url: String, breaker: BreakerConfig, ledger: Ledger) -> Self {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Self {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            url,
            healthy: AtomicBool::new(true),
            health_streak: std::sync::Mutex::new(health::Streak::default()),
            breaker: CircuitBreaker::new(breaker),
            ledger,
            snapshot: ArcSwap::from_pointee(None),
            snapshot_cell: SnapshotCell::default(),
        }
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
    pub fn ledger(&self) -> &Ledger {
        &self.ledger
    }

    /// Latest snapshot polled from the engine, however old.
    pub fn snapshot(&self) -> Arc<Option<StoredSnapshot>> {
        self.snapshot.load_full()
    }

    /// The latest snapshot as policies read it: lock-free, no reference
    /// counting, no allocation (the per-request path).
    pub fn snapshot_cell(&self) -> &SnapshotCell {
        &self.snapshot_cell
    }

    /// Replaces the latest snapshot.
    pub fn store_snapshot(&self, snapshot: LoadSnapshot) {
        let stored_at = Instant::now();
        self.snapshot_cell
            .store(stored_at, snapshot.dispatched_mark, &snapshot.load);
        self.snapshot.store(Arc::new(Some(StoredSnapshot {
            snapshot,
            stored_at,
        })));
    }

    fn set_healthy(&self, healthy: bool) {
        self.healthy.store(healthy, Ordering::Relaxed);
    }
}

/// A worker as `GET /workers` shows it.
#[derive(Debug, Serialize)]
pub struct WorkerStatus {
    /// Base URL.
    pub url: String,
    /// Active health checks pass.
    pub healthy: bool,
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
}

impl WorkerStatus {
    /// Captures a worker's current state.
    pub fn of(worker: &Worker) -> Self {
        let stored = worker.snapshot();
        let stored = stored.as_ref().as_ref();
        Self {
            url: worker.url.clone(),
            healthy: worker.is_healthy(),
            circuit: worker.breaker.state(),
            inflight_requests: worker.ledger.inflight_requests(),
            inflight_tokens: worker.ledger.inflight_tokens(),
            snapshot: stored.map(|s| s.snapshot.clone()),
            snapshot_age_ms: stored
                .map(|s| u64::try_from(s.stored_at.elapsed().as_millis()).unwrap_or(u64::MAX)),
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

/// The current worker list, readable without locks.
#[derive(Debug)]
pub struct Registry {
    workers: ArcSwap<Vec<Arc<Worker>>>,
    breaker: BreakerConfig,
    mesh: Option<Arc<Mesh>>,
    write: std::sync::Mutex<()>,
}

impl Registry {
    /// A registry holding `urls` (already normalised), in order, deduplicated.
    pub fn new(urls: &[String], breaker: BreakerConfig) -> Self {
        Self::with_mesh(urls, breaker, None)
    }

    /// Like [`Registry::new`]; with a mesh, every worker books into its
    /// mesh slot so peers see this replica's load.
    pub fn with_mesh(urls: &[String], breaker: BreakerConfig, mesh: Option<Arc<Mesh>>) -> Self {
        let registry = Self {
            workers: ArcSwap::from_pointee(Vec::new()),
            breaker,
            mesh,
            write: std::sync::Mutex::new(()),
        };
        let mut workers: Vec<Arc<Worker>> = Vec::with_capacity(urls.len());
        for url in urls {
            if !workers.iter().any(|w| w.url == *url) {
                workers.push(registry.make_worker(url.clone()));
            }
        }
        registry.workers.store(Arc::new(workers));
        registry
    }

    fn make_worker(&self, url: String) -> Arc<Worker> {
        let ledger = match &self.mesh {
            Some(mesh) => Ledger::meshed(mesh.worker(&url)),
            None => Ledger::default(),
        };
        Arc::new(Worker::with_ledger(url, self.breaker.clone(), ledger))
    }

    /// A consistent snapshot of all workers.
    pub fn all(&self) -> Arc<Vec<Arc<Worker>>> {
        self.workers.load_full()
    }

    /// Registers a new worker at the (normalised) `url`.
    pub fn add(&self, url: String) -> Result<Arc<Worker>, RegistryError> {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.workers.load_full();
        if current.iter().any(|w| w.url == url) {
            return Err(RegistryError::Exists(url));
        }
        let worker = self.make_worker(url);
        let mut next = Vec::with_capacity(current.len() + 1);
        next.extend(current.iter().cloned());
        next.push(worker.clone());
        self.workers.store(Arc::new(next));
        Ok(worker)
    }

    /// Removes the worker at `url`; requests in flight there finish normally.
    pub fn remove(&self, url: &str) -> Result<Arc<Worker>, RegistryError> {
        let _guard = self.write.lock().unwrap_or_else(|e| e.into_inner());
        let current = self.workers.load_full();
        let Some(position) = current.iter().position(|w| w.url == url) else {
            return Err(RegistryError::NotFound(url.to_string()));
        };
        let mut next: Vec<Arc<Worker>> = current.as_ref().clone();
        let removed = next.remove(position);
        self.workers.store(Arc::new(next));
        Ok(removed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_are_normalised_and_checked() {
        assert_eq!(
            normalize_url("http://127.0.0.1:8000/").unwrap(),
            "http://127.0.0.1:8000"
        );
        assert_eq!(
            normalize_url(" http://engine:8000/v1prefix ").unwrap(),
            "http://engine:8000/v1prefix"
        );
        assert!(
            normalize_url("127.0.0.1:8000")
                .unwrap_err()
                .contains("scheme")
        );
        assert!(normalize_url("ftp://x").unwrap_err().contains("ftp"));
        assert!(
            normalize_url("http://x/?a=1")
                .unwrap_err()
                .contains("query")
        );
        assert!(normalize_url("not a url").is_err());
    }

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
