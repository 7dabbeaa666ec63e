//! The token ids a completions stream reports, so that a continuation can
//! replay them exactly instead of re-tokenizing text.
//!
//! vLLM's `return_token_ids: true` makes a `/v1/completions` stream name
//! its prompt's ids (`prompt_token_ids`, on the first chunk's choice) and
//! each chunk's output ids (`token_ids`). With both, the continuation's
//! prompt is the prompt's ids followed by the output's: the engine resumes
//! from exactly the tokens that were sampled, where text would be
//! re-tokenized (and may split differently at the seam). A prompt given as
//! token ids, which has no text to append to, becomes continuable too.
//!
//! Read only from chunks the transcript already searches (the first text
//! chunk decides; a stream that names ids is never matched by frame), so a
//! stream without ids pays nothing for this.

use memchr::memmem;

/// A stream's prompt and output token ids, while every text chunk named
/// its own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StreamIds {
    prompt: Vec<u32>,
    output: Vec<u32>,
    /// Most output ids kept; past it the stream is continued from text.
    max_output: usize,
}

/// The integers of the JSON array that follows the first `needle` in
/// `chunk` (`None`: no such array, or not all small unsigned integers).
fn id_array(chunk: &[u8], needle: &[u8]) -> Option<Vec<u32>> {
    let at = memmem::find(chunk, needle)? + needle.len();
    let rest = chunk.get(at..)?;
    let end = memchr::memchr(b']', rest)?;
    let list = std::str::from_utf8(rest.get(..end)?).ok()?;
    if list.trim().is_empty() {
        return Some(Vec::new());
    }
    list.split(',').map(|id| id.trim().parse().ok()).collect()
}

/// The chunk's output ids (`"token_ids":[…]`; the leading quote keeps
/// `prompt_token_ids` out, and escaped text never holds a bare quote).
fn output_ids(chunk: &[u8]) -> Option<Vec<u32>> {
    id_array(chunk, b"\"token_ids\":[")
}

impl StreamIds {
    /// The ids of a stream whose first text chunk is `chunk`, when it
    /// names both its prompt's ids and its own; at most `max_output`
    /// output ids are kept.
    pub fn from_first(chunk: &[u8], max_output: usize) -> Option<Self> {
        let prompt = id_array(chunk, b"\"prompt_token_ids\":[")?;
        let output = output_ids(chunk)?;
        let mut ids = Self {
            prompt,
            output: Vec::new(),
            max_output,
        };
        ids.extend(output).then_some(ids)
    }

    /// Adds a later chunk's output ids; `false` when it names none or the
    /// stream outgrew the limit (it is then continued from its text).
    /// `has_text`: a chunk without text may name no ids.
    pub fn add(&mut self, chunk: &[u8], has_text: bool) -> bool {
        match output_ids(chunk) {
            Some(ids) => self.extend(ids),
            None => !has_text,
        }
    }

    fn extend(&mut self, ids: Vec<u32>) -> bool {
        if self.output.len() + ids.len() > self.max_output {
            return false;
        }
        self.output.extend(ids);
        true
    }

    /// The prompt's ids.
    pub fn prompt(&self) -> &[u32] {
        &self.prompt
    }

    /// The output's ids so far.
    pub fn output(&self) -> &[u32] {
        &self.output
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const FIRST: &[u8] = br#"{"id":"cmpl-1","choices":[{"index":0,"text":"w0 ","logprobs":null,"finish_reason":null,"prompt_token_ids":[1, 2,3],"token_ids":[1000000]}]}"#;

    #[test]
    fn the_first_chunk_names_the_prompt_and_each_chunk_its_output() {
        let mut ids = StreamIds::from_first(FIRST, 100).unwrap();
        assert!(ids.add(
            br#"{"choices":[{"text":"w1 ","prompt_token_ids":null,"token_ids":[1000001,7]}]}"#,
            true
        ));
        // A finish chunk without text need not name any.
        assert!(ids.add(
            br#"{"choices":[{"text":"","finish_reason":"length"}]}"#,
            false
        ));
        assert_eq!(ids.prompt(), [1, 2, 3]);
        assert_eq!(ids.output(), [1_000_000, 1_000_001, 7]);
    }

    #[test]
    fn text_without_ids_a_bad_id_or_too_many_end_the_tracking() {
        let mut ids = StreamIds::from_first(FIRST, 2).unwrap();
        assert!(!ids.add(br#"{"choices":[{"text":"w1 "}]}"#, true));
        assert!(!ids.add(br#"{"choices":[{"text":"w1 ","token_ids":[1,2]}]}"#, true));
        assert!(
            StreamIds::from_first(br#"{"choices":[{"text":"a","token_ids":[-1]}]}"#, 9).is_none()
        );
        assert!(
            StreamIds::from_first(br#"{"choices":[{"text":"a","token_ids":[1]}]}"#, 9).is_none()
        );
        // Quoted text that mentions the field is not the field.
        let chunk = br#"{"choices":[{"text":"\"token_ids\":[9]","prompt_token_ids":[1]}]}"#;
        assert!(StreamIds::from_first(chunk, 9).is_none());
    }
}
