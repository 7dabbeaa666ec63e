//! What the router learns from a request body before routing it.
//!
//! The body is parsed once. Token-work is estimated without a tokenizer:
//! **prompt tokens = ceil(characters / 4)** over all prompt text (message
//! contents and text parts, `prompt`, `input`, `text`), plus one token per
//! element of a token-id array; image and audio parts are not counted.
//! Output work is the request's `max_tokens` (`max_completion_tokens`, or
//! SGLang's `sampling_params.max_new_tokens`) when given. A body that is
//! valid JSON but of an unexpected shape is still proxied (the engine judges
//! it); its prompt is then estimated from its byte length.

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::config::defaults::CHARS_PER_TOKEN;

/// The inference endpoints the router proxies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// `POST /v1/chat/completions`
    ChatCompletions,
    /// `POST /v1/completions`
    Completions,
    /// `POST /v1/embeddings`
    Embeddings,
    /// `POST /generate` (SGLang native)
    Generate,
}

impl Route {
    /// Every proxied route, for building the HTTP router.
    pub const ALL: [Route; 4] = [
        Route::ChatCompletions,
        Route::Completions,
        Route::Embeddings,
        Route::Generate,
    ];

    /// The path this route is served on (and forwarded to).
    pub fn path(self) -> &'static str {
        match self {
            Route::ChatCompletions => "/v1/chat/completions",
            Route::Completions => "/v1/completions",
            Route::Embeddings => "/v1/embeddings",
            Route::Generate => "/generate",
        }
    }

    /// The route served at `path`, if any.
    pub fn from_path(path: &str) -> Option<Route> {
        Route::ALL.into_iter().find(|route| route.path() == path)
    }

    /// Position in [`Route::ALL`], for per-route tables.
    pub const fn index(self) -> usize {
        self as usize
    }

    /// Short label for metrics.
    pub fn label(self) -> &'static str {
        match self {
            Route::ChatCompletions => "chat_completions",
            Route::Completions => "completions",
            Route::Embeddings => "embeddings",
            Route::Generate => "generate",
        }
    }
}

/// What a policy may use about the request being routed.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestInfo {
    /// Estimated prompt tokens.
    pub prompt_tokens: u64,
    /// Requested output tokens, when the request says.
    pub max_output_tokens: Option<u64>,
    /// Whether the client asked for a stream.
    pub stream: bool,
    /// The prompt text, only filled when the policy asks for it.
    pub text: Option<String>,
}

impl RequestInfo {
    /// Prompt plus requested output: what the request will cost the engine.
    pub fn token_work(&self) -> u64 {
        self.prompt_tokens
            .saturating_add(self.max_output_tokens.unwrap_or(0))
    }
}

/// A body that is not JSON at all.
#[derive(Debug, thiserror::Error)]
#[error("request body is not valid JSON: {0}")]
pub struct BodyError(String);

#[derive(Deserialize)]
#[serde(untagged)]
enum Text<'a> {
    Str(#[serde(borrow)] Cow<'a, str>),
    /// A token id (only counted, never read).
    Number(#[allow(dead_code)] f64),
    List(#[serde(borrow)] Vec<Text<'a>>),
    Part(#[serde(borrow)] Part<'a>),
}

#[derive(Deserialize)]
struct Part<'a> {
    #[serde(borrow, default)]
    text: Option<Cow<'a, str>>,
}

#[derive(Deserialize)]
struct Message<'a> {
    #[serde(borrow, default)]
    content: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct SamplingParams {
    #[serde(default)]
    max_new_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct Body<'a> {
    #[serde(borrow, default)]
    messages: Option<Vec<Message<'a>>>,
    #[serde(borrow, default)]
    prompt: Option<Text<'a>>,
    #[serde(borrow, default)]
    input: Option<Text<'a>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(borrow, default)]
    input_ids: Option<Text<'a>>,
    #[serde(default)]
    max_tokens: Option<u64>,
    #[serde(default)]
    max_completion_tokens: Option<u64>,
    #[serde(default)]
    sampling_params: Option<SamplingParams>,
    #[serde(default)]
    stream: Option<bool>,
}

#[derive(Default)]
struct Tally {
    chars: u64,
    ids: u64,
    text: Option<String>,
}

impl Tally {
    fn add(&mut self, text: &Text<'_>) {
        match text {
            Text::Str(s) => self.add_str(s),
            Text::Number(_) => self.ids += 1,
            Text::List(items) => items.iter().for_each(|item| self.add(item)),
            Text::Part(part) => {
                if let Some(s) = &part.text {
                    self.add_str(s);
                }
            }
        }
    }

    fn add_str(&mut self, s: &str) {
        self.chars += s.chars().count() as u64;
        if let Some(buffer) = &mut self.text {
            if !buffer.is_empty() {
                buffer.push('\n');
            }
            buffer.push_str(s);
        }
    }
}

/// Prompt tokens for `chars` characters of text (the documented rule).
pub fn tokens_for_chars(chars: u64) -> u64 {
    chars.div_ceil(CHARS_PER_TOKEN)
}

/// Parses a request body; `want_text` keeps the prompt text for policies
/// that match on it.
pub fn inspect(body: &[u8], want_text: bool) -> Result<RequestInfo, BodyError> {
    let Ok(parsed) = serde_json::from_slice::<Body<'_>>(body) else {
        // Not our expected shape: still proxy it if it is JSON at all.
        serde_json::from_slice::<IgnoredAny>(body).map_err(|e| BodyError(e.to_string()))?;
        return Ok(RequestInfo {
            prompt_tokens: tokens_for_chars(body.len() as u64),
            text: want_text.then(|| String::from_utf8_lossy(body).into_owned()),
            ..RequestInfo::default()
        });
    };
    let mut tally = Tally {
        text: want_text.then(String::new),
        ..Tally::default()
    };
    for message in parsed.messages.iter().flatten() {
        if let Some(content) = &message.content {
            tally.add(content);
        }
    }
    [
        &parsed.prompt,
        &parsed.input,
        &parsed.text,
        &parsed.input_ids,
    ]
    .into_iter()
    .flatten()
    .for_each(|text| tally.add(text));
    Ok(RequestInfo {
        prompt_tokens: tokens_for_chars(tally.chars).saturating_add(tally.ids),
        max_output_tokens: parsed
            .max_tokens
            .or(parsed.max_completion_tokens)
            .or(parsed.sampling_params.and_then(|p| p.max_new_tokens)),
        stream: parsed.stream.unwrap_or(false),
        text: tally.text,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chat_messages_count_all_text_parts() {
        let body = br#"{"model":"m","stream":true,"max_tokens":50,
            "messages":[{"role":"system","content":"abcd"},
                        {"role":"user","content":[{"type":"text","text":"efghi"},
                                                   {"type":"image_url","image_url":{"url":"data:x"}}]}]}"#;
        let info = inspect(body, true).unwrap();
        assert_eq!(info.prompt_tokens, 3, "9 chars -> ceil(9/4)");
        assert_eq!(info.max_output_tokens, Some(50));
        assert!(info.stream);
        assert_eq!(info.text.as_deref(), Some("abcd\nefghi"));
        assert_eq!(info.token_work(), 53);
    }

    #[test]
    fn completions_generate_and_embeddings_shapes() {
        let info = inspect(
            br#"{"prompt":["aaaa","bbbb"],"max_completion_tokens":7}"#,
            false,
        )
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_output_tokens), (2, Some(7)));
        assert!(info.text.is_none());
        let info = inspect(
            br#"{"text":"12345678","sampling_params":{"max_new_tokens":9}}"#,
            false,
        )
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_output_tokens), (2, Some(9)));
        let info = inspect(br#"{"input_ids":[1,2,3,4,5]}"#, false).unwrap();
        assert_eq!(info.prompt_tokens, 5);
        let info = inspect(br#"{"input":"a\u00e9\"b"}"#, false).unwrap();
        assert_eq!(info.prompt_tokens, 1, "escapes decode to 4 chars");
    }

    #[test]
    fn unexpected_shapes_are_estimated_not_rejected() {
        let info = inspect(br#"{"messages":5,"max_tokens":"x"}"#, false).unwrap();
        assert_eq!(info.prompt_tokens, tokens_for_chars(32));
        let info = inspect(b"[1,2,3]", false).unwrap();
        assert_eq!(info.max_output_tokens, None);
    }

    #[test]
    fn malformed_json_is_an_error() {
        let err = inspect(b"{\"messages\": [", false).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"));
        assert!(inspect(b"", false).is_err());
        assert!(inspect(&[0xff, 0xfe], false).is_err());
    }
}
