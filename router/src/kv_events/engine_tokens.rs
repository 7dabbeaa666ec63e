//! Tokenizing on an engine, for a model the router has no tokenizer for
//! (`--kv-tokenize-on-engine`): vLLM's `POST /tokenize` with the prompt, or
//! with a chat request's messages so the engine applies its own chat
//! template. The answer is exactly the engine's token ids (no template or
//! tokenizer file to keep in step), at the price of one round trip to an
//! engine per request before it is routed (tests/BENCHMARKS.md has the
//! figure); a failure only costs the request its cache match.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::request::RequestInfo;
use crate::upstream::{self, FetchError, HttpClient};
use crate::workers::Worker;

/// The longest a request waits for its tokens before it is routed without
/// them: about one prefill-free engine round trip, many times over.
pub const ENGINE_TOKENIZE_TIMEOUT: Duration = Duration::from_millis(250);

/// The largest `/tokenize` answer read (256 KiB of prompt is ~64k tokens,
/// ~7 bytes each as JSON).
const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Why an engine's tokens could not be had.
#[derive(Debug, thiserror::Error)]
pub enum EngineTokenizeError {
    /// The engine did not answer in time, or the transport failed.
    #[error("tokenize call failed: {0}")]
    Fetch(#[from] FetchError),
    /// It answered with an error status.
    #[error("engine answered {0} to /tokenize")]
    Status(http::StatusCode),
    /// Its answer is not `{"tokens": [ids]}`.
    #[error("engine's /tokenize answer is not {{\"tokens\": [...]}}: {0}")]
    Answer(String),
}

/// The part of vLLM's `/tokenize` answer used.
#[derive(Deserialize)]
struct Answer {
    tokens: Vec<u32>,
}

/// The `/tokenize` body for `request`: its messages for a chat request (the
/// engine renders them with its template and the generation prompt), else
/// its prompt text; `None` without text.
pub fn tokenize_body(request: &RequestInfo) -> Option<Value> {
    let text = request.text.as_deref()?;
    let mut body = if request.turns.is_empty() {
        json!({ "prompt": text })
    } else {
        let messages: Vec<Value> = request
            .turns
            .iter()
            .map(|turn| {
                json!({
                    "role": turn.role.as_deref().unwrap_or("user"),
                    "content": text.get(turn.content.clone()).unwrap_or_default(),
                })
            })
            .collect();
        json!({ "messages": messages, "add_generation_prompt": true })
    };
    if let (Some(model), Some(map)) = (&request.model, body.as_object_mut()) {
        map.insert("model".into(), Value::String(model.clone()));
    }
    Some(body)
}

/// Parses a `/tokenize` answer.
pub fn parse_answer(body: &[u8]) -> Result<Vec<u32>, EngineTokenizeError> {
    serde_json::from_slice::<Answer>(body)
        .map(|answer| answer.tokens)
        .map_err(|e| EngineTokenizeError::Answer(e.to_string()))
}

/// Asks `worker`'s engine for `request`'s token ids.
pub async fn tokenize_on(
    client: &HttpClient,
    worker: &Worker,
    request: &RequestInfo,
) -> Result<Arc<[u32]>, EngineTokenizeError> {
    let body = tokenize_body(request)
        .ok_or_else(|| EngineTokenizeError::Answer("the request has no prompt text".into()))?;
    let (status, answer) = upstream::post_json(
        client,
        worker.url(),
        "/tokenize",
        Bytes::from(body.to_string()),
        ENGINE_TOKENIZE_TIMEOUT,
        MAX_ANSWER_BYTES,
    )
    .await?;
    if !status.is_success() {
        return Err(EngineTokenizeError::Status(status));
    }
    Ok(parse_answer(&answer)?.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_requests_send_their_messages_and_completions_their_prompt() {
        let chat = crate::request::inspect(
            br#"{"model":"m","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hi"}]}"#,
            Some(1 << 16),
        )
        .unwrap();
        assert_eq!(
            tokenize_body(&chat).unwrap(),
            json!({"model": "m", "add_generation_prompt": true, "messages": [
                {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})
        );
        let completion = crate::request::inspect(br#"{"prompt":"hello there"}"#, Some(64)).unwrap();
        assert_eq!(
            tokenize_body(&completion).unwrap(),
            json!({"prompt": "hello there"})
        );
        assert!(tokenize_body(&RequestInfo::default()).is_none());
    }

    #[test]
    fn answers_other_than_a_token_list_are_errors() {
        assert_eq!(
            parse_answer(br#"{"count":2,"max_model_len":8,"tokens":[7,9]}"#).unwrap(),
            vec![7, 9]
        );
        for bad in [
            &br#"{"tokens":[-1]}"#[..],
            b"{}",
            b"[1,2]",
            b"nope",
            br#"{"tokens":[1.5]}"#,
        ] {
            assert!(
                parse_answer(bad).is_err(),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
    }
}
