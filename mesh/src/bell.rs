//! Push on change: every booking, release, first byte or own snapshot rings
//! the node's [`ChangeBell`]; the announcer task then wakes the round
//! builder at once, and while changes keep coming, at most once per gap
//! (the minimum gap, stretched with the number of links: [`push_gap`]). So a change reaches peers in about one round trip when the node is
//! quiet, within the gap when it is busy, and the periodic sync is only a
//! heartbeat.
//!
//! The hot path pays one relaxed load while a change is already pending
//! (the common case under load) and one swap plus, only when the announcer
//! is idle, one wake-up: there is no cross-thread wake per request at high
//! rates.
//!
//! The announcer is a task on the mesh's runtime. On the router's, the
//! mesh's own single-threaded one (`Mesh::start_on_own_thread`), a round
//! then wakes that one thread, and the rounds builder and the pushes run
//! right after the announcement without another wake-up. Its gaps are
//! timed by a [`GapTimer`] (a timerfd), because Tokio's own timer would
//! lengthen each by up to a millisecond (a 4 ms gap lasted 5.1 ms).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Notify, watch};

use crate::gap_timer::GapTimer;

/// How often an idle announcer checks that its node still exists.
const IDLE_CHECK: Duration = Duration::from_secs(1);

/// Shared between the router's bookings (ringers) and the announcer.
#[derive(Debug, Default)]
pub(crate) struct ChangeBell {
    /// A change not yet announced.
    pending: AtomicBool,
    /// The announcer is waiting for a ring (and must be woken).
    idle: AtomicBool,
    /// Wakes the announcer. A wake before it waits is kept as a permit, so
    /// a ring between its check of `pending` and its wait is not lost.
    wake: Notify,
    /// Shortest gap between announcements, µs (see [`push_gap`]).
    gap_us: AtomicU64,
}

/// The gap between pushes on change for a node with `links` load links:
/// `min_gap`, stretched so that the pushes of all links together stay
/// within `max_push_rate` per second. Every push is a packet on every
/// link, so without the stretch a 64-replica mesh sent 63 × 250 packets a
/// second per replica at the 4 ms default; with it a change waits a little
/// longer (about `links / max_push_rate`) and more changes share a packet.
pub(crate) fn push_gap(min_gap: Duration, links: usize, max_push_rate: u32) -> Duration {
    let spread = Duration::from_secs_f64(links as f64 / f64::from(max_push_rate.max(1)));
    min_gap.max(spread)
}

impl ChangeBell {
    /// Sets the shortest gap between announcements (takes effect after
    /// the current one).
    pub(crate) fn set_gap(&self, gap: Duration) {
        self.gap_us.store(
            u64::try_from(gap.as_micros()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }

    /// The shortest gap between announcements now.
    pub(crate) fn gap(&self) -> Duration {
        Duration::from_micros(self.gap_us.load(Ordering::Relaxed))
    }

    /// Says that something the links push has changed.
    pub(crate) fn ring(&self) {
        if self.pending.load(Ordering::Relaxed) {
            return;
        }
        // SeqCst pairs with the announcer's store of `idle` then load of
        // `pending`: at least one side sees the other's write, so a ring is
        // never lost between its check and its wait.
        if self.pending.swap(true, Ordering::SeqCst) {
            return;
        }
        if self.idle.load(Ordering::SeqCst) {
            self.wake.notify_one();
        }
    }
}

/// Spawns, on the current runtime, the task that turns rings of `bell`
/// into announcements on `changes` (a counter the round builder watches):
/// at once when the node was quiet, then at most one per gap (`gap` to
/// start with, see [`ChangeBell::set_gap`]) while changes keep coming. It
/// ends when `changes` is dropped.
pub(crate) fn start_announcer(
    bell: Arc<ChangeBell>,
    changes: Weak<watch::Sender<u64>>,
    gap: Duration,
) -> tokio::task::JoinHandle<()> {
    bell.set_gap(gap);
    let mut timer = GapTimer::new()
        .inspect_err(|e| tracing::warn!(error = %e, "no timerfd: push gaps on Tokio's timer"))
        .ok();
    tokio::spawn(async move {
        loop {
            bell.idle.store(true, Ordering::SeqCst);
            if !bell.pending.load(Ordering::SeqCst) {
                let _ = tokio::time::timeout(IDLE_CHECK, bell.wake.notified()).await;
            }
            bell.idle.store(false, Ordering::SeqCst);
            // Cleared before the pushes read the slots, so a change made
            // while they read rings again and is announced after the gap.
            while bell.pending.swap(false, Ordering::SeqCst) {
                let Some(changes) = changes.upgrade() else {
                    return;
                };
                changes.send_modify(|n| *n = n.wrapping_add(1));
                drop(changes);
                wait_gap(timer.as_mut(), bell.gap()).await;
            }
            if changes.strong_count() == 0 {
                return;
            }
        }
    })
}

/// Waits `gap` on `timer`, or on Tokio's timer when there is none or it
/// fails.
async fn wait_gap(timer: Option<&mut GapTimer>, gap: Duration) {
    if let Some(timer) = timer {
        match timer.sleep(gap).await {
            Ok(()) => return,
            Err(e) => tracing::warn!(error = %e, "the push gap timer failed"),
        }
    }
    tokio::time::sleep(gap).await;
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use super::*;

    async fn a_ring_on_a_quiet_node_is_announced_at_once() {
        let bell = Arc::new(ChangeBell::default());
        let changes = Arc::new(watch::Sender::new(0u64));
        let mut seen = changes.subscribe();
        start_announcer(
            bell.clone(),
            Arc::downgrade(&changes),
            Duration::from_secs(3600),
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
        let started = Instant::now();
        bell.ring();
        tokio::time::timeout(Duration::from_secs(5), seen.changed())
            .await
            .expect("announced")
            .expect("sender alive");
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "no gap before the first announcement"
        );
    }

    #[tokio::test]
    async fn a_ring_on_a_quiet_node_is_announced_at_once_on_one_thread() {
        a_ring_on_a_quiet_node_is_announced_at_once().await;
    }

    /// The ring comes from another thread than the announcer's.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_ring_on_a_quiet_node_is_announced_at_once_on_many_threads() {
        a_ring_on_a_quiet_node_is_announced_at_once().await;
    }

    /// Waits (at most 5 s) until `changes` reads `n`; how long it took.
    async fn until(changes: &watch::Sender<u64>, n: u64) -> Duration {
        let started = Instant::now();
        while *changes.borrow() < n {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "never reached {n}"
            );
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        started.elapsed()
    }

    #[tokio::test]
    async fn rings_within_the_gap_make_one_more_announcement() {
        let bell = Arc::new(ChangeBell::default());
        let changes = Arc::new(watch::Sender::new(0u64));
        let gap = Duration::from_secs(1);
        start_announcer(bell.clone(), Arc::downgrade(&changes), gap);
        tokio::time::sleep(Duration::from_millis(20)).await;
        // A burst of 1,000 rings: the first is announced at once.
        for _ in 0..1000 {
            bell.ring();
        }
        until(&changes, 1).await;
        let first = Instant::now();
        // Another burst inside the gap waits for its end, then makes one.
        // (A lower bound on the time between the two, half the gap: seeing
        // the first late on a slow machine shortens what is measured by
        // that lateness; without the gap it would be a few milliseconds.)
        for _ in 0..1000 {
            bell.ring();
        }
        until(&changes, 2).await;
        let apart = first.elapsed();
        assert!(
            apart >= gap / 2,
            "the second announcement came {apart:?} after the first, inside the {gap:?} gap"
        );
        // Quiet for more than a gap: the next ring goes out at once.
        tokio::time::sleep(gap * 2 + Duration::from_millis(200)).await;
        assert_eq!(*changes.borrow(), 2, "nothing rang");
        bell.ring();
        let waited = until(&changes, 3).await;
        assert!(
            waited < gap - Duration::from_millis(100),
            "waited {waited:?}"
        );
    }

    #[tokio::test]
    async fn the_announcer_ends_with_its_node() {
        let bell = Arc::new(ChangeBell::default());
        let changes = Arc::new(watch::Sender::new(0u64));
        let task = start_announcer(
            bell.clone(),
            Arc::downgrade(&changes),
            Duration::from_millis(1),
        );
        bell.ring();
        drop(changes);
        bell.ring();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .expect("ended")
            .expect("ended cleanly");
    }

    #[test]
    fn a_bell_nobody_listens_to_only_records() {
        let bell = ChangeBell::default();
        bell.ring();
        bell.ring();
        assert!(bell.pending.load(Ordering::Relaxed));
    }
}
