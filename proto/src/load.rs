//! Engine load as the router sees it after polling one worker.
//!
//! Every number here has passed the edge checks: an engine that reports NaN,
//! infinity, a negative count or a KV usage outside 0..=1 gets that field set
//! to `None` ("missing"), never zero, so a broken exporter cannot make a
//! saturated engine look idle.

use serde::{Deserialize, Serialize};

/// Which engine family a worker's load endpoints speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// SGLang: `/v1/loads`, `/get_load`, `/metrics` (`sglang:*`).
    Sglang,
    /// vLLM: `/metrics` (`vllm:*`).
    Vllm,
    /// llama.cpp server: `/metrics` (`llamacpp:*`) and `/slots`.
    Llamacpp,
}

impl EngineKind {
    /// Lower-case name used in flags, metrics labels and JSON.
    pub fn as_str(self) -> &'static str {
        match self {
            EngineKind::Sglang => "sglang",
            EngineKind::Vllm => "vllm",
            EngineKind::Llamacpp => "llamacpp",
        }
    }
}

impl std::fmt::Display for EngineKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The load signals one poll of one engine produced. Each field is `None`
/// when the engine did not report it or reported an invalid value.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineLoad {
    /// KV-cache utilisation in 0..=1 (`k` in the policy formulas).
    pub token_usage: Option<f64>,
    /// Requests waiting in the engine's queue.
    pub waiting_requests: Option<u64>,
    /// Prompt tokens in the waiting queue that the prefix cache will not serve.
    pub queued_tokens: Option<u64>,
    /// Requests in the running batch.
    pub running_requests: Option<u64>,
    /// Generation throughput in tokens per second; always finite and > 0.
    pub gen_throughput: Option<f64>,
}

impl EngineLoad {
    /// The same load with every field checked again as at the engine edge:
    /// a peer's numbers are untrusted (bincode carries NaN and 1e308 as
    /// happily as real values), so they pass the same gate.
    pub fn revalidated(self) -> Self {
        EngineLoad {
            token_usage: self.token_usage.and_then(valid_usage),
            waiting_requests: self.waiting_requests.and_then(valid_exact_count),
            queued_tokens: self.queued_tokens.and_then(valid_exact_count),
            running_requests: self.running_requests.and_then(valid_exact_count),
            gen_throughput: self.gen_throughput.and_then(valid_throughput),
        }
    }

    /// True when not a single signal survived validation.
    pub fn is_empty(&self) -> bool {
        self.token_usage.is_none()
            && self.waiting_requests.is_none()
            && self.queued_tokens.is_none()
            && self.running_requests.is_none()
            && self.gen_throughput.is_none()
    }
}

/// Accepts a KV-usage ratio only if it is finite and within 0..=1.
pub fn valid_usage(value: f64) -> Option<f64> {
    (value.is_finite() && (0.0..=1.0).contains(&value)).then_some(value)
}

/// Accepts a count only if it is finite, non-negative and fits in `u64`.
/// Fractional counts (Prometheus prints gauges as `24.0`) are rounded.
pub fn valid_count(value: f64) -> Option<u64> {
    // 2^53: beyond this an f64 no longer represents every integer, and no
    // engine has that many requests or tokens queued.
    const MAX_EXACT: f64 = 9_007_199_254_740_992.0;
    (value.is_finite() && (0.0..=MAX_EXACT).contains(&value)).then(|| value.round() as u64)
}

/// Accepts an integer count only if an engine could have reported it:
/// at most 2^53, the range [`valid_count`] admits.
fn valid_exact_count(value: u64) -> Option<u64> {
    (value <= 1 << 53).then_some(value)
}

/// Accepts a throughput only if it is finite and strictly positive: a zero
/// throughput would divide the expected-wait score by zero.
pub fn valid_throughput(value: f64) -> Option<f64> {
    (value.is_finite() && value > 0.0).then_some(value)
}

/// One poll's result for one worker, stamped with when and by whom it was
/// taken. The mesh orders competing snapshots by `(polled_at_unix_ms, poller)`
/// (last writer wins, the poll time clamped by each receiver to its own
/// clock plus a skew bound).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LoadSnapshot {
    /// Engine family the numbers were parsed from.
    pub source: EngineKind,
    /// The validated signals.
    pub load: EngineLoad,
    /// Wall-clock poll time, milliseconds since the Unix epoch.
    pub polled_at_unix_ms: u64,
    /// Name of the replica that took the poll.
    pub poller: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn usage_rejects_out_of_range_and_non_finite() {
        assert_eq!(valid_usage(0.42), Some(0.42));
        assert_eq!(valid_usage(0.0), Some(0.0));
        assert_eq!(valid_usage(1.0), Some(1.0));
        assert_eq!(valid_usage(1.0001), None);
        assert_eq!(valid_usage(-0.1), None);
        assert_eq!(valid_usage(f64::NAN), None);
        assert_eq!(valid_usage(f64::INFINITY), None);
    }

    #[test]
    fn counts_reject_negative_and_non_finite() {
        assert_eq!(valid_count(24.0), Some(24));
        assert_eq!(valid_count(1.23457e6), Some(1_234_570));
        assert_eq!(valid_count(-1.0), None);
        assert_eq!(valid_count(f64::NAN), None);
        assert_eq!(valid_count(f64::NEG_INFINITY), None);
        assert_eq!(valid_count(1e300), None);
    }

    #[test]
    fn revalidation_drops_what_an_engine_could_not_report() {
        let hostile = EngineLoad {
            token_usage: Some(f64::NAN),
            waiting_requests: Some(u64::MAX),
            queued_tokens: Some(12),
            running_requests: Some(3),
            gen_throughput: Some(f64::INFINITY),
        };
        let clean = hostile.revalidated();
        assert_eq!(clean.token_usage, None);
        assert_eq!(clean.waiting_requests, None);
        assert_eq!(clean.queued_tokens, Some(12));
        assert_eq!(clean.running_requests, Some(3));
        assert_eq!(clean.gen_throughput, None);
        let fine = EngineLoad {
            token_usage: Some(0.5),
            gen_throughput: Some(10.0),
            ..EngineLoad::default()
        };
        assert_eq!(fine.revalidated(), fine);
    }

    #[test]
    fn throughput_must_be_positive() {
        assert_eq!(valid_throughput(1842.55), Some(1842.55));
        assert_eq!(valid_throughput(0.0), None);
        assert_eq!(valid_throughput(-5.0), None);
        assert_eq!(valid_throughput(f64::NAN), None);
    }

    #[test]
    fn snapshot_round_trips_through_json() {
        let snap = LoadSnapshot {
            source: EngineKind::Vllm,
            load: EngineLoad {
                token_usage: Some(0.5),
                waiting_requests: Some(3),
                queued_tokens: None,
                running_requests: Some(12),
                gen_throughput: Some(100.0),
            },
            polled_at_unix_ms: 1_700_000_000_000,
            poller: "a".into(),
        };
        let text = serde_json::to_string(&snap).unwrap();
        assert!(text.contains("\"source\":\"vllm\""));
        let back: LoadSnapshot = serde_json::from_str(&text).unwrap();
        assert_eq!(back, snap);
    }
}
