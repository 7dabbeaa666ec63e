//! A tenant's streams are settled from the engine's own usage, with real
//! `shoal` processes over an in-process mock engine. This file proves
//! that:
//!
//! - a stream whose client did not ask for its usage is asked for it
//!   (`stream_options.include_usage`): the tenant is charged the tokens
//!   the engine reported, not the estimate it was booked at, and the
//!   client's stream carries no usage chunk, exactly what it asked for;
//! - a client that asked for the usage chunk still gets it, and is
//!   settled the same way, tenant's or not.
//!
//! The `shoal` binary is found next to this test in the target directory
//! (`cargo build -p shoal` first, or set `SHOAL_BIN`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod tenants_support;

use std::time::Duration;

use serde_json::{Value, json};
use shoal_tests::client::HttpClient;
use shoal_tests::mock::{DEFAULT_MODEL, EngineConfig, Flavor};
use shoal_tests::wait::poll_until;
use tenants_support::{ACME_KEY, BOB_KEY, Rig, run};

/// The engine's output when a request sets no `max_tokens`: what a
/// settled stream is charged.
const ENGINE_DEFAULT_TOKENS: u64 = 40;
/// What the tenants file books a request without `max_tokens` at: far
/// from the engine's, so a charge tells which one it is.
const BOOKED_TOKENS: u64 = 1_000;

/// Every event's data of a streamed chat request without `max_tokens`
/// (with `stream_options` when given), sent with `key`.
async fn stream(client: &HttpClient, base: &str, key: &str, options: Option<Value>) -> Vec<String> {
    let mut body = json!({
        "model": DEFAULT_MODEL,
        "messages": [{"role": "user", "content": "tell me about shoals"}],
        "stream": true,
    });
    if let Some(options) = options {
        body["stream_options"] = options;
    }
    let auth = format!("Bearer {key}");
    let url = format!("{base}/v1/chat/completions");
    let mut s = client
        .post_stream(&url, &body, &[("authorization", auth.as_str())])
        .await
        .unwrap();
    assert_eq!(s.status, 200);
    let mut events = Vec::new();
    while let Some(data) = s.next_data().await.unwrap() {
        events.push(data);
    }
    assert_eq!(
        events.last().map(String::as_str),
        Some("[DONE]"),
        "{events:?}"
    );
    events
}

/// The usage-only chunks among `events`.
fn usage_chunks(events: &[String]) -> Vec<Value> {
    events
        .iter()
        .filter_map(|e| serde_json::from_str::<Value>(e).ok())
        .filter(|v| v["choices"].as_array().is_some_and(Vec::is_empty) && v["usage"].is_object())
        .collect()
}

/// acme's fleet-wide output tokens this window, once nothing is in flight.
async fn settled_output(rig: &Rig) -> Option<u64> {
    let v = rig.tenants(0).await?;
    let acme = v["tenants"]
        .as_array()?
        .iter()
        .find(|t| t["name"] == "acme")?;
    (acme["used"]["in_flight"] == 0).then(|| acme["used"]["output_tokens"].as_u64())?
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_are_settled_from_the_usage_shoal_asked_for_and_hid() {
    run(Duration::from_secs(60), async {
        let tenants = format!(
            "default_output_tokens = {BOOKED_TOKENS}\n\
             [tenants.acme]\nkeys = [\"{ACME_KEY}\"]\noutput_tokens_per_minute = 100000\n"
        );
        let engine = EngineConfig {
            flavor: Flavor::Vllm,
            default_max_tokens: ENGINE_DEFAULT_TOKENS,
            time_scale: 10.0,
            ..EngineConfig::default()
        };
        let extra = vec!["--api-key".to_string(), BOB_KEY.to_string()];
        let rig = Rig::start_with(1, false, &tenants, &engine, &extra).await;
        let base = rig.fleet.url(0);

        // The client did not ask: no usage chunk reaches it...
        let events = stream(&rig.client, &base, ACME_KEY, None).await;
        assert!(usage_chunks(&events).is_empty(), "{events:?}");
        assert!(events.len() > 2, "{events:?}");
        // ...but the tenant is charged what the engine reported.
        let mut last = None;
        let settled = poll_until(Duration::from_secs(5), async || {
            last = settled_output(&rig).await;
            last == Some(ENGINE_DEFAULT_TOKENS)
        })
        .await;
        assert!(
            settled,
            "charged {last:?}, not the engine's {ENGINE_DEFAULT_TOKENS}"
        );

        // A client that asked gets its chunk, and is settled too.
        let options = json!({"include_usage": true});
        let events = stream(&rig.client, &base, ACME_KEY, Some(options)).await;
        let chunks = usage_chunks(&events);
        assert_eq!(chunks.len(), 1, "{events:?}");
        assert_eq!(
            chunks[0]["usage"]["completion_tokens"],
            ENGINE_DEFAULT_TOKENS
        );
        let settled = poll_until(Duration::from_secs(5), async || {
            last = settled_output(&rig).await;
            last == Some(2 * ENGINE_DEFAULT_TOKENS)
        })
        .await;
        assert!(settled, "charged {last:?} after two streams");

        // An unlimited key's stream that asked keeps its chunk (its
        // options, untouched, reach the engine).
        let options = json!({"include_usage": true, "continuous_usage_stats": false});
        let events = stream(&rig.client, &base, BOB_KEY, Some(options)).await;
        assert_eq!(usage_chunks(&events).len(), 1, "{events:?}");
    })
    .await;
}
