//! The load monitor against engines serving the real formats over HTTP:
//! auto-detection, validation at the edge, and dispatch marks.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, eventually};

const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="Qwen/Qwen3-8B"} 12.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="Qwen/Qwen3-8B"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="Qwen/Qwen3-8B"} 0.4217
# TYPE vllm:generation_tokens_total counter
vllm:generation_tokens_total{engine="0",model_name="Qwen/Qwen3-8B"} 23210.0
vllm:generation_tokens_created{engine="0",model_name="Qwen/Qwen3-8B"} 1.7401e+09
"#;

const SGLANG_LOADS: &str = r#"{"timestamp":"2026-03-02T10:15:23.481920+00:00","version":"0.5.9","accelerator":"NVIDIA H200","num_accelerators":1,"loads":[{"dp_rank":0,"num_running_reqs":24,"num_waiting_reqs":3,"num_waiting_uncached_tokens":6144,"num_used_tokens":382910,"num_total_tokens":401294,"max_total_num_tokens":524288,"max_running_requests":256,"token_usage":0.7303,"gen_throughput":1842.55,"cache_hit_rate":0.6412,"utilization":0.0}]}"#;

fn args(workers: &[&str], source: &str) -> Vec<String> {
    let mut args: Vec<String> = [
        "--worker-load-source",
        source,
        "--load-poll-interval-ms",
        "100",
        "--health-check-interval-secs",
        "60",
        "--worker-urls",
    ]
    .map(String::from)
    .to_vec();
    args.extend(workers.iter().map(|w| w.to_string()));
    args
}

async fn snapshot_of(router: &Router, url: &str) -> Option<serde_json::Value> {
    let entry = router.worker(url).await;
    (!entry["snapshot"].is_null()).then(|| entry["snapshot"].clone())
}

#[tokio::test]
async fn auto_detects_sglang_and_vllm_and_stores_their_numbers() {
    let sglang = FakeEngine::start().await;
    *sglang.state.loads.lock().await = SGLANG_LOADS.to_string();
    let vllm = FakeEngine::start().await;
    *vllm.state.metrics.lock().await = VLLM.to_string();
    let router = Router::start(&args(&[&sglang.url, &vllm.url], "auto")).await;

    assert!(
        eventually(Duration::from_secs(5), || async {
            snapshot_of(&router, &sglang.url).await.is_some()
                && snapshot_of(&router, &vllm.url).await.is_some()
        })
        .await
    );
    let s = snapshot_of(&router, &sglang.url).await.unwrap();
    assert_eq!(s["source"], "sglang");
    assert_eq!(s["load"]["token_usage"], 0.7303);
    assert_eq!(s["load"]["waiting_requests"], 3);
    assert_eq!(s["load"]["queued_tokens"], 6144);
    assert_eq!(s["load"]["gen_throughput"], 1842.55);
    let v = snapshot_of(&router, &vllm.url).await.unwrap();
    assert_eq!(v["source"], "vllm");
    assert_eq!(v["load"]["token_usage"], 0.4217);
    assert_eq!(v["load"]["running_requests"], 12);

    // The generation counter moves: throughput is its rate between polls.
    *vllm.state.metrics.lock().await = VLLM.replace("23210.0", "1.0e+09");
    assert!(
        eventually(Duration::from_secs(5), || async {
            snapshot_of(&router, &vllm.url).await.unwrap()["load"]["gen_throughput"]
                .as_f64()
                .is_some_and(|t| t > 0.0)
        })
        .await
    );
    let metrics = router.metrics().await;
    assert!(
        metrics.contains(&format!(
            "shoal_engine_token_usage{{worker=\"{}\"}} 0.7303",
            sglang.url
        )),
        "{metrics}"
    );
}

#[tokio::test]
async fn invalid_engine_numbers_become_missing_not_zero() {
    let engine = FakeEngine::start().await;
    *engine.state.metrics.lock().await =
        VLLM.replace("} 0.4217", "} NaN").replace("} 3.0", "} -3.0");
    let router = Router::start(&args(&[&engine.url], "vllm")).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            snapshot_of(&router, &engine.url).await.is_some()
        })
        .await
    );
    let s = snapshot_of(&router, &engine.url).await.unwrap();
    assert!(s["load"]["token_usage"].is_null(), "{s}");
    assert!(s["load"]["waiting_requests"].is_null(), "{s}");
    assert_eq!(s["load"]["running_requests"], 12, "{s}");

    *engine.state.metrics.lock().await = VLLM.replace("} 0.4217", "} 1.7");
    assert!(
        eventually(Duration::from_secs(5), || async {
            let s = snapshot_of(&router, &engine.url).await.unwrap();
            s["load"]["token_usage"].is_null() && s["load"]["waiting_requests"] == 3
        })
        .await,
        "KV usage above 1 is missing too"
    );
}

#[tokio::test]
async fn a_failing_exporter_keeps_the_old_snapshot_until_it_goes_stale() {
    let engine = FakeEngine::start().await;
    *engine.state.metrics.lock().await = VLLM.to_string();
    let router = Router::start(&args(&[&engine.url], "vllm")).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            snapshot_of(&router, &engine.url).await.is_some()
        })
        .await
    );
    *engine.state.metrics.lock().await = "<html>oops</html>".into();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let entry = router.worker(&engine.url).await;
    assert!(entry["snapshot_age_ms"].as_u64().unwrap() >= 200, "{entry}");
    let metrics = router.metrics().await;
    assert!(
        metrics.contains(&format!(
            "shoal_load_poll_errors_total{{worker=\"{}\",reason=\"parse\"}}",
            engine.url
        )),
        "{metrics}"
    );
}

/// A vLLM engine whose model list takes `models_delay_ms`, and a router
/// checking its health every second and polling it every `poll_ms`,
/// returned once the first snapshot is in.
async fn slow_models_engine(models_delay_ms: u64, poll_ms: u64) -> (FakeEngine, Router) {
    let engine = FakeEngine::start().await;
    *engine.state.metrics.lock().await = VLLM.to_string();
    *engine.state.models.lock().await = vec!["m".into()];
    engine
        .state
        .models_delay_ms
        .store(models_delay_ms, std::sync::atomic::Ordering::SeqCst);
    let mut args = args(&[&engine.url], "vllm");
    for (flag, value) in [
        ("--health-check-interval-secs", "1".to_string()),
        ("--load-poll-interval-ms", poll_ms.to_string()),
    ] {
        let at = args.iter().position(|a| a == flag).unwrap();
        args[at + 1] = value;
    }
    let router = Router::start(&args).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            snapshot_of(&router, &engine.url).await.is_some()
        })
        .await
    );
    (engine, router)
}

/// Health checks (with their model list) and load polls run on their own
/// tickers; in turns they share one pooled connection to the engine
/// instead of opening a second whenever they meet (at 1,000 engines that
/// was 1,000 more idle sockets and their buffers).
#[tokio::test]
async fn health_checks_and_load_polls_share_one_connection() {
    // Polls every second and a health round of ~600 ms (its model list is
    // slow) every second: most rounds overlap a poll, which waits for the
    // turn (a poll waits at most one interval: 400 ms to spare, so a
    // loaded CI host does not push the wait past it; with 100 ms it did).
    let (engine, router) = slow_models_engine(600, 1000).await;
    // Six health rounds: the chance that none meets a poll is ~0.4 %.
    tokio::time::sleep(Duration::from_millis(6200)).await;
    let entry = router.worker(&engine.url).await;
    assert_eq!(entry["healthy"], true, "{entry}");
    assert_eq!(
        engine
            .state
            .connections
            .load(std::sync::atomic::Ordering::SeqCst),
        1,
        "every side request went over the one pooled connection"
    );
}

/// A health check that hangs (here, a model list taking 3 s) holds its
/// turn, but the polls of every engine go on: a poll waits for the turn
/// at most one interval, so one slow engine never stalls the poll round.
#[tokio::test]
async fn a_slow_health_check_does_not_hold_up_the_polls() {
    let (engine, router) = slow_models_engine(3000, 100).await;
    // 2.5 s inside health rounds that each hold the turn for 3 s.
    let mut oldest = 0;
    for _ in 0..10 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let age = router.worker(&engine.url).await["snapshot_age_ms"]
            .as_u64()
            .unwrap_or(u64::MAX);
        oldest = oldest.max(age);
    }
    assert!(
        oldest < 1500,
        "polled every ~200 ms despite the health check; the oldest snapshot seen was {oldest} ms"
    );
}
