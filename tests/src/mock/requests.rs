//! Parsing of inference request bodies and the token-count rules.
//!
//! * Prompt tokens = `ceil(chars / 4)` (Unicode scalar values) of the prompt
//!   text, at least 1. For chat the text is every message's content
//!   concatenated in order (string contents, and the `text` of content parts);
//!   for `/v1/completions` it is `prompt` (a string or a one-string list); for
//!   `/generate` it is `text`. A prompt given as token ids counts one token per
//!   id.
//! * Output tokens = `max_completion_tokens`, else `max_tokens` (chat),
//!   `max_tokens` (completions) or `sampling_params.max_new_tokens`
//!   (`/generate`); absent or null means the engine's `--default-max-tokens`.
//!   The engine always generates exactly that many tokens (finish reason
//!   `length`); each output token is the 4-character text `"tok "`.

use serde_json::Value;

/// Which route a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    /// `POST /v1/chat/completions`.
    Chat,
    /// `POST /v1/completions`.
    Completion,
    /// SGLang's `POST /generate`.
    Generate,
    /// `POST /v1/responses` (OpenAI Responses API): `input` is a string or
    /// a list of messages; `max_output_tokens`.
    Responses,
    /// `POST /v1/embeddings`: `input` is a string, a list of strings or
    /// token ids; one token of work is generated (the pooling step) and
    /// the answer is a small vector per input.
    Embeddings,
}

/// The parts of a request the engine model needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// The route.
    pub kind: ApiKind,
    /// Prompt text used for prefix-cache hashing.
    pub prompt_text: String,
    /// Prompt tokens by the `ceil(chars / 4)` rule.
    pub prompt_tokens: u64,
    /// Output tokens to generate.
    pub max_tokens: u64,
    /// Whether to stream SSE events.
    pub stream: bool,
    /// `stream_options.include_usage`.
    pub include_usage: bool,
    /// The `model` field, if any.
    pub model: Option<String>,
    /// A chat request's messages as (role, content): string contents, or
    /// their text parts joined by newlines (vLLM's string content format).
    pub messages: Vec<(String, String)>,
    /// A chat request continues its final (assistant) message
    /// (`continue_final_message`) instead of starting a new one.
    pub continues_final_message: bool,
    /// vLLM's `return_token_ids`: a completions stream names its prompt's
    /// token ids in its first chunk and each chunk's output token ids.
    pub return_token_ids: bool,
    /// A completions prompt given as token ids.
    pub prompt_ids: Option<Vec<u64>>,
}

/// The text of one generated token.
pub const TOKEN_TEXT: &str = "tok ";

/// The token id of [`TOKEN_TEXT`].
pub const TOKEN_ID: u64 = 5;

/// The token id of numbered output token 0 (`w0 `); token k's is this
/// plus k, so a prompt of token ids shows how many it already holds.
pub const NUMBERED_TOKEN_ID: u64 = 1_000_000;

/// Prompt tokens for a text: `ceil(chars / 4)`, at least 1.
pub fn prompt_tokens_for(text: &str) -> u64 {
    (text.chars().count() as u64).div_ceil(4).max(1)
}

fn bad(msg: impl Into<String>) -> String {
    msg.into()
}

fn max_tokens_field(v: Option<&Value>, name: &str) -> Result<Option<u64>, String> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 => Ok(Some(n)),
            _ => Err(bad(format!("{name} must be a positive integer"))),
        },
    }
}

fn token_ids(v: &Value) -> Option<u64> {
    let ids = v.as_array()?;
    ids.iter()
        .all(Value::is_u64)
        .then_some((ids.len() as u64).max(1))
}

fn chat_text(body: &Value) -> Result<String, String> {
    let msgs = body
        .get("messages")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("messages must be a list"))?;
    if msgs.is_empty() {
        return Err(bad("messages must not be empty"));
    }
    let mut text = String::new();
    for m in msgs {
        match m.get("content") {
            Some(Value::String(s)) => text.push_str(s),
            Some(Value::Array(parts)) => {
                for p in parts {
                    if let Some(t) = p.get("text").and_then(Value::as_str) {
                        text.push_str(t);
                    }
                }
            }
            None | Some(Value::Null) => {}
            Some(_) => return Err(bad("message content must be a string or a list of parts")),
        }
    }
    Ok(text)
}

/// `messages` as (role, content) pairs (chat_text has checked their shape).
fn chat_messages(body: &Value) -> Vec<(String, String)> {
    let Some(messages) = body.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    messages
        .iter()
        .map(|m| {
            let role = m.get("role").and_then(Value::as_str).unwrap_or("user");
            let content = match m.get("content") {
                Some(Value::String(s)) => s.clone(),
                Some(Value::Array(parts)) => parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str))
                    .collect::<Vec<_>>()
                    .join("\n"),
                _ => String::new(),
            };
            (role.to_string(), content)
        })
        .collect()
}

/// A Responses API `input` list as a chat body (`{"messages": [...]}`):
/// its message items' `content` (a string, or parts with `text`).
fn json_messages(items: &[Value]) -> Value {
    let messages: Vec<Value> = items
        .iter()
        .filter(|item| item.get("content").is_some())
        .cloned()
        .collect();
    serde_json::json!({ "messages": messages })
}

/// Whether a chat request continues its final message, checked as vLLM
/// checks it: `continue_final_message` cannot go with
/// `add_generation_prompt` (true unless sent false), and the message to
/// continue must be the assistant's.
fn continuation(v: &Value, messages: &[(String, String)]) -> Result<bool, String> {
    let flag = |key: &str, default: bool| v.get(key).and_then(Value::as_bool).unwrap_or(default);
    if !flag("continue_final_message", false) {
        return Ok(false);
    }
    if flag("add_generation_prompt", true) {
        return Err(bad(
            "Cannot set both `continue_final_message` and `add_generation_prompt` to True.",
        ));
    }
    match messages.last() {
        Some((role, _)) if role == "assistant" => Ok(true),
        _ => Err(bad(
            "Cannot set continue_final_message to True when the last message is not from the assistant.",
        )),
    }
}

/// Output token `k` of a reply in `--numbered-output` mode.
pub fn numbered_token(k: u64) -> String {
    format!("w{k} ")
}

/// The numbered output words (`w{k}`) `text` already holds: where a
/// continuation of it goes on from.
pub fn numbered_words(text: &str) -> u64 {
    text.split_whitespace()
        .filter(|w| {
            w.strip_prefix('w')
                .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
        })
        .count() as u64
}

/// The numbered output tokens a prompt of token ids already holds.
pub fn numbered_ids(ids: &[u64]) -> u64 {
    ids.iter().filter(|&&id| id >= NUMBERED_TOKEN_ID).count() as u64
}

/// Parses a request body for `kind`; errors are messages for a 400.
pub fn parse_request(
    kind: ApiKind,
    body: &[u8],
    default_max_tokens: u64,
) -> Result<ParsedRequest, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON body: {e}"))?;
    if !v.is_object() {
        return Err(bad("request body must be a JSON object"));
    }
    let stream = match v.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream must be a boolean")),
    };
    let include_usage = v
        .pointer("/stream_options/include_usage")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let model = v.get("model").and_then(Value::as_str).map(str::to_string);
    let (prompt_text, ids_tokens, max) = match kind {
        ApiKind::Chat => {
            let max =
                match max_tokens_field(v.get("max_completion_tokens"), "max_completion_tokens")? {
                    Some(n) => Some(n),
                    None => max_tokens_field(v.get("max_tokens"), "max_tokens")?,
                };
            (chat_text(&v)?, None, max)
        }
        ApiKind::Completion => {
            let max = max_tokens_field(v.get("max_tokens"), "max_tokens")?;
            match v.get("prompt") {
                Some(Value::String(s)) => (s.clone(), None, max),
                Some(Value::Array(a)) if a.len() == 1 && a[0].is_string() => {
                    (a[0].as_str().unwrap_or_default().to_string(), None, max)
                }
                Some(p @ Value::Array(_)) => match token_ids(p) {
                    Some(n) => (p.to_string(), Some(n), max),
                    None => return Err(bad("batched prompts are not supported")),
                },
                _ => return Err(bad("prompt must be a string or a list of token ids")),
            }
        }
        ApiKind::Responses => {
            let max = max_tokens_field(v.get("max_output_tokens"), "max_output_tokens")?;
            match v.get("input") {
                Some(Value::String(s)) => (s.clone(), None, max),
                Some(Value::Array(items)) => {
                    let messages = json_messages(items);
                    (chat_text(&messages)?, None, max)
                }
                _ => return Err(bad("input must be a string or a list of messages")),
            }
        }
        ApiKind::Embeddings => match v.get("input") {
            Some(Value::String(s)) => (s.clone(), None, Some(1)),
            Some(Value::Array(a)) if a.iter().all(Value::is_string) && !a.is_empty() => {
                let text: Vec<&str> = a.iter().filter_map(Value::as_str).collect();
                (text.join("\n"), None, Some(1))
            }
            Some(ids @ Value::Array(_)) => match token_ids(ids) {
                Some(n) => (ids.to_string(), Some(n), Some(1)),
                None => return Err(bad("input must be a string, strings or token ids")),
            },
            _ => return Err(bad("input must be a string, strings or token ids")),
        },
        ApiKind::Generate => {
            let max = max_tokens_field(
                v.pointer("/sampling_params/max_new_tokens"),
                "max_new_tokens",
            )?;
            match (v.get("text"), v.get("input_ids")) {
                (Some(Value::String(s)), _) => (s.clone(), None, max),
                (_, Some(ids)) => match token_ids(ids) {
                    Some(n) => (ids.to_string(), Some(n), max),
                    None => return Err(bad("input_ids must be a list of token ids")),
                },
                _ => return Err(bad("text must be a string")),
            }
        }
    };
    let prompt_tokens = ids_tokens.unwrap_or_else(|| prompt_tokens_for(&prompt_text));
    let messages = match kind {
        ApiKind::Chat => chat_messages(&v),
        _ => Vec::new(),
    };
    let continues_final_message = kind == ApiKind::Chat && continuation(&v, &messages)?;
    let prompt_ids = match (kind, v.get("prompt")) {
        (ApiKind::Completion, Some(Value::Array(ids))) if ids.iter().all(Value::is_u64) => {
            Some(ids.iter().filter_map(Value::as_u64).collect())
        }
        _ => None,
    };
    Ok(ParsedRequest {
        return_token_ids: v.get("return_token_ids").and_then(Value::as_bool) == Some(true),
        prompt_ids,
        messages,
        continues_final_message,
        kind,
        prompt_tokens,
        prompt_text,
        max_tokens: max.unwrap_or(default_max_tokens),
        stream,
        include_usage,
        model,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_rules() {
        assert_eq!(prompt_tokens_for(""), 1);
        assert_eq!(prompt_tokens_for("abcd"), 1);
        assert_eq!(prompt_tokens_for("abcde"), 2);
        let body = br#"{"messages":[{"role":"system","content":"abcd"},{"role":"user","content":[{"type":"text","text":"efghi"}]}],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true}}"#;
        let p = parse_request(ApiKind::Chat, body, 16).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (p.prompt_tokens, p.max_tokens, p.stream, p.include_usage),
            (3, 7, true, true)
        );
        let p = parse_request(ApiKind::Completion, br#"{"prompt":[1,2,3]}"#, 16)
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.prompt_tokens, p.max_tokens), (3, 16));
        let p = parse_request(
            ApiKind::Generate,
            br#"{"text":"abcdefgh","sampling_params":{"max_new_tokens":5}}"#,
            16,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!((p.prompt_tokens, p.max_tokens), (2, 5));
        assert!(parse_request(ApiKind::Chat, b"{nope", 16).is_err());
        assert!(parse_request(ApiKind::Chat, br#"{"messages":[],"max_tokens":1}"#, 16).is_err());
        assert!(
            parse_request(ApiKind::Completion, br#"{"prompt":"a","max_tokens":0}"#, 16).is_err()
        );
    }
}
