//! Per-second rate of a monotonic counter between polls.
//!
//! vLLM and llama.cpp export generation throughput only as a token counter
//! (`vllm:generation_tokens_total`, `llamacpp:tokens_predicted_total`); the
//! monitor keeps one [`CounterRate`] per worker and turns successive counter
//! readings into `gen_throughput`.

use std::time::Instant;

use shoal_proto::load::valid_throughput;

/// Remembers the previous reading of one counter so the next reading can be
/// turned into tokens per second. The time of each reading is passed in, so
/// the caller decides which clock counts (and tests stay deterministic).
#[derive(Debug, Clone, Copy, Default)]
pub struct CounterRate {
    previous: Option<(f64, Instant)>,
}

impl CounterRate {
    /// A tracker with no baseline yet; the first observation only sets one.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records `value` read at `at` and returns the per-second increase since
    /// the previous reading, validated with `valid_throughput`.
    ///
    /// Returns `None`:
    /// - on the first observation (no baseline yet);
    /// - on a counter reset (`value` below the previous one: the engine
    ///   restarted), which restarts the baseline at `value`;
    /// - on a non-finite or negative `value`, which is ignored (the baseline
    ///   is kept, so the next good reading still yields a rate);
    /// - when no time passed since the baseline (or `at` is earlier), which
    ///   keeps the baseline;
    /// - when the counter did not move (a zero rate is not a throughput).
    pub fn observe(&mut self, value: f64, at: Instant) -> Option<f64> {
        if !(value.is_finite() && value >= 0.0) {
            return None;
        }
        let Some((prev_value, prev_at)) = self.previous else {
            self.previous = Some((value, at));
            return None;
        };
        if value < prev_value {
            self.previous = Some((value, at));
            return None;
        }
        let elapsed = at.checked_duration_since(prev_at)?.as_secs_f64();
        if elapsed <= 0.0 {
            return None;
        }
        self.previous = Some((value, at));
        valid_throughput((value - prev_value) / elapsed)
    }

    /// Forgets the baseline, e.g. when the worker was removed and re-added or
    /// its engine kind changed.
    pub fn reset(&mut self) {
        self.previous = None;
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn first_observation_only_sets_the_baseline() {
        let mut rate = CounterRate::new();
        assert_eq!(rate.observe(100.0, Instant::now()), None);
    }

    #[test]
    fn normal_rate_is_tokens_per_second() {
        let t0 = Instant::now();
        let mut rate = CounterRate::new();
        assert_eq!(rate.observe(1000.0, t0), None);
        assert_eq!(
            rate.observe(1500.0, t0 + Duration::from_secs(2)),
            Some(250.0)
        );
        assert_eq!(
            rate.observe(1600.0, t0 + Duration::from_millis(2500)),
            Some(200.0)
        );
        // Exponent-formatted large counters work like any other value.
        assert_eq!(
            rate.observe(1.23457e6, t0 + Duration::from_millis(3500)),
            Some(1_232_970.0)
        );
    }

    #[test]
    fn reset_restarts_the_baseline() {
        let t0 = Instant::now();
        let mut rate = CounterRate::new();
        rate.observe(5000.0, t0);
        assert_eq!(rate.observe(10.0, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            rate.observe(110.0, t0 + Duration::from_secs(2)),
            Some(100.0)
        );
        rate.reset();
        assert_eq!(rate.observe(500.0, t0 + Duration::from_secs(3)), None);
    }

    #[test]
    fn zero_or_negative_elapsed_time_keeps_the_baseline() {
        let t0 = Instant::now() + Duration::from_secs(10);
        let mut rate = CounterRate::new();
        rate.observe(100.0, t0);
        assert_eq!(rate.observe(200.0, t0), None);
        assert_eq!(rate.observe(200.0, t0 - Duration::from_secs(1)), None);
        assert_eq!(
            rate.observe(300.0, t0 + Duration::from_secs(1)),
            Some(200.0)
        );
    }

    #[test]
    fn non_finite_and_negative_input_is_ignored() {
        let t0 = Instant::now();
        let mut rate = CounterRate::new();
        assert_eq!(rate.observe(f64::NAN, t0), None);
        rate.observe(100.0, t0);
        assert_eq!(
            rate.observe(f64::INFINITY, t0 + Duration::from_secs(1)),
            None
        );
        assert_eq!(rate.observe(-1.0, t0 + Duration::from_secs(1)), None);
        assert_eq!(
            rate.observe(400.0, t0 + Duration::from_secs(2)),
            Some(150.0)
        );
    }

    #[test]
    fn an_unmoved_counter_has_no_throughput() {
        let t0 = Instant::now();
        let mut rate = CounterRate::new();
        rate.observe(100.0, t0);
        assert_eq!(rate.observe(100.0, t0 + Duration::from_secs(1)), None);
        assert_eq!(rate.observe(150.0, t0 + Duration::from_secs(2)), Some(50.0));
    }
}
