use super::*;
use crate::policy::testkit::*;
use crate::workers::{SlotBooking, url_hash};

fn policy() -> PrefixAffinityPolicy {
    PrefixAffinityPolicy::new(PrefixAffinityConfig::default(), LeastLoadConfig::default())
}

/// A prompt of about 1.1 KiB (past the default 16-block key) that starts
/// with `tag`, so prompts with different tags have different keys.
fn long_prompt(tag: usize) -> RequestInfo {
    let mut s = format!("prompt {tag}: ");
    while s.len() < 1100 {
        s.push_str("shared system prompt text; ");
    }
    text(&s)
}

/// Lit workers with empty queues at 2000 tok/s and k = 0.1.
fn idle_workers(n: usize) -> Vec<Arc<Worker>> {
    let workers = workers(n);
    for w in &workers {
        set_load(w, engine().queued(0).throughput(2000.0).usage(0.1));
    }
    workers
}

/// The candidate with the highest rendezvous weight for `request`'s key.
fn home(workers: &[Arc<Worker>], request: &RequestInfo) -> usize {
    let text = request.text.as_deref().unwrap_or_default().as_bytes();
    let key = affinity_key(text, PrefixAffinityConfig::default().prefix_affinity_blocks).unwrap();
    (0..workers.len())
        .max_by_key(|&i| rendezvous_weight(key, workers[i].url_hash()))
        .unwrap()
}

#[test]
fn the_key_and_the_weights_are_pinned() {
    // Known answers computed outside Rust (Python, the same arithmetic):
    // a change to either hash moves every replica's placements, so it must
    // fail here first.
    let text = "The quick brown fox jumps over the lazy dog. ".repeat(3);
    assert_eq!(text.len(), 135);
    let key = affinity_key(text.as_bytes(), 2);
    assert_eq!(key, Some(0xc6bb_1552_5045_a2cc));
    assert_eq!(affinity_key(text.as_bytes(), 3), None, "135 < 3 blocks");
    assert_eq!(affinity_key(text.as_bytes(), usize::MAX), None);
    let url = url_hash("http://127.0.0.1:8000");
    assert_eq!(url, 0x754e_0da3_b063_885a);
    assert_eq!(
        rendezvous_weight(0xc6bb_1552_5045_a2cc, url),
        0xcd99_c0d3_a0a5_6117
    );
}

#[test]
fn replicas_with_the_same_view_pick_the_same_worker_for_the_same_prompt() {
    let workers = idle_workers(8);
    // Three replicas: separate policies (separate recent-key tables), one view.
    let replicas = [policy(), policy(), policy()];
    let mut homes = std::collections::BTreeSet::new();
    for tag in 0..24 {
        let request = long_prompt(tag);
        for replica in &replicas {
            // The first sight of a key only marks it as shared.
            replica.select(&workers, &request, &fleet());
        }
        let picks = replicas
            .each_ref()
            .map(|r| r.select(&workers, &request, &fleet()));
        let expected = home(&workers, &request);
        assert_eq!(picks, [Some(expected); 3], "prompt {tag}");
        homes.insert(expected);
    }
    assert!(homes.len() >= 5, "24 prefixes over 8 workers: {homes:?}");
}

/// Two replicas whose recent-key tables are joined as the mesh joins
/// them: each key new on one is recorded on the other.
fn joined_pair() -> [PrefixAffinityPolicy; 2] {
    let pair = [policy(), policy()];
    for (from, to) in [(0, 1), (1, 0)] {
        let peer = pair[to].sightings().unwrap();
        let table = pair[from].sightings().unwrap();
        assert!(table.share_with(Box::new(move |key| peer.absorb(&[key]))));
    }
    pair
}

#[test]
fn a_prompt_seen_on_one_replica_has_affinity_on_its_peers_next_time() {
    let workers = idle_workers(8);
    // Worker 0 is the least loaded, so a prompt without affinity goes there.
    for w in &workers[1..] {
        set_load(w, engine().queued(500).throughput(2000.0).usage(0.1));
    }
    let joined = joined_pair();
    let apart = [policy(), policy()];
    let mut away_from_least = 0;
    for tag in 0..16 {
        let request = long_prompt(tag);
        let expected = home(&workers, &request);
        // The first sighting, on replica 0: least_load's pick.
        assert_eq!(joined[0].select(&workers, &request, &fleet()), Some(0));
        assert_eq!(apart[0].select(&workers, &request, &fleet()), Some(0));
        // The second request arrives at replica 1: with shared sightings
        // it has affinity there, as it would on one router.
        assert_eq!(
            joined[1].select(&workers, &request, &fleet()),
            Some(expected),
            "prompt {tag}"
        );
        // Without them replica 1 sees the prompt for the first time.
        assert_eq!(apart[1].select(&workers, &request, &fleet()), Some(0));
        if expected != 0 {
            away_from_least += 1;
        }
    }
    assert!(
        away_from_least >= 10,
        "most homes are not worker 0: {away_from_least}"
    );
}

#[test]
fn a_hot_prefix_overflows_in_key_order_within_the_bound() {
    let workers = idle_workers(4);
    let request = long_prompt(7);
    let first = home(&workers, &request);
    let p = policy();
    let mut held: Vec<SlotBooking> = Vec::new();
    let mut picks = [0u64; 4];
    for _ in 0..200 {
        let i = p.select(&workers, &request, &fleet()).unwrap();
        let work = p.token_work(&request);
        held.push(workers[i].ledger().book(request.prompt_tokens, work));
        picks[i] += 1;
        // Equal requests on idle engines: wait is proportional to the
        // count, and a pick happens only while its worker is within
        // (1 + 0.25) × the mean + one request, so after booking it is
        // within one more.
        let total: u64 = picks.iter().sum();
        let mean = total as f64 / 4.0;
        let max = *picks.iter().max().unwrap() as f64;
        assert!(max <= 1.25 * mean + 2.0 + 1e-9, "{picks:?}");
    }
    assert_eq!(
        picks[first],
        *picks.iter().max().unwrap(),
        "the first choice keeps the most (ties at capacity): {picks:?}"
    );
    assert!(picks.iter().all(|&n| n > 0), "{picks:?}");

    // Without a bound (a huge ε) the same traffic piles onto one worker:
    // the bound is what spreads it.
    let unbounded = PrefixAffinityPolicy::new(
        PrefixAffinityConfig {
            prefix_affinity_epsilon: 1e12,
            ..PrefixAffinityConfig::default()
        },
        LeastLoadConfig::default(),
    );
    let fresh = idle_workers(4);
    unbounded.select(&fresh, &request, &fleet());
    let mut held_too = Vec::new();
    let mut piled = [0u64; 4];
    for _ in 0..50 {
        let i = unbounded.select(&fresh, &request, &fleet()).unwrap();
        held_too.push(fresh[i].ledger().book(request.prompt_tokens, 1000));
        piled[i] += 1;
    }
    assert_eq!(piled.iter().filter(|&&n| n > 0).count(), 1, "{piled:?}");
}

#[test]
fn a_hot_prefix_spreads_by_running_requests_even_while_its_queue_is_empty() {
    // Every request hits the cache and starts at once: each engine's
    // queue is empty at every poll and nothing is pending prefill, so the
    // wait bound alone would keep the prefix on its home for ever while
    // its running set (and KV) grows. The in-flight count bound spreads it.
    let workers = idle_workers(4);
    let request = long_prompt(3);
    let first = home(&workers, &request);
    let p = policy();
    p.select(&workers, &request, &fleet());
    let mut running: Vec<SlotBooking> = Vec::new();
    let mut picks = [0u64; 4];
    for _ in 0..100 {
        let i = p.select(&workers, &request, &fleet()).unwrap();
        let mut booking = workers[i]
            .ledger()
            .book(request.prompt_tokens, p.token_work(&request));
        booking.first_byte();
        running.push(booking);
        picks[i] += 1;
        for w in &workers {
            set_load(w, engine().queued(0).throughput(2000.0).usage(0.1));
        }
        let total: u64 = picks.iter().sum();
        let capacity = (1.25 * total as f64 / 4.0).ceil() as u64;
        assert!(picks.iter().all(|&n| n <= capacity), "{picks:?}");
    }
    assert_eq!(picks[first], *picks.iter().max().unwrap(), "{picks:?}");
    // MTZ fills the key's order: the first choices sit at capacity
    // (⌈1.25 × 100 / 4⌉ = 32) and the rest overflows to the next.
    let mut sorted = picks;
    sorted.sort_unstable();
    assert!(sorted[1..].iter().all(|&n| n >= 30), "{picks:?}");
}

#[test]
fn the_load_bound_is_mtz_capacity_beside_the_wait_bound() {
    let scores = [1.0, 2.0, 3.0, f64::INFINITY];
    let requests = [10, 0, 5, 4];
    let bound = LoadBound::over(&scores, &requests, 0.5, 0.25).unwrap();
    // Mean of the finite scores 2.0: 1.25 × 2.0 + 0.5.
    assert!((bound.wait - 3.0).abs() < 1e-12, "{bound:?}");
    // ⌈1.25 × (19 + 1) / 4⌉ = ⌈6.25⌉.
    assert_eq!(bound.requests, 7);
    assert!(bound.admits(3.0, 6));
    assert!(!bound.admits(3.0, 7), "at capacity");
    assert!(!bound.admits(3.1, 0), "past the wait bound");
    let dark = [f64::NAN, f64::INFINITY];
    assert_eq!(LoadBound::over(&dark, &[0, 0], 0.0, 0.25), None);
}

#[test]
fn unseen_and_short_prompts_go_to_the_least_wait() {
    let workers = workers(3);
    for (w, queued) in workers.iter().zip([8000, 2000, 4000]) {
        set_load(w, engine().queued(queued).throughput(2000.0).usage(0.1));
    }
    let p = policy();
    // Every prompt new: no evidence of sharing, so least_load's argmin.
    for tag in 0..20 {
        assert_eq!(p.select(&workers, &long_prompt(tag), &fleet()), Some(1));
    }
    // Shorter than the key: least_load's argmin however often it repeats.
    let short = text("a short prompt that repeats");
    assert_eq!(pick_n(&p, &workers, &short, 20), [0, 20, 0]);
}

#[test]
fn prefixes_whose_home_is_overloaded_spread_instead_of_herding() {
    // Worker 0 has 20 s of queue; the others are idle. Every prefix whose
    // first choice is worker 0 goes to its own second choice, so the
    // overflow spreads over the rest instead of all going to one
    // "coldest" worker.
    let workers = idle_workers(6);
    set_load(
        &workers[0],
        engine().queued(40_000).throughput(2000.0).usage(0.1),
    );
    let p = policy();
    let mut landed = std::collections::BTreeSet::new();
    let mut overflowed = 0;
    for tag in 0..200 {
        let request = long_prompt(tag);
        if home(&workers, &request) != 0 {
            continue;
        }
        overflowed += 1;
        p.select(&workers, &request, &fleet());
        let i = p.select(&workers, &request, &fleet()).unwrap();
        assert_ne!(i, 0, "an overloaded home keeps no affinity");
        landed.insert(i);
    }
    assert!(overflowed >= 10, "{overflowed}");
    assert!(landed.len() >= 4, "overflow spread over {landed:?}");
}

#[test]
fn the_policy_books_what_least_load_books() {
    let p = policy();
    let request = RequestInfo {
        max_output_tokens: Some(50),
        ..RequestInfo::default()
    };
    let least = LeastLoadPolicy::new(LeastLoadConfig::default());
    assert_eq!(p.token_work(&request), least.token_work(&request));
    assert_eq!(
        p.prompt_text_limit(),
        Some(PrefixAffinityConfig::default().prefix_affinity_blocks * BLOCK_BYTES),
        "the key's bytes, no more"
    );
}
