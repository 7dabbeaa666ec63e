//! Overload admission: at most `--max-concurrent-requests` inference
//! requests are proxied at once by this replica; up to `--queue-size` more
//! wait (FIFO) for at most `--queue-timeout-secs`.
//!
//! A request that finds the queue full gets 429 at once; one whose wait
//! times out gets 503. Both carry `Retry-After` and OpenAI's error shape, so
//! clients back off instead of piling up on timeouts. A permit is held until
//! the response body ends (streaming included) or the client goes away, so
//! the limit counts streams, not just handler calls.
//!
//! `--max-concurrent-requests 0` (the default) turns admission off: the
//! router cannot know what its engines can hold, and a guessed limit would
//! reject traffic the fleet could serve. The limit is per replica.
//!
//! `--worker-max-inflight N` (0 = off) is the fleet-aware guard: when every
//! available worker already has N requests in flight in this replica's
//! fleet view (fleet-wide with the mesh), the request gets 503 with
//! `Retry-After` at once instead of queueing at a full engine. It is a soft
//! cap: replicas that decide at the same instant can each admit one more.

pub mod buffer;

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::workers::Worker;

/// Seconds a rejected client is told to wait before retrying.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot is busy and the wait queue is full: 429.
    QueueFull,
    /// The request waited `--queue-timeout-secs` without a slot: 503.
    QueueTimeout,
}

impl Rejection {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
        }
    }

    /// The OpenAI-shaped answer, with `Retry-After`.
    pub fn error(self, limit: usize, queue: usize, timeout: Duration) -> ApiError {
        match self {
            Self::QueueFull => ApiError {
                status: StatusCode::TOO_MANY_REQUESTS,
                message: format!(
                    "router overloaded: {limit} requests in flight and {queue} waiting \
                     (--max-concurrent-requests, --queue-size); retry later"
                ),
                kind: "rate_limit_error",
                code: "router_overloaded",
            },
            Self::QueueTimeout => ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: format!(
                    "router overloaded: no request slot freed within {}s \
                     (--queue-timeout-secs); retry later",
                    timeout.as_secs()
                ),
                kind: "service_unavailable",
                code: "queue_timeout",
            },
        }
    }
}

/// Turns an [`ApiError`] of admission into a response with `Retry-After`.
pub fn reject_response(error: ApiError) -> Response {
    let mut response = error.into_response();
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(RETRY_AFTER_SECS));
    response
}

/// One replica's admission gate. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub struct Admission {
    limit: usize,
    queue_size: usize,
    queue_timeout: Duration,
    slots: Arc<Semaphore>,
    waiting: AtomicUsize,
}

/// A held request slot; released on drop.
#[derive(Debug)]
pub struct Permit {
    _permit: OwnedSemaphorePermit,
}

/// Decrements the waiting count when a queued request leaves the queue,
/// however it leaves (admitted, timed out, or its client went away).
struct Waiting<'a>(&'a AtomicUsize);

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Admission {
    /// A gate of `limit` concurrent requests (0 = unlimited), `queue_size`
    /// waiters and `queue_timeout` per waiter.
    pub fn new(limit: usize, queue_size: usize, queue_timeout: Duration) -> Self {
        let permits = limit.min(Semaphore::MAX_PERMITS);
        Self {
            limit,
            queue_size,
            queue_timeout,
            slots: Arc::new(Semaphore::new(permits)),
            waiting: AtomicUsize::new(0),
        }
    }

    /// The gate described by the configuration.
    pub fn from_config(config: &crate::config::AdmissionConfig) -> Self {
        Self::new(
            config.max_concurrent_requests,
            config.queue_size,
            config.queue_timeout(),
        )
    }

    /// Whether admission is on.
    pub fn enabled(&self) -> bool {
        self.limit > 0
    }

    /// Requests waiting for a slot now.
    pub fn waiting(&self) -> usize {
        self.waiting.load(Ordering::Acquire)
    }

    /// Requests holding a slot now (0 when admission is off).
    pub fn in_flight(&self) -> usize {
        if self.enabled() {
            self.limit.saturating_sub(self.slots.available_permits())
        } else {
            0
        }
    }

    /// Admits one request: `Ok(None)` when admission is off, `Ok(Some)`
    /// with a slot, or why not.
    pub async fn admit(&self) -> Result<Option<Permit>, Rejection> {
        if !self.enabled() {
            return Ok(None);
        }
        if let Ok(permit) = self.slots.clone().try_acquire_owned() {
            return Ok(Some(Permit { _permit: permit }));
        }
        let queued = self
            .waiting
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.queue_size).then_some(n + 1)
            });
        if queued.is_err() {
            return Err(Rejection::QueueFull);
        }
        let _waiting = Waiting(&self.waiting);
        match tokio::time::timeout(self.queue_timeout, self.slots.clone().acquire_owned()).await {
            Ok(Ok(permit)) => Ok(Some(Permit { _permit: permit })),
            // The semaphore is never closed; treat it like a timeout anyway.
            Ok(Err(_)) | Err(_) => Err(Rejection::QueueTimeout),
        }
    }

    /// The client-facing answer for `rejection`.
    pub fn response(&self, rejection: Rejection) -> Response {
        reject_response(rejection.error(self.limit, self.queue_size, self.queue_timeout))
    }
}

/// `Some(503)` when every available worker of `workers` has at least `cap`
/// requests in flight in `fleet`'s view; `None` when `cap` is 0, nothing is
/// available (the proxy explains that itself) or a worker has room.
pub fn fleet_saturated(
    cap: u64,
    workers: &[Arc<Worker>],
    fleet: &dyn FleetView,
) -> Option<ApiError> {
    if cap == 0 {
        return None;
    }
    let now = fleet.moment(std::time::Instant::now());
    let mut available = workers.iter().filter(|w| w.is_available()).peekable();
    available.peek()?;
    if available.all(|w| fleet.load(w, &now).counts.requests >= cap) {
        return Some(ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: format!(
                "every available worker has {cap} or more requests in flight across the fleet \
                 (--worker-max-inflight); retry later"
            ),
            kind: "service_unavailable",
            code: "fleet_saturated",
        });
    }
    None
}

/// What an admitted request holds while its response body lives: its
/// overload [`Permit`] and its tenant's ticket (one of its tenant's
/// requests in flight).
#[derive(Debug, Default)]
pub struct Held {
    /// The overload permit, when `--max-concurrent-requests` is on.
    pub permit: Option<Permit>,
    /// The tenant's ticket, when the request is a tenant's.
    pub ticket: Option<crate::tenants::TenantTicket>,
}

/// A response body that holds what admission granted ([`Held`]) until it
/// ends or is dropped, so a stream occupies its slot for its whole life.
/// A tenant's ticket also reads the answer going by, and settles the
/// tenant's charge from the engine's usage when the answer ends whole.
pub struct AdmittedBody {
    inner: Body,
    held: Option<Held>,
}

impl AdmittedBody {
    /// Attaches `held` to `response`'s body (the response unchanged when
    /// nothing is held).
    pub fn wrap(response: Response, held: Held) -> Response {
        if held.permit.is_none() && held.ticket.is_none() {
            return response;
        }
        let (parts, inner) = response.into_parts();
        Response::from_parts(
            parts,
            Body::new(Self {
                inner,
                held: Some(held),
            }),
        )
    }
}

impl http_body::Body for AdmittedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, axum::Error>>> {
        let this = self.get_mut();
        let polled = Pin::new(&mut this.inner).poll_frame(cx);
        // hyper stops polling once the body says it ended with its last
        // data frame, so the end is that frame or `None`, whichever comes.
        let ended = match &polled {
            Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
            Poll::Ready(None) => true,
            _ => false,
        };
        if let Some(ticket) = this.held.as_mut().and_then(|h| h.ticket.as_mut()) {
            if let Poll::Ready(Some(Ok(frame))) = &polled
                && let Some(data) = frame.data_ref()
            {
                ticket.observe(data);
            }
            if ended {
                ticket.settle();
            }
        }
        if ended || matches!(polled, Poll::Ready(Some(Err(_)))) {
            this.held = None;
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests;
