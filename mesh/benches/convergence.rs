#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Convergence lag and bandwidth of the load plane.
//!
//! Three nodes on loopback, 100 workers, steady churn: every node starts
//! `RATE` requests per second on random workers (prompt 200..2200 tokens,
//! first byte after 30..150 ms, done after 200..1500 ms). Meanwhile probes
//! book on a dedicated worker at node A and time until node B's fleet view
//! shows it (and again for the release). Prints lag p50/p99/max and the
//! load-plane bytes per second per peer pair.
//!
//! Run: `cargo bench -p shoal-mesh --bench convergence` (env `PROBES`,
//! `RATE`, `SYNC_MS`, `GAP_MS` override the defaults).

#[path = "../tests/common/mod.rs"]
mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use common::{Ca, cluster, wait_for_full_mesh};
use shoal_mesh::{SlotBooking, WorkerSlot};

const WORKERS: usize = 100;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo)
    }
}

/// Books and releases on `slots` at `rate` requests/s until `stop`.
fn churn(slots: Vec<WorkerSlot>, rate: u64, seed: u64, stop: Arc<AtomicBool>) {
    let mut rng = Rng(seed);
    let mut open: Vec<(Instant, Instant, SlotBooking, bool)> = Vec::new();
    let gap = Duration::from_micros(1_000_000 / rate.max(1));
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        while next <= now {
            let slot = &slots[rng.range(0, slots.len() as u64) as usize];
            let prompt = rng.range(200, 2200);
            let booking = slot.book(prompt, prompt + 256);
            let first = now + Duration::from_millis(rng.range(30, 150));
            let done = now + Duration::from_millis(rng.range(200, 1500));
            open.push((first, done, booking, false));
            next += gap;
        }
        for entry in open.iter_mut() {
            if !entry.3 && entry.0 <= now {
                entry.2.first_byte();
                entry.3 = true;
            }
        }
        open.retain(|e| e.1 > now);
        std::thread::sleep(Duration::from_millis(1));
    }
}

fn pct(sorted: &[f64], q: f64) -> f64 {
    let rank = ((sorted.len() as f64) * q).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn wait_visible(slot: &WorkerSlot, want: u64, t0: Instant) -> Option<f64> {
    while t0.elapsed() < Duration::from_secs(2) {
        if slot.fleet().counts.requests == want {
            return Some(t0.elapsed().as_secs_f64() * 1000.0);
        }
        std::thread::sleep(Duration::from_micros(100));
    }
    None
}

fn main() {
    let probes: usize = std::env::var("PROBES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    let rate: u64 = std::env::var("RATE")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(200);
    let sync_ms: u64 = std::env::var("SYNC_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let gap_ms: u64 = std::env::var("GAP_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(shoal_mesh::DEFAULT_PUSH_MIN_GAP_MS);
    println!("rate {rate}/s per node, sync {sync_ms} ms, push min gap {gap_ms} ms");
    let ca = Ca::new("bench-ca");
    // Production timings (gossip 200 ms, anti-entropy 5 s), SYNC_MS
    // heartbeat (20 ms default), GAP_MS between pushes on change.
    let nodes = cluster(&ca, 3, |c| {
        c.sync_interval = Duration::from_millis(sync_ms);
        c.push_min_gap = Duration::from_millis(gap_ms);
        c.anti_entropy_interval = Duration::from_secs(5);
        c.failure_detector = shoal_mesh::FailureDetectorSettings::default();
        c.link_idle_timeout = Duration::from_secs(3);
        c.link_keepalive = Duration::from_millis(500);
    });
    let refs: Vec<&common::Node> = nodes.iter().collect();
    assert!(
        wait_for_full_mesh(&refs, Duration::from_secs(10)),
        "mesh did not form"
    );
    let keys: Vec<String> = (0..WORKERS)
        .map(|i| format!("http://10.9.{}.{}:8000", i / 200, i % 200))
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let mut threads = Vec::new();
    for (n, node) in nodes.iter().enumerate() {
        let slots: Vec<WorkerSlot> = keys.iter().map(|k| node.mesh().worker(k)).collect();
        let stop = stop.clone();
        threads.push(std::thread::spawn(move || {
            churn(slots, rate, 0x1234_5678 + n as u64, stop)
        }));
    }
    std::thread::sleep(Duration::from_secs(2)); // reach steady state
    let before: Vec<_> = nodes.iter().map(|n| n.mesh().status().traffic).collect();
    let started = Instant::now();
    let probe_a = nodes[0].mesh().worker("http://probe:1");
    let probe_b = nodes[1].mesh().worker("http://probe:1");
    let mut rng = Rng(99);
    let (mut book_lag, mut release_lag, mut lost) = (Vec::new(), Vec::new(), 0);
    for _ in 0..probes {
        std::thread::sleep(Duration::from_millis(rng.range(5, 40)));
        let t0 = Instant::now();
        let booking = probe_a.book(100, 100);
        match wait_visible(&probe_b, 1, t0) {
            Some(ms) => book_lag.push(ms),
            None => lost += 1,
        }
        std::thread::sleep(Duration::from_millis(rng.range(5, 40)));
        let t0 = Instant::now();
        drop(booking);
        match wait_visible(&probe_b, 0, t0) {
            Some(ms) => release_lag.push(ms),
            None => lost += 1,
        }
    }
    let secs = started.elapsed().as_secs_f64();
    let after: Vec<_> = nodes.iter().map(|n| n.mesh().status().traffic).collect();
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        t.join().unwrap();
    }
    let payload: u64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.bytes_sent - b.bytes_sent)
        .sum();
    let wire: u64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.link_wire_bytes - b.link_wire_bytes)
        .sum();
    let gossip: u64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.gossip_bytes_sent - b.gossip_bytes_sent)
        .sum();
    let frames: u64 = before
        .iter()
        .zip(&after)
        .map(|(b, a)| a.frames_sent - b.frames_sent)
        .sum();
    let pairs = 3.0; // 3 nodes, full mesh
    book_lag.sort_by(f64::total_cmp);
    release_lag.sort_by(f64::total_cmp);
    let mut all: Vec<f64> = book_lag.iter().chain(&release_lag).copied().collect();
    all.sort_by(f64::total_cmp);
    println!(
        "mesh convergence benchmark: 3 nodes, {WORKERS} workers, {rate} req/s per node, sync {sync_ms} ms, {secs:.1} s"
    );
    println!(
        "  booking visible at B: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms  (n={})",
        pct(&book_lag, 0.5),
        pct(&book_lag, 0.99),
        book_lag.last().unwrap(),
        book_lag.len()
    );
    println!(
        "  release visible at B: p50 {:.1} ms  p99 {:.1} ms  max {:.1} ms  (n={})",
        pct(&release_lag, 0.5),
        pct(&release_lag, 0.99),
        release_lag.last().unwrap(),
        release_lag.len()
    );
    println!(
        "  all probes:           p50 {:.1} ms  p99 {:.1} ms  lost {lost}",
        pct(&all, 0.5),
        pct(&all, 0.99)
    );
    println!(
        "  per peer pair (both directions): payload {:.1} KB/s, QUIC wire {:.1} KB/s, frames {:.0}/s",
        payload as f64 / pairs / secs / 1000.0,
        wire as f64 / pairs / secs / 1000.0,
        frames as f64 / pairs / secs
    );
    println!(
        "  gossip per node: {:.1} KB/s sent",
        gossip as f64 / 3.0 / secs / 1000.0
    );
    let own_lag = nodes[1].mesh().status().traffic;
    println!(
        "  node B convergence_lag histogram (upper bound): p50 {:?} ms p99 {:?} ms",
        own_lag.convergence_lag_p50_ms, own_lag.convergence_lag_p99_ms
    );
}
