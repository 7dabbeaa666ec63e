//! The response body handed to the client: the worker's body, frame by
//! frame, with the request's booking attached.
//!
//! Nothing is buffered. The first data frame releases the booking's pending
//! prefill; the end of the stream, an upstream error, the request deadline
//! or the client going away (the body is dropped) releases the rest, and
//! ends the request's [`RequestRecord`], so a streamed request is counted
//! when its stream ends, once.

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};

use crate::engine_h1::EngineBody;
use crate::telemetry::RequestRecord;
use crate::workers::SlotBooking;
use crate::workers::Worker;

/// Error type of the streamed body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A worker's response body that accounts for the request it belongs to.
pub struct TrackedBody {
    inner: EngineBody,
    booking: Option<SlotBooking>,
    worker: Arc<Worker>,
    /// End of the request's time budget.
    deadline: tokio::time::Instant,
    /// The timer for it, made the first time the body has to wait.
    timer: Option<Pin<Box<tokio::time::Sleep>>>,
    record: Option<RequestRecord>,
    saw_data: bool,
}

impl TrackedBody {
    /// Wraps `inner`; `deadline` is the end of the request's time budget,
    /// `record` the request's accounting with the worker's status set
    /// (`None`: a migratable stream keeps it across its legs).
    pub fn new(
        inner: EngineBody,
        booking: SlotBooking,
        worker: Arc<Worker>,
        deadline: tokio::time::Instant,
        record: Option<RequestRecord>,
    ) -> Self {
        Self {
            inner,
            booking: Some(booking),
            worker,
            deadline,
            timer: None,
            record,
            saw_data: false,
        }
    }

    fn finish(&mut self, outcome: &'static str) {
        if self.booking.take().is_some() {
            // Ends the request: it is counted here, once.
            drop(self.record.take());
            if outcome != "complete" {
                tracing::debug!(
                    worker = self.worker.url(),
                    outcome,
                    "response stream ended early"
                );
            }
        }
    }
}

impl Body for TrackedBody {
    type Data = Bytes;
    type Error = BoxError;

    // Inlined into the body that wraps it (a migratable stream's), which
    // polls it once per event.
    #[inline]
    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if this.booking.is_none() {
            return Poll::Ready(None);
        }
        match Pin::new(&mut this.inner).poll_frame(cx) {
            Poll::Ready(Some(Ok(frame))) => {
                if !this.saw_data && frame.data_ref().is_some_and(|d| !d.is_empty()) {
                    this.saw_data = true;
                    if let Some(booking) = this.booking.as_mut() {
                        booking.first_byte();
                    }
                    if let Some(record) = &this.record {
                        record.first_token();
                    }
                }
                if this.inner.is_end_stream() {
                    // The last frame: the request ends here, not when the
                    // server gets round to dropping the body.
                    this.finish("complete");
                }
                Poll::Ready(Some(Ok(frame)))
            }
            Poll::Ready(Some(Err(err))) => {
                this.worker.breaker().record_failure();
                this.finish("upstream_error");
                Poll::Ready(Some(Err(Box::new(err))))
            }
            Poll::Ready(None) => {
                this.finish("complete");
                Poll::Ready(None)
            }
            Poll::Pending => {
                // The deadline is armed only once the body has to wait: a
                // body that is already read never touches the timer wheel.
                let deadline = this.deadline;
                let timer = this
                    .timer
                    .get_or_insert_with(|| Box::pin(tokio::time::sleep_until(deadline)));
                if timer.as_mut().poll(cx).is_ready() {
                    this.finish("deadline");
                    return Poll::Ready(Some(Err(
                        "request deadline (--request-timeout-secs) exceeded".into(),
                    )));
                }
                Poll::Pending
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.booking.is_none() || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

impl Drop for TrackedBody {
    fn drop(&mut self) {
        // Still booked: the client went away (or an empty body was never polled).
        self.finish("dropped");
    }
}
