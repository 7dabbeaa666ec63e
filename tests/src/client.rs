//! A small plain-HTTP/1 client (hyper-util) for tests and benchmarks, with an
//! SSE reader for streamed responses.

use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use serde_json::Value;

/// Any error of the client.
pub type ClientError = Box<dyn std::error::Error + Send + Sync>;

/// A pooled HTTP/1 client; cheap to clone.
#[derive(Debug, Clone)]
pub struct HttpClient {
    inner: Client<HttpConnector, Full<Bytes>>,
}

/// A fully read response.
#[derive(Debug, Clone)]
pub struct HttpResponse {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    /// The whole body.
    pub body: Bytes,
}

impl HttpResponse {
    /// The body as text (lossy UTF-8).
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body parsed as JSON.
    pub fn json(&self) -> Result<Value, ClientError> {
        Ok(serde_json::from_slice(&self.body)?)
    }

    /// A header's value as text.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }
}

impl Default for HttpClient {
    fn default() -> Self {
        Self::new()
    }
}

impl HttpClient {
    /// A client with TCP_NODELAY and connection pooling.
    pub fn new() -> Self {
        let mut conn = HttpConnector::new();
        conn.set_nodelay(true);
        Self {
            inner: Client::builder(TokioExecutor::new()).build(conn),
        }
    }

    /// Sends a request and returns the response with its body unread.
    pub async fn send(
        &self,
        method: Method,
        url: &str,
        headers: &[(&str, &str)],
        body: Option<Bytes>,
    ) -> Result<Response<Incoming>, ClientError> {
        let mut req = Request::builder().method(method).uri(url);
        if body.is_some() {
            req = req.header(http::header::CONTENT_TYPE, "application/json");
        }
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        let req = req.body(Full::new(body.unwrap_or_default()))?;
        Ok(self.inner.request(req).await?)
    }

    async fn read(resp: Response<Incoming>) -> Result<HttpResponse, ClientError> {
        let (parts, body) = resp.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(HttpResponse {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
        })
    }

    /// `GET url`, body read fully.
    pub async fn get(&self, url: &str) -> Result<HttpResponse, ClientError> {
        Self::read(self.send(Method::GET, url, &[], None).await?).await
    }

    /// `POST url` with a raw JSON body, read fully.
    pub async fn post_raw(
        &self,
        url: &str,
        body: impl Into<Bytes>,
    ) -> Result<HttpResponse, ClientError> {
        Self::read(self.send(Method::POST, url, &[], Some(body.into())).await?).await
    }

    /// `POST url` with a JSON value, read fully.
    pub async fn post_json(&self, url: &str, body: &Value) -> Result<HttpResponse, ClientError> {
        self.post_raw(url, body.to_string()).await
    }

    /// `POST url` with a JSON value and extra headers; returns an SSE reader.
    pub async fn post_stream(
        &self,
        url: &str,
        body: &Value,
        headers: &[(&str, &str)],
    ) -> Result<SseStream, ClientError> {
        let resp = self
            .send(
                Method::POST,
                url,
                headers,
                Some(Bytes::from(body.to_string())),
            )
            .await?;
        let (parts, body) = resp.into_parts();
        Ok(SseStream {
            status: parts.status.as_u16(),
            headers: parts.headers,
            body,
            buf: Vec::new(),
        })
    }
}

/// Reads `data:` payloads of a server-sent-event stream one event at a time.
#[derive(Debug)]
pub struct SseStream {
    /// Status code.
    pub status: u16,
    /// Response headers.
    pub headers: HeaderMap,
    body: Incoming,
    buf: Vec<u8>,
}

impl SseStream {
    /// The next event's data (lines joined by `\n`), or `None` at the end of
    /// the body. Events without data lines are skipped.
    pub async fn next_data(&mut self) -> Result<Option<String>, ClientError> {
        loop {
            if let Some(pos) = self.buf.windows(2).position(|w| w == b"\n\n") {
                let frame: Vec<u8> = self.buf.drain(..pos + 2).collect();
                let text = String::from_utf8_lossy(&frame);
                let data: Vec<&str> = text
                    .lines()
                    .filter_map(|l| l.strip_prefix("data:"))
                    .map(|d| d.strip_prefix(' ').unwrap_or(d))
                    .collect();
                if data.is_empty() {
                    continue;
                }
                return Ok(Some(data.join("\n")));
            }
            match self.body.frame().await {
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
                Some(Err(e)) => return Err(e.into()),
                None => return Ok(None),
            }
        }
    }
}
