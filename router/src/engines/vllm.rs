//! vLLM load format: `GET /metrics` (`vllm:*`).
//!
//! vLLM has no throughput gauge, only the `vllm:generation_tokens_total`
//! counter, so this parser hands the counter back and the monitor turns it
//! into tokens/s with a [`CounterRate`](super::rate::CounterRate) across
//! polls. Series of one metric (one per `engine` label under data
//! parallelism) are summed for counts and the counter, maxed for KV usage.

use shoal_proto::{EngineKind, EngineLoad};

use super::ParseError;
use super::prom::PromText;

const KV_USAGE: &str = "vllm:kv_cache_usage_perc";
/// Name of the KV gauge up to vLLM 0.10.
const KV_USAGE_OLD: &str = "vllm:gpu_cache_usage_perc";
const WAITING: &str = "vllm:num_requests_waiting";
const RUNNING: &str = "vllm:num_requests_running";
const GENERATION_TOKENS: &str = "vllm:generation_tokens_total";

/// What one vLLM scrape yields: the load (with `gen_throughput` always
/// `None`) plus the raw generation counter the monitor needs for the rate.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct VllmMetrics {
    /// KV usage, waiting and running requests; `gen_throughput` is left
    /// `None` for the monitor to fill from the counter rate.
    pub load: EngineLoad,
    /// `vllm:generation_tokens_total` summed over engines; `None` if absent,
    /// non-finite or negative.
    pub generation_tokens_total: Option<f64>,
}

/// Parses vLLM's `/metrics` text. KV usage comes from
/// `vllm:kv_cache_usage_perc` (a 0..1 ratio despite the name); only when that
/// metric is absent altogether does it fall back to the vLLM <= 0.10
/// `vllm:gpu_cache_usage_perc` (an invalid new gauge stays missing rather
/// than being papered over by the old one).
pub fn parse_metrics(text: &str) -> Result<VllmMetrics, ParseError> {
    let prom = PromText::parse(text)?;
    if ![KV_USAGE, KV_USAGE_OLD, WAITING, RUNNING, GENERATION_TOKENS]
        .iter()
        .any(|name| prom.contains(name))
    {
        return Err(ParseError::NoKnownMetric(EngineKind::Vllm));
    }
    let kv_name = if prom.contains(KV_USAGE) {
        KV_USAGE
    } else {
        KV_USAGE_OLD
    };
    Ok(VllmMetrics {
        load: EngineLoad {
            token_usage: prom.usage(kv_name),
            waiting_requests: prom.count(WAITING),
            queued_tokens: None,
            running_requests: prom.count(RUNNING),
            gen_throughput: None,
        },
        generation_tokens_total: prom.counter(GENERATION_TOKENS),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str =
        "# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 12.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 0.4217
# HELP vllm:generation_tokens_total Number of generation tokens processed.
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 23210.0
vllm:generation_tokens_created{engine=\"0\",model_name=\"Qwen/Qwen3-8B\"} 1.7401e+09
";

    #[test]
    fn sample_parses_exactly() {
        let parsed = parse_metrics(SAMPLE).unwrap();
        assert_eq!(
            parsed,
            VllmMetrics {
                load: EngineLoad {
                    token_usage: Some(0.4217),
                    waiting_requests: Some(3),
                    queued_tokens: None,
                    running_requests: Some(12),
                    gen_throughput: None,
                },
                generation_tokens_total: Some(23210.0),
            }
        );
    }

    #[test]
    fn two_engines_are_summed_and_kv_maxed() {
        let text = "vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 12.0\n\
                    vllm:num_requests_running{engine=\"1\",model_name=\"m\"} 8.0\n\
                    vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 3.0\n\
                    vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 0.0\n\
                    vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.42\n\
                    vllm:kv_cache_usage_perc{engine=\"1\",model_name=\"m\"} 0.61\n\
                    vllm:generation_tokens_total{engine=\"0\",model_name=\"m\"} 1.5e+06\n\
                    vllm:generation_tokens_total{engine=\"1\",model_name=\"m\"} 2.5e6\n";
        let parsed = parse_metrics(text).unwrap();
        assert_eq!(parsed.load.running_requests, Some(20));
        assert_eq!(parsed.load.waiting_requests, Some(3));
        assert_eq!(parsed.load.token_usage, Some(0.61));
        assert_eq!(parsed.generation_tokens_total, Some(4.0e6));
        assert_eq!(parsed.load.gen_throughput, None);
    }

    #[test]
    fn old_kv_gauge_is_the_fallback_only_when_the_new_one_is_absent() {
        let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.3\n\
                   vllm:num_requests_running{model_name=\"m\"} 1\n";
        assert_eq!(parse_metrics(old).unwrap().load.token_usage, Some(0.3));
        let both = "vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc 0.3\n";
        assert_eq!(parse_metrics(both).unwrap().load.token_usage, Some(0.5));
        let bad_new = "vllm:kv_cache_usage_perc NaN\nvllm:gpu_cache_usage_perc 0.3\n";
        assert_eq!(parse_metrics(bad_new).unwrap().load.token_usage, None);
    }

    #[test]
    fn invalid_values_become_missing_while_others_survive() {
        for kv in ["NaN", "1.01", "-0.2", "+Inf"] {
            let text = SAMPLE.replace("} 0.4217", &format!("}} {kv}"));
            let parsed = parse_metrics(&text).unwrap();
            assert_eq!(parsed.load.token_usage, None, "{kv}");
            assert_eq!(parsed.load.running_requests, Some(12));
            assert_eq!(parsed.load.waiting_requests, Some(3));
            assert_eq!(parsed.generation_tokens_total, Some(23210.0));
        }
        let text = SAMPLE
            .replace("} 12.0", "} -1")
            .replace("} 23210.0", "} NaN");
        let parsed = parse_metrics(&text).unwrap();
        assert_eq!(parsed.load.running_requests, None);
        assert_eq!(parsed.generation_tokens_total, None);
        assert_eq!(parsed.load.token_usage, Some(0.4217));
    }

    #[test]
    fn foreign_or_garbage_text_is_an_error() {
        assert!(matches!(
            parse_metrics("sglang:num_running_reqs 1\n"),
            Err(ParseError::NoKnownMetric(EngineKind::Vllm))
        ));
        assert!(matches!(
            parse_metrics("{\"error\": \"not found\"}"),
            Err(ParseError::InvalidPrometheus { .. })
        ));
        assert!(parse_metrics("").is_err());
    }
}
