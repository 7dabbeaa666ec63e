//! Worker lifecycle against real sockets: retries, health checks, the
//! circuit breaker, the admin API, model merging and metrics.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, base_args, eventually};

#[tokio::test]
async fn a_503_from_one_worker_is_retried_on_another() {
    let failing = FakeEngine::start().await;
    failing.state.fixed_status.store(503, Ordering::SeqCst);
    let healthy = FakeEngine::start().await;
    let mut args = base_args(&[&failing.url, &healthy.url]);
    args.extend(["--disable-circuit-breaker".into()]);
    let router = Router::start(&args).await;
    for _ in 0..6 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert!(
        failing.requests() >= 3,
        "round robin sent some to the failing worker first"
    );
    assert_eq!(healthy.requests(), 6);
    let metrics = router.metrics().await;
    assert!(metrics.contains("shoal_retries_total"), "{metrics}");
}

#[tokio::test]
async fn a_non_retryable_status_passes_through_and_the_last_retryable_one_too() {
    let bad_request = FakeEngine::start().await;
    bad_request.state.fixed_status.store(422, Ordering::SeqCst);
    let router = Router::start(&base_args(&[&bad_request.url])).await;
    let response = router.chat(false).await;
    assert_eq!(response.status(), 422);
    assert!(response.text().await.unwrap().contains("fixed status 422"));
    assert_eq!(
        bad_request.requests(),
        1,
        "4xx is the client's fault: no retry"
    );

    let overloaded = FakeEngine::start().await;
    overloaded.state.fixed_status.store(429, Ordering::SeqCst);
    let mut args = base_args(&[&overloaded.url]);
    args.extend(["--retry-max-retries".into(), "2".into()]);
    let router = Router::start(&args).await;
    let response = router.chat(false).await;
    assert_eq!(
        response.status(),
        429,
        "the worker's own answer once retries are spent"
    );
    assert_eq!(overloaded.requests(), 3);
}

#[tokio::test]
async fn a_dead_worker_leaves_rotation_and_returns_after_recovery() {
    let flaky = FakeEngine::start().await;
    let steady = FakeEngine::start().await;
    let mut args = base_args(&[&flaky.url, &steady.url]);
    args.extend(
        [
            "--health-check-interval-secs",
            "1",
            "--health-failure-threshold",
            "2",
            "--health-success-threshold",
            "1",
        ]
        .map(String::from),
    );
    let router = Router::start(&args).await;

    flaky.state.unhealthy.store(true, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(6), || async {
            router.worker(&flaky.url).await["healthy"] == serde_json::json!(false)
        })
        .await,
        "two failed checks take the worker out"
    );
    let before = flaky.requests();
    for _ in 0..4 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!(flaky.requests(), before, "no traffic while unhealthy");
    let metrics = router.metrics().await;
    assert!(
        metrics.contains(&format!(
            "shoal_worker_healthy{{worker=\"{}\"}} 0",
            flaky.url
        )),
        "{metrics}"
    );

    flaky.state.unhealthy.store(false, Ordering::SeqCst);
    assert!(
        eventually(Duration::from_secs(4), || async {
            router.worker(&flaky.url).await["healthy"] == serde_json::json!(true)
        })
        .await,
        "one passed check brings it back"
    );
    for _ in 0..4 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert!(flaky.requests() > before, "traffic returns");
}

#[tokio::test]
async fn repeated_failures_open_the_circuit() {
    // 503: the engine refused the work, so the POSTs are retried elsewhere
    // (a 500 to a POST would pass through to the client).
    let failing = FakeEngine::start().await;
    failing.state.fixed_status.store(503, Ordering::SeqCst);
    let healthy = FakeEngine::start().await;
    let mut args = base_args(&[&failing.url, &healthy.url]);
    args.extend(
        [
            "--cb-failure-threshold",
            "2",
            "--cb-timeout-duration-secs",
            "60",
        ]
        .map(String::from),
    );
    let router = Router::start(&args).await;
    for _ in 0..6 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!(router.worker(&failing.url).await["circuit"], "open");
    let hits = failing.requests();
    for _ in 0..4 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert_eq!(failing.requests(), hits, "an open circuit gets no traffic");
}

#[tokio::test]
async fn admin_api_adds_and_removes_workers() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args::<&str>(&[])).await;
    let client = reqwest::Client::new();

    let response = client
        .post(router.url("/workers"))
        .json(&serde_json::json!({"url": format!("{}/", engine.url)}))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 201);
    // Routed once its first check (health and model list) passed.
    assert!(
        eventually(Duration::from_secs(3), || async {
            router.chat(false).await.status() == 200
        })
        .await
    );

    let again = client
        .post(router.url("/workers"))
        .json(&serde_json::json!({"url": engine.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 409);
    let bad = client
        .post(router.url("/workers"))
        .json(&serde_json::json!({"url": "ftp://x"}))
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let not_json = client
        .post(router.url("/workers"))
        .body("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(not_json.status(), 400);

    let encoded = engine.url.replace(':', "%3A").replace('/', "%2F");
    let removed = client
        .delete(router.url(&format!("/workers/{encoded}")))
        .send()
        .await
        .unwrap();
    assert_eq!(removed.status(), 204);
    let missing = client
        .delete(router.url(&format!("/workers/{encoded}")))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    assert_eq!(router.chat(false).await.status(), 503);
}

#[tokio::test]
async fn models_are_merged_across_workers() {
    let a = FakeEngine::start().await;
    *a.state.models.lock().await = vec!["llama".into(), "qwen".into()];
    let b = FakeEngine::start().await;
    *b.state.models.lock().await = vec!["qwen".into(), "mistral".into()];
    let router = Router::start(&base_args(&[&a.url, &b.url])).await;
    let json: serde_json::Value = reqwest::get(router.url("/v1/models"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(json["object"], "list");
    let ids: Vec<&str> = json["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, vec!["llama", "mistral", "qwen"]);
    // Once the checks have read both lists, clients asking do not fan out
    // to the engines.
    let hits = |e: &FakeEngine| {
        e.state
            .authorizations
            .lock()
            .unwrap()
            .iter()
            .filter(|(path, _)| path == "/v1/models")
            .count()
    };
    assert!(
        eventually(Duration::from_secs(3), || async {
            router.worker(&a.url).await["models"].is_array()
                && router.worker(&b.url).await["models"].is_array()
        })
        .await
    );
    let before = (hits(&a), hits(&b));
    for _ in 0..10 {
        let listed = reqwest::get(router.url("/v1/models")).await.unwrap();
        assert_eq!(listed.status(), 200);
    }
    assert_eq!(
        (hits(&a), hits(&b)),
        before,
        "answered from the checks' lists"
    );
}

#[tokio::test]
async fn metrics_expose_requests_and_worker_gauges() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    assert_eq!(router.chat(false).await.status(), 200);
    let metrics = router.metrics().await;
    for name in [
        "shoal_requests_total{route=\"chat_completions\",status=\"200\"}",
        "shoal_request_duration_seconds_bucket",
        "shoal_time_to_first_byte_seconds_bucket",
        "shoal_worker_inflight_requests",
        "shoal_worker_circuit_state",
        "shoal_workers{state=\"available\"}",
    ] {
        assert!(metrics.contains(name), "missing {name} in\n{metrics}");
    }
}

#[tokio::test]
async fn a_new_worker_is_unknown_until_checked_and_a_dead_one_is_checked_at_once() {
    let router = Router::start(&base_args::<&str>(&[])).await;
    let client = reqwest::Client::new();
    // Nothing listens there.
    let dead = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", listener.local_addr().unwrap())
    };
    let added: serde_json::Value = client
        .post(router.url("/workers"))
        .json(&serde_json::json!({"url": dead}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    // Unknown (null) until its first check, which may already have failed
    // by the time the answer is written; never "healthy" before a check.
    assert_ne!(added["healthy"], serde_json::json!(true), "{added}");
    // The default interval is 10 s; the first check runs when it is added
    // and decides at once.
    assert!(
        eventually(Duration::from_secs(3), || async {
            router.worker(&dead).await["healthy"] == serde_json::json!(false)
        })
        .await,
        "checked at once: {}",
        router.worker(&dead).await
    );
}

#[tokio::test]
async fn a_worker_added_at_run_time_takes_no_request_for_a_model_it_does_not_serve() {
    let a = FakeEngine::start().await;
    *a.state.models.lock().await = vec!["model-a".into()];
    let b = FakeEngine::start().await;
    *b.state.models.lock().await = vec!["model-b".into()];
    // B's list takes a while: the moment a new worker is most at risk.
    b.state.models_delay_ms.store(600, Ordering::SeqCst);
    let router = Router::start(&base_args(&[&a.url])).await;
    let client = reqwest::Client::new();
    let ask = |model: &'static str| {
        let request = client
            .post(router.url("/v1/chat/completions"))
            .json(&serde_json::json!({"model": model, "max_tokens": 1,
                "messages": [{"role": "user", "content": "hi"}]}));
        async move { request.send().await.unwrap().status().as_u16() }
    };
    assert!(
        eventually(Duration::from_secs(3), || async {
            ask("model-a").await == 200
        })
        .await,
        "A routes model-a"
    );
    let added = client
        .post(router.url("/workers"))
        .json(&serde_json::json!({"url": b.url}))
        .send()
        .await
        .unwrap();
    assert_eq!(added.status(), 201);
    // While B's list is being read, model-a still goes to A only.
    let started = std::time::Instant::now();
    let mut sent = 0;
    while started.elapsed() < Duration::from_millis(500) {
        assert_eq!(ask("model-a").await, 200);
        sent += 1;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(sent > 10, "{sent}");
    assert_eq!(
        b.requests(),
        0,
        "B took a request for a model it does not serve"
    );
    // Once its list is read, B takes model-b.
    assert!(
        eventually(Duration::from_secs(5), || async {
            ask("model-b").await == 200
        })
        .await,
        "B routes model-b after its check"
    );
    assert!(b.requests() >= 1);
}
