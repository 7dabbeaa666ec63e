//! Load-endpoint bodies in each engine's exact format (see shared ENGINES.md),
//! rendered from a [`ModelSnapshot`], plus their garbage variants.

use std::fmt::Write as _;
use std::time::{SystemTime, UNIX_EPOCH};

use serde_json::json;

use super::snapshot::ModelSnapshot;

/// Sections SGLang's `/v1/loads?include=` accepts.
pub const SGLANG_INCLUDE_SECTIONS: &[&str] =
    &["core", "memory", "spec", "lora", "disagg", "queues", "all"];

/// A float the way Python's `prometheus_client` prints it (`24.0`,
/// `1.7401e+09`, `NaN`, `+Inf`).
pub fn prom_float(v: f64) -> String {
    if v.is_nan() {
        return "NaN".to_string();
    }
    if v.is_infinite() {
        return if v > 0.0 { "+Inf" } else { "-Inf" }.to_string();
    }
    let s = if v != 0.0 && (v.abs() >= 1e16 || v.abs() < 1e-4) {
        c_exp(&format!("{v:e}"))
    } else {
        let s = format!("{v}");
        if s.contains('.') { s } else { format!("{s}.0") }
    };
    // prometheus_client's floatToGoString: more than six integer digits go
    // to exponent form.
    if let Some(dot) = s.find('.')
        && v > 0.0
        && dot > 6
        && !s.contains('e')
    {
        let digits = format!("{}{}", &s[1..dot], &s[dot + 1..]);
        let mantissa = format!("{}.{}", &s[..1], digits);
        let mantissa = mantissa.trim_end_matches('0').trim_end_matches('.');
        return format!("{mantissa}e+{:02}", dot - 1);
    }
    s
}

/// Rust's `1.5e16` / `1e-5` into C's `1.5e+16` / `1e-05`.
fn c_exp(s: &str) -> String {
    match s.split_once('e') {
        Some((m, e)) => {
            let (sign, digits) = match e.strip_prefix('-') {
                Some(d) => ('-', d),
                None => ('+', e),
            };
            format!("{m}e{sign}{digits:0>2}")
        }
        None => s.to_string(),
    }
}

/// A float the way C++ streams print it by default (`%g`, six significant
/// digits): `240`, `3.62211`, `1.23457e+06`.
pub fn c_g6(v: f64) -> String {
    if !v.is_finite() {
        return if v.is_nan() {
            "nan"
        } else if v > 0.0 {
            "inf"
        } else {
            "-inf"
        }
        .to_string();
    }
    if v == 0.0 {
        return "0".to_string();
    }
    let sci = format!("{v:.5e}");
    let exp: i32 = sci
        .split_once('e')
        .and_then(|(_, e)| e.parse().ok())
        .unwrap_or(0);
    if !(-4..6).contains(&exp) {
        let (m, _) = sci.split_once('e').unwrap_or((&sci, ""));
        let m = if m.contains('.') {
            m.trim_end_matches('0').trim_end_matches('.')
        } else {
            m
        };
        let sign = if exp < 0 { '-' } else { '+' };
        format!("{m}e{sign}{:02}", exp.abs())
    } else {
        let decimals = (5 - exp).max(0) as usize;
        let s = format!("{v:.decimals$}");
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s
        }
    }
}

/// RFC 3339 UTC timestamp with microseconds and `+00:00`, as SGLang prints.
pub fn iso_timestamp(t: SystemTime) -> String {
    let d = t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let secs = d.as_secs() as i64;
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}.{:06}+00:00",
        rem / 3600,
        rem % 3600 / 60,
        rem % 60,
        d.subsec_micros()
    )
}

/// SGLang `GET /v1/loads` body (one dp rank).
pub fn sglang_loads(s: &ModelSnapshot) -> String {
    json!({
        "timestamp": iso_timestamp(SystemTime::now()),
        "version": "0.5.9",
        "accelerator": "mock",
        "num_accelerators": 1,
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": s.running,
            "num_waiting_reqs": s.waiting,
            "num_waiting_uncached_tokens": s.waiting_uncached_tokens,
            "num_used_tokens": s.kv_used_tokens,
            "num_total_tokens": s.total_tokens(),
            "max_total_num_tokens": s.kv_capacity_tokens,
            "max_running_requests": s.max_running,
            "token_usage": s.token_usage(),
            "gen_throughput": s.gen_throughput,
            "cache_hit_rate": s.cache_hit_rate,
            "utilization": if s.running > 0 { 1.0 } else { 0.0 },
        }]
    })
    .to_string()
}

/// SGLang `GET /get_load` body (deprecated list form).
pub fn sglang_get_load(s: &ModelSnapshot) -> String {
    json!([{
        "dp_rank": 0,
        "num_reqs": s.running + s.waiting,
        "num_waiting_reqs": s.waiting,
        "num_tokens": s.total_tokens(),
        "num_pending_tokens": s.waiting_tokens,
        "ts_tic": s.uptime_secs,
    }])
    .to_string()
}

fn prom(out: &mut String, name: &str, kind: &str, help: &str, labels: &str, v: f64) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name}{labels} {}", prom_float(v));
}

/// SGLang `GET /metrics` body.
pub fn sglang_metrics(s: &ModelSnapshot, model: &str) -> String {
    let l = format!(
        "{{engine_type=\"unified\",model_name=\"{model}\",moe_ep_rank=\"0\",pp_rank=\"0\",tp_rank=\"0\"}}"
    );
    let c = &s.counters;
    let mut o = String::new();
    let g = "gauge";
    prom(
        &mut o,
        "sglang:num_running_reqs",
        g,
        "The number of running requests.",
        &l,
        s.running as f64,
    );
    prom(
        &mut o,
        "sglang:num_queue_reqs",
        g,
        "The number of requests in the waiting queue.",
        &l,
        s.waiting as f64,
    );
    prom(
        &mut o,
        "sglang:num_used_tokens",
        g,
        "The number of used tokens.",
        &l,
        s.kv_used_tokens as f64,
    );
    prom(
        &mut o,
        "sglang:token_usage",
        g,
        "The token usage.",
        &l,
        s.token_usage(),
    );
    prom(
        &mut o,
        "sglang:gen_throughput",
        g,
        "The generation throughput (token/s).",
        &l,
        s.gen_throughput,
    );
    prom(
        &mut o,
        "sglang:cache_hit_rate",
        g,
        "The prefix cache hit rate.",
        &l,
        s.cache_hit_rate,
    );
    prom(
        &mut o,
        "sglang:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        &l,
        c.prompt_tokens_total as f64,
    );
    prom(
        &mut o,
        "sglang:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        &l,
        c.generation_tokens_total as f64,
    );
    o
}

/// vLLM `GET /metrics` body.
pub fn vllm_metrics(s: &ModelSnapshot, model: &str, created_unix: f64) -> String {
    let l = format!("{{engine=\"0\",model_name=\"{model}\"}}");
    let c = &s.counters;
    let mut o = String::new();
    let g = "gauge";
    prom(
        &mut o,
        "vllm:num_requests_running",
        g,
        "Number of requests in model execution batches.",
        &l,
        s.running as f64,
    );
    prom(
        &mut o,
        "vllm:num_requests_waiting",
        g,
        "Number of requests waiting to be processed.",
        &l,
        s.waiting as f64,
    );
    prom(
        &mut o,
        "vllm:kv_cache_usage_perc",
        g,
        "KV-cache usage. 1 means 100 percent usage.",
        &l,
        s.token_usage(),
    );
    prom(
        &mut o,
        "vllm:num_preemptions_total",
        "counter",
        "Cumulative number of preemption from the engine.",
        &l,
        c.preemptions as f64,
    );
    prom(
        &mut o,
        "vllm:prompt_tokens_total",
        "counter",
        "Number of prefill tokens processed.",
        &l,
        c.prompt_tokens_total as f64,
    );
    prom(
        &mut o,
        "vllm:generation_tokens_total",
        "counter",
        "Number of generation tokens processed.",
        &l,
        c.generation_tokens_total as f64,
    );
    let _ = writeln!(
        o,
        "vllm:generation_tokens_created{l} {}",
        prom_float(created_unix)
    );
    o
}

/// llama.cpp server `GET /metrics` body (no labels, `%g` numbers).
pub fn llamacpp_metrics(s: &ModelSnapshot) -> String {
    let c = &s.counters;
    let per_sec = |n: u64, secs: f64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
    let busy = if c.steps_total > 0 {
        c.busy_slot_steps_total as f64 / c.steps_total as f64
    } else {
        0.0
    };
    let rows: [(&str, &str, &str, f64); 9] = [
        (
            "prompt_tokens_total",
            "counter",
            "Number of prompt tokens processed.",
            c.prefill_tokens_total as f64,
        ),
        (
            "tokens_predicted_total",
            "counter",
            "Number of generation tokens processed.",
            c.generation_tokens_total as f64,
        ),
        (
            "tokens_predicted_seconds_total",
            "counter",
            "Predict process time",
            c.generation_seconds_total,
        ),
        (
            "n_decode_total",
            "counter",
            "Total number of llama_decode() calls",
            c.steps_total as f64,
        ),
        (
            "prompt_tokens_seconds",
            "gauge",
            "Average prompt throughput in tokens/s.",
            per_sec(c.prefill_tokens_total, c.prefill_seconds_total),
        ),
        (
            "predicted_tokens_seconds",
            "gauge",
            "Average generation throughput in tokens/s.",
            per_sec(c.generation_tokens_total, c.generation_seconds_total),
        ),
        (
            "requests_processing",
            "gauge",
            "Number of requests processing.",
            s.running as f64,
        ),
        (
            "requests_deferred",
            "gauge",
            "Number of requests deferred.",
            s.waiting as f64,
        ),
        (
            "n_busy_slots_per_decode",
            "gauge",
            "Average number of busy slots per llama_decode() call",
            busy,
        ),
    ];
    let mut o = String::new();
    for (name, kind, help, v) in rows {
        let _ = writeln!(o, "# HELP llamacpp:{name} {help}");
        let _ = writeln!(o, "# TYPE llamacpp:{name} {kind}");
        let _ = writeln!(o, "llamacpp:{name} {}", c_g6(v));
    }
    o
}

/// llama.cpp server `GET /slots` body; idle slots carry only four fields.
pub fn llamacpp_slots(s: &ModelSnapshot) -> String {
    let n_ctx = s.slot_n_ctx();
    let slots: Vec<serde_json::Value> = s
        .slots
        .iter()
        .enumerate()
        .map(|(id, slot)| match slot {
            None => json!({"id": id, "n_ctx": n_ctx, "speculative": false, "is_processing": false}),
            Some(b) => json!({
                "id": id,
                "n_ctx": n_ctx,
                "speculative": false,
                "is_processing": true,
                "id_task": b.id_task,
                "n_prompt_tokens": b.n_prompt_tokens,
                "n_prompt_tokens_processed": b.n_prompt_tokens_processed,
                "n_prompt_tokens_cache": b.n_prompt_tokens_cache,
                "params": {"n_predict": b.n_predict},
                "next_token": [{
                    "has_next_token": b.n_decoded < b.n_predict,
                    "has_new_line": false,
                    "n_remain": b.n_predict.saturating_sub(b.n_decoded),
                    "n_decoded": b.n_decoded,
                }],
            }),
        })
        .collect();
    serde_json::Value::Array(slots).to_string()
}

/// A JSON load body in `garbage_metrics` mode: NaN values, cut short.
pub fn garbage_json() -> String {
    "{\"loads\":[{\"dp_rank\":0,\"num_running_reqs\":NaN,\"token_usage\":NaN,\"num_wai".to_string()
}

/// A Prometheus body in `garbage_metrics` mode: NaN gauges and junk lines.
pub fn garbage_metrics(prefix: &str) -> String {
    format!(
        "# TYPE {prefix}num_requests_running gauge\n{prefix}num_requests_running NaN\n\
         {prefix}kv_cache_usage_perc{{engine=\"0\" nan\n\u{fffd}\u{0}garbage line without value\n\
         {prefix}token_usage -Inf\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prometheus_client_float_forms() {
        assert_eq!(prom_float(24.0), "24.0");
        assert_eq!(prom_float(0.73), "0.73");
        assert_eq!(prom_float(23210.0), "23210.0");
        assert_eq!(prom_float(1_740_100_000.0), "1.7401e+09");
        assert_eq!(prom_float(1_234_567.0), "1.234567e+06");
        assert_eq!(prom_float(0.0), "0.0");
        assert_eq!(prom_float(f64::NAN), "NaN");
    }

    #[test]
    fn c_stream_float_forms() {
        assert_eq!(c_g6(240.0), "240");
        assert_eq!(c_g6(3.622_114), "3.62211");
        assert_eq!(c_g6(1_234_567.0), "1.23457e+06");
        assert_eq!(c_g6(999_999.0), "999999");
        assert_eq!(c_g6(0.0), "0");
        assert_eq!(c_g6(0.5), "0.5");
    }

    #[test]
    fn iso_timestamps() {
        let t = UNIX_EPOCH + std::time::Duration::from_micros(1_772_446_523_481_920);
        assert_eq!(iso_timestamp(t), "2026-03-02T10:15:23.481920+00:00");
    }
}
