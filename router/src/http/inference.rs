//! `POST` inference routes: admit, read the body once (bounded), inspect
//! it, and hand it to the proxy.
//!
//! Each request's accounting is one [`RequestRecord`], started on arrival
//! and ended by whichever exit answers: a refusal or bad body here, or the
//! proxy (its error, or the end of the streamed answer).

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::header;
use http_body_util::{BodyExt, Limited};

use super::objects;
use super::state::AppState;
use crate::admission::{self, AdmittedBody};
use crate::auth::Forward;
use crate::error::ApiError;
use crate::proxy::{Outgoing, Placement, WorkerPool};
use crate::request::{self, Route};
use crate::telemetry::{self, RequestRecord};
use crate::{link, otel};

/// Reads the whole body, at most `limit` bytes, giving up with 408 when
/// `idle` passes without a byte arriving (a client that declares a body
/// and then stalls must not hold the request and its connection).
async fn read_body(
    body: Body,
    limit: usize,
    declared: Option<u64>,
    idle: Duration,
) -> Result<Bytes, ApiError> {
    if declared.is_some_and(|len| len > limit as u64) {
        return Err(ApiError::payload_too_large(limit));
    }
    let mut body = Limited::new(body, limit);
    let mut chunks: Vec<Bytes> = Vec::new();
    loop {
        let frame = match tokio::time::timeout(idle, body.frame()).await {
            Err(_elapsed) => {
                telemetry::client_connection_closed("body_timeout");
                return Err(ApiError::request_timeout(format!(
                    "the request body stalled for --client-body-timeout-secs ({}s)",
                    idle.as_secs()
                )));
            }
            Ok(None) => break,
            Ok(Some(frame)) => frame,
        };
        match frame {
            Ok(frame) => {
                if let Ok(data) = frame.into_data() {
                    chunks.push(data);
                }
            }
            Err(err) if err.is::<http_body_util::LengthLimitError>() => {
                return Err(ApiError::payload_too_large(limit));
            }
            Err(err) => {
                return Err(ApiError::bad_request(
                    "body_read_failed",
                    format!("could not read the request body: {err}"),
                ));
            }
        }
    }
    Ok(match chunks.len() {
        0 => Bytes::new(),
        1 => chunks.swap_remove(0),
        _ => chunks.concat().into(),
    })
}

/// Counts a request refused by overload admission and returns its answer.
fn refused(record: RequestRecord, reason: &'static str, response: Response) -> Response {
    telemetry::admission_rejected(reason);
    record.respond(response)
}

/// Handles one inference request on `route`.
pub async fn handle(State(app): State<Arc<AppState>>, route: Route, request: Request) -> Response {
    let span = otel::request_span(route.label(), app.policy.name(), request.headers());
    let record = RequestRecord::start(app.route_metrics[route.index()].clone()).with_span(span);
    let permit = match app.admission.admit().await {
        Ok(permit) => permit,
        Err(rejection) => {
            let response = app.admission.response(rejection);
            return refused(record, rejection.label(), response);
        }
    };
    let cap = app.config.proxy.worker_max_inflight;
    if cap > 0
        && let Some(error) =
            admission::fleet_saturated(cap, &app.registry.all(), app.fleet.as_ref())
    {
        let response = admission::reject_response(error);
        return refused(record, "fleet_saturated", response);
    }
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let result = async {
        let idle = app.config.front.body_timeout();
        let bytes = read_body(body, app.config.proxy.max_payload_bytes, declared, idle).await?;
        let content_type = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok());
        let want_text = app.policy.needs_request_text();
        let info = request::inspect_route(route, &bytes, content_type, want_text)
            .map_err(|err| ApiError::invalid_json(err.to_string()))?;
        Ok::<_, ApiError>((bytes, info))
    }
    .await;
    let (bytes, info) = match result {
        Ok(ok) => ok,
        Err(error) => return record.respond(error.into_response()),
    };
    let path_and_query = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or(route.path());
    let workers = WorkerPool {
        registry: &app.registry,
        policy: app.policy.as_ref(),
        fleet: app.fleet.as_ref(),
    };
    if let (Some(span), Some(model)) = (record.span(), info.model.as_deref()) {
        span.record("gen_ai.request.model", model);
    }
    let traceparent = record.span().and_then(otel::traceparent);
    let auth = app.auth.load();
    let authorization = match auth.forward() {
        Forward::Client => link::Authorization::Forward,
        Forward::Drop => link::Authorization::Drop,
        Forward::Worker(key) => link::Authorization::Set(key),
    };
    let plan = objects::plan(
        route,
        &parts.method,
        parts.uri.path(),
        info.builds_on.as_deref(),
    );
    let plan = match plan {
        Ok(plan) => plan,
        Err(error) => return record.respond(error.into_response()),
    };
    let mut outgoing = Outgoing {
        method: &parts.method,
        headers: &parts.headers,
        authorization,
        traceparent: traceparent.as_ref(),
        path_and_query,
        body: bytes,
        info: &info,
        placement: Placement::Any,
        learn: None,
    };
    if let Some(plan) = plan
        && let Err(error) = objects::place(&app, workers, &mut outgoing, plan).await
    {
        return record.respond(error.into_response());
    }
    let response = app.forwarder.forward(workers, outgoing, record).await;
    match permit {
        Some(permit) => AdmittedBody::wrap(response, permit),
        None => response,
    }
}
