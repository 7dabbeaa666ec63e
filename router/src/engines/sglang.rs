//! SGLang load formats: `GET /v1/loads?include=core` (preferred), the
//! deprecated `GET /get_load`, and `/metrics` (`--enable-metrics`).
//!
//! Each dp rank reports separately; counts and throughput are summed over
//! ranks, KV usage is the max over ranks (the fullest rank is the one that
//! will queue or preempt first). If any rank lacks a field or reports it
//! invalid, that field is `None`.
//!
//! `/metrics` caveat: by default only `attn_tp_rank == 0` schedulers export,
//! one series per dp rank, so summing is right. With
//! `--enable-metrics-for-all-schedulers` every TP replica exports the same
//! state and the sums over-count; prefer `/v1/loads` there.

use serde_json::{Map, Value};
use shoal_proto::load::valid_count;
use shoal_proto::{EngineKind, EngineLoad};

use super::prom::PromText;
use super::{ParseError, count_total, sum_counts, throughput_total, usage_max};

/// Parses `GET /v1/loads?include=core`: `{"loads":[{per dp rank}...], ...}`.
/// This is the richest SGLang source: it alone reports the uncached tokens
/// waiting in the queue (`num_waiting_uncached_tokens` -> `queued_tokens`).
pub fn parse_loads(body: &[u8]) -> Result<EngineLoad, ParseError> {
    let doc: Value = serde_json::from_slice(body)?;
    let loads = doc
        .get("loads")
        .and_then(Value::as_array)
        .ok_or(ParseError::UnexpectedShape(
            "expected an object with a `loads` array",
        ))?;
    let ranks = rank_objects(loads, "`loads` entry is not an object")?;
    Ok(EngineLoad {
        token_usage: usage_max(field(&ranks, "token_usage")),
        waiting_requests: count_total(field(&ranks, "num_waiting_reqs")),
        queued_tokens: count_total(field(&ranks, "num_waiting_uncached_tokens")),
        running_requests: count_total(field(&ranks, "num_running_reqs")),
        gen_throughput: throughput_total(field(&ranks, "gen_throughput")),
    })
}

/// Parses the deprecated `GET /get_load`, for SGLang builds that predate
/// `/v1/loads`. Two historical forms:
///
/// - The list form, one entry per dp rank. Current SGLang builds it from the
///   same data as `/v1/loads`: `num_reqs` = running + waiting, so
///   `running_requests` = sum(`num_reqs` - `num_waiting_reqs`);
///   `waiting_requests` = sum(`num_waiting_reqs`); `queued_tokens` =
///   sum(`num_pending_tokens`), the prompt tokens of the waiting queue. That
///   is an upper bound of the uncached queue (prefix-cache hits are not
///   subtracted), which errs toward "busier", never toward idle.
///   `num_tokens` (KV in use plus queued prompts) has no capacity beside it,
///   so `token_usage` and `gen_throughput` are `None`.
/// - The older `{"load": N}` form, where N is KV tokens in use plus queued
///   prompt tokens, with no capacity and no split between the two. No field
///   of `EngineLoad` means that, so it maps to an all-`None` load
///   (`is_empty()`), which tells the monitor to use `/metrics` instead.
pub fn parse_get_load(body: &[u8]) -> Result<EngineLoad, ParseError> {
    let doc: Value = serde_json::from_slice(body)?;
    match &doc {
        Value::Array(entries) => {
            let ranks = rank_objects(entries, "`/get_load` entry is not an object")?;
            let running = ranks.iter().map(|rank| {
                let total = number(rank, "num_reqs").and_then(valid_count)?;
                let waiting = number(rank, "num_waiting_reqs").and_then(valid_count)?;
                total.checked_sub(waiting)
            });
            Ok(EngineLoad {
                token_usage: None,
                waiting_requests: count_total(field(&ranks, "num_waiting_reqs")),
                queued_tokens: count_total(field(&ranks, "num_pending_tokens")),
                running_requests: sum_counts(running),
                gen_throughput: None,
            })
        }
        Value::Object(map) if map.get("load").is_some_and(Value::is_number) => {
            Ok(EngineLoad::default())
        }
        _ => Err(ParseError::UnexpectedShape(
            "expected a list of dp-rank loads or {\"load\": N}",
        )),
    }
}

/// Parses SGLang's `/metrics` text, the fallback when `/v1/loads` is not
/// served. It has no uncached-queue signal, so `queued_tokens` is `None`.
pub fn parse_metrics(text: &str) -> Result<EngineLoad, ParseError> {
    const USAGE: &str = "sglang:token_usage";
    const WAITING: &str = "sglang:num_queue_reqs";
    const RUNNING: &str = "sglang:num_running_reqs";
    const THROUGHPUT: &str = "sglang:gen_throughput";
    let prom = PromText::parse(text)?;
    if ![USAGE, WAITING, RUNNING, THROUGHPUT]
        .iter()
        .any(|name| prom.contains(name))
    {
        return Err(ParseError::NoKnownMetric(EngineKind::Sglang));
    }
    Ok(EngineLoad {
        token_usage: prom.usage(USAGE),
        waiting_requests: prom.count(WAITING),
        queued_tokens: None,
        running_requests: prom.count(RUNNING),
        gen_throughput: prom.throughput(THROUGHPUT),
    })
}

/// Checks that every rank entry is a JSON object and that there is at least
/// one (an empty list carries no load at all).
fn rank_objects<'a>(
    entries: &'a [Value],
    not_object: &'static str,
) -> Result<Vec<&'a Map<String, Value>>, ParseError> {
    if entries.is_empty() {
        return Err(ParseError::UnexpectedShape("no dp-rank entries"));
    }
    entries
        .iter()
        .map(|entry| {
            entry
                .as_object()
                .ok_or(ParseError::UnexpectedShape(not_object))
        })
        .collect()
}

fn number(rank: &Map<String, Value>, key: &str) -> Option<f64> {
    rank.get(key).and_then(Value::as_f64)
}

/// One field across all ranks; a rank without a numeric value yields `None`.
fn field<'a>(
    ranks: &'a [&'a Map<String, Value>],
    key: &'a str,
) -> impl Iterator<Item = Option<f64>> + 'a {
    ranks.iter().map(move |rank| number(rank, key))
}

#[cfg(test)]
mod tests {
    use super::*;

    const LOADS: &str = r#"{"timestamp":"2026-03-02T10:15:23.481920+00:00","version":"0.5.9","accelerator":"NVIDIA H200","num_accelerators":1,"loads":[{"dp_rank":0,"num_running_reqs":24,"num_waiting_reqs":3,"num_waiting_uncached_tokens":6144,"num_used_tokens":382910,"num_total_tokens":401294,"max_total_num_tokens":524288,"max_running_requests":256,"token_usage":0.7303,"gen_throughput":1842.55,"cache_hit_rate":0.6412,"utilization":0.0}]}"#;
    const GET_LOAD: &str = r#"[{"dp_rank":0,"num_reqs":27,"num_waiting_reqs":3,"num_tokens":401294,"num_pending_tokens":18384,"ts_tic":128374.551}]"#;
    const METRICS: &str = "# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{engine_type=\"unified\",model_name=\"Qwen/Qwen3-8B\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 24.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{engine_type=\"unified\",model_name=\"Qwen/Qwen3-8B\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"} 0.73
";

    fn rank(dp: u32, running: &str, usage: &str, throughput: &str) -> String {
        format!(
            r#"{{"dp_rank":{dp},"num_running_reqs":{running},"num_waiting_reqs":2,"num_waiting_uncached_tokens":100,"token_usage":{usage},"gen_throughput":{throughput}}}"#
        )
    }

    #[test]
    fn loads_sample_parses_exactly() {
        let load = parse_loads(LOADS.as_bytes()).unwrap();
        assert_eq!(
            load,
            EngineLoad {
                token_usage: Some(0.7303),
                waiting_requests: Some(3),
                queued_tokens: Some(6144),
                running_requests: Some(24),
                gen_throughput: Some(1842.55),
            }
        );
    }

    #[test]
    fn loads_sum_counts_and_max_usage_over_dp_ranks() {
        let body = format!(
            r#"{{"loads":[{},{}]}}"#,
            rank(0, "10", "0.5", "100.0"),
            rank(1, "5", "0.8", "0.0")
        );
        let load = parse_loads(body.as_bytes()).unwrap();
        assert_eq!(
            load,
            EngineLoad {
                token_usage: Some(0.8),
                waiting_requests: Some(4),
                queued_tokens: Some(200),
                running_requests: Some(15),
                gen_throughput: Some(100.0),
            }
        );
    }

    #[test]
    fn loads_invalid_fields_become_missing_others_survive() {
        let body = format!(
            r#"{{"loads":[{},{}]}}"#,
            rank(0, "-1", "1.2", "50.0"),
            rank(1, "3", "0.5", "\"fast\"")
        );
        let load = parse_loads(body.as_bytes()).unwrap();
        assert_eq!(load.running_requests, None);
        assert_eq!(load.token_usage, None);
        assert_eq!(load.gen_throughput, None);
        assert_eq!(load.waiting_requests, Some(4));
        assert_eq!(load.queued_tokens, Some(200));
        // A field that only one rank reports is missing, not half-counted.
        let body = r#"{"loads":[{"num_running_reqs":3},{"num_waiting_reqs":1}]}"#;
        let load = parse_loads(body.as_bytes()).unwrap();
        assert!(load.is_empty());
    }

    #[test]
    fn loads_rejects_garbage_and_wrong_shapes() {
        for body in [
            "",
            "not json",
            "{\"loads\":",
            "[]",
            "{}",
            "{\"loads\":{}}",
            "{\"loads\":[]}",
            "{\"loads\":[1,2]}",
            "null",
        ] {
            assert!(parse_loads(body.as_bytes()).is_err(), "{body:?}");
        }
        assert!(matches!(parse_loads(b"<html>"), Err(ParseError::Json(_))));
        assert!(parse_loads(&[0xff, 0xfe, 0x00]).is_err());
        // Deep nesting hits serde_json's recursion limit instead of the stack.
        assert!(parse_loads("[".repeat(100_000).as_bytes()).is_err());
        assert!(parse_get_load("{\"a\":".repeat(100_000).as_bytes()).is_err());
    }

    #[test]
    fn get_load_list_sample_parses_exactly() {
        let load = parse_get_load(GET_LOAD.as_bytes()).unwrap();
        assert_eq!(
            load,
            EngineLoad {
                token_usage: None,
                waiting_requests: Some(3),
                queued_tokens: Some(18384),
                running_requests: Some(24),
                gen_throughput: None,
            }
        );
    }

    #[test]
    fn get_load_sums_ranks_and_rejects_inconsistent_counts() {
        let body = r#"[{"num_reqs":10,"num_waiting_reqs":4,"num_pending_tokens":7},
                       {"num_reqs":5,"num_waiting_reqs":0,"num_pending_tokens":0}]"#;
        let load = parse_get_load(body.as_bytes()).unwrap();
        assert_eq!(load.running_requests, Some(11));
        assert_eq!(load.waiting_requests, Some(4));
        assert_eq!(load.queued_tokens, Some(7));
        // More waiting than total requests: running is unknowable.
        let body = r#"[{"num_reqs":2,"num_waiting_reqs":4,"num_pending_tokens":-3}]"#;
        let load = parse_get_load(body.as_bytes()).unwrap();
        assert_eq!(load.running_requests, None);
        assert_eq!(load.queued_tokens, None);
        assert_eq!(load.waiting_requests, Some(4));
    }

    #[test]
    fn get_load_legacy_object_maps_to_an_empty_load() {
        let load = parse_get_load(br#"{"load": 12345}"#).unwrap();
        assert!(load.is_empty());
        for body in ["{\"load\":\"x\"}", "{}", "[]", "[3]", "7", "nope"] {
            assert!(parse_get_load(body.as_bytes()).is_err(), "{body:?}");
        }
    }

    #[test]
    fn metrics_sample_parses_exactly() {
        let load = parse_metrics(METRICS).unwrap();
        assert_eq!(
            load,
            EngineLoad {
                token_usage: Some(0.73),
                waiting_requests: None,
                queued_tokens: None,
                running_requests: Some(24),
                gen_throughput: None,
            }
        );
    }

    #[test]
    fn metrics_sum_dp_ranks_and_reject_bad_values() {
        let text = "sglang:num_running_reqs{dp_rank=\"0\"} 4\n\
                    sglang:num_running_reqs{dp_rank=\"1\"} 6.0\n\
                    sglang:num_queue_reqs{dp_rank=\"0\"} 1e+01\n\
                    sglang:num_queue_reqs{dp_rank=\"1\"} 0\n\
                    sglang:token_usage{dp_rank=\"0\"} 0.25\n\
                    sglang:token_usage{dp_rank=\"1\"} 0.5\n\
                    sglang:gen_throughput{dp_rank=\"0\"} 12.5\n\
                    sglang:gen_throughput{dp_rank=\"1\"} 7.5\n";
        let load = parse_metrics(text).unwrap();
        assert_eq!(
            load,
            EngineLoad {
                token_usage: Some(0.5),
                waiting_requests: Some(10),
                queued_tokens: None,
                running_requests: Some(10),
                gen_throughput: Some(20.0),
            }
        );
        let text = "sglang:token_usage 1.5\nsglang:num_running_reqs NaN\n\
                    sglang:num_queue_reqs 2\nsglang:gen_throughput -3\n";
        let load = parse_metrics(text).unwrap();
        assert_eq!(load.token_usage, None);
        assert_eq!(load.running_requests, None);
        assert_eq!(load.gen_throughput, None);
        assert_eq!(load.waiting_requests, Some(2));
    }

    #[test]
    fn metrics_of_another_engine_or_garbage_are_errors() {
        assert!(matches!(
            parse_metrics("vllm:num_requests_running 1\n"),
            Err(ParseError::NoKnownMetric(EngineKind::Sglang))
        ));
        assert!(matches!(
            parse_metrics(""),
            Err(ParseError::NoKnownMetric(EngineKind::Sglang))
        ));
        assert!(matches!(
            parse_metrics("<html>oops</html>"),
            Err(ParseError::InvalidPrometheus { .. })
        ));
    }
}
