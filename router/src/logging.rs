//! Log setup: text or JSON lines, filtered by `RUST_LOG` or `--log-level`,
//! with the filter replaceable at run time (a configuration reload changes
//! `--log-level`; `RUST_LOG`, when set, stays in charge). With an OTLP
//! endpoint, the OpenTelemetry layer is installed beside the log layer and
//! the filter always passes the request spans, whatever the log level.

use std::sync::OnceLock;

use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Registry, reload};

use crate::otel::{self, Otel};

/// The handle that swaps the filter; set once the logger is installed and
/// `RUST_LOG` does not decide the filter.
static FILTER: OnceLock<reload::Handle<EnvFilter, Registry>> = OnceLock::new();

/// Where spans go: the OTLP base URL and the service name.
#[derive(Debug, Clone, Copy)]
pub struct Tracing<'a> {
    /// `--otlp-endpoint`.
    pub endpoint: &'a str,
    /// `--otel-service-name`.
    pub service: &'a str,
}

/// Installs the global subscriber (and the OpenTelemetry exporter when
/// `tracing` says where). An invalid filter is an error that names
/// `--log-level`.
pub fn init(level: &str, json: bool, tracing: Option<Tracing<'_>>) -> Result<Option<Otel>, String> {
    let from_env = std::env::var("RUST_LOG").ok().filter(|v| !v.is_empty());
    let spans = tracing.is_some();
    let filter = match &from_env {
        Some(from_env) => with_spans(
            EnvFilter::try_new(from_env)
                .map_err(|e| format!("invalid RUST_LOG `{from_env}`: {e}"))?,
            spans,
        ),
        None => with_spans(parse_level(level)?, spans),
    };
    let (filter, handle) = reload::Layer::new(filter);
    let (guard, otel_layer) = match tracing {
        Some(t) => {
            let (guard, layer) = otel::init(t.endpoint, t.service)?;
            (Some(guard), Some(layer))
        }
        None => (None, None),
    };
    let registry = tracing_subscriber::registry().with(filter).with(otel_layer);
    let result = if json {
        registry
            .with(tracing_subscriber::fmt::layer().json())
            .try_init()
    } else {
        registry.with(tracing_subscriber::fmt::layer()).try_init()
    };
    result.map_err(|e| format!("cannot install logger: {e}"))?;
    if from_env.is_none() {
        let _ = FILTER.set(handle);
    }
    Ok(guard)
}

/// `filter`, passing the request spans too when tracing is on.
fn with_spans(filter: EnvFilter, spans: bool) -> EnvFilter {
    match spans {
        true => filter.add_directive(
            format!("{}=info", otel::SPAN_TARGET)
                .parse()
                .unwrap_or_default(),
        ),
        false => filter,
    }
}

/// Checks a `--log-level` value.
pub fn parse_level(level: &str) -> Result<EnvFilter, String> {
    EnvFilter::try_new(level).map_err(|e| format!("invalid --log-level `{level}`: {e}"))
}

/// Applies a new `--log-level`; false when `RUST_LOG` decides the filter or
/// no logger of ours is installed (the value was checked by the caller).
pub fn set_level(level: &str) -> bool {
    let (Some(handle), Ok(filter)) = (FILTER.get(), parse_level(level)) else {
        return false;
    };
    handle.reload(with_spans(filter, otel::enabled())).is_ok()
}
