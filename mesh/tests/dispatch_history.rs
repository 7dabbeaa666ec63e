#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A snapshot learned from a peer rebases the own `dispatched_since_poll`
//! to what this replica had dispatched at the poll's time, however far
//! back that is: exactly while the dispatch history reaches it (the
//! history spans a time, not a number of samples), and to the history's
//! oldest sample beyond it (bounded, counted). Under continuous bookings
//! a poller stamping its polls in the past — a slow `/metrics`, or a clock
//! behind — never makes the others' shares grow without bound.

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Ca, Node, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::WorkerSlot;
use shoal_mesh::proto::{EngineKind, EngineLoad};

const TOKENS_PER_BOOKING: u64 = 10;

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// What bookers booked, as (unix ms, tokens booked so far) pairs.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(u64, u64)>>>);

impl Log {
    /// Tokens booked up to `at_ms` (by the last entry at or before it).
    fn booked_by(&self, at_ms: u64) -> u64 {
        let log = self.0.lock().unwrap();
        log.iter()
            .rev()
            .find(|(t, _)| *t <= at_ms)
            .map_or(0, |&(_, v)| v)
    }

    fn total(&self) -> u64 {
        self.0.lock().unwrap().last().map_or(0, |&(_, v)| v)
    }
}

/// Books and releases `TOKENS_PER_BOOKING` on each slot about every
/// millisecond until stopped (at most `max` long), logging the running
/// total of all of them.
struct Booker {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
    log: Log,
}

impl Booker {
    fn start(slots: Vec<WorkerSlot>, max: Duration) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let log = Log::default();
        let thread = {
            let (stop, log) = (stop.clone(), log.clone());
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut booked = 0;
                while !stop.load(Ordering::Relaxed) && start.elapsed() < max {
                    for slot in &slots {
                        drop(slot.book(0, TOKENS_PER_BOOKING));
                        booked += TOKENS_PER_BOOKING;
                    }
                    log.0.lock().unwrap().push((unix_ms(), booked));
                    std::thread::sleep(Duration::from_millis(1));
                }
            })
        };
        Self {
            stop,
            thread: Some(thread),
            log,
        }
    }

    fn stop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
    }
}

impl Drop for Booker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `node` publishes a snapshot of `slot`'s worker stamped `polled_at`.
fn publish(node: &Node, slot: &WorkerSlot, polled_at: u64) {
    let mut stamp = slot.poll_stamp();
    stamp.polled_at_unix_ms = polled_at;
    let load = EngineLoad {
        waiting_requests: Some(1),
        ..EngineLoad::default()
    };
    node.mesh()
        .publish_snapshot(slot, &stamp, EngineKind::Vllm, load);
}

/// Two meshed nodes: `n0` polls each of `workers`, `n1` holds their slots.
fn pair(ca: &Ca, tweak: impl Fn(&mut shoal_mesh::MeshConfig)) -> Vec<Node> {
    let nodes = cluster(ca, 2, tweak);
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );
    nodes
}

/// While `n1` books `w` continuously, `n0` publishes one snapshot stamped
/// `behind` in the past. Returns (the stamp, `n1`'s own work since the
/// poll once it rebased, the booker's log, the unix ms it learned it).
fn learn_a_past_snapshot(nodes: &[Node], w: &str, behind: Duration) -> (u64, u64, Log, u64) {
    let poller = nodes[0].mesh().worker(w);
    poller.set_polled(true);
    let slot = nodes[1].mesh().worker(w);
    let mut booker = Booker::start(vec![slot.clone()], Duration::from_secs(30));
    // Book for longer than the stamp reaches back (and than 64 sync
    // intervals), so only a history that reaches back by time, not by a
    // count of samples, answers.
    std::thread::sleep(behind + Duration::from_secs(1));
    let stamp = unix_ms() - behind.as_millis() as u64;
    publish(&nodes[0], &poller, stamp);
    let learned = wait_until(Duration::from_secs(5), || {
        slot.fleet()
            .snapshot
            .is_some_and(|s| s.polled_at_unix_ms == stamp)
    });
    assert!(learned, "n1 never learned the snapshot");
    let learned_at = unix_ms();
    let rebased = wait_until(Duration::from_secs(2), || {
        slot.basis_polled_at_unix_ms() == stamp
    });
    booker.stop();
    let since = slot.own().dispatched_since_poll;
    let log = booker.log.clone();
    assert!(
        rebased,
        "a snapshot stamped {behind:?} in the past did not rebase the own count \
         (basis {}, work since the poll {since} of {} booked)",
        slot.basis_polled_at_unix_ms(),
        log.total()
    );
    (stamp, since, log, learned_at)
}

/// Checks `since` is the work booked after `stamp`, give or take one
/// history step and the sampling delay (an over-estimate, never under).
fn assert_exact(stamp: u64, since: u64, log: &Log, behind: Duration) {
    let total = log.total();
    let upper = total - log.booked_by(stamp - 300);
    let lower = total - log.booked_by(stamp + 200);
    println!(
        "stamped {behind:?} behind: work since the poll {since} (booked after the stamp: \
         {lower}..{upper}; booked in all {total})"
    );
    assert!(
        since <= upper,
        "counted {since}, more than was booked since the stamp ({upper})"
    );
    assert!(
        since >= lower,
        "counted {since}, less than was booked since the stamp ({lower})"
    );
}

/// A snapshot stamped 1.5 s in the past (a poll that took 1.5 s, or a
/// poller whose clock is behind) rebases the own count exactly: the
/// history (default span: the mesh's stale limit) reaches back that far.
#[test]
fn a_snapshot_stamped_1_5_s_in_the_past_rebases_the_own_count() {
    let ca = Ca::new("ca");
    let nodes = pair(&ca, |_| {});
    let behind = Duration::from_millis(1500);
    let (stamp, since, log, _) = learn_a_past_snapshot(&nodes, "http://10.9.0.1:8000", behind);
    assert_exact(stamp, since, &log, behind);
}

/// A snapshot stamped 5 s in the past, with the history reaching 6 s (a
/// router whose `--load-stale-after-ms` is 6000): rebased exactly.
#[test]
fn a_snapshot_stamped_5_s_in_the_past_rebases_exactly_within_the_history() {
    let ca = Ca::new("ca");
    let nodes = pair(&ca, |c| c.dispatch_history = Duration::from_secs(6));
    let behind = Duration::from_secs(5);
    let (stamp, since, log, _) = learn_a_past_snapshot(&nodes, "http://10.9.0.2:8000", behind);
    assert_exact(stamp, since, &log, behind);
    assert_eq!(nodes[1].mesh().traffic().rebase_history_short, 0);
}

/// A snapshot stamped 5 s in the past with the default history (3 s):
/// older than the history reaches, so the own count is rebased to the
/// history's oldest sample — the work of about the last 3 s, bounded —
/// and the fallback is counted.
#[test]
fn a_snapshot_older_than_the_history_rebases_to_its_start_and_is_counted() {
    let ca = Ca::new("ca");
    let nodes = pair(&ca, |_| {});
    let behind = Duration::from_secs(5);
    let span = shoal_mesh::DEFAULT_DISPATCH_HISTORY;
    let (stamp, since, log, learned_at) =
        learn_a_past_snapshot(&nodes, "http://10.9.0.3:8000", behind);
    let total = log.total();
    // The oldest sample is at most the span (and a step and a sampling
    // delay, in slack) before the rebase, which came after the stamp.
    let upper = total - log.booked_by(learned_at - span.as_millis() as u64 - 500);
    let since_stamp = total - log.booked_by(stamp);
    println!(
        "stamped {behind:?} behind, history {span:?}: work since the poll {since} \
         (at most {upper}; booked since the stamp {since_stamp}; in all {total})"
    );
    assert!(
        since <= upper,
        "{since} > {upper}: not bounded by the history"
    );
    assert!(since < since_stamp, "the base moved forward");
    assert!(nodes[1].mesh().traffic().rebase_history_short >= 1);
}

/// A poller whose clock is 1 s behind polls every 200 ms while two other
/// nodes book continuously: the fleet work since the poll stays within
/// what was booked over the last few seconds on every poll, instead of
/// growing with every booking. (A 10 ms sync interval: a history of 64
/// samples, one per interval, would span only 640 ms.)
#[test]
fn a_poller_clock_a_second_behind_keeps_the_fleet_work_since_poll_bounded() {
    const W: &str = "http://10.9.0.9:8000";
    let ca = Ca::new("ca");
    let nodes = cluster(&ca, 3, |c| c.sync_interval = Duration::from_millis(10));
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(wait_for_full_mesh(&refs, Duration::from_secs(10)));
    let poller = nodes[0].mesh().worker(W);
    poller.set_polled(true);
    let slots: Vec<WorkerSlot> = nodes.iter().map(|n| n.mesh().worker(W)).collect();
    let _booker = Booker::start(
        vec![slots[1].clone(), slots[2].clone()],
        Duration::from_secs(30),
    );
    let log = _booker.log.clone();
    let mut worst = 0.0f64;
    let mut failures = Vec::new();
    for poll in 0..40 {
        publish(&nodes[0], &poller, unix_ms() - 1000);
        std::thread::sleep(Duration::from_millis(200));
        if poll < 10 {
            continue;
        }
        let now = unix_ms();
        // Work since a poll 1 s behind, one interval ago, with a second of
        // slack for delivery and sampling on a busy machine.
        let bound = log.total() - log.booked_by(now - 2500);
        for (i, slot) in slots.iter().enumerate() {
            let since = slot.fleet().counts.dispatched_since_poll;
            worst = worst.max(since as f64 / bound.max(1) as f64);
            if since > bound {
                failures.push(format!(
                    "poll {poll}: n{i} reads {since} tokens since the poll, bound {bound} \
                     (booked in all {})",
                    log.total()
                ));
            }
        }
    }
    println!("clock 1 s behind: worst fleet work since the poll / bound = {worst:.2}");
    assert!(
        failures.is_empty(),
        "{} reads over the bound, first: {}",
        failures.len(),
        failures[0]
    );
}
