//! Request bodies and client-side helpers shared by the cross-process tests
//! and the demo: deterministic prompt text, chat bodies, held-open streams.

use serde_json::{Value, json};

use crate::client::{ClientError, HttpClient, SseStream};
use crate::mock::DEFAULT_MODEL;

/// `chars` characters of text unique to `seed` (no accidental prefix hits).
pub fn text(seed: u64, chars: usize) -> String {
    let mut x = seed
        .wrapping_mul(6_364_136_223_846_793_005)
        .wrapping_add(1_442_695_040_888_963_407);
    (0..chars)
        .map(|_| {
            x = x
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            char::from(b'a' + ((x >> 33) % 26) as u8)
        })
        .collect()
}

/// A chat request body with one user message, for the mock engines' model.
pub fn chat(content: &str, max_tokens: u64, stream: bool) -> Value {
    json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": content}],
        "max_tokens": max_tokens,
        "stream": stream,
    })
}

/// A streamed chat request that has produced its first event and is still
/// running: the router has booked it and the engine is decoding it.
/// Dropping it disconnects the client, which cancels the request.
#[derive(Debug)]
pub struct HeldStream {
    /// The open response stream.
    pub stream: SseStream,
    /// Output tokens the request asked for.
    pub max_tokens: u64,
    /// Output tokens received so far.
    pub received: u64,
}

/// Output tokens in one SSE event of a chat stream (0 for `[DONE]` and
/// events without content).
pub fn tokens_in(data: &str) -> u64 {
    serde_json::from_str::<Value>(data)
        .ok()
        .and_then(|v| {
            v.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
                .map(|piece| piece.matches(crate::mock::TOKEN_TEXT).count() as u64)
        })
        .unwrap_or(0)
}

impl HeldStream {
    /// Posts a streamed chat request (`content`, `max_tokens`) to
    /// `base/v1/chat/completions` and waits for its first event; an error
    /// for a non-200 answer or a stream that ends at once.
    pub async fn open(
        client: &HttpClient,
        base: &str,
        content: &str,
        max_tokens: u64,
    ) -> Result<Self, ClientError> {
        let url = format!("{base}/v1/chat/completions");
        let mut stream = client
            .post_stream(&url, &chat(content, max_tokens, true), &[])
            .await?;
        if stream.status != 200 {
            let first = stream.next_data().await.ok().flatten().unwrap_or_default();
            return Err(format!("{url} answered {}: {first}", stream.status).into());
        }
        match stream.next_data().await? {
            Some(first) => Ok(Self {
                stream,
                max_tokens,
                received: tokens_in(&first),
            }),
            None => Err(format!("{url}: the stream ended before its first event").into()),
        }
    }

    /// Reads the rest of the stream; returns the output tokens received
    /// (the first event included) once `[DONE]` arrives, or an error if the
    /// stream broke before it.
    pub async fn finish(mut self) -> Result<u64, ClientError> {
        while let Some(data) = self.stream.next_data().await? {
            if data == "[DONE]" {
                return Ok(self.received);
            }
            self.received += tokens_in(&data);
        }
        Err(format!(
            "stream ended after {} of {} tokens without [DONE]",
            self.received, self.max_tokens
        )
        .into())
    }
}

/// Sends one short non-streamed chat request to `base`; `Ok` only for a 200
/// whose body has a completion.
pub async fn short_request(
    client: &HttpClient,
    base: &str,
    content: &str,
    max_tokens: u64,
) -> Result<(), ClientError> {
    let url = format!("{base}/v1/chat/completions");
    let resp = client
        .post_json(&url, &chat(content, max_tokens, false))
        .await?;
    if resp.status != 200 {
        return Err(format!("{url} answered {}: {}", resp.status, resp.text()).into());
    }
    let v = resp.json()?;
    if v.pointer("/choices/0/message/content").is_none() {
        return Err(format!("{url}: no completion in {v}").into());
    }
    Ok(())
}
