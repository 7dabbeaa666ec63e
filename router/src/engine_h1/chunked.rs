//! Decoding a `Transfer-Encoding: chunked` body (RFC 9112 §7.1) in place,
//! from the connection's read buffer.
//!
//! Why our own: the decoder hands out each chunk's data as a slice of the
//! read buffer (`split_to(..).freeze()`, no copy), and it can tell, without
//! reading, that the body has ended, so the connection goes back to the
//! pool as the last frame is handed on. Chunk extensions and trailers are
//! read and dropped; every line is bounded.

use bytes::{Buf, Bytes, BytesMut};

/// Longest chunk-size or trailer line accepted (extensions included).
pub const MAX_LINE: usize = 4096;
/// Most trailer lines accepted after the last chunk.
pub const MAX_TRAILERS: usize = 64;

/// What the buffer yielded.
#[derive(Debug, PartialEq, Eq)]
pub enum Step {
    /// Data of the current chunk (never empty).
    Data(Bytes),
    /// The body is complete: the last chunk and the trailers were read.
    End,
    /// More bytes are needed.
    NeedMore,
}

/// Why a chunked body is malformed.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum ChunkError {
    /// The chunk-size line is not hexadecimal digits (plus extensions).
    #[error("bad chunk size line")]
    BadSize,
    /// The chunk size does not fit in 64 bits.
    #[error("chunk size too large")]
    SizeOverflow,
    /// A chunk's data was not followed by CRLF.
    #[error("chunk data not followed by CRLF")]
    MissingCrlf,
    /// A size or trailer line is longer than [`MAX_LINE`].
    #[error("chunk line longer than {MAX_LINE} bytes")]
    LineTooLong,
    /// More than [`MAX_TRAILERS`] trailer lines.
    #[error("more than {MAX_TRAILERS} trailer lines")]
    TooManyTrailers,
}

/// Where the decoder is in the body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Expecting a chunk-size line.
    Size,
    /// Inside a chunk's data: bytes left.
    Data(u64),
    /// After a chunk's data: expecting CRLF.
    DataEnd,
    /// After the last (zero-size) chunk: trailer lines until an empty one.
    Trailers(usize),
    /// The body is complete.
    Done,
}

/// The decoder's position in one chunked body.
#[derive(Debug)]
pub struct ChunkedDecoder {
    state: State,
}

impl Default for ChunkedDecoder {
    fn default() -> Self {
        Self::new()
    }
}

impl ChunkedDecoder {
    /// A decoder at the start of a body.
    pub fn new() -> Self {
        Self { state: State::Size }
    }

    /// Whether the whole body has been read.
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Consumes what it can from `buf`: the next data slice, the end of the
    /// body, or a request for more bytes (`buf` then holds an incomplete
    /// line, kept for the next call).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Step, ChunkError> {
        loop {
            match self.state {
                State::Data(left) => {
                    if buf.is_empty() {
                        return Ok(Step::NeedMore);
                    }
                    let take = usize::try_from(left).unwrap_or(usize::MAX).min(buf.len());
                    let data = buf.split_to(take).freeze();
                    let left = left - take as u64;
                    self.state = if left == 0 {
                        State::DataEnd
                    } else {
                        State::Data(left)
                    };
                    return Ok(Step::Data(data));
                }
                State::Done => return Ok(Step::End),
                _ => {
                    if !self.advance_control(buf)? {
                        return Ok(Step::NeedMore);
                    }
                }
            }
        }
    }

    /// Reads the framing that follows a chunk's data while it is already
    /// buffered, without handing out any data: after the last data frame
    /// this finds the end of the body before anyone asks for it. Returns
    /// whether the body is now complete.
    pub fn finish_if_buffered(&mut self, buf: &mut BytesMut) -> Result<bool, ChunkError> {
        while !matches!(self.state, State::Data(_) | State::Done) {
            if !self.advance_control(buf)? {
                break;
            }
        }
        Ok(self.is_done())
    }

    /// One step through a size line, a data CRLF or a trailer line.
    /// `false` when `buf` does not hold the whole of it yet.
    fn advance_control(&mut self, buf: &mut BytesMut) -> Result<bool, ChunkError> {
        match self.state {
            State::DataEnd => {
                if buf.len() < 2 {
                    return Ok(false);
                }
                if &buf[..2] != b"\r\n" {
                    return Err(ChunkError::MissingCrlf);
                }
                buf.advance(2);
                self.state = State::Size;
            }
            State::Size => {
                let Some(line_len) = line_length(buf)? else {
                    return Ok(false);
                };
                let size = parse_size(&buf[..line_len])?;
                buf.advance(line_len + 2);
                self.state = if size == 0 {
                    State::Trailers(0)
                } else {
                    State::Data(size)
                };
            }
            State::Trailers(seen) => {
                let Some(line_len) = line_length(buf)? else {
                    return Ok(false);
                };
                buf.advance(line_len + 2);
                self.state = if line_len == 0 {
                    State::Done
                } else if seen + 1 > MAX_TRAILERS {
                    return Err(ChunkError::TooManyTrailers);
                } else {
                    State::Trailers(seen + 1)
                };
            }
            State::Data(_) | State::Done => {}
        }
        Ok(true)
    }
}

/// Length of the CRLF-terminated line at the start of `buf` (without the
/// CRLF), `None` while it is incomplete.
fn line_length(buf: &[u8]) -> Result<Option<usize>, ChunkError> {
    let window = &buf[..buf.len().min(MAX_LINE + 2)];
    match window.windows(2).position(|pair| pair == b"\r\n") {
        Some(at) => Ok(Some(at)),
        None if buf.len() >= MAX_LINE + 2 => Err(ChunkError::LineTooLong),
        None => Ok(None),
    }
}

/// The size in a chunk-size line: hex digits, then optional whitespace and
/// `;extensions`, which are ignored.
fn parse_size(line: &[u8]) -> Result<u64, ChunkError> {
    let digits = line.iter().take_while(|b| b.is_ascii_hexdigit()).count();
    if digits == 0 {
        return Err(ChunkError::BadSize);
    }
    let rest = &line[digits..];
    let rest_ok = rest.is_empty()
        || rest
            .iter()
            .position(|b| !matches!(b, b' ' | b'\t'))
            .is_none_or(|at| rest[at] == b';');
    if !rest_ok {
        return Err(ChunkError::BadSize);
    }
    let mut size: u64 = 0;
    for &digit in &line[..digits] {
        let value = u64::from(match digit {
            b'0'..=b'9' => digit - b'0',
            b'a'..=b'f' => digit - b'a' + 10,
            _ => digit - b'A' + 10,
        });
        size = size
            .checked_mul(16)
            .and_then(|s| s.checked_add(value))
            .ok_or(ChunkError::SizeOverflow)?;
    }
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Decodes `wire` fed in pieces of `piece` bytes: the data, and whether
    /// the end was seen.
    fn decode_in_pieces(wire: &[u8], piece: usize) -> Result<(Vec<u8>, bool), ChunkError> {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        let mut fed = 0;
        loop {
            match decoder.decode(&mut buf)? {
                Step::Data(data) => {
                    assert!(!data.is_empty());
                    out.extend_from_slice(&data);
                }
                Step::End => return Ok((out, true)),
                Step::NeedMore => {
                    if fed == wire.len() {
                        return Ok((out, false));
                    }
                    let end = (fed + piece).min(wire.len());
                    buf.extend_from_slice(&wire[fed..end]);
                    fed = end;
                }
            }
        }
    }

    #[test]
    fn decodes_chunks_with_extensions_and_trailers_at_any_split() {
        let wire = b"5\r\nhello\r\n1A; name=\"x\"\r\nabcdefghijklmnopqrstuvwxyz\r\n0\r\nx-trailer: 1\r\n\r\n";
        let expected = b"helloabcdefghijklmnopqrstuvwxyz".to_vec();
        for piece in 1..=wire.len() {
            let (data, ended) = decode_in_pieces(wire, piece).unwrap();
            assert_eq!(data, expected, "piece size {piece}");
            assert!(ended, "piece size {piece}");
        }
    }

    #[test]
    fn an_unfinished_body_asks_for_more_and_never_ends() {
        let (data, ended) = decode_in_pieces(b"5\r\nhel", 2).unwrap();
        assert_eq!(data, b"hel");
        assert!(!ended);
        let (_, ended) = decode_in_pieces(b"5\r\nhello\r\n0\r\n", 3).unwrap();
        assert!(!ended, "the empty line after the last chunk is required");
    }

    #[test]
    fn bytes_after_the_body_stay_in_the_buffer() {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::from(&b"2\r\nok\r\n0\r\n\r\nHTTP/1.1"[..]);
        assert_eq!(
            decoder.decode(&mut buf).unwrap(),
            Step::Data(Bytes::from_static(b"ok"))
        );
        assert!(decoder.finish_if_buffered(&mut buf).unwrap());
        assert_eq!(&buf[..], b"HTTP/1.1");
        assert_eq!(decoder.decode(&mut buf).unwrap(), Step::End);
    }

    #[test]
    fn finish_if_buffered_stops_before_more_data() {
        let mut decoder = ChunkedDecoder::new();
        let mut buf = BytesMut::from(&b"2\r\nok\r\n3\r\nabc\r\n0\r\n\r\n"[..]);
        assert_eq!(
            decoder.decode(&mut buf).unwrap(),
            Step::Data(Bytes::from_static(b"ok"))
        );
        assert!(!decoder.finish_if_buffered(&mut buf).unwrap());
        assert_eq!(
            decoder.decode(&mut buf).unwrap(),
            Step::Data(Bytes::from_static(b"abc"))
        );
        assert!(decoder.finish_if_buffered(&mut buf).unwrap());
    }

    #[test]
    fn malformed_bodies_are_errors() {
        let cases: [(&[u8], ChunkError); 6] = [
            (b"zz\r\n", ChunkError::BadSize),
            (b"\r\n", ChunkError::BadSize),
            (b"5x\r\nhello\r\n", ChunkError::BadSize),
            (b"2\r\nokXX", ChunkError::MissingCrlf),
            (b"11111111111111111\r\n", ChunkError::SizeOverflow),
            (b"-1\r\n", ChunkError::BadSize),
        ];
        for (wire, expected) in cases {
            assert_eq!(
                decode_in_pieces(wire, wire.len()),
                Err(expected),
                "{wire:?}"
            );
        }
        let long = vec![b'1'; MAX_LINE + 10];
        assert_eq!(decode_in_pieces(&long, 64), Err(ChunkError::LineTooLong));
        let mut trailers = b"0\r\n".to_vec();
        for _ in 0..=MAX_TRAILERS {
            trailers.extend_from_slice(b"x: 1\r\n");
        }
        trailers.extend_from_slice(b"\r\n");
        assert_eq!(
            decode_in_pieces(&trailers, 7),
            Err(ChunkError::TooManyTrailers)
        );
    }

    #[test]
    fn sizes_in_either_case_and_whitespace_before_extensions() {
        assert_eq!(parse_size(b"fF"), Ok(255));
        assert_eq!(parse_size(b"10 ;ext"), Ok(16));
        assert_eq!(parse_size(b"10\t"), Ok(16));
        assert_eq!(parse_size(b"ffffffffffffffff"), Ok(u64::MAX));
    }
}
