//! A scriptable engine for tests: each behaviour the router must handle
//! (streams it can pause, fixed statuses, health flips, load bodies) is a
//! switch the test flips, and the engine records what reached it.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU16, AtomicUsize, Ordering};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use futures_util::stream;
use tokio::net::TcpListener;
use tokio::sync::{Mutex, Notify};

/// The SSE chunks a streamed fake answer sends, in order.
pub const CHUNKS: [&str; 3] = [
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Hel\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"lo \\u00e9\"}}]}\n\n",
    "data: [DONE]\n\n",
];

/// Switches and records of one fake engine.
#[derive(Default)]
pub struct EngineState {
    /// Requests that reached an inference route.
    pub requests: AtomicUsize,
    /// If non-zero, every inference request is answered with this status.
    pub fixed_status: AtomicU16,
    /// `/health` answers 503 while set.
    pub unhealthy: AtomicBool,
    /// Requests are accepted but never answered (not even headers).
    pub stall: AtomicBool,
    /// Streams pause after the first chunk until this is notified.
    pub pause_after_first: AtomicBool,
    pub resume: Notify,
    /// Streams never end after the first chunk (to test disconnects).
    pub hang_after_first: AtomicBool,
    /// Set when a stream's body was dropped before it finished.
    pub stream_dropped: AtomicBool,
    pub dropped: Notify,
    /// Body served at `/metrics` (404 if empty).
    pub metrics: Mutex<String>,
    /// Body served at `/v1/loads` (404 if empty).
    pub loads: Mutex<String>,
    /// Model ids served at `/v1/models`.
    pub models: Mutex<Vec<String>>,
    /// Milliseconds `/v1/models` waits before answering.
    pub models_delay_ms: std::sync::atomic::AtomicU64,
    /// Last request body received.
    pub last_body: Mutex<Bytes>,
    /// Method, path and query, and `content-type` of the last request that
    /// reached an inference route or the catch-all.
    pub last_request: Mutex<Option<(String, String, Option<String>)>>,
    /// Path and `Authorization` header of every request, in order.
    pub authorizations: std::sync::Mutex<Vec<(String, Option<String>)>>,
    /// Path and `x-api-key` header of every request, in order.
    pub api_keys: std::sync::Mutex<Vec<(String, Option<String>)>>,
    /// Stored objects (responses, files, batches), when enabled.
    pub objects: super::fake_objects::ObjectStore,
    /// TCP connections accepted (plain-HTTP engines).
    pub connections: AtomicUsize,
}

/// Records every request's path, `Authorization` and `x-api-key` headers.
async fn record_authorization(
    State(state): State<Arc<EngineState>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let auth = request
        .headers()
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let api_key = request
        .headers()
        .get("x-api-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let path = request.uri().path().to_string();
    if let Ok(mut seen) = state.api_keys.lock() {
        seen.push((path.clone(), api_key));
    }
    if let Ok(mut seen) = state.authorizations.lock() {
        seen.push((path, auth));
    }
    next.run(request).await
}

/// A running fake engine.
pub struct FakeEngine {
    pub url: String,
    pub state: Arc<EngineState>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for FakeEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct DropFlag(Arc<EngineState>, bool);

impl DropFlag {
    /// The stream finished normally: dropping it is not a cancellation.
    fn disarm(&mut self) {
        self.1 = true;
    }
}

impl Drop for DropFlag {
    fn drop(&mut self) {
        if !self.1 {
            self.0.stream_dropped.store(true, Ordering::SeqCst);
            self.0.dropped.notify_waiters();
        }
    }
}

async fn inference(State(state): State<Arc<EngineState>>, body: Bytes) -> Response {
    state.requests.fetch_add(1, Ordering::SeqCst);
    *state.last_body.lock().await = body.clone();
    if state.stall.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = state.fixed_status.load(Ordering::SeqCst);
    if status != 0 {
        let status = StatusCode::from_u16(status).unwrap();
        return (status, format!("{{\"error\":\"fixed status {status}\"}}")).into_response();
    }
    let streaming = serde_json::from_slice::<serde_json::Value>(&body)
        .ok()
        .and_then(|v| v.get("stream").and_then(|s| s.as_bool()))
        .unwrap_or(false);
    if !streaming {
        return (
            [("content-type", "application/json")],
            r#"{"id":"c1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hello"},"finish_reason":"stop"}],"usage":{"prompt_tokens":9,"completion_tokens":1,"total_tokens":10}}"#,
        )
            .into_response();
    }
    let chunks = stream::unfold(
        (0usize, DropFlag(state.clone(), false)),
        |(i, mut flag)| async move {
            if i == CHUNKS.len() {
                flag.disarm();
                return None;
            }
            if i == 1 {
                if flag.0.hang_after_first.load(Ordering::SeqCst) {
                    std::future::pending::<()>().await;
                }
                if flag.0.pause_after_first.load(Ordering::SeqCst) {
                    flag.0.resume.notified().await;
                }
            }
            Some((
                Ok::<_, Infallible>(Bytes::from_static(CHUNKS[i].as_bytes())),
                (i + 1, flag),
            ))
        },
    );
    (
        [("content-type", "text/event-stream")],
        Body::from_stream(chunks),
    )
        .into_response()
}

/// Any other route: records the request, then answers as an inference
/// route does for a POST (streaming when asked) and with a small JSON
/// naming what it received otherwise.
async fn any_route(
    State(state): State<Arc<EngineState>>,
    method: axum::http::Method,
    uri: axum::http::Uri,
    headers: axum::http::HeaderMap,
    body: Bytes,
) -> Response {
    let content_type = headers
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let target = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
    *state.last_request.lock().await = Some((method.to_string(), target.clone(), content_type));
    if let Some(answer) = state.objects.handle(&method, uri.path(), &body) {
        state.requests.fetch_add(1, Ordering::SeqCst);
        return answer;
    }
    if method == axum::http::Method::POST {
        return inference(State(state), body).await;
    }
    state.requests.fetch_add(1, Ordering::SeqCst);
    if state.stall.load(Ordering::SeqCst) {
        std::future::pending::<()>().await;
    }
    let status = state.fixed_status.load(Ordering::SeqCst);
    if status != 0 {
        let status = StatusCode::from_u16(status).unwrap();
        return (status, format!("{{\"error\":\"fixed status {status}\"}}")).into_response();
    }
    axum::Json(serde_json::json!({"method": method.as_str(), "target": target})).into_response()
}

async fn health(State(state): State<Arc<EngineState>>) -> StatusCode {
    if state.unhealthy.load(Ordering::SeqCst) {
        StatusCode::SERVICE_UNAVAILABLE
    } else {
        StatusCode::OK
    }
}

async fn text_or_404(body: String) -> Response {
    if body.is_empty() {
        StatusCode::NOT_FOUND.into_response()
    } else {
        body.into_response()
    }
}

async fn metrics(State(state): State<Arc<EngineState>>) -> Response {
    text_or_404(state.metrics.lock().await.clone()).await
}

async fn loads(State(state): State<Arc<EngineState>>) -> Response {
    text_or_404(state.loads.lock().await.clone()).await
}

async fn models(State(state): State<Arc<EngineState>>) -> Response {
    let delay = state.models_delay_ms.load(Ordering::SeqCst);
    tokio::time::sleep(std::time::Duration::from_millis(delay)).await;
    let ids = state.models.lock().await.clone();
    let data: Vec<_> = ids
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "test"}))
        .collect();
    axum::Json(serde_json::json!({"object": "list", "data": data})).into_response()
}

impl FakeEngine {
    /// Starts a fake engine on an ephemeral loopback port.
    pub async fn start() -> FakeEngine {
        let state = Arc::new(EngineState::default());
        let app = Self::app(&state);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let counted = state.clone();
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                counted.connections.fetch_add(1, Ordering::SeqCst);
                let app = app.clone();
                tokio::spawn(async move {
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection_with_upgrades(hyper_util::rt::TokioIo::new(tcp), service)
                    .await;
                });
            }
        });
        FakeEngine { url, state, task }
    }

    /// Starts a fake engine served over TLS with `config` (an `https://`
    /// URL on 127.0.0.1).
    pub async fn start_tls(config: Arc<rustls::ServerConfig>) -> FakeEngine {
        let state = Arc::new(EngineState::default());
        let app = Self::app(&state);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("https://{}", listener.local_addr().unwrap());
        let acceptor = tokio_rustls::TlsAcceptor::from(config);
        let task = tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let (acceptor, app) = (acceptor.clone(), app.clone());
                tokio::spawn(async move {
                    let Ok(tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let service = hyper_util::service::TowerToHyperService::new(app);
                    let _ = hyper_util::server::conn::auto::Builder::new(
                        hyper_util::rt::TokioExecutor::new(),
                    )
                    .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                    .await;
                });
            }
        });
        FakeEngine { url, state, task }
    }

    /// The engine's routes over `state`.
    fn app(state: &Arc<EngineState>) -> Router {
        Router::new()
            .route("/v1/chat/completions", post(inference))
            .route("/v1/completions", post(inference))
            .route("/generate", post(inference))
            .route("/v1/embeddings", post(inference))
            .route("/health", get(health))
            .route("/metrics", get(metrics))
            .route("/v1/loads", get(loads))
            .route("/v1/models", get(models))
            .fallback(any_route)
            .layer(axum::middleware::from_fn_with_state(
                state.clone(),
                record_authorization,
            ))
            .with_state(state.clone())
    }

    pub fn requests(&self) -> usize {
        self.state.requests.load(Ordering::SeqCst)
    }
}
