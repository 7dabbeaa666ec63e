//! The service every client connection is served by: proxied requests go
//! straight to their handler, everything else through the axum router.
//!
//! Why not the router for everything: an inference request is the hot
//! path, and the router's generic machinery (path matching, URL-parameter
//! and matched-path extensions, the tower adapters and their futures) was
//! a few per cent of the proxy's CPU per request for a decision a short
//! table lookup makes ([`Route::for_request`]). Every request that table
//! does not name (404, 405, the admin and info routes) is still the
//! router's own.
//!
//! Every request passes the API-key gate here first (`auth`): one place
//! decides, by method and path, what a request needs.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use http::Request;
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use super::inference;
use super::state::AppState;
use crate::auth::{Denied, Scope};
use crate::error::ApiError;
use crate::request::Route;
use crate::telemetry;

/// The front service of one replica; cheap to clone (one per connection).
#[derive(Clone)]
pub struct Front {
    state: Arc<AppState>,
    router: TowerToHyperService<Router>,
    /// The connection's client, for the admin loopback rule.
    peer: Option<SocketAddr>,
}

impl Front {
    /// The front for `state`, with `router` for everything that is not an
    /// inference request.
    pub fn new(state: Arc<AppState>, router: Router) -> Self {
        Self {
            state,
            router: TowerToHyperService::new(router),
            peer: None,
        }
    }

    /// This front for one connection from `peer`.
    pub fn for_peer(&self, peer: SocketAddr) -> Self {
        Self {
            peer: Some(peer),
            ..self.clone()
        }
    }
}

/// The answer to a request the key gate refused (counted by `scope`).
fn refusal(scope: Scope, denied: Denied) -> Response {
    let label = match scope {
        Scope::Admin { .. } => "admin",
        _ => "inference",
    };
    telemetry::auth_failure(label, denied.reason());
    match denied {
        Denied::Missing => ApiError::invalid_api_key(true),
        Denied::Invalid => ApiError::invalid_api_key(false),
        Denied::NoAdminKey => ApiError::admin_forbidden(false),
        Denied::NotLoopback => ApiError::admin_forbidden(true),
    }
    .into_response()
}

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        let route = Route::for_request(request.method(), request.uri().path());
        let scope = match route {
            Some(_) => Scope::Inference,
            None => Scope::of(request.method(), request.uri().path()),
        };
        if let Err(denied) = self
            .state
            .auth
            .load()
            .check(scope, request.headers(), self.peer)
        {
            return Box::pin(std::future::ready(Ok(refusal(scope, denied))));
        }
        if let Some(route) = route {
            let state = self.state.clone();
            let request = request.map(Body::new);
            return Box::pin(
                async move { Ok(inference::handle(State(state), route, request).await) },
            );
        }
        Box::pin(self.router.call(request))
    }
}
