//! What an engine says a request used, read from the end of its answer, so
//! a tenant is charged its real tokens instead of its estimate.
//!
//! OpenAI-style engines (vLLM, SGLang, llama.cpp) end a completion or chat
//! answer with `"usage":{"prompt_tokens":P,"completion_tokens":C,...}`; a
//! stream carries it in its last event when the client asked for it
//! (`stream_options.include_usage`). Anthropic's Messages API says
//! `"usage":{"input_tokens":P,"output_tokens":C}` (a stream's last
//! `message_delta` has the output only). The answer is read through a
//! bounded tail ([`UsageTail`]): the last `"usage"` object in it is the
//! final one.

/// Bytes of an answer's end kept to find its usage in.
pub const TAIL_BYTES: usize = 4096;

/// Tokens an engine reported for one request (`None`: not said).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Reported {
    /// Prompt (input) tokens.
    pub input_tokens: Option<u64>,
    /// Generated (output) tokens.
    pub output_tokens: Option<u64>,
}

/// The last [`TAIL_BYTES`] of an answer, fed piece by piece.
#[derive(Debug, Default)]
pub struct UsageTail {
    bytes: Vec<u8>,
}

impl UsageTail {
    /// Appends `piece`, keeping only the last [`TAIL_BYTES`].
    pub fn push(&mut self, piece: &[u8]) {
        if piece.len() >= TAIL_BYTES {
            self.bytes.clear();
            self.bytes
                .extend_from_slice(&piece[piece.len() - TAIL_BYTES..]);
            return;
        }
        let overflow = (self.bytes.len() + piece.len()).saturating_sub(TAIL_BYTES);
        self.bytes.drain(..overflow);
        self.bytes.extend_from_slice(piece);
    }

    /// The usage the answer ended with, if it said one.
    pub fn reported(&self) -> Option<Reported> {
        reported(&self.bytes)
    }
}

/// The last `"usage"` object in `text`, if it names any token count.
pub fn reported(text: &[u8]) -> Option<Reported> {
    let at = rfind(text, b"\"usage\"")? + b"\"usage\"".len();
    // `"usage": {` — anything but an object (`null`) says nothing.
    let rest = text[at..].trim_ascii_start().strip_prefix(b":")?;
    let object = rest.trim_ascii_start();
    if object.first() != Some(&b'{') {
        return None;
    }
    let object = &object[..object_end(object)];
    let input = number_after(object, b"\"prompt_tokens\"")
        .or_else(|| number_after(object, b"\"input_tokens\""));
    let output = number_after(object, b"\"completion_tokens\"")
        .or_else(|| number_after(object, b"\"output_tokens\""));
    (input.is_some() || output.is_some()).then_some(Reported {
        input_tokens: input,
        output_tokens: output,
    })
}

/// Where the object after `"usage":` ends (nested detail objects
/// included), or the text's end.
fn object_end(text: &[u8]) -> usize {
    let mut depth = 0usize;
    let mut in_string = false;
    let mut escaped = false;
    for (i, b) in text.iter().enumerate() {
        match (in_string, escaped, *b) {
            (true, true, _) => escaped = false,
            (true, false, b'\\') => escaped = true,
            (true, false, b'"') => in_string = false,
            (true, false, _) => {}
            (false, _, b'"') => in_string = true,
            (false, _, b'{') => depth += 1,
            (false, _, b'}') => {
                depth = depth.saturating_sub(1);
                if depth == 0 {
                    return i;
                }
            }
            _ => {}
        }
    }
    text.len()
}

fn rfind(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    haystack.windows(needle.len()).rposition(|w| w == needle)
}

/// The integer after `key` and a colon, if one follows.
fn number_after(object: &[u8], key: &[u8]) -> Option<u64> {
    let at = object.windows(key.len()).position(|w| w == key)? + key.len();
    let rest = object[at..].trim_ascii_start().strip_prefix(b":")?;
    let rest = rest.trim_ascii_start();
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    if digits == 0 || digits > 19 {
        return None;
    }
    std::str::from_utf8(&rest[..digits]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn both(input: u64, output: u64) -> Option<Reported> {
        Some(Reported {
            input_tokens: Some(input),
            output_tokens: Some(output),
        })
    }

    #[test]
    fn openai_answers_streams_and_anthropic_messages() {
        let chat = br#"{"id":"x","choices":[{"message":{"content":"the \"usage\" word"}}],"usage":{"prompt_tokens":12,"total_tokens":19,"completion_tokens":7,"prompt_tokens_details":null},"kv_transfer_params":null}"#;
        assert_eq!(reported(chat), both(12, 7));
        let stream = b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n\
            data: {\"choices\":[],\"usage\":{\"prompt_tokens\": 3, \"completion_tokens\": 40}}\n\n\
            data: [DONE]\n\n";
        assert_eq!(reported(stream), both(3, 40));
        let details_first = br#"{"usage":{"prompt_tokens_details":{"cached_tokens":4},"prompt_tokens":8,"completion_tokens":2}}"#;
        assert_eq!(reported(details_first), both(8, 2));
        let messages = br#"{"type":"message","usage":{"input_tokens":5,"output_tokens":9}}"#;
        assert_eq!(reported(messages), both(5, 9));
        let delta = br#"event: message_delta
data: {"type":"message_delta","usage":{"output_tokens":15}}"#;
        assert_eq!(
            reported(delta),
            Some(Reported {
                input_tokens: None,
                output_tokens: Some(15)
            })
        );
    }

    #[test]
    fn no_usage_or_a_broken_one_reports_nothing() {
        assert_eq!(reported(b"data: {\"choices\":[]}\n\ndata: [DONE]"), None);
        assert_eq!(reported(br#"{"usage":{"prompt_tokens":"many"}}"#), None);
        assert_eq!(reported(br#"{"usage":{"prompt_tokens":-1}}"#), None);
        assert_eq!(
            reported(br#"{"usage":{"prompt_tokens":99999999999999999999999}}"#),
            None
        );
        assert_eq!(reported(br#"{"usage":null}"#), None);
        assert_eq!(
            reported(br#"{"usage":null,"x":{"prompt_tokens":5}}"#),
            None,
            "a sibling's counts are not the usage"
        );
    }

    #[test]
    fn the_tail_keeps_the_end_of_a_long_answer_fed_in_pieces() {
        let mut tail = UsageTail::default();
        for _ in 0..1000 {
            tail.push(b"data: {\"choices\":[{\"delta\":{\"content\":\"tok\"}}]}\n\n");
        }
        tail.push(br#"data: {"choices":[],"usage":{"prompt_tokens":1,"#);
        tail.push(br#""completion_tokens":1000}}"#);
        tail.push(b"\n\ndata: [DONE]\n\n");
        assert_eq!(tail.reported(), both(1, 1000));
        assert!(tail.bytes.len() <= TAIL_BYTES);
        tail.push(&vec![b'x'; TAIL_BYTES * 2]);
        assert_eq!(tail.bytes.len(), TAIL_BYTES);
        assert_eq!(tail.reported(), None);
    }
}
