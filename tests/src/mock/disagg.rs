//! Prefill/decode disaggregation, as far as a router can tell: an engine
//! started with `--pd-role prefill` or `--pd-role decode` speaks both
//! engines' protocols.
//!
//! - **SGLang** (bootstrap): the router sends the same request to a
//!   prefill and a decode engine at once, with `bootstrap_host`,
//!   `bootstrap_port` and `bootstrap_room` added. The prefill engine runs
//!   the prefill and leaves a KV handoff under the room; the decode engine
//!   fetches it from `http://bootstrap_host:bootstrap_port` (here the
//!   prefill engine's own port, which its `GET /server_info` reports as
//!   `disaggregation_bootstrap_port`, as SGLang's does), waiting up to
//!   `--pd-handoff-timeout-ms`, and fails the request with 500 if it never
//!   comes.
//! - **vLLM** (`kv_transfer_params`, NIXL-style): the router first sends
//!   the prefill engine the request with `kv_transfer_params.do_remote_decode
//!   = true`, `max_tokens = 1` and `stream = false` (anything else is a
//!   400); its answer carries `kv_transfer_params` naming the blocks
//!   (`remote_engine_id`, `remote_request_id`, `remote_host`,
//!   `remote_port`, ...). The router then sends the decode engine the
//!   original request with those params; it fetches the blocks at once. A
//!   decode request whose params lack a key recomputes the prefill locally
//!   (counted), as vLLM does; one with no params is an ordinary request.
//!
//! A decode engine that got its KV skips the prefill (all but one prompt
//! token count as cached). `GET /mock/pd` shows the counters.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use tokio::sync::Notify;

use crate::client::HttpClient;

/// What part of a disaggregated fleet an engine plays (`--pd-role`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PdRole {
    /// An ordinary engine.
    #[default]
    None,
    /// Runs prefills and hands their KV over.
    Prefill,
    /// Takes KV from a prefill engine and decodes.
    Decode,
}

impl PdRole {
    /// SGLang's `disaggregation_mode` for this role.
    pub fn mode(self) -> &'static str {
        match self {
            PdRole::None => "null",
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        }
    }
}

impl std::fmt::Display for PdRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            PdRole::None => "none",
            PdRole::Prefill => "prefill",
            PdRole::Decode => "decode",
        })
    }
}

impl std::str::FromStr for PdRole {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "none" => Ok(PdRole::None),
            "prefill" => Ok(PdRole::Prefill),
            "decode" => Ok(PdRole::Decode),
            other => Err(format!(
                "unknown role {other:?} (expected none, prefill or decode)"
            )),
        }
    }
}

/// Handoffs older than this are dropped (vLLM frees unread blocks after a
/// timeout too).
const HANDOFF_TTL: Duration = Duration::from_secs(60);

/// A prefill's KV, waiting for its decode engine.
#[derive(Debug, Clone, Copy)]
struct Handoff {
    prompt_tokens: u64,
    stored: Instant,
}

/// Counters of one engine's handoffs (`GET /mock/pd`).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PdCounters {
    /// The engine's role.
    pub role: String,
    /// Prefills whose KV this engine handed over (prefill role).
    pub stored: u64,
    /// Handoffs fetched from this engine (prefill role).
    pub served: u64,
    /// Decodes that got their KV from a prefill engine (decode role).
    pub received: u64,
    /// Decodes that recomputed the prefill (vLLM params missing a key).
    pub recomputed: u64,
    /// Decodes failed because the handoff never came (decode role).
    pub missing: u64,
    /// Decodes served without any disaggregation fields (decode role).
    pub local: u64,
}

/// One engine's disaggregation state.
#[derive(Debug, Default)]
pub struct PdState {
    addr: OnceLock<SocketAddr>,
    handoffs: Mutex<HashMap<String, Handoff>>,
    arrived: Notify,
    stored: AtomicU64,
    served: AtomicU64,
    received: AtomicU64,
    recomputed: AtomicU64,
    missing: AtomicU64,
    local: AtomicU64,
    client: OnceLock<HttpClient>,
}

/// How an inference request runs on this engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PdPlan {
    /// As on any engine.
    Plain,
    /// A prefill whose KV is handed over under the key (vLLM's answer
    /// also names it in `kv_transfer_params`).
    Prefill { key: String, vllm: bool },
    /// A decode whose KV came from a prefill engine.
    RemoteDecode,
}

/// A request this engine refuses: the status and message.
pub(crate) type PdError = (StatusCode, String);

fn bad(msg: impl Into<String>) -> PdError {
    (StatusCode::BAD_REQUEST, msg.into())
}

/// A bootstrap room: a number, or the first of an array (a batch).
fn room_of(v: &Value) -> Option<u64> {
    match v {
        Value::Array(a) => a.first().and_then(Value::as_u64),
        v => v.as_u64(),
    }
}

/// Like [`room_of`] for a host or port field.
fn first(v: &Value) -> &Value {
    match v {
        Value::Array(a) => a.first().unwrap_or(&Value::Null),
        v => v,
    }
}

impl PdState {
    /// Records where the engine listens (its bootstrap address).
    pub(crate) fn set_addr(&self, addr: SocketAddr) {
        let _ = self.addr.set(addr);
    }

    /// The engine's port (0 before it listens).
    pub fn port(&self) -> u16 {
        self.addr.get().map_or(0, SocketAddr::port)
    }

    /// vLLM's `remote_engine_id` of this engine.
    fn engine_id(&self) -> String {
        format!("mock-engine-{}", self.port())
    }

    /// The counters, for `GET /mock/pd`.
    pub fn counters(&self, role: PdRole) -> PdCounters {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        PdCounters {
            role: role.mode().to_string(),
            stored: get(&self.stored),
            served: get(&self.served),
            received: get(&self.received),
            recomputed: get(&self.recomputed),
            missing: get(&self.missing),
            local: get(&self.local),
        }
    }

    /// SGLang's `GET /server_info` fields for a `role` engine.
    pub fn server_info(&self, role: PdRole) -> Value {
        json!({
            "disaggregation_mode": role.mode(),
            "disaggregation_bootstrap_port": self.port(),
        })
    }

    fn table(&self) -> std::sync::MutexGuard<'_, HashMap<String, Handoff>> {
        self.handoffs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Leaves a finished prefill's KV under `key`.
    pub(crate) fn store(&self, key: String, prompt_tokens: u64) {
        let now = Instant::now();
        let mut table = self.table();
        table.retain(|_, h| now.duration_since(h.stored) < HANDOFF_TTL);
        table.insert(
            key,
            Handoff {
                prompt_tokens,
                stored: now,
            },
        );
        drop(table);
        self.stored.fetch_add(1, Ordering::Relaxed);
        self.arrived.notify_waiters();
    }

    /// Takes the handoff under `key`, waiting up to `wait` for it (the
    /// bootstrap endpoint a decode engine calls): its prompt tokens.
    pub async fn take(&self, key: &str, wait: Duration) -> Option<u64> {
        let deadline = tokio::time::Instant::now() + wait;
        loop {
            let arrived = self.arrived.notified();
            if let Some(h) = self.table().remove(key) {
                self.served.fetch_add(1, Ordering::Relaxed);
                return Some(h.prompt_tokens);
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                return None;
            }
        }
    }

    /// The key a vLLM prefill of request `id` hands its KV over under.
    pub(crate) fn vllm_key(&self, id: u64) -> String {
        format!("req:{}:{id}", self.engine_id())
    }

    /// vLLM's `kv_transfer_params` answer of the prefill of request `id`.
    pub(crate) fn vllm_params(&self, id: u64, prompt_tokens: u64) -> Value {
        let host = self
            .addr
            .get()
            .map_or("127.0.0.1".to_string(), |a| a.ip().to_string());
        json!({
            "do_remote_prefill": true, "do_remote_decode": false,
            "remote_engine_id": self.engine_id(),
            "remote_request_id": id.to_string(),
            "remote_block_ids": (0..prompt_tokens.div_ceil(16)).collect::<Vec<u64>>(),
            "remote_host": host, "remote_port": self.port(), "tp_size": 1,
        })
    }

    /// How a request with `body` runs on a `role` engine, fetching a
    /// decode's KV first (waiting up to `wait` for an SGLang handoff); an
    /// error is the answer to send instead.
    pub(crate) async fn plan(
        &self,
        role: PdRole,
        body: &[u8],
        max_tokens: u64,
        stream: bool,
        wait: Duration,
    ) -> Result<PdPlan, PdError> {
        if role == PdRole::None {
            return Ok(PdPlan::Plain);
        }
        let v: Value = serde_json::from_slice(body).map_err(|e| bad(e.to_string()))?;
        let params = v.get("kv_transfer_params").filter(|p| p.is_object());
        let room = v.get("bootstrap_room").and_then(room_of);
        match role {
            PdRole::None => Ok(PdPlan::Plain),
            PdRole::Prefill => match (room, params) {
                (Some(room), _) => Ok(PdPlan::Prefill {
                    key: format!("room:{room}"),
                    vllm: false,
                }),
                (None, Some(p)) if p["do_remote_decode"] == true => {
                    if max_tokens != 1 || stream {
                        return Err(bad(
                            "a vLLM prefill request must have max_tokens 1 and stream false",
                        ));
                    }
                    Ok(PdPlan::Prefill {
                        key: String::new(),
                        vllm: true,
                    })
                }
                _ => Err(bad(
                    "a prefill engine needs bootstrap_room (SGLang) or kv_transfer_params.do_remote_decode (vLLM)",
                )),
            },
            PdRole::Decode => match (room, params) {
                (Some(room), _) => {
                    let host = first(&v["bootstrap_host"]).as_str().unwrap_or_default();
                    let port = first(&v["bootstrap_port"]).as_u64().unwrap_or(0);
                    self.fetch(host, port, &format!("room:{room}"), wait).await
                }
                (None, Some(p)) if p["do_remote_prefill"] == true => {
                    let keys = [
                        "remote_engine_id",
                        "remote_request_id",
                        "remote_host",
                        "remote_port",
                    ];
                    if keys.iter().any(|k| p.get(*k).is_none_or(Value::is_null)) {
                        self.recomputed.fetch_add(1, Ordering::Relaxed);
                        return Ok(PdPlan::Plain);
                    }
                    let as_text =
                        |v: &Value| v.as_str().map_or_else(|| v.to_string(), str::to_string);
                    let key = format!(
                        "req:{}:{}",
                        as_text(&p["remote_engine_id"]),
                        as_text(&p["remote_request_id"])
                    );
                    let host = p["remote_host"].as_str().unwrap_or_default();
                    let port = p["remote_port"].as_u64().unwrap_or(0);
                    self.fetch(host, port, &key, Duration::from_millis(500))
                        .await
                }
                _ => {
                    self.local.fetch_add(1, Ordering::Relaxed);
                    Ok(PdPlan::Plain)
                }
            },
        }
    }

    /// Fetches the handoff `key` from the prefill engine at `host:port`.
    async fn fetch(
        &self,
        host: &str,
        port: u64,
        key: &str,
        wait: Duration,
    ) -> Result<PdPlan, PdError> {
        let client = self.client.get_or_init(HttpClient::new);
        let url = format!(
            "http://{host}:{port}/mock/pd/handoff?key={key}&wait_ms={}",
            wait.as_millis()
        );
        let got = tokio::time::timeout(wait + Duration::from_secs(2), client.get(&url)).await;
        match got {
            Ok(Ok(r)) if r.status == 200 => {
                self.received.fetch_add(1, Ordering::Relaxed);
                Ok(PdPlan::RemoteDecode)
            }
            other => {
                self.missing.fetch_add(1, Ordering::Relaxed);
                let why = match other {
                    Ok(Ok(r)) => format!("answered {}", r.status),
                    Ok(Err(e)) => e.to_string(),
                    Err(_) => "timed out".to_string(),
                };
                Err((
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("KV handoff {key} never came from {host}:{port} ({why})"),
                ))
            }
        }
    }
}
