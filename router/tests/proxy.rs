//! The proxy path against real sockets: streaming pass-through, client
//! disconnects, bookings, and the router's own error answers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_engine::{CHUNKS, FakeEngine};
use common::{Router, base_args, chat_body, eventually};
use futures_util::StreamExt;

#[tokio::test]
async fn sse_chunks_arrive_incrementally_and_byte_identical() {
    let engine = FakeEngine::start().await;
    engine.state.pause_after_first.store(true, Ordering::SeqCst);
    let router = Router::start(&base_args(&[&engine.url])).await;

    let response = router.chat(true).await;
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.bytes_stream();

    // The engine is paused after its first chunk: the client must already
    // hold that chunk, so the router did not buffer.
    let mut received = Vec::new();
    while received.len() < CHUNKS[0].len() {
        let chunk = tokio::time::timeout(Duration::from_secs(5), body.next())
            .await
            .expect("first chunk arrives while the engine is still generating")
            .unwrap()
            .unwrap();
        received.extend_from_slice(&chunk);
    }
    assert_eq!(received, CHUNKS[0].as_bytes());
    let entry = router.worker(&engine.url).await;
    assert_eq!(entry["inflight_requests"], 1, "booked while streaming");

    engine.state.resume.notify_waiters();
    while let Some(chunk) = body.next().await {
        received.extend_from_slice(&chunk.unwrap());
    }
    assert_eq!(received, CHUNKS.concat().as_bytes());
    assert!(
        eventually(Duration::from_secs(2), || async {
            router.worker(&engine.url).await["inflight_requests"] == 0
        })
        .await,
        "booking released when the stream ended"
    );
}

#[tokio::test]
async fn client_disconnect_cancels_the_upstream_request_and_releases_the_booking() {
    let engine = FakeEngine::start().await;
    engine.state.hang_after_first.store(true, Ordering::SeqCst);
    let router = Router::start(&base_args(&[&engine.url])).await;

    let response = router.chat(true).await;
    let mut body = response.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    assert!(!first.is_empty());
    assert_eq!(router.worker(&engine.url).await["inflight_requests"], 1);
    assert!(!engine.state.stream_dropped.load(Ordering::SeqCst));

    drop(body);
    assert!(
        eventually(Duration::from_secs(5), || async {
            engine.state.stream_dropped.load(Ordering::SeqCst)
        })
        .await,
        "the engine saw its stream cancelled"
    );
    assert!(
        router
            .released(&[&engine.url], Duration::from_secs(2))
            .await,
        "booking released after the client left"
    );
}

#[tokio::test]
async fn request_body_and_path_reach_the_engine_unchanged() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    let body = r#"{"text":"hi","sampling_params":{"max_new_tokens":3},"extra":[1,2]}"#;
    let response = reqwest::Client::new()
        .post(router.url("/generate"))
        .header("content-type", "application/json")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["choices"][0]["message"]["content"], "Hello");
    assert_eq!(&engine.state.last_body.lock().await[..], body.as_bytes());
}

async fn assert_openai_error(response: reqwest::Response, status: u16, code: &str) -> String {
    assert_eq!(response.status(), status);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], code, "{json}");
    assert!(json["error"]["type"].is_string(), "{json}");
    json["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn malformed_json_gets_400_and_never_reaches_an_engine() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    let response = reqwest::Client::new()
        .post(router.url("/v1/chat/completions"))
        .body("{\"messages\": [")
        .send()
        .await
        .unwrap();
    let message = assert_openai_error(response, 400, "invalid_json").await;
    assert!(message.contains("not valid JSON"), "{message}");
    assert_eq!(engine.requests(), 0);
}

#[tokio::test]
async fn oversized_body_gets_413() {
    let engine = FakeEngine::start().await;
    let mut args = base_args(&[&engine.url]);
    args.extend(["--max-payload-bytes".into(), "1024".into()]);
    let router = Router::start(&args).await;
    let big = format!("{{\"prompt\":\"{}\"}}", "x".repeat(4096));
    let response = reqwest::Client::new()
        .post(router.url("/v1/completions"))
        .body(big.clone())
        .send()
        .await
        .unwrap();
    let message = assert_openai_error(response, 413, "payload_too_large").await;
    assert!(message.contains("1024"), "{message}");

    // Same without a Content-Length header (chunked upload).
    let chunks = futures_util::stream::iter(
        big.into_bytes()
            .chunks(256)
            .map(|c| Ok::<_, std::io::Error>(c.to_vec()))
            .collect::<Vec<_>>(),
    );
    let response = reqwest::Client::new()
        .post(router.url("/v1/completions"))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_openai_error(response, 413, "payload_too_large").await;
    assert_eq!(engine.requests(), 0);
}

#[tokio::test]
async fn empty_pool_gets_503_with_a_reason() {
    let router = Router::start(&base_args::<&str>(&[])).await;
    let response = router.chat(false).await;
    assert_eq!(response.headers()["retry-after"], "1");
    let message = assert_openai_error(response, 503, "no_available_workers").await;
    assert!(message.contains("no workers are registered"), "{message}");
    let readiness = reqwest::get(router.url("/readiness")).await.unwrap();
    assert_eq!(readiness.status(), 503);
    let liveness = reqwest::get(router.url("/liveness")).await.unwrap();
    assert_eq!(liveness.status(), 200);
}

#[tokio::test]
async fn unreachable_workers_give_502_after_retries() {
    // Bind then drop a listener: the port is closed, connects are refused.
    let closed = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let mut args = base_args(&[&closed]);
    args.extend(["--retry-max-retries".into(), "2".into()]);
    let router = Router::start(&args).await;
    let response = router.chat(false).await;
    let message = assert_openai_error(response, 502, "upstream_unreachable").await;
    assert!(
        message.contains("3 attempt(s)") && message.contains(&closed),
        "{message}"
    );
    assert_eq!(router.worker(&closed).await["inflight_requests"], 0);
}

#[tokio::test]
async fn a_refused_worker_is_not_booked_during_the_retry_backoff() {
    // Bind then drop a listener: the port is closed, connects are refused.
    let dead = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        format!("http://{}", l.local_addr().unwrap())
    };
    let engine = FakeEngine::start().await;
    // base_args routes round_robin over the workers in flag order, and this
    // replica's counter starts at 0: the first attempt goes to `dead`, the
    // retry to the only untried (and still available) worker, `engine`.
    let mut args = base_args(&[&dead, &engine.url]);
    args.extend(
        [
            "--retry-max-retries",
            "1",
            "--retry-initial-backoff-ms",
            "1500",
            "--retry-max-backoff-ms",
            "1500",
            "--retry-jitter-factor",
            "0",
            // The circuit opens on the first failure: `circuit == "open"`
            // in `GET /workers` tells the test that the first attempt
            // failed, i.e. the request has entered its backoff.
            "--cb-failure-threshold",
            "1",
            // Workers start healthy. The health checker probes once at
            // startup, which fails for `dead`, but one failed probe is below
            // the threshold and the next round is an hour away, so `dead`
            // stays in rotation and is still the first pick.
            "--health-failure-threshold",
            "3",
            "--health-check-interval-secs",
            "3600",
        ]
        .map(String::from),
    );
    let router = Router::start(&args).await;

    let request = tokio::spawn(
        reqwest::Client::new()
            .post(router.url("/v1/chat/completions"))
            .json(&chat_body(false))
            .send(),
    );
    assert!(
        eventually(Duration::from_secs(5), || async {
            router.worker(&dead).await["circuit"] == "open"
        })
        .await,
        "the first attempt went to the refused worker and failed"
    );
    assert_eq!(engine.requests(), 0, "the retry has not been sent yet");
    let entry = router.worker(&dead).await;
    // Still nothing reached the healthy engine, so the read above happened
    // while the request was sleeping its 1.5 s backoff.
    assert_eq!(engine.requests(), 0, "read during the backoff");
    assert_eq!(
        entry["inflight_requests"], 0,
        "released before the backoff: {entry}"
    );
    assert_eq!(
        entry["inflight_tokens"], 0,
        "released before the backoff: {entry}"
    );

    let response = tokio::time::timeout(Duration::from_secs(10), request)
        .await
        .expect("the retry answers within 10 s")
        .unwrap()
        .unwrap();
    assert_eq!(response.status(), 200);
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["choices"][0]["message"]["content"], "Hello");
    assert_eq!(engine.requests(), 1);
    assert!(
        eventually(Duration::from_secs(2), || async {
            router.worker(&engine.url).await["inflight_requests"] == 0
        })
        .await,
        "the healthy worker's booking is released after the answer"
    );
}

#[tokio::test]
async fn unknown_route_and_wrong_method_get_openai_errors() {
    let router = Router::start(&base_args::<&str>(&[])).await;
    let response = reqwest::get(router.url("/nothing")).await.unwrap();
    assert_openai_error(response, 404, "not_found").await;
    let response = reqwest::Client::new()
        .post(router.url("/health"))
        .send()
        .await
        .unwrap();
    assert_openai_error(response, 405, "method_not_allowed").await;
    // Under /v1/ an unknown route is proxied (here: to no worker at all).
    let response = reqwest::get(router.url("/v1/nothing")).await.unwrap();
    assert_openai_error(response, 503, "no_available_workers").await;
}

#[tokio::test]
async fn a_worker_that_never_answers_gets_504_at_the_deadline() {
    let engine = FakeEngine::start().await;
    engine.state.stall.store(true, Ordering::SeqCst);
    let mut args = base_args(&[&engine.url]);
    args.extend(["--request-timeout-secs".into(), "1".into()]);
    let router = Router::start(&args).await;
    let started = std::time::Instant::now();
    let response = router.chat(false).await;
    let message = assert_openai_error(response, 504, "upstream_timeout").await;
    assert!(message.contains("--request-timeout-secs"), "{message}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(router.worker(&engine.url).await["inflight_requests"], 0);
}

#[tokio::test]
async fn the_answering_worker_is_named_only_when_asked() {
    let engine = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&engine.url])).await;
    let response = router.chat(false).await;
    assert!(
        response.headers().get("x-shoal-worker").is_none(),
        "private by default"
    );
    let mut args = base_args(&[&engine.url]);
    args.push("--expose-worker-header".into());
    let router = Router::start(&args).await;
    let response = router.chat(true).await;
    assert_eq!(response.headers()["x-shoal-worker"], engine.url.as_str());
}

#[tokio::test]
async fn clients_trickling_their_bodies_hold_no_admission_slot() {
    use tokio::io::AsyncWriteExt;
    let engine = FakeEngine::start().await;
    let mut args = base_args(&[&engine.url]);
    args.extend(
        ["--max-concurrent-requests", "1", "--queue-size", "0"]
            .into_iter()
            .map(String::from),
    );
    let router = Router::start(&args).await;
    // Two clients declare a body and send only its first byte.
    let mut trickling = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(router.addr).await.unwrap();
        stream
            .write_all(
                b"POST /v1/chat/completions HTTP/1.1\r\nhost: shoal\r\n\
                  content-type: application/json\r\ncontent-length: 100\r\n\r\n{",
            )
            .await
            .unwrap();
        trickling.push(stream);
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The one proxying slot is still free for a client that sent its body.
    let answered = reqwest::Client::new()
        .post(router.url("/v1/chat/completions"))
        .json(&chat_body(false))
        .send()
        .await
        .unwrap();
    assert_eq!(
        answered.status(),
        200,
        "a slow body must not hold the slot: {}",
        answered.text().await.unwrap_or_default()
    );
    drop(trickling);
}
