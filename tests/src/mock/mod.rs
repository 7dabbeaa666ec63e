//! A mock LLM inference engine: a cheap continuous-batching model (KV cache,
//! waiting queue, chunked prefill, batch-dependent decode steps, LRU prefix
//! cache) behind OpenAI/SGLang inference routes and the load endpoints of
//! SGLang, vLLM or llama.cpp. Many engines can run in one process.
//!
//! ```no_run
//! # async fn demo() -> std::io::Result<()> {
//! use shoal_tests::mock::{EngineConfig, Flavor, spawn_engine};
//! let cfg = EngineConfig { flavor: Flavor::Sglang, time_scale: 10.0, ..EngineConfig::default() };
//! let engine = spawn_engine(cfg, "127.0.0.1:0".parse().map_err(std::io::Error::other)?).await?;
//! println!("{}", engine.url());
//! engine.shutdown().await;
//! # Ok(()) }
//! ```
//!
//! Model rules (details in the submodules):
//! - prompt tokens = `ceil(chars / 4)` of the prompt text (chat: all message
//!   contents concatenated), at least 1; output tokens = `max_completion_tokens`
//!   / `max_tokens` / `sampling_params.max_new_tokens`, else
//!   `--default-max-tokens`, always generated in full (`"tok "` per token);
//! - step time (model ms) = `decode_base_ms + decode_per_req_ms * batch +
//!   1000 * prefill_tokens / prefill_tps`, wall time = model time / `time_scale`;
//! - a request is admitted FIFO when a running slot is free and the KV cache
//!   holds its prompt; its KV grows by one token per output token and is freed
//!   when it finishes or its client disconnects; overflow preempts the newest;
//! - the prefix cache is an LRU of chained hashes of 64-character blocks, so a
//!   repeated prefix skips its prefill; with a tokenizer (`--tokenizer`) the
//!   blocks are `--kv-block-size` token ids instead, and the cached share of
//!   the tokenized prompt is the cached share of its prompt tokens;
//! - with `--kv-events-port` the engine publishes its cache changes as
//!   vLLM/SGLang KV-cache events over ZMQ, with an optional replay socket
//!   (`kv_events`).
//!
//! Besides the engine routes every engine serves `GET /stats[?since=SEQ]`
//! (snapshot, counters, `load_polls` — hits on the load endpoints —, the
//! KV-event endpoints and counters, and recent per-request timing),
//! `POST /reset_prefix_cache` (vLLM's), with a tokenizer vLLM's
//! `POST /tokenize` (vLLM flavor), and
//! `POST /mock/fault {"mode":"none|hang|die|garbage_metrics|fail"}`; and,
//! for disaggregated fleets (`--pd-role`, `disagg`), SGLang's
//! `GET /server_info`, `GET /mock/pd` (handoff counters) and the KV
//! handoff a decode engine fetches, `GET /mock/pd/handoff`.

mod chat_template;
mod config;
mod disagg;
mod engine;
mod formats;
mod http;
mod kv_events;
mod kv_wire;
mod model;
mod openai;
mod prefix_cache;
mod requests;
mod server;
mod snapshot;
mod tokenize;
mod tokens;

pub use chat_template::ChatTemplate;
pub use config::{
    ConfigError, DEFAULT_KV_BLOCK_SIZE, DEFAULT_KV_EVENTS_BUFFER_STEPS, DEFAULT_MODEL,
    DEFAULT_PD_HANDOFF_TIMEOUT_MS, EngineConfig, Flavor,
};
pub use disagg::{PdCounters, PdRole, PdState};
pub use engine::{Engine, FaultMode};
pub use formats::{c_g6, iso_timestamp, prom_float};
pub use kv_events::{KvEventsInfo, KvStats, KvStatsView, REPLAY_END_SEQ, parse_replay_request};
pub use kv_wire::{KvEvent, KvEventsFormat, encode_batch, event_value};
pub use prefix_cache::{CacheChanges, PrefixCache, block_hashes};
pub use requests::{ApiKind, ParsedRequest, TOKEN_TEXT, parse_request, prompt_tokens_for};
pub use server::{EngineHandle, spawn_engine, spawn_engine_on, spawn_engines};
pub use snapshot::{BusySlot, Counters, ModelSnapshot, RequestRecord, Timing};
pub use tokens::{Blocker, PromptBlocks, load_tokenizer, token_block_hash, token_block_hashes};
