//! Request traces for the fleet benchmark, in the Mooncake FAST'25 JSONL
//! format (kvcache-ai/Mooncake, `FAST25-release/traces/`): one JSON object
//! a line,
//!
//! ```json
//! {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, 2353]}
//! ```
//!
//! with `timestamp` in ms since the trace started, `input_length` and
//! `output_length` in tokens, and `hash_ids` one id per [`BLOCK_TOKENS`]-token
//! block of the input (the last one may be partial): equal ids mean equal
//! prefix blocks, so the ids say which prompts share which prefix without
//! the text. Real traces say nothing else about the prompt, which is what
//! lets a benchmark replay production prefix reuse on mock engines.
//!
//! This module reads and writes the format; [`text`] turns ids into prompt
//! text, [`generate`] makes synthetic traces, [`replay`] scales a trace into
//! a [`Schedule`](super::workload::Schedule) and [`report`] prints its table.

pub mod generate;
pub mod plan;
pub mod replay;
pub mod report;
pub mod text;

use std::fmt;
use std::io::{BufRead, Write};
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Tokens per `hash_ids` block in the Mooncake traces.
pub const BLOCK_TOKENS: u64 = 512;
/// Longest line read, bytes with its newline (a 200k-token prompt has ~400
/// ids, a few KB).
pub const MAX_LINE_BYTES: usize = 1 << 20;
/// Longest input accepted, tokens (Mooncake's longest is ~191k).
pub const MAX_INPUT_TOKENS: u64 = 4_000_000;
/// Longest output accepted, tokens.
pub const MAX_OUTPUT_TOKENS: u64 = 1_000_000;

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TraceRequest {
    /// Arrival, ms since the trace started.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u64,
    /// Output tokens.
    pub output_length: u64,
    /// One id per [`BLOCK_TOKENS`]-token block of the prompt, the last one
    /// possibly partial; equal ids are equal blocks of equal prefixes.
    pub hash_ids: Vec<u64>,
}

impl TraceRequest {
    /// Checks the fields against each other: lengths in range and exactly
    /// `ceil(input_length / BLOCK_TOKENS)` block ids.
    pub fn validate(&self) -> Result<(), String> {
        if self.input_length == 0 || self.input_length > MAX_INPUT_TOKENS {
            return Err(format!(
                "input_length must be in 1..={MAX_INPUT_TOKENS} (got {})",
                self.input_length
            ));
        }
        if self.output_length == 0 || self.output_length > MAX_OUTPUT_TOKENS {
            return Err(format!(
                "output_length must be in 1..={MAX_OUTPUT_TOKENS} (got {})",
                self.output_length
            ));
        }
        let blocks = self.input_length.div_ceil(BLOCK_TOKENS);
        if self.hash_ids.len() as u64 != blocks {
            return Err(format!(
                "hash_ids has {} ids but input_length {} needs {blocks} \
                 ({BLOCK_TOKENS}-token blocks, the last one partial)",
                self.hash_ids.len(),
                self.input_length
            ));
        }
        Ok(())
    }
}

/// A trace line that could not be read; the message names the line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TraceError {
    /// Where it came from (a file name, or `trace`).
    pub source: String,
    /// 1-based line number (0 when the error is not about one line).
    pub line: usize,
    /// What is wrong.
    pub reason: String,
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.source, self.reason)
        } else {
            write!(f, "{}:{}: {}", self.source, self.line, self.reason)
        }
    }
}

impl std::error::Error for TraceError {}

/// Parses one line; the error says what is wrong (without the line number).
pub fn parse_line(line: &str) -> Result<TraceRequest, String> {
    let r: TraceRequest = serde_json::from_str(line).map_err(|e| {
        // serde_json appends " at line 1 column N"; inside one line only
        // the column says anything.
        let msg = e.to_string();
        let pos = format!(" at line {} column {}", e.line(), e.column());
        match msg.strip_suffix(&pos) {
            Some(m) => format!("{m} (column {})", e.column()),
            None => msg,
        }
    })?;
    r.validate()?;
    Ok(r)
}

/// Reads at most `limit` requests from `reader` (blank lines skipped), in
/// arrival order (a stable sort by timestamp, so requests with one
/// timestamp keep their order). The first bad line is the error.
pub fn read_trace(
    reader: impl BufRead,
    source: &str,
    limit: usize,
) -> Result<Vec<TraceRequest>, TraceError> {
    let err = |line: usize, reason: String| TraceError {
        source: source.to_string(),
        line,
        reason,
    };
    let mut out = Vec::new();
    // `take` bounds what one line can make us hold.
    let mut reader = reader.take(0);
    let mut buf = Vec::new();
    let mut number = 0;
    while out.len() < limit {
        buf.clear();
        reader.set_limit(MAX_LINE_BYTES as u64 + 1);
        let n = reader
            .read_until(b'\n', &mut buf)
            .map_err(|e| err(number + 1, format!("read failed: {e}")))?;
        if n == 0 {
            break;
        }
        number += 1;
        if buf.len() > MAX_LINE_BYTES {
            return Err(err(
                number,
                format!("line longer than {MAX_LINE_BYTES} bytes"),
            ));
        }
        let text = std::str::from_utf8(&buf).map_err(|_| err(number, "not UTF-8".into()))?;
        if text.trim().is_empty() {
            continue;
        }
        out.push(parse_line(text.trim()).map_err(|r| err(number, r))?);
    }
    if out.is_empty() {
        return Err(err(0, "no requests in the trace".into()));
    }
    out.sort_by_key(|r| r.timestamp);
    Ok(out)
}

/// Reads at most `limit` requests of the trace file at `path`.
pub fn load_trace(path: &Path, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
    let source = path.display().to_string();
    let file = std::fs::File::open(path).map_err(|e| TraceError {
        source: source.clone(),
        line: 0,
        reason: format!("cannot open: {e}"),
    })?;
    read_trace(std::io::BufReader::new(file), &source, limit)
}

/// Writes `requests` as JSONL, one object a line, in the field order of
/// the Mooncake traces.
pub fn write_trace(mut out: impl Write, requests: &[TraceRequest]) -> std::io::Result<()> {
    for r in requests {
        serde_json::to_writer(&mut out, r)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "{\"timestamp\": 0, \"input_length\": 9013, \"output_length\": 3, \
        \"hash_ids\": [46, 47, 48, 49, 50, 51, 52, 53, 54, 55, 56, 57, 58, 59, 60, 61, 62, 63]}\n\
        \n\
        {\"timestamp\": 30535, \"input_length\": 1024, \"output_length\": 26, \"hash_ids\": [46, 47], \
        \"extra\": \"ignored\"}\n\
        {\"timestamp\": 27482, \"input_length\": 513, \"output_length\": 52, \"hash_ids\": [46, 2353]}\n";

    fn read(text: &str, limit: usize) -> Result<Vec<TraceRequest>, TraceError> {
        read_trace(text.as_bytes(), "t.jsonl", limit)
    }

    #[test]
    fn good_lines_load_in_arrival_order() {
        let t = read(GOOD, 100).unwrap();
        assert_eq!(t.len(), 3);
        assert_eq!(t[0].input_length, 9013);
        assert_eq!(t[0].hash_ids.len(), 18);
        // Sorted by timestamp: the 27482 line comes before the 30535 one.
        assert_eq!(
            t.iter().map(|r| r.timestamp).collect::<Vec<_>>(),
            [0, 27482, 30535]
        );
        assert_eq!(t[1].hash_ids, [46, 2353]);
    }

    #[test]
    fn the_limit_bounds_the_requests_read() {
        let t = read(GOOD, 2).unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[1].input_length, 1024);
    }

    #[test]
    fn the_last_block_may_be_partial_but_the_count_must_match() {
        // 513 tokens = one full block and a partial one of 1 token.
        assert!(
            parse_line(r#"{"timestamp":1,"input_length":513,"output_length":1,"hash_ids":[1,2]}"#)
                .is_ok()
        );
        // 512 tokens is exactly one block: two ids is one too many.
        let e =
            parse_line(r#"{"timestamp":1,"input_length":512,"output_length":1,"hash_ids":[1,2]}"#)
                .unwrap_err();
        assert!(e.contains("needs 1"), "{e}");
        let e =
            parse_line(r#"{"timestamp":1,"input_length":1025,"output_length":1,"hash_ids":[1,2]}"#)
                .unwrap_err();
        assert!(e.contains("needs 3"), "{e}");
    }

    #[test]
    fn bad_lines_are_errors_naming_the_line() {
        let cases = [
            ("{\"timestamp\": 0", "EOF"),
            ("[1, 2]", "expected struct"),
            (
                r#"{"timestamp":-5,"input_length":1,"output_length":1,"hash_ids":[1]}"#,
                "invalid value",
            ),
            (
                r#"{"timestamp":1.5,"input_length":1,"output_length":1,"hash_ids":[1]}"#,
                "floating point",
            ),
            (
                r#"{"timestamp":1,"input_length":0,"output_length":1,"hash_ids":[]}"#,
                "input_length",
            ),
            (
                r#"{"timestamp":1,"input_length":1,"output_length":0,"hash_ids":[1]}"#,
                "output_length",
            ),
            (
                r#"{"timestamp":1,"input_length":1,"output_length":1}"#,
                "missing field `hash_ids`",
            ),
            (
                r#"{"timestamp":1,"input_length":1,"output_length":1,"hash_ids":["a"]}"#,
                "invalid type",
            ),
        ];
        for (bad, why) in cases {
            let text = format!("{GOOD}{bad}\n");
            let e = read(&text, 100).unwrap_err();
            assert_eq!(e.line, 5, "{bad}: {e}");
            assert!(e.reason.contains(why), "{bad}: {e}");
            assert!(e.to_string().starts_with("t.jsonl:5: "), "{e}");
        }
    }

    #[test]
    fn empty_and_overlong_input_are_errors() {
        assert_eq!(read("\n\n", 10).unwrap_err().line, 0);
        let long = format!(
            "{{\"timestamp\": 0, \"pad\": \"{}\"}}\n",
            "x".repeat(MAX_LINE_BYTES)
        );
        let e = read(&long, 10).unwrap_err();
        assert_eq!(e.line, 1);
        assert!(e.reason.contains("longer than"), "{e}");
    }

    #[test]
    fn written_traces_read_back_equal() {
        let t = read(GOOD, 100).unwrap();
        let mut buf = Vec::new();
        write_trace(&mut buf, &t).unwrap();
        let text = String::from_utf8(buf).unwrap();
        assert!(text.starts_with("{\"timestamp\":0,\"input_length\":9013,"));
        assert_eq!(read(&text, 100).unwrap(), t);
    }
}
