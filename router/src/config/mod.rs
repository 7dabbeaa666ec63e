//! Start-up configuration: flags, `SHOAL_*` environment variables and an
//! optional TOML file, resolved in that order of precedence.
//!
//! Every default is a constant in [`defaults`]; the file's keys are the long
//! flag names (`load-poll-interval-ms` or `load_poll_interval_ms`), so there
//! is one vocabulary for all three sources.

pub mod defaults;
mod file;
mod mesh;
mod parsers;

use std::path::PathBuf;
use std::time::Duration;

use clap::{CommandFactory, FromArgMatches, Parser, ValueEnum};

pub use file::FileError;
pub use mesh::MeshArgs;

/// Which routing policy a replica runs. The router builds the policy from
/// this once at start-up and never matches on it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum PolicyKind {
    /// Cycle through healthy workers in order.
    RoundRobin,
    /// Pick a healthy worker uniformly at random.
    Random,
    /// Sample two workers; take the less loaded (KV usage, queue, in-flight).
    PowerOfTwo,
    /// Least expected wait: queued token-work / throughput + KV barrier.
    LeastLoad,
    /// Prefix-cache affinity with a load-imbalance guard.
    CacheAware,
    /// llm-d queue scorer: shortest engine waiting queue.
    LoadAware,
}

/// Which load format the monitor polls engines with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "lowercase")]
pub enum LoadSource {
    /// Probe each worker: SGLang `/v1/loads`, else `/metrics` prefixes.
    Auto,
    /// SGLang: `/v1/loads`, then `/get_load`, then `/metrics`.
    Sglang,
    /// vLLM `/metrics`.
    Vllm,
    /// llama.cpp server `/metrics` and `/slots`.
    Llamacpp,
    /// Do not poll: route on the router's own accounting only.
    None,
}

/// Every knob of one `shoal` replica. Parsed by clap; see the README's flag
/// reference, which is checked against this struct's `--help`.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "shoal",
    version,
    about = "Active-active router for LLM inference fleets",
    args_override_self = true
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

    /// Engine base URLs (http://host:port[/prefix]); space or comma separated.
    #[arg(long, env = "SHOAL_WORKER_URLS", action = clap::ArgAction::Set, num_args = 1.., value_delimiter = ',', value_parser = parsers::worker_url)]
    pub worker_urls: Vec<String>,

    /// Routing policy.
    #[arg(long, env = "SHOAL_POLICY", value_enum, default_value = defaults::POLICY)]
    pub policy: PolicyKind,

    /// cache_aware: route by prefix affinity when the best match covers more
    /// than this fraction of the prompt (0..=1).
    #[arg(long, env = "SHOAL_CACHE_THRESHOLD", default_value_t = defaults::CACHE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub cache_threshold: f64,

    /// cache_aware: the pool is imbalanced when max - min fleet in-flight
    /// requests exceeds this (and the relative test holds).
    #[arg(long, env = "SHOAL_BALANCE_ABS_THRESHOLD", default_value_t = defaults::BALANCE_ABS_THRESHOLD)]
    pub balance_abs_threshold: u64,

    /// cache_aware: ... and max fleet in-flight requests > this × min (>= 1).
    #[arg(long, env = "SHOAL_BALANCE_REL_THRESHOLD", default_value_t = defaults::BALANCE_REL_THRESHOLD, value_parser = parsers::multiplier)]
    pub balance_rel_threshold: f64,

    /// cache_aware: the pool is imbalanced when max - min KV usage exceeds
    /// this (0..=1; 1 = off). Needs fresh KV usage from every worker.
    #[arg(long, env = "SHOAL_BALANCE_TOKEN_USAGE_THRESHOLD", default_value_t = defaults::BALANCE_TOKEN_USAGE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub balance_token_usage_threshold: f64,

    /// cache_aware: the pool is imbalanced when any worker's KV usage exceeds
    /// this (0..=1; 1 = off). Needs fresh KV usage from every worker.
    #[arg(long, env = "SHOAL_OVERLOAD_TOKEN_USAGE_THRESHOLD", default_value_t = defaults::OVERLOAD_TOKEN_USAGE_THRESHOLD, value_parser = parsers::unit_fraction)]
    pub overload_token_usage_threshold: f64,

    /// cache_aware: bytes of prompt text the prefix tree keeps per worker;
    /// least recently used branches beyond it are evicted.
    #[arg(long, env = "SHOAL_MAX_TREE_SIZE", default_value_t = defaults::MAX_TREE_SIZE, value_parser = parsers::positive_usize)]
    pub max_tree_size: usize,

    /// cache_aware: seconds between prefix-tree evictions (run in the background).
    #[arg(long, env = "SHOAL_EVICTION_INTERVAL_SECS", default_value_t = defaults::EVICTION_INTERVAL_SECS, value_parser = parsers::positive_u64)]
    pub eviction_interval_secs: u64,

    /// least_load: weight w in seconds of the KV barrier w * k/(1-k) (>= 0).
    #[arg(long, env = "SHOAL_LEAST_LOAD_KV_PRESSURE_WEIGHT", default_value_t = defaults::LEAST_LOAD_KV_PRESSURE_WEIGHT, value_parser = parsers::non_negative)]
    pub least_load_kv_pressure_weight: f64,

    /// least_load: tokens/s assumed for an engine that reports no valid throughput (> 0).
    #[arg(long, env = "SHOAL_LEAST_LOAD_DEFAULT_THROUGHPUT", default_value_t = defaults::LEAST_LOAD_DEFAULT_THROUGHPUT, value_parser = parsers::positive)]
    pub least_load_default_throughput: f64,

    /// least_load: token-work booked for a request whose prompt could not be estimated.
    #[arg(long, env = "SHOAL_LEAST_LOAD_MEAN_PREFILL_TOKENS", default_value_t = defaults::LEAST_LOAD_MEAN_PREFILL_TOKENS, value_parser = parsers::positive_u64)]
    pub least_load_mean_prefill_tokens: u64,

    /// load_aware: engine waiting-queue length at which a worker scores 0.
    #[arg(long, env = "SHOAL_LOAD_AWARE_THRESHOLD", default_value_t = defaults::LOAD_AWARE_THRESHOLD, value_parser = parsers::positive_u64)]
    pub load_aware_threshold: u64,

    /// How often each engine's load endpoint is polled, in milliseconds.
    #[arg(long, env = "SHOAL_LOAD_POLL_INTERVAL_MS", default_value_t = defaults::LOAD_POLL_INTERVAL_MS, value_parser = parsers::positive_u64)]
    pub load_poll_interval_ms: u64,

    /// A polled snapshot older than this counts as missing [default: 3 × poll interval].
    #[arg(long, env = "SHOAL_LOAD_STALE_AFTER_MS", value_parser = parsers::positive_u64)]
    pub load_stale_after_ms: Option<u64>,

    /// Load format to poll engines with.
    #[arg(long, env = "SHOAL_WORKER_LOAD_SOURCE", value_enum, default_value = defaults::WORKER_LOAD_SOURCE)]
    pub worker_load_source: LoadSource,

    /// Largest accepted request body in bytes; larger ones get 413.
    #[arg(long, env = "SHOAL_MAX_PAYLOAD_BYTES", default_value_t = defaults::MAX_PAYLOAD_BYTES, value_parser = parsers::positive_usize)]
    pub max_payload_bytes: usize,

    /// Deadline for a whole proxied request, streaming included.
    #[arg(long, env = "SHOAL_REQUEST_TIMEOUT_SECS", default_value_t = defaults::REQUEST_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub request_timeout_secs: u64,

    /// Deadline for opening a connection to a worker, in milliseconds.
    #[arg(long, env = "SHOAL_CONNECT_TIMEOUT_MS", default_value_t = defaults::CONNECT_TIMEOUT_MS, value_parser = parsers::positive_u64)]
    pub connect_timeout_ms: u64,

    /// Inference requests this replica proxies at once (streams count until
    /// they end); more wait in a queue. 0 = no limit.
    #[arg(long, env = "SHOAL_MAX_CONCURRENT_REQUESTS", default_value_t = defaults::MAX_CONCURRENT_REQUESTS)]
    pub max_concurrent_requests: usize,

    /// Requests that may wait for a slot once --max-concurrent-requests is
    /// reached; when the queue is full the answer is 429 with Retry-After.
    #[arg(long, env = "SHOAL_QUEUE_SIZE", default_value_t = defaults::QUEUE_SIZE)]
    pub queue_size: usize,

    /// Seconds a queued request waits for a slot before 503 with Retry-After.
    #[arg(long, env = "SHOAL_QUEUE_TIMEOUT_SECS", default_value_t = defaults::QUEUE_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub queue_timeout_secs: u64,

    /// Shed a request with 503 and Retry-After when every available worker
    /// already has this many requests in flight across the fleet (the mesh's
    /// view when meshed). 0 = off.
    #[arg(long, env = "SHOAL_WORKER_MAX_INFLIGHT", default_value_t = defaults::WORKER_MAX_INFLIGHT)]
    pub worker_max_inflight: u64,

    /// Retries after the first attempt, each on a re-selected worker.
    #[arg(long, env = "SHOAL_RETRY_MAX_RETRIES", default_value_t = defaults::RETRY_MAX_RETRIES)]
    pub retry_max_retries: u32,

    /// Backoff before the first retry, in milliseconds.
    #[arg(long, env = "SHOAL_RETRY_INITIAL_BACKOFF_MS", default_value_t = defaults::RETRY_INITIAL_BACKOFF_MS)]
    pub retry_initial_backoff_ms: u64,

    /// Ceiling on the backoff between retries, in milliseconds.
    #[arg(long, env = "SHOAL_RETRY_MAX_BACKOFF_MS", default_value_t = defaults::RETRY_MAX_BACKOFF_MS)]
    pub retry_max_backoff_ms: u64,

    /// Backoff growth per retry (>= 1).
    #[arg(long, env = "SHOAL_RETRY_BACKOFF_MULTIPLIER", default_value_t = defaults::RETRY_BACKOFF_MULTIPLIER, value_parser = parsers::multiplier)]
    pub retry_backoff_multiplier: f64,

    /// Random spread of each backoff, 0..=1.
    #[arg(long, env = "SHOAL_RETRY_JITTER_FACTOR", default_value_t = defaults::RETRY_JITTER_FACTOR, value_parser = parsers::unit_fraction)]
    pub retry_jitter_factor: f64,

    /// Never retry; every worker error goes straight to the client.
    #[arg(long, env = "SHOAL_DISABLE_RETRIES")]
    pub disable_retries: bool,

    /// Consecutive failures (within the window) that open a worker's circuit.
    #[arg(long, env = "SHOAL_CB_FAILURE_THRESHOLD", default_value_t = defaults::CB_FAILURE_THRESHOLD, value_parser = parsers::positive_u32)]
    pub cb_failure_threshold: u32,

    /// Consecutive half-open successes that close the circuit.
    #[arg(long, env = "SHOAL_CB_SUCCESS_THRESHOLD", default_value_t = defaults::CB_SUCCESS_THRESHOLD, value_parser = parsers::positive_u32)]
    pub cb_success_threshold: u32,

    /// Seconds an open circuit waits before letting a probe through.
    #[arg(long, env = "SHOAL_CB_TIMEOUT_DURATION_SECS", default_value_t = defaults::CB_TIMEOUT_DURATION_SECS, value_parser = parsers::positive_u64)]
    pub cb_timeout_duration_secs: u64,

    /// Seconds after which old failures stop counting towards opening.
    #[arg(long, env = "SHOAL_CB_WINDOW_DURATION_SECS", default_value_t = defaults::CB_WINDOW_DURATION_SECS, value_parser = parsers::positive_u64)]
    pub cb_window_duration_secs: u64,

    /// Never open circuits.
    #[arg(long, env = "SHOAL_DISABLE_CIRCUIT_BREAKER")]
    pub disable_circuit_breaker: bool,

    /// Seconds between active health checks of each worker.
    #[arg(long, env = "SHOAL_HEALTH_CHECK_INTERVAL_SECS", default_value_t = defaults::HEALTH_CHECK_INTERVAL_SECS, value_parser = parsers::positive_u64)]
    pub health_check_interval_secs: u64,

    /// Deadline for one health check, in seconds.
    #[arg(long, env = "SHOAL_HEALTH_CHECK_TIMEOUT_SECS", default_value_t = defaults::HEALTH_CHECK_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub health_check_timeout_secs: u64,

    /// Consecutive failed checks that take a worker out of rotation.
    #[arg(long, env = "SHOAL_HEALTH_FAILURE_THRESHOLD", default_value_t = defaults::HEALTH_FAILURE_THRESHOLD, value_parser = parsers::positive_u32)]
    pub health_failure_threshold: u32,

    /// Consecutive passed checks that return it to rotation.
    #[arg(long, env = "SHOAL_HEALTH_SUCCESS_THRESHOLD", default_value_t = defaults::HEALTH_SUCCESS_THRESHOLD, value_parser = parsers::positive_u32)]
    pub health_success_threshold: u32,

    /// Path probed on each worker by the health checker.
    #[arg(long, env = "SHOAL_HEALTH_CHECK_ENDPOINT", default_value = defaults::HEALTH_CHECK_ENDPOINT, value_parser = parsers::url_path)]
    pub health_check_endpoint: String,

    /// Mesh (fleet-wide load sharing) settings.
    #[command(flatten)]
    pub mesh: MeshArgs,

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
        let config = Self::from_arg_matches(&matches)?;
        config.validate()?;
        Ok(config)
    }

    fn validate(&self) -> Result<(), ConfigError> {
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            return Err(ConfigError::Invalid(format!(
                "--retry-max-backoff-ms ({}) must be >= --retry-initial-backoff-ms ({})",
                self.retry_max_backoff_ms, self.retry_initial_backoff_ms
            )));
        }
        if self.load_stale_after() < self.load_poll_interval() {
            return Err(ConfigError::Invalid(format!(
                "--load-stale-after-ms ({} ms) must be >= --load-poll-interval-ms ({} ms)",
                self.load_stale_after().as_millis(),
                self.load_poll_interval_ms
            )));
        }
        self.mesh.validate().map_err(ConfigError::Invalid)?;
        Ok(())
    }

    /// Interval between load polls.
    pub fn load_poll_interval(&self) -> Duration {
        Duration::from_millis(self.load_poll_interval_ms)
    }

    /// Age past which a snapshot counts as missing.
    pub fn load_stale_after(&self) -> Duration {
        Duration::from_millis(
            self.load_stale_after_ms.unwrap_or(
                self.load_poll_interval_ms
                    .saturating_mul(defaults::LOAD_STALE_AFTER_POLLS),
            ),
        )
    }

    /// Interval between prefix-tree evictions (`cache_aware`).
    pub fn eviction_interval(&self) -> Duration {
        Duration::from_secs(self.eviction_interval_secs)
    }

    /// Grace period between SIGTERM and closing the listener.
    pub fn drain_settle(&self) -> Duration {
        Duration::from_secs(self.drain_settle_secs)
    }

    /// Retries allowed after the first attempt (0 when retries are off).
    pub fn max_retries(&self) -> u32 {
        if self.disable_retries {
            0
        } else {
            self.retry_max_retries
        }
    }
}

#[cfg(test)]
mod tests;
