use std::path::PathBuf;

use super::*;
use crate::kv_events::Tokenizers;
use crate::kv_events::index::Coverage;
use crate::kv_events::wire::{KvEvent, Stored};
use crate::policy::testkit::*;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tests/data/tokenizer/tokenizer.json")
}

fn policy() -> PrecisePrefixPolicy {
    PrecisePrefixPolicy::new(
        KvEventsConfig {
            kv_tokenizer: vec![fixture().display().to_string()],
            ..KvEventsConfig::default()
        },
        PrefixAffinityConfig::default(),
        LeastLoadConfig::default(),
    )
}

/// Lit workers with empty queues at 2000 tok/s and k = 0.1.
fn idle_workers(n: usize) -> Vec<Arc<Worker>> {
    let workers = workers(n);
    for w in &workers {
        set_load(w, engine().queued(0).throughput(2000.0).usage(0.1));
    }
    workers
}

fn prompt(tag: &str) -> String {
    let mut s = format!("{tag}: ");
    while s.len() < 2000 {
        s.push_str("the shared system prompt of a chat assistant; ");
    }
    s
}

/// Gives `worker` a trusted stream holding the first `blocks` blocks of
/// `text`'s tokens (as its engine's BlockStored would).
fn engine_caches(policy: &PrecisePrefixPolicy, worker: &Worker, text: &str, blocks: usize) {
    let ids = Tokenizers::load(&[(None, fixture())], &[])
        .unwrap()
        .encode(None, text)
        .unwrap();
    let size = policy.kv.block_size();
    let mut index = policy.kv.index().write().unwrap();
    let stream = index.add_stream(worker.id());
    index.set_coverage(stream, Coverage::Complete);
    index.apply(
        stream,
        &[KvEvent::Stored(Stored {
            block_hashes: (0..blocks as u64).map(|b| worker.id() * 1000 + b).collect(),
            parent: None,
            token_ids: Some(ids[..blocks * size].to_vec()),
            block_size: Some(size as u32),
            lora: None,
            on_gpu: true,
            main_group: true,
        })],
    );
}

/// A trusted, empty stream for each worker.
fn events_on(policy: &PrecisePrefixPolicy, workers: &[Arc<Worker>]) {
    let mut index = policy.kv.index().write().unwrap();
    for w in workers {
        let stream = index.add_stream(w.id());
        index.set_coverage(stream, Coverage::Complete);
    }
}

/// The policy and `n` idle workers, each with a trusted, empty stream.
fn idle_with_events(n: usize) -> (PrecisePrefixPolicy, Vec<Arc<Worker>>) {
    let p = policy();
    let workers = idle_workers(n);
    events_on(&p, &workers);
    (p, workers)
}

#[test]
fn the_worker_caching_the_longest_prefix_wins() {
    let (p, workers) = idle_with_events(4);
    let text = prompt("a");
    engine_caches(&p, &workers[1], &text, 10);
    engine_caches(&p, &workers[2], &text, 40);
    let request = crate::policy::testkit::text(&text);
    assert_eq!(pick_n(&p, &workers, &request, 50), vec![0, 0, 50, 0]);
}

#[test]
fn a_busy_cache_holder_loses_to_the_bound() {
    let (p, workers) = idle_with_events(4);
    let text = prompt("b");
    engine_caches(&p, &workers[2], &text, 40);
    // Worker 2 is far above the mean wait: the guard keeps the prefix off it.
    set_load(
        &workers[2],
        engine().queued(200_000).throughput(2000.0).usage(0.1),
    );
    let request = crate::policy::testkit::text(&text);
    let counts = pick_n(&p, &workers, &request, 60);
    assert_eq!(counts[2], 0, "{counts:?}");
}

#[test]
fn replicas_agree_and_uncached_prompts_do_not_herd_by_coin() {
    // Two replicas (separate policies, the same index content): the same
    // answer for the same prompt, including when nothing is cached.
    let (p, q) = (policy(), policy());
    let workers = idle_workers(6);
    events_on(&p, &workers);
    events_on(&q, &workers);
    let text = prompt("c");
    engine_caches(&p, &workers[4], &text, 3);
    engine_caches(&q, &workers[4], &text, 3);
    let request = crate::policy::testkit::text(&text);
    let fleet = fleet();
    for _ in 0..20 {
        assert_eq!(
            p.select(&workers, &request, &fleet),
            q.select(&workers, &request, &fleet)
        );
    }
}

#[test]
fn a_worker_without_events_falls_back_to_affinity_alone() {
    let p = policy();
    let workers = idle_workers(4);
    // Only workers 0 and 1 have event streams, and they cache nothing of
    // this prompt; 2 and 3 have none: the affinity home among 2 and 3
    // takes the prompt, every time.
    events_on(&p, &workers[..2]);
    let request = crate::policy::testkit::text(&prompt("d"));
    let counts = pick_n(&p, &workers, &request, 40);
    assert_eq!(counts[0] + counts[1], 0, "{counts:?}");
    assert!(counts[2] == 40 || counts[3] == 40, "{counts:?}");
}

#[test]
fn without_a_tokenizer_every_worker_is_placed_as_prefix_affinity_would() {
    let p = PrecisePrefixPolicy::new(
        KvEventsConfig::default(),
        PrefixAffinityConfig::default(),
        LeastLoadConfig::default(),
    );
    // Equally idle: every ask of one prompt goes to one home, and
    // different prompts find different homes.
    let workers = idle_workers(4);
    let homes: std::collections::BTreeSet<usize> = (0..8)
        .map(|k| {
            let request = crate::policy::testkit::text(&prompt(&format!("e{k}")));
            let counts = pick_n(&p, &workers, &request, 10);
            let home = counts.iter().position(|&c| c == 10);
            assert!(home.is_some(), "{counts:?}");
            home.unwrap_or_default()
        })
        .collect();
    assert!(homes.len() > 1, "{homes:?}");
    // A busy home loses to the load, as prefix_affinity's bound says.
    let workers = idle_workers(3);
    set_load(
        &workers[0],
        engine().queued(50_000).throughput(2000.0).usage(0.1),
    );
    set_load(
        &workers[1],
        engine().queued(10_000).throughput(2000.0).usage(0.1),
    );
    let request = crate::policy::testkit::text(&prompt("e"));
    assert_eq!(pick_n(&p, &workers, &request, 20), vec![0, 0, 20]);
}

#[test]
fn prompts_sharing_only_a_common_start_spread_over_the_engines_caching_it() {
    // Every engine caches the shared start (a system prompt) and is
    // equally idle: different prompts go to different engines (a burst
    // through several replicas does not herd onto one lowest score), and
    // each prompt to the same one every time it is asked.
    let (p, workers) = idle_with_events(4);
    let shared = prompt("shared");
    for w in &workers {
        engine_caches(&p, w, &shared, 20);
    }
    let fleet = fleet();
    let mut used = std::collections::HashSet::new();
    for n in 0..24 {
        let request =
            crate::policy::testkit::text(&format!("{shared} and then question {n} of a user"));
        let pick = p.select(&workers, &request, &fleet);
        assert_eq!(pick, p.select(&workers, &request, &fleet));
        used.insert(pick);
    }
    assert!(used.len() >= 3, "24 prompts went to {used:?}");
    // An engine caching more of one prompt still takes it.
    let deeper = format!("{shared} {}", prompt("deeper"));
    engine_caches(&p, &workers[3], &deeper, 60);
    let request = crate::policy::testkit::text(&deeper);
    assert_eq!(pick_n(&p, &workers, &request, 20), vec![0, 0, 0, 20]);
}

/// Each of `holders` caches the first 20 blocks of `text` and runs one
/// request (held while the bookings live).
fn holders_running_one(
    policy: &PrecisePrefixPolicy,
    holders: &[Arc<Worker>],
    text: &str,
) -> Vec<crate::workers::SlotBooking> {
    holders
        .iter()
        .flat_map(|w| {
            engine_caches(policy, w, text, 20);
            book(w, 1, 100)
        })
        .collect()
}

/// 20,000 queued tokens at 2,000 tok/s on each worker.
fn queue_ten_seconds(workers: &[Arc<Worker>]) {
    for w in workers {
        set_load(w, engine().queued(20_000).throughput(2000.0).usage(0.1));
    }
}

#[test]
fn an_idle_engine_takes_a_request_that_would_start_sooner_there() {
    // Workers 0 and 1 cache the prompt and each runs a request; worker 2
    // is idle and caches nothing. The cache weight alone would keep the
    // prompt on a holder whatever its queue (both are inside the guard).
    let (p, workers) = idle_with_events(3);
    let text = prompt("f");
    let request = crate::policy::testkit::text(&text);
    let held = holders_running_one(&p, &workers[..2], &text);
    // Short queues (0.05 s of booked work): the holders start it sooner
    // than a whole prefill on the idle engine, and keep it.
    let counts = pick_n(&p, &workers, &request, 20);
    assert_eq!(counts[2], 0, "{counts:?}");
    // 10 s of queue on each holder: the idle engine's whole prefill
    // (~0.25 s) comes first, so it takes the request.
    queue_ten_seconds(&workers[..2]);
    assert_eq!(pick_n(&p, &workers, &request, 20), vec![0, 0, 20]);
    drop(held);
}

#[test]
fn prompts_leaving_busy_holders_spread_over_the_idle_engines() {
    // Workers 0 and 1 cache a shared prefix and have 10 s of queue each;
    // 2, 3 and 4 are idle and cold. Every prompt starting with the prefix
    // leaves the holders for an idle engine, the same one each time it is
    // asked, and different prompts do not all take the same idle engine.
    let (p, workers) = idle_with_events(5);
    let shared = prompt("g");
    let held = holders_running_one(&p, &workers[..2], &shared);
    queue_ten_seconds(&workers[..2]);
    let fleet = fleet();
    let mut used = std::collections::BTreeSet::new();
    for n in 0..12 {
        let request = crate::policy::testkit::text(&format!("{shared} and then question {n}"));
        let pick = p.select(&workers, &request, &fleet);
        assert_eq!(pick, p.select(&workers, &request, &fleet));
        assert!(matches!(pick, Some(2..=4)), "question {n} went to {pick:?}");
        used.insert(pick);
    }
    assert!(used.len() >= 2, "12 prompts went to {used:?}");
    drop(held);
}
