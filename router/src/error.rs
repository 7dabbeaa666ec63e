//! Errors in OpenAI's shape, so SDKs surface the router's reason verbatim:
//! `{"error": {"message": ..., "type": ..., "code": ...}}`.
//!
//! A leaf: it depends on nothing else in the crate, so the HTTP front, the
//! proxy and admission can all answer in this shape without depending on
//! each other.

use axum::Json;
use axum::response::{IntoResponse, Response};
use http::{HeaderValue, StatusCode, header};
use serde_json::json;

/// An error answer of the router itself (not one passed through from a worker).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// Human-readable reason.
    pub message: String,
    /// OpenAI `type`.
    pub kind: &'static str,
    /// Machine-readable `code`.
    pub code: &'static str,
}

impl ApiError {
    fn new(
        status: StatusCode,
        kind: &'static str,
        code: &'static str,
        message: impl Into<String>,
    ) -> Self {
        Self {
            status,
            message: message.into(),
            kind,
            code,
        }
    }

    /// 400: the body is not JSON.
    pub fn invalid_json(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            "invalid_json",
            message,
        )
    }

    /// 400: some other client mistake.
    pub fn bad_request(code: &'static str, message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "invalid_request_error",
            code,
            message,
        )
    }

    /// 413: the body is over `--max-payload-bytes`.
    pub fn payload_too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            "payload_too_large",
            format!("request body exceeds the limit of {limit} bytes (--max-payload-bytes)"),
        )
    }

    /// 503: nothing to route to; the message says why.
    pub fn no_workers(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "no_available_workers",
            message,
        )
    }

    /// 502: the workers could not be reached or broke the exchange.
    pub fn bad_gateway(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::BAD_GATEWAY,
            "upstream_error",
            "upstream_unreachable",
            message,
        )
    }

    /// 504: the request deadline passed before a worker answered.
    pub fn gateway_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::GATEWAY_TIMEOUT,
            "upstream_error",
            "upstream_timeout",
            message,
        )
    }

    /// 404: unknown route or resource.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "not_found",
            message,
        )
    }

    /// 404 `object_not_found`: no worker holds the stored object the
    /// request is about (every one asked said 404).
    pub fn object_not_found(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "object_not_found",
            message,
        )
    }

    /// 503 `object_worker_unavailable`: the worker holding the stored
    /// object the request is about cannot take it now; no other worker
    /// has the object, so none is tried.
    pub fn object_worker_unavailable(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            "object_worker_unavailable",
            message,
        )
    }

    /// 404 `model_not_found`: no worker serves `model`; the message lists
    /// what is served (OpenAI's code for an unknown model).
    pub fn model_not_found(model: &str, served: &[impl AsRef<str>]) -> Self {
        let served: Vec<&str> = served.iter().map(AsRef::as_ref).collect();
        let list = match served.is_empty() {
            true => "no worker lists any model".to_string(),
            false => format!("served: {}", served.join(", ")),
        };
        Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            "model_not_found",
            format!("The model `{model}` does not exist on any worker ({list})."),
        )
    }

    /// 401 `invalid_api_key` (OpenAI's code): no key, or not one of ours.
    /// The message never echoes what was sent.
    pub fn invalid_api_key(missing: bool) -> Self {
        let message = match missing {
            true => "You didn't provide an API key. Send it as `Authorization: Bearer KEY`.",
            false => "Incorrect API key provided.",
        };
        Self::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "invalid_api_key",
            message,
        )
    }

    /// 403 `admin_forbidden`: an admin write while no admin key is
    /// configured (`loopback_allowed`: it came from a remote client while
    /// `--allow-loopback-admin-writes` is set).
    pub fn admin_forbidden(loopback_allowed: bool) -> Self {
        let message = match loopback_allowed {
            true => {
                "admin changes are accepted from loopback clients only \
                 (--allow-loopback-admin-writes) until --admin-api-key is set"
            }
            false => {
                "admin changes need --admin-api-key (or --allow-loopback-admin-writes \
                 for a local, unproxied replica)"
            }
        };
        Self::new(
            StatusCode::FORBIDDEN,
            "invalid_request_error",
            "admin_forbidden",
            message,
        )
    }

    /// 408 `request_timeout`: the client stopped sending its request.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            "request_timeout",
            message,
        )
    }

    /// 405: known path, wrong method.
    pub fn method_not_allowed() -> Self {
        Self::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "invalid_request_error",
            "method_not_allowed",
            "method not allowed on this path",
        )
    }

    /// 409: the resource already exists.
    pub fn conflict(message: impl Into<String>) -> Self {
        Self::new(
            StatusCode::CONFLICT,
            "invalid_request_error",
            "conflict",
            message,
        )
    }
}

/// Marks a response Shoal wrote itself (never an engine's), in its
/// extensions: a tenant is not charged for a request no engine answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RouterAnswer;

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body =
            json!({"error": {"message": self.message, "type": self.kind, "code": self.code}});
        let mut response = (self.status, Json(body)).into_response();
        response.extensions_mut().insert(RouterAnswer);
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        if self.status == StatusCode::UNAUTHORIZED {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
