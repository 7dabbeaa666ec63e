//! Read-only views of an engine's model state: counters, gauges, slots and
//! per-request timing records. Load endpoints and `/stats` render these.

use serde::Serialize;

/// Monotonic counters of one engine since it started.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Counters {
    /// Inference requests accepted into the waiting queue.
    pub requests_total: u64,
    /// Requests that produced all their output tokens.
    pub requests_completed: u64,
    /// Requests dropped because their client went away.
    pub requests_aborted: u64,
    /// Requests answered 503 by a fault knob (`--fail-rate`, `fail` mode).
    pub requests_failed: u64,
    /// Requests refused with 400 (malformed, or longer than the KV capacity).
    pub requests_rejected: u64,
    /// Running requests pushed back to the queue because the KV cache ran out.
    pub preemptions: u64,
    /// Prompt tokens of admitted requests (counted at first admission).
    pub prompt_tokens_total: u64,
    /// Of those, tokens served from the prefix cache at first admission.
    pub cached_prompt_tokens_total: u64,
    /// Uncached prompt tokens actually prefilled (recomputation included).
    pub prefill_tokens_total: u64,
    /// Output tokens generated.
    pub generation_tokens_total: u64,
    /// Scheduler steps (batches) executed.
    pub steps_total: u64,
    /// Sum over steps of the number of running requests (busy slots).
    pub busy_slot_steps_total: u64,
    /// Wall seconds spent in steps.
    pub step_seconds_total: f64,
    /// Wall seconds of prefill work within steps.
    pub prefill_seconds_total: f64,
    /// Per-request generation wall seconds (step time summed per emitting request).
    pub generation_seconds_total: f64,
}

/// Engine-side timing and size of one finished request (wall milliseconds).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Timing {
    /// From arrival to first admission into the running batch.
    pub queue_ms: f64,
    /// From arrival to the first output token.
    pub ttft_ms: f64,
    /// From arrival to the last output token.
    pub e2e_ms: f64,
    /// Prompt tokens (the ceil(chars / 4) rule).
    pub prompt_tokens: u64,
    /// Prompt tokens served from the prefix cache at first admission.
    pub cached_tokens: u64,
    /// Output tokens generated.
    pub output_tokens: u64,
    /// Times the request was preempted.
    pub preemptions: u32,
}

/// One entry of the bounded ring of recent finished requests.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// Position in the engine's sequence of finished requests (starts at 1).
    pub seq: u64,
    /// Engine-local request id (also sent as `x-mock-request-id`).
    pub id: u64,
    /// The client's `x-request-id` header, when it sent one.
    pub client_id: Option<String>,
    /// The request's timing.
    #[serde(flatten)]
    pub timing: Timing,
}

/// A busy llama.cpp-style slot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BusySlot {
    /// Engine-local request id.
    pub id_task: u64,
    /// Prompt tokens of the request.
    pub n_prompt_tokens: u64,
    /// Prompt tokens prefilled so far in the current admission.
    pub n_prompt_tokens_processed: u64,
    /// Prompt tokens taken from the prefix cache in the current admission.
    pub n_prompt_tokens_cache: u64,
    /// Output tokens requested.
    pub n_predict: u64,
    /// Output tokens generated so far.
    pub n_decoded: u64,
}

/// A point-in-time view of one engine's model state.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ModelSnapshot {
    /// Changes whenever the state changes; equal versions mean equal state.
    pub version: u64,
    /// Wall seconds since the engine started.
    pub uptime_secs: f64,
    /// Requests in the running batch.
    pub running: usize,
    /// Requests in the waiting queue.
    pub waiting: usize,
    /// Prompt tokens (plus tokens already generated, for preempted ones) waiting.
    pub waiting_tokens: u64,
    /// Of those, the tokens the prefix cache would not serve right now.
    pub waiting_uncached_tokens: u64,
    /// KV-cache tokens held by running requests (prompt + generated).
    pub kv_used_tokens: u64,
    /// KV-cache capacity in tokens.
    pub kv_capacity_tokens: u64,
    /// Tokens resident in the prefix cache.
    pub prefix_cached_tokens: u64,
    /// Maximum running requests (llama.cpp slots).
    pub max_running: usize,
    /// Output tokens per wall second over the last two seconds.
    pub gen_throughput: f64,
    /// Cached prompt tokens / prompt tokens since start (0 before any request).
    pub cache_hit_rate: f64,
    /// Counters since start.
    pub counters: Counters,
    /// One entry per slot (`max_running` of them); `None` when idle.
    pub slots: Vec<Option<BusySlot>>,
}

impl ModelSnapshot {
    /// KV usage in 0..=1: used tokens over capacity.
    pub fn token_usage(&self) -> f64 {
        self.kv_used_tokens as f64 / self.kv_capacity_tokens.max(1) as f64
    }

    /// Context per llama.cpp slot: KV capacity divided evenly among slots.
    pub fn slot_n_ctx(&self) -> u64 {
        self.kv_capacity_tokens / self.max_running.max(1) as u64
    }

    /// SGLang's `num_total_tokens`: KV tokens in use plus prefix-cache tokens
    /// resident, capped at capacity.
    pub fn total_tokens(&self) -> u64 {
        (self.kv_used_tokens + self.prefix_cached_tokens).min(self.kv_capacity_tokens)
    }
}
