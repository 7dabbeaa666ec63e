#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A replica whose clock runs ahead: the others keep taking fresh
//! snapshots. A poll time in the future is clamped on receipt to the
//! receiver's clock plus [`MAX_CLOCK_SKEW_MS`], so a future-stamped snapshot
//! wins the register for at most that long and never freezes a worker.

mod common;

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{Ca, Node, cluster, wait_for_full_mesh, wait_until};
use shoal_mesh::proto::{EngineKind, EngineLoad};
use shoal_mesh::{MAX_CLOCK_SKEW_MS, SnapshotStatus, WorkerSlot};

const W: &str = "http://10.7.0.1:8000";
const HOUR_MS: u64 = 3_600_000;
/// The skew bound plus a margin for delivery on a slow machine.
const OVERTAKE_WITHIN: Duration = Duration::from_millis(MAX_CLOCK_SKEW_MS + 1_500);
/// A snapshot younger than this is fresh (publishes come every 100 ms).
const FRESH: Duration = Duration::from_secs(1);
const PUBLISH_EVERY: Duration = Duration::from_millis(100);

fn unix_ms() -> u64 {
    u64::try_from(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

/// Publishes a snapshot of `W` saying `waiting` requests wait, stamped
/// `polled_at` (a forged poll time) or honestly when `None`.
fn publish(node: &Node, slot: &WorkerSlot, polled_at: Option<u64>, waiting: u64) {
    let mut stamp = slot.poll_stamp();
    if let Some(t) = polled_at {
        stamp.polled_at_unix_ms = t;
    }
    let load = EngineLoad {
        waiting_requests: Some(waiting),
        ..EngineLoad::default()
    };
    node.mesh()
        .publish_snapshot(slot, &stamp, EngineKind::Vllm, load);
}

/// The freshest snapshot of `W` in `node`'s status.
fn stored(node: &Node) -> Option<SnapshotStatus> {
    node.mesh()
        .status()
        .workers
        .into_iter()
        .find(|w| w.worker == W)?
        .snapshot
}

/// What a node reads for `W`: poller, waiting requests, age.
#[derive(Debug, Clone)]
struct Seen {
    poller: String,
    waiting: Option<u64>,
    age: Duration,
}

/// Reads the handle's view and the status until both show the same
/// snapshot (a frame may land between the two reads).
fn seen(node: &Node, slot: &WorkerSlot) -> Option<Seen> {
    for _ in 0..10 {
        let view = slot.fleet().snapshot?;
        let status = stored(node)?;
        if status.polled_at_unix_ms == view.polled_at_unix_ms {
            return Some(Seen {
                poller: status.poller,
                waiting: view.load.waiting_requests,
                age: view.age(Instant::now()),
            });
        }
    }
    None
}

/// Three meshed nodes: `n0` (clock ahead), `n1` (honest), `n2` (observer),
/// each holding a slot for `W`; `n0` and `n1` poll it.
fn three_nodes(ca: &Ca) -> (Vec<Node>, Vec<WorkerSlot>) {
    let nodes = cluster(ca, 3, |_| {});
    let refs: Vec<&Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );
    let slots: Vec<WorkerSlot> = nodes.iter().map(|n| n.mesh().worker(W)).collect();
    slots[0].set_polled(true);
    slots[1].set_polled(true);
    (nodes, slots)
}

/// Observations: when (since the polls began), on which node, what it read.
type Timeline = Vec<(Duration, usize, Seen)>;

fn render(timeline: &Timeline) -> String {
    timeline
        .iter()
        .map(|(at, i, s)| {
            format!(
                "  {at:>9.3?} n{i}: poller {} waiting {:?} age {:?}\n",
                s.poller, s.waiting, s.age
            )
        })
        .collect()
}

/// `n0` publishes one snapshot stamped `forged`; `n1` then polls honestly
/// every 100 ms. Checks the forged one is stored clamped on arrival and
/// that `n1`'s snapshots take over within the skew bound and stay fresh.
fn honest_poller_overtakes(forged: impl Fn(u64) -> u64) {
    let ca = Ca::new("ca");
    let (nodes, slots) = three_nodes(&ca);
    let sent_at = unix_ms();
    let claimed = forged(sent_at);
    publish(&nodes[0], &slots[0], Some(claimed), 999);

    // Right after it arrives, every node stores it clamped to its own
    // clock plus the bound, with the claim kept as sent (n0 bounds its own
    // stamp by its clock plus the skew too, so the claim is in the future
    // but no later than the forged one).
    for i in [2, 1] {
        assert!(
            wait_until(Duration::from_secs(5), || stored(&nodes[i]).is_some_and(
                |s| s.poller == "n0"
                    && s.claimed_polled_at_unix_ms > sent_at
                    && s.claimed_polled_at_unix_ms <= claimed
            )),
            "n{i} never stored the future-stamped snapshot"
        );
        let s = stored(&nodes[i]).unwrap();
        let now = unix_ms();
        assert!(
            s.polled_at_unix_ms <= now + MAX_CLOCK_SKEW_MS,
            "n{i} stored {} > wall {now} + {MAX_CLOCK_SKEW_MS}",
            s.polled_at_unix_ms
        );
        assert!(s.polled_at_unix_ms >= sent_at + MAX_CLOCK_SKEW_MS);
        let view = slots[i].fleet().snapshot.unwrap();
        assert_eq!(view.load.waiting_requests, Some(999));
        assert_eq!(view.polled_at_unix_ms, s.polled_at_unix_ms);
        assert!(
            view.age(Instant::now()) < FRESH,
            "a future stamp makes no snapshot older than its arrival"
        );
    }
    let arrived = Instant::now();

    // n1 polls honestly every 100 ms for 4 s (n0 polls no more).
    let mut timeline: Timeline = Vec::new();
    let mut polls = Vec::new();
    for round in 1..=40u64 {
        publish(&nodes[1], &slots[1], None, round);
        std::thread::sleep(PUBLISH_EVERY);
        let since = arrived.elapsed();
        polls.push(round);
        for i in [1, 2] {
            timeline.push((since, i, seen(&nodes[i], &slots[i]).unwrap()));
        }
    }

    let mut failures = Vec::new();
    let mut checked = 0;
    for i in [1, 2] {
        let mine = || timeline.iter().filter(|(_, n, _)| *n == i);
        let took = mine()
            .find(|(_, _, s)| s.poller == "n1")
            .map(|(at, _, _)| *at);
        let before = mine()
            .filter(|(at, _, _)| *at < OVERTAKE_WITHIN)
            .map(|(_, _, s)| s.age)
            .max();
        let after = mine()
            .filter(|(at, _, _)| *at >= OVERTAKE_WITHIN)
            .map(|(_, _, s)| s.age)
            .max();
        let from_n0 = mine()
            .filter(|(at, _, s)| *at >= OVERTAKE_WITHIN && s.poller == "n0")
            .count();
        println!(
            "claimed {claimed} (+{} ms): on n{i} n1 first took over {took:?} after the \
             forged snapshot arrived (bound {MAX_CLOCK_SKEW_MS} ms); worst age before \
             {before:?}, after {after:?}; n0's snapshot read {from_n0} times after the bound",
            claimed.saturating_sub(sent_at),
        );
        // From the bound on: n1's latest poll (or the one before, if the
        // last push is still on its way), and young.
        for ((at, _, s), round) in mine().zip(&polls) {
            if *at < OVERTAKE_WITHIN {
                continue;
            }
            checked += 1;
            let latest = s.poller == "n1" && s.waiting.is_some_and(|w| w + 1 >= *round);
            if !latest || s.age >= FRESH {
                failures.push(format!("n{i} at {at:?}: n1 is at poll {round}, read {s:?}"));
            }
        }
    }
    assert!(checked >= 20, "too few checks past the bound: {checked}");
    assert!(
        failures.is_empty(),
        "the future-stamped snapshot came back after the bound ({} of {checked} reads):\n\
         {}\ntimeline:\n{}",
        failures.len(),
        failures.first().unwrap(),
        render(&timeline)
    );
}

/// A replica whose clock runs 1 h ahead publishes once: every replica
/// stores its poll time clamped to (own clock + `MAX_CLOCK_SKEW_MS`), keeps
/// the claim for the record, and takes the honest poller's snapshots again
/// within the bound — the fresh ones win, with small ages, from then on.
#[test]
fn snapshot_from_an_hour_ahead_is_overtaken_within_the_skew_bound() {
    honest_poller_overtakes(|now| now + HOUR_MS);
}

/// The same with the largest poll time there is (`u64::MAX`): clamping
/// does not overflow and the register is still taken over within the bound.
#[test]
fn snapshot_stamped_u64_max_is_overtaken_within_the_skew_bound() {
    honest_poller_overtakes(|_| u64::MAX);
}

/// The fast replica `n0` keeps polling every 100 ms, each poll stamped
/// `stamp(now)`, and `n1` polls honestly too when `honest_too`. Both `n1`
/// and the observer `n2` must keep reading young numbers from the latest
/// polls (of either node).
fn fast_poller_keeps_polling(stamp: impl Fn(u64) -> u64, honest_too: bool) {
    let ca = Ca::new("ca");
    let (nodes, slots) = three_nodes(&ca);
    publish(&nodes[0], &slots[0], Some(stamp(unix_ms())), 10_000);
    assert!(wait_until(Duration::from_secs(5), || {
        [1, 2].iter().all(|&i| seen(&nodes[i], &slots[i]).is_some())
    }));
    let start = Instant::now();
    let mut timeline: Timeline = Vec::new();
    let mut failures = Vec::new();
    for round in 1..=30u64 {
        publish(&nodes[0], &slots[0], Some(stamp(unix_ms())), 10_000 + round);
        if honest_too {
            publish(&nodes[1], &slots[1], None, round);
        }
        std::thread::sleep(PUBLISH_EVERY);
        for i in [1, 2] {
            let s = seen(&nodes[i], &slots[i]).unwrap();
            let waiting = s.waiting.unwrap();
            let latest = if s.poller == "n0" {
                10_000 + round
            } else {
                round
            };
            // The latest poll of either node, or the one before.
            if latest.saturating_sub(waiting) > 1 || s.age >= FRESH {
                failures.push(format!("n{i} after poll {round}: {s:?}"));
            }
            timeline.push((start.elapsed(), i, s));
        }
    }
    for i in [1, 2] {
        let mine = || timeline.iter().filter(|(_, n, _)| *n == i);
        println!(
            "fast poller keeps polling: on n{i} worst snapshot age {:?}; read n0's {} \
             times, n1's {} times",
            mine().map(|(_, _, s)| s.age).max().unwrap(),
            mine().filter(|(_, _, s)| s.poller == "n0").count(),
            mine().filter(|(_, _, s)| s.poller == "n1").count(),
        );
    }
    assert!(
        failures.is_empty(),
        "stale numbers on {} of {} reads, first: {}\ntimeline:\n{}",
        failures.len(),
        timeline.len(),
        failures.first().unwrap(),
        render(&timeline)
    );
}

/// The fast replica (1 h ahead) keeps polling while the honest one polls
/// too: its snapshots keep winning (clamped to the receiver's clock plus
/// the bound), but each is dated no later than its arrival, so the
/// observer's snapshot stays young and follows the latest polls — the
/// worker never freezes.
#[test]
fn fast_poller_an_hour_ahead_that_keeps_polling_leaves_snapshots_fresh() {
    fast_poller_keeps_polling(|now| now + HOUR_MS, true);
}

/// A poller whose poll times are pinned at `u64::MAX` keeps polling alone
/// (it is the only poller): every replica, itself included, must still
/// follow its latest numbers.
#[test]
fn fast_poller_stamping_u64_max_that_keeps_polling_leaves_snapshots_fresh() {
    fast_poller_keeps_polling(|_| u64::MAX, false);
}
