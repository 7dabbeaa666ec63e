//! Requests to the router with a tenant's key and the checks of its
//! answers: OpenAI's `x-ratelimit-*` headers (with the Go-style durations
//! of their resets) and the 429 refusals.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, Method};
use http_body_util::BodyExt;
use serde_json::Value;
use shoal_tests::client::HttpClient;
use shoal_tests::workload::chat;

/// One answer of the router, read whole.
#[derive(Debug, Clone)]
pub struct Answer {
    /// The HTTP status, the first thing every check looks at.
    pub status: u16,
    /// The response headers, read by name through [`Answer::header`].
    headers: HeaderMap,
    /// The body as text, for the error fields and failure messages.
    body: String,
}

impl Answer {
    /// A header as text, if present and readable: the checks read headers by name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// A header that must be a non-negative integer.
    pub fn number(&self, name: &str) -> Option<u64> {
        self.header(name)?.trim().parse().ok()
    }

    /// The body as JSON, if it is: the error fields live in it.
    pub fn json(&self) -> Option<Value> {
        serde_json::from_str(&self.body).ok()
    }

    /// `error.<field>` of an OpenAI error body: what the refusal checks read.
    pub fn error_field(&self, field: &str) -> Option<String> {
        self.json()?
            .pointer(&format!("/error/{field}"))?
            .as_str()
            .map(str::to_string)
    }

    /// Status, error code, Retry-After and the rate-limit headers: what a
    /// failure message needs.
    pub fn brief(&self) -> String {
        let mut limits: Vec<String> = self
            .headers
            .iter()
            .filter(|(k, _)| k.as_str().starts_with("x-ratelimit-"))
            .map(|(k, v)| format!("{k}={}", v.to_str().unwrap_or("?")))
            .collect();
        limits.sort();
        format!(
            "{} code={:?} retry-after={:?} [{}] body={:.200}",
            self.status,
            self.error_field("code"),
            self.header("retry-after"),
            limits.join(" "),
            self.body
        )
    }
}

/// Posts a non-streamed chat request (`content`, `max_tokens`) to
/// `base/v1/chat/completions` with `key` as a bearer token.
pub async fn ask(
    client: &HttpClient,
    base: &str,
    key: Option<&str>,
    content: &str,
    max_tokens: u64,
) -> Answer {
    ask_with(client, base, key, &[], content, max_tokens).await
}

/// [`ask`] with `extra` request headers (a priority, a fairness id).
pub async fn ask_with(
    client: &HttpClient,
    base: &str,
    key: Option<&str>,
    extra: &[(&str, &str)],
    content: &str,
    max_tokens: u64,
) -> Answer {
    let url = format!("{base}/v1/chat/completions");
    let auth = key.map(|k| format!("Bearer {k}"));
    let mut headers: Vec<(&str, &str)> =
        auth.iter().map(|a| ("authorization", a.as_str())).collect();
    headers.extend_from_slice(extra);
    let body = Bytes::from(chat(content, max_tokens, false).to_string());
    let resp = client
        .send(Method::POST, &url, &headers, Some(body))
        .await
        .unwrap_or_else(|e| panic!("POST {url}: {e}"));
    let (parts, body) = resp.into_parts();
    let body = body
        .collect()
        .await
        .unwrap_or_else(|e| panic!("POST {url}: the body broke: {e}"))
        .to_bytes();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

/// A Go-style duration as OpenAI writes its reset headers (`1s`, `250ms`,
/// `6m0s`, `1.5s`).
pub fn parse_duration(s: &str) -> Option<Duration> {
    let mut rest = s.trim();
    if rest.is_empty() {
        return None;
    }
    let mut secs = 0.0;
    while !rest.is_empty() {
        let n = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        if n == 0 {
            return None;
        }
        let value: f64 = rest[..n].parse().ok()?;
        rest = &rest[n..];
        let u = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..u] {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return None,
        };
        secs += value * scale;
        rest = &rest[u..];
    }
    Some(Duration::from_secs_f64(secs))
}

#[test]
fn reset_durations_parse_as_openai_writes_them() {
    let secs = |s: &str| parse_duration(s).map(|d| d.as_secs_f64());
    assert_eq!(secs("1s"), Some(1.0));
    assert_eq!(secs("250ms"), Some(0.25));
    assert_eq!(secs("6m0s"), Some(360.0));
    assert_eq!(secs("1.5s"), Some(1.5));
    assert_eq!(secs("0s"), Some(0.0));
    assert_eq!(secs(""), None);
    assert_eq!(secs("12"), None);
    assert_eq!(secs("5 s"), None);
}

/// Checks the `x-ratelimit-{limit,remaining,reset}-{family}` trio of an
/// answer: the limit is `limit`, the remaining at most that, the reset a
/// duration within the window. Returns the remaining.
pub fn rate_headers(a: &Answer, family: &str, limit: u64, window: Duration) -> Result<u64, String> {
    let got_limit = a.number(&format!("x-ratelimit-limit-{family}"));
    if got_limit != Some(limit) {
        return Err(format!(
            "x-ratelimit-limit-{family} should be {limit}, got {got_limit:?}: {}",
            a.brief()
        ));
    }
    let remaining = a
        .number(&format!("x-ratelimit-remaining-{family}"))
        .ok_or_else(|| format!("no integer x-ratelimit-remaining-{family}: {}", a.brief()))?;
    if remaining > limit {
        return Err(format!(
            "remaining {remaining} > limit {limit}: {}",
            a.brief()
        ));
    }
    let reset = a
        .header(&format!("x-ratelimit-reset-{family}"))
        .ok_or_else(|| format!("no x-ratelimit-reset-{family}: {}", a.brief()))?;
    let reset_d = parse_duration(reset)
        .ok_or_else(|| format!("x-ratelimit-reset-{family} {reset:?} is no duration"))?;
    // A whole-second rendering may round up by a second.
    if reset_d > window + Duration::from_secs(1) {
        return Err(format!(
            "x-ratelimit-reset-{family} {reset} is longer than the {window:?} window"
        ));
    }
    Ok(remaining)
}

/// Checks a refusal: 429, OpenAI's error shape with type
/// `rate_limit_error` and `code`, and an integer `Retry-After` in
/// `1..=max_retry_secs`.
pub fn refusal(a: &Answer, code: &str, max_retry_secs: u64) -> Result<(), String> {
    if a.status != 429 {
        return Err(format!("expected 429 {code}, got {}", a.brief()));
    }
    let got_code = a.error_field("code");
    let got_type = a.error_field("type");
    let message = a.error_field("message");
    if got_code.as_deref() != Some(code)
        || got_type.as_deref() != Some("rate_limit_error")
        || message.is_none_or(|m| m.is_empty())
    {
        return Err(format!(
            "expected {{error: {{message, type: rate_limit_error, code: {code}}}}}, got {}",
            a.brief()
        ));
    }
    match a.number("retry-after") {
        Some(s) if (1..=max_retry_secs).contains(&s) => Ok(()),
        other => Err(format!(
            "Retry-After should be an integer in 1..={max_retry_secs}, got {other:?} ({:?})",
            a.header("retry-after")
        )),
    }
}
