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
//!
//! The `model` field names what the request wants served: a JSON body's
//! `model`, or a multipart upload's `model` form field (`multipart`).
//! Which routes exist and how each is read and booked is `route`.

mod multipart;
mod route;

use std::borrow::Cow;

use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::config::defaults::CHARS_PER_TOKEN;

pub use multipart::{boundary as multipart_boundary, field as multipart_field};
pub use route::{BodyKind, Route, Work};

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
    /// The model asked for (`model`), if the request names one.
    pub model: Option<String>,
    /// The request runs no model (tokenizing): booked as one request with
    /// no token-work, whatever its text.
    pub free: bool,
    /// The stored object the request builds on, which only the engine
    /// holding it can serve: a Responses request's
    /// `previous_response_id`, a batch's `input_file_id` (see `objects`).
    pub builds_on: Option<String>,
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
    model: Option<Cow<'a, str>>,
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
    #[serde(borrow, default)]
    previous_response_id: Option<Cow<'a, str>>,
    #[serde(borrow, default)]
    input_file_id: Option<Cow<'a, str>>,
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

/// The top-level `model` string of a JSON object whose other fields did
/// not have the expected shape, and the stored object it builds on.
fn model_of_any_shape(body: &[u8]) -> (Option<String>, Option<String>) {
    #[derive(Deserialize)]
    struct ModelOnly {
        model: Option<String>,
        previous_response_id: Option<String>,
        input_file_id: Option<String>,
    }
    serde_json::from_slice::<ModelOnly>(body)
        .ok()
        .map_or((None, None), |m| {
            (m.model, m.previous_response_id.or(m.input_file_id))
        })
}

/// Parses a request body; `want_text` keeps the prompt text for policies
/// that match on it.
pub fn inspect(body: &[u8], want_text: bool) -> Result<RequestInfo, BodyError> {
    let Ok(parsed) = serde_json::from_slice::<Body<'_>>(body) else {
        // Not our expected shape: still proxy it if it is JSON at all.
        serde_json::from_slice::<IgnoredAny>(body).map_err(|e| BodyError(e.to_string()))?;
        let (model, builds_on) = model_of_any_shape(body);
        return Ok(RequestInfo {
            prompt_tokens: tokens_for_chars(body.len() as u64),
            text: want_text.then(|| String::from_utf8_lossy(body).into_owned()),
            model,
            builds_on,
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
        model: parsed.model.map(Cow::into_owned),
        free: false,
        builds_on: parsed
            .previous_response_id
            .or(parsed.input_file_id)
            .map(Cow::into_owned),
    })
}

/// What a request on `route` tells the router, from its body and its
/// `content_type`: a JSON route's body must be JSON ([`inspect`]); a
/// multipart upload names its model in a form field and is priced as an
/// unknown prompt; any other body (an unknown `/v1/` route) is read as
/// JSON when it is and otherwise passed on with nothing learned. A route
/// that runs no model, or a bodiless request, is marked
/// [`RequestInfo::free`].
pub fn inspect_route(
    route: Route,
    body: &[u8],
    content_type: Option<&str>,
    want_text: bool,
) -> Result<RequestInfo, BodyError> {
    let mut info = match route.body() {
        BodyKind::Json => inspect(body, want_text)?,
        BodyKind::Multipart => RequestInfo {
            model: content_type
                .and_then(multipart::boundary)
                .and_then(|b| multipart::field(body, b, "model"))
                .map(str::to_owned),
            ..RequestInfo::default()
        },
        // No body (a GET or DELETE of a stored object): no model runs.
        BodyKind::Opaque if body.is_empty() => RequestInfo {
            free: true,
            ..RequestInfo::default()
        },
        BodyKind::Opaque => inspect(body, want_text).unwrap_or_default(),
    };
    info.free |= route.work() == Work::RequestOnly;
    Ok(info)
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
    fn the_model_is_read_from_json_of_any_shape_and_from_multipart_uploads() {
        let info = inspect(br#"{"model":"llama","messages":[]}"#, false).unwrap();
        assert_eq!(info.model.as_deref(), Some("llama"));
        let odd = inspect(br#"{"model":"m\u00e9","messages":5}"#, false).unwrap();
        assert_eq!(
            odd.model.as_deref(),
            Some("m\u{e9}"),
            "unexpected shape, model still read"
        );
        assert_eq!(inspect(br#"{"model":7}"#, false).unwrap().model, None);
        let upload =
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b--\r\n";
        let info = inspect_route(
            Route::AudioTranscriptions,
            upload,
            Some("multipart/form-data; boundary=b"),
            true,
        )
        .unwrap();
        assert_eq!(info.model.as_deref(), Some("whisper"));
        assert_eq!(
            info.prompt_tokens, 0,
            "an upload is priced as an unknown prompt"
        );
    }

    #[test]
    fn routes_read_their_bodies_their_own_way() {
        assert!(inspect_route(Route::ChatCompletions, b"not json", None, false).is_err());
        let other = inspect_route(Route::Other, b"not json", None, false).unwrap();
        assert_eq!(
            other,
            RequestInfo::default(),
            "opaque bodies pass untouched"
        );
        let other = inspect_route(
            Route::Other,
            br#"{"model":"x","input":"abcd"}"#,
            None,
            false,
        );
        assert_eq!(other.unwrap().model.as_deref(), Some("x"));
        let tokenize = inspect_route(Route::Tokenize, br#"{"prompt":"abcdefgh"}"#, None, false);
        assert!(tokenize.unwrap().free, "tokenizing runs no model");
        assert!(
            !inspect_route(Route::Completions, br#"{"prompt":"a"}"#, None, false)
                .unwrap()
                .free
        );
    }

    #[test]
    fn malformed_json_is_an_error() {
        let err = inspect(b"{\"messages\": [", false).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"));
        assert!(inspect(b"", false).is_err());
        assert!(inspect(&[0xff, 0xfe], false).is_err());
    }
}
