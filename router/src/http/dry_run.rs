//! `POST /debug/route`: the worker this replica would send a request to,
//! without sending it, booking it or touching its caches' bookkeeping
//! beyond what the policy's selection reads.
//!
//! Asked of every replica with the same body, it shows whether the
//! replicas agree (the multi-replica promise of the fleet view and of
//! `precise_prefix`'s shared index). An admin read: it reveals placement.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::response::{IntoResponse, Response};
use serde::Serialize;

use super::state::AppState;
use crate::error::ApiError;
use crate::request;

/// The answer: the chosen worker, and the policy that chose it.
#[derive(Debug, Serialize)]
pub struct DryRun {
    /// The chosen worker's URL.
    pub worker: String,
    /// The policy's name.
    pub policy: &'static str,
    /// How many workers were candidates.
    pub candidates: usize,
    /// Microseconds this replica took to get the prompt's tokens (here,
    /// or from an engine with `--kv-tokenize-on-engine`) and choose: what
    /// routing adds to a request before it is sent.
    pub route_micros: u64,
    /// Wall-clock time of the choice, µs since the Unix epoch: answers
    /// from several replicas asked together can be put in order, and how
    /// far apart they chose (the fleet's load moves in between) seen.
    pub decided_at_unix_micros: u64,
    /// For a policy routing on KV events: each candidate's cached prefix
    /// of the prompt in blocks, per this replica's index (candidates
    /// caching none are left out), so replicas' indexes can be compared
    /// apart from their load views.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub cached: Vec<CachedPrefix>,
    /// Each candidate's load as this replica sees it right after choosing
    /// (the fleet-wide counts when meshed, and the engine's polled queue),
    /// so replicas that disagree can be told apart by what they saw.
    pub loads: Vec<CandidateLoad>,
}

/// One candidate's load in the view a dry run chose on.
#[derive(Debug, Serialize)]
pub struct CandidateLoad {
    /// The worker's URL.
    pub worker: String,
    /// Requests in flight there (fleet-wide when meshed).
    pub requests: u64,
    /// Token-work in flight there.
    pub tokens: u64,
    /// Token-work routed there since its engine's last load report.
    pub since_poll: u64,
    /// Prompt tokens there still waiting for a first byte.
    pub pending_prefill: u64,
    /// The engine's own queued tokens, from its last fresh report.
    pub engine_queued_tokens: Option<u64>,
    /// The engine's reported generation throughput (tokens/s), from the
    /// same report: it prices every token of the wait.
    pub engine_gen_throughput: Option<f64>,
    /// The engine's reported KV-cache usage in 0..=1 (the KV barrier).
    pub engine_kv_usage: Option<f64>,
}

/// The load view of `candidates` at this instant.
fn loads(app: &AppState, candidates: &[Arc<crate::workers::Worker>]) -> Vec<CandidateLoad> {
    let at = app.fleet.moment(std::time::Instant::now());
    let mut view = Vec::with_capacity(candidates.len());
    app.fleet.load_all(candidates, &at, &mut view);
    candidates
        .iter()
        .zip(view)
        .map(|(w, load)| CandidateLoad {
            worker: w.url().to_string(),
            requests: load.counts.requests,
            tokens: load.counts.tokens,
            since_poll: load.counts.dispatched_since_poll,
            pending_prefill: load.counts.pending_prefill,
            engine_queued_tokens: load.engine.and_then(|e| e.queued_tokens),
            engine_gen_throughput: load.engine.and_then(|e| e.gen_throughput),
            engine_kv_usage: load.engine.and_then(|e| e.token_usage),
        })
        .collect()
}

/// One worker's cached prefix of the prompt.
#[derive(Debug, Serialize)]
pub struct CachedPrefix {
    /// The worker's URL.
    pub worker: String,
    /// Blocks of the prompt, from its start, its engine caches.
    pub blocks: usize,
}

/// What the replica's KV index says each candidate caches of the prompt.
fn cached_prefixes(
    app: &AppState,
    candidates: &[Arc<crate::workers::Worker>],
    info: &request::RequestInfo,
) -> Vec<CachedPrefix> {
    let Some(kv) = app.policy.kv_events() else {
        return Vec::new();
    };
    let Some(blocks) = kv.prompt_blocks(info) else {
        return Vec::new();
    };
    let mut depth = crate::id_hash::IdMap::default();
    kv.cached_blocks(&blocks.hashes, &mut depth);
    candidates
        .iter()
        .filter_map(|w| {
            let blocks = *depth.get(&w.id())?;
            Some(CachedPrefix {
                worker: w.url().to_string(),
                blocks,
            })
        })
        .collect()
}

/// `POST /debug/route` with an inference request's JSON body.
pub async fn route(State(app): State<Arc<AppState>>, body: Bytes) -> Response {
    let started = std::time::Instant::now();
    let mut info = match request::inspect(&body, app.policy.prompt_text_limit()) {
        Ok(info) => info,
        Err(e) => return ApiError::bad_request("invalid_body", e.to_string()).into_response(),
    };
    if let Some(kv) = app.policy.kv_events() {
        kv.tokenize_on_engine(&mut info, &app.registry, &app.side_client)
            .await;
    }
    let serving = match app.registry.serving(info.model.as_deref()) {
        Ok(serving) => serving,
        Err(missing) => {
            return ApiError::model_not_found(&missing.model, &missing.served).into_response();
        }
    };
    let candidates: Vec<_> = serving
        .iter()
        .filter(|w| w.is_available())
        .cloned()
        .collect();
    if candidates.is_empty() {
        return ApiError::no_workers("no available worker").into_response();
    }
    let Some(chosen) = app
        .policy
        .select(&candidates, &info, app.fleet.as_ref())
        .and_then(|i| candidates.get(i))
    else {
        return ApiError::no_workers("the policy selected no worker").into_response();
    };
    let route_micros = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
    let decided_at_unix_micros = shoal_mesh::identity::unix_micros();
    let loads = loads(&app, &candidates);
    Json(DryRun {
        worker: chosen.url().to_string(),
        policy: app.policy.name(),
        candidates: candidates.len(),
        route_micros,
        decided_at_unix_micros,
        cached: cached_prefixes(&app, &candidates, &info),
        loads,
    })
    .into_response()
}
