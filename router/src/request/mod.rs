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
mod scan;

use crate::config::defaults::CHARS_PER_TOKEN;

pub use multipart::{boundary as multipart_boundary, field as multipart_field};
pub use route::{BodyKind, Route, Work};
pub use scan::Turn;

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
    /// A chat request's messages as `text` holds them (role and content
    /// range), with `text`: what a chat template is rendered from.
    pub turns: Vec<Turn>,
    /// The model asked for (`model`), if the request names one.
    pub model: Option<String>,
    /// The request runs no model (tokenizing): booked as one request with
    /// no token-work, whatever its text.
    pub runs_no_model: bool,
    /// The stored object the request builds on, which only the engine
    /// holding it can serve: a Responses request's
    /// `previous_response_id`, a batch's `input_file_id` (see `objects`).
    pub builds_on: Option<String>,
    /// The prompt's token ids as one of its engines tokenized it
    /// (`--kv-tokenize-on-engine`, a model with no local tokenizer).
    pub token_ids: Option<std::sync::Arc<[u32]>>,
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

/// Prompt tokens for `chars` characters of text (the documented rule).
pub fn tokens_for_chars(chars: u64) -> u64 {
    chars.div_ceil(CHARS_PER_TOKEN)
}

/// Parses a request body; `text_limit` keeps the first that many bytes of
/// prompt text for policies that match on it (`None`: no text).
pub fn inspect(body: &[u8], text_limit: Option<usize>) -> Result<RequestInfo, BodyError> {
    let scanned = scan::scan(body, text_limit).map_err(|e| BodyError(e.to_string()))?;
    if scanned.odd {
        // Not our expected shape: still proxied, priced by its length.
        return Ok(RequestInfo {
            prompt_tokens: tokens_for_chars(body.len() as u64),
            text: text_limit.map(|limit| {
                let head = body.get(..limit.saturating_add(3)).unwrap_or(body);
                let text = String::from_utf8_lossy(head);
                scan::head_of(&text, limit).to_string()
            }),
            builds_on: scanned.builds_on(),
            model: scanned.model,
            ..RequestInfo::default()
        });
    }
    let [max_tokens, max_completion_tokens, max_new_tokens] = scanned.max_tokens;
    let builds_on = scanned.builds_on();
    Ok(RequestInfo {
        prompt_tokens: tokens_for_chars(scanned.chars).saturating_add(scanned.ids),
        max_output_tokens: max_tokens.or(max_completion_tokens).or(max_new_tokens),
        stream: scanned.stream.unwrap_or(false),
        text: scanned.text,
        turns: scanned.turns,
        model: scanned.model,
        runs_no_model: false,
        builds_on,
        token_ids: None,
    })
}

/// What a request on `route` tells the router, from its body and its
/// `content_type`: a JSON route's body must be JSON ([`inspect`]); a
/// multipart upload names its model in a form field and is priced as an
/// unknown prompt; any other body (an unknown `/v1/` route) is read as
/// JSON when it is and otherwise passed on with nothing learned. A route
/// that runs no model, or a bodiless request, is marked
/// [`RequestInfo::runs_no_model`]. `text_limit` is [`inspect`]'s.
pub fn inspect_route(
    route: Route,
    body: &[u8],
    content_type: Option<&str>,
    text_limit: Option<usize>,
) -> Result<RequestInfo, BodyError> {
    let mut info = match route.body() {
        BodyKind::Json => inspect(body, text_limit)?,
        BodyKind::Multipart => RequestInfo {
            model: content_type
                .and_then(multipart::boundary)
                .and_then(|b| multipart::field(body, b, "model"))
                .map(str::to_owned),
            ..RequestInfo::default()
        },
        // No body (a GET or DELETE of a stored object): no model runs.
        BodyKind::Opaque if body.is_empty() => RequestInfo {
            runs_no_model: true,
            ..RequestInfo::default()
        },
        BodyKind::Opaque => inspect(body, text_limit).unwrap_or_default(),
    };
    info.runs_no_model |= route.work() == Work::RequestOnly;
    Ok(info)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Keep all the prompt text.
    const ALL: Option<usize> = Some(usize::MAX);

    #[test]
    fn chat_messages_count_all_text_parts() {
        let body = br#"{"model":"m","stream":true,"max_tokens":50,
            "messages":[{"role":"system","content":"abcd"},
                        {"role":"user","content":[{"type":"text","text":"efghi"},
                                                   {"type":"image_url","image_url":{"url":"data:x"}}]}]}"#;
        let info = inspect(body, ALL).unwrap();
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
            None,
        )
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_output_tokens), (2, Some(7)));
        assert!(info.text.is_none());
        let info = inspect(
            br#"{"text":"12345678","sampling_params":{"max_new_tokens":9}}"#,
            None,
        )
        .unwrap();
        assert_eq!((info.prompt_tokens, info.max_output_tokens), (2, Some(9)));
        let info = inspect(br#"{"input_ids":[1,2,3,4,5]}"#, None).unwrap();
        assert_eq!(info.prompt_tokens, 5);
        let info = inspect(br#"{"input":"a\u00e9\"b"}"#, None).unwrap();
        assert_eq!(info.prompt_tokens, 1, "escapes decode to 4 chars");
    }

    #[test]
    fn unexpected_shapes_are_estimated_not_rejected() {
        let info = inspect(br#"{"messages":5,"max_tokens":"x"}"#, None).unwrap();
        assert_eq!(info.prompt_tokens, tokens_for_chars(32));
        let info = inspect(b"[1,2,3]", None).unwrap();
        assert_eq!(info.max_output_tokens, None);
    }

    #[test]
    fn the_model_is_read_from_json_of_any_shape_and_from_multipart_uploads() {
        let info = inspect(br#"{"model":"llama","messages":[]}"#, None).unwrap();
        assert_eq!(info.model.as_deref(), Some("llama"));
        let odd = inspect(br#"{"model":"m\u00e9","messages":5}"#, None).unwrap();
        assert_eq!(
            odd.model.as_deref(),
            Some("m\u{e9}"),
            "unexpected shape, model still read"
        );
        assert_eq!(inspect(br#"{"model":7}"#, None).unwrap().model, None);
        let upload =
            b"--b\r\nContent-Disposition: form-data; name=\"model\"\r\n\r\nwhisper\r\n--b--\r\n";
        let info = inspect_route(
            Route::AudioTranscriptions,
            upload,
            Some("multipart/form-data; boundary=b"),
            ALL,
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
        assert!(inspect_route(Route::ChatCompletions, b"not json", None, None).is_err());
        let other = inspect_route(Route::Other, b"not json", None, None).unwrap();
        assert_eq!(
            other,
            RequestInfo::default(),
            "opaque bodies pass untouched"
        );
        let other = inspect_route(Route::Other, br#"{"model":"x","input":"abcd"}"#, None, None);
        assert_eq!(other.unwrap().model.as_deref(), Some("x"));
        let tokenize = inspect_route(Route::Tokenize, br#"{"prompt":"abcdefgh"}"#, None, None);
        assert!(tokenize.unwrap().runs_no_model, "tokenizing runs no model");
        assert!(
            !inspect_route(Route::Completions, br#"{"prompt":"a"}"#, None, None)
                .unwrap()
                .runs_no_model
        );
    }

    #[test]
    fn malformed_json_is_an_error() {
        let err = inspect(b"{\"messages\": [", None).unwrap_err();
        assert!(err.to_string().contains("not valid JSON"));
        assert!(inspect(b"", None).is_err());
        assert!(inspect(&[0xff, 0xfe], None).is_err());
    }
}
