//! Worker admin API: list, add and remove workers at run time. Adds and
//! removals go to the fleet-wide worker set (`sources`), so with a mesh
//! every replica applies them within a push.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

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
use crate::workers::{Worker, WorkerStatus};
use shoal_proto::LoadSnapshot;

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
/// With the mesh on, the snapshot shown is the freshest in the fleet (a
/// peer may poll the engine), with who polled it.
pub async fn list(State(app): State<Arc<AppState>>) -> Json<Vec<ListedWorker>> {
    let desired = app.sources.desired();
    let pollers: HashMap<String, String> = match &app.mesh {
        Some(mesh) => mesh
            .status()
            .workers
            .into_iter()
            .filter_map(|w| Some((w.worker, w.snapshot?.poller)))
            .collect(),
        None => HashMap::new(),
    };
    let now = Instant::now();
    Json(
        app.registry
            .all()
            .iter()
            .map(|w| {
                let mut status = WorkerStatus::of(w);
                if app.mesh.is_some() {
                    fresher_fleet_snapshot(&mut status, w, pollers.get(w.url()), now);
                }
                ListedWorker {
                    status,
                    source: desired.get(w.url()).copied(),
                }
            })
            .collect(),
    )
}

/// Shows the fleet's snapshot of `worker` when it is fresher than this
/// replica's own (it polls only the workers it owns).
fn fresher_fleet_snapshot(
    status: &mut WorkerStatus,
    worker: &Worker,
    poller: Option<&String>,
    now: Instant,
) {
    let Some(view) = worker.ledger().slot().fleet().snapshot else {
        return;
    };
    let age_ms = u64::try_from(view.age(now).as_millis()).unwrap_or(u64::MAX);
    if status.snapshot_age_ms.is_some_and(|own| own <= age_ms) {
        return;
    }
    status.snapshot = Some(LoadSnapshot {
        source: view.source,
        load: view.load,
        polled_at_unix_ms: view.polled_at_unix_ms,
        poller: poller.cloned().unwrap_or_default(),
    });
    status.snapshot_age_ms = Some(age_ms);
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
