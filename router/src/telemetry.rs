//! Prometheus metrics: names, buckets, and the recorder.
//!
//! Counters and histograms are recorded where things happen; per-worker
//! gauges (in-flight, health, circuit) are refreshed from the registry at
//! scrape time so they are exact and cost nothing on the request path.

use std::sync::OnceLock;

use metrics::{counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shoal_proto::LoadSnapshot;

use crate::workers::{Registry, Worker};

/// Requests by route and final status.
pub const REQUESTS_TOTAL: &str = "shoal_requests_total";
/// Whole request duration, seconds, by route.
pub const REQUEST_DURATION: &str = "shoal_request_duration_seconds";
/// Time to the worker's response headers, seconds, by route.
pub const TIME_TO_FIRST_BYTE: &str = "shoal_time_to_first_byte_seconds";
/// Time to the first body chunk (first token when streaming), seconds, by route.
pub const TIME_TO_FIRST_TOKEN: &str = "shoal_time_to_first_token_seconds";
/// Retries by route and reason.
pub const RETRIES_TOTAL: &str = "shoal_retries_total";
/// Requests in flight per worker (this replica's bookings).
pub const WORKER_INFLIGHT_REQUESTS: &str = "shoal_worker_inflight_requests";
/// Token-work in flight per worker.
pub const WORKER_INFLIGHT_TOKENS: &str = "shoal_worker_inflight_tokens";
/// 1 when the worker passes health checks.
pub const WORKER_HEALTHY: &str = "shoal_worker_healthy";
/// 0 closed, 1 open, 2 half-open.
pub const WORKER_CIRCUIT_STATE: &str = "shoal_worker_circuit_state";
/// Load polls by worker, engine and outcome.
pub const LOAD_POLLS_TOTAL: &str = "shoal_load_polls_total";
/// Failed load polls by worker and reason.
pub const LOAD_POLL_ERRORS_TOTAL: &str = "shoal_load_poll_errors_total";
/// Polled engine KV usage 0..1.
pub const ENGINE_TOKEN_USAGE: &str = "shoal_engine_token_usage";
/// Polled engine waiting requests.
pub const ENGINE_WAITING_REQUESTS: &str = "shoal_engine_waiting_requests";
/// Polled engine running requests.
pub const ENGINE_RUNNING_REQUESTS: &str = "shoal_engine_running_requests";
/// Polled engine generation throughput, tokens/s.
pub const ENGINE_GEN_THROUGHPUT: &str = "shoal_engine_gen_throughput";
/// Polled engine queued (uncached) prompt tokens.
pub const ENGINE_QUEUED_TOKENS: &str = "shoal_engine_queued_tokens";
/// Workers registered / available.
pub const WORKERS: &str = "shoal_workers";
/// Inference requests refused by overload admission, by reason.
pub const ADMISSION_REJECTED_TOTAL: &str = "shoal_admission_rejected_total";

const LATENCY_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0,
    120.0, 300.0, 600.0,
];

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Installs the global Prometheus recorder once per process and returns
/// its handle; `None` if another recorder was installed first.
pub fn install() -> Option<PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), LATENCY_BUCKETS)
                .ok()?;
            match builder.install_recorder() {
                Ok(handle) => {
                    describe();
                    shoal_mesh::describe_metrics();
                    Some(handle)
                }
                Err(err) => {
                    tracing::warn!(error = %err, "metrics recorder not installed");
                    None
                }
            }
        })
        .clone()
}

/// Registers HELP text for every router metric (Prometheus tooling such as
/// `promtool check metrics` expects it).
fn describe() {
    use metrics::{Unit, describe_counter, describe_gauge, describe_histogram};
    describe_counter!(
        REQUESTS_TOTAL,
        "Finished requests by route and final status."
    );
    describe_histogram!(
        REQUEST_DURATION,
        Unit::Seconds,
        "Whole request duration, streaming included."
    );
    describe_histogram!(
        TIME_TO_FIRST_BYTE,
        Unit::Seconds,
        "Time until the worker's response headers."
    );
    describe_histogram!(
        TIME_TO_FIRST_TOKEN,
        Unit::Seconds,
        "Time until the first response body chunk (the first token when streaming)."
    );
    describe_counter!(
        RETRIES_TOTAL,
        "Retries on another worker, by route and reason."
    );
    describe_gauge!(
        WORKER_INFLIGHT_REQUESTS,
        "Requests this replica has in flight per worker."
    );
    describe_gauge!(
        WORKER_INFLIGHT_TOKENS,
        "Token-work this replica has in flight per worker."
    );
    describe_gauge!(
        WORKER_HEALTHY,
        "1 when the worker passes health checks, else 0."
    );
    describe_gauge!(
        WORKER_CIRCUIT_STATE,
        "Circuit breaker: 0 closed, 1 open, 2 half-open."
    );
    describe_counter!(
        LOAD_POLLS_TOTAL,
        "Engine load polls by worker, engine and outcome."
    );
    describe_counter!(
        LOAD_POLL_ERRORS_TOTAL,
        "Failed engine load polls by worker and reason."
    );
    describe_gauge!(
        ENGINE_TOKEN_USAGE,
        "Last polled engine KV-cache usage, 0..1."
    );
    describe_gauge!(
        ENGINE_WAITING_REQUESTS,
        "Last polled engine waiting requests."
    );
    describe_gauge!(
        ENGINE_RUNNING_REQUESTS,
        "Last polled engine running requests."
    );
    describe_gauge!(
        ENGINE_QUEUED_TOKENS,
        "Last polled engine queued prompt tokens not served from cache."
    );
    describe_gauge!(
        ENGINE_GEN_THROUGHPUT,
        "Last polled engine generation throughput, tokens per second."
    );
    describe_gauge!(WORKERS, "Workers registered and available.");
    describe_counter!(
        ADMISSION_REJECTED_TOTAL,
        "Inference requests refused by overload admission (--max-concurrent-requests): queue_full (429), queue_timeout (503) or fleet_saturated (503, --worker-max-inflight)."
    );
}

/// Records one request refused by overload admission.
pub fn admission_rejected(reason: &'static str) {
    counter!(ADMISSION_REJECTED_TOTAL, "reason" => reason).increment(1);
}

/// Records a finished request.
pub fn request_done(route: &'static str, status: u16, seconds: f64) {
    counter!(REQUESTS_TOTAL, "route" => route, "status" => status.to_string()).increment(1);
    histogram!(REQUEST_DURATION, "route" => route).record(seconds);
}

/// Records the time until the worker's response headers.
pub fn first_byte(route: &'static str, seconds: f64) {
    histogram!(TIME_TO_FIRST_BYTE, "route" => route).record(seconds);
}

/// Records the time until the first body chunk.
pub fn first_token(route: &'static str, seconds: f64) {
    histogram!(TIME_TO_FIRST_TOKEN, "route" => route).record(seconds);
}

/// Records one retry.
pub fn retry(route: &'static str, reason: &'static str) {
    counter!(RETRIES_TOTAL, "route" => route, "reason" => reason).increment(1);
}

/// Records a worker's health after a check.
pub fn worker_health(worker: &Worker) {
    gauge!(WORKER_HEALTHY, "worker" => worker.url().to_string()).set(if worker.is_healthy() {
        1.0
    } else {
        0.0
    });
}

/// Records the outcome of one load poll.
pub fn load_poll(worker: &str, engine: &'static str, outcome: Result<&LoadSnapshot, &'static str>) {
    match outcome {
        Ok(snapshot) => {
            counter!(LOAD_POLLS_TOTAL, "worker" => worker.to_string(), "engine" => engine, "outcome" => "ok")
                .increment(1);
            let load = &snapshot.load;
            let set = |name: &'static str, value: Option<f64>| {
                if let Some(value) = value {
                    gauge!(name, "worker" => worker.to_string()).set(value);
                }
            };
            set(ENGINE_TOKEN_USAGE, load.token_usage);
            set(
                ENGINE_WAITING_REQUESTS,
                load.waiting_requests.map(|v| v as f64),
            );
            set(
                ENGINE_RUNNING_REQUESTS,
                load.running_requests.map(|v| v as f64),
            );
            set(ENGINE_QUEUED_TOKENS, load.queued_tokens.map(|v| v as f64));
            set(ENGINE_GEN_THROUGHPUT, load.gen_throughput);
        }
        Err(reason) => {
            counter!(LOAD_POLLS_TOTAL, "worker" => worker.to_string(), "engine" => engine, "outcome" => "error")
                .increment(1);
            counter!(LOAD_POLL_ERRORS_TOTAL, "worker" => worker.to_string(), "reason" => reason)
                .increment(1);
        }
    }
}

/// Refreshes per-worker gauges from the registry, then renders the text
/// exposition format.
pub fn render(handle: &PrometheusHandle, registry: &Registry) -> String {
    let workers = registry.all();
    let mut available = 0u32;
    for worker in workers.iter() {
        let url = worker.url().to_string();
        let ledger = worker.ledger();
        gauge!(WORKER_INFLIGHT_REQUESTS, "worker" => url.clone())
            .set(ledger.inflight_requests() as f64);
        gauge!(WORKER_INFLIGHT_TOKENS, "worker" => url.clone())
            .set(ledger.inflight_tokens() as f64);
        gauge!(WORKER_CIRCUIT_STATE, "worker" => url).set(worker.breaker().state().as_gauge());
        worker_health(worker);
        available += u32::from(worker.is_available());
    }
    gauge!(WORKERS, "state" => "registered").set(workers.len() as f64);
    gauge!(WORKERS, "state" => "available").set(f64::from(available));
    handle.render()
}

/// Runs the exporter's periodic housekeeping (histogram rotation) forever.
pub async fn upkeep(handle: PrometheusHandle) {
    let mut ticker = tokio::time::interval(std::time::Duration::from_secs(5));
    loop {
        ticker.tick().await;
        handle.run_upkeep();
    }
}
