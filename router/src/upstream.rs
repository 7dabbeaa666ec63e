//! The HTTP client the router uses to talk to engines, and a bounded GET for
//! the side channels (health checks, load polls, model lists).
//!
//! The proxied requests themselves go through `link`, the proxy's own
//! HTTP/1.1 client; this general pooled client serves the side channels.

use std::time::Duration;

use bytes::Bytes;
use http::{Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;

/// Pooled HTTP/1.1 client to engines.
pub type HttpClient = Client<HttpConnector, Full<Bytes>>;

/// Builds a client whose TCP connects give up after `connect_timeout`.
pub fn build_client(connect_timeout: Duration) -> HttpClient {
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    connector.set_connect_timeout(Some(connect_timeout));
    connector.enforce_http(true);
    Client::builder(TokioExecutor::new())
        .pool_idle_timeout(Duration::from_secs(90))
        .pool_max_idle_per_host(1024)
        .build(connector)
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
    let uri = join(base, path).map_err(|e| FetchError::Url(e.to_string()))?;
    let request = Request::get(uri)
        .body(Full::new(Bytes::new()))
        .map_err(|e| FetchError::Url(e.to_string()))?;
    let exchange = async {
        let response = client
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
