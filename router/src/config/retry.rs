//! Retry flags: how often a failed request is re-sent to another worker and
//! how long to back off in between.
//!
//! The backoff itself (exponential growth, jitter, the deadline cap and
//! releasing the failed worker's booking first) is behaviour, so it lives
//! with the proxy, as methods on [`RetryConfig`] in the proxy's retry module.

use std::time::Duration;

use clap::Args;

use super::{defaults, parsers};

/// Help heading of the retry flags.
pub const RETRY_FLAGS: &str = "Retries";

/// The `--retry-*` flags and `--disable-retries`.
#[derive(Debug, Clone, PartialEq, Args)]
#[command(next_help_heading = RETRY_FLAGS)]
pub struct RetryConfig {
    /// Retries after the first attempt, each on a re-selected worker, and
    /// only where the engine cannot have started the work or the method is
    /// idempotent (docs/routing.md, "Retries").
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

    /// Continuations one streamed chat or completions request may start
    /// when its engine's connection breaks mid-stream: the text generated
    /// so far is sent to another worker, which continues it, and the
    /// client's stream goes on (docs/routing.md, "Surviving engine
    /// failures"). 0 = off: the client's stream is cut.
    #[arg(long, env = "SHOAL_MIGRATION_LIMIT", default_value_t = defaults::MIGRATION_LIMIT)]
    pub migration_limit: u32,

    /// Generated text (bytes, JSON-escaped) a migratable stream keeps to
    /// be continued from; a longer stream is no longer migrated.
    #[arg(long, env = "SHOAL_MIGRATION_MAX_TEXT_BYTES", default_value_t = defaults::MIGRATION_MAX_TEXT_BYTES, value_parser = parsers::positive_usize)]
    pub migration_max_text_bytes: usize,
}

impl Default for RetryConfig {
    /// The flag defaults, for tests that back off without parsing flags.
    fn default() -> Self {
        Self {
            retry_max_retries: defaults::RETRY_MAX_RETRIES,
            retry_initial_backoff_ms: defaults::RETRY_INITIAL_BACKOFF_MS,
            retry_max_backoff_ms: defaults::RETRY_MAX_BACKOFF_MS,
            retry_backoff_multiplier: defaults::RETRY_BACKOFF_MULTIPLIER,
            retry_jitter_factor: defaults::RETRY_JITTER_FACTOR,
            disable_retries: false,
            migration_limit: defaults::MIGRATION_LIMIT,
            migration_max_text_bytes: defaults::MIGRATION_MAX_TEXT_BYTES,
        }
    }
}

impl RetryConfig {
    /// Retries allowed after the first attempt (0 when retries are off).
    pub fn max_retries(&self) -> u32 {
        if self.disable_retries {
            0
        } else {
            self.retry_max_retries
        }
    }

    /// Backoff before the first retry.
    pub fn initial_backoff(&self) -> Duration {
        Duration::from_millis(self.retry_initial_backoff_ms)
    }

    /// Ceiling on any backoff.
    pub fn max_backoff(&self) -> Duration {
        Duration::from_millis(self.retry_max_backoff_ms)
    }

    /// A ceiling below the first backoff cannot be honoured; the message
    /// names both flags.
    pub(super) fn validate(&self) -> Result<(), String> {
        if self.retry_max_backoff_ms < self.retry_initial_backoff_ms {
            return Err(format!(
                "--retry-max-backoff-ms ({}) must be >= --retry-initial-backoff-ms ({})",
                self.retry_max_backoff_ms, self.retry_initial_backoff_ms
            ));
        }
        Ok(())
    }
}
