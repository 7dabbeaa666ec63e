//! The request that continues a broken stream on another engine.
//!
//! - Completions: the prompt followed by the text generated so far; or,
//!   when the stream named its token ids (vLLM's `return_token_ids`), the
//!   prompt's ids followed by the output's, replayed exactly.
//! - Chat: the messages followed by an assistant message holding that
//!   text, with `continue_final_message: true` and
//!   `add_generation_prompt: false`, so the engine renders the template
//!   with the assistant turn left open and continues it (vLLM and SGLang
//!   take both fields; llama.cpp continues a trailing assistant message
//!   by default and ignores them). A request that already ended in an
//!   assistant message it asked to continue gets the text appended to it.
//! - `max_tokens` (and `max_completion_tokens`, `min_tokens`) reduced by
//!   the tokens already generated.
//!
//! Some requests cannot be continued from text, and are refused here with
//! the reason: several choices (`n`, `best_of`), guided decoding (the
//! grammar would restart from its root on the replayed text), log
//! probabilities (the engine re-tokenizes the replayed text, so the
//! continuation's tokens and their probabilities need not match what was
//! sampled), `echo` and `suffix` (the answer would repeat or move the
//! prompt), and prompts given as token ids whose stream named no ids (no
//! text to append to).

use bytes::Bytes;
use serde_json::{Map, Value};

use super::transcript::{Refusal, ResumePoint, StreamKind};

/// Request fields that steer decoding by a grammar or schema (vLLM's
/// `guided_*` and `structured_outputs`, SGLang's `regex`, `ebnf`,
/// `json_schema`).
const GUIDED: &[&str] = &[
    "guided_json",
    "guided_regex",
    "guided_choice",
    "guided_grammar",
    "guided_decoding_backend",
    "structured_outputs",
    "regex",
    "ebnf",
    "json_schema",
];

/// The continuation to send.
#[derive(Debug, Clone, PartialEq)]
pub struct Continuation {
    /// The request body.
    pub body: Bytes,
    /// Output tokens still allowed (`None`: the request set no limit).
    pub remaining: Option<u64>,
}

/// Why `request` cannot be continued from text, if it cannot.
fn refusal(kind: StreamKind, request: &Map<String, Value>) -> Option<Refusal> {
    let more_than_one = |key| {
        request
            .get(key)
            .and_then(Value::as_u64)
            .is_some_and(|n| n > 1)
    };
    if more_than_one("n") || more_than_one("best_of") {
        return Some("the request asks for several choices");
    }
    if GUIDED
        .iter()
        .any(|key| request.get(*key).is_some_and(|v| !v.is_null()))
    {
        return Some("the request uses guided decoding");
    }
    let format = request.get("response_format").and_then(|f| f.get("type"));
    if format.is_some_and(|t| t != "text") {
        return Some("the request asks for structured output (response_format)");
    }
    let asks = |key| match request.get(key) {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::Number(n)) => n.as_u64() != Some(0) || kind == StreamKind::Completion,
        Some(_) => true,
    };
    if asks("logprobs") || asks("top_logprobs") {
        return Some("the request asks for log probabilities");
    }
    if request.get("echo").and_then(Value::as_bool) == Some(true) {
        return Some("the request echoes its prompt");
    }
    if request.get("suffix").is_some_and(|v| !v.is_null()) {
        return Some("the request has a suffix");
    }
    None
}

/// Reduces each length field `request` sets by `tokens`; the output tokens
/// still allowed (`None` when it sets no output limit).
fn reduce_limits(request: &mut Map<String, Value>, tokens: u64) -> Option<u64> {
    let mut remaining = None;
    for key in ["max_tokens", "max_completion_tokens"] {
        if let Some(limit) = request.get(key).and_then(Value::as_u64) {
            let left = limit.saturating_sub(tokens);
            request.insert(key.to_string(), Value::from(left));
            remaining = Some(remaining.map_or(left, |r: u64| r.min(left)));
        }
    }
    if let Some(min) = request.get("min_tokens").and_then(Value::as_u64) {
        request.insert("min_tokens".into(), Value::from(min.saturating_sub(tokens)));
    }
    remaining
}

/// Appends `text` to a completions request's prompt.
fn extend_prompt(request: &mut Map<String, Value>, text: &str) -> Result<(), Refusal> {
    let prompt = match request.get_mut("prompt") {
        Some(Value::String(prompt)) => prompt,
        Some(Value::Array(list)) if list.len() == 1 => match list.first_mut() {
            Some(Value::String(prompt)) => prompt,
            _ => return Err("the prompt is token ids, not text"),
        },
        _ => return Err("the prompt is not one text"),
    };
    prompt.push_str(text);
    Ok(())
}

/// Appends `text` to a chat request as the assistant's open turn.
fn extend_messages(request: &mut Map<String, Value>, text: &str) -> Result<(), Refusal> {
    let continuing = request
        .get("continue_final_message")
        .and_then(Value::as_bool)
        == Some(true);
    let Some(Value::Array(messages)) = request.get_mut("messages") else {
        return Err("the request has no messages list");
    };
    let last_is_assistant = messages
        .last()
        .and_then(|m| m.get("role"))
        .is_some_and(|r| r == "assistant");
    match messages.last_mut() {
        Some(Value::Object(last)) if continuing && last_is_assistant => {
            match last.get_mut("content") {
                Some(Value::String(content)) => content.push_str(text),
                _ => return Err("the assistant message to continue has no text content"),
            }
        }
        _ => messages.push(serde_json::json!({"role": "assistant", "content": text})),
    }
    request.insert("continue_final_message".into(), Value::Bool(true));
    request.insert("add_generation_prompt".into(), Value::Bool(false));
    Ok(())
}

/// The request that continues `original` (the body the engine was sent)
/// from `point`, or why there is none.
pub fn continuation(
    kind: StreamKind,
    original: &[u8],
    point: &ResumePoint,
) -> Result<Continuation, Refusal> {
    let mut request: Map<String, Value> =
        serde_json::from_slice(original).map_err(|_| "the request body is not a JSON object")?;
    if let Some(refusal) = refusal(kind, &request) {
        return Err(refusal);
    }
    let remaining = reduce_limits(&mut request, point.tokens);
    // The first leg's KV handoff was consumed (a disaggregated fleet's):
    // the continuing worker computes the prompt itself.
    for key in [
        "kv_transfer_params",
        "bootstrap_host",
        "bootstrap_port",
        "bootstrap_room",
    ] {
        request.remove(key);
    }
    match (kind, &point.ids) {
        // The exact tokens: the prompt's ids, then the output's.
        (StreamKind::Completion, Some(ids)) => {
            let all = ids.prompt().iter().chain(ids.output());
            let prompt = all.map(|&id| Value::from(id)).collect();
            request.insert("prompt".into(), Value::Array(prompt));
        }
        _ if point.text.is_empty() => {}
        (StreamKind::Completion, None) => extend_prompt(&mut request, &point.text)?,
        (StreamKind::Chat, _) => extend_messages(&mut request, &point.text)?,
    }
    let body = serde_json::to_vec(&request).map_err(|_| "the continuation did not serialize")?;
    Ok(Continuation {
        body: Bytes::from(body),
        remaining,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn point(text: &str, tokens: u64) -> ResumePoint {
        ResumePoint {
            text: text.into(),
            tokens,
            first: None,
            finished: false,
            done: false,
            ids: None,
        }
    }

    fn body(v: Value) -> Vec<u8> {
        serde_json::to_vec(&v).unwrap()
    }

    fn parsed(c: &Continuation) -> Value {
        serde_json::from_slice(&c.body).unwrap()
    }

    #[test]
    fn a_chat_continues_the_assistant_turn_with_fewer_tokens() {
        let original = body(json!({
            "model": "m", "stream": true, "max_tokens": 100, "min_tokens": 5,
            "messages": [{"role": "user", "content": "hi"}],
        }));
        let c = continuation(StreamKind::Chat, &original, &point("Hello wor", 3)).unwrap();
        assert_eq!(c.remaining, Some(97));
        let v = parsed(&c);
        assert_eq!(
            v["messages"][1],
            json!({"role": "assistant", "content": "Hello wor"})
        );
        assert_eq!(v["continue_final_message"], true);
        assert_eq!(v["add_generation_prompt"], false);
        assert_eq!(
            (v["max_tokens"].as_u64(), v["min_tokens"].as_u64()),
            (Some(97), Some(2))
        );
        assert_eq!(v["stream"], true);
    }

    #[test]
    fn a_chat_that_was_already_continuing_grows_its_own_assistant_message() {
        let original = body(json!({
            "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure: "}],
            "continue_final_message": true, "add_generation_prompt": false,
            "max_completion_tokens": 10,
        }));
        let c = continuation(StreamKind::Chat, &original, &point("one", 1)).unwrap();
        let v = parsed(&c);
        assert_eq!(v["messages"].as_array().unwrap().len(), 2);
        assert_eq!(v["messages"][1]["content"], "Sure: one");
        assert_eq!(c.remaining, Some(9));
    }

    #[test]
    fn a_completion_appends_to_its_prompt_and_no_limit_stays_none() {
        let original = body(json!({"prompt": ["Once"], "stream": true}));
        let c = continuation(StreamKind::Completion, &original, &point(" upon", 1)).unwrap();
        assert_eq!(parsed(&c)["prompt"], json!(["Once upon"]));
        assert_eq!(c.remaining, None);
        let ids = body(json!({"prompt": [1, 2, 3]}));
        assert!(continuation(StreamKind::Completion, &ids, &point("x", 1)).is_err());
        // Nothing shown yet: the original request, unchanged but for form.
        let c = continuation(StreamKind::Completion, &ids, &point("", 0)).unwrap();
        assert_eq!(parsed(&c)["prompt"], json!([1, 2, 3]));
    }

    #[test]
    fn a_completion_that_named_its_token_ids_replays_them_exactly() {
        let first =
            br#"{"choices":[{"text":"w0 ","prompt_token_ids":[1,2,3],"token_ids":[100,101]}]}"#;
        let ids = crate::proxy::migrate::token_ids::StreamIds::from_first(first, 64).unwrap();
        let mut at = point("w0 ", 2);
        at.ids = Some(ids);
        // Even a prompt of token ids, which has no text to append to.
        for prompt in [json!("Once"), json!([1, 2, 3])] {
            let original =
                body(json!({"prompt": prompt, "max_tokens": 5, "return_token_ids": true}));
            let c = continuation(StreamKind::Completion, &original, &at).unwrap();
            let v = parsed(&c);
            assert_eq!(v["prompt"], json!([1, 2, 3, 100, 101]));
            assert_eq!((v["max_tokens"].as_u64(), c.remaining), (Some(3), Some(3)));
            assert_eq!(v["return_token_ids"], true);
        }
    }

    #[test]
    fn requests_a_text_continuation_cannot_serve_are_refused_with_the_reason() {
        let cases = [
            (json!({"n": 2}), "several choices"),
            (json!({"guided_json": {"type": "object"}}), "guided"),
            (json!({"regex": "a+"}), "guided"),
            (
                json!({"response_format": {"type": "json_object"}}),
                "structured",
            ),
            (
                json!({"logprobs": true, "top_logprobs": 2}),
                "log probabilities",
            ),
        ];
        for (extra, reason) in cases {
            let mut request = json!({"messages": [{"role": "user", "content": "hi"}]});
            for (k, v) in extra.as_object().unwrap() {
                request[k] = v.clone();
            }
            let err = continuation(StreamKind::Chat, &body(request), &point("a", 1)).unwrap_err();
            assert!(err.contains(reason), "{err} / {reason}");
        }
        let plain = json!({"messages": [{"role": "user", "content": "hi"}],
            "response_format": {"type": "text"}, "logprobs": false, "n": 1});
        assert!(continuation(StreamKind::Chat, &body(plain), &point("a", 1)).is_ok());
        let echo = json!({"prompt": "a", "echo": true});
        assert!(continuation(StreamKind::Completion, &body(echo), &point("b", 1)).is_err());
        let logprobs = json!({"prompt": "a", "logprobs": 0});
        assert!(continuation(StreamKind::Completion, &body(logprobs), &point("b", 1)).is_err());
    }
}
