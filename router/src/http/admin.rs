//! Worker admin API: list, add and remove workers at run time.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::Deserialize;

use super::state::AppState;
use crate::error::ApiError;
use crate::url::normalize_url;
use crate::workers::{RegistryError, WorkerStatus};

/// `GET /workers`: every worker with health, circuit and load.
pub async fn list(State(app): State<Arc<AppState>>) -> Json<Vec<WorkerStatus>> {
    Json(
        app.registry
            .all()
            .iter()
            .map(|w| WorkerStatus::of(w))
            .collect(),
    )
}

/// Body of `POST /workers`.
#[derive(Debug, Deserialize)]
pub struct AddWorker {
    /// Base URL of the engine.
    pub url: String,
}

/// `POST /workers` with `{"url": "http://host:port"}`: 201, 400 or 409.
pub async fn add(
    State(app): State<Arc<AppState>>,
    body: Result<Json<AddWorker>, JsonRejection>,
) -> Response {
    let Json(AddWorker { url }) = match body {
        Ok(body) => body,
        Err(rejection) => {
            return ApiError::bad_request(
                "invalid_body",
                format!(
                    "expected {{\"url\": \"http://...\"}}: {}",
                    rejection.body_text()
                ),
            )
            .into_response();
        }
    };
    let url = match normalize_url(&url) {
        Ok(url) => url,
        Err(message) => return ApiError::bad_request("invalid_url", message).into_response(),
    };
    match app.registry.add(url) {
        Ok(worker) => {
            tracing::info!(worker = worker.url(), "worker added");
            (StatusCode::CREATED, Json(WorkerStatus::of(&worker))).into_response()
        }
        Err(err @ RegistryError::Exists(_)) => ApiError::conflict(err.to_string()).into_response(),
        Err(err) => ApiError::bad_request("invalid_url", err.to_string()).into_response(),
    }
}

/// `DELETE /workers/{url-encoded url}`: 204 or 404. Requests in flight there finish.
pub async fn remove(State(app): State<Arc<AppState>>, Path(url): Path<String>) -> Response {
    let url = normalize_url(&url).unwrap_or(url);
    match app.registry.remove(&url) {
        Ok(worker) => {
            app.policy.on_worker_removed(&worker);
            tracing::info!(worker = worker.url(), "worker removed");
            StatusCode::NO_CONTENT.into_response()
        }
        Err(err) => ApiError::not_found(err.to_string()).into_response(),
    }
}
