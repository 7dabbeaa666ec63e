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

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::State;
use axum::response::Response;
use http::Request;
use hyper::body::Incoming;
use hyper_util::service::TowerToHyperService;

use super::inference;
use super::state::AppState;
use crate::request::Route;

/// The front service of one replica; cheap to clone (one per connection).
#[derive(Clone)]
pub struct Front {
    state: Arc<AppState>,
    router: TowerToHyperService<Router>,
}

impl Front {
    /// The front for `state`, with `router` for everything that is not an
    /// inference request.
    pub fn new(state: Arc<AppState>, router: Router) -> Self {
        Self {
            state,
            router: TowerToHyperService::new(router),
        }
    }
}

impl hyper::service::Service<Request<Incoming>> for Front {
    type Response = Response;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response, Infallible>> + Send>>;

    fn call(&self, request: Request<Incoming>) -> Self::Future {
        if let Some(route) = Route::for_request(request.method(), request.uri().path()) {
            let state = self.state.clone();
            let request = request.map(Body::new);
            return Box::pin(
                async move { Ok(inference::handle(State(state), route, request).await) },
            );
        }
        Box::pin(self.router.call(request))
    }
}
