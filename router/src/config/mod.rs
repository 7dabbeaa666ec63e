//! Start-up configuration: flags, `SHOAL_*` environment variables and an
//! optional TOML file, resolved in that order of precedence.
//!
//! Every default is a constant in [`defaults`]; the file's keys are the long
//! flag names (`load-poll-interval-ms` or `load_poll_interval_ms`), so there
//! is one vocabulary for all three sources.
//!
//! The flags come in groups (`#[command(flatten)]`), and each group is the
//! typed configuration its consumer is built from: the policy catalog takes
//! [`RoutingConfig`], the proxy [`ProxyConfig`] and [`RetryConfig`], every
//! worker's breaker
//! [`BreakerConfig`], the health checker [`HealthConfig`], the load monitor
//! and fleet view [`LoadPollConfig`], the admission gate
//! [`AdmissionConfig`], the mesh [`MeshArgs`], the worker sources and
//! discovery [`DiscoveryConfig`], the auth gate and engine client
//! [`SecurityConfig`]. A group's fields are named
//! after their flags (`retry_max_retries` is `--retry-max-retries`), so one
//! grep finds both; durations are stored as the flag's number and read
//! through a method (`RetryConfig::initial_backoff`). Consumers import their
//! group from here; this module imports none of them.

mod admission;
pub mod defaults;
mod disagg;
mod discovery;
mod file;
mod front;
mod kv_events;
mod load;
mod mesh;
mod parsers;
mod proxy;
mod retry;
mod routing;
mod security;
mod worker_health;

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser};

pub use admission::{ADMISSION_FLAGS, AdmissionConfig, FairShareScope};
pub use disagg::{DISAGG_FLAGS, DisaggConfig, PdProtocol};
pub use discovery::{DISCOVERY_FLAGS, DiscoveryConfig, DiscoveryKind, DiscoveryScheme};
pub use file::FileError;
pub use front::{FRONT_FLAGS, FrontConfig};
pub use kv_events::{KvEventsConfig, PRECISE_PREFIX_FLAGS};
pub use load::{LOAD_FLAGS, LoadPollConfig, LoadSource};
pub use mesh::{MESH_FLAGS, MeshArgs};
pub use proxy::{PROXY_FLAGS, ProxyConfig};
pub use retry::{RETRY_FLAGS, RetryConfig};
pub use routing::{
    CACHE_AWARE_FLAGS, CacheAwareConfig, LEAST_LOAD_FLAGS, LOAD_AWARE_FLAGS, LeastLoadConfig,
    LoadAwareConfig, PREFIX_AFFINITY_FLAGS, PolicyKind, PrefixAffinityConfig, ROUTING_FLAGS,
    RoutingConfig,
};
pub use security::{SECURITY_FLAGS, SecurityConfig};
pub use worker_health::{BREAKER_FLAGS, BreakerConfig, HEALTH_FLAGS, HealthConfig};

/// Every knob of one `shoal` replica. Parsed by clap; see the flag reference
/// in `docs/configuration.md`, which is checked against this struct's `--help`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "shoal",
    version,
    about = "Active-active router for LLM inference fleets",
    override_usage = "shoal [OPTIONS]\n       shoal mesh gen-certs --out DIR --nodes NAME[,NAME...]\n       shoal mesh status --url URL [--json]\n       shoal help",
    after_help = "Subcommands:\n  shoal mesh gen-certs   make a cluster CA and node certificates for the mesh\n  shoal mesh status      print a replica's /mesh/status as a table\n  (`shoal mesh --help` for theirs)",
    args_override_self = true,
    allow_negative_numbers = true
)]
pub struct Config {
    /// TOML file whose keys are these flags' long names; flags and SHOAL_*
    /// variables override it.
    #[arg(long, env = "SHOAL_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,

    /// Address the HTTP front binds to.
    #[arg(long, env = "SHOAL_HOST", default_value = defaults::HOST)]
    pub host: String,

    /// Port the HTTP front listens on (0 picks a free port and logs it).
    #[arg(long, env = "SHOAL_PORT", default_value_t = defaults::PORT)]
    pub port: u16,

    /// Threads that serve client connections, each with its own pooled
    /// connections to workers, so a request stays on one thread
    /// (0 = one per available core).
    #[arg(long, env = "SHOAL_IO_THREADS", default_value_t = defaults::IO_THREADS, value_parser = parsers::io_threads)]
    pub io_threads: usize,

    /// Engine base URLs (http://host:port[/prefix]); space or comma separated.
    #[arg(long, env = "SHOAL_WORKER_URLS", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',', value_parser = parsers::worker_url)]
    pub worker_urls: Vec<String>,

    /// Seconds between SIGTERM (readiness turns to draining) and closing
    /// the listener; in-flight requests then finish.
    #[arg(long, env = "SHOAL_DRAIN_SETTLE_SECS", default_value_t = defaults::DRAIN_SETTLE_SECS)]
    pub drain_settle_secs: u64,

    /// Log filter when RUST_LOG is unset (e.g. info, debug, shoal=trace).
    #[arg(long, env = "SHOAL_LOG_LEVEL", default_value = defaults::LOG_LEVEL)]
    pub log_level: String,

    /// Log one JSON object per line instead of text.
    #[arg(long, env = "SHOAL_LOG_JSON")]
    pub log_json: bool,

    /// OTLP/HTTP endpoint (base URL) to export one OpenTelemetry span per
    /// request to (spans go to ENDPOINT/v1/traces); engines get the span's
    /// `traceparent`. Unset: no tracing.
    #[arg(long, env = "OTEL_EXPORTER_OTLP_ENDPOINT", value_name = "URL")]
    pub otlp_endpoint: Option<String>,

    /// `service.name` of the exported spans.
    #[arg(long, env = "OTEL_SERVICE_NAME", default_value = defaults::OTEL_SERVICE_NAME)]
    pub otel_service_name: String,

    // Groups come after the ungrouped flags: each sets the help heading of
    // the flags that follow it.
    /// `--policy` and the policies' knobs.
    #[command(flatten)]
    pub routing: RoutingConfig,

    /// Load-monitor settings.
    #[command(flatten)]
    pub load: LoadPollConfig,

    /// Admission (per-replica concurrency limit and queue).
    #[command(flatten)]
    pub admission: AdmissionConfig,

    /// Request size, deadlines and fleet-saturation shedding.
    #[command(flatten)]
    pub proxy: ProxyConfig,

    /// Client-connection limits (slow and hostile clients).
    #[command(flatten)]
    pub front: FrontConfig,

    /// Retry settings.
    #[command(flatten)]
    pub retry: RetryConfig,

    /// Disaggregated prefill/decode pools.
    #[command(flatten)]
    pub disagg: DisaggConfig,

    /// Circuit-breaker settings.
    #[command(flatten)]
    pub breaker: BreakerConfig,

    /// Health-check settings.
    #[command(flatten)]
    pub health: HealthConfig,

    /// Mesh (fleet-wide load sharing) settings.
    #[command(flatten)]
    pub mesh: MeshArgs,

    /// The arguments this configuration was parsed from, so a reload
    /// (SIGHUP) parses the same flags again with the file's new content.
    #[arg(skip)]
    pub argv: ReloadArgs,

    /// Worker-list settings: admin removals and discovery.
    #[command(flatten)]
    pub discovery: DiscoveryConfig,

    /// API keys and how engines are reached securely.
    #[command(flatten)]
    pub security: SecurityConfig,
}

/// The command line a configuration came from (it may hold keys: its
/// `Debug` shows only how many arguments there are).
#[derive(Clone, Default, PartialEq, Eq)]
pub struct ReloadArgs(pub Vec<std::ffi::OsString>);

impl std::fmt::Debug for ReloadArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "ReloadArgs({} arguments)", self.0.len())
    }
}

/// Why a configuration could not be built; each message names its source.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// A flag, variable or file value clap rejected (its message names the flag).
    #[error("{0}")]
    Cli(#[from] clap::Error),
    /// The config file could not be read or has an unknown or bad key.
    #[error(transparent)]
    File(#[from] FileError),
    /// Values that are each fine but do not fit together.
    #[error("{0}")]
    Invalid(String),
}

impl Config {
    /// Parses the process arguments, the environment and `--config FILE`.
    pub fn load() -> Result<Self, ConfigError> {
        Self::load_from(std::env::args_os())
    }

    /// Parses the given argument list (first item is the program name) the
    /// same way [`Config::load`] does; tests use this directly.
    pub fn load_from<I, T>(args: I) -> Result<Self, ConfigError>
    where
        I: IntoIterator<Item = T>,
        T: Into<std::ffi::OsString> + Clone,
    {
        let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
        let args_for_reload = args.clone();
        let first = Self::command().try_get_matches_from(&args)?;
        let config_path = first.get_one::<PathBuf>("config").cloned();
        let argv = match config_path {
            Some(path) => {
                let from_file = file::args_from_file(&path, &Self::command())?;
                let mut merged = Vec::with_capacity(args.len() + from_file.len());
                let mut rest = args.into_iter();
                merged.extend(rest.next());
                merged.extend(from_file);
                merged.extend(rest);
                merged
            }
            None => args,
        };
        let matches = Self::command().try_get_matches_from(argv)?;
        let mut config = Self::from_arg_matches(&matches)?;
        config.validate()?;
        config.argv = ReloadArgs(args_for_reload);
        Ok(config)
    }

    /// Checks values that are each fine but must fit together; every
    /// message names the flags involved.
    fn validate(&self) -> Result<(), ConfigError> {
        self.retry.validate().map_err(ConfigError::Invalid)?;
        let discovers_roles = self.discovery.discovery_role_label.is_some();
        self.disagg
            .validate(discovers_roles)
            .map_err(ConfigError::Invalid)?;
        self.load.validate().map_err(ConfigError::Invalid)?;
        self.mesh.validate().map_err(ConfigError::Invalid)?;
        self.discovery.validate().map_err(ConfigError::Invalid)?;
        self.security.validate().map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// Every seeded worker: `--worker-urls`, then the decode and prefill
    /// pools' (a disaggregated fleet's workers are ordinary workers with a
    /// role).
    pub fn seed_urls(&self) -> Vec<String> {
        seeds_with_pools(&self.worker_urls, &self.disagg)
    }

    /// Grace period between SIGTERM and closing the listener.
    pub fn drain_settle(&self) -> Duration {
        Duration::from_secs(self.drain_settle_secs)
    }
}

/// `worker_urls` followed by the workers of `disagg`'s pools not among
/// them: the seeds of a replica (a reload keeps the running pools').
pub fn seeds_with_pools(worker_urls: &[String], disagg: &DisaggConfig) -> Vec<String> {
    let mut urls = worker_urls.to_vec();
    for url in disagg.decode_urls.iter().chain(&disagg.prefill_urls) {
        if !urls.contains(url) {
            urls.push(url.clone());
        }
    }
    urls
}

#[cfg(test)]
mod tests;
