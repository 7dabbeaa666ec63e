//! Every proxied route and model-aware routing, against real sockets: each
//! route reaches the engine with its method, path and body unchanged,
//! streams where it streams, and releases its booking; a request for a
//! model goes only to the engines that list it; an unknown model is 404.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::fake_engine::{CHUNKS, FakeEngine};
use common::{Router, base_args, eventually};

/// Flags for a replica whose health checks (and so model lists) run fast.
fn fast_checks(workers: &[&str]) -> Vec<String> {
    let mut args = base_args(workers);
    args.extend(["--health-check-interval-secs".into(), "1".into()]);
    args
}

async fn released(router: &Router, engine: &FakeEngine) -> bool {
    router
        .released(&[&engine.url], Duration::from_secs(2))
        .await
}

#[tokio::test]
async fn every_named_route_passes_its_body_through_and_streams_where_asked() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    let client = reqwest::Client::new();
    let routes = [
        "/v1/responses",
        "/v1/messages",
        "/v1/rerank",
        "/rerank",
        "/v1/score",
        "/classify",
        "/pooling",
        "/tokenize",
        "/detokenize",
        "/v1/audio/speech",
        "/generate",
    ];
    for path in routes {
        // A body with odd spacing and key order: it must arrive untouched.
        let body = format!("{{ \"stream\":false,\"model\":\"m\" , \"input\":\"hello {path}\" }}");
        let response = client
            .post(router.url(&format!("{path}?trace=1")))
            .header("content-type", "application/json")
            .body(body.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200, "{path}");
        let _ = response.bytes().await.unwrap();
        assert_eq!(
            *engine.state.last_body.lock().await,
            body.as_bytes(),
            "{path}"
        );
        let (method, target, _) = engine
            .state
            .last_request
            .lock()
            .await
            .clone()
            .unwrap_or_default();
        if path != "/generate" {
            assert_eq!(
                (method.as_str(), target.as_str()),
                ("POST", format!("{path}?trace=1").as_str())
            );
        }
        assert!(released(&router, &engine).await, "{path}: booking released");

        let streamed = client
            .post(router.url(path))
            .header("content-type", "application/json")
            .body(r#"{"model":"m","stream":true,"input":"x"}"#)
            .send()
            .await
            .unwrap();
        assert_eq!(
            streamed.headers()["content-type"],
            "text/event-stream",
            "{path}"
        );
        assert_eq!(
            streamed.bytes().await.unwrap(),
            CHUNKS.concat().as_bytes(),
            "{path}"
        );
        assert!(
            released(&router, &engine).await,
            "{path}: stream booking released"
        );
    }
    let metrics = router.metrics().await;
    for label in [
        "responses",
        "messages",
        "rerank",
        "score",
        "tokenize",
        "audio_speech",
    ] {
        assert!(
            metrics.contains(&format!("route=\"{label}\"")),
            "{label} counted under its own label"
        );
    }
}

#[tokio::test]
async fn audio_uploads_pass_through_as_multipart_and_unknown_v1_paths_share_one_label() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    let client = reqwest::Client::new();
    let upload = "--XyZ\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.wav\"\r\n\
                  Content-Type: audio/wav\r\n\r\nRIFF\x00\x01binary\r\n--XyZ\r\n\
                  Content-Disposition: form-data; name=\"model\"\r\n\r\nwhisper-1\r\n--XyZ--\r\n";
    let response = client
        .post(router.url("/v1/audio/transcriptions"))
        .header("content-type", "multipart/form-data; boundary=XyZ")
        .body(upload)
        .send()
        .await
        .unwrap();
    assert_eq!(
        response.status(),
        200,
        "multipart is not refused as bad JSON"
    );
    assert_eq!(*engine.state.last_body.lock().await, upload.as_bytes());
    let (_, target, content_type) = engine.state.last_request.lock().await.clone().unwrap();
    assert_eq!(target, "/v1/audio/transcriptions");
    assert_eq!(
        content_type.as_deref(),
        Some("multipart/form-data; boundary=XyZ")
    );

    for (method, path) in [
        (reqwest::Method::GET, "/v1/responses/resp_1"),
        (reqwest::Method::DELETE, "/v1/responses/resp_1"),
        (reqwest::Method::POST, "/v1/made/up/route"),
        (reqwest::Method::POST, "/v1/also/made/up"),
    ] {
        let response = client
            .request(method.clone(), router.url(path))
            .body(if method == reqwest::Method::POST {
                "{}"
            } else {
                ""
            })
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "{method} {path} passes through, not 404"
        );
        let (seen_method, target, _) = engine.state.last_request.lock().await.clone().unwrap();
        assert_eq!(
            (seen_method, target),
            (method.to_string(), path.to_string())
        );
        assert!(released(&router, &engine).await, "{path}: booking released");
    }
    let metrics = router.metrics().await;
    let other_series = metrics
        .lines()
        .filter(|l| l.starts_with("shoal_requests_total{") && l.contains("route=\"other\""))
        .count();
    assert_eq!(
        other_series, 1,
        "unknown paths share one series:\n{metrics}"
    );
    assert!(!metrics.contains("made/up"), "no path reaches a label");
    // Outside /v1/ an unknown path is still the router's 404.
    let response = client.post(router.url("/not/v1")).send().await.unwrap();
    assert_eq!(response.status(), 404);
}

#[tokio::test]
async fn a_model_reaches_only_the_engines_that_list_it_and_an_unknown_one_is_404() {
    let llama = [FakeEngine::start().await, FakeEngine::start().await];
    let qwen = FakeEngine::start().await;
    for engine in &llama {
        *engine.state.models.lock().await = vec!["llama".into(), "llama-sql-lora".into()];
    }
    *qwen.state.models.lock().await = vec!["qwen".into()];
    let urls = [&llama[0].url, &llama[1].url, &qwen.url].map(String::as_str);
    let router = Router::start(&fast_checks(&urls)).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            router
                .workers()
                .await
                .as_array()
                .unwrap()
                .iter()
                .all(|w| w["models"].is_array())
        })
        .await,
        "every worker's model list was read"
    );
    let ask = |model: &'static str| {
        let router = &router;
        async move {
            let body = serde_json::json!({"model": model, "messages": [{"role": "user", "content": "hi"}]});
            router.post_json("/v1/chat/completions", &body).await
        }
    };
    for _ in 0..6 {
        assert_eq!(ask("llama").await.status(), 200);
        assert_eq!(ask("llama-sql-lora").await.status(), 200);
    }
    assert_eq!(qwen.requests(), 0, "llama and its adapter never reach qwen");
    assert_eq!(llama[0].requests() + llama[1].requests(), 12);
    assert!(
        llama.iter().all(|e| e.requests() > 0),
        "spread over both llama engines"
    );
    for _ in 0..3 {
        assert_eq!(ask("qwen").await.status(), 200);
    }
    assert_eq!(qwen.requests(), 3);

    let missing = ask("gpt-4").await;
    assert_eq!(missing.status(), 404);
    let error: serde_json::Value = missing.json().await.unwrap();
    assert_eq!(error["error"]["code"], "model_not_found");
    let message = error["error"]["message"].as_str().unwrap();
    for served in ["llama", "llama-sql-lora", "qwen"] {
        assert!(message.contains(served), "{message} lists {served}");
    }
    // No model named: any engine.
    let anon = serde_json::json!({"messages": [{"role": "user", "content": "hi"}]});
    assert_eq!(
        router
            .post_json("/v1/chat/completions", &anon)
            .await
            .status(),
        200
    );

    // An adapter loaded at run time is routable after the next check.
    qwen.state.models.lock().await.push("qwen-new-lora".into());
    assert!(
        eventually(Duration::from_secs(5), || async {
            ask("qwen-new-lora").await.status() == 200
        })
        .await,
        "a new adapter becomes routable"
    );
}

#[tokio::test]
async fn cache_aware_judges_balance_among_the_workers_of_the_requested_model() {
    let llama = [FakeEngine::start().await, FakeEngine::start().await];
    let qwen = FakeEngine::start().await;
    for engine in &llama {
        *engine.state.models.lock().await = vec!["llama".into()];
    }
    *qwen.state.models.lock().await = vec!["qwen".into()];
    qwen.state
        .pause_after_first
        .store(true, std::sync::atomic::Ordering::SeqCst);
    let urls = [&llama[0].url, &llama[1].url, &qwen.url].map(String::as_str);
    let mut args = fast_checks(&urls);
    for (flag, value) in [
        ("--policy", "cache_aware"),
        ("--balance-abs-threshold", "2"),
        ("--balance-rel-threshold", "1.0"),
    ] {
        args.extend([flag.to_string(), value.to_string()]);
    }
    let router = Router::start(&args).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            router
                .workers()
                .await
                .as_array()
                .unwrap()
                .iter()
                .all(|w| w["models"].is_array())
        })
        .await
    );
    // Four qwen streams held open: qwen's engine is 4 requests ahead.
    let mut held = Vec::new();
    for k in 0..4 {
        let body = serde_json::json!({"model": "qwen", "stream": true,
            "messages": [{"role": "user", "content": format!("held {k}")}]});
        let response = router.post_json("/v1/chat/completions", &body).await;
        let mut stream = response.bytes_stream();
        let _ = futures_util::StreamExt::next(&mut stream).await;
        held.push(stream);
    }
    assert_eq!(router.worker(&qwen.url).await["inflight_requests"], 4);
    // The same long llama prompt six times: the llama pool is balanced (0
    // and 0 in flight), so affinity keeps it on one engine. Had the guard
    // compared qwen's 4 too, every request would fall back to the least
    // loaded llama engine, a coin toss each time.
    let prompt = "You are a helpful assistant. ".repeat(20);
    for _ in 0..6 {
        let body = serde_json::json!({"model": "llama",
            "messages": [{"role": "user", "content": prompt}]});
        assert_eq!(
            router
                .post_json("/v1/chat/completions", &body)
                .await
                .status(),
            200
        );
    }
    let counts = [llama[0].requests(), llama[1].requests()];
    assert!(
        counts == [6, 0] || counts == [0, 6],
        "affinity held within llama: {counts:?}"
    );
    qwen.state.resume.notify_waiters();
    drop(held);
}
