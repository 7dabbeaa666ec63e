//! Backoff between retries: exponential with jitter, capped, and never
//! sleeping past the request's deadline.

use std::time::Duration;

use rand::Rng;

use crate::workers::SlotBooking;

use crate::config::RetryConfig;

// The flag group is defined in config; its backoff behaviour is defined
// here, next to the only code that backs off.
impl RetryConfig {
    /// Backoff before retry number `attempt + 1`, without jitter.
    pub fn base_backoff(&self, attempt: u32) -> Duration {
        let exponent = i32::try_from(attempt).unwrap_or(i32::MAX);
        let max_backoff = self.max_backoff();
        let secs =
            self.initial_backoff().as_secs_f64() * self.retry_backoff_multiplier.powi(exponent);
        let capped = secs.min(max_backoff.as_secs_f64());
        Duration::try_from_secs_f64(capped).unwrap_or(max_backoff)
    }

    /// Releases the failed attempt's `booking`, then sleeps the backoff
    /// before retry number `attempt + 1`.
    ///
    /// The only way to back off: taking the booking by value means no retry
    /// path can keep a failed worker booked (in-flight request, token-work,
    /// pending prefill) while it waits.
    pub async fn release_and_sleep(
        &self,
        booking: SlotBooking,
        attempt: u32,
        deadline: tokio::time::Instant,
    ) {
        drop(booking);
        self.sleep(attempt, deadline).await;
    }

    /// Sleeps the jittered backoff, or until `deadline`, whichever is first.
    async fn sleep(&self, attempt: u32, deadline: tokio::time::Instant) {
        let base = self.base_backoff(attempt).as_secs_f64();
        let jitter = self.retry_jitter_factor;
        let spread = if jitter > 0.0 {
            rand::rng().random_range(-jitter..=jitter)
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
            retry_initial_backoff_ms: 50,
            retry_max_backoff_ms: 100,
            retry_backoff_multiplier: 1.5,
            retry_jitter_factor: 0.0,
            ..RetryConfig::default()
        };
        assert_eq!(retry.base_backoff(0), Duration::from_millis(50));
        assert_eq!(retry.base_backoff(1), Duration::from_millis(75));
        assert_eq!(retry.base_backoff(2), Duration::from_millis(100));
        assert_eq!(retry.base_backoff(u32::MAX), Duration::from_millis(100));
    }

    #[tokio::test]
    async fn the_booking_is_released_before_the_backoff() {
        let retry = RetryConfig {
            retry_initial_backoff_ms: 30_000,
            retry_max_backoff_ms: 30_000,
            retry_backoff_multiplier: 1.0,
            retry_jitter_factor: 0.0,
            ..RetryConfig::default()
        };
        let ledger = crate::workers::Ledger::detached("http://w:1");
        let booking = ledger.book(7, 20);
        assert_eq!(ledger.counts().requests, 1);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let backoff = retry.release_and_sleep(booking, 0, deadline);
        tokio::pin!(backoff);
        let slept = tokio::time::timeout(Duration::from_millis(50), &mut backoff).await;
        assert!(slept.is_err(), "still sleeping the 30 s backoff");
        assert_eq!(ledger.counts().requests, 0);
        assert_eq!(ledger.counts().tokens, 0);
        assert_eq!(ledger.counts().pending_prefill, 0);
    }
}
