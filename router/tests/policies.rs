//! Load-reading policies end to end: engines report their load on
//! `/v1/loads`, the monitor polls it, and the policy routes on it.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, eventually};

/// An SGLang `/v1/loads` body with these core numbers.
fn loads(waiting_tokens: u64, waiting: u64, usage: f64, throughput: f64) -> String {
    serde_json::json!({
        "timestamp": "2026-03-02T10:15:23.481920+00:00",
        "version": "0.5.9",
        "loads": [{
            "dp_rank": 0,
            "num_running_reqs": 24,
            "num_waiting_reqs": waiting,
            "num_waiting_uncached_tokens": waiting_tokens,
            "token_usage": usage,
            "gen_throughput": throughput,
        }]
    })
    .to_string()
}

fn args(policy: &str, workers: &[&str]) -> Vec<String> {
    let mut args: Vec<String> = [
        "--policy",
        policy,
        "--worker-load-source",
        "sglang",
        "--load-poll-interval-ms",
        "100",
        "--worker-urls",
    ]
    .map(String::from)
    .to_vec();
    args.extend(workers.iter().map(|w| w.to_string()));
    args
}

async fn polled_waiting(router: &Router, url: &str) -> Option<u64> {
    router.worker(url).await["snapshot"]["load"]["waiting_requests"].as_u64()
}

#[tokio::test]
async fn least_load_steers_away_from_an_engine_reporting_a_long_queue() {
    let busy = FakeEngine::start().await;
    let idle = FakeEngine::start().await;
    *busy.state.loads.lock().await = loads(200_000, 90, 0.9, 1000.0);
    *idle.state.loads.lock().await = loads(0, 0, 0.1, 2000.0);
    let router = Router::start(&args("least_load", &[&busy.url, &idle.url])).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            polled_waiting(&router, &busy.url).await == Some(90)
                && polled_waiting(&router, &idle.url).await == Some(0)
        })
        .await,
        "both engines polled"
    );
    for _ in 0..10 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!((busy.requests(), idle.requests()), (0, 10));

    // The load moves: after the next poll the traffic follows it.
    *busy.state.loads.lock().await = loads(0, 0, 0.1, 2000.0);
    *idle.state.loads.lock().await = loads(300_000, 120, 0.95, 1000.0);
    assert!(
        eventually(Duration::from_secs(5), || async {
            polled_waiting(&router, &idle.url).await == Some(120)
                && polled_waiting(&router, &busy.url).await == Some(0)
        })
        .await
    );
    for _ in 0..10 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!((busy.requests(), idle.requests()), (10, 10));
}

#[tokio::test]
async fn load_aware_prefers_the_shorter_engine_queue() {
    let long = FakeEngine::start().await;
    let short = FakeEngine::start().await;
    *long.state.loads.lock().await = loads(0, 100, 0.5, 2000.0);
    *short.state.loads.lock().await = loads(0, 2, 0.5, 2000.0);
    let router = Router::start(&args("load_aware", &[&long.url, &short.url])).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            polled_waiting(&router, &long.url).await == Some(100)
                && polled_waiting(&router, &short.url).await == Some(2)
        })
        .await
    );
    for _ in 0..6 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!((long.requests(), short.requests()), (0, 6));
}

/// A chat request whose prompt (about 1.6 KB) is long enough for an
/// affinity key, or a short one.
fn chat_with(content: &str) -> serde_json::Value {
    serde_json::json!({
        "model": "test-model",
        "stream": false,
        "max_tokens": 16,
        "messages": [{"role": "user", "content": content}]
    })
}

#[tokio::test]
async fn prefix_affinity_is_the_default_keeping_long_prompts_together_and_spreading_short_ones() {
    let a = FakeEngine::start().await;
    let b = FakeEngine::start().await;
    let mut args = common::base_args(&[&a.url, &b.url]);
    let at = args.iter().position(|x| x == "--policy").unwrap();
    args.drain(at..at + 2);
    let router = Router::start(&args).await;
    let long = format!(
        "tag 1: {}",
        "a system prompt every turn shares. ".repeat(45)
    );
    for _ in 0..8 {
        let response = router
            .post_json("/v1/chat/completions", &chat_with(&long))
            .await;
        assert_eq!(response.status(), 200);
        // The router releases a request's booking just after the client
        // has the response; on a loaded host two could still be held when
        // the next request is placed, which puts the home past the load
        // bound (2 of 3 in flight) and moves that request. Each one is
        // placed on an idle fleet, as the test means.
        assert!(
            router
                .released(&[&a.url, &b.url], Duration::from_secs(5))
                .await,
            "bookings released"
        );
    }
    // The first sight of a key goes by least load (a tie between two idle
    // engines); every repeat goes to the key's home.
    let (on_a, on_b) = (a.requests(), b.requests());
    assert!(on_a.max(on_b) >= 7, "{:?}", (on_a, on_b));
    // A prompt shorter than the key has no affinity: ties between idle
    // engines break at random (cache_aware would keep it on one engine).
    for _ in 0..16 {
        let response = router
            .post_json("/v1/chat/completions", &chat_with("hi"))
            .await;
        assert_eq!(response.status(), 200);
    }
    let short = (a.requests() - on_a, b.requests() - on_b);
    assert!(short.0 > 0 && short.1 > 0, "{short:?}");
}
