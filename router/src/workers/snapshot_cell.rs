//! A worker's latest engine snapshot in the form policies read it: a
//! seqlock over two cache lines of atomics.
//!
//! Every selection reads this for every candidate, so the read must be a
//! handful of plain loads: no lock, no reference count on a shared cache
//! line (an `ArcSwap` guard costs ~10 ns per worker, the whole budget at
//! 1,024 workers), no clock arithmetic (freshness is one comparison of
//! stamps, [`CellStamp`]), no division (the [`LoadFigures`] are derived
//! when the snapshot is stored). Readers retry if a writer was mid-store,
//! so they never see a torn snapshot; writers (the load monitor, a few per
//! second) take turns through the sequence number. All safe code: every
//! field is atomic.

use std::hint::spin_loop;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Duration, Instant};

use shoal_proto::{EngineLoad, LoadFigures};

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

/// An instant as the cell stores it: nanoseconds after the cell epoch plus
/// one (instants before the epoch, an hour before first use, all map to 1),
/// so a reader decides freshness by comparing two integers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct CellStamp(u64);

impl CellStamp {
    /// The stamp of every instant up to the cell epoch: as a freshness
    /// cutoff it admits every stored snapshot.
    pub const EARLIEST: CellStamp = CellStamp(1);

    /// The stamp of `at`.
    #[inline]
    pub fn of(at: Instant) -> Self {
        let since = at.saturating_duration_since(epoch()).as_nanos();
        Self(u64::try_from(since).unwrap_or(NONE - 1).saturating_add(1))
    }

    #[cfg(test)]
    fn instant(self) -> Instant {
        epoch() + Duration::from_nanos(self.0 - 1)
    }
}

/// The latest snapshot of one worker; see the module docs.
#[derive(Debug, Default)]
#[repr(align(64))]
pub struct SnapshotCell {
    seq: AtomicU64,
    /// A [`CellStamp`]; 0 = never stored.
    taken_at: AtomicU64,
    usage: AtomicU64,
    waiting: AtomicU64,
    queued: AtomicU64,
    running: AtomicU64,
    throughput: AtomicU64,
    kv_odds: AtomicU64,
    secs_per_token: AtomicU64,
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

fn some_ratio(raw: u64) -> Option<f64> {
    some(raw).map(f64::from_bits)
}

impl SnapshotCell {
    /// Replaces the snapshot with one polled at `taken_at`.
    pub fn store(&self, taken_at: Instant, load: &EngineLoad) {
        let stamp = CellStamp::of(taken_at).0;
        let figures = LoadFigures::of(load);
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
        self.kv_odds
            .store(ratio(figures.kv_odds), Ordering::Relaxed);
        self.secs_per_token
            .store(ratio(figures.secs_per_token), Ordering::Relaxed);
        self.seq.store(seq.wrapping_add(2), Ordering::Release);
    }

    /// The latest snapshot if it was polled at or after `fresh_from`:
    /// what a selection reads, with no clock arithmetic.
    #[inline]
    pub fn read_fresh(&self, fresh_from: CellStamp) -> Option<(EngineLoad, LoadFigures)> {
        let (stamp, load, figures) = self.read_stamped()?;
        (stamp >= fresh_from).then_some((load, figures))
    }

    #[inline]
    /// The latest snapshot with its poll stamp, if one was ever stored.
    fn read_stamped(&self) -> Option<(CellStamp, EngineLoad, LoadFigures)> {
        loop {
            let before = self.seq.load(Ordering::Acquire);
            if before & 1 == 0 {
                let stamp = self.taken_at.load(Ordering::Relaxed);
                let usage = self.usage.load(Ordering::Relaxed);
                let waiting = self.waiting.load(Ordering::Relaxed);
                let queued = self.queued.load(Ordering::Relaxed);
                let running = self.running.load(Ordering::Relaxed);
                let throughput = self.throughput.load(Ordering::Relaxed);
                let kv_odds = self.kv_odds.load(Ordering::Relaxed);
                let secs_per_token = self.secs_per_token.load(Ordering::Relaxed);
                fence(Ordering::Acquire);
                if self.seq.load(Ordering::Relaxed) == before {
                    if stamp == 0 {
                        return None;
                    }
                    let load = EngineLoad {
                        token_usage: some_ratio(usage),
                        waiting_requests: some(waiting),
                        queued_tokens: some(queued),
                        running_requests: some(running),
                        gen_throughput: some_ratio(throughput),
                    };
                    let figures = LoadFigures {
                        kv_odds: some_ratio(kv_odds),
                        secs_per_token: some_ratio(secs_per_token),
                    };
                    return Some((CellStamp(stamp), load, figures));
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
        assert_eq!(cell.read_stamped(), None);
        let load = EngineLoad {
            token_usage: Some(0.73),
            waiting_requests: Some(3),
            queued_tokens: None,
            running_requests: Some(0),
            gen_throughput: Some(1842.55),
        };
        let at = Instant::now();
        cell.store(at, &load);
        let (stamp, read_load, figures) = cell.read_stamped().unwrap();
        let taken_at = stamp.instant();
        assert_eq!(read_load, load);
        assert_eq!(figures, LoadFigures::of(&load));
        assert!(taken_at <= at && at - taken_at < Duration::from_micros(1));
        let stamp = CellStamp::of(at);
        assert!(
            cell.read_fresh(stamp).is_some(),
            "polled at the cutoff is fresh"
        );
        let later = CellStamp::of(at + Duration::from_nanos(10));
        assert!(
            cell.read_fresh(later).is_none(),
            "polled before the cutoff is stale"
        );
        cell.store(at, &EngineLoad::default());
        assert_eq!(cell.read_stamped().unwrap().1, EngineLoad::default());
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
                if let Some((_, load, _)) = cell.read_stamped() {
                    let n = load.waiting_requests.unwrap();
                    assert_eq!(load.queued_tokens, Some(n));
                    assert_eq!(load.running_requests, Some(n));
                }
            }
        });
    }
}
