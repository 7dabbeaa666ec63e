//! Keys, HTTPS engines and per-attempt deadlines against real sockets:
//! every inference and admin route refuses a missing or wrong key and an
//! inference key does not open the admin routes; a Shoal key never reaches
//! an engine while `--worker-api-key` does (side requests included); an
//! `https://` engine is routed and checked through the CA given, and one
//! of another CA is refused with the reason, and a pooled connection it
//! closed while idle is not reused for a POST; a worker that accepts and
//! never answers loses an idempotent request to another one at the
//! attempt deadline.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use common::fake_engine::FakeEngine;
use common::{Router, base_args, chat_body, eventually};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const KEY: &str = "sk-inference-key-1";
const ADMIN: &str = "sk-admin-key-0001";

async fn send(
    router: &Router,
    method: reqwest::Method,
    path: &str,
    key: Option<&str>,
    body: Option<serde_json::Value>,
) -> reqwest::Response {
    let mut request = reqwest::Client::new().request(method, router.url(path));
    if let Some(key) = key {
        request = request.bearer_auth(key);
    }
    if let Some(body) = body {
        request = request.json(&body);
    }
    request.send().await.unwrap()
}

async fn code(response: reqwest::Response) -> (u16, String) {
    let status = response.status().as_u16();
    let json: serde_json::Value = response.json().await.unwrap_or_default();
    (
        status,
        json["error"]["code"].as_str().unwrap_or("").to_string(),
    )
}

#[tokio::test]
async fn keys_guard_every_inference_and_admin_route_and_stay_apart() {
    let engine = FakeEngine::start().await;
    let mut args = base_args(&[&engine.url]);
    args.extend(["--api-key".into(), format!("{KEY},sk-inference-key-2")]);
    args.extend(["--admin-api-key".into(), ADMIN.into()]);
    let router = Router::start(&args).await;
    use reqwest::Method;
    let chat = Some(chat_body(false));
    let inference = [
        (Method::POST, "/v1/chat/completions", chat.clone()),
        (Method::POST, "/v1/responses", chat.clone()),
        (Method::POST, "/tokenize", chat.clone()),
        (Method::GET, "/v1/responses/r1", None),
        (Method::GET, "/v1/models", None),
    ];
    for (method, path, body) in &inference {
        let missing = send(&router, method.clone(), path, None, body.clone()).await;
        assert_eq!(missing.headers()["www-authenticate"], "Bearer", "{path}");
        assert_eq!(
            code(missing).await,
            (401, "invalid_api_key".into()),
            "{path}"
        );
        let wrong = send(
            &router,
            method.clone(),
            path,
            Some("sk-wrong-key-000"),
            body.clone(),
        )
        .await;
        assert_eq!(code(wrong).await, (401, "invalid_api_key".into()), "{path}");
        let admin = send(&router, method.clone(), path, Some(ADMIN), body.clone()).await;
        assert_eq!(
            admin.status(),
            401,
            "{path}: the admin key is not an inference key"
        );
        let right = send(
            &router,
            method.clone(),
            path,
            Some("sk-inference-key-2"),
            body.clone(),
        )
        .await;
        assert_eq!(right.status(), 200, "{path}");
    }
    let add = Some(serde_json::json!({"url": "http://127.0.0.1:9"}));
    let admin = [
        (Method::GET, "/workers", None),
        (Method::POST, "/workers", add),
        (Method::GET, "/mesh/status", None),
    ];
    for (method, path, body) in &admin {
        let missing = send(&router, method.clone(), path, None, body.clone()).await;
        assert_eq!(
            code(missing).await,
            (401, "invalid_api_key".into()),
            "{path}"
        );
        let inference_key = send(&router, method.clone(), path, Some(KEY), body.clone()).await;
        assert_eq!(
            inference_key.status(),
            401,
            "{path}: an inference key is not an admin key"
        );
        let right = send(&router, method.clone(), path, Some(ADMIN), body.clone()).await;
        assert_ne!(right.status().as_u16(), 401, "{path}");
    }
    for open in ["/health", "/readiness", "/liveness", "/metrics"] {
        assert_eq!(
            send(&router, Method::GET, open, None, None).await.status(),
            200,
            "{open}"
        );
    }
    let metrics = router.metrics().await;
    assert!(
        metrics.contains("shoal_auth_failures_total{scope=\"inference\",reason=\"missing\"}"),
        "{metrics}"
    );
    assert!(metrics.contains("scope=\"admin\",reason=\"invalid\""));
    assert!(
        !metrics.contains(KEY) && !metrics.contains(ADMIN),
        "keys are never shown"
    );
}

#[tokio::test]
async fn without_an_admin_key_admin_writes_are_refused_unless_loopback_is_opted_in() {
    let engine = FakeEngine::start().await;
    let mut args: Vec<String> = base_args(&[&engine.url])
        .into_iter()
        .filter(|a| a != "--allow-loopback-admin-writes")
        .collect();
    args.extend(["--api-key".into(), KEY.into()]);
    let add = serde_json::json!({"url": "http://127.0.0.1:9"});
    let router = Router::start(&args).await;
    let refused = send(
        &router,
        reqwest::Method::POST,
        "/workers",
        None,
        Some(add.clone()),
    )
    .await;
    let (status, code) = code(refused).await;
    assert_eq!(
        (status, code.as_str()),
        (403, "admin_forbidden"),
        "even from loopback: a same-host proxy makes everyone local"
    );
    let listed = send(&router, reqwest::Method::GET, "/workers", None, None).await;
    assert_eq!(listed.status(), 200, "admin reads stay open");
    drop(router);
    args.push("--allow-loopback-admin-writes".into());
    let router = Router::start(&args).await;
    let added = send(&router, reqwest::Method::POST, "/workers", None, Some(add)).await;
    assert_eq!(
        added.status(),
        201,
        "with the opt-in, a loopback client may change the fleet"
    );
}

#[tokio::test]
async fn an_x_api_key_opens_the_inference_routes_and_never_reaches_the_engine() {
    let engine = FakeEngine::start().await;
    let mut args = base_args(&[&engine.url]);
    args.extend(["--api-key".into(), KEY.into()]);
    let router = Router::start(&args).await;
    let client = reqwest::Client::new();
    let with = |key: &str| {
        client
            .post(router.url("/v1/messages"))
            .header("x-api-key", key)
            .header("anthropic-version", "2023-06-01")
            .json(&serde_json::json!({"model": "m", "max_tokens": 4,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let answered = with(KEY).await.unwrap();
    assert_eq!(answered.status(), 200, "Anthropic's SDK sends x-api-key");
    let refused = with("sk-not-the-key").await.unwrap();
    assert_eq!(refused.status(), 401);
    let seen = engine.state.api_keys.lock().unwrap().clone();
    assert!(
        seen.iter().any(|(path, _)| path == "/v1/messages"),
        "the request reached the engine: {seen:?}"
    );
    assert!(
        seen.iter().all(|(_, key)| key.is_none()),
        "a Shoal key never reaches an engine: {seen:?}"
    );
}

/// Starts one engine serving `test-model` and a router with the inference
/// key, 1 s health checks and `extra` flags, and sends one keyed chat
/// request through it (answered 200).
async fn keyed_chat(extra: &[&str]) -> (FakeEngine, Router) {
    let engine = FakeEngine::start().await;
    *engine.state.models.lock().await = vec!["test-model".into()];
    let mut args = base_args(&[&engine.url]);
    args.extend(["--api-key".into(), KEY.into()]);
    args.extend(extra.iter().map(|a| a.to_string()));
    args.extend(["--health-check-interval-secs".into(), "1".into()]);
    let router = Router::start(&args).await;
    let response = send(
        &router,
        reqwest::Method::POST,
        "/v1/chat/completions",
        Some(KEY),
        Some(chat_body(false)),
    )
    .await;
    assert_eq!(response.status(), 200);
    (engine, router)
}

#[tokio::test]
async fn engines_never_see_a_shoal_key_and_get_the_worker_key_everywhere() {
    let (engine, _router) = keyed_chat(&[]).await;
    let seen = engine.state.authorizations.lock().unwrap().clone();
    assert!(
        seen.iter().all(|(_, auth)| auth.is_none()),
        "no Authorization reaches the engine: {seen:?}"
    );

    let (engine, _router) = keyed_chat(&["--worker-api-key", "sk-engine-key-01"]).await;
    assert!(
        eventually(Duration::from_secs(5), || async {
            let seen = engine.state.authorizations.lock().unwrap().clone();
            seen.iter().any(|(path, _)| path == "/v1/models")
        })
        .await,
        "a model list was read"
    );
    let seen = engine.state.authorizations.lock().unwrap().clone();
    for (path, auth) in &seen {
        if path == "/health" {
            continue;
        }
        assert_eq!(auth.as_deref(), Some("Bearer sk-engine-key-01"), "{path}");
    }
    assert!(seen.iter().any(|(p, _)| p == "/v1/chat/completions"));
}

/// A CA and a server certificate for 127.0.0.1 and `localhost` signed by
/// it: the server's rustls config and the CA's PEM.
fn tls_engine_identity() -> (Arc<rustls::ServerConfig>, String) {
    let ca_key = rcgen::KeyPair::generate().unwrap();
    let mut ca_params = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let ca = ca_params.self_signed(&ca_key).unwrap();
    let issuer = rcgen::Issuer::from_params(&ca_params, &ca_key);
    let leaf_key = rcgen::KeyPair::generate().unwrap();
    let mut leaf_params =
        rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
            .unwrap();
    leaf_params
        .subject_alt_names
        .push(rcgen::SanType::IpAddress(std::net::IpAddr::V4(
            std::net::Ipv4Addr::LOCALHOST,
        )));
    let leaf = leaf_params.signed_by(&leaf_key, &issuer).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let key = rustls_pki_types::PrivateKeyDer::try_from(leaf_key.serialize_der()).unwrap();
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.der().clone()], key)
        .unwrap();
    (Arc::new(config), ca.pem())
}

/// An HTTPS engine that answers every request with a small completion
/// and closes a connection idle for `idle` (TLS close, then TCP), as an
/// engine's keep-alive timeout does. Counts the chat requests it read.
async fn idle_closing_tls_engine(
    config: Arc<rustls::ServerConfig>,
    idle: Duration,
) -> (String, Arc<AtomicUsize>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("https://{}", listener.local_addr().unwrap());
    let chats = Arc::new(AtomicUsize::new(0));
    let counter = chats.clone();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, counter) = (acceptor.clone(), counter.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut pending: Vec<u8> = Vec::new();
                loop {
                    // One request: its head, then its content-length body.
                    let request = tokio::time::timeout(idle, async {
                        loop {
                            if let Some(end) = pending.windows(4).position(|w| w == b"\r\n\r\n") {
                                let head = String::from_utf8_lossy(&pending[..end]).to_lowercase();
                                let len: usize = head
                                    .lines()
                                    .find_map(|l| l.strip_prefix("content-length:"))
                                    .map_or(0, |v| v.trim().parse().unwrap());
                                if pending.len() >= end + 4 + len {
                                    pending.drain(..end + 4 + len);
                                    return Some(head);
                                }
                            }
                            let mut chunk = [0u8; 4096];
                            match tls.read(&mut chunk).await {
                                Ok(0) | Err(_) => return None,
                                Ok(n) => pending.extend_from_slice(&chunk[..n]),
                            }
                        }
                    })
                    .await;
                    let head = match request {
                        Ok(Some(head)) => head,
                        Ok(None) => return,
                        Err(_idle) => {
                            let _ = tls.shutdown().await;
                            return;
                        }
                    };
                    if head.starts_with("post /v1/chat/completions") {
                        counter.fetch_add(1, Ordering::SeqCst);
                    }
                    let body = r#"{"id":"c1","object":"chat.completion","choices":[]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    );
                    if tls.write_all(answer.as_bytes()).await.is_err() {
                        return;
                    }
                }
            });
        }
    });
    (url, chats)
}

/// A POST is not resent after the whole request was written (`retry_rule`),
/// so a pooled HTTPS connection the engine closed while it sat idle must be
/// found before reuse: the pool probes the TCP socket under the TLS session.
#[tokio::test]
async fn a_post_after_an_https_engines_keep_alive_timeout_goes_on_a_fresh_connection() {
    let (server, ca_pem) = tls_engine_identity();
    let (url, chats) = idle_closing_tls_engine(server, Duration::from_millis(300)).await;
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    let mut args = base_args(&[&url]);
    args.extend(["--worker-tls-ca".into(), ca_path.to_string_lossy().into()]);
    args.extend(["--io-threads".into(), "1".into()]);
    let router = Router::start(&args).await;
    let client = reqwest::Client::new();
    for round in 0..2 {
        let response = client
            .post(router.url("/v1/chat/completions"))
            .json(&chat_body(false))
            .send()
            .await
            .unwrap();
        assert_eq!(
            response.status(),
            200,
            "round {round}: {:?}",
            response.text().await
        );
        // Past the engine's idle timeout and the pool's probe age (1 s).
        tokio::time::sleep(Duration::from_millis(1500)).await;
    }
    assert_eq!(chats.load(Ordering::SeqCst), 2, "each POST once");
}

#[tokio::test]
async fn an_https_engine_is_routed_and_checked_through_the_given_ca_and_refused_without_it() {
    let (server, ca_pem) = tls_engine_identity();
    let engine = FakeEngine::start_tls(server).await;
    *engine.state.models.lock().await = vec!["test-model".into()];
    let dir = tempfile::tempdir().unwrap();
    let ca_path = dir.path().join("ca.pem");
    std::fs::write(&ca_path, ca_pem).unwrap();
    let mut args = base_args(&[&engine.url]);
    args.extend(["--worker-tls-ca".into(), ca_path.to_string_lossy().into()]);
    args.extend(["--health-check-interval-secs".into(), "1".into()]);
    let router = Router::start(&args).await;
    for stream in [false, true] {
        let response = router.chat(stream).await;
        assert_eq!(response.status(), 200, "over TLS (stream {stream})");
        assert!(!response.bytes().await.unwrap().is_empty());
    }
    assert!(
        eventually(Duration::from_secs(5), || async {
            router.worker(&engine.url).await["models"].is_array()
        })
        .await,
        "the side client (health checks, model list) reaches it too"
    );

    // Another replica trusting only the system roots: refused, with why.
    let router = Router::start(&base_args(&[&engine.url])).await;
    let response = router.chat(false).await;
    let status = response.status().as_u16();
    let body = response.text().await.unwrap();
    assert_eq!(status, 502, "{body}");
    assert!(body.contains("TLS handshake failed"), "{body}");
    assert!(
        body.contains("certificate"),
        "the reason names the certificate: {body}"
    );
}

#[tokio::test]
async fn a_worker_that_accepts_and_never_answers_loses_the_request_at_the_attempt_deadline() {
    let stalled = FakeEngine::start().await;
    stalled.state.stall.store(true, Ordering::SeqCst);
    let healthy = FakeEngine::start().await;
    let mut args = base_args(&[&stalled.url, &healthy.url]);
    args.extend(["--attempt-timeout-secs".into(), "1".into()]);
    let router = Router::start(&args).await;
    // A GET is idempotent, so it goes to another worker after the attempt
    // deadline (a POST would not: `retry_policy.rs`).
    for _ in 0..2 {
        let started = Instant::now();
        let response = reqwest::get(router.url("/v1/made/up")).await.unwrap();
        assert_eq!(response.status(), 200);
        assert!(
            started.elapsed() < Duration::from_secs(4),
            "{:?}",
            started.elapsed()
        );
    }
    assert_eq!(
        healthy.requests(),
        2,
        "both requests were answered by the healthy worker"
    );
    assert!(stalled.requests() >= 1, "round robin tried the stalled one");
    let metrics = router.metrics().await;
    assert!(metrics.contains("reason=\"attempt_timeout\""), "{metrics}");

    // With one worker and nothing else to try: 504, naming the deadline.
    let router = Router::start(&{
        let mut args = base_args(&[&stalled.url]);
        args.extend(["--attempt-timeout-secs".into(), "1".into()]);
        args.extend(["--retry-max-retries".into(), "0".into()]);
        args
    })
    .await;
    let response = reqwest::get(router.url("/v1/made/up")).await.unwrap();
    assert_eq!(response.status(), 504);
    assert!(
        response
            .text()
            .await
            .unwrap()
            .contains("--attempt-timeout-secs")
    );
}
