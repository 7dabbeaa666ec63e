//! `precise_prefix` flags: where engines publish their KV-cache events,
//! how prompts become token blocks, and the policy's load bound.

use std::path::PathBuf;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the `precise_prefix` knobs; the policy catalog names it.
pub const PRECISE_PREFIX_FLAGS: &str = "Policy precise_prefix";

/// The `precise_prefix` knobs (see the policy's and `kv_events`' docs).
#[derive(Debug, Clone, PartialEq, Args)]
#[command(next_help_heading = PRECISE_PREFIX_FLAGS)]
pub struct KvEventsConfig {
    /// precise_prefix: port of each worker's KV-event PUB socket (vLLM/SGLang `--kv-events-config` endpoint), on the worker URL's host; unset: none, unless discovery finds the EndpointSlice ports `kv-events` / `kv-events-replay` (workers without events fall back to prefix_affinity).
    #[arg(long, env = "SHOAL_KV_EVENTS_PORT")]
    pub kv_events_port: Option<u16>,

    /// precise_prefix: port of each worker's KV-event replay (ROUTER) socket, used to warm up and to fill gaps; unset: no replay.
    #[arg(long, env = "SHOAL_KV_EVENTS_REPLAY_PORT")]
    pub kv_events_replay_port: Option<u16>,

    /// precise_prefix: one worker's event sockets, overriding the ports above for it: `WORKER_URL=tcp://HOST:PORT` or `WORKER_URL=tcp://HOST:PORT|tcp://HOST:REPLAY_PORT`; repeatable (several engines on one host).
    #[arg(long, env = "SHOAL_KV_EVENTS_ENDPOINT", value_name = "URL=EVENTS[|REPLAY]", value_parser = parsers::kv_events_endpoint)]
    pub kv_events_endpoint: Vec<(String, String, Option<String>)>,

    /// precise_prefix: data-parallel ranks behind each worker URL; rank r publishes on both ports + r (vLLM's offset).
    #[arg(long, env = "SHOAL_KV_EVENTS_DP_RANKS", default_value_t = defaults::KV_EVENTS_DP_RANKS, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub kv_events_dp_ranks: u32,

    /// precise_prefix: tokens per KV block, as the engines run (vLLM --block-size, SGLang --page-size); events of another size are skipped and counted.
    #[arg(long, env = "SHOAL_KV_BLOCK_SIZE", default_value_t = defaults::KV_BLOCK_SIZE, value_parser = parsers::positive_usize)]
    pub kv_block_size: usize,

    /// precise_prefix: tokenizer.json to split prompts into tokens with, as `PATH` (every model) or `MODEL=PATH`; repeatable.
    #[arg(
        long,
        env = "SHOAL_KV_TOKENIZER",
        value_delimiter = ',',
        value_name = "[MODEL=]PATH"
    )]
    pub kv_tokenizer: Vec<String>,

    /// precise_prefix: the chat template chat requests are rendered with before tokenizing, as the engine renders them: a tokenizer_config.json (its chat_template, bos/eos tokens) or a Jinja file, as `PATH` (every model) or `MODEL=PATH`; repeatable. Unset: message contents are tokenized as they are (matches an engine only for completions).
    #[arg(
        long,
        env = "SHOAL_KV_CHAT_TEMPLATE",
        value_delimiter = ',',
        value_name = "[MODEL=]PATH"
    )]
    pub kv_chat_template: Vec<String>,

    /// precise_prefix: for a model no --kv-tokenizer serves, ask one of its engines to tokenize each prompt (vLLM's POST /tokenize; chat requests as messages, so the engine applies its own chat template): exact tokens for one engine round trip per request. Off: such prompts match no cache.
    #[arg(long, env = "SHOAL_KV_TOKENIZE_ON_ENGINE")]
    pub kv_tokenize_on_engine: bool,

    /// precise_prefix: blocks the index keeps per engine rank; past it new blocks are not indexed (counted).
    #[arg(long, env = "SHOAL_KV_INDEX_MAX_BLOCKS_PER_ENGINE", default_value_t = defaults::KV_INDEX_MAX_BLOCKS_PER_ENGINE, value_parser = parsers::positive_usize)]
    pub kv_index_max_blocks_per_engine: usize,

    /// precise_prefix: a worker may take a request while its wait and in-flight requests are at most (1 + this) × the mean (plus the request's own) (>= 0).
    #[arg(long, env = "SHOAL_PRECISE_PREFIX_EPSILON", default_value_t = defaults::PRECISE_PREFIX_EPSILON, value_parser = parsers::non_negative)]
    pub precise_prefix_epsilon: f64,

    /// precise_prefix: seconds of queue one second of prefill saved by a cached prefix is worth (>= 0; 0 ignores the cache, 1 = the request's own TTFT alone; more also counts the work a miss adds for the requests queued behind it).
    #[arg(long, env = "SHOAL_PRECISE_PREFIX_CACHE_WEIGHT", default_value_t = defaults::PRECISE_PREFIX_CACHE_WEIGHT, value_parser = parsers::non_negative)]
    pub precise_prefix_cache_weight: f64,
}

impl KvEventsConfig {
    /// The tokenizer files by model (`None`: the one for every model).
    pub fn tokenizers(&self) -> Vec<(Option<String>, PathBuf)> {
        by_model(&self.kv_tokenizer)
    }

    /// The chat template files by model (`None`: the one for every model).
    pub fn chat_templates(&self) -> Vec<(Option<String>, PathBuf)> {
        by_model(&self.kv_chat_template)
    }
}

/// `[MODEL=]PATH` entries as (model, path).
fn by_model(entries: &[String]) -> Vec<(Option<String>, PathBuf)> {
    entries
        .iter()
        .map(|entry| match entry.split_once('=') {
            Some((model, path)) => (Some(model.to_string()), PathBuf::from(path)),
            None => (None, PathBuf::from(entry)),
        })
        .collect()
}

impl Default for KvEventsConfig {
    /// The flag defaults, for tests that build the policy without flags.
    fn default() -> Self {
        Self {
            kv_events_port: None,
            kv_events_replay_port: None,
            kv_events_endpoint: Vec::new(),
            kv_events_dp_ranks: defaults::KV_EVENTS_DP_RANKS,
            kv_block_size: defaults::KV_BLOCK_SIZE,
            kv_tokenizer: Vec::new(),
            kv_chat_template: Vec::new(),
            kv_tokenize_on_engine: false,
            kv_index_max_blocks_per_engine: defaults::KV_INDEX_MAX_BLOCKS_PER_ENGINE,
            precise_prefix_epsilon: defaults::PRECISE_PREFIX_EPSILON,
            precise_prefix_cache_weight: defaults::PRECISE_PREFIX_CACHE_WEIGHT,
        }
    }
}
