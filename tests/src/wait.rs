//! The waits of every test crate (the mesh's, the router's, the
//! cross-process ones): poll a condition until it holds, bounded.
//!
//! A test that waits for a state (a view settling, an event arriving)
//! polls for it instead of sleeping a fixed time: it goes on as soon as
//! the state holds, and on a slow machine it waits longer instead of
//! failing. The bound is a failure bound, not a timing assertion.
//! [`wait_for`] fails naming what it waited for; [`poll_until`] and
//! [`poll_until_blocking`] (for tests on plain threads) return whether the
//! condition came true, for the caller's own message.

use std::time::{Duration, Instant};

/// How often the probe is polled: short next to what the tests wait for
/// (polls, mesh pushes, process starts), long enough not to load the box.
pub const POLL_EVERY: Duration = Duration::from_millis(10);

/// Polls `probe` every [`POLL_EVERY`] until it returns a value, and
/// returns it; `None` once `within` has passed without one.
async fn poll_for<T>(within: Duration, mut probe: impl AsyncFnMut() -> Option<T>) -> Option<T> {
    let deadline = Instant::now() + within;
    loop {
        if let Some(v) = probe().await {
            return Some(v);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(POLL_EVERY).await;
    }
}

/// Polls `probe` every [`POLL_EVERY`] until it returns a value, and
/// returns it; panics naming `what` after `within`.
pub async fn wait_for<T>(what: &str, within: Duration, probe: impl AsyncFnMut() -> Option<T>) -> T {
    match poll_for(within, probe).await {
        Some(v) => v,
        None => panic!("{what}: not within {within:?}"),
    }
}

/// Polls `cond` every [`POLL_EVERY`] until it holds (true) or `within`
/// passes (false).
pub async fn poll_until(within: Duration, mut cond: impl AsyncFnMut() -> bool) -> bool {
    poll_for(within, async || cond().await.then_some(()))
        .await
        .is_some()
}

/// [`poll_until`] on a plain thread, polling every `period` (longer for
/// conditions that read a whole status).
pub fn poll_until_blocking(
    period: Duration,
    within: Duration,
    mut cond: impl FnMut() -> bool,
) -> bool {
    let deadline = Instant::now() + within;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(period);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn returns_the_first_value_the_probe_yields() {
        let mut calls = 0;
        let got = wait_for("the third call", Duration::from_secs(5), async || {
            calls += 1;
            (calls == 3).then_some(calls * 10)
        })
        .await;
        assert_eq!(got, 30);
    }

    #[tokio::test]
    async fn poll_until_says_whether_the_condition_came_true() {
        let mut n = 0;
        assert!(
            poll_until(Duration::from_secs(5), async || {
                n += 1;
                n == 2
            })
            .await
        );
        assert!(!poll_until(Duration::from_millis(30), async || false).await);
        let mut m = 0;
        assert!(poll_until_blocking(
            POLL_EVERY,
            Duration::from_secs(5),
            || {
                m += 1;
                m == 2
            }
        ));
        assert!(!poll_until_blocking(
            POLL_EVERY,
            Duration::from_millis(30),
            || false
        ));
    }

    #[tokio::test]
    #[should_panic(expected = "never: not within")]
    async fn fails_naming_what_it_waited_for() {
        wait_for("never", Duration::from_millis(30), async || None::<()>).await;
    }
}
