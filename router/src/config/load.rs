//! Load-monitor flags: how often engines are polled, in which format, and
//! when a polled snapshot is too old to route on.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{defaults, parsers};

/// Help heading of the load-monitor flags.
pub const LOAD_FLAGS: &str = "Engine load";

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

/// The load-monitor flags: read by the monitor (interval, source) and by
/// the fleet view (stale limit), so both agree on what "fresh" means.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = LOAD_FLAGS)]
pub struct LoadPollConfig {
    /// How often each engine's load endpoint is polled, in milliseconds.
    #[arg(long, env = "SHOAL_LOAD_POLL_INTERVAL_MS", default_value_t = defaults::LOAD_POLL_INTERVAL_MS, value_parser = parsers::positive_u64)]
    pub load_poll_interval_ms: u64,

    /// A polled snapshot older than this counts as missing [default: 3 × poll interval].
    #[arg(long, env = "SHOAL_LOAD_STALE_AFTER_MS", value_parser = parsers::positive_u64)]
    pub load_stale_after_ms: Option<u64>,

    /// Load format to poll engines with.
    #[arg(long, env = "SHOAL_WORKER_LOAD_SOURCE", value_enum, default_value = defaults::WORKER_LOAD_SOURCE)]
    pub worker_load_source: LoadSource,
}

impl LoadPollConfig {
    /// Interval between load polls.
    pub fn poll_interval(&self) -> Duration {
        Duration::from_millis(self.load_poll_interval_ms)
    }

    /// Age past which a snapshot counts as missing.
    pub fn stale_after(&self) -> Duration {
        Duration::from_millis(
            self.load_stale_after_ms.unwrap_or(
                self.load_poll_interval_ms
                    .saturating_mul(defaults::LOAD_STALE_AFTER_POLLS),
            ),
        )
    }

    /// Whether engines are polled at all (`--worker-load-source none` turns
    /// polling off, and with it every engine signal).
    pub fn polls_engines(&self) -> bool {
        self.worker_load_source != LoadSource::None
    }

    /// A stale limit shorter than the poll interval would make every
    /// snapshot missing between two polls; the message names both flags.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.stale_after() < self.poll_interval() {
            return Err(format!(
                "--load-stale-after-ms ({} ms) must be >= --load-poll-interval-ms ({} ms)",
                self.stale_after().as_millis(),
                self.load_poll_interval_ms
            ));
        }
        Ok(())
    }
}
