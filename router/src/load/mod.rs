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
}

impl From<&Config> for MonitorConfig {
    fn from(config: &Config) -> Self {
        Self {
            interval: config.load_poll_interval(),
            source: config.worker_load_source,
            node_name: config.node_name.clone(),
        }
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
    let mark = worker.ledger().dispatched_tokens();
    let polled_at_unix_ms = unix_ms();
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
            let client = &client;
            let config = &config;
            Some(async move {
                let _ = poll_once(client, &worker, state, config).await;
            })
        });
        join_all(polls).await;
    }
}
