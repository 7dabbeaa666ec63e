//! Per-worker circuit breaker: stop sending traffic to a worker that keeps
//! failing, probe it again after a cool-down.
//!
//! Closed -> Open after `failure_threshold` consecutive failures within
//! `window`; Open -> HalfOpen once `timeout` has passed; HalfOpen -> Closed
//! after `success_threshold` consecutive successes, or back to Open on any
//! failure. The state is mirrored in an atomic so the routing hot path reads
//! it without taking the lock, and a success on a closed circuit with no
//! failures counted (every request of a healthy worker) changes nothing, so
//! it returns without the lock too.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::config::BreakerConfig;

/// Where a circuit stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CircuitState {
    /// Traffic flows.
    Closed,
    /// Traffic is held off.
    Open,
    /// Traffic flows as a probe; one failure reopens.
    HalfOpen,
}

impl CircuitState {
    fn code(self) -> u8 {
        match self {
            CircuitState::Closed => 0,
            CircuitState::Open => 1,
            CircuitState::HalfOpen => 2,
        }
    }

    fn from_code(code: u8) -> Self {
        match code {
            1 => CircuitState::Open,
            2 => CircuitState::HalfOpen,
            _ => CircuitState::Closed,
        }
    }

    /// Numeric value for the `shoal_worker_circuit_state` gauge.
    pub fn as_gauge(self) -> f64 {
        f64::from(self.code())
    }
}

#[derive(Debug)]
struct Counts {
    state: CircuitState,
    failures: u32,
    successes: u32,
    first_failure: Option<Instant>,
    opened_at: Option<Instant>,
}

/// One worker's breaker.
#[derive(Debug)]
pub struct CircuitBreaker {
    config: BreakerConfig,
    /// `config.timeout()`, kept apart so tests can use a sub-second one.
    timeout: Duration,
    state: AtomicU8,
    /// Closed with no failure counted: a success has nothing to reset.
    /// Written only under the `counts` lock.
    clean: AtomicBool,
    counts: Mutex<Counts>,
}

impl CircuitBreaker {
    /// A closed breaker.
    pub fn new(config: BreakerConfig) -> Self {
        Self {
            timeout: config.timeout(),
            config,
            state: AtomicU8::new(CircuitState::Closed.code()),
            clean: AtomicBool::new(true),
            counts: Mutex::new(Counts {
                state: CircuitState::Closed,
                failures: 0,
                successes: 0,
                first_failure: None,
                opened_at: None,
            }),
        }
    }

    /// Current state (an open circuit whose timeout passed reads half-open).
    pub fn state(&self) -> CircuitState {
        let _ = self.allows();
        CircuitState::from_code(self.state.load(Ordering::Relaxed))
    }

    /// Whether a request may be sent now. Lock-free unless the circuit is open.
    pub fn allows(&self) -> bool {
        if !self.config.enabled() {
            return true;
        }
        if CircuitState::from_code(self.state.load(Ordering::Relaxed)) != CircuitState::Open {
            return true;
        }
        let mut counts = self.lock();
        if counts.state == CircuitState::Open
            && counts
                .opened_at
                .is_some_and(|at| at.elapsed() >= self.timeout)
        {
            self.set(&mut counts, CircuitState::HalfOpen);
        }
        counts.state != CircuitState::Open
    }

    /// Records a request that the worker served.
    pub fn record_success(&self) {
        if !self.config.enabled() || self.clean.load(Ordering::Acquire) {
            return;
        }
        let mut counts = self.lock();
        counts.failures = 0;
        counts.first_failure = None;
        self.clean
            .store(counts.state == CircuitState::Closed, Ordering::Release);
        if counts.state == CircuitState::HalfOpen {
            counts.successes += 1;
            if counts.successes >= self.config.cb_success_threshold {
                self.set(&mut counts, CircuitState::Closed);
            }
        }
    }

    /// Records a connect error, timeout or 5xx from the worker.
    pub fn record_failure(&self) {
        if !self.config.enabled() {
            return;
        }
        let mut counts = self.lock();
        self.clean.store(false, Ordering::Release);
        match counts.state {
            CircuitState::HalfOpen => self.set(&mut counts, CircuitState::Open),
            CircuitState::Open => {}
            CircuitState::Closed => {
                let now = Instant::now();
                let window_over = counts
                    .first_failure
                    .is_some_and(|first| now.duration_since(first) > self.config.window());
                if window_over || counts.first_failure.is_none() {
                    counts.first_failure = Some(now);
                    counts.failures = 0;
                }
                counts.failures += 1;
                if counts.failures >= self.config.cb_failure_threshold {
                    self.set(&mut counts, CircuitState::Open);
                }
            }
        }
    }

    fn set(&self, counts: &mut Counts, state: CircuitState) {
        counts.state = state;
        counts.failures = 0;
        counts.successes = 0;
        counts.first_failure = None;
        counts.opened_at = (state == CircuitState::Open).then(Instant::now);
        self.state.store(state.code(), Ordering::Relaxed);
        self.clean
            .store(state == CircuitState::Closed, Ordering::Release);
        tracing::info!(state = ?state, "circuit breaker changed state");
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|e| e.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn breaker(timeout_ms: u64) -> CircuitBreaker {
        let mut breaker = CircuitBreaker::new(BreakerConfig {
            cb_failure_threshold: 3,
            cb_success_threshold: 2,
            cb_window_duration_secs: 60,
            ..BreakerConfig::default()
        });
        breaker.timeout = Duration::from_millis(timeout_ms);
        breaker
    }

    #[test]
    fn opens_after_threshold_and_half_opens_after_timeout() {
        let cb = breaker(30);
        cb.record_failure();
        cb.record_failure();
        assert!(cb.allows());
        cb.record_failure();
        assert_eq!(cb.state(), CircuitState::Open);
        assert!(!cb.allows());
        std::thread::sleep(Duration::from_millis(40));
        assert!(cb.allows());
        assert_eq!(cb.state(), CircuitState::HalfOpen);
        cb.record_success();
        assert_eq!(cb.state(), CircuitState::HalfOpen);
        cb.record_success();
        assert_eq!(cb.state(), CircuitState::Closed);
    }

    #[test]
    fn half_open_failure_reopens_and_success_resets_count() {
        let cb = breaker(0);
        cb.record_failure();
        cb.record_failure();
        cb.record_success();
        cb.record_failure();
        cb.record_failure();
        assert_eq!(cb.state(), CircuitState::Closed, "success reset the streak");
        cb.record_failure();
        // timeout 0: the open circuit reads half-open at once
        assert_eq!(cb.state(), CircuitState::HalfOpen);
        cb.record_failure();
        assert_eq!(
            CircuitState::from_code(cb.state.load(Ordering::Relaxed)),
            CircuitState::Open
        );
    }

    #[test]
    fn a_circuit_closed_again_counts_failures_from_zero() {
        let cb = breaker(0);
        for _ in 0..3 {
            cb.record_failure();
        }
        assert_eq!(cb.state(), CircuitState::HalfOpen);
        cb.record_success();
        cb.record_success();
        assert_eq!(cb.state(), CircuitState::Closed);
        // Successes on a clean circuit take the lock-free path...
        cb.record_success();
        cb.record_failure();
        cb.record_failure();
        // ...and a success after failures still resets the streak.
        cb.record_success();
        cb.record_failure();
        cb.record_failure();
        assert_eq!(cb.state(), CircuitState::Closed);
        cb.record_failure();
        assert_eq!(
            CircuitState::from_code(cb.state.load(Ordering::Relaxed)),
            CircuitState::Open
        );
    }

    #[test]
    fn disabled_breaker_always_allows() {
        let cb = CircuitBreaker::new(BreakerConfig {
            disable_circuit_breaker: true,
            ..BreakerConfig::default()
        });
        for _ in 0..100 {
            cb.record_failure();
        }
        assert!(cb.allows());
    }
}
