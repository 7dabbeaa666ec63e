//! Forwarding one request: select, book, send, retry, stream back.
//!
//! A request is retried on a re-selected worker after a connect/transport
//! error or a retryable status (408, 429, 500, 502, 503, 504) — only while
//! nothing has been sent to the client, so a retry can never duplicate or
//! splice a response. The last worker's answer passes through once retries
//! are used up; if none answered, the client gets 502 or 504 with the reason.

mod body;
mod retry;

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, HeaderName, Request, StatusCode, header};
use http_body_util::Full;

use crate::http::errors::ApiError;
use crate::http::state::AppState;
use crate::request::{RequestInfo, Route};
use crate::telemetry;
use crate::upstream;
use crate::workers::Worker;

pub use body::TrackedBody;
pub use retry::RetryConfig;

/// Headers that describe one hop's connection and must not be forwarded.
const HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

fn strip_hop_by_hop(headers: &mut HeaderMap) {
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

fn is_retryable(status: StatusCode) -> bool {
    matches!(status.as_u16(), 408 | 429 | 500 | 502 | 503 | 504)
}

/// Explains an empty candidate set to the client.
fn no_workers_reason(workers: &[Arc<Worker>]) -> String {
    if workers.is_empty() {
        return "no workers are registered (pass --worker-urls or POST /workers)".into();
    }
    let unhealthy = workers.iter().filter(|w| !w.is_healthy()).count();
    let open = workers
        .iter()
        .filter(|w| w.is_healthy() && !w.breaker().allows())
        .count();
    format!(
        "no healthy worker available: {} registered, {unhealthy} failing health checks, {open} with an open circuit",
        workers.len()
    )
}

enum Failure {
    Transport(String),
    Timeout,
}

/// Routes and proxies one inference request whose body was already read.
pub async fn forward(
    app: &AppState,
    route: Route,
    headers: &HeaderMap,
    path_and_query: &str,
    body: Bytes,
    info: &RequestInfo,
    started: Instant,
) -> Response {
    let deadline = tokio::time::Instant::from_std(started) + app.request_timeout;
    let max_retries = app.config.max_retries();
    let mut tried: Vec<Arc<Worker>> = Vec::new();
    let mut last_failure: Option<Failure> = None;

    for attempt in 0..=max_retries {
        let all = app.registry.all();
        let available: Vec<Arc<Worker>> =
            all.iter().filter(|w| w.is_available()).cloned().collect();
        // Prefer workers not tried yet; fall back to all available ones.
        let untried: Vec<Arc<Worker>> = available
            .iter()
            .filter(|w| !tried.iter().any(|t| Arc::ptr_eq(t, w)))
            .cloned()
            .collect();
        let candidates = if untried.is_empty() {
            available
        } else {
            untried
        };
        if candidates.is_empty() {
            if last_failure.is_none() {
                let error = ApiError::no_workers(no_workers_reason(&all));
                telemetry::request_done(
                    route.label(),
                    error.status.as_u16(),
                    started.elapsed().as_secs_f64(),
                );
                return error.into_response();
            }
            break;
        }
        let Some(worker) = app
            .policy
            .select(&candidates, info, app.fleet.as_ref())
            .and_then(|i| candidates.get(i).cloned())
        else {
            let error =
                ApiError::no_workers(format!("policy {} selected no worker", app.policy.name()));
            telemetry::request_done(
                route.label(),
                error.status.as_u16(),
                started.elapsed().as_secs_f64(),
            );
            return error.into_response();
        };
        let booking = worker
            .ledger()
            .book(info.prompt_tokens, app.policy.token_work(info));
        tried.push(worker.clone());
        let has_retry_left = attempt < max_retries && tokio::time::Instant::now() < deadline;

        let request = match build_request(&worker, headers, path_and_query, body.clone()) {
            Ok(request) => request,
            Err(err) => {
                return ApiError::bad_request(
                    "bad_path",
                    format!("cannot forward to {}: {err}", worker.url()),
                )
                .into_response();
            }
        };
        let sent = tokio::time::timeout_at(deadline, app.client.request(request)).await;
        let response = match sent {
            Err(_elapsed) => {
                worker.breaker().record_failure();
                last_failure = Some(Failure::Timeout);
                break;
            }
            Ok(Err(err)) => {
                worker.breaker().record_failure();
                let reason = upstream::error_chain(&err);
                tracing::warn!(worker = worker.url(), attempt, error = %reason, "worker request failed");
                last_failure = Some(Failure::Transport(format!("{}: {reason}", worker.url())));
                if has_retry_left {
                    telemetry::retry(route.label(), "transport");
                    app.retry.sleep(attempt, deadline).await;
                    continue;
                }
                break;
            }
            Ok(Ok(response)) => response,
        };

        let status = response.status();
        if status.is_server_error() {
            worker.breaker().record_failure();
        } else {
            worker.breaker().record_success();
        }
        if is_retryable(status) && has_retry_left {
            tracing::info!(worker = worker.url(), attempt, %status, "retrying on another worker");
            telemetry::retry(route.label(), "status");
            drop(response);
            drop(booking);
            app.retry.sleep(attempt, deadline).await;
            continue;
        }
        telemetry::first_byte(route.label(), started.elapsed().as_secs_f64());
        let (mut parts, incoming) = response.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let tracked = TrackedBody::new(
            incoming,
            booking,
            worker,
            deadline,
            route.label(),
            status.as_u16(),
            started,
        );
        return Response::from_parts(parts, Body::new(tracked));
    }

    let error = match last_failure {
        Some(Failure::Timeout) => ApiError::gateway_timeout(format!(
            "no worker answered within --request-timeout-secs ({}s)",
            app.request_timeout.as_secs()
        )),
        Some(Failure::Transport(reason)) => ApiError::bad_gateway(format!(
            "all {} attempt(s) failed; last: {reason}",
            tried.len()
        )),
        None => ApiError::no_workers("no worker available"),
    };
    telemetry::request_done(
        route.label(),
        error.status.as_u16(),
        started.elapsed().as_secs_f64(),
    );
    error.into_response()
}

fn build_request(
    worker: &Worker,
    headers: &HeaderMap,
    path_and_query: &str,
    body: Bytes,
) -> Result<Request<Full<Bytes>>, http::Error> {
    let uri = upstream::join(worker.url(), path_and_query)?;
    let mut request = Request::post(uri).body(Full::new(body))?;
    let forwarded = request.headers_mut();
    for (name, value) in headers {
        if name != header::HOST && name != header::CONTENT_LENGTH {
            forwarded.append(name.clone(), value.clone());
        }
    }
    strip_hop_by_hop(forwarded);
    Ok(request)
}

/// Timeout for the whole request, from the config.
pub fn request_timeout(config: &crate::config::Config) -> Duration {
    Duration::from_secs(config.request_timeout_secs)
}
