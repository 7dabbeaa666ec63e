//! Health, readiness, model list and metrics endpoints.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use futures_util::future::join_all;
use http::{StatusCode, header};
use serde_json::{Value, json};

use super::state::AppState;
use crate::admission::class::flow_tenant;
use crate::error::ApiError;
use crate::workers::{Served, parse_model_list};
use crate::{telemetry, upstream};

/// Deadline for reading a model list not read by the checks yet.
const MODELS_TIMEOUT: Duration = Duration::from_secs(5);
/// Largest model list read.
const MODELS_MAX_BYTES: usize = 4 * 1024 * 1024;

/// `GET /liveness`: the process answers.
pub async fn liveness() -> &'static str {
    "ok"
}

/// `GET /health`: the process answers, with a worker summary. Always 200,
/// so an orchestrator does not restart a router whose engines are down;
/// use `/readiness` to gate traffic.
pub async fn health(State(app): State<Arc<AppState>>) -> Json<Value> {
    let workers = app.registry.all();
    let available = workers.iter().filter(|w| w.is_available()).count();
    Json(json!({"status": "ok", "workers": workers.len(), "available_workers": available}))
}

/// `GET /readiness`: 200 when at least one worker can take traffic, else
/// 503 (also while draining after SIGTERM, so load balancers stop sending).
pub async fn readiness(State(app): State<Arc<AppState>>) -> Response {
    if app.is_draining() {
        return ApiError::no_workers("draining: this replica is shutting down").into_response();
    }
    let workers = app.registry.all();
    let available = workers.iter().filter(|w| w.is_available()).count();
    if available > 0 {
        Json(json!({"status": "ready", "available_workers": available})).into_response()
    } else {
        ApiError::no_workers(format!(
            "not ready: 0 of {} workers available",
            workers.len()
        ))
        .into_response()
    }
}

/// `GET /metrics`: Prometheus text format.
pub async fn metrics(State(app): State<Arc<AppState>>) -> Response {
    match &app.metrics {
        Some(handle) => ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], {
            app.registry.record_gauges();
            telemetry::render(handle)
        })
            .into_response(),
        None => (
            StatusCode::NOT_FOUND,
            "metrics recorder not installed in this process",
        )
            .into_response(),
    }
}

/// `GET /v1/models`: the union of every available worker's model list, by
/// `id`, each as its engine describes it. The lists are the ones the
/// health checks read (what routing uses), so this answers from memory:
/// a client polling it does not fan out to every engine (only a worker
/// whose list no check has read yet is asked).
pub async fn models(State(app): State<Arc<AppState>>) -> Response {
    let workers = app.registry.all();
    let available: Vec<_> = workers.iter().filter(|w| w.is_available()).collect();
    if available.is_empty() {
        return ApiError::no_workers("no available worker to list models from").into_response();
    }
    // A worker whose list the checks have not read yet (a seed in the
    // first moment after start) is asked now.
    let unread = available.iter().filter(|w| *w.served() == Served::Unread);
    let fetched = join_all(unread.map(|worker| async {
        let answer = upstream::get(
            &app.side_client,
            worker.url(),
            "/v1/models",
            MODELS_TIMEOUT,
            MODELS_MAX_BYTES,
        )
        .await;
        match answer {
            // A list, or an answer that lists nothing.
            Ok((status, body)) if status.is_success() => Some(
                parse_model_list(&body)
                    .map(|list| list.cards)
                    .unwrap_or_default(),
            ),
            _ => None,
        }
    }))
    .await;
    let read = available
        .iter()
        .filter(|w| *w.served() != Served::Unread)
        .count();
    let answered = read + fetched.iter().flatten().count();
    let mut merged: BTreeMap<String, Value> = BTreeMap::new();
    let cached: Vec<_> = available.iter().map(|w| w.model_cards()).collect();
    let cards = cached
        .iter()
        .flat_map(|c| c.iter())
        .chain(fetched.iter().flatten().flatten());
    for card in cards {
        if let Some(id) = card.get("id").and_then(Value::as_str) {
            merged.entry(id.to_string()).or_insert_with(|| card.clone());
        }
    }
    if answered == 0 {
        return ApiError::bad_gateway("no available worker returned a model list").into_response();
    }
    Json(json!({"object": "list", "data": merged.into_values().collect::<Vec<_>>()}))
        .into_response()
}

/// `GET /tenants`: every configured tenant's limits, its fleet-wide usage
/// this window, and this replica's refusals (an admin read).
pub async fn tenants(State(app): State<Arc<AppState>>) -> Response {
    match &app.tenants {
        Some(gate) => {
            let flows = app.admission.depths();
            let depths: Vec<_> = flows
                .iter()
                .map(|(flow, class, n)| (flow_tenant(flow), *class, *n))
                .collect();
            Json(gate.status(&depths)).into_response()
        }
        None => ApiError::not_found("no tenants on this replica (start it with --tenants-file)")
            .into_response(),
    }
}

/// `GET /mesh/status`: members, per-worker fleet totals with each replica's
/// share, snapshot sources and poll owners, traffic counters.
pub async fn mesh_status(State(app): State<Arc<AppState>>) -> Response {
    match &app.mesh {
        Some(mesh) => Json(mesh.status()).into_response(),
        None => ApiError::not_found(
            "the mesh is off on this replica (start it with --mesh-peer-urls or --mesh-port)",
        )
        .into_response(),
    }
}
