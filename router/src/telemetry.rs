//! Prometheus metrics: names, buckets, and the recorder.
//!
//! Counters and histograms are recorded where things happen; per-worker
//! gauges (in-flight, health, circuit) are refreshed from the registry at
//! scrape time so they are exact and cost nothing on the request path.

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use metrics::{Counter, Histogram, counter, gauge, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use shoal_proto::LoadSnapshot;

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
/// Failed attempts a retry was withheld from because the request may have
/// run at the engine and its method is not idempotent, by route and reason.
pub const RETRIES_UNSAFE_TOTAL: &str = "shoal_retries_unsafe_total";
/// Broken streams and what became of them, by route and outcome
/// (`resumed`, `completed`, `ineligible`, `exhausted`, `failed`).
pub const MIGRATIONS_TOTAL: &str = "shoal_migrations_total";
/// Requests of a disaggregated fleet by protocol and path
/// (`disaggregated`, `decode_only`, `prefill_failed`).
pub const DISAGG_REQUESTS_TOTAL: &str = "shoal_disagg_requests_total";
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
/// Requests waiting in this replica's admission queue, by class.
pub const ADMISSION_QUEUED: &str = "shoal_admission_queued";
/// Counter of a tenant's requests admitted, by tenant.
pub const TENANT_ADMITTED_TOTAL: &str = "shoal_tenant_admitted_total";
/// Counter of a tenant's requests refused, by tenant and reason.
pub const TENANT_REJECTIONS_TOTAL: &str = "shoal_tenant_rejections_total";
/// Counter of refused requests, by scope (inference, admin) and reason.
pub const AUTH_FAILURES_TOTAL: &str = "shoal_auth_failures_total";
/// Counter of client connections closed or refused by the front's limits.
pub const CLIENT_CONNECTIONS_CLOSED_TOTAL: &str = "shoal_client_connections_closed_total";
/// Counter of configuration reloads (SIGHUP), by result.
pub const CONFIG_RELOADS_TOTAL: &str = "shoal_config_reloads_total";
/// Counter of discovery failures, by kind (client, list, watch_start, gone, ...).
pub const DISCOVERY_ERRORS_TOTAL: &str = "shoal_discovery_errors_total";
/// Gauge: Ready endpoints discovery found at its last change.
pub const DISCOVERED_ENDPOINTS: &str = "shoal_discovered_endpoints";
/// Gauge: EndpointSlices discovery could not use at its last change, by
/// reason.
pub const DISCOVERY_SKIPPED_SLICES: &str = "shoal_discovery_skipped_slices";
/// Counter of background tasks restarted after a panic, by task.
pub const BACKGROUND_TASK_RESTARTS_TOTAL: &str = "shoal_background_task_restarts_total";

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
                    zero_series();
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

/// Creates the series of rare events at 0 (Prometheus practice for known
/// label values): a dashboard or alert then reads 0, not "no data", and
/// CI can check every dashboard expression against a live scrape.
fn zero_series() {
    for reason in [
        "queue_full",
        "queue_timeout",
        "fleet_saturated",
        "request_buffer_full",
        "shed",
    ] {
        counter!(ADMISSION_REJECTED_TOTAL, "reason" => reason).increment(0);
    }
    for scope in ["inference", "admin"] {
        for reason in ["missing", "invalid", "no_admin_key", "not_loopback"] {
            counter!(AUTH_FAILURES_TOTAL, "scope" => scope, "reason" => reason).increment(0);
        }
    }
    for result in ["applied", "rejected"] {
        counter!(CONFIG_RELOADS_TOTAL, "result" => result).increment(0);
    }
    for reason in [
        "header_timeout",
        "idle_timeout",
        "evicted",
        "body_timeout",
        "body_deadline",
        "limit",
        "accept_error",
    ] {
        counter!(CLIENT_CONNECTIONS_CLOSED_TOTAL, "reason" => reason).increment(0);
    }
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
    describe_counter!(
        RETRIES_UNSAFE_TOTAL,
        "Failed attempts not retried because the whole request reached the engine and its method is not idempotent (the failure or the engine's answer went to the client), by route and reason."
    );
    describe_counter!(
        DISAGG_REQUESTS_TOTAL,
        "Requests of a disaggregated fleet by protocol and path: disaggregated (prefilled on the prefill pool, decoded on the decode pool), decode_only (a prompt under --pd-min-prompt-tokens), prefill_failed (vllm: decoded with a local prefill; sglang: 502 or 503)."
    );
    describe_counter!(
        MIGRATIONS_TOTAL,
        "Streams whose engine connection broke, by route and outcome: resumed (a continuation on another worker took over), completed (nothing was left to generate), ineligible (the request or stream cannot be continued), exhausted (--migration-limit used up), failed (no worker took the continuation)."
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
    describe_gauge!(
        ADMISSION_QUEUED,
        "Requests waiting in this replica's admission queue (--max-concurrent-requests), by class."
    );
    describe_counter!(
        ADMISSION_REJECTED_TOTAL,
        "Inference requests refused by admission: queue_full (429) or queue_timeout (503) of --max-concurrent-requests, fleet_saturated (503, --worker-max-inflight), shed (429: a sheddable request at --sheddable-max-inflight, or giving its queue place to a higher class), request_buffer_full (503, --max-buffered-request-bytes), and the tenant limits' tenant_rate_limited, tenant_tokens_exhausted, tenant_concurrency (429)."
    );
    describe_counter!(
        TENANT_ADMITTED_TOTAL,
        "Requests of each tenant of --tenants-file admitted by this replica."
    );
    describe_counter!(
        TENANT_REJECTIONS_TOTAL,
        "Requests of each tenant refused by this replica (429), by reason: tenant_rate_limited, tenant_tokens_exhausted, tenant_concurrency; the limits hold fleet-wide."
    );
    describe_counter!(
        AUTH_FAILURES_TOTAL,
        "Requests refused by the API-key gate, by scope (inference, admin) and reason (missing, invalid, no_admin_key: an admin write with no --admin-api-key, not_loopback: one from a remote client under --allow-loopback-admin-writes)."
    );
    describe_counter!(
        CLIENT_CONNECTIONS_CLOSED_TOTAL,
        "Client connections the front closed: header_timeout (no complete request in --client-header-timeout-secs from opening, whatever was sent), idle_timeout (a keep-alive or HTTP/2 connection with nothing in flight for that long), evicted (idle, closed to make room at --max-client-connections), body_timeout (a body stalled past --client-body-timeout-secs), body_deadline (a body longer than --client-body-deadline-secs in all), limit (at --max-client-connections with nothing idle to close), accept_error (e.g. out of descriptors)."
    );
    describe_counter!(
        CONFIG_RELOADS_TOTAL,
        "Configuration reloads on SIGHUP: applied, or rejected (the file did not parse or validate; nothing changed)."
    );
    describe_counter!(
        DISCOVERY_ERRORS_TOTAL,
        "Kubernetes discovery failures by kind: client (no credentials), list, watch_start, gone (410, re-listed), watch_status, watch_failed, no_resource_version. The watch retries with backoff and keeps the last known endpoints."
    );
    describe_gauge!(
        DISCOVERED_ENDPOINTS,
        "Ready endpoints Kubernetes discovery found at its last change."
    );
    describe_gauge!(
        DISCOVERY_SKIPPED_SLICES,
        "EndpointSlices discovery could not use at its last change, by reason: ambiguous_port (several ports and no --discovery-port), no_port (the named port is not listed), address_type (FQDN)."
    );
    describe_counter!(
        BACKGROUND_TASK_RESTARTS_TOTAL,
        "Background tasks (health, load, sources, reload, discovery, policy, metrics upkeep) restarted after a panic, by task."
    );
}

/// Counts one background task restarted after a panic.
pub fn background_task_restarted(task: &'static str) {
    counter!(BACKGROUND_TASK_RESTARTS_TOTAL, "task" => task).increment(1);
}

/// Records how many EndpointSlices discovery skipped for `reason`.
pub fn discovery_skipped_slices(reason: &'static str, count: usize) {
    gauge!(DISCOVERY_SKIPPED_SLICES, "reason" => reason).set(count as f64);
}

/// Counts one request the API-key gate refused.
pub fn auth_failure(scope: &'static str, reason: &'static str) {
    counter!(AUTH_FAILURES_TOTAL, "scope" => scope, "reason" => reason).increment(1);
}

/// Counts one client connection the front closed, by `reason`.
pub fn client_connection_closed(reason: &'static str) {
    counter!(CLIENT_CONNECTIONS_CLOSED_TOTAL, "reason" => reason).increment(1);
}

/// Counts one configuration reload by `result` (`applied`, `rejected`).
pub fn config_reload(result: &'static str) {
    counter!(CONFIG_RELOADS_TOTAL, "result" => result).increment(1);
}

/// Counts one discovery failure of `kind`.
pub fn discovery_error(kind: &'static str) {
    counter!(DISCOVERY_ERRORS_TOTAL, "kind" => kind).increment(1);
}

/// Records how many Ready endpoints discovery found.
pub fn discovered_endpoints(count: usize) {
    gauge!(DISCOVERED_ENDPOINTS).set(count as f64);
}

/// Records one request refused by overload admission.
pub fn admission_rejected(reason: &'static str) {
    counter!(ADMISSION_REJECTED_TOTAL, "reason" => reason).increment(1);
}

/// The per-request metrics of one route, registered once with the recorder
/// in place when made, so the request path records into handles instead
/// of looking each metric up by name and labels (a hash and a string per
/// metric per request).
#[derive(Debug)]
pub struct RouteMetrics {
    route: &'static str,
    duration: Histogram,
    first_byte: Histogram,
    first_token: Histogram,
    /// `shoal_requests_total{status="200"}`, by far the most common series.
    ok: Counter,
}

impl RouteMetrics {
    /// Registers the metrics of `route` (a label) with the current recorder.
    pub fn register(route: &'static str) -> Self {
        // Retries are rare: their series start at 0 (see `zero_series`).
        for reason in ["status", "transport", "attempt_timeout"] {
            counter!(RETRIES_TOTAL, "route" => route, "reason" => reason).increment(0);
            counter!(RETRIES_UNSAFE_TOTAL, "route" => route, "reason" => reason).increment(0);
        }
        Self {
            route,
            duration: histogram!(REQUEST_DURATION, "route" => route),
            first_byte: histogram!(TIME_TO_FIRST_BYTE, "route" => route),
            first_token: histogram!(TIME_TO_FIRST_TOKEN, "route" => route),
            ok: counter!(REQUESTS_TOTAL, "route" => route, "status" => "200"),
        }
    }

    /// Counts a finished request.
    fn request_done(&self, status: u16, seconds: f64) {
        if status == 200 {
            self.ok.increment(1);
        } else {
            counter!(REQUESTS_TOTAL, "route" => self.route, "status" => status.to_string())
                .increment(1);
        }
        self.duration.record(seconds);
    }
}

/// The end-of-request accounting of one inference request
/// ([`REQUESTS_TOTAL`], [`REQUEST_DURATION`]), as a guard.
///
/// Why a guard: a request leaves the router through many exits (refused,
/// unreadable body, no worker, failed attempts, a streamed answer that ends
/// or is dropped); with a counter call at each exit, one is easily
/// missed. So the handler creates one record per request and every exit
/// ends it: [`RequestRecord::respond`] for an answer complete at once, or by
/// handing it (with its status set) to the body that streams the answer,
/// which drops it when the stream ends. The record counts when dropped,
/// once, and only if a status was set: a request whose client went away
/// before any answer existed is not counted, as before.
#[derive(Debug)]
#[must_use = "a request is counted when its record is ended"]
pub struct RequestRecord {
    metrics: Arc<RouteMetrics>,
    started: Instant,
    status: Option<u16>,
    /// The request's OpenTelemetry span, when tracing is on: it ends with
    /// the record, so a stream's span lasts until the stream does.
    span: Option<tracing::Span>,
}

impl RequestRecord {
    /// Starts the record of a request on the route `metrics` belong to.
    pub fn start(metrics: Arc<RouteMetrics>) -> Self {
        Self {
            metrics,
            started: Instant::now(),
            status: None,
            span: None,
        }
    }

    /// The same record, traced by `span` (see `otel`).
    pub fn with_span(mut self, span: Option<tracing::Span>) -> Self {
        self.span = span;
        self
    }

    /// The request's span, when tracing is on.
    pub fn span(&self) -> Option<&tracing::Span> {
        self.span.as_ref()
    }

    /// The route label, for the other per-route metrics of this request.
    pub fn route(&self) -> &'static str {
        self.metrics.route
    }

    /// When the request arrived: its deadline and latencies count from here.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Records the time until the worker's response headers, now.
    pub fn first_byte(&self) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.first_byte.record(seconds);
    }

    /// Records the time until the first body chunk (the first token when
    /// streaming), now.
    pub fn first_token(&self) {
        let seconds = self.started.elapsed().as_secs_f64();
        self.metrics.first_token.record(seconds);
        if let Some(span) = &self.span {
            span.record("shoal.ttft_ms", seconds * 1000.0);
        }
    }

    /// Sets the final status; the request is counted with it when the
    /// record is dropped (for a streamed answer: when the stream ends).
    pub fn set_status(&mut self, status: u16) {
        self.status = Some(status);
        if let Some(span) = &self.span {
            span.record("http.response.status_code", status);
        }
    }

    /// Counts the request now with `response`'s status and returns the
    /// response: the exit for every answer that is complete at once.
    pub fn respond<B>(mut self, response: http::Response<B>) -> http::Response<B> {
        self.set_status(response.status().as_u16());
        drop(self);
        response
    }
}

impl Drop for RequestRecord {
    fn drop(&mut self) {
        if let Some(status) = self.status.take() {
            let seconds = self.started.elapsed().as_secs_f64();
            self.metrics.request_done(status, seconds);
        }
    }
}

/// Records one retry.
pub fn retry(route: &'static str, reason: &'static str) {
    counter!(RETRIES_TOTAL, "route" => route, "reason" => reason).increment(1);
}

/// Records the path of one disaggregated request (see `proxy::disagg`).
pub fn disagg(protocol: &'static str, path: &'static str) {
    counter!(DISAGG_REQUESTS_TOTAL, "protocol" => protocol, "path" => path).increment(1);
}

/// Records what became of one broken stream (see `proxy::migrate`).
pub fn migration(route: &'static str, outcome: &'static str) {
    counter!(MIGRATIONS_TOTAL, "route" => route, "outcome" => outcome).increment(1);
}

/// Records one retry the retry rule withheld (see `retry_rule`).
pub fn retry_unsafe(route: &'static str, reason: &'static str) {
    counter!(RETRIES_UNSAFE_TOTAL, "route" => route, "reason" => reason).increment(1);
}

/// Records a worker's health after a check.
pub fn worker_health(url: &str, healthy: bool) {
    gauge!(WORKER_HEALTHY, "worker" => url.to_string()).set(if healthy { 1.0 } else { 0.0 });
}

/// Records one worker's gauges as the metrics endpoint refreshes them.
pub fn worker_gauges(url: &str, inflight_requests: u64, inflight_tokens: u64, circuit: f64) {
    gauge!(WORKER_INFLIGHT_REQUESTS, "worker" => url.to_string()).set(inflight_requests as f64);
    gauge!(WORKER_INFLIGHT_TOKENS, "worker" => url.to_string()).set(inflight_tokens as f64);
    gauge!(WORKER_CIRCUIT_STATE, "worker" => url.to_string()).set(circuit);
}

/// Records how many workers are registered and available.
pub fn worker_counts(registered: usize, available: usize) {
    gauge!(WORKERS, "state" => "registered").set(registered as f64);
    gauge!(WORKERS, "state" => "available").set(available as f64);
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

/// Renders the text exposition format (refresh the worker gauges first:
/// `workers::Registry::record_gauges`).
pub fn render(handle: &PrometheusHandle) -> String {
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

#[cfg(test)]
mod tests {
    use super::*;

    /// `shoal_requests_total` lines of a render, sorted (the exporter's
    /// order of label sets is not fixed), for exact comparisons.
    fn requests_total(render: &str) -> Vec<&str> {
        let mut lines: Vec<&str> = render
            .lines()
            .filter(|l| l.starts_with(REQUESTS_TOTAL))
            .collect();
        lines.sort_unstable();
        lines
    }

    #[test]
    fn a_request_record_counts_once_with_its_status() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let response = http::Response::builder()
                .status(400)
                .body(())
                .expect("a response");
            let metrics = Arc::new(RouteMetrics::register("generate"));
            let answered = RequestRecord::start(metrics.clone()).respond(response);
            assert_eq!(answered.status(), 400);

            let mut streamed = RequestRecord::start(metrics.clone());
            streamed.set_status(200);
            drop(streamed);

            // Never answered (the client went away first): not counted.
            drop(RequestRecord::start(metrics));
        });
        let render = handle.render();
        assert_eq!(
            requests_total(&render),
            [
                "shoal_requests_total{route=\"generate\",status=\"200\"} 1",
                "shoal_requests_total{route=\"generate\",status=\"400\"} 1",
            ],
            "{render}"
        );
    }
}
