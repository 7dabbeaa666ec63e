//! `mock-engine`: runs one or more mock LLM engines in one process.
//!
//! Prints `mock-engine listening on http://HOST:PORT flavor=F` once per engine
//! (in engine order) when all are listening, each followed, when the engine
//! publishes KV-cache events, by
//! `mock-engine kv-events engine=http://HOST:PORT pub=tcp://IP:P replay=tcp://IP:R|none format=F block-size=N`,
//! then serves until killed. Warnings (such as invalid replay requests) go
//! to stderr; `RUST_LOG` tunes them.

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use shoal_tests::mock::{
    DEFAULT_KV_BLOCK_SIZE, DEFAULT_KV_EVENTS_BUFFER_STEPS, DEFAULT_PD_HANDOFF_TIMEOUT_MS,
    EngineConfig, Flavor, KvEventsFormat, PdRole, spawn_engines,
};

/// Mock continuous-batching LLM engine(s) speaking SGLang, vLLM or llama.cpp.
#[derive(Debug, Parser)]
#[command(name = "mock-engine", version)]
struct Cli {
    /// Load-endpoint flavor: sglang, vllm or llamacpp.
    #[arg(long, default_value = "vllm")]
    flavor: Flavor,
    /// Number of engines in this process, each with its own model state.
    #[arg(long, default_value_t = 1)]
    engines: usize,
    /// Engine i listens on base-port + i; 0 gives every engine an ephemeral port.
    #[arg(long, default_value_t = 0)]
    base_port: u16,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: IpAddr,
    /// Model name served by /v1/models and in metric labels.
    #[arg(long, default_value = "mock/Qwen3-8B")]
    model_name: String,
    /// KV-cache capacity in tokens.
    #[arg(long, default_value_t = 65_536)]
    kv_capacity_tokens: u64,
    /// Maximum running (batched) requests; llama.cpp slots.
    #[arg(long, default_value_t = 64)]
    max_running: usize,
    /// Prefill rate, uncached prompt tokens per model second.
    #[arg(long, default_value_t = 10_000.0, allow_negative_numbers = true)]
    prefill_tps: f64,
    /// Prefill tokens per step at most (chunked prefill).
    #[arg(long, default_value_t = 4_096)]
    prefill_chunk_tokens: u64,
    /// Step time = decode-base-ms + decode-per-req-ms * batch (+ prefill time), model ms.
    #[arg(long, default_value_t = 12.0, allow_negative_numbers = true)]
    decode_base_ms: f64,
    /// Per-request part of the step time, model ms.
    #[arg(long, default_value_t = 0.2, allow_negative_numbers = true)]
    decode_per_req_ms: f64,
    /// Model seconds per wall second (10 = ten times faster than real time).
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    time_scale: f64,
    /// Prefix-cache block size in prompt characters.
    #[arg(long, default_value_t = 64)]
    prefix_block_chars: usize,
    /// Prefix-cache capacity in tokens (0 disables it).
    #[arg(long, default_value_t = 65_536)]
    prefix_cache_tokens: u64,
    /// Output tokens per SSE event at most (the first token is sent alone).
    #[arg(long, default_value_t = 4)]
    tokens_per_chunk: u32,
    /// Output tokens when a request sets no max_tokens.
    #[arg(long, default_value_t = 128)]
    default_max_tokens: u64,
    /// Fraction of inference requests answered 503.
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    fail_rate: f64,
    /// Recent per-request records kept for /stats.
    #[arg(long, default_value_t = 4_096)]
    stats_capacity: usize,
    /// A Hugging Face tokenizer.json: the prefix cache then holds blocks of
    /// --kv-block-size token ids of the prompt text instead of characters.
    #[arg(long)]
    tokenizer: Option<PathBuf>,
    /// Tokens per prefix-cache block (with --tokenizer).
    #[arg(long, default_value_t = DEFAULT_KV_BLOCK_SIZE)]
    kv_block_size: usize,
    /// Publish KV-cache events on a ZMQ PUB socket at tcp://HOST:PORT
    /// (0 = a free port; engine i uses PORT + i). Needs --tokenizer.
    #[arg(long)]
    kv_events_port: Option<u16>,
    /// Replay buffered event batches on a ZMQ ROUTER socket at this port
    /// (0 = a free port; engine i uses PORT + i).
    #[arg(long)]
    kv_events_replay_port: Option<u16>,
    /// Event encoding: vllm-map (vLLM >= 0.24), vllm-array (vLLM 0.10.2-0.13)
    /// or sglang (SGLang >= 0.5.20).
    #[arg(long, default_value_t = KvEventsFormat::default())]
    kv_events_format: KvEventsFormat,
    /// Published batches kept for replay.
    #[arg(long, default_value_t = DEFAULT_KV_EVENTS_BUFFER_STEPS)]
    kv_events_buffer_steps: usize,
    /// Frame 0 (topic) of every event message.
    #[arg(long, default_value = "")]
    kv_events_topic: String,
    /// A Jinja chat template (e.g. a model's chat_template saved to a file):
    /// chat requests are rendered with it and tokenized without special
    /// tokens, as vLLM does. Needs --tokenizer.
    #[arg(long)]
    chat_template: Option<PathBuf>,
    /// Output token k of a reply is `w{k} ` instead of `tok `, and a
    /// continuation goes on from the words its open assistant turn (or
    /// completions prompt) already holds.
    #[arg(long)]
    numbered_output: bool,
    /// Part in a disaggregated fleet: none, prefill (hands its KV over,
    /// SGLang bootstrap or vLLM kv_transfer_params) or decode (takes it).
    #[arg(long, default_value = "none")]
    pd_role: PdRole,
    /// How long a decode engine waits for its KV handoff, in ms.
    #[arg(long, default_value_t = DEFAULT_PD_HANDOFF_TIMEOUT_MS)]
    pd_handoff_timeout_ms: u64,
}

impl Cli {
    fn config(&self) -> EngineConfig {
        EngineConfig {
            flavor: self.flavor,
            model_name: self.model_name.clone(),
            kv_capacity_tokens: self.kv_capacity_tokens,
            max_running: self.max_running,
            prefill_tps: self.prefill_tps,
            prefill_chunk_tokens: self.prefill_chunk_tokens,
            decode_base_ms: self.decode_base_ms,
            decode_per_req_ms: self.decode_per_req_ms,
            time_scale: self.time_scale,
            prefix_block_chars: self.prefix_block_chars,
            prefix_cache_tokens: self.prefix_cache_tokens,
            tokens_per_chunk: self.tokens_per_chunk,
            default_max_tokens: self.default_max_tokens,
            fail_rate: self.fail_rate,
            stats_capacity: self.stats_capacity,
            tokenizer: self.tokenizer.clone(),
            kv_block_size: self.kv_block_size,
            kv_events_port: self.kv_events_port,
            kv_events_replay_port: self.kv_events_replay_port,
            kv_events_format: self.kv_events_format,
            kv_events_buffer_steps: self.kv_events_buffer_steps,
            kv_events_topic: self.kv_events_topic.clone(),
            chat_template: self.chat_template.clone(),
            numbered_output: self.numbered_output,
            pd_role: self.pd_role,
            pd_handoff_timeout_ms: self.pd_handoff_timeout_ms,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .init();
    let cfg = cli.config();
    if let Err(e) = cfg.validate() {
        eprintln!("mock-engine: {e}");
        return ExitCode::from(2);
    }
    if cli.engines == 0 {
        eprintln!("mock-engine: --engines must be at least 1");
        return ExitCode::from(2);
    }
    let engines = match spawn_engines(&cfg, cli.host, cli.base_port, cli.engines).await {
        Ok(e) => e,
        Err(e) => {
            eprintln!("mock-engine: cannot start engines: {e}");
            return ExitCode::from(1);
        }
    };
    for e in &engines {
        println!("mock-engine listening on {} flavor={}", e.url(), cli.flavor);
        if let Some(kv) = e.kv_events() {
            println!(
                "mock-engine kv-events engine={} pub={} replay={} format={} block-size={}",
                e.url(),
                kv.endpoint,
                kv.replay_endpoint.as_deref().unwrap_or("none"),
                kv.format,
                kv.block_size
            );
        }
    }
    if tokio::signal::ctrl_c().await.is_err() {
        std::future::pending::<()>().await;
    }
    for e in engines {
        e.shutdown().await;
    }
    ExitCode::SUCCESS
}
