//! A tenant's charge through a real replica and a real engine socket: an
//! answer whose end reports `usage` is charged what the engine reported,
//! not the request's estimates (the body's end as hyper delivers it: the
//! last data frame, never polled past); an answer the engine fails (5xx)
//! is refunded; a request without `max_tokens` is charged the file's
//! `default_output_tokens`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::Ordering;
use std::time::Duration;

use common::fake_engine::FakeEngine;
use common::{Router, base_args, eventually};

const KEY: &str = "sk-tenant-key-0001";

async fn router_with_tenant(engine: &FakeEngine) -> (Router, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("tenants.toml");
    std::fs::write(
        &file,
        format!(
            "window_secs = 60\ndefault_output_tokens = 300\n\
             [tenants.acme]\nkeys = [\"{KEY}\"]\noutput_tokens_per_minute = 100000\n"
        ),
    )
    .unwrap();
    let mut args = base_args(&[&engine.url]);
    args.extend(["--tenants-file".into(), file.to_str().unwrap().into()]);
    (Router::start(&args).await, dir)
}

async fn chat(router: &Router, body: serde_json::Value) -> reqwest::Response {
    reqwest::Client::new()
        .post(router.url("/v1/chat/completions"))
        .bearer_auth(KEY)
        .json(&body)
        .send()
        .await
        .unwrap()
}

fn body(max_tokens: Option<u64>) -> serde_json::Value {
    let mut body = serde_json::json!({
        "model": "test-model",
        "messages": [{"role": "user", "content": "Say hello to the router tests please"}]
    });
    if let Some(n) = max_tokens {
        body["max_tokens"] = n.into();
    }
    body
}

/// The tenant's fleet-wide usage as `GET /tenants` shows it.
async fn used(router: &Router) -> serde_json::Value {
    let status: serde_json::Value = reqwest::get(router.url("/tenants"))
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    status["tenants"][0]["used"].clone()
}

/// Waits until the tenant's usage reads `want` (the charge settles as the
/// answer's last frame goes out, just after the client has the body).
async fn settles_to(router: &Router, want: serde_json::Value) -> serde_json::Value {
    let reached = eventually(Duration::from_secs(3), || {
        let want = want.clone();
        async move { used(router).await == want }
    })
    .await;
    let last = used(router).await;
    assert!(reached, "usage {last} never became {want}");
    last
}

#[tokio::test]
async fn an_answer_that_reports_usage_is_charged_what_it_used() {
    let engine = FakeEngine::start().await;
    let (router, _dir) = router_with_tenant(&engine).await;
    let resp = chat(&router, body(Some(100))).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-ratelimit-remaining-output-tokens"],
        "99900",
        "admission charges max_tokens"
    );
    let text = resp.text().await.unwrap();
    assert!(text.contains("\"completion_tokens\":1"), "{text}");
    // The fake engine reports 9 prompt and 1 completion tokens.
    settles_to(
        &router,
        serde_json::json!({"requests": 1, "tokens": 10, "input_tokens": 9,
                           "output_tokens": 1, "in_flight": 0}),
    )
    .await;
}

#[tokio::test]
async fn an_answer_the_engine_failed_is_refunded() {
    let engine = FakeEngine::start().await;
    let (router, _dir) = router_with_tenant(&engine).await;
    engine.state.fixed_status.store(500, Ordering::SeqCst);
    let resp = chat(&router, body(Some(100))).await;
    assert_eq!(resp.status(), 500);
    drop(resp.bytes().await);
    settles_to(
        &router,
        serde_json::json!({"requests": 0, "tokens": 0, "input_tokens": 0,
                           "output_tokens": 0, "in_flight": 0}),
    )
    .await;
}

#[tokio::test]
async fn a_request_without_max_tokens_is_charged_the_default_until_settled() {
    let engine = FakeEngine::start().await;
    let (router, _dir) = router_with_tenant(&engine).await;
    let resp = chat(&router, body(None)).await;
    assert_eq!(resp.status(), 200);
    assert_eq!(
        resp.headers()["x-ratelimit-remaining-output-tokens"],
        "99700",
        "default_output_tokens = 300 charged at admission"
    );
    drop(resp.bytes().await);
    let settled = settles_to(
        &router,
        serde_json::json!({"requests": 1, "tokens": 10, "input_tokens": 9,
                           "output_tokens": 1, "in_flight": 0}),
    )
    .await;
    assert_eq!(settled["output_tokens"], 1);
}
