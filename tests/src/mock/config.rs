//! Engine configuration: the knobs of the engine model and their validation.

use super::disagg::PdRole;
use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use super::kv_wire::KvEventsFormat;

/// Which real engine's load endpoints the mock imitates.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Flavor {
    /// SGLang: `/v1/loads`, `/get_load` and `/metrics` (`sglang:*`).
    Sglang,
    /// vLLM: `/metrics` (`vllm:*`).
    Vllm,
    /// llama.cpp server: `/metrics` (`llamacpp:*`) and `/slots`.
    Llamacpp,
}

impl Flavor {
    /// The flavor's name as used on the command line.
    pub fn as_str(self) -> &'static str {
        match self {
            Flavor::Sglang => "sglang",
            Flavor::Vllm => "vllm",
            Flavor::Llamacpp => "llamacpp",
        }
    }
}

impl fmt::Display for Flavor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for Flavor {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "sglang" => Ok(Flavor::Sglang),
            "vllm" => Ok(Flavor::Vllm),
            "llamacpp" | "llama.cpp" => Ok(Flavor::Llamacpp),
            other => Err(format!(
                "unknown flavor {other:?} (expected sglang, vllm or llamacpp)"
            )),
        }
    }
}

/// The parameters of one mock engine.
///
/// Timing model (all durations in model time; wall time is model time divided
/// by `time_scale`): each scheduler step lasts
/// `decode_base_ms + decode_per_req_ms * batch + 1000 * prefill_tokens / prefill_tps`
/// milliseconds, where `batch` is the number of requests that emit a token in
/// the step and `prefill_tokens` the uncached prompt tokens processed in it
/// (at most `prefill_chunk_tokens`).
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// Load-endpoint flavor.
    pub flavor: Flavor,
    /// Model name reported by `/v1/models`, responses and metric labels.
    pub model_name: String,
    /// KV-cache capacity in tokens (`--kv-capacity-tokens`).
    pub kv_capacity_tokens: u64,
    /// Maximum number of running (batched) requests (`--max-running`).
    pub max_running: usize,
    /// Prefill rate in tokens per model second (`--prefill-tps`).
    pub prefill_tps: f64,
    /// Prefill budget in tokens per step, chunked prefill (`--prefill-chunk-tokens`).
    pub prefill_chunk_tokens: u64,
    /// Fixed part of a step in model milliseconds (`--decode-base-ms`).
    pub decode_base_ms: f64,
    /// Per-request part of a step in model milliseconds (`--decode-per-req-ms`).
    pub decode_per_req_ms: f64,
    /// Model seconds per wall second; 10 runs ten times faster than real time.
    pub time_scale: f64,
    /// Prefix-cache block size in prompt characters (`--prefix-block-chars`).
    pub prefix_block_chars: usize,
    /// Prefix-cache capacity in tokens (`--prefix-cache-tokens`); 0 disables it.
    pub prefix_cache_tokens: u64,
    /// Tokens per streamed SSE event at most, after the first (`--tokens-per-chunk`).
    pub tokens_per_chunk: u32,
    /// Output tokens when a request gives no `max_tokens` (`--default-max-tokens`).
    pub default_max_tokens: u64,
    /// Fraction of inference requests answered 503 (`--fail-rate`).
    pub fail_rate: f64,
    /// Number of recent per-request timing records kept for `/stats`.
    pub stats_capacity: usize,
    /// A Hugging Face `tokenizer.json` (`--tokenizer`): when set, the
    /// prefix cache holds blocks of `kv_block_size` token ids instead of
    /// `prefix_block_chars` characters (the timing model still counts
    /// prompt tokens by the chars/4 rule).
    pub tokenizer: Option<PathBuf>,
    /// Tokens per prefix-cache block with a tokenizer (`--kv-block-size`).
    pub kv_block_size: usize,
    /// Port of the ZMQ PUB socket publishing KV-cache events
    /// (`--kv-events-port`; 0 picks a free one; needs `tokenizer`).
    pub kv_events_port: Option<u16>,
    /// Port of the ZMQ ROUTER socket replaying buffered event batches
    /// (`--kv-events-replay-port`; 0 picks a free one).
    pub kv_events_replay_port: Option<u16>,
    /// Wire encoding of the events (`--kv-events-format`).
    pub kv_events_format: KvEventsFormat,
    /// Published batches kept for replay (`--kv-events-buffer-steps`).
    pub kv_events_buffer_steps: usize,
    /// Frame 0 of every event message (`--kv-events-topic`).
    pub kv_events_topic: String,
    /// A Jinja chat template chat requests are rendered with before they
    /// are tokenized (`--chat-template`; needs `tokenizer`), as vLLM does.
    pub chat_template: Option<PathBuf>,
    /// Output token k of a reply is `w{k} ` instead of `tok `
    /// (`--numbered-output`), and a continuation (an open assistant turn
    /// with `continue_final_message`, or a completions prompt ending in
    /// such words) goes on from the words it holds: a migrated stream's
    /// text then shows any token lost or repeated.
    pub numbered_output: bool,
    /// The engine's part in a disaggregated fleet (`--pd-role`; see
    /// `disagg`).
    pub pd_role: PdRole,
    /// How long a decode engine waits for its prefill's KV handoff
    /// (`--pd-handoff-timeout-ms`) before failing the request.
    pub pd_handoff_timeout_ms: u64,
}

/// How long a decode engine waits for its KV handoff unless told otherwise.
pub const DEFAULT_PD_HANDOFF_TIMEOUT_MS: u64 = 10_000;

/// Tokens per KV block unless told otherwise: vLLM's default `--block-size`.
pub const DEFAULT_KV_BLOCK_SIZE: usize = 16;

/// Event batches kept for replay unless told otherwise: vLLM's default
/// `buffer_steps`.
pub const DEFAULT_KV_EVENTS_BUFFER_STEPS: usize = 10_000;

/// The model a mock engine serves unless told otherwise: what clients of
/// the tests, benchmarks and demo ask for, so model routing finds it.
pub const DEFAULT_MODEL: &str = "mock/Qwen3-8B";

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            flavor: Flavor::Vllm,
            model_name: DEFAULT_MODEL.to_string(),
            kv_capacity_tokens: 65_536,
            max_running: 64,
            prefill_tps: 10_000.0,
            prefill_chunk_tokens: 4_096,
            decode_base_ms: 12.0,
            decode_per_req_ms: 0.2,
            time_scale: 1.0,
            prefix_block_chars: 64,
            prefix_cache_tokens: 65_536,
            tokens_per_chunk: 4,
            default_max_tokens: 128,
            fail_rate: 0.0,
            stats_capacity: 4_096,
            tokenizer: None,
            kv_block_size: DEFAULT_KV_BLOCK_SIZE,
            kv_events_port: None,
            kv_events_replay_port: None,
            kv_events_format: KvEventsFormat::default(),
            kv_events_buffer_steps: DEFAULT_KV_EVENTS_BUFFER_STEPS,
            kv_events_topic: String::new(),
            chat_template: None,
            numbered_output: false,
            pd_role: PdRole::None,
            pd_handoff_timeout_ms: DEFAULT_PD_HANDOFF_TIMEOUT_MS,
        }
    }
}

/// A configuration value out of range; the message names the flag.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

fn positive(flag: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v > 0.0 {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{flag} must be a finite number > 0 (got {v})"
        )))
    }
}

fn non_negative(flag: &str, v: f64) -> Result<(), ConfigError> {
    if v.is_finite() && v >= 0.0 {
        Ok(())
    } else {
        Err(ConfigError(format!(
            "{flag} must be a finite number >= 0 (got {v})"
        )))
    }
}

fn at_least_one(flag: &str, v: u64) -> Result<(), ConfigError> {
    if v >= 1 {
        Ok(())
    } else {
        Err(ConfigError(format!("{flag} must be at least 1 (got {v})")))
    }
}

impl EngineConfig {
    /// Checks every field; the error names the offending command-line flag.
    pub fn validate(&self) -> Result<(), ConfigError> {
        at_least_one("--kv-capacity-tokens", self.kv_capacity_tokens)?;
        at_least_one("--max-running", self.max_running as u64)?;
        positive("--prefill-tps", self.prefill_tps)?;
        at_least_one("--prefill-chunk-tokens", self.prefill_chunk_tokens)?;
        non_negative("--decode-base-ms", self.decode_base_ms)?;
        non_negative("--decode-per-req-ms", self.decode_per_req_ms)?;
        positive("--time-scale", self.time_scale)?;
        at_least_one("--prefix-block-chars", self.prefix_block_chars as u64)?;
        at_least_one("--tokens-per-chunk", u64::from(self.tokens_per_chunk))?;
        at_least_one("--default-max-tokens", self.default_max_tokens)?;
        non_negative("--fail-rate", self.fail_rate)?;
        if self.fail_rate > 1.0 {
            return Err(ConfigError(format!(
                "--fail-rate must be between 0 and 1 (got {})",
                self.fail_rate
            )));
        }
        if self.decode_base_ms + self.decode_per_req_ms <= 0.0 {
            return Err(ConfigError(
                "--decode-base-ms and --decode-per-req-ms cannot both be 0".to_string(),
            ));
        }
        if self.flavor == Flavor::Llamacpp && self.max_request_tokens() < 2 {
            return Err(ConfigError(
                "--kv-capacity-tokens / --max-running must leave each llama.cpp slot at least 2 tokens"
                    .to_string(),
            ));
        }
        at_least_one("--stats-capacity", self.stats_capacity as u64)?;
        if self.model_name.is_empty() {
            return Err(ConfigError("--model-name must not be empty".to_string()));
        }
        self.validate_kv_events()
    }

    fn validate_kv_events(&self) -> Result<(), ConfigError> {
        at_least_one("--kv-block-size", self.kv_block_size as u64)?;
        at_least_one(
            "--kv-events-buffer-steps",
            self.kv_events_buffer_steps as u64,
        )?;
        if self.kv_events_port.is_some() && self.tokenizer.is_none() {
            return Err(ConfigError(
                "--kv-events-port needs --tokenizer (events carry token ids)".to_string(),
            ));
        }
        if self.chat_template.is_some() && self.tokenizer.is_none() {
            return Err(ConfigError(
                "--chat-template needs --tokenizer (it shapes token blocks)".to_string(),
            ));
        }
        if self.kv_events_replay_port.is_some() && self.kv_events_port.is_none() {
            return Err(ConfigError(
                "--kv-events-replay-port needs --kv-events-port".to_string(),
            ));
        }
        if let (Some(p), Some(r)) = (self.kv_events_port, self.kv_events_replay_port)
            && p == r
            && p != 0
        {
            return Err(ConfigError(format!(
                "--kv-events-replay-port must differ from --kv-events-port (both {p})"
            )));
        }
        Ok(())
    }

    /// The largest prompt + output a request may ask for: the KV capacity,
    /// or for llama.cpp one slot's context (`kv_capacity_tokens / max_running`),
    /// since llama.cpp splits its context evenly among slots.
    pub fn max_request_tokens(&self) -> u64 {
        match self.flavor {
            Flavor::Llamacpp => self.kv_capacity_tokens / self.max_running.max(1) as u64,
            Flavor::Sglang | Flavor::Vllm => self.kv_capacity_tokens,
        }
    }

    /// Model step time in milliseconds for `batch` token-emitting requests and
    /// `prefill_tokens` uncached prompt tokens processed in the same step.
    pub fn step_model_ms(&self, batch: usize, prefill_tokens: u64) -> f64 {
        self.decode_base_ms
            + self.decode_per_req_ms * batch as f64
            + 1000.0 * prefill_tokens as f64 / self.prefill_tps
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_bad_numbers_naming_the_flag() {
        let cfg = EngineConfig {
            prefill_tps: f64::NAN,
            ..EngineConfig::default()
        };
        let err = cfg.validate().err().map(|e| e.0).unwrap_or_default();
        assert!(err.contains("--prefill-tps"), "{err}");
        let cfg = EngineConfig {
            fail_rate: -0.1,
            ..EngineConfig::default()
        };
        let err = cfg.validate().err().map(|e| e.0).unwrap_or_default();
        assert!(err.contains("--fail-rate"), "{err}");
        assert!(EngineConfig::default().validate().is_ok());
    }

    #[test]
    fn kv_events_flags_are_checked_together() {
        let err = |cfg: EngineConfig| cfg.validate().err().map(|e| e.0).unwrap_or_default();
        let events = EngineConfig {
            kv_events_port: Some(0),
            ..EngineConfig::default()
        };
        assert!(err(events.clone()).contains("needs --tokenizer"));
        let events = EngineConfig {
            tokenizer: Some("tok.json".into()),
            ..events
        };
        assert!(events.validate().is_ok());
        let same = EngineConfig {
            kv_events_port: Some(5557),
            kv_events_replay_port: Some(5557),
            ..events.clone()
        };
        assert!(err(same).contains("--kv-events-replay-port"));
        let replay_only = EngineConfig {
            kv_events_replay_port: Some(0),
            ..EngineConfig::default()
        };
        assert!(err(replay_only).contains("needs --kv-events-port"));
        let zero = EngineConfig {
            kv_block_size: 0,
            ..events
        };
        assert!(err(zero).contains("--kv-block-size"));
    }
}
