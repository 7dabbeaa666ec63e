//! The load monitor: polls every worker's load endpoint each interval in
//! the engine's own format and stores a validated, time-stamped snapshot on
//! the worker.
//!
//! A failed poll leaves the previous snapshot in place; it ages out through
//! the stale limit, so a dead exporter reads as "missing", never as idle.

mod poll;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use shoal_mesh::Mesh;
use shoal_proto::LoadSnapshot;

use crate::config::{LoadPollConfig, LoadSource};
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
    /// A non-owner polls a worker itself once the fleet's freshest
    /// snapshot is older than this: [`FALLBACK_AFTER_INTERVALS`] poll
    /// intervals, capped by the stale limit, so a worker whose owner is
    /// late, dead or not polling is re-polled before policies lose it.
    pub fallback_after: Duration,
    /// The mesh, when on: polls are split by ownership and shared.
    pub mesh: Option<Arc<Mesh>>,
}

impl MonitorConfig {
    /// The monitor settings of the `--load-*` flags, stamping snapshots
    /// with `node_name` and sharing them through `mesh` if given.
    pub fn new(load: &LoadPollConfig, node_name: String, mesh: Option<Arc<Mesh>>) -> Self {
        Self {
            interval: load.poll_interval(),
            source: load.worker_load_source,
            node_name,
            fallback_after: fallback_after(load.poll_interval(), load.stale_after()),
            mesh,
        }
    }

    /// Whether this replica should poll `worker` this round: always without
    /// a mesh; with one, when it owns the worker or when no replica's
    /// snapshot is younger than [`MonitorConfig::fallback_after`] (the owner
    /// is late, dead, not polling or not yet known).
    pub fn should_poll(&self, worker: &Worker) -> bool {
        let Some(mesh) = &self.mesh else {
            return true;
        };
        if mesh.owns(worker.url()) {
            return true;
        }
        let now = Instant::now();
        worker
            .ledger()
            .slot()
            .fleet()
            .snapshot
            .is_none_or(|s| s.age(now) > self.fallback_after)
    }
}

/// How many poll intervals a non-owner waits for a fresher snapshot before
/// it polls a worker itself (one late poll of the owner is tolerated).
pub const FALLBACK_AFTER_INTERVALS: f64 = 1.5;

/// The fallback age for `interval` and the stale limit `stale_after`:
/// [`FALLBACK_AFTER_INTERVALS`] intervals, but never past the stale limit.
pub fn fallback_after(interval: Duration, stale_after: Duration) -> Duration {
    interval.mul_f64(FALLBACK_AFTER_INTERVALS).min(stale_after)
}

/// Polls one worker once and, on success, stores the snapshot on it.
pub async fn poll_once(
    client: &HttpClient,
    worker: &Worker,
    state: &mut PollState,
    config: &MonitorConfig,
) -> Result<LoadSnapshot, PollError> {
    // Taken before the stamp, so a wait for a health check is not
    // counted as the poll's age. Waited for at most one interval: a health
    // check of a hung engine holds the turn up to its timeouts, and the
    // round that polls every engine must not wait for one; past that the
    // poll goes on a connection of its own.
    let _turn = tokio::time::timeout(config.interval, worker.side_turn())
        .await
        .ok();
    let slot = worker.ledger().slot();
    let stamp = slot.poll_stamp();
    let result = poll::poll(client, worker.url(), state, config.source, config.interval).await;
    let engine = state.kind().map(|k| k.as_str()).unwrap_or("unknown");
    match result {
        Ok((source, load)) => {
            let snapshot = LoadSnapshot {
                source,
                load,
                polled_at_unix_ms: stamp.polled_at_unix_ms,
                poller: config.node_name.clone(),
            };
            telemetry::load_poll(worker.url(), engine, Ok(&snapshot));
            // This replica's work since the poll counts from the poll's
            // start (with a mesh: if no fresher snapshot is known).
            match &config.mesh {
                Some(mesh) => mesh.publish_snapshot(slot, &stamp, source, load),
                None => slot.record_own_poll(&stamp),
            }
            worker.store_snapshot(snapshot.clone(), stamp.started);
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
        // By URL, so a round is linear in the workers (a scan per state
        // was 10^6 comparisons a round at 1,000 workers).
        let by_url: HashMap<&str, &Arc<Worker>> = workers.iter().map(|w| (w.url(), w)).collect();
        states.retain(|url, _| by_url.contains_key(url.as_str()));
        for worker in workers.iter() {
            if !states.contains_key(worker.url()) {
                states.insert(worker.url().to_string(), PollState::default());
            }
        }
        let polls = states.iter_mut().filter_map(|(url, state)| {
            let worker = Arc::clone(by_url.get(url.as_str())?);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fallback_comes_before_the_stale_limit() {
        let ms = Duration::from_millis;
        assert_eq!(fallback_after(ms(300), ms(900)), ms(450));
        assert_eq!(fallback_after(ms(300), ms(300)), ms(300));
    }
}
