//! Backoff between retries: exponential with jitter, capped, and never
//! sleeping past the request's deadline.

use std::time::Duration;

use rand::Rng;

use crate::config::Config;

/// Retry backoff knobs, from the `--retry-*` flags.
#[derive(Debug, Clone)]
pub struct RetryConfig {
    /// Backoff before the first retry.
    pub initial_backoff: Duration,
    /// Ceiling.
    pub max_backoff: Duration,
    /// Growth per retry.
    pub multiplier: f64,
    /// Random spread, 0..=1.
    pub jitter: f64,
}

impl From<&Config> for RetryConfig {
    fn from(config: &Config) -> Self {
        Self {
            initial_backoff: Duration::from_millis(config.retry_initial_backoff_ms),
            max_backoff: Duration::from_millis(config.retry_max_backoff_ms),
            multiplier: config.retry_backoff_multiplier,
            jitter: config.retry_jitter_factor,
        }
    }
}

impl RetryConfig {
    /// Backoff before retry number `attempt + 1`, without jitter.
    pub fn base_backoff(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt).unwrap_or(i32::MAX);
        let secs = self.initial_backoff.as_secs_f64() * self.multiplier.powi(exponent);
        let capped = secs.min(self.max_backoff.as_secs_f64());
        Duration::try_from_secs_f64(capped).unwrap_or(self.max_backoff)
    }

    /// Sleeps the jittered backoff, or until `deadline`, whichever is first.
    pub async fn sleep(&self, attempt: u32, deadline: tokio::time::Instant) {
        let base = self.base_backoff(attempt).as_secs_f64();
        let spread = if self.jitter > 0.0 {
            rand::rng().random_range(-self.jitter..=self.jitter)
        } else {
            0.0
        };
        let wait =
            Duration::try_from_secs_f64((base * (1.0 + spread)).max(0.0)).unwrap_or_default();
        let until = (tokio::time::Instant::now() + wait).min(deadline);
        tokio::time::sleep_until(until).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let retry = RetryConfig {
            initial_backoff: Duration::from_millis(50),
            max_backoff: Duration::from_millis(100),
            multiplier: 1.5,
            jitter: 0.0,
        };
        assert_eq!(retry.base_backoff(0), Duration::from_millis(50));
        assert_eq!(retry.base_backoff(1), Duration::from_millis(75));
        assert_eq!(retry.base_backoff(2), Duration::from_millis(100));
        assert_eq!(retry.base_backoff(u32::MAX), Duration::from_millis(100));
    }
}
