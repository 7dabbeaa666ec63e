//! Asking an OpenAI-style stream for its usage when the client did not,
//! and hiding the answer from the client again.
//!
//! A tenant's tokens are settled from the `usage` object the engine ends
//! its answer with ([`super::usage`]). vLLM, SGLang and llama.cpp only end
//! a stream (`"stream": true` on `/v1/chat/completions` and
//! `/v1/completions`) with one when the request said
//! `"stream_options": {"include_usage": true}`. So the proxy asks for it
//! ([`ask_for_usage`]) and, when it had to ask, removes the usage-only
//! chunk from the events the client receives ([`UsageChunkFilter`]), so
//! the client sees the stream it asked for while the usage tail still
//! reads the engine's own answer.

use std::borrow::Cow;
use std::ops::Range;

use bytes::{Bytes, BytesMut};
use memchr::memmem;
use serde_json::Value;

/// Bytes of one unfinished event [`UsageChunkFilter`] holds back at most:
/// a bigger event is forwarded as it comes, unfiltered, so a stream never
/// costs the proxy more than this, nor the client its latency.
pub const MAX_HELD: usize = 64 * 1024;

/// What a request with no `stream_options` gets, after its last member.
const ADD_OPTIONS: &[u8] = br#","stream_options":{"include_usage":true}"#;

/// What `"stream_options": null` becomes.
const OPTIONS: &[u8] = br#"{"include_usage":true}"#;

/// The request body to send the engine so a stream ends with its usage,
/// or `None` when `body` needs no change.
///
/// Why: without `stream_options.include_usage` an OpenAI-style engine
/// never says what a stream used, and the tenant stays charged its
/// estimate. `Some` means the client did not ask for the usage chunk, so
/// the caller must pass the answer through a [`UsageChunkFilter`].
///
/// Changes only a JSON object whose top-level `stream` is `true` and whose
/// top-level `stream_options` does not already say `"include_usage":
/// true`. Everything else in the body is kept byte for byte:
/// - no `stream_options`: `,"stream_options":{"include_usage":true}` goes
///   just before the object's closing `}`;
/// - `stream_options` an object: `"include_usage":true` is added to it, or
///   its `include_usage` of `false` or `null` becomes `true` (its other
///   options, e.g. `continuous_usage_stats`, stay);
/// - `"stream_options": null` (no options) becomes
///   `{"include_usage":true}`.
///
/// Left alone (`None`): not JSON, not an object, not streaming, already
/// asked, `stream_options` neither an object nor `null`, or
/// `include_usage` neither a boolean nor `null`: the engine answers the
/// client's own request, errors included. Duplicate keys count as JSON
/// parsers in engines read them: the last one wins.
pub fn ask_for_usage(body: &[u8]) -> Option<Bytes> {
    // Valid JSON first (serde_json skips it without recursing): the scan
    // below may then trust the syntax, though it never indexes past the
    // end either.
    serde_json::from_slice::<serde::de::IgnoredAny>(body).ok()?;
    let open = skip_ws(body, 0);
    if body.get(open) != Some(&b'{') {
        return None;
    }
    let top = members(body, open)?;
    let stream = last_member(body, &top.members, b"stream")?;
    if body.get(stream.value.clone())? != b"true" {
        return None;
    }
    let Some(options) = last_member(body, &top.members, b"stream_options") else {
        return Some(splice(body, top.close..top.close, ADD_OPTIONS));
    };
    match body.get(options.value.start)? {
        b'n' => return Some(splice(body, options.value.clone(), OPTIONS)),
        b'{' => {}
        _ => return None,
    }
    let inner = members(body, options.value.start)?;
    match last_member(body, &inner.members, b"include_usage") {
        None if inner.members.is_empty() => Some(splice(
            body,
            inner.close..inner.close,
            br#""include_usage":true"#,
        )),
        None => Some(splice(
            body,
            inner.close..inner.close,
            br#","include_usage":true"#,
        )),
        Some(include) => match body.get(include.value.clone())? {
            b"false" | b"null" => Some(splice(body, include.value.clone(), b"true")),
            _ => None,
        },
    }
}

/// One `"key": value` of an object: where its quoted key and its value
/// are in the text.
#[derive(Debug, Clone)]
struct Member {
    key: Range<usize>,
    value: Range<usize>,
}

/// An object's members and where its closing `}` is.
#[derive(Debug)]
struct Object {
    members: Vec<Member>,
    close: usize,
}

/// JSON's whitespace from `at` on: where the next token starts.
fn skip_ws(text: &[u8], mut at: usize) -> usize {
    while matches!(text.get(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        at += 1;
    }
    at
}

/// The members of the object whose `{` is at `open` (nested values are
/// skipped whole, so only this object's own keys are seen).
fn members(text: &[u8], open: usize) -> Option<Object> {
    let mut members = Vec::new();
    let mut at = skip_ws(text, open + 1);
    if text.get(at) == Some(&b'}') {
        return Some(Object { members, close: at });
    }
    loop {
        if text.get(at) != Some(&b'"') {
            return None;
        }
        let key_end = string_end(text, at)?;
        let colon = skip_ws(text, key_end);
        if text.get(colon) != Some(&b':') {
            return None;
        }
        let value_start = skip_ws(text, colon + 1);
        let value_end = value_end(text, value_start)?;
        members.push(Member {
            key: at..key_end,
            value: value_start..value_end,
        });
        let next = skip_ws(text, value_end);
        match text.get(next)? {
            b',' => at = skip_ws(text, next + 1),
            b'}' => {
                return Some(Object {
                    members,
                    close: next,
                });
            }
            _ => return None,
        }
    }
}

/// The last member named `name` (keys compared unescaped).
fn last_member<'a>(text: &[u8], members: &'a [Member], name: &[u8]) -> Option<&'a Member> {
    members.iter().rev().find(|member| {
        let Some(quoted) = text.get(member.key.clone()) else {
            return false;
        };
        let raw = quoted
            .get(1..quoted.len().saturating_sub(1))
            .unwrap_or_default();
        if raw.contains(&b'\\') {
            serde_json::from_slice::<String>(quoted).is_ok_and(|key| key.as_bytes() == name)
        } else {
            raw == name
        }
    })
}

/// Just past the string whose opening `"` is at `open`.
fn string_end(text: &[u8], open: usize) -> Option<usize> {
    let mut at = open + 1;
    loop {
        let found = at + memchr::memchr2(b'"', b'\\', text.get(at..)?)?;
        if text.get(found) == Some(&b'"') {
            return Some(found + 1);
        }
        at = found + 2;
    }
}

/// Just past the value starting at `start`.
fn value_end(text: &[u8], start: usize) -> Option<usize> {
    match text.get(start)? {
        b'"' => string_end(text, start),
        b'{' | b'[' => {
            let mut depth = 0usize;
            let mut at = start;
            while let Some(byte) = text.get(at) {
                match byte {
                    b'"' => {
                        at = string_end(text, at)?;
                        continue;
                    }
                    b'{' | b'[' => depth += 1,
                    b'}' | b']' => {
                        depth = depth.checked_sub(1)?;
                        if depth == 0 {
                            return Some(at + 1);
                        }
                    }
                    _ => {}
                }
                at += 1;
            }
            None
        }
        _ => {
            let mut at = start;
            while text
                .get(at)
                .is_some_and(|b| !matches!(b, b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r'))
            {
                at += 1;
            }
            (at > start).then_some(at)
        }
    }
}

/// `text` with `range` replaced by `with`.
fn splice(text: &[u8], range: Range<usize>, with: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(text.len() + with.len());
    out.extend_from_slice(text.get(..range.start).unwrap_or_default());
    out.extend_from_slice(with);
    out.extend_from_slice(text.get(range.end..).unwrap_or_default());
    Bytes::from(out)
}

/// Whether one server-sent event is the usage-only chunk an engine ends a
/// stream with when asked for its usage: a `data:` payload that is a JSON
/// object with `"choices": []` and a `"usage"` object.
///
/// Why: that chunk is the one [`UsageChunkFilter`] hides from a client
/// that did not ask for it. `event` is the event's bytes, its blank line
/// included or not; `data:` lines (with or without the space after the
/// colon) are joined by `\n` as SSE says, other lines are ignored. Only an
/// event that mentions both `"usage"` and `"choices"`, with `"choices"`
/// followed by `: []` and `"usage"` by `: {`, is parsed, so token chunks
/// (vLLM's say `"usage": null` when usage was asked for) cost a substring
/// search, not a JSON parse.
pub fn is_usage_only_chunk(event: &[u8]) -> bool {
    if memmem::find(event, b"\"usage\"").is_none() || memmem::find(event, b"\"choices\"").is_none()
    {
        return false;
    }
    let mut data: Option<Cow<'_, [u8]>> = None;
    for line in event.split(|&b| b == b'\n') {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(value) = line.strip_prefix(b"data:") else {
            continue;
        };
        let value = value.strip_prefix(b" ").unwrap_or(value);
        data = Some(match data {
            None => Cow::Borrowed(value),
            Some(so_far) => {
                let mut joined = so_far.into_owned();
                joined.push(b'\n');
                joined.extend_from_slice(value);
                Cow::Owned(joined)
            }
        });
    }
    let Some(data) = data else {
        return false;
    };
    if !key_followed_by(&data, b"\"choices\"", b"[]") || !key_followed_by(&data, b"\"usage\"", b"{")
    {
        return false;
    }
    let Ok(Value::Object(chunk)) = serde_json::from_slice::<Value>(&data) else {
        return false;
    };
    matches!(chunk.get("choices"), Some(Value::Array(choices)) if choices.is_empty())
        && matches!(chunk.get("usage"), Some(Value::Object(_)))
}

/// Whether some `key` in `json` is followed by `:` and then `tokens`,
/// whitespace allowed around each: a cheap look before parsing.
fn key_followed_by(json: &[u8], key: &[u8], tokens: &[u8]) -> bool {
    memmem::find_iter(json, key).any(|at| {
        let mut rest = json.get(at + key.len()..).unwrap_or_default();
        b":".iter()
            .chain(tokens)
            .all(|&token| match rest.trim_ascii_start().split_first() {
                Some((&first, tail)) if first == token => {
                    rest = tail;
                    true
                }
                _ => false,
            })
    })
}

/// Whether [`UsageChunkFilter`] drops the complete `event`: a usage-only
/// chunk no longer than [`MAX_HELD`] (a longer event is forwarded
/// unfiltered however it was split, as one held that long would be).
fn drops(event: &[u8]) -> bool {
    event.len() <= MAX_HELD && is_usage_only_chunk(event)
}

/// Removes the usage-only chunk from an OpenAI-style event stream, fed
/// piece by piece as the engine's answer arrives.
///
/// Why: when [`ask_for_usage`] added `include_usage` to a request, the
/// engine ends its stream with a chunk the client never asked for; the
/// client must get exactly the events it would have got without the
/// proxy, less that one ([`is_usage_only_chunk`]). Events end at a blank
/// line (`\n\n` or `\r\n\r\n`); everything else (`data: [DONE]`,
/// comments, malformed events) goes through unchanged and in order.
///
/// Not undone: with `include_usage` on, vLLM also writes `"usage": null`
/// into every ordinary chunk (and, when the request said
/// `continuous_usage_stats`, a usage object); ordinary chunks are
/// forwarded as the engine wrote them.
///
/// Latency and memory: a complete event is forwarded by the very
/// [`push`](Self::push) that completes it; only an unfinished last event
/// is held, and one held past [`MAX_HELD`] bytes is forwarded as it comes,
/// unfiltered, to its end (so no event longer than that is filtered: a
/// usage chunk is a few hundred bytes). Each byte is scanned once; a
/// piece of complete, ordinary events comes back as itself (or a slice of
/// it), not copied.
#[derive(Debug)]
pub struct UsageChunkFilter {
    /// The unfinished event's bytes so far.
    held: Vec<u8>,
    /// The unfinished event outgrew [`MAX_HELD`]: forward it to its end.
    passing: bool,
    /// The last two bytes pushed, to see a blank line split across pieces.
    last: [u8; 2],
}

impl Default for UsageChunkFilter {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageChunkFilter {
    /// A filter at the start of a stream.
    pub fn new() -> Self {
        // The stream starts at the start of a line, as after a `\n`.
        Self {
            held: Vec::new(),
            passing: false,
            last: [b'\n', b'\n'],
        }
    }

    /// The bytes of `piece` (and of earlier pieces held back) to forward
    /// to the client now.
    pub fn push(&mut self, piece: Bytes) -> Bytes {
        let mut out = Out::default();
        let mut start = 0;
        let mut from = 0;
        while let Some(found) = piece
            .get(from..)
            .and_then(|rest| memchr::memchr(b'\n', rest))
        {
            let newline = from + found;
            from = newline + 1;
            if !self.blank_line_at(&piece, newline) {
                continue;
            }
            let event = start..newline + 1;
            start = newline + 1;
            if self.passing {
                self.passing = false;
                out.range(&piece, event);
            } else if self.held.is_empty() {
                if !drops(piece.get(event.clone()).unwrap_or_default()) {
                    out.range(&piece, event);
                }
            } else {
                self.held
                    .extend_from_slice(piece.get(event).unwrap_or_default());
                if !drops(&self.held) {
                    out.owned(&piece, &self.held);
                }
                self.release_held();
            }
        }
        if start < piece.len() {
            if self.passing {
                out.range(&piece, start..piece.len());
            } else {
                self.held
                    .extend_from_slice(piece.get(start..).unwrap_or_default());
                if self.held.len() > MAX_HELD {
                    out.owned(&piece, &self.held);
                    self.release_held();
                    self.passing = true;
                }
            }
        }
        match piece.len() {
            0 => {}
            1 => self.last = [self.last[1], piece[0]],
            n => self.last = [piece[n - 2], piece[n - 1]],
        }
        out.into_bytes(&piece)
    }

    /// What is still held when the stream ends (an event the engine did
    /// not end with a blank line), to forward unchanged.
    pub fn finish(&mut self) -> Bytes {
        self.passing = false;
        Bytes::from(std::mem::take(&mut self.held))
    }

    /// Whether the `\n` at `newline` in `piece` ends a blank line (after
    /// `\n` or `\n\r`), looking back into earlier pieces when needed.
    fn blank_line_at(&self, piece: &[u8], newline: usize) -> bool {
        let before = |back: usize| match newline.checked_sub(back) {
            Some(at) => piece.get(at).copied(),
            None => self.last.get(2 + newline - back).copied(),
        };
        match before(1) {
            Some(b'\n') => true,
            Some(b'\r') => before(2) == Some(b'\n'),
            _ => false,
        }
    }

    /// Empties the held event, keeping a small allocation for the next.
    fn release_held(&mut self) {
        if self.held.capacity() > 8 * 1024 {
            self.held = Vec::new();
        } else {
            self.held.clear();
        }
    }
}

/// What one push forwards: a run of the piece, copied out only when held
/// bytes or a dropped event break it up.
#[derive(Debug, Default)]
struct Out {
    run: Option<Range<usize>>,
    copied: BytesMut,
}

impl Out {
    /// Forwards `range` of `piece`, after everything before it.
    fn range(&mut self, piece: &[u8], range: Range<usize>) {
        match self.run.take() {
            Some(run) if run.end == range.start => self.run = Some(run.start..range.end),
            Some(run) => {
                self.copied
                    .extend_from_slice(piece.get(run).unwrap_or_default());
                self.run = Some(range);
            }
            None => self.run = Some(range),
        }
    }

    /// Forwards `bytes` (not from the piece), after everything before.
    fn owned(&mut self, piece: &[u8], bytes: &[u8]) {
        if let Some(run) = self.run.take() {
            self.copied
                .extend_from_slice(piece.get(run).unwrap_or_default());
        }
        self.copied.extend_from_slice(bytes);
    }

    /// All that was forwarded, in order.
    fn into_bytes(mut self, piece: &Bytes) -> Bytes {
        match self.run.take() {
            Some(run) if self.copied.is_empty() => piece.slice(run),
            Some(run) => {
                self.copied
                    .extend_from_slice(piece.get(run).unwrap_or_default());
                self.copied.freeze()
            }
            None => self.copied.freeze(),
        }
    }
}

#[cfg(test)]
#[path = "stream_usage_tests.rs"]
mod tests;
