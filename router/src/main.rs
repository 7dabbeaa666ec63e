//! The `shoal` binary.

use std::process::ExitCode;

use shoal::app::{Server, shutdown_signal};
use shoal::config::{Config, ConfigError};

/// mimalloc instead of the system allocator: a proxied request makes a few
/// dozen short-lived allocations (headers, bodies, futures) across I/O
/// threads, and glibc's malloc/free took ~9 % of the router's CPU in
/// profiles against a fast backend (tests/BENCHMARKS.md, "Hot path").
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().collect();
    if shoal::cli::is_subcommand(&args) {
        return shoal::cli::run(args).await;
    }
    // `shoal help` is `shoal --help` (there is no other help subcommand).
    let args = match args.get(1).and_then(|a| a.to_str()) {
        Some("help") => vec![args[0].clone(), "--help".into()],
        _ => args,
    };
    let config = match Config::load_from(args) {
        Ok(config) => config,
        Err(ConfigError::Cli(err)) => {
            // clap formats help/version and usage errors itself.
            let _ = err.print();
            return if err.use_stderr() {
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            };
        }
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    let tracing = config
        .otlp_endpoint
        .as_deref()
        .map(|endpoint| shoal::logging::Tracing {
            endpoint,
            service: &config.otel_service_name,
        });
    let otel = match shoal::logging::init(&config.log_level, config.log_json, tracing) {
        Ok(otel) => otel,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(2);
        }
    };
    // A proxy holds two descriptors per request (client and engine): take
    // the whole hard limit, as nginx and Envoy deployments do.
    match rlimit::Resource::NOFILE.get() {
        Ok((soft, hard)) => match rlimit::increase_nofile_limit(hard) {
            Ok(now) => tracing::info!(soft_before = soft, hard, soft_now = now, "open-file limit"),
            Err(err) => {
                tracing::warn!(soft, hard, error = %err, "cannot raise the open-file limit")
            }
        },
        Err(err) => tracing::warn!(error = %err, "cannot read the open-file limit"),
    }
    if config.seed_urls().is_empty() {
        tracing::warn!("no --worker-urls given: add workers with POST /workers");
    }
    let server = match Server::bind(config).await {
        Ok(server) => server,
        Err(err) => {
            eprintln!("error: {err}");
            return ExitCode::from(1);
        }
    };
    let served = server.serve(shutdown_signal()).await;
    if let Some(otel) = otel {
        // The exporter's client blocks: flush off the async threads.
        let _ = tokio::task::spawn_blocking(move || otel.shutdown()).await;
    }
    match served {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("error: server failed: {err}");
            ExitCode::from(1)
        }
    }
}
