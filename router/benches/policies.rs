//! One selection of each policy at 8, 64 and 1,024 workers with
//! 2,000-character prompts, against the local fleet view with every worker
//! polled and some requests in flight. Run with
//! `cargo bench -p shoal --bench policies`.

#![allow(missing_docs, clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use divan::{Bencher, black_box};
use shoal::config::{BreakerConfig, CacheAwareConfig, LeastLoadConfig, PrefixAffinityConfig};
use shoal::fleet::LocalFleet;
use shoal::policy::{
    CacheAwarePolicy, LeastLoadPolicy, LoadAwarePolicy, Policy, PowerOfTwoPolicy,
    PrefixAffinityPolicy, RandomPolicy, RoundRobinPolicy,
};
use shoal::request::RequestInfo;
use shoal::workers::SlotBooking;
use shoal::workers::Worker;
use shoal_proto::{EngineKind, EngineLoad, LoadSnapshot};

fn main() {
    divan::main();
}

const WORKERS: [usize; 3] = [8, 64, 1024];
const PROMPT_CHARS: usize = 2000;

/// Deterministic filler text: `len` characters from a seed.
fn filler(seed: u64, len: usize) -> String {
    const WORDS: [&str; 8] = [
        "shoal ", "router ", "fleet ", "token ", "cache ", "prefix ", "load ", "mesh ",
    ];
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let mut text = String::with_capacity(len + 8);
    while text.len() < len {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        text.push_str(WORDS[(state % 8) as usize]);
    }
    text.truncate(len);
    text
}

/// A 2,000-character prompt: one of 16 shared 1,200-character system
/// prompts followed by an 800-character user turn.
fn prompt(i: u64) -> RequestInfo {
    let mut text = filler(i % 16, 1200);
    text.push_str(&filler(1000 + i, PROMPT_CHARS - 1200));
    RequestInfo {
        prompt_tokens: (PROMPT_CHARS / 4) as u64,
        max_output_tokens: Some(256),
        stream: true,
        text: Some(text),
        ..RequestInfo::default()
    }
}

struct Fleet {
    workers: Vec<Arc<Worker>>,
    view: LocalFleet,
    requests: Vec<RequestInfo>,
    _held: Vec<SlotBooking>,
}

fn fleet(n: usize) -> Fleet {
    let workers: Vec<Arc<Worker>> = (0..n)
        .map(|i| {
            Arc::new(Worker::new(
                format!("http://engine-{i}:8000"),
                BreakerConfig::default(),
            ))
        })
        .collect();
    let mut held = Vec::new();
    for (i, w) in workers.iter().enumerate() {
        let i = i as u64;
        for _ in 0..i % 5 {
            held.push(w.ledger().book(500, 756));
        }
        w.store_snapshot(
            LoadSnapshot {
                source: EngineKind::Sglang,
                load: EngineLoad {
                    token_usage: Some((i * 37 % 90) as f64 / 100.0),
                    waiting_requests: Some(i * 7 % 20),
                    queued_tokens: Some(i * 131 % 8000),
                    running_requests: Some(i % 32),
                    gen_throughput: Some(1500.0 + (i % 7) as f64 * 100.0),
                },
                polled_at_unix_ms: 0,
                poller: "bench".into(),
            },
            std::time::Instant::now(),
        );
    }
    Fleet {
        workers,
        view: LocalFleet::new(Duration::from_secs(3600)),
        requests: (0..256).map(prompt).collect(),
        _held: held,
    }
}

fn run(bencher: Bencher, policy: &dyn Policy, fleet: &Fleet) {
    let mut i = 0usize;
    bencher.bench_local(|| {
        i = i.wrapping_add(1);
        let request = &fleet.requests[i % fleet.requests.len()];
        black_box(policy.select(black_box(&fleet.workers), request, &fleet.view))
    });
}

#[divan::bench(args = WORKERS)]
fn round_robin(bencher: Bencher, n: usize) {
    run(bencher, &RoundRobinPolicy::default(), &fleet(n));
}

#[divan::bench(args = WORKERS)]
fn random(bencher: Bencher, n: usize) {
    run(bencher, &RandomPolicy, &fleet(n));
}

#[divan::bench(args = WORKERS)]
fn power_of_two(bencher: Bencher, n: usize) {
    run(bencher, &PowerOfTwoPolicy, &fleet(n));
}

#[divan::bench(args = WORKERS)]
fn least_load(bencher: Bencher, n: usize) {
    run(
        bencher,
        &LeastLoadPolicy::new(LeastLoadConfig::default()),
        &fleet(n),
    );
}

#[divan::bench(args = WORKERS)]
fn load_aware(bencher: Bencher, n: usize) {
    run(bencher, &LoadAwarePolicy::new(128), &fleet(n));
}

/// Prefix matching against a warm tree: 4 distinct prompts per worker were
/// routed before (8 MB of text at 1,024 workers), and the measured prompts
/// are among them, so every selection walks and re-touches a 2,000-byte path.
#[divan::bench(args = WORKERS)]
fn cache_aware(bencher: Bencher, n: usize) {
    let fleet = fleet(n);
    let policy = CacheAwarePolicy::new(CacheAwareConfig::default());
    for i in 0..(4 * n as u64).max(256) {
        policy.select(&fleet.workers, &prompt(i), &fleet.view);
    }
    run(bencher, &policy, &fleet);
}

/// Rendezvous over every candidate under the load bound, after a warm-up
/// that has seen the 16 shared prefixes (every measured prompt takes the
/// affinity path: key hash, least_load scores, bound, weights).
#[divan::bench(args = WORKERS)]
fn prefix_affinity(bencher: Bencher, n: usize) {
    let fleet = fleet(n);
    let policy =
        PrefixAffinityPolicy::new(PrefixAffinityConfig::default(), LeastLoadConfig::default());
    for i in 0..256 {
        policy.select(&fleet.workers, &prompt(i), &fleet.view);
    }
    run(bencher, &policy, &fleet);
}

/// The same with a KV guard configured (every worker polled, so the KV
/// terms are evaluated on each selection).
#[divan::bench(args = WORKERS)]
fn cache_aware_kv_guard(bencher: Bencher, n: usize) {
    let fleet = fleet(n);
    let policy = CacheAwarePolicy::new(CacheAwareConfig {
        overload_token_usage_threshold: 0.95,
        balance_token_usage_threshold: 0.95,
        ..CacheAwareConfig::default()
    });
    for i in 0..(4 * n as u64).max(256) {
        policy.select(&fleet.workers, &prompt(i), &fleet.view);
    }
    run(bencher, &policy, &fleet);
}

/// One prefix-tree upkeep round with every worker over its byte bound: 40
/// prompts of 2,000 bytes routed per worker against a 20 KB bound. The
/// whole round is timed (before the upkeep stepped, the whole round was
/// one hold of the tree's lock); the figure selections feel now, the
/// longest single hold, is printed once before the samples.
#[divan::bench(args = [64, 1024], sample_count = 5, sample_size = 1)]
fn cache_aware_upkeep(bencher: Bencher, n: usize) {
    let warm = || {
        let fleet = fleet(n);
        let policy = CacheAwarePolicy::new(CacheAwareConfig {
            max_tree_size: 20_000,
            ..CacheAwareConfig::default()
        });
        for i in 0..(40 * n as u64) {
            policy.select(&fleet.workers, &prompt(i), &fleet.view);
        }
        policy
    };
    let upkeep = warm().evict_now();
    eprintln!(
        "cache_aware_upkeep n={n}: evicted {} bytes in {} lock holds, longest hold {:?}",
        upkeep.evicted_bytes, upkeep.lock_holds, upkeep.longest_hold
    );
    bencher
        .with_inputs(warm)
        .bench_local_values(|policy| policy.evict_now());
}

/// The floor under every load-reading policy: one `FleetView::load` of
/// every worker (ledger counters plus the snapshot cell).
#[divan::bench(args = WORKERS)]
fn fleet_view_every_worker(bencher: Bencher, n: usize) {
    use shoal::fleet::FleetView;
    let fleet = fleet(n);
    bencher.bench_local(|| {
        let at = fleet.view.moment(std::time::Instant::now());
        let mut sum = 0u64;
        for w in &fleet.workers {
            sum = sum.wrapping_add(fleet.view.load(w, &at).counts.dispatched_since_poll);
        }
        black_box(sum)
    });
}
