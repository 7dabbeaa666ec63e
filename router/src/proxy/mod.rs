//! Forwarding one request: select, book, send, retry, stream back.
//!
//! A failed attempt is retried on a re-selected worker only where the
//! retry rule (`retry_rule`) says the engine provably did not start the
//! work, or the method is idempotent: a connect failure or a request not
//! written whole, and 429/503, for any method; a connection lost after
//! the whole request was written, no answer head within the attempt
//! deadline, and 408/500/502/504, only for idempotent methods — a `POST`
//! is never run twice. Retries happen only while nothing has been sent to
//! the client, so a retry can never duplicate or splice a response. The
//! last worker's answer passes through once retries are used up or not
//! allowed; if none answered, the client gets 502 or 504 with the reason
//! (and, when the rule withheld a retry, why).
//!
//! The request path, step by step ([`Forwarder::forward`]):
//! 1. *candidates*: the available workers, those not tried yet first;
//! 2. *pick*: the policy chooses one of them;
//! 3. *attempt*: book the worker, send, classify the answer
//!    (`Outcome`); a retryable outcome releases the booking, backs off and
//!    goes back to 1;
//! 4. *deliver* the answer as a [`TrackedBody`] stream, or *give up* with
//!    the final 502/504/503.
//!
//! The proxy knows nothing of the HTTP front: it owns its client and knobs
//! ([`Forwarder`]) and borrows the workers to choose from ([`WorkerPool`]).

mod body;
pub mod disagg;
mod locate;
mod migrate;
mod retry;

use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use http::{HeaderMap, Method};

use crate::config::RetryConfig;
use crate::engine_h1::{self, EngineBody};
use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::objects::{self, LearnId};
use crate::policy::Policy;
use crate::request::RequestInfo;
use crate::retry_rule::{self, Progress, Verdict};
use crate::telemetry::{self, RequestRecord};
use crate::upstream;
use crate::workers::{ModelNotFound, PoolSide, Registry, SlotBooking, Worker};

pub use body::TrackedBody;
pub use disagg::Disagg;
pub use locate::{Learn, Located, Placement};
pub use migrate::{
    Migratable, MigratingBody, MigrationConfig, SharedPool, StreamKind, is_event_stream,
};

/// Explains an empty candidate set to the client.
fn no_workers_reason(workers: &[Arc<Worker>]) -> String {
    if workers.is_empty() {
        return "no workers are registered (pass --worker-urls or POST /workers)".into();
    }
    let unhealthy = workers.iter().filter(|w| !w.is_healthy()).count();
    let open = workers
        .iter()
        .filter(|w| w.is_healthy() && !w.breaker().allows())
        .count();
    format!(
        "no healthy worker available: {} registered, {unhealthy} failing health checks, {open} with an open circuit",
        workers.len()
    )
}

/// Forwards inference requests to workers: the proxy's own client and
/// knobs, built once per replica and owned by its state.
///
/// Why a type: forwarding needs only these, not the replica's whole state,
/// so the proxy depends on nothing of the HTTP front.
#[derive(Debug, Clone)]
pub struct Forwarder {
    /// How connections to workers are opened (deadline, TLS); they are
    /// pooled per thread by [`engine_h1`].
    pub connector: engine_h1::Connector,
    /// Backoff between attempts.
    pub retry: RetryConfig,
    /// Retries allowed after the first attempt (0 when retries are off).
    pub max_retries: u32,
    /// Whole-request deadline, counted from the request's arrival.
    pub request_timeout: Duration,
    /// Deadline for one attempt's response headers (`None`: only the
    /// whole-request deadline).
    pub attempt_timeout: Option<Duration>,
    /// Name the answering worker in an `x-shoal-worker` response header.
    pub expose_worker: bool,
    /// Continuing broken streams on another worker (`migrate`).
    pub migration: MigrationConfig,
}

/// The workers one request may go to and how to choose among them,
/// borrowed from the replica for the duration of the request.
///
/// Why a separate borrow: selection reads the registry, the policy and the
/// fleet view, which the replica owns and shares with other parts.
#[derive(Debug, Clone, Copy)]
pub struct WorkerPool<'a> {
    /// Every registered worker.
    pub registry: &'a Registry,
    /// Chooses among the candidates and prices the booking.
    pub policy: &'a dyn Policy,
    /// The load the policy reads.
    pub fleet: &'a dyn FleetView,
    /// In a disaggregated fleet, the pool the request may use (`None`:
    /// every worker).
    pub side: Option<PoolSide<'a>>,
}

/// One inference request ready to forward: its body read and inspected.
///
/// Why borrowed parts: the handler keeps the incoming request; every
/// attempt re-sends the same (cheaply cloned) body.
#[derive(Debug)]
pub struct Outgoing<'a> {
    /// The client's method, forwarded as it came.
    pub method: &'a Method,
    /// The client's headers (hop-by-hop ones are dropped when sent).
    pub headers: &'a HeaderMap,
    /// What `Authorization` the engine gets.
    pub authorization: engine_h1::Authorization<'a>,
    /// The `traceparent` the engine gets instead of the client's (tracing on).
    pub traceparent: Option<&'a http::HeaderValue>,
    /// Path and query, appended to the worker's base URL.
    pub path_and_query: &'a str,
    /// The request body.
    pub body: Bytes,
    /// What the policy and the booking read about the request.
    pub info: &'a RequestInfo,
    /// Which workers it may go to (a stored object pins it to one).
    pub placement: Placement,
    /// Record where a stored object lives when the answer is a success.
    pub learn: Option<Learn<'a>>,
    /// A streamed chat or completions request whose stream may be
    /// continued elsewhere if its engine fails (migration on).
    pub migratable: Option<Migratable>,
}

/// Why an attempt got no response.
enum Failure {
    /// Connecting or talking to the worker failed: the reason, and how
    /// far the attempt got (what the retry rule reads).
    Transport(String, Progress),
    /// The worker sent no response headers within the attempt deadline
    /// (retried elsewhere for idempotent methods only): the worker.
    AttemptTimeout(String),
    /// The request deadline passed.
    Timeout,
}

impl Failure {
    /// What the retry rule decides for `method` (no time left after the
    /// request deadline: final).
    fn verdict(&self, method: &Method) -> Verdict {
        match self {
            Failure::Transport(_, progress) => retry_rule::verdict(method, *progress),
            Failure::AttemptTimeout(_) => retry_rule::verdict(method, Progress::NoHeadersInTime),
            Failure::Timeout => Verdict::Final,
        }
    }

    /// What happened, for an error message.
    fn describe(&self) -> String {
        match self {
            Failure::Transport(reason, _) => reason.clone(),
            Failure::AttemptTimeout(worker) => {
                format!("{worker} sent no response headers within --attempt-timeout-secs")
            }
            Failure::Timeout => "the request deadline (--request-timeout-secs) passed".into(),
        }
    }

    /// The retry-metric reason.
    fn reason(&self) -> &'static str {
        match self {
            Failure::Transport(..) => "transport",
            Failure::AttemptTimeout(_) => "attempt_timeout",
            Failure::Timeout => "timeout",
        }
    }
}

/// A worker's response headers, with the booking and worker it belongs to.
struct Answer {
    response: http::Response<EngineBody>,
    booking: SlotBooking,
    worker: Arc<Worker>,
    /// Attempts made, this one included.
    attempts: usize,
}

impl Answer {
    /// What the retry rule decides for this status and `method`.
    fn verdict(&self, method: &Method) -> Verdict {
        retry_rule::verdict(method, Progress::Answered(self.response.status()))
    }

    /// Discards the response (nothing of it reached the client) and keeps
    /// the booking, for [`RetryConfig::release_and_sleep`].
    fn discard(self) -> SlotBooking {
        let Self {
            response, booking, ..
        } = self;
        drop(response);
        booking
    }

    /// Passes the answer to the client as a stream that releases the
    /// booking and ends `record` when it ends; `resume` (a migratable
    /// request's) makes an event stream survive its engine's failure.
    fn deliver(
        self,
        mut record: RequestRecord,
        deadline: tokio::time::Instant,
        forwarder: &Forwarder,
        learn: Option<Learn<'_>>,
        resume: Option<migrate::Resume>,
    ) -> Response {
        record.first_byte();
        if let Some(span) = record.span() {
            span.record("shoal.worker", self.worker.url());
            span.record("shoal.attempts", self.attempts as u64);
        }
        // The engine client already dropped the hop-by-hop headers.
        let (mut parts, body) = self.response.into_parts();
        record.set_status(parts.status.as_u16());
        if forwarder.expose_worker
            && let Ok(url) = http::HeaderValue::from_str(self.worker.url())
        {
            parts.headers.insert("x-shoal-worker", url);
        }
        let learn = learn.filter(|_| parts.status.is_success());
        let worker_url = self.worker.clone();
        let resume = resume
            .filter(|_| parts.status == http::StatusCode::OK && is_event_stream(&parts.headers));
        if let Some(resume) = resume {
            // A continuation's events are rewritten: the length changes.
            parts.headers.remove(http::header::CONTENT_LENGTH);
            let first = TrackedBody::new(body, self.booking, self.worker.clone(), deadline, None);
            let migration = forwarder.migration;
            let body = MigratingBody::new(
                first,
                self.worker,
                resume,
                migration.limit,
                migration.max_text_bytes,
                deadline,
                record,
            );
            return Response::from_parts(parts, Body::new(body));
        }
        let tracked = TrackedBody::new(body, self.booking, self.worker, deadline, Some(record));
        let body = match learn {
            None => Body::new(tracked),
            Some(Learn {
                table,
                id: Some(id),
            }) => {
                table.learn(id, worker_url.url());
                Body::new(tracked)
            }
            Some(Learn { table, id: None }) => {
                Body::new(LearnId::new(tracked, table.clone(), worker_url.url()))
            }
        };
        Response::from_parts(parts, body)
    }
}

/// How one attempt ended.
// A short-lived value on the request's stack: boxing the answer would cost
// an allocation per request for nothing.
#[allow(clippy::large_enum_variant)]
enum Outcome {
    /// The worker answered (any status).
    Answered(Answer),
    /// No response: the booking to release and why.
    Failed(SlotBooking, Failure),
}

/// Nothing to choose from: the registered workers, to explain why.
struct NoCandidates(Arc<Vec<Arc<Worker>>>);

impl NoCandidates {
    fn into_error(self) -> ApiError {
        ApiError::no_workers(no_workers_reason(&self.0))
    }
}

/// The workers one attempt may choose from.
///
/// Why two forms: on the common path (first attempt, every worker up) the
/// registry's own list is the candidate list, shared, not copied: copying
/// it would clone (and later drop) one `Arc` per worker per request, an
/// atomic write on a cache line every I/O thread shares.
enum Candidates {
    /// Every registered worker.
    All(Arc<Vec<Arc<Worker>>>),
    /// A filtered subset.
    Some(Vec<Arc<Worker>>),
}

impl std::ops::Deref for Candidates {
    type Target = [Arc<Worker>];

    fn deref(&self) -> &[Arc<Worker>] {
        match self {
            Self::All(all) => all,
            Self::Some(some) => some,
        }
    }
}

/// Why an attempt has no candidate.
enum Unroutable {
    /// Workers serve the model but none is available now.
    Unavailable(NoCandidates),
    /// No worker serves the model at all.
    Model(ModelNotFound),
}

impl WorkerPool<'_> {
    /// Whether `worker` is in the request's pool and available.
    fn usable(&self, worker: &Worker) -> bool {
        worker.is_available() && self.side.is_none_or(|side| side.admits(worker))
    }

    /// The available workers serving `model` (in the request's pool), only
    /// those not in `tried` while any is left.
    fn candidates(
        &self,
        model: Option<&str>,
        tried: &[Arc<Worker>],
    ) -> Result<Candidates, Unroutable> {
        let all = self.registry.serving(model).map_err(Unroutable::Model)?;
        if self.side.is_none()
            && tried.is_empty()
            && !all.is_empty()
            && all.iter().all(|w| w.is_available())
        {
            return Ok(Candidates::All(all));
        }
        let is_usable_untried =
            |w: &&Arc<Worker>| self.usable(w) && !tried.iter().any(|t| Arc::ptr_eq(t, w));
        // Prefer workers not tried yet; fall back to all usable ones.
        let mut candidates: Vec<Arc<Worker>> =
            all.iter().filter(is_usable_untried).cloned().collect();
        if candidates.is_empty() {
            candidates = all.iter().filter(|w| self.usable(w)).cloned().collect();
        }
        if candidates.is_empty() {
            return Err(Unroutable::Unavailable(NoCandidates(all)));
        }
        Ok(Candidates::Some(candidates))
    }

    /// The available workers serving `model` not in `tried` (locating an
    /// object asks each worker once).
    fn untried(
        &self,
        model: Option<&str>,
        tried: &[Arc<Worker>],
    ) -> Result<Candidates, Unroutable> {
        let all = self.registry.serving(model).map_err(Unroutable::Model)?;
        let untried: Vec<Arc<Worker>> = all
            .iter()
            .filter(|w| self.usable(w) && !tried.iter().any(|t| Arc::ptr_eq(t, w)))
            .cloned()
            .collect();
        match untried.is_empty() || tried.len() >= objects::MAX_LOCATE {
            true => Err(Unroutable::Unavailable(NoCandidates(all))),
            false => Ok(Candidates::Some(untried)),
        }
    }

    /// The workers `placement` allows for the next attempt.
    fn placed(
        &self,
        placement: &Placement,
        model: Option<&str>,
        tried: &[Arc<Worker>],
    ) -> Result<Candidates, Unroutable> {
        match placement {
            Placement::Any => self.candidates(model, tried),
            Placement::Locate => self.untried(model, tried),
            Placement::Holder(worker) if worker.is_available() => {
                Ok(Candidates::Some(vec![worker.clone()]))
            }
            Placement::Holder(worker) => {
                Err(Unroutable::Unavailable(NoCandidates(Arc::new(vec![
                    worker.clone(),
                ]))))
            }
        }
    }

    /// The policy's choice among `candidates`; a refusal is a 503.
    fn pick(
        &self,
        candidates: &[Arc<Worker>],
        info: &RequestInfo,
    ) -> Result<Arc<Worker>, ApiError> {
        self.policy
            .select(candidates, info, self.fleet)
            .and_then(|i| candidates.get(i).cloned())
            .ok_or_else(|| {
                ApiError::no_workers(format!("policy {} selected no worker", self.policy.name()))
            })
    }
}

impl Forwarder {
    /// Routes and proxies one inference request whose body was already
    /// read; `record` is the request's accounting, ended on every exit:
    /// by the streamed answer's end, or here with the error sent instead.
    pub async fn forward(
        &self,
        workers: WorkerPool<'_>,
        request: Outgoing<'_>,
        record: RequestRecord,
    ) -> Response {
        let deadline = self.deadline_of(&record);
        let routed = self
            .attempts(workers, &request, record.route(), deadline)
            .await;
        self.respond(routed, request, record, deadline)
    }

    /// The end of the request's time budget.
    fn deadline_of(&self, record: &RequestRecord) -> tokio::time::Instant {
        tokio::time::Instant::from_std(record.started()) + self.request_timeout
    }

    /// Sends the client `routed`: the answer as a stream (migratable when
    /// the request is and migration is on), or the error.
    fn respond(
        &self,
        routed: Result<Answer, ApiError>,
        request: Outgoing<'_>,
        record: RequestRecord,
        deadline: tokio::time::Instant,
    ) -> Response {
        match routed {
            Ok(answer) => {
                let resume = request
                    .migratable
                    .clone()
                    .filter(|_| self.migration.limit > 0 && request.learn.is_none())
                    .map(|m| migrate::Resume::of(self, &request, m, record.route()));
                answer.deliver(record, deadline, self, request.learn, resume)
            }
            Err(error) => record.respond(error.into_response()),
        }
    }

    /// Tries workers until one gives an answer to pass on, or gives up.
    ///
    /// A retry happens only before anything reached the client (nothing
    /// has: the answer is returned, not streamed, from here), goes to an
    /// untried worker first, and releases the failed booking before it
    /// backs off.
    async fn attempts(
        &self,
        workers: WorkerPool<'_>,
        request: &Outgoing<'_>,
        route: &'static str,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, ApiError> {
        let mut tried: Vec<Arc<Worker>> = Vec::new();
        let mut last_failure: Option<Failure> = None;
        // The method whose retry the rule withheld, to say so.
        let mut withheld: Option<&Method> = None;
        // Retries made; locating an object moves on after a 404 without one.
        let mut attempt: u32 = 0;
        loop {
            let model = request.info.model.as_deref();
            let candidates = match workers.placed(&request.placement, model, &tried) {
                Ok(candidates) => candidates,
                Err(Unroutable::Model(missing)) => {
                    return Err(ApiError::model_not_found(&missing.model, &missing.served));
                }
                // Nothing failed yet: explain why nothing is available.
                Err(Unroutable::Unavailable(none)) if last_failure.is_none() => {
                    return Err(none.into_error());
                }
                // Every worker failed: report the last failure.
                Err(Unroutable::Unavailable(_)) => break,
            };
            let worker = workers.pick(&candidates, request.info)?;
            tried.push(worker.clone());
            let has_retry_left =
                attempt < self.max_retries && tokio::time::Instant::now() < deadline;
            // A request that runs no model books a request slot only.
            let token_work = match request.info.runs_no_model {
                true => 0,
                false => workers.policy.token_work(request.info),
            };
            let method = request.method;
            match self
                .attempt(worker, request, token_work, attempt, deadline)
                .await
            {
                Outcome::Answered(answer)
                    if matches!(request.placement, Placement::Locate)
                        && answer.response.status() == http::StatusCode::NOT_FOUND
                        && workers.untried(model, &tried).is_ok() =>
                {
                    // Not this worker's object: ask the next one at once.
                    drop(answer.discard());
                }
                Outcome::Answered(answer) => match answer.verdict(method) {
                    Verdict::Retry if has_retry_left => {
                        let status = answer.response.status();
                        tracing::info!(worker = answer.worker.url(), attempt, %status, "retrying on another worker");
                        telemetry::retry(route, "status");
                        self.retry
                            .release_and_sleep(answer.discard(), attempt, deadline)
                            .await;
                        attempt += 1;
                    }
                    verdict => {
                        if verdict == Verdict::Unsafe && has_retry_left {
                            let status = answer.response.status();
                            tracing::info!(worker = answer.worker.url(), %method, %status, "not retried: the request may have run");
                            telemetry::retry_unsafe(route, "status");
                        }
                        let mut answer = answer;
                        answer.attempts = tried.len();
                        return Ok(answer);
                    }
                },
                Outcome::Failed(booking, failure) => match failure.verdict(method) {
                    Verdict::Retry if has_retry_left => {
                        telemetry::retry(route, failure.reason());
                        last_failure = Some(failure);
                        self.retry
                            .release_and_sleep(booking, attempt, deadline)
                            .await;
                        attempt += 1;
                    }
                    verdict => {
                        if verdict == Verdict::Unsafe && has_retry_left {
                            telemetry::retry_unsafe(route, failure.reason());
                            withheld = Some(method);
                        }
                        last_failure = Some(failure);
                        break;
                    }
                },
            }
        }
        Err(self.give_up(last_failure, tried.len(), withheld))
    }

    /// One attempt on `worker`: book it, send, and classify what came back
    /// (recording it on the worker's circuit breaker).
    async fn attempt(
        &self,
        worker: Arc<Worker>,
        request: &Outgoing<'_>,
        token_work: u64,
        attempt: u32,
        deadline: tokio::time::Instant,
    ) -> Outcome {
        let prompt_tokens = match request.info.runs_no_model {
            true => 0,
            false => request.info.prompt_tokens,
        };
        let booking = worker.ledger().book(prompt_tokens, token_work);
        let outgoing = engine_h1::Request {
            method: request.method,
            path_and_query: request.path_and_query,
            headers: request.headers,
            authorization: request.authorization,
            traceparent: request.traceparent,
            body: &request.body,
        };
        // The attempt's own deadline, when it comes before the request's.
        let attempt_deadline = self
            .attempt_timeout
            .map(|t| tokio::time::Instant::now() + t)
            .filter(|at| *at < deadline);
        let sent = tokio::time::timeout_at(
            attempt_deadline.unwrap_or(deadline),
            engine_h1::send(worker.url(), outgoing, &self.connector),
        )
        .await;
        match sent {
            Err(_elapsed) => {
                worker.breaker().record_failure();
                let failure = match attempt_deadline {
                    Some(_) => {
                        tracing::warn!(
                            worker = worker.url(),
                            attempt,
                            "no response headers within --attempt-timeout-secs"
                        );
                        Failure::AttemptTimeout(worker.url().to_string())
                    }
                    None => Failure::Timeout,
                };
                Outcome::Failed(booking, failure)
            }
            Ok(Err(err)) => {
                worker.breaker().record_failure();
                let reason = upstream::error_chain(&err);
                tracing::warn!(worker = worker.url(), attempt, error = %reason, "worker request failed");
                let failure =
                    Failure::Transport(format!("{}: {reason}", worker.url()), err.progress());
                Outcome::Failed(booking, failure)
            }
            Ok(Ok(response)) => {
                if response.status().is_server_error() {
                    worker.breaker().record_failure();
                } else {
                    worker.breaker().record_success();
                }
                Outcome::Answered(Answer {
                    response,
                    booking,
                    worker,
                    attempts: 1,
                })
            }
        }
    }

    /// The error sent when no attempt produced an answer to pass on:
    /// 504 after the deadline, 502 after transport failures, else 503;
    /// `withheld` is the method whose retry the rule refused, named in
    /// the reason.
    fn give_up(
        &self,
        last_failure: Option<Failure>,
        attempts: usize,
        withheld: Option<&Method>,
    ) -> ApiError {
        let not_retried = match withheld {
            Some(method) => format!(
                "; not retried: the whole request reached the engine, which may have started it, and {method} is not idempotent"
            ),
            None => String::new(),
        };
        match last_failure {
            Some(Failure::Timeout) => ApiError::gateway_timeout(format!(
                "no worker answered within --request-timeout-secs ({}s)",
                self.request_timeout.as_secs()
            )),
            Some(Failure::Transport(reason, _)) => ApiError::bad_gateway(format!(
                "all {attempts} attempt(s) failed; last: {reason}{not_retried}"
            )),
            Some(Failure::AttemptTimeout(worker)) => ApiError::gateway_timeout(format!(
                "all {attempts} attempt(s) failed; last: {worker} sent no response headers within --attempt-timeout-secs ({}s){not_retried}",
                self.attempt_timeout.map_or(0, |t| t.as_secs())
            )),
            None => ApiError::no_workers("no worker available"),
        }
    }
}
