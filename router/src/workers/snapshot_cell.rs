//! A worker's latest engine snapshot in the form policies read it: a
//! seqlock over one cache line of atomics.
//!
//! Every selection reads this for every candidate, so the read must be a
//! handful of plain loads: no lock, no reference count on a shared cache
//! line (an `ArcSwap` guard costs ~10 ns per worker, the whole budget at
//! 1,024 workers). Readers retry if a writer was mid-store, so they never
//! see a torn snapshot; writers (the load monitor, a few per second) take
//! turns through the sequence number. All safe code: every field is atomic.

use std::hint::spin_loop;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use shoal_proto::EngineLoad;

/// Encodes `None` (a real count never reaches it: counts are capped at 2^53).
const NONE: u64 = u64::MAX;

/// The instants the cell stores are nanoseconds after this one: an hour
/// before first use, so an instant taken just before it still fits.
fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(|| {
        let now = Instant::now();
        now.checked_sub(Duration::from_secs(3600)).unwrap_or(now)
    })
}

/// What a policy needs of one stored snapshot.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SnapshotReading {
    /// When the engine was polled (monotonic clock): age counts from here.
    pub taken_at: Instant,
    /// The engine's validated signals.
    pub load: EngineLoad,
}

/// The latest snapshot of one worker; see the module docs.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct SnapshotCell {
    seq: AtomicU64,
    /// Nanoseconds after [`epoch`] plus one; 0 = never stored.
    taken_at: AtomicU64,
    usage: AtomicU64,
    waiting: AtomicU64,
    queued: AtomicU64,
    running: AtomicU64,
    throughput: AtomicU64,
}

fn count(value: Option<u64>) -> u64 {
    value.unwrap_or(NONE)
}

fn ratio(value: Option<f64>) -> u64 {
    value.map_or(NONE, f64::to_bits)
}

fn some(raw: u64) -> Option<u64> {
    (raw != NONE).then_some(raw)
}

impl SnapshotCell {
    /// Replaces the snapshot with one polled at `taken_at`.
    pub fn store(&self, taken_at: Instant, load: &EngineLoad) {
        let since = taken_at.saturating_duration_since(epoch()).as_nanos();
        let stamp = u64::try_from(since).unwrap_or(NONE - 1).saturating_add(1);
        let mut seq = self.seq.load(Ordering::Relaxed);
        loop {
            if seq & 1 == 0 {
                match self.seq.compare_exchange_weak(
                    seq,
                    seq.wrapping_add(1),
                    Ordering::Acquire,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => break,
                    Err(current) => seq = current,
                }
            } else {
                spin_loop();
                seq = self.seq.load(Ordering::Relaxed);
            }
        }
        fence(Ordering::Release);
        self.taken_at.store(stamp, Ordering::Relaxed);
        self.usage.store(ratio(load.token_usage), Ordering::Relaxed);
        self.waiting
            .store(count(load.waiting_requests), Ordering::Relaxed);
        self.queued
            .store(count(load.queued_tokens), Ordering::Relaxed);
        self.running
            .store(count(load.running_requests), Ordering::Relaxed);
        self.throughput
            .store(ratio(load.gen_throughput), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The latest snapshot, if one was ever stored.
    pub fn read(&self) -> Option<SnapshotReading> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let stamp = self.taken_at.load(Ordering::Relaxed);
                let usage = self.usage.load(Ordering::Relaxed);
                let waiting = self.waiting.load(Ordering::Relaxed);
                let queued = self.queued.load(Ordering::Relaxed);
                let running = self.running.load(Ordering::Relaxed);
                let throughput = self.throughput.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    if stamp == 0 {
                        return None;
                    }
                    return Some(SnapshotReading {
                        taken_at: epoch() + Duration::from_nanos(stamp - 1),
                        load: EngineLoad {
                            token_usage: some(usage).map(f64::from_bits),
                            waiting_requests: some(waiting),
                            queued_tokens: some(queued),
                            running_requests: some(running),
                            gen_throughput: some(throughput).map(f64::from_bits),
                        },
                    });
                }
            }
            spin_loop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn round_trips_every_field_and_none() {
        let cell = SnapshotCell::default();
        assert_eq!(cell.read(), None);
        let load = EngineLoad {
            token_usage: Some(0.73),
            waiting_requests: Some(3),
            queued_tokens: None,
            running_requests: Some(0),
            gen_throughput: Some(1842.55),
        };
        let at = Instant::now();
        cell.store(at, &load);
        let read = cell.read().unwrap();
        assert_eq!(read.load, load);
        assert!(read.taken_at <= at && at - read.taken_at < Duration::from_micros(1));
        cell.store(at, &EngineLoad::default());
        assert_eq!(cell.read().unwrap().load, EngineLoad::default());
    }

    #[test]
    fn readers_never_see_a_torn_snapshot() {
        let cell = Arc::new(SnapshotCell::default());
        let at = Instant::now();
        std::thread::scope(|scope| {
            for writer in 0..2u64 {
                let cell = cell.clone();
                scope.spawn(move || {
                    for i in 0..20_000u64 {
                        let n = writer * 1_000_000 + i;
                        let load = EngineLoad {
                            waiting_requests: Some(n),
                            queued_tokens: Some(n),
                            running_requests: Some(n),
                            ..EngineLoad::default()
                        };
                        cell.store(at, &load);
                    }
                });
            }
            for _ in 0..50_000 {
                if let Some(read) = cell.read() {
                    let n = read.load.waiting_requests.unwrap();
                    assert_eq!(read.load.queued_tokens, Some(n));
                    assert_eq!(read.load.running_requests, Some(n));
                }
            }
        });
    }
}
