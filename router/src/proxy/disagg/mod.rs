//! Disaggregated prefill/decode: a request is prefilled on a worker of
//! the prefill pool and decoded on one of the decode pool
//! (`--prefill-urls`, `--pd-protocol`).
//!
//! Each pool is chosen by its own policy (`--prefill-policy`,
//! `--decode-policy`) over the fleet-wide load: the prefill worker is
//! booked with the prompt until its answer ends, the decode worker with
//! the output only (it gets the prompt's KV, not its work). A
//! `precise_prefix` prefill policy chooses on the engines' KV events.
//!
//! - **SGLang** ([`Disagg::sglang`]): both workers get the request at once
//!   with the prefill worker's bootstrap address and a fresh room; the
//!   decode worker's answer goes to the client once the prefill worker has
//!   answered too; the prefill answer is read and dropped. A prefill worker
//!   that fails before anything was sent gets the pair chosen again with a
//!   new room (as sgl-model-gateway does), else the client gets 502: the
//!   decode worker would only wait for KV that never comes.
//! - **vLLM** ([`Disagg::vllm`]): the prefill worker first runs the request
//!   with one output token and answers `kv_transfer_params`; the decode
//!   worker then gets the original request with them, through the ordinary
//!   path (retries, stream migration). A prefill that fails makes the
//!   decode worker compute the prompt itself (vLLM then prefills
//!   locally), and prompts under `--pd-min-prompt-tokens` go there
//!   directly.
//!
//! `shoal_disagg_requests_total{protocol,path}` counts each request:
//! `disaggregated`, `decode_only` (a short prompt) or `prefill_failed`.

mod bodies;
mod bootstrap;

use std::sync::Arc;

use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;

use super::{Answer, Forwarder, Outcome, Outgoing, Placement, WorkerPool};
use crate::config::{DisaggConfig, PdProtocol, RoutingConfig};
use crate::error::ApiError;
use crate::fleet::FleetView;
use crate::policy::{self, Policy};
use crate::request::{RequestInfo, Route};
use crate::retry_rule::Verdict;
use crate::telemetry::{self, RequestRecord};
use crate::upstream::HttpClient;
use crate::workers::{PoolSide, Registry, Roles, Worker};

/// Largest vLLM prefill answer read (it is one token and the params).
const MAX_PREFILL_ANSWER_BYTES: usize = 4 << 20;

/// The dispatch of a disaggregated fleet, built once per replica.
pub struct Disagg {
    protocol: PdProtocol,
    roles: Arc<Roles>,
    prefill_policy: Arc<dyn Policy>,
    decode_policy: Arc<dyn Policy>,
    min_prompt_tokens: u64,
    bootstrap: bootstrap::BootstrapPorts,
}

impl Disagg {
    /// The pools' policies (prefill, decode): what the replica must
    /// prepare requests for besides its main policy.
    pub fn pool_policies(&self) -> [&Arc<dyn Policy>; 2] {
        [&self.prefill_policy, &self.decode_policy]
    }
}

impl std::fmt::Debug for Disagg {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Disagg")
            .field("protocol", &self.protocol)
            .field("prefill_policy", &self.prefill_policy.name())
            .field("decode_policy", &self.decode_policy.name())
            .finish_non_exhaustive()
    }
}

/// The workers a request's legs may use.
#[derive(Clone, Copy)]
pub struct Fleet<'a> {
    /// Every registered worker.
    pub registry: &'a Registry,
    /// The load the policies read.
    pub fleet: &'a dyn FleetView,
    /// Asks prefill workers for their bootstrap port.
    pub side_client: &'a HttpClient,
}

/// Why a prefill leg gave no answer: the reason, and whether the request
/// may go to another prefill worker (nothing reached this one's engine).
struct LegFailure {
    reason: String,
    retry: bool,
}

impl Disagg {
    /// The dispatch `config` describes (`None`: not disaggregated;
    /// `discovers_roles`: discovery reads each engine's pool from a label);
    /// a pool whose policy is `--policy` shares `main` (and what it
    /// learned).
    pub fn new(
        config: &DisaggConfig,
        discovers_roles: bool,
        routing: &RoutingConfig,
        main: &Arc<dyn Policy>,
    ) -> Option<Self> {
        let protocol = config.protocol(discovers_roles)?;
        let pool_policy = |kind: Option<crate::config::PolicyKind>| match kind {
            Some(kind) if kind != routing.policy => {
                let mut routing = routing.clone();
                routing.policy = kind;
                policy::build(&routing)
            }
            _ => main.clone(),
        };
        Some(Self {
            protocol,
            roles: Arc::new(Roles::new(&config.prefill_urls)),
            prefill_policy: pool_policy(config.prefill_policy),
            decode_policy: pool_policy(config.decode_policy),
            min_prompt_tokens: config.pd_min_prompt_tokens,
            bootstrap: bootstrap::BootstrapPorts::new(config.pd_bootstrap_port),
        })
    }

    /// The fleet's roles.
    pub fn roles(&self) -> &Arc<Roles> {
        &self.roles
    }

    /// The decode pool, where every request that is not disaggregated goes.
    pub fn decode_side(&self) -> PoolSide<'_> {
        PoolSide {
            roles: &self.roles,
            prefill: false,
        }
    }

    /// The pools' policies (the replica runs their background work).
    pub fn policies(&self) -> [&Arc<dyn Policy>; 2] {
        [&self.prefill_policy, &self.decode_policy]
    }

    /// Whether requests on `route` are split into prefill and decode.
    pub fn splits(&self, route: Route) -> bool {
        match route {
            Route::ChatCompletions | Route::Completions => true,
            Route::Generate => self.protocol == PdProtocol::Sglang,
            _ => false,
        }
    }

    /// Whether a stream of this fleet may be migrated: a continuation goes
    /// to a decode worker alone, which an SGLang decode server cannot serve.
    pub fn migrates(&self) -> bool {
        self.protocol == PdProtocol::Vllm
    }

    fn pool<'a>(&'a self, fleet: Fleet<'a>, prefill: bool) -> WorkerPool<'a> {
        WorkerPool {
            registry: fleet.registry,
            policy: match prefill {
                true => self.prefill_policy.as_ref(),
                false => self.decode_policy.as_ref(),
            },
            fleet: fleet.fleet,
            side: Some(PoolSide {
                roles: &self.roles,
                prefill,
            }),
        }
    }

    /// Routes and proxies one request that [`Disagg::splits`]; `record` is
    /// ended on every exit, as [`Forwarder::forward`] does.
    pub async fn forward(
        &self,
        forwarder: &Forwarder,
        fleet: Fleet<'_>,
        request: Outgoing<'_>,
        record: RequestRecord,
    ) -> Response {
        match self.protocol {
            PdProtocol::Sglang => self.sglang(forwarder, fleet, request, record).await,
            PdProtocol::Vllm => self.vllm(forwarder, fleet, request, record).await,
        }
    }

    /// Chooses a prefill worker not in `tried` (503 when none is left).
    fn pick_prefill(
        &self,
        pool: &WorkerPool<'_>,
        info: &RequestInfo,
        tried: &[Arc<Worker>],
    ) -> Result<Arc<Worker>, ApiError> {
        let none = || ApiError::no_workers("no prefill worker available".to_string());
        let candidates = pool
            .candidates(info.model.as_deref(), tried)
            .map_err(|_| none())?;
        if tried
            .iter()
            .any(|t| candidates.iter().any(|c| Arc::ptr_eq(c, t)))
        {
            // Every prefill worker was tried.
            return Err(none());
        }
        pool.pick(&candidates, info)
    }

    /// One prefill attempt on `worker`: its answer, or why there is none.
    async fn prefill_leg(
        &self,
        forwarder: &Forwarder,
        worker: Arc<Worker>,
        request: &Outgoing<'_>,
        deadline: tokio::time::Instant,
    ) -> Result<Answer, LegFailure> {
        let work = self.prefill_policy.token_work(request.info);
        let url = worker.url().to_string();
        match forwarder.attempt(worker, request, work, 0, deadline).await {
            Outcome::Answered(answer) if answer.response.status().is_success() => Ok(answer),
            Outcome::Answered(answer) => {
                let status = answer.response.status();
                let retry = answer.verdict(request.method) == Verdict::Retry;
                drop(answer.discard());
                Err(LegFailure {
                    reason: format!("prefill worker {url} answered {status}"),
                    retry,
                })
            }
            Outcome::Failed(booking, failure) => {
                drop(booking);
                Err(LegFailure {
                    retry: failure.verdict(request.method) == Verdict::Retry,
                    reason: format!("prefill worker failed: {}", failure.describe()),
                })
            }
        }
    }

    /// SGLang: prefill and decode at once, joined by a bootstrap room.
    async fn sglang(
        &self,
        forwarder: &Forwarder,
        fleet: Fleet<'_>,
        request: Outgoing<'_>,
        record: RequestRecord,
    ) -> Response {
        let deadline = forwarder.deadline_of(&record);
        let route = record.route();
        let prefill_pool = self.pool(fleet, true);
        let decode_pool = self.pool(fleet, false);
        let (prefill_info, decode_info) = leg_infos(request.info);
        let mut tried: Vec<Arc<Worker>> = Vec::new();
        loop {
            let prefill = match self.pick_prefill(&prefill_pool, request.info, &tried) {
                Ok(worker) => worker,
                Err(error) => return self.refuse(record, error),
            };
            tried.push(prefill.clone());
            let port = self.bootstrap.port(prefill.url(), fleet.side_client).await;
            let host = host_of(prefill.url());
            let Ok(body) = bodies::sglang(&request.body, &host, port, bodies::room) else {
                return not_an_object(record);
            };
            let prefill_request = leg(&request, body.clone(), &prefill_info);
            let decode_request = Outgoing {
                migratable: None,
                ..leg(&request, body, &decode_info)
            };
            let joined = {
                let prefill_answer =
                    self.prefill_leg(forwarder, prefill.clone(), &prefill_request, deadline);
                let decode_answer =
                    forwarder.attempts(decode_pool, &decode_request, route, deadline);
                tokio::pin!(prefill_answer, decode_answer);
                // A prefill that fails ends the wait at once: the decode
                // worker would only wait for KV that will not come.
                tokio::select! {
                    prefill = &mut prefill_answer => match prefill {
                        Ok(answer) => Ok((answer, decode_answer.await)),
                        Err(failure) => Err(failure),
                    },
                    decode = &mut decode_answer => match prefill_answer.await {
                        Ok(answer) => Ok((answer, decode)),
                        Err(failure) => Err(failure),
                    },
                }
            };
            match joined {
                Ok((answer, decode_answer)) => {
                    drain(answer, deadline);
                    telemetry::disagg(self.protocol.label(), "disaggregated");
                    return forwarder.respond(decode_answer, decode_request, record, deadline);
                }
                Err(failure) if failure.retry && retry_left(forwarder, &tried, deadline) => {
                    tracing::info!(
                        reason = failure.reason,
                        "prefill worker refused; choosing the pair again"
                    );
                    telemetry::retry(route, "prefill");
                }
                Err(failure) => {
                    telemetry::disagg(self.protocol.label(), "prefill_failed");
                    return record.respond(ApiError::bad_gateway(failure.reason).into_response());
                }
            }
        }
    }

    /// vLLM: prefill first, then decode with the prefill's transfer params.
    async fn vllm(
        &self,
        forwarder: &Forwarder,
        fleet: Fleet<'_>,
        request: Outgoing<'_>,
        record: RequestRecord,
    ) -> Response {
        let decode_pool = self.pool(fleet, false);
        if request.info.prompt_tokens < self.min_prompt_tokens {
            telemetry::disagg(self.protocol.label(), "decode_only");
            return forwarder.forward(decode_pool, request, record).await;
        }
        let deadline = forwarder.deadline_of(&record);
        let prefill_pool = self.pool(fleet, true);
        let (prefill_info, decode_info) = leg_infos(request.info);
        let Ok(prefill_body) = bodies::vllm_prefill(&request.body) else {
            return not_an_object(record);
        };
        let prefill_request = leg(&request, prefill_body, &prefill_info);
        let mut tried: Vec<Arc<Worker>> = Vec::new();
        let params = loop {
            let prefill = match self.pick_prefill(&prefill_pool, request.info, &tried) {
                Ok(worker) => worker,
                Err(error) => break Err(error.message),
            };
            tried.push(prefill.clone());
            match self
                .prefill_leg(forwarder, prefill, &prefill_request, deadline)
                .await
            {
                Ok(answer) => break transfer_params(answer, deadline).await,
                Err(failure) if failure.retry && retry_left(forwarder, &tried, deadline) => {
                    telemetry::retry(record.route(), "prefill");
                }
                Err(failure) => break Err(failure.reason),
            }
        };
        let decode_body = params
            .as_ref()
            .ok()
            .and_then(|p| bodies::vllm_decode(&request.body, p.clone()).ok());
        match decode_body {
            Some(body) => {
                telemetry::disagg(self.protocol.label(), "disaggregated");
                let decode_request = leg(&request, body, &decode_info);
                let decode_request = Outgoing {
                    migratable: request.migratable.clone(),
                    learn: None,
                    ..decode_request
                };
                forwarder.forward(decode_pool, decode_request, record).await
            }
            None => {
                let reason = params.err().unwrap_or_default();
                tracing::warn!(
                    reason,
                    "prefill failed; the decode worker computes the prompt"
                );
                telemetry::disagg(self.protocol.label(), "prefill_failed");
                forwarder.forward(decode_pool, request, record).await
            }
        }
    }

    /// Ends `record` with `error`.
    fn refuse(&self, record: RequestRecord, error: ApiError) -> Response {
        telemetry::disagg(self.protocol.label(), "prefill_failed");
        record.respond(error.into_response())
    }
}

/// The accounting of a request's two legs: the prefill worker runs the
/// prompt and one token; the decode worker gets the prompt's KV, not its
/// work, and generates the output.
fn leg_infos(info: &RequestInfo) -> (RequestInfo, RequestInfo) {
    let prefill = RequestInfo {
        max_output_tokens: Some(1),
        ..info.clone()
    };
    let decode = RequestInfo {
        prompt_tokens: 0,
        ..info.clone()
    };
    (prefill, decode)
}

/// Ends `record` with the 400 for a body that cannot take the legs' fields.
fn not_an_object(record: RequestRecord) -> Response {
    let error = ApiError::bad_request(
        "invalid_request",
        "a disaggregated request body must be a JSON object",
    );
    record.respond(error.into_response())
}

/// Whether another prefill worker may be tried after `tried`: a retry left
/// (`--retry-max-retries`) and time before the deadline.
fn retry_left(
    forwarder: &Forwarder,
    tried: &[Arc<Worker>],
    deadline: tokio::time::Instant,
) -> bool {
    tried.len() <= forwarder.max_retries as usize && tokio::time::Instant::now() < deadline
}

/// `request` with another body and accounting: one leg of it.
fn leg<'a>(request: &Outgoing<'a>, body: bytes::Bytes, info: &'a RequestInfo) -> Outgoing<'a> {
    Outgoing {
        method: request.method,
        headers: request.headers,
        authorization: request.authorization,
        traceparent: request.traceparent,
        path_and_query: request.path_and_query,
        body,
        info,
        placement: Placement::Any,
        learn: None,
        migratable: None,
    }
}

/// The host of a worker URL (SGLang's `bootstrap_host`).
fn host_of(url: &str) -> String {
    url.parse::<http::Uri>()
        .ok()
        .and_then(|uri| uri.host().map(str::to_string))
        .unwrap_or_default()
}

/// Reads a prefill answer to its end in the background and then releases
/// its booking: the prefill worker is busy until it has answered.
fn drain(answer: Answer, deadline: tokio::time::Instant) {
    tokio::spawn(async move {
        let Answer {
            response, booking, ..
        } = answer;
        let _ = tokio::time::timeout_at(deadline, response.into_body().collect()).await;
        drop(booking);
    });
}

/// The `kv_transfer_params` of a vLLM prefill answer (its booking is
/// released once it is read), or why there are none.
async fn transfer_params(
    answer: Answer,
    deadline: tokio::time::Instant,
) -> Result<serde_json::Value, String> {
    let url = answer.worker.url().to_string();
    let Answer {
        response, booking, ..
    } = answer;
    let limited = http_body_util::Limited::new(response.into_body(), MAX_PREFILL_ANSWER_BYTES);
    let read = tokio::time::timeout_at(deadline, limited.collect()).await;
    drop(booking);
    let bytes = match read {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => return Err(format!("prefill worker {url}: answer not read: {e}")),
        Err(_) => {
            return Err(format!(
                "prefill worker {url}: no answer before the deadline"
            ));
        }
    };
    bodies::vllm_transfer_params(&bytes)
        .ok_or_else(|| format!("prefill worker {url} answered no kv_transfer_params"))
}
