//! `POST` inference routes: read the body once (bounded: `body`), inspect
//! it, admit it, and hand it to the proxy.
//!
//! Each request's accounting is one [`RequestRecord`], started on arrival
//! and ended by whichever exit answers: a refusal or bad body here, or the
//! proxy (its error, or the end of the streamed answer).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::header;

use super::body;
use super::objects;
use super::state::AppState;
use crate::admission::{self, AdmittedBody};
use crate::auth::Forward;
use crate::proxy::{Outgoing, Placement, WorkerPool};
use crate::request::Route;
use crate::telemetry::{self, RequestRecord};
use crate::{engine_h1, otel};

/// Counts a request refused by overload admission and returns its answer.
fn refused(record: RequestRecord, reason: &'static str, response: Response) -> Response {
    telemetry::admission_rejected(reason);
    record.respond(response)
}

/// Handles one inference request on `route`: read its body (bounded in
/// size, time and the replica's buffer budget), inspect it, admit it, and
/// forward it. Admission comes after the body, so a client trickling its
/// body holds a connection and budget bytes, never a proxying slot.
pub async fn handle(State(app): State<Arc<AppState>>, route: Route, request: Request) -> Response {
    let span = otel::request_span(route.label(), app.policy.name(), request.headers());
    let record = RequestRecord::start(app.route_metrics[route.index()].clone()).with_span(span);
    let (parts, body) = request.into_parts();
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let limits = body::BodyLimits {
        max_bytes: app.config.proxy.max_payload_bytes,
        idle: app.config.front.body_timeout(),
        deadline: app.config.front.body_deadline(),
    };
    let read = match body::read(body, declared, limits, &app.buffer_budget).await {
        Ok(read) => read,
        Err(body::Refusal::Budget(error)) => {
            // The body was never read, so the connection cannot carry
            // another request: say so, or a client reuses it and its next
            // request fails mid-send.
            let mut response = admission::reject_response(error);
            response
                .headers_mut()
                .insert(header::CONNECTION, http::HeaderValue::from_static("close"));
            return refused(record, "request_buffer_full", response);
        }
        Err(body::Refusal::Body(error)) => return record.respond(error.into_response()),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok());
    let text_limit = app.policy.prompt_text_limit();
    let mut info = match body::inspect(route, &read.bytes, content_type, text_limit).await {
        Ok(info) => info,
        Err(error) => return record.respond(error.into_response()),
    };
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
    if let Some(kv) = app.policy.kv_events() {
        kv.tokenize_on_engine(&mut info, &app.registry, &app.side_client)
            .await;
    }
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
        Forward::Client => engine_h1::Authorization::Forward,
        Forward::Drop => engine_h1::Authorization::Drop,
        Forward::Worker(key) => engine_h1::Authorization::Set(key),
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
    let body::ReadBody { bytes, reservation } = read;
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
    // The body is no longer held (retries are over): its budget goes back.
    drop(reservation);
    match permit {
        Some(permit) => AdmittedBody::wrap(response, permit),
        None => response,
    }
}
