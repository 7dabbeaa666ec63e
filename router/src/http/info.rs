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
use crate::error::ApiError;
use crate::{telemetry, upstream};

const MODELS_TIMEOUT: Duration = Duration::from_secs(5);
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

/// `GET /v1/models`: the union of every available worker's model list,
/// deduplicated by id.
pub async fn models(State(app): State<Arc<AppState>>) -> Response {
    let workers = app.registry.all();
    let available: Vec<_> = workers.iter().filter(|w| w.is_available()).collect();
    if available.is_empty() {
        return ApiError::no_workers("no available worker to list models from").into_response();
    }
    let answers = join_all(available.iter().map(|worker| {
        upstream::get(
            &app.side_client,
            worker.url(),
            "/v1/models",
            MODELS_TIMEOUT,
            MODELS_MAX_BYTES,
        )
    }))
    .await;
    let mut merged: BTreeMap<String, Value> = BTreeMap::new();
    let mut answered = 0usize;
    for (worker, answer) in available.iter().zip(answers) {
        let body = match answer {
            Ok((status, body)) if status.is_success() => body,
            Ok((status, _)) => {
                tracing::debug!(worker = worker.url(), %status, "model list failed");
                continue;
            }
            Err(err) => {
                tracing::debug!(worker = worker.url(), error = %err, "model list failed");
                continue;
            }
        };
        let Ok(list) = serde_json::from_slice::<Value>(&body) else {
            continue;
        };
        answered += 1;
        for model in list
            .get("data")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(id) = model.get("id").and_then(Value::as_str) {
                merged
                    .entry(id.to_string())
                    .or_insert_with(|| model.clone());
            }
        }
    }
    if answered == 0 {
        return ApiError::bad_gateway("no worker returned a model list").into_response();
    }
    Json(json!({"object": "list", "data": merged.into_values().collect::<Vec<_>>()}))
        .into_response()
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
