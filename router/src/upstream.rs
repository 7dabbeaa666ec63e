//! The HTTP client the router uses to talk to engines, and a bounded GET for
//! the side channels (health checks, load polls, model lists).
//!
//! The proxied requests themselves go through `engine_h1`, the proxy's own
//! HTTP/1.1 client; this general pooled client serves the side channels.

use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::Bytes;
use http::{HeaderValue, Request, StatusCode, Uri, header};
use http_body_util::{BodyExt, Full, Limited};
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

use crate::auth::Auth;

/// Pooled HTTP/1.1 client to engines (`http://` and `https://`), sending
/// `--worker-api-key` when one is configured.
#[derive(Clone)]
pub struct HttpClient {
    inner: Client<HttpsConnector<HttpConnector>, Full<Bytes>>,
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

/// Read buffer of each side connection (health checks, load polls, model
/// lists). Fixed rather than adaptive: an idle pooled connection to every
/// engine keeps its buffer, and hyper's adaptive one grows to the largest
/// body it has read (tests/BENCHMARKS.md, "One `shoal` process at scale").
const SIDE_READ_BUFFER_BYTES: usize = 4096;

/// Builds a client whose connects (TLS handshake included) give up after
/// `connect_timeout`, trusting `https://` engines as `tls` says.
pub fn build_client(connect_timeout: Duration, tls: Arc<rustls::ClientConfig>) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(false);
    // hyper-rustls sets ALPN itself from the HTTP versions it enables.
    let mut tls = (*tls).clone();
    tls.alpn_protocols.clear();
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .wrap_connector(connector);
    HttpClient {
        inner: Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(1024)
            .http1_read_buf_exact_size(SIDE_READ_BUFFER_BYTES)
            .build(https),
        auth: None,
        authorization: None,
    }
}

/// Joins a worker base URL (maybe with a path prefix) and a request path.
pub fn join(base: &str, path_and_query: &str) -> Result<Uri, http::Error> {
    let mut joined = String::with_capacity(base.len() + path_and_query.len());
    joined.push_str(base);
    joined.push_str(path_and_query);
    Ok(joined.parse::<Uri>()?)
}

/// Why a side-channel GET failed.
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
    let request = Request::get(join(base, path).map_err(|e| FetchError::Url(e.to_string()))?)
        .body(Full::new(Bytes::new()))
        .map_err(|e| FetchError::Url(e.to_string()))?;
    exchange(client, request, timeout, max_bytes).await
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
    let request = Request::post(join(base, path).map_err(|e| FetchError::Url(e.to_string()))?)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Full::new(body))
        .map_err(|e| FetchError::Url(e.to_string()))?;
    exchange(client, request, timeout, max_bytes).await
}

/// Sends `request` with the client's `Authorization` and reads at most
/// `max_bytes` of the answer, all within `timeout`.
async fn exchange(
    client: &HttpClient,
    mut request: Request<Full<Bytes>>,
    timeout: Duration,
    max_bytes: usize,
) -> Result<(StatusCode, Bytes), FetchError> {
    if let Some(value) = client.authorization() {
        request.headers_mut().insert(header::AUTHORIZATION, value);
    }
    let exchange = async {
        let response = client
            .inner
            .request(request)
            .await
            .map_err(|e| FetchError::Transport(error_chain(&e)))?;
        let status = response.status();
        let body = Limited::new(response.into_body(), max_bytes)
            .collect()
            .await
            .map_err(|e| {
                if e.is::<http_body_util::LengthLimitError>() {
                    FetchError::TooLarge(max_bytes)
                } else {
                    FetchError::Transport(e.to_string())
                }
            })?
            .to_bytes();
        Ok((status, body))
    };
    tokio::time::timeout(timeout, exchange)
        .await
        .map_err(|_| FetchError::Timeout(timeout))?
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
