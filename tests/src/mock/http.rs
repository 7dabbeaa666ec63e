//! The HTTP surface of one engine: routes per flavor, fault middleware,
//! load endpoints, `POST /reset_prefix_cache`, `/stats` and the
//! `/mock/fault` admin route.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::json;

use super::config::Flavor;
use super::engine::{Engine, FaultMode};
use super::formats;
use super::openai::{self, error_response, unavailable};
use super::tokenize;

/// Builds the router of one engine.
pub(crate) fn router(engine: Arc<Engine>) -> Router {
    let mut data = Router::new()
        .route("/v1/chat/completions", post(openai::chat))
        .route("/v1/completions", post(openai::completions))
        .route("/generate", post(openai::generate))
        .route("/v1/responses", post(openai::responses))
        .route("/v1/embeddings", post(openai::embeddings))
        .route("/v1/models", get(models))
        .route("/reset_prefix_cache", post(reset_prefix_cache))
        .route("/health", get(health));
    data = match engine.config().flavor {
        Flavor::Sglang => data
            .route("/v1/loads", get(sglang_loads))
            .route("/get_load", get(sglang_get_load))
            .route("/metrics", get(metrics)),
        Flavor::Vllm => data
            .route("/metrics", get(metrics))
            .route("/tokenize", post(tokenize::tokenize)),
        Flavor::Llamacpp => data
            .route("/metrics", get(metrics))
            .route("/slots", get(llamacpp_slots)),
    };
    let data = data.route_layer(middleware::from_fn_with_state(engine.clone(), fault_layer));
    Router::new()
        .route("/stats", get(stats))
        .route("/mock/fault", post(set_fault).get(get_fault))
        .route("/server_info", get(server_info))
        .route("/mock/pd", get(pd_counters))
        .route("/mock/pd/handoff", get(pd_handoff))
        .merge(data)
        .with_state(engine)
}

/// SGLang's server info: the disaggregation mode and bootstrap port.
async fn server_info(State(engine): State<Arc<Engine>>) -> Response {
    json_ok(engine.pd.server_info(engine.config().pd_role).to_string())
}

/// The engine's handoff counters.
async fn pd_counters(State(engine): State<Arc<Engine>>) -> Response {
    let counters = engine.pd.counters(engine.config().pd_role);
    json_ok(serde_json::to_string(&counters).unwrap_or_default())
}

/// Query of the KV handoff endpoint.
#[derive(Deserialize)]
struct HandoffQuery {
    key: String,
    #[serde(default)]
    wait_ms: u64,
}

/// Hands a prefill's KV to the decode engine asking for it, waiting up to
/// `wait_ms` (at most a minute) for the prefill to finish: 404 if it does
/// not.
async fn pd_handoff(State(engine): State<Arc<Engine>>, Query(q): Query<HandoffQuery>) -> Response {
    let wait = Duration::from_millis(q.wait_ms.min(60_000));
    match engine.pd.take(&q.key, wait).await {
        Some(tokens) => json_ok(json!({ "prompt_tokens": tokens }).to_string()),
        None => error_response(
            StatusCode::NOT_FOUND,
            &format!("no KV handoff under {}", q.key),
            "not_found_error",
            "handoff_not_found",
        ),
    }
}

async fn fault_layer(State(engine): State<Arc<Engine>>, req: Request, next: Next) -> Response {
    match engine.fault() {
        FaultMode::Hang => std::future::pending().await,
        FaultMode::Fail | FaultMode::Die => {
            unavailable(&engine, "engine unavailable (mock fault mode)")
        }
        FaultMode::None | FaultMode::GarbageMetrics => next.run(req).await,
    }
}

/// A 200 with a JSON body.
pub(crate) fn json_ok(body: String) -> Response {
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body,
    )
        .into_response()
}

fn text_ok(body: String) -> Response {
    (
        StatusCode::OK,
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

fn garbage(engine: &Engine) -> bool {
    engine.fault() == FaultMode::GarbageMetrics
}

async fn health(State(engine): State<Arc<Engine>>) -> Response {
    match engine.config().flavor {
        Flavor::Llamacpp => json_ok(json!({"status": "ok"}).to_string()),
        Flavor::Sglang | Flavor::Vllm => StatusCode::OK.into_response(),
    }
}

async fn models(State(engine): State<Arc<Engine>>) -> Response {
    let cfg = engine.config();
    let created = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    json_ok(
        json!({"object": "list", "data": [{
            "id": cfg.model_name, "object": "model", "created": created,
            "owned_by": "shoal-mock", "root": cfg.model_name,
            "max_model_len": cfg.max_request_tokens(),
        }]})
        .to_string(),
    )
}

async fn sglang_loads(
    State(engine): State<Arc<Engine>>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    engine.count_load_poll();
    if let Some(include) = q.get("include") {
        for section in include.split(',').map(str::trim) {
            if !formats::SGLANG_INCLUDE_SECTIONS.contains(&section) {
                let msg = format!(
                    "unknown include section {section:?}; expected one of {}",
                    formats::SGLANG_INCLUDE_SECTIONS.join(", ")
                );
                return error_response(
                    StatusCode::BAD_REQUEST,
                    &msg,
                    "invalid_request_error",
                    "invalid_include",
                );
            }
        }
    }
    if garbage(&engine) {
        return json_ok(formats::garbage_json());
    }
    json_ok(formats::sglang_loads(&engine.snapshot()))
}

async fn sglang_get_load(State(engine): State<Arc<Engine>>) -> Response {
    engine.count_load_poll();
    if garbage(&engine) {
        return json_ok(formats::garbage_json());
    }
    json_ok(formats::sglang_get_load(&engine.snapshot()))
}

async fn metrics(State(engine): State<Arc<Engine>>) -> Response {
    engine.count_load_poll();
    let cfg = engine.config();
    let prefix = match cfg.flavor {
        Flavor::Sglang => "sglang:",
        Flavor::Vllm => "vllm:",
        Flavor::Llamacpp => "llamacpp:",
    };
    if garbage(&engine) {
        return text_ok(formats::garbage_metrics(prefix));
    }
    let snap = engine.snapshot();
    let body = match cfg.flavor {
        Flavor::Sglang => formats::sglang_metrics(&snap, &cfg.model_name),
        Flavor::Vllm => formats::vllm_metrics(&snap, &cfg.model_name, engine.started_unix()),
        Flavor::Llamacpp => formats::llamacpp_metrics(&snap),
    };
    text_ok(body)
}

async fn llamacpp_slots(State(engine): State<Arc<Engine>>) -> Response {
    engine.count_load_poll();
    if garbage(&engine) {
        return json_ok(formats::garbage_json());
    }
    json_ok(formats::llamacpp_slots(&engine.snapshot()))
}

/// `POST /reset_prefix_cache`: empties the prefix cache and publishes
/// `AllBlocksCleared`, answering 200 with an empty body like vLLM.
async fn reset_prefix_cache(State(engine): State<Arc<Engine>>) -> Response {
    engine.reset_prefix_cache();
    StatusCode::OK.into_response()
}

#[derive(Deserialize)]
struct StatsQuery {
    since: Option<u64>,
}

/// `GET /stats[?since=SEQ]`: the model snapshot (gauges, counters, slots),
/// the load-endpoint hit count and the finished-request records with
/// `seq > since`.
async fn stats(State(engine): State<Arc<Engine>>, Query(q): Query<StatsQuery>) -> Response {
    let cfg = engine.config();
    let body = json!({
        "flavor": cfg.flavor.as_str(),
        "model": cfg.model_name,
        "fault": engine.fault(),
        "time_scale": cfg.time_scale,
        "load_polls": engine.load_polls(),
        "tokenize_calls": engine.tokenize_calls(),
        "snapshot": engine.snapshot(),
        "kv_events": engine.kv_events(),
        "kv_events_stats": engine.kv_stats(),
        "recent": engine.records_since(q.since.unwrap_or(0)),
    });
    json_ok(body.to_string())
}

#[derive(Deserialize)]
struct FaultBody {
    mode: FaultMode,
}

async fn get_fault(State(engine): State<Arc<Engine>>) -> Response {
    json_ok(json!({"mode": engine.fault()}).to_string())
}

/// `POST /mock/fault {"mode":"none|hang|die|garbage_metrics|fail"}`.
async fn set_fault(State(engine): State<Arc<Engine>>, body: Bytes) -> Response {
    let mode = match serde_json::from_slice::<FaultBody>(&body) {
        Ok(b) => b.mode,
        Err(e) => {
            let msg = format!("expected {{\"mode\":\"none|hang|die|garbage_metrics|fail\"}}: {e}");
            return error_response(
                StatusCode::BAD_REQUEST,
                &msg,
                "invalid_request_error",
                "invalid_fault",
            );
        }
    };
    if mode == FaultMode::Die {
        // Answer first, then die.
        let e = engine.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            e.set_fault(FaultMode::Die);
        });
    } else {
        engine.set_fault(mode);
    }
    json_ok(json!({"mode": mode}).to_string())
}
