//! What a migratable stream has shown its client: whole SSE events only,
//! and just enough of them to continue the generation elsewhere.
//!
//! Two jobs, both on the hot path of every migratable stream, so both are
//! byte scans (memchr), never a JSON parse:
//! - [`Framer`] passes on whole events and holds back the tail of one cut
//!   between frames, so a stream broken mid-event never leaves the client
//!   with half an event that the continuation could not complete;
//! - [`Transcript`] keeps the generated text (still JSON-escaped, a few
//!   bytes per token rather than the ~200 bytes of the event), the first
//!   event (its `id`, `created`, `model`), and what would forbid a
//!   continuation (tool calls, reasoning text). The text is unescaped and
//!   the first event parsed only when a stream actually fails.

use bytes::{Bytes, BytesMut};
use memchr::memmem;

use super::token_ids::StreamIds;

/// Which OpenAI stream a transcript reads: where its text is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    /// `/v1/chat/completions`: text in `choices[0].delta.content`.
    Chat,
    /// `/v1/completions`: text in `choices[0].text`.
    Completion,
}

/// The end of the next complete event in `buf` from `from`: the index just
/// past its blank line (`\n\n` or `\r\n\r\n`).
fn next_event_end(buf: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    while let Some(i) = buf.get(at..).and_then(|rest| memchr::memchr(b'\n', rest)) {
        let nl = at + i;
        match (buf.get(nl + 1), buf.get(nl + 2)) {
            (Some(b'\n'), _) => return Some(nl + 2),
            (Some(b'\r'), Some(b'\n')) => return Some(nl + 3),
            _ => at = nl + 1,
        }
    }
    None
}

/// Each complete event in `buf`, blank line included.
pub fn events(buf: &[u8]) -> impl Iterator<Item = &[u8]> {
    let mut start = 0;
    std::iter::from_fn(move || {
        let end = next_event_end(buf, start)?;
        let event = buf.get(start..end)?;
        start = end;
        Some(event)
    })
}

/// The data of an event's first `data:` line (one leading space dropped),
/// or `None` for an event with no data (a comment, a keep-alive).
pub fn data_of(event: &[u8]) -> Option<&[u8]> {
    let line_from = |at: usize| {
        let rest = event.get(at..)?;
        let end = memchr::memchr(b'\n', rest).unwrap_or(rest.len());
        let data = rest.get(..end)?;
        let data = data.strip_suffix(b"\r").unwrap_or(data);
        Some(data.strip_prefix(b" ").unwrap_or(data))
    };
    // Engines send one `data:` line per event, first: no line scan.
    if event.starts_with(b"data:") {
        return line_from(5);
    }
    memmem::find(event, b"\ndata:").and_then(|i| line_from(i + 6))
}

/// The data of `frame` when it is exactly one `data: ` event (how engines
/// send their chunks), found with one scan.
fn single_event_data(frame: &[u8]) -> Option<&[u8]> {
    let data = frame.strip_prefix(b"data: ")?.strip_suffix(b"\n\n")?;
    memchr::memchr(b'\n', data).is_none().then_some(data)
}

/// Cuts a byte stream into whole events.
#[derive(Debug, Default)]
pub struct Framer {
    /// The start of an event whose end has not arrived yet.
    held: BytesMut,
}

impl Framer {
    /// The whole events that `frame` completes (empty when none), holding
    /// back what follows the last of them. A frame that ends on an event
    /// boundary with nothing held is passed on as it is, without a copy.
    pub fn push(&mut self, frame: Bytes) -> Bytes {
        let mut buf = match self.held.is_empty() {
            true => frame,
            false => {
                self.held.extend_from_slice(&frame);
                self.held.split().freeze()
            }
        };
        if buf.ends_with(b"\n\n") {
            return buf;
        }
        let mut end = 0;
        while let Some(next) = next_event_end(&buf, end) {
            end = next;
        }
        let tail = buf.split_off(end);
        self.held.extend_from_slice(&tail);
        buf
    }

    /// What is held at the end of the stream (an event the engine never
    /// finished): passed on as it is.
    pub fn rest(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

/// Why a stream cannot be continued from what it has shown.
pub type Refusal = &'static str;

/// The part of a stream a continuation needs.
#[derive(Debug)]
pub struct Transcript {
    kind: StreamKind,
    /// The first event's data (a JSON chunk): its `id`, `created`, `model`.
    /// Copied: a slice of the frame would keep the engine connection's
    /// whole read buffer alive for as long as the stream lasts.
    first: Option<Vec<u8>>,
    /// The text generated so far, JSON-escaped as the engine sent it.
    text: Vec<u8>,
    /// Events that carried text: the output tokens, one per event, when the
    /// engine reports no running count.
    text_events: u64,
    /// The last `completion_tokens` the stream reported (vLLM's and
    /// SGLang's `continuous_usage_stats`).
    reported_tokens: Option<u64>,
    /// A choice's `finish_reason` was set: nothing is left to generate.
    finished: bool,
    /// `data: [DONE]` was seen.
    done: bool,
    /// The last text chunk set a finish reason (looked for after its text,
    /// where vLLM and SGLang put it; chunks without text are read whole).
    finished_with_text: bool,
    /// The bytes before and after the text of the last plain text chunk
    /// (see [`Transcript::note_chunk`]).
    frame: Option<ChunkFrame>,
    /// The stream carries a running usage count on its chunks
    /// (`continuous_usage_stats`): read it on every chunk.
    counts_usage: bool,
    /// What forbids a continuation, once seen.
    refusal: Option<Refusal>,
    /// Largest escaped text kept; past it the stream is not migratable.
    max_text_bytes: usize,
    /// The prompt's and output's token ids, while a completions stream
    /// names them (`return_token_ids`): replayed instead of the text.
    ids: Option<StreamIds>,
}

/// The bytes around the text of an engine's text chunk, kept in one
/// buffer: `head` then `tail`.
#[derive(Debug)]
struct ChunkFrame {
    bytes: Vec<u8>,
    head_len: usize,
}

impl ChunkFrame {
    fn head(&self) -> &[u8] {
        self.bytes.get(..self.head_len).unwrap_or_default()
    }

    fn tail(&self) -> &[u8] {
        self.bytes.get(self.head_len..).unwrap_or_default()
    }
}

/// Text bytes reserved at a stream's first text: most replies fit, so the
/// text grows without reallocating at every doubling.
const TEXT_FIRST_CAPACITY: usize = 1024;

/// Byte patterns the transcript looks for.
struct Needles {
    chat_text: memmem::Finder<'static>,
    completion_text: memmem::Finder<'static>,
    finish: memmem::Finder<'static>,
    tool_calls: memmem::Finder<'static>,
    reasoning: memmem::Finder<'static>,
    reasoning_content: memmem::Finder<'static>,
    completion_tokens: memmem::Finder<'static>,
}

/// Built once: a finder precomputes its search tables.
fn needles() -> &'static Needles {
    static NEEDLES: std::sync::OnceLock<Needles> = std::sync::OnceLock::new();
    NEEDLES.get_or_init(|| Needles {
        chat_text: memmem::Finder::new(b"\"content\":\""),
        completion_text: memmem::Finder::new(b"\"text\":\""),
        finish: memmem::Finder::new(b"\"finish_reason\":\""),
        tool_calls: memmem::Finder::new(b"\"tool_calls\":["),
        reasoning: memmem::Finder::new(b"\"reasoning\":\""),
        reasoning_content: memmem::Finder::new(b"\"reasoning_content\":\""),
        completion_tokens: memmem::Finder::new(b"\"completion_tokens\":"),
    })
}

/// The escaped JSON string that starts at `at` (just past its opening
/// quote): up to its closing quote, or `None` when it does not close.
fn escaped_string(buf: &[u8], at: usize) -> Option<&[u8]> {
    let rest = buf.get(at..)?;
    let mut i = 0;
    while let Some(j) = rest.get(i..).and_then(|r| memchr::memchr2(b'"', b'\\', r)) {
        let k = i + j;
        match rest.get(k) {
            Some(b'\\') => i = k + 2,
            _ => return rest.get(..k),
        }
    }
    None
}

/// The unsigned integer that starts at `at` (JSON whitespace skipped).
fn number_at(buf: &[u8], at: usize) -> Option<u64> {
    let rest = buf.get(at..)?;
    let rest = &rest[rest.iter().take_while(|b| b.is_ascii_whitespace()).count()..];
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    std::str::from_utf8(rest.get(..digits)?).ok()?.parse().ok()
}

/// What a failed stream had shown, decoded: where a continuation starts.
#[derive(Debug, Clone, PartialEq)]
pub struct ResumePoint {
    /// The generated text so far.
    pub text: String,
    /// Output tokens generated so far.
    pub tokens: u64,
    /// The first event, parsed (`None` when no event was shown).
    pub first: Option<serde_json::Value>,
    /// Nothing is left to generate (a finish reason was sent).
    pub finished: bool,
    /// The stream's `[DONE]` was sent.
    pub done: bool,
    /// The prompt's and output's token ids, when the stream named them
    /// all: the continuation replays these rather than the text.
    pub ids: Option<StreamIds>,
}

impl Transcript {
    /// An empty transcript of a `kind` stream keeping at most
    /// `max_text_bytes` of text.
    pub fn new(kind: StreamKind, max_text_bytes: usize) -> Self {
        Self {
            kind,
            first: None,
            text: Vec::new(),
            text_events: 0,
            reported_tokens: None,
            finished: false,
            done: false,
            finished_with_text: false,
            frame: None,
            counts_usage: false,
            refusal: None,
            max_text_bytes,
            ids: None,
        }
    }

    /// Notes every whole event in `events` (what [`Framer::push`] gave).
    pub fn note(&mut self, events_bytes: &[u8]) {
        // The commonest frame: one text chunk in the last one's frame, read
        // with two memory compares and a scan of its text alone.
        if let Some(piece) = self.framed_event_text(events_bytes) {
            self.add_text(piece);
            return;
        }
        // The common frame: one whole `data:` event, read without a loop.
        if let Some(data) = single_event_data(events_bytes) {
            self.note_data(data);
            return;
        }
        for event in events(events_bytes) {
            if let Some(data) = data_of(event) {
                self.note_data(data);
            }
        }
    }

    /// Notes one event's data.
    fn note_data(&mut self, data: &[u8]) {
        if data == b"[DONE]" {
            self.done = true;
            return;
        }
        if data.first() != Some(&b'{') {
            return;
        }
        if self.first.is_none() {
            self.first = Some(data.to_vec());
        }
        self.note_chunk(data);
    }

    /// Notes one chunk; whether it carried text.
    ///
    /// An engine's text chunks differ only in their text: the bytes before
    /// it (`"id"`, `"created"`, `"model"`, `"delta":{"content":"`) and
    /// after it (`"},"logprobs":null,"finish_reason":null}]}`) repeat. So
    /// the common chunk is read by comparing it with the last one's frame
    /// (two memory compares); a chunk that does not fit is searched, and
    /// its frame learned. The rest (usage, tool calls, reasoning) is looked
    /// for in chunks without text.
    fn note_chunk(&mut self, data: &[u8]) -> bool {
        if let Some(piece) = self.framed_text(data) {
            self.add_text(piece);
            return true;
        }
        let n = needles();
        let key = match self.kind {
            StreamKind::Chat => &n.chat_text,
            StreamKind::Completion => &n.completion_text,
        };
        let at = key.find(data).map(|i| i + key.needle().len());
        let piece = at
            .and_then(|at| escaped_string(data, at))
            .filter(|piece| !piece.is_empty());
        let (Some(at), Some(piece)) = (at, piece) else {
            self.note_rare(data);
            return false;
        };
        self.add_text(piece);
        self.note_ids(data, true);
        let tail = data.get(at + piece.len()..).unwrap_or_default();
        self.finished_with_text = n.finish.find(tail).is_some();
        // The first text chunk tells whether chunks carry a running count.
        if (self.counts_usage || self.text_events == 1) && self.note_usage(data) {
            self.counts_usage = true;
        }
        // Learn the frame, unless the chunk says more than its text (its
        // token ids differ from chunk to chunk).
        match self.finished_with_text || self.counts_usage || self.ids.is_some() {
            true => self.frame = None,
            false => {
                let mut bytes = self.frame.take().map(|f| f.bytes).unwrap_or_default();
                bytes.clear();
                bytes.extend_from_slice(data.get(..at).unwrap_or_default());
                bytes.extend_from_slice(tail);
                self.frame = Some(ChunkFrame {
                    bytes,
                    head_len: at,
                });
            }
        }
        true
    }

    /// The text of `frame` when it is one `data: ` event whose chunk is
    /// in the last text chunk's frame. No newline scan is needed: a frame
    /// holding more than one event would put the closing quote of its
    /// first chunk's text, and the rest of that chunk, inside what
    /// [`Transcript::framed_text`] checks is one JSON string body.
    fn framed_event_text<'d>(&self, frame: &'d [u8]) -> Option<&'d [u8]> {
        let data = frame.strip_prefix(b"data: ")?.strip_suffix(b"\n\n")?;
        self.framed_text(data)
    }

    /// The text of a chunk in the last text chunk's frame, if it is one.
    fn framed_text<'d>(&self, data: &'d [u8]) -> Option<&'d [u8]> {
        let frame = self.frame.as_ref()?;
        let rest = data.strip_prefix(frame.head())?;
        let text = rest.strip_suffix(frame.tail())?;
        // The text must be one JSON string body: its end is the tail's
        // opening quote, so no unescaped quote may sit inside it.
        (escaped_string(rest, 0)?.len() == text.len() && !text.is_empty()).then_some(text)
    }

    /// Adds one chunk's escaped text.
    fn add_text(&mut self, piece: &[u8]) {
        self.text_events += 1;
        if self.text.is_empty() {
            self.text.reserve(TEXT_FIRST_CAPACITY);
        }
        if self.text.len() + piece.len() > self.max_text_bytes {
            self.refusal
                .get_or_insert("the stream is longer than --migration-max-text-bytes");
        } else if self.refusal.is_none() {
            self.text.extend_from_slice(piece);
        }
    }

    /// Follows a completions stream's token ids (`has_text`: the chunk
    /// carried text). They are followed from a chunk naming the prompt's
    /// ids before any text, and dropped for good once a text chunk names
    /// none (the stream is then continued from its text).
    fn note_ids(&mut self, data: &[u8], has_text: bool) {
        if self.kind != StreamKind::Completion {
            return;
        }
        let followed = match &mut self.ids {
            Some(ids) => ids.add(data, has_text),
            None => {
                if self.text_events == u64::from(has_text) {
                    self.ids = StreamIds::from_first(data, self.max_text_bytes / 4);
                }
                return;
            }
        };
        if !followed {
            self.ids = None;
        }
    }

    /// What a chunk without text may say.
    fn note_rare(&mut self, data: &[u8]) {
        self.note_ids(data, false);
        let n = needles();
        if n.finish.find(data).is_some() {
            self.finished = true;
        }
        if self.note_usage(data) && !self.finished {
            // A running count before the end: every chunk carries one.
            self.counts_usage = true;
        }
        if self.kind == StreamKind::Chat {
            if n.tool_calls.find(data).is_some() {
                self.refusal
                    .get_or_insert("the reply streams tool calls, which no engine continues");
            }
            let reasoning = [&n.reasoning, &n.reasoning_content].into_iter().any(|f| {
                f.find(data)
                    .and_then(|i| escaped_string(data, i + f.needle().len()))
                    .is_some_and(|s| !s.is_empty())
            });
            if reasoning {
                self.refusal.get_or_insert(
                    "the reply streams reasoning text, which a continuation would lose",
                );
            }
        }
    }

    /// Reads a chunk's `completion_tokens`; whether it had one.
    fn note_usage(&mut self, data: &[u8]) -> bool {
        let n = needles();
        let count = n
            .completion_tokens
            .find(data)
            .and_then(|i| number_at(data, i + n.completion_tokens.needle().len()));
        if let Some(count) = count {
            self.reported_tokens = Some(count);
        }
        count.is_some()
    }

    /// Whether a finish reason was sent (with the last text, or after it).
    fn finished_at_last(&self) -> bool {
        self.finished || self.finished_with_text
    }

    /// Where a continuation starts, or why there can be none.
    pub fn resume_point(&self) -> Result<ResumePoint, Refusal> {
        if let Some(refusal) = self.refusal {
            return Err(refusal);
        }
        let mut quoted = Vec::with_capacity(self.text.len() + 2);
        quoted.push(b'"');
        quoted.extend_from_slice(&self.text);
        quoted.push(b'"');
        let text: String = serde_json::from_slice(&quoted)
            .map_err(|_| "the streamed text is not valid JSON string content")?;
        let first = match &self.first {
            Some(bytes) => Some(
                serde_json::from_slice(bytes)
                    .map_err(|_| "the stream's first event is not JSON")?,
            ),
            None => None,
        };
        let tokens = match &self.ids {
            Some(ids) => ids.output().len() as u64,
            None => self.reported_tokens.unwrap_or(self.text_events),
        };
        Ok(ResumePoint {
            ids: self.ids.clone(),
            text,
            tokens,
            first,
            finished: self.finished_at_last(),
            done: self.done,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chat_chunk(content: &str) -> String {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"created\":7,\"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":{}}},\"finish_reason\":null}}]}}\n\n",
            serde_json::Value::from(content)
        )
    }

    #[test]
    fn the_framer_holds_a_cut_event_until_it_is_whole() {
        let mut framer = Framer::default();
        let whole = chat_chunk("a");
        let (head, tail) = whole.split_at(20);
        assert!(framer.push(Bytes::from(head.to_string())).is_empty());
        let out = framer.push(Bytes::from(format!("{tail}{}", &whole[..10])));
        assert_eq!(out, whole.as_bytes());
        assert_eq!(framer.rest(), &whole.as_bytes()[..10]);
        assert!(framer.rest().is_empty());
    }

    #[test]
    fn crlf_events_are_events_too() {
        let mut framer = Framer::default();
        let out = framer.push(Bytes::from_static(b"data: 1\r\n\r\ndata: 2\r\n"));
        assert_eq!(out, &b"data: 1\r\n\r\n"[..]);
        assert_eq!(data_of(&out), Some(&b"1"[..]));
    }

    #[test]
    fn the_transcript_keeps_the_text_and_counts_tokens() {
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        let mut stream = String::from(
            "data: {\"id\":\"chatcmpl-1\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\n",
        );
        for piece in ["Hel", "lo \"q\"", " \u{e9}\\n"] {
            stream.push_str(&chat_chunk(piece));
        }
        stream.push_str(": keep-alive\n\n");
        t.note(&Bytes::from(stream));
        let point = t.resume_point().unwrap();
        assert_eq!(point.text, "Hello \"q\" \u{e9}\\n");
        assert_eq!(point.tokens, 3);
        assert_eq!(point.first.unwrap()["id"], "chatcmpl-1");
        assert!(!point.finished && !point.done);
    }

    #[test]
    fn a_finish_reason_that_came_with_the_last_text_is_found() {
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from(chat_chunk("a")));
        t.note(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"content\":\"b\"},\"finish_reason\":\"stop\"}]}\n\n",
        ));
        let point = t.resume_point().unwrap();
        assert_eq!((point.text.as_str(), point.finished), ("ab", true));
        assert_eq!(data_of(b"event: x\ndata: 5\n\n"), Some(&b"5"[..]));
        assert_eq!(data_of(b": ping\n\n"), None);
    }

    #[test]
    fn a_chunk_out_of_the_learned_frame_is_searched() {
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from(chat_chunk("a")));
        t.note(&Bytes::from(chat_chunk("b\\\"c")));
        // Same frame, then one with more after the text.
        t.note(&Bytes::from_static(
            b"data: {\"id\":\"chatcmpl-1\",\"created\":7,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"d\"},\"finish_reason\":\"length\"}]}\n\n",
        ));
        let point = t.resume_point().unwrap();
        assert_eq!(
            (point.text.as_str(), point.tokens, point.finished),
            ("ab\\\"cd", 3, true)
        );
    }

    #[test]
    fn two_events_in_one_frame_are_not_read_as_one_framed_chunk() {
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from(chat_chunk("a")));
        // Both in the learned frame: the first's head, the second's tail.
        t.note(&Bytes::from(format!(
            "{}{}",
            chat_chunk("b"),
            chat_chunk("c")
        )));
        t.note(&Bytes::from(chat_chunk("d")));
        let point = t.resume_point().unwrap();
        assert_eq!((point.text.as_str(), point.tokens), ("abcd", 4));
    }

    #[test]
    fn a_completions_stream_naming_token_ids_is_followed_by_them() {
        let chunk = |text: &str, ids: &str| {
            Bytes::from(format!(
                "data: {{\"id\":\"cmpl-1\",\"choices\":[{{\"index\":0,\"text\":\"{text}\",\"logprobs\":null,\"finish_reason\":null{ids}}}]}}\n\n"
            ))
        };
        let mut t = Transcript::new(StreamKind::Completion, 1 << 20);
        t.note(&chunk(
            "a",
            ",\"prompt_token_ids\":[1,2],\"token_ids\":[10]",
        ));
        // The same ids twice: the frame must not be learned and read them
        // as one text chunk with no ids.
        t.note(&chunk(
            "b",
            ",\"prompt_token_ids\":null,\"token_ids\":[11,12]",
        ));
        t.note(&chunk(
            "b",
            ",\"prompt_token_ids\":null,\"token_ids\":[11,12]",
        ));
        let point = t.resume_point().unwrap();
        let ids = point.ids.unwrap();
        assert_eq!(
            (ids.prompt(), ids.output()),
            (&[1, 2][..], &[10, 11, 12, 11, 12][..])
        );
        assert_eq!((point.text.as_str(), point.tokens), ("abb", 5));
        // A text chunk without ids: continued from the text from then on.
        t.note(&chunk("c", ""));
        let point = t.resume_point().unwrap();
        assert_eq!((point.ids, point.tokens), (None, 4));
    }

    #[test]
    fn a_running_usage_count_beats_counting_events() {
        let mut t = Transcript::new(StreamKind::Completion, 1 << 20);
        t.note(&Bytes::from_static(
            b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"ab\",\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":3,\"completion_tokens\": 5}}\n\n",
        ));
        t.note(&Bytes::from_static(
            b"data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"text\":\"\",\"finish_reason\":\"length\"}]}\n\ndata: [DONE]\n\n",
        ));
        let point = t.resume_point().unwrap();
        assert_eq!((point.text.as_str(), point.tokens), ("ab", 5));
        assert!(point.finished && point.done);
    }

    #[test]
    fn tool_calls_reasoning_and_length_forbid_a_continuation() {
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"tool_calls\":[{\"index\":0}]}}]}\n\n",
        ));
        assert!(t.resume_point().unwrap_err().contains("tool calls"));
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from_static(
            b"data: {\"choices\":[{\"delta\":{\"reasoning_content\":\"hmm\"}}]}\n\n",
        ));
        assert!(t.resume_point().unwrap_err().contains("reasoning"));
        let mut t = Transcript::new(StreamKind::Chat, 4);
        t.note(&Bytes::from(chat_chunk("12345")));
        assert!(t.resume_point().unwrap_err().contains("longer"));
        // Escaped quotes inside content are text, not keys.
        let mut t = Transcript::new(StreamKind::Chat, 1 << 20);
        t.note(&Bytes::from(chat_chunk("\"tool_calls\":[")));
        assert_eq!(t.resume_point().unwrap().text, "\"tool_calls\":[");
    }
}
