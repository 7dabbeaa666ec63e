//! One poll of one engine, in its own format, with auto-detection.
//!
//! SGLang is asked `/v1/loads?include=core`, then the deprecated
//! `/get_load`, then `/metrics`; the first that answers is remembered. vLLM
//! and llama.cpp expose `/metrics`; their throughput is the rate of a token
//! counter between polls, and llama.cpp's KV usage comes from `/slots`.

use std::time::{Duration, Instant};

use bytes::Bytes;
use shoal_proto::{EngineKind, EngineLoad};

use crate::config::LoadSource;
use crate::config::defaults::LOAD_MAX_RESPONSE_BYTES;
use crate::engines::{self, ParseError, llamacpp, rate::CounterRate, sglang, vllm};
use crate::upstream::{self, FetchError, HttpClient};

/// Why a poll produced no snapshot.
#[derive(Debug, thiserror::Error)]
pub enum PollError {
    /// The endpoint could not be reached or timed out.
    #[error("{path}: {source}")]
    Fetch {
        /// Endpoint path.
        path: &'static str,
        /// What went wrong.
        source: FetchError,
    },
    /// The endpoint answered with a non-2xx status.
    #[error("{path}: HTTP {status}")]
    Status {
        /// Endpoint path.
        path: &'static str,
        /// The status.
        status: u16,
    },
    /// The body did not parse.
    #[error("{path}: {source}")]
    Parse {
        /// Endpoint path.
        path: &'static str,
        /// The parser's complaint.
        source: ParseError,
    },
    /// `auto` could not tell which engine this is.
    #[error("could not detect the engine type (no /v1/loads, no known /metrics prefix)")]
    Undetected,
}

impl PollError {
    /// Short label for the poll-error metric.
    pub fn reason(&self) -> &'static str {
        match self {
            PollError::Fetch {
                source: FetchError::Timeout(_),
                ..
            } => "timeout",
            PollError::Fetch { .. } => "transport",
            PollError::Status { .. } => "status",
            PollError::Parse { .. } => "parse",
            PollError::Undetected => "undetected",
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum SglangEndpoint {
    #[default]
    Loads,
    GetLoad,
    Metrics,
}

/// What the monitor remembers about one worker between polls.
#[derive(Debug, Default)]
pub struct PollState {
    kind: Option<EngineKind>,
    sglang: SglangEndpoint,
    throughput: CounterRate,
}

impl PollState {
    /// The engine type, once known.
    pub fn kind(&self) -> Option<EngineKind> {
        self.kind
    }
}

const LOADS: &str = "/v1/loads?include=core";
const GET_LOAD: &str = "/get_load";
const METRICS: &str = "/metrics";
const SLOTS: &str = "/slots";

async fn fetch(
    client: &HttpClient,
    base: &str,
    path: &'static str,
    timeout: Duration,
) -> Result<Bytes, PollError> {
    let (status, body) = upstream::get(client, base, path, timeout, LOAD_MAX_RESPONSE_BYTES)
        .await
        .map_err(|source| PollError::Fetch { path, source })?;
    if status.is_success() {
        Ok(body)
    } else {
        Err(PollError::Status {
            path,
            status: status.as_u16(),
        })
    }
}

fn text(body: &Bytes) -> std::borrow::Cow<'_, str> {
    String::from_utf8_lossy(body)
}

/// Polls `base` once. Returns the engine type and its validated load.
pub async fn poll(
    client: &HttpClient,
    base: &str,
    state: &mut PollState,
    source: LoadSource,
    timeout: Duration,
) -> Result<(EngineKind, EngineLoad), PollError> {
    let fixed = match source {
        LoadSource::Sglang => Some(EngineKind::Sglang),
        LoadSource::Vllm => Some(EngineKind::Vllm),
        LoadSource::Llamacpp => Some(EngineKind::Llamacpp),
        LoadSource::Auto | LoadSource::None => None,
    };
    if let Some(kind) = fixed {
        state.kind = Some(kind);
    }
    let kind = match state.kind {
        Some(kind) => kind,
        None => return detect(client, base, state, timeout).await,
    };
    let load = match kind {
        EngineKind::Sglang => poll_sglang(client, base, state, timeout).await?,
        EngineKind::Vllm => {
            let body = fetch(client, base, METRICS, timeout).await?;
            vllm_load(&body, state)?
        }
        EngineKind::Llamacpp => {
            let body = fetch(client, base, METRICS, timeout).await?;
            llamacpp_load(client, base, &body, state, timeout).await?
        }
    };
    Ok((kind, load))
}

async fn detect(
    client: &HttpClient,
    base: &str,
    state: &mut PollState,
    timeout: Duration,
) -> Result<(EngineKind, EngineLoad), PollError> {
    if let Ok(body) = fetch(client, base, LOADS, timeout).await
        && let Ok(load) = sglang::parse_loads(&body)
    {
        state.kind = Some(EngineKind::Sglang);
        state.sglang = SglangEndpoint::Loads;
        return Ok((EngineKind::Sglang, load));
    }
    let body = fetch(client, base, METRICS, timeout).await?;
    let kind = engines::detect_from_metrics(&text(&body)).ok_or(PollError::Undetected)?;
    let load = match kind {
        EngineKind::Sglang => {
            state.sglang = SglangEndpoint::Metrics;
            sglang::parse_metrics(&text(&body)).map_err(|source| PollError::Parse {
                path: METRICS,
                source,
            })?
        }
        EngineKind::Vllm => vllm_load(&body, state)?,
        EngineKind::Llamacpp => llamacpp_load(client, base, &body, state, timeout).await?,
    };
    state.kind = Some(kind);
    tracing::info!(worker = base, engine = %kind, "detected engine type");
    Ok((kind, load))
}

async fn poll_sglang(
    client: &HttpClient,
    base: &str,
    state: &mut PollState,
    timeout: Duration,
) -> Result<EngineLoad, PollError> {
    const CHAIN: [SglangEndpoint; 3] = [
        SglangEndpoint::Loads,
        SglangEndpoint::GetLoad,
        SglangEndpoint::Metrics,
    ];
    let start = CHAIN.iter().position(|e| *e == state.sglang).unwrap_or(0);
    let mut last = PollError::Undetected;
    for endpoint in &CHAIN[start..] {
        let path = match endpoint {
            SglangEndpoint::Loads => LOADS,
            SglangEndpoint::GetLoad => GET_LOAD,
            SglangEndpoint::Metrics => METRICS,
        };
        let parsed = match fetch(client, base, path, timeout).await {
            Ok(body) => match endpoint {
                SglangEndpoint::Loads => sglang::parse_loads(&body),
                SglangEndpoint::GetLoad => sglang::parse_get_load(&body),
                SglangEndpoint::Metrics => sglang::parse_metrics(&text(&body)),
            }
            .map_err(|source| PollError::Parse { path, source }),
            Err(err) => Err(err),
        };
        match parsed {
            Ok(load) => {
                state.sglang = *endpoint;
                return Ok(load);
            }
            // A transport failure or timeout says nothing about the
            // endpoint: do not walk down the chain on it.
            Err(err @ PollError::Fetch { .. }) => return Err(err),
            Err(err) => last = err,
        }
    }
    // Nothing in the chain worked: start from the top next time.
    state.sglang = SglangEndpoint::Loads;
    Err(last)
}

fn vllm_load(body: &Bytes, state: &mut PollState) -> Result<EngineLoad, PollError> {
    let parsed = vllm::parse_metrics(&text(body)).map_err(|source| PollError::Parse {
        path: METRICS,
        source,
    })?;
    let mut load = parsed.load;
    load.gen_throughput = parsed
        .generation_tokens_total
        .and_then(|total| state.throughput.observe(total, Instant::now()));
    Ok(load)
}

async fn llamacpp_load(
    client: &HttpClient,
    base: &str,
    metrics_body: &Bytes,
    state: &mut PollState,
    timeout: Duration,
) -> Result<EngineLoad, PollError> {
    let parsed =
        llamacpp::parse_metrics(&text(metrics_body)).map_err(|source| PollError::Parse {
            path: METRICS,
            source,
        })?;
    let mut load = parsed.load;
    load.gen_throughput = parsed
        .tokens_predicted_total
        .and_then(|total| state.throughput.observe(total, Instant::now()));
    // Current llama.cpp has no KV gauge: estimate it from /slots. A failed
    // /slots leaves only what /metrics said (possibly nothing).
    match fetch(client, base, SLOTS, timeout).await {
        Ok(body) => match llamacpp::parse_slots(&body) {
            Ok(Some(usage)) => load.token_usage = Some(usage),
            Ok(None) => {}
            Err(err) => tracing::debug!(worker = base, error = %err, "bad /slots body"),
        },
        Err(err) => tracing::debug!(worker = base, error = %err, "/slots unavailable"),
    }
    Ok(load)
}
