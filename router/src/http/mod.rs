//! The HTTP front: OpenAI-compatible inference routes, health and metrics,
//! and the worker admin API.

mod admin;
mod body;
mod dry_run;
mod front;
mod inference;
mod info;
mod objects;
pub mod state;

use std::sync::Arc;

use axum::Router;
use axum::routing::{delete, get, post};

pub use front::Front;
use state::AppState;

use crate::error::ApiError;

/// Builds the axum router for everything one replica answers itself.
/// Proxied requests never reach it: [`Front`] sends every request that
/// [`crate::request::Route::for_request`] names to the inference handler.
pub fn router(state: Arc<AppState>) -> Router {
    Router::new()
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/liveness", get(info::liveness))
        .route("/readiness", get(info::readiness))
        .route("/metrics", get(info::metrics))
        .route("/mesh/status", get(info::mesh_status))
        .route("/tenants", get(info::tenants))
        .route("/workers", get(admin::list).post(admin::add))
        .route("/workers/{url}", delete(admin::remove))
        .route("/debug/route", post(dry_run::route))
        .fallback(|| async { ApiError::not_found("no such route") })
        .method_not_allowed_fallback(|| async { ApiError::method_not_allowed() })
        .with_state(state)
}
