//! Finding a created object's id in the first bytes of the creating
//! answer, as they pass.
//!
//! Why a byte scanner and not a JSON parser: the answer streams to the
//! client frame by frame and must not wait, and a parser would need the
//! whole document. The id comes first in every engine's answer: a JSON
//! object's top-level `"id"` (a response, file or batch), or, in a
//! streamed response, the `response.created` event's `"response":{"id":…}`.
//! So the scanner follows JSON's structure (strings, escapes, nesting)
//! over the first [`SCAN_LIMIT`] bytes, across frame boundaries, and takes
//! the first string value of a key `id` at the top level of an object (or
//! one level down, inside a top-level `response`). Text between SSE
//! events (`event: …`, `data: `) is outside any object and ignored.

use super::{MAX_ID_BYTES, is_valid_id};

/// Bytes of an answer scanned for its id at most.
pub const SCAN_LIMIT: usize = 4 * 1024;

/// Deepest nesting whose container kind is tracked (the id is at depth 1
/// or 2; deeper levels are only counted).
const TRACKED_DEPTH: u32 = 16;

/// The key whose value comes next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Id,
    Response,
    Other,
}

/// Where in the JSON grammar the scanner is, outside strings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// An object key (after `{` or `,` in an object).
    Key,
    /// A value (after `:`, or an array element).
    Value,
    /// Anything else (after a key, or after a value).
    Other,
}

/// The scanner's state; feed it bytes with [`IdScanner::feed`].
#[derive(Debug)]
pub struct IdScanner {
    scanned: usize,
    /// Nesting depth: 1 inside a top-level object.
    depth: u32,
    /// Bit `d - 1` set: the container at depth `d` is an object.
    objects: u16,
    /// The object at depth 2 is the value of a top-level `response`.
    in_response: bool,
    expect: Expect,
    key: Key,
    in_string: bool,
    escaped: bool,
    /// The string being read is a key.
    string_is_key: bool,
    /// The string being read (bounded; `None` once it is too long or
    /// holds an escape, which no id has).
    string: Option<Vec<u8>>,
    done: bool,
}

impl Default for IdScanner {
    fn default() -> Self {
        Self {
            scanned: 0,
            depth: 0,
            objects: 0,
            in_response: false,
            expect: Expect::Other,
            key: Key::Other,
            in_string: false,
            escaped: false,
            string_is_key: false,
            string: None,
            done: false,
        }
    }
}

impl IdScanner {
    /// Whether the scanner is finished (found an id, or read its limit).
    pub fn is_done(&self) -> bool {
        self.done
    }

    fn in_object(&self) -> bool {
        self.depth >= 1
            && self.depth <= TRACKED_DEPTH
            && self.objects & (1 << (self.depth - 1)) != 0
    }

    /// Scans `bytes`; returns the id once found (then it is done).
    pub fn feed(&mut self, bytes: &[u8]) -> Option<String> {
        if self.done {
            return None;
        }
        let room = SCAN_LIMIT - self.scanned;
        let bytes = &bytes[..bytes.len().min(room)];
        self.scanned += bytes.len();
        for &b in bytes {
            if let Some(id) = self.step(b) {
                self.done = true;
                return Some(id);
            }
        }
        if self.scanned >= SCAN_LIMIT {
            self.done = true;
        }
        None
    }

    fn step(&mut self, b: u8) -> Option<String> {
        if self.in_string {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
                self.string = None;
            } else if b == b'"' {
                self.in_string = false;
                return self.end_string();
            } else if let Some(s) = &mut self.string {
                if s.len() < MAX_ID_BYTES.max(8) {
                    s.push(b);
                } else {
                    self.string = None;
                }
            }
            return None;
        }
        match b {
            b'"' => {
                self.in_string = true;
                self.string_is_key = self.in_object() && self.expect == Expect::Key;
                self.string = Some(Vec::new());
            }
            b'{' | b'[' => {
                let object = b == b'{';
                if self.depth == 1 {
                    self.in_response =
                        object && self.expect == Expect::Value && self.key == Key::Response;
                }
                self.depth = self.depth.saturating_add(1);
                if self.depth <= TRACKED_DEPTH {
                    let bit = 1 << (self.depth - 1);
                    match object {
                        true => self.objects |= bit,
                        false => self.objects &= !bit,
                    }
                }
                self.expect = if object { Expect::Key } else { Expect::Value };
            }
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth <= 1 {
                    self.in_response = false;
                }
                self.expect = Expect::Other;
            }
            b':' => self.expect = Expect::Value,
            b',' => {
                self.expect = if self.in_object() {
                    Expect::Key
                } else {
                    Expect::Value
                };
            }
            b' ' | b'\t' | b'\r' | b'\n' => {}
            // A number, `true`, `null`...: a value that is not a string.
            _ => {
                if self.expect == Expect::Value {
                    self.expect = Expect::Other;
                }
            }
        }
        None
    }

    fn end_string(&mut self) -> Option<String> {
        let text = self.string.take();
        if self.string_is_key {
            self.key = match text.as_deref() {
                Some(b"id") => Key::Id,
                Some(b"response") => Key::Response,
                _ => Key::Other,
            };
            self.expect = Expect::Other;
            return None;
        }
        let wanted = self.expect == Expect::Value
            && self.key == Key::Id
            && self.in_object()
            && (self.depth == 1 || (self.depth == 2 && self.in_response));
        self.expect = Expect::Other;
        if !wanted {
            return None;
        }
        let id = String::from_utf8(text?).ok()?;
        is_valid_id(&id).then_some(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scan_in_pieces(body: &str, piece: usize) -> Option<String> {
        let mut scanner = IdScanner::default();
        for chunk in body.as_bytes().chunks(piece) {
            if let Some(id) = scanner.feed(chunk) {
                return Some(id);
            }
        }
        None
    }

    fn scan(body: &str) -> Option<String> {
        let whole = scan_in_pieces(body, body.len().max(1));
        for piece in [1, 2, 3, 7] {
            assert_eq!(
                scan_in_pieces(body, piece),
                whole,
                "split every {piece}: {body}"
            );
        }
        whole
    }

    #[test]
    fn the_top_level_id_of_a_json_answer() {
        assert_eq!(
            scan(r#"{"id":"resp_1","object":"response","output":[{"id":"msg_2"}]}"#).as_deref(),
            Some("resp_1")
        );
        assert_eq!(
            scan(r#"{ "object" : "file", "bytes": 12, "id" : "file-abc" }"#).as_deref(),
            Some("file-abc")
        );
        // Ids nested elsewhere, or keys inside values, do not count.
        assert_eq!(
            scan(
                r#"{"data":{"id":"no"},"note":"\"id\":\"no\"","list":[{"id":"no"}],"id":"batch_9"}"#
            )
            .as_deref(),
            Some("batch_9")
        );
    }

    #[test]
    fn the_response_created_event_of_a_stream() {
        let sse = "event: response.created\ndata: {\"type\":\"response.created\",\"sequence_number\":0,\"response\":{\"id\":\"resp_abc\",\"object\":\"response\"}}\n\nevent: response.output_item.added\ndata: {\"item\":{\"id\":\"msg_1\"}}\n\n";
        assert_eq!(scan(sse).as_deref(), Some("resp_abc"));
        // vLLM's field order: the response first.
        let vllm = "event: response.created\ndata: {\"response\":{\"id\":\"resp_x\",\"created_at\":1},\"sequence_number\":0}\n\n";
        assert_eq!(scan(vllm).as_deref(), Some("resp_x"));
    }

    #[test]
    fn no_id_no_guess() {
        for body in [
            r#"{"object":"list","data":[{"id":"a"}]}"#,
            r#"{"id":12,"x":"y"}"#,
            r#"{"id":"has space"}"#,
            r#"{"id":"esc\u0041ped"}"#,
            "data: [DONE]\n\n",
            "not json at all \"id\":\"x\"",
            "",
        ] {
            assert_eq!(scan(body), None, "{body}");
        }
        let long = format!(r#"{{"id":"{}"}}"#, "x".repeat(MAX_ID_BYTES + 1));
        assert_eq!(scan(&long), None);
    }

    /// Random mixes of JSON-ish bytes: never a panic, only valid ids, and
    /// the frame split never changes the result (the fuzz target's
    /// property, `fuzz/fuzz_targets/object_id_scan.rs`, on a fixed seed).
    #[test]
    fn random_bodies_split_anywhere_scan_alike() {
        use rand::{Rng, SeedableRng};
        const ALPHABET: &[u8] = b"{}[]:,\"\\ idresponse_0-9ax\n";
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        for _ in 0..2_000 {
            let len = rng.random_range(0..200);
            let body: Vec<u8> = (0..len)
                .map(|_| ALPHABET[rng.random_range(0..ALPHABET.len())])
                .collect();
            let whole = IdScanner::default().feed(&body);
            if let Some(id) = &whole {
                assert!(is_valid_id(id), "{id:?}");
            }
            let piece = rng.random_range(1..8);
            let mut scanner = IdScanner::default();
            let split = body.chunks(piece).find_map(|c| scanner.feed(c));
            assert_eq!(whole, split, "{}", String::from_utf8_lossy(&body));
        }
    }

    #[test]
    fn it_stops_after_its_limit() {
        let late = format!(r#"{{"pad":"{}","id":"resp_late"}}"#, "p".repeat(SCAN_LIMIT));
        assert_eq!(scan(&late), None);
        let mut scanner = IdScanner::default();
        scanner.feed(&vec![b' '; SCAN_LIMIT]);
        assert!(scanner.is_done());
        assert_eq!(scanner.feed(br#"{"id":"x"}"#), None);
    }
}
