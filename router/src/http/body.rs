//! Reading an inference request's body: bounded in size, in time and in
//! the replica's memory, and parsed off the I/O thread when it is large.
//!
//! - **Size**: at most `--max-payload-bytes` (413); a declared length over
//!   it is refused before a byte is read.
//! - **Time**: `--client-body-timeout-secs` between two pieces and
//!   `--client-body-deadline-secs` in all (408), so a client trickling a
//!   byte a second cannot hold a request forever.
//! - **Memory**: every body reserves its bytes in the replica's
//!   [`BufferBudget`] as they arrive (its declared length at once); a body
//!   that does not fit gets 503 with `Retry-After`. A declared length is
//!   allocated once, exactly: no growth doubling, no copy to join pieces.
//! - **The I/O thread**: a body over [`INLINE_INSPECT_MAX_BYTES`] is
//!   inspected on the blocking pool, so the streams the same thread serves
//!   keep flowing while tens of megabytes of JSON are parsed.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use bytes::{Bytes, BytesMut};
use http::StatusCode;
use http_body_util::BodyExt;

use crate::admission::buffer::{BufferBudget, Reservation};
use crate::error::ApiError;
use crate::request::{self, RequestInfo, Route};
use crate::telemetry;

/// Largest body inspected on the I/O thread itself (about a quarter of a
/// millisecond of parsing); larger ones go to the blocking pool.
pub const INLINE_INSPECT_MAX_BYTES: usize = 256 * 1024;

/// Bytes of body read between two yields to the thread's other tasks.
const YIELD_EVERY_BYTES: usize = 1 << 20;

/// What a body may be.
#[derive(Debug, Clone, Copy)]
pub struct BodyLimits {
    /// Largest body, in bytes.
    pub max_bytes: usize,
    /// Longest wait for the next piece.
    pub idle: Duration,
    /// Longest time for the whole body.
    pub deadline: Duration,
}

/// Why a body was not read.
#[derive(Debug)]
pub enum Refusal {
    /// The replica's buffer budget is full: 503 with `Retry-After`.
    Budget(ApiError),
    /// Too large, too slow or broken.
    Body(ApiError),
}

/// A body read whole, with the budget it holds.
#[derive(Debug)]
pub struct ReadBody {
    /// The bytes.
    pub bytes: Bytes,
    /// Given back when dropped: keep it while the bytes are held.
    pub reservation: Reservation,
}

/// The pieces read so far: one piece is kept as it came (no copy, the
/// common case of a body that arrives in one read).
enum Pieces {
    Empty,
    One(Bytes),
    Many(BytesMut),
}

impl Pieces {
    fn len(&self) -> usize {
        match self {
            Pieces::Empty => 0,
            Pieces::One(b) => b.len(),
            Pieces::Many(b) => b.len(),
        }
    }

    fn push(&mut self, data: Bytes, expected: usize) {
        *self = match std::mem::replace(self, Pieces::Empty) {
            Pieces::Empty => Pieces::One(data),
            Pieces::One(first) => {
                let mut joined = BytesMut::with_capacity(expected.max(first.len() + data.len()));
                joined.extend_from_slice(&first);
                joined.extend_from_slice(&data);
                Pieces::Many(joined)
            }
            Pieces::Many(mut joined) => {
                joined.extend_from_slice(&data);
                Pieces::Many(joined)
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Pieces::Empty => Bytes::new(),
            Pieces::One(b) => b,
            Pieces::Many(b) => b.freeze(),
        }
    }
}

/// The 503 of a full budget.
fn budget_full(budget: &BufferBudget) -> Refusal {
    Refusal::Budget(ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "this replica already holds {} of its {} bytes of request bodies \
             (--max-buffered-request-bytes); retry later",
            budget.used(),
            budget.limit()
        ),
        kind: "service_unavailable",
        code: "request_buffer_full",
    })
}

/// Reads `body` whole (its `declared` length, if any) within `limits`,
/// reserving its bytes in `budget`.
pub async fn read(
    body: Body,
    declared: Option<u64>,
    limits: BodyLimits,
    budget: &Arc<BufferBudget>,
) -> Result<ReadBody, Refusal> {
    let declared = match declared.map(usize::try_from) {
        Some(Ok(len)) if len <= limits.max_bytes => Some(len),
        Some(_) => return Err(Refusal::Body(ApiError::payload_too_large(limits.max_bytes))),
        None => None,
    };
    let expected = declared.unwrap_or(0);
    let mut reservation = budget
        .reserve(expected)
        .ok_or_else(|| budget_full(budget))?;
    let deadline = tokio::time::Instant::now() + limits.deadline;
    let mut body = body;
    let mut pieces = Pieces::Empty;
    loop {
        let wake = (tokio::time::Instant::now() + limits.idle).min(deadline);
        let frame = match tokio::time::timeout_at(wake, body.frame()).await {
            Err(_elapsed) if wake == deadline => {
                telemetry::client_connection_closed("body_deadline");
                return Err(Refusal::Body(ApiError::request_timeout(format!(
                    "the request body took longer than --client-body-deadline-secs ({}s)",
                    limits.deadline.as_secs()
                ))));
            }
            Err(_elapsed) => {
                telemetry::client_connection_closed("body_timeout");
                return Err(Refusal::Body(ApiError::request_timeout(format!(
                    "the request body stalled for --client-body-timeout-secs ({}s)",
                    limits.idle.as_secs()
                ))));
            }
            Ok(None) => break,
            Ok(Some(Ok(frame))) => frame,
            Ok(Some(Err(err))) => {
                return Err(Refusal::Body(ApiError::bad_request(
                    "body_read_failed",
                    format!("could not read the request body: {err}"),
                )));
            }
        };
        let Ok(data) = frame.into_data() else {
            continue;
        };
        let piece = data.len();
        let total = pieces.len().saturating_add(piece);
        if total > limits.max_bytes {
            return Err(Refusal::Body(ApiError::payload_too_large(limits.max_bytes)));
        }
        if !reservation.grow_to(total) {
            return Err(budget_full(budget));
        }
        pieces.push(data, expected);
        // A large body arriving fast is read without a pause (the socket
        // always has data): let the thread's other connections run
        // between megabytes.
        if total / YIELD_EVERY_BYTES > (total - piece) / YIELD_EVERY_BYTES {
            tokio::task::yield_now().await;
        }
    }
    Ok(ReadBody {
        bytes: pieces.into_bytes(),
        reservation,
    })
}

/// What `bytes` (a body of `route`, of `content_type`) tells the router,
/// keeping `text_limit` bytes of prompt text; parsed on the blocking pool
/// when large (see the module doc).
pub async fn inspect(
    route: Route,
    bytes: &Bytes,
    content_type: Option<&str>,
    text_limit: Option<usize>,
) -> Result<RequestInfo, ApiError> {
    let invalid = |err: request::BodyError| ApiError::invalid_json(err.to_string());
    if bytes.len() <= INLINE_INSPECT_MAX_BYTES {
        return request::inspect_route(route, bytes, content_type, text_limit).map_err(invalid);
    }
    let (body, content_type) = (bytes.clone(), content_type.map(str::to_owned));
    tokio::task::spawn_blocking(move || {
        request::inspect_route(route, &body, content_type.as_deref(), text_limit)
    })
    .await
    .map_err(|err| {
        ApiError::bad_request(
            "body_inspection_failed",
            format!("could not inspect the request body: {err}"),
        )
    })?
    .map_err(invalid)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: BodyLimits = BodyLimits {
        max_bytes: 1000,
        idle: Duration::from_secs(5),
        deadline: Duration::from_secs(10),
    };

    fn chunked(pieces: &[&'static [u8]]) -> Body {
        let pieces: Vec<Result<Bytes, std::io::Error>> =
            pieces.iter().map(|p| Ok(Bytes::from_static(p))).collect();
        Body::from_stream(futures_util::stream::iter(pieces))
    }

    #[tokio::test]
    async fn pieces_are_joined_and_the_budget_is_held_until_dropped() {
        let budget = BufferBudget::new(100);
        let read_body = read(chunked(&[b"ab", b"cd", b"e"]), None, LIMITS, &budget)
            .await
            .unwrap();
        assert_eq!(&read_body.bytes[..], b"abcde");
        assert_eq!(budget.used(), 5);
        drop(read_body);
        assert_eq!(budget.used(), 0);
    }

    #[tokio::test]
    async fn a_declared_length_is_reserved_before_any_byte_and_refused_when_it_does_not_fit() {
        let budget = BufferBudget::new(100);
        let held = budget.reserve(60).unwrap();
        let refused = read(chunked(&[b"x"]), Some(50), LIMITS, &budget).await;
        let Err(Refusal::Budget(error)) = refused else {
            panic!("expected a budget refusal: {refused:?}");
        };
        assert_eq!(error.code, "request_buffer_full");
        assert!(error.message.contains("60 of its 100"), "{}", error.message);
        // An undeclared body is refused once it outgrows the room.
        let grown = read(chunked(&[&b"0123456789"[..]; 5]), None, LIMITS, &budget).await;
        assert!(matches!(grown, Err(Refusal::Budget(_))));
        assert_eq!(budget.used(), 60, "a refused body holds nothing");
        drop(held);
        let too_large = read(chunked(&[b"x"]), Some(1001), LIMITS, &budget).await;
        assert!(
            matches!(too_large, Err(Refusal::Body(e)) if e.status == StatusCode::PAYLOAD_TOO_LARGE)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_trickles_past_its_deadline_gets_408() {
        let budget = BufferBudget::new(1000);
        // A byte every 4 s: never idle for the 5 s timeout, past the 10 s
        // deadline on the third byte.
        let stream = futures_util::stream::unfold(0u32, |n| async move {
            tokio::time::sleep(Duration::from_secs(4)).await;
            (n < 100).then(|| (Ok::<_, std::io::Error>(Bytes::from_static(b"x")), n + 1))
        });
        let refused = read(Body::from_stream(stream), None, LIMITS, &budget).await;
        let Err(Refusal::Body(error)) = refused else {
            panic!("expected a 408: {refused:?}");
        };
        assert_eq!(error.status, StatusCode::REQUEST_TIMEOUT);
        assert!(
            error.message.contains("--client-body-deadline-secs"),
            "{}",
            error.message
        );
    }
}
