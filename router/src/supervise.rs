//! Keeping the replica's background tasks running.
//!
//! Why: health checks, load polls, the worker sources, reloads, discovery
//! and policy upkeep each run as one long task. A panic in one (a bug an
//! engine's odd answer reaches) would end it silently while `/health`
//! stays 200: workers unchecked, loads unpolled.
//! [`supervised`] runs the task, and when it panics logs it, counts it
//! (`shoal_background_task_restarts_total{task}`) and starts it again
//! after a backoff (1 s doubling to 30 s, back to 1 s once a run lasted a
//! minute), so one bad input costs a restart, not the replica's routing.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;

use crate::telemetry;

/// Pause before the first restart.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
/// Longest pause between restarts.
const MAX_BACKOFF: Duration = Duration::from_secs(30);
/// A run at least this long resets the backoff.
const HEALTHY_RUN: Duration = Duration::from_secs(60);

/// Aborts the task when dropped (the supervisor was aborted: the replica
/// is stopping).
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Runs the task `make` builds until it returns, restarting it after each
/// panic (see the module doc). Abort the returned future to stop both.
pub async fn supervised<F, Fut>(task: &'static str, mut make: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut backoff = FIRST_BACKOFF;
    loop {
        let started = tokio::time::Instant::now();
        let mut running = AbortOnDrop(tokio::spawn(make()));
        match (&mut running.0).await {
            Ok(()) => {
                tracing::info!(task, "background task ended");
                return;
            }
            Err(err) if err.is_panic() => {
                telemetry::background_task_restarted(task);
                if started.elapsed() >= HEALTHY_RUN {
                    backoff = FIRST_BACKOFF;
                }
                tracing::error!(
                    task,
                    restart_in_secs = backoff.as_secs(),
                    "background task panicked; restarting it"
                );
            }
            // Cancelled from outside: the runtime is stopping.
            Err(_) => return,
        }
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_panicking_task_is_restarted_with_backoff_and_one_that_ends_is_not() {
        let starts = Arc::new(AtomicUsize::new(0));
        let counted = starts.clone();
        let supervisor = tokio::spawn(supervised("test", move || {
            let n = counted.fetch_add(1, Ordering::SeqCst);
            async move {
                if n < 2 {
                    panic!("a bug on run {n}");
                }
            }
        }));
        supervisor.await.unwrap();
        assert_eq!(
            starts.load(Ordering::SeqCst),
            3,
            "two restarts, then it ended"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn aborting_the_supervisor_stops_the_task() {
        let alive = Arc::new(AtomicUsize::new(0));
        let flag = alive.clone();
        let supervisor = tokio::spawn(supervised("test", move || {
            let flag = flag.clone();
            async move {
                flag.fetch_add(1, Ordering::SeqCst);
                let _still = scopeguard(flag);
                std::future::pending::<()>().await;
            }
        }));
        tokio::task::yield_now().await;
        assert_eq!(alive.load(Ordering::SeqCst), 1);
        supervisor.abort();
        let _ = supervisor.await;
        tokio::task::yield_now().await;
        assert_eq!(alive.load(Ordering::SeqCst), 0, "the task was dropped");
    }

    /// Decrements `count` when dropped.
    fn scopeguard(count: Arc<AtomicUsize>) -> impl Drop {
        struct Guard(Arc<AtomicUsize>);
        impl Drop for Guard {
            fn drop(&mut self) {
                self.0.fetch_sub(1, Ordering::SeqCst);
            }
        }
        Guard(count)
    }
}
