//! llama.cpp server load formats: `GET /metrics` (`--metrics`, `llamacpp:*`,
//! no labels) and `GET /slots`.
//!
//! Current builds export no KV gauge, so KV usage is estimated from `/slots`
//! ([`parse_slots`]); generation throughput comes from the
//! `llamacpp:tokens_predicted_total` counter's rate, computed by the monitor.
//! Note that llama.cpp prints values above 999999 with six significant
//! digits (`1.23457e+06`), so that counter moves in coarse steps once large.

use serde_json::{Map, Value};
use shoal_proto::load::{valid_count, valid_usage};
use shoal_proto::{EngineKind, EngineLoad};

use super::ParseError;
use super::prom::PromText;

const RUNNING: &str = "llamacpp:requests_processing";
const WAITING: &str = "llamacpp:requests_deferred";
/// KV gauge of older builds; absent from current ones.
const KV_USAGE_OLD: &str = "llamacpp:kv_cache_usage_ratio";
const TOKENS_PREDICTED: &str = "llamacpp:tokens_predicted_total";

/// What one llama.cpp `/metrics` scrape yields: the load plus the raw
/// generation counter the monitor turns into tokens/s.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LlamacppMetrics {
    /// Running (`requests_processing`) and waiting (`requests_deferred`)
    /// requests, and KV usage when an older build still exports the gauge;
    /// `gen_throughput` is left `None` for the monitor.
    pub load: EngineLoad,
    /// `llamacpp:tokens_predicted_total`; `None` if absent, non-finite or
    /// negative.
    pub tokens_predicted_total: Option<f64>,
}

/// Parses llama.cpp's `/metrics` text. `token_usage` is set only by older
/// builds' `llamacpp:kv_cache_usage_ratio`; otherwise take it from
/// [`parse_slots`].
pub fn parse_metrics(text: &str) -> Result<LlamacppMetrics, ParseError> {
    let prom = PromText::parse(text)?;
    if ![RUNNING, WAITING, KV_USAGE_OLD, TOKENS_PREDICTED]
        .iter()
        .any(|name| prom.contains(name))
    {
        return Err(ParseError::NoKnownMetric(EngineKind::Llamacpp));
    }
    Ok(LlamacppMetrics {
        load: EngineLoad {
            token_usage: prom.usage(KV_USAGE_OLD),
            waiting_requests: prom.count(WAITING),
            queued_tokens: None,
            running_requests: prom.count(RUNNING),
            gen_throughput: None,
        },
        tokens_predicted_total: prom.counter(TOKENS_PREDICTED),
    })
}

/// Estimates KV usage from `GET /slots`, because current llama.cpp builds no
/// longer export a KV gauge: sum(`n_prompt_tokens` + `n_decoded`) over busy
/// slots divided by sum(`n_ctx`) over all slots, validated with
/// `valid_usage`.
///
/// - An idle slot (`is_processing: false`, or `state: 0` in older builds)
///   contributes only its `n_ctx`; its cached prompt is reusable space.
/// - `n_decoded` is read from `next_token[0]` (or `next_token` when an older
///   build sends an object); a busy slot without it counts 0 decoded tokens.
/// - One slot's usage is capped at its own `n_ctx` (context shift keeps the
///   cache within it).
/// - Total `n_ctx` of zero, or any invalid number, gives `Ok(None)`.
/// - A body that is not an array of objects each carrying a numeric
///   `n_ctx`, or a busy slot without `n_prompt_tokens`, is an `Err`.
///
/// With `--kv-unified` every slot reports the whole context as its `n_ctx`,
/// so this under-estimates usage by the slot count.
pub fn parse_slots(body: &[u8]) -> Result<Option<f64>, ParseError> {
    let doc: Value = serde_json::from_slice(body)?;
    let slots = doc.as_array().ok_or(ParseError::UnexpectedShape(
        "expected a JSON array of slots",
    ))?;
    let mut used: u64 = 0;
    let mut capacity: u64 = 0;
    let mut valid = true;
    for slot in slots {
        let slot = slot
            .as_object()
            .ok_or(ParseError::UnexpectedShape("slot is not an object"))?;
        let n_ctx = number(slot, "n_ctx")
            .ok_or(ParseError::UnexpectedShape("slot without a numeric n_ctx"))?;
        let slot_used = if is_busy(slot) {
            let prompt = number(slot, "n_prompt_tokens").ok_or(ParseError::UnexpectedShape(
                "busy slot without a numeric n_prompt_tokens",
            ))?;
            let decoded = decoded_tokens(slot).unwrap_or(Some(0.0));
            match (valid_count(prompt), decoded.and_then(valid_count)) {
                (Some(p), Some(d)) => Some(p.saturating_add(d)),
                _ => None,
            }
        } else {
            Some(0)
        };
        match (valid_count(n_ctx), slot_used) {
            (Some(ctx), Some(u)) => {
                capacity = capacity.saturating_add(ctx);
                used = used.saturating_add(u.min(ctx));
            }
            _ => valid = false,
        }
    }
    if !valid || capacity == 0 {
        return Ok(None);
    }
    Ok(valid_usage(used as f64 / capacity as f64))
}

fn number(slot: &Map<String, Value>, key: &str) -> Option<f64> {
    slot.get(key).and_then(Value::as_f64)
}

/// `is_processing` in current builds, `state != 0` in older ones.
fn is_busy(slot: &Map<String, Value>) -> bool {
    match slot.get("is_processing").and_then(Value::as_bool) {
        Some(busy) => busy,
        None => number(slot, "state").is_some_and(|state| state != 0.0),
    }
}

/// `None` when the slot has no `n_decoded`; `Some(None)` when it has one that
/// is not a number (which makes the estimate invalid).
fn decoded_tokens(slot: &Map<String, Value>) -> Option<Option<f64>> {
    let next = slot.get("next_token")?;
    let next = match next {
        Value::Array(items) => items.first()?,
        other => other,
    };
    next.get("n_decoded").map(Value::as_f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    const METRICS: &str = "llamacpp:prompt_tokens_total 53
llamacpp:tokens_predicted_total 240
llamacpp:tokens_predicted_seconds_total 3.62211
llamacpp:n_decode_total 315
llamacpp:prompt_tokens_seconds 274.872
llamacpp:predicted_tokens_seconds 65.4315
llamacpp:requests_processing 4
llamacpp:requests_deferred 2
llamacpp:n_busy_slots_per_decode 1.70476
";
    const SLOTS: &str = r#"[{"id":0,"n_ctx":1024,"speculative":false,"is_processing":true,"id_task":247,"n_prompt_tokens":79,"n_prompt_tokens_processed":5,"n_prompt_tokens_cache":0,"params":{"n_predict":400},"next_token":[{"has_next_token":true,"has_new_line":false,"n_remain":326,"n_decoded":74}]},{"id":1,"n_ctx":1024,"speculative":false,"is_processing":false}]"#;

    #[test]
    fn metrics_sample_parses_exactly() {
        let parsed = parse_metrics(METRICS).unwrap();
        assert_eq!(
            parsed,
            LlamacppMetrics {
                load: EngineLoad {
                    token_usage: None,
                    waiting_requests: Some(2),
                    queued_tokens: None,
                    running_requests: Some(4),
                    gen_throughput: None,
                },
                tokens_predicted_total: Some(240.0),
            }
        );
    }

    #[test]
    fn metrics_exponents_old_kv_gauge_and_bad_values() {
        let text = "llamacpp:tokens_predicted_total 1.23457e+06\n\
                    llamacpp:requests_processing 4\n\
                    llamacpp:requests_deferred -2\n\
                    llamacpp:kv_cache_usage_ratio 0.25\n";
        let parsed = parse_metrics(text).unwrap();
        assert_eq!(parsed.tokens_predicted_total, Some(1_234_570.0));
        assert_eq!(parsed.load.token_usage, Some(0.25));
        assert_eq!(parsed.load.running_requests, Some(4));
        assert_eq!(parsed.load.waiting_requests, None);
        let text = "llamacpp:kv_cache_usage_ratio 2\nllamacpp:requests_processing NaN\n\
                    llamacpp:requests_deferred 1\nllamacpp:tokens_predicted_total -Inf\n";
        let parsed = parse_metrics(text).unwrap();
        assert_eq!(parsed.load.token_usage, None);
        assert_eq!(parsed.load.running_requests, None);
        assert_eq!(parsed.tokens_predicted_total, None);
        assert_eq!(parsed.load.waiting_requests, Some(1));
    }

    #[test]
    fn metrics_foreign_or_garbage_text_is_an_error() {
        assert!(matches!(
            parse_metrics("vllm:num_requests_running 1\n"),
            Err(ParseError::NoKnownMetric(EngineKind::Llamacpp))
        ));
        assert!(parse_metrics("<!doctype html>").is_err());
        assert!(parse_metrics("").is_err());
    }

    #[test]
    fn slots_sample_with_idle_and_busy_slot() {
        // (79 + 74) / (1024 + 1024)
        assert_eq!(parse_slots(SLOTS.as_bytes()).unwrap(), Some(153.0 / 2048.0));
    }

    #[test]
    fn slots_all_idle_busy_without_decode_and_capping() {
        let idle = r#"[{"id":0,"n_ctx":512,"speculative":false,"is_processing":false},
                       {"id":1,"n_ctx":512,"speculative":false,"is_processing":false}]"#;
        assert_eq!(parse_slots(idle.as_bytes()).unwrap(), Some(0.0));
        let prefill = r#"[{"id":0,"n_ctx":100,"is_processing":true,"n_prompt_tokens":50}]"#;
        assert_eq!(parse_slots(prefill.as_bytes()).unwrap(), Some(0.5));
        let shifted = r#"[{"id":0,"n_ctx":100,"is_processing":true,"n_prompt_tokens":90,
                           "next_token":[{"n_decoded":60}]},
                          {"id":1,"n_ctx":100,"is_processing":false}]"#;
        assert_eq!(parse_slots(shifted.as_bytes()).unwrap(), Some(0.5));
        let old = r#"[{"id":0,"n_ctx":100,"state":1,"n_prompt_tokens":10,
                       "next_token":{"n_decoded":15}},{"id":1,"n_ctx":100,"state":0}]"#;
        assert_eq!(parse_slots(old.as_bytes()).unwrap(), Some(0.125));
    }

    #[test]
    fn slots_invalid_numbers_or_no_capacity_give_none() {
        assert_eq!(parse_slots(b"[]").unwrap(), None);
        let zero = r#"[{"id":0,"n_ctx":0,"is_processing":false}]"#;
        assert_eq!(parse_slots(zero.as_bytes()).unwrap(), None);
        let negative = r#"[{"id":0,"n_ctx":-5,"is_processing":false}]"#;
        assert_eq!(parse_slots(negative.as_bytes()).unwrap(), None);
        let bad_decoded = r#"[{"id":0,"n_ctx":100,"is_processing":true,"n_prompt_tokens":5,
                               "next_token":[{"n_decoded":"x"}]}]"#;
        assert_eq!(parse_slots(bad_decoded.as_bytes()).unwrap(), None);
        let huge = r#"[{"id":0,"n_ctx":1e300,"is_processing":false}]"#;
        assert_eq!(parse_slots(huge.as_bytes()).unwrap(), None);
    }

    #[test]
    fn slots_garbage_and_wrong_shapes_are_errors() {
        for body in [
            "",
            "nope",
            "{\"status\":\"ok\"}",
            "[1]",
            "[{\"id\":0}]",
            "[{\"n_ctx\":\"1024\"}]",
            "[{\"n_ctx\":100,\"is_processing\":true}]",
        ] {
            assert!(parse_slots(body.as_bytes()).is_err(), "{body:?}");
        }
    }
}
