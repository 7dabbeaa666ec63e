//! Inference routes: OpenAI `/v1/chat/completions`, `/v1/completions`,
//! `/v1/responses` and `/v1/embeddings`, and SGLang `/generate`, streamed
//! (SSE) or not (embeddings never stream).

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::{Body, Bytes};
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use tokio::sync::mpsc::UnboundedReceiver;

use super::disagg::PdPlan;
use super::engine::Engine;
use super::model::Event;
use super::requests::{
    ApiKind, NUMBERED_TOKEN_ID, ParsedRequest, TOKEN_ID, TOKEN_TEXT, numbered_ids, numbered_token,
    numbered_words, parse_request,
};
use super::snapshot::Timing;

/// An OpenAI-shaped error: `{"error":{"message","type","code"}}`.
pub(crate) fn error_response(
    status: StatusCode,
    message: &str,
    kind: &str,
    code: &str,
) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "code": code}});
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The 503 answered by the fault knobs.
pub(crate) fn unavailable(engine: &Engine, why: &str) -> Response {
    engine.count_failed();
    error_response(
        StatusCode::SERVICE_UNAVAILABLE,
        why,
        "service_unavailable",
        "mock_fault",
    )
}

pub(crate) async fn chat(State(e): State<Arc<Engine>>, h: HeaderMap, body: Bytes) -> Response {
    infer(e, ApiKind::Chat, h, body).await
}

pub(crate) async fn completions(
    State(e): State<Arc<Engine>>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    infer(e, ApiKind::Completion, h, body).await
}

pub(crate) async fn generate(State(e): State<Arc<Engine>>, h: HeaderMap, body: Bytes) -> Response {
    infer(e, ApiKind::Generate, h, body).await
}

pub(crate) async fn responses(State(e): State<Arc<Engine>>, h: HeaderMap, body: Bytes) -> Response {
    infer(e, ApiKind::Responses, h, body).await
}

pub(crate) async fn embeddings(
    State(e): State<Arc<Engine>>,
    h: HeaderMap,
    body: Bytes,
) -> Response {
    infer(e, ApiKind::Embeddings, h, body).await
}

/// A small deterministic embedding of `text` (8 floats).
fn embedding_of(text: &str) -> Vec<f64> {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    (0..8)
        .map(|i| {
            for b in text.bytes().chain([i as u8]) {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
            (h % 2_000) as f64 / 1_000.0 - 1.0
        })
        .collect()
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

async fn infer(engine: Arc<Engine>, kind: ApiKind, headers: HeaderMap, body: Bytes) -> Response {
    let cfg = engine.config();
    if cfg.fail_rate > 0.0 && rand::random::<f64>() < cfg.fail_rate {
        return unavailable(&engine, "engine unavailable (mock --fail-rate)");
    }
    let req = match parse_request(kind, &body, cfg.default_max_tokens) {
        Ok(r) if r.stream && kind == ApiKind::Embeddings => {
            engine.count_rejected();
            return error_response(
                StatusCode::BAD_REQUEST,
                "embeddings do not stream",
                "invalid_request_error",
                "invalid_request",
            );
        }
        Ok(r) => r,
        Err(msg) => {
            engine.count_rejected();
            return error_response(
                StatusCode::BAD_REQUEST,
                &msg,
                "invalid_request_error",
                "invalid_request",
            );
        }
    };
    let limit = cfg.max_request_tokens();
    if req.prompt_tokens + req.max_tokens > limit {
        engine.count_rejected();
        let msg = format!(
            "prompt ({} tokens) plus max_tokens ({}) exceeds the context limit ({limit} tokens)",
            req.prompt_tokens, req.max_tokens
        );
        return error_response(
            StatusCode::BAD_REQUEST,
            &msg,
            "invalid_request_error",
            "context_length_exceeded",
        );
    }
    let blocks = match engine.prompt_blocks(&req) {
        Ok(b) => b,
        Err(msg) => {
            engine.count_rejected();
            return error_response(
                StatusCode::BAD_REQUEST,
                &msg,
                "invalid_request_error",
                "invalid_prompt",
            );
        }
    };
    let id = engine.next_request_id();
    let client_id = headers
        .get("x-request-id")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let wait = std::time::Duration::from_millis(cfg.pd_handoff_timeout_ms);
    let plan = match engine
        .pd
        .plan(cfg.pd_role, &body, req.max_tokens, req.stream, wait)
        .await
    {
        Ok(plan) => plan,
        Err((status, msg)) => {
            engine.count_rejected();
            return error_response(status, &msg, "invalid_request_error", "disaggregation");
        }
    };
    let remote = plan == PdPlan::RemoteDecode;
    // A prefill engine computes the prompt and one token; the decode
    // engine generates the answer.
    let max_tokens = match plan {
        PdPlan::Prefill { .. } => 1,
        _ => req.max_tokens,
    };
    let rx = engine.submit(id, client_id, req.prompt_tokens, max_tokens, blocks, remote);
    if let PdPlan::Prefill { key, vllm } = plan {
        let frames = Frames::new(&req, id, &cfg.model_name);
        return prefill_response(engine.clone(), rx, frames, id, key, vllm, req.stream).await;
    }
    let mut frames = Frames::new(&req, id, &cfg.model_name);
    if cfg.numbered_output {
        frames.numbered_from = Some(continued_words(&req));
    }
    if req.stream {
        stream_response(rx, frames, id)
    } else {
        full_response(rx, frames, id).await
    }
}

/// The numbered words a continuation already holds (0 for a fresh reply):
/// an open assistant turn's, or a completions prompt's.
fn continued_words(req: &ParsedRequest) -> u64 {
    match req.kind {
        ApiKind::Chat if req.continues_final_message => req
            .messages
            .last()
            .map_or(0, |(_, content)| numbered_words(content)),
        ApiKind::Completion => match &req.prompt_ids {
            Some(ids) => numbered_ids(ids),
            None => numbered_words(&req.prompt_text),
        },
        _ => 0,
    }
}

/// A prefill engine's answer: the KV is handed over under `key` (vLLM:
/// under the request's own key, named in `kv_transfer_params`) once the
/// prefill is done, then the answer is sent as usual.
async fn prefill_response(
    engine: Arc<Engine>,
    mut rx: UnboundedReceiver<Event>,
    frames: Frames,
    id: u64,
    key: String,
    vllm: bool,
    stream: bool,
) -> Response {
    let (tx, relay) = tokio::sync::mpsc::unbounded_channel();
    let key = if vllm { engine.pd.vllm_key(id) } else { key };
    let prompt_tokens = frames.prompt_tokens;
    let handoff = engine.clone();
    tokio::spawn(async move {
        while let Some(event) = rx.recv().await {
            if matches!(event, Event::Done(_)) {
                handoff.pd.store(key.clone(), prompt_tokens);
            }
            if tx.send(event).is_err() {
                break;
            }
        }
    });
    if stream {
        return stream_response(relay, frames, id);
    }
    let response = full_response(relay, frames, id).await;
    if !vllm || response.status() != StatusCode::OK {
        return response;
    }
    let (parts, body) = response.into_parts();
    let Ok(bytes) = axum::body::to_bytes(body, usize::MAX).await else {
        return unavailable(&engine, "prefill answer lost");
    };
    let Ok(mut v) = serde_json::from_slice::<serde_json::Value>(&bytes) else {
        return unavailable(&engine, "prefill answer is not JSON");
    };
    v["kv_transfer_params"] = engine.pd.vllm_params(id, prompt_tokens);
    Response::from_parts(parts, Body::from(v.to_string()))
}

fn header_num(v: impl ToString) -> HeaderValue {
    HeaderValue::from_str(&v.to_string()).unwrap_or(HeaderValue::from_static("0"))
}

async fn full_response(mut rx: UnboundedReceiver<Event>, f: Frames, id: u64) -> Response {
    let timing = loop {
        match rx.recv().await {
            Some(Event::Tokens(_)) => {}
            Some(Event::Done(t)) => break t,
            None => {
                return error_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "engine stopped",
                    "service_unavailable",
                    "engine_stopped",
                );
            }
        }
    };
    let text = f.output_text(0, timing.output_tokens);
    let usage = f.usage(&timing);
    let body = match f.kind {
        ApiKind::Chat => json!({
            "id": format!("chatcmpl-mock-{id}"), "object": "chat.completion", "created": f.created,
            "model": f.model,
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text},
                         "logprobs": null, "finish_reason": "length"}],
            "usage": usage,
        }),
        ApiKind::Completion => json!({
            "id": format!("cmpl-mock-{id}"), "object": "text_completion", "created": f.created,
            "model": f.model,
            "choices": [{"index": 0, "text": text, "logprobs": null, "finish_reason": "length"}],
            "usage": usage,
        }),
        ApiKind::Generate => json!({"text": text, "meta_info": f.meta_info(&timing, true)}),
        ApiKind::Responses => f.response_object(&text, &timing),
        ApiKind::Embeddings => json!({
            "object": "list", "model": f.model,
            "data": [{"object": "embedding", "index": 0, "embedding": embedding_of(&f.prompt)}],
            "usage": {"prompt_tokens": timing.prompt_tokens, "total_tokens": timing.prompt_tokens},
        }),
    };
    let mut resp = (
        StatusCode::OK,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response();
    let h = resp.headers_mut();
    h.insert("x-mock-request-id", header_num(id));
    h.insert(
        "x-mock-queue-ms",
        header_num(format!("{:.3}", timing.queue_ms)),
    );
    h.insert(
        "x-mock-ttft-ms",
        header_num(format!("{:.3}", timing.ttft_ms)),
    );
    h.insert("x-mock-e2e-ms", header_num(format!("{:.3}", timing.e2e_ms)));
    h.insert("x-mock-cached-tokens", header_num(timing.cached_tokens));
    resp
}

fn stream_response(rx: UnboundedReceiver<Event>, frames: Frames, id: u64) -> Response {
    let stream =
        futures_util::stream::unfold((rx, frames, false), |(mut rx, mut f, done)| async move {
            if done {
                return None;
            }
            match rx.recv().await {
                Some(Event::Tokens(n)) => {
                    let b = f.token_frame(n);
                    Some((Ok::<Bytes, Infallible>(b), (rx, f, false)))
                }
                Some(Event::Done(t)) => {
                    let b = f.final_frames(&t);
                    Some((Ok(b), (rx, f, true)))
                }
                None => None,
            }
        });
    let mut resp = Response::new(Body::from_stream(stream));
    let h = resp.headers_mut();
    h.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert("x-mock-request-id", header_num(id));
    resp
}

/// Renders SSE frames and bodies for one request.
struct Frames {
    kind: ApiKind,
    id: u64,
    created: u64,
    model: String,
    include_usage: bool,
    /// JSON prefix shared by every OpenAI chunk (ends inside `"choices":[`).
    head: String,
    sent: u64,
    /// Cumulative text, for SGLang `/generate` and Responses streams.
    text: String,
    /// The prompt text (what an embedding is computed from).
    prompt: String,
    /// `--numbered-output`: the number of the reply's first token.
    numbered_from: Option<u64>,
    /// The prompt's tokens (what a prefill hands over).
    prompt_tokens: u64,
    /// `return_token_ids` on a completions stream: the prompt's ids, to
    /// name in the first chunk (given ones, or made up one per token).
    prompt_ids: Option<Vec<u64>>,
}

impl Frames {
    fn new(req: &ParsedRequest, id: u64, model: &str) -> Self {
        let created = unix_now();
        let model_json = serde_json::to_string(model).unwrap_or_else(|_| "\"mock\"".to_string());
        let (prefix, object) = match req.kind {
            ApiKind::Chat => ("chatcmpl", "chat.completion.chunk"),
            _ => ("cmpl", "text_completion"),
        };
        let head = format!(
            "{{\"id\":\"{prefix}-mock-{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model_json},\"choices\":["
        );
        Self {
            kind: req.kind,
            id,
            created,
            model: model.to_string(),
            include_usage: req.include_usage,
            head,
            sent: 0,
            text: String::new(),
            prompt: req.prompt_text.clone(),
            numbered_from: None,
            prompt_tokens: req.prompt_tokens,
            prompt_ids: (req.return_token_ids && req.kind == ApiKind::Completion).then(|| {
                req.prompt_ids
                    .clone()
                    .unwrap_or_else(|| (0..req.prompt_tokens).map(|i| 1000 + i % 30_000).collect())
            }),
        }
    }

    /// The token ids of output tokens `from..from + n`.
    fn output_ids(&self, from: u64, n: u64) -> Vec<u64> {
        match self.numbered_from {
            None => vec![TOKEN_ID; n as usize],
            Some(start) => (from..from + n)
                .map(|k| NUMBERED_TOKEN_ID + start + k)
                .collect(),
        }
    }

    /// A completions chunk's token-id fields (`return_token_ids`), or
    /// nothing: the prompt's ids on the first chunk, the chunk's own ids.
    fn id_fields(&self, from: u64, n: u64) -> String {
        let Some(prompt) = &self.prompt_ids else {
            return String::new();
        };
        let prompt = match from {
            0 => json!(prompt),
            _ => serde_json::Value::Null,
        };
        format!(
            ",\"prompt_token_ids\":{prompt},\"token_ids\":{}",
            json!(self.output_ids(from, n))
        )
    }

    /// The text of output tokens `from..from + n`.
    fn output_text(&self, from: u64, n: u64) -> String {
        match self.numbered_from {
            None => TOKEN_TEXT.repeat(n as usize),
            Some(start) => (from..from + n)
                .map(|k| numbered_token(start + k))
                .collect(),
        }
    }

    /// A Responses API `response` object holding `text`.
    fn response_object(&self, text: &str, t: &Timing) -> serde_json::Value {
        json!({
            "id": format!("resp_mock_{}", self.id), "object": "response",
            "created_at": self.created, "status": "completed", "model": self.model,
            "output": [{"type": "message", "id": format!("msg_mock_{}", self.id),
                "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}],
            "usage": {"input_tokens": t.prompt_tokens, "output_tokens": t.output_tokens,
                "total_tokens": t.prompt_tokens + t.output_tokens,
                "input_tokens_details": {"cached_tokens": t.cached_tokens},
                "output_tokens_details": {"reasoning_tokens": 0}},
            "parallel_tool_calls": true, "tool_choice": "auto", "tools": [],
        })
    }

    fn usage(&self, t: &Timing) -> serde_json::Value {
        json!({
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.output_tokens,
            "total_tokens": t.prompt_tokens + t.output_tokens,
            "prompt_tokens_details": {"cached_tokens": t.cached_tokens},
        })
    }

    fn meta_info(&self, t: &Timing, finished: bool) -> serde_json::Value {
        let finish = if finished {
            json!({"type": "length", "length": t.output_tokens})
        } else {
            serde_json::Value::Null
        };
        json!({
            "id": self.id.to_string(),
            "finish_reason": finish,
            "prompt_tokens": t.prompt_tokens,
            "completion_tokens": t.output_tokens,
            "cached_tokens": t.cached_tokens,
            "e2e_latency": t.e2e_ms / 1000.0,
        })
    }

    fn token_frame(&mut self, n: u32) -> Bytes {
        let piece = self.output_text(self.sent, u64::from(n));
        let ids = self.id_fields(self.sent, u64::from(n));
        let first = self.sent == 0;
        self.sent += u64::from(n);
        let s = match self.kind {
            ApiKind::Chat => {
                let role = if first { "\"role\":\"assistant\"," } else { "" };
                format!(
                    "data: {}{{\"index\":0,\"delta\":{{{role}\"content\":\"{piece}\"}},\"logprobs\":null,\"finish_reason\":null}}]}}\n\n",
                    self.head
                )
            }
            ApiKind::Completion => format!(
                "data: {}{{\"index\":0,\"text\":\"{piece}\",\"logprobs\":null,\"finish_reason\":null{ids}}}]}}\n\n",
                self.head
            ),
            ApiKind::Generate => {
                self.text.push_str(&piece);
                let v = json!({"text": self.text, "meta_info": {
                    "id": self.id.to_string(), "finish_reason": null, "completion_tokens": self.sent}});
                format!("data: {v}\n\n")
            }
            ApiKind::Responses => {
                self.text.push_str(&piece);
                let mut out = String::new();
                if first {
                    let created = json!({"type": "response.created", "sequence_number": 0,
                        "response": {"id": format!("resp_mock_{}", self.id), "object": "response",
                            "created_at": self.created, "status": "in_progress",
                            "model": self.model, "output": []}});
                    out.push_str(&format!("event: response.created\ndata: {created}\n\n"));
                }
                let v = json!({"type": "response.output_text.delta", "sequence_number": self.sent,
                    "item_id": format!("msg_mock_{}", self.id), "output_index": 0,
                    "content_index": 0, "delta": piece});
                out.push_str(&format!("event: response.output_text.delta\ndata: {v}\n\n"));
                out
            }
            ApiKind::Embeddings => String::new(),
        };
        Bytes::from(s)
    }

    fn final_frames(&mut self, t: &Timing) -> Bytes {
        let mut s = String::new();
        match self.kind {
            ApiKind::Chat | ApiKind::Completion => {
                let choice = if self.kind == ApiKind::Chat {
                    "{\"index\":0,\"delta\":{},\"logprobs\":null,\"finish_reason\":\"length\"}"
                } else {
                    "{\"index\":0,\"text\":\"\",\"logprobs\":null,\"finish_reason\":\"length\"}"
                };
                s.push_str(&format!("data: {}{choice}]}}\n\n", self.head));
                if self.include_usage {
                    s.push_str(&format!(
                        "data: {}],\"usage\":{}}}\n\n",
                        self.head,
                        self.usage(t)
                    ));
                }
            }
            ApiKind::Generate => {
                let v = json!({"text": self.text, "meta_info": self.meta_info(t, true)});
                s.push_str(&format!("data: {v}\n\n"));
            }
            ApiKind::Responses => {
                let v = json!({"type": "response.completed", "sequence_number": self.sent + 1,
                    "response": self.response_object(&self.text, t)});
                // The Responses API ends with its completed event, no [DONE].
                s.push_str(&format!("event: response.completed\ndata: {v}\n\n"));
                return Bytes::from(s);
            }
            ApiKind::Embeddings => {}
        }
        s.push_str("data: [DONE]\n\n");
        Bytes::from(s)
    }
}
