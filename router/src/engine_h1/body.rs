//! A response body read straight from the engine's connection.
//!
//! Each poll hands on what the socket has (a content-length slice or a
//! chunk's data, sliced out of the read buffer without copying; small
//! chunks already read behind it, an engine's SSE events, joined into one
//! frame: `EngineBody::join_buffered`) and reads
//! more only when the buffer is spent, on the task that polls it: no
//! connection task, no channel between them. When the last byte is handed
//! on the connection goes back to this thread's pool at once (or, for a
//! side request, to whoever reads the body: [`Home`]); a body dropped
//! before its end closes the connection, which is how the engine learns
//! the client went away.

use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use super::EngineError;
use super::chunked::{ChunkedDecoder, Step};
use super::conn::{self, Conn};
use super::head::Framing;

/// Where the body is.
#[derive(Debug)]
enum Remaining {
    /// Content-Length bytes left.
    Length(u64),
    /// A chunked body.
    Chunked(ChunkedDecoder),
    /// Until the engine closes.
    UntilClose,
}

/// Where a connection goes when its response body has been read whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Home {
    /// This thread's pool (proxied requests).
    ThreadPool,
    /// Held by the body for its reader to take
    /// ([`EngineBody::take_reusable`]): side requests, pooled apart.
    Reader,
}

/// The body of one engine response.
#[derive(Debug)]
pub struct EngineBody {
    /// The connection, until the body ended or failed.
    conn: Option<Conn>,
    remaining: Remaining,
    /// Whether the connection may be reused after the body.
    keep_alive: bool,
    home: Home,
    /// The connection after a complete body, when `home` is the reader.
    finished: Option<Conn>,
    /// A framing error met while joining frames, for the next poll.
    deferred: Option<EngineError>,
}

/// A frame shorter than this is joined with the frames already buffered
/// behind it (see [`EngineBody::join_buffered`]).
const JOIN_BELOW: usize = 4 * 1024;

/// The largest frame joining makes.
const JOIN_MAX: usize = 16 * 1024;

impl EngineBody {
    /// The body that follows a response head on `conn` (the head already
    /// consumed from its buffer).
    pub(super) fn new(conn: Conn, framing: Framing, keep_alive: bool, home: Home) -> Self {
        let remaining = match framing {
            Framing::Length(n) => Remaining::Length(n),
            Framing::Chunked => Remaining::Chunked(ChunkedDecoder::new()),
            Framing::UntilClose => Remaining::UntilClose,
        };
        let mut body = Self {
            conn: Some(conn),
            remaining,
            keep_alive,
            home,
            finished: None,
            deferred: None,
        };
        body.finish_if_complete();
        body
    }

    /// Gives the connection back once the body is known complete.
    fn finish_if_complete(&mut self) {
        let complete = match &mut self.remaining {
            Remaining::Length(left) => *left == 0,
            Remaining::Chunked(decoder) => match self.conn.as_mut() {
                Some(conn) => decoder.finish_if_buffered(&mut conn.buf).unwrap_or(false),
                None => decoder.is_done(),
            },
            Remaining::UntilClose => false,
        };
        if complete {
            self.remaining = Remaining::Length(0);
            if let Some(conn) = self.conn.take()
                && self.keep_alive
            {
                match self.home {
                    Home::ThreadPool => conn::put(conn),
                    Home::Reader => self.finished = Some(conn),
                }
            }
        }
    }

    /// The connection, once the body was read to its end and the engine
    /// keeps it open (only for [`Home::Reader`] bodies).
    pub(super) fn take_reusable(&mut self) -> Option<Conn> {
        self.finished.take()
    }

    /// `first` and the small frames already buffered behind it, as one.
    ///
    /// An engine streams one SSE event per chunk (~200 bytes), and a read
    /// brings many of them. Handed on one by one, each costs every layer
    /// above a poll and the client's connection a chunk header and three
    /// more write vectors; joined, a burst is copied once (a few hundred
    /// bytes per event) and written as one chunk. Nothing waits: only what
    /// is already read is joined, so no event is delayed.
    fn join_buffered(&mut self, first: Bytes) -> Bytes {
        if first.len() >= JOIN_BELOW || !matches!(self.remaining, Remaining::Chunked(_)) {
            return first;
        }
        let mut joined: Option<BytesMut> = None;
        loop {
            let len = joined.as_ref().map_or(first.len(), BytesMut::len);
            if len >= JOIN_MAX {
                break;
            }
            match self.next_buffered() {
                Ok(Some(Some(more))) => {
                    let buf = joined.get_or_insert_with(|| {
                        let mut buf = BytesMut::with_capacity(JOIN_MAX.min(len * 8));
                        buf.extend_from_slice(&first);
                        buf
                    });
                    buf.extend_from_slice(&more);
                }
                Ok(_) => break,
                Err(err) => {
                    self.deferred = Some(err);
                    break;
                }
            }
        }
        joined.map_or(first, BytesMut::freeze)
    }

    /// The next frame's bytes from the buffer alone: `Ok(None)` when more
    /// must be read first.
    fn next_buffered(&mut self) -> Result<Option<Option<Bytes>>, EngineError> {
        let Some(conn) = self.conn.as_mut() else {
            return Ok(Some(None));
        };
        match &mut self.remaining {
            Remaining::Length(0) => Ok(Some(None)),
            Remaining::Length(left) => {
                if conn.buf.is_empty() {
                    return Ok(None);
                }
                let take = usize::try_from(*left)
                    .unwrap_or(usize::MAX)
                    .min(conn.buf.len());
                *left -= take as u64;
                Ok(Some(Some(conn.buf.split_to(take).freeze())))
            }
            Remaining::Chunked(decoder) => match decoder.decode(&mut conn.buf) {
                Ok(Step::Data(data)) => Ok(Some(Some(data))),
                Ok(Step::End) => Ok(Some(None)),
                Ok(Step::NeedMore) => Ok(None),
                Err(err) => Err(EngineError::Chunked(err)),
            },
            Remaining::UntilClose => {
                if conn.buf.is_empty() {
                    return Ok(None);
                }
                let all = conn.buf.len();
                Ok(Some(Some(conn.buf.split_to(all).freeze())))
            }
        }
    }
}

impl Body for EngineBody {
    type Data = Bytes;
    type Error = EngineError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, EngineError>>> {
        let this = self.get_mut();
        if let Some(err) = this.deferred.take() {
            this.conn = None;
            return Poll::Ready(Some(Err(err)));
        }
        loop {
            match this.next_buffered() {
                Err(err) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(err)));
                }
                Ok(Some(Some(data))) => {
                    let data = this.join_buffered(data);
                    this.finish_if_complete();
                    return Poll::Ready(Some(Ok(Frame::data(data))));
                }
                Ok(Some(None)) => {
                    this.finish_if_complete();
                    this.conn = None;
                    return Poll::Ready(None);
                }
                Ok(None) => {}
            }
            let Some(conn) = this.conn.as_mut() else {
                return Poll::Ready(None);
            };
            match conn.poll_fill(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(err)) => {
                    this.conn = None;
                    return Poll::Ready(Some(Err(EngineError::Read(err))));
                }
                Poll::Ready(Ok(0)) => {
                    this.conn = None;
                    if matches!(this.remaining, Remaining::UntilClose) {
                        this.remaining = Remaining::Length(0);
                        return Poll::Ready(None);
                    }
                    return Poll::Ready(Some(Err(EngineError::Truncated)));
                }
                Poll::Ready(Ok(_)) => {}
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.conn.is_none() || matches!(self.remaining, Remaining::Length(0))
    }

    fn size_hint(&self) -> SizeHint {
        match self.remaining {
            Remaining::Length(left) => SizeHint::with_exact(left),
            _ => SizeHint::default(),
        }
    }
}
