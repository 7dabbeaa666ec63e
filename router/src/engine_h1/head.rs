//! The HTTP/1.1 message heads the engine client writes and reads: the request head
//! sent to an engine, the response head parsed from it (with `httparse`,
//! the parser hyper itself uses), and how the response body is framed.
//!
//! Hop-by-hop headers (RFC 9110 §7.6.1) are dropped both ways here: the
//! fixed set and every header a `Connection` header names.

use std::mem::MaybeUninit;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, StatusCode, Version};

use super::Authorization;

/// Most header lines accepted in a response head.
pub const MAX_HEADERS: usize = 128;
/// Largest response head accepted, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// Whether `name` describes one hop's connection (the fixed set).
fn is_fixed_hop_by_hop(name: &HeaderName) -> bool {
    name == header::CONNECTION
        || name == header::PROXY_AUTHENTICATE
        || name == header::PROXY_AUTHORIZATION
        || name == header::TE
        || name == header::TRAILER
        || name == header::TRANSFER_ENCODING
        || name == header::UPGRADE
        || name.as_str() == "keep-alive"
}

/// The header names listed in `Connection` values, lower-cased.
fn connection_named<'a>(values: impl Iterator<Item = &'a [u8]>) -> Vec<Vec<u8>> {
    values
        .flat_map(|value| value.split(|b| *b == b','))
        .map(|token| token.trim_ascii().to_ascii_lowercase())
        .filter(|token| !token.is_empty())
        .collect()
}

/// Writes the request head: `METHOD target HTTP/1.1`, `host`, the client's
/// end-to-end headers, and the body's `content-length`.
///
/// Not forwarded: `host` and `content-length` (set here), `expect` (the
/// body was already read, so there is nothing to wait for), the
/// hop-by-hop headers, and the client's `authorization` and `x-api-key`
/// (Anthropic's form of the same key) unless `authorization` says
/// [`Authorization::Forward`] (a `Set` one is written instead).
pub fn encode_request(
    method: &Method,
    authority: &str,
    target: (&str, &str),
    (headers, authorization, traceparent): (&HeaderMap, Authorization<'_>, Option<&HeaderValue>),
    body_len: usize,
    out: &mut Vec<u8>,
) {
    let named = if headers.contains_key(header::CONNECTION) {
        connection_named(
            headers
                .get_all(header::CONNECTION)
                .iter()
                .map(HeaderValue::as_bytes),
        )
    } else {
        Vec::new()
    };
    out.extend_from_slice(method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(target.0.as_bytes());
    out.extend_from_slice(target.1.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\nhost: ");
    out.extend_from_slice(authority.as_bytes());
    out.extend_from_slice(b"\r\n");
    for (name, value) in headers {
        if name == header::HOST
            || name == header::CONTENT_LENGTH
            || name == header::EXPECT
            || ((name == header::AUTHORIZATION || name.as_str() == "x-api-key")
                && authorization != Authorization::Forward)
            || (traceparent.is_some()
                && (name.as_str() == "traceparent" || name.as_str() == "tracestate"))
            || is_fixed_hop_by_hop(name)
            || named
                .iter()
                .any(|n| n.as_slice() == name.as_str().as_bytes())
        {
            continue;
        }
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Authorization::Set(value) = authorization {
        out.extend_from_slice(b"authorization: ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if let Some(value) = traceparent {
        out.extend_from_slice(b"traceparent: ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"content-length: ");
    out.extend_from_slice(body_len.to_string().as_bytes());
    out.extend_from_slice(b"\r\n\r\n");
}

/// How a response body is delimited (RFC 9112 §6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Framing {
    /// Exactly this many bytes.
    Length(u64),
    /// `Transfer-Encoding: chunked`.
    Chunked,
    /// Everything until the engine closes the connection.
    UntilClose,
}

/// A parsed response head.
#[derive(Debug)]
pub struct ResponseHead {
    /// Status code.
    pub status: StatusCode,
    /// HTTP version of the response.
    pub version: Version,
    /// End-to-end headers (hop-by-hop ones dropped).
    pub headers: HeaderMap,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection may carry another request after this body.
    pub keep_alive: bool,
}

/// Why a response head was refused.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum HeadError {
    /// `httparse` refused it.
    #[error("malformed response head: {0}")]
    Syntax(String),
    /// A header name or value `http` refuses.
    #[error("invalid response header")]
    BadHeader,
    /// Content-Length values that are not one non-negative integer.
    #[error("invalid or conflicting content-length")]
    BadLength,
    /// Over [`MAX_HEADERS`] lines or [`MAX_HEAD_BYTES`] bytes.
    #[error("response head too large")]
    TooLarge,
    /// A `101 Switching Protocols` nobody asked for.
    #[error("unexpected 101 Switching Protocols")]
    UnexpectedUpgrade,
}

/// Parses the response head at the start of `buf`: `Ok(None)` while it is
/// incomplete, else the head and its length in bytes. `method` is the
/// request's (a HEAD response has no body).
///
/// One pass over the header lines: each is named once (`HeaderName`
/// classifies the standard ones without allocating) and what framing needs
/// is read on the way.
pub fn parse_response(
    buf: &[u8],
    method: &Method,
) -> Result<Option<(ResponseHead, usize)>, HeadError> {
    let mut slots = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS];
    let mut response = httparse::Response::new(&mut []);
    let parsed = httparse::ParserConfig::default().parse_response_with_uninit_headers(
        &mut response,
        buf,
        &mut slots,
    );
    let len = match parsed {
        Ok(httparse::Status::Complete(len)) => len,
        Ok(httparse::Status::Partial) if buf.len() >= MAX_HEAD_BYTES => {
            return Err(HeadError::TooLarge);
        }
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooLarge),
        Err(err) => return Err(HeadError::Syntax(err.to_string())),
    };
    let code = response.code.unwrap_or(0);
    let status = StatusCode::from_u16(code).map_err(|_| HeadError::Syntax("bad status".into()))?;
    if status == StatusCode::SWITCHING_PROTOCOLS {
        return Err(HeadError::UnexpectedUpgrade);
    }
    let version = if response.version == Some(0) {
        Version::HTTP_10
    } else {
        Version::HTTP_11
    };
    let mut headers = HeaderMap::with_capacity(response.headers.len());
    let mut named: Vec<Vec<u8>> = Vec::new();
    // The last transfer coding seen: whether it is `chunked`.
    let mut chunked: Option<bool> = None;
    let mut lengths: Option<Result<u64, HeadError>> = None;
    for line in response.headers.iter() {
        let name =
            HeaderName::from_bytes(line.name.as_bytes()).map_err(|_| HeadError::BadHeader)?;
        if name == header::CONNECTION {
            named.extend(connection_named(std::iter::once(line.value)));
        } else if name == header::TRANSFER_ENCODING {
            if let Some(last) = line
                .value
                .split(|b| *b == b',')
                .map(<[u8]>::trim_ascii)
                .rfind(|t| !t.is_empty())
            {
                chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
            }
        } else if name == header::CONTENT_LENGTH {
            let merged = match lengths {
                None => content_length(line.value),
                Some(Ok(seen)) => content_length(line.value).and_then(|n| {
                    if n == seen {
                        Ok(n)
                    } else {
                        Err(HeadError::BadLength)
                    }
                }),
                Some(Err(err)) => Err(err),
            };
            lengths = Some(merged);
        }
        if is_fixed_hop_by_hop(&name) {
            continue;
        }
        let value = HeaderValue::from_bytes(line.value).map_err(|_| HeadError::BadHeader)?;
        headers.append(name, value);
    }
    let length = lengths.transpose()?;
    let mut says_close = false;
    let mut says_keep_alive = false;
    for token in &named {
        match token.as_slice() {
            b"close" => says_close = true,
            b"keep-alive" => says_keep_alive = true,
            other => {
                if let Ok(name) = HeaderName::from_bytes(other) {
                    headers.remove(name);
                }
            }
        }
    }
    let no_body = status.is_informational()
        || status == StatusCode::NO_CONTENT
        || status == StatusCode::NOT_MODIFIED
        || method == Method::HEAD;
    let framing = match (no_body, chunked, length) {
        (true, _, _) => Framing::Length(0),
        (false, Some(true), _) => Framing::Chunked,
        // Transfer-Encoding without chunked last: read until close.
        (false, Some(false), _) => Framing::UntilClose,
        (false, None, Some(n)) => Framing::Length(n),
        (false, None, None) => Framing::UntilClose,
    };
    let keep_alive = framing != Framing::UntilClose
        // Both framings given: answer it, then do not trust the connection.
        && !(chunked.is_some() && length.is_some())
        && !says_close
        && (version == Version::HTTP_11 || says_keep_alive);
    let head = ResponseHead {
        status,
        version,
        headers,
        framing,
        keep_alive,
    };
    Ok(Some((head, len)))
}

/// The length in one Content-Length value (a comma-separated list must
/// repeat one number).
fn content_length(value: &[u8]) -> Result<u64, HeadError> {
    let mut found: Option<u64> = None;
    for member in value.split(|b| *b == b',') {
        let digits = member.trim_ascii();
        if digits.is_empty() || digits.len() > 19 || !digits.iter().all(u8::is_ascii_digit) {
            return Err(HeadError::BadLength);
        }
        let n = digits
            .iter()
            .fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        if found.is_some_and(|f| f != n) {
            return Err(HeadError::BadLength);
        }
        found = Some(n);
    }
    found.ok_or(HeadError::BadLength)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(wire: &str) -> Result<Option<(ResponseHead, usize)>, HeadError> {
        parse_response(wire.as_bytes(), &Method::POST)
    }

    fn head(wire: &str) -> ResponseHead {
        parse(wire).unwrap().unwrap().0
    }

    #[test]
    fn request_head_drops_hop_by_hop_expect_and_sets_host_and_length() {
        let mut headers = HeaderMap::new();
        for (name, value) in [
            ("host", "client.example"),
            ("content-length", "999"),
            ("connection", "keep-alive, X-Trace-Hop"),
            ("keep-alive", "timeout=5"),
            ("transfer-encoding", "chunked"),
            ("expect", "100-continue"),
            ("x-trace-hop", "1"),
            ("authorization", "Bearer kept"),
            ("x-request-id", "kept"),
        ] {
            headers.append(
                HeaderName::from_static(name),
                HeaderValue::from_static(value),
            );
        }
        let encode = |authorization| {
            let mut out = Vec::new();
            encode_request(
                &Method::POST,
                "engine:8000",
                ("/prefix", "/v1/chat/completions?x=1"),
                (&headers, authorization, None),
                42,
                &mut out,
            );
            String::from_utf8(out).unwrap()
        };
        assert_eq!(
            encode(Authorization::Forward),
            "POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\nhost: engine:8000\r\n\
             authorization: Bearer kept\r\nx-request-id: kept\r\ncontent-length: 42\r\n\r\n"
        );
        assert_eq!(
            encode(Authorization::Drop),
            "POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\nhost: engine:8000\r\n\
             x-request-id: kept\r\ncontent-length: 42\r\n\r\n",
            "a Shoal key never reaches the engine"
        );
        let engine_key = HeaderValue::from_static("Bearer engine");
        assert_eq!(
            encode(Authorization::Set(&engine_key)),
            "POST /prefix/v1/chat/completions?x=1 HTTP/1.1\r\nhost: engine:8000\r\n\
             x-request-id: kept\r\nauthorization: Bearer engine\r\ncontent-length: 42\r\n\r\n"
        );
    }

    #[test]
    fn framing_follows_rfc_9112() {
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 12\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(12), true));
        let h = head("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, Chunked\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, true));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ncontent-length: 5\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Chunked, false));
        let h = head("HTTP/1.1 200 OK\r\ntransfer-encoding: gzip\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
        let h = head("HTTP/1.1 200 OK\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::UntilClose, false));
        let h = head("HTTP/1.1 204 No Content\r\ncontent-length: 7\r\n\r\n");
        assert_eq!((h.framing, h.keep_alive), (Framing::Length(0), true));
        let h = head("HTTP/1.1 100 Continue\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(0));
        assert!(h.status.is_informational());
        let h = head("HTTP/1.1 200 OK\r\ncontent-length: 3, 3\r\n\r\n");
        assert_eq!(h.framing, Framing::Length(3));
        let (h, _) = parse_response(
            b"HTTP/1.1 200 OK\r\ncontent-length: 3\r\n\r\n",
            &Method::HEAD,
        )
        .unwrap()
        .unwrap();
        assert_eq!(h.framing, Framing::Length(0));
    }

    #[test]
    fn keep_alive_by_version_and_connection_header() {
        assert!(
            !head("HTTP/1.1 200 OK\r\nConnection: Close\r\ncontent-length: 0\r\n\r\n").keep_alive
        );
        assert!(!head("HTTP/1.0 200 OK\r\ncontent-length: 0\r\n\r\n").keep_alive);
        let h = head("HTTP/1.0 200 OK\r\nconnection: keep-alive\r\ncontent-length: 0\r\n\r\n");
        assert!(h.keep_alive);
        assert_eq!(h.version, Version::HTTP_10);
    }

    #[test]
    fn response_headers_lose_hop_by_hop_ones() {
        let wire = "HTTP/1.1 200 OK\r\nConnection: x-hop\r\nX-Hop: 1\r\nKeep-Alive: timeout=5\r\n\
                    Transfer-Encoding: chunked\r\ncontent-type: text/event-stream\r\n\r\nbody";
        let (h, len) = parse(wire).unwrap().unwrap();
        let names: Vec<&str> = h.headers.keys().map(HeaderName::as_str).collect();
        assert_eq!(names, ["content-type"]);
        assert_eq!(&wire[len..], "body");
    }

    #[test]
    fn incomplete_heads_wait_and_bad_ones_are_refused() {
        assert!(parse("HTTP/1.1 200 OK\r\ncontent-le").unwrap().is_none());
        assert!(matches!(
            parse("HTTQ/1.1 200 OK\r\n\r\n"),
            Err(HeadError::Syntax(_))
        ));
        for bad in ["-1", "1x", "", "3, 4", "99999999999999999999999"] {
            let wire = format!("HTTP/1.1 200 OK\r\ncontent-length: {bad}\r\n\r\n");
            assert_eq!(parse(&wire).unwrap_err(), HeadError::BadLength, "{bad}");
        }
        let wire = "HTTP/1.1 200 OK\r\ncontent-length: 1\r\ncontent-length: 2\r\n\r\n";
        assert_eq!(parse(wire).unwrap_err(), HeadError::BadLength);
        assert_eq!(
            parse("HTTP/1.1 101 Switching Protocols\r\n\r\n").unwrap_err(),
            HeadError::UnexpectedUpgrade
        );
        let many: String = (0..=MAX_HEADERS).map(|i| format!("x-{i}: v\r\n")).collect();
        let wire = format!("HTTP/1.1 200 OK\r\n{many}\r\n");
        assert_eq!(parse(&wire).unwrap_err(), HeadError::TooLarge);
        let huge = format!("HTTP/1.1 200 OK\r\nx: {}", "v".repeat(MAX_HEAD_BYTES));
        assert_eq!(parse(&huge).unwrap_err(), HeadError::TooLarge);
    }
}
