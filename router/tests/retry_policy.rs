//! The retry rule through a real replica: a request is sent again only
//! where the engine provably did not start it, or where running it twice
//! does no harm (an idempotent method).
//!
//! The engines here are small HTTP servers on loopback that read each
//! request whole and then, as scripted, answer it or close the socket
//! without a word — an engine that died after reading the request.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, base_args, chat_body, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// Reads one request (head and `content-length` body); `None` at
/// end-of-file. Returns the request line.
async fn read_request(stream: &mut TcpStream, pending: &mut Vec<u8>) -> Option<String> {
    loop {
        if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
            let body_len: usize = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .map_or(0, |v| v.trim().parse().unwrap());
            let total = end + 4 + body_len;
            if pending.len() >= total {
                let line = head.lines().next().unwrap_or_default().to_string();
                pending.drain(..total);
                return Some(line);
            }
        }
        let mut chunk = [0u8; 4096];
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        pending.extend_from_slice(&chunk[..n]);
    }
}

const ANSWER: &str = r#"{"id":"c1","object":"chat.completion","choices":[]}"#;

/// An engine that answers `/health` (and 404 to `/v1/models`, so it
/// serves any model) and, for every other request, answers it when
/// `answers(request_index_on_its_connection)` says so, else reads it whole
/// and closes the connection. Counts the requests it read.
struct DyingEngine {
    url: String,
    requests: Arc<AtomicUsize>,
}

impl DyingEngine {
    async fn start(answers: fn(usize) -> bool) -> DyingEngine {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let requests = Arc::new(AtomicUsize::new(0));
        let counter = requests.clone();
        tokio::spawn(async move {
            while let Ok((mut stream, _)) = listener.accept().await {
                let counter = counter.clone();
                tokio::spawn(async move {
                    let mut pending = Vec::new();
                    let mut served = 0;
                    while let Some(line) = read_request(&mut stream, &mut pending).await {
                        let reply = if line.contains(" /health ") {
                            "HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n".to_string()
                        } else if line.contains(" /v1/models ") {
                            "HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n".to_string()
                        } else {
                            counter.fetch_add(1, Ordering::SeqCst);
                            served += 1;
                            if !answers(served - 1) {
                                return; // read whole, closed unanswered
                            }
                            format!(
                                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{ANSWER}",
                                ANSWER.len()
                            )
                        };
                        if stream.write_all(reply.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        DyingEngine { url, requests }
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

fn never(_: usize) -> bool {
    false
}

fn first_only(i: usize) -> bool {
    i == 0
}

async fn error_message(response: reqwest::Response) -> String {
    let json: serde_json::Value = response.json().await.unwrap();
    assert_eq!(json["error"]["code"], "upstream_unreachable", "{json}");
    json["error"]["message"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_post_the_engine_read_whole_and_died_on_is_not_sent_again() {
    let (a, b) = (
        DyingEngine::start(never).await,
        DyingEngine::start(never).await,
    );
    let router = Router::start(&base_args(&[&a.url, &b.url])).await;
    let response = router.chat(false).await;
    assert_eq!(response.status(), 502);
    let message = error_message(response).await;
    assert_eq!(
        a.requests() + b.requests(),
        1,
        "the engines together saw the POST once: {message}"
    );
    assert!(
        message.contains("1 attempt(s)")
            && message.contains("closed the connection after the whole request was sent")
            && message.contains("POST is not idempotent"),
        "{message}"
    );
    let metrics = router.metrics().await;
    assert!(
        metrics.contains(
            "shoal_retries_unsafe_total{route=\"chat_completions\",reason=\"transport\"} 1"
        ),
        "{metrics}"
    );
}

#[tokio::test]
async fn a_get_in_the_same_situation_is_sent_again() {
    let (a, b) = (
        DyingEngine::start(never).await,
        DyingEngine::start(never).await,
    );
    let mut args = base_args(&[&a.url, &b.url]);
    args.extend(["--retry-max-retries".into(), "1".into()]);
    let router = Router::start(&args).await;
    let response = reqwest::get(router.url("/v1/made/up")).await.unwrap();
    assert_eq!(response.status(), 502);
    let message = error_message(response).await;
    assert_eq!(a.requests(), 1, "{message}");
    assert_eq!(b.requests(), 1, "retried on the other worker: {message}");
    assert!(message.contains("2 attempt(s)"), "{message}");

    // With a worker that answers, the GET gets its answer either way.
    let good = FakeEngine::start().await;
    let router = Router::start(&base_args(&[&a.url, &good.url])).await;
    for _ in 0..2 {
        let response = reqwest::get(router.url("/v1/made/up")).await.unwrap();
        assert_eq!(response.status(), 200);
    }
}

#[tokio::test]
async fn a_post_refused_with_503_is_retried_and_a_500_passes_through() {
    let refusing = FakeEngine::start().await;
    refusing.state.fixed_status.store(503, Ordering::SeqCst);
    let good = FakeEngine::start().await;
    let mut args = base_args(&[&refusing.url, &good.url]);
    args.push("--disable-circuit-breaker".into());
    let router = Router::start(&args).await;
    for _ in 0..2 {
        assert_eq!(router.chat(false).await.status(), 200);
    }
    assert!(refusing.requests() >= 1, "round robin tried it first");
    assert_eq!(
        good.requests(),
        2,
        "the refused ones went to the other worker"
    );

    let failing = FakeEngine::start().await;
    failing.state.fixed_status.store(500, Ordering::SeqCst);
    let good = FakeEngine::start().await;
    let mut args = base_args(&[&failing.url, &good.url]);
    args.push("--disable-circuit-breaker".into());
    let router = Router::start(&args).await;
    // Both workers checked first: until then an unchecked worker takes no
    // request, and both would go to whichever was checked first.
    assert!(
        eventually(Duration::from_secs(5), || async {
            let workers = router.workers().await;
            workers
                .as_array()
                .is_some_and(|all| all.iter().all(|w| w["healthy"] == true))
        })
        .await,
        "both workers checked"
    );
    let mut statuses: Vec<u16> = Vec::new();
    for _ in 0..2 {
        statuses.push(router.chat(false).await.status().as_u16());
    }
    statuses.sort_unstable();
    assert_eq!(statuses, [200, 500], "the 500 is the engine's answer");
    assert_eq!(failing.requests(), 1);
    assert_eq!(good.requests(), 1, "not sent again");
    let metrics = router.metrics().await;
    assert!(
        metrics
            .contains("shoal_retries_unsafe_total{route=\"chat_completions\",reason=\"status\"} 1"),
        "{metrics}"
    );

    // The same 500 to an idempotent request is retried.
    let failing = FakeEngine::start().await;
    failing.state.fixed_status.store(500, Ordering::SeqCst);
    let good = FakeEngine::start().await;
    let mut args = base_args(&[&failing.url, &good.url]);
    args.push("--disable-circuit-breaker".into());
    let router = Router::start(&args).await;
    for _ in 0..2 {
        let response = reqwest::Client::new()
            .delete(router.url("/v1/made/up"))
            .send()
            .await
            .unwrap();
        assert_eq!(response.status(), 200);
    }
}

#[tokio::test]
async fn a_reused_connection_closed_after_the_request_is_resent_only_for_idempotent_methods() {
    // Each connection answers its first request; the next one on it is
    // read whole and the connection closed unanswered.
    let engine = DyingEngine::start(first_only).await;
    let mut args = base_args(&[&engine.url]);
    args.extend(["--io-threads".into(), "1".into()]);
    let router = Router::start(&args).await;
    let client = reqwest::Client::new();
    let chat = || {
        client
            .post(router.url("/v1/chat/completions"))
            .json(&chat_body(false))
            .send()
    };
    assert_eq!(chat().await.unwrap().status(), 200);
    let response = chat().await.unwrap();
    assert_eq!(response.status(), 502);
    let message = error_message(response).await;
    assert_eq!(
        engine.requests(),
        2,
        "the second POST was not resent: {message}"
    );
    assert!(message.contains("POST is not idempotent"), "{message}");

    // A GET on the next reused connection goes again on a fresh one.
    let engine = DyingEngine::start(first_only).await;
    let mut args = base_args(&[&engine.url]);
    args.extend(["--io-threads".into(), "1".into()]);
    let router = Router::start(&args).await;
    for _ in 0..2 {
        let response = client.get(router.url("/v1/made/up")).send().await.unwrap();
        assert_eq!(response.status(), 200);
    }
    assert_eq!(engine.requests(), 3, "resent once on a new connection");
}

#[tokio::test]
async fn a_post_with_no_answer_head_in_time_is_not_sent_again() {
    let stalled = FakeEngine::start().await;
    stalled.state.stall.store(true, Ordering::SeqCst);
    let other = FakeEngine::start().await;
    other.state.stall.store(true, Ordering::SeqCst);
    let mut args = base_args(&[&stalled.url, &other.url]);
    args.extend(["--attempt-timeout-secs".into(), "1".into()]);
    let router = Router::start(&args).await;
    let response = router.chat(false).await;
    assert_eq!(response.status(), 504);
    let message = response.text().await.unwrap();
    assert_eq!(stalled.requests() + other.requests(), 1, "{message}");
    assert!(
        message.contains("--attempt-timeout-secs") && message.contains("POST is not idempotent"),
        "{message}"
    );
}
