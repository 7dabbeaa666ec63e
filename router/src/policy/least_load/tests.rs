use super::*;
use crate::policy::testkit::*;

fn policy() -> LeastLoadPolicy {
    LeastLoadPolicy::new(LeastLoadConfig::default())
}

#[test]
fn routes_by_queued_token_work() {
    let workers = workers(3);
    for (w, queued) in workers.iter().zip([8000, 2000, 4000]) {
        set_load(w, engine().queued(queued).throughput(2000.0).usage(0.1));
    }
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [0, 20, 0]);
}

#[test]
fn normalises_by_throughput() {
    let workers = workers(2);
    // 4000 tokens at 4000 tok/s (1 s) beats 3000 tokens at 1000 tok/s (3 s).
    set_load(&workers[0], engine().queued(4000).throughput(4000.0));
    set_load(&workers[1], engine().queued(3000).throughput(1000.0));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [20, 0]);
}

#[test]
fn a_low_reported_throughput_is_floored() {
    // An idle engine decoding one short answer reports 5 tok/s: 1,000
    // queued tokens would read as 200 s. At the 200 tok/s floor they are
    // 5 s, under the busy engine's 20,000 tokens at 2,000 tok/s (10 s).
    let workers = workers(2);
    set_load(&workers[0], engine().queued(1000).throughput(5.0));
    set_load(&workers[1], engine().queued(20_000).throughput(2000.0));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [20, 0]);
    let as_reported = LeastLoadPolicy::new(LeastLoadConfig {
        least_load_min_throughput: 0.0,
        ..LeastLoadConfig::default()
    });
    assert_eq!(pick_n(&as_reported, &workers, &plain(), 20), [0, 20]);
}

#[test]
fn kv_barrier_steers_off_a_near_full_worker() {
    let workers = workers(2);
    // Empty queue but k = 0.98: 0.15 * 0.98/0.02 = 7.35 s. The other: 2 s + 0.15 s.
    set_load(&workers[0], engine().queued(0).usage(0.98));
    set_load(&workers[1], engine().queued(4000).usage(0.5));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [0, 20]);
    let p = policy();
    assert!((p.kv_barrier(0.98) - 7.35).abs() < 1e-9);
    assert!(p.kv_barrier(1.0).is_finite(), "k is clamped to 0.999");
    let no_barrier = LeastLoadPolicy::new(LeastLoadConfig {
        least_load_kv_pressure_weight: 0.0,
        ..LeastLoadConfig::default()
    });
    assert_eq!(pick_n(&no_barrier, &workers, &plain(), 20), [20, 0]);
}

#[test]
fn a_worker_missing_k_is_not_preferred_among_near_full_ones() {
    // Three near-full workers report k, the fourth reports none; equal
    // queues. The one without k is charged the hottest barrier (k = 0.97),
    // so the coolest reporting worker wins every time. (Switching the
    // barrier off for all, as before, made this a four-way coin toss.)
    let workers = workers(4);
    for (w, k) in workers.iter().zip([0.95, 0.96, 0.97]) {
        set_load(w, engine().queued(1000).usage(k));
    }
    set_load(&workers[3], engine().queued(1000));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [20, 0, 0, 0]);
}

#[test]
fn a_near_full_worker_is_avoided_when_another_lacks_k() {
    // Worker 0: empty queue but k = 0.99 (barrier 14.85 s). Worker 1: 1 s
    // of queue at k = 0.1. Worker 2 reports no k (2 s of queue). One
    // missing reading must not switch KV protection off: worker 1 wins.
    let workers = workers(3);
    set_load(&workers[0], engine().queued(0).usage(0.99));
    set_load(&workers[1], engine().queued(2000).usage(0.1));
    set_load(&workers[2], engine().queued(4000));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [0, 20, 0]);
    // The same with the third worker dark (no snapshot at all, 1,000
    // tokens in flight: its drain-time estimate plus the imputed barrier).
    let workers = workers_with_dark_third();
    let _held = book(&workers[2], 1, 1000);
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [0, 20, 0]);
}

fn workers_with_dark_third() -> Vec<Arc<Worker>> {
    let workers = workers(3);
    set_load(&workers[0], engine().queued(0).usage(0.99));
    set_load(&workers[1], engine().queued(2000).usage(0.1));
    workers
}

#[test]
fn without_k_anywhere_the_barrier_is_zero_for_all() {
    let workers = workers(2);
    set_load(&workers[0], engine().queued(0));
    set_load(&workers[1], engine().queued(1000));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [20, 0]);
    // A reporting worker is never worse off than one that reports nothing
    // at the same queue: the missing one pays the hottest k, its own.
    set_load(&workers[1], engine().queued(0).usage(0.5));
    let picks = pick_n(&policy(), &workers, &plain(), 400);
    assert!(
        picks[0] > 100 && picks[1] > 100,
        "a tie, broken at random: {picks:?}"
    );
}

#[test]
fn water_fills_within_one_poll_interval() {
    let workers = workers(4);
    for w in &workers {
        set_load(w, engine().queued(0).throughput(2000.0).usage(0.2));
    }
    set_load(
        &workers[3],
        engine().queued(2000).throughput(2000.0).usage(0.2),
    );
    let policy = policy();
    let fleet = fleet();
    let mut held = Vec::new();
    for _ in 0..10 {
        let i = policy.select(&workers, &plain(), &fleet).unwrap();
        held.push(workers[i].ledger().book(1000, 1000));
    }
    let dispatched: Vec<u64> = workers
        .iter()
        .map(|w| w.ledger().counts().dispatched_since_poll)
        .collect();
    // Worker 3 starts 2000 tokens behind; each booking is seen at once, so
    // the others fill up to its level before it gets any.
    assert_eq!(dispatched, [3000, 3000, 3000, 1000]);
}

#[test]
fn a_fresh_poll_resets_the_correction() {
    let workers = workers(2);
    for w in &workers {
        set_load(w, engine().queued(0));
    }
    let mut a = book(&workers[0], 1, 5000);
    let _b = book(&workers[1], 1, 1000);
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 10]);
    // The request started (its first byte came back) and the engine
    // reports again: what was dispatched is now in its numbers.
    a[0].first_byte();
    set_load(&workers[0], engine().queued(0));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [10, 0]);
}

#[test]
fn cold_start_is_join_shortest_queue_on_requests() {
    let workers = workers(3);
    let _a = book(&workers[0], 2, 10);
    let _c = book(&workers[2], 1, 50_000);
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 10, 0]);
    let _b = book(&workers[1], 3, 1);
    assert_eq!(
        pick_n(&policy(), &workers, &plain(), 10),
        [0, 0, 10],
        "requests, not tokens"
    );
}

#[test]
fn a_missing_snapshot_counts_in_flight_tokens_at_the_fleet_mean_throughput() {
    let workers = workers(3);
    set_load(&workers[0], engine().queued(3000).throughput(1000.0)); // 3 s
    set_load(&workers[1], engine().queued(1000).throughput(3000.0)); // 0.33 s
    let _dark = book(&workers[2], 1, 2000); // 2000 / mean(1000, 3000) = 1 s
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 10, 0]);
    set_load(&workers[1], engine().queued(6000).throughput(3000.0)); // 2 s
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 0, 10]);
    // A snapshot with no signal at all is no snapshot.
    set_load(&workers[0], engine());
    let _more = book(&workers[0], 1, 5000); // 5000 / 3000 tok/s > 1 s
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 0, 10]);
}

#[test]
fn zero_or_nan_throughput_falls_back_to_the_default() {
    let workers = workers(3);
    set_load(&workers[0], engine().queued(1000).throughput(f64::NAN)); // 0.5 s
    set_load(&workers[1], engine().queued(1500).throughput(0.0)); // 0.75 s
    set_load(&workers[2], engine().queued(300).throughput(500.0)); // 0.6 s
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [10, 0, 0]);
    set_load(&workers[0], engine().queued(1000).throughput(f64::INFINITY));
    set_load(&workers[1], engine().queued(900).throughput(-3.0)); // 0.45 s
    assert_eq!(pick_n(&policy(), &workers, &plain(), 10), [0, 10, 0]);
}

#[test]
fn ties_break_at_random() {
    let workers = workers(4);
    for w in &workers {
        set_load(w, engine().queued(100).usage(0.3));
    }
    let counts = pick_n(&policy(), &workers, &plain(), 400);
    assert!(counts.iter().all(|&n| n > 50), "{counts:?}");
}

#[test]
fn a_request_without_an_estimate_books_the_mean_prefill() {
    let p = policy();
    let unknown = RequestInfo {
        max_output_tokens: Some(16),
        ..RequestInfo::default()
    };
    assert_eq!(p.token_work(&unknown), 1024 + 16);
    assert_eq!(p.token_work(&plain()), 100);
}

#[test]
fn a_queue_the_engine_does_not_report_counts_through_pending_prefill() {
    // vLLM-like: no queued-token figure. Worker 0 holds 6,000 prompt
    // tokens routed before its last poll that have not started (their
    // first byte has not come back); the poll reset its work since the
    // poll, so only the live pending prefill shows them.
    let workers = workers(2);
    let held = book(&workers[0], 3, 2000);
    for w in &workers {
        set_load(w, engine().throughput(2000.0).usage(0.2));
    }
    assert_eq!(workers[0].ledger().counts().dispatched_since_poll, 0);
    assert_eq!(workers[0].ledger().counts().pending_prefill, 6000);
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [0, 20]);
    // Once their first bytes came back they no longer wait: even again.
    let mut held = held;
    for booking in &mut held {
        booking.first_byte();
    }
    let picks = pick_n(&policy(), &workers, &plain(), 200);
    assert!(
        picks[0] > 40 && picks[1] > 40,
        "ties broken at random: {picks:?}"
    );
}

#[test]
fn a_polled_queue_and_the_live_estimate_take_the_larger() {
    let workers = workers(2);
    // Worker 0 reports 4,000 queued tokens; worker 1 reports 1,000 but has
    // 5,000 routed and not started (a poll older than those bookings would
    // under-count them; the live figure does not).
    set_load(&workers[0], engine().queued(4000).throughput(2000.0));
    let _held = book(&workers[1], 1, 5000);
    set_load(&workers[1], engine().queued(1000).throughput(2000.0));
    assert_eq!(pick_n(&policy(), &workers, &plain(), 20), [20, 0]);
}

#[test]
fn waiting_requests_count_at_the_learned_mean_prompt() {
    let workers = workers(2);
    // No token figure: 3 waiting requests vs 1, at the mean prompt.
    set_load(&workers[0], engine().waiting(3).throughput(2000.0));
    set_load(&workers[1], engine().waiting(1).throughput(2000.0));
    let policy = policy();
    assert_eq!(pick_n(&policy, &workers, &plain(), 20), [0, 20]);
    // The mean starts at --least-load-mean-prefill-tokens and learns from
    // the prompts this replica books.
    let start = policy.mean_prompt_tokens();
    assert_eq!(
        start,
        LeastLoadConfig::default().least_load_mean_prefill_tokens as f64
    );
    let big = RequestInfo {
        prompt_tokens: 100_000,
        ..RequestInfo::default()
    };
    for _ in 0..800 {
        policy.token_work(&big);
    }
    assert!(policy.mean_prompt_tokens() > start * 10.0);
}

#[test]
fn the_mean_prompt_is_the_plain_mean_of_the_first_bookings() {
    // Replicas that each book 1/N of the traffic must agree on the mean
    // soon: the first booking replaces the configured guess, the first 64
    // are averaged plainly, whatever the sampling after that.
    let policy = policy();
    let sized = |prompt_tokens| RequestInfo {
        prompt_tokens,
        ..RequestInfo::default()
    };
    policy.token_work(&sized(200));
    assert!((policy.mean_prompt_tokens() - 200.0).abs() < 1e-9);
    for p in [6000, 200, 200, 200] {
        policy.token_work(&sized(p));
    }
    // (200 + 6000 + 3 × 200) / 5
    assert!((policy.mean_prompt_tokens() - 1360.0).abs() < 1e-6);
    // A request without a measured prompt does not move it.
    policy.token_work(&RequestInfo::default());
    assert!((policy.mean_prompt_tokens() - 1360.0).abs() < 1e-6);
}
