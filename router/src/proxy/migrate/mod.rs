//! Stream migration: when an engine's connection breaks in the middle of
//! a streamed completion, continue the generation on another engine and
//! splice it into the client's stream (`--migration-limit`).
//!
//! The client sees one well-formed stream: whole events only (`Framer`),
//! the first stream's `id`, one role delta, one `[DONE]`, usage summed
//! (`splice`). The continuation is the original request with the text
//! generated so far appended and its token limits reduced
//! (`continuation`); what the stream had shown is kept as escaped text and
//! counts (`transcript`), so a stream that never fails pays for a few
//! byte scans per event and nothing else.
//!
//! Only a transport failure of the engine's body is migrated (the engine
//! died, was restarted, or its connection broke); an engine's own error
//! event, a clean end and the request deadline pass through as before.

mod continuation;
mod splice;
mod token_ids;
mod transcript;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Method, StatusCode};
use http_body::{Body, Frame, SizeHint};
use serde_json::{Value, json};

use super::body::BoxError;
use super::{Forwarder, Outcome, Outgoing, Placement, TrackedBody, WorkerPool};
use crate::engine_h1::{self, EngineBody};
use crate::fleet::FleetView;
use crate::policy::Policy;
use crate::request::{RequestInfo, tokens_for_chars};
use crate::telemetry::{self, RequestRecord};
use crate::workers::{OwnedPoolSide, Registry, SlotBooking, Worker};

pub use transcript::StreamKind;

/// The migration flags the proxy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MigrationConfig {
    /// Continuations one stream may start (0: migration off).
    pub limit: u32,
    /// Largest generated text (JSON-escaped bytes) a stream keeps to be
    /// continued; a longer stream is no longer migratable.
    pub max_text_bytes: usize,
}

/// The replica's workers and how to choose among them, owned: a migrated
/// stream outlives the handler that borrowed them.
#[derive(Clone)]
pub struct SharedPool {
    /// Every registered worker.
    pub registry: Arc<Registry>,
    /// Chooses the worker that continues.
    pub policy: Arc<dyn Policy>,
    /// The load the policy reads.
    pub fleet: Arc<dyn FleetView>,
    /// In a disaggregated fleet, the pool continuations go to.
    pub side: Option<OwnedPoolSide>,
}

impl std::fmt::Debug for SharedPool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedPool")
            .field("policy", &self.policy.name())
            .finish_non_exhaustive()
    }
}

impl SharedPool {
    fn borrow(&self) -> WorkerPool<'_> {
        WorkerPool {
            registry: &self.registry,
            policy: self.policy.as_ref(),
            fleet: self.fleet.as_ref(),
            side: self.side.as_ref().map(OwnedPoolSide::borrow),
        }
    }
}

/// What makes a request's stream migratable: set by the front for a
/// streamed chat or completions request when migration is on.
#[derive(Debug, Clone)]
pub struct Migratable {
    /// Which stream it is.
    pub kind: StreamKind,
    /// Where a continuation may go.
    pub pool: SharedPool,
}

/// What `Authorization` a continuation sends, owned.
#[derive(Debug)]
enum OwnedAuthorization {
    Forward,
    Drop,
    Set(HeaderValue),
}

impl OwnedAuthorization {
    fn of(a: engine_h1::Authorization<'_>) -> Self {
        match a {
            engine_h1::Authorization::Forward => Self::Forward,
            engine_h1::Authorization::Drop => Self::Drop,
            engine_h1::Authorization::Set(v) => Self::Set(v.clone()),
        }
    }

    fn borrow(&self) -> engine_h1::Authorization<'_> {
        match self {
            Self::Forward => engine_h1::Authorization::Forward,
            Self::Drop => engine_h1::Authorization::Drop,
            Self::Set(v) => engine_h1::Authorization::Set(v),
        }
    }
}

/// Everything a continuation is sent with, kept by a migratable stream.
#[derive(Debug)]
pub(super) struct Resume {
    forwarder: Forwarder,
    migratable: Migratable,
    method: Method,
    headers: HeaderMap,
    authorization: OwnedAuthorization,
    traceparent: Option<HeaderValue>,
    path_and_query: String,
    /// The body the engine was sent.
    body: Bytes,
    info: RequestInfo,
    route: &'static str,
}

impl Resume {
    /// What `request` needs to be continued by `forwarder`'s client.
    pub(super) fn of(
        forwarder: &Forwarder,
        request: &Outgoing<'_>,
        migratable: Migratable,
        route: &'static str,
    ) -> Self {
        Self {
            forwarder: forwarder.clone(),
            migratable,
            method: request.method.clone(),
            headers: request.headers.clone(),
            authorization: OwnedAuthorization::of(request.authorization),
            traceparent: request.traceparent.cloned(),
            path_and_query: request.path_and_query.to_string(),
            body: request.body.clone(),
            info: request.info.clone(),
            route,
        }
    }
}

/// Whether `headers` announce a stream of server-sent events.
pub fn is_event_stream(headers: &HeaderMap) -> bool {
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim_start().starts_with("text/event-stream"))
}

/// A continuation that answered: its stream and the worker it runs on.
struct Leg {
    response: http::Response<EngineBody>,
    booking: SlotBooking,
    worker: Arc<Worker>,
}

/// Sending a continuation: the leg that answered, or nothing when every
/// allowed attempt failed (with the attempts used either way).
type Reissue = Pin<Box<dyn Future<Output = (Option<Leg>, u32)> + Send>>;

/// Sends `body` to workers not in `tried` (while any is left) until one
/// answers with a stream, at most `attempts` times.
async fn reissue(
    resume: Arc<Resume>,
    body: Bytes,
    info: RequestInfo,
    mut tried: Vec<Arc<Worker>>,
    attempts: u32,
    deadline: tokio::time::Instant,
) -> (Option<Leg>, u32) {
    let pool = resume.migratable.pool.borrow();
    for attempt in 0..attempts {
        let Ok(candidates) = pool.candidates(info.model.as_deref(), &tried) else {
            return (None, attempt);
        };
        let Ok(worker) = pool.pick(&candidates, &info) else {
            return (None, attempt);
        };
        tried.push(worker.clone());
        let outgoing = Outgoing {
            method: &resume.method,
            headers: &resume.headers,
            authorization: resume.authorization.borrow(),
            traceparent: resume.traceparent.as_ref(),
            path_and_query: &resume.path_and_query,
            body: body.clone(),
            info: &info,
            placement: Placement::Any,
            learn: None,
            migratable: None,
        };
        let token_work = pool.policy.token_work(&info);
        let outcome = resume
            .forwarder
            .attempt(worker, &outgoing, token_work, attempt, deadline)
            .await;
        match outcome {
            Outcome::Answered(answer)
                if answer.response.status() == StatusCode::OK
                    && is_event_stream(answer.response.headers()) =>
            {
                return (
                    Some(Leg {
                        response: answer.response,
                        booking: answer.booking,
                        worker: answer.worker,
                    }),
                    attempt + 1,
                );
            }
            Outcome::Answered(answer) => {
                let status = answer.response.status();
                tracing::warn!(worker = answer.worker.url(), %status, "continuation refused by the worker");
                let booking = answer.discard();
                resume
                    .forwarder
                    .retry
                    .release_and_sleep(booking, attempt, deadline)
                    .await;
            }
            Outcome::Failed(booking, _) => {
                resume
                    .forwarder
                    .retry
                    .release_and_sleep(booking, attempt, deadline)
                    .await;
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return (None, attempt + 1);
        }
    }
    (None, attempts)
}

/// Where a migratable stream is.
// One per stream, held in place: boxing the stream would cost an
// allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum State {
    /// Passing on a worker's stream.
    Streaming(TrackedBody),
    /// Waiting for a continuation to answer.
    Reissuing(Reissue),
    /// Finished: `None` from now on.
    Done,
}

/// What a failed leg leads to.
enum Next {
    /// Send a continuation.
    Reissue(Reissue),
    /// End the stream with these bytes (nothing was left to generate).
    End(Bytes),
    /// Pass the failure to the client.
    Fail,
}

/// A client's stream that survives its engine's death.
pub struct MigratingBody {
    state: State,
    framer: transcript::Framer,
    transcript: transcript::Transcript,
    /// The current continuation's rewriting (none for the first leg).
    splicer: Option<splice::Splicer>,
    resume: Arc<Resume>,
    /// Workers this stream ran on.
    tried: Vec<Arc<Worker>>,
    /// Continuation attempts left.
    left: u32,
    deadline: tokio::time::Instant,
    /// Bytes to send before anything else.
    queued: Option<Bytes>,
    /// The failure to report if the stream cannot be continued.
    failure: Option<BoxError>,
    /// Output tokens and first event of the stream so far, for the next
    /// continuation's splicer.
    resumed_from: Option<(Value, u64)>,
    record: Option<RequestRecord>,
    saw_data: bool,
}

impl MigratingBody {
    /// Wraps the first worker's stream.
    pub(super) fn new(
        first: TrackedBody,
        worker: Arc<Worker>,
        resume: Resume,
        limit: u32,
        max_text_bytes: usize,
        deadline: tokio::time::Instant,
        record: RequestRecord,
    ) -> Self {
        let kind = resume.migratable.kind;
        Self {
            state: State::Streaming(first),
            framer: transcript::Framer::default(),
            transcript: transcript::Transcript::new(kind, max_text_bytes),
            splicer: None,
            resume: Arc::new(resume),
            tried: vec![worker],
            left: limit,
            deadline,
            queued: None,
            failure: None,
            resumed_from: None,
            record: Some(record),
            saw_data: false,
        }
    }

    /// What the client gets of `data`: whole events, in the first
    /// stream's form.
    fn take(&mut self, data: Bytes) -> Bytes {
        let mut events = self.framer.push(data);
        if let Some(splicer) = &self.splicer {
            events = splicer.rewrite(&events);
        }
        self.transcript.note(&events);
        events
    }

    /// Decides what follows a failed leg.
    fn next(&mut self) -> Next {
        let route = self.resume.route;
        if tokio::time::Instant::now() >= self.deadline {
            return Next::Fail;
        }
        // Whatever the dead leg left half-sent never reached the client.
        drop(self.framer.rest());
        let point = match self.transcript.resume_point() {
            Ok(point) => point,
            Err(reason) => {
                tracing::info!(route, reason, "stream not migrated");
                telemetry::migration(route, "ineligible");
                return Next::Fail;
            }
        };
        if point.done {
            return Next::End(Bytes::new());
        }
        if point.finished {
            telemetry::migration(route, "completed");
            return Next::End(Bytes::from_static(b"data: [DONE]\n\n"));
        }
        if self.left == 0 {
            telemetry::migration(route, "exhausted");
            return Next::Fail;
        }
        let kind = self.resume.migratable.kind;
        let continuation = match continuation::continuation(kind, &self.resume.body, &point) {
            Ok(c) => c,
            Err(reason) => {
                tracing::info!(route, reason, "stream not migrated");
                telemetry::migration(route, "ineligible");
                return Next::Fail;
            }
        };
        if continuation.remaining == Some(0) {
            telemetry::migration(route, "completed");
            return Next::End(finish_events(kind, point.first.as_ref()));
        }
        let mut info = self.resume.info.clone();
        let replayed = tokens_for_chars(point.text.chars().count() as u64);
        info.prompt_tokens = info.prompt_tokens.saturating_add(replayed);
        info.max_output_tokens = continuation.remaining;
        self.resumed_from = point.first.map(|first| (first, point.tokens));
        let future = reissue(
            self.resume.clone(),
            continuation.body,
            info,
            self.tried.clone(),
            self.left,
            self.deadline,
        );
        Next::Reissue(Box::pin(future))
    }

    /// Starts passing on `leg`, the continuation that answered.
    fn continue_on(&mut self, leg: Leg) {
        let route = self.resume.route;
        telemetry::migration(route, "resumed");
        let from = self.tried.first().map(|w| w.url().to_string());
        let tokens = self.resumed_from.as_ref().map_or(0, |(_, t)| *t);
        tracing::info!(route, to = leg.worker.url(), tokens, "stream migrated");
        if let Some(span) = self.record.as_ref().and_then(RequestRecord::span) {
            tracing::info!(parent: span, from = from.as_deref(), to = leg.worker.url(), tokens, "shoal.migration");
        }
        self.splicer = self
            .resumed_from
            .as_ref()
            .map(|(first, tokens)| splice::Splicer::new(first, *tokens));
        self.tried.push(leg.worker.clone());
        let body = TrackedBody::new(
            leg.response.into_body(),
            leg.booking,
            leg.worker,
            self.deadline,
            None,
        );
        self.state = State::Streaming(body);
    }

    /// Ends the request: counted now, once.
    fn end(&mut self) {
        self.state = State::Done;
        drop(self.record.take());
    }
}

/// The events that end a stream with nothing left to generate: a finish
/// chunk in the first event's form, then `[DONE]`.
fn finish_events(kind: StreamKind, first: Option<&Value>) -> Bytes {
    let field = |key| {
        first
            .and_then(|f| f.get(key))
            .cloned()
            .unwrap_or(Value::Null)
    };
    let choice = match kind {
        StreamKind::Chat => {
            json!({"index": 0, "delta": {}, "logprobs": null, "finish_reason": "length"})
        }
        StreamKind::Completion => {
            json!({"index": 0, "text": "", "logprobs": null, "finish_reason": "length"})
        }
    };
    let chunk = json!({
        "id": field("id"), "object": field("object"), "created": field("created"),
        "model": field("model"), "choices": [choice],
    });
    Bytes::from(format!("data: {chunk}\n\ndata: [DONE]\n\n"))
}

impl Body for MigratingBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        loop {
            if let Some(bytes) = this.queued.take() {
                return Poll::Ready(Some(Ok(Frame::data(bytes))));
            }
            match &mut this.state {
                State::Done => return Poll::Ready(None),
                State::Reissuing(future) => match future.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready((Some(leg), used)) => {
                        this.left = this.left.saturating_sub(used);
                        this.continue_on(leg);
                    }
                    Poll::Ready((None, _)) => {
                        telemetry::migration(this.resume.route, "failed");
                        let failure = this.failure.take();
                        this.end();
                        return Poll::Ready(failure.map(Err));
                    }
                },
                State::Streaming(leg) => match Pin::new(&mut *leg).poll_frame(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(None) => {
                        let rest = this.framer.rest();
                        this.end();
                        if !rest.is_empty() {
                            return Poll::Ready(Some(Ok(Frame::data(rest))));
                        }
                        return Poll::Ready(None);
                    }
                    Poll::Ready(Some(Ok(frame))) => {
                        let last = leg.is_end_stream();
                        let data = match frame.into_data() {
                            Ok(data) => data,
                            Err(frame) => return Poll::Ready(Some(Ok(frame))),
                        };
                        let mut out = this.take(data);
                        if last {
                            // Ended with its last frame, as an unmigrated
                            // body is: the client's stream ends in the
                            // same write, not after another poll.
                            let rest = this.framer.rest();
                            if !rest.is_empty() {
                                out = [out, rest].concat().into();
                            }
                        }
                        if !out.is_empty() && !this.saw_data {
                            this.saw_data = true;
                            if let Some(record) = &this.record {
                                record.first_token();
                            }
                        }
                        if last {
                            this.end();
                        }
                        if out.is_empty() {
                            continue;
                        }
                        return Poll::Ready(Some(Ok(Frame::data(out))));
                    }
                    Poll::Ready(Some(Err(err))) => {
                        this.failure = Some(err);
                        match this.next() {
                            Next::Reissue(future) => this.state = State::Reissuing(future),
                            Next::End(bytes) => {
                                this.end();
                                this.failure = None;
                                if !bytes.is_empty() {
                                    this.queued = Some(bytes);
                                }
                            }
                            Next::Fail => {
                                let failure = this.failure.take();
                                this.end();
                                return Poll::Ready(failure.map(Err));
                            }
                        }
                    }
                },
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        matches!(self.state, State::Done) && self.queued.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}
