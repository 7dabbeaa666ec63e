//! Worker admin API: list, add and remove workers at run time. Adds and
//! removals go to the fleet-wide worker set (`sources`), so with a mesh
//! every replica applies them within a push.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Path, State};
use axum::response::{IntoResponse, Response};
use http::StatusCode;
use serde::{Deserialize, Serialize};

use super::state::AppState;
use crate::error::ApiError;
use crate::sources::{AdminError, Source};
use crate::url::normalize_url;
use crate::workers::WorkerStatus;

/// A worker as `GET /workers` lists it: its state and why it is listed.
#[derive(Debug, Serialize)]
pub struct ListedWorker {
    /// Health, circuit, load and models.
    #[serde(flatten)]
    pub status: WorkerStatus,
    /// `admin`, `seed` or `discovery` (see `sources`).
    pub source: Option<Source>,
}

/// `GET /workers`: every worker with health, circuit, load and source.
pub async fn list(State(app): State<Arc<AppState>>) -> Json<Vec<ListedWorker>> {
    let desired = app.sources.desired();
    Json(
        app.registry
            .all()
            .iter()
            .map(|w| ListedWorker {
                status: WorkerStatus::of(w),
                source: desired.get(w.url()).copied(),
            })
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
    match app.sources.add(&url) {
        Ok(worker) => {
            let listed = ListedWorker {
                status: WorkerStatus::of(&worker),
                source: Some(Source::Admin),
            };
            (StatusCode::CREATED, Json(listed)).into_response()
        }
        Err(err @ AdminError::Exists(_)) => ApiError::conflict(err.to_string()).into_response(),
        Err(err) => ApiError::bad_request("invalid_url", err.to_string()).into_response(),
    }
}

/// `DELETE /workers/{url-encoded url}`: 204 or 404. Requests in flight there finish.
pub async fn remove(State(app): State<Arc<AppState>>, Path(url): Path<String>) -> Response {
    let url = normalize_url(&url).unwrap_or(url);
    match app.sources.remove(&url) {
        Ok(()) => StatusCode::NO_CONTENT.into_response(),
        Err(err @ AdminError::NotFound(_)) => ApiError::not_found(err.to_string()).into_response(),
        Err(err) => ApiError::bad_request("invalid_url", err.to_string()).into_response(),
    }
}
