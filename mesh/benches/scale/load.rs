//! The simulated traffic: request churn on every replica's own slots, and
//! the poll owners' engine snapshots.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use shoal_mesh::proto::{EngineKind, EngineLoad};
use shoal_mesh::{Mesh, SlotBooking, WorkerSlot};

/// A xorshift generator: deterministic per seed, no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next() % (hi - lo).max(1)
    }
}

/// The churn thread's handle: stop it, and read how much it did and the
/// CPU it used (the harness's own cost, not the mesh's).
pub struct Churn {
    stop: Arc<AtomicBool>,
    /// Bookings made so far, every replica together.
    pub booked: Arc<AtomicU64>,
    /// The churn thread's CPU so far, µs.
    pub cpu_us: Arc<AtomicU64>,
    handle: Option<std::thread::JoinHandle<()>>,
}

impl Churn {
    /// Books `rate` requests per second on each replica's `slots` (one
    /// list per replica): a random worker, prompt 200..2200 tokens, first
    /// byte after 30..150 ms, done after 200..1500 ms — the lifecycle the
    /// router drives (book, first byte, release: three changes each).
    pub fn start(slots: Vec<Vec<WorkerSlot>>, rate: u64) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let booked = Arc::new(AtomicU64::new(0));
        let cpu_us = Arc::new(AtomicU64::new(0));
        let handle = {
            let (stop, booked, cpu_us) = (stop.clone(), booked.clone(), cpu_us.clone());
            std::thread::Builder::new()
                .name("scale-churn".into())
                .spawn(move || churn(&slots, rate, &stop, &booked, &cpu_us))
                .expect("spawn churn")
        };
        Self {
            stop,
            booked,
            cpu_us,
            handle: Some(handle),
        }
    }

    /// Stops booking (open bookings are released as the thread ends).
    pub fn stop(mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

fn churn(
    slots: &[Vec<WorkerSlot>],
    rate: u64,
    stop: &AtomicBool,
    booked: &AtomicU64,
    cpu_us: &AtomicU64,
) {
    let mut rng = Rng(0x5ca1_ab1e);
    let mut open: HashMap<u64, SlotBooking> = HashMap::new();
    let mut firsts: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut dones: BinaryHeap<Reverse<(Instant, u64)>> = BinaryHeap::new();
    let mut next_id = 0u64;
    let started = Instant::now();
    let mut made = vec![0u64; slots.len()];
    while !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        let due = (now - started).as_secs_f64() * rate as f64;
        for (replica, workers) in slots.iter().enumerate() {
            while (made[replica] as f64) < due && !workers.is_empty() {
                made[replica] += 1;
                let slot = &workers[rng.range(0, workers.len() as u64) as usize];
                let prompt = rng.range(200, 2200);
                let booking = slot.book(prompt, prompt + 256);
                next_id += 1;
                open.insert(next_id, booking);
                firsts.push(Reverse((
                    now + Duration::from_millis(rng.range(30, 150)),
                    next_id,
                )));
                dones.push(Reverse((
                    now + Duration::from_millis(rng.range(200, 1500)),
                    next_id,
                )));
                booked.fetch_add(1, Ordering::Relaxed);
            }
        }
        while let Some(Reverse((at, id))) = firsts.peek().copied() {
            if at > now {
                break;
            }
            firsts.pop();
            if let Some(b) = open.get_mut(&id) {
                b.first_byte();
            }
        }
        while let Some(Reverse((at, id))) = dones.peek().copied() {
            if at > now {
                break;
            }
            dones.pop();
            open.remove(&id);
        }
        cpu_us.store(
            crate::usage::thread_cpu().as_micros() as u64,
            Ordering::Relaxed,
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// A plausible vLLM snapshot (the values do not matter to the mesh, the
/// number and size of entries do).
fn engine_load(rng: &mut Rng) -> EngineLoad {
    EngineLoad {
        token_usage: Some(rng.range(0, 1000) as f64 / 1000.0),
        waiting_requests: Some(rng.range(0, 20)),
        queued_tokens: Some(rng.range(0, 40_000)),
        running_requests: Some(rng.range(0, 64)),
        gen_throughput: Some(500.0 + rng.range(0, 2000) as f64),
    }
}

/// Every `poll` interval, each replica publishes a snapshot of every
/// worker it owns (the router's poll loop, with the engine's answer
/// made up), spread evenly over the interval. Runs until `stop`.
pub fn snapshots(meshes: &[&Mesh], slots: &[Vec<WorkerSlot>], poll: Duration, stop: &AtomicBool) {
    const TICK: Duration = Duration::from_millis(10);
    let phases = (poll.as_millis() / TICK.as_millis()).max(1) as usize;
    let mut rng = Rng(0xfeed);
    let mut phase = 0usize;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        for (mesh, workers) in meshes.iter().zip(slots) {
            for slot in workers.iter().skip(phase).step_by(phases) {
                if mesh.owns(slot.key()) {
                    let stamp = slot.poll_stamp();
                    mesh.publish_snapshot(slot, &stamp, EngineKind::Vllm, engine_load(&mut rng));
                }
            }
        }
        phase = (phase + 1) % phases;
        next += TICK;
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}
