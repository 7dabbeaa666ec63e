//! OpenTelemetry tracing: one span per proxied request, exported as OTLP
//! over HTTP (protobuf) to a collector, and the W3C `traceparent` of that
//! span sent to the engine, so an engine that traces (vLLM, SGLang with
//! OTel on) continues the same trace.
//!
//! Off unless `--otlp-endpoint` (or `OTEL_EXPORTER_OTLP_ENDPOINT`) is set;
//! spans then go to `ENDPOINT/v1/traces` as the OTel conventions say for
//! the generic endpoint, batched (`OTEL_BSP_*` variables apply). Off, a
//! request costs one relaxed atomic load here and no span is made.
//!
//! The span (`proxy`, kind server): `http.route`, `gen_ai.request.model`,
//! `shoal.policy`, `shoal.worker` (the one that answered), `shoal.attempts`,
//! `http.response.status_code`, `shoal.ttft_ms`. A client's own
//! `traceparent` makes it the span's parent; the engine gets the span's.

use std::sync::atomic::{AtomicBool, Ordering};

use http::{HeaderMap, HeaderValue};
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator};
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::SdkTracerProvider;
use tracing::Span;
use tracing_opentelemetry::OpenTelemetrySpanExt;
use tracing_subscriber::Layer as _;

/// Whether spans are made (set once the exporter is installed).
static ENABLED: AtomicBool = AtomicBool::new(false);

/// The exporter, kept to flush it on exit.
pub struct Otel {
    provider: SdkTracerProvider,
}

impl std::fmt::Debug for Otel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Otel").finish_non_exhaustive()
    }
}

impl Otel {
    /// Sends the spans still buffered and stops the exporter.
    pub fn shutdown(self) {
        if let Err(err) = self.provider.shutdown() {
            tracing::warn!(error = %err, "OpenTelemetry exporter did not flush");
        }
    }
}

/// The exporter for `endpoint` (a base URL; spans go to its `/v1/traces`)
/// naming this service `service`, and the `tracing` layer that feeds it.
pub fn init<S>(
    endpoint: &str,
    service: &str,
) -> Result<(Otel, impl tracing_subscriber::Layer<S>), String>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use opentelemetry_otlp::WithExportConfig;
    let url = format!("{}/v1/traces", endpoint.trim_end_matches('/'));
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(url.clone())
        .build()
        .map_err(|e| format!("--otlp-endpoint {endpoint}: {e}"))?;
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(service.to_string())
        .build();
    let provider = SdkTracerProvider::builder()
        .with_batch_exporter(exporter)
        .with_resource(resource)
        .build();
    let tracer = provider.tracer("shoal");
    let layer = tracing_opentelemetry::layer()
        .with_tracer(tracer)
        .with_filter(tracing_subscriber::filter::filter_fn(|meta| {
            meta.target() == SPAN_TARGET
        }));
    ENABLED.store(true, Ordering::Relaxed);
    tracing::info!(%url, service, "OpenTelemetry tracing on");
    Ok((Otel { provider }, layer))
}

/// The target of the request spans (the only spans exported); the log
/// filter always lets it through while tracing is on.
pub const SPAN_TARGET: &str = "shoal::request";

/// Whether request spans are being made.
pub fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// A request's span when tracing is on, with the client's `traceparent`
/// (in `headers`) as its parent; `None` when off.
pub fn request_span(
    route: &'static str,
    policy: &'static str,
    headers: &HeaderMap,
) -> Option<Span> {
    if !ENABLED.load(Ordering::Relaxed) {
        return None;
    }
    let span = tracing::info_span!(
        target: "shoal::request",
        "proxy",
        otel.kind = "server",
        http.route = route,
        shoal.policy = policy,
        gen_ai.request.model = tracing::field::Empty,
        shoal.worker = tracing::field::Empty,
        shoal.attempts = tracing::field::Empty,
        http.response.status_code = tracing::field::Empty,
        shoal.ttft_ms = tracing::field::Empty,
    );
    let parent = TraceContextPropagator::new().extract(&HeaderExtractor(headers));
    let _ = span.set_parent(parent);
    Some(span)
}

/// The `traceparent` header value that makes `span` the engine's parent.
pub fn traceparent(span: &Span) -> Option<HeaderValue> {
    let mut out = HeaderInjector(None);
    TraceContextPropagator::new().inject_context(&span.context(), &mut out);
    out.0
}

struct HeaderExtractor<'a>(&'a HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(|k| k.as_str()).collect()
    }
}

/// Keeps the `traceparent` a propagator writes (the only header sent on).
struct HeaderInjector(Option<HeaderValue>);

impl Injector for HeaderInjector {
    fn set(&mut self, key: &str, value: String) {
        if key.eq_ignore_ascii_case("traceparent") {
            self.0 = HeaderValue::from_str(&value).ok();
        }
    }
}
