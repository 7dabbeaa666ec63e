//! Admission flags: how many inference requests one replica proxies at once
//! and how long the rest may queue for a slot.

use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the admission flags.
pub const ADMISSION_FLAGS: &str = "Admission";

/// `--max-concurrent-requests`, `--queue-size` and `--queue-timeout-secs`:
/// the admission gate is built from this group.
#[derive(Debug, Clone, PartialEq, Eq, Args)]
#[command(next_help_heading = ADMISSION_FLAGS)]
pub struct AdmissionConfig {
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
}

impl AdmissionConfig {
    /// How long one queued request waits for a slot.
    pub fn queue_timeout(&self) -> Duration {
        Duration::from_secs(self.queue_timeout_secs)
    }
}
