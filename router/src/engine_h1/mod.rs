//! The proxy's own HTTP/1.1 client to engines: one request out, the
//! response head back, the body read from the socket as it is polled.
//!
//! Why not a general client: profiles of the proxy against a fast backend
//! put 23 % of the I/O thread's CPU in the pooled client's connection task
//! and 6.5 % more in its `send_request` (hyper-util's legacy `Client`: a
//! pool lock and hash per request, a connection task fed through channels,
//! a task spawned per request to hand the connection back). A router talks to known engines over plain HTTP/1.1 with one shape
//! of request, so this does only that, inline on the task that serves the
//! client: the request head and body go out in one vectored write, the
//! response head is parsed with `httparse` (hyper's own parser) and the
//! body ([`EngineBody`]) is sliced out of the read buffer frame by frame,
//! zero-copy. Connections are pooled per thread (`conn`). Health checks,
//! load polls, model lists and tokenize calls go through it too, on a
//! pool of their own shared by every thread (`side`).
//!
//! `https://` engines are reached over TLS (rustls, the [`Connector`]'s
//! configuration); TLS and plain connections are pooled apart.
//!
//! What it does not do: HTTP/2, upgrades, request bodies that stream (the
//! proxy reads a request whole before routing it).

mod body;
mod chunked;
mod conn;
mod head;
mod side;

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Buf, Bytes};
use http::{HeaderMap, HeaderValue, Method, Response};
use rustls::pki_types::ServerName;

pub use body::EngineBody;
#[cfg(test)]
use conn::idle_count;
pub use side::{SideError, SidePool};

use body::Home;
use conn::{Conn, ConnectError};
use head::HeadError;

use crate::retry_rule::{self, Progress, Verdict};

/// Why an exchange with an engine failed.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The worker URL is not `http[s]://host[:port][/prefix]`.
    #[error("bad worker URL `{0}`")]
    Url(String),
    /// No connection could be opened.
    #[error("{0}")]
    Connect(#[from] ConnectError),
    /// Writing the request failed before its last byte.
    #[error("sending the request failed: {0}")]
    Write(std::io::Error),
    /// Reading the response failed after part of it arrived.
    #[error("reading the response failed: {0}")]
    Read(std::io::Error),
    /// The whole request was written, then the engine closed the
    /// connection before any byte of an answer.
    #[error("the engine closed the connection after the whole request was sent, before answering")]
    ClosedBeforeAnswer,
    /// The whole request was written, then reading failed (a reset)
    /// before any byte of an answer.
    #[error("the connection failed after the whole request was sent, before any answer: {0}")]
    LostBeforeAnswer(std::io::Error),
    /// The response head was refused.
    #[error("{0}")]
    Head(#[from] HeadError),
    /// The chunked body was malformed.
    #[error("malformed chunked body: {0}")]
    Chunked(#[from] chunked::ChunkError),
    /// The engine closed the connection in the middle of the response.
    #[error("the engine closed the connection mid-response")]
    Truncated,
}

impl EngineError {
    /// How far the exchange got when it failed: what the retry rule
    /// ([`retry_rule::verdict`]) decides a resend by.
    pub fn progress(&self) -> Progress {
        match self {
            EngineError::Url(_) | EngineError::Connect(_) | EngineError::Write(_) => {
                Progress::NotDelivered
            }
            EngineError::ClosedBeforeAnswer | EngineError::LostBeforeAnswer(_) => {
                Progress::DeliveredNoAnswer
            }
            EngineError::Read(_)
            | EngineError::Head(_)
            | EngineError::Chunked(_)
            | EngineError::Truncated => Progress::BrokenAnswer,
        }
    }
}

/// One request to send: everything but the worker.
#[derive(Debug, Clone, Copy)]
pub struct Request<'a> {
    /// Method, as the client sent it.
    pub method: &'a Method,
    /// Path and query, appended to the worker's path prefix.
    pub path_and_query: &'a str,
    /// The client's headers; hop-by-hop ones, `host`, `content-length`
    /// and `expect` are not forwarded.
    pub headers: &'a HeaderMap,
    /// What `Authorization` the engine gets.
    pub authorization: Authorization<'a>,
    /// A `traceparent` sent instead of the client's `traceparent` and
    /// `tracestate` (the router's own span, when tracing is on).
    pub traceparent: Option<&'a HeaderValue>,
    /// The request body, sent whole.
    pub body: &'a Bytes,
}

/// The `Authorization` header sent to the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization<'a> {
    /// The client's, if it sent one.
    Forward,
    /// None at all.
    Drop,
    /// This one, instead of the client's.
    Set(&'a HeaderValue),
}

/// How the engine client opens connections: the connect deadline (TLS handshake
/// included) and the TLS client configuration for `https://` engines.
#[derive(Debug, Clone)]
pub struct Connector {
    /// Deadline for opening a connection.
    pub timeout: Duration,
    /// Trust and client identity for `https://` engines.
    pub tls: Arc<rustls::ClientConfig>,
}

/// A worker base URL split for the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Target<'a> {
    /// `host[:port]`, as the `Host` header.
    host: &'a str,
    /// Path prefix (empty or starting with `/`).
    prefix: &'a str,
    /// `https://`.
    tls: bool,
}

impl<'a> Target<'a> {
    fn parse(base: &'a str) -> Result<Self, EngineError> {
        let (rest, tls) = match (base.strip_prefix("http://"), base.strip_prefix("https://")) {
            (Some(rest), _) => (rest, false),
            (_, Some(rest)) => (rest, true),
            _ => return Err(EngineError::Url(base.to_string())),
        };
        let (host, prefix) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
        if host.is_empty() {
            return Err(EngineError::Url(base.to_string()));
        }
        Ok(Self { host, prefix, tls })
    }

    /// `host:port` to connect to (port 80, or 443 for TLS, when the URL
    /// has none).
    fn connect_authority(&self) -> Cow<'a, str> {
        let has_port = match self.host.rfind(']') {
            // IPv6 literal: a port follows the bracket.
            Some(bracket) => self.host[bracket..].contains(':'),
            None => self.host.contains(':'),
        };
        match (has_port, self.tls) {
            (true, _) => Cow::Borrowed(self.host),
            (false, false) => Cow::Owned(format!("{}:80", self.host)),
            (false, true) => Cow::Owned(format!("{}:443", self.host)),
        }
    }

    /// The name the engine's certificate must carry: the host without its
    /// port or IPv6 brackets.
    fn server_name(&self) -> Result<ServerName<'static>, EngineError> {
        let host = match self.host.rfind(']') {
            Some(end) => &self.host[1..end],
            None => self.host.split(':').next().unwrap_or(self.host),
        };
        ServerName::try_from(host.to_string()).map_err(|_| EngineError::Url(self.host.to_string()))
    }
}

/// Sends `request` to the worker at `base` and returns the response with
/// its body still on the wire.
///
/// A pooled connection is used when this thread has one. If it turns out
/// dead before any answer byte (the engine's keep-alive timeout raced the
/// reuse), the request goes once more on a new connection where the retry
/// rule allows it: always when writing failed before the last byte, and
/// after the whole request was written only for an idempotent method — a
/// `POST` the engine read whole and then dropped the connection on may be
/// running there, so its failure is returned instead. The pool probes a
/// connection idle for [`conn::PROBE_AFTER`] for end-of-file before reuse,
/// which catches the keep-alive closes (engines close idle connections
/// after seconds) before anything is written, so that case stays rare.
pub async fn send(
    base: &str,
    request: Request<'_>,
    connector: &Connector,
) -> Result<Response<EngineBody>, EngineError> {
    let wire = Wire::prepare(base, &request)?;
    let key = wire.pool_key();
    if let Some(conn) = conn::take(&key) {
        match exchange(conn, &wire.head, request, Home::ThreadPool).await {
            Err(err) if is_stale(&err) && may_resend(request.method, &err) => {}
            done => return done,
        }
    }
    let conn = wire.connect(key, connector).await?;
    exchange(conn, &wire.head, request, Home::ThreadPool).await
}

/// A request's head as it goes on the wire, and where it goes.
struct Wire<'a> {
    target: Target<'a>,
    /// `host:port` to connect to.
    addr: Cow<'a, str>,
    /// The request head.
    head: Vec<u8>,
}

impl<'a> Wire<'a> {
    /// Encodes `request`'s head for the worker at `base`.
    fn prepare(base: &'a str, request: &Request<'_>) -> Result<Self, EngineError> {
        let target = Target::parse(base)?;
        let mut head = Vec::with_capacity(256 + request.headers.len() * 64);
        head::encode_request(
            request.method,
            target.host,
            (target.prefix, request.path_and_query),
            (request.headers, request.authorization, request.traceparent),
            request.body.len(),
            &mut head,
        );
        Ok(Self {
            addr: target.connect_authority(),
            target,
            head,
        })
    }

    /// The pool key of its connections: TLS and plain connections to one
    /// address never share a pool.
    fn pool_key(&self) -> Cow<'_, str> {
        match self.target.tls {
            false => Cow::Borrowed(&self.addr),
            true => Cow::Owned(format!("tls://{}", self.addr)),
        }
    }

    /// A new connection for it, pooled under `key`.
    async fn connect(&self, key: Cow<'_, str>, connector: &Connector) -> Result<Conn, EngineError> {
        let tls = match self.target.tls {
            false => None,
            true => Some((connector.tls.clone(), self.target.server_name()?)),
        };
        Ok(Conn::connect(Arc::from(key), &self.addr, tls, connector.timeout).await?)
    }
}

/// Whether `err` is how a reused connection the engine had closed fails:
/// nothing of an answer came back.
fn is_stale(err: &EngineError) -> bool {
    matches!(
        err.progress(),
        Progress::NotDelivered | Progress::DeliveredNoAnswer
    )
}

/// Whether the retry rule lets a request of `method` that failed with
/// `err` go once more.
fn may_resend(method: &Method, err: &EngineError) -> bool {
    retry_rule::verdict(method, err.progress()) == Verdict::Retry
}

/// Writes the request on `conn` and reads the response head.
async fn exchange(
    mut conn: Conn,
    head: &[u8],
    request: Request<'_>,
    home: Home,
) -> Result<Response<EngineBody>, EngineError> {
    conn.buf.clear();
    if let Err(err) = conn.write_request(head, request.body).await {
        return Err(EngineError::Write(err));
    }
    let mut received = false;
    loop {
        if !conn.buf.is_empty() {
            received = true;
            let parsed = head::parse_response(&conn.buf, request.method)?;
            if let Some((parsed, len)) = parsed {
                conn.buf.advance(len);
                if parsed.status.is_informational() {
                    continue;
                }
                let body = EngineBody::new(conn, parsed.framing, parsed.keep_alive, home);
                let mut response = Response::new(body);
                *response.status_mut() = parsed.status;
                *response.version_mut() = parsed.version;
                *response.headers_mut() = parsed.headers;
                return Ok(response);
            }
        }
        match conn.fill().await {
            Ok(0) if !received => return Err(EngineError::ClosedBeforeAnswer),
            Err(err) if !received => return Err(EngineError::LostBeforeAnswer(err)),
            Ok(0) => return Err(EngineError::Truncated),
            Err(err) => return Err(EngineError::Read(err)),
            Ok(_) => {}
        }
    }
}

#[cfg(test)]
mod tests;
