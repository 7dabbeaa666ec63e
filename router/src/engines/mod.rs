//! Parsers for the load formats of SGLang, vLLM and llama.cpp (pure, no I/O).
//!
//! The load monitor fetches an engine's load endpoints and hands the bodies to
//! the functions here, which turn them into a validated
//! [`EngineLoad`](shoal_proto::EngineLoad). Nothing in this module does I/O or
//! async work, so every rule is unit-tested against the exact sample bodies in
//! `ENGINES.md`.
//!
//! Rules shared by every parser:
//!
//! - Every number passes [`valid_usage`], [`valid_count`] or
//!   [`valid_throughput`]; a NaN, infinite, negative or out-of-range value
//!   makes that field `None` (missing), never zero, while the other fields
//!   survive.
//! - Several series of one signal (SGLang dp ranks, vLLM `engine` labels) are
//!   summed for counts and throughput and maxed for KV usage. If any one
//!   series is missing or invalid the aggregate is `None`: summing the
//!   remaining series would under-report the load.
//! - Bodies of the wrong shape (invalid JSON, wrong JSON type, text without a
//!   single known metric) are an `Err`, so an auto-probe can tell "this is not
//!   that engine" from "that engine reported nothing usable".
//!
//! [`valid_usage`]: shoal_proto::load::valid_usage
//! [`valid_count`]: shoal_proto::load::valid_count
//! [`valid_throughput`]: shoal_proto::load::valid_throughput

pub mod llamacpp;
pub mod prom;
pub mod rate;
pub mod sglang;
pub mod vllm;

use shoal_proto::EngineKind;
use shoal_proto::load::{valid_count, valid_throughput, valid_usage};

/// Why an engine body could not be read as load. The monitor logs it and
/// treats the poll as failed (the worker's load becomes missing).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// The body is not JSON at all (HTML error page, truncated body...).
    #[error("invalid JSON: {0}")]
    Json(#[from] serde_json::Error),
    /// The body is JSON but not the structure the endpoint documents.
    #[error("unexpected JSON shape: {0}")]
    UnexpectedShape(&'static str),
    /// Prometheus text that holds none of the metrics this engine's parser
    /// reads (wrong engine, metrics disabled, empty body).
    #[error("no known {0} metric found in the metrics text")]
    NoKnownMetric(EngineKind),
    /// Text in which not a single line is a Prometheus sample.
    #[error("invalid Prometheus text at line {line}: {reason}")]
    InvalidPrometheus {
        /// 1-based number of the first offending line.
        line: usize,
        /// What was wrong with it.
        reason: &'static str,
    },
}

/// Guesses the engine family from a `/metrics` body by its metric-name prefix
/// (`sglang:`, `vllm:`, `llamacpp:`), so `--worker-load-source auto` can pick
/// a parser after a single scrape. The first prefixed sample line decides;
/// text without any of the three prefixes gives `None`.
pub fn detect_from_metrics(text: &str) -> Option<EngineKind> {
    const PREFIXES: [(&str, EngineKind); 3] = [
        ("sglang:", EngineKind::Sglang),
        ("vllm:", EngineKind::Vllm),
        ("llamacpp:", EngineKind::Llamacpp),
    ];
    text.lines()
        .map(str::trim_start)
        .filter(|line| !line.starts_with('#'))
        .find_map(|line| {
            PREFIXES
                .iter()
                .find(|(prefix, _)| line.starts_with(prefix))
                .map(|&(_, kind)| kind)
        })
}

/// Sums per-series counts; `None` if there are no series or any one is
/// missing, or if the total overflows.
fn sum_counts<I: IntoIterator<Item = Option<u64>>>(items: I) -> Option<u64> {
    let mut total: Option<u64> = None;
    for item in items {
        total = Some(total.unwrap_or(0).checked_add(item?)?);
    }
    total
}

/// Validates each raw per-series count with `valid_count` and sums them.
fn count_total<I: IntoIterator<Item = Option<f64>>>(items: I) -> Option<u64> {
    sum_counts(items.into_iter().map(|v| v.and_then(valid_count)))
}

/// Maximum KV usage over series; `None` if there are none or any one is
/// missing or outside 0..=1 (a broken rank may be the full one).
fn usage_max<I: IntoIterator<Item = Option<f64>>>(items: I) -> Option<f64> {
    let mut best: Option<f64> = None;
    for item in items {
        let usage = valid_usage(item?)?;
        best = Some(best.map_or(usage, |b| b.max(usage)));
    }
    best
}

/// Sums per-series throughput. Each series must be finite and >= 0 (an idle
/// rank legitimately reports 0); the total must pass `valid_throughput`.
fn throughput_total<I: IntoIterator<Item = Option<f64>>>(items: I) -> Option<f64> {
    let mut total: Option<f64> = None;
    for item in items {
        let value = item?;
        if !(value.is_finite() && value >= 0.0) {
            return None;
        }
        total = Some(total.unwrap_or(0.0) + value);
    }
    valid_throughput(total?)
}

/// Validates a monotonic counter total (finite and >= 0); the rate is taken
/// later by [`rate::CounterRate`].
fn valid_counter(value: f64) -> Option<f64> {
    (value.is_finite() && value >= 0.0).then_some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn detects_the_three_prefixes() {
        let sglang = "# HELP sglang:num_running_reqs x\n# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{tp_rank=\"0\"} 24.0\n";
        assert_eq!(detect_from_metrics(sglang), Some(EngineKind::Sglang));
        let vllm = "python_gc_objects_collected_total{generation=\"0\"} 1.0\nvllm:num_requests_running{engine=\"0\"} 1.0\n";
        assert_eq!(detect_from_metrics(vllm), Some(EngineKind::Vllm));
        let llama = "llamacpp:prompt_tokens_total 53\n";
        assert_eq!(detect_from_metrics(llama), Some(EngineKind::Llamacpp));
    }

    #[test]
    fn unknown_text_is_not_detected() {
        assert_eq!(detect_from_metrics(""), None);
        assert_eq!(detect_from_metrics("<html>503</html>"), None);
        assert_eq!(detect_from_metrics("process_cpu_seconds_total 3.1\n"), None);
        // A prefix that appears only in a comment does not count.
        assert_eq!(detect_from_metrics("# vllm:foo is gone\nup 1\n"), None);
    }

    #[test]
    fn aggregates_reject_any_missing_or_invalid_series() {
        assert_eq!(count_total([Some(2.0), Some(3.0)]), Some(5));
        assert_eq!(count_total([Some(2.0), Some(-1.0)]), None);
        assert_eq!(count_total([Some(2.0), None]), None);
        assert_eq!(count_total(std::iter::empty()), None);
        assert_eq!(sum_counts([Some(u64::MAX), Some(1)]), None);
        assert_eq!(usage_max([Some(0.2), Some(0.7)]), Some(0.7));
        assert_eq!(usage_max([Some(0.2), Some(1.5)]), None);
        assert_eq!(throughput_total([Some(0.0), Some(5.0)]), Some(5.0));
        assert_eq!(throughput_total([Some(0.0), Some(0.0)]), None);
        assert_eq!(throughput_total([Some(5.0), Some(f64::NAN)]), None);
        assert_eq!(valid_counter(-1.0), None);
        assert_eq!(valid_counter(1.7401e9), Some(1.7401e9));
    }
}
