//! Log setup: text or JSON lines, filtered by `RUST_LOG` or `--log-level`.

use tracing_subscriber::EnvFilter;

/// Installs the global subscriber. An invalid filter is an error that
/// names `--log-level`.
pub fn init(level: &str, json: bool) -> Result<(), String> {
    let filter = match std::env::var("RUST_LOG") {
        Ok(from_env) if !from_env.is_empty() => EnvFilter::try_new(&from_env)
            .map_err(|e| format!("invalid RUST_LOG `{from_env}`: {e}"))?,
        _ => {
            EnvFilter::try_new(level).map_err(|e| format!("invalid --log-level `{level}`: {e}"))?
        }
    };
    let builder = tracing_subscriber::fmt().with_env_filter(filter);
    let result = if json {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
    result.map_err(|e| format!("cannot install logger: {e}"))
}
