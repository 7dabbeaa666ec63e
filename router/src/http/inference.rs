//! `POST` inference routes: read the body once (bounded: `body`), inspect
//! it, admit it, and hand it to the proxy.
//!
//! Each request's accounting is one [`RequestRecord`], started on arrival
//! and ended by whichever exit answers: a refusal or bad body here, or the
//! proxy (its error, or the end of the streamed answer).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::response::{IntoResponse, Response};
use http::{HeaderName, HeaderValue, StatusCode, header};

use super::body;
use super::objects;
use super::state::AppState;
use crate::admission::{self, AdmittedBody, Ask, Held, Priority, class};
use crate::auth::{self, Forward};
use crate::config::FairShareScope;
use crate::error::{ApiError, RouterAnswer};
use crate::proxy::{
    Disagg, Migratable, Outgoing, Placement, SharedPool, StreamKind, WorkerPool, disagg,
};
use crate::request::RequestInfo;
use crate::request::Route;
use crate::telemetry::{self, RequestRecord};
use crate::tenants::share::FleetShare;
use crate::tenants::stream_usage::{self, UsageChunkFilter};
use crate::tenants::{self, Decision, Tenant, TenantTicket};
use crate::workers::OwnedPoolSide;
use crate::{engine_h1, otel};

/// A rate-limit header for the client.
type RateHeader = (HeaderName, HeaderValue);

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
    let text_limit = app.prompt_text_limit();
    let mut info = match body::inspect(route, &read.bytes, content_type, text_limit).await {
        Ok(info) => info,
        Err(error) => return record.respond(error.into_response()),
    };
    let tenant = tenant_of(&app, &parts.headers);
    let ask = match queue_ask(&app, &parts.headers, tenant.as_deref(), &info) {
        Ok(ask) => ask,
        Err(error) => return record.respond(error.into_response()),
    };
    let grant = match tenant_admission(&app, tenant, &info) {
        Ok(grant) => grant,
        Err(refusal) => return refused(record, refusal.code, *refusal.response),
    };
    let sheddable_cap = app.config.admission.sheddable_max_inflight;
    if ask.priority == Priority::Sheddable
        && let Some(error) =
            admission::shed_at(sheddable_cap, &app.registry.all(), app.fleet.as_ref())
    {
        return refused(record, "shed", admission::reject_response(error));
    }
    let permit = match app.admission.admit(&ask).await {
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
    if let Some(kv) = app.kv_events() {
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
        // A disaggregated fleet's requests that are not split go to its
        // decode pool.
        side: app.disagg.as_ref().map(Disagg::decode_side),
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
    let body::ReadBody {
        mut bytes,
        reservation,
    } = read;
    // A tenant's stream is settled from its usage: ask for it if the
    // client did not (and hide it from the client again below).
    let asked_for_usage = grant.ticket.is_some()
        && info.stream
        && matches!(route, Route::ChatCompletions | Route::Completions)
        && match stream_usage::ask_for_usage(&bytes) {
            Some(rewritten) => {
                bytes = rewritten;
                true
            }
            None => false,
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
        migratable: migratable(&app, route, &info),
    };
    if let Some(plan) = plan
        && let Err(error) = objects::place(&app, workers, &mut outgoing, plan).await
    {
        return record.respond(error.into_response());
    }
    let mut response = match &app.disagg {
        Some(disagg) if disagg.splits(route) => {
            let fleet = disagg::Fleet {
                registry: &app.registry,
                fleet: app.fleet.as_ref(),
                side_client: &app.side_client,
            };
            // Boxed: the split path's future is twice the size of the
            // rest of this one, and without the box every request's future
            // would be that big (the front copies it into its box whole).
            Box::pin(disagg.forward(&app.forwarder, fleet, outgoing, record)).await
        }
        _ => app.forwarder.forward(workers, outgoing, record).await,
    };
    // The body is no longer held (retries are over): its budget goes back.
    drop(reservation);
    let mut ticket = grant.ticket;
    let engine_answered = response.extensions().get::<RouterAnswer>().is_none();
    if let Some(ticket) = &mut ticket
        && engine_answered
        && !response.status().is_server_error()
    {
        // An engine answered (its own refusals included): the charge
        // stands. An answer Shoal wrote itself (no worker, timeouts, no
        // worker serving the model) or an engine's 5xx refunds it.
        ticket.serve();
    }
    let strip = (asked_for_usage && is_event_stream(&response)).then(UsageChunkFilter::new);
    if strip.is_some() {
        // The client gets fewer bytes than the engine sent.
        response.headers_mut().remove(header::CONTENT_LENGTH);
    }
    let held = Held {
        permit,
        ticket,
        strip,
    };
    let mut response = AdmittedBody::wrap(response, held);
    tenants::add_headers(response.headers_mut(), grant.headers);
    response
}

/// Whether `response` is a stream of server-sent events (what the usage
/// filter reads; an engine's JSON error is passed as it is).
fn is_event_stream(response: &Response) -> bool {
    response.status().is_success() && crate::proxy::is_event_stream(response.headers())
}

/// What makes the request's stream migratable: a streamed chat or
/// completions request, with migration on.
fn migratable(app: &AppState, route: Route, info: &RequestInfo) -> Option<Migratable> {
    if app.forwarder.migration.limit == 0 || !info.stream {
        return None;
    }
    if app.disagg.as_ref().is_some_and(|d| !d.migrates()) {
        return None;
    }
    let kind = match route {
        Route::ChatCompletions => StreamKind::Chat,
        Route::Completions => StreamKind::Completion,
        _ => return None,
    };
    Some(Migratable {
        kind,
        pool: SharedPool {
            registry: app.registry.clone(),
            policy: app.policy.clone(),
            fleet: app.fleet.clone(),
            side: app.disagg.as_ref().map(|d| OwnedPoolSide {
                roles: d.roles().clone(),
                prefill: false,
            }),
        },
    })
}

/// What tenant admission granted a request.
#[derive(Default)]
struct TenantGrant {
    /// Its place among its tenant's requests in flight (none for a request
    /// that is no tenant's).
    ticket: Option<TenantTicket>,
    /// The rate-limit headers for its answer.
    headers: Vec<RateHeader>,
}

/// A tenant request over a limit: its 429 and the metric label.
struct TenantRefusal {
    code: &'static str,
    response: Box<Response>,
}

/// The tenant whose key the request presents (none without
/// `--tenants-file` or for a key that is no tenant's).
fn tenant_of(app: &AppState, headers: &http::HeaderMap) -> Option<Arc<Tenant>> {
    let gate = app.tenants.as_ref()?;
    let token = auth::bearer(headers).or_else(|| auth::x_api_key(headers))?;
    gate.tenant_of(token)
}

/// What the request asks of the admission queue: its class (its tenant's,
/// lowered by the priority header), its fairness flow, its token-work and
/// (with `--fair-share-scope fleet`) its group's share of the fleet (its
/// tenant's, or the replica's group of requests that are no tenant's), or
/// a 400 naming a bad header.
fn queue_ask(
    app: &AppState,
    headers: &http::HeaderMap,
    tenant: Option<&Tenant>,
    info: &RequestInfo,
) -> Result<Ask, ApiError> {
    let bad = |e: class::HeaderError| ApiError::bad_request("invalid_header", e.0);
    let priority = class::priority_of(headers, tenant.map(|t| t.priority)).map_err(bad)?;
    let anonymous: Arc<str> = Arc::from("");
    let flow = class::flow_of(headers, tenant.map_or(&anonymous, |t| &t.name)).map_err(bad)?;
    let default_output = app
        .tenants
        .as_ref()
        .map_or(tenants::file::DEFAULT_OUTPUT_TOKENS, |gate| {
            gate.default_output_tokens()
        });
    let output = info.max_output_tokens.unwrap_or(default_output);
    let share = match app.config.admission.fair_share_scope {
        FairShareScope::Replica => None,
        FairShareScope::Fleet => Some(match tenant {
            Some(t) => t.share.clone() as Arc<dyn FleetShare>,
            None => app.admission.anonymous_share(),
        }),
    };
    Ok(Ask {
        priority,
        flow,
        weight: tenant.map_or(1, |t| t.weight),
        cost: info.prompt_tokens.saturating_add(output),
        share,
    })
}

/// Admits a tenant's request against its fleet-wide limits (nothing to do
/// for a request that is no tenant's): the ticket to hold with the
/// response and the rate-limit headers to send, or the 429 to answer with
/// (and its metric label).
fn tenant_admission(
    app: &AppState,
    tenant: Option<Arc<Tenant>>,
    info: &RequestInfo,
) -> Result<TenantGrant, TenantRefusal> {
    let (Some(gate), Some(tenant)) = (&app.tenants, tenant) else {
        return Ok(TenantGrant::default());
    };
    match gate.admit(
        &tenant,
        info.model.as_deref(),
        info.prompt_tokens,
        info.max_output_tokens,
    ) {
        Decision::Admitted(ticket, headers) => Ok(TenantGrant {
            ticket: Some(ticket),
            headers,
        }),
        Decision::Refused(breach, headers) => {
            let error = ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!("tenant `{}`: {}", tenant.name, breach.message),
                kind: "rate_limit_error",
                code: breach.reason.code(),
            };
            let mut response = error.into_response();
            let map = response.headers_mut();
            map.insert(
                header::RETRY_AFTER,
                http::HeaderValue::from(breach.retry_after_secs),
            );
            tenants::add_headers(map, headers);
            Err(TenantRefusal {
                code: breach.reason.code(),
                response: Box::new(response),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The size of the future an async fn of three arguments returns.
    fn future_size<A, B, C, F: Future>(_: fn(A, B, C) -> F) -> usize {
        size_of::<F>()
    }

    #[test]
    fn a_request_future_is_not_as_big_as_its_rarest_branch() {
        // The front boxes this future for every request, copying it whole
        // (a profile found that copy at 1 % of the proxy's CPU when the
        // disaggregated branch made it 11.7 KiB); the common path needs
        // about 5 KiB in a debug build.
        let size = future_size(handle);
        assert!(size <= 6 * 1024, "handle's future is {size} bytes");
    }
}
