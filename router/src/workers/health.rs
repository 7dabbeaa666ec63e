//! Active health checks: take a worker out of rotation after
//! `--health-failure-threshold` failed probes in a row, put it back after
//! `--health-success-threshold` passed ones. A worker added at run time
//! (admin API, discovery) is checked as soon as it is added, and that first
//! check decides its health at once. A worker that passes is also
//! asked what it serves (`/v1/models`), so LoRA adapters loaded or
//! unloaded at run time reach model routing within one check interval.

use std::sync::Arc;

use futures_util::future::join_all;

use super::models::{Served, parse_model_list};
use super::{Registry, Worker};
use crate::config::HealthConfig;
use crate::telemetry;
use crate::upstream::{self, HttpClient};

/// Consecutive results of one worker's probes.
#[derive(Debug, Default)]
pub struct Streak {
    passed: u32,
    failed: u32,
}

/// Applies one probe result to a worker; returns true if its health changed.
pub fn record_probe(worker: &Worker, passed: bool, config: &HealthConfig) -> bool {
    let first = !worker
        .checked
        .swap(true, std::sync::atomic::Ordering::Relaxed)
        && worker
            .first_check_decides
            .load(std::sync::atomic::Ordering::Relaxed);
    let mut streak = worker
        .health_streak
        .lock()
        .unwrap_or_else(|e| e.into_inner());
    if passed {
        streak.passed = streak.passed.saturating_add(1);
        streak.failed = 0;
    } else {
        streak.failed = streak.failed.saturating_add(1);
        streak.passed = 0;
    }
    let was = worker.is_healthy();
    // A worker's first check decides at once: a dead address added a
    // moment ago must not look healthy for three check intervals.
    let now = if first {
        passed
    } else if was {
        streak.failed < config.health_failure_threshold
    } else {
        streak.passed >= config.health_success_threshold
    };
    if now != was {
        worker.set_healthy(now);
        tracing::warn!(
            worker = worker.url(),
            healthy = now,
            "worker health changed"
        );
    }
    now != was
}

/// Largest model list read from a worker.
const MODEL_LIST_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Reads what `worker` serves from its `/v1/models` and records it; a
/// worker that has no such list (an error status or another shape) keeps
/// what was known before, or, never read before, becomes a candidate for
/// every model ([`Served::Any`]).
async fn refresh_models(
    client: &HttpClient,
    registry: &Registry,
    worker: &Arc<Worker>,
    config: &HealthConfig,
) {
    let answer = upstream::get(
        client,
        worker.url(),
        "/v1/models",
        config.timeout(),
        MODEL_LIST_MAX_BYTES,
    )
    .await;
    let served = match answer {
        Ok((status, body)) if status.is_success() => parse_model_list(&body),
        Ok(_) | Err(_) => None,
    };
    match served {
        Some(list) => {
            worker.set_model_cards(list.cards);
            if registry.set_served(worker, list.served) {
                tracing::info!(worker = worker.url(), models = ?worker.served().ids(), "worker models changed");
            }
        }
        None if *worker.served() == Served::Unread => {
            tracing::info!(
                worker = worker.url(),
                "no model list; the worker takes any model"
            );
            registry.set_served(worker, Served::Any);
        }
        None => tracing::debug!(worker = worker.url(), "no model list this time"),
    }
}

async fn probe(client: &HttpClient, worker: &Worker, config: &HealthConfig) -> bool {
    match upstream::get(
        client,
        worker.url(),
        &config.health_check_endpoint,
        config.timeout(),
        64 * 1024,
    )
    .await
    {
        Ok((status, _)) if status.is_success() => true,
        Ok((status, _)) => {
            tracing::debug!(worker = worker.url(), %status, "health check failed");
            false
        }
        Err(err) => {
            tracing::debug!(worker = worker.url(), error = %err, "health check failed");
            false
        }
    }
}

/// Probes every registered worker each interval, forever.
pub async fn run(registry: Arc<Registry>, client: HttpClient, config: HealthConfig) {
    let mut ticker = tokio::time::interval(config.interval());
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // A worker just added is checked at once, not an interval later
        // (the next round re-checks the rest early; harmless).
        tokio::select! {
            _ = ticker.tick() => {}
            () = registry.worker_added() => {}
        }
        let workers = registry.all();
        let probes = workers.iter().map(|worker| {
            let client = &client;
            let config = &config;
            let registry = &registry;
            async move {
                // One side request to an engine at a time: a load poll of
                // it shares this turn (see `Worker::side_turn`).
                let _turn = worker.side_turn().await;
                let passed = probe(client, worker, config).await;
                // The list before the verdict: a worker coming into
                // rotation is routed by what it serves from its first
                // request on.
                if passed {
                    refresh_models(client, registry, worker, config).await;
                }
                record_probe(worker, passed, config);
                telemetry::worker_health(worker.url(), worker.is_healthy());
            }
        });
        join_all(probes).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::BreakerConfig;

    #[test]
    fn thresholds_apply_to_consecutive_results() {
        let config = HealthConfig {
            health_check_interval_secs: 1,
            health_check_timeout_secs: 1,
            health_failure_threshold: 2,
            health_success_threshold: 2,
            health_check_endpoint: "/health".into(),
        };
        let worker = Worker::new("http://w:1".into(), BreakerConfig::default());
        assert!(!worker.is_checked());
        assert!(
            !record_probe(&worker, true, &config),
            "the first check passed"
        );
        assert!(worker.is_checked());
        assert!(!record_probe(&worker, false, &config));
        assert!(!record_probe(&worker, true, &config), "streak broken");
        assert!(!record_probe(&worker, false, &config));
        assert!(record_probe(&worker, false, &config));
        assert!(!worker.is_healthy());
        assert!(!record_probe(&worker, true, &config));
        assert!(record_probe(&worker, true, &config));
        assert!(worker.is_healthy());
    }

    #[test]
    fn the_first_check_of_an_added_worker_decides_at_once() {
        let config = HealthConfig {
            health_check_interval_secs: 1,
            health_check_timeout_secs: 1,
            health_failure_threshold: 3,
            health_success_threshold: 2,
            health_check_endpoint: "/health".into(),
        };
        let dead = Worker::new("http://w:1".into(), BreakerConfig::default());
        dead.first_check_decides
            .store(true, std::sync::atomic::Ordering::Relaxed);
        assert!(
            record_probe(&dead, false, &config),
            "no waiting for three failures"
        );
        assert!(!dead.is_healthy());
        let seed = Worker::new("http://w:2".into(), BreakerConfig::default());
        assert!(
            !record_probe(&seed, false, &config),
            "a seed keeps the thresholds"
        );
        assert!(seed.is_healthy());
    }
}
