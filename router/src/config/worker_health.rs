//! Flags that decide whether a worker gets traffic: the per-worker circuit
//! breaker (`--cb-*`) and the active health checker (`--health-*`).

use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the circuit-breaker flags.
pub const BREAKER_FLAGS: &str = "Circuit breaker";
/// Help heading of the health-check flags.
pub const HEALTH_FLAGS: &str = "Health checks";

/// The `--cb-*` flags and `--disable-circuit-breaker`: every worker's
/// breaker is built from this group.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = BREAKER_FLAGS)]
pub struct BreakerConfig {
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
}

impl Default for BreakerConfig {
    /// The flag defaults, for workers built without parsing flags (tests,
    /// benchmarks).
    fn default() -> Self {
        Self {
            cb_failure_threshold: defaults::CB_FAILURE_THRESHOLD,
            cb_success_threshold: defaults::CB_SUCCESS_THRESHOLD,
            cb_timeout_duration_secs: defaults::CB_TIMEOUT_DURATION_SECS,
            cb_window_duration_secs: defaults::CB_WINDOW_DURATION_SECS,
            disable_circuit_breaker: false,
        }
    }
}

impl BreakerConfig {
    /// False when `--disable-circuit-breaker` is set.
    pub fn enabled(&self) -> bool {
        !self.disable_circuit_breaker
    }

    /// Time an open circuit waits before half-opening.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.cb_timeout_duration_secs)
    }

    /// Failures older than this restart the count.
    pub fn window(&self) -> Duration {
        Duration::from_secs(self.cb_window_duration_secs)
    }
}

/// The `--health-*` flags: the active health checker runs on this group.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = HEALTH_FLAGS)]
pub struct HealthConfig {
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
}

impl HealthConfig {
    /// Time between health-check rounds.
    pub fn interval(&self) -> Duration {
        Duration::from_secs(self.health_check_interval_secs)
    }

    /// Deadline of one probe.
    pub fn timeout(&self) -> Duration {
        Duration::from_secs(self.health_check_timeout_secs)
    }
}
