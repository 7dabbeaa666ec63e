//! vLLM's `POST /tokenize` on a mock engine with a tokenizer: a
//! completion-style `{"prompt": ...}` is tokenized with the tokenizer's
//! special tokens, a chat-style `{"messages": [...]}` is rendered with the
//! engine's chat template (if it has one) and tokenized as its chat route
//! would, so the ids are exactly those its cache blocks hold. The answer is
//! vLLM's shape, `{"count", "max_model_len", "tokens"}`. Without a
//! tokenizer the mock cuts prompts by characters and answers 404, as an
//! engine without the route would.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::{Value, json};

use super::engine::Engine;
use super::http::json_ok;
use super::openai::error_response;
use super::requests::{ApiKind, parse_request};

/// `POST /tokenize`.
pub(crate) async fn tokenize(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    engine.count_tokenize_call();
    if engine.blocker_token_size().is_none() {
        return error_response(
            StatusCode::NOT_FOUND,
            "this mock engine has no --tokenizer, so no /tokenize",
            "not_found_error",
            "no_tokenizer",
        );
    }
    let bad = |msg: String| {
        error_response(
            StatusCode::BAD_REQUEST,
            &msg,
            "invalid_request_error",
            "invalid_tokenize_request",
        )
    };
    let kind = match serde_json::from_slice::<Value>(&body) {
        Ok(v) if v.get("messages").is_some() => ApiKind::Chat,
        Ok(v) if v.get("prompt").is_some() => ApiKind::Completion,
        Ok(_) => return bad("expected {\"prompt\": ...} or {\"messages\": [...]}".into()),
        Err(e) => return bad(format!("invalid JSON body: {e}")),
    };
    let request = match parse_request(kind, &body, 1) {
        Ok(request) => request,
        Err(e) => return bad(e),
    };
    match engine.prompt_blocks(&request) {
        Ok(blocks) => json_ok(
            json!({
                "count": blocks.token_ids.len(),
                "max_model_len": engine.config().max_request_tokens(),
                "tokens": blocks.token_ids,
            })
            .to_string(),
        ),
        Err(e) => bad(e),
    }
}
