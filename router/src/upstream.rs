//! The client the router uses for side requests to engines (health
//! checks, load polls, model lists, tokenize calls): a bounded GET or JSON
//! POST, read whole within a deadline.
//!
//! It runs on the proxy's own HTTP/1.1 client (`engine_h1`), on a pool of
//! side connections with at most one idle connection per engine
//! (`engine_h1::SidePool`): one pooled connection per engine, not one per
//! purpose, and no general client's connection task and buffers beside it.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode, header};

use crate::auth::Auth;
use crate::engine_h1::{self, Authorization, Connector, SideError, SidePool};

/// The side-request client: how to connect, the idle connections, and
/// what `Authorization` engines get. Clones share the connections.
#[derive(Clone)]
pub struct HttpClient {
    connector: Connector,
    pool: Arc<SidePool>,
    /// The replica's keys (read per request: a reload may change them).
    auth: Option<Arc<ArcSwap<Auth>>>,
    /// A fixed `Authorization` (the CLI's admin key), else `auth`'s.
    authorization: Option<HeaderValue>,
}

impl std::fmt::Debug for HttpClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpClient").finish_non_exhaustive()
    }
}

impl HttpClient {
    /// The same client, sending the worker key of `auth` to engines.
    pub fn with_auth(self, auth: Arc<ArcSwap<Auth>>) -> Self {
        Self {
            auth: Some(auth),
            ..self
        }
    }

    /// The same client, sending this `Authorization` on every request.
    pub fn with_authorization(self, authorization: Option<HeaderValue>) -> Self {
        Self {
            authorization,
            ..self
        }
    }

    fn authorization(&self) -> Option<HeaderValue> {
        match &self.authorization {
            Some(value) => Some(value.clone()),
            None => self.auth.as_ref()?.load().worker_header().cloned(),
        }
    }
}

/// A side-request client: connections opened within `connect_timeout`
/// (TLS handshake included), `https://` engines trusted by `tls`.
pub fn build_client(connect_timeout: Duration, tls: Arc<rustls::ClientConfig>) -> HttpClient {
    HttpClient {
        connector: Connector {
            timeout: connect_timeout,
            tls,
        },
        pool: Arc::new(SidePool::default()),
        auth: None,
        authorization: None,
    }
}

/// Why a side-channel request failed.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    /// No answer within the deadline.
    #[error("timed out after {0:?}")]
    Timeout(Duration),
    /// Connecting or talking to the engine failed.
    #[error("request failed: {0}")]
    Transport(String),
    /// The body was larger than allowed.
    #[error("response body over {0} bytes")]
    TooLarge(usize),
    /// The URL could not be built.
    #[error("bad URL: {0}")]
    Url(String),
}

/// GETs `base + path` and reads at most `max_bytes` of body, all within
/// `timeout`. Any status is returned; the caller decides what it means.
pub async fn get(
    client: &HttpClient,
    base: &str,
    path: &str,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    let headers = HeaderMap::new();
    let body = Bytes::new();
    exchange(
        client,
        (&Method::GET, base, path),
        &headers,
        &body,
        timeout,
        max_bytes,
    )
    .await
}

/// POSTs the JSON `body` to `base + path`, as [`get`] reads the answer.
pub async fn post_json(
    client: &HttpClient,
    base: &str,
    path: &str,
    body: Bytes,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    exchange(
        client,
        (&Method::POST, base, path),
        &headers,
        &body,
        timeout,
        max_bytes,
    )
    .await
}

/// Sends one request with the client's `Authorization` and reads at most
/// `max_bytes` of the answer, all within `timeout`.
async fn exchange(
    client: &HttpClient,
    (method, base, path): (&Method, &str, &str),
    headers: &HeaderMap,
    body: &Bytes,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    if !path.starts_with('/') {
        return Err(FetchError::Url(format!(
            "path `{path}` does not start with /"
        )));
    }
    let authorization = client.authorization();
    let request = engine_h1::Request {
        method,
        path_and_query: path,
        headers,
        authorization: authorization
            .as_ref()
            .map_or(Authorization::Drop, Authorization::Set),
        traceparent: None,
        body,
    };
    let fetch = client
        .pool
        .fetch(base, request, &client.connector, max_bytes);
    match tokio::time::timeout(timeout, fetch).await {
        Err(_) => Err(FetchError::Timeout(timeout)),
        Ok(Ok(answer)) => Ok(answer),
        Ok(Err(SideError::TooLarge(max))) => Err(FetchError::TooLarge(max)),
        Ok(Err(SideError::Engine(engine_h1::EngineError::Url(url)))) => {
            Err(FetchError::Url(format!("bad worker URL `{url}`")))
        }
        Ok(Err(err)) => Err(FetchError::Transport(error_chain(&err))),
    }
}

/// An error and its causes on one line, for logs and client messages.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}
