//! Overload admission: at most `--max-concurrent-requests` inference
//! requests are proxied at once by this replica; up to `--queue-size` more
//! wait for a freed slot, served by class (critical, standard, sheddable)
//! and within a class by weighted fair share of token-work between flows
//! (tenants; [`fair_queue`]), each for at most its class's queue timeout.
//!
//! A request that finds the queue full gets 429 at once (a critical or
//! standard one first takes a waiting sheddable request's place, which
//! gets 429 `shed`); one whose wait times out gets 503. All carry
//! `Retry-After` and OpenAI's error shape, so clients back off instead of
//! piling up on timeouts. A permit is held until the response body ends
//! (streaming included) or the client goes away, so the limit counts
//! streams, not just handler calls.
//!
//! `--max-concurrent-requests 0` (the default) turns the gate off: the
//! router cannot know what its engines can hold, and a guessed limit would
//! reject traffic the fleet could serve. The limit is per replica.
//!
//! `--worker-max-inflight N` (0 = off) is the fleet-aware guard: when every
//! available worker already has N requests in flight in this replica's
//! fleet view (fleet-wide with the mesh), the request gets 503 with
//! `Retry-After` at once instead of queueing at a full engine. It is a soft
//! cap: replicas that decide at the same instant can each admit one more.
//! `--sheddable-max-inflight M` is the same guard for sheddable requests
//! at a lower mark (429 `shed`), so the room between M and N stays for
//! critical and standard traffic whichever replica it arrives at.

pub mod buffer;
pub mod class;
pub mod fair_queue;
mod gate;

use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderValue, StatusCode, header};
use http_body::{Frame, SizeHint};

use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::tenants::stream_usage::UsageChunkFilter;
use crate::workers::Worker;
pub use class::{Ask, Priority};
pub use gate::{Admission, ClassTimeouts, Permit};

/// Seconds a rejected client is told to wait before retrying.
pub const RETRY_AFTER_SECS: u64 = 1;

/// Why a request was not admitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// Every slot is busy and the wait queue is full: 429.
    QueueFull,
    /// The request waited its class's queue timeout without a slot: 503.
    QueueTimeout,
    /// A sheddable request gave way to a higher class (its place in the
    /// queue, or the fleet's last capacity): 429.
    Shed,
}

impl Rejection {
    /// Metric label.
    pub fn label(self) -> &'static str {
        match self {
            Self::QueueFull => "queue_full",
            Self::QueueTimeout => "queue_timeout",
            Self::Shed => "shed",
        }
    }

    /// The OpenAI-shaped answer, with `Retry-After`.
    pub fn error(self, limit: usize, queue: usize) -> ApiError {
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
                message: "router overloaded: no request slot freed within the request's \
                          queue timeout (--queue-timeout-secs and its per-class variants); \
                          retry later"
                    .to_owned(),
                kind: "service_unavailable",
                code: "queue_timeout",
            },
            Self::Shed => shed_error("higher-priority requests took its place in the queue"),
        }
    }
}

/// The 429 of a sheddable request refused so higher classes keep room:
/// `why` says what it gave way to.
pub fn shed_error(why: &str) -> ApiError {
    ApiError {
        status: StatusCode::TOO_MANY_REQUESTS,
        message: format!("sheddable request shed: {why}; retry later"),
        kind: "rate_limit_error",
        code: "shed",
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

/// Whether every available worker of `workers` has at least `cap`
/// requests in flight in `fleet`'s view (false when `cap` is 0 or nothing
/// is available: the proxy explains that itself).
fn every_worker_at(cap: u64, workers: &[Arc<Worker>], fleet: &dyn FleetView) -> bool {
    if cap == 0 {
        return false;
    }
    let now = fleet.moment(std::time::Instant::now());
    let mut available = workers.iter().filter(|w| w.is_available()).peekable();
    if available.peek().is_none() {
        return false;
    }
    available.all(|w| fleet.load(w, &now).counts.requests >= cap)
}

/// `Some(503)` when every available worker of `workers` has at least `cap`
/// requests in flight in `fleet`'s view (`--worker-max-inflight`).
pub fn fleet_saturated(
    cap: u64,
    workers: &[Arc<Worker>],
    fleet: &dyn FleetView,
) -> Option<ApiError> {
    every_worker_at(cap, workers, fleet).then(|| ApiError {
        status: StatusCode::SERVICE_UNAVAILABLE,
        message: format!(
            "every available worker has {cap} or more requests in flight across the fleet \
             (--worker-max-inflight); retry later"
        ),
        kind: "service_unavailable",
        code: "fleet_saturated",
    })
}

/// `Some(429 shed)` for a sheddable request when every available worker
/// has at least `cap` requests in flight fleet-wide
/// (`--sheddable-max-inflight`).
pub fn shed_at(cap: u64, workers: &[Arc<Worker>], fleet: &dyn FleetView) -> Option<ApiError> {
    every_worker_at(cap, workers, fleet).then(|| {
        shed_error(&format!(
            "every available worker has {cap} or more requests in flight across the fleet \
             (--sheddable-max-inflight)"
        ))
    })
}

/// What an admitted request holds while its response body lives: its
/// overload [`Permit`], its tenant's ticket (one of its tenant's requests
/// in flight) and, when Shoal asked the engine for a stream's usage on the
/// client's behalf, the filter that hides that usage chunk again.
#[derive(Debug, Default)]
pub struct Held {
    /// The overload permit, when `--max-concurrent-requests` is on.
    pub permit: Option<Permit>,
    /// The tenant's ticket, when the request is a tenant's.
    pub ticket: Option<crate::tenants::TenantTicket>,
    /// Strips the usage-only chunk the client did not ask for.
    pub strip: Option<UsageChunkFilter>,
}

/// A response body that holds what admission granted ([`Held`]) until it
/// ends or is dropped, so a stream occupies its slot for its whole life.
/// A tenant's ticket also reads the answer going by (before any
/// stripping: it needs the engine's usage), and settles the tenant's
/// charge from it when the answer ends whole.
pub struct AdmittedBody {
    inner: Body,
    held: Option<Held>,
    /// The body ended, but the filter still had bytes to give: they went
    /// out, and nothing more will.
    drained: bool,
}

impl AdmittedBody {
    /// Attaches `held` to `response`'s body (the response unchanged when
    /// nothing is held).
    pub fn wrap(response: Response, held: Held) -> Response {
        if held.permit.is_none() && held.ticket.is_none() && held.strip.is_none() {
            return response;
        }
        let (parts, inner) = response.into_parts();
        Response::from_parts(
            parts,
            Body::new(Self {
                inner,
                held: Some(held),
                drained: false,
            }),
        )
    }

    /// Passes `polled` through the usage filter, if there is one: the
    /// bytes to send now, `None` when a frame was swallowed whole and the
    /// next must be polled.
    fn strip(&mut self, polled: Polled, ended: bool) -> Option<Polled> {
        let Some(filter) = self.held.as_mut().and_then(|h| h.strip.as_mut()) else {
            return Some(polled);
        };
        match polled {
            Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                Ok(data) => {
                    let mut out = filter.push(data);
                    if ended {
                        out = join(out, filter.finish());
                    }
                    match (out.is_empty(), ended) {
                        (false, _) => Some(Poll::Ready(Some(Ok(Frame::data(out))))),
                        (true, true) => Some(Poll::Ready(None)),
                        (true, false) => None,
                    }
                }
                Err(trailers) => Some(Poll::Ready(Some(Ok(trailers)))),
            },
            Poll::Ready(None) => {
                let rest = filter.finish();
                if rest.is_empty() {
                    Some(Poll::Ready(None))
                } else {
                    self.drained = true;
                    Some(Poll::Ready(Some(Ok(Frame::data(rest)))))
                }
            }
            other => Some(other),
        }
    }
}

/// What polling a response body gives.
type Polled = Poll<Option<Result<Frame<Bytes>, axum::Error>>>;

/// `a` then `b`, copying only when both hold bytes.
fn join(a: Bytes, b: Bytes) -> Bytes {
    match (a.is_empty(), b.is_empty()) {
        (_, true) => a,
        (true, false) => b,
        (false, false) => [a, b].concat().into(),
    }
}

impl http_body::Body for AdmittedBody {
    type Data = Bytes;
    type Error = axum::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Polled {
        let this = self.get_mut();
        if this.drained {
            return Poll::Ready(None);
        }
        loop {
            let polled = Pin::new(&mut this.inner).poll_frame(cx);
            // hyper stops polling once the body says it ended with its last
            // data frame, so the end is that frame or `None`, whichever comes.
            let ended = match &polled {
                Poll::Ready(Some(Ok(_))) => this.inner.is_end_stream(),
                Poll::Ready(None) => true,
                _ => false,
            };
            let failed = matches!(polled, Poll::Ready(Some(Err(_))));
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
            let Some(out) = this.strip(polled, ended) else {
                continue;
            };
            if ended || failed {
                this.held = None;
            }
            return out;
        }
    }

    fn is_end_stream(&self) -> bool {
        self.drained || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        match self.held.as_ref().and_then(|h| h.strip.as_ref()) {
            // Stripping changes the length.
            Some(_) => SizeHint::default(),
            None => self.inner.size_hint(),
        }
    }
}

#[cfg(test)]
mod tests;
