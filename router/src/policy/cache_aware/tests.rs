use std::time::Instant;

use super::*;
use crate::fleet::{LocalFleet, Moment, WorkerLoad};
use crate::policy::testkit::*;
use shoal_proto::LoadFigures;

const SYSTEM: &str = "You are a meticulous assistant for the Shoal project. Answer in \
    plain English, cite the architecture notes where they apply, and never guess \
    at numbers you have not measured. ";

fn prompt(question: &str) -> RequestInfo {
    text(&format!("{SYSTEM}{question}"))
}

fn with(config: CacheAwareConfig) -> CacheAwarePolicy {
    CacheAwarePolicy::new(config)
}

fn kv_guarded() -> CacheAwarePolicy {
    with(CacheAwareConfig {
        overload_token_usage_threshold: 0.9,
        balance_token_usage_threshold: 0.3,
        ..CacheAwareConfig::default()
    })
}

/// Seeds the tree so that `worker` holds the shared system prompt, and
/// returns its index.
fn seed_affinity(policy: &CacheAwarePolicy, workers: &[Arc<Worker>], worker: usize) {
    let only = [workers[worker].clone()];
    assert_eq!(policy.select(&only, &prompt("warm-up"), &fleet()), Some(0));
}

#[test]
fn prefix_affinity_on_a_shared_prefix() {
    let workers = workers(4);
    let policy = with(CacheAwareConfig::default());
    let fleet = fleet();
    let first = policy
        .select(&workers, &prompt("What is a CRDT?"), &fleet)
        .unwrap();
    let _held = book(&workers[first], 3, 100);
    for question in [
        "How do replicas gossip?",
        "What does least_load score?",
        "Why QUIC?",
    ] {
        assert_eq!(
            policy.select(&workers, &prompt(question), &fleet),
            Some(first)
        );
    }
    // An unrelated prompt goes to the lowest load, not the busy holder.
    let other = policy.select(&workers, &text("Translate 'hello' into French."), &fleet);
    assert_ne!(other, Some(first));
    // A holder that is not a candidate (unhealthy) cannot be chosen.
    let rest: Vec<_> = workers
        .iter()
        .filter(|w| w.id() != workers[first].id())
        .cloned()
        .collect();
    assert!(
        policy
            .select(&rest, &prompt("Still there?"), &fleet)
            .is_some()
    );
}

#[test]
fn uniform_high_kv_keeps_affinity() {
    let workers = workers(4);
    let policy = kv_guarded();
    seed_affinity(&policy, &workers, 2);
    for w in &workers {
        set_load(w, engine().usage(0.85));
    }
    assert_eq!(
        pick_n(&policy, &workers, &prompt("next question"), 10),
        [0, 0, 10, 0]
    );
}

/// How often each worker is picked in `n` selections, each booked (and
/// held) on the chosen worker, as the router does.
fn pick_booked(
    policy: &CacheAwarePolicy,
    workers: &[Arc<Worker>],
    request: &RequestInfo,
    n: usize,
) -> Vec<u32> {
    let mut counts = vec![0; workers.len()];
    let mut held = Vec::new();
    for _ in 0..n {
        let i = policy.select(workers, request, &fleet()).unwrap();
        held.extend(book(&workers[i], 1, 100));
        counts[i] += 1;
    }
    counts
}

#[test]
fn one_hot_worker_with_the_rest_idle_rebalances_across_the_cool_ones() {
    let workers = workers(4);
    let policy = kv_guarded();
    seed_affinity(&policy, &workers, 0);
    for (w, k) in workers.iter().zip([0.85, 0.2, 0.1, 0.15]) {
        set_load(w, engine().usage(k));
    }
    // max - min = 0.75 > 0.3: the guard fires. Workers within 0.3 of the
    // coldest (1, 2, 3) share the requests by in-flight count; the single
    // coldest (2) does not take them all while KV waits for a poll.
    assert_eq!(
        pick_booked(&policy, &workers, &prompt("next question"), 12),
        [0, 4, 4, 4]
    );
}

#[test]
fn overload_ceiling_falls_back_to_the_workers_under_it() {
    let workers = workers(4);
    let policy = with(CacheAwareConfig {
        overload_token_usage_threshold: 0.9,
        ..CacheAwareConfig::default()
    });
    seed_affinity(&policy, &workers, 1);
    for (w, k) in workers.iter().zip([0.85, 0.92, 0.88, 0.80]) {
        set_load(w, engine().usage(k));
    }
    // Worker 1 is over 0.9; the other three water-fill.
    assert_eq!(
        pick_booked(&policy, &workers, &prompt("next question"), 9),
        [3, 0, 3, 3]
    );
    // Every worker over the ceiling: all are within the (off) balance
    // threshold of the coldest, so the fewest in-flight requests wins.
    for w in &workers {
        set_load(w, engine().usage(0.95));
    }
    let _b = book(&workers[3], 1, 10);
    let picks = pick_booked(&policy, &workers, &prompt("again"), 3);
    assert_eq!(picks[3], 0, "{picks:?}");
}

#[test]
fn high_request_spread_with_low_kv_rebalances_by_count() {
    let workers = workers(4);
    let policy = kv_guarded();
    seed_affinity(&policy, &workers, 0);
    for w in &workers {
        set_load(w, engine().usage(0.05));
    }
    let _held: Vec<_> = [100, 30, 10, 20]
        .iter()
        .zip(&workers)
        .map(|(n, w)| book(w, *n, 10))
        .collect();
    // 100 - 10 > 64 and 100 > 1.5 * 10.
    assert_eq!(
        pick_n(&policy, &workers, &prompt("next question"), 10),
        [0, 0, 10, 0]
    );
}

#[test]
fn partial_snapshot_coverage_skips_the_kv_terms() {
    let workers = workers(4);
    let policy = kv_guarded();
    seed_affinity(&policy, &workers, 0);
    for (w, k) in workers.iter().zip([0.99, 0.1, 0.1]) {
        set_load(w, engine().usage(k));
    }
    // Worker 3 has no snapshot: (a) and (b) cannot be judged.
    assert_eq!(pick_n(&policy, &workers, &prompt("q1"), 10), [10, 0, 0, 0]);
    set_load(&workers[3], engine().waiting(0));
    assert_eq!(
        pick_n(&policy, &workers, &prompt("q2"), 10),
        [10, 0, 0, 0],
        "no k there"
    );
    set_load(&workers[3], engine().usage(0.2));
    let _b = book(&workers[2], 1, 10);
    // Now every k is known: worker 0 is over both guards; 1 and 3 (within
    // 0.3 of the coldest, no requests) share; 2 has one in flight.
    let picks = pick_n(&policy, &workers, &prompt("q3"), 10);
    assert_eq!((picks[0], picks[2]), (0, 0), "{picks:?}");
}

/// The local view with every engine snapshot hidden.
#[derive(Debug)]
struct Blind(LocalFleet);

impl FleetView for Blind {
    fn moment(&self, now: Instant) -> Moment {
        self.0.moment(now)
    }

    fn load(&self, worker: &Worker, at: &Moment) -> WorkerLoad {
        WorkerLoad {
            engine: None,
            figures: LoadFigures::default(),
            ..self.0.load(worker, at)
        }
    }
}

#[test]
fn defaults_are_exactly_the_count_only_guard() {
    use rand::{Rng, SeedableRng};
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let workers = workers(5);
    let seeing = with(CacheAwareConfig::default());
    let blind = with(CacheAwareConfig::default());
    let (local, hidden) = (fleet(), Blind(fleet()));
    let mut held = Vec::new();
    let mut picks = Vec::new();
    for step in 0..200 {
        // Distinct in-flight counts, so no choice is left to chance.
        let mut counts: Vec<usize> = (0..5).map(|i| i * 7 + rng.random_range(0..7)).collect();
        if step % 3 == 0 {
            counts[rng.random_range(0..5)] += 90;
        }
        held.clear();
        for (w, n) in workers.iter().zip(&counts) {
            held.push(book(w, *n, 10));
            // Extreme KV: full, empty, anything.
            set_load(
                w,
                engine().usage([1.0, 0.0, rng.random()][rng.random_range(0..3)]),
            );
        }
        let request = prompt(&format!("question {}", rng.random_range(0..6)));
        let a = seeing.select(&workers, &request, &local);
        let b = blind.select(&workers, &request, &hidden);
        assert_eq!(a, b, "step {step}");
        picks.push(a);
    }
    assert!(picks.iter().all(Option::is_some));
    let tree = (
        seeing.tree.lock().node_count(),
        blind.tree.lock().node_count(),
    );
    assert_eq!(tree.0, tree.1);
}

#[test]
fn eviction_bounds_the_tree_and_forgets_removed_workers() {
    let workers = workers(2);
    let policy = with(CacheAwareConfig {
        max_tree_size: 64,
        ..CacheAwareConfig::default()
    });
    seed_affinity(&policy, &workers, 0);
    let only = [workers[1].clone()];
    policy.select(&only, &text("a short prompt"), &fleet());
    let size = |i: usize| policy.tree.lock().size_of(workers[i].id());
    assert!(size(0) > 64);
    assert_eq!(size(1), 14);
    assert!(policy.evict_now().evicted_bytes > 0);
    assert!(size(0) <= 64);
    assert_eq!(size(1), 14, "under the bound: kept");
    policy.on_worker_removed(&workers[1]);
    assert_eq!(size(1), 14, "forgotten off the request path, not at once");
    policy.evict_now();
    assert_eq!(size(1), 0);
    assert_eq!(policy.tree.lock().node_count(), 1);
}

#[tokio::test]
async fn the_background_task_evicts_every_interval() {
    let workers = workers(1);
    let mut policy = with(CacheAwareConfig {
        max_tree_size: 10,
        ..CacheAwareConfig::default()
    });
    policy.eviction_interval = Duration::from_millis(50);
    seed_affinity(&policy, &workers, 0);
    assert!(policy.tree.lock().size_of(workers[0].id()) > 10);
    let task = tokio::spawn(policy.background_task().unwrap());
    for _ in 0..100 {
        tokio::time::sleep(Duration::from_millis(20)).await;
        if policy.tree.lock().size_of(workers[0].id()) <= 10 {
            break;
        }
    }
    assert_eq!(policy.tree.lock().size_of(workers[0].id()), 0);
    task.abort();
}
