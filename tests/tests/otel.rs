//! OpenTelemetry with a real `shoal` process: an OTLP/HTTP receiver here
//! decodes the exported protobuf with the official `opentelemetry-proto`
//! types, and the engine here records the `traceparent` it was sent. The
//! span must carry the request's route, model, policy, worker, attempts
//! and status, continue the client's trace, and be the engine's parent.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod fleet_support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::routing::{get, post};
use fleet_support::{run, wait_for};
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use serde_json::json;
use shoal_tests::client::HttpClient;
use shoal_tests::fleet::{Fleet, FleetConfig, locate_shoal};

#[derive(Default)]
struct Seen {
    spans: Mutex<Vec<Span>>,
    traceparents: Mutex<Vec<String>>,
}

async fn serve(app: Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    url
}

async fn receive(State(seen): State<Arc<Seen>>, body: Bytes) -> &'static [u8] {
    if let Ok(request) = ExportTraceServiceRequest::decode(body) {
        let spans = request
            .resource_spans
            .into_iter()
            .flat_map(|r| r.scope_spans)
            .flat_map(|s| s.spans);
        seen.spans.lock().unwrap().extend(spans);
    }
    // An empty ExportTraceServiceResponse.
    b""
}

async fn chat(State(seen): State<Arc<Seen>>, headers: HeaderMap) -> axum::Json<serde_json::Value> {
    if let Some(tp) = headers.get("traceparent").and_then(|v| v.to_str().ok()) {
        seen.traceparents.lock().unwrap().push(tp.to_string());
    }
    axum::Json(json!({"id": "c1", "object": "chat.completion",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}, "finish_reason": "stop"}]}))
}

fn attribute(span: &Span, key: &str) -> Option<String> {
    let value = span
        .attributes
        .iter()
        .find(|kv| kv.key == key)?
        .value
        .clone()?
        .value?;
    Some(match value {
        AnyValue::StringValue(s) => s,
        AnyValue::IntValue(i) => i.to_string(),
        AnyValue::DoubleValue(d) => d.to_string(),
        AnyValue::BoolValue(b) => b.to_string(),
        other => format!("{other:?}"),
    })
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_span_reaches_the_collector_and_parents_the_engine() {
    run(async {
        let seen = Arc::new(Seen::default());
        let collector = serve(
            Router::new()
                .route("/v1/traces", post(receive))
                .with_state(seen.clone()),
        )
        .await;
        let engine = serve(
            Router::new()
                .route("/v1/chat/completions", post(chat))
                .route("/health", get(|| async { "ok" }))
                .with_state(seen.clone()),
        )
        .await;
        let bin = locate_shoal(None).unwrap();
        // The batch exporter sends every 5 s by default; a tenth of a
        // second here keeps the test from waiting on it.
        let cfg = FleetConfig::new(bin, 1, vec![engine.clone()])
            .mesh(false)
            .env("OTEL_BSP_SCHEDULE_DELAY", "100")
            .args([
                "--otlp-endpoint",
                collector.as_str(),
                "--policy",
                "round_robin",
                "--worker-load-source",
                "none",
                // Nothing balances load onto this replica: exit at once.
                "--drain-settle-secs",
                "0",
            ]);
        let mut fleet = Fleet::start(cfg).await.unwrap();
        let client = HttpClient::new();
        let trace_id = "4bf92f3577b34da6a3ce929d0e0e4736";
        let client_span = "00f067aa0ba902b7";
        let body =
            json!({"model": "traced-model", "messages": [{"role": "user", "content": "hi"}]});
        let resp = client
            .send(
                http::Method::POST,
                &format!("{}/v1/chat/completions", fleet.url(0)),
                &[("traceparent", &format!("00-{trace_id}-{client_span}-01"))],
                Some(body.to_string().into()),
            )
            .await
            .unwrap();
        assert_eq!(resp.status().as_u16(), 200);
        let _ = http_body_util::BodyExt::collect(resp.into_body()).await;
        // The batch exporter sends within its schedule delay.
        let span = wait_for(
            "the span is exported",
            Duration::from_secs(15),
            async || {
                seen.spans
                    .lock()
                    .unwrap()
                    .iter()
                    .find(|s| s.name == "proxy")
                    .cloned()
            },
        )
        .await;
        assert_eq!(
            hex(&span.trace_id),
            trace_id,
            "the client's trace continues"
        );
        assert_eq!(hex(&span.parent_span_id), client_span);
        for (key, want) in [
            ("http.route", "chat_completions"),
            ("gen_ai.request.model", "traced-model"),
            ("shoal.policy", "round_robin"),
            ("shoal.worker", engine.as_str()),
            ("shoal.attempts", "1"),
            ("http.response.status_code", "200"),
        ] {
            assert_eq!(attribute(&span, key).as_deref(), Some(want), "{key}");
        }
        assert!(attribute(&span, "shoal.ttft_ms").is_some(), "TTFT recorded");
        let sent = seen.traceparents.lock().unwrap().clone();
        assert_eq!(
            sent,
            vec![format!("00-{trace_id}-{}-01", hex(&span.span_id))],
            "the engine's parent is the router's span"
        );
        fleet.shutdown(Duration::from_secs(5)).await;
    })
    .await;
}
