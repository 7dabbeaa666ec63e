//! Admission flags: how many inference requests one replica proxies at once
//! and how long the rest may queue for a slot.

use std::time::Duration;

use clap::{Args, ValueEnum};

use super::{defaults, parsers};

/// Help heading of the admission flags.
pub const ADMISSION_FLAGS: &str = "Admission";

/// What fair share between tenants is measured over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum FairShareScope {
    /// The token-work each tenant was granted across the fleet (over the
    /// mesh): a tenant whose traffic reaches few replicas is served first
    /// there until it has its share of the whole fleet.
    Fleet,
    /// Each replica's queue alone (the per-replica baseline).
    Replica,
}

/// `--max-concurrent-requests`, `--queue-size`, the queue timeouts of each
/// class and `--sheddable-max-inflight`: the admission gate is built from
/// this group.
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

    /// Seconds a queued standard request waits for a slot before 503 with
    /// Retry-After.
    #[arg(long, env = "SHOAL_QUEUE_TIMEOUT_SECS", default_value_t = defaults::QUEUE_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub queue_timeout_secs: u64,

    /// Seconds a queued critical request waits for a slot (critical
    /// requests are served before any other class).
    #[arg(long, env = "SHOAL_CRITICAL_QUEUE_TIMEOUT_SECS", default_value_t = defaults::CRITICAL_QUEUE_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub critical_queue_timeout_secs: u64,

    /// Seconds a queued sheddable request waits for a slot (sheddable
    /// requests are served after every other class).
    #[arg(long, env = "SHOAL_SHEDDABLE_QUEUE_TIMEOUT_SECS", default_value_t = defaults::SHEDDABLE_QUEUE_TIMEOUT_SECS, value_parser = parsers::positive_u64)]
    pub sheddable_queue_timeout_secs: u64,

    /// Shed sheddable requests (429, code `shed`) when every available
    /// worker has this many requests in flight fleet-wide, keeping the room
    /// above it for critical and standard traffic. 0 = off.
    #[arg(long, env = "SHOAL_SHEDDABLE_MAX_INFLIGHT", default_value_t = defaults::SHEDDABLE_MAX_INFLIGHT)]
    pub sheddable_max_inflight: u64,

    /// What fair share between the tenants waiting for a slot is measured
    /// over: `fleet` (token-work granted across the fleet lately, over the
    /// mesh) or `replica` (this replica's queue alone).
    #[arg(long, env = "SHOAL_FAIR_SHARE_SCOPE", value_enum, default_value_t = defaults::FAIR_SHARE_SCOPE)]
    pub fair_share_scope: FairShareScope,
}

impl AdmissionConfig {
    /// How long one queued request waits for a slot.
    pub fn queue_timeout(&self) -> Duration {
        Duration::from_secs(self.queue_timeout_secs)
    }

    /// How long a queued request of each class waits: critical, standard,
    /// sheddable (the order of the classes, highest first).
    pub fn class_timeouts(&self) -> [Duration; 3] {
        [
            self.critical_queue_timeout_secs,
            self.queue_timeout_secs,
            self.sheddable_queue_timeout_secs,
        ]
        .map(Duration::from_secs)
    }
}
