//! The load monitor: polls every worker's load endpoint each interval in
//! the engine's own format and stores a validated, time-stamped snapshot on
//! the worker.
//!
//! A failed poll leaves the previous snapshot in place; it ages out through
//! the stale limit, so a dead exporter reads as "missing", never as idle.

mod poll;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use futures_util::future::join_all;
use shoal_mesh::Mesh;
use shoal_proto::LoadSnapshot;

use crate::config::{Config, LoadSource};
use crate::telemetry;
use crate::upstream::HttpClient;
use crate::workers::{Registry, Worker};

pub use poll::{PollError, PollState};

/// Load-monitor knobs.
#[derive(Debug, Clone)]
pub struct MonitorConfig {
    /// Time between polls of each worker.
    pub interval: Duration,
    /// Which format to poll with.
    pub source: LoadSource,
    /// Name stamped on snapshots as their poller.
    pub node_name: String,
    /// Age past which a snapshot counts as missing: a non-owner polls a
    /// worker itself when the fleet has nothing fresher.
    pub stale_after: Duration,
    /// The mesh, when on: polls are split by ownership and shared.
    pub mesh: Option<Arc<Mesh>>,
}

impl MonitorConfig {
    /// The monitor settings of `config`, sharing through `mesh` if given.
    pub fn new(config: &Config, mesh: Option<Arc<Mesh>>) -> Self {
        Self {
            interval: config.load_poll_interval(),
            source: config.worker_load_source,
            node_name: config.mesh.node_name(),
            stale_after: config.load_stale_after(),
            mesh,
        }
    }

    /// Whether this replica should poll `worker` this round: always without
    /// a mesh; with one, when it owns the worker or when no replica's
    /// snapshot is fresh (the owner is late, dead or not yet known).
    pub fn should_poll(&self, worker: &Worker) -> bool {
        let (Some(mesh), Some(slot)) = (&self.mesh, worker.ledger().mesh_slot()) else {
            return true;
        };
        if mesh.owns(worker.url()) {
            return true;
        }
        slot.fleet()
            .snapshot
            .is_none_or(|s| s.learned_at.elapsed() > self.stale_after)
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// Polls one worker once and, on success, stores the snapshot on it.
pub async fn poll_once(
    client: &HttpClient,
    worker: &Worker,
    state: &mut PollState,
    config: &MonitorConfig,
) -> Result<LoadSnapshot, PollError> {
    let slot = worker.ledger().mesh_slot();
    let (polled_at_unix_ms, mark) = match slot {
        Some(slot) => {
            let stamp = slot.poll_stamp();
            (stamp.polled_at_unix_ms, stamp.dispatched_mark)
        }
        None => (unix_ms(), worker.ledger().dispatched_tokens()),
    };
    let result = poll::poll(client, worker.url(), state, config.source, config.interval).await;
    let engine = state.kind().map(|k| k.as_str()).unwrap_or("unknown");
    match result {
        Ok((source, load)) => {
            let snapshot = LoadSnapshot {
                source,
                load,
                polled_at_unix_ms,
                poller: config.node_name.clone(),
                dispatched_mark: mark,
            };
            telemetry::load_poll(worker.url(), engine, Ok(&snapshot));
            if let (Some(mesh), Some(slot)) = (&config.mesh, slot) {
                mesh.publish_snapshot(slot, &snapshot);
            }
            worker.store_snapshot(snapshot.clone());
            Ok(snapshot)
        }
        Err(err) => {
            telemetry::load_poll(worker.url(), engine, Err(err.reason()));
            tracing::debug!(worker = worker.url(), error = %err, "load poll failed");
            Err(err)
        }
    }
}

/// Polls every registered worker each interval, forever. Does nothing when
/// the load source is `none`.
pub async fn run(registry: Arc<Registry>, client: HttpClient, config: MonitorConfig) {
    if config.source == LoadSource::None {
        return;
    }
    let mut states: HashMap<String, PollState> = HashMap::new();
    let mut ticker = tokio::time::interval(config.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let workers = registry.all();
        states.retain(|url, _| workers.iter().any(|w| w.url() == url));
        for worker in workers.iter() {
            states.entry(worker.url().to_string()).or_default();
        }
        let polls = states.iter_mut().filter_map(|(url, state)| {
            let worker = workers.iter().find(|w| w.url() == url)?.clone();
            if !config.should_poll(&worker) {
                return None;
            }
            let client = &client;
            let config = &config;
            Some(async move {
                let _ = poll_once(client, &worker, state, config).await;
            })
        });
        join_all(polls).await;
    }
}
